//! Conformance suite for `LocalCache` implementations.
//!
//! Every [`LocalCache`] — the bundled `MokaCache` or a user's own — should pass it. Implement
//! [`CacheFactory`] for your cache and make one test per case with
//! [`cache_conformance!`](crate::cache_conformance), so that the test runner lists, runs and
//! reports each case on its own (or call [`run_all`] from one test; it needs a tokio runtime, and a
//! multi-threaded one exercises more interleavings):
//!
//! ```test_harness
//! use async_trait::async_trait;
//! use diskless_cache::{MokaCache, MokaCacheConfig};
//! use diskless_testkit::cache::CacheFactory;
//!
//! struct Moka;
//!
//! #[async_trait]
//! impl CacheFactory for Moka {
//!     type Cache = MokaCache;
//!     async fn create(&self, max_bytes: u64) -> MokaCache {
//!         MokaCache::new(MokaCacheConfig::default().with_max_bytes(max_bytes)).unwrap()
//!     }
//!     async fn settle(&self, cache: &MokaCache) {
//!         cache.run_pending_tasks().await;
//!     }
//! }
//!
//! diskless_testkit::cache_conformance!(moka, Moka);
//! ```
//!
//! The cases are listed once, in `__cache_conformance_cases!`; [`CASES`], [`run_all`] and the
//! macro's tests follow from that list, and a unit test checks that it names every case of this
//! file.
//!
//! What the suite expects beyond the trait's doc comments:
//! - [`CacheStats::bytes`] counts the bytes of the cached blocks (their lengths), and
//!   [`CacheStats::entries`] the cached blocks, both exact after [`CacheFactory::settle`].
//! - `hits`, `misses`, `loads` and `inserts` are exact at any time: every `get` and `get_or_load`
//!   counts one hit or one miss; a `get_or_load` that waited on another's load is a miss; `loads`
//!   counts loads actually run; `inserts` counts `insert` calls and successful loads.

// The cases are tests: an unexpected error fails the case, with the failed call named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{BlockKey, BoxError, CacheStats, LocalCache};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The capacity of the caches of every case except [`byte_bound_is_respected`]: large enough that
/// nothing a case inserts is evicted.
pub const ROOMY_CAPACITY: u64 = 16 << 20;

/// Makes the caches under test.
#[async_trait]
pub trait CacheFactory: Send + Sync {
    /// The cache type under test.
    type Cache: LocalCache + 'static;

    /// A new, empty cache that holds at most `max_bytes` bytes of blocks and whose blocks do not
    /// expire for at least a minute.
    async fn create(&self, max_bytes: u64) -> Self::Cache;

    /// Runs the cache's pending maintenance (evictions, size accounting), so that
    /// [`CacheStats::entries`] and [`CacheStats::bytes`] are exact and the byte bound holds.
    /// The default does nothing, for caches that are always exact.
    async fn settle(&self, _cache: &Self::Cache) {}
}

/// Calls back `$callback! { { $($args)* } case, ... }` with every case of the suite, in the order
/// [`run_all`] runs them: the one list of cases.
#[doc(hidden)]
#[macro_export]
macro_rules! __cache_conformance_cases {
    ($($callback:ident)::+ { $($args:tt)* }) => {
        $($callback)::+! {
            { $($args)* }
            get_miss_then_insert_then_hit,
            get_or_load_loads_once_and_caches,
            concurrent_get_or_load_runs_one_load,
            concurrent_failed_load_shares_the_error,
            failed_load_is_not_cached,
            block_size_is_part_of_the_key,
            invalidate_object_removes_only_that_object,
            stats_are_consistent,
            byte_bound_is_respected,
        }
    };
}

/// Defines [`CASES`] and [`run_all`] from the case list.
macro_rules! define_from_cases {
    ({} $($case:ident),* $(,)?) => {
        /// The names of all cases, in the order [`run_all`] runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every case of the suite, each on a fresh cache.
        pub async fn run_all<F: CacheFactory>(factory: &F) {
            $(
                tracing::info!(case = stringify!($case), "cache conformance");
                $case(factory).await;
            )*
        }
    };
}

__cache_conformance_cases!(define_from_cases {});

