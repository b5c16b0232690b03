//! Figure 9: ListOffsets by timestamp on the SQLite coordinator, on a partition of 1,000,000 batches
//! vs one of 10,000, same run (issue 12, item 10). A lookup is a bounded number of index probes
//! (running max timestamp index; MAX_TIMESTAMP: timestamp index), so its time barely depends on the
//! partition's size: the 1M/10k ratio is near 1, where a scan of the partition's batches (the query
//! before the index, measured on the same database as a baseline) grows with the size, ~100x.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, ListOffsetsRequest, MAX_TIMESTAMP,
    SystemClock, TopicIdPartition,
};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::report::{Row, Status, count, scaling_row, us};
use crate::util::{bench_dir, create_topic, percentile, plain_batch, runtime};

/// Batches per commit while filling a partition.
const FILL_BATCHES_PER_COMMIT: usize = 10_000;
/// Byte size of every batch.
const BATCH_BYTES: u32 = 1024;
/// The first batch's timestamp; batch i has about `T0 + 10 i` (plus up to 40 ms of jitter, so that
/// timestamps are not monotonic).
const T0: i64 = 1_700_000_000_000;

/// (small, large) partition sizes in batches, and lookups measured per query kind.
fn plan(quick: bool) -> (usize, usize, usize) {
    if quick {
        (1_000, 10_000, 200)
    } else {
        (10_000, 1_000_000, 2_000)
    }
}

/// One filled partition and what was measured on it.
struct Measured {
    /// Time lookups with random targets.
    by_time: Vec<Duration>,
    /// MAX_TIMESTAMP lookups.
    max_ts: Vec<Duration>,
    /// The pre-index query (a scan from the partition's first batch) with random targets.
    scan: Vec<Duration>,
    /// Seconds to fill the partition.
    fill_s: f64,
}

/// Runs figure 9.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let (small, large, lookups) = plan(quick);
    let rt = runtime();
    rt.block_on(async {
        let s = measure(small, lookups, lookups / 10).await;
        let l = measure(large, lookups, (lookups / 100).max(10)).await;
        let (sn, ln) = (count(small), count(large));
        let mut rows = Vec::new();
        for (what, mut a, mut b) in [
            ("random timestamps", s.by_time, l.by_time),
            ("MAX_TIMESTAMP", s.max_ts, l.max_ts),
        ] {
            rows.push(scaling_row(
                9,
                format!("SQLite ListOffsets by timestamp ({what}), 1 partition of {ln} batches"),
                (small, &mut a),
                (large, &mut b),
                "bounded probes",
            ));
        }
        let (mut a, mut b) = (s.scan, l.scan);
        let (a50, b50) = (percentile(&mut a, 0.5), percentile(&mut b, 0.5));
        let ratio = b50.as_secs_f64() / a50.as_secs_f64();
        rows.push(
            Row::new(
                9,
                format!("baseline: the scan query before the index, {ln} batches"),
                format!("{ln}: p50 {}", us(b50)),
            )
            .baseline(format!("{sn} batches: p50 {}", us(a50)))
            .ratio(format!("{ratio:.1}x"))
            .target("(none)", Status::Info)
            .numbers(&[b50.as_secs_f64(), a50.as_secs_f64(), ratio]),
        );
        rows.push(
            Row::new(
                9,
                format!("fill: {ln} batches by commit_file, {FILL_BATCHES_PER_COMMIT} per commit"),
                format!("{:.2} s", l.fill_s),
            )
            .baseline(format!("{sn}: {:.2} s", s.fill_s))
            .target("(none)", Status::Info)
            .numbers(&[l.fill_s, s.fill_s]),
        );
        rows
    })
}

