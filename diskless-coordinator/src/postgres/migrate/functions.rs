//! The server-side functions of the PostgreSQL coordinator (`commit_file`, `write_txn_markers`,
//! `register_segment`, `fence_orphans`, ...): where they live and how they reach a schema.
//!
//! **Schema and functions live apart.** Tables, columns, indexes, triggers and data backfills are
//! the schema: they change by migrations (`migrations/postgres/`, [`super::MIGRATIONS`]), applied
//! once each, in order, recorded with a checksum of their text. The functions are code: each is
//! defined once, in its current version, in `src/postgres/functions.sql` (only `CREATE OR
//! REPLACE FUNCTION` statements), which the migrator runs after the pending migrations on every
//! connect and every explicit [`migrate`](fn@crate::postgres::migrate). A change of a function is thus
//! a diff of that file, not a new migration repeating the whole function (the commit function was
//! copied in full into 8 of the first 13 migrations).
//!
//! **Why functions are re-applied rather than migrated.** Running the whole file is idempotent
//! (`CREATE OR REPLACE` of the same text), so re-applying it needs no bookkeeping beyond ordering
//! builds, and repairs a schema whose functions were altered by hand. Migrations 1 to 13 predate
//! this file and still create the functions of their time: their checksums are recorded in every
//! schema they were applied to, so their text never changes; on a fresh schema they run as before
//! and this file then replaces what they created (at [`REVISION`] 1, with the very same
//! definitions: a fresh schema ends exactly as the migrations alone left it).
//!
//! **How.** In one transaction, under the migrators' session-level advisory lock of the schema
//! (held by [`super::run`] around the migrations too, so concurrent coordinators connecting at
//! once apply the file one after the other: two concurrent `CREATE OR REPLACE` of one function
//! would fail with "tuple concurrently updated"), with a short `lock_timeout` and `search_path`
//! set to the schema. A call running meanwhile keeps the body it started with; the next call
//! compiles the new one.
//!
//! **Builds never go back.** During a rolling upgrade (or after a rollback) brokers of an older
//! build keep connecting; their file must not replace a newer build's functions. Each revision of
//! the file has a number ([`REVISION`], raised with every change; a unit test pins the text's
//! checksum to it) recorded in `schema_functions` when applied. A build applies its file when the
//! schema's latest revision is not above its own and the schema's migrations are not newer than
//! it knows; else it leaves the functions as they are (with a warning), as it leaves a newer
//! schema unchanged. The same revision with another text is refused, like an edited migration.
//!
//! **What this asks of migrations.** The migrations run first, and the functions of the previous
//! revision keep serving commits until this file replaces them (moments later, or after a long
//! concurrent index build): a migration must leave the schema usable by them (new columns nullable
//! or with a default, as the rules for old brokers already demand). A new trigger's function goes
//! in the file; the trigger itself, which needs its function to exist, is created after it in the
//! file, guarded by a look-up in `pg_trigger` (a migration would run before the function exists on
//! a fresh schema).

use super::{checksum, exec};
use crate::CoordinatorError;
use crate::postgres::attempt::sql_error;
use crate::postgres::options::PostgresOptions;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

/// The text: every server-side function, in its current version, callees first.
pub(in crate::postgres) const SQL: &str = include_str!("../functions.sql");

/// The revision of [`SQL`]: raise it with every change of `functions.sql`, and set
/// `REVISION_CHECKSUM` to the new text's checksum. Revision 1 is the functions as migrations 1
/// to 13 left them; revision 2 keeps the open transaction's number (migration 15, issue #31);
/// revision 3 adds `replace_segments`, compaction's swap (migration 17, issue #29).
pub(in crate::postgres) const REVISION: i32 = 3;

/// The checksum ([`checksum`]) of [`SQL`] at [`REVISION`]: the unit test
/// `functions_text_matches_its_revision` fails when the text changed and the revision did not.
#[cfg(test)]
const REVISION_CHECKSUM: &str = "90b115ceea3fcc9c";

