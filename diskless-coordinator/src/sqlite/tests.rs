//! Unit tests of the SQLite coordinator's queries: the lookups and the lifecycle passes are bounded
//! index probes (checked on SQLite's own query plans), and the timestamp lookup's slow path answers
//! like a scan of the live batches.

use super::SqliteCoordinator;
use super::lifecycle::{
    EXPIRED_PRODUCERS, OBJECTS_TO_DELETE_KIND, RETENTION_BATCHES, RETENTION_CANDIDATES,
    RETENTION_SEGMENTS,
};
use super::reads::{
    ABORTED_BETWEEN, MAX_TIMESTAMP_LOOKUP, OPEN_TXN_FIRST, SEGMENT_MAX_TIMESTAMP,
    SEGMENT_TIMESTAMP_CANDIDATE, SEGMENT_TIMESTAMP_SCAN, TIMESTAMP_CANDIDATE, TIMESTAMP_SCAN,
    segments_from,
};
use super::tiering::{
    ABORTED_IN_RANGE, LAST_SEGMENT_SO_FAR, SEGMENT_RANGE, last_segment_sql, plan_batches_sql,
    tiering_candidates_sql,
};
use crate::{
    BatchCoordinator, CommitBatch, CommitFileRequest, CreateTopicRequest, DeleteRecordsRequest,
    ErrorCode, ListOffsetsRequest, MAX_TIMESTAMP, ManualClock, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
    NO_SEQUENCE, NO_TIMESTAMP, TimestampType, TopicConfig, TopicIdPartition,
};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

