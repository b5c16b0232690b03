//! Transactions (KIP-98, transaction version 1) of the example broker with real clients:
//! `kafka-broker-tests/transactions.py` (confluent-kafka and kcat), one scenario per test against
//! a fresh broker (three logical brokers):
//!
//! - `commit-abort`: committed and aborted transactions over 2 topics × 3 partitions, interleaved;
//!   read_committed sees exactly the committed records in order, read_uncommitted all of them;
//!   kcat's counts with both isolation levels, no control record printed as a message.
//! - `fence`: a second producer with the same `transactional.id` aborts the first's transaction
//!   and fences it.
//! - `timeout`: a transaction left open past `transaction.timeout.ms` is aborted by the broker.
//! - `eos-crash`: consume-transform-produce with `send_offsets_to_transaction`; the broker process
//!   is SIGKILLed between a transaction's produce and its commit and restarted: exactly-once output
//!   and consistent committed offsets; a transaction abandoned across another kill is aborted by
//!   the restarted broker's timeout sweeper.
//!
//! Without python3 + confluent_kafka, or kcat, these print `skipped: ...` and pass, unless
//! `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

mod common;
use common::{Broker, available, free_ports, kcat_missing, python_clients_missing};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/kafka-broker-tests/transactions.py"
);

/// Runs one scenario of transactions.py against a fresh broker; when the script prints
/// `KILL-BROKER`, the broker process is killed (SIGKILL: no flush, no shutdown) and started again
/// on the same data directory and ports, and the script is told `RESTARTED`.
fn run_scenario(scenario: &str) {
    if !available(python_clients_missing().or_else(kcat_missing)) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let ports = free_ports(3);
    let bootstrap: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut broker = Some(Broker::start(&data_dir, &ports, 1, &[]));
    let mut child = Command::new("python3")
        .arg(SCRIPT)
        .args(["--bootstrap", &bootstrap.join(",")])
        .args(["--scenario", scenario])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut output = String::new();
    let mut runs = 1;
    let mut logs = String::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        output.push_str(&line);
        output.push('\n');
        if line.trim() == "KILL-BROKER" {
            if let Some(b) = broker.take() {
                logs.push_str(&b.log_text());
                // Dropping the process handle kills it with SIGKILL.
                drop(b);
            }
            runs += 1;
            broker = Some(Broker::start(&data_dir, &ports, runs, &[]));
            stdin.write_all(b"RESTARTED\n").unwrap();
            stdin.flush().unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- transactions.py {scenario} ---\n{output}{stderr}");
    if let Some(b) = broker.as_ref() {
        logs.push_str(&b.log_text());
    }
    assert!(
        out.status.success(),
        "transactions.py {scenario} failed ({}):\n{output}\n{stderr}\n--- broker logs ---\n{logs}",
        out.status,
    );
    if let Some(b) = broker.take() {
        b.stop();
    }
}

#[test]
fn committed_and_aborted_transactions_read_committed_and_uncommitted() {
    run_scenario("commit-abort");
}

#[test]
fn a_second_producer_with_the_same_transactional_id_fences_the_first() {
    run_scenario("fence");
}

#[test]
fn a_transaction_past_its_timeout_is_aborted_by_the_broker() {
    run_scenario("timeout");
}

#[test]
fn consume_transform_produce_is_exactly_once_across_a_broker_kill() {
    run_scenario("eos-crash");
}
