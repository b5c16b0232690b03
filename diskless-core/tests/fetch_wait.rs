//! Long-polling fetches (`Fetcher::fetch_wait`, Kafka's `DelayedFetch`) through a `DisklessNode`:
//! woken at once by a commit of the node's writers or a transaction marker written through the
//! node's coordinator, by the poll interval for another node sharing the coordinator, answered at
//! `max_wait` (capped) when nothing comes, and at once when nothing is asked, enough is there or
//! something failed. Over the in-memory model and storage, in tokio's paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::coordinator::InMemoryCoordinator;
use futures::future::BoxFuture;
use tokio::time::Instant;

const T0: i64 = 1_700_000_000_000;
/// A poll interval no test waits for: only the commit signal can end a wait early.
const NEVER: Duration = Duration::from_secs(3600);

/// The shared parts of one cluster: storage and coordinator.
struct Cluster {
    clock: Arc<ManualClock>,
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    partition: TopicIdPartition,
}

async fn cluster() -> Cluster {
    let clock = ManualClock::new(T0);
    let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
    let topic_id = uuid::Uuid::from_u128(0xfe7c);
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "long-poll".into(),
            partitions: 1,
            config: TopicConfig::default(),
        })
        .await
        .unwrap();
    Cluster {
        clock,
        storage: Arc::new(ObjectStoreStorage::in_memory()),
        coordinator,
        partition: TopicIdPartition::new(topic_id, 0),
    }
}

/// A node of `c` without workers, polling every `poll` (its writers seal every 20 ms).
fn node(c: &Cluster, broker_id: i32, poll: Duration) -> DisklessNode {
    node_over(c, c.coordinator.clone(), broker_id, poll)
}

fn node_over(
    c: &Cluster,
    coordinator: Arc<dyn BatchCoordinator>,
    broker_id: i32,
    poll: Duration,
) -> DisklessNode {
    DisklessNode::builder(c.storage.clone(), coordinator)
        .with_clock(c.clock.clone())
        .with_keys(Arc::new(diskless_storage::SeededKeys::new(
            broker_id as u64,
        )))
        .with_config(
            NodeConfig::default()
                .with_broker_ids(vec![broker_id])
                .with_metered(false)
                .with_lifecycle(NodeLifecycleConfig::none())
                .with_writer(
                    WalWriterConfig::default()
                        .with_seal_policy(SealPolicy::Interval)
                        .with_commit_interval(Duration::from_millis(20)),
                )
                .with_fetcher(FetcherConfig::default().with_long_poll_interval(poll)),
        )
        .build()
        .unwrap()
}

fn ask(p: TopicIdPartition, offset: i64, isolation: IsolationLevel) -> FetchPartition {
    FetchPartition {
        partition: p,
        fetch_offset: offset,
        partition_max_bytes: 1 << 20,
        leader_epoch: 0,
        isolation,
    }
}

fn records(values: &[&str]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new();
    for v in values {
        b = b.record(T0, None, Some(v.as_bytes()));
    }
    b.build().unwrap()
}

async fn produce(node: &DisklessNode, broker_id: i32, p: TopicIdPartition, b: &RecordBatch) {
    produce_part(
        node,
        broker_id,
        ProducePartition::new(p, Arc::new(TopicConfig::default()), b.as_bytes().clone()),
    )
    .await;
}

async fn produce_part(node: &DisklessNode, broker_id: i32, part: ProducePartition) {
    let answer = node.writer(broker_id).unwrap().produce(vec![part]).await;
    assert_eq!(answer[0].error, ErrorCode::None, "{answer:?}");
}

/// Starts `fetch_wait` of `requests` on `node`'s fetcher in a task: its answer and when it came.
fn spawn_wait(
    node: &DisklessNode,
    requests: Vec<FetchPartition>,
    min_bytes: u32,
    max_wait: Duration,
) -> tokio::task::JoinHandle<(Result<Vec<FetchedPartition>, FetchError>, Instant)> {
    let fetcher = node.fetcher().clone();
    tokio::spawn(async move {
        let answer = fetcher
            .fetch_wait(&requests, 1 << 20, min_bytes, max_wait)
            .await;
        (answer, Instant::now())
    })
}

