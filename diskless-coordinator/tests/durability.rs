//! Durability of the SQLite coordinator: what was acknowledged is there after a reopen, even after
//! the process was killed right after the acknowledgement.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{find_from, list_offset};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::*;
use diskless_testkit::keys::v7_key_with;
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
        transactional: false,
        txn_seq: None,
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
    let config = TopicConfig::default().with_timestamp_type(TimestampType::LogAppendTime);
    common::create_topic(c, TOPIC, "durable", 2, config).await;
}

/// Everything observable about the test topic.
async fn snapshot(c: &dyn BatchCoordinator, keys: &[String]) -> String {
    let mut out = format!("{:?}\n", c.list_topics().await.unwrap());
    for p in 0..2 {
        let tp = TopicIdPartition::new(TOPIC, p);
        let lso = list_offset(c, tp, EARLIEST_TIMESTAMP).await.offset;
        out += &format!("{:?}\n", find_from(c, tp, lso).await);
        for pid in 0..3 {
            out += &format!("{:?}\n", c.producer_state(tp, pid).await.unwrap());
        }
        for ts in [LATEST_TIMESTAMP, MAX_TIMESTAMP, 0] {
            out += &format!("{:?}\n", list_offset(c, tp, ts).await);
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
#[allow(
    clippy::print_stdout,
    reason = "stdout is how the child reports its acknowledgements to the parent"
)]
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
        let found = find_from(&c, tp, 0).await;
        assert_eq!(found.high_watermark, 50);
        assert_eq!(found.batches.len(), 25);
        for (i, b) in found.batches.iter().enumerate() {
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
        SqliteOptions::default().with_create_if_missing(false),
        ManualClock::new(1),
    )
    .await;
    assert!(r.is_err());
}

