//! The tiering worker end to end on every coordinator: the model, SQLite, PostgreSQL and a
//! `ShardedCoordinator` (3 shards, model or SQLite), with transactions.
//!
//! Per backend: records are produced through a `WalWriter` to 3 partitions — plain batches and two
//! transactional producers (`ProducePartition::with_txn_seq`) whose transactions are committed or
//! aborted by `write_txn_markers`, interleaved so that an ABORT is written while the other
//! producer's transaction is open. Every partition is then read from its log start through
//! `Fetcher::fetch` under `read_uncommitted` and `read_committed`, with three sequences of
//! pseudo-random KIP-74 limits, and every answer is kept. The worker (with an orphan collector on
//! `tiered` and the cleaner) then tiers everything; the same reads must give exactly the same
//! answers (records byte for byte, aborted transactions, offsets). Each segment is parsed by the
//! independent reader `diskless_testkit::kafka_segment`: its indexes are what Kafka's `recover()`
//! rebuilds, its `.txnindex` holds exactly the aborted transactions the coordinator reported
//! before tiering, with Kafka's last stable offset at each ABORT, and its producer `.snapshot` is
//! Kafka's producer state folded over the previous snapshot and its batches. Finally retention
//! deletes the segments and the cleaner their objects: nothing is left in storage, and the log
//! starts at the high watermark.
//!
//! PostgreSQL comes from `DISKLESS_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a fresh schema per test, dropped at the end even
//! when the test fails. Without a reachable server the test prints `skipped: no PostgreSQL at
//! <url>` and passes, unless `DISKLESS_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::postgres::PostgresCoordinator;
use diskless_coordinator::sharded::{MemoryShardMap, ShardedConfig, ShardedCoordinator};
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::lifecycle::{
    CleanerConfig, ObjectCleaner, OrphanCollector, OrphanConfig, RetentionConfig,
    RetentionEnforcer, TieringConfig, TieringWorker,
};
use diskless_core::*;
use diskless_storage::{
    ObjectKey, ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, SeededKeys,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::kafka_segment::{KafkaSegment, SnapshotEntry, fold_producer_state};
use diskless_testkit::postgres::{Schema, test_schema};
use futures::TryStreamExt;
use uuid::Uuid;

const PARTITIONS: i32 = 3;
const INTERVAL: i32 = 150;
const MINUTE: i64 = 60_000;
/// The two transactional producers.
const PIDS: [i64; 2] = [7, 8];

fn real_now_ms() -> i64 {
    SystemClock.now_ms()
}

// ---------------------------------------------------------------------------------------------
// The environment

#[derive(Clone, Copy, Debug)]
enum Backend {
    Model,
    Sqlite,
    Postgres,
    ShardedModel,
    ShardedSqlite,
}

/// The backend's coordinator (and its schema, for PostgreSQL), or `None` when it is skipped.
async fn coordinator(
    backend: Backend,
    clock: Arc<ManualClock>,
) -> Option<(Arc<dyn BatchCoordinator>, Option<Schema>)> {
    let sharded = |sqlite: bool| {
        let clock = clock.clone();
        async move {
            let mut shards: Vec<Arc<dyn BatchCoordinator>> = Vec::new();
            for _ in 0..3 {
                shards.push(if sqlite {
                    Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap())
                } else {
                    Arc::new(InMemoryCoordinator::new(clock.clone()))
                });
            }
            let router = ShardedCoordinator::open(
                shards,
                Arc::new(MemoryShardMap::new()),
                clock,
                ShardedConfig::default().with_seed(5),
            )
            .await
            .unwrap();
            Arc::new(router) as Arc<dyn BatchCoordinator>
        }
    };
    Some(match backend {
        Backend::Model => (Arc::new(InMemoryCoordinator::new(clock)), None),
        Backend::Sqlite => (
            Arc::new(SqliteCoordinator::in_memory(clock).await.unwrap()),
            None,
        ),
        Backend::Postgres => {
            let schema = test_schema()?;
            // The clock is at the real time: the server's commit deadline and the harness's agree.
            let coordinator = PostgresCoordinator::connect(schema.options(), clock)
                .await
                .unwrap();
            (Arc::new(coordinator), Some(schema))
        }
        Backend::ShardedModel => (sharded(false).await, None),
        Backend::ShardedSqlite => (sharded(true).await, None),
    })
}

