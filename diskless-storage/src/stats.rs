//! Request accounting: how many requests of each kind reached the store, and how many bytes.
//!
//! [`crate::ObjectStoreStorage`] counts every attempt it sends (a retried upload counts two PUTs),
//! which is what an object store bills. [`CountingStorage`] counts the calls made through any
//! [`ObjectStorage`] (one call may be several attempts inside it).

use crate::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Shared, lock-free request counters. Cloning gives another handle to the same counters.
#[derive(Clone, Debug, Default)]
pub struct RequestCounters {
    inner: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    put_requests: AtomicU64,
    put_bytes: AtomicU64,
    put_parts: AtomicU64,
    get_requests: AtomicU64,
    get_bytes: AtomicU64,
    delete_requests: AtomicU64,
    deleted_keys: AtomicU64,
    list_requests: AtomicU64,
    listed_objects: AtomicU64,
}

/// A snapshot of [`RequestCounters`]. Subtract two snapshots to get the cost of what happened in
/// between. `#[non_exhaustive]`: counters may be added; read its fields, or start from
/// [`RequestStats::default`] to build one in a test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestStats {
    /// PUT requests (upload attempts), and the requests of multipart uploads that S3 bills as
    /// PUTs: one to create the upload, one per part sent (`put_parts`), one to complete it.
    pub put_requests: u64,
    /// Bytes sent by PUT requests (parts included).
    pub put_bytes: u64,
    /// The part uploads among `put_requests` (`UploadPart` on S3). The PUTs per GiB of a
    /// streamed upload are about `1 GiB / part size + 2`.
    pub put_parts: u64,
    /// GET requests (ranged reads, reads that verify a retried upload, and the HEAD that checks
    /// a multipart upload whose completion failed).
    pub get_requests: u64,
    /// Bytes received by GET requests.
    pub get_bytes: u64,
    /// DELETE requests: one per batch of up to 1000 keys, which is one `DeleteObjects` call on
    /// S3. (Backends without bulk delete — local filesystem, GCS — send one request per key
    /// inside a batch; see `deleted_keys`.) The abort of a multipart upload counts one, with no
    /// key.
    pub delete_requests: u64,
    /// Keys sent in DELETE requests.
    pub deleted_keys: u64,
    /// LIST requests: one per page of up to 1000 objects, the first page always counting
    /// (S3's page size; an estimate on backends paging differently). The listing of a key's
    /// multipart uploads in progress after an ambiguous create (`ListMultipartUploads` on S3,
    /// see [`crate::ObjectStoreStorage::with_upload_lister`]) counts one per attempt.
    pub list_requests: u64,
    /// Objects received from LIST requests.
    pub listed_objects: u64,
}

impl std::ops::Sub for RequestStats {
    type Output = RequestStats;

    fn sub(self, rhs: RequestStats) -> RequestStats {
        RequestStats {
            put_requests: self.put_requests.saturating_sub(rhs.put_requests),
            put_bytes: self.put_bytes.saturating_sub(rhs.put_bytes),
            put_parts: self.put_parts.saturating_sub(rhs.put_parts),
            get_requests: self.get_requests.saturating_sub(rhs.get_requests),
            get_bytes: self.get_bytes.saturating_sub(rhs.get_bytes),
            delete_requests: self.delete_requests.saturating_sub(rhs.delete_requests),
            deleted_keys: self.deleted_keys.saturating_sub(rhs.deleted_keys),
            list_requests: self.list_requests.saturating_sub(rhs.list_requests),
            listed_objects: self.listed_objects.saturating_sub(rhs.listed_objects),
        }
    }
}

/// Objects per LIST page (S3's page size), for counting LIST requests.
pub(crate) const LIST_PAGE: u64 = 1000;

impl RequestCounters {
    /// Fresh counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current values.
    pub fn snapshot(&self) -> RequestStats {
        let c = &self.inner;
        RequestStats {
            put_requests: c.put_requests.load(Ordering::Relaxed),
            put_bytes: c.put_bytes.load(Ordering::Relaxed),
            put_parts: c.put_parts.load(Ordering::Relaxed),
            get_requests: c.get_requests.load(Ordering::Relaxed),
            get_bytes: c.get_bytes.load(Ordering::Relaxed),
            delete_requests: c.delete_requests.load(Ordering::Relaxed),
            deleted_keys: c.deleted_keys.load(Ordering::Relaxed),
            list_requests: c.list_requests.load(Ordering::Relaxed),
            listed_objects: c.listed_objects.load(Ordering::Relaxed),
        }
    }

