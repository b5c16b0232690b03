//! Connecting and closing a [`PostgresCoordinator`] (migrations and server-side functions, the
//! write and read pools, the replica heartbeat), and what a database error means for a call: [`sql_error`], and the retry of
//! a write attempt after a conflict ([`PostgresCoordinator::retrying`]).

use super::migrate::functions;
use super::options::PostgresOptions;
use super::{Counters, PostgresCoordinator, reads};
use crate::rows::corrupt;
use crate::{Clock, CoordinatorError};
use sqlx::ConnectOptions;
use sqlx::postgres::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Applies the embedded migrations to the schema of `options` (creating the schema if needed) on a
/// connection of its own, then this build's server-side functions (`src/postgres/functions.sql`,
/// unless a newer build's are in place), and returns how many migrations were applied. Safe to
/// call from several processes at once: they take turns. Invalid `options` are refused
/// ([`PostgresOptions::validate`]).
pub async fn migrate(options: &PostgresOptions) -> Result<usize, CoordinatorError> {
    options.validate()?;
    let mut conn = options
        .connect_options(&options.url, "-migrate")?
        .connect()
        .await
        .map_err(|e| sql_error(e, false))?;
    let applied = super::migrate::run(&mut conn, options).await;
    if let Err(e) = sqlx::Connection::close(conn).await {
        tracing::debug!(error = %e, "closing the migration connection failed");
    }
    applied
}

/// Raises the schema's stored largest `max_commit_age` (which fence expiry reads, migration 6) to
/// `max_commit_age`, before this coordinator commits anything: from then on no fence of a key its
/// deadline still accepts can expire. Never lowers it.
async fn register_max_commit_age(
    write: &PgPool,
    max_commit_age: Duration,
) -> Result<(), CoordinatorError> {
    let updated = sqlx::query(
        "UPDATE coordinator_settings SET max_commit_age_ms = greatest(max_commit_age_ms, $1) \
         WHERE id = 1",
    )
    .bind(crate::max_age_ms(max_commit_age))
    .execute(write)
    .await
    .map_err(|e| sql_error(e, false))?;
    if updated.rows_affected() != 1 {
        return Err(corrupt(
            "coordinator_settings has no row: fence retention would be unknown",
        ));
    }
    Ok(())
}

impl PostgresCoordinator {
    /// Connects to the primary (failing with [`CoordinatorError::Unavailable`] when it cannot be
    /// reached), applies pending migrations and this build's functions when
    /// [`PostgresOptions::migrate_on_start`] is set (else checks that the schema and its functions
    /// are at this build's version or newer), and opens the read pool lazily. Invalid `options` are
    /// refused ([`PostgresOptions::validate`]).
    pub async fn connect(
        options: PostgresOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        options.validate()?;
        let write_options = options.connect_options(&options.url, "")?;
        let read_url = options.read_url.as_deref().unwrap_or(&options.url);
        let read_options = options.connect_options(read_url, "-read")?;
        if options.migrate_on_start {
            migrate(&options).await?;
        }
        let write = options
            .pool_options(options.max_connections, options.min_connections)
            .connect_with(write_options)
            .await
            .map_err(|e| sql_error(e, false))?;
        if !options.migrate_on_start {
            let mut conn = write.acquire().await.map_err(|e| sql_error(e, false))?;
            let version = super::migrate::applied_version(&mut conn, &options.schema).await?;
            if version < super::migrate::latest_version() {
                return Err(CoordinatorError::Storage(
                    format!(
                        "schema {} is at version {version}, this build needs {}: apply the \
                         migrations (diskless_coordinator::postgres::migrate)",
                        options.schema,
                        super::migrate::latest_version()
                    )
                    .into(),
                ));
            }
            let revision = functions::applied_revision(&mut conn, &options.schema).await?;
            if revision < functions::REVISION {
                return Err(CoordinatorError::Storage(
                    format!(
                        "the functions of schema {} are at revision {revision}, this build needs \
                         {}: apply the migrations (diskless_coordinator::postgres::migrate)",
                        options.schema,
                        functions::REVISION
                    )
                    .into(),
                ));
            }
        }
        register_max_commit_age(&write, options.max_commit_age).await?;
        let read = options
            .pool_options(options.read_max_connections, 0)
            .connect_lazy_with(read_options);
        let heartbeat = if options.read_url.is_some() {
            // The first heartbeat before the first read, so that a replica in sync serves reads
            // from the start.
            reads::write_heartbeat(&write, options.max_replica_lag).await;
            Some(tokio::spawn(reads::heartbeat_loop(
                write.clone(),
                options.max_replica_lag,
            )))
        } else {
            None
        };
        Ok(PostgresCoordinator {
            clock,
            options,
            write,
            read,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            replica_retry_at: std::sync::Mutex::new(None),
            heartbeat: std::sync::Mutex::new(heartbeat),
        })
    }

