//! [`MokaCache`]: the default [`LocalCache`], on `moka::future::Cache`.

use crate::{BlockKey, BoxError, CacheStats, LoadError, LocalCache};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest time-to-live or time-to-idle moka accepts (1,000 years); longer settings are
/// rejected by [`MokaCacheConfig::validate`].
const MAX_EXPIRY: Duration = Duration::from_secs(1_000 * 365 * 24 * 3600);

/// The block index is never swept below this many keys (see [`BlockIndex`]).
const MIN_SWEEP_AT: usize = 1024;

/// A [`MokaCacheConfig`] value that is out of range, found by [`MokaCacheConfig::validate`] when
/// a [`MokaCache`] is built. Invalid values are rejected, never clamped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting is out of range.
    #[error("invalid cache configuration: {field}: {reason}")]
    Invalid {
        /// The setting (the config struct's field name, e.g. `time_to_live`).
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}

/// Settings of a [`MokaCache`].
///
/// Start from [`MokaCacheConfig::default()`] and change what you need with the `with_*` methods;
/// [`MokaCache::new`] checks them with [`MokaCacheConfig::validate`]:
///
/// ```
/// use diskless_cache::{MokaCache, MokaCacheConfig};
/// use std::time::Duration;
///
/// let config = MokaCacheConfig::default()
///     .with_max_bytes(64 << 20)
///     .with_time_to_live(Duration::from_secs(60))
///     .with_time_to_idle(Duration::from_secs(10));
/// assert_eq!(config.max_bytes, 64 << 20);
/// assert!(MokaCache::new(config.clone()).is_ok());
/// // No expiry by age at all: `None`. Durations moka cannot take are refused, not clamped.
/// assert!(config.clone().with_time_to_live(None).validate().is_ok());
/// assert!(config.with_time_to_live(Duration::MAX).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MokaCacheConfig {
    /// The most block bytes the cache holds (the sum of the lengths of the cached blocks).
    /// Default [`MokaCacheConfig::DEFAULT_MAX_BYTES`] (256 MiB). `0` caches nothing.
    pub max_bytes: u64,
    /// How long a block stays cached after it was inserted, however often it is read; `None`:
    /// no limit (blocks leave by eviction or invalidation only). Default
    /// `Some(`[`MokaCacheConfig::DEFAULT_TIME_TO_LIVE`]`)` (5 minutes). When set: positive and at
    /// most 1,000 years (moka's limit).
    pub time_to_live: Option<Duration>,
    /// If set, a block not read for this long is dropped even before its time-to-live. Default
    /// `None`. When set: positive and at most 1,000 years.
    pub time_to_idle: Option<Duration>,
}

diskless_common::with_setters!(MokaCacheConfig {
    with_max_bytes => max_bytes: [u64],
});

impl MokaCacheConfig {
    /// The default [`max_bytes`](Self::max_bytes): 256 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
    /// The default [`time_to_live`](Self::time_to_live): 5 minutes.
    pub const DEFAULT_TIME_TO_LIVE: Duration = Duration::from_secs(5 * 60);

    /// Sets [`time_to_live`](Self::time_to_live) (a `Duration`, or `None` for no limit).
    pub fn with_time_to_live(mut self, time_to_live: impl Into<Option<Duration>>) -> Self {
        self.time_to_live = time_to_live.into();
        self
    }

    /// Sets [`time_to_idle`](Self::time_to_idle) (a `Duration`, or `None` for no limit).
    pub fn with_time_to_idle(mut self, time_to_idle: impl Into<Option<Duration>>) -> Self {
        self.time_to_idle = time_to_idle.into();
        self
    }

    /// Checks the settings, the one place they are validated: a time-to-live or time-to-idle,
    /// when set, must be positive (to cache nothing, set `max_bytes` to 0) and at most 1,000
    /// years (use `None` for no limit). Every `max_bytes` is valid.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("time_to_live", self.time_to_live),
            ("time_to_idle", self.time_to_idle),
        ] {
            let Some(value) = value else { continue };
            let reason = if value.is_zero() {
                "must be positive (set max_bytes to 0 to cache nothing)"
            } else if value > MAX_EXPIRY {
                "must be at most 1,000 years (None for no limit)"
            } else {
                continue;
            };
            return Err(ConfigError::Invalid {
                field,
                reason: format!("{value:?} {reason}"),
            });
        }
        Ok(())
    }
}

impl Default for MokaCacheConfig {
    fn default() -> Self {
        MokaCacheConfig {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            time_to_live: Some(Self::DEFAULT_TIME_TO_LIVE),
            time_to_idle: None,
        }
    }
}

