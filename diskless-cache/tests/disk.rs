//! `DiskCache`: the testkit's `LocalCache` conformance suite (one test per case, in a temporary
//! directory per cache), and what a disk tier adds: restart survival, the byte bound with LRU
//! eviction, verification of every read (flipped bytes, truncation, a header naming another
//! key), files it did not write, invalidation across a restart, coalesced loads.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{
    BlockKey, BoxError, CacheStats, DiskCache, DiskCacheConfig, DiskCacheError, LocalCache,
};
use diskless_testkit::cache::{self, CacheFactory};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Makes each cache in a fresh subdirectory of one temporary directory.
struct Disk {
    root: tempfile::TempDir,
    made: AtomicUsize,
}

impl Disk {
    fn new() -> Self {
        Disk {
            root: tempfile::tempdir().expect("a temporary directory"),
            made: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl CacheFactory for Disk {
    type Cache = DiskCache;

    async fn create(&self, max_bytes: u64) -> DiskCache {
        let n = self.made.fetch_add(1, Ordering::SeqCst);
        let config =
            DiskCacheConfig::new(self.root.path().join(n.to_string())).with_max_bytes(max_bytes);
        DiskCache::open(config).await.expect("a disk cache")
    }
}

diskless_testkit::cache_conformance!(disk, Disk::new());

#[tokio::test(flavor = "current_thread")]
async fn concurrent_get_or_load_runs_one_load_single_thread() {
    cache::concurrent_get_or_load_runs_one_load(&Disk::new()).await;
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

async fn open(dir: &Path, max_bytes: u64) -> DiskCache {
    DiskCache::open(DiskCacheConfig::new(dir).with_max_bytes(max_bytes))
        .await
        .unwrap()
}

/// The names of the files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn block_files(dir: &Path) -> Vec<String> {
    files(dir)
        .into_iter()
        .filter(|n| n.ends_with(".blk"))
        .collect()
}

#[test]
fn config_rejects_a_zero_bound_and_keeps_its_settings() {
    let config = DiskCacheConfig::new("/tmp/x");
    assert_eq!(config.max_bytes, DiskCacheConfig::DEFAULT_MAX_BYTES);
    assert_eq!(config.dir, PathBuf::from("/tmp/x"));
    assert!(config.validate().is_ok());
    let config = config.with_dir("/tmp/y").with_max_bytes(0);
    assert_eq!(config.dir, PathBuf::from("/tmp/y"));
    assert!(config.validate().is_err());
}

#[tokio::test]
async fn open_rejects_a_zero_bound_and_an_unusable_directory() {
    let dir = tempfile::tempdir().unwrap();
    let zero = DiskCache::open(DiskCacheConfig::new(dir.path()).with_max_bytes(0)).await;
    assert!(matches!(zero, Err(DiskCacheError::Config(_))), "{zero:?}");
    // A regular file where the directory should be.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let not_dir = DiskCache::open(DiskCacheConfig::new(&file)).await;
    assert!(
        matches!(not_dir, Err(DiskCacheError::Io { .. })),
        "{not_dir:?}"
    );
}

#[tokio::test]
async fn blocks_survive_a_restart_and_are_served_without_loading() {
    let dir = tempfile::tempdir().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let keys: Vec<BlockKey> = (0..5)
        .map(|i| BlockKey::new(format!("topic/wal/{i:04}"), 1024, i))
        .collect();
    {
        let cache = open(dir.path(), 1 << 20).await;
        for (i, key) in keys.iter().enumerate() {
            if i % 2 == 0 {
                cache.insert(key.clone(), block(i as u8, 1000)).await;
            } else {
                let got = cache
                    .get_or_load(key.clone(), counting_load(block(i as u8, 1000), &count))
                    .await;
                assert_eq!(got.ok(), Some(block(i as u8, 1000)));
            }
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }
    assert_eq!(block_files(dir.path()).len(), 5);
    let cache = open(dir.path(), 1 << 20).await;
    assert_eq!(
        cache.stats(),
        CacheStats::default().with_entries(5).with_bytes(5000),
        "the index is rebuilt from the files; the counters start afresh"
    );
    for (i, key) in keys.iter().enumerate() {
        let got = cache
            .get_or_load(key.clone(), counting_load(block(0, 1), &count))
            .await;
        assert_eq!(got.ok(), Some(block(i as u8, 1000)), "block {i}");
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "no load after the restart");
    assert_eq!(cache.stats().hits, 5);
    assert_eq!(cache.verification_failures(), 0);
}

#[tokio::test]
async fn the_least_recently_used_block_is_evicted_and_oversized_blocks_are_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 300).await;
    let key = |i| BlockKey::new("obj", 100, i);
    for i in 0..3 {
        cache.insert(key(i), block(i as u8, 100)).await;
    }
    // Block 0 is read, so block 1 is now the least recently used.
    assert!(cache.get(&key(0)).await.is_some());
    cache.insert(key(3), block(3, 100)).await;
    assert_eq!(cache.get(&key(1)).await, None, "the LRU block was evicted");
    assert!(!cache.file_path(&key(1)).exists(), "and its file deleted");
    for i in [0, 2, 3] {
        assert_eq!(cache.get(&key(i)).await, Some(block(i as u8, 100)), "{i}");
    }
    assert_eq!((cache.stats().entries, cache.stats().bytes), (3, 300));
    // A bigger block evicts as many as needed, least recently used first (the reads above
    // left the order 0, 2, 3).
    cache.insert(key(4), block(4, 200)).await;
    assert_eq!(cache.get(&key(0)).await, None);
    assert_eq!(cache.get(&key(2)).await, None);
    assert_eq!(cache.get(&key(3)).await, Some(block(3, 100)));
    assert_eq!(cache.get(&key(4)).await, Some(block(4, 200)));
    assert_eq!(block_files(dir.path()).len(), 2);
    // A block larger than the bound is not cached, evicts nothing, and writes no file.
    let huge = BlockKey::new("huge", 301, 0);
    cache.insert(huge.clone(), block(9, 301)).await;
    assert_eq!(cache.get(&huge).await, None);
    assert!(!cache.file_path(&huge).exists());
    assert_eq!((cache.stats().entries, cache.stats().bytes), (2, 300));
    // Replacing a cached block by an oversized one drops the old version.
    cache.insert(key(3), block(8, 400)).await;
    assert_eq!(cache.get(&key(3)).await, None);
    assert_eq!(block_files(dir.path()).len(), 1);
    // Reopened with a lower bound, the cache trims itself to it.
    drop(cache);
    cache_within_bound_after_reopen(dir.path()).await;
}

async fn cache_within_bound_after_reopen(dir: &Path) {
    {
        let cache = open(dir, 1000).await;
        for i in 10..15 {
            cache
                .insert(BlockKey::new("more", 100, i), block(i as u8, 100))
                .await;
        }
        assert_eq!(cache.stats().bytes, 700);
    }
    let cache = open(dir, 250).await;
    let stats = cache.stats();
    assert!(stats.bytes <= 250, "{stats:?}");
    assert!(stats.entries >= 1);
    assert_eq!(block_files(dir).len() as u64, stats.entries);
}

/// Damages the file of `key` (cached in `dir`), then checks it is never served, is deleted, and
/// is counted; a new insert of the key is served again.
async fn damaged_file_is_never_served(what: &str, damage: impl Fn(&Path, &Path)) {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20).await;
    let key = BlockKey::new("topic/wal/0007", 4096, 3);
    let other = BlockKey::new("topic/wal/0008", 4096, 0);
    cache.insert(key.clone(), block(7, 4096)).await;
    cache.insert(other.clone(), block(8, 4096)).await;
    let path = cache.file_path(&key);
    assert!(path.exists(), "{what}");
    damage(&path, &cache.file_path(&other));
    let before = cache.stats();
    assert_eq!(cache.get(&key).await, None, "{what}: damaged bytes served");
    assert!(!path.exists(), "{what}: the damaged file is deleted");
    assert_eq!(cache.verification_failures(), 1, "{what}");
    let after = cache.stats();
    assert_eq!(after.misses, before.misses + 1, "{what}: counted as a miss");
    assert_eq!((after.entries, after.bytes), (1, 4096), "{what}: unindexed");
    // get_or_load loads it again and serves the loaded bytes.
    let count = Arc::new(AtomicUsize::new(0));
    let got = cache
        .get_or_load(key.clone(), counting_load(block(7, 4096), &count))
        .await;
    assert_eq!(got.ok(), Some(block(7, 4096)), "{what}");
    assert_eq!(count.load(Ordering::SeqCst), 1, "{what}");
    assert_eq!(cache.get(&key).await, Some(block(7, 4096)), "{what}");
    assert_eq!(cache.get(&other).await, Some(block(8, 4096)), "{what}");
}

#[tokio::test]
async fn a_flipped_payload_byte_is_never_served() {
    damaged_file_is_never_served("flipped payload byte", |path, _| {
        let mut data = std::fs::read(path).unwrap();
        let last = data.len() - 1;
        data[last] ^= 0x40;
        std::fs::write(path, data).unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_truncated_file_is_never_served() {
    damaged_file_is_never_served("truncated", |path, _| {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let len = file.metadata().unwrap().len();
        file.set_len(len - 1).unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_flipped_header_byte_is_never_served() {
    damaged_file_is_never_served("flipped key byte in the header", |path, _| {
        let mut data = std::fs::read(path).unwrap();
        // The object key starts after the 40-byte fixed header: "topic/..." -> "Topic/...".
        assert_eq!(data[40], b't');
        data[40] = b'T';
        std::fs::write(path, data).unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_file_whose_header_names_another_key_is_never_served() {
    // A valid block file of another key, under this key's name.
    damaged_file_is_never_served("header of another key", |path, other| {
        std::fs::copy(other, path).unwrap();
    })
    .await;
}

#[tokio::test]
async fn damaged_and_foreign_files_are_handled_at_open_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let good = BlockKey::new("good/object", 512, 1);
    let flipped = BlockKey::new("flipped/object", 512, 2);
    let cut = BlockKey::new("cut/object", 512, 3);
    let moved = BlockKey::new("moved/object", 512, 4);
    let moved_to;
    {
        let cache = open(dir.path(), 1 << 20).await;
        for (i, key) in [&good, &flipped, &cut, &moved].into_iter().enumerate() {
            cache.insert(key.clone(), block(i as u8, 512)).await;
        }
        // A header bit flip (the payload length), a truncation, and a valid file renamed to a
        // name that is not its key's.
        let path = cache.file_path(&flipped);
        let mut data = std::fs::read(&path).unwrap();
        data[28] ^= 0x01;
        std::fs::write(&path, data).unwrap();
        let path = cache.file_path(&cut);
        let data = std::fs::read(&path).unwrap();
        std::fs::write(&path, &data[..30]).unwrap();
        moved_to = dir.path().join(format!("{:032x}.blk", 0xabcdef_u128));
        std::fs::rename(cache.file_path(&moved), &moved_to).unwrap();
    }
    // Files the cache did not write: garbage under a block name, an empty block file, a
    // leftover temporary file, a file of someone else's, and a directory.
    let garbage = dir.path().join(format!("{:032x}.blk", 1_u128));
    std::fs::write(&garbage, b"not a block file at all").unwrap();
    let empty = dir.path().join(format!("{:032x}.blk", 2_u128));
    std::fs::write(&empty, b"").unwrap();
    let tmp = dir.path().join(format!("{:032x}.17.tmp", 3_u128));
    std::fs::write(&tmp, b"half a write").unwrap();
    let foreign = dir.path().join("README.txt");
    std::fs::write(&foreign, b"someone else's file").unwrap();
    std::fs::create_dir(dir.path().join("subdir.blk")).unwrap();

    let cache = open(dir.path(), 1 << 20).await;
    assert_eq!((cache.stats().entries, cache.stats().bytes), (1, 512));
    assert_eq!(cache.get(&good).await, Some(block(0, 512)));
    for key in [&flipped, &cut, &moved] {
        assert_eq!(cache.get(key).await, None, "{key:?}");
    }
    for deleted in [&garbage, &empty, &tmp, &moved_to] {
        assert!(!deleted.exists(), "{} not deleted", deleted.display());
    }
    assert!(foreign.exists(), "files of other names are left alone");
    assert!(dir.path().join("subdir.blk").is_dir());
    let good_name = cache
        .file_path(&good)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let mut expected = vec!["README.txt".to_owned(), good_name, "subdir.blk".to_owned()];
    expected.sort();
    assert_eq!(files(dir.path()), expected);
}

#[tokio::test]
async fn invalidate_object_works_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let cache = open(dir.path(), 1 << 20).await;
        for object in ["seg-1", "seg-10", "seg-2"] {
            for i in 0..3 {
                cache
                    .insert(BlockKey::new(object, 64, i), block(i as u8, 64))
                    .await;
            }
            cache
                .insert(BlockKey::new(object, 128, 0), block(9, 128))
                .await;
        }
    }
    {
        let cache = open(dir.path(), 1 << 20).await;
        assert_eq!(cache.stats().entries, 12);
        cache.invalidate_object("seg-1").await;
        assert_eq!(cache.stats().entries, 8);
        assert_eq!(block_files(dir.path()).len(), 8, "its files are deleted");
        assert_eq!(cache.get(&BlockKey::new("seg-1", 64, 0)).await, None);
        assert_eq!(cache.get(&BlockKey::new("seg-1", 128, 0)).await, None);
    }
    let cache = open(dir.path(), 1 << 20).await;
    assert_eq!(cache.stats().entries, 8);
    for i in 0..3 {
        assert_eq!(cache.get(&BlockKey::new("seg-1", 64, i)).await, None);
        for object in ["seg-10", "seg-2"] {
            assert_eq!(
                cache.get(&BlockKey::new(object, 64, i)).await,
                Some(block(i as u8, 64)),
                "{object} {i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_get_or_load_of_one_key_loads_once_and_writes_one_file() {
    const CALLERS: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(open(dir.path(), 1 << 20).await);
    let key = BlockKey::new("hot/object", 4096, 0);
    let count = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let (cache, key, count, gate) = (
            Arc::clone(&cache),
            key.clone(),
            Arc::clone(&count),
            Arc::clone(&gate),
        );
        tasks.push(tokio::spawn(async move {
            let load = Box::pin(async move {
                count.fetch_add(1, Ordering::SeqCst);
                let _permit = gate.acquire().await;
                Ok::<_, BoxError>(block(caller as u8, 4096))
            });
            cache.get_or_load(key, load).await
        }));
    }
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.add_permits(CALLERS);
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap().unwrap());
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "one load");
    assert!(results.iter().all(|r| *r == results[0]));
    assert_eq!(cache.get(&key).await, Some(results[0].clone()));
    assert_eq!(block_files(dir.path()).len(), 1);
    let stats = cache.stats();
    assert_eq!((stats.loads, stats.inserts, stats.entries), (1, 1, 1));
    assert_eq!(stats.hits + stats.misses, CALLERS as u64 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leader_hands_the_load_to_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(open(dir.path(), 1 << 20).await);
    let key = BlockKey::new("obj", 16, 0);
    let started = Arc::new(tokio::sync::Notify::new());
    // The leader's load never finishes.
    let leader = {
        let (cache, key, started) = (Arc::clone(&cache), key.clone(), Arc::clone(&started));
        tokio::spawn(async move {
            let load = Box::pin(async move {
                started.notify_one();
                std::future::pending::<Result<Bytes, BoxError>>().await
            });
            cache.get_or_load(key, load).await
        })
    };
    started.notified().await;
    let count = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (cache, key, count) = (Arc::clone(&cache), key.clone(), Arc::clone(&count));
        tokio::spawn(async move {
            cache
                .get_or_load(key, counting_load(block(5, 16), &count))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(count.load(Ordering::SeqCst), 0, "the waiter waits");
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    let got = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter takes over")
        .unwrap();
    assert_eq!(got.ok(), Some(block(5, 16)));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(cache.get(&key).await, Some(block(5, 16)));
    assert_eq!(
        cache.stats().loads,
        2,
        "the cancelled load and the waiter's"
    );
}
