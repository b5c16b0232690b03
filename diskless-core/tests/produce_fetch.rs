//! The produce and fetch paths end to end: WalWriter + Fetcher over the testkit's in-memory
//! coordinator, in-memory or faulty object storage, with and without the cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, ObjectStoreStorage, StorageError};
use diskless_testkit::coordinator::{CommitFaults, InMemoryCoordinator};
use diskless_testkit::storage::{FaultConfig, FaultyStorage, Latency};
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;

/// A fresh topic id, drawn deterministically (`Uuid::new_v4` is not used in this workspace).
fn next_uuid() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(u128::from(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

fn clock() -> Arc<ManualClock> {
    ManualClock::new(NOW)
}

async fn topic(
    coordinator: &dyn BatchCoordinator,
    name: &str,
    partitions: i32,
    config: TopicConfig,
) -> Uuid {
    let topic_id = next_uuid();
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: name.to_string(),
            partitions,
            config,
        })
        .await
        .unwrap();
    topic_id
}

fn batch(values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new();
    for (i, v) in values.iter().enumerate() {
        b = b.record(NOW + i as i64, Some(b"key"), Some(v.as_bytes()));
    }
    b.build().unwrap()
}

fn idempotent_batch(producer_id: i64, epoch: i16, seq: i32, values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new().producer(producer_id, epoch, seq);
    for v in values {
        b = b.record(NOW, None, Some(v.as_bytes()));
    }
    b.build().unwrap()
}

fn produce(partition: TopicIdPartition, config: &TopicConfig, b: &RecordBatch) -> ProducePartition {
    ProducePartition {
        partition,
        config: Arc::new(config.clone()),
        records: b.as_bytes().clone(),
        txn_seq: None,
    }
}

fn fetch_req(partition: TopicIdPartition, offset: i64) -> FetchPartition {
    FetchPartition {
        partition,
        fetch_offset: offset,
        partition_max_bytes: 1 << 20,
        leader_epoch: 0,
        isolation: Default::default(),
    }
}

/// Whether a served batch is the produced one but for the injected base offset and leader epoch.
fn same_but_injected(served: &RecordBatch, produced: &[u8]) -> bool {
    let s = served.as_bytes();
    s.len() == produced.len() && s[8..12] == produced[8..12] && s[16..] == produced[16..]
}

/// Parses a fetched partition's records into batches, checking each CRC.
fn served_batches(p: &FetchedPartition) -> Vec<RecordBatch> {
    let batches = split_batches(p.records_bytes()).unwrap();
    for b in &batches {
        assert!(b.crc_is_valid(), "served batch with a bad CRC");
        verify_stored_batch(b).unwrap();
    }
    batches
}

/// The fixed 50 ms interval (not the default adaptive policy): requests appended together share
/// a segment.
fn small_config() -> WalWriterConfig {
    WalWriterConfig::default()
        .with_seal_policy(SealPolicy::Interval)
        .with_commit_interval(Duration::from_millis(50))
}

struct Env {
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<InMemoryCoordinator>,
    cache: Option<Arc<MokaCache>>,
    writer: WalWriter,
    fetcher: Fetcher,
}

fn env(config: WalWriterConfig, with_cache: bool) -> Env {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator = Arc::new(InMemoryCoordinator::new(clock()));
    let cache = with_cache.then(|| Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap()));
    let dyn_cache = cache.clone().map(|c| c as Arc<dyn LocalCache>);
    let mut writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(config)
        .with_clock(clock());
    if let Some(cache) = dyn_cache.clone() {
        writer = writer.with_cache(cache);
    }
    let writer = writer.build().unwrap();
    let mut fetcher = Fetcher::builder(storage.clone(), coordinator.clone());
    if let Some(cache) = dyn_cache {
        fetcher = fetcher.with_cache(cache);
    }
    let fetcher = fetcher.build().unwrap();
    Env {
        storage,
        coordinator,
        cache,
        writer,
        fetcher,
    }
}

