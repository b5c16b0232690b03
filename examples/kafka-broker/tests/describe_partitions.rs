//! DescribeTopicPartitions (API 75, version 0) against the example broker, with hand-built frames,
//! checked against Kafka's semantics (`DescribeTopicPartitionsRequestHandler`,
//! `KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse`): topics in name order, an empty
//! list meaning all topics, unknown and invalid names, the partition limit with `next_cursor` and
//! following it, a bad cursor, the authorized operations of an authorizer-less broker, and leaders,
//! replicas and ISR equal to Metadata v12's for the same partitions (sharded coordinator: produce
//! gateways as leaders, also for a client naming its rack).

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use uuid::Uuid;

/// The topics every broker of these tests starts with: name and partition count.
mod common;
use common::{frame, response};

const TOPICS: [(&str, i32); 3] = [("gamma", 1), ("alpha", 3), ("beta", 5)];

/// READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11.
const TOPIC_OPERATIONS: i32 = 0b1101_1111_1000;

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const INVALID_REQUEST: i16 = 42;

struct Broker {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
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

/// A broker with three logical brokers and [`TOPICS`]; `extra` arguments (e.g. `--shards 3`).
fn start(extra: &[&str]) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let listeners: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kafka-broker"));
    cmd.arg("--data-dir")
        .arg(dir.path())
        .args(["--listeners", &listeners.join(",")])
        .args(["--coordinator", "memory://"])
        .args(extra);
    for (name, partitions) in TOPICS {
        cmd.args(["--create-topic", &format!("{name}:{partitions}")]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut broker = Broker {
        child,
        port: ports[0],
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", broker.port)).is_err() {
        assert!(broker.child.try_wait().unwrap().is_none(), "broker exited");
        assert!(Instant::now() < deadline, "broker did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    broker
}

/// A connection sending requests with one client id.
struct Client {
    stream: TcpStream,
    client_id: String,
    next_id: i32,
}

impl Client {
    fn connect(broker: &Broker, client_id: &str) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            client_id: client_id.to_string(),
            next_id: 1,
        }
    }

    fn call<Req: Encodable + HeaderVersion, Resp: Decodable + HeaderVersion>(
        &mut self,
        api: ApiKey,
        version: i16,
        body: &Req,
    ) -> Resp {
        let id = self.next_id;
        self.next_id += 1;
        self.stream
            .write_all(&frame(api, version, id, &self.client_id, body))
            .unwrap();
        response(&mut self.stream, version, id)
    }

    fn describe(
        &mut self,
        topics: &[&str],
        limit: i32,
        cursor: Option<(&str, i32)>,
    ) -> DescribeTopicPartitionsResponse {
        let mut request = DescribeTopicPartitionsRequest::default();
        request.topics = topics
            .iter()
            .map(|t| {
                let mut r = TopicRequest::default();
                r.name = name(t);
                r
            })
            .collect();
        request.response_partition_limit = limit;
        request.cursor = cursor.map(|(topic, partition)| {
            let mut c = Cursor::default();
            c.topic_name = name(topic);
            c.partition_index = partition;
            c
        });
        self.call(ApiKey::DescribeTopicPartitions, 0, &request)
    }

    fn metadata(&mut self) -> MetadataResponse {
        let mut request = MetadataRequest::default();
        request.topics = Some(
            TOPICS
                .iter()
                .map(|(t, _)| {
                    let mut r = MetadataRequestTopic::default();
                    r.name = Some(name(t));
                    r
                })
                .collect(),
        );
        request.allow_auto_topic_creation = false;
        request.include_topic_authorized_operations = true;
        self.call(ApiKey::Metadata, 12, &request)
    }
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn topic_name(t: &DescribeTopicPartitionsResponseTopic) -> &str {
    t.name.as_ref().unwrap().as_str()
}

/// `(topic, partition)` of every partition in a response, in order.
fn partitions_of(r: &DescribeTopicPartitionsResponse) -> Vec<(String, i32)> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (topic_name(t).to_string(), p.partition_index))
        })
        .collect()
}

fn cursor_of(r: &DescribeTopicPartitionsResponse) -> Option<(String, i32)> {
    r.next_cursor
        .as_ref()
        .map(|c| (c.topic_name.as_str().to_string(), c.partition_index))
}

/// Every partition of [`TOPICS`] in name order.
fn all_partitions() -> Vec<(String, i32)> {
    let mut topics = TOPICS.to_vec();
    topics.sort();
    topics
        .iter()
        .flat_map(|(t, n)| (0..*n).map(|p| (t.to_string(), p)))
        .collect()
}

fn topic_ids(client: &mut Client) -> BTreeMap<String, Uuid> {
    client
        .metadata()
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().as_str().to_string(), t.topic_id))
        .collect()
}

