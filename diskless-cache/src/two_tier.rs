//! [`TwoTierCache`]: a [`MokaCache`] in memory in front of a [`DiskCache`] on local disk
//! (KIP-1163's "local segments" for reads, issue 15).

use crate::{BlockKey, BoxError, CacheStats, DiskCache, LoadError, LocalCache, MokaCache};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Hot blocks in memory, the working set on local disk: a [`LocalCache`] made of a [`MokaCache`]
/// (the memory tier) in front of a [`DiskCache`] (the disk tier).
///
/// - **Reads**: the memory tier first; on a miss the disk tier (a verified read: header and
///   CRC-32C), and a block found there is copied into memory; on a miss of both,
///   [`LocalCache::get_or_load`] runs the load once for all concurrent callers (the memory tier's
///   single flight covers the disk lookup too) and writes the block to both tiers.
/// - **Inclusive**: the memory tier holds only blocks the disk tier holds. A block the disk tier
///   drops (its byte bound, a file failing verification or deleted behind its back) is dropped from
///   memory too, right after the write that caused it; so the blocks this cache can answer are
///   bounded by the disk tier's `max_bytes`, and [`CacheStats::entries`] / [`CacheStats::bytes`]
///   are the disk tier's. (Two concurrent writes may leave a block in memory for a moment after
///   the disk dropped it; the memory tier's own bound still holds.)
/// - **Restart**: the disk tier keeps its blocks (see [`DiskCache`]); the memory tier starts
///   empty and fills from disk hits, without a GET.
/// - **Counters** are the two tiers seen as one cache: a hit is a block found in either tier, a
///   miss one found in neither, a load one run against object storage.
///
/// ```
/// use diskless_cache::{BlockKey, DiskCache, DiskCacheConfig, LocalCache, MokaCache, MokaCacheConfig, TwoTierCache};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let memory = MokaCache::new(MokaCacheConfig::default().with_max_bytes(64 << 20))?;
/// let disk = DiskCache::open(DiskCacheConfig::new(dir.path()).with_max_bytes(1 << 30)).await?;
/// let cache = TwoTierCache::new(memory, disk);
/// let key = BlockKey::new("wal/0001", 4 << 20, 0);
/// cache.insert(key.clone(), bytes::Bytes::from_static(b"block")).await;
/// assert_eq!(cache.get(&key).await.as_deref(), Some(&b"block"[..]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TwoTierCache {
    memory: MokaCache,
    disk: Arc<DiskCache>,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    loads: AtomicU64,
    inserts: AtomicU64,
}

impl TwoTierCache {
    /// `memory` in front of `disk`. Both keep their own settings (byte bounds, time to live).
    pub fn new(memory: MokaCache, disk: DiskCache) -> Self {
        disk.track_dropped();
        TwoTierCache {
            memory,
            disk: Arc::new(disk),
            counters: Arc::new(Counters::default()),
        }
    }

    /// The memory tier (its own counters count its lookups, including the misses the disk tier
    /// then answered).
    pub fn memory(&self) -> &MokaCache {
        &self.memory
    }

    /// The disk tier.
    pub fn disk(&self) -> &DiskCache {
        &self.disk
    }

    /// Runs the memory tier's pending maintenance (see [`MokaCache::run_pending_tasks`]).
    pub async fn run_pending_tasks(&self) {
        self.memory.run_pending_tasks().await;
    }

    /// Drops from memory what the disk tier dropped since the last call.
    async fn follow_disk(&self) {
        for key in self.disk.take_dropped() {
            self.memory.invalidate_block(&key).await;
        }
    }
}

#[async_trait]
impl LocalCache for TwoTierCache {
    async fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let found = match self.memory.lookup(key).await {
            Some(block) => Some(block),
            None => match self.disk.lookup(key).await {
                Some(block) => {
                    self.memory.put(key.clone(), block.clone()).await;
                    Some(block)
                }
                None => None,
            },
        };
        // A disk read that failed verification dropped the block.
        self.follow_disk().await;
        let counter = if found.is_some() {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    async fn insert(&self, key: BlockKey, block: Bytes) {
        self.counters.inserts.fetch_add(1, Ordering::Relaxed);
        self.disk.store(key.clone(), block.clone()).await;
        self.follow_disk().await;
        if self.disk.lookup_indexed(&key) {
            self.memory.put(key, block).await;
        }
    }

    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError> {
        if let Some(block) = self.memory.lookup(&key).await {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(block);
        }
        // The memory tier's single flight: one caller reads the disk tier, and on a miss there
        // runs the load and writes the block to disk; the others wait for it (and count a miss:
        // they found the block in neither tier themselves).
        let disk = Arc::clone(&self.disk);
        let counters = Arc::clone(&self.counters);
        let from_disk = Arc::new(AtomicBool::new(false));
        let fill = {
            let from_disk = Arc::clone(&from_disk);
            let disk_key = key.clone();
            async move {
                if let Some(block) = disk.lookup(&disk_key).await {
                    from_disk.store(true, Ordering::Relaxed);
                    return Ok(block);
                }
                counters.loads.fetch_add(1, Ordering::Relaxed);
                let block = load.await?;
                counters.inserts.fetch_add(1, Ordering::Relaxed);
                disk.store(disk_key, block.clone()).await;
                Ok(block)
            }
        };
        let loaded = self
            .memory
            .load_uncounted(key.clone(), Box::pin(fill))
            .await;
        let counter = if from_disk.load(Ordering::Relaxed) {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.follow_disk().await;
        if loaded.is_ok() && !self.disk.lookup_indexed(&key) {
            // Not kept on disk (larger than its bound): not kept in memory either.
            self.memory.invalidate_block(&key).await;
        }
        loaded
    }

    async fn invalidate_object(&self, object: &str) {
        self.disk.invalidate_object(object).await;
        self.memory.invalidate_object(object).await;
    }

    fn stats(&self) -> CacheStats {
        let disk = self.disk.stats();
        CacheStats {
            hits: self.counters.hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            loads: self.counters.loads.load(Ordering::Relaxed),
            inserts: self.counters.inserts.load(Ordering::Relaxed),
            entries: disk.entries,
            bytes: disk.bytes,
        }
    }
}
