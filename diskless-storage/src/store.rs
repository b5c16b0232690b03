//! [`ObjectStoreStorage`]: [`ObjectStorage`] over any [`object_store::ObjectStore`].
//!
//! Uploads of whole payloads are create-only PUTs; streamed uploads
//! ([`ObjectStorage::upload_stream`]) larger than a part are `object_store` multipart uploads
//! (see [`ObjectStoreStorage`] for what each guarantees).

use crate::classify::{map_error, timeout_error};
use crate::retry::Backoff;
use crate::stats::ListingCounter;
use crate::uploads::UploadLister;
use crate::{
    ObjectKey, ObjectMeta, ObjectStorage, RequestCounters, RetryConfig, StorageError,
    validate_prefix,
};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::Either;
use futures::stream::{BoxStream, FuturesUnordered};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    GetOptions, MultipartId, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use tracing::Instrument;

/// Keys per DELETE request (S3's `DeleteObjects` limit).
pub(crate) const DELETE_BATCH: usize = 1000;

/// Settings of an [`ObjectStoreStorage`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StorageOptions {
    /// Retries, timeouts and deadline of every call (see [`RetryConfig`] for the defaults).
    pub retry: RetryConfig,
    /// What to do on a backend that cannot upload create-only (`PutMode::Create` not implemented,
    /// e.g. S3-compatible stores with conditional put disabled). `false` (the default): uploads fail
    /// with [`StorageError::Permanent`]. `true`: fall back to plain overwriting PUTs. Then a retry
    /// after an ambiguous upload still succeeds, but an upload over an existing object with other
    /// content silently replaces it instead of failing with [`StorageError::AlreadyExists`];
    /// diskless topics never reuse a key (keys embed a fresh UUID v7), so this is only safe when no
    /// other writer shares the key space.
    pub allow_overwrite_fallback: bool,
    /// Parts of a streamed upload ([`ObjectStorage::upload_stream`]) sent at once (at least 1;
    /// default 1). The chunks of the next part are read while they are sent, so an upload holds
    /// up to `(parts_in_flight + 1) × part size` bytes, plus one chunk. A part that is retried
    /// (see [`ObjectStoreStorage::with_multipart_store`]) stays in flight, its bytes held, until
    /// it is stored or fails for good.
    pub parts_in_flight: usize,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            retry: RetryConfig::default(),
            allow_overwrite_fallback: false,
            parts_in_flight: 1,
        }
    }
}

impl StorageOptions {
    /// Sets [`StorageOptions::retry`].
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// Sets [`StorageOptions::allow_overwrite_fallback`].
    pub fn with_allow_overwrite_fallback(mut self, allow: bool) -> Self {
        self.allow_overwrite_fallback = allow;
        self
    }

    /// Sets [`StorageOptions::parts_in_flight`].
    pub fn with_parts_in_flight(mut self, parts: usize) -> Self {
        self.parts_in_flight = parts;
        self
    }

    /// Checks the options ([`RetryConfig::validate`], `parts_in_flight` at least 1);
    /// [`ObjectStoreStorage::with_options`] calls it. Invalid values are rejected with
    /// [`StorageError::Config`], never clamped.
    pub fn validate(&self) -> Result<(), StorageError> {
        if self.parts_in_flight == 0 {
            return Err(StorageError::Config(
                "parts_in_flight: must be at least 1".to_string(),
            ));
        }
        self.retry.validate()
    }
}

