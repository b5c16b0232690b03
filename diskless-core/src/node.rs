//! [`DisklessNode`]: the one composition point of a host.
//!
//! A host gives a storage, a coordinator, and optionally a cache, a clock and one
//! [`NodeConfig`]; the node wraps storage and coordinator in the metered layers once, builds
//! the writers (one per broker id the host serves), the fetcher and the standard lifecycle
//! workers — retention, the cleaner, producer expiry, orphan collection on the writers' prefix,
//! consolidation into tiered segments and orphan collection on the segments' prefix — and stops
//! them all with one [`DisklessNode::close`]. Settings shared by several parts are set once: the
//! cache block size (the writers' and the fetcher's must agree for freshly written segments to be
//! found in the cache) and the writers' key prefix (the orphan collector lists it). Workers of a
//! capability the coordinator does not serve ([`BatchCoordinator::capabilities`]) are not started;
//! tiering also needs the lifecycle capability (its unregistered segments are fenced and
//! collected as orphans, and the cleaner deletes the WAL objects it emptied).
//!
//! One [`CommitSignal`] ([`DisklessNode::commit_signal`]) ties the writers to the fetcher's
//! long polling ([`Fetcher::fetch_wait`]): every writer notifies it after a commit, and so does
//! the node's coordinator after transaction markers were written through it; a fetch waiting for
//! `min_bytes` reads again at once instead of at its next poll.
//!
//! ```
//! use diskless_core::{DisklessNode, NodeConfig};
//! use diskless_coordinator::ManualClock;
//! use diskless_storage::ObjectStoreStorage;
//! use diskless_testkit::coordinator::InMemoryCoordinator;
//! use std::sync::Arc;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let clock = ManualClock::new(1_700_000_000_000);
//! let node = DisklessNode::builder(
//!     Arc::new(ObjectStoreStorage::in_memory()),
//!     Arc::new(InMemoryCoordinator::new(clock.clone())),
//! )
//! .with_clock(clock)
//! .with_config(NodeConfig::default().with_broker_ids(vec![1, 2]))
//! .build()
//! .unwrap();
//! assert!(node.writer(1).is_some() && node.writer(3).is_none());
//! let _fetcher = node.fetcher();
//! assert!(node.lifecycle_stats().is_some(), "the model serves every capability");
//! node.close().await;
//! # });
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
use diskless_coordinator::{
    BatchCoordinator, Capability, Clock, CoordinatorMetrics, Layered, MeteredCoordinator,
    SystemClock,
};
use diskless_storage::{KeySource, MeteredStorage, ObjectRemoteStorage, ObjectStorage, RandomKeys};

use crate::commit_signal::NotifyOnMarkers;
use crate::fetcher::{Fetcher, FetcherConfig};
use crate::lifecycle::{
    CleanerConfig, CompactionConfig, CompactionWorker, Lifecycle, LifecycleHandle, LifecycleStats,
    ObjectCleaner, OrphanCollector, OrphanConfig, ProducerExpirer, ProducerExpiryConfig,
    RetentionConfig, RetentionEnforcer, TieringConfig, TieringWorker,
};
use crate::writer::{WalWriter, WalWriterConfig};
use crate::{CommitSignal, ConfigError};

/// The default memory cache of a node without one: 256 MiB.
pub const DEFAULT_NODE_CACHE_BYTES: u64 = 256 << 20;

