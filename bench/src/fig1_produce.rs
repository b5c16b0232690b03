//! Figure 1: produce-path CPU throughput on one core, vs raw CRC-32C and memcpy over the same bytes.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, SystemClock, TopicConfig, TopicIdPartition};
use diskless_core::{ProducePartition, WalWriter};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;

use crate::report::{Row, Status, pct, rate};
use crate::util::{NullStorage, create_topic, make_batches, runtime};

/// Partitions per Produce request.
const PARTITIONS_PER_REQUEST: usize = 8;
/// Partitions of the topic.
const PARTITIONS: usize = 64;

/// Distinct batches cycled through (so that the data is not one hot cache line set).
const DISTINCT: usize = 64;

/// Runs figure 1.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let total: usize = if quick { 2 << 20 } else { 256 << 20 };
    let reps = if quick { 1 } else { 5 };
    let mut rows = Vec::new();
    for (label, size, target) in [
        ("1 KiB", 1usize << 10, Some(0.20)),
        ("16 KiB", 16 << 10, Some(0.40)),
        ("256 KiB", 256 << 10, None),
    ] {
        // DISKLESS_BENCH_FIG1_SIZE=<bytes> restricts the figure to one batch size (for profiling).
        if let Some(only) = std::env::var("DISKLESS_BENCH_FIG1_SIZE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            && only != size
        {
            continue;
        }
        let batches = make_batches(DISTINCT as u64, size);
        let batch_len = batches[0].len();
        let count = (total / batch_len).max(PARTITIONS_PER_REQUEST);
        // Interleaved repetitions, best of each: the machine may be shared.
        let (mut crc, mut memcpy, mut produce, mut produce_null) = (0f64, 0f64, 0f64, 0f64);
        for _ in 0..reps {
            let (c, m) = baselines(&batches, count);
            crc = crc.max(c);
            memcpy = memcpy.max(m);
            produce = produce.max(produce_rate(&batches, count, false));
            produce_null = produce_null.max(produce_rate(&batches, count, true));
        }
        let floor = crc.min(memcpy);
        let ratio = produce / floor;
        let mut row = Row::new(
            1,
            format!("produce, {label} batches ({batch_len} B), 1 core, in-memory store"),
            rate(produce),
        )
        .baseline(format!("crc32c {}, memcpy {}", rate(crc), rate(memcpy)))
        .ratio(format!("{} of min", pct(ratio)))
        .numbers(&[produce, crc, memcpy, ratio]);
        row = match target {
            Some(t) => row.target(
                format!(">= {:.0}% of min", t * 100.0),
                Status::from_bool(ratio >= t),
            ),
            None => row.target("(none)", Status::Info),
        };
        rows.push(row);
        rows.push(
            Row::new(
                1,
                format!("  same, store that discards uploads ({label})"),
                rate(produce_null),
            )
            .baseline(format!("min {}", rate(floor)))
            .ratio(format!("{} of min", pct(produce_null / floor)))
            .numbers(&[produce_null]),
        );
    }
    rows
}

/// (crc32c, memcpy) bytes/s over `count` batches taken in the produce order.
fn baselines(batches: &[Bytes], count: usize) -> (f64, f64) {
    let bytes: usize = (0..count).map(|i| batches[i % batches.len()].len()).sum();
    // CRC-32C of every batch (what validation must at least do).
    let start = Instant::now();
    let mut acc = 0u32;
    for i in 0..count {
        acc ^= crc32c::crc32c(&batches[i % batches.len()]);
    }
    let crc = bytes as f64 / start.elapsed().as_secs_f64();
    std::hint::black_box(acc);
    // memcpy of every batch into a segment-sized buffer (what assembling a contiguous object costs).
    let segment = 8 << 20;
    let mut dst = vec![0u8; segment + (1 << 20)];
    let start = Instant::now();
    let mut pos = 0;
    for i in 0..count {
        let b = &batches[i % batches.len()];
        if pos + b.len() > dst.len() {
            pos = 0;
        }
        dst[pos..pos + b.len()].copy_from_slice(b);
        pos += b.len();
        std::hint::black_box(&dst);
    }
    let memcpy = bytes as f64 / start.elapsed().as_secs_f64();
    (crc, memcpy)
}

/// Bytes/s through `WalWriter::append` until every answer arrived, on a current-thread runtime.
fn produce_rate(batches: &[Bytes], count: usize, null_store: bool) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        let clock = Arc::new(SystemClock);
        let coordinator = Arc::new(InMemoryCoordinator::new(clock.clone()));
        let topic = create_topic(coordinator.as_ref(), "bench", PARTITIONS as i32).await;
        let storage: Arc<dyn ObjectStorage> = if null_store {
            Arc::new(NullStorage::default())
        } else {
            Arc::new(ObjectStoreStorage::in_memory())
        };
        let writer = match WalWriter::builder(storage, coordinator)
            .with_clock(clock)
            .build()
        {
            Ok(w) => w,
            Err(e) => panic!("writer: {e}"),
        };
        let config = Arc::new(TopicConfig::default());
        // The requests are built before the clock starts: only the writer is timed.
        let mut bytes = 0usize;
        let mut n = 0usize;
        let requests: Vec<Vec<ProducePartition>> = (0..count.div_ceil(PARTITIONS_PER_REQUEST))
            .map(|r| {
                (0..PARTITIONS_PER_REQUEST)
                    .map(|j| {
                        let records = batches[n % batches.len()].clone();
                        n += 1;
                        bytes += records.len();
                        ProducePartition {
                            partition: TopicIdPartition::new(
                                topic,
                                ((r * PARTITIONS_PER_REQUEST + j) % PARTITIONS) as i32,
                            ),
                            config: config.clone(),
                            records,
                            txn_seq: None,
                        }
                    })
                    .collect()
            })
            .collect();
        let mut pending = Vec::with_capacity(requests.len());
        let start = Instant::now();
        for request in requests {
            pending.push(writer.append(request).await);
        }
        // Seal the last segment; the loop below waits for every answer (timed).
        writer.seal_now();
        let mut errors = 0usize;
        for p in pending {
            errors += p
                .await
                .iter()
                .filter(|a| a.error != ErrorCode::None)
                .count();
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert_eq!(errors, 0, "produce answered errors");
        writer.close().await;
        bytes as f64 / elapsed
    })
}
