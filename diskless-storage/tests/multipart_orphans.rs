//! Multipart uploads whose create request succeeded on the store but whose answer was lost (a
//! 503 or a timeout after the store created the upload): `ObjectStoreStorage` lists the key's
//! uploads in progress through its `UploadLister` once the upload has ended and aborts them,
//! instead of leaving them to the bucket's lifecycle rule. Covered: in memory under a paused
//! clock (a model lister tracking the uploads the store holds), over the in-process S3 server
//! (a lister reading the server's own records of uploads in progress), and the S3 lister's
//! signed `ListMultipartUploads` requests over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;
use support::status;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_storage::object_store::aws::AmazonS3Builder;
use diskless_storage::object_store::client::{ClientOptions, HttpConnector, ReqwestConnector};
use diskless_storage::object_store::multipart::{MultipartStore, PartId};
use diskless_storage::object_store::{
    self, MultipartId, MultipartUpload, ObjectStore, PutMultipartOptions, PutPayload, PutResult,
    memory::InMemory, path::Path,
};
use diskless_storage::{
    MIN_PART_SIZE, ObjectKey, ObjectStorage, ObjectStoreStorage, RetryConfig, S3UploadLister,
    StorageError, StorageOptions, UploadLister,
};
use diskless_testkit::storage::S3TestServer;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one create request of a multipart upload does instead of succeeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CreateFault {
    /// Creates the upload, then answers 503: the id is lost.
    CreateThenFail,
    /// Creates the upload, then never answers (cut by the attempt timeout): the id is lost.
    CreateThenHang,
    /// Answers 503 without creating anything.
    Unavailable,
    /// Answers 400 without creating anything.
    BadRequest,
}

/// A store whose create requests fail as scripted, through both multipart APIs, and which keeps
/// the model of the uploads the inner store holds in progress (created — answered or not — and
/// neither completed nor aborted).
#[derive(Debug)]
struct Faulty<S> {
    inner: Arc<S>,
    creates: Mutex<VecDeque<CreateFault>>,
    /// `(path, id)` of the uploads in progress on the inner store.
    in_progress: Mutex<BTreeSet<(String, MultipartId)>>,
    /// The ids aborted through the `MultipartStore` API.
    aborted: Mutex<Vec<MultipartId>>,
    create_requests: AtomicUsize,
}

impl<S> Faulty<S> {
    fn new(inner: S, creates: impl IntoIterator<Item = CreateFault>) -> Arc<Self> {
        Arc::new(Faulty {
            inner: Arc::new(inner),
            creates: Mutex::new(creates.into_iter().collect()),
            in_progress: Mutex::new(BTreeSet::new()),
            aborted: Mutex::new(Vec::new()),
            create_requests: AtomicUsize::new(0),
        })
    }

    fn in_progress(&self) -> Vec<MultipartId> {
        self.in_progress
            .lock()
            .iter()
            .map(|(_, id)| id.clone())
            .collect()
    }

    fn aborted(&self) -> Vec<MultipartId> {
        self.aborted.lock().clone()
    }

    /// Runs `create` as the next scripted fault says.
    async fn create<T>(
        &self,
        create: impl Future<Output = object_store::Result<T>>,
        created: impl FnOnce(&T),
    ) -> object_store::Result<T> {
        self.create_requests.fetch_add(1, Ordering::SeqCst);
        let fault = self.creates.lock().pop_front();
        match fault {
            Some(CreateFault::Unavailable) => return Err(status("503 Service Unavailable")),
            Some(CreateFault::BadRequest) => return Err(status("400 Bad Request")),
            _ => {}
        }
        let upload = create.await?;
        created(&upload);
        match fault {
            Some(CreateFault::CreateThenFail) => Err(status("503 Service Unavailable")),
            Some(CreateFault::CreateThenHang) => std::future::pending().await,
            _ => Ok(upload),
        }
    }
}

#[async_trait]
impl<S: MultipartStore + std::fmt::Debug> MultipartStore for Faulty<S> {
    async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
        self.create_multipart_opts(path, PutMultipartOptions::default())
            .await
    }

    async fn create_multipart_opts(
        &self,
        path: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<MultipartId> {
        let create = self.inner.create_multipart_opts(path, opts);
        self.create(create, |id| {
            self.in_progress
                .lock()
                .insert((path.to_string(), id.clone()));
        })
        .await
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        self.inner.put_part(path, id, part_idx, data).await
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        let done = self.inner.complete_multipart(path, id, parts).await?;
        self.in_progress
            .lock()
            .remove(&(path.to_string(), id.clone()));
        Ok(done)
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
        self.inner.abort_multipart(path, id).await?;
        self.aborted.lock().push(id.clone());
        self.in_progress
            .lock()
            .remove(&(path.to_string(), id.clone()));
        Ok(())
    }
}