/// The lifecycle workers a [`DisklessNode`] runs, and how often. Each is started only when the
/// coordinator serves its capability; an interval of `None` leaves the worker out.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeLifecycleConfig {
    /// Retention (`retention.ms`/`retention.bytes`) every this long. Default 5 minutes (Kafka's
    /// `log.retention.check.interval.ms`).
    pub retention_interval: Option<Duration>,
    /// The retention enforcer's settings.
    pub retention: RetentionConfig,
    /// The cleaner (deletes dead objects after its grace period) every this long. Default 1
    /// minute.
    pub cleaner_interval: Option<Duration>,
    /// The cleaner's settings.
    pub cleaner: CleanerConfig,
    /// Producer expiry every this long. Default 10 minutes (Kafka's
    /// `producer.id.expiration.check.interval.ms`).
    pub producer_expiry_interval: Option<Duration>,
    /// The producer expirer's settings.
    pub producer_expiry: ProducerExpiryConfig,
    /// Orphan collection, on the writers' prefix and (with tiering) on the segments' prefix,
    /// every this long. Default 1 minute. Leave it out (`None`) with a coordinator that forgets
    /// what it knew at a restart (an in-memory one over durable storage): it would take the
    /// previous run's objects for orphans.
    pub orphans_interval: Option<Duration>,
    /// The orphan collectors' settings but their prefix (each collector gets its own).
    pub orphans: OrphanConfig,
    /// Consolidation into tiered segments every this long. Default 30 seconds.
    pub tiering_interval: Option<Duration>,
    /// The tiering worker's settings (its prefix is the second orphan collector's).
    pub tiering: TieringConfig,
    /// Compaction of compacted topics' tiered segments every this long (runs only beside
    /// tiering; its segments take the tiering prefix). Default 15 seconds (Kafka's
    /// `log.cleaner.backoff.ms`).
    pub compaction_interval: Option<Duration>,
    /// The compaction worker's settings (its prefix is set to the tiering worker's).
    pub compaction: CompactionConfig,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            retention_interval: Some(Duration::from_secs(300)),
            retention: RetentionConfig::default(),
            cleaner_interval: Some(Duration::from_secs(60)),
            cleaner: CleanerConfig::default(),
            producer_expiry_interval: Some(Duration::from_secs(600)),
            producer_expiry: ProducerExpiryConfig::default(),
            orphans_interval: Some(Duration::from_secs(60)),
            orphans: OrphanConfig::default(),
            tiering_interval: Some(Duration::from_secs(30)),
            tiering: TieringConfig::default(),
            compaction_interval: Some(Duration::from_secs(15)),
            compaction: CompactionConfig::default(),
        }
    }
}

impl NodeLifecycleConfig {
    /// No workers at all (a host that runs them elsewhere, or a test).
    pub fn none() -> Self {
        NodeLifecycleConfig {
            retention_interval: None,
            cleaner_interval: None,
            producer_expiry_interval: None,
            orphans_interval: None,
            tiering_interval: None,
            compaction_interval: None,
            ..NodeLifecycleConfig::default()
        }
    }
}

diskless_common::with_setters!(NodeLifecycleConfig {
    with_retention_interval => retention_interval: [Option<Duration>],
    with_retention => retention: [RetentionConfig],
    with_cleaner_interval => cleaner_interval: [Option<Duration>],
    with_cleaner => cleaner: [CleanerConfig],
    with_producer_expiry_interval => producer_expiry_interval: [Option<Duration>],
    with_producer_expiry => producer_expiry: [ProducerExpiryConfig],
    with_orphans_interval => orphans_interval: [Option<Duration>],
    with_orphans => orphans: [OrphanConfig],
    with_tiering_interval => tiering_interval: [Option<Duration>],
    with_tiering => tiering: [TieringConfig],
    with_compaction_interval => compaction_interval: [Option<Duration>],
    with_compaction => compaction: [CompactionConfig],
});

/// Everything a [`DisklessNode`] is configured with, each shared setting once.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeConfig {
    /// The broker ids this node writes for, one [`WalWriter`] each (a host serving several
    /// listeners in one process has several). At least one; default `[1]`.
    pub broker_ids: Vec<i32>,
    /// The writers' settings; each writer's `broker_id` is one of `broker_ids`, its
    /// `cache_block_size` is [`NodeConfig::cache_block_size`].
    pub writer: WalWriterConfig,
    /// The fetcher's settings (among them the long polling's
    /// [`long_poll_interval`](FetcherConfig::long_poll_interval) and
    /// [`max_wait_limit`](FetcherConfig::max_wait_limit)); its `cache_block_size` is
    /// [`NodeConfig::cache_block_size`].
    pub fetcher: FetcherConfig,
    /// The block size of the shared cache, for the writers and the fetcher alike. Default the
    /// writer's default.
    pub cache_block_size: u64,
    /// Wrap storage and coordinator in the metrics layers (`MeteredStorage`,
    /// `MeteredCoordinator`) once, for every component. Default `true`.
    pub metered: bool,
    /// The lifecycle workers.
    pub lifecycle: NodeLifecycleConfig,
}

