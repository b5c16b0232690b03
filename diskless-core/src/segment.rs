//! The WAL segment object format (KIP-1163).
//!
//! ```text
//! byte 0      version (0)
//! bytes 1..   record batches, exactly as producers sent them, grouped by partition into contiguous
//!             runs; the batches of one partition keep the order they were added in
//! ```
//!
//! Nothing else is stored: the batch coordinates (partition, byte offset, byte size) are committed to
//! the batch coordinator. Partitions appear in the order they were first added (a stable order that
//! keeps the segment layout independent of hashing and lets a caller reproduce it).
//!
//! [`SegmentBuilder`] assembles a segment as a list of [`Bytes`] chunks without copying batch
//! payloads; [`SegmentReader`] extracts batches from a whole object or from a ranged read of one.

use std::collections::HashMap;

use bytes::Bytes;
use diskless_coordinator::{ErrorCode, TopicIdPartition};

use crate::batch::{BATCH_LENGTH_OFFSET, BatchError, LOG_OVERHEAD, RecordBatch, read_i32};

/// The only WAL segment format version.
pub const SEGMENT_VERSION: u8 = 0;
/// The size of the segment header (the version byte); the first batch starts here.
pub const SEGMENT_HEADER_LEN: u64 = 1;

/// A segment could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// The version byte is not [`SEGMENT_VERSION`].
    #[error("unknown WAL segment version {0} (expected {SEGMENT_VERSION})")]
    UnknownVersion(u8),
    /// The object is empty (it must at least hold the version byte).
    #[error("WAL segment is empty (no version byte)")]
    Empty,
    /// The coordinates overlap the version header, or have a zero size.
    #[error(
        "batch coordinates {byte_offset}+{byte_size} are invalid (batches start at byte 1 and are not empty)"
    )]
    InvalidCoordinates {
        /// The requested offset.
        byte_offset: u64,
        /// The requested size.
        byte_size: u32,
    },
    /// The coordinates reach past the end of the object.
    #[error(
        "batch coordinates {byte_offset}+{byte_size} are outside the object of {object_size} bytes"
    )]
    OutsideObject {
        /// The requested offset.
        byte_offset: u64,
        /// The requested size.
        byte_size: u32,
        /// The object size.
        object_size: u64,
    },
    /// The coordinates are not inside the bytes that were read.
    #[error(
        "batch coordinates {byte_offset}+{byte_size} are outside the bytes read, [{start}, {end})"
    )]
    OutsideSlice {
        /// The requested offset.
        byte_offset: u64,
        /// The requested size.
        byte_size: u32,
        /// Object offset of the first byte read.
        start: u64,
        /// Object offset after the last byte read.
        end: u64,
    },
    /// The bytes at the coordinates are not one v2 batch.
    #[error("bytes at {byte_offset} are not a record batch: {source}")]
    InvalidBatch {
        /// Where the batch was expected.
        byte_offset: u64,
        /// Why it does not frame.
        source: BatchError,
    },
    /// The batch's CRC does not match its bytes.
    #[error("batch at {byte_offset} is corrupt: stored crc {stored}, computed {computed}")]
    CrcMismatch {
        /// Where the batch is.
        byte_offset: u64,
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
}

impl SegmentError {
    /// The Kafka error code to report to a consumer: `CORRUPT_MESSAGE` for bytes that are not what the
    /// coordinates promise, `UNKNOWN_SERVER_ERROR` when the caller passed a slice that does not cover
    /// the coordinates.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            SegmentError::OutsideSlice { .. } => ErrorCode::UnknownServerError,
            _ => ErrorCode::CorruptMessage,
        }
    }
}

/// Where one batch landed in a finished segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentBatch {
    /// The partition it was added for.
    pub partition: TopicIdPartition,
    /// Its offset in the object (at least 1).
    pub byte_offset: u64,
    /// Its size in bytes.
    pub byte_size: u32,
    /// Its position in the order of [`SegmentBuilder::add`] calls.
    pub insertion_index: usize,
    /// The batch itself (shares the bytes of the chunks).
    pub batch: RecordBatch,
}

