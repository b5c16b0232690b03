//! ListOffsets through the façade, `Fetcher::list_offsets`: record granularity, exactly as Kafka's
//! `UnifiedLog.fetchOffsetByTimestamp` / `LogSegment.findOffsetByTimestamp` /
//! `FileRecords.searchForTimestamp` (and `RecordBatch.offsetOfMaxTimestamp` for MAX_TIMESTAMP, Kafka
//! 3.8+). Every answer is checked against an independent brute-force scan of the records produced.
//!
//! Batches go through the real produce path (`WalWriter` over the in-memory coordinator and memory
//! storage), with several records each, timestamps out of order and tied, every codec, CreateTime and
//! LogAppendTime topics, and DeleteRecords cutting into a batch.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::*;
use diskless_core::tiered::{FinishInputs, PushOutcome, TieredSegmentBuilder, TieredSegmentConfig};
use diskless_core::*;
use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage, SeededKeys};
use diskless_testkit::coordinator::InMemoryCoordinator;
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;
/// Record timestamps are `T + small deltas`, well within the accepted range around `NOW`.
const T: i64 = NOW - 100_000;
const EPOCH: i32 = 7;

struct Env {
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<InMemoryCoordinator>,
    clock: Arc<ManualClock>,
    writer: WalWriter,
    /// Shares the writer's cache (when there is one).
    fetcher: Fetcher,
    /// Topics created so far.
    topics: AtomicU32,
}

fn env(with_cache: bool) -> Env {
    let clock = ManualClock::new(NOW);
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let mut writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(50)))
        .with_clock(clock.clone())
        .with_seed(7);
    let mut fetcher = Fetcher::builder(storage.clone(), coordinator.clone());
    if with_cache {
        let cache: Arc<dyn LocalCache> =
            Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
        writer = writer.with_cache(cache.clone());
        fetcher = fetcher.with_cache(cache);
    }
    let writer = writer.build().unwrap();
    let fetcher = fetcher.build().unwrap();
    Env {
        storage,
        coordinator,
        clock,
        writer,
        fetcher,
        topics: AtomicU32::new(0),
    }
}

impl Env {
    /// A fetcher without a cache: every batch it needs costs a GET.
    fn cold_fetcher(&self) -> Fetcher {
        Fetcher::builder(self.storage.clone(), self.coordinator.clone())
            .build()
            .unwrap()
    }

    fn gets(&self) -> u64 {
        self.storage.counters().snapshot().get_requests
    }

    async fn topic(&self, partitions: i32, timestamp_type: TimestampType) -> Uuid {
        // Each environment has its own coordinator: topic ids need only be unique within it.
        let topic_id = Uuid::from_u128(u128::from(self.topics.fetch_add(1, Ordering::Relaxed)) + 1);
        self.coordinator
            .create_topic(CreateTopicRequest {
                topic_id,
                name: format!("t-{topic_id}"),
                partitions,
                config: config(timestamp_type),
            })
            .await
            .unwrap();
        topic_id
    }

    /// Produces one batch per partition in one request (one WAL segment); returns, per batch, its
    /// records as a consumer sees them: `(offset, timestamp)`.
    async fn produce(
        &self,
        timestamp_type: TimestampType,
        batches: &[(TopicIdPartition, Compression, &[i64])],
    ) -> Vec<Vec<(i64, i64)>> {
        let config = Arc::new(config(timestamp_type));
        let mut requests = Vec::new();
        for (partition, codec, timestamps) in batches {
            let mut b = RecordBatchBuilder::new().compression(*codec);
            for (i, ts) in timestamps.iter().enumerate() {
                // Repetitive values, so that the codecs really compress.
                let value = format!("value-{i}-{}", "abcd".repeat(50));
                b = b.record(*ts, Some(b"key"), Some(value.as_bytes()));
            }
            requests.push(ProducePartition {
                partition: *partition,
                config: config.clone(),
                records: b.build().unwrap().into_bytes(),
                txn_seq: None,
            });
        }
        let answers = self.writer.produce(requests).await;
        answers
            .iter()
            .zip(batches)
            .map(|(a, (_, _, timestamps))| {
                assert_eq!(a.error, ErrorCode::None, "{a:?}");
                (0..timestamps.len())
                    .map(|i| {
                        let ts = match timestamp_type {
                            TimestampType::CreateTime => timestamps[i],
                            TimestampType::LogAppendTime => a.log_append_time,
                        };
                        (a.base_offset + i as i64, ts)
                    })
                    .collect()
            })
            .collect()
    }

