//! `SimCache` passes the `LocalCache` conformance suite.

use async_trait::async_trait;
use diskless_sim::SimCache;
use diskless_testkit::cache::{CacheFactory, run_all};

struct Sim;

#[async_trait]
impl CacheFactory for Sim {
    type Cache = SimCache;

    async fn create(&self, max_bytes: u64) -> SimCache {
        SimCache::new(max_bytes)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_cache_passes_the_local_cache_conformance_suite() {
    run_all(&Sim).await;
}

#[tokio::test(start_paused = true)]
async fn sim_cache_passes_the_suite_under_a_paused_clock() {
    run_all(&Sim).await;
}
