//! Shared pieces: batch generation, percentiles, timing wrappers around storage and coordinator,
//! the simulated pipeline of figures 5 and 6, RSS readings.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_coordinator::*;
use diskless_core::{RecordBatchBuilder, WalWriter, WalWriterConfig};
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::Latency;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use tokio::time::Instant;

/// Size of the record values in generated batches.
pub(crate) const RECORD_VALUE: usize = 512;

/// A v2 batch of about `target` bytes (records of [`RECORD_VALUE`]-byte values, no compression,
/// CreateTime `ts`), as a client would send it.
pub(crate) fn make_batch(target: usize, ts: i64, seed: u64) -> Bytes {
    let n = (target / RECORD_VALUE).max(1);
    // ~61 bytes of batch header, ~10 bytes of per-record framing.
    let value_len = (target.saturating_sub(61) / n).saturating_sub(10).max(1);
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut b = RecordBatchBuilder::new();
    for i in 0..n {
        let value: Vec<u8> = (0..value_len)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        b = b.record(ts + i as i64 % 3, None, Some(&value));
    }
    match b.build() {
        Ok(batch) => batch.into_bytes(),
        Err(e) => panic!("building a benchmark batch: {e}"),
    }
}

/// `count` batches of about `size` bytes each (seeds `0..count`), stamped now: distinct data, so
/// that a run does not cycle through one hot set of cache lines.
pub(crate) fn make_batches(count: u64, size: usize) -> Vec<Bytes> {
    let ts = now_ms();
    (0..count).map(|i| make_batch(size, ts, i)).collect()
}

/// Milliseconds since the epoch, wall clock.
pub(crate) fn now_ms() -> i64 {
    SystemClock.now_ms()
}

/// A random (v4) UUID, from a generator seeded by the OS: topic ids, and names of fresh schemas
/// that must not collide with an earlier run's.
pub(crate) fn random_uuid() -> uuid::Uuid {
    let mut rng = fastrand::Rng::with_seed(diskless_common::entropy_seed());
    uuid::Builder::from_random_bytes(rng.u128(..).to_le_bytes()).into_uuid()
}

/// A batch without producer id of the given place, size and timestamps, as a commit carries it.
pub(crate) fn plain_batch(
    partition: TopicIdPartition,
    byte_offset: u64,
    byte_size: u32,
    record_count: i32,
    base_timestamp: i64,
    max_timestamp: i64,
) -> CommitBatch {
    CommitBatch {
        partition,
        byte_offset,
        byte_size,
        record_count,
        base_timestamp,
        max_timestamp,
        timestamp_type: TimestampType::CreateTime,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        base_sequence: NO_SEQUENCE,
        last_sequence: NO_SEQUENCE,
        transactional: false,
        txn_seq: None,
    }
}

/// A temporary directory on the same disk as the workspace (not a tmpfs), so that fsync costs
/// what it costs (`DISKLESS_BENCH_DIR` chooses another base).
pub(crate) fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("DISKLESS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let _ = std::fs::create_dir_all(&base);
    match tempfile::Builder::new().prefix("bench-").tempdir_in(&base) {
        Ok(d) => d,
        Err(_) => match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("no temporary directory: {e}"),
        },
    }
}

/// Nearest-rank percentile `q` (0..=1) of `v` (sorted in place).
pub(crate) fn percentile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Creates a topic of `partitions` partitions with the default config, returns its id.
pub(crate) async fn create_topic(
    coordinator: &dyn BatchCoordinator,
    name: &str,
    partitions: i32,
) -> uuid::Uuid {
    let topic_id = random_uuid();
    if let Err(e) = coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: name.to_string(),
            partitions,
            config: TopicConfig::default(),
        })
        .await
    {
        panic!("creating the benchmark topic: {e}");
    }
    topic_id
}

/// Peak and current resident set size of this process, from /proc/self/status, in bytes.
pub(crate) fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

