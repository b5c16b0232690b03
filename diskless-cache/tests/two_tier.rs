//! `TwoTierCache` (a `MokaCache` in front of a `DiskCache`): the testkit's `LocalCache`
//! conformance suite, and what the composition adds: a restart keeps the disk tier and refills
//! memory from it without a load, the memory tier never answers a block the disk tier dropped, a
//! disk hit is copied into memory.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{
    BlockKey, BoxError, DiskCache, DiskCacheConfig, LocalCache, MokaCache, MokaCacheConfig,
    TwoTierCache,
};
use diskless_testkit::cache::{self, CacheFactory};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Each cache in a fresh subdirectory: the disk tier holds `max_bytes`, memory a quarter of it.
struct TwoTier {
    root: tempfile::TempDir,
    made: AtomicUsize,
}

impl TwoTier {
    fn new() -> Self {
        TwoTier {
            root: tempfile::tempdir().expect("a temporary directory"),
            made: AtomicUsize::new(0),
        }
    }
}

async fn open(dir: &Path, memory_bytes: u64, disk_bytes: u64) -> TwoTierCache {
    let memory = MokaCache::new(MokaCacheConfig::default().with_max_bytes(memory_bytes))
        .expect("a valid memory tier");
    let disk = DiskCache::open(DiskCacheConfig::new(dir).with_max_bytes(disk_bytes))
        .await
        .expect("a disk tier");
    TwoTierCache::new(memory, disk)
}

#[async_trait]
impl CacheFactory for TwoTier {
    type Cache = TwoTierCache;

    async fn create(&self, max_bytes: u64) -> TwoTierCache {
        let n = self.made.fetch_add(1, Ordering::SeqCst);
        open(
            &self.root.path().join(n.to_string()),
            (max_bytes / 4).max(1),
            max_bytes,
        )
        .await
    }

    async fn settle(&self, cache: &TwoTierCache) {
        cache.run_pending_tasks().await;
    }
}

diskless_testkit::cache_conformance!(two_tier, TwoTier::new());

#[tokio::test(flavor = "current_thread")]
async fn concurrent_get_or_load_runs_one_load_single_thread() {
    cache::concurrent_get_or_load_runs_one_load(&TwoTier::new()).await;
}

fn block(tag: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| tag.wrapping_add(i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn counting_load(
    bytes: Bytes,
    count: &Arc<AtomicUsize>,
) -> futures::future::BoxFuture<'static, Result<Bytes, BoxError>> {
    let count = Arc::clone(count);
    Box::pin(async move {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(bytes)
    })
}

/// After a restart the disk tier still holds the blocks: `get` and `get_or_load` answer them
/// without a load, and each disk hit is copied into the (new, empty) memory tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_disk_tier_and_refills_memory_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<BlockKey> = (0..4).map(|i| BlockKey::new("wal/a", 1024, i)).collect();
    {
        let cache = open(dir.path(), 1 << 20, 1 << 20).await;
        for (i, key) in keys.iter().enumerate() {
            cache.insert(key.clone(), block(i as u8, 1024)).await;
        }
    }
    let cache = open(dir.path(), 1 << 20, 1 << 20).await;
    cache.run_pending_tasks().await;
    assert_eq!(cache.memory().stats().entries, 0, "memory starts empty");
    assert_eq!(cache.stats().entries, 4, "the disk tier kept every block");
    let count = Arc::new(AtomicUsize::new(0));
    assert_eq!(cache.get(&keys[0]).await, Some(block(0, 1024)));
    let got = cache
        .get_or_load(keys[1].clone(), counting_load(block(9, 9), &count))
        .await
        .unwrap();
    assert_eq!(got, block(1, 1024), "the disk tier's block, not a load");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    cache.run_pending_tasks().await;
    assert_eq!(
        cache.memory().stats().entries,
        2,
        "both disk hits copied to memory"
    );
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.loads), (2, 0, 0));
    // A memory hit does not read the disk: delete the file behind the cache's back.
    std::fs::remove_file(cache.disk().file_path(&keys[0])).unwrap();
    assert_eq!(cache.get(&keys[0]).await, Some(block(0, 1024)));
}

/// The memory tier holds only what the disk tier holds: blocks the disk tier evicts by its byte
/// bound are not answered from memory, however large the memory tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_the_disk_tier_drops_leave_memory_too() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20, 3 * 1024).await;
    let count = Arc::new(AtomicUsize::new(0));
    for i in 0..6u64 {
        let key = BlockKey::new("wal/b", 1024, i);
        if i % 2 == 0 {
            cache.insert(key, block(i as u8, 1024)).await;
        } else {
            cache
                .get_or_load(key, counting_load(block(i as u8, 1024), &count))
                .await
                .unwrap();
        }
    }
    cache.run_pending_tasks().await;
    let held: Vec<u64> = {
        let mut held = Vec::new();
        for i in 0..6u64 {
            if cache.get(&BlockKey::new("wal/b", 1024, i)).await.is_some() {
                held.push(i);
            }
        }
        held
    };
    assert_eq!(
        held,
        vec![3, 4, 5],
        "the three most recent blocks, from either tier"
    );
    assert_eq!(cache.stats().bytes, 3 * 1024);

    // A block too large for the disk tier is kept in neither tier.
    let huge = BlockKey::new("wal/huge", 4096, 0);
    let got = cache
        .get_or_load(huge.clone(), counting_load(block(7, 4096), &count))
        .await
        .unwrap();
    assert_eq!(
        got.len(),
        4096,
        "the loaded bytes are returned even when not kept"
    );
    cache.run_pending_tasks().await;
    assert_eq!(cache.get(&huge).await, None);
}

/// A block file that fails verification is a miss of the disk tier: the next `get_or_load` loads
/// the block again (the corrupt bytes are never served) and keeps the fresh copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_disk_block_is_loaded_again_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let key = BlockKey::new("wal/c", 1024, 0);
    {
        let cache = open(dir.path(), 1 << 20, 1 << 20).await;
        cache.insert(key.clone(), block(1, 1024)).await;
        let path = cache.disk().file_path(&key);
        let mut data = std::fs::read(&path).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(&path, data).unwrap();
    }
    let cache = open(dir.path(), 1 << 20, 1 << 20).await;
    let count = Arc::new(AtomicUsize::new(0));
    let got = cache
        .get_or_load(key.clone(), counting_load(block(1, 1024), &count))
        .await
        .unwrap();
    assert_eq!(got, block(1, 1024));
    assert_eq!(count.load(Ordering::SeqCst), 1, "loaded again");
    assert_eq!(cache.disk().verification_failures(), 1);
    assert_eq!(cache.get(&key).await, Some(block(1, 1024)));
}