    async fn delete_records(&self, partition: TopicIdPartition, offset: i64) {
        let r = self
            .coordinator
            .delete_records(&[DeleteRecordsRequest { partition, offset }])
            .await
            .unwrap();
        assert_eq!((r[0].error, r[0].low_watermark), (ErrorCode::None, offset));
    }
}

fn config(timestamp_type: TimestampType) -> TopicConfig {
    TopicConfig {
        timestamp_type,
        ..TopicConfig::default()
    }
}

fn query(partition: TopicIdPartition, timestamp: i64) -> ListOffsetsPartition {
    ListOffsetsPartition {
        partition,
        timestamp,
        leader_epoch: EPOCH,
        isolation: Default::default(),
    }
}

/// The brute-force reference: a partition's batches (records as `(offset, timestamp)`, in offset
/// order) and its log start offset.
#[derive(Clone, Debug, Default)]
struct Oracle {
    batches: Vec<Vec<(i64, i64)>>,
    log_start: i64,
    /// The base offset of a tiered segment that DeleteRecords cut into: its batches below the log
    /// start stay in it and count for MAX_TIMESTAMP (as Kafka's local segment straddling the log
    /// start counts in `maxTimestampSoFar`).
    kept_from: Option<i64>,
}

impl Oracle {
    /// The records of the batches the log still holds (those ending at or after the log start:
    /// DeleteRecords keeps the batch it cuts into, as Kafka keeps the segment it cuts into).
    fn live(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        let kept = self
            .kept_from
            .map_or(self.log_start, |k| k.min(self.log_start));
        self.batches
            .iter()
            .filter(move |b| b.last().is_some_and(|&(o, _)| o >= kept))
            .flatten()
            .copied()
    }

    /// Kafka: the first record, in offset order, at or after the log start offset with a timestamp
    /// at or after the target; `(-1, -1)` when there is none.
    fn by_timestamp(&self, target: i64) -> (i64, i64) {
        self.live()
            .find(|&(o, ts)| o >= self.log_start && ts >= target)
            .unwrap_or((-1, -1))
    }

    /// Kafka 3.8+: the first record, in offset order, with the largest timestamp of the log; the
    /// library never answers below the log start offset.
    fn max_timestamp(&self) -> (i64, i64) {
        let Some(max) = self.live().map(|(_, ts)| ts).max() else {
            return (-1, -1);
        };
        let (offset, ts) = self.live().find(|&(_, ts)| ts == max).unwrap();
        (offset.max(self.log_start), ts)
    }

    fn high_watermark(&self) -> i64 {
        self.batches
            .last()
            .and_then(|b| b.last())
            .map_or(0, |&(o, _)| o + 1)
    }

    /// Every interesting target: before everything, each record timestamp and its neighbours
    /// (inside batches, between batches, equal to a record), after everything.
    fn targets(&self) -> Vec<i64> {
        let mut targets = vec![0, T - 1_000_000];
        for &(_, ts) in self.batches.iter().flatten() {
            targets.extend([ts - 1, ts, ts + 1]);
        }
        let max = self
            .batches
            .iter()
            .flatten()
            .map(|r| r.1)
            .max()
            .unwrap_or(0);
        targets.extend([max + 1, max + 1_000_000, i64::MAX]);
        targets.sort_unstable();
        targets.dedup();
        targets
    }
}

/// Asks every target (and the special timestamps) in one request and compares each answer with
/// the oracle's.
async fn check_against_oracle(fetcher: &Fetcher, partition: TopicIdPartition, oracle: &Oracle) {
    let targets = oracle.targets();
    let mut requests: Vec<_> = targets.iter().map(|&t| query(partition, t)).collect();
    requests.extend([
        query(partition, MAX_TIMESTAMP),
        query(partition, EARLIEST_TIMESTAMP),
        query(partition, LATEST_TIMESTAMP),
    ]);
    let answers = fetcher.list_offsets(&requests).await.unwrap();
    assert_eq!(answers.len(), requests.len());
    let mut expected: Vec<(i64, i64)> = targets.iter().map(|&t| oracle.by_timestamp(t)).collect();
    expected.extend([
        oracle.max_timestamp(),
        (oracle.log_start, -1),
        (oracle.high_watermark(), -1),
    ]);
    for ((request, answer), want) in requests.iter().zip(&answers).zip(expected) {
        let what = format!(
            "target {} (T{:+})",
            request.timestamp,
            request.timestamp - T
        );
        assert_eq!(answer.partition, partition, "{what}");
        assert_eq!(answer.error, ErrorCode::None, "{what}: {answer:?}");
        assert_eq!((answer.offset, answer.timestamp), want, "{what}");
        let epoch = if want.0 >= 0 { EPOCH } else { -1 };
        assert_eq!(answer.leader_epoch, epoch, "{what}");
    }
}