/// A database written before migrations 3 and 4 (schema version 2) is upgraded on open: the effective
/// and running max timestamps of its batches are backfilled, so ListOffsets by timestamp answers as
/// before; its topics get the default producer.id.expiration.ms; its producer states get the
/// upgrade's wall-clock time as last append time (they expire one period after the upgrade, not at
/// once); and new commits continue the running max from the backfilled value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_database_is_upgraded() {
    use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let create_time = Uuid::from_u128(0xC7);
    let append_time = Uuid::from_u128(0xA7);
    // (max_timestamp, log_append_time) per batch of 2 records; partition 0 of `create_time` lost its
    // first batch (offsets 0..=1, timestamp 95) to DeleteRecords before the upgrade.
    let create_batches = [(50, -1), (10, -1), (90, -1), (30, -1), (90, -1), (20, -1)];
    let append_batches = [(-1, 500), (-1, 400), (-1, 600)];
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        let all = diskless_coordinator::sqlite::migrator();
        let v2 = sqlx::migrate::Migrator::with_migrations(all.iter().take(2).cloned().collect());
        v2.run(&mut conn).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        let mut sql = vec![
            format!(
                "INSERT INTO topics VALUES ('{create_time}', 'ct', 1, 0, -1, -1, 1048588, \
                 9223372036854775807, 3600000)"
            ),
            format!(
                "INSERT INTO topics VALUES ('{append_time}', 'lat', 1, 1, -1, -1, 1048588, \
                 9223372036854775807, 3600000)"
            ),
            format!("INSERT INTO partitions VALUES (1, '{create_time}', 0, 2, 14, 60)"),
            format!("INSERT INTO partitions VALUES (2, '{append_time}', 0, 0, 6, 30)"),
            "INSERT INTO objects VALUES (1, 'wal/old', 1, 1000, 90, '0', 5, NULL)".into(),
        ];
        let mut row = |partition_id: i64, i: i64, (max_ts, lat): (i64, i64), tt: i64| {
            let base = 2 * i;
            sql.push(format!(
                "INSERT INTO batches VALUES ({partition_id}, {}, {base}, 1, {}, 10, 0, {max_ts}, \
                 {tt}, {lat}, 7, 0, {base}, {})",
                base + 1,
                1 + 10 * i,
                base + 1
            ));
        };
        for (i, b) in create_batches.iter().enumerate() {
            row(1, i as i64 + 1, *b, 0);
        }
        for (i, b) in append_batches.iter().enumerate() {
            row(2, i as i64, *b, 1);
        }
        // Producer 7's state in partition 0 of `create_time`: one window entry (32 bytes).
        let mut window = Vec::new();
        window.extend_from_slice(&12i32.to_le_bytes());
        window.extend_from_slice(&13i32.to_le_bytes());
        window.extend_from_slice(&12i64.to_le_bytes());
        window.extend_from_slice(&13i64.to_le_bytes());
        window.extend_from_slice(&(-1i64).to_le_bytes());
        for s in sql {
            sqlx::query(AssertSqlSafe(s))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        sqlx::query("INSERT INTO producer_state VALUES (1, 7, 0, ?1)")
            .bind(window)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        conn.close().await.unwrap();
    }

    // The upgrade stamps producer states with the real time (not the injected clock's).
    let wall_before = SystemClock.now_ms();
    let clock = ManualClock::new(1_000_000);
    let c = reopen(&path, clock.clone()).await;
    let wall_after = SystemClock.now_ms();

    let topics = c.list_topics().await.unwrap();
    assert!(
        topics
            .iter()
            .all(|t| t.config.producer_id_expiration_ms == 86_400_000)
    );

    // Expected answers: the first live batch whose effective max timestamp reaches the target.
    async fn check(c: &SqliteCoordinator, topic: Uuid, live: &[(i64, i64)], first_base: i64) {
        let p = TopicIdPartition::new(topic, 0);
        for target in (0..=700).step_by(5) {
            let expected = live
                .iter()
                .enumerate()
                .find(|(_, ts)| ts.1 >= target)
                .map_or((-1, NO_TIMESTAMP), |(i, ts)| {
                    (first_base + 2 * i as i64, ts.1)
                });
            let r = list_offset(c, p, target).await;
            assert_eq!((r.offset, r.timestamp), expected, "target {target}");
        }
    }
    let effective = |b: &[(i64, i64)], lat: bool| -> Vec<(i64, i64)> {
        b.iter()
            .enumerate()
            .map(|(i, (max_ts, l))| (i as i64, if lat { *l } else { *max_ts }))
            .collect()
    };
    let mut created = effective(&create_batches, false);
    check(&c, create_time, &created, 2).await;
    check(&c, append_time, &effective(&append_batches, true), 0).await;
    let max = c
        .list_offsets(&[
            ListOffsetsRequest {
                partition: TopicIdPartition::new(create_time, 0),
                timestamp: MAX_TIMESTAMP,
                isolation: Default::default(),
            },
            ListOffsetsRequest {
                partition: TopicIdPartition::new(append_time, 0),
                timestamp: MAX_TIMESTAMP,
                isolation: Default::default(),
            },
        ])
        .await
        .unwrap();
    assert_eq!((max[0].offset, max[0].timestamp), (6, 90));
    assert_eq!((max[1].offset, max[1].timestamp), (4, 600));

    // New commits continue the running max: one below the backfilled maximum, one above.
    for (i, ts) in [40, 95].into_iter().enumerate() {
        let mut b = batch(0, 2, None);
        b.partition = TopicIdPartition::new(create_time, 0);
        b.max_timestamp = ts;
        let r = c
            .commit_file(file(format!("wal/new-{i}"), vec![b]))
            .await
            .unwrap();
        assert_eq!(r[0].base_offset, 14 + 2 * i as i64);
        created.push((0, ts));
    }
    check(&c, create_time, &created, 2).await;

    // The old producer state got the upgrade's wall-clock time: not expired at once.
    let state = c
        .producer_state(TopicIdPartition::new(create_time, 0), 7)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.batches.len(), 1);
    assert!(
        (wall_before - 1000..=wall_after + 1000).contains(&state.last_append_ms),
        "{} not in {wall_before}..={wall_after}",
        state.last_append_ms
    );
    clock.set(wall_before);
    assert_eq!(c.expire_producers(10).await.unwrap().expired, 0);
    clock.set(wall_after + 1000 + 86_400_000);
    assert_eq!(c.expire_producers(10).await.unwrap().expired, 1);
    c.close().await;

    // Reopening an upgraded database applies nothing again and changes nothing.
    let c = reopen(&path, clock.clone()).await;
    check(&c, create_time, &created, 2).await;
}

