//! Figure 10: the coordinator at scale (issue 17, section 3), each part next to raw inserts or a
//! smaller store measured in the same run.
//!
//! 1. PostgreSQL commits of 100 batches over 1,000 partitions, without producer ids and from one
//!    idempotent producer per partition, against a raw 100-row multi-row insert transaction into
//!    figure 3's table (a primary key and one foreign key) and into the coordinator's own tables
//!    (its indexes and foreign keys).
//! 2. Large fan-out: one segment of 2,000 batches over 1,000 partitions (two per partition, of the
//!    same producer when idempotent), on SQLite (a file, synchronous=FULL, as figure 2) and
//!    PostgreSQL, against raw inserts of the same rows.
//! 3. Growth: commit latency (100 batches to random partitions) and `find_batches` latency (one
//!    batch of a random partition, at its last batch and at a random offset) with 10k stored
//!    batches and with 1M (full run; `DISKLESS_BENCH_FIG10_SQLITE_BATCHES` and
//!    `DISKLESS_BENCH_FIG10_PG_BATCHES` set other sizes, e.g. 10M: the fill then takes minutes),
//!    over 100,000 partitions: flat when every statement is an index probe.
//!
//! PostgreSQL comes from `DISKLESS_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! and works in fresh schemas dropped at the end; without a server its rows are "not measured".

use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, FindBatchesRequest, SystemClock,
    TopicIdPartition,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::fig2_sqlite::{BATCH_BYTES, BATCH_RECORDS};
use crate::raw::{PgRaw, SqliteRaw};
use crate::report::{Row, Status, count, ms, scaling_row};
use crate::util::{bench_dir, create_topic, now_ms, percentile, plain_batch, random_uuid, runtime};

const FIG: u8 = 10;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Partitions of parts 1 and 2.
const PARTITIONS: usize = 1000;
/// Batches of a fan-out segment.
const FAN_OUT: usize = 2000;
/// The target for part 1: commit p50 at most this times the raw transaction's.
const TARGET_RATIO: f64 = 1.5;

/// Sizes of one run.
struct Plan {
    /// Part 1: interleaved rounds, and commits per variant per round.
    rounds: usize,
    per_round: usize,
    /// Part 2: rounds and commits per variant per round.
    fan_rounds: usize,
    fan_per_round: usize,
    /// Part 3: partitions, the small and the large store (batches), samples per measurement.
    growth_partitions: usize,
    small: usize,
    sqlite_large: usize,
    postgres_large: usize,
    commits: usize,
    finds: usize,
}

/// `DISKLESS_BENCH_FIG10_SQLITE_BATCHES` / `DISKLESS_BENCH_FIG10_PG_BATCHES` override the large
/// store sizes (e.g. 10000000 for PostgreSQL: its fill alone takes minutes on a small machine).
fn plan(quick: bool) -> Plan {
    let mut p = default_plan(quick);
    let size = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let Some(n) = size("DISKLESS_BENCH_FIG10_SQLITE_BATCHES") {
        p.sqlite_large = n.max(p.small + 1);
    }
    if let Some(n) = size("DISKLESS_BENCH_FIG10_PG_BATCHES") {
        p.postgres_large = n.max(p.small + 1);
    }
    p
}

fn default_plan(quick: bool) -> Plan {
    if quick {
        Plan {
            rounds: 1,
            per_round: 5,
            fan_rounds: 1,
            fan_per_round: 2,
            growth_partitions: 1_000,
            small: 1_000,
            sqlite_large: 20_000,
            postgres_large: 20_000,
            commits: 10,
            finds: 50,
        }
    } else {
        Plan {
            rounds: 6,
            per_round: 50,
            fan_rounds: 3,
            fan_per_round: 10,
            growth_partitions: 100_000,
            small: 10_000,
            sqlite_large: 1_000_000,
            postgres_large: 1_000_000,
            commits: 200,
            finds: 2_000,
        }
    }
}

/// Runs figure 10.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let plan = plan(quick);
    let rt = runtime();
    rt.block_on(async {
        let mut rows = Vec::new();
        rows.extend(postgres_commits(&plan).await);
        rows.extend(sqlite_fan_out(&plan).await);
        rows.extend(sqlite_growth(&plan).await);
        rows.extend(postgres_growth(&plan).await);
        rows
    })
}

