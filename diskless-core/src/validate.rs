//! Validation of the record batches a producer sends, with Kafka's error codes.
//!
//! [`validate_produce_records`] (or [`Validator::validate_produce_records`]) is the produce path's
//! one entry point: it takes one partition's `records` field of a Produce request and applies, in
//! Kafka's order:
//!
//! 1. Kafka's `ProduceRequest.validateRecords` (v3+), over Kafka's batch iteration
//!    (`ByteBufferLogInputStream`): a `batchLength` below 14 (the smallest v0 record) or a magic
//!    outside 0..=2 → `CORRUPT_MESSAGE` (2); no complete batch → `INVALID_RECORD` (87); a first batch
//!    of magic 0 or 1 → `INVALID_RECORD`, whatever its size; a second complete batch →
//!    `INVALID_RECORD` (exactly one batch per partition). Bytes after the batch too few to hold a
//!    second one (fewer than 12, fewer than 17, or fewer than the `batchLength` they announce) are
//!    ignored, as Kafka's `UnifiedLog.trimInvalidBytes` drops them: only the batch is stored;
//! 2. then [`Validator::validate`] on that batch;
//! 3. then, on a topic whose `compression.type` is not `producer`, a batch of another codec is
//!    re-encoded with the topic's codec and level, as Kafka's `LogValidator` rebuilds it (the same
//!    records; the size checked against `max.message.bytes` again): [`stored_codec`].
//!
//! The two rules that depend on the request's version are separate calls for the host:
//! [`check_produce_codec`] (ZStandard needs Produce v7) and [`fetch_codec_error`] (a `zstd` topic
//! needs Fetch v10).
//!
//! [`validate_batch`] (or [`Validator::validate`]) checks one batch, in the order of Kafka's
//! `UnifiedLog.analyzeAndValidateRecords`, `LogValidator` and `ProducerAppendInfo`:
//!
//! 1. `baseOffset != 0` → `INVALID_RECORD` (Kafka's own rule for v2 batches from clients, since
//!    0.11.0, 2017: `analyzeAndValidateRecords`, checked before size and CRC);
//! 2. size: the batch (header included) larger than `max.message.bytes` → `MESSAGE_TOO_LARGE` (10);
//! 3. CRC-32C of bytes 21..end → `CORRUPT_MESSAGE`;
//! 4. an unknown codec (5..7) → `INVALID_RECORD` (Kafka fails here with an internal error);
//! 5. Kafka's `LogValidator.validateBatch` for client batches: `lastOffsetDelta + 1 <= 0`,
//!    `recordsCount <= 0`, the two inconsistent, a control batch, `producerId >= 0` with
//!    `baseSequence < 0` → `INVALID_RECORD`;
//! 6. the records, decompressed if needed (bounded by [`ValidationOptions::max_decompressed_bytes`],
//!    beyond which `MESSAGE_TOO_LARGE`): every record must frame (varints, lengths, headers), the
//!    count must equal `recordsCount` with no bytes left over (`INVALID_RECORD`). Then the
//!    per-record errors: the LogAppendTime bit set by the producer → `INVALID_TIMESTAMP` (32),
//!    whatever the topic's timestamp type (Kafka rejects it on LogAppendTime topics and rewrites it on
//!    CreateTime ones; a diskless batch is stored as sent); with CreateTime, each timestamp other than
//!    -1 must lie within `[now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]`
//!    (`INVALID_TIMESTAMP`); each record's `offsetDelta` must equal its index (`INVALID_RECORD`:
//!    Kafka would rewrite the inner offsets, a diskless batch is stored as sent); on a topic whose
//!    `cleanup.policy` compacts, a record without a key → `INVALID_RECORD` (Kafka's
//!    `LogValidator.validateKey`; such a record's timestamp is not checked);
//! 7. `producerId >= 0` with `producerEpoch < -1` → `INVALID_PRODUCER_EPOCH` (47): Kafka's
//!    `ProducerAppendInfo.checkProducerEpoch`, which compares the epoch with the last one seen, `-1`
//!    for a producer new to the partition (so `-1` passes here; the coordinator judges it against the
//!    producer's state). A `producerId` below `-1` is, like `-1`, not idempotent (Kafka's
//!    `hasProducerId` is `producerId > -1`): its epoch and sequence are not checked, and
//!    [`ValidatedBatch::commit_batch`] commits it as a non-idempotent batch.
//!
//! As in Kafka, a structural error (a record that does not parse) wins over per-record errors, and
//! among per-record errors a timestamp error wins (`INVALID_TIMESTAMP`); the error names the first
//! failing record. A batch that passes is never refused by a coordinator for its producer fields
//! alone (only for the producer's state: fencing, sequence gaps), so one producer's malformed batch
//! fails only its own partition.

use bytes::Bytes;
use diskless_coordinator::{
    CommitBatch, ErrorCode, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP,
    TimestampType, TopicCompression, TopicConfig, TopicIdPartition,
};

use crate::ConfigError;
use crate::batch::ATTRIBUTES_OFFSET;
use crate::batch::{
    BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, BatchError, Compression, HEADER_LEN, LOG_OVERHEAD,
    MAGIC_OFFSET, MAGIC_V2, RecordBatch, read_i16, read_i32, read_i64, update_crc,
};
use crate::compression::{CompressionError, compress_with_level, decompress};
use crate::records::{RecordErrorKind, RecordIter};

