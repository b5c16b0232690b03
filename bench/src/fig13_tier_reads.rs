//! Figure 13: catch-up reads of old data from tiered segments vs from WAL objects (issue #15,
//! docs/tiered-consolidation.md §4), same data, same run.
//!
//! 16 partitions; one produce request per WAL object holding one 16 KiB batch per partition
//! (a 256 KiB object, each partition's share 16 KiB: a writer sealing often, many partitions per
//! object), until each partition holds [`Plan::per_partition`] bytes. A catch-up consumer then reads
//! from offset 0 to the high watermark with sequential Fetch requests (`max.partition.fetch.bytes`
//! 1 MiB, `fetch.max.bytes` 50 MiB, Kafka's defaults) through a `Fetcher` with a fresh (cold)
//! `MokaCache`: once reading one partition, once reading all 16 in each request. The store's GETs
//! wait a draw of figure 5's S3-like latency (log-normal, p50 100 ms, p99 400 ms) plus the bytes at
//! [`TRANSFER_BYTES_PER_S`] (one S3 connection's order of magnitude), on tokio's paused clock:
//! throughput is simulated time, exact and reproducible; CPU is not in it. Then the `TieringWorker`
//! consolidates everything (the store's latency off) and the same reads run again, from the
//! segments. The records served must be the same bytes (CRC-32C compared).
//!
//! Coordinator: the in-memory model (`InMemoryCoordinator`): SQLite's own thread would let the
//! paused clock jump while a query runs.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::{BatchCoordinator, ErrorCode, ManualClock, TopicIdPartition};
use diskless_core::lifecycle::TieringConfig;
use diskless_core::{FetchPartition, Fetcher, WalWriter, WalWriterConfig};
use diskless_storage::{
    ObjectKey, ObjectMeta, ObjectStorage, ObjectStoreStorage, RequestCounters, StorageError,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::storage::Latency;
use futures::stream::BoxStream;
use parking_lot::Mutex;

use crate::report::{Row, rate};
use crate::tiered::{create_tiered_topic, produce_rounds, tier_everything, worker};
use crate::util::paused_runtime;

const FIG: u8 = 13;
const PARTITIONS: i32 = 16;
const BATCH: usize = 16 << 10;
/// Kafka's consumer defaults.
const PARTITION_MAX_BYTES: u32 = 1 << 20;
const FETCH_MAX_BYTES: u32 = 50 << 20;
/// Transfer rate of one GET once its first byte arrived (about one S3 connection's).
const TRANSFER_BYTES_PER_S: f64 = 90e6;
const MIB: f64 = (1u64 << 20) as f64;

/// Sizes of one run.
struct Plan {
    /// Bytes produced to each partition.
    per_partition: usize,
}

fn plan(quick: bool) -> Plan {
    Plan {
        per_partition: if quick { 256 << 10 } else { 8 << 20 },
    }
}

/// A store whose GETs take simulated time (when `on`): a latency draw (from a fixed seed, in
/// call order) plus the bytes at [`TRANSFER_BYTES_PER_S`]. Everything else passes through
/// (streamed uploads too, so segments are uploaded as on S3: one PUT, or multipart when large).
#[derive(Debug)]
struct GetLatencyStorage {
    inner: Arc<dyn ObjectStorage>,
    latency: Latency,
    rng: Mutex<fastrand::Rng>,
    on: AtomicBool,
}

#[async_trait]
impl ObjectStorage for GetLatencyStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        self.inner.upload_stream(key, chunks, part_size).await
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        if self.on.load(Ordering::Relaxed) {
            let first_byte = self.latency.sample(&mut self.rng.lock());
            let transfer = Duration::from_secs_f64(
                range.end.saturating_sub(range.start) as f64 / TRANSFER_BYTES_PER_S,
            );
            tokio::time::sleep(first_byte + transfer).await;
        }
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list(prefix)
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner.list_with_offset(prefix, offset)
    }
}

/// What one catch-up read measured.
#[derive(Clone, Copy, Debug, Default)]
struct Read {
    /// Record bytes served.
    served: u64,
    /// Simulated time from the first Fetch to the last answer.
    elapsed: Duration,
    /// Fetch requests.
    fetches: u64,
    /// GETs sent to the store, and their bytes.
    gets: u64,
    get_bytes: u64,
    /// CRC-32C of the records served, partition by partition in offset order.
    crc: u32,
}

