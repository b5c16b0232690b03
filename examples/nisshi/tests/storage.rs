//! `DisklessStorage` through Nisshi's `Storage` trait, on Nisshi's SQLite engine and this
//! project's SQLite coordinator and local-file objects: classic and diskless topics side by side,
//! a restart on the same data, transactions spanning both kinds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    base_timestamp, batch, begin_txn, node, node_with_c_and_d, read_all, topic, txn_batch, values,
};
use tansu_sans_io::{
    ErrorCode, IsolationLevel, ListOffset,
    delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic},
};
use tansu_storage::{Storage, TopicId, Topition};

/// DeleteRecords of `topic`'s partition 0 below `offset`.
fn delete_up_to(topic: &str, offset: i64) -> DeleteRecordsTopic {
    DeleteRecordsTopic::default()
        .name(topic.into())
        .partitions(Some(vec![
            DeleteRecordsPartition::default()
                .partition_index(0)
                .offset(offset),
        ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_and_diskless_topics_side_by_side_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = node(dir.path()).await;
    let s = running.storage.clone();

    let classic_id = s
        .create_topic(topic("classic", 2, None), false)
        .await
        .unwrap();
    let diskless_id = s
        .create_topic(topic("wal", 3, Some(true)), false)
        .await
        .unwrap();
    assert_ne!(classic_id, diskless_id);
    assert!(s.diskless_topic("classic").await.unwrap().is_none());
    let info = s.diskless_topic("wal").await.unwrap().expect("diskless");
    assert_eq!(
        info.topic_id, diskless_id,
        "Nisshi's topic id is the coordinator's"
    );
    assert_eq!(info.partitions, 3);

    // Nisshi's metadata knows both, with their partition counts.
    let meta = s
        .metadata(Some(&[
            TopicId::Name("wal".into()),
            TopicId::Name("classic".into()),
        ]))
        .await
        .unwrap();
    let counts: Vec<usize> = meta
        .topics()
        .iter()
        .map(|t| t.partitions.as_ref().map_or(0, Vec::len))
        .collect();
    assert_eq!(counts, vec![3, 2]);

    let wal0 = Topition::new("wal", 0);
    let classic0 = Topition::new("classic", 0);
    assert_eq!(s.produce(None, &wal0, batch(&["a", "b"])).await.unwrap(), 0);
    assert_eq!(s.produce(None, &wal0, batch(&["c"])).await.unwrap(), 2);
    assert_eq!(s.produce(None, &classic0, batch(&["x"])).await.unwrap(), 0);

    // The diskless data is in the coordinator, not in Nisshi's engine.
    let engine_stage = s.inner().offset_stage(&wal0).await.unwrap();
    assert_eq!(engine_stage.high_watermark(), 0);
    let stage = s.offset_stage(&wal0).await.unwrap();
    assert_eq!(
        (
            stage.log_start(),
            stage.high_watermark(),
            stage.last_stable()
        ),
        (0, 3, 3)
    );
    assert_eq!(
        values(&read_all(&s, &wal0, IsolationLevel::ReadUncommitted).await),
        ["a", "b", "c"]
    );
    assert_eq!(
        values(&read_all(&s, &classic0, IsolationLevel::ReadUncommitted).await),
        ["x"]
    );
    // Offsets are the coordinator's, injected into the stored batches.
    let read = read_all(&s, &wal0, IsolationLevel::ReadUncommitted).await;
    assert_eq!(
        read.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        vec![0, 2]
    );

    // ListOffsets: earliest, latest and by timestamp on both kinds.
    let listed = s
        .list_offsets(
            IsolationLevel::ReadUncommitted,
            &[
                (wal0.clone(), ListOffset::Earliest),
                (classic0.clone(), ListOffset::Latest),
                (wal0.clone(), ListOffset::Latest),
                (
                    wal0.clone(),
                    ListOffset::Timestamp(
                        std::time::UNIX_EPOCH
                            + std::time::Duration::from_millis(
                                u64::try_from(base_timestamp() + 1).unwrap(),
                            ),
                    ),
                ),
            ],
        )
        .await
        .unwrap();
    let offsets: Vec<(String, Option<i64>)> = listed
        .iter()
        .map(|(tp, r)| (tp.topic().to_string(), r.offset()))
        .collect();
    assert_eq!(
        offsets,
        vec![
            ("wal".to_string(), Some(0)),
            ("classic".to_string(), Some(1)),
            ("wal".to_string(), Some(3)),
            ("wal".to_string(), Some(1)),
        ]
    );

    // DeleteRecords moves the diskless log start.
    let deleted = s.delete_records(&[delete_up_to("wal", 2)]).await.unwrap();
    let low = deleted[0].partitions.as_ref().unwrap()[0].low_watermark;
    assert_eq!(low, 2);
    // Nisshi's SQLite engine has no DeleteRecords (it panics in tansu 0.6.0, ending its request
    // loop): the classic partition is refused without asking it, the diskless one in the same
    // request is done, and the engine still answers afterwards.
    let mixed = s
        .delete_records(&[delete_up_to("classic", 1), delete_up_to("wal", 2)])
        .await
        .unwrap();
    let codes: Vec<(String, i16)> = mixed
        .iter()
        .map(|t| (t.name.clone(), t.partitions.as_ref().unwrap()[0].error_code))
        .collect();
    assert_eq!(
        codes,
        [
            ("classic".to_string(), i16::from(ErrorCode::PolicyViolation)),
            ("wal".to_string(), 0)
        ]
    );
    assert_eq!(s.offset_stage(&wal0).await.unwrap().log_start(), 2);

    // An unknown partition of a diskless topic is refused, not sent to Nisshi's engine.
    let err = s
        .produce(None, &Topition::new("wal", 7), batch(&["z"]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            tansu_storage::Error::Api(ErrorCode::UnknownTopicOrPartition)
        ),
        "{err:?}"
    );

    drop(s);
    running.shutdown().await;

    // The same data directory again: both kinds of topic come back as they were.
    let running = node(dir.path()).await;
    let s = running.storage.clone();
    assert!(s.diskless_topic("wal").await.unwrap().is_some());
    assert!(s.diskless_topic("classic").await.unwrap().is_none());
    assert_eq!(s.produce(None, &wal0, batch(&["d"])).await.unwrap(), 3);
    let read = read_all(&s, &wal0, IsolationLevel::ReadUncommitted).await;
    assert_eq!(
        values(&read),
        ["c", "d"],
        "log start 2 kept across the restart"
    );
    assert_eq!(
        values(&read_all(&s, &classic0, IsolationLevel::ReadUncommitted).await),
        ["x"]
    );

    // DeleteTopics is refused on this engine (it would delete every topic of the cluster, see
    // the next test) and changes nothing on either side.
    assert_eq!(
        s.delete_topic(&TopicId::Name("wal".into())).await.unwrap(),
        ErrorCode::TopicDeletionDisabled
    );
    assert!(s.diskless_topic("wal").await.unwrap().is_some());
    let left: Vec<String> = s
        .with_node(|n| n.coordinator().clone())
        .unwrap()
        .list_topics()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(left, ["wal"]);
    assert_eq!(
        engine_topics(&s, &["classic", "wal"]).await,
        ["classic", "wal"]
    );
    assert_eq!(
        values(&read_all(&s, &classic0, IsolationLevel::ReadUncommitted).await),
        ["x"]
    );
    running.shutdown().await;
}

/// The names of `names` that Nisshi's engine knows.
async fn engine_topics<S: Storage>(s: &S, names: &[&str]) -> Vec<String> {
    let ids: Vec<TopicId> = names.iter().map(|n| TopicId::Name((*n).into())).collect();
    s.metadata(Some(&ids))
        .await
        .unwrap()
        .topics()
        .iter()
        .filter(|t| t.error_code == i16::from(ErrorCode::None))
        .filter_map(|t| t.name.clone())
        .collect()
}

/// Why DeleteTopics is refused on Nisshi's SQL engines (`DisklessSettings::engine_delete_topic`):
/// tansu 0.6.0's SQLite engine, asked to delete one topic, deletes every topic of the cluster. When
/// this fails after a tansu upgrade, the engine deletes one topic and the refusal can go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_0_6_0s_sqlite_engine_deletes_every_topic_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let running = node(dir.path()).await;
    let s = running.storage.clone();
    s.create_topic(topic("kept", 1, Some(false)), false)
        .await
        .unwrap();
    s.create_topic(topic("gone", 1, Some(false)), false)
        .await
        .unwrap();
    assert_eq!(engine_topics(&s, &["kept", "gone"]).await, ["kept", "gone"]);
    assert_eq!(
        s.inner()
            .delete_topic(&TopicId::Name("gone".into()))
            .await
            .unwrap(),
        ErrorCode::None
    );
    assert_eq!(
        engine_topics(&s, &["kept", "gone"]).await,
        Vec::<String>::new(),
        "tansu's engine deleted only the named topic: lift the DeleteTopics refusal"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_over_a_classic_and_a_diskless_partition_ends_in_both() {
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));

    for (round, commit) in [(0, false), (1, true)] {
        let producer = begin_txn(&s, "tx", &[("c", 0), ("d", 0)]).await;
        let txn = |v: &str| txn_batch(&producer, &[v]);
        let word = if commit { "kept" } else { "dropped" };
        s.produce(Some("tx"), &c0, txn(word)).await.unwrap();
        s.produce(Some("tx"), &d0, txn(word)).await.unwrap();

        // Open: read_committed sees nothing of it on the diskless side (the LSO holds).
        let stage = s.offset_stage(&d0).await.unwrap();
        assert!(
            stage.last_stable() < stage.high_watermark(),
            "round {round}: {stage:?}"
        );
        assert!(
            values(&read_all(&s, &d0, IsolationLevel::ReadCommitted).await)
                .iter()
                .all(|v| v != word)
        );

        let ended = s
            .txn_end("tx", producer.id, producer.epoch, commit)
            .await
            .unwrap();
        assert_eq!(ended, ErrorCode::None);
        assert_eq!(s.finish_endings(i64::MAX).await, 0, "every marker written");
        let stage = s.offset_stage(&d0).await.unwrap();
        assert_eq!(stage.last_stable(), stage.high_watermark(), "round {round}");
    }
    let committed_d = values(&read_all(&s, &d0, IsolationLevel::ReadCommitted).await);
    assert_eq!(
        committed_d,
        ["kept"],
        "the aborted batch is left out, the committed one read"
    );
    let all_d = values(&read_all(&s, &d0, IsolationLevel::ReadUncommitted).await);
    assert_eq!(all_d, ["dropped", "kept"]);
    let committed_c = values(&read_all(&s, &c0, IsolationLevel::ReadCommitted).await);
    assert!(committed_c.contains(&"kept".to_string()), "{committed_c:?}");
    running.shutdown().await;
}

/// Requests on which Nisshi 0.6.0's engine panics (`todo!()`, ending its request loop and with it
/// every later call) are answered without reaching it, and the engine keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_nisshis_engine_panics_on_are_answered_and_it_keeps_working() {
    use tansu_sans_io::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let dir = tempfile::tempdir().unwrap();
    let running = node(dir.path()).await;
    let s = running.storage.clone();
    s.create_topic(topic("c", 1, Some(false)), false)
        .await
        .unwrap();

    // KIP-360's re-initialisation with the current id and epoch, and versions 0-2 (no id).
    let first = s
        .init_producer(None, 60_000, Some(-1), Some(-1))
        .await
        .unwrap();
    let again = s
        .init_producer(None, 60_000, Some(first.id), Some(first.epoch))
        .await
        .unwrap();
    assert_eq!(again.error, ErrorCode::None);
    let old = s.init_producer(None, 60_000, None, None).await.unwrap();
    assert_eq!(old.error, ErrorCode::None);

    // APPEND (2) and SUBTRACT (3).
    for op in [2, 3] {
        let answer = s
            .incremental_alter_resource(
                AlterConfigsResource::default()
                    .resource_type(2)
                    .resource_name("c".into())
                    .configs(Some(vec![
                        AlterableConfig::default()
                            .name("cleanup.policy".into())
                            .config_operation(op)
                            .value(Some("delete".into())),
                    ])),
            )
            .await
            .unwrap();
        assert_eq!(answer.error_code, i16::from(ErrorCode::InvalidConfig));
    }

    // Still answering: a produce to the classic topic.
    assert_eq!(
        s.produce(None, &Topition::new("c", 0), batch(&["x"]))
            .await
            .unwrap(),
        0
    );
    running.shutdown().await;
}

/// The adapter keeps an open transaction's diskless partitions on disk: a node restarted between
/// a transaction's produce and its EndTxn (the client's retry) still ends it on both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_across_a_restart_ends_on_its_diskless_partition() {
    let (dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));
    let producer = begin_txn(&s, "tx", &[("c", 0), ("d", 0)]).await;
    s.produce(Some("tx"), &c0, txn_batch(&producer, &["kept"]))
        .await
        .unwrap();
    s.produce(Some("tx"), &d0, txn_batch(&producer, &["kept"]))
        .await
        .unwrap();
    drop(s);
    running.shutdown().await;

    let running = node(dir.path()).await;
    let s = running.storage.clone();
    let stage = s.offset_stage(&d0).await.unwrap();
    assert!(stage.last_stable() < stage.high_watermark(), "{stage:?}");
    let ended = s
        .txn_end("tx", producer.id, producer.epoch, true)
        .await
        .unwrap();
    assert_eq!(ended, ErrorCode::None);
    assert_eq!(s.finish_endings(i64::MAX).await, 0);
    let stage = s.offset_stage(&d0).await.unwrap();
    assert_eq!(
        stage.last_stable(),
        stage.high_watermark(),
        "the marker was written"
    );
    assert_eq!(
        values(&read_all(&s, &d0, IsolationLevel::ReadCommitted).await),
        ["kept"]
    );
    running.shutdown().await;
}