/// A key that confirm_deleted forgot is never committed again (review R3): its object row was the
/// "committed once" guard, so without a fence a retried commit of the same key (a commit whose
/// first attempt's outcome was unknown) would append batches pointing into the deleted object.
/// confirm_deleted fences it in the same transaction; the fence is durable (survives a reopen) and
/// expires like any other, once the commit deadline refuses the key anyway. A key without a v7 time
/// cannot be fenced and is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_confirmed_deleted_is_never_committed_again() {
    const NOW: i64 = 1_700_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("confirmed.db");
    let clock = ManualClock::new(NOW);
    let c = reopen(&path, clock.clone()).await;
    create_topic(&c).await;
    let tp = TopicIdPartition::new(TOPIC, 0);
    let key = v7_key_with(NOW, 1);
    let plain = "wal/no-time".to_string();
    for k in [&key, &plain] {
        let r = c
            .commit_file(file(k.clone(), vec![batch(0, 2, None)]))
            .await
            .unwrap();
        assert_eq!(r[0].error, ErrorCode::None);
    }
    // Both objects lose their batches, are marked, deleted from storage and confirmed.
    let r = c
        .delete_records(&[DeleteRecordsRequest {
            partition: tp,
            offset: 4,
        }])
        .await
        .unwrap();
    assert_eq!(r[0].low_watermark, 4);
    clock.advance(1);
    let marked: Vec<String> = c
        .objects_to_delete(i64::MAX, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.object_key)
        .collect();
    assert_eq!(marked.len(), 2, "{marked:?}");
    c.confirm_deleted(&marked).await.unwrap();
    assert_eq!(c.object_info(&key).await.unwrap(), None);
    assert!(
        c.known_objects(std::slice::from_ref(&key))
            .await
            .unwrap()
            .is_empty()
    );

    // The retried commit of the deleted key: refused, nothing applied.
    let retry_is_fenced = async |c: &SqliteCoordinator| {
        let retry = c
            .commit_file(file(key.clone(), vec![batch(0, 2, None)]))
            .await;
        assert!(
            matches!(&retry, Err(CoordinatorError::ObjectFenced(k)) if *k == key),
            "{retry:?}"
        );
        assert_eq!(list_offset(c, tp, LATEST_TIMESTAMP).await.offset, 4);
        assert_eq!(c.object_info(&key).await.unwrap(), None);
    };
    retry_is_fenced(&c).await;

    // Durable: the same after a reopen.
    c.close().await;
    let c = reopen(&path, clock.clone()).await;
    retry_is_fenced(&c).await;
    // fence_orphans sees the fence as its own (the key stays fenced, and is reported).
    assert_eq!(
        c.fence_orphans(std::slice::from_ref(&key)).await.unwrap(),
        vec![key.clone()]
    );

    // A key without a v7 time has no fence: it is committed like a new key (as in the model).
    let r = c
        .commit_file(file(plain.clone(), vec![batch(0, 2, None)]))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 4));
}

