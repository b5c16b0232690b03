//! The state shared by every logical broker of the process, and how it is built from the
//! configuration: object storage, coordinator, cache, one `WalWriter` per broker, the `Fetcher`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use diskless_cache::{
    DiskCache, DiskCacheConfig, LocalCache, MokaCache, MokaCacheConfig, TwoTierCache,
};
#[cfg(not(feature = "testkit"))]
use diskless_coordinator::OpenError;
use diskless_coordinator::sharded::ShardedCoordinator;
use diskless_coordinator::{
    BatchCoordinator, Clock, OpenOptions, OpenedCoordinator, SystemClock, open_coordinator,
};
use diskless_core::lifecycle::{CleanerConfig, OrphanConfig, TieringConfig};
use diskless_core::{
    DisklessNode, Fetcher, NodeConfig, NodeLifecycleConfig, WalWriter, WalWriterConfig,
};
use diskless_storage::{ObjectStorage, ObjectStoreStorage};
use tokio::sync::watch;
use tracing::info;

use crate::cluster::{Cluster, GatewayLeaders, Node};
use crate::config::Config;
#[cfg(not(feature = "testkit"))]
use crate::config::testkit_only;
use crate::group_coordinator::GroupCoordinator;
use crate::producer_ids::ProducerIds;
use crate::store::Store;
use crate::topics::{TopicDefaults, Topics};
use crate::txn_coordinator::TxnCoordinator;