#[test]
fn an_empty_topic_list_describes_every_topic_in_name_order() {
    let broker = start(&[]);
    let mut client = Client::connect(&broker, "describe-test");
    let ids = topic_ids(&mut client);
    // ApiVersions announces version 0 only.
    let versions: ApiVersionsResponse =
        client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let api = versions
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::DescribeTopicPartitions as i16)
        .expect("DescribeTopicPartitions announced");
    assert_eq!((api.min_version, api.max_version), (0, 0));

    let r = client.describe(&[], 2000, None);
    assert!(r.topics.iter().all(|t| t.error_code == 0));
    let names: Vec<&str> = r.topics.iter().map(topic_name).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    assert_eq!(partitions_of(&r), all_partitions());
    assert_eq!(r.next_cursor, None);
    for t in &r.topics {
        assert_eq!(t.topic_id, ids[topic_name(t)], "{}", topic_name(t));
        assert!(!t.topic_id.is_nil());
        assert!(!t.is_internal);
        assert_eq!(t.topic_authorized_operations, TOPIC_OPERATIONS);
        for p in &t.partitions {
            assert_eq!(p.error_code, 0);
            assert_eq!(p.eligible_leader_replicas, Some(vec![]));
            assert_eq!(p.last_known_elr, Some(vec![]));
            assert!(p.offline_replicas.is_empty());
            assert!(p.replica_nodes.contains(&p.leader_id));
        }
    }
    // A limit above Kafka's max.request.partition.size.limit is capped (at 2000, far above 9).
    let r = client.describe(&[], i32::MAX, None);
    assert_eq!(partitions_of(&r), all_partitions());
}

#[test]
fn named_topics_unknown_topics_and_invalid_names() {
    let broker = start(&[]);
    let mut client = Client::connect(&broker, "describe-test");
    let ids = topic_ids(&mut client);

    let r = client.describe(&["beta"], 2000, None);
    assert_eq!(r.topics.len(), 1);
    let beta = &r.topics[0];
    assert_eq!((topic_name(beta), beta.error_code), ("beta", 0));
    assert_eq!(beta.topic_id, ids["beta"]);
    let indexes: Vec<i32> = beta.partitions.iter().map(|p| p.partition_index).collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4]);

    // Sorted by name, duplicates once, errors in place; error topics carry the operations too.
    let r = client.describe(
        &[
            "zz-unknown",
            "beta",
            "bad name!",
            "beta",
            "__consumer_offsets",
        ],
        2000,
        None,
    );
    let got: Vec<(&str, i16, usize)> = r
        .topics
        .iter()
        .map(|t| (topic_name(t), t.error_code, t.partitions.len()))
        .collect();
    assert_eq!(
        got,
        [
            ("__consumer_offsets", UNKNOWN_TOPIC_OR_PARTITION, 0),
            ("bad name!", INVALID_TOPIC_EXCEPTION, 0),
            ("beta", 0, 5),
            ("zz-unknown", UNKNOWN_TOPIC_OR_PARTITION, 0),
        ]
    );
    for t in &r.topics {
        assert_eq!(t.topic_authorized_operations, TOPIC_OPERATIONS);
        if t.error_code != 0 {
            assert!(t.topic_id.is_nil());
        }
    }
    assert!(r.topics[0].is_internal, "Kafka's Topic.isInternal");
    assert!(!r.topics[1].is_internal);
    assert_eq!(r.next_cursor, None);

    // Errors do not count against the limit.
    let r = client.describe(&["aa-unknown", "alpha"], 3, None);
    let got: Vec<(&str, i16, usize)> = r
        .topics
        .iter()
        .map(|t| (topic_name(t), t.error_code, t.partitions.len()))
        .collect();
    assert_eq!(
        got,
        [
            ("aa-unknown", UNKNOWN_TOPIC_OR_PARTITION, 0),
            ("alpha", 0, 3)
        ]
    );
    assert_eq!(r.next_cursor, None);
}

