//! The produce and fetch paths on the embedded defaults: SQLite coordinator + local filesystem
//! objects, real time, several writers ("brokers") at once, and a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::*;
use diskless_core::*;
use diskless_storage::ObjectStoreStorage;
use uuid::Uuid;

/// A fresh topic id, drawn deterministically (`Uuid::new_v4` is not used in this workspace).
fn next_uuid() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(u128::from(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

async fn open(dir: &std::path::Path) -> (Arc<ObjectStoreStorage>, Arc<SqliteCoordinator>) {
    let storage = Arc::new(ObjectStoreStorage::local_fs(dir.join("objects")).unwrap());
    let coordinator = Arc::new(
        SqliteCoordinator::open(
            dir.join("coordinator.db"),
            SqliteOptions::default(),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    (storage, coordinator)
}

/// Reads a whole partition from offset 0, checking offsets are gap-free and CRCs valid.
async fn read_all(fetcher: &Fetcher, p: TopicIdPartition) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let got = fetcher
            .fetch(
                &[FetchPartition {
                    partition: p,
                    fetch_offset: offset,
                    partition_max_bytes: 64 * 1024,
                    leader_epoch: 0,
                    isolation: Default::default(),
                }],
                64 * 1024,
            )
            .await
            .unwrap();
        assert_eq!(got[0].error, ErrorCode::None, "{:?}", got[0].error_message);
        let batches = split_batches(got[0].records_bytes()).unwrap();
        if batches.is_empty() {
            assert_eq!(offset, got[0].high_watermark);
            return out;
        }
        for b in batches {
            assert_eq!(b.base_offset(), offset, "offsets must be gap-free");
            verify_stored_batch(&b).unwrap();
            offset = b.last_offset() + 1;
            out.push(b);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_sqlite_and_local_files_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, coordinator) = open(dir.path()).await;
    let topic_id = next_uuid();
    let config = TopicConfig::default();
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "events".into(),
            partitions: 6,
            config: config.clone(),
        })
        .await
        .unwrap();
    let config = Arc::new(config);

    let mut tasks = Vec::new();
    for broker in 0..3 {
        let cache: Arc<dyn LocalCache> =
            Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
        let writer = WalWriter::builder(storage.clone(), coordinator.clone())
            .with_config(
                WalWriterConfig::default()
                    .with_broker_id(broker)
                    .with_commit_interval(Duration::from_millis(10)),
            )
            .with_clock(Arc::new(SystemClock))
            .with_cache(cache)
            .build()
            .unwrap();
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for round in 0..10 {
                // Each broker has an idempotent producer per partition.
                let parts: Vec<ProducePartition> = (0..6)
                    .map(|p| {
                        let value = format!("b{broker}-r{round}-p{p}");
                        let batch = RecordBatchBuilder::new()
                            .producer(i64::from(broker) * 100 + i64::from(p), 0, round)
                            .compression(if round % 2 == 0 {
                                Compression::None
                            } else {
                                Compression::Zstd
                            })
                            .record(now_ms(), Some(b"k"), Some(value.as_bytes()))
                            .build()
                            .unwrap();
                        ProducePartition {
                            partition: TopicIdPartition::new(topic_id, p),
                            config: config.clone(),
                            records: batch.into_bytes(),
                            txn_seq: None,
                        }
                    })
                    .collect();
                let sent: Vec<Bytes> = parts.iter().map(|p| p.records.clone()).collect();
                for (answer, bytes) in writer.produce(parts).await.into_iter().zip(sent) {
                    assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
                    acked.push((answer.partition, answer.base_offset, bytes));
                }
            }
            writer.close().await;
            acked
        }));
    }
    let mut acked: BTreeMap<(TopicIdPartition, i64), Bytes> = BTreeMap::new();
    for task in tasks {
        for (p, offset, bytes) in task.await.unwrap() {
            assert!(acked.insert((p, offset), bytes).is_none());
        }
    }
    assert_eq!(acked.len(), 3 * 10 * 6);

    let check = |batches: Vec<RecordBatch>, p: TopicIdPartition| {
        assert_eq!(batches.len(), 30);
        for b in batches {
            let sent = &acked[&(p, b.base_offset())];
            let served = b.as_bytes();
            assert_eq!(served.len(), sent.len());
            assert_eq!(
                served[16..],
                sent[16..],
                "payload must be what was produced"
            );
        }
    };
    let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
        .build()
        .unwrap();
    for p in 0..6 {
        let partition = TopicIdPartition::new(topic_id, p);
        check(read_all(&fetcher, partition).await, partition);
    }

    // Restart: everything acknowledged is still there.
    coordinator.close().await;
    drop((fetcher, coordinator, storage));
    let (storage, coordinator) = open(dir.path()).await;
    let fetcher = Fetcher::builder(storage, coordinator).build().unwrap();
    for p in 0..6 {
        let partition = TopicIdPartition::new(topic_id, p);
        check(read_all(&fetcher, partition).await, partition);
    }
}