/// Makes one test per case of the cache conformance suite, in a module `$module`:
/// `$module::stats_are_consistent` and so on, each on a fresh cache from `$factory` (an
/// expression of a type implementing [`CacheFactory`], evaluated in each test), on a
/// multi-threaded tokio runtime with four workers (to exercise interleavings of concurrent
/// callers). Option, after the factory: `skip = [case, ...]`, cases left out (say which, and why,
/// next to the list); each must name a case. Example in [the module's documentation](self).
#[macro_export]
macro_rules! cache_conformance {
    ($module:ident, $factory:expr $(, skip = [$($skip:ident),* $(,)?])? $(,)?) => {
        $crate::__cache_conformance_cases!($crate::__conformance_module {
            [$] $module [$($($skip)*)?] [$crate::cache]
            __cache_conformance_test { ($factory) }
        });
    };
}

/// One test of [`cache_conformance!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __cache_conformance_test {
    ({ ($factory:expr) } $case:ident) => {
        #[test]
        fn $case() {
            $crate::fixture::__private::block_on(4, $crate::cache::$case(&$factory));
        }
    };
}

fn block(tag: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| tag.wrapping_add(i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn ok_load(
    bytes: Bytes,
    count: Arc<AtomicUsize>,
) -> futures::future::BoxFuture<'static, Result<Bytes, BoxError>> {
    Box::pin(async move {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(bytes)
    })
}

/// Caches `bytes` under `key` by `insert` when `index` is even, by a `get_or_load` (counted in
/// `count`) that must return them when odd.
async fn insert_or_load<C: LocalCache>(
    cache: &C,
    key: BlockKey,
    bytes: Bytes,
    index: u64,
    count: &Arc<AtomicUsize>,
) {
    if index.is_multiple_of(2) {
        cache.insert(key, bytes).await;
    } else {
        let got = cache
            .get_or_load(key.clone(), ok_load(bytes.clone(), Arc::clone(count)))
            .await;
        assert_eq!(
            got.ok(),
            Some(bytes),
            "get_or_load of {key:?} returns the loaded bytes, even when not kept"
        );
    }
}

/// An error a test loader returns.
#[derive(Debug, thiserror::Error)]
#[error("test load failed: {0}")]
struct TestLoadError(&'static str);

fn delta(after: CacheStats, before: CacheStats) -> (u64, u64, u64, u64) {
    (
        after.hits - before.hits,
        after.misses - before.misses,
        after.loads - before.loads,
        after.inserts - before.inserts,
    )
}

/// `get` of an absent block is `None`; after `insert` it returns the inserted bytes.
pub async fn get_miss_then_insert_then_hit<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    let key = BlockKey::new("obj-a", 4096, 3);
    assert_eq!(cache.get(&key).await, None, "a new cache holds nothing");
    let bytes = block(1, 4096);
    cache.insert(key.clone(), bytes.clone()).await;
    assert_eq!(cache.get(&key).await, Some(bytes.clone()));
    // A neighbouring block and another object are still absent.
    assert_eq!(cache.get(&BlockKey::new("obj-a", 4096, 4)).await, None);
    assert_eq!(cache.get(&BlockKey::new("obj-b", 4096, 3)).await, None);
    // Re-inserting replaces.
    let newer = block(9, 100);
    cache.insert(key.clone(), newer.clone()).await;
    assert_eq!(cache.get(&key).await, Some(newer));
}

/// `get_or_load` on a miss runs the load once and caches its bytes; later calls and `get` hit.
pub async fn get_or_load_loads_once_and_caches<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    let key = BlockKey::new("obj-load", 1024, 0);
    let bytes = block(7, 1000);
    let count = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let got = cache
            .get_or_load(key.clone(), ok_load(bytes.clone(), Arc::clone(&count)))
            .await;
        assert_eq!(got.ok(), Some(bytes.clone()));
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "later calls must hit");
    assert_eq!(cache.get(&key).await, Some(bytes.clone()));
    // A block put in by `insert` is served without loading.
    let key2 = BlockKey::new("obj-load", 1024, 1);
    let other = block(8, 24);
    cache.insert(key2.clone(), other.clone()).await;
    let got = cache
        .get_or_load(key2, ok_load(block(0, 1), Arc::clone(&count)))
        .await;
    assert_eq!(got.ok(), Some(other));
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// Gate: loaders wait on it after announcing they started.
struct Gate {
    started: AtomicUsize,
    open: tokio::sync::Semaphore,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate {
            started: AtomicUsize::new(0),
            open: tokio::sync::Semaphore::new(0),
        })
    }

    async fn enter(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        // The semaphore is never closed; a closed one would just let the loader through.
        let _ = self.open.acquire().await;
    }

    /// Waits until a loader started, gives the other callers time to queue up, and opens.
    async fn open_after_first_load(&self) {
        while self.started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.open.add_permits(OPEN_PERMITS);
    }
}

