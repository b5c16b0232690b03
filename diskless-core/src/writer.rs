//! The produce path of diskless topics (KIP-1163): [`WalWriter`].
//!
//! A host broker hands every Produce request's partitions to [`WalWriter::append`]. The writer
//!
//! 1. validates each partition's records at once, as Kafka does (exactly one batch per partition,
//!    [`crate::validate::validate_produce_records`]; an invalid partition fails immediately; the
//!    other partitions of the same request go on);
//! 2. buffers the valid batches of all partitions and requests until the buffer holds
//!    [`WalWriterConfig::buffer_max_bytes`] or [`WalWriterConfig::commit_interval`] has passed since the
//!    first batch entered it;
//! 3. closes the buffer into one WAL segment (batches grouped by partition), uploads it under a fresh
//!    time-ordered key — several uploads may run at once;
//! 4. commits the segments' batch coordinates to the coordinator strictly in the order the segments
//!    were closed, so that one writer's batches of a partition keep their order;
//! 5. answers each request with the offsets the coordinator assigned, only after that commit.
//!
//! Failures follow the KIP: a failed upload answers every request of that segment with
//! `KAFKA_STORAGE_ERROR` and leaves no object (the writer deletes whatever an ambiguous attempt may
//! have left); a commit whose outcome is unknown answers `REQUEST_TIMED_OUT` and leaves the object for
//! orphan collection; a batch the coordinator rejects gets that batch's error only.
//!
//! Memory is bounded: bytes buffered plus bytes in flight never exceed
//! [`WalWriterConfig::max_pending_bytes`]; beyond it `append` waits (or fails fast, by option).
//!
//! # Throughput of one producer
//!
//! A producer with `max.in.flight.requests.per.connection = n` and batches of `b` bytes has at most
//! `n × b` bytes waiting for answers. Each answer takes about `wait + upload + commit`, where `wait` is
//! up to `commit_interval` (less when the broker's buffer fills by size first), so one producer gets at
//! most `n × b / (commit_interval/2 + upload_latency + commit_latency)` bytes/s on average. With the
//! defaults (250 ms, S3 p50 ≈ 100 ms, commit ≈ 10 ms) and `n = 5`, `b = 1 MiB` that is about 14 MiB/s.
//! A host tunes it by raising the producer's `batch.size`/`linger.ms` and in-flight count (idempotent
//! producers allow 5), by lowering `commit_interval` with a low-latency store (S3 Express-like, 25 ms:
//! a 50 ms interval gives p99 ≈ 150 ms), and, for the broker as a whole, by `max_concurrent_uploads`:
//! sustained broker throughput is bounded by `max_concurrent_uploads × buffer_max_bytes /
//! upload_latency` (Little's law). Commits happen in segment order, so the upload latency's tail
//! (S3's p99 is several times its p50) delays every segment behind a slow one:
//! [`WalWriterConfig::hedge_uploads_after`] (about the store's p95) trades a few extra PUTs for that
//! tail.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use diskless_cache::{BlockKey, LocalCache};
use diskless_coordinator::{
    BatchCoordinator, Clock, CommitFileRequest, CoordinatorError, ErrorCode, NO_TIMESTAMP, ShardId,
    TopicConfig, TopicIdPartition,
};
use diskless_storage::{KeySource, ObjectKey, ObjectStorage, RandomKeys, StorageError};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

mod config;
pub use config::ConfigError;

use crate::batch::RecordBatch;
use crate::segment::SegmentBuilder;
use crate::validate::{ValidatedBatch, Validator};

/// When the writer closes its buffer into a segment (besides a full buffer, which always does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealPolicy {
    /// [`WalWriterConfig::commit_interval`] after the buffer's first batch (KIP-1163's
    /// `diskless.append.commit.interval.ms`): every request waits up to the interval, at any load.
    #[default]
    Interval,
    /// Group commit: seal as soon as the upload pipeline has room — fewer than `max_in_flight`
    /// segments sealed and not yet uploaded — but not sooner than `min_interval` after the previous
    /// seal (which bounds the PUT rate of one writer to `1 / min_interval`). While the pipeline is
    /// busy, requests accumulate and the next segment is bigger, up to `buffer_max_bytes`; so a
    /// request waits about one upload at high load and `min_interval` at most at low load.
    /// `commit_interval` stays the longest a batch ever waits. An idle writer makes no PUT.
    Adaptive {
        /// The least time between two seals (at most `1 / min_interval` PUTs per second).
        min_interval: Duration,
        /// Seal only while fewer segments than this are uploading or waiting for an upload slot
        /// (1: one upload at a time, the classic group commit; `max_concurrent_uploads`: a free slot).
        max_in_flight: usize,
    },
}

impl SealPolicy {
    /// Group commit with a PUT-rate bound of 1 / `min_interval` and up to `max_in_flight` segments
    /// uploading.
    pub fn adaptive(min_interval: Duration, max_in_flight: usize) -> Self {
        SealPolicy::Adaptive {
            min_interval,
            max_in_flight,
        }
    }
}

/// What [`WalWriter::append`] does when the pending-bytes bound is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backpressure {
    /// Wait until enough earlier segments are committed (the default).
    #[default]
    Wait,
    /// Fail the request at once with `KAFKA_STORAGE_ERROR` (retriable).
    FailFast,
}

