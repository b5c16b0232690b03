//! Real Kafka clients against the `nisshi-diskless` binary: python-tests/mixed.py
//! (confluent-kafka, i.e. librdkafka) on a classic and a diskless topic side by side.
//!
//! Skipped with a `skipped:` line when Python or confluent-kafka is missing, unless
//! `DISKLESS_REQUIRE_KAFKA_CLIENTS=1` (CI), where that fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::process::Command;

use common::{clients_available, free_port, start_process};

#[test]
fn confluent_kafka_on_classic_and_diskless_topics() {
    if !clients_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = start_process(dir.path(), port, &[], &[]);
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