/// An existing database gets a producer-id counter that starts above every producer id with state
/// in it (ids a broker's own allocator handed out before must not come again), leaving out ids
/// from 2^62 on, which no allocator handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_ids_start_above_the_existing_producer_states() {
    use sqlx::{AssertSqlSafe, ConnectOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    let topic = Uuid::from_u128(0xB4);
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        let all = diskless_coordinator::sqlite::migrator();
        let v4 = sqlx::migrate::Migrator::with_migrations(all.iter().take(4).cloned().collect());
        v4.run(&mut conn).await.unwrap();
        for sql in [
            format!(
                "INSERT INTO topics VALUES ('{topic}', 't', 1, 0, -1, -1, 1048588, \
                 9223372036854775807, 3600000, 86400000)"
            ),
            format!("INSERT INTO partitions VALUES (1, '{topic}', 0, 0, 0, 0, -1)"),
            "INSERT INTO producer_state VALUES (1, 41, 0, x'', 5)".to_string(),
            "INSERT INTO producer_state VALUES (1, 7, 0, x'', 5)".to_string(),
            "INSERT INTO producer_state VALUES (1, 4611686018427387909, 0, x'', 5)".to_string(),
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    let c = reopen(&path, ManualClock::new(1_000)).await;
    let block = c.allocate_producer_ids(10).await.unwrap();
    assert_eq!(
        block,
        ProducerIdBlock {
            first: 42,
            count: 10
        }
    );
    c.close().await;

    // A new database starts at 0.
    let fresh = reopen(&dir.path().join("new.db"), ManualClock::new(1_000)).await;
    assert_eq!(fresh.allocate_producer_ids(1).await.unwrap().first, 0);
}

/// A transactional batch of `p` for producer `pid` (epoch 0) from sequence `seq`, verified for
/// transaction `txn_seq` when given.
fn txn_batch(p: i32, records: i32, pid: i64, seq: i32, txn_seq: Option<i64>) -> CommitBatch {
    CommitBatch {
        transactional: true,
        txn_seq,
        ..batch(p, records, Some((pid, seq)))
    }
}

/// A marker of producer `pid` (epoch 0, coordinator epoch 0) ending its transaction `txn_seq`.
fn marker(p: i32, pid: i64, commit: bool, txn_seq: i64) -> TxnMarker {
    TxnMarker {
        partition: TopicIdPartition::new(TOPIC, p),
        producer_id: pid,
        producer_epoch: 0,
        coordinator_epoch: 0,
        commit,
        txn_seq: Some(txn_seq),
    }
}

/// A `read_committed` fetch of partition `p` of the test topic from `offset`.
async fn committed_from(c: &SqliteCoordinator, p: i32, offset: i64) -> FindBatchesResponse {
    c.find_batches(
        &[FindBatchesRequest {
            partition: TopicIdPartition::new(TOPIC, p),
            offset,
            max_bytes: u32::MAX,
            isolation: IsolationLevel::ReadCommitted,
        }],
        u32::MAX,
    )
    .await
    .unwrap()
    .remove(0)
}

/// A database written before migration 6 (schema version 5) is upgraded on open: the rebuilt
/// batches table keeps every batch (fetched with its object, no control), ListOffsets by timestamp
/// answers from the recreated indexes, producer states keep their window and get no transaction;
/// then transactions work on it (a verified batch opens one, an ABORT marker records it, the
/// object of the old batches is released by DeleteRecords), and a reopen changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_database_is_upgraded() {
    use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v5.db");
    // Three batches of 2 records of producer 7 (sequences 0..=5) in object wal/old, CreateTime,
    // effective max timestamps 10, 30, 20 (running max 10, 30, 30).
    let timestamps = [10i64, 30, 20];
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        let all = diskless_coordinator::sqlite::migrator();
        let v5 = sqlx::migrate::Migrator::with_migrations(all.iter().take(5).cloned().collect());
        v5.run(&mut conn).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        let mut sql = vec![
            format!(
                "INSERT INTO topics VALUES ('{TOPIC}', 'durable', 2, 0, -1, -1, 1048588, \
                 9223372036854775807, 9223372036854775807, 86400000)"
            ),
            format!("INSERT INTO partitions VALUES (1, '{TOPIC}', 0, 0, 6, 150, 30)"),
            format!("INSERT INTO partitions VALUES (2, '{TOPIC}', 1, 0, 0, 0, -1)"),
            "INSERT INTO objects VALUES (1, 'wal/old', 1, 151, 150, '0', 5, NULL)".into(),
        ];
        let mut so_far = -1;
        let mut window = Vec::new();
        for (i, ts) in timestamps.iter().enumerate() {
            let base = 2 * i as i64;
            so_far = so_far.max(*ts);
            sql.push(format!(
                "INSERT INTO batches VALUES (1, {}, {base}, 1, {}, 50, {ts}, {ts}, 0, -1, 7, 0, \
                 {base}, {}, {ts}, {so_far})",
                base + 1,
                1 + 50 * base / 2,
                base + 1
            ));
            window.extend_from_slice(&(base as i32).to_le_bytes());
            window.extend_from_slice(&(base as i32 + 1).to_le_bytes());
            window.extend_from_slice(&base.to_le_bytes());
            window.extend_from_slice(&(base + 1).to_le_bytes());
            window.extend_from_slice(&(-1i64).to_le_bytes());
        }
        for s in sql {
            sqlx::query(AssertSqlSafe(s))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        sqlx::query("INSERT INTO producer_state VALUES (1, 7, 0, ?1, 900)")
            .bind(window)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        conn.close().await.unwrap();
    }

    let clock = ManualClock::new(1_000);
    let c = reopen(&path, clock.clone()).await;
    let p0 = TopicIdPartition::new(TOPIC, 0);
    let old = find_from(&c, p0, 0).await;
    assert_eq!(
        (
            old.log_start_offset,
            old.high_watermark,
            old.last_stable_offset
        ),
        (0, 6, 6)
    );
    assert_eq!(old.batches.len(), 3);
    for (i, b) in old.batches.iter().enumerate() {
        assert_eq!(
            (
                b.base_offset,
                b.object_key.as_str(),
                b.object_size,
                b.control
            ),
            (2 * i as i64, "wal/old", 151, None)
        );
        assert_eq!(b.byte_offset, 1 + 50 * i as u64);
        assert_eq!(b.effective_max_timestamp(), timestamps[i]);
    }
    let read_committed = committed_from(&c, 0, 0).await;
    assert_eq!(read_committed.batches, old.batches);
    assert_eq!(read_committed.aborted, Some(vec![]));
    for (target, expected) in [(5, (0, 10)), (25, (2, 30)), (31, (-1, NO_TIMESTAMP))] {
        let r = list_offset(&c, p0, target).await;
        assert_eq!((r.offset, r.timestamp), expected, "target {target}");
    }
    let max = list_offset(&c, p0, MAX_TIMESTAMP).await;
    assert_eq!((max.offset, max.timestamp), (2, 30));
    let state = c.producer_state(p0, 7).await.unwrap().unwrap();
    assert_eq!(state.batches.len(), 3);
    assert_eq!(
        state,
        ProducerState {
            batches: state.batches.clone(),
            ..ProducerState::new(7, 0, 900)
        },
        "no transaction, no marker"
    );

    // The old producer goes on (its window survived the upgrade); a duplicate is recognized.
    let r = c
        .commit_file(file(
            "wal/new-0".into(),
            vec![batch(0, 2, Some((7, 6))), batch(0, 2, Some((7, 4)))],
        ))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 6));
    assert_eq!((r[1].base_offset, r[1].duplicate), (4, true));
    // A transaction opens, is aborted, and is reported to read_committed fetches.
    let r = c
        .commit_file(file(
            "wal/new-1".into(),
            vec![txn_batch(0, 2, 8, 0, Some(1))],
        ))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 8));
    assert_eq!(committed_from(&c, 0, 0).await.last_stable_offset, 8);
    let m = c
        .write_txn_markers(&[marker(0, 8, false, 1)])
        .await
        .unwrap();
    assert_eq!((m[0].error, m[0].offset), (ErrorCode::None, 10));
    let after = committed_from(&c, 0, 0).await;
    assert_eq!(after.last_stable_offset, 11);
    assert_eq!(
        after.aborted,
        Some(vec![AbortedTxn {
            producer_id: 8,
            first_offset: 8,
            last_offset: 10
        }])
    );
    assert_eq!(
        after.batches.last().unwrap().control.map(|c| c.commit),
        Some(false)
    );
    // The upgraded rows release their object like any other; the marker releases nothing.
    let r = c
        .delete_records(&[DeleteRecordsRequest {
            partition: p0,
            offset: 6,
        }])
        .await
        .unwrap();
    assert_eq!(r[0].low_watermark, 6);
    let info = c.object_info("wal/old").await.unwrap().unwrap();
    assert_eq!(
        (info.live_bytes, info.marked_for_deletion_at),
        (0, Some(1_000))
    );
    let before = format!("{:?}", committed_from(&c, 0, 6).await);
    c.close().await;

    // The schema is whole: the batch indexes of migrations 2 and 3 are back, nothing dangles.
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .unwrap();
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'batches' \
             AND sql IS NOT NULL ORDER BY name",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            indexes,
            [
                "batches_max_timestamp",
                "batches_object",
                "batches_timestamp_so_far"
            ]
        );
        let violations = sqlx::query("PRAGMA foreign_key_check")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert!(violations.is_empty());
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(integrity, "ok");
        conn.close().await.unwrap();
    }

    // Reopening an upgraded database applies nothing again and changes nothing.
    let c = reopen(&path, clock.clone()).await;
    assert_eq!(format!("{:?}", committed_from(&c, 0, 6).await), before);
}

