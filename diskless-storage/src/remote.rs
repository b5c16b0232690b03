//! Tiered segments in object storage: the [`RemoteStorage`] trait (KIP-405's
//! `RemoteStorageManager`, reduced to what diskless topics use) and its default implementation
//! [`ObjectRemoteStorage`], which stores a segment as one object of an [`ObjectStorage`].
//!
//! A segment object is its sections laid end to end, then an 80-byte trailer
//! (docs/tiered-consolidation.md §2.1):
//!
//! ```text
//! | .log | .index | .timeindex | .txnindex | .snapshot | leader-epoch-checkpoint | trailer (80) |
//! ```
//!
//! The section sizes are a [`SegmentLayout`], which the coordinator row carries, so a read never
//! needs the trailer: [`SegmentLayout::range`] gives the bytes of a section. This crate does not
//! parse the sections nor the trailer (their formats live in `diskless-core::tiered::format`,
//! which uses this `SegmentLayout` and [`Section`]); it only stores and reads bytes.

use crate::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use std::fmt::Debug;
use std::ops::Range;
use std::sync::Arc;

/// One section of a segment object, in object order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// The `.log`: record batches.
    Log,
    /// The `.index` (offset index).
    OffsetIndex,
    /// The `.timeindex`.
    TimeIndex,
    /// The `.txnindex` (aborted transactions; may be empty).
    TxnIndex,
    /// The producer-state `.snapshot` (may be empty).
    ProducerSnapshot,
    /// The `leader-epoch-checkpoint`.
    LeaderEpochs,
    /// The 80-byte trailer.
    Trailer,
}

impl Section {
    /// Every section, in object order.
    pub const ALL: [Section; 7] = [
        Section::Log,
        Section::OffsetIndex,
        Section::TimeIndex,
        Section::TxnIndex,
        Section::ProducerSnapshot,
        Section::LeaderEpochs,
        Section::Trailer,
    ];
}

/// The sizes of a segment object's sections: the `.log` starts at byte 0, the others follow in
/// [`Section`] order, then the [`SegmentLayout::TRAILER_LEN`]-byte trailer. A plain value (the
/// coordinator row stores the same sizes), built by [`RemoteStorage::copy_segment`] or
/// [`SegmentData::layout`].
///
/// ```
/// use diskless_storage::{Section, SegmentLayout};
/// let layout = SegmentLayout { log: 100, offset_index: 8, time_index: 12, ..Default::default() };
/// assert_eq!(layout.range(Section::Log), 0..100);
/// assert_eq!(layout.range(Section::TimeIndex), 108..120);
/// assert_eq!(layout.range(Section::TxnIndex), 120..120); // empty
/// assert_eq!(layout.range(Section::Trailer), 120..200);
/// assert_eq!(layout.object_size(), 200);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SegmentLayout {
    /// `.log` bytes (at most `i32::MAX`: Kafka's positions in a segment are `int`s).
    pub log: u64,
    /// `.index` bytes.
    pub offset_index: u32,
    /// `.timeindex` bytes.
    pub time_index: u32,
    /// `.txnindex` bytes (0: no aborted transaction).
    pub txn_index: u32,
    /// `.snapshot` bytes.
    pub producer_snapshot: u32,
    /// `leader-epoch-checkpoint` bytes.
    pub leader_epochs: u32,
}

impl SegmentLayout {
    /// The trailer's size: every segment object ends with it.
    pub const TRAILER_LEN: u64 = 80;

    /// The largest `.log` (`i32::MAX`: positions in a segment are Kafka `int`s).
    pub const MAX_LOG_LEN: u64 = i32::MAX as u64;

    /// The size of `section`.
    pub fn size(&self, section: Section) -> u64 {
        match section {
            Section::Log => self.log,
            Section::OffsetIndex => u64::from(self.offset_index),
            Section::TimeIndex => u64::from(self.time_index),
            Section::TxnIndex => u64::from(self.txn_index),
            Section::ProducerSnapshot => u64::from(self.producer_snapshot),
            Section::LeaderEpochs => u64::from(self.leader_epochs),
            Section::Trailer => Self::TRAILER_LEN,
        }
    }

    /// The byte range of `section` in the object (empty for an empty section).
    pub fn range(&self, section: Section) -> Range<u64> {
        let start = Section::ALL
            .iter()
            .take_while(|s| **s != section)
            .fold(0u64, |start, s| start.saturating_add(self.size(*s)));
        start..start.saturating_add(self.size(section))
    }

    /// The object's size: all sections and the trailer.
    pub fn object_size(&self) -> u64 {
        self.range(Section::Trailer).end
    }
}

