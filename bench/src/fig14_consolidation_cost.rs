//! Figure 14: what consolidation into tiered segments costs (issue #15,
//! docs/tiered-consolidation.md §4).
//!
//! 1. Per GiB tiered, for 1, 16 and 256 partitions per WAL object: CPU time (every thread of the
//!    process, `/proc/self/task/*/schedstat`) and requests (PUTs with multipart parts, GETs) of the
//!    `TieringWorker` consolidating [`Plan::total`] bytes of 16 KiB batches written through a
//!    `WalWriter` (default settings: 8 MiB WAL objects, each holding every partition's batches)
//!    into a `SqliteCoordinator` (in memory), storage `ObjectStoreStorage::in_memory()` (its
//!    counters count every request as billed), a fresh `MokaCache` of the default 256 MiB (cold:
//!    consolidation reads data older than `min_age`), topic `segment.bytes` 64 MiB. The baseline is
//!    the CPU of producing the same bytes through the writer in the same run.
//! 2. Coordinator time of `register_segment` against a `commit_file` of the same batch count, on
//!    SQLite (a file, `synchronous=FULL`, as figure 2) and PostgreSQL (as figures 3 and 10): a
//!    topic of 16 partitions filled by commits of one batch per partition (so a segment's batches
//!    come from as many WAL objects), then per partition the registration of its first 100 batches
//!    and of the next 1,000, each followed by the baseline: one `commit_file` of as many batches
//!    over another topic's 16 partitions. Synthetic segment keys and layouts: the coordinator does
//!    not read the segment.
//! 3. The time to consolidate a backlog against the builds run at once
//!    (`TieringConfig::max_concurrent_builds`), on S3-like latency: `fig14_concurrent_builds.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, CommitFileRequest, CoordinatorError, CoordinatorLayer, CreateTopicRequest,
    ErrorCode, Layered, ManualClock, RegisterSegmentOutcome, RegisterSegmentRequest,
    SegmentLayoutSizes, SystemClock, TopicConfig, TopicIdPartition,
};
use diskless_core::lifecycle::TieringConfig;
use diskless_core::{ProducePartition, WalWriter, WalWriterConfig};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::fig2_sqlite::{BATCH_BYTES, BATCH_RECORDS};
use crate::report::{Row, Status, ms};
use crate::util::{
    bench_dir, make_batches, now_ms, percentile, plain_batch, process_cpu_time, random_uuid,
    runtime,
};

const FIG: u8 = 14;
const BATCH: usize = 16 << 10;
const GIB: f64 = (1u64 << 30) as f64;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Sizes of one run.
struct Plan {
    /// Bytes produced, then tiered, per partitions-per-object case.
    total: usize,
    /// Part 1: runs per case (the least CPU is reported).
    reps: usize,
    /// Part 2: the two registration sizes (batches), and the partitions (samples per size).
    small: usize,
    large: usize,
    partitions: i32,
}

fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            total: 2 << 20,
            reps: 1,
            small: 10,
            large: 40,
            partitions: 4,
        }
    } else {
        Plan {
            total: 128 << 20,
            reps: 3,
            small: 100,
            large: 1000,
            partitions: 16,
        }
    }
}

/// Runs figure 14.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let plan = plan(quick);
    let rt = runtime();
    let mut rows = rt.block_on(async {
        let mut rows = Vec::new();
        for k in [1, 16, 256] {
            rows.extend(consolidation(&plan, k).await);
        }
        rows.extend(registration_sqlite(&plan).await);
        rows.extend(registration_postgres(&plan).await);
        rows
    });
    // Part 3, on its own (paused) runtime.
    rows.extend(crate::fig14_concurrent_builds::run(quick));
    rows
}

// -------------------------------------------------------------------------------------------------
// Part 1

/// Times `register_segment` calls (wall time) and counts their batches.
#[derive(Debug, Default)]
struct RegisterTimes {
    nanos: AtomicU64,
    calls: AtomicU64,
    batches: AtomicU64,
}

