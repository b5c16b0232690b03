//! Lifecycle workers over a sharded coordinator (3 shards, in-memory model or SQLite): random
//! workloads with retention, DeleteRecords, topic deletion, orphans and storage faults. Every object
//! still referenced exists; every object no longer referenced is deleted, exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use async_trait::async_trait;
use bytes::Bytes;
use diskless_coordinator::sharded::{MemoryShardMap, ShardedConfig, ShardedCoordinator};
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::lifecycle::{
    CleanerConfig, ObjectCleaner, OrphanCollector, OrphanConfig, RetentionConfig, RetentionEnforcer,
};
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, ObjectStoreStorage, StorageError};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultyStorage};
use futures::TryStreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const M: i64 = 300_000;
const RECHECK: i64 = 120_000;
const GRACE: i64 = 60_000;

/// In-memory storage counting, per key, the deletes of an existing object that reached it.
#[derive(Debug)]
struct DeleteLog {
    inner: ObjectStoreStorage,
    deletes: Mutex<HashMap<ObjectKey, u32>>,
}

impl DeleteLog {
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
        self.inner.list(prefix)
    }
}

fn key_at(ms: i64) -> ObjectKey {
    let ts = uuid::Timestamp::from_unix(
        uuid::NoContext,
        (ms / 1000) as u64,
        ((ms % 1000) * 1_000_000) as u32,
    );
    ObjectKey::generate_with_uuid("wal", Uuid::new_v7(ts)).unwrap()
}

#[allow(clippy::disallowed_methods)] // The store stamps objects with the real time.
fn real_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[derive(Clone, Debug)]
enum Op {
    /// Upload and commit a segment with these (topic, partition, size) batches.
    Produce(Vec<(u8, u8, u16)>),
    /// Upload a segment and never commit it.
    Orphan,
    /// DeleteRecords up to the high watermark minus `keep`.
    DeleteRecords {
        topic: u8,
        partition: u8,
        keep: u8,
    },
    DeleteTopic(u8),
    Advance(u32),
    Retention,
    Clean,
    CollectOrphans,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec((0u8..3, 0u8..3, 1u16..200), 1..6).prop_map(Op::Produce),
        1 => Just(Op::Orphan),
        2 => (0u8..3, 0u8..3, 0u8..3).prop_map(|(topic, partition, keep)| Op::DeleteRecords { topic, partition, keep }),
        1 => (0u8..3).prop_map(Op::DeleteTopic),
        4 => (1u32..120_000).prop_map(Op::Advance),
        2 => Just(Op::Retention),
        3 => Just(Op::Clean),
        1 => Just(Op::CollectOrphans),
    ]
}

struct World {
    clock: Arc<ManualClock>,
    router: Arc<ShardedCoordinator>,
    log: Arc<DeleteLog>,
    storage: Arc<dyn ObjectStorage>,
    topics: Vec<Uuid>,
    uploaded: Vec<ObjectKey>,
}

