//! The tiering worker (docs/tiered-consolidation.md §2.8) against the model and SQLite
//! coordinators, with a crash at every step of a pass (§3.4).
//!
//! Records are produced through a `WalWriter` (one WAL object per append, holding every
//! partition's batch); the test keeps every acknowledged batch. After any mix of tiering,
//! retention, cleaner and orphan passes, the check reads each partition from its log start through
//! the coordinator's `find_batches` — tiered segments parsed by the independent reader
//! `diskless_testkit::kafka_segment`, WAL batches read from their objects — and requires every
//! acknowledged offset in `[log start, high watermark)` exactly once, byte for byte (the stored
//! batch with its assigned offset and leader epoch 0), segments and WAL batches disjoint, every
//! object in storage known to the coordinator, and no WAL batch left once everything is old.
//!
//! The crash test counts the calls a clean pass makes to storage and the coordinator, then for
//! every call n replays the scenario with call n failing before it is made, made with its answer
//! lost, or made and followed by the worker's death (every later call of that instance fails);
//! after each, a fresh worker, an orphan collector on the `tiered` prefix and the cleaner run to
//! quiescence, and the check runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::lifecycle::{
    CleanerConfig, ObjectCleaner, OrphanCollector, OrphanConfig, RetentionConfig,
    RetentionEnforcer, TieringConfig, TieringWorker,
};
use diskless_core::*;
use diskless_storage::{
    ObjectKey, ObjectMeta, ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, SeededKeys,
    StorageError,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::kafka_segment::KafkaSegment;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use uuid::Uuid;

const PARTITIONS: i32 = 3;
const INTERVAL: i32 = 150;
const MINUTE: i64 = 60_000;

fn real_now_ms() -> i64 {
    SystemClock.now_ms()
}

// ---------------------------------------------------------------------------------------------
// Crash injection: one plan shared by the storage and coordinator layers of one worker instance.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Call n fails without being made.
    Fail,
    /// Call n is made, its answer lost.
    LoseAnswer,
    /// Call n is made, then the worker dies: it and every later call fail.
    Die,
}

#[derive(Debug)]
struct Crash {
    at: u64,
    mode: Mode,
    calls: AtomicU64,
    dead: AtomicBool,
    /// Names of the calls, for messages.
    log: parking_lot::Mutex<Vec<String>>,
}

enum Decision {
    Run,
    Refuse,
    RunThenFail,
    /// Made, then the worker dies: once the call returned, it and every later call fail.
    RunThenDie,
}

impl Crash {
    fn never() -> Arc<Crash> {
        Self::at(0, Mode::Fail)
    }

    fn at(at: u64, mode: Mode) -> Arc<Crash> {
        Arc::new(Crash {
            at,
            mode,
            calls: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            log: parking_lot::Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn decide(&self, name: &str) -> Decision {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.log.lock().push(name.to_string());
        if self.dead.load(Ordering::SeqCst) {
            return Decision::Refuse;
        }
        if n != self.at {
            return Decision::Run;
        }
        match self.mode {
            Mode::Fail => Decision::Refuse,
            Mode::LoseAnswer => Decision::RunThenFail,
            Mode::Die => Decision::RunThenDie,
        }
    }
}

impl Crash {
    /// After a call made under `decision`: its answer, or the injected failure.
    fn answer<T, E>(&self, decision: Decision, made: Result<T, E>, failure: E) -> Result<T, E> {
        match decision {
            Decision::Run => made,
            Decision::Refuse | Decision::RunThenFail => Err(failure),
            Decision::RunThenDie => {
                self.dead.store(true, Ordering::SeqCst);
                Err(failure)
            }
        }
    }
}

fn injected() -> StorageError {
    StorageError::Transient {
        source: "injected crash".into(),
    }
}

/// Storage as one worker instance sees it.
#[derive(Debug)]
struct CrashStorage {
    inner: Arc<dyn ObjectStorage>,
    crash: Arc<Crash>,
}

#[async_trait]
impl ObjectStorage for CrashStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let decision = self.crash.decide("upload");
        if matches!(decision, Decision::Refuse) {
            return Err(injected());
        }
        let made = self.inner.upload(key, payload).await;
        self.crash.answer(decision, made, injected())
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let decision = self.crash.decide("upload_stream");
        if matches!(decision, Decision::Refuse) {
            return Err(injected());
        }
        let made = self.inner.upload_stream(key, chunks, part_size).await;
        self.crash.answer(decision, made, injected())
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let decision = self.crash.decide("fetch");
        if matches!(decision, Decision::Refuse) {
            return Err(injected());
        }
        let made = self.inner.fetch(key, range).await;
        self.crash.answer(decision, made, injected())
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let decision = self.crash.decide("delete");
        if matches!(decision, Decision::Refuse) {
            return Err(injected());
        }
        let made = self.inner.delete(keys).await;
        self.crash.answer(decision, made, injected())
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }
}

/// The coordinator as one worker instance sees it.
#[derive(Debug)]
struct CrashLayer {
    crash: Arc<Crash>,
    /// While set, `register_segment` waits before reaching the coordinator.
    stall_register: tokio::sync::watch::Sender<bool>,
    stalled: AtomicU64,
}

impl CrashLayer {
    fn new(crash: Arc<Crash>) -> CrashLayer {
        CrashLayer {
            crash,
            stall_register: tokio::sync::watch::Sender::new(false),
            stalled: AtomicU64::new(0),
        }
    }
}

impl CoordinatorLayer for CrashLayer {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        Box::pin(async move {
            if op == CoordinatorOp::RegisterSegment {
                let mut stall = self.stall_register.subscribe();
                if *stall.borrow_and_update() {
                    self.stalled.fetch_add(1, Ordering::SeqCst);
                    let _ = stall.wait_for(|s| !*s).await;
                }
            }
            let decision = self.crash.decide(op.name());
            if matches!(decision, Decision::Refuse) {
                return Err(CoordinatorError::Unavailable("injected crash".into()));
            }
            let made = call.await;
            let lost = CoordinatorError::OutcomeUnknown("injected crash".into());
            self.crash.answer(decision, made, lost)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The environment

#[derive(Clone, Copy, Debug)]
enum Backend {
    Model,
    Sqlite,
}

struct Env {
    clock: Arc<ManualClock>,
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    writer: WalWriter,
    topic_id: Uuid,
    config: TopicConfig,
    /// Every acknowledged batch: (partition, base offset) → the batch as produced.
    acked: BTreeMap<(i32, i64), RecordBatch>,
    /// Records appended so far (record values differ).
    produced: u64,
    seed: u64,
}

fn topic_config() -> TopicConfig {
    TopicConfig {
        retention_ms: -1,
        segment_bytes: 1_500,
        segment_ms: 5 * MINUTE,
        index_interval_bytes: INTERVAL,
        ..TopicConfig::default()
    }
}

async fn env(backend: Backend, config: TopicConfig) -> Env {
    let clock = ManualClock::new(real_now_ms());
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator: Arc<dyn BatchCoordinator> = match backend {
        Backend::Model => Arc::new(InMemoryCoordinator::new(clock.clone())),
        Backend::Sqlite => Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap()),
    };
    let topic_id = Uuid::from_u128(0x7e57);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "tiering".into(),
            partitions: PARTITIONS,
            config: config.clone(),
        })
        .await
        .unwrap();
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(1)))
        .with_clock(clock.clone())
        .with_seed(1)
        .build()
        .unwrap();
    Env {
        clock,
        storage,
        coordinator,
        writer,
        topic_id,
        config,
        acked: BTreeMap::new(),
        produced: 0,
        seed: 100,
    }
}

