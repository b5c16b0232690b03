//! A topic's `compression.type` through the example broker (issue 29): CreateTopics with a codec
//! (and a level), produce batches of other codecs, and Fetch answers batches of the topic's codec
//! holding exactly the records sent (offsets, timestamps, keys, values, headers), as Kafka's
//! `LogValidator` re-encodes them; `producer` keeps each batch's codec; a change by
//! IncrementalAlterConfigs applies to the next produce. With hand-built requests (kafka-protocol's
//! client side), so that the codec of each stored batch is visible; it needs no client installed.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed call fails the test.

mod common;

use bytes::{Bytes, BytesMut};
use common::{Broker, Conn, create_topic, free_ports};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

const BASE_TS: i64 = 1_700_000_000_000;
/// Records per produced batch.
const PER_BATCH: i64 = 5;
/// The codecs each topic is sent, one batch each, in this order.
const SENT: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];
/// Kafka's codec ids (attribute bits 0..2).
fn codec_id(c: Compression) -> i16 {
    match c {
        Compression::None => 0,
        Compression::Gzip => 1,
        Compression::Snappy => 2,
        Compression::Lz4 => 3,
        Compression::Zstd => 4,
    }
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Record `o` of any topic: key `k<o>` (none for every third), value `value <o> ...` (repeated so
/// that codecs have something to pack), a header on odd offsets, timestamp `BASE_TS + o`.
fn record(o: i64, first: i64) -> Record {
    let mut headers = IndexMap::new();
    if o % 2 == 1 {
        headers.insert(str_bytes("h"), Some(Bytes::from(format!("header-{o}"))));
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: o - first,
        sequence: -1 + (o - first) as i32,
        timestamp: BASE_TS + o,
        key: (o % 3 != 0).then(|| Bytes::from(format!("k{o}"))),
        value: Some(Bytes::from(format!("value {o} ").repeat(20))),
        headers,
    }
}

fn batch(first: i64, codec: Compression) -> Bytes {
    let records: Vec<Record> = (first..first + PER_BATCH)
        .map(|o| record(o, first))
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .unwrap();
    buf.freeze()
}

fn alter_compression(conn: &mut Conn, topic: &str, value: &str) {
    let mut config = AlterableConfig::default();
    config.name = str_bytes("compression.type");
    config.config_operation = 0; // SET
    config.value = Some(str_bytes(value));
    let mut resource = AlterConfigsResource::default();
    resource.resource_type = 2; // TOPIC
    resource.resource_name = str_bytes(topic);
    resource.configs = vec![config];
    let mut request = IncrementalAlterConfigsRequest::default();
    request.resources = vec![resource];
    let response: IncrementalAlterConfigsResponse =
        conn.call(ApiKey::IncrementalAlterConfigs, 1, &request);
    assert_eq!(response.responses[0].error_code, 0, "{response:?}");
}

/// Produces the batch of records `first ..` with `codec`; the offset it got.
fn produce(conn: &mut Conn, topic: &str, first: i64, codec: Compression) -> i64 {
    let (error, offset) = produce_v(conn, 9, topic, first, codec);
    assert_eq!(error, 0);
    offset
}

/// Produce `version` of the batch of records `first ..` with `codec`: (error, base offset).
fn produce_v(
    conn: &mut Conn,
    version: i16,
    topic: &str,
    first: i64,
    codec: Compression,
) -> (i16, i64) {
    let mut p = PartitionProduceData::default();
    p.index = 0;
    p.records = Some(batch(first, codec));
    let mut t = TopicProduceData::default();
    t.name = name(topic);
    t.partition_data = vec![p];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 30_000;
    request.topic_data = vec![t];
    let response: ProduceResponse = conn.call(ApiKey::Produce, version, &request);
    let answer = &response.responses[0].partition_responses[0];
    (answer.error_code, answer.base_offset)
}

/// Every batch of partition 0 from offset 0: (its codec id, its records).
fn fetch_all(conn: &mut Conn, topic: &str) -> Vec<(i16, Vec<Record>)> {
    let (error, batches) = fetch_v(conn, 12, topic);
    assert_eq!(error, 0);
    batches
}

/// Fetch `version` of partition 0 from offset 0: (error, its batches as in [`fetch_all`]).
fn fetch_v(conn: &mut Conn, version: i16, topic: &str) -> (i16, Vec<(i16, Vec<Record>)>) {
    let request = common::fetch_request(topic, 0, 1 << 20);
    let response: FetchResponse = conn.call(ApiKey::Fetch, version, &request);
    let part = &response.responses[0].partitions[0];
    if part.error_code != 0 {
        assert!(
            part.records.as_ref().is_none_or(Bytes::is_empty),
            "{part:?}"
        );
        return (part.error_code, Vec::new());
    }
    let mut bytes = part.records.clone().unwrap_or_default();
    let mut out = Vec::new();
    // Each v2 batch: baseOffset (8), batchLength (4), ..., attributes at byte 21.
    let mut at = 0usize;
    while at + 23 <= bytes.len() {
        let length = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let attributes = i16::from_be_bytes(bytes[at + 21..at + 23].try_into().unwrap());
        let mut one = bytes.slice(at..at + 12 + length);
        let set = RecordBatchDecoder::decode(&mut one).unwrap();
        out.push((attributes & 0x07, set.records));
        at += 12 + length;
    }
    assert_eq!(at, bytes.len(), "whole batches only");
    let _ = bytes.split_off(0);
    (0, out)
}

/// The records of the batches read back are exactly those sent (offset, timestamp, key, value,
/// headers), in order.
fn assert_records(batches: &[(i16, Vec<Record>)], count: i64) {
    let read: Vec<&Record> = batches.iter().flat_map(|(_, r)| r).collect();
    assert_eq!(read.len() as i64, count);
    for (o, r) in read.into_iter().enumerate() {
        let o = o as i64;
        let sent = record(o, o / PER_BATCH * PER_BATCH);
        assert_eq!(r.offset, o);
        assert_eq!(r.timestamp, sent.timestamp, "offset {o}");
        assert_eq!(r.key, sent.key, "offset {o}");
        assert_eq!(r.value, sent.value, "offset {o}");
        assert_eq!(r.headers, sent.headers, "offset {o}");
    }
}

#[test]
fn batches_are_stored_with_the_topics_codec_and_read_back_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1)[0];
    let broker = Broker::start(&dir.path().join("data"), &[port], 1, &[]);
    let mut conn = Conn::open(port, "topic-compression-test");
    let topics = [
        ("as-sent", "producer", None),
        ("to-none", "uncompressed", Some(0)),
        ("to-gzip", "gzip", Some(1)),
        ("to-snappy", "snappy", Some(2)),
        ("to-lz4", "lz4", Some(3)),
        ("to-zstd", "zstd", Some(4)),
    ];
    for (topic, value, _) in topics {
        create_topic(
            &mut conn,
            topic,
            &[
                ("compression.type", value),
                ("compression.gzip.level", "1"),
                ("compression.zstd.level", "10"),
                ("retention.ms", "-1"),
            ],
        );
        for (i, codec) in SENT.into_iter().enumerate() {
            let first = i as i64 * PER_BATCH;
            assert_eq!(produce(&mut conn, topic, first, codec), first);
        }
    }
    for (topic, value, stored) in topics {
        let batches = fetch_all(&mut conn, topic);
        assert_eq!(batches.len(), SENT.len(), "{topic}");
        for ((codec, _), sent) in batches.iter().zip(SENT) {
            assert_eq!(
                *codec,
                stored.unwrap_or(codec_id(sent)),
                "{topic} ({value}): a {sent:?} batch"
            );
        }
        assert_records(&batches, SENT.len() as i64 * PER_BATCH);
    }

    // A change applies to the next produce; what is stored stays as it was.
    alter_compression(&mut conn, "to-zstd", "gzip");
    let next = SENT.len() as i64 * PER_BATCH;
    assert_eq!(produce(&mut conn, "to-zstd", next, Compression::None), next);
    let batches = fetch_all(&mut conn, "to-zstd");
    let codecs: Vec<i16> = batches.iter().map(|(c, _)| *c).collect();
    assert_eq!(codecs, vec![4, 4, 4, 4, 4, 1]);
    assert_records(&batches, next + PER_BATCH);
    broker.stop();
}

