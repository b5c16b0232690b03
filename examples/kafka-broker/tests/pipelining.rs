//! Requests pipelined on one connection take effect in order, as on a Kafka broker: two produces,
//! a DeleteRecords, a ListOffsets and a Metadata are written at once, before any answer is read;
//! the DeleteRecords must see both produces committed and the ListOffsets the new log start.
//! (Before the broker served connections in order, the DeleteRecords could run before the
//! produces committed and the ListOffsets before the DeleteRecords.)

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diskless_core::RecordBatchBuilder;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};

mod common;
use common::response;

struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &std::path::Path) -> (Broker, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_kafka-broker"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--listeners", &format!("127.0.0.1:{port}")])
        .args(["--coordinator", "memory://"])
        .args(["--create-topic", "pipelined:1"])
        // A commit interval long enough that, unordered, later requests would overtake the produces.
        .args(["--commit-interval-ms", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut broker = Broker(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(broker.0.try_wait().unwrap().is_none(), "broker exited");
        assert!(Instant::now() < deadline, "broker did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (broker, port)
}

fn frame<R: Encodable + HeaderVersion>(api: ApiKey, version: i16, id: i32, body: &R) -> Vec<u8> {
    common::frame(api, version, id, "pipelining-test", body)
}

fn produce(records: usize) -> ProduceRequest {
    let mut batch = RecordBatchBuilder::new();
    for i in 0..records {
        batch = batch.record(
            1_700_000_000_000,
            Some(b"k"),
            Some(format!("v{i}").as_bytes()),
        );
    }
    let mut partition = PartitionProduceData::default();
    partition.index = 0;
    partition.records = Some(batch.build().unwrap().into_bytes());
    let mut topic = TopicProduceData::default();
    topic.name = TopicName(StrBytes::from_static_str("pipelined"));
    topic.partition_data = vec![partition];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 30_000;
    request.topic_data = vec![topic];
    request
}

#[test]
fn pipelined_requests_take_effect_in_request_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, port) = start(dir.path());
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();

    let mut delete = DeleteRecordsRequest::default();
    let mut dp = DeleteRecordsPartition::default();
    dp.partition_index = 0;
    dp.offset = 4;
    let mut dt = DeleteRecordsTopic::default();
    dt.name = TopicName(StrBytes::from_static_str("pipelined"));
    dt.partitions = vec![dp];
    delete.topics = vec![dt];
    delete.timeout_ms = 30_000;

    let mut list = ListOffsetsRequest::default();
    list.replica_id = kafka_protocol::messages::BrokerId(-1);
    let mut lp = ListOffsetsPartition::default();
    lp.partition_index = 0;
    lp.timestamp = -2; // EARLIEST
    let mut lt = ListOffsetsTopic::default();
    lt.name = TopicName(StrBytes::from_static_str("pipelined"));
    lt.partitions = vec![lp];
    list.topics = vec![lt];

    // Everything written before anything is read.
    let mut all = Vec::new();
    all.extend(frame(ApiKey::Produce, 9, 1, &produce(3)));
    all.extend(frame(ApiKey::Produce, 9, 2, &produce(2)));
    all.extend(frame(ApiKey::DeleteRecords, 2, 3, &delete));
    all.extend(frame(ApiKey::ListOffsets, 7, 4, &list));
    all.extend(frame(ApiKey::Metadata, 12, 5, &MetadataRequest::default()));
    s.write_all(&all).unwrap();

    let first: ProduceResponse = response(&mut s, 9, 1);
    let p = &first.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset), (0, 0), "{first:?}");
    let second: ProduceResponse = response(&mut s, 9, 2);
    let p = &second.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset), (0, 3), "{second:?}");
    let deleted: DeleteRecordsResponse = response(&mut s, 2, 3);
    let d = &deleted.topics[0].partitions[0];
    assert_eq!(
        (d.error_code, d.low_watermark),
        (0, 4),
        "DeleteRecords ran after both produces committed: {deleted:?}"
    );
    let listed: ListOffsetsResponse = response(&mut s, 7, 4);
    let l = &listed.topics[0].partitions[0];
    assert_eq!(
        (l.error_code, l.offset),
        (0, 4),
        "ListOffsets saw the DeleteRecords before it: {listed:?}"
    );
    let metadata: MetadataResponse = response(&mut s, 12, 5);
    assert!(!metadata.brokers.is_empty());
}

/// `acks=0`: no response; a produce that fails closes the connection (Kafka's
/// `KafkaApis.handleProduceRequest`), the only way the client learns of it; one that succeeds
/// leaves the connection open and its records are there for the next request.
#[test]
fn a_failed_acks_zero_produce_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, port) = start(dir.path());
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();

    let mut ok = produce(2);
    ok.acks = 0;
    let mut list = ListOffsetsRequest::default();
    list.replica_id = kafka_protocol::messages::BrokerId(-1);
    let mut lp = ListOffsetsPartition::default();
    lp.partition_index = 0;
    lp.timestamp = -1; // LATEST
    let mut lt = ListOffsetsTopic::default();
    lt.name = TopicName(StrBytes::from_static_str("pipelined"));
    lt.partitions = vec![lp];
    list.topics = vec![lt];
    let mut both = frame(ApiKey::Produce, 9, 1, &ok);
    both.extend(frame(ApiKey::ListOffsets, 7, 2, &list));
    s.write_all(&both).unwrap();
    // No answer to the produce: the first answer is the ListOffsets', and it sees the records.
    let listed: ListOffsetsResponse = response(&mut s, 7, 2);
    assert_eq!(listed.topics[0].partitions[0].offset, 2, "{listed:?}");

    let mut bad = produce(1);
    bad.acks = 0;
    bad.topic_data[0].name = TopicName(StrBytes::from_static_str("no-such-topic"));
    s.write_all(&frame(ApiKey::Produce, 9, 3, &bad)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Closed: end of stream or a reset — not a read that times out on an open connection.
    let mut byte = [0u8; 1];
    let read = s.read(&mut byte);
    let closed = match &read {
        Ok(0) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        Ok(_) => false,
    };
    assert!(
        closed,
        "the broker must close the connection after a failed acks=0 produce: {read:?}"
    );
}