impl Env {
    fn partition(&self, p: i32) -> TopicIdPartition {
        TopicIdPartition::new(self.topic_id, p)
    }

    /// `rounds` appends, each one batch per partition (one WAL object each), acknowledged.
    async fn produce(&mut self, rounds: usize) {
        for _ in 0..rounds {
            let mut requests = Vec::new();
            let mut batches = Vec::new();
            for p in 0..PARTITIONS {
                self.produced += 1;
                let n = 1 + (self.produced % 3) as usize;
                let mut b = RecordBatchBuilder::new();
                for i in 0..n {
                    let value = format!("record {} {i} {}", self.produced, "x".repeat(40 + i * 7));
                    b = b.record(self.clock.now_ms() + i as i64, None, Some(value.as_bytes()));
                }
                let batch = b.build().unwrap();
                batches.push((p, batch.clone()));
                requests.push(ProducePartition {
                    partition: self.partition(p),
                    config: Arc::new(self.config.clone()),
                    records: batch.into_bytes(),
                    txn_seq: None,
                });
            }
            let answers = self.writer.append(requests).await.await;
            for ((p, batch), answer) in batches.into_iter().zip(answers) {
                assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
                self.acked.insert((p, answer.base_offset), batch);
            }
            self.clock.advance(1_000);
        }
    }

    /// A worker whose storage and coordinator calls go through `crash`.
    fn worker(&self, crash: &Arc<Crash>) -> (TieringWorker, Arc<Layered<CrashLayer>>) {
        self.worker_with(crash, TieringConfig::default())
    }

    fn worker_with(
        &self,
        crash: &Arc<Crash>,
        config: TieringConfig,
    ) -> (TieringWorker, Arc<Layered<CrashLayer>>) {
        let storage: Arc<dyn ObjectStorage> = Arc::new(CrashStorage {
            inner: self.storage.clone(),
            crash: crash.clone(),
        });
        let coordinator = Arc::new(Layered::new(
            self.coordinator.clone(),
            CrashLayer::new(crash.clone()),
        ));
        let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
            .build()
            .unwrap();
        let worker = TieringWorker::new(
            coordinator.clone(),
            Arc::new(ObjectRemoteStorage::new(storage)),
            fetcher,
            self.clock.clone(),
            Arc::new(SeededKeys::new(crash.at * 7 + self.seed)),
            1,
            config.with_part_size(1024).with_read_window(700),
        )
        .unwrap();
        (worker, coordinator)
    }

    fn collector(&self) -> OrphanCollector {
        OrphanCollector::new(
            self.coordinator.clone(),
            self.storage.clone(),
            self.clock.clone(),
            OrphanConfig::new("tiered")
                .with_max_commit_age(Duration::from_secs(60))
                .with_recheck_delay(Duration::ZERO)
                .with_full_sweep_interval(Duration::ZERO),
        )
        .unwrap()
    }

    fn cleaner(&self) -> ObjectCleaner {
        ObjectCleaner::new(
            self.coordinator.clone(),
            self.storage.clone(),
            None,
            self.clock.clone(),
            CleanerConfig::default(),
        )
        .unwrap()
    }

    /// Fresh workers until nothing changes: tiering until no segment is due, the orphan collector
    /// twice per round (suspect, then fence and delete), the cleaner after its grace period.
    async fn quiesce(&mut self) {
        self.seed += 1;
        let (worker, _) = self.worker(&Crash::never());
        let collector = self.collector();
        let cleaner = self.cleaner();
        for round in 0.. {
            assert!(round < 50, "no quiescence");
            self.clock.advance(2 * MINUTE);
            let tiered = worker.run_pass().await.unwrap();
            collector.run_pass().await.unwrap();
            let orphans = collector.run_pass().await.unwrap();
            let cleaned = cleaner.run_pass().await.unwrap();
            if tiered.segments == 0
                && !tiered.more
                && orphans.deleted == 0
                && orphans.waiting == 0
                && cleaned.offered == 0
            {
                break;
            }
        }
    }