// -------------------------------------------------------------------------------------------------
// Storage wrappers

/// A store that keeps nothing: uploads succeed and are counted, reads fail. For pipeline figures
/// whose volume would not fit in memory.
#[derive(Debug, Default)]
pub(crate) struct NullStorage {
    /// Bytes uploaded.
    pub bytes: AtomicU64,
    /// Uploads.
    pub uploads: AtomicU64,
}

#[async_trait]
impl ObjectStorage for NullStorage {
    async fn upload(&self, _key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let len: usize = payload.iter().map(Bytes::len).sum();
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        Err(StorageError::InvalidRange {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            size: Some(0),
        })
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        Ok(keys.to_vec())
    }

    fn list<'a>(&'a self, _prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        Box::pin(futures::stream::empty())
    }
}

/// A simulated object store (figures 5 and 6): every upload first sleeps a draw of `latency`
/// (tokio time), and the start and end of each successful upload are recorded (the simulated
/// latency included, as a client of a real store would see it). Unlike the testkit's
/// `FaultyStorage`, whose draws depend on the (random, time-based) object keys, the draws here
/// follow the call order from a fixed seed, so a paused-clock run is reproducible.
#[derive(Debug)]
pub(crate) struct SimStorage {
    inner: Arc<dyn ObjectStorage>,
    latency: Latency,
    rng: Mutex<fastrand::Rng>,
    /// key -> (start, end) of its successful upload.
    pub uploads: Mutex<HashMap<String, (Instant, Instant)>>,
}

impl SimStorage {
    /// Wraps `inner`; draws start from `seed`.
    pub(crate) fn new(inner: Arc<dyn ObjectStorage>, latency: Latency, seed: u64) -> SimStorage {
        SimStorage {
            inner,
            latency,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            uploads: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl ObjectStorage for SimStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let start = Instant::now();
        let delay = self.latency.sample(&mut self.rng.lock());
        tokio::time::sleep(delay).await;
        self.inner.upload(key, payload).await?;
        self.uploads
            .lock()
            .insert(key.to_string(), (start, Instant::now()));
        Ok(())
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list_with_offset(prefix, offset)
    }
}

// -------------------------------------------------------------------------------------------------
// Coordinator wrapper

/// What [`TimedCoordinator`] saw of one commit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommitTimes {
    /// When `commit_file` was called.
    pub start: Instant,
    /// When it returned.
    pub end: Instant,
    /// Batches in the file.
    pub batches: usize,
}

/// A coordinator layer: adds a fixed latency to commits (tokio time), records each commit's start
/// and end per object key, which key each appended batch landed in, and the wall time spent in
/// `find_batches`.
#[derive(Debug)]
pub(crate) struct TimedCoordinator {
    commit_latency: Duration,
    /// object key -> commit times.
    pub commits: Mutex<HashMap<String, CommitTimes>>,
    /// (partition, base offset) -> object key, for every appended batch (when `track_batches`).
    pub batch_objects: Mutex<HashMap<(TopicIdPartition, i64), String>>,
    track_batches: bool,
    /// Nanoseconds of wall time spent inside `find_batches`.
    pub find_nanos: AtomicU64,
    /// Nanoseconds of wall time spent inside `commit_file` (latency excluded).
    pub commit_nanos: AtomicU64,
}

impl TimedCoordinator {
    /// Wraps `inner`; commits take `commit_latency` more (tokio time).
    pub(crate) fn new(
        inner: Arc<dyn BatchCoordinator>,
        commit_latency: Duration,
        track_batches: bool,
    ) -> Layered<TimedCoordinator> {
        Layered::new(
            inner,
            TimedCoordinator {
                commit_latency,
                commits: Mutex::new(HashMap::new()),
                batch_objects: Mutex::new(HashMap::new()),
                track_batches,
                find_nanos: AtomicU64::new(0),
                commit_nanos: AtomicU64::new(0),
            },
        )
    }
}