#[async_trait::async_trait]
impl CoordinatorLayer for RegisterTimes {
    async fn register_segment(
        &self,
        inner: &dyn BatchCoordinator,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        let batches = u64::from(request.batch_count);
        let start = Instant::now();
        let r = inner.register_segment(request).await;
        self.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.batches.fetch_add(batches, Ordering::Relaxed);
        r
    }
}

fn cpu_now() -> Duration {
    process_cpu_time().unwrap_or_default()
}

/// What one consolidation run measured.
#[derive(Clone, Copy, Debug)]
struct Measured {
    produce_cpu: Duration,
    produce_wall: Duration,
    cpu: Duration,
    wall: Duration,
    register: Duration,
    register_calls: u64,
    registered_batches: u64,
    wal_objects: u64,
    segments: u64,
    tiered: u64,
    passes: u64,
    write: diskless_storage::RequestStats,
    cost: diskless_storage::RequestStats,
}

/// `reps` runs of [`consolidation_once`]; the rows give the least CPU and wall time of each
/// (consolidation and produce separately), as figure 1 takes the best of its repetitions to damp
/// the other work on this shared machine. Request counts do not vary.
async fn consolidation(plan: &Plan, k: i32) -> Vec<Row> {
    let mut runs = Vec::new();
    for _ in 0..plan.reps {
        runs.push(consolidation_once(plan, k).await);
    }
    let best = |f: fn(&Measured) -> Duration| runs.iter().map(f).min().unwrap_or_default();
    let Some(last) = runs.last().copied() else {
        return Vec::new();
    };
    let m = Measured {
        produce_cpu: best(|m| m.produce_cpu),
        produce_wall: best(|m| m.produce_wall),
        cpu: best(|m| m.cpu),
        wall: best(|m| m.wall),
        register: best(|m| m.register),
        ..last
    };
    rows_of(plan, k, &m)
}

async fn consolidation_once(plan: &Plan, k: i32) -> Measured {
    let clock = ManualClock::new(now_ms());
    let sqlite = match SqliteCoordinator::in_memory(clock.clone()).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 14: SQLite: {e}"),
    };
    let timed = Arc::new(Layered::new(
        sqlite.clone() as Arc<dyn BatchCoordinator>,
        RegisterTimes::default(),
    ));
    let coordinator: Arc<dyn BatchCoordinator> = timed.clone();
    let (topic, config) =
        crate::tiered::create_tiered_topic(coordinator.as_ref(), "fig14", k, 64 << 20, FIG).await;
    let config = Arc::new(config);
    let store = Arc::new(ObjectStoreStorage::in_memory());
    let counters = store.counters().clone();
    let storage: Arc<dyn ObjectStorage> = store;
    let batches: Vec<Bytes> = make_batches(64, BATCH);

    // Produce, timed as the baseline.
    let writer = match WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default())
        .with_clock(clock.clone())
        .build()
    {
        Ok(w) => w,
        Err(e) => panic!("figure 14: writer: {e}"),
    };
    let before_put = counters.snapshot();
    let cpu0 = cpu_now();
    let wall0 = Instant::now();
    let mut pending = Vec::new();
    let mut produced = 0usize;
    let mut i = 0usize;
    while produced < plan.total {
        let request: Vec<ProducePartition> = (0..16)
            .map(|j| {
                let records = batches[(i + j) % batches.len()].clone();
                produced += records.len();
                ProducePartition {
                    partition: TopicIdPartition::new(topic, ((i + j) % k as usize) as i32),
                    config: config.clone(),
                    records,
                    txn_seq: None,
                }
            })
            .collect();
        i += 16;
        pending.push(writer.append(request).await);
    }
    writer.flush().await;
    for p in pending {
        assert!(
            p.await.iter().all(|a| a.error == ErrorCode::None),
            "figure 14: produce failed"
        );
    }
    let produce_cpu = cpu_now().saturating_sub(cpu0);
    let produce_wall = wall0.elapsed();
    let wal_objects = writer.stats().segments_uploaded;
    writer.close().await;
    let write = counters.snapshot() - before_put;

    // Consolidate everything.
    clock.advance(3_600_000);
    let cache: Arc<dyn LocalCache> = match MokaCache::new(MokaCacheConfig::default()) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 14: cache: {e}"),
    };
    let worker = crate::tiered::worker(
        coordinator.clone(),
        storage.clone(),
        Some(cache),
        clock.clone(),
        TieringConfig::default(),
        FIG,
    );
    let before = counters.snapshot();
    let cpu0 = cpu_now();
    let wall0 = Instant::now();
    let crate::tiered::Tiered {
        segments,
        bytes: tiered,
        passes,
    } = crate::tiered::tier_everything(&worker, FIG).await;
    let cpu = cpu_now().saturating_sub(cpu0);
    let wall = wall0.elapsed();
    let cost = counters.snapshot() - before;
    let layer = timed.layer();
    let register = Duration::from_nanos(layer.nanos.load(Ordering::Relaxed));
    let registered_batches = layer.batches.load(Ordering::Relaxed);
    Measured {
        produce_cpu,
        produce_wall,
        cpu,
        wall,
        register,
        register_calls: layer.calls.load(Ordering::Relaxed),
        registered_batches,
        wal_objects,
        segments,
        tiered,
        passes,
        write,
        cost,
    }
}

