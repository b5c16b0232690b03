//! The PostgreSQL batch coordinator: many brokers, one source of truth.
//!
//! See [`PostgresCoordinator`] and [`PostgresOptions`].

mod migrate;
mod reads;

use crate::{
    BatchCoordinate, BatchCoordinator, Clock, CommitBatchResult, CommitFileRequest,
    CoordinatorError, CreateTopicRequest, DeleteRecordsRequest, DeleteRecordsResponse, ErrorCode,
    FindBatchesRequest, FindBatchesResponse, ListOffsetsRequest, ListOffsetsResponse, ObjectInfo,
    ObjectToDelete, ProducerBatch, ProducerExpiryReport, ProducerState, RetentionReport, ShardId,
    TimestampType, TopicIdPartition, TopicInfo,
};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Postgres, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use uuid::Uuid;

/// The schema [`PostgresOptions::new`] uses.
pub const DEFAULT_SCHEMA: &str = "diskless";

/// Options of [`PostgresCoordinator::connect`].
#[derive(Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The primary's URL, `postgres://user[:password]@host[:port]/database[?params]`. Every write
    /// goes here.
    pub url: String,
    /// An optional URL for reads (a streaming read replica): `find_batches`, `list_offsets` and
    /// `list_topics` go there. When `None`, reads use a separate pool on the primary so that they
    /// never wait for a write connection.
    pub read_url: Option<String>,
    /// The schema holding every object of the coordinator (created by the migrations). A lowercase
    /// identifier: `[a-z_][a-z0-9_]*`, at most 63 characters. Default [`DEFAULT_SCHEMA`].
    pub schema: String,
    /// Connections of the write pool (commits, deletions, topic changes). Default 10.
    pub max_connections: u32,
    /// Connections the write pool keeps open when idle. Default 0.
    pub min_connections: u32,
    /// Connections of the read pool. Default 10.
    pub read_max_connections: u32,
    /// How long a call waits for a pooled connection before failing with
    /// [`CoordinatorError::Unavailable`]. Default 10 s.
    pub acquire_timeout: Duration,
    /// `statement_timeout` of every connection: a statement running longer is cancelled (and the
    /// call fails with [`CoordinatorError::Unavailable`]). Also used as
    /// `idle_in_transaction_session_timeout`, so a stalled caller cannot hold partition locks.
    /// Zero disables both. Default 30 s.
    pub statement_timeout: Duration,
    /// `lock_timeout` while migrating: a migration that cannot get a lock within it fails instead of
    /// blocking live traffic behind its lock request. Default 5 s.
    pub migration_lock_timeout: Duration,
    /// Apply pending migrations in [`PostgresCoordinator::connect`]. When false, `connect` checks
    /// that the schema is at this build's version and fails otherwise; the host applies migrations
    /// explicitly with [`migrate`] or [`PostgresCoordinator::migrate`]. Default true.
    pub migrate_on_start: bool,
    /// `application_name` of the write connections (the read pool's get a `-read` suffix), as shown
    /// in `pg_stat_activity`. Default `diskless-coordinator`.
    pub application_name: String,
    /// How many times a transaction is retried after a serialization failure (40001) or a deadlock
    /// (40P01), which PostgreSQL reports before anything was applied. Default 5.
    pub max_conflict_retries: u32,
    /// A pooled connection idle for longer than this is pinged before use, so that a connection the
    /// server dropped (restart, failover, idle timeout) is replaced instead of failing a commit with
    /// [`CoordinatorError::OutcomeUnknown`]. Busy connections are not pinged: a commit stays one
    /// round trip. Zero pings before every use. Default 1 s.
    pub ping_idle_after: Duration,
    /// With [`PostgresOptions::read_url`]: the most a read replica may lag for reads to use it.
    /// Each read measures the lag in its own snapshot (the replica's clock minus the newest
    /// heartbeat of the primary it holds; the coordinator writes that heartbeat every quarter of
    /// this bound, at most every second); a read finding more reads the primary instead. Keep it
    /// well below the object cleaner's deletion grace period (`ObjectCleaner`, 60 s by default)
    /// minus the clock skew between the servers, so that a fetch never gets the coordinates of
    /// an object already deleted. Default 30 s.
    pub max_replica_lag: Duration,
    /// The commit deadline: `commit_file` of a key whose UUID v7 time is older than the server's
    /// clock (`clock_timestamp()`) minus this is refused with
    /// [`CoordinatorError::DeadlineExceeded`], checked inside the commit function once every lock
    /// of the commit is held (see [`crate::check_commit_deadline`]). Default
    /// [`crate::DEFAULT_MAX_COMMIT_AGE`].
    ///
    /// Fences (of `fence_orphans` and of `confirm_deleted`) must outlive the deadline of EVERY
    /// coordinator sharing the schema, whatever its own setting, so they are not kept for a
    /// multiple of this value but of the schema's stored maximum: [`PostgresCoordinator::connect`]
    /// raises the schema's `coordinator_settings.max_commit_age_ms` to this value (it never lowers
    /// it; migration 6 starts it at 10 minutes, the previous fixed value) before the coordinator's
    /// first commit, and fences are kept until their key's time is older than
    /// [`crate::FENCE_RETENTION_FACTOR`] times the stored value (and at least that many times this
    /// one). Lowering `max_commit_age` therefore never shortens fence retention; to shorten it,
    /// lower the stored value by hand once no coordinator runs with a larger one. Brokers of the
    /// previous version (the old `commit_file` signature) use the stored value as their deadline.
    pub max_commit_age: Duration,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &redact(&self.url))
            .field("read_url", &self.read_url.as_deref().map(redact))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("read_max_connections", &self.read_max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("migration_lock_timeout", &self.migration_lock_timeout)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("application_name", &self.application_name)
            .field("max_conflict_retries", &self.max_conflict_retries)
            .field("ping_idle_after", &self.ping_idle_after)
            .field("max_replica_lag", &self.max_replica_lag)
            .field("max_commit_age", &self.max_commit_age)
            .finish()
    }
}

