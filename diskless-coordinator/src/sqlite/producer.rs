//! Idempotent-producer rules and the compact encoding of a producer's batch window.

use crate::{CommitBatch, ErrorCode, PRODUCER_BATCH_WINDOW, ProducerBatch, ProducerState};

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

/// Records an appended batch, committed at `now`, in the producer's state (a new epoch starts a new
/// window; the last append time is refreshed).
pub(super) fn record(
    state: &mut Option<ProducerState>,
    batch: &CommitBatch,
    appended: ProducerBatch,
    now: i64,
) {
    let s = state.get_or_insert_with(|| ProducerState {
        batches: Vec::with_capacity(PRODUCER_BATCH_WINDOW),
        ..ProducerState::new(batch.producer_id, batch.producer_epoch, now)
    });
    s.last_append_ms = now;
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