/// Permits an opened gate hands out: more than any case has callers.
const OPEN_PERMITS: usize = 1 << 16;

/// `callers` concurrent `get_or_load` of `key`, each in a task of its own and with a loader of its
/// own that counts its run in `count`, waits at a gate (opened once the first loader started and
/// the others had time to queue up) and answers `answer(caller)`. The callers' results, in order.
async fn gated_concurrent_loads<C: LocalCache + 'static>(
    cache: &Arc<C>,
    key: &BlockKey,
    callers: usize,
    count: &Arc<AtomicUsize>,
    answer: fn(usize) -> Result<Bytes, BoxError>,
) -> Vec<Result<Bytes, diskless_cache::LoadError>> {
    let gate = Gate::new();
    let mut tasks = Vec::with_capacity(callers);
    for caller in 0..callers {
        let (cache, key, count, gate) = (
            Arc::clone(cache),
            key.clone(),
            Arc::clone(count),
            Arc::clone(&gate),
        );
        tasks.push(tokio::spawn(async move {
            let load = Box::pin(async move {
                count.fetch_add(1, Ordering::SeqCst);
                gate.enter().await;
                answer(caller)
            });
            cache.get_or_load(key, load).await
        }));
    }
    gate.open_after_first_load().await;
    let mut results = Vec::with_capacity(callers);
    for task in tasks {
        results.push(task.await.expect("caller task panicked"));
    }
    results
}

/// 50 concurrent `get_or_load` of one absent block run the loader exactly once, and all get the
/// same bytes; every call counts a hit or a miss, and `loads` is 1.
pub async fn concurrent_get_or_load_runs_one_load<F: CacheFactory>(factory: &F) {
    const CALLERS: usize = 50;
    let cache = Arc::new(factory.create(ROOMY_CAPACITY).await);
    let key = BlockKey::new("obj-hot", 1 << 16, 5);
    let count = Arc::new(AtomicUsize::new(0));
    let before = cache.stats();
    // Each caller offers its own loader; only one may run.
    let results = gated_concurrent_loads(&cache, &key, CALLERS, &count, |caller| {
        Ok(block(caller as u8, 3000))
    })
    .await;
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "the loader must run exactly once"
    );
    let first = results[0].as_ref().expect("the load succeeded").clone();
    for result in &results {
        assert_eq!(
            result.as_ref().ok(),
            Some(&first),
            "every caller gets the loaded bytes"
        );
    }
    assert_eq!(cache.get(&key).await, Some(first));
    let (hits, misses, loads, inserts) = delta(cache.stats(), before);
    // The final `get` is one more hit.
    assert_eq!(hits + misses, CALLERS as u64 + 1, "each lookup counts once");
    assert!(misses >= 1, "at least the loading caller missed");
    assert_eq!(loads, 1, "loads counts loads actually run");
    assert_eq!(inserts, 1);
}

/// Concurrent callers of one failing load all get an error, and callers that waited on the same
/// load get the very same (shared) error: as many distinct errors as loads run.
pub async fn concurrent_failed_load_shares_the_error<F: CacheFactory>(factory: &F) {
    const CALLERS: usize = 20;
    let cache = Arc::new(factory.create(ROOMY_CAPACITY).await);
    let key = BlockKey::new("obj-broken", 512, 0);
    let count = Arc::new(AtomicUsize::new(0));
    let results = gated_concurrent_loads(&cache, &key, CALLERS, &count, |_| {
        Err(Box::new(TestLoadError("object unavailable")))
    })
    .await;
    let errors: Vec<diskless_cache::LoadError> = results
        .into_iter()
        .map(|r| r.expect_err("a failed load must fail every caller that waited on it"))
        .collect();
    for error in &errors {
        assert_eq!(error.to_string(), "test load failed: object unavailable");
    }
    let mut distinct: Vec<&diskless_cache::LoadError> = Vec::new();
    for error in &errors {
        if !distinct.iter().any(|seen| Arc::ptr_eq(seen, error)) {
            distinct.push(error);
        }
    }
    let loads = count.load(Ordering::SeqCst);
    assert!(loads >= 1);
    assert_eq!(
        distinct.len(),
        loads,
        "callers that waited on one load must share its error"
    );
    assert_eq!(cache.get(&key).await, None, "a failed load caches nothing");
}

