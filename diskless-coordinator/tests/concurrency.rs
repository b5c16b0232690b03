//! Concurrent use of one SQLite coordinator: commits never interleave their offset assignment, and
//! reads proceed while commits run.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{create_topic, find_from, list_offset, plain, request};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::*;
use diskless_testkit::keys::v7_key_with;
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const TOPIC: Uuid = Uuid::from_u128(77);

async fn open(path: &Path, options: SqliteOptions, clock: Arc<dyn Clock>) -> SqliteCoordinator {
    SqliteCoordinator::open(path, options, clock).await.unwrap()
}

/// A connection of its own to the database file, as another process would open it.
async fn other_connection(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .unwrap()
}

/// The commit of `key`: one batch of one record (10 bytes, timestamp 0) to partition 0 of
/// [`TOPIC`].
fn one_batch_file(key: &str) -> CommitFileRequest {
    request(key, vec![plain(TopicIdPartition::new(TOPIC, 0), 1, 10, 0)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commits_get_gap_free_offsets_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(
        open(
            &dir.path().join("c.db"),
            SqliteOptions::default().with_synchronous(Synchronous::Normal),
            Arc::new(SystemClock),
        )
        .await,
    );
    create_topic(c.as_ref(), TOPIC, "busy", 3, TopicConfig::default()).await;
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
                        base_timestamp: 0,
                        producer_id: w,
                        producer_epoch: 0,
                        base_sequence: 2 * f,
                        last_sequence: 2 * f + 1,
                        ..plain(TopicIdPartition::new(TOPIC, p), 2, 10, i64::from(f))
                    })
                    .collect();
                let r = c
                    .commit_file(CommitFileRequest {
                        uploader_broker_id: w as i32,
                        ..request(&format!("wal/{w}/{f}"), batches)
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
                let r = list_offset(
                    c.as_ref(),
                    TopicIdPartition::new(TOPIC, 0),
                    LATEST_TIMESTAMP,
                )
                .await;
                assert!(r.offset >= last, "the high watermark never moves back");
                last = r.offset;
                tokio::task::yield_now().await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reader.await.unwrap();

    for p in 0..3 {
        let r = find_from(c.as_ref(), TopicIdPartition::new(TOPIC, p), 0).await;
        let batches = &r.batches;
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
        assert_eq!(r.high_watermark, next);
    }
}

/// Another process holding the write lock past the busy timeout makes writes fail as
/// `Unavailable` (certainly not applied, retriable) while reads still work; afterwards writes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_database_is_unavailable_not_unknown() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let c = open(
        &path,
        SqliteOptions::default().with_busy_timeout(Duration::from_millis(50)),
        ManualClock::new(1),
    )
    .await;
    create_topic(&c, TOPIC, "busy", 1, TopicConfig::default()).await;
    let mut other = other_connection(&path).await;
    let lock = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let r = c.commit_file(one_batch_file("wal/a")).await;
    match &r {
        Err(e @ CoordinatorError::Unavailable(_)) => assert!(e.is_retriable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Reads are not blocked by the other writer.
    assert_eq!(c.list_topics().await.unwrap().len(), 1);
    assert_eq!(c.object_info("wal/a").await.unwrap(), None);
    lock.rollback().await.unwrap();
    let r = c.commit_file(one_batch_file("wal/a")).await.unwrap();
    assert_eq!(
        r[0].base_offset, 0,
        "the failed attempt left nothing behind"
    );
}

/// A retention pass holds the write lock, so it must stop as soon as its budget is spent (issue 12,
/// item 9): no further partition is examined inside the transaction. The batches of the partitions
/// after the one that spends the budget are made unreadable (a byte size that is not an integer):
/// reading any of them fails the pass, so a pass that succeeds did not look at them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_pass_stops_walking_at_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retention.db");
    let clock = ManualClock::new(1_000_000);
    let c = open(
        &path,
        SqliteOptions::default().with_synchronous(Synchronous::Normal),
        clock.clone(),
    )
    .await;
    let config = TopicConfig::default().with_retention_ms(1000);
    create_topic(&c, TOPIC, "retained", 4, config).await;
    // Two expired batches in partition 0, one in each of partitions 1..=3.
    let batches: Vec<CommitBatch> = [0, 0, 1, 2, 3]
        .into_iter()
        .map(|p| plain(TopicIdPartition::new(TOPIC, p), 1, 10, 5))
        .collect();
    let r = c
        .commit_file(request("wal/retained", batches))
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");

    let mut raw = other_connection(&path).await;
    let set_size = |size: &'static str| {
        format!(
            "UPDATE batches SET byte_size = {size} WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE partition >= 1)"
        )
    };
    sqlx::query(sqlx::AssertSqlSafe(set_size("'unreadable'")))
        .execute(&mut raw)
        .await
        .unwrap();

    // Budget 2: partition 0 spends it; partitions 1..=3 must not be read.
    let report = c.enforce_retention(2).await.unwrap();
    assert_eq!(
        (report.batches_deleted, report.bytes_deleted, report.more),
        (2, 20, true)
    );

    // With readable rows again, the next pass deletes the rest and stops short of its budget.
    sqlx::query(sqlx::AssertSqlSafe(set_size("10")))
        .execute(&mut raw)
        .await
        .unwrap();
    let report = c.enforce_retention(10).await.unwrap();
    assert_eq!(
        (report.batches_deleted, report.bytes_deleted, report.more),
        (3, 30, false)
    );
    for p in 0..4 {
        let r = list_offset(&c, TopicIdPartition::new(TOPIC, p), EARLIEST_TIMESTAMP).await;
        assert_eq!(r.offset, if p == 0 { 2 } else { 1 }, "partition {p}");
    }
}

