//! Figure 14, part 3: how long consolidating a backlog takes against
//! `TieringConfig::max_concurrent_builds` (partitions built at once), on S3-like latency.
//!
//! [`PARTITIONS`] partitions, each [`Plan::per_partition`] bytes of 64 KiB batches, produced by
//! one request of one batch per partition per WAL object (a 1 MiB object holding every
//! partition), topic `segment.bytes` = a partition's bytes: every partition is one segment due.
//! Then a `TieringWorker` (default settings but `max_concurrent_builds`, with a fresh cache)
//! consolidates everything through `FaultyStorage` adding figure 5's S3-like latency (log-normal,
//! p50 100 ms, p99 400 ms) to every request, on tokio's paused clock: the time is simulated, CPU
//! is not in it (it is part 1's). Which request a latency draw lands on varies from run to run
//! (the order of concurrent requests is not fixed), and with 80 requests a run's time moves by
//! ±20%, so each value is the mean of [`Plan::reps`] runs with different latency seeds, with its
//! range. No bandwidth is
//! shared between requests, so this is the latency-bound regime (many small WAL ranges per
//! segment); a build's memory (read window and upload part) is multiplied by the builds. The
//! baseline is one build at a time, in the same run. Coordinator: the in-memory model (SQLite's
//! own thread would let the paused clock jump while a query runs).

use std::sync::Arc;
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::{BatchCoordinator, ManualClock};
use diskless_core::lifecycle::TieringConfig;
use diskless_core::{WalWriter, WalWriterConfig};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultyStorage, Latency};

use crate::report::Row;
use crate::tiered::{Tiered, create_tiered_topic, produce_rounds, tier_everything, worker};
use crate::util::paused_runtime;

const FIG: u8 = 14;
const PARTITIONS: i32 = 16;
const BATCH: usize = 64 << 10;

/// Sizes of one run.
struct Plan {
    /// Bytes per partition (one segment each).
    per_partition: usize,
    /// The `max_concurrent_builds` values measured; the first is the baseline.
    builds: &'static [u32],
    /// Runs per value, each with its own latency seed (the mean is reported).
    reps: u64,
}

fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            per_partition: 256 << 10,
            builds: &[1, 4],
            reps: 1,
        }
    } else {
        Plan {
            per_partition: 4 << 20,
            builds: &[1, 2, 4, 8, 16],
            reps: 8,
        }
    }
}

/// What consolidating the backlog once measured.
#[derive(Clone, Copy, Debug)]
struct Measured {
    /// Simulated time from the first pass to the last (the mean over the runs, and its least and
    /// largest).
    elapsed: Duration,
    fastest: Duration,
    slowest: Duration,
    segments: u64,
    passes: u64,
    /// Requests sent to the store by the worker (GETs, PUTs).
    gets: u64,
    puts: u64,
}

/// Runs part 3 of figure 14.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let plan = plan(quick);
    paused_runtime().block_on(async {
        let mut measured = Vec::new();
        for &builds in plan.builds {
            let mut runs = Vec::new();
            for rep in 0..plan.reps {
                runs.push(once(&plan, builds, 14 + rep).await);
            }
            let Some(&last) = runs.last() else {
                continue;
            };
            let total: Duration = runs.iter().map(|m| m.elapsed).sum();
            let n = u32::try_from(runs.len()).unwrap_or(1);
            measured.push((
                builds,
                Measured {
                    elapsed: total / n,
                    fastest: runs.iter().map(|m| m.elapsed).min().unwrap_or_default(),
                    slowest: runs.iter().map(|m| m.elapsed).max().unwrap_or_default(),
                    gets: runs.iter().map(|m| m.gets).max().unwrap_or_default(),
                    puts: runs.iter().map(|m| m.puts).max().unwrap_or_default(),
                    ..last
                },
            ));
        }
        rows_of(&plan, &measured)
    })
}