/// Replaces the functions of `options.schema` by this build's ([`SQL`]), in one transaction, unless
/// a newer build's are in place (see the module docs). `schema_newer`: the schema holds
/// migrations this build does not know. The caller holds the migrators' advisory lock.
pub(super) async fn apply(
    conn: &mut PgConnection,
    options: &PostgresOptions,
    schema_newer: bool,
) -> Result<(), CoordinatorError> {
    let schema = options.schema.as_str();
    let sum = checksum(SQL);
    let mut tx = conn.begin().await.map_err(|e| sql_error(e, false))?;
    let setup = [
        format!(
            "SET LOCAL lock_timeout = {}",
            options.migration_lock_timeout.as_millis().max(1)
        ),
        format!("SET LOCAL search_path = \"{schema}\""),
        "CREATE TABLE IF NOT EXISTS schema_functions (revision integer NOT NULL PRIMARY KEY, \
         checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            .to_string(),
    ];
    for sql in setup {
        // The schema name is validated (lowercase identifier) before it gets here.
        exec(&mut tx, sql).await?;
    }
    let latest: Option<(i32, String)> = sqlx::query_as(
        "SELECT revision, checksum FROM schema_functions ORDER BY revision DESC LIMIT 1",
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| sql_error(e, false))?;
    match &latest {
        Some((revision, _)) if *revision > REVISION => {
            tracing::warn!(
                schema,
                database_revision = revision,
                known_revision = REVISION,
                "the coordinator's functions are a newer build's; leaving them unchanged"
            );
            return Ok(());
        }
        Some((revision, existing)) if *revision == REVISION && *existing != sum => {
            return Err(CoordinatorError::Storage(
                format!(
                    "functions revision {REVISION} in schema {schema} was applied with checksum \
                     {existing}, but this build's text has checksum {sum}"
                )
                .into(),
            ));
        }
        _ => {}
    }
    if schema_newer {
        tracing::warn!(
            schema,
            known_revision = REVISION,
            "the coordinator schema is newer than this build; leaving its functions unchanged"
        );
        return Ok(());
    }
    sqlx::raw_sql(SQL)
        .execute(&mut *tx)
        .await
        .map_err(|e| sql_error(e, false))?;
    sqlx::query(
        "INSERT INTO schema_functions (revision, checksum) VALUES ($1, $2) \
         ON CONFLICT (revision) DO NOTHING",
    )
    .bind(REVISION)
    .bind(&sum)
    .execute(&mut *tx)
    .await
    .map_err(|e| sql_error(e, false))?;
    tx.commit().await.map_err(|e| sql_error(e, true))?;
    if latest
        .as_ref()
        .is_none_or(|(revision, _)| *revision < REVISION)
    {
        tracing::info!(
            schema,
            revision = REVISION,
            "applied the coordinator's functions"
        );
    }
    Ok(())
}

/// The latest functions revision applied to `schema`, or 0 when none (or no schema).
pub(in crate::postgres) async fn applied_revision(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<i32, CoordinatorError> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT to_regclass(quote_ident($1) || '.schema_functions')::text")
            .bind(schema)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| sql_error(e, false))?;
    if exists.is_none() {
        return Ok(0);
    }
    let revision: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(revision) FROM \"{schema}\".schema_functions"
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    Ok(revision.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_text_matches_its_revision() {
        assert_eq!(
            checksum(SQL),
            REVISION_CHECKSUM,
            "functions.sql changed: raise REVISION (now {REVISION}) by one and set \
             REVISION_CHECKSUM to \"{}\"",
            checksum(SQL)
        );
    }

    /// The file holds functions only, each created with `CREATE OR REPLACE` (re-running it must
    /// change nothing but bodies, and never fail on an existing function).
    #[test]
    fn functions_text_only_replaces_functions() {
        let code: Vec<&str> = SQL
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect();
        let creates = code
            .iter()
            .filter(|l| l.starts_with("CREATE OR REPLACE FUNCTION "))
            .count();
        assert!(creates > 0);
        for line in &code {
            let upper = line.trim_start().to_ascii_uppercase();
            for word in ["CREATE", "DROP", "ALTER"] {
                if upper.starts_with(word) && !line.starts_with("CREATE OR REPLACE FUNCTION ") {
                    // Inside a function body, statements are indented.
                    assert!(
                        line.starts_with(' '),
                        "functions.sql holds only CREATE OR REPLACE FUNCTION statements: {line}"
                    );
                }
            }
        }
        assert_eq!(
            code.iter().filter(|l| l.starts_with("$fn$;")).count(),
            creates,
            "every function body ends with $fn$; on a line of its own"
        );
    }
}
