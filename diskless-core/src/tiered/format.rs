//! The byte formats of a tiered segment object, each exactly as Apache Kafka writes the file of the
//! same name (sources cited per item; `docs/tiered-consolidation.md` §1 and §2.1).
//!
//! ```text
//! offset 0                L          L+I        L+I+T     +X        +S           +E         +80
//! | .log (batches)        | .index   | .timeindex| .txnindex| .snapshot| epoch ckpt | trailer |
//! ```
//!
//! - `.log`: the record batches as Kafka's leader stores them (`LogSegment`, `FileRecords`).
//! - `.index` ([`OffsetIndex`]): 8-byte entries `relativeOffset: i32, position: i32`
//!   (`OffsetIndex.java`).
//! - `.timeindex` ([`TimeIndex`]): 12-byte entries `timestamp: i64, relativeOffset: i32`
//!   (`TimeIndex.java`).
//! - `.txnindex` ([`AbortedTxnEntry`]): 34-byte entries (`AbortedTxn.java`); empty when no
//!   transaction aborted in the segment.
//! - `.snapshot` ([`ProducerSnapshotEntry`]): the producer-state snapshot, version 1
//!   (`ProducerStateManager.writeSnapshot`).
//! - leader-epoch checkpoint ([`EpochEntry`]): text, `version\ncount\n<epoch> <offset>\n...`
//!   (`CheckpointFile`, `LeaderEpochCheckpointFile`).
//! - trailer ([`SegmentTrailer`]): 80 bytes, this project's, so that an object describes itself.
//!
//! [`SegmentIndexer`] is the index state machine of Kafka's `LogSegment.recover`: an independent
//! `recover()` of the `.log` rebuilds the `.index` and `.timeindex` byte for byte.
//!
//! Every parser here reads stored, untrusted bytes: it returns a [`FormatError`], never panics.

use bytes::{BufMut, Bytes, BytesMut};
use diskless_coordinator::TopicIdPartition;
use uuid::Uuid;

use crate::batch::{
    BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, HEADER_LEN, LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD,
    MAGIC_OFFSET, MAGIC_V2, MAX_TIMESTAMP_OFFSET,
};

/// Kafka's `RecordBatch.NO_TIMESTAMP`.
pub const NO_TIMESTAMP: i64 = -1;
/// The trailer's size.
pub const TRAILER_LEN: usize = SegmentLayout::TRAILER_LEN as usize;
/// The trailer's first 8 bytes.
pub const TRAILER_MAGIC: [u8; 8] = *b"DLTSEG01";
/// The size of one `.index` entry (`OffsetIndex.ENTRY_SIZE`).
pub const OFFSET_INDEX_ENTRY_LEN: usize = 8;
/// The size of one `.timeindex` entry (`TimeIndex.ENTRY_SIZE`).
pub const TIME_INDEX_ENTRY_LEN: usize = 12;
/// The size of one `.txnindex` entry (`AbortedTxn.TOTAL_SIZE`).
pub const ABORTED_TXN_LEN: usize = 34;
/// `AbortedTxn.CURRENT_VERSION`.
pub const ABORTED_TXN_VERSION: i16 = 0;
/// `ProducerStateManager.PRODUCER_SNAPSHOT_VERSION`.
pub const PRODUCER_SNAPSHOT_VERSION: i16 = 1;
/// A snapshot's fixed part: version (2), CRC (4), entry count (4).
pub const PRODUCER_SNAPSHOT_HEADER_LEN: usize = 10;
/// The size of one snapshot entry (8 + 2 + 4 + 8 + 4 + 8 + 4 + 8).
pub const PRODUCER_SNAPSHOT_ENTRY_LEN: usize = 46;
/// `LeaderEpochCheckpointFile.CURRENT_VERSION`.
pub const LEADER_EPOCH_CHECKPOINT_VERSION: i32 = 0;
/// Where the CRC-covered part of a snapshot starts (`PRODUCER_ENTRIES_OFFSET`).
const SNAPSHOT_CRC_START: usize = 6;

/// An error in stored segment bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// A section's length is not a whole number of entries, or too short for its fixed part.
    #[error("{section:?} section of {len} bytes is not a valid length")]
    BadLength {
        /// The section.
        section: Section,
        /// Its length.
        len: usize,
    },
    /// The object is shorter than its trailer, or its sections do not add up to its size.
    #[error("segment object of {len} bytes does not match its trailer (expects {expected})")]
    ObjectSize {
        /// The object's length.
        len: u64,
        /// What the trailer's sizes add up to (0 when there is no trailer).
        expected: u64,
    },
    /// The trailer does not start with [`TRAILER_MAGIC`].
    #[error("segment trailer has a bad magic")]
    BadMagic,
    /// A CRC-32C does not match.
    #[error("{section:?} CRC mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Crc {
        /// The section.
        section: Section,
        /// The stored CRC.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// An unknown version number.
    #[error("{section:?} has unknown version {version}")]
    Version {
        /// The section.
        section: Section,
        /// The version read.
        version: i64,
    },
    /// Entries out of order, or a field outside its range.
    #[error("{section:?} entry {index} is invalid: {reason}")]
    BadEntry {
        /// The section.
        section: Section,
        /// The entry (or line) number, from 0.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A batch of the `.log` does not frame (bad length, magic, truncated).
    #[error("log batch at position {position} is invalid: {reason}")]
    BadBatch {
        /// The batch's position.
        position: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A value does not fit the format (e.g. a `.log` over `i32::MAX` bytes, an offset not relative
    /// to the base as an `i32`).
    #[error("{what} {value} does not fit the segment format")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// Its value.
        value: i64,
    },
    /// An index has no room for another entry (Kafka's `isFull`).
    #[error("{section:?} is full")]
    IndexFull {
        /// The index.
        section: Section,
    },
}

/// The sections of a segment object and their sizes: `diskless-common`'s, the one definition for
/// the builder, the reader, the store (`diskless_storage::RemoteStorage`) and the coordinator's
/// rows (`diskless_coordinator::TieredSegment::layout`).
pub use diskless_common::{Section, SegmentLayout};

/// The trailer: what the object holds, so that a stray object describes itself.
///
/// Layout (80 bytes, big endian): magic `DLTSEG01` (8), topic id (16), partition `i32`, base offset
/// `i64`, end offset `i64` (inclusive), section sizes `L I T X S E` as `u32` (24), 8 zero bytes,
/// CRC-32C of the first 76 bytes as `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentTrailer {
    /// The partition the segment belongs to.
    pub partition: TopicIdPartition,
    /// The offset of its first batch.
    pub base_offset: i64,
    /// The last offset of its last batch (inclusive, as `RemoteLogSegmentMetadata.endOffset`).
    pub end_offset: i64,
    /// The section sizes.
    pub layout: SegmentLayout,
}

impl SegmentTrailer {
    /// The 80 bytes; fails when the `.log` size does not fit a `u32` (the builder keeps it within
    /// `i32::MAX`).
    pub fn encode(&self) -> Result<[u8; TRAILER_LEN], FormatError> {
        let log = u32::try_from(self.layout.log).map_err(|_| FormatError::OutOfRange {
            what: "log size",
            value: self.layout.log as i64,
        })?;
        let mut out = [0u8; TRAILER_LEN];
        let mut b = &mut out[..];
        b.put_slice(&TRAILER_MAGIC);
        b.put_slice(self.partition.topic_id.as_bytes());
        b.put_i32(self.partition.partition);
        b.put_i64(self.base_offset);
        b.put_i64(self.end_offset);
        for size in [
            log,
            self.layout.offset_index,
            self.layout.time_index,
            self.layout.txn_index,
            self.layout.producer_snapshot,
            self.layout.leader_epochs,
        ] {
            b.put_u32(size);
        }
        // 8 bytes of zero padding are already there.
        let crc = crc32c::crc32c(&out[..TRAILER_LEN - 4]);
        out[TRAILER_LEN - 4..].copy_from_slice(&crc.to_be_bytes());
        Ok(out)
    }

