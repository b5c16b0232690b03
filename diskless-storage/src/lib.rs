//! Object storage for diskless topics: the [`ObjectStorage`] trait and its implementation over the
//! [`object_store`] crate (in-memory, local filesystem, S3, GCS, Azure).
//!
//! KIP-1163 asks three things of object storage: upload a WAL segment under a fresh name, read byte
//! ranges of it, and delete it (idempotently) once nothing in it is live. Orphan reconciliation also
//! lists objects by prefix with their size and age.
//!
//! - [`ObjectStoreStorage`]: the implementation, with retries, timeouts and request accounting;
//!   built from a URL ([`ObjectStoreStorage::from_url`]) or an `object_store` store. Large objects
//!   stream in with [`ObjectStorage::upload_stream`] (a multipart upload); an [`UploadLister`]
//!   (`S3UploadLister` on S3, feature `s3`) finds the uploads whose create answer was lost, to
//!   abort them.
//! - [`MeteredStorage`]: the storage-call metrics of [`diskless_common::metrics`] around any
//!   storage; [`CountingStorage`]: request counters around any storage.
//! - [`ObjectKey`], [`KeySource`]: keys and where their UUIDs come from ([`RandomKeys`],
//!   [`SeededKeys`]), with the time of an injected [`Clock`].
//! - [`RemoteStorage`]: where tiered segments are stored (KIP-405's `RemoteStorageManager`);
//!   [`ObjectRemoteStorage`] stores a segment as one object of an [`ObjectStorage`].
//!
//! # Cargo features
//!
//! | feature | default | enables |
//! |---|---|---|
//! | `fs` | yes | the local filesystem ([`ObjectStoreStorage::local_fs`], `file://` URLs) |
//! | `s3` | no | Amazon S3 and S3-compatible stores (`s3://` URLs) |
//! | `gcs` | no | Google Cloud Storage (`gs://` URLs) |
//! | `azure` | no | Azure Blob Storage (`az://` URLs) |
//!
//! A URL whose backend's feature is off is refused with [`StorageError::Config`] naming the
//! feature.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod classify;
mod error;
mod from_url;
mod key;
mod metered;
pub mod ranges;
mod remote;
pub mod retry;
pub mod stats;
mod store;
mod uploads;

/// The clock object keys take their time from (re-exported from `diskless-common`, so that
/// [`ObjectKey::generate`] needs no other crate).
pub use diskless_common::{Clock, ManualClock, SystemClock};
/// The layout of a tiered segment object (re-exported from `diskless-common`, where the
/// coordinator's rows take it from too).
pub use diskless_common::{Section, SegmentLayout};
pub use error::{BoxError, StorageError};
pub use key::{KeySource, MAX_KEY_LEN, ObjectKey, RandomKeys, SeededKeys, validate_prefix};
pub use metered::MeteredStorage;
pub use ranges::{RangeReadConfig, ReadPlan, fetch_ranges, plan_ranged_reads};
pub use remote::{ObjectRemoteStorage, RemoteStorage, SegmentData, SegmentTail};
pub use retry::RetryConfig;
pub use stats::{CountingStorage, RequestCounters, RequestStats};
pub use store::{ObjectStoreStorage, StorageOptions};
#[cfg(feature = "s3")]
#[cfg_attr(docsrs, doc(cfg(feature = "s3")))]
pub use uploads::S3UploadLister;
pub use uploads::UploadLister;

/// The `object_store` crate this crate is built on, re-exported so that users can build their own
/// configured stores (see [`ObjectStoreStorage::from_object_store`]) with the same version.
pub use object_store;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

/// The smallest part of a multipart upload but the last (S3's limit, also GCS's XML API's):
/// 5 MiB. [`clamp_part_size`] raises smaller part sizes to it.
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;

/// The largest part of a multipart upload (S3's limit): 5 GiB ([`clamp_part_size`] caps at
/// `usize::MAX` where that is smaller, on 32-bit targets).
pub const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;

