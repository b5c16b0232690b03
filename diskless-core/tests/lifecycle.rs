//! Lifecycle workers with an injected clock: retention, cleaning after the grace period, orphan
//! collection in two phases, storage faults, and commits racing with the collector.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{BlockKey, LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::*;
use diskless_core::ConfigError;
use diskless_core::lifecycle::{
    CleanerConfig, CommitDeadline, Lifecycle, ObjectCleaner, OrphanCollector, OrphanConfig,
    ProducerExpirer, ProducerExpiryConfig, RetentionConfig, RetentionEnforcer,
};
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, ObjectStoreStorage, StorageError};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultKind, FaultyStorage};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const T0: i64 = 1_700_000_000_000;

/// In-memory storage that counts, per key, the deletes that reached it, and records where each
/// listing started (`None`: from the first key; `Some(k)`: after `k`).
#[derive(Debug)]
struct DeleteLog {
    inner: ObjectStoreStorage,
    deletes: Mutex<HashMap<ObjectKey, u32>>,
    listings: Mutex<Vec<Option<String>>>,
}

impl DeleteLog {
    fn new() -> Arc<Self> {
        Arc::new(DeleteLog {
            inner: ObjectStoreStorage::in_memory(),
            deletes: Mutex::new(HashMap::new()),
            listings: Mutex::new(Vec::new()),
        })
    }

    /// The listings started so far (and forgets them).
    fn take_listings(&self) -> Vec<Option<String>> {
        std::mem::take(&mut *self.listings.lock())
    }

    fn deletes_of(&self, key: &ObjectKey) -> u32 {
        self.deletes.lock().get(key).copied().unwrap_or(0)
    }

    async fn keys(&self) -> BTreeSet<ObjectKey> {
        self.inner
            .list("wal")
            .map_ok(|m| m.key)
            .try_collect()
            .await
            .unwrap()
    }
}

#[async_trait]
impl ObjectStorage for DeleteLog {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await
    }
    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let existing = self.keys().await;
        {
            let mut log = self.deletes.lock();
            for k in keys.iter().filter(|k| existing.contains(*k)) {
                *log.entry(k.clone()).or_default() += 1;
            }
        }
        self.inner.delete(keys).await
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.listings.lock().push(None);
        self.inner.list(prefix)
    }
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.listings.lock().push(Some(offset.to_string()));
        self.inner.list_with_offset(prefix, offset)
    }
}

thread_local! {
    /// Per-test (each test runs on its own thread) sequence of keys, so that the keys, and so the
    /// faults `FaultyStorage` derives from them, are the same on every run.
    static KEY_SEQ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A v7 key dated `ms`, deterministic: its random bits are a per-test sequence number.
fn key_at(ms: i64) -> ObjectKey {
    let n = KEY_SEQ.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    let mut counter = [0u8; 10];
    counter[2..].copy_from_slice(&n.to_be_bytes());
    let uuid = uuid::Builder::from_unix_timestamp_millis(ms as u64, &counter).into_uuid();
    ObjectKey::generate_with_uuid("wal", uuid).unwrap()
}

struct Env {
    clock: Arc<ManualClock>,
    coordinator: Arc<dyn BatchCoordinator>,
    log: Arc<DeleteLog>,
    storage: Arc<dyn ObjectStorage>,
}

impl Env {
    fn new() -> Self {
        let clock = ManualClock::new(T0);
        let log = DeleteLog::new();
        Env {
            coordinator: Arc::new(InMemoryCoordinator::new(clock.clone())),
            storage: log.clone(),
            log,
            clock,
        }
    }

    async fn topic(
        &self,
        id: u128,
        partitions: i32,
        retention_ms: i64,
        retention_bytes: i64,
    ) -> Uuid {
        let topic_id = Uuid::from_u128(id);
        self.coordinator
            .create_topic(CreateTopicRequest {
                topic_id,
                name: format!("t{id}"),
                partitions,
                config: TopicConfig {
                    retention_ms,
                    retention_bytes,
                    ..TopicConfig::default()
                },
            })
            .await
            .unwrap();
        topic_id
    }

    /// Uploads an object dated now with one batch per `(partition, size)` (timestamp now) and
    /// commits it.
    async fn produce(&self, batches: &[(TopicIdPartition, u32)]) -> ObjectKey {
        let key = key_at(self.clock.now_ms());
        let request = upload(&*self.storage, &key, batches, self.clock.now_ms()).await;
        let results = self.coordinator.commit_file(request).await.unwrap();
        assert!(results.iter().all(|r| r.error == ErrorCode::None));
        key
    }

    fn cleaner(&self, grace_ms: u64) -> ObjectCleaner {
        ObjectCleaner::new(
            self.coordinator.clone(),
            self.storage.clone(),
            None,
            self.clock.clone(),
            CleanerConfig::default().with_grace(Duration::from_millis(grace_ms)),
        )
        .unwrap()
    }

    async fn exists(&self, key: &ObjectKey) -> bool {
        self.log.keys().await.contains(key)
    }

    async fn log_start(&self, p: TopicIdPartition) -> i64 {
        self.coordinator
            .list_offsets(&[ListOffsetsRequest {
                partition: p,
                timestamp: EARLIEST_TIMESTAMP,
                isolation: Default::default(),
            }])
            .await
            .unwrap()[0]
            .offset
    }
}

/// Uploads a segment of the given batch sizes under `key`; returns its commit request.
async fn upload(
    storage: &dyn ObjectStorage,
    key: &ObjectKey,
    batches: &[(TopicIdPartition, u32)],
    ts: i64,
) -> CommitFileRequest {
    let mut at = 1u64;
    let mut commit = Vec::new();
    for (p, size) in batches {
        commit.push(CommitBatch {
            partition: *p,
            byte_offset: at,
            byte_size: *size,
            record_count: 1,
            base_timestamp: ts,
            max_timestamp: ts,
            timestamp_type: TimestampType::CreateTime,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            base_sequence: NO_SEQUENCE,
            last_sequence: NO_SEQUENCE,
            transactional: false,
            txn_seq: None,
        });
        at += u64::from(*size);
    }
    storage
        .upload(key, &[Bytes::from(vec![0u8; at as usize])])
        .await
        .unwrap();
    CommitFileRequest {
        object_key: key.as_str().to_string(),
        uploader_broker_id: 1,
        object_size: at,
        owners: vec![0],
        batches: commit,
    }
}

// ---------------------------------------------------------------------------------------------
// Retention and cleaning

#[tokio::test]
async fn retention_by_time_deletes_the_expired_prefix_and_objects_go_after_the_grace() {
    let env = Env::new();
    let t = env.topic(1, 1, 10_000, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let mut keys = Vec::new();
    for _ in 0..4 {
        keys.push(env.produce(&[(p, 100)]).await);
        env.clock.advance(4_000);
    }
    // Now T0+16s: batches at 0, 4, 8, 12 s; older than 10 s: the first two.
    let retention =
        RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default()).unwrap();
    let r = retention.run_pass().await.unwrap();
    assert_eq!(
        (r.batches_deleted, r.bytes_deleted, r.more),
        (2, 200, false)
    );
    assert_eq!(env.log_start(p).await, 2);

    let cleaner = env.cleaner(60_000);
    env.clock.advance(59_999);
    assert_eq!(cleaner.run_pass().await.unwrap().deleted, 0);
    for k in &keys {
        assert!(env.exists(k).await, "deleted before the grace period");
    }
    env.clock.advance(2);
    let r = cleaner.run_pass().await.unwrap();
    assert_eq!((r.deleted, r.bytes_deleted, r.not_deleted), (2, 202, 0));
    assert!(!env.exists(&keys[0]).await && !env.exists(&keys[1]).await);
    assert!(env.exists(&keys[2]).await && env.exists(&keys[3]).await);
    let names: Vec<String> = keys.iter().map(|k| k.as_str().to_string()).collect();
    assert_eq!(
        env.coordinator.known_objects(&names).await.unwrap(),
        names[2..].to_vec()
    );
    // Nothing more to do, and nothing deleted twice.
    assert_eq!(cleaner.run_pass().await.unwrap().offered, 0);
    for k in &keys[..2] {
        assert_eq!(env.log.deletes_of(k), 1);
    }
}

#[tokio::test]
async fn retention_by_size_keeps_the_newest_batches_at_or_above_the_limit() {
    let env = Env::new();
    let t = env.topic(1, 2, -1, 250).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let mut keys = Vec::new();
    for _ in 0..5 {
        keys.push(env.produce(&[(p0, 100)]).await);
    }
    let other = env.produce(&[(p1, 100)]).await;
    let retention =
        RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default()).unwrap();
    let r = retention.run_pass().await.unwrap();
    // 500 bytes: dropping 100 leaves 400, then 300 (>= 250); dropping a third would leave 200.
    assert_eq!((r.batches_deleted, r.bytes_deleted), (2, 200));
    assert_eq!(env.log_start(p0).await, 2);
    assert_eq!(env.log_start(p1).await, 0);
    env.clock.advance(60_001);
    let r = env.cleaner(60_000).run_pass().await.unwrap();
    assert_eq!(r.deleted, 2);
    let stored = env.log.keys().await;
    let expected: BTreeSet<ObjectKey> = keys[2..].iter().cloned().chain([other]).collect();
    assert_eq!(stored, expected);
}