async fn single(fetcher: &Fetcher, partition: TopicIdPartition, timestamp: i64) -> (i64, i64) {
    let a = fetcher
        .list_offsets(&[query(partition, timestamp)])
        .await
        .unwrap();
    assert_eq!(a[0].error, ErrorCode::None, "{a:?}");
    (a[0].offset, a[0].timestamp)
}

/// The defect of issue #12 item 10: a timestamp inside a batch got the batch's base offset and max
/// timestamp; Kafka answers the first record with a timestamp at or after the target.
#[tokio::test(start_paused = true)]
async fn a_timestamp_inside_a_batch_finds_the_record() {
    let e = env(false);
    let p = TopicIdPartition::new(e.topic(1, TimestampType::CreateTime).await, 0);
    e.produce(
        TimestampType::CreateTime,
        &[(p, Compression::None, &[T + 10, T + 20, T + 30, T + 40][..])],
    )
    .await;
    e.produce(
        TimestampType::CreateTime,
        &[(p, Compression::Zstd, &[T + 50, T + 70, T + 60][..])],
    )
    .await;
    // Inside the first batch: the record, with its own timestamp.
    assert_eq!(single(&e.fetcher, p, T + 25).await, (2, T + 30));
    assert_eq!(single(&e.fetcher, p, T + 10).await, (0, T + 10));
    assert_eq!(single(&e.fetcher, p, T + 40).await, (3, T + 40));
    // Inside the second (compressed) batch.
    assert_eq!(single(&e.fetcher, p, T + 55).await, (5, T + 70));
    assert_eq!(single(&e.fetcher, p, T + 61).await, (5, T + 70));
    // Between batches: the first record of the next batch.
    assert_eq!(single(&e.fetcher, p, T + 45).await, (4, T + 50));
    // After everything: none.
    assert_eq!(single(&e.fetcher, p, T + 71).await, (-1, -1));
    // MAX_TIMESTAMP: the record holding it, not its batch's base offset.
    assert_eq!(single(&e.fetcher, p, MAX_TIMESTAMP).await, (5, T + 70));
    e.writer.close().await;
}

/// CreateTime: every codec, timestamps out of order within batches, ties within and across batches
/// (for MAX_TIMESTAMP the earliest record wins), two partitions sharing segments; with and without
/// a cache, and through a fetcher that must read storage.
#[tokio::test(start_paused = true)]
async fn create_time_every_target_matches_a_record_scan() {
    for with_cache in [false, true] {
        let e = env(with_cache);
        let topic = e.topic(2, TimestampType::CreateTime).await;
        let (p0, p1) = (
            TopicIdPartition::new(topic, 0),
            TopicIdPartition::new(topic, 1),
        );
        let plan: [(Compression, &[i64], &[i64]); 6] = [
            (Compression::None, &[T + 50, T + 10, T + 30], &[T + 5]),
            (
                Compression::Gzip,
                &[T + 20, T + 90, T + 15, T + 90, T + 40],
                &[T + 7, T + 3, T + 9],
            ),
            (Compression::Snappy, &[T + 5, T + 60], &[T + 100, T + 1]),
            (Compression::Lz4, &[T + 120, T + 80, T + 120], &[T + 100]),
            (
                Compression::Zstd,
                &[T + 110, T + 120, T + 30],
                &[T + 2, T + 100],
            ),
            (Compression::None, &[T + 65], &[T + 50, T + 50, T + 50]),
        ];
        let mut o0 = Oracle::default();
        let mut o1 = Oracle::default();
        for (codec, ts0, ts1) in plan {
            let mut got = e
                .produce(
                    TimestampType::CreateTime,
                    &[(p0, codec, ts0), (p1, codec, ts1)],
                )
                .await;
            o1.batches.push(got.pop().unwrap());
            o0.batches.push(got.pop().unwrap());
        }
        check_against_oracle(&e.fetcher, p0, &o0).await;
        check_against_oracle(&e.fetcher, p1, &o1).await;
        check_against_oracle(&e.cold_fetcher(), p0, &o0).await;
        check_against_oracle(&e.cold_fetcher(), p1, &o1).await;
        e.writer.close().await;
    }
}

