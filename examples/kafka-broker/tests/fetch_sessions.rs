//! Fetch sessions (KIP-227), DescribeCluster and DescribeProducers of the example broker, with
//! hand-built requests (kafka-protocol's client side), checked against what a Kafka broker answers;
//! then real clients: a confluent-kafka consumer and the admin client's list_offsets,
//! delete_records and describe_cluster (`python-tests/admin_offsets.py`; skipped without
//! python3 + confluent_kafka unless `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`).

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use diskless_common::{Clock, SystemClock};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeProducersRequest,
    DescribeProducersResponse, FetchRequest, FetchResponse, InitProducerIdRequest,
    InitProducerIdResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

const TOPIC: &str = "sessions";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/admin_offsets.py");

const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
const UNKNOWN_TOPIC_ID: i16 = 100;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;
const MISMATCHED_ENDPOINT_TYPE: i16 = 114;

struct Broker {
    child: Child,
    log: std::path::PathBuf,
}

impl Broker {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(data_dir: &Path, ports: &[u16]) -> Broker {
    let listeners: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let log = data_dir.join("broker.log");
    let child = Command::new(env!("CARGO_BIN_EXE_kafka-broker"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listeners", &listeners.join(",")])
        .args(["--coordinator", "memory://"])
        .args(["--commit-interval-ms", "20"])
        .args(["--create-topic", &format!("{TOPIC}:2")])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut broker = Broker { child, log };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ports
        .iter()
        .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    {
        if let Ok(Some(status)) = broker.child.try_wait() {
            panic!("broker exited with {status}:\n{}", broker.log_text());
        }
        assert!(Instant::now() < deadline, "broker did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    broker
}

/// One client connection speaking the Kafka protocol.
struct Conn {
    stream: TcpStream,
    correlation: i32,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Conn {
            stream,
            correlation: 0,
        }
    }

    fn call<Req, Resp>(&mut self, api: ApiKey, version: i16, request: &Req) -> Resp
    where
        Req: Encodable,
        Resp: Decodable + HeaderVersion,
    {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(StrBytes::from_static_str("fetch-sessions-test"));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, api.request_header_version(version))
            .unwrap();
        request.encode(&mut body, version).unwrap();
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).unwrap();

        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut buf).unwrap();
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut buf, Resp::header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation);
        Resp::decode(&mut buf, version).unwrap()
    }
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A record batch of `n` records (`value-<i>`), idempotent when `producer` is `(id, epoch, seq)`.
fn batch(n: usize, producer: Option<(i64, i16, i32)>) -> Bytes {
    let now = SystemClock.now_ms();
    let (producer_id, producer_epoch, sequence) = producer.unwrap_or((-1, -1, -1));
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // Consecutive within the batch; a non-idempotent batch's base sequence is -1.
            sequence: sequence + i as i32,
            timestamp: now,
            key: None,
            value: Some(Bytes::from(format!("value-{i}"))),
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

fn produce(conn: &mut Conn, partition: i32, records: Bytes) {
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(records);
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
}

fn partition(p: i32, offset: i64) -> FetchPartition {
    let mut out = FetchPartition::default();
    out.partition = p;
    out.fetch_offset = offset;
    out.partition_max_bytes = 1 << 20;
    out.current_leader_epoch = -1;
    out.last_fetched_epoch = -1;
    out.log_start_offset = -1;
    out
}

/// A fetch of `partitions` (`(partition, offset)`) of the test topic in session `(id, epoch)`,
/// answered at once.
fn fetch_request(
    session: (i32, i32),
    partitions: &[(i32, i64)],
    forgotten: &[i32],
    topic_id: Option<uuid::Uuid>,
) -> FetchRequest {
    let mut request = FetchRequest::default();
    request.replica_id = BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = 50 << 20;
    request.session_id = session.0;
    request.session_epoch = session.1;
    if !partitions.is_empty() {
        let mut t = FetchTopic::default();
        t.topic = name(TOPIC);
        t.topic_id = topic_id.unwrap_or_default();
        t.partitions = partitions.iter().map(|&(p, o)| partition(p, o)).collect();
        request.topics = vec![t];
    }
    if !forgotten.is_empty() {
        let mut f = ForgottenTopic::default();
        f.topic = name(TOPIC);
        f.topic_id = topic_id.unwrap_or_default();
        f.partitions = forgotten.to_vec();
        request.forgotten_topics_data = vec![f];
    }
    request
}

/// (partition, error, high watermark, record count) of each partition in a response, in order.
fn summary(response: &FetchResponse) -> Vec<(i32, i16, i64, usize)> {
    response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            let mut bytes = p.records.clone().unwrap_or_default();
            let count = if bytes.is_empty() {
                0
            } else {
                RecordBatchDecoder::decode_all(&mut bytes)
                    .unwrap()
                    .iter()
                    .map(|set| set.records.len())
                    .sum()
            };
            (p.partition_index, p.error_code, p.high_watermark, count)
        })
        .collect()
}