#[tokio::test]
async fn an_object_stays_until_its_last_live_batch_is_gone() {
    let env = Env::new();
    let t = env.topic(1, 2, -1, -1).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let shared = env.produce(&[(p0, 100), (p1, 50)]).await;
    let cleaner = env.cleaner(60_000);
    let delete = |p: TopicIdPartition| {
        let c = env.coordinator.clone();
        async move {
            c.delete_records(&[DeleteRecordsRequest {
                partition: p,
                offset: -1,
            }])
            .await
            .unwrap()
        }
    };
    delete(p0).await;
    env.clock.advance(3_600_000);
    assert_eq!(cleaner.run_pass().await.unwrap().offered, 0);
    assert!(env.exists(&shared).await);
    // The last live batch goes: the grace period starts now.
    delete(p1).await;
    env.clock.advance(60_000);
    assert_eq!(cleaner.run_pass().await.unwrap().deleted, 0);
    assert!(env.exists(&shared).await);
    env.clock.advance(1);
    assert_eq!(cleaner.run_pass().await.unwrap().deleted, 1);
    assert!(!env.exists(&shared).await);
    assert_eq!(
        env.coordinator.object_info(shared.as_str()).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn retention_passes_are_capped_and_resume() {
    let env = Env::new();
    let t = env.topic(1, 3, 1_000, -1).await;
    for i in 0..60 {
        env.produce(&[(TopicIdPartition::new(t, i % 3), 10)]).await;
    }
    env.clock.advance(5_000);
    let retention = RetentionEnforcer::new(
        env.coordinator.clone(),
        RetentionConfig::default()
            .with_max_batches_per_call(7)
            .with_max_calls_per_pass(3),
    )
    .unwrap();
    let r = retention.run_pass().await.unwrap();
    assert_eq!((r.calls, r.batches_deleted, r.more), (3, 21, true));
    let r = retention.run_pass().await.unwrap();
    assert_eq!((r.batches_deleted, r.more), (21, true));
    let r = retention.run_pass().await.unwrap();
    assert_eq!((r.batches_deleted, r.more), (18, false));
    assert_eq!(retention.run_pass().await.unwrap().batches_deleted, 0);
    // The cleaner works in rounds of its batch size too.
    env.clock.advance(60_001);
    let cleaner = ObjectCleaner::new(
        env.coordinator.clone(),
        env.storage.clone(),
        None,
        env.clock.clone(),
        CleanerConfig::default()
            .with_batch_size(8)
            .with_max_rounds_per_pass(5),
    )
    .unwrap();
    let r = cleaner.run_pass().await.unwrap();
    assert_eq!((r.rounds, r.deleted), (5, 40));
    let r = cleaner.run_pass().await.unwrap();
    assert_eq!(r.deleted, 20);
    assert!(env.log.keys().await.is_empty());
}

#[tokio::test]
async fn cleaning_drops_the_cached_blocks_of_deleted_objects() {
    let env = Env::new();
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let dead = env.produce(&[(p, 100)]).await;
    let live = env.produce(&[(p, 100)]).await;
    let cache = Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
    for k in [&dead, &live] {
        cache
            .insert(
                BlockKey::new(k.as_str(), 4096, 0),
                Bytes::from_static(b"block"),
            )
            .await;
    }
    env.coordinator
        .delete_records(&[DeleteRecordsRequest {
            partition: p,
            offset: 1,
        }])
        .await
        .unwrap();
    env.clock.advance(60_001);
    let cleaner = ObjectCleaner::new(
        env.coordinator.clone(),
        env.storage.clone(),
        Some(cache.clone()),
        env.clock.clone(),
        CleanerConfig::default(),
    )
    .unwrap();
    assert_eq!(cleaner.run_pass().await.unwrap().deleted, 1);
    cache.run_pending_tasks().await;
    assert!(
        cache
            .get(&BlockKey::new(dead.as_str(), 4096, 0))
            .await
            .is_none()
    );
    assert!(
        cache
            .get(&BlockKey::new(live.as_str(), 4096, 0))
            .await
            .is_some()
    );
}

/// Random produce / retention / DeleteRecords with a store failing deletes at `rate`: every
/// referenced object stays, everything unreferenced goes eventually, each exactly once.
/// Returns (objects deleted, delete faults injected).
async fn cleaning_under_faults(seed: u64, rate: f64, ops: Vec<(u8, u8)>) -> (usize, usize) {
    let clock = ManualClock::new(T0);
    let log = DeleteLog::new();
    let faulty = Arc::new(FaultyStorage::new(
        log.clone() as Arc<dyn ObjectStorage>,
        FaultConfig::default()
            .with_seed(seed)
            .with_delete_failure_rate(rate),
    ));
    let env = Env {
        coordinator: Arc::new(InMemoryCoordinator::new(clock.clone())),
        storage: faulty.clone(),
        log: log.clone(),
        clock: clock.clone(),
    };
    let t = env.topic(1, 3, 20_000, 400).await;
    let cleaner = ObjectCleaner::new(
        env.coordinator.clone(),
        env.storage.clone(),
        None,
        clock.clone(),
        CleanerConfig::default()
            .with_batch_size(3)
            .with_max_rounds_per_pass(2),
    )
    .unwrap();
    let retention =
        RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default()).unwrap();
    let mut all = Vec::new();
    for (op, arg) in ops {
        match op % 5 {
            0 | 1 => {
                let p = TopicIdPartition::new(t, i32::from(arg % 3));
                let q = TopicIdPartition::new(t, i32::from((arg / 3) % 3));
                all.push(env.produce(&[(p, 60), (q, 40)]).await);
            }
            2 => {
                let p = TopicIdPartition::new(t, i32::from(arg % 3));
                let hw = env
                    .coordinator
                    .list_offsets(&[ListOffsetsRequest {
                        partition: p,
                        timestamp: LATEST_TIMESTAMP,
                        isolation: Default::default(),
                    }])
                    .await
                    .unwrap()[0]
                    .offset;
                env.coordinator
                    .delete_records(&[DeleteRecordsRequest {
                        partition: p,
                        offset: (hw - 1).max(0),
                    }])
                    .await
                    .unwrap();
            }
            3 => {
                retention.run_pass().await.unwrap();
            }
            _ => {
                clock.advance(i64::from(arg) * 500);
                cleaner.run_pass().await.unwrap();
            }
        }
        assert_referenced_exist(&env, t, 3).await;
    }
    // Drain: everything expires, the cleaner keeps retrying until storage cooperated.
    clock.advance(3_600_000);
    retention.run_pass().await.unwrap();
    clock.advance(60_001);
    for _ in 0..200 {
        cleaner.run_pass().await.unwrap();
    }
    assert_referenced_exist(&env, t, 3).await;
    let stored = log.keys().await;
    for k in &all {
        let known = !env
            .coordinator
            .known_objects(&[k.as_str().to_string()])
            .await
            .unwrap()
            .is_empty();
        let info = env.coordinator.object_info(k.as_str()).await.unwrap();
        let live = info.as_ref().is_some_and(|i| i.live_bytes > 0);
        if live {
            assert!(stored.contains(k));
        } else {
            assert!(
                !stored.contains(k),
                "dead object {k} still stored (known: {known})"
            );
            assert!(!known, "deleted object {k} still known");
            assert_eq!(
                log.deletes_of(k),
                1,
                "object {k} deleted {} times",
                log.deletes_of(k)
            );
        }
    }
    let deleted = all.iter().filter(|k| !stored.contains(*k)).count();
    (deleted, faulty.fault_count(FaultKind::Fail))
}

/// Every object some live batch points to is in storage.
async fn assert_referenced_exist(env: &Env, t: Uuid, partitions: i32) {
    let stored = env.log.keys().await;
    for i in 0..partitions {
        let p = TopicIdPartition::new(t, i);
        let start = env.log_start(p).await;
        let found = env
            .coordinator
            .find_batches(
                &[FindBatchesRequest {
                    partition: p,
                    offset: start,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                }],
                u32::MAX,
            )
            .await
            .unwrap();
        for b in &found[0].batches {
            assert!(
                stored.contains(&ObjectKey::parse(&b.object_key).unwrap()),
                "referenced object {} was deleted",
                b.object_key
            );
        }
    }
}

#[tokio::test]
async fn storage_faults_during_cleaning_are_retried_and_lose_nothing() {
    let ops: Vec<(u8, u8)> = (0..80u8)
        .map(|i| (i.wrapping_mul(7) % 5, i.wrapping_mul(13)))
        .collect();
    let (deleted, faults) = cleaning_under_faults(1, 0.5, ops).await;
    assert!(deleted >= 10, "only {deleted} objects deleted");
    assert!(faults >= 5, "only {faults} faults injected");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn cleaning_under_random_faults_loses_nothing(
        seed in any::<u64>(),
        rate in prop_oneof![Just(0.0), Just(0.3), Just(0.8)],
        ops in prop::collection::vec((any::<u8>(), any::<u8>()), 1..60),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async { cleaning_under_faults(seed, rate, ops).await; });
    }
}