fn rows_of(plan: &Plan, k: i32, m: &Measured) -> Vec<Row> {
    let Measured {
        produce_cpu,
        produce_wall,
        cpu,
        wall,
        register,
        register_calls,
        registered_batches,
        wal_objects,
        segments,
        tiered,
        passes,
        write,
        cost,
    } = *m;
    let reps = plan.reps;
    let gib = tiered as f64 / GIB;
    let per_gib = |x: f64| x / gib.max(1e-12);
    let produced_gib = write.put_bytes as f64 / GIB;
    let cpu_per_gib = per_gib(cpu.as_secs_f64());
    let produce_cpu_per_gib = produce_cpu.as_secs_f64() / produced_gib.max(1e-12);
    let what = format!(
        "{k} partition{} per WAL object",
        if k == 1 { "" } else { "s" }
    );
    vec![
        Row::new(
            FIG,
            format!(
                "consolidation CPU per GiB tiered, {what} ({:.0} MiB, {wal_objects} WAL objects -> {segments} segments, {passes} passes; least of {reps} runs)",
                tiered as f64 / (1u64 << 20) as f64
            ),
            format!(
                "{cpu_per_gib:.2} CPU s/GiB (wall {:.2} s/GiB)",
                per_gib(wall.as_secs_f64())
            ),
        )
        .baseline(format!(
            "produce of the same data: {produce_cpu_per_gib:.2} CPU s/GiB (wall {:.2} s/GiB)",
            produce_wall.as_secs_f64() / produced_gib.max(1e-12)
        ))
        .ratio(format!("{:.2}x", cpu_per_gib / produce_cpu_per_gib.max(1e-12)))
        .numbers(&[cpu_per_gib, produce_cpu_per_gib]),
        Row::new(
            FIG,
            format!("  requests per GiB tiered, {what}"),
            format!(
                "{:.0} PUTs/GiB (of which {:.0} multipart parts), {:.0} GETs/GiB ({:.2} bytes read per byte tiered)",
                per_gib(cost.put_requests as f64),
                per_gib(cost.put_parts as f64),
                per_gib(cost.get_requests as f64),
                cost.get_bytes as f64 / tiered.max(1) as f64
            ),
        )
        .baseline(format!(
            "writing it: {:.0} PUTs/GiB ({} PUTs)",
            write.put_requests as f64 / produced_gib.max(1e-12),
            write.put_requests
        ))
        .ratio(format!(
            "{:.2}x PUTs",
            per_gib(cost.put_requests as f64)
                / (write.put_requests as f64 / produced_gib.max(1e-12)).max(1e-12)
        ))
        .numbers(&[
            per_gib(cost.put_requests as f64),
            per_gib(cost.put_parts as f64),
            per_gib(cost.get_requests as f64),
        ]),
        Row::new(
            FIG,
            format!("  of which register_segment (SQLite in memory), {what}"),
            format!(
                "{:.1}% of the wall time ({} calls, {registered_batches} batches, {} per call)",
                register.as_secs_f64() / wall.as_secs_f64().max(1e-12) * 100.0,
                register_calls,
                ms(register / u32::try_from(register_calls.max(1)).unwrap_or(1))
            ),
        )
        .numbers(&[register.as_secs_f64()]),
    ]
}

