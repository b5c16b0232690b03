//! `s3://` URLs take endpoint, region and credentials from the standard AWS environment variables
//! (issue 17 item 4). Its own test binary: it sets process environment variables.

use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
use diskless_testkit::storage::S3TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_urls_read_the_standard_aws_environment() {
    let server = S3TestServer::start().await.unwrap();
    // SAFETY: this test binary runs this one test; nothing else reads the environment concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT", server.endpoint());
        std::env::set_var("AWS_DEFAULT_REGION", server.region());
        std::env::set_var("AWS_ACCESS_KEY_ID", server.access_key());
        std::env::set_var("AWS_SECRET_ACCESS_KEY", server.secret_key());
        std::env::set_var("AWS_ALLOW_HTTP", "true");
    }
    // Virtual-hosted style cannot reach a local server: the URL's parameter completes the env.
    let storage = ObjectStoreStorage::from_url(
        &format!(
            "{}?aws_virtual_hosted_style_request=false",
            server.url("env")
        ),
        std::iter::empty::<(&str, &str)>(),
    )
    .unwrap();
    let key = ObjectKey::parse("wal/object").unwrap();
    storage
        .upload(&key, &[bytes::Bytes::from_static(b"hello")])
        .await
        .unwrap();
    assert_eq!(&storage.fetch(&key, 0..5).await.unwrap()[..], b"hello");
    // An explicit option overrides the environment: a wrong secret is refused by the server.
    let wrong = ObjectStoreStorage::from_url(
        &format!(
            "{}?aws_virtual_hosted_style_request=false",
            server.url("env")
        ),
        [("aws_secret_access_key", "not-the-secret")],
    )
    .unwrap();
    assert!(wrong.fetch(&key, 0..5).await.is_err());
    server.shutdown().await;
}