/// What exactly failed in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidationErrorKind {
    /// The bytes do not frame as a v2 batch.
    Framing(BatchError),
    /// The stored CRC does not match.
    CrcMismatch {
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// The batch is larger than `max.message.bytes`.
    TooLarge {
        /// The batch size.
        size: usize,
        /// The limit.
        max: i32,
    },
    /// `lastOffsetDelta + 1 <= 0`.
    InvalidOffsetRange,
    /// `recordsCount <= 0`.
    InvalidRecordCount,
    /// `lastOffsetDelta + 1 != recordsCount`.
    InconsistentCount,
    /// A client sent a control batch.
    ControlBatch,
    /// `producerId >= 0` with `baseSequence < 0`.
    InvalidSequence,
    /// A transactional batch without a producer id (Kafka would store it without producer state;
    /// diskless-rs refuses it, since no transaction could ever end it).
    TransactionalWithoutProducerId,
    /// A client sent `baseOffset != 0`.
    NonZeroBaseOffset,
    /// Compression codec id 5..7.
    UnknownCompression(u8),
    /// The records section does not decompress.
    Decompression(CompressionError),
    /// The decompressed records are larger than the configured bound.
    DecompressedTooLarge {
        /// The bound.
        limit: usize,
    },
    /// A record does not parse, or the record count does not match.
    Record(RecordErrorKind),
    /// A record's `offsetDelta` is not its index.
    NonSequentialOffset {
        /// The record's index (the expected delta).
        expected: i32,
        /// The record's offsetDelta.
        actual: i32,
    },
    /// A CreateTime timestamp outside the accepted window.
    TimestampOutOfRange {
        /// The record's timestamp.
        timestamp: i64,
    },
    /// The producer set the LogAppendTime attribute bit.
    LogAppendTimeFromProducer,
    /// A record without a key sent to a topic whose `cleanup.policy` compacts (Kafka's
    /// `LogValidator.validateKey`).
    KeylessRecordInCompactedTopic,
    /// `producerId >= 0` with `producerEpoch < -1`.
    InvalidProducerEpoch {
        /// The batch's `producerEpoch`.
        epoch: i16,
    },
    /// A batch announces a `batchLength` smaller than the smallest record of any format (14 bytes,
    /// Kafka's `LegacyRecord.RECORD_OVERHEAD_V0`).
    BatchLengthBelowMinimum {
        /// The `batchLength` field.
        batch_length: i32,
    },
    /// A partition's records hold no complete batch (empty, or cut short).
    NoRecordBatch,
    /// A partition's records hold more than one batch (Produce v3+ allows exactly one).
    MoreThanOneBatch,
    /// A ZStandard batch in a Produce request older than v7 (Kafka's
    /// `ProduceRequest.validateRecords`).
    ZstdBeforeProduceV7 {
        /// The request's version.
        version: i16,
    },
    /// The batch could not be re-encoded with the topic's `compression.type` (a codec this
    /// build lacks, or a level out of range; Kafka fails such an append with an internal error).
    Recompression(CompressionError),
}

impl ValidationErrorKind {
    /// The Kafka error code of this kind of failure.
    pub fn error_code(&self) -> ErrorCode {
        use ValidationErrorKind::*;
        match self {
            Framing(e) => e.error_code(),
            CrcMismatch { .. } => ErrorCode::CorruptMessage,
            TooLarge { .. } | DecompressedTooLarge { .. } => ErrorCode::MessageTooLarge,
            TimestampOutOfRange { .. } | LogAppendTimeFromProducer => ErrorCode::InvalidTimestamp,
            InvalidProducerEpoch { .. } => ErrorCode::InvalidProducerEpoch,
            BatchLengthBelowMinimum { .. } => ErrorCode::CorruptMessage,
            InvalidOffsetRange
            | InvalidRecordCount
            | InconsistentCount
            | ControlBatch
            | InvalidSequence
            | TransactionalWithoutProducerId
            | NonZeroBaseOffset
            | UnknownCompression(_)
            | Decompression(_)
            | Record(_)
            | NonSequentialOffset { .. }
            | KeylessRecordInCompactedTopic
            | NoRecordBatch
            | MoreThanOneBatch => ErrorCode::InvalidRecord,
            Recompression(_) => ErrorCode::UnknownServerError,
            ZstdBeforeProduceV7 { .. } => ErrorCode::UnsupportedCompressionType,
        }
    }
}

/// A batch failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[error("{message}")]
pub struct ValidationError {
    /// What failed.
    pub kind: ValidationErrorKind,
    /// A human-readable message (what Kafka would put in the response's error message).
    pub message: String,
    /// The index of the record that failed, for record-level failures.
    pub record_index: Option<usize>,
    /// Every failing record of the batch, `(index, message)` in record order, for the
    /// per-record errors Kafka's `LogValidator` collects (a key missing on a compacted topic, a
    /// timestamp out of range): Kafka's `record_errors`, one entry per record. Empty otherwise
    /// (the error then names at most `record_index`).
    pub record_errors: Vec<(usize, String)>,
}

