//! A zero-copy view of one Kafka RecordBatch (magic v2).
//!
//! The v2 batch header is 61 bytes, all integers big-endian:
//!
//! | bytes    | field                  |
//! |----------|------------------------|
//! | 0..8     | baseOffset             |
//! | 8..12    | batchLength (bytes after this field) |
//! | 12..16   | partitionLeaderEpoch   |
//! | 16       | magic (2)              |
//! | 17..21   | crc (CRC-32C of bytes 21..end) |
//! | 21..23   | attributes             |
//! | 23..27   | lastOffsetDelta        |
//! | 27..35   | baseTimestamp          |
//! | 35..43   | maxTimestamp           |
//! | 43..51   | producerId             |
//! | 51..53   | producerEpoch          |
//! | 53..57   | baseSequence           |
//! | 57..61   | recordsCount           |
//!
//! [`RecordBatch::parse`] checks the framing only (size, `batchLength`, magic); the CRC and everything
//! else is checked by [`crate::validate`].

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, TimestampType};

/// Offset of `baseOffset` (i64).
pub const BASE_OFFSET_OFFSET: usize = 0;
/// Offset of `batchLength` (i32): the number of bytes that follow this field.
pub const BATCH_LENGTH_OFFSET: usize = 8;
/// Offset of `partitionLeaderEpoch` (i32).
pub const PARTITION_LEADER_EPOCH_OFFSET: usize = 12;
/// Offset of `magic` (i8).
pub const MAGIC_OFFSET: usize = 16;
/// Offset of `crc` (u32).
pub const CRC_OFFSET: usize = 17;
/// Offset of `attributes` (i16). The CRC covers the bytes from here to the end of the batch.
pub const ATTRIBUTES_OFFSET: usize = 21;
/// Offset of `lastOffsetDelta` (i32).
pub const LAST_OFFSET_DELTA_OFFSET: usize = 23;
/// Offset of `baseTimestamp` (i64).
pub const BASE_TIMESTAMP_OFFSET: usize = 27;
/// Offset of `maxTimestamp` (i64).
pub const MAX_TIMESTAMP_OFFSET: usize = 35;
/// Offset of `producerId` (i64).
pub const PRODUCER_ID_OFFSET: usize = 43;
/// Offset of `producerEpoch` (i16).
pub const PRODUCER_EPOCH_OFFSET: usize = 51;
/// Offset of `baseSequence` (i32).
pub const BASE_SEQUENCE_OFFSET: usize = 53;
/// Offset of `recordsCount` (i32).
pub const RECORDS_COUNT_OFFSET: usize = 57;
/// Size of the v2 batch header; the records start here.
pub const HEADER_LEN: usize = 61;
/// Size of `baseOffset` + `batchLength` (Kafka's `LOG_OVERHEAD`).
pub const LOG_OVERHEAD: usize = 12;
/// The only magic value this crate reads and writes.
pub const MAGIC_V2: i8 = 2;

/// Attribute bits 0..2: compression codec.
pub const COMPRESSION_CODEC_MASK: i16 = 0x07;
/// Attribute bit 3: timestamp type (set = LogAppendTime).
pub const TIMESTAMP_TYPE_MASK: i16 = 0x08;
/// Attribute bit 4: transactional batch.
pub const TRANSACTIONAL_MASK: i16 = 0x10;
/// Attribute bit 5: control batch.
pub const CONTROL_MASK: i16 = 0x20;
/// Attribute bit 6: the batch carries a delete horizon in `baseTimestamp`.
pub const DELETE_HORIZON_MASK: i16 = 0x40;

/// A framing error: the bytes are not one v2 record batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Fewer bytes than a batch header, or a `batchLength` smaller than the header needs.
    #[error(
        "record batch is corrupt: size {size} is smaller than the minimum batch size {HEADER_LEN}"
    )]
    TooShort {
        /// The size seen (buffer length, or `batchLength + 12`).
        size: usize,
    },
    /// `batchLength + 12` does not equal the size of the buffer.
    #[error(
        "record batch is corrupt: batchLength {batch_length} implies {} bytes but the buffer has {actual}",
        *batch_length as i64 + LOG_OVERHEAD as i64
    )]
    LengthMismatch {
        /// The `batchLength` field.
        batch_length: i32,
        /// The buffer length.
        actual: usize,
    },
    /// A magic byte other than 2. Magic 0 and 1 (old message formats) are `INVALID_RECORD` as in
    /// Kafka's ProduceRequest (v3+ only carries v2 batches), whatever the message's size (a v0
    /// message can be as short as 26 bytes); any other value is `CORRUPT_MESSAGE`.
    #[error("record batch has unsupported magic {0} (only 2 is accepted)")]
    UnsupportedMagic(i8),
    /// The bytes end in the middle of a batch.
    #[error("trailing partial record batch: {remaining} bytes left at position {position}")]
    TrailingPartialBatch {
        /// Where the partial batch starts.
        position: usize,
        /// How many bytes are left.
        remaining: usize,
    },
}

