//! `SealPolicy`: the fixed commit interval against adaptive sealing (group commit), on a store with a
//! constant 100 ms latency, in simulated time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultyStorage, Latency};
use tokio::time::Instant;
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;
const STORE_LATENCY: Duration = Duration::from_millis(100);

struct Env {
    writer: Arc<WalWriter>,
    storage: Arc<FaultyStorage<ObjectStoreStorage>>,
    partition: TopicIdPartition,
    config: TopicConfig,
}

async fn env(policy: SealPolicy) -> Env {
    let clock = ManualClock::new(NOW);
    let coordinator = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let storage = Arc::new(FaultyStorage::new(
        ObjectStoreStorage::in_memory(),
        FaultConfig::default()
            .with_latency(Some(Latency::log_normal(STORE_LATENCY, STORE_LATENCY))),
    ));
    let config = TopicConfig::default();
    let topic_id = Uuid::from_u128(7);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "t".into(),
            partitions: 1,
            config: config.clone(),
        })
        .await
        .unwrap();
    let writer = WalWriter::builder(storage.clone(), coordinator)
        .with_config(
            WalWriterConfig::default()
                .with_commit_interval(Duration::from_millis(250))
                .with_seal_policy(policy),
        )
        .with_clock(clock)
        .build()
        .unwrap();
    Env {
        writer: Arc::new(writer),
        storage,
        partition: TopicIdPartition::new(topic_id, 0),
        config,
    }
}

fn records() -> Bytes {
    RecordBatchBuilder::new()
        .record(NOW, None, Some(b"v"))
        .build()
        .unwrap()
        .into_bytes()
}

impl Env {
    async fn produce(&self) -> tokio::task::JoinHandle<(ErrorCode, Duration)> {
        let started = Instant::now();
        let pending = self
            .writer
            .append(vec![ProducePartition {
                partition: self.partition,
                config: Arc::new(self.config.clone()),
                records: records(),
                txn_seq: None,
            }])
            .await;
        tokio::spawn(async move {
            let answer = pending.await;
            (answer[0].error, started.elapsed())
        })
    }

    /// `requests` requests, one every 5 ms; each must succeed. Returns the longest wait for an
    /// answer.
    async fn steady_load(&self, requests: usize) -> Duration {
        let mut answers = Vec::new();
        for _ in 0..requests {
            answers.push(self.produce().await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut worst = Duration::ZERO;
        for a in answers {
            let (error, latency) = a.await.unwrap();
            assert_eq!(error, ErrorCode::None);
            worst = worst.max(latency);
        }
        worst
    }
}

/// At low load a request waits for the interval with `Interval`, and only for its upload with
/// `Adaptive`.
#[tokio::test(start_paused = true)]
async fn adaptive_seals_at_once_when_the_pipeline_is_idle() {
    let fixed = env(SealPolicy::Interval).await;
    let (error, fixed_latency) = fixed.produce().await.await.unwrap();
    assert_eq!(error, ErrorCode::None);
    assert!(
        fixed_latency >= Duration::from_millis(350),
        "{fixed_latency:?}"
    );

    let adaptive = env(SealPolicy::adaptive(Duration::from_millis(50), 1)).await;
    let (error, latency) = adaptive.produce().await.await.unwrap();
    assert_eq!(error, ErrorCode::None);
    assert!(
        latency >= STORE_LATENCY && latency < Duration::from_millis(150),
        "one upload, no interval: {latency:?}"
    );
    fixed.writer.close().await;
    adaptive.writer.close().await;
}

/// Under a steady load, while one upload runs the requests accumulate into the next segment: one
/// PUT per upload time instead of one per request, and never more than one per `min_interval`.
#[tokio::test(start_paused = true)]
async fn adaptive_fills_segments_while_the_pipeline_is_busy() {
    for (max_in_flight, min_interval) in [(1, 20), (4, 150)] {
        let e = env(SealPolicy::adaptive(
            Duration::from_millis(min_interval),
            max_in_flight,
        ))
        .await;
        // One request every 5 ms for 2 s.
        let worst = e.steady_load(400).await;
        let puts = e.writer.stats().segments_uploaded;
        // By the PUT-rate bound: at most one seal per min_interval over the 2 s (+ the first).
        assert!(
            puts <= 2_000 / min_interval + 2,
            "max_in_flight {max_in_flight}: {puts} PUTs"
        );
        if max_in_flight == 1 {
            // One upload at a time: about one segment per 100 ms upload.
            assert!((15..=25).contains(&puts), "{puts} PUTs");
            // A request waits at most for the upload in progress plus its own (and the commit).
            assert!(worst < Duration::from_millis(250), "{worst:?}");
        }
        e.writer.close().await;
        assert_eq!(e.storage.stalled_uploads(), 0);
    }
}

/// A buffer holding `early_bytes` is sealed before `min_interval` has passed (a producer's closed
/// loop of requests in flight is not held to one segment per interval), at once when the pipeline
/// has room, else as soon as an upload ends; below `early_bytes` the interval still holds.
#[tokio::test(start_paused = true)]
async fn adaptive_seals_early_bytes_without_waiting_for_the_interval() {
    let batch = records().len();
    let e = env(SealPolicy::adaptive(Duration::from_secs(1), 1).with_early_bytes(3 * batch)).await;
    let first = e.produce().await; // the first seal: at once
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(e.writer.stats().segments_closed, 1);
    // Two batches: below early_bytes, so they wait for min_interval (and the upload slot).
    let mut rest = vec![e.produce().await, e.produce().await];
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        e.writer.stats().segments_closed,
        1,
        "below early_bytes: wait"
    );
    // The third reaches early_bytes; the first upload is done (100 ms), so the slot is free.
    rest.push(e.produce().await);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        e.writer.stats().segments_closed,
        2,
        "early_bytes buffered: sealed at once"
    );