// -------------------------------------------------------------------------------------------------
// Workload

/// Commit requests over a topic's partitions of 16 KiB, 32-record batches: round-robin (or random)
/// partitions; idempotent batches come from one producer per partition (producer id = partition),
/// always in sequence.
struct Load {
    topic: uuid::Uuid,
    partitions: usize,
    next: usize,
    seq: Vec<i32>,
    ts: i64,
    name: &'static str,
    files: u64,
}

impl Load {
    fn new(topic: uuid::Uuid, partitions: usize, name: &'static str) -> Load {
        Load {
            topic,
            partitions,
            next: 0,
            seq: vec![0; partitions],
            ts: now_ms(),
            name,
            files: 0,
        }
    }

    fn batch(&mut self, partition: usize, i: usize, idempotent: bool) -> CommitBatch {
        let mut batch = plain_batch(
            TopicIdPartition::new(self.topic, partition as i32),
            1 + i as u64 * u64::from(BATCH_BYTES),
            BATCH_BYTES,
            BATCH_RECORDS,
            self.ts,
            self.ts + 5,
        );
        if idempotent {
            let base = self.seq[partition];
            self.seq[partition] = base + BATCH_RECORDS;
            batch.producer_id = partition as i64;
            batch.producer_epoch = 0;
            batch.base_sequence = base;
            batch.last_sequence = base + BATCH_RECORDS - 1;
        }
        batch
    }

    fn request(&mut self, batches: Vec<CommitBatch>) -> CommitFileRequest {
        self.files += 1;
        let n = batches.len() as u64;
        CommitFileRequest {
            object_key: format!("scale/{}/{:09}", self.name, self.files),
            uploader_broker_id: 1,
            object_size: 1 + n * u64::from(BATCH_BYTES),
            owners: vec![0],
            batches,
        }
    }

    /// `n` batches, round-robin over the partitions.
    fn round_robin(&mut self, n: usize, idempotent: bool) -> CommitFileRequest {
        let batches = (0..n)
            .map(|i| {
                let p = self.next % self.partitions;
                self.next += 1;
                self.batch(p, i, idempotent)
            })
            .collect();
        self.request(batches)
    }

    /// `n` batches to random partitions (no producer ids).
    fn random(&mut self, n: usize, rng: &mut fastrand::Rng) -> CommitFileRequest {
        let batches = (0..n)
            .map(|i| {
                let p = rng.usize(0..self.partitions);
                self.batch(p, i, false)
            })
            .collect();
        self.request(batches)
    }
}

/// Commits `request`, returns how long it took; panics if any batch was rejected (the workload
/// is valid by construction).
async fn timed_commit(c: &dyn BatchCoordinator, request: CommitFileRequest) -> Duration {
    let start = Instant::now();
    match c.commit_file(request).await {
        Ok(results) => {
            let elapsed = start.elapsed();
            if let Some(r) = results.iter().find(|r| !r.error.is_ok() || r.duplicate) {
                panic!("figure 10: a batch was not appended: {r:?}");
            }
            elapsed
        }
        Err(e) => panic!("figure 10: commit: {e}"),
    }
}