impl ValidationError {
    fn new(kind: ValidationErrorKind, message: String) -> Self {
        ValidationError {
            kind,
            message,
            record_index: None,
            record_errors: Vec::new(),
        }
    }

    fn at(mut self, index: usize) -> Self {
        self.record_index = Some(index);
        self
    }

    /// The Kafka error code to answer the producer with.
    pub fn error_code(&self) -> ErrorCode {
        self.kind.error_code()
    }
}

impl From<BatchError> for ValidationError {
    fn from(e: BatchError) -> Self {
        ValidationError::new(ValidationErrorKind::Framing(e.clone()), e.to_string())
    }
}

/// What the produce path needs from a batch that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedBatch {
    /// `recordsCount` (= `lastOffsetDelta + 1`).
    pub record_count: i32,
    /// `baseTimestamp` as sent.
    pub base_timestamp: i64,
    /// `maxTimestamp` as sent (not trusted: the coordinator gets `max_record_timestamp`, and the
    /// fetch path serves that in the header, as Kafka's validator stores it).
    pub max_timestamp: i64,
    /// The largest record timestamp found in the records (-1 when none has one).
    pub max_record_timestamp: i64,
    /// The timestamp type bit as sent (always CreateTime for an accepted batch).
    pub timestamp_type: TimestampType,
    /// `producerId` as sent (any value below 0 means "not idempotent", as in Kafka).
    pub producer_id: i64,
    /// `producerEpoch` as sent.
    pub producer_epoch: i16,
    /// `baseSequence` as sent.
    pub base_sequence: i32,
    /// The last sequence, with Kafka's wrap at `i32::MAX`, or -1.
    pub last_sequence: i32,
    /// Whether the batch is transactional.
    pub transactional: bool,
    /// The codec.
    pub compression: Compression,
    /// The batch size in bytes, header included.
    pub byte_size: u32,
    /// The size of the records section after decompression.
    pub uncompressed_records_size: usize,
}

impl ValidatedBatch {
    /// The coordinates to commit for this batch, stored at `byte_offset` of a WAL segment.
    ///
    /// The max timestamp committed is the largest record timestamp found by validation, not the
    /// header's `maxTimestamp`: Kafka overwrites the header with that value, and the coordinator
    /// bases time retention and ListOffsets on it, so a producer's header must not be trusted.
    ///
    /// A batch that is not idempotent (`producerId < 0`; Kafka's `hasProducerId` is
    /// `producerId > -1`, so `-2` means the same as `-1`) is committed with the producer fields of a
    /// non-idempotent batch (`-1`, `-1`, `-1`, `-1`): Kafka keeps no producer state for it, and a
    /// coordinator never sees producer fields it could refuse.
    pub fn commit_batch(&self, partition: TopicIdPartition, byte_offset: u64) -> CommitBatch {
        let (producer_id, producer_epoch, base_sequence, last_sequence) = if self.producer_id >= 0 {
            (
                self.producer_id,
                self.producer_epoch,
                self.base_sequence,
                self.last_sequence,
            )
        } else {
            (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, NO_SEQUENCE)
        };
        CommitBatch {
            partition,
            byte_offset,
            byte_size: self.byte_size,
            record_count: self.record_count,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_record_timestamp,
            timestamp_type: self.timestamp_type,
            producer_id,
            producer_epoch,
            base_sequence,
            last_sequence,
            transactional: self.transactional,
            txn_seq: None,
        }
    }
}

/// Tuning of the validator: [`Default`], then the `with_*` methods. Checked by
/// [`Validator::new`] ([`ValidationOptions::validate`]).
///
/// ```
/// use diskless_core::{ValidationOptions, Validator};
/// let options = ValidationOptions::default().with_max_decompressed_bytes(Some(1 << 20));
/// let validator = Validator::new(options).unwrap();
/// assert!(Validator::new(ValidationOptions::default().with_max_decompressed_bytes(Some(0))).is_err());
/// # let _ = validator;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ValidationOptions {
    /// The largest decompressed records section accepted, at least 1; `None` (the default) means
    /// [`default_decompression_limit`] of the topic's `max.message.bytes`.
    pub max_decompressed_bytes: Option<usize>,
}

diskless_common::with_setters!(ValidationOptions {
    with_max_decompressed_bytes => max_decompressed_bytes: [Option<usize>],
});

impl ValidationOptions {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_decompressed_bytes == Some(0) {
            return Err(ConfigError::invalid(
                "max_decompressed_bytes",
                "must be at least 1 (or None for the topic's default)",
            ));
        }
        Ok(())
    }
}

/// The default bound on a batch's decompressed records: 32 × `max.message.bytes`, at least 32 MiB.
pub fn default_decompression_limit(max_message_bytes: i32) -> usize {
    let mmb = usize::try_from(max_message_bytes.max(0)).unwrap_or(0);
    mmb.saturating_mul(32).max(32 << 20)
}

/// Scratch buffers above this size are released after use rather than kept.
const SCRATCH_KEEP: usize = 4 << 20;

