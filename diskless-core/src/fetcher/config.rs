//! [`FetcherConfig`] and [`FetcherBuilder`]: how a [`Fetcher`] is set up.

use std::sync::Arc;
use std::time::Duration;

use diskless_cache::LocalCache;
use diskless_coordinator::{BatchCoordinator, TopicConfig};
use diskless_storage::{ObjectStorage, RangeReadConfig};

use super::Fetcher;
use crate::validate::default_decompression_limit;
use crate::{CommitSignal, ConfigError};

/// The default [`FetcherConfig::long_poll_interval`]: 250 ms.
pub const DEFAULT_LONG_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The default [`FetcherConfig::max_wait_limit`]: 30 seconds.
pub const DEFAULT_MAX_WAIT_LIMIT: Duration = Duration::from_secs(30);

/// The default block size of the object cache: 4 MiB (a WAL segment of the default 8 MiB is two
/// blocks).
pub const DEFAULT_CACHE_BLOCK_SIZE: u64 = 4 << 20;

/// Settings of a [`Fetcher`]. Start from [`FetcherConfig::default`] and change fields with the
/// `with_*` methods; [`FetcherBuilder::build`] checks them ([`FetcherConfig::validate`]) and
/// refuses an invalid value rather than adjusting it.
///
/// ```
/// use diskless_core::FetcherConfig;
/// let config = FetcherConfig::default()
///     .with_cache_block_size(1 << 20)
///     .with_max_concurrent_objects(4);
/// assert!(config.validate().is_ok());
/// assert!(FetcherConfig::default().with_max_concurrent_objects(0).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FetcherConfig {
    /// Block size of the cache, at least 1; must equal the writer's
    /// [`crate::WalWriterConfig::cache_block_size`] for freshly written segments to be found.
    /// Default [`DEFAULT_CACHE_BLOCK_SIZE`].
    pub cache_block_size: u64,
    /// How reads without a cache merge nearby ranges of one object (`concurrency` at least 1).
    /// Default [`RangeReadConfig::default`].
    pub range_read: RangeReadConfig,
    /// Objects read at once for one fetch, at least 1. Default 16.
    pub max_concurrent_objects: usize,
    /// The largest decompressed records section [`Fetcher::list_offsets`] decompresses to find a
    /// record in a compressed batch (a larger one answers `KAFKA_STORAGE_ERROR`), at least 1.
    /// Default [`default_decompression_limit`] of Kafka's default `max.message.bytes` (32 MiB); a
    /// host with topics whose `max.message.bytes` is larger than 1 MiB sets it to the limit of the
    /// largest.
    pub max_decompressed_bytes: usize,
    /// How often a long-polling fetch ([`Fetcher::fetch_wait`]) reads again without being woken
    /// by its [`CommitSignal`]: the longest it takes to see a commit of a writer in another
    /// process sharing the coordinator. At least 1 ms. Default [`DEFAULT_LONG_POLL_INTERVAL`].
    pub long_poll_interval: Duration,
    /// The longest a long-polling fetch waits, whatever the request's `max_wait_ms` asks.
    /// Default [`DEFAULT_MAX_WAIT_LIMIT`]; zero makes every fetch answer after its first read.
    pub max_wait_limit: Duration,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        FetcherConfig {
            cache_block_size: DEFAULT_CACHE_BLOCK_SIZE,
            range_read: RangeReadConfig::default(),
            max_concurrent_objects: 16,
            max_decompressed_bytes: default_decompression_limit(
                TopicConfig::default().max_message_bytes,
            ),
            long_poll_interval: DEFAULT_LONG_POLL_INTERVAL,
            max_wait_limit: DEFAULT_MAX_WAIT_LIMIT,
        }
    }
}

diskless_common::with_setters!(FetcherConfig {
    with_cache_block_size => cache_block_size: [u64],
    with_range_read => range_read: [RangeReadConfig],
    with_max_concurrent_objects => max_concurrent_objects: [usize],
    with_max_decompressed_bytes => max_decompressed_bytes: [usize],
    with_long_poll_interval => long_poll_interval: [Duration],
    with_max_wait_limit => max_wait_limit: [Duration],
});

impl FetcherConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cache_block_size == 0 {
            return Err(ConfigError::invalid(
                "cache_block_size",
                "must be at least 1",
            ));
        }
        if self.range_read.concurrency == 0 {
            return Err(ConfigError::invalid(
                "range_read.concurrency",
                "must be at least 1",
            ));
        }
        if self.max_concurrent_objects == 0 {
            return Err(ConfigError::invalid(
                "max_concurrent_objects",
                "must be at least 1",
            ));
        }
        if self.max_decompressed_bytes == 0 {
            return Err(ConfigError::invalid(
                "max_decompressed_bytes",
                "must be at least 1",
            ));
        }
        if self.long_poll_interval < Duration::from_millis(1) {
            return Err(ConfigError::invalid(
                "long_poll_interval",
                "must be at least 1 ms",
            ));
        }
        Ok(())
    }
}

/// Builds a [`Fetcher`]: [`Fetcher::builder`] takes the required parts, the `with_*` methods the
/// optional ones, and [`build`](Self::build) checks the configuration.
///
/// ```
/// use diskless_core::{Fetcher, FetcherConfig};
/// use diskless_cache::{LocalCache, MokaCache, MokaCacheConfig};
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_storage::{ObjectStorage, ObjectStoreStorage};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::sync::Arc;
///
/// let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
/// let coordinator: Arc<dyn BatchCoordinator> =
///     Arc::new(InMemoryCoordinator::new(ManualClock::new(1_700_000_000_000)));
/// let cache: Arc<dyn LocalCache> = Arc::new(MokaCache::new(MokaCacheConfig::default()).unwrap());
/// let fetcher = Fetcher::builder(storage, coordinator)
///     .with_cache(cache)
///     .with_config(FetcherConfig::default().with_max_concurrent_objects(4))
///     .build()
///     .unwrap();
/// # let _ = fetcher;
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FetcherBuilder {
    storage: Arc<dyn ObjectStorage>,
    coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    config: FetcherConfig,
    commit_signal: Option<CommitSignal>,
}

impl FetcherBuilder {
    pub(super) fn new(
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
    ) -> Self {
        FetcherBuilder {
            storage,
            coordinator,
            cache: None,
            config: FetcherConfig::default(),
            commit_signal: None,
        }
    }

    /// Reads through `cache` (without one, every fetch reads object storage). Give it the
    /// writer's cache, with the same block size, so that fresh segments cost no GET.
    pub fn with_cache(mut self, cache: Arc<dyn LocalCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Uses `config` instead of [`FetcherConfig::default`].
    pub fn with_config(mut self, config: FetcherConfig) -> Self {
        self.config = config;
        self
    }

    /// The signal that wakes its long-polling fetches ([`Fetcher::fetch_wait`]): give it the
    /// one of the writers ([`WalWriterBuilder::with_commit_signal`](crate::WalWriterBuilder::with_commit_signal)).
    /// Default a signal of its own ([`Fetcher::commit_signal`]), which only the host notifies.
    pub fn with_commit_signal(mut self, signal: CommitSignal) -> Self {
        self.commit_signal = Some(signal);
        self
    }

    /// The fetcher, or the first setting of its configuration that is out of range.
    pub fn build(self) -> Result<Fetcher, ConfigError> {
        self.config.validate()?;
        Ok(Fetcher::from_parts(
            self.config,
            self.storage,
            self.coordinator,
            self.cache,
            self.commit_signal.unwrap_or_default(),
        ))
    }
}
