//! Retries, timeouts, the ambiguous-upload path and request accounting, against an
//! `object_store` that fails on a script, under tokio's paused clock.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use async_trait::async_trait;
use bytes::Bytes;
use diskless_common::SystemClock;
use diskless_storage::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, memory::InMemory, path::Path,
};
use diskless_storage::{
    ObjectKey, ObjectStorage, ObjectStoreStorage, RandomKeys, RetryConfig, StorageError,
    StorageOptions,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What the next call of an operation does.
#[derive(Debug, Clone)]
enum Fault {
    /// Fail with this kind of error without touching the data.
    Fail(ErrorKind),
    /// Store the object, then hang (the caller's timeout fires).
    LandThenHang,
    /// Hang without storing.
    Hang,
    /// An upload still in flight in the store when its client gives up: the store holds the key
    /// for it, the call hangs (the caller's timeout fires) and the object lands this long after
    /// the call started, in the background. See [`Scripted::in_flight_upload`].
    LandLate(Duration),
    /// As `LandLate`, but the upload is aborted: the key is released, nothing is stored.
    AbortLate(Duration),
}

#[derive(Debug, Clone, Copy)]
enum ErrorKind {
    ConnectionReset,
    Status(u16),
    PermissionDenied,
    NotImplemented,
}

fn make_error(kind: ErrorKind, path: &Path) -> object_store::Error {
    #[derive(Debug, thiserror::Error)]
    #[error("Server returned non-2xx status code: {0}: <Error/>")]
    struct Status(String);
    match kind {
        ErrorKind::ConnectionReset => object_store::Error::Generic {
            store: "scripted",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        },
        ErrorKind::Status(code) => object_store::Error::Generic {
            store: "scripted",
            source: Box::new(Status(format!("{code} Whatever"))),
        },
        ErrorKind::PermissionDenied => object_store::Error::PermissionDenied {
            path: path.to_string(),
            source: "denied".into(),
        },
        ErrorKind::NotImplemented => object_store::Error::NotImplemented {
            operation: "put_opts with PutMode::Create".into(),
            implementer: "scripted".into(),
        },
    }
}

/// An in-memory store whose puts, gets and deletes follow a script of faults.
#[derive(Debug, Default)]
struct Scripted {
    inner: InMemory,
    puts: Mutex<VecDeque<Fault>>,
    gets: Mutex<VecDeque<Fault>>,
    deletes: Mutex<VecDeque<Fault>>,
    no_create: bool,
    /// The offsets `list_with_offset` was called with.
    list_offsets: Mutex<Vec<String>>,
    /// Keys held by an upload in flight (see [`Scripted::in_flight_upload`]).
    in_flight: Arc<Mutex<HashSet<Path>>>,
}

impl Scripted {
    /// An upload of `location` in flight in the store, as S3 has while it still receives or
    /// commits a conditional PUT whose client timed out: until it ends, after `after`, a
    /// create-only PUT of the key fails with `AlreadyExists` (S3: `409 ConditionalRequestConflict`,
    /// which `object_store` reports as `AlreadyExists`) and a GET finds no object. It ends by
    /// storing `payload` (`land`) or by storing nothing (an aborted upload).
    fn in_flight_upload(&self, location: &Path, payload: PutPayload, after: Duration, land: bool) {
        self.in_flight.lock().insert(location.clone());
        let (inner, in_flight, location) =
            (self.inner.clone(), self.in_flight.clone(), location.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if land {
                inner
                    .put_opts(&location, payload, PutOptions::from(PutMode::Create))
                    .await
                    .expect("the upload in flight lands");
            }
            in_flight.lock().remove(&location);
        });
    }
}

impl std::fmt::Display for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scripted")
    }
}

async fn hang() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