/// SQLite's query plan of `sql`, one line per step.
async fn plan(c: &SqliteCoordinator, sql: &str) -> Vec<String> {
    let mut guard = c.writer.lock().await;
    let conn = guard.as_mut().unwrap();
    sqlx::query(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
        .fetch_all(conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>(3))
        .collect()
}

/// A plan that reads a bounded index range: every table access is a SEARCH (never a SCAN of a table
/// or index) and nothing is sorted in a temporary B-tree.
fn is_search_only(plan: &[String]) -> bool {
    plan.iter()
        .all(|step| step.starts_with("SEARCH") && !step.contains("TEMP B-TREE"))
}

/// The timestamp lookups and MAX_TIMESTAMP are one probe of their index; the query the coordinator
/// used before (issue 12, item 10) walked the partition's primary key from its first batch,
/// filtering on the timestamp, and sorted all of a partition's batches for MAX_TIMESTAMP.
#[tokio::test]
async fn timestamp_lookups_probe_their_indexes() {
    let c = SqliteCoordinator::in_memory(ManualClock::new(0))
        .await
        .unwrap();
    let p = plan(&c, TIMESTAMP_CANDIDATE).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(
        p[0].contains(
            "USING INDEX batches_timestamp_so_far (partition_id=? AND max_timestamp_so_far>?)"
        ),
        "the running max bounds the index range: {p:?}"
    );
    let p = plan(&c, MAX_TIMESTAMP_LOOKUP).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(p[0].contains("USING INDEX batches_max_timestamp"), "{p:?}");
    // The slow path walks the primary key forward from the candidate, never from the partition start.
    let p = plan(&c, TIMESTAMP_SCAN).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(p[0].contains("(partition_id=? AND last_offset>?)"), "{p:?}");

    // The queries before the index: not bounded, and the checks above say so.
    const EFFECTIVE: &str =
        "CASE WHEN timestamp_type = 1 THEN log_append_time ELSE max_timestamp END";
    let old_lookup = format!(
        "SELECT base_offset, {EFFECTIVE} AS ts FROM batches WHERE partition_id = ?1 \
         AND {EFFECTIVE} >= ?2 ORDER BY last_offset LIMIT 1"
    );
    let p = plan(&c, &old_lookup).await;
    assert!(
        !p[0].contains("max_timestamp_so_far>?") && p[0].ends_with("(partition_id=?)"),
        "{p:?}"
    );
    let old_max = format!(
        "SELECT base_offset, {EFFECTIVE} AS ts FROM batches WHERE partition_id = ?1 \
         ORDER BY ts DESC, last_offset LIMIT 1"
    );
    assert!(!is_search_only(&plan(&c, &old_max).await));
}

/// The table and index accesses of a plan with correlated subqueries: the subquery header lines
/// ("CORRELATED SCALAR SUBQUERY n") name no access and are left out.
fn accesses(plan: &[String]) -> Vec<String> {
    plan.iter()
        .filter(|step| !step.contains("SCALAR SUBQUERY"))
        .cloned()
        .collect()
}

/// The lifecycle passes read bounded index ranges: retention pages partitions by a range of their
/// unique index, probes each one's first batch by the primary key, and reads a due partition's
/// oldest batches as a range of the primary key.
#[tokio::test]
async fn lifecycle_queries_are_index_ranges() {
    let c = SqliteCoordinator::in_memory(ManualClock::new(0))
        .await
        .unwrap();
    for sql in [RETENTION_CANDIDATES, RETENTION_BATCHES] {
        let p = accesses(&plan(&c, sql).await);
        assert!(is_search_only(&p), "{sql}: {p:?}");
    }
    let p = accesses(&plan(&c, RETENTION_CANDIDATES).await);
    assert!(p[0].contains("((topic_id,partition)>(?,?))"), "{p:?}");
    // The first batch of a partition: one probe of the primary key, in its order (no sort).
    assert!(
        p.iter()
            .filter(|s| s.starts_with("SEARCH b "))
            .all(|s| s.contains("USING PRIMARY KEY (partition_id=?)")),
        "{p:?}"
    );
    let p = plan(&c, RETENTION_BATCHES).await;
    assert!(
        p[0].contains("USING PRIMARY KEY (partition_id=? AND last_offset>?)"),
        "{p:?}"
    );
    // Producer expiry walks partitions in index order (no sort), stopping at its limit.
    let p = plan(&c, EXPIRED_PRODUCERS).await;
    assert!(p.iter().all(|s| !s.contains("TEMP B-TREE")), "{p:?}");
}

/// The transaction reads are bounded index probes: the last stable offset is one probe of the
/// partial index of open transactions (not a walk of the partition's producer states, which
/// include every idempotent producer that ever wrote there); the aborted transactions of a fetch
/// are primary-key ranges from the fetch offset (the stop row, then the answer bounded by it),
/// never a scan of the partition's aborted transactions from its start.
#[tokio::test]
async fn transaction_reads_probe_their_indexes() {
    let c = SqliteCoordinator::in_memory(ManualClock::new(0))
        .await
        .unwrap();
    let p = plan(&c, OPEN_TXN_FIRST).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(
        p[0].contains("USING COVERING INDEX producer_state_open_txn (partition_id=?"),
        "{p:?}"
    );
    // Without the partial index's condition the same query walks every producer state.
    let all = "SELECT MIN(txn_first_offset) FROM producer_state WHERE partition_id = ?1";
    assert!(
        !plan(&c, all).await[0].contains("producer_state_open_txn"),
        "the check above tells the two apart"
    );
    let p = accesses(&plan(&c, ABORTED_BETWEEN).await);
    assert!(is_search_only(&p), "{p:?}");
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p.iter()
            .all(|s| s.contains("USING PRIMARY KEY (partition_id=? AND last_offset>?")),
        "{p:?}"
    );
    assert!(
        p[0].contains("last_offset>? AND last_offset<?)"),
        "the stop row bounds the answer's range: {p:?}"
    );
}