/// A failed load returns its error and caches nothing: the next call loads again.
pub async fn failed_load_is_not_cached<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    let key = BlockKey::new("obj-flaky", 2048, 2);
    let count = Arc::new(AtomicUsize::new(0));
    let failing = {
        let count = Arc::clone(&count);
        Box::pin(async move {
            count.fetch_add(1, Ordering::SeqCst);
            Err::<Bytes, BoxError>(Box::new(TestLoadError("503 slow down")))
        })
    };
    let error = cache
        .get_or_load(key.clone(), failing)
        .await
        .expect_err("the load failed");
    assert_eq!(error.to_string(), "test load failed: 503 slow down");
    assert!(
        error.downcast_ref::<TestLoadError>().is_some(),
        "the loader's error is returned as is"
    );
    assert_eq!(cache.get(&key).await, None, "a failed load caches nothing");
    let stats = cache.stats();
    assert_eq!(stats.inserts, 0);
    assert_eq!(stats.loads, 1);

    let bytes = block(3, 2048);
    let got = cache
        .get_or_load(key.clone(), ok_load(bytes.clone(), Arc::clone(&count)))
        .await;
    assert_eq!(got.ok(), Some(bytes.clone()));
    assert_eq!(count.load(Ordering::SeqCst), 2, "the next call loads again");
    assert_eq!(cache.get(&key).await, Some(bytes));
    assert_eq!(cache.stats().loads, 2);
}

/// Blocks of one object cut with different block sizes are different entries.
pub async fn block_size_is_part_of_the_key<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    let small = BlockKey::new("obj-sizes", 1024, 1);
    let large = BlockKey::new("obj-sizes", 4096, 1);
    cache.insert(small.clone(), block(1, 1024)).await;
    assert_eq!(cache.get(&large).await, None);
    cache.insert(large.clone(), block(2, 4096)).await;
    assert_eq!(cache.get(&small).await, Some(block(1, 1024)));
    assert_eq!(cache.get(&large).await, Some(block(2, 4096)));
}

/// `invalidate_object` drops every block of that object (whatever their block size, inserted or
/// loaded), and no block of any other object — including objects whose key has it as a prefix.
pub async fn invalidate_object_removes_only_that_object<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    let objects = ["seg-1", "seg-10", "seg-2"];
    let count = Arc::new(AtomicUsize::new(0));
    for (o, object) in objects.iter().enumerate() {
        for index in 0..4u64 {
            let key = BlockKey::new(*object, 256, index);
            let bytes = block((o * 16 + index as usize) as u8, 256);
            insert_or_load(&cache, key, bytes, index, &count).await;
        }
        cache
            .insert(BlockKey::new(*object, 1024, 0), block(o as u8, 1024))
            .await;
    }
    cache.invalidate_object("seg-1").await;
    for index in 0..4u64 {
        assert_eq!(cache.get(&BlockKey::new("seg-1", 256, index)).await, None);
    }
    assert_eq!(cache.get(&BlockKey::new("seg-1", 1024, 0)).await, None);
    for (o, object) in objects.iter().enumerate().skip(1) {
        for index in 0..4u64 {
            assert_eq!(
                cache.get(&BlockKey::new(*object, 256, index)).await,
                Some(block((o * 16 + index as usize) as u8, 256)),
                "{object} block {index} must survive invalidating seg-1"
            );
        }
        assert_eq!(
            cache.get(&BlockKey::new(*object, 1024, 0)).await,
            Some(block(o as u8, 1024))
        );
    }
    // Invalidating an unknown object is a no-op; the object can be cached again afterwards.
    cache.invalidate_object("never-cached").await;
    let key = BlockKey::new("seg-1", 256, 0);
    cache.insert(key.clone(), block(42, 10)).await;
    assert_eq!(cache.get(&key).await, Some(block(42, 10)));

    factory.settle(&cache).await;
    let stats = cache.stats();
    assert_eq!(stats.entries, 2 * 5 + 1);
    assert_eq!(stats.bytes, 2 * (4 * 256 + 1024) + 10);
}