/// Settings of a [`WalWriter`].
#[derive(Clone, Debug)]
pub struct WalWriterConfig {
    /// The id of the broker that uploads (recorded with each object).
    pub broker_id: i32,
    /// The prefix of object keys: objects are named `<prefix>/<uuid v7>`.
    pub object_prefix: String,
    /// Close the buffer into a segment once it holds this many bytes (KIP-1163
    /// `diskless.append.buffer.max.bytes`). Default 8 MiB.
    pub buffer_max_bytes: usize,
    /// Close the buffer this long after its first batch arrived (KIP-1163
    /// `diskless.append.commit.interval.ms`). Default 250 ms. With [`SealPolicy::Adaptive`] the
    /// buffer usually closes sooner; this stays the longest any batch waits.
    pub commit_interval: Duration,
    /// When to close the buffer besides a full buffer and `commit_interval`. Default
    /// [`SealPolicy::Interval`].
    pub seal_policy: SealPolicy,
    /// How many segments may upload at once. Default 4.
    pub max_concurrent_uploads: usize,
    /// Bound on bytes buffered plus bytes being uploaded (a segment waiting only for its commit
    /// holds no payload). Default 64 MiB.
    pub max_pending_bytes: usize,
    /// Bound on bytes of requests not yet answered: buffered, uploading, or uploaded and waiting for
    /// their commit. Commits are serial, so a slow coordinator would otherwise let uploaded segments
    /// (their metadata and waiting requests) pile up without limit. At least `max_pending_bytes`.
    /// Default 256 MiB.
    pub max_uncommitted_bytes: usize,
    /// What `append` does at that bound.
    pub backpressure: Backpressure,
    /// The coordinator shards that own this writer's objects (KIP-1164 owner list). Default `[0]`.
    pub owners: Vec<ShardId>,
    /// Block size used to put freshly uploaded segments into the cache; must equal the fetcher's.
    /// Default [`crate::DEFAULT_CACHE_BLOCK_SIZE`].
    pub cache_block_size: u64,
    /// How many requests may be validated at once. Validating a compressed batch decompresses it
    /// (up to 32 × `max.message.bytes`, see [`crate::default_decompression_limit`]) before the
    /// request is counted in `max_pending_bytes`, so this bounds that memory too. Default 8.
    pub max_concurrent_validations: usize,
    /// Start a second, identical upload of a segment whose first attempt has not finished after
    /// this long, and take whichever lands first (a hedged request). Commits happen in segment
    /// order, so one slow upload delays every later segment: hedging cuts that tail for a few extra
    /// PUTs (create-only uploads make the duplicate harmless: same key, same bytes). `None` (the
    /// default) never hedges; about the store's p95 upload latency is a good value.
    pub hedge_uploads_after: Option<Duration>,
    /// How long the writer waits for the coordinator's answer to a segment's commit. After it, every
    /// request of the segment is answered `REQUEST_TIMED_OUT` (retriable), the call is abandoned
    /// (its outcome is unknown: it may still apply) and the object is left to the orphan
    /// collector. It must stay well below the coordinators' `max_commit_age` (default 10 minutes,
    /// [`diskless_coordinator::DEFAULT_MAX_COMMIT_AGE`]), past which a late commit is refused
    /// anyway. Later segments commit without waiting for an abandoned call, so a timed-out request's
    /// batches may land after later ones (as after any Kafka `REQUEST_TIMED_OUT`; an idempotent
    /// producer's sequence checks keep its order). Default 30 s (Kafka's `request.timeout.ms`).
    pub commit_timeout: Duration,
}

impl Default for WalWriterConfig {
    fn default() -> Self {
        WalWriterConfig {
            broker_id: 0,
            object_prefix: "wal".to_string(),
            buffer_max_bytes: 8 << 20,
            commit_interval: Duration::from_millis(250),
            seal_policy: SealPolicy::Interval,
            max_concurrent_uploads: 4,
            max_pending_bytes: 64 << 20,
            max_uncommitted_bytes: 256 << 20,
            backpressure: Backpressure::Wait,
            owners: vec![0],
            cache_block_size: crate::DEFAULT_CACHE_BLOCK_SIZE,
            max_concurrent_validations: 8,
            hedge_uploads_after: None,
            commit_timeout: Duration::from_secs(30),
        }
    }
}

/// Why a [`WalWriter`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriterError {
    /// A setting is out of range.
    #[error("invalid writer configuration: {0}")]
    Config(String),
    /// The object prefix is not a valid key prefix.
    #[error("invalid object prefix: {0}")]
    Prefix(#[from] StorageError),
    /// `WalWriter::new` was called outside a tokio runtime.
    #[error("WalWriter::new must be called within a tokio runtime")]
    NoRuntime,
}

/// One partition of a Produce request.
#[derive(Clone, Debug)]
pub struct ProducePartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The topic's configuration (validation rules and timestamp type).
    pub config: Arc<TopicConfig>,
    /// The partition's `records` field: exactly one record batch (Produce v3+; anything else is
    /// answered `INVALID_RECORD`, and a partial trailing batch is dropped, as Kafka does).
    pub records: Bytes,
}

/// A record that failed validation (Kafka's `BatchIndexAndErrorMessage`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRecordError {
    /// The index of the failing record within its batch.
    pub batch_index: i32,
    /// What is wrong with it.
    pub message: String,
}

/// The answer for one partition of a Produce request (Kafka's `PartitionProduceResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionResponse {
    /// The partition.
    pub partition: TopicIdPartition,
    /// [`ErrorCode::None`] on success.
    pub error: ErrorCode,
    /// A human-readable reason on error.
    pub error_message: Option<String>,
    /// The offset given to the partition's first record; `-1` on error.
    pub base_offset: i64,
    /// The commit time for LogAppendTime topics, else `-1`.
    pub log_append_time: i64,
    /// The partition's log start offset; `-1` when unknown.
    pub log_start_offset: i64,
    /// Per-record validation errors (Kafka's `record_errors`).
    pub record_errors: Vec<ProduceRecordError>,
}

impl PartitionResponse {
    fn error(partition: TopicIdPartition, error: ErrorCode, message: impl Into<String>) -> Self {
        PartitionResponse {
            partition,
            error,
            error_message: Some(message.into()),
            base_offset: -1,
            log_append_time: NO_TIMESTAMP,
            log_start_offset: -1,
            record_errors: Vec::new(),
        }
    }
}

