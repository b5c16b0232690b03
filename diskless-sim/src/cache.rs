//! [`SimCache`]: a deterministic [`LocalCache`] for simulations.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use diskless_cache::{BlockKey, BoxError, CacheStats, LoadError, LocalCache};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::trace::fnv1a;

/// A load shared by every caller that missed the same block while it ran.
type SharedLoad = Shared<BoxFuture<'static, Result<Bytes, LoadError>>>;

/// A byte-bounded block cache whose contents depend only on what was inserted when (virtual
/// time), never on thread scheduling or hash seeds, so that a simulated run is reproducible
/// (`MokaCache` evicts by an internal sampled policy that is not).
///
/// Eviction is FIFO by virtual insertion time; blocks inserted at the same instant leave in the
/// order of a hash of their key (not of their insertion order, which the fetcher's grouping of
/// reads does not fix). Concurrent misses of one block share one load, as the trait requires.
/// [`SimCache::clear`] drops every block (a simulated eviction storm).
///
/// It passes `diskless_testkit::cache::run_all` (the `LocalCache` conformance suite).
#[derive(Debug)]
pub struct SimCache {
    capacity: u64,
    start: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    blocks: BTreeMap<BlockKey, (Bytes, Rank)>,
    order: BTreeSet<(Rank, BlockKey)>,
    bytes: u64,
    inflight: BTreeMap<BlockKey, SharedLoad>,
    hits: u64,
    misses: u64,
    loads: u64,
    inserts: u64,
}

/// Eviction rank: (virtual ms of insertion, hash of the key). Smallest leaves first.
type Rank = (u64, u64);

impl SimCache {
    /// An empty cache holding at most `capacity` bytes of blocks. Call it inside a tokio runtime.
    pub fn new(capacity: u64) -> Self {
        SimCache {
            capacity,
            start: Instant::now(),
            state: Mutex::new(State::default()),
        }
    }

    /// Drops every cached block (counters are kept).
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.blocks.clear();
        s.order.clear();
        s.bytes = 0;
    }

    /// The byte bound.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn rank(&self, key: &BlockKey) -> Rank {
        let at = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut h = fnv1a(key.object.as_bytes(), 0xcbf2_9ce4_8422_2325);
        h = fnv1a(&key.block_size.to_le_bytes(), h);
        h = fnv1a(&key.index.to_le_bytes(), h);
        (at, h)
    }

    fn put(&self, s: &mut State, key: BlockKey, block: Bytes) {
        s.inserts += 1;
        if let Some((old, rank)) = s.blocks.remove(&key) {
            s.bytes -= old.len() as u64;
            s.order.remove(&(rank, key.clone()));
        }
        let len = block.len() as u64;
        if len > self.capacity {
            return;
        }
        let rank = self.rank(&key);
        s.order.insert((rank, key.clone()));
        s.blocks.insert(key, (block, rank));
        s.bytes += len;
        while s.bytes > self.capacity {
            let Some((_, victim)) = s.order.pop_first() else {
                break;
            };
            if let Some((b, _)) = s.blocks.remove(&victim) {
                s.bytes -= b.len() as u64;
            }
        }
    }
}

#[async_trait]
impl LocalCache for SimCache {
    async fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let mut s = self.state.lock();
        match s.blocks.get(key).map(|(b, _)| b.clone()) {
            Some(b) => {
                s.hits += 1;
                Some(b)
            }
            None => {
                s.misses += 1;
                None
            }
        }
    }

    async fn insert(&self, key: BlockKey, block: Bytes) {
        let mut s = self.state.lock();
        self.put(&mut s, key, block);
    }

    async fn get_or_load(
        &self,
        key: BlockKey,
        load: BoxFuture<'static, Result<Bytes, BoxError>>,
    ) -> Result<Bytes, LoadError> {
        let shared = {
            let mut s = self.state.lock();
            if let Some((b, _)) = s.blocks.get(&key) {
                let b = b.clone();
                s.hits += 1;
                return Ok(b);
            }
            s.misses += 1;
            match s.inflight.get(&key) {
                Some(running) => running.clone(),
                None => {
                    s.loads += 1;
                    let fresh: SharedLoad = load.map(|r| r.map_err(Arc::new)).boxed().shared();
                    s.inflight.insert(key.clone(), fresh.clone());
                    fresh
                }
            }
        };
        let result = shared.clone().await;
        let mut s = self.state.lock();
        // The first caller back from the load retires it and caches its bytes.
        if s.inflight
            .get(&key)
            .is_some_and(|running| running.ptr_eq(&shared))
        {
            s.inflight.remove(&key);
            if let Ok(bytes) = &result {
                self.put(&mut s, key, bytes.clone());
            }
        }
        result
    }

    async fn invalidate_object(&self, object: &str) {
        let mut s = self.state.lock();
        let doomed: Vec<BlockKey> = s
            .blocks
            .keys()
            .filter(|k| &*k.object == object)
            .cloned()
            .collect();
        for key in doomed {
            if let Some((b, rank)) = s.blocks.remove(&key) {
                s.bytes -= b.len() as u64;
                s.order.remove(&(rank, key));
            }
        }
        // A load still running for the object must not put its bytes back.
        s.inflight.retain(|k, _| &*k.object != object);
    }

    fn stats(&self) -> CacheStats {
        let s = self.state.lock();
        CacheStats::default()
            .with_hits(s.hits)
            .with_misses(s.misses)
            .with_loads(s.loads)
            .with_inserts(s.inserts)
            .with_entries(s.blocks.len() as u64)
            .with_bytes(s.bytes)
    }
}