// -------------------------------------------------------------------------------------------------
// Part 2

/// The two topics of part 2: the registered one (one batch per partition per commit) and the
/// baseline's.
struct Topics {
    tiered: uuid::Uuid,
    baseline: uuid::Uuid,
}

async fn setup(coordinator: &dyn BatchCoordinator, plan: &Plan) -> Topics {
    let config = TopicConfig {
        retention_ms: -1,
        ..TopicConfig::default()
    };
    let mut ids = Vec::new();
    for name in ["fig14-tiered", "fig14-baseline"] {
        let topic_id = random_uuid();
        if let Err(e) = coordinator
            .create_topic(CreateTopicRequest {
                topic_id,
                name: format!("{name}-{topic_id}"),
                partitions: plan.partitions,
                config: config.clone(),
            })
            .await
        {
            panic!("figure 14: creating a topic: {e}");
        }
        ids.push(topic_id);
    }
    Topics {
        tiered: ids[0],
        baseline: ids[1],
    }
}

/// One object of `n` batches over the 16 partitions of `topic` (round-robin).
fn commit_request(topic: uuid::Uuid, partitions: i32, n: usize, key: String) -> CommitFileRequest {
    let ts = now_ms();
    let batches = (0..n)
        .map(|i| {
            plain_batch(
                TopicIdPartition::new(topic, (i % partitions as usize) as i32),
                1 + (i as u64) * u64::from(BATCH_BYTES),
                BATCH_BYTES,
                BATCH_RECORDS,
                ts,
                ts,
            )
        })
        .collect();
    CommitFileRequest {
        object_key: key,
        uploader_broker_id: 1,
        object_size: 1 + n as u64 * u64::from(BATCH_BYTES),
        owners: vec![0],
        batches,
    }
}

/// Fills the registered topic: `batches` commits of one batch per partition.
async fn fill(coordinator: &dyn BatchCoordinator, topics: &Topics, plan: &Plan, batches: usize) {
    let run = random_uuid().simple().to_string();
    for f in 0..batches {
        let request = commit_request(
            topics.tiered,
            plan.partitions,
            plan.partitions as usize,
            format!("fig14/{run}/fill/{f:06}"),
        );
        match coordinator.commit_file(request).await {
            Ok(r) if r.iter().all(|b| b.error == ErrorCode::None) => {}
            other => panic!("figure 14: fill commit: {other:?}"),
        }
    }
}

/// Registration of the partition's next `n` batches (from `base`), synthetic segment.
fn register_request(
    partition: TopicIdPartition,
    base: i64,
    n: usize,
    key: String,
) -> RegisterSegmentRequest {
    let log = n as u64 * u64::from(BATCH_BYTES);
    let records = i64::from(BATCH_RECORDS);
    let end = base + n as i64 * records - 1;
    let layout = SegmentLayoutSizes {
        log,
        offset_index: 8 * n as u32,
        time_index: 12 * n as u32,
        txn_index: 0,
        producer_snapshot: 0,
        leader_epochs: 0,
    };
    let object_size = layout.object_size();
    RegisterSegmentRequest {
        partition,
        object_key: key,
        object_size,
        uploader_broker_id: 1,
        layout,
        base_offset: base,
        end_offset: end,
        batch_count: n as u32,
        batch_bytes: log,
        max_timestamp: now_ms(),
        max_timestamp_offset: end,
        owner: 0,
    }
}