/// Counters of a writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Segments closed.
    pub segments_closed: u64,
    /// Segments uploaded.
    pub segments_uploaded: u64,
    /// Segments whose upload failed.
    pub upload_failures: u64,
    /// Uploads that were hedged (a second attempt started, see
    /// [`WalWriterConfig::hedge_uploads_after`]).
    pub hedged_uploads: u64,
    /// Segments committed.
    pub segments_committed: u64,
    /// Segments whose commit failed (rejected as a whole or outcome unknown).
    pub commit_failures: u64,
    /// Of those, commits abandoned after [`WalWriterConfig::commit_timeout`].
    pub commit_timeouts: u64,
    /// Bytes uploaded (segment sizes).
    pub bytes_uploaded: u64,
    /// Batches appended by the coordinator (duplicates excluded).
    pub batches_committed: u64,
    /// Bytes currently buffered or being uploaded (bounded by `max_pending_bytes`).
    pub pending_bytes: u64,
    /// Bytes of requests not yet answered (bounded by `max_uncommitted_bytes`).
    pub uncommitted_bytes: u64,
}

#[derive(Default)]
struct Counters {
    segments_closed: AtomicU64,
    segments_uploaded: AtomicU64,
    upload_failures: AtomicU64,
    hedged_uploads: AtomicU64,
    segments_committed: AtomicU64,
    commit_failures: AtomicU64,
    commit_timeouts: AtomicU64,
    bytes_uploaded: AtomicU64,
    batches_committed: AtomicU64,
}

/// The future of one request's answers, returned by [`WalWriter::append`]. It resolves once the
/// request's segment is committed (or failed).
#[must_use = "the answers arrive through this future"]
pub struct PendingProduce {
    state: PendingState,
}

enum PendingState {
    Ready(Option<Vec<PartitionResponse>>),
    Waiting {
        rx: oneshot::Receiver<Vec<PartitionResponse>>,
        partitions: Vec<TopicIdPartition>,
    },
}

impl Future for PendingProduce {
    type Output = Vec<PartitionResponse>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            PendingState::Ready(v) => Poll::Ready(v.take().unwrap_or_default()),
            PendingState::Waiting { rx, partitions } => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(v)) => Poll::Ready(v),
                // The writer went away without answering: every partition gets a storage error.
                Poll::Ready(Err(_)) => Poll::Ready(
                    partitions
                        .iter()
                        .map(|p| {
                            PartitionResponse::error(
                                *p,
                                ErrorCode::KafkaStorageError,
                                "the writer shut down before the request was committed",
                            )
                        })
                        .collect(),
                ),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// A partition of a request that passed validation: its answer slot, name and batches.
type ValidPartition = (usize, TopicIdPartition, Vec<(RecordBatch, ValidatedBatch)>);

/// A batch waiting in the buffer.
struct Entry {
    partition: TopicIdPartition,
    batch: RecordBatch,
    meta: ValidatedBatch,
    /// The request (index into `Buffer::requests`) and the partition slot in its answer.
    request: usize,
    slot: usize,
}

/// The answer slot of one partition of a buffered request.
enum Slot {
    /// Waiting for the coordinator.
    Pending(TopicIdPartition),
    /// Answered (validation failure, or the commit result of its first batch).
    Done(PartitionResponse),
}

/// A request waiting in the buffer for its segment's commit.
struct Waiter {
    tx: oneshot::Sender<Vec<PartitionResponse>>,
    slots: Vec<Slot>,
    /// The request's share of the pending-bytes budget. At seal it moves to the upload task and is
    /// released once the segment's bytes are uploaded (or failed): a segment waiting for its turn to
    /// commit holds only metadata, so one slow upload does not hold the budget of later ones.
    permit: Option<OwnedSemaphorePermit>,
    /// The request's share of the uncommitted-bytes bound, released when it is answered.
    _uncommitted: OwnedSemaphorePermit,
}

/// Where a committed batch's result goes: its partition, request and answer slot.
struct Target {
    partition: TopicIdPartition,
    request: usize,
    slot: usize,
}

#[derive(Default)]
struct Buffer {
    entries: Vec<Entry>,
    waiters: Vec<Waiter>,
    bytes: usize,
    opened_at: Option<Instant>,
    /// When the previous segment was sealed (for `SealPolicy::Adaptive`'s `min_interval`). Kept
    /// across seals (not reset by `std::mem::take` of the rest of the buffer).
    last_seal: Option<Instant>,
}

/// A closed segment on its way through upload and commit. Its bytes live only in the upload task.
struct Sealed {
    key: ObjectKey,
    size: u64,
    /// For each batch in the order of the commit request: where its result goes.
    targets: Vec<Target>,
    commit: CommitFileRequest,
    waiters: Vec<Waiter>,
    upload: JoinHandle<Result<(), StorageError>>,
}

struct Shared {
    config: WalWriterConfig,
    /// The runtime the writer's tasks run on (so that `flush` and `Drop` work from any thread).
    runtime: tokio::runtime::Handle,
    validations: Semaphore,
    /// Becomes true when the committer has answered everything and stopped.
    finished: tokio::sync::watch::Sender<bool>,
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Arc<dyn Clock>,
    /// Object keys: a UUID v7 at the clock's time (so fences and the coordinator see one time).
    keys: Arc<dyn KeySource>,
    buffer: Mutex<Buffer>,
    /// `None` once the writer is closed.
    pipeline: Mutex<Option<mpsc::UnboundedSender<Sealed>>>,
    budget: Arc<Semaphore>,
    /// Bytes of requests not yet answered (see `WalWriterConfig::max_uncommitted_bytes`).
    uncommitted: Arc<Semaphore>,
    uploads: Arc<Semaphore>,
    /// Segments sealed whose upload has not ended (uploading or waiting for a slot).
    uploading: AtomicUsize,
    /// Wakes the timer when a buffer gets its first batch, when an upload ends, or on close.
    timer: Notify,
    closed: AtomicBool,
    counters: Counters,
}