/// LogAppendTime: every record of a batch has the batch's commit time, whatever the producer sent;
/// three batches committed at the same time tie for MAX_TIMESTAMP (the earliest batch's first record
/// wins).
#[tokio::test(start_paused = true)]
async fn log_append_time_every_target_matches_a_record_scan() {
    let e = env(true);
    let p = TopicIdPartition::new(e.topic(1, TimestampType::LogAppendTime).await, 0);
    let mut oracle = Oracle::default();
    let plan: [(i64, Compression, &[i64]); 4] = [
        (0, Compression::None, &[T + 50, T + 10, T + 30]),
        (1_000, Compression::Gzip, &[T + 5, T + 99]),
        (0, Compression::Zstd, &[T + 1, T + 2, T + 3, T + 4]),
        (0, Compression::Lz4, &[T + 500]),
    ];
    for (advance, codec, timestamps) in plan {
        e.clock.advance(advance);
        oracle.batches.extend(
            e.produce(TimestampType::LogAppendTime, &[(p, codec, timestamps)])
                .await,
        );
    }
    // The producer's timestamps are not what ListOffsets sees.
    assert_eq!(oracle.by_timestamp(T + 50), (0, oracle.batches[0][0].1));
    check_against_oracle(&e.fetcher, p, &oracle).await;
    check_against_oracle(&e.cold_fetcher(), p, &oracle).await;
    e.writer.close().await;
}

/// DeleteRecords cutting into a batch: records below the log start offset are never answered; a
/// target whose only matching records in the cut batch lie below the log start continues with the
/// following batches (as `FileRecords.searchForTimestamp` continues with the following batches).
#[tokio::test(start_paused = true)]
async fn delete_records_inside_a_batch_is_respected() {
    for with_cache in [false, true] {
        let e = env(with_cache);
        let p = TopicIdPartition::new(e.topic(1, TimestampType::CreateTime).await, 0);
        let mut oracle = Oracle::default();
        let plan: [(Compression, &[i64]); 5] = [
            (Compression::None, &[T + 10, T + 20]),
            // Cut at its 4th record: T+300 (the partition's max) and T+200 go below the log start.
            (
                Compression::Gzip,
                &[T + 200, T + 300, T + 30, T + 40, T + 35, T + 45],
            ),
            (Compression::None, &[T + 100, T + 150]),
            (Compression::Zstd, &[T + 250, T + 50]),
            (Compression::None, &[T + 5]),
        ];
        for (codec, timestamps) in plan {
            oracle.batches.extend(
                e.produce(TimestampType::CreateTime, &[(p, codec, timestamps)])
                    .await,
            );
        }
        let cut = oracle.batches[1][3].0;
        e.delete_records(p, cut).await;
        oracle.log_start = cut;
        // T+250 is only in the cut batch below the log start (T+300) and in batch 3.
        assert_eq!(oracle.by_timestamp(T + 250), oracle.batches[3][0]);
        assert_eq!(single(&e.fetcher, p, T + 250).await, oracle.batches[3][0]);
        // T+41 matches T+45 in the cut batch, above the log start.
        assert_eq!(single(&e.fetcher, p, T + 41).await, oracle.batches[1][5]);
        check_against_oracle(&e.fetcher, p, &oracle).await;
        check_against_oracle(&e.cold_fetcher(), p, &oracle).await;

        // Cut again behind every T+300-or-more record: MAX_TIMESTAMP moves on with the log.
        let cut = oracle.batches[2][0].0;
        e.delete_records(p, cut).await;
        oracle.log_start = cut;
        check_against_oracle(&e.fetcher, p, &oracle).await;
        e.writer.close().await;
    }
}