/// The most parts a multipart upload may have (S3's limit): an object streamed with
/// [`ObjectStorage::upload_stream`] may hold at most `MAX_PARTS × part_size` bytes.
pub const MAX_PARTS: u64 = 10_000;

/// The part size [`ObjectStorage::upload_stream`] implementations use for a requested
/// `part_size`: `part_size` within [`MIN_PART_SIZE`] and [`MAX_PART_SIZE`], so that every part but
/// the last is valid on every store.
///
/// ```
/// use diskless_storage::{MIN_PART_SIZE, clamp_part_size};
/// assert_eq!(clamp_part_size(0), MIN_PART_SIZE);
/// assert_eq!(clamp_part_size(8 << 20), 8 << 20);
/// ```
pub fn clamp_part_size(part_size: usize) -> usize {
    let max = usize::try_from(MAX_PART_SIZE).unwrap_or(usize::MAX);
    part_size.clamp(MIN_PART_SIZE, max)
}

/// An object as listed by [`ObjectStorage::list`].
///
/// Exhaustive on purpose (like the coordinator trait's request and response types): every
/// [`ObjectStorage`] implementation, including third-party ones and test doubles, builds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's key.
    pub key: ObjectKey,
    /// Its size in bytes.
    pub size: u64,
    /// When the store last modified it.
    pub last_modified: SystemTime,
}

/// What diskless topics need from an object store. Object-safe: hosts hold an
/// `Arc<dyn ObjectStorage>`.
#[async_trait]
pub trait ObjectStorage: Send + Sync + std::fmt::Debug {
    /// Uploads an object made of `payload`'s chunks, in order, create-only.
    ///
    /// If an object already exists under `key` with exactly the same content, this succeeds (a retry
    /// of an upload whose outcome was unknown); with other content it fails with
    /// [`StorageError::AlreadyExists`].
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError>;