/// A URL with its password replaced by `***`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl PostgresOptions {
    /// Options for the database at `url`, with the defaults documented on each field.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            read_url: None,
            schema: DEFAULT_SCHEMA.to_string(),
            max_connections: 10,
            min_connections: 0,
            read_max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            migration_lock_timeout: Duration::from_secs(5),
            migrate_on_start: true,
            application_name: "diskless-coordinator".to_string(),
            max_conflict_retries: 5,
            ping_idle_after: Duration::from_secs(1),
            max_replica_lag: Duration::from_secs(30),
            max_commit_age: crate::DEFAULT_MAX_COMMIT_AGE,
        }
    }

    /// Sets [`PostgresOptions::read_url`].
    pub fn read_url(mut self, url: impl Into<String>) -> Self {
        self.read_url = Some(url.into());
        self
    }

    /// Sets [`PostgresOptions::schema`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets [`PostgresOptions::max_connections`] (at least 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets [`PostgresOptions::min_connections`].
    pub fn min_connections(mut self, n: u32) -> Self {
        self.min_connections = n;
        self
    }

    /// Sets [`PostgresOptions::read_max_connections`] (at least 1).
    pub fn read_max_connections(mut self, n: u32) -> Self {
        self.read_max_connections = n.max(1);
        self
    }

    /// Sets [`PostgresOptions::acquire_timeout`].
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets [`PostgresOptions::statement_timeout`].
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Sets [`PostgresOptions::migration_lock_timeout`].
    pub fn migration_lock_timeout(mut self, timeout: Duration) -> Self {
        self.migration_lock_timeout = timeout;
        self
    }

    /// Sets [`PostgresOptions::migrate_on_start`].
    pub fn migrate_on_start(mut self, migrate: bool) -> Self {
        self.migrate_on_start = migrate;
        self
    }

    /// Sets [`PostgresOptions::application_name`].
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Sets [`PostgresOptions::max_conflict_retries`].
    pub fn max_conflict_retries(mut self, n: u32) -> Self {
        self.max_conflict_retries = n;
        self
    }

    /// Sets [`PostgresOptions::ping_idle_after`].
    pub fn ping_idle_after(mut self, idle: Duration) -> Self {
        self.ping_idle_after = idle;
        self
    }

    /// Sets [`PostgresOptions::max_replica_lag`].
    pub fn max_replica_lag(mut self, lag: Duration) -> Self {
        self.max_replica_lag = lag;
        self
    }

    /// Sets [`PostgresOptions::max_commit_age`].
    pub fn max_commit_age(mut self, age: Duration) -> Self {
        self.max_commit_age = age;
        self
    }

    /// Pool options shared by both pools: timeouts and the idle-connection health check.
    fn pool_options(&self, max_connections: u32, min_connections: u32) -> PgPoolOptions {
        let ping_after = self.ping_idle_after;
        PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(min_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= ping_after {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    fn validate_schema(&self) -> Result<(), CoordinatorError> {
        let s = self.schema.as_bytes();
        let ok = !s.is_empty()
            && s.len() <= 63
            && (s[0].is_ascii_lowercase() || s[0] == b'_')
            && s.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
            && !self.schema.starts_with("pg_");
        if ok {
            Ok(())
        } else {
            Err(CoordinatorError::InvalidRequest(format!(
                "invalid schema name {:?}: use [a-z_][a-z0-9_]*, at most 63 characters, not pg_*",
                self.schema
            )))
        }
    }

    /// Connection options for `url`: search_path = the schema, statement_timeout, application_name.
    fn connect_options(
        &self,
        url: &str,
        suffix: &str,
    ) -> Result<PgConnectOptions, CoordinatorError> {
        self.validate_schema()?;
        let base = PgConnectOptions::from_str(url).map_err(|e| {
            CoordinatorError::InvalidRequest(format!("bad PostgreSQL URL {}: {e}", redact(url)))
        })?;
        let statement_timeout = self.statement_timeout.as_millis().to_string();
        Ok(base
            .options([
                ("search_path", self.schema.clone()),
                ("statement_timeout", statement_timeout.clone()),
                // A transaction left idle (a stalled process) must not hold partition locks for
                // long: the server ends the session, and the transaction never commits.
                ("idle_in_transaction_session_timeout", statement_timeout),
            ])
            .application_name(&format!("{}{suffix}", self.application_name)))
    }
}

/// Applies the embedded migrations to the schema of `options` (creating the schema if needed) on a
/// connection of its own, and returns how many were applied. Safe to call from several processes
/// at once: they take turns.
pub async fn migrate(options: &PostgresOptions) -> Result<usize, CoordinatorError> {
    let mut conn = options
        .connect_options(&options.url, "-migrate")?
        .connect()
        .await
        .map_err(|e| sql_error(e, false))?;
    let applied = migrate::run(&mut conn, options).await;
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
    .bind(duration_ms(max_commit_age))
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

/// A [`BatchCoordinator`] on PostgreSQL: one source of truth for many brokers.
///
/// - **One round trip per commit**: [`BatchCoordinator::commit_file`] is a single call of the
///   server-side function `commit_file` (PL/pgSQL, created by the migrations) taking the batches as
///   arrays. It registers the object and appends every batch in one implicit transaction, applying
///   offsets, LogAppendTime (the coordinator clock's time, passed in: the injected [`Clock`] stays
///   the source of time) and the idempotent-producer rules, and returns one row per batch.
/// - **Correct under concurrency without SERIALIZABLE**: a commit locks the rows of the partitions it
///   touches `FOR UPDATE`, in (topic id, partition) order, under READ COMMITTED; every other writer
///   (DeleteRecords, retention, topic deletion) locks partitions in the same order and the objects it
///   releases in object id order, so writers cannot deadlock. Should PostgreSQL still report a
///   serialization failure (40001) or a deadlock (40P01) — both mean nothing was applied — the call
///   is retried up to [`PostgresOptions::max_conflict_retries`] times. Nothing else is retried.
/// - **Honest failures**: an error before anything was sent (no connection, pool exhausted) is
///   [`CoordinatorError::Unavailable`]; a lost connection once a commit (or any statement that
///   commits) was sent is [`CoordinatorError::OutcomeUnknown`] — the caller must not assume either
///   outcome; an idempotent producer's retry is safe (it is recognised as a duplicate).
/// - **The commit point**: inside the commit function, once every lock of the commit is held (the
///   key's advisory lock, its object row, its partitions' rows), the server checks the commit
///   deadline against its own clock ([`PostgresOptions::max_commit_age`]) and the orphan fences
///   ([`BatchCoordinator::fence_orphans`]), and refuses the whole commit
///   ([`CoordinatorError::DeadlineExceeded`], [`CoordinatorError::ObjectFenced`]: nothing
///   applied). `fence_orphans` takes the same per-key advisory locks, so a fence and a commit of a
///   key serialize under READ COMMITTED: never both succeed. Deleting an object row
///   (`confirm_deleted`) fences its key in the same transaction (a trigger, migration 6), so a
///   deleted object is never committed again. Fence expiry reads the server's clock too, and keeps
///   fences for twice the largest `max_commit_age` any coordinator of the schema connected with
///   (see [`PostgresOptions::max_commit_age`]). Everything else (commit times, LogAppendTime, retention, producer expiry) reads
///   the injected [`Clock`].
/// - **Reads never block commits**: `find_batches`, `list_offsets` and `list_topics` run on a
///   separate pool, optionally on a read replica ([`PostgresOptions::read_url`]), each call on one
///   snapshot. A replica is read only while its measured lag is within
///   [`PostgresOptions::max_replica_lag`] (else the primary answers), and what it would answer as
///   out of range, unknown or without the timestamp is asked again on the primary. Queries whose
///   staleness could lose data (`known_objects`, `objects_to_delete`, `object_info`,
///   `producer_state`) always read the primary (through the read pool when it points at the
///   primary).
/// - **Bounded maintenance**: `enforce_retention` and `expire_producers` visit candidate
///   partitions page by page in the global lock order and stop as soon as their budget is spent,
///   so they hold row locks for work bounded by the budget. ListOffsets by timestamp costs a
///   bounded number of index probes (see migrations 3 and 4).
/// - **Schema**: everything lives in one schema ([`PostgresOptions::schema`]), set as the
///   connections' `search_path`; embedded migrations are recorded in `schema_migrations` there and
///   applied by [`migrate`] (explicitly, or on start). Migrations only add objects and run with a
///   short `lock_timeout` (index builds run `CONCURRENTLY`), so they never hold long exclusive
///   locks on a live table.
///
/// The semantics are those of the conformance suite in `diskless-testkit` (Kafka's, at batch
/// granularity), which this implementation passes, as it passes the model-based test against the
/// reference model.
///
/// # Example
/// ```no_run
/// use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
/// use diskless_coordinator::*;
/// use std::sync::Arc;
///
/// # async fn example() -> Result<(), CoordinatorError> {
/// let options = PostgresOptions::new("postgres://diskless@db.internal:5432/kafka")
///     .schema("diskless")
///     .read_url("postgres://diskless@db-replica.internal:5432/kafka")
///     .max_connections(20);
/// let coordinator = PostgresCoordinator::connect(options, Arc::new(SystemClock)).await?;
///
/// let topic_id = uuid::Uuid::from_u128(42);
/// coordinator
///     .create_topic(CreateTopicRequest {
///         topic_id,
///         name: "orders".into(),
///         partitions: 3,
///         config: TopicConfig::default(),
///     })
///     .await?;
/// let results = coordinator
///     .commit_file(CommitFileRequest {
///         object_key: "wal/0001".into(),
///         uploader_broker_id: 1,
///         object_size: 101,
///         owners: vec![0],
///         batches: vec![CommitBatch {
///             partition: TopicIdPartition::new(topic_id, 0),
///             byte_offset: 1,
///             byte_size: 100,
///             record_count: 3,
///             base_timestamp: 900,
///             max_timestamp: 950,
///             timestamp_type: TimestampType::CreateTime,
///             producer_id: NO_PRODUCER_ID,
///             producer_epoch: NO_PRODUCER_EPOCH,
///             base_sequence: NO_SEQUENCE,
///             last_sequence: NO_SEQUENCE,
///         }],
///     })
///     .await?;
/// assert_eq!(results[0].base_offset, 0);
/// coordinator.close().await;
/// # Ok(())
/// # }
/// ```
pub struct PostgresCoordinator {
    clock: Arc<dyn Clock>,
    options: PostgresOptions,
    write: PgPool,
    read: PgPool,
    closed: AtomicBool,
    counters: Counters,
    /// After a replica failure: reads skip the replica until then.
    replica_retry_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The task writing the primary heartbeat (with a read replica only).
    heartbeat: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Event counters behind [`PostgresCoordinator::stats`].
#[derive(Default)]
struct Counters {
    conflict_retries: AtomicU64,
    replica_reads: AtomicU64,
    replica_bypassed: AtomicU64,
    primary_rechecks: AtomicU64,
    retention_partitions: AtomicU64,
}

/// What a [`PostgresCoordinator`] did since it connected (for monitoring).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Transactions retried after a serialization failure or deadlock (with the fixed lock order
    /// this stays 0 for commits).
    pub conflict_retries: u64,
    /// Reads run on the read replica ([`PostgresOptions::read_url`]).
    pub replica_reads: u64,
    /// Reads run on the primary although a replica is configured: it lagged more than
    /// [`PostgresOptions::max_replica_lag`], held no heartbeat, or failed.
    pub replica_bypassed: u64,
    /// Replica reads that asked the primary again about partitions the replica answered as out
    /// of range, unknown or without the timestamp.
    pub primary_rechecks: u64,
    /// Partitions examined by retention passes (a pass stops as soon as its budget is spent).
    pub retention_partitions_examined: u64,
}

impl Drop for PostgresCoordinator {
    fn drop(&mut self) {
        if let Some(task) = self
            .heartbeat
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

impl std::fmt::Debug for PostgresCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCoordinator")
            .field("options", &self.options)
            .field("clock", &self.clock)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl PostgresCoordinator {
    /// Connects to the primary (failing with [`CoordinatorError::Unavailable`] when it cannot be
    /// reached), applies pending migrations when [`PostgresOptions::migrate_on_start`] is set (else
    /// checks that the schema is at this build's version), and opens the read pool lazily.
    pub async fn connect(
        options: PostgresOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
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
            let version = migrate::applied_version(&mut conn, &options.schema).await?;
            if version < migrate::latest_version() {
                return Err(CoordinatorError::Storage(
                    format!(
                        "schema {} is at version {version}, this build needs {}: apply the \
                         migrations (diskless_coordinator::postgres::migrate)",
                        options.schema,
                        migrate::latest_version()
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
    /// [`DEFAULT_SCHEMA`], migrations applied on start): what a `--coordinator postgres://...`
    /// flag needs.
    pub async fn connect_url(url: &str, clock: Arc<dyn Clock>) -> Result<Self, CoordinatorError> {
        Self::connect(PostgresOptions::new(url), clock).await
    }

    /// Applies pending embedded migrations to this coordinator's schema (see [`migrate`]).
    pub async fn migrate(&self) -> Result<usize, CoordinatorError> {
        migrate(&self.options).await
    }

    /// The options this coordinator was connected with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// How many transactions were retried after a serialization failure or deadlock since connect
    /// (for monitoring: with the fixed lock order this stays 0 for commits).
    pub fn conflict_retries(&self) -> u64 {
        self.counters.conflict_retries.load(Ordering::Relaxed)
    }

    /// What this coordinator did since it connected.
    pub fn stats(&self) -> PostgresStats {
        let c = &self.counters;
        PostgresStats {
            conflict_retries: c.conflict_retries.load(Ordering::Relaxed),
            replica_reads: c.replica_reads.load(Ordering::Relaxed),
            replica_bypassed: c.replica_bypassed.load(Ordering::Relaxed),
            primary_rechecks: c.primary_rechecks.load(Ordering::Relaxed),
            retention_partitions_examined: c.retention_partitions.load(Ordering::Relaxed),
        }
    }

    /// Closes both pools, waiting for calls in progress. Later calls fail with
    /// [`CoordinatorError::Closed`].
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(task) = self
            .heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
        self.write.close().await;
        self.read.close().await;
    }

    fn check_open(&self) -> Result<(), CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(CoordinatorError::Closed)
        } else {
            Ok(())
        }
    }

    /// The pool for reads that must see the primary: the read pool unless it points elsewhere.
    fn fresh_pool(&self) -> &PgPool {
        if self.options.read_url.is_some() {
            &self.write
        } else {
            &self.read
        }
    }

    /// Counts a conflict retry and backs off a little (longer after each attempt).
    async fn backoff(&self, attempt: u32) {
        self.counters
            .conflict_retries
            .fetch_add(1, Ordering::Relaxed);
        let ms = 2u64.saturating_pow(attempt.min(8));
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

// -------------------------------------------------------------------------------------------------
// Errors

/// Why one attempt of a write failed.
enum Attempt {
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

/// Runs `$attempt` (an expression evaluating to `Result<T, Attempt>`) until it succeeds, fails for
/// good, or exhausts the conflict retries.
macro_rules! retrying {
    ($self:ident, $attempt:expr) => {{
        let mut attempt = 0u32;
        loop {
            match $attempt {
                Err(Attempt::Sql(e, _))
                    if is_conflict(&e) && attempt < $self.options.max_conflict_retries =>
                {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying after a conflict");
                    $self.backoff(attempt).await;
                }
                Ok(v) => break Ok(v),
                Err(Attempt::Sql(e, sent)) => break Err(sql_error(e, sent)),
                Err(Attempt::Done(e)) => break Err(e),
            }
        }
    }};
}

/// The commit function's refusals at its commit point (nothing applied) as the coordinator's
/// errors; any other error as a failed attempt whose statement was sent.
fn commit_point_error(e: sqlx::Error, key: &str) -> Attempt {
    if let sqlx::Error::Database(d) = &e {
        match d.code().as_deref() {
            Some(DEADLINE_EXCEEDED) => {
                return Attempt::Done(CoordinatorError::DeadlineExceeded(d.message().to_string()));
            }
            Some(OBJECT_FENCED) => {
                return Attempt::Done(CoordinatorError::ObjectFenced(key.to_string()));
            }
            _ => {}
        }
    }
    Attempt::Sql(e, true)
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

fn corrupt(what: impl Into<String>) -> CoordinatorError {
    CoordinatorError::Storage(what.into().into())
}

fn col<'r, T>(row: &'r PgRow, i: usize) -> Result<T, CoordinatorError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(i)
        .map_err(|e| CoordinatorError::Storage(Box::new(e)))
}

fn to_u64(v: i64, what: &str) -> Result<u64, CoordinatorError> {
    u64::try_from(v).map_err(|_| corrupt(format!("negative {what}: {v}")))
}

fn to_u32(v: i64, what: &str) -> Result<u32, CoordinatorError> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} out of range: {v}")))
}

fn ts_type_code(t: TimestampType) -> i16 {
    match t {
        TimestampType::CreateTime => 0,
        TimestampType::LogAppendTime => 1,
    }
}

fn ts_type(code: i16) -> Result<TimestampType, CoordinatorError> {
    match code {
        0 => Ok(TimestampType::CreateTime),
        1 => Ok(TimestampType::LogAppendTime),
        other => Err(corrupt(format!("unknown timestamp type {other}"))),
    }
}

fn parse_topic_id(s: &str) -> Result<Uuid, CoordinatorError> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("bad topic id {s:?}")))
}

/// Topic ids and partition indexes of `partitions` as bindable arrays.
fn partition_arrays(partitions: impl Iterator<Item = TopicIdPartition>) -> (Vec<String>, Vec<i32>) {
    partitions
        .map(|p| (p.topic_id.hyphenated().to_string(), p.partition))
        .unzip()
}

// -------------------------------------------------------------------------------------------------
// Validation (the same rules as the reference model; the conformance suite pins them)

// -------------------------------------------------------------------------------------------------
// SQL

/// `d` in ms, saturating.
fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The effective max timestamp of a batch row `b` (the expression of the `batches_effective_ts`
/// index, migration 4).
const EFFECTIVE_TS: &str =
    "(CASE WHEN b.timestamp_type = 1 THEN b.log_append_time ELSE b.max_timestamp END)";

/// The time retention ages a batch row `b` by: its effective max timestamp, or, for a batch without
/// any timestamp (`< 0`), its commit time (its object's), as Kafka ages a segment without
/// timestamps by its modification time.
fn retention_ts() -> String {
    format!(
        "(CASE WHEN {EFFECTIVE_TS} >= 0 THEN {EFFECTIVE_TS} ELSE (SELECT o.committed_at \
         FROM objects o WHERE o.object_id = b.object_id) END)"
    )
}

const CALL_COMMIT_FILE: &str = "SELECT r_batch_index, r_error_code, r_base_offset, \
     r_log_append_time, r_log_start_offset, r_duplicate FROM commit_file($1, $2, $3, $4, $5, \
     $6::text[]::uuid[], $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)";

/// SQLSTATE of `check_commit_point` (migration 5): the commit deadline passed.
const DEADLINE_EXCEEDED: &str = "DL001";
/// SQLSTATE of `check_commit_point` (migration 5): the key is fenced.
const OBJECT_FENCED: &str = "DL002";

/// Batches per partition fetched by the first find_batches query (more pages follow when needed).
const FIRST_PAGE: i64 = 64;
/// Batches per follow-up page.
const PAGE: i64 = 512;
/// Batches examined per round trip by retention.
const RETENTION_PAGE: i64 = 1024;
/// Candidate partitions fetched per round trip by retention.
const RETENTION_CANDIDATES: i64 = 32;

/// The 14 columns [`batch_from_row`] decodes; batch columns from `b`, object columns from `o`.
fn batch_columns(o: &str) -> String {
    format!(
        "b.base_offset, b.last_offset, b.byte_offset, b.byte_size, b.base_timestamp, \
         b.max_timestamp, b.timestamp_type, b.log_append_time, b.producer_id, b.producer_epoch, \
         b.base_sequence, b.last_sequence, {o}.object_key, {o}.object_size"
    )
}

/// Decodes the 14 batch columns starting at `at`.
fn batch_from_row(row: &PgRow, at: usize) -> Result<BatchCoordinate, CoordinatorError> {
    Ok(BatchCoordinate {
        base_offset: col(row, at)?,
        last_offset: col(row, at + 1)?,
        byte_offset: to_u64(col(row, at + 2)?, "byte offset")?,
        byte_size: to_u32(col(row, at + 3)?, "byte size")?,
        base_timestamp: col(row, at + 4)?,
        max_timestamp: col(row, at + 5)?,
        timestamp_type: ts_type(col(row, at + 6)?)?,
        log_append_time: col(row, at + 7)?,
        producer_id: col(row, at + 8)?,
        producer_epoch: col(row, at + 9)?,
        base_sequence: col(row, at + 10)?,
        last_sequence: col(row, at + 11)?,
        object_key: col(row, at + 12)?,
        object_size: to_u64(col(row, at + 13)?, "object size")?,
    })
}

/// Deletes the batches of the partitions `partition_ids` below `below`, adding the released bytes
/// per object to `released`; returns the number of batches and bytes deleted.
async fn delete_batches_below(
    conn: &mut PgConnection,
    partition_ids: &[i64],
    below: i64,
    released: &mut BTreeMap<i64, i64>,
) -> Result<(u64, i64), Attempt> {
    let rows = sqlx::query(
        "WITH d AS (DELETE FROM batches WHERE partition_id = ANY($1) AND last_offset < $2 \
         RETURNING object_id, byte_size) \
         SELECT object_id, count(*)::bigint, sum(byte_size)::bigint FROM d GROUP BY object_id",
    )
    .bind(partition_ids)
    .bind(below)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| Attempt::Sql(e, false))?;
    let (mut count, mut bytes) = (0u64, 0i64);
    for row in &rows {
        let object_id: i64 = col(row, 0)?;
        let n: i64 = col(row, 1)?;
        let b: i64 = col(row, 2)?;
        count += to_u64(n, "batch count")?;
        bytes += b;
        *released.entry(object_id).or_default() += b;
    }
    Ok((count, bytes))
}

/// Takes released bytes off objects (locking them in object id order), marking those left with no
/// live bytes at `now`.
async fn release_objects(
    conn: &mut PgConnection,
    released: &BTreeMap<i64, i64>,
    now: i64,
) -> Result<(), Attempt> {
    if released.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = released.keys().copied().collect();
    let bytes: Vec<i64> = released.values().copied().collect();
    sqlx::query(
        "SELECT object_id FROM objects WHERE object_id = ANY($1) ORDER BY object_id FOR UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| Attempt::Sql(e, false))?;
    sqlx::query(
        "UPDATE objects o SET live_bytes = greatest(o.live_bytes - u.bytes, 0), \
         marked_for_deletion_at = CASE WHEN o.marked_for_deletion_at IS NULL \
         AND o.live_bytes - u.bytes <= 0 THEN $3 ELSE o.marked_for_deletion_at END \
         FROM unnest($1::bigint[], $2::bigint[]) AS u(id, bytes) WHERE o.object_id = u.id",
    )
    .bind(&ids)
    .bind(&bytes)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| Attempt::Sql(e, false))?;
    Ok(())
}

/// Retention of one partition: locks its row, deletes the prefix that retention.ms (then
/// retention.bytes on what is left) allows, at most `budget` batches (Kafka 3.x order), adding to
/// `report` and the released bytes per object. Returns the number of batches deleted.
async fn trim_partition(
    conn: &mut PgConnection,
    partition_id: i64,
    budget: u64,
    now: i64,
    released: &mut BTreeMap<i64, i64>,
    report: &mut RetentionReport,
) -> Result<u64, Attempt> {
    let Some(row) = sqlx::query(
        "SELECT pa.byte_size, t.retention_ms, t.retention_bytes \
         FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
         WHERE pa.partition_id = $1 FOR UPDATE OF pa",
    )
    .bind(partition_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| Attempt::Sql(e, false))?
    else {
        return Ok(0);
    };
    let size: i64 = col(&row, 0)?;
    let retention_ms: i64 = col(&row, 1)?;
    let retention_bytes: i64 = col(&row, 2)?;
    // Up to `budget` batches are examined, in pages of 8 doubling to RETENTION_PAGE, so a partition
    // losing d batches costs about 2d + 8 rows read, whatever the budget.
    let mut page: u64 = 8;
    let mut deletable: u64 = 0;
    let mut last_deletable = None;
    let mut remaining = size;
    let mut by_time = retention_ms >= 0;
    let mut after = i64::MIN;
    'pages: while deletable < budget {
        let want = (budget - deletable).min(page).min(RETENTION_PAGE as u64);
        page = page.saturating_mul(2);
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT b.last_offset, b.byte_size, {ts} FROM batches b \
             WHERE b.partition_id = $1 AND b.last_offset > $2 \
             ORDER BY b.last_offset LIMIT $3",
            ts = retention_ts()
        )))
        .bind(partition_id)
        .bind(after)
        .bind(want as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| Attempt::Sql(e, false))?;
        for row in &rows {
            let last_offset: i64 = col(row, 0)?;
            let bytes: i64 = col(row, 1)?;
            let ts: i64 = col(row, 2)?;
            if !(by_time && now.saturating_sub(ts) > retention_ms) {
                by_time = false;
                if !(retention_bytes >= 0 && remaining - bytes >= retention_bytes) {
                    break 'pages;
                }
            }
            remaining -= bytes;
            deletable += 1;
            last_deletable = Some(last_offset);
            after = last_offset;
        }
        if (rows.len() as u64) < want {
            break;
        }
    }
    let Some(last) = last_deletable else {
        return Ok(0);
    };
    let below = last + 1;
    let (count, bytes) = delete_batches_below(conn, &[partition_id], below, released).await?;
    sqlx::query(
        "UPDATE partitions SET log_start_offset = greatest(log_start_offset, $2), \
         byte_size = byte_size - $3 WHERE partition_id = $1",
    )
    .bind(partition_id)
    .bind(below)
    .bind(bytes)
    .execute(&mut *conn)
    .await
    .map_err(|e| Attempt::Sql(e, false))?;
    report.batches_deleted += count;
    report.bytes_deleted += to_u64(bytes, "deleted bytes")?;
    Ok(count)
}