/// The façade reads the one batch it needs: one ranged GET for a lookup on a cold fetcher without a
/// cache, no GET at all when the writer's cache holds the segment.
#[tokio::test(start_paused = true)]
async fn a_lookup_costs_one_get_or_a_cache_hit() {
    let e = env(true);
    let p = TopicIdPartition::new(e.topic(1, TimestampType::CreateTime).await, 0);
    for i in 0..10 {
        e.produce(
            TimestampType::CreateTime,
            &[(
                p,
                Compression::Gzip,
                &[T + 10 * i + 5, T + 10 * i, T + 10 * i + 9][..],
            )],
        )
        .await;
    }
    let before = e.gets();
    assert_eq!(single(&e.fetcher, p, T + 42).await, (12, T + 45));
    assert_eq!(single(&e.fetcher, p, MAX_TIMESTAMP).await, (29, T + 99));
    assert_eq!(e.gets(), before, "the writer's cache holds the segments");

    let cold = e.cold_fetcher();
    let before = e.gets();
    assert_eq!(single(&cold, p, T + 42).await, (12, T + 45));
    assert_eq!(e.gets(), before + 1);
    assert_eq!(single(&cold, p, MAX_TIMESTAMP).await, (29, T + 99));
    assert_eq!(e.gets(), before + 2);
    // The lookup is a `Send` future: hosts spawn their request handlers.
    let spawned = tokio::spawn(async move {
        let requests = [query(p, T + 42)];
        cold.list_offsets(&requests)
            .await
            .map(|a| (a[0].offset, a[0].timestamp))
    });
    assert_eq!(spawned.await.unwrap().unwrap(), (12, T + 45));
    assert_eq!(e.gets(), before + 3);
    let cold = e.cold_fetcher();
    // Special timestamps and lookups past the end read nothing.
    for t in [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, T + 1_000] {
        single(&cold, p, t).await;
    }
    assert_eq!(e.gets(), before + 3);
    e.writer.close().await;
}

/// Errors and the special timestamps pass through from the coordinator; EARLIEST_LOCAL (-4) and
/// LATEST_TIERED (-5) get Kafka's answers for a log with nothing tiered.
#[tokio::test(start_paused = true)]
async fn errors_and_special_timestamps() {
    let e = env(false);
    let topic = e.topic(2, TimestampType::CreateTime).await;
    let (p0, empty) = (
        TopicIdPartition::new(topic, 0),
        TopicIdPartition::new(topic, 1),
    );
    let unknown = TopicIdPartition::new(Uuid::from_u128(u128::MAX), 0);
    e.produce(
        TimestampType::CreateTime,
        &[(p0, Compression::None, &[T + 3, T + 1, T + 2][..])],
    )
    .await;
    e.produce(
        TimestampType::CreateTime,
        &[(p0, Compression::None, &[T + 4][..])],
    )
    .await;
    e.delete_records(p0, 1).await;
    let requests = [
        query(unknown, T),
        query(unknown, MAX_TIMESTAMP),
        query(empty, T),
        query(empty, MAX_TIMESTAMP),
        query(empty, EARLIEST_TIMESTAMP),
        query(empty, LATEST_TIMESTAMP),
        query(p0, EARLIEST_LOCAL_TIMESTAMP),
        query(p0, LATEST_TIERED_TIMESTAMP),
        query(unknown, LATEST_TIERED_TIMESTAMP),
        query(p0, -7),
        query(p0, T + 2),
    ];
    let got: Vec<(ErrorCode, i64, i64, i32)> = e
        .fetcher
        .list_offsets(&requests)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.error, a.offset, a.timestamp, a.leader_epoch))
        .collect();
    let unknown_answer = (ErrorCode::UnknownTopicOrPartition, -1, -1, -1);
    assert_eq!(
        got,
        vec![
            unknown_answer,
            unknown_answer,
            (ErrorCode::None, -1, -1, -1),
            (ErrorCode::None, -1, -1, -1),
            (ErrorCode::None, 0, -1, EPOCH),
            (ErrorCode::None, 0, -1, EPOCH),
            (ErrorCode::None, 1, -1, EPOCH),
            (ErrorCode::None, -1, -1, -1),
            unknown_answer,
            (ErrorCode::InvalidRequest, -1, -1, -1),
            (ErrorCode::None, 2, T + 2, EPOCH),
        ]
    );
    assert!(e.fetcher.list_offsets(&[]).await.unwrap().is_empty());
    e.writer.close().await;
}

