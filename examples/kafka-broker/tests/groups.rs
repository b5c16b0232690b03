//! Consumer groups of the example broker as Kafka keeps them.
//!
//! - With hand-built frames (always run): a group's generation and members survive a broker
//!   restart (SIGTERM, start again on the same data directory): the first OffsetCommit and
//!   Heartbeat after it, with the old generation and member id, succeed; KIP-394 member ids
//!   (`MEMBER_ID_REQUIRED`); static membership (KIP-345: a rejoin keeps the assignment without a new
//!   generation, the old member id is fenced, LeaveGroup v3 removes members by instance id);
//!   OffsetDelete (`GROUP_SUBSCRIBED_TO_TOPIC` for a topic the group consumes, `GROUP_ID_NOT_FOUND`,
//!   `UNKNOWN_TOPIC_OR_PARTITION`), DeleteGroups (`NON_EMPTY_GROUP`).
//! - With confluent-kafka (`python-tests/groups.py`): a consumer keeps reading and committing
//!   across a broker restart without a rebalance and without reading a record twice; a static member
//!   restarts without a rebalance of the other; the admin client's list/describe/delete of consumer
//!   groups. Without python3 + confluent_kafka these print `skipped: ...` and pass, unless
//!   `DISKLESS_REQUIRE_KAFKA_CLIENTS=1`.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.
#![allow(clippy::print_stdout)] // The skip notice and the client script's output.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolSubscription, CreateTopicsRequest, CreateTopicsResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, RequestHeader, ResponseHeader,
    SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

mod common;
use common::{Broker, available, free_ports, python_clients_missing};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python-tests/groups.py");

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_INSTANCE_ID: i16 = 82;
const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;

// ---------------------------------------------------------------------------------------------
// Hand-built requests

/// One connection speaking the Kafka protocol (the client side of `kafka-protocol`).
struct Client {
    stream: TcpStream,
    correlation_id: i32,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            correlation_id: 0,
        }
    }

    fn call<R>(&mut self, version: i16, request: &R) -> R::Response
    where
        R: Request + Encodable + HeaderVersion,
        R::Response: Decodable + HeaderVersion,
    {
        self.correlation_id += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = R::KEY;
        header.request_api_version = version;
        header.correlation_id = self.correlation_id;
        header.client_id = Some(StrBytes::from_static_str("groups-test"));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        header.encode(&mut buf, R::header_version(version)).unwrap();
        request.encode(&mut buf, version).unwrap();
        let len = i32::try_from(buf.len() - 4).unwrap();
        buf[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).unwrap();
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; usize::try_from(i32::from_be_bytes(len)).unwrap()];
        self.stream.read_exact(&mut body).unwrap();
        let mut body = Bytes::from(body);
        let header =
            ResponseHeader::decode(&mut body, R::Response::header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation_id);
        let response = R::Response::decode(&mut body, version).unwrap();
        assert!(!body.has_remaining(), "{:?}: bytes left", R::KEY);
        response
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create_topic(client: &mut Client, name: &str, partitions: i32) {
    let mut topic = CreatableTopic::default();
    topic.name = TopicName(s(name));
    topic.num_partitions = partitions;
    topic.replication_factor = -1;
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![topic];
    request.timeout_ms = 30_000;
    let response: CreateTopicsResponse = client.call(5, &request);
    assert_eq!(response.topics[0].error_code, NONE, "{response:?}");
}

/// The consumer protocol's subscription metadata (version 1) of `topics`.
fn subscription(topics: &[&str]) -> Bytes {
    let mut sub = ConsumerProtocolSubscription::default();
    sub.topics = topics.iter().map(|t| s(t)).collect();
    let mut buf = BytesMut::new();
    buf.put_i16(1);
    sub.encode(&mut buf, 1).unwrap();
    buf.freeze()
}

fn join(
    client: &mut Client,
    group: &str,
    member_id: &str,
    instance: Option<&str>,
    topics: &[&str],
) -> JoinGroupResponse {
    let mut protocol = JoinGroupRequestProtocol::default();
    protocol.name = s("range");
    protocol.metadata = subscription(topics);
    let mut request = JoinGroupRequest::default();
    request.group_id = GroupId(s(group));
    request.session_timeout_ms = 30_000;
    request.rebalance_timeout_ms = 10_000;
    request.member_id = s(member_id);
    request.group_instance_id = instance.map(s);
    request.protocol_type = s("consumer");
    request.protocols = vec![protocol];
    client.call(5, &request)
}