/// Open transactions, aborted transactions and the markers' dedupe state are durable: after a
/// reopen the last stable offset still stops at the open transaction, the abort is still reported,
/// a repeated marker is still answered with the first one's offset, and the open transaction goes
/// on and ends as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("txn.db");
    let clock = ManualClock::new(1_000_000);
    let c = reopen(&path, clock.clone()).await;
    create_topic(&c).await;
    // Producer 1 aborts 0..=1 (marker 2); producer 2 opens at 3 and is still open.
    let r = c
        .commit_file(file("wal/0".into(), vec![txn_batch(0, 2, 1, 0, Some(1))]))
        .await
        .unwrap();
    assert_eq!(r[0].base_offset, 0);
    let m = c
        .write_txn_markers(&[marker(0, 1, false, 1)])
        .await
        .unwrap();
    assert_eq!(m[0].offset, 2);
    clock.advance(5);
    let r = c
        .commit_file(file("wal/1".into(), vec![txn_batch(0, 1, 2, 0, Some(1))]))
        .await
        .unwrap();
    assert_eq!(r[0].base_offset, 3);
    let before = format!("{:?}", committed_from(&c, 0, 0).await);
    let open = c
        .producer_state(TopicIdPartition::new(TOPIC, 0), 2)
        .await
        .unwrap();
    // Dropped without close.
    drop(c);

    let c = reopen(&path, clock.clone()).await;
    let r = committed_from(&c, 0, 0).await;
    assert_eq!(format!("{r:?}"), before);
    assert_eq!(r.last_stable_offset, 3);
    assert_eq!(
        r.aborted,
        Some(vec![AbortedTxn {
            producer_id: 1,
            first_offset: 0,
            last_offset: 2
        }])
    );
    let state = c
        .producer_state(TopicIdPartition::new(TOPIC, 0), 2)
        .await
        .unwrap();
    assert_eq!(state, open);
    assert_eq!(
        state.map(|s| (s.current_txn_first_offset, s.current_txn_start_ms)),
        Some((Some(3), 1_000_005))
    );
    // Producer 1's marker, repeated: the first one's offset.
    let m = c
        .write_txn_markers(&[marker(0, 1, false, 1)])
        .await
        .unwrap();
    assert_eq!((m[0].offset, m[0].duplicate), (2, true));
    // Producer 2 goes on without verification, and commits.
    let r = c
        .commit_file(file("wal/2".into(), vec![txn_batch(0, 1, 2, 1, None)]))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 4));
    let m = c.write_txn_markers(&[marker(0, 2, true, 1)]).await.unwrap();
    assert_eq!((m[0].error, m[0].offset), (ErrorCode::None, 5));
    let r = committed_from(&c, 0, 3).await;
    assert_eq!(r.last_stable_offset, 6);
    assert_eq!(
        r.batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert_eq!(r.aborted, Some(vec![]));
}

