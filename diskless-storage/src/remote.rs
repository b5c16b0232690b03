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
//! The section sizes are a [`SegmentLayout`] (`diskless-common`'s, re-exported here with
//! [`Section`](crate::Section)), which the coordinator row carries, so a read never needs the trailer:
//! [`SegmentLayout::range`] gives the bytes of a section. This crate does not parse the sections
//! nor the trailer (their formats live in `diskless-core::tiered::format`); it only stores and
//! reads bytes.

use crate::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use async_trait::async_trait;
use bytes::Bytes;
use diskless_common::SegmentLayout;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use std::fmt::Debug;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// A segment's sections after its `.log`, and its trailer: what a segment builder knows only once
/// the last batch is in (docs/tiered-consolidation.md §2.2). Each is a few MiB at most (the
/// indexes are bounded by `segment.index.bytes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentTail {
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

impl SegmentTail {
    /// The layout of a segment made of a `.log` of `log` bytes and these sections, checked: the
    /// trailer is [`SegmentLayout::TRAILER_LEN`] bytes, the `.log` at most
    /// [`SegmentLayout::MAX_LOG_LEN`], every other section fits a `u32` (the trailer's and the
    /// coordinator row's sizes). A violation is [`StorageError::Permanent`]: the segment cannot be
    /// stored, whatever the retries.
    pub fn layout(&self, log: u64) -> Result<SegmentLayout, StorageError> {
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

    /// The sections in object order, the trailer last (empty ones left out).
    pub fn into_chunks(self) -> impl Iterator<Item = Bytes> {
        [
            self.offset_index,
            self.time_index,
            self.txn_index,
            self.producer_snapshot,
            self.leader_epochs,
            self.trailer,
        ]
        .into_iter()
        .filter(|chunk| !chunk.is_empty())
    }
}

/// A segment to store, streamed: the `.log` as a stream of chunks (a segment of `segment.bytes`
/// is never held whole), then its [`SegmentTail`], which is awaited only after the `.log`
/// stream ended (the builder finishes the indexes, the producer snapshot and the trailer once its
/// last batch is in). [`RemoteStorage::copy_segment`] consumes it.
///
/// Why two parts rather than one stream of sections: the `.log` is the only large section and
/// the only one known before the end, and the split makes the order a type: a tail cannot come
/// before or inside the `.log`, and a producer that fails just ends the stream with its error
/// (the copy fails and stores nothing) or drops the tail (the same).
///
/// [`SegmentData::in_memory`] wraps a segment already built whole (tests, small segments).
pub struct SegmentData {
    /// The `.log`, in order. An error item ends the copy with that error: nothing is stored.
    pub log: BoxStream<'static, Result<Bytes, StorageError>>,
    /// The other sections and the trailer, awaited after `log` ended.
    pub tail: BoxFuture<'static, Result<SegmentTail, StorageError>>,
    /// The size of the parts an implementation that uploads in parts should send (the memory
    /// it holds per segment); [`SegmentData::DEFAULT_PART_SIZE`] unless the caller knows better.
    /// At least 1.
    pub part_size: usize,
}

impl SegmentData {
    /// The default [`SegmentData::part_size`]: 8 MiB (S3 accepts parts from 5 MiB).
    pub const DEFAULT_PART_SIZE: usize = 8 << 20;

    /// A segment whose `.log` chunks and tail are already in memory.
    pub fn in_memory(log: Vec<Bytes>, tail: SegmentTail) -> Self {
        SegmentData {
            log: futures::stream::iter(log.into_iter().map(Ok)).boxed(),
            tail: futures::future::ready(Ok(tail)).boxed(),
            part_size: Self::DEFAULT_PART_SIZE,
        }
    }

    /// Sets [`SegmentData::part_size`].
    pub fn with_part_size(mut self, part_size: usize) -> Self {
        self.part_size = part_size;
        self
    }
}

impl Debug for SegmentData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentData")
            .field("part_size", &self.part_size)
            .finish_non_exhaustive()
    }
}