    /// Every invariant of the module docs; `all_old`: after quiescence (the orphan collector and
    /// the cleaner ran) with everything produced long ago, so no WAL batch and no unknown object
    /// may be left.
    async fn check(&self, all_old: bool, context: &str) {
        let mut wal_batches = 0;
        for p in 0..PARTITIONS {
            let partition = self.partition(p);
            let mut offset = -1;
            let mut hwm = 0;
            loop {
                let found = self
                    .coordinator
                    .find_batches(
                        &[FindBatchesRequest {
                            partition,
                            offset: offset.max(0),
                            max_bytes: 1 << 30,
                            isolation: IsolationLevel::ReadUncommitted,
                        }],
                        1 << 30,
                    )
                    .await
                    .unwrap()
                    .remove(0);
                if offset < 0 {
                    offset = found.log_start_offset;
                    hwm = found.high_watermark;
                    if offset > 0 {
                        continue;
                    }
                }
                if offset >= hwm {
                    break;
                }
                assert_eq!(found.error, ErrorCode::None, "{context}: p{p} at {offset}");
                assert!(
                    !found.segments.is_empty() || !found.batches.is_empty(),
                    "{context}: p{p} nothing at {offset} below {hwm}"
                );
                // Segments first, then WAL batches: contiguous, never overlapping.
                for segment in &found.segments {
                    assert!(
                        segment.base_offset <= offset && offset <= segment.end_offset,
                        "{context}: p{p} segment {segment:?} at {offset}"
                    );
                    let object = self
                        .storage
                        .fetch(
                            &ObjectKey::parse(&segment.object_key).unwrap(),
                            0..segment.object_size,
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{context}: segment object missing: {e}"));
                    let k = KafkaSegment::parse(&object).unwrap();
                    k.check(INTERVAL).unwrap();
                    assert_eq!(
                        (k.base_offset, k.end_offset),
                        (segment.base_offset, segment.end_offset)
                    );
                    for b in &k.batches {
                        let bytes = &k.log[b.position as usize..(b.position + b.size) as usize];
                        if b.last_offset >= offset {
                            assert_eq!(b.base_offset, offset.max(b.base_offset));
                            self.expect_batch(p, b.base_offset, bytes, context);
                            offset = b.last_offset + 1;
                        }
                    }
                    assert_eq!(offset, segment.end_offset + 1, "{context}");
                }
                for batch in &found.batches {
                    if batch.last_offset < offset {
                        continue;
                    }
                    assert_eq!(
                        batch.base_offset, offset,
                        "{context}: p{p}: a gap or an overlap"
                    );
                    let key = ObjectKey::parse(&batch.object_key).unwrap();
                    let stored = self
                        .storage
                        .fetch(
                            &key,
                            batch.byte_offset..batch.byte_offset + u64::from(batch.byte_size),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{context}: WAL object missing: {e}"));
                    self.expect_stored(p, batch.base_offset, &stored, context);
                    wal_batches += 1;
                    offset = batch.last_offset + 1;
                }
            }
            assert_eq!(
                hwm,
                self.acked
                    .range((p, 0)..(p + 1, 0))
                    .next_back()
                    .map_or(0, |((_, base), b)| base
                        + i64::from(b.last_offset_delta())
                        + 1),
                "{context}: p{p} high watermark"
            );
        }
        if all_old {
            assert_eq!(
                wal_batches, 0,
                "{context}: WAL batches left after quiescence"
            );
        }
        self.check_fetch(context).await;
        // After the orphan pass, every object in storage is known to the coordinator.
        let listed: Vec<String> = futures::stream::iter(["wal", "tiered"])
            .flat_map(|prefix| self.storage.list(prefix))
            .map_ok(|m| m.key.into_string())
            .try_collect()
            .await
            .unwrap();
        let known = self.coordinator.known_objects(&listed).await.unwrap();
        let mut unknown: Vec<&String> = listed.iter().filter(|k| !known.contains(k)).collect();
        unknown.sort();
        assert!(
            !all_old || unknown.is_empty(),
            "{context}: unknown objects in storage: {unknown:?}"
        );
        if all_old {
            let wal: Vec<&String> = listed.iter().filter(|k| k.starts_with("wal/")).collect();
            assert!(wal.is_empty(), "{context}: WAL objects left: {wal:?}");
        }
    }

    /// The same through `Fetcher::fetch` (both tiers, KIP-74 limits): from each partition's log
    /// start to its high watermark with pseudo-random byte limits, every acknowledged batch
    /// exactly once, byte for byte.
    async fn check_fetch(&self, context: &str) {
        let fetcher = Fetcher::builder(self.storage.clone(), self.coordinator.clone())
            .build()
            .unwrap();
        let mut state = self.seed ^ (self.produced << 16) | 1;
        let mut random = |range: std::ops::Range<u32>| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            range.start + ((state >> 33) as u32) % (range.end - range.start)
        };
        for p in 0..PARTITIONS {
            let mut offset = 0;
            loop {
                let answer = fetcher
                    .fetch(
                        &[FetchPartition {
                            partition: self.partition(p),
                            fetch_offset: offset,
                            partition_max_bytes: random(1..3_000),
                            leader_epoch: 0,
                            isolation: Default::default(),
                        }],
                        random(1..6_000),
                    )
                    .await
                    .unwrap()
                    .remove(0);
                if offset == 0 && answer.error == ErrorCode::OffsetOutOfRange {
                    let start = self
                        .coordinator
                        .find_batches(
                            &[FindBatchesRequest {
                                partition: self.partition(p),
                                offset: 0,
                                max_bytes: 1,
                                isolation: IsolationLevel::ReadUncommitted,
                            }],
                            1,
                        )
                        .await
                        .unwrap()[0]
                        .log_start_offset;
                    assert!(start > 0, "{context}: p{p}: {answer:?}");
                    offset = start;
                    continue;
                }
                assert_eq!(
                    answer.error,
                    ErrorCode::None,
                    "{context}: fetch p{p} at {offset}: {answer:?}"
                );
                if offset == 0 && answer.log_start_offset > 0 {
                    offset = answer.log_start_offset;
                    continue;
                }
                if offset >= answer.high_watermark {
                    break;
                }
                let records = answer.records_bytes();
                assert!(
                    !records.is_empty(),
                    "{context}: fetch p{p} at {offset}: nothing"
                );
                let mut at = 0;
                while at < records.len() {
                    let len = i32::from_be_bytes(records[at + 8..at + 12].try_into().unwrap());
                    let end = at + 12 + len as usize;
                    let base = i64::from_be_bytes(records[at..at + 8].try_into().unwrap());
                    assert_eq!(base, offset, "{context}: fetch p{p}: a gap or a repeat");
                    self.expect_batch(p, base, &records[at..end], context);
                    let batch = RecordBatch::parse(records.slice(at..end)).unwrap();
                    offset = base + i64::from(batch.last_offset_delta()) + 1;
                    at = end;
                }
            }
        }
    }

    /// A batch as served from a segment: the produced batch with its offset and leader epoch 0.
    fn expect_batch(&self, p: i32, base: i64, served: &[u8], context: &str) {
        let produced = self
            .acked
            .get(&(p, base))
            .unwrap_or_else(|| panic!("{context}: p{p} batch at {base} was never acknowledged"));
        let mut expected = produced.as_bytes().to_vec();
        expected[..8].copy_from_slice(&base.to_be_bytes());
        expected[12..16].copy_from_slice(&0i32.to_be_bytes());
        assert_eq!(served, &expected[..], "{context}: p{p} batch at {base}");
    }

    /// A batch as stored in a WAL object: the produced batch.
    fn expect_stored(&self, p: i32, base: i64, stored: &[u8], context: &str) {
        let produced = self
            .acked
            .get(&(p, base))
            .unwrap_or_else(|| panic!("{context}: p{p} batch at {base} was never acknowledged"));
        assert_eq!(
            stored,
            &produced.as_bytes()[..],
            "{context}: p{p} batch at {base}"
        );
    }

    async fn tiered_segments(&self) -> usize {
        let mut n = 0;
        for p in 0..PARTITIONS {
            n += self
                .coordinator
                .list_tiered_segments(self.partition(p), 0, 1000)
                .await
                .unwrap()
                .len();
        }
        n
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

async fn tiers_everything_old(backend: Backend) {
    let mut e = env(backend, topic_config()).await;
    e.produce(20).await;
    e.check(false, "before").await;
    // Young batches stay in the WAL tier.
    let (worker, _) = e.worker(&Crash::never());
    let report = worker.run_pass().await.unwrap();
    assert_eq!(report.segments, 0, "{report:?}");
    e.clock.advance(10 * MINUTE);
    let report = worker.run_pass().await.unwrap();
    assert!(report.segments >= PARTITIONS as u64, "{report:?}");
    assert_eq!((report.failed, report.stale), (0, 0), "{report:?}");
    e.check(false, "after one pass").await;
    e.quiesce().await;
    e.check(true, "quiescent").await;
    assert!(e.tiered_segments().await >= 2 * PARTITIONS as usize);
    // More data: the producer snapshot carries over; the WAL objects of tiered batches go.
    e.produce(10).await;
    e.clock.advance(10 * MINUTE);
    e.quiesce().await;
    e.check(true, "second round").await;
    e.writer.close().await;
}

#[tokio::test]
async fn tiers_everything_old_model() {
    tiers_everything_old(Backend::Model).await;
}

#[tokio::test]
async fn tiers_everything_old_sqlite() {
    tiers_everything_old(Backend::Sqlite).await;
}

/// Caps and the cursor: one segment per pass reaches every partition in turn.
#[tokio::test]
async fn bounded_passes_reach_every_partition() {
    let mut e = env(Backend::Model, topic_config()).await;
    e.produce(6).await;
    e.clock.advance(10 * MINUTE);
    let (worker, _) = e.worker_with(
        &Crash::never(),
        TieringConfig::default()
            .with_max_segments_per_pass(1)
            .with_candidate_page(1),
    );
    let mut tiered = Vec::new();
    for _ in 0..PARTITIONS {
        let report = worker.run_pass().await.unwrap();
        assert_eq!(report.segments, 1, "{report:?}");
        let mut now = Vec::new();
        for p in 0..PARTITIONS {
            now.push(
                e.coordinator
                    .list_tiered_segments(e.partition(p), 0, 10)
                    .await
                    .unwrap()
                    .len(),
            );
        }
        tiered = now;
    }
    assert_eq!(tiered, vec![1; PARTITIONS as usize], "each partition once");
    e.check(false, "bounded").await;
    e.writer.close().await;
}

/// Retention deletes tiered segments whole; the cleaner deletes their objects after the grace
/// period; the log start moves past them; reads stay exact.
#[tokio::test]
async fn retention_and_cleaner_delete_segments() {
    let config = TopicConfig {
        retention_ms: 30 * MINUTE,
        ..topic_config()
    };
    let mut e = env(Backend::Sqlite, config).await;
    e.produce(12).await;
    e.clock.advance(10 * MINUTE);
    e.quiesce().await;
    e.check(true, "tiered").await;
    let segments = e.tiered_segments().await;
    assert!(segments > 0);
    let tiered_keys = |e: &Env| {
        let storage = e.storage.clone();
        async move {
            storage
                .list("tiered")
                .map_ok(|m| m.key.into_string())
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
        }
    };
    assert_eq!(tiered_keys(&e).await.len(), segments);
    e.clock.advance(60 * MINUTE);
    let retention =
        RetentionEnforcer::new(e.coordinator.clone(), RetentionConfig::default()).unwrap();
    let report = retention.run_pass().await.unwrap();
    assert!(
        report.batches_deleted > 0 || e.tiered_segments().await == 0,
        "{report:?}"
    );
    assert_eq!(e.tiered_segments().await, 0);
    // Marked, not yet deleted: the grace period.
    let cleaner = e.cleaner();
    assert_eq!(cleaner.run_pass().await.unwrap().deleted, 0);
    assert_eq!(tiered_keys(&e).await.len(), segments);
    e.clock.advance(2 * MINUTE);
    let cleaned = cleaner.run_pass().await.unwrap();
    assert_eq!(cleaned.deleted as usize, segments, "{cleaned:?}");
    assert!(tiered_keys(&e).await.is_empty());
    // Nothing left to read: the log start is the high watermark.
    e.acked.clear();
    let found = e
        .coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: e.partition(0),
                offset: 0,
                max_bytes: 1 << 20,
                isolation: IsolationLevel::ReadUncommitted,
            }],
            1 << 20,
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(found.log_start_offset, found.high_watermark);
    e.writer.close().await;
}

/// The scenario of the crash test: a first segment per partition (so that the crashing pass
/// carries a producer snapshot over), more batches, then the pass under test.
async fn crash_scenario(backend: Backend) -> Env {
    let mut e = env(backend, topic_config()).await;
    e.produce(8).await;
    e.clock.advance(10 * MINUTE);
    let (worker, _) = e.worker(&Crash::never());
    let report = worker.run_pass().await.unwrap();
    assert!(report.segments > 0, "{report:?}");
    e.produce(8).await;
    e.clock.advance(10 * MINUTE);
    e
}

async fn crash_at_every_step(backend: Backend) {
    // The calls of a clean pass.
    let clean = {
        let e = crash_scenario(backend).await;
        let crash = Crash::never();
        let (worker, _) = e.worker(&crash);
        let report = worker.run_pass().await.unwrap();
        assert!(report.segments > 0, "{report:?}");
        e.writer.close().await;
        crash.calls()
    };
    assert!(clean >= 8, "a pass makes {clean} calls");
    // Crashes that left an unregistered segment for the orphan collector, and passes that
    // registered nothing: the scenarios do reach those states.
    let (mut orphaned, mut nothing_tiered) = (0, 0);
    for n in 1..=clean {
        for mode in [Mode::Fail, Mode::LoseAnswer, Mode::Die] {
            let mut e = crash_scenario(backend).await;
            // The segments registered before the pass under test.
            let before = e.tiered_segments().await;
            let crash = Crash::at(n, mode);
            let (worker, _) = e.worker(&crash);
            // The pass may fail (a coordinator read refused): what it did stays consistent.
            let _ = worker.run_pass().await;
            let context = format!(
                "{backend:?} crash at call {n} ({mode:?}): {:?}",
                crash.log.lock().get(n as usize - 1)
            );
            e.check(false, &context).await;
            let uploaded: Vec<String> = e
                .storage
                .list("tiered")
                .map_ok(|m| m.key.into_string())
                .try_collect()
                .await
                .unwrap();
            let known = e.coordinator.known_objects(&uploaded).await.unwrap();
            if known.len() < uploaded.len() {
                orphaned += 1;
            }
            if known.len() == before {
                nothing_tiered += 1;
            }
            drop(worker);
            e.quiesce().await;
            e.check(true, &context).await;
            e.writer.close().await;
        }
    }
    assert!(
        orphaned > 0 && nothing_tiered > 0,
        "{orphaned} {nothing_tiered}"
    );
}

#[tokio::test]
async fn crash_at_every_step_model() {
    crash_at_every_step(Backend::Model).await;
}

#[tokio::test]
async fn crash_at_every_step_sqlite() {
    crash_at_every_step(Backend::Sqlite).await;
}

/// A registration that stalls until after the orphan collector fenced (and deleted) its key is
/// refused with `ObjectFenced`: the data stays in the WAL tier, readable.
#[tokio::test]
async fn a_stalled_registration_cannot_land_on_a_collected_segment() {
    let mut e = env(Backend::Model, topic_config()).await;
    e.produce(6).await;
    e.clock.advance(10 * MINUTE);
    let (worker, layer) = e.worker_with(
        &Crash::never(),
        TieringConfig::default().with_max_segments_per_pass(1),
    );
    layer.layer().stall_register.send_replace(true);
    let worker = Arc::new(worker);
    let pass = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_pass().await }
    });
    for _ in 0..10_000 {
        if layer.layer().stalled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        layer.layer().stalled.load(Ordering::SeqCst),
        1,
        "never stalled"
    );
    let uploaded: Vec<String> = e
        .storage
        .list("tiered")
        .map_ok(|m| m.key.into_string())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(uploaded.len(), 1);
    // The collector suspects the unregistered segment, then fences and deletes it.
    let collector = e.collector();
    e.clock.advance(2 * MINUTE);
    collector.run_pass().await.unwrap();
    let report = collector.run_pass().await.unwrap();
    assert_eq!(report.deleted, 1, "{report:?}");
    // The registration goes on: refused, nothing applied.
    layer.layer().stall_register.send_replace(false);
    let report = pass.await.unwrap().unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    // The first candidate (partition 0) was the stalled one; the pass went on with the next.
    let p0 = e
        .coordinator
        .list_tiered_segments(e.partition(0), 0, 10)
        .await
        .unwrap();
    assert!(p0.is_empty(), "{p0:?}");
    assert_eq!(e.tiered_segments().await as u64, report.segments);
    let info = e.coordinator.object_info(&uploaded[0]).await.unwrap();
    assert!(info.is_none(), "{info:?}");
    e.check(false, "after the refused registration").await;
    // A later pass tiers the data under a fresh key.
    e.quiesce().await;
    e.check(true, "quiescent").await;
    e.writer.close().await;
}