/// A finished segment: the chunks to upload and where every batch is.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The object's bytes as chunks: the version byte, then each batch (no payload copied). Suitable
    /// for `object_store::PutPayload::from_iter`.
    pub chunks: Vec<Bytes>,
    /// The object size in bytes.
    pub size: u64,
    /// Every batch, in object order (grouped by partition).
    pub batches: Vec<SegmentBatch>,
}

impl Segment {
    /// The batches in the order they were added (for mapping results back to requests).
    pub fn batches_in_insertion_order(&self) -> Vec<&SegmentBatch> {
        let mut v: Vec<&SegmentBatch> = self.batches.iter().collect();
        v.sort_by_key(|b| b.insertion_index);
        v
    }

    /// The object as contiguous bytes (copies; for tests and small objects).
    pub fn to_bytes(&self) -> Bytes {
        let mut v = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        for c in &self.chunks {
            v.extend_from_slice(c);
        }
        Bytes::from(v)
    }
}

/// Assembles a WAL segment from batches of many partitions.
///
/// ```
/// use diskless_core::{RecordBatchBuilder, SegmentBuilder, SegmentReader};
/// use diskless_coordinator::TopicIdPartition;
///
/// let t = uuid::Uuid::from_u128(1);
/// let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
/// let batch = |v: &[u8]| RecordBatchBuilder::new().record(1, None, Some(v)).build().unwrap();
///
/// let mut builder = SegmentBuilder::new();
/// builder.add(p0, batch(b"a"));
/// builder.add(p1, batch(b"b"));
/// builder.add(p0, batch(b"c"));
/// let segment = builder.finish();
/// // p0's two batches are contiguous, then p1's.
/// assert_eq!(segment.batches[1].insertion_index, 2);
///
/// let reader = SegmentReader::new(segment.to_bytes()).unwrap();
/// let loc = &segment.batches[2];
/// let read = reader.read_batch(loc.byte_offset, loc.byte_size).unwrap();
/// assert_eq!(read, loc.batch);
/// ```
#[derive(Debug, Default)]
pub struct SegmentBuilder {
    /// `(insertion index, batch)` per partition.
    groups: PartitionGroups<(usize, RecordBatch)>,
    size: u64,
}

impl SegmentBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        SegmentBuilder {
            size: SEGMENT_HEADER_LEN,
            ..Default::default()
        }
    }

    /// Add a batch for `partition`; returns its insertion index (0, 1, 2, ...).
    pub fn add(&mut self, partition: TopicIdPartition, batch: RecordBatch) -> usize {
        let i = self.groups.len();
        self.size = self.size.max(SEGMENT_HEADER_LEN) + batch.len() as u64;
        self.groups.push(partition, (i, batch));
        i
    }

    /// How many batches were added.
    pub fn batch_count(&self) -> usize {
        self.groups.len()
    }

    /// Whether no batch was added.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// How many partitions the batches belong to.
    pub fn partition_count(&self) -> usize {
        self.groups.partition_count()
    }

    /// The size of the object [`finish`](Self::finish) would produce, version byte included.
    pub fn size(&self) -> u64 {
        self.size.max(SEGMENT_HEADER_LEN)
    }

    /// The segment: chunks (version byte, then each batch) and every batch's coordinates.
    pub fn finish(self) -> Segment {
        let mut batches = Vec::with_capacity(self.groups.len());
        let (chunks, size) =
            self.groups
                .into_segment(|partition, (insertion_index, batch), byte_offset| {
                    let chunk = batch.as_bytes().clone();
                    batches.push(SegmentBatch {
                        partition,
                        byte_offset,
                        byte_size: u32::try_from(batch.len()).unwrap_or(u32::MAX),
                        insertion_index,
                        batch,
                    });
                    chunk
                });
        Segment {
            chunks,
            size,
            batches,
        }
    }
}