impl Default for NodeConfig {
    fn default() -> Self {
        let writer = WalWriterConfig::default();
        NodeConfig {
            broker_ids: vec![1],
            cache_block_size: writer.cache_block_size,
            writer,
            fetcher: FetcherConfig::default(),
            metered: true,
            lifecycle: NodeLifecycleConfig::default(),
        }
    }
}

diskless_common::with_setters!(NodeConfig {
    with_broker_ids => broker_ids: [Vec<i32>],
    with_writer => writer: [WalWriterConfig],
    with_fetcher => fetcher: [FetcherConfig],
    with_cache_block_size => cache_block_size: [u64],
    with_metered => metered: [bool],
    with_lifecycle => lifecycle: [NodeLifecycleConfig],
});

impl NodeConfig {
    /// Checks what the parts' own checks cannot see: at least one broker id, no id twice.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.broker_ids.is_empty() {
            return Err(ConfigError::invalid(
                "broker_ids",
                "a node writes for at least one broker id",
            ));
        }
        let mut ids = self.broker_ids.clone();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(ConfigError::invalid(
                "broker_ids",
                "a broker id appears twice",
            ));
        }
        Ok(())
    }
}

/// Builds a [`DisklessNode`]: [`DisklessNode::builder`].
#[derive(Debug)]
#[must_use]
pub struct DisklessNodeBuilder {
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Option<Arc<dyn Clock>>,
    keys: Option<Arc<dyn KeySource>>,
    config: NodeConfig,
}

impl DisklessNodeBuilder {
    /// The node's settings (default [`NodeConfig::default`]).
    pub fn with_config(mut self, config: NodeConfig) -> Self {
        self.config = config;
        self
    }