#[tokio::test(start_paused = true)]
async fn produce_then_fetch_round_trips_with_injected_offsets() {
    let e = env(small_config(), false);
    let config = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 2, config.clone()).await;
    let p0 = TopicIdPartition::new(t, 0);
    let p1 = TopicIdPartition::new(t, 1);

    let b1 = batch(&["a", "b", "c"]);
    let b2 = batch(&["d"]);
    let b3 = batch(&["e", "f"]);
    let first = e
        .writer
        .produce(vec![produce(p0, &config, &b1), produce(p1, &config, &b2)])
        .await;
    assert_eq!(first.len(), 2);
    assert!(
        first.iter().all(|r| r.error == ErrorCode::None),
        "{first:?}"
    );
    assert_eq!((first[0].base_offset, first[1].base_offset), (0, 0));
    let second = e.writer.produce(vec![produce(p0, &config, &b3)]).await;
    assert_eq!(second[0].base_offset, 3);
    assert_eq!(e.storage.counters().snapshot().put_requests, 2);

    let fetched = e
        .fetcher
        .fetch(&[fetch_req(p0, 0), fetch_req(p1, 0)], 10 << 20)
        .await
        .unwrap();
    assert_eq!(fetched[0].error, ErrorCode::None);
    assert_eq!(fetched[0].high_watermark, 5);
    assert_eq!(fetched[0].log_start_offset, 0);
    let got = served_batches(&fetched[0]);
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].base_offset(), got[1].base_offset()), (0, 3));
    // Bytes identical to what was produced except the injected fields (base offset, epoch).
    assert!(same_but_injected(&got[0], b1.as_bytes()));
    assert!(same_but_injected(&got[1], b3.as_bytes()));
    assert_eq!(fetched[1].high_watermark, 1);
    assert!(same_but_injected(
        &served_batches(&fetched[1])[0],
        b2.as_bytes()
    ));

    // A fetch offset inside a batch returns that whole batch first.
    let mid = e.fetcher.fetch(&[fetch_req(p0, 4)], 1 << 20).await.unwrap();
    assert_eq!(served_batches(&mid[0])[0].base_offset(), 3);
    // At the high watermark: empty, no error. Beyond it or below log start: out of range.
    let at_end = e.fetcher.fetch(&[fetch_req(p0, 5)], 1 << 20).await.unwrap();
    assert_eq!(
        (at_end[0].error, at_end[0].records_len()),
        (ErrorCode::None, 0)
    );
    let past = e.fetcher.fetch(&[fetch_req(p0, 6)], 1 << 20).await.unwrap();
    assert_eq!(past[0].error, ErrorCode::OffsetOutOfRange);
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn log_append_time_topics_get_the_commit_time_and_a_valid_crc() {
    let e = env(small_config(), true);
    let config = TopicConfig {
        timestamp_type: TimestampType::LogAppendTime,
        ..TopicConfig::default()
    };
    let t = topic(e.coordinator.as_ref(), "lat", 1, config.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let answer = e
        .writer
        .produce(vec![produce(p, &config, &batch(&["x", "y"]))])
        .await;
    assert_eq!(answer[0].error, ErrorCode::None);
    assert_eq!(answer[0].log_append_time, NOW);
    let fetched = e.fetcher.fetch(&[fetch_req(p, 0)], 1 << 20).await.unwrap();
    let got = served_batches(&fetched[0]);
    assert_eq!(got[0].timestamp_type(), TimestampType::LogAppendTime);
    assert_eq!(got[0].max_timestamp(), NOW);
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn invalid_partitions_fail_at_once_and_valid_ones_go_on() {
    let e = env(small_config(), false);
    let config = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 3, config.clone()).await;
    let good = batch(&["ok"]);
    let mut corrupt = good.as_bytes().to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff; // breaks the CRC
    let answers = e
        .writer
        .produce(vec![
            produce(TopicIdPartition::new(t, 0), &config, &good),
            ProducePartition {
                partition: TopicIdPartition::new(t, 1),
                config: Arc::new(config.clone()),
                records: Bytes::from(corrupt),
                txn_seq: None,
            },
            ProducePartition {
                partition: TopicIdPartition::new(t, 2),
                config: Arc::new(config.clone()),
                records: Bytes::from_static(b"garbage"),
                txn_seq: None,
            },
        ])
        .await;
    assert_eq!(answers[0].error, ErrorCode::None);
    assert_eq!(answers[1].error, ErrorCode::CorruptMessage);
    assert_ne!(answers[2].error, ErrorCode::None);
    assert_eq!(answers[2].base_offset, -1);

    // A partition of no known topic is rejected by the coordinator, per batch.
    let unknown = TopicIdPartition::new(next_uuid(), 0);
    let answers = e
        .writer
        .produce(vec![produce(unknown, &config, &good)])
        .await;
    assert_eq!(answers[0].error, ErrorCode::UnknownTopicOrPartition);

    // A transactional batch the host did not verify for a transaction opens none: the
    // coordinator answers INVALID_TXN_STATE (produce_fetch_txn.rs has the transaction paths).
    let txn = RecordBatchBuilder::new()
        .producer(1, 0, 0)
        .transactional(true)
        .record(NOW, None, Some(b"v"))
        .build()
        .unwrap();
    let answers = e
        .writer
        .produce(vec![produce(TopicIdPartition::new(t, 0), &config, &txn)])
        .await;
    assert_eq!(answers[0].error, ErrorCode::InvalidTxnState);
    e.writer.close().await;
}

/// 1,000 partitions written within one interval cost exactly one PUT; a cold fetch across them
/// one GET per object; a hot fetch none.
#[tokio::test(start_paused = true)]
async fn cost_one_put_per_segment_one_get_per_object_none_when_hot() {
    let e = env(small_config(), true);
    let config = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "wide", 1000, config.clone()).await;
    let b = batch(&["v"]);
    let pending: Vec<_> = {
        let mut v = Vec::new();
        for chunk in (0..1000).collect::<Vec<i32>>().chunks(100) {
            let parts = chunk
                .iter()
                .map(|&i| produce(TopicIdPartition::new(t, i), &config, &b))
                .collect();
            v.push(e.writer.append(parts).await);
        }
        v
    };
    for p in pending {
        assert!(p.await.iter().all(|r| r.error == ErrorCode::None));
    }
    let stats = e.storage.counters().snapshot();
    assert_eq!(stats.put_requests, 1);
    assert_eq!(e.writer.stats().segments_committed, 1);

    let requests: Vec<_> = (0..1000)
        .map(|i| fetch_req(TopicIdPartition::new(t, i), 0))
        .collect();
    // The writer put the fresh segment into the cache: reading it costs no GET.
    let hot = e.fetcher.fetch(&requests, 100 << 20).await.unwrap();
    assert!(hot.iter().all(|p| served_batches(p).len() == 1));
    assert_eq!(e.storage.counters().snapshot().get_requests, 0);

    // Cold: a fetcher with an empty cache reads the one object with one GET.
    let cold_cache: Arc<dyn LocalCache> =
        Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
    let cold = Fetcher::builder(e.storage.clone(), e.coordinator.clone())
        .with_cache(cold_cache)
        .build()
        .unwrap();
    let got = cold.fetch(&requests, 100 << 20).await.unwrap();
    assert!(got.iter().all(|p| served_batches(p).len() == 1));
    assert_eq!(e.storage.counters().snapshot().get_requests, 1);
    // ...and then it is hot.
    cold.fetch(&requests, 100 << 20).await.unwrap();
    assert_eq!(e.storage.counters().snapshot().get_requests, 1);

    // Without a cache: one GET per object too.
    let uncached = Fetcher::builder(e.storage.clone(), e.coordinator.clone())
        .build()
        .unwrap();
    uncached.fetch(&requests, 100 << 20).await.unwrap();
    assert_eq!(e.storage.counters().snapshot().get_requests, 2);
    // The writer's own cache holds the segment (both blocks' bytes, nothing more).
    let stats = e.cache.as_ref().unwrap().stats();
    assert_eq!(stats.hits, 1);
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn buffer_closes_by_size_and_by_time() {
    let config = WalWriterConfig::default()
        .with_seal_policy(SealPolicy::Interval)
        .with_buffer_max_bytes(4096)
        .with_commit_interval(Duration::from_secs(3600));
    let e = env(config, false);
    let tc = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let big = "x".repeat(1500);
    let b = batch(&[big.as_str()]);
    // Three ~1.6 KB requests: the third would overflow 4 KiB, so the first two form a segment.
    let a1 = e.writer.append(vec![produce(p, &tc, &b)]).await;
    let a2 = e.writer.append(vec![produce(p, &tc, &b)]).await;
    let a3 = e.writer.append(vec![produce(p, &tc, &b)]).await;
    assert_eq!(a1.await[0].base_offset, 0);
    assert_eq!(a2.await[0].base_offset, 1);
    assert_eq!(e.writer.stats().segments_closed, 1);
    // The third waits for the (hour-long) interval; time is paused, so it passes at once.
    assert_eq!(a3.await[0].base_offset, 2);
    assert_eq!(e.writer.stats().segments_closed, 2);
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn kip74_first_batch_always_then_limits() {
    let e = env(small_config(), false);
    let tc = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 2, tc.clone()).await;
    let p0 = TopicIdPartition::new(t, 0);
    let p1 = TopicIdPartition::new(t, 1);
    let big = "y".repeat(5000);
    for _ in 0..3 {
        let b = batch(&[big.as_str()]);
        let r = e
            .writer
            .produce(vec![produce(p0, &tc, &b), produce(p1, &tc, &b)])
            .await;
        assert!(r.iter().all(|r| r.error == ErrorCode::None));
    }
    // Limits smaller than one batch: the first partition still gets one batch, the second none.
    let mut reqs = vec![fetch_req(p0, 0), fetch_req(p1, 0)];
    reqs[0].partition_max_bytes = 100;
    reqs[1].partition_max_bytes = 100;
    let got = e.fetcher.fetch(&reqs, 100).await.unwrap();
    assert_eq!(served_batches(&got[0]).len(), 1);
    assert_eq!(got[1].records_len(), 0);
    assert_eq!(got[1].error, ErrorCode::None);
    // A request limit of about two batches.
    let got = e.fetcher.fetch(&[fetch_req(p0, 0)], 10_200).await.unwrap();
    assert_eq!(served_batches(&got[0]).len(), 2);
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn close_drains_and_later_appends_fail() {
    let config = WalWriterConfig::default().with_commit_interval(Duration::from_secs(3600));
    let e = env(config, false);
    let tc = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let pending = e.writer.append(vec![produce(p, &tc, &batch(&["a"]))]).await;
    e.writer.close().await;
    assert_eq!(pending.await[0].error, ErrorCode::None);
    let after = e
        .writer
        .produce(vec![produce(p, &tc, &batch(&["b"]))])
        .await;
    assert_eq!(after[0].error, ErrorCode::KafkaStorageError);
}

/// N writers (brokers) × M partitions concurrently: every acknowledged batch is read back exactly
/// once, in offset order, gap-free, bytes identical but for the injected fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writers_many_partitions_read_back_exactly_once() {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator = Arc::new(InMemoryCoordinator::new(Arc::new(SystemClock)));
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 8, tc.clone()).await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let writer = Arc::new(
            WalWriter::builder(storage.clone(), coordinator.clone())
                .with_config(
                    WalWriterConfig::default()
                        .with_broker_id(w)
                        .with_commit_interval(Duration::from_millis(5)),
                )
                .with_clock(Arc::new(SystemClock))
                .build()
                .unwrap(),
        );
        let tc = tc.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(TopicIdPartition, i64, Bytes)> = Vec::new();
            for round in 0..20 {
                let now = SystemClock.now_ms();
                let parts: Vec<_> = (0..8)
                    .map(|i| {
                        let value = format!("w{w}-r{round}-p{i}");
                        let b = RecordBatchBuilder::new()
                            .record(now, None, Some(value.as_bytes()))
                            .record(now, None, Some(b"second"))
                            .build()
                            .unwrap();
                        produce(TopicIdPartition::new(t, i), &tc, &b)
                    })
                    .collect();
                let sent: Vec<Bytes> = parts.iter().map(|p| p.records.clone()).collect();
                let answers = writer.produce(parts).await;
                for (a, bytes) in answers.into_iter().zip(sent) {
                    assert_eq!(a.error, ErrorCode::None, "{a:?}");
                    acked.push((a.partition, a.base_offset, bytes));
                }
            }
            writer.close().await;
            acked
        }));
    }
    let mut acked: BTreeMap<(TopicIdPartition, i64), Bytes> = BTreeMap::new();
    for task in tasks {
        for (p, offset, bytes) in task.await.unwrap() {
            assert!(
                acked.insert((p, offset), bytes).is_none(),
                "offset given twice"
            );
        }
    }
    assert_eq!(acked.len(), 4 * 20 * 8);

    let fetcher = Fetcher::builder(storage, coordinator).build().unwrap();
    for i in 0..8 {
        let p = TopicIdPartition::new(t, i);
        let mut offset = 0;
        let mut seen = 0;
        loop {
            let got = fetcher
                .fetch(&[fetch_req(p, offset)], 1 << 20)
                .await
                .unwrap();
            assert_eq!(got[0].error, ErrorCode::None);
            let batches = served_batches(&got[0]);
            if batches.is_empty() {
                break;
            }
            for b in batches {
                assert_eq!(b.base_offset(), offset, "offsets must be gap-free");
                let sent = &acked[&(p, offset)];
                assert!(same_but_injected(&b, sent));
                offset = b.last_offset() + 1;
                seen += 1;
            }
        }
        assert_eq!(seen, 4 * 20);
        assert_eq!(offset, 4 * 20 * 2);
    }
}