/// [`ObjectStorage`] over an [`object_store::ObjectStore`]: in memory, local filesystem, S3, GCS
/// or Azure (cargo features `s3`, `gcs`, `azure`), with retries, timeouts and request accounting.
///
/// - `upload` is one create-only PUT (`PutMode::Create`: `If-None-Match: *` on S3, a hard link
///   on the local filesystem). When the object already exists (a retry after an attempt whose
///   outcome was unknown, e.g. a timeout after the bytes were sent), it GETs the object and
///   succeeds if the content is the same, else fails with [`StorageError::AlreadyExists`] at
///   once. If that GET finds no object, the key was refused for an upload not visible (yet):
///   S3 answers `409 ConditionalRequestConflict` while another conditional PUT of the key is in
///   flight, such as this upload's own timed-out attempt, which may still land or be aborted.
///   The upload then PUTs again after a backoff, and so on: the PUTs, the GETs (a transient GET
///   failure retries the GET alone) and their backoffs share one [`RetryConfig`] budget
///   (`max_attempts`, `deadline`), each request cut at `attempt_timeout`.
/// - `fetch` is one ranged GET; a range past the end is [`StorageError::InvalidRange`], never a
///   short read.
/// - `delete` sends batches of up to 1000 keys (`DeleteObjects` on S3), treats a missing object
///   as deleted and returns the keys confirmed.
/// - `list` lists by prefix, matching whole `/`-separated segments (`a/b` lists `a/b/c`, not
///   `a/bc`); keys that fail [`ObjectKey::parse`] are skipped with a warning. Listing is not
///   retried: on error the stream yields it and the caller lists again. `list_with_offset` uses
///   the store's native `list_with_offset` (S3 `start-after`: the keys at or below the offset are
///   not listed at all; in memory and on the local filesystem they are skipped client-side).
///
/// - `upload_stream` reads the stream until it holds more than one part
///   ([`clamp_part_size`](crate::clamp_part_size) of the part size asked): an object of at most
///   one part (an empty one included) is one `upload` as above, create-only, retried and
///   verified. A larger one is a multipart upload: created (retried as a PUT), then parts of
///   exactly the part size (the last one shorter) sent as the chunks arrive, at most
///   [`StorageOptions::parts_in_flight`] at once, then completed (one request, cut at
///   `attempt_timeout`). With the store's [`MultipartStore`] API (set by `in_memory` and
///   `from_url` for memory, S3, GCS and Azure; given with
///   [`ObjectStoreStorage::with_multipart_store`] otherwise), each part is retried with the
///   storage's [`RetryConfig`] as every call is: after a transient failure or a timeout the same
///   bytes are resent under the same part number (replacing what the failed attempt may have
///   stored), each attempt one request counted in [`ObjectStoreStorage::counters`] and cut at
///   `attempt_timeout`, under a deadline counted from the part's first attempt. Without it (the
///   local filesystem; a store given to `from_object_store` alone) parts go through
///   `object_store`'s `MultipartUpload`, which cannot resend a part under the same number: each
///   part is one request cut at `attempt_timeout`, not retried. The call as a whole has no
///   deadline (the stream's producer sets its pace). On any error — the stream's, a part's
///   (after its retries), the completion's, more than [`MAX_PARTS`](crate::MAX_PARTS) parts —
///   the upload is aborted (one DELETE request, a failure of which is logged) and the error
///   returned; nothing is visible under the key. If the completion fails with a transient error
///   (e.g. its timeout) and a HEAD then finds an object of exactly the size sent under the key,
///   the store did complete it (keys are fresh per attempt) and the call succeeds. A create
///   request that fails with a transient error or a timeout may have created an upload whose
///   id never came back (the retry creates another): once the upload has ended, the key's
///   uploads still in progress are listed and aborted, with the [`UploadLister`] that `from_url`
///   gives S3 stores (see [`ObjectStoreStorage::with_upload_lister`]); without one (GCS, a
///   store given to `from_object_store`), a warning names the key. A call dropped mid-way does
///   not abort: on S3 and GCS the parts stay, invisible, until the bucket's lifecycle rule for
///   incomplete multipart uploads removes them (configure one, e.g.
///   `AbortIncompleteMultipartUpload` after a day); on the local filesystem the staging file is
///   removed on drop.
///
///   **Not create-only**: `object_store` completes multipart uploads unconditionally, so a
///   multipart upload replaces an object already under the key, on every backend (S3, GCS,
///   Azure: the completion overwrites; in memory: an insert; local filesystem: a rename over
///   it). Callers use a fresh key per attempt. On the local filesystem the parts are written to
///   a staging file next to the object (`<key>#<n>`, never listed), fsynced on completion, then
///   renamed to the key and the directory fsynced: a completed upload is as durable as `upload`'s;
///   an aborted or failed one removes the staging file (a crash may leave it, unlisted).
///
/// Create-only on S3 relies on the store honouring `If-None-Match: *` (`object_store`'s default
/// `S3ConditionalPut::ETagMatch`): AWS S3 does, atomically, since August 2024; GCS and Azure use
/// their own preconditions. An S3-compatible store that ignores the header would overwrite
/// silently — run the testkit's conformance suite (its `create_only` case) against yours.
///
/// Calls must run within a tokio runtime with time enabled (timeouts and backoff use
/// `tokio::time`, and work with a paused test clock).
///
/// Every attempt counts in [`ObjectStoreStorage::counters`]; `object_store`'s own HTTP retries are
/// turned off in the stores this type builds so that retries happen (and are counted) here once.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
/// use bytes::Bytes;
///
/// let storage = ObjectStoreStorage::from_url("memory:///diskless", std::iter::empty::<(&str, &str)>()).unwrap();
/// let key = ObjectKey::parse("wal/segment-1").unwrap();
/// storage.upload(&key, &[Bytes::from_static(b"hello "), Bytes::from_static(b"world")]).await.unwrap();
/// assert_eq!(storage.fetch(&key, 6..11).await.unwrap(), "world");
/// assert!(storage.fetch(&key, 6..12).await.is_err()); // past the end
/// // A retried upload with the same content succeeds, with other content it fails.
/// storage.upload(&key, &[Bytes::from_static(b"hello world")]).await.unwrap();
/// assert!(storage.upload(&key, &[Bytes::from_static(b"other")]).await.is_err());
/// assert_eq!(storage.delete(&[key.clone()]).await.unwrap(), vec![key]);
/// assert_eq!(storage.counters().snapshot().put_requests, 3);
/// # });
/// ```
pub struct ObjectStoreStorage {
    store: Arc<dyn ObjectStore>,
    /// The same store's multipart API with explicit part numbers, through which a part can be
    /// resent (see [`ObjectStoreStorage::with_multipart_store`]).
    multipart: Option<Arc<dyn MultipartStore>>,
    /// Lists a key's multipart uploads in progress, to abort those whose create answer was lost
    /// (see [`ObjectStoreStorage::with_upload_lister`]).
    lister: Option<Arc<dyn UploadLister>>,
    root: String,
    options: StorageOptions,
    counters: RequestCounters,
    rng: parking_lot::Mutex<fastrand::Rng>,
    create_unsupported: AtomicBool,
}

impl std::fmt::Debug for ObjectStoreStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `MultipartStore` is not `Debug`: only whether there is one is shown.
        f.debug_struct("ObjectStoreStorage")
            .field("store", &self.store)
            .field("multipart_store", &self.multipart.is_some())
            .field("upload_lister", &self.lister)
            .field("root", &self.root)
            .field("options", &self.options)
            .field("counters", &self.counters)
            .field("rng", &self.rng)
            .field("create_unsupported", &self.create_unsupported)
            .finish()
    }
}