/// The commit deadline is checked where the commit is applied (issue 12, item 1): a commit that
/// started in time but waited for the write lock (here held by another connection) until its key
/// was older than `max_commit_age` is refused when it gets the lock, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_waited_past_its_deadline_is_refused() {
    use sqlx::Connection;
    const NOW: i64 = 1_700_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deadline.db");
    let clock = ManualClock::new(NOW);
    let options = SqliteOptions::default()
        .with_busy_timeout(Duration::from_secs(30))
        .with_max_commit_age(Duration::from_secs(60));
    let c = Arc::new(open(&path, options, clock.clone()).await);
    create_topic(c.as_ref(), TOPIC, "late", 1, TopicConfig::default()).await;
    let mut other = other_connection(&path).await;
    let lock = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let key = v7_key_with(NOW, 1);
    let stalled = tokio::spawn({
        let c = c.clone();
        let key = key.clone();
        async move { c.commit_file(one_batch_file(&key)).await }
    });
    // The commit is now waiting for the lock; its key ages past the deadline meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.advance(60_001);
    lock.rollback().await.unwrap();
    let r = stalled.await.unwrap();
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "{r:?}"
    );
    assert_eq!(c.object_info(&key).await.unwrap(), None);
    // At the boundary (key time == now - max_commit_age) a commit is accepted.
    let r = c
        .commit_file(one_batch_file(&v7_key_with(NOW + 1, 2)))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 0));
}

