//! Durability of the SQLite coordinator: what was acknowledged is there after a reopen, even after
//! the process was killed right after the acknowledgement.

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use uuid::Uuid;

const TOPIC: Uuid = Uuid::from_u128(0xD15C_1E55);

fn batch(p: i32, records: i32, producer: Option<(i64, i32)>) -> CommitBatch {
    let (producer_id, producer_epoch, base_sequence, last_sequence) = match producer {
        Some((pid, seq)) => (pid, 0, seq, seq + records - 1),
        None => (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, NO_SEQUENCE),
    };
    CommitBatch {
        partition: TopicIdPartition::new(TOPIC, p),
        byte_offset: 1,
        byte_size: 50,
        record_count: records,
        base_timestamp: 10,
        max_timestamp: 20,
        timestamp_type: TimestampType::CreateTime,
        producer_id,
        producer_epoch,
        base_sequence,
        last_sequence,
    }
}

fn file(key: String, batches: Vec<CommitBatch>) -> CommitFileRequest {
    let mut at = 1;
    let batches = batches
        .into_iter()
        .map(|mut b| {
            b.byte_offset = at;
            at += u64::from(b.byte_size);
            b
        })
        .collect();
    CommitFileRequest {
        object_key: key,
        uploader_broker_id: 3,
        object_size: at,
        owners: vec![0, 2],
        batches,
    }
}

async fn create_topic(c: &SqliteCoordinator) {
    c.create_topic(CreateTopicRequest {
        topic_id: TOPIC,
        name: "durable".into(),
        partitions: 2,
        config: TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..TopicConfig::default()
        },
    })
    .await
    .unwrap();
}

/// Everything observable about the test topic.
async fn snapshot(c: &dyn BatchCoordinator, keys: &[String]) -> String {
    let mut out = format!("{:?}\n", c.list_topics().await.unwrap());
    for p in 0..2 {
        let tp = TopicIdPartition::new(TOPIC, p);
        let lso = c
            .list_offsets(&[ListOffsetsRequest {
                partition: tp,
                timestamp: EARLIEST_TIMESTAMP,
            }])
            .await
            .unwrap()[0]
            .offset;
        let find = c
            .find_batches(
                &[FindBatchesRequest {
                    partition: tp,
                    offset: lso,
                    max_bytes: u32::MAX,
                }],
                u32::MAX,
            )
            .await
            .unwrap();
        out += &format!("{find:?}\n");
        for pid in 0..3 {
            out += &format!("{:?}\n", c.producer_state(tp, pid).await.unwrap());
        }
        for ts in [LATEST_TIMESTAMP, MAX_TIMESTAMP, 0] {
            let r = c
                .list_offsets(&[ListOffsetsRequest {
                    partition: tp,
                    timestamp: ts,
                }])
                .await
                .unwrap();
            out += &format!("{r:?}\n");
        }
    }
    for k in keys {
        out += &format!("{:?}\n", c.object_info(k).await.unwrap());
    }
    out += &format!("{:?}\n", c.objects_to_delete(i64::MAX, 1000).await.unwrap());
    out
}

