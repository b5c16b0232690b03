//! Produce validation seen through `WalWriter`: what Kafka's broker answers for a partition's
//! records, and that one producer's malformed batch fails only its own partition, never the other
//! requests that share its WAL segment (issue #12, items 2 and 4).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use diskless_coordinator::*;
use diskless_core::batch::update_crc;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;

struct Env {
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<InMemoryCoordinator>,
    writer: WalWriter,
    fetcher: Fetcher,
}

/// A fresh topic id, drawn deterministically (`Uuid::new_v4` is not used in this workspace).
fn next_uuid() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(u128::from(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

/// A writer that closes a segment only when flushed (hour-long interval, large buffer), so that
/// every request appended before a flush lands in the same segment.
fn env() -> Env {
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator = Arc::new(InMemoryCoordinator::new(ManualClock::new(NOW)));
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(
            WalWriterConfig::default()
                .with_seal_policy(SealPolicy::Interval)
                .with_commit_interval(Duration::from_secs(3600))
                .with_buffer_max_bytes(64 << 20),
        )
        .with_clock(ManualClock::new(NOW))
        .build()
        .unwrap();
    let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
        .build()
        .unwrap();
    Env {
        storage,
        coordinator,
        writer,
        fetcher,
    }
}

async fn topic(e: &Env, partitions: i32) -> Uuid {
    let topic_id = next_uuid();
    e.coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: format!("t-{topic_id}"),
            partitions,
            config: TopicConfig::default(),
        })
        .await
        .unwrap();
    topic_id
}

fn batch(producer_id: i64, epoch: i16, seq: i32, values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new().producer(producer_id, epoch, seq);
    for v in values {
        b = b.record(NOW, Some(b"key"), Some(v.as_bytes()));
    }
    b.build().unwrap()
}

fn part(partition: TopicIdPartition, records: Bytes) -> ProducePartition {
    ProducePartition {
        partition,
        config: Arc::new(TopicConfig::default()),
        records,
        txn_seq: None,
    }
}

fn concat(parts: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::new();
    for p in parts {
        out.extend_from_slice(p);
    }
    out.freeze()
}