#[async_trait]
impl ObjectStore for Scripted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.no_create && matches!(opts.mode, PutMode::Create) {
            return Err(make_error(ErrorKind::NotImplemented, location));
        }
        if matches!(opts.mode, PutMode::Create) && self.in_flight.lock().contains(location) {
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict: an upload of the key is in flight".into(),
            });
        }
        let fault = self.puts.lock().pop_front();
        match fault {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::LandLate(after)) => {
                self.in_flight_upload(location, payload, after, true);
                hang().await;
                unreachable!("the caller times out")
            }
            Some(Fault::AbortLate(after)) => {
                self.in_flight_upload(location, payload, after, false);
                hang().await;
                unreachable!("the caller times out")
            }
            Some(Fault::Fail(kind)) => Err(make_error(kind, location)),
            Some(Fault::LandThenHang) => {
                self.inner.put_opts(location, payload, opts).await?;
                hang().await;
                unreachable!("the caller times out")
            }
            Some(Fault::Hang) => {
                hang().await;
                unreachable!("the caller times out")
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let fault = self.gets.lock().pop_front();
        match fault {
            None => self.inner.get_opts(location, options).await,
            Some(Fault::Fail(kind)) => Err(make_error(kind, location)),
            Some(_) => {
                hang().await;
                unreachable!()
            }
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let fault = self.deletes.lock().pop_front();
        match fault {
            None => self.inner.delete_stream(locations),
            Some(Fault::Fail(kind)) => locations
                .map(move |l| l.and_then(|p| Err(make_error(kind, &p))))
                .boxed(),
            Some(_) => futures::stream::once(async {
                hang().await;
                unreachable!()
            })
            .boxed(),
        }
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_offsets.lock().push(offset.to_string());
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn retry() -> RetryConfig {
    RetryConfig::default()
        .with_max_attempts(5)
        .with_initial_backoff(Duration::from_millis(100))
        .with_max_backoff(Duration::from_secs(2))
        .with_attempt_timeout(Duration::from_secs(10))
        .with_deadline(Duration::from_secs(60))
        .with_seed(42)
}

fn storage(store: Arc<Scripted>, config: RetryConfig) -> ObjectStoreStorage {
    ObjectStoreStorage::from_object_store(store, "")
        .unwrap()
        .with_retry(config)
        .unwrap()
}

fn payload() -> Vec<Bytes> {
    vec![
        Bytes::from_static(b"segment-"),
        Bytes::from_static(b"bytes"),
    ]
}

fn key() -> ObjectKey {
    ObjectKey::generate("wal", &RandomKeys::new(), &SystemClock).unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_upload_is_one_put() {
    let store = Arc::new(Scripted::default());
    let s = storage(store, retry());
    s.upload(&key(), &payload()).await.unwrap();
    let stats = s.counters().snapshot();
    assert_eq!(stats.put_requests, 1);
    assert_eq!(stats.put_bytes, 13);
    assert_eq!(stats.get_requests, 0);
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_with_backoff() {
    let store = Arc::new(Scripted::default());
    store.puts.lock().extend([
        Fault::Fail(ErrorKind::ConnectionReset),
        Fault::Fail(ErrorKind::Status(503)),
        Fault::Fail(ErrorKind::Status(429)),
    ]);
    let s = storage(store.clone(), retry());
    let k = key();
    let start = Instant::now();
    s.upload(&k, &payload()).await.unwrap();
    let waited = start.elapsed();
    assert_eq!(s.counters().snapshot().put_requests, 4);
    // Three backoffs with equal jitter: [50, 100] + [100, 200] + [200, 400] ms.
    assert!(
        waited >= Duration::from_millis(350) && waited <= Duration::from_millis(700),
        "{waited:?}"
    );
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "segment-bytes");
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_are_not_retried() {
    for kind in [
        ErrorKind::PermissionDenied,
        ErrorKind::Status(400),
        ErrorKind::Status(403),
    ] {
        let store = Arc::new(Scripted::default());
        store.puts.lock().push_back(Fault::Fail(kind));
        let s = storage(store, retry());
        let err = s.upload(&key(), &payload()).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Permanent { .. }),
            "{kind:?}: {err:?}"
        );
        assert_eq!(s.counters().snapshot().put_requests, 1, "{kind:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_max_attempts() {
    let store = Arc::new(Scripted::default());
    store.puts.lock().extend(std::iter::repeat_n(
        Fault::Fail(ErrorKind::Status(500)),
        100,
    ));
    let s = storage(store, retry());
    let err = s.upload(&key(), &payload()).await.unwrap_err();
    assert!(err.is_transient());
    assert_eq!(s.counters().snapshot().put_requests, 5);
}

/// Uploads with attempts of 4 s, up to 100 of them, within a 10 s deadline, and checks that the
/// upload fails (transiently) by that deadline; returns the storage for its counters.
async fn upload_fails_within_a_10_s_deadline(store: Arc<Scripted>) -> ObjectStoreStorage {
    let config = retry()
        .with_max_attempts(100)
        .with_attempt_timeout(Duration::from_secs(4))
        .with_deadline(Duration::from_secs(10));
    let s = storage(store, config);
    let start = Instant::now();
    let err = s.upload(&key(), &payload()).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        start.elapsed() <= Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    s
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_deadline() {
    let store = Arc::new(Scripted::default());
    store
        .puts
        .lock()
        .extend(std::iter::repeat_n(Fault::Hang, 100));
    let s = upload_fails_within_a_10_s_deadline(store).await;
    let puts = s.counters().snapshot().put_requests;
    assert!(
        (2..=3).contains(&puts),
        "{puts} attempts in a 10 s deadline of 4 s attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn timed_out_upload_that_landed_is_verified_and_succeeds() {
    let store = Arc::new(Scripted::default());
    store.puts.lock().push_back(Fault::LandThenHang);
    let s = storage(store, retry());
    let k = key();
    s.upload(&k, &payload()).await.unwrap();
    let stats = s.counters().snapshot();
    // The first PUT timed out (ambiguous), the second found the object, one GET compared it.
    assert_eq!(stats.put_requests, 2);
    assert_eq!(stats.get_requests, 1);
    assert_eq!(stats.get_bytes, 13);
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "segment-bytes");
}

#[tokio::test(start_paused = true)]
async fn timed_out_upload_over_other_content_is_already_exists() {
    let store = Arc::new(Scripted::default());
    let k = key();
    // Another writer's object with the same length but other bytes.
    store
        .inner
        .put_opts(
            &Path::parse(k.as_str()).unwrap(),
            PutPayload::from_static(b"SEGMENT-BYTES"),
            PutOptions::default(),
        )
        .await
        .unwrap();
    store.puts.lock().push_back(Fault::Hang);
    let s = storage(store, retry());
    let err = s.upload(&k, &payload()).await.unwrap_err();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "SEGMENT-BYTES");
}

#[tokio::test(start_paused = true)]
async fn verification_get_is_retried_too() {
    let store = Arc::new(Scripted::default());
    store.puts.lock().push_back(Fault::LandThenHang);
    store
        .gets
        .lock()
        .push_back(Fault::Fail(ErrorKind::Status(502)));
    let s = storage(store, retry());
    s.upload(&key(), &payload()).await.unwrap();
    let stats = s.counters().snapshot();
    assert_eq!((stats.put_requests, stats.get_requests), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn fetch_retries_transient_but_not_missing() {
    let store = Arc::new(Scripted::default());
    let s = storage(store.clone(), retry());
    let k = key();
    s.upload(&k, &payload()).await.unwrap();
    store
        .gets
        .lock()
        .extend([Fault::Fail(ErrorKind::ConnectionReset), Fault::Hang]);
    assert_eq!(s.fetch(&k, 8..13).await.unwrap(), "bytes");
    assert_eq!(s.counters().snapshot().get_requests, 3);
    s.counters().reset();
    let err = s.fetch(&key(), 0..1).await.unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(s.counters().snapshot().get_requests, 1);
}

#[tokio::test(start_paused = true)]
async fn delete_retries_transient_failures_and_confirms_all() {
    let store = Arc::new(Scripted::default());
    let s = storage(store.clone(), retry());
    let keys: Vec<ObjectKey> = (0..3).map(|_| key()).collect();
    for k in &keys[..2] {
        s.upload(k, &payload()).await.unwrap();
    }
    store
        .deletes
        .lock()
        .push_back(Fault::Fail(ErrorKind::Status(503)));
    let mut confirmed = s.delete(&keys).await.unwrap();
    confirmed.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(confirmed, expected);
    let stats = s.counters().snapshot();
    assert_eq!((stats.delete_requests, stats.deleted_keys), (2, 6));
}

#[tokio::test(start_paused = true)]
async fn delete_permanent_failure_is_an_error() {
    let store = Arc::new(Scripted::default());
    store
        .deletes
        .lock()
        .push_back(Fault::Fail(ErrorKind::PermissionDenied));
    let s = storage(store, retry());
    let err = s.delete(&[key()]).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err:?}");
    assert_eq!(s.counters().snapshot().delete_requests, 1);
}

#[tokio::test(start_paused = true)]
async fn backend_without_create_only_fails_clearly_unless_overwrite_allowed() {
    let store = Arc::new(Scripted {
        no_create: true,
        ..Scripted::default()
    });
    let s = storage(store.clone(), retry());
    let err = s.upload(&key(), &payload()).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err:?}");
    assert!(err.to_string().contains("create-only") || format!("{err:?}").contains("create-only"));

    let s = ObjectStoreStorage::from_object_store(store, "")
        .unwrap()
        .with_options(
            StorageOptions::default()
                .with_retry(retry())
                .with_allow_overwrite_fallback(true),
        )
        .unwrap();
    let k = key();
    s.upload(&k, &payload()).await.unwrap();
    assert_eq!(s.fetch(&k, 0..7).await.unwrap(), "segment");
    // The refused create-only PUT and the overwriting one; later uploads overwrite directly.
    assert_eq!(s.counters().snapshot().put_requests, 2);
    s.upload(&key(), &payload()).await.unwrap();
    assert_eq!(s.counters().snapshot().put_requests, 3);
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_backoff_schedule() {
    async fn run(seed: u64) -> Duration {
        let store = Arc::new(Scripted::default());
        store
            .puts
            .lock()
            .extend(std::iter::repeat_n(Fault::Fail(ErrorKind::Status(500)), 4));
        let s = storage(store, retry().with_seed(seed));
        let start = Instant::now();
        s.upload(&key(), &payload()).await.unwrap();
        start.elapsed()
    }
    assert_eq!(run(1).await, run(1).await);
    assert_ne!(run(1).await, run(2).await);
}

#[test]
fn invalid_retry_config_is_rejected() {
    let err = ObjectStoreStorage::in_memory()
        .with_retry(RetryConfig::default().with_max_attempts(0))
        .unwrap_err();
    assert!(matches!(err, StorageError::Config(_)));
    assert!(err.to_string().contains("retry.max_attempts"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn list_with_offset_passes_the_offset_to_the_store() {
    let store = Arc::new(Scripted::default());
    let s = ObjectStoreStorage::from_object_store(store.clone(), "root")
        .unwrap()
        .with_retry(retry())
        .unwrap();
    for name in ["wal/a", "wal/b", "wal/c"] {
        s.upload(&ObjectKey::parse(name).unwrap(), &payload())
            .await
            .unwrap();
    }
    let listed: Vec<String> = s
        .list_with_offset("wal", "wal/a")
        .map(|m| m.unwrap().key.into_string())
        .collect()
        .await;
    assert_eq!(listed, ["wal/b", "wal/c"]);
    // The store started the listing after the offset (S3's start-after), under the root.
    assert_eq!(*store.list_offsets.lock(), ["root/wal/a"]);
    // An offset that is not a path as written is applied here only, never trimmed into another.
    let listed: Vec<String> = s
        .list_with_offset("wal", "wal/a/")
        .map(|m| m.unwrap().key.into_string())
        .collect()
        .await;
    assert_eq!(listed, ["wal/b", "wal/c"]);
    assert_eq!(store.list_offsets.lock().len(), 1);
    let stats = s.counters().snapshot();
    assert_eq!(stats.list_requests, 2);
}

/// Issue #12 item 8: settings for the races of a retried create-only upload with the attempt it
/// retries. Attempts of 1 s, so that the first one times out long before it lands.
fn race_retry() -> RetryConfig {
    RetryConfig::default()
        .with_max_attempts(20)
        .with_initial_backoff(Duration::from_millis(100))
        .with_max_backoff(Duration::from_secs(1))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_deadline(Duration::from_secs(30))
        .with_seed(42)
}

/// Issue #12 item 8: the first PUT times out but is still landing; the retry's create-only PUT
/// is refused ("already exists") while the verification GET finds nothing yet. That NotFound
/// must send the upload back to its PUT (within the same deadline), not fail the produce.
#[tokio::test(start_paused = true)]
async fn retry_racing_a_first_attempt_still_landing_succeeds() {
    let store = Arc::new(Scripted::default());
    store
        .puts
        .lock()
        .push_back(Fault::LandLate(Duration::from_secs(3)));
    let s = storage(store, race_retry());
    let k = key();
    let start = Instant::now();
    s.upload(&k, &payload()).await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited <= Duration::from_secs(5),
        "the upload ends once the first attempt landed, not before nor much later: {waited:?}"
    );
    let stats = s.counters().snapshot();
    // The hung PUT, refused PUTs each followed by a GET finding nothing, and the last refused
    // PUT whose GET found the same content: one GET per refused PUT.
    assert!(stats.put_requests >= 3, "{stats:?}");
    assert_eq!(stats.get_requests, stats.put_requests - 1, "{stats:?}");
    assert_eq!(stats.get_bytes, 13, "one GET found the object and read it");
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "segment-bytes");
}

/// As above, but the first attempt is aborted instead of landing: once the key is free, the
/// retried create-only PUT stores the object.
#[tokio::test(start_paused = true)]
async fn retry_racing_a_first_attempt_that_is_aborted_uploads_again() {
    let store = Arc::new(Scripted::default());
    store
        .puts
        .lock()
        .push_back(Fault::AbortLate(Duration::from_secs(3)));
    let s = storage(store.clone(), race_retry());
    let k = key();
    s.upload(&k, &payload()).await.unwrap();
    let stats = s.counters().snapshot();
    // Every refused PUT had its GET (NotFound); the last PUT stored the object.
    assert!(stats.put_requests >= 3, "{stats:?}");
    assert_eq!(stats.get_requests, stats.put_requests - 2, "{stats:?}");
    assert_eq!(stats.get_bytes, 0, "no GET found an object");
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "segment-bytes");
}

/// Another writer's upload of other content is in flight under the key: while it is not
/// visible the upload retries; once it is, the content differs and the upload fails with
/// AlreadyExists at once, not after retrying until the deadline.
#[tokio::test(start_paused = true)]
async fn racing_upload_of_other_content_ends_in_already_exists() {
    let store = Arc::new(Scripted::default());
    let k = key();
    let path = Path::parse(k.as_str()).unwrap();
    store.in_flight_upload(
        &path,
        PutPayload::from_static(b"SEGMENT-BYTES"),
        Duration::from_secs(3),
        true,
    );
    let s = storage(store, race_retry());
    let start = Instant::now();
    let err = s.upload(&k, &payload()).await.unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
    // Within one backoff (max 1 s) of the other object becoming visible.
    assert!(
        waited >= Duration::from_secs(3)
            && waited <= Duration::from_secs(4) + Duration::from_millis(100),
        "{waited:?}"
    );
    let stats = s.counters().snapshot();
    assert_eq!(stats.get_requests, stats.put_requests, "{stats:?}");
    assert_eq!(s.fetch(&k, 0..13).await.unwrap(), "SEGMENT-BYTES");
}

/// A key that stays refused and invisible fails the upload only when the budget is spent, with
/// a transient error, and within the deadline.
#[tokio::test(start_paused = true)]
async fn key_refused_and_invisible_until_the_deadline_is_transient() {
    let store = Arc::new(Scripted::default());
    let k = key();
    store.in_flight_upload(
        &Path::parse(k.as_str()).unwrap(),
        PutPayload::from_static(b"never"),
        Duration::from_secs(3600),
        false,
    );
    let config = race_retry()
        .with_max_attempts(1000)
        .with_deadline(Duration::from_secs(10));
    let s = storage(store, config);
    let start = Instant::now();
    let err = s.upload(&k, &payload()).await.unwrap_err();
    let waited = start.elapsed();
    assert!(err.is_transient(), "{err:?}");
    // It kept trying while a retry could still start (backoff at most 1 s).
    assert!(
        waited >= Duration::from_secs(9) && waited <= Duration::from_secs(10),
        "{waited:?}"
    );
}

/// The verification of an object found already there runs within the upload's deadline, not a
/// fresh one.
#[tokio::test(start_paused = true)]
async fn verification_runs_within_the_uploads_deadline() {
    let store = Arc::new(Scripted::default());
    store.puts.lock().push_back(Fault::LandThenHang);
    store
        .gets
        .lock()
        .extend(std::iter::repeat_n(Fault::Hang, 100));
    let s = upload_fails_within_a_10_s_deadline(store).await;
    assert_eq!(s.counters().snapshot().put_requests, 2);
}