impl ObjectStoreStorage {
    /// Storage over an existing store, with keys under `prefix` (`""` for the store's root; else
    /// a prefix valid per [`validate_prefix`]).
    ///
    /// Configure the store's own retries consciously: `object_store`'s HTTP stores retry 5xx and
    /// connection errors by themselves by default (up to 10 times over 3 minutes), which then
    /// multiplies with this type's retries and hides requests from the counters. Prefer
    /// `.with_retry(object_store::RetryConfig { max_retries: 0, ..Default::default() })` on the
    /// builder.
    ///
    /// The storage cannot know whether `store` also offers `object_store`'s
    /// [`MultipartStore`] API (S3, GCS and Azure do): give it with
    /// [`ObjectStoreStorage::with_multipart_store`] so that the parts of streamed uploads are
    /// retried, and for S3 an `S3UploadLister` (feature `s3`) with
    /// [`ObjectStoreStorage::with_upload_lister`] so that an upload whose create answer was lost
    /// is aborted.
    pub fn from_object_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
    ) -> Result<Self, StorageError> {
        if !prefix.is_empty() {
            validate_prefix(prefix)?;
        }
        Ok(Self::with_root(store, prefix.to_string()))
    }

    /// Storage in memory (lost when dropped), for tests and examples. Its streamed uploads go
    /// through `InMemory`'s [`MultipartStore`] API (parts retried, as on S3).
    pub fn in_memory() -> Self {
        let store = Arc::new(object_store::memory::InMemory::new());
        Self::with_root(store.clone(), String::new()).with_multipart_store(store)
    }

    /// Storage over `store` with keys under the (validated) `root`, with default options.
    fn with_root(store: Arc<dyn ObjectStore>, root: String) -> Self {
        let options = StorageOptions::default();
        ObjectStoreStorage {
            store,
            multipart: None,
            lister: None,
            root,
            rng: jitter_rng(&options.retry),
            options,
            counters: RequestCounters::new(),
            create_unsupported: AtomicBool::new(false),
        }
    }

    /// A host's object storage option: the store at `url` ([`ObjectStoreStorage::from_url`],
    /// no extra options: the backends' environment variables and the URL's query), or, without a
    /// URL, the local filesystem under `<data_dir>/objects` (the embedded default of the example
    /// hosts). The error names the URL.
    #[cfg(feature = "fs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fs")))]
    pub fn from_url_or_data_dir(
        url: Option<&str>,
        data_dir: impl AsRef<std::path::Path>,
    ) -> Result<Self, StorageError> {
        match url {
            None => ObjectStoreStorage::local_fs(data_dir.as_ref().join("objects")),
            Some(url) => ObjectStoreStorage::from_url(url, std::iter::empty::<(&str, &str)>())
                .map_err(|e| StorageError::Config(format!("{url}: {e}"))),
        }
    }

    /// Storage in a directory of the local filesystem (created if missing), one file per object.
    ///
    /// Durability: `object_store`'s `LocalFileSystem` is built with `with_fsync(true)`, so an
    /// upload writes a staging file, `fsync`s it, hard-links it to its final name (create-only)
    /// and `fsync`s the parent directory (and any directory it created) before returning: an
    /// acknowledged upload survives a crash or power loss (on Unix; elsewhere directory fsync is a
    /// no-op). Deletes are not fsynced: after a crash a deleted object may reappear, and a later
    /// idempotent delete removes it again.
    #[cfg(feature = "fs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fs")))]
    pub fn local_fs(path: impl AsRef<std::path::Path>) -> Result<Self, StorageError> {
        let path = path.as_ref();
        std::fs::create_dir_all(path).map_err(|e| {
            StorageError::Config(format!("cannot create directory {}: {e}", path.display()))
        })?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(path)
            .map_err(|e| StorageError::Config(format!("local filesystem {}: {e}", path.display())))?
            .with_fsync(true);
        Self::from_object_store(Arc::new(fs), "")
    }

    /// Replaces the options (retries, overwrite fallback), after [`StorageOptions::validate`].
    /// The retry jitter is drawn from a generator seeded with [`RetryConfig::seed`], or from
    /// [`diskless_common::entropy_seed`] when it is `None`.
    pub fn with_options(mut self, options: StorageOptions) -> Result<Self, StorageError> {
        options.validate()?;
        self.rng = jitter_rng(&options.retry);
        self.options = options;
        Ok(self)
    }

    /// Replaces the retry settings.
    pub fn with_retry(self, retry: RetryConfig) -> Result<Self, StorageError> {
        let options = self.options.clone().with_retry(retry);
        self.with_options(options)
    }

    /// Sends the multipart uploads of [`ObjectStorage::upload_stream`] through `multipart`, which
    /// must be the **same store** as the [`ObjectStore`] this storage was built over (the same
    /// bucket, with the same root: object paths are given to both as they are), e.g. the same
    /// `Arc<AmazonS3>` coerced to both traits. `object_store`'s [`MultipartStore`] API numbers
    /// parts explicitly, so a part that fails transiently (or times out) is resent under its
    /// number with the storage's [`RetryConfig`], instead of aborting the whole upload.
    ///
    /// [`ObjectStoreStorage::from_url`] and [`ObjectStoreStorage::in_memory`] set it for memory,
    /// S3, GCS and Azure stores; use this method when building your own client for
    /// [`ObjectStoreStorage::from_object_store`], which cannot know. `LocalFileSystem` has no
    /// such API: without one, parts go through [`ObjectStore::put_multipart_opts`] and are not
    /// retried.
    ///
    /// ```
    /// use diskless_storage::ObjectStoreStorage;
    /// use diskless_storage::object_store::memory::InMemory;
    /// use std::sync::Arc;
    ///
    /// let store = Arc::new(InMemory::new());
    /// let storage = ObjectStoreStorage::from_object_store(store.clone(), "wal-root")
    ///     .unwrap()
    ///     .with_multipart_store(store);
    /// assert!(storage.multipart_store().is_some());
    /// ```
    pub fn with_multipart_store(mut self, multipart: Arc<dyn MultipartStore>) -> Self {
        self.multipart = Some(multipart);
        self
    }

    /// The multipart API of the store, if it was given (see
    /// [`ObjectStoreStorage::with_multipart_store`]).
    pub fn multipart_store(&self) -> Option<&Arc<dyn MultipartStore>> {
        self.multipart.as_ref()
    }

    /// Lists the multipart uploads in progress of a key through `lister` (of the **same store**,
    /// as for [`ObjectStoreStorage::with_multipart_store`]), so that an upload whose create
    /// request succeeded on the store but whose answer was lost is aborted instead of being left
    /// to the bucket's lifecycle rule. `from_url` gives S3 stores an
    /// `S3UploadLister` (feature `s3`).
    ///
    /// When a streamed upload's create request fails with a transient error or a timeout (the
    /// store may have created an upload whose id never came back), then once the upload has
    /// ended — completed, failed and aborted, or failed to be created at all — the storage lists
    /// the key's uploads in progress (one LIST request, retried as every call) and aborts each
    /// (one DELETE request each, a failure logged) through the [`MultipartStore`] API, which is
    /// therefore needed too. Keys are fresh per upload, so every upload of the key still in
    /// progress then is one of this call's. Without a lister (or a multipart store), or when the
    /// listing fails, a warning names the key: an upload created by the lost request stays, as
    /// after a dropped call, until the lifecycle rule removes it. A create request still in
    /// flight on the store's side after its timeout and landing after the listing is not seen.
    pub fn with_upload_lister(mut self, lister: Arc<dyn UploadLister>) -> Self {
        self.lister = Some(lister);
        self
    }

    /// The lister of multipart uploads in progress, if it was given (see
    /// [`ObjectStoreStorage::with_upload_lister`]).
    pub fn upload_lister(&self) -> Option<&Arc<dyn UploadLister>> {
        self.lister.as_ref()
    }

    /// Counts into `counters` (e.g. shared by several storages) instead of its own.
    pub fn with_counters(mut self, counters: RequestCounters) -> Self {
        self.counters = counters;
        self
    }

    /// The request counters: one PUT/GET/DELETE/LIST per attempt sent to the store.
    pub fn counters(&self) -> &RequestCounters {
        &self.counters
    }

    /// The options.
    pub fn options(&self) -> &StorageOptions {
        &self.options
    }

    /// The prefix under which keys are stored in the store (`""` for the root).
    pub fn prefix(&self) -> &str {
        &self.root
    }

    /// The underlying store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    fn path(&self, key: &str) -> Result<Path, StorageError> {
        let full = if self.root.is_empty() {
            key.to_string()
        } else if key.is_empty() {
            self.root.clone()
        } else {
            format!("{}/{key}", self.root)
        };
        Path::parse(&full).map_err(|_| StorageError::InvalidKey {
            key: key.chars().take(200).collect(),
            reason: "rejected by the object store's path rules",
        })
    }

    /// [`ObjectStorage::list`] (`offset` `None`) and [`ObjectStorage::list_with_offset`]: one
    /// listing of `prefix`, natively started after `offset` when the store can take it as a path
    /// (S3's `start-after`), and filtered here by key in any case, so that the result does not
    /// depend on how a backend compares or encodes paths. Not retried, errors classified as
    /// every other call's.
    fn list_after<'a>(
        &'a self,
        prefix: &'a str,
        offset: Option<&'a str>,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        if !prefix.is_empty()
            && let Err(e) = validate_prefix(prefix)
        {
            return futures::stream::once(async { Err(e) }).boxed();
        }
        let full = if prefix.is_empty() && self.root.is_empty() {
            None
        } else {
            match self.path(prefix) {
                Ok(path) => Some(path),
                Err(e) => return futures::stream::once(async { Err(e) }).boxed(),
            }
        };
        let root = if self.root.is_empty() {
            String::new()
        } else {
            format!("{}/", self.root)
        };
        let mut listing = ListingCounter::start(self.counters.clone());
        tracing::debug!(prefix, offset, "list");
        // Prepending the same root to every key keeps their order, so `root/offset` is the native
        // offset, when it is a path exactly as written: `Path::parse` trims a leading or trailing
        // `/` (which could move the offset past keys that must be listed) and rejects e.g. `a//b`.
        // Such offsets are only applied by the filter below.
        let native_offset = offset.and_then(|offset| {
            let wanted = if self.root.is_empty() {
                offset.to_string()
            } else {
                format!("{}/{offset}", self.root)
            };
            Path::parse(&wanted)
                .ok()
                .filter(|path| path.as_ref() == wanted)
        });
        let stream = match &native_offset {
            Some(native) => self.store.list_with_offset(full.as_ref(), native),
            None => self.store.list(full.as_ref()),
        };
        stream
            .filter_map(move |item| {
                let out = match item {
                    Ok(meta) => {
                        listing.object();
                        let location = meta.location.as_ref();
                        match location.strip_prefix(root.as_str()).map(ObjectKey::parse) {
                            Some(Ok(key)) if offset.is_some_and(|o| key.as_str() <= o) => None,
                            Some(Ok(key)) => Some(Ok(ObjectMeta {
                                key,
                                size: meta.size,
                                last_modified: system_time(&meta),
                            })),
                            _ => {
                                tracing::warn!(
                                    location,
                                    "skipping listed object with an invalid key"
                                );
                                None
                            }
                        }
                    }
                    Err(e) => Some(Err(map_error(e, prefix))),
                };
                futures::future::ready(out)
            })
            .boxed()
    }

    /// Runs `request` cut at the attempt timeout and at `deadline`, whichever comes first; a
    /// request cut is a transient error.
    async fn timed<T>(
        &self,
        operation: &'static str,
        deadline: Instant,
        request: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let budget = self
            .options
            .retry
            .attempt_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(budget, request).await {
            Ok(result) => result,
            Err(_) => Err(timeout_error(operation, budget)),
        }
    }

    /// The retry loop: calls `attempt` with the call's deadline until it succeeds, fails for
    /// good (a non-transient error), `max_attempts` attempts were made, or the next backoff would
    /// end past the deadline. `attempt` applies timeouts itself (see [`Self::timed`]), so that an
    /// attempt made of several requests gives each its own attempt timeout.
    async fn retry_loop<T, F, Fut>(
        &self,
        operation: &'static str,
        key: &str,
        mut attempt: F,
    ) -> Result<T, StorageError>
    where
        F: FnMut(Instant) -> Fut,
        Fut: Future<Output = Result<T, StorageError>>,
    {
        let config = &self.options.retry;
        let deadline = Instant::now() + config.deadline;
        let mut backoff = Backoff::new(config);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = attempt(deadline).await;
            let error = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if !error.is_transient() || attempts >= config.max_attempts {
                return Err(error);
            }
            let delay = backoff.next_delay(&mut self.rng.lock());
            if Instant::now() + delay >= deadline {
                tracing::warn!(operation, key, attempts, %error, "deadline reached, giving up");
                return Err(error);
            }
            tracing::warn!(operation, key, attempts, ?delay, %error, "transient error, retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// One create-only PUT of an upload (an overwriting one once the store is known not to
    /// support create-only and the fallback is allowed).
    async fn put_once(&self, upload: &Upload<'_>) -> Result<(), StorageError> {
        let Upload { key, .. } = *upload;
        let overwrite = self.create_unsupported.load(Ordering::Relaxed);
        let mode = if overwrite {
            PutMode::Overwrite
        } else {
            PutMode::Create
        };
        match self.put_request(upload, mode).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotImplemented { operation, .. }) if !overwrite => {
                if self.options.allow_overwrite_fallback {
                    tracing::warn!(
                        %key,
                        "store cannot upload create-only ({operation}); falling back to overwrite"
                    );
                    self.create_unsupported.store(true, Ordering::Relaxed);
                    self.put_request(upload, PutMode::Overwrite)
                        .await
                        .map_err(|e| map_error(e, key.as_str()))
                } else {
                    Err(StorageError::Permanent {
                        source: format!(
                            "the object store cannot upload create-only ({operation}); enable \
                             conditional put on the store (S3: aws_conditional_put=etag, the \
                             default) or set StorageOptions::allow_overwrite_fallback"
                        )
                        .into(),
                    })
                }
            }
            Err(e) => Err(map_error(e, key.as_str())),
        }
    }

    /// One PUT request, counted.
    async fn put_request(&self, upload: &Upload<'_>, mode: PutMode) -> object_store::Result<()> {
        self.counters.record_put(upload.len);
        let body: PutPayload = upload.payload.iter().cloned().collect();
        self.store
            .put_opts(&upload.path, body, PutOptions::from(mode))
            .await
            .map(|_| ())
    }

    /// One check of an object that a create-only PUT found already there: `Ok` if it has the
    /// same content (an earlier attempt of this upload landed), [`StorageError::AlreadyExists`]
    /// if it has other content (final), [`StorageError::NotFound`] if there is no object to
    /// check (the caller then PUTs again), other errors as they come (transient ones are
    /// retried).
    async fn verify_once(&self, upload: &Upload<'_>) -> Result<(), StorageError> {
        let Upload {
            ref path,
            key,
            payload,
            len,
        } = *upload;
        let other_content = |size: u64| StorageError::AlreadyExists {
            key: key.to_string(),
            source: Some(
                format!(
                    "the store refused a create-only upload of {len} bytes and holds \
                     {size} bytes of other content"
                )
                .into(),
            ),
        };
        self.counters.record_get();
        let result = self
            .store
            .get_opts(path, GetOptions::default())
            .await
            .map_err(|e| map_error(e, key.as_str()))?;
        let size = result.meta.size;
        if size != len {
            return Err(other_content(size));
        }
        let bytes = result
            .bytes()
            .await
            .map_err(|e| map_error(e, key.as_str()))?;
        self.counters.record_get_bytes(bytes.len() as u64);
        if same_content(&bytes, payload) {
            tracing::info!(%key, "upload found its object already there with the same content");
            Ok(())
        } else {
            Err(other_content(size))
        }
    }

    async fn fetch_once(
        &self,
        path: &Path,
        key: &ObjectKey,
        range: &Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let invalid = |size| StorageError::InvalidRange {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            size,
        };
        self.counters.record_get();
        let options = GetOptions::default().with_range(Some(range.clone()));
        match self.store.get_opts(path, options).await {
            Ok(result) => {
                let size = result.meta.size;
                if range.end > size {
                    return Err(invalid(Some(size)));
                }
                let bytes = result
                    .bytes()
                    .await
                    .map_err(|e| map_error(e, key.as_str()))?;
                self.counters.record_get_bytes(bytes.len() as u64);
                if bytes.len() as u64 != range.end - range.start {
                    return Err(StorageError::Transient {
                        source: format!(
                            "short read of {key}: {} bytes for range {range:?}",
                            bytes.len()
                        )
                        .into(),
                    });
                }
                Ok(bytes)
            }
            Err(e) => {
                let error = map_error(e, key.as_str());
                if error.is_not_found() || error.is_transient() {
                    return Err(error);
                }
                // Backends report a range past the end differently (HTTP 416, an internal error
                // type): ask for the size to tell it apart from other failures.
                self.counters.record_get();
                match self.store.head(path).await {
                    Ok(meta) if range.end > meta.size => Err(invalid(Some(meta.size))),
                    _ => Err(error),
                }
            }
        }
    }

    /// One round of deletes of `pending`; pushes the indices confirmed into `confirmed`.
    async fn delete_round(
        &self,
        pending: &[(ObjectKey, Path)],
        confirmed: &mut Vec<usize>,
    ) -> Option<StorageError> {
        let mut last_error = None;
        for (chunk_index, chunk) in pending.chunks(DELETE_BATCH).enumerate() {
            let base = chunk_index * DELETE_BATCH;
            self.counters.record_delete(chunk.len() as u64);
            let paths: Vec<Path> = chunk.iter().map(|(_, p)| p.clone()).collect();
            let input = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
            let results: Vec<object_store::Result<Path>> =
                self.store.delete_stream(input).collect().await;
            if results.len() == chunk.len() {
                // One result per location, in order.
                for (i, result) in results.into_iter().enumerate() {
                    match result {
                        Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                            confirmed.push(base + i)
                        }
                        Err(e) => last_error = Some(map_error(e, chunk[i].0.as_str())),
                    }
                }
            } else {
                // A batch failed as a whole: trust only the paths reported deleted.
                for result in results {
                    match result {
                        Ok(path) => {
                            if let Some(i) = chunk.iter().position(|(_, p)| *p == path) {
                                confirmed.push(base + i);
                            }
                        }
                        Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => last_error = Some(map_error(e, "")),
                    }
                }
            }
        }
        last_error
    }
}