    /// Parse 80 trailer bytes: magic, CRC, zero padding, `base ≤ end`.
    pub fn parse(bytes: &[u8]) -> Result<SegmentTrailer, FormatError> {
        if bytes.len() != TRAILER_LEN {
            return Err(FormatError::BadLength {
                section: Section::Trailer,
                len: bytes.len(),
            });
        }
        if bytes[..8] != TRAILER_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let stored = be_u32(bytes, TRAILER_LEN - 4);
        let computed = crc32c::crc32c(&bytes[..TRAILER_LEN - 4]);
        if stored != computed {
            return Err(FormatError::Crc {
                section: Section::Trailer,
                stored,
                computed,
            });
        }
        if bytes[68..76].iter().any(|b| *b != 0) {
            return Err(bad(Section::Trailer, 0, "padding is not zero"));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&bytes[8..24]);
        let trailer = SegmentTrailer {
            partition: TopicIdPartition::new(Uuid::from_bytes(id), be_i32(bytes, 24)),
            base_offset: be_i64(bytes, 28),
            end_offset: be_i64(bytes, 36),
            layout: SegmentLayout {
                log: u64::from(be_u32(bytes, 44)),
                offset_index: be_u32(bytes, 48),
                time_index: be_u32(bytes, 52),
                txn_index: be_u32(bytes, 56),
                producer_snapshot: be_u32(bytes, 60),
                leader_epochs: be_u32(bytes, 64),
            },
        };
        if trailer.base_offset < 0 || trailer.end_offset < trailer.base_offset {
            return Err(bad(Section::Trailer, 0, "offsets out of order"));
        }
        if trailer.layout.log > i32::MAX as u64 {
            return Err(bad(Section::Trailer, 0, "log larger than i32::MAX"));
        }
        Ok(trailer)
    }
}

/// A whole segment object split into its sections (zero-copy slices of the object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentObject {
    /// The parsed trailer.
    pub trailer: SegmentTrailer,
    /// The `.log`.
    pub log: Bytes,
    /// The `.index`.
    pub offset_index: Bytes,
    /// The `.timeindex`.
    pub time_index: Bytes,
    /// The `.txnindex`.
    pub txn_index: Bytes,
    /// The `.snapshot`.
    pub producer_snapshot: Bytes,
    /// The `leader-epoch-checkpoint`.
    pub leader_epochs: Bytes,
}

impl SegmentObject {
    /// Split `object` by its trailer; the sizes must add up to the object's length. The sections
    /// themselves are parsed by their own types ([`OffsetIndex::parse`], ...).
    pub fn parse(object: Bytes) -> Result<SegmentObject, FormatError> {
        let len = object.len();
        if len < TRAILER_LEN {
            return Err(FormatError::ObjectSize {
                len: len as u64,
                expected: 0,
            });
        }
        let trailer = SegmentTrailer::parse(&object[len - TRAILER_LEN..])?;
        let layout = trailer.layout;
        if layout.object_size() != len as u64 {
            return Err(FormatError::ObjectSize {
                len: len as u64,
                expected: layout.object_size(),
            });
        }
        // Every range ends within `len` (checked above), so the casts and slices hold.
        let slice = |s: Section| {
            let r = layout.range(s);
            object.slice(r.start as usize..r.end as usize)
        };
        Ok(SegmentObject {
            trailer,
            log: slice(Section::Log),
            offset_index: slice(Section::OffsetIndex),
            time_index: slice(Section::TimeIndex),
            txn_index: slice(Section::TxnIndex),
            producer_snapshot: slice(Section::ProducerSnapshot),
            leader_epochs: slice(Section::LeaderEpochs),
        })
    }
}

/// An offset and the byte position of a batch in the `.log` (Kafka's `OffsetPosition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OffsetPosition {
    /// The absolute offset.
    pub offset: i64,
    /// The byte position in the `.log`.
    pub position: u32,
}

/// A timestamp and an offset (Kafka's `TimestampOffset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimestampOffset {
    /// The timestamp ([`NO_TIMESTAMP`] when none).
    pub timestamp: i64,
    /// The absolute offset.
    pub offset: i64,
}

/// A parsed `.index` (Kafka's `OffsetIndex`): sparse entries `(lastOffset of a batch, position of
/// that batch)`, strictly increasing in both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetIndex {
    base_offset: i64,
    bytes: Bytes,
}

impl OffsetIndex {
    /// Check `bytes` (a whole number of 8-byte entries, relative offsets `≥ 0` and strictly
    /// increasing, positions `≤ i32::MAX` and strictly increasing) and wrap them without copying.
    pub fn parse(base_offset: i64, bytes: Bytes) -> Result<OffsetIndex, FormatError> {
        let section = Section::OffsetIndex;
        if !bytes.len().is_multiple_of(OFFSET_INDEX_ENTRY_LEN) {
            return Err(FormatError::BadLength {
                section,
                len: bytes.len(),
            });
        }
        let mut prev: Option<(i32, i32)> = None;
        for (i, e) in bytes.chunks_exact(OFFSET_INDEX_ENTRY_LEN).enumerate() {
            let (rel, pos) = (be_i32(e, 0), be_i32(e, 4));
            if rel < 0 || pos < 0 {
                return Err(bad(section, i, "negative relative offset or position"));
            }
            if base_offset.checked_add(i64::from(rel)).is_none() {
                return Err(bad(section, i, "offset overflows"));
            }
            if let Some((prel, ppos)) = prev
                && (rel <= prel || pos <= ppos)
            {
                return Err(bad(section, i, "entries not strictly increasing"));
            }
            prev = Some((rel, pos));
        }
        Ok(OffsetIndex { base_offset, bytes })
    }

    /// The segment's base offset.
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / OFFSET_INDEX_ENTRY_LEN
    }

    /// Whether the index has no entry.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Entry `i` (absolute offset), or `None` past the end.
    pub fn entry(&self, i: usize) -> Option<OffsetPosition> {
        let e = self
            .bytes
            .get(i * OFFSET_INDEX_ENTRY_LEN..(i + 1) * OFFSET_INDEX_ENTRY_LEN)?;
        Some(OffsetPosition {
            // Checked by parse: non-negative, and the sum does not overflow.
            offset: self.base_offset + i64::from(be_i32(e, 0)),
            position: be_i32(e, 4) as u32,
        })
    }

    /// `OffsetIndex.lookup`: the entry with the largest offset `≤ target`, else `(base, 0)`. The
    /// batch holding `target` starts at or after the returned position
    /// ([`search_for_offset`] scans from there).
    pub fn lookup(&self, target: i64) -> OffsetPosition {
        // Entries strictly increase, so the entries ≤ target are a prefix.
        let n = partition_point(self.len(), |i| self.offset_at(i) <= target);
        match n.checked_sub(1).and_then(|i| self.entry(i)) {
            Some(e) => e,
            None => OffsetPosition {
                offset: self.base_offset,
                position: 0,
            },
        }
    }

    /// `OffsetIndex.fetchUpperBoundOffset`: the first entry whose position is `≥ start + size`
    /// (a bound for the aborted transactions a read of those bytes can need), or `None`.
    pub fn fetch_upper_bound_offset(
        &self,
        start_position: u32,
        fetch_size: u32,
    ) -> Option<OffsetPosition> {
        let target = u64::from(start_position) + u64::from(fetch_size);
        let n = partition_point(self.len(), |i| {
            self.entry(i).map_or(0, |e| u64::from(e.position)) < target
        });
        self.entry(n)
    }

    /// The raw entries.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    fn offset_at(&self, i: usize) -> i64 {
        self.entry(i).map_or(i64::MAX, |e| e.offset)
    }
}

