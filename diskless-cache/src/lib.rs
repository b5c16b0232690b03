//! The local cache of diskless topics: hot bytes of WAL segments kept off object storage.
//!
//! Objects are cached in aligned blocks: block `i` of an object holds its bytes
//! `i * block_size .. min((i + 1) * block_size, object_size)`. The block size is chosen by the user
//! of the cache (the fetcher) and is part of the key, so caches with different block sizes never mix.
//! [`LocalCache`] is the trait; [`MokaCache`] is the default implementation, bounded by bytes,
//! with a time-to-live, and with concurrent misses of one block coalesced into one load.
//! [`DiskCache`] keeps blocks in files on local disk: bounded by bytes (LRU), kept across a
//! restart, and verified (CRC-32C) on every read. [`TwoTierCache`] puts a `MokaCache` in front of a
//! `DiskCache`: hot blocks in memory, the working set on disk.
//!
//! # Cancel safety
//!
//! Every [`LocalCache`] method may be cancelled (its future dropped) at any await point without
//! leaving a partial block or a broken cache behind; what exactly survives a cancellation is
//! said on each method. The one method where a cancellation reaches other callers is
//! [`LocalCache::get_or_load`], whose load is shared by concurrent callers.

#![cfg_attr(docsrs, feature(doc_cfg))]

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;

mod disk_cache;
mod moka_cache;
mod two_tier;

pub use disk_cache::{DiskCache, DiskCacheConfig, DiskCacheError};
pub use moka_cache::{ConfigError, MokaCache, MokaCacheConfig};
pub use two_tier::TwoTierCache;

pub use diskless_common::BoxError;

/// The key of one cached block.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    /// The object key.
    pub object: Arc<str>,
    /// The block size the block was cut with.
    pub block_size: u64,
    /// The block index: the block starts at `index * block_size`.
    pub index: u64,
}

impl BlockKey {
    /// The key of block `index` of `object`.
    pub fn new(object: impl Into<Arc<str>>, block_size: u64, index: u64) -> Self {
        BlockKey {
            object: object.into(),
            block_size,
            index,
        }
    }

    /// Where the block starts in the object.
    pub fn start(&self) -> u64 {
        self.index * self.block_size
    }
}

/// Counters of a cache, readable at any time.
///
/// `#[non_exhaustive]`: counters may be added. A [`LocalCache`] implemented outside this crate
/// builds its stats with [`CacheStats::default`] and the `with_*` methods.
///
/// ```
/// use diskless_cache::CacheStats;
/// let stats = CacheStats::default().with_hits(3).with_misses(1).with_loads(1);
/// assert_eq!((stats.hits, stats.misses, stats.loads, stats.inserts), (3, 1, 1, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to load.
    pub misses: u64,
    /// Loads actually run (less than `misses` when concurrent misses were coalesced).
    pub loads: u64,
    /// Blocks inserted (by loads or by [`LocalCache::insert`]).
    pub inserts: u64,
    /// Blocks currently held.
    pub entries: u64,
    /// Bytes currently held.
    pub bytes: u64,
}

diskless_common::with_setters!(CacheStats {
    with_hits => hits: [u64],
    with_misses => misses: [u64],
    with_loads => loads: [u64],
    with_inserts => inserts: [u64],
    with_entries => entries: [u64],
    with_bytes => bytes: [u64],
});

/// A load of one block that failed; shared by every caller that waited on the same load.
pub type LoadError = Arc<BoxError>;

/// A cache of object blocks.
///
/// Object-safe: hosts hold an `Arc<dyn LocalCache>`; `Arc<T>` and `Box<T>` of a cache are caches
/// too. Each method says what a cancellation (its future dropped before it completes) leaves
/// behind; implementations must keep those guarantees.
#[async_trait]
pub trait LocalCache: Send + Sync + std::fmt::Debug {
    /// The block, if cached. Counts a hit or a miss.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads. A cancelled call may or may not have been counted.
    async fn get(&self, key: &BlockKey) -> Option<Bytes>;

    /// Caches a block (e.g. one of a segment just uploaded).
    ///
    /// # Cancel safety
    ///
    /// A cancelled insert may or may not have cached the block; either way the cache stays
    /// consistent (a block it holds is always found by [`LocalCache::invalidate_object`]).
    async fn insert(&self, key: BlockKey, block: Bytes);

    /// The block, loading it with `load` on a miss. Concurrent calls for the same key while a load runs
    /// wait for that one load instead of starting their own. A failed load caches nothing.
    ///
    /// # Cancel safety
    ///
    /// The load runs inside the call that started it, not in a task of its own. So dropping a
    /// `get_or_load` future:
    ///
    /// - that was waiting on another caller's load: leaves that load running for the others; its
    ///   own `load` is dropped without being polled;
    /// - that was running the load: drops the load at its current await point (e.g. abandons the
    ///   ranged GET) and caches nothing. Callers waiting on it are not failed: one of them starts
    ///   its own `load` (so a cancelled load may be followed by another, counted in
    ///   [`CacheStats::loads`]); with no waiter, nothing remains, and the next call loads again.
    ///
    /// A cache never holds part of a block, and a cancelled load's error is never shared.
    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError>;

    /// Drops every cached block of an object (e.g. once it is deleted).
    ///
    /// # Cancel safety
    ///
    /// A cancelled call may have dropped some of the object's blocks and not others; the ones
    /// left are still found by a later call, which finishes the job.
    async fn invalidate_object(&self, object: &str);

    /// The cache's counters.
    fn stats(&self) -> CacheStats;
}

/// Forwards every [`LocalCache`] method to the cache behind a pointer (`Arc<T>`, `Box<T>`).
macro_rules! forward_through_pointer {
    ($pointer:ident) => {
        #[async_trait]
        impl<T: LocalCache + ?Sized> LocalCache for $pointer<T> {
            async fn get(&self, key: &BlockKey) -> Option<Bytes> {
                (**self).get(key).await
            }

            async fn insert(&self, key: BlockKey, block: Bytes) {
                (**self).insert(key, block).await
            }

            async fn get_or_load(
                &self,
                key: BlockKey,
                load: BoxFuture<'static, Result<Bytes, BoxError>>,
            ) -> Result<Bytes, LoadError> {
                (**self).get_or_load(key, load).await
            }

            async fn invalidate_object(&self, object: &str) {
                (**self).invalidate_object(object).await
            }

            fn stats(&self) -> CacheStats {
                (**self).stats()
            }
        }
    };
}

forward_through_pointer!(Arc);
forward_through_pointer!(Box);