/// Failed uploads answer KAFKA_STORAGE_ERROR and leave no object; ambiguous uploads too; slow
/// uploads still commit in segment order. An idempotent producer retrying every failure ends with
/// each batch exactly once.
#[tokio::test(start_paused = true)]
async fn upload_faults_lose_nothing_and_idempotent_retries_never_duplicate() {
    let inner = Arc::new(ObjectStoreStorage::in_memory());
    let faulty = Arc::new(FaultyStorage::new(
        inner.clone() as Arc<dyn ObjectStorage>,
        FaultConfig::default()
            .with_seed(42)
            .with_upload_failure_rate(0.2)
            .with_ambiguous_upload_rate(0.2)
            .with_latency(Some(Latency::s3_like())),
    ));
    let coordinator = Arc::new(InMemoryCoordinator::new(clock()));
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 4, tc.clone()).await;
    let writer = Arc::new(
        WalWriter::builder(faulty.clone(), coordinator.clone())
            .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(20)))
            .with_clock(clock())
            .build()
            .unwrap(),
    );
    // Four idempotent producers, one per partition, each sending 30 batches in order and retrying
    // each until it is acknowledged (max.in.flight = 1).
    let mut tasks = Vec::new();
    for i in 0..4 {
        let writer = writer.clone();
        let tc = tc.clone();
        tasks.push(tokio::spawn(async move {
            let p = TopicIdPartition::new(t, i);
            let mut failures = 0;
            for seq in 0..30 {
                let b = idempotent_batch(100 + i64::from(i), 0, seq, &[&format!("p{i}-s{seq}")]);
                loop {
                    let r = writer.produce(vec![produce(p, &tc, &b)]).await;
                    match r[0].error {
                        ErrorCode::None => {
                            assert_eq!(r[0].base_offset, i64::from(seq));
                            break;
                        }
                        ErrorCode::KafkaStorageError | ErrorCode::RequestTimedOut => failures += 1,
                        other => panic!("unexpected {other}"),
                    }
                }
            }
            failures
        }));
    }
    let mut failures = 0;
    for task in tasks {
        failures += task.await.unwrap();
    }
    assert!(
        failures > 0,
        "the fault injection should have failed some uploads"
    );
    writer.close().await;

    // Every partition holds its 30 batches exactly once, in order.
    let fetcher = Fetcher::builder(inner.clone(), coordinator.clone())
        .build()
        .unwrap();
    for i in 0..4 {
        let p = TopicIdPartition::new(t, i);
        let got = fetcher.fetch(&[fetch_req(p, 0)], 10 << 20).await.unwrap();
        let batches = served_batches(&got[0]);
        assert_eq!(got[0].high_watermark, 30);
        assert_eq!(batches.len(), 30);
        for (seq, b) in batches.iter().enumerate() {
            assert_eq!(b.base_sequence(), seq as i32);
            assert_eq!(b.base_offset(), seq as i64);
        }
    }
    // No garbage: every object in storage is known to the coordinator (failed uploads, ambiguous
    // ones included, were deleted by the writer).
    tokio::time::sleep(Duration::from_secs(60)).await; // let the background deletes finish
    use futures::TryStreamExt;
    let listed: Vec<String> = inner
        .list("wal")
        .map_ok(|m| m.key.into_string())
        .try_collect()
        .await
        .unwrap();
    let known = coordinator.known_objects(&listed).await.unwrap();
    assert_eq!(
        known.len(),
        listed.len(),
        "orphans left: {listed:?} vs {known:?}"
    );
}

