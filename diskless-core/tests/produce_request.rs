//! `diskless_core::produce_request` against an independent implementation, the `kafka-protocol`
//! crate, for every version it reads: requests encoded there read the same here (records as
//! slices of the frame), answers encoded here decode the same there.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a failed step is a failed test.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use diskless_core::produce_request::{
    MAX_VERSION, MIN_VERSION, PartitionAnswer, ProduceRequest, ProduceRequestError, TopicData,
    encode_produce_response,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest as KRequest, ProduceResponse as KResponse, RequestHeader,
    ResponseHeader, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use proptest::prelude::*;

/// A topic's name and its partitions' (index, records).
type Topics = Vec<(String, Vec<(i32, Option<Vec<u8>>)>)>;

/// One request shape: client id, transactional id, acks, timeout, topics of (name, partitions of
/// (index, records)).
#[derive(Clone, Debug)]
struct Shape {
    client_id: Option<String>,
    transactional_id: Option<String>,
    acks: i16,
    timeout_ms: i32,
    topics: Topics,
}

/// The frame kafka-protocol encodes for `shape` at `version` (size first), with an unknown tagged
/// field in every flexible structure that has tagged fields.
fn their_frame(shape: &Shape, version: i16, correlation_id: i32) -> Bytes {
    let flexible = version >= 9;
    let tags = || {
        let mut t = BTreeMap::new();
        if flexible {
            t.insert(7, Bytes::from_static(b"tag"));
        }
        t
    };
    let mut header = RequestHeader::default();
    header.request_api_key = ApiKey::Produce as i16;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = shape.client_id.clone().map(StrBytes::from_string);
    header.unknown_tagged_fields = tags();
    let mut request = KRequest::default();
    request.transactional_id = shape
        .transactional_id
        .clone()
        .map(|t| TransactionalId(StrBytes::from_string(t)));
    request.acks = shape.acks;
    request.timeout_ms = shape.timeout_ms;
    request.unknown_tagged_fields = tags();
    request.topic_data = shape
        .topics
        .iter()
        .map(|(name, partitions)| {
            let mut t = TopicProduceData::default();
            t.name = TopicName(StrBytes::from_string(name.clone()));
            t.unknown_tagged_fields = tags();
            t.partition_data = partitions
                .iter()
                .map(|(index, records)| {
                    let mut p = PartitionProduceData::default();
                    p.index = *index;
                    p.records = records.clone().map(Bytes::from);
                    p.unknown_tagged_fields = tags();
                    p
                })
                .collect();
            t
        })
        .collect();
    let mut body = BytesMut::new();
    header
        .encode(&mut body, ApiKey::Produce.request_header_version(version))
        .unwrap();
    request.encode(&mut body, version).unwrap();
    let mut frame = BytesMut::new();
    frame.put_i32(i32::try_from(body.len()).unwrap());
    frame.put_slice(&body);
    frame.freeze()
}