/// The counters follow a known sequence of operations exactly.
pub async fn stats_are_consistent<F: CacheFactory>(factory: &F) {
    let cache = factory.create(ROOMY_CAPACITY).await;
    factory.settle(&cache).await;
    assert_eq!(
        cache.stats(),
        CacheStats::default(),
        "a new cache counts nothing"
    );

    let count = Arc::new(AtomicUsize::new(0));
    let a = BlockKey::new("obj-stats", 100, 0);
    let b = BlockKey::new("obj-stats", 100, 1);
    let c = BlockKey::new("obj-other", 100, 0);
    assert_eq!(cache.get(&a).await, None); // miss
    cache.insert(a.clone(), block(1, 100)).await; // insert
    assert!(cache.get(&a).await.is_some()); // hit
    let got = cache
        .get_or_load(b.clone(), ok_load(block(2, 60), Arc::clone(&count)))
        .await; // miss, load, insert
    assert!(got.is_ok());
    let got = cache
        .get_or_load(b.clone(), ok_load(block(2, 60), Arc::clone(&count)))
        .await; // hit
    assert!(got.is_ok());
    let failed = cache
        .get_or_load(
            c.clone(),
            Box::pin(async { Err::<Bytes, BoxError>(Box::new(TestLoadError("gone"))) }),
        )
        .await; // miss, load, no insert
    assert!(failed.is_err());
    cache.insert(c.clone(), block(3, 7)).await; // insert

    factory.settle(&cache).await;
    let stats = cache.stats();
    assert_eq!(
        stats,
        CacheStats::default()
            .with_hits(2)
            .with_misses(2 + 1)
            .with_loads(2)
            .with_inserts(3)
            .with_entries(3)
            .with_bytes(100 + 60 + 7)
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);

    cache.invalidate_object("obj-stats").await;
    factory.settle(&cache).await;
    let after = cache.stats();
    assert_eq!((after.entries, after.bytes), (1, 7));
    assert_eq!(
        (after.hits, after.misses, after.loads, after.inserts),
        (2, 3, 2, 3),
        "invalidation does not change the operation counters"
    );
}

/// Inserting four times the capacity leaves at most the capacity held (after maintenance), and
/// everything still cached is intact.
pub async fn byte_bound_is_respected<F: CacheFactory>(factory: &F) {
    const CAPACITY: u64 = 64 << 10;
    const BLOCK: usize = 4 << 10;
    const BLOCKS: u64 = 4 * CAPACITY / BLOCK as u64;
    let cache = factory.create(CAPACITY).await;
    let count = Arc::new(AtomicUsize::new(0));
    for index in 0..BLOCKS {
        let key = BlockKey::new("obj-big", BLOCK as u64, index);
        // (A load's bytes are returned even when not kept.)
        insert_or_load(&cache, key, block(index as u8, BLOCK), index, &count).await;
    }
    factory.settle(&cache).await;
    let stats = cache.stats();
    assert!(
        stats.bytes <= CAPACITY,
        "holds {} bytes, more than its capacity {CAPACITY}",
        stats.bytes
    );
    assert!(stats.entries <= CAPACITY / BLOCK as u64);
    assert!(stats.entries > 0, "a bounded cache still caches");
    assert_eq!(stats.bytes, stats.entries * BLOCK as u64);
    let mut held = 0u64;
    for index in 0..BLOCKS {
        let key = BlockKey::new("obj-big", BLOCK as u64, index);
        if let Some(bytes) = cache.get(&key).await {
            assert_eq!(bytes, block(index as u8, BLOCK), "block {index} corrupted");
            held += bytes.len() as u64;
        }
    }
    assert!(
        held <= CAPACITY,
        "get returned {held} bytes, more than the capacity"
    );

    // A block larger than the whole capacity is not kept.
    let huge = BlockKey::new("obj-huge", 2 * CAPACITY, 0);
    cache
        .insert(huge.clone(), block(5, 2 * CAPACITY as usize))
        .await;
    factory.settle(&cache).await;
    assert!(cache.stats().bytes <= CAPACITY);
    assert_eq!(cache.get(&huge).await, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case list names every case of this file once, so that a new case cannot be left out of
    /// [`run_all`] and the macro's tests.
    #[test]
    fn the_case_list_names_every_case() {
        crate::fixture::assert_lists_every_case(
            CASES,
            include_str!("mod.rs"),
            &["<F: CacheFactory>(factory: &F) {"],
        );
    }
}