/// The produce path: buffers batches of many partitions into WAL segments, uploads them, commits
/// their coordinates and answers the requests. See the [module documentation](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use diskless_core::{RecordBatchBuilder, WalWriter, WalWriterConfig, ProducePartition};
/// use diskless_coordinator::{BatchCoordinator, CreateTopicRequest, ErrorCode, SystemClock, TopicConfig, TopicIdPartition};
/// use diskless_coordinator::sqlite::SqliteCoordinator;
/// use diskless_storage::ObjectStoreStorage;
///
/// let clock = Arc::new(SystemClock);
/// let coordinator = Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap());
/// let topic_id = uuid::Uuid::new_v4();
/// coordinator.create_topic(CreateTopicRequest {
///     topic_id, name: "t".into(), partitions: 1, config: TopicConfig::default(),
/// }).await.unwrap();
/// let writer = WalWriter::new(
///     WalWriterConfig::default(),
///     Arc::new(ObjectStoreStorage::in_memory()),
///     coordinator,
///     None,
///     clock.clone(),
/// ).unwrap();
/// let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
/// let batch = RecordBatchBuilder::new().record(now, None, Some(b"hello")).build().unwrap();
/// let answers = writer.produce(vec![ProducePartition {
///     partition: TopicIdPartition::new(topic_id, 0),
///     config: Arc::new(TopicConfig::default()),
///     records: batch.into_bytes(),
/// }]).await;
/// assert_eq!(answers[0].error, ErrorCode::None);
/// assert_eq!(answers[0].base_offset, 0);
/// writer.close().await;
/// # }
/// ```
pub struct WalWriter {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for WalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalWriter")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl WalWriter {
    /// Starts a writer. Spawns its timer and commit tasks on the current tokio runtime. Object keys
    /// are UUID v7s at `clock`'s time with OS-random bits ([`RandomKeys`]).
    pub fn new(
        config: WalWriterConfig,
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
        cache: Option<Arc<dyn LocalCache>>,
        clock: Arc<dyn Clock>,
    ) -> Result<WalWriter, WriterError> {
        Self::new_with_keys(
            config,
            storage,
            coordinator,
            cache,
            clock,
            Arc::new(RandomKeys),
        )
    }

    /// [`WalWriter::new`] with the source of object keys injected ([`SeededKeys`] for a
    /// deterministic simulation).
    ///
    /// [`SeededKeys`]: diskless_storage::SeededKeys
    pub fn new_with_keys(
        config: WalWriterConfig,
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
        cache: Option<Arc<dyn LocalCache>>,
        clock: Arc<dyn Clock>,
        keys: Arc<dyn KeySource>,
    ) -> Result<WalWriter, WriterError> {
        if config.buffer_max_bytes == 0 {
            return Err(WriterError::Config("buffer_max_bytes must be > 0".into()));
        }
        if config.commit_interval.is_zero() {
            return Err(WriterError::Config("commit_interval must be > 0".into()));
        }
        if config.max_concurrent_uploads == 0 {
            return Err(WriterError::Config(
                "max_concurrent_uploads must be > 0".into(),
            ));
        }
        if config.max_pending_bytes < config.buffer_max_bytes {
            return Err(WriterError::Config(
                "max_pending_bytes must be >= buffer_max_bytes".into(),
            ));
        }
        if config.max_pending_bytes > Semaphore::MAX_PERMITS
            || config.max_uncommitted_bytes > Semaphore::MAX_PERMITS
        {
            return Err(WriterError::Config(
                "max_pending_bytes or max_uncommitted_bytes is too large".into(),
            ));
        }
        if config.max_uncommitted_bytes < config.max_pending_bytes {
            return Err(WriterError::Config(
                "max_uncommitted_bytes must be >= max_pending_bytes".into(),
            ));
        }
        if config.owners.is_empty() {
            return Err(WriterError::Config("owners must not be empty".into()));
        }
        if config.cache_block_size == 0 {
            return Err(WriterError::Config("cache_block_size must be > 0".into()));
        }
        if let SealPolicy::Adaptive {
            max_in_flight: 0, ..
        } = config.seal_policy
        {
            return Err(WriterError::Config(
                "SealPolicy::Adaptive needs max_in_flight >= 1".into(),
            ));
        }
        if config.commit_timeout.is_zero() {
            return Err(WriterError::Config("commit_timeout must be > 0".into()));
        }
        if config.max_concurrent_validations == 0 {
            return Err(WriterError::Config(
                "max_concurrent_validations must be > 0".into(),
            ));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| WriterError::NoRuntime)?;
        // Fail now, not at the first upload, on a bad prefix.
        ObjectKey::generate(&config.object_prefix)?;

        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            runtime: runtime.clone(),
            validations: Semaphore::new(config.max_concurrent_validations),
            finished: tokio::sync::watch::Sender::new(false),
            budget: Arc::new(Semaphore::new(config.max_pending_bytes)),
            uncommitted: Arc::new(Semaphore::new(config.max_uncommitted_bytes)),
            uploads: Arc::new(Semaphore::new(config.max_concurrent_uploads)),
            uploading: AtomicUsize::new(0),
            config,
            storage,
            coordinator,
            cache,
            clock,
            keys,
            buffer: Mutex::new(Buffer::default()),
            pipeline: Mutex::new(Some(tx)),
            timer: Notify::new(),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let timer = runtime.spawn(run_timer(shared.clone()));
        let committer = runtime.spawn(run_committer(shared.clone(), rx));
        Ok(WalWriter {
            shared,
            tasks: Mutex::new(vec![timer, committer]),
        })
    }