/// A commit that applied but whose answer was lost is settled before the request is answered
/// (`writer/resolve.rs`): the idempotent batch gets its offsets, not `REQUEST_TIMED_OUT`, and a
/// retry still gets the same ones. (Answering `REQUEST_TIMED_OUT` let librdkafka append a record
/// twice after an epoch bump: chaos/, `pg-cut`.) A batch without a producer id cannot be found
/// in a producer's state and keeps `REQUEST_TIMED_OUT`.
#[tokio::test(start_paused = true)]
async fn unknown_commit_outcome_that_applied_answers_the_offsets() {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let inner = Arc::new(InMemoryCoordinator::new(clock()));
    let coordinator = CommitFaults::wrap(inner.clone());
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 2, tc.clone()).await;
    let (p, q) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(small_config())
        .with_clock(clock())
        .build()
        .unwrap();
    let warmup = idempotent_batch(7, 0, 0, &["a", "b"]);
    assert_eq!(
        writer.produce(vec![produce(p, &tc, &warmup)]).await[0].error,
        ErrorCode::None
    );
    coordinator.lose_next_commits(1);
    let b = idempotent_batch(7, 0, 2, &["once"]);
    let plain = batch(&["plain"]);
    let first = writer
        .produce(vec![produce(p, &tc, &b), produce(q, &tc, &plain)])
        .await;
    assert_eq!((first[0].error, first[0].base_offset), (ErrorCode::None, 2));
    assert_eq!(first[1].error, ErrorCode::RequestTimedOut);
    assert_eq!(writer.stats().unknown_resolved, 1);
    // The object stays: it is committed.
    assert_eq!(storage.counters().snapshot().delete_requests, 0);
    let retry = writer.produce(vec![produce(p, &tc, &b)]).await;
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 2));
    let fetched = Fetcher::builder(storage, inner)
        .build()
        .unwrap()
        .fetch(&[fetch_req(p, 0)], 1 << 20)
        .await
        .unwrap();
    assert_eq!(fetched[0].high_watermark, 3, "the retry must not duplicate");
    writer.close().await;
}

