//! Real Kafka clients (librdkafka: confluent-kafka for Python and kcat) against the example broker.
//!
//! Starts `kafka-broker` (three logical brokers on free loopback ports, a temporary data directory),
//! runs phase 1 of `python-tests/e2e.py` (create topic, idempotent produce with every codec,
//! kcat and a two-member group consumer read everything back exactly once), restarts the broker on the
//! same data directory and runs phase 2 (data and committed offsets survived; DeleteRecords moves the
//! log start). The second test does the same against a broker with a sharded coordinator (`--shards
//! 3`), where phase 1 also checks the produce-gateway leaders against the stored shard map, and the
//! restart shows that the map routes every partition to the same shard again. Without python3 +
//! confluent_kafka or kcat the tests print `skipped: ...` and pass, unless
//! `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

mod common;
use common::{Broker, available, free_ports, kcat_missing, python_clients_missing, run_python};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/e2e.py");

fn run_phase(broker: &Broker, bootstrap: &str, state: &Path, phase: u8, shard_map: Option<&Path>) {
    let phase = phase.to_string();
    let state = state.to_str().unwrap();
    let mut args = vec![
        "--bootstrap",
        bootstrap,
        "--state",
        state,
        "--phase",
        &phase,
    ];
    let map = shard_map.map(|m| m.to_str().unwrap());
    if let Some(map) = map {
        args.extend(["--shard-map", map]);
    }
    run_python(broker, SCRIPT, &args);
}

/// Whether the tests can run; `false` (after printing why) when they should be skipped.
fn clients_available() -> bool {
    available(python_clients_missing().or_else(kcat_missing))
}

/// `GET /metrics` from the broker's `--metrics-addr`.
fn scrape(port: u16) -> String {
    use std::io::Write;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// The sum of every sample of `series` (a Prometheus text line `name{labels} value`) whose labels
/// contain each of `labels`.
fn sample_sum(text: &str, series: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(name, _)| {
            let bare = name.split('{').next().unwrap_or_default();
            bare == series && labels.iter().all(|want| name.contains(want))
        })
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// The library's series as the example broker exports them after real clients produced and
/// consumed: each present, and the counts of one operation seen from two layers agree.
fn check_metrics(text: &str) {
    let count = |series: &str, labels: &[&str]| sample_sum(text, series, labels);
    let produces = count("diskless_produce_seconds_count", &[]);
    let segments = count("diskless_segment_bytes_count", &[]);
    let uploads = count("diskless_upload_seconds_count", &[]);
    let commits = count("diskless_commit_seconds_count", &[]);
    let fetches = count("diskless_fetch_seconds_count", &[]);
    assert!(produces > 0.0 && segments > 0.0 && fetches > 0.0, "{text}");
    assert!(count("diskless_produce_bytes_total", &[]) > 0.0, "{text}");
    // Every sealed segment is uploaded once and (when its upload succeeded) committed once.
    assert_eq!(uploads, segments, "{text}");
    let uploaded = count("diskless_upload_seconds_count", &["outcome=\"ok\""]);
    assert_eq!(commits, uploaded, "{text}");
    // The writer's commits are the coordinator's commit_file calls (the broker commits nothing
    // else), seen from the MeteredCoordinator layer.
    let commit_calls = count(
        "diskless_coordinator_seconds_count",
        &["op=\"commit_file\""],
    );
    assert_eq!(commit_calls, commits, "{text}");
    // Storage calls seen by MeteredStorage: at least one PUT per uploaded segment, bytes both ways.
    let puts = count(
        "diskless_storage_requests_total",
        &["op=\"put\"", "outcome=\"ok\""],
    );
    assert!(puts >= uploaded, "{text}");
    assert!(
        count("diskless_storage_bytes_total", &["op=\"put\""]) > 0.0,
        "{text}"
    );
    assert!(
        count("diskless_cache_hit_bytes_total", &[])
            + count("diskless_cache_miss_bytes_total", &[])
            > 0.0,
        "{text}"
    );
    assert!(
        count("diskless_lifecycle_passes_total", &["worker=\"retention\""]) > 0.0,
        "{text}"
    );
    assert!(text.contains("# HELP diskless_produce_seconds"), "{text}");
}

fn bootstrap(ports: &[u16]) -> String {
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    addrs.join(",")
}

#[test]
fn real_kafka_clients_against_the_example_broker() {
    if !clients_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let state = dir.path().join("e2e-state.json");
    let ports = free_ports(4);
    let (ports, metrics_port) = (&ports[..3], ports[3]);
    let bootstrap = bootstrap(ports);

    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let broker = Broker::start(&data_dir, ports, 1, &["--metrics-addr", &metrics_addr]);
    run_phase(&broker, &bootstrap, &state, 1, None);
    check_metrics(&scrape(metrics_port));
    broker.stop();

    let broker = Broker::start(&data_dir, ports, 2, &[]);
    run_phase(&broker, &bootstrap, &state, 2, None);
    broker.stop();
}

#[test]
fn real_kafka_clients_against_a_sharded_example_broker() {
    if !clients_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let state = dir.path().join("e2e-state.json");
    let shard_map = data_dir.join("coordinator-shards.map");
    let ports = free_ports(3);
    let bootstrap = bootstrap(&ports);
    let sharded = ["--shards", "3"];

    let broker = Broker::start(&data_dir, &ports, 1, &sharded);
    run_phase(&broker, &bootstrap, &state, 1, Some(&shard_map));
    broker.stop();
    for i in 0..3 {
        let db = data_dir.join(format!("coordinator-shard-{i}.db"));
        assert!(db.exists(), "{} is missing", db.display());
    }
    assert!(!data_dir.join("coordinator.db").exists());
    let map = std::fs::read_to_string(&shard_map).unwrap();
    assert!(map.starts_with("diskless-shard-map v1\n"), "{map}");

    // The restart reads the stored map: every partition is routed to the shard holding its data.
    let broker = Broker::start(&data_dir, &ports, 2, &sharded);
    run_phase(&broker, &bootstrap, &state, 2, Some(&shard_map));
    broker.stop();
    assert_eq!(std::fs::read_to_string(&shard_map).unwrap(), map);

    // The same data directory without --shards is refused, not silently empty.
    let (mut command, log) = Broker::command(&data_dir, &ports, 3, &[]);
    let status = command.status().unwrap();
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!status.success(), "an unsharded start was accepted:\n{log}");
    assert!(log.contains("--shards"), "{log}");
}
