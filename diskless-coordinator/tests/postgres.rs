//! The PostgreSQL coordinator against a real server: the conformance suite, the model-based test,
//! concurrent writers, a connection cut mid-commit, read pool separation and migrations.
//!
//! The server comes from `DISKLESS_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! Every test works in a fresh schema of its own (random name), dropped at the end even when the
//! test fails, so tests run in parallel and leave nothing behind. Without a reachable server the
//! tests print `skipped: no PostgreSQL at <url>` and pass, unless `DISKLESS_REQUIRE_POSTGRES=1`.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{find_from, list_offset, request, try_find_from};
use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions, migrate};
use diskless_coordinator::{
    BatchCoordinate, BatchCoordinator, Clock, CommitBatch, CommitBatchResult, CommitFileRequest,
    CoordinatorError, EARLIEST_TIMESTAMP, ErrorCode, FindBatchesRequest, LATEST_TIMESTAMP,
    ListOffsetsRequest, ManualClock, RegisterSegmentOutcome, RegisterSegmentRequest,
    SegmentLayoutSizes, SegmentPlanRequest, SystemClock, TimestampType, TopicConfig,
    TopicIdPartition, TxnMarker,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::coordinator::conformance::{self, Harness, START_MS};
use diskless_testkit::coordinator::ops::{check_against_model, ops_strategy};
use diskless_testkit::keys;
use diskless_testkit::postgres::{
    DEFAULT_URL, Schema, block_on_own_thread, pg_url, report_cleanup, test_schema, unique_name,
};
use proptest::prelude::*;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use uuid::Uuid;

/// An extra connection for the test itself (lock holders, inspection), named after the schema.
async fn side_connection(schema: &Schema, suffix: &str) -> PgConnection {
    let mut conn = PgConnection::connect(&schema.url).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET application_name = '{}{suffix}'; SET search_path = \"{}\"",
        schema.name, schema.name
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

/// A side connection holding the row lock of every partition (in an open transaction) until
/// [`PartitionLocks::release`]: commits block inside the commit function meanwhile.
struct PartitionLocks(PgConnection);

impl PartitionLocks {
    async fn take(schema: &Schema) -> PartitionLocks {
        let mut conn = side_connection(schema, "-locker").await;
        sqlx::raw_sql("BEGIN; SELECT 1 FROM partitions FOR UPDATE")
            .execute(&mut conn)
            .await
            .unwrap();
        PartitionLocks(conn)
    }

    async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .unwrap();
    }
}

/// `commit_file(request)` on a task of its own.
fn spawn_commit(
    c: &Arc<PostgresCoordinator>,
    request: CommitFileRequest,
) -> JoinHandle<Result<Vec<CommitBatchResult>, CoordinatorError>> {
    let c = c.clone();
    tokio::spawn(async move { c.commit_file(request).await })
}

async fn connect(options: PostgresOptions, clock: Arc<ManualClock>) -> Arc<PostgresCoordinator> {
    Arc::new(PostgresCoordinator::connect(options, clock).await.unwrap())
}

async fn coordinator(schema: &Schema, clock: Arc<ManualClock>) -> Arc<PostgresCoordinator> {
    connect(schema.options(), clock).await
}

/// A coordinator on `schema` and the reference model, on one clock at START_MS.
async fn with_model(
    schema: &Schema,
) -> (
    Arc<ManualClock>,
    Arc<PostgresCoordinator>,
    InMemoryCoordinator,
) {
    let clock = ManualClock::new(START_MS);
    let c = coordinator(schema, clock.clone()).await;
    (clock.clone(), c, InMemoryCoordinator::new(clock))
}

/// A fresh topic id, unique in the process (every test has a schema of its own).
fn fresh_topic_id() -> Uuid {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    Uuid::from_u64_pair(0x7e57_0000_0000_0000, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A new topic of `partitions` partitions (default config); its id.
async fn create_topic(c: &dyn BatchCoordinator, partitions: i32) -> Uuid {
    let topic_id = fresh_topic_id();
    let name = format!("t-{topic_id}");
    common::create_topic(c, topic_id, &name, partitions, TopicConfig::default()).await;
    topic_id
}

/// A fresh object key whose UUID v7 time is `age_ms` before the real time: the commit deadline
/// and fence expiry read the server's clock.
fn key_aged(age_ms: i64) -> String {
    keys::v7_key(SystemClock.now_ms() - age_ms)
}

/// A non-idempotent batch of `records` records (100 bytes, timestamp START_MS) for `p`.
fn plain(p: TopicIdPartition, records: i32) -> CommitBatch {
    common::plain(p, records, 100, START_MS)
}

/// [`plain`], from producer `pid` at `epoch`, sequences from `seq` on.
fn idempotent(p: TopicIdPartition, pid: i64, epoch: i16, seq: i32, records: i32) -> CommitBatch {
    CommitBatch {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: seq,
        last_sequence: seq + records - 1,
        ..plain(p, records)
    }
}

/// A registration of a segment made of the planned `batches` under `key`, with sizes computed
/// from them (the `.log` is their bytes; index sizes are made up: the coordinator checks only
/// the counts and bytes).
fn segment_request(
    p: TopicIdPartition,
    key: &str,
    batches: &[BatchCoordinate],
) -> RegisterSegmentRequest {
    let n = batches.len() as u32;
    let bytes: u64 = batches.iter().map(|b| u64::from(b.byte_size)).sum();
    let layout = SegmentLayoutSizes {
        log: bytes,
        offset_index: 8 * n,
        time_index: 12 * n,
        ..SegmentLayoutSizes::default()
    };
    let (mut max_timestamp, mut max_timestamp_offset) = (-1, batches[0].base_offset);
    for b in batches {
        if b.effective_max_timestamp() > max_timestamp {
            max_timestamp = b.effective_max_timestamp();
            max_timestamp_offset = b.last_offset;
        }
    }
    RegisterSegmentRequest {
        partition: p,
        object_key: key.to_string(),
        object_size: layout.object_size(),
        uploader_broker_id: 1,
        layout,
        base_offset: batches[0].base_offset,
        end_offset: batches[batches.len() - 1].last_offset,
        batch_count: n,
        batch_bytes: bytes,
        max_timestamp,
        max_timestamp_offset,
        owner: 0,
    }
}

// The conformance suite, one test per case, every case on a fresh schema of its own (so that the
// cases run in parallel, also in processes of their own). Without a server every case prints the
// skip notice and passes (fails with DISKLESS_REQUIRE_POSTGRES=1). The commit deadline and fence
// expiry read the server's clock (`clock = server`): the cases that depend on them get a harness
// clock at the real time (`CLOCK_SENSITIVE_CASES`), the others keep the suite's fixed
// `START_MS`. The cases that advance the harness clock and expect the deadline and fence expiry to
// follow it (`MANUAL_CLOCK_CASES`) cannot run against a server clock and are left out; the same
// rules are tested against the server's clock by
// `postgres_commit_deadline_is_checked_after_the_locks` (deadline after the locks, fences
// outliving the deadline) and `postgres_fence_retention_follows_the_largest_commit_age` (fence
// expiry).
//
// A case at `START_MS` whose keys carry UUID v7 times (the tiered cases' segment keys, at the
// harness clock's now) would find every key far past the server's deadline. Its coordinator
// gets a `max_commit_age` of the default plus the distance from `START_MS` to the server's
// clock (`commit_age_for`): the server's deadline then falls where the harness clock's would
// (within the case's run time), so those cases see the deadline and fences exactly as the model
// does, `register_segment_refused_past_deadline` included. The clock-sensitive cases (a clock at
// the real time) keep the default — among them the producer-expiry cases, whose floor is twice
// the default `max_commit_age` (issue #25).
diskless_testkit::coordinator_conformance!(
    postgres_conformance,
    async |clock| {
        let schema = test_schema()?;
        let options = schema
            .options()
            .with_max_commit_age(commit_age_for(clock.now_ms()));
        let coordinator = PostgresCoordinator::connect(options, clock).await.unwrap();
        Some((Arc::new(coordinator), schema))
    },
    clock = server,
);

/// The `max_commit_age` that puts the server's commit deadline for a harness clock at `now_ms`
/// where the harness clock's own would be: the default, plus how far the server's clock is
/// ahead of the harness's (0 for a clock at the real time).
fn commit_age_for(now_ms: i64) -> Duration {
    let ahead = SystemClock.now_ms().saturating_sub(now_ms);
    // A clock at the real time (read a moment ago) is not shifted.
    let ahead = if ahead < 60_000 { 0 } else { ahead };
    diskless_coordinator::DEFAULT_MAX_COMMIT_AGE + Duration::from_millis(ahead as u64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random operation sequences give the same results and state as the reference model.
    #[test]
    fn postgres_matches_model(ops in ops_strategy(30)) {
        let Some(schema) = test_schema() else { return Ok(()) };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // The commit deadline reads the server's clock: keys are made at the harness clock's
            // time, so it starts at the real time.
            let clock = conformance::harness_clock_at_system_time();
            let coordinator = coordinator(&schema, clock.clone()).await;
            check_against_model(
                Harness { coordinator: coordinator.clone(), clock },
                &ops,
            )
            .await;
            coordinator.close().await;
        });
    }
}

/// 8 writers, each on its own pool connection, commit files to overlapping partitions (in varying
/// orders inside a file) for about 3 seconds. Afterwards every partition's offsets are gap-free
/// and unique, each writer's batches appear in its commit order, and nothing failed, deadlocked or
/// needed a conflict retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_writers() {
    let Some(schema) = test_schema() else { return };
    const WRITERS: i64 = 8;
    const PARTITIONS: i32 = 4;
    let clock = ManualClock::new(START_MS);
    let options = schema.options().with_max_connections(WRITERS as u32);
    let c = connect(options, clock.clone()).await;
    let topic = create_topic(&c, PARTITIONS).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let pid = 1000 + w;
            let mut next_seq = [0i32; PARTITIONS as usize];
            // Per partition, the base offsets this writer got, in commit order.
            let mut committed: HashMap<i32, Vec<(i32, i64)>> = HashMap::new();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64).wrapping_mul(0x2545_f491);
            let mut file = 0u64;
            while Instant::now() < deadline {
                rng = rng
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                // 2 to 4 batches over the partitions, starting at a random one and going around
                // in either direction, plus a non-idempotent batch.
                let start = (rng >> 33) as i32 % PARTITIONS;
                let count = 2 + (rng >> 40) as i32 % 3;
                let step = if (rng >> 50) & 1 == 0 {
                    1
                } else {
                    PARTITIONS - 1
                };
                let mut batches = Vec::new();
                let mut order = Vec::new();
                for k in 0..count {
                    let p = (start + k * step) % PARTITIONS;
                    let records = 1 + ((rng >> (k * 3)) & 3) as i32;
                    let seq = next_seq[p as usize];
                    batches.push(idempotent(
                        TopicIdPartition::new(topic, p),
                        pid,
                        0,
                        seq,
                        records,
                    ));
                    next_seq[p as usize] += records;
                    order.push((p, seq));
                }
                batches.push(plain(TopicIdPartition::new(topic, start), 1));
                file += 1;
                let results = c
                    .commit_file(request(&format!("wal/writer-{w}/{file:06}"), batches))
                    .await
                    .unwrap_or_else(|e| panic!("writer {w} file {file}: {e}"));
                for (r, (p, seq)) in results.iter().zip(&order) {
                    assert_eq!(r.error, ErrorCode::None, "writer {w}: {r:?}");
                    assert!(!r.duplicate, "writer {w}: {r:?}");
                    committed.entry(*p).or_default().push((*seq, r.base_offset));
                }
                assert_eq!(results.last().unwrap().error, ErrorCode::None);
            }
            (pid, committed, file)
        }));
    }
    let mut by_writer = Vec::new();
    for t in tasks {
        let done = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("a writer hung (deadlock?)")
            .expect("a writer failed");
        by_writer.push(done);
    }
    let files: u64 = by_writer.iter().map(|(_, _, f)| f).sum();
    assert!(files >= WRITERS as u64, "every writer committed");
    eprintln!("{WRITERS} writers committed {files} files");

    for p in 0..PARTITIONS {
        let tp = TopicIdPartition::new(topic, p);
        let found = find_from(c.as_ref(), tp, 0).await;
        assert_eq!(found.error, ErrorCode::None);
        assert_eq!(found.log_start_offset, 0);
        // Gap-free and unique.
        let mut next = 0;
        for b in &found.batches {
            assert_eq!(
                b.base_offset, next,
                "partition {p}: gap or overlap at {b:?}"
            );
            next = b.last_offset + 1;
        }
        assert_eq!(next, found.high_watermark, "partition {p}");
        // Each writer's batches in its commit order, exactly as acknowledged.
        for (pid, committed, _) in &by_writer {
            let in_log: Vec<(i32, i64)> = found
                .batches
                .iter()
                .filter(|b| b.producer_id == *pid)
                .map(|b| (b.base_sequence, b.base_offset))
                .collect();
            let acked = committed.get(&p).cloned().unwrap_or_default();
            assert_eq!(in_log, acked, "partition {p} producer {pid}");
            let seqs: Vec<i32> = in_log.iter().map(|(s, _)| *s).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "partition {p}: {seqs:?}"
            );
        }
    }
    assert_eq!(
        c.conflict_retries(),
        0,
        "the fixed lock order avoids deadlocks"
    );
    c.close().await;
}