#[test]
fn fetch_sessions_follow_kip_227() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = start(dir.path(), &[port]);
    let mut conn = Conn::open(port);
    let v = 12;

    produce(&mut conn, 0, batch(3, None));

    // A full fetch (epoch 0) opens a session and answers every partition.
    let full: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((0, 0), &[(0, 0), (1, 0)], &[], None),
    );
    assert_eq!(full.error_code, 0);
    let session = full.session_id;
    assert_ne!(session, 0, "a full fetch with epoch 0 opens a session");
    assert_eq!(summary(&full), vec![(0, 0, 3, 3), (1, 0, 0, 0)]);

    // Incremental, nothing new (partition 0 moved to its end): no partition in the answer.
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 1), &[(0, 3)], &[], None),
    );
    assert_eq!((r.error_code, r.session_id), (0, session));
    assert_eq!(summary(&r), vec![]);
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 2), &[], &[], None),
    );
    assert_eq!(
        (r.error_code, r.session_id, summary(&r)),
        (0, session, vec![])
    );

    // New records in partition 1: only it is in the incremental answer, though the request named
    // no partition (the session remembers offset 0).
    produce(&mut conn, 1, batch(2, None));
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 3), &[], &[], None),
    );
    assert_eq!((r.error_code, r.session_id), (0, session));
    assert_eq!(summary(&r), vec![(1, 0, 2, 2)]);

    // A wrong epoch (a replay of epoch 3) and an unknown session: top-level errors, no
    // partitions, session id 0; the session itself is untouched.
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 3), &[], &[], None),
    );
    assert_eq!(
        (r.error_code, r.session_id, r.responses.len()),
        (INVALID_FETCH_SESSION_EPOCH, 0, 0)
    );
    let unknown = if session == i32::MAX { 1 } else { session + 1 };
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((unknown, 1), &[], &[], None),
    );
    assert_eq!(
        (r.error_code, r.session_id, r.responses.len()),
        (FETCH_SESSION_ID_NOT_FOUND, 0, 0)
    );

    // Epoch 4 moves partition 1 past its records and forgets partition 0: new records in
    // partition 0 are then not reported; partition 1's new ones are.
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 4), &[(1, 2)], &[0], None),
    );
    assert_eq!((r.error_code, summary(&r)), (0, vec![]));
    produce(&mut conn, 0, batch(1, None));
    produce(&mut conn, 1, batch(4, None));
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 5), &[], &[], None),
    );
    assert_eq!((r.error_code, summary(&r)), (0, vec![(1, 0, 6, 4)]));

    // An incremental fetch long-polls on the whole session: it returns when records arrive.
    let mut producer = Conn::open(port);
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        produce(&mut producer, 1, batch(1, None));
    });
    let mut poll = fetch_request((session, 6), &[(1, 6)], &[], None);
    poll.max_wait_ms = 10_000;
    poll.min_bytes = 1;
    let started = Instant::now();
    let r: FetchResponse = conn.call(ApiKey::Fetch, v, &poll);
    writer.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((r.error_code, summary(&r)), (0, vec![(1, 0, 7, 1)]));

    // Epoch -1 closes the session; that request is answered sessionless, with its partitions.
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, -1), &[(0, 3)], &[], None),
    );
    assert_eq!((r.error_code, r.session_id), (0, 0));
    assert_eq!(summary(&r), vec![(0, 0, 4, 1)]);
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((session, 7), &[], &[], None),
    );
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);

    // A full fetch naming an open session replaces it.
    let a: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((0, 0), &[(0, 0)], &[], None),
    );
    let b: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((a.session_id, 0), &[(1, 0)], &[], None),
    );
    assert!(a.session_id != 0 && b.session_id != 0 && a.session_id != b.session_id);
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((a.session_id, 1), &[], &[], None),
    );
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);

    // Sessions belong to the broker that opened them (another node id has its own cache) — and
    // versions 4-6 (no session fields) are answered sessionless.
    for old in [4, 6] {
        let r: FetchResponse = conn.call(
            ApiKey::Fetch,
            old,
            &fetch_request((0, -1), &[(0, 0)], &[], None),
        );
        assert_eq!(r.session_id, 0);
        assert_eq!(summary(&r), vec![(0, 0, 4, 4)], "v{old}");
    }
    // Version 7 sessionless (librdkafka's way: session 0, epoch -1).
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        7,
        &fetch_request((0, -1), &[(1, 0)], &[], None),
    );
    assert_eq!((r.session_id, summary(&r)), (0, vec![(1, 0, 7, 7)]));

    // An unknown partition is answered in the full response (after the read ones) and kept in the
    // session: an incremental fetch repeats its error.
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((0, 0), &[(9, 0), (0, 4)], &[], None),
    );
    assert_eq!(summary(&r), vec![(0, 0, 4, 0), (9, 3, -1, 0)]);
    let r: FetchResponse = conn.call(
        ApiKey::Fetch,
        v,
        &fetch_request((r.session_id, 1), &[], &[], None),
    );
    assert_eq!(summary(&r), vec![(9, 3, -1, 0)]);

    // Topic ids (version 13+), when the broker serves them.
    let mut all = MetadataRequest::default();
    all.topics = None;
    let metadata: MetadataResponse = conn.call(ApiKey::Metadata, 12, &all);
    let topic_id = metadata
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| n.as_str()) == Some(TOPIC))
        .unwrap()
        .topic_id;
    if fetch_max_version(&mut conn) >= 13 {
        let r: FetchResponse = conn.call(
            ApiKey::Fetch,
            13,
            &fetch_request((0, 0), &[(0, 0)], &[], Some(topic_id)),
        );
        assert_eq!(r.responses[0].topic_id, topic_id);
        assert_eq!(summary(&r), vec![(0, 0, 4, 4)]);
        // The session was opened with topic ids: a request of version 12 cannot continue it.
        let e: FetchResponse = conn.call(
            ApiKey::Fetch,
            12,
            &fetch_request((r.session_id, 1), &[], &[], None),
        );
        assert_eq!(e.error_code, FETCH_SESSION_TOPIC_ID_ERROR);
        let r: FetchResponse = conn.call(
            ApiKey::Fetch,
            13,
            &fetch_request((0, -1), &[(0, 0)], &[], Some(uuid::Uuid::from_u128(7))),
        );
        assert_eq!(summary(&r), vec![(0, UNKNOWN_TOPIC_ID, -1, 0)]);
        // Versions 15 (replica state) to 17 (follower fields) read the same for a consumer.
        for version in 14..=fetch_max_version(&mut conn) {
            let r: FetchResponse = conn.call(
                ApiKey::Fetch,
                version,
                &fetch_request((0, 0), &[(0, 3)], &[], Some(topic_id)),
            );
            assert_eq!(r.responses[0].topic_id, topic_id, "v{version}");
            assert_eq!(summary(&r), vec![(0, 0, 4, 1)], "v{version}");
            let r: FetchResponse = conn.call(
                ApiKey::Fetch,
                version,
                &fetch_request((r.session_id, 1), &[(0, 4)], &[], Some(topic_id)),
            );
            assert_eq!((r.error_code, summary(&r)), (0, vec![]), "v{version}");
        }
    }
    assert!(broker_alive(&broker));
}