/// Per partition: register `small` then `large` batches, each followed by a baseline commit of
/// as many batches; p50s.
async fn registrations(
    coordinator: &dyn BatchCoordinator,
    topics: &Topics,
    plan: &Plan,
) -> Vec<(usize, Vec<Duration>, Vec<Duration>)> {
    let run = random_uuid().simple().to_string();
    let mut out = vec![
        (plan.small, Vec::new(), Vec::new()),
        (plan.large, Vec::new(), Vec::new()),
    ];
    for p in 0..plan.partitions {
        let partition = TopicIdPartition::new(topics.tiered, p);
        let mut base = 0i64;
        for (n, registers, commits) in out.iter_mut() {
            let n = *n;
            let request =
                register_request(partition, base, n, format!("fig14/{run}/seg/{p}/{base}"));
            let start = Instant::now();
            let outcome = coordinator.register_segment(request).await;
            registers.push(start.elapsed());
            match outcome {
                Ok(RegisterSegmentOutcome::Registered { .. }) => {}
                other => panic!("figure 14: register_segment of {n} batches: {other:?}"),
            }
            base += n as i64 * i64::from(BATCH_RECORDS);
            let request = commit_request(
                topics.baseline,
                plan.partitions,
                n,
                format!("fig14/{run}/commit/{p}/{n}"),
            );
            let start = Instant::now();
            let results = coordinator.commit_file(request).await;
            commits.push(start.elapsed());
            match results {
                Ok(r) if r.iter().all(|b| b.error == ErrorCode::None) => {}
                other => panic!("figure 14: baseline commit: {other:?}"),
            }
        }
    }
    out
}

fn registration_rows(
    backend: &str,
    partitions: i32,
    results: Vec<(usize, Vec<Duration>, Vec<Duration>)>,
) -> Vec<Row> {
    results
        .into_iter()
        .map(|(n, mut registers, mut commits)| {
            let (r50, r99) = (percentile(&mut registers, 0.5), percentile(&mut registers, 0.99));
            let (c50, c99) = (percentile(&mut commits, 0.5), percentile(&mut commits, 0.99));
            let ratio = r50.as_secs_f64() / c50.as_secs_f64().max(1e-12);
            Row::new(
                FIG,
                format!(
                    "{backend} register_segment of {n} batches (from {n} WAL objects), p50 / p99 ({partitions} samples)"
                ),
                format!("{} / {}", ms(r50), ms(r99)),
            )
            .baseline(format!(
                "commit_file of {n} batches over {partitions} partitions: {} / {}",
                ms(c50),
                ms(c99)
            ))
            .ratio(format!("{ratio:.2}x"))
            .target("(none)", Status::Info)
            .numbers(&[r50.as_secs_f64(), c50.as_secs_f64(), ratio])
        })
        .collect()
}

async fn registration_sqlite(plan: &Plan) -> Vec<Row> {
    let dir = bench_dir();
    let coordinator = match SqliteCoordinator::open(
        dir.path().join("fig14.db"),
        SqliteOptions::default().with_synchronous(Synchronous::Full),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => panic!("figure 14: SQLite: {e}"),
    };
    let topics = setup(&coordinator, plan).await;
    fill(&coordinator, &topics, plan, plan.small + plan.large + 1).await;
    let results = registrations(&coordinator, &topics, plan).await;
    registration_rows("SQLite (FULL sync)", plan.partitions, results)
}

async fn registration_postgres(plan: &Plan) -> Vec<Row> {
    let what = "PostgreSQL register_segment vs commit_file";
    let url = std::env::var("DISKLESS_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
    let schema = format!("diskless_bench_fig14_{}", random_uuid().simple());
    let mut admin =
        match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return vec![Row::not_measured(
                    FIG,
                    what,
                    format!("no server at {url}: {e}"),
                )];
            }
            Err(_) => {
                return vec![Row::not_measured(
                    FIG,
                    what,
                    format!("no server at {url}: timeout"),
                )];
            }
        };
    let rows = match PostgresCoordinator::connect(
        PostgresOptions::new(&url).with_schema(schema.clone()),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(coordinator) => {
            let topics = setup(&coordinator, plan).await;
            fill(&coordinator, &topics, plan, plan.small + plan.large + 1).await;
            let results = registrations(&coordinator, &topics, plan).await;
            coordinator.close().await;
            registration_rows("PostgreSQL", plan.partitions, results)
        }
        Err(e) => vec![Row::not_measured(FIG, what, format!("coordinator: {e}"))],
    };
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&mut admin)
    .await;
    let _ = admin.close().await;
    rows
}