// ---------------------------------------------------------------------------------------------
// Orphans

const M: i64 = 300_000; // max commit age (fence and collector)
const RECHECK: i64 = 120_000;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

fn collector(env: &Env, coordinator: Arc<dyn BatchCoordinator>) -> OrphanCollector {
    OrphanCollector::new(
        coordinator,
        env.storage.clone(),
        env.clock.clone(),
        OrphanConfig::new("wal")
            .with_max_commit_age(Duration::from_millis(M as u64))
            .with_recheck_delay(Duration::from_millis(RECHECK as u64)),
    )
    .unwrap()
}

/// `ObjectStoreStorage` stamps `last_modified` with the real time, and the collector dates an object
/// by the later of its key time and its listing time. Tests run the manual clock a few seconds ahead
/// of real time, so that key times (from the manual clock) are the later ones and exact.
#[allow(clippy::disallowed_methods)] // The store's real-time dates are what it is about.
fn real_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 10_000
}

#[tokio::test]
async fn orphans_are_collected_in_two_phases() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let orphan = key_at(env.clock.now_ms());
    upload(&*env.storage, &orphan, &[(p, 10)], 0).await;
    let committed = env.produce(&[(p, 10)]).await;
    let undatable =
        ObjectKey::generate_with_uuid("wal", uuid::Builder::from_random_bytes([7; 16]).into_uuid())
            .unwrap();
    upload(&*env.storage, &undatable, &[(p, 10)], 0).await;
    let c = collector(&env, env.coordinator.clone());

    // Young: not even a candidate.
    let r = c.run_pass().await.unwrap();
    assert_eq!(
        (r.listed, r.too_young, r.undatable, r.new_suspects),
        (3, 2, 1, 0)
    );
    // Old enough: phase 1 suspects the orphan only.
    env.clock.advance(M + 60_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.new_suspects, r.deleted), (1, 1, 0));
    assert_eq!(c.suspects().await, vec![orphan.clone()]);
    // Before the recheck delay: still waiting.
    env.clock.advance(RECHECK - 1);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.deleted, r.waiting), (0, 1));
    // Phase 2: deleted.
    env.clock.advance(1);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.deleted, r.waiting), (1, 0));
    let stored = env.log.keys().await;
    assert!(!stored.contains(&orphan));
    assert!(stored.contains(&committed) && stored.contains(&undatable));
    // Much later: committed and undatable objects are never collected.
    env.clock.advance(100 * M);
    for _ in 0..3 {
        c.run_pass().await.unwrap();
        env.clock.advance(RECHECK);
    }
    let stored = env.log.keys().await;
    assert!(stored.contains(&committed) && stored.contains(&undatable));
    assert_eq!(env.log.deletes_of(&orphan), 1);
}

