//! Figure 3: PostgreSQL coordinator commit throughput and latency vs raw inserts on the same server.
//!
//! The server comes from `DISKLESS_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! Everything happens in two fresh schemas dropped at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
use diskless_coordinator::{BatchCoordinator, SystemClock};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::fig2_sqlite::{BATCH_BYTES, BATCH_RECORDS, PARTITIONS, commit_request, plan};
use crate::report::{Row, Status, ms, pct, per_s};
use crate::util::{create_topic, now_ms, percentile, runtime};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Runs figure 3.
pub fn run(quick: bool) -> Vec<Row> {
    let url = std::env::var("DISKLESS_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
    let rt = runtime();
    rt.block_on(async {
        let probe = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await;
        let mut admin = match probe {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return vec![Row::not_measured(
                    3,
                    "PostgreSQL commit",
                    format!("no PostgreSQL at {url}: {e}"),
                )];
            }
            Err(_) => {
                return vec![Row::not_measured(
                    3,
                    "PostgreSQL commit",
                    format!("no PostgreSQL at {url}: timeout"),
                )];
            }
        };
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let coord_schema = format!("diskless_bench_{}", &suffix[..12]);
        let raw_schema = format!("diskless_bench_raw_{}", &suffix[..12]);
        let rows = measure(&url, &coord_schema, &raw_schema, &mut admin, quick).await;
        for s in [&coord_schema, &raw_schema] {
            let _ = sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
                .execute(&mut admin)
                .await;
        }
        let _ = admin.close().await;
        rows
    })
}