impl World {
    async fn new(sqlite: bool, seed: u64, delete_failure_rate: f64) -> World {
        let clock = ManualClock::new(real_now_ms());
        let mut shards: Vec<Arc<dyn BatchCoordinator>> = Vec::new();
        for _ in 0..3 {
            shards.push(if sqlite {
                Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap())
            } else {
                Arc::new(InMemoryCoordinator::new(clock.clone()))
            });
        }
        let router = Arc::new(
            ShardedCoordinator::open(
                shards,
                Arc::new(MemoryShardMap::new()),
                clock.clone(),
                ShardedConfig::default()
                    .with_seed(seed)
                    .with_max_commit_age(Duration::from_millis(M as u64)),
            )
            .await
            .unwrap(),
        );
        let log = Arc::new(DeleteLog {
            inner: ObjectStoreStorage::in_memory(),
            deletes: Mutex::new(HashMap::new()),
        });
        let storage: Arc<dyn ObjectStorage> = Arc::new(FaultyStorage::new(
            log.clone() as Arc<dyn ObjectStorage>,
            FaultConfig::default()
                .with_seed(seed)
                .with_delete_failure_rate(delete_failure_rate),
        ));
        // Topic 0: short time retention; topic 1: size retention; topic 2: kept forever.
        let configs = [(60_000, -1), (-1, 400), (-1, -1)];
        let mut topics = Vec::new();
        for (i, (retention_ms, retention_bytes)) in configs.into_iter().enumerate() {
            let topic_id = Uuid::from_u128(1 + i as u128);
            router
                .create_topic(CreateTopicRequest {
                    topic_id,
                    name: format!("topic-{i}"),
                    partitions: 3,
                    config: TopicConfig {
                        retention_ms,
                        retention_bytes,
                        ..TopicConfig::default()
                    },
                })
                .await
                .unwrap();
            topics.push(topic_id);
        }
        World {
            clock,
            router,
            log,
            storage,
            topics,
            uploaded: Vec::new(),
        }
    }

    fn partition(&self, topic: u8, partition: u8) -> TopicIdPartition {
        TopicIdPartition::new(self.topics[usize::from(topic)], i32::from(partition))
    }

    /// Uploads a segment (through the fault-free inner store); returns its commit request.
    async fn upload(&mut self, batches: &[(u8, u8, u16)]) -> CommitFileRequest {
        let key = key_at(self.clock.now_ms());
        let now = self.clock.now_ms();
        let mut at = 1u64;
        let mut commit = Vec::new();
        for (t, p, size) in batches {
            commit.push(CommitBatch {
                partition: self.partition(*t, *p),
                byte_offset: at,
                byte_size: u32::from(*size),
                record_count: 1,
                base_timestamp: now,
                max_timestamp: now,
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
        self.log
            .upload(&key, &[Bytes::from(vec![7u8; at as usize])])
            .await
            .unwrap();
        self.uploaded.push(key.clone());
        CommitFileRequest {
            object_key: key.into_string(),
            uploader_broker_id: 1,
            object_size: at,
            owners: vec![0],
            batches: commit,
        }
    }

    /// The objects some live batch points to.
    async fn referenced(&self) -> BTreeSet<ObjectKey> {
        let mut requests = Vec::new();
        for t in 0..3 {
            for p in 0..3 {
                let partition = self.partition(t, p);
                let start = self
                    .router
                    .list_offsets(&[ListOffsetsRequest {
                        partition,
                        timestamp: EARLIEST_TIMESTAMP,
                        isolation: Default::default(),
                    }])
                    .await
                    .unwrap()[0]
                    .offset;
                requests.push(FindBatchesRequest {
                    partition,
                    offset: start.max(0),
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                });
            }
        }
        let found = self.router.find_batches(&requests, u32::MAX).await.unwrap();
        found
            .iter()
            .flat_map(|f| f.batches.iter())
            .map(|b| ObjectKey::parse(&b.object_key).unwrap())
            .collect()
    }

    async fn check_referenced_exist(&self, step: usize) {
        let stored = self.log.keys().await;
        for k in self.referenced().await {
            assert!(
                stored.contains(&k),
                "step {step}: referenced object {k} is gone"
            );
        }
    }
}

async fn workload(sqlite: bool, seed: u64, delete_failure_rate: f64, ops: Vec<Op>) {
    let mut w = World::new(sqlite, seed, delete_failure_rate).await;
    let coordinator: Arc<dyn BatchCoordinator> = w.router.clone();
    let retention = RetentionEnforcer::new(
        coordinator.clone(),
        RetentionConfig::default()
            .with_max_batches_per_call(4)
            .with_max_calls_per_pass(3),
    )
    .unwrap();
    let cleaner = ObjectCleaner::new(
        coordinator.clone(),
        w.storage.clone(),
        None,
        w.clock.clone(),
        CleanerConfig::default()
            .with_grace(Duration::from_millis(GRACE as u64))
            .with_batch_size(4)
            .with_max_rounds_per_pass(3),
    )
    .unwrap();
    let collector = OrphanCollector::new(
        coordinator.clone(),
        w.storage.clone(),
        w.clock.clone(),
        OrphanConfig::new("wal")
            .with_max_commit_age(Duration::from_millis(M as u64))
            .with_recheck_delay(Duration::from_millis(RECHECK as u64)),
    )
    .unwrap();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Produce(batches) => {
                let request = w.upload(&batches).await;
                w.router.commit_file(request).await.unwrap();
            }
            Op::Orphan => {
                w.upload(&[(0, 0, 10)]).await;
            }
            Op::DeleteRecords {
                topic,
                partition,
                keep,
            } => {
                let p = w.partition(topic, partition);
                let hw = w
                    .router
                    .list_offsets(&[ListOffsetsRequest {
                        partition: p,
                        timestamp: LATEST_TIMESTAMP,
                        isolation: Default::default(),
                    }])
                    .await
                    .unwrap()[0]
                    .offset;
                if hw >= 0 {
                    w.router
                        .delete_records(&[DeleteRecordsRequest {
                            partition: p,
                            offset: (hw - i64::from(keep)).max(0),
                        }])
                        .await
                        .unwrap();
                }
            }
            Op::DeleteTopic(t) => {
                let _ = w.router.delete_topic(w.topics[usize::from(t)]).await;
            }
            Op::Advance(ms) => w.clock.advance(i64::from(ms)),
            Op::Retention => {
                retention.run_pass().await.unwrap();
            }
            Op::Clean => {
                cleaner.run_pass().await.unwrap();
            }
            Op::CollectOrphans => {
                collector.run_pass().await.unwrap();
            }
        }
        w.check_referenced_exist(step).await;
    }

    // Quiesce: retention runs dry, the cleaner retries until storage cooperated, orphans age out.
    w.clock.advance(2 * M);
    while retention.run_pass().await.unwrap().more {}
    w.clock.advance(GRACE + 1);
    for _ in 0..100 {
        cleaner.run_pass().await.unwrap();
        collector.run_pass().await.unwrap();
        w.clock.advance(RECHECK);
    }
    w.check_referenced_exist(usize::MAX).await;
    let referenced = w.referenced().await;
    let stored = w.log.keys().await;
    assert_eq!(
        stored, referenced,
        "stored objects are exactly the referenced ones"
    );
    let names: Vec<String> = w.uploaded.iter().map(|k| k.as_str().to_string()).collect();
    let known: BTreeSet<String> = w
        .router
        .known_objects(&names)
        .await
        .unwrap()
        .into_iter()
        .collect();
    for k in &w.uploaded {
        let deletes = w.log.deletes.lock().get(k).copied().unwrap_or(0);
        if referenced.contains(k) {
            assert_eq!(deletes, 0);
            assert!(known.contains(k.as_str()));
        } else {
            assert_eq!(deletes, 1, "object {k} deleted {deletes} times");
            assert!(
                !known.contains(k.as_str()),
                "deleted object {k} still known"
            );
        }
    }
}