    /// Validates and buffers one Produce request's partitions. Returns once the request is buffered
    /// (after waiting for memory, see [`Backpressure`]); the returned future resolves to one answer per
    /// partition, in request order, once the request's segment is committed.
    ///
    /// Requests are buffered in call order: a request appended before another is committed no later.
    pub async fn append(&self, partitions: Vec<ProducePartition>) -> PendingProduce {
        let shared = &self.shared;
        let names: Vec<TopicIdPartition> = partitions.iter().map(|p| p.partition).collect();
        if shared.closed.load(Ordering::Acquire) {
            return ready_errors(&names, ErrorCode::KafkaStorageError, "the writer is closed");
        }

        // What the request pins in memory: its whole payload (valid partitions' batches are slices
        // of the same network buffer as the invalid ones), so that is what the bounds count.
        let request_bytes: usize = partitions.iter().map(|p| p.records.len()).sum();

        // 1. Validate every partition; the answer slots of invalid ones are filled now.
        let Ok(validating) = shared.validations.acquire().await else {
            return ready_errors(&names, ErrorCode::KafkaStorageError, "the writer is closed");
        };
        let now_ms = shared.clock.now_ms();
        let mut validator = Validator::default();
        let mut responses = Vec::with_capacity(partitions.len());
        let mut valid: Vec<ValidPartition> = Vec::new();
        let mut bytes = 0usize;
        for (slot, p) in partitions.into_iter().enumerate() {
            match validate_partition(&mut validator, &p, now_ms) {
                Ok(batches) => {
                    bytes += batches.iter().map(|(b, _)| b.len()).sum::<usize>();
                    responses.push(Slot::Pending(p.partition));
                    valid.push((slot, p.partition, batches));
                }
                Err(response) => responses.push(Slot::Done(*response)),
            }
        }
        if valid.is_empty() {
            return fill_errors(responses, ErrorCode::None, "");
        }

        // 2. Memory bounds. A request larger than a whole bound waits for everything else. Both
        // are always taken in this order (uncommitted, then pending), so requests cannot deadlock.
        drop(validating);
        let config = &shared.config;
        let uncommitted = match acquire(
            &shared.uncommitted,
            request_bytes,
            config.max_uncommitted_bytes,
            config.backpressure,
        )
        .await
        {
            Acquired::Got(p) => p,
            refused => return refuse(responses, refused),
        };
        let permit = match acquire(
            &shared.budget,
            request_bytes,
            config.max_pending_bytes,
            config.backpressure,
        )
        .await
        {
            Acquired::Got(p) => p,
            refused => return refuse(responses, refused),
        };

        // 3. Buffer the whole request into one segment.
        let (tx, rx) = oneshot::channel();
        let mut buffer = shared.buffer.lock();
        if shared.closed.load(Ordering::Acquire) {
            drop(buffer);
            return fill_errors(
                responses,
                ErrorCode::KafkaStorageError,
                "the writer is closed",
            );
        }
        if !buffer.entries.is_empty() && buffer.bytes + bytes > shared.config.buffer_max_bytes {
            seal_locked(shared, &mut buffer);
        }
        let request = buffer.waiters.len();
        for (slot, partition, batches) in valid {
            for (batch, meta) in batches {
                buffer.entries.push(Entry {
                    partition,
                    batch,
                    meta,
                    request,
                    slot,
                });
            }
        }
        buffer.waiters.push(Waiter {
            tx,
            slots: responses,
            permit: Some(permit),
            _uncommitted: uncommitted,
        });
        buffer.bytes += bytes;
        if buffer.opened_at.is_none() {
            buffer.opened_at = Some(Instant::now());
            shared.timer.notify_one();
        }
        if buffer.bytes >= shared.config.buffer_max_bytes || adaptive_ready(shared, &buffer) {
            seal_locked(shared, &mut buffer);
        }
        drop(buffer);
        PendingProduce {
            state: PendingState::Waiting {
                rx,
                partitions: names,
            },
        }
    }

    /// [`append`](Self::append) and wait for the answers.
    pub async fn produce(&self, partitions: Vec<ProducePartition>) -> Vec<PartitionResponse> {
        self.append(partitions).await.await
    }

    /// Closes the current buffer into a segment now, whatever its size and age.
    pub fn flush(&self) {
        let mut buffer = self.shared.buffer.lock();
        if !buffer.entries.is_empty() {
            seal_locked(&self.shared, &mut buffer);
        }
    }

    /// Flushes, waits until every buffered request is answered, and stops the writer. Later
    /// `append`s fail with `KAFKA_STORAGE_ERROR`. Every concurrent caller waits for the drain.
    pub async fn close(&self) {
        shutdown(&self.shared);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        let joined = !tasks.is_empty();
        for task in tasks {
            if let Err(e) = task.await {
                warn!(error = %e, "a writer task failed");
            }
        }
        if joined {
            // The committer has ended (even by a panic): nothing more will be answered.
            self.shared.finished.send_replace(true);
        }
        let mut finished = self.shared.finished.subscribe();
        // Err: the sender is gone, which cannot be while `self` holds `shared`.
        let _ = finished.wait_for(|done| *done).await;
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        let c = &self.shared.counters;
        let available = self.shared.budget.available_permits();
        WriterStats {
            segments_closed: c.segments_closed.load(Ordering::Relaxed),
            segments_uploaded: c.segments_uploaded.load(Ordering::Relaxed),
            upload_failures: c.upload_failures.load(Ordering::Relaxed),
            hedged_uploads: c.hedged_uploads.load(Ordering::Relaxed),
            segments_committed: c.segments_committed.load(Ordering::Relaxed),
            commit_failures: c.commit_failures.load(Ordering::Relaxed),
            commit_timeouts: c.commit_timeouts.load(Ordering::Relaxed),
            bytes_uploaded: c.bytes_uploaded.load(Ordering::Relaxed),
            batches_committed: c.batches_committed.load(Ordering::Relaxed),
            pending_bytes: (self
                .shared
                .config
                .max_pending_bytes
                .saturating_sub(available)) as u64,
            uncommitted_bytes: (self
                .shared
                .config
                .max_uncommitted_bytes
                .saturating_sub(self.shared.uncommitted.available_permits()))
                as u64,
        }
    }
}

impl Drop for WalWriter {
    fn drop(&mut self) {
        // Answer what is buffered and let the tasks end on their own.
        shutdown(&self.shared);
    }
}

fn shutdown(shared: &Arc<Shared>) {
    let mut buffer = shared.buffer.lock();
    shared.closed.store(true, Ordering::Release);
    if !buffer.entries.is_empty() {
        seal_locked(shared, &mut buffer);
    }
    // Dropping the sender ends the committer once it has committed everything sealed.
    shared.pipeline.lock().take();
    drop(buffer);
    shared.budget.close();
    shared.uncommitted.close();
    shared.validations.close();
    shared.timer.notify_one();
}

fn ready_errors(names: &[TopicIdPartition], error: ErrorCode, message: &str) -> PendingProduce {
    PendingProduce {
        state: PendingState::Ready(Some(
            names
                .iter()
                .map(|p| PartitionResponse::error(*p, error, message))
                .collect(),
        )),
    }
}