async fn measure(
    url: &str,
    coord_schema: &str,
    raw_schema: &str,
    admin: &mut PgConnection,
    quick: bool,
) -> Vec<Row> {
    let settings: String = sqlx::query_scalar(
        "SELECT current_setting('synchronous_commit') || ', fsync=' || current_setting('fsync')",
    )
    .fetch_one(&mut *admin)
    .await
    .unwrap_or_else(|_| "?".into());
    let coordinator = match PostgresCoordinator::connect(
        PostgresOptions::new(url).with_schema(coord_schema),
        Arc::new(SystemClock),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            return vec![Row::not_measured(
                3,
                "PostgreSQL commit",
                format!("coordinator: {e}"),
            )];
        }
    };
    let topic = create_topic(&coordinator, "bench", PARTITIONS as i32).await;
    if let Err(e) = raw_setup(admin, raw_schema).await {
        coordinator.close().await;
        return vec![Row::not_measured(
            3,
            "PostgreSQL commit",
            format!("raw schema: {e}"),
        )];
    }
    // One-row autocommit insert latency.
    let samples = if quick { 20 } else { 500 };
    let mut single = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        if let Err(e) = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {raw_schema}.one_row (id, v) VALUES ($1, $2)"
        )))
        .bind(i as i64)
        .bind(now_ms())
        .execute(&mut *admin)
        .await
        {
            coordinator.close().await;
            return vec![Row::not_measured(
                3,
                "PostgreSQL commit",
                format!("one-row insert: {e}"),
            )];
        }
        single.push(start.elapsed());
    }
    let single_p50 = percentile(&mut single, 0.5);
    let single_p99 = percentile(&mut single, 0.99);

    let ts = now_ms();
    let mut next = 0usize;
    let mut raw_hw = vec![0i64; PARTITIONS];
    let mut raw_next = 0usize;
    let mut rows = Vec::new();
    for (n, files) in plan(quick) {
        let files = files.min(if quick { files } else { 300 });
        // Coordinator: warm-up, then timed commits one after the other.
        let warm = commit_request(topic, format!("wal/warm-{n}"), n, &mut next, ts);
        if let Err(e) = coordinator.commit_file(warm).await {
            rows.push(Row::not_measured(
                3,
                "PostgreSQL commit",
                format!("commit: {e}"),
            ));
            break;
        }
        let requests: Vec<_> = (0..files)
            .map(|f| commit_request(topic, format!("wal/{n}-{f:08}"), n, &mut next, ts))
            .collect();
        let mut latencies = Vec::with_capacity(files);
        let start = Instant::now();
        let mut failed = None;
        for r in requests {
            let t = Instant::now();
            match coordinator.commit_file(r).await {
                Ok(results) if results.iter().all(|r| r.error.is_ok()) => {}
                Ok(_) => failed = Some("a batch was rejected".to_string()),
                Err(e) => failed = Some(e.to_string()),
            }
            latencies.push(t.elapsed());
        }
        let rate = files as f64 / start.elapsed().as_secs_f64();
        if let Some(e) = failed {
            rows.push(Row::not_measured(
                3,
                "PostgreSQL commit",
                format!("commit: {e}"),
            ));
            break;
        }
        // Raw: same rows, one transaction per file.
        let mut raw_plan = |raw_next: &mut usize| -> Vec<(i64, i64, i64)> {
            (0..n)
                .map(|i| {
                    let p = *raw_next % PARTITIONS;
                    *raw_next += 1;
                    let base = raw_hw[p];
                    raw_hw[p] += i64::from(BATCH_RECORDS);
                    (p as i64, base, 1 + i as i64 * i64::from(BATCH_BYTES))
                })
                .collect()
        };
        let warm = raw_plan(&mut raw_next);
        if let Err(e) = raw_file(admin, raw_schema, &format!("wal/warm-{n}"), n, ts, &warm).await {
            rows.push(Row::not_measured(
                3,
                "PostgreSQL raw inserts",
                e.to_string(),
            ));
            break;
        }
        let plans: Vec<_> = (0..files).map(|_| raw_plan(&mut raw_next)).collect();
        let start = Instant::now();
        for (f, p) in plans.iter().enumerate() {
            if let Err(e) = raw_file(admin, raw_schema, &format!("wal/{n}-{f:08}"), n, ts, p).await
            {
                failed = Some(e.to_string());
                break;
            }
        }
        let raw_rate = files as f64 / start.elapsed().as_secs_f64();
        if let Some(e) = failed {
            rows.push(Row::not_measured(3, "PostgreSQL raw inserts", e));
            break;
        }
        let ratio = rate / raw_rate;
        let mut row = Row::new(
            3,
            format!("PostgreSQL commit, {n} batches/file, {PARTITIONS} partitions"),
            format!(
                "{}, {}",
                per_s(rate * n as f64, "batches"),
                per_s(rate, "commits")
            ),
        )
        .baseline(format!(
            "raw inserts {}, {}",
            per_s(raw_rate * n as f64, "batches"),
            per_s(raw_rate, "commits")
        ))
        .ratio(pct(ratio))
        .numbers(&[rate, raw_rate, ratio])
        .target("(none)", Status::Info);
        if n == 100 {
            row = row.target("(throughput: none)", Status::Info);
        }
        rows.push(row);
        // Does the latency drift over the series (table growth, bloat)? p50 of the first and
        // the last tenth of the commits, in commit order.
        let tenth = (latencies.len() / 10).max(1);
        let first_p50 = percentile(&mut latencies[..tenth].to_vec(), 0.5);
        let last_p50 = percentile(&mut latencies[latencies.len() - tenth..].to_vec(), 0.5);
        let p50 = percentile(&mut latencies, 0.5);
        let p99 = percentile(&mut latencies, 0.99);
        let lat_ratio = p50.as_secs_f64() / single_p50.as_secs_f64();
        let mut lat = Row::new(
            3,
            format!("  commit latency p50 / p99, {n} batches/file"),
            format!("{} / {}", ms(p50), ms(p99)),
        )
        .baseline(format!(
            "one-row autocommit insert {} / {}; commit p50 first/last tenth {} / {}",
            ms(single_p50),
            ms(single_p99),
            ms(first_p50),
            ms(last_p50)
        ))
        .ratio(format!("{lat_ratio:.2}x"))
        .numbers(&[p50.as_secs_f64(), p99.as_secs_f64(), lat_ratio]);
        lat = if n == 100 {
            lat.target(
                "p50 <= 3x one-row insert",
                Status::from_bool(lat_ratio <= 3.0),
            )
        } else {
            lat.target("(none)", Status::Info)
        };
        rows.push(lat);
    }
    rows.push(Row::new(
        3,
        "  server settings",
        format!("synchronous_commit={settings}"),
    ));
    coordinator.close().await;
    rows
}

