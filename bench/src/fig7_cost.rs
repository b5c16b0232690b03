//! Figure 7: request cost, counted from the storage counters (not timed), and the $/GiB it implies
//! at S3 Standard prices.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_cache::{LocalCache, MokaCache};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, ErrorCode, FindBatchesRequest, SystemClock, TopicConfig, TopicIdPartition,
};
use diskless_core::{FetchPartition, Fetcher, ProducePartition, WalWriter, WalWriterConfig};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::{FaultConfig, FaultyStorage, InjectedLatency, Latency};

use crate::report::{Row, Status};
use crate::util::{bench_dir, create_topic, make_batch, make_batches, paused_runtime, runtime};

/// S3 Standard request prices (us-east-1), $ per 1,000 requests, as given in the benchmark brief
/// for the run of 2026-11-30.
pub(crate) const PUT_PER_1000: f64 = 0.005;
/// See [`PUT_PER_1000`].
pub(crate) const GET_PER_1000: f64 = 0.0004;
const GIB: f64 = (1u64 << 30) as f64;
const PARTITIONS: usize = 32;

/// Runs figure 7.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(heavy_write_and_cold_fetch(quick));
    rows.extend(light_write_and_idle(quick));
    rows.extend(metadata(quick));
    rows
}

fn dollars(requests_per_gib: f64, per_1000: f64) -> String {
    format!("${:.5}/GiB", requests_per_gib * per_1000 / 1000.0)
}

fn writer(
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    config: WalWriterConfig,
) -> WalWriter {
    match WalWriter::builder(storage, coordinator)
        .with_config(config)
        .with_clock(Arc::new(SystemClock))
        .build()
    {
        Ok(w) => w,
        Err(e) => panic!("writer: {e}"),
    }
}

async fn produce_all(
    writer: &WalWriter,
    topic: uuid::Uuid,
    batches: &[Bytes],
    total: usize,
    per_request: usize,
) -> u64 {
    let config = Arc::new(TopicConfig::default());
    let mut pending = Vec::new();
    let mut bytes = 0u64;
    let mut i = 0usize;
    while (bytes as usize) < total {
        let request = (0..per_request)
            .map(|j| {
                let records = batches[(i + j) % batches.len()].clone();
                bytes += records.len() as u64;
                ProducePartition {
                    partition: TopicIdPartition::new(topic, ((i + j) % PARTITIONS) as i32),
                    config: config.clone(),
                    records,
                    txn_seq: None,
                }
            })
            .collect();
        i += per_request;
        pending.push(writer.append(request).await);
    }
    // Counted, not timed: wait until every request is committed.
    writer.flush().await;
    for p in pending {
        assert!(p.await.iter().all(|a| a.error == ErrorCode::None));
    }
    bytes
}