impl Read {
    fn throughput(&self) -> f64 {
        self.served as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn gets_per_mib(&self) -> f64 {
        self.gets as f64 / (self.served as f64 / MIB).max(1e-9)
    }
}

/// Runs figure 13.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let plan = plan(quick);
    paused_runtime().block_on(measure(&plan))
}

async fn measure(plan: &Plan) -> Vec<Row> {
    let clock = ManualClock::new(crate::util::now_ms());
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let (topic, config) =
        create_tiered_topic(coordinator.as_ref(), "fig13", PARTITIONS, 64 << 20, 13).await;
    let store = Arc::new(ObjectStoreStorage::in_memory());
    let counters: RequestCounters = store.counters().clone();
    let sim = Arc::new(GetLatencyStorage {
        inner: store,
        latency: Latency::s3_like(),
        rng: Mutex::new(fastrand::Rng::with_seed(13)),
        on: AtomicBool::new(false),
    });
    let storage: Arc<dyn ObjectStorage> = sim.clone();

    // Produce: one WAL object per request of one batch per partition.
    let writer = match WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default())
        .with_clock(clock.clone())
        .build()
    {
        Ok(w) => w,
        Err(e) => panic!("figure 13: writer: {e}"),
    };
    let config = Arc::new(config);
    let rounds = plan.per_partition.div_ceil(BATCH);
    produce_rounds(
        &writer, &clock, topic, PARTITIONS, &config, rounds, BATCH, 13,
    )
    .await;
    writer.close().await;
    let objects = writer.stats().segments_uploaded;

    sim.on.store(true, Ordering::Relaxed);
    let wal_one = catch_up(&storage, &coordinator, &counters, topic, &[0]).await;
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let wal_all = catch_up(&storage, &coordinator, &counters, topic, &all).await;

    // Consolidate everything (store latency off: only the reads are measured here).
    sim.on.store(false, Ordering::Relaxed);
    clock.advance(3_600_000);
    let worker = worker(
        coordinator.clone(),
        storage.clone(),
        None,
        clock.clone(),
        TieringConfig::default(),
        13,
    );
    let segments = tier_everything(&worker, 13).await.segments;

    sim.on.store(true, Ordering::Relaxed);
    let tiered_one = catch_up(&storage, &coordinator, &counters, topic, &[0]).await;
    let tiered_all = catch_up(&storage, &coordinator, &counters, topic, &all).await;
    assert_eq!(
        (wal_one.crc, wal_all.crc),
        (tiered_one.crc, tiered_all.crc),
        "figure 13: the tiers served different bytes"
    );

    let mut rows = Vec::new();
    let setup = format!(
        "{} MiB per partition, {objects} WAL objects of {} KiB ({} KiB per partition), {segments} segments",
        plan.per_partition >> 20,
        (BATCH * PARTITIONS as usize) >> 10,
        BATCH >> 10,
    );
    for (what, wal, tiered) in [
        ("1 partition of 16", &wal_one, &tiered_one),
        ("all 16 partitions per Fetch", &wal_all, &tiered_all),
    ] {
        rows.push(
            Row::new(
                FIG,
                format!(
                    "catch-up read of old data, {what}, cold cache, S3-like GET latency: from tiered segments (simulated time; {setup})"
                ),
                format!(
                    "{} ({:.1} MiB in {:.2} s, {} fetches)",
                    rate(tiered.throughput()),
                    tiered.served as f64 / MIB,
                    tiered.elapsed.as_secs_f64(),
                    tiered.fetches
                ),
            )
            .baseline(format!(
                "same data from WAL objects: {} ({:.2} s, {} fetches)",
                rate(wal.throughput()),
                wal.elapsed.as_secs_f64(),
                wal.fetches
            ))
            .ratio(format!("{:.2}x", tiered.throughput() / wal.throughput()))
            .numbers(&[tiered.throughput(), wal.throughput()]),
        );
        rows.push(
            Row::new(
                FIG,
                format!("  GETs per MiB read, {what}: after consolidation"),
                format!(
                    "{:.2} ({} GETs, {:.2} bytes read per byte served)",
                    tiered.gets_per_mib(),
                    tiered.gets,
                    tiered.get_bytes as f64 / tiered.served.max(1) as f64
                ),
            )
            .baseline(format!(
                "before (WAL objects): {:.2} ({} GETs, {:.2} bytes read per byte served)",
                wal.gets_per_mib(),
                wal.gets,
                wal.get_bytes as f64 / wal.served.max(1) as f64
            ))
            .ratio(format!(
                "{:.3}x",
                tiered.gets_per_mib() / wal.gets_per_mib().max(1e-9)
            ))
            .numbers(&[tiered.gets_per_mib(), wal.gets_per_mib()]),
        );
    }
    rows
}

