//! The request rules every coordinator applies before touching its state. One piece of code for all
//! implementations (SQLite, PostgreSQL, the sharded router, the in-memory model, users' own), so that
//! they cannot drift apart; the conformance suite pins them.

use crate::{
    CommitBatch, CommitFileRequest, CoordinatorError, CreateTopicRequest, ErrorCode,
    MAX_PRODUCER_ID_BLOCK, ProducerIdBlock, RegisterSegmentRequest, ReplaceSegmentsRequest,
    TopicConfig,
};

/// The last sequence of a batch of `record_count` records starting at `base_sequence`, with Kafka's
/// wrap-around from `i32::MAX` to 0.
///
/// ```
/// use diskless_coordinator::last_sequence;
/// assert_eq!(last_sequence(5, 3), 7);
/// assert_eq!(last_sequence(i32::MAX, 2), 0);
/// ```
pub fn last_sequence(base_sequence: i32, record_count: i32) -> i32 {
    let last = (i64::from(base_sequence) + i64::from(record_count) - 1) % (i64::from(i32::MAX) + 1);
    // In range by construction for non-negative inputs; negative inputs are clamped, not wrapped.
    i32::try_from(last).unwrap_or(-1)
}

/// Whether Kafka accepts `name` as a topic name (`org.apache.kafka.common.internals.Topic.validate`):
/// 1 to 249 characters of `[a-zA-Z0-9._-]`, neither `.` nor `..`. Every coordinator refuses other
/// names ([`CreateTopicRequest::validate`]); a host checks a name with it before creating anything
/// of its own (Kafka's CreateTopics and automatic creation answer `INVALID_TOPIC_EXCEPTION`).
///
/// ```
/// use diskless_coordinator::is_valid_topic_name;
/// assert!(is_valid_topic_name("orders.v2_eu-1"));
/// assert!(!is_valid_topic_name(".."));
/// assert!(!is_valid_topic_name("a/b"));
/// assert!(!is_valid_topic_name(&"n".repeat(250)));
/// ```
pub fn is_valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl CreateTopicRequest {
    /// Checks the request: a non-nil id, a name Kafka accepts ([`is_valid_topic_name`];
    /// [`CoordinatorError::InvalidTopic`] otherwise), at least one partition, and config values in
    /// range ([`TopicConfig::validate`]). Other errors are [`CoordinatorError::InvalidRequest`].
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        let bad = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
        if self.topic_id.is_nil() {
            return bad("the topic id must not be the nil UUID");
        }
        if !is_valid_topic_name(&self.name) {
            return Err(CoordinatorError::InvalidTopic(format!(
                "{:?}: a topic name has 1 to 249 characters of [a-zA-Z0-9._-] and is not . or ..",
                self.name
            )));
        }
        if self.partitions < 1 {
            return bad("a topic needs at least one partition");
        }
        self.config.validate()
    }
}