/// The control types (0 abort, 1 commit) of the control batches among `batches`, in order.
fn markers_in(batches: &[tansu_sans_io::record::deflated::Batch]) -> Vec<i16> {
    let mut out = Vec::new();
    for b in batches.iter().filter(|b| b.is_control()) {
        let parsed = diskless_core::RecordBatch::parse(bytes::Bytes::from(b.clone())).unwrap();
        let records = parsed.records_bytes();
        for r in diskless_core::RecordIter::new(&records, 1) {
            let key = r.unwrap().key.unwrap();
            out.push(i16::from_be_bytes([key[2], key[3]]));
        }
    }
    out
}

/// A transaction over `c` 0 (classic) and `d` 0 (diskless) whose EndTxn(commit) stops right after
/// Nisshi's engine decided it, as a node killed there would; the node restarted on the same data.
async fn killed_after_the_engine_committed() -> (
    tempfile::TempDir,
    diskless_nisshi::run::Running,
    tansu_storage::ProducerIdResponse,
) {
    let (dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let producer = begin_txn(&s, "tx", &[("c", 0), ("d", 0)]).await;
    for tp in [Topition::new("c", 0), Topition::new("d", 0)] {
        s.produce(Some("tx"), &tp, txn_batch(&producer, &["kept"]))
            .await
            .unwrap();
    }
    s.stop_after_engine_decides();
    assert!(
        s.txn_end("tx", producer.id, producer.epoch, true)
            .await
            .is_err()
    );
    drop(s);
    running.shutdown().await;
    let running = node(dir.path()).await;
    (dir, running, producer)
}

/// Both kinds committed: the classic partition ends with a commit marker, the diskless one's
/// records are read_committed.
async fn assert_committed_in_both(s: &diskless_nisshi::storage::DisklessStorage<impl Storage>) {
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));
    let stage = s.offset_stage(&d0).await.unwrap();
    assert_eq!(stage.last_stable(), stage.high_watermark(), "{stage:?}");
    let diskless = read_all(s, &d0, IsolationLevel::ReadCommitted).await;
    assert_eq!(values(&diskless), ["kept"]);
    assert_eq!(
        markers_in(&diskless),
        [1],
        "a commit marker on the diskless side"
    );
    let classic = read_all(s, &c0, IsolationLevel::ReadUncommitted).await;
    assert_eq!(
        markers_in(&classic),
        [1],
        "Nisshi's engine committed the classic side"
    );
}