/// The multipart half of [`ObjectStorage::upload_stream`] (see [`ObjectStoreStorage`]).
impl ObjectStoreStorage {
    /// A multipart upload through `object_store`'s [`MultipartUpload`] (no [`MultipartStore`]
    /// given): created (retried), parts sent once each, completed; aborted on any error.
    async fn upload_multipart(
        &self,
        path: &Path,
        key: &ObjectKey,
        buffer: PartBuffer,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let ambiguous = AtomicBool::new(false);
        let created = self.create_multipart(path, key, &ambiguous).await;
        let mut upload = match created {
            Ok(upload) => upload,
            Err(error) => {
                self.abort_lost_uploads(&ambiguous, None, path, key).await;
                return Err(error);
            }
        };
        tracing::debug!("multipart upload created");
        let sent = async {
            // `MultipartUpload::put_part` numbers the parts itself, in call order: a part cannot
            // be resent, so each is one request.
            let send = |_index, payload, len| {
                self.counters.record_put_part(len);
                self.part_request(upload.put_part(payload), key)
            };
            let (size, parts) = self
                .send_parts(key, buffer, chunks, part_size, send)
                .await?;
            self.complete_multipart(upload.complete(), path, key, size, parts.len())
                .await?;
            Ok(size)
        }
        .await;
        if sent.is_err() {
            self.abort_multipart(upload.abort(), key).await;
        }
        // `object_store`'s `MultipartUpload` API aborts only the upload it created: an upload
        // whose create answer was lost can only be reported.
        self.abort_lost_uploads(&ambiguous, None, path, key).await;
        sent
    }