impl TopicConfig {
    /// Checks every value against Kafka's range: retention.ms and retention.bytes at least `-1`,
    /// max.message.bytes and the timestamp bounds at least 0, producer.id.expiration.ms at least 1,
    /// segment.bytes at least 14, segment.ms at least 1, index.interval.bytes at least 0,
    /// segment.index.bytes at least 4, compression.gzip.level 1..=9 or -1, compression.lz4.level
    /// 1..=17, compression.zstd.level -131072..=22 (Kafka's `CompressionType` level validators),
    /// delete.retention.ms and min.compaction.lag.ms at least 0, max.compaction.lag.ms at least 1
    /// and not below min.compaction.lag.ms (Kafka's `LogConfig.validateValues`),
    /// min.cleanable.dirty.ratio in 0..=1.
    /// Errors are [`CoordinatorError::InvalidRequest`]; values are never adjusted.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        let bad = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
        if self.retention_ms < -1 || self.retention_bytes < -1 {
            return bad("retention.ms and retention.bytes must be >= -1");
        }
        if self.max_message_bytes < 0
            || self.message_timestamp_before_max_ms < 0
            || self.message_timestamp_after_max_ms < 0
        {
            return bad("max.message.bytes and the timestamp bounds must be >= 0");
        }
        if self.producer_id_expiration_ms < 1 {
            return bad("producer.id.expiration.ms must be >= 1");
        }
        if self.segment_bytes < 14 {
            return bad("segment.bytes must be >= 14");
        }
        if self.segment_ms < 1 {
            return bad("segment.ms must be >= 1");
        }
        if self.index_interval_bytes < 0 {
            return bad("index.interval.bytes must be >= 0");
        }
        if self.segment_index_bytes < 4 {
            return bad("segment.index.bytes must be >= 4");
        }
        if let Some(why) = gzip_level_error(self.compression_gzip_level) {
            return bad(&format!("compression.gzip.level: {why}"));
        }
        if let Some(why) = lz4_level_error(self.compression_lz4_level) {
            return bad(&format!("compression.lz4.level: {why}"));
        }
        if let Some(why) = zstd_level_error(self.compression_zstd_level) {
            return bad(&format!("compression.zstd.level: {why}"));
        }
        if self.delete_retention_ms < 0 || self.min_compaction_lag_ms < 0 {
            return bad("delete.retention.ms and min.compaction.lag.ms must be >= 0");
        }
        if self.max_compaction_lag_ms < 1 {
            return bad("max.compaction.lag.ms must be >= 1");
        }
        if !(0.0..=1.0).contains(&self.min_cleanable_dirty_ratio) {
            return bad("min.cleanable.dirty.ratio must be between 0 and 1");
        }
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms {
            return bad(&format!(
                "conflict topic config setting min.compaction.lag.ms ({}) > max.compaction.lag.ms ({})",
                self.min_compaction_lag_ms, self.max_compaction_lag_ms
            ));
        }
        Ok(())
    }
}

/// Kafka's `CompressionType.GZIP.levelValidator()`: 1..=9 or -1.
pub(crate) fn gzip_level_error(level: i32) -> Option<&'static str> {
    (level > 9 || (level < 1 && level != -1))
        .then_some("Value must be between 1 and 9 or equal to -1")
}

/// Kafka's `CompressionType.LZ4.levelValidator()`: 1..=17.
pub(crate) fn lz4_level_error(level: i32) -> Option<&'static str> {
    if level < 1 {
        Some("Value must be at least 1")
    } else if level > 17 {
        Some("Value must be no more than 17")
    } else {
        None
    }
}

/// Kafka's `CompressionType.ZSTD.levelValidator()`: -131072..=22.
pub(crate) fn zstd_level_error(level: i32) -> Option<&'static str> {
    if level < -131072 {
        Some("Value must be at least -131072")
    } else if level > 22 {
        Some("Value must be no more than 22")
    } else {
        None
    }
}

impl RegisterSegmentRequest {
    /// Checks that the request does not contradict itself: a non-empty key, `0 <= base_offset <=
    /// end_offset`, at least one batch, `layout.log == batch_bytes <= i32::MAX` (Kafka's `int`
    /// positions), and an object no smaller than its sections and trailer. Errors are
    /// [`CoordinatorError::InvalidRequest`]. Whether the range matches the partition is the
    /// coordinator's check ([`crate::RegisterSegmentOutcome::Stale`]).
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        let bad = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
        if self.object_key.is_empty() {
            return bad("a segment needs an object key");
        }
        if self.base_offset < 0 || self.end_offset < self.base_offset {
            return bad("a segment's offsets must satisfy 0 <= base_offset <= end_offset");
        }
        if self.batch_count == 0 {
            return bad("a segment holds at least one batch");
        }
        if self.layout.log != self.batch_bytes {
            return bad("a segment's .log size must equal its batch bytes");
        }
        if self.batch_bytes > i32::MAX as u64 {
            return bad("a segment's .log size must be at most i32::MAX");
        }
        if self.object_size < self.layout.object_size() {
            return bad("a segment object is smaller than its sections and trailer");
        }
        Ok(())
    }
}

