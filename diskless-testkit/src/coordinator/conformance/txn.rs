//! The transaction cases of the conformance suite (KIP-98: the partition leader's part, which the
//! coordinator takes; docs/transactions.md §2.3–2.4 and §4.2).
//!
//! A producer's transaction in a partition opens with a transactional batch that the host's
//! transaction coordinator verified (`CommitBatch::txn_seq`), goes on with transactional batches
//! of the same epoch, and ends with a marker (`write_txn_markers`). The last stable offset is the
//! first offset of the earliest open transaction; `read_committed` reads stop there and report the
//! aborted transactions of what they return.

use super::*;
use diskless_coordinator::{
    AbortedTxn, EndTxnMarker, FindBatchesResponse, IsolationLevel, TXN_MARKER_SIZE, TxnAnswer,
    TxnMarker, TxnMarkerResult, TxnRecord, TxnStatus, TxnTransition,
};

/// A transactional batch: idempotent fields as [`idem`], verified for transaction `txn_seq`
/// (`None`: not verified).
fn txn(
    p: TopicIdPartition,
    pid: i64,
    epoch: i16,
    seq: i32,
    records: i32,
    txn_seq: Option<i64>,
) -> CommitBatch {
    CommitBatch {
        transactional: true,
        txn_seq,
        ..idem(p, pid, epoch, seq, records)
    }
}

/// A marker of coordinator epoch 0.
fn marker(
    p: TopicIdPartition,
    pid: i64,
    epoch: i16,
    commit: bool,
    txn_seq: Option<i64>,
) -> TxnMarker {
    TxnMarker {
        partition: p,
        producer_id: pid,
        producer_epoch: epoch,
        coordinator_epoch: 0,
        commit,
        txn_seq,
    }
}

async fn write_markers(h: &Harness, markers: &[TxnMarker]) -> Vec<TxnMarkerResult> {
    let results = h
        .coordinator
        .write_txn_markers(markers)
        .await
        .expect("write_txn_markers");
    assert_eq!(results.len(), markers.len(), "one result per marker");
    results
}

/// Writes one marker; its result.
async fn end(h: &Harness, m: TxnMarker) -> TxnMarkerResult {
    write_markers(h, &[m]).await.remove(0)
}

fn marker_at(r: &TxnMarkerResult, offset: i64) {
    assert_eq!(
        r,
        &TxnMarkerResult {
            error: ErrorCode::None,
            offset,
            duplicate: false
        }
    );
}

/// A fetch of `p` from `offset` without byte limits.
async fn fetch(
    h: &Harness,
    p: TopicIdPartition,
    offset: i64,
    isolation: IsolationLevel,
) -> FindBatchesResponse {
    fetch_limited(h, p, offset, isolation, u32::MAX).await
}

async fn fetch_limited(
    h: &Harness,
    p: TopicIdPartition,
    offset: i64,
    isolation: IsolationLevel,
    max_bytes: u32,
) -> FindBatchesResponse {
    h.coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: p,
                offset,
                max_bytes,
                isolation,
            }],
            u32::MAX,
        )
        .await
        .expect("find_batches")
        .remove(0)
}

/// A `read_committed` fetch from `offset`: (base offsets of the batches, last stable offset,
/// aborted transactions).
async fn committed(
    h: &Harness,
    p: TopicIdPartition,
    offset: i64,
) -> (Vec<i64>, i64, Vec<AbortedTxn>) {
    let r = fetch(h, p, offset, IsolationLevel::ReadCommitted).await;
    assert_eq!(r.error, ErrorCode::None, "{r:?}");
    let aborted = r
        .aborted
        .expect("read_committed reports aborted transactions");
    (
        r.batches.iter().map(|b| b.base_offset).collect(),
        r.last_stable_offset,
        aborted,
    )
}

/// The last stable offset of `p`.
async fn lso(h: &Harness, p: TopicIdPartition) -> i64 {
    fetch(
        h,
        p,
        list(h, p, EARLIEST_TIMESTAMP).await.offset,
        Default::default(),
    )
    .await
    .last_stable_offset
}

async fn list_committed(h: &Harness, p: TopicIdPartition, timestamp: i64) -> ListOffsetsResponse {
    h.coordinator
        .list_offsets(&[ListOffsetsRequest {
            partition: p,
            timestamp,
            isolation: IsolationLevel::ReadCommitted,
        }])
        .await
        .expect("list_offsets")
        .remove(0)
}

fn aborted(producer_id: i64, first_offset: i64, last_offset: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id,
        first_offset,
        last_offset,
    }
}

// ---------------------------------------------------------------------------------------------
// Appending transactional batches

/// A transactional batch opens a transaction only when the host verified it (KIP-890's server-side
/// verification): unverified, it is `INVALID_TXN_STATE` and changes nothing; verified, it is
/// appended, the producer's transaction opens at its offset and the last stable offset stays there.
pub async fn txn_first_batch_needs_verification(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, plain(p, 2, 100, START_MS)).await, 0);
    rejected(
        &commit_one(&h, txn(p, 7, 0, 0, 3, None)).await,
        ErrorCode::InvalidTxnState,
    );
    assert_eq!(
        producer(&h, p, 7).await,
        None,
        "a rejected batch leaves no state"
    );
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 2);
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 3, Some(1))).await, 2);
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(state.current_txn_first_offset, Some(2));
    assert_eq!(state.current_txn_start_ms, START_MS);
    assert_eq!(state.last_ended_txn, -1);
    assert_eq!(lso(&h, p).await, 2);
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 5);
}

/// Within an open transaction, later batches of the same epoch need no verification; a
/// verification number on them changes nothing.
pub async fn txn_continues_without_verification_same_epoch(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(1))).await, 0);
    ok_at(&commit_one(&h, txn(p, 7, 0, 1, 2, None)).await, 1);
    ok_at(&commit_one(&h, txn(p, 7, 0, 3, 1, Some(1))).await, 3);
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(state.current_txn_first_offset, Some(0));
    assert_eq!(
        state.batches.len(),
        3,
        "the idempotence window keeps transactional batches"
    );
    assert_eq!(lso(&h, p).await, 0);
}

/// A transactional batch needs a producer id (`INVALID_RECORD`); while a transaction is open a
/// plain batch of the same producer is `INVALID_TXN_STATE` (Kafka's `appendDataBatch`), while
/// other producers' plain batches go on.
pub async fn txn_plain_batch_during_txn_rejected(h: Harness) {
    let p = partition(&h).await;
    let no_pid = CommitBatch {
        transactional: true,
        txn_seq: Some(1),
        ..plain(p, 1, 100, START_MS)
    };
    rejected(&commit_one(&h, no_pid).await, ErrorCode::InvalidRecord);
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(1))).await, 0);
    rejected(
        &commit_one(&h, idem(p, 7, 0, 1, 1)).await,
        ErrorCode::InvalidTxnState,
    );
    ok_at(&commit_one(&h, idem(p, 8, 0, 0, 1)).await, 1);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 2);
    // After the marker the producer may write plain batches again.
    marker_at(&end(&h, marker(p, 7, 0, true, Some(1))).await, 3);
    ok_at(&commit_one(&h, idem(p, 7, 0, 1, 1)).await, 4);
}