impl BatchError {
    /// The Kafka error code for this error.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            BatchError::UnsupportedMagic(0 | 1) => ErrorCode::InvalidRecord,
            _ => ErrorCode::CorruptMessage,
        }
    }
}

/// The compression codec of a batch (attribute bits 0..2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// No compression (0).
    #[default]
    None,
    /// gzip (1).
    Gzip,
    /// Snappy in the xerial-java framing Kafka writes (2).
    Snappy,
    /// LZ4 frame format (3).
    Lz4,
    /// Zstandard (4).
    Zstd,
}

impl Compression {
    /// The codec's id in the attributes.
    pub fn id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// The codec for an id, or `None` for 5..7.
    pub fn from_id(id: u8) -> Option<Compression> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            _ => return None,
        })
    }

    /// Every codec, for tests and benchmarks.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
}

/// The attributes field of a batch header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Attributes(pub i16);

impl Attributes {
    /// The raw codec id (bits 0..2), 0..=7.
    pub fn compression_id(self) -> u8 {
        (self.0 & COMPRESSION_CODEC_MASK) as u8
    }

    /// The codec, or `None` for an unknown id (5..7).
    pub fn compression(self) -> Option<Compression> {
        Compression::from_id(self.compression_id())
    }

    /// The timestamp type (bit 3).
    pub fn timestamp_type(self) -> TimestampType {
        if self.0 & TIMESTAMP_TYPE_MASK != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    /// Whether the batch is part of a transaction (bit 4).
    pub fn is_transactional(self) -> bool {
        self.0 & TRANSACTIONAL_MASK != 0
    }

    /// Whether the batch holds control records (bit 5).
    pub fn is_control(self) -> bool {
        self.0 & CONTROL_MASK != 0
    }

    /// Whether `baseTimestamp` holds a delete horizon (bit 6).
    pub fn has_delete_horizon(self) -> bool {
        self.0 & DELETE_HORIZON_MASK != 0
    }

    /// These attributes with the codec replaced.
    pub fn with_compression(self, c: Compression) -> Attributes {
        Attributes((self.0 & !COMPRESSION_CODEC_MASK) | c.id() as i16)
    }

    /// These attributes with the timestamp type replaced.
    pub fn with_timestamp_type(self, t: TimestampType) -> Attributes {
        Attributes(set_bit(self.0, TIMESTAMP_TYPE_MASK, t.is_log_append_time()))
    }

    /// These attributes with the transactional bit replaced.
    pub fn with_transactional(self, on: bool) -> Attributes {
        Attributes(set_bit(self.0, TRANSACTIONAL_MASK, on))
    }

    /// These attributes with the control bit replaced.
    pub fn with_control(self, on: bool) -> Attributes {
        Attributes(set_bit(self.0, CONTROL_MASK, on))
    }

    /// These attributes with the delete-horizon bit replaced.
    pub fn with_delete_horizon(self, on: bool) -> Attributes {
        Attributes(set_bit(self.0, DELETE_HORIZON_MASK, on))
    }
}

fn set_bit(v: i16, mask: i16, on: bool) -> i16 {
    if on { v | mask } else { v & !mask }
}

/// Kafka's `DefaultRecordBatch.incrementSequence`: `sequence + increment`, wrapping from `i32::MAX`
/// to 0 (not to `i32::MIN`).
///
/// ```
/// use diskless_core::increment_sequence;
/// assert_eq!(increment_sequence(5, 3), 8);
/// assert_eq!(increment_sequence(i32::MAX, 1), 0);
/// assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
/// ```
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    // Java int arithmetic wraps; mirror it exactly.
    if sequence > i32::MAX.wrapping_sub(increment) {
        increment
            .wrapping_sub(i32::MAX.wrapping_sub(sequence))
            .wrapping_sub(1)
    } else {
        sequence.wrapping_add(increment)
    }
}