/// A database written before migration 7 (schema version 6) is upgraded on open: topics get
/// Kafka's default segment settings, objects are WAL objects, partitions have nothing tiered
/// (`-5` answers -1, `-4` the log start); then tiering works on the old rows (a candidate by
/// `segment.ms` after a config change, a plan from the first batch below the last stable
/// offset, a registration covering an upgraded marker and its aborted transaction that releases
/// the old object), fetches and ListOffsets cross the tiers, and a reopen changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_database_is_upgraded() {
    use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v6.db");
    const NOW: i64 = 1_700_000_000_000;
    {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        let all = diskless_coordinator::sqlite::migrator();
        let v6 = sqlx::migrate::Migrator::with_migrations(all.iter().take(6).cloned().collect());
        v6.run(&mut conn).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        // Partition 0: batches 0..=1 (ts 10) and 2..=2 (ts 30, producer 7's transaction) in
        // wal/old, then producer 7's ABORT marker at offset 3 (no object) and its aborted row.
        let sql = [
            format!(
                "INSERT INTO topics VALUES ('{TOPIC}', 'durable', 1, 0, -1, -1, 1048588, \
                 9223372036854775807, 9223372036854775807, 86400000)"
            ),
            format!("INSERT INTO partitions VALUES (1, '{TOPIC}', 0, 0, 4, 178, {NOW})"),
            format!("INSERT INTO objects VALUES (1, 'wal/old', 1, 101, 100, '0', {NOW}, NULL)"),
            "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset, \
             byte_size, base_timestamp, max_timestamp, timestamp_type, log_append_time, \
             producer_id, producer_epoch, base_sequence, last_sequence, \
             effective_max_timestamp, max_timestamp_so_far) VALUES \
             (1, 1, 0, 1, 1, 50, 10, 10, 0, -1, -1, -1, -1, -1, 10, 10), \
             (1, 2, 2, 1, 51, 50, 30, 30, 0, -1, 7, 0, 0, 0, 30, 30)"
                .into(),
            format!(
                "INSERT INTO batches VALUES (1, 3, 3, NULL, 0, 78, {NOW}, {NOW}, 0, -1, 7, 0, \
                 -1, -1, {NOW}, {NOW}, 0, 0)"
            ),
            "INSERT INTO aborted_txns VALUES (1, 3, 2, 7, 4)".into(),
        ];
        for s in sql {
            sqlx::query(AssertSqlSafe(s))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        conn.close().await.unwrap();
    }

    let clock = ManualClock::new(NOW + 1_000);
    let c = reopen(&path, clock.clone()).await;
    let p0 = TopicIdPartition::new(TOPIC, 0);
    let topic = c.list_topics().await.unwrap().remove(0);
    assert_eq!(
        topic.config.segment_bytes,
        TopicConfig::default().segment_bytes
    );
    assert_eq!(topic.config.segment_ms, TopicConfig::default().segment_ms);
    assert_eq!(topic.config.index_interval_bytes, 4096);
    assert_eq!(topic.config.segment_index_bytes, 10 * 1024 * 1024);
    let info = c.object_info("wal/old").await.unwrap().unwrap();
    assert_eq!((info.kind, info.live_bytes), (ObjectKind::Wal, 100));
    assert_eq!(list_offset(&c, p0, -5).await.offset, -1);
    assert_eq!(list_offset(&c, p0, -4).await.offset, 0);
    assert!(c.list_tiered_segments(p0, 0, 10).await.unwrap().is_empty());
    // Not due under the default segment.ms (7 days); due once segment.ms is 1 s.
    assert!(
        c.tiering_candidates(NOW + 1_000, 0, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    c.alter_topic_config(TOPIC, topic.config.clone().with_segment_ms(1_000))
        .await
        .unwrap();
    let candidates = c
        .tiering_candidates(NOW + 1_000, 0, None, 10)
        .await
        .unwrap();
    assert_eq!(candidates.len(), 1);
    assert_eq!(
        (
            candidates[0].partition,
            candidates[0].wal_bytes,
            candidates[0].oldest_wal_commit_ms,
            candidates[0].tiered_next_offset,
            candidates[0].config.segment_ms
        ),
        (p0, 178, NOW, 0, 1_000)
    );
    let plan = c
        .segment_plan(&SegmentPlanRequest {
            partition: p0,
            max_bytes: u64::MAX,
            max_batches: 100,
            committed_before_ms: NOW + 1_000,
        })
        .await
        .unwrap();
    let offsets: Vec<(i64, i64)> = plan
        .batches
        .iter()
        .map(|b| (b.base_offset, b.last_offset))
        .collect();
    assert_eq!(offsets, vec![(0, 1), (2, 2), (3, 3)]);
    assert_eq!(plan.batches[2].control.map(|m| m.commit), Some(false));
    assert_eq!(
        plan.aborted,
        vec![AbortedTxn {
            producer_id: 7,
            first_offset: 2,
            last_offset: 3
        }]
    );
    let key = v7_key_with(NOW + 1_000, 9).replacen("wal/", "tiered/", 1);
    let layout = SegmentLayoutSizes {
        log: 178,
        offset_index: 8,
        time_index: 12,
        txn_index: 34,
        producer_snapshot: 50,
        leader_epochs: 10,
    };
    let register = RegisterSegmentRequest {
        partition: p0,
        object_key: key.clone(),
        object_size: layout.object_size(),
        uploader_broker_id: 1,
        layout,
        base_offset: 0,
        end_offset: 3,
        batch_count: 3,
        batch_bytes: 178,
        max_timestamp: NOW,
        max_timestamp_offset: 3,
        owner: 0,
    };
    let outcome = c.register_segment(register.clone()).await.unwrap();
    assert_eq!(
        outcome,
        RegisterSegmentOutcome::Registered {
            released_objects: 1
        }
    );
    assert_eq!(
        c.register_segment(register).await.unwrap(),
        RegisterSegmentOutcome::AlreadyRegistered
    );
    let info = c.object_info("wal/old").await.unwrap().unwrap();
    assert_eq!(
        (info.live_bytes, info.marked_for_deletion_at),
        (0, Some(NOW + 1_000))
    );
    let segment = c.object_info(&key).await.unwrap().unwrap();
    assert_eq!(
        (segment.kind, segment.live_bytes),
        (ObjectKind::TieredSegment, 178)
    );
    let tiered = committed_from(&c, 0, 0).await;
    assert_eq!(tiered.segments.len(), 1);
    assert_eq!(tiered.segments[0].layout, layout);
    assert_eq!(tiered.segments[0].retention_ts, NOW);
    assert!(tiered.batches.is_empty());
    assert_eq!(
        tiered.aborted,
        Some(vec![]),
        "the aborted row went with the segment"
    );
    assert_eq!(list_offset(&c, p0, -5).await.offset, 3);
    assert_eq!(list_offset(&c, p0, -4).await.offset, 4);
    let hit = list_offset(&c, p0, 20).await;
    assert_eq!((hit.offset, hit.timestamp), (0, NOW));
    let before = format!("{:?}", committed_from(&c, 0, 0).await);
    c.close().await;
    let c = reopen(&path, clock).await;
    assert_eq!(format!("{:?}", committed_from(&c, 0, 0).await), before);
    assert_eq!(c.list_tiered_segments(p0, 0, 10).await.unwrap().len(), 1);
    c.close().await;
}
