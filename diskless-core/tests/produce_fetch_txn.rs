//! Transactions end to end through the façade: WalWriter (transactional batches, verified by the
//! host's `txn_seq`), the coordinator's markers, and the Fetcher serving markers as Kafka's control
//! batches, `read_committed` bounded by the last stable offset with its aborted transactions, and
//! record-level ListOffsets under both isolation levels. Over the in-memory reference coordinator
//! and SQLite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::control::parse_end_txn_marker;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;
use uuid::Uuid;

const NOW: i64 = 1_750_000_000_000;

struct Env {
    storage: Arc<ObjectStoreStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    clock: Arc<ManualClock>,
    writer: WalWriter,
    fetcher: Fetcher,
}

async fn env(sqlite: bool) -> Env {
    let clock = ManualClock::new(NOW);
    let storage = Arc::new(ObjectStoreStorage::in_memory());
    let coordinator: Arc<dyn BatchCoordinator> = if sqlite {
        Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap())
    } else {
        Arc::new(InMemoryCoordinator::new(clock.clone()))
    };
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(
            WalWriterConfig::default()
                .with_seal_policy(SealPolicy::Interval)
                .with_commit_interval(Duration::from_millis(20)),
        )
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
        .build()
        .unwrap();
    Env {
        storage,
        coordinator,
        clock,
        writer,
        fetcher,
    }
}

async fn topic(e: &Env, config: TopicConfig) -> Uuid {
    let topic_id = Uuid::from_u128(0x7777);
    e.coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "txn".into(),
            partitions: 1,
            config,
        })
        .await
        .unwrap();
    topic_id
}

/// A transactional batch of `values` from producer `pid` at sequence `seq`.
fn txn_batch(pid: i64, seq: i32, values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new()
        .producer(pid, 0, seq)
        .transactional(true);
    for v in values {
        b = b.record(NOW, None, Some(v.as_bytes()));
    }
    b.build().unwrap()
}

fn plain_batch(values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new();
    for v in values {
        b = b.record(NOW, None, Some(v.as_bytes()));
    }
    b.build().unwrap()
}

/// Produces one batch; its (error, base offset).
async fn produce(
    e: &Env,
    p: TopicIdPartition,
    config: &TopicConfig,
    b: &RecordBatch,
    txn_seq: Option<i64>,
) -> (ErrorCode, i64) {
    let mut part = ProducePartition::new(p, Arc::new(config.clone()), b.as_bytes().clone());
    if let Some(seq) = txn_seq {
        part = part.with_txn_seq(seq);
    }
    let r = e.writer.produce(vec![part]).await.remove(0);
    (r.error, r.base_offset)
}

async fn end_txn(e: &Env, p: TopicIdPartition, pid: i64, commit: bool, txn_seq: i64) -> i64 {
    let r = e
        .coordinator
        .write_txn_markers(&[TxnMarker {
            partition: p,
            producer_id: pid,
            producer_epoch: 0,
            coordinator_epoch: 3,
            commit,
            txn_seq: Some(txn_seq),
        }])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(r.error, ErrorCode::None, "{r:?}");
    r.offset
}

async fn fetch(
    e: &Env,
    p: TopicIdPartition,
    offset: i64,
    isolation: IsolationLevel,
    max_bytes: u32,
) -> FetchedPartition {
    e.fetcher
        .fetch(
            &[FetchPartition {
                partition: p,
                fetch_offset: offset,
                partition_max_bytes: max_bytes,
                leader_epoch: 5,
                isolation,
            }],
            u32::MAX,
        )
        .await
        .unwrap()
        .remove(0)
}

/// The served batches: (base offset, is control, producer id), every CRC checked.
fn shape(f: &FetchedPartition) -> Vec<(i64, bool, i64)> {
    split_batches(f.records_bytes())
        .unwrap()
        .iter()
        .map(|b| {
            assert!(b.crc_is_valid(), "served batch with a bad CRC");
            assert_eq!(b.partition_leader_epoch(), 5);
            (
                b.base_offset(),
                b.attributes().is_control(),
                b.producer_id(),
            )
        })
        .collect()
}

fn aborted(producer_id: i64, first_offset: i64, last_offset: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id,
        first_offset,
        last_offset,
    }
}

