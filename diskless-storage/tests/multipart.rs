//! `ObjectStoreStorage::upload_stream`'s multipart uploads against an `object_store` whose
//! multipart uploads follow a script (slow parts, failing parts, failing or ambiguous
//! completions), under tokio's paused clock: parts in flight are bounded, every failure aborts
//! the upload and leaves no object, an ambiguous completion is confirmed by the object's size.
//! The storage has no `MultipartStore` (`from_object_store` alone): parts go through
//! `MultipartUpload`, one request each; multipart_retry.rs covers the retried parts.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;
use support::unavailable;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_storage::object_store::{
    self, MultipartUpload, PutMultipartOptions, PutPayload, PutResult, UploadPart,
    memory::InMemory, path::Path,
};
use diskless_storage::{
    MIN_PART_SIZE, ObjectKey, ObjectStorage, ObjectStoreStorage, RetryConfig, StorageError,
    StorageOptions,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How the completion of a multipart upload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    Ok,
    /// Fails (503) without storing anything.
    Fail,
    /// Stores the object, then fails (503): the ambiguous outcome.
    LandThenFail,
}

#[derive(Debug)]
struct Script {
    /// Failures (503) of the next creations of multipart uploads.
    create_failures: Mutex<VecDeque<()>>,
    /// How long each part takes.
    part_delay: Duration,
    /// The part (1-based, in the order they are sent) that fails with a 503.
    failing_part: Option<usize>,
    completion: Completion,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    aborted: AtomicUsize,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            create_failures: Mutex::new(VecDeque::new()),
            part_delay: Duration::from_millis(100),
            failing_part: None,
            completion: Completion::Ok,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            aborted: AtomicUsize::new(0),
        }
    }
}

/// An in-memory store whose multipart uploads follow a [`Script`].
#[derive(Debug, Default)]
struct Scripted {
    inner: InMemory,
    script: Arc<Script>,
}

#[derive(Debug)]
struct ScriptedUpload {
    inner: Box<dyn MultipartUpload>,
    script: Arc<Script>,
    sent: usize,
}

#[async_trait]
impl MultipartUpload for ScriptedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.sent += 1;
        let fails = self.script.failing_part == Some(self.sent);
        let inner = (!fails).then(|| self.inner.put_part(data));
        let script = self.script.clone();
        Box::pin(async move {
            let now = script.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            script.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(script.part_delay).await;
            script.in_flight.fetch_sub(1, Ordering::SeqCst);
            match inner {
                Some(inner) => inner.await,
                None => Err(unavailable()),
            }
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        match self.script.completion {
            Completion::Ok => self.inner.complete().await,
            Completion::Fail => Err(unavailable()),
            Completion::LandThenFail => {
                self.inner.complete().await?;
                Err(unavailable())
            }
        }
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.script.aborted.fetch_add(1, Ordering::SeqCst);
        self.inner.abort().await
    }
}

support::object_store_wrapper!(impl for Scripted {
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if self.script.create_failures.lock().pop_front().is_some() {
            return Err(unavailable());
        }
        Ok(Box::new(ScriptedUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            script: self.script.clone(),
            sent: 0,
        }))
    }
});

fn storage(script: Script, options: StorageOptions) -> (ObjectStoreStorage, Arc<Script>) {
    let script = Arc::new(script);
    let store = Arc::new(Scripted {
        inner: InMemory::new(),
        script: script.clone(),
    });
    let storage = ObjectStoreStorage::from_object_store(store, "")
        .unwrap()
        .with_options(options)
        .unwrap();
    (storage, script)
}

fn options() -> StorageOptions {
    StorageOptions::default().with_retry(
        RetryConfig::default()
            .with_max_attempts(3)
            .with_attempt_timeout(Duration::from_secs(10))
            .with_seed(7),
    )
}

fn data(parts: usize) -> Bytes {
    Bytes::from(diskless_testkit::storage::conformance::pattern(
        parts * MIN_PART_SIZE + 123,
        9,
    ))
}

fn key() -> ObjectKey {
    ObjectKey::parse("tiered/segment").unwrap()
}

