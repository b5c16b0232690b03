//! Figure 5: produce latency with a simulated object store, on tokio's paused clock.
//!
//! 1,000 appends/s (one 1 KiB batch each) over 100 partitions, store latency log-normal, commit
//! latency fixed. Every request's latency is split into buffer wait (append → its segment's upload
//! starts), upload, ordering wait (upload done → its commit starts: the segment waits for earlier
//! segments, whose commits must come first), commit, and delivery (commit done → answer received).

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::{ErrorCode, TopicConfig, TopicIdPartition};
use diskless_core::{ProducePartition, SealPolicy, WalWriterConfig};
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::storage::Latency;
use tokio::time::Instant;

use crate::report::{Row, Status, ms};
use crate::util::{SimPipeline, make_batches, paused_runtime, percentile};

const PARTITIONS: usize = 100;
const RATE_PER_S: u64 = 1000;

/// One scenario.
struct Scenario {
    label: &'static str,
    store: Latency,
    interval: Duration,
    /// Target on produce p99.
    produce_p99: Duration,
    /// Target on overhead p99 (None: not asked).
    overhead_p99: Option<Duration>,
    /// `WalWriterConfig::hedge_uploads_after`.
    hedge_after: Option<Duration>,
    /// `WalWriterConfig::seal_policy`.
    seal: SealPolicy,
}

/// Runs figure 5.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let seconds = if quick { 3 } else { 120 };
    let scenarios = [
        Scenario {
            label: "S3 standard-like store (p50 100 ms, p99 400 ms), 250 ms interval",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_millis(250),
            produce_p99: Duration::from_millis(500),
            overhead_p99: Some(Duration::from_millis(10)),
            hedge_after: None,
            seal: SealPolicy::Interval,
        },
        Scenario {
            label: "S3 Express-like store (p50 25 ms, p99 100 ms), 50 ms interval",
            store: Latency::log_normal(Duration::from_millis(25), Duration::from_millis(100)),
            interval: Duration::from_millis(50),
            produce_p99: Duration::from_millis(150),
            overhead_p99: None,
            hedge_after: None,
            seal: SealPolicy::Interval,
        },
        Scenario {
            label: "S3 standard-like store, WalWriterConfig::hedge_uploads_after = 200 ms",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_millis(250),
            produce_p99: Duration::from_millis(500),
            overhead_p99: None,
            hedge_after: Some(Duration::from_millis(200)),
            seal: SealPolicy::Interval,
        },
        Scenario {
            label: "S3 standard-like store, SealPolicy::Adaptive (min 50 ms, 1 segment in flight), 250 ms max",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_millis(250),
            produce_p99: Duration::from_millis(500),
            overhead_p99: Some(Duration::from_millis(10)),
            hedge_after: None,
            seal: SealPolicy::adaptive(Duration::from_millis(50), 1),
        },
        Scenario {
            label: "S3 standard-like store, SealPolicy::Adaptive (min 50 ms, 4 in flight), hedged at 200 ms",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_millis(250),
            produce_p99: Duration::from_millis(500),
            overhead_p99: Some(Duration::from_millis(10)),
            hedge_after: Some(Duration::from_millis(200)),
            seal: SealPolicy::adaptive(Duration::from_millis(50), 4),
        },
        // Classic group commit: one segment uploading at a time, so no segment ever waits for an
        // earlier one's slower upload (no ordering wait); the 1 s bound is never what seals, and
        // hedging cuts the slow uploads a request may wait behind.
        Scenario {
            label: "S3 standard-like store, SealPolicy::Adaptive (min 50 ms, 1 in flight), 1 s max, hedged at 150 ms",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_secs(1),
            produce_p99: Duration::from_millis(500),
            overhead_p99: Some(Duration::from_millis(10)),
            hedge_after: Some(Duration::from_millis(150)),
            seal: SealPolicy::adaptive(Duration::from_millis(50), 1),
        },
        Scenario {
            label: "S3 standard-like store, SealPolicy::Adaptive (min 50 ms, 1 in flight), 1 s max, hedged at 200 ms",
            store: Latency::log_normal(Duration::from_millis(100), Duration::from_millis(400)),
            interval: Duration::from_secs(1),
            produce_p99: Duration::from_millis(500),
            overhead_p99: Some(Duration::from_millis(10)),
            hedge_after: Some(Duration::from_millis(200)),
            seal: SealPolicy::adaptive(Duration::from_millis(50), 1),
        },
    ];
    let mut rows = Vec::new();
    for s in scenarios {
        rows.extend(scenario(&s, seconds));
    }
    rows
}

/// Per-request decomposition.
#[derive(Default)]
struct Parts {
    latency: Vec<Duration>,
    buffer: Vec<Duration>,
    upload: Vec<Duration>,
    ordering: Vec<Duration>,
    commit: Vec<Duration>,
    delivery: Vec<Duration>,
    /// latency − (buffer + upload + commit), the definition.
    overhead: Vec<Duration>,
    /// latency − ordering wait: what a request would see if its commit never waited for earlier
    /// segments.
    unordered: Vec<Duration>,
}