#[tokio::test]
async fn a_long_mixed_workload_over_three_sqlite_shards() {
    let mut ops = Vec::new();
    for i in 0..120u32 {
        ops.push(match i % 9 {
            0..=3 => Op::Produce(vec![
                ((i % 3) as u8, (i % 3) as u8, 50),
                (((i + 1) % 3) as u8, ((i / 3) % 3) as u8, 70),
                (((i + 2) % 3) as u8, ((i / 9) % 3) as u8, 30),
            ]),
            4 => Op::Advance(20_000),
            5 => Op::DeleteRecords {
                topic: 2,
                partition: (i % 3) as u8,
                keep: 1,
            },
            6 => Op::Retention,
            7 => Op::Clean,
            _ => {
                if i % 2 == 0 {
                    Op::Orphan
                } else {
                    Op::CollectOrphans
                }
            }
        });
    }
    workload(true, 11, 0.3, ops).await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_workloads_over_three_model_shards(
        seed in any::<u64>(),
        rate in prop_oneof![Just(0.0), Just(0.4)],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(workload(false, seed, rate, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn random_workloads_over_three_sqlite_shards(
        seed in any::<u64>(),
        rate in prop_oneof![Just(0.0), Just(0.4)],
        ops in prop::collection::vec(op(), 1..50),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(workload(true, seed, rate, ops));
    }
}