/// A commit abandoned at `commit_timeout` (stalled on its way to the coordinator, and still on the
/// wire) is settled by fencing its key: it did not apply, its request is answered
/// `KAFKA_STORAGE_ERROR` (not persisted), the object is deleted, and when the stalled call
/// arrives it is refused. The batch has no producer id, so nothing but the fence keeps the late
/// commit from appending it a second time beside the retry.
#[tokio::test(start_paused = true)]
async fn unknown_commit_outcome_that_did_not_apply_is_fenced_and_not_persisted() {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let inner = Arc::new(InMemoryCoordinator::new(clock()));
    let coordinator = CommitFaults::wrap(inner.clone());
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(small_config().with_commit_timeout(Duration::from_secs(2)))
        .with_clock(clock())
        .build()
        .unwrap();
    // The commit stays on the wire after the writer gives up on it.
    coordinator.set_detached(true);
    coordinator.stall_commits();
    let b = batch(&["x"]);
    let first = writer.produce(vec![produce(p, &tc, &b)]).await;
    assert_eq!(first[0].error, ErrorCode::KafkaStorageError);
    assert_eq!(writer.stats().unknown_resolved, 1);
    assert_eq!(coordinator.stalled_commits(), 1);

    // The stalled call now reaches the coordinator, which refuses the fenced key.
    coordinator.set_detached(false);
    coordinator.release_commits();
    for _ in 0..100 {
        if coordinator.stalled_commits() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    let retry = writer.produce(vec![produce(p, &tc, &b)]).await;
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 0));
    let fetched = Fetcher::builder(storage.clone(), inner)
        .build()
        .unwrap()
        .fetch(&[fetch_req(p, 0)], 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        fetched[0].high_watermark, 1,
        "the late commit must not apply"
    );
    writer.close().await;
    assert!(
        storage.counters().snapshot().delete_requests >= 1,
        "the fenced object is deleted"
    );
}