struct Env {
    backend: Backend,
    clock: Arc<ManualClock>,
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    writer: WalWriter,
    fetcher: Fetcher,
    topic_id: Uuid,
    config: TopicConfig,
    /// The next base sequence of each (producer, partition).
    sequences: BTreeMap<(i64, i32), i32>,
    /// The transactions numbered so far, per producer (the host's `txn_seq`).
    txn_seqs: BTreeMap<i64, i64>,
    /// The open transactions: (producer, partition) → first offset.
    open: BTreeMap<(i64, i32), i64>,
    /// Kafka's `.txnindex` row of every ABORT: (partition, marker offset) → (producer, first
    /// offset, last stable offset when the marker was written).
    aborts: BTreeMap<(i32, i64), (i64, i64, i64)>,
    /// Records produced so far (values differ).
    produced: u64,
    /// Dropped last: the schema outlives every connection to it.
    _schema: Option<Schema>,
}

fn topic_config() -> TopicConfig {
    TopicConfig {
        retention_ms: 3 * 60 * MINUTE,
        segment_bytes: 2_000,
        segment_ms: 5 * MINUTE,
        index_interval_bytes: INTERVAL,
        ..TopicConfig::default()
    }
}

async fn env(backend: Backend) -> Option<Env> {
    let clock = ManualClock::new(real_now_ms());
    let (coordinator, schema) = coordinator(backend, clock.clone()).await?;
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let topic_id = Uuid::from_u128(0x7e57_0002);
    let config = topic_config();
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "tiering-backends".into(),
            partitions: PARTITIONS,
            config: config.clone(),
        })
        .await
        .unwrap();
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(1)))
        .with_clock(clock.clone())
        .with_seed(3)
        .build()
        .unwrap();
    let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
        .build()
        .unwrap();
    Some(Env {
        backend,
        clock,
        storage,
        coordinator,
        writer,
        fetcher,
        topic_id,
        config,
        sequences: BTreeMap::new(),
        txn_seqs: BTreeMap::new(),
        open: BTreeMap::new(),
        aborts: BTreeMap::new(),
        produced: 0,
        _schema: schema,
    })
}

/// One fetch answer, as compared before and after tiering.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    partition: i32,
    fetch_offset: i64,
    error: ErrorCode,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    aborted: Option<Vec<AbortedTxn>>,
    records: bytes::Bytes,
}

impl Env {
    fn partition(&self, p: i32) -> TopicIdPartition {
        TopicIdPartition::new(self.topic_id, p)
    }

    /// One batch of `n` records on every partition: plain, or from transactional producer `pid`
    /// (its transaction on each partition opened by its first batch).
    async fn produce(&mut self, pid: Option<i64>, n: usize) {
        let txn_seq = pid.map(|pid| {
            if !self.open.keys().any(|(p, _)| *p == pid) {
                *self.txn_seqs.entry(pid).or_default() += 1;
            }
            self.txn_seqs[&pid]
        });
        let mut requests = Vec::new();
        for p in 0..PARTITIONS {
            let mut b = RecordBatchBuilder::new();
            if let Some(pid) = pid {
                let seq = self.sequences.entry((pid, p)).or_default();
                b = b.producer(pid, 0, *seq).transactional(true);
                *seq += n as i32;
            }
            for i in 0..n {
                self.produced += 1;
                let value = format!("record {} {}", self.produced, "v".repeat(30 + i * 11));
                b = b.record(self.clock.now_ms() + i as i64, None, Some(value.as_bytes()));
            }
            let batch = b.build().unwrap();
            let mut part = ProducePartition::new(
                self.partition(p),
                Arc::new(self.config.clone()),
                batch.into_bytes(),
            );
            if let Some(seq) = txn_seq {
                part = part.with_txn_seq(seq);
            }
            requests.push(part);
        }
        let answers = self.writer.produce(requests).await;
        for (p, answer) in (0..PARTITIONS).zip(answers) {
            assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
            if let Some(pid) = pid {
                self.open.entry((pid, p)).or_insert(answer.base_offset);
            }
        }
        self.clock.advance(500);
    }