/// Transactional producers commit a batch to every partition (in varying orders inside a file)
/// and end each transaction with markers for every partition (in another order), while plain
/// writers commit to the same partitions, for about 3 seconds. Markers lock partitions in the
/// commits' order, so nothing deadlocks or needs a conflict retry and every call succeeds.
/// Afterwards every partition's offsets are gap-free and unique (markers included), each marker
/// is where its call answered, the aborted transactions are exactly the aborts' (producer, first
/// offset, marker offset), and no transaction is left open (the last stable offset is the high
/// watermark).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_markers_and_commits_concurrently() {
    let Some(schema) = test_schema() else { return };
    const TXN_PRODUCERS: i64 = 4;
    const PLAIN_WRITERS: i64 = 2;
    const PARTITIONS: i32 = 4;
    let clock = ManualClock::new(START_MS);
    let options = schema
        .options()
        .with_max_connections((TXN_PRODUCERS + PLAIN_WRITERS) as u32);
    let c = connect(options, clock).await;
    let topic = create_topic(&c, PARTITIONS).await;
    let tp = move |p: i32| TopicIdPartition::new(topic, p);
    // The partitions from a random one, going around in either direction.
    let order = |rng: u64| -> Vec<i32> {
        let start = (rng >> 33) as i32 % PARTITIONS;
        let step = if (rng >> 50) & 1 == 0 {
            1
        } else {
            PARTITIONS - 1
        };
        (0..PARTITIONS)
            .map(|k| (start + k * step) % PARTITIONS)
            .collect()
    };
    let next = |rng: u64| {
        rng.wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407)
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut txn_tasks = Vec::new();
    for w in 0..TXN_PRODUCERS {
        let c = c.clone();
        txn_tasks.push(tokio::spawn(async move {
            let pid = 2000 + w;
            let mut next_seq = [0i32; PARTITIONS as usize];
            // Per partition, each transaction: (first offset, marker offset, commit).
            let mut txns: HashMap<i32, Vec<(i64, i64, bool)>> = HashMap::new();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64).wrapping_mul(0x2545_f491);
            let mut round = 0i64;
            while Instant::now() < deadline {
                round += 1;
                rng = next(rng);
                let partitions = order(rng);
                let batches: Vec<CommitBatch> = partitions
                    .iter()
                    .map(|&p| {
                        let seq = next_seq[p as usize];
                        next_seq[p as usize] += 1;
                        CommitBatch {
                            transactional: true,
                            txn_seq: Some(round),
                            ..idempotent(tp(p), pid, 0, seq, 1)
                        }
                    })
                    .collect();
                let results = c
                    .commit_file(request(&format!("wal/txn-{w}/{round:06}"), batches))
                    .await
                    .unwrap_or_else(|e| panic!("producer {pid} round {round}: {e}"));
                let mut first = HashMap::new();
                for (r, p) in results.iter().zip(&partitions) {
                    assert_eq!(r.error, ErrorCode::None, "producer {pid}: {r:?}");
                    assert!(!r.duplicate, "producer {pid}: {r:?}");
                    first.insert(*p, r.base_offset);
                }
                let commit = (rng >> 20) & 1 == 0;
                let markers: Vec<TxnMarker> = order(next(rng))
                    .into_iter()
                    .map(|p| TxnMarker {
                        partition: tp(p),
                        producer_id: pid,
                        producer_epoch: 0,
                        coordinator_epoch: 0,
                        commit,
                        txn_seq: Some(round),
                    })
                    .collect();
                let written = c
                    .write_txn_markers(&markers)
                    .await
                    .unwrap_or_else(|e| panic!("producer {pid} markers {round}: {e}"));
                for (r, m) in written.iter().zip(&markers) {
                    assert_eq!(r.error, ErrorCode::None, "producer {pid}: {r:?}");
                    assert!(!r.duplicate, "producer {pid}: {r:?}");
                    let p = m.partition.partition;
                    txns.entry(p)
                        .or_default()
                        .push((first[&p], r.offset, commit));
                }
            }
            (pid, txns, round)
        }));
    }
    let mut plain_tasks = Vec::new();
    for w in 0..PLAIN_WRITERS {
        let c = c.clone();
        plain_tasks.push(tokio::spawn(async move {
            let mut rng = 0x2545_f491_4f6c_dd1du64 ^ (w as u64);
            let mut file = 0u64;
            while Instant::now() < deadline {
                file += 1;
                rng = next(rng);
                let batches: Vec<CommitBatch> =
                    order(rng).into_iter().map(|p| plain(tp(p), 2)).collect();
                let results = c
                    .commit_file(request(&format!("wal/plain-{w}/{file:06}"), batches))
                    .await
                    .unwrap_or_else(|e| panic!("writer {w} file {file}: {e}"));
                assert!(results.iter().all(|r| r.error == ErrorCode::None));
            }
            file
        }));
    }
    let mut by_producer = Vec::new();
    for t in txn_tasks {
        by_producer.push(
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("a producer hung (deadlock?)")
                .expect("a producer failed"),
        );
    }
    for t in plain_tasks {
        let files = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("a writer hung (deadlock?)")
            .expect("a writer failed");
        assert!(files > 0);
    }
    let rounds: i64 = by_producer.iter().map(|(_, _, r)| r).sum();
    assert!(
        rounds >= TXN_PRODUCERS,
        "every producer ended a transaction"
    );

    let mut conn = side_connection(&schema, "-inspector").await;
    for p in 0..PARTITIONS {
        let found = find_from(c.as_ref(), tp(p), 0).await;
        assert_eq!(found.error, ErrorCode::None);
        assert_eq!(
            found.last_stable_offset, found.high_watermark,
            "partition {p}: no transaction left open"
        );
        let mut next_offset = 0;
        for b in &found.batches {
            assert_eq!(
                b.base_offset, next_offset,
                "partition {p}: gap or overlap at {b:?}"
            );
            next_offset = b.last_offset + 1;
        }
        assert_eq!(next_offset, found.high_watermark, "partition {p}");
        let markers = found.batches.iter().filter(|b| b.is_control()).count() as i64;
        assert_eq!(markers, rounds, "partition {p}: one marker per transaction");
        let mut expected_aborted = Vec::new();
        for (pid, txns, _) in &by_producer {
            for &(first, marker, commit) in txns.get(&p).into_iter().flatten() {
                let b = found
                    .batches
                    .iter()
                    .find(|b| b.base_offset == marker)
                    .expect("the marker");
                assert_eq!(
                    (b.producer_id, b.control.map(|m| m.commit)),
                    (*pid, Some(commit)),
                    "partition {p}: {b:?}"
                );
                if !commit {
                    expected_aborted.push((*pid, first, marker));
                }
            }
        }
        expected_aborted.sort_by_key(|(_, _, marker)| *marker);
        let aborted: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT a.producer_id, a.first_offset, a.last_offset FROM aborted_txns a \
             JOIN partitions pa ON pa.partition_id = a.partition_id \
             WHERE pa.topic_id = $1::uuid AND pa.partition = $2 ORDER BY a.last_offset",
        )
        .bind(topic.hyphenated().to_string())
        .bind(p)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(aborted, expected_aborted, "partition {p}");
    }
    assert_eq!(
        c.conflict_retries(),
        0,
        "markers and commits lock in one order: no deadlock"
    );
    c.close().await;
}

/// Waits until one of this test's write-pool backends is blocked on a lock; returns its pid.
async fn blocked_backend(inspector: &mut PgConnection, application_name: &str) -> i32 {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock' LIMIT 1",
        )
        .bind(application_name)
        .fetch_optional(&mut *inspector)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        assert!(
            Instant::now() < give_up,
            "the commit never blocked on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP proxy in front of the server that the test can freeze (bytes are held, not forwarded)
/// and whose connections it can cut all at once (as a restarted server, a failover or a network
/// device does).
struct CutProxy {
    addr: std::net::SocketAddr,
    conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl CutProxy {
    async fn start(upstream: std::net::SocketAddr) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let frozen = tokio::sync::watch::Sender::new(false);
        let (held, gate) = (conns.clone(), frozen.subscribe());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                let (g1, g2) = (gate.clone(), gate.clone());
                held.lock().unwrap().push(tokio::spawn(async move {
                    tokio::join!(Self::pipe(ri, wo, g1), Self::pipe(ro, wi, g2));
                }));
            }
        });
        CutProxy {
            addr,
            conns,
            frozen,
        }
    }

    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut gate: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if gate.wait_for(|frozen| !*frozen).await.is_err()
                || to.write_all(&buf[..n]).await.is_err()
            {
                return;
            }
        }
    }

    /// Holds every byte from now on (calls in flight wait).
    fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Closes every connection through the proxy and lets new ones through; returns how many.
    fn cut(&self) -> usize {
        let conns: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        for c in &conns {
            c.abort();
        }
        self.frozen.send_replace(false);
        conns.len()
    }
}

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: std::net::SocketAddr) -> String {
    let start = url
        .find('@')
        .map_or_else(|| url.find("://").unwrap() + 3, |at| at + 1);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    format!("{}{addr}{}", &url[..start], &url[end..])
}

/// A server restart, a failover or a cut network breaks every pooled connection, and the pool
/// pings only those idle for `ping_idle_after`: a read on a broken one is asked again on another
/// (up to the read pool's size) instead of failing its caller. Found by the fault campaign
/// (chaos/, `pg-cut`): ListOffsets answered `KAFKA_STORAGE_ERROR` right after a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_survive_broken_pooled_connections() {
    let Some(schema) = test_schema() else { return };
    let server = {
        let host = schema.url.find('@').map_or(0, |at| at + 1);
        let authority = &schema.url[host..];
        let authority = &authority[..authority.find('/').unwrap_or(authority.len())];
        tokio::net::lookup_host(authority)
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = CutProxy::start(server).await;
    let clock = ManualClock::new(START_MS);
    let c = connect(
        schema.options().with_url(via(&schema.url, proxy.addr)),
        clock,
    )
    .await;
    let topic = create_topic(&c, 1).await;
    let p = TopicIdPartition::new(topic, 0);
    let r = c
        .commit_file(request("wal/a", vec![idempotent(p, 7, 0, 0, 1)]))
        .await
        .unwrap();
    assert_eq!(r[0].error, ErrorCode::None);
    // Pooled read connections, all used just now (the pool pings none of them); reads in flight
    // when their connections are cut.
    let warm = futures::future::join_all((0..4).map(|_| c.list_topics())).await;
    assert!(warm.iter().all(Result::is_ok));
    proxy.freeze();
    let (c1, c2) = (c.clone(), c.clone());
    let listing = tokio::spawn(async move { c1.list_topics().await });
    let finding = tokio::spawn(async move { find_from(c2.as_ref(), p, 0).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proxy.cut() >= 2, "the write and read pools' connections");
    assert_eq!(listing.await.unwrap().unwrap().len(), 1);
    assert_eq!(finding.await.unwrap().high_watermark, 1);
    for _ in 0..3 {
        assert_eq!(c.list_topics().await.unwrap().len(), 1);
        let found = find_from(c.as_ref(), p, 0).await;
        assert_eq!(found.high_watermark, 1);
    }
    c.close().await;
}

/// A commit whose connection is cut while it runs reports an unknown outcome; an idempotent retry
/// then appends the batch exactly once (a second retry is recognised as a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_cut_mid_commit() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let c = coordinator(&schema, clock.clone()).await;
    let topic = create_topic(&c, 1).await;
    let p = TopicIdPartition::new(topic, 0);
    let r = c
        .commit_file(request("wal/first", vec![idempotent(p, 7, 0, 0, 1)]))
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 0));

    // Hold the partition's row lock from another transaction, so the commit blocks inside the
    // commit function; then terminate the commit's backend.
    let locks = PartitionLocks::take(&schema).await;
    let blocked = spawn_commit(&c, request("wal/cut", vec![idempotent(p, 7, 0, 1, 2)]));
    let mut inspector = side_connection(&schema, "-inspector").await;
    let pid = blocked_backend(&mut inspector, &schema.name).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut inspector)
        .await
        .unwrap();
    assert!(terminated);
    let outcome = blocked.await.unwrap();
    assert!(
        matches!(outcome, Err(CoordinatorError::OutcomeUnknown(_))),
        "{outcome:?}"
    );
    locks.release().await;

    // The producer retries the batch in a new WAL file: appended once...
    let r = c
        .commit_file(request("wal/retry-1", vec![idempotent(p, 7, 0, 1, 2)]))
        .await
        .unwrap();
    assert_eq!(r[0].error, ErrorCode::None);
    let appended_at = r[0].base_offset;
    assert_eq!(appended_at, 1);
    // ...and once more: a duplicate with the original offset.
    let r = c
        .commit_file(request("wal/retry-2", vec![idempotent(p, 7, 0, 1, 2)]))
        .await
        .unwrap();
    assert_eq!(
        (r[0].error, r[0].base_offset),
        (ErrorCode::None, appended_at)
    );
    assert!(r[0].duplicate);

    let found = find_from(c.as_ref(), p, 0).await;
    let seqs: Vec<(i32, i64)> = found
        .batches
        .iter()
        .map(|b| (b.base_sequence, b.base_offset))
        .collect();
    assert_eq!(
        seqs,
        vec![(0, 0), (1, 1)],
        "nothing lost, nothing duplicated"
    );
    assert_eq!(found.high_watermark, 3);
    // The cut commit registered nothing (it was rolled back); the retries are known.
    let known = c
        .known_objects(&["wal/cut".into(), "wal/retry-1".into(), "wal/retry-2".into()])
        .await
        .unwrap();
    assert_eq!(
        known,
        vec!["wal/retry-1".to_string(), "wal/retry-2".to_string()]
    );
    c.close().await;
}

/// Reads go to the read pool (its own connections, from `read_url`) and proceed while every write
/// connection is stuck behind a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_pool_separation() {
    let Some(schema) = test_schema() else { return };
    // The same server under another user when the URL names the default user, to tell the pools'
    // connections apart.
    let read_url = schema.url.replacen("://postgres@", "://root@", 1);
    let read_user = if read_url != schema.url {
        Some("root")
    } else {
        None
    };
    let clock = ManualClock::new(START_MS);
    let options = schema
        .options()
        .with_max_connections(1)
        .with_read_url(read_url.clone())
        .with_acquire_timeout(Duration::from_secs(60));
    let c = connect(options, clock.clone()).await;
    let topic = create_topic(&c, 1).await;
    let p = TopicIdPartition::new(topic, 0);
    c.commit_file(request("wal/a", vec![plain(p, 5)]))
        .await
        .unwrap();

    // Block the only write connection in a commit.
    let locks = PartitionLocks::take(&schema).await;
    let blocked = spawn_commit(&c, request("wal/b", vec![plain(p, 1)]));
    let mut inspector = side_connection(&schema, "-inspector").await;
    blocked_backend(&mut inspector, &schema.name).await;

    // Reads answer meanwhile, from the committed state.
    let reads = async {
        let found = find_from(c.as_ref(), p, 0).await;
        assert_eq!(found.high_watermark, 5);
        assert_eq!(found.batches.len(), 1);
        let latest = c
            .list_offsets(&[ListOffsetsRequest {
                partition: p,
                timestamp: LATEST_TIMESTAMP,
                isolation: Default::default(),
            }])
            .await
            .unwrap();
        assert_eq!(latest[0].offset, 5);
        assert_eq!(c.list_topics().await.unwrap().len(), 1);
    };
    tokio::time::timeout(Duration::from_secs(30), reads)
        .await
        .expect("reads waited for the blocked write connection");
    let readers: Vec<String> = sqlx::query_scalar(
        "SELECT usename::text FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(format!("{}-read", schema.name))
    .fetch_all(&mut inspector)
    .await
    .unwrap();
    assert!(!readers.is_empty(), "the read pool has its own connections");
    if let Some(user) = read_user {
        assert!(readers.iter().all(|u| u == user), "{readers:?}");
    }

    locks.release().await;
    let r = blocked.await.unwrap().unwrap();
    assert_eq!(r[0].base_offset, 5);
    c.close().await;
}