/// A validator that keeps its decompression buffer between batches (no allocation per batch in the
/// steady state). One per thread/task.
#[derive(Debug, Default)]
pub struct Validator {
    options: ValidationOptions,
    scratch: Vec<u8>,
}

enum Mode<'a> {
    Client {
        config: &'a TopicConfig,
        now_ms: i64,
    },
    Stored,
}

/// Validate a batch a client produced, for a topic with `config`, at broker time `now_ms`.
///
/// ```
/// use diskless_core::{validate_batch, RecordBatchBuilder};
/// use diskless_coordinator::{ErrorCode, TopicConfig};
///
/// let now = 1_700_000_000_000;
/// let batch = RecordBatchBuilder::new().producer(5, 0, 0).record(now, None, Some(b"v")).build().unwrap();
/// let ok = validate_batch(&batch, &TopicConfig::default(), now).unwrap();
/// assert_eq!((ok.record_count, ok.last_sequence), (1, 0));
///
/// let too_old = RecordBatchBuilder::new().record(now - 10_000, None, Some(b"v")).build().unwrap();
/// let config = TopicConfig { message_timestamp_before_max_ms: 1_000, ..TopicConfig::default() };
/// let err = validate_batch(&too_old, &config, now).unwrap_err();
/// assert_eq!(err.error_code(), ErrorCode::InvalidTimestamp);
/// assert_eq!(err.record_index, Some(0));
/// ```
pub fn validate_batch(
    batch: &RecordBatch,
    config: &TopicConfig,
    now_ms: i64,
) -> Result<ValidatedBatch, ValidationError> {
    Validator::default().validate(batch, config, now_ms)
}

/// Validate one partition's `records` of a Produce request (v3+, the only versions that carry v2
/// batches): exactly one complete batch (see the [module documentation](self) for the codes), then
/// [`validate_batch`] on it. Returns the batch to store (a slice of `records`, without any
/// trailing partial batch, which Kafka drops too; or, on a topic whose `compression.type` is not
/// `producer` and not the batch's codec, the batch re-encoded with the topic's codec: see
/// [`stored_codec`]) and what the commit needs.
///
/// ```
/// use bytes::BytesMut;
/// use diskless_core::RecordBatchBuilder;
/// use diskless_core::validate::validate_produce_records;
/// use diskless_coordinator::{ErrorCode, TopicConfig};
///
/// let now = 1_700_000_000_000;
/// let batch = RecordBatchBuilder::new().record(now, None, Some(b"v")).build().unwrap();
/// let (stored, ok) = validate_produce_records(batch.as_bytes(), &TopicConfig::default(), now).unwrap();
/// assert_eq!((stored, ok.record_count), (batch.clone(), 1));
///
/// // Two batches for one partition: Kafka's INVALID_RECORD.
/// let mut two = BytesMut::new();
/// two.extend_from_slice(batch.as_bytes());
/// two.extend_from_slice(batch.as_bytes());
/// let err = validate_produce_records(&two.freeze(), &TopicConfig::default(), now).unwrap_err();
/// assert_eq!(err.error_code(), ErrorCode::InvalidRecord);
/// ```
pub fn validate_produce_records(
    records: &Bytes,
    config: &TopicConfig,
    now_ms: i64,
) -> Result<(RecordBatch, ValidatedBatch), ValidationError> {
    Validator::default().validate_produce_records(records, config, now_ms)
}

/// The smallest `batchLength` Kafka's batch iteration accepts before it looks at the magic (the
/// size of the smallest v0 record, `LegacyRecord.RECORD_OVERHEAD_V0`).
const MIN_BATCH_LENGTH: i32 = 14;

/// Kafka's `ByteBufferLogInputStream.nextBatch` at `pos`: `Ok(None)` when the bytes left cannot hold
/// a complete batch (fewer than 12, fewer than 17 once `batchLength` is read, or fewer than
/// `batchLength + 12`); an error for a `batchLength` below 14 or a magic outside 0..=2; else the
/// batch's size and magic.
fn next_batch(records: &[u8], pos: usize) -> Result<Option<(usize, i8)>, ValidationError> {
    let remaining = records.len().saturating_sub(pos);
    if remaining < LOG_OVERHEAD {
        return Ok(None);
    }
    let batch_length = read_i32(records, pos + BATCH_LENGTH_OFFSET);
    if batch_length < MIN_BATCH_LENGTH {
        return Err(ValidationError::new(
            ValidationErrorKind::BatchLengthBelowMinimum { batch_length },
            format!(
                "record size {batch_length} is less than the minimum record overhead ({MIN_BATCH_LENGTH})"
            ),
        ));
    }
    if remaining <= MAGIC_OFFSET {
        return Ok(None);
    }
    let magic = records[pos + MAGIC_OFFSET] as i8;
    if !(0..=MAGIC_V2).contains(&magic) {
        return Err(BatchError::UnsupportedMagic(magic).into());
    }
    // batch_length >= 14, so this is positive and fits (at most i32::MAX + 12).
    let size = batch_length as usize + LOG_OVERHEAD;
    if remaining < size {
        return Ok(None);
    }
    Ok(Some((size, magic)))
}