/// Which request versions Kafka accepts each special timestamp at
/// (`ReplicaManager.isListOffsetsTimestampUnsupported`).
#[test]
fn special_timestamps_need_their_request_versions() {
    assert_eq!(list_offsets_min_version(EARLIEST_TIMESTAMP), Some(1));
    assert_eq!(list_offsets_min_version(LATEST_TIMESTAMP), Some(1));
    assert_eq!(list_offsets_min_version(MAX_TIMESTAMP), Some(7));
    assert_eq!(list_offsets_min_version(EARLIEST_LOCAL_TIMESTAMP), Some(8));
    assert_eq!(list_offsets_min_version(LATEST_TIERED_TIMESTAMP), Some(9));
    assert_eq!(list_offsets_min_version(-6), None);
    assert_eq!(list_offsets_min_version(0), Some(0));
    assert_eq!(list_offsets_min_version(T), Some(0));
}

/// A batch that cannot be read is a retriable storage error for its partition only, never a wrong
/// answer.
#[tokio::test(start_paused = true)]
async fn an_unreadable_batch_is_a_storage_error() {
    let e = env(false);
    let topic = e.topic(2, TimestampType::CreateTime).await;
    let (p0, p1) = (
        TopicIdPartition::new(topic, 0),
        TopicIdPartition::new(topic, 1),
    );
    e.produce(
        TimestampType::CreateTime,
        &[(p0, Compression::Gzip, &[T + 3, T + 1, T + 2][..])],
    )
    .await;
    e.produce(
        TimestampType::CreateTime,
        &[(p1, Compression::Gzip, &[T + 3, T + 1, T + 2][..])],
    )
    .await;
    let found = e
        .coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: p0,
                offset: 0,
                max_bytes: 1,
                isolation: Default::default(),
            }],
            1,
        )
        .await
        .unwrap();
    let key = ObjectKey::parse(&found[0].batches[0].object_key).unwrap();
    e.storage.delete(&[key]).await.unwrap();
    let got = e
        .cold_fetcher()
        .list_offsets(&[
            query(p0, T + 2),
            query(p1, T + 2),
            query(p0, LATEST_TIMESTAMP),
        ])
        .await
        .unwrap();
    assert_eq!(got[0].error, ErrorCode::KafkaStorageError, "{:?}", got[0]);
    assert!(got[0].error.is_retriable());
    assert_eq!(
        (got[0].offset, got[0].timestamp, got[0].leader_epoch),
        (-1, -1, -1)
    );
    assert!(got[0].error_message.is_some());
    assert_eq!(
        (got[1].error, got[1].offset, got[1].timestamp),
        (ErrorCode::None, 0, T + 3)
    );
    assert_eq!((got[2].error, got[2].offset), (ErrorCode::None, 3));
    e.writer.close().await;
}

/// The fetcher's settings are checked when it is built: a value out of range is refused, naming
/// the setting, never adjusted.
#[test]
fn the_fetcher_builder_refuses_settings_out_of_range() {
    let clock = ManualClock::new(NOW);
    let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock));
    let build = |config: FetcherConfig| {
        Fetcher::builder(storage.clone(), coordinator.clone())
            .with_config(config)
            .build()
    };
    let field = |config: FetcherConfig| match build(config) {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("not refused: {other:?}"),
    };
    let default = FetcherConfig::default;
    assert_eq!(
        field(default().with_cache_block_size(0)),
        "cache_block_size"
    );
    assert_eq!(
        field(default().with_max_concurrent_objects(0)),
        "max_concurrent_objects"
    );
    assert_eq!(
        field(default().with_max_decompressed_bytes(0)),
        "max_decompressed_bytes"
    );
    let mut range_read = diskless_storage::RangeReadConfig::default();
    range_read.concurrency = 0;
    assert_eq!(
        field(default().with_range_read(range_read)),
        "range_read.concurrency"
    );
    let fetcher = build(
        default()
            .with_cache_block_size(1)
            .with_max_concurrent_objects(1),
    )
    .unwrap();
    assert_eq!(fetcher.config().cache_block_size, 1);
    assert_eq!(fetcher.config().max_concurrent_objects, 1);
}

