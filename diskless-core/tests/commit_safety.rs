//! Safety at the commit point (issue #12 item 1): a commit that stalls after every broker-side check
//! can never land on an object the orphan collector deleted, and the writer gives up on a commit
//! after its `commit_timeout`, leaving the object to the collector.
//!
//! The coordinator clock is a `ManualClock` started at the real time, because the writer names its
//! objects with UUID v7 keys from the system clock: key times and coordinator time then agree, as on
//! a real deployment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::*;
use diskless_core::lifecycle::{
    OrphanCollector, OrphanConfig, ProducerExpirer, ProducerExpiryConfig,
};
use diskless_core::*;
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::{CommitFaults, FaultyCoordinator, InMemoryCoordinator};
use futures::StreamExt;
use uuid::Uuid;

/// A fresh topic id, drawn deterministically (`Uuid::new_v4` is not used in this workspace).
fn next_uuid() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(u128::from(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

/// The real time: the orphan collector compares object keys' times with the store's dates.
fn real_now_ms() -> i64 {
    SystemClock.now_ms()
}

struct Env {
    clock: Arc<ManualClock>,
    storage: Arc<ObjectStoreStorage>,
    model: Arc<InMemoryCoordinator>,
    faulty: Arc<FaultyCoordinator>,
    writer: WalWriter,
    fetcher: Fetcher,
    config: TopicConfig,
    partition: TopicIdPartition,
}

async fn env(commit_timeout: Duration) -> Env {
    let clock = ManualClock::new(real_now_ms());
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let model = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let faulty = CommitFaults::wrap(model.clone());
    let config = TopicConfig::default();
    let topic_id = next_uuid();
    model
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "safety".into(),
            partitions: 1,
            config: config.clone(),
        })
        .await
        .unwrap();
    let writer = WalWriter::builder(storage.clone(), faulty.clone())
        .with_config(
            WalWriterConfig::default()
                .with_commit_interval(Duration::from_millis(10))
                .with_commit_timeout(commit_timeout),
        )
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let fetcher = Fetcher::builder(storage.clone(), model.clone())
        .build()
        .unwrap();
    Env {
        clock,
        storage,
        model,
        faulty,
        writer,
        fetcher,
        config,
        partition: TopicIdPartition::new(topic_id, 0),
    }
}

fn records(producer: Option<(i64, i16, i32)>, values: &[&str]) -> Bytes {
    let mut b = RecordBatchBuilder::new();
    if let Some((id, epoch, seq)) = producer {
        b = b.producer(id, epoch, seq);
    }
    for v in values {
        b = b.record(real_now_ms(), None, Some(v.as_bytes()));
    }
    b.build().unwrap().as_bytes().clone()
}

impl Env {
    /// Appends (the request is in the writer's buffer when this returns) and awaits the answer in a
    /// task.
    async fn produce(&self, records: Bytes) -> tokio::task::JoinHandle<Vec<PartitionResponse>> {
        let pending = self
            .writer
            .append(vec![ProducePartition {
                partition: self.partition,
                config: Arc::new(self.config.clone()),
                records,
                txn_seq: None,
            }])
            .await;
        tokio::spawn(pending)
    }

    async fn objects(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .storage
            .list("wal")
            .map(|m| m.unwrap().key.as_str().to_string())
            .collect()
            .await;
        keys.sort();
        keys
    }

