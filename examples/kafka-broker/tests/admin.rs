//! Topics and configs as a Kafka client expects them, through confluent-kafka's AdminClient
//! (`python-tests/admin.py`): CreateTopics with replica assignments, configs and
//! validate_only; Kafka's refusals (invalid names, unknown configs, compaction, broker-side
//! compression); DescribeConfigs of topics and brokers; IncrementalAlterConfigs and AlterConfigs
//! taking effect at once (a produce over the new max.message.bytes fails); Metadata for invalid and
//! unknown names; Metadata reporting manual replica assignments; group configs; and
//! `--auto-create-topics`. Kept topic configs, assignments and group configs survive a restart. Without python3 + confluent_kafka the tests print
//! `skipped: ...` and pass, unless `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.

mod common;

use common::{Broker, available, free_ports, python_clients_missing, run_python};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/admin.py");

#[test]
fn topics_and_configs_through_the_admin_client() {
    if !available(python_clients_missing()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(3);
    let broker = Broker::start(dir.path(), &ports, 1, &[]);
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &broker.bootstrap, "--mode", "plain"],
    );
}

#[test]
fn auto_topic_creation() {
    if !available(python_clients_missing()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(3);
    let broker = Broker::start(
        dir.path(),
        &ports,
        1,
        &["--auto-create-topics", "--num-partitions", "2"],
    );
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &broker.bootstrap, "--mode", "auto"],
    );
}

#[test]
fn kept_configs_assignments_and_group_configs_survive_a_restart() {
    if !available(python_clients_missing()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    let broker = Broker::start(dir.path(), &ports, 1, &[]);
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &broker.bootstrap, "--mode", "keep"],
    );
    broker.stop();
    let broker = Broker::start(dir.path(), &ports, 2, &[]);
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &broker.bootstrap, "--mode", "kept"],
    );
}
