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

use crate::fig2_sqlite::{PARTITIONS, commit_rate_row, commit_request, plan};
use crate::raw::PgRaw;
use crate::report::{Row, Status, ms};
use crate::util::{create_topic, now_ms, percentile, random_uuid, runtime};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Runs figure 3.
pub(crate) fn run(quick: bool) -> Vec<Row> {
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
        let suffix = random_uuid().simple().to_string();
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
    let mut raw = match raw_setup(admin, raw_schema).await {
        Ok(raw) => raw,
        Err(e) => {
            coordinator.close().await;
            return vec![Row::not_measured(
                3,
                "PostgreSQL commit",
                format!("raw schema: {e}"),
            )];
        }
    };
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
        if let Err(e) = raw.file(admin, n).await {
            rows.push(Row::not_measured(
                3,
                "PostgreSQL raw inserts",
                e.to_string(),
            ));
            break;
        }
        let plans: Vec<_> = (0..files).map(|_| raw.plan(n)).collect();
        let start = Instant::now();
        for p in &plans {
            if let Err(e) = raw.write(admin, p).await {
                failed = Some(e.to_string());
                break;
            }
        }
        let raw_rate = files as f64 / start.elapsed().as_secs_f64();
        if let Some(e) = failed {
            rows.push(Row::not_measured(3, "PostgreSQL raw inserts", e));
            break;
        }
        let mut row = commit_rate_row(
            3,
            format!("PostgreSQL commit, {n} batches/file, {PARTITIONS} partitions"),
            n,
            rate,
            raw_rate,
        )
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

/// Figure 3's raw tables ([`PgRaw::plain`]) and a table for one-row inserts, in `schema`.
async fn raw_setup(conn: &mut PgConnection, schema: &str) -> Result<PgRaw, sqlx::Error> {
    let raw = PgRaw::plain(conn, schema, PARTITIONS).await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {schema}.one_row (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(raw)
}