/// A batch of a higher epoch while the producer's transaction is still open (transaction
/// version 2 bumps the epoch per transaction: the next transaction before this one's marker) is
/// `INVALID_TXN_STATE`, verified or not; an older epoch is `INVALID_PRODUCER_EPOCH`.
pub async fn txn_next_epoch_before_marker_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 3, 0, 1, Some(1))).await, 0);
    rejected(
        &commit_one(&h, txn(p, 7, 4, 0, 1, Some(2))).await,
        ErrorCode::InvalidTxnState,
    );
    rejected(
        &commit_one(&h, txn(p, 7, 2, 0, 1, Some(2))).await,
        ErrorCode::InvalidProducerEpoch,
    );
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(
        (state.producer_epoch, state.current_txn_first_offset),
        (3, Some(0))
    );
    marker_at(&end(&h, marker(p, 7, 3, true, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 7, 4, 0, 1, Some(2))).await, 2);
    assert_eq!(
        producer(&h, p, 7)
            .await
            .expect("state")
            .current_txn_first_offset,
        Some(2)
    );
}

/// While a transaction is open in the partition, a batch verified for another transaction of the
/// producer (same epoch: transaction version 1 keeps it across transactions) does not join it: a
/// newer one is `CONCURRENT_TRANSACTIONS` (the open transaction's marker has not been written here
/// yet; retriable), an older one `INVALID_TXN_STATE`. Issue #31: a host that lost the first
/// transaction's marker let the next one's batches join it, and the next COMMIT marker made the
/// aborted records visible to `read_committed`.
pub async fn txn_batch_of_another_transaction_rejected_while_one_is_open(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(5))).await, 0);
    assert_eq!(
        producer(&h, p, 7).await.expect("state").current_txn_seq,
        Some(5),
        "the open transaction's number is kept"
    );
    rejected(
        &commit_one(&h, txn(p, 7, 0, 2, 1, Some(6))).await,
        ErrorCode::ConcurrentTransactions,
    );
    rejected(
        &commit_one(&h, txn(p, 7, 0, 2, 1, Some(4))).await,
        ErrorCode::InvalidTxnState,
    );
    // Within one request too: the batch that opens the transaction sets its number.
    let p2 = partition(&h).await;
    let rs = commit(
        &h,
        vec![txn(p2, 7, 0, 0, 1, Some(5)), txn(p2, 7, 0, 1, 1, Some(6))],
    )
    .await;
    ok_at(&rs[0], 0);
    rejected(&rs[1], ErrorCode::ConcurrentTransactions);
    // The open transaction goes on, verified or not.
    ok_at(&commit_one(&h, txn(p, 7, 0, 2, 1, Some(5))).await, 2);
    ok_at(&commit_one(&h, txn(p, 7, 0, 3, 1, None)).await, 3);
    assert_eq!(lso(&h, p).await, 0);
    // Once its marker is written, the refused batch, retried, opens the next transaction.
    marker_at(&end(&h, marker(p, 7, 0, false, Some(5))).await, 4);
    assert_eq!(
        producer(&h, p, 7).await.expect("state").current_txn_seq,
        None
    );
    ok_at(&commit_one(&h, txn(p, 7, 0, 4, 1, Some(6))).await, 5);
    assert_eq!(
        producer(&h, p, 7).await.expect("state").current_txn_seq,
        Some(6)
    );
}

// ---------------------------------------------------------------------------------------------
// Markers

/// A marker takes one offset as a 78-byte control coordinate with no object, its timestamps the
/// coordinator's now; it ends the transaction and the last stable offset moves to the high
/// watermark. The producer keeps its window; its last append time is the marker's.
pub async fn txn_commit_marker_ends_txn_and_moves_lso(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(1))).await, 0);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 2);
    assert_eq!(lso(&h, p).await, 0);
    h.clock.advance(10);
    let mut m = marker(p, 7, 0, true, Some(1));
    m.coordinator_epoch = 4;
    marker_at(&end(&h, m).await, 3);
    let (batches, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 4);
    assert_eq!(lso(&h, p).await, 4);
    let c = batches.last().expect("the marker");
    assert_eq!(
        c,
        &BatchCoordinate {
            object_key: String::new(),
            object_size: 0,
            byte_offset: 0,
            byte_size: TXN_MARKER_SIZE,
            base_offset: 3,
            last_offset: 3,
            base_timestamp: START_MS + 10,
            max_timestamp: START_MS + 10,
            timestamp_type: TimestampType::CreateTime,
            log_append_time: NO_TIMESTAMP,
            producer_id: 7,
            producer_epoch: 0,
            base_sequence: NO_SEQUENCE,
            last_sequence: NO_SEQUENCE,
            control: Some(EndTxnMarker {
                commit: true,
                coordinator_epoch: 4
            }),
        }
    );
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(state.current_txn_first_offset, None);
    assert_eq!(state.current_txn_start_ms, -1);
    assert_eq!(state.coordinator_epoch, 4);
    assert_eq!(state.last_ended_txn, 1);
    assert_eq!(state.last_marker_offset, 3);
    assert_eq!(state.last_append_ms, START_MS + 10);
    assert_eq!(state.batches.len(), 1, "same epoch: the window is kept");
    let (offsets, lso, aborted) = committed(&h, p, 0).await;
    assert_eq!((offsets, lso, aborted), (vec![0, 2, 3], 4, vec![]));
}

/// An ABORT marker records the aborted transaction (producer, first offset, marker offset), which
/// `read_committed` fetches over it report; a LogAppendTime topic stamps the marker like a batch.
pub async fn txn_abort_marker_records_aborted_txn(h: Harness) {
    let t = topic_with(
        &h,
        &format!("txn-lat-{}", fresh_id()),
        1,
        TopicConfig::default().with_timestamp_type(TimestampType::LogAppendTime),
    )
    .await;
    let p = tp(t, 0);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 0);
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(1))).await, 1);
    h.clock.advance(5);
    marker_at(&end(&h, marker(p, 7, 0, false, Some(1))).await, 3);
    let (batches, _, _) = all_batches(&h, p).await;
    let c = &batches[2];
    assert_eq!(
        (
            c.control,
            c.timestamp_type,
            c.log_append_time,
            c.effective_max_timestamp()
        ),
        (
            Some(EndTxnMarker {
                commit: false,
                coordinator_epoch: 0
            }),
            TimestampType::LogAppendTime,
            START_MS + 5,
            START_MS + 5
        )
    );
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0, 1, 3], 4, vec![aborted(7, 1, 3)])
    );
    assert_eq!(
        committed(&h, p, 3).await,
        (vec![3], 4, vec![aborted(7, 1, 3)])
    );
    assert_eq!(committed(&h, p, 4).await, (vec![], 4, vec![]));
}