/// fence_orphans and commit_file of one key serialize (issue 12, item 1): run concurrently, exactly
/// one of them wins: either the commit is applied and the key is not fenced, or the key is fenced
/// (returned) and the commit is refused with ObjectFenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fence_and_commit_of_one_key_never_both_succeed() {
    const NOW: i64 = 1_700_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(NOW);
    let c = Arc::new(
        open(
            &dir.path().join("fence.db"),
            SqliteOptions::default().with_synchronous(Synchronous::Off),
            clock.clone(),
        )
        .await,
    );
    create_topic(c.as_ref(), TOPIC, "fenced", 1, TopicConfig::default()).await;
    let keys: Vec<String> = (0..60).map(|n| v7_key_with(NOW - 1000, n)).collect();
    let mut tasks = Vec::new();
    for key in &keys {
        let commit = tokio::spawn({
            let (c, key) = (c.clone(), key.clone());
            async move { c.commit_file(one_batch_file(&key)).await }
        });
        let fence = tokio::spawn({
            let (c, key) = (c.clone(), key.clone());
            async move { c.fence_orphans(&[key]).await }
        });
        tasks.push((key.clone(), commit, fence));
    }
    let (mut committed, mut fenced) = (0, 0);
    for (key, commit, fence) in tasks {
        let commit = commit.await.unwrap();
        let fence = fence.await.unwrap().unwrap();
        match commit {
            Ok(r) => {
                assert_eq!(r[0].error, ErrorCode::None);
                assert!(fence.is_empty(), "{key}: committed and fenced");
                committed += 1;
            }
            Err(CoordinatorError::ObjectFenced(k)) => {
                assert_eq!(k, key);
                assert_eq!(fence, vec![key.clone()], "{key}: refused but not fenced");
                fenced += 1;
            }
            Err(e) => panic!("{key}: {e:?}"),
        }
        let known = c.known_objects(std::slice::from_ref(&key)).await.unwrap();
        assert_eq!(known.is_empty(), fence.len() == 1, "{key}");
    }
    assert_eq!(committed + fenced, keys.len());
}

/// Commits `batches_per_partition` batches of 10 bytes with timestamp `ts` to each of `partitions`
/// partitions of `topic`, one file per round.
async fn fill(
    c: &SqliteCoordinator,
    topic: Uuid,
    partitions: i32,
    batches_per_partition: u32,
    ts: i64,
    name: &str,
) {
    for round in 0..batches_per_partition {
        let batches: Vec<CommitBatch> = (0..partitions)
            .map(|p| plain(TopicIdPartition::new(topic, p), 1, 10, ts))
            .collect();
        let r = c
            .commit_file(request(&format!("wal/{name}/{round}"), batches))
            .await
            .unwrap();
        assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
    }
}

/// A retention pass holds the write lock, so the batch rows it reads must be bounded by its budget,
/// not by partitions × budget (review R2): a partition is read only when its first batch is due
/// (by time, or by size: what is left without it still reaches retention.bytes), and a due
/// partition is read in small pages up to the first batch that stays. Before, every partition with
/// bytes and a retention setting was read, up to `budget` batch rows each, even when its first row
/// already stopped the pass. Counted with `SqliteCoordinator::stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_reads_rows_bounded_by_its_budget_not_by_partitions() {
    const NOW: i64 = 10_000_000;
    let clock = ManualClock::new(NOW);
    let c = SqliteCoordinator::in_memory(clock.clone()).await.unwrap();
    let retention = |ms: i64, bytes: i64| {
        TopicConfig::default()
            .with_retention_ms(ms)
            .with_retention_bytes(bytes)
    };
    let (fresh, full, old) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
    // Nothing due by time: 200 partitions of 20 batches, one hour retention, all 1 s old.
    create_topic(&c, fresh, "fresh", 200, retention(3_600_000, -1)).await;
    fill(&c, fresh, 200, 20, NOW - 1000, "fresh").await;
    // Over retention.bytes but nothing removable: 30 bytes each, retention.bytes 25 (removing the
    // first 10-byte batch would leave 20 < 25).
    create_topic(&c, full, "full", 100, retention(-1, 25)).await;
    fill(&c, full, 100, 3, NOW - 1000, "full").await;

    let before = c.stats();
    let report = c.enforce_retention(1000).await.unwrap();
    assert_eq!((report.batches_deleted, report.more), (0, false));
    let after = c.stats();
    assert_eq!(
        (
            after.retention_partitions_examined - before.retention_partitions_examined,
            after.retention_batches_read - before.retention_batches_read
        ),
        (0, 0),
        "a pass with nothing due reads no partition's batches"
    );

    // Now some are due: 5 partitions of 50 batches older than retention.ms. A pass with budget 120
    // deletes 120 batches from the first three, reading a bounded number of rows.
    create_topic(&c, old, "old", 5, retention(1000, -1)).await;
    fill(&c, old, 5, 50, NOW - 5000, "old").await;
    let before = c.stats();
    let report = c.enforce_retention(120).await.unwrap();
    assert_eq!(
        (report.batches_deleted, report.bytes_deleted, report.more),
        (120, 1200, true)
    );
    let after = c.stats();
    let examined = after.retention_partitions_examined - before.retention_partitions_examined;
    let read = after.retention_batches_read - before.retention_batches_read;
    assert_eq!(
        examined, 3,
        "only due partitions, until the budget is spent"
    );
    assert!(read <= 2 * 120 + 8 * examined, "{read} batch rows read");
    // The rest: 130 batches, then nothing.
    let report = c.enforce_retention(1000).await.unwrap();
    assert_eq!((report.batches_deleted, report.more), (130, false));
    let before = c.stats();
    let report = c.enforce_retention(1000).await.unwrap();
    assert_eq!(report.batches_deleted, 0);
    assert_eq!(c.stats(), before, "nothing due, nothing read");
}

