//! `DisklessStorage` through Nisshi's `Storage` trait, on Nisshi's SQLite engine and this
//! project's SQLite coordinator and local-file objects: classic and diskless topics side by side,
//! a restart on the same data, transactions spanning both kinds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use bytes::Bytes;
use clap::Parser;
use diskless_core::RecordBatchBuilder;
use diskless_nisshi::config::Config;
use diskless_nisshi::run::{Running, start};
use tansu_sans_io::{
    ErrorCode, IsolationLevel, ListOffset,
    add_partitions_to_txn_request::AddPartitionsToTxnTopic,
    create_topics_request::{CreatableTopic, CreatableTopicConfig},
    delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic},
    record::deflated,
};
use tansu_storage::{Storage, TopicId, Topition, TxnAddPartitionsRequest};

async fn node(dir: &Path) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let config = Config::parse_from([
        "nisshi-diskless",
        "--data-dir",
        dir.to_str().unwrap(),
        "--kafka-advertised-listener-url",
        "tcp://127.0.0.1:0",
        "--maintenance-interval-ms",
        "3600000",
        "--diskless-linger-ms",
        "20",
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(&config, Some(listener)).await.unwrap()
}

fn topic(name: &str, partitions: i32, diskless: Option<bool>) -> CreatableTopic {
    let configs = diskless.map(|d| {
        vec![
            CreatableTopicConfig::default()
                .name("diskless.enable".into())
                .value(Some(d.to_string())),
        ]
    });
    CreatableTopic::default()
        .name(name.into())
        .num_partitions(partitions)
        .replication_factor(1)
        .assignments(Some(vec![]))
        .configs(configs)
}

/// The first record timestamp of every batch: a minute before the test started (recent: with
/// 1970 or 2023 timestamps the default `retention.ms` of 7 days deletes what the test reads).
fn base_timestamp() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        use diskless_coordinator::Clock;
        diskless_coordinator::SystemClock.now_ms() - 60_000
    })
}

fn batch(values: &[&str]) -> deflated::Batch {
    batch_from(RecordBatchBuilder::new(), values)
}

fn batch_from(builder: RecordBatchBuilder, values: &[&str]) -> deflated::Batch {
    let mut b = builder;
    for (i, v) in values.iter().enumerate() {
        b = b.record(base_timestamp() + i as i64, None, Some(v.as_bytes()));
    }
    let bytes: Bytes = b.build().unwrap().into_bytes();
    deflated::Batch::try_from(bytes).unwrap()
}

/// The values of every record in `batches`, in order (control batches skipped).
fn values(batches: &[deflated::Batch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        if b.is_control() {
            continue;
        }
        let parsed = diskless_core::RecordBatch::parse(Bytes::from(b.clone())).unwrap();
        let bytes = parsed.records_bytes();
        let count = usize::try_from(b.record_count).unwrap();
        for r in diskless_core::RecordIter::new(&bytes, count) {
            let r = r.unwrap();
            out.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    out
}

async fn read_all<S: Storage>(
    s: &S,
    tp: &Topition,
    isolation: IsolationLevel,
) -> Vec<deflated::Batch> {
    // Up to the high watermark (read_uncommitted) or the last stable offset (read_committed):
    // Nisshi's own engine answers a fetch at the end with an empty batch rather than nothing.
    let stage = s.offset_stage(tp).await.unwrap();
    let end = match isolation {
        IsolationLevel::ReadCommitted => stage.last_stable(),
        IsolationLevel::ReadUncommitted => stage.high_watermark(),
    };
    let mut out = Vec::new();
    let mut offset = stage.log_start();
    while offset < end {
        let got = s.fetch(tp, offset, 1, 1 << 20, isolation).await.unwrap();
        let before = offset;
        for b in got.into_iter().filter(|b| b.record_count > 0) {
            offset = offset.max(b.base_offset + i64::from(b.last_offset_delta) + 1);
            out.push(b);
        }
        if offset == before {
            // Nothing more below `end` (read_committed: the rest was aborted and left out).
            return out;
        }
    }
    out
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
    let deleted = s
        .delete_records(&[DeleteRecordsTopic::default()
            .name("wal".into())
            .partitions(Some(vec![
                DeleteRecordsPartition::default()
                    .partition_index(0)
                    .offset(2),
            ]))])
        .await
        .unwrap();
    let low = deleted[0].partitions.as_ref().unwrap()[0].low_watermark;
    assert_eq!(low, 2);
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

    // DeleteTopics removes the diskless topic from both sides.
    assert_eq!(
        s.delete_topic(&TopicId::Name("wal".into())).await.unwrap(),
        ErrorCode::None
    );
    assert!(s.diskless_topic("wal").await.unwrap().is_none());
    let left: Vec<String> = s
        .with_node(|n| n.coordinator().clone())
        .unwrap()
        .list_topics()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_over_a_classic_and_a_diskless_partition_ends_in_both() {
    let dir = tempfile::tempdir().unwrap();
    let running = node(dir.path()).await;
    let s = running.storage.clone();
    s.create_topic(topic("c", 1, Some(false)), false)
        .await
        .unwrap();
    s.create_topic(topic("d", 1, Some(true)), false)
        .await
        .unwrap();
    let (c0, d0) = (Topition::new("c", 0), Topition::new("d", 0));

    for (round, commit) in [(0, false), (1, true)] {
        let producer = s
            .init_producer(Some("tx"), 60_000, Some(-1), Some(-1))
            .await
            .unwrap();
        assert_eq!(producer.error, ErrorCode::None);
        let added = s
            .txn_add_partitions(TxnAddPartitionsRequest::VersionZeroToThree {
                transaction_id: "tx".into(),
                producer_id: producer.id,
                producer_epoch: producer.epoch,
                topics: vec![
                    AddPartitionsToTxnTopic::default()
                        .name("c".into())
                        .partitions(Some(vec![0])),
                    AddPartitionsToTxnTopic::default()
                        .name("d".into())
                        .partitions(Some(vec![0])),
                ],
            })
            .await;
        assert!(added.is_ok(), "{added:?}");
        let txn = |v: &str| {
            batch_from(
                RecordBatchBuilder::new().transactional(true).producer(
                    producer.id,
                    producer.epoch,
                    0,
                ),
                &[v],
            )
        };
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
        assert_eq!(s.retry_markers().await, 0, "every marker written");
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
