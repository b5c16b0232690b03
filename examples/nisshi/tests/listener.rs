//! The listener (`src/server.rs`) over a real TCP connection: consecutive Produce requests of one
//! connection overlap (they share one WAL segment and one commit instead of one commit each),
//! take effect and are answered in request order, and a later request of another kind sees
//! their effects; Produce requests of diskless topics only skip Nisshi's codec, every version
//! answered as tansu-sans-io decodes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::{Bytes, BytesMut};
use common::{batch, node_with_args, topic};
use tansu_sans_io::{
    Body, Frame, Header, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest, ProduceResponse,
    list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic},
    produce_request::{PartitionProduceData, TopicProduceData},
    record::deflated,
};
use tansu_storage::Storage;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PRODUCE_VERSION: i16 = 9;
const LIST_OFFSETS_VERSION: i16 = 7;

fn request(api_key: i16, api_version: i16, correlation_id: i32, body: Body) -> Bytes {
    Frame::request(
        Header::Request {
            api_key,
            api_version,
            correlation_id,
            client_id: Some("listener-test".into()),
        },
        body,
    )
    .unwrap()
}

fn produce(values: &[&str]) -> Body {
    ProduceRequest::default()
        .acks(-1)
        .timeout_ms(30_000)
        .topic_data(Some(vec![
            TopicProduceData::default()
                .name("d".into())
                .partition_data(Some(vec![
                    PartitionProduceData::default()
                        .index(0)
                        .records(Some(deflated::Frame {
                            batches: vec![batch(values)],
                        })),
                ])),
        ]))
        .into()
}

async fn read_response(conn: &mut TcpStream, api_key: i16, api_version: i16) -> Frame {
    let mut size = [0u8; 4];
    conn.read_exact(&mut size).await.unwrap();
    let len = usize::try_from(i32::from_be_bytes(size)).unwrap();
    let mut frame = BytesMut::zeroed(4 + len);
    frame[..4].copy_from_slice(&size);
    conn.read_exact(&mut frame[4..]).await.unwrap();
    Frame::response_from_bytes(frame.freeze(), api_key, api_version).unwrap()
}

