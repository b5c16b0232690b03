//! Figure 11: what a transaction costs the coordinator (issue #14), next to the idempotent produce
//! of the same partitions measured in the same run, on SQLite (a file, synchronous=FULL, as figure
//! 2) and PostgreSQL (as figure 3).
//!
//! For N = 1, 10 and 100 partitions, one producer writes one 16 KiB batch (32 records) to each of
//! N partitions, in one WAL segment (one `commit_file`):
//! - **idempotent** (the baseline): that commit, the producer's batches in sequence;
//! - **transactional**: the same commit with the batches transactional and verified for the
//!   producer's next transaction (so each opens the transaction in its partition), then the
//!   transaction's end: `write_txn_markers` of N COMMIT markers in one call (what a host's EndTxn
//!   does on one coordinator).
//!
//! Rows: p50 of the transactional commit against the idempotent one (the extra work of the
//! transaction rules at the commit point), p50 of the markers call, and the whole transaction
//! (commit + markers) against the idempotent commit. Variants run interleaved, round by round, so
//! that the machine's noise hits both. A marker costs no object-storage request (it has no bytes in
//! storage; `diskless-core/tests/produce_fetch_txn.rs` counts the PUTs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, SystemClock, TopicIdPartition, TxnMarker,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::fig2_sqlite::{BATCH_BYTES, BATCH_RECORDS};
use crate::report::{Row, Status, ms};
use crate::util::{bench_dir, create_topic, now_ms, percentile, plain_batch, random_uuid, runtime};

const FIG: u8 = 11;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Partition counts of a transaction.
const SIZES: [usize; 3] = [1, 10, 100];

/// Runs figure 11.
pub(crate) fn run(quick: bool) -> Vec<Row> {
    let rounds = if quick { 3 } else { 40 };
    let rt = runtime();
    rt.block_on(async {
        let mut rows = Vec::new();
        let dir = bench_dir();
        let sqlite = match SqliteCoordinator::open(
            dir.path().join("txn.db"),
            SqliteOptions::default().with_synchronous(Synchronous::Full),
            Arc::new(SystemClock),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => panic!("opening SQLite: {e}"),
        };
        rows.extend(measure(&sqlite, "SQLite", rounds).await);
        sqlite.close().await;

        let url =
            std::env::var("DISKLESS_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
        let probe = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await;
        let mut admin = match probe {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                rows.push(Row::not_measured(
                    FIG,
                    "PostgreSQL transaction cost",
                    format!("no PostgreSQL at {url}: {e}"),
                ));
                return rows;
            }
            Err(_) => {
                rows.push(Row::not_measured(
                    FIG,
                    "PostgreSQL transaction cost",
                    format!("no PostgreSQL at {url}: timeout"),
                ));
                return rows;
            }
        };
        let schema = format!(
            "diskless_bench_txn_{}",
            &random_uuid().simple().to_string()[..12]
        );
        match PostgresCoordinator::connect(
            PostgresOptions::new(&url).with_schema(&schema),
            Arc::new(SystemClock),
        )
        .await
        {
            Ok(pg) => {
                rows.extend(measure(&pg, "PostgreSQL", rounds).await);
                pg.close().await;
            }
            Err(e) => rows.push(Row::not_measured(
                FIG,
                "PostgreSQL transaction cost",
                format!("connecting: {e}"),
            )),
        }
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&mut admin)
        .await;
        let _ = admin.close().await;
        rows
    })
}

/// One producer's view of a topic: its next sequence per partition, its transactions so far.
struct Producer {
    topic: uuid::Uuid,
    producer_id: i64,
    partitions: usize,
    seq: i32,
    txn_seq: i64,
    files: u64,
    name: &'static str,
}

impl Producer {
    /// The commit of one batch per partition (all in sequence), transactional if `txn_seq`.
    fn commit(&mut self, txn_seq: Option<i64>) -> CommitFileRequest {
        let ts = now_ms();
        let batches: Vec<CommitBatch> = (0..self.partitions)
            .map(|i| CommitBatch {
                producer_id: self.producer_id,
                producer_epoch: 0,
                base_sequence: self.seq,
                last_sequence: self.seq + BATCH_RECORDS - 1,
                transactional: txn_seq.is_some(),
                txn_seq,
                ..plain_batch(
                    TopicIdPartition::new(self.topic, i as i32),
                    1 + i as u64 * u64::from(BATCH_BYTES),
                    BATCH_BYTES,
                    BATCH_RECORDS,
                    ts,
                    ts + 5,
                )
            })
            .collect();
        self.seq += BATCH_RECORDS;
        self.files += 1;
        CommitFileRequest {
            object_key: format!("wal/{}-{}-{:08}", self.name, self.partitions, self.files),
            uploader_broker_id: 1,
            object_size: 1 + self.partitions as u64 * u64::from(BATCH_BYTES),
            owners: vec![0],
            batches,
        }
    }