/// p50 and p99.
fn p50_p99(v: &mut [Duration]) -> (Duration, Duration) {
    (percentile(v, 0.5), percentile(v, 0.99))
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

// -------------------------------------------------------------------------------------------------
// PostgreSQL: parts 1 and 2

fn pg_url() -> String {
    std::env::var("DISKLESS_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// A connection to the server, or the reason there is none.
async fn pg_connect(url: &str) -> Result<PgConnection, String> {
    match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("no PostgreSQL at {url}: {e}")),
        Err(_) => Err(format!("no PostgreSQL at {url}: timeout")),
    }
}

fn fresh_schema(prefix: &str) -> String {
    let suffix = random_uuid().simple().to_string();
    format!("diskless_bench_{prefix}_{}", &suffix[..12])
}

async fn drop_schemas(admin: &mut PgConnection, schemas: &[&str]) {
    for s in schemas {
        let _ = sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
            .execute(&mut *admin)
            .await;
    }
}

async fn pg_coordinator(url: &str, schema: &str) -> Result<PostgresCoordinator, String> {
    PostgresCoordinator::connect(
        PostgresOptions::new(url).with_schema(schema),
        Arc::new(SystemClock),
    )
    .await
    .map_err(|e| format!("coordinator: {e}"))
}

/// Latencies of the four variants of one commit size.
#[derive(Default)]
struct Series {
    plain: Vec<Duration>,
    idempotent: Vec<Duration>,
    raw: Vec<Duration>,
    raw_same_table: Vec<Duration>,
}

/// Parts 1 and 2 on PostgreSQL.
async fn postgres_commits(plan: &Plan) -> Vec<Row> {
    let url = pg_url();
    let mut admin = match pg_connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            return vec![Row::not_measured(
                FIG,
                "PostgreSQL commit vs raw insert transaction",
                e,
            )];
        }
    };
    let coord_schema = fresh_schema("scale");
    let raw_schema = fresh_schema("scale_raw");
    let rows = match postgres_commits_in(plan, &url, &coord_schema, &raw_schema, &mut admin).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::not_measured(
            FIG,
            "PostgreSQL commit vs raw insert transaction",
            e,
        )],
    };
    drop_schemas(&mut admin, &[&coord_schema, &raw_schema]).await;
    let _ = admin.close().await;
    rows
}

async fn postgres_commits_in(
    plan: &Plan,
    url: &str,
    coord_schema: &str,
    raw_schema: &str,
    admin: &mut PgConnection,
) -> Result<Vec<Row>, String> {
    let coordinator = pg_coordinator(url, coord_schema).await?;
    let topic = create_topic(&coordinator, "scale", PARTITIONS as i32).await;
    let raw_topic = create_topic(&coordinator, "scale-raw", PARTITIONS as i32).await;
    let mut raw = PgRaw::plain(admin, raw_schema, PARTITIONS)
        .await
        .map_err(|e| format!("raw schema: {e}"))?;
    let mut raw_same = PgRaw::coordinator(admin, coord_schema, raw_topic)
        .await
        .map_err(|e| format!("raw rows in the coordinator's tables: {e}"))?;
    let mut plain_load = Load::new(topic, PARTITIONS, "plain");
    let mut idem_load = Load::new(topic, PARTITIONS, "idempotent");
    let mut rows = Vec::new();
    for (n, rounds, per_round) in [
        (100, plan.rounds, plan.per_round),
        (FAN_OUT, plan.fan_rounds, plan.fan_per_round),
    ] {
        // Warm-up: statements prepared, plans cached, every producer known.
        for _ in 0..(PARTITIONS / n).max(2) {
            timed_commit(&coordinator, plain_load.round_robin(n, false)).await;
            timed_commit(&coordinator, idem_load.round_robin(n, true)).await;
            raw.file(admin, n).await.map_err(|e| format!("raw: {e}"))?;
            raw_same
                .file(admin, n)
                .await
                .map_err(|e| format!("raw: {e}"))?;
        }
        // Interleaved rounds: the machine may be shared, every variant sees the same conditions.
        let mut s = Series::default();
        for _ in 0..rounds {
            for _ in 0..per_round {
                s.plain
                    .push(timed_commit(&coordinator, plain_load.round_robin(n, false)).await);
            }
            for _ in 0..per_round {
                s.idempotent
                    .push(timed_commit(&coordinator, idem_load.round_robin(n, true)).await);
            }
            for _ in 0..per_round {
                s.raw
                    .push(raw.file(admin, n).await.map_err(|e| format!("raw: {e}"))?);
            }
            for _ in 0..per_round {
                s.raw_same_table.push(
                    raw_same
                        .file(admin, n)
                        .await
                        .map_err(|e| format!("raw: {e}"))?,
                );
            }
        }
        rows.extend(series_rows("PostgreSQL", n, &mut s, n == 100));
    }
    coordinator.close().await;
    Ok(rows)
}