fn scenario(s: &Scenario, seconds: u64) -> Vec<Row> {
    let rt = paused_runtime();
    let parts = rt.block_on(async {
        let sim = SimPipeline::start(
            PARTITIONS,
            Arc::new(ObjectStoreStorage::in_memory()),
            s.store.clone(),
            42,
            true,
            WalWriterConfig::default()
                .with_commit_interval(s.interval)
                .with_hedge_uploads_after(s.hedge_after)
                .with_seal_policy(s.seal),
        )
        .await;
        let batches = make_batches(16, 1 << 10);
        let config = Arc::new(TopicConfig::default());
        let total = seconds * RATE_PER_S;
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(total as usize);
        for i in 0..total {
            tokio::time::sleep_until(start + Duration::from_micros(i * 1_000_000 / RATE_PER_S))
                .await;
            let partition = TopicIdPartition::new(sim.topic, (i % PARTITIONS as u64) as i32);
            let request = vec![ProducePartition {
                partition,
                config: config.clone(),
                records: batches[i as usize % batches.len()].clone(),
                txn_seq: None,
            }];
            let writer = sim.writer.clone();
            tasks.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let answers = writer.produce(request).await;
                let t1 = Instant::now();
                (partition, t0, t1, answers)
            }));
        }
        let mut done = Vec::with_capacity(tasks.len());
        for t in tasks {
            match t.await {
                Ok(r) => done.push(r),
                Err(e) => panic!("produce task: {e}"),
            }
        }
        sim.writer.close().await;
        let hedges = sim.writer.stats().hedged_uploads;
        let uploads = sim.storage.uploads.lock().clone();
        let commits = sim.coordinator.commits.lock().clone();
        let objects = sim.coordinator.batch_objects.lock().clone();
        let mut parts = Parts::default();
        // The first and last seconds are warm-up and drain.
        let warm = Duration::from_secs(1).min(Duration::from_secs(seconds) / 4);
        for (partition, t0, t1, answers) in done {
            let a = &answers[0];
            assert_eq!(a.error, ErrorCode::None, "{:?}", a.error_message);
            if t0 < start + warm || t0 > start + Duration::from_secs(seconds) - warm {
                continue;
            }
            let Some(key) = objects.get(&(partition, a.base_offset)) else {
                panic!("no object recorded for an answered batch");
            };
            let (Some(&(u0, u1)), Some(c)) = (uploads.get(key), commits.get(key)) else {
                panic!("no upload/commit recorded for {key}");
            };
            let latency = t1 - t0;
            let buffer = u0.saturating_duration_since(t0);
            let upload = u1 - u0;
            let ordering = c.start.saturating_duration_since(u1);
            let commit = c.end - c.start;
            let delivery = t1.saturating_duration_since(c.end);
            parts.latency.push(latency);
            parts.buffer.push(buffer);
            parts.upload.push(upload);
            parts.ordering.push(ordering);
            parts.commit.push(commit);
            parts.delivery.push(delivery);
            parts.unordered.push(latency.saturating_sub(ordering));
            parts
                .overhead
                .push(latency.saturating_sub(buffer + upload + commit));
        }
        (parts, hedges, uploads.len())
    });
    let (mut p, hedges, segments) = parts;
    let n = p.latency.len();
    let p50 = percentile(&mut p.latency, 0.5);
    let p99 = percentile(&mut p.latency, 0.99);
    let over50 = percentile(&mut p.overhead, 0.5);
    let over99 = percentile(&mut p.overhead, 0.99);
    let deliv99 = percentile(&mut p.delivery, 0.99);
    let unordered99 = percentile(&mut p.unordered, 0.99);
    let ord50 = percentile(&mut p.ordering, 0.5);
    let ord99 = percentile(&mut p.ordering, 0.99);
    let b50 = percentile(&mut p.buffer, 0.5);
    let b99 = percentile(&mut p.buffer, 0.99);
    let u50 = percentile(&mut p.upload, 0.5);
    let u99 = percentile(&mut p.upload, 0.99);
    let c99 = percentile(&mut p.commit, 0.99);
    let label = if s.hedge_after.is_some() {
        format!("{} ({hedges} extra PUTs for {segments} segments)", s.label)
    } else {
        s.label.to_string()
    };
    let produce_target = if s.hedge_after.is_some() && s.seal == SealPolicy::Interval {
        ("(none)".to_string(), Status::Info)
    } else {
        (
            format!("p99 <= {}", ms(s.produce_p99)),
            Status::from_bool(p99 <= s.produce_p99),
        )
    };
    let mut rows = vec![
        Row::new(
            5,
            format!("produce latency p50 / p99: {label} (simulated time)"),
            format!("{} / {}", ms(p50), ms(p99)),
        )
        .baseline(format!(
            "parts p50/p99: buffer {} / {}, upload {} / {}, commit p99 {} ({n} requests)",
            ms(b50),
            ms(b99),
            ms(u50),
            ms(u99),
            ms(c99)
        ))
        .ratio(format!(
            "{:.2}x target",
            p99.as_secs_f64() / s.produce_p99.as_secs_f64()
        ))
        .target(produce_target.0, produce_target.1)
        .numbers(&[p50.as_secs_f64(), p99.as_secs_f64()]),
    ];
    let overhead = Row::new(
        5,
        "  overhead = latency - (buffer + upload + commit), p50 / p99",
        format!("{} / {}", ms(over50), ms(over99)),
    )
    .baseline(format!(
        "of which ordering wait p50/p99 {} / {}, delivery p99 {}; produce p99 without ordering wait {}",
        ms(ord50),
        ms(ord99),
        ms(deliv99),
        ms(unordered99)
    ))
    .numbers(&[over50.as_secs_f64(), over99.as_secs_f64()]);
    rows.push(match s.overhead_p99 {
        Some(t) => overhead.target(format!("p99 <= {}", ms(t)), Status::from_bool(over99 <= t)),
        None => overhead.target("(none)", Status::Info),
    });
    rows
}