/// A marker for a partition where the producer wrote nothing (a transaction version 1 partition
/// added but never produced to) still takes an offset, and creates the producer's state.
pub async fn txn_marker_without_data_takes_an_offset(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, plain(p, 2, 100, START_MS)).await, 0);
    marker_at(&end(&h, marker(p, 9, 2, false, Some(5))).await, 2);
    let state = producer(&h, p, 9).await.expect("the marker made the state");
    assert_eq!(
        (
            state.producer_epoch,
            state.last_ended_txn,
            state.last_marker_offset,
            state.current_txn_first_offset
        ),
        (2, 5, 2, None)
    );
    assert!(state.batches.is_empty());
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0, 2], 3, vec![]),
        "an abort with no open transaction records nothing"
    );
}

/// A marker of a transaction already ended (same or older `txn_seq`) writes nothing and answers the
/// last marker's offset; one without `txn_seq` (an operator's abort) is never deduplicated.
pub async fn txn_marker_is_idempotent_per_txn_seq(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(3))).await, 0);
    marker_at(&end(&h, marker(p, 7, 0, true, Some(3))).await, 1);
    let again = end(&h, marker(p, 7, 0, true, Some(3))).await;
    assert_eq!(
        again,
        TxnMarkerResult {
            error: ErrorCode::None,
            offset: 1,
            duplicate: true
        }
    );
    let older = end(&h, marker(p, 7, 0, false, Some(2))).await;
    assert!(older.duplicate && older.offset == 1, "{older:?}");
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 2, "no second marker");
    marker_at(&end(&h, marker(p, 7, 0, false, None)).await, 2);
    marker_at(&end(&h, marker(p, 7, 0, false, None)).await, 3);
    // Two markers of one call for the same partition and transaction: the second repeats the first.
    ok_at(&commit_one(&h, txn(p, 7, 0, 1, 1, Some(4))).await, 4);
    let rs = write_markers(
        &h,
        &[
            marker(p, 7, 0, true, Some(4)),
            marker(p, 7, 0, true, Some(4)),
        ],
    )
    .await;
    marker_at(&rs[0], 5);
    assert_eq!(
        rs[1],
        TxnMarkerResult {
            error: ErrorCode::None,
            offset: 5,
            duplicate: true
        }
    );
}

/// A marker ends only the transaction it names: one of a transaction newer than the open one is
/// `CONCURRENT_TRANSACTIONS` and writes nothing (the open one's own marker may still come, with
/// another outcome); one of an older transaction, which has nothing in the partition while this
/// one is open, is answered as a duplicate and writes nothing. Then the open transaction's own
/// ABORT ends it, and `read_committed` never sees its records (issue #31's seed 21, where a later
/// COMMIT ended an aborted transaction whose ABORT marker was lost).
pub async fn txn_marker_ends_only_the_transaction_it_names(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(5))).await, 0);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 2);
    let newer = end(&h, marker(p, 7, 0, true, Some(6))).await;
    assert_eq!(
        newer,
        TxnMarkerResult::error(ErrorCode::ConcurrentTransactions)
    );
    let older = end(&h, marker(p, 7, 0, true, Some(4))).await;
    assert_eq!(
        older,
        TxnMarkerResult {
            error: ErrorCode::None,
            offset: -1,
            duplicate: true
        }
    );
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 3, "neither marker was written");
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(
        (state.current_txn_first_offset, state.current_txn_seq),
        (Some(0), Some(5)),
        "the transaction is still open"
    );
    assert_eq!(lso(&h, p).await, 0);
    // Its own ABORT ends it; then the newer transaction's COMMIT is a marker without data.
    marker_at(&end(&h, marker(p, 7, 0, false, Some(5))).await, 3);
    marker_at(&end(&h, marker(p, 7, 0, true, Some(6))).await, 4);
    let (batches, last_stable, aborted_txns) = committed(&h, p, 0).await;
    assert_eq!(batches, vec![0, 2, 3, 4]);
    assert_eq!(last_stable, 5);
    assert_eq!(aborted_txns, vec![aborted(7, 0, 3)]);
    // An operator's abort (no number) ends whatever is open.
    ok_at(&commit_one(&h, txn(p, 7, 0, 2, 1, Some(9))).await, 5);
    marker_at(&end(&h, marker(p, 7, 0, false, None)).await, 6);
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(
        (state.current_txn_first_offset, state.current_txn_seq),
        (None, None)
    );
}

/// The race the verification number closes: a batch verified for a transaction that has since
/// ended (its commit delayed past the marker) cannot open a transaction nobody would end.
pub async fn txn_stale_verified_batch_after_marker_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 7, 0, false, Some(1))).await, 1);
    // The retried batch of the ended transaction, seen as new (another sequence): refused.
    rejected(
        &commit_one(&h, txn(p, 7, 0, 1, 1, Some(1))).await,
        ErrorCode::InvalidTxnState,
    );
    assert_eq!(lso(&h, p).await, 2, "no transaction opened");
    // The next transaction's batch is accepted.
    ok_at(&commit_one(&h, txn(p, 7, 0, 1, 1, Some(2))).await, 2);
}

/// A retried batch that was appended answers its original offset even after its transaction
/// ended (duplicates are recognised before the transaction rules, as in Kafka).
pub async fn txn_duplicate_after_end_answers_original_offsets(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 7, 0, true, Some(1))).await, 2);
    dup_of(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(1))).await, 0);
    dup_of(&commit_one(&h, txn(p, 7, 0, 0, 2, None)).await, 0);
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 3);
}

