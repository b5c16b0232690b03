//! `MokaCache` behaviour beyond the conformance suite: expiry, configuration, invalidation under
//! concurrent churn. Expiry tests sleep for real (moka's clock cannot be injected through its
//! public API): short expiry, generous waits, and no assertion on how long anything took.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use diskless_cache::{BlockKey, BoxError, CacheStats, LocalCache, MokaCache, MokaCacheConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn load(
    bytes: &'static [u8],
    count: &Arc<AtomicUsize>,
) -> futures::future::BoxFuture<'static, Result<Bytes, BoxError>> {
    let count = Arc::clone(count);
    Box::pin(async move {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(Bytes::from_static(bytes))
    })
}

#[test]
fn config_defaults_are_documented_values() {
    let config = MokaCacheConfig::default();
    assert_eq!(config.max_bytes, 256 * 1024 * 1024);
    assert_eq!(config.time_to_live, Some(Duration::from_secs(300)));
    assert!(config.validate().is_ok());
    assert_eq!(config.time_to_idle, None);
    assert_eq!(MokaCache::default().config(), &config);
}

#[tokio::test]
async fn time_to_live_expires_blocks_and_the_next_lookup_loads_again() {
    let cache =
        MokaCache::new(MokaCacheConfig::default().with_time_to_live(Duration::from_millis(500)))
            .unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let key = BlockKey::new("obj", 64, 0);
    let got = cache.get_or_load(key.clone(), load(b"v1", &count)).await;
    assert_eq!(got.ok(), Some(Bytes::from_static(b"v1")));
    let inserted = BlockKey::new("obj", 64, 1);
    cache
        .insert(inserted.clone(), Bytes::from_static(b"i"))
        .await;

    // Well past the time-to-live; and the reload below has 500 ms to be counted before it expires
    // in turn, so a loaded machine does not fail the test.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cache.get(&key).await, None, "expired by time-to-live");
    assert_eq!(cache.get(&inserted).await, None, "expired by time-to-live");
    let got = cache.get_or_load(key.clone(), load(b"v2", &count)).await;
    assert_eq!(got.ok(), Some(Bytes::from_static(b"v2")));
    assert_eq!(count.load(Ordering::SeqCst), 2);
    cache.run_pending_tasks().await;
    assert_eq!(
        cache.stats().entries,
        1,
        "expired blocks are dropped by maintenance"
    );
}

#[tokio::test]
async fn time_to_idle_expires_unread_blocks_and_reads_keep_them() {
    let cache = MokaCache::new(
        MokaCacheConfig::default()
            .with_time_to_live(Duration::from_secs(600))
            .with_time_to_idle(Duration::from_millis(3000)),
    )
    .unwrap();
    let idle = BlockKey::new("obj", 64, 0);
    let busy = BlockKey::new("obj", 64, 1);
    cache
        .insert(idle.clone(), Bytes::from_static(b"idle"))
        .await;
    cache
        .insert(busy.clone(), Bytes::from_static(b"busy"))
        .await;
    // Read `busy` every 100 ms for 4 s: longer than the time-to-idle in total. The margin (a read
    // may come up to 2.9 s late before `busy` expires) keeps a loaded machine from failing it.
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(cache.get(&busy).await, Some(Bytes::from_static(b"busy")));
    }
    assert_eq!(
        cache.get(&idle).await,
        None,
        "not read for longer than the time-to-idle"
    );
}