/// Items (batches and whatever goes with them) grouped by partition as a WAL segment lays them
/// out: partitions in the order of their first item, each partition's items in the order they
/// were pushed. The one place of that layout, used by [`SegmentBuilder`] and by the writer's
/// buffer (which groups its batches as they arrive, so that sealing is one pass without a sort
/// or a lookup).
#[derive(Debug)]
pub(crate) struct PartitionGroups<T> {
    groups: Vec<(TopicIdPartition, Vec<T>)>,
    index: HashMap<TopicIdPartition, usize, BuildPartitionHasher>,
    len: usize,
}

impl<T> Default for PartitionGroups<T> {
    fn default() -> Self {
        PartitionGroups {
            groups: Vec::new(),
            index: HashMap::default(),
            len: 0,
        }
    }
}

impl<T> PartitionGroups<T> {
    /// Adds `item` at the end of `partition`'s group (a new group after the others if the
    /// partition has none yet).
    pub(crate) fn push(&mut self, partition: TopicIdPartition, item: T) {
        self.len += 1;
        let groups = &mut self.groups;
        let g = *self.index.entry(partition).or_insert_with(|| {
            groups.push((partition, Vec::new()));
            groups.len() - 1
        });
        self.groups[g].1.push(item);
    }

    /// How many items were pushed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no item was pushed.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many partitions the items belong to.
    pub(crate) fn partition_count(&self) -> usize {
        self.groups.len()
    }

    /// Lays the items out as a segment: the version byte, then, in group order, the chunk `place`
    /// returns for each item, which it is given with its partition and its byte offset in the
    /// object. Returns the chunks and the object size.
    pub(crate) fn into_segment(
        self,
        mut place: impl FnMut(TopicIdPartition, T, u64) -> Bytes,
    ) -> (Vec<Bytes>, u64) {
        let mut chunks = Vec::with_capacity(self.len + 1);
        chunks.push(Bytes::from_static(&[SEGMENT_VERSION]));
        let mut pos = SEGMENT_HEADER_LEN;
        for (partition, items) in self.groups {
            for item in items {
                let chunk = place(partition, item, pos);
                pos += chunk.len() as u64;
                chunks.push(chunk);
            }
        }
        (chunks, pos)
    }
}

/// The hasher of [`PartitionGroups`]' index: one multiply-fold per word instead of SipHash's
/// rounds (the lookup is on the produce path, once per batch). Not keyed: the keys are topic ids
/// the cluster assigned and partition numbers of existing topics, not values a client chooses
/// freely, and a segment holds a bounded number of partitions.
#[derive(Debug, Default, Clone, Copy)]
struct BuildPartitionHasher;

impl std::hash::BuildHasher for BuildPartitionHasher {
    type Hasher = PartitionHasher;

    fn build_hasher(&self) -> PartitionHasher {
        PartitionHasher(0)
    }
}

/// See [`BuildPartitionHasher`].
#[derive(Debug)]
struct PartitionHasher(u64);