    /// The COMMIT markers of the current transaction.
    fn markers(&self) -> Vec<TxnMarker> {
        (0..self.partitions)
            .map(|i| TxnMarker {
                partition: TopicIdPartition::new(self.topic, i as i32),
                producer_id: self.producer_id,
                producer_epoch: 0,
                coordinator_epoch: 0,
                commit: true,
                txn_seq: Some(self.txn_seq),
            })
            .collect()
    }
}

async fn commit(coordinator: &dyn BatchCoordinator, request: CommitFileRequest) -> Duration {
    let start = Instant::now();
    match coordinator.commit_file(request).await {
        Ok(results) => assert!(
            results.iter().all(|r| r.error.is_ok() && !r.duplicate),
            "{results:?}"
        ),
        Err(e) => panic!("commit: {e}"),
    }
    start.elapsed()
}

/// The rows of one backend.
async fn measure(coordinator: &dyn BatchCoordinator, backend: &str, rounds: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for (k, &n) in SIZES.iter().enumerate() {
        let mut plain = Producer {
            topic: create_topic(coordinator, &format!("idem-{n}"), n as i32).await,
            producer_id: 2 * k as i64,
            partitions: n,
            seq: 0,
            txn_seq: 0,
            files: 0,
            name: "idem",
        };
        let mut txn = Producer {
            topic: create_topic(coordinator, &format!("txn-{n}"), n as i32).await,
            producer_id: 2 * k as i64 + 1,
            partitions: n,
            seq: 0,
            txn_seq: 0,
            files: 0,
            name: "txn",
        };
        let (mut idem_commits, mut txn_commits, mut marker_calls, mut whole) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // One warm-up round (prepares the statements), not counted.
        for counted in std::iter::once(false).chain(std::iter::repeat_n(true, rounds)) {
            let idem = commit(coordinator, plain.commit(None)).await;
            txn.txn_seq += 1;
            let seq = txn.txn_seq;
            let c = commit(coordinator, txn.commit(Some(seq))).await;
            let start = Instant::now();
            match coordinator.write_txn_markers(&txn.markers()).await {
                Ok(results) => assert!(
                    results.iter().all(|r| r.error.is_ok() && !r.duplicate),
                    "{results:?}"
                ),
                Err(e) => panic!("write_txn_markers: {e}"),
            }
            let m = start.elapsed();
            if counted {
                idem_commits.push(idem);
                txn_commits.push(c);
                marker_calls.push(m);
                whole.push(c + m);
            }
        }
        let idem = percentile(&mut idem_commits, 0.5);
        let c = percentile(&mut txn_commits, 0.5);
        let m = percentile(&mut marker_calls, 0.5);
        let w = percentile(&mut whole, 0.5);
        let ratio = |x: Duration| x.as_secs_f64() / idem.as_secs_f64().max(1e-9);
        let baseline = format!(
            "idempotent commit of the same {n} batches, p50 {}",
            ms(idem)
        );
        rows.push(
            Row::new(
                FIG,
                format!("{backend}: transactional commit, {n} partitions (p50)"),
                ms(c),
            )
            .baseline(baseline.clone())
            .ratio(format!("{:.2}x", ratio(c)))
            .target("(none)", Status::Info)
            .numbers(&[c.as_secs_f64(), idem.as_secs_f64(), ratio(c)]),
        );
        rows.push(
            Row::new(
                FIG,
                format!("{backend}: write_txn_markers, {n} COMMIT markers (p50)"),
                ms(m),
            )
            .baseline(baseline.clone())
            .ratio(format!("{:.2}x", ratio(m)))
            .target("(none)", Status::Info)
            .numbers(&[m.as_secs_f64(), ratio(m)]),
        );
        rows.push(
            Row::new(
                FIG,
                format!("{backend}: whole transaction (commit + markers), {n} partitions (p50)"),
                ms(w),
            )
            .baseline(baseline)
            .ratio(format!("{:.2}x", ratio(w)))
            .target("(none)", Status::Info)
            .numbers(&[w.as_secs_f64(), ratio(w)]),
        );
    }
    rows
}
