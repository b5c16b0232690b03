//! The conformance suite of diskless-testkit against every backend: in memory, the local
//! filesystem (a temp dir) and S3 over HTTP (an in-process s3s server).

use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use diskless_testkit::storage::{S3TestServer, conformance};
use std::sync::Arc;

#[tokio::test]
async fn in_memory_passes_conformance() {
    conformance::run_all(|| async {
        Arc::new(ObjectStoreStorage::in_memory()) as Arc<dyn ObjectStorage>
    })
    .await;
}

#[tokio::test]
async fn in_memory_url_with_prefix_passes_conformance() {
    conformance::run_all(|| async {
        Arc::new(
            ObjectStoreStorage::from_url("memory:///root/prefix", Vec::<(String, String)>::new())
                .unwrap(),
        ) as Arc<dyn ObjectStorage>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_filesystem_passes_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    conformance::run_all(|| {
        let path = path.clone();
        async move { Arc::new(ObjectStoreStorage::local_fs(&path).unwrap()) as Arc<dyn ObjectStorage> }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_over_http_passes_conformance() {
    let server = S3TestServer::start().await.unwrap();
    let server_ref = &server;
    conformance::run_all(|| async move {
        Arc::new(server_ref.storage("").unwrap()) as Arc<dyn ObjectStorage>
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_over_http_with_prefix_and_own_client_passes_conformance() {
    let server = S3TestServer::start().await.unwrap();
    let s3 = Arc::new(server.amazon_s3().unwrap());
    conformance::run_all(|| {
        let s3 = s3.clone();
        async move {
            Arc::new(ObjectStoreStorage::from_object_store(s3, "tenant/a").unwrap())
                as Arc<dyn ObjectStorage>
        }
    })
    .await;
    server.shutdown().await;
}