fn sync(
    client: &mut Client,
    group: &str,
    generation: i32,
    member_id: &str,
    instance: Option<&str>,
    assignments: &[(&str, &[u8])],
) -> SyncGroupResponse {
    let mut request = SyncGroupRequest::default();
    request.group_id = GroupId(s(group));
    request.generation_id = generation;
    request.member_id = s(member_id);
    request.group_instance_id = instance.map(s);
    request.assignments = assignments
        .iter()
        .map(|(id, a)| {
            let mut x = SyncGroupRequestAssignment::default();
            x.member_id = s(id);
            x.assignment = Bytes::copy_from_slice(a);
            x
        })
        .collect();
    client.call(3, &request)
}

fn heartbeat(
    client: &mut Client,
    group: &str,
    generation: i32,
    member_id: &str,
    instance: Option<&str>,
) -> i16 {
    let mut request = HeartbeatRequest::default();
    request.group_id = GroupId(s(group));
    request.generation_id = generation;
    request.member_id = s(member_id);
    request.group_instance_id = instance.map(s);
    let response: HeartbeatResponse = client.call(3, &request);
    response.error_code
}

/// OffsetCommit of one partition; its error code.
fn commit(
    client: &mut Client,
    group: &str,
    generation: i32,
    member_id: &str,
    topic: &str,
    offset: i64,
) -> i16 {
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = offset;
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(s(topic));
    t.partitions = vec![p];
    let mut request = OffsetCommitRequest::default();
    request.group_id = GroupId(s(group));
    request.generation_id_or_member_epoch = generation;
    request.member_id = s(member_id);
    request.topics = vec![t];
    let response: OffsetCommitResponse = client.call(7, &request);
    response.topics[0].partitions[0].error_code
}

/// One member joins `group` (KIP-394: its first JoinGroup gets MEMBER_ID_REQUIRED) and syncs;
/// returns (member id, generation).
fn lone_member(client: &mut Client, group: &str, topics: &[&str]) -> (String, i32) {
    let first = join(client, group, "", None, topics);
    assert_eq!(first.error_code, MEMBER_ID_REQUIRED, "{first:?}");
    assert!(first.member_id.as_str().starts_with("groups-test-"));
    let member_id = first.member_id.as_str().to_string();
    let joined = join(client, group, &member_id, None, topics);
    assert_eq!(joined.error_code, NONE, "{joined:?}");
    assert_eq!(joined.member_id.as_str(), member_id);
    assert_eq!(joined.leader.as_str(), member_id);
    let synced = sync(
        client,
        group,
        joined.generation_id,
        &member_id,
        None,
        &[(&member_id, b"assignment")],
    );
    assert_eq!(synced.error_code, NONE);
    assert_eq!(&synced.assignment[..], b"assignment");
    (member_id, joined.generation_id)
}