/// Fills one partition with `n` batches (synchronous OFF: the fill is setup, not measured) and times
/// `lookups` lookups of each kind, and `scans` runs of the pre-index query.
async fn measure(n: usize, lookups: usize, scans: usize) -> Measured {
    let dir = bench_dir();
    let path = dir.path().join("lookup.db");
    let coordinator = match SqliteCoordinator::open(
        &path,
        SqliteOptions::default().with_synchronous(Synchronous::Off),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    let topic = create_topic(&coordinator, "lookup", 1).await;
    let partition = TopicIdPartition::new(topic, 0);
    let mut rng = fastrand::Rng::with_seed(9);
    let start = Instant::now();
    let mut i = 0usize;
    let mut file = 0;
    while i < n {
        let count = FILL_BATCHES_PER_COMMIT.min(n - i);
        let batches: Vec<CommitBatch> = (0..count)
            .map(|j| {
                let ts = T0 + 10 * (i + j) as i64 + rng.i64(0..40);
                plain_batch(
                    partition,
                    1 + j as u64 * u64::from(BATCH_BYTES),
                    BATCH_BYTES,
                    1,
                    ts - 5,
                    ts,
                )
            })
            .collect();
        let request = CommitFileRequest {
            object_key: format!("lookup/{file:06}"),
            uploader_broker_id: 1,
            object_size: 1 + count as u64 * u64::from(BATCH_BYTES),
            owners: vec![0],
            batches,
        };
        match coordinator.commit_file(request).await {
            Ok(r) => assert!(r.iter().all(|r| r.error.is_ok())),
            Err(e) => panic!("commit: {e}"),
        }
        i += count;
        file += 1;
    }
    let fill_s = start.elapsed().as_secs_f64();
    let last_ts = T0 + 10 * n as i64;

    let lookup = async |timestamp: i64| -> Duration {
        let start = Instant::now();
        let r = match coordinator
            .list_offsets(&[ListOffsetsRequest {
                partition,
                timestamp,
                isolation: Default::default(),
            }])
            .await
        {
            Ok(r) => r,
            Err(e) => panic!("list_offsets: {e}"),
        };
        let elapsed = start.elapsed();
        // Every target lies within the partition: an answer exists and reaches it.
        assert!(r[0].error.is_ok() && r[0].offset >= 0 && r[0].timestamp >= timestamp.max(0));
        elapsed
    };
    // Warm-up: statements prepared, read connections open, pages cached as a running broker's are.
    for _ in 0..lookups / 10 {
        lookup(rng.i64(T0..last_ts)).await;
        lookup(MAX_TIMESTAMP).await;
    }
    let mut by_time = Vec::with_capacity(lookups);
    let mut max_ts = Vec::with_capacity(lookups);
    for _ in 0..lookups {
        by_time.push(lookup(rng.i64(T0..last_ts)).await);
        max_ts.push(lookup(MAX_TIMESTAMP).await);
    }
    coordinator.close().await;

    // The query before the index, on the same database: the first batch in offset order whose
    // effective max timestamp reaches the target, filtered along the primary key.
    let mut conn = match SqliteConnectOptions::new()
        .filename(&path)
        .read_only(true)
        .connect()
        .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    const SCAN: &str = "SELECT base_offset, \
         CASE WHEN timestamp_type = 1 THEN log_append_time ELSE max_timestamp END AS ts \
         FROM batches WHERE partition_id = ?1 \
         AND CASE WHEN timestamp_type = 1 THEN log_append_time ELSE max_timestamp END >= ?2 \
         ORDER BY last_offset LIMIT 1";
    let partition_id: i64 = match sqlx::query_scalar("SELECT partition_id FROM partitions")
        .fetch_one(&mut conn)
        .await
    {
        Ok(id) => id,
        Err(e) => panic!("partition id: {e}"),
    };
    let mut scan = Vec::with_capacity(scans);
    for k in 0..scans + 2 {
        let target = rng.i64(T0..last_ts);
        let start = Instant::now();
        if let Err(e) = sqlx::query(SCAN)
            .bind(partition_id)
            .bind(target)
            .fetch_optional(&mut conn)
            .await
        {
            panic!("scan: {e}");
        }
        // The first two warm the statement and the cache.
        if k >= 2 {
            scan.push(start.elapsed());
        }
    }
    let _ = conn.close().await;
    Measured {
        by_time,
        max_ts,
        scan,
        fill_s,
    }
}
