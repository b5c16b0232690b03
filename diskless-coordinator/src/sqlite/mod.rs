//! The SQLite batch coordinator: the embedded default, through sqlx.
//!
//! See [`SqliteCoordinator`].

mod producer;
#[cfg(test)]
mod tests;

use crate::{
    BatchCoordinate, BatchCoordinator, Clock, CommitBatch, CommitBatchResult, CommitFileRequest,
    CoordinatorError, CreateTopicRequest, DEFAULT_MAX_COMMIT_AGE, DeleteRecordsRequest,
    DeleteRecordsResponse, EARLIEST_TIMESTAMP, ErrorCode, FENCE_EXPIRY_BATCH, FindBatchesRequest,
    FindBatchesResponse, LATEST_TIMESTAMP, ListOffsetsRequest, ListOffsetsResponse, MAX_TIMESTAMP,
    NO_TIMESTAMP, ObjectInfo, ObjectToDelete, ProducerBatch, ProducerExpiryReport, ProducerState,
    RetentionReport, ShardId, TimestampType, TopicConfig, TopicIdPartition, TopicInfo,
    check_commit_deadline, fence_expiry_before, object_key_time_ms, producer_field_error,
};
use async_trait::async_trait;
use producer::Decision;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, SqlSafeStr, Sqlite};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};
use uuid::Uuid;

/// When SQLite makes a committed transaction durable (`PRAGMA synchronous`, in WAL mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is synced to disk before it is acknowledged: an acknowledged commit survives a
    /// process kill and a power loss. The default: the coordinator is the source of truth.
    #[default]
    Full,
    /// The WAL is synced at checkpoints only: an acknowledged commit survives a process kill but may
    /// be lost on power loss.
    Normal,
    /// No syncs at all (tests and benchmarks only).
    Off,
}

/// Options of [`SqliteCoordinator::open`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Durability of commits. Default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long a statement waits for a lock held by another connection before failing with
    /// [`CoordinatorError::Unavailable`]. Default 5 s.
    pub busy_timeout: Duration,
    /// Connections of the read pool (find_batches, list_offsets, ...). Default 4.
    pub read_connections: u32,
    /// Create the database file when it does not exist. Default true.
    pub create_if_missing: bool,
    /// Prepared statements cached per connection. Default 256.
    pub statement_cache_capacity: usize,
    /// The commit deadline: a commit of a key whose UUID v7 time is older than `now -
    /// max_commit_age` (coordinator clock, read inside the commit transaction) is refused with
    /// [`CoordinatorError::DeadlineExceeded`]. Default [`DEFAULT_MAX_COMMIT_AGE`] (10 minutes).
    pub max_commit_age: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            read_connections: 4,
            create_if_missing: true,
            statement_cache_capacity: 256,
            max_commit_age: DEFAULT_MAX_COMMIT_AGE,
        }
    }
}

impl SqliteOptions {
    /// Sets [`SqliteOptions::synchronous`].
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// Sets [`SqliteOptions::busy_timeout`].
    pub fn busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }

    /// Sets [`SqliteOptions::read_connections`] (at least 1).
    pub fn read_connections(mut self, n: u32) -> Self {
        self.read_connections = n.max(1);
        self
    }

    /// Sets [`SqliteOptions::statement_cache_capacity`].
    pub fn statement_cache_capacity(mut self, capacity: usize) -> Self {
        self.statement_cache_capacity = capacity;
        self
    }

    /// Sets [`SqliteOptions::create_if_missing`].
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Sets [`SqliteOptions::max_commit_age`].
    pub fn max_commit_age(mut self, max_commit_age: Duration) -> Self {
        self.max_commit_age = max_commit_age;
        self
    }
}

/// A [`BatchCoordinator`] on SQLite: the embedded default, the source of truth of a single-node
/// deployment.
///
/// - **Durable**: WAL journal, `synchronous=FULL` by default; an acknowledged commit survives a
///   process kill. Schema migrations are embedded and applied on open.
/// - **One writer path**: every write (commit, delete, retention, topic changes) runs as one
///   `BEGIN IMMEDIATE` transaction on a single dedicated connection behind an async mutex, so two
///   commits can never interleave their offset assignment.
/// - **Reads do not wait for writes**: find_batches, list_offsets and the other queries run on a
///   separate pool of read-only connections, each call in one read transaction (a consistent
///   snapshot); WAL lets them proceed while a write is in progress.
/// - **Fast commits**: a commit of a file is a fixed handful of statements whatever its batch count:
///   one lookup of all touched partitions, one of all touched producer states, the object insert,
///   multi-row inserts of the batches, one multi-row upsert of producer states and one multi-row
///   update of the partitions. All statements are prepared once and cached.
/// - **The commit point**: the commit deadline ([`SqliteOptions::max_commit_age`]) and the orphan
///   fences ([`BatchCoordinator::fence_orphans`]) are checked inside the commit's write transaction,
///   with the clock read after the writer mutex and SQLite's write lock are held, however long the
///   wait for them was. `fence_orphans` is a write transaction too, so it and a commit of the same key
///   are serialized by the single writer: never do both succeed. `confirm_deleted` fences every key
///   it forgets (with a v7 time) in its own transaction, so a deleted object's key is never
///   committed again.
/// - **ListOffsets by timestamp** costs one index probe whatever the partition's size: each batch
///   row keeps the running max of the partition's effective max timestamps, indexed with the
///   partition and offset; MAX_TIMESTAMP is one probe of a (partition, timestamp) index. Only a
///   target at or below the timestamp of an already deleted batch, larger than those of the first
///   live batches, needs a forward scan from the log start to the answer.
/// - **Lifecycle passes hold the writer for bounded work**: `enforce_retention` finds the partitions
///   whose first batch is due in SQL (one or two primary-key probes per partition with live bytes,
///   no batch row read for a partition with nothing to delete), reads a due partition's oldest
///   batches in small growing pages up to the first batch that stays, and stops as soon as its
///   budget is spent: batch rows read are a small multiple of the budget
///   ([`SqliteCoordinator::stats`] counts them); `expire_producers` reads producer
///   states in order until it has its cap; `fence_orphans` drops at most
///   [`crate::FENCE_EXPIRY_BATCH`] expired fences per call.
///
/// The semantics are those of the conformance suite in `diskless-testkit` (Kafka's, at batch
/// granularity); see `diskless_testkit::coordinator` for the decisions where Kafka leaves a choice.
///
/// # Errors
/// A failure before a write transaction could start, or while it ran, is
/// [`CoordinatorError::Unavailable`] (nothing was applied; SQLITE_BUSY after the busy timeout
/// included); a failure of the `COMMIT` itself is [`CoordinatorError::OutcomeUnknown`] (unless SQLite
/// reports the commit did not happen); undecodable rows or constraint violations are
/// [`CoordinatorError::Storage`].
///
/// # Example
/// ```
/// use diskless_coordinator::sqlite::SqliteCoordinator;
/// use diskless_coordinator::*;
/// use std::sync::Arc;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let clock = ManualClock::new(1_000);
/// let coordinator = SqliteCoordinator::in_memory(clock.clone()).await?;
/// let topic_id = uuid::Uuid::from_u128(42);
/// coordinator
///     .create_topic(CreateTopicRequest {
///         topic_id,
///         name: "orders".into(),
///         partitions: 1,
///         config: TopicConfig::default(),
///     })
///     .await?;
///
/// // A broker uploaded a WAL segment holding one batch of 3 records at bytes 1..101.
/// let partition = TopicIdPartition::new(topic_id, 0);
/// let results = coordinator
///     .commit_file(CommitFileRequest {
///         object_key: "wal/0001".into(),
///         uploader_broker_id: 1,
///         object_size: 101,
///         owners: vec![0],
///         batches: vec![CommitBatch {
///             partition,
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
/// assert_eq!(results[0].error, ErrorCode::None);
/// assert_eq!(results[0].base_offset, 0);
///
/// // A consumer fetches from offset 1: the batch holding it comes back.
/// let found = coordinator
///     .find_batches(
///         &[FindBatchesRequest { partition, offset: 1, max_bytes: 1 << 20 }],
///         1 << 20,
///     )
///     .await?;
/// assert_eq!(found[0].high_watermark, 3);
/// assert_eq!(found[0].batches[0].object_key, "wal/0001");
/// assert_eq!((found[0].batches[0].base_offset, found[0].batches[0].last_offset), (0, 2));
/// # Ok::<(), CoordinatorError>(())
/// # }).unwrap();
/// ```
pub struct SqliteCoordinator {
    clock: Arc<dyn Clock>,
    max_commit_age: Duration,
    /// The single write connection; `None` once closed.
    writer: Mutex<Option<SqliteConnection>>,
    /// Read-only connections; `None` for an in-memory database (reads share the writer).
    readers: Option<SqlitePool>,
    closed: AtomicBool,
    counters: Counters,
}