#[test]
fn group_state_survives_a_restart_and_static_members_and_admin_apis_follow_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let ports = free_ports(1);
    let broker = Broker::start(&data_dir, &ports, 1, &[]);
    let mut c = Client::connect(ports[0]);
    create_topic(&mut c, "t-consumed", 1);
    create_topic(&mut c, "t-other", 1);

    // A dynamic member commits, the broker restarts, the member commits with the same generation.
    let (member, dyn_generation) = lone_member(&mut c, "durable", &["t-consumed"]);
    assert_eq!(
        commit(&mut c, "durable", dyn_generation, &member, "t-consumed", 10),
        NONE
    );
    assert_eq!(
        commit(&mut c, "durable", dyn_generation, &member, "t-other", 3),
        NONE
    );

    // Two static members.
    let a = join(&mut c, "static", "", Some("inst-a"), &["t-consumed"]);
    assert_eq!(
        a.error_code, NONE,
        "a static member needs no MEMBER_ID_REQUIRED: {a:?}"
    );
    let a_id = a.member_id.as_str().to_string();
    assert!(a_id.starts_with("inst-a-"), "{a_id}");
    let synced = sync(
        &mut c,
        "static",
        a.generation_id,
        &a_id,
        Some("inst-a"),
        &[(&a_id, b"A")],
    );
    assert_eq!(synced.error_code, NONE);
    let mut c2 = Client::connect(ports[0]);
    let b_thread = {
        let mut c2b = Client::connect(ports[0]);
        std::thread::spawn(move || join(&mut c2b, "static", "", Some("inst-b"), &["t-consumed"]))
    };
    // a rejoins for the rebalance b's arrival started (as its heartbeat would tell it).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        heartbeat(&mut c2, "static", a.generation_id, &a_id, Some("inst-a")),
        27, // REBALANCE_IN_PROGRESS
    );
    let a2 = join(&mut c2, "static", &a_id, Some("inst-a"), &["t-consumed"]);
    let b = b_thread.join().unwrap();
    assert_eq!((a2.error_code, b.error_code), (NONE, NONE));
    assert_eq!(a2.generation_id, b.generation_id);
    let generation = a2.generation_id;
    let b_id = b.member_id.as_str().to_string();
    let (leader, leader_instance, follower, follower_instance) = if a2.leader.as_str() == a_id {
        (&a_id, "inst-a", &b_id, "inst-b")
    } else {
        (&b_id, "inst-b", &a_id, "inst-a")
    };
    let follower_thread = {
        let mut c3 = Client::connect(ports[0]);
        let follower = follower.clone();
        let instance = follower_instance.to_string();
        std::thread::spawn(move || {
            sync(
                &mut c3,
                "static",
                generation,
                &follower,
                Some(&instance),
                &[],
            )
        })
    };
    let synced = sync(
        &mut c,
        "static",
        generation,
        leader,
        Some(leader_instance),
        &[
            (leader.as_str(), b"LEADER"),
            (follower.as_str(), b"FOLLOWER"),
        ],
    );
    assert_eq!(synced.error_code, NONE);
    assert_eq!(&follower_thread.join().unwrap().assignment[..], b"FOLLOWER");

    // OffsetDelete: a consumed topic's offsets stay while the group has members.
    let mut request = OffsetDeleteRequest::default();
    request.group_id = GroupId(s("durable"));
    request.topics = ["t-consumed", "t-other", "t-missing"]
        .iter()
        .map(|name| {
            let mut t = OffsetDeleteRequestTopic::default();
            t.name = TopicName(s(name));
            let mut p = OffsetDeleteRequestPartition::default();
            p.partition_index = 0;
            t.partitions = vec![p];
            t
        })
        .collect();
    let response: OffsetDeleteResponse = c.call(0, &request);
    assert_eq!(response.error_code, NONE);
    let codes: Vec<(String, i16)> = response
        .topics
        .iter()
        .map(|t| (t.name.as_str().to_string(), t.partitions[0].error_code))
        .collect();
    assert_eq!(
        codes,
        vec![
            ("t-consumed".to_string(), GROUP_SUBSCRIBED_TO_TOPIC),
            ("t-other".to_string(), NONE),
            ("t-missing".to_string(), UNKNOWN_TOPIC_OR_PARTITION),
        ]
    );
    request.group_id = GroupId(s("nobody"));
    let response: OffsetDeleteResponse = c.call(0, &request);
    assert_eq!(response.error_code, GROUP_ID_NOT_FOUND);
    let mut delete = DeleteGroupsRequest::default();
    delete.groups_names = vec![GroupId(s("durable")), GroupId(s("nobody"))];
    let response: DeleteGroupsResponse = c.call(2, &delete);
    let codes: Vec<i16> = response.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND]);

    // Restart.
    drop((c, c2));
    broker.stop();
    let broker = Broker::start(&data_dir, &ports, 2, &[]);
    let mut c = Client::connect(ports[0]);
    // The dynamic member: its heartbeat and commit with the old generation succeed.
    assert_eq!(
        heartbeat(&mut c, "durable", dyn_generation, &member, None),
        NONE
    );
    assert_eq!(
        commit(&mut c, "durable", dyn_generation, &member, "t-consumed", 20),
        NONE
    );
    assert_eq!(
        commit(
            &mut c,
            "durable",
            dyn_generation + 1,
            &member,
            "t-consumed",
            21
        ),
        ILLEGAL_GENERATION
    );
    // The static group too; its follower restarts (a new member id): same generation, same
    // assignment, the old leader id (so that the rejoining member does not lead), and the old
    // member id is fenced.
    assert_eq!(
        heartbeat(&mut c, "static", generation, leader, Some(leader_instance)),
        NONE
    );
    let rejoined = join(
        &mut c,
        "static",
        "",
        Some(follower_instance),
        &["t-consumed"],
    );
    assert_eq!(rejoined.error_code, NONE, "{rejoined:?}");
    assert_eq!(rejoined.generation_id, generation, "no rebalance");
    assert_eq!(rejoined.leader.as_str(), leader.as_str());
    assert!(rejoined.members.is_empty());
    let new_id = rejoined.member_id.as_str().to_string();
    assert_ne!(&new_id, follower);
    let synced = sync(
        &mut c,
        "static",
        generation,
        &new_id,
        Some(follower_instance),
        &[],
    );
    assert_eq!(
        (synced.error_code, &synced.assignment[..]),
        (NONE, &b"FOLLOWER"[..])
    );
    assert_eq!(
        heartbeat(&mut c, "static", generation, leader, Some(leader_instance)),
        NONE
    );
    assert_eq!(
        heartbeat(
            &mut c,
            "static",
            generation,
            follower,
            Some(follower_instance)
        ),
        FENCED_INSTANCE_ID
    );

    // The replaced member id was stored: it survives another restart.
    drop(c);
    broker.stop();
    let broker = Broker::start(&data_dir, &ports, 3, &[]);
    let mut c = Client::connect(ports[0]);
    assert_eq!(
        heartbeat(
            &mut c,
            "static",
            generation,
            &new_id,
            Some(follower_instance)
        ),
        NONE
    );
    assert_eq!(
        heartbeat(
            &mut c,
            "static",
            generation,
            follower,
            Some(follower_instance)
        ),
        FENCED_INSTANCE_ID
    );

    // LeaveGroup v3 removes both static members by instance id; then the group is empty and can
    // be deleted, with its offsets.
    let mut leave = LeaveGroupRequest::default();
    leave.group_id = GroupId(s("static"));
    leave.members = ["inst-a", "inst-b", "inst-unknown"]
        .iter()
        .map(|i| {
            let mut m = MemberIdentity::default();
            m.group_instance_id = Some(s(i));
            m
        })
        .collect();
    let response: LeaveGroupResponse = c.call(3, &leave);
    let codes: Vec<i16> = response.members.iter().map(|m| m.error_code).collect();
    assert_eq!(codes, vec![NONE, NONE, UNKNOWN_MEMBER_ID]);
    assert_eq!(
        heartbeat(&mut c, "static", generation, leader, None),
        UNKNOWN_MEMBER_ID
    );
    let mut delete = DeleteGroupsRequest::default();
    delete.groups_names = vec![GroupId(s("static"))];
    let response: DeleteGroupsResponse = c.call(2, &delete);
    assert_eq!(response.results[0].error_code, NONE);
    drop(c);
    broker.stop();
}