/// A node killed after Nisshi's engine decided an EndTxn(commit) and before the diskless markers
/// were written: the client starts over (InitProducerId, which fences the transaction) on the
/// restarted node. The saved end is finished first, so the diskless side commits as the engine
/// decided, not aborted by the fence. (Before the EndTxn was saved ahead of the engine's decision,
/// this read nothing on the diskless side: the fence aborted it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_decided_before_a_crash_is_finished_after_it() {
    let (_dir, running, _producer) = killed_after_the_engine_committed().await;
    let s = running.storage.clone();
    let again = s
        .init_producer(Some("tx"), 60_000, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(again.error, ErrorCode::None);
    assert_committed_in_both(&s).await;
    running.shutdown().await;
}

/// The same crash, then the client retries its EndTxn: the opposite outcome is refused with
/// Kafka's `INVALID_TXN_STATE`, the same one finishes it on both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_decided_before_a_crash_is_finished_by_its_retry() {
    let (_dir, running, producer) = killed_after_the_engine_committed().await;
    let s = running.storage.clone();
    assert_eq!(
        s.txn_end("tx", producer.id, producer.epoch, false)
            .await
            .unwrap(),
        ErrorCode::InvalidTxnState
    );
    assert_eq!(
        s.txn_end("tx", producer.id, producer.epoch, true)
            .await
            .unwrap(),
        ErrorCode::None
    );
    assert_committed_in_both(&s).await;
    running.shutdown().await;
}