/// The outcome of taking permits from a bound.
enum Acquired {
    Got(OwnedSemaphorePermit),
    /// Fail-fast mode and not enough permits now.
    Full,
    /// The writer is closed.
    Closed,
}

/// Takes `bytes` (at least 1, at most the whole `bound`) from `semaphore`, waiting or not.
async fn acquire(
    semaphore: &Arc<Semaphore>,
    bytes: usize,
    bound: usize,
    mode: Backpressure,
) -> Acquired {
    // The bounds are at most Semaphore::MAX_PERMITS (checked at construction); beyond u32 a
    // request simply takes the whole bound.
    let want = u32::try_from(bytes.clamp(1, bound)).unwrap_or(u32::MAX);
    let want = want.min(u32::try_from(bound).unwrap_or(u32::MAX));
    match mode {
        Backpressure::Wait => match semaphore.clone().acquire_many_owned(want).await {
            Ok(p) => Acquired::Got(p),
            Err(_) => Acquired::Closed,
        },
        Backpressure::FailFast => match semaphore.clone().try_acquire_many_owned(want) {
            Ok(p) => Acquired::Got(p),
            Err(tokio::sync::TryAcquireError::NoPermits) => Acquired::Full,
            Err(tokio::sync::TryAcquireError::Closed) => Acquired::Closed,
        },
    }
}

/// Answers a request refused by a memory bound.
fn refuse(slots: Vec<Slot>, refused: Acquired) -> PendingProduce {
    match refused {
        Acquired::Closed => {
            fill_errors(slots, ErrorCode::KafkaStorageError, "the writer is closed")
        }
        _ => fill_errors(
            slots,
            ErrorCode::KafkaStorageError,
            "the broker's produce buffer is full; retry later",
        ),
    }
}

/// Answers a request that never entered the buffer: pending slots get `error`.
fn fill_errors(slots: Vec<Slot>, error: ErrorCode, message: &str) -> PendingProduce {
    PendingProduce {
        state: PendingState::Ready(Some(finish_slots(slots, error, message))),
    }
}

/// Turns slots into answers; slots still pending get `error`.
fn finish_slots(slots: Vec<Slot>, error: ErrorCode, message: &str) -> Vec<PartitionResponse> {
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Done(r) => r,
            Slot::Pending(p) => PartitionResponse::error(p, error, message),
        })
        .collect()
}

/// Validates one partition's records: the library's one place for Kafka's produce rules
/// ([`Validator::validate_produce_records`]: exactly one batch per partition, then every batch
/// check), plus the refusal of transactional batches. An invalid partition gets its error at once.
fn validate_partition(
    validator: &mut Validator,
    p: &ProducePartition,
    now_ms: i64,
) -> Result<Vec<(RecordBatch, ValidatedBatch)>, Box<PartitionResponse>> {
    match validator.validate_produce_records(&p.records, &p.config, now_ms) {
        Ok((_, meta)) if meta.transactional => Err(Box::new(PartitionResponse::error(
            p.partition,
            ErrorCode::InvalidRecord,
            "transactional produce is not supported on diskless topics yet",
        ))),
        Ok(validated) => Ok(vec![validated]),
        Err(e) => {
            let mut response = PartitionResponse::error(p.partition, e.error_code(), e.to_string());
            if let Some(index) = e.record_index {
                response.record_errors.push(ProduceRecordError {
                    batch_index: i32::try_from(index).unwrap_or(i32::MAX),
                    message: e.to_string(),
                });
            }
            Err(Box::new(response))
        }
    }
}

/// Closes the buffer into a segment and starts its upload. Called with the buffer locked, so that
/// segments enter the commit pipeline in the order they were closed.
fn seal_locked(shared: &Arc<Shared>, buffer: &mut Buffer) {
    let Buffer {
        entries, waiters, ..
    } = std::mem::take(buffer);
    buffer.last_seal = Some(Instant::now());
    shared.uploading.fetch_add(1, Ordering::AcqRel);
    let mut waiters = waiters;
    let uuid = shared.keys.next_uuid(shared.clock.now_ms());
    let key = match ObjectKey::generate_with_uuid(&shared.config.object_prefix, uuid) {
        Ok(key) => key,
        Err(e) => {
            // The prefix was checked at construction; this cannot happen, but answer rather than panic.
            for w in waiters.drain(..) {
                complete_all(w, ErrorCode::KafkaStorageError, &e.to_string());
            }
            return;
        }
    };
    // The batches move into the segment (no copy, no clone); only metadata stays here.
    let mut builder = SegmentBuilder::new();
    let mut metas = Vec::with_capacity(entries.len());
    for entry in entries {
        builder.add(entry.partition, entry.batch);
        metas.push((
            entry.meta,
            Target {
                partition: entry.partition,
                request: entry.request,
                slot: entry.slot,
            },
        ));
    }
    let segment = builder.finish();
    // The segment lists batches grouped by partition; commit them in that order, which keeps each
    // partition's batches in the order they were appended.
    let mut metas: Vec<Option<(ValidatedBatch, Target)>> = metas.into_iter().map(Some).collect();
    let mut targets = Vec::with_capacity(metas.len());
    let mut batches = Vec::with_capacity(metas.len());
    for placed in &segment.batches {
        if let Some((meta, target)) = metas.get_mut(placed.insertion_index).and_then(Option::take) {
            batches.push(meta.commit_batch(target.partition, placed.byte_offset));
            targets.push(target);
        }
    }
    let chunks = segment.chunks;
    let size = segment.size;
    let commit = CommitFileRequest {
        object_key: key.as_str().to_string(),
        uploader_broker_id: shared.config.broker_id,
        object_size: size,
        owners: shared.config.owners.clone(),
        batches,
    };
    shared
        .counters
        .segments_closed
        .fetch_add(1, Ordering::Relaxed);
    debug!(key = %key, size, batches = targets.len(), "segment closed");

    let permits: Vec<OwnedSemaphorePermit> =
        waiters.iter_mut().filter_map(|w| w.permit.take()).collect();
    let upload = {
        let storage = shared.storage.clone();
        let uploads = shared.uploads.clone();
        let cache = shared.cache.clone();
        let block_size = shared.config.cache_block_size;
        let key = key.clone();
        let hedge_after = shared.config.hedge_uploads_after;
        let writer = shared.clone();
        let in_flight = InFlight(shared.clone());
        shared.runtime.spawn(async move {
            let _slot = uploads.acquire_owned().await.ok();
            let result = upload_hedged(storage.as_ref(), &key, &chunks, hedge_after, || {
                writer
                    .counters
                    .hedged_uploads
                    .fetch_add(1, Ordering::Relaxed);
            })
            .await;
            if result.is_ok() {
                // Fresh data is read soon, mostly by this broker: keep the segment in the cache.
                // Blocks are keyed by object, so nobody finds them before the commit.
                if let Some(cache) = cache {
                    fill_cache(cache.as_ref(), key.as_str(), &chunks, size, block_size).await;
                }
            }
            // The segment's bytes and its share of the budget go now, not at the commit.
            drop(chunks);
            drop(permits);
            drop(in_flight);
            // Room in the pipeline: an adaptive writer seals what has accumulated meanwhile.
            {
                let mut buffer = writer.buffer.lock();
                if adaptive_ready(&writer, &buffer) {
                    seal_locked(&writer, &mut buffer);
                }
            }
            writer.timer.notify_one();
            result
        })
    };
    let sealed = Sealed {
        key,
        size,
        targets,
        commit,
        waiters: std::mem::take(&mut waiters),
        upload,
    };
    let pipeline = shared.pipeline.lock();
    match pipeline.as_ref() {
        Some(tx) => {
            if let Err(mpsc::error::SendError(sealed)) = tx.send(sealed) {
                fail_sealed(sealed, ErrorCode::KafkaStorageError, "the writer is closed");
            }
        }
        None => fail_sealed(sealed, ErrorCode::KafkaStorageError, "the writer is closed"),
    }
}

