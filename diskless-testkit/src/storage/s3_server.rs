//! An S3 server in-process on 127.0.0.1, for tests against a real S3 HTTP endpoint (feature
//! `s3-server`).
//!
//! It is [`s3s`]'s S3 protocol layer (request parsing, SigV4 authentication) over [`s3s_fs`]'s
//! filesystem backend in a temporary directory, served by hyper on an ephemeral port.
//!
//! Create-only uploads: `object_store` sends `PUT` with `If-None-Match: *` for
//! `PutMode::Create` (its default `S3ConditionalPut::ETagMatch` mode); s3s-fs 0.14.1 honours the
//! header and answers `412 Precondition Failed` when the object exists, which `object_store`
//! reports as `AlreadyExists`; likewise `If-Match: <etag>` (`PutMode::Update`, the compare-and-swap
//! that Nisshi's `s3://` engine keeps its state with). s3s-fs checks, then writes: alone, two
//! *concurrent* conditional PUTs of one key could both pass the check (last writer wins), where
//! real S3 evaluates the condition atomically (one of them gets 412, or 409
//! `ConditionalRequestConflict` while the other is in flight). And s3s-fs's GET opens the file,
//! then reads the ETag from a file of its own: a write in between answers the old bytes with the
//! new ETag, on which a compare-and-swap then succeeds over data it never saw. So this server
//! runs each write of an object key (PUT, POST, DELETE) alone, holding that key's lock
//! exclusively from the condition's check to the last byte written, and each read (GET, HEAD)
//! holds it shared until its answer's headers are ready (the file is open by then)
//! ([`KeyLocks`]). Without it, several Nisshi nodes on one bucket handed out one producer id twice
//! (the fault campaign, chaos/README.md). DeleteObjects (a `POST` to the bucket) names its keys
//! in its body and takes no lock.
//!
//! Benchmarks can make it as slow as a real object store: [`S3TestServer::start_with_latency`]
//! holds every request for a delay drawn from a log-normal distribution with a given median and
//! 99th percentile ([`InjectedLatency`], e.g. [`InjectedLatency::S3_STANDARD`]), from a seeded
//! generator.
//!
//! It counts the requests it answers, by bucket and kind ([`S3TestServer::request_counts`]), so a
//! test or benchmark can tell how many PUTs and GETs a workload cost.
//!
//! ```
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! use diskless_storage::{ObjectKey, ObjectStorage};
//! use diskless_testkit::storage::S3TestServer;
//!
//! let server = S3TestServer::start().await.unwrap();
//! let storage = server.storage("diskless").unwrap();
//! let key = ObjectKey::parse("wal/segment-1").unwrap();
//! storage.upload(&key, &[bytes::Bytes::from_static(b"over http")]).await.unwrap();
//! assert_eq!(storage.fetch(&key, 5..9).await.unwrap(), "http");
//! server.shutdown().await;
//! # });
//! ```

use diskless_storage::object_store::aws::{AmazonS3, AmazonS3Builder};
use diskless_storage::{ObjectStoreStorage, StorageError};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// A delay added to every request: log-normal with median `p50` and 99th percentile `p99`,
/// drawn from a generator seeded with `seed` (the same seed, the same sequence of delays in the
/// order requests arrive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedLatency {
    /// The median delay.
    pub p50: Duration,
    /// The 99th percentile (at most `p50`: every request waits exactly `p50`).
    pub p99: Duration,
    /// The generator's seed.
    pub seed: u64,
}

impl InjectedLatency {
    /// Roughly S3 Standard's first-byte latency for small objects: median 60 ms, p99 250 ms.
    pub const S3_STANDARD: InjectedLatency = InjectedLatency {
        p50: Duration::from_millis(60),
        p99: Duration::from_millis(250),
        seed: 1,
    };
    /// Roughly S3 Express One Zone's: median 5 ms, p99 20 ms.
    pub const S3_EXPRESS: InjectedLatency = InjectedLatency {
        p50: Duration::from_millis(5),
        p99: Duration::from_millis(20),
        seed: 1,
    };

