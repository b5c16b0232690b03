//! Two `nisshi-diskless` processes serving the same diskless topics: Nisshi's own engine on S3
//! (its `dynostore` engine: state as objects, shared through the bucket), this project's
//! PostgreSQL coordinator (a fresh schema) and one S3 bucket for the WAL segments (the in-process
//! S3 test server). python-tests/multinode.py (confluent-kafka) produces through one node and
//! consumes through the other, runs a consumer group across both, and kills one node with
//! SIGKILL while idempotent producers run: nothing acknowledged may be lost or duplicated.
//!
//! Skipped with a `skipped:` line without PostgreSQL or confluent-kafka unless
//! `DISKLESS_REQUIRE_POSTGRES=1` / `DISKLESS_REQUIRE_KAFKA_CLIENTS=1` (CI).

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
            &format!("s3://{ENGINE_BUCKET}"),
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