/// Segments filled by size (default 8 MiB buffers); then cold fetches with and without a cache.
fn heavy_write_and_cold_fetch(quick: bool) -> Vec<Row> {
    let total: usize = if quick { 4 << 20 } else { 256 << 20 };
    let segment: usize = if quick { 1 << 20 } else { 8 << 20 };
    runtime().block_on(async {
        let clock = Arc::new(SystemClock);
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock));
        let topic = create_topic(coordinator.as_ref(), "bench", PARTITIONS as i32).await;
        let store = Arc::new(ObjectStoreStorage::in_memory());
        let counters = store.counters().clone();
        let storage: Arc<dyn ObjectStorage> = store;
        let w = writer(
            storage.clone(),
            coordinator.clone(),
            WalWriterConfig::default().with_buffer_max_bytes(segment),
        );
        let batches = make_batches(32, 16 << 10);
        let before = counters.snapshot();
        let bytes = produce_all(&w, topic, &batches, total, 16).await;
        let stats = w.stats();
        w.close().await;
        let put = counters.snapshot() - before;
        let puts_per_segment = put.put_requests as f64 / stats.segments_uploaded.max(1) as f64;
        let puts_per_gib = put.put_requests as f64 / (put.put_bytes as f64 / GIB);
        let mut rows = vec![
            Row::new(
                7,
                format!(
                    "PUTs per segment ({} MiB segments, filled by size)",
                    segment >> 20
                ),
                format!("{puts_per_segment:.3}"),
            )
            .baseline(format!(
                "ideal 1 ({} PUTs, {} segments, {:.1} MiB)",
                put.put_requests,
                stats.segments_uploaded,
                bytes as f64 / (1u64 << 20) as f64
            ))
            .ratio(format!("{puts_per_segment:.2}x"))
            .target(
                "1",
                Status::from_bool((puts_per_segment - 1.0).abs() < 1e-9),
            )
            .numbers(&[puts_per_segment]),
            Row::new(
                7,
                "  write cost at that segment size",
                format!(
                    "{puts_per_gib:.1} PUTs/GiB = {}",
                    dollars(puts_per_gib, PUT_PER_1000)
                ),
            )
            .baseline(format!("S3 Standard PUT ${PUT_PER_1000}/1000"))
            .numbers(&[puts_per_gib]),
        ];

        // Cold fetches: every partition from offset 0, 1 MiB each, fresh cache / no cache.
        let requests: Vec<FetchPartition> = (0..PARTITIONS)
            .map(|p| FetchPartition {
                partition: TopicIdPartition::new(topic, p as i32),
                fetch_offset: 0,
                partition_max_bytes: 1 << 20,
                leader_epoch: 0,
                isolation: Default::default(),
            })
            .collect();
        let find: Vec<FindBatchesRequest> = requests
            .iter()
            .map(|r| FindBatchesRequest {
                partition: r.partition,
                offset: r.fetch_offset,
                max_bytes: r.partition_max_bytes,
                isolation: Default::default(),
            })
            .collect();
        let objects: HashSet<String> = match coordinator.find_batches(&find, 64 << 20).await {
            Ok(found) => found
                .iter()
                .flat_map(|f| f.batches.iter().map(|b| b.object_key.clone()))
                .collect(),
            Err(e) => panic!("find_batches: {e}"),
        };
        for (label, cache) in [
            (
                "fresh cache",
                Some(Arc::new(MokaCache::default()) as Arc<dyn LocalCache>),
            ),
            ("no cache", None),
        ] {
            let mut builder = Fetcher::builder(storage.clone(), coordinator.clone());
            if let Some(cache) = cache {
                builder = builder.with_cache(cache);
            }
            let fetcher = match builder.build() {
                Ok(f) => f,
                Err(e) => panic!("fetcher: {e}"),
            };
            let before = counters.snapshot();
            let answers = match fetcher.fetch(&requests, 64 << 20).await {
                Ok(a) => a,
                Err(e) => panic!("fetch: {e}"),
            };
            let served: usize = answers.iter().map(|a| a.records_len()).sum();
            let get = counters.snapshot() - before;
            let per_object = get.get_requests as f64 / objects.len().max(1) as f64;
            let gets_per_gib = get.get_requests as f64 / (served as f64 / GIB);
            rows.push(
                Row::new(
                    7,
                    format!(
                        "GETs per object of a cold fetch ({label}, {PARTITIONS} partitions x 1 MiB)"
                    ),
                    format!("{per_object:.3}"),
                )
                .baseline(format!(
                    "ideal 1 ({} GETs, {} objects, {:.1} MiB served, {:.1} MiB read = {:.2}x)",
                    get.get_requests,
                    objects.len(),
                    served as f64 / (1u64 << 20) as f64,
                    get.get_bytes as f64 / (1u64 << 20) as f64,
                    get.get_bytes as f64 / served.max(1) as f64
                ))
                .ratio(format!("{per_object:.2}x"))
                .target("1 per object", Status::from_bool(per_object <= 1.0 + 1e-9))
                .numbers(&[per_object, gets_per_gib]),
            );
            rows.push(
                Row::new(
                    7,
                    format!("  cold read cost ({label})"),
                    format!(
                        "{gets_per_gib:.1} GETs/GiB served = {}",
                        dollars(gets_per_gib, GET_PER_1000)
                    ),
                )
                .baseline(format!("S3 Standard GET ${GET_PER_1000}/1000"))
                .numbers(&[gets_per_gib]),
            );
        }
        rows
    })
}