/// While storage stalls, the bytes buffered plus in flight stay within the bound: later appends
/// wait (or fail fast), and everything completes once storage recovers.
#[tokio::test(start_paused = true)]
async fn backpressure_bounds_pending_bytes_while_storage_stalls() {
    for mode in [Backpressure::Wait, Backpressure::FailFast] {
        let inner: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
        let faulty = Arc::new(FaultyStorage::new(inner, FaultConfig::default()));
        faulty.stall_uploads();
        let coordinator = Arc::new(InMemoryCoordinator::new(clock()));
        let tc = TopicConfig::default();
        let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
        let p = TopicIdPartition::new(t, 0);
        let bound = 64 * 1024;
        let writer = Arc::new(
            WalWriter::builder(faulty.clone(), coordinator.clone())
                .with_config(
                    WalWriterConfig::default()
                        .with_seal_policy(SealPolicy::Interval)
                        .with_buffer_max_bytes(16 * 1024)
                        .with_max_pending_bytes(bound)
                        // Many upload slots, so that only the byte bound limits what piles up.
                        .with_max_concurrent_uploads(64)
                        .with_commit_interval(Duration::from_millis(10))
                        .with_backpressure(mode),
                )
                .with_clock(clock())
                .build()
                .unwrap(),
        );
        let value = "z".repeat(4000);
        let mut producers = Vec::new();
        for _ in 0..40 {
            let w = writer.clone();
            let b = batch(&[value.as_str()]);
            let tc = tc.clone();
            producers.push(tokio::spawn(async move {
                w.produce(vec![produce(p, &tc, &b)]).await
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // 40 requests of ~4 KB (160 KB) were offered; segments close at 16 KiB, so without the
        // 64 KiB bound about ten segments would be stuck in upload. With it, at most four.
        let stalled = faulty.stalled_uploads();
        assert!((1..=4).contains(&stalled), "{stalled} uploads stalled");
        if mode == Backpressure::Wait {
            assert!(
                producers.iter().all(|t| !t.is_finished()),
                "nothing can be acknowledged"
            );
        }
        faulty.release_uploads();
        let mut ok = 0;
        let mut refused = 0;
        for task in producers {
            match task.await.unwrap()[0].error {
                ErrorCode::None => ok += 1,
                ErrorCode::KafkaStorageError => refused += 1,
                other => panic!("unexpected {other}"),
            }
        }
        match mode {
            Backpressure::Wait => assert_eq!((ok, refused), (40, 0)),
            Backpressure::FailFast => assert!(refused > 0 && ok > 0, "{ok} ok, {refused} refused"),
        }
        writer.close().await;
        assert_eq!(writer.stats().pending_bytes, 0);
    }
}

/// Storage that flips the last byte of every fetched range (a corrupted disk or a cache bug).
#[derive(Debug)]
struct CorruptingStorage(Arc<ObjectStoreStorage>);

#[async_trait]
impl ObjectStorage for CorruptingStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.0.upload(key, payload).await
    }
    async fn fetch(
        &self,
        key: &ObjectKey,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let mut bytes = self.0.fetch(key, range).await?.to_vec();
        if let Some(last) = bytes.last_mut() {
            *last ^= 0x5a;
        }
        Ok(Bytes::from(bytes))
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.0.delete(keys).await
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> futures::stream::BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.0.list(prefix)
    }
}

/// Corrupted stored bytes never reach a consumer behind a valid CRC: with LogAppendTime (CRC
/// recomputed) the fetch fails with a retriable error; with CreateTime the stored CRC is served and
/// the consumer's own check sees the corruption.
#[tokio::test(start_paused = true)]
async fn corrupted_stored_batches_are_never_served_with_a_valid_crc() {
    let e = env(small_config(), false);
    let lat = TopicConfig {
        timestamp_type: TimestampType::LogAppendTime,
        ..TopicConfig::default()
    };
    let create = TopicConfig::default();
    let t_lat = topic(e.coordinator.as_ref(), "lat", 1, lat.clone()).await;
    let t_create = topic(e.coordinator.as_ref(), "create", 1, create.clone()).await;
    let p_lat = TopicIdPartition::new(t_lat, 0);
    let p_create = TopicIdPartition::new(t_create, 0);
    let answers = e
        .writer
        .produce(vec![
            produce(p_lat, &lat, &batch(&["a"])),
            produce(p_create, &create, &batch(&["b"])),
        ])
        .await;
    assert!(answers.iter().all(|a| a.error == ErrorCode::None));
    let corrupting = Arc::new(CorruptingStorage(e.storage.clone()));
    // One request per partition, so each read's last byte is that batch's last byte.
    let fetcher = Fetcher::builder(corrupting, e.coordinator.clone())
        .build()
        .unwrap();
    let got = fetcher
        .fetch(&[fetch_req(p_lat, 0)], 1 << 20)
        .await
        .unwrap();
    assert_eq!(got[0].error, ErrorCode::KafkaStorageError);
    assert_eq!(got[0].records_len(), 0);
    let got = fetcher
        .fetch(&[fetch_req(p_create, 0)], 1 << 20)
        .await
        .unwrap();
    assert_eq!(got[0].error, ErrorCode::None);
    let served = split_batches(got[0].records_bytes()).unwrap();
    assert!(
        !served[0].crc_is_valid(),
        "the consumer must be able to see the corruption"
    );
    e.writer.close().await;
}

/// The header's maxTimestamp is not trusted: the coordinator gets the largest record timestamp, so
/// a bogus header can neither dodge time retention nor skew ListOffsets; and the batch is served with
/// the records' max timestamp in its header (valid CRC), as Kafka's validator stores it.
#[tokio::test(start_paused = true)]
async fn header_max_timestamp_is_not_trusted() {
    let e = env(small_config(), false);
    let tc = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let lying = RecordBatchBuilder::new()
        .record(NOW - 5, None, Some(b"a"))
        .record(NOW, None, Some(b"b"))
        .max_timestamp(i64::MAX)
        .build()
        .unwrap();
    let answer = e.writer.produce(vec![produce(p, &tc, &lying)]).await;
    assert_eq!(answer[0].error, ErrorCode::None);
    let found = e
        .coordinator
        .list_offsets(&[ListOffsetsRequest {
            partition: p,
            timestamp: MAX_TIMESTAMP,
            isolation: Default::default(),
        }])
        .await
        .unwrap();
    assert_eq!(found[0].timestamp, NOW);
    let fetched = e.fetcher.fetch(&[fetch_req(p, 0)], 1 << 20).await.unwrap();
    let served = served_batches(&fetched[0]);
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].max_timestamp(), NOW);
    assert!(served[0].crc_is_valid());
    assert_eq!(served[0].records_bytes(), lying.records_bytes());
    e.writer.close().await;
}

/// Dropping or flushing a writer outside the runtime does not panic, and a second concurrent
/// close waits for the drain like the first.
#[test]
fn drop_outside_the_runtime_and_concurrent_close() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (writer, pending, coordinator, p) = rt.block_on(async {
        let e = env(
            WalWriterConfig::default().with_commit_interval(Duration::from_secs(3600)),
            false,
        );
        let tc = TopicConfig::default();
        let t = topic(e.coordinator.as_ref(), "t", 1, tc.clone()).await;
        let p = TopicIdPartition::new(t, 0);
        let pending = e.writer.append(vec![produce(p, &tc, &batch(&["a"]))]).await;
        (e.writer, pending, e.coordinator, p)
    });
    // Outside the runtime: seal_now seals and spawns on the writer's runtime.
    writer.seal_now();
    let answer = rt.block_on(pending);
    assert_eq!(answer[0].error, ErrorCode::None);
    let writer = Arc::new(writer);
    rt.block_on(async {
        let pending = writer
            .append(vec![produce(p, &TopicConfig::default(), &batch(&["b"]))])
            .await;
        let (w1, w2) = (writer.clone(), writer.clone());
        let (a, b) = tokio::join!(w1.close(), w2.close());
        let _ = (a, b);
        // Both closes returned: the buffered request must already be answered.
        let answer = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .unwrap();
        assert_eq!(answer[0].error, ErrorCode::None);
        let found = coordinator
            .list_offsets(&[ListOffsetsRequest {
                partition: p,
                timestamp: LATEST_TIMESTAMP,
                isolation: Default::default(),
            }])
            .await
            .unwrap();
        assert_eq!(found[0].offset, 2);
    });
    drop(writer);
    drop(rt);
}