async fn reopen(path: &Path, clock: Arc<ManualClock>) -> SqliteCoordinator {
    SqliteCoordinator::open(path, SqliteOptions::default(), clock)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_is_there_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coordinator.db");
    let clock = ManualClock::new(1_000_000);
    let c = reopen(&path, clock.clone()).await;
    create_topic(&c).await;
    let mut keys = Vec::new();
    for i in 0..10 {
        clock.advance(10);
        let key = format!("wal/{i}");
        keys.push(key.clone());
        let r = c
            .commit_file(file(
                key,
                vec![
                    batch(0, 2, Some((1, 2 * i))),
                    batch(1, 1, None),
                    batch(0, 3, None),
                ],
            ))
            .await
            .unwrap();
        assert!(r.iter().all(|r| r.error == ErrorCode::None));
    }
    c.delete_records(&[DeleteRecordsRequest {
        partition: TopicIdPartition::new(TOPIC, 1),
        offset: 4,
    }])
    .await
    .unwrap();
    let before = snapshot(&c, &keys).await;
    assert!(before.contains("wal/9"));
    // Drop without close: nothing may depend on an orderly shutdown.
    drop(c);

    let c = reopen(&path, clock.clone()).await;
    assert_eq!(snapshot(&c, &keys).await, before);
    // The reopened coordinator continues where it was: offsets, producer sequences, objects.
    let r = c
        .commit_file(file(
            "wal/10".into(),
            vec![batch(0, 1, Some((1, 20))), batch(0, 2, Some((1, 18)))],
        ))
        .await
        .unwrap();
    assert_eq!(r[0].base_offset, 50);
    assert!(r[1].duplicate);
    let dup = c
        .commit_file(file("wal/3".into(), vec![batch(0, 1, None)]))
        .await;
    assert!(matches!(
        dup,
        Err(CoordinatorError::ObjectAlreadyCommitted(_))
    ));
    c.close().await;
    assert!(matches!(
        c.list_topics().await,
        Err(CoordinatorError::Closed)
    ));
    assert!(matches!(
        c.commit_file(file("wal/11".into(), vec![])).await,
        Err(CoordinatorError::Closed)
    ));
}

const CHILD_ENV: &str = "DISKLESS_COORDINATOR_ABORT_CHILD_DB";

/// The child half of `acknowledged_commits_survive_a_kill`: commits files, reporting each
/// acknowledgement on stdout, then aborts the process without any shutdown.
fn child(path: &str) -> ! {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = reopen(Path::new(path), ManualClock::new(5_000)).await;
        create_topic(&c).await;
        println!("topic");
        for i in 0..25 {
            let r = c
                .commit_file(file(
                    format!("wal/{i}"),
                    vec![batch(0, 2, Some((7, 2 * i))), batch(1, 1, None)],
                ))
                .await
                .unwrap();
            assert!(r.iter().all(|r| r.error == ErrorCode::None));
            println!("acked {i}");
        }
    });
    std::process::abort();
}

#[test]
fn acknowledged_commits_survive_a_kill() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "acknowledged_commits_survive_a_kill",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(i) = line.strip_prefix("acked ") {
            acked.push(i.parse::<i32>().unwrap());
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child aborts");
    assert_eq!(acked, (0..25).collect::<Vec<_>>());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = reopen(&path, ManualClock::new(9_000)).await;
        let tp = TopicIdPartition::new(TOPIC, 0);
        let found = c
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
        assert_eq!(found[0].high_watermark, 50);
        assert_eq!(found[0].batches.len(), 25);
        for (i, b) in found[0].batches.iter().enumerate() {
            assert_eq!(b.object_key, format!("wal/{i}"));
            assert_eq!(b.base_offset, 2 * i as i64);
            assert_eq!(b.log_append_time, 5_000);
        }
        let state = c.producer_state(tp, 7).await.unwrap().unwrap();
        assert_eq!(state.batches.last().unwrap().last_sequence, 49);
        for i in 0..25 {
            assert!(c.object_info(&format!("wal/{i}")).await.unwrap().is_some());
        }
    });
}

#[tokio::test]
async fn open_by_url_and_refuse_memory_urls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url.db");
    let url = format!("sqlite://{}", path.display());
    let c = SqliteCoordinator::open_url(&url, SqliteOptions::default(), ManualClock::new(1))
        .await
        .unwrap();
    create_topic(&c).await;
    c.close().await;
    let c = reopen(&path, ManualClock::new(1)).await;
    assert_eq!(c.list_topics().await.unwrap().len(), 1);
    for bad in [
        "sqlite::memory:",
        "sqlite://?mode=memory",
        "nosuchscheme://x",
    ] {
        let r =
            SqliteCoordinator::open_url(bad, SqliteOptions::default(), ManualClock::new(1)).await;
        assert!(
            matches!(r, Err(CoordinatorError::InvalidRequest(_))),
            "{bad}: {r:?}"
        );
    }
    // Without create_if_missing a missing file is an error, not a new empty coordinator.
    let r = SqliteCoordinator::open(
        dir.path().join("missing.db"),
        SqliteOptions::default().create_if_missing(false),
        ManualClock::new(1),
    )
    .await;
    assert!(r.is_err());
}