/// The test-only consolidation (the real worker is `lifecycle::tiering`): the next `max_batches`
/// WAL batches of `p` built into a tiered segment (index entries every ~100 bytes, so lookups land
/// inside it), uploaded as one object and registered.
async fn consolidate(e: &Env, p: TopicIdPartition, max_batches: u32) -> TieredSegment {
    let plan = e
        .coordinator
        .segment_plan(&SegmentPlanRequest {
            partition: p,
            max_bytes: u64::MAX,
            max_batches,
            committed_before_ms: i64::MAX,
        })
        .await
        .unwrap();
    assert!(!plan.batches.is_empty());
    let config = TieredSegmentConfig {
        index_interval_bytes: 100,
        ..TieredSegmentConfig::default()
    };
    let mut builder = TieredSegmentBuilder::new(p, config).unwrap();
    for b in &plan.batches {
        let stored = e
            .storage
            .fetch(
                &ObjectKey::parse(&b.object_key).unwrap(),
                b.byte_offset..b.byte_offset + u64::from(b.byte_size),
            )
            .await
            .unwrap();
        assert!(matches!(
            builder.push(b, stored).unwrap(),
            PushOutcome::Appended(_)
        ));
    }
    let segment = builder
        .finish(FinishInputs {
            log_start_offset: plan.log_start_offset,
            ..FinishInputs::default()
        })
        .unwrap();
    static SEED: AtomicU32 = AtomicU32::new(1);
    let keys = SeededKeys::new(u64::from(SEED.fetch_add(1, Ordering::Relaxed)));
    let key = ObjectKey::generate("tiered", &keys, e.clock.as_ref()).unwrap();
    e.storage.upload(&key, &[segment.to_bytes()]).await.unwrap();
    let l = segment.layout;
    let outcome = e
        .coordinator
        .register_segment(RegisterSegmentRequest {
            partition: p,
            object_key: key.as_str().to_string(),
            object_size: l.object_size(),
            uploader_broker_id: 1,
            layout: SegmentLayoutSizes {
                log: l.log,
                offset_index: l.offset_index,
                time_index: l.time_index,
                txn_index: l.txn_index,
                producer_snapshot: l.producer_snapshot,
                leader_epochs: l.leader_epochs,
            },
            base_offset: segment.base_offset,
            end_offset: segment.end_offset,
            batch_count: segment.batch_count(),
            batch_bytes: l.log,
            max_timestamp: segment.max_timestamp,
            max_timestamp_offset: segment.max_timestamp_offset,
            owner: 0,
        })
        .await
        .unwrap();
    assert!(matches!(outcome, RegisterSegmentOutcome::Registered { .. }));
    e.coordinator
        .list_tiered_segments(p, segment.end_offset, 1)
        .await
        .unwrap()
        .remove(0)
}

/// EARLIEST_LOCAL (-4) and LATEST_TIERED (-5) as Kafka answers them with tiered storage: the
/// first offset in the WAL tier (never below the log start), the last tiered offset (`-1` when
/// none); with the request's epoch when an offset is found.
async fn check_tier_bounds(f: &Fetcher, p: TopicIdPartition, log_start: i64, tiered_next: i64) {
    let a = f
        .list_offsets(&[
            query(p, EARLIEST_LOCAL_TIMESTAMP),
            query(p, LATEST_TIERED_TIMESTAMP),
        ])
        .await
        .unwrap();
    let got: Vec<(ErrorCode, i64, i64, i32)> = a
        .iter()
        .map(|a| (a.error, a.offset, a.timestamp, a.leader_epoch))
        .collect();
    let latest_tiered = tiered_next - 1;
    assert_eq!(
        got,
        vec![
            (ErrorCode::None, log_start.max(tiered_next), -1, EPOCH),
            (
                ErrorCode::None,
                latest_tiered,
                -1,
                if latest_tiered >= 0 { EPOCH } else { -1 }
            ),
        ]
    );
}

