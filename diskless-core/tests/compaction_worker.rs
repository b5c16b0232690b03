//! `CompactionWorker` end to end (issue #29): keyed records produced through `WalWriter`, moved
//! into tiered segments by the real `TieringWorker`, compacted, then read back through `Fetcher`
//! from every offset: what a consumer of a compacted Kafka topic sees. Over the in-memory
//! reference coordinator and SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::lifecycle::{CompactionConfig, CompactionWorker, TieringConfig, TieringWorker};
use diskless_core::*;
use diskless_storage::{ObjectRemoteStorage, ObjectStoreStorage, SeededKeys};
use diskless_testkit::coordinator::InMemoryCoordinator;
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;
const DAY: i64 = 86_400_000;

struct Env {
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    clock: Arc<ManualClock>,
    writer: WalWriter,
    partition: TopicIdPartition,
    config: Arc<TopicConfig>,
}

async fn env(sqlite: bool, config: TopicConfig) -> Env {
    let clock = ManualClock::new(NOW);
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator: Arc<dyn BatchCoordinator> = if sqlite {
        Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap())
    } else {
        Arc::new(InMemoryCoordinator::new(clock.clone()))
    };
    let topic_id = Uuid::from_u128(0xc0);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "changelog".into(),
            partitions: 1,
            config: config.clone(),
        })
        .await
        .unwrap();
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(
            WalWriterConfig::default()
                .with_seal_policy(SealPolicy::Interval)
                .with_commit_interval(Duration::from_millis(5)),
        )
        .with_clock(clock.clone())
        .with_seed(3)
        .build()
        .unwrap();
    Env {
        storage,
        coordinator,
        clock,
        writer,
        partition: TopicIdPartition::new(topic_id, 0),
        config: Arc::new(config),
    }
}