/// The rows of one commit size: plain and idempotent commits against the raw transaction, and the
/// raw transaction into the coordinator's own table. `targeted`: the 1.5x target applies.
fn series_rows(store: &str, n: usize, s: &mut Series, targeted: bool) -> Vec<Row> {
    let (raw50, raw99) = p50_p99(&mut s.raw);
    let (same50, same99) = p50_p99(&mut s.raw_same_table);
    let raw_what = if store == "PostgreSQL" {
        "figure 3's table: primary key, 1 foreign key"
    } else {
        "figure 2's: the coordinator's schema"
    };
    let mut rows = Vec::new();
    let mut same_ratios = Vec::new();
    for (kind, v) in [
        ("no producer ids", &mut s.plain),
        ("idempotent, one producer per partition", &mut s.idempotent),
    ] {
        let (p50, p99) = p50_p99(v);
        let r = ratio(p50, raw50);
        same_ratios.push(ratio(p50, same50));
        let row = Row::new(
            FIG,
            format!(
                "{store} commit p50 / p99, {n} batches over {PARTITIONS} partitions, {kind} \
                 ({} samples)",
                v.len()
            ),
            format!("{} / {}", ms(p50), ms(p99)),
        )
        .baseline(format!(
            "raw {n}-row multi-row insert transaction ({raw_what}) {} / {}",
            ms(raw50),
            ms(raw99)
        ))
        .ratio(format!("{r:.2}x"))
        .numbers(&[p50.as_secs_f64(), p99.as_secs_f64(), r]);
        rows.push(if targeted {
            row.target(
                format!("p50 <= {TARGET_RATIO}x raw"),
                Status::from_bool(r <= TARGET_RATIO),
            )
        } else {
            row.target("(none)", Status::Info)
        });
    }
    if store == "PostgreSQL" {
        rows.push(
            Row::new(
                FIG,
                format!(
                    "  raw {n}-row transaction into the coordinator's own tables (batches: 3 \
                     indexes and an empty partial one, no foreign keys since migration 9)"
                ),
                format!("{} / {}", ms(same50), ms(same99)),
            )
            .baseline(format!(
                "commit p50 / this p50: {:.2}x without, {:.2}x with producer ids",
                same_ratios[0], same_ratios[1]
            ))
            .ratio(format!("{:.2}x raw", ratio(same50, raw50)))
            .target("(none)", Status::Info)
            .numbers(&[
                same50.as_secs_f64(),
                same99.as_secs_f64(),
                same_ratios[0],
                same_ratios[1],
            ]),
        );
    }
    rows
}

// -------------------------------------------------------------------------------------------------
// SQLite: part 2

/// Part 2 on SQLite: the coordinator on a file (WAL, synchronous=FULL) and figure 2's raw inserts
/// into a second file with the same schema and settings.
async fn sqlite_fan_out(plan: &Plan) -> Vec<Row> {
    let dir = bench_dir();
    let coordinator = match SqliteCoordinator::open(
        dir.path().join("fan-out.db"),
        SqliteOptions::default().with_synchronous(Synchronous::Full),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    let topic = create_topic(&coordinator, "fan-out", PARTITIONS as i32).await;
    let mut raw = SqliteRaw::open(&dir.path().join("raw.db"), PARTITIONS).await;
    let mut plain_load = Load::new(topic, PARTITIONS, "plain");
    let mut idem_load = Load::new(topic, PARTITIONS, "idempotent");
    for _ in 0..2 {
        timed_commit(&coordinator, plain_load.round_robin(FAN_OUT, false)).await;
        timed_commit(&coordinator, idem_load.round_robin(FAN_OUT, true)).await;
        raw.file(FAN_OUT).await;
    }
    let mut s = Series::default();
    for _ in 0..plan.fan_rounds {
        for _ in 0..plan.fan_per_round {
            s.plain
                .push(timed_commit(&coordinator, plain_load.round_robin(FAN_OUT, false)).await);
            s.idempotent
                .push(timed_commit(&coordinator, idem_load.round_robin(FAN_OUT, true)).await);
            s.raw.push(raw.file(FAN_OUT).await);
        }
    }
    coordinator.close().await;
    raw.close().await;
    series_rows("SQLite (FULL sync)", FAN_OUT, &mut s, false)
}

// -------------------------------------------------------------------------------------------------
// Part 3: growth

/// What one store size measured.
struct Stage {
    /// Batches stored when the measurement began (its commits add 110 x 100 more).
    stored: usize,
    commit: Vec<Duration>,
    find_tail: Vec<Duration>,
    find_random: Vec<Duration>,
    fill_s: f64,
}

/// `finds` find_batches calls of each kind, each for one partition that holds batches, with
/// `max_bytes` = one batch (the answer is one batch at every store size): at the partition's last
/// batch (a consumer at the tail), and at a random offset of the partition. Returns (tail, random).
async fn time_finds(
    c: &dyn BatchCoordinator,
    topic: uuid::Uuid,
    filled_partitions: usize,
    finds: usize,
    rng: &mut fastrand::Rng,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut tail, mut random) = (Vec::with_capacity(finds), Vec::with_capacity(finds));
    for k in 0..finds + finds / 10 {
        let partition = TopicIdPartition::new(topic, rng.usize(0..filled_partitions) as i32);
        // Offsets are known only to the coordinator: first ask where the log ends (untimed).
        let probe = FindBatchesRequest {
            partition,
            offset: 0,
            max_bytes: 1,
            isolation: Default::default(),
        };
        let hw = match c.find_batches(&[probe], 1).await {
            Ok(r) => r[0].high_watermark,
            Err(e) => panic!("find_batches: {e}"),
        };
        for (offset, out) in [
            ((hw - 1).max(0), &mut tail),
            (rng.i64(0..hw.max(1)), &mut random),
        ] {
            let request = FindBatchesRequest {
                partition,
                offset,
                max_bytes: BATCH_BYTES,
                isolation: Default::default(),
            };
            let start = Instant::now();
            let r = match c.find_batches(&[request], BATCH_BYTES).await {
                Ok(r) => r,
                Err(e) => panic!("find_batches: {e}"),
            };
            let elapsed = start.elapsed();
            assert!(
                r[0].error.is_ok() && r[0].batches.len() == 1,
                "find_batches of {partition} at {offset}: {:?}",
                r[0]
            );
            // The first tenth warms statements and caches.
            if k >= finds / 10 {
                out.push(elapsed);
            }
        }
    }
    (tail, random)
}