/// A segment to store: its sections, as built (docs/tiered-consolidation.md §2.2).
///
/// Exhaustive on purpose: every caller of [`RemoteStorage::copy_segment`] builds it.
#[derive(Debug, Clone, Default)]
pub struct SegmentData {
    /// The `.log`, as the chunks it was built in (concatenated in order).
    pub log: Vec<Bytes>,
    /// The `.index`.
    pub offset_index: Bytes,
    /// The `.timeindex`.
    pub time_index: Bytes,
    /// The `.txnindex` (empty when no transaction was aborted).
    pub txn_index: Bytes,
    /// The producer-state `.snapshot`.
    pub producer_snapshot: Bytes,
    /// The `leader-epoch-checkpoint`.
    pub leader_epochs: Bytes,
    /// The trailer: exactly [`SegmentLayout::TRAILER_LEN`] bytes.
    pub trailer: Bytes,
}

impl SegmentData {
    /// The layout of these sections, checked: the trailer is [`SegmentLayout::TRAILER_LEN`] bytes,
    /// the `.log` at most [`SegmentLayout::MAX_LOG_LEN`], every other section fits a `u32` (the
    /// trailer's and the coordinator row's sizes). A violation is [`StorageError::Permanent`]: the
    /// segment cannot be stored, whatever the retries.
    pub fn layout(&self) -> Result<SegmentLayout, StorageError> {
        let log = self
            .log
            .iter()
            .fold(0u64, |len, chunk| len.saturating_add(chunk.len() as u64));
        checked_layout(
            log,
            [
                self.offset_index.len(),
                self.time_index.len(),
                self.txn_index.len(),
                self.producer_snapshot.len(),
                self.leader_epochs.len(),
            ],
            self.trailer.len(),
        )
    }

    /// The object's bytes as chunks, in [`Section`] order (empty chunks left out).
    pub fn into_chunks(self) -> Vec<Bytes> {
        let mut chunks = self.log;
        chunks.extend([
            self.offset_index,
            self.time_index,
            self.txn_index,
            self.producer_snapshot,
            self.leader_epochs,
            self.trailer,
        ]);
        chunks.retain(|chunk| !chunk.is_empty());
        chunks
    }
}

fn invalid_segment(message: String) -> StorageError {
    StorageError::Permanent {
        source: message.into(),
    }
}

/// The checks of [`SegmentData::layout`] on the lengths alone (testable without the bytes).
fn checked_layout(
    log: u64,
    sections: [usize; 5],
    trailer: usize,
) -> Result<SegmentLayout, StorageError> {
    if trailer as u64 != SegmentLayout::TRAILER_LEN {
        return Err(invalid_segment(format!(
            "segment trailer is {trailer} bytes, not {}",
            SegmentLayout::TRAILER_LEN
        )));
    }
    if log > SegmentLayout::MAX_LOG_LEN {
        return Err(invalid_segment(format!(
            "segment .log is {log} bytes, more than {}",
            SegmentLayout::MAX_LOG_LEN
        )));
    }
    let names = [
        "offset index",
        "time index",
        "txn index",
        "producer snapshot",
        "leader epochs",
    ];
    let mut sizes = [0u32; 5];
    for ((size, len), name) in sizes.iter_mut().zip(sections).zip(names) {
        *size = u32::try_from(len).map_err(|_| {
            invalid_segment(format!(
                "segment {name} is {len} bytes, more than {}",
                u32::MAX
            ))
        })?;
    }
    let [
        offset_index,
        time_index,
        txn_index,
        producer_snapshot,
        leader_epochs,
    ] = sizes;
    Ok(SegmentLayout {
        log,
        offset_index,
        time_index,
        txn_index,
        producer_snapshot,
        leader_epochs,
    })
}

/// Where tiered segments are stored: KIP-405's `RemoteStorageManager`, reduced to what diskless
/// topics use. Object-safe: hosts hold an `Arc<dyn RemoteStorage>`. [`ObjectRemoteStorage`] is the
/// default; another implementation (one file per section, another system) is read through the
/// same [`SegmentLayout`] byte space.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use bytes::Bytes;
/// use diskless_storage::{
///     ObjectKey, ObjectRemoteStorage, ObjectStoreStorage, RemoteStorage, Section, SegmentData,
///     SegmentLayout,
/// };
/// use std::sync::Arc;
///
/// let remote = ObjectRemoteStorage::new(Arc::new(ObjectStoreStorage::in_memory()));
/// let key = ObjectKey::parse("tiered/segment-1").unwrap();
/// let data = SegmentData {
///     log: vec![Bytes::from_static(b"batch 1;"), Bytes::from_static(b"batch 2;")],
///     offset_index: Bytes::from_static(&[0; 8]),
///     time_index: Bytes::from_static(&[0; 12]),
///     leader_epochs: Bytes::from_static(b"0\n1\n0 0\n"),
///     trailer: Bytes::from(vec![0; SegmentLayout::TRAILER_LEN as usize]),
///     ..Default::default()
/// };
/// let layout = remote.copy_segment(&key, data).await.unwrap();
/// assert_eq!(layout.log, 16);
/// let log = remote.fetch(&key, &layout, layout.range(Section::Log)).await.unwrap();
/// assert_eq!(&log[..], b"batch 1;batch 2;");
/// let epochs = remote.fetch(&key, &layout, layout.range(Section::LeaderEpochs)).await.unwrap();
/// assert_eq!(&epochs[..], b"0\n1\n0 0\n");
/// // Past the end of the object: refused.
/// assert!(remote.fetch(&key, &layout, 0..layout.object_size() + 1).await.is_err());
/// assert_eq!(remote.delete(&[key.clone()]).await.unwrap(), [key]);
/// # });
/// ```
#[async_trait]
pub trait RemoteStorage: Send + Sync + Debug {
    /// KIP-405 `copyLogSegmentData`: stores the segment under `key` and returns its layout.
    ///
    /// Refuses, before storing anything, a segment whose [`SegmentData::layout`] fails (a trailer
    /// that is not 80 bytes, a section too large). A key is never reused for other content: a
    /// copy to a key that holds another object fails with [`StorageError::AlreadyExists`]. An
    /// attempt that failed ambiguously leaves at most an unregistered object (collected as an
    /// orphan).
    async fn copy_segment(
        &self,
        key: &ObjectKey,
        data: SegmentData,
    ) -> Result<SegmentLayout, StorageError>;