#[test]
fn the_partition_limit_cuts_the_list_and_the_cursor_resumes_it() {
    let broker = start(&[]);
    let mut client = Client::connect(&broker, "describe-test");

    // alpha 0-2 and beta 0: cut inside beta.
    let r = client.describe(&[], 4, None);
    assert_eq!(
        partitions_of(&r),
        [("alpha", 0), ("alpha", 1), ("alpha", 2), ("beta", 0)].map(|(t, p)| (t.to_string(), p))
    );
    assert_eq!(cursor_of(&r), Some(("beta".to_string(), 1)));

    // From beta 1: beta 1-4 uses the limit up exactly, so the cursor is gamma's first partition.
    let r = client.describe(&[], 4, Some(("beta", 1)));
    let names: Vec<&str> = r.topics.iter().map(topic_name).collect();
    assert_eq!(names, ["beta"], "topics before the cursor's are left out");
    assert_eq!(
        partitions_of(&r),
        [1, 2, 3, 4].map(|p| ("beta".to_string(), p))
    );
    assert_eq!(cursor_of(&r), Some(("gamma".to_string(), 0)));

    let r = client.describe(&[], 4, Some(("gamma", 0)));
    assert_eq!(partitions_of(&r), [("gamma".to_string(), 0)]);
    assert_eq!(r.next_cursor, None);

    // Following the cursor page by page yields every partition once, in order; a limit below 1
    // counts as 1.
    for limit in [-5, 0, 1, 2, 3, 7] {
        let mut seen = Vec::new();
        let mut cursor: Option<(String, i32)> = None;
        for _ in 0..20 {
            let r = client.describe(&[], limit, cursor.as_ref().map(|(t, p)| (t.as_str(), *p)));
            let page = partitions_of(&r);
            assert!(page.len() <= limit.max(1) as usize, "limit {limit}");
            seen.extend(page);
            cursor = cursor_of(&r);
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(cursor, None, "limit {limit}");
        assert_eq!(seen, all_partitions(), "limit {limit}");
    }

    // With a topic list: the same paging over the named topics only.
    let r = client.describe(&["gamma", "beta"], 2, Some(("beta", 3)));
    assert_eq!(
        partitions_of(&r),
        [("beta".to_string(), 3), ("beta".to_string(), 4)]
    );
    assert_eq!(cursor_of(&r), Some(("gamma".to_string(), 0)));

    // A cursor past a topic's last partition describes none of it.
    let r = client.describe(&["alpha", "gamma"], 10, Some(("alpha", 9)));
    let got: Vec<(&str, usize)> = r
        .topics
        .iter()
        .map(|t| (topic_name(t), t.partitions.len()))
        .collect();
    assert_eq!(got, [("alpha", 0), ("gamma", 1)]);
    assert_eq!(r.next_cursor, None);

    // A cursor topic missing from the topic list, or a negative cursor partition, fails the
    // request: every requested topic is INVALID_REQUEST, in request order.
    for (cursor, topics) in [
        (("beta", 0), ["gamma", "alpha"]),
        (("alpha", -1), ["gamma", "alpha"]),
    ] {
        let r = client.describe(&topics, 10, Some(cursor));
        let got: Vec<(&str, i16, usize)> = r
            .topics
            .iter()
            .map(|t| (topic_name(t), t.error_code, t.partitions.len()))
            .collect();
        assert_eq!(
            got,
            [("gamma", INVALID_REQUEST, 0), ("alpha", INVALID_REQUEST, 0)],
            "{cursor:?}"
        );
        assert_eq!(r.next_cursor, None);
    }
}

/// A partition's leader, replicas, ISR and leader epoch.
type PartitionView = (BrokerId, Vec<BrokerId>, Vec<BrokerId>, i32);

/// Leaders, replicas, ISR and leader epochs equal Metadata v12's, for a client without and with a
/// rack in its client id; `spread`: the leaders of a client without a rack are not all one broker.
fn assert_agrees_with_metadata(broker: &Broker, spread: bool) {
    for client_id in ["describe-test", "describe-test,diskless_rack_id=rack-2"] {
        let mut client = Client::connect(broker, client_id);
        let metadata = client.metadata();
        let mut expected: BTreeMap<(String, i32), PartitionView> = BTreeMap::new();
        for t in &metadata.topics {
            assert_eq!(t.error_code, 0);
            // Asked for: every topic operation, as DescribeTopicPartitions answers them.
            assert_eq!(t.topic_authorized_operations, TOPIC_OPERATIONS);
            for p in &t.partitions {
                expected.insert(
                    (
                        t.name.as_ref().unwrap().as_str().to_string(),
                        p.partition_index,
                    ),
                    (
                        p.leader_id,
                        p.replica_nodes.clone(),
                        p.isr_nodes.clone(),
                        p.leader_epoch,
                    ),
                );
            }
        }
        assert_eq!(expected.len(), all_partitions().len());
        // Paged (limit 2), so the cursor's partitions are checked too.
        let mut got = BTreeMap::new();
        let mut cursor: Option<(String, i32)> = None;
        loop {
            let r = client.describe(&[], 2, cursor.as_ref().map(|(t, p)| (t.as_str(), *p)));
            for t in &r.topics {
                for p in &t.partitions {
                    got.insert(
                        (topic_name(t).to_string(), p.partition_index),
                        (
                            p.leader_id,
                            p.replica_nodes.clone(),
                            p.isr_nodes.clone(),
                            p.leader_epoch,
                        ),
                    );
                }
            }
            cursor = cursor_of(&r);
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(got, expected, "client id {client_id}");
        let leaders: std::collections::BTreeSet<i32> = got.values().map(|v| v.0.0).collect();
        if client_id.contains("rack-2") {
            // The client's rack was taken into account (node 2 is rack-2's only broker).
            assert_eq!(leaders, [2].into(), "client id {client_id}");
        } else if spread {
            assert!(leaders.len() > 1, "leaders {leaders:?}");
        }
    }
}

#[test]
fn leaders_equal_metadata_v12() {
    let broker = start(&[]);
    assert_agrees_with_metadata(&broker, true);
}

#[test]
fn leaders_equal_metadata_v12_with_a_sharded_coordinator() {
    let broker = start(&["--shards", "3"]);
    assert_agrees_with_metadata(&broker, false);
}
