//! An S3 server in-process on 127.0.0.1, for tests against a real S3 HTTP endpoint (feature
//! `s3-server`).
//!
//! It is [`s3s`]'s S3 protocol layer (request parsing, SigV4 authentication) over [`s3s_fs`]'s
//! filesystem backend in a temporary directory, served by hyper on an ephemeral port.
//!
//! Create-only uploads: `object_store` sends `PUT` with `If-None-Match: *` for
//! `PutMode::Create` (its default `S3ConditionalPut::ETagMatch` mode); s3s-fs 0.14.1 honours the
//! header and answers `412 Precondition Failed` when the object exists, which `object_store`
//! reports as `AlreadyExists`. s3s-fs checks then writes, so two *concurrent* creates of the same
//! key may both succeed (last writer wins); real S3 evaluates the condition atomically (since
//! August 2024: one of two concurrent conditional PUTs gets 412, or 409 `ConditionalRequestConflict`
//! while the other is in flight). Tests here never race two uploads of one key.
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
use std::net::SocketAddr;
use tokio::task::JoinHandle;

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
        let root = tempfile::tempdir()?;
        std::fs::create_dir(root.path().join(Self::BUCKET))?;
        let fs = s3s_fs::FileSystem::new(root.path())
            .map_err(|e| std::io::Error::other(format!("s3s-fs: {e:?}")))?;
        let service = {
            let mut builder = s3s::service::S3ServiceBuilder::new(fs);
            builder.set_auth(s3s::auth::SimpleAuth::from_single(
                Self::ACCESS_KEY,
                Self::SECRET_KEY,
            ));
            builder.build()
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
