//! `open_coordinator`: the kinds of coordinator URL, the files in the data directory, the shard
//! map surviving a restart, and the guard rails between sharded and unsharded data directories.
//!
//! The PostgreSQL case runs against `DISKLESS_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) in fresh schemas dropped at the end, and is skipped
//! without a server unless `DISKLESS_REQUIRE_POSTGRES=1`.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use diskless_coordinator::{
    BatchCoordinator, Clock, CreateTopicRequest, OpenError, OpenOptions, OpenedCoordinator,
    SHARD_MAP_FILE, SystemClock, TopicConfig, open_coordinator,
};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::postgres::{Schema, pg_url};
use std::path::Path;
use std::sync::Arc;
use uuid::Uuid;

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

async fn open(options: &OpenOptions) -> Result<OpenedCoordinator, OpenError> {
    open_coordinator(options, clock()).await
}

/// Creates topic `name` with `partitions` partitions on `c` (each test its own coordinators, so a
/// fixed id); its id.
async fn create_topic(c: &dyn BatchCoordinator, name: &str, partitions: i32) -> Uuid {
    let topic_id = Uuid::from_u128(0x7e57_0000 + partitions as u128);
    c.create_topic(CreateTopicRequest {
        topic_id,
        name: name.into(),
        partitions,
        config: TopicConfig::default(),
    })
    .await
    .unwrap();
    topic_id
}

/// The shards a topic's partitions are placed on, sorted and deduplicated.
fn used_shards(c: &OpenedCoordinator, topic_id: Uuid) -> Vec<u32> {
    let placements = c.sharded.as_ref().unwrap().placements();
    let mut used: Vec<u32> = placements[&topic_id].to_vec();
    used.sort_unstable();
    used.dedup();
    used
}

#[tokio::test]
async fn sharded_sqlite_files_and_map_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sharded = OpenOptions::new(dir.path()).with_shards(3);
    let c = open(&sharded).await.unwrap();
    assert!(c.persistent);
    assert_eq!(c.sqlite.len(), 3);
    assert!(c.postgres.is_empty());
    let topic_id = create_topic(&*c.coordinator, "t", 7).await;
    let placements = c.sharded.as_ref().unwrap().placements();
    assert_eq!(used_shards(&c, topic_id), vec![0, 1, 2]);
    c.close().await;
    for i in 0..3 {
        assert!(
            dir.path()
                .join(format!("coordinator-shard-{i}.db"))
                .exists()
        );
    }
    assert!(dir.path().join(SHARD_MAP_FILE).exists());
    assert!(!dir.path().join("coordinator.db").exists());

    // A restart routes identically and sees the topic.
    let c = open(&sharded).await.unwrap();
    assert_eq!(c.sharded.as_ref().unwrap().placements(), placements);
    let topics = c.coordinator.list_topics().await.unwrap();
    assert!(topics.iter().any(|t| t.topic_id == topic_id));
    c.close().await;

    // The sharded data directory is refused without shards, and a SQLite URL with shards.
    let err = open(&OpenOptions::new(dir.path())).await.err().unwrap();
    assert!(
        matches!(&err, OpenError::ShardedDataDirectory { path } if path == &dir.path().join(SHARD_MAP_FILE)),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(err.contains("--shards"), "{err}");
    let url = format!("sqlite://{}/x.db", dir.path().display());
    let with_url = sharded.clone().with_url(Some(url.clone()));
    let err = open(&with_url).await.err().unwrap();
    assert!(
        matches!(&err, OpenError::ShardedSqliteUrl { url: u, shards: 3 } if *u == url),
        "{err:?}"
    );
    assert!(!dir.path().join("x.db").exists());

    // Fewer shards than the stored map names are refused (the router's check).
    let err = open(&OpenOptions::new(dir.path()).with_shards(2))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, OpenError::Sharded { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("sharded coordinator: "),
        "{err}"
    );
}

#[tokio::test]
async fn an_unsharded_data_directory_is_refused_with_shards() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(&OpenOptions::new(dir.path())).await.unwrap();
    assert!(c.sharded.is_none() && c.persistent);
    assert_eq!(c.sqlite.len(), 1);
    c.close().await;
    assert!(dir.path().join("coordinator.db").exists());
    let err = open(&OpenOptions::new(dir.path()).with_shards(2))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, OpenError::UnshardedDataDirectory { shards: 2, .. }),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(err.contains("coordinator.db"), "{err}");
    // Nothing was created by the refused open.
    assert!(!dir.path().join(SHARD_MAP_FILE).exists());
    assert!(!dir.path().join("coordinator-shard-0.db").exists());
}

#[tokio::test]
async fn a_sharded_data_directory_without_topics_is_refused_unsharded() {
    // No topic yet, so no shard map: shard 0's database marks the directory as sharded.
    let dir = tempfile::tempdir().unwrap();
    let c = open(&OpenOptions::new(dir.path()).with_shards(2))
        .await
        .unwrap();
    c.close().await;
    assert!(!dir.path().join(SHARD_MAP_FILE).exists());
    let err = open(&OpenOptions::new(dir.path())).await.err().unwrap();
    assert!(
        matches!(&err, OpenError::ShardedDataDirectory { path } if path == &dir.path().join("coordinator-shard-0.db")),
        "{err:?}"
    );
    assert!(err.to_string().contains("--shards"), "{err}");
    assert!(!dir.path().join("coordinator.db").exists());
}