fn fetch_max_version(conn: &mut Conn) -> i16 {
    let r: kafka_protocol::messages::ApiVersionsResponse = conn.call(
        ApiKey::ApiVersions,
        0,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    r.api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Fetch as i16)
        .unwrap()
        .max_version
}

fn broker_alive(broker: &Broker) -> bool {
    let mut b = std::process::Command::new("kill");
    b.args(["-0", &broker.child.id().to_string()]);
    b.status().is_ok_and(|s| s.success())
}

#[test]
fn describe_cluster_and_producers_answer_as_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let _broker = start(dir.path(), &ports);
    let mut conn = Conn::open(ports[1]);

    for version in 0..=2 {
        let mut request = DescribeClusterRequest::default();
        request.include_cluster_authorized_operations = true;
        let r: DescribeClusterResponse = conn.call(ApiKey::DescribeCluster, version, &request);
        assert_eq!(r.error_code, 0);
        assert_eq!(r.cluster_id.as_str(), "diskless-example");
        assert_eq!(r.controller_id, BrokerId(1));
        // Every cluster operation, as an authorizer-less Kafka.
        assert_eq!(r.cluster_authorized_operations, 8096);
        let brokers: Vec<(i32, String, i32)> = r
            .brokers
            .iter()
            .map(|b| (b.broker_id.0, b.host.to_string(), b.port))
            .collect();
        assert_eq!(
            brokers,
            vec![
                (1, "127.0.0.1".to_string(), i32::from(ports[0])),
                (2, "127.0.0.1".to_string(), i32::from(ports[1]))
            ]
        );
        assert_eq!(r.brokers[0].rack.as_ref().unwrap().as_str(), "rack-1");
    }
    let r: DescribeClusterResponse = conn.call(
        ApiKey::DescribeCluster,
        1,
        &DescribeClusterRequest::default(),
    );
    assert_eq!(r.cluster_authorized_operations, i32::MIN, "not asked");
    let mut controllers = DescribeClusterRequest::default();
    controllers.endpoint_type = 2;
    let r: DescribeClusterResponse = conn.call(ApiKey::DescribeCluster, 1, &controllers);
    assert_eq!(r.error_code, MISMATCHED_ENDPOINT_TYPE);

    // DescribeProducers: an idempotent producer's state.
    let mut init = InitProducerIdRequest::default();
    init.transactional_id = None;
    init.transaction_timeout_ms = 60_000;
    init.producer_id = kafka_protocol::messages::ProducerId(-1);
    init.producer_epoch = -1;
    let ids: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &init);
    assert_eq!(ids.error_code, 0);
    let (pid, epoch) = (ids.producer_id.0, ids.producer_epoch);
    produce(&mut conn, 1, batch(3, Some((pid, epoch, 0))));
    produce(&mut conn, 1, batch(2, Some((pid, epoch, 3))));
    let mut topic = kafka_protocol::messages::describe_producers_request::TopicRequest::default();
    topic.name = name(TOPIC);
    topic.partition_indexes = vec![0, 1, 5];
    let mut bad = kafka_protocol::messages::describe_producers_request::TopicRequest::default();
    bad.name = name("no/such topic");
    bad.partition_indexes = vec![0];
    let mut missing = bad.clone();
    missing.name = name("missing");
    let mut request = DescribeProducersRequest::default();
    request.topics = vec![topic, bad, missing];
    let r: DescribeProducersResponse = conn.call(ApiKey::DescribeProducers, 0, &request);
    let p = &r.topics[0].partitions;
    assert_eq!((p[0].partition_index, p[0].error_code), (0, 0));
    assert!(p[0].active_producers.is_empty());
    assert_eq!((p[1].partition_index, p[1].error_code), (1, 0));
    let producers: Vec<(i64, i32, i32, i32, i64)> = p[1]
        .active_producers
        .iter()
        .map(|s| {
            (
                s.producer_id.0,
                s.producer_epoch,
                s.last_sequence,
                s.coordinator_epoch,
                s.current_txn_start_offset,
            )
        })
        .collect();
    assert_eq!(producers, vec![(pid, i32::from(epoch), 4, -1, -1)]);
    assert!(p[1].active_producers[0].last_timestamp > 0);
    assert_eq!(p[2].error_code, 3, "partition 5 does not exist");
    assert_eq!(
        r.topics[1].partitions[0].error_code, 17,
        "invalid topic name"
    );
    assert_eq!(r.topics[2].partitions[0].error_code, 3, "unknown topic");
}