/// A parsed `.timeindex` (Kafka's `TimeIndex`): entries `(max timestamp so far, last offset of the
/// batch holding it)`, timestamps strictly increasing, offsets non-decreasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeIndex {
    base_offset: i64,
    bytes: Bytes,
}

impl TimeIndex {
    /// Check `bytes` (whole 12-byte entries, timestamps strictly increasing, relative offsets `≥ 0`
    /// and non-decreasing) and wrap them without copying.
    pub fn parse(base_offset: i64, bytes: Bytes) -> Result<TimeIndex, FormatError> {
        let section = Section::TimeIndex;
        if !bytes.len().is_multiple_of(TIME_INDEX_ENTRY_LEN) {
            return Err(FormatError::BadLength {
                section,
                len: bytes.len(),
            });
        }
        let mut prev: Option<(i64, i32)> = None;
        for (i, e) in bytes.chunks_exact(TIME_INDEX_ENTRY_LEN).enumerate() {
            let (ts, rel) = (be_i64(e, 0), be_i32(e, 8));
            if rel < 0 || base_offset.checked_add(i64::from(rel)).is_none() {
                return Err(bad(section, i, "relative offset out of range"));
            }
            if let Some((pts, prel)) = prev
                && (ts <= pts || rel < prel)
            {
                return Err(bad(section, i, "entries out of order"));
            }
            prev = Some((ts, rel));
        }
        Ok(TimeIndex { base_offset, bytes })
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / TIME_INDEX_ENTRY_LEN
    }

    /// Whether the index has no entry.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Entry `i` (absolute offset), or `None` past the end.
    pub fn entry(&self, i: usize) -> Option<TimestampOffset> {
        let e = self
            .bytes
            .get(i * TIME_INDEX_ENTRY_LEN..(i + 1) * TIME_INDEX_ENTRY_LEN)?;
        Some(TimestampOffset {
            timestamp: be_i64(e, 0),
            offset: self.base_offset + i64::from(be_i32(e, 8)),
        })
    }

    /// `TimeIndex.lastEntry`: the last entry, or `(NO_TIMESTAMP, base)` when empty.
    pub fn last_entry(&self) -> TimestampOffset {
        self.len()
            .checked_sub(1)
            .and_then(|i| self.entry(i))
            .unwrap_or(TimestampOffset {
                timestamp: NO_TIMESTAMP,
                offset: self.base_offset,
            })
    }

    /// `TimeIndex.lookup`: the entry with the largest timestamp `≤ target`, else
    /// `(NO_TIMESTAMP, base)`.
    pub fn lookup(&self, target: i64) -> TimestampOffset {
        let n = partition_point(self.len(), |i| {
            self.entry(i).map_or(i64::MAX, |e| e.timestamp) <= target
        });
        n.checked_sub(1)
            .and_then(|i| self.entry(i))
            .unwrap_or(TimestampOffset {
                timestamp: NO_TIMESTAMP,
                offset: self.base_offset,
            })
    }

    /// The raw entries.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// The index state machine of Kafka's `LogSegment.recover` (and of Kafka 4's per-batch
/// `LogSegment.append`), fed one batch at a time in `.log` order:
///
/// ```text
/// if batch.maxTimestamp > maxTsSoFar: (maxTsSoFar, offsetOfMaxTs) = (batch.maxTimestamp, batch.lastOffset)
/// if position − lastIndexEntry > index.interval.bytes:
///     offsetIndex.append(batch.lastOffset, position); timeIndex.maybeAppend(maxTsSoFar, offsetOfMaxTs)
///     lastIndexEntry = position
/// position += batch.sizeInBytes
/// ...finally timeIndex.maybeAppend(maxTsSoFar, offsetOfMaxTs, skipFullCheck = true)
/// ```
///
/// So the first batch is never indexed, the comparison is `>` (a gap of exactly the interval adds
/// no entry), and a segment without timestamps has an empty time index (`maybeAppend` appends only
/// a timestamp greater than the last entry's, initially `(NO_TIMESTAMP, base)`).
#[derive(Debug, Clone)]
pub struct SegmentIndexer {
    base_offset: i64,
    index_interval_bytes: i64,
    offset_max_entries: usize,
    time_max_entries: usize,
    position: u64,
    last_index_entry: u64,
    max_ts_so_far: i64,
    offset_of_max_ts: i64,
    offset_index: BytesMut,
    time_index: BytesMut,
    time_last: TimestampOffset,
}

/// The indexes of a finished segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltIndexes {
    /// The `.index` bytes.
    pub offset_index: Bytes,
    /// The `.timeindex` bytes (with the final roll entry).
    pub time_index: Bytes,
    /// The largest batch `maxTimestamp` ([`NO_TIMESTAMP`] when none) and the last offset of the
    /// first batch holding it (`-1` when none).
    pub max_timestamp: TimestampOffset,
}

impl SegmentIndexer {
    /// A state machine for a segment starting at `base_offset`, with Kafka's
    /// `index.interval.bytes` and `segment.index.bytes` (the capacity of each index:
    /// `segment.index.bytes / 8` offset entries, `/ 12` time entries, rounded down as
    /// `AbstractIndex` does).
    pub fn new(base_offset: i64, index_interval_bytes: i32, segment_index_bytes: i32) -> Self {
        let index_bytes = usize::try_from(segment_index_bytes).unwrap_or(0);
        SegmentIndexer {
            base_offset,
            index_interval_bytes: i64::from(index_interval_bytes),
            offset_max_entries: index_bytes / OFFSET_INDEX_ENTRY_LEN,
            time_max_entries: index_bytes / TIME_INDEX_ENTRY_LEN,
            position: 0,
            last_index_entry: 0,
            max_ts_so_far: NO_TIMESTAMP,
            offset_of_max_ts: -1,
            offset_index: BytesMut::new(),
            time_index: BytesMut::new(),
            time_last: TimestampOffset {
                timestamp: NO_TIMESTAMP,
                offset: base_offset,
            },
        }
    }

    /// The segment's base offset.
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// The `.log` bytes fed so far (the next batch's position).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Offset index entries so far.
    pub fn offset_entries(&self) -> usize {
        self.offset_index.len() / OFFSET_INDEX_ENTRY_LEN
    }

    /// Time index entries so far.
    pub fn time_entries(&self) -> usize {
        self.time_index.len() / TIME_INDEX_ENTRY_LEN
    }

    /// `OffsetIndex.isFull`: `entries ≥ maxEntries`.
    pub fn offset_index_full(&self) -> bool {
        self.offset_entries() >= self.offset_max_entries
    }

    /// `TimeIndex.isFull`: `entries ≥ maxEntries − 1` (the last slot is kept for the roll entry).
    pub fn time_index_full(&self) -> bool {
        self.time_entries() as i64 >= self.time_max_entries as i64 - 1
    }

    /// The largest batch max timestamp so far and the last offset of the first batch holding it.
    pub fn max_timestamp_so_far(&self) -> TimestampOffset {
        TimestampOffset {
            timestamp: self.max_ts_so_far,
            offset: self.offset_of_max_ts,
        }
    }

