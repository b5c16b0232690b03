//! Figure 12: bounded state with tiered consolidation (issue #15, docs/tiered-consolidation.md §4).
//!
//! A long simulated run with infinite retention: 16 partitions, one produce request every
//! [`Plan::step_ms`] of simulated time holding one batch per partition (one WAL object each, since
//! the writer is flushed after each request), through a `WalWriter` into a `SqliteCoordinator` on a
//! file (`synchronous=NORMAL`: the figure is about state, not commit latency). Every 30 simulated
//! seconds the `TieringWorker` (default settings: min age 2 min) and the `ObjectCleaner` (grace
//! 60 s) each run one pass; the topic has `segment.ms` 10 min and `segment.bytes` 1 MiB. Every
//! 10 simulated minutes the SQLite file is read through a second connection: WAL batch rows, live
//! WAL object rows, segment rows, tiered `.log` bytes, plus the WAL objects in storage. The baseline
//! is the same production with tiering off, in the same run: its rows grow linearly.
//!
//! Simulated time is a `ManualClock` advanced by the loop (the coordinator's commit times, the
//! writer's timestamps and object keys, the workers' "now"); the loop itself runs as fast as the
//! machine allows on a real-time runtime, since SQLite's own thread must not let a paused tokio
//! clock jump.

use std::sync::Arc;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, ErrorCode, ManualClock, TopicConfig,
    TopicIdPartition,
};
use diskless_core::lifecycle::{CleanerConfig, ObjectCleaner, TieringConfig, TieringWorker};
use diskless_core::{Fetcher, ProducePartition, WalWriter, WalWriterConfig};
use diskless_storage::{ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, SeededKeys};
use futures::StreamExt;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Row as _};

use crate::report::{Row, Status};
use crate::util::{bench_dir, make_batch, random_uuid, runtime};

const FIG: u8 = 12;
const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
/// Partitions of the topic.
const PARTITIONS: i32 = 16;
/// Lifecycle passes (tiering, cleaner) every this much simulated time.
const PASS_EVERY_MS: i64 = 30_000;
/// A sample of the state every this much simulated time (the tiering run samples every
/// [`FINE_SAMPLE_EVERY_MS`] too, for its maxima: its consolidation cycle is `segment.ms` − min age
/// = 8 minutes, which 10-minute samples would alias).
const SAMPLE_EVERY_MS: i64 = 10 * MINUTE;
/// See [`SAMPLE_EVERY_MS`].
const FINE_SAMPLE_EVERY_MS: i64 = MINUTE;
/// The topic's `segment.ms`.
const SEGMENT_MS: i64 = 10 * MINUTE;
/// The topic's `segment.bytes`.
const SEGMENT_BYTES: i32 = 1 << 20;

/// Sizes of one run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Simulated duration.
    pub hours: i64,
    /// One produce request (one WAL object) every this many simulated ms.
    pub step_ms: i64,
    /// Bytes of each batch (one per partition per request).
    pub batch_bytes: usize,
}

fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            hours: 2,
            step_ms: 60_000,
            batch_bytes: 1 << 10,
        }
    } else {
        Plan {
            hours: 24,
            step_ms: 5_000,
            batch_bytes: 2 << 10,
        }
    }
}

/// One reading of the state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample {
    /// Simulated ms since the start.
    pub at_ms: i64,
    /// Rows of `batches` (WAL batches).
    pub batch_rows: i64,
    /// WAL object rows not marked for deletion.
    pub wal_objects_live: i64,
    /// WAL object rows (marked ones included, until the cleaner confirms their deletion).
    pub wal_object_rows: i64,
    /// WAL objects in storage.
    pub wal_objects_stored: i64,
    /// Rows of `tiered_segments`.
    pub segment_rows: i64,
    /// Their `.log` bytes.
    pub tiered_bytes: i64,
    /// Bytes produced so far.
    pub produced_bytes: i64,
    /// The SQLite file (database + WAL), bytes.
    pub db_bytes: u64,
}

/// Runs figure 12.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let plan = plan(quick);
    let rt = runtime();
    let (off, on) = rt.block_on(async {
        let off = simulate(plan, false).await;
        let on = simulate(plan, true).await;
        (off, on)
    });
    if !quick {
        // The chart of BENCHMARKS.md (bench/figures/fig12_bounded_state.svg is a copy of one).
        let path = bench_dir_base().join("fig12_bounded_state.svg");
        match std::fs::write(&path, svg_chart(&on, &off)) {
            Ok(()) => eprintln!("figure 12: chart written to {}", path.display()),
            Err(e) => eprintln!("figure 12: chart not written to {}: {e}", path.display()),
        }
    }
    rows(plan, &on, &off)
}

