//! The produce and fetch paths over a real S3 HTTP endpoint (an in-process S3 server on
//! 127.0.0.1) with the SQLite coordinator: what a deployment on S3 does, byte for byte.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_core::*;
use diskless_testkit::storage::S3TestServer;
use uuid::Uuid;

/// A fresh topic id, drawn deterministically (`Uuid::new_v4` is not used in this workspace).
fn next_uuid() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(u128::from(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_fetch_over_s3_http() {
    let server = S3TestServer::start().await.unwrap();
    let storage = Arc::new(server.storage("wal-test").unwrap());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let coordinator = Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap());
    let topic_id = next_uuid();
    let config = TopicConfig {
        timestamp_type: TimestampType::LogAppendTime,
        ..TopicConfig::default()
    };
    coordinator
        .create_topic(CreateTopicRequest {
            topic_id,
            name: "s3".into(),
            partitions: 4,
            config: config.clone(),
        })
        .await
        .unwrap();
    let config = Arc::new(config);
    let cache: Arc<dyn LocalCache> = Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
    let writer = WalWriter::builder(storage.clone(), coordinator.clone())
        .with_config(WalWriterConfig::default().with_commit_interval(Duration::from_millis(20)))
        .with_clock(clock.clone())
        .with_cache(cache)
        .build()
        .unwrap();

    let mut sent = Vec::new();
    for round in 0..5 {
        let parts: Vec<ProducePartition> = (0..4)
            .map(|p| {
                let value = format!("round {round} partition {p}");
                let batch = RecordBatchBuilder::new()
                    .compression(Compression::Lz4)
                    .record(SystemClock.now_ms(), Some(b"k"), Some(value.as_bytes()))
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
        let bytes: Vec<_> = parts.iter().map(|p| p.records.clone()).collect();
        for (answer, b) in writer.produce(parts).await.into_iter().zip(bytes) {
            assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
            assert_eq!(answer.base_offset, round);
            sent.push((
                answer.partition,
                answer.base_offset,
                answer.log_append_time,
                b,
            ));
        }
    }
    writer.close().await;
    let puts = storage.counters().snapshot().put_requests;
    assert_eq!(puts, 5, "one PUT per segment");

    // A cold fetcher (no cache) reads everything back over HTTP: one GET per object.
    let fetcher = Fetcher::builder(storage.clone(), coordinator)
        .build()
        .unwrap();
    let requests: Vec<FetchPartition> = (0..4)
        .map(|p| FetchPartition {
            partition: TopicIdPartition::new(topic_id, p),
            fetch_offset: 0,
            partition_max_bytes: 1 << 20,
            leader_epoch: 0,
            isolation: Default::default(),
        })
        .collect();
    let gets_before = storage.counters().snapshot().get_requests;
    let fetched = fetcher.fetch(&requests, 4 << 20).await.unwrap();
    assert_eq!(storage.counters().snapshot().get_requests - gets_before, 5);
    for f in &fetched {
        assert_eq!(f.error, ErrorCode::None);
        let batches = split_batches(f.records_bytes()).unwrap();
        assert_eq!(batches.len(), 5);
        for b in batches {
            verify_stored_batch(&b).unwrap();
            let (_, offset, lat, original) = sent
                .iter()
                .find(|(p, o, _, _)| *p == f.partition && *o == b.base_offset())
                .unwrap();
            assert_eq!(b.base_offset(), *offset);
            // LogAppendTime injected, CRC recomputed, records untouched.
            assert_eq!(b.max_timestamp(), *lat);
            assert_eq!(b.timestamp_type(), TimestampType::LogAppendTime);
            assert_eq!(b.as_bytes()[61..], original[61..]);
        }
    }
    server.shutdown().await;
}