    async fn wait_stalled(&self, n: u64) {
        for _ in 0..10_000 {
            if self.faulty.stalled_commits() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the commit never stalled");
    }

    /// Every offset below the high watermark is readable, and the high watermark is `expected`.
    async fn check_readable(&self, expected_hwm: i64) {
        let fetched = self
            .fetcher
            .fetch(
                &[FetchPartition {
                    partition: self.partition,
                    fetch_offset: 0,
                    partition_max_bytes: 1 << 20,
                    leader_epoch: 0,
                    isolation: Default::default(),
                }],
                1 << 20,
            )
            .await
            .expect("every acknowledged batch is readable");
        assert_eq!(fetched[0].error, ErrorCode::None, "{:?}", fetched[0]);
        assert_eq!(fetched[0].high_watermark, expected_hwm);
    }
}

/// The reproduction from the issue: a commit passes every broker-side check, stalls, the orphan
/// collector (default settings) suspects and then deletes the object, the stalled commit goes on
/// 22 minutes later. The coordinator refuses it at the commit point (both the fence and, by then, the
/// deadline apply; the next test isolates the fence), the producer gets an error, and everything
/// acknowledged stays readable.
#[tokio::test(start_paused = true)]
async fn a_stalled_commit_cannot_land_on_a_collected_object() {
    let e = env(Duration::from_secs(3600)).await;
    let acked = e.produce(records(None, &["before"])).await.await.unwrap();
    assert_eq!(acked[0].error, ErrorCode::None);

    e.faulty.stall_commits();
    let stalled = e.produce(records(None, &["stalled"])).await;
    e.wait_stalled(1).await;
    let keys = e.objects().await;
    assert_eq!(keys.len(), 2);

    let collector = OrphanCollector::new(
        e.model.clone(),
        e.storage.clone(),
        e.clock.clone(),
        OrphanConfig::new("wal"),
    )
    .unwrap();
    e.clock.advance(16 * 60 * 1000);
    collector.run_pass().await.unwrap();
    e.clock.advance(6 * 60 * 1000);
    let report = collector.run_pass().await.unwrap();
    assert_eq!(report.deleted, 1, "{report:?}");
    assert_eq!(
        e.objects().await.len(),
        1,
        "the stalled segment's object is gone"
    );

    e.faulty.release_commits();
    let answer = stalled.await.unwrap();
    assert_ne!(answer[0].error, ErrorCode::None, "{answer:?}");
    assert!(answer[0].error.is_retriable(), "{answer:?}");
    e.check_readable(1).await;
    e.writer.close().await;
}

/// The transaction guard (issue #14, enforced inside the commit by the coordinator's transaction
/// rules: `check_txn` in the model, `sqlite/commit.rs`, PostgreSQL's commit function): a
/// transactional batch verified for transaction 1 stalls after every broker-side check; meanwhile
/// the transaction coordinator aborts transaction 1 and its marker is written to the partition.
/// When the stalled commit lands, it must not open a transaction nobody will ever end (the last
/// stable offset would stay behind it forever and every `read_committed` consumer would hang): it
/// is refused with INVALID_TXN_STATE, the partition stays stable, and the producer's next
/// transaction is accepted.
#[tokio::test(start_paused = true)]
async fn a_stalled_transactional_commit_cannot_reopen_an_ended_transaction() {
    let e = env(Duration::from_secs(3600)).await;
    let txn_records = |seq: i32, value: &str| {
        RecordBatchBuilder::new()
            .producer(7, 0, seq)
            .transactional(true)
            .record(real_now_ms(), None, Some(value.as_bytes()))
            .build()
            .unwrap()
            .as_bytes()
            .clone()
    };
    let produce = |records: Bytes, txn_seq: i64| {
        e.writer.append(vec![
            ProducePartition::new(e.partition, Arc::new(e.config.clone()), records)
                .with_txn_seq(txn_seq),
        ])
    };
    e.faulty.stall_commits();
    let stalled = tokio::spawn(produce(txn_records(0, "late"), 1).await);
    e.wait_stalled(1).await;

    let marker = e
        .model
        .write_txn_markers(&[TxnMarker {
            partition: e.partition,
            producer_id: 7,
            producer_epoch: 0,
            coordinator_epoch: 0,
            commit: false,
            txn_seq: Some(1),
        }])
        .await
        .unwrap();
    assert_eq!((marker[0].error, marker[0].offset), (ErrorCode::None, 0));

    e.faulty.release_commits();
    let answer = stalled.await.unwrap();
    assert_eq!(answer[0].error, ErrorCode::InvalidTxnState, "{answer:?}");
    let state = e
        .model
        .producer_state(e.partition, 7)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        state.current_txn_first_offset, None,
        "no transaction left open"
    );
    let read = |fetch_offset| FetchPartition {
        partition: e.partition,
        fetch_offset,
        partition_max_bytes: 1 << 20,
        leader_epoch: 0,
        isolation: IsolationLevel::ReadCommitted,
    };
    let fetched = e.fetcher.fetch(&[read(0)], 1 << 20).await.unwrap();
    assert_eq!(
        (fetched[0].high_watermark, fetched[0].last_stable_offset),
        (1, 1),
        "the partition is stable: only the marker"
    );

    // The producer's next transaction (verified for 2) opens and is read once committed.
    let next = produce(txn_records(0, "next"), 2).await.await;
    assert_eq!((next[0].error, next[0].base_offset), (ErrorCode::None, 1));
    e.check_readable(2).await;
    e.writer.close().await;
}