    /// Parses `P50MS:P99MS` (milliseconds, e.g. `60:250`), `standard` or `express`.
    ///
    /// ```
    /// use diskless_testkit::storage::InjectedLatency;
    /// use std::time::Duration;
    ///
    /// assert_eq!(InjectedLatency::parse("standard"), Some(InjectedLatency::S3_STANDARD));
    /// let l = InjectedLatency::parse("10:40").unwrap();
    /// assert_eq!((l.p50, l.p99), (Duration::from_millis(10), Duration::from_millis(40)));
    /// assert_eq!(InjectedLatency::parse("10"), None);
    /// ```
    pub fn parse(text: &str) -> Option<InjectedLatency> {
        match text {
            "standard" => Some(Self::S3_STANDARD),
            "express" => Some(Self::S3_EXPRESS),
            _ => {
                let (p50, p99) = text.split_once(':')?;
                Some(InjectedLatency {
                    p50: Duration::from_millis(p50.trim().parse().ok()?),
                    p99: Duration::from_millis(p99.trim().parse().ok()?),
                    seed: 1,
                })
            }
        }
    }

    /// One delay: `exp(mu + sigma * z)` with `mu = ln(p50)`, `sigma = ln(p99 / p50) / 2.3263`
    /// (the standard normal's 99th percentile) and `z` standard normal (Box-Muller), capped at
    /// ten times `p99`.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        let p50 = self.p50.as_secs_f64();
        let p99 = self.p99.as_secs_f64();
        if p50 <= 0.0 || p99 <= p50 {
            return self.p50;
        }
        let sigma = (p99 / p50).ln() / 2.326_347_874;
        // u1 in (0, 1]: its logarithm is finite.
        let u1 = 1.0 - rng.f64();
        let u2 = rng.f64();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let secs = (p50.ln() + sigma * z).exp().min(10.0 * p99);
        Duration::from_secs_f64(secs)
    }
}

type Answer = Result<s3s::HttpResponse, s3s::HttpError>;

/// Requests received, by bucket, then by kind (see [`S3TestServer::request_counts`]).
pub type RequestCounts = BTreeMap<String, BTreeMap<&'static str, u64>>;

/// The kind of a path-style S3 request: `GET` (an object: GetObject), `LIST` (`GET` of a bucket:
/// ListObjects), `PUT` (PutObject, UploadPart, CopyObject, CreateBucket), `POST` (multipart
/// create/complete, DeleteObjects), `HEAD`, `DELETE`, or `OTHER`; and the bucket it names (empty
/// for the service root).
fn request_kind(method: &hyper::Method, path: &str) -> (String, &'static str) {
    let path = path.trim_start_matches('/');
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    let kind = match *method {
        hyper::Method::GET if key.is_empty() => "LIST",
        hyper::Method::GET => "GET",
        hyper::Method::PUT => "PUT",
        hyper::Method::POST => "POST",
        hyper::Method::HEAD => "HEAD",
        hyper::Method::DELETE => "DELETE",
        _ => "OTHER",
    };
    (bucket.to_string(), kind)
}

/// One lock per object key that a request is in flight on: a write (PUT, POST, DELETE) holds its
/// key's exclusively, a read (GET, HEAD) shared, so that s3s-fs's check-then-write of a condition
/// is atomic and a read's bytes and ETag belong together, as on S3. Entries live while a request
/// holds or waits for them.
#[derive(Clone, Default)]
struct KeyLocks {
    locks: Arc<Mutex<std::collections::HashMap<String, Arc<tokio::sync::RwLock<()>>>>>,
}

/// A held key lock (see [`KeyLocks`]); its map entry goes with the last holder.
struct KeyGuard {
    locks: KeyLocks,
    key: String,
    lock: Arc<tokio::sync::RwLock<()>>,
    shared: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    exclusive: Option<tokio::sync::OwnedRwLockWriteGuard<()>>,
}