/// Markers are judged like batches: an older producer epoch is `INVALID_PRODUCER_EPOCH`, then an
/// older coordinator epoch `TRANSACTION_COORDINATOR_FENCED`; neither writes anything.
pub async fn txn_marker_epoch_checks(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 5, 0, 1, Some(1))).await, 0);
    let mut m = marker(p, 7, 5, true, Some(1));
    m.coordinator_epoch = 3;
    let mut stale_both = marker(p, 7, 4, true, Some(1));
    stale_both.coordinator_epoch = 2;
    assert_eq!(
        end(&h, stale_both).await,
        TxnMarkerResult::error(ErrorCode::InvalidProducerEpoch)
    );
    marker_at(&end(&h, m).await, 1);
    ok_at(&commit_one(&h, txn(p, 7, 5, 1, 1, Some(2))).await, 2);
    let mut old_coordinator = marker(p, 7, 5, false, Some(2));
    old_coordinator.coordinator_epoch = 2;
    assert_eq!(
        end(&h, old_coordinator).await,
        TxnMarkerResult::error(ErrorCode::TransactionCoordinatorFenced)
    );
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 3, "refused markers take no offset");
    assert_eq!(
        producer(&h, p, 7)
            .await
            .expect("state")
            .current_txn_first_offset,
        Some(2)
    );
}

/// Fencing (InitProducerId while a transaction is open, or its timeout): the coordinator aborts
/// with the bumped epoch; the marker ends the old epoch's transaction, the window restarts, and
/// the zombie's batches of the old epoch are `INVALID_PRODUCER_EPOCH`.
pub async fn txn_fence_marker_bumps_epoch_and_rejects_zombie(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 7, 1, false, Some(1))).await, 1);
    let state = producer(&h, p, 7).await.expect("state");
    assert_eq!(
        (
            state.producer_epoch,
            state.current_txn_first_offset,
            state.batches.len()
        ),
        (1, None, 0)
    );
    rejected(
        &commit_one(&h, txn(p, 7, 0, 1, 1, None)).await,
        ErrorCode::InvalidProducerEpoch,
    );
    rejected(
        &commit_one(&h, txn(p, 7, 0, 1, 1, Some(2))).await,
        ErrorCode::InvalidProducerEpoch,
    );
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0, 1], 2, vec![aborted(7, 0, 1)])
    );
}

/// One call writes markers for many partitions; unknown partitions are answered alone.
pub async fn txn_markers_many_partitions(h: Harness) {
    let t = topic(&h, 3).await;
    for i in 0..3 {
        ok_at(&commit_one(&h, txn(tp(t, i), 7, 0, 0, 1, Some(1))).await, 0);
    }
    let rs = write_markers(
        &h,
        &[
            marker(tp(t, 2), 7, 0, true, Some(1)),
            marker(tp(t, 3), 7, 0, true, Some(1)),
            marker(tp(fresh_id(), 0), 7, 0, true, Some(1)),
            marker(tp(t, 0), 7, 0, true, Some(1)),
            marker(tp(t, 1), 7, 0, true, Some(1)),
        ],
    )
    .await;
    marker_at(&rs[0], 1);
    assert_eq!(
        rs[1],
        TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition)
    );
    assert_eq!(
        rs[2],
        TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition)
    );
    marker_at(&rs[3], 1);
    marker_at(&rs[4], 1);
    for i in 0..3 {
        assert_eq!(lso(&h, tp(t, i)).await, 2);
    }
    assert!(write_markers(&h, &[]).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Reading: last stable offset, read_committed, ListOffsets

/// `read_committed` returns only batches below the last stable offset: from an offset at or
/// above it, no batches (and an empty aborted list), whatever lies up to the high watermark.
/// Offsets outside the log are still `OFFSET_OUT_OF_RANGE`.
pub async fn read_committed_stops_at_lso(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, plain(p, 2, 100, START_MS)).await, 0);
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(1))).await, 2);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 4);
    assert_eq!(committed(&h, p, 0).await, (vec![0], 2, vec![]));
    assert_eq!(committed(&h, p, 1).await, (vec![0], 2, vec![]));
    assert_eq!(committed(&h, p, 2).await, (vec![], 2, vec![]));
    assert_eq!(committed(&h, p, 4).await, (vec![], 2, vec![]));
    assert_eq!(
        committed(&h, p, 5).await,
        (vec![], 2, vec![]),
        "at the high watermark"
    );
    let r = fetch(&h, p, 6, IsolationLevel::ReadCommitted).await;
    assert_eq!(r.error, ErrorCode::OffsetOutOfRange);
    assert_eq!((r.last_stable_offset, r.aborted), (-1, None));
    marker_at(&end(&h, marker(p, 7, 0, true, Some(1))).await, 5);
    assert_eq!(committed(&h, p, 1).await, (vec![0, 2, 4, 5], 6, vec![]));
}

/// `read_uncommitted` reads up to the high watermark, reports the last stable offset and no
/// aborted list.
pub async fn read_uncommitted_reports_lso_without_aborted(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 7, 0, false, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 7, 0, 1, 1, Some(2))).await, 2);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 3);
    let r = fetch(&h, p, 0, IsolationLevel::ReadUncommitted).await;
    assert_eq!(r.error, ErrorCode::None);
    assert_eq!(r.batches.len(), 4);
    assert_eq!(
        (r.high_watermark, r.last_stable_offset, r.aborted),
        (4, 2, None)
    );
}

/// Two producers' transactions interleaved: the last stable offset is the earliest open first
/// offset; an abort's recorded stable offset is the other producer's first offset, so a fetch
/// reports aborted transactions per Kafka's `collectAbortedTxns`.
pub async fn two_producers_interleaved_lso_is_min(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, txn(p, 1, 0, 0, 1, Some(1))).await, 0);
    ok_at(&commit_one(&h, txn(p, 2, 0, 0, 1, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 1, 0, 1, 1, None)).await, 2);
    assert_eq!(lso(&h, p).await, 0);
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 3);
    assert_eq!(lso(&h, p).await, 1, "producer 2 is still open at 1");
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0], 1, vec![aborted(1, 0, 3)]),
        "batch 0 is below the LSO and aborted: reported so the consumer skips it"
    );
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 4);
    marker_at(&end(&h, marker(p, 2, 0, true, Some(1))).await, 5);
    assert_eq!(lso(&h, p).await, 6);
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0, 1, 2, 3, 4, 5], 6, vec![aborted(1, 0, 3)])
    );
    // From offset 4 the abort (marker 3) is behind the fetch: not reported.
    assert_eq!(committed(&h, p, 4).await, (vec![4, 5], 6, vec![]));
}