// ---------------------------------------------------------------------------------------------
// Real clients

/// Whether the client tests can run; `false` (after printing why) when they should be skipped.
fn clients_available() -> bool {
    available(python_clients_missing())
}

/// Runs one scenario of groups.py against a fresh broker; when the script prints
/// `RESTART-BROKER`, the broker is stopped (SIGTERM) and started again on the same data directory
/// and ports, and the script is told `RESTARTED`.
fn run_scenario(scenario: &str) {
    if !clients_available() {
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
    for line in stdout.lines() {
        let line = line.unwrap();
        output.push_str(&line);
        output.push('\n');
        if line.trim() == "RESTART-BROKER" {
            if let Some(b) = broker.take() {
                b.stop();
            }
            runs += 1;
            broker = Some(Broker::start(&data_dir, &ports, runs, &[]));
            stdin.write_all(b"RESTARTED\n").unwrap();
            stdin.flush().unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- groups.py {scenario} ---\n{output}{stderr}");
    let log = broker.as_ref().map(Broker::log_text).unwrap_or_default();
    assert!(
        out.status.success(),
        "groups.py {scenario} failed ({}):\n{output}\n{stderr}\n--- broker log ---\n{log}",
        out.status,
    );
    if let Some(b) = broker.take() {
        b.stop();
    }
}

#[test]
fn a_consumer_keeps_its_generation_across_a_broker_restart() {
    run_scenario("restart");
}

#[test]
fn a_static_member_restarts_without_a_rebalance() {
    run_scenario("static");
}

#[test]
fn admin_client_lists_describes_and_deletes_groups_as_on_kafka() {
    run_scenario("admin");
}