    /// KIP-405 `fetchLogSegment` / `fetchIndex`: `range` of the segment's byte space
    /// (`layout.range(section)` for a section). An empty range inside the object is an empty
    /// answer (an empty `.txnindex`); an inverted range or one reaching past
    /// `layout.object_size()` is [`StorageError::InvalidRange`].
    async fn fetch(
        &self,
        key: &ObjectKey,
        layout: &SegmentLayout,
        range: Range<u64>,
    ) -> Result<Bytes, StorageError>;

    /// KIP-405 `deleteLogSegmentData`, many at once. Idempotent: a missing segment counts as
    /// deleted. Returns the keys whose deletion was confirmed (the others may be retried).
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError>;

    /// The segments under `prefix` whose key is greater than `offset` (orphan collection), as
    /// [`ObjectStorage::list_with_offset`].
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>>;
}

/// The default [`RemoteStorage`]: a segment is one object of an [`ObjectStorage`], its sections
/// and trailer concatenated (one create-only upload), read by ranged GETs.
#[derive(Debug, Clone)]
pub struct ObjectRemoteStorage(pub Arc<dyn ObjectStorage>);

impl ObjectRemoteStorage {
    /// Segments stored in `storage`.
    pub fn new(storage: Arc<dyn ObjectStorage>) -> Self {
        Self(storage)
    }

    /// The storage the segments are stored in.
    pub fn storage(&self) -> &Arc<dyn ObjectStorage> {
        &self.0
    }
}

#[async_trait]
impl RemoteStorage for ObjectRemoteStorage {
    async fn copy_segment(
        &self,
        key: &ObjectKey,
        data: SegmentData,
    ) -> Result<SegmentLayout, StorageError> {
        let layout = data.layout()?;
        self.0.upload(key, &data.into_chunks()).await?;
        Ok(layout)
    }

    async fn fetch(
        &self,
        key: &ObjectKey,
        layout: &SegmentLayout,
        range: Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let size = layout.object_size();
        if range.start > range.end || range.end > size {
            return Err(StorageError::InvalidRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                size: Some(size),
            });
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.0.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.0.delete(keys).await
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.0.list_with_offset(prefix, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_tile_the_object() {
        let layout = SegmentLayout {
            log: 1000,
            offset_index: 80,
            time_index: 120,
            txn_index: 0,
            producer_snapshot: 33,
            leader_epochs: 9,
        };
        let mut next = 0;
        for section in Section::ALL {
            let range = layout.range(section);
            assert_eq!(range.start, next, "{section:?}");
            assert_eq!(range.end - range.start, layout.size(section), "{section:?}");
            next = range.end;
        }
        assert_eq!(next, 1000 + 80 + 120 + 33 + 9 + 80);
        assert_eq!(layout.object_size(), next);
    }

    #[test]
    fn layout_limits() {
        let max = usize::try_from(u32::MAX).unwrap();
        assert!(checked_layout(SegmentLayout::MAX_LOG_LEN, [max; 5], 80).is_ok());
        assert!(checked_layout(SegmentLayout::MAX_LOG_LEN + 1, [0; 5], 80).is_err());
        // Sections above u32::MAX exist only where usize is wider than 32 bits.
        if let Ok(too_big) = usize::try_from(u64::from(u32::MAX) + 1) {
            for i in 0..5 {
                let mut sections = [0; 5];
                sections[i] = too_big;
                let err = checked_layout(0, sections, 80).unwrap_err();
                assert!(matches!(err, StorageError::Permanent { .. }), "{err}");
            }
        }
        assert!(checked_layout(0, [0; 5], 79).is_err());
        assert!(checked_layout(0, [0; 5], 81).is_err());
    }
}
