//! The metrics of the consume path and of the lifecycle workers, seen by a test recorder
//! (`metrics_util`'s `DebuggingRecorder`, installed for the test's thread on a current-thread
//! runtime): each series once per fetch and per pass, with the values the operation's answer
//! implies, and cache hit and miss bytes that add up to the bytes read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_common::metrics as m;
use diskless_coordinator::*;
use diskless_core::fetcher::{FetchPartition, Fetcher, FetcherConfig};
use diskless_core::lifecycle::{
    CleanerConfig, LifecycleError, ObjectCleaner, OrphanCollector, OrphanConfig, ProducerExpirer,
    ProducerExpiryConfig, RetentionConfig, RetentionEnforcer,
};
use diskless_core::{RecordBatch, RecordBatchBuilder, SegmentBuilder, validate_batch};
use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::keys::v7_key;
use futures::future::BoxFuture;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use uuid::Uuid;

/// Far ahead of the real time, so that object key times (from the manual clock) are later than
/// the in-memory store's real-time `last_modified` dates, and the orphan collector dates objects
/// by their keys.
const T0: i64 = 4_102_444_800_000;
const TOPIC: Uuid = Uuid::from_u128(0x16);

/// Runs `test` on a current-thread runtime with a fresh recorder for this thread.
fn with_recorder<F: Future<Output = ()>>(test: impl FnOnce(Snapshotter) -> F) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(snapshotter)));
}

/// What was recorded since the last look: each counter's total and each histogram's number of
/// samples, by `name{label=value,...}`. Series registered earlier and not emitted since show 0.
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    samples: BTreeMap<String, usize>,
}