/// A producer that never ends its transaction (it died): once `transaction.timeout.ms` has passed,
/// `maintain` aborts it on both kinds, as Kafka's transaction coordinator does, so read_committed
/// consumers of the diskless partition move on; the old producer is fenced until it initialises
/// again, and then transacts as before. (tansu 0.6.0 has no transaction timeout: without the
/// abort the diskless partition's LSO stayed below the records forever.) The timeout is the
/// transaction record's, at the coordinator's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_past_its_timeout_is_aborted_on_both_kinds() {
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = running.storage.clone();
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));
    let producer = s
        .init_producer(Some("slow"), 1_500, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(producer.error, ErrorCode::None);
    common::add_to_txn(&s, "slow", &producer, &[("c", 0), ("d", 0)]).await;
    for tp in [&c0, &d0] {
        s.produce(Some("slow"), tp, txn_batch(&producer, &["lost"]))
            .await
            .unwrap();
    }
    let stage = s.offset_stage(&d0).await.unwrap();
    assert!(stage.last_stable() < stage.high_watermark(), "{stage:?}");

    // Within the timeout: nothing happens.
    s.maintain(s.now()).await.unwrap();
    let stage = s.offset_stage(&d0).await.unwrap();
    assert!(stage.last_stable() < stage.high_watermark(), "{stage:?}");

    // Past it: aborted on both kinds.
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    s.maintain(s.now()).await.unwrap();
    let stage = s.offset_stage(&d0).await.unwrap();
    assert_eq!(stage.last_stable(), stage.high_watermark(), "{stage:?}");
    let diskless = read_all(&s, &d0, IsolationLevel::ReadCommitted).await;
    assert!(values(&diskless).is_empty(), "{:?}", values(&diskless));
    assert_eq!(
        markers_in(&diskless),
        [0],
        "an abort marker on the diskless side"
    );
    let classic = read_all(&s, &c0, IsolationLevel::ReadUncommitted).await;
    assert_eq!(
        markers_in(&classic),
        [0],
        "Nisshi's engine aborted the classic side"
    );

    // The old producer is fenced: it cannot commit what was aborted, nor go on.
    assert_eq!(
        s.txn_end("slow", producer.id, producer.epoch, true)
            .await
            .unwrap(),
        ErrorCode::ProducerFenced
    );
    let added = s
        .txn_add_partitions(tansu_storage::TxnAddPartitionsRequest::VersionZeroToThree {
            transaction_id: "slow".into(),
            producer_id: producer.id,
            producer_epoch: producer.epoch,
            topics: vec![
                tansu_sans_io::add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .name("d".into())
                    .partitions(Some(vec![0])),
            ],
        })
        .await;
    assert!(
        matches!(
            added,
            Err(tansu_storage::Error::Api(ErrorCode::ProducerFenced))
        ),
        "{added:?}"
    );

    // Initialised again, it transacts as before.
    let again = begin_txn(&s, "slow", &[("d", 0)]).await;
    s.produce(Some("slow"), &d0, txn_batch(&again, &["kept"]))
        .await
        .unwrap();
    assert_eq!(
        s.txn_end("slow", again.id, again.epoch, true)
            .await
            .unwrap(),
        ErrorCode::None
    );
    let diskless = read_all(&s, &d0, IsolationLevel::ReadCommitted).await;
    assert_eq!(values(&diskless), ["kept"]);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_out_of_kafkas_bounds_is_refused() {
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = &running.storage;
    for timeout in [
        0,
        -1,
        diskless_nisshi::storage::TRANSACTION_MAX_TIMEOUT_MS + 1,
        i32::MAX,
    ] {
        let r = s
            .init_producer(Some("t-bounds"), timeout, Some(-1), Some(-1))
            .await
            .unwrap();
        assert_eq!(
            r.error,
            tansu_sans_io::ErrorCode::InvalidTransactionTimeout,
            "{timeout}"
        );
    }
    // Within the bounds, and any timeout without a transactional id (an idempotent producer).
    let r = s
        .init_producer(Some("t-bounds"), 60_000, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(r.error, tansu_sans_io::ErrorCode::None);
    let r = s
        .init_producer(None, i32::MAX, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(r.error, tansu_sans_io::ErrorCode::None);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_replica_assignments_give_the_partition_count() {
    use tansu_sans_io::create_topics_request::CreatableReplicaAssignment;

    let (_dir, running) = node_with_c_and_d(1).await;
    let s = &running.storage;
    let assignments: Vec<CreatableReplicaAssignment> = (0..2)
        .map(|i| {
            CreatableReplicaAssignment::default()
                .partition_index(i)
                .broker_ids(Some(vec![111]))
        })
        .collect();
    // As tansu 0.6.0's CreateTopics route passes it on: num_partitions -1 already turned into 3.
    for (name, diskless) in [("assigned-d", true), ("assigned-c", false)] {
        let t = topic(name, 3, Some(diskless)).assignments(Some(assignments.clone()));
        s.create_topic(t, false).await.unwrap();
        let meta = s
            .metadata(Some(&[TopicId::Name(name.into())]))
            .await
            .unwrap();
        assert_eq!(
            meta.topics()[0].partitions.as_ref().map(Vec::len),
            Some(2),
            "{name}"
        );
    }
    assert_eq!(
        s.diskless_topic("assigned-d")
            .await
            .unwrap()
            .map(|t| t.partitions),
        Some(2)
    );
    running.shutdown().await;
}

/// Offsets sent with transactions (AddOffsetsToTxn + TxnOffsetCommit, as a consume-transform-
/// produce loop sends them) for every partition of an input topic, over several transactions of one
/// producer epoch: after each commit OffsetFetch answers every partition's offset. Run on the
/// engine alone (`inner`, the classic path) and through the adapter (diskless output topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_sent_with_transactions_are_all_committed() {
    use tansu_sans_io::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    let (_dir, running) = node_with_c_and_d(1).await;
    let s = &running.storage;
    s.create_topic(topic("in", 4, Some(true)), false)
        .await
        .unwrap();
    let inputs: Vec<Topition> = (0..4).map(|p| Topition::new("in", p)).collect();
    for (tid, out, group) in [("tx-c", "c", "g-c"), ("tx-d", "d", "g-d")] {
        let producer = begin_txn(s, tid, &[(out, 0)]).await;
        for round in 1..=3i64 {
            if round > 1 {
                common::add_to_txn(s, tid, &producer, &[(out, 0)]).await;
            }
            let out_tp = Topition::new(out, 0);
            let b = common::batch_from(
                diskless_core::RecordBatchBuilder::new()
                    .transactional(true)
                    .producer(producer.id, producer.epoch, round as i32 - 1),
                &["x"],
            );
            s.produce(Some(tid), &out_tp, b).await.unwrap();
            let added = s
                .txn_add_offsets(tid, producer.id, producer.epoch, group)
                .await
                .unwrap();
            assert_eq!(added, ErrorCode::None);
            let partitions = (0..4)
                .map(|p| {
                    TxnOffsetCommitRequestPartition::default()
                        .partition_index(p)
                        .committed_offset(round * 10 + i64::from(p))
                        .committed_leader_epoch(Some(-1))
                        .committed_metadata(Some(String::new()))
                })
                .collect();
            let answer = s
                .txn_offset_commit(tansu_storage::TxnOffsetCommitRequest {
                    transaction_id: tid.into(),
                    group_id: group.into(),
                    producer_id: producer.id,
                    producer_epoch: producer.epoch,
                    generation_id: Some(-1),
                    member_id: Some(String::new()),
                    group_instance_id: None,
                    topics: vec![
                        TxnOffsetCommitRequestTopic::default()
                            .name("in".into())
                            .partitions(Some(partitions)),
                    ],
                })
                .await
                .unwrap();
            let codes: Vec<i16> = answer
                .iter()
                .flat_map(|t| t.partitions.iter().flatten().map(|p| p.error_code))
                .collect();
            assert_eq!(codes, [0, 0, 0, 0], "{tid} round {round}");
            let ended = s
                .txn_end(tid, producer.id, producer.epoch, true)
                .await
                .unwrap();
            assert_eq!(ended, ErrorCode::None, "{tid} round {round}");
            let fetched = s.offset_fetch(Some(group), &inputs, None).await.unwrap();
            let want: Vec<i64> = (0..4).map(|p| round * 10 + p).collect();
            let got: Vec<i64> = inputs.iter().map(|tp| fetched[tp]).collect();
            assert_eq!(got, want, "{tid} round {round}");
        }
    }
    running.shutdown().await;
}

/// Two nodes sharing the batch coordinator and the objects, each with its own Nisshi engine: a
/// transaction begun on one node (InitProducerId, AddPartitionsToTxn), produced through and ended
/// on the other (its transaction coordinator moved, as when a node fails) commits on the diskless
/// side, because the transaction record, not a node's memory, names its partitions and verifies
/// its batches; and the first node, past the transaction's timeout, aborts nothing. (Before the
/// record, the second node wrote no marker and the first one's timeout wrote ABORT over the
/// commit: chaos/README.md, seed 21.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_ended_on_another_node_commits_its_diskless_partitions() {
    let (dir_a, a) = node_with_c_and_d(2).await;
    let dir_b = tempfile::tempdir().unwrap();
    let coordinator = format!(
        "sqlite://{}",
        dir_a
            .path()
            .join(diskless_coordinator::SQLITE_FILE)
            .display()
    );
    let objects = format!("file://{}", dir_a.path().join("objects").display());
    let b = common::node_with_args(
        dir_b.path(),
        &[
            "--diskless-coordinator",
            &coordinator,
            "--diskless-storage",
            &objects,
        ],
    )
    .await;
    let (sa, sb) = (a.storage.clone(), b.storage.clone());
    let (d0, d1) = (Topition::new("d", 0), Topition::new("d", 1));
    let producer = sa
        .init_producer(Some("moving"), 1_500, Some(-1), Some(-1))
        .await
        .unwrap();
    assert_eq!(producer.error, ErrorCode::None);
    common::add_to_txn(&sa, "moving", &producer, &[("d", 0), ("d", 1)]).await;
    for tp in [&d0, &d1] {
        sb.produce(Some("moving"), tp, txn_batch(&producer, &["kept"]))
            .await
            .unwrap();
    }
    assert_eq!(
        sb.txn_end("moving", producer.id, producer.epoch, true)
            .await
            .unwrap(),
        ErrorCode::None
    );
    for tp in [&d0, &d1] {
        let read = read_all(&sa, tp, IsolationLevel::ReadCommitted).await;
        assert_eq!(values(&read), ["kept"], "{tp:?}");
        assert_eq!(markers_in(&read), [1], "{tp:?}: one COMMIT marker");
    }
    // Past the transaction's timeout, the first node's maintenance aborts nothing.
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    sa.maintain(sa.now()).await.unwrap();
    sb.maintain(sb.now()).await.unwrap();
    for tp in [&d0, &d1] {
        let read = read_all(&sa, tp, IsolationLevel::ReadUncommitted).await;
        assert_eq!(markers_in(&read), [1], "{tp:?}: no ABORT after the COMMIT");
    }
    // A later batch of the ended transaction (the next sequence) is no longer verified, on
    // either node.
    for s in [&sa, &sb] {
        let next = common::batch_from(
            diskless_core::RecordBatchBuilder::new()
                .transactional(true)
                .producer(producer.id, producer.epoch, 1),
            &["late"],
        );
        let late = s.produce(Some("moving"), &d0, next).await;
        assert!(late.is_err(), "{late:?}");
    }
    b.shutdown().await;
    a.shutdown().await;
}