/// Migrations are explicit, idempotent, safe to run concurrently, recorded in the schema, and
/// checked: a schema behind the build is refused without migrate_on_start, an edited migration is
/// reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let options = schema.options().with_migrate_on_start(false);

    let r = PostgresCoordinator::connect(options.clone(), clock.clone()).await;
    assert!(matches!(r, Err(CoordinatorError::Storage(_))), "{r:?}");

    let runs: Vec<_> = (0..4)
        .map(|_| {
            let options = options.clone();
            tokio::spawn(async move { migrate(&options).await })
        })
        .collect();
    let mut applied = 0;
    for r in runs {
        applied += r.await.unwrap().unwrap();
    }
    assert_eq!(
        applied, 17,
        "exactly one concurrent migrator applied each of the 17 migrations"
    );
    assert_eq!(migrate(&options).await.unwrap(), 0);

    let c = connect(options.clone(), clock.clone()).await;
    assert_eq!(c.migrate().await.unwrap(), 0);
    let topic = create_topic(&c, 1).await;
    assert_eq!(c.list_topics().await.unwrap()[0].topic_id, topic);
    c.close().await;

    let mut conn = side_connection(&schema, "-inspector").await;
    let recorded: Vec<(i32, String)> =
        sqlx::query_as("SELECT version, name FROM schema_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        recorded,
        vec![
            (1, "initial".to_string()),
            (2, "fast_commit_file".to_string()),
            (3, "replica_heartbeat_running_max".to_string()),
            (4, "timestamp_indexes".to_string()),
            (5, "commit_point_producer_expiry".to_string()),
            (6, "fence_retention_confirm_fences".to_string()),
            (7, "set_based_idempotent_commit".to_string()),
            (8, "producer_ids".to_string()),
            (9, "lean_batch_writes".to_string()),
            (10, "drop_batches_object_index".to_string()),
            (11, "transactions".to_string()),
            (12, "open_txn_index".to_string()),
            (13, "tiered_segments".to_string()),
            (14, "topic_compression".to_string()),
            (15, "open_txn_seq".to_string()),
            (16, "txn_records".to_string()),
            (17, "topic_compaction".to_string()),
        ]
    );
    sqlx::query("UPDATE schema_migrations SET checksum = 'edited'")
        .execute(&mut conn)
        .await
        .unwrap();
    let r = migrate(&options).await;
    assert!(matches!(r, Err(CoordinatorError::Storage(_))), "{r:?}");
}

// -------------------------------------------------------------------------------------------------
// Server-side functions: defined once (src/postgres/functions.sql), re-applied on every connect

/// `functions.sql`, the one definition of the server-side functions.
const FUNCTIONS_SQL: &str = include_str!("../src/postgres/functions.sql");

/// The signature of `commit_file` this build calls (postgres/commit.rs).
const COMMIT_FILE: &str = "commit_file(text,integer,bigint,bigint[],bigint,uuid[],integer[],\
    bigint[],bigint[],integer[],bigint[],bigint[],bigint[],smallint[],integer[],integer[],bigint,\
    bigint,smallint[],boolean[],bigint[])";

/// Every server-side function of a migrated schema, as `name(argument types) -> result`: those
/// this build calls (commit_file's current signature, write_txn_markers, register_segment,
/// fence_orphans, confirm_deleted), those they call (and the trigger's), and the previous
/// commit_file signatures, kept for brokers not yet upgraded (a rolling upgrade, a rollback).
const FUNCTIONS: &[&str] = &[
    "check_commit_point(text,bigint,bigint) -> void",
    // The first signature (brokers before migration 5).
    "commit_file(text,integer,bigint,bigint[],bigint,uuid[],integer[],bigint[],bigint[],integer[],\
     bigint[],bigint[],bigint[],smallint[],integer[],integer[]) -> TABLE(r_batch_index integer, \
     r_error_code smallint, r_base_offset bigint, r_log_append_time bigint, r_log_start_offset \
     bigint, r_duplicate boolean)",
    // The previous signature (brokers before migration 11).
    "commit_file(text,integer,bigint,bigint[],bigint,uuid[],integer[],bigint[],bigint[],integer[],\
     bigint[],bigint[],bigint[],smallint[],integer[],integer[],bigint,bigint,smallint[]) -> \
     TABLE(r_batch_index integer, r_error_code smallint, r_base_offset bigint, r_log_append_time \
     bigint, r_log_start_offset bigint, r_duplicate boolean)",
    // The current one.
    "commit_file(text,integer,bigint,bigint[],bigint,uuid[],integer[],bigint[],bigint[],integer[],\
     bigint[],bigint[],bigint[],smallint[],integer[],integer[],bigint,bigint,smallint[],boolean[],\
     bigint[]) -> TABLE(r_batch_index integer, r_error_code smallint, r_base_offset bigint, \
     r_log_append_time bigint, r_log_start_offset bigint, r_duplicate boolean)",
    "confirm_deleted(text[],bigint,integer) -> void",
    "expire_fences(bigint,integer) -> bigint",
    "fence_deleted_objects() -> trigger",
    "fence_expiry_before(bigint) -> bigint",
    "fence_orphans(text[],bigint[],bigint,integer) -> TABLE(r_object_key text)",
    "object_key_time_ms(text) -> bigint",
    "register_segment(text,integer,bigint,bigint,bigint,uuid,integer,bigint,bigint,integer,bigint,\
     integer,integer,integer,integer,integer,bigint,bigint,bigint,bigint) -> TABLE(r_outcome \
     smallint, r_released integer)",
    // Compaction's swap (functions revision 3, issue #29).
    "replace_segments(uuid,integer,bigint,text[],bigint[],bigint[],text,integer,bigint,bigint,\
     bigint,bigint,integer,bigint,integer,integer,integer,integer,integer,bigint,bigint,bigint,\
     bigint) -> TABLE(r_outcome smallint, r_released integer)",
    "write_txn_markers(bigint,uuid[],integer[],bigint[],smallint[],integer[],boolean[],bigint[]) -> \
     TABLE(r_index integer, r_error_code smallint, r_offset bigint, r_duplicate boolean)",
];

/// The functions of `schema` as `name(argument types) -> result`, sorted; with `definitions`,
/// each followed by its whole definition (the schema's name replaced by `SCHEMA`).
async fn functions_of(conn: &mut PgConnection, schema: &str, definitions: bool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT p.proname || '(' || \
         coalesce((SELECT string_agg(format_type(t, NULL), ',' ORDER BY i) \
                   FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)), '') \
         || ') -> ' || pg_get_function_result(p.oid) \
         || CASE WHEN $2 THEN E'\\n' || replace(pg_get_functiondef(p.oid), $1, 'SCHEMA') ELSE '' END \
         FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1) \
         ORDER BY 1",
    )
    .bind(schema)
    .bind(definitions)
    .fetch_all(conn)
    .await
    .unwrap()
}

/// A migrated schema holds exactly [`FUNCTIONS`] (what this build calls, what they call, the
/// signatures older brokers call), and the trigger that fences deleted objects.
#[tokio::test]
async fn postgres_functions_the_code_calls_exist() {
    let Some(schema) = test_schema() else { return };
    migrate(&schema.options()).await.unwrap();
    let mut conn = side_connection(&schema, "-inspector").await;
    let mut expected: Vec<String> = FUNCTIONS.iter().map(|f| f.to_string()).collect();
    expected.sort();
    assert_eq!(functions_of(&mut conn, &schema.name, false).await, expected);
    assert!(expected.iter().any(|f| f.starts_with(COMMIT_FILE)));
    let trigger: String = sqlx::query_scalar(
        "SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t \
         WHERE t.tgrelid = 'objects'::regclass AND t.tgname = 'objects_deleted_fence'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        trigger.contains("AFTER DELETE")
            && trigger.ends_with("EXECUTE FUNCTION fence_deleted_objects()"),
        "{trigger}"
    );
}

/// `functions.sql` alone, run in an empty schema (bodies unchecked: there are no tables), defines
/// every function a migrated schema holds, with the same definitions: no function lives only in a
/// migration (a signature dropped from the file would survive on old schemas only, and be missing
/// from new ones), and what runs is the file's text.
#[tokio::test]
async fn postgres_functions_file_defines_every_function() {
    let Some(migrated) = test_schema() else {
        return;
    };
    migrate(&migrated.options()).await.unwrap();
    let alone = Schema::new(&migrated.url);
    let mut conn = side_connection(&alone, "-functions").await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA \"{}\"; SET check_function_bodies = off",
        alone.name
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::raw_sql(FUNCTIONS_SQL)
        .execute(&mut conn)
        .await
        .unwrap();
    let from_file = functions_of(&mut conn, &alone.name, true).await;
    assert_eq!(from_file.len(), FUNCTIONS.len());
    assert_eq!(
        functions_of(&mut conn, &migrated.name, true).await,
        from_file
    );
}

/// The functions are re-applied after the migrations on every connect, one migrator at a time,
/// while commits run. A schema migrated before `functions.sql` existed (no `schema_functions`), or
/// whose functions were altered, gets this build's; a newer build's (a higher revision, or a
/// schema with migrations this build does not know) are left as they are; the same revision with
/// another text is refused, like an edited migration. Without `migrate_on_start`, a schema whose
/// functions are older than the build is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_functions_are_reapplied_on_every_connect() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let options = schema.options().with_max_connections(8);
    let c = connect(options.clone(), clock.clone()).await;
    let topic = create_topic(c.as_ref(), 4).await;
    let mut conn = side_connection(&schema, "-inspector").await;
    let revision: i32 = sqlx::query_scalar("SELECT max(revision) FROM schema_functions")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(revision >= 1);
    async fn definition(conn: &mut PgConnection) -> String {
        sqlx::query_scalar("SELECT pg_get_functiondef(to_regprocedure($1))")
            .bind(COMMIT_FILE)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    // A function's COST is part of its definition; CREATE OR REPLACE without one sets the
    // default (100): the mark of a function altered by hand, and of its replacement.
    async fn cost(conn: &mut PgConnection) -> f64 {
        sqlx::query_scalar("SELECT procost::float8 FROM pg_proc WHERE oid = to_regprocedure($1)")
            .bind(COMMIT_FILE)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    let original = definition(&mut conn).await;
    let alter = format!("ALTER FUNCTION {COMMIT_FILE} COST 7");

    // As the build before functions.sql left it, with a function altered by hand.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE schema_functions; {alter}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(cost(&mut conn).await, 7.0);
    let r =
        PostgresCoordinator::connect(options.clone().with_migrate_on_start(false), clock.clone())
            .await;
    match r {
        Err(CoordinatorError::Storage(e)) => assert!(e.to_string().contains("functions"), "{e}"),
        other => panic!(
            "connected to a schema without this build's functions: {:?}",
            other.map(|_| ())
        ),
    }

    // Coordinators connecting at once while commits run: each re-applies the functions, one at a
    // time; no commit fails.
    let commits: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let p = TopicIdPartition::new(topic, i);
                for _ in 0..25 {
                    let r = c
                        .commit_file(request(&key_aged(0), vec![plain(p, 1)]))
                        .await
                        .unwrap();
                    assert_eq!(r[0].error, ErrorCode::None);
                }
            })
        })
        .collect();
    let migrators: Vec<_> = (0..6)
        .map(|_| {
            let options = options.clone();
            tokio::spawn(async move { migrate(&options).await })
        })
        .collect();
    for m in migrators {
        assert_eq!(m.await.unwrap().unwrap(), 0);
    }
    for t in commits {
        t.await.unwrap();
    }
    for i in 0..4 {
        let p = TopicIdPartition::new(topic, i);
        assert_eq!(find_from(c.as_ref(), p, 0).await.high_watermark, 25);
    }
    assert_eq!(cost(&mut conn).await, 100.0);
    assert_eq!(definition(&mut conn).await, original);
    let recorded: Vec<i32> = sqlx::query_scalar("SELECT revision FROM schema_functions")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(recorded, vec![revision]);
    PostgresCoordinator::connect(options.clone().with_migrate_on_start(false), clock.clone())
        .await
        .unwrap()
        .close()
        .await;

    // A newer build's functions are left as they are; once they are gone from the record, this
    // build's come back.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO schema_functions (revision, checksum) VALUES ({}, 'newer'); {alter}",
        revision + 1
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(migrate(&options).await.unwrap(), 0);
    assert_eq!(cost(&mut conn).await, 7.0);
    PostgresCoordinator::connect(options.clone().with_migrate_on_start(false), clock.clone())
        .await
        .unwrap()
        .close()
        .await;
    sqlx::query("DELETE FROM schema_functions WHERE revision > $1")
        .bind(revision)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(migrate(&options).await.unwrap(), 0);
    assert_eq!(cost(&mut conn).await, 100.0);

    // So are the functions of a schema with migrations this build does not know.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO schema_migrations (version, name, checksum) VALUES (100000, 'future', '-'); \
         {alter}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(migrate(&options).await.unwrap(), 0);
    assert_eq!(cost(&mut conn).await, 7.0);
    sqlx::query("DELETE FROM schema_migrations WHERE version = 100000")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(migrate(&options).await.unwrap(), 0);
    assert_eq!(cost(&mut conn).await, 100.0);

    // The same revision with another text: refused, nothing replaced.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE schema_functions SET checksum = 'edited'; {alter}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let r = migrate(&options).await;
    assert!(matches!(r, Err(CoordinatorError::Storage(_))), "{r:?}");
    assert_eq!(cost(&mut conn).await, 7.0);
    c.close().await;
}

/// Errors before anything reaches a server: bad options are invalid, an unreachable server is
/// unavailable (retriable). Needs no server.
#[tokio::test]
async fn postgres_connect_errors() {
    let clock = ManualClock::new(START_MS);
    let r = PostgresCoordinator::connect(
        PostgresOptions::new(DEFAULT_URL).with_schema("Bad-Name"),
        clock.clone(),
    )
    .await;
    assert!(
        matches!(r, Err(CoordinatorError::InvalidRequest(_))),
        "{r:?}"
    );
    let r = PostgresCoordinator::connect(PostgresOptions::new("not a url"), clock.clone()).await;
    assert!(
        matches!(r, Err(CoordinatorError::InvalidRequest(_))),
        "{r:?}"
    );
    // Port 1 on localhost: nothing listens there.
    let r = PostgresCoordinator::connect(
        PostgresOptions::new("postgres://postgres@127.0.0.1:1/test")
            .with_acquire_timeout(Duration::from_secs(2)),
        clock,
    )
    .await;
    match r {
        Err(e) => assert!(e.is_retriable(), "{e:?}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

/// A commit of many batches over many partitions and producers is one call and matches what a
/// batch-by-batch reading of the rules gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_large_commit() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let c = coordinator(&schema, clock.clone()).await;
    let topic = create_topic(&c, 10).await;
    let mut batches = Vec::new();
    let mut seq = HashMap::new();
    for i in 0..200 {
        let p = TopicIdPartition::new(topic, (i * 7) % 10);
        let pid = i64::from(i % 3);
        let s = seq.entry((p.partition, pid)).or_insert(0);
        batches.push(idempotent(p, pid, 0, *s, 2));
        *s += 2;
    }
    let results = c
        .commit_file(request("wal/large", batches.clone()))
        .await
        .unwrap();
    let mut expected: HashMap<i32, i64> = HashMap::new();
    for (b, r) in batches.iter().zip(&results) {
        let next = expected.entry(b.partition.partition).or_insert(0);
        assert_eq!((r.error, r.base_offset), (ErrorCode::None, *next), "{b:?}");
        *next += 2;
    }
    // Re-sending the last batch of every producer is a duplicate.
    let r = c
        .commit_file(request("wal/large-again", batches[195..].to_vec()))
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.duplicate), "{r:?}");
    let info = c.object_info("wal/large").await.unwrap().unwrap();
    assert_eq!(info.live_bytes, 200 * 100);
    c.close().await;
}

/// A deterministic xorshift generator (the test needs reproducible requests, not proptest's
/// shrinking).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a simulated idempotent client of one (partition, producer) has sent: its epoch, its next
/// sequence and every batch (epoch, base sequence, records) in send order.
#[derive(Default)]
struct Sender {
    epoch: i16,
    next: i32,
    sent: Vec<(i16, i32, i32)>,
}