/// The aborted list covers exactly the returned range: entries whose marker is at or after the
/// fetch offset and whose first offset is before the end of the last returned batch, stopping at
/// the first entry whose recorded stable offset reaches that end (Kafka's
/// `TransactionIndex.collectAbortedTxns`). Byte limits shrink the range and the list with it.
pub async fn read_committed_aborted_range_semantics(h: Harness) {
    let p = partition(&h).await;
    // Producer 1 aborts 0..=1, producer 2 aborts 2..=4, producer 3 aborts 5..=6.
    ok_at(&commit_one(&h, txn(p, 1, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 2, 0, 0, 1, Some(1))).await, 2);
    ok_at(&commit_one(&h, txn(p, 2, 0, 1, 1, None)).await, 3);
    marker_at(&end(&h, marker(p, 2, 0, false, Some(1))).await, 4);
    ok_at(&commit_one(&h, txn(p, 3, 0, 0, 1, Some(1))).await, 5);
    marker_at(&end(&h, marker(p, 3, 0, false, Some(1))).await, 6);
    assert_eq!(
        committed(&h, p, 0).await,
        (
            vec![0, 1, 2, 3, 4, 5, 6],
            7,
            vec![aborted(1, 0, 1), aborted(2, 2, 4), aborted(3, 5, 6)]
        )
    );
    assert_eq!(
        committed(&h, p, 2).await.2,
        vec![aborted(2, 2, 4), aborted(3, 5, 6)]
    );
    // Three 100-byte batches from offset 0 (0, 1 and 2: the marker counts 78): the range ends at
    // 3, so producer 3's abort (first offset 5) is not reported, and the stop rule ends the list
    // at producer 2's entry (its recorded stable offset 5 reaches 3).
    let r = fetch_limited(&h, p, 0, IsolationLevel::ReadCommitted, 278).await;
    assert_eq!(
        r.batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(r.aborted, Some(vec![aborted(1, 0, 1), aborted(2, 2, 4)]));
    // One batch from offset 3 (inside producer 2's aborted range): its entry is reported.
    let r = fetch_limited(&h, p, 3, IsolationLevel::ReadCommitted, 1).await;
    assert_eq!(r.batches.len(), 1);
    assert_eq!(r.aborted, Some(vec![aborted(2, 2, 4)]));
}

/// ListOffsets under `read_committed`: LATEST is the last stable offset; a timestamp or
/// MAX_TIMESTAMP lookup that lands at or above it finds nothing (-1); EARLIEST is unchanged.
pub async fn list_offsets_read_committed(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS - 100)).await, 0);
    ok_at(
        &commit_one(
            &h,
            CommitBatch {
                base_timestamp: START_MS - 10,
                max_timestamp: START_MS - 10,
                ..txn(p, 7, 0, 0, 1, Some(1))
            },
        )
        .await,
        1,
    );
    let latest = list_committed(&h, p, LATEST_TIMESTAMP).await;
    assert_eq!((latest.error, latest.offset), (ErrorCode::None, 1));
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 2);
    assert_eq!(list_committed(&h, p, EARLIEST_TIMESTAMP).await.offset, 0);
    let hit = list_committed(&h, p, START_MS - 50).await;
    assert_eq!(
        (hit.offset, hit.timestamp),
        (-1, NO_TIMESTAMP),
        "found 1 ≥ LSO"
    );
    assert_eq!(list(&h, p, START_MS - 50).await.offset, 1);
    let early = list_committed(&h, p, START_MS - 200).await;
    assert_eq!((early.offset, early.timestamp), (0, START_MS - 100));
    let max = list_committed(&h, p, MAX_TIMESTAMP).await;
    assert_eq!((max.offset, max.timestamp), (-1, NO_TIMESTAMP));
    h.clock.advance(1);
    marker_at(&end(&h, marker(p, 7, 0, true, Some(1))).await, 2);
    let max = list_committed(&h, p, MAX_TIMESTAMP).await;
    assert_eq!(
        (max.offset, max.timestamp),
        (2, START_MS + 1),
        "the marker has the largest timestamp"
    );
    assert_eq!(list_committed(&h, p, LATEST_TIMESTAMP).await.offset, 3);
    let hit = list_committed(&h, p, START_MS - 50).await;
    assert_eq!((hit.offset, hit.timestamp), (1, START_MS - 10));
    let marker_time = list_committed(&h, p, START_MS).await;
    assert_eq!(
        (marker_time.offset, marker_time.timestamp),
        (2, START_MS + 1)
    );
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

/// DeleteRecords may cut into an open transaction (bounded by the high watermark, as Kafka): the
/// last stable offset is then the log start; aborted transactions whose marker went are dropped.
/// A marker releases no object bytes.
pub async fn delete_records_through_open_txn_clamps_lso(h: Harness) {
    let p = partition(&h).await;
    let key = new_key();
    commit_key(&h, &key, vec![txn(p, 1, 0, 0, 1, Some(1))]).await;
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 2, 0, 0, 2, Some(1))).await, 2);
    ok_at(&commit_one(&h, plain(p, 1, 100, START_MS)).await, 4);
    assert_eq!(lso(&h, p).await, 2);
    assert_eq!(delete_records(&h, p, 1).await, (ErrorCode::None, 1));
    assert_eq!(info_of(&h, &key).await.live_bytes, 0);
    assert_eq!(committed(&h, p, 1).await.2, vec![aborted(1, 0, 1)]);
    assert_eq!(delete_records(&h, p, 3).await, (ErrorCode::None, 3));
    assert_eq!(lso(&h, p).await, 3, "raised to the log start");
    assert_eq!(committed(&h, p, 3).await, (vec![], 3, vec![]));
    assert_eq!(
        producer(&h, p, 2)
            .await
            .expect("state")
            .current_txn_first_offset,
        Some(2),
        "the transaction stays open until its marker"
    );
    marker_at(&end(&h, marker(p, 2, 0, false, Some(1))).await, 5);
    assert_eq!(
        committed(&h, p, 3).await,
        (vec![2, 4, 5], 6, vec![aborted(2, 2, 5)])
    );
    assert_eq!(delete_records(&h, p, 6).await, (ErrorCode::None, 6));
    assert_eq!(committed(&h, p, 6).await, (vec![], 6, vec![]));
}

/// Retention deletes markers like batches (by their timestamps) and drops the aborted
/// transactions behind the new log start; a producer with an open transaction never expires.
pub async fn retention_and_expiry_with_transactions(h: Harness) {
    let t = topic_with(
        &h,
        &format!("txn-retention-{}", fresh_id()),
        1,
        TopicConfig::default()
            .with_retention_ms(1_000)
            .with_producer_id_expiration_ms(1_000),
    )
    .await;
    let p = tp(t, 0);
    ok_at(&commit_one(&h, txn(p, 1, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 2, 0, 0, 1, Some(1))).await, 2);
    h.clock.advance(2_000);
    let report = retention_pass(&h).await;
    assert_eq!(report.batches_deleted, 3, "two batches and the marker");
    let (batches, log_start, hwm) = all_batches(&h, p).await;
    assert_eq!((batches.len(), log_start, hwm), (0, 3, 3));
    assert_eq!(committed(&h, p, 3).await, (vec![], 3, vec![]));
    // Producer expiry waits for its floor (twice max_commit_age) over the topic's 1 s.
    h.clock.advance(floor_ms());
    let expired = h
        .coordinator
        .expire_producers(100)
        .await
        .expect("expire_producers");
    assert_eq!(
        expired.expired, 1,
        "producer 1 only: producer 2's transaction is open"
    );
    assert_eq!(producer(&h, p, 1).await, None);
    assert!(producer(&h, p, 2).await.is_some());
    marker_at(&end(&h, marker(p, 2, 0, true, Some(1))).await, 3);
    h.clock.advance(floor_ms() - 1);
    let expired = h.coordinator.expire_producers(100).await.expect("expire");
    assert_eq!(expired.expired, 0, "counted from its marker");
    h.clock.advance(1);
    let expired = h.coordinator.expire_producers(100).await.expect("expire");
    assert_eq!(expired.expired, 1, "counted from its marker");
}

