//! Embedded schema migrations of the PostgreSQL coordinator, and the server-side functions
//! applied after them.
//!
//! **Where what lives.** The schema (tables, columns, indexes, triggers, data backfills) changes by
//! migrations, `migrations/postgres/NNNN_name.sql`, each applied once and recorded. The
//! server-side functions live once each, in their current version, in `src/postgres/functions.sql`,
//! which [`run`] applies after the pending migrations on every run ([`functions`]: why, and how an
//! older build never replaces a newer build's functions). Migrations 1 to 13 predate that file and
//! also create the functions of their time; they are frozen (their checksums are recorded in every
//! schema they were applied to), and from migration 14 on a migration creates no function.
//!
//! A **transactional** migration runs in one transaction that first takes a transaction-scoped
//! advisory lock for the schema (so brokers starting at once migrate one after the other) and sets a
//! short `lock_timeout` (so a migration that would wait behind live traffic fails instead of queueing
//! all later statements behind its lock). A **non-transactional** migration (for
//! `CREATE INDEX CONCURRENTLY`, which cannot run in a transaction) runs its statements one by one,
//! each in autocommit, under a session-level advisory lock of the same key; its statements must be
//! idempotent (`IF NOT EXISTS`), because a failure half way leaves the earlier ones applied, and an
//! index left invalid by a failed concurrent build is dropped before the next attempt. Applied
//! migrations are recorded in `schema_migrations` in the coordinator's schema, with a checksum of
//! their text; a changed text is reported, never re-run.
//!
//! Rules for future migrations (they run against live clusters): add tables, nullable columns
//! (or columns with a constant default) and indexes; build indexes on large tables with
//! `CREATE INDEX CONCURRENTLY` in a non-transactional migration; never rewrite a table
//! (`ALTER COLUMN ... TYPE`, `ADD COLUMN ... DEFAULT volatile`, an `UPDATE` of every row) or take an
//! `ACCESS EXCLUSIVE` lock for longer than a catalog update. Functions are not created here but
//! changed in `functions.sql`; a migration must keep the previous build's functions working (they
//! serve commits until `functions.sql` replaces them, right after the migrations), and old function
//! signatures keep working (a broker of the previous version may still call them during a rolling
//! upgrade).

use super::attempt::sql_error;
use super::options::PostgresOptions;
use crate::CoordinatorError;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};
use std::time::Duration;

pub(super) mod functions;

/// One embedded migration.
pub(super) struct Migration {
    pub(super) version: i32,
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
    /// Whether it runs in one transaction. When false, its text is a sequence of idempotent
    /// statements, each ending with `;` at the end of a line (no `;` elsewhere, no function bodies),
    /// run one by one in autocommit (`--` comment lines are skipped).
    pub(super) transactional: bool,
}

/// The [`Migration`] `version` of the file `migrations/postgres/<prefix>_<name>.sql`.
macro_rules! migration {
    ($version:literal, $prefix:literal, $name:literal, transactional: $transactional:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!(
                "../../migrations/postgres/",
                $prefix,
                "_",
                $name,
                ".sql"
            )),
            transactional: $transactional,
        }
    };
}

/// The embedded migrations, in version order. Migrations up to
/// `LAST_MIGRATION_WITH_FUNCTIONS` (13) also create functions (frozen history, see the module docs).
#[rustfmt::skip]
pub(super) const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001", "initial", transactional: true),
    migration!(2, "0002", "fast_commit_file", transactional: true),
    migration!(3, "0003", "replica_heartbeat_running_max", transactional: true),
    migration!(4, "0004", "timestamp_indexes", transactional: false),
    migration!(5, "0005", "commit_point_producer_expiry", transactional: true),
    migration!(6, "0006", "fence_retention_confirm_fences", transactional: true),
    migration!(7, "0007", "set_based_idempotent_commit", transactional: true),
    migration!(8, "0008", "producer_ids", transactional: true),
    migration!(9, "0009", "lean_batch_writes", transactional: true),
    migration!(10, "0010", "drop_batches_object_index", transactional: false),
    migration!(11, "0011", "transactions", transactional: true),
    migration!(12, "0012", "open_txn_index", transactional: false),
    migration!(13, "0013", "tiered_segments", transactional: true),
    migration!(14, "0014", "topic_compression", transactional: true),
    migration!(15, "0015", "open_txn_seq", transactional: true),
    migration!(16, "0016", "txn_records", transactional: true),
    migration!(17, "0017", "topic_compaction", transactional: true),
];