/// Uploads a segment; with `hedge_after`, a second identical upload starts if the first has not
/// finished by then, and the first success wins (the other is dropped, which cancels it; a cancelled
/// PUT that lands anyway wrote the same bytes under the same key). Fails only when every attempt
/// failed, with the last error.
async fn upload_hedged(
    storage: &dyn ObjectStorage,
    key: &ObjectKey,
    chunks: &[Bytes],
    hedge_after: Option<Duration>,
    on_hedge: impl FnOnce(),
) -> Result<(), StorageError> {
    let first = storage.upload(key, chunks);
    let Some(after) = hedge_after else {
        return first.await;
    };
    tokio::pin!(first);
    // `biased`: polled in order, so a run under a simulated clock is deterministic.
    tokio::select! {
        biased;
        result = &mut first => return result,
        _ = tokio::time::sleep(after) => {}
    }
    on_hedge();
    debug!(key = %key, "upload is slow, hedging with a second attempt");
    let second = storage.upload(key, chunks);
    tokio::pin!(second);
    tokio::select! {
        biased;
        result = &mut first => match result {
            Ok(()) => Ok(()),
            Err(_) => second.await,
        },
        result = &mut second => match result {
            Ok(()) => Ok(()),
            Err(_) => first.await,
        },
    }
}

fn fail_sealed(sealed: Sealed, error: ErrorCode, message: &str) {
    sealed.upload.abort();
    for w in sealed.waiters {
        complete_all(w, error, message);
    }
}

/// Answers a request; its still-pending slots get `error`.
fn complete_all(waiter: Waiter, error: ErrorCode, message: &str) {
    // The requester may have gone away; nothing to do then.
    let _ = waiter.tx.send(finish_slots(waiter.slots, error, message));
}

/// One sealed segment counted in `Shared::uploading` until its upload ends (also when the upload
/// task is aborted or panics, so an adaptive writer never waits for a slot that cannot free).
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.uploading.fetch_sub(1, Ordering::AcqRel);
        self.0.timer.notify_one();
    }
}

/// Whether an adaptive writer seals the (non-empty) buffer now: the pipeline has room and
/// `min_interval` has passed since the previous seal.
fn adaptive_ready(shared: &Shared, buffer: &Buffer) -> bool {
    let SealPolicy::Adaptive {
        min_interval,
        max_in_flight,
    } = shared.config.seal_policy
    else {
        return false;
    };
    !buffer.entries.is_empty()
        && shared.uploading.load(Ordering::Acquire) < max_in_flight
        && buffer
            .last_seal
            .is_none_or(|t| t + min_interval <= Instant::now())
}

/// Closes the buffer `commit_interval` after its first batch, and, for an adaptive writer, when the
/// pipeline has room once `min_interval` has passed since the previous seal.
async fn run_timer(shared: Arc<Shared>) {
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let buffer = shared.buffer.lock();
            buffer.opened_at.map(|at| {
                let mut deadline = at + shared.config.commit_interval;
                if let SealPolicy::Adaptive {
                    min_interval,
                    max_in_flight,
                } = shared.config.seal_policy
                    && shared.uploading.load(Ordering::Acquire) < max_in_flight
                    && let Some(last) = buffer.last_seal
                {
                    deadline = deadline.min(last + min_interval);
                }
                deadline
            })
        };
        match next {
            None => shared.timer.notified().await,
            Some(deadline) => {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(deadline) => {
                        let mut buffer = shared.buffer.lock();
                        let due = buffer
                            .opened_at
                            .is_some_and(|t| t + shared.config.commit_interval <= Instant::now());
                        if due || adaptive_ready(&shared, &buffer) {
                            seal_locked(&shared, &mut buffer);
                        }
                    }
                    _ = shared.timer.notified() => {}
                }
            }
        }
    }
}

/// Takes closed segments in order: waits for each upload, commits, answers.
async fn run_committer(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Sealed>) {
    while let Some(sealed) = rx.recv().await {
        commit_one(&shared, sealed).await;
    }
    shared.finished.send_replace(true);
}