/// The default [`LocalCache`]: a `moka::future::Cache` of blocks.
///
/// - **Bounded by bytes**: each block weighs its length (blocks longer than `u32::MAX` bytes weigh
///   `u32::MAX`, moka's largest weight); the cache holds at most
///   [`MokaCacheConfig::max_bytes`]. Eviction is moka's TinyLFU (frequency-aware LRU), so a
///   one-off scan does not flush hot blocks. A block larger than the whole capacity is not kept.
/// - **Expiry**: time-to-live and optional time-to-idle from the [`MokaCacheConfig`].
/// - **Coalesced loads**: concurrent [`get_or_load`](LocalCache::get_or_load) calls for a block
///   that is not cached run one load; the others wait for it and get its bytes, or its error
///   (the same [`LoadError`], shared). A failed load caches nothing; the next call loads again.
///   If the caller whose load is running is cancelled, one of the waiters runs its own load
///   (see *Cancel safety*).
/// - **Invalidation** of a whole object through a secondary index object → block keys, so
///   [`invalidate_object`](LocalCache::invalidate_object) costs O(blocks of that object) and the
///   blocks are gone when it returns (moka's `invalidate_entries_if` would instead register a
///   predicate that every later read evaluates until a background scan over the whole cache has
///   run, per invalidated object). The index holds every cached block, plus possibly some already
///   evicted ones; those are swept out (amortized O(1) per insert) whenever the index has doubled
///   since the last sweep, so it stays within about twice the number of cached blocks.
///   Blocks inserted or loaded *concurrently* with `invalidate_object` may survive it (they stay
///   indexed, so a later call drops them).
///
/// # Statistics
///
/// [`stats()`](LocalCache::stats) counts exactly: `hits` (a `get`/`get_or_load` that found the
/// block), `misses` (one that did not; a `get_or_load` that waited on another caller's load is a
/// miss), `loads` (loads actually run: `loads <= misses` of `get_or_load`), `inserts` (blocks
/// put in by [`insert`](LocalCache::insert) or by a successful load). `entries` and `bytes` are
/// moka's `entry_count` / `weighted_size`, which are **eventually consistent**: they are updated
/// by moka's maintenance, which runs now and then on cache activity. Call
/// [`run_pending_tasks`](MokaCache::run_pending_tasks) first for exact values (tests do).
///
/// # Cancel safety
///
/// Every method keeps the guarantees of [`LocalCache`]'s *Cancel safety* sections. In moka's
/// `try_get_with`, which [`get_or_load`](LocalCache::get_or_load) uses, the load is polled by
/// the call that won the race for the key: dropping that call drops the load (nothing is
/// cached, `loads` has counted it), and one of the calls waiting on it wakes and runs its own
/// `load` (counted again); dropping a waiting call changes nothing for the others. A dropped
/// [`insert`](LocalCache::insert) or load that moka may already have stored still indexes its
/// key (a guard does it on drop), so [`invalidate_object`](LocalCache::invalidate_object) finds
/// every cached block; a dropped `invalidate_object` leaves the blocks it had not reached yet
/// cached and indexed.
///
/// A `MokaCache` is cheap to clone; clones share the same cache and counters.
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use diskless_cache::{BlockKey, BoxError, LocalCache, MokaCache, MokaCacheConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let cache = MokaCache::new(MokaCacheConfig::default().with_max_bytes(64 << 20))?;
/// let key = BlockKey::new("wal/segment-0001", 1 << 20, 0);
///
/// // A miss: the load runs (in real use, a ranged GET of the object).
/// let block = cache
///     .get_or_load(
///         key.clone(),
///         Box::pin(async { Ok::<_, BoxError>(Bytes::from_static(b"block bytes")) }),
///     )
///     .await
///     .map_err(|e| e.to_string())?;
/// assert_eq!(block, Bytes::from_static(b"block bytes"));
///
/// // A hit: no load.
/// assert_eq!(cache.get(&key).await, Some(block));
///
/// // The object was deleted: drop all its blocks.
/// cache.invalidate_object("wal/segment-0001").await;
/// assert_eq!(cache.get(&key).await, None);
///
/// cache.run_pending_tasks().await; // only to make `entries`/`bytes` exact
/// let stats = cache.stats();
/// assert_eq!((stats.hits, stats.misses, stats.loads), (1, 2, 1));
/// assert_eq!((stats.entries, stats.bytes), (0, 0));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MokaCache {
    cache: moka::future::Cache<BlockKey, Bytes>,
    config: MokaCacheConfig,
    counters: Arc<Counters>,
    index: Arc<Mutex<BlockIndex>>,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    loads: AtomicU64,
    inserts: AtomicU64,
}