/// Many idempotent producers with many batches each per commit (issue #17: the commit decides
/// idempotent batches set-based, every (partition, producer) group advancing one batch per step)
/// give exactly the reference model's results and state: duplicates of stored batches and of
/// batches appended earlier in the same commit (answered with those batches' offsets and log
/// append times), windows that slide within a commit so that a re-send of an evicted batch is out
/// of order, epoch bumps followed by batches of the old epoch in the same commit, sequence gaps,
/// the i32::MAX wrap, per-batch field errors, unknown partitions and non-idempotent batches
/// interleaved, on a CreateTime and a LogAppendTime topic. Checked after every commit: every
/// batch's result, every partition's batches and every producer's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_many_idempotent_producers_per_commit_match_model() {
    let Some(schema) = test_schema() else { return };
    // The commit deadline reads the server's clock: keys are made at the clock's time.
    let clock = conformance::harness_clock_at_system_time();
    let c = coordinator(&schema, clock.clone()).await;
    let model = InMemoryCoordinator::new(clock.clone());
    const PARTITIONS: i32 = 6;
    const PRODUCERS: i64 = 24;
    let mut topics = Vec::new();
    for timestamp_type in [TimestampType::CreateTime, TimestampType::LogAppendTime] {
        let topic = fresh_topic_id();
        let config = TopicConfig::default().with_timestamp_type(timestamp_type);
        for x in [c.as_ref() as &dyn BatchCoordinator, &model] {
            let name = format!("t-{timestamp_type:?}");
            common::create_topic(x, topic, &name, PARTITIONS, config.clone()).await;
        }
        topics.push(topic);
    }
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut senders: HashMap<(TopicIdPartition, i64), Sender> = HashMap::new();
    // What the run exercised (asserted below, so the test cannot silently stop covering it).
    let (mut dup_stored, mut dup_same_commit, mut out_of_order, mut fenced_epoch) = (0, 0, 0, 0);
    let (mut field_errors, mut appended) = (0, 0);
    for commit in 0..12 {
        clock.advance(7);
        let mut batches = Vec::new();
        for _ in 0..300 {
            let topic = topics[rng.below(2) as usize];
            let partition = if rng.below(40) == 0 {
                PARTITIONS // unknown
            } else {
                rng.below(PARTITIONS as u64) as i32
            };
            let p = TopicIdPartition::new(topic, partition);
            let records = 1 + rng.below(4) as i32;
            if rng.below(10) == 0 {
                batches.push(plain(p, records));
                continue;
            }
            let pid = rng.below(PRODUCERS as u64) as i64;
            let s = senders.entry((p, pid)).or_default();
            let (epoch, base, records) = match rng.below(100) {
                // Re-send one of the last 8 batches sent (maybe of this commit, maybe evicted
                // from the window, maybe of an older epoch).
                0..=14 if !s.sent.is_empty() => {
                    let back = rng.below(8.min(s.sent.len() as u64)) as usize;
                    s.sent[s.sent.len() - 1 - back]
                }
                15..=19 => {
                    s.epoch += 1;
                    s.next = 0;
                    (s.epoch, 0, records)
                }
                20..=23 => (s.epoch - 1, s.next, records),
                24..=27 => (s.epoch, s.next.wrapping_add(2), records),
                28..=30 => (s.epoch, -1, records),
                31..=32 => (-2, s.next, records),
                33..=37 if s.sent.is_empty() => {
                    // A producer without state may start anywhere: close to the wrap.
                    s.next = i32::MAX - 1;
                    (s.epoch, i32::MAX - 1, 1 + records)
                }
                _ => (s.epoch, s.next, records),
            };
            if base >= 0 && epoch == s.epoch && base == s.next {
                s.next = diskless_coordinator::last_sequence(base, records).wrapping_add(1);
                if s.next < 0 {
                    s.next = 0;
                }
            }
            s.sent.push((epoch, base, records));
            batches.push(CommitBatch {
                base_sequence: base,
                last_sequence: if base >= 0 {
                    diskless_coordinator::last_sequence(base, records)
                } else {
                    base
                },
                ..idempotent(p, pid, epoch, 0, records)
            });
        }
        let key = keys::v7_key(clock.now_ms());
        let req = request(&key, batches);
        let before: HashMap<TopicIdPartition, i64> = {
            let mut m = HashMap::new();
            for &t in &topics {
                for partition in 0..PARTITIONS {
                    let p = TopicIdPartition::new(t, partition);
                    m.insert(p, find_from(&model, p, 0).await.high_watermark);
                }
            }
            m
        };
        let got = c.commit_file(req.clone()).await.unwrap();
        let want = model.commit_file(req.clone()).await.unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "commit {commit}, batch {i}: {:?}", req.batches[i]);
        }
        assert_eq!(got.len(), want.len());
        for (b, r) in req.batches.iter().zip(&want) {
            match r.error {
                ErrorCode::None if r.duplicate => {
                    if r.base_offset >= before[&b.partition] {
                        dup_same_commit += 1;
                    } else {
                        dup_stored += 1;
                    }
                }
                ErrorCode::None => appended += 1,
                ErrorCode::OutOfOrderSequenceNumber => out_of_order += 1,
                ErrorCode::InvalidProducerEpoch if b.producer_epoch >= -1 => fenced_epoch += 1,
                ErrorCode::InvalidProducerEpoch | ErrorCode::InvalidRecord => field_errors += 1,
                _ => {}
            }
        }
        for &t in &topics {
            for partition in 0..=PARTITIONS {
                let p = TopicIdPartition::new(t, partition);
                assert_eq!(
                    find_from(c.as_ref(), p, 0).await,
                    find_from(&model, p, 0).await,
                    "commit {commit}: batches of {p}"
                );
                for pid in 0..PRODUCERS {
                    assert_eq!(
                        c.producer_state(p, pid).await.unwrap(),
                        model.producer_state(p, pid).await.unwrap(),
                        "commit {commit}: producer {pid} of {p}"
                    );
                }
            }
        }
        assert_eq!(
            c.object_info(&key).await.unwrap(),
            model.object_info(&key).await.unwrap()
        );
    }
    let counts = [
        ("appended", appended),
        ("duplicates of stored batches", dup_stored),
        ("duplicates of batches of the same commit", dup_same_commit),
        ("out of order", out_of_order),
        ("older epoch", fenced_epoch),
        ("field errors", field_errors),
    ];
    println!("exercised: {counts:?}");
    for (what, n) in counts {
        assert!(n >= 20, "too few {what}: {counts:?}");
    }
    c.close().await;
}

/// A commit reads and writes only what it touches, by index probes or by the ctids of rows it
/// locked, never by a sequential scan of a table that grows with the data (partitions, batches,
/// objects, producer states; issue #17: commit latency stays flat as the store grows), whatever
/// the statistics say: here the tables are analyzed, which made migration 5's partitions UPDATE a
/// hash join over a sequential scan of every partition (2,000 here).
/// The commit function is called directly in a transaction of a side connection, whose
/// `pg_stat_xact_user_tables` counts that transaction's scans; it is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_uses_no_sequential_scans() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let c = coordinator(&schema, clock.clone()).await;
    const PARTITIONS: i32 = 2000;
    let topic = create_topic(&c, PARTITIONS).await;
    // Some history: batches, objects and producer states.
    let mut seq: HashMap<i32, i32> = HashMap::new();
    let mut batch = |i: usize| {
        let p = TopicIdPartition::new(topic, (i as i32 * 7) % PARTITIONS);
        if i.is_multiple_of(2) {
            let s = seq.entry(p.partition).or_insert(0);
            let b = idempotent(p, i64::from(p.partition), 0, *s, 2);
            *s += 2;
            b
        } else {
            plain(p, 2)
        }
    };
    for f in 0..5 {
        let batches: Vec<CommitBatch> = (f * 400..(f + 1) * 400).map(&mut batch).collect();
        let r = c
            .commit_file(request(&format!("wal/history-{f}"), batches))
            .await
            .unwrap();
        assert!(r.iter().all(|r| r.error.is_ok() && !r.duplicate));
    }
    let mut conn = side_connection(&schema, "-scans").await;
    // Objects of a running cluster: many (deleted ones, here marked and without batches), so that a
    // lookup by id is an index probe for the planner too.
    sqlx::raw_sql(
        "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
         committed_at, marked_for_deletion_at) SELECT 'wal/old-' || g, 1, 100, 0, '{0}', 0, 0 \
         FROM generate_series(1, 20000) AS g; \
         ANALYZE topics, partitions, objects, batches, producer_state",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    // The next commits, as the coordinator sends them: 200 batches without producer ids, then
    // 200 batches half idempotent (known producers), half plain.
    let plain_req = request(
        "wal/measured-plain",
        (0..200)
            .map(|i| plain(TopicIdPartition::new(topic, (i * 11) % PARTITIONS), 2))
            .collect(),
    );
    let mixed_req = request("wal/measured-mixed", (2000..2200).map(&mut batch).collect());
    let mut tx = conn.begin().await.unwrap();
    for req in [&plain_req, &mixed_req] {
        let topics: Vec<String> = req
            .batches
            .iter()
            .map(|b| b.partition.topic_id.hyphenated().to_string())
            .collect();
        let col = |f: fn(&CommitBatch) -> i64| req.batches.iter().map(f).collect::<Vec<i64>>();
        let appended: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE r_error_code = 0 AND NOT r_duplicate) FROM \
             commit_file($1, 1, $2, '{0}', $3, $4::text[]::uuid[], $5::integer[], $6, $7, \
             $8::integer[], $9, $10, $11, $12::smallint[], $13::integer[], $14::integer[], NULL, \
             600000, $15::smallint[])",
        )
        .bind(&req.object_key)
        .bind(req.object_size as i64)
        .bind(START_MS)
        .bind(&topics)
        .bind(col(|b| i64::from(b.partition.partition)))
        .bind(col(|b| b.byte_offset as i64))
        .bind(col(|b| i64::from(b.byte_size)))
        .bind(col(|b| i64::from(b.record_count)))
        .bind(col(|b| b.base_timestamp))
        .bind(col(|b| b.max_timestamp))
        .bind(col(|b| b.producer_id))
        .bind(col(|b| i64::from(b.producer_epoch)))
        .bind(col(|b| i64::from(b.base_sequence)))
        .bind(col(|b| i64::from(b.last_sequence)))
        .bind(vec![0i64; req.batches.len()])
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(
            appended, 200,
            "every batch of {} is appended",
            req.object_key
        );
    }
    let scans: Vec<(String, i64)> = sqlx::query_as(
        "SELECT relname::text, seq_scan FROM pg_stat_xact_user_tables \
         WHERE schemaname = current_schema() \
         AND relname IN ('partitions', 'objects', 'batches', 'producer_state') ORDER BY relname",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(scans.len(), 4, "{scans:?}");
    assert!(
        scans.iter().all(|(_, n)| *n == 0),
        "sequential scans in two commits: {scans:?}"
    );
    c.close().await;
}

/// Writers, DeleteRecords and retention run concurrently on overlapping partitions: nothing fails
/// or deadlocks, every log stays gap-free from its log start offset, and the bookkeeping (live
/// bytes of objects and partitions, deletion marks) matches the batches that are left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_writers_and_deleters() {
    let Some(schema) = test_schema() else { return };
    const PARTITIONS: i32 = 4;
    let clock = ManualClock::new(START_MS);
    let c = connect(schema.options().with_max_connections(8), clock.clone()).await;
    let topic = fresh_topic_id();
    let config = TopicConfig::default().with_retention_bytes(3_000);
    common::create_topic(c.as_ref(), topic, "churn", PARTITIONS, config).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for w in 0..4i32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut file = 0;
            while Instant::now() < deadline {
                file += 1;
                let batches = (0..3)
                    .map(|k| plain(TopicIdPartition::new(topic, (w + file + k) % PARTITIONS), 2))
                    .collect();
                let r = c
                    .commit_file(request(&format!("wal/w{w}/{file}"), batches))
                    .await
                    .unwrap();
                assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
            }
        }));
    }
    for d in 0..2i32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut round = 0;
            while Instant::now() < deadline {
                round += 1;
                // All partitions, in an order that differs between deleters and rounds.
                let order: Vec<i32> = (0..PARTITIONS)
                    .map(|k| if d == 0 { k } else { PARTITIONS - 1 - k })
                    .map(|k| (k + round) % PARTITIONS)
                    .collect();
                let mut requests = Vec::new();
                for p in order {
                    let tp = TopicIdPartition::new(topic, p);
                    let latest = list_offset(c.as_ref(), tp, LATEST_TIMESTAMP).await;
                    requests.push(diskless_coordinator::DeleteRecordsRequest {
                        partition: tp,
                        offset: latest.offset / 2,
                    });
                }
                let r = c.delete_records(&requests).await.unwrap();
                assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
            }
        }));
    }
    {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                c.enforce_retention(7).await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("a task hung (deadlock?)")
            .expect("a task failed");
    }
    for p in 0..PARTITIONS {
        let tp = TopicIdPartition::new(topic, p);
        let lso = list_offset(c.as_ref(), tp, EARLIEST_TIMESTAMP).await.offset;
        let found = find_from(c.as_ref(), tp, lso).await;
        assert_eq!(found.error, ErrorCode::None);
        let mut next = None;
        for b in &found.batches {
            if let Some(n) = next {
                assert_eq!(b.base_offset, n, "partition {p}: gap at {b:?}");
            } else {
                assert!(
                    b.base_offset <= lso && lso <= b.last_offset,
                    "{b:?} vs {lso}"
                );
            }
            next = Some(b.last_offset + 1);
        }
        assert_eq!(next.unwrap_or(lso), found.high_watermark, "partition {p}");
    }
    let mut conn = side_connection(&schema, "-inspector").await;
    let bad_objects: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM objects o WHERE o.live_bytes <> coalesce((SELECT sum(b.byte_size) \
         FROM batches b WHERE b.object_id = o.object_id), 0) \
         OR (o.live_bytes = 0) <> (o.marked_for_deletion_at IS NOT NULL)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        bad_objects, 0,
        "object live bytes and marks match the batches"
    );
    let bad_partitions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM partitions pa WHERE pa.byte_size <> coalesce((SELECT \
         sum(b.byte_size) FROM batches b WHERE b.partition_id = pa.partition_id), 0)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(bad_partitions, 0, "partition byte sizes match the batches");
    let marked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM objects WHERE marked_for_deletion_at IS NOT NULL")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(marked > 0, "deletions released whole objects");
    assert_eq!(
        c.conflict_retries(),
        0,
        "the fixed lock order avoids deadlocks"
    );
    c.close().await;
}