#[inline]
pub(crate) fn read_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn read_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn read_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// Recompute and store the CRC of a v2 batch held in a mutable buffer (the whole batch, header
/// included). Returns `false`, leaving the buffer unchanged, when it is shorter than a header.
///
/// Useful for tests that patch header fields.
pub fn update_crc(batch: &mut [u8]) -> bool {
    if batch.len() < HEADER_LEN {
        return false;
    }
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_OFFSET..]);
    batch[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    true
}

/// A zero-copy view of one v2 record batch.
///
/// Cloning is cheap (a reference count). The view only guarantees the framing: use
/// [`crate::validate_batch`] before trusting anything else.
///
/// ```
/// use diskless_core::{RecordBatch, RecordBatchBuilder};
///
/// let built = RecordBatchBuilder::new().record(1_700_000_000_000, None, Some(b"v")).build().unwrap();
/// let batch = RecordBatch::parse(built.as_bytes().clone()).unwrap();
/// assert_eq!(batch.records_count(), 1);
/// assert_eq!(batch.last_offset(), 0);
/// assert!(batch.crc_is_valid());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RecordBatch {
    bytes: Bytes,
}

impl std::fmt::Debug for RecordBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordBatch")
            .field("base_offset", &self.base_offset())
            .field("len", &self.len())
            .field("records_count", &self.records_count())
            .field("attributes", &self.attributes())
            .field("producer_id", &self.producer_id())
            .field("base_sequence", &self.base_sequence())
            .finish()
    }
}

impl RecordBatch {
    /// View `bytes` as exactly one v2 batch: at least [`HEADER_LEN`] bytes, `batchLength + 12` equal to
    /// the length, magic 2. Nothing else (CRC included) is checked. A complete message of an old
    /// format (magic 0 or 1, `batchLength` at least 14) is [`BatchError::UnsupportedMagic`] even when
    /// it is shorter than a v2 header, as in Kafka, which frames it before it looks at the magic.
    pub fn parse(bytes: Bytes) -> Result<RecordBatch, BatchError> {
        check_framing(&bytes)?;
        Ok(RecordBatch { bytes })
    }

    /// The batch's bytes, exactly as received.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The batch's bytes, exactly as received.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The batch's size in bytes (header included; Kafka's `sizeInBytes`).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The 61-byte header.
    pub fn header_bytes(&self) -> &[u8] {
        &self.bytes[..HEADER_LEN]
    }

    /// The records section (compressed for a compressed batch), after the header.
    pub fn records_bytes(&self) -> Bytes {
        self.bytes.slice(HEADER_LEN..)
    }

    /// `baseOffset`.
    pub fn base_offset(&self) -> i64 {
        read_i64(&self.bytes, BASE_OFFSET_OFFSET)
    }

    /// `batchLength`.
    pub fn batch_length(&self) -> i32 {
        read_i32(&self.bytes, BATCH_LENGTH_OFFSET)
    }

    /// `partitionLeaderEpoch`.
    pub fn partition_leader_epoch(&self) -> i32 {
        read_i32(&self.bytes, PARTITION_LEADER_EPOCH_OFFSET)
    }

    /// `magic` (always 2 for a parsed batch).
    pub fn magic(&self) -> i8 {
        self.bytes[MAGIC_OFFSET] as i8
    }

    /// The stored `crc`.
    pub fn crc(&self) -> u32 {
        read_i32(&self.bytes, CRC_OFFSET) as u32
    }

    /// `attributes`.
    pub fn attributes(&self) -> Attributes {
        Attributes(read_i16(&self.bytes, ATTRIBUTES_OFFSET))
    }

    /// `lastOffsetDelta`.
    pub fn last_offset_delta(&self) -> i32 {
        read_i32(&self.bytes, LAST_OFFSET_DELTA_OFFSET)
    }

    /// `baseTimestamp`.
    pub fn base_timestamp(&self) -> i64 {
        read_i64(&self.bytes, BASE_TIMESTAMP_OFFSET)
    }