impl KeyLocks {
    async fn acquire(&self, key: String, exclusive: bool) -> KeyGuard {
        let lock = Arc::clone(
            self.locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key.clone())
                .or_default(),
        );
        let (shared, exclusive) = if exclusive {
            (None, Some(Arc::clone(&lock).write_owned().await))
        } else {
            (Some(Arc::clone(&lock).read_owned().await), None)
        };
        KeyGuard {
            locks: self.clone(),
            key,
            lock,
            shared,
            exclusive,
        }
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        // The guards hold references to the lock too: released first.
        self.shared = None;
        self.exclusive = None;
        let mut locks = self
            .locks
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Clones are made under the map's mutex: two references (the map's and this one) mean no
        // other request holds or waits for this key.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

/// The S3 service, each request counted, then held for an [`InjectedLatency`] delay first; a
/// request on an object runs under its key's lock ([`KeyLocks`]).
#[derive(Clone)]
struct Delayed {
    inner: s3s::service::S3Service,
    latency: Option<(InjectedLatency, Arc<Mutex<fastrand::Rng>>)>,
    counts: Arc<Mutex<RequestCounts>>,
    keys: KeyLocks,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Delayed {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let (bucket, kind) = request_kind(req.method(), req.uri().path());
        *self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(bucket)
            .or_default()
            .entry(kind)
            .or_default() += 1;
        let delay = self.latency.as_ref().map(|(latency, rng)| {
            let mut rng = rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            latency.sample(&mut rng)
        });
        // A request on an object (a path-style key below the bucket): its key's lock, exclusive
        // for a write, shared for a read.
        let path = req.uri().path().trim_start_matches('/');
        let object = path.split_once('/').is_some_and(|(_, key)| !key.is_empty());
        let exclusive = match *req.method() {
            hyper::Method::PUT | hyper::Method::POST | hyper::Method::DELETE => Some(true),
            hyper::Method::GET | hyper::Method::HEAD => Some(false),
            _ => None,
        };
        let lock = exclusive
            .filter(|_| object)
            .map(|exclusive| (path.to_string(), exclusive));
        let inner = self.inner.clone();
        let keys = self.keys.clone();
        Box::pin(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let _held = match lock {
                Some((key, exclusive)) => Some(keys.acquire(key, exclusive).await),
                None => None,
            };
            hyper::service::Service::call(&inner, req).await
        })
    }
}

/// A running in-process S3 server. Stops when [`S3TestServer::shutdown`] is called or when
/// dropped; its data lives in a temporary directory removed then.
#[derive(Debug)]
pub struct S3TestServer {
    addr: SocketAddr,
    endpoint: String,
    bucket: String,
    access_key: String,
    secret_key: String,
    region: String,
    root: tempfile::TempDir,
    counts: Arc<Mutex<RequestCounts>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl S3TestServer {
    /// The bucket created at start.
    pub const BUCKET: &'static str = "diskless-test";
    /// The access key the server accepts.
    pub const ACCESS_KEY: &'static str = "diskless-access-key";
    /// The secret key the server accepts.
    pub const SECRET_KEY: &'static str = "diskless-secret-key";
    /// The region clients should sign for.
    pub const REGION: &'static str = "us-east-1";

    /// Starts a server on `127.0.0.1:0` with one bucket ([`S3TestServer::BUCKET`]) and
    /// SigV4 authentication with [`S3TestServer::ACCESS_KEY`] / [`S3TestServer::SECRET_KEY`].
    /// Must be called within a tokio runtime with I/O and time enabled.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with_latency(None).await
    }