impl PartitionHasher {
    /// Mixes one word in (a folded 64×64→128 multiply, as foldhash and rapidhash do).
    #[inline]
    fn mix(&mut self, word: u64) {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let m = u128::from(self.0 ^ word) * u128::from(K ^ self.0.rotate_left(23));
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl std::hash::Hasher for PartitionHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u32(n as u32);
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// Reads batches out of a WAL segment, or out of a ranged read of one.
#[derive(Debug, Clone)]
pub struct SegmentReader {
    bytes: Bytes,
    start: u64,
    object_size: Option<u64>,
    verify_crc: bool,
}

impl SegmentReader {
    /// A reader over a whole object. Fails if it is empty or its version byte is unknown.
    pub fn new(object: Bytes) -> Result<Self, SegmentError> {
        let size = object.len() as u64;
        if object.is_empty() {
            return Err(SegmentError::Empty);
        }
        Self::from_range(object, 0, Some(size))
    }

    /// A reader over `bytes`, which are the object's bytes from offset `start` on (a ranged GET).
    /// `object_size`, when known, bounds every coordinate. If the range includes byte 0, the version
    /// byte is checked.
    pub fn from_range(
        bytes: Bytes,
        start: u64,
        object_size: Option<u64>,
    ) -> Result<Self, SegmentError> {
        match bytes.first() {
            Some(&v) if start == 0 && v != SEGMENT_VERSION => {
                return Err(SegmentError::UnknownVersion(v));
            }
            _ => {}
        }
        Ok(SegmentReader {
            bytes,
            start,
            object_size,
            verify_crc: true,
        })
    }

    /// Whether [`read_batch`](Self::read_batch) checks each batch's CRC (default: yes). The CRC is
    /// one CRC-32C pass over the batch.
    pub fn verify_crc(mut self, on: bool) -> Self {
        self.verify_crc = on;
        self
    }

    /// Object offset of the first byte held.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Object offset after the last byte held.
    pub fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// The batch at `(byte_offset, byte_size)`: the range must lie after the version byte, inside the
    /// object and inside the bytes held; the bytes must frame as one v2 batch of exactly `byte_size`
    /// bytes and (unless disabled) pass the CRC check. No copy.
    pub fn read_batch(
        &self,
        byte_offset: u64,
        byte_size: u32,
    ) -> Result<RecordBatch, SegmentError> {
        if byte_offset < SEGMENT_HEADER_LEN || byte_size == 0 {
            return Err(SegmentError::InvalidCoordinates {
                byte_offset,
                byte_size,
            });
        }
        let end = byte_offset.saturating_add(u64::from(byte_size));
        match self.object_size {
            Some(object_size) if end > object_size => {
                return Err(SegmentError::OutsideObject {
                    byte_offset,
                    byte_size,
                    object_size,
                });
            }
            _ => {}
        }
        if byte_offset < self.start || end > self.end() {
            return Err(SegmentError::OutsideSlice {
                byte_offset,
                byte_size,
                start: self.start,
                end: self.end(),
            });
        }
        let from = (byte_offset - self.start) as usize;
        let to = (end - self.start) as usize;
        let batch = RecordBatch::parse(self.bytes.slice(from..to)).map_err(|source| {
            SegmentError::InvalidBatch {
                byte_offset,
                source,
            }
        })?;
        if self.verify_crc {
            let computed = batch.compute_crc();
            if computed != batch.crc() {
                return Err(SegmentError::CrcMismatch {
                    byte_offset,
                    stored: batch.crc(),
                    computed,
                });
            }
        }
        Ok(batch)
    }

    /// Walk the batches held, from the first batch boundary (byte 1 for a range starting at 0, else
    /// the range's first byte, which must be a batch start) to the end. Each item is a batch and its
    /// object offset; the walk stops after the first error.
    pub fn batches(&self) -> SegmentIter<'_> {
        SegmentIter {
            reader: self,
            pos: self.start.max(SEGMENT_HEADER_LEN),
            failed: false,
        }
    }
}

/// Iterator of [`SegmentReader::batches`].
#[derive(Debug)]
pub struct SegmentIter<'a> {
    reader: &'a SegmentReader,
    pos: u64,
    failed: bool,
}