/// Issue #25, reproduction 1: a second batch of transaction 1, stalled in upload while the
/// transaction was aborted, lands after the producer's state would have expired by the topic's
/// `producer.id.expiration.ms` (60 s), within its commit deadline. It must be refused
/// (`INVALID_TXN_STATE`, as without expiry), not open a transaction nothing will ever end (a last
/// stable offset stuck below the high watermark: `read_committed` readers and tiering blocked).
pub async fn late_txn_batch_after_expiration_is_still_refused(h: Harness) {
    let t = topic_with(
        &h,
        &format!("txn-late-{}", fresh_id()),
        1,
        TopicConfig::default().with_producer_id_expiration_ms(60_000),
    )
    .await;
    let p = tp(t, 0);
    ok_at(&commit_one(&h, txn(p, 1, 0, 0, 1, Some(1))).await, 0);
    // The second batch's segment is made, then stalls in upload; the transaction is aborted.
    let stalled = v7_key(h.clock.now_ms());
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 1);
    h.clock.advance(61_000);
    let r = h.coordinator.expire_producers(100).await.expect("expire");
    assert_eq!(r.expired, 0, "the state a late commit needs is kept");
    rejected(
        &commit_key(&h, &stalled, vec![txn(p, 1, 0, 1, 1, Some(1))]).await[0],
        ErrorCode::InvalidTxnState,
    );
    assert_eq!(lso(&h, p).await, 2);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 2);
    assert_eq!(
        committed(&h, p, 0).await,
        (vec![0, 1], 2, vec![aborted(1, 0, 1)])
    );
}

/// Deleting a topic with an open transaction removes it whole; the topic's name can be reused
/// with no trace of the transaction.
pub async fn delete_topic_with_open_txn(h: Harness) {
    let name = format!("txn-gone-{}", fresh_id());
    let t = topic_with(&h, &name, 1, TopicConfig::default()).await;
    let p = tp(t, 0);
    ok_at(&commit_one(&h, txn(p, 1, 0, 0, 1, Some(1))).await, 0);
    marker_at(&end(&h, marker(p, 1, 0, false, Some(1))).await, 1);
    ok_at(&commit_one(&h, txn(p, 2, 0, 0, 1, Some(1))).await, 2);
    h.coordinator.delete_topic(t).await.expect("delete_topic");
    assert_eq!(
        end(&h, marker(p, 2, 0, true, Some(1))).await,
        TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition)
    );
    let again = topic_with(&h, &name, 1, TopicConfig::default()).await;
    let q = tp(again, 0);
    assert_eq!(producer(&h, q, 2).await, None);
    assert_eq!(committed(&h, q, 0).await, (vec![], 0, vec![]));
    assert!(
        h.coordinator
            .list_producers(q)
            .await
            .expect("list_producers")
            .is_empty()
    );
}

// ---- Transaction records (`txn_transition`, `txn_endings`, `describe_txn`; issue #31) ----

/// Applies `t`, failing the case on a call error.
async fn transition(h: &Harness, t: TxnTransition) -> TxnAnswer {
    h.coordinator
        .txn_transition(t)
        .await
        .expect("txn_transition")
}

fn t_init(tid: &str, producer: Option<(i64, i16)>, timeout_ms: i64) -> TxnTransition {
    TxnTransition::Init {
        transactional_id: tid.into(),
        producer,
        timeout_ms,
    }
}

fn t_add(tid: &str, pid: i64, epoch: i16, partitions: &[TopicIdPartition]) -> TxnTransition {
    TxnTransition::AddPartitions {
        transactional_id: tid.into(),
        producer_id: pid,
        producer_epoch: epoch,
        partitions: partitions.to_vec(),
    }
}

fn t_end(tid: &str, pid: i64, epoch: i16, commit: bool) -> TxnTransition {
    TxnTransition::End {
        transactional_id: tid.into(),
        producer_id: pid,
        producer_epoch: epoch,
        commit,
    }
}

fn t_complete(record: &TxnRecord) -> TxnTransition {
    TxnTransition::Complete {
        transactional_id: record.transactional_id.clone(),
        producer_id: record.producer_id,
        txn_seq: record.txn_seq,
    }
}

/// The answer's record, which a transition that found or made one always returns.
fn record_of(answer: &TxnAnswer) -> TxnRecord {
    answer
        .record
        .clone()
        .expect("the answer carries the record")
}