impl ReplaceSegmentsRequest {
    /// Checks that the request does not contradict itself: at least one replaced segment, each
    /// with a key and `0 <= base <= end`, in strictly increasing offset order; a new segment valid
    /// as a registration ([`RegisterSegmentRequest::validate`]), of the same partition, inside the
    /// replaced range, under a key that is not one of the replaced. Errors are
    /// [`CoordinatorError::InvalidRequest`]; whether the replaced segments are still registered
    /// is the coordinator's check.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        let bad = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
        let (Some(first), Some(last)) = (self.replaced.first(), self.replaced.last()) else {
            return bad("a replacement names at least one segment");
        };
        let mut previous_end = -1;
        for s in &self.replaced {
            if s.object_key.is_empty() || s.base_offset < 0 || s.end_offset < s.base_offset {
                return bad("a replaced segment needs a key and 0 <= base_offset <= end_offset");
            }
            if s.base_offset <= previous_end {
                return bad("replaced segments must be in increasing offset order");
            }
            previous_end = s.end_offset;
        }
        if let Some(new) = &self.segment {
            new.validate()?;
            if new.partition != self.partition {
                return bad("the new segment belongs to another partition");
            }
            if new.base_offset < first.base_offset || new.end_offset > last.end_offset {
                return bad("the new segment lies outside the replaced range");
            }
            if self.replaced.iter().any(|s| s.object_key == new.object_key) {
                return bad("the new segment reuses a replaced segment's key");
            }
        }
        Ok(())
    }
}

/// Checks the size of a producer-id block asked of
/// [`crate::BatchCoordinator::allocate_producer_ids`]: 1 to [`MAX_PRODUCER_ID_BLOCK`], else
/// [`CoordinatorError::InvalidRequest`].
pub fn validate_producer_id_count(count: u32) -> Result<(), CoordinatorError> {
    if count == 0 || count > MAX_PRODUCER_ID_BLOCK {
        return Err(CoordinatorError::InvalidRequest(format!(
            "a producer-id block holds 1 to {MAX_PRODUCER_ID_BLOCK} ids, not {count}"
        )));
    }
    Ok(())
}

/// The block of `count` ids starting at `next`, the next unallocated producer id, and the next
/// unallocated id after it. Ids stay below `i64::MAX`; when the space is spent the answer is
/// [`CoordinatorError::Storage`] (as Kafka's controller fails once its ids are exhausted).
///
/// ```
/// use diskless_coordinator::{ProducerIdBlock, next_producer_id_block};
/// let (block, next) = next_producer_id_block(1000, 10).unwrap();
/// assert_eq!(block, ProducerIdBlock { first: 1000, count: 10 });
/// assert_eq!((block.last(), next), (1009, 1010));
/// assert!(next_producer_id_block(i64::MAX - 5, 10).is_err());
/// ```
pub fn next_producer_id_block(
    next: i64,
    count: u32,
) -> Result<(ProducerIdBlock, i64), CoordinatorError> {
    validate_producer_id_count(count)?;
    if next < 0 {
        return Err(CoordinatorError::Storage(
            format!("the next producer id is negative: {next}").into(),
        ));
    }
    match next.checked_add(i64::from(count)) {
        Some(after) if after < i64::MAX => Ok((ProducerIdBlock { first: next, count }, after)),
        _ => Err(CoordinatorError::Storage(
            "the producer-id space is exhausted".into(),
        )),
    }
}

/// Kafka's CreatePartitions rule (`INVALID_PARTITIONS`, [`CoordinatorError::InvalidPartitions`]):
/// a topic of `current` partitions only grows, so `new_total` must be larger.
pub fn check_new_partition_count(current: i32, new_total: i32) -> Result<(), CoordinatorError> {
    if new_total == current {
        return Err(CoordinatorError::InvalidPartitions(format!(
            "topic already has {current} partitions"
        )));
    }
    if new_total < current {
        return Err(CoordinatorError::InvalidPartitions(format!(
            "topic currently has {current} partitions, which is higher than the requested \
             {new_total}"
        )));
    }
    Ok(())
}