#[tokio::test]
async fn a_sqlite_url_opens_one_coordinator_there() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let url = format!("sqlite://{}/elsewhere.db", dir.path().display());
    let options = OpenOptions::new(&data_dir).with_url(Some(url));
    let c = open(&options).await.unwrap();
    assert!(c.sharded.is_none() && c.persistent);
    assert_eq!(c.sqlite.len(), 1);
    let topic_id = create_topic(&*c.coordinator, "t", 1).await;
    c.close().await;
    assert!(dir.path().join("elsewhere.db").exists());
    assert!(!data_dir.join("coordinator.db").exists());
    let c = open(&options).await.unwrap();
    let topics = c.coordinator.list_topics().await.unwrap();
    assert!(topics.iter().any(|t| t.topic_id == topic_id));
    c.close().await;
}

fn memory_options(dir: &Path) -> OpenOptions {
    OpenOptions::new(dir)
        .with_url(Some("memory://".into()))
        .with_memory(|clock| Arc::new(InMemoryCoordinator::new(clock)))
}

#[tokio::test]
async fn sharded_memory_coordinators_keep_their_map_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(&memory_options(dir.path()).with_shards(4))
        .await
        .unwrap();
    assert!(!c.persistent);
    assert_eq!(c.sharded.as_ref().unwrap().shard_count(), 4);
    assert!(!dir.path().join(SHARD_MAP_FILE).exists());
    assert!(c.sqlite.is_empty());
    let topic_id = create_topic(&*c.coordinator, "t", 8).await;
    assert_eq!(used_shards(&c, topic_id), vec![0, 1, 2, 3]);
}

#[tokio::test]
async fn memory_coordinators_ignore_the_data_directory() {
    // A sharded data directory does not stop an in-memory coordinator: nothing of it is read.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SHARD_MAP_FILE), "").unwrap();
    let c = open(&memory_options(dir.path())).await.unwrap();
    assert!(!c.persistent && c.sharded.is_none());
    create_topic(&*c.coordinator, "t", 1).await;
}

#[tokio::test]
async fn memory_needs_a_factory() {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions::new(dir.path()).with_url(Some("memory://".into()));
    let err = open(&options).await.err().unwrap();
    assert!(
        matches!(&err, OpenError::NoMemoryFactory { url } if url == "memory://"),
        "{err:?}"
    );
    assert!(err.to_string().contains("with_memory"), "{err}");
}

#[tokio::test]
async fn unknown_urls_and_zero_shards_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions::new(dir.path()).with_url(Some("mysql://u:pw@h/db".into()));
    let err = open(&options).await.err().unwrap();
    assert!(matches!(&err, OpenError::UnsupportedUrl(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.starts_with("unsupported coordinator URL"), "{err}");
    assert!(!err.contains("pw"), "the password is hidden: {err}");

    let err = open(&OpenOptions::new(dir.path()).with_shards(0))
        .await
        .err()
        .unwrap();
    assert!(matches!(&err, OpenError::InvalidOptions(_)), "{err:?}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}

#[tokio::test]
async fn a_coordinator_that_fails_to_open_names_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    // Shard 1's database path is a directory: shard 0 opens, shard 1 fails.
    std::fs::create_dir(dir.path().join("coordinator-shard-1.db")).unwrap();
    let err = open(&OpenOptions::new(dir.path()).with_shards(2))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            &err,
            OpenError::Coordinator {
                shard: Some(1),
                url: None,
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(err.starts_with("coordinator shard 1: "), "{err}");
    assert!(!dir.path().join(SHARD_MAP_FILE).exists());
}

#[tokio::test]
async fn sharded_postgres_uses_one_schema_per_shard() {
    let Some(url) = pg_url() else { return };
    let template = Schema::new(&url);
    // Dropped at the end (even when the test fails), like the template's own schema.
    let _shard_schemas: Vec<Schema> = (0..2)
        .map(|i| Schema {
            url: url.clone(),
            name: format!("{}_shard_{i}", template.name),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions::new(dir.path())
        .with_url(Some(url.clone()))
        .with_shards(2)
        .with_postgres(template.options());
    let c = open(&options).await.unwrap();
    assert!(c.persistent && c.sqlite.is_empty());
    assert_eq!(c.postgres.len(), 2);
    for (i, p) in c.postgres.iter().enumerate() {
        assert_eq!(p.options().schema, format!("{}_shard_{i}", template.name));
        assert_eq!(p.options().url, url);
    }
    let topic_id = create_topic(&*c.coordinator, "t", 4).await;
    let placements = c.sharded.as_ref().unwrap().placements();
    assert_eq!(used_shards(&c, topic_id), vec![0, 1]);
    c.close().await;
    assert!(dir.path().join(SHARD_MAP_FILE).exists());

    // A restart routes identically and sees the topic.
    let c = open(&options).await.unwrap();
    assert_eq!(c.sharded.as_ref().unwrap().placements(), placements);
    let topics = c.coordinator.list_topics().await.unwrap();
    assert!(topics.iter().any(|t| t.topic_id == topic_id));
    c.close().await;

    // Unsharded, the same data directory is refused.
    let err = open(&options.clone().with_shards(1)).await.err().unwrap();
    assert!(
        matches!(err, OpenError::ShardedDataDirectory { .. }),
        "{err:?}"
    );
}