/// A transaction record follows one transaction through Kafka's states: InitProducerId records
/// the producer (`Empty`); AddPartitionsToTxn opens the transaction with a number and its
/// partitions, which verify that producer's batches and no other's; EndTxn decides it before any
/// marker (a retry of the same outcome is `NONE`, the other outcome `INVALID_TXN_STATE`, and the
/// next transaction waits, `CONCURRENT_TRANSACTIONS`); `txn_endings` lists it until its markers
/// are written and `Complete` recorded; the next transaction takes a higher number. The markers
/// of the record end the transaction in the partitions, once.
pub async fn txn_record_follows_a_transaction_through_its_states(h: Harness) {
    let p = partition(&h).await;
    let other = tp(topic(&h, 2).await, 1);
    assert_eq!(h.coordinator.describe_txn("tx").await.unwrap(), None);
    let refused = transition(&h, t_add("tx", 7, 0, &[p])).await;
    assert_eq!(
        (refused.error, refused.record),
        (ErrorCode::InvalidProducerIdMapping, None),
        "no InitProducerId yet"
    );
    let init = transition(&h, t_init("tx", Some((7, 0)), 60_000)).await;
    assert_eq!(init.error, ErrorCode::None);
    let r = record_of(&init);
    assert_eq!(
        (r.producer_id, r.producer_epoch, r.timeout_ms, r.status),
        (7, 0, 60_000, TxnStatus::Empty)
    );
    let no_txn = transition(&h, t_end("tx", 7, 0, true)).await;
    assert_eq!(no_txn.error, ErrorCode::InvalidTxnState, "nothing to end");
    let opened = transition(&h, t_add("tx", 7, 0, &[other, p])).await;
    assert_eq!(opened.error, ErrorCode::None);
    let first = record_of(&opened);
    assert_eq!(first.status, TxnStatus::Ongoing);
    let mut both = vec![other, p];
    both.sort();
    assert_eq!(first.partitions, both);
    let again = transition(&h, t_add("tx", 7, 0, &[p])).await;
    assert_eq!(
        (again.error, record_of(&again)),
        (ErrorCode::None, first.clone()),
        "a repeat changes nothing"
    );
    assert_eq!(
        h.coordinator.describe_txn("tx").await.unwrap(),
        Some(first.clone())
    );
    let seq = first.txn_seq;
    assert_eq!(first.txn_seq_for(7, 0, p), Some(seq));
    assert_eq!(first.txn_seq_for(7, 1, p), None, "another epoch");
    assert_eq!(first.txn_seq_for(8, 0, p), None, "another producer");
    let fenced = transition(&h, t_add("tx", 7, 1, &[p])).await;
    assert_eq!(fenced.error, ErrorCode::ProducerFenced);
    let mapping = transition(&h, t_add("tx", 8, 0, &[p])).await;
    assert_eq!(mapping.error, ErrorCode::InvalidProducerIdMapping);
    // The verified batch, then the decision, then the markers.
    ok_at(&commit_one(&h, txn(p, 7, 0, 0, 2, Some(seq))).await, 0);
    assert!(
        h.coordinator.txn_endings(100).await.unwrap().is_empty(),
        "nothing decided"
    );
    let decided = transition(&h, t_end("tx", 7, 0, true)).await;
    assert_eq!(decided.error, ErrorCode::None);
    let prepared = record_of(&decided);
    assert_eq!(prepared.status, TxnStatus::PrepareCommit);
    assert_eq!(
        prepared.txn_seq_for(7, 0, p),
        None,
        "decided: no batch joins it"
    );
    for (t, code) in [
        (t_end("tx", 7, 0, true), ErrorCode::None),
        (t_end("tx", 7, 0, false), ErrorCode::InvalidTxnState),
        (t_add("tx", 7, 0, &[p]), ErrorCode::ConcurrentTransactions),
        (
            t_init("tx", Some((7, 1)), 60_000),
            ErrorCode::ConcurrentTransactions,
        ),
    ] {
        let answer = transition(&h, t.clone()).await;
        assert_eq!(
            (answer.error, record_of(&answer)),
            (code, prepared.clone()),
            "{t:?}"
        );
    }
    assert_eq!(
        h.coordinator.txn_endings(100).await.unwrap(),
        vec![prepared.clone()]
    );
    let markers = prepared.markers();
    assert_eq!(markers.len(), 2);
    assert!(
        markers
            .iter()
            .all(|m| m.commit && m.txn_seq == Some(seq) && m.producer_id == 7)
    );
    let results = write_markers(&h, &markers).await;
    assert!(
        results
            .iter()
            .all(|r| r.error == ErrorCode::None && !r.duplicate)
    );
    let p_marker = markers.iter().position(|m| m.partition == p).unwrap();
    assert_eq!(results[p_marker].offset, 2);
    assert!(
        write_markers(&h, &markers)
            .await
            .iter()
            .all(|r| r.duplicate),
        "written again by another broker: duplicates"
    );
    let done = transition(&h, t_complete(&prepared)).await;
    assert_eq!(done.error, ErrorCode::None);
    assert_eq!(record_of(&done).status, TxnStatus::CompleteCommit);
    let repeat = transition(&h, t_complete(&prepared)).await;
    assert_eq!(
        (repeat.error, record_of(&repeat)),
        (ErrorCode::None, record_of(&done))
    );
    assert!(h.coordinator.txn_endings(100).await.unwrap().is_empty());
    let late = transition(&h, t_end("tx", 7, 0, true)).await;
    assert_eq!(late.error, ErrorCode::None, "a late retry of the EndTxn");
    let (batches, last_stable, _) = committed(&h, p, 0).await;
    assert_eq!((batches, last_stable), (vec![0, 2], 3));
    // The next transaction: a higher number, its own partitions.
    let next = record_of(&transition(&h, t_add("tx", 7, 0, &[p])).await);
    assert_eq!(
        (next.status, next.partitions.clone()),
        (TxnStatus::Ongoing, vec![p])
    );
    assert!(next.txn_seq > seq, "{} after {seq}", next.txn_seq);
    // Records are per transactional id.
    assert_eq!(h.coordinator.describe_txn("tx2").await.unwrap(), None);
}

