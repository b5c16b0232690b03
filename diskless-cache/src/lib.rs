//! The local cache of diskless topics: hot bytes of WAL segments kept off object storage.
//!
//! Objects are cached in aligned blocks: block `i` of an object holds its bytes
//! `i * block_size .. min((i + 1) * block_size, object_size)`. The block size is chosen by the user
//! of the cache (the fetcher) and is part of the key, so caches with different block sizes never mix.
//! [`LocalCache`] is the trait; [`MokaCache`] is the default implementation, bounded by bytes,
//! with a time-to-live, and with concurrent misses of one block coalesced into one load.

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;

mod moka_cache;

pub use moka_cache::{MokaCache, MokaCacheConfig};

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// A load of one block that failed; shared by every caller that waited on the same load.
pub type LoadError = Arc<BoxError>;

/// A cache of object blocks.
#[async_trait]
pub trait LocalCache: Send + Sync + std::fmt::Debug {
    /// The block, if cached. Counts a hit or a miss.
    async fn get(&self, key: &BlockKey) -> Option<Bytes>;

    /// Caches a block (e.g. one of a segment just uploaded).
    async fn insert(&self, key: BlockKey, block: Bytes);

    /// The block, loading it with `load` on a miss. Concurrent calls for the same key while a load runs
    /// wait for that one load instead of starting their own. A failed load caches nothing.
    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError>;

    /// Drops every cached block of an object (e.g. once it is deleted).
    async fn invalidate_object(&self, object: &str);

    /// The cache's counters.
    fn stats(&self) -> CacheStats;
}
