//! Request accounting, ranged reads, URL construction and local durability.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use diskless_common::SystemClock;
use diskless_storage::{
    CountingStorage, ObjectKey, ObjectStorage, ObjectStoreStorage, RandomKeys, RangeReadConfig,
    StorageError, fetch_ranges,
};
use diskless_testkit::storage::S3TestServer;
use futures::TryStreamExt;

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