/// Batches have no foreign keys (migration 9): the writers keep them pointing at live rows. Writers
/// commit plain and idempotent batches to a long-lived topic and to a topic that is deleted and
/// recreated under them, a transactional producer opens transactions in both and ends them with
/// markers (COMMIT and ABORT in turn), while DeleteRecords and retention release objects (and
/// delete markers), a consolidation worker registers tiered segments of the same partitions
/// (issue #15) and a cleaner confirms released objects deleted. No deadlock is detected (no call
/// retried), and afterwards no segment row refers to a missing partition or segment object,
/// segment objects' live bytes and partitions' tiered bytes match their segments, segments and
/// WAL batches stay on their side of the tiered offset, and no batch refers to
/// a missing partition or object, no producer state to a missing partition, object live bytes
/// match their batches, a batch has no object exactly when it is a marker, every aborted
/// transaction's ABORT marker is still there (aborted transactions go with their marker and their
/// topic), and partition sizes match their batches. The check itself is shown to see a dangling
/// row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_no_dangling_rows() {
    let Some(schema) = test_schema() else { return };
    const PARTITIONS: i32 = 4;
    let clock = ManualClock::new(START_MS);
    let c = connect(schema.options().with_max_connections(8), clock.clone()).await;
    let stable = fresh_topic_id();
    let config = TopicConfig::default().with_retention_bytes(2_000);
    common::create_topic(c.as_ref(), stable, "stable", PARTITIONS, config).await;
    let churn = Arc::new(std::sync::Mutex::new(
        create_topic(c.as_ref(), PARTITIONS).await,
    ));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tasks: Vec<JoinHandle<u64>> = Vec::new();
    for w in 0..3i32 {
        let (c, churn) = (c.clone(), churn.clone());
        tasks.push(tokio::spawn(async move {
            let mut seqs: HashMap<TopicIdPartition, i32> = HashMap::new();
            let mut file = 0u64;
            while Instant::now() < deadline {
                file += 1;
                let doomed = *churn.lock().unwrap();
                let batches: Vec<CommitBatch> = (0..4i32)
                    .map(|k| {
                        let topic = if k % 2 == 0 { stable } else { doomed };
                        let p = TopicIdPartition::new(topic, (w + k + file as i32) % PARTITIONS);
                        if k < 2 {
                            plain(p, 2)
                        } else {
                            let seq = seqs.get(&p).copied().unwrap_or(0);
                            idempotent(p, i64::from(w), 0, seq, 2)
                        }
                    })
                    .collect();
                let r = c
                    .commit_file(request(&format!("wal/d{w}/{file}"), batches.clone()))
                    .await
                    .unwrap();
                for (b, r) in batches.iter().zip(&r) {
                    match r.error {
                        ErrorCode::None => {
                            if b.producer_id >= 0 {
                                seqs.insert(b.partition, b.last_sequence + 1);
                            }
                        }
                        ErrorCode::UnknownTopicOrPartition => {
                            assert_eq!(b.partition.topic_id, doomed, "{r:?}");
                        }
                        e => panic!("batch {b:?}: {e:?}"),
                    }
                }
            }
            file
        }));
    }
    {
        let (c, churn) = (c.clone(), churn.clone());
        tasks.push(tokio::spawn(async move {
            let pid = 100;
            let mut seqs: HashMap<TopicIdPartition, i32> = HashMap::new();
            let (mut round, mut aborts) = (0i64, 0u64);
            while Instant::now() < deadline {
                round += 1;
                let doomed = *churn.lock().unwrap();
                let partition = (round % i64::from(PARTITIONS)) as i32;
                let ps = [
                    TopicIdPartition::new(stable, partition),
                    TopicIdPartition::new(doomed, partition),
                ];
                let batches: Vec<CommitBatch> = ps
                    .iter()
                    .map(|&p| CommitBatch {
                        transactional: true,
                        txn_seq: Some(round),
                        ..idempotent(p, pid, 0, seqs.get(&p).copied().unwrap_or(0), 2)
                    })
                    .collect();
                let r = c
                    .commit_file(request(&format!("wal/txn/{round}"), batches.clone()))
                    .await
                    .unwrap();
                for (b, r) in batches.iter().zip(&r) {
                    match r.error {
                        ErrorCode::None => {
                            seqs.insert(b.partition, b.last_sequence + 1);
                        }
                        ErrorCode::UnknownTopicOrPartition => {
                            assert_eq!(b.partition.topic_id, doomed, "{r:?}");
                        }
                        e => panic!("batch {b:?}: {e:?}"),
                    }
                }
                let commit = round % 2 == 0;
                let markers: Vec<TxnMarker> = ps
                    .iter()
                    .map(|&p| TxnMarker {
                        partition: p,
                        producer_id: pid,
                        producer_epoch: 0,
                        coordinator_epoch: 0,
                        commit,
                        txn_seq: Some(round),
                    })
                    .collect();
                let written = c.write_txn_markers(&markers).await.unwrap();
                for (m, r) in markers.iter().zip(&written) {
                    match r.error {
                        ErrorCode::None => aborts += u64::from(!commit),
                        ErrorCode::UnknownTopicOrPartition => {
                            assert_eq!(m.partition.topic_id, doomed, "{r:?}");
                        }
                        e => panic!("marker {m:?}: {e:?}"),
                    }
                }
            }
            aborts
        }));
    }
    {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut rounds = 0;
            while Instant::now() < deadline {
                rounds += 1;
                let requests: Vec<_> = (0..PARTITIONS)
                    .map(|p| diskless_coordinator::DeleteRecordsRequest {
                        partition: TopicIdPartition::new(stable, p),
                        offset: 4 * rounds,
                    })
                    .collect();
                c.delete_records(&requests).await.unwrap();
                c.enforce_retention(5).await.unwrap();
            }
            rounds as u64
        }));
    }
    {
        // A consolidation worker: candidates, plans and registrations of segments of the same
        // partitions, against the commits, markers, retention, DeleteRecords, topic deletion and
        // the cleaner above.
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let (mut registered, mut n) = (0u64, 0u64);
            // Every first WAL batch is older than segment.ms at this time.
            let later = START_MS + 8 * 24 * 60 * 60 * 1000;
            while Instant::now() < deadline {
                let candidates = c.tiering_candidates(later, 0, None, 100).await.unwrap();
                for candidate in candidates {
                    let plan = c
                        .segment_plan(&SegmentPlanRequest {
                            partition: candidate.partition,
                            max_bytes: u64::MAX,
                            max_batches: 3,
                            committed_before_ms: i64::MAX,
                        })
                        .await
                        .unwrap();
                    if plan.batches.is_empty() {
                        continue;
                    }
                    n += 1;
                    // Keys without a UUID v7 time: the manual clock is far behind the server's.
                    let key = format!("tiered/d/{n}");
                    let request = segment_request(candidate.partition, &key, &plan.batches);
                    match c.register_segment(request).await.unwrap() {
                        RegisterSegmentOutcome::Registered { .. } => registered += 1,
                        RegisterSegmentOutcome::Stale
                        | RegisterSegmentOutcome::UnknownPartition => {}
                        other => panic!("registering {key}: {other:?}"),
                    }
                }
            }
            registered
        }));
    }
    {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut confirmed = 0;
            while Instant::now() < deadline {
                let gone: Vec<String> = c
                    .objects_to_delete(i64::MAX, 50)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|o| o.object_key)
                    .collect();
                c.confirm_deleted(&gone).await.unwrap();
                confirmed += gone.len() as u64;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            confirmed
        }));
    }
    {
        let (c, churn) = (c.clone(), churn.clone());
        tasks.push(tokio::spawn(async move {
            let mut deleted = 0;
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let old = *churn.lock().unwrap();
                let new = create_topic(c.as_ref(), PARTITIONS).await;
                *churn.lock().unwrap() = new;
                c.delete_topic(old).await.unwrap();
                deleted += 1;
            }
            deleted
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("a task hung (deadlock?)")
                .expect("a task failed"),
        );
    }
    assert!(
        counts.iter().all(|n| *n > 0),
        "every task did something: {counts:?}"
    );
    // The writers lock partitions, then objects, in one global order: no deadlock was detected
    // (PostgreSQL would have broken it and the call been retried).
    assert_eq!(c.conflict_retries(), 0);
    let mut conn = side_connection(&schema, "-inspector").await;
    const DANGLING_TIERED: &str = "SELECT \
         (SELECT count(*) FROM tiered_segments s WHERE NOT EXISTS \
             (SELECT 1 FROM partitions pa WHERE pa.partition_id = s.partition_id)), \
         (SELECT count(*) FROM tiered_segments s WHERE NOT EXISTS \
             (SELECT 1 FROM objects o WHERE o.object_id = s.object_id AND o.kind = 1)), \
         (SELECT count(*) FROM objects o WHERE o.kind = 1 AND o.live_bytes <> coalesce((SELECT \
             sum(s.log_size) FROM tiered_segments s WHERE s.object_id = o.object_id), 0)), \
         (SELECT count(*) FROM partitions pa WHERE pa.tiered_bytes <> coalesce((SELECT \
             sum(s.log_size) FROM tiered_segments s WHERE s.partition_id = pa.partition_id), 0)), \
         (SELECT count(*) FROM batches b JOIN partitions pa ON pa.partition_id = b.partition_id \
             WHERE b.base_offset < pa.tiered_next_offset), \
         (SELECT count(*) FROM tiered_segments s JOIN partitions pa \
             ON pa.partition_id = s.partition_id WHERE s.end_offset >= pa.tiered_next_offset)";
    let dangling: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(DANGLING_TIERED)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        dangling,
        (0, 0, 0, 0, 0, 0),
        "(segments without partition, segments without their segment object, segment objects whose live bytes disagree with their segment, partitions whose tiered bytes disagree with their segments, WAL batches below the tiered offset, segments at or above it)"
    );
    const DANGLING: &str = "SELECT \
         (SELECT count(*) FROM batches b WHERE NOT EXISTS \
             (SELECT 1 FROM partitions pa WHERE pa.partition_id = b.partition_id)), \
         (SELECT count(*) FROM batches b WHERE b.object_id IS NOT NULL AND NOT EXISTS \
             (SELECT 1 FROM objects o WHERE o.object_id = b.object_id)), \
         (SELECT count(*) FROM producer_state s WHERE NOT EXISTS \
             (SELECT 1 FROM partitions pa WHERE pa.partition_id = s.partition_id)), \
         (SELECT count(*) FROM objects o WHERE (o.kind = 0 AND o.live_bytes <> coalesce((SELECT \
             sum(b.byte_size) FROM batches b WHERE b.object_id = o.object_id), 0)) \
             OR (o.live_bytes = 0) <> (o.marked_for_deletion_at IS NOT NULL)), \
         (SELECT count(*) FROM batches b WHERE (b.object_id IS NULL) <> (b.control_type <> -1)), \
         (SELECT count(*) FROM aborted_txns a WHERE NOT EXISTS (SELECT 1 FROM batches b \
             WHERE b.partition_id = a.partition_id AND b.last_offset = a.last_offset \
             AND b.control_type = 0 AND b.producer_id = a.producer_id)), \
         (SELECT count(*) FROM partitions pa WHERE pa.byte_size <> coalesce((SELECT \
             sum(b.byte_size) FROM batches b WHERE b.partition_id = pa.partition_id), 0) \
             + pa.tiered_bytes)";
    let dangling: (i64, i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(DANGLING).fetch_one(&mut conn).await.unwrap();
    assert_eq!(
        dangling,
        (0, 0, 0, 0, 0, 0, 0),
        "(batches without partition, batches without object, producer states without partition, objects whose live bytes or mark disagree with their batches, markers with an object or data batches without, aborted transactions without their marker, partitions whose size disagrees with their batches)"
    );
    let batches: i64 = sqlx::query_scalar("SELECT count(*) FROM batches")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(batches > 0);
    // The check sees a batch of a deleted object and partition.
    sqlx::query(
        "INSERT INTO batches SELECT -1, b.last_offset, b.base_offset, -1, b.byte_offset, \
         b.byte_size, b.base_timestamp, b.max_timestamp, b.timestamp_type, b.log_append_time, \
         b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence, \
         b.max_timestamp_so_far FROM batches b LIMIT 1",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    // And an aborted transaction without its marker.
    sqlx::query(
        "INSERT INTO aborted_txns SELECT partition_id, -5, -6, 1, -4 FROM partitions LIMIT 1",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let dangling: (i64, i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(DANGLING).fetch_one(&mut conn).await.unwrap();
    assert_eq!((dangling.0, dangling.1, dangling.5), (1, 1, 1));
    // And a segment row of a deleted partition and object.
    sqlx::query(
        "INSERT INTO tiered_segments VALUES (-1, 0, 0, -1, 10, 0, 0, 0, 0, 0, 1, -1, 0, -1, -1, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let dangling: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(DANGLING_TIERED)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!((dangling.0, dangling.1), (1, 1));
    c.close().await;
}

/// A statement that outlives statement_timeout is cancelled: the call fails as unavailable
/// (retriable: nothing was applied), and the retry succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statement_timeout_is_unavailable() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let options = schema
        .options()
        .with_statement_timeout(Duration::from_millis(300));
    let c = connect(options, clock).await;
    let topic = create_topic(c.as_ref(), 1).await;
    let p = TopicIdPartition::new(topic, 0);
    let locks = PartitionLocks::take(&schema).await;
    let r = c
        .commit_file(request("wal/slow", vec![idempotent(p, 3, 0, 0, 1)]))
        .await;
    assert!(matches!(r, Err(CoordinatorError::Unavailable(_))), "{r:?}");
    assert!(r.unwrap_err().is_retriable());
    locks.release().await;
    assert_eq!(c.object_info("wal/slow").await.unwrap(), None);
    let r = c
        .commit_file(request("wal/slow", vec![idempotent(p, 3, 0, 0, 1)]))
        .await
        .unwrap();
    assert_eq!(
        (r[0].error, r[0].base_offset, r[0].duplicate),
        (ErrorCode::None, 0, false)
    );
    c.close().await;
}

/// Retention over partitions larger than one page of the retention scan, with and without a cap,
/// agrees with the reference model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_of_long_logs_matches_model() {
    let Some(schema) = test_schema() else { return };
    let (clock, c, model) = with_model(&schema).await;
    let both: [&dyn BatchCoordinator; 2] = [c.as_ref(), &model];
    let topic = fresh_topic_id();
    let config = TopicConfig::default()
        .with_retention_bytes(1_000)
        .with_retention_ms(60_000);
    for x in both {
        common::create_topic(x, topic, "long", 2, config.clone()).await;
    }
    for file in 0..6 {
        let batches: Vec<CommitBatch> = (0..500)
            .map(|i| {
                let mut b = plain(TopicIdPartition::new(topic, i % 2), 1);
                b.max_timestamp = START_MS + i64::from(file * 500 + i);
                b
            })
            .collect();
        let req = request(&format!("wal/long/{file}"), batches);
        let r = c.commit_file(req.clone()).await.unwrap();
        assert_eq!(r, model.commit_file(req).await.unwrap());
    }
    // Time makes the first ~1200 batches expire, size the rest beyond 10 per partition.
    clock.advance(61_200);
    for cap in [1_500, 1, 0, u32::MAX, 10] {
        let real = c.enforce_retention(cap).await.unwrap();
        let expected = model.enforce_retention(cap).await.unwrap();
        assert_eq!(real, expected, "cap {cap}");
        for p in 0..2 {
            let tp = TopicIdPartition::new(topic, p);
            let lso = list_offset(&model, tp, EARLIEST_TIMESTAMP).await.offset;
            assert_eq!(
                list_offset(c.as_ref(), tp, EARLIEST_TIMESTAMP).await.offset,
                lso
            );
            assert_eq!(
                find_from(c.as_ref(), tp, lso).await,
                find_from(&model, tp, lso).await
            );
        }
    }
    for file in 0..6 {
        let key = format!("wal/long/{file}");
        assert_eq!(
            c.object_info(&key).await.unwrap(),
            model.object_info(&key).await.unwrap()
        );
    }
    c.close().await;
}

// -------------------------------------------------------------------------------------------------
// Read replicas (issue #12 item 7)

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let (base, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let path = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    format!("{}/{database}{query}", &base[..path])
}

/// A fresh database on the server, dropped (with its connections) when the guard is dropped.
struct Database {
    admin_url: String,
    name: String,
}

impl Database {
    async fn new(url: &str) -> Database {
        let name = unique_name("diskless_test_db_");
        let mut conn = PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        Database {
            admin_url: url.to_string(),
            name,
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = block_on_own_thread(async move {
            let mut conn = PgConnection::connect(&url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await
        });
        report_cleanup(&format!("database {}", self.name), dropped);
    }
}

/// Sets the primary heartbeat held by the (frozen) replica to the server's time plus `offset_ms`.
async fn set_replica_heartbeat(replica_url: &str, schema: &str, offset_ms: i64) {
    let mut conn = PgConnection::connect(replica_url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{schema}\".replica_heartbeat \
         SET at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1"
    )))
    .bind(offset_ms)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
}

/// A primary (the test's schema) and a "replica" that is a frozen copy of it: the same schema name
/// in a database of its own, given the same first operations and then left behind on purpose.
/// Both hold topic `topic` with 5 records (object `wal/a`); only the primary has 3 more (`wal/b`,
/// max timestamp START_MS + 100) and topic `fresh` (object `wal/c`).
struct StaleReplica {
    schema: Schema,
    _db: Database,
    replica_url: String,
    topic: Uuid,
    fresh: Uuid,
}

impl StaleReplica {
    async fn new(url: &str) -> StaleReplica {
        let db = Database::new(url).await;
        let schema = Schema::new(url);
        let replica_url = with_database(url, &db.name);
        let clock = ManualClock::new(START_MS);
        let frozen_options = PostgresOptions::new(replica_url.clone())
            .with_schema(schema.name.clone())
            .with_max_connections(2)
            .with_read_max_connections(1)
            .with_application_name(format!("{}-frozen", schema.name));
        let frozen = connect(frozen_options, clock.clone()).await;
        let primary = coordinator(&schema, clock.clone()).await;
        let topic = fresh_topic_id();
        let p = TopicIdPartition::new(topic, 0);
        for c in [&frozen, &primary] {
            common::create_topic(c.as_ref(), topic, "replicated", 1, TopicConfig::default()).await;
            c.commit_file(request("wal/a", vec![plain(p, 5)]))
                .await
                .unwrap();
        }
        frozen.close().await;
        let mut b = plain(p, 3);
        b.max_timestamp = START_MS + 100;
        primary
            .commit_file(request("wal/b", vec![b]))
            .await
            .unwrap();
        let fresh = create_topic(primary.as_ref(), 1).await;
        primary
            .commit_file(request(
                "wal/c",
                vec![plain(TopicIdPartition::new(fresh, 0), 2)],
            ))
            .await
            .unwrap();
        primary.close().await;
        StaleReplica {
            schema,
            _db: db,
            replica_url,
            topic,
            fresh,
        }
    }

    async fn reader(&self, options: PostgresOptions) -> Arc<PostgresCoordinator> {
        let options = options.with_read_url(self.replica_url.clone());
        connect(options, ManualClock::new(START_MS)).await
    }
}

fn keys(r: &diskless_coordinator::FindBatchesResponse) -> Vec<&str> {
    r.batches.iter().map(|b| b.object_key.as_str()).collect()
}

/// A replica within the lag bound serves reads, but never answers OFFSET_OUT_OF_RANGE (or unknown
/// topic, or "no such timestamp") on its own: those partitions are asked again on the primary, so
/// a consumer whose position came from a fresher view than the replica's does not reset it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_replica_rechecks_out_of_range_on_primary() {
    let Some(url) = pg_url() else { return };
    let setup = StaleReplica::new(&url).await;
    // The replica claims to be in sync (its heartbeat is current): reads may use it.
    set_replica_heartbeat(&setup.replica_url, &setup.schema.name, 3_600_000).await;
    let c = setup.reader(setup.schema.options()).await;
    let p = TopicIdPartition::new(setup.topic, 0);

    // In range on the replica: answered there (stale within the lag bound is allowed).
    let r = try_find_from(c.as_ref(), p, 0).await.unwrap();
    assert_eq!(
        (r.error, r.high_watermark, keys(&r)),
        (ErrorCode::None, 5, vec!["wal/a"])
    );
    // At the replica's high watermark: nothing yet, as a follower answers (KIP-392).
    let r = try_find_from(c.as_ref(), p, 5).await.unwrap();
    assert_eq!(
        (r.error, r.high_watermark, keys(&r)),
        (ErrorCode::None, 5, vec![])
    );
    // Beyond the replica's high watermark, within the primary's: the primary answers.
    let r = try_find_from(c.as_ref(), p, 6).await.unwrap();
    assert_eq!(
        (r.error, r.high_watermark, keys(&r)),
        (ErrorCode::None, 8, vec!["wal/b"])
    );
    let r = try_find_from(c.as_ref(), p, 8).await.unwrap();
    assert_eq!(
        (r.error, r.high_watermark, keys(&r)),
        (ErrorCode::None, 8, vec![])
    );
    // A topic the replica does not hold yet.
    let r = try_find_from(c.as_ref(), TopicIdPartition::new(setup.fresh, 0), 0)
        .await
        .unwrap();
    assert_eq!((r.error, keys(&r)), (ErrorCode::None, vec!["wal/c"]));
    // Out of range on the primary too: now it is the answer.
    let r = try_find_from(c.as_ref(), p, 9).await.unwrap();
    assert_eq!(r.error, ErrorCode::OffsetOutOfRange);
    // One call mixing both: each partition from its source, in request order, one byte budget.
    let r = c
        .find_batches(
            &[
                FindBatchesRequest {
                    partition: p,
                    offset: 6,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                },
                FindBatchesRequest {
                    partition: TopicIdPartition::new(setup.topic, 7),
                    offset: 0,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                },
                FindBatchesRequest {
                    partition: p,
                    offset: 2,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                },
            ],
            100,
        )
        .await
        .unwrap();
    assert_eq!((r[0].error, keys(&r[0])), (ErrorCode::None, vec!["wal/b"]));
    assert_eq!(r[1].error, ErrorCode::UnknownTopicOrPartition);
    // The replica's first batch of a partition is always returned, whatever the budget left.
    assert_eq!(
        (r[2].error, r[2].high_watermark, keys(&r[2])),
        (ErrorCode::None, 5, vec!["wal/a"])
    );

    // ListOffsets: an unknown partition and a timestamp only the primary holds are asked again.
    let r = c
        .list_offsets(&[
            ListOffsetsRequest {
                partition: TopicIdPartition::new(setup.fresh, 0),
                timestamp: LATEST_TIMESTAMP,
                isolation: Default::default(),
            },
            ListOffsetsRequest {
                partition: p,
                timestamp: START_MS + 50,
                isolation: Default::default(),
            },
            ListOffsetsRequest {
                partition: p,
                timestamp: START_MS + 500,
                isolation: Default::default(),
            },
        ])
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].offset), (ErrorCode::None, 2));
    assert_eq!(
        (r[1].error, r[1].offset, r[1].timestamp),
        (ErrorCode::None, 5, START_MS + 100)
    );
    assert_eq!((r[2].error, r[2].offset), (ErrorCode::None, -1));
    let stats = c.stats();
    assert!(stats.replica_reads >= 7, "{stats:?}");
    assert_eq!(stats.replica_bypassed, 0, "{stats:?}");
    assert!(stats.primary_rechecks >= 6, "{stats:?}");
    c.close().await;
}