impl Iterator for SegmentIter<'_> {
    type Item = Result<(u64, RecordBatch), SegmentError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.reader.end() {
            return None;
        }
        let at = (self.pos - self.reader.start) as usize;
        let rest = &self.reader.bytes[at..];
        let fail = |this: &mut Self, e| {
            this.failed = true;
            Some(Err(e))
        };
        if rest.len() < LOG_OVERHEAD {
            let e = SegmentError::InvalidBatch {
                byte_offset: self.pos,
                source: BatchError::TrailingPartialBatch {
                    position: at,
                    remaining: rest.len(),
                },
            };
            return fail(self, e);
        }
        let size = i64::from(read_i32(rest, BATCH_LENGTH_OFFSET)) + LOG_OVERHEAD as i64;
        let size = match u32::try_from(size) {
            Ok(s) if s > 0 => s,
            _ => {
                let e = SegmentError::InvalidBatch {
                    byte_offset: self.pos,
                    source: BatchError::TooShort { size: 0 },
                };
                return fail(self, e);
            }
        };
        match self.reader.read_batch(self.pos, size) {
            Ok(b) => {
                let at = self.pos;
                self.pos += u64::from(size);
                Some(Ok((at, b)))
            }
            Err(e) => fail(self, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RecordBatchBuilder;
    use uuid::Uuid;

    fn tp(p: i32) -> TopicIdPartition {
        TopicIdPartition::new(Uuid::from_u128(7), p)
    }

    fn batch(v: &[u8]) -> RecordBatch {
        RecordBatchBuilder::new()
            .record(1, None, Some(v))
            .build()
            .unwrap()
    }

    #[test]
    fn partition_groups_keep_first_seen_and_push_order_for_many_partitions() {
        // Interleaved partitions of three topics (ids differing in one bit, and in the partition
        // only), pushed in rounds: each group keeps its pushes in order, groups keep first-seen order.
        let topics = [
            Uuid::from_u128(1),
            Uuid::from_u128(3),
            Uuid::from_u128(1 << 127),
        ];
        let mut groups = PartitionGroups::default();
        let mut first_seen = Vec::new();
        for round in 0..5u32 {
            for p in (0..200i32).rev() {
                let t = topics[(p as usize) % 3];
                let partition = TopicIdPartition::new(t, p / 3);
                if round == 0 {
                    first_seen.push(partition);
                }
                groups.push(partition, (partition, round));
            }
        }
        assert_eq!((groups.len(), groups.partition_count()), (1000, 200));
        let mut seen = Vec::new();
        let (chunks, size) = groups.into_segment(|partition, (pushed_for, round), offset| {
            assert_eq!(partition, pushed_for);
            assert_eq!(offset, 1 + seen.len() as u64 * 2);
            seen.push((partition, round));
            Bytes::from_static(b"ab")
        });
        assert_eq!((chunks.len(), size), (1001, 2001));
        let expected: Vec<_> = first_seen
            .iter()
            .flat_map(|p| (0..5u32).map(move |r| (*p, r)))
            .collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn groups_by_partition_in_first_seen_order() {
        let mut b = SegmentBuilder::new();
        assert_eq!(b.size(), 1);
        let order = [(2, "a"), (1, "b"), (2, "c"), (3, "d"), (1, "e")];
        for (i, (p, v)) in order.iter().enumerate() {
            assert_eq!(b.add(tp(*p), batch(v.as_bytes())), i);
        }
        assert_eq!(b.partition_count(), 3);
        let expected_size = b.size();
        let seg = b.finish();
        assert_eq!(seg.size, expected_size);
        assert_eq!(seg.chunks.len(), 6);
        assert_eq!(seg.chunks[0].as_ref(), &[0u8]);
        let layout: Vec<(i32, usize)> = seg
            .batches
            .iter()
            .map(|b| (b.partition.partition, b.insertion_index))
            .collect();
        assert_eq!(layout, vec![(2, 0), (2, 2), (1, 1), (1, 4), (3, 3)]);
        // Contiguous, starting at 1, and chunks share the batches' memory.
        let mut pos = 1;
        for (i, sb) in seg.batches.iter().enumerate() {
            assert_eq!(sb.byte_offset, pos);
            pos += u64::from(sb.byte_size);
            assert_eq!(seg.chunks[i + 1].as_ptr(), sb.batch.as_bytes().as_ptr());
        }
        assert_eq!(pos, seg.size);
        let ins: Vec<usize> = seg
            .batches_in_insertion_order()
            .iter()
            .map(|b| b.insertion_index)
            .collect();
        assert_eq!(ins, vec![0, 1, 2, 3, 4]);
        // Whole-object reads and the walk.
        let bytes = seg.to_bytes();
        let r = SegmentReader::new(bytes.clone()).unwrap();
        for sb in &seg.batches {
            assert_eq!(
                r.read_batch(sb.byte_offset, sb.byte_size).unwrap(),
                sb.batch
            );
        }
        let walked: Vec<_> = r.batches().collect::<Result<_, _>>().unwrap();
        assert_eq!(walked.len(), 5);
        // Ranged reads.
        let sb = &seg.batches[2];
        let from = sb.byte_offset - 3;
        let slice = bytes.slice(from as usize..(sb.byte_offset + u64::from(sb.byte_size)) as usize);
        let r = SegmentReader::from_range(slice, from, Some(seg.size)).unwrap();
        assert_eq!(
            r.read_batch(sb.byte_offset, sb.byte_size).unwrap(),
            sb.batch
        );
        let other = &seg.batches[3];
        assert!(matches!(
            r.read_batch(other.byte_offset, other.byte_size),
            Err(SegmentError::OutsideSlice { .. })
        ));
    }

    #[test]
    fn rejects_bad_version_ranges_and_corruption() {
        let mut b = SegmentBuilder::new();
        b.add(tp(0), batch(b"x"));
        b.add(tp(0), batch(b"y"));
        let seg = b.finish();
        let bytes = seg.to_bytes();
        let first = &seg.batches[0];

        assert_eq!(
            SegmentReader::new(Bytes::new()).unwrap_err(),
            SegmentError::Empty
        );
        let mut v = bytes.to_vec();
        v[0] = 1;
        let e = SegmentReader::new(Bytes::from(v.clone())).unwrap_err();
        assert_eq!(e, SegmentError::UnknownVersion(1));
        assert_eq!(e.error_code(), ErrorCode::CorruptMessage);
        // A ranged read not covering byte 0 cannot check the version.
        assert!(SegmentReader::from_range(Bytes::from(v).slice(1..), 1, None).is_ok());

        let r = SegmentReader::new(bytes.clone()).unwrap();
        assert!(matches!(
            r.read_batch(0, first.byte_size),
            Err(SegmentError::InvalidCoordinates { .. })
        ));
        assert!(matches!(
            r.read_batch(1, 0),
            Err(SegmentError::InvalidCoordinates { .. })
        ));
        assert!(matches!(
            r.read_batch(seg.size - 5, 10),
            Err(SegmentError::OutsideObject { .. })
        ));
        assert!(matches!(
            r.read_batch(u64::MAX - 1, u32::MAX),
            Err(SegmentError::OutsideObject { .. })
        ));
        // Wrong size: does not frame.
        let e = r
            .read_batch(first.byte_offset, first.byte_size - 1)
            .unwrap_err();
        assert!(matches!(e, SegmentError::InvalidBatch { .. }));
        // Misaligned offset.
        assert!(matches!(
            r.read_batch(first.byte_offset + 1, first.byte_size),
            Err(SegmentError::InvalidBatch { .. })
        ));
        // Flipped payload byte: CRC.
        let mut v = bytes.to_vec();
        let last = (first.byte_offset + u64::from(first.byte_size) - 1) as usize;
        v[last] ^= 0xff;
        let r = SegmentReader::new(Bytes::from(v)).unwrap();
        assert!(matches!(
            r.read_batch(first.byte_offset, first.byte_size),
            Err(SegmentError::CrcMismatch { .. })
        ));
        let walked: Vec<_> = r.batches().collect();
        assert_eq!(walked.len(), 1);
        assert!(walked[0].is_err());
        assert!(
            r.clone()
                .verify_crc(false)
                .read_batch(first.byte_offset, first.byte_size)
                .is_ok()
        );
        // Truncated object: the walk reports the partial batch.
        let r = SegmentReader::new(bytes.slice(..bytes.len() - 3)).unwrap();
        let walked: Vec<_> = r.batches().collect();
        assert!(walked[0].is_ok());
        assert!(walked[1].is_err());
    }
}