/// Event counters behind [`SqliteCoordinator::stats`].
#[derive(Debug, Default)]
struct Counters {
    retention_partitions: AtomicU64,
    retention_batches_read: AtomicU64,
}

/// What a [`SqliteCoordinator`] did since it was opened (for monitoring: the work its lifecycle
/// passes did while holding the write lock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteStats {
    /// Partitions whose batches retention passes read: only partitions with at least one batch to
    /// delete are read, and a pass stops as soon as its budget is spent, so a pass examines at most
    /// its budget of partitions.
    pub retention_partitions_examined: u64,
    /// Batch rows retention passes read (in pages that start small and stop at the first batch
    /// that stays): a small multiple of the batches deleted, never partitions × budget.
    pub retention_batches_read: u64,
}

impl std::fmt::Debug for SqliteCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCoordinator")
            .field("clock", &self.clock)
            .field("max_commit_age", &self.max_commit_age)
            .field("read_pool", &self.readers.is_some())
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

const MIGRATION_0001: &str = include_str!("../../migrations/sqlite/0001_initial.sql");
const MIGRATION_0002: &str = include_str!("../../migrations/sqlite/0002_batches_object_index.sql");
const MIGRATION_0003: &str = include_str!("../../migrations/sqlite/0003_timestamp_index.sql");
const MIGRATION_0004: &str =
    include_str!("../../migrations/sqlite/0004_fences_producer_expiry.sql");

/// The embedded schema migrations, applied on open (sqlx's migrator, table `_sqlx_migrations`).
pub fn migrator() -> Migrator {
    Migrator::with_migrations(vec![
        Migration::new(
            1,
            "initial".into(),
            MigrationType::Simple,
            MIGRATION_0001.into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            "batches object index".into(),
            MigrationType::Simple,
            MIGRATION_0002.into_sql_str(),
            false,
        ),
        Migration::new(
            3,
            "timestamp index".into(),
            MigrationType::Simple,
            MIGRATION_0003.into_sql_str(),
            false,
        ),
        Migration::new(
            4,
            "fences and producer expiry".into(),
            MigrationType::Simple,
            MIGRATION_0004.into_sql_str(),
            false,
        ),
    ])
}

impl SqliteCoordinator {
    /// Opens (creating it if allowed) the database file at `path`, applies pending migrations and
    /// sets WAL mode and the configured durability.
    pub async fn open(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        Self::open_with(
            SqliteConnectOptions::new().filename(path.as_ref()),
            options,
            clock,
        )
        .await
    }

    /// Like [`SqliteCoordinator::open`], with the database named by a URL such as
    /// `sqlite:///var/lib/diskless/coordinator.db` or `sqlite://data/coordinator.db`. In-memory URLs
    /// are refused (use [`SqliteCoordinator::in_memory`]): each connection would see its own
    /// database.
    pub async fn open_url(
        url: &str,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        if !url.starts_with("sqlite:") {
            return Err(CoordinatorError::InvalidRequest(format!(
                "{url}: not a sqlite: URL"
            )));
        }
        let parsed: SqliteConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| CoordinatorError::InvalidRequest(format!("{url}: {e}")))?;
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(CoordinatorError::InvalidRequest(format!(
                "{url}: in-memory URLs are not supported, use SqliteCoordinator::in_memory"
            )));
        }
        Self::open_with(parsed, options, clock).await
    }

    async fn open_with(
        base: SqliteConnectOptions,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        let base = base
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true)
            .statement_cache_capacity(options.statement_cache_capacity);
        let synchronous = match options.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Off => SqliteSynchronous::Off,
        };
        let mut writer = base
            .clone()
            .create_if_missing(options.create_if_missing)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .connect()
            .await
            .map_err(unavailable)?;
        migrator()
            .run(&mut writer)
            .await
            .map_err(|e| CoordinatorError::Storage(Box::new(e)))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .min_connections(0)
            .acquire_timeout(options.busy_timeout.max(Duration::from_secs(1)))
            .connect_lazy_with(base.read_only(true));
        Ok(SqliteCoordinator {
            clock,
            max_commit_age: options.max_commit_age,
            writer: Mutex::new(Some(writer)),
            readers: Some(readers),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    /// A private in-memory database (for tests): nothing survives the coordinator, and reads share
    /// the write connection.
    pub async fn in_memory(clock: Arc<dyn Clock>) -> Result<Self, CoordinatorError> {
        Self::in_memory_with(SqliteOptions::default(), clock).await
    }

    /// Like [`SqliteCoordinator::in_memory`], with options (of which `statement_cache_capacity` and
    /// `max_commit_age` apply; the others concern database files).
    pub async fn in_memory_with(
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        let mut writer = SqliteConnectOptions::new()
            .in_memory(true)
            .foreign_keys(true)
            .statement_cache_capacity(options.statement_cache_capacity)
            .connect()
            .await
            .map_err(unavailable)?;
        migrator()
            .run(&mut writer)
            .await
            .map_err(|e| CoordinatorError::Storage(Box::new(e)))?;
        Ok(SqliteCoordinator {
            clock,
            max_commit_age: options.max_commit_age,
            writer: Mutex::new(Some(writer)),
            readers: None,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    /// What this coordinator did since it was opened.
    pub fn stats(&self) -> SqliteStats {
        let c = &self.counters;
        SqliteStats {
            retention_partitions_examined: c.retention_partitions.load(Ordering::Relaxed),
            retention_batches_read: c.retention_batches_read.load(Ordering::Relaxed),
        }
    }

    /// Closes the connections, waiting for a write in progress. Later calls fail with
    /// [`CoordinatorError::Closed`].
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(conn) = self.writer.lock().await.take()
            && let Err(e) = conn.close().await
        {
            tracing::warn!(error = %e, "closing the SQLite write connection failed");
        }
        if let Some(pool) = &self.readers {
            pool.close().await;
        }
    }

    async fn write(&self) -> Result<MutexGuard<'_, Option<SqliteConnection>>, CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(CoordinatorError::Closed);
        }
        Ok(self.writer.lock().await)
    }

    async fn read(&self) -> Result<Reader<'_>, CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(CoordinatorError::Closed);
        }
        match &self.readers {
            Some(pool) => pool.acquire().await.map(Reader::Pool).map_err(unavailable),
            None => Ok(Reader::Writer(self.writer.lock().await)),
        }
    }
}

