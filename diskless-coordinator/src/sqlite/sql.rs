//! What the other modules share: multi-row statements ([`CHUNK`] rows each), the stored owner
//! list, and what a database error means for a call ([`unavailable`], [`not_applied`],
//! [`at_commit`]). A leaf: it uses no other module of the SQLite coordinator.

use crate::rows::corrupt;
use crate::{CoordinatorError, ShardId};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Encode, Sqlite, Type};

/// Rows per multi-row statement (a 100-batch commit inserts in two statements).
pub(super) const CHUNK: usize = 64;

/// `(?,?,?),(?,?,?)` for `rows` rows of `cols` columns.
fn placeholders(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(","));
    vec![row; rows].join(",")
}

/// One statement over a `VALUES` list of `rows` (`{values}` in `sql` stands for their
/// placeholders, `cols` a row), each row's values bound by `bind`.
fn rows_query<T>(
    sql: &str,
    cols: usize,
    rows: &[T],
    bind: impl Fn(SqliteQuery, &T) -> SqliteQuery,
) -> SqliteQuery {
    let sql = sql.replace("{values}", &placeholders(rows.len(), cols));
    rows.iter().fold(sqlx::query(AssertSqlSafe(sql)), bind)
}

/// The rows `sql` reads for all of `keys` (pairs of values, `{values}` in `sql` standing for
/// their placeholders), [`CHUNK`] keys a statement.
pub(super) async fn fetch_pairs<A, B>(
    conn: &mut SqliteConnection,
    sql: &str,
    keys: &[(A, B)],
) -> Result<Vec<SqliteRow>, CoordinatorError>
where
    A: for<'e> Encode<'e, Sqlite> + Type<Sqlite>,
    B: for<'e> Encode<'e, Sqlite> + Type<Sqlite>,
{
    let mut rows = Vec::new();
    for chunk in keys.chunks(CHUNK) {
        let q = rows_query(sql, 2, chunk, |q, (a, b)| q.bind(a).bind(b));
        rows.extend(q.fetch_all(&mut *conn).await.map_err(not_applied)?);
    }
    Ok(rows)
}

/// Runs [`rows_query`] over all of `rows`, [`CHUNK`] rows a statement.
pub(super) async fn execute_rows<T>(
    conn: &mut SqliteConnection,
    sql: &str,
    cols: usize,
    rows: &[T],
    bind: impl Fn(SqliteQuery, &T) -> SqliteQuery,
) -> Result<(), CoordinatorError> {
    for chunk in rows.chunks(CHUNK) {
        rows_query(sql, cols, chunk, &bind)
            .execute(&mut *conn)
            .await
            .map_err(not_applied)?;
    }
    Ok(())
}

/// A statement of the SQLite coordinator, with its arguments.
pub(super) type SqliteQuery =
    sqlx::query::Query<'static, Sqlite, <Sqlite as sqlx::Database>::Arguments>;

/// An owner list as stored: comma-separated shard ids.
pub(super) fn encode_owners(owners: &[ShardId]) -> String {
    owners
        .iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A stored owner list.
pub(super) fn decode_owners(s: &str) -> Result<Vec<ShardId>, CoordinatorError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|x| {
            x.parse::<ShardId>()
                .map_err(|_| corrupt(format!("bad owner list {s:?}")))
        })
        .collect()
}

/// SQLite primary result codes that mean "try again later": BUSY, LOCKED, IOERR, FULL, CANTOPEN.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(_) => primary_code_in(e, &[5, 6, 10, 13, 14]),
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Whether `e` is a database error whose primary result code is one of `codes`.
fn primary_code_in(e: &sqlx::Error, codes: &[i32]) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| codes.contains(&(c & 0xff))),
        _ => false,
    }
}

/// An error reaching the database: nothing was applied, retry later.
pub(super) fn unavailable(e: sqlx::Error) -> CoordinatorError {
    CoordinatorError::Unavailable(Box::new(e))
}

/// An error before COMMIT: nothing was applied.
pub(super) fn not_applied(e: sqlx::Error) -> CoordinatorError {
    if is_transient(&e) {
        CoordinatorError::Unavailable(Box::new(e))
    } else {
        CoordinatorError::Storage(Box::new(e))
    }
}

/// An error of COMMIT: unknown whether it was applied, unless SQLite says it was not (BUSY,
/// LOCKED).
pub(super) fn at_commit(e: sqlx::Error) -> CoordinatorError {
    if primary_code_in(&e, &[5, 6]) {
        CoordinatorError::Unavailable(Box::new(e))
    } else {
        CoordinatorError::OutcomeUnknown(Box::new(e))
    }
}
