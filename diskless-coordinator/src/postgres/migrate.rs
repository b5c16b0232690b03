//! Embedded schema migrations of the PostgreSQL coordinator.
//!
//! Every migration runs in one transaction that first takes a transaction-scoped advisory lock for
//! the schema (so brokers starting at once migrate one after the other) and sets a short
//! `lock_timeout` (so a migration that would wait behind live traffic fails instead of queueing all
//! later statements behind its lock). Applied migrations are recorded in `schema_migrations` in the
//! coordinator's schema, with a checksum of their text; a changed text is reported, never re-run.
//!
//! Rules for future migrations (they run against live clusters): add tables, nullable columns,
//! functions (`CREATE OR REPLACE`) and indexes; build indexes on large tables with
//! `CREATE INDEX CONCURRENTLY` in a migration marked as non-transactional; never rewrite a table
//! (`ALTER COLUMN ... TYPE`, `ADD COLUMN ... DEFAULT volatile`) or take an `ACCESS EXCLUSIVE` lock for
//! longer than a catalog update.

use super::{PostgresOptions, sql_error};
use crate::CoordinatorError;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

/// One embedded migration.
pub(super) struct Migration {
    pub(super) version: i32,
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
}

/// The embedded migrations, in version order.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../../migrations/postgres/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "fast_commit_file",
        sql: include_str!("../../migrations/postgres/0002_fast_commit_file.sql"),
    },
];

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

/// Applies the pending migrations to `options.schema` on `conn`, creating the schema if needed.
/// Returns how many migrations were applied.
pub(super) async fn run(
    conn: &mut PgConnection,
    options: &PostgresOptions,
) -> Result<usize, CoordinatorError> {
    let schema = options.schema.as_str();
    let mut tx = conn.begin().await.map_err(|e| sql_error(e, false))?;
    let lock_timeout = format!(
        "SET LOCAL lock_timeout = {}",
        options.migration_lock_timeout.as_millis().max(1)
    );
    let setup = [
        lock_timeout,
        // One migrator per schema at a time; released at COMMIT/ROLLBACK.
        format!(
            "SELECT pg_advisory_xact_lock(hashtext('diskless-coordinator-migrate'), \
             hashtext('{schema}'))"
        ),
        format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""),
        format!(
            "CREATE TABLE IF NOT EXISTS \"{schema}\".schema_migrations (\
             version integer NOT NULL PRIMARY KEY, name text NOT NULL, \
             checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        ),
        format!("SET LOCAL search_path = \"{schema}\""),
    ];
    for sql in setup {
        // The schema name is validated (lowercase identifier) before it gets here.
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(|e| sql_error(e, false))?;
    }
    let applied = sqlx::query(AssertSqlSafe(format!(
        "SELECT version, checksum FROM \"{schema}\".schema_migrations ORDER BY version"
    )))
    .fetch_all(&mut *tx)
    .await
    .map_err(|e| sql_error(e, false))?;
    let mut done = std::collections::HashMap::new();
    for row in &applied {
        let version: i32 = row.try_get(0).map_err(|e| sql_error(e, false))?;
        let sum: String = row.try_get(1).map_err(|e| sql_error(e, false))?;
        done.insert(version, sum);
    }
    if let Some(newest) = done.keys().max()
        && *newest > latest_version()
    {
        tracing::warn!(
            schema,
            database_version = newest,
            known_version = latest_version(),
            "the coordinator schema is newer than this build; running on it unchanged"
        );
    }
    let mut count = 0;
    for m in MIGRATIONS {
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
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| sql_error(e, false))?;
        sqlx::query("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)")
            .bind(m.version)
            .bind(m.name)
            .bind(&sum)
            .execute(&mut *tx)
            .await
            .map_err(|e| sql_error(e, false))?;
        count += 1;
    }
    tx.commit().await.map_err(|e| sql_error(e, true))?;
    Ok(count)
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
}