/// Kafka's version rules for ZStandard: Produce v3 to v6 may not carry a ZStandard batch, and
/// Fetch v4 to v9 of a `compression.type=zstd` topic is answered UNSUPPORTED_COMPRESSION_TYPE
/// (a `producer` topic's ZStandard batches are served to them, as Kafka serves them).
#[test]
fn zstd_needs_produce_v7_and_a_zstd_topic_fetch_v10() {
    const UNSUPPORTED_COMPRESSION_TYPE: i16 = 76;
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1)[0];
    let broker = Broker::start(&dir.path().join("data"), &[port], 1, &[]);
    let mut conn = Conn::open(port, "topic-compression-test");
    create_topic(&mut conn, "zstd-topic", &[("compression.type", "zstd")]);
    create_topic(&mut conn, "any-topic", &[]);
    for topic in ["zstd-topic", "any-topic"] {
        let (error, _) = produce_v(&mut conn, 6, topic, 0, Compression::Zstd);
        assert_eq!(error, UNSUPPORTED_COMPRESSION_TYPE, "{topic}");
        assert_eq!(produce_v(&mut conn, 6, topic, 0, Compression::Gzip), (0, 0));
        assert_eq!(produce_v(&mut conn, 7, topic, 5, Compression::Zstd), (0, 5));
    }
    let (error, batches) = fetch_v(&mut conn, 9, "zstd-topic");
    assert_eq!((error, batches.len()), (UNSUPPORTED_COMPRESSION_TYPE, 0));
    let (error, batches) = fetch_v(&mut conn, 10, "zstd-topic");
    assert_eq!(error, 0);
    assert_eq!(
        batches.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        vec![4, 4]
    );
    let (error, batches) = fetch_v(&mut conn, 9, "any-topic");
    assert_eq!(error, 0);
    assert_eq!(
        batches.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        vec![1, 4]
    );
    broker.stop();
}