#[tokio::test]
async fn listing_failures_and_delete_failures_are_retried() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let faulty = Arc::new(FaultyStorage::new(
        env.log.clone() as Arc<dyn ObjectStorage>,
        FaultConfig::default()
            .with_seed(3)
            .with_delete_failure_rate(0.7)
            .with_list_failure_rate(0.5),
    ));
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let mut orphans = Vec::new();
    for _ in 0..5 {
        let k = key_at(env.clock.now_ms());
        upload(&*env.storage, &k, &[(p, 10)], 0).await;
        orphans.push(k);
        env.clock.advance(1);
    }
    let committed = env.produce(&[(p, 10)]).await;
    let c = OrphanCollector::new(
        env.coordinator.clone(),
        faulty.clone(),
        env.clock.clone(),
        OrphanConfig::new("wal")
            .with_max_commit_age(Duration::from_millis(M as u64))
            .with_recheck_delay(Duration::from_millis(RECHECK as u64)),
    )
    .unwrap();
    env.clock.advance(M + 1_000);
    let mut failures = 0;
    for _ in 0..60 {
        if c.run_pass().await.is_err() {
            failures += 1;
        }
        env.clock.advance(RECHECK);
    }
    assert!(failures > 0);
    let stored = env.log.keys().await;
    assert_eq!(stored, BTreeSet::from([committed]));
    for k in &orphans {
        assert_eq!(env.log.deletes_of(k), 1);
    }
}

/// A collector over `coordinator` and `storage` with the test's ages and `config` adjustments.
fn collector_with(
    env: &Env,
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
    adjust: impl FnOnce(&mut OrphanConfig),
) -> OrphanCollector {
    let mut config = OrphanConfig::new("wal")
        .with_max_commit_age(Duration::from_millis(M as u64))
        .with_recheck_delay(Duration::from_millis(RECHECK as u64));
    adjust(&mut config);
    OrphanCollector::new(coordinator, storage, env.clock.clone(), config).unwrap()
}

/// `n` objects dated now (1 ms apart, so in key order as created): every third an orphan (uploaded
/// only), the others committed. Returns (orphans, committed).
async fn mixed(env: &Env, p: TopicIdPartition, n: usize) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
    let (mut orphans, mut committed) = (Vec::new(), Vec::new());
    for i in 0..n {
        if i % 3 == 0 {
            let k = key_at(env.clock.now_ms());
            upload(&*env.storage, &k, &[(p, 10)], 0).await;
            orphans.push(k);
        } else {
            committed.push(env.produce(&[(p, 10)]).await);
        }
        env.clock.advance(1);
    }
    (orphans, committed)
}

/// Storage whose listings stall for good after `n` objects while `stall_after` is `Some(n)`.
#[derive(Debug)]
struct StallingListing {
    inner: Arc<dyn ObjectStorage>,
    stall_after: Mutex<Option<usize>>,
}

#[async_trait]
impl ObjectStorage for StallingListing {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await
    }
    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.inner.delete(keys).await
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        match *self.stall_after.lock() {
            Some(n) => Box::pin(
                self.inner
                    .list(prefix)
                    .take(n)
                    .chain(futures::stream::pending()),
            ),
            None => self.inner.list(prefix),
        }
    }
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list_with_offset(prefix, offset)
    }
}

/// A pass cancelled midway (here while its listing stalls, after it handled a first page) leaves
/// the collector consistent: the next pass resumes the same cycle after that page, so the
/// suspects the cancelled pass found are kept and collected, and nothing else is lost.
#[tokio::test]
async fn a_cancelled_orphan_pass_keeps_its_cycle_and_its_suspects() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let mut orphans = Vec::new();
    for _ in 0..5 {
        let k = key_at(env.clock.now_ms());
        env.storage
            .upload(&k, &[Bytes::from_static(b"orphan")])
            .await
            .unwrap();
        orphans.push(k);
        env.clock.advance(1);
    }
    let storage = Arc::new(StallingListing {
        inner: env.storage.clone(),
        stall_after: Mutex::new(Some(3)),
    });
    let c = collector_with(&env, env.coordinator.clone(), storage.clone(), |c| {
        c.known_batch = 2;
    });
    env.clock.advance(M + 1_000);
    // The first page (two keys) is handled, then the listing stalls: the pass is given up.
    let cancelled = tokio::time::timeout(Duration::from_millis(200), c.run_pass()).await;
    assert!(cancelled.is_err(), "the pass should have stalled");
    assert_eq!(c.suspects().await, orphans[..2].to_vec());

    // The next pass resumes after the first page, ends the same cycle, and keeps its suspects.
    *storage.stall_after.lock() = None;
    env.clock.advance(RECHECK);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.listed, r.new_suspects, r.dropped), (3, 3, 0), "{r:?}");
    assert!(r.cycle_complete);
    assert_eq!(c.suspects().await, orphans);
    // A new cycle: the first two are due and collected; the others when they are due too.
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.deleted, r.waiting), (2, 3), "{r:?}");
    env.clock.advance(RECHECK);
    assert_eq!(c.run_pass().await.unwrap().deleted, 3);
    assert!(env.log.keys().await.is_empty());
}