    /// The cache shared by the writers, the fetcher and the cleaner (default a memory cache of
    /// [`DEFAULT_NODE_CACHE_BYTES`]).
    pub fn with_cache(mut self, cache: Arc<dyn LocalCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The one clock of every part (default [`SystemClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where object keys' random bits come from, for the writers and the tiering worker
    /// (default [`RandomKeys`]).
    pub fn with_keys(mut self, keys: Arc<dyn KeySource>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Builds the parts and spawns the lifecycle workers on the current tokio runtime (refused
    /// outside one: [`ConfigError::NoRuntime`]). Every setting is checked before anything is
    /// started (the writers' tasks, the workers): nothing runs when one is refused.
    pub fn build(self) -> Result<DisklessNode, ConfigError> {
        let DisklessNodeBuilder {
            storage,
            coordinator,
            cache,
            clock,
            keys,
            config,
        } = self;
        config.validate()?;
        let clock = clock.unwrap_or_else(|| Arc::new(SystemClock));
        let keys = keys.unwrap_or_else(|| Arc::new(RandomKeys::new()));
        let (storage, coordinator): (Arc<dyn ObjectStorage>, Arc<dyn BatchCoordinator>) =
            if config.metered {
                (
                    Arc::new(MeteredStorage::new(storage)),
                    Arc::new(MeteredCoordinator::new(coordinator, CoordinatorMetrics)),
                )
            } else {
                (storage, coordinator)
            };
        // Markers written through the node's coordinator (by the host's transaction
        // coordinator) wake the long-polling fetches as the writers' commits do.
        let commit_signal = CommitSignal::new();
        let coordinator: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(
            coordinator,
            NotifyOnMarkers(commit_signal.clone()),
        ));
        let cache = match cache {
            Some(cache) => cache,
            None => Arc::new(
                MokaCache::new(MokaCacheConfig::default().with_max_bytes(DEFAULT_NODE_CACHE_BYTES))
                    .map_err(|e| ConfigError::invalid("cache", e.to_string()))?,
            ),
        };

        // Everything that can be refused is built and checked before the writers start their
        // tasks: the fetcher, then the lifecycle workers (built, not spawned).
        let fetcher = Fetcher::builder(storage.clone(), coordinator.clone())
            .with_config(
                config
                    .fetcher
                    .clone()
                    .with_cache_block_size(config.cache_block_size),
            )
            .with_cache(cache.clone())
            .with_commit_signal(commit_signal.clone())
            .build()?;
        let workers = lifecycle(
            &config,
            Parts {
                storage: &storage,
                coordinator: &coordinator,
                cache: &cache,
                clock: &clock,
                keys: &keys,
                fetcher: &fetcher,
            },
        )?;
        if let Some(workers) = &workers {
            workers.check()?;
        }
        // Outside a runtime the first writer's build refuses (NoRuntime) before it spawns.

        let mut writers = BTreeMap::new();
        for id in &config.broker_ids {
            let writer = WalWriter::builder(storage.clone(), coordinator.clone())
                .with_config(
                    config
                        .writer
                        .clone()
                        .with_broker_id(*id)
                        .with_cache_block_size(config.cache_block_size),
                )
                .with_cache(cache.clone())
                .with_clock(clock.clone())
                .with_keys(keys.clone())
                .with_commit_signal(commit_signal.clone())
                .build()?;
            writers.insert(*id, Arc::new(writer));
        }
        let lifecycle = workers.map(Lifecycle::spawn).transpose()?;
        Ok(DisklessNode {
            storage,
            coordinator,
            cache,
            clock,
            writers,
            fetcher,
            commit_signal,
            lifecycle: lifecycle.map(LifecycleRun::new),
        })
    }
}

/// What the lifecycle workers are built from.
struct Parts<'a> {
    storage: &'a Arc<dyn ObjectStorage>,
    coordinator: &'a Arc<dyn BatchCoordinator>,
    cache: &'a Arc<dyn LocalCache>,
    clock: &'a Arc<dyn Clock>,
    keys: &'a Arc<dyn KeySource>,
    fetcher: &'a Fetcher,
}

/// The standard workers of `config` that the coordinator's capabilities allow, not yet spawned;
/// `None` when there is none.
fn lifecycle(config: &NodeConfig, p: Parts<'_>) -> Result<Option<Lifecycle>, ConfigError> {
    let serves = p.coordinator.capabilities();
    let l = &config.lifecycle;
    let mut workers = Lifecycle::new();
    let mut any = false;
    if serves.contains(Capability::Lifecycle) {
        if let Some(interval) = l.retention_interval {
            let enforcer = RetentionEnforcer::new(p.coordinator.clone(), l.retention.clone())?;
            workers = workers.retention(enforcer, interval);
            any = true;
        }
        if let Some(interval) = l.cleaner_interval {
            let cleaner = ObjectCleaner::new(
                p.coordinator.clone(),
                p.storage.clone(),
                Some(p.cache.clone()),
                p.clock.clone(),
                l.cleaner.clone(),
            )?;
            workers = workers.cleaner(cleaner, interval);
            any = true;
        }
        if let Some(interval) = l.producer_expiry_interval {
            let expirer = ProducerExpirer::new(p.coordinator.clone(), l.producer_expiry.clone())?;
            workers = workers.producer_expiry(expirer, interval);
            any = true;
        }
        if let Some(interval) = l.orphans_interval {
            let collector = OrphanCollector::new(
                p.coordinator.clone(),
                p.storage.clone(),
                p.clock.clone(),
                l.orphans
                    .clone()
                    .with_prefix(config.writer.object_prefix.clone()),
            )?;
            workers = workers.orphans(collector, interval);
            any = true;
        }
    }
    // Tiering needs the lifecycle capability too: a segment it cannot register is fenced
    // (`fence_orphans`) and left to the orphan collector, and the WAL bytes it moves are deleted
    // by the cleaner; without them every tiered byte would stay stored twice.
    if serves.contains(Capability::Tiering)
        && serves.contains(Capability::Lifecycle)
        && let Some(interval) = l.tiering_interval
    {
        let broker_id = config.broker_ids.first().copied().unwrap_or(1);
        let worker = TieringWorker::new(
            p.coordinator.clone(),
            Arc::new(ObjectRemoteStorage::new(p.storage.clone())),
            p.fetcher.clone(),
            p.clock.clone(),
            p.keys.clone(),
            broker_id,
            l.tiering.clone(),
        )?;
        workers = workers.tiering(worker, interval);
        any = true;
        if let Some(interval) = l.compaction_interval {
            let compactor = CompactionWorker::new(
                p.coordinator.clone(),
                Arc::new(ObjectRemoteStorage::new(p.storage.clone())),
                p.clock.clone(),
                p.keys.clone(),
                broker_id,
                l.compaction.clone().with_prefix(l.tiering.prefix.clone()),
            )?;
            workers = workers.compaction(compactor, interval);
        }
        // Uploads of segments never registered: a collector of their own prefix.
        if let Some(interval) = l.orphans_interval {
            let collector = OrphanCollector::new(
                p.coordinator.clone(),
                p.storage.clone(),
                p.clock.clone(),
                l.orphans.clone().with_prefix(l.tiering.prefix.clone()),
            )?;
            workers = workers.orphans(collector, interval);
        }
    }
    Ok(any.then_some(workers))
}

/// The running workers and their counters.
#[derive(Debug)]
struct LifecycleRun {
    stats: Arc<LifecycleStats>,
    handle: LifecycleHandle,
}

impl LifecycleRun {
    fn new(handle: LifecycleHandle) -> Self {
        LifecycleRun {
            stats: handle.stats().clone(),
            handle,
        }
    }
}

/// The diskless parts of one host, composed: see the [module docs](self).
#[derive(Debug)]
pub struct DisklessNode {
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    cache: Arc<dyn LocalCache>,
    clock: Arc<dyn Clock>,
    writers: BTreeMap<i32, Arc<WalWriter>>,
    fetcher: Fetcher,
    commit_signal: CommitSignal,
    lifecycle: Option<LifecycleRun>,
}

impl DisklessNode {
    /// A builder over `storage` and `coordinator` (each wrapped in its metrics layer unless
    /// [`NodeConfig::metered`] is off).
    pub fn builder(
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
    ) -> DisklessNodeBuilder {
        DisklessNodeBuilder {
            storage,
            coordinator,
            cache: None,
            clock: None,
            keys: None,
            config: NodeConfig::default(),
        }
    }

    /// The writer of broker `broker_id`, if the node writes for it.
    pub fn writer(&self, broker_id: i32) -> Option<&Arc<WalWriter>> {
        self.writers.get(&broker_id)
    }

    /// Every writer, by broker id.
    pub fn writers(&self) -> &BTreeMap<i32, Arc<WalWriter>> {
        &self.writers
    }

    /// The fetcher (cheap to clone: it shares its state).
    pub fn fetcher(&self) -> &Fetcher {
        &self.fetcher
    }

    /// The signal every writer notifies after a commit, and the coordinator after transaction
    /// markers, that wakes the fetcher's long-polling fetches ([`Fetcher::fetch_wait`]; the same
    /// as [`Fetcher::commit_signal`]). A host notifies it after appending to a log any other way.
    pub fn commit_signal(&self) -> &CommitSignal {
        &self.commit_signal
    }

    /// The coordinator every part uses (metered when the node wraps it; it notifies
    /// [`DisklessNode::commit_signal`] after writing transaction markers).
    pub fn coordinator(&self) -> &Arc<dyn BatchCoordinator> {
        &self.coordinator
    }

    /// The storage every part uses (metered when the node wraps it).
    pub fn storage(&self) -> &Arc<dyn ObjectStorage> {
        &self.storage
    }

    /// The shared cache.
    pub fn cache(&self) -> &Arc<dyn LocalCache> {
        &self.cache
    }

    /// The clock of every part.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The lifecycle workers' counters, when any worker runs.
    pub fn lifecycle_stats(&self) -> Option<&Arc<LifecycleStats>> {
        self.lifecycle.as_ref().map(|l| &l.stats)
    }

    /// Stops everything: the writers, all at once, seal what they hold, answer every request they
    /// accepted and wait for their background deletes (`WalWriter::close`), then the lifecycle
    /// workers finish their pass in progress and stop.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the waiting, not the shutdown already started: every writer is
    /// told to close at the first poll and still answers its requests; workers not told yet run
    /// on until the node's parts are dropped.
    pub async fn close(self) {
        futures::future::join_all(self.writers.values().map(|w| w.close())).await;
        if let Some(run) = self.lifecycle {
            run.handle.shutdown().await;
        }
    }
}