support::object_store_wrapper!(impl<S: ObjectStore> for Faulty<S> {
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // Not tracked: an upload of this API has no id to list or abort by.
        let create = self.inner.put_multipart_opts(location, opts);
        self.create(create, |_| {}).await
    }
});

/// An [`UploadLister`] over the model of [`Faulty`] (`InMemory` cannot list its uploads), whose
/// listings fail as scripted.
#[derive(Debug)]
struct ModelLister {
    store: Arc<Faulty<InMemory>>,
    /// Failures of the next listings: `true` a 503, `false` a 403.
    failures: Mutex<VecDeque<bool>>,
    calls: AtomicUsize,
}

#[async_trait]
impl UploadLister for ModelLister {
    async fn in_progress(&self, path: &Path) -> object_store::Result<Vec<MultipartId>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.failures.lock().pop_front() {
            Some(true) => return Err(status("503 Service Unavailable")),
            Some(false) => return Err(status("403 Forbidden")),
            None => {}
        }
        Ok(self
            .store
            .in_progress
            .lock()
            .iter()
            .filter(|(p, _)| p == path.as_ref())
            .map(|(_, id)| id.clone())
            .collect())
    }
}

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

/// An in-memory store whose creates fail as `creates` says, a storage over it with its
/// `MultipartStore` API, and the lister (given to the storage when `lister`).
fn in_memory(
    creates: impl IntoIterator<Item = CreateFault>,
    lister: bool,
) -> (Arc<Faulty<InMemory>>, Arc<ModelLister>, ObjectStoreStorage) {
    let store = Faulty::new(InMemory::new(), creates);
    let model = Arc::new(ModelLister {
        store: store.clone(),
        failures: Mutex::new(VecDeque::new()),
        calls: AtomicUsize::new(0),
    });
    let storage = ObjectStoreStorage::from_object_store(store.clone(), "root")
        .unwrap()
        .with_options(options())
        .unwrap()
        .with_multipart_store(store.clone());
    let storage = if lister {
        storage.with_upload_lister(model.clone())
    } else {
        storage
    };
    (store, model, storage)
}

/// `parts` full parts and a short last one.
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

async fn assert_object(storage: &ObjectStoreStorage, data: &Bytes) {
    let stored = storage.fetch(&key(), 0..data.len() as u64).await.unwrap();
    assert!(stored == *data, "the object differs from the data sent");
}