/// The last migration that creates functions: later ones leave them to `functions.sql`.
#[cfg(test)]
const LAST_MIGRATION_WITH_FUNCTIONS: i32 = 13;

/// The latest schema version this build knows.
pub(super) fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// FNV-1a (64 bit) of a migration's text, as 16 hex digits: detects edited migrations.
fn checksum(sql: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sql.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The arguments of the advisory lock that serializes the migrators of `schema` (a validated
/// lowercase identifier).
fn lock_key(schema: &str) -> String {
    format!("hashtext('diskless-coordinator-migrate'), hashtext('{schema}')")
}

/// Runs one statement (no result rows needed) on `conn`.
async fn exec(conn: &mut PgConnection, sql: String) -> Result<(), CoordinatorError> {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| sql_error(e, false))
}

/// Applies the pending migrations to `options.schema` on `conn`, creating the schema if needed,
/// then this build's server-side functions ([`functions::apply`]). Returns how many migrations
/// were applied.
///
/// The migrators of a schema are serialized by a session-level advisory lock, taken by polling
/// `pg_try_advisory_lock` between statements: a migrator waiting inside a statement would hold a
/// snapshot, which a concurrent `CREATE INDEX CONCURRENTLY` of the lock holder waits for (a
/// deadlock). A migrator waits for a concurrent one as long as that one runs; it holds nothing
/// meanwhile. The functions are applied under the same lock, so concurrent migrators never replace
/// a function at the same time.
pub(super) async fn run(
    conn: &mut PgConnection,
    options: &PostgresOptions,
) -> Result<usize, CoordinatorError> {
    let schema = options.schema.as_str();
    let mut waited = false;
    loop {
        let got: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT pg_try_advisory_lock({})",
            lock_key(schema)
        )))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| sql_error(e, false))?;
        if got {
            break;
        }
        if !waited {
            tracing::info!(schema, "waiting for a concurrent migrator of the schema");
            waited = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let applied = run_locked(conn, options).await;
    if applied.is_ok() {
        exec(
            conn,
            format!("SELECT pg_advisory_unlock({})", lock_key(schema)),
        )
        .await?;
    }
    // On an error the caller closes the connection, which releases the lock.
    applied
}

async fn run_locked(
    conn: &mut PgConnection,
    options: &PostgresOptions,
) -> Result<usize, CoordinatorError> {
    let (count, schema_newer) = apply_migrations(conn, options, MIGRATIONS).await?;
    functions::apply(conn, options, schema_newer).await?;
    Ok(count)
}