/// Issue #12 item 9: a pass lists at most `max_listed_per_pass` objects and the next one resumes
/// after the greatest key it handled; a cycle lists every object once, then starts over.
#[tokio::test]
async fn orphan_passes_are_capped_and_resume_after_the_greatest_key() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let (orphans, committed) = mixed(&env, p, 60).await;
    let mut all: Vec<ObjectKey> = orphans.iter().chain(&committed).cloned().collect();
    all.sort();
    let c = collector_with(&env, env.coordinator.clone(), env.storage.clone(), |c| {
        c.known_batch = 4;
        c.max_listed_per_pass = 25;
    });
    env.clock.advance(M + 1_000);
    env.log.take_listings();
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(c.run_pass().await.unwrap());
    }
    assert_eq!(
        first
            .iter()
            .map(|r| (r.listed, r.cycle_complete))
            .collect::<Vec<_>>(),
        [(25, false), (25, false), (10, true)]
    );
    assert_eq!(
        env.log.take_listings(),
        [
            None,
            Some(all[24].as_str().to_string()),
            Some(all[49].as_str().to_string())
        ]
    );
    assert_eq!(first.iter().map(|r| r.new_suspects).sum::<u64>(), 20);
    assert_eq!(first.iter().map(|r| r.known).sum::<u64>(), 40);
    assert_eq!(c.suspects().await.len(), 20);

    // Later cycles start from the first key again and delete the orphans, and only them.
    let mut deleted = 0;
    for _ in 0..12 {
        env.clock.advance(RECHECK);
        let r = c.run_pass().await.unwrap();
        assert!(r.listed <= 25, "{r:?}");
        deleted += r.deleted;
        let stored = env.log.keys().await;
        assert!(committed.iter().all(|k| stored.contains(k)));
    }
    assert_eq!(env.log.take_listings()[0], None);
    assert_eq!(deleted, 20);
    let expected: BTreeSet<ObjectKey> = committed.iter().cloned().collect();
    assert_eq!(env.log.keys().await, expected);
    for k in &orphans {
        assert_eq!(env.log.deletes_of(k), 1);
    }
}

/// Issue #12 item 9: the collector does not ask the coordinator again and again about objects it
/// found known; it asks about each once when it becomes old enough, and again at each full sweep.
#[tokio::test]
async fn known_objects_are_asked_about_once_until_the_next_full_sweep() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    for _ in 0..10 {
        env.produce(&[(p, 10)]).await;
    }
    let orphan = key_at(env.clock.now_ms());
    upload(&*env.storage, &orphan, &[(p, 10)], 0).await;
    let gate = new_gate(env.coordinator.clone());
    let c = collector_with(&env, gate.clone(), env.storage.clone(), |c| {
        c.full_sweep_interval = Duration::from_secs(3600);
    });
    env.clock.advance(M + 1_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.new_suspects, r.settled), (10, 1, 0));
    assert_eq!(gate.take_asked(), 11);
    // The known objects are settled; only the suspect is asked about again (phase 2).
    env.clock.advance(RECHECK);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled, r.deleted), (0, 10, 1));
    assert_eq!(gate.take_asked(), 1);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled), (0, 10));
    assert_eq!(gate.take_asked(), 0);
    // An object committed later is asked about once, when it becomes old enough.
    let late = env.produce(&[(p, 10)]).await;
    env.clock.advance(M + 1_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled), (1, 10));
    assert_eq!(gate.take_asked(), 1);
    env.clock.advance(RECHECK);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled), (0, 11));
    assert_eq!(gate.take_asked(), 0);
    // A full sweep asks about everything once more.
    env.clock.advance(3_600_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled), (11, 0));
    assert_eq!(gate.take_asked(), 11);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.settled), (0, 11));
    assert_eq!(gate.take_asked(), 0);
    assert!(env.exists(&late).await);
    assert!(!env.exists(&orphan).await);
}

/// Issue #12 item 9: the suspects are bounded by `max_suspects`; the other orphans wait for room and
/// are collected in later passes.
#[tokio::test]
async fn suspects_are_bounded_and_the_other_orphans_wait_for_room() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let (orphans, committed) = mixed(&env, p, 24).await;
    assert_eq!(orphans.len(), 8);
    let c = collector_with(&env, env.coordinator.clone(), env.storage.clone(), |c| {
        c.max_suspects = 3;
    });
    env.clock.advance(M + 1_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.new_suspects, r.deferred, r.waiting), (3, 5, 3));
    let mut deleted = r.deleted;
    for _ in 0..6 {
        env.clock.advance(RECHECK);
        let r = c.run_pass().await.unwrap();
        assert!(r.waiting <= 3 && r.new_suspects <= 3, "{r:?}");
        deleted += r.deleted;
    }
    assert_eq!(deleted, 8);
    let expected: BTreeSet<ObjectKey> = committed.iter().cloned().collect();
    assert_eq!(env.log.keys().await, expected);
    for k in &orphans {
        assert_eq!(env.log.deletes_of(k), 1);
    }
}

/// A suspect is forgotten when a cycle completes without listing it, not before.
#[tokio::test]
async fn a_suspect_is_forgotten_when_a_completed_cycle_did_not_list_it() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let a = key_at(env.clock.now_ms());
    upload(&*env.storage, &a, &[(p, 10)], 0).await;
    env.clock.advance(1);
    let b = key_at(env.clock.now_ms());
    upload(&*env.storage, &b, &[(p, 10)], 0).await;
    let c = collector_with(&env, env.coordinator.clone(), env.storage.clone(), |c| {
        c.max_listed_per_pass = 1;
    });
    env.clock.advance(M + 1_000);
    let listed: Vec<(u64, bool)> = [
        c.run_pass().await.unwrap(),
        c.run_pass().await.unwrap(),
        c.run_pass().await.unwrap(),
    ]
    .iter()
    .map(|r| (r.listed, r.cycle_complete))
    .collect();
    assert_eq!(listed, [(1, false), (1, false), (0, true)]);
    assert_eq!(c.suspects().await, [a.clone(), b.clone()]);
    // Someone else deletes `a` (its writer, late). The next cycle lists `b` only.
    env.storage.delete(std::slice::from_ref(&a)).await.unwrap();
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.listed, r.cycle_complete, r.dropped), (1, false, 0));
    assert_eq!(c.suspects().await, [a.clone(), b.clone()]);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.listed, r.cycle_complete, r.dropped), (0, true, 1));
    assert_eq!(c.suspects().await, [b]);
}

/// Storage that lists in reverse key order (a local filesystem lists in no particular order).
#[derive(Debug)]
struct Reversed(Arc<DeleteLog>);

#[async_trait]
impl ObjectStorage for Reversed {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.0.upload(key, payload).await
    }
    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.0.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.0.delete(keys).await
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        use futures::{StreamExt, TryFutureExt};
        async move {
            let mut all: Vec<ObjectMeta> = self.0.list(prefix).try_collect().await?;
            all.reverse();
            Ok(futures::stream::iter(all.into_iter().map(Ok)))
        }
        .try_flatten_stream()
        .boxed()
    }
}