/// Two coordinators on one database file (as two processes would open it) allocating producer-id
/// blocks at once never get overlapping blocks, and a coordinator opened afterwards (a restart)
/// never hands out an id already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_id_blocks_from_two_coordinators_on_one_file_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let options = SqliteOptions::default().with_synchronous(Synchronous::Normal);
    let a = Arc::new(open(&path, options.clone(), Arc::new(SystemClock)).await);
    let b = Arc::new(open(&path, options.clone(), Arc::new(SystemClock)).await);
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut blocks = Vec::new();
            for k in 0..25u32 {
                let count = 1 + (i * 7 + k) % 50;
                blocks.push((count, c.allocate_producer_ids(count).await.unwrap()));
            }
            blocks
        }));
    }
    let mut blocks = Vec::new();
    for t in tasks {
        blocks.extend(t.await.unwrap());
    }
    assert_eq!(blocks.len(), 200);
    diskless_testkit::coordinator::conformance::assert_disjoint_blocks(&blocks);
    let highest = blocks.iter().map(|(_, b)| b.last()).max().unwrap();
    let total: i64 = blocks.iter().map(|(n, _)| i64::from(*n)).sum();
    assert_eq!(
        highest + 1,
        total,
        "blocks are consecutive from 0: no id skipped"
    );
    a.close().await;
    b.close().await;
    let reopened = open(&path, options, Arc::new(SystemClock)).await;
    let next = reopened.allocate_producer_ids(1).await.unwrap();
    assert_eq!(next.first, highest + 1);
}

/// Two coordinators on one file growing one topic at once: every growth is applied whole or
/// refused with INVALID_PARTITIONS, the largest wins, and every partition exists once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_partitions_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let options = SqliteOptions::default().with_synchronous(Synchronous::Normal);
    let a = Arc::new(open(&path, options.clone(), Arc::new(SystemClock)).await);
    let b = Arc::new(open(&path, options, Arc::new(SystemClock)).await);
    create_topic(a.as_ref(), TOPIC, "t", 2, TopicConfig::default()).await;
    let mut tasks = Vec::new();
    for total in 3..=10 {
        let c = if total % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            c.create_partitions(TOPIC, total).await
        }));
    }
    let mut grown = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => grown += 1,
            Err(CoordinatorError::InvalidPartitions(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(grown >= 1);
    assert_eq!(b.list_topics().await.unwrap()[0].partitions, 10);
    for p in 0..10 {
        let tp = TopicIdPartition::new(TOPIC, p);
        assert_eq!(
            list_offset(a.as_ref(), tp, LATEST_TIMESTAMP).await.offset,
            0
        );
    }
    let mut conn = other_connection(&path).await;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM partitions")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 10);
}