#[tokio::test]
async fn zero_capacity_caches_nothing_but_still_loads() {
    let cache = MokaCache::new(MokaCacheConfig::default().with_max_bytes(0)).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let key = BlockKey::new("obj", 64, 0);
    for _ in 0..2 {
        let got = cache.get_or_load(key.clone(), load(b"data", &count)).await;
        assert_eq!(got.ok(), Some(Bytes::from_static(b"data")));
        cache.run_pending_tasks().await;
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(cache.get(&key).await, None);
    assert_eq!(cache.stats().bytes, 0);
}

#[tokio::test]
async fn clones_share_blocks_and_counters() {
    let cache = MokaCache::default();
    let clone = cache.clone();
    let key = BlockKey::new("obj", 64, 0);
    cache.insert(key.clone(), Bytes::from_static(b"x")).await;
    assert_eq!(clone.get(&key).await, Some(Bytes::from_static(b"x")));
    assert_eq!(cache.stats().hits, 1);
    clone.invalidate_object("obj").await;
    assert_eq!(cache.get(&key).await, None);
    assert!(format!("{cache:?}").contains("MokaCache"));
}

/// Many tasks insert and load blocks of several objects into a cache far too small for them
/// (constant size evictions, and index sweeps); afterwards invalidating every object must leave
/// no block readable: the object index never lost a cached block.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalidation_finds_every_block_despite_concurrent_churn() {
    const OBJECTS: u64 = 10;
    const INDICES: u64 = 300;
    const BLOCK: usize = 64;
    let cache =
        MokaCache::new(MokaCacheConfig::default().with_max_bytes(64 * BLOCK as u64)).unwrap();
    let mut tasks = Vec::new();
    for task in 0..8u64 {
        let cache = cache.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(task);
            for op in 0..1500u64 {
                let key = BlockKey::new(
                    format!("obj-{}", rng.u64(0..OBJECTS)),
                    BLOCK as u64,
                    rng.u64(0..INDICES),
                );
                let bytes = Bytes::from(vec![task as u8; BLOCK]);
                if op % 2 == 0 {
                    cache.insert(key, bytes).await;
                } else {
                    let loaded = cache
                        .get_or_load(key, Box::pin(async move { Ok::<_, BoxError>(bytes) }))
                        .await;
                    assert!(loaded.is_ok());
                }
                if op % 100 == 0 {
                    cache.run_pending_tasks().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    cache.run_pending_tasks().await;
    assert!(cache.stats().bytes <= 64 * BLOCK as u64);
    for object in 0..OBJECTS {
        cache.invalidate_object(&format!("obj-{object}")).await;
    }
    for object in 0..OBJECTS {
        for index in 0..INDICES {
            let key = BlockKey::new(format!("obj-{object}"), BLOCK as u64, index);
            assert_eq!(cache.get(&key).await, None, "{key:?} survived invalidation");
        }
    }
    cache.run_pending_tasks().await;
    assert_eq!((cache.stats().entries, cache.stats().bytes), (0, 0));
}

#[tokio::test]
async fn without_expiry_blocks_stay_until_evicted_or_invalidated() {
    let cache = MokaCache::new(MokaCacheConfig::default().with_time_to_live(None)).unwrap();
    assert_eq!(cache.config().time_to_live, None);
    let key = BlockKey::new("obj", 64, 0);
    cache.insert(key.clone(), Bytes::from_static(b"x")).await;
    assert_eq!(cache.get(&key).await, Some(Bytes::from_static(b"x")));
    assert!(
        MokaCache::new(MokaCacheConfig::default().with_time_to_live(Duration::MAX)).is_err(),
        "a duration moka cannot take is refused, not clamped"
    );
}

/// A task whose `get_or_load` of `key` runs a load that never finishes (until the task is
/// aborted); returned once the load has started.
async fn stuck_loader(
    cache: &MokaCache,
    key: &BlockKey,
) -> tokio::task::JoinHandle<Result<Bytes, diskless_cache::LoadError>> {
    let (started, loading) = tokio::sync::oneshot::channel::<()>();
    let (cache, key) = (cache.clone(), key.clone());
    let loader = tokio::spawn(async move {
        let load = Box::pin(async move {
            let _ = started.send(());
            futures::future::pending::<()>().await;
            Ok::<_, BoxError>(Bytes::from_static(b"never"))
        });
        cache.get_or_load(key, load).await
    });
    loading.await.unwrap();
    loader
}

/// Cancel safety of `get_or_load`: dropping the call that runs the load hands the load over to a
/// waiter, which runs its own; nothing of the dropped load is cached or shared.
#[tokio::test]
async fn a_dropped_loader_hands_the_load_to_a_waiter() {
    let cache = MokaCache::default();
    let key = BlockKey::new("obj", 64, 0);
    let loader = stuck_loader(&cache, &key).await;
    let count = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (cache, key, count) = (cache.clone(), key.clone(), count.clone());
        tokio::spawn(async move { cache.get_or_load(key, load(b"second", &count)).await })
    };
    // Let the waiter reach moka's wait on the running load, then cancel the loader.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "the waiter waits, it does not load"
    );
    loader.abort();
    assert!(loader.await.unwrap_err().is_cancelled());
    let got = waiter.await.unwrap();
    assert_eq!(got.ok(), Some(Bytes::from_static(b"second")));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(cache.get(&key).await, Some(Bytes::from_static(b"second")));
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.loads, stats.inserts), (2, 2, 1));
}

/// A dropped lone loader leaves nothing behind: the next call loads again.
#[tokio::test]
async fn a_dropped_lone_loader_caches_nothing() {
    let cache = MokaCache::default();
    let key = BlockKey::new("obj", 64, 0);
    let loader = stuck_loader(&cache, &key).await;
    loader.abort();
    assert!(loader.await.unwrap_err().is_cancelled());
    assert_eq!(cache.get(&key).await, None);
    let count = Arc::new(AtomicUsize::new(0));
    let got = cache.get_or_load(key.clone(), load(b"again", &count)).await;
    assert_eq!(got.ok(), Some(Bytes::from_static(b"again")));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // Invalidation still finds the block (the dropped load left the index consistent).
    cache.invalidate_object("obj").await;
    assert_eq!(cache.get(&key).await, None);
}

#[tokio::test]
async fn shared_and_boxed_caches_are_caches() {
    let shared: Arc<MokaCache> = Arc::new(MokaCache::default());
    let boxed: Box<dyn LocalCache> = Box::new(Arc::clone(&shared));
    let key = BlockKey::new("obj", 64, 0);
    boxed.insert(key.clone(), Bytes::from_static(b"x")).await;
    assert_eq!(shared.get(&key).await, Some(Bytes::from_static(b"x")));
    assert_eq!(boxed.stats().hits, 1);
    assert_eq!(CacheStats::default().with_entries(2).with_bytes(9), {
        let mut stats = CacheStats::default();
        stats.entries = 2;
        stats.bytes = 9;
        stats
    });
}