/// A fetch short of `min_bytes` waits; a produce through a writer of the node ends the wait as
/// soon as it commits, with the new records (the poll interval is an hour and `max_wait` 20 s: only
/// the signal can end it early).
#[tokio::test(start_paused = true)]
async fn a_commit_of_the_nodes_writer_ends_the_wait_at_once() {
    let c = cluster().await;
    let node = node(&c, 1, NEVER);
    assert_eq!(node.commit_signal().count(), 0);
    let start = Instant::now();
    let waiting = spawn_wait(
        &node,
        vec![ask(c.partition, 0, IsolationLevel::ReadUncommitted)],
        1,
        Duration::from_secs(20),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "nothing to read yet: the fetch waits"
    );

    produce(&node, 1, c.partition, &records(&["a", "b"])).await;
    let produced = Instant::now();
    assert_eq!(
        node.commit_signal().count(),
        1,
        "one commit, one notification"
    );
    assert_eq!(
        node.fetcher().commit_signal().count(),
        1,
        "the fetcher's signal is the node's"
    );

    let (answer, answered) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the fetch answers")
        .unwrap();
    let answer = answer.unwrap();
    assert_eq!(answer[0].error, ErrorCode::None);
    assert_eq!(answer[0].high_watermark, 2);
    assert_eq!(split_batches(answer[0].records_bytes()).unwrap().len(), 1);
    assert!(
        answered < start + Duration::from_secs(10),
        "answered at {:?}, produced at {:?}: the commit did not end the wait",
        answered - start,
        produced - start
    );
    node.close().await;
}

/// A writer of another node sharing the coordinator (and storage) does not notify this node's
/// signal: its commit is seen at the next poll, within the poll interval.
#[tokio::test(start_paused = true)]
async fn another_node_sharing_the_coordinator_is_seen_within_the_poll_interval() {
    let c = cluster().await;
    let poll = Duration::from_millis(500);
    let reader = node(&c, 1, poll);
    let writer = node(&c, 2, NEVER);
    let start = Instant::now();
    let waiting = spawn_wait(
        &reader,
        vec![ask(c.partition, 0, IsolationLevel::ReadUncommitted)],
        1,
        Duration::from_secs(30),
    );
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    produce(&writer, 2, c.partition, &records(&["from elsewhere"])).await;
    let produced = Instant::now();
    assert_eq!(writer.commit_signal().count(), 1);

    let (answer, answered) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the fetch answers")
        .unwrap();
    let answer = answer.unwrap();
    assert_eq!(
        reader.commit_signal().count(),
        0,
        "nothing notified the reader"
    );
    assert_eq!(answer[0].high_watermark, 1, "{answer:?}");
    assert!(answer[0].records_len() > 0);
    assert!(
        answered <= produced + poll,
        "answered {:?} after the commit (poll interval {poll:?}, started {:?} before it)",
        answered - produced,
        produced - start
    );
    reader.close().await;
    writer.close().await;
}

/// Nothing comes: the fetch answers its last (empty) read at `max_wait`, and a `max_wait` above
/// the fetcher's `max_wait_limit` is cut to it.
#[tokio::test(start_paused = true)]
async fn nothing_comes_the_answer_comes_at_max_wait_capped_by_the_limit() {
    let c = cluster().await;
    let node = node(&c, 1, Duration::from_millis(250));
    let asked = [ask(c.partition, 0, IsolationLevel::ReadUncommitted)];

    let start = Instant::now();
    let answer = node
        .fetcher()
        .fetch_wait(&asked, 1 << 20, 1, Duration::from_secs(2))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(answer[0].error, ErrorCode::None);
    assert_eq!(answer[0].records_len(), 0);
    assert_eq!(answer[0].high_watermark, 0);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "waited {waited:?} for a max_wait of 2 s"
    );

    // The cap: a fetcher whose max_wait_limit is 3 s answers a 1-hour max_wait after 3 s.
    let capped = Fetcher::builder(c.storage.clone(), c.coordinator.clone())
        .with_config(
            FetcherConfig::default()
                .with_long_poll_interval(NEVER)
                .with_max_wait_limit(Duration::from_secs(3)),
        )
        .build()
        .unwrap();
    assert_eq!(capped.config().max_wait_limit, Duration::from_secs(3));
    let start = Instant::now();
    let answer = capped
        .fetch_wait(&asked, 1 << 20, 1, Duration::from_secs(3600))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(answer[0].records_len(), 0);
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
        "waited {waited:?} with a limit of 3 s"
    );
    node.close().await;
}