/// A connection to read on: from the pool, or the writer for in-memory databases.
enum Reader<'a> {
    Pool(PoolConnection<Sqlite>),
    Writer(MutexGuard<'a, Option<SqliteConnection>>),
}

impl Reader<'_> {
    fn conn(&mut self) -> Result<&mut SqliteConnection, CoordinatorError> {
        match self {
            Reader::Pool(c) => Ok(&mut **c),
            Reader::Writer(g) => g.as_mut().ok_or(CoordinatorError::Closed),
        }
    }
}

// -------------------------------------------------------------------------------------------------
// Errors

/// SQLite primary result codes that mean "try again later": BUSY, LOCKED, IOERR, FULL, CANTOPEN.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14)),
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        _ => false,
    }
}

fn unavailable(e: sqlx::Error) -> CoordinatorError {
    CoordinatorError::Unavailable(Box::new(e))
}

/// An error before COMMIT: nothing was applied.
fn not_applied(e: sqlx::Error) -> CoordinatorError {
    if is_transient(&e) {
        CoordinatorError::Unavailable(Box::new(e))
    } else {
        CoordinatorError::Storage(Box::new(e))
    }
}

/// An error of COMMIT: unknown whether it was applied, unless SQLite says it was not.
fn at_commit(e: sqlx::Error) -> CoordinatorError {
    if is_busy(&e) {
        CoordinatorError::Unavailable(Box::new(e))
    } else {
        CoordinatorError::OutcomeUnknown(Box::new(e))
    }
}

fn corrupt(what: impl Into<String>) -> CoordinatorError {
    CoordinatorError::Storage(what.into().into())
}

fn col<'r, T>(row: &'r SqliteRow, i: usize) -> Result<T, CoordinatorError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
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

fn ts_type_code(t: TimestampType) -> i64 {
    match t {
        TimestampType::CreateTime => 0,
        TimestampType::LogAppendTime => 1,
    }
}

fn ts_type(code: i64) -> Result<TimestampType, CoordinatorError> {
    match code {
        0 => Ok(TimestampType::CreateTime),
        1 => Ok(TimestampType::LogAppendTime),
        other => Err(corrupt(format!("unknown timestamp type {other}"))),
    }
}

fn encode_owners(owners: &[ShardId]) -> String {
    owners
        .iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn decode_owners(s: &str) -> Result<Vec<ShardId>, CoordinatorError> {
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

fn topic_key(id: Uuid) -> String {
    id.hyphenated().to_string()
}

fn parse_topic_id(s: &str) -> Result<Uuid, CoordinatorError> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("bad topic id {s:?}")))
}

// -------------------------------------------------------------------------------------------------
// Validation (the same rules as the reference model; the conformance suite pins them)

// -------------------------------------------------------------------------------------------------
// SQL

/// `(?,?,?),(?,?,?)` for `rows` rows of `cols` columns.
fn placeholders(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(","));
    vec![row; rows].join(",")
}

/// Rows per multi-row statement (a 100-batch commit inserts in two statements).
const CHUNK: usize = 64;

/// ListOffsets by timestamp, step 1: one probe of the index `batches_timestamp_so_far`. The
/// running max timestamp is monotonic in offset order, so the first batch in (running max, offset)
/// order whose running max reaches the target (`?2`) is the first such batch in offset order. Every
/// live batch before it has a running max, hence an effective max timestamp, below the target: when
/// its own effective max timestamp reaches the target it is the answer.
const TIMESTAMP_CANDIDATE: &str = "SELECT base_offset, last_offset, effective_max_timestamp \
     FROM batches WHERE partition_id = ?1 AND max_timestamp_so_far >= ?2 \
     ORDER BY max_timestamp_so_far, last_offset LIMIT 1";

/// ListOffsets by timestamp, step 2, only when the candidate's own timestamp is below the target.
/// That happens only to the first live batch, when a batch deleted before it (retention,
/// DeleteRecords) raised the running max (the running max includes deleted batches; every later
/// batch has a running max at least as large), so the target is at or below the largest timestamp
/// of a deleted batch. The answer is then the first live batch after the candidate (`?2`, its last
/// offset) reaching the target (`?3`): a forward scan from the log start in offset order, which
/// ends at the answer (with near-monotonic timestamps, a few batches; in the worst case, a deleted
/// far-future timestamp, the whole partition).
const TIMESTAMP_SCAN: &str = "SELECT base_offset, effective_max_timestamp FROM batches \
     WHERE partition_id = ?1 AND last_offset > ?2 AND effective_max_timestamp >= ?3 \
     ORDER BY last_offset LIMIT 1";

/// MAX_TIMESTAMP: the earliest live batch holding the largest effective max timestamp, one probe of
/// the index `batches_max_timestamp` (timestamp descending, offset ascending). The running max is not
/// used: it may come from a deleted batch.
const MAX_TIMESTAMP_LOOKUP: &str = "SELECT base_offset, effective_max_timestamp FROM batches \
     WHERE partition_id = ?1 ORDER BY effective_max_timestamp DESC, last_offset LIMIT 1";

/// Retention: the next page of up to `?3` of a partition's oldest batches, after last offset `?2`,
/// with the time retention ages each by (its effective max timestamp, or its object's commit time
/// when it has no timestamp). An index range of the primary key and one primary-key probe of
/// `objects` per row.
const RETENTION_BATCHES: &str = "SELECT b.last_offset, b.byte_size, \
     CASE WHEN b.effective_max_timestamp >= 0 THEN b.effective_max_timestamp \
     ELSE o.committed_at END \
     FROM batches b JOIN objects o ON o.object_id = b.object_id \
     WHERE b.partition_id = ?1 AND b.last_offset > ?2 ORDER BY b.last_offset LIMIT ?3";

/// Retention: the next page of up to `?4` partitions, after (`?1`, `?2`) in (topic id, partition)
/// order, whose FIRST batch retention deletes at time `?3`: older than retention.ms (aged as in
/// [`RETENTION_BATCHES`]), or removable by retention.bytes (what is left without it is still at
/// least retention.bytes). That is exactly "retention deletes something here" (Kafka 3.x order:
/// the time-breached prefix, then size on what is left), so every partition returned gives the
/// pass at least one batch and a pass reads at most its budget of partitions' batches. A range of
/// the unique index on (topic_id, partition), and per partition with live bytes one or two
/// primary-key probes of its first batch (no batch row leaves SQLite for a partition with nothing
/// to delete).
const RETENTION_CANDIDATES: &str = "SELECT p.partition_id, p.topic_id, p.partition, \
     p.byte_size, t.retention_ms, t.retention_bytes \
     FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
     WHERE (p.topic_id, p.partition) > (?1, ?2) AND p.byte_size > 0 \
     AND ((t.retention_ms >= 0 AND ?3 - (SELECT CASE WHEN b.effective_max_timestamp >= 0 \
           THEN b.effective_max_timestamp ELSE (SELECT o.committed_at FROM objects o \
           WHERE o.object_id = b.object_id) END \
           FROM batches b WHERE b.partition_id = p.partition_id \
           ORDER BY b.last_offset LIMIT 1) > t.retention_ms) \
       OR (t.retention_bytes >= 0 AND p.byte_size - (SELECT b.byte_size FROM batches b \
           WHERE b.partition_id = p.partition_id ORDER BY b.last_offset LIMIT 1) \
           >= t.retention_bytes)) \
     ORDER BY p.topic_id, p.partition LIMIT ?4";