/// Timestamps, MAX_TIMESTAMP, -4 and -5 across tiers: the same record-level answers (checked
/// against the brute-force scan) while the batches move into tiered segments one segment at a
/// time, then after DeleteRecords cuts into a segment (the search continues past records below
/// the log start, into the next segment) and past it; CreateTime (every codec, ties) and
/// LogAppendTime, with and without a cache.
#[tokio::test(start_paused = true)]
async fn timestamps_across_tiers_match_a_record_scan() {
    for (with_cache, timestamp_type) in [
        (false, TimestampType::CreateTime),
        (true, TimestampType::CreateTime),
        (true, TimestampType::LogAppendTime),
    ] {
        let e = env(with_cache);
        let p = TopicIdPartition::new(e.topic(1, timestamp_type).await, 0);
        let plan: [(Compression, &[i64]); 12] = [
            (Compression::None, &[T + 50, T + 10, T + 30]),
            (
                Compression::Gzip,
                &[T + 20, T + 400, T + 15, T + 90, T + 40],
            ),
            (Compression::Snappy, &[T + 5, T + 60]),
            (Compression::Lz4, &[T + 120, T + 80, T + 120]),
            (Compression::Zstd, &[T + 110, T + 120, T + 30]),
            (Compression::None, &[T + 65, T + 300, T + 64]),
            (Compression::None, &[T + 250, T + 50]),
            (Compression::Gzip, &[T + 400, T + 1, T + 2]),
            (Compression::None, &[T + 7]),
            (Compression::Zstd, &[T + 130, T + 140, T + 135]),
            (Compression::None, &[T + 260, T + 10]),
            (Compression::Lz4, &[T + 399, T + 401]),
        ];
        let mut oracle = Oracle::default();
        for (codec, timestamps) in plan {
            e.clock.advance(7);
            oracle
                .batches
                .extend(e.produce(timestamp_type, &[(p, codec, timestamps)]).await);
        }
        let fetchers = || [e.fetcher.clone(), e.cold_fetcher()];
        for f in fetchers() {
            check_against_oracle(&f, p, &oracle).await;
            check_tier_bounds(&f, p, 0, 0).await;
        }
        let mut tiered_next = 0;
        let mut segments = Vec::new();
        for _ in 0..3 {
            let s = consolidate(&e, p, 3).await;
            tiered_next = s.end_offset + 1;
            segments.push(s);
            for f in fetchers() {
                check_against_oracle(&f, p, &oracle).await;
                check_tier_bounds(&f, p, 0, tiered_next).await;
            }
        }
        // Inside the second segment's first batch: T+400 (the max, in batch 1) is gone, T+300
        // stays in the segment below the log start.
        let cut = oracle.batches[3][1].0;
        assert_eq!(segments[1].base_offset, oracle.batches[3][0].0);
        e.delete_records(p, cut).await;
        oracle.log_start = cut;
        oracle.kept_from = Some(segments[1].base_offset);
        for f in fetchers() {
            check_against_oracle(&f, p, &oracle).await;
            check_tier_bounds(&f, p, cut, tiered_next).await;
        }
        // Into the third segment, behind the T+300 record: the max moves on.
        let cut = oracle.batches[6][1].0;
        e.delete_records(p, cut).await;
        oracle.log_start = cut;
        oracle.kept_from = Some(segments[2].base_offset);
        for f in fetchers() {
            check_against_oracle(&f, p, &oracle).await;
            check_tier_bounds(&f, p, cut, tiered_next).await;
        }
        // Past every tiered segment: -4 is the log start.
        let cut = oracle.batches[10][0].0;
        e.delete_records(p, cut).await;
        oracle.log_start = cut;
        oracle.kept_from = None;
        for f in fetchers() {
            check_against_oracle(&f, p, &oracle).await;
            check_tier_bounds(&f, p, cut, tiered_next).await;
        }
        e.writer.close().await;
    }
}

/// A lookup inside a cold tiered segment reads its time index, offset index and one `.log`
/// range through the cache: one GET when they share a block, none once warm.
#[tokio::test(start_paused = true)]
async fn a_tiered_lookup_costs_one_get_or_a_cache_hit() {
    let e = env(false);
    let p = TopicIdPartition::new(e.topic(1, TimestampType::CreateTime).await, 0);
    for i in 0..10 {
        e.produce(
            TimestampType::CreateTime,
            &[(
                p,
                Compression::Gzip,
                &[T + 10 * i + 5, T + 10 * i, T + 10 * i + 9][..],
            )],
        )
        .await;
    }
    consolidate(&e, p, 10).await;
    let cache: Arc<dyn LocalCache> = Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
    let f = Fetcher::builder(e.storage.clone(), e.coordinator.clone())
        .with_cache(cache)
        .build()
        .unwrap();
    let before = e.gets();
    assert_eq!(single(&f, p, T + 42).await, (12, T + 45));
    assert_eq!(e.gets(), before + 1);
    assert_eq!(single(&f, p, MAX_TIMESTAMP).await, (29, T + 99));
    assert_eq!(single(&f, p, T + 71).await, (21, T + 75));
    assert_eq!(e.gets(), before + 1, "warm");
    e.writer.close().await;
}