/// Random storage faults under the worker (failed, ambiguous and mid-stream failed uploads,
/// failed reads and deletes) over many passes: whatever fails is retried or collected, and the
/// data ends up tiered, exactly once.
#[tokio::test]
async fn random_storage_faults() {
    use diskless_testkit::storage::{FaultConfig, FaultyStorage};
    for backend in [Backend::Model, Backend::Sqlite] {
        for seed in 0..4 {
            let mut e = env(backend, topic_config()).await;
            e.produce(12).await;
            let faulty: Arc<dyn ObjectStorage> = Arc::new(FaultyStorage::new(
                e.storage.clone(),
                FaultConfig::default()
                    .with_seed(seed)
                    .with_upload_failure_rate(0.2)
                    .with_ambiguous_upload_rate(0.2)
                    .with_mid_stream_failure_rate(0.2)
                    .with_fetch_failure_rate(0.1)
                    .with_delete_failure_rate(0.3),
            ));
            let fetcher = Fetcher::builder(faulty.clone(), e.coordinator.clone())
                .build()
                .unwrap();
            let worker = TieringWorker::new(
                e.coordinator.clone(),
                Arc::new(ObjectRemoteStorage::new(faulty)),
                fetcher,
                e.clock.clone(),
                Arc::new(SeededKeys::new(seed)),
                1,
                TieringConfig::default()
                    .with_part_size(1024)
                    .with_read_window(700),
            )
            .unwrap();
            let context = format!("{backend:?} seed {seed}");
            let mut failed = 0;
            for _ in 0..6 {
                e.clock.advance(3 * MINUTE);
                if let Ok(report) = worker.run_pass().await {
                    failed += report.failed;
                }
                e.check(false, &context).await;
                e.produce(2).await;
            }
            assert!(failed > 0, "{context}: no fault reached the worker");
            e.clock.advance(10 * MINUTE);
            e.quiesce().await;
            e.check(true, &context).await;
            e.writer.close().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Several segments per partition per pass

/// The topic config of the backlog tests: due by size only (`segment.ms` one day).
fn backlog_config() -> TopicConfig {
    TopicConfig {
        segment_ms: 24 * 60 * MINUTE,
        ..topic_config()
    }
}

/// The segments of each partition.
async fn segments_per_partition(e: &Env) -> Vec<usize> {
    let mut counts = Vec::new();
    for p in 0..PARTITIONS {
        counts.push(
            e.coordinator
                .list_tiered_segments(e.partition(p), 0, 1000)
                .await
                .unwrap()
                .len(),
        );
    }
    counts
}

/// The WAL batches of partition `p`: (count, bytes).
async fn wal_of(e: &Env, p: i32) -> (usize, u64) {
    let found = e
        .coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: e.partition(p),
                offset: 0,
                max_bytes: 1 << 30,
                isolation: IsolationLevel::ReadUncommitted,
            }],
            1 << 30,
        )
        .await
        .unwrap()
        .remove(0);
    (
        found.batches.len(),
        found.batches.iter().map(|b| u64::from(b.byte_size)).sum(),
    )
}