/// A coordinator whose `find_batches` fails: the read fails as a whole.
#[derive(Debug)]
struct FailFinds;

impl CoordinatorLayer for FailFinds {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        if op == CoordinatorOp::FindBatches {
            Box::pin(async { Err(CoordinatorError::Unavailable("down for the test".into())) })
        } else {
            call
        }
    }
}

/// No waiting when nothing is asked, when `min_bytes` are already there (or are 0), when a
/// partition answers with an error, or when the read fails; `max_wait` and the poll interval are
/// an hour, so any wait would show.
#[tokio::test(start_paused = true)]
async fn answers_at_once_when_nothing_is_asked_enough_is_there_or_something_failed() {
    let c = cluster().await;
    let node = node(&c, 1, NEVER);
    let hour = Duration::from_secs(3600);
    // Under the default max_wait_limit (30 s), which cuts the hour.
    let soon = Duration::from_secs(10);
    let fetcher = node.fetcher().clone();
    let wait = |requests: Vec<FetchPartition>, min_bytes: u32| {
        let fetcher = fetcher.clone();
        async move {
            let start = Instant::now();
            let answer = fetcher
                .fetch_wait(&requests, 1 << 20, min_bytes, hour)
                .await;
            assert!(
                start.elapsed() < soon,
                "waited {:?} for {requests:?}",
                start.elapsed()
            );
            answer
        }
    };

    // Nothing asked: nothing read, nothing waited for.
    assert!(wait(vec![], 1).await.unwrap().is_empty());
    // min_bytes 0: the first read is enough.
    let read = ask(c.partition, 0, IsolationLevel::ReadUncommitted);
    let answer = wait(vec![read.clone()], 0).await.unwrap();
    assert_eq!(answer[0].records_len(), 0);

    // A partition answered with an error ends the wait: offset out of range, unknown partition.
    let beyond = ask(c.partition, 10, IsolationLevel::ReadUncommitted);
    let answer = wait(vec![read.clone(), beyond], 1).await.unwrap();
    assert_eq!(answer[1].error, ErrorCode::OffsetOutOfRange);
    let unknown = ask(
        TopicIdPartition::new(c.partition.topic_id, 7),
        0,
        IsolationLevel::ReadUncommitted,
    );
    let answer = wait(vec![unknown], 1).await.unwrap();
    assert_eq!(answer[0].error, ErrorCode::UnknownTopicOrPartition);

    // Enough bytes already there.
    produce(&node, 1, c.partition, &records(&["x"])).await;
    let answer = wait(vec![read.clone()], 1).await.unwrap();
    assert!(answer[0].records_len() > 0);
    // ... and not enough: this one waits (until the 30 s limit, cut short here).
    let needy = tokio::time::timeout(
        soon,
        fetcher.fetch_wait(std::slice::from_ref(&read), 1 << 20, 1 << 20, hour),
    )
    .await;
    assert!(needy.is_err(), "fewer than min_bytes: the fetch waits");

    // The read fails as a whole.
    let broken = node_over(
        &c,
        Arc::new(Layered::new(c.coordinator.clone(), FailFinds)),
        3,
        NEVER,
    );
    let start = Instant::now();
    let failed = broken.fetcher().fetch_wait(&[read], 1 << 20, 1, hour).await;
    assert!(
        matches!(failed, Err(FetchError::Coordinator(_))),
        "{failed:?}"
    );
    assert!(start.elapsed() < soon);
    broken.close().await;
    node.close().await;
}

