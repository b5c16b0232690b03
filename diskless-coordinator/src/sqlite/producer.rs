//! Idempotent-producer and transaction rules, and the compact encoding of a producer's batch
//! window.

use super::sql::execute_rows;
use crate::rows::{SqlRow, col, corrupt};
use crate::{
    CommitBatch, CoordinatorError, ErrorCode, PRODUCER_BATCH_WINDOW, ProducerBatch, ProducerState,
};
use sqlx::sqlite::{SqliteConnection, SqliteRow};

/// The columns of a `producer_state` row that [`state_from_row`] decodes, in its order.
pub(super) const STATE_COLUMNS: &str = "producer_epoch, batch_window, last_append_ms, \
     txn_first_offset, txn_start_ms, coordinator_epoch, last_ended_txn, last_marker_offset, txn_seq";

/// The state of producer `producer_id` from the [`STATE_COLUMNS`] of `row` starting at `at`.
pub(super) fn state_from_row(
    row: &SqliteRow,
    at: usize,
    producer_id: i64,
) -> Result<ProducerState, CoordinatorError> {
    let window: Vec<u8> = col(row, at + 1)?;
    Ok(ProducerState {
        producer_id,
        producer_epoch: row.i16_at(at)?,
        batches: decode_window(&window).ok_or_else(|| corrupt("torn producer batch window"))?,
        last_append_ms: row.i64_at(at + 2)?,
        current_txn_first_offset: row.opt_i64_at(at + 3)?,
        current_txn_start_ms: row.i64_at(at + 4)?,
        coordinator_epoch: row.i32_at(at + 5)?,
        last_ended_txn: row.i64_at(at + 6)?,
        last_marker_offset: row.i64_at(at + 7)?,
        current_txn_seq: row.opt_i64_at(at + 8)?,
    })
}

/// Writes the states of `(partition id, producer id)`s whole (inserted or replaced), in multi-row
/// upserts.
pub(super) async fn upsert_states(
    conn: &mut SqliteConnection,
    states: &[((i64, i64), &ProducerState)],
) -> Result<(), CoordinatorError> {
    let sql = format!(
        "INSERT INTO producer_state (partition_id, producer_id, {STATE_COLUMNS}) VALUES {{values}} \
         ON CONFLICT (partition_id, producer_id) DO UPDATE SET \
         producer_epoch = excluded.producer_epoch, batch_window = excluded.batch_window, \
         last_append_ms = excluded.last_append_ms, txn_first_offset = excluded.txn_first_offset, \
         txn_start_ms = excluded.txn_start_ms, coordinator_epoch = excluded.coordinator_epoch, \
         last_ended_txn = excluded.last_ended_txn, last_marker_offset = excluded.last_marker_offset, \
         txn_seq = excluded.txn_seq"
    );
    execute_rows(
        conn,
        &sql,
        11,
        states,
        |q, ((partition_id, producer_id), s)| {
            q.bind(*partition_id)
                .bind(*producer_id)
                .bind(s.producer_epoch)
                .bind(encode_window(&s.batches))
                .bind(s.last_append_ms)
                .bind(s.current_txn_first_offset)
                .bind(s.current_txn_start_ms)
                .bind(s.coordinator_epoch)
                .bind(s.last_ended_txn)
                .bind(s.last_marker_offset)
                .bind(s.current_txn_seq)
        },
    )
    .await
}

/// Bytes per window entry: base seq i32, last seq i32, base offset i64, last offset i64, log append
/// time i64, little endian.
const ENTRY: usize = 32;

/// Encodes a window (oldest first).
pub(super) fn encode_window(batches: &[ProducerBatch]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batches.len() * ENTRY);
    for b in batches {
        out.extend_from_slice(&b.base_sequence.to_le_bytes());
        out.extend_from_slice(&b.last_sequence.to_le_bytes());
        out.extend_from_slice(&b.base_offset.to_le_bytes());
        out.extend_from_slice(&b.last_offset.to_le_bytes());
        out.extend_from_slice(&b.log_append_time.to_le_bytes());
    }
    out
}

/// Decodes a window; `None` when the bytes are not a whole number of entries.
pub(super) fn decode_window(bytes: &[u8]) -> Option<Vec<ProducerBatch>> {
    if !bytes.len().is_multiple_of(ENTRY) {
        return None;
    }
    let i32_at = |c: &[u8], at: usize| c.get(at..at + 4)?.try_into().ok().map(i32::from_le_bytes);
    let i64_at = |c: &[u8], at: usize| c.get(at..at + 8)?.try_into().ok().map(i64::from_le_bytes);
    bytes
        .chunks_exact(ENTRY)
        .map(|c| {
            Some(ProducerBatch {
                base_sequence: i32_at(c, 0)?,
                last_sequence: i32_at(c, 4)?,
                base_offset: i64_at(c, 8)?,
                last_offset: i64_at(c, 16)?,
                log_append_time: i64_at(c, 24)?,
            })
        })
        .collect()
}

/// What Kafka's producer-state rules decide for one idempotent batch.
#[derive(Debug)]
pub(super) enum Decision {
    /// Append it.
    Append,
    /// A duplicate of this kept batch.
    Duplicate(ProducerBatch),
    /// Reject it.
    Reject(ErrorCode),
}

