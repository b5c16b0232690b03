//! Request accounting, ranged reads, URL construction, local durability and streamed uploads.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use diskless_common::SystemClock;
use diskless_storage::{
    CountingStorage, MIN_PART_SIZE, ObjectKey, ObjectStorage, ObjectStoreStorage, RandomKeys,
    RangeReadConfig, StorageError, fetch_ranges,
};
use diskless_testkit::storage::S3TestServer;
use futures::{StreamExt, TryStreamExt};

fn no_options() -> Vec<(String, String)> {
    vec![]
}

/// A fresh key under `prefix`.
fn new_key(prefix: &str) -> ObjectKey {
    ObjectKey::generate(prefix, &RandomKeys::new(), &SystemClock).unwrap()
}

async fn uploaded(storage: &ObjectStoreStorage, len: usize) -> ObjectKey {
    let key = new_key("wal");
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    storage.upload(&key, &[Bytes::from(data)]).await.unwrap();
    key
}

#[tokio::test]
async fn ranged_read_helper_merges_near_ranges_into_one_get() {
    let storage = ObjectStoreStorage::in_memory();
    let key = uploaded(&storage, 10_000).await;
    storage.counters().reset();
    let config = RangeReadConfig::default().with_max_gap(100);
    let ranges = [2000..2100, 1000..1500, 1550..1990];
    let parts = fetch_ranges(&storage, &key, &ranges, &config)
        .await
        .unwrap();
    let stats = storage.counters().snapshot();
    assert_eq!(stats.get_requests, 1, "three near ranges, one GET");
    assert_eq!(stats.get_bytes, 1100);
    for (range, part) in ranges.iter().zip(&parts) {
        let expected: Vec<u8> = range.clone().map(|i| (i % 251) as u8).collect();
        assert_eq!(part, &expected);
    }

    storage.counters().reset();
    let far = [0..10, 5000..5010, 9990..10_000];
    fetch_ranges(&storage, &key, &far, &config).await.unwrap();
    assert_eq!(
        storage.counters().snapshot().get_requests,
        3,
        "far ranges, one GET each"
    );

    let err = fetch_ranges(&storage, &key, &[0..10, 9995..10_001], &config)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidRange { .. }), "{err:?}");
}

#[tokio::test]
async fn an_invalid_range_read_config_is_rejected_before_any_get() {
    let storage = ObjectStoreStorage::in_memory();
    let key = uploaded(&storage, 10).await;
    let config = RangeReadConfig::default().with_concurrency(0);
    let err = fetch_ranges(&storage, &key, &[0..1, 5..6], &config)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("range_read.concurrency"), "{err}");
    assert_eq!(storage.counters().snapshot().get_requests, 0);
}

#[tokio::test]
async fn counters_count_every_request_kind() {
    let storage = ObjectStoreStorage::in_memory();
    let keys = [uploaded(&storage, 10).await, uploaded(&storage, 20).await];
    storage.fetch(&keys[0], 0..5).await.unwrap();
    let listed: Vec<_> = storage.list("wal").try_collect().await.unwrap();
    assert_eq!(listed.len(), 2);
    storage.delete(&keys).await.unwrap();
    let stats = storage.counters().snapshot();
    assert_eq!(stats.put_requests, 2);
    assert_eq!(stats.put_bytes, 30);
    assert_eq!(stats.get_requests, 1);
    assert_eq!(stats.get_bytes, 5);
    assert_eq!(stats.list_requests, 1);
    assert_eq!(stats.listed_objects, 2);
    assert_eq!(stats.delete_requests, 1);
    assert_eq!(stats.deleted_keys, 2);
}

#[tokio::test]
async fn delete_batches_are_counted_per_thousand_keys() {
    let storage = ObjectStoreStorage::in_memory();
    let keys: Vec<ObjectKey> = (0..2500).map(|_| new_key("k")).collect();
    assert_eq!(storage.delete(&keys).await.unwrap().len(), 2500);
    let stats = storage.counters().snapshot();
    assert_eq!((stats.delete_requests, stats.deleted_keys), (3, 2500));
}

#[tokio::test]
async fn list_pages_are_counted() {
    let storage = ObjectStoreStorage::in_memory();
    for _ in 0..2001 {
        uploaded(&storage, 1).await;
    }
    let listed: Vec<_> = storage.list("wal").try_collect().await.unwrap();
    assert_eq!(listed.len(), 2001);
    assert_eq!(storage.counters().snapshot().list_requests, 3);
}

#[tokio::test]
async fn invalid_list_prefix_never_reaches_the_backend() {
    let storage = ObjectStoreStorage::in_memory();
    for bad in ["../x", "a//b", "/a", "a/"] {
        let r: Result<Vec<_>, _> = storage.list(bad).try_collect().await;
        assert!(matches!(r, Err(StorageError::InvalidKey { .. })), "{bad:?}");
    }
    assert_eq!(storage.counters().snapshot().list_requests, 0);
}