impl CommitFileRequest {
    /// Checks what the uploading broker controls: a non-empty key and owner list, a size that fits
    /// an `i64`, and batches that are non-empty, lie inside the object and, when idempotent, carry
    /// the last sequence the broker computed from the base sequence and record count. Errors are
    /// [`CoordinatorError::InvalidRequest`] (the whole call). What a producer controls (producer id,
    /// epoch, base sequence) is never judged here but per batch, by [`producer_field_error`], so
    /// that one client's bad batch cannot fail the other clients' batches in the same segment.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        let bad = |m: String| Err(CoordinatorError::InvalidRequest(m));
        if self.object_key.is_empty() {
            return bad("the object key must not be empty".into());
        }
        if self.owners.is_empty() {
            return bad("the owner list must not be empty".into());
        }
        if i64::try_from(self.object_size).is_err() {
            return bad("the object size is too large".into());
        }
        for (i, b) in self.batches.iter().enumerate() {
            if b.record_count < 1 || b.byte_size == 0 {
                return bad(format!("batch {i}: empty batch"));
            }
            match b.byte_offset.checked_add(u64::from(b.byte_size)) {
                Some(end) if end <= self.object_size => {}
                _ => return bad(format!("batch {i}: lies outside the object")),
            }
            if b.is_idempotent()
                && b.base_sequence >= 0
                && b.last_sequence != last_sequence(b.base_sequence, b.record_count)
            {
                return bad(format!(
                    "batch {i}: last sequence inconsistent with the record count"
                ));
            }
        }
        Ok(())
    }
}

/// The per-batch verdict on the fields a producer controls, applied by every coordinator to each batch
/// before the idempotent-producer rules (the batch alone is rejected with the code):
///
/// - idempotent (`producerId >= 0`) with `baseSequence < 0` → `INVALID_RECORD` (Kafka's
///   `LogValidator.validateBatch`, which runs before the producer state is consulted);
/// - idempotent with `producerEpoch < -1` → `INVALID_PRODUCER_EPOCH` (Kafka's
///   `ProducerAppendInfo.checkProducerEpoch` against a new producer's epoch `-1`; `-1` itself passes).
///
/// A producer id below `-1` is not idempotent (Kafka's `hasProducerId`), so it is never judged.
///
/// ```
/// use diskless_coordinator::{producer_field_error, CommitBatch, ErrorCode, TimestampType, TopicIdPartition};
/// let mut b = CommitBatch {
///     partition: TopicIdPartition::new(uuid::Uuid::from_u128(1), 0),
///     byte_offset: 1, byte_size: 70, record_count: 1, base_timestamp: 0, max_timestamp: 0,
///     timestamp_type: TimestampType::CreateTime,
///     producer_id: 7, producer_epoch: -2, base_sequence: 0, last_sequence: 0,
///     transactional: false, txn_seq: None,
/// };
/// assert_eq!(producer_field_error(&b), Some(ErrorCode::InvalidProducerEpoch));
/// b.base_sequence = -1; // the sequence is judged first, as in Kafka
/// assert_eq!(producer_field_error(&b), Some(ErrorCode::InvalidRecord));
/// b.base_sequence = 0;
/// b.producer_epoch = -1;
/// assert_eq!(producer_field_error(&b), None);
/// ```
pub fn producer_field_error(batch: &CommitBatch) -> Option<ErrorCode> {
    if !batch.is_idempotent() {
        return None;
    }
    if batch.base_sequence < 0 {
        return Some(ErrorCode::InvalidRecord);
    }
    if batch.producer_epoch < -1 {
        return Some(ErrorCode::InvalidProducerEpoch);
    }
    None
}