    /// [`S3TestServer::start`], every request held for a delay drawn from `latency` first (none
    /// when `None`).
    pub async fn start_with_latency(latency: Option<InjectedLatency>) -> std::io::Result<Self> {
        let root = tempfile::tempdir()?;
        std::fs::create_dir(root.path().join(Self::BUCKET))?;
        let fs = s3s_fs::FileSystem::new(root.path())
            .map_err(|e| std::io::Error::other(format!("s3s-fs: {e:?}")))?;
        let counts = Arc::new(Mutex::new(RequestCounts::new()));
        let service = {
            let mut builder = s3s::service::S3ServiceBuilder::new(fs);
            builder.set_auth(s3s::auth::SimpleAuth::from_single(
                Self::ACCESS_KEY,
                Self::SECRET_KEY,
            ));
            Delayed {
                inner: builder.build(),
                latency: latency
                    .map(|l| (l, Arc::new(Mutex::new(fastrand::Rng::with_seed(l.seed))))),
                counts: Arc::clone(&counts),
                keys: KeyLocks::default(),
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => {
                            let conn = http
                                .serve_connection(TokioIo::new(socket), service.clone())
                                .into_owned();
                            connections.spawn(async move {
                                if let Err(e) = conn.await {
                                    tracing::debug!("s3 test server connection: {e}");
                                }
                            });
                        }
                        Err(e) => {
                            tracing::warn!("s3 test server accept: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        }
                    },
                    _ = &mut rx => break,
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
            connections.shutdown().await;
        });
        tracing::info!(%addr, "s3 test server started");
        Ok(S3TestServer {
            addr,
            endpoint: format!("http://{addr}"),
            bucket: Self::BUCKET.to_string(),
            access_key: Self::ACCESS_KEY.to_string(),
            secret_key: Self::SECRET_KEY.to_string(),
            region: Self::REGION.to_string(),
            root,
            counts,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The access key id.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The secret access key.
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The directory holding the buckets (`<root>/<bucket>/<key>`).
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }

    /// The requests received so far, by bucket (the first path segment; requests are
    /// path-style), then by kind: `GET` (GetObject), `LIST` (a `GET` of a bucket), `PUT`
    /// (PutObject, UploadPart, CopyObject, CreateBucket), `POST` (multipart create and complete,
    /// DeleteObjects), `HEAD`, `DELETE`, `OTHER`. Counted as each request arrives, whatever its
    /// answer.
    pub fn request_counts(&self) -> RequestCounts {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `s3://<bucket>/<prefix>` (or `s3://<bucket>` for an empty prefix), for
    /// [`ObjectStoreStorage::from_url`] with [`S3TestServer::storage_options`].
    pub fn url(&self, prefix: &str) -> String {
        if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{prefix}", self.bucket)
        }
    }

    /// The `object_store` options that point an S3 client at this server: endpoint, region,
    /// static credentials, plain HTTP, path-style requests.
    pub fn storage_options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_region", self.region.as_str()),
            ("aws_access_key_id", self.access_key.as_str()),
            ("aws_secret_access_key", self.secret_key.as_str()),
            ("aws_allow_http", "true"),
            ("aws_virtual_hosted_style_request", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// An `object_store` [`AmazonS3`] client for the bucket (plain HTTP, path style, static
    /// credentials, `object_store`'s own retries off).
    pub fn amazon_s3(&self) -> Result<AmazonS3, diskless_storage::object_store::Error> {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region(&self.region)
            .with_bucket_name(&self.bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .with_retry(diskless_storage::object_store::RetryConfig {
                max_retries: 0,
                ..Default::default()
            })
            .build()
    }

    /// An [`ObjectStoreStorage`] over this server with keys under `prefix`, built through
    /// [`ObjectStoreStorage::from_url`].
    pub fn storage(&self, prefix: &str) -> Result<ObjectStoreStorage, StorageError> {
        ObjectStoreStorage::from_url(&self.url(prefix), self.storage_options())
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for S3TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn injected_latency_has_the_asked_median_and_99th_percentile() {
        for latency in [InjectedLatency::S3_STANDARD, InjectedLatency::S3_EXPRESS] {
            let mut rng = fastrand::Rng::with_seed(latency.seed);
            let mut samples: Vec<Duration> =
                (0..20_000).map(|_| latency.sample(&mut rng)).collect();
            samples.sort();
            let p50 = samples[samples.len() / 2].as_secs_f64();
            let p99 = samples[samples.len() * 99 / 100].as_secs_f64();
            let (want50, want99) = (latency.p50.as_secs_f64(), latency.p99.as_secs_f64());
            assert!((p50 / want50 - 1.0).abs() < 0.05, "{latency:?}: p50 {p50}");
            assert!((p99 / want99 - 1.0).abs() < 0.10, "{latency:?}: p99 {p99}");
            assert!(samples.iter().all(|d| *d <= latency.p99 * 10));
        }
        // p99 not above p50: a constant delay.
        let flat = InjectedLatency::parse("7:7").unwrap();
        let mut rng = fastrand::Rng::with_seed(3);
        assert_eq!(flat.sample(&mut rng), Duration::from_millis(7));
    }

    #[tokio::test]
    async fn every_request_waits_the_injected_latency() {
        let latency = InjectedLatency::parse("150:150").unwrap();
        let server = S3TestServer::start_with_latency(Some(latency))
            .await
            .unwrap();
        let storage = server.storage("slow").unwrap();
        let key = diskless_storage::ObjectKey::parse("k").unwrap();
        use diskless_storage::ObjectStorage as _;
        let started = std::time::Instant::now();
        storage
            .upload(&key, &[bytes::Bytes::from_static(b"x")])
            .await
            .unwrap();
        assert_eq!(storage.fetch(&key, 0..1).await.unwrap(), "x");
        // Two requests, each held 150 ms before it is served (a lower bound, whatever the load).
        assert!(started.elapsed() >= Duration::from_millis(300));
        server.shutdown().await;
    }

    #[tokio::test]
    async fn requests_are_counted_by_bucket_and_kind() {
        use diskless_storage::ObjectStorage as _;
        let server = S3TestServer::start().await.unwrap();
        assert!(server.request_counts().is_empty());
        let storage = server.storage("counted").unwrap();
        let key = diskless_storage::ObjectKey::parse("k").unwrap();
        storage
            .upload(&key, &[bytes::Bytes::from_static(b"abc")])
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(storage.fetch(&key, 0..2).await.unwrap(), "ab");
        }
        storage.delete(&[key]).await.unwrap();
        let counts = server.request_counts();
        let bucket = &counts[S3TestServer::BUCKET];
        assert_eq!(bucket.get("PUT"), Some(&1), "{counts:?}");
        assert_eq!(bucket.get("GET"), Some(&3), "{counts:?}");
        // One object deleted: a DELETE, or a POST of DeleteObjects.
        assert_eq!(
            bucket.get("DELETE").copied().unwrap_or(0) + bucket.get("POST").copied().unwrap_or(0),
            1,
            "{counts:?}"
        );
        assert_eq!(counts.len(), 1, "{counts:?}");
        server.shutdown().await;
    }

    /// Nisshi's `s3://` engine keeps its state with compare-and-swap PUTs (`If-Match`): of
    /// several concurrent swaps from one version exactly one may win, as on S3; and a create
    /// (`If-None-Match: *`) of an existing key fails however many race.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_conditional_puts_of_one_key_have_one_winner() {
        use diskless_storage::object_store::{
            ObjectStore as _, PutMode, PutOptions, PutPayload, UpdateVersion,
        };
        let server = S3TestServer::start().await.unwrap();
        let store = Arc::new(server.amazon_s3().unwrap());
        let path = diskless_storage::object_store::path::Path::from("state/meta.json");
        // A request on a pooled connection that the server closed after answering 412 without
        // reading a large body fails in transport (`Generic`): sent again, as object_store's
        // own retries would (turned off in `amazon_s3`).
        async fn put_retrying(
            store: &AmazonS3,
            path: &diskless_storage::object_store::path::Path,
            body: &[u8],
            mode: PutMode,
        ) -> diskless_storage::object_store::Result<diskless_storage::object_store::PutResult>
        {
            let mut tries = 0;
            loop {
                let opts = PutOptions::from(mode.clone());
                match store
                    .put_opts(path, PutPayload::from(body.to_vec()), opts)
                    .await
                {
                    Err(diskless_storage::object_store::Error::Generic { .. }) if tries < 5 => {
                        tries += 1;
                    }
                    answer => return answer,
                }
            }
        }
        for round in 0..5 {
            let base = format!("base {round}");
            let put = put_retrying(&store, &path, base.as_bytes(), PutMode::Overwrite)
                .await
                .unwrap();
            let version = UpdateVersion {
                e_tag: put.e_tag,
                version: put.version,
            };
            let swaps = (0..12).map(|i| {
                let (store, path, version) = (Arc::clone(&store), path.clone(), version.clone());
                tokio::spawn(async move {
                    let body = vec![u8::try_from(i).unwrap(); 256 << 10];
                    put_retrying(&store, &path, &body, PutMode::Update(version)).await
                })
            });
            let results = futures::future::join_all(swaps).await;
            let won = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
            let lost = results
                .iter()
                .filter(|r| {
                    matches!(
                        r,
                        Ok(Err(
                            diskless_storage::object_store::Error::Precondition { .. }
                        ))
                    )
                })
                .count();
            assert_eq!((won, lost), (1, 11), "round {round}: {results:?}");
        }
        let creates = (0..8).map(|_| {
            let (store, path) = (Arc::clone(&store), path.clone());
            tokio::spawn(async move { put_retrying(&store, &path, b"new", PutMode::Create).await })
        });
        for created in futures::future::join_all(creates).await {
            assert!(
                matches!(
                    created,
                    Ok(Err(
                        diskless_storage::object_store::Error::AlreadyExists { .. }
                    ))
                ),
                "{created:?}"
            );
        }
        server.shutdown().await;
    }

    /// A GET's bytes and ETag belong together while the key is overwritten (a compare-and-swap
    /// client keeps that pair as its version).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_during_overwrites_answers_the_etag_of_its_bytes() {
        use diskless_storage::object_store::{ObjectStoreExt as _, PutPayload};
        let server = S3TestServer::start().await.unwrap();
        let store = Arc::new(server.amazon_s3().unwrap());
        let path = diskless_storage::object_store::path::Path::from("state/meta.json");
        let body = |i: u32| {
            let mut b = i.to_be_bytes().to_vec();
            b.resize(64 << 10, u8::try_from(i % 251).unwrap());
            b
        };
        let first = store.put(&path, PutPayload::from(body(0))).await.unwrap();
        let writer = {
            let (store, path) = (Arc::clone(&store), path.clone());
            tokio::spawn(async move {
                let mut etags = vec![first.e_tag];
                for i in 1..60 {
                    let put = store.put(&path, PutPayload::from(body(i))).await.unwrap();
                    etags.push(put.e_tag);
                }
                etags
            })
        };
        let mut seen = Vec::new();
        while !writer.is_finished() {
            let got = store.get(&path).await.unwrap();
            let etag = got.meta.e_tag.clone();
            let bytes = got.bytes().await.unwrap();
            let version = u32::from_be_bytes(bytes[..4].try_into().unwrap());
            seen.push((version, etag));
        }
        let etags = writer.await.unwrap();
        assert!(!seen.is_empty());
        for (version, etag) in seen {
            assert_eq!(etag, etags[version as usize], "version {version}");
        }
        server.shutdown().await;
    }

    #[test]
    fn request_kinds_follow_path_style_addressing() {
        use hyper::Method;
        assert_eq!(request_kind(&Method::GET, "/b/k/x"), ("b".into(), "GET"));
        assert_eq!(request_kind(&Method::GET, "/b"), ("b".into(), "LIST"));
        assert_eq!(request_kind(&Method::GET, "/b/"), ("b".into(), "LIST"));
        assert_eq!(request_kind(&Method::PUT, "/b/k"), ("b".into(), "PUT"));
        assert_eq!(request_kind(&Method::POST, "/b"), ("b".into(), "POST"));
        assert_eq!(request_kind(&Method::GET, "/"), (String::new(), "LIST"));
        assert_eq!(request_kind(&Method::PATCH, "/b/k"), ("b".into(), "OTHER"));
    }
}