/// Everything the request handlers need.
pub(crate) struct Broker {
    pub cluster: Cluster,
    pub coordinator: Arc<dyn BatchCoordinator>,
    pub clock: Arc<dyn Clock>,
    /// One writer per logical broker (node id → writer): each broker uploads its own WAL segments.
    pub writers: HashMap<i32, Arc<WalWriter>>,
    pub fetcher: Fetcher,
    pub topics: Topics,
    pub groups: Arc<GroupCoordinator>,
    /// The transaction coordinator (transactional ids, their state in `store`).
    pub txns: Arc<TxnCoordinator>,
    pub store: Store,
    /// Producer ids, in blocks from the coordinator.
    pub producer_ids: ProducerIds,
    /// Bumped after every successful produce: wakes long-polling fetches.
    pub commits: watch::Sender<u64>,
    /// The finalized `transaction.version` feature (1 or 2, `--transaction-version`).
    pub transaction_version: i16,
    /// The router when the coordinator is sharded (`--shards N > 1`).
    pub sharded: Option<Arc<ShardedCoordinator>>,
    /// The produce-gateway leaders of the current placements (sharded only), rebuilt when they change.
    gateways: parking_lot::Mutex<Option<Arc<GatewayLeaders>>>,
    /// The coordinator(s) as opened (every SQLite or PostgreSQL coordinator, one per shard),
    /// closed at shutdown.
    coordinators: OpenedCoordinator,
    /// The library's parts (writers, fetcher, lifecycle workers: retention, deletion of dead
    /// objects, orphans on the WAL and tiered prefixes, consolidation), closed at shutdown.
    node: parking_lot::Mutex<Option<DisklessNode>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// Opens the coordinator of `--coordinator` and `--shards` (the library's [`open_coordinator`]:
/// SQLite files in the data directory, `sqlite:`, `postgres:`, and `memory:` with the `testkit`
/// feature), refusing a data directory used with another `--shards`.
async fn open_coordinators(
    config: &Config,
    data_dir: &Path,
    clock: &Arc<dyn Clock>,
) -> Result<OpenedCoordinator, String> {
    let options = OpenOptions::new(data_dir)
        .with_url(config.coordinator_url.clone())
        .with_shards(config.shards);
    #[cfg(feature = "testkit")]
    let options = options.with_memory(|clock| {
        Arc::new(diskless_testkit::coordinator::InMemoryCoordinator::new(
            clock,
        ))
    });
    open_coordinator(&options, clock.clone())
        .await
        .map_err(|e| match e {
            // The command line refuses it already (`Config::parse`).
            #[cfg(not(feature = "testkit"))]
            OpenError::NoMemoryFactory { .. } => testkit_only("--coordinator memory://"),
            e => e.to_string(),
        })
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

impl Broker {
    /// Opens storage, coordinator and the broker store, and starts the writers.
    pub(crate) async fn open(config: &Config) -> Result<Arc<Broker>, String> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
        let data_dir = absolute(&config.data_dir)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);

        let storage: Arc<dyn ObjectStorage> = Arc::new(
            ObjectStoreStorage::from_url_or_data_dir(config.storage_url.as_deref(), &data_dir)
                .map_err(|e| format!("object storage: {e}"))?,
        );
        // Benchmarks only: an S3-like latency on every storage call (log-normal, seeded).
        #[cfg(feature = "testkit")]
        let storage: Arc<dyn ObjectStorage> = match config.storage_latency {
            Some((p50, p99)) => Arc::new(diskless_testkit::storage::FaultyStorage::new(
                storage,
                diskless_testkit::storage::FaultConfig::default().with_latency(Some(
                    diskless_testkit::storage::Latency::log_normal(p50, p99),
                )),
            )),
            None => storage,
        };
        // The command line refuses it already (`Config::parse`).
        #[cfg(not(feature = "testkit"))]
        if config.storage_latency.is_some() {
            return Err(testkit_only("--storage-latency-ms"));
        }

        let coordinators = open_coordinators(config, &data_dir, &clock).await?;
        let (coordinator, sharded, persistent) = (
            coordinators.coordinator.clone(),
            coordinators.sharded.clone(),
            coordinators.persistent,
        );
        // No commit fence to wire: every coordinator checks the commit deadline and the orphan
        // collector's fences inside its commit transaction. Orphan collection and consolidation
        // are gated on a coordinator that remembers across restarts: with one that forgets
        // everything, the objects of a previous run would be neither readable nor collectable.
        let orphan_check = config.orphan_check.filter(|_| persistent);
        let tiering = config.tiering_interval.filter(|_| persistent);

        let memory =
            MokaCache::new(MokaCacheConfig::default().with_max_bytes(config.cache_max_bytes))
                .map_err(|e| format!("cache: {e}"))?;
        // `--local-cache-dir`: the memory cache in front of verified blocks on local disk, which
        // survive a restart (KIP-1163's local segments for reads).
        let cache: Arc<dyn LocalCache> = match &config.local_cache_dir {
            Some(dir) => {
                let dir = absolute(dir)?;
                let disk = DiskCache::open(
                    DiskCacheConfig::new(&dir).with_max_bytes(config.local_cache_bytes),
                )
                .await
                .map_err(|e| format!("local cache {}: {e}", dir.display()))?;
                Arc::new(TwoTierCache::new(memory, disk))
            }
            None => Arc::new(memory),
        };

        let mut tiering_config = TieringConfig::default();
        if let Some(age) = config.tiering_min_age {
            tiering_config = tiering_config.with_min_age(age);
        }
        if let Some(builds) = config.tiering_builds {
            tiering_config = tiering_config.with_max_concurrent_builds(builds);
        }
        let mut orphans = OrphanConfig::default();
        if let Some(age) = config.orphan_min_age {
            orphans = orphans.with_max_commit_age(age);
        }
        if let Some(delay) = config.orphan_recheck {
            orphans = orphans.with_recheck_delay(delay);
        }
        let mut cleaner = CleanerConfig::default();
        if let Some(grace) = config.cleaner_grace {
            cleaner = cleaner.with_grace(grace);
        }
        let node_config = NodeConfig::default()
            .with_broker_ids(config.listeners.iter().map(|l| l.node_id).collect())
            .with_writer(
                WalWriterConfig::default()
                    .with_commit_interval(config.commit_interval)
                    .with_seal_policy(config.seal_policy)
                    .with_hedge_uploads_after(config.hedge_uploads_after)
                    .with_buffer_max_bytes(config.buffer_max_bytes)
                    .with_max_pending_bytes(
                        config.buffer_max_bytes.saturating_mul(8).max(64 << 20),
                    ),
            )
            .with_lifecycle(
                NodeLifecycleConfig::default()
                    .with_retention_interval(Some(config.retention_check))
                    .with_cleaner_interval(Some(config.retention_check))
                    .with_cleaner(cleaner)
                    .with_orphans_interval(orphan_check)
                    .with_orphans(orphans)
                    .with_tiering_interval(tiering)
                    .with_tiering(tiering_config),
            );
        // The one composition point: metrics layers on storage and coordinator (every storage
        // and coordinator call: `diskless_storage_*`, `diskless_coordinator_seconds`; without
        // `--metrics-addr` no recorder is installed and each emission is a no-op), one writer per
        // logical broker, the fetcher, and the lifecycle workers.
        let node = DisklessNode::builder(storage, coordinator)
            .with_cache(cache)
            .with_clock(clock.clone())
            .with_config(node_config)
            .build()
            .map_err(|e| format!("diskless node: {e}"))?;
        let coordinator = node.coordinator().clone();
        let writers: HashMap<i32, Arc<WalWriter>> = node
            .writers()
            .iter()
            .map(|(id, w)| (*id, w.clone()))
            .collect();
        let fetcher = node.fetcher().clone();
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
            seal_policy = ?config.seal_policy,
            hedge_uploads_after = ?config.hedge_uploads_after,
            shards = config.shards,
            orphan_collection = orphan_check.is_some(),
            tiering_interval = ?tiering,
            local_cache = ?config.local_cache_dir,
            segment_ms = config.segment_ms,
            segment_bytes = config.segment_bytes,
            "diskless broker state opened"
        );
        let topics = Topics::with_defaults(
            coordinator.clone(),
            TopicDefaults::of(config),
            store.clone(),
        );
        Ok(Arc::new(Broker {
            cluster,
            coordinator,
            clock,
            writers,
            fetcher,
            topics,
            groups: GroupCoordinator::new(),
            txns: TxnCoordinator::new(),
            store,
            producer_ids: ProducerIds::default(),
            commits: watch::channel(0).0,
            transaction_version: config.transaction_version,
            sharded,
            gateways: parking_lot::Mutex::new(None),
            coordinators,
            node: parking_lot::Mutex::new(Some(node)),
        }))
    }

    /// The produce-gateway leaders of the current placements, when the coordinator is sharded.
    pub(crate) fn gateway_leaders(&self) -> Option<Arc<GatewayLeaders>> {
        let router = self.sharded.as_ref()?;
        let placements = router.placements();
        let mut cached = self.gateways.lock();
        if let Some(g) = cached.as_ref().filter(|g| g.is_for(&placements)) {
            return Some(g.clone());
        }
        let g = Arc::new(GatewayLeaders::new(&self.cluster.nodes, placements));
        *cached = Some(g.clone());
        Some(g)
    }

    /// Creates the topics of `--create-topic` that do not exist yet.
    pub(crate) async fn create_startup_topics(
        &self,
        topics: &[(String, i32)],
    ) -> Result<(), String> {
        for (name, partitions) in topics {
            match self.topics.by_name(name).await {
                Ok(Some(t)) => info!(topic = %name, partitions = t.partitions, "topic exists"),
                Ok(None) => {
                    let topic_id = crate::random_uuid();
                    self.coordinator
                        .create_topic(diskless_coordinator::CreateTopicRequest {
                            topic_id,
                            name: name.clone(),
                            partitions: *partitions,
                            config: self.topics.defaults().topic_config(),
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
    pub(crate) async fn close(&self) {
        let node = self.node.lock().take();
        if let Some(node) = node {
            node.close().await;
        }
        self.store.close().await;
        self.coordinators.close().await;
    }
}

// The kinds, files and guard rails of `open_coordinator` are tested in diskless-coordinator
// (tests/open.rs); these check that the command line reaches it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Parsed;
    use diskless_coordinator::SHARD_MAP_FILE;

    fn config(args: &[&str]) -> Config {
        match Config::parse(args.iter().map(|s| s.to_string())).unwrap() {
            Parsed::Run(c) => *c,
            Parsed::Help => panic!("help"),
        }
    }

    #[tokio::test]
    async fn shards_and_the_coordinator_url_reach_the_library() {
        let dir = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let c = open_coordinators(&config(&["--shards", "3"]), dir.path(), &clock)
            .await
            .unwrap();
        assert!(c.persistent);
        assert_eq!(c.sqlite.len(), 3);
        assert_eq!(c.sharded.as_ref().unwrap().shard_count(), 3);
        c.close().await;
        for i in 0..3 {
            assert!(
                dir.path()
                    .join(format!("coordinator-shard-{i}.db"))
                    .exists()
            );
        }

        // The guard rail's message names the option.
        let err = open_coordinators(&config(&[]), dir.path(), &clock)
            .await
            .err()
            .unwrap();
        assert!(err.contains("--shards"), "{err}");

        let url = format!("sqlite://{}/x.db", dir.path().display());
        let c = open_coordinators(
            &config(&["--coordinator", &url]),
            &dir.path().join("elsewhere"),
            &clock,
        )
        .await
        .unwrap();
        assert!(c.sharded.is_none() && c.persistent);
        c.close().await;
        assert!(dir.path().join("x.db").exists());
    }

    #[cfg(feature = "testkit")]
    #[tokio::test]
    async fn sharded_memory_coordinators_keep_their_map_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let c = open_coordinators(
            &config(&["--shards", "4", "--coordinator", "memory://"]),
            dir.path(),
            &clock,
        )
        .await
        .unwrap();
        assert!(!c.persistent);
        assert_eq!(c.sharded.as_ref().unwrap().shard_count(), 4);
        assert!(!dir.path().join(SHARD_MAP_FILE).exists());
    }
}