/// Where `bench_dir` puts its directories (the chart goes there).
fn bench_dir_base() -> std::path::PathBuf {
    std::env::var_os("DISKLESS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

async fn simulate(plan: Plan, tiering: bool) -> Vec<Sample> {
    let dir = bench_dir();
    let path = dir.path().join("fig12.db");
    let start_ms = crate::util::now_ms();
    let clock = ManualClock::new(start_ms);
    let coordinator = match SqliteCoordinator::open(
        &path,
        SqliteOptions::default().with_synchronous(Synchronous::Normal),
        clock.clone(),
    )
    .await
    {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 12: opening SQLite: {e}"),
    };
    let coordinator_dyn: Arc<dyn BatchCoordinator> = coordinator.clone();
    let config = TopicConfig {
        retention_ms: -1,
        retention_bytes: -1,
        segment_ms: SEGMENT_MS,
        segment_bytes: SEGMENT_BYTES,
        ..TopicConfig::default()
    };
    let topic = random_uuid();
    if let Err(e) = coordinator
        .create_topic(CreateTopicRequest {
            topic_id: topic,
            name: "fig12".into(),
            partitions: PARTITIONS,
            config: config.clone(),
        })
        .await
    {
        panic!("figure 12: creating the topic: {e}");
    }
    let config = Arc::new(config);
    let store = Arc::new(ObjectStoreStorage::in_memory());
    let storage: Arc<dyn ObjectStorage> = store.clone();
    let writer_config = WalWriterConfig::default();
    let wal_prefix = writer_config.object_prefix.clone();
    let writer = match WalWriter::builder(storage.clone(), coordinator_dyn.clone())
        .with_config(writer_config)
        .with_clock(clock.clone())
        .build()
    {
        Ok(w) => w,
        Err(e) => panic!("figure 12: writer: {e}"),
    };
    let cache: Arc<dyn LocalCache> = match MokaCache::new(MokaCacheConfig::default()) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("figure 12: cache: {e}"),
    };
    let fetcher = match Fetcher::builder(storage.clone(), coordinator_dyn.clone())
        .with_cache(cache.clone())
        .build()
    {
        Ok(f) => f,
        Err(e) => panic!("figure 12: fetcher: {e}"),
    };
    let worker = match TieringWorker::new(
        coordinator_dyn.clone(),
        Arc::new(ObjectRemoteStorage::new(storage.clone())),
        fetcher,
        clock.clone(),
        Arc::new(SeededKeys::new(12)),
        1,
        TieringConfig::default(),
    ) {
        Ok(w) => w,
        Err(e) => panic!("figure 12: tiering worker: {e}"),
    };
    let cleaner = match ObjectCleaner::new(
        coordinator_dyn.clone(),
        storage.clone(),
        Some(cache),
        clock.clone(),
        CleanerConfig::default(),
    ) {
        Ok(c) => c,
        Err(e) => panic!("figure 12: cleaner: {e}"),
    };
    // A second connection reads the state (the coordinator's own are private).
    let mut reader = match SqliteConnectOptions::new()
        .filename(&path)
        .read_only(true)
        .connect()
        .await
    {
        Ok(c) => c,
        Err(e) => panic!("figure 12: reading connection: {e}"),
    };

    let end_ms = plan.hours * HOUR;
    let mut samples = Vec::new();
    let mut produced = 0i64;
    let mut seed = 0u64;
    let mut t = 0i64;
    let mut next_pass = PASS_EVERY_MS;
    let sample_every = if tiering {
        FINE_SAMPLE_EVERY_MS
    } else {
        SAMPLE_EVERY_MS
    };
    let mut next_sample = sample_every;
    while t < end_ms {
        let now = clock.now_ms();
        let request: Vec<ProducePartition> = (0..PARTITIONS)
            .map(|p| {
                seed += 1;
                let records = make_batch(plan.batch_bytes, now, seed);
                produced += records.len() as i64;
                ProducePartition {
                    partition: TopicIdPartition::new(topic, p),
                    config: config.clone(),
                    records,
                    txn_seq: None,
                }
            })
            .collect();
        let pending = writer.append(request).await;
        writer.flush().await;
        for answer in pending.await {
            assert_eq!(
                answer.error,
                ErrorCode::None,
                "figure 12: produce {answer:?}"
            );
        }
        t += plan.step_ms;
        clock.advance(plan.step_ms);
        while t >= next_pass {
            if tiering && let Err(e) = worker.run_pass().await {
                panic!("figure 12: tiering pass: {e}");
            }
            if let Err(e) = cleaner.run_pass().await {
                panic!("figure 12: cleaner pass: {e}");
            }
            next_pass += PASS_EVERY_MS;
        }
        if t >= next_sample {
            let mut s = read_state(&mut reader, store.as_ref(), &wal_prefix, &path).await;
            s.at_ms = t;
            s.produced_bytes = produced;
            samples.push(s);
            next_sample += sample_every;
        }
    }
    writer.close().await;
    drop(reader);
    samples
}

async fn read_state(
    reader: &mut sqlx::SqliteConnection,
    store: &ObjectStoreStorage,
    wal_prefix: &str,
    path: &std::path::Path,
) -> Sample {
    let row = match sqlx::query(
        "SELECT (SELECT count(*) FROM batches), \
                (SELECT count(*) FROM objects WHERE kind = 0 AND marked_for_deletion_at IS NULL), \
                (SELECT count(*) FROM objects WHERE kind = 0), \
                (SELECT count(*) FROM tiered_segments), \
                (SELECT coalesce(sum(log_size), 0) FROM tiered_segments)",
    )
    .fetch_one(&mut *reader)
    .await
    {
        Ok(r) => r,
        Err(e) => panic!("figure 12: reading the state: {e}"),
    };
    let get = |i: usize| -> i64 { row.try_get::<i64, _>(i).unwrap_or(-1) };
    let stored = store
        .list(wal_prefix)
        .filter(|m| futures::future::ready(m.is_ok()))
        .count()
        .await as i64;
    let file_len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    Sample {
        at_ms: 0,
        batch_rows: get(0),
        wal_objects_live: get(1),
        wal_object_rows: get(2),
        wal_objects_stored: stored,
        segment_rows: get(3),
        tiered_bytes: get(4),
        produced_bytes: 0,
        db_bytes: file_len(path) + file_len(std::path::Path::new(&wal)),
    }
}

fn mib(b: i64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn hours(ms: i64) -> String {
    let h = ms as f64 / HOUR as f64;
    if (h - h.round()).abs() < 1e-9 {
        format!("{h:.0} h")
    } else {
        format!("{h:.2} h")
    }
}

/// The largest value of `f` among the samples taken in `[from, to)` simulated ms.
fn max_in(samples: &[Sample], from: i64, to: i64, f: impl Fn(&Sample) -> i64) -> i64 {
    samples
        .iter()
        .filter(|s| s.at_ms >= from && s.at_ms < to)
        .map(f)
        .max()
        .unwrap_or(0)
}

fn rows(plan: Plan, on: &[Sample], off: &[Sample]) -> Vec<Row> {
    let mut rows = Vec::new();
    let end = plan.hours * HOUR;
    // One row every `every` of simulated time (and the last sample).
    let every = if plan.hours >= 12 {
        2 * HOUR
    } else {
        30 * MINUTE
    };
    for b in off {
        if b.at_ms % every != 0 && b.at_ms != end {
            continue;
        }
        let Some(s) = on.iter().find(|s| s.at_ms == b.at_ms) else {
            continue;
        };
        rows.push(
            Row::new(
                FIG,
                format!(
                    "t = {}: state with tiering (produced {:.1} MiB)",
                    hours(s.at_ms),
                    mib(s.produced_bytes)
                ),
                format!(
                    "max over the last {}: batch rows {}, live WAL objects {}; now: batch rows {}, live WAL objects {} ({} rows, {} in storage), segments {} ({:.1} MiB tiered), SQLite file {:.1} MiB",
                    hours(every),
                    max_in(on, b.at_ms - every + 1, b.at_ms + 1, |s| s.batch_rows),
                    max_in(on, b.at_ms - every + 1, b.at_ms + 1, |s| s.wal_objects_live),
                    s.batch_rows,
                    s.wal_objects_live,
                    s.wal_object_rows,
                    s.wal_objects_stored,
                    s.segment_rows,
                    mib(s.tiered_bytes),
                    s.db_bytes as f64 / (1u64 << 20) as f64
                ),
            )
            .baseline(format!(
                "tiering off: batch rows {}, live WAL objects {} ({} in storage), SQLite file {:.1} MiB",
                b.batch_rows,
                b.wal_objects_live,
                b.wal_objects_stored,
                b.db_bytes as f64 / (1u64 << 20) as f64
            ))
            .ratio(format!(
                "{:.3}x rows",
                s.batch_rows as f64 / b.batch_rows.max(1) as f64
            ))
            .numbers(&[
                s.batch_rows as f64,
                s.wal_objects_live as f64,
                s.segment_rows as f64,
                s.tiered_bytes as f64,
                b.batch_rows as f64,
                b.wal_objects_live as f64,
            ]),
        );
    }
    // Bounded: the maximum over the second half of the run is no higher than over the first
    // half after the first hour (warm-up: the first segments become due after segment.ms +
    // min_age), while the baseline keeps growing.
    let warm = HOUR.min(end / 4);
    let half = end / 2;
    for (what, f) in [
        (
            "WAL batch rows",
            (|s: &Sample| s.batch_rows) as fn(&Sample) -> i64,
        ),
        ("live WAL objects", |s: &Sample| s.wal_objects_live),
        ("WAL objects in storage", |s: &Sample| s.wal_objects_stored),
    ] {
        let first = max_in(on, warm, half, f);
        let second = max_in(on, half, end + 1, f);
        let base_first = max_in(off, warm, half, f);
        let base_second = max_in(off, half, end + 1, f);
        let growth = second as f64 / first.max(1) as f64;
        let base_growth = base_second as f64 / base_first.max(1) as f64;
        rows.push(
            Row::new(
                FIG,
                format!(
                    "bounded: max {what}, 2nd half / 1st half of the run (after {})",
                    hours(warm)
                ),
                format!("{second} / {first} = {growth:.2}x"),
            )
            .baseline(format!(
                "tiering off: {base_second} / {base_first} = {base_growth:.2}x"
            ))
            .ratio(format!(
                "{:.3}x of baseline at the end",
                f(on.last().unwrap_or(&Sample::default())) as f64
                    / f(off.last().unwrap_or(&Sample::default())).max(1) as f64
            ))
            .target(
                "2nd half <= 1.1x 1st half",
                Status::from_bool(growth <= 1.1),
            )
            .numbers(&[growth, base_growth]),
        );
    }
    if let (Some(s), Some(b)) = (on.last(), off.last()) {
        let tiered_share = s.tiered_bytes as f64 / s.produced_bytes.max(1) as f64;
        rows.push(
            Row::new(
                FIG,
                "  data keeps growing in tiered segments (end of run)",
                format!(
                    "{:.1} MiB in {} segments = {:.1}% of the {:.1} MiB produced",
                    mib(s.tiered_bytes),
                    s.segment_rows,
                    tiered_share * 100.0,
                    mib(s.produced_bytes)
                ),
            )
            .baseline(format!(
                "tiering off: {} batch rows for the same data",
                b.batch_rows
            ))
            .numbers(&[tiered_share]),
        );
    }
    rows
}

/// A panel of the chart: its title and the value it plots.
type Series = (&'static str, fn(&Sample) -> i64);

/// A two-panel SVG line chart (WAL batch rows; WAL objects in storage) of both runs over time.
fn svg_chart(on: &[Sample], off: &[Sample]) -> String {
    use std::fmt::Write as _;
    let (w, h, pad) = (720.0f64, 260.0f64, 50.0f64);
    let t_max = on.last().map_or(1, |s| s.at_ms).max(1) as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">",
        2.0 * h + 20.0
    );
    let panels: [Series; 2] = [
        ("WAL batch rows (coordinator)", |s| s.batch_rows),
        ("WAL objects in storage", |s| s.wal_objects_stored),
    ];
    for (i, (title, f)) in panels.iter().enumerate() {
        let y0 = i as f64 * (h + 10.0);
        let v_max = off.iter().chain(on).map(f).max().unwrap_or(1).max(1) as f64;
        let x = |ms: i64| pad + (ms as f64 / t_max) * (w - 2.0 * pad);
        let y = |v: i64| y0 + h - pad + -(v as f64 / v_max) * (h - 2.0 * pad);
        let _ = writeln!(
            svg,
            "<text x=\"{pad}\" y=\"{}\">{title} (max {v_max:.0})</text>",
            y0 + 20.0
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/>\
             <line x1=\"{pad}\" y1=\"{2}\" x2=\"{pad}\" y2=\"{0}\" stroke=\"black\"/>",
            y0 + h - pad,
            w - pad,
            y0 + pad
        );
        let hours_total = (t_max / HOUR as f64).round() as i64;
        let tick = if hours_total > 12 { 4 } else { 1 };
        for hr in (0..=hours_total).step_by(tick as usize) {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{hr} h</text>",
                x(hr * HOUR),
                y0 + h - pad + 15.0
            );
        }
        for (series, color, label) in [
            (off, "#c0392b", "tiering off"),
            (on, "#2471a3", "tiering on"),
        ] {
            let points: Vec<String> = series
                .iter()
                .map(|s| format!("{:.1},{:.1}", x(s.at_ms), y(f(s))))
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                points.join(" ")
            );
            if let Some(last) = series.last() {
                let _ = writeln!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\" text-anchor=\"end\">{label}: {}</text>",
                    x(last.at_ms),
                    y(f(last)) - 6.0,
                    f(last)
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}
