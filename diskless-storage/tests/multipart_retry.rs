//! Retried parts of `ObjectStoreStorage::upload_stream`'s multipart uploads: with the store's
//! `MultipartStore` API (explicit part numbers) a part that fails transiently or times out is
//! resent under its number, within the `RetryConfig`; a permanent failure or too many transient
//! ones abort the upload; without that API (`from_object_store` alone) one failed part still
//! aborts the upload. The store is an in-memory one (or the in-process S3 server) behind a
//! wrapper that fails chosen attempts of chosen parts, through both multipart APIs.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;
use support::{bad_request, unavailable};

use async_trait::async_trait;
use bytes::Bytes;
use diskless_storage::object_store::multipart::{MultipartStore, PartId};
use diskless_storage::object_store::{
    self, MultipartId, MultipartUpload, ObjectStore, PutMultipartOptions, PutPayload, PutResult,
    UploadPart, memory::InMemory, path::Path,
};
use diskless_storage::{
    MIN_PART_SIZE, ObjectKey, ObjectStorage, ObjectStoreStorage, RetryConfig, StorageError,
    StorageOptions,
};
use diskless_testkit::storage::S3TestServer;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What one attempt of one part does instead of succeeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Fails with a 503 (transient) without storing the part.
    Transient,
    /// Fails with a 400 (permanent) without storing the part.
    Permanent,
    /// Never answers (cut by the attempt timeout).
    Hang,
    /// Stores the part, then fails with a 503: the ambiguous outcome.
    StoreThenFail,
    /// Succeeds, but only after yielding to the caller a few times (a request that needs
    /// polling to progress); records the chunks read by then in [`Plan::chunks_at_done`].
    Slow,
}

/// The faults to inject and what the store saw.
#[derive(Debug, Default)]
struct Plan {
    /// The faults of the successive attempts of each part, by part index (0-based).
    faults: Mutex<HashMap<usize, VecDeque<Fault>>>,
    /// `MultipartStore::put_part` attempts, by part index.
    part_attempts: Mutex<HashMap<usize, usize>>,
    /// The fault of the next `MultipartStore::complete_multipart` (`Transient` or
    /// `StoreThenFail`).
    completion_fault: Mutex<Option<Fault>>,
    store_completions: AtomicUsize,
    store_aborts: AtomicUsize,
    /// `MultipartUpload::put_part` calls (the path without a `MultipartStore`).
    upload_parts: AtomicUsize,
    upload_aborts: AtomicUsize,
    /// Chunks of the upload's stream read so far (counted by [`counted_chunks`]).
    chunks_read: Arc<AtomicUsize>,
    /// For each part that ended a [`Fault::Slow`] attempt: the chunks read by then.
    chunks_at_done: Mutex<HashMap<usize, usize>>,
}

impl Plan {
    fn with(faults: impl IntoIterator<Item = (usize, Vec<Fault>)>) -> Arc<Plan> {
        let plan = Plan::default();
        for (part, list) in faults {
            plan.faults.lock().insert(part, list.into());
        }
        Arc::new(plan)
    }

    fn next_fault(&self, part: usize) -> Option<Fault> {
        self.faults.lock().get_mut(&part)?.pop_front()
    }

    fn attempts(&self, part: usize) -> usize {
        self.part_attempts.lock().get(&part).copied().unwrap_or(0)
    }

    fn store_aborts(&self) -> usize {
        self.store_aborts.load(Ordering::SeqCst)
    }
}

/// A store (in memory or S3) whose parts fail as its [`Plan`] says, through both its
/// `MultipartStore` API and the `MultipartUpload`s of its `ObjectStore` API.
#[derive(Debug)]
struct Faulty<S> {
    inner: Arc<S>,
    plan: Arc<Plan>,
}

/// Runs `put` (the part request) as `fault` says.
async fn faulted<T>(
    fault: Option<Fault>,
    put: impl Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    match fault {
        None => put.await,
        Some(Fault::Transient) => Err(unavailable()),
        Some(Fault::Permanent) => Err(bad_request()),
        Some(Fault::Hang) => std::future::pending().await,
        Some(Fault::Slow) => put.await,
        Some(Fault::StoreThenFail) => {
            put.await?;
            Err(unavailable())
        }
    }
}

