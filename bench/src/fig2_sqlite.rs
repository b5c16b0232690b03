//! Figure 2: SQLite coordinator commit throughput (durable: WAL, synchronous=FULL, on disk) vs raw
//! batched SQLite inserts of the same rows with the same settings.

use std::sync::Arc;
use std::time::Instant;

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
    NO_SEQUENCE, SystemClock, TimestampType, TopicIdPartition,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::report::{Row, Status, pct, per_s};
use crate::util::{create_topic, now_ms, runtime};

/// Partitions the batches are spread over.
pub const PARTITIONS: usize = 1000;
/// Byte size of every committed batch.
pub const BATCH_BYTES: u32 = 16 << 10;
/// Records per batch.
pub const BATCH_RECORDS: i32 = 32;

/// (batches per file, files committed) for the full and the quick run.
pub fn plan(quick: bool) -> Vec<(usize, usize)> {
    if quick {
        vec![(1, 10), (100, 4), (1000, 2)]
    } else {
        vec![(1, 2000), (100, 500), (1000, 60)]
    }
}

/// A commit request of `n` batches, round-robin over the partitions from `*next`.
pub fn commit_request(
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
            CommitBatch {
                partition: TopicIdPartition::new(topic, partition),
                byte_offset: 1 + i as u64 * u64::from(BATCH_BYTES),
                byte_size: BATCH_BYTES,
                record_count: BATCH_RECORDS,
                base_timestamp: ts,
                max_timestamp: ts + 5,
                timestamp_type: TimestampType::CreateTime,
                producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                base_sequence: NO_SEQUENCE,
                last_sequence: NO_SEQUENCE,
            }
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

/// Runs figure 2.
pub fn run(quick: bool) -> Vec<Row> {
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
            let mut row = Row::new(
                2,
                format!("SQLite commit, {n} batches/file, {PARTITIONS} partitions, FULL sync"),
                format!(
                    "{}, {}",
                    per_s(coordinator * n as f64, "batches"),
                    per_s(coordinator, "commits")
                ),
            )
            .baseline(format!(
                "raw inserts {}, {}",
                per_s(raw * n as f64, "batches"),
                per_s(raw, "commits")
            ))
            .ratio(pct(ratio))
            .numbers(&[coordinator, raw, ratio]);
            row = if n == 100 {
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

/// A temporary directory on the same disk as the workspace (not a tmpfs), so that fsync costs
/// what it costs.
pub fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("DISKLESS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let _ = std::fs::create_dir_all(&base);
    match tempfile::Builder::new().prefix("bench-").tempdir_in(&base) {
        Ok(d) => d,
        Err(_) => match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("no temporary directory: {e}"),
        },
    }
}

/// Files/s of raw batched inserts of the same rows into the same schema, same settings: per file one
/// `BEGIN IMMEDIATE`, the object row, the batch rows in multi-row INSERTs of up to 500 rows, COMMIT.
async fn raw_rate(n: usize, files: usize) -> f64 {
    let dir = bench_dir();
    let mut conn = match SqliteConnectOptions::new()
        .filename(dir.path().join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .connect()
        .await
    {
        Ok(c) => c,
        Err(e) => panic!("opening SQLite: {e}"),
    };
    if let Err(e) = diskless_coordinator::sqlite::migrator()
        .run(&mut conn)
        .await
    {
        panic!("schema: {e}");
    }
    let topic = uuid::Uuid::new_v4().hyphenated().to_string();
    exec(
        &mut conn,
        &format!(
            "INSERT INTO topics (topic_id, name, partition_count, timestamp_type, retention_ms, \
             retention_bytes, max_message_bytes, message_timestamp_before_max_ms, \
             message_timestamp_after_max_ms) VALUES ('{topic}', 'bench', {PARTITIONS}, 0, -1, -1, \
             1048588, 9223372036854775807, 3600000)"
        ),
    )
    .await;
    exec(
        &mut conn,
        &format!(
            "WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < \
             {PARTITIONS}) INSERT INTO partitions (partition_id, topic_id, partition, \
             log_start_offset, high_watermark, byte_size) SELECT n + 1, '{topic}', n, 0, 0, 0 FROM seq"
        ),
    )
    .await;
    let ts = now_ms();
    let mut hw = vec![0i64; PARTITIONS];
    let mut next = 0usize;
    // (partition_id, base_offset, byte_offset) of the next file's rows.
    let mut one = || -> Vec<(i64, i64, i64)> {
        (0..n)
            .map(|i| {
                let p = next % PARTITIONS;
                next += 1;
                let base = hw[p];
                hw[p] += i64::from(BATCH_RECORDS);
                (p as i64 + 1, base, 1 + i as i64 * i64::from(BATCH_BYTES))
            })
            .collect()
    };
    let warm = one();
    raw_file(&mut conn, "wal/warm".into(), n, ts, warm).await;
    let plans: Vec<Vec<(i64, i64, i64)>> = (0..files).map(|_| one()).collect();
    let start = Instant::now();
    for (f, rows) in plans.into_iter().enumerate() {
        raw_file(&mut conn, format!("wal/{f:08}"), n, ts, rows).await;
    }
    let rate = files as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close().await;
    rate
}

/// One file's raw transaction.
async fn raw_file(
    conn: &mut sqlx::SqliteConnection,
    key: String,
    n: usize,
    ts: i64,
    rows: Vec<(i64, i64, i64)>,
) {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(t) => t,
        Err(e) => panic!("begin: {e}"),
    };
    let object_id: i64 = match sqlx::query_scalar(
        "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
         committed_at, marked_for_deletion_at) VALUES (?1, 1, ?2, ?2, '0', ?3, NULL) \
         RETURNING object_id",
    )
    .bind(key)
    .bind(1 + n as i64 * i64::from(BATCH_BYTES))
    .bind(ts)
    .fetch_one(&mut *tx)
    .await
    {
        Ok(id) => id,
        Err(e) => panic!("object insert: {e}"),
    };
    for part in rows.chunks(500) {
        let row = format!("({})", vec!["?"; 14].join(","));
        let sql = format!(
            "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset, \
             byte_size, base_timestamp, max_timestamp, timestamp_type, log_append_time, \
             producer_id, producer_epoch, base_sequence, last_sequence) VALUES {}",
            vec![row; part.len()].join(",")
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (pid, base, off) in part {
            q = q
                .bind(*pid)
                .bind(base + i64::from(BATCH_RECORDS) - 1)
                .bind(*base)
                .bind(object_id)
                .bind(*off)
                .bind(i64::from(BATCH_BYTES))
                .bind(ts)
                .bind(ts + 5)
                .bind(0i64)
                .bind(-1i64)
                .bind(-1i64)
                .bind(-1i64)
                .bind(-1i64)
                .bind(-1i64);
        }
        if let Err(e) = q.execute(&mut *tx).await {
            panic!("batch insert: {e}");
        }
    }
    if let Err(e) = tx.commit().await {
        panic!("commit: {e}");
    }
}

async fn exec(conn: &mut sqlx::SqliteConnection, sql: &str) {
    if let Err(e) = sqlx::query(AssertSqlSafe(sql.to_string()))
        .execute(&mut *conn)
        .await
    {
        panic!("{sql}: {e}");
    }
}