/// A replica lagging more than `max_replica_lag` is not read at all: reads go to the primary (so
/// a fetch never gets the coordinates of an object the primary released and the cleaner may have
/// deleted), and fail as unavailable (retriable) when the primary cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lagging_replica_is_not_read() {
    let Some(url) = pg_url() else { return };
    let setup = StaleReplica::new(&url).await;
    let p = TopicIdPartition::new(setup.topic, 0);
    // The replica's newest heartbeat is a minute old: beyond the default 30 s bound.
    set_replica_heartbeat(&setup.replica_url, &setup.schema.name, -60_000).await;
    let c = setup.reader(setup.schema.options()).await;
    // On the primary, DeleteRecords releases wal/a; the replica still shows its batch.
    let r = c
        .delete_records(&[diskless_coordinator::DeleteRecordsRequest {
            partition: p,
            offset: 5,
        }])
        .await
        .unwrap();
    assert_eq!(r[0].low_watermark, 5);
    assert!(
        c.object_info("wal/a")
            .await
            .unwrap()
            .unwrap()
            .marked_for_deletion_at
            .is_some()
    );
    let r = try_find_from(c.as_ref(), p, 0).await.unwrap();
    assert_eq!(
        r.error,
        ErrorCode::OffsetOutOfRange,
        "the lagging replica's coordinates of wal/a were served: {r:?}"
    );
    let r = try_find_from(c.as_ref(), p, 5).await.unwrap();
    assert_eq!((r.high_watermark, keys(&r)), (8, vec!["wal/b"]));
    let earliest = list_offset(c.as_ref(), p, EARLIEST_TIMESTAMP).await;
    assert_eq!(earliest.offset, 5);
    assert_eq!(c.list_topics().await.unwrap().len(), 2);
    let stats = c.stats();
    assert_eq!(stats.replica_reads, 0, "{stats:?}");
    assert!(stats.replica_bypassed >= 4, "{stats:?}");
    // A tighter bound than the replica's lag is honoured too.
    set_replica_heartbeat(&setup.replica_url, &setup.schema.name, -3_000).await;
    let tight = setup
        .reader(
            setup
                .schema
                .options()
                .with_max_replica_lag(Duration::from_secs(1)),
        )
        .await;
    assert_eq!(
        try_find_from(tight.as_ref(), p, 0).await.unwrap().error,
        ErrorCode::OffsetOutOfRange
    );
    assert_eq!(tight.stats().replica_reads, 0);
    tight.close().await;
    c.close().await;

    // A reader whose only primary connection is stuck: with the replica lagging, reads fail as
    // unavailable; they are never answered from the lagging replica.
    set_replica_heartbeat(&setup.replica_url, &setup.schema.name, -60_000).await;
    let stuck = setup
        .reader(
            setup
                .schema
                .options()
                .with_max_connections(1)
                .with_acquire_timeout(Duration::from_secs(1)),
        )
        .await;
    let locks = PartitionLocks::take(&setup.schema).await;
    let blocked = spawn_commit(&stuck, request("wal/d", vec![plain(p, 1)]));
    let mut inspector = side_connection(&setup.schema, "-inspector").await;
    blocked_backend(&mut inspector, &setup.schema.name).await;
    let r = try_find_from(stuck.as_ref(), p, 0).await;
    assert!(
        matches!(&r, Err(e @ CoordinatorError::Unavailable(_)) if e.is_retriable()),
        "{r:?}"
    );
    // Once the replica is within the bound again it serves what it holds in range...
    set_replica_heartbeat(&setup.replica_url, &setup.schema.name, 0).await;
    let r = try_find_from(stuck.as_ref(), p, 0).await.unwrap();
    assert_eq!(keys(&r), vec!["wal/a"]);
    // ...but what it would answer as out of range still needs the primary.
    let r = try_find_from(stuck.as_ref(), p, 6).await;
    assert!(matches!(r, Err(CoordinatorError::Unavailable(_))), "{r:?}");
    locks.release().await;
    blocked.await.unwrap().unwrap();
    stuck.close().await;
}

// -------------------------------------------------------------------------------------------------
// Retention budget (issue #12 item 9) and the timestamp index (item 10)

/// A retention pass stops walking partitions as soon as its budget is spent (it examines and
/// locks no further partition inside its transaction), pages through many candidate partitions,
/// and reports `more` exactly when it spent its budget; every report matches the model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_stops_at_its_budget() {
    let Some(schema) = test_schema() else { return };
    let (clock, c, model) = with_model(&schema).await;
    let both: [&dyn BatchCoordinator; 2] = [c.as_ref(), &model];
    let few = Uuid::from_u128(1);
    let many = Uuid::from_u128(2);
    let config = TopicConfig::default().with_retention_ms(1_000);
    for x in both {
        for (topic, partitions) in [(few, 4), (many, 70)] {
            let name = format!("t-{topic}");
            common::create_topic(x, topic, &name, partitions, config.clone()).await;
        }
        let mut batches = Vec::new();
        for p in 0..4 {
            for _ in 0..3 {
                batches.push(plain(TopicIdPartition::new(few, p), 1));
            }
        }
        for p in 0..70 {
            batches.push(plain(TopicIdPartition::new(many, p), 1));
        }
        x.commit_file(request("wal/retention", batches))
            .await
            .unwrap();
    }
    clock.advance(2_000);
    // (budget, partitions examined): the first pass stops inside the first partition.
    for (budget, examined) in [(2, 1), (4, 2), (6, 2), (40, 40), (1_000, 30), (1_000, 0)] {
        let before = c.stats().retention_partitions_examined;
        let real = c.enforce_retention(budget).await.unwrap();
        let expected = model.enforce_retention(budget).await.unwrap();
        assert_eq!(real, expected, "budget {budget}");
        assert_eq!(
            real.more,
            real.batches_deleted == u64::from(budget),
            "budget {budget}"
        );
        assert_eq!(
            c.stats().retention_partitions_examined - before,
            examined,
            "budget {budget}: partitions examined"
        );
    }
    c.close().await;
}

/// A partition over `retention.bytes` whose first batch cannot go (removing it would leave less than
/// the limit) is not a candidate: a pass with nothing due examines no partition (it used to read a
/// page of batches of every such partition, every pass).
#[tokio::test]
async fn postgres_retention_skips_partitions_size_cannot_trim() {
    let Some(schema) = test_schema() else { return };
    let (_, c, model) = with_model(&schema).await;
    let both: [&dyn BatchCoordinator; 2] = [c.as_ref(), &model];
    let topic = Uuid::from_u128(3);
    // Each partition holds 2 batches of 100 bytes: 200 > 150, but 200 - 100 < 150.
    let config = TopicConfig::default()
        .with_retention_ms(-1)
        .with_retention_bytes(150);
    for x in both {
        common::create_topic(x, topic, "size-bound", 20, config.clone()).await;
        let mut batches = Vec::new();
        for p in 0..20 {
            for _ in 0..2 {
                batches.push(plain(TopicIdPartition::new(topic, p), 1));
            }
        }
        x.commit_file(request("wal/size-bound", batches))
            .await
            .unwrap();
    }
    let before = c.stats().retention_partitions_examined;
    let real = c.enforce_retention(1_000).await.unwrap();
    assert_eq!(real, model.enforce_retention(1_000).await.unwrap());
    assert_eq!(real.batches_deleted, 0);
    assert_eq!(
        c.stats().retention_partitions_examined - before,
        0,
        "no partition can be trimmed by size"
    );
    c.close().await;
}