fn correlation_id(frame: &Frame) -> i32 {
    match frame.header {
        Header::Response { correlation_id } => correlation_id,
        ref other => panic!("not a response header: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_produce_requests_share_a_commit_and_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // A segment seals one second after its first batch: two Produce requests sent back to back
    // share it only if the second is read while the first waits for its commit.
    let running = node_with_args(
        dir.path(),
        &[
            "--diskless-linger-ms",
            "1000",
            "--diskless-seal-policy",
            "interval",
        ],
    )
    .await;
    let s = running.storage.clone();
    s.create_topic(topic("d", 1, Some(true)), false)
        .await
        .unwrap();
    let committed = || {
        s.with_node(|n| {
            n.writers()
                .values()
                .map(|w| w.stats().segments_committed)
                .sum::<u64>()
        })
        .unwrap()
    };
    let before = committed();

    let mut conn = TcpStream::connect(running.local_addr).await.unwrap();
    let list_offsets: Body = ListOffsetsRequest::default()
        .replica_id(-1)
        .isolation_level(Some(0))
        .topics(Some(vec![
            ListOffsetsTopic::default()
                .name("d".into())
                .partitions(Some(vec![
                    ListOffsetsPartition::default()
                        .partition_index(0)
                        .current_leader_epoch(Some(-1))
                        .timestamp(-1),
                ])),
        ]))
        .into();
    // Three requests written at once: two Produce, then a ListOffsets of the latest offset.
    let mut out = BytesMut::new();
    out.extend_from_slice(&request(0, PRODUCE_VERSION, 1, produce(&["a", "b"])));
    out.extend_from_slice(&request(0, PRODUCE_VERSION, 2, produce(&["c"])));
    out.extend_from_slice(&request(2, LIST_OFFSETS_VERSION, 3, list_offsets));
    conn.write_all(&out).await.unwrap();

    let mut base_offsets = Vec::new();
    for expected in [1, 2] {
        let frame = read_response(&mut conn, 0, PRODUCE_VERSION).await;
        assert_eq!(correlation_id(&frame), expected, "answers in request order");
        let Body::ProduceResponse(ProduceResponse { responses, .. }) = frame.body else {
            panic!("not a produce response: {:?}", frame.body);
        };
        let p = &responses.unwrap()[0].partition_responses.clone().unwrap()[0];
        assert_eq!(p.error_code, 0, "{p:?}");
        base_offsets.push(p.base_offset);
    }
    // In request order: the first request's two records, then the second's.
    assert_eq!(base_offsets, [0, 2]);
    assert_eq!(
        committed() - before,
        1,
        "the two pipelined requests share one segment (one commit)"
    );

    let frame = read_response(&mut conn, 2, LIST_OFFSETS_VERSION).await;
    assert_eq!(correlation_id(&frame), 3);
    let Body::ListOffsetsResponse(ListOffsetsResponse { topics, .. }) = frame.body else {
        panic!("not a list offsets response: {:?}", frame.body);
    };
    let p = &topics.unwrap()[0].partitions.clone().unwrap()[0];
    assert_eq!(
        (p.error_code, p.offset),
        (0, Some(3)),
        "a later request sees the produced records"
    );
    drop(conn);
    running.shutdown().await;
}

/// Produce requests of diskless topics only are read from their frame by the library
/// (`diskless_core::produce_request`), the rest by Nisshi's codec: both answer every version as
/// tansu-sans-io decodes it, per partition (an index the topic lacks is refused on its own), and
/// a request mixing a classic and a diskless topic is answered for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_requests_of_every_version_and_mixed_ones_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let running = node_with_args(dir.path(), &[]).await;
    let s = running.storage.clone();
    s.create_topic(topic("d", 1, Some(true)), false)
        .await
        .unwrap();
    s.create_topic(topic("c", 1, Some(false)), false)
        .await
        .unwrap();
    let partition = |index: i32, values: &[&str]| {
        PartitionProduceData::default()
            .index(index)
            .records(Some(deflated::Frame {
                batches: vec![batch(values)],
            }))
    };
    let mut conn = TcpStream::connect(running.local_addr).await.unwrap();
    let mut next_offset = 0;
    for (i, version) in [3i16, 5, 8, 9, 11].into_iter().enumerate() {
        let body: Body = ProduceRequest::default()
            .acks(-1)
            .timeout_ms(30_000)
            .topic_data(Some(vec![
                TopicProduceData::default()
                    .name("d".into())
                    .partition_data(Some(vec![partition(0, &["x", "y"]), partition(5, &["z"])])),
            ]))
            .into();
        let id = 100 + i32::try_from(i).unwrap();
        conn.write_all(&request(0, version, id, body))
            .await
            .unwrap();
        let frame = read_response(&mut conn, 0, version).await;
        assert_eq!(correlation_id(&frame), id);
        let Body::ProduceResponse(ProduceResponse { responses, .. }) = frame.body else {
            panic!("not a produce response: {:?}", frame.body);
        };
        let partitions = responses.unwrap()[0].partition_responses.clone().unwrap();
        assert_eq!(
            (
                partitions[0].index,
                partitions[0].error_code,
                partitions[0].base_offset
            ),
            (0, 0, next_offset),
            "version {version}"
        );
        assert_eq!(
            (partitions[1].index, partitions[1].error_code),
            (5, 3),
            "version {version}: UNKNOWN_TOPIC_OR_PARTITION"
        );
        next_offset += 2;
    }
    assert_eq!(
        s.direct_produce_requests(),
        5,
        "diskless-only requests are read from their frame"
    );

    let mixed: Body = ProduceRequest::default()
        .acks(-1)
        .timeout_ms(30_000)
        .topic_data(Some(vec![
            TopicProduceData::default()
                .name("c".into())
                .partition_data(Some(vec![partition(0, &["classic"])])),
            TopicProduceData::default()
                .name("d".into())
                .partition_data(Some(vec![partition(0, &["diskless"])])),
        ]))
        .into();
    conn.write_all(&request(0, PRODUCE_VERSION, 7, mixed))
        .await
        .unwrap();
    let frame = read_response(&mut conn, 0, PRODUCE_VERSION).await;
    assert_eq!(correlation_id(&frame), 7);
    let Body::ProduceResponse(ProduceResponse { responses, .. }) = frame.body else {
        panic!("not a produce response: {:?}", frame.body);
    };
    let answers: Vec<(String, i16, i64)> = responses
        .unwrap()
        .into_iter()
        .map(|t| {
            let p = &t.partition_responses.unwrap()[0];
            (t.name, p.error_code, p.base_offset)
        })
        .collect();
    assert_eq!(
        answers,
        [("c".to_string(), 0, 0), ("d".to_string(), 0, next_offset)]
    );
    assert_eq!(
        s.direct_produce_requests(),
        5,
        "a request with a classic topic goes through Nisshi's codec"
    );
    drop(conn);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_limit_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let running = node_with_args(dir.path(), &[]).await;
    let mut conn = TcpStream::connect(running.local_addr).await.unwrap();
    // 200 MiB announced (Kafka's socket.request.max.bytes is 100 MiB): closed, nothing allocated.
    conn.write_all(&(200i32 << 20).to_be_bytes()).await.unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(conn.read(&mut buf).await.unwrap(), 0, "connection closed");
    running.shutdown().await;
}