    /// `maxTimestamp`.
    pub fn max_timestamp(&self) -> i64 {
        read_i64(&self.bytes, MAX_TIMESTAMP_OFFSET)
    }

    /// `producerId` (-1 when the producer is not idempotent).
    pub fn producer_id(&self) -> i64 {
        read_i64(&self.bytes, PRODUCER_ID_OFFSET)
    }

    /// `producerEpoch`.
    pub fn producer_epoch(&self) -> i16 {
        read_i16(&self.bytes, PRODUCER_EPOCH_OFFSET)
    }

    /// `baseSequence`.
    pub fn base_sequence(&self) -> i32 {
        read_i32(&self.bytes, BASE_SEQUENCE_OFFSET)
    }

    /// `recordsCount`.
    pub fn records_count(&self) -> i32 {
        read_i32(&self.bytes, RECORDS_COUNT_OFFSET)
    }

    /// `baseOffset + lastOffsetDelta` (wrapping, never panicking on garbage).
    pub fn last_offset(&self) -> i64 {
        self.base_offset()
            .wrapping_add(i64::from(self.last_offset_delta()))
    }

    /// Whether the batch has a producer id (`producerId >= 0`, Kafka's `hasProducerId`).
    pub fn has_producer_id(&self) -> bool {
        self.producer_id() >= 0
    }

    /// The sequence of the last record, wrapping at `i32::MAX` like Kafka; -1 when `baseSequence` is -1.
    pub fn last_sequence(&self) -> i32 {
        let base = self.base_sequence();
        if base == diskless_coordinator::NO_SEQUENCE {
            return diskless_coordinator::NO_SEQUENCE;
        }
        increment_sequence(base, self.last_offset_delta())
    }

    /// The timestamp type bit of the attributes.
    pub fn timestamp_type(&self) -> TimestampType {
        self.attributes().timestamp_type()
    }

    /// CRC-32C of bytes `21..end`, what `crc` should be.
    pub fn compute_crc(&self) -> u32 {
        crc32c::crc32c(&self.bytes[ATTRIBUTES_OFFSET..])
    }

    /// Whether the stored CRC matches the bytes.
    pub fn crc_is_valid(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

/// The smallest `batchLength` of a message of any format (Kafka's `LegacyRecord.RECORD_OVERHEAD_V0`).
const MIN_BATCH_LENGTH_ANY_MAGIC: usize = 14;

fn check_framing(bytes: &[u8]) -> Result<(), BatchError> {
    // A complete old-format message: Kafka's batch iteration frames it (batchLength >= 14, magic
    // 0..=2, all bytes present), then ProduceRequest refuses its magic with INVALID_RECORD.
    if bytes.len() > MAGIC_OFFSET
        && bytes.len() >= LOG_OVERHEAD + MIN_BATCH_LENGTH_ANY_MAGIC
        && i64::from(read_i32(bytes, BATCH_LENGTH_OFFSET)) + LOG_OVERHEAD as i64
            == bytes.len() as i64
    {
        let magic = bytes[MAGIC_OFFSET] as i8;
        if magic == 0 || magic == 1 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
    }
    if bytes.len() < HEADER_LEN {
        return Err(BatchError::TooShort { size: bytes.len() });
    }
    let batch_length = read_i32(bytes, BATCH_LENGTH_OFFSET);
    let implied = i64::from(batch_length) + LOG_OVERHEAD as i64;
    if implied < HEADER_LEN as i64 {
        return Err(BatchError::TooShort {
            size: implied.max(0) as usize,
        });
    }
    if implied != bytes.len() as i64 {
        return Err(BatchError::LengthMismatch {
            batch_length,
            actual: bytes.len(),
        });
    }
    let magic = bytes[MAGIC_OFFSET] as i8;
    if magic != MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(magic));
    }
    Ok(())
}

