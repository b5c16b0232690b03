//! Steps shared by the tiered-segment figures (13, 14): the topic, the worker, producing one WAL
//! object per round, and consolidating everything.

use std::sync::Arc;

use diskless_cache::LocalCache;
use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, ErrorCode, ManualClock, TopicConfig,
    TopicIdPartition,
};
use diskless_core::lifecycle::{TieringConfig, TieringWorker};
use diskless_core::{Fetcher, ProducePartition, WalWriter};
use diskless_storage::{ObjectRemoteStorage, ObjectStorage, SeededKeys};

use crate::util::{make_batch, random_uuid};

/// `rounds` produce requests of one `batch`-byte batch for each of `partitions` partitions of
/// `topic`, each flushed into its own WAL object and acknowledged; the clock moves 250 ms after
/// each. Panics (naming figure `fig`) on a failed produce.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn produce_rounds(
    writer: &WalWriter,
    clock: &ManualClock,
    topic: uuid::Uuid,
    partitions: i32,
    config: &Arc<TopicConfig>,
    rounds: usize,
    batch: usize,
    fig: u8,
) {
    let mut seed = 0u64;
    for _ in 0..rounds {
        let request = (0..partitions)
            .map(|p| {
                seed += 1;
                ProducePartition {
                    partition: TopicIdPartition::new(topic, p),
                    config: config.clone(),
                    records: make_batch(batch, clock.now_ms(), seed),
                    txn_seq: None,
                }
            })
            .collect();
        let pending = writer.append(request).await;
        writer.flush().await;
        for a in pending.await {
            assert_eq!(a.error, ErrorCode::None, "figure {fig}: produce {a:?}");
        }
        clock.advance(250);
    }
}

/// What [`tier_everything`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tiered {
    /// Segments registered.
    pub segments: u64,
    /// Their `.log` bytes.
    pub bytes: u64,
    /// Passes run (the last one found nothing).
    pub passes: u64,
}

/// Passes of `worker` until one registers nothing and leaves nothing due. Panics (naming figure
/// `fig`) on a failed pass, or on a segment failed or stale.
pub(crate) async fn tier_everything(worker: &TieringWorker, fig: u8) -> Tiered {
    let mut tiered = Tiered::default();
    loop {
        let report = match worker.run_pass().await {
            Ok(r) => r,
            Err(e) => panic!("figure {fig}: tiering pass: {e}"),
        };
        tiered.passes += 1;
        assert_eq!(report.failed + report.stale, 0, "figure {fig}: {report:?}");
        tiered.segments += report.segments;
        tiered.bytes += report.bytes;
        if report.segments == 0 && !report.more {
            return tiered;
        }
    }
}

/// Creates topic `name` of `partitions` partitions for a tiering figure: no retention,
/// `segment.ms` 10 minutes, `segment.bytes` as given; its id and config. Panics (naming figure
/// `fig`) if the coordinator refuses.
pub(crate) async fn create_tiered_topic(
    coordinator: &dyn BatchCoordinator,
    name: &str,
    partitions: i32,
    segment_bytes: i32,
    fig: u8,
) -> (uuid::Uuid, TopicConfig) {
    let config = TopicConfig {
        retention_ms: -1,
        retention_bytes: -1,
        segment_ms: 10 * 60_000,
        segment_bytes,
        ..TopicConfig::default()
    };
    let topic = random_uuid();
    if let Err(e) = coordinator
        .create_topic(CreateTopicRequest {
            topic_id: topic,
            name: name.into(),
            partitions,
            config: config.clone(),
        })
        .await
    {
        panic!("figure {fig}: creating the topic: {e}");
    }
    (topic, config)
}

/// A `TieringWorker` over `coordinator`, storing segments in `storage` and reading the WAL through
/// a `Fetcher` on the same storage (with `cache` when given); keys from seed `fig`. Panics (naming
/// figure `fig`) on a refused setting.
pub(crate) fn worker(
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Arc<ManualClock>,
    config: TieringConfig,
    fig: u8,
) -> TieringWorker {
    let mut fetcher = Fetcher::builder(storage.clone(), coordinator.clone());
    if let Some(cache) = cache {
        fetcher = fetcher.with_cache(cache);
    }
    let fetcher = match fetcher.build() {
        Ok(f) => f,
        Err(e) => panic!("figure {fig}: fetcher: {e}"),
    };
    match TieringWorker::new(
        coordinator,
        Arc::new(ObjectRemoteStorage::new(storage)),
        fetcher,
        clock,
        Arc::new(SeededKeys::new(u64::from(fig))),
        1,
        config,
    ) {
        Ok(w) => w,
        Err(e) => panic!("figure {fig}: tiering worker: {e}"),
    }
}