/// 1,000 appends/s of 1 KiB (segments closed by the default seal policy), then idle: counted on
/// the paused clock. The store answers with S3 Standard's latency (log-normal, median 60 ms, p99
/// 250 ms: `InjectedLatency::S3_STANDARD`), as the prices are S3 Standard's: the default
/// policy spaces its seals by the upload time, so the PUT rate depends on it.
fn light_write_and_idle(quick: bool) -> Vec<Row> {
    let seconds: u64 = if quick { 2 } else { 30 };
    let idle: u64 = if quick { 10 } else { 600 };
    paused_runtime().block_on(async {
        let clock = Arc::new(SystemClock);
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock));
        let topic = create_topic(coordinator.as_ref(), "bench", PARTITIONS as i32).await;
        let plain = ObjectStoreStorage::in_memory();
        let counters = plain.counters().clone();
        let store = Arc::new(FaultyStorage::new(
            plain,
            FaultConfig::default()
                .with_seed(7)
                .with_latency(Some(Latency::log_normal(
                    InjectedLatency::S3_STANDARD.p50,
                    InjectedLatency::S3_STANDARD.p99,
                ))),
        ));
        let w = Arc::new(writer(store, coordinator, WalWriterConfig::default()));
        // Idle from the start.
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let idle_fresh = counters.snapshot();
        let batches = make_batches(16, 1 << 10);
        let config = Arc::new(TopicConfig::default());
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        let mut bytes = 0u64;
        for i in 0..seconds * 1000 {
            tokio::time::sleep_until(start + Duration::from_millis(i)).await;
            let records = batches[i as usize % batches.len()].clone();
            bytes += records.len() as u64;
            let request = vec![ProducePartition {
                partition: TopicIdPartition::new(topic, (i % PARTITIONS as u64) as i32),
                config: config.clone(),
                records,
                txn_seq: None,
            }];
            let w = w.clone();
            tasks.push(tokio::spawn(async move { w.produce(request).await }));
        }
        for t in tasks {
            if let Ok(a) = t.await {
                assert!(a.iter().all(|a| a.error == ErrorCode::None));
            }
        }
        let busy = counters.snapshot() - idle_fresh;
        let after_busy = counters.snapshot();
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let idle_after = counters.snapshot() - after_busy;
        w.close().await;
        let idle_puts = idle_fresh.put_requests + idle_after.put_requests;
        let puts_per_gib = busy.put_requests as f64 / (bytes as f64 / GIB);
        vec![
            Row::new(
                7,
                format!("idle PUTs ({idle} s idle before and after traffic, simulated time)"),
                format!("{idle_puts}"),
            )
            .baseline("ideal 0")
            .target("0", Status::from_bool(idle_puts == 0))
            .numbers(&[idle_puts as f64]),
            Row::new(
                7,
                format!(
                    "  write cost at 1,000 x 1 KiB appends/s (default seal policy, {:?})",
                    WalWriterConfig::default().seal_policy
                ),
                format!(
                    "{puts_per_gib:.0} PUTs/GiB = {}",
                    dollars(puts_per_gib, PUT_PER_1000)
                ),
            )
            .baseline(format!(
                "{} PUTs in {seconds} s = {:.2}/s",
                busy.put_requests,
                busy.put_requests as f64 / seconds as f64
            ))
            .numbers(&[puts_per_gib]),
        ]
    })
}

/// Coordinator metadata bytes per data byte: growth of the SQLite database file per byte produced.
fn metadata(quick: bool) -> Vec<Row> {
    let total: usize = if quick { 2 << 20 } else { 64 << 20 };
    let mut rows = Vec::new();
    for (label, size) in [("16 KiB", 16usize << 10), ("1 KiB", 1 << 10)] {
        let dir = bench_dir();
        let path = dir.path().join("meta.db");
        let file_size = |path: &std::path::Path| {
            let mut n = 0u64;
            for suffix in ["", "-wal"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                n += std::fs::metadata(std::path::Path::new(&p))
                    .map(|m| m.len())
                    .unwrap_or(0);
            }
            n
        };
        let (empty, bytes, full) = runtime().block_on(async {
            let options = SqliteOptions::default().with_synchronous(Synchronous::Off);
            let coordinator =
                match SqliteCoordinator::open(&path, options, Arc::new(SystemClock)).await {
                    Ok(c) => Arc::new(c),
                    Err(e) => panic!("SQLite: {e}"),
                };
            let topic = create_topic(coordinator.as_ref(), "bench", PARTITIONS as i32).await;
            coordinator.close().await;
            let empty = file_size(&path);
            let options = SqliteOptions::default().with_synchronous(Synchronous::Off);
            let coordinator =
                match SqliteCoordinator::open(&path, options, Arc::new(SystemClock)).await {
                    Ok(c) => Arc::new(c),
                    Err(e) => panic!("SQLite: {e}"),
                };
            let storage: Arc<dyn ObjectStorage> = Arc::new(crate::util::NullStorage::default());
            let w = writer(storage, coordinator.clone(), WalWriterConfig::default());
            let batches = make_batches(32, size);
            let bytes = produce_all(&w, topic, &batches, total, 16).await;
            w.close().await;
            coordinator.close().await;
            (empty, bytes, file_size(&path))
        });
        let per = full.saturating_sub(empty) as f64 / bytes as f64;
        let batch_len = make_batch(size, 0, 0).len();
        rows.push(
            Row::new(
                7,
                format!("metadata bytes per data byte (SQLite file growth, {label} batches)"),
                format!("{per:.4}"),
            )
            .baseline(format!(
                "{:.0} B per {batch_len} B batch; {:.1} MiB data",
                per * batch_len as f64,
                bytes as f64 / (1u64 << 20) as f64
            ))
            .numbers(&[per]),
        );
    }
    rows
}