async fn assert_no_object(storage: &ObjectStoreStorage) {
    match storage.fetch(&key(), 0..1).await {
        Err(e) if e.is_not_found() => {}
        other => panic!("expected no object, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_upload_whose_create_answer_was_lost_is_aborted() {
    for fault in [CreateFault::CreateThenFail, CreateFault::CreateThenHang] {
        let (store, lister, storage) = in_memory([fault], true);
        let data = data(3);
        assert_eq!(
            stream_upload(&storage, &data).await.unwrap(),
            data.len() as u64,
            "{fault:?}"
        );
        assert_object(&storage, &data).await;
        // Two uploads were created; the one whose id was lost is aborted after the other
        // completed, found by listing the key's uploads in progress.
        assert_eq!(store.create_requests.load(Ordering::SeqCst), 2);
        assert_eq!(store.aborted().len(), 1, "{fault:?}");
        assert!(
            store.in_progress().is_empty(),
            "{fault:?}: uploads left in progress: {:?}",
            store.in_progress()
        );
        assert_eq!(lister.calls.load(Ordering::SeqCst), 1);
        let stats = storage.counters().snapshot();
        // Two creations, four parts, one completion; one listing; one abort.
        assert_eq!(
            (
                stats.put_requests,
                stats.list_requests,
                stats.delete_requests
            ),
            (7, 1, 1),
            "{fault:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_create_that_never_got_an_answer_leaves_no_upload() {
    // Every attempt (max_attempts = 3) creates an upload whose answer is lost: the call fails,
    // and the three uploads are aborted.
    let (store, _, storage) = in_memory([CreateFault::CreateThenFail; 3], true);
    let err = stream_upload(&storage, &data(2)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(store.create_requests.load(Ordering::SeqCst), 3);
    assert_eq!(store.aborted().len(), 3);
    assert!(store.in_progress().is_empty());
    assert_no_object(&storage).await;
    let stats = storage.counters().snapshot();
    assert_eq!((stats.list_requests, stats.delete_requests), (1, 3));
}

#[tokio::test(start_paused = true)]
async fn a_failed_upload_aborts_its_own_upload_and_the_lost_one() {
    let (store, _, storage) = in_memory([CreateFault::CreateThenFail], true);
    let data = data(3);
    // The stream fails after its first part: the upload is aborted, and so is the lost one.
    let chunks = diskless_testkit::storage::conformance::chunk_stream(&data, 512 * 1024)
        .take(MIN_PART_SIZE / (512 * 1024) + 2)
        .chain(futures::stream::once(async {
            Err(StorageError::Transient {
                source: "the producer failed".into(),
            })
        }))
        .boxed();
    let err = storage
        .upload_stream(&key(), chunks, MIN_PART_SIZE)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(store.aborted().len(), 2);
    assert!(store.in_progress().is_empty());
    assert_no_object(&storage).await;
    let stats = storage.counters().snapshot();
    assert_eq!((stats.list_requests, stats.delete_requests), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn only_ambiguous_create_failures_list_the_uploads() {
    // A 400 says nothing was created: no listing.
    let (store, lister, storage) = in_memory([CreateFault::BadRequest], true);
    let err = stream_upload(&storage, &data(2)).await.unwrap_err();
    assert!(matches!(err, StorageError::Permanent { .. }), "{err:?}");
    assert_eq!(lister.calls.load(Ordering::SeqCst), 0);
    assert!(store.aborted().is_empty());

    // A 503 may or may not have created one: the listing finds none, nothing is aborted.
    let (store, lister, storage) = in_memory([CreateFault::Unavailable], true);
    let data = data(2);
    stream_upload(&storage, &data).await.unwrap();
    assert_object(&storage, &data).await;
    assert_eq!(lister.calls.load(Ordering::SeqCst), 1);
    assert!(store.aborted().is_empty());
    assert_eq!(storage.counters().snapshot().delete_requests, 0);

    // No failure: no listing.
    let (_, lister, storage) = in_memory([], true);
    stream_upload(&storage, &data).await.unwrap();
    assert_eq!(lister.calls.load(Ordering::SeqCst), 0);
    assert_eq!(storage.counters().snapshot().list_requests, 0);
}

#[tokio::test(start_paused = true)]
async fn the_listing_is_retried_and_its_failure_does_not_fail_the_upload() {
    let data = data(2);
    // A 503, then the listing: the lost upload is aborted.
    let (store, lister, storage) = in_memory([CreateFault::CreateThenFail], true);
    lister.failures.lock().push_back(true);
    stream_upload(&storage, &data).await.unwrap();
    assert_eq!(lister.calls.load(Ordering::SeqCst), 2);
    assert_eq!(store.aborted().len(), 1);
    assert!(store.in_progress().is_empty());
    assert_eq!(storage.counters().snapshot().list_requests, 2);

    // A 403: logged; the upload itself succeeded, the lost one stays (to the lifecycle rule).
    let (store, lister, storage) = in_memory([CreateFault::CreateThenFail], true);
    lister.failures.lock().push_back(false);
    stream_upload(&storage, &data).await.unwrap();
    assert_object(&storage, &data).await;
    assert_eq!(lister.calls.load(Ordering::SeqCst), 1);
    assert!(store.aborted().is_empty());
    assert_eq!(store.in_progress().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_lister_or_a_multipart_store_the_lost_upload_is_only_reported() {
    let data = data(2);
    // No lister: nothing lists, the lost upload stays in progress (a warning names the key).
    let (store, lister, storage) = in_memory([CreateFault::CreateThenFail], false);
    assert!(storage.upload_lister().is_none());
    stream_upload(&storage, &data).await.unwrap();
    assert_eq!(lister.calls.load(Ordering::SeqCst), 0);
    assert_eq!(store.in_progress().len(), 1);
    assert_eq!(storage.counters().snapshot().list_requests, 0);

    // A lister but no `MultipartStore` (uploads through `MultipartUpload`, which aborts by
    // handle only): the lister is not called.
    let store = Faulty::new(InMemory::new(), [CreateFault::CreateThenFail]);
    let lister = Arc::new(ModelLister {
        store: store.clone(),
        failures: Mutex::new(VecDeque::new()),
        calls: AtomicUsize::new(0),
    });
    let storage = ObjectStoreStorage::from_object_store(store.clone(), "root")
        .unwrap()
        .with_options(options())
        .unwrap()
        .with_upload_lister(lister.clone());
    stream_upload(&storage, &data).await.unwrap();
    assert_object(&storage, &data).await;
    assert_eq!(store.create_requests.load(Ordering::SeqCst), 2);
    assert_eq!(lister.calls.load(Ordering::SeqCst), 0);
}

/// URL-safe base64 without padding: how s3s-fs names the files of a key.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// An [`UploadLister`] over the in-process S3 server's own records of uploads in progress
/// (s3s-fs keeps `.bucket-<b64>.object-<b64>.upload-<id>.metadata.json` per upload, removed on
/// completion and abort): what `ListMultipartUploads`, which s3s-fs lacks, would return.
#[derive(Debug)]
struct ServerUploads {
    root: std::path::PathBuf,
    bucket: String,
}

impl ServerUploads {
    fn ids(&self, path: &Path) -> Vec<MultipartId> {
        let prefix = format!(
            ".bucket-{}.object-{}.upload-",
            base64_url(self.bucket.as_bytes()),
            base64_url(path.as_ref().as_bytes())
        );
        let mut ids: Vec<MultipartId> = std::fs::read_dir(&self.root)
            .unwrap()
            .filter_map(|entry| {
                let name = entry.unwrap().file_name().into_string().unwrap();
                let id = name.strip_prefix(&prefix)?.strip_suffix(".metadata.json")?;
                Some(id.to_string())
            })
            .collect();
        ids.sort();
        ids
    }
}

#[async_trait]
impl UploadLister for ServerUploads {
    async fn in_progress(&self, path: &Path) -> object_store::Result<Vec<MultipartId>> {
        Ok(self.ids(path))
    }
}

/// Over S3's HTTP API: the create of the first upload lands on the server but is answered with a
/// 503; the upload retried completes, and the lost one is aborted on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_an_upload_whose_create_answer_was_lost_is_aborted_on_the_server() {
    let server = S3TestServer::start().await.unwrap();
    let store = Faulty::new(server.amazon_s3().unwrap(), [CreateFault::CreateThenFail]);
    let uploads = Arc::new(ServerUploads {
        root: server.root().to_path_buf(),
        bucket: server.bucket().to_string(),
    });
    let storage = ObjectStoreStorage::from_object_store(store.clone(), "tenant/a")
        .unwrap()
        .with_options(options())
        .unwrap()
        .with_multipart_store(store.clone())
        .with_upload_lister(uploads.clone());
    let path = Path::from("tenant/a/tiered/segment");
    let data = data(2);
    assert_eq!(
        stream_upload(&storage, &data).await.unwrap(),
        data.len() as u64
    );
    assert_object(&storage, &data).await;
    assert_eq!(store.create_requests.load(Ordering::SeqCst), 2);
    assert_eq!(store.aborted().len(), 1);
    assert_eq!(uploads.ids(&path), Vec::<MultipartId>::new());
    let leftovers: Vec<String> = std::fs::read_dir(server.root())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains("upload"))
        .collect();
    assert!(leftovers.is_empty(), "upload files left: {leftovers:?}");
    server.shutdown().await;
}

/// A one-request-per-connection HTTP server answering each request with the next canned
/// `(status line, body)`, recording the request lines.
async fn canned_http(
    answers: Vec<(&'static str, String)>,
) -> (String, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    let task = tokio::spawn(async move {
        for (status, body) in answers {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                socket.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let head = String::from_utf8(head).unwrap();
            seen.lock()
                .push(head.lines().next().unwrap_or_default().to_string());
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
        }
    });
    (endpoint, requests, task)
}

fn s3_lister(endpoint: &str) -> S3UploadLister {
    let options = ClientOptions::new().with_allow_http(true);
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_virtual_hosted_style_request(false)
        .with_bucket_name("bucket")
        .with_region("eu-west-1")
        .with_access_key_id("id")
        .with_secret_access_key("secret")
        .with_client_options(options.clone())
        .build()
        .unwrap();
    let client = ReqwestConnector::default().connect(&options).unwrap();
    S3UploadLister::new(Arc::new(store), client)
}

fn list_page(uploads: &[(&str, &str)], next: Option<(&str, &str)>) -> String {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListMultipartUploadsResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>bucket</Bucket>",
    );
    match next {
        Some((key, id)) => xml.push_str(&format!(
            "<NextKeyMarker>{key}</NextKeyMarker><NextUploadIdMarker>{id}</NextUploadIdMarker>\
             <IsTruncated>true</IsTruncated>"
        )),
        None => xml.push_str("<IsTruncated>false</IsTruncated>"),
    }
    for (key, id) in uploads {
        xml.push_str(&format!(
            "<Upload><Key>{key}</Key><UploadId>{id}</UploadId>\
             <StorageClass>STANDARD</StorageClass></Upload>"
        ));
    }
    xml.push_str("</ListMultipartUploadsResult>");
    xml
}

#[tokio::test]
async fn s3_lister_sends_signed_paged_list_multipart_uploads_requests() {
    let page_1 = list_page(
        &[("root/seg", "id-1"), ("root/seg-2", "other")],
        Some(("root/seg-2", "other")),
    );
    let page_2 = list_page(&[("root/seg", "id-2")], None);
    let (endpoint, requests, task) =
        canned_http(vec![("200 OK", page_1), ("200 OK", page_2)]).await;
    let lister = s3_lister(&endpoint);
    let ids = lister.in_progress(&Path::from("root/seg")).await.unwrap();
    assert_eq!(ids, ["id-1", "id-2"]);
    task.await.unwrap();
    let requests = requests.lock().clone();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        // A GET of the bucket's root, `uploads` and the key as prefix, presigned (SigV4).
        assert!(
            request.starts_with("GET /bucket/?uploads=&prefix=root%2Fseg"),
            "{request}"
        );
        assert!(request.contains("X-Amz-Signature="), "{request}");
    }
    assert!(!requests[0].contains("marker"), "{}", requests[0]);
    assert!(
        requests[1].contains("&key-marker=root%2Fseg-2&upload-id-marker=other&"),
        "{}",
        requests[1]
    );
}

#[tokio::test]
async fn s3_lister_reports_error_statuses_as_object_store_does() {
    let (endpoint, _, task) = canned_http(vec![
        (
            "503 Service Unavailable",
            "<Error><Code>SlowDown</Code></Error>".into(),
        ),
        ("200 OK", "<ListBucketResult/>".into()),
    ])
    .await;
    let lister = s3_lister(&endpoint);
    let path = Path::from("root/seg");
    let err = lister.in_progress(&path).await.unwrap_err().to_string();
    assert!(
        err.contains("status code: 503 Service Unavailable") && err.contains("SlowDown"),
        "{err}"
    );
    let err = lister.in_progress(&path).await.unwrap_err().to_string();
    assert!(
        err.contains("malformed ListMultipartUploadsResult"),
        "{err}"
    );
    task.await.unwrap();
}

/// `from_url` gives S3 storages a lister sending through the store's own client and signer: the
/// in-process server authenticates its request (s3s checks SigV4) and then answers 501, s3s-fs
/// having no `ListMultipartUploads` — not 403 — whereas an unsigned request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_storages_from_url_have_a_lister_the_server_authenticates() {
    let none = std::iter::empty::<(&str, &str)>();
    let memory = ObjectStoreStorage::from_url("memory:///root", none).unwrap();
    assert!(memory.upload_lister().is_none());
    let server = S3TestServer::start().await.unwrap();
    let storage = server.storage("tenant").unwrap();
    let lister = storage.upload_lister().unwrap();
    let err = lister
        .in_progress(&Path::from("tenant/tiered/segment"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("status code: 501"), "{err}");

    let unsigned = format!(
        "{}/{}/?uploads=&prefix=x",
        server.endpoint(),
        server.bucket()
    );
    let client = ReqwestConnector::default()
        .connect(&ClientOptions::new().with_allow_http(true))
        .unwrap();
    let mut request =
        object_store::client::HttpRequest::new(object_store::client::HttpRequestBody::empty());
    *request.uri_mut() = unsigned.parse().unwrap();
    let response = client.execute(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 403);
    server.shutdown().await;
}

/// The model lister lists the uploads of exactly the key asked (as S3's listing, filtered).
#[tokio::test(start_paused = true)]
async fn the_model_lister_lists_only_the_key() {
    let (store, lister, _) = in_memory([], true);
    let a = store.create_multipart(&Path::from("root/a")).await.unwrap();
    store
        .create_multipart(&Path::from("root/ab"))
        .await
        .unwrap();
    let listed = lister.in_progress(&Path::from("root/a")).await.unwrap();
    assert_eq!(listed, vec![a]);
}