async fn stream_upload(storage: &ObjectStoreStorage, data: &Bytes) -> Result<u64, StorageError> {
    let chunks = diskless_testkit::storage::conformance::chunk_stream(data, 512 * 1024);
    storage.upload_stream(&key(), chunks, MIN_PART_SIZE).await
}

async fn assert_no_object(storage: &ObjectStoreStorage) {
    match storage.fetch(&key(), 0..1).await {
        Err(e) if e.is_not_found() => {}
        other => panic!("expected no object, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn parts_in_flight_are_bounded_by_the_option() {
    for parts_in_flight in [1, 3] {
        let (storage, script) = storage(
            Script::default(),
            options().with_parts_in_flight(parts_in_flight),
        );
        let data = data(6);
        assert_eq!(
            stream_upload(&storage, &data).await.unwrap(),
            data.len() as u64
        );
        assert_eq!(script.max_in_flight.load(Ordering::SeqCst), parts_in_flight);
        assert_eq!(
            storage.fetch(&key(), 0..data.len() as u64).await.unwrap(),
            data
        );
        assert_eq!(storage.counters().snapshot().put_parts, 7);
        assert_eq!(script.aborted.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_part_aborts_the_upload_without_retrying_it() {
    let (storage, script) = storage(
        Script {
            failing_part: Some(2),
            ..Script::default()
        },
        options(),
    );
    let err = stream_upload(&storage, &data(4)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(script.aborted.load(Ordering::SeqCst), 1);
    assert_no_object(&storage).await;
    let stats = storage.counters().snapshot();
    // One creation, parts up to the failed one (one part in flight at a time), no completion;
    // one DELETE (the abort).
    assert_eq!(
        (stats.put_requests, stats.put_parts, stats.delete_requests),
        (3, 2, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_part_that_hangs_is_cut_at_the_attempt_timeout_and_aborted() {
    let (storage, script) = storage(
        Script {
            part_delay: Duration::from_secs(3600),
            ..Script::default()
        },
        options(),
    );
    let start = tokio::time::Instant::now();
    let err = stream_upload(&storage, &data(2)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(script.aborted.load(Ordering::SeqCst), 1);
    assert_no_object(&storage).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_completion_aborts_and_leaves_no_object() {
    let (storage, script) = storage(
        Script {
            completion: Completion::Fail,
            ..Script::default()
        },
        options(),
    );
    let err = stream_upload(&storage, &data(2)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(script.aborted.load(Ordering::SeqCst), 1);
    // The HEAD that looked for a completed object counts as a GET.
    assert_eq!(storage.counters().snapshot().get_requests, 1);
    assert_no_object(&storage).await;
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_completion_is_confirmed_by_the_object_size() {
    let (storage, script) = storage(
        Script {
            completion: Completion::LandThenFail,
            ..Script::default()
        },
        options(),
    );
    let data = data(2);
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    assert_eq!(script.aborted.load(Ordering::SeqCst), 0);
    assert_eq!(
        storage.fetch(&key(), 0..data.len() as u64).await.unwrap(),
        data
    );
}

#[tokio::test(start_paused = true)]
async fn the_creation_is_retried_on_transient_failures() {
    let script = Script::default();
    script.create_failures.lock().extend([(), ()]);
    let (storage, _) = storage(script, options());
    let data = data(1);
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    // Three creations (two failed), two parts, one completion.
    let stats = storage.counters().snapshot();
    assert_eq!((stats.put_requests, stats.put_parts), (6, 2));

    // Failing more often than `max_attempts`: the call fails, nothing was created to abort.
    let script = Script::default();
    script.create_failures.lock().extend([(), (), ()]);
    let (storage, script) = crate::storage(script, options());
    assert!(
        stream_upload(&storage, &data)
            .await
            .unwrap_err()
            .is_transient()
    );
    assert_eq!(script.aborted.load(Ordering::SeqCst), 0);
    assert_eq!(storage.counters().snapshot().put_parts, 0);
    assert_no_object(&storage).await;
}

#[test]
fn zero_parts_in_flight_is_rejected() {
    let err = options().with_parts_in_flight(0).validate().unwrap_err();
    assert!(
        matches!(&err, StorageError::Config(m) if m.contains("parts_in_flight")),
        "{err:?}"
    );
    assert_eq!(StorageOptions::default().parts_in_flight, 1);
}
