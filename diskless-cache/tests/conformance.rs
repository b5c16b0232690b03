//! The testkit's `LocalCache` conformance suite, run against `MokaCache`: one test per case on a
//! multi-threaded runtime (`moka::get_or_load_loads_once_and_caches`, ...), the concurrent-load
//! case again on a single thread, and the whole suite in one test.

#![allow(clippy::expect_used)]

use async_trait::async_trait;
use diskless_cache::{MokaCache, MokaCacheConfig};
use diskless_testkit::cache::{self, CacheFactory};

struct Moka;

#[async_trait]
impl CacheFactory for Moka {
    type Cache = MokaCache;

    async fn create(&self, max_bytes: u64) -> MokaCache {
        MokaCache::new(MokaCacheConfig::default().with_max_bytes(max_bytes))
            .expect("a valid cache configuration")
    }

    async fn settle(&self, cache: &MokaCache) {
        cache.run_pending_tasks().await;
    }
}

diskless_testkit::cache_conformance!(moka, Moka);

#[tokio::test(flavor = "current_thread")]
async fn concurrent_get_or_load_runs_one_load_single_thread() {
    cache::concurrent_get_or_load_runs_one_load(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    cache::run_all(&Moka).await;
}
