//! The Fetch and ListOffsets routes of this crate (`diskless_nisshi::fetch`) on requests mixing
//! classic and diskless partitions: aborted transactions listed, unknown partitions answered per
//! partition, a long-polling fetch woken by an append of either kind, every special timestamp.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{base_timestamp, batch, begin_txn, node_with_c_and_d, txn_batch, values};
use diskless_core::RecordBatchBuilder;
use diskless_nisshi::DisklessStorage;
use diskless_nisshi::fetch::{FetchService, ListOffsetsService};
use diskless_nisshi::services::ProduceService;
use rama::{Context, Service};
use tansu_sans_io::{
    ErrorCode, FetchRequest, FetchResponse, ListOffsetsRequest, ProduceRequest,
    fetch_request::{FetchPartition, FetchTopic},
    fetch_response::PartitionData,
    list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic},
    produce_request::{PartitionProduceData, TopicProduceData},
    record::deflated::{self, Frame},
};
use tansu_storage::{Storage, StorageContainer, Topition};

type Node = DisklessStorage<StorageContainer>;

fn fetch_topic(name: &str, partitions: &[(i32, i64)]) -> FetchTopic {
    FetchTopic::default()
        .topic(Some(name.into()))
        .partitions(Some(
            partitions
                .iter()
                .map(|&(partition, offset)| {
                    FetchPartition::default()
                        .partition(partition)
                        .fetch_offset(offset)
                        .partition_max_bytes(1 << 20)
                })
                .collect(),
        ))
}

async fn fetch(
    s: &Node,
    topics: Vec<FetchTopic>,
    isolation: i8,
    min_bytes: i32,
    max_wait_ms: i32,
) -> FetchResponse {
    let req = FetchRequest::default()
        .max_wait_ms(max_wait_ms)
        .min_bytes(min_bytes)
        .max_bytes(Some(50 << 20))
        .isolation_level(Some(isolation))
        .topics(Some(topics));
    FetchService
        .serve(Context::with_state(s.clone()), req)
        .await
        .unwrap()
}

/// The answer for `topic`'s `partition`.
fn partition<'a>(r: &'a FetchResponse, topic: &str, partition: i32) -> &'a PartitionData {
    r.responses
        .as_deref()
        .unwrap()
        .iter()
        .find(|t| t.topic.as_deref() == Some(topic))
        .and_then(|t| {
            t.partitions
                .as_deref()
                .unwrap()
                .iter()
                .find(|p| p.partition_index == partition)
        })
        .unwrap_or_else(|| panic!("no answer for {topic}-{partition}"))
}

fn records(p: &PartitionData) -> Vec<String> {
    values(p.records.as_ref().map_or(&[][..], |f| &f.batches[..]))
}