    /// A multipart upload through `multipart` (the store's [`MultipartStore`] API, with explicit
    /// part numbers): created (retried), each part retried ([`Self::put_part_retried`]),
    /// completed with the parts' ids in order; aborted on any error.
    async fn upload_parts(
        &self,
        multipart: &dyn MultipartStore,
        path: &Path,
        key: &ObjectKey,
        buffer: PartBuffer,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let ambiguous = AtomicBool::new(false);
        let created = self
            .create_multipart_id(multipart, path, key, &ambiguous)
            .await;
        let id = match created {
            Ok(id) => id,
            Err(error) => {
                self.abort_lost_uploads(&ambiguous, Some(multipart), path, key)
                    .await;
                return Err(error);
            }
        };
        tracing::debug!("multipart upload created");
        let id = &id;
        let upload = PartUpload {
            multipart,
            path,
            id,
            key,
        };
        let sent = async {
            let send = |index, payload, len| {
                // The first attempt counts as the part is handed over, as without a
                // `MultipartStore`; `put_part_retried` counts the resends.
                self.counters.record_put_part(len);
                self.put_part_retried(upload, index, payload, len)
            };
            let (size, parts) = self
                .send_parts(key, buffer, chunks, part_size, send)
                .await?;
            let count = parts.len();
            let complete = multipart.complete_multipart(path, id, parts);
            self.complete_multipart(complete, path, key, size, count)
                .await?;
            Ok(size)
        }
        .await;
        if sent.is_err() {
            self.abort_multipart(multipart.abort_multipart(path, id), key)
                .await;
        }
        self.abort_lost_uploads(&ambiguous, Some(multipart), path, key)
            .await;
        sent
    }

    /// Creates a multipart upload of `path`: a PUT-class request, retried as one (see
    /// [`Self::create_retried`] for `ambiguous`).
    async fn create_multipart(
        &self,
        path: &Path,
        key: &ObjectKey,
        ambiguous: &AtomicBool,
    ) -> Result<Box<dyn MultipartUpload>, StorageError> {
        self.create_retried(key, ambiguous, || {
            self.store
                .put_multipart_opts(path, PutMultipartOptions::default())
        })
        .await
    }