/// Producer 7 commits one transaction and aborts the next, producer 8 leaves one open; plain data
/// in between. `read_uncommitted` sees every batch and both markers as Kafka's control batches;
/// `read_committed` stops at producer 8's first offset and reports producer 7's abort. Markers cost
/// no PUT.
async fn commit_abort_and_isolation(sqlite: bool) {
    let e = env(sqlite).await;
    let config = TopicConfig::default();
    let p = TopicIdPartition::new(topic(&e, config.clone()).await, 0);

    let unverified = produce(&e, p, &config, &txn_batch(7, 0, &["x"]), None).await;
    assert_eq!(unverified, (ErrorCode::InvalidTxnState, -1));
    let no_pid = RecordBatchBuilder::new()
        .transactional(true)
        .record(NOW, None, Some(b"v"))
        .build()
        .unwrap();
    assert_eq!(
        produce(&e, p, &config, &no_pid, Some(1)).await.0,
        ErrorCode::InvalidRecord
    );

    assert_eq!(
        produce(&e, p, &config, &txn_batch(7, 0, &["a", "b"]), Some(1)).await,
        (ErrorCode::None, 0)
    );
    assert_eq!(
        produce(&e, p, &config, &plain_batch(&["c"]), None).await,
        (ErrorCode::None, 2)
    );
    let puts = e.storage.counters().snapshot().put_requests;
    e.clock.advance(7);
    assert_eq!(end_txn(&e, p, 7, true, 1).await, 3);
    assert_eq!(
        produce(&e, p, &config, &txn_batch(7, 2, &["d"]), Some(2)).await,
        (ErrorCode::None, 4)
    );
    let abort_at = end_txn(&e, p, 7, false, 2).await;
    assert_eq!(abort_at, 5);
    assert_eq!(
        produce(&e, p, &config, &txn_batch(8, 0, &["e"]), Some(1)).await,
        (ErrorCode::None, 6)
    );
    assert_eq!(
        e.storage.counters().snapshot().put_requests,
        puts + 2,
        "one PUT per produced segment, none for the two markers"
    );

    let all = fetch(&e, p, 0, IsolationLevel::ReadUncommitted, 1 << 20).await;
    assert_eq!(all.error, ErrorCode::None);
    assert_eq!(
        (
            all.high_watermark,
            all.last_stable_offset,
            &all.aborted_transactions
        ),
        (7, 6, &None)
    );
    assert_eq!(
        shape(&all),
        vec![
            (0, false, 7),
            (2, false, -1),
            (3, true, 7),
            (4, false, 7),
            (5, true, 7),
            (6, false, 8)
        ]
    );
    let batches = split_batches(all.records_bytes()).unwrap();
    let commit = parse_end_txn_marker(batches[2].as_bytes()).unwrap();
    assert!(commit.commit);
    assert_eq!(
        (
            commit.base_offset,
            commit.producer_id,
            commit.coordinator_epoch,
            commit.timestamp,
            commit.partition_leader_epoch
        ),
        (3, 7, 3, NOW + 7, 5)
    );
    assert!(!parse_end_txn_marker(batches[4].as_bytes()).unwrap().commit);

    let committed = fetch(&e, p, 0, IsolationLevel::ReadCommitted, 1 << 20).await;
    assert_eq!(committed.last_stable_offset, 6);
    assert_eq!(
        shape(&committed),
        vec![
            (0, false, 7),
            (2, false, -1),
            (3, true, 7),
            (4, false, 7),
            (5, true, 7)
        ]
    );
    assert_eq!(committed.aborted_transactions, Some(vec![aborted(7, 4, 5)]));
    let at_lso = fetch(&e, p, 6, IsolationLevel::ReadCommitted, 1 << 20).await;
    assert_eq!(
        (at_lso.records_len(), at_lso.aborted_transactions),
        (0, Some(vec![]))
    );

    // The byte limit stops after the commit marker: producer 7's abort starts later, so it is not
    // reported for what is served.
    let first_three: u32 = batches[..3].iter().map(|b| b.len() as u32).sum();
    let cut = fetch(&e, p, 0, IsolationLevel::ReadCommitted, first_three).await;
    assert_eq!(shape(&cut).len(), 3);
    assert_eq!(cut.aborted_transactions, Some(vec![]));
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn commit_abort_and_isolation_model() {
    commit_abort_and_isolation(false).await;
}

/// Record-level ListOffsets: LATEST under `read_committed` is the last stable offset, a timestamp
/// found in an open transaction is not answered there, and a marker's time finds the marker
/// (served without a read, like a LogAppendTime batch).
async fn list_offsets_isolation(sqlite: bool) {
    let e = env(sqlite).await;
    let config = TopicConfig::default();
    let p = TopicIdPartition::new(topic(&e, config.clone()).await, 0);
    assert_eq!(
        produce(&e, p, &config, &plain_batch(&["a"]), None).await,
        (ErrorCode::None, 0)
    );
    assert_eq!(
        produce(&e, p, &config, &txn_batch(7, 0, &["b"]), Some(1)).await,
        (ErrorCode::None, 1)
    );
    let list = |timestamp, isolation| ListOffsetsPartition {
        partition: p,
        timestamp,
        leader_epoch: 5,
        isolation,
    };
    let rc = IsolationLevel::ReadCommitted;
    let ru = IsolationLevel::ReadUncommitted;
    let answers = e
        .fetcher
        .list_offsets(&[
            list(LATEST_TIMESTAMP, rc),
            list(LATEST_TIMESTAMP, ru),
            list(NOW, rc),
            list(NOW, ru),
        ])
        .await
        .unwrap();
    let got: Vec<(i64, i64)> = answers.iter().map(|a| (a.offset, a.timestamp)).collect();
    assert_eq!(got, vec![(1, -1), (2, -1), (0, NOW), (0, NOW)]);
    e.clock.advance(1_000);
    assert_eq!(end_txn(&e, p, 7, true, 1).await, 2);
    let answers = e
        .fetcher
        .list_offsets(&[
            list(LATEST_TIMESTAMP, rc),
            list(NOW + 1, rc),
            list(MAX_TIMESTAMP, rc),
        ])
        .await
        .unwrap();
    let got: Vec<(i64, i64)> = answers.iter().map(|a| (a.offset, a.timestamp)).collect();
    assert_eq!(
        got,
        vec![(3, -1), (2, NOW + 1_000), (2, NOW + 1_000)],
        "the marker holds the latest time"
    );
    e.writer.close().await;
}

#[tokio::test(start_paused = true)]
async fn list_offsets_isolation_model() {
    list_offsets_isolation(false).await;
}

/// On a LogAppendTime topic the marker is served with attribute bit 3 and its commit time.
#[tokio::test(start_paused = true)]
async fn marker_on_log_append_time_topic() {
    let e = env(false).await;
    let config = TopicConfig::default().with_timestamp_type(TimestampType::LogAppendTime);
    let p = TopicIdPartition::new(topic(&e, config.clone()).await, 0);
    assert_eq!(
        produce(&e, p, &config, &txn_batch(7, 0, &["a"]), Some(1)).await,
        (ErrorCode::None, 0)
    );
    e.clock.advance(42);
    assert_eq!(end_txn(&e, p, 7, false, 1).await, 1);
    let f = fetch(&e, p, 1, IsolationLevel::ReadCommitted, 1 << 20).await;
    let batches = split_batches(f.records_bytes()).unwrap();
    assert_eq!(batches.len(), 1);
    let m = parse_end_txn_marker(batches[0].as_bytes()).unwrap();
    assert!(m.log_append_time && !m.commit);
    assert_eq!(m.timestamp, NOW + 42);
    assert_eq!(f.aborted_transactions, Some(vec![aborted(7, 0, 1)]));
    e.writer.close().await;
}

// SQLite works on blocking threads: a paused clock would let the writer's commit timeout fire
// while a query runs, so these run on the real clock (the coordinator still reads a ManualClock).
#[tokio::test]
async fn commit_abort_and_isolation_sqlite() {
    commit_abort_and_isolation(true).await;
}

#[tokio::test]
async fn list_offsets_isolation_sqlite() {
    list_offsets_isolation(true).await;
}

/// A batch verified for the producer's next transaction while its previous one is still open in
/// the partition (that transaction's marker not written yet) is answered NOT_ENOUGH_REPLICAS, as
/// Kafka's `ReplicaManager` answers a verification that says CONCURRENT_TRANSACTIONS, so clients
/// retry it; once the marker is written, the retry opens the next transaction.
#[tokio::test(start_paused = true)]
async fn next_transaction_before_the_marker_is_retriable() {
    let e = env(false).await;
    let config = TopicConfig::default();
    let p = TopicIdPartition::new(topic(&e, config.clone()).await, 0);
    assert_eq!(
        produce(&e, p, &config, &txn_batch(7, 0, &["a"]), Some(1)).await,
        (ErrorCode::None, 0)
    );
    let mut part = ProducePartition::new(
        p,
        Arc::new(config.clone()),
        txn_batch(7, 1, &["b"]).as_bytes().clone(),
    )
    .with_txn_seq(2);
    let r = e.writer.produce(vec![part.clone()]).await.remove(0);
    assert_eq!(r.error, ErrorCode::NotEnoughReplicas, "{r:?}");
    assert_eq!(
        r.error_message.as_deref(),
        Some(
            "Unable to verify the partition has been added to the transaction. \
             Underlying error: CONCURRENT_TRANSACTIONS"
        )
    );
    assert!(r.error.is_retriable());
    assert_eq!(end_txn(&e, p, 7, false, 1).await, 1);
    part = part.with_txn_seq(2);
    let r = e.writer.produce(vec![part]).await.remove(0);
    assert_eq!((r.error, r.base_offset), (ErrorCode::None, 2));
    let f = fetch(&e, p, 0, IsolationLevel::ReadCommitted, 1 << 20).await;
    assert_eq!(f.aborted_transactions, Some(vec![aborted(7, 0, 1)]));
    assert_eq!(f.last_stable_offset, 2, "the next transaction is open");
    e.writer.close().await;
}
