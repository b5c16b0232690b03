//! Concurrent use of one SQLite coordinator: commits never interleave their offset assignment, and
//! reads proceed while commits run.

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::*;
use std::sync::Arc;
use uuid::Uuid;

const TOPIC: Uuid = Uuid::from_u128(77);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commits_get_gap_free_offsets_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(
        SqliteCoordinator::open(
            dir.path().join("c.db"),
            SqliteOptions::default().synchronous(Synchronous::Normal),
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    c.create_topic(CreateTopicRequest {
        topic_id: TOPIC,
        name: "busy".into(),
        partitions: 3,
        config: TopicConfig::default(),
    })
    .await
    .unwrap();
    const WRITERS: i64 = 6;
    const FILES: i32 = 15;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for f in 0..FILES {
                // Each writer is an idempotent producer on every partition: its sequences only
                // succeed if its batches are appended in its own commit order.
                let batches: Vec<CommitBatch> = (0..3)
                    .map(|p| CommitBatch {
                        partition: TopicIdPartition::new(TOPIC, p),
                        byte_offset: 1 + 10 * p as u64,
                        byte_size: 10,
                        record_count: 2,
                        base_timestamp: 0,
                        max_timestamp: i64::from(f),
                        timestamp_type: TimestampType::CreateTime,
                        producer_id: w,
                        producer_epoch: 0,
                        base_sequence: 2 * f,
                        last_sequence: 2 * f + 1,
                    })
                    .collect();
                let r = c
                    .commit_file(CommitFileRequest {
                        object_key: format!("wal/{w}/{f}"),
                        uploader_broker_id: w as i32,
                        object_size: 31,
                        owners: vec![0],
                        batches,
                    })
                    .await
                    .unwrap();
                assert!(
                    r.iter().all(|r| r.error == ErrorCode::None && !r.duplicate),
                    "{r:?}"
                );
            }
        }));
    }
    // Readers run alongside the writers.
    let reader = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut last = 0;
            for _ in 0..50 {
                let r = c
                    .list_offsets(&[ListOffsetsRequest {
                        partition: TopicIdPartition::new(TOPIC, 0),
                        timestamp: LATEST_TIMESTAMP,
                    }])
                    .await
                    .unwrap();
                assert!(r[0].offset >= last, "the high watermark never moves back");
                last = r[0].offset;
                tokio::task::yield_now().await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reader.await.unwrap();

    for p in 0..3 {
        let tp = TopicIdPartition::new(TOPIC, p);
        let r = c
            .find_batches(
                &[FindBatchesRequest {
                    partition: tp,
                    offset: 0,
                    max_bytes: u32::MAX,
                }],
                u32::MAX,
            )
            .await
            .unwrap();
        let batches = &r[0].batches;
        assert_eq!(batches.len(), (WRITERS * i64::from(FILES)) as usize);
        let mut next = 0;
        let mut last_seq = vec![-1; WRITERS as usize];
        for b in batches {
            assert_eq!(b.base_offset, next, "gap-free and unique");
            next = b.last_offset + 1;
            let w = b.producer_id as usize;
            assert_eq!(
                b.base_sequence,
                last_seq[w] + 1,
                "each writer's order is kept"
            );
            last_seq[w] = b.last_sequence;
        }
        assert_eq!(r[0].high_watermark, next);
    }
}

/// Another process holding the write lock past the busy timeout makes writes fail as
/// `Unavailable` (certainly not applied, retriable) while reads still work; afterwards writes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_database_is_unavailable_not_unknown() {
    use sqlx::{ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let c = SqliteCoordinator::open(
        &path,
        SqliteOptions::default().busy_timeout(std::time::Duration::from_millis(50)),
        ManualClock::new(1),
    )
    .await
    .unwrap();
    c.create_topic(CreateTopicRequest {
        topic_id: TOPIC,
        name: "busy".into(),
        partitions: 1,
        config: TopicConfig::default(),
    })
    .await
    .unwrap();
    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    let lock = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let request = |key: &str| CommitFileRequest {
        object_key: key.into(),
        uploader_broker_id: 1,
        object_size: 11,
        owners: vec![0],
        batches: vec![CommitBatch {
            partition: TopicIdPartition::new(TOPIC, 0),
            byte_offset: 1,
            byte_size: 10,
            record_count: 1,
            base_timestamp: 0,
            max_timestamp: 0,
            timestamp_type: TimestampType::CreateTime,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            base_sequence: NO_SEQUENCE,
            last_sequence: NO_SEQUENCE,
        }],
    };
    let r = c.commit_file(request("wal/a")).await;
    match &r {
        Err(e @ CoordinatorError::Unavailable(_)) => assert!(e.is_retriable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Reads are not blocked by the other writer.
    assert_eq!(c.list_topics().await.unwrap().len(), 1);
    assert_eq!(c.object_info("wal/a").await.unwrap(), None);
    lock.rollback().await.unwrap();
    let r = c.commit_file(request("wal/a")).await.unwrap();
    assert_eq!(
        r[0].base_offset, 0,
        "the failed attempt left nothing behind"
    );
}