/// Hosts spawn their Produce and Fetch handlers: both futures must be `Send + 'static` when owned.
#[tokio::test(start_paused = true)]
async fn produce_and_fetch_futures_can_be_spawned() {
    let e = env(small_config(), false);
    let tc = TopicConfig::default();
    let t = topic(e.coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let writer = Arc::new(e.writer);
    let fetcher = Arc::new(e.fetcher);
    let w = writer.clone();
    let produced =
        tokio::spawn(async move { w.produce(vec![produce(p, &tc, &batch(&["s"]))]).await })
            .await
            .unwrap();
    assert_eq!(produced[0].error, ErrorCode::None);
    let fetched = tokio::spawn(async move {
        let requests = vec![fetch_req(p, 0)];
        fetcher.fetch(&requests, 1 << 20).await
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(served_batches(&fetched[0]).len(), 1);
    writer.close().await;
}

/// A commit that certainly did not apply answers a retriable error and leaves no object behind.
#[tokio::test(start_paused = true)]
async fn a_commit_that_did_not_apply_leaves_no_object() {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let inner = Arc::new(InMemoryCoordinator::new(clock()));
    let coordinator = CommitFaults::wrap(inner.clone());
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(small_config())
        .with_clock(clock())
        .build()
        .unwrap();
    coordinator.fail_next_commits(1);
    let first = writer.produce(vec![produce(p, &tc, &batch(&["x"]))]).await;
    assert_eq!(first[0].error, ErrorCode::KafkaStorageError);
    assert!(first[0].error.is_retriable());
    tokio::time::sleep(Duration::from_secs(1)).await; // the background delete
    use futures::TryStreamExt;
    let left: Vec<_> = storage.list("wal").try_collect().await.unwrap();
    assert!(left.is_empty(), "garbage left: {left:?}");
    let retry = writer.produce(vec![produce(p, &tc, &batch(&["x"]))]).await;
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 0));
    assert_eq!(coordinator.injected_faults(), 1);
    writer.close().await;
}

/// `flush` returns only once every request appended before it is answered: with the commits
/// stalled it must keep waiting, for the segment sealed before it as for the one it seals.
#[tokio::test(start_paused = true)]
async fn flush_waits_until_every_earlier_request_is_answered() {
    use futures::FutureExt;
    let inner = Arc::new(InMemoryCoordinator::new(clock()));
    let coordinator = CommitFaults::wrap(inner);
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let writer = WalWriter::builder(
        Arc::new(ObjectStoreStorage::in_memory()),
        coordinator.clone(),
    )
    .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_secs(3600)))
    .with_clock(clock())
    .build()
    .unwrap();
    coordinator.stall_commits();
    let first = writer.append(vec![produce(p, &tc, &batch(&["a"]))]).await;
    writer.seal_now();
    let second = writer.append(vec![produce(p, &tc, &batch(&["b"]))]).await;
    let flush = writer.flush();
    tokio::pin!(flush);
    assert!(
        // (Less than the commit timeout, 30 s, after which a stalled commit is answered.)
        tokio::time::timeout(Duration::from_secs(10), &mut flush)
            .await
            .is_err(),
        "flush returned while the commits were stalled"
    );
    assert_eq!(writer.stats().segments_closed, 2, "flush sealed the buffer");
    assert_eq!(coordinator.stalled_commits(), 1);
    coordinator.release_commits();
    flush.await;
    let first = first
        .now_or_never()
        .expect("flush returned before the first request was answered");
    let second = second
        .now_or_never()
        .expect("flush returned before the second request was answered");
    assert_eq!((first[0].error, first[0].base_offset), (ErrorCode::None, 0));
    assert_eq!(
        (second[0].error, second[0].base_offset),
        (ErrorCode::None, 1)
    );
    // Nothing buffered and nothing in flight: flush returns at once, and after close too.
    tokio::time::timeout(Duration::from_millis(1), writer.flush())
        .await
        .unwrap();
    writer.close().await;
    tokio::time::timeout(Duration::from_millis(1), writer.flush())
        .await
        .unwrap();
}

/// Storage whose uploads land but report a failure (an ambiguous PUT), and whose deletes take
/// ten seconds.
#[derive(Debug)]
struct AmbiguousUploadSlowDelete {
    inner: Arc<ObjectStoreStorage>,
    deleted: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl ObjectStorage for AmbiguousUploadSlowDelete {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await?;
        Err(StorageError::Transient {
            source: "the connection dropped after the PUT was sent".into(),
        })
    }
    async fn fetch(
        &self,
        key: &ObjectKey,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let deleted = self.inner.delete(keys).await?;
        self.deleted
            .fetch_add(deleted.len(), std::sync::atomic::Ordering::SeqCst);
        Ok(deleted)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> futures::stream::BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }
}