#[async_trait]
impl<S: MultipartStore + std::fmt::Debug> MultipartStore for Faulty<S> {
    async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
        self.inner.create_multipart(path).await
    }

    async fn create_multipart_opts(
        &self,
        path: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<MultipartId> {
        self.inner.create_multipart_opts(path, opts).await
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        *self.plan.part_attempts.lock().entry(part_idx).or_default() += 1;
        let fault = self.plan.next_fault(part_idx);
        if fault == Some(Fault::Slow) {
            // Pending three times, each time woken at once (not deferred to the runtime's
            // next tick, as `tokio::task::yield_now` is): ready to progress whenever polled.
            let mut left = 3;
            std::future::poll_fn(|cx| {
                if left == 0 {
                    return std::task::Poll::Ready(());
                }
                left -= 1;
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            })
            .await;
            let done = self.inner.put_part(path, id, part_idx, data).await;
            let read = self.plan.chunks_read.load(Ordering::SeqCst);
            self.plan.chunks_at_done.lock().insert(part_idx, read);
            return done;
        }
        faulted(fault, self.inner.put_part(path, id, part_idx, data)).await
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        self.plan.store_completions.fetch_add(1, Ordering::SeqCst);
        let fault = self.plan.completion_fault.lock().take();
        faulted(fault, self.inner.complete_multipart(path, id, parts)).await
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
        self.plan.store_aborts.fetch_add(1, Ordering::SeqCst);
        self.inner.abort_multipart(path, id).await
    }
}

/// A `MultipartUpload` of [`Faulty`]'s `ObjectStore` API: its parts are numbered in call order.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    plan: Arc<Plan>,
    sent: usize,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let fault = self.plan.next_fault(self.sent);
        self.sent += 1;
        self.plan.upload_parts.fetch_add(1, Ordering::SeqCst);
        let put = self.inner.put_part(data);
        Box::pin(faulted(fault, put))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.plan.upload_aborts.fetch_add(1, Ordering::SeqCst);
        self.inner.abort().await
    }
}

support::object_store_wrapper!(impl<S: ObjectStore> for Faulty<S> {
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(FaultyUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            plan: self.plan.clone(),
            sent: 0,
        }))
    }
});

fn options() -> StorageOptions {
    StorageOptions::default().with_retry(
        RetryConfig::default()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(1))
            .with_max_backoff(Duration::from_millis(4))
            .with_attempt_timeout(Duration::from_secs(10))
            .with_seed(7),
    )
}

/// A storage over an in-memory store failing as `plan` says: with its `MultipartStore` API
/// (`multipart`) or without it.
fn storage(plan: &Arc<Plan>, multipart: bool, options: StorageOptions) -> ObjectStoreStorage {
    let store = Arc::new(Faulty {
        inner: Arc::new(InMemory::new()),
        plan: plan.clone(),
    });
    let storage = ObjectStoreStorage::from_object_store(store.clone(), "root")
        .unwrap()
        .with_options(options)
        .unwrap();
    if multipart {
        storage.with_multipart_store(store)
    } else {
        storage
    }
}

/// `parts` full parts and a short last one.
fn data(parts: usize) -> Bytes {
    Bytes::from(diskless_testkit::storage::conformance::pattern(
        parts * MIN_PART_SIZE + 123,
        5,
    ))
}

fn key() -> ObjectKey {
    ObjectKey::parse("tiered/segment").unwrap()
}

async fn stream_upload(storage: &ObjectStoreStorage, data: &Bytes) -> Result<u64, StorageError> {
    let chunks = diskless_testkit::storage::conformance::chunk_stream(data, 512 * 1024);
    storage.upload_stream(&key(), chunks, MIN_PART_SIZE).await
}

async fn assert_object(storage: &ObjectStoreStorage, data: &Bytes) {
    let stored = storage.fetch(&key(), 0..data.len() as u64).await.unwrap();
    assert!(stored == *data, "the object differs from the data sent");
    let listed: Vec<_> = storage.list("tiered").try_collect().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size, data.len() as u64);
}