/// One pass tiers every full segment of each partition's backlog (Kafka's `RemoteLogManager`
/// copies every rolled segment of a partition per run) and leaves the partial segment behind
/// them in the WAL tier until it is due itself (`segment.ms`), as Kafka copies the active
/// segment only once it rolled.
async fn a_pass_tiers_a_backlog_of_full_segments(backend: Backend) {
    let mut e = env(backend, backlog_config()).await;
    e.produce(40).await;
    e.clock.advance(10 * MINUTE);
    let (worker, _) = e.worker_with(
        &Crash::never(),
        TieringConfig::default()
            .with_max_segments_per_partition(100)
            .with_max_segments_per_pass(100),
    );
    let report = worker.run_pass().await.unwrap();
    assert_eq!(report.candidates, PARTITIONS as u64, "{report:?}");
    assert!(!report.more, "{report:?}");
    assert_eq!((report.failed, report.stale), (0, 0), "{report:?}");
    let counts = segments_per_partition(&e).await;
    assert!(counts.iter().all(|n| *n >= 3), "{counts:?}");
    assert_eq!(report.segments, counts.iter().sum::<usize>() as u64);
    for p in 0..PARTITIONS {
        // What is left is less than a segment, and still there.
        let (batches, bytes) = wal_of(&e, p).await;
        assert!(
            batches > 0,
            "{backend:?} p{p}: the partial segment was tiered"
        );
        assert!(
            bytes < e.config.segment_bytes as u64,
            "{backend:?} p{p}: {bytes} WAL bytes left"
        );
    }
    let due = e
        .coordinator
        .tiering_candidates(e.clock.now_ms(), 2 * MINUTE, None, 100)
        .await
        .unwrap();
    assert!(due.is_empty(), "{due:?}");
    e.check(false, "backlog tiered").await;
    assert_eq!(worker.run_pass().await.unwrap().segments, 0);
    // Once `segment.ms` has passed, the rest goes, one segment per partition.
    e.clock.advance(24 * 60 * MINUTE);
    let report = worker.run_pass().await.unwrap();
    assert_eq!(report.segments, PARTITIONS as u64, "{report:?}");
    for p in 0..PARTITIONS {
        assert_eq!(wal_of(&e, p).await.0, 0);
    }
    e.check(false, "rest tiered").await;
    e.writer.close().await;
}

