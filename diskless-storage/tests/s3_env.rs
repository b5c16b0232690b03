//! `s3://` URLs take endpoint, region and credentials from the standard AWS environment variables
//! (issue 17 item 4).
//!
//! The environment is given to a child process (this test binary again, running the ignored test
//! `child_reads_the_environment`), not set in this one: setting variables of a running process
//! is `unsafe`, which the workspace forbids.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
use diskless_testkit::storage::S3TestServer;
use std::process::Command;

/// Set in the child: the URL of the test server's bucket (the rest comes from `AWS_*`).
const CHILD_URL: &str = "DISKLESS_S3_ENV_TEST_URL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_urls_read_the_standard_aws_environment() {
    let server = S3TestServer::start().await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "child_reads_the_environment",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(CHILD_URL, server.url("env"))
        .env("AWS_ENDPOINT", server.endpoint())
        .env("AWS_DEFAULT_REGION", server.region())
        .env("AWS_ACCESS_KEY_ID", server.access_key())
        .env("AWS_SECRET_ACCESS_KEY", server.secret_key())
        .env("AWS_ALLOW_HTTP", "true");
    let output = tokio::task::spawn_blocking(move || child.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child test did not run: {stdout}"
    );
    server.shutdown().await;
}

/// Run by [`s3_urls_read_the_standard_aws_environment`] with the environment set; does nothing
/// when run on its own.
#[test]
#[ignore = "run in a child process by s3_urls_read_the_standard_aws_environment"]
fn child_reads_the_environment() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    // Virtual-hosted style cannot reach a local server: the URL's parameter completes the env.
    let url = format!("{url}?aws_virtual_hosted_style_request=false");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let storage =
            ObjectStoreStorage::from_url(&url, std::iter::empty::<(&str, &str)>()).unwrap();
        let key = ObjectKey::parse("wal/object").unwrap();
        storage
            .upload(&key, &[bytes::Bytes::from_static(b"hello")])
            .await
            .unwrap();
        assert_eq!(&storage.fetch(&key, 0..5).await.unwrap()[..], b"hello");
        // An explicit option overrides the environment: a wrong secret is refused by the server.
        let wrong =
            ObjectStoreStorage::from_url(&url, [("aws_secret_access_key", "not-the-secret")])
                .unwrap();
        assert!(wrong.fetch(&key, 0..5).await.is_err());
    });
}