async fn assert_no_object(storage: &ObjectStoreStorage) {
    match storage.fetch(&key(), 0..1).await {
        Err(e) if e.is_not_found() => {}
        other => panic!("expected no object, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_part_failing_twice_transiently_is_resent_and_the_object_is_whole() {
    for parts_in_flight in [1, 3] {
        // Part 2 of 4 (index 1) fails twice, then is stored.
        let plan = Plan::with([(1, vec![Fault::Transient, Fault::Transient])]);
        let storage = storage(&plan, true, options().with_parts_in_flight(parts_in_flight));
        let data = data(3);
        assert_eq!(
            stream_upload(&storage, &data).await.unwrap(),
            data.len() as u64
        );
        let stats = storage.counters().snapshot();
        assert_object(&storage, &data).await;
        assert_eq!(
            (0..4).map(|part| plan.attempts(part)).collect::<Vec<_>>(),
            [1, 3, 1, 1]
        );
        assert_eq!(plan.store_completions.load(Ordering::SeqCst), 1);
        assert_eq!(plan.store_aborts(), 0);
        assert_eq!(plan.upload_parts.load(Ordering::SeqCst), 0);
        // Every attempt is a billed part request: one creation, 4 + 2 parts, one completion; the
        // resent part's bytes count twice more.
        assert_eq!(
            (stats.put_requests, stats.put_parts, stats.put_bytes),
            (8, 6, data.len() as u64 + 2 * MIN_PART_SIZE as u64),
            "{parts_in_flight} parts in flight"
        );
        assert_eq!((stats.get_requests, stats.delete_requests), (0, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn a_part_that_hangs_or_lands_ambiguously_is_resent_under_its_number() {
    // Part 3 hangs (cut at the 10 s attempt timeout), then is stored but answered with a 503,
    // then stored again (the same bytes under the same number).
    let plan = Plan::with([(2, vec![Fault::Hang, Fault::StoreThenFail])]);
    let storage = storage(&plan, true, options());
    let data = data(3);
    let start = tokio::time::Instant::now();
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    assert!(start.elapsed() >= Duration::from_secs(10));
    assert_eq!(plan.attempts(2), 3);
    assert_eq!(plan.store_aborts(), 0);
    assert_object(&storage, &data).await;
    assert_eq!(storage.counters().snapshot().put_parts, 6);
}

/// `data` in chunks of 512 KiB, always ready, each counted in `plan.chunks_read` as it is read.
fn counted_chunks(
    plan: &Arc<Plan>,
    data: &Bytes,
) -> BoxStream<'static, Result<Bytes, StorageError>> {
    let read = plan.chunks_read.clone();
    diskless_testkit::storage::conformance::chunk_stream(data, 512 * 1024)
        .inspect(move |_| {
            read.fetch_add(1, Ordering::SeqCst);
        })
        .boxed()
}

/// The parts in flight progress while a stream that is always ready is read: the first part (a
/// request that needs a few polls) is stored while its successors' chunks are still being read,
/// not only once every slot is taken or the stream has ended.
#[tokio::test(start_paused = true)]
async fn parts_in_flight_progress_while_a_ready_stream_is_read() {
    let plan = Plan::with([(0, vec![Fault::Slow])]);
    let storage = storage(&plan, true, options().with_parts_in_flight(4));
    let data = data(4);
    let total = data.len().div_ceil(512 * 1024);
    let chunks = counted_chunks(&plan, &data);
    storage
        .upload_stream(&key(), chunks, MIN_PART_SIZE)
        .await
        .unwrap();
    assert_object(&storage, &data).await;
    let per_part = MIN_PART_SIZE / (512 * 1024);
    let at_done = plan.chunks_at_done.lock().get(&0).copied().unwrap();
    assert!(
        at_done < 2 * per_part,
        "part 0 was stored only after {at_done} of {total} chunks were read"
    );
}

#[tokio::test(start_paused = true)]
async fn a_part_failing_permanently_aborts_the_upload_at_once() {
    let plan = Plan::with([(2, vec![Fault::Permanent])]);
    let storage = storage(&plan, true, options());
    let err = stream_upload(&storage, &data(3)).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err:?}");
    // Not retried; the upload aborted through the same API, never completed.
    assert_eq!(plan.attempts(2), 1);
    assert_eq!(plan.store_aborts(), 1);
    assert_eq!(plan.store_completions.load(Ordering::SeqCst), 0);
    assert_eq!(storage.counters().snapshot().delete_requests, 1);
    assert_no_object(&storage).await;
}

#[tokio::test(start_paused = true)]
async fn a_part_failing_transiently_more_than_max_attempts_aborts_the_upload() {
    let plan = Plan::with([(1, vec![Fault::Transient; 5])]);
    let storage = storage(&plan, true, options());
    let err = stream_upload(&storage, &data(3)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    // max_attempts (3) attempts of part 2, then the abort.
    assert_eq!(plan.attempts(1), 3);
    assert_eq!(plan.store_aborts(), 1);
    assert_eq!(plan.store_completions.load(Ordering::SeqCst), 0);
    assert_no_object(&storage).await;
    let stats = storage.counters().snapshot();
    // One creation, part 1, three attempts of part 2 (one part in flight at a time).
    assert_eq!(
        (stats.put_requests, stats.put_parts, stats.delete_requests),
        (5, 4, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn the_completion_is_one_request_confirmed_by_the_object_size() {
    // Completed, but answered with a 503: the HEAD finds the whole object, the call succeeds.
    let plan = Plan::with([]);
    *plan.completion_fault.lock() = Some(Fault::StoreThenFail);
    let storage = storage(&plan, true, options());
    let data = data(2);
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    let stats = storage.counters().snapshot();
    assert_eq!((stats.get_requests, stats.delete_requests), (1, 0));
    assert_eq!(plan.store_completions.load(Ordering::SeqCst), 1);
    assert_eq!(plan.store_aborts(), 0);
    assert_object(&storage, &data).await;

    // Not completed (a 503): no object, the upload aborted.
    let plan = Plan::with([]);
    *plan.completion_fault.lock() = Some(Fault::Transient);
    let storage = crate::storage(&plan, true, options());
    let err = stream_upload(&storage, &data).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(plan.store_completions.load(Ordering::SeqCst), 1);
    assert_eq!(plan.store_aborts(), 1);
    assert_no_object(&storage).await;
}

#[tokio::test(start_paused = true)]
async fn without_a_multipart_store_one_failed_part_aborts_the_upload() {
    // The same fault that the retried path survives (part 2 failing twice).
    let plan = Plan::with([(1, vec![Fault::Transient, Fault::Transient])]);
    let storage = storage(&plan, false, options());
    assert!(storage.multipart_store().is_none());
    let err = stream_upload(&storage, &data(3)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    // Through `MultipartUpload`: parts 1 and 2, one request each, then its abort.
    assert_eq!(plan.upload_parts.load(Ordering::SeqCst), 2);
    assert_eq!(plan.upload_aborts.load(Ordering::SeqCst), 1);
    assert!(plan.part_attempts.lock().is_empty());
    assert_eq!(plan.store_aborts(), 0);
    assert_no_object(&storage).await;
    let stats = storage.counters().snapshot();
    assert_eq!(
        (stats.put_requests, stats.put_parts, stats.delete_requests),
        (3, 2, 1)
    );
}

#[tokio::test]
async fn the_stores_built_here_have_a_multipart_store_and_local_files_do_not() {
    let none = std::iter::empty::<(&str, &str)>();
    assert!(ObjectStoreStorage::in_memory().multipart_store().is_some());
    let from_url = ObjectStoreStorage::from_url("memory:///root", none).unwrap();
    assert!(from_url.multipart_store().is_some());
    let server = S3TestServer::start().await.unwrap();
    assert!(server.storage("p").unwrap().multipart_store().is_some());
    let s3 = Arc::new(server.amazon_s3().unwrap());
    assert!(
        ObjectStoreStorage::from_object_store(s3, "")
            .unwrap()
            .multipart_store()
            .is_none()
    );
    let dir = tempfile::tempdir().unwrap();
    let local = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    assert!(local.multipart_store().is_none());
    server.shutdown().await;
}

/// The retried path over S3's HTTP API (the in-process s3s server), with a prefix and the
/// caller's own client given as both traits: parts resent under their numbers replace what an
/// earlier attempt stored, and an aborted upload leaves no parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_parts_are_resent_under_their_numbers() {
    let server = S3TestServer::start().await.unwrap();
    let plan = Plan::with([
        (1, vec![Fault::Transient, Fault::StoreThenFail]),
        (3, vec![Fault::StoreThenFail]),
    ]);
    let store = Arc::new(Faulty {
        inner: Arc::new(server.amazon_s3().unwrap()),
        plan: plan.clone(),
    });
    let storage_with = |parts_in_flight| {
        ObjectStoreStorage::from_object_store(store.clone(), "tenant/a")
            .unwrap()
            .with_options(options().with_parts_in_flight(parts_in_flight))
            .unwrap()
            .with_multipart_store(store.clone())
    };
    let data = data(3);
    let storage = storage_with(2);
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    assert_object(&storage, &data).await;
    assert_eq!(
        (0..4).map(|part| plan.attempts(part)).collect::<Vec<_>>(),
        [1, 3, 1, 2]
    );
    assert_eq!(storage.counters().snapshot().put_parts, 7);

    // A part failing for good: the upload is aborted, no part stays on the server. One part in
    // flight: a part request in flight when another fails is dropped, not awaited, and on S3 it
    // may still land after the abort (then only the bucket's lifecycle rule removes it).
    plan.faults.lock().insert(2, vec![Fault::Permanent].into());
    let storage = storage_with(1);
    let err = stream_upload(&storage, &data).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err:?}");
    assert_eq!(plan.store_aborts(), 1);
    let leftovers: Vec<String> = walk(server.root())
        .into_iter()
        .filter(|f| f.contains(".upload_id-"))
        .collect();
    assert!(leftovers.is_empty(), "parts left: {leftovers:?}");
    // The object of the first upload is still there, whole.
    assert_object(&storage, &data).await;
    server.shutdown().await;
}

/// The files under `dir`, relative to it.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(
                    path.strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    files
}
