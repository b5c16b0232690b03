//! Figure 4: fetch throughput from the cache (offset injection included) vs memcpy of the same bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::{
    BatchCoordinator, ErrorCode, SystemClock, TopicConfig, TopicIdPartition,
};
use diskless_core::{FetchPartition, Fetcher, ProducePartition, WalWriter};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;

use crate::report::{Row, Status, pct, rate};
use crate::util::{TimedCoordinator, create_topic, make_batches, runtime};

const PARTITIONS: usize = 16;
const BATCH: usize = 16 << 10;
const PARTITION_MAX_BYTES: u32 = 1 << 20;
const FETCH_MAX_BYTES: u32 = 50 << 20;

/// Runs figure 4.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let per_partition: usize = if quick { 256 << 10 } else { 4 << 20 };
    let serve_total: u64 = if quick { 8 << 20 } else { 4 << 30 };
    let rt = runtime();
    rt.block_on(async {
        let clock = Arc::new(SystemClock);
        let model: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
        let coordinator = Arc::new(TimedCoordinator::new(model, Duration::ZERO, false));
        let topic = create_topic(coordinator.as_ref(), "bench", PARTITIONS as i32).await;
        let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
        let cache = match MokaCache::new(MokaCacheConfig::default().with_max_bytes(4 << 30)) {
            Ok(c) => Arc::new(c),
            Err(e) => panic!("cache: {e}"),
        };
        let writer = match WalWriter::builder(storage.clone(), coordinator.clone())
            .with_cache(cache.clone())
            .with_clock(clock)
            .build()
        {
            Ok(w) => w,
            Err(e) => panic!("writer: {e}"),
        };
        // Fill: every partition gets per_partition bytes of 16 KiB batches, interleaved.
        let batches = make_batches(64, BATCH);
        let records_per_batch = 32i64;
        let per_batches = per_partition / batches[0].len();
        let config = Arc::new(TopicConfig::default());
        let mut pending = Vec::new();
        for i in 0..per_batches {
            let partitions = (0..PARTITIONS)
                .map(|p| ProducePartition {
                    partition: TopicIdPartition::new(topic, p as i32),
                    config: config.clone(),
                    records: batches[(i * PARTITIONS + p) % batches.len()].clone(), txn_seq: None,
                })
                .collect();
            pending.push(writer.append(partitions).await);
        }
        // Setup, not timed: wait until every fill request is committed.
        writer.flush().await;
        for p in pending {
            assert!(p.await.iter().all(|a| a.error == ErrorCode::None));
        }
        writer.close().await;
        let high_watermark = per_batches as i64 * records_per_batch;

        let fetcher = match Fetcher::builder(storage, coordinator.clone())
            .with_cache(cache.clone())
            .build()
        {
            Ok(f) => f,
            Err(e) => panic!("fetcher: {e}"),
        };
        let mut offsets = vec![0i64; PARTITIONS];
        let fetch_once = async |offsets: &mut Vec<i64>| -> u64 {
            let requests: Vec<FetchPartition> = (0..PARTITIONS)
                .map(|p| FetchPartition {
                    partition: TopicIdPartition::new(topic, p as i32),
                    fetch_offset: offsets[p],
                    partition_max_bytes: PARTITION_MAX_BYTES,
                    leader_epoch: 0, isolation: Default::default(),
                })
                .collect();
            let answers = match fetcher.fetch(&requests, FETCH_MAX_BYTES).await {
                Ok(a) => a,
                Err(e) => panic!("fetch: {e}"),
            };
            let mut served = 0u64;
            for (p, a) in answers.iter().enumerate() {
                assert_eq!(a.error, ErrorCode::None, "{:?}", a.error_message);
                served += a.records_len() as u64;
                // The next offset: from the header of the last served batch.
                let n = a.records.len();
                let next = if n >= 2 {
                    let h = &a.records[n - 2];
                    let base = i64::from_be_bytes(h[0..8].try_into().unwrap_or([0; 8]));
                    let delta = i32::from_be_bytes(h[23..27].try_into().unwrap_or([0; 4]));
                    base + i64::from(delta) + 1
                } else {
                    high_watermark
                };
                offsets[p] = if next >= high_watermark { 0 } else { next };
            }
            served
        };
        // Warm-up: one pass over everything (the cache is already filled by the writer).
        let mut warm = 0u64;
        while warm < (per_partition * PARTITIONS) as u64 {
            warm += fetch_once(&mut offsets).await;
        }
        let hits_before = cache.stats();
        coordinator.find_nanos.store(0, Ordering::Relaxed);
        let start = Instant::now();
        let mut served = 0u64;
        let mut fetches = 0u64;
        while served < serve_total {
            served += fetch_once(&mut offsets).await;
            fetches += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let fetch_rate = served as f64 / elapsed;
        let find_share = coordinator.find_nanos.load(Ordering::Relaxed) as f64 / 1e9 / elapsed;
        let stats = cache.stats();
        let loads = stats.loads - hits_before.loads;

        // Baseline: memcpy of the same volume, batch by batch, into a fetch-sized buffer.
        let mut dst = vec![0u8; (FETCH_MAX_BYTES as usize).min(32 << 20)];
        let start = Instant::now();
        let mut copied = 0u64;
        let mut pos = 0usize;
        let mut i = 0usize;
        while copied < served {
            let b = &batches[i % batches.len()];
            i += 1;
            if pos + b.len() > dst.len() {
                pos = 0;
            }
            dst[pos..pos + b.len()].copy_from_slice(b);
            pos += b.len();
            copied += b.len() as u64;
            std::hint::black_box(&dst);
        }
        let memcpy = copied as f64 / start.elapsed().as_secs_f64();
        let ratio = fetch_rate / memcpy;
        vec![
            Row::new(
                4,
                format!(
                    "fetch from cache, {PARTITIONS} partitions x 1 MiB per request, 16 KiB batches, 1 core"
                ),
                rate(fetch_rate),
            )
            .baseline(format!("memcpy {}", rate(memcpy)))
            .ratio(pct(ratio))
            .target(">= 50% of memcpy", Status::from_bool(ratio >= 0.5))
            .numbers(&[fetch_rate, memcpy, ratio]),
            Row::new(
                4,
                "  of which coordinator find_batches (in-memory model)",
                format!("{} of the time", pct(find_share)),
            )
            .baseline(format!(
                "{fetches} fetches, {:.0} us each, cache loads during run: {loads}",
                elapsed / fetches as f64 * 1e6
            ))
            .numbers(&[find_share]),
        ]
    })
}
