//! Two `nisshi-diskless` processes serving the same diskless topics: Nisshi's own engine on S3
//! (its `dynostore` engine: state as objects, shared through the bucket), this project's
//! PostgreSQL coordinator (a fresh schema) and one S3 bucket for the WAL segments (the in-process
//! S3 test server). python-tests/multinode.py (confluent-kafka) produces through one node and
//! consumes through the other, runs a consumer group across both, and kills one node with
//! SIGKILL while idempotent producers run: nothing acknowledged may be lost or duplicated.
//!
//! Skipped with a `skipped:` line without PostgreSQL or confluent-kafka unless
//! `DISKLESS_REQUIRE_POSTGRES=1` / `DISKLESS_REQUIRE_KAFKA_CLIENTS=1` (CI).
//!
//! The same on Nisshi's **PostgreSQL** engine (`two_nodes_on_nisshis_postgresql_engine_*`) needs
//! that engine's schema, which no published crate carries (it is `etc/initdb.d/010-schema.sql`
//! in Nisshi's repository at tag v0.6.0): `NISSHI_PG_SCHEMA=/path/to/010-schema.sql`. Without it
//! the test prints a `skipped:` line (also in CI, which has only the registries).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{clients_available, free_port, start_process};
use diskless_testkit::storage::S3TestServer;

/// The bucket of Nisshi's engine.
const ENGINE_BUCKET: &str = "nisshi-engine";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_diskless_topics_a_group_and_survive_a_kill() {
    if !clients_available() {
        return;
    }
    let Some(schema) = diskless_testkit::postgres::test_schema() else {
        return;
    };
    two_nodes(&schema, None).await;
}

/// The same two nodes with Nisshi's PostgreSQL engine (a fresh database with Nisshi's schema)
/// in place of its S3 engine: the configuration issue #27 names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_nisshis_postgresql_engine_share_topics_and_survive_a_kill() {
    let Some(schema_file) = std::env::var_os("NISSHI_PG_SCHEMA") else {
        eprintln!(
            "skipped: NISSHI_PG_SCHEMA is not set (Nisshi's PostgreSQL schema, \
             etc/initdb.d/010-schema.sql of its repository at v0.6.0, is in no published crate)"
        );
        return;
    };
    if !clients_available() {
        return;
    }
    let Some(schema) = diskless_testkit::postgres::test_schema() else {
        return;
    };
    let engine = NisshiDatabase::create(
        &schema.url,
        &schema.name,
        std::path::Path::new(&schema_file),
    );
    two_nodes(&schema, Some(&engine.url)).await;
}

/// A database of its own with Nisshi's PostgreSQL schema, dropped at the end (psql).
struct NisshiDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl NisshiDatabase {
    /// `unique`: a name no other test uses (the coordinator's fresh schema's).
    fn create(admin_url: &str, unique: &str, schema_file: &std::path::Path) -> Self {
        let suffix: String = unique
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let name = format!("nisshi_{}", suffix.to_ascii_lowercase());
        let base = admin_url.split('?').next().unwrap_or(admin_url);
        let url = match base.rfind('/') {
            Some(i) if i > "postgres://".len() => format!("{}/{name}", &base[..i]),
            _ => format!("{base}/{name}"),
        };
        let psql = |url: &str, args: &[&str]| {
            let out = Command::new("psql")
                .arg(url)
                .args(["-v", "ON_ERROR_STOP=1", "-q"])
                .args(args)
                .output()
                .expect("psql");
            assert!(
                out.status.success(),
                "psql {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        psql(admin_url, &["-c", &format!("CREATE DATABASE {name}")]);
        psql(&url, &["-f", schema_file.to_str().expect("a UTF-8 path")]);
        NisshiDatabase {
            admin_url: admin_url.to_string(),
            name,
            // Nisshi's engine tries TLS first and checks the certificate against the host name (a
            // local server's names "localhost", not 127.0.0.1).
            url: format!("{url}?sslmode=disable"),
        }
    }
}

impl Drop for NisshiDatabase {
    fn drop(&mut self) {
        let dropped = Command::new("psql")
            .arg(&self.admin_url)
            .args([
                "-q",
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .status();
        if !matches!(dropped, Ok(s) if s.success()) {
            eprintln!("database {} not dropped: {dropped:?}", self.name);
        }
    }
}

/// Two nodes on one S3 server, `schema` for the diskless coordinator and Nisshi's engine on
/// `engine` (a PostgreSQL URL), or in a bucket of the S3 server when `None`; the driver's checks.
async fn two_nodes(schema: &diskless_testkit::postgres::Schema, engine: Option<&str>) {
    let s3 = S3TestServer::start().await.unwrap();
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT", s3.endpoint()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", s3.access_key()),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_key()),
        ("AWS_DEFAULT_REGION", s3.region()),
        ("AWS_REGION", s3.region()),
        ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // Nisshi's engine in a bucket of its own (s3s-fs: a bucket is a directory under its root).
    std::fs::create_dir(s3.root().join(ENGINE_BUCKET)).unwrap();
    let ports = [free_port(), free_port()];
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let args = |node: usize| -> Vec<String> {
        [
            "--kafka-node-id",
            &(node + 1).to_string(),
            "--storage-engine",
            &engine.map_or_else(|| format!("s3://{ENGINE_BUCKET}"), str::to_string),
            "--diskless-storage",
            &s3.url("wal"),
            "--diskless-coordinator",
            &schema.url,
            "--diskless-coordinator-schema",
            &schema.name,
            "--diskless-default",
        ]
        .iter()
        .map(ToString::to_string)
        .collect()
    };
    let start = |node: usize| start_process(dirs[node].path(), ports[node], &args(node), &env);
    let mut nodes = [Some(start(0)), Some(start(1))];

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/multinode.py");
    let mut driver = Command::new("python3")
        .args([
            script,
            &format!("127.0.0.1:{}", ports[0]),
            &format!("127.0.0.1:{}", ports[1]),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_driver = driver.stdin.take().unwrap();
    let from_driver = BufReader::new(driver.stdout.take().unwrap());
    let mut said = Vec::new();
    // The driver asks for the kill while its producers run ("KILL 1": node 1 by SIGKILL) and
    // for the restart on the same data ("RESTART 1"); each step answered with "DONE".
    for line in from_driver.lines() {
        let line = line.unwrap();
        said.push(line.clone());
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|n| n.parse::<usize>().ok()),
        ) {
            (Some("KILL"), Some(n)) => {
                // Dropping a node kills it with SIGKILL (`Child::kill`) and waits.
                drop(nodes[n - 1].take().expect("running"));
            }
            (Some("RESTART"), Some(n)) => {
                nodes[n - 1] = Some(start(n - 1));
            }
            _ => continue,
        }
        writeln!(to_driver, "DONE").unwrap();
        to_driver.flush().unwrap();
    }
    let out = driver.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "multinode.py failed:\nstdout:\n{}\nstderr:\n{}",
        said.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(said.last().map(String::as_str), Some("ok"), "{said:?}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    drop(nodes);
    // Let the nodes' connections go before the schema is dropped.
    tokio::time::sleep(Duration::from_millis(200)).await;
    s3.shutdown().await;
}