    /// Creates a multipart upload of `path` through `multipart`: retried as
    /// [`Self::create_multipart`].
    async fn create_multipart_id(
        &self,
        multipart: &dyn MultipartStore,
        path: &Path,
        key: &ObjectKey,
        ambiguous: &AtomicBool,
    ) -> Result<MultipartId, StorageError> {
        self.create_retried(key, ambiguous, || {
            multipart.create_multipart_opts(path, PutMultipartOptions::default())
        })
        .await
    }

    /// The create request of a multipart upload (`create` makes one attempt), counted as a PUT
    /// and retried by [`Self::retry_loop`]. Sets `ambiguous` when an attempt fails with a
    /// transient error or a timeout: the store may have created an upload whose id was lost
    /// (see [`Self::abort_lost_uploads`]).
    async fn create_retried<T, Fut>(
        &self,
        key: &ObjectKey,
        ambiguous: &AtomicBool,
        create: impl Fn() -> Fut,
    ) -> Result<T, StorageError>
    where
        Fut: Future<Output = object_store::Result<T>>,
    {
        self.retry_loop("upload-create", key.as_str(), |deadline| {
            let attempt = async {
                self.counters.record_put(0);
                create().await.map_err(|e| map_error(e, key.as_str()))
            };
            async move {
                let created = self.timed("upload-create", deadline, attempt).await;
                if let Err(error) = &created
                    && error.is_transient()
                {
                    ambiguous.store(true, Ordering::Relaxed);
                }
                created
            }
        })
        .await
    }

    /// After a multipart upload of `path` has ended (completed, aborted, or never created), if
    /// one of its create attempts failed ambiguously: lists the uploads of `path` still in
    /// progress through the storage's [`UploadLister`] (retried as every call) and aborts each
    /// through `multipart` ([`Self::abort_multipart`]). They are the uploads created by requests
    /// whose answer was lost (keys are fresh per upload). Without a lister or a multipart store,
    /// or if the listing fails, logs a warning naming the key instead.
    async fn abort_lost_uploads(
        &self,
        ambiguous: &AtomicBool,
        multipart: Option<&dyn MultipartStore>,
        path: &Path,
        key: &ObjectKey,
    ) {
        if !ambiguous.load(Ordering::Relaxed) {
            return;
        }
        let (Some(multipart), Some(lister)) = (multipart, self.lister.as_deref()) else {
            tracing::warn!(
                %key,
                "a create request of a multipart upload failed ambiguously and its uploads cannot \
                 be listed here: an upload it may have created stays until the store's lifecycle \
                 rule removes it"
            );
            return;
        };
        let listed = self
            .retry_loop("upload-list", key.as_str(), |deadline| {
                self.counters.record_list();
                let list = async {
                    lister
                        .in_progress(path)
                        .await
                        .map_err(|e| map_error(e, key.as_str()))
                };
                self.timed("upload-list", deadline, list)
            })
            .await;
        let ids = match listed {
            Ok(ids) => ids,
            Err(error) => {
                tracing::warn!(
                    %key,
                    %error,
                    "could not list the multipart uploads of a key whose create request failed \
                     ambiguously: an upload it may have created stays until the store's \
                     lifecycle rule removes it"
                );
                return;
            }
        };
        if !ids.is_empty() {
            tracing::info!(
                %key,
                uploads = ids.len(),
                "aborting multipart uploads whose create answer was lost"
            );
        }
        for id in &ids {
            self.abort_multipart(multipart.abort_multipart(path, id), key)
                .await;
        }
    }

    /// Sends part `index` (0-based) of `upload`, retried as every call
    /// ([`Self::retry_loop`]: transient failures, `max_attempts`, backoff, a deadline counted
    /// from the part's first attempt). Each attempt resends the same payload (shared bytes, not
    /// a copy) under the same index, replacing whatever an earlier attempt may have stored (the
    /// same bytes), is cut at the attempt timeout and counts as one part request (the first one
    /// is counted by the caller).
    async fn put_part_retried(
        &self,
        upload: PartUpload<'_>,
        index: usize,
        payload: PutPayload,
        len: u64,
    ) -> Result<PartId, StorageError> {
        let PartUpload {
            multipart,
            path,
            id,
            key,
        } = upload;
        let span = tracing::debug_span!("upload_part", part = index + 1, len);
        let mut attempts = 0u32;
        self.retry_loop("upload-part", key.as_str(), |deadline| {
            attempts += 1;
            if attempts > 1 {
                self.counters.record_put_part(len);
            }
            let payload = payload.clone();
            let put = async move {
                multipart
                    .put_part(path, id, index, payload)
                    .await
                    .map_err(|e| map_error(e, key.as_str()))
            };
            self.timed("upload-part", deadline, put)
        })
        .instrument(span)
        .await
    }

    /// Sends `buffer` and the rest of `chunks` as parts of exactly `part_size` bytes (the last
    /// one shorter), each through `send(index, payload, len)` (`index` from 0), at most
    /// [`StorageOptions::parts_in_flight`] at once, reading the next chunks while parts are in
    /// flight. Returns the object's size and what `send` returned for each part, in part order.
    /// Fails at the first error (of the stream or a part; the parts still in flight are
    /// dropped) or past [`MAX_PARTS`](crate::MAX_PARTS) parts; the caller then aborts the upload.
    async fn send_parts<T, F, Fut>(
        &self,
        key: &ObjectKey,
        mut buffer: PartBuffer,
        mut chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
        mut send: F,
    ) -> Result<(u64, Vec<T>), StorageError>
    where
        F: FnMut(usize, PutPayload, u64) -> Fut,
        Fut: Future<Output = Result<T, StorageError>>,
    {
        let mut in_flight = FuturesUnordered::new();
        // What each part's `send` returned, by index (`None` while in flight).
        let mut sent: Vec<Option<T>> = Vec::new();
        let (mut size, mut parts, mut ended) = (0u64, 0u64, false);
        loop {
            while buffer.len >= part_size || (ended && buffer.len > 0) {
                while in_flight.len() >= self.options.parts_in_flight {
                    if let Some(done) = in_flight.next().await {
                        part_sent(&mut sent, done)?;
                    }
                }
                parts += 1;
                if parts > crate::MAX_PARTS {
                    return Err(StorageError::Permanent {
                        source: format!(
                            "object {key} needs more than {} parts of {part_size} bytes; \
                             stream it with a larger part size",
                            crate::MAX_PARTS
                        )
                        .into(),
                    });
                }
                let part = buffer.take(part_size);
                let len: u64 = part.iter().map(|c| c.len() as u64).sum();
                size += len;
                tracing::trace!(part = parts, len, "sending part");
                let index = sent.len();
                sent.push(None);
                let request = send(index, part.into_iter().collect(), len);
                in_flight.push(async move { request.await.map(|value| (index, value)) });
            }
            if ended {
                break;
            }
            // The next chunk, while the parts in flight are sent. The parts are polled first, on
            // every turn: a stream that is always ready (a builder ahead of the network) must not
            // leave a part that was woken unpolled until every slot is taken. (A part waiting on
            // the network still needs this task to return to the runtime, which a stream that is
            // never pending does not do; the tiering worker's is a bounded channel.)
            let next = if in_flight.is_empty() {
                chunks.next().await
            } else {
                match futures::future::select(in_flight.next(), chunks.next()).await {
                    Either::Right((next, _)) => next,
                    Either::Left((done, _)) => {
                        if let Some(done) = done {
                            part_sent(&mut sent, done)?;
                        }
                        continue;
                    }
                }
            };
            match next {
                Some(chunk) => buffer.push(chunk?),
                None => ended = true,
            }
        }
        while let Some(done) = in_flight.next().await {
            part_sent(&mut sent, done)?;
        }
        let sent: Option<Vec<T>> = sent.into_iter().collect();
        match sent {
            Some(sent) => Ok((size, sent)),
            // Unreachable: every part pushed was awaited above.
            None => Err(StorageError::Permanent {
                source: format!("multipart upload of {key}: a part was never sent").into(),
            }),
        }
    }

