//! [`WalWriterBuilder`]: the required parts of a writer as arguments, the rest optional.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use diskless_cache::LocalCache;
use diskless_common::metrics as m;
use diskless_common::{Clock, SystemClock, entropy_seed};
use diskless_coordinator::BatchCoordinator;
use diskless_storage::{KeySource, ObjectStorage, SeededKeys};
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, mpsc, watch};

use super::WalWriter;
use super::budget::Budget;
use super::config::WalWriterConfig;
use super::state::{Buffer, Counters, Shared};
use super::{commit, seal};
use crate::{CommitSignal, ConfigError};

impl WalWriter {
    /// A builder of a writer over `storage` and `coordinator`; see [`WalWriterBuilder`].
    pub fn builder(
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
    ) -> WalWriterBuilder {
        WalWriterBuilder::new(storage, coordinator)
    }
}

/// Builds a [`WalWriter`]: [`WalWriter::builder`] takes the object storage and the coordinator;
/// everything else has a default.
///
/// | part | default |
/// |---|---|
/// | [`with_config`](Self::with_config) | [`WalWriterConfig::default`] |
/// | [`with_cache`](Self::with_cache) | none (freshly uploaded segments are not cached) |
/// | [`with_clock`](Self::with_clock) | [`SystemClock`] |
/// | [`with_keys`](Self::with_keys) / [`with_seed`](Self::with_seed) | [`SeededKeys`] seeded from [`entropy_seed`] |
/// | [`with_commit_signal`](Self::with_commit_signal) | none (no fetch is woken by its commits) |
///
/// Object keys are UUID v7s whose time is the writer's clock's and whose random bits come from the
/// key source, so a test or a simulation that injects a `ManualClock` and a seed decides every
/// key. [`build`](Self::build) validates the configuration ([`WalWriterConfig::validate`]) and
/// starts the writer's tasks on the current tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use diskless_core::{WalWriter, WalWriterConfig};
/// use diskless_coordinator::{ManualClock, sqlite::SqliteCoordinator};
/// use diskless_storage::ObjectStoreStorage;
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let coordinator = Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap());
/// let writer = WalWriter::builder(Arc::new(ObjectStoreStorage::in_memory()), coordinator)
///     .with_clock(clock)
///     .with_seed(42)
///     .with_config(WalWriterConfig::default().with_object_prefix("wal/broker-1"))
///     .build()
///     .unwrap();
/// writer.close().await;
///
/// let refused = WalWriter::builder(
///     Arc::new(ObjectStoreStorage::in_memory()),
///     Arc::new(SqliteCoordinator::in_memory(ManualClock::new(0)).await.unwrap()),
/// )
/// .with_config(WalWriterConfig::default().with_max_concurrent_uploads(0))
/// .build();
/// assert!(refused.is_err());
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct WalWriterBuilder {
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    config: WalWriterConfig,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Option<Arc<dyn Clock>>,
    keys: Keys,
    commit_signal: Option<CommitSignal>,
}

/// Where the builder's key source comes from.
#[derive(Debug)]
enum Keys {
    /// [`SeededKeys`] seeded from the OS.
    Entropy,
    /// [`SeededKeys`] with this seed.
    Seed(u64),
    /// Injected.
    Source(Arc<dyn KeySource>),
}

/// What [`start`] receives from a validated builder.
struct Parts {
    config: WalWriterConfig,
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Arc<dyn Clock>,
    keys: Arc<dyn KeySource>,
    commit_signal: Option<CommitSignal>,
}

impl std::fmt::Debug for WalWriterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalWriterBuilder")
            .field("config", &self.config)
            .field("cache", &self.cache.is_some())
            .field("clock", &self.clock.is_some())
            .field("keys", &self.keys)
            .field("commit_signal", &self.commit_signal.is_some())
            .finish_non_exhaustive()
    }
}

impl WalWriterBuilder {
    fn new(storage: Arc<dyn ObjectStorage>, coordinator: Arc<dyn BatchCoordinator>) -> Self {
        WalWriterBuilder {
            storage,
            coordinator,
            config: WalWriterConfig::default(),
            cache: None,
            clock: None,
            keys: Keys::Entropy,
            commit_signal: None,
        }
    }

    /// The writer's settings (default [`WalWriterConfig::default`]).
    pub fn with_config(mut self, config: WalWriterConfig) -> Self {
        self.config = config;
        self
    }

