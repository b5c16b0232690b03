//! A PostgreSQL server for tests (feature `postgres`): the skip-or-require rule and a fresh
//! schema per test, shared by every crate's PostgreSQL tests.
//!
//! The server comes from `DISKLESS_POSTGRES_URL` (default [`DEFAULT_URL`]). Without a reachable
//! server, [`pg_url`] prints `skipped: no PostgreSQL at <url>` and returns `None` (the test then
//! passes), unless `DISKLESS_REQUIRE_POSTGRES=1`, where it panics (CI). [`test_schema`] gives a
//! schema of a random name, dropped with everything in it when the guard is dropped, so tests run
//! in parallel and leave nothing behind.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed setup fails the test"
)]

use diskless_coordinator::postgres::PostgresOptions;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// The server tests use when `DISKLESS_POSTGRES_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Runs `f` on a runtime and a thread of its own (callers may be inside a runtime, or dropping).
pub fn block_on_own_thread<T: Send + 'static>(
    f: impl Future<Output = T> + Send + 'static,
) -> std::thread::Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
}

/// The server URL when a server is reachable; `None` (after printing the skip notice) when not and
/// `DISKLESS_REQUIRE_POSTGRES` is not `1`; panics when it is.
#[allow(
    clippy::print_stdout,
    reason = "the skip notice is the test's output when there is no server"
)]
pub fn pg_url() -> Option<String> {
    static AVAILABLE: OnceLock<Result<String, String>> = OnceLock::new();
    let url = std::env::var("DISKLESS_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
    let available = AVAILABLE.get_or_init(|| {
        let probe = url.clone();
        block_on_own_thread(async move {
            match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&probe)).await
            {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    Ok(probe)
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("connection timed out".to_string()),
            }
        })
        .unwrap()
    });
    match available {
        Ok(url) => Some(url.clone()),
        Err(e) => {
            if std::env::var("DISKLESS_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("no PostgreSQL at {url} ({e}) and DISKLESS_REQUIRE_POSTGRES=1");
            }
            println!("skipped: no PostgreSQL at {url}");
            None
        }
    }
}

/// A name (of a schema, a database) that no other test, in this process or another, uses.
pub fn unique_name(prefix: &str) -> String {
    let (a, b) = (
        diskless_common::entropy_seed(),
        diskless_common::entropy_seed(),
    );
    format!("{prefix}{a:016x}{b:016x}")
}

/// Reports a clean-up that failed (a destructor cannot fail the test).
#[allow(
    clippy::print_stderr,
    reason = "a destructor cannot fail the test: the notice is for whoever runs it"
)]
pub fn report_cleanup(what: &str, done: std::thread::Result<Result<(), sqlx::Error>>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("dropping {what} failed: {e}"),
        Err(_) => eprintln!("dropping {what} panicked"),
    }
}

/// A fresh schema name, dropped (with everything in it) when the guard is dropped.
#[derive(Debug)]
pub struct Schema {
    /// The server.
    pub url: String,
    /// The schema's name.
    pub name: String,
}

impl Schema {
    /// A fresh (random) schema name on the server at `url`.
    pub fn new(url: &str) -> Schema {
        Schema {
            url: url.to_string(),
            name: unique_name("diskless_test_"),
        }
    }

    /// Options of a coordinator working in this schema.
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions::new(self.url.clone())
            .with_schema(self.name.clone())
            .with_max_connections(4)
            .with_read_max_connections(2)
            // Unique per test, to find our backends in pg_stat_activity.
            .with_application_name(self.name.clone())
    }
}

/// A fresh schema on the server (see [`pg_url`]), or `None` when the test is skipped.
pub fn test_schema() -> Option<Schema> {
    pg_url().map(|url| Schema::new(&url))
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = block_on_own_thread(async move {
            let mut conn = PgConnection::connect(&url).await?;
            // Backends of this test (e.g. a lock holder left by a failed test) go first.
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name LIKE $1 || '%' AND pid <> pg_backend_pid()",
            )
            .bind(&name)
            .execute(&mut conn)
            .await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET lock_timeout = '20s'; DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await
        });
        report_cleanup(&format!("schema {}", self.name), dropped);
    }
}