impl PostgresCoordinator {
    async fn try_commit_file(
        &self,
        request: &CommitFileRequest,
        now: i64,
    ) -> Result<Vec<CommitBatchResult>, Attempt> {
        let n = request.batches.len();
        let (topic_ids, partitions) = partition_arrays(request.batches.iter().map(|b| b.partition));
        let mut byte_offsets = Vec::with_capacity(n);
        let mut byte_sizes = Vec::with_capacity(n);
        let mut record_counts = Vec::with_capacity(n);
        let mut base_ts = Vec::with_capacity(n);
        let mut max_ts = Vec::with_capacity(n);
        let mut producer_ids = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        let mut base_seqs = Vec::with_capacity(n);
        let mut last_seqs = Vec::with_capacity(n);
        let mut field_errors: Vec<i16> = Vec::with_capacity(n);
        for b in &request.batches {
            field_errors.push(crate::producer_field_error(b).map_or(0, ErrorCode::code));
            // Validated: byte_offset + byte_size <= object_size <= i64::MAX.
            byte_offsets.push(b.byte_offset as i64);
            byte_sizes.push(i64::from(b.byte_size));
            record_counts.push(b.record_count);
            base_ts.push(b.base_timestamp);
            max_ts.push(b.max_timestamp);
            producer_ids.push(b.producer_id);
            epochs.push(b.producer_epoch);
            base_seqs.push(b.base_sequence);
            last_seqs.push(b.last_sequence);
        }
        let owners: Vec<i64> = request.owners.iter().map(|o| i64::from(*o)).collect();
        let mut conn = self
            .write
            .acquire()
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        let rows = sqlx::query(CALL_COMMIT_FILE)
            .bind(&request.object_key)
            .bind(request.uploader_broker_id)
            .bind(request.object_size as i64)
            .bind(&owners)
            .bind(now)
            .bind(&topic_ids)
            .bind(&partitions)
            .bind(&byte_offsets)
            .bind(&byte_sizes)
            .bind(&record_counts)
            .bind(&base_ts)
            .bind(&max_ts)
            .bind(&producer_ids)
            .bind(&epochs)
            .bind(&base_seqs)
            .bind(&last_seqs)
            .bind(crate::object_key_time_ms(&request.object_key))
            .bind(duration_ms(self.options.max_commit_age))
            .bind(&field_errors)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| commit_point_error(e, &request.object_key))?;
        if let Some(first) = rows.first()
            && col::<i32>(first, 0)? == -1
        {
            return Err(
                CoordinatorError::ObjectAlreadyCommitted(request.object_key.clone()).into(),
            );
        }
        if rows.len() != n {
            return Err(corrupt(format!(
                "commit_file returned {} rows for {n} batches",
                rows.len()
            ))
            .into());
        }
        let mut results = Vec::with_capacity(n);
        for (i, row) in rows.iter().enumerate() {
            let index: i32 = col(row, 0)?;
            if usize::try_from(index).ok() != Some(i + 1) {
                return Err(corrupt(format!("commit_file row {i} has index {index}")).into());
            }
            let code: i16 = col(row, 1)?;
            let error = ErrorCode::from_code(code)
                .ok_or_else(|| corrupt(format!("commit_file returned error code {code}")))?;
            results.push(CommitBatchResult {
                error,
                base_offset: col(row, 2)?,
                log_append_time: col(row, 3)?,
                log_start_offset: col(row, 4)?,
                duplicate: col(row, 5)?,
            });
        }
        Ok(results)
    }

    async fn try_delete_topic(&self, topic_id: Uuid, now: i64) -> Result<(), Attempt> {
        let id = topic_id.hyphenated().to_string();
        let mut tx = self
            .write
            .begin()
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        let exists = sqlx::query("SELECT 1 FROM topics WHERE topic_id = $1::uuid FOR UPDATE")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        if exists.is_none() {
            return Err(CoordinatorError::UnknownTopic(id).into());
        }
        let partition_ids: Vec<i64> = sqlx::query_scalar(
            "SELECT partition_id FROM partitions WHERE topic_id = $1::uuid \
             ORDER BY partition FOR UPDATE",
        )
        .bind(&id)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| Attempt::Sql(e, false))?;
        let mut released = BTreeMap::new();
        delete_batches_below(&mut tx, &partition_ids, i64::MAX, &mut released).await?;
        release_objects(&mut tx, &released, now).await?;
        for sql in [
            "DELETE FROM producer_state WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = $1::uuid)",
            "DELETE FROM partitions WHERE topic_id = $1::uuid",
            "DELETE FROM topics WHERE topic_id = $1::uuid",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(|e| Attempt::Sql(e, false))?;
        }
        tx.commit().await.map_err(|e| Attempt::Sql(e, true))
    }

    async fn try_delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
        now: i64,
    ) -> Result<Vec<DeleteRecordsResponse>, Attempt> {
        let mut tx = self
            .write
            .begin()
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        let (topic_ids, partitions) = partition_arrays(requests.iter().map(|r| r.partition));
        // Lock every partition up front, in the global order.
        let rows = sqlx::query(
            "SELECT pa.topic_id::text, pa.partition, pa.partition_id, pa.log_start_offset, \
             pa.high_watermark FROM partitions pa WHERE (pa.topic_id, pa.partition) IN \
             (SELECT u.t, u.p FROM unnest($1::text[]::uuid[], $2::integer[]) AS u(t, p)) \
             ORDER BY pa.topic_id, pa.partition FOR UPDATE",
        )
        .bind(&topic_ids)
        .bind(&partitions)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| Attempt::Sql(e, false))?;
        // (partition_id, log start offset, high watermark)
        let mut logs: HashMap<TopicIdPartition, (i64, i64, i64)> = HashMap::new();
        for row in &rows {
            let p = TopicIdPartition::new(parse_topic_id(&col::<String>(row, 0)?)?, col(row, 1)?);
            logs.insert(p, (col(row, 2)?, col(row, 3)?, col(row, 4)?));
        }
        let mut released = BTreeMap::new();
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let error = |code| DeleteRecordsResponse {
                error: code,
                low_watermark: -1,
            };
            let Some((partition_id, lso, hwm)) = logs.get_mut(&request.partition) else {
                responses.push(error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            let target = if request.offset == -1 {
                *hwm
            } else {
                request.offset
            };
            if target < 0 || target > *hwm {
                responses.push(error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            if target > *lso {
                let (_, bytes) =
                    delete_batches_below(&mut tx, &[*partition_id], target, &mut released).await?;
                sqlx::query(
                    "UPDATE partitions SET log_start_offset = $2, byte_size = byte_size - $3 \
                     WHERE partition_id = $1",
                )
                .bind(*partition_id)
                .bind(target)
                .bind(bytes)
                .execute(&mut *tx)
                .await
                .map_err(|e| Attempt::Sql(e, false))?;
                *lso = target;
            }
            responses.push(DeleteRecordsResponse {
                error: ErrorCode::None,
                low_watermark: *lso,
            });
        }
        release_objects(&mut tx, &released, now).await?;
        tx.commit().await.map_err(|e| Attempt::Sql(e, true))?;
        Ok(responses)
    }

    /// One producer expiry call (see [`BatchCoordinator::expire_producers`]): partitions with
    /// expired producer states are found page by page in the global lock order; each is locked
    /// (a commit writes a partition's producer states only under that lock, so a state refreshed
    /// meanwhile is seen and kept) and its expired states deleted in producer id order, until
    /// `max_producers` are deleted.
    async fn try_expire_producers(
        &self,
        max_producers: u32,
        now: i64,
    ) -> Result<ProducerExpiryReport, Attempt> {
        let mut report = ProducerExpiryReport::default();
        if max_producers == 0 {
            return Ok(report);
        }
        let mut tx = self
            .write
            .begin()
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        let budget = u64::from(max_producers);
        let mut after: Option<(String, i32)> = None;
        'walk: loop {
            let (cursor, topic, partition) = match &after {
                Some((t, p)) => (
                    "AND (pa.topic_id, pa.partition) > ($2::uuid, $3)",
                    t.as_str(),
                    *p,
                ),
                None => ("AND $2::text IS NULL AND $3::integer IS NULL", "", 0),
            };
            let candidates = sqlx::query(AssertSqlSafe(format!(
                "SELECT pa.partition_id, pa.topic_id::text, pa.partition \
                 FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
                 WHERE EXISTS (SELECT 1 FROM producer_state s WHERE s.partition_id = pa.partition_id \
                 AND $1 - s.last_append_ms >= t.producer_id_expiration_ms) {cursor} \
                 ORDER BY pa.topic_id, pa.partition LIMIT {RETENTION_CANDIDATES}"
            )))
            .bind(now)
            .bind(after.as_ref().map(|_| topic))
            .bind(after.as_ref().map(|_| partition))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
            for row in &candidates {
                let partition_id: i64 = col(row, 0)?;
                after = Some((col(row, 1)?, col(row, 2)?));
                // Lock first, then decide in a new statement (a new snapshot under READ
                // COMMITTED): a commit that refreshed a state before the lock is seen.
                let Some(expiration) = sqlx::query_scalar::<_, i64>(
                    "SELECT t.producer_id_expiration_ms FROM partitions pa \
                     JOIN topics t ON t.topic_id = pa.topic_id \
                     WHERE pa.partition_id = $1 FOR UPDATE OF pa",
                )
                .bind(partition_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| Attempt::Sql(e, false))?
                else {
                    continue;
                };
                let expired: i64 = sqlx::query_scalar(
                    "WITH gone AS (DELETE FROM producer_state s WHERE s.partition_id = $1 \
                     AND s.producer_id IN (SELECT v.producer_id FROM producer_state v \
                     WHERE v.partition_id = $1 AND $2 - v.last_append_ms >= $3 \
                     ORDER BY v.producer_id LIMIT $4) RETURNING 1) \
                     SELECT count(*) FROM gone",
                )
                .bind(partition_id)
                .bind(now)
                .bind(expiration)
                .bind((budget - report.expired) as i64)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| Attempt::Sql(e, false))?;
                report.expired += to_u64(expired, "expired producers")?;
                if report.expired >= budget {
                    break 'walk;
                }
            }
            if (candidates.len() as i64) < RETENTION_CANDIDATES {
                break;
            }
        }
        tx.commit().await.map_err(|e| Attempt::Sql(e, true))?;
        report.more = report.expired == budget;
        Ok(report)
    }

    /// One retention pass (see [`BatchCoordinator::enforce_retention`]): candidate partitions are
    /// found page by page in the global lock order, each is locked and trimmed, and the walk stops
    /// as soon as the budget is spent, so a pass holds its row locks for work bounded by its budget
    /// (plus one page of candidates), whatever the number of partitions.
    async fn try_enforce_retention(
        &self,
        max_batches: u32,
        now: i64,
    ) -> Result<RetentionReport, Attempt> {
        let mut report = RetentionReport::default();
        if max_batches == 0 {
            return Ok(report);
        }
        let mut tx = self
            .write
            .begin()
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
        let mut budget = u64::from(max_batches);
        let mut released = BTreeMap::new();
        // The last candidate visited: (topic id, partition).
        let mut after: Option<(String, i32)> = None;
        'walk: loop {
            // Partitions that may have something to delete: over their size limit, or with a first
            // batch older than retention.ms. In the global lock order, after the last one visited.
            let (cursor, topic, partition) = match &after {
                Some((t, p)) => (
                    "AND (pa.topic_id, pa.partition) > ($2::uuid, $3)",
                    t.as_str(),
                    *p,
                ),
                None => ("AND $2::text IS NULL AND $3::integer IS NULL", "", 0),
            };
            let candidates = sqlx::query(AssertSqlSafe(format!(
                "SELECT pa.partition_id, pa.topic_id::text, pa.partition \
                 FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
                 WHERE pa.byte_size > 0 {cursor} \
                 AND ((t.retention_bytes >= 0 AND EXISTS (SELECT 1 FROM (SELECT b.byte_size \
                 FROM batches b WHERE b.partition_id = pa.partition_id \
                 ORDER BY b.last_offset LIMIT 1) f WHERE pa.byte_size - f.byte_size >= t.retention_bytes)) \
                 OR (t.retention_ms >= 0 AND EXISTS (SELECT 1 FROM (SELECT {ts} AS ts \
                 FROM batches b WHERE b.partition_id = pa.partition_id \
                 ORDER BY b.last_offset LIMIT 1) f WHERE $1::numeric - f.ts > t.retention_ms))) \
                 ORDER BY pa.topic_id, pa.partition LIMIT {RETENTION_CANDIDATES}",
                ts = retention_ts()
            )))
            .bind(now)
            .bind(after.as_ref().map(|_| topic))
            .bind(after.as_ref().map(|_| partition))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| Attempt::Sql(e, false))?;
            for row in &candidates {
                let partition_id: i64 = col(row, 0)?;
                after = Some((col(row, 1)?, col(row, 2)?));
                let count = trim_partition(
                    &mut tx,
                    partition_id,
                    budget,
                    now,
                    &mut released,
                    &mut report,
                )
                .await?;
                self.counters
                    .retention_partitions
                    .fetch_add(1, Ordering::Relaxed);
                budget = budget.saturating_sub(count);
                if budget == 0 {
                    // The budget is spent: no further partition is examined or locked.
                    break 'walk;
                }
            }
            if (candidates.len() as i64) < RETENTION_CANDIDATES {
                break;
            }
        }
        release_objects(&mut tx, &released, now).await?;
        tx.commit().await.map_err(|e| Attempt::Sql(e, true))?;
        report.more = report.batches_deleted == u64::from(max_batches);
        Ok(report)
    }
}