#[tokio::test]
async fn a_pass_tiers_a_backlog_of_full_segments_model() {
    a_pass_tiers_a_backlog_of_full_segments(Backend::Model).await;
}

#[tokio::test]
async fn a_pass_tiers_a_backlog_of_full_segments_sqlite() {
    a_pass_tiers_a_backlog_of_full_segments(Backend::Sqlite).await;
}

/// `max_segments_per_partition` keeps one backlog from taking a whole pass: the partition gets
/// its share, the cursor moves past it, and the partitions after it are served before it is
/// again.
#[tokio::test]
async fn a_partition_cap_shares_passes_between_backlogs() {
    let mut e = env(Backend::Model, backlog_config()).await;
    e.produce(60).await;
    e.clock.advance(10 * MINUTE);
    let (worker, _) = e.worker_with(
        &Crash::never(),
        TieringConfig::default()
            .with_max_segments_per_partition(2)
            .with_max_segments_per_pass(4)
            .with_candidate_page(1),
    );
    let report = worker.run_pass().await.unwrap();
    assert_eq!((report.segments, report.more), (4, true), "{report:?}");
    assert_eq!(segments_per_partition(&e).await, vec![2, 2, 0]);
    // The next pass starts after partition 1; the cycle ends after partition 2.
    let report = worker.run_pass().await.unwrap();
    assert_eq!((report.segments, report.more), (2, true), "{report:?}");
    assert_eq!(segments_per_partition(&e).await, vec![2, 2, 2]);
    let report = worker.run_pass().await.unwrap();
    assert_eq!(report.segments, 4, "{report:?}");
    assert_eq!(segments_per_partition(&e).await, vec![4, 4, 2]);
    e.check(false, "shared").await;
    // With a cap of one, one segment per partition per pass (the first round's behaviour).
    e.seed += 1;
    let (worker, _) = e.worker_with(
        &Crash::never(),
        TieringConfig::default().with_max_segments_per_partition(1),
    );
    let before = segments_per_partition(&e).await;
    let report = worker.run_pass().await.unwrap();
    let after = segments_per_partition(&e).await;
    assert!(
        before.iter().zip(&after).all(|(b, a)| a - b <= 1),
        "{before:?} {after:?} {report:?}"
    );
    assert!(report.segments > 0, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    e.check(false, "capped at one").await;
    e.writer.close().await;
}

// ---------------------------------------------------------------------------------------------
// Concurrent builds

/// A coordinator layer that counts the segment registrations in flight (their peak: a build
/// registers once its segment is uploaded), and holds the first `meet` until that many are in
/// flight (or 5 s passed: then the peak tells the test the builds did not overlap).
#[derive(Debug)]
struct Gate {
    meet: u64,
    arrivals: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
    met: tokio::sync::Notify,
}

impl Gate {
    fn new(meet: u64) -> Self {
        Gate {
            meet,
            arrivals: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            met: tokio::sync::Notify::new(),
        }
    }
}

impl CoordinatorLayer for Gate {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        Box::pin(async move {
            if op != CoordinatorOp::RegisterSegment {
                return call.await;
            }
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let arrival = self.arrivals.fetch_add(1, Ordering::SeqCst) + 1;
            if arrival < self.meet {
                let met = self.met.notified();
                if self.arrivals.load(Ordering::SeqCst) < self.meet {
                    let _ = tokio::time::timeout(Duration::from_secs(5), met).await;
                }
            } else if arrival == self.meet {
                self.met.notify_waiters();
            }
            let made = call.await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            made
        })
    }
}