/// Reads `partitions` from offset 0 to their high watermark with sequential fetches through a
/// fresh cache.
async fn catch_up(
    storage: &Arc<dyn ObjectStorage>,
    coordinator: &Arc<dyn BatchCoordinator>,
    counters: &RequestCounters,
    topic: uuid::Uuid,
    partitions: &[i32],
) -> Read {
    let cache: Arc<dyn LocalCache> = match MokaCache::new(MokaCacheConfig::default()) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 13: cache: {e}"),
    };
    let fetcher = match Fetcher::builder(storage.clone(), coordinator.clone())
        .with_cache(cache)
        .build()
    {
        Ok(f) => f,
        Err(e) => panic!("figure 13: fetcher: {e}"),
    };
    let mut offsets: Vec<i64> = vec![0; partitions.len()];
    let mut done = vec![false; partitions.len()];
    let mut crcs: Vec<u32> = vec![0; partitions.len()];
    let before = counters.snapshot();
    let start = tokio::time::Instant::now();
    let mut read = Read::default();
    while done.iter().any(|d| !d) {
        let requests: Vec<FetchPartition> = partitions
            .iter()
            .zip(&offsets)
            .zip(&done)
            .filter(|(_, d)| !**d)
            .map(|((p, o), _)| FetchPartition {
                partition: TopicIdPartition::new(topic, *p),
                fetch_offset: *o,
                partition_max_bytes: PARTITION_MAX_BYTES,
                leader_epoch: 0,
                isolation: Default::default(),
            })
            .collect();
        let answers = match fetcher.fetch(&requests, FETCH_MAX_BYTES).await {
            Ok(a) => a,
            Err(e) => panic!("figure 13: fetch: {e}"),
        };
        read.fetches += 1;
        for (request, answer) in requests.iter().zip(answers) {
            assert_eq!(answer.error, ErrorCode::None, "figure 13: fetch {answer:?}");
            let Some(i) = partitions
                .iter()
                .position(|p| *p == request.partition.partition)
            else {
                continue;
            };
            let records = answer.records_bytes();
            read.served += records.len() as u64;
            crcs[i] = crc32c::crc32c_append(crcs[i], &records);
            offsets[i] = next_offset(&records, offsets[i]);
            if offsets[i] >= answer.high_watermark {
                done[i] = true;
            }
        }
    }
    read.elapsed = start.elapsed();
    let cost = counters.snapshot() - before;
    read.gets = cost.get_requests;
    read.get_bytes = cost.get_bytes;
    read.crc = crcs
        .iter()
        .fold(0u32, |acc, c| crc32c::crc32c_append(acc, &c.to_le_bytes()));
    read
}

/// The offset after the last batch of `records` (v2 batches), or `current` when empty.
fn next_offset(records: &[u8], current: i64) -> i64 {
    let mut pos = 0usize;
    let mut next = current;
    while pos + 61 <= records.len() {
        let field = |at: usize, n: usize| &records[pos + at..pos + at + n];
        let base = i64::from_be_bytes(field(0, 8).try_into().unwrap_or([0; 8]));
        let len = i32::from_be_bytes(field(8, 4).try_into().unwrap_or([0; 4]));
        let delta = i32::from_be_bytes(field(23, 4).try_into().unwrap_or([0; 4]));
        next = base + i64::from(delta) + 1;
        pos += 12 + len.max(0) as usize;
    }
    next
}