    /// A cache that receives every segment the writer uploads (in blocks of
    /// [`WalWriterConfig::cache_block_size`]), so that this broker's reads of its fresh data cost
    /// no GET. Share it with the [`Fetcher`](crate::Fetcher).
    pub fn with_cache(mut self, cache: Arc<dyn LocalCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The clock of validation (timestamps), object keys' times and nothing else (default
    /// [`SystemClock`]). Give the coordinator the same clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The source of object keys' random bits (replaces any [`with_seed`](Self::with_seed)).
    pub fn with_keys(mut self, keys: Arc<dyn KeySource>) -> Self {
        self.keys = Keys::Source(keys);
        self
    }

    /// Keys from [`SeededKeys`] with `seed` (replaces any [`with_keys`](Self::with_keys)): the
    /// same seed and clock give the same keys. Give each writer of one cluster its own seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.keys = Keys::Seed(seed);
        self
    }

    /// A signal the writer notifies once per committed segment that added at least one batch
    /// (not for a segment whose batches were all rejected or duplicates), after the
    /// coordinator's commit returned: give the same one to the [`Fetcher`](crate::Fetcher)
    /// ([`FetcherBuilder::with_commit_signal`](crate::FetcherBuilder::with_commit_signal)) so
    /// that its long-polling fetches ([`Fetcher::fetch_wait`](crate::Fetcher::fetch_wait)) wake
    /// up at once. A [`DisklessNode`](crate::DisklessNode) does this for its writers.
    pub fn with_commit_signal(mut self, signal: CommitSignal) -> Self {
        self.commit_signal = Some(signal);
        self
    }

    /// Validates the configuration and starts the writer's timer and commit tasks on the current
    /// tokio runtime ([`ConfigError::NoRuntime`] outside one).
    pub fn build(self) -> Result<WalWriter, ConfigError> {
        self.config.validate()?;
        let keys: Arc<dyn KeySource> = match self.keys {
            Keys::Entropy => Arc::new(SeededKeys::new(entropy_seed())),
            Keys::Seed(seed) => Arc::new(SeededKeys::new(seed)),
            Keys::Source(keys) => keys,
        };
        start(Parts {
            config: self.config,
            storage: self.storage,
            coordinator: self.coordinator,
            cache: self.cache,
            clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            keys,
            commit_signal: self.commit_signal,
        })
    }
}

/// Starts the writer's tasks (called by [`WalWriterBuilder::build`], after validation).
fn start(parts: Parts) -> Result<WalWriter, ConfigError> {
    let Parts {
        config,
        storage,
        coordinator,
        cache,
        clock,
        keys,
        commit_signal,
    } = parts;
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
    let bound = |field: &'static str, bytes: usize| {
        u32::try_from(bytes)
            .map_err(|_| ConfigError::invalid(field, "must be at most u32::MAX (4 GiB - 1)"))
    };
    let budget = Budget::new(
        bound("max_pending_bytes", config.max_pending_bytes)?,
        m::WRITER_PENDING_BYTES,
    );
    let uncommitted = Budget::new(
        bound("max_uncommitted_bytes", config.max_uncommitted_bytes)?,
        m::WRITER_UNCOMMITTED_BYTES,
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let (answered_tx, answered) = watch::channel(0u64);
    let shared = Arc::new(Shared {
        runtime: runtime.clone(),
        validations: Semaphore::new(config.max_concurrent_validations),
        finished: watch::Sender::new(false),
        sealed: AtomicU64::new(0),
        answered,
        budget,
        uncommitted,
        uploads: Arc::new(Semaphore::new(config.max_concurrent_uploads)),
        uploading: AtomicUsize::new(0),
        upload_micros: AtomicU64::new(0),
        config,
        storage,
        coordinator,
        cache,
        clock,
        keys,
        commit_signal,
        buffer: Mutex::new(Buffer::default()),
        pipeline: Mutex::new(Some(tx)),
        timer: Notify::new(),
        closed: AtomicBool::new(false),
        counters: Counters::default(),
        deletes: Mutex::new(Vec::new()),
    });
    let timer = runtime.spawn(seal::run_timer(shared.clone()));
    let committer = runtime.spawn(commit::run_committer(shared.clone(), rx, answered_tx));
    Ok(WalWriter {
        shared,
        tasks: Mutex::new(vec![timer, committer]),
        closing: tokio::sync::Mutex::new(()),
    })
}