/// Check a batch as stored or served (after the fetch-path rewrites): framing, CRC, header
/// consistency and record structure, without the client-only rules (base offset, control batches,
/// timestamps, size).
pub fn verify_stored_batch(batch: &RecordBatch) -> Result<ValidatedBatch, ValidationError> {
    Validator::default().verify_stored(batch)
}

impl Validator {
    /// A validator with the given options, or the first of them out of range.
    pub fn new(options: ValidationOptions) -> Result<Self, ConfigError> {
        options.validate()?;
        Ok(Validator {
            options,
            scratch: Vec::new(),
        })
    }

    /// See [`validate_batch`].
    pub fn validate(
        &mut self,
        batch: &RecordBatch,
        config: &TopicConfig,
        now_ms: i64,
    ) -> Result<ValidatedBatch, ValidationError> {
        let limit = self.limit(config);
        self.run(batch, Mode::Client { config, now_ms }, limit)
    }

    /// See [`validate_produce_records`].
    pub fn validate_produce_records(
        &mut self,
        records: &Bytes,
        config: &TopicConfig,
        now_ms: i64,
    ) -> Result<(RecordBatch, ValidatedBatch), ValidationError> {
        self.validate_produce_records_owned(records.clone(), config, now_ms)
    }

    /// [`validate_produce_records`](Self::validate_produce_records) of records the caller gives
    /// up (the writer's path: the batch keeps the records' buffer without a reference-count round
    /// trip).
    pub(crate) fn validate_produce_records_owned(
        &mut self,
        mut records: Bytes,
        config: &TopicConfig,
        now_ms: i64,
    ) -> Result<(RecordBatch, ValidatedBatch), ValidationError> {
        use ValidationErrorKind as K;
        let Some((size, magic)) = next_batch(&records, 0)? else {
            return Err(ValidationError::new(
                K::NoRecordBatch,
                "produce requests must have at least one complete record batch per partition"
                    .into(),
            ));
        };
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic).into());
        }
        if next_batch(&records, size)?.is_some() {
            return Err(ValidationError::new(
                K::MoreThanOneBatch,
                "produce requests are only allowed to contain exactly one record batch per partition"
                    .into(),
            ));
        }
        records.truncate(size);
        if size < HEADER_LEN {
            // Kafka's analyzeAndValidateRecords on a v2 batch cut short: the base offset, then the
            // size, then "corrupt" (its CRC check fails below the header size).
            check_base_offset(read_i64(&records, BASE_OFFSET_OFFSET))?;
            check_size(size, i64::from(config.max_message_bytes))?;
            return Err(BatchError::TooShort { size }.into());
        }
        let batch = RecordBatch::parse(records)?;
        // `run_inner`, not `validate`: the decompressed records stay in the scratch buffer for a
        // re-encoding, which then need not decompress them again.
        let limit = self.limit(config);
        let result = self
            .run_inner(&batch, &Mode::Client { config, now_ms }, limit)
            .and_then(|validated| match stored_codec(config) {
                Some(target) if target != validated.compression => {
                    self.recompress(&batch, validated, target, config)
                }
                _ => Ok((batch, validated)),
            });
        self.release_scratch();
        result
    }

    /// The decompression bound for a topic with `config`.
    fn limit(&self, config: &TopicConfig) -> usize {
        self.options
            .max_decompressed_bytes
            .unwrap_or_else(|| default_decompression_limit(config.max_message_bytes))
    }

    /// Frees a scratch buffer grown beyond [`SCRATCH_KEEP`].
    fn release_scratch(&mut self) {
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
    }

    /// Kafka's `LogValidator.buildRecordsAndAssignOffsets` for a batch whose codec is not the
    /// topic's `compression.type`: the same records (offset deltas, timestamps, keys, values,
    /// headers) and producer fields in a batch of the topic's codec at the topic's level, its CRC
    /// computed anew; then, as Kafka's `UnifiedLog.append` after a re-compression, the new size
    /// against `max.message.bytes`.
    ///
    /// The records section is kept byte for byte: validation already required each offset delta
    /// to be its index, and the timestamp deltas stay relative to the header's `baseTimestamp`,
    /// so every record reads back as sent (Kafka's builder takes the first record's timestamp as
    /// the base, which changes the deltas, not the records' timestamps).
    fn recompress(
        &mut self,
        batch: &RecordBatch,
        mut validated: ValidatedBatch,
        target: Compression,
        config: &TopicConfig,
    ) -> Result<(RecordBatch, ValidatedBatch), ValidationError> {
        let raw = &batch.as_bytes()[HEADER_LEN..];
        let plain: &[u8] = if validated.compression == Compression::None {
            raw
        } else {
            // Validation left the decompressed records in the scratch buffer; decompress again
            // only if it did not (within the limit validation already passed).
            if self.scratch.len() != validated.uncompressed_records_size {
                let limit = self.limit(config);
                decompress(validated.compression, raw, limit, &mut self.scratch).map_err(|e| {
                    let msg = format!("records do not decompress again for re-encoding: {e}");
                    ValidationError::new(ValidationErrorKind::Decompression(e), msg)
                })?;
            }
            &self.scratch
        };
        let body =
            compress_with_level(target, codec_level(config, target), plain).map_err(|e| {
                let msg = format!("the batch could not be re-encoded as {target:?}: {e}");
                ValidationError::new(ValidationErrorKind::Recompression(e), msg)
            })?;
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&batch.as_bytes()[..HEADER_LEN]);
        out.extend_from_slice(&body);
        drop(body);
        check_size(out.len(), i64::from(config.max_message_bytes))?;
        let batch_length = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| {
            ValidationError::new(
                ValidationErrorKind::TooLarge {
                    size: out.len(),
                    max: config.max_message_bytes,
                },
                format!("the re-encoded batch of {} bytes is too large", out.len()),
            )
        })?;
        out[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4]
            .copy_from_slice(&batch_length.to_be_bytes());
        let attributes = batch.attributes().with_compression(target);
        out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attributes.0.to_be_bytes());
        update_crc(&mut out);
        let stored = RecordBatch::parse(Bytes::from(out))?;
        validated.compression = target;
        validated.byte_size = u32::try_from(stored.len()).unwrap_or(u32::MAX);
        Ok((stored, validated))
    }

    /// See [`verify_stored_batch`].
    pub fn verify_stored(
        &mut self,
        batch: &RecordBatch,
    ) -> Result<ValidatedBatch, ValidationError> {
        let limit = self.options.max_decompressed_bytes.unwrap_or_else(|| {
            default_decompression_limit(TopicConfig::default().max_message_bytes)
        });
        self.run(batch, Mode::Stored, limit)
    }

    fn run(
        &mut self,
        batch: &RecordBatch,
        mode: Mode<'_>,
        limit: usize,
    ) -> Result<ValidatedBatch, ValidationError> {
        let result = self.run_inner(batch, &mode, limit);
        self.release_scratch();
        result
    }

    fn run_inner(
        &mut self,
        batch: &RecordBatch,
        mode: &Mode<'_>,
        limit: usize,
    ) -> Result<ValidatedBatch, ValidationError> {
        use ValidationErrorKind as K;
        let size = batch.len();
        if let Mode::Client { config, .. } = mode {
            check_base_offset(batch.base_offset())?;
            check_size(size, i64::from(config.max_message_bytes))?;
        }
        let computed = batch.compute_crc();
        if computed != batch.crc() {
            return Err(ValidationError::new(
                K::CrcMismatch {
                    stored: batch.crc(),
                    computed,
                },
                format!(
                    "record is corrupt (stored crc = {}, computed crc = {computed})",
                    batch.crc()
                ),
            ));
        }
        let attributes = batch.attributes();
        let Some(compression) = attributes.compression() else {
            let id = attributes.compression_id();
            return Err(ValidationError::new(
                K::UnknownCompression(id),
                format!("unknown compression type id {id}"),
            ));
        };
        let count_from_offsets = i64::from(batch.last_offset_delta()) + 1;
        if count_from_offsets <= 0 {
            return Err(ValidationError::new(
                K::InvalidOffsetRange,
                format!(
                    "batch has an invalid offset range: [{}, {}]",
                    batch.base_offset(),
                    batch.last_offset()
                ),
            ));
        }
        let count = batch.records_count();
        if count <= 0 {
            return Err(ValidationError::new(
                K::InvalidRecordCount,
                format!("invalid reported count for record batch: {count}"),
            ));
        }
        if count_from_offsets != i64::from(count) {
            return Err(ValidationError::new(
                K::InconsistentCount,
                format!(
                    "inconsistent batch offset range [{}, {}] and count of records {count}",
                    batch.base_offset(),
                    batch.last_offset()
                ),
            ));
        }
        if let Mode::Client { .. } = mode {
            if attributes.is_control() {
                return Err(ValidationError::new(
                    K::ControlBatch,
                    "clients are not allowed to write control records".into(),
                ));
            }
            if attributes.is_transactional() && !batch.has_producer_id() {
                return Err(ValidationError::new(
                    K::TransactionalWithoutProducerId,
                    "transactional records must have a producer id".into(),
                ));
            }
            if batch.has_producer_id() && batch.base_sequence() < 0 {
                return Err(ValidationError::new(
                    K::InvalidSequence,
                    format!(
                        "invalid sequence number {} in record batch with producerId {}",
                        batch.base_sequence(),
                        batch.producer_id()
                    ),
                ));
            }
        }
        let timestamp_type = attributes.timestamp_type();

        // Records.
        let raw = &batch.as_bytes()[HEADER_LEN..];
        let records: &[u8] = if compression == Compression::None {
            raw
        } else {
            match decompress(compression, raw, limit, &mut self.scratch) {
                Ok(()) => &self.scratch,
                Err(CompressionError::TooLarge { limit }) => {
                    return Err(ValidationError::new(
                        K::DecompressedTooLarge { limit },
                        format!("decompressed records exceed the limit of {limit} bytes"),
                    ));
                }
                Err(e) => {
                    let msg = format!("records of a {compression:?} batch do not decompress: {e}");
                    return Err(ValidationError::new(K::Decompression(e), msg));
                }
            }
        };

        let (check_ts, now_ms, before, after) = match mode {
            Mode::Client { config, now_ms }
                if config.timestamp_type == TimestampType::CreateTime =>
            {
                (
                    true,
                    *now_ms,
                    config.message_timestamp_before_max_ms,
                    config.message_timestamp_after_max_ms,
                )
            }
            _ => (false, 0, 0, 0),
        };
        // Kafka's `LogValidator.validateKey`: on a compacted topic (`compact` or
        // `compact,delete`) every record needs a key.
        let compacted =
            matches!(mode, Mode::Client { config, .. } if config.cleanup_policy.compacts());
        let base_ts = batch.base_timestamp();
        let mut max_ts = NO_TIMESTAMP;
        let mut first_ts_error: Option<ValidationError> = None;
        let mut first_record_error: Option<ValidationError> = None;
        // Kafka's per-record errors (`ApiRecordError`s), every one of them.
        let mut record_errors: Vec<(usize, String)> = Vec::new();
        for (i, rec) in RecordIter::new(records, count as usize).enumerate() {
            let rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    let err = ValidationError::new(
                        K::Record(e.kind),
                        format!("found invalid record structure: {e}"),
                    );
                    return Err(if e.kind == RecordErrorKind::TrailingBytes {
                        err
                    } else {
                        err.at(e.index)
                    });
                }
            };
            if rec.offset_delta != i as i32 && first_record_error.is_none() {
                first_record_error = Some(
                    ValidationError::new(
                        K::NonSequentialOffset {
                            expected: i as i32,
                            actual: rec.offset_delta,
                        },
                        format!(
                            "record {i} has offsetDelta {}, expected {i} (inner offsets must be sequential)",
                            rec.offset_delta
                        ),
                    )
                    .at(i),
                );
            }
            let ts = rec.timestamp(base_ts);
            if ts > max_ts {
                max_ts = ts;
            }
            // Kafka's `validateRecord`: a record's key error is its error (its timestamp is then
            // not checked).
            let keyless = compacted && rec.key.is_none();
            if keyless {
                let message = "Compacted topic cannot accept message without key".to_string();
                record_errors.push((i, message.clone()));
                if first_record_error.is_none() {
                    first_record_error =
                        Some(ValidationError::new(K::KeylessRecordInCompactedTopic, message).at(i));
                }
            }
            if check_ts && !keyless && ts != NO_TIMESTAMP {
                let diff = i128::from(now_ms) - i128::from(ts);
                if diff > i128::from(before) || -diff > i128::from(after) {
                    let message = format!(
                        "timestamp {ts} of record {i} is out of range: it should be within [{}, {}]",
                        now_ms.saturating_sub(before),
                        now_ms.saturating_add(after)
                    );
                    record_errors.push((i, message.clone()));
                    if first_ts_error.is_none() {
                        first_ts_error = Some(
                            ValidationError::new(K::TimestampOutOfRange { timestamp: ts }, message)
                                .at(i),
                        );
                    }
                }
            }
        }
        // Per-record errors, as Kafka's processRecordErrors ranks them: a timestamp error first.
        if matches!(mode, Mode::Client { .. }) && timestamp_type == TimestampType::LogAppendTime {
            return Err(ValidationError::new(
                K::LogAppendTimeFromProducer,
                "invalid timestamp type in record batch: producer should not set timestamp type to LogAppendTime".into(),
            )
            .at(0));
        }
        if let Some(mut e) = first_ts_error.or(first_record_error) {
            if !record_errors.is_empty()
                && matches!(
                    e.kind,
                    K::TimestampOutOfRange { .. } | K::KeylessRecordInCompactedTopic
                )
            {
                // Kafka's `processRecordErrors`: every record's error, and a summary naming the
                // first three.
                let shown: Vec<String> = record_errors
                    .iter()
                    .take(3)
                    .map(|(i, m)| format!("RecordError(batchIndex={i}, message='{m}')"))
                    .collect();
                e.message = format!(
                    "One or more records have been rejected due to {} record errors in total, \
                     and only showing the first three errors at most: [{}]",
                    record_errors.len(),
                    shown.join(", ")
                );
                e.record_errors = record_errors;
            }
            return Err(e);
        }
        // Last, as Kafka's ProducerAppendInfo does after LogValidator: the epoch of an idempotent
        // batch against the epoch of a producer new to the partition (-1).
        if matches!(mode, Mode::Client { .. })
            && batch.has_producer_id()
            && batch.producer_epoch() < NO_PRODUCER_EPOCH
        {
            return Err(ValidationError::new(
                K::InvalidProducerEpoch {
                    epoch: batch.producer_epoch(),
                },
                format!(
                    "epoch of producer {} is {}, which is smaller than the last seen epoch {NO_PRODUCER_EPOCH}",
                    batch.producer_id(),
                    batch.producer_epoch()
                ),
            ));
        }
        Ok(ValidatedBatch {
            record_count: count,
            base_timestamp: base_ts,
            max_timestamp: batch.max_timestamp(),
            max_record_timestamp: max_ts,
            timestamp_type,
            producer_id: batch.producer_id(),
            producer_epoch: batch.producer_epoch(),
            base_sequence: batch.base_sequence(),
            last_sequence: batch.last_sequence(),
            transactional: attributes.is_transactional(),
            compression,
            byte_size: u32::try_from(size).unwrap_or(u32::MAX),
            uncompressed_records_size: records.len(),
        })
    }
}