fn check_request(shape: &Shape, version: i16) {
    let frame = their_frame(shape, version, 4242);
    let ours = ProduceRequest::parse(frame.clone()).unwrap();
    assert_eq!(ours.api_version, version);
    assert_eq!(ours.correlation_id, 4242);
    assert_eq!(ours.client_id, shape.client_id);
    assert_eq!(ours.transactional_id, shape.transactional_id);
    assert_eq!((ours.acks, ours.timeout_ms), (shape.acks, shape.timeout_ms));
    let topics: Topics = ours
        .topics
        .iter()
        .map(|TopicData { name, partitions }| {
            (
                name.clone(),
                partitions
                    .iter()
                    .map(|p| (p.index, p.records.as_ref().map(|r| r.to_vec())))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(topics, shape.topics, "version {version}");
    // The records are slices of the frame, not copies.
    let range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
    for t in &ours.topics {
        for p in &t.partitions {
            if let Some(r) = p.records.as_ref().filter(|r| !r.is_empty()) {
                assert!(range.contains(&(r.as_ptr() as usize)), "records copied");
            }
        }
    }
}

fn answers(shape: &Shape) -> Vec<(String, Vec<PartitionAnswer>)> {
    shape
        .topics
        .iter()
        .enumerate()
        .map(|(i, (name, partitions))| {
            let answers = partitions
                .iter()
                .enumerate()
                .map(|(j, (index, _))| {
                    let mut a = PartitionAnswer::new(*index, (i * 3 + j) as i16 % 90)
                        .base_offset(1_000 * i as i64 + j as i64);
                    a.log_append_time_ms = if j % 2 == 0 { -1 } else { 1_700_000_000_000 };
                    a.log_start_offset = j as i64;
                    if j % 3 == 1 {
                        a.record_errors = vec![(0, None), (2, Some(format!("bad {j}")))];
                        a.error_message = Some(format!("partition {index}"));
                    }
                    a
                })
                .collect();
            (name.clone(), answers)
        })
        .collect()
}

fn check_response(shape: &Shape, version: i16) {
    let request = ProduceRequest::parse(their_frame(shape, version, -7)).unwrap();
    let ours = answers(shape);
    let mut frame = encode_produce_response(&request, &ours);
    let size = frame.get_i32();
    assert_eq!(usize::try_from(size).unwrap(), frame.remaining());
    let header =
        ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(version))
            .unwrap();
    assert_eq!(header.correlation_id, -7);
    let response = KResponse::decode(&mut frame, version).unwrap();
    assert_eq!(frame.remaining(), 0, "version {version}: bytes left over");
    assert_eq!(response.throttle_time_ms, 0);
    assert_eq!(response.responses.len(), ours.len());
    for (theirs, (name, partitions)) in response.responses.iter().zip(&ours) {
        assert_eq!(theirs.name.0.as_str(), name);
        assert_eq!(theirs.partition_responses.len(), partitions.len());
        for (t, o) in theirs.partition_responses.iter().zip(partitions) {
            assert_eq!(
                (t.index, t.error_code, t.base_offset, t.log_append_time_ms),
                (o.index, o.error_code, o.base_offset, o.log_append_time_ms)
            );
            if version >= 5 {
                assert_eq!(t.log_start_offset, o.log_start_offset);
            }
            if version >= 8 {
                let errors: Vec<(i32, Option<String>)> = t
                    .record_errors
                    .iter()
                    .map(|e| {
                        (
                            e.batch_index,
                            e.batch_index_error_message
                                .as_ref()
                                .map(|m| m.as_str().to_string()),
                        )
                    })
                    .collect();
                assert_eq!(errors, o.record_errors);
                assert_eq!(
                    t.error_message.as_ref().map(|m| m.as_str().to_string()),
                    o.error_message
                );
            }
        }
    }
}

fn typical() -> Shape {
    Shape {
        client_id: Some("rdkafka".into()),
        transactional_id: Some("tx-1".into()),
        acks: -1,
        timeout_ms: 30_000,
        topics: vec![
            (
                "orders".into(),
                vec![(0, Some(vec![1; 300])), (3, None), (7, Some(Vec::new()))],
            ),
            ("e".repeat(249), vec![(2, Some((0..=255).collect()))]),
            ("no-partitions".into(), vec![]),
        ],
    }
}

#[test]
fn every_version_reads_as_kafka_protocol_writes_it() {
    for version in MIN_VERSION..=MAX_VERSION {
        check_request(&typical(), version);
        let empty = Shape {
            client_id: None,
            transactional_id: None,
            acks: 0,
            timeout_ms: 0,
            topics: vec![],
        };
        check_request(&empty, version);
    }
}

#[test]
fn every_version_answers_as_kafka_protocol_reads_it() {
    for version in MIN_VERSION..=MAX_VERSION {
        check_response(&typical(), version);
    }
}

#[test]
fn truncated_requests_are_malformed() {
    for version in MIN_VERSION..=MAX_VERSION {
        let frame = their_frame(&typical(), version, 1);
        for end in 8..frame.len() - 1 {
            // Cutting inside the body: either an error, or (cut inside trailing tagged fields,
            // which are read) still an error; never a panic, never the whole request.
            match ProduceRequest::parse(frame.slice(..end)) {
                Err(ProduceRequestError::Malformed(_)) => {}
                other => panic!("version {version}, {end} bytes: {other:?}"),
            }
        }
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    let records = prop::option::of(prop::collection::vec(any::<u8>(), 0..200));
    let partitions = prop::collection::vec((any::<i32>(), records), 0..4);
    let topics = prop::collection::vec(("[a-z0-9._-]{1,40}", partitions), 0..4);
    (
        prop::option::of("[ -~]{0,30}"),
        prop::option::of("[a-z0-9-]{1,30}"),
        any::<i16>(),
        any::<i32>(),
        topics,
    )
        .prop_map(
            |(client_id, transactional_id, acks, timeout_ms, topics)| Shape {
                client_id,
                transactional_id,
                acks,
                timeout_ms,
                topics,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_request_reads_and_answers_as_kafka_protocol_does(
        s in shape(),
        version in MIN_VERSION..=MAX_VERSION,
    ) {
        check_request(&s, version);
        check_response(&s, version);
    }
}
