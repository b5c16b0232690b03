//! [`FlakyStore`]: faults below `ObjectStoreStorage`, at the `object_store` level, so that its own
//! retries, attempt timeouts and create-or-verify uploads run under them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use diskless_storage::object_store::path::Path;
use diskless_storage::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;

use diskless_coordinator::Clock;

use crate::clock::SimClock;
use crate::trace::fnv1a;

/// The fault rates of a [`FlakyStore`] (probabilities per request).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlakyRates {
    /// PUTs answered 503 without landing.
    pub put_fail: f64,
    /// PUTs that land, then are answered 503.
    pub put_ambiguous: f64,
    /// PUTs that take `slow` (longer than the caller waits) and then land — or, one in four, are
    /// aborted. While one is in flight, a create-only PUT of the same key is refused as S3
    /// refuses it (409 `ConditionalRequestConflict`, reported as "already exists") and the object
    /// is not visible yet.
    pub put_slow: f64,
    /// How long a slow PUT takes.
    pub slow: Duration,
    /// GETs (ranged reads, verifications) answered 503.
    pub get_fail: f64,
    /// Deletes of one path answered 503.
    pub delete_fail: f64,
}

/// An `object_store` wrapper injecting HTTP-like faults, deterministically (each decision from a
/// generator seeded by the seed, the operation, the path and how many times that operation was
/// called on that path), and dating objects by the simulated clock (when they landed), not the
/// wall clock. [`FlakyStore::calm`] stops the faults.
#[derive(Debug)]
pub struct FlakyStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    inner: Arc<dyn ObjectStore>,
    clock: Arc<SimClock>,
    seed: u64,
    rates: FlakyRates,
    calm: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    calls: BTreeMap<(u8, String), u64>,
    in_flight: BTreeSet<String>,
    landed: BTreeMap<String, i64>,
}

/// An injected HTTP failure (its text carries the status the storage layer classifies).
#[derive(Debug)]
struct Injected(&'static str);

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "injected: {}", self.0)
    }
}

impl std::error::Error for Injected {}

fn unavailable() -> object_store::Error {
    object_store::Error::Generic {
        store: "flaky",
        source: Box::new(Injected("status code: 503 Service Unavailable")),
    }
}

impl std::fmt::Display for FlakyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlakyStore({})", self.shared.inner)
    }
}

impl FlakyStore {
    /// Wraps `inner`.
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        clock: Arc<SimClock>,
        seed: u64,
        rates: FlakyRates,
    ) -> Self {
        FlakyStore {
            shared: Arc::new(Shared {
                inner,
                clock,
                seed,
                rates,
                calm: AtomicBool::new(false),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Stops injecting faults (slow PUTs in flight still land).
    pub fn calm(&self) {
        self.shared.calm.store(true, Ordering::SeqCst);
    }
}

impl Shared {
    /// The decision generator of the next call of `op` on `path`, or `None` once calm.
    fn rng(&self, op: u8, path: &Path) -> Option<fastrand::Rng> {
        if self.calm.load(Ordering::SeqCst) {
            return None;
        }
        let mut state = self.state.lock();
        let n = state.calls.entry((op, path.to_string())).or_insert(0);
        let call = *n;
        *n += 1;
        let mut h = fnv1a(&self.seed.to_le_bytes(), 0xcbf2_9ce4_8422_2325);
        h = fnv1a(&[op], h);
        h = fnv1a(path.as_ref().as_bytes(), h);
        h = fnv1a(&call.to_le_bytes(), h);
        Some(fastrand::Rng::with_seed(h))
    }

    async fn land(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let result = self.inner.put_opts(location, payload, opts).await?;
        let now = self.clock.now_ms();
        self.state
            .lock()
            .landed
            .entry(location.to_string())
            .or_insert(now);
        Ok(result)
    }

    /// `meta` dated by when the object landed.
    fn redate(&self, mut meta: ObjectMeta) -> ObjectMeta {
        let landed = self
            .state
            .lock()
            .landed
            .get(meta.location.as_ref())
            .copied();
        if let Some(ms) = landed {
            let t = meta.last_modified;
            let since_epoch = u64::try_from(t.timestamp_millis()).unwrap_or(0);
            let epoch = t - Duration::from_millis(since_epoch);
            meta.last_modified = epoch + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        }
        meta
    }
}

const PUT: u8 = 0;
const GET: u8 = 1;
const DELETE: u8 = 2;

#[async_trait]
impl ObjectStore for FlakyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let s = &self.shared;
        let Some(mut rng) = s.rng(PUT, location) else {
            return s.land(location, payload, opts).await;
        };
        let r = &s.rates;
        if rng.f64() < r.put_fail {
            return Err(unavailable());
        }
        let create = matches!(opts.mode, PutMode::Create);
        if create && s.state.lock().in_flight.contains(location.as_ref()) {
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: Box::new(Injected(
                    "status code: 409 Conflict (ConditionalRequestConflict)",
                )),
            });
        }
        if rng.f64() < r.put_ambiguous {
            s.land(location, payload, opts).await?;
            return Err(unavailable());
        }
        if rng.f64() < r.put_slow {
            let aborted = rng.u8(0..4) == 0;
            let delay = r.slow.mul_f64(0.5 + rng.f64());
            s.state.lock().in_flight.insert(location.to_string());
            let shared = s.clone();
            let location = location.clone();
            // Its own task: the caller's attempt timeout drops the call, not the request.
            let request = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let result = if aborted {
                    Err(unavailable())
                } else {
                    shared.land(&location, payload, opts).await
                };
                shared.state.lock().in_flight.remove(location.as_ref());
                result
            });
            return request.await.map_err(|e| object_store::Error::Generic {
                store: "flaky",
                source: Box::new(e),
            })?;
        }
        s.land(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.shared.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let s = &self.shared;
        if let Some(mut rng) = s.rng(GET, location)
            && rng.f64() < s.rates.get_fail
        {
            return Err(unavailable());
        }
        s.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        let s = &self.shared;
        if let Some(mut rng) = s.rng(GET, location)
            && rng.f64() < s.rates.get_fail
        {
            return Err(unavailable());
        }
        s.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let shared = self.shared.clone();
        locations
            .then(move |location| {
                let shared = shared.clone();
                async move {
                    let location = location?;
                    if let Some(mut rng) = shared.rng(DELETE, &location)
                        && rng.f64() < shared.rates.delete_fail
                    {
                        return Err(unavailable());
                    }
                    let one = location.clone();
                    let single = futures::stream::once(async move { Ok(one) }).boxed();
                    let result = shared.inner.delete_stream(single).next().await;
                    shared.state.lock().landed.remove(location.as_ref());
                    result.unwrap_or(Ok(location))
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let shared = self.shared.clone();
        self.shared
            .inner
            .list(prefix)
            .map(move |m| m.map(|m| shared.redate(m)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let shared = self.shared.clone();
        self.shared
            .inner
            .list_with_offset(prefix, offset)
            .map(move |m| m.map(|m| shared.redate(m)))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.shared.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.shared.inner.copy_opts(from, to, options).await
    }
}