/// Kafka's rule of Produce v3 to v6 (`ProduceRequest.validateRecords`): a ZStandard batch needs
/// Produce v7, else `UNSUPPORTED_COMPRESSION_TYPE`. `records` is one partition's `records` field;
/// a host calls this before [`validate_produce_records`] (which does not know the request's
/// version). Bytes that do not start with a v2 batch header pass: validation judges them.
///
/// ```
/// use diskless_core::{Compression, RecordBatchBuilder};
/// use diskless_core::validate::check_produce_codec;
/// use diskless_coordinator::ErrorCode;
///
/// let zstd = RecordBatchBuilder::new().compression(Compression::Zstd)
///     .record(0, None, Some(b"v")).build().unwrap();
/// assert!(check_produce_codec(7, zstd.as_bytes()).is_ok());
/// let err = check_produce_codec(6, zstd.as_bytes()).unwrap_err();
/// assert_eq!(err.error_code(), ErrorCode::UnsupportedCompressionType);
/// ```
pub fn check_produce_codec(version: i16, records: &[u8]) -> Result<(), ValidationError> {
    if version >= 7 || records.len() < ATTRIBUTES_OFFSET + 2 {
        return Ok(());
    }
    if records[MAGIC_OFFSET] as i8 != MAGIC_V2 {
        return Ok(());
    }
    let attributes = crate::batch::Attributes(read_i16(records, ATTRIBUTES_OFFSET));
    if attributes.compression() == Some(Compression::Zstd) {
        return Err(ValidationError::new(
            ValidationErrorKind::ZstdBeforeProduceV7 { version },
            format!(
                "Produce requests with version {version} are not allowed to use ZStandard compression"
            ),
        ));
    }
    Ok(())
}