/// The rows of the growth part of one store.
fn growth_rows(store: &str, partitions: usize, small: Stage, large: Stage, how: &str) -> Vec<Row> {
    let (sn, ln) = (count(small.stored), count(large.stored));
    let mut rows = Vec::new();
    for (what, mut a, mut b) in [
        (
            "commit of 100 batches to random partitions",
            small.commit,
            large.commit,
        ),
        (
            "find_batches of one batch at a random partition's last batch (a consumer at the tail)",
            small.find_tail,
            large.find_tail,
        ),
        (
            "find_batches of one batch at a random offset of a random partition",
            small.find_random,
            large.find_random,
        ),
    ] {
        rows.push(scaling_row(
            FIG,
            format!(
                "{store} {what}, {ln} stored batches over {} partitions",
                count(partitions)
            ),
            (small.stored, &mut a),
            (large.stored, &mut b),
            "flat",
        ));
    }
    rows.push(
        Row::new(
            FIG,
            format!("  {store} fill to {ln} batches ({how})"),
            format!("{:.1} s", large.fill_s),
        )
        .baseline(format!("{sn}: {:.1} s", small.fill_s))
        .target("(none)", Status::Info)
        .numbers(&[large.fill_s, small.fill_s]),
    );
    rows
}

/// Batches per commit while filling.
const FILL_PER_COMMIT: usize = 10_000;