/// ListOffsets by timestamp and MAX_TIMESTAMP answer as the model does, also when a deleted batch
/// had raised the running max and for batches committed before the running max existed; on a long
/// partition the lookups are index probes (checked with EXPLAIN ANALYZE: the indexes are used, no
/// sequential scan of batches, few buffers touched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_list_offsets_by_timestamp_uses_indexes() {
    let Some(schema) = test_schema() else { return };
    let (_, c, model) = with_model(&schema).await;
    let both: [&dyn BatchCoordinator; 2] = [c.as_ref(), &model];
    let topic = fresh_topic_id();
    let long = TopicIdPartition::new(topic, 0);
    let odd = TopicIdPartition::new(topic, 1);
    let ts_of = |b: &mut CommitBatch, ts: i64| {
        b.base_timestamp = ts - 5;
        b.max_timestamp = ts;
    };
    for x in both {
        common::create_topic(x, topic, "by-time", 2, TopicConfig::default()).await;
        // The odd partition: file 0 will lose its running max (as if committed before migration
        // 3); a batch with a far larger timestamp is deleted by DeleteRecords.
        for (file, stamps) in [
            (0, vec![100i64, 900, 150]),
            (1, vec![120, 5_000, 200, 300]),
            (2, vec![6_000, 400, 250, -1]),
        ] {
            let batches = stamps
                .into_iter()
                .map(|ts| {
                    let mut b = plain(odd, 2);
                    ts_of(&mut b, START_MS + ts);
                    if ts < 0 {
                        b.base_timestamp = -1;
                        b.max_timestamp = -1;
                    }
                    b
                })
                .collect();
            x.commit_file(request(&format!("wal/odd/{file}"), batches))
                .await
                .unwrap();
        }
    }
    // File 0's batches as the previous schema version left them: no running max.
    let mut conn = side_connection(&schema, "-inspector").await;
    sqlx::query(
        "UPDATE batches SET max_timestamp_so_far = NULL WHERE object_id = \
         (SELECT object_id FROM objects WHERE object_key = 'wal/odd/0')",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let targets: Vec<i64> = [
        0i64, 100, 101, 150, 200, 201, 250, 260, 300, 301, 400, 401, 900, 901,
    ]
    .into_iter()
    .chain([4_999, 5_000, 5_001, 6_000, 6_001])
    .map(|t| START_MS + t)
    .chain([0, MAX_TIMESTAMP_REQ])
    .collect();
    let check = |label: &'static str| {
        let targets = targets.clone();
        let c = c.clone();
        let model = &model;
        async move {
            let requests: Vec<ListOffsetsRequest> = targets
                .iter()
                .map(|&timestamp| ListOffsetsRequest {
                    partition: odd,
                    timestamp,
                    isolation: Default::default(),
                })
                .collect();
            assert_eq!(
                c.list_offsets(&requests).await.unwrap(),
                model.list_offsets(&requests).await.unwrap(),
                "{label}"
            );
        }
    };
    check("all live").await;
    // DeleteRecords below offset 10 deletes file 0 (offsets 0..5) and file 1's first two batches
    // (120 and 5 000): the live batches after them keep a running max of 5 000 or more.
    for x in both {
        x.delete_records(&[diskless_coordinator::DeleteRecordsRequest {
            partition: odd,
            offset: 10,
        }])
        .await
        .unwrap();
    }
    check("after a deleted batch raised the running max").await;

    // The long partition: 20 000 batches with growing timestamps.
    for file in 0..10 {
        let batches = (0..2_000)
            .map(|i| {
                let mut b = plain(long, 1);
                ts_of(&mut b, START_MS + (file * 2_000 + i) * 10);
                b
            })
            .collect();
        c.commit_file(request(&format!("wal/long/{file}"), batches))
            .await
            .unwrap();
    }
    sqlx::raw_sql("ANALYZE batches")
        .execute(&mut conn)
        .await
        .unwrap();
    let requests = [
        ListOffsetsRequest {
            partition: long,
            timestamp: START_MS + 123_455,
            isolation: Default::default(),
        },
        ListOffsetsRequest {
            partition: long,
            timestamp: MAX_TIMESTAMP_REQ,
            isolation: Default::default(),
        },
    ];
    let r = c.list_offsets(&requests).await.unwrap();
    assert_eq!((r[0].offset, r[0].timestamp), (12_346, START_MS + 123_460));
    assert_eq!((r[1].offset, r[1].timestamp), (19_999, START_MS + 199_990));
    let plan = c.explain_list_offsets(&requests).await.unwrap();
    assert!(plan.contains("batches_running_max"), "{plan}");
    assert!(plan.contains("batches_effective_ts"), "{plan}");
    assert!(!plan.contains("Seq Scan on batches"), "{plan}");
    // Each index scan of batches stops at its first entry (only the rows of the answer are read;
    // sorts in the plan order the at most three candidates of a lookup).
    for line in plan
        .lines()
        .filter(|l| l.contains("Index Scan") && l.contains("on batches"))
    {
        assert!(
            line.contains("(actual rows=0 ")
                || line.contains("(actual rows=1 ")
                || line.contains("never executed"),
            "{line}\n{plan}"
        );
    }
    assert!(!plan.contains("Rows Removed by Filter"), "{plan}");
    // The whole statement, both lookups: a handful of index pages, not the partition's.
    let top_buffers: u64 = plan
        .lines()
        .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no buffer count in {plan}"));
    assert!(top_buffers < 60, "{top_buffers} buffers: {plan}");
    c.close().await;
}

const MAX_TIMESTAMP_REQ: i64 = diskless_coordinator::MAX_TIMESTAMP;

// -------------------------------------------------------------------------------------------------
// The commit point (issue #12 item 1): deadline and fences inside the commit function

/// The deadline is checked by the server, against its own clock, once the commit holds its locks:
/// a commit that passed every check on arrival but waited on a partition lock past its deadline
/// is refused with nothing applied; the coordinator's injected clock plays no part; the previous
/// version's commit_file signature passes the same checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_deadline_is_checked_after_the_locks() {
    let Some(schema) = test_schema() else { return };
    // The injected clock is years behind the server's: the deadline does not read it.
    let clock = ManualClock::new(START_MS);
    let options = schema
        .options()
        .with_max_commit_age(Duration::from_millis(1_500));
    let c = connect(options, clock.clone()).await;
    let topic = create_topic(&c, 1).await;
    let p = TopicIdPartition::new(topic, 0);
    let fresh = key_aged(0);
    let r = c
        .commit_file(request(&fresh, vec![plain(p, 1)]))
        .await
        .unwrap();
    assert_eq!(r[0].base_offset, 0);
    let r = c
        .commit_file(request(&key_aged(60_000), vec![plain(p, 1)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "{r:?}"
    );
    // Keys without a v7 time are never refused.
    c.commit_file(request("wal/plain-key", vec![plain(p, 1)]))
        .await
        .unwrap();

    // A commit of a fresh key that then waits on the partition's lock for longer than the
    // deadline: refused when it gets the lock.
    let locks = PartitionLocks::take(&schema).await;
    let late = key_aged(0);
    let blocked = spawn_commit(&c, request(&late, vec![idempotent(p, 9, 0, 0, 1)]));
    let mut inspector = side_connection(&schema, "-inspector").await;
    blocked_backend(&mut inspector, &schema.name).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    locks.release().await;
    let r = blocked.await.unwrap();
    match r {
        Err(e @ CoordinatorError::DeadlineExceeded(_)) => assert!(e.certainly_not_applied()),
        other => panic!("expected DeadlineExceeded after the lock wait, got {other:?}"),
    }
    assert_eq!(c.object_info(&late).await.unwrap(), None);
    assert_eq!(c.producer_state(p, 9).await.unwrap(), None);
    assert_eq!(find_from(c.as_ref(), p, 0).await.high_watermark, 2);

    // The previous version's signature (a broker not yet upgraded): the same commit point, with
    // the default 10 minute deadline and the key's time parsed by the server.
    let old_call = async |key: &str| old_signature_commit(&schema, topic, key).await;
    assert_eq!(old_call(&key_aged(0)).await.unwrap(), vec![0]);
    let e = old_call(&key_aged(11 * 60_000)).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("DL001"));
    let orphan = key_aged(0);
    assert_eq!(
        c.fence_orphans(std::slice::from_ref(&orphan))
            .await
            .unwrap(),
        vec![orphan.clone()]
    );
    let e = old_call(&orphan).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("DL002"));
    c.close().await;
}

/// A fence and a commit of the same key serialize: a commit in progress (its object row inserted,
/// not yet committed) makes a concurrent fence_orphans wait, then see the object (not fenced);
/// and many concurrent fence/commit pairs never both succeed, and exactly one always does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_fences_and_commits_serialize() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let c = connect(schema.options().with_max_connections(8), clock.clone()).await;
    let topic = create_topic(c.as_ref(), 4).await;
    let p = TopicIdPartition::new(topic, 0);

    // Deterministic: the commit is inside the commit function (object inserted, key locked),
    // waiting on a partition lock, when the fence arrives.
    let locks = PartitionLocks::take(&schema).await;
    let key = key_aged(0);
    let commit = spawn_commit(&c, request(&key, vec![plain(p, 1)]));
    let mut inspector = side_connection(&schema, "-inspector").await;
    blocked_backend(&mut inspector, &schema.name).await;
    let fence = {
        let c = c.clone();
        let key = key.clone();
        tokio::spawn(async move { c.fence_orphans(&[key]).await })
    };
    // The fence waits for the commit's key lock (it must not decide on the uncommitted state).
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .bind(&schema.name)
        .fetch_one(&mut inspector)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            !fence.is_finished(),
            "fence_orphans decided while the commit was in progress: {:?}",
            fence.await
        );
        assert!(Instant::now() < give_up, "the fence never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    locks.release().await;
    commit.await.unwrap().unwrap();
    assert_eq!(fence.await.unwrap().unwrap(), Vec::<String>::new());
    assert_eq!(
        c.known_objects(std::slice::from_ref(&key)).await.unwrap(),
        vec![key]
    );

    // Concurrent pairs, in both orders of arrival.
    let mut tasks = Vec::new();
    for i in 0..120 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let key = key_aged(0);
            let p = TopicIdPartition::new(topic, i % 4);
            let commit = {
                let c = c.clone();
                let key = key.clone();
                async move { c.commit_file(request(&key, vec![plain(p, 1)])).await }
            };
            let fence = {
                let c = c.clone();
                let key = key.clone();
                async move { c.fence_orphans(&[key]).await }
            };
            let (committed, fenced) = if i % 2 == 0 {
                tokio::join!(commit, fence)
            } else {
                let (f, c) = tokio::join!(fence, commit);
                (c, f)
            };
            let fenced = fenced.unwrap();
            match committed {
                Ok(r) => {
                    assert_eq!(r[0].error, ErrorCode::None);
                    assert!(fenced.is_empty(), "{key}: committed and fenced");
                    true
                }
                Err(CoordinatorError::ObjectFenced(_)) => {
                    assert_eq!(fenced, vec![key.clone()], "{key}: refused but not fenced");
                    false
                }
                Err(e) => panic!("{key}: {e}"),
            }
        }));
    }
    let mut commits_won = 0;
    for t in tasks {
        if tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("a pair hung")
            .expect("a pair failed")
        {
            commits_won += 1;
        }
    }
    eprintln!("{commits_won} of 120 commits won against their fence");
    c.close().await;
}

// -------------------------------------------------------------------------------------------------
// Review fixes R1 (fence retention across coordinators) and R3 (a deleted key stays uncommittable)

/// A commit of one 1-record batch to partition 0 of `topic` through the previous version's
/// `commit_file` signature (a broker not yet upgraded), on a connection of its own.
async fn old_signature_commit(
    schema: &Schema,
    topic: Uuid,
    key: &str,
) -> Result<Vec<i16>, sqlx::Error> {
    let mut conn = side_connection(schema, "-old-broker").await;
    let r = sqlx::query_scalar::<_, i16>(
        "SELECT r_error_code FROM commit_file($1, 1, 101, '{0}', 0, \
         ARRAY[$2]::uuid[], '{0}', '{1}', '{100}', '{1}', '{0}', '{0}', '{-1}', '{-1}', \
         '{-1}', '{-1}')",
    )
    .bind(key)
    .bind(topic.hyphenated().to_string())
    .fetch_all(&mut conn)
    .await;
    let _ = conn.close().await;
    r
}

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

async fn stored_max_commit_age_ms(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT max_commit_age_ms FROM coordinator_settings")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn fence_exists(conn: &mut PgConnection, key: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM object_fences WHERE object_key = $1)")
        .bind(key)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// R1: fences outlive the deadline of every coordinator sharing the schema. A coordinator with a
/// 1 minute max_commit_age fences a key 3 minutes old and sweeps expired fences (its own 2 x 1 min
/// would drop that fence); a coordinator at 10 minutes, whose deadline still accepts the key, is
/// refused by the fence. Connecting with a smaller value never lowers the stored maximum; a larger
/// one raises it, which lengthens fence retention and the previous signature's deadline. (Keys
/// with old v7 times stand in for waiting: the server's clock is real.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fence_retention_follows_the_largest_commit_age() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let with_max_age = |age: Duration| schema.options().with_max_commit_age(age);
    let ten_minutes = coordinator(&schema, clock.clone()).await;
    let one_minute = connect(with_max_age(Duration::from_secs(60)), clock.clone()).await;
    let mut inspector = side_connection(&schema, "-inspector").await;
    assert_eq!(
        stored_max_commit_age_ms(&mut inspector).await,
        600_000,
        "a smaller max_commit_age never lowers the stored maximum"
    );
    let topic = create_topic(ten_minutes.as_ref(), 1).await;
    let p = TopicIdPartition::new(topic, 0);

    let key = key_aged(3 * 60_000);
    assert_eq!(
        one_minute
            .fence_orphans(std::slice::from_ref(&key))
            .await
            .unwrap(),
        vec![key.clone()]
    );
    // Expiry sweeps by the 1 minute coordinator, through both calls that sweep.
    assert!(one_minute.fence_orphans(&[]).await.unwrap().is_empty());
    one_minute
        .confirm_deleted(&["wal/not-an-object".to_string()])
        .await
        .unwrap();
    assert!(
        fence_exists(&mut inspector, &key).await,
        "the fence of a key another coordinator's deadline accepts was dropped"
    );
    let r = ten_minutes
        .commit_file(request(&key, vec![plain(p, 1)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectFenced(_))),
        "expected ObjectFenced, got {r:?}"
    );
    assert_eq!(find_from(&ten_minutes, p, 0).await.high_watermark, 0);

    // A fence older than 2 x the stored maximum is dropped by the next sweep (any coordinator's
    // deadline refuses its key anyway).
    let expired = key_aged(21 * 60_000);
    assert_eq!(
        one_minute
            .fence_orphans(std::slice::from_ref(&expired))
            .await
            .unwrap(),
        vec![expired.clone()]
    );
    assert!(one_minute.fence_orphans(&[]).await.unwrap().is_empty());
    assert!(!fence_exists(&mut inspector, &expired).await);
    assert!(fence_exists(&mut inspector, &key).await);

    // A coordinator at 30 minutes raises the maximum: a 25 minute old fence now survives sweeps,
    // and the previous version's signature takes the stored value as its deadline.
    let thirty_minutes = connect(with_max_age(Duration::from_secs(30 * 60)), clock.clone()).await;
    assert_eq!(stored_max_commit_age_ms(&mut inspector).await, 1_800_000);
    let old = key_aged(25 * 60_000);
    assert_eq!(
        one_minute
            .fence_orphans(std::slice::from_ref(&old))
            .await
            .unwrap(),
        vec![old.clone()]
    );
    assert!(one_minute.fence_orphans(&[]).await.unwrap().is_empty());
    assert!(fence_exists(&mut inspector, &old).await);
    let r = thirty_minutes
        .commit_file(request(&old, vec![plain(p, 1)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectFenced(_))),
        "expected ObjectFenced, got {r:?}"
    );
    assert_eq!(
        old_signature_commit(&schema, topic, &key_aged(20 * 60_000))
            .await
            .unwrap(),
        vec![0],
        "the previous signature's deadline is the stored maximum (30 min), not 10 min"
    );
    let e = old_signature_commit(&schema, topic, &key_aged(31 * 60_000))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("DL001"));
    let e = old_signature_commit(&schema, topic, &old)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("DL002"));
    for c in [ten_minutes, one_minute, thirty_minutes] {
        c.close().await;
    }
}