/// Candidate partitions read per page by a retention pass.
const RETENTION_CANDIDATE_PAGE: i64 = 64;

/// Batches read by a retention pass's first page of a partition; each further page of the same
/// partition doubles, up to [`RETENTION_MAX_PAGE`] (and never more than the budget left). A
/// partition that loses `d` batches costs at most about `2 d + 8` batch rows.
const RETENTION_FIRST_PAGE: u64 = 8;

/// The largest page of batches a retention pass reads at once.
const RETENTION_MAX_PAGE: u64 = 1024;

/// Producer expiry: up to `?2` expired (partition, producer id) states at time `?1`, in (topic id,
/// partition, producer id) order: partitions in the order of their unique index, each one's states
/// in primary-key order, stopping at the limit.
const EXPIRED_PRODUCERS: &str = "SELECT s.partition_id, s.producer_id \
     FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
     JOIN producer_state s ON s.partition_id = p.partition_id \
     WHERE ?1 - s.last_append_ms >= t.producer_id_expiration_ms \
     ORDER BY p.topic_id, p.partition, s.producer_id LIMIT ?2";

const SELECT_PARTITION: &str = "SELECT p.partition_id, p.log_start_offset, p.high_watermark, \
     p.byte_size, t.timestamp_type FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
     WHERE p.topic_id = ?1 AND p.partition = ?2";

const BATCH_COLUMNS: &str = "b.base_offset, b.last_offset, b.byte_offset, b.byte_size, \
     b.base_timestamp, b.max_timestamp, b.timestamp_type, b.log_append_time, b.producer_id, \
     b.producer_epoch, b.base_sequence, b.last_sequence, o.object_key, o.object_size";

/// Takes the bytes of the batches of `partition_id` below `below` off their objects' live bytes,
/// marking objects left with none; then deletes those batches. Returns (count, bytes).
async fn delete_batches_below(
    conn: &mut SqliteConnection,
    partition_id: i64,
    below: i64,
    now: i64,
) -> Result<(i64, i64), CoordinatorError> {
    let row = sqlx::query(
        "SELECT COUNT(*), COALESCE(SUM(byte_size), 0) FROM batches \
         WHERE partition_id = ?1 AND last_offset < ?2",
    )
    .bind(partition_id)
    .bind(below)
    .fetch_one(&mut *conn)
    .await
    .map_err(not_applied)?;
    let (count, bytes): (i64, i64) = (col(&row, 0)?, col(&row, 1)?);
    if count == 0 {
        return Ok((0, 0));
    }
    sqlx::query(
        "UPDATE objects SET live_bytes = MAX(live_bytes - v.bytes, 0), \
         marked_for_deletion_at = CASE WHEN marked_for_deletion_at IS NULL \
         AND live_bytes - v.bytes <= 0 THEN ?3 ELSE marked_for_deletion_at END \
         FROM (SELECT object_id, SUM(byte_size) AS bytes FROM batches \
               WHERE partition_id = ?1 AND last_offset < ?2 GROUP BY object_id) AS v \
         WHERE objects.object_id = v.object_id",
    )
    .bind(partition_id)
    .bind(below)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(not_applied)?;
    sqlx::query("DELETE FROM batches WHERE partition_id = ?1 AND last_offset < ?2")
        .bind(partition_id)
        .bind(below)
        .execute(&mut *conn)
        .await
        .map_err(not_applied)?;
    Ok((count, bytes))
}

/// A partition as a commit sees it.
struct CommitPartition {
    partition_id: i64,
    log_start_offset: i64,
    high_watermark: i64,
    byte_size: i64,
    /// The running max of the effective max timestamps of all batches appended so far.
    max_timestamp_so_far: i64,
    timestamp_type: TimestampType,
    touched: bool,
}

/// A batch a commit appends.
struct AppendedBatch<'a> {
    partition_id: i64,
    base_offset: i64,
    last_offset: i64,
    log_append_time: i64,
    timestamp_type: TimestampType,
    effective_max_timestamp: i64,
    max_timestamp_so_far: i64,
    batch: &'a CommitBatch,
}

/// A producer's state as a commit sees it.
struct CommitProducer {
    state: Option<ProducerState>,
    touched: bool,
}

fn batch_from_row(row: &SqliteRow) -> Result<BatchCoordinate, CoordinatorError> {
    Ok(BatchCoordinate {
        base_offset: col(row, 0)?,
        last_offset: col(row, 1)?,
        byte_offset: to_u64(col(row, 2)?, "byte offset")?,
        byte_size: to_u32(col(row, 3)?, "byte size")?,
        base_timestamp: col(row, 4)?,
        max_timestamp: col(row, 5)?,
        timestamp_type: ts_type(col(row, 6)?)?,
        log_append_time: col(row, 7)?,
        producer_id: col(row, 8)?,
        producer_epoch: col(row, 9)?,
        base_sequence: col(row, 10)?,
        last_sequence: col(row, 11)?,
        object_key: col(row, 12)?,
        object_size: to_u64(col(row, 13)?, "object size")?,
    })
}

/// (partition_id, log start offset, high watermark) of a partition, if it exists.
async fn partition_bounds(
    conn: &mut SqliteConnection,
    p: TopicIdPartition,
) -> Result<Option<(i64, i64, i64)>, sqlx::Error> {
    let row = sqlx::query(SELECT_PARTITION)
        .bind(topic_key(p.topic_id))
        .bind(p.partition)
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        None => Ok(None),
        Some(r) => Ok(Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))),
    }
}

/// Records fences (key, key time), keeping any existing fence of a key (idempotent).
async fn insert_fences(
    conn: &mut SqliteConnection,
    fences: &[(String, i64)],
) -> Result<(), CoordinatorError> {
    for chunk in fences.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO fences (object_key, key_time) VALUES {} \
             ON CONFLICT (object_key) DO NOTHING",
            placeholders(chunk.len(), 2)
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (key, t) in chunk {
            q = q.bind(key.as_str()).bind(*t);
        }
        q.execute(&mut *conn).await.map_err(not_applied)?;
    }
    Ok(())
}

/// What retention keeps of a partition (its topic's settings), at the pass's `now`.
#[derive(Clone, Copy, Debug)]
struct RetentionRule {
    /// The partition's live bytes.
    size: i64,
    retention_ms: i64,
    retention_bytes: i64,
    now: i64,
}

