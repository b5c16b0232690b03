//! Tiered segments through the example broker (issue 15): a topic with a short `segment.ms` is
//! consolidated by the broker's tiering worker while it runs; ListOffsets `-5` (LATEST_TIERED) and
//! `-4` (EARLIEST_LOCAL) report the tier boundary; a Fetch from offset 0 reads every record once,
//! in order, across the boundary (segments first, then WAL batches); ListOffsets by timestamp finds
//! a record inside a segment; the same after a restart with `--local-cache-dir` (twice: the second
//! start reads blocks the first one left on disk). With hand-built requests (kafka-protocol's
//! client side), so it needs no client installed. The second test runs the real clients of
//! `python-tests/tiering.py` (kcat, confluent-kafka) across the boundary; it prints
//! `skipped: ...` without them unless `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The client script's output.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    Broker, Conn, available, create_topic, free_ports, kcat_missing, python_clients_missing,
    run_python,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

const TOPIC: &str = "tiered";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/tiering.py");
/// Records per produced batch.
const PER_BATCH: i64 = 10;
/// Batches produced before waiting for the first segments, and again after.
const BATCHES: i64 = 30;
/// The first record's timestamp; record `o` has `BASE_TS + o`.
const BASE_TS: i64 = 1_700_000_000_000;
/// ListOffsets' LATEST_TIERED and EARLIEST_LOCAL.
const LATEST_TIERED: i64 = -5;
const EARLIEST_LOCAL: i64 = -4;
const UNSUPPORTED_VERSION: i16 = 35;
/// How long the broker may take to consolidate before the test gives up (a deadline on waiting,
/// not a timed assertion: it only bounds a hang).
const WAIT: Duration = Duration::from_secs(120);

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn value_of(offset: i64) -> Bytes {
    Bytes::from(format!("record-{offset}"))
}

