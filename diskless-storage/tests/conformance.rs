//! The conformance suite of diskless-testkit against every backend, one test per case and backend
//! (`local_filesystem::create_only`, ...): in memory, the local filesystem (a temp dir) and S3
//! over HTTP (an in-process s3s server).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diskless_storage::ObjectStoreStorage;
use diskless_testkit::storage::S3TestServer;
use diskless_testkit::storage_conformance;
use std::sync::Arc;

storage_conformance!(in_memory, async || {
    Arc::new(ObjectStoreStorage::in_memory())
});

storage_conformance!(in_memory_url_with_prefix, async || {
    Arc::new(
        ObjectStoreStorage::from_url("memory:///root/prefix", Vec::<(String, String)>::new())
            .unwrap(),
    )
});

storage_conformance!(local_filesystem, async || {
    let dir = tempfile::tempdir().unwrap();
    let storage = ObjectStoreStorage::local_fs(dir.path()).unwrap();
    (Arc::new(storage), dir)
});

storage_conformance!(s3_over_http, async || {
    let server = S3TestServer::start().await.unwrap();
    let storage = server.storage("").unwrap();
    (Arc::new(storage), server)
});

storage_conformance!(s3_over_http_with_prefix_and_own_client, async || {
    let server = S3TestServer::start().await.unwrap();
    let s3 = Arc::new(server.amazon_s3().unwrap());
    let storage = ObjectStoreStorage::from_object_store(s3, "tenant/a").unwrap();
    (Arc::new(storage), server)
});