    /// Ends `pid`'s open transaction on every partition.
    async fn end_txn(&mut self, pid: i64, commit: bool) {
        let markers: Vec<TxnMarker> = (0..PARTITIONS)
            .map(|p| TxnMarker {
                partition: self.partition(p),
                producer_id: pid,
                producer_epoch: 0,
                coordinator_epoch: 2,
                commit,
                txn_seq: Some(self.txn_seqs[&pid]),
            })
            .collect();
        let results = self.coordinator.write_txn_markers(&markers).await.unwrap();
        for (p, r) in (0..PARTITIONS).zip(results) {
            assert_eq!(r.error, ErrorCode::None, "{r:?}");
            let first = self.open.remove(&(pid, p)).unwrap();
            if !commit {
                // Kafka's lastStableOffset of a completed transaction: the first offset of the
                // earliest other transaction still open, else the marker's offset + 1.
                let lso = self
                    .open
                    .iter()
                    .filter(|((_, q), _)| *q == p)
                    .map(|(_, first)| *first)
                    .min()
                    .unwrap_or(r.offset + 1);
                self.aborts.insert((p, r.offset), (pid, first, lso));
            }
        }
        self.clock.advance(500);
    }

    /// `rounds` rounds: producer 7 opens a transaction, plain data, producer 8 opens one, more of
    /// 7's, then 7 ends (commit on even rounds, abort on odd ones) while 8's is open, then 8 ends
    /// (the other way round).
    async fn workload(&mut self, rounds: usize) {
        for round in 0..rounds {
            let even = round % 2 == 0;
            self.produce(Some(PIDS[0]), 1 + round % 3).await;
            self.produce(None, 2).await;
            self.produce(Some(PIDS[1]), 2).await;
            self.produce(Some(PIDS[0]), 1).await;
            self.end_txn(PIDS[0], even).await;
            self.produce(None, 1).await;
            self.end_txn(PIDS[1], !even).await;
        }
    }