/// Issue #25: producer expiry's floor is twice the largest `max_commit_age` any coordinator of
/// the schema connected with (`coordinator_settings`), not the expiring coordinator's own: a
/// coordinator at 30 minutes may commit a key that late, so a coordinator at 1 minute keeps a
/// state for an hour (the topic's 1 ms notwithstanding) and expires it only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_producer_expiry_floor_follows_the_largest_commit_age() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let with_max_age = |age: Duration| schema.options().with_max_commit_age(age);
    let one_minute = connect(with_max_age(Duration::from_secs(60)), clock.clone()).await;
    let topic = fresh_topic_id();
    common::create_topic(
        one_minute.as_ref(),
        topic,
        "expiring",
        1,
        TopicConfig::default().with_producer_id_expiration_ms(1),
    )
    .await;
    let p = TopicIdPartition::new(topic, 0);
    let r = one_minute
        .commit_file(request(&key_aged(0), vec![idempotent(p, 7, 0, 0, 1)]))
        .await
        .unwrap();
    assert_eq!(r[0].error, ErrorCode::None);
    // The schema's maximum is the default's 10 minutes: a floor of 20.
    clock.advance(20 * 60_000 - 1);
    assert_eq!(one_minute.expire_producers(10).await.unwrap().expired, 0);
    // A coordinator at 30 minutes connects: the floor becomes an hour, for every coordinator.
    let thirty_minutes = connect(with_max_age(Duration::from_secs(30 * 60)), clock.clone()).await;
    clock.advance(1);
    assert_eq!(one_minute.expire_producers(10).await.unwrap().expired, 0);
    assert!(one_minute.producer_state(p, 7).await.unwrap().is_some());
    clock.advance(40 * 60_000 - 1);
    assert_eq!(one_minute.expire_producers(10).await.unwrap().expired, 0);
    clock.advance(1);
    assert_eq!(one_minute.expire_producers(10).await.unwrap().expired, 1);
    assert_eq!(one_minute.producer_state(p, 7).await.unwrap(), None);
    for c in [one_minute, thirty_minutes] {
        c.close().await;
    }
}

/// R1: the server's key-time parser (used by the previous version's commit_file signature and by
/// the fences of deleted objects) agrees with `diskless_coordinator::object_key_time_ms` on every
/// key: every UUID text form, both cases, every version and variant nibble, and near misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_key_time_parser_agrees_with_rust() {
    let Some(schema) = test_schema() else { return };
    let c = coordinator(&schema, ManualClock::new(START_MS)).await;
    let mut keys: Vec<String> = vec![
        String::new(),
        "/".into(),
        "wal/".into(),
        "wal/not-a-uuid".into(),
        "wal/00000000-0000-7000-8000-000000000000".into(),
        "ffffffff-ffff-7fff-bfff-ffffffffffff".into(),
    ];
    let mut uuids = vec![Uuid::nil(), Uuid::max()];
    for ms in [0u64, 1, 1_700_000_000_123, (1 << 48) - 1] {
        uuids.push(uuid::Builder::from_unix_timestamp_millis(ms, &[0x5a; 10]).into_uuid());
    }
    // Arbitrary v7 UUIDs (any time, any random bits) and v4 UUIDs, reproducibly.
    let mut rng = XorShift(0x5eed_1e55_d15c_0001);
    let random_bytes = |rng: &mut XorShift| {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&rng.next().to_le_bytes());
        b[8..].copy_from_slice(&rng.next().to_le_bytes());
        b
    };
    let random_v7 = |rng: &mut XorShift| {
        let ms = rng.below(1 << 48);
        let random: [u8; 10] = random_bytes(rng)[..10].try_into().unwrap();
        uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
    };
    for _ in 0..40 {
        uuids.push(random_v7(&mut rng));
        uuids.push(uuid::Builder::from_random_bytes(random_bytes(&mut rng)).into_uuid());
    }
    // Every version nibble and every variant nibble of a v7 UUID.
    let base = *random_v7(&mut rng).as_bytes();
    for nibble in 0u8..16 {
        let mut b = base;
        b[6] = (b[6] & 0x0f) | (nibble << 4);
        uuids.push(Uuid::from_bytes(b));
        let mut b = base;
        b[8] = (b[8] & 0x0f) | (nibble << 4);
        uuids.push(Uuid::from_bytes(b));
    }
    for u in &uuids {
        let hyphenated = u.hyphenated().to_string();
        let forms = [
            hyphenated.clone(),
            hyphenated.to_uppercase(),
            u.simple().to_string(),
            u.simple().to_string().to_uppercase(),
            u.braced().to_string(),
            u.urn().to_string(),
            u.urn().to_string().to_uppercase(),
            format!("{{{}}}", u.simple()),
            format!("urn:uuid:{}", u.simple()),
            format!("{hyphenated}\n"),
            format!(" {hyphenated}"),
            format!("{hyphenated}/"),
            format!("{}x", &hyphenated[..35]),
            format!("{}é", &hyphenated[..35]),
            hyphenated.replacen('-', "", 1) + "0",
            format!("{}-{}", &hyphenated[..7], &hyphenated[9..]),
        ];
        for form in forms {
            keys.push(format!("wal/{form}"));
            keys.push(format!("a/b/{form}"));
            keys.push(form);
        }
    }
    let mut conn = side_connection(&schema, "-inspector").await;
    let sql: Vec<Option<i64>> = sqlx::query_scalar(
        "SELECT object_key_time_ms(u.k) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) \
         ORDER BY u.i",
    )
    .bind(&keys)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(sql.len(), keys.len());
    let mut dated = 0;
    for (key, from_sql) in keys.iter().zip(&sql) {
        let from_rust = diskless_coordinator::object_key_time_ms(key);
        assert_eq!(*from_sql, from_rust, "key {key:?}");
        dated += usize::from(from_rust.is_some());
    }
    assert!(
        dated > 400,
        "only {dated} of {} keys had a time",
        keys.len()
    );
    c.close().await;
}

/// R3: deleting an object row fences its key, in the deleting transaction, so a commit of the key
/// never appends batches to a deleted object, whatever the timing: a commit arriving while the
/// deletion is in progress waits for it and is then refused (ObjectFenced), or told the object is
/// already committed when the deletion rolls back. The deletion here is the previous version's
/// plain DELETE, so brokers not yet upgraded fence too. Also: confirm_deleted drops expired fences,
/// and a deleted key the deadline refuses anyway gets no fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deleted_objects_are_fenced_and_serialize_with_commits() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let c = coordinator(&schema, clock.clone()).await;
    let topic = create_topic(c.as_ref(), 1).await;
    let p = TopicIdPartition::new(topic, 0);
    let unknown = TopicIdPartition::new(fresh_topic_id(), 0);
    let mut inspector = side_connection(&schema, "-inspector").await;

    for commit_deletion in [true, false] {
        // An object whose only batch was rejected: marked for deletion at once.
        let key = key_aged(0);
        let r = c
            .commit_file(request(&key, vec![plain(unknown, 1)]))
            .await
            .unwrap();
        assert_eq!(r[0].error, ErrorCode::UnknownTopicOrPartition);
        let mut cleaner = side_connection(&schema, "-cleaner").await;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "BEGIN; DELETE FROM objects WHERE marked_for_deletion_at IS NOT NULL \
             AND object_key = '{key}'"
        )))
        .execute(&mut cleaner)
        .await
        .unwrap();
        let retry = spawn_commit(&c, request(&key, vec![plain(p, 1)]));
        blocked_backend(&mut inspector, &schema.name).await;
        assert!(!retry.is_finished());
        let end = if commit_deletion {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        sqlx::raw_sql(end).execute(&mut cleaner).await.unwrap();
        let r = retry.await.unwrap();
        if commit_deletion {
            assert!(
                matches!(r, Err(CoordinatorError::ObjectFenced(_))),
                "a commit of a deleted object must be refused, got {r:?}"
            );
            assert_eq!(c.object_info(&key).await.unwrap(), None);
            assert!(fence_exists(&mut inspector, &key).await);
        } else {
            assert!(
                matches!(r, Err(CoordinatorError::ObjectAlreadyCommitted(_))),
                "got {r:?}"
            );
            assert!(c.object_info(&key).await.unwrap().is_some());
            assert!(!fence_exists(&mut inspector, &key).await);
        }
        assert_eq!(find_from(c.as_ref(), p, 0).await.high_watermark, 0);
    }

    // confirm_deleted sweeps expired fences (older than 2 x the stored 10 minutes) and keeps the
    // others, and does not fence a deleted key the deadline refuses anyway.
    let expired = key_aged(21 * 60_000);
    let kept = key_aged(19 * 60_000);
    assert_eq!(
        c.fence_orphans(&[expired.clone(), kept.clone()])
            .await
            .unwrap(),
        vec![expired.clone(), kept.clone()]
    );
    let ancient = key_aged(60 * 60_000);
    sqlx::query(
        "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
         committed_at, marked_for_deletion_at) VALUES ($1, 1, 10, 0, '{0}', 0, 0)",
    )
    .bind(&ancient)
    .execute(&mut inspector)
    .await
    .unwrap();
    c.confirm_deleted(std::slice::from_ref(&ancient))
        .await
        .unwrap();
    assert_eq!(c.object_info(&ancient).await.unwrap(), None);
    assert!(!fence_exists(&mut inspector, &expired).await);
    assert!(fence_exists(&mut inspector, &kept).await);
    assert!(!fence_exists(&mut inspector, &ancient).await);
    let r = c.commit_file(request(&ancient, vec![plain(p, 1)])).await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "got {r:?}"
    );
    c.close().await;
}

/// Two coordinators on one schema (as two broker processes), each with several callers at once,
/// never get overlapping producer-id blocks; a coordinator connected afterwards (a restart) never
/// hands out an id already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_producer_id_blocks_from_two_coordinators_never_overlap() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let a = coordinator(&schema, clock.clone()).await;
    let b = coordinator(&schema, clock.clone()).await;
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
    conformance::assert_disjoint_blocks(&blocks);
    let highest = blocks.iter().map(|(_, b)| b.last()).max().unwrap();
    let total: i64 = blocks.iter().map(|(n, _)| i64::from(*n)).sum();
    assert_eq!(
        highest + 1,
        total,
        "blocks are consecutive from 0: no id skipped"
    );
    a.close().await;
    b.close().await;
    let c = coordinator(&schema, clock).await;
    assert_eq!(c.allocate_producer_ids(1).await.unwrap().first, highest + 1);
    // Near the end of the id space the counter refuses rather than wrap.
    let mut conn = side_connection(&schema, "-inspector").await;
    sqlx::query("UPDATE producer_ids SET next_producer_id = 9223372036854775800")
        .execute(&mut conn)
        .await
        .unwrap();
    let r = c.allocate_producer_ids(100).await;
    assert!(matches!(r, Err(CoordinatorError::Storage(_))), "{r:?}");
    c.close().await;
}

/// Two coordinators growing one topic at once: every growth is applied whole or refused with
/// INVALID_PARTITIONS, the largest wins, every partition row exists once, and commits to the
/// topic's partitions go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_create_partitions() {
    let Some(schema) = test_schema() else { return };
    let clock = ManualClock::new(START_MS);
    let a = coordinator(&schema, clock.clone()).await;
    let b = coordinator(&schema, clock.clone()).await;
    let t = create_topic(a.as_ref(), 2).await;
    let mut tasks = Vec::new();
    for total in 3..=10 {
        let c = if total % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(
            async move { c.create_partitions(t, total).await },
        ));
    }
    let commits: Vec<_> = (0..4)
        .map(|_| {
            spawn_commit(
                &a,
                request(&key_aged(0), vec![plain(TopicIdPartition::new(t, 0), 1)]),
            )
        })
        .collect();
    let mut grown = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => grown += 1,
            Err(CoordinatorError::InvalidPartitions(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(grown >= 1);
    for c in commits {
        assert_eq!(c.await.unwrap().unwrap()[0].error, ErrorCode::None);
    }
    assert_eq!(b.list_topics().await.unwrap()[0].partitions, 10);
    let mut conn = side_connection(&schema, "-inspector").await;
    let partitions: Vec<i32> =
        sqlx::query_scalar("SELECT partition FROM partitions ORDER BY partition")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(partitions, (0..10).collect::<Vec<_>>());
    a.close().await;
    b.close().await;
}

/// Migration 8 starts the producer-id counter above every producer id with state in the schema
/// (ids handed out before by a broker's own allocator), leaving out ids from 2^62 on. Its
/// `INSERT` is re-run here on a schema holding producer states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_producer_ids_start_above_the_existing_producer_states() {
    let Some(schema) = test_schema() else { return };
    let clock = conformance::harness_clock_at_system_time();
    let c = coordinator(&schema, clock.clone()).await;
    let t = create_topic(c.as_ref(), 1).await;
    let p = TopicIdPartition::new(t, 0);
    let batches = [41, 7, (1i64 << 62) + 9]
        .into_iter()
        .map(|pid| idempotent(p, pid, 0, 0, 1))
        .collect();
    let r = c.commit_file(request(&key_aged(0), batches)).await.unwrap();
    assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
    let migration = include_str!("../migrations/postgres/0008_producer_ids.sql");
    let insert = &migration[migration.find("INSERT INTO producer_ids").unwrap()..];
    let mut conn = side_connection(&schema, "-inspector").await;
    sqlx::query("DELETE FROM producer_ids")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(insert.to_string()))
        .execute(&mut conn)
        .await
        .unwrap();
    let block = c.allocate_producer_ids(10).await.unwrap();
    assert_eq!((block.first, block.count), (42, 10));
    c.close().await;
}