/// One record to produce: key (None: no key), value (None: tombstone).
type Rec = (Option<&'static str>, Option<String>);

impl Env {
    async fn produce(&self, records: &[Rec]) -> i64 {
        let mut b = RecordBatchBuilder::new().compression(Compression::Lz4);
        for (k, v) in records {
            b = b.record(
                self.clock.now_ms(),
                k.map(str::as_bytes),
                v.as_deref().map(str::as_bytes),
            );
        }
        let batch = b.build().unwrap();
        let answers = self
            .writer
            .produce(vec![ProducePartition::new(
                self.partition,
                self.config.clone(),
                batch.as_bytes().clone(),
            )])
            .await;
        assert_eq!(answers[0].error, ErrorCode::None, "{:?}", answers[0]);
        self.clock.advance(10);
        answers[0].base_offset
    }

    /// Tiers every WAL batch (segments of at most `segment.bytes`).
    async fn tier_all(&self) {
        let fetcher = Fetcher::builder(self.storage.clone(), self.coordinator.clone())
            .build()
            .unwrap();
        let worker = TieringWorker::new(
            self.coordinator.clone(),
            Arc::new(ObjectRemoteStorage::new(self.storage.clone())),
            fetcher,
            self.clock.clone(),
            Arc::new(SeededKeys::new(5)),
            1,
            TieringConfig::default()
                .with_min_age(Duration::ZERO)
                .with_max_segments_per_partition(1000)
                .with_max_segments_per_pass(1000),
        )
        .unwrap();
        self.clock.advance(self.config.segment_ms + 1);
        let report = worker.run_pass().await.unwrap();
        assert_eq!(report.failed, 0, "{report:?}");
    }

    fn compactor(&self) -> CompactionWorker {
        CompactionWorker::new(
            self.coordinator.clone(),
            Arc::new(ObjectRemoteStorage::new(self.storage.clone())),
            self.clock.clone(),
            Arc::new(SeededKeys::new(9)),
            1,
            CompactionConfig::default(),
        )
        .unwrap()
    }

    /// Every record from `from` on, as a consumer reads it: (offset, key, value), and the
    /// batches' (base, last) offsets.
    async fn read_from(&self, from: i64) -> (Vec<(i64, Option<Bytes>, Option<Bytes>)>, Vec<i64>) {
        let fetcher = Fetcher::builder(self.storage.clone(), self.coordinator.clone())
            .build()
            .unwrap();
        let mut offset = from;
        let mut out = Vec::new();
        let mut bases = Vec::new();
        loop {
            let answer = fetcher
                .fetch(
                    &[FetchPartition {
                        partition: self.partition,
                        fetch_offset: offset,
                        partition_max_bytes: 300,
                        leader_epoch: 0,
                        isolation: IsolationLevel::ReadUncommitted,
                    }],
                    300,
                )
                .await
                .unwrap()
                .remove(0);
            assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
            let batches = split_batches(answer.records_bytes()).unwrap();
            if batches.is_empty() {
                assert_eq!(offset, answer.high_watermark, "stopped before the end");
                return (out, bases);
            }
            for b in batches {
                assert!(b.crc_is_valid());
                assert!(b.last_offset() >= offset);
                bases.push(b.base_offset());
                let raw = b.records_bytes();
                let mut scratch = Vec::new();
                let codec = b.attributes().compression().unwrap();
                let records: &[u8] = if codec == Compression::None {
                    &raw
                } else {
                    compression::decompress(codec, &raw, 1 << 26, &mut scratch).unwrap();
                    &scratch
                };
                for r in RecordIter::new(records, b.records_count() as usize) {
                    let r = r.unwrap();
                    let o = b.base_offset() + i64::from(r.offset_delta);
                    if o >= offset {
                        out.push((
                            o,
                            r.key.map(Bytes::copy_from_slice),
                            r.value.map(Bytes::copy_from_slice),
                        ));
                    }
                }
                offset = b.last_offset() + 1;
            }
        }
    }
}

fn compacted_topic() -> TopicConfig {
    TopicConfig::default()
        .with_cleanup_policy(CleanupPolicy::Compact)
        .with_segment_bytes(600)
        .with_segment_ms(60_000)
        .with_min_cleanable_dirty_ratio(0.0)
}

/// A changelog: keys updated many times, tombstones, segments tiered, compacted. A reader from
/// the start then sees each key's latest value only, at its original offset, offsets increasing;
/// a reader from any offset sees the same suffix; the high watermark does not move. A second
/// round past `delete.retention.ms` removes the tombstones; a round with nothing new to do changes
/// nothing.
#[tokio::test]
async fn a_compacted_changelog_reads_as_its_latest_values() {
    for sqlite in [false, true] {
        let e = env(sqlite, compacted_topic()).await;
        let keys = ["a", "b", "c", "d", "e"];
        let mut latest: BTreeMap<&str, (i64, Option<String>)> = BTreeMap::new();
        for round in 0..12 {
            let mut records: Vec<Rec> = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                if (round + i) % 3 == 0 {
                    let value = if round == 10 && *k == "c" {
                        None
                    } else {
                        Some(format!("{k}-{round}-{}", "x".repeat(20)))
                    };
                    records.push((Some(k), value));
                }
            }
            let base = e.produce(&records).await;
            for (i, (k, v)) in records.iter().enumerate() {
                latest.insert(k.unwrap(), (base + i as i64, v.clone()));
            }
        }
        let (before, _) = e.read_from(0).await;
        let hwm = before.len() as i64;
        e.tier_all().await;
        let segments = e
            .coordinator
            .list_tiered_segments(e.partition, 0, 100)
            .await
            .unwrap();
        assert!(segments.len() >= 3, "{sqlite}: {segments:?}");

        let report = e
            .compactor()
            .compact_partition(e.partition, &e.config)
            .await
            .unwrap();
        assert!(report.due && report.segments_replaced >= 3, "{report:?}");
        assert!(report.bytes_after < report.bytes_before, "{report:?}");
        let expected: Vec<(i64, Option<Bytes>, Option<Bytes>)> = {
            let mut v: Vec<_> = latest
                .iter()
                .map(|(k, (o, val))| {
                    (
                        *o,
                        Some(Bytes::copy_from_slice(k.as_bytes())),
                        val.as_ref().map(|s| Bytes::copy_from_slice(s.as_bytes())),
                    )
                })
                .collect();
            v.sort_by_key(|r| r.0);
            v
        };
        let (after, bases) = e.read_from(0).await;
        assert_eq!(after, expected, "sqlite {sqlite}");
        assert!(
            after.iter().any(|r| r.2.is_none()),
            "c's tombstone is its latest record: kept until the horizon"
        );
        assert!(bases.windows(2).all(|w| w[0] < w[1]));
        // From every offset: the suffix of the same answer.
        for from in 0..hwm {
            let (suffix, _) = e.read_from(from).await;
            let want: Vec<_> = expected.iter().filter(|r| r.0 >= from).cloned().collect();
            assert_eq!(suffix, want, "sqlite {sqlite} from {from}");
        }
        let all = e
            .compactor()
            .compact_partition(e.partition, &e.config)
            .await
            .unwrap();
        assert_eq!(all.segments_written, 0, "nothing dirty: {all:?}");

        // Past the delete horizon the tombstone goes (the next round sees the segments as clean
        // unless marked dirty: a round is due once new data is tiered).
        e.clock.advance(DAY + 1);
        e.produce(&[(Some("e"), Some("last".into()))]).await;
        e.tier_all().await;
        let third = e
            .compactor()
            .compact_partition(e.partition, &e.config)
            .await
            .unwrap();
        assert!(third.due, "{third:?}");
        let (final_read, _) = e.read_from(0).await;
        assert!(
            final_read.iter().all(|r| r.2.is_some()),
            "sqlite {sqlite}: a tombstone outlived its horizon: {final_read:?}"
        );
        assert!(final_read.iter().all(|r| r.1.as_deref() != Some(&b"c"[..])));
        assert_eq!(
            final_read.last().map(|r| r.2.clone()),
            Some(Some(Bytes::from_static(b"last")))
        );
    }
}

