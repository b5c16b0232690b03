//! Transactions (KIP-98, transaction version 1) of the example broker with real clients:
//! `python-tests/transactions.py` (confluent-kafka and kcat), one scenario per test against
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
//!
//! With hand-built requests (always run, `by_hand`): FindCoordinator key type 1, InitProducerId
//! (INVALID_TRANSACTION_TIMEOUT, KIP-360 bump, PRODUCER_FENCED), Produce verification
//! (TRANSACTIONAL_ID_AUTHORIZATION_FAILED without a transactional id, INVALID_TXN_STATE for a
//! partition not added or a transaction already ended, INVALID_PRODUCER_EPOCH), AddPartitionsToTxn
//! (UNKNOWN_TOPIC_OR_PARTITION / OPERATION_NOT_ATTEMPTED, fenced, unknown id), TxnOffsetCommit
//! before AddOffsetsToTxn (INVALID_TXN_STATE), OffsetFetch `require_stable`
//! (UNSTABLE_OFFSET_COMMIT until the commit, then the offset), EndTxn (fenced codes per version,
//! retry, wrong outcome), Describe/ListTransactions, and the state across a restart.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

mod common;
use common::{Broker, available, free_ports, kcat_missing, python_clients_missing};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/transactions.py");

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

// ---------------------------------------------------------------------------------------------
// Hand-built requests (always run): the error codes real clients rarely show.

mod by_hand {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Duration;

    use bytes::Bytes;
    use diskless_core::RecordBatchBuilder;
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

    use super::common::{Broker, frame, free_ports, response};

    const NONE: i16 = 0;
    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    const INVALID_PRODUCER_EPOCH: i16 = 47;
    const INVALID_TXN_STATE: i16 = 48;
    const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    const OPERATION_NOT_ATTEMPTED: i16 = 55;
    const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    const PRODUCER_FENCED: i16 = 90;
    const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

    struct Client {
        stream: TcpStream,
        id: i32,
    }