#[async_trait]
impl BatchCoordinator for PostgresCoordinator {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        request.validate()?;
        self.check_open()?;
        let id = request.topic_id.hyphenated().to_string();
        let c = &request.config;
        let result = sqlx::query(
            "WITH t AS (INSERT INTO topics (topic_id, name, partition_count, timestamp_type, \
             retention_ms, retention_bytes, max_message_bytes, message_timestamp_before_max_ms, \
             message_timestamp_after_max_ms, producer_id_expiration_ms) \
             VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING topic_id) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT t.topic_id, g, 0, 0, 0 FROM t, generate_series(0, $3 - 1) AS g",
        )
        .bind(&id)
        .bind(&request.name)
        .bind(request.partitions)
        .bind(ts_type_code(c.timestamp_type))
        .bind(c.retention_ms)
        .bind(c.retention_bytes)
        .bind(c.max_message_bytes)
        .bind(c.message_timestamp_before_max_ms)
        .bind(c.message_timestamp_after_max_ms)
        .bind(c.producer_id_expiration_ms)
        .execute(&self.write)
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("23505") => {
                if d.constraint() == Some("topics_name_key") {
                    Err(CoordinatorError::TopicAlreadyExists(request.name))
                } else {
                    Err(CoordinatorError::TopicAlreadyExists(id))
                }
            }
            // A failure to get a connection happens before anything was sent.
            Err(e @ (sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)) => {
                Err(sql_error(e, false))
            }
            Err(e) => Err(sql_error(e, true)),
        }
    }

    async fn delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        self.check_open()?;
        let now = self.clock.now_ms();
        retrying!(self, self.try_delete_topic(topic_id, now).await)
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        self.check_open()?;
        self.read_list_topics().await
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        self.check_open()?;
        let now = self.clock.now_ms();
        retrying!(self, self.try_commit_file(&request, now).await)
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        self.read_find_batches(requests, fetch_max_bytes).await
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        self.read_list_offsets(requests).await
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.now_ms();
        retrying!(self, self.try_delete_records(requests, now).await)
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        self.check_open()?;
        let now = self.clock.now_ms();
        retrying!(self, self.try_enforce_retention(max_batches, now).await)
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        self.check_open()?;
        let rows = sqlx::query(
            "SELECT object_key, marked_for_deletion_at, object_size FROM objects \
             WHERE marked_for_deletion_at IS NOT NULL AND marked_for_deletion_at < $1 \
             ORDER BY marked_for_deletion_at, object_key LIMIT $2",
        )
        .bind(marked_before_ms)
        .bind(i64::from(limit))
        .fetch_all(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        rows.iter()
            .map(|r| {
                Ok(ObjectToDelete {
                    object_key: col(r, 0)?,
                    marked_for_deletion_at: col(r, 1)?,
                    object_size: to_u64(col(r, 2)?, "object size")?,
                })
            })
            .collect()
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        self.check_open()?;
        if object_keys.is_empty() {
            return Ok(());
        }
        let retention =
            duration_ms(self.options.max_commit_age).saturating_mul(crate::FENCE_RETENTION_FACTOR);
        let expiry_batch = i32::try_from(crate::FENCE_EXPIRY_BATCH).unwrap_or(i32::MAX);
        retrying!(self, {
            match self.write.acquire().await {
                Err(e) => Err(Attempt::Sql(e, false)),
                // One statement, one transaction: forgets the marked objects among the keys and
                // fences their keys (the objects' delete trigger, migration 6), after dropping up
                // to FENCE_EXPIRY_BATCH expired fences.
                Ok(mut conn) => sqlx::query("SELECT confirm_deleted($1, $2, $3)")
                    .bind(object_keys)
                    .bind(retention)
                    .bind(expiry_batch)
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
                    .map_err(|e| Attempt::Sql(e, true)),
            }
        })
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        self.check_open()?;
        let times: Vec<Option<i64>> = object_keys
            .iter()
            .map(|k| crate::object_key_time_ms(k))
            .collect();
        let retention =
            duration_ms(self.options.max_commit_age).saturating_mul(crate::FENCE_RETENTION_FACTOR);
        let expiry_batch = i32::try_from(crate::FENCE_EXPIRY_BATCH).unwrap_or(i32::MAX);
        retrying!(self, {
            match self.write.acquire().await {
                Err(e) => Err(Attempt::Sql(e, false)),
                // One statement, one transaction: the fences are recorded atomically.
                Ok(mut conn) => sqlx::query_scalar::<_, String>(
                    "SELECT r_object_key FROM fence_orphans($1, $2, $3, $4)",
                )
                .bind(object_keys)
                .bind(&times)
                .bind(retention)
                .bind(expiry_batch)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| Attempt::Sql(e, true)),
            }
        })
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        self.check_open()?;
        let now = self.clock.now_ms();
        retrying!(self, self.try_expire_producers(max_producers, now).await)
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        self.check_open()?;
        if object_keys.is_empty() {
            return Ok(Vec::new());
        }
        let known: Vec<String> =
            sqlx::query_scalar("SELECT object_key FROM objects WHERE object_key = ANY($1)")
                .bind(object_keys)
                .fetch_all(self.fresh_pool())
                .await
                .map_err(|e| sql_error(e, false))?;
        let mut known: HashSet<String> = known.into_iter().collect();
        Ok(object_keys
            .iter()
            .filter(|k| known.remove(*k))
            .cloned()
            .collect())
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        self.check_open()?;
        let row = sqlx::query(
            "SELECT uploader_broker_id, object_size, live_bytes, owners, committed_at, \
             marked_for_deletion_at FROM objects WHERE object_key = $1",
        )
        .bind(object_key)
        .fetch_optional(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        let Some(r) = row else {
            return Ok(None);
        };
        let owners: Vec<i64> = col(&r, 3)?;
        Ok(Some(ObjectInfo {
            object_key: object_key.to_string(),
            uploader_broker_id: col(&r, 0)?,
            object_size: to_u64(col(&r, 1)?, "object size")?,
            live_bytes: to_u64(col(&r, 2)?, "live bytes")?,
            owners: owners
                .into_iter()
                .map(|o| {
                    ShardId::try_from(o).map_err(|_| corrupt(format!("bad owner shard id {o}")))
                })
                .collect::<Result<_, _>>()?,
            committed_at: col(&r, 4)?,
            marked_for_deletion_at: col(&r, 5)?,
        }))
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        self.check_open()?;
        let row = sqlx::query(
            "SELECT s.producer_epoch, s.base_sequences, s.last_sequences, s.base_offsets, \
             s.last_offsets, s.log_append_times, s.last_append_ms FROM producer_state s \
             JOIN partitions pa ON pa.partition_id = s.partition_id \
             WHERE pa.topic_id = $1::uuid AND pa.partition = $2 AND s.producer_id = $3",
        )
        .bind(partition.topic_id.hyphenated().to_string())
        .bind(partition.partition)
        .bind(producer_id)
        .fetch_optional(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        let Some(r) = row else {
            return Ok(None);
        };
        let base_sequences: Vec<i32> = col(&r, 1)?;
        let last_sequences: Vec<i32> = col(&r, 2)?;
        let base_offsets: Vec<i64> = col(&r, 3)?;
        let last_offsets: Vec<i64> = col(&r, 4)?;
        let log_append_times: Vec<i64> = col(&r, 5)?;
        let n = base_sequences.len();
        if [
            last_sequences.len(),
            base_offsets.len(),
            last_offsets.len(),
            log_append_times.len(),
        ]
        .iter()
        .any(|l| *l != n)
        {
            return Err(corrupt("torn producer batch window"));
        }
        let batches = (0..n)
            .map(|i| ProducerBatch {
                base_sequence: base_sequences[i],
                last_sequence: last_sequences[i],
                base_offset: base_offsets[i],
                last_offset: last_offsets[i],
                log_append_time: log_append_times[i],
            })
            .collect();
        Ok(Some(ProducerState {
            last_append_ms: col(&r, 6)?,
            producer_id,
            producer_epoch: col(&r, 0)?,
            batches,
        }))
    }
}