/// The batch of records `first .. first + PER_BATCH` (values `record-<offset>`, timestamps
/// `BASE_TS + offset`).
fn batch(first: i64) -> Bytes {
    let records: Vec<Record> = (first..first + PER_BATCH)
        .map(|o| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: o - first,
            // kafka-protocol's encoder keeps records in one batch while their sequences are
            // consecutive (a non-idempotent batch's base sequence is -1).
            sequence: -1 + (o - first) as i32,
            timestamp: BASE_TS + o,
            key: None,
            value: Some(value_of(o)),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Produces the records `first ..` in `batches` batches, one request each.
fn produce(conn: &mut Conn, first: i64, batches: i64) {
    for b in 0..batches {
        let mut p = PartitionProduceData::default();
        p.index = 0;
        p.records = Some(batch(first + b * PER_BATCH));
        let mut t = TopicProduceData::default();
        t.name = name(TOPIC);
        t.partition_data = vec![p];
        let mut request = ProduceRequest::default();
        request.acks = -1;
        request.timeout_ms = 30_000;
        request.topic_data = vec![t];
        let response: ProduceResponse = conn.call(ApiKey::Produce, 9, &request);
        let answer = &response.responses[0].partition_responses[0];
        assert_eq!(answer.error_code, 0, "{response:?}");
        assert_eq!(answer.base_offset, first + b * PER_BATCH);
    }
}

/// ListOffsets of partition 0 at `timestamp`: (error, offset, timestamp).
fn list_offset(conn: &mut Conn, version: i16, timestamp: i64) -> (i16, i64, i64) {
    let mut q = ListOffsetsPartition::default();
    q.partition_index = 0;
    q.timestamp = timestamp;
    q.current_leader_epoch = -1;
    let mut t = ListOffsetsTopic::default();
    t.name = name(TOPIC);
    t.partitions = vec![q];
    let mut request = ListOffsetsRequest::default();
    request.replica_id = BrokerId(-1);
    request.topics = vec![t];
    let r: ListOffsetsResponse = conn.call(ApiKey::ListOffsets, version, &request);
    let p = &r.topics[0].partitions[0];
    (p.error_code, p.offset, p.timestamp)
}

/// Waits until LATEST_TIERED is at least `offset`; its answer.
fn wait_tiered(conn: &mut Conn, broker: &Broker, offset: i64) -> i64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let (error, tiered, timestamp) = list_offset(conn, 9, LATEST_TIERED);
        assert_eq!(error, 0);
        assert_eq!(timestamp, -1, "LATEST_TIERED carries no timestamp");
        if tiered >= offset {
            return tiered;
        }
        assert!(
            Instant::now() < deadline,
            "nothing up to offset {offset} was tiered (latest tiered {tiered}):\n{}",
            broker.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fetches partition 0 from offset 0 to `end`, request after request: every record once, in
/// order, with its value and timestamp.
fn fetch_all(conn: &mut Conn, broker: &Broker, end: i64) {
    let mut next = 0i64;
    let deadline = Instant::now() + WAIT;
    while next < end {
        // Small: several requests, one of them across the boundary.
        let request = common::fetch_request(TOPIC, next, 2048);
        let response: FetchResponse = conn.call(ApiKey::Fetch, 12, &request);
        let part = &response.responses[0].partitions[0];
        assert_eq!(
            part.error_code,
            0,
            "fetch at {next}: {part:?}\n{}",
            broker.log_text()
        );
        assert_eq!(part.high_watermark, end);
        let mut bytes = part.records.clone().unwrap_or_default();
        let before = next;
        if !bytes.is_empty() {
            for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
                for r in set.records {
                    // A batch starting below the fetch offset is served whole (Kafka): skip.
                    if r.offset < next {
                        continue;
                    }
                    assert_eq!(r.offset, next, "records in order, none missing");
                    assert_eq!(r.value.as_ref(), Some(&value_of(next)), "offset {next}");
                    assert_eq!(r.timestamp, BASE_TS + next, "offset {next}");
                    next += 1;
                }
            }
        }
        assert!(
            next > before || Instant::now() < deadline,
            "no progress at offset {next}:\n{}",
            broker.log_text()
        );
    }
    assert_eq!(next, end);
}

/// The record inside the tiered part found by its timestamp.
fn timestamp_lookup(conn: &mut Conn, tiered: i64) {
    let inside = tiered / 2 + 3;
    assert_eq!(
        list_offset(conn, 9, BASE_TS + inside),
        (0, inside, BASE_TS + inside)
    );
    assert_eq!(list_offset(conn, 9, -2), (0, 0, -1), "EARLIEST");
}

/// `GET /metrics` from the broker's `--metrics-addr`.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

/// Block files the disk tier holds.
fn disk_blocks(dir: &Path) -> usize {
    fn walk(dir: &Path, n: &mut usize) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, n);
            } else if path.extension().is_some_and(|x| x == "blk") {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(dir, &mut n);
    n
}

const TIERING_FLAGS: [&str; 4] = ["--tiering-interval-ms", "200", "--tiering-min-age-ms", "0"];

#[test]
fn a_topic_is_read_across_the_tier_boundary_before_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cache = dir.path().join("cache");
    let ports = free_ports(2);
    let (port, metrics_port) = (ports[0], ports[1]);
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut flags = TIERING_FLAGS.to_vec();
    flags.extend(["--metrics-addr", &metrics]);
    let broker = Broker::start(&data, &[port], 1, &flags);
    let mut conn = Conn::open(port, "tiering-test");
    // Every record becomes due 500 ms after its commit; every batch but the first indexed.
    create_topic(
        &mut conn,
        TOPIC,
        &[
            ("segment.ms", "500"),
            ("index.interval.bytes", "0"),
            // The records' timestamps are from 2023: no time retention.
            ("retention.ms", "-1"),
        ],
    );
    // Nothing tiered yet: -1; EARLIEST_LOCAL needs v8, LATEST_TIERED v9 (Kafka's versions).
    assert_eq!(list_offset(&mut conn, 9, LATEST_TIERED), (0, -1, -1));
    assert_eq!(list_offset(&mut conn, 8, EARLIEST_LOCAL), (0, 0, -1));
    assert_eq!(
        list_offset(&mut conn, 8, LATEST_TIERED).0,
        UNSUPPORTED_VERSION
    );
    assert_eq!(
        list_offset(&mut conn, 7, EARLIEST_LOCAL).0,
        UNSUPPORTED_VERSION
    );

    let half = BATCHES * PER_BATCH;
    produce(&mut conn, 0, BATCHES);
    let tiered = wait_tiered(&mut conn, &broker, half / 2);
    assert!(tiered < half, "only committed offsets are tiered: {tiered}");
    // Tiered segments end where batches end.
    assert_eq!((tiered + 1) % PER_BATCH, 0, "latest tiered {tiered}");
    let (error, local, _) = list_offset(&mut conn, 8, EARLIEST_LOCAL);
    assert_eq!(error, 0);
    assert!(
        local > tiered,
        "EARLIEST_LOCAL {local} is above LATEST_TIERED {tiered}"
    );
    produce(&mut conn, half, BATCHES);
    let end = 2 * half;
    fetch_all(&mut conn, &broker, end);
    timestamp_lookup(&mut conn, tiered);
    let text = scrape(metrics_port);
    assert!(
        text.lines()
            .any(|l| l.starts_with("diskless_lifecycle_passes_total")
                && l.contains("worker=\"tiering\"")),
        "no tiering passes in the metrics:\n{text}"
    );
    drop(conn);
    broker.stop();

    // A restart with the disk tier: the same records, now partly from segments read through it.
    let cache_arg = cache.to_str().unwrap();
    let mut flags = TIERING_FLAGS.to_vec();
    flags.extend(["--local-cache-dir", cache_arg]);
    for run in 2..=3 {
        let broker = Broker::start(&data, &[port], run, &flags);
        let mut conn = Conn::open(port, "tiering-test");
        assert!(wait_tiered(&mut conn, &broker, tiered) >= tiered);
        fetch_all(&mut conn, &broker, end);
        timestamp_lookup(&mut conn, tiered);
        drop(conn);
        broker.stop();
        assert!(
            disk_blocks(&cache) > 0,
            "run {run}: nothing in the disk tier"
        );
    }
}

#[test]
fn real_clients_read_across_the_tier_boundary() {
    if !available(python_clients_missing().or_else(kcat_missing)) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cache = dir.path().join("cache");
    let ports = free_ports(3);
    let broker = Broker::start(&data, &ports, 1, &TIERING_FLAGS);
    let bootstrap = broker.bootstrap.clone();
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &bootstrap, "--phase", "1"],
    );
    broker.stop();
    let mut flags = TIERING_FLAGS.to_vec();
    flags.extend(["--local-cache-dir", cache.to_str().unwrap()]);
    let broker = Broker::start(&data, &ports, 2, &flags);
    run_python(
        &broker,
        SCRIPT,
        &["--bootstrap", &bootstrap, "--phase", "2"],
    );
    broker.stop();
    assert!(disk_blocks(&cache) > 0, "nothing in the disk tier");
}