/// Split the `records` bytes of one partition of a Produce request (or any concatenation of batches)
/// into batches, without copying. An empty input gives an empty list; bytes that end inside a batch are
/// rejected ([`BatchError::TrailingPartialBatch`]), as is any batch that does not frame.
///
/// This is a framing utility (for fetched records, segments, tests). The produce path does not use
/// it: [`crate::validate::validate_produce_records`] applies Kafka's rules to a partition's records
/// (exactly one batch, a partial trailing batch ignored).
///
/// ```
/// use bytes::BytesMut;
/// use diskless_core::{split_batches, RecordBatchBuilder};
///
/// let a = RecordBatchBuilder::new().record(1, None, Some(b"a")).build().unwrap();
/// let b = RecordBatchBuilder::new().record(2, None, Some(b"b")).build().unwrap();
/// let mut buf = BytesMut::new();
/// buf.extend_from_slice(a.as_bytes());
/// buf.extend_from_slice(b.as_bytes());
/// let batches = split_batches(buf.freeze()).unwrap();
/// assert_eq!(batches.len(), 2);
/// ```
pub fn split_batches(records: Bytes) -> Result<Vec<RecordBatch>, BatchError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < records.len() {
        let remaining = records.len() - pos;
        if remaining < LOG_OVERHEAD {
            return Err(BatchError::TrailingPartialBatch {
                position: pos,
                remaining,
            });
        }
        let batch_length = read_i32(&records, pos + BATCH_LENGTH_OFFSET);
        let size = i64::from(batch_length) + LOG_OVERHEAD as i64;
        // Below the smallest message of any format: corrupt. Between that and a v2 header, `parse`
        // tells an old-format message (INVALID_RECORD) from a v2 batch cut short (corrupt).
        if size < (LOG_OVERHEAD + MIN_BATCH_LENGTH_ANY_MAGIC) as i64 {
            return Err(BatchError::TooShort {
                size: size.max(0) as usize,
            });
        }
        if size > remaining as i64 {
            return Err(BatchError::TrailingPartialBatch {
                position: pos,
                remaining,
            });
        }
        let size = size as usize;
        out.push(RecordBatch::parse(records.slice(pos..pos + size))?);
        pos += size;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RecordBatchBuilder;

    fn one() -> RecordBatch {
        RecordBatchBuilder::new()
            .producer(7, 3, 100)
            .record(10, Some(b"k"), Some(b"v"))
            .record(12, None, None)
            .build()
            .unwrap()
    }

    #[test]
    fn header_accessors() {
        let b = one();
        assert_eq!(b.base_offset(), 0);
        assert_eq!(b.batch_length() as usize + LOG_OVERHEAD, b.len());
        assert_eq!(b.magic(), 2);
        assert_eq!(b.last_offset_delta(), 1);
        assert_eq!(b.records_count(), 2);
        assert_eq!(b.base_timestamp(), 10);
        assert_eq!(b.max_timestamp(), 12);
        assert_eq!(b.producer_id(), 7);
        assert_eq!(b.producer_epoch(), 3);
        assert_eq!(b.base_sequence(), 100);
        assert_eq!(b.last_sequence(), 101);
        assert_eq!(b.last_offset(), 1);
        assert!(b.crc_is_valid());
        assert_eq!(b.header_bytes().len(), HEADER_LEN);
        assert_eq!(b.attributes().compression(), Some(Compression::None));
    }

    #[test]
    fn sequence_wraps_at_max_to_zero() {
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX, 0), i32::MAX);
        assert_eq!(increment_sequence(i32::MAX - 2, 5), 2);
        let b = RecordBatchBuilder::new()
            .producer(1, 0, i32::MAX)
            .record(1, None, Some(b"a"))
            .record(1, None, Some(b"b"))
            .build()
            .unwrap();
        assert_eq!(b.last_sequence(), 0);
        let b = RecordBatchBuilder::new()
            .record(1, None, Some(b"a"))
            .build()
            .unwrap();
        assert_eq!(b.last_sequence(), -1);
    }

    #[test]
    fn attributes_bits() {
        let a = Attributes(0)
            .with_compression(Compression::Zstd)
            .with_timestamp_type(TimestampType::LogAppendTime)
            .with_transactional(true)
            .with_control(true)
            .with_delete_horizon(true);
        assert_eq!(a.0, 4 | 8 | 16 | 32 | 64);
        assert_eq!(a.compression(), Some(Compression::Zstd));
        assert_eq!(a.timestamp_type(), TimestampType::LogAppendTime);
        assert!(a.is_transactional() && a.is_control() && a.has_delete_horizon());
        assert_eq!(Attributes(5).compression(), None);
        assert_eq!(Attributes(7).compression_id(), 7);
        let b = a
            .with_control(false)
            .with_transactional(false)
            .with_delete_horizon(false)
            .with_timestamp_type(TimestampType::CreateTime)
            .with_compression(Compression::None);
        assert_eq!(b.0, 0);
    }

    #[test]
    fn framing_errors() {
        let b = one();
        let bytes = b.as_bytes().clone();
        assert!(matches!(
            RecordBatch::parse(bytes.slice(..60)),
            Err(BatchError::TooShort { size: 60 })
        ));
        // Buffer longer than batchLength says.
        let mut longer = bytes.to_vec();
        longer.push(0);
        let e = RecordBatch::parse(Bytes::from(longer)).unwrap_err();
        assert!(matches!(e, BatchError::LengthMismatch { .. }));
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
        // Buffer shorter than batchLength says.
        let e = RecordBatch::parse(bytes.slice(..bytes.len() - 1)).unwrap_err();
        assert!(matches!(e, BatchError::LengthMismatch { .. }));
        // batchLength below the header.
        let mut v = bytes.to_vec();
        v[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(matches!(
            RecordBatch::parse(Bytes::from(v)),
            Err(BatchError::TooShort { .. })
        ));
        let mut v = bytes.to_vec();
        v[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(matches!(
            RecordBatch::parse(Bytes::from(v)),
            Err(BatchError::TooShort { size: 7 })
        ));
        // Magic.
        for (magic, code) in [
            (0i8, ErrorCode::InvalidRecord),
            (1, ErrorCode::InvalidRecord),
            (3, ErrorCode::CorruptMessage),
            (-1, ErrorCode::CorruptMessage),
        ] {
            let mut v = bytes.to_vec();
            v[MAGIC_OFFSET] = magic as u8;
            let e = RecordBatch::parse(Bytes::from(v)).unwrap_err();
            assert_eq!(e, BatchError::UnsupportedMagic(magic));
            assert_eq!(e.error_code(), code);
        }
    }

    /// A complete v0/v1 message of `len` bytes (fields after the magic are not looked at).
    fn legacy(magic: u8, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        v[8..12].copy_from_slice(&((len - 12) as i32).to_be_bytes());
        v[MAGIC_OFFSET] = magic;
        v
    }

    #[test]
    fn short_old_format_messages_are_invalid_record_not_corrupt() {
        // Issue #12 item 4: Kafka frames a message (batchLength >= 14, all bytes present) before it
        // looks at the magic, so a v0/v1 message shorter than a v2 header is INVALID_RECORD.
        for (magic, len) in [(0u8, 26usize), (1, 34), (0, 60), (1, 61), (0, 90)] {
            let v = legacy(magic, len);
            let e = RecordBatch::parse(Bytes::from(v.clone())).unwrap_err();
            assert_eq!(
                e,
                BatchError::UnsupportedMagic(magic as i8),
                "{magic} {len}"
            );
            assert_eq!(e.error_code(), ErrorCode::InvalidRecord);
            let e = split_batches(Bytes::from(v)).unwrap_err();
            assert_eq!(e.error_code(), ErrorCode::InvalidRecord, "{magic} {len}");
        }
        // Below the smallest message of any format, or a v2 batch cut short: corrupt.
        let e = RecordBatch::parse(Bytes::from(legacy(0, 25))).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
        let e = RecordBatch::parse(Bytes::from(legacy(2, 60))).unwrap_err();
        assert_eq!(e, BatchError::TooShort { size: 60 });
        assert_eq!(
            split_batches(Bytes::from(legacy(2, 40))).unwrap_err(),
            BatchError::TooShort { size: 40 }
        );
    }

    #[test]
    fn split_many_and_reject_trailing_partial() {
        let a = one();
        let mut v = Vec::new();
        for _ in 0..3 {
            v.extend_from_slice(a.as_bytes());
        }
        let all = Bytes::from(v.clone());
        let batches = split_batches(all.clone()).unwrap();
        assert_eq!(batches.len(), 3);
        assert!(batches.iter().all(|b| b == &a));
        assert!(split_batches(Bytes::new()).unwrap().is_empty());
        for cut in [1, 11, 12, 40, a.len() - 1] {
            let e = split_batches(all.slice(..2 * a.len() + cut)).unwrap_err();
            assert_eq!(
                e,
                BatchError::TrailingPartialBatch {
                    position: 2 * a.len(),
                    remaining: cut
                }
            );
            assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
        }
    }
}