/// object → keys of its blocks that may be cached.
///
/// Invariant: every block moka holds is in the index. Two rules keep it, whatever the
/// interleaving or cancellation:
/// - a key is added only once its moka insert has returned or was cancelled (never before it
///   started), so no removal that ran before the insert can undo the add;
/// - a key is removed only under the index mutex and only if moka does not hold it at that moment;
///   an insert that completes after that check adds the key again after the mutex is released.
///
/// Keys of blocks moka has since evicted linger until the next sweep (when the index has doubled
/// since the last one, see `index_add`) or until their object is invalidated.
#[derive(Debug)]
struct BlockIndex {
    objects: HashMap<Arc<str>, HashSet<BlockKey>>,
    keys: usize,
    sweep_at: usize,
}

impl Default for BlockIndex {
    fn default() -> Self {
        BlockIndex {
            objects: HashMap::new(),
            keys: 0,
            sweep_at: MIN_SWEEP_AT,
        }
    }
}

impl MokaCache {
    /// A cache with the given settings, once [`MokaCacheConfig::validate`] accepted them.
    pub fn new(config: MokaCacheConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::build(config))
    }

    /// A cache with settings already validated (moka panics on expiries above 1,000 years).
    fn build(config: MokaCacheConfig) -> Self {
        let mut builder = moka::future::Cache::builder()
            .name("diskless-cache")
            .max_capacity(config.max_bytes)
            .weigher(|_key: &BlockKey, block: &Bytes| -> u32 {
                u32::try_from(block.len()).unwrap_or(u32::MAX)
            });
        if let Some(ttl) = config.time_to_live {
            builder = builder.time_to_live(ttl);
        }
        if let Some(tti) = config.time_to_idle {
            builder = builder.time_to_idle(tti);
        }
        MokaCache {
            cache: builder.build(),
            config,
            counters: Arc::new(Counters::default()),
            index: Arc::new(Mutex::new(BlockIndex::default())),
        }
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &MokaCacheConfig {
        &self.config
    }

    /// Runs moka's pending maintenance now: applies evictions (size and expiry) and brings the
    /// `entries` and `bytes` of [`stats()`](LocalCache::stats) up to date. Moka also runs it by
    /// itself now and then; call this where exact numbers matter (tests, metrics snapshots).
    pub async fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks().await;
    }

    /// Drops one block (its key stays in the object index until the next sweep or invalidation,
    /// which the index's invariant allows).
    pub(crate) async fn invalidate_block(&self, key: &BlockKey) {
        self.cache.invalidate(key).await;
    }

    /// The block, if cached, without counting (for [`crate::TwoTierCache`], which counts).
    pub(crate) async fn lookup(&self, key: &BlockKey) -> Option<Bytes> {
        self.cache.get(key).await
    }

    /// Caches a block without counting.
    pub(crate) async fn put(&self, key: BlockKey, block: Bytes) {
        let _index = IndexOnDrop::new(self, &key);
        self.cache.insert(key, block).await;
    }

    /// [`LocalCache::get_or_load`]'s single flight without counting: concurrent callers of one
    /// key share one run of `load`, whose block is cached.
    pub(crate) async fn load_uncounted(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError> {
        let mut index = IndexOnDrop::new(self, &key);
        let loaded = self.cache.try_get_with(key, load).await;
        if loaded.is_err() {
            index.disarm();
        }
        loaded
    }

    /// Records that `key` may be cached. Called only once its moka insert has returned or was
    /// cancelled (see [`IndexOnDrop`]), never before it started.
    fn index_add(&self, key: BlockKey) {
        let mut index = self.index.lock();
        let added = index
            .objects
            .entry(Arc::clone(&key.object))
            .or_default()
            .insert(key);
        if added {
            index.keys += 1;
        }
        if index.keys >= index.sweep_at {
            let before = index.keys;
            let mut keys = 0;
            index.objects.retain(|_, blocks| {
                blocks.retain(|key| self.cache.contains_key(key));
                keys += blocks.len();
                !blocks.is_empty()
            });
            index.keys = keys;
            index.sweep_at = (keys * 2).max(MIN_SWEEP_AT);
            tracing::trace!(before, after = keys, "swept the cache's block index");
        }
    }

    /// Unindexes those of `keys` (all of `object`) that moka does not hold.
    fn index_remove_absent(&self, object: &str, keys: &[BlockKey]) {
        let mut index = self.index.lock();
        let Some(blocks) = index.objects.get_mut(object) else {
            return;
        };
        let before = blocks.len();
        for key in keys {
            if !self.cache.contains_key(key) {
                blocks.remove(key);
            }
        }
        let removed = before - blocks.len();
        if blocks.is_empty() {
            index.objects.remove(object);
        }
        index.keys -= removed;
    }
}

/// Indexes a key when dropped: at the end of an insert, or when the insert's future is cancelled
/// (moka may have put the block in its map before the cancellation point).
struct IndexOnDrop<'a> {
    cache: &'a MokaCache,
    key: Option<BlockKey>,
}