fn invalid_segment(message: String) -> StorageError {
    StorageError::Permanent {
        source: message.into(),
    }
}

/// The checks of [`SegmentTail::layout`] on the lengths alone (testable without the bytes).
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
///     SegmentLayout, SegmentTail,
/// };
/// use futures::{FutureExt, StreamExt};
/// use std::sync::Arc;
///
/// let remote = ObjectRemoteStorage::new(Arc::new(ObjectStoreStorage::in_memory()));
/// let key = ObjectKey::parse("tiered/segment-1").unwrap();
/// // A `.log` produced as it is built (here: two chunks), then the other sections.
/// let log = futures::stream::iter([Bytes::from_static(b"batch 1;"), Bytes::from_static(b"batch 2;")])
///     .map(Ok)
///     .boxed();
/// let tail = SegmentTail {
///     offset_index: Bytes::from_static(&[0; 8]),
///     time_index: Bytes::from_static(&[0; 12]),
///     leader_epochs: Bytes::from_static(b"0\n1\n0 0\n"),
///     trailer: Bytes::from(vec![0; SegmentLayout::TRAILER_LEN as usize]),
///     ..Default::default()
/// };
/// let data = SegmentData {
///     log,
///     tail: futures::future::ready(Ok(tail)).boxed(),
///     part_size: SegmentData::DEFAULT_PART_SIZE,
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
    /// Consumes the `.log` stream as it comes (an implementation holds about
    /// [`SegmentData::part_size`] of it, not the whole `.log`), then awaits the tail. Stores
    /// nothing when the `.log` stream yields an error, when the tail fails, or when the layout
    /// checks of [`SegmentTail::layout`] fail (a `.log` longer than
    /// [`SegmentLayout::MAX_LOG_LEN`] fails as soon as the stream passes it; a trailer that is
    /// not 80 bytes, a section too large: [`StorageError::Permanent`]). Keys are fresh per
    /// attempt (UUID v7 keys that only a coordinator registration makes live): a copy to a key
    /// that holds another object fails with [`StorageError::AlreadyExists`] when the segment is
    /// stored in one request, and may replace it when it is stored in parts (multipart uploads
    /// cannot be create-only on every store). An attempt that failed ambiguously leaves at most
    /// an unregistered object (collected as an orphan).
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
/// and trailer concatenated, uploaded by [`ObjectStorage::upload_stream`] in parts of
/// [`SegmentData::part_size`] (one create-only upload where the store has no multipart upload,
/// or the object fits one part), read by ranged GETs.
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
        let SegmentData {
            log,
            tail,
            part_size,
        } = data;
        // What the `.log` stream passed so far, and the layout once the tail checked it: both
        // read by the upload's stream, borrowed for the upload only.
        let log_len = AtomicU64::new(0);
        let layout = OnceLock::new();
        let log = log.map(|chunk| {
            let chunk = chunk?;
            let len = log_len.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            if len > SegmentLayout::MAX_LOG_LEN {
                return Err(invalid_segment(format!(
                    "segment .log is more than {} bytes",
                    SegmentLayout::MAX_LOG_LEN
                )));
            }
            Ok(chunk)
        });
        let tail = futures::stream::once(async {
            let tail = tail.await?;
            let checked = tail.layout(log_len.load(Ordering::Relaxed))?;
            let _ = layout.set(checked);
            Ok::<_, StorageError>(futures::stream::iter(tail.into_chunks().map(Ok)))
        })
        .try_flatten();
        let size = self
            .0
            .upload_stream(key, log.chain(tail).boxed(), part_size.max(1))
            .await?;
        let layout = layout.get().copied().ok_or_else(|| {
            invalid_segment("the upload ended before the segment's tail".to_string())
        })?;
        if size != layout.object_size() {
            return Err(invalid_segment(format!(
                "stored {size} bytes for a segment of {}",
                layout.object_size()
            )));
        }
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