/// A worker whose registrations go through a [`Gate`] meeting `meet` of them.
fn gated_worker(e: &Env, meet: u64, config: TieringConfig) -> (TieringWorker, Arc<Layered<Gate>>) {
    let coordinator = Arc::new(Layered::new(e.coordinator.clone(), Gate::new(meet)));
    let fetcher = Fetcher::builder(e.storage.clone(), e.coordinator.clone())
        .build()
        .unwrap();
    let worker = TieringWorker::new(
        coordinator.clone(),
        Arc::new(ObjectRemoteStorage::new(e.storage.clone())),
        fetcher,
        e.clock.clone(),
        Arc::new(SeededKeys::new(e.seed)),
        1,
        config.with_part_size(1024).with_read_window(700),
    )
    .unwrap();
    (worker, coordinator)
}

/// `max_concurrent_builds`: that many partitions are consolidated at once, never more, with the
/// same result as one at a time (every acknowledged offset exactly once from either tier); the
/// pass caps count a build once it finished, so a pass passes `max_segments_per_pass` by at
/// most `max_concurrent_builds - 1` segments.
async fn concurrent_builds_overlap_up_to_their_cap(backend: Backend, cap: u32) {
    let mut e = env(backend, topic_config()).await;
    e.produce(20).await;
    e.clock.advance(10 * MINUTE);
    // One at a time (the default): never two builds in flight.
    let (worker, one) = gated_worker(
        &e,
        2,
        TieringConfig::default().with_max_segments_per_partition(1),
    );
    let report = worker.run_pass().await.unwrap();
    assert_eq!(report.segments, PARTITIONS as u64, "{report:?}");
    assert_eq!(one.layer().peak.load(Ordering::SeqCst), 1, "{backend:?}");
    e.check(false, "one at a time").await;
    // `cap` at once: the first `cap` builds meet in their registrations.
    e.seed += 1;
    let (worker, gate) = gated_worker(
        &e,
        u64::from(cap),
        TieringConfig::default()
            .with_max_concurrent_builds(cap)
            .with_max_segments_per_partition(1),
    );
    let report = worker.run_pass().await.unwrap();
    assert_eq!(
        (report.segments, report.failed, report.stale),
        (PARTITIONS as u64, 0, 0),
        "{backend:?} {report:?}"
    );
    assert_eq!(
        gate.layer().peak.load(Ordering::SeqCst),
        u64::from(cap),
        "{backend:?}: builds in flight at once"
    );
    e.check(false, "concurrent").await;
    // The pass cap: started while it was not reached, every started build finishes.
    e.produce(20).await;
    e.clock.advance(10 * MINUTE);
    e.seed += 1;
    let (worker, _) = gated_worker(
        &e,
        u64::from(cap),
        TieringConfig::default()
            .with_max_concurrent_builds(cap)
            .with_max_segments_per_pass(1),
    );
    let report = worker.run_pass().await.unwrap();
    assert!(report.more, "{report:?}");
    assert!(
        (1..=u64::from(cap)).contains(&report.segments),
        "{backend:?} {report:?}"
    );
    assert_eq!(report.candidates, u64::from(cap), "{report:?}");
    e.check(false, "capped").await;
    e.quiesce().await;
    e.check(true, "quiescent").await;
    e.writer.close().await;
}

#[tokio::test]
async fn concurrent_builds_overlap_up_to_their_cap_model() {
    concurrent_builds_overlap_up_to_their_cap(Backend::Model, 2).await;
    concurrent_builds_overlap_up_to_their_cap(Backend::Model, 3).await;
}

#[tokio::test]
async fn concurrent_builds_overlap_up_to_their_cap_sqlite() {
    concurrent_builds_overlap_up_to_their_cap(Backend::Sqlite, 3).await;
}

// ---------------------------------------------------------------------------------------------
// The fetcher's cache after a registration

/// Storage recording every ranged GET.
#[derive(Debug)]
struct RecordingStorage {
    inner: Arc<dyn ObjectStorage>,
    gets: parking_lot::Mutex<Vec<(String, Range<u64>)>>,
}

#[async_trait]
impl ObjectStorage for RecordingStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        self.inner.upload_stream(key, chunks, part_size).await
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.gets
            .lock()
            .push((key.as_str().to_string(), range.clone()));
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }
}