impl<'a> IndexOnDrop<'a> {
    fn new(cache: &'a MokaCache, key: &BlockKey) -> Self {
        IndexOnDrop {
            cache,
            key: Some(key.clone()),
        }
    }

    /// Nothing was cached: do not index.
    fn disarm(&mut self) {
        self.key = None;
    }
}

impl Drop for IndexOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.cache.index_add(key);
        }
    }
}

impl Default for MokaCache {
    /// A cache with [`MokaCacheConfig::default()`] (valid, so this cannot fail).
    fn default() -> Self {
        MokaCache::build(MokaCacheConfig::default())
    }
}

impl std::fmt::Debug for MokaCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MokaCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LocalCache for MokaCache {
    async fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let found = self.cache.get(key).await;
        let counter = if found.is_some() {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    async fn insert(&self, key: BlockKey, block: Bytes) {
        let _index = IndexOnDrop::new(self, &key);
        self.cache.insert(key, block).await;
        self.counters.inserts.fetch_add(1, Ordering::Relaxed);
    }

    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError> {
        if let Some(block) = self.cache.get(&key).await {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(block);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        // moka runs at most one of the concurrent callers' `init` futures per key; the others are
        // dropped without being polled, so `loads` counts loads actually run.
        let counters = Arc::clone(&self.counters);
        let init = async move {
            counters.loads.fetch_add(1, Ordering::Relaxed);
            let loaded = load.await;
            if loaded.is_ok() {
                counters.inserts.fetch_add(1, Ordering::Relaxed);
            }
            loaded
        };
        let mut index = IndexOnDrop::new(self, &key);
        let loaded = self.cache.try_get_with(key, init).await;
        if loaded.is_err() {
            index.disarm();
        }
        loaded
    }

    async fn invalidate_object(&self, object: &str) {
        // Invalidate a snapshot of the object's keys first and unindex them only afterwards (and
        // only those moka no longer holds): cancelled half-way, or racing an insert of the same
        // key, the index still covers every cached block.
        let blocks: Vec<BlockKey> = match self.index.lock().objects.get(object) {
            Some(blocks) => blocks.iter().cloned().collect(),
            None => return,
        };
        for key in &blocks {
            self.cache.invalidate(key).await;
        }
        self.index_remove_absent(object, &blocks);
        tracing::debug!(object, blocks = blocks.len(), "invalidated a cached object");
    }

    fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.counters.hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            loads: self.counters.loads.load(Ordering::Relaxed),
            inserts: self.counters.inserts.load(Ordering::Relaxed),
            entries: self.cache.entry_count(),
            bytes: self.cache.weighted_size(),
        }
    }
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn key(object: &str, index: u64) -> BlockKey {
        BlockKey::new(object, 16, index)
    }

    #[tokio::test]
    async fn index_sweep_drops_evicted_keys_and_keeps_cached_ones() {
        let cache = MokaCache::default();
        // Insert and explicitly evict (behind the index's back) more keys than the sweep floor.
        for i in 0..(MIN_SWEEP_AT as u64 - 1) {
            let k = key("gone", i);
            cache.insert(k.clone(), Bytes::from_static(b"x")).await;
            cache.cache.invalidate(&k).await;
        }
        assert_eq!(cache.index.lock().keys, MIN_SWEEP_AT - 1);
        // This insert reaches the sweep threshold.
        cache.insert(key("kept", 0), Bytes::from_static(b"y")).await;
        {
            let index = cache.index.lock();
            assert_eq!(index.keys, 1);
            assert!(!index.objects.contains_key("gone"));
            assert_eq!(index.objects.get("kept").map(HashSet::len), Some(1));
            assert_eq!(index.sweep_at, MIN_SWEEP_AT);
        }
        cache.invalidate_object("kept").await;
        assert_eq!(cache.get(&key("kept", 0)).await, None);
        assert_eq!(cache.index.lock().keys, 0);
    }

    #[test]
    fn expiry_settings_moka_cannot_take_are_rejected_not_clamped() {
        let longest = MokaCacheConfig::default()
            .with_time_to_live(MAX_EXPIRY)
            .with_time_to_idle(MAX_EXPIRY);
        let cache = MokaCache::new(longest.clone()).unwrap();
        assert_eq!(cache.config(), &longest);
        let too_long = MAX_EXPIRY + Duration::from_secs(1);
        for (config, field) in [
            (longest.clone().with_time_to_live(too_long), "time_to_live"),
            (
                longest.clone().with_time_to_idle(Duration::MAX),
                "time_to_idle",
            ),
            (
                longest.clone().with_time_to_live(Duration::ZERO),
                "time_to_live",
            ),
            (
                longest.clone().with_time_to_idle(Duration::ZERO),
                "time_to_idle",
            ),
        ] {
            match MokaCache::new(config) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected a rejection, got {other:?}"),
            }
        }
    }
}