async fn once(plan: &Plan, builds: u32, seed: u64) -> Measured {
    let clock = ManualClock::new(crate::util::now_ms());
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let segment_bytes = i32::try_from(plan.per_partition).unwrap_or(i32::MAX);
    let (topic, config) = create_tiered_topic(
        coordinator.as_ref(),
        "fig14-builds",
        PARTITIONS,
        segment_bytes,
        FIG,
    )
    .await;
    let store = Arc::new(ObjectStoreStorage::in_memory());
    let counters = store.counters().clone();
    let plain: Arc<dyn ObjectStorage> = store;

    // Produce (no latency: not measured), one WAL object per request.
    let writer = match WalWriter::builder(plain.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default())
        .with_clock(clock.clone())
        .build()
    {
        Ok(w) => w,
        Err(e) => panic!("figure 14: writer: {e}"),
    };
    let config = Arc::new(config);
    let rounds = plan.per_partition.div_ceil(BATCH);
    produce_rounds(
        &writer, &clock, topic, PARTITIONS, &config, rounds, BATCH, FIG,
    )
    .await;
    writer.close().await;

    // Consolidate everything through S3-like latency.
    clock.advance(3_600_000);
    let slow: Arc<dyn ObjectStorage> = Arc::new(FaultyStorage::new(
        plain,
        FaultConfig::default()
            .with_seed(seed)
            .with_latency(Some(Latency::s3_like())),
    ));
    let cache: Arc<dyn LocalCache> = match MokaCache::new(MokaCacheConfig::default()) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 14: cache: {e}"),
    };
    let worker = worker(
        coordinator.clone(),
        slow,
        Some(cache),
        clock.clone(),
        TieringConfig::default()
            .with_max_concurrent_builds(builds)
            .with_max_segments_per_pass(u32::try_from(PARTITIONS).unwrap_or(1)),
        FIG,
    );
    let before = counters.snapshot();
    let start = tokio::time::Instant::now();
    let Tiered {
        segments, passes, ..
    } = tier_everything(&worker, FIG).await;
    let elapsed = start.elapsed();
    let cost = counters.snapshot() - before;
    assert_eq!(
        segments,
        u64::try_from(PARTITIONS).unwrap_or(0),
        "figure 14: one segment per partition"
    );
    Measured {
        elapsed,
        fastest: elapsed,
        slowest: elapsed,
        segments,
        passes,
        gets: cost.get_requests,
        puts: cost.put_requests,
    }
}

fn rows_of(plan: &Plan, measured: &[(u32, Measured)]) -> Vec<Row> {
    let Some(&(_, base)) = measured.first() else {
        return Vec::new();
    };
    let mib = plan.per_partition as f64 / (1u64 << 20) as f64;
    measured
        .iter()
        .map(|&(builds, m)| {
            let ratio = base.elapsed.as_secs_f64() / m.elapsed.as_secs_f64().max(1e-9);
            Row::new(
                FIG,
                format!(
                    "consolidating {PARTITIONS} partitions x {mib:.2} MiB (one segment each), S3-like latency, {builds} build{} at once (simulated time, mean of {} runs)",
                    if builds == 1 { "" } else { "s" },
                    plan.reps
                ),
                format!(
                    "{:.2} s ({:.2}-{:.2} s; {} segments, {} passes, {} GETs, {} PUTs)",
                    m.elapsed.as_secs_f64(),
                    m.fastest.as_secs_f64(),
                    m.slowest.as_secs_f64(),
                    m.segments,
                    m.passes,
                    m.gets,
                    m.puts
                ),
            )
            .baseline(format!(
                "one build at a time: {:.2} s ({} GETs, {} PUTs)",
                base.elapsed.as_secs_f64(),
                base.gets,
                base.puts
            ))
            .ratio(format!("{ratio:.2}x faster"))
            .numbers(&[m.elapsed.as_secs_f64(), ratio])
        })
        .collect()
}
