//! Connecting and closing a [`PostgresCoordinator`]: migrations and server-side functions, the
//! write and read pools, the replica heartbeat, and the coordinator's event counters.

use super::PostgresCoordinator;
use super::attempt::sql_error;
use super::migrate::functions;
use super::options::PostgresOptions;
use super::reads;
use crate::rows::corrupt;
use crate::{Clock, CoordinatorError};
use sqlx::ConnectOptions;
use sqlx::postgres::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Event counters behind [`PostgresCoordinator::stats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) conflict_retries: AtomicU64,
    pub(super) replica_reads: AtomicU64,
    pub(super) replica_bypassed: AtomicU64,
    pub(super) primary_rechecks: AtomicU64,
    pub(super) retention_partitions: AtomicU64,
}

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
}
