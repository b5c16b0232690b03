//! Real Kafka clients against the `nisshi-diskless` binary: python-tests/mixed.py
//! (confluent-kafka, i.e. librdkafka) on a classic and a diskless topic side by side.
//!
//! Skipped with a `skipped:` line when Python or confluent-kafka is missing, unless
//! `DISKLESS_REQUIRE_KAFKA_CLIENTS=1` (CI), where that fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn clients_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import confluent_kafka"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("DISKLESS_REQUIRE_KAFKA_CLIENTS").as_deref() != Ok("1"),
            "DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but python3 with confluent_kafka is missing"
        );
        eprintln!("skipped: python3 with confluent_kafka not found (pip install confluent-kafka)");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `nisshi-diskless` process, killed on drop.
struct Broker(std::process::Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &std::path::Path, port: u16) -> Broker {
    let child = Command::new(env!("CARGO_BIN_EXE_nisshi-diskless"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--kafka-listener-url",
            &format!("tcp://127.0.0.1:{port}"),
            "--kafka-advertised-listener-url",
            &format!("tcp://127.0.0.1:{port}"),
        ])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nisshi-diskless did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    Broker(child)
}

#[test]
fn confluent_kafka_on_classic_and_diskless_topics() {
    if !clients_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = start(dir.path(), port);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/mixed.py");
    let out = Command::new("python3")
        .args([script, &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mixed.py failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