async fn raw_setup(conn: &mut PgConnection, schema: &str) -> Result<(), sqlx::Error> {
    for sql in [
        format!("CREATE SCHEMA {schema}"),
        format!("CREATE TABLE {schema}.one_row (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)"),
        format!(
            "CREATE TABLE {schema}.objects (object_id BIGSERIAL PRIMARY KEY, object_key TEXT NOT NULL \
             UNIQUE, uploader_broker_id INTEGER NOT NULL, object_size BIGINT NOT NULL, live_bytes \
             BIGINT NOT NULL, committed_at BIGINT NOT NULL)"
        ),
        format!(
            "CREATE TABLE {schema}.batches (partition_id BIGINT NOT NULL, last_offset BIGINT NOT NULL, \
             base_offset BIGINT NOT NULL, object_id BIGINT NOT NULL REFERENCES {schema}.objects, \
             byte_offset BIGINT NOT NULL, byte_size INTEGER NOT NULL, base_timestamp BIGINT NOT NULL, \
             max_timestamp BIGINT NOT NULL, timestamp_type SMALLINT NOT NULL, log_append_time BIGINT \
             NOT NULL, producer_id BIGINT NOT NULL, producer_epoch SMALLINT NOT NULL, base_sequence \
             INTEGER NOT NULL, last_sequence INTEGER NOT NULL, PRIMARY KEY (partition_id, last_offset))"
        ),
    ] {
        sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn).await?;
    }
    Ok(())
}

/// One file as raw inserts: BEGIN, the object row, the batch rows (multi-row INSERTs of up to 1000
/// rows), COMMIT.
async fn raw_file(
    conn: &mut PgConnection,
    schema: &str,
    key: &str,
    n: usize,
    ts: i64,
    rows: &[(i64, i64, i64)],
) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin().await?;
    let object_id: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {schema}.objects (object_key, uploader_broker_id, object_size, live_bytes, \
         committed_at) VALUES ($1, 1, $2, $2, $3) RETURNING object_id"
    )))
    .bind(key)
    .bind(1 + n as i64 * i64::from(BATCH_BYTES))
    .bind(ts)
    .fetch_one(&mut *tx)
    .await?;
    for part in rows.chunks(1000) {
        let values: Vec<String> = (0..part.len())
            .map(|i| {
                let b = i * 14;
                format!(
                    "(${},${},${},${},${},${},${},${},${},${},${},${},${},${})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6,
                    b + 7,
                    b + 8,
                    b + 9,
                    b + 10,
                    b + 11,
                    b + 12,
                    b + 13,
                    b + 14
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO {schema}.batches (partition_id, last_offset, base_offset, object_id, \
             byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, log_append_time, \
             producer_id, producer_epoch, base_sequence, last_sequence) VALUES {}",
            values.join(",")
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (pid, base, off) in part {
            q = q
                .bind(*pid)
                .bind(base + i64::from(BATCH_RECORDS) - 1)
                .bind(*base)
                .bind(object_id)
                .bind(*off)
                .bind(BATCH_BYTES as i32)
                .bind(ts)
                .bind(ts + 5)
                .bind(0i16)
                .bind(-1i64)
                .bind(-1i64)
                .bind(-1i16)
                .bind(-1i32)
                .bind(-1i32);
        }
        q.execute(&mut *tx).await?;
    }
    tx.commit().await
}