/// Kafka's rule of Fetch v4 to v9 (`KafkaApis.maybeConvertFetchedData`): a partition of a topic
/// whose `compression.type` is `zstd` is answered `UNSUPPORTED_COMPRESSION_TYPE`, without records,
/// since such a client cannot read ZStandard (a `producer` topic's ZStandard batches are served, as
/// Kafka serves them).
///
/// ```
/// use diskless_core::validate::fetch_codec_error;
/// use diskless_coordinator::{ErrorCode, TopicCompression, TopicConfig};
///
/// let zstd = TopicConfig::default().with_compression_type(TopicCompression::Zstd);
/// assert_eq!(fetch_codec_error(&zstd, 9), Some(ErrorCode::UnsupportedCompressionType));
/// assert_eq!(fetch_codec_error(&zstd, 10), None);
/// assert_eq!(fetch_codec_error(&TopicConfig::default(), 4), None);
/// ```
pub fn fetch_codec_error(config: &TopicConfig, fetch_version: i16) -> Option<ErrorCode> {
    (config.compression_type == TopicCompression::Zstd && fetch_version < 10)
        .then_some(ErrorCode::UnsupportedCompressionType)
}

/// The level `codec` compresses at on a topic with `config`: `compression.gzip.level` and
/// `compression.zstd.level`; `None` (the codec's own) for the others: Snappy has no level, and
/// `lz4_flex` has one compressor, so `compression.lz4.level` does not apply (see
/// [`compress_with_level`]).
pub fn codec_level(config: &TopicConfig, codec: Compression) -> Option<i32> {
    match codec {
        Compression::Gzip => Some(config.compression_gzip_level),
        Compression::Zstd => Some(config.compression_zstd_level),
        _ => None,
    }
}