impl SqliteCoordinator {
    /// Retention of one partition: the offset below which its batches go (Kafka 3.x order: the
    /// prefix older than retention.ms, then by retention.bytes on what is left), at most `budget`
    /// batches; `None` when nothing goes. Reads the partition's oldest batches in pages of
    /// [`RETENTION_FIRST_PAGE`], doubling up to [`RETENTION_MAX_PAGE`] and never beyond the budget
    /// left, stopping at the first batch that stays.
    async fn retention_end(
        &self,
        conn: &mut SqliteConnection,
        partition_id: i64,
        rule: RetentionRule,
        budget: u64,
    ) -> Result<Option<i64>, CoordinatorError> {
        self.counters
            .retention_partitions
            .fetch_add(1, Ordering::Relaxed);
        let mut deletable: u64 = 0;
        let mut delete_below = None;
        let mut remaining = rule.size;
        let mut time_phase = rule.retention_ms >= 0;
        let mut after = i64::MIN;
        let mut page = RETENTION_FIRST_PAGE;
        while deletable < budget {
            let want = (budget - deletable).min(page);
            let rows = sqlx::query(RETENTION_BATCHES)
                .bind(partition_id)
                .bind(after)
                .bind(i64::try_from(want).unwrap_or(i64::MAX))
                .fetch_all(&mut *conn)
                .await
                .map_err(not_applied)?;
            self.counters
                .retention_batches_read
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
            for row in &rows {
                let last_offset: i64 = col(row, 0)?;
                let bytes: i64 = col(row, 1)?;
                let ts: i64 = col(row, 2)?;
                if !(time_phase && rule.now.saturating_sub(ts) > rule.retention_ms) {
                    time_phase = false;
                    if !(rule.retention_bytes >= 0 && remaining - bytes >= rule.retention_bytes) {
                        return Ok(delete_below);
                    }
                }
                remaining -= bytes;
                deletable += 1;
                after = last_offset;
                delete_below = Some(
                    last_offset
                        .checked_add(1)
                        .ok_or_else(|| corrupt("a batch's last offset is i64::MAX"))?,
                );
            }
            if (rows.len() as u64) < want {
                break;
            }
            page = page.saturating_mul(2).min(RETENTION_MAX_PAGE);
        }
        Ok(delete_below)
    }
}