    impl Client {
        fn call<R>(&mut self, version: i16, request: &R) -> R::Response
        where
            R: Request + Encodable + HeaderVersion,
            R::Response: Decodable + HeaderVersion,
        {
            self.id += 1;
            let api = ApiKey::try_from(R::KEY).unwrap();
            let bytes = frame(api, version, self.id, "txn-test", request);
            self.stream.write_all(&bytes).unwrap();
            response(&mut self.stream, version, self.id)
        }
    }

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_string())
    }

    fn init(c: &mut Client, tid: &str, timeout_ms: i32, expected: (i64, i16)) -> (i16, i64, i16) {
        let mut r = InitProducerIdRequest::default();
        r.transactional_id = Some(TransactionalId(s(tid)));
        r.transaction_timeout_ms = timeout_ms;
        r.producer_id = ProducerId(expected.0);
        r.producer_epoch = expected.1;
        let a: InitProducerIdResponse = c.call(4, &r);
        (a.error_code, a.producer_id.0, a.producer_epoch)
    }

    fn add_partitions(
        c: &mut Client,
        tid: &str,
        pid: i64,
        epoch: i16,
        topics: &[(&str, i32)],
    ) -> Vec<i16> {
        let mut r = AddPartitionsToTxnRequest::default();
        r.v3_and_below_transactional_id = TransactionalId(s(tid));
        r.v3_and_below_producer_id = ProducerId(pid);
        r.v3_and_below_producer_epoch = epoch;
        r.v3_and_below_topics = topics
            .iter()
            .map(|(name, p)| {
                let mut t = AddPartitionsToTxnTopic::default();
                t.name = TopicName(s(name));
                t.partitions = vec![*p];
                t
            })
            .collect();
        let a: AddPartitionsToTxnResponse = c.call(3, &r);
        a.results_by_topic_v3_and_below
            .iter()
            .map(|t| t.results_by_partition[0].partition_error_code)
            .collect()
    }

    fn produce(
        c: &mut Client,
        tid: Option<&str>,
        pid: i64,
        epoch: i16,
        seq: i32,
        partition: i32,
    ) -> i16 {
        let batch = RecordBatchBuilder::new()
            .producer(pid, epoch, seq)
            .transactional(true)
            .record(1_700_000_000_000, None, Some(b"v"))
            .build()
            .unwrap();
        let mut p = PartitionProduceData::default();
        p.index = partition;
        p.records = Some(Bytes::copy_from_slice(batch.as_bytes()));
        let mut t = TopicProduceData::default();
        t.name = TopicName(s("t"));
        t.partition_data = vec![p];
        let mut r = ProduceRequest::default();
        r.transactional_id = tid.map(|t| TransactionalId(s(t)));
        r.acks = -1;
        r.timeout_ms = 30_000;
        r.topic_data = vec![t];
        let a: ProduceResponse = c.call(9, &r);
        a.responses[0].partition_responses[0].error_code
    }

    fn end(c: &mut Client, tid: &str, pid: i64, epoch: i16, commit: bool, version: i16) -> i16 {
        let mut r = EndTxnRequest::default();
        r.transactional_id = TransactionalId(s(tid));
        r.producer_id = ProducerId(pid);
        r.producer_epoch = epoch;
        r.committed = commit;
        let a: EndTxnResponse = c.call(version, &r);
        a.error_code
    }

    fn txn_offset_commit(c: &mut Client, tid: &str, pid: i64, epoch: i16, offset: i64) -> i16 {
        let mut p = TxnOffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = offset;
        let mut t = TxnOffsetCommitRequestTopic::default();
        t.name = TopicName(s("t"));
        t.partitions = vec![p];
        let mut r = TxnOffsetCommitRequest::default();
        r.transactional_id = TransactionalId(s(tid));
        r.group_id = GroupId(s("g"));
        r.producer_id = ProducerId(pid);
        r.producer_epoch = epoch;
        r.generation_id = -1;
        r.topics = vec![t];
        let a: TxnOffsetCommitResponse = c.call(3, &r);
        a.topics[0].partitions[0].error_code
    }

    /// (error, offset) of group g, t-0, with `require_stable`.
    fn offset_fetch(c: &mut Client) -> (i16, i64) {
        let mut t = OffsetFetchRequestTopic::default();
        t.name = TopicName(s("t"));
        t.partition_indexes = vec![0];
        let mut r = OffsetFetchRequest::default();
        r.group_id = GroupId(s("g"));
        r.topics = Some(vec![t]);
        r.require_stable = true;
        let a: OffsetFetchResponse = c.call(7, &r);
        let p = &a.topics[0].partitions[0];
        (p.error_code, p.committed_offset)
    }

    fn describe(c: &mut Client, tid: &str) -> (i16, String, Vec<i32>) {
        let mut r = DescribeTransactionsRequest::default();
        r.transactional_ids = vec![TransactionalId(s(tid))];
        let a: DescribeTransactionsResponse = c.call(0, &r);
        let st = &a.transaction_states[0];
        let partitions = st
            .topics
            .iter()
            .flat_map(|t| t.partitions.clone())
            .collect();
        (
            st.error_code,
            st.transaction_state.as_str().to_string(),
            partitions,
        )
    }

    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client { stream, id: 0 }
    }

    fn create_topic(c: &mut Client, name: &str, partitions: i32) {
        let mut topic = CreatableTopic::default();
        topic.name = TopicName(s(name));
        topic.num_partitions = partitions;
        topic.replication_factor = -1;
        let mut create = CreateTopicsRequest::default();
        create.topics = vec![topic];
        create.timeout_ms = 30_000;
        let created: CreateTopicsResponse = c.call(5, &create);
        assert_eq!(created.topics[0].error_code, NONE);
    }

    /// (finalized transaction.version, EndTxn max, Produce max) from ApiVersions v3.
    fn features(c: &mut Client) -> (i16, i16, i16) {
        let mut r = ApiVersionsRequest::default();
        r.client_software_name = s("txn-test");
        r.client_software_version = s("1");
        let a: ApiVersionsResponse = c.call(3, &r);
        assert_eq!(a.error_code, NONE);
        let finalized = a
            .finalized_features
            .iter()
            .find(|f| f.name.as_str() == "transaction.version")
            .map_or(0, |f| f.max_version_level);
        let supported = a
            .supported_features
            .iter()
            .find(|f| f.name.as_str() == "transaction.version")
            .map(|f| (f.min_version, f.max_version));
        assert_eq!(supported, Some((0, 2)));
        let max = |key: ApiKey| {
            a.api_keys
                .iter()
                .find(|k| k.api_key == key as i16)
                .map_or(-1, |k| k.max_version)
        };
        (finalized, max(ApiKey::EndTxn), max(ApiKey::Produce))
    }

    /// A transactional batch of one record sent with Produce v12 (transaction version 2: no
    /// AddPartitionsToTxn before it).
    fn produce_v12(c: &mut Client, tid: &str, pid: i64, epoch: i16, partition: i32) -> i16 {
        let batch = RecordBatchBuilder::new()
            .producer(pid, epoch, 0)
            .transactional(true)
            .record(1_700_000_000_000, None, Some(b"v2"))
            .build()
            .unwrap();
        let mut p = PartitionProduceData::default();
        p.index = partition;
        p.records = Some(Bytes::copy_from_slice(batch.as_bytes()));
        let mut t = TopicProduceData::default();
        t.name = TopicName(s("t2"));
        t.partition_data = vec![p];
        let mut r = ProduceRequest::default();
        r.transactional_id = Some(TransactionalId(s(tid)));
        r.acks = -1;
        r.timeout_ms = 30_000;
        r.topic_data = vec![t];
        let a: ProduceResponse = c.call(12, &r);
        a.responses[0].partition_responses[0].error_code
    }

    /// EndTxn v5: (error, producer id, epoch of the next transaction).
    fn end_v5(c: &mut Client, tid: &str, pid: i64, epoch: i16, commit: bool) -> (i16, i64, i16) {
        let mut r = EndTxnRequest::default();
        r.transactional_id = TransactionalId(s(tid));
        r.producer_id = ProducerId(pid);
        r.producer_epoch = epoch;
        r.committed = commit;
        let a: EndTxnResponse = c.call(5, &r);
        (a.error_code, a.producer_id.0, a.producer_epoch)
    }

    /// What a read_committed fetch saw: the batches as (base offset, is control, producer epoch),
    /// the last stable offset, the aborted transactions as (producer id, first offset).
    type CommittedRead = (Vec<(i64, bool, i16)>, i64, Vec<(i64, i64)>);

    /// A read_committed Fetch v12 of t2-`partition` from 0.
    fn fetch_committed(c: &mut Client, partition: i32) -> CommittedRead {
        let mut p = kafka_protocol::messages::fetch_request::FetchPartition::default();
        p.partition = partition;
        p.fetch_offset = 0;
        p.partition_max_bytes = 1 << 20;
        p.current_leader_epoch = -1;
        p.last_fetched_epoch = -1;
        p.log_start_offset = -1;
        let mut t = kafka_protocol::messages::fetch_request::FetchTopic::default();
        t.topic = TopicName(s("t2"));
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.replica_id = BrokerId(-1);
        r.max_wait_ms = 0;
        r.min_bytes = 0;
        r.max_bytes = 1 << 20;
        r.isolation_level = 1;
        r.session_epoch = -1;
        r.topics = vec![t];
        let a: FetchResponse = c.call(12, &r);
        let pd = &a.responses[0].partitions[0];
        assert_eq!(pd.error_code, NONE);
        let records = pd.records.clone().unwrap_or_default();
        let batches = diskless_core::split_batches(records)
            .unwrap()
            .iter()
            .map(|b| {
                assert!(b.crc_is_valid());
                (
                    b.base_offset(),
                    b.attributes().is_control(),
                    b.producer_epoch(),
                )
            })
            .collect();
        let aborted = pd
            .aborted_transactions
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        (batches, pd.last_stable_offset, aborted)
    }

    /// Transaction version 2 (KIP-890 part 2), as a Kafka 4 client speaks it when the broker
    /// finalizes `transaction.version` 2: partitions join with Produce v12, the group with
    /// TxnOffsetCommit v5, and every EndTxn v5 bumps the epoch (markers carry the new one) and
    /// answers it; retries are recognised; the old epoch is fenced. With `--transaction-version 1`
    /// the broker finalizes 1 and advertises only the classic versions.
    #[test]
    fn transaction_version_2_bumps_the_epoch_and_adds_partitions_implicitly() {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(1);
        let broker = Broker::start(&dir.path().join("data"), &ports, 1, &[]);
        let mut c = connect(ports[0]);
        assert_eq!(features(&mut c), (2, 5, 12));
        create_topic(&mut c, "t2", 2);
        let mut r = InitProducerIdRequest::default();
        r.transactional_id = Some(TransactionalId(s("tv2")));
        r.transaction_timeout_ms = 60_000;
        r.producer_id = ProducerId(-1);
        r.producer_epoch = -1;
        let a: InitProducerIdResponse = c.call(5, &r);
        assert_eq!((a.error_code, a.producer_epoch), (NONE, 0));
        let pid = a.producer_id.0;

        // Transaction 1 at epoch 0: t2-0 joins with the produce, the group with the offsets.
        assert_eq!(produce_v12(&mut c, "tv2", pid, 0, 0), NONE);
        let (_, state, partitions) = describe(&mut c, "tv2");
        assert_eq!((state.as_str(), partitions), ("Ongoing", vec![0]));
        let mut p = TxnOffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = 1;
        let mut t = TxnOffsetCommitRequestTopic::default();
        t.name = TopicName(s("t2"));
        t.partitions = vec![p];
        let mut offsets = TxnOffsetCommitRequest::default();
        offsets.transactional_id = TransactionalId(s("tv2"));
        offsets.group_id = GroupId(s("g2"));
        offsets.producer_id = ProducerId(pid);
        offsets.producer_epoch = 0;
        offsets.generation_id = -1;
        offsets.member_id = s("");
        offsets.topics = vec![t];
        let committed: TxnOffsetCommitResponse = c.call(5, &offsets);
        assert_eq!(committed.topics[0].partitions[0].error_code, NONE);
        assert_eq!(end_v5(&mut c, "tv2", pid, 0, true), (NONE, pid, 1));
        // The client's retry of that EndTxn (its answer lost) gets the same answer.
        assert_eq!(end_v5(&mut c, "tv2", pid, 0, true), (NONE, pid, 1));

        // Transaction 2 at epoch 1 on t2-1, aborted; the old epoch is fenced.
        assert_eq!(
            produce_v12(&mut c, "tv2", pid, 0, 1),
            INVALID_PRODUCER_EPOCH
        );
        assert_eq!(produce_v12(&mut c, "tv2", pid, 1, 1), NONE);
        assert_eq!(end_v5(&mut c, "tv2", pid, 0, false).0, PRODUCER_FENCED);
        assert_eq!(end_v5(&mut c, "tv2", pid, 1, false), (NONE, pid, 2));
        // An abort with nothing open still bumps (the client's recovery after an error).
        assert_eq!(end_v5(&mut c, "tv2", pid, 2, false), (NONE, pid, 3));
        assert_eq!(end_v5(&mut c, "tv2", pid, 3, true).0, INVALID_TXN_STATE);

        // read_committed: the commit marker carries the bumped epoch; the abort is reported.
        assert_eq!(
            fetch_committed(&mut c, 0),
            (vec![(0, false, 0), (1, true, 1)], 2, vec![])
        );
        assert_eq!(
            fetch_committed(&mut c, 1),
            (vec![(0, false, 1), (1, true, 2)], 2, vec![(pid, 0)])
        );
        let mut t = OffsetFetchRequestTopic::default();
        t.name = TopicName(s("t2"));
        t.partition_indexes = vec![0];
        let mut fetch = OffsetFetchRequest::default();
        fetch.group_id = GroupId(s("g2"));
        fetch.topics = Some(vec![t]);
        fetch.require_stable = true;
        let fetched: OffsetFetchResponse = c.call(7, &fetch);
        let p = &fetched.topics[0].partitions[0];
        assert_eq!((p.error_code, p.committed_offset), (NONE, 1));
        drop(c);
        broker.stop();

        // The classic flow only: transaction.version 1 finalized, no v5/v12.
        let broker = Broker::start(
            &dir.path().join("data"),
            &ports,
            2,
            &["--transaction-version", "1"],
        );
        let mut c = connect(ports[0]);
        assert_eq!(features(&mut c), (1, 4, 11));
        drop(c);
        broker.stop();
    }

    #[test]
    fn transaction_coordinator_error_codes_and_pending_offsets_follow_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(1);
        let broker = Broker::start(&dir.path().join("data"), &ports, 1, &[]);
        let stream = TcpStream::connect(("127.0.0.1", ports[0])).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut c = Client { stream, id: 0 };
        let mut topic = CreatableTopic::default();
        topic.name = TopicName(s("t"));
        topic.num_partitions = 2;
        topic.replication_factor = -1;
        let mut create = CreateTopicsRequest::default();
        create.topics = vec![topic];
        create.timeout_ms = 30_000;
        let created: CreateTopicsResponse = c.call(5, &create);
        assert_eq!(created.topics[0].error_code, NONE);

        // FindCoordinator for a transactional id answers a node of this process.
        let mut find = FindCoordinatorRequest::default();
        find.key_type = 1;
        find.key = s("tx");
        let found: FindCoordinatorResponse = c.call(2, &find);
        assert_eq!((found.error_code, found.node_id.0), (NONE, 1));

        assert_eq!(
            init(&mut c, "tx", 900_001, (-1, -1)).0,
            INVALID_TRANSACTION_TIMEOUT
        );
        let (code, pid, epoch) = init(&mut c, "tx", 60_000, (-1, -1));
        assert_eq!((code, epoch), (NONE, 0));
        // KIP-360: the current epoch bumps; a wrong one is fenced.
        assert_eq!(init(&mut c, "tx", 60_000, (pid, 0)), (NONE, pid, 1));
        assert_eq!(init(&mut c, "tx", 60_000, (pid, 7)).0, PRODUCER_FENCED);
        let epoch = 1;
        assert_eq!(describe(&mut c, "tx").1, "Empty");
        assert_eq!(describe(&mut c, "nobody").0, TRANSACTIONAL_ID_NOT_FOUND);

        // Produce: without a transactional id, before the partition is added, with a stale epoch.
        assert_eq!(
            produce(&mut c, None, pid, epoch, 0, 0),
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        );
        assert_eq!(
            produce(&mut c, Some("tx"), pid, epoch, 0, 0),
            INVALID_TXN_STATE
        );
        assert_eq!(
            add_partitions(&mut c, "tx", pid, epoch, &[("t", 0), ("missing", 0)]),
            vec![OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC_OR_PARTITION]
        );
        assert_eq!(
            add_partitions(&mut c, "tx", pid, epoch - 1, &[("t", 0)]),
            vec![PRODUCER_FENCED]
        );
        assert_eq!(
            add_partitions(&mut c, "nobody", pid, epoch, &[("t", 0)]),
            vec![INVALID_PRODUCER_ID_MAPPING]
        );
        assert_eq!(
            add_partitions(&mut c, "tx", pid, epoch, &[("t", 0)]),
            vec![NONE]
        );
        assert_eq!(produce(&mut c, Some("tx"), pid, epoch, 0, 0), NONE);
        assert_eq!(
            produce(&mut c, Some("tx"), pid, epoch, 1, 1),
            INVALID_TXN_STATE,
            "t-1 not added"
        );
        assert_eq!(
            produce(&mut c, Some("tx"), pid, epoch - 1, 1, 0),
            INVALID_PRODUCER_EPOCH
        );
        let (_, state, partitions) = describe(&mut c, "tx");
        assert_eq!((state.as_str(), partitions), ("Ongoing", vec![0]));

        // Transactional offsets: the group must be in the transaction; pending until the commit.
        assert_eq!(
            txn_offset_commit(&mut c, "tx", pid, epoch, 5),
            INVALID_TXN_STATE
        );
        let mut add_offsets = AddOffsetsToTxnRequest::default();
        add_offsets.transactional_id = TransactionalId(s("tx"));
        add_offsets.producer_id = ProducerId(pid);
        add_offsets.producer_epoch = epoch;
        add_offsets.group_id = GroupId(s("g"));
        let added: AddOffsetsToTxnResponse = c.call(0, &add_offsets);
        assert_eq!(added.error_code, NONE);
        assert_eq!(txn_offset_commit(&mut c, "tx", pid, epoch, 5), NONE);
        assert_eq!(offset_fetch(&mut c), (UNSTABLE_OFFSET_COMMIT, -1));
        let mut list = ListTransactionsRequest::default();
        list.state_filters = vec![s("Ongoing")];
        let listed: ListTransactionsResponse = c.call(1, &list);
        let ids: Vec<&str> = listed
            .transaction_states
            .iter()
            .map(|t| t.transactional_id.as_str())
            .collect();
        assert_eq!(ids, vec!["tx"]);

        // EndTxn: a stale epoch is fenced (INVALID_PRODUCER_EPOCH below v2); the commit installs
        // the offset; a retry answers NONE; an abort now is INVALID_TXN_STATE.
        assert_eq!(
            end(&mut c, "tx", pid, epoch - 1, true, 1),
            INVALID_PRODUCER_EPOCH
        );
        assert_eq!(end(&mut c, "tx", pid, epoch - 1, true, 3), PRODUCER_FENCED);
        assert_eq!(end(&mut c, "tx", pid, epoch, true, 3), NONE);
        assert_eq!(end(&mut c, "tx", pid, epoch, true, 3), NONE);
        assert_eq!(end(&mut c, "tx", pid, epoch, false, 3), INVALID_TXN_STATE);
        assert_eq!(offset_fetch(&mut c), (NONE, 5));
        assert_eq!(describe(&mut c, "tx").1, "CompleteCommit");
        // The transaction is over: a batch of it is refused.
        assert_eq!(
            produce(&mut c, Some("tx"), pid, epoch, 1, 0),
            INVALID_TXN_STATE
        );

        // A restart keeps the transactional id: the next init bumps its epoch.
        drop(c);
        broker.stop();
        let broker = Broker::start(&dir.path().join("data"), &ports, 2, &[]);
        let stream = TcpStream::connect(("127.0.0.1", ports[0])).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut c = Client { stream, id: 0 };
        assert_eq!(describe(&mut c, "tx").1, "CompleteCommit");
        assert_eq!(
            init(&mut c, "tx", 60_000, (pid, epoch)),
            (NONE, pid, epoch + 1)
        );
        assert_eq!(offset_fetch(&mut c), (NONE, 5));
        drop(c);
        broker.stop();
    }
}
