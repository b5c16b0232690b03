//! The testkit's `LocalCache` conformance suite, run against `MokaCache`.

use async_trait::async_trait;
use diskless_cache::{MokaCache, MokaCacheConfig};
use diskless_testkit::cache::{self, CacheFactory};

struct Moka;

#[async_trait]
impl CacheFactory for Moka {
    type Cache = MokaCache;

    async fn create(&self, max_bytes: u64) -> MokaCache {
        MokaCache::new(MokaCacheConfig::default().with_max_bytes(max_bytes))
    }

    async fn settle(&self, cache: &MokaCache) {
        cache.run_pending_tasks().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_miss_then_insert_then_hit() {
    cache::get_miss_then_insert_then_hit(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_or_load_loads_once_and_caches() {
    cache::get_or_load_loads_once_and_caches(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_get_or_load_runs_one_load() {
    cache::concurrent_get_or_load_runs_one_load(&Moka).await;
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_get_or_load_runs_one_load_single_thread() {
    cache::concurrent_get_or_load_runs_one_load(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_failed_load_shares_the_error() {
    cache::concurrent_failed_load_shares_the_error(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_load_is_not_cached() {
    cache::failed_load_is_not_cached(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn block_size_is_part_of_the_key() {
    cache::block_size_is_part_of_the_key(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalidate_object_removes_only_that_object() {
    cache::invalidate_object_removes_only_that_object(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_are_consistent() {
    cache::stats_are_consistent(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn byte_bound_is_respected() {
    cache::byte_bound_is_respected(&Moka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    cache::run_all(&Moka).await;
}