/// The batches fetched from `partition` at offset 0, each with a valid CRC.
async fn fetched(e: &Env, partition: TopicIdPartition) -> Vec<RecordBatch> {
    let got = e
        .fetcher
        .fetch(
            &[FetchPartition {
                partition,
                fetch_offset: 0,
                partition_max_bytes: 1 << 20,
                leader_epoch: 0,
                isolation: Default::default(),
            }],
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(got[0].error, ErrorCode::None);
    let batches = split_batches(got[0].records_bytes()).unwrap();
    for b in &batches {
        verify_stored_batch(b).unwrap();
    }
    batches
}

/// Whether a served batch carries the produced bytes (but for the injected offset and epoch).
fn same_but_injected(served: &RecordBatch, produced: &RecordBatch) -> bool {
    let (s, p) = (served.as_bytes(), produced.as_bytes());
    s.len() == p.len() && s[8..12] == p[8..12] && s[16..] == p[16..]
}

/// Issue #12 item 2: a batch with a producer id and epoch -2 used to pass validation; the
/// coordinator then refused the whole commit, and every request of the segment got
/// INVALID_REQUEST. Now it gets Kafka's INVALID_PRODUCER_EPOCH alone, and the other producer's
/// request in the same segment is committed and readable.
#[tokio::test(start_paused = true)]
async fn a_malformed_producer_epoch_fails_only_its_own_request_in_a_shared_segment() {
    let e = env();
    let t = topic(&e, 2).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let good = batch(10, 0, 0, &["good-1", "good-2"]);
    let bad = batch(11, -2, 0, &["bad"]);
    let first = e
        .writer
        .append(vec![part(p0, good.as_bytes().clone())])
        .await;
    let second = e
        .writer
        .append(vec![part(p1, bad.as_bytes().clone())])
        .await;
    e.writer.flush().await;
    let (first, second) = (first.await, second.await);
    assert_eq!(first[0].error, ErrorCode::None, "{first:?}");
    assert_eq!(first[0].base_offset, 0);
    assert_eq!(
        second[0].error,
        ErrorCode::InvalidProducerEpoch,
        "{second:?}"
    );
    assert_eq!(second[0].base_offset, -1);
    assert_eq!(e.writer.stats().segments_committed, 1);
    assert_eq!(e.storage.counters().snapshot().put_requests, 1);
    let got = fetched(&e, p0).await;
    assert_eq!(got.len(), 1);
    assert!(same_but_injected(&got[0], &good));
    assert!(fetched(&e, p1).await.is_empty());
    e.writer.close().await;
}

/// Issue #12 item 2: a producer id below -1 is not idempotent in Kafka (`hasProducerId` is
/// `producerId > -1`), whatever its epoch and sequence. It used to reach the coordinator as is and
/// fail every request of its segment with INVALID_REQUEST; now both requests are appended.
#[tokio::test(start_paused = true)]
async fn a_producer_id_below_minus_one_is_non_idempotent_and_fails_nobody() {
    let e = env();
    let t = topic(&e, 2).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let good = batch(20, 3, 0, &["a"]);
    let odd = batch(-2, -7, -9, &["b", "c"]);
    let first = e
        .writer
        .append(vec![part(p0, good.as_bytes().clone())])
        .await;
    let second = e
        .writer
        .append(vec![part(p1, odd.as_bytes().clone())])
        .await;
    e.writer.flush().await;
    let (first, second) = (first.await, second.await);
    assert_eq!(first[0].error, ErrorCode::None, "{first:?}");
    assert_eq!(second[0].error, ErrorCode::None, "{second:?}");
    assert_eq!(e.writer.stats().segments_committed, 1);
    // Stored exactly as sent; no producer state is kept for it.
    let got = fetched(&e, p1).await;
    assert!(same_but_injected(&got[0], &odd));
    assert_eq!(got[0].producer_id(), -2);
    // The same bytes again are not a duplicate (no idempotence): appended at offset 2.
    let again = e
        .writer
        .produce(vec![part(p1, odd.as_bytes().clone())])
        .await;
    assert_eq!((again[0].error, again[0].base_offset), (ErrorCode::None, 2));
    e.writer.close().await;
}

/// Issue #12 item 2: Kafka accepts epoch -1 with a producer id (a producer new to the partition
/// has epoch -1, and `checkProducerEpoch` only refuses a smaller one). Validation passes it, and the
/// coordinator, judging producer fields per batch, appends it next to another producer's request
/// in the same segment. Both used to get INVALID_REQUEST.
#[tokio::test(start_paused = true)]
async fn epoch_minus_one_with_a_producer_id_is_accepted_in_a_shared_segment() {
    let e = env();
    let t = topic(&e, 2).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let other = batch(50, 0, 0, &["x"]);
    let minus_one = batch(51, -1, 0, &["y", "z"]);
    let first = e
        .writer
        .append(vec![part(p0, other.as_bytes().clone())])
        .await;
    let second = e
        .writer
        .append(vec![part(p1, minus_one.as_bytes().clone())])
        .await;
    e.writer.flush().await;
    let (first, second) = (first.await, second.await);
    assert_eq!(first[0].error, ErrorCode::None, "{first:?}");
    assert_eq!(
        (second[0].error, second[0].base_offset),
        (ErrorCode::None, 0),
        "{second:?}"
    );
    assert_eq!(e.writer.stats().segments_committed, 1);
    assert!(same_but_injected(&fetched(&e, p1).await[0], &minus_one));
    e.writer.close().await;
}

/// Issue #12 item 4: Produce v3+ carries exactly one batch per partition; Kafka answers
/// INVALID_RECORD otherwise (`ProduceRequest.validateRecords`). The writer used to append both.
/// Other partitions of the request are not affected.
#[tokio::test(start_paused = true)]
async fn two_batches_for_one_partition_are_invalid_record() {
    let e = env();
    let t = topic(&e, 2).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let a = batch(-1, -1, -1, &["a"]);
    let b = batch(-1, -1, -1, &["b"]);
    let answers = e
        .writer
        .produce(vec![
            part(p0, concat(&[a.as_bytes(), b.as_bytes()])),
            part(p1, a.as_bytes().clone()),
        ])
        .await;
    assert_eq!(answers[0].error, ErrorCode::InvalidRecord, "{answers:?}");
    assert_eq!(answers[1].error, ErrorCode::None, "{answers:?}");
    assert!(fetched(&e, p0).await.is_empty());
    e.writer.close().await;
}

/// Issue #12 item 4: bytes after the batch too few to hold a second batch are ignored, as Kafka's
/// batch iteration stops there and `UnifiedLog.trimInvalidBytes` drops them. The writer used to
/// answer CORRUPT_MESSAGE. Only the batch is stored and served.
#[tokio::test(start_paused = true)]
async fn a_partial_trailing_batch_is_trimmed_as_kafka_does() {
    let e = env();
    let t = topic(&e, 1).await;
    let p = TopicIdPartition::new(t, 0);
    let a = batch(30, 0, 0, &["a", "b"]);
    // 40 bytes of the next batch: its header announces more than is left.
    let cut = &a.as_bytes()[..40];
    let answers = e
        .writer
        .produce(vec![part(p, concat(&[a.as_bytes(), cut]))])
        .await;
    assert_eq!(
        (answers[0].error, answers[0].base_offset),
        (ErrorCode::None, 0),
        "{answers:?}"
    );
    let got = fetched(&e, p).await;
    assert_eq!(got.len(), 1);
    assert!(same_but_injected(&got[0], &a));
    // A trailing fragment that is not a partial batch (a batchLength below any message format) is
    // corrupt, as in Kafka.
    let mut bad_tail = vec![0u8; 20];
    bad_tail[8..12].copy_from_slice(&13i32.to_be_bytes());
    let b = batch(30, 0, 2, &["c"]);
    let answers = e
        .writer
        .produce(vec![part(p, concat(&[b.as_bytes(), &bad_tail]))])
        .await;
    assert_eq!(answers[0].error, ErrorCode::CorruptMessage, "{answers:?}");
    e.writer.close().await;
}

/// Issue #12 item 4: a complete magic 0 or 1 message is INVALID_RECORD (Produce v3+ only carries
/// magic 2) even when it is shorter than a v2 header; it used to be CORRUPT_MESSAGE (retriable, so
/// a client would retry it forever).
#[tokio::test(start_paused = true)]
async fn short_old_format_messages_are_invalid_record() {
    let e = env();
    let t = topic(&e, 1).await;
    let p = TopicIdPartition::new(t, 0);
    for (magic, len) in [(0u8, 26usize), (1, 34), (0, 60), (1, 61), (1, 100)] {
        let message = legacy_message(magic, len);
        let answers = e.writer.produce(vec![part(p, message)]).await;
        assert_eq!(
            answers[0].error,
            ErrorCode::InvalidRecord,
            "magic {magic}, {len} bytes: {answers:?}"
        );
    }
    e.writer.close().await;
}

/// Issue #12 item 4: Kafka rejects a non-zero base offset before it checks the size and the CRC,
/// so a batch with both a bad base offset and a bad CRC is INVALID_RECORD, not CORRUPT_MESSAGE.
#[tokio::test(start_paused = true)]
async fn a_bad_base_offset_wins_over_a_bad_crc() {
    let e = env();
    let t = topic(&e, 1).await;
    let p = TopicIdPartition::new(t, 0);
    let a = batch(-1, -1, -1, &["a"]);
    let mut v = a.as_bytes().to_vec();
    v[..8].copy_from_slice(&7i64.to_be_bytes());
    update_crc(&mut v);
    let last = v.len() - 1;
    v[last] ^= 0xff; // now the CRC is wrong too
    let answers = e.writer.produce(vec![part(p, Bytes::from(v))]).await;
    assert_eq!(answers[0].error, ErrorCode::InvalidRecord, "{answers:?}");
    e.writer.close().await;
}

/// A magic 0/1 message (v0: crc, magic, attributes, key, value; v1 adds a timestamp) of `len`
/// bytes in all, padded with value bytes.
fn legacy_message(magic: u8, len: usize) -> Bytes {
    let header = if magic == 0 { 26 } else { 34 };
    assert!(len >= header);
    let mut v = vec![0u8; 12];
    v[8..12].copy_from_slice(&((len - 12) as i32).to_be_bytes());
    v.extend_from_slice(&[0; 4]); // crc (Kafka refuses the magic before checking it)
    v.push(magic);
    v.push(0); // attributes
    if magic == 1 {
        v.extend_from_slice(&NOW.to_be_bytes());
    }
    v.extend_from_slice(&(-1i32).to_be_bytes()); // null key
    let value_len = len - header;
    v.extend_from_slice(&(value_len as i32).to_be_bytes());
    v.resize(len, b'v');
    Bytes::from(v)
}
