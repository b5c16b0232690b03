//! The state shared by every logical broker of the process, and how it is built from the
//! configuration: object storage, coordinator, cache, one `WalWriter` per broker, the `Fetcher`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions};
use diskless_coordinator::{BatchCoordinator, Clock, SystemClock};
use diskless_core::lifecycle::{
    CleanerConfig, Lifecycle, LifecycleHandle, ObjectCleaner, RetentionConfig, RetentionEnforcer,
};
use diskless_core::{Fetcher, FetcherConfig, WalWriter, WalWriterConfig};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use tokio::sync::watch;
use tracing::info;

use crate::cluster::{Cluster, Node};
use crate::config::Config;
use crate::groups::GroupCoordinator;
use crate::store::Store;
use crate::topics::Topics;

/// Everything the request handlers need.
pub struct Broker {
    pub cluster: Cluster,
    pub coordinator: Arc<dyn BatchCoordinator>,
    pub clock: Arc<dyn Clock>,
    /// One writer per logical broker (node id → writer): each broker uploads its own WAL segments.
    pub writers: HashMap<i32, Arc<WalWriter>>,
    pub fetcher: Fetcher,
    pub topics: Topics,
    pub groups: Arc<GroupCoordinator>,
    pub store: Store,
    /// Bumped after every successful produce: wakes long-polling fetches.
    pub commits: watch::Sender<u64>,
    sqlite: Option<Arc<SqliteCoordinator>>,
    /// Retention and deletion of dead objects.
    lifecycle: parking_lot::Mutex<Option<LifecycleHandle>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

impl Broker {
    /// Opens storage, coordinator and the broker store, and starts the writers.
    pub async fn open(config: &Config) -> Result<Arc<Broker>, String> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
        let data_dir = absolute(&config.data_dir)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);

        let storage: Arc<dyn ObjectStorage> = match &config.storage_url {
            None => Arc::new(
                ObjectStoreStorage::local_fs(data_dir.join("objects"))
                    .map_err(|e| format!("object storage: {e}"))?,
            ),
            Some(url) => Arc::new(
                ObjectStoreStorage::from_url(url, std::iter::empty::<(&str, &str)>())
                    .map_err(|e| format!("object storage {url}: {e}"))?,
            ),
        };

        let mut sqlite = None;
        let coordinator: Arc<dyn BatchCoordinator> = match config.coordinator_url.as_deref() {
            None => {
                let c = Arc::new(
                    SqliteCoordinator::open(
                        data_dir.join("coordinator.db"),
                        SqliteOptions::default(),
                        clock.clone(),
                    )
                    .await
                    .map_err(|e| format!("coordinator: {e}"))?,
                );
                sqlite = Some(c.clone());
                c
            }
            Some(url) if url.starts_with("sqlite:") => {
                let c = Arc::new(
                    SqliteCoordinator::open_url(url, SqliteOptions::default(), clock.clone())
                        .await
                        .map_err(|e| format!("coordinator {url}: {e}"))?,
                );
                sqlite = Some(c.clone());
                c
            }
            Some(url) if url.starts_with("postgres:") || url.starts_with("postgresql:") => {
                Arc::new(
                    PostgresCoordinator::connect(PostgresOptions::new(url), clock.clone())
                        .await
                        .map_err(|e| format!("coordinator {url}: {e}"))?,
                )
            }
            Some(url) if url.starts_with("memory:") => Arc::new(
                diskless_testkit::coordinator::InMemoryCoordinator::new(clock.clone()),
            ),
            Some(url) => return Err(format!("unsupported coordinator URL {url:?}")),
        };

        let cache: Arc<dyn LocalCache> = Arc::new(MokaCache::new(
            MokaCacheConfig::default().with_max_bytes(config.cache_max_bytes),
        ));

        let mut writers = HashMap::new();
        for l in &config.listeners {
            let writer = WalWriter::new(
                WalWriterConfig {
                    broker_id: l.node_id,
                    commit_interval: config.commit_interval,
                    buffer_max_bytes: config.buffer_max_bytes,
                    max_pending_bytes: (config.buffer_max_bytes * 8).max(64 << 20),
                    ..WalWriterConfig::default()
                },
                storage.clone(),
                coordinator.clone(),
                Some(cache.clone()),
                clock.clone(),
            )
            .map_err(|e| format!("writer of broker {}: {e}", l.node_id))?;
            writers.insert(l.node_id, Arc::new(writer));
        }
        let fetcher = Fetcher::new(
            FetcherConfig::default(),
            storage.clone(),
            coordinator.clone(),
            Some(cache.clone()),
        );
        let lifecycle = Lifecycle::new()
            .retention(
                RetentionEnforcer::new(coordinator.clone(), RetentionConfig::default()),
                config.retention_check,
            )
            .cleaner(
                ObjectCleaner::new(
                    coordinator.clone(),
                    storage.clone(),
                    Some(cache),
                    clock.clone(),
                    CleanerConfig::default(),
                ),
                config.retention_check,
            )
            .spawn();
        let store = Store::open(&data_dir.join("broker.db"))
            .await
            .map_err(|e| e.to_string())?;
        let cluster = Cluster {
            nodes: config
                .listeners
                .iter()
                .map(|l| Node {
                    id: l.node_id,
                    host: l.advertised_host.clone(),
                    port: i32::from(l.bind.port()),
                    rack: l.rack.clone(),
                })
                .collect(),
            cluster_id: config.cluster_id.clone(),
        };
        info!(
            data_dir = %data_dir.display(),
            storage = config.storage_url.as_deref().unwrap_or("file://<data-dir>/objects"),
            coordinator = config.coordinator_url.as_deref().unwrap_or("sqlite://<data-dir>/coordinator.db"),
            commit_interval_ms = config.commit_interval.as_millis() as u64,
            "diskless broker state opened"
        );
        let topics = Topics::new(coordinator.clone());
        Ok(Arc::new(Broker {
            cluster,
            coordinator,
            clock,
            writers,
            fetcher,
            topics,
            groups: GroupCoordinator::new(),
            store,
            commits: watch::channel(0).0,
            sqlite,
            lifecycle: parking_lot::Mutex::new(Some(lifecycle)),
        }))
    }

    /// Creates the topics of `--create-topic` that do not exist yet.
    pub async fn create_startup_topics(&self, topics: &[(String, i32)]) -> Result<(), String> {
        for (name, partitions) in topics {
            match self.topics.by_name(name).await {
                Ok(Some(t)) => info!(topic = %name, partitions = t.partitions, "topic exists"),
                Ok(None) => {
                    let topic_id = uuid::Uuid::new_v4();
                    self.coordinator
                        .create_topic(diskless_coordinator::CreateTopicRequest {
                            topic_id,
                            name: name.clone(),
                            partitions: *partitions,
                            config: diskless_coordinator::TopicConfig::default(),
                        })
                        .await
                        .map_err(|e| format!("cannot create topic {name}: {e}"))?;
                    self.topics.invalidate();
                    info!(topic = %name, %topic_id, partitions, "diskless topic created");
                }
                Err(e) => return Err(format!("cannot list topics: {e}")),
            }
        }
        Ok(())
    }

    /// Flushes and stops the writers, closes the databases.
    pub async fn close(&self) {
        let lifecycle = self.lifecycle.lock().take();
        if let Some(handle) = lifecycle {
            handle.shutdown().await;
        }
        for writer in self.writers.values() {
            writer.close().await;
        }
        self.store.close().await;
        if let Some(c) = &self.sqlite {
            c.close().await;
        }
    }
}