/// The tiered-segment queries are bounded index probes and ranges: the segment timestamp lookups
/// probe their indexes like the batch ones, a fetch and retention read primary-key ranges from an
/// offset, registration's range check is a primary-key range from the partition's first batch
/// (bounded by its LIMIT), and the candidate query walks partitions in the order of their unique
/// index (no sort), probing each one's first batch, its object and its open transactions.
#[tokio::test]
async fn tiering_queries_are_index_probes() {
    let c = SqliteCoordinator::in_memory(ManualClock::new(0))
        .await
        .unwrap();
    let p = plan(&c, SEGMENT_TIMESTAMP_CANDIDATE).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(
        p[0].contains(
            "USING INDEX tiered_timestamp_so_far (partition_id=? AND max_timestamp_so_far>?)"
        ),
        "{p:?}"
    );
    let p = plan(&c, SEGMENT_MAX_TIMESTAMP).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(p[0].contains("USING INDEX tiered_max_timestamp"), "{p:?}");
    for (sql, range) in [
        (SEGMENT_TIMESTAMP_SCAN, "(partition_id=? AND end_offset>?)"),
        (RETENTION_SEGMENTS, "(partition_id=? AND end_offset>?)"),
        (&segments_from(), "(partition_id=? AND end_offset>?)"),
        (LAST_SEGMENT_SO_FAR, "(partition_id=?)"),
        (&last_segment_sql(), "(partition_id=?)"),
        (
            ABORTED_IN_RANGE,
            "(partition_id=? AND last_offset>? AND last_offset<?)",
        ),
        (&plan_batches_sql(), "(partition_id=? AND last_offset>?)"),
        (SEGMENT_RANGE, "(partition_id=? AND last_offset<?)"),
    ] {
        // SEGMENT_RANGE reads its LIMITed range in a co-routine, whose rows it then scans.
        let p: Vec<String> = accesses(&plan(&c, sql).await)
            .into_iter()
            .filter(|s| !s.starts_with("CO-ROUTINE") && !s.starts_with("SCAN (subquery"))
            .collect();
        assert!(is_search_only(&p), "{sql}: {p:?}");
        assert!(
            p[0].contains(&format!("USING PRIMARY KEY {range}")),
            "{sql}: {p:?}"
        );
    }
    // The cleaner's queue with the kind: the partial index, in its order.
    let p = plan(&c, OBJECTS_TO_DELETE_KIND).await;
    assert!(is_search_only(&p), "{p:?}");
    assert!(p[0].contains("USING INDEX objects_marked"), "{p:?}");
    // Retention's candidates probe the first segment, then the first batch.
    let p = accesses(&plan(&c, RETENTION_CANDIDATES).await);
    assert!(is_search_only(&p), "{p:?}");
    assert!(
        p.iter()
            .any(|s| s.starts_with("SEARCH s USING PRIMARY KEY (partition_id=?)")),
        "{p:?}"
    );
    // Candidates: partitions by a range of their unique index, no sort, every access a search.
    let p = accesses(&plan(&c, &tiering_candidates_sql()).await);
    assert!(is_search_only(&p), "{p:?}");
    assert!(
        p.iter().any(|s| s.contains("((topic_id,partition)>(?,?))")),
        "{p:?}"
    );
}

fn batch(partition: TopicIdPartition, i: u64, max_timestamp: i64) -> CommitBatch {
    CommitBatch {
        partition,
        byte_offset: 1 + 10 * i,
        byte_size: 10,
        record_count: 2,
        base_timestamp: max_timestamp,
        max_timestamp,
        timestamp_type: TimestampType::CreateTime,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        base_sequence: NO_SEQUENCE,
        last_sequence: NO_SEQUENCE,
        transactional: false,
        txn_seq: None,
    }
}

/// ListOffsets of one partition: (offset, timestamp).
async fn list(c: &SqliteCoordinator, partition: TopicIdPartition, timestamp: i64) -> (i64, i64) {
    let r = c
        .list_offsets(&[ListOffsetsRequest {
            partition,
            timestamp,
            isolation: Default::default(),
        }])
        .await
        .unwrap();
    (r[0].offset, r[0].timestamp)
}