    // The pipeline full (max_in_flight 1, the upload stalled): early_bytes waits for the slot,
    // then is sealed when the upload ends, long before min_interval and commit_interval.
    e.storage.stall_uploads();
    for _ in 0..3 {
        rest.push(e.produce().await);
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(e.writer.stats().segments_closed, 2, "the pipeline is full");
    e.storage.release_uploads();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        e.writer.stats().segments_closed,
        3,
        "sealed when the slot freed"
    );
    assert_eq!(first.await.unwrap().0, ErrorCode::None);
    for r in rest {
        assert_eq!(r.await.unwrap().0, ErrorCode::None);
    }
    e.writer.close().await;
}

/// `commit_interval` stays the longest a batch waits to be sealed, even when the pipeline is full.
#[tokio::test(start_paused = true)]
async fn the_commit_interval_still_bounds_the_wait_when_uploads_stall() {
    let e = env(SealPolicy::adaptive(Duration::from_millis(10), 1)).await;
    e.storage.stall_uploads();
    let first = e.produce().await; // sealed at once, then its upload stalls
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(e.writer.stats().segments_closed, 1);
    let second = e.produce().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        e.writer.stats().segments_closed,
        1,
        "the pipeline is full: wait"
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(
        e.writer.stats().segments_closed,
        2,
        "sealed at commit_interval"
    );
    e.storage.release_uploads();
    assert_eq!(first.await.unwrap().0, ErrorCode::None);
    assert_eq!(second.await.unwrap().0, ErrorCode::None);
    e.writer.close().await;
}

/// An idle adaptive writer makes no PUT, and `max_in_flight` 0 is refused.
#[tokio::test(start_paused = true)]
async fn idle_adaptive_writers_make_no_puts_and_bad_settings_are_refused() {
    let e = env(SealPolicy::adaptive(Duration::from_millis(10), 2)).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(e.writer.stats().segments_closed, 0);
    e.writer.close().await;
    let clock = ManualClock::new(NOW);
    let refused = WalWriter::builder(
        Arc::new(ObjectStoreStorage::in_memory()),
        Arc::new(InMemoryCoordinator::new(clock.clone())),
    )
    .with_config(
        WalWriterConfig::default()
            .with_seal_policy(SealPolicy::adaptive(Duration::from_millis(10), 0)),
    )
    .with_clock(clock)
    .build();
    assert!(matches!(
        refused,
        Err(ConfigError::Invalid {
            field: "seal_policy",
            ..
        })
    ));
}

/// `upload_multiple_pct`: on a store whose uploads take 100 ms, seals are at least 150 ms apart
/// (at 150%) however short `min_interval` is; without it, `min_interval` and the pipeline's room
/// alone space them.
#[tokio::test(start_paused = true)]
async fn seals_follow_the_upload_time_when_asked() {
    let mut puts_by_pct = Vec::new();
    for pct in [0, 150] {
        let e =
            env(SealPolicy::adaptive(Duration::from_millis(10), 4).with_upload_multiple_pct(pct))
                .await;
        // One request every 5 ms for 3 s.
        let worst = e.steady_load(600).await;
        let puts = e.writer.stats().segments_uploaded;
        if pct == 150 {
            // Before the first upload ends there is no upload time yet: `min_interval` spaces
            // the first seals, up to `max_in_flight` (4) of them. After that, at most one seal
            // per 150 ms over the 3 s. A request waits at most one spacing plus its upload (and
            // the commit).
            assert!(puts <= 4 + 3_000 / 150 + 1, "{puts} PUTs");
            assert!(worst < Duration::from_millis(300), "{worst:?}");
        } else {
            // Four uploads in flight of 100 ms each, one seal per 10 ms at most: ~40 per second.
            assert!(puts >= 100, "{puts} PUTs");
        }
        puts_by_pct.push(puts);
        e.writer.close().await;
    }
    assert!(puts_by_pct[1] * 4 < puts_by_pct[0], "{puts_by_pct:?}");
}