/// `close` waits for the writer's background deletes: an ambiguously failed upload's object is
/// gone when `close` returns.
#[tokio::test(start_paused = true)]
async fn close_waits_for_the_background_deletes() {
    use futures::TryStreamExt;
    let inner = Arc::new(ObjectStoreStorage::in_memory());
    let storage = Arc::new(AmbiguousUploadSlowDelete {
        inner: inner.clone(),
        deleted: std::sync::atomic::AtomicUsize::new(0),
    });
    let coordinator = Arc::new(InMemoryCoordinator::new(clock()));
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    let writer = WalWriter::builder(storage.clone(), coordinator)
        .with_config(small_config())
        .with_clock(clock())
        .build()
        .unwrap();
    let answer = writer.produce(vec![produce(p, &tc, &batch(&["x"]))]).await;
    assert_eq!(answer[0].error, ErrorCode::KafkaStorageError);
    let landed: Vec<_> = inner.list("wal").try_collect().await.unwrap();
    assert_eq!(landed.len(), 1, "the ambiguous upload landed");
    assert_eq!(
        storage.deleted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the delete is still running"
    );
    writer.close().await;
    assert_eq!(
        storage.deleted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "close returned before the background delete ended"
    );
    let left: Vec<_> = inner.list("wal").try_collect().await.unwrap();
    assert!(left.is_empty(), "garbage left: {left:?}");
}

/// Storage whose first upload hangs for a minute (a slow PUT); later ones are immediate.
#[derive(Debug)]
struct SlowFirstUpload {
    inner: Arc<ObjectStoreStorage>,
    uploads: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl ObjectStorage for SlowFirstUpload {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        if self
            .uploads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        self.inner.upload(key, payload).await
    }
    async fn fetch(
        &self,
        key: &ObjectKey,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.inner.delete(keys).await
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> futures::stream::BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }
}

/// A slow upload is hedged: a second attempt lands, the produce is answered without waiting for the
/// first, and the late first attempt is harmless (same key, same bytes).
#[tokio::test(start_paused = true)]
async fn slow_uploads_are_hedged() {
    for hedge in [None, Some(Duration::from_millis(200))] {
        let inner = Arc::new(ObjectStoreStorage::in_memory());
        let storage = Arc::new(SlowFirstUpload {
            inner: inner.clone(),
            uploads: std::sync::atomic::AtomicU32::new(0),
        });
        let coordinator = Arc::new(InMemoryCoordinator::new(clock()));
        let tc = TopicConfig::default();
        let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
        let p = TopicIdPartition::new(t, 0);
        let writer = WalWriter::builder(storage, coordinator.clone())
            .with_config(small_config().with_hedge_uploads_after(hedge))
            .with_clock(clock())
            .build()
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = writer.produce(vec![produce(p, &tc, &batch(&["h"]))]).await;
        let waited = started.elapsed();
        assert_eq!(answer[0].error, ErrorCode::None);
        match hedge {
            None => {
                assert!(waited >= Duration::from_secs(60));
                assert_eq!(writer.stats().hedged_uploads, 0);
            }
            Some(_) => {
                // Simulated time: the commit interval plus the hedge delay, not the slow PUT.
                assert!(waited < Duration::from_secs(1), "waited {waited:?}");
                assert_eq!(writer.stats().hedged_uploads, 1);
            }
        }
        writer.close().await;
        // The slow attempt, when it lands, finds the same bytes: one object, readable.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let fetched = Fetcher::builder(inner, coordinator)
            .build()
            .unwrap()
            .fetch(&[fetch_req(p, 0)], 1 << 20)
            .await
            .unwrap();
        assert_eq!(served_batches(&fetched[0]).len(), 1);
    }
}

/// A slow coordinator cannot make uploaded segments pile up: requests not yet answered are bounded
/// by max_uncommitted_bytes, and everything completes once commits go through.
#[tokio::test(start_paused = true)]
async fn uncommitted_requests_are_bounded_when_the_coordinator_is_slow() {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator = CommitFaults::wrap(Arc::new(InMemoryCoordinator::new(clock())));
    let tc = TopicConfig::default();
    let t = topic(coordinator.as_ref(), "t", 1, tc.clone()).await;
    let p = TopicIdPartition::new(t, 0);
    coordinator.set_commit_latency(Some(Duration::from_secs(10)));
    let writer = Arc::new(
        WalWriter::builder(storage.clone(), coordinator.clone())
            .with_config(
                WalWriterConfig::default()
                    .with_buffer_max_bytes(16 * 1024)
                    .with_max_pending_bytes(32 * 1024)
                    .with_max_uncommitted_bytes(64 * 1024)
                    .with_commit_interval(Duration::from_millis(10)),
            )
            .with_clock(clock())
            .build()
            .unwrap(),
    );
    let value = "u".repeat(4000);
    let mut producers = Vec::new();
    for _ in 0..40 {
        let w = writer.clone();
        let b = batch(&[value.as_str()]);
        let tc = tc.clone();
        producers.push(tokio::spawn(async move {
            w.produce(vec![produce(p, &tc, &b)]).await
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // 160 KB offered in ~16 KiB segments: without the bound ~10 segments would be uploaded and
    // waiting; with 64 KiB at most ~4 (plus the partly filled buffer).
    let stats = writer.stats();
    assert!(
        (1..=5).contains(&stats.segments_uploaded),
        "{} segments uploaded while the first commit waits",
        stats.segments_uploaded
    );
    assert!(stats.uncommitted_bytes <= 64 * 1024);
    assert!(producers.iter().all(|t| !t.is_finished()));
    for task in producers {
        assert_eq!(task.await.unwrap()[0].error, ErrorCode::None);
    }
    writer.close().await;
    assert_eq!(writer.stats().uncommitted_bytes, 0);
}
