//! Figure 2: SQLite coordinator commit throughput (durable: WAL, synchronous=FULL, on disk) vs raw
//! batched SQLite inserts of the same rows with the same settings.

use std::sync::Arc;
use std::time::Instant;

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{BatchCoordinator, CommitFileRequest, SystemClock, TopicIdPartition};

use crate::raw::{RawFile, SqliteRaw};
use crate::report::{Row, Status, pct, per_s};
use crate::util::{bench_dir, create_topic, now_ms, plain_batch, runtime};

/// Partitions the batches are spread over.
pub(crate) const PARTITIONS: usize = 1000;
/// Byte size of every committed batch.
pub(crate) const BATCH_BYTES: u32 = 16 << 10;
/// Records per batch.
pub(crate) const BATCH_RECORDS: i32 = 32;

/// (batches per file, files committed) for the full and the quick run.
pub(crate) fn plan(quick: bool) -> Vec<(usize, usize)> {
    if quick {
        vec![(1, 10), (100, 4), (1000, 2)]
    } else {
        vec![(1, 2000), (100, 500), (1000, 60)]
    }
}

/// A commit request of `n` batches, round-robin over the partitions from `*next`.
pub(crate) fn commit_request(
    topic: uuid::Uuid,
    key: String,
    n: usize,
    next: &mut usize,
    ts: i64,
) -> CommitFileRequest {
    let batches = (0..n)
        .map(|i| {
            let partition = (*next % PARTITIONS) as i32;
            *next += 1;
            plain_batch(
                TopicIdPartition::new(topic, partition),
                1 + i as u64 * u64::from(BATCH_BYTES),
                BATCH_BYTES,
                BATCH_RECORDS,
                ts,
                ts + 5,
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

/// The row of a commit throughput (`rate` files/s of `n` batches) next to raw inserts of the same
/// rows (`raw` files/s), without a target.
pub(crate) fn commit_rate_row(figure: u8, what: String, n: usize, rate: f64, raw: f64) -> Row {
    let ratio = rate / raw;
    Row::new(
        figure,
        what,
        format!(
            "{}, {}",
            per_s(rate * n as f64, "batches"),
            per_s(rate, "commits")
        ),
    )
    .baseline(format!(
        "raw inserts {}, {}",
        per_s(raw * n as f64, "batches"),
        per_s(raw, "commits")
    ))
    .ratio(pct(ratio))
    .numbers(&[rate, raw, ratio])
}

/// Runs figure 2.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let rt = runtime();
    rt.block_on(async {
        let mut rows = Vec::new();
        for (n, files) in plan(quick) {
            // Interleaved repetitions, best of each: the machine and its disk may be shared.
            let (mut coordinator, mut raw) = (0f64, 0f64);
            for _ in 0..if quick { 1 } else { 3 } {
                coordinator = coordinator.max(coordinator_rate(n, files).await);
                raw = raw.max(raw_rate(n, files).await);
            }
            let ratio = coordinator / raw;
            let row = commit_rate_row(
                2,
                format!("SQLite commit, {n} batches/file, {PARTITIONS} partitions, FULL sync"),
                n,
                coordinator,
                raw,
            );
            let row = if n == 100 {
                row.target(">= 50% of raw", Status::from_bool(ratio >= 0.5))
            } else {
                row.target("(none)", Status::Info)
            };
            rows.push(row);
        }
        rows
    })
}

/// Files/s committed through `SqliteCoordinator` on a fresh database file.
async fn coordinator_rate(n: usize, files: usize) -> f64 {
    let dir = bench_dir();
    let options = SqliteOptions::default().with_synchronous(Synchronous::Full);
    let coordinator = match SqliteCoordinator::open(
        dir.path().join("c.db"),
        options,
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    let topic = create_topic(&coordinator, "bench", PARTITIONS as i32).await;
    let ts = now_ms();
    let mut next = 0usize;
    // One warm-up commit (prepares the statements).
    let warm = commit_request(topic, "wal/warm".into(), n, &mut next, ts);
    if let Err(e) = coordinator.commit_file(warm).await {
        panic!("commit: {e}");
    }
    let requests: Vec<CommitFileRequest> = (0..files)
        .map(|f| commit_request(topic, format!("wal/{f:08}"), n, &mut next, ts))
        .collect();
    let start = Instant::now();
    for r in requests {
        match coordinator.commit_file(r).await {
            Ok(results) => assert!(results.iter().all(|r| r.error.is_ok())),
            Err(e) => panic!("commit: {e}"),
        }
    }
    let rate = files as f64 / start.elapsed().as_secs_f64();
    coordinator.close().await;
    rate
}

/// Files/s of raw batched inserts of the same rows into the same schema, same settings
/// ([`SqliteRaw`]).
async fn raw_rate(n: usize, files: usize) -> f64 {
    let dir = bench_dir();
    let mut raw = SqliteRaw::open(&dir.path().join("raw.db"), PARTITIONS).await;
    // One warm-up file (prepares the statements).
    raw.file(n).await;
    let plans: Vec<RawFile> = (0..files).map(|_| raw.plan(n)).collect();
    let start = Instant::now();
    for file in &plans {
        raw.write(file).await;
    }
    let rate = files as f64 / start.elapsed().as_secs_f64();
    raw.close().await;
    rate
}