/// Over a store that does not list in key order, a cursor would skip keys: the collector notices
/// and lists to the end in every pass, so no orphan is missed.
#[tokio::test]
async fn an_unordered_listing_is_listed_to_the_end_and_no_orphan_is_missed() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let (orphans, committed) = mixed(&env, p, 15).await;
    let storage: Arc<dyn ObjectStorage> = Arc::new(Reversed(env.log.clone()));
    let c = collector_with(&env, env.coordinator.clone(), storage, |c| {
        c.max_listed_per_pass = 3;
    });
    env.clock.advance(M + 1_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.listed, r.cycle_complete, r.new_suspects), (15, true, 5));
    env.clock.advance(RECHECK);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.listed, r.cycle_complete, r.deleted), (15, true, 5));
    let expected: BTreeSet<ObjectKey> = committed.iter().cloned().collect();
    assert_eq!(env.log.keys().await, expected);
    for k in &orphans {
        assert_eq!(env.log.deletes_of(k), 1);
    }
}

/// A coordinator layer whose commits wait at a gate until released (a commit in flight), and
/// that counts the keys the orphan collector asks about.
#[derive(Debug, Default)]
struct GateLayer {
    waiting: Mutex<BTreeMap<String, Arc<tokio::sync::Notify>>>,
    /// Keys passed to `known_objects` and `fence_orphans`.
    asked: std::sync::atomic::AtomicU64,
}

/// A coordinator behind a [`GateLayer`]; its controls are the layer's (through `Deref`).
type Gate = Layered<GateLayer>;

fn new_gate(inner: Arc<dyn BatchCoordinator>) -> Arc<Gate> {
    Arc::new(Layered::new(inner, GateLayer::default()))
}

impl GateLayer {
    /// The keys asked about since the last call.
    fn take_asked(&self) -> u64 {
        self.asked.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    fn is_waiting(&self, key: &str) -> bool {
        self.waiting.lock().contains_key(key)
    }

    fn release(&self, key: &str) {
        if let Some(n) = self.waiting.lock().get(key) {
            n.notify_one();
        }
    }
}

#[async_trait]
impl CoordinatorLayer for GateLayer {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        r: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        let notify = Arc::new(tokio::sync::Notify::new());
        self.waiting
            .lock()
            .insert(r.object_key.clone(), notify.clone());
        notify.notified().await;
        self.waiting.lock().remove(&r.object_key);
        inner.commit_file(r).await
    }

    async fn fence_orphans(
        &self,
        inner: &dyn BatchCoordinator,
        k: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        self.asked
            .fetch_add(k.len() as u64, std::sync::atomic::Ordering::Relaxed);
        inner.fence_orphans(k).await
    }

    async fn known_objects(
        &self,
        inner: &dyn BatchCoordinator,
        k: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        self.asked
            .fetch_add(k.len() as u64, std::sync::atomic::Ordering::Relaxed);
        inner.known_objects(k).await
    }
}

async fn until(cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never met");
}

#[tokio::test]
async fn a_commit_in_flight_while_the_collector_runs_is_never_deleted() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    // The writer's path: fence, then the (slow) coordinator.
    let gate = new_gate(env.coordinator.clone());
    let fenced: Arc<dyn BatchCoordinator> = Arc::new(CommitDeadline::new(
        gate.clone(),
        env.clock.clone(),
        Duration::from_millis(M as u64),
    ));
    let key = key_at(env.clock.now_ms());
    let request = upload(&*env.storage, &key, &[(p, 10)], env.clock.now_ms()).await;
    env.clock.advance(M - 1_000); // the commit starts just inside the deadline
    let commit = tokio::spawn({
        let fenced = fenced.clone();
        async move { fenced.commit_file(request).await }
    });
    until(|| gate.is_waiting(key.as_str())).await;

    // The commit is stuck in the coordinator; the object is now old enough and unknown.
    env.clock.advance(2_000);
    let c = collector(&env, env.coordinator.clone());
    let r = c.run_pass().await.unwrap();
    assert_eq!(r.new_suspects, 1);
    // The commit lands before the second check...
    env.clock.advance(RECHECK / 2);
    gate.release(key.as_str());
    let results = commit.await.unwrap().unwrap();
    assert_eq!(results[0].error, ErrorCode::None);
    // ...so the second check finds it known and leaves it.
    env.clock.advance(RECHECK);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.deleted, r.known, r.waiting), (0, 1, 0));
    assert!(env.exists(&key).await);
    assert_eq!(env.log.deletes_of(&key), 0);
}

#[tokio::test]
async fn a_commit_reaching_the_fence_too_late_is_refused_and_the_orphan_collected() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let fenced: Arc<dyn BatchCoordinator> = Arc::new(CommitDeadline::new(
        env.coordinator.clone(),
        env.clock.clone(),
        Duration::from_millis(M as u64),
    ));
    let key = key_at(env.clock.now_ms());
    let request = upload(&*env.storage, &key, &[(p, 10)], env.clock.now_ms()).await;
    let c = collector(&env, env.coordinator.clone());
    env.clock.advance(M + 1);
    assert_eq!(c.run_pass().await.unwrap().new_suspects, 1);
    env.clock.advance(RECHECK);
    assert_eq!(c.run_pass().await.unwrap().deleted, 1);
    // The writer wakes up and commits: refused, as certainly not applied.
    let err = fenced.commit_file(request).await.unwrap_err();
    assert!(
        matches!(err, CoordinatorError::DeadlineExceeded(_)) && err.certainly_not_applied(),
        "{err:?}"
    );
    assert!(
        env.coordinator
            .known_objects(&[key.as_str().to_string()])
            .await
            .unwrap()
            .is_empty()
    );
}

/// Issue #12 item 1 at the collector: a commit that passed every check on the broker stalls on its
/// way to the coordinator past both of the collector's checks. The collector fences the key before
/// deleting the object, so the late commit is refused (certainly not applied) instead of
/// registering an object that is gone. Here the collector's `max_commit_age` (5 min) is even below
/// the coordinator's deadline (10 min): no timing assumption is left.
#[tokio::test]
async fn a_commit_stalled_past_the_second_check_is_refused_by_the_fence() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let gate = new_gate(env.coordinator.clone());
    let key = key_at(env.clock.now_ms());
    let request = upload(&*env.storage, &key, &[(p, 10)], env.clock.now_ms()).await;
    let commit = tokio::spawn({
        let gate = gate.clone();
        async move { gate.commit_file(request).await }
    });
    until(|| gate.is_waiting(key.as_str())).await;
    let c = collector(&env, env.coordinator.clone());
    env.clock.advance(M + 1_000);
    assert_eq!(c.run_pass().await.unwrap().new_suspects, 1);
    env.clock.advance(RECHECK);
    assert_eq!(c.run_pass().await.unwrap().deleted, 1);
    assert!(!env.exists(&key).await);
    // The stalled commit reaches the coordinator, still within its deadline: refused.
    gate.release(key.as_str());
    let err = commit.await.unwrap().unwrap_err();
    assert!(
        matches!(err, CoordinatorError::ObjectFenced(_)) && err.certainly_not_applied(),
        "{err:?}"
    );
    assert!(
        env.coordinator
            .known_objects(&[key.as_str().to_string()])
            .await
            .unwrap()
            .is_empty()
    );
}