/// Applies the pending ones of `migrations` (a prefix of [`MIGRATIONS`]). Returns how many were
/// applied, and whether the schema holds migrations this build does not know.
async fn apply_migrations(
    conn: &mut PgConnection,
    options: &PostgresOptions,
    migrations: &[Migration],
) -> Result<(usize, bool), CoordinatorError> {
    let schema = options.schema.as_str();
    {
        let mut tx = conn.begin().await.map_err(|e| sql_error(e, false))?;
        let setup = [
            format!(
                "SET LOCAL lock_timeout = {}",
                options.migration_lock_timeout.as_millis().max(1)
            ),
            format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""),
            format!(
                "CREATE TABLE IF NOT EXISTS \"{schema}\".schema_migrations (\
                 version integer NOT NULL PRIMARY KEY, name text NOT NULL, \
                 checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            ),
        ];
        for sql in setup {
            // The schema name is validated (lowercase identifier) before it gets here.
            exec(&mut tx, sql).await?;
        }
        tx.commit().await.map_err(|e| sql_error(e, true))?;
    }
    let applied = sqlx::query(AssertSqlSafe(format!(
        "SELECT version, checksum FROM \"{schema}\".schema_migrations ORDER BY version"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    let mut done = std::collections::HashMap::new();
    for row in &applied {
        let version: i32 = row.try_get(0).map_err(|e| sql_error(e, false))?;
        let sum: String = row.try_get(1).map_err(|e| sql_error(e, false))?;
        done.insert(version, sum);
    }
    let newest = done.keys().max().copied();
    let schema_newer = newest.is_some_and(|v| v > latest_version());
    if let Some(newest) = newest
        && schema_newer
    {
        tracing::warn!(
            schema,
            database_version = newest,
            known_version = latest_version(),
            "the coordinator schema is newer than this build; running on it unchanged"
        );
    }
    let mut count = 0;
    for m in migrations {
        let sum = checksum(m.sql);
        match done.get(&m.version) {
            Some(existing) if *existing == sum => continue,
            Some(existing) => {
                return Err(CoordinatorError::Storage(
                    format!(
                        "migration {} ({}) in schema {schema} was applied with checksum {existing}, \
                         but this build's text has checksum {sum}",
                        m.version, m.name
                    )
                    .into(),
                ));
            }
            None => {}
        }
        tracing::info!(
            schema,
            version = m.version,
            name = m.name,
            "applying migration"
        );
        if m.transactional {
            let mut tx = conn.begin().await.map_err(|e| sql_error(e, false))?;
            exec(
                &mut tx,
                format!(
                    "SET LOCAL lock_timeout = {}",
                    options.migration_lock_timeout.as_millis().max(1)
                ),
            )
            .await?;
            exec(&mut tx, format!("SET LOCAL search_path = \"{schema}\"")).await?;
            sqlx::raw_sql(m.sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| sql_error(e, false))?;
            record(&mut tx, m, &sum).await?;
            tx.commit().await.map_err(|e| sql_error(e, true))?;
        } else {
            apply_statements(conn, schema, m).await?;
            record(conn, m, &sum).await?;
        }
        count += 1;
    }
    Ok((count, schema_newer))
}

/// Records `m` as applied (the search path is the schema).
async fn record(conn: &mut PgConnection, m: &Migration, sum: &str) -> Result<(), CoordinatorError> {
    sqlx::query("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)")
        .bind(m.version)
        .bind(m.name)
        .bind(sum)
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| sql_error(e, false))
}

/// Runs the statements of a non-transactional migration one by one, in autocommit, without
/// statement or lock timeouts (a concurrent index build takes no lock that blocks reads or writes,
/// but waits for the transactions older than it). Indexes of the schema left invalid by an
/// interrupted concurrent build are dropped first, so that `IF NOT EXISTS` rebuilds them.
async fn apply_statements(
    conn: &mut PgConnection,
    schema: &str,
    m: &Migration,
) -> Result<(), CoordinatorError> {
    exec(
        conn,
        format!("SET search_path = \"{schema}\"; SET statement_timeout = 0; SET lock_timeout = 0"),
    )
    .await?;
    let invalid: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT i.indisvalid",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    for index in invalid {
        tracing::warn!(
            schema,
            index,
            "dropping an index left invalid by an interrupted build"
        );
        exec(
            conn,
            format!(
                "DROP INDEX CONCURRENTLY IF EXISTS \"{schema}\".\"{}\"",
                index.replace('"', "\"\"")
            ),
        )
        .await?;
    }
    for statement in statements(m.sql) {
        exec(conn, statement).await?;
    }
    exec(
        conn,
        "RESET statement_timeout; RESET lock_timeout".to_string(),
    )
    .await
}

/// The statements of a non-transactional migration: `--` comment lines dropped, split at `;`.
fn statements(sql: &str) -> Vec<String> {
    let body: Vec<&str> = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    body.join("\n")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The highest applied migration version in the schema, or 0 when none (or no schema).
pub(super) async fn applied_version(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<i32, CoordinatorError> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT to_regclass(quote_ident($1) || '.schema_migrations')::text")
            .bind(schema)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| sql_error(e, false))?;
    if exists.is_none() {
        return Ok(0);
    }
    let version: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(version) FROM \"{schema}\".schema_migrations"
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    Ok(version.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use diskless_testkit::postgres::{Schema, pg_url};

    /// The schema `$1` as sorted lines, its name replaced by `SCHEMA`: every function with its full
    /// definition, every relation, column (type, nullability, default), constraint, index and
    /// trigger. The migrator's own tables are left out.
    const CATALOG: &str = "\
        WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1), \
        rel AS (SELECT c.* FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) \
                AND c.relname NOT LIKE 'schema\\_migrations%' \
                AND c.relname NOT LIKE 'schema\\_functions%'), \
        items AS ( \
          SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) \
                 || ')' || E'\\n' || pg_get_functiondef(p.oid) AS item \
          FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns) \
          UNION ALL \
          SELECT 'relation ' || c.relname || ' ' || c.relkind::text FROM rel c \
          UNION ALL \
          SELECT 'column ' || c.relname || '.' || lpad(a.attnum::text, 3, '0') || ' ' || a.attname \
                 || ' ' || format_type(a.atttypid, a.atttypmod) \
                 || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END \
                 || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '') \
                 || CASE WHEN a.attisdropped THEN ' dropped' ELSE '' END \
          FROM pg_attribute a JOIN rel c ON c.oid = a.attrelid \
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
          WHERE a.attnum > 0 AND c.relkind = 'r' \
          UNION ALL \
          SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid) \
          FROM pg_constraint k JOIN rel c ON c.oid = k.conrelid \
          UNION ALL \
          SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid::text \
          FROM pg_index i JOIN rel c ON c.oid = i.indexrelid \
          UNION ALL \
          SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t \
          JOIN rel c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal) \
        SELECT replace(item, $1, 'SCHEMA') FROM items ORDER BY 1";

    /// [`CATALOG`] of `schema`, and the rows of its one-row tables (the migrations' data).
    async fn catalog(conn: &mut PgConnection, schema: &str) -> Vec<String> {
        let mut lines: Vec<String> = sqlx::query_scalar(CATALOG)
            .bind(schema)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        for table in ["coordinator_settings", "producer_ids", "replica_heartbeat"] {
            let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT '{table} ' || t::text FROM \"{schema}\".{table} t ORDER BY 1"
            )))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
            lines.extend(rows);
        }
        lines
    }

    /// The differences between two catalogs, for a readable failure.
    fn diff(left: &[String], right: &[String]) -> String {
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|l| !b.contains(l)).cloned().collect()
        };
        format!(
            "only in the first: {:#?}\nonly in the second: {:#?}",
            only(left, right),
            only(right, left)
        )
    }

    /// A schema migrated by any earlier build (the migrations up to its version, each creating
    /// the functions of its time; nothing recorded in `schema_functions`) upgrades to exactly the
    /// catalog of a fresh schema: the pending migrations, then this build's functions. And at
    /// revision 1 of `functions.sql`, what migrations 1 to 13 alone leave (the build before the
    /// file) is exactly that catalog too: the file holds the functions as they left them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_earlier_version_upgrades_to_a_fresh_schema() {
        let Some(url) = pg_url() else { return };
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let options =
            |schema: &Schema| PostgresOptions::new(url.clone()).with_schema(schema.name.clone());
        let fresh = Schema::new(&url);
        assert_eq!(
            run(&mut conn, &options(&fresh)).await.unwrap(),
            MIGRATIONS.len()
        );
        let expected = catalog(&mut conn, &fresh.name).await;
        assert!(
            expected
                .iter()
                .any(|l| l.starts_with("function commit_file("))
        );
        for n in 1..=MIGRATIONS.len() {
            let old = Schema::new(&url);
            let (applied, _) = apply_migrations(&mut conn, &options(&old), &MIGRATIONS[..n])
                .await
                .unwrap();
            assert_eq!(applied, n);
            if n == MIGRATIONS.len() && functions::REVISION == 1 {
                let before = catalog(&mut conn, &old.name).await;
                assert!(
                    before == expected,
                    "migrations 1 to {n} alone: {}",
                    diff(&before, &expected)
                );
            }
            assert_eq!(
                run(&mut conn, &options(&old)).await.unwrap(),
                MIGRATIONS.len() - n
            );
            let upgraded = catalog(&mut conn, &old.name).await;
            assert!(
                upgraded == expected,
                "a schema at version {n}, upgraded: {}",
                diff(&upgraded, &expected)
            );
            assert_eq!(
                functions::applied_revision(&mut conn, &old.name)
                    .await
                    .unwrap(),
                functions::REVISION
            );
        }
        conn.close().await.unwrap();
    }

    #[test]
    fn migrations_are_ordered_and_checksummed() {
        let mut last = 0;
        for m in MIGRATIONS {
            assert!(m.version > last, "versions increase");
            last = m.version;
            assert_eq!(checksum(m.sql).len(), 16);
        }
        assert_ne!(checksum("a"), checksum("b"));
        assert_eq!(latest_version(), last);
    }

    /// Functions live in `functions.sql`: a migration after the frozen ones creates none (it may
    /// drop an obsolete one).
    #[test]
    fn later_migrations_create_no_functions() {
        assert!(
            MIGRATIONS
                .iter()
                .any(|m| m.version == LAST_MIGRATION_WITH_FUNCTIONS)
        );
        for m in MIGRATIONS
            .iter()
            .filter(|m| m.version > LAST_MIGRATION_WITH_FUNCTIONS)
        {
            let code: String = m
                .sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_uppercase();
            let words: Vec<&str> = code.split_whitespace().collect();
            for w in words.windows(4) {
                let creates = w[0] == "CREATE"
                    && (w[1] == "FUNCTION"
                        || w[1] == "PROCEDURE"
                        || w[1..4] == ["OR", "REPLACE", "FUNCTION"]
                        || w[1..4] == ["OR", "REPLACE", "PROCEDURE"]);
                assert!(
                    !creates,
                    "migration {} creates a function: functions live in src/postgres/functions.sql",
                    m.version
                );
            }
        }
    }

    /// Migrations 1 to 13 keep the text they were released with (checksums recorded in every
    /// schema they were applied to; a schema whose text differs from its build's is refused).
    #[test]
    fn frozen_migrations_keep_their_text() {
        let released = [
            "a0ae09755495b300",
            "7022cff6c26ad66c",
            "b6445da5ae634641",
            "af7f561d454ce198",
            "4a4809b9e5f479f9",
            "4e0c8dde32d3ba9e",
            "e1634fa5403fe591",
            "5ff5de2bd5fe7e3a",
            "a738b79e34ad4a0b",
            "d03723399f4dee38",
            "ce49ed28006c7025",
            "c1f4aff1988c68f7",
            "924ef6ac14c9e125",
        ];
        assert_eq!(released.len(), LAST_MIGRATION_WITH_FUNCTIONS as usize);
        for (m, sum) in MIGRATIONS.iter().zip(released) {
            assert_eq!(checksum(m.sql), sum, "migration {} was edited", m.version);
        }
    }

    #[test]
    fn non_transactional_statements_are_split() {
        assert_eq!(
            statements(
                "-- a comment; with a semicolon\nCREATE INDEX a\n  ON t (x);\n\nSELECT 1;\n"
            ),
            vec![
                "CREATE INDEX a\n  ON t (x)".to_string(),
                "SELECT 1".to_string()
            ]
        );
        for m in MIGRATIONS.iter().filter(|m| !m.transactional) {
            assert!(!statements(m.sql).is_empty(), "migration {}", m.version);
        }
    }
}