/// A `read_committed` fetch stopped by an open transaction waits for its last stable offset to
/// move: the COMMIT marker written through the node's coordinator (as a host's transaction
/// coordinator writes it) ends the wait at once.
#[tokio::test(start_paused = true)]
async fn a_transaction_marker_through_the_nodes_coordinator_ends_the_wait() {
    let c = cluster().await;
    let node = node(&c, 1, NEVER);
    let txn = RecordBatchBuilder::new()
        .producer(7, 0, 0)
        .transactional(true)
        .record(T0, None, Some(b"in a transaction"))
        .build()
        .unwrap();
    produce_part(
        &node,
        1,
        ProducePartition::new(
            c.partition,
            Arc::new(TopicConfig::default()),
            txn.as_bytes().clone(),
        )
        .with_txn_seq(1),
    )
    .await;
    let before = node.commit_signal().count();
    let start = Instant::now();
    let waiting = spawn_wait(
        &node,
        vec![ask(c.partition, 0, IsolationLevel::ReadCommitted)],
        1,
        Duration::from_secs(20),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "the transaction is open: nothing is stable"
    );

    let marker = node
        .coordinator()
        .write_txn_markers(&[TxnMarker {
            partition: c.partition,
            producer_id: 7,
            producer_epoch: 0,
            coordinator_epoch: 1,
            commit: true,
            txn_seq: Some(1),
        }])
        .await
        .unwrap();
    assert_eq!(marker[0].error, ErrorCode::None, "{marker:?}");
    assert_eq!(node.commit_signal().count(), before + 1);

    let (answer, answered) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the fetch answers")
        .unwrap();
    let answer = answer.unwrap();
    assert_eq!(answer[0].error, ErrorCode::None);
    assert_eq!(answer[0].last_stable_offset, 2);
    assert!(answer[0].records_len() > 0);
    assert!(
        answered < start + Duration::from_secs(10),
        "answered at {:?}: the marker did not end the wait",
        answered - start
    );
    node.close().await;
}

/// A writer built alone notifies the signal it is given once per commit that added a batch; a
/// commit whose batches the coordinator all rejected notifies nothing.
#[tokio::test(start_paused = true)]
async fn a_writer_notifies_only_commits_that_added_batches() {
    let c = cluster().await;
    let signal = CommitSignal::new();
    let mut watcher = signal.subscribe();
    let writer = WalWriter::builder(c.storage.clone(), c.coordinator.clone())
        .with_clock(c.clock.clone())
        .with_seed(1)
        .with_commit_signal(signal.clone())
        .build()
        .unwrap();
    let config = Arc::new(TopicConfig::default());
    let no_topic = TopicIdPartition::new(uuid::Uuid::from_u128(0xdead), 0);
    let refused = writer
        .produce(vec![ProducePartition::new(
            no_topic,
            config.clone(),
            records(&["lost"]).as_bytes().clone(),
        )])
        .await;
    assert_ne!(refused[0].error, ErrorCode::None);
    assert_eq!(
        writer.stats().segments_committed,
        1,
        "the segment was committed"
    );
    assert_eq!(signal.count(), 0, "but added nothing");
    assert!(!watcher.has_changed().unwrap());

    let accepted = writer
        .produce(vec![ProducePartition::new(
            c.partition,
            config,
            records(&["kept"]).as_bytes().clone(),
        )])
        .await;
    assert_eq!(accepted[0].error, ErrorCode::None);
    assert_eq!(signal.count(), 1);
    tokio::time::timeout(Duration::from_secs(1), watcher.changed())
        .await
        .expect("the watcher is woken")
        .unwrap();
    writer.close().await;
}

/// The poll interval is checked: zero would spin.
#[test]
fn a_zero_poll_interval_is_refused() {
    let e = FetcherConfig::default()
        .with_long_poll_interval(Duration::ZERO)
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("long_poll_interval"), "{e}");
    assert_eq!(
        FetcherConfig::default().long_poll_interval,
        DEFAULT_LONG_POLL_INTERVAL
    );
    assert_eq!(
        FetcherConfig::default().max_wait_limit,
        DEFAULT_MAX_WAIT_LIMIT
    );
}
