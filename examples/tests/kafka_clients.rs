//! Real Kafka clients (librdkafka: confluent-kafka for Python and kcat) against the example broker.
//!
//! Starts `kafka-broker` (three logical brokers on free loopback ports, a temporary data directory),
//! runs phase 1 of `kafka-broker-tests/e2e.py` (create topic, idempotent produce with every codec,
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

use std::fs::File;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kafka-broker-tests/e2e.py");

/// Why the clients cannot run here, if they cannot.
fn clients_missing() -> Option<String> {
    let python = Command::new("python3")
        .args(["-c", "import confluent_kafka"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !python.is_ok_and(|s| s.success()) {
        return Some("python3 with the confluent_kafka module is not installed".into());
    }
    let kcat = Command::new("kcat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !kcat.is_ok_and(|s| s.success()) {
        return Some("kcat is not installed".into());
    }
    None
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

struct Broker {
    child: Child,
    log: PathBuf,
}

impl Broker {
    fn command(data_dir: &Path, ports: &[u16], run: usize, extra: &[&str]) -> (Command, PathBuf) {
        let listeners: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        std::fs::create_dir_all(data_dir).unwrap();
        let log = data_dir.join(format!("broker-{run}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_kafka-broker"));
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listeners", &listeners.join(",")])
            .args(["--commit-interval-ms", "50"])
            .args(["--retention-check-ms", "500"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        (command, log)
    }

    fn start(data_dir: &Path, ports: &[u16], run: usize, extra: &[&str]) -> Broker {
        let (mut command, log) = Broker::command(data_dir, ports, run, extra);
        let child = command.spawn().unwrap();
        let mut broker = Broker { child, log };
        broker.wait_ready(ports);
        broker
    }

    fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn wait_ready(&mut self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kafka-broker exited with {status}:\n{}", self.log_text());
            }
            if ports
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kafka-broker did not listen in time:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM and wait for the graceful shutdown (the WAL writers flush).
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "kafka-broker exited with {status}:\n{}",
                    self.log_text()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("kafka-broker did not stop on SIGTERM:\n{}", self.log_text());
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_phase(broker: &Broker, bootstrap: &str, state: &Path, phase: u8, shard_map: Option<&Path>) {
    let mut command = Command::new("python3");
    command
        .arg(SCRIPT)
        .args(["--bootstrap", bootstrap])
        .arg("--state")
        .arg(state)
        .args(["--phase", &phase.to_string()]);
    if let Some(map) = shard_map {
        command.arg("--shard-map").arg(map);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- e2e.py phase {phase} ---\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "e2e.py phase {phase} failed ({}):\n{stdout}\n{stderr}\n--- broker log ---\n{}",
        out.status,
        broker.log_text()
    );
}

/// Whether the tests can run; `false` (after printing why) when they should be skipped.
fn clients_available() -> bool {
    if let Some(why) = clients_missing() {
        if std::env::var("DISKLESS_REQUIRE_KAFKA_CLIENTS").as_deref() == Ok("1") {
            panic!("DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but {why}");
        }
        println!("skipped: {why}");
        return false;
    }
    true
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