/// The codec batches are stored with on a topic with `config`: `None` for
/// `compression.type=producer` (each as its producer sent it), else the topic's codec (Kafka's
/// `BrokerCompressionType`).
pub fn stored_codec(config: &TopicConfig) -> Option<Compression> {
    Some(match config.compression_type {
        TopicCompression::Producer => return None,
        TopicCompression::Uncompressed => Compression::None,
        TopicCompression::Gzip => Compression::Gzip,
        TopicCompression::Snappy => Compression::Snappy,
        TopicCompression::Lz4 => Compression::Lz4,
        TopicCompression::Zstd => Compression::Zstd,
    })
}

/// Kafka's `analyzeAndValidateRecords` rule for a v2 batch from a client: `baseOffset` must be 0.
fn check_base_offset(base_offset: i64) -> Result<(), ValidationError> {
    if base_offset != 0 {
        return Err(ValidationError::new(
            ValidationErrorKind::NonZeroBaseOffset,
            format!("the baseOffset of the record batch should be 0, but it is {base_offset}"),
        ));
    }
    Ok(())
}

/// The batch (header included) must not be larger than `max.message.bytes`.
fn check_size(size: usize, max_size: i64) -> Result<(), ValidationError> {
    if size as i64 > max_size {
        return Err(ValidationError::new(
            ValidationErrorKind::TooLarge {
                size,
                max: i32::try_from(max_size).unwrap_or(i32::MAX),
            },
            format!(
                "the record batch size {size} bytes exceeds the maximum configured value of {max_size} (max.message.bytes)"
            ),
        ));
    }
    Ok(())
}