    /// Every partition read from its log start to its end through `Fetcher::fetch`, under
    /// `isolation`, with the pseudo-random limits of `seed` (a huge one for seed 0).
    async fn read_all(&self, isolation: IsolationLevel, seed: u64) -> Vec<Answer> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut random = |range: std::ops::Range<u32>| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            range.start + ((state >> 33) as u32) % (range.end - range.start)
        };
        let mut answers = Vec::new();
        for p in 0..PARTITIONS {
            let mut offset = 0;
            loop {
                let (partition_max_bytes, max_bytes) = match seed {
                    0 => (u32::MAX / 2, u32::MAX / 2),
                    _ => (random(1..2_500), random(1..5_000)),
                };
                let answer = self
                    .fetcher
                    .fetch(
                        &[FetchPartition {
                            partition: self.partition(p),
                            fetch_offset: offset,
                            partition_max_bytes,
                            leader_epoch: 4,
                            isolation,
                        }],
                        max_bytes,
                    )
                    .await
                    .unwrap()
                    .remove(0);
                let records = answer.records_bytes();
                answers.push(Answer {
                    partition: p,
                    fetch_offset: offset,
                    error: answer.error,
                    high_watermark: answer.high_watermark,
                    last_stable_offset: answer.last_stable_offset,
                    log_start_offset: answer.log_start_offset,
                    aborted: answer.aborted_transactions.clone(),
                    records: records.clone(),
                });
                assert_eq!(
                    answer.error,
                    ErrorCode::None,
                    "p{p} at {offset}: {answer:?}"
                );
                if records.is_empty() {
                    break;
                }
                let batches = split_batches(records).unwrap();
                for b in &batches {
                    assert!(b.crc_is_valid());
                    assert_eq!(b.base_offset(), offset, "p{p}: a gap or a repeat");
                    offset = b.base_offset() + i64::from(b.last_offset_delta()) + 1;
                }
            }
        }
        answers
    }

    /// Every read of the test: both isolation levels, three limit sequences each.
    async fn reads(&self) -> Vec<Vec<Answer>> {
        let mut all = Vec::new();
        for isolation in [
            IsolationLevel::ReadUncommitted,
            IsolationLevel::ReadCommitted,
        ] {
            for seed in [0, 1, 2] {
                all.push(self.read_all(isolation, seed).await);
            }
        }
        all
    }

    fn worker(&self, seed: u64) -> TieringWorker {
        let storage: Arc<dyn ObjectStorage> = self.storage.clone();
        TieringWorker::new(
            self.coordinator.clone(),
            Arc::new(ObjectRemoteStorage::new(storage)),
            self.fetcher.clone(),
            self.clock.clone(),
            Arc::new(SeededKeys::new(seed)),
            1,
            TieringConfig::default()
                .with_part_size(1024)
                .with_read_window(900),
        )
        .unwrap()
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

    /// Tiering, orphan and cleaner passes until nothing changes; the segments registered.
    async fn tier_everything(&self) -> u64 {
        let worker = self.worker(11);
        let collector = self.collector();
        let cleaner = self.cleaner();
        let mut segments = 0;
        for round in 0.. {
            assert!(round < 50, "{:?}: no quiescence", self.backend);
            self.clock.advance(2 * MINUTE);
            let tiered = worker.run_pass().await.unwrap();
            assert_eq!((tiered.failed, tiered.stale), (0, 0), "{tiered:?}");
            segments += tiered.segments;
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
        segments
    }

    async fn listed(&self, prefix: &str) -> Vec<String> {
        self.storage
            .list(prefix)
            .map_ok(|m| m.key.into_string())
            .try_collect()
            .await
            .unwrap()
    }

    /// Every partition's segments parsed by the independent reader, in offset order.
    async fn segments(&self, p: i32) -> Vec<KafkaSegment> {
        let mut out = Vec::new();
        for segment in self
            .coordinator
            .list_tiered_segments(self.partition(p), 0, 1000)
            .await
            .unwrap()
        {
            let object = self
                .storage
                .fetch(
                    &ObjectKey::parse(&segment.object_key).unwrap(),
                    0..segment.object_size,
                )
                .await
                .unwrap();
            let k = KafkaSegment::parse(&object).unwrap();
            k.check(INTERVAL).unwrap();
            assert_eq!(
                (k.base_offset, k.end_offset),
                (segment.base_offset, segment.end_offset)
            );
            out.push(k);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The test

async fn end_to_end(backend: Backend) {
    let Some(mut e) = env(backend).await else {
        return;
    };
    e.workload(8).await;
    assert!(e.open.is_empty());
    let before = e.reads().await;
    // What the coordinator reports as aborted before tiering (one read_committed fetch of each
    // whole partition).
    let aborted_before: BTreeSet<(i32, i64, i64, i64)> = before[3]
        .iter()
        .flat_map(|a| {
            a.aborted
                .iter()
                .flatten()
                .map(|t| (a.partition, t.producer_id, t.first_offset, t.last_offset))
        })
        .collect();
    assert_eq!(
        aborted_before,
        e.aborts
            .iter()
            .map(|((p, last), (pid, first, _))| (*p, *pid, *first, *last))
            .collect(),
        "{backend:?}: the aborted transactions before tiering"
    );
    assert!(aborted_before.len() >= 8, "{aborted_before:?}");

    // Tier everything.
    e.clock.advance(10 * MINUTE);
    let segments = e.tier_everything().await;
    assert!(segments >= 3 * PARTITIONS as u64, "{backend:?}: {segments}");
    for p in 0..PARTITIONS {
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
        assert!(
            found.batches.is_empty(),
            "{backend:?}: p{p} WAL batches left"
        );
        assert!(!found.segments.is_empty());
    }
    assert!(
        e.listed("wal").await.is_empty(),
        "{backend:?}: WAL objects left"
    );
    let keys = e.listed("tiered").await;
    assert_eq!(
        keys.len() as u64,
        segments,
        "{backend:?}: one object per segment"
    );

    // Exactly the same answers from the segments.
    let after = e.reads().await;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b.len(), a.len(), "{backend:?}: read {i}: answers");
        for (b, a) in b.iter().zip(a) {
            assert_eq!(b, a, "{backend:?}: read {i}");
        }
    }

    // The segments' .txnindex and producer snapshots.
    for p in 0..PARTITIONS {
        let mut previous: Vec<SnapshotEntry> = Vec::new();
        let mut rows = BTreeMap::new();
        for k in e.segments(p).await {
            for row in k.aborted_txns().unwrap() {
                rows.insert(
                    (p, row.last_offset),
                    (row.producer_id, row.first_offset, row.last_stable_offset),
                );
            }
            let snapshot = k.snapshot_entries().unwrap();
            assert_eq!(
                snapshot,
                fold_producer_state(&previous, &k.batches),
                "{backend:?}: p{p} segment {}: producer snapshot",
                k.base_offset
            );
            previous = snapshot;
        }
        let expected: BTreeMap<_, _> = e
            .aborts
            .iter()
            .filter(|((q, _), _)| *q == p)
            .map(|(k, v)| (*k, *v))
            .collect();
        assert_eq!(rows, expected, "{backend:?}: p{p}: .txnindex rows");
        // Both producers, their transactions closed, at their last sequence.
        let pids: Vec<(i64, i64, i32)> = previous
            .iter()
            .map(|s| (s.producer_id, s.current_txn_first_offset, s.last_sequence))
            .collect();
        assert_eq!(
            pids,
            PIDS.iter()
                .map(|pid| (*pid, -1, e.sequences[&(*pid, p)] - 1))
                .collect::<Vec<_>>(),
            "{backend:?}: p{p}"
        );
    }

    // Retention deletes the segments, the cleaner their objects after the grace period.
    e.clock.advance(4 * 60 * MINUTE);
    let retention =
        RetentionEnforcer::new(e.coordinator.clone(), RetentionConfig::default()).unwrap();
    for _ in 0..10 {
        if retention.run_pass().await.unwrap().batches_deleted == 0 {
            break;
        }
    }
    for p in 0..PARTITIONS {
        let left = e
            .coordinator
            .list_tiered_segments(e.partition(p), 0, 1000)
            .await
            .unwrap();
        assert!(left.is_empty(), "{backend:?}: p{p}: {left:?}");
    }
    let cleaner = e.cleaner();
    assert_eq!(
        cleaner.run_pass().await.unwrap().deleted,
        0,
        "the grace period"
    );
    e.clock.advance(2 * MINUTE);
    let cleaned = cleaner.run_pass().await.unwrap();
    assert_eq!(cleaned.deleted, segments, "{backend:?}: {cleaned:?}");
    assert!(e.listed("tiered").await.is_empty());
    for p in 0..PARTITIONS {
        let answer = e
            .fetcher
            .fetch(
                &[FetchPartition {
                    partition: e.partition(p),
                    fetch_offset: 0,
                    partition_max_bytes: 1 << 20,
                    leader_epoch: 4,
                    isolation: IsolationLevel::ReadUncommitted,
                }],
                1 << 20,
            )
            .await
            .unwrap()
            .remove(0);
        assert_eq!(answer.error, ErrorCode::OffsetOutOfRange, "{answer:?}");
        let hwm = before[0]
            .iter()
            .filter(|a| a.partition == p)
            .map(|a| a.high_watermark)
            .max()
            .unwrap();
        let found = e
            .coordinator
            .find_batches(
                &[FindBatchesRequest {
                    partition: e.partition(p),
                    offset: hwm,
                    max_bytes: 1,
                    isolation: IsolationLevel::ReadUncommitted,
                }],
                1,
            )
            .await
            .unwrap()
            .remove(0);
        assert_eq!(
            (found.log_start_offset, found.high_watermark),
            (hwm, hwm),
            "{backend:?}: p{p}"
        );
    }
    e.writer.close().await;
}

#[tokio::test]
async fn end_to_end_model() {
    end_to_end(Backend::Model).await;
}

#[tokio::test]
async fn end_to_end_sqlite() {
    end_to_end(Backend::Sqlite).await;
}

#[tokio::test]
async fn end_to_end_postgres() {
    end_to_end(Backend::Postgres).await;
}

#[tokio::test]
async fn end_to_end_sharded_model() {
    end_to_end(Backend::ShardedModel).await;
}

#[tokio::test]
async fn end_to_end_sharded_sqlite() {
    end_to_end(Backend::ShardedSqlite).await;
}