    /// Connects to the database at `url` with the default [`PostgresOptions`] (schema
    /// [`super::DEFAULT_SCHEMA`], migrations applied on start): what a `--coordinator
    /// postgres://...` flag needs.
    pub async fn connect_url(url: &str, clock: Arc<dyn Clock>) -> Result<Self, CoordinatorError> {
        Self::connect(PostgresOptions::new(url), clock).await
    }

    /// Applies pending embedded migrations to this coordinator's schema (see [`migrate`]).
    pub async fn migrate(&self) -> Result<usize, CoordinatorError> {
        migrate(&self.options).await
    }

    /// Closes both pools, waiting for calls in progress. Later calls fail with
    /// [`CoordinatorError::Closed`].
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.stop_heartbeat();
        self.write.close().await;
        self.read.close().await;
    }

    /// Stops the heartbeat task, if any.
    pub(super) fn stop_heartbeat(&self) {
        if let Some(task) = self
            .heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }

    /// [`CoordinatorError::Closed`] once closed.
    pub(super) fn check_open(&self) -> Result<(), CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(CoordinatorError::Closed)
        } else {
            Ok(())
        }
    }

    /// The pool for reads that must see the primary: the read pool unless it points elsewhere.
    pub(super) fn fresh_pool(&self) -> &PgPool {
        if self.options.read_url.is_some() {
            &self.write
        } else {
            &self.read
        }
    }

    /// Runs a write: refused once closed; the coordinator clock is read once, then `attempt(now)`
    /// runs until it succeeds, fails for good, or exhausts
    /// [`PostgresOptions::max_conflict_retries`] after conflicts (serialization failures and
    /// deadlocks: nothing was applied), backing off a little longer after each.
    pub(super) async fn retrying<T, F, Fut>(&self, attempt: F) -> Result<T, CoordinatorError>
    where
        F: Fn(i64) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        self.check_open()?;
        let now = self.clock.now_ms();
        let mut retries = 0u32;
        loop {
            match attempt(now).await {
                Ok(v) => return Ok(v),
                Err(Attempt::Sql(e, _))
                    if is_conflict(&e) && retries < self.options.max_conflict_retries =>
                {
                    retries += 1;
                    tracing::debug!(error = %e, attempt = retries, "retrying after a conflict");
                    self.counters
                        .conflict_retries
                        .fetch_add(1, Ordering::Relaxed);
                    let ms = 2u64.saturating_pow(retries.min(8));
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Err(Attempt::Sql(e, sent)) => return Err(sql_error(e, sent)),
                Err(Attempt::Done(e)) => return Err(e),
            }
        }
    }
}

/// Why one attempt of a write failed.
pub(super) enum Attempt {
    /// A database or connection error; `sent` when a statement that commits had been sent.
    Sql(sqlx::Error, bool),
    /// A decided outcome (unknown topic, duplicate object, corrupt row...).
    Done(CoordinatorError),
}

impl From<CoordinatorError> for Attempt {
    fn from(e: CoordinatorError) -> Self {
        Attempt::Done(e)
    }
}

impl Attempt {
    /// A failed statement that does not commit (nothing was applied).
    pub(super) fn before(e: sqlx::Error) -> Self {
        Attempt::Sql(e, false)
    }

    /// A failed statement that commits (autocommit, or `COMMIT`): the outcome may be unknown.
    pub(super) fn sent(e: sqlx::Error) -> Self {
        Attempt::Sql(e, true)
    }
}

/// Serialization failure or deadlock: PostgreSQL rolled the transaction back.
fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40001" | "40P01")))
}

/// Maps a sqlx error to the coordinator's. `sent`: a statement that commits (autocommit statement
/// or COMMIT) had been sent, so a lost connection leaves the outcome unknown.
pub(crate) fn sql_error(e: sqlx::Error, sent: bool) -> CoordinatorError {
    let lost = |e: sqlx::Error| {
        if sent {
            CoordinatorError::OutcomeUnknown(Box::new(e))
        } else {
            CoordinatorError::Unavailable(Box::new(e))
        }
    };
    match &e {
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            match code.as_str() {
                // Connection exceptions, admin/crash shutdown: the session is gone.
                c if c.starts_with("08") => lost(e),
                "57P01" | "57P02" | "57P03" => lost(e),
                // Rolled back for sure: conflicts, cancellation (statement_timeout), lock timeout,
                // insufficient resources, read-only (a replica or a demoted primary).
                "40001" | "40P01" | "57014" | "55P03" | "25006" => {
                    CoordinatorError::Unavailable(Box::new(e))
                }
                c if c.starts_with("53") => CoordinatorError::Unavailable(Box::new(e)),
                _ => CoordinatorError::Storage(Box::new(e)),
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => lost(e),
        sqlx::Error::PoolTimedOut => CoordinatorError::Unavailable(Box::new(e)),
        sqlx::Error::PoolClosed => CoordinatorError::Closed,
        _ => CoordinatorError::Storage(Box::new(e)),
    }
}