#[tokio::test]
async fn counting_wrapper_counts_calls_of_any_storage() {
    let storage = CountingStorage::new(ObjectStoreStorage::in_memory());
    let key = new_key("wal");
    storage
        .upload(
            &key,
            &[Bytes::from_static(b"abc"), Bytes::from_static(b"de")],
        )
        .await
        .unwrap();
    storage.fetch(&key, 1..4).await.unwrap();
    let _ = storage.fetch(&key, 1..40).await.unwrap_err();
    storage.delete(std::slice::from_ref(&key)).await.unwrap();
    let stats = storage.counters().snapshot();
    assert_eq!((stats.put_requests, stats.put_bytes), (1, 5));
    assert_eq!((stats.get_requests, stats.get_bytes), (2, 3));
    assert_eq!(stats.delete_requests, 1);
    // The wrapped storage counted its own requests too (the failed range costs a GET).
    assert_eq!(storage.inner().counters().snapshot().put_requests, 1);
}

#[test]
fn url_constructor_errors_are_config_errors() {
    let cases = [
        "not a url",
        "ftp://host/path",
        "file://relative-host/path",
        "memory:///bad//prefix",
        "memory:///a/%2E%2E%2E/b/%0A",
    ];
    for url in cases {
        match ObjectStoreStorage::from_url(url, no_options()) {
            Err(StorageError::Config(_) | StorageError::InvalidKey { .. }) => {}
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
    let err = ObjectStoreStorage::from_url("memory:///", [("aws_region", "x")]).unwrap_err();
    assert!(matches!(err, StorageError::Config(_)), "{err:?}");
    let err = ObjectStoreStorage::from_url("s3://bucket/p", [("no_such_option", "x")]).unwrap_err();
    assert!(err.to_string().contains("no_such_option"), "{err}");
    let mut off = vec![];
    if cfg!(not(feature = "gcs")) {
        off.push(("gs://bucket/p", "gcs"));
    }
    if cfg!(not(feature = "azure")) {
        off.push(("az://container/p", "azure"));
    }
    for (url, feature) in off {
        let err = ObjectStoreStorage::from_url(url, no_options()).unwrap_err();
        assert!(
            err.to_string().contains(&format!("`{feature}`")),
            "{url}: {err}"
        );
    }
}

#[test]
fn url_constructor_builds_each_enabled_backend() {
    let memory = ObjectStoreStorage::from_url("memory:///a/b", no_options()).unwrap();
    assert_eq!(memory.prefix(), "a/b");
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("sub").display());
    let local = ObjectStoreStorage::from_url(&url, no_options()).unwrap();
    assert_eq!(local.prefix(), "");
    assert!(dir.path().join("sub").is_dir());
    let s3 = ObjectStoreStorage::from_url(
        "s3://bucket/tenant/wal?aws_region=eu-west-1",
        [("aws_access_key_id", "a"), ("aws_secret_access_key", "b")],
    )
    .unwrap();
    assert_eq!(s3.prefix(), "tenant/wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_url_with_query_options_reaches_the_test_server() {
    let server = S3TestServer::start().await.unwrap();
    let query: Vec<String> = server
        .storage_options()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let url = format!("{}?{}", server.url("q/prefix"), query.join("&"));
    let storage = ObjectStoreStorage::from_url(&url, no_options()).unwrap();
    let key = uploaded(&storage, 100).await;
    assert_eq!(storage.fetch(&key, 99..100).await.unwrap().len(), 1);
    // The object is in the bucket directory under the URL's prefix.
    assert!(
        server
            .root()
            .join(server.bucket())
            .join("q/prefix")
            .join(key.as_str())
            .is_file()
    );
    // Create-only over HTTP: the second PUT is refused by If-None-Match and verified by a GET.
    storage.counters().reset();
    let err = storage
        .upload(&key, &[Bytes::from_static(b"other")])
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
    let stats = storage.counters().snapshot();
    // One GET compared the size; the body (of another size) was not downloaded.
    assert_eq!(
        (stats.put_requests, stats.get_requests, stats.get_bytes),
        (1, 1, 0)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn local_uploads_are_durable_files_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    // The store was built with fsync on (file and directory fsync before an upload returns).
    let debug = format!("{:?}", storage.object_store());
    assert!(debug.contains("fsync: true"), "{debug}");
    let key = uploaded(&storage, 4096).await;
    let file = dir.path().join(key.as_str());
    let on_disk = std::fs::read(&file).unwrap();
    assert_eq!(on_disk.len(), 4096);
    // No staging file left next to it.
    let siblings: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(siblings.len(), 1, "{siblings:?}");
    drop(storage);
    // A new process over the same directory sees the object, and create-only still holds.
    let reopened = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    assert_eq!(reopened.fetch(&key, 0..4096).await.unwrap(), on_disk);
    assert!(
        reopened
            .upload(&key, &[Bytes::from_static(b"x")])
            .await
            .is_err()
    );
}

/// `len` bytes of a pattern, as a stream of `chunk`-byte chunks.
fn stream_of(
    data: &Bytes,
    chunk: usize,
) -> futures::stream::BoxStream<'static, Result<Bytes, StorageError>> {
    diskless_testkit::storage::conformance::chunk_stream(data, chunk)
}

fn pattern(len: usize) -> Bytes {
    Bytes::from(diskless_testkit::storage::conformance::pattern(len, 42))
}

/// Every file under `dir`, recursively, relative to it.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut files = vec![];
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap();
                files.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn streamed_uploads_count_a_put_per_part_plus_create_and_complete() {
    let part = MIN_PART_SIZE;
    let storage = CountingStorage::new(ObjectStoreStorage::in_memory());
    for (len, puts, parts) in [
        (0, 1, 0),
        (part, 1, 0),
        (part + 1, 4, 2),
        (3 * part, 5, 3),
        (3 * part + 5, 6, 4),
    ] {
        let before = storage.inner().counters().snapshot();
        let counted_before = storage.counters().snapshot();
        let data = pattern(len);
        let size = storage
            .upload_stream(&new_key("tiered"), stream_of(&data, 100_000), part)
            .await
            .unwrap();
        assert_eq!(size, len as u64);
        let sent = storage.inner().counters().snapshot() - before;
        assert_eq!(
            (sent.put_requests, sent.put_parts, sent.put_bytes),
            (puts, parts, len as u64),
            "{len} bytes"
        );
        assert_eq!((sent.get_requests, sent.delete_requests), (0, 0));
        // The wrapper's estimate is exact for an upload that succeeded.
        assert_eq!(
            storage.counters().snapshot() - counted_before,
            sent,
            "{len} bytes"
        );
    }
}

#[tokio::test]
async fn a_streamed_upload_of_at_most_one_part_is_create_only() {
    let storage = ObjectStoreStorage::in_memory();
    let key = new_key("tiered");
    let data = pattern(1000);
    storage
        .upload_stream(&key, stream_of(&data, 300), MIN_PART_SIZE)
        .await
        .unwrap();
    // The same content again (a retry): fine; other content: refused, the object kept.
    storage
        .upload_stream(&key, stream_of(&data, 7), MIN_PART_SIZE)
        .await
        .unwrap();
    let other = pattern(999);
    let refused = storage
        .upload_stream(&key, stream_of(&other, 300), MIN_PART_SIZE)
        .await;
    assert!(
        matches!(refused, Err(StorageError::AlreadyExists { .. })),
        "{refused:?}"
    );
    assert_eq!(storage.fetch(&key, 0..1000).await.unwrap(), data);
}

#[tokio::test]
async fn local_streamed_uploads_leave_only_the_object_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    let data = pattern(2 * MIN_PART_SIZE + 10);
    let key = new_key("tiered");
    let size = storage
        .upload_stream(&key, stream_of(&data, 1 << 20), MIN_PART_SIZE)
        .await
        .unwrap();
    assert_eq!(size, data.len() as u64);
    assert_eq!(storage.counters().snapshot().put_parts, 3);
    assert_eq!(std::fs::read(dir.path().join(key.as_str())).unwrap(), data);
    assert_eq!(
        files_under(dir.path()),
        [key.as_str()],
        "no staging file left"
    );
    // A stream failing after two parts: the staging file is removed, nothing else appears.
    let failed = new_key("tiered");
    let failing = stream_of(&data, 1 << 20)
        .take(11)
        .chain(futures::stream::once(async {
            Err(StorageError::Config("producer failed".into()))
        }))
        .boxed();
    let result = storage.upload_stream(&failed, failing, MIN_PART_SIZE).await;
    assert!(matches!(result, Err(StorageError::Config(_))), "{result:?}");
    let stats = storage.counters().snapshot();
    assert_eq!((stats.put_parts, stats.delete_requests), (5, 1));
    assert_eq!(
        files_under(dir.path()),
        [key.as_str()],
        "no staging file left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_streamed_uploads_are_multipart_and_aborted_uploads_leave_no_parts() {
    let server = S3TestServer::start().await.unwrap();
    let storage = server.storage("").unwrap();
    let data = pattern(2 * MIN_PART_SIZE + 10);
    let key = new_key("tiered");
    storage
        .upload_stream(&key, stream_of(&data, 1 << 20), MIN_PART_SIZE)
        .await
        .unwrap();
    assert_eq!(storage.counters().snapshot().put_parts, 3);
    let failing = stream_of(&data, 1 << 20)
        .take(11)
        .chain(futures::stream::once(async {
            Err(StorageError::Config("producer failed".into()))
        }))
        .boxed();
    let failed = new_key("tiered");
    assert!(
        storage
            .upload_stream(&failed, failing, MIN_PART_SIZE)
            .await
            .is_err()
    );
    // The server (s3s-fs) keeps parts as `.upload_id-*` files at its root until completed or
    // aborted: none is left.
    let leftovers: Vec<String> = files_under(server.root())
        .into_iter()
        .filter(|f| f.contains(".upload_id-"))
        .collect();
    assert!(leftovers.is_empty(), "parts left: {leftovers:?}");
    let listed: Vec<_> = storage.list("tiered").try_collect().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].size, data.len() as u64);
    server.shutdown().await;
}