    /// One part request, cut at the attempt timeout.
    fn part_request<'a>(
        &self,
        request: UploadPart,
        key: &'a ObjectKey,
    ) -> impl Future<Output = Result<(), StorageError>> + Send + 'a {
        let timeout = self.options.retry.attempt_timeout;
        async move {
            match tokio::time::timeout(timeout, request).await {
                Ok(sent) => sent.map_err(|e| map_error(e, key.as_str())),
                Err(_) => Err(timeout_error("upload-part", timeout)),
            }
        }
    }

    /// Completes a multipart upload (`complete`: one request). After a transient failure, an
    /// object of exactly `size` bytes under the key is this upload, completed by the store before
    /// the failure.
    async fn complete_multipart(
        &self,
        complete: impl Future<Output = object_store::Result<PutResult>>,
        path: &Path,
        key: &ObjectKey,
        size: u64,
        parts: usize,
    ) -> Result<(), StorageError> {
        let timeout = self.options.retry.attempt_timeout;
        self.counters.record_put(0);
        let error = match tokio::time::timeout(timeout, complete).await {
            Ok(Ok(_)) => {
                tracing::debug!(size, parts, "multipart upload completed");
                return Ok(());
            }
            Ok(Err(e)) => map_error(e, key.as_str()),
            Err(_) => timeout_error("upload-complete", timeout),
        };
        if error.is_transient() {
            self.counters.record_get();
            if let Ok(Ok(meta)) = tokio::time::timeout(timeout, self.store.head(path)).await
                && meta.size == size
            {
                tracing::info!(%key, size, %error, "multipart completion failed, but the object landed");
                return Ok(());
            }
        }
        Err(error)
    }

    /// Aborts a multipart upload (`abort`: one DELETE request); a failure is logged, not
    /// returned (the caller returns the error that made it abort).
    async fn abort_multipart(
        &self,
        abort: impl Future<Output = object_store::Result<()>>,
        key: &ObjectKey,
    ) {
        let timeout = self.options.retry.attempt_timeout;
        self.counters.record_delete(0);
        match tokio::time::timeout(timeout, abort).await {
            Ok(Ok(())) => tracing::debug!(%key, "multipart upload aborted"),
            Ok(Err(error)) => tracing::warn!(
                %key,
                %error,
                "could not abort a multipart upload: its parts stay until the store's lifecycle \
                 rule removes them"
            ),
            Err(_) => tracing::warn!(
                %key,
                ?timeout,
                "abort of a multipart upload timed out: its parts may stay until the store's \
                 lifecycle rule removes them"
            ),
        }
    }
}

/// One multipart upload through a [`MultipartStore`]: what each of its part requests needs.
#[derive(Clone, Copy)]
struct PartUpload<'a> {
    multipart: &'a dyn MultipartStore,
    path: &'a Path,
    id: &'a MultipartId,
    key: &'a ObjectKey,
}

/// Records a part that `send_parts` finished sending (or returns its error).
fn part_sent<T>(
    sent: &mut [Option<T>],
    done: Result<(usize, T), StorageError>,
) -> Result<(), StorageError> {
    let (index, value) = done?;
    if let Some(slot) = sent.get_mut(index) {
        *slot = Some(value);
    }
    Ok(())
}

/// The chunks of a streamed upload read and not yet sent.
#[derive(Debug, Default)]
struct PartBuffer {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl PartBuffer {
    fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// Takes the first `size` bytes (all of them if fewer), without copying.
    fn take(&mut self, size: usize) -> Vec<Bytes> {
        let mut part = Vec::new();
        let mut wanted = size.min(self.len);
        self.len -= wanted;
        while wanted > 0 {
            let Some(mut chunk) = self.chunks.pop_front() else {
                break;
            };
            if chunk.len() > wanted {
                self.chunks.push_front(chunk.split_off(wanted));
            }
            wanted -= chunk.len();
            part.push(chunk);
        }
        part
    }
}

/// The generator of the retry jitter: seeded with the injected seed, else from the OS.
fn jitter_rng(retry: &RetryConfig) -> parking_lot::Mutex<fastrand::Rng> {
    let seed = retry.seed.unwrap_or_else(diskless_common::entropy_seed);
    parking_lot::Mutex::new(fastrand::Rng::with_seed(seed))
}

/// One upload call: what each of its PUT and verifying GET requests needs.
struct Upload<'a> {
    path: Path,
    key: &'a ObjectKey,
    payload: &'a [Bytes],
    len: u64,
}

fn same_content(bytes: &[u8], payload: &[Bytes]) -> bool {
    let mut rest = bytes;
    for chunk in payload {
        match rest.split_at_checked(chunk.len()) {
            Some((head, tail)) if head == chunk.as_ref() => rest = tail,
            _ => return false,
        }
    }
    rest.is_empty()
}

fn system_time(t: &object_store::ObjectMeta) -> SystemTime {
    let secs = t.last_modified.timestamp();
    let nanos = t.last_modified.timestamp_subsec_nanos();
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs.unsigned_abs(), nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nanos.into())
    }
}