impl Seen {
    fn take(snapshotter: &Snapshotter) -> Seen {
        let mut seen = Seen::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = if labels.is_empty() {
                key.name().to_string()
            } else {
                format!("{}{{{}}}", key.name(), labels.join(","))
            };
            match value {
                DebugValue::Counter(v) => {
                    seen.counters.insert(name, v);
                }
                DebugValue::Histogram(v) => {
                    seen.samples.insert(name, v.len());
                }
                DebugValue::Gauge(_) => {}
            }
        }
        seen
    }

    fn counter(&self, name: &str) -> u64 {
        *self
            .counters
            .get(name)
            .unwrap_or_else(|| panic!("{name} never emitted: {self:?}"))
    }

    fn samples(&self, name: &str) -> usize {
        self.samples.get(name).copied().unwrap_or(0)
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// A coordinator whose every call fails (certainly not applied).
#[derive(Debug, Default)]
struct Down;

impl CoordinatorLayer for Down {
    fn around<'a, T: Send + 'a>(
        &'a self,
        _op: CoordinatorOp,
        _call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        Box::pin(async { Err(CoordinatorError::Unavailable("down".into())) })
    }
}

struct Env {
    clock: Arc<ManualClock>,
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
}

impl Env {
    async fn new(config: TopicConfig) -> Env {
        let clock = ManualClock::new(T0);
        let coordinator: Arc<dyn BatchCoordinator> =
            Arc::new(InMemoryCoordinator::new(clock.clone()));
        coordinator
            .create_topic(CreateTopicRequest {
                topic_id: TOPIC,
                name: "t".to_string(),
                partitions: 1,
                config,
            })
            .await
            .unwrap();
        Env {
            clock,
            coordinator,
            storage: Arc::new(ObjectStoreStorage::in_memory()),
        }
    }

    fn down(&self) -> Arc<dyn BatchCoordinator> {
        Arc::new(Layered::new(self.coordinator.clone(), Down))
    }

    /// Uploads one segment of `batches` and commits it; returns the batches as stored.
    async fn produce(&self, batches: Vec<RecordBatch>) -> (ObjectKey, Vec<RecordBatch>) {
        let p = TopicIdPartition::new(TOPIC, 0);
        let now = self.clock.now_ms();
        let mut segment = SegmentBuilder::new();
        for batch in &batches {
            segment.add(p, batch.clone());
        }
        let segment = segment.finish();
        let key = ObjectKey::parse(&v7_key(now)).unwrap();
        self.storage.upload(&key, &segment.chunks).await.unwrap();
        let commit = batches
            .iter()
            .zip(&segment.batches)
            .map(|(batch, at)| {
                validate_batch(batch, &TopicConfig::default(), now)
                    .unwrap()
                    .commit_batch(p, at.byte_offset)
            })
            .collect();
        let results = self
            .coordinator
            .commit_file(CommitFileRequest {
                object_key: key.as_str().to_string(),
                uploader_broker_id: 1,
                object_size: segment.size,
                owners: vec![0],
                batches: commit,
            })
            .await
            .unwrap();
        assert!(results.iter().all(|r| r.error == ErrorCode::None));
        (key, batches)
    }
}

fn batch(now: i64, value_len: usize) -> RecordBatch {
    RecordBatchBuilder::new()
        .record(now, Some(b"k"), Some(&vec![7u8; value_len]))
        .build()
        .unwrap()
}

fn from_start(partition_max_bytes: u32) -> [FetchPartition; 1] {
    [FetchPartition {
        partition: TopicIdPartition::new(TOPIC, 0),
        fetch_offset: 0,
        partition_max_bytes,
        leader_epoch: 0,
        isolation: Default::default(),
    }]
}

fn fetch_ok() -> String {
    series(m::FETCH_SECONDS, &[(m::OUTCOME, m::OK)])
}

fn fetch_error() -> String {
    series(m::FETCH_SECONDS, &[(m::OUTCOME, m::ERROR)])
}

#[test]
fn each_fetch_records_its_series_once_and_cache_hits_and_misses_add_up_to_the_bytes_read() {
    with_recorder(|snapshotter| async move {
        let env = Env::new(TopicConfig::default()).await;
        let (key, batches) = env.produce(vec![batch(T0, 300), batch(T0, 500)]).await;
        let (first, second) = (batches[0].len() as u64, batches[1].len() as u64);
        // Blocks smaller than the batches: each batch spans blocks, and the second starts in the
        // block where the first ends.
        let block = 128u64;
        let cache: Arc<dyn LocalCache> =
            Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
        let fetcher = Fetcher::builder(env.storage.clone(), env.coordinator.clone())
            .with_cache(cache)
            .with_config(FetcherConfig::default().with_cache_block_size(block))
            .build()
            .unwrap();
        let start = diskless_core::SEGMENT_HEADER_LEN;
        let object_size = start + first + second;
        assert_eq!(
            env.storage.fetch(&key, 0..object_size).await.unwrap().len() as u64,
            object_size
        );
        Seen::take(&snapshotter);

        // Cold, first batch only (the first batch is served whatever the limit): all misses.
        let answer = fetcher.fetch(&from_start(1), 1 << 20).await.unwrap();
        assert_eq!(answer[0].records_len() as u64, first);
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_ok()), 1, "{seen:?}");
        assert_eq!(seen.samples(&fetch_error()), 0);
        assert_eq!(seen.counter(m::FETCH_BYTES), first);
        assert_eq!(seen.counter(m::CACHE_HIT_BYTES), 0);
        assert_eq!(seen.counter(m::CACHE_MISS_BYTES), first);

        // Both batches: the blocks the first read loaded (through the one holding the first
        // batch's end, where the second begins) are hits, the rest misses.
        let answer = fetcher.fetch(&from_start(1 << 20), 1 << 20).await.unwrap();
        assert_eq!(answer[0].records_len() as u64, first + second);
        let cached_end = ((start + first - 1) / block + 1) * block;
        let hits = cached_end.min(object_size) - start;
        assert!(hits > first && hits < first + second, "{hits}");
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_ok()), 1, "{seen:?}");
        assert_eq!(seen.counter(m::FETCH_BYTES), first + second);
        assert_eq!(seen.counter(m::CACHE_HIT_BYTES), hits);
        assert_eq!(seen.counter(m::CACHE_MISS_BYTES), first + second - hits);

        // Warm: all hits.
        fetcher.fetch(&from_start(1 << 20), 1 << 20).await.unwrap();
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_ok()), 1);
        assert_eq!(seen.counter(m::FETCH_BYTES), first + second);
        assert_eq!(seen.counter(m::CACHE_HIT_BYTES), first + second);
        assert_eq!(seen.counter(m::CACHE_MISS_BYTES), 0);

        // Nothing to read: the series are still recorded once, with nothing counted.
        let past_the_end = [FetchPartition {
            fetch_offset: 2,
            ..from_start(1 << 20)[0].clone()
        }];
        let answer = fetcher.fetch(&past_the_end, 1 << 20).await.unwrap();
        assert_eq!(answer[0].records_len(), 0);
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_ok()), 1);
        assert_eq!(seen.counter(m::FETCH_BYTES), 0);
    });
}