/// After a registration, the blocks of the new segment from the one holding the end of its
/// `.log` on (its `.index`, `.timeindex`, `.txnindex`, snapshot) are in the fetcher's cache, cut
/// as the fetcher cuts them and equal to the stored bytes: a reader's first index lookup costs no
/// GET, only its `.log` reads do.
#[tokio::test]
async fn a_registered_segments_index_blocks_are_cached() {
    use diskless_cache::{BlockKey, LocalCache, MokaCache, MokaCacheConfig};
    const BLOCK: u64 = 256;
    let mut e = env(Backend::Model, topic_config()).await;
    e.produce(12).await;
    e.clock.advance(10 * MINUTE);
    let storage = Arc::new(RecordingStorage {
        inner: e.storage.clone(),
        gets: parking_lot::Mutex::new(Vec::new()),
    });
    let cache = Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
    let fetcher = Fetcher::builder(storage.clone(), e.coordinator.clone())
        .with_cache(cache.clone())
        .with_config(FetcherConfig::default().with_cache_block_size(BLOCK))
        .build()
        .unwrap();
    let worker = TieringWorker::new(
        e.coordinator.clone(),
        Arc::new(ObjectRemoteStorage::new(storage.clone())),
        fetcher.clone(),
        e.clock.clone(),
        Arc::new(SeededKeys::new(5)),
        1,
        TieringConfig::default()
            .with_part_size(1024)
            .with_read_window(700),
    )
    .unwrap();
    let report = worker.run_pass().await.unwrap();
    assert!(report.segments >= PARTITIONS as u64, "{report:?}");
    // Each segment: the first block it needs for its sections (by key), and how many blocks.
    let mut first_tail_block = BTreeMap::new();
    let mut cached_blocks = 0;
    for p in 0..PARTITIONS {
        for s in e
            .coordinator
            .list_tiered_segments(e.partition(p), 0, 100)
            .await
            .unwrap()
        {
            let first = s.layout.log / BLOCK;
            let key = ObjectKey::parse(&s.object_key).unwrap();
            for index in first..=(s.object_size - 1) / BLOCK {
                let start = index * BLOCK;
                let end = (start + BLOCK).min(s.object_size);
                let stored = e.storage.fetch(&key, start..end).await.unwrap();
                let cached = cache
                    .get(&BlockKey::new(s.object_key.as_str(), BLOCK, index))
                    .await;
                assert_eq!(cached, Some(stored), "{} block {index}", s.object_key);
                cached_blocks += 1;
            }
            // The blocks of the `.log` alone are not.
            if first > 0 {
                let log_block = cache
                    .get(&BlockKey::new(s.object_key.as_str(), BLOCK, first - 1))
                    .await;
                assert!(log_block.is_none());
            }
            first_tail_block.insert(s.object_key.clone(), first * BLOCK);
        }
    }
    assert!(
        cached_blocks > first_tail_block.len(),
        "some tails span blocks"
    );
    // A reader from the log start: its GETs of segments are of their `.log` blocks only.
    storage.gets.lock().clear();
    for p in 0..PARTITIONS {
        let mut offset = 0;
        loop {
            let answer = fetcher
                .fetch(
                    &[FetchPartition {
                        partition: e.partition(p),
                        fetch_offset: offset,
                        partition_max_bytes: 400,
                        leader_epoch: 0,
                        isolation: IsolationLevel::ReadCommitted,
                    }],
                    400,
                )
                .await
                .unwrap()
                .remove(0);
            assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
            let records = answer.records_bytes();
            if records.is_empty() {
                break;
            }
            for b in split_batches(records).unwrap() {
                e.expect_batch(p, b.base_offset(), b.as_bytes(), "cached indexes");
                offset = b.base_offset() + i64::from(b.last_offset_delta()) + 1;
            }
        }
        assert_eq!(
            offset,
            e.acked
                .range((p, 0)..(p + 1, 0))
                .next_back()
                .map(|((_, base), b)| base + i64::from(b.last_offset_delta()) + 1)
                .unwrap()
        );
    }
    let gets = storage.gets.lock().clone();
    let segment_gets: Vec<_> = gets
        .iter()
        .filter_map(|(key, range)| first_tail_block.get(key).map(|tail| (key, range, *tail)))
        .collect();
    assert!(!segment_gets.is_empty(), "the .log blocks are read");
    for (key, range, tail) in segment_gets {
        assert!(
            range.end <= tail,
            "{key}: GET {range:?} reaches its cached blocks ({tail})"
        );
    }
    e.writer.close().await;
}

// ---------------------------------------------------------------------------------------------
// The Lifecycle of a host that tiers

/// A host runs the tiering worker in a `Lifecycle` with an orphan collector per prefix: the
/// collector on `wal` and the one on `tiered` each collect their own orphans, each counted on its
/// own and in the sum. Two collectors on one prefix, or a zero interval on the second, are
/// refused.
#[tokio::test(start_paused = true)]
async fn a_lifecycle_runs_an_orphan_collector_per_prefix() {
    use diskless_core::lifecycle::Lifecycle;
    let mut e = env(Backend::Model, topic_config()).await;
    e.produce(6).await;
    // An orphan under each prefix: uploaded, never committed.
    let keys = SeededKeys::new(99);
    let wal_orphan = ObjectKey::generate("wal", &keys, e.clock.as_ref()).unwrap();
    let tiered_orphan = ObjectKey::generate("tiered", &keys, e.clock.as_ref()).unwrap();
    for key in [&wal_orphan, &tiered_orphan] {
        e.storage
            .upload(key, &[Bytes::from_static(b"orphan")])
            .await
            .unwrap();
    }
    e.clock.advance(10 * MINUTE);
    let collector = |prefix: &str| {
        OrphanCollector::new(
            e.coordinator.clone(),
            e.storage.clone(),
            e.clock.clone(),
            OrphanConfig::new(prefix)
                .with_max_commit_age(Duration::from_secs(60))
                .with_recheck_delay(Duration::ZERO)
                .with_full_sweep_interval(Duration::ZERO),
        )
        .unwrap()
    };
    let minute = Duration::from_secs(60);
    let refused = |spawned: Result<_, ConfigError>| match spawned {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("not refused: {other:?}"),
    };
    let twice = Lifecycle::new()
        .orphans(collector("wal"), minute)
        .orphans(collector("wal"), minute)
        .spawn();
    assert_eq!(refused(twice), "orphans");
    let zero = Lifecycle::new()
        .orphans(collector("wal"), minute)
        .orphans(collector("tiered"), Duration::ZERO)
        .spawn();
    assert_eq!(refused(zero), "orphans");

    let (worker, _) = e.worker(&Crash::never());
    let handle = Lifecycle::new()
        .tiering(worker, Duration::from_secs(30))
        .orphans(collector("wal"), minute)
        .orphans(collector("tiered"), minute)
        .spawn()
        .unwrap();
    // Passes at 0 s (suspected) and 60 s (fenced and deleted).
    tokio::time::sleep(Duration::from_secs(61)).await;
    let stats = handle.stats().clone();
    handle.shutdown().await;
    let exists = |key: &ObjectKey| {
        let storage = e.storage.clone();
        let key = key.clone();
        async move { storage.fetch(&key, 0..1).await.is_ok() }
    };
    assert!(!exists(&wal_orphan).await, "the WAL orphan is left");
    assert!(!exists(&tiered_orphan).await, "the tiered orphan is left");
    let (wal, tiered) = (
        stats.orphans_on("wal").unwrap(),
        stats.orphans_on("tiered").unwrap(),
    );
    assert!(wal.passes() >= 2 && tiered.passes() >= 2, "{stats:?}");
    assert_eq!(stats.orphans.passes(), wal.passes() + tiered.passes());
    assert_eq!(stats.orphans.failures(), 0);
    assert!(stats.orphans_on("other").is_none());
    assert!(stats.tiering.passes() >= 2, "{stats:?}");
    assert!(e.tiered_segments().await >= PARTITIONS as usize);
    e.check(false, "lifecycle").await;
    e.writer.close().await;
}
