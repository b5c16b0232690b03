//! SQL fragments and row readers that several modules share. A leaf: it uses no other module of
//! the PostgreSQL coordinator.

use crate::rows::{corrupt, topic_key};
use crate::{CoordinatorError, ObjectKind, TopicIdPartition};

/// `BEGIN` of every multi-statement read: one snapshot for the call, also on a hot standby.
pub(super) const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// The last stable offset of partition row `pa`: the smallest first offset of its open
/// transactions (one probe of the partial index `producer_state_open_txn`, migration 12), raised
/// to the log start offset, never above the high watermark; the high watermark when none is open.
pub(super) const LAST_STABLE_OFFSET: &str = "least(pa.high_watermark, greatest(pa.log_start_offset, \
     coalesce((SELECT min(s.txn_first_offset) FROM producer_state s \
     WHERE s.partition_id = pa.partition_id AND s.txn_first_offset IS NOT NULL), \
     pa.high_watermark)))";

/// The effective max timestamp of a batch row `b` (the expression of the `batches_effective_ts`
/// index, migration 4).
pub(super) const EFFECTIVE_TS: &str =
    "(CASE WHEN b.timestamp_type = 1 THEN b.log_append_time ELSE b.max_timestamp END)";

/// Topic ids and partition indexes of `partitions` as bindable arrays.
pub(super) fn partition_arrays(
    partitions: impl Iterator<Item = TopicIdPartition>,
) -> (Vec<String>, Vec<i32>) {
    partitions
        .map(|p| (topic_key(p.topic_id), p.partition))
        .unzip()
}

/// A stored object kind (migration 13: 0 WAL, 1 tiered segment).
pub(super) fn object_kind(code: i16) -> Result<ObjectKind, CoordinatorError> {
    match code {
        0 => Ok(ObjectKind::Wal),
        1 => Ok(ObjectKind::TieredSegment),
        other => Err(corrupt(format!("unknown object kind {other}"))),
    }
}
