//! Figure 6: sustained upload throughput under store latency vs the Little's-law bound
//! `max_concurrent_uploads × segment size / upload latency`, on tokio's paused clock.
//!
//! Producers keep the writer saturated (more requests in flight than the pending-bytes bound
//! admits); the store keeps nothing (the volume would not fit in memory) but answers after the
//! simulated latency. Throughput counts the bytes of segments committed between the end of a
//! warm-up and the end of the run.

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::{TopicConfig, TopicIdPartition};
use diskless_core::{ProducePartition, WalWriterConfig};
use diskless_testkit::storage::Latency;
use tokio::time::Instant;

use crate::report::{Row, Status, pct, rate};
use crate::util::{NullStorage, SimPipeline, make_batches, paused_runtime};

const PARTITIONS: usize = 64;

/// Runs figure 6.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let (segment, seconds) = if quick {
        (1usize << 20, 3u64)
    } else {
        (8usize << 20, 40u64)
    };
    let constant = Latency::log_normal(Duration::from_millis(100), Duration::from_millis(100));
    let s3 = Latency::s3_like();
    vec![
        scenario("constant 100 ms store", constant, segment, 8, seconds, true),
        scenario(
            "S3-like store (p50 100 ms, p99 400 ms)",
            s3.clone(),
            segment,
            8,
            seconds,
            true,
        ),
        // Diagnosis: the same with a pending-bytes bound 4x larger (see BENCHMARKS.md).
        scenario(
            "S3-like store, max_pending_bytes = 32 segments (diagnosis)",
            s3,
            segment,
            32,
            seconds,
            false,
        ),
    ]
}

fn scenario(
    label: &str,
    latency: Latency,
    segment: usize,
    pending_segments: usize,
    seconds: u64,
    with_target: bool,
) -> Row {
    let concurrency = 4;
    let rt = paused_runtime();
    let (throughput, mean_upload, segments, mean_segment) = rt.block_on(async {
        let sim = SimPipeline::start(
            PARTITIONS,
            Arc::new(NullStorage::default()),
            latency,
            6,
            false,
            WalWriterConfig::default()
                .with_buffer_max_bytes(segment)
                .with_max_concurrent_uploads(concurrency)
                .with_max_pending_bytes(segment * pending_segments),
        )
        .await;
        let topic = sim.topic;
        let batches = make_batches(16, 64 << 10);
        let per_request = (segment / 8 / batches[0].len()).max(1);
        let config = Arc::new(TopicConfig::default());
        let start = Instant::now();
        let end = start + Duration::from_secs(seconds);
        // Producers: each keeps one request in flight, back to back, until the end.
        let producers = 2 * 8 * pending_segments;
        let mut tasks = Vec::new();
        for w in 0..producers {
            let writer = sim.writer.clone();
            let batches = batches.clone();
            let config = config.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < end {
                    let request = (0..per_request)
                        .map(|j| ProducePartition {
                            partition: TopicIdPartition::new(topic, ((i + j) % PARTITIONS) as i32),
                            config: config.clone(),
                            records: batches[(i + j) % batches.len()].clone(),
                            txn_seq: None,
                        })
                        .collect();
                    i += producers;
                    let _ = writer.produce(request).await;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        sim.writer.close().await;
        let warm = start + Duration::from_secs(seconds) / 5;
        let uploads = sim.storage.uploads.lock().clone();
        let commits = sim.coordinator.commits.lock().clone();
        let mut bytes_after_warm = 0u64;
        let mut upload_total = Duration::ZERO;
        let mut n = 0u32;
        let mut segment_bytes = 0u64;
        for (key, c) in &commits {
            if let Some(&(u0, u1)) = uploads.get(key) {
                upload_total += u1 - u0;
                n += 1;
            }
            let bytes = c.batches as u64 * batches[0].len() as u64;
            segment_bytes += bytes;
            if c.end > warm && c.end <= end {
                bytes_after_warm += bytes;
            }
        }
        let window = (end - warm).as_secs_f64();
        (
            bytes_after_warm as f64 / window,
            upload_total / n.max(1),
            commits.len(),
            segment_bytes as f64 / commits.len().max(1) as f64,
        )
    });
    let bound = concurrency as f64 * mean_segment / mean_upload.as_secs_f64();
    let ratio = throughput / bound;
    Row::new(
        6,
        format!(
            "sustained upload throughput, {label}, {concurrency} uploads x {} MiB segments (simulated time)",
            segment >> 20
        ),
        rate(throughput),
    )
    .baseline(format!(
        "Little's law {} (mean upload {:.1} ms, mean segment {:.2} MiB, {segments} segments)",
        rate(bound),
        mean_upload.as_secs_f64() * 1e3,
        mean_segment / (1u64 << 20) as f64
    ))
    .ratio(pct(ratio))
    .target(
        if with_target { ">= 90%" } else { "(none)" },
        if with_target { Status::from_bool(ratio >= 0.9) } else { Status::Info },
    )
    .numbers(&[throughput, bound, ratio])
}