    /// Uploads an object whose content arrives as a stream of chunks, in order (a tiered
    /// segment's `.log`, built while its batches are read): the object exists under `key` only if
    /// the stream ended without error and the store confirmed the whole object. Returns its size
    /// (the number of bytes the stream yielded).
    ///
    /// Implementations over a store with multipart uploads send parts of about `part_size` bytes
    /// as the chunks arrive, so memory stays near `part_size` whatever the object's size, and
    /// abort the upload on any error (a part that the store kept after an abort that failed is
    /// never visible as an object). Multipart uploads cannot be create-only on every store:
    /// callers must use a fresh key per attempt (as tiered segments do, with a UUID v7 key that
    /// only a coordinator registration makes live). A stream that fails ends the upload with its
    /// error.
    ///
    /// - `part_size` is a wish: stores take it within their limits ([`clamp_part_size`]: S3's
    ///   5 MiB minimum part, 5 GiB maximum), so any value is valid.
    /// - An object of at most `part_size` bytes may be sent as one create-only upload (as
    ///   [`ObjectStorage::upload`]); only larger ones need a multipart upload.
    /// - An empty stream uploads an empty object (as `upload(key, &[])`) and returns 0.
    /// - An error returned after the store received the whole object (a timeout of the request
    ///   completing it) is ambiguous, as for `upload`: the object may exist. A caller that
    ///   retries uses a fresh key; the key of the failed attempt is an orphan unless registered.
    /// - A consumed stream cannot be replayed: no layer retries the call as a whole (requests
    ///   inside it may be).
    ///
    /// The default implementation collects the chunks and calls [`ObjectStorage::upload`]
    /// (create-only, whole object in memory); wrappers should forward it.
    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        use futures::TryStreamExt;
        let _ = part_size;
        let chunks: Vec<Bytes> = chunks.try_collect().await?;
        let size = chunks.iter().map(|c| c.len() as u64).sum();
        self.upload(key, &chunks).await?;
        Ok(size)
    }

    /// Reads `range` of an object. A range that is empty, inverted or reaches past the end of the
    /// object is [`StorageError::InvalidRange`], never a short read.
    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError>;

    /// Deletes objects. Idempotent: a missing object counts as deleted. Returns the keys whose
    /// deletion the store confirmed (a key missing from the answer may be retried later).
    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError>;

    /// Lists the objects whose keys start with `prefix` (a validated prefix, see [`ObjectKey`]).
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>>;

    /// Lists the objects under `prefix` (as [`ObjectStorage::list`]) whose whole key is
    /// lexicographically (byte-wise, as `str` compares) strictly greater than `offset`:
    /// `object_store`'s `list_with_offset`, S3's `start-after`. `offset` is a whole key, not a
    /// suffix of `prefix`; it need not exist, nor be a valid [`ObjectKey`] (`""` lists everything
    /// under `prefix`).
    ///
    /// The order of the stream is not guaranteed: S3 returns keys in order, the local filesystem
    /// and other backends do not. A caller that resumes a scan from the last key it saw must
    /// therefore resume from the greatest key seen, not the last one received.
    ///
    /// The default implementation filters [`ObjectStorage::list`]: correct for every
    /// implementation, but it still lists (and pays for) the keys at or below `offset`.
    /// Implementations over a backend that can start a listing after a key should override it,
    /// and wrappers should forward it.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
    /// use futures::TryStreamExt;
    ///
    /// let storage = ObjectStoreStorage::in_memory();
    /// for name in ["wal/a", "wal/b", "wal/c"] {
    ///     let key = ObjectKey::parse(name).unwrap();
    ///     storage.upload(&key, &[bytes::Bytes::from_static(b"x")]).await.unwrap();
    /// }
    /// let mut keys: Vec<String> = storage
    ///     .list_with_offset("wal", "wal/a")
    ///     .map_ok(|meta| meta.key.into_string())
    ///     .try_collect()
    ///     .await
    ///     .unwrap();
    /// keys.sort(); // the order is not guaranteed
    /// assert_eq!(keys, ["wal/b", "wal/c"]);
    /// # });
    /// ```
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        use futures::{StreamExt, TryStreamExt};
        self.list(prefix)
            .try_filter(move |meta| futures::future::ready(meta.key.as_str() > offset))
            .boxed()
    }
}

/// Forwards every [`ObjectStorage`] method (`list_with_offset` included, so that a native
/// offset listing is kept) to the storage behind a pointer.
macro_rules! forward_through_pointer {
    ($pointer:ident) => {
        #[async_trait]
        impl<T: ObjectStorage + ?Sized> ObjectStorage for $pointer<T> {
            async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
                (**self).upload(key, payload).await
            }

            async fn fetch(
                &self,
                key: &ObjectKey,
                range: Range<u64>,
            ) -> Result<Bytes, StorageError> {
                (**self).fetch(key, range).await
            }

            async fn upload_stream(
                &self,
                key: &ObjectKey,
                chunks: BoxStream<'_, Result<Bytes, StorageError>>,
                part_size: usize,
            ) -> Result<u64, StorageError> {
                (**self).upload_stream(key, chunks, part_size).await
            }

            async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
                (**self).delete(keys).await
            }

            fn list<'a>(
                &'a self,
                prefix: &'a str,
            ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
                (**self).list(prefix)
            }

            fn list_with_offset<'a>(
                &'a self,
                prefix: &'a str,
                offset: &'a str,
            ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
                (**self).list_with_offset(prefix, offset)
            }
        }
    };
}

// Shared and boxed storages are storages: wrappers ([`CountingStorage`], [`MeteredStorage`], a
// test's fault injector) hold an `Arc<dyn ObjectStorage>` or a `Box<dyn ObjectStorage>`.
forward_through_pointer!(Arc);
forward_through_pointer!(Box);