/// Even a collector configured against the rules (no candidate age, no recheck delay) cannot make a
/// late commit land on a deleted object: it deletes only keys the coordinator fenced, and the
/// coordinator refuses a fenced key's commit. Before fences, the stalled commit landed and was
/// acknowledged, and its offset was unreadable ("object not found").
#[tokio::test(start_paused = true)]
async fn a_fenced_object_is_never_committed_whatever_the_collector_settings() {
    let e = env(Duration::from_secs(3600)).await;
    e.faulty.stall_commits();
    let stalled = e.produce(records(Some((7, 0, 0)), &["a", "b"])).await;
    e.wait_stalled(1).await;
    let mut config = OrphanConfig::new("wal");
    config.max_commit_age = Duration::ZERO;
    config.recheck_delay = Duration::ZERO;
    let collector =
        OrphanCollector::new(e.model.clone(), e.storage.clone(), e.clock.clone(), config).unwrap();
    e.clock.advance(1_000);
    collector.run_pass().await.unwrap();
    e.clock.advance(1_000);
    let report = collector.run_pass().await.unwrap();
    assert_eq!(report.deleted, 1, "{report:?}");

    e.faulty.release_commits();
    let answer = stalled.await.unwrap();
    assert_eq!(answer[0].error, ErrorCode::RequestTimedOut, "{answer:?}");
    e.check_readable(0).await;

    // The producer's retry goes into a new segment and is appended exactly once.
    let retry = e
        .produce(records(Some((7, 0, 0)), &["a", "b"]))
        .await
        .await
        .unwrap();
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 0));
    e.check_readable(2).await;
    e.writer.close().await;
}

/// The writer abandons a commit after `commit_timeout`, and the coordinator cannot be asked what it
/// did (`fence_orphans` fails too): the request is answered REQUEST_TIMED_OUT, the object stays
/// (its commit might still apply) for the collector, which fences and deletes it. The idempotent
/// producer's retry is appended once. (With a coordinator that answers, the outcome is settled
/// first: `unknown_commit_outcome_*` in produce_fetch.rs.)
#[tokio::test(start_paused = true)]
async fn the_writer_gives_up_after_its_commit_timeout() {
    let e = env(Duration::from_secs(5)).await;
    e.faulty.set_fences_failing(true);
    e.faulty.stall_commits();
    let started = tokio::time::Instant::now();
    let answer = e
        .produce(records(Some((3, 0, 0)), &["x"]))
        .await
        .await
        .unwrap();
    assert_eq!(answer[0].error, ErrorCode::RequestTimedOut, "{answer:?}");
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert_eq!(e.writer.stats().commit_timeouts, 1);
    assert_eq!(e.writer.stats().unknown_resolved, 0);
    let keys = e.objects().await;
    assert_eq!(
        keys.len(),
        1,
        "an abandoned commit's object is left to the collector"
    );
    e.faulty.release_commits();

    let retry = e
        .produce(records(Some((3, 0, 0)), &["x"]))
        .await
        .await
        .unwrap();
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 0));
    e.check_readable(1).await;

    let collector = OrphanCollector::new(
        e.model.clone(),
        e.storage.clone(),
        e.clock.clone(),
        OrphanConfig::new("wal"),
    )
    .unwrap();
    e.clock.advance(16 * 60 * 1000);
    collector.run_pass().await.unwrap();
    e.clock.advance(6 * 60 * 1000);
    assert_eq!(collector.run_pass().await.unwrap().deleted, 1);
    let left = e.objects().await;
    assert_eq!(left.len(), 1);
    assert_ne!(
        left[0], keys[0],
        "the abandoned object was collected, the committed one kept"
    );
    e.check_readable(1).await;
    e.writer.close().await;
}

/// A zero commit timeout is a configuration error.
#[tokio::test]
async fn a_zero_commit_timeout_is_refused() {
    let clock = ManualClock::new(real_now_ms());
    let r = WalWriter::builder(
        Arc::new(ObjectStoreStorage::in_memory()),
        Arc::new(InMemoryCoordinator::new(clock.clone())),
    )
    .with_config(WalWriterConfig::default().with_commit_timeout(Duration::ZERO))
    .with_clock(clock)
    .build();
    assert!(matches!(
        r,
        Err(ConfigError::Invalid {
            field: "commit_timeout",
            ..
        })
    ));
}