    /// Feed the next batch of the `.log` (`recover()`'s loop body). Fails, changing nothing, when
    /// `last_offset` is not within `base..=base + i32::MAX`, when the `.log` would pass
    /// `i32::MAX` bytes, or when an entry is due and its index is full (Kafka throws there; a
    /// builder rolls before).
    pub fn append_batch(
        &mut self,
        last_offset: i64,
        max_timestamp: i64,
        size_in_bytes: u32,
    ) -> Result<(), FormatError> {
        let rel = self.relative(last_offset)?;
        let end = self.position + u64::from(size_in_bytes);
        if end > i32::MAX as u64 {
            return Err(FormatError::OutOfRange {
                what: "log size",
                value: end as i64,
            });
        }
        let (mut max_ts, mut max_off) = (self.max_ts_so_far, self.offset_of_max_ts);
        if max_timestamp > max_ts {
            (max_ts, max_off) = (max_timestamp, last_offset);
        }
        let due = self.position as i64 - self.last_index_entry as i64 > self.index_interval_bytes;
        if due {
            if self.offset_index_full() {
                return Err(FormatError::IndexFull {
                    section: Section::OffsetIndex,
                });
            }
            // `maybeAppend` without `skipFullCheck` throws on a full index even when it would not
            // append.
            if self.time_index_full() {
                return Err(FormatError::IndexFull {
                    section: Section::TimeIndex,
                });
            }
            if let Some(last) = self.offset_entries().checked_sub(1) {
                let prev = be_i32(&self.offset_index, last * OFFSET_INDEX_ENTRY_LEN);
                if rel <= prev {
                    return Err(FormatError::OutOfRange {
                        what: "offset index entry (not increasing)",
                        value: last_offset,
                    });
                }
            }
            self.offset_index.put_i32(rel);
            self.offset_index.put_i32(self.position as i32);
            self.last_index_entry = self.position;
        }
        self.max_ts_so_far = max_ts;
        self.offset_of_max_ts = max_off;
        if due {
            self.maybe_append_time(false)?;
        }
        self.position = end;
        Ok(())
    }

    /// `TimeIndex.maybeAppend(maxTsSoFar, offsetOfMaxTs, skipFullCheck)`.
    fn maybe_append_time(&mut self, skip_full_check: bool) -> Result<(), FormatError> {
        let (ts, off) = (self.max_ts_so_far, self.offset_of_max_ts);
        if ts <= self.time_last.timestamp {
            return Ok(());
        }
        if !skip_full_check && self.time_index_full() {
            return Err(FormatError::IndexFull {
                section: Section::TimeIndex,
            });
        }
        let rel = self.relative(off)?;
        self.time_index.put_i64(ts);
        self.time_index.put_i32(rel);
        self.time_last = TimestampOffset {
            timestamp: ts,
            offset: off,
        };
        Ok(())
    }

    /// Close the segment: the final `maybeAppend(..., skipFullCheck = true)` of `recover()` /
    /// `onBecomeInactiveSegment`. The entry is written even with a `segment.index.bytes` below 12,
    /// where Kafka's preallocated file has no slot for it (its append would fail): the time index
    /// always holds the segment's max timestamp, and a Kafka reader sizes an existing file by its
    /// length.
    pub fn finish(mut self) -> BuiltIndexes {
        // Without the full check the only error is a relative offset out of range, which every
        // fed batch passed already.
        let _ = self.maybe_append_time(true);
        BuiltIndexes {
            offset_index: self.offset_index.freeze(),
            time_index: self.time_index.freeze(),
            max_timestamp: TimestampOffset {
                timestamp: self.max_ts_so_far,
                offset: self.offset_of_max_ts,
            },
        }
    }

    fn relative(&self, offset: i64) -> Result<i32, FormatError> {
        offset
            .checked_sub(self.base_offset)
            .and_then(|d| i32::try_from(d).ok())
            .filter(|d| *d >= 0)
            .ok_or(FormatError::OutOfRange {
                what: "offset relative to the segment base",
                value: offset,
            })
    }
}

/// The header fields of one batch of a `.log`, as a scan over the file sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBatchHeader {
    /// The batch's position in the `.log`.
    pub position: u64,
    /// `baseOffset`.
    pub base_offset: i64,
    /// `baseOffset + lastOffsetDelta`.
    pub last_offset: i64,
    /// `batchLength + 12`.
    pub size: u32,
    /// `maxTimestamp`.
    pub max_timestamp: i64,
}

/// Walk the batch headers of a `.log` (Kafka's `FileRecords.batches()`): framing and magic only,
/// no CRC. Stops at the first error, which it yields.
pub fn log_batches(log: &[u8]) -> LogBatches<'_> {
    LogBatches {
        log,
        position: 0,
        failed: false,
    }
}

/// The iterator of [`log_batches`].
#[derive(Debug, Clone)]
pub struct LogBatches<'a> {
    log: &'a [u8],
    position: usize,
    failed: bool,
}

impl Iterator for LogBatches<'_> {
    type Item = Result<LogBatchHeader, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.position >= self.log.len() {
            return None;
        }
        let r = read_batch_header(self.log, self.position);
        match &r {
            Ok(h) => self.position += h.size as usize,
            Err(_) => self.failed = true,
        }
        Some(r)
    }
}

fn read_batch_header(log: &[u8], position: usize) -> Result<LogBatchHeader, FormatError> {
    let fail = |reason| FormatError::BadBatch {
        position: position as u64,
        reason,
    };
    let rest = &log[position..];
    if rest.len() < HEADER_LEN {
        return Err(fail("truncated header"));
    }
    let batch_length = be_i32(rest, BATCH_LENGTH_OFFSET);
    let size = i64::from(batch_length) + LOG_OVERHEAD as i64;
    if size < HEADER_LEN as i64 {
        return Err(fail("batchLength smaller than a header"));
    }
    if size > rest.len() as i64 {
        return Err(fail("truncated batch"));
    }
    if rest[MAGIC_OFFSET] as i8 != MAGIC_V2 {
        return Err(fail("magic is not 2"));
    }
    let base_offset = be_i64(rest, BASE_OFFSET_OFFSET);
    let delta = be_i32(rest, LAST_OFFSET_DELTA_OFFSET);
    let last_offset = base_offset
        .checked_add(i64::from(delta))
        .filter(|_| delta >= 0)
        .ok_or(fail("bad lastOffsetDelta"))?;
    Ok(LogBatchHeader {
        position: position as u64,
        base_offset,
        last_offset,
        size: size as u32,
        max_timestamp: be_i64(rest, MAX_TIMESTAMP_OFFSET),
    })
}