/// InitProducerId fences the open transaction: it is decided aborted at once
/// (`CONCURRENT_TRANSACTIONS` until its markers are written and recorded); then the new epoch is
/// recorded and an older one is `PRODUCER_FENCED`. Requests that contradict themselves are
/// `InvalidRequest`.
pub async fn txn_record_init_fences_the_open_transaction(h: Harness) {
    let p = partition(&h).await;
    transition(&h, t_init("tx", Some((3, 4)), 60_000)).await;
    let open = record_of(&transition(&h, t_add("tx", 3, 4, &[p])).await);
    ok_at(
        &commit_one(&h, txn(p, 3, 4, 0, 1, Some(open.txn_seq))).await,
        0,
    );
    let fence = transition(&h, t_init("tx", None, 60_000)).await;
    assert_eq!(fence.error, ErrorCode::ConcurrentTransactions);
    let aborting = record_of(&fence);
    assert_eq!(
        (aborting.status, aborting.fenced, aborting.txn_seq),
        (TxnStatus::PrepareAbort, true, open.txn_seq)
    );
    let late_commit = transition(&h, t_end("tx", 3, 4, true)).await;
    assert_eq!(
        late_commit.error,
        ErrorCode::ProducerFenced,
        "the fence decided it, and fenced the producer"
    );
    let still = transition(&h, t_init("tx", Some((3, 5)), 60_000)).await;
    assert_eq!(still.error, ErrorCode::ConcurrentTransactions);
    assert_eq!(
        h.coordinator.txn_endings(10).await.unwrap(),
        vec![aborting.clone()]
    );
    let results = write_markers(&h, &aborting.markers()).await;
    assert_eq!(results.len(), 1);
    marker_at(&results[0], 1);
    transition(&h, t_complete(&aborting)).await;
    let (batches, last_stable, aborted_txns) = committed(&h, p, 0).await;
    assert_eq!(
        (batches, last_stable),
        (vec![0, 1], 2),
        "the aborted batch and the ABORT"
    );
    assert_eq!(aborted_txns, vec![aborted(3, 0, 1)]);
    let check = transition(&h, t_init("tx", None, 60_000)).await;
    assert_eq!(
        check.error,
        ErrorCode::None,
        "nothing open: the check passes"
    );
    assert_eq!(record_of(&check).status, TxnStatus::CompleteAbort);
    let bumped = transition(&h, t_init("tx", Some((3, 5)), 30_000)).await;
    assert_eq!(bumped.error, ErrorCode::None);
    let r = record_of(&bumped);
    assert_eq!(
        (r.producer_epoch, r.timeout_ms, r.status, r.txn_seq),
        (5, 30_000, TxnStatus::Empty, open.txn_seq)
    );
    let stale = transition(&h, t_init("tx", Some((3, 4)), 30_000)).await;
    assert_eq!(
        (stale.error, record_of(&stale)),
        (ErrorCode::ProducerFenced, r.clone())
    );
    let old_epoch = transition(&h, t_add("tx", 3, 4, &[p])).await;
    assert_eq!(old_epoch.error, ErrorCode::ProducerFenced);
    // A new producer id for the transactional id (the epoch space ran out) is taken too.
    let other_id = transition(&h, t_init("tx", Some((9, 0)), 30_000)).await;
    assert_eq!(other_id.error, ErrorCode::None);
    for bad in [
        t_init("", None, 1),
        t_init("tx", None, 0),
        t_init("tx", None, i64::from(i32::MAX) + 1),
        t_init("tx", Some((-1, 0)), 1),
        t_add("tx", 9, -1, &[p]),
        t_add("tx", 9, 0, &[tp(p.topic_id, -1)]),
        t_end("tx", -2, 0, true),
    ] {
        let r = h.coordinator.txn_transition(bad.clone()).await;
        assert!(
            matches!(r, Err(CoordinatorError::InvalidRequest(_))),
            "{bad:?}: {r:?}"
        );
    }
    assert_eq!(
        record_of(&other_id),
        h.coordinator.describe_txn("tx").await.unwrap().unwrap()
    );
    // The fence alone, with nothing open (an InitProducerId before the host has the new epoch):
    // the recorded producer opens nothing until a producer is recorded again.
    let fence_only = transition(&h, t_init("tx", None, 30_000)).await;
    assert_eq!(fence_only.error, ErrorCode::None);
    assert!(record_of(&fence_only).fenced);
    let zombie = transition(&h, t_add("tx", 9, 0, &[p])).await;
    assert_eq!(zombie.error, ErrorCode::ProducerFenced);
    transition(&h, t_init("tx", Some((9, 1)), 30_000)).await;
    let next = transition(&h, t_add("tx", 9, 1, &[p])).await;
    assert_eq!(
        (next.error, record_of(&next).status),
        (ErrorCode::None, TxnStatus::Ongoing)
    );
    let with_nul = h.coordinator.txn_transition(t_init("t\0x", None, 1)).await;
    assert!(matches!(with_nul, Err(CoordinatorError::InvalidRequest(_))));
}

/// A transaction open longer than its timeout is aborted by `txn_endings` (at the coordinator's
/// clock), its producer's epoch fenced until the next InitProducerId, as Kafka's transaction
/// coordinator aborts it and bumps the epoch; one within its timeout is left alone.
pub async fn txn_record_timeout_aborts_and_fences(h: Harness) {
    let p = partition(&h).await;
    transition(&h, t_init("slow", Some((1, 0)), 50)).await;
    transition(&h, t_init("quick", Some((2, 0)), 600_000)).await;
    let open = record_of(&transition(&h, t_add("slow", 1, 0, &[p])).await);
    transition(&h, t_add("quick", 2, 0, &[])).await;
    // Past the timeout on the harness's clock and on a server's.
    h.clock.advance(200);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let endings = h.coordinator.txn_endings(10).await.unwrap();
    assert_eq!(endings.len(), 1, "{endings:?}");
    let aborting = &endings[0];
    assert_eq!(
        (
            aborting.transactional_id.as_str(),
            aborting.status,
            aborting.fenced,
            aborting.txn_seq
        ),
        ("slow", TxnStatus::PrepareAbort, true, open.txn_seq)
    );
    assert!(aborting.markers().iter().all(|m| !m.commit));
    assert_eq!(
        h.coordinator
            .describe_txn("quick")
            .await
            .unwrap()
            .unwrap()
            .status,
        TxnStatus::Ongoing
    );
    for t in [t_end("slow", 1, 0, true), t_add("slow", 1, 0, &[p])] {
        assert_eq!(transition(&h, t).await.error, ErrorCode::ProducerFenced);
    }
    transition(&h, t_complete(aborting)).await;
    let after = transition(&h, t_end("slow", 1, 0, false)).await;
    assert_eq!(
        after.error,
        ErrorCode::ProducerFenced,
        "fenced after it completed too"
    );
    let init = transition(&h, t_init("slow", Some((1, 1)), 50)).await;
    assert_eq!(init.error, ErrorCode::None);
    assert!(
        !record_of(&init).fenced,
        "the next InitProducerId lifts the fence"
    );
    assert_eq!(
        transition(&h, t_add("slow", 1, 1, &[p])).await.error,
        ErrorCode::None
    );
}

/// Concurrent transitions of one transactional id never lose one another: partitions added at
/// once all end up in the one transaction they open, and of InitProducerIds racing with
/// increasing epochs the highest epoch stays (each older one applied before it, or refused).
pub async fn txn_records_change_one_at_a_time(h: Harness) {
    let topic_id = topic(&h, 16).await;
    let c = &h.coordinator;
    let inits = futures::future::join_all((0..8i16).map(|epoch| async move {
        c.txn_transition(t_init("race", Some((11, epoch)), 60_000))
            .await
            .expect("txn_transition")
    }))
    .await;
    assert!(
        inits
            .iter()
            .all(|a| matches!(a.error, ErrorCode::None | ErrorCode::ProducerFenced)),
        "{inits:?}"
    );
    let r = c.describe_txn("race").await.unwrap().unwrap();
    assert_eq!(r.producer_epoch, 7);
    let adds = futures::future::join_all((0..16).map(|i| async move {
        c.txn_transition(t_add("race", 11, 7, &[tp(topic_id, i)]))
            .await
            .expect("txn_transition")
    }))
    .await;
    assert!(adds.iter().all(|a| a.error == ErrorCode::None), "{adds:?}");
    let r = c.describe_txn("race").await.unwrap().unwrap();
    assert_eq!(
        r.partitions,
        (0..16).map(|i| tp(topic_id, i)).collect::<Vec<_>>()
    );
    assert!(
        adds.iter().all(|a| record_of(a).txn_seq == r.txn_seq),
        "one transaction"
    );
}