#[async_trait]
impl CoordinatorLayer for TimedCoordinator {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        let start = Instant::now();
        if !self.commit_latency.is_zero() {
            tokio::time::sleep(self.commit_latency).await;
        }
        let key = request.object_key.clone();
        let partitions: Vec<TopicIdPartition> = if self.track_batches {
            request.batches.iter().map(|b| b.partition).collect()
        } else {
            Vec::new()
        };
        let batches = request.batches.len();
        let wall = std::time::Instant::now();
        let results = inner.commit_file(request).await?;
        self.commit_nanos
            .fetch_add(wall.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let end = Instant::now();
        if self.track_batches {
            let mut map = self.batch_objects.lock();
            for (p, r) in partitions.iter().zip(&results) {
                if r.error.is_ok() {
                    map.insert((*p, r.base_offset), key.clone());
                }
            }
        }
        self.commits.lock().insert(
            key,
            CommitTimes {
                start,
                end,
                batches,
            },
        );
        Ok(results)
    }

    async fn find_batches(
        &self,
        inner: &dyn BatchCoordinator,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        let wall = std::time::Instant::now();
        let r = inner.find_batches(requests, fetch_max_bytes).await;
        self.find_nanos
            .fetch_add(wall.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

// -------------------------------------------------------------------------------------------------
// The simulated pipeline of figures 5 and 6

/// Commit latency the simulated pipeline adds to the in-memory coordinator (a local durable
/// commit).
pub(crate) const COMMIT_LATENCY: Duration = Duration::from_millis(10);

/// A writer over a simulated store and a timed in-memory coordinator (commits take
/// [`COMMIT_LATENCY`] more), for runs on the paused clock.
#[derive(Debug)]
pub(crate) struct SimPipeline {
    /// The writer, shared by the producer tasks.
    pub writer: Arc<WalWriter>,
    /// The coordinator, with what it saw of each commit.
    pub coordinator: Arc<Layered<TimedCoordinator>>,
    /// The store, with when each upload started and ended.
    pub storage: Arc<SimStorage>,
    /// A topic of the requested partitions, created before the writer started.
    pub topic: uuid::Uuid,
}

impl SimPipeline {
    /// Starts a writer configured by `config` over `store` behind [`SimStorage`] (`latency`
    /// drawn from `seed`); the coordinator records which object each batch landed in when
    /// `track_batches`.
    pub(crate) async fn start(
        partitions: usize,
        store: Arc<dyn ObjectStorage>,
        latency: Latency,
        seed: u64,
        track_batches: bool,
        config: WalWriterConfig,
    ) -> SimPipeline {
        let clock = Arc::new(SystemClock);
        let model: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
        let coordinator = Arc::new(TimedCoordinator::new(model, COMMIT_LATENCY, track_batches));
        let topic = create_topic(coordinator.as_ref(), "bench", partitions as i32).await;
        let storage = Arc::new(SimStorage::new(store, latency, seed));
        let writer = match WalWriter::builder(storage.clone(), coordinator.clone())
            .with_config(config)
            .with_clock(clock)
            .build()
        {
            Ok(w) => Arc::new(w),
            Err(e) => panic!("writer: {e}"),
        };
        SimPipeline {
            writer,
            coordinator,
            storage,
            topic,
        }
    }
}

/// A current-thread runtime with timers, real clock.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("building a tokio runtime: {e}"),
    }
}

/// A current-thread runtime whose clock starts paused: time advances only when every task waits
/// on a timer, instantly. The simulation figures run on it.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("building a tokio runtime: {e}"),
    }
}

/// CPU time this process has used so far (every thread: the runtime's, SQLite's worker, the
/// cache's), from `/proc/self/task/*/schedstat` (nanoseconds on a CPU); `None` off Linux. Threads
/// that ended are not counted, so measure across work whose threads outlive it.
pub(crate) fn process_cpu_time() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let Ok(stat) = std::fs::read_to_string(path) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(total))
}