/// One ListOffsets partition answer: (partition, error, offset, timestamp, leader epoch).
type Listed = (i32, i16, i64, i64, i32);

fn list_offsets(
    conn: &mut Conn,
    version: i16,
    asks: &[(&str, &[(i32, i64)])],
) -> Vec<(String, Vec<Listed>)> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let mut request = kafka_protocol::messages::ListOffsetsRequest::default();
    request.replica_id = BrokerId(-1);
    request.topics = asks
        .iter()
        .map(|(topic, partitions)| {
            let mut t = ListOffsetsTopic::default();
            t.name = name(topic);
            t.partitions = partitions
                .iter()
                .map(|&(p, ts)| {
                    let mut q = ListOffsetsPartition::default();
                    q.partition_index = p;
                    q.timestamp = ts;
                    q.current_leader_epoch = -1;
                    q
                })
                .collect();
            t
        })
        .collect();
    let r: kafka_protocol::messages::ListOffsetsResponse =
        conn.call(ApiKey::ListOffsets, version, &request);
    r.topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    (
                        p.partition_index,
                        p.error_code,
                        p.offset,
                        p.timestamp,
                        p.leader_epoch,
                    )
                })
                .collect();
            (t.name.to_string(), parts)
        })
        .collect()
}

#[test]
fn list_offsets_and_delete_records_errors_answer_as_kafka() {
    const INVALID_REQUEST: i16 = 42;
    const UNSUPPORTED_VERSION: i16 = 35;
    const UNKNOWN: i16 = 3;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = start(dir.path(), &[port]);
    let mut conn = Conn::open(port);
    produce(&mut conn, 1, batch(2, None));

    // The empty partition: earliest = latest = 0, with the leader epoch Metadata announces.
    let r = list_offsets(&mut conn, 7, &[(TOPIC, &[(0, -1)])]);
    assert_eq!(r, vec![(TOPIC.to_string(), vec![(0, 0, 0, -1, 0)])]);
    // A partition named twice: one INVALID_REQUEST answer; a topic named twice: one entry;
    // unknown partitions and topics: UNKNOWN_TOPIC_OR_PARTITION with offset, timestamp and
    // leader epoch -1.
    let r = list_offsets(
        &mut conn,
        7,
        &[
            (TOPIC, &[(0, -1), (0, -2), (1, -1)]),
            ("missing", &[(0, -1)]),
            (TOPIC, &[(9, -1)]),
        ],
    );
    assert_eq!(
        r,
        vec![
            (
                TOPIC.to_string(),
                vec![
                    (0, INVALID_REQUEST, -1, -1, -1),
                    (1, 0, 2, -1, 0),
                    (9, UNKNOWN, -1, -1, -1)
                ]
            ),
            ("missing".to_string(), vec![(0, UNKNOWN, -1, -1, -1)]),
        ]
    );
    // MAX_TIMESTAMP needs version 7: before, UNSUPPORTED_VERSION, even for an unknown topic.
    let r = list_offsets(
        &mut conn,
        6,
        &[(TOPIC, &[(1, -3)]), ("missing", &[(0, -3)])],
    );
    assert_eq!(r[0].1, vec![(1, UNSUPPORTED_VERSION, -1, -1, -1)]);
    assert_eq!(r[1].1, vec![(0, UNSUPPORTED_VERSION, -1, -1, -1)]);
    // Version 1-3 have no leader epoch (the field reads -1).
    let r = list_offsets(&mut conn, 3, &[(TOPIC, &[(1, -1)])]);
    assert_eq!(r[0].1, vec![(1, 0, 2, -1, -1)]);

    // DeleteRecords of an unknown partition or topic: UNKNOWN_TOPIC_OR_PARTITION, low watermark -1.
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    let topic = |n: &str, p: i32, offset: i64| {
        let mut q = DeleteRecordsPartition::default();
        q.partition_index = p;
        q.offset = offset;
        let mut t = DeleteRecordsTopic::default();
        t.name = name(n);
        t.partitions = vec![q];
        t
    };
    let mut request = kafka_protocol::messages::DeleteRecordsRequest::default();
    request.timeout_ms = 30_000;
    request.topics = vec![
        topic(TOPIC, 9, 0),
        topic("missing", 0, 0),
        topic(TOPIC, 1, -1),
    ];
    let r: kafka_protocol::messages::DeleteRecordsResponse =
        conn.call(ApiKey::DeleteRecords, 2, &request);
    let got: Vec<(String, i32, i16, i64)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    t.name.to_string(),
                    p.partition_index,
                    p.error_code,
                    p.low_watermark,
                )
            })
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (TOPIC.to_string(), 9, UNKNOWN, -1),
            ("missing".to_string(), 0, UNKNOWN, -1),
            (TOPIC.to_string(), 1, 0, 2),
        ]
    );
}

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
    None
}

#[test]
fn admin_client_offsets_and_a_consumer_against_the_example_broker() {
    if let Some(why) = clients_missing() {
        if std::env::var("DISKLESS_REQUIRE_KAFKA_CLIENTS").as_deref() == Ok("1") {
            panic!("DISKLESS_REQUIRE_KAFKA_CLIENTS=1 but {why}");
        }
        println!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let broker = start(dir.path(), &ports);
    let bootstrap: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("python3")
        .arg(SCRIPT)
        .args(["--bootstrap", &bootstrap.join(",")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- admin_offsets.py ---\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "admin_offsets.py failed ({}):\n{stdout}\n{stderr}\n--- broker log ---\n{}",
        out.status,
        broker.log_text()
    );
}
