//! [`MeteredStorage`]: the storage-call series of [`diskless_common::metrics`], emitted through
//! the [`metrics`] facade around any [`ObjectStorage`].

use crate::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use async_trait::async_trait;
use bytes::Bytes;
use diskless_common::metrics as m;
use futures::stream::{BoxStream, Stream, StreamExt};
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// An [`ObjectStorage`] that records, for every call it forwards, each of these series exactly
/// once (names, units and labels from [`diskless_common::metrics`]):
///
/// | series | labels | value |
/// |---|---|---|
/// | [`STORAGE_REQUESTS`](m::STORAGE_REQUESTS) | `op`, `outcome` | 1 |
/// | [`STORAGE_SECONDS`](m::STORAGE_SECONDS) | `op` | the call's latency |
/// | [`STORAGE_BYTES`](m::STORAGE_BYTES) | `op` (`put`, `put_stream`, `get` only) | bytes uploaded (`put`: the payload, `put_stream`: the size returned; 0 if the upload failed) or returned (`get`: 0 if the fetch failed) |
///
/// `op` is `put` ([`upload`](ObjectStorage::upload)), `put_stream`
/// ([`upload_stream`](ObjectStorage::upload_stream): its latency is the whole stream's, paced by
/// the producer of the chunks, so it is kept apart from `put`), `get` ([`fetch`](ObjectStorage::fetch)),
/// `delete` ([`delete`](ObjectStorage::delete)) or `list` ([`list`](ObjectStorage::list) and
/// [`list_with_offset`](ObjectStorage::list_with_offset)); `outcome` is `ok` or `error`.
///
/// What one call is:
///
/// - a **call**, not a request to the store: an upload that [`ObjectStoreStorage`] retried three
///   times counts one `put` (its attempts are in [`ObjectStoreStorage::counters`]), and its
///   latency includes the retries. A streamed upload of any number of parts is one `put_stream`
///   (its parts are in the counters' `put_parts`). A delete of any number of keys is one `delete`;
/// - a **listing** is one `list` call whatever its number of pages, recorded when its stream
///   ends, or when the stream is dropped after it was first polled (a caller that stops reading
///   early still made requests); its latency runs from the first poll, and its outcome is
///   `error` if the stream yielded an error. A listing never polled records nothing;
/// - a call whose future is dropped before it completes (cancelled) records nothing, as
///   `MeteredCoordinator` does for coordinator calls.
///
/// The host applies it once, around the storage it hands to the writer, the fetcher and the
/// lifecycle workers. Without an installed `metrics` recorder it costs a few relaxed loads per
/// call.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_storage::{MeteredStorage, ObjectKey, ObjectStorage, ObjectStoreStorage};
/// use std::sync::Arc;
///
/// let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
/// let storage: Arc<dyn ObjectStorage> = Arc::new(MeteredStorage::new(storage));
/// let key = ObjectKey::parse("wal/segment-1").unwrap();
/// storage.upload(&key, &[bytes::Bytes::from_static(b"hello")]).await.unwrap();
/// # });
/// ```
///
/// [`ObjectStoreStorage`]: crate::ObjectStoreStorage
/// [`ObjectStoreStorage::counters`]: crate::ObjectStoreStorage::counters
#[derive(Debug, Clone)]
pub struct MeteredStorage<S = Arc<dyn ObjectStorage>> {
    inner: S,
}

impl<S: ObjectStorage> MeteredStorage<S> {
    /// Records the calls made to `inner`.
    pub fn new(inner: S) -> Self {
        MeteredStorage { inner }
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the storage.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The value of the `op` label.
#[derive(Clone, Copy, Debug)]
enum Op {
    Put,
    PutStream,
    Get,
    Delete,
    List,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::PutStream => "put_stream",
            Op::Get => "get",
            Op::Delete => "delete",
            Op::List => "list",
        }
    }
}

/// Records one call's series, once.
fn record(op: Op, start: Instant, ok: bool, bytes: Option<u64>) {
    let (op, outcome) = (op.name(), if ok { m::OK } else { m::ERROR });
    metrics::counter!(m::STORAGE_REQUESTS, m::OP => op, m::OUTCOME => outcome).increment(1);
    metrics::histogram!(m::STORAGE_SECONDS, m::OP => op).record(start.elapsed().as_secs_f64());
    if let Some(bytes) = bytes {
        metrics::counter!(m::STORAGE_BYTES, m::OP => op).increment(bytes);
    }
}

#[async_trait]
impl<S: ObjectStorage> ObjectStorage for MeteredStorage<S> {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let start = Instant::now();
        let result = self.inner.upload(key, payload).await;
        let sent = payload.iter().map(|chunk| chunk.len() as u64).sum();
        let bytes = if result.is_ok() { sent } else { 0 };
        record(Op::Put, start, result.is_ok(), Some(bytes));
        result
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let start = Instant::now();
        let result = self.inner.upload_stream(key, chunks, part_size).await;
        let bytes = *result.as_ref().unwrap_or(&0);
        record(Op::PutStream, start, result.is_ok(), Some(bytes));
        result
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let start = Instant::now();
        let result = self.inner.fetch(key, range).await;
        let bytes = result.as_ref().map_or(0, |bytes| bytes.len() as u64);
        record(Op::Get, start, result.is_ok(), Some(bytes));
        result
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let start = Instant::now();
        let result = self.inner.delete(keys).await;
        record(Op::Delete, start, result.is_ok(), None);
        result
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        MeteredListing::new(self.inner.list(prefix)).boxed()
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        MeteredListing::new(self.inner.list_with_offset(prefix, offset)).boxed()
    }
}

/// A listing that records one `list` call when it ends or, once polled, when it is dropped.
struct MeteredListing<'a> {
    inner: BoxStream<'a, Result<ObjectMeta, StorageError>>,
    state: ListingState,
    /// Whether it yielded an error.
    failed: bool,
}

/// Where a [`MeteredListing`] is in its life.
#[derive(Clone, Copy)]
enum ListingState {
    /// Not polled yet: nothing to record if dropped.
    NotStarted,
    /// Polled since this instant, not recorded yet.
    Running(Instant),
    /// Recorded (at its end, or on drop).
    Recorded,
}

impl<'a> MeteredListing<'a> {
    fn new(inner: BoxStream<'a, Result<ObjectMeta, StorageError>>) -> Self {
        MeteredListing {
            inner,
            state: ListingState::NotStarted,
            failed: false,
        }
    }

    /// Records the listing if it is running.
    fn finish(&mut self) {
        if let ListingState::Running(start) = self.state {
            record(Op::List, start, !self.failed, None);
        }
        self.state = ListingState::Recorded;
    }
}

impl Stream for MeteredListing<'_> {
    type Item = Result<ObjectMeta, StorageError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let ListingState::NotStarted = this.state {
            this.state = ListingState::Running(Instant::now());
        }
        let polled = this.inner.poll_next_unpin(cx);
        match &polled {
            Poll::Ready(Some(Err(_))) => this.failed = true,
            Poll::Ready(None) => this.finish(),
            _ => {}
        }
        polled
    }
}

impl Drop for MeteredListing<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}