/// The running max includes deleted batches, so after a batch with a larger timestamp than its
/// successors is deleted, the candidate found by the index may have a smaller timestamp than the
/// target: the forward scan then finds the answer. Every target is checked against a scan of the
/// live batches, after each step.
#[tokio::test]
async fn timestamp_lookup_after_deleting_a_larger_timestamp() {
    let c = SqliteCoordinator::in_memory(ManualClock::new(1_000))
        .await
        .unwrap();
    let topic = Uuid::from_u128(5);
    c.create_topic(CreateTopicRequest {
        topic_id: topic,
        name: "t".into(),
        partitions: 1,
        config: TopicConfig::default(),
    })
    .await
    .unwrap();
    let p = TopicIdPartition::new(topic, 0);
    // (base offset, effective max timestamp) of the live batches.
    let mut live: Vec<(i64, i64)> = Vec::new();
    let mut lso = 0;
    let mut next_key = 0;
    let mut commit = async |timestamps: &[i64], live: &mut Vec<(i64, i64)>| {
        next_key += 1;
        let batches: Vec<CommitBatch> = timestamps
            .iter()
            .enumerate()
            .map(|(i, t)| batch(p, i as u64, *t))
            .collect();
        let r = c
            .commit_file(CommitFileRequest {
                object_key: format!("wal/{next_key}"),
                uploader_broker_id: 1,
                object_size: 1 + 10 * timestamps.len() as u64,
                owners: vec![0],
                batches,
            })
            .await
            .unwrap();
        for (r, t) in r.iter().zip(timestamps) {
            live.push((r.base_offset, *t));
        }
    };
    async fn check(c: &SqliteCoordinator, p: TopicIdPartition, live: &[(i64, i64)], lso: i64) {
        for target in 0..=130 {
            let expected = live
                .iter()
                .find(|(_, t)| *t >= target)
                .map_or((-1, NO_TIMESTAMP), |(base, t)| ((*base).max(lso), *t));
            assert_eq!(list(c, p, target).await, expected, "target {target}");
        }
        let mut best: Option<(i64, i64)> = None;
        for (base, t) in live {
            if best.is_none_or(|(_, b)| *t > b) {
                best = Some(((*base).max(lso), *t));
            }
        }
        let best = best.unwrap_or((-1, NO_TIMESTAMP));
        assert_eq!(list(c, p, MAX_TIMESTAMP).await, best);
    }
    commit(&[100, 10, 20, 30], &mut live).await;
    check(&c, p, &live, lso).await;
    // Delete the batch with timestamp 100 (and the first record of the next batch): every live
    // batch's running max is now 100, larger than its own timestamp.
    for (offset, drop) in [(3, 1), (5, 1)] {
        let r = c
            .delete_records(&[DeleteRecordsRequest {
                partition: p,
                offset,
            }])
            .await
            .unwrap();
        assert_eq!(r[0].error, ErrorCode::None);
        lso = offset;
        live.drain(..drop);
        check(&c, p, &live, lso).await;
    }
    commit(&[40, 100, 5, 120, 60], &mut live).await;
    check(&c, p, &live, lso).await;
    // Delete up to and including the second 100: the 120 raises every later running max.
    let r = c
        .delete_records(&[DeleteRecordsRequest {
            partition: p,
            offset: 12,
        }])
        .await
        .unwrap();
    assert_eq!(r[0].low_watermark, 12);
    lso = 12;
    live.retain(|(base, _)| base + 1 >= lso);
    check(&c, p, &live, lso).await;
}

/// SQLite may end a transaction by itself (a COMMIT or statement failing with `SQLITE_FULL` on a
/// full disk, or `SQLITE_IOERR`); sqlx's ROLLBACK of the dropped `Transaction` then fails and sqlx
/// keeps counting a transaction on the write connection. Before the fix every later write failed
/// ("begin_with at non-zero transaction depth") until the process restarted: the fault campaign's
/// `disk-full` left a broker that could commit nothing after the disk was freed. Here SQLite's own
/// rollback is a `ROLLBACK` statement run inside the transaction, which sqlx does not see.
#[tokio::test]
async fn a_transaction_sqlite_ended_does_not_block_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let c = SqliteCoordinator::open(
        &dir.path().join("coordinator.db"),
        Default::default(),
        ManualClock::new(1_000),
    )
    .await
    .unwrap();
    {
        let mut writer = c.write().await.unwrap();
        let mut tx = writer.begin().await.unwrap();
        sqlx::query("ROLLBACK").execute(&mut *tx).await.unwrap();
        drop(tx); // sqlx's own ROLLBACK now fails: "no transaction is active"
    }
    {
        // The write connection is stuck as the campaign found it.
        let mut guard = c.writer.lock().await;
        let conn = guard.as_mut().unwrap();
        sqlx::Connection::ping(&mut *conn).await.unwrap();
        assert!(sqlx::Connection::is_in_transaction(&*conn));
    }
    let topic = Uuid::from_u128(9);
    c.create_topic(CreateTopicRequest {
        topic_id: topic,
        name: "after".into(),
        partitions: 1,
        config: TopicConfig::default(),
    })
    .await
    .expect("a write after SQLite ended a transaction by itself");
    let p = TopicIdPartition::new(topic, 0);
    let r = c
        .commit_file(CommitFileRequest {
            object_key: "wal/after".into(),
            uploader_broker_id: 1,
            object_size: 11,
            owners: vec![0],
            batches: vec![batch(p, 0, 5)],
        })
        .await
        .unwrap();
    assert_eq!((r[0].error, r[0].base_offset), (ErrorCode::None, 0));
}