/// A topic whose policy does not compact is never touched; keyless records cannot reach a
/// compacted one (validation refuses them).
#[tokio::test]
async fn only_compacted_topics_are_compacted() {
    let e = env(
        false,
        compacted_topic().with_cleanup_policy(CleanupPolicy::Delete),
    )
    .await;
    e.produce(&[(Some("a"), Some("1".into())), (None, Some("x".into()))])
        .await;
    e.produce(&[(Some("a"), Some("2".into()))]).await;
    e.tier_all().await;
    let report = e
        .compactor()
        .compact_partition(e.partition, &e.config)
        .await
        .unwrap();
    assert!(!report.due);
    assert_eq!(e.compactor().run_pass().await.unwrap().partitions, 0);
    assert_eq!(e.read_from(0).await.0.len(), 3);
}

impl Env {
    /// A transactional batch of producer `pid` (its `seq`), keyed records, in transaction
    /// `txn_seq`.
    async fn produce_txn(&self, pid: i64, seq: i32, txn_seq: i64, records: &[(&str, &str)]) {
        let mut b = RecordBatchBuilder::new()
            .producer(pid, 0, seq)
            .transactional(true);
        for (k, v) in records {
            b = b.record(self.clock.now_ms(), Some(k.as_bytes()), Some(v.as_bytes()));
        }
        let batch = b.build().unwrap();
        let answers = self
            .writer
            .produce(vec![
                ProducePartition::new(self.partition, self.config.clone(), batch.into_bytes())
                    .with_txn_seq(txn_seq),
            ])
            .await;
        assert_eq!(answers[0].error, ErrorCode::None, "{:?}", answers[0]);
        self.clock.advance(10);
    }

    async fn end_txn(&self, pid: i64, commit: bool, txn_seq: i64) {
        let marker = TxnMarker {
            partition: self.partition,
            producer_id: pid,
            producer_epoch: 0,
            coordinator_epoch: 4,
            commit,
            txn_seq: Some(txn_seq),
        };
        for r in self.coordinator.write_txn_markers(&[marker]).await.unwrap() {
            assert_eq!(r.error, ErrorCode::None, "{r:?}");
        }
        self.clock.advance(10);
    }
}

/// A record as read: offset, key, value.
type Seen<'a> = (i64, Option<&'a [u8]>, Option<&'a [u8]>);

/// Transactions in a compacted partition, as Kafka's cleaner treats them: an aborted
/// transaction's records are removed and never supersede an older value of their key (its keys
/// stay out of the offset map); a committed transaction's records supersede as any record; the
/// markers stay.
#[tokio::test]
async fn aborted_records_never_supersede_and_go() {
    for sqlite in [false, true] {
        let e = env(sqlite, compacted_topic()).await;
        e.produce(&[
            (Some("a"), Some("a1".into())),
            (Some("b"), Some("b1".into())),
        ])
        .await;
        e.produce_txn(7, 0, 1, &[("a", "aborted"), ("c", "aborted")])
            .await;
        e.end_txn(7, false, 1).await;
        e.produce_txn(7, 2, 2, &[("b", "b2-committed")]).await;
        e.end_txn(7, true, 2).await;
        e.produce(&[(Some("d"), Some("d1".into()))]).await;
        e.tier_all().await;
        let report = e
            .compactor()
            .compact_partition(e.partition, &e.config)
            .await
            .unwrap();
        assert!(report.due, "{report:?}");
        let (read, _) = e.read_from(0).await;
        // The markers (ABORT at 4, COMMIT at 6) stay; Kafka's control record keys.
        let markers: Vec<(i64, Option<&[u8]>)> = read
            .iter()
            .filter(|(o, _, _)| [4, 6].contains(o))
            .map(|(o, k, _)| (*o, k.as_deref()))
            .collect();
        assert_eq!(
            markers,
            vec![(4, Some(&[0, 0, 0, 0][..])), (6, Some(&[0, 0, 0, 1][..]))]
        );
        let values: Vec<Seen<'_>> = read
            .iter()
            .filter(|(o, _, _)| ![4, 6].contains(o))
            .map(|(o, k, v)| (*o, k.as_deref(), v.as_deref()))
            .collect();
        assert_eq!(
            values,
            vec![
                (0, Some(&b"a"[..]), Some(&b"a1"[..])),
                (5, Some(&b"b"[..]), Some(&b"b2-committed"[..])),
                (7, Some(&b"d"[..]), Some(&b"d1"[..])),
            ],
            "sqlite {sqlite}"
        );
    }
}