#[async_trait]
impl BatchCoordinator for SqliteCoordinator {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        request.validate()?;
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let id = topic_key(request.topic_id);
        let exists = sqlx::query("SELECT 1 FROM topics WHERE topic_id = ?1")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        if exists.is_some() {
            return Err(CoordinatorError::TopicAlreadyExists(id));
        }
        let exists = sqlx::query("SELECT 1 FROM topics WHERE name = ?1")
            .bind(&request.name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        if exists.is_some() {
            return Err(CoordinatorError::TopicAlreadyExists(request.name));
        }
        let c = &request.config;
        sqlx::query(
            "INSERT INTO topics (topic_id, name, partition_count, timestamp_type, retention_ms, \
             retention_bytes, max_message_bytes, message_timestamp_before_max_ms, \
             message_timestamp_after_max_ms, producer_id_expiration_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        sqlx::query(
            "WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < ?2) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT ?1, n, 0, 0, 0 FROM seq",
        )
        .bind(&id)
        .bind(request.partitions)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)
    }

    async fn delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let now = self.clock.now_ms();
        let id = topic_key(topic_id);
        let exists = sqlx::query("SELECT 1 FROM topics WHERE topic_id = ?1")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        if exists.is_none() {
            return Err(CoordinatorError::UnknownTopic(id));
        }
        let statements = [
            "UPDATE objects SET live_bytes = MAX(live_bytes - v.bytes, 0), \
             marked_for_deletion_at = CASE WHEN marked_for_deletion_at IS NULL \
             AND live_bytes - v.bytes <= 0 THEN ?2 ELSE marked_for_deletion_at END \
             FROM (SELECT object_id, SUM(byte_size) AS bytes FROM batches WHERE partition_id IN \
                   (SELECT partition_id FROM partitions WHERE topic_id = ?1) GROUP BY object_id) AS v \
             WHERE objects.object_id = v.object_id",
            "DELETE FROM batches WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM producer_state WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM partitions WHERE topic_id = ?1",
            "DELETE FROM topics WHERE topic_id = ?1",
        ];
        for (i, sql) in statements.into_iter().enumerate() {
            let q = sqlx::query(sql).bind(&id);
            let q = if i == 0 { q.bind(now) } else { q };
            q.execute(&mut *tx).await.map_err(not_applied)?;
        }
        tx.commit().await.map_err(at_commit)
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        let mut reader = self.read().await?;
        let rows = sqlx::query(
            "SELECT topic_id, name, partition_count, timestamp_type, retention_ms, \
             retention_bytes, max_message_bytes, message_timestamp_before_max_ms, \
             message_timestamp_after_max_ms, producer_id_expiration_ms FROM topics ORDER BY name",
        )
        .fetch_all(reader.conn()?)
        .await
        .map_err(not_applied)?;
        rows.iter()
            .map(|r| {
                Ok(TopicInfo {
                    topic_id: parse_topic_id(&col::<String>(r, 0)?)?,
                    name: col(r, 1)?,
                    partitions: col(r, 2)?,
                    config: TopicConfig {
                        timestamp_type: ts_type(col(r, 3)?)?,
                        retention_ms: col(r, 4)?,
                        retention_bytes: col(r, 5)?,
                        max_message_bytes: col(r, 6)?,
                        message_timestamp_before_max_ms: col(r, 7)?,
                        message_timestamp_after_max_ms: col(r, 8)?,
                        producer_id_expiration_ms: col(r, 9)?,
                    },
                })
            })
            .collect()
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        // The commit point. The writer mutex and SQLite's write lock are held from here to COMMIT,
        // so the clock is read here, after any wait for them: a commit that waited past its
        // deadline is refused, and a fence recorded before this point is seen. Returning an error
        // drops the transaction, which rolls it back: nothing is applied.
        let now = self.clock.now_ms();
        check_commit_deadline(&request.object_key, now, self.max_commit_age)?;
        let fenced = sqlx::query("SELECT 1 FROM fences WHERE object_key = ?1")
            .bind(&request.object_key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        if fenced.is_some() {
            return Err(CoordinatorError::ObjectFenced(request.object_key));
        }

        // 1. Every touched partition, in one statement per CHUNK partitions.
        let mut wanted: Vec<TopicIdPartition> = Vec::new();
        let mut seen = HashSet::new();
        for b in &request.batches {
            if b.partition.partition >= 0 && seen.insert(b.partition) {
                wanted.push(b.partition);
            }
        }
        let mut partitions: HashMap<TopicIdPartition, CommitPartition> = HashMap::new();
        for chunk in wanted.chunks(CHUNK) {
            let sql = format!(
                "SELECT p.topic_id, p.partition, p.partition_id, p.log_start_offset, \
                 p.high_watermark, p.byte_size, t.timestamp_type, p.max_timestamp_so_far \
                 FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
                 WHERE (p.topic_id, p.partition) IN (VALUES {})",
                placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for p in chunk {
                q = q.bind(topic_key(p.topic_id)).bind(p.partition);
            }
            for row in q.fetch_all(&mut *tx).await.map_err(not_applied)? {
                let p =
                    TopicIdPartition::new(parse_topic_id(&col::<String>(&row, 0)?)?, col(&row, 1)?);
                partitions.insert(
                    p,
                    CommitPartition {
                        partition_id: col(&row, 2)?,
                        log_start_offset: col(&row, 3)?,
                        high_watermark: col(&row, 4)?,
                        byte_size: col(&row, 5)?,
                        timestamp_type: ts_type(col(&row, 6)?)?,
                        max_timestamp_so_far: col(&row, 7)?,
                        touched: false,
                    },
                );
            }
        }

        // 2. Every touched producer state, likewise.
        let mut wanted: Vec<(i64, i64)> = Vec::new();
        let mut seen = HashSet::new();
        for b in &request.batches {
            if !b.is_idempotent() {
                continue;
            }
            if let Some(p) = partitions.get(&b.partition)
                && seen.insert((p.partition_id, b.producer_id))
            {
                wanted.push((p.partition_id, b.producer_id));
            }
        }
        let mut producers: HashMap<(i64, i64), CommitProducer> = wanted
            .iter()
            .map(|k| {
                (
                    *k,
                    CommitProducer {
                        state: None,
                        touched: false,
                    },
                )
            })
            .collect();
        for chunk in wanted.chunks(CHUNK) {
            let sql = format!(
                "SELECT partition_id, producer_id, producer_epoch, batch_window, last_append_ms \
                 FROM producer_state WHERE (partition_id, producer_id) IN (VALUES {})",
                placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (partition_id, producer_id) in chunk {
                q = q.bind(*partition_id).bind(*producer_id);
            }
            for row in q.fetch_all(&mut *tx).await.map_err(not_applied)? {
                let key: (i64, i64) = (col(&row, 0)?, col(&row, 1)?);
                let window: Vec<u8> = col(&row, 3)?;
                let batches = producer::decode_window(&window)
                    .ok_or_else(|| corrupt("torn producer batch window"))?;
                if let Some(entry) = producers.get_mut(&key) {
                    entry.state = Some(ProducerState {
                        producer_id: key.1,
                        producer_epoch: col(&row, 2)?,
                        batches,
                        last_append_ms: col(&row, 4)?,
                    });
                }
            }
        }

        // 3. Decide every batch in memory, in request order.
        let mut results = Vec::with_capacity(request.batches.len());
        let mut appended: Vec<AppendedBatch<'_>> = Vec::new();
        let mut live_bytes: i64 = 0;
        for batch in &request.batches {
            let Some(part) = partitions.get_mut(&batch.partition) else {
                results.push(CommitBatchResult::error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            // What the producer controls is judged per batch: a bad batch is rejected alone.
            if let Some(code) = producer_field_error(batch) {
                results.push(CommitBatchResult::error(code));
                continue;
            }
            let producer = if batch.is_idempotent() {
                producers.get_mut(&(part.partition_id, batch.producer_id))
            } else {
                None
            };
            if let Some(producer) = &producer {
                match producer::decide(producer.state.as_ref(), batch) {
                    Decision::Append => {}
                    Decision::Duplicate(kept) => {
                        results.push(CommitBatchResult {
                            error: ErrorCode::None,
                            base_offset: kept.base_offset,
                            log_append_time: kept.log_append_time,
                            log_start_offset: part.log_start_offset,
                            duplicate: true,
                        });
                        continue;
                    }
                    Decision::Reject(code) => {
                        results.push(CommitBatchResult::error(code));
                        continue;
                    }
                }
            }
            let base_offset = part.high_watermark;
            let last_offset = base_offset + i64::from(batch.record_count) - 1;
            let (log_append_time, effective_max_timestamp) = match part.timestamp_type {
                TimestampType::LogAppendTime => (now, now),
                TimestampType::CreateTime => (NO_TIMESTAMP, batch.max_timestamp),
            };
            part.high_watermark = last_offset + 1;
            part.byte_size += i64::from(batch.byte_size);
            part.max_timestamp_so_far = part.max_timestamp_so_far.max(effective_max_timestamp);
            part.touched = true;
            live_bytes += i64::from(batch.byte_size);
            if let Some(producer) = producer {
                producer::record(
                    &mut producer.state,
                    batch,
                    ProducerBatch {
                        base_sequence: batch.base_sequence,
                        last_sequence: batch.last_sequence,
                        base_offset,
                        last_offset,
                        log_append_time,
                    },
                    now,
                );
                producer.touched = true;
            }
            appended.push(AppendedBatch {
                partition_id: part.partition_id,
                base_offset,
                last_offset,
                log_append_time,
                timestamp_type: part.timestamp_type,
                effective_max_timestamp,
                max_timestamp_so_far: part.max_timestamp_so_far,
                batch,
            });
            results.push(CommitBatchResult {
                error: ErrorCode::None,
                base_offset,
                log_append_time,
                log_start_offset: part.log_start_offset,
                duplicate: false,
            });
        }

        // 4. Register the object (a key is committed once).
        let object_id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
             committed_at, marked_for_deletion_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (object_key) DO NOTHING RETURNING object_id",
        )
        .bind(&request.object_key)
        .bind(request.uploader_broker_id)
        .bind(request.object_size as i64)
        .bind(live_bytes)
        .bind(encode_owners(&request.owners))
        .bind(now)
        .bind((live_bytes == 0).then_some(now))
        .fetch_optional(&mut *tx)
        .await
        .map_err(not_applied)?;
        let Some(object_id) = object_id else {
            return Err(CoordinatorError::ObjectAlreadyCommitted(request.object_key));
        };

        // 5. The appended batches, CHUNK rows per statement.
        for chunk in appended.chunks(CHUNK) {
            let sql = format!(
                "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, \
                 byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, \
                 log_append_time, producer_id, producer_epoch, base_sequence, last_sequence, \
                 effective_max_timestamp, max_timestamp_so_far) VALUES {}",
                placeholders(chunk.len(), 16)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for a in chunk {
                let b = a.batch;
                q = q
                    .bind(a.partition_id)
                    .bind(a.last_offset)
                    .bind(a.base_offset)
                    .bind(object_id)
                    .bind(b.byte_offset as i64)
                    .bind(i64::from(b.byte_size))
                    .bind(b.base_timestamp)
                    .bind(b.max_timestamp)
                    .bind(ts_type_code(a.timestamp_type))
                    .bind(a.log_append_time)
                    .bind(b.producer_id)
                    .bind(b.producer_epoch)
                    .bind(b.base_sequence)
                    .bind(b.last_sequence)
                    .bind(a.effective_max_timestamp)
                    .bind(a.max_timestamp_so_far);
            }
            q.execute(&mut *tx).await.map_err(not_applied)?;
        }

        // 6. The producer states that changed.
        let changed: Vec<((i64, i64), &ProducerState)> = producers
            .iter()
            .filter(|(_, p)| p.touched)
            .filter_map(|(k, p)| p.state.as_ref().map(|s| (*k, s)))
            .collect();
        for chunk in changed.chunks(CHUNK) {
            let sql = format!(
                "INSERT INTO producer_state (partition_id, producer_id, producer_epoch, \
                 batch_window, last_append_ms) VALUES {} \
                 ON CONFLICT (partition_id, producer_id) DO UPDATE SET \
                 producer_epoch = excluded.producer_epoch, batch_window = excluded.batch_window, \
                 last_append_ms = excluded.last_append_ms",
                placeholders(chunk.len(), 5)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for ((partition_id, producer_id), state) in chunk {
                q = q
                    .bind(*partition_id)
                    .bind(*producer_id)
                    .bind(state.producer_epoch)
                    .bind(producer::encode_window(&state.batches))
                    .bind(state.last_append_ms);
            }
            q.execute(&mut *tx).await.map_err(not_applied)?;
        }

        // 7. The partitions that grew.
        let grown: Vec<&CommitPartition> = partitions.values().filter(|p| p.touched).collect();
        for chunk in grown.chunks(CHUNK) {
            let sql = format!(
                "UPDATE partitions SET high_watermark = v.column2, byte_size = v.column3, \
                 max_timestamp_so_far = v.column4 \
                 FROM (VALUES {}) AS v WHERE partitions.partition_id = v.column1",
                placeholders(chunk.len(), 4)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for p in chunk {
                q = q
                    .bind(p.partition_id)
                    .bind(p.high_watermark)
                    .bind(p.byte_size)
                    .bind(p.max_timestamp_so_far);
            }
            q.execute(&mut *tx).await.map_err(not_applied)?;
        }

        tx.commit().await.map_err(at_commit)?;
        Ok(results)
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        /// Batches read per round trip while filling a partition's answer.
        const PAGE: i64 = 128;
        let mut reader = self.read().await?;
        let mut tx = reader.conn()?.begin().await.map_err(not_applied)?;
        let mut total: u64 = 0;
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let error = |code| FindBatchesResponse {
                error: code,
                batches: Vec::new(),
                log_start_offset: -1,
                high_watermark: -1,
            };
            let Some((partition_id, lso, hwm)) = partition_bounds(&mut tx, request.partition)
                .await
                .map_err(not_applied)?
            else {
                responses.push(error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            if request.offset < lso || request.offset > hwm {
                responses.push(error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            let mut batches: Vec<BatchCoordinate> = Vec::new();
            let mut partition_bytes: u64 = 0;
            let mut from = request.offset;
            'pages: while from < hwm {
                let sql = format!(
                    "SELECT {BATCH_COLUMNS} FROM batches b JOIN objects o \
                     ON o.object_id = b.object_id WHERE b.partition_id = ?1 \
                     AND b.last_offset >= ?2 ORDER BY b.last_offset LIMIT ?3"
                );
                let rows = sqlx::query(AssertSqlSafe(sql))
                    .bind(partition_id)
                    .bind(from)
                    .bind(PAGE)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(not_applied)?;
                let full_page = rows.len() as i64 == PAGE;
                for row in &rows {
                    let batch = batch_from_row(row)?;
                    let size = u64::from(batch.byte_size);
                    let fits = partition_bytes + size <= u64::from(request.max_bytes)
                        && total + size <= u64::from(fetch_max_bytes);
                    if !batches.is_empty() && !fits {
                        break 'pages;
                    }
                    partition_bytes += size;
                    total += size;
                    from = batch
                        .last_offset
                        .checked_add(1)
                        .ok_or_else(|| corrupt("a batch's last offset is i64::MAX"))?;
                    batches.push(batch);
                }
                if !full_page {
                    break;
                }
            }
            responses.push(FindBatchesResponse {
                error: ErrorCode::None,
                batches,
                log_start_offset: lso,
                high_watermark: hwm,
            });
        }
        tx.commit().await.map_err(not_applied)?;
        Ok(responses)
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.conn()?.begin().await.map_err(not_applied)?;
        let answer = |error, offset, timestamp| ListOffsetsResponse {
            error,
            offset,
            timestamp,
        };
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let Some((partition_id, lso, hwm)) = partition_bounds(&mut tx, request.partition)
                .await
                .map_err(not_applied)?
            else {
                responses.push(answer(ErrorCode::UnknownTopicOrPartition, -1, NO_TIMESTAMP));
                continue;
            };
            // (base offset, effective max timestamp) of the answering batch, if any.
            let found: Option<(i64, i64)> = match request.timestamp {
                EARLIEST_TIMESTAMP => {
                    responses.push(answer(ErrorCode::None, lso, NO_TIMESTAMP));
                    continue;
                }
                LATEST_TIMESTAMP => {
                    responses.push(answer(ErrorCode::None, hwm, NO_TIMESTAMP));
                    continue;
                }
                MAX_TIMESTAMP => {
                    let row = sqlx::query(MAX_TIMESTAMP_LOOKUP)
                        .bind(partition_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(not_applied)?;
                    match row {
                        Some(row) => Some((col(&row, 0)?, col(&row, 1)?)),
                        None => None,
                    }
                }
                t if t < 0 => {
                    responses.push(answer(ErrorCode::InvalidRequest, -1, NO_TIMESTAMP));
                    continue;
                }
                t => {
                    let candidate = sqlx::query(TIMESTAMP_CANDIDATE)
                        .bind(partition_id)
                        .bind(t)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(not_applied)?;
                    match candidate {
                        None => None,
                        Some(row) => {
                            let (base, last, ts): (i64, i64, i64) =
                                (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?);
                            if ts >= t {
                                Some((base, ts))
                            } else {
                                let row = sqlx::query(TIMESTAMP_SCAN)
                                    .bind(partition_id)
                                    .bind(last)
                                    .bind(t)
                                    .fetch_optional(&mut *tx)
                                    .await
                                    .map_err(not_applied)?;
                                match row {
                                    Some(row) => Some((col(&row, 0)?, col(&row, 1)?)),
                                    None => None,
                                }
                            }
                        }
                    }
                }
            };
            responses.push(match found {
                None => answer(ErrorCode::None, -1, NO_TIMESTAMP),
                Some((base_offset, ts)) => answer(ErrorCode::None, base_offset.max(lso), ts),
            });
        }
        tx.commit().await.map_err(not_applied)?;
        Ok(responses)
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let now = self.clock.now_ms();
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let error = |code| DeleteRecordsResponse {
                error: code,
                low_watermark: -1,
            };
            let Some((partition_id, lso, hwm)) = partition_bounds(&mut tx, request.partition)
                .await
                .map_err(not_applied)?
            else {
                responses.push(error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            let target = if request.offset == -1 {
                hwm
            } else {
                request.offset
            };
            if target < 0 || target > hwm {
                responses.push(error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            if target > lso {
                let (_, bytes) = delete_batches_below(&mut tx, partition_id, target, now).await?;
                sqlx::query(
                    "UPDATE partitions SET log_start_offset = ?2, byte_size = byte_size - ?3 \
                     WHERE partition_id = ?1",
                )
                .bind(partition_id)
                .bind(target)
                .bind(bytes)
                .execute(&mut *tx)
                .await
                .map_err(not_applied)?;
            }
            responses.push(DeleteRecordsResponse {
                error: ErrorCode::None,
                low_watermark: target.max(lso),
            });
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(responses)
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut report = RetentionReport::default();
        if max_batches == 0 {
            return Ok(report);
        }
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let now = self.clock.now_ms();
        // The pass holds the write lock, so its work is bounded by its budget, not by the number
        // of partitions: candidates are only the partitions whose first batch retention deletes
        // (found in SQL, one index probe each, see RETENTION_CANDIDATES), so each one examined
        // gives at least one batch; each is read in growing pages that stop at the first batch
        // that stays; and the walk ends as soon as the budget is spent (no further partition is
        // examined).
        let mut budget = u64::from(max_batches);
        let mut after: (String, i64) = (String::new(), i64::MIN);
        'walk: loop {
            let page = sqlx::query(RETENTION_CANDIDATES)
                .bind(&after.0)
                .bind(after.1)
                .bind(now)
                .bind(RETENTION_CANDIDATE_PAGE)
                .fetch_all(&mut *tx)
                .await
                .map_err(not_applied)?;
            for candidate in &page {
                let partition_id: i64 = col(candidate, 0)?;
                after = (col(candidate, 1)?, col(candidate, 2)?);
                let rule = RetentionRule {
                    size: col(candidate, 3)?,
                    retention_ms: col(candidate, 4)?,
                    retention_bytes: col(candidate, 5)?,
                    now,
                };
                let Some(delete_below) = self
                    .retention_end(&mut tx, partition_id, rule, budget)
                    .await?
                else {
                    continue;
                };
                let (count, bytes) =
                    delete_batches_below(&mut tx, partition_id, delete_below, now).await?;
                sqlx::query(
                    "UPDATE partitions SET log_start_offset = MAX(log_start_offset, ?2), \
                     byte_size = byte_size - ?3 WHERE partition_id = ?1",
                )
                .bind(partition_id)
                .bind(delete_below)
                .bind(bytes)
                .execute(&mut *tx)
                .await
                .map_err(not_applied)?;
                report.batches_deleted += to_u64(count, "deleted batch count")?;
                report.bytes_deleted += to_u64(bytes, "deleted bytes")?;
                budget = budget.saturating_sub(to_u64(count, "deleted batch count")?);
                if budget == 0 {
                    break 'walk;
                }
            }
            if (page.len() as i64) < RETENTION_CANDIDATE_PAGE {
                break;
            }
        }
        tx.commit().await.map_err(at_commit)?;
        report.more = report.batches_deleted == u64::from(max_batches);
        Ok(report)
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        let mut reader = self.read().await?;
        let rows = sqlx::query(
            "SELECT object_key, marked_for_deletion_at, object_size FROM objects \
             WHERE marked_for_deletion_at IS NOT NULL AND marked_for_deletion_at < ?1 \
             ORDER BY marked_for_deletion_at, object_key LIMIT ?2",
        )
        .bind(marked_before_ms)
        .bind(i64::from(limit))
        .fetch_all(reader.conn()?)
        .await
        .map_err(not_applied)?;
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
        if object_keys.is_empty() {
            return Ok(());
        }
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        for chunk in object_keys.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM objects WHERE marked_for_deletion_at IS NOT NULL \
                 AND object_key IN ({}) RETURNING object_key",
                vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
            for key in chunk {
                q = q.bind(key.as_str());
            }
            let forgotten = q.fetch_all(&mut *tx).await.map_err(not_applied)?;
            // A forgotten key must never be committed again: the "committed once" guard (the
            // object row) is gone, so a retried commit_file of it would append batches that point
            // into a deleted object. It is fenced in the same transaction, as fence_orphans would,
            // and commit_file refuses it with ObjectFenced; the fence expires like any other, once
            // the commit deadline refuses the key anyway. Keys without a v7 time cannot be fenced
            // (as in fence_orphans).
            let fences: Vec<(String, i64)> = forgotten
                .into_iter()
                .filter_map(|k| object_key_time_ms(&k).map(|t| (k, t)))
                .collect();
            insert_fences(&mut tx, &fences).await?;
        }
        tx.commit().await.map_err(at_commit)
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        // One write transaction on the single writer: it serializes with every commit_file, which
        // checks the fences inside its own write transaction. Either the commit ran first (the
        // object is known here and is not fenced) or it runs after and sees the fence.
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let now = self.clock.now_ms();
        sqlx::query(
            "DELETE FROM fences WHERE object_key IN (SELECT object_key FROM fences \
             WHERE key_time < ?1 ORDER BY key_time LIMIT ?2)",
        )
        .bind(fence_expiry_before(now, self.max_commit_age))
        .bind(i64::from(FENCE_EXPIRY_BATCH))
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        // Distinct keys with a v7 time, in request order.
        let mut seen = HashSet::new();
        let candidates: Vec<(&String, i64)> = object_keys
            .iter()
            .filter(|k| seen.insert(k.as_str()))
            .filter_map(|k| object_key_time_ms(k).map(|t| (k, t)))
            .collect();
        let mut known = HashSet::new();
        for chunk in candidates.chunks(CHUNK) {
            let sql = format!(
                "SELECT object_key FROM objects WHERE object_key IN ({})",
                vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
            for (key, _) in chunk {
                q = q.bind(key.as_str());
            }
            known.extend(q.fetch_all(&mut *tx).await.map_err(not_applied)?);
        }
        let fenced: Vec<(String, i64)> = candidates
            .into_iter()
            .filter(|(k, _)| !known.contains(k.as_str()))
            .map(|(k, t)| (k.clone(), t))
            .collect();
        insert_fences(&mut tx, &fenced).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(fenced.into_iter().map(|(k, _)| k).collect())
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        let mut guard = self.write().await?;
        let conn = guard.as_mut().ok_or(CoordinatorError::Closed)?;
        let mut report = ProducerExpiryReport::default();
        if max_producers == 0 {
            return Ok(report);
        }
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)?;
        let now = self.clock.now_ms();
        // Reads producer states in the contract's order until `max_producers` expired ones are
        // found: bounded by the cap when many have expired; a pass that finds few reads them all.
        let rows = sqlx::query(EXPIRED_PRODUCERS)
            .bind(now)
            .bind(i64::from(max_producers))
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        let expired: Vec<(i64, i64)> = rows
            .iter()
            .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
            .collect::<Result<_, CoordinatorError>>()?;
        for chunk in expired.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM producer_state WHERE (partition_id, producer_id) IN (VALUES {})",
                placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (partition_id, producer_id) in chunk {
                q = q.bind(*partition_id).bind(*producer_id);
            }
            q.execute(&mut *tx).await.map_err(not_applied)?;
        }
        tx.commit().await.map_err(at_commit)?;
        report.expired = expired.len() as u64;
        report.more = report.expired == u64::from(max_producers);
        Ok(report)
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let mut reader = self.read().await?;
        let conn = reader.conn()?;
        let mut known = HashSet::new();
        for chunk in object_keys.chunks(CHUNK) {
            let sql = format!(
                "SELECT object_key FROM objects WHERE object_key IN ({})",
                vec!["?"; chunk.len()].join(",")
            );
            let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
            for key in chunk {
                q = q.bind(key.as_str());
            }
            known.extend(q.fetch_all(&mut *conn).await.map_err(not_applied)?);
        }
        let mut out = Vec::new();
        for key in object_keys {
            if known.remove(key) {
                out.push(key.clone());
            }
        }
        Ok(out)
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        let mut reader = self.read().await?;
        let row = sqlx::query(
            "SELECT uploader_broker_id, object_size, live_bytes, owners, committed_at, \
             marked_for_deletion_at FROM objects WHERE object_key = ?1",
        )
        .bind(object_key)
        .fetch_optional(reader.conn()?)
        .await
        .map_err(not_applied)?;
        let Some(r) = row else {
            return Ok(None);
        };
        Ok(Some(ObjectInfo {
            object_key: object_key.to_string(),
            uploader_broker_id: col(&r, 0)?,
            object_size: to_u64(col(&r, 1)?, "object size")?,
            live_bytes: to_u64(col(&r, 2)?, "live bytes")?,
            owners: decode_owners(&col::<String>(&r, 3)?)?,
            committed_at: col(&r, 4)?,
            marked_for_deletion_at: col(&r, 5)?,
        }))
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        let mut reader = self.read().await?;
        let row = sqlx::query(
            "SELECT s.producer_epoch, s.batch_window, s.last_append_ms FROM producer_state s \
             JOIN partitions p ON p.partition_id = s.partition_id \
             WHERE p.topic_id = ?1 AND p.partition = ?2 AND s.producer_id = ?3",
        )
        .bind(topic_key(partition.topic_id))
        .bind(partition.partition)
        .bind(producer_id)
        .fetch_optional(reader.conn()?)
        .await
        .map_err(not_applied)?;
        let Some(r) = row else {
            return Ok(None);
        };
        let window: Vec<u8> = col(&r, 1)?;
        Ok(Some(ProducerState {
            producer_id,
            producer_epoch: col(&r, 0)?,
            batches: producer::decode_window(&window)
                .ok_or_else(|| corrupt("torn producer batch window"))?,
            last_append_ms: col(&r, 2)?,
        }))
    }
}