/// `FileRecords.searchForOffsetFromPosition`: from the batch at `start_position`, the first batch
/// whose last offset is `≥ target`, or `None` when the `.log` ends first. With
/// [`OffsetIndex::lookup`] this is Kafka's `LogSegment.translateOffset`.
pub fn search_for_offset(
    log: &[u8],
    start_position: u32,
    target: i64,
) -> Result<Option<LogBatchHeader>, FormatError> {
    let start = start_position as usize;
    if start > log.len() {
        return Err(FormatError::BadBatch {
            position: start as u64,
            reason: "position past the end of the log",
        });
    }
    for h in log_batches(&log[start..]) {
        let mut h = h.map_err(|e| shift(e, start))?;
        h.position += start as u64;
        if h.last_offset >= target {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

/// The batch level of `FileRecords.searchForTimestamp`: from `start_position`, the first batch
/// with `maxTimestamp ≥ target` and last offset `≥ starting_offset` (the record within it is found
/// by reading its records). With [`TimeIndex::lookup`] and [`OffsetIndex::lookup`] this is
/// Kafka's `LogSegment.findOffsetByTimestamp`.
pub fn search_for_timestamp(
    log: &[u8],
    start_position: u32,
    target: i64,
    starting_offset: i64,
) -> Result<Option<LogBatchHeader>, FormatError> {
    let start = start_position as usize;
    if start > log.len() {
        return Err(FormatError::BadBatch {
            position: start as u64,
            reason: "position past the end of the log",
        });
    }
    for h in log_batches(&log[start..]) {
        let mut h = h.map_err(|e| shift(e, start))?;
        h.position += start as u64;
        if h.max_timestamp >= target && h.last_offset >= starting_offset {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

fn shift(e: FormatError, by: usize) -> FormatError {
    match e {
        FormatError::BadBatch { position, reason } => FormatError::BadBatch {
            position: position + by as u64,
            reason,
        },
        other => other,
    }
}

/// One `.txnindex` entry (Kafka's `AbortedTxn`): version `i16` (0), producer id, first offset,
/// last offset (the ABORT marker's), last stable offset at the abort — 34 bytes, big endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AbortedTxnEntry {
    /// The producer id.
    pub producer_id: i64,
    /// The offset of the transaction's first batch.
    pub first_offset: i64,
    /// The offset of its ABORT marker.
    pub last_offset: i64,
    /// The partition's last stable offset when it aborted.
    pub last_stable_offset: i64,
}

impl AbortedTxnEntry {
    /// The 34 bytes.
    pub fn encode(&self) -> [u8; ABORTED_TXN_LEN] {
        let mut out = [0u8; ABORTED_TXN_LEN];
        let mut b = &mut out[..];
        b.put_i16(ABORTED_TXN_VERSION);
        b.put_i64(self.producer_id);
        b.put_i64(self.first_offset);
        b.put_i64(self.last_offset);
        b.put_i64(self.last_stable_offset);
        out
    }
}

/// Encode a `.txnindex` (entries in the given order; empty for none).
pub fn encode_txn_index(entries: &[AbortedTxnEntry]) -> Bytes {
    let mut b = BytesMut::with_capacity(entries.len() * ABORTED_TXN_LEN);
    for e in entries {
        b.put_slice(&e.encode());
    }
    b.freeze()
}

/// Parse a `.txnindex`: whole 34-byte entries of version 0, `first ≤ last`, last offsets strictly
/// increasing (`TransactionIndex.append` refuses anything else).
pub fn parse_txn_index(bytes: &[u8]) -> Result<Vec<AbortedTxnEntry>, FormatError> {
    let section = Section::TxnIndex;
    if !bytes.len().is_multiple_of(ABORTED_TXN_LEN) {
        return Err(FormatError::BadLength {
            section,
            len: bytes.len(),
        });
    }
    let mut out: Vec<AbortedTxnEntry> = Vec::with_capacity(bytes.len() / ABORTED_TXN_LEN);
    for (i, e) in bytes.chunks_exact(ABORTED_TXN_LEN).enumerate() {
        let version = be_i16(e, 0);
        if version != ABORTED_TXN_VERSION {
            return Err(FormatError::Version {
                section,
                version: i64::from(version),
            });
        }
        let entry = AbortedTxnEntry {
            producer_id: be_i64(e, 2),
            first_offset: be_i64(e, 10),
            last_offset: be_i64(e, 18),
            last_stable_offset: be_i64(e, 26),
        };
        if entry.first_offset > entry.last_offset || entry.first_offset < 0 {
            return Err(bad(section, i, "first offset after last offset"));
        }
        if out
            .last()
            .is_some_and(|p| p.last_offset >= entry.last_offset)
        {
            return Err(bad(section, i, "last offsets not strictly increasing"));
        }
        out.push(entry);
    }
    Ok(out)
}

/// `TransactionIndex.collectAbortedTxns(fetchOffset, upperBoundOffset)`: the entries with
/// `lastOffset ≥ fetch_offset && firstOffset < upper_bound`, and whether the search is complete
/// (an entry's last stable offset reached `upper_bound`, so no later segment can add one).
pub fn collect_aborted_txns(
    entries: &[AbortedTxnEntry],
    fetch_offset: i64,
    upper_bound: i64,
) -> (Vec<AbortedTxnEntry>, bool) {
    let mut out = Vec::new();
    for e in entries {
        if e.last_offset >= fetch_offset && e.first_offset < upper_bound {
            out.push(*e);
        }
        if e.last_stable_offset >= upper_bound {
            return (out, true);
        }
    }
    (out, false)
}

/// One producer of a `.snapshot` (the fields of `ProducerSnapshot.json` v1, in file order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerSnapshotEntry {
    /// `producer_id`.
    pub producer_id: i64,
    /// `epoch`.
    pub producer_epoch: i16,
    /// `last_sequence` of the producer's last batch (-1 when none).
    pub last_sequence: i32,
    /// `last_offset` of that batch (-1 when none).
    pub last_offset: i64,
    /// `offset_delta`: that batch's `lastOffset − baseOffset` (0 when none).
    pub offset_delta: i32,
    /// `timestamp`: the producer's last timestamp (a batch's `maxTimestamp` or a marker's time).
    pub timestamp: i64,
    /// `coordinator_epoch` of the last transaction marker (-1 when none).
    pub coordinator_epoch: i32,
    /// `current_txn_first_offset`: the first offset of an open transaction, -1 when none.
    pub current_txn_first_offset: i64,
}

/// Encode a `.snapshot`: version 1, CRC-32C of bytes `6..end`, entry count, entries in the given
/// order (the builder gives them sorted by producer id).
pub fn encode_producer_snapshot(entries: &[ProducerSnapshotEntry]) -> Bytes {
    let mut b = BytesMut::with_capacity(
        PRODUCER_SNAPSHOT_HEADER_LEN + entries.len() * PRODUCER_SNAPSHOT_ENTRY_LEN,
    );
    b.put_i16(PRODUCER_SNAPSHOT_VERSION);
    b.put_u32(0);
    b.put_i32(entries.len() as i32);
    for e in entries {
        b.put_i64(e.producer_id);
        b.put_i16(e.producer_epoch);
        b.put_i32(e.last_sequence);
        b.put_i64(e.last_offset);
        b.put_i32(e.offset_delta);
        b.put_i64(e.timestamp);
        b.put_i32(e.coordinator_epoch);
        b.put_i64(e.current_txn_first_offset);
    }
    let crc = crc32c::crc32c(&b[SNAPSHOT_CRC_START..]);
    b[2..6].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

/// Parse a `.snapshot` (`ProducerStateManager.readSnapshot`): version 1, the CRC, a count that
/// matches the length exactly, producer ids strictly increasing (the canonical order this crate
/// writes). An empty section is a segment without a snapshot: no entries.
pub fn parse_producer_snapshot(bytes: &[u8]) -> Result<Vec<ProducerSnapshotEntry>, FormatError> {
    let section = Section::ProducerSnapshot;
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    if bytes.len() < PRODUCER_SNAPSHOT_HEADER_LEN {
        return Err(FormatError::BadLength {
            section,
            len: bytes.len(),
        });
    }
    let version = be_i16(bytes, 0);
    if version != PRODUCER_SNAPSHOT_VERSION {
        return Err(FormatError::Version {
            section,
            version: i64::from(version),
        });
    }
    let stored = be_u32(bytes, 2);
    let computed = crc32c::crc32c(&bytes[SNAPSHOT_CRC_START..]);
    if stored != computed {
        return Err(FormatError::Crc {
            section,
            stored,
            computed,
        });
    }
    let count = be_i32(bytes, 6);
    let body = &bytes[PRODUCER_SNAPSHOT_HEADER_LEN..];
    if count < 0 || body.len() != count as usize * PRODUCER_SNAPSHOT_ENTRY_LEN {
        return Err(FormatError::BadLength {
            section,
            len: bytes.len(),
        });
    }
    let mut out: Vec<ProducerSnapshotEntry> = Vec::with_capacity(count as usize);
    for (i, e) in body.chunks_exact(PRODUCER_SNAPSHOT_ENTRY_LEN).enumerate() {
        let entry = ProducerSnapshotEntry {
            producer_id: be_i64(e, 0),
            producer_epoch: be_i16(e, 8),
            last_sequence: be_i32(e, 10),
            last_offset: be_i64(e, 14),
            offset_delta: be_i32(e, 22),
            timestamp: be_i64(e, 26),
            coordinator_epoch: be_i32(e, 34),
            current_txn_first_offset: be_i64(e, 38),
        };
        if out
            .last()
            .is_some_and(|p| p.producer_id >= entry.producer_id)
        {
            return Err(bad(section, i, "producer ids not strictly increasing"));
        }
        out.push(entry);
    }
    Ok(out)
}

/// One leader epoch and the offset it starts at (Kafka's `EpochEntry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpochEntry {
    /// The leader epoch.
    pub epoch: i32,
    /// Its first offset.
    pub start_offset: i64,
}

/// Encode a leader-epoch checkpoint (`CheckpointFile`): `"0\n<count>\n"` then `"<epoch> <offset>\n"`
/// per entry; one epoch 0 from offset 42 is `"0\n1\n0 42\n"`.
pub fn encode_leader_epoch_checkpoint(entries: &[EpochEntry]) -> Bytes {
    let mut s = format!("{LEADER_EPOCH_CHECKPOINT_VERSION}\n{}\n", entries.len());
    for e in entries {
        s.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
    }
    Bytes::from(s)
}

/// Parse a leader-epoch checkpoint in the canonical form [`encode_leader_epoch_checkpoint`]
/// writes: version 0, a count equal to the number of lines, each `"<epoch> <offset>"` in plain
/// decimal, every line ended by `\n`; epochs `≥ 0` strictly increasing, offsets `≥ 0` strictly
/// increasing (`LeaderEpochFileCache`'s invariants).
pub fn parse_leader_epoch_checkpoint(bytes: &[u8]) -> Result<Vec<EpochEntry>, FormatError> {
    let section = Section::LeaderEpochs;
    let text = std::str::from_utf8(bytes).map_err(|_| bad(section, 0, "not UTF-8"))?;
    let Some(body) = text.strip_suffix('\n') else {
        return Err(bad(section, 0, "missing final newline"));
    };
    let mut lines = body.split('\n');
    let version =
        lines
            .next()
            .and_then(parse_decimal)
            .ok_or(bad(section, 0, "bad version line"))?;
    if version != i64::from(LEADER_EPOCH_CHECKPOINT_VERSION) {
        return Err(FormatError::Version { section, version });
    }
    let count = lines
        .next()
        .and_then(parse_decimal)
        .filter(|c| (0..=i64::from(i32::MAX)).contains(c))
        .ok_or(bad(section, 1, "bad count line"))?;
    let mut out: Vec<EpochEntry> = Vec::new();
    for (i, line) in lines.enumerate() {
        let index = i + 2;
        let (epoch, offset) =
            line.split_once(' ')
                .ok_or(bad(section, index, "not `<epoch> <offset>`"))?;
        let epoch = parse_decimal(epoch)
            .and_then(|e| i32::try_from(e).ok())
            .filter(|e| *e >= 0)
            .ok_or(bad(section, index, "bad epoch"))?;
        let start_offset = parse_decimal(offset).filter(|o| *o >= 0).ok_or(bad(
            section,
            index,
            "bad start offset",
        ))?;
        if out
            .last()
            .is_some_and(|p| p.epoch >= epoch || p.start_offset >= start_offset)
        {
            return Err(bad(section, index, "entries not strictly increasing"));
        }
        out.push(EpochEntry {
            epoch,
            start_offset,
        });
    }
    if out.len() as i64 != count {
        return Err(bad(section, 1, "count does not match the entries"));
    }
    Ok(out)
}

/// A canonical decimal: optional `-`, digits, no leading zero (except `0`), no `-0`.
fn parse_decimal(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
        || s == "-0"
    {
        return None;
    }
    s.parse().ok()
}

/// The first `i` in `0..n` for which `pred` is false (pred must hold on a prefix).
fn partition_point(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fn bad(section: Section, index: usize, reason: &'static str) -> FormatError {
    FormatError::BadEntry {
        section,
        index,
        reason,
    }
}

// Readers of fixed-size fields; every caller checked the length first.
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn crc32c_is_the_castagnoli_polynomial() {
        // The standard check value of CRC-32C; every CRC below is this function's.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn offset_index_entry_bytes() {
        let mut ix = SegmentIndexer::new(100, 0, 1 << 20);
        ix.append_batch(100, NO_TIMESTAMP, 4096).unwrap();
        ix.append_batch(105, NO_TIMESTAMP, 70).unwrap();
        let built = ix.finish();
        // relativeOffset 5 (105 − 100), position 4096.
        assert_eq!(&built.offset_index[..], &[0, 0, 0, 5, 0, 0, 0x10, 0]);
        assert!(
            built.time_index.is_empty(),
            "no timestamps: empty time index"
        );
        let index = OffsetIndex::parse(100, built.offset_index).unwrap();
        assert_eq!(
            index.lookup(104),
            OffsetPosition {
                offset: 100,
                position: 0
            }
        );
        assert_eq!(
            index.lookup(105),
            OffsetPosition {
                offset: 105,
                position: 4096
            }
        );
        assert_eq!(index.lookup(i64::MAX).offset, 105);
    }

    #[test]
    fn time_index_entry_bytes() {
        let mut ix = SegmentIndexer::new(10, 0, 1 << 20);
        ix.append_batch(12, 1_700_000_000_000, 100).unwrap();
        ix.append_batch(17, 1_699_999_999_999, 100).unwrap();
        let built = ix.finish();
        // The second batch is indexed with the max so far (the first batch's), then the roll
        // entry is the same and adds nothing.
        assert_eq!(
            &built.time_index[..],
            &[0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0, 0, 0, 0, 2]
        );
        assert_eq!(
            built.max_timestamp,
            TimestampOffset {
                timestamp: 1_700_000_000_000,
                offset: 12
            }
        );
        let t = TimeIndex::parse(10, built.time_index).unwrap();
        assert_eq!(
            t.lookup(1_700_000_000_000),
            TimestampOffset {
                timestamp: 1_700_000_000_000,
                offset: 12
            }
        );
        assert_eq!(
            t.lookup(5),
            TimestampOffset {
                timestamp: NO_TIMESTAMP,
                offset: 10
            }
        );
        assert_eq!(t.last_entry().offset, 12);
    }

    /// Offset index entries (relative offset, position) for batches of one offset each and the
    /// given sizes.
    fn offset_entries(interval: i32, sizes: &[u32]) -> Vec<(i32, i32)> {
        let mut ix = SegmentIndexer::new(0, interval, 1 << 20);
        for (i, s) in sizes.iter().enumerate() {
            ix.append_batch(i as i64, 1_000 + i as i64, *s).unwrap();
        }
        ix.finish()
            .offset_index
            .chunks(8)
            .map(|e| (be_i32(e, 0), be_i32(e, 4)))
            .collect()
    }

    #[test]
    fn the_first_batch_is_never_indexed_and_the_gap_must_exceed_the_interval() {
        assert_eq!(offset_entries(0, &[100, 100, 100]), [(1, 100), (2, 200)]);
        assert_eq!(offset_entries(1, &[100, 100, 100]), [(1, 100), (2, 200)]);
        assert_eq!(offset_entries(0, &[100]), []);
        // Exactly the interval: `>` is false, no entry.
        assert_eq!(offset_entries(4096, &[4096, 10]), []);
        assert_eq!(
            offset_entries(4096, &[4096, 10, 4097, 10]),
            [(2, 4106), (3, 8203)]
        );
        assert_eq!(offset_entries(4096, &[4097, 10]), [(1, 4097)]);
        // interval 100, batches of 100: every other batch.
        assert_eq!(
            offset_entries(100, &[100, 100, 100, 100, 100]),
            [(2, 200), (4, 400)]
        );
    }

    #[test]
    fn time_index_rules() {
        // Single batch: only the roll entry.
        let mut ix = SegmentIndexer::new(0, 0, 1 << 20);
        ix.append_batch(3, 50, 100).unwrap();
        assert_eq!(ix.finish().time_index.len(), 12);
        // No timestamps anywhere: empty.
        let mut ix = SegmentIndexer::new(0, 0, 1 << 20);
        for i in 0..5 {
            ix.append_batch(i, NO_TIMESTAMP, 100).unwrap();
        }
        let built = ix.finish();
        assert!(built.time_index.is_empty());
        assert_eq!(built.offset_index.len(), 4 * 8);
        assert_eq!(built.max_timestamp.timestamp, NO_TIMESTAMP);
        // Decreasing timestamps: one entry, the first batch's.
        let mut ix = SegmentIndexer::new(0, 0, 1 << 20);
        for (i, ts) in [50, 40, 30].into_iter().enumerate() {
            ix.append_batch(i as i64, ts, 100).unwrap();
        }
        let t = TimeIndex::parse(0, ix.finish().time_index).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.entry(0),
            Some(TimestampOffset {
                timestamp: 50,
                offset: 0
            })
        );
        // A later max that arrives after the last indexed batch is the roll entry.
        let mut ix = SegmentIndexer::new(0, 150, 1 << 20);
        for (i, ts) in [10, 20, 30].into_iter().enumerate() {
            ix.append_batch(i as i64, ts, 100).unwrap();
        }
        let t = TimeIndex::parse(0, ix.finish().time_index).unwrap();
        // Batch 2 (position 200 > 150) is indexed with max 30 (its own, updated first).
        assert_eq!(t.len(), 1);
        assert_eq!(t.entry(0).unwrap().timestamp, 30);
    }

    #[test]
    fn index_capacity() {
        // 36 bytes: 4 offset entries, 3 time entries, the time index full at 2.
        let mut ix = SegmentIndexer::new(0, 0, 36);
        ix.append_batch(0, 1, 70).unwrap();
        ix.append_batch(1, 2, 70).unwrap();
        ix.append_batch(2, 3, 70).unwrap();
        assert!(ix.time_index_full() && !ix.offset_index_full());
        assert_eq!(
            ix.append_batch(3, 4, 70),
            Err(FormatError::IndexFull {
                section: Section::TimeIndex
            })
        );
        // The refused batch changed nothing; its max is not the roll entry.
        assert_eq!(ix.finish().time_index.len(), 24);
        // The roll entry records a max raised by batches after the last indexed one.
        let mut ix = SegmentIndexer::new(0, 100, 36);
        for (i, ts) in [1, 2, 3, 4].into_iter().enumerate() {
            ix.append_batch(i as i64, ts, 70).unwrap();
        }
        let t = TimeIndex::parse(0, ix.finish().time_index).unwrap();
        assert_eq!(
            (0..t.len())
                .map(|i| t.entry(i).unwrap())
                .collect::<Vec<_>>(),
            [
                TimestampOffset {
                    timestamp: 3,
                    offset: 2
                },
                TimestampOffset {
                    timestamp: 4,
                    offset: 3
                }
            ]
        );
        // Below 12 bytes the time index has no slot, but the roll entry is written anyway.
        let mut ix = SegmentIndexer::new(0, 0, 8);
        ix.append_batch(0, 5, 70).unwrap();
        assert!(ix.time_index_full());
        assert_eq!(ix.finish().time_index.len(), 12);
        // Relative offsets must fit an i32.
        let mut ix = SegmentIndexer::new(0, 0, 36);
        assert!(ix.append_batch(i64::from(i32::MAX) + 1, 1, 70).is_err());
        assert_eq!(ix.position(), 0);
    }

    #[test]
    fn fetch_upper_bound_offset() {
        let mut ix = SegmentIndexer::new(0, 0, 1 << 20);
        for i in 0..4 {
            ix.append_batch(i, NO_TIMESTAMP, 100).unwrap();
        }
        let index = OffsetIndex::parse(0, ix.finish().offset_index).unwrap();
        // Entries: (1, 100), (2, 200), (3, 300).
        assert_eq!(
            index.fetch_upper_bound_offset(0, 150),
            Some(OffsetPosition {
                offset: 2,
                position: 200
            })
        );
        assert_eq!(index.fetch_upper_bound_offset(100, 100).unwrap().offset, 2);
        assert_eq!(index.fetch_upper_bound_offset(0, 50).unwrap().offset, 1);
        assert_eq!(index.fetch_upper_bound_offset(250, 51), None);
    }

    #[test]
    fn index_parsers_refuse_bad_bytes() {
        assert!(OffsetIndex::parse(0, Bytes::from_static(&[0; 7])).is_err());
        // Offsets not increasing.
        let two = [0, 0, 0, 2, 0, 0, 0, 100, 0, 0, 0, 2, 0, 0, 0, 200];
        assert!(OffsetIndex::parse(0, Bytes::copy_from_slice(&two)).is_err());
        // Negative position.
        assert!(
            OffsetIndex::parse(0, Bytes::copy_from_slice(&[0, 0, 0, 1, 255, 0, 0, 0])).is_err()
        );
        assert!(
            OffsetIndex::parse(i64::MAX, Bytes::copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]))
                .is_err()
        );
        assert!(TimeIndex::parse(0, Bytes::from_static(&[0; 13])).is_err());
        let mut equal_ts = vec![0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1];
        equal_ts.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2]);
        assert!(TimeIndex::parse(0, Bytes::from(equal_ts)).is_err());
    }

    #[test]
    fn aborted_txn_bytes() {
        let e = AbortedTxnEntry {
            producer_id: 0x0102,
            first_offset: 3,
            last_offset: 9,
            last_stable_offset: 10,
        };
        let expected: [u8; 34] = [
            0, 0, // version
            0, 0, 0, 0, 0, 0, 1, 2, // producerId
            0, 0, 0, 0, 0, 0, 0, 3, // firstOffset
            0, 0, 0, 0, 0, 0, 0, 9, // lastOffset
            0, 0, 0, 0, 0, 0, 0, 10, // lastStableOffset
        ];
        assert_eq!(e.encode(), expected);
        let two = encode_txn_index(&[
            e,
            AbortedTxnEntry {
                last_offset: 12,
                last_stable_offset: 13,
                ..e
            },
        ]);
        let parsed = parse_txn_index(&two).unwrap();
        assert_eq!(parsed[0], e);
        assert_eq!(
            collect_aborted_txns(&parsed, 10, 20),
            (vec![parsed[1]], false)
        );
        assert_eq!(collect_aborted_txns(&parsed, 0, 10), (vec![e], true));
        let mut bad_version = two.to_vec();
        bad_version[1] = 1;
        assert!(parse_txn_index(&bad_version).is_err());
        let reversed = encode_txn_index(&[parsed[1], parsed[0]]);
        assert!(parse_txn_index(&reversed).is_err());
        assert!(parse_txn_index(&two[..33]).is_err());
    }

    #[test]
    fn producer_snapshot_bytes() {
        let e = ProducerSnapshotEntry {
            producer_id: 7,
            producer_epoch: 2,
            last_sequence: 9,
            last_offset: 0x0100,
            offset_delta: 4,
            timestamp: 1_700_000_000_000,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        };
        let b = encode_producer_snapshot(&[e]);
        let body: [u8; 50] = [
            0, 0, 0, 1, // count
            0, 0, 0, 0, 0, 0, 0, 7, // producer_id
            0, 2, // epoch
            0, 0, 0, 9, // last_sequence
            0, 0, 0, 0, 0, 0, 1, 0, // last_offset
            0, 0, 0, 4, // offset_delta
            0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0, // timestamp
            255, 255, 255, 255, // coordinator_epoch
            255, 255, 255, 255, 255, 255, 255, 255, // current_txn_first_offset
        ];
        assert_eq!(b.len(), 56);
        assert_eq!(&b[..2], &[0, 1], "version 1");
        assert_eq!(&b[6..], &body);
        assert_eq!(&b[2..6], &crc32c::crc32c(&body).to_be_bytes());
        assert_eq!(parse_producer_snapshot(&b).unwrap(), vec![e]);
        let empty = encode_producer_snapshot(&[]);
        assert_eq!(empty.len(), 10);
        assert!(parse_producer_snapshot(&empty).unwrap().is_empty());
        let mut corrupt = b.to_vec();
        corrupt[20] ^= 1;
        assert!(matches!(
            parse_producer_snapshot(&corrupt),
            Err(FormatError::Crc { .. })
        ));
        assert!(parse_producer_snapshot(&b[..55]).is_err());
        let unsorted = encode_producer_snapshot(&[
            e,
            ProducerSnapshotEntry {
                producer_id: 3,
                ..e
            },
        ]);
        assert!(parse_producer_snapshot(&unsorted).is_err());
    }

    #[test]
    fn leader_epoch_checkpoint_text() {
        let one = [EpochEntry {
            epoch: 0,
            start_offset: 42,
        }];
        assert_eq!(&encode_leader_epoch_checkpoint(&one)[..], b"0\n1\n0 42\n");
        assert_eq!(parse_leader_epoch_checkpoint(b"0\n1\n0 42\n").unwrap(), one);
        let two = [
            EpochEntry {
                epoch: 0,
                start_offset: 0,
            },
            EpochEntry {
                epoch: 3,
                start_offset: 100,
            },
        ];
        let text = encode_leader_epoch_checkpoint(&two);
        assert_eq!(&text[..], b"0\n2\n0 0\n3 100\n");
        assert_eq!(parse_leader_epoch_checkpoint(&text).unwrap(), two);
        assert!(parse_leader_epoch_checkpoint(b"0\n0\n").unwrap().is_empty());
        for bad in [
            &b""[..],
            b"0\n1\n0 42",
            b"1\n1\n0 42\n",
            b"0\n2\n0 42\n",
            b"0\n1\n0  42\n",
            b"0\n1\n042\n",
            b"0\n1\n0 042\n",
            b"0\n1\n-1 4\n",
            b"0\n2\n1 4\n1 5\n",
            b"0\n-1\n",
            b"0\n1\n0 4\n\n",
        ] {
            assert!(parse_leader_epoch_checkpoint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trailer_bytes_and_layout() {
        let layout = SegmentLayout {
            log: 0x1000,
            offset_index: 8,
            time_index: 12,
            txn_index: 0,
            producer_snapshot: 10,
            leader_epochs: 9,
        };
        let trailer = SegmentTrailer {
            partition: TopicIdPartition::new(Uuid::from_u128(0x0102), 3),
            base_offset: 16,
            end_offset: 32,
            layout,
        };
        let b = trailer.encode().unwrap();
        let mut expected = b"DLTSEG01".to_vec();
        expected.extend_from_slice(&[0; 14]);
        expected.extend_from_slice(&[1, 2]); // topic id
        expected.extend_from_slice(&[0, 0, 0, 3]); // partition
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 16]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 32]);
        for size in [0x1000u32, 8, 12, 0, 10, 9] {
            expected.extend_from_slice(&size.to_be_bytes());
        }
        expected.extend_from_slice(&[0; 8]);
        assert_eq!(expected.len(), 76);
        assert_eq!(&b[..76], &expected[..]);
        assert_eq!(&b[76..], &crc32c::crc32c(&expected).to_be_bytes());
        assert_eq!(SegmentTrailer::parse(&b).unwrap(), trailer);
        let mut flipped = b;
        flipped[30] ^= 1;
        assert!(matches!(
            SegmentTrailer::parse(&flipped),
            Err(FormatError::Crc { .. })
        ));
        assert_eq!(layout.range(Section::Log), 0..0x1000);
        assert_eq!(layout.range(Section::OffsetIndex), 0x1000..0x1008);
        assert_eq!(layout.range(Section::TimeIndex), 0x1008..0x1014);
        assert_eq!(layout.range(Section::TxnIndex), 0x1014..0x1014);
        assert_eq!(layout.range(Section::ProducerSnapshot), 0x1014..0x101e);
        assert_eq!(layout.range(Section::LeaderEpochs), 0x101e..0x1027);
        assert_eq!(layout.range(Section::Trailer), 0x1027..0x1077);
        assert_eq!(layout.object_size(), 0x1077);
        // An object whose size disagrees with its trailer.
        let mut object = vec![0u8; 0x1027];
        object.extend_from_slice(&b);
        assert!(SegmentObject::parse(Bytes::from(object.clone())).is_ok());
        object.insert(0, 0);
        assert!(matches!(
            SegmentObject::parse(Bytes::from(object)),
            Err(FormatError::ObjectSize { .. })
        ));
        assert!(SegmentObject::parse(Bytes::from_static(b"DLTSEG01")).is_err());
    }

    #[test]
    fn log_scans() {
        let batch = |base: i64, delta: i32, max_ts: i64| {
            let b = crate::RecordBatchBuilder::new()
                .base_offset(base)
                .records_count(delta + 1)
                .last_offset_delta(delta)
                .max_timestamp(max_ts)
                .record(max_ts, None, Some(b"v"))
                .build()
                .unwrap();
            b.as_bytes().to_vec()
        };
        let mut log = batch(0, 2, 10);
        let second = log.len();
        log.extend(batch(3, 0, 30));
        log.extend(batch(4, 1, 20));
        let h = search_for_offset(&log, 0, 3).unwrap().unwrap();
        assert_eq!((h.position, h.base_offset), (second as u64, 3));
        assert_eq!(
            search_for_offset(&log, 0, 1).unwrap().unwrap().base_offset,
            0
        );
        assert_eq!(search_for_offset(&log, 0, 6).unwrap(), None);
        assert_eq!(
            search_for_offset(&log, second as u32, 0)
                .unwrap()
                .unwrap()
                .base_offset,
            3
        );
        let t = search_for_timestamp(&log, 0, 15, 0).unwrap().unwrap();
        assert_eq!(t.base_offset, 3);
        assert_eq!(
            search_for_timestamp(&log, 0, 15, 4)
                .unwrap()
                .unwrap()
                .base_offset,
            4
        );
        assert!(search_for_offset(&log, log.len() as u32 + 1, 0).is_err());
        assert!(search_for_offset(&log[..log.len() - 1], 0, 6).is_err());
        assert_eq!(log_batches(&log).count(), 3);
    }
}