/// Growth on SQLite: a file, filled by `commit_file` with synchronous=OFF (setup), measured with
/// synchronous=FULL (as deployed), reopened between the two.
async fn sqlite_growth(plan: &Plan) -> Vec<Row> {
    let dir = bench_dir();
    let path = dir.path().join("growth.db");
    let open = async |sync: Synchronous| match SqliteCoordinator::open(
        &path,
        SqliteOptions::default().with_synchronous(sync),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    let partitions = plan.growth_partitions;
    let c = open(Synchronous::Off).await;
    let topic = create_topic(&c, "growth", partitions as i32).await;
    c.close().await;
    let mut fill = Load::new(topic, partitions, "fill");
    let mut load = Load::new(topic, partitions, "measure");
    let mut rng = fastrand::Rng::with_seed(10);
    let mut stages = Vec::new();
    let mut stored = 0usize;
    for target in [plan.small, plan.sqlite_large] {
        let c = open(Synchronous::Off).await;
        let start = Instant::now();
        while stored < target {
            let n = FILL_PER_COMMIT.min(target - stored);
            timed_commit(&c, fill.round_robin(n, false)).await;
            stored += n;
        }
        let fill_s = start.elapsed().as_secs_f64();
        c.close().await;
        let c = open(Synchronous::Full).await;
        let mut commit = Vec::with_capacity(plan.commits);
        for k in 0..plan.commits + plan.commits / 10 {
            let d = timed_commit(&c, load.random(100, &mut rng)).await;
            if k >= plan.commits / 10 {
                commit.push(d);
            }
        }
        let (find_tail, find_random) =
            time_finds(&c, topic, partitions.min(target), plan.finds, &mut rng).await;
        c.close().await;
        stages.push(Stage {
            stored: target,
            commit,
            find_tail,
            find_random,
            fill_s,
        });
        stored += (plan.commits + plan.commits / 10) * 100;
    }
    let large = stages.pop();
    let small = stages.pop();
    match (small, large) {
        (Some(s), Some(l)) => growth_rows(
            "SQLite (FULL sync)",
            partitions,
            s,
            l,
            &format!("commit_file, {FILL_PER_COMMIT} batches per commit, synchronous=OFF"),
        ),
        _ => Vec::new(),
    }
}

/// Growth on PostgreSQL: the small store is filled by `commit_file`, the large one by one
/// server-side INSERT ... SELECT of rows shaped exactly as `commit_file` writes them (objects of
/// 1,000 batches, each partition's batches contiguous, the partitions' bounds, bytes and running
/// max set; foreign-key triggers off for the load when the role may do so), then ANALYZE, as
/// autovacuum would run on a server that has it on.
async fn postgres_growth(plan: &Plan) -> Vec<Row> {
    let url = pg_url();
    let mut admin = match pg_connect(&url).await {
        Ok(c) => c,
        Err(e) => return vec![Row::not_measured(FIG, "PostgreSQL growth", e)],
    };
    let schema = fresh_schema("growth");
    let rows = match postgres_growth_in(plan, &url, &schema, &mut admin).await {
        Ok(rows) => rows,
        Err(e) => vec![Row::not_measured(FIG, "PostgreSQL growth", e)],
    };
    drop_schemas(&mut admin, &[&schema]).await;
    let _ = admin.close().await;
    rows
}

async fn postgres_growth_in(
    plan: &Plan,
    url: &str,
    schema: &str,
    admin: &mut PgConnection,
) -> Result<Vec<Row>, String> {
    let c = pg_coordinator(url, schema).await?;
    let partitions = plan.growth_partitions;
    let topic = create_topic(&c, "growth", partitions as i32).await;
    let mut fill = Load::new(topic, partitions, "fill");
    let mut load = Load::new(topic, partitions, "measure");
    let mut rng = fastrand::Rng::with_seed(10);
    let sql = |s: String| AssertSqlSafe(s);
    let exec = async |admin: &mut PgConnection, s: String| {
        sqlx::query(sql(s))
            .execute(&mut *admin)
            .await
            .map(|_| ())
            .map_err(|e| format!("fill: {e}"))
    };
    // The small store: commit_file, round-robin from partition 0.
    let start = Instant::now();
    let mut stored = 0usize;
    while stored < plan.small {
        let n = FILL_PER_COMMIT.min(plan.small - stored).min(1000);
        timed_commit(&c, fill.round_robin(n, false)).await;
        stored += n;
    }
    let small_fill_s = start.elapsed().as_secs_f64();
    exec(
        admin,
        format!("ANALYZE {schema}.batches, {schema}.partitions, {schema}.objects"),
    )
    .await?;
    let mut stages = Vec::new();
    let measure = async |c: &PostgresCoordinator,
                         load: &mut Load,
                         rng: &mut fastrand::Rng,
                         stored: usize,
                         fill_s: f64| {
        let mut commit = Vec::with_capacity(plan.commits);
        for k in 0..plan.commits + plan.commits / 10 {
            let d = timed_commit(c, load.random(100, rng)).await;
            if k >= plan.commits / 10 {
                commit.push(d);
            }
        }
        let (find_tail, find_random) =
            time_finds(c, topic, partitions.min(stored), plan.finds, rng).await;
        Stage {
            stored,
            commit,
            find_tail,
            find_random,
            fill_s,
        }
    };
    stages.push(measure(&c, &mut load, &mut rng, stored, small_fill_s).await);
    // The large store: batches `stored..large` of the same round-robin, continuing every
    // partition's offsets from its high watermark (the measured commits moved some: offsets are
    // taken from the partitions' rows).
    let large = plan.postgres_large;
    let start = Instant::now();
    let _ = exec(admin, "SET session_replication_role = replica".to_string()).await;
    let per_object = 1000usize;
    let records = i64::from(BATCH_RECORDS);
    let bytes = i64::from(BATCH_BYTES);
    let ts = now_ms();
    let topic_text = topic.hyphenated().to_string();
    let mut from = stored;
    while from < large {
        // Chunks of 1M rows: one statement each, so a failure is reported early.
        let to = (from + 1_000_000).min(large);
        let objects_from = from / per_object;
        let objects_to = to.div_ceil(per_object);
        exec(
            admin,
            format!(
                "INSERT INTO {schema}.objects (object_key, uploader_broker_id, object_size, \
                 live_bytes, owners, committed_at) SELECT 'fill/' || o, 1, {per_object} * \
                 {bytes} + 1, {per_object} * {bytes}, '{{0}}', {ts} FROM \
                 generate_series({objects_from}, {objects_to} - 1) AS o"
            ),
        )
        .await?;
        exec(
            admin,
            format!(
                "WITH pa AS MATERIALIZED (SELECT partition, partition_id, high_watermark FROM \
                 {schema}.partitions WHERE topic_id = '{topic_text}'::uuid), \
                 ob AS MATERIALIZED (SELECT object_id, substr(object_key, 6)::bigint AS o FROM \
                 {schema}.objects WHERE object_key LIKE 'fill/%' AND substr(object_key, 6)::bigint \
                 BETWEEN {objects_from} AND {objects_to} - 1) \
                 INSERT INTO {schema}.batches (partition_id, last_offset, base_offset, object_id, \
                 byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, \
                 log_append_time, producer_id, producer_epoch, base_sequence, last_sequence, \
                 max_timestamp_so_far) \
                 SELECT pa.partition_id, pa.high_watermark + ((g - {from}) / {partitions}) * \
                 {records} + {records} - 1, pa.high_watermark + ((g - {from}) / {partitions}) * \
                 {records}, ob.object_id, 1 + (g % {per_object}) * {bytes}, {bytes}, {ts}, \
                 {ts} + 5, 0, -1, -1, -1, -1, -1, {ts} + 5 \
                 FROM generate_series({from}, {to} - 1) AS g \
                 JOIN pa ON pa.partition = (g % {partitions})::integer \
                 JOIN ob ON ob.o = g / {per_object}"
            ),
        )
        .await?;
        // Each partition's bounds: the batches just added.
        exec(
            admin,
            format!(
                "UPDATE {schema}.partitions pa SET high_watermark = pa.high_watermark + c.n * \
                 {records}, byte_size = pa.byte_size + c.n * {bytes}, max_timestamp = \
                 greatest(pa.max_timestamp, {ts} + 5) FROM (SELECT (g % {partitions})::integer \
                 AS p, count(*) AS n FROM generate_series({from}, {to} - 1) AS g GROUP BY 1) c \
                 WHERE pa.topic_id = '{topic_text}'::uuid AND pa.partition = c.p"
            ),
        )
        .await?;
        from = to;
    }
    let _ = exec(admin, "SET session_replication_role = origin".to_string()).await;
    exec(
        admin,
        format!("ANALYZE {schema}.batches, {schema}.partitions, {schema}.objects"),
    )
    .await?;
    let large_fill_s = start.elapsed().as_secs_f64();
    stages.push(measure(&c, &mut load, &mut rng, large, large_fill_s).await);
    c.close().await;
    let l = stages.pop();
    let s = stages.pop();
    match (s, l) {
        (Some(s), Some(l)) => Ok(growth_rows(
            "PostgreSQL",
            partitions,
            s,
            l,
            "small: commit_file; large: INSERT ... SELECT of commit_file's rows, then ANALYZE",
        )),
        _ => Ok(Vec::new()),
    }
}