/// One step of a random schedule of writers and the collector.
#[derive(Clone, Debug)]
enum Event {
    /// A writer uploads an object whose key was made `age` ms ago.
    Upload { age: i64 },
    /// A writer starts committing its n-th pending object (through the fence).
    StartCommit(usize),
    /// The n-th commit in flight reaches the coordinator (any time after it started).
    Land(usize),
    /// Time passes (at most 90 s a step).
    Advance(i64),
    /// A collector pass.
    Collect,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        2 => (0i64..2 * M).prop_map(|age| Event::Upload { age }),
        2 => (0usize..8).prop_map(Event::StartCommit),
        2 => (0usize..8).prop_map(Event::Land),
        3 => (1i64..90_000).prop_map(Event::Advance),
        3 => Just(Event::Collect),
    ]
}

async fn race(events: Vec<Event>) {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let gate = new_gate(env.coordinator.clone());
    let fenced: Arc<dyn BatchCoordinator> = Arc::new(CommitDeadline::new(
        gate.clone(),
        env.clock.clone(),
        Duration::from_millis(M as u64),
    ));
    let c = collector(&env, env.coordinator.clone());
    let mut pending: Vec<(ObjectKey, CommitFileRequest)> = Vec::new();
    type Flight = (
        ObjectKey,
        tokio::task::JoinHandle<Result<Vec<CommitBatchResult>, CoordinatorError>>,
    );
    let mut in_flight: Vec<Flight> = Vec::new();
    let mut committed: Vec<ObjectKey> = Vec::new();

    async fn land(gate: &Gate, env: &Env, f: Flight, committed: &mut Vec<ObjectKey>) {
        let (key, handle) = f;
        gate.release(key.as_str());
        match handle.await.unwrap() {
            Ok(_) => committed.push(key),
            Err(e) => {
                // The writer deletes an object whose commit certainly failed.
                assert!(!matches!(e, CoordinatorError::OutcomeUnknown(_)));
                env.storage.delete(&[key]).await.unwrap();
            }
        }
    }

    for e in events {
        match e {
            Event::Upload { age } => {
                let key = key_at(env.clock.now_ms() - age);
                let request = upload(&*env.storage, &key, &[(p, 10)], env.clock.now_ms()).await;
                pending.push((key, request));
            }
            Event::StartCommit(i) if !pending.is_empty() => {
                let (key, request) = pending.remove(i % pending.len());
                let fenced = fenced.clone();
                let handle = tokio::spawn(async move { fenced.commit_file(request).await });
                // Either it reaches the coordinator (in flight) or the fence refuses it.
                until(|| gate.is_waiting(key.as_str()) || handle.is_finished()).await;
                if handle.is_finished() {
                    land(&gate, &env, (key, handle), &mut committed).await;
                } else {
                    in_flight.push((key, handle));
                }
            }
            Event::Land(i) if !in_flight.is_empty() => {
                let f = in_flight.remove(i % in_flight.len());
                land(&gate, &env, f, &mut committed).await;
            }
            Event::Advance(ms) => {
                // Commits in flight stay there, however long: nothing bounds how long a commit
                // call takes (the fence, not a delay, keeps the collector safe).
                env.clock.advance(ms);
            }
            Event::Collect => {
                c.run_pass().await.unwrap();
            }
            _ => {}
        }
        let stored = env.log.keys().await;
        for k in &committed {
            assert!(stored.contains(k), "committed object {k} was deleted");
        }
    }
    for f in in_flight.drain(..) {
        land(&gate, &env, f, &mut committed).await;
    }
    let stored = env.log.keys().await;
    for k in &committed {
        assert!(stored.contains(k), "committed object {k} was deleted");
    }
    // Pending uploads never committed are orphans: collected eventually. This store dates objects
    // by real time, far behind the manual clock, so an upload with an old key looks as if it had
    // been there since long before the collector's last clean cycle, which skips it (a real store
    // dates it by its upload): the next full sweep finds it.
    env.clock
        .advance(2 * M + 1 + millis(OrphanConfig::new("wal").full_sweep_interval));
    c.run_pass().await.unwrap();
    env.clock.advance(RECHECK);
    c.run_pass().await.unwrap();
    let stored = env.log.keys().await;
    let expected: BTreeSet<ObjectKey> = committed.iter().cloned().collect();
    assert_eq!(stored, expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn commits_racing_with_the_collector_are_never_deleted(events in prop::collection::vec(event(), 1..80)) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(race(events));
    }
}

// ---------------------------------------------------------------------------------------------
// The runner

#[tokio::test(start_paused = true)]
async fn lifecycle_runs_every_worker_on_its_interval_until_shutdown() {
    let env = Env::new();
    let t = env.topic(1, 1, 1_000, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let key = env.produce(&[(p, 10)]).await;
    env.clock.advance(61_001 + 1_000);
    let handle = Lifecycle::new()
        .retention(
            RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default()).unwrap(),
            Duration::from_secs(10),
        )
        .cleaner(env.cleaner(0), Duration::from_secs(10))
        .orphans(
            collector(&env, env.coordinator.clone()),
            Duration::from_secs(60),
        )
        .spawn()
        .unwrap();
    // The manual clock moves on while the workers run: the object is marked, then old enough.
    tokio::time::sleep(Duration::from_secs(15)).await;
    env.clock.advance(1);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let stats = handle.stats().clone();
    assert!(stats.retention.passes() >= 3, "{stats:?}");
    assert!(stats.cleaner.passes() >= 3);
    assert!(stats.orphans.passes() >= 1);
    assert_eq!(stats.retention.failures() + stats.cleaner.failures(), 0);
    handle.shutdown().await;
    let passes = stats.cleaner.passes();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        stats.cleaner.passes(),
        passes,
        "a worker ran after shutdown"
    );
    // The retention pass and the cleaner did their job.
    assert!(!env.exists(&key).await);
}