/// Kafka's duplicate detection (`ProducerStateEntry.findDuplicateBatch`), then
/// `ProducerAppendInfo.checkProducerEpoch` and `checkSequence` for a non-transactional producer.
pub(super) fn decide(state: Option<&ProducerState>, batch: &CommitBatch) -> Decision {
    let Some(state) = state else {
        return Decision::Append;
    };
    if batch.producer_epoch == state.producer_epoch {
        if let Some(kept) = state.batches.iter().find(|k| {
            k.base_sequence == batch.base_sequence && k.last_sequence == batch.last_sequence
        }) {
            return Decision::Duplicate(kept.clone());
        }
    } else if batch.producer_epoch < state.producer_epoch {
        return Decision::Reject(ErrorCode::InvalidProducerEpoch);
    } else if batch.base_sequence != 0 {
        return Decision::Reject(ErrorCode::OutOfOrderSequenceNumber);
    } else {
        return Decision::Append;
    }
    let follows = |last: i32| {
        i64::from(batch.base_sequence) == i64::from(last) + 1
            || (last == i32::MAX && batch.base_sequence == 0)
    };
    match state.batches.last() {
        Some(last) if !follows(last.last_sequence) => {
            Decision::Reject(ErrorCode::OutOfOrderSequenceNumber)
        }
        _ => Decision::Append,
    }
}

/// The transaction rules of a batch the idempotent-producer rules would append (docs/transactions.md
/// §2.3, the reference model's order): `Ok(true)` when it opens a transaction, `Ok(false)` when it
/// is appended without opening one, else why it is refused. `state` is the producer's state before
/// the batch.
pub(super) fn check_txn(
    state: Option<&ProducerState>,
    batch: &CommitBatch,
) -> Result<bool, ErrorCode> {
    let open = state.and_then(|s| s.current_txn_first_offset).is_some();
    if !batch.transactional {
        // Kafka's `appendDataBatch`: a plain batch while the producer's transaction is open.
        return if open && batch.is_idempotent() {
            Err(ErrorCode::InvalidTxnState)
        } else {
            Ok(false)
        };
    }
    if !batch.is_idempotent() {
        return Err(ErrorCode::InvalidRecord);
    }
    if let Some(s) = state
        && open
    {
        return continue_open_txn(s, batch).map(|()| false);
    }
    // Opening one needs the host's verification, for a transaction newer than every one a marker
    // already ended here (a stale verified batch cannot reopen it).
    let last_ended = state.map_or(-1, |s| s.last_ended_txn);
    match batch.txn_seq {
        Some(seq) if seq > last_ended => Ok(true),
        _ => Err(ErrorCode::InvalidTxnState),
    }
}

/// A transactional batch of a producer whose transaction is open in the partition (state `s`):
/// with the same epoch and no other transaction's number it continues that transaction. A
/// verified batch of a newer transaction is `CONCURRENT_TRANSACTIONS` (the open one's marker has
/// not been written here yet: retriable), of an older one `INVALID_TXN_STATE`; another epoch is the
/// producer's next transaction (TV2 bumps the epoch per transaction) before this one's marker
/// arrived, `INVALID_TXN_STATE`.
fn continue_open_txn(s: &ProducerState, batch: &CommitBatch) -> Result<(), ErrorCode> {
    if batch.producer_epoch != s.producer_epoch {
        return Err(ErrorCode::InvalidTxnState);
    }
    match (batch.txn_seq, s.current_txn_seq) {
        (Some(seq), Some(open)) if seq > open => Err(ErrorCode::ConcurrentTransactions),
        (Some(seq), Some(open)) if seq < open => Err(ErrorCode::InvalidTxnState),
        _ => Ok(()),
    }
}

/// Records an appended batch, committed at `now`, in the producer's state (a new epoch starts a new
/// window; the last append time is refreshed); `opens_txn`: the batch opens a transaction at its
/// base offset.
pub(super) fn record(
    state: &mut Option<ProducerState>,
    batch: &CommitBatch,
    appended: ProducerBatch,
    now: i64,
    opens_txn: bool,
) {
    let s = state.get_or_insert_with(|| ProducerState {
        batches: Vec::with_capacity(PRODUCER_BATCH_WINDOW),
        ..ProducerState::new(batch.producer_id, batch.producer_epoch, now)
    });
    s.last_append_ms = now;
    if opens_txn {
        s.current_txn_first_offset = Some(appended.base_offset);
        s.current_txn_start_ms = now;
        s.current_txn_seq = batch.txn_seq;
    }
    if s.producer_epoch != batch.producer_epoch {
        s.producer_epoch = batch.producer_epoch;
        s.batches.clear();
    }
    if s.batches.len() == PRODUCER_BATCH_WINDOW {
        s.batches.remove(0);
    }
    s.batches.push(appended);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_round_trips_and_rejects_torn_bytes() {
        let w = vec![
            ProducerBatch {
                base_sequence: i32::MAX,
                last_sequence: 0,
                base_offset: 7,
                last_offset: 8,
                log_append_time: -1,
            },
            ProducerBatch {
                base_sequence: 1,
                last_sequence: 4,
                base_offset: i64::MAX - 3,
                last_offset: i64::MAX,
                log_append_time: 1_700_000_000_000,
            },
        ];
        let bytes = encode_window(&w);
        assert_eq!(bytes.len(), 64);
        assert_eq!(decode_window(&bytes), Some(w));
        assert_eq!(decode_window(&bytes[..63]), None);
        assert_eq!(decode_window(&[]), Some(vec![]));
    }
}