/// Producer state expires through the lifecycle worker: idle producers go, active ones stay.
#[tokio::test(start_paused = true)]
async fn producer_expiry_pass_expires_idle_producers() {
    let e = env(Duration::from_secs(30)).await;
    for (id, value) in [(1, "a"), (2, "b")] {
        let r = e
            .produce(records(Some((id, 0, 0)), &[value]))
            .await
            .await
            .unwrap();
        assert_eq!(r[0].error, ErrorCode::None);
    }
    let expirer = ProducerExpirer::new(e.model.clone(), ProducerExpiryConfig::default()).unwrap();
    e.clock.advance(23 * 3600 * 1000);
    // Producer 2 is active 23 h later (committed directly: the writer's keys carry the real time,
    // which the advanced coordinator clock would refuse as past the commit deadline).
    let r = e
        .model
        .commit_file(CommitFileRequest {
            object_key: "wal/direct".into(),
            uploader_broker_id: 0,
            object_size: 101,
            owners: vec![0],
            batches: vec![CommitBatch {
                partition: e.partition,
                byte_offset: 1,
                byte_size: 100,
                record_count: 1,
                base_timestamp: 0,
                max_timestamp: 0,
                timestamp_type: TimestampType::CreateTime,
                producer_id: 2,
                producer_epoch: 0,
                base_sequence: 1,
                last_sequence: 1,
                transactional: false,
                txn_seq: None,
            }],
        })
        .await
        .unwrap();
    assert_eq!(r[0].error, ErrorCode::None);
    assert_eq!(expirer.run_pass().await.unwrap().expired, 0);
    e.clock.advance(3600 * 1000);
    assert_eq!(expirer.run_pass().await.unwrap().expired, 1);
    assert_eq!(e.model.producer_state(e.partition, 1).await.unwrap(), None);
    assert!(
        e.model
            .producer_state(e.partition, 2)
            .await
            .unwrap()
            .is_some()
    );
    e.writer.close().await;
}

/// Issue #25, end to end: an idempotent producer's first attempt stalls on its way from one
/// broker; the client's retry through another broker is acknowledged at offset 0; the topic's
/// `producer.id.expiration.ms` (60 s) passes and the expiry worker runs; then the first attempt
/// lands, within its commit deadline. It is answered as the duplicate of offset 0, and the record
/// is read once: the coordinator kept the state (floor: twice `max_commit_age`). With the old
/// expiry the first attempt was appended again at offset 1.
#[tokio::test(start_paused = true)]
async fn a_resend_stalled_past_the_topics_expiration_is_still_a_duplicate() {
    let mut e = env(Duration::from_secs(3600)).await;
    e.config = TopicConfig::default().with_producer_id_expiration_ms(60_000);
    e.model
        .alter_topic_config(e.partition.topic_id, e.config.clone())
        .await
        .unwrap();
    let batch = records(Some((9, 0, 0)), &["once"]);
    e.faulty.stall_commits();
    let first = e.produce(batch.clone()).await;
    e.wait_stalled(1).await;

    // The retry, through a broker whose link is fine.
    let other = WalWriter::builder(e.storage.clone(), e.model.clone())
        .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(10)))
        .with_clock(e.clock.clone())
        .build()
        .unwrap();
    let retry = other
        .produce(vec![ProducePartition::new(
            e.partition,
            Arc::new(e.config.clone()),
            batch,
        )])
        .await;
    assert_eq!((retry[0].error, retry[0].base_offset), (ErrorCode::None, 0));

    e.clock.advance(61_000);
    let expirer = ProducerExpirer::new(e.model.clone(), ProducerExpiryConfig::default()).unwrap();
    assert_eq!(expirer.run_pass().await.unwrap().expired, 0);

    e.faulty.release_commits();
    let answer = first.await.unwrap();
    assert_eq!(
        (answer[0].error, answer[0].base_offset),
        (ErrorCode::None, 0),
        "answered as the duplicate of the retry: {answer:?}"
    );
    e.check_readable(1).await;
    other.close().await;
    e.writer.close().await;
}

/// The key of a segment carries the time its oldest request reached the writer, not the seal's:
/// the commit deadline (and so producer expiry's floor) counts from when a batch was handed over,
/// however long it then waited in the writer.
#[tokio::test(start_paused = true)]
async fn a_segment_key_carries_its_oldest_request_time() {
    let e = env(Duration::from_secs(3600)).await;
    // A writer that seals only on its interval timer.
    let writer = WalWriter::builder(e.storage.clone(), e.model.clone())
        .with_config(
            WalWriterConfig::default()
                .with_seal_policy(SealPolicy::Interval)
                .with_commit_interval(Duration::from_secs(1)),
        )
        .with_clock(e.clock.clone())
        .build()
        .unwrap();
    let appended_at = e.clock.now_ms();
    let pending = writer
        .append(vec![ProducePartition::new(
            e.partition,
            Arc::new(e.config.clone()),
            records(None, &["waited"]),
        )])
        .await;
    // The writer's clock moves on while the request waits for the seal.
    e.clock.advance(5_000);
    assert!(e.objects().await.is_empty(), "not sealed yet");
    let answer = pending.await;
    assert_eq!(answer[0].error, ErrorCode::None, "{answer:?}");
    let keys = e.objects().await;
    assert_eq!(keys.len(), 1);
    assert_eq!(object_key_time_ms(&keys[0]), Some(appended_at), "{keys:?}");
    writer.close().await;
    e.writer.close().await;
}