/// Every worker's settings are checked when it is made, and the runner's intervals when it is
/// spawned: a value out of range is refused, naming the setting, never adjusted.
#[tokio::test]
async fn settings_out_of_range_are_refused_not_adjusted() {
    fn field<T: std::fmt::Debug>(r: Result<T, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("not refused: {other:?}"),
        }
    }
    let env = Env::new();
    let c = || env.coordinator.clone();
    let retention = |config| RetentionEnforcer::new(c(), config);
    assert_eq!(
        field(retention(
            RetentionConfig::default().with_max_batches_per_call(0)
        )),
        "max_batches_per_call"
    );
    assert_eq!(
        field(retention(
            RetentionConfig::default().with_max_calls_per_pass(0)
        )),
        "max_calls_per_pass"
    );
    let expiry = |config| ProducerExpirer::new(c(), config);
    assert_eq!(
        field(expiry(
            ProducerExpiryConfig::default().with_max_producers_per_call(0)
        )),
        "max_producers_per_call"
    );
    assert_eq!(
        field(expiry(
            ProducerExpiryConfig::default().with_max_calls_per_pass(0)
        )),
        "max_calls_per_pass"
    );
    let cleaner =
        |config| ObjectCleaner::new(c(), env.storage.clone(), None, env.clock.clone(), config);
    assert_eq!(
        field(cleaner(CleanerConfig::default().with_batch_size(0))),
        "batch_size"
    );
    assert_eq!(
        field(cleaner(
            CleanerConfig::default().with_max_rounds_per_pass(0)
        )),
        "max_rounds_per_pass"
    );
    cleaner(CleanerConfig::default().with_grace(Duration::ZERO)).unwrap();
    let orphans =
        |config| OrphanCollector::new(c(), env.storage.clone(), env.clock.clone(), config);
    let default = OrphanConfig::default;
    assert_eq!(default().prefix, "wal");
    assert_eq!(field(orphans(default().with_prefix("/wal"))), "prefix");
    assert_eq!(field(orphans(default().with_known_batch(0))), "known_batch");
    assert_eq!(
        field(orphans(default().with_max_listed_per_pass(0))),
        "max_listed_per_pass"
    );
    assert_eq!(
        field(orphans(default().with_max_suspects(0))),
        "max_suspects"
    );
    assert_eq!(
        field(orphans(default().with_max_deletes_per_pass(0))),
        "max_deletes_per_pass"
    );
    // No prefix (the writer's keys are then bare UUIDs), and zero durations, are valid.
    orphans(
        default()
            .with_prefix("")
            .with_max_commit_age(Duration::ZERO)
            .with_recheck_delay(Duration::ZERO)
            .with_full_sweep_interval(Duration::ZERO),
    )
    .unwrap();

    let spawned = Lifecycle::new()
        .retention(
            retention(RetentionConfig::default()).unwrap(),
            Duration::from_secs(30),
        )
        .cleaner(env.cleaner(0), Duration::ZERO)
        .spawn();
    assert_eq!(field(spawned), "cleaner");
}

/// A lifecycle is spawned on the current runtime; outside one, it says so instead of panicking.
#[test]
fn spawning_a_lifecycle_outside_a_runtime_is_refused() {
    let env = Env::new();
    let retention = RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default());
    let spawned = Lifecycle::new()
        .retention(retention.unwrap(), Duration::from_secs(30))
        .spawn();
    assert!(matches!(spawned, Err(ConfigError::NoRuntime)));
}

// ---------------------------------------------------------------------------------------------
// A fetch racing with the cleaner

/// Storage whose reads find the object already deleted (the cleaner ran between the fetcher's
/// coordinator lookup and its read).
#[derive(Debug)]
struct DeletedUnderfoot(Arc<DeleteLog>);

#[async_trait]
impl ObjectStorage for DeletedUnderfoot {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.0.upload(key, payload).await
    }
    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.0.delete(std::slice::from_ref(key)).await?;
        self.0.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.0.delete(keys).await
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.0.list(prefix)
    }
}

#[tokio::test]
async fn a_fetch_racing_with_a_deletion_gets_a_retriable_error_not_bytes() {
    use diskless_core::fetcher::{FetchPartition, Fetcher};
    use diskless_core::{RecordBatchBuilder, SegmentBuilder, validate_batch};
    let env = Env::new();
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let now = env.clock.now_ms();
    let batch = RecordBatchBuilder::new()
        .record(now, Some(b"k"), Some(b"v"))
        .build()
        .unwrap();
    let validated = validate_batch(&batch, &TopicConfig::default(), now).unwrap();
    let mut segment = SegmentBuilder::new();
    segment.add(p, batch);
    let segment = segment.finish();
    let key = key_at(now);
    env.storage.upload(&key, &segment.chunks).await.unwrap();
    env.coordinator
        .commit_file(CommitFileRequest {
            object_key: key.as_str().to_string(),
            uploader_broker_id: 1,
            object_size: segment.size,
            owners: vec![0],
            batches: vec![validated.commit_batch(p, segment.batches[0].byte_offset)],
        })
        .await
        .unwrap();
    let fetcher = Fetcher::builder(
        Arc::new(DeletedUnderfoot(env.log.clone())),
        env.coordinator.clone(),
    )
    .build()
    .unwrap();
    let answer = fetcher
        .fetch(
            &[FetchPartition {
                partition: p,
                fetch_offset: 0,
                partition_max_bytes: 1 << 20,
                leader_epoch: 0,
                isolation: Default::default(),
            }],
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(answer[0].error, ErrorCode::KafkaStorageError);
    assert_eq!(answer[0].records_len(), 0);
}

/// Chaos seed 30: an orphan suspected just before the collector's clock stepped back was too
/// young for the cycles after the step, so they forgot it, and once old enough again it counted
/// as settled below the floor a cycle before the step had raised above it: left in storage
/// until the next full sweep (24 hours by default). A clock that goes back now starts the cycle
/// over as a full sweep.
#[tokio::test]
async fn an_orphan_suspected_before_the_clock_steps_back_is_still_collected() {
    let env = Env::new();
    env.clock.set(real_now_ms());
    let t = env.topic(1, 1, -1, -1).await;
    let p = TopicIdPartition::new(t, 0);
    let committed = env.produce(&[(p, 10)]).await;
    let orphan = key_at(env.clock.now_ms());
    upload(&*env.storage, &orphan, &[(p, 10)], 0).await;
    let c = collector(&env, env.coordinator.clone());
    env.clock.advance(M + 1_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!((r.known, r.new_suspects, r.cycle_complete), (1, 1, true));
    // 30 s back: the orphan is too young again (by its key time).
    env.clock.advance(-30_000);
    let r = c.run_pass().await.unwrap();
    assert_eq!(r.too_young, 2, "{r:?}");
    // Old enough again, then every recheck delay: collected.
    env.clock.advance(40_000);
    for _ in 0..4 {
        c.run_pass().await.unwrap();
        env.clock.advance(RECHECK);
    }
    assert!(!env.exists(&orphan).await, "the orphan is still in storage");
    assert!(env.exists(&committed).await);
}
