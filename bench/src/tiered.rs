//! Steps shared by the tiered-segment figures (13, 14): producing one WAL object per round, and
//! consolidating everything.

use std::sync::Arc;

use diskless_coordinator::{Clock, ErrorCode, ManualClock, TopicConfig, TopicIdPartition};
use diskless_core::lifecycle::TieringWorker;
use diskless_core::{ProducePartition, WalWriter};

use crate::util::make_batch;

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