    /// Counts one PUT request of `bytes` bytes.
    pub fn record_put(&self, bytes: u64) {
        self.inner.put_requests.fetch_add(1, Ordering::Relaxed);
        self.inner.put_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one part upload of `bytes` bytes: a PUT request that is also a part.
    pub fn record_put_part(&self, bytes: u64) {
        self.record_put(bytes);
        self.inner.put_parts.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one GET request.
    pub fn record_get(&self) {
        self.inner.get_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes received by GET requests.
    pub fn record_get_bytes(&self, bytes: u64) {
        self.inner.get_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one DELETE request for `keys` keys.
    pub fn record_delete(&self, keys: u64) {
        self.inner.delete_requests.fetch_add(1, Ordering::Relaxed);
        self.inner.deleted_keys.fetch_add(keys, Ordering::Relaxed);
    }

    /// Counts one LIST request.
    pub fn record_list(&self) {
        self.inner.list_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one listed object.
    pub fn record_listed_object(&self) {
        self.inner.listed_objects.fetch_add(1, Ordering::Relaxed);
    }

    /// Resets every counter to zero.
    pub fn reset(&self) {
        let c = &self.inner;
        for counter in [
            &c.put_requests,
            &c.put_bytes,
            &c.put_parts,
            &c.get_requests,
            &c.get_bytes,
            &c.delete_requests,
            &c.deleted_keys,
            &c.list_requests,
            &c.listed_objects,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// Wraps any [`ObjectStorage`] and counts the calls made through it, one request per call
/// (an upload is one PUT of the payload's size, a fetch one GET, a delete one DELETE per 1000
/// keys, a list one LIST per page of 1000 objects).
///
/// A streamed upload ([`ObjectStorage::upload_stream`]) is counted, when it returns, as
/// [`crate::ObjectStoreStorage`] sends it, from the bytes the stream yielded `B` and the part size
/// `P` ([`crate::clamp_part_size`]): a stream that ended with `B <= P` is one PUT of `B` bytes;
/// else one PUT to create the upload, one part per `P` bytes read (and one for the rest once the
/// stream ended) and, once the stream ended, one PUT to complete it. An estimate of the requests
/// (a failed upload may have sent fewer parts), exact for an upload that succeeded.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_storage::{CountingStorage, ObjectKey, ObjectStorage, ObjectStoreStorage};
/// let storage = CountingStorage::new(ObjectStoreStorage::in_memory());
/// let key = ObjectKey::parse("wal/segment-1").unwrap();
/// storage.upload(&key, &[bytes::Bytes::from_static(b"hello")]).await.unwrap();
/// let stats = storage.counters().snapshot();
/// assert_eq!((stats.put_requests, stats.put_bytes), (1, 5));
/// # });
/// ```
#[derive(Debug)]
pub struct CountingStorage<S> {
    inner: S,
    counters: RequestCounters,
}

impl<S: ObjectStorage> CountingStorage<S> {
    /// Wraps `inner` with fresh counters.
    pub fn new(inner: S) -> Self {
        Self::with_counters(inner, RequestCounters::new())
    }

    /// Wraps `inner`, counting into `counters` (which may be shared).
    pub fn with_counters(inner: S, counters: RequestCounters) -> Self {
        CountingStorage { inner, counters }
    }

    /// The counters.
    pub fn counters(&self) -> &RequestCounters {
        &self.counters
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: ObjectStorage> ObjectStorage for CountingStorage<S> {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let len: usize = payload.iter().map(Bytes::len).sum();
        self.counters.record_put(len as u64);
        self.inner.upload(key, payload).await
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let read = AtomicU64::new(0);
        let ended = std::sync::atomic::AtomicBool::new(false);
        let (read_ref, ended_ref) = (&read, &ended);
        let counted = futures::stream::unfold(chunks, move |mut chunks| async move {
            match chunks.next().await {
                Some(item) => {
                    if let Ok(chunk) = &item {
                        read_ref.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Some((item, chunks))
                }
                None => {
                    ended_ref.store(true, Ordering::Relaxed);
                    None
                }
            }
        })
        .boxed();
        let result = self.inner.upload_stream(key, counted, part_size).await;
        let (read, ended) = (read.into_inner(), ended.into_inner());
        let part = crate::clamp_part_size(part_size) as u64;
        if read <= part {
            if ended {
                self.counters.record_put(read);
            }
        } else {
            self.counters.record_put(0);
            for _ in 0..read / part {
                self.counters.record_put_part(part);
            }
            if ended {
                if read % part > 0 {
                    self.counters.record_put_part(read % part);
                }
                self.counters.record_put(0);
            }
        }
        result
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.counters.record_get();
        let bytes = self.inner.fetch(key, range).await?;
        self.counters.record_get_bytes(bytes.len() as u64);
        Ok(bytes)
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        for chunk in keys.chunks(crate::store::DELETE_BATCH) {
            self.counters.record_delete(chunk.len() as u64);
        }
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        count_listing(self.inner.list(prefix), self.counters.clone())
    }

    /// Counts as [`ObjectStorage::list`] does, the objects returned (not those skipped before the
    /// offset, which this wrapper cannot see).
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        count_listing(
            self.inner.list_with_offset(prefix, offset),
            self.counters.clone(),
        )
    }
}

/// Counts one listing's requests and objects as they pass.
fn count_listing(
    stream: BoxStream<'_, Result<ObjectMeta, StorageError>>,
    counters: RequestCounters,
) -> BoxStream<'_, Result<ObjectMeta, StorageError>> {
    let mut listing = ListingCounter::start(counters);
    stream
        .map(move |item| {
            if item.is_ok() {
                listing.object();
            }
            item
        })
        .boxed()
}

/// Counts the objects of one listing: every object, and one more LIST request at each page
/// boundary after the first page.
#[derive(Debug)]
pub(crate) struct ListingCounter {
    counters: RequestCounters,
    seen: u64,
}

impl ListingCounter {
    /// Starts a listing: counts its first LIST request.
    pub(crate) fn start(counters: RequestCounters) -> Self {
        counters.record_list();
        ListingCounter { counters, seen: 0 }
    }

    /// Counts one object received.
    pub(crate) fn object(&mut self) {
        if self.seen > 0 && self.seen.is_multiple_of(LIST_PAGE) {
            self.counters.record_list();
        }
        self.seen += 1;
        self.counters.record_listed_object();
    }
}