async fn commit_one(shared: &Arc<Shared>, sealed: Sealed) {
    let Sealed {
        key,
        size,
        targets,
        commit,
        mut waiters,
        upload,
    } = sealed;
    let counters = &shared.counters;
    let uploaded = match upload.await {
        Ok(result) => result,
        Err(join) => Err(StorageError::Transient {
            source: Box::new(join),
        }),
    };
    if let Err(e) = uploaded {
        counters.upload_failures.fetch_add(1, Ordering::Relaxed);
        warn!(key = %key, error = %e, "segment upload failed");
        // An attempt may have landed before the failure was seen: leave no garbage.
        let storage = shared.storage.clone();
        let k = key.clone();
        shared.runtime.spawn(async move {
            if let Err(e) = storage.delete(std::slice::from_ref(&k)).await {
                warn!(key = %k, error = %e, "could not delete a failed upload; orphan collection will");
            }
        });
        for w in waiters {
            complete_all(
                w,
                ErrorCode::KafkaStorageError,
                &format!("upload of the WAL segment failed: {e}"),
            );
        }
        return;
    }
    counters.segments_uploaded.fetch_add(1, Ordering::Relaxed);
    counters.bytes_uploaded.fetch_add(size, Ordering::Relaxed);

    let timeout = shared.config.commit_timeout;
    let answer = match tokio::time::timeout(timeout, shared.coordinator.commit_file(commit)).await {
        Ok(answer) => answer,
        Err(_) => {
            counters.commit_timeouts.fetch_add(1, Ordering::Relaxed);
            // Abandoned: the call may still apply (until the coordinator's commit deadline), so the
            // object stays; the orphan collector fences and deletes it if it never committed.
            Err(CoordinatorError::OutcomeUnknown(
                format!("no answer from the coordinator within the commit timeout ({timeout:?})")
                    .into(),
            ))
        }
    };
    match answer {
        Ok(results) => {
            counters.segments_committed.fetch_add(1, Ordering::Relaxed);
            for (entry, result) in targets.iter().zip(results.iter()) {
                if result.error.is_ok() && !result.duplicate {
                    counters.batches_committed.fetch_add(1, Ordering::Relaxed);
                }
                let Some(slot) = waiters
                    .get_mut(entry.request)
                    .and_then(|w| w.slots.get_mut(entry.slot))
                else {
                    continue;
                };
                let rejected = || {
                    PartitionResponse::error(
                        entry.partition,
                        result.error,
                        format!("batch rejected by the coordinator: {}", result.error),
                    )
                };
                match slot {
                    // The partition's first batch gives the answer's offsets.
                    Slot::Pending(_) if result.error.is_ok() => {
                        *slot = Slot::Done(PartitionResponse {
                            partition: entry.partition,
                            error: ErrorCode::None,
                            error_message: None,
                            base_offset: result.base_offset,
                            log_append_time: result.log_append_time,
                            log_start_offset: result.log_start_offset,
                            record_errors: Vec::new(),
                        })
                    }
                    Slot::Pending(_) => *slot = Slot::Done(rejected()),
                    // One batch per partition today (validate_produce_records); kept so that a
                    // partition's answer fails if any of its batches is rejected.
                    Slot::Done(r) if r.error.is_ok() && !result.error.is_ok() => *r = rejected(),
                    Slot::Done(_) => {}
                }
            }
            if results.len() != targets.len() {
                warn!(
                    key = %key,
                    expected = targets.len(),
                    got = results.len(),
                    "coordinator answered a different number of batches"
                );
            }
            for w in waiters {
                complete_all(
                    w,
                    ErrorCode::UnknownServerError,
                    "the coordinator did not answer for this batch",
                );
            }
        }
        Err(e) => {
            counters.commit_failures.fetch_add(1, Ordering::Relaxed);
            // Only errors that say the commit certainly did not apply make the object garbage;
            // anything else (outcome unknown, "already committed" after some retry layer) keeps it
            // for the orphan collector, which asks the coordinator first.
            let certainly_not_applied = e.certainly_not_applied();
            let code = match &e {
                CoordinatorError::OutcomeUnknown(_)
                | CoordinatorError::ObjectAlreadyCommitted(_) => ErrorCode::RequestTimedOut,
                other => other.error_code(),
            };
            warn!(key = %key, error = %e, "segment commit failed");
            if certainly_not_applied {
                let storage = shared.storage.clone();
                let k = key.clone();
                shared.runtime.spawn(async move {
                    if let Err(e) = storage.delete(std::slice::from_ref(&k)).await {
                        warn!(key = %k, error = %e, "could not delete an uncommitted segment");
                    }
                });
            }
            for w in waiters {
                complete_all(w, code, &format!("commit of the WAL segment failed: {e}"));
            }
        }
    }
}

/// Puts a freshly uploaded segment into the cache, cut into aligned blocks.
pub(crate) async fn fill_cache(
    cache: &dyn LocalCache,
    key: &str,
    chunks: &[Bytes],
    size: u64,
    block_size: u64,
) {
    let object: Arc<str> = Arc::from(key);
    // Each block is allocated at its exact final size (the last one is usually shorter): a
    // `Bytes` keeps its whole allocation, and the cache weighs blocks by length.
    let capacity = |index: u64| {
        usize::try_from(block_size.min(size.saturating_sub(index.saturating_mul(block_size))))
            .unwrap_or(0)
    };
    let mut block = Vec::with_capacity(capacity(0));
    let mut index = 0u64;
    for chunk in chunks {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let room = usize::try_from(block_size).unwrap_or(usize::MAX) - block.len();
            let take = room.min(rest.len());
            block.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if block.len() as u64 == block_size {
                let full = std::mem::replace(&mut block, Vec::with_capacity(capacity(index + 1)));
                cache
                    .insert(
                        BlockKey::new(object.clone(), block_size, index),
                        Bytes::from(full),
                    )
                    .await;
                index += 1;
            }
        }
    }
    if !block.is_empty() {
        cache
            .insert(BlockKey::new(object, block_size, index), Bytes::from(block))
            .await;
    }
}
