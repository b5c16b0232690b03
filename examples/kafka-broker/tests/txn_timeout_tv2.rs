//! Transaction version 2 (KIP-890 part 2) and the broker's timeout abort, with hand-built
//! requests: the coordinator aborts a transaction left open past its `transaction.timeout.ms`
//! as a transaction version 2 end (one epoch bump, Kafka's `abortTimedOutTransactions` then
//! `endTransaction` with the broker's finalized version), and the producer's late EndTxn v5 with
//! its old epoch is answered as Kafka's `TransactionCoordinator.endTransaction` answers it:
//! COMMIT is PRODUCER_FENCED (KAFKA-20785), ABORT is the retry of the coordinator's abort
//! (`retryOnEpochBump`) and answers the bumped epoch, with which the producer goes on; its
//! InitProducerId naming the old epoch (KIP-360) gets the bumped one back without a new bump.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(missing_docs)]

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use diskless_core::RecordBatchBuilder;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

mod common;
use common::{Broker, frame, free_ports, response};

const NONE: i16 = 0;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const PRODUCER_FENCED: i16 = 90;
const TOPIC: &str = "late";
const TID: &str = "late-tid";

struct Client {
    stream: TcpStream,
    id: i32,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client { stream, id: 0 }
    }

    fn call<R>(&mut self, version: i16, request: &R) -> R::Response
    where
        R: Request + Encodable + HeaderVersion,
        R::Response: Decodable + HeaderVersion,
    {
        self.id += 1;
        let api = ApiKey::try_from(R::KEY).unwrap();
        let bytes = frame(api, version, self.id, "txn-timeout-test", request);
        self.stream.write_all(&bytes).unwrap();
        response(&mut self.stream, version, self.id)
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A transactional batch of one record with Produce v12 (no AddPartitionsToTxn before it).
fn produce_v12(c: &mut Client, pid: i64, epoch: i16) -> i16 {
    let batch = RecordBatchBuilder::new()
        .producer(pid, epoch, 0)
        .transactional(true)
        .record(1_700_000_000_000, None, Some(b"v"))
        .build()
        .unwrap();
    let mut p = PartitionProduceData::default();
    p.index = 0;
    p.records = Some(Bytes::copy_from_slice(batch.as_bytes()));
    let mut t = TopicProduceData::default();
    t.name = TopicName(s(TOPIC));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.transactional_id = Some(TransactionalId(s(TID)));
    r.acks = -1;
    r.timeout_ms = 30_000;
    r.topic_data = vec![t];
    let a: ProduceResponse = c.call(12, &r);
    a.responses[0].partition_responses[0].error_code
}

/// EndTxn v5: (error, producer id, epoch of the next transaction).
fn end_v5(c: &mut Client, pid: i64, epoch: i16, commit: bool) -> (i16, i64, i16) {
    let mut r = EndTxnRequest::default();
    r.transactional_id = TransactionalId(s(TID));
    r.producer_id = ProducerId(pid);
    r.producer_epoch = epoch;
    r.committed = commit;
    let a: EndTxnResponse = c.call(5, &r);
    (a.error_code, a.producer_id.0, a.producer_epoch)
}

/// DescribeTransactions: (state, producer id, epoch).
fn describe(c: &mut Client) -> (String, i64, i16) {
    let mut r = DescribeTransactionsRequest::default();
    r.transactional_ids = vec![TransactionalId(s(TID))];
    let a: DescribeTransactionsResponse = c.call(0, &r);
    let t = &a.transaction_states[0];
    assert_eq!(t.error_code, NONE);
    (
        t.transaction_state.as_str().to_string(),
        t.producer_id.0,
        t.producer_epoch,
    )
}

#[test]
fn a_tv2_producers_late_end_txn_after_a_timeout_abort_follows_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(1);
    // The default finalized `transaction.version` is 2.
    let broker = Broker::start(&dir.path().join("data"), &ports, 1, &[]);
    let mut c = Client::connect(ports[0]);

    let mut topic = CreatableTopic::default();
    topic.name = TopicName(s(TOPIC));
    topic.num_partitions = 1;
    topic.replication_factor = -1;
    let mut create = CreateTopicsRequest::default();
    create.topics = vec![topic];
    create.timeout_ms = 30_000;
    let created: CreateTopicsResponse = c.call(5, &create);
    assert_eq!(created.topics[0].error_code, NONE);

    let mut r = InitProducerIdRequest::default();
    r.transactional_id = Some(TransactionalId(s(TID)));
    r.transaction_timeout_ms = 1_000;
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    let a: InitProducerIdResponse = c.call(5, &r);
    assert_eq!((a.error_code, a.producer_epoch), (NONE, 0));
    let pid = a.producer_id.0;

    // A transaction at epoch 0, left open past its timeout: the sweeper aborts it.
    assert_eq!(produce_v12(&mut c, pid, 0), NONE);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (state, _, _) = describe(&mut c);
        if state == "CompleteAbort" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the transaction was not aborted on timeout (state {state}):\n{}",
            broker.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // One bump, as every end of transaction version 2 (not two: KAFKA-19367).
    assert_eq!(describe(&mut c), ("CompleteAbort".to_string(), pid, 1));

    // The producer's late EndTxn with its old epoch: COMMIT is fenced, ABORT is a retry of the
    // coordinator's abort and answers the epoch of the next transaction.
    assert_eq!(end_v5(&mut c, pid, 0, true).0, PRODUCER_FENCED);
    assert_eq!(end_v5(&mut c, pid, 0, false), (NONE, pid, 1));
    assert_eq!(end_v5(&mut c, pid, 0, false), (NONE, pid, 1));
    // InitProducerId naming the old epoch (KIP-360) is the retry of the bump: the abort of
    // version 2 remembered it (`lastProducerEpoch`), so the same epoch comes back, no bump.
    let mut r = InitProducerIdRequest::default();
    r.transactional_id = Some(TransactionalId(s(TID)));
    r.transaction_timeout_ms = 60_000;
    r.producer_id = ProducerId(pid);
    r.producer_epoch = 0;
    let a: InitProducerIdResponse = c.call(5, &r);
    assert_eq!(
        (a.error_code, a.producer_id.0, a.producer_epoch),
        (NONE, pid, 1)
    );
    // The old epoch writes nothing; the producer goes on at the bumped one.
    assert_eq!(produce_v12(&mut c, pid, 0), INVALID_PRODUCER_EPOCH);
    assert_eq!(produce_v12(&mut c, pid, 1), NONE);
    assert_eq!(end_v5(&mut c, pid, 1, true), (NONE, pid, 2));
    assert_eq!(describe(&mut c), ("CompleteCommit".to_string(), pid, 2));
    drop(c);
    broker.stop();
}