async fn produce_via_route(s: &Node, topic: &str, b: deflated::Batch) {
    let req = ProduceRequest::default()
        .acks(-1)
        .timeout_ms(30_000)
        .topic_data(Some(vec![
            TopicProduceData::default()
                .name(topic.into())
                .partition_data(Some(vec![
                    PartitionProduceData::default()
                        .index(0)
                        .records(Some(Frame { batches: vec![b] })),
                ])),
        ]));
    let r = ProduceService
        .serve(Context::with_state(s.clone()), req)
        .await
        .unwrap();
    let responses = r.responses.unwrap();
    let p = &responses[0].partition_responses.as_ref().unwrap()[0];
    assert_eq!(p.error_code, i16::from(ErrorCode::None), "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fetch_lists_aborted_transactions_and_answers_each_partition() {
    let (_dir, running) = node_with_c_and_d(2).await;
    let s = running.storage.clone();
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));
    assert_eq!(s.produce(None, &c0, batch(&["c-a"])).await.unwrap(), 0);
    assert_eq!(s.produce(None, &d0, batch(&["d-a"])).await.unwrap(), 0);

    // An aborted transaction on the diskless partition, then a committed one.
    let mut aborted_at = None;
    for commit in [false, true] {
        let producer = begin_txn(&s, "tx", &[("d", 0)]).await;
        let word = if commit { "kept" } else { "dropped" };
        let b = txn_batch(&producer, &[word]);
        let at = s.produce(Some("tx"), &d0, b).await.unwrap();
        if !commit {
            aborted_at = Some((producer.id, at));
        }
        s.txn_end("tx", producer.id, producer.epoch, commit)
            .await
            .unwrap();
    }
    let (aborted_pid, aborted_offset) = aborted_at.unwrap();

    let r = fetch(
        &s,
        vec![
            fetch_topic("d", &[(0, 0), (7, 0)]),
            fetch_topic("c", &[(0, 0)]),
            fetch_topic("nope", &[(0, 0)]),
        ],
        1,
        1,
        0,
    )
    .await;
    let d = partition(&r, "d", 0);
    assert_eq!(d.error_code, 0);
    // Kafka's read_committed answer: every batch up to the LSO, the aborted one with them, and
    // the list a client drops it by.
    assert_eq!(records(d), ["d-a", "dropped", "kept"]);
    let aborted = d.aborted_transactions.as_deref().unwrap();
    assert_eq!(aborted.len(), 1, "{aborted:?}");
    assert_eq!(
        (aborted[0].producer_id, aborted[0].first_offset),
        (aborted_pid, aborted_offset)
    );
    assert_eq!(d.high_watermark, d.last_stable_offset.unwrap());
    assert_eq!(d.log_start_offset, Some(0));
    assert_eq!(
        partition(&r, "d", 7).error_code,
        i16::from(ErrorCode::UnknownTopicOrPartition)
    );
    let c = partition(&r, "c", 0);
    assert_eq!((c.error_code, records(c)), (0, vec!["c-a".to_string()]));
    assert_eq!(c.high_watermark, 1);
    assert_eq!(
        partition(&r, "nope", 0).error_code,
        i16::from(ErrorCode::UnknownTopicOrPartition)
    );

    // read_uncommitted: the same batches, no list.
    let r = fetch(&s, vec![fetch_topic("d", &[(0, 0)])], 0, 1, 0).await;
    let d = partition(&r, "d", 0);
    assert_eq!(records(d), ["d-a", "dropped", "kept"]);
    assert!(
        d.aborted_transactions.as_ref().is_none_or(Vec::is_empty),
        "{d:?}"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fetch_is_woken_by_an_append_of_either_kind() {
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    // Far longer than a wake-up takes: a fetch answered with data well before it was woken.
    const MAX_WAIT_MS: i32 = 25_000;

    let mut next = [("c", 0i64), ("d", 0i64)];
    for (kind, name) in [("classic", "c"), ("diskless", "d")] {
        let waiting = {
            let s = s.clone();
            let topics = next
                .map(|(t, offset)| fetch_topic(t, &[(0, offset)]))
                .to_vec();
            tokio::spawn(async move {
                let started = Instant::now();
                let r = fetch(&s, topics, 0, 1, MAX_WAIT_MS).await;
                (r, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "{kind}: nothing to read yet");
        produce_via_route(&s, name, batch(&[kind])).await;
        let (r, waited) = waiting.await.unwrap();
        assert_eq!(records(partition(&r, name, 0)), [kind]);
        assert!(
            waited < Duration::from_millis(u64::try_from(MAX_WAIT_MS).unwrap() / 2),
            "{kind}: woken by the append, not by max_wait ({waited:?})"
        );
        let other = if name == "c" { "d" } else { "c" };
        assert!(records(partition(&r, other, 0)).is_empty());
        // Read: the next round waits at the new end.
        for (t, offset) in &mut next {
            if *t == name {
                *offset += 1;
            }
        }
    }

    // min_bytes 0 and data nowhere: answered at once.
    let started = Instant::now();
    let r = fetch(&s, vec![fetch_topic("d", &[(0, 1)])], 0, 0, MAX_WAIT_MS).await;
    assert_eq!(partition(&r, "d", 0).error_code, 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_answers_every_special_timestamp() {
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let base = base_timestamp();
    // Record timestamps base, base + 5, base + 1: the largest is the second record (offset 1).
    let b = || {
        let bytes: bytes::Bytes = RecordBatchBuilder::new()
            .record(base, None, Some(b"x"))
            .record(base + 5, None, Some(b"y"))
            .record(base + 1, None, Some(b"z"))
            .build()
            .unwrap()
            .into_bytes();
        deflated::Batch::try_from(bytes).unwrap()
    };
    s.produce(None, &Topition::new("d", 0), b()).await.unwrap();
    s.produce(None, &Topition::new("c", 0), b()).await.unwrap();

    let asked = [-1, -2, -3, -4, -5, base + 1];
    let topic = |name: &str| {
        ListOffsetsTopic::default()
            .name(name.into())
            .partitions(Some(
                asked
                    .iter()
                    .map(|&t| {
                        ListOffsetsPartition::default()
                            .partition_index(0)
                            .timestamp(t)
                    })
                    .collect(),
            ))
    };
    let r = ListOffsetsService
        .serve(
            Context::with_state(s.clone()),
            ListOffsetsRequest::default()
                .replica_id(-1)
                .isolation_level(Some(0))
                .topics(Some(vec![topic("d"), topic("c")])),
        )
        .await
        .unwrap();
    let answers = |name: &str| -> Vec<(i16, i64, i64)> {
        r.topics
            .as_deref()
            .unwrap()
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .partitions
            .as_deref()
            .unwrap()
            .iter()
            .map(|p| (p.error_code, p.offset.unwrap(), p.timestamp.unwrap()))
            .collect()
    };
    let unsupported = i16::from(ErrorCode::UnsupportedVersion);
    assert_eq!(
        answers("d"),
        [
            (0, 3, -1),       // latest: the high watermark
            (0, 0, -1),       // earliest
            (0, 1, base + 5), // max timestamp: the record, not its batch
            (0, 0, -1),       // earliest local: nothing is tiered
            (0, -1, -1),      // latest tiered: none
            (0, 1, base + 5), // the first record at or after base + 1
        ]
    );
    let c = answers("c");
    assert_eq!(c[0].0, 0);
    assert_eq!(c[0].1, 3, "classic latest");
    assert_eq!(c[1].1, 0, "classic earliest");
    assert_eq!(c[2].0, unsupported, "classic max timestamp: Nisshi cannot");
    assert_eq!(
        (c[3].0, c[3].1),
        (0, 0),
        "classic earliest local = earliest"
    );
    assert_eq!((c[4].0, c[4].1), (0, -1), "classic latest tiered: none");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_partitions_grows_a_diskless_topic_and_refuses_the_rest() {
    use diskless_nisshi::admin::CreatePartitionsService;
    use tansu_sans_io::{
        CreatePartitionsRequest, create_partitions_request::CreatePartitionsTopic,
    };
    use tansu_storage::TopicId;

    let (_dir, running) = node_with_c_and_d(2).await;
    let s = running.storage.clone();
    let grow = |topics: Vec<(&str, i32)>, validate_only: bool| {
        let s = s.clone();
        let topics: Vec<CreatePartitionsTopic> = topics
            .into_iter()
            .map(|(name, count)| {
                CreatePartitionsTopic::default()
                    .name(name.into())
                    .count(count)
                    .assignments(None)
            })
            .collect();
        async move {
            let r = CreatePartitionsService
                .serve(
                    Context::with_state(s),
                    CreatePartitionsRequest::default()
                        .topics(Some(topics))
                        .timeout_ms(30_000)
                        .validate_only(validate_only),
                )
                .await
                .unwrap();
            r.results
                .unwrap()
                .into_iter()
                .map(|t| (t.name, t.error_code))
                .collect::<Vec<_>>()
        }
    };
    let partitions = |name: &'static str| {
        let s = s.clone();
        async move {
            let meta = s
                .metadata(Some(&[TopicId::Name(name.into())]))
                .await
                .unwrap();
            meta.topics()[0]
                .partitions
                .as_ref()
                .unwrap()
                .iter()
                .map(|p| p.partition_index)
                .collect::<Vec<_>>()
        }
    };

    // Validation only: nothing changes.
    assert_eq!(grow(vec![("d", 4)], true).await, [("d".to_string(), 0)]);
    assert_eq!(partitions("d").await, [0, 1]);

    let code = |c: ErrorCode| i16::from(c);
    assert_eq!(
        grow(vec![("d", 4), ("c", 3), ("nope", 2)], false).await,
        [
            ("d".to_string(), 0),
            ("c".to_string(), code(ErrorCode::InvalidRequest)),
            ("nope".to_string(), code(ErrorCode::UnknownTopicOrPartition)),
        ]
    );
    assert_eq!(partitions("d").await, [0, 1, 2, 3]);
    assert_eq!(partitions("c").await, [0]);
    // The new partitions take records; the topic never shrinks.
    assert_eq!(
        s.produce(None, &Topition::new("d", 3), batch(&["new"]))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        grow(vec![("d", 4)], false).await,
        [("d".to_string(), code(ErrorCode::InvalidPartitions))]
    );
    assert_eq!(
        grow(vec![("d", 3)], false).await,
        [("d".to_string(), code(ErrorCode::InvalidPartitions))]
    );
    assert_eq!(
        grow(vec![("d", 5), ("d", 6)], false).await,
        [
            ("d".to_string(), code(ErrorCode::InvalidRequest)),
            ("d".to_string(), code(ErrorCode::InvalidRequest)),
        ]
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_creates_named_topics_only_when_asked_and_allowed() {
    use diskless_nisshi::metadata::MetadataService;
    use tansu_sans_io::{MetadataRequest, metadata_request::MetadataRequestTopic};

    let metadata = |s: Node, names: &[&str], allow: Option<bool>| {
        let topics: Vec<MetadataRequestTopic> = names
            .iter()
            .map(|n| MetadataRequestTopic::default().name(Some((*n).into())))
            .collect();
        async move {
            let r = MetadataService
                .serve(
                    Context::with_state(s),
                    MetadataRequest::default()
                        .topics(Some(topics))
                        .allow_auto_topic_creation(allow),
                )
                .await
                .unwrap();
            r.topics
                .unwrap()
                .into_iter()
                .map(|t| {
                    (
                        t.name.unwrap_or_default(),
                        t.error_code,
                        t.partitions.map_or(0, |p| p.len()),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let unknown = i16::from(ErrorCode::UnknownTopicOrPartition);
    let invalid = i16::from(ErrorCode::InvalidTopicException);

    // Off (Nisshi's behaviour): an unknown topic stays unknown.
    let dir = tempfile::tempdir().unwrap();
    let running = common::node_with_args(dir.path(), &["--diskless-default"]).await;
    let s = running.storage.clone();
    assert_eq!(
        metadata(s.clone(), &["a", "a$#!"], Some(true)).await,
        [
            ("a".to_string(), unknown, 0),
            ("a$#!".to_string(), invalid, 0)
        ]
    );
    running.shutdown().await;

    // On: created when the request allows it (v4+ says so; older versions always do), with the
    // configured partition count, diskless under --diskless-default; invalid names (answered
    // INVALID_TOPIC_EXCEPTION, as by Kafka) and internal ones are not created.
    let dir = tempfile::tempdir().unwrap();
    let running = common::node_with_args(
        dir.path(),
        &[
            "--diskless-default",
            "--auto-create-topics",
            "--num-partitions",
            "3",
        ],
    )
    .await;
    let s = running.storage.clone();
    assert_eq!(
        metadata(s.clone(), &["a"], Some(false)).await,
        [("a".to_string(), unknown, 0)]
    );
    assert_eq!(
        metadata(
            s.clone(),
            &["a", "bad name", "__consumer_offsets"],
            Some(true)
        )
        .await,
        [
            ("a".to_string(), 0, 3),
            ("bad name".to_string(), invalid, 0),
            ("__consumer_offsets".to_string(), unknown, 0),
        ]
    );
    assert_eq!(
        metadata(s.clone(), &["b"], None).await,
        [("b".to_string(), 0, 3)]
    );
    assert!(
        s.diskless_topic("a").await.unwrap().is_some(),
        "a is diskless"
    );
    // Asked again: the same topic, not a second one.
    assert_eq!(
        metadata(s.clone(), &["a"], Some(true)).await,
        [("a".to_string(), 0, 3)]
    );
    running.shutdown().await;
}

/// A transaction whose producer is gone (it never ends it) holds a diskless partition's LSO.
/// Kafka's tooling finds it (DescribeProducers: the producer and the first offset of its open
/// transaction) and ends it (WriteTxnMarkers with an abort, as `Admin.abortTransaction` sends);
/// a classic partition and an unknown topic are answered with errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_transaction_is_found_and_aborted_with_kafkas_tooling_requests() {
    use diskless_nisshi::txn_admin::{DescribeProducersService, WriteTxnMarkersService};
    use tansu_sans_io::{
        DescribeProducersRequest, WriteTxnMarkersRequest,
        describe_producers_request::TopicRequest,
        write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic},
    };

    let (_dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let d0 = Topition::new("d", 0);
    let producer = begin_txn(&s, "gone", &[("d", 0)]).await;
    s.produce(Some("gone"), &d0, txn_batch(&producer, &["hanging"]))
        .await
        .unwrap();
    let stage = s.offset_stage(&d0).await.unwrap();
    assert!(stage.last_stable() < stage.high_watermark(), "{stage:?}");

    let describe = |names: &[&str]| {
        let topics = names
            .iter()
            .map(|n| {
                TopicRequest::default()
                    .name((*n).into())
                    .partition_indexes(Some(vec![0]))
            })
            .collect();
        let s = s.clone();
        async move {
            DescribeProducersService
                .serve(
                    Context::with_state(s),
                    DescribeProducersRequest::default().topics(Some(topics)),
                )
                .await
                .unwrap()
                .topics
                .unwrap()
        }
    };
    let topics = describe(&["d", "c", "nope"]).await;
    let d = &topics[0].partitions.as_ref().unwrap()[0];
    assert_eq!(d.error_code, i16::from(ErrorCode::None));
    let producers = d.active_producers.as_ref().unwrap();
    assert_eq!(producers.len(), 1, "{producers:?}");
    assert_eq!(producers[0].producer_id, producer.id);
    assert_eq!(producers[0].producer_epoch, i32::from(producer.epoch));
    assert_eq!(
        producers[0].current_txn_start_offset, 0,
        "the open transaction"
    );
    let classic = &topics[1].partitions.as_ref().unwrap()[0];
    assert_eq!(classic.error_code, i16::from(ErrorCode::UnknownServerError));
    let unknown = &topics[2].partitions.as_ref().unwrap()[0];
    assert_eq!(
        unknown.error_code,
        i16::from(ErrorCode::UnknownTopicOrPartition)
    );

    let marker = WritableTxnMarker::default()
        .producer_id(producer.id)
        .producer_epoch(producer.epoch)
        .transaction_result(false)
        .coordinator_epoch(producers[0].coordinator_epoch)
        .topics(Some(
            ["d", "c"]
                .iter()
                .map(|n| {
                    WritableTxnMarkerTopic::default()
                        .name((*n).into())
                        .partition_indexes(Some(vec![0]))
                })
                .collect(),
        ));
    let written = WriteTxnMarkersService
        .serve(
            Context::with_state(s.clone()),
            WriteTxnMarkersRequest::default().markers(Some(vec![marker])),
        )
        .await
        .unwrap();
    let results = written.markers.unwrap();
    let topics = results[0].topics.as_ref().unwrap();
    let code = |i: usize| topics[i].partitions.as_ref().unwrap()[0].error_code;
    assert_eq!(
        code(0),
        i16::from(ErrorCode::None),
        "the diskless partition"
    );
    assert_eq!(code(1), i16::from(ErrorCode::UnknownServerError), "classic");

    let stage = s.offset_stage(&d0).await.unwrap();
    assert_eq!(stage.last_stable(), stage.high_watermark(), "{stage:?}");
    let read = common::read_all(&s, &d0, tansu_sans_io::IsolationLevel::ReadCommitted).await;
    assert!(values(&read).is_empty(), "{:?}", values(&read));
    let topics = describe(&["d"]).await;
    let producers = topics[0].partitions.as_ref().unwrap()[0]
        .active_producers
        .clone()
        .unwrap();
    assert_eq!(
        producers[0].current_txn_start_offset, -1,
        "no open transaction"
    );
    running.shutdown().await;
}