#[test]
fn without_a_cache_every_byte_read_is_a_miss_and_a_failed_fetch_is_an_error_sample() {
    with_recorder(|snapshotter| async move {
        let env = Env::new(TopicConfig::default()).await;
        let (_, batches) = env
            .produce(vec![batch(T0, 100), batch(T0, 200), batch(T0, 50)])
            .await;
        let total: u64 = batches.iter().map(|b| b.len() as u64).sum();
        let fetcher = Fetcher::builder(env.storage.clone(), env.coordinator.clone())
            .build()
            .unwrap();
        Seen::take(&snapshotter);
        let answer = fetcher.fetch(&from_start(1 << 20), 1 << 20).await.unwrap();
        assert_eq!(answer[0].records_len() as u64, total);
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_ok()), 1);
        assert_eq!(seen.counter(m::FETCH_BYTES), total);
        assert_eq!(seen.counter(m::CACHE_HIT_BYTES), 0);
        assert_eq!(seen.counter(m::CACHE_MISS_BYTES), total);

        let broken = Fetcher::builder(env.storage.clone(), env.down())
            .build()
            .unwrap();
        assert!(broken.fetch(&from_start(1 << 20), 1 << 20).await.is_err());
        let seen = Seen::take(&snapshotter);
        assert_eq!(seen.samples(&fetch_error()), 1, "{seen:?}");
        assert_eq!(seen.samples(&fetch_ok()), 0);
        assert_eq!(seen.counter(m::FETCH_BYTES), 0);
        assert_eq!(seen.counter(m::CACHE_HIT_BYTES), 0);
        assert_eq!(seen.counter(m::CACHE_MISS_BYTES), 0);
    });
}

fn passes(worker: &str, outcome: &str) -> String {
    series(
        m::LIFECYCLE_PASSES,
        &[(m::WORKER, worker), (m::OUTCOME, outcome)],
    )
}

fn items(worker: &str) -> String {
    series(m::LIFECYCLE_ITEMS, &[(m::WORKER, worker)])
}

/// After one pass of `worker`: one pass of `outcome`, none of the other, `removed` items.
fn assert_one_pass(seen: &Seen, worker: &str, outcome: &str, removed: u64) {
    let other = if outcome == m::OK { m::ERROR } else { m::OK };
    assert_eq!(seen.counter(&passes(worker, outcome)), 1, "{seen:?}");
    assert_eq!(
        seen.counters
            .get(&passes(worker, other))
            .copied()
            .unwrap_or(0),
        0
    );
    assert_eq!(seen.counter(&items(worker)), removed, "{seen:?}");
}