#[async_trait]
impl ObjectStorage for ObjectStoreStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        let len: u64 = payload.iter().map(|b| b.len() as u64).sum();
        let span = tracing::debug_span!("upload", %key, len);
        async {
            let upload = &Upload {
                path: self.path(key.as_str())?,
                key,
                payload,
                len,
            };
            // Create-or-verify, under one retry budget and deadline. A PUT refused because the
            // key is taken is followed by a GET comparing the object with the payload; a
            // transient failure of that GET retries the GET only. A GET finding no object means
            // the key was taken by an upload not visible (yet): S3 answers 409
            // ConditionalRequestConflict (reported as AlreadyExists) while another conditional
            // PUT of the key is in flight, e.g. this upload's own timed-out first attempt, which
            // may land later or be aborted. Either way the next attempt PUTs again: it then
            // stores the object, or finds the landed one and verifies it.
            let verifying = &AtomicBool::new(false);
            self.retry_loop("upload", key.as_str(), |deadline| async move {
                if !verifying.load(Ordering::Relaxed) {
                    let put = self.put_once(upload);
                    match self.timed("upload", deadline, put).await {
                        Err(StorageError::AlreadyExists { .. }) => {
                            verifying.store(true, Ordering::Relaxed)
                        }
                        other => return other,
                    }
                }
                let verify = self.verify_once(upload);
                match self.timed("upload-verify", deadline, verify).await {
                    Err(e) if e.is_not_found() => {
                        verifying.store(false, Ordering::Relaxed);
                        Err(StorageError::Transient {
                            source: format!(
                                "object {key} reported as existing but then not found \
                                 (an upload of it in flight or aborted)"
                            )
                            .into(),
                        })
                    }
                    other => other,
                }
            })
            .await
        }
        .instrument(span)
        .await
    }

    /// See [`ObjectStoreStorage`]: at most one part is one create-only `upload`; a larger object
    /// is a multipart upload whose parts are retried with the storage's [`RetryConfig`] when the
    /// store's [`MultipartStore`] API is present
    /// ([`ObjectStoreStorage::with_multipart_store`]), else sent once each; aborted on any error.
    async fn upload_stream(
        &self,
        key: &ObjectKey,
        mut chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let part_size = crate::clamp_part_size(part_size);
        let span = tracing::debug_span!("upload_stream", %key, part_size);
        async move {
            let path = self.path(key.as_str())?;
            // Up to one part, the object is one create-only upload.
            let mut buffer = PartBuffer::default();
            while buffer.len <= part_size {
                match chunks.next().await {
                    Some(chunk) => buffer.push(chunk?),
                    None => {
                        let payload: Vec<Bytes> = buffer.chunks.into();
                        self.upload(key, &payload).await?;
                        return Ok(buffer.len as u64);
                    }
                }
            }
            match &self.multipart {
                Some(multipart) => {
                    self.upload_parts(multipart.as_ref(), &path, key, buffer, chunks, part_size)
                        .await
                }
                None => {
                    self.upload_multipart(&path, key, buffer, chunks, part_size)
                        .await
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let span = tracing::debug_span!("fetch", %key, start = range.start, end = range.end);
        async {
            if range.start >= range.end || usize::try_from(range.end - range.start).is_err() {
                return Err(StorageError::InvalidRange {
                    key: key.to_string(),
                    start: range.start,
                    end: range.end,
                    size: None,
                });
            }
            let path = self.path(key.as_str())?;
            self.retry_loop("fetch", key.as_str(), |deadline| {
                self.timed("fetch", deadline, self.fetch_once(&path, key, &range))
            })
            .await
        }
        .instrument(span)
        .await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let span = tracing::debug_span!("delete", keys = keys.len());
        async {
            let mut pending = Vec::with_capacity(keys.len());
            for key in keys {
                pending.push((key.clone(), self.path(key.as_str())?));
            }
            let config = &self.options.retry;
            let deadline = Instant::now() + config.deadline;
            let mut backoff = Backoff::new(config);
            let mut done = Vec::with_capacity(keys.len());
            let mut last_error = None;
            let mut attempts = 0;
            while !pending.is_empty() {
                attempts += 1;
                let budget = config
                    .attempt_timeout
                    .min(deadline.saturating_duration_since(Instant::now()));
                let mut confirmed = Vec::new();
                let error =
                    match tokio::time::timeout(budget, self.delete_round(&pending, &mut confirmed))
                        .await
                    {
                        Ok(error) => error,
                        Err(_) => Some(timeout_error("delete", budget)),
                    };
                let mut is_confirmed = vec![false; pending.len()];
                for i in confirmed {
                    is_confirmed[i] = true;
                }
                let mut flags = is_confirmed.into_iter();
                pending.retain(|(key, _)| {
                    let confirmed = flags.next().unwrap_or(false);
                    if confirmed {
                        done.push(key.clone());
                    }
                    !confirmed
                });
                let Some(error) = error else { continue };
                let retry = error.is_transient() && attempts < config.max_attempts;
                last_error = Some(error);
                if !retry || pending.is_empty() {
                    break;
                }
                let delay = backoff.next_delay(&mut self.rng.lock());
                if Instant::now() + delay >= deadline {
                    break;
                }
                tracing::warn!(
                    attempts,
                    pending = pending.len(),
                    ?delay,
                    "retrying deletes"
                );
                tokio::time::sleep(delay).await;
            }
            match last_error {
                Some(error) if done.is_empty() && !pending.is_empty() => Err(error),
                Some(error) if !pending.is_empty() => {
                    tracing::warn!(
                        unconfirmed = pending.len(),
                        %error,
                        "some deletes were not confirmed"
                    );
                    Ok(done)
                }
                _ => Ok(done),
            }
        }
        .instrument(span)
        .await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.list_after(prefix, None)
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.list_after(prefix, Some(offset))
    }
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn same_content_compares_chunked_payloads() {
        let p = [Bytes::from_static(b"ab"), Bytes::from_static(b"cd")];
        assert!(same_content(b"abcd", &p));
        assert!(!same_content(b"abc", &p));
        assert!(!same_content(b"abcde", &p));
        assert!(!same_content(b"abce", &p));
        assert!(same_content(b"", &[]));
    }

    #[test]
    fn part_buffer_takes_exact_parts_without_copying() {
        let mut buffer = PartBuffer::default();
        for chunk in [&b"abc"[..], b"", b"defgh", b"i"] {
            buffer.push(Bytes::copy_from_slice(chunk));
        }
        assert_eq!(buffer.len, 9);
        let concat = |part: Vec<Bytes>| part.concat();
        assert_eq!(concat(buffer.take(4)), b"abcd");
        assert_eq!(buffer.len, 5);
        assert_eq!(concat(buffer.take(4)), b"efgh");
        assert_eq!(concat(buffer.take(4)), b"i");
        assert_eq!(buffer.len, 0);
        assert!(buffer.take(4).is_empty());
    }
}