#[test]
fn each_lifecycle_pass_records_its_outcome_and_what_it_removed_once() {
    with_recorder(|snapshotter| async move {
        let env = Env::new(TopicConfig {
            retention_ms: 1_000,
            producer_id_expiration_ms: 1_000,
            ..TopicConfig::default()
        })
        .await;
        let idempotent = RecordBatchBuilder::new()
            .producer(42, 0, 0)
            .record(T0, None, Some(b"v"))
            .build()
            .unwrap();
        env.produce(vec![batch(T0, 10), idempotent]).await;
        env.produce(vec![batch(T0, 10)]).await;
        // Past producer expiry's floor (twice the default max_commit_age), which rules over the
        // topic's 1 s.
        env.clock
            .advance(diskless_coordinator::producer_state_floor_ms(
                diskless_coordinator::DEFAULT_MAX_COMMIT_AGE,
            ));
        Seen::take(&snapshotter);

        let expirer =
            ProducerExpirer::new(env.coordinator.clone(), ProducerExpiryConfig::default()).unwrap();
        assert_eq!(expirer.run_pass().await.unwrap().expired, 1);
        assert_one_pass(&Seen::take(&snapshotter), "producers", m::OK, 1);

        let retention =
            RetentionEnforcer::new(env.coordinator.clone(), RetentionConfig::default()).unwrap();
        assert_eq!(retention.run_pass().await.unwrap().batches_deleted, 3);
        assert_one_pass(&Seen::take(&snapshotter), "retention", m::OK, 3);

        env.clock.advance(60_001);
        let cleaner = ObjectCleaner::new(
            env.coordinator.clone(),
            env.storage.clone(),
            None,
            env.clock.clone(),
            CleanerConfig::default(),
        )
        .unwrap();
        assert_eq!(cleaner.run_pass().await.unwrap().deleted, 2);
        assert_one_pass(&Seen::take(&snapshotter), "cleaner", m::OK, 2);

        // An orphan: uploaded, never committed. Suspected by one pass, deleted by the next.
        let orphan = ObjectKey::parse(&v7_key(env.clock.now_ms())).unwrap();
        env.storage
            .upload(&orphan, &[bytes::Bytes::from_static(b"orphan")])
            .await
            .unwrap();
        let collector = OrphanCollector::new(
            env.coordinator.clone(),
            env.storage.clone(),
            env.clock.clone(),
            OrphanConfig::default()
                .with_max_commit_age(Duration::from_secs(1))
                .with_recheck_delay(Duration::from_secs(1)),
        )
        .unwrap();
        env.clock.advance(1_001);
        assert_eq!(collector.run_pass().await.unwrap().new_suspects, 1);
        assert_one_pass(&Seen::take(&snapshotter), "orphans", m::OK, 0);
        env.clock.advance(1_001);
        assert_eq!(collector.run_pass().await.unwrap().deleted, 1);
        assert_one_pass(&Seen::take(&snapshotter), "orphans", m::OK, 1);
    });
}

#[test]
fn a_failed_lifecycle_pass_records_one_error_outcome() {
    with_recorder(|snapshotter| async move {
        let env = Env::new(TopicConfig::default()).await;
        let down = env.down();
        let failed = |r: Result<(), LifecycleError>| assert!(r.is_err());
        Seen::take(&snapshotter);

        let retention = RetentionEnforcer::new(down.clone(), RetentionConfig::default()).unwrap();
        failed(retention.run_pass().await.map(|_| ()));
        assert_one_pass(&Seen::take(&snapshotter), "retention", m::ERROR, 0);

        let expirer = ProducerExpirer::new(down.clone(), ProducerExpiryConfig::default()).unwrap();
        failed(expirer.run_pass().await.map(|_| ()));
        assert_one_pass(&Seen::take(&snapshotter), "producers", m::ERROR, 0);

        let cleaner = ObjectCleaner::new(
            down.clone(),
            env.storage.clone(),
            None,
            env.clock.clone(),
            CleanerConfig::default(),
        )
        .unwrap();
        failed(cleaner.run_pass().await.map(|_| ()));
        assert_one_pass(&Seen::take(&snapshotter), "cleaner", m::ERROR, 0);

        // The collector only asks the coordinator about candidates: list one.
        let orphan = ObjectKey::parse(&v7_key(env.clock.now_ms())).unwrap();
        env.storage
            .upload(&orphan, &[bytes::Bytes::from_static(b"orphan")])
            .await
            .unwrap();
        env.clock.advance(20 * 60_000);
        let collector = OrphanCollector::new(
            down,
            env.storage.clone(),
            env.clock.clone(),
            OrphanConfig::default(),
        )
        .unwrap();
        failed(collector.run_pass().await.map(|_| ()));
        assert_one_pass(&Seen::take(&snapshotter), "orphans", m::ERROR, 0);
    });
}
