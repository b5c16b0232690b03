//! [`FaultyStorage`]: a deterministic fault-injecting [`ObjectStorage`] wrapper.

use bytes::Bytes;
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The error of an injected fault (the source of the [`StorageError::Transient`] or
/// [`StorageError::NotFound`] returned). Tests can downcast to it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("injected fault: {kind:?} on {op:?}")]
pub struct InjectedFault {
    /// The operation.
    pub op: Op,
    /// What was injected.
    pub kind: FaultKind,
}

/// An [`ObjectStorage`] operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `upload`.
    Upload,
    /// `upload_stream`.
    UploadStream,
    /// `fetch`.
    Fetch,
    /// `delete`.
    Delete,
    /// `list`.
    List,
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The call fails with a transient error without reaching the inner storage.
    Fail,
    /// The upload reached the inner storage (the object landed) and then "failed" with a
    /// transient error: the caller cannot tell whether it landed.
    AfterUpload,
    /// The key was made unreadable (see [`FaultyStorage::make_unreadable`]).
    Unreadable,
    /// The chunk stream of an `upload_stream` failed part-way (see
    /// [`FaultConfig::mid_stream_failure_rate`] and [`FaultyStorage::fail_next_stream_after`]):
    /// the inner storage got the error from the stream, as from a failing producer.
    MidStream,
}

/// One injected fault or delay, as recorded in [`FaultyStorage::log`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// The operation.
    pub op: Op,
    /// The key (upload/fetch), the keys joined by `,` (delete) or the prefix (list).
    pub target: String,
    /// The fault, if one was injected.
    pub fault: Option<FaultKind>,
    /// The latency added.
    pub latency: Duration,
}

/// A log-normal latency distribution fitted to a median and a 99th percentile.
///
/// `ln(latency)` is normal with mean `ln(p50)` and standard deviation
/// `ln(p99 / p50) / 2.3263` (2.3263 is the standard normal's 99th percentile). Draws are capped at
/// `max`.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (>= `p50`).
    pub p99: Duration,
    /// Upper bound of any draw.
    pub max: Duration,
}

impl Latency {
    /// The distribution with these percentiles, capped at `4 * p99`.
    pub fn log_normal(p50: Duration, p99: Duration) -> Self {
        Latency {
            p50,
            p99: p99.max(p50),
            max: p99.max(p50) * 4,
        }
    }

    /// Roughly S3 standard's first-byte latency for small PUTs: p50 100 ms, p99 400 ms.
    pub fn s3_like() -> Self {
        Self::log_normal(Duration::from_millis(100), Duration::from_millis(400))
    }

    /// A draw.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        let p50 = self.p50.as_secs_f64();
        if p50 <= 0.0 {
            return Duration::ZERO;
        }
        let sigma = (self.p99.as_secs_f64() / p50).ln() / 2.3263;
        // Box-Muller.
        let u1 = 1.0 - rng.f64(); // (0, 1]
        let u2 = rng.f64();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let secs = (p50.ln() + sigma * z).exp();
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// The knobs of a [`FaultyStorage`]. All rates are probabilities in `[0, 1]`; the default injects
/// nothing. Built as every setting struct: `FaultConfig::default().with_seed(7).with_...`.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct FaultConfig {
    /// Seed of every random decision.
    pub seed: u64,
    /// Fraction of uploads failing before reaching the inner storage.
    pub upload_failure_rate: f64,
    /// Fraction of uploads that land in the inner storage and then report a transient error
    /// (the ambiguous outcome). Drawn after `upload_failure_rate`.
    pub ambiguous_upload_rate: f64,
    /// Fraction of streamed uploads (`upload_stream`) whose chunk stream fails (transient) after
    /// it yielded more than one part of bytes (the part size asked, as
    /// [`diskless_storage::clamp_part_size`] takes it): a multipart upload is then under way and
    /// must be aborted. Drawn after `upload_failure_rate` and `ambiguous_upload_rate`, which
    /// apply to streamed uploads too.
    pub mid_stream_failure_rate: f64,
    /// Fraction of fetches failing.
    pub fetch_failure_rate: f64,
    /// Fraction of deletes failing (as a whole, before reaching the inner storage).
    pub delete_failure_rate: f64,
    /// Fraction of listings failing (the stream yields one error).
    pub list_failure_rate: f64,
    /// Latency added before every call (`None`: none). Uses `tokio::time::sleep`, so tests with
    /// a paused clock (`#[tokio::test(start_paused = true)]`) run instantly.
    pub latency: Option<Latency>,
}

impl FaultConfig {
    /// Sets [`FaultConfig::seed`].
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`FaultConfig::upload_failure_rate`].
    pub fn with_upload_failure_rate(mut self, rate: f64) -> Self {
        self.upload_failure_rate = rate;
        self
    }

    /// Sets [`FaultConfig::ambiguous_upload_rate`].
    pub fn with_ambiguous_upload_rate(mut self, rate: f64) -> Self {
        self.ambiguous_upload_rate = rate;
        self
    }

    /// Sets [`FaultConfig::mid_stream_failure_rate`].
    pub fn with_mid_stream_failure_rate(mut self, rate: f64) -> Self {
        self.mid_stream_failure_rate = rate;
        self
    }

    /// Sets [`FaultConfig::fetch_failure_rate`].
    pub fn with_fetch_failure_rate(mut self, rate: f64) -> Self {
        self.fetch_failure_rate = rate;
        self
    }

    /// Sets [`FaultConfig::delete_failure_rate`].
    pub fn with_delete_failure_rate(mut self, rate: f64) -> Self {
        self.delete_failure_rate = rate;
        self
    }

    /// Sets [`FaultConfig::list_failure_rate`].
    pub fn with_list_failure_rate(mut self, rate: f64) -> Self {
        self.list_failure_rate = rate;
        self
    }

    /// Sets [`FaultConfig::latency`].
    pub fn with_latency(mut self, latency: Option<Latency>) -> Self {
        self.latency = latency;
        self
    }

    /// Every rate is a probability (finite, in `[0, 1]`); the error names the first that is not.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("upload_failure_rate", self.upload_failure_rate),
            ("ambiguous_upload_rate", self.ambiguous_upload_rate),
            ("mid_stream_failure_rate", self.mid_stream_failure_rate),
            ("fetch_failure_rate", self.fetch_failure_rate),
            ("delete_failure_rate", self.delete_failure_rate),
            ("list_failure_rate", self.list_failure_rate),
        ];
        match rates.iter().find(|(_, r)| !(0.0..=1.0).contains(r)) {
            Some((name, rate)) => Err(format!(
                "FaultConfig::{name} is {rate}: a rate is a probability in [0, 1]"
            )),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
enum Unreadable {
    Fetches(u32),
    Until(Instant),
}

#[derive(Debug, Default)]
struct State {
    calls: HashMap<(Op, String), u64>,
    unreadable: HashMap<ObjectKey, Unreadable>,
    /// Set by [`FaultyStorage::fail_next_stream_after`].
    next_stream_failure: Option<u64>,
    log: Vec<FaultEvent>,
}

/// Wraps an [`ObjectStorage`] and injects faults and latency, deterministically from
/// [`FaultConfig::seed`].
///
/// Each decision draws from a random generator seeded by the seed, the operation, its target
/// (key, keys or prefix) and how many times that operation was called on that target before. So
/// the same calls give the same faults whatever the interleaving of concurrent tasks.
///
/// Besides the random faults (see [`FaultConfig`]):
/// - [`FaultyStorage::make_unreadable`] / [`FaultyStorage::make_unreadable_for`]: fetches of a
///   key fail (transient) for a number of calls or a time, then succeed again;
/// - [`FaultyStorage::stall_uploads`] / [`FaultyStorage::release_uploads`]: while stalled,
///   uploads (streamed ones too) wait (before reaching the inner storage) until released — for
///   backpressure tests; [`FaultyStorage::stalled_uploads`] says how many are waiting;
/// - [`FaultyStorage::fail_next_stream_after`]: the next streamed upload's chunks fail after a
///   given number of parts.
///
/// Streamed uploads (`upload_stream`, [`Op::UploadStream`]) draw `upload_failure_rate` (fails
/// before the stream is read), `ambiguous_upload_rate` (the inner storage completes the upload,
/// then the call fails) and `mid_stream_failure_rate` (the stream fails part-way; the inner
/// storage must abort), and are never retried by this wrapper (a consumed stream cannot be
/// replayed).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// use diskless_storage::{ObjectKey, ObjectStorage, ObjectStoreStorage};
/// use diskless_testkit::storage::{FaultConfig, FaultyStorage, Latency};
///
/// let storage = FaultyStorage::new(
///     ObjectStoreStorage::in_memory(),
///     FaultConfig::default()
///         .with_seed(7)
///         .with_ambiguous_upload_rate(1.0)
///         .with_latency(Some(Latency::s3_like())),
/// );
/// let key = ObjectKey::parse("wal/segment-1").unwrap();
/// let payload = [bytes::Bytes::from_static(b"segment")];
/// assert!(storage.upload(&key, &payload).await.unwrap_err().is_transient());
/// // ...but it landed:
/// assert_eq!(storage.inner().fetch(&key, 0..7).await.unwrap(), "segment");
/// # });
/// ```
#[derive(Debug)]
pub struct FaultyStorage<S = Arc<dyn ObjectStorage>> {
    inner: S,
    config: FaultConfig,
    state: Mutex<State>,
    stall: tokio::sync::watch::Sender<bool>,
    stalled: AtomicUsize,
}

/// FNV-1a, stable across platforms and Rust versions.
fn fnv(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x100_0000_01b3);
    }
    hash
}

impl<S: ObjectStorage> FaultyStorage<S> {
    /// Wraps `inner`.
    ///
    /// # Panics
    ///
    /// When `config` is invalid ([`FaultConfig::validate`]): a test with a misconfigured fault
    /// injector fails at once instead of injecting something else than it says.
    pub fn new(inner: S, config: FaultConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("{e}");
        }
        FaultyStorage {
            inner,
            config,
            state: Mutex::new(State::default()),
            stall: tokio::sync::watch::Sender::new(false),
            stalled: AtomicUsize::new(0),
        }
    }

    /// The wrapped storage (calls to it bypass the faults).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Every fault and delay injected so far, in call order.
    pub fn log(&self) -> Vec<FaultEvent> {
        self.state.lock().log.clone()
    }

    /// How many faults of each kind were injected.
    pub fn fault_count(&self, kind: FaultKind) -> usize {
        self.state
            .lock()
            .log
            .iter()
            .filter(|e| e.fault == Some(kind))
            .count()
    }

    /// The next `fetches` fetches of `key` fail with a transient error.
    pub fn make_unreadable(&self, key: &ObjectKey, fetches: u32) {
        self.state
            .lock()
            .unreadable
            .insert(key.clone(), Unreadable::Fetches(fetches));
    }

    /// Fetches of `key` fail with a transient error for `duration` (tokio time) from now.
    pub fn make_unreadable_for(&self, key: &ObjectKey, duration: Duration) {
        self.state
            .lock()
            .unreadable
            .insert(key.clone(), Unreadable::Until(Instant::now() + duration));
    }

    /// Makes `key` readable again.
    pub fn make_readable(&self, key: &ObjectKey) {
        self.state.lock().unreadable.remove(key);
    }

    /// From now on, uploads wait until [`FaultyStorage::release_uploads`].
    pub fn stall_uploads(&self) {
        self.stall.send_replace(true);
    }

    /// The chunk stream of the next `upload_stream` call fails (transient, [`FaultKind::MidStream`])
    /// once it has yielded more than `parts` parts of bytes (the part size asked, as
    /// [`diskless_storage::clamp_part_size`] takes it): with `parts` ≥ 1 the inner storage has a
    /// multipart upload under way, with `parts` parts sent or in flight, which it must abort; with
    /// 0 the stream fails after its first chunk. Takes precedence over the random faults of that
    /// call.
    pub fn fail_next_stream_after(&self, parts: u64) {
        self.state.lock().next_stream_failure = Some(parts);
    }

    /// Lets stalled and future uploads proceed.
    pub fn release_uploads(&self) {
        self.stall.send_replace(false);
    }

    /// Uploads currently waiting on a stall.
    pub fn stalled_uploads(&self) -> usize {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Draws the decision generator of the next call of `op` on `target`.
    fn rng_for(&self, op: Op, target: &str) -> fastrand::Rng {
        let mut state = self.state.lock();
        let n = state.calls.entry((op, target.to_string())).or_insert(0);
        let call = *n;
        *n += 1;
        let mut h = fnv(&self.config.seed.to_le_bytes(), 0xcbf2_9ce4_8422_2325);
        h = fnv(&[op as u8], h);
        h = fnv(target.as_bytes(), h);
        h = fnv(&call.to_le_bytes(), h);
        fastrand::Rng::with_seed(h)
    }

    /// Latency and the failure decision of one call; records the event and sleeps.
    async fn decide(
        &self,
        op: Op,
        target: String,
        rates: &[(f64, FaultKind)],
    ) -> Option<FaultKind> {
        let mut rng = self.rng_for(op, &target);
        let latency = self
            .config
            .latency
            .as_ref()
            .map_or(Duration::ZERO, |l| l.sample(&mut rng));
        let mut fault = None;
        for (rate, kind) in rates {
            if rng.f64() < *rate {
                fault = Some(*kind);
                break;
            }
        }
        if fault.is_some() || !latency.is_zero() {
            self.state.lock().log.push(FaultEvent {
                op,
                target: target.clone(),
                fault,
                latency,
            });
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if let Some(kind) = fault {
            tracing::debug!(?op, target, ?kind, "injecting fault");
        }
        fault
    }

    fn injected(op: Op, kind: FaultKind) -> StorageError {
        StorageError::Transient {
            source: Box::new(InjectedFault { op, kind }),
        }
    }

    fn take_unreadable(&self, key: &ObjectKey) -> bool {
        let mut state = self.state.lock();
        let unreadable = match state.unreadable.get_mut(key) {
            None => false,
            Some(Unreadable::Fetches(0)) => false,
            Some(Unreadable::Fetches(n)) => {
                *n -= 1;
                true
            }
            Some(Unreadable::Until(t)) => Instant::now() < *t,
        };
        if unreadable {
            state.log.push(FaultEvent {
                op: Op::Fetch,
                target: key.to_string(),
                fault: Some(FaultKind::Unreadable),
                latency: Duration::ZERO,
            });
        } else {
            state.unreadable.remove(key);
        }
        unreadable
    }
}

#[async_trait::async_trait]
impl<S: ObjectStorage> ObjectStorage for FaultyStorage<S> {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.pass_stall().await;
        let rates = [
            (self.config.upload_failure_rate, FaultKind::Fail),
            (self.config.ambiguous_upload_rate, FaultKind::AfterUpload),
        ];
        match self.decide(Op::Upload, key.to_string(), &rates).await {
            Some(FaultKind::AfterUpload) => {
                self.inner.upload(key, payload).await?;
                Err(Self::injected(Op::Upload, FaultKind::AfterUpload))
            }
            Some(kind) => Err(Self::injected(Op::Upload, kind)),
            None => self.inner.upload(key, payload).await,
        }
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        self.pass_stall().await;
        let forced = self.state.lock().next_stream_failure.take();
        let fault = match forced {
            Some(parts) => {
                self.state.lock().log.push(FaultEvent {
                    op: Op::UploadStream,
                    target: key.to_string(),
                    fault: Some(FaultKind::MidStream),
                    latency: Duration::ZERO,
                });
                Some((FaultKind::MidStream, parts))
            }
            None => {
                let rates = [
                    (self.config.upload_failure_rate, FaultKind::Fail),
                    (self.config.ambiguous_upload_rate, FaultKind::AfterUpload),
                    (self.config.mid_stream_failure_rate, FaultKind::MidStream),
                ];
                self.decide(Op::UploadStream, key.to_string(), &rates)
                    .await
                    .map(|kind| (kind, 1))
            }
        };
        match fault {
            None => self.inner.upload_stream(key, chunks, part_size).await,
            Some((FaultKind::AfterUpload, _)) => {
                self.inner.upload_stream(key, chunks, part_size).await?;
                Err(Self::injected(Op::UploadStream, FaultKind::AfterUpload))
            }
            Some((FaultKind::MidStream, parts)) => {
                let limit =
                    parts.saturating_mul(diskless_storage::clamp_part_size(part_size) as u64);
                let failing = failing_after(chunks, limit);
                self.inner.upload_stream(key, failing, part_size).await
            }
            Some((kind, _)) => Err(Self::injected(Op::UploadStream, kind)),
        }
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let rates = [(self.config.fetch_failure_rate, FaultKind::Fail)];
        if let Some(kind) = self.decide(Op::Fetch, key.to_string(), &rates).await {
            return Err(Self::injected(Op::Fetch, kind));
        }
        if self.take_unreadable(key) {
            return Err(Self::injected(Op::Fetch, FaultKind::Unreadable));
        }
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let target = keys
            .iter()
            .map(ObjectKey::as_str)
            .collect::<Vec<_>>()
            .join(",");
        let rates = [(self.config.delete_failure_rate, FaultKind::Fail)];
        if let Some(kind) = self.decide(Op::Delete, target, &rates).await {
            return Err(Self::injected(Op::Delete, kind));
        }
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.faulty_list(prefix, move || self.inner.list(prefix))
    }

    /// Faults and latency as for [`ObjectStorage::list`] (the same [`Op::List`] on the prefix,
    /// counted in the same sequence of calls), then the inner storage's `list_with_offset`.
    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.faulty_list(prefix, move || self.inner.list_with_offset(prefix, offset))
    }
}

/// `chunks`, until it has yielded more than `limit` bytes: then one injected
/// [`FaultKind::MidStream`] error, and the end.
fn failing_after(
    chunks: BoxStream<'_, Result<Bytes, StorageError>>,
    limit: u64,
) -> BoxStream<'_, Result<Bytes, StorageError>> {
    futures::stream::unfold(Some((chunks, 0u64)), move |state| async move {
        let (mut chunks, passed) = state?;
        if passed > limit {
            let error = FaultyStorage::<Arc<dyn ObjectStorage>>::injected(
                Op::UploadStream,
                FaultKind::MidStream,
            );
            return Some((Err(error), None));
        }
        let item = chunks.next().await?;
        let passed = passed + item.as_ref().map_or(0, |chunk| chunk.len() as u64);
        Some((item, Some((chunks, passed))))
    })
    .boxed()
}

impl<S: ObjectStorage> FaultyStorage<S> {
    /// Waits while uploads are stalled (see [`FaultyStorage::stall_uploads`]).
    async fn pass_stall(&self) {
        let mut stall = self.stall.subscribe();
        if *stall.borrow_and_update() {
            self.stalled.fetch_add(1, Ordering::SeqCst);
            let _ = stall.wait_for(|stalled| !*stalled).await;
            self.stalled.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A listing of `prefix`: the fault decision and latency first, then `inner` unless it
    /// failed.
    fn faulty_list<'a>(
        &'a self,
        prefix: &'a str,
        inner: impl FnOnce() -> BoxStream<'a, Result<ObjectMeta, StorageError>> + Send + 'a,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        let rates = [(self.config.list_failure_rate, FaultKind::Fail)];
        futures::stream::once(async move {
            match self.decide(Op::List, prefix.to_string(), &rates).await {
                Some(kind) => {
                    futures::stream::once(async move { Err(Self::injected(Op::List, kind)) })
                        .boxed()
                }
                None => inner(),
            }
        })
        .flatten()
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diskless_storage::ObjectStoreStorage;
    use futures::TryStreamExt;

    fn storage(config: FaultConfig) -> FaultyStorage<ObjectStoreStorage> {
        FaultyStorage::new(ObjectStoreStorage::in_memory(), config)
    }

    fn keys(n: usize) -> Vec<ObjectKey> {
        (0..n)
            .map(|i| ObjectKey::parse(&format!("wal/k{i:03}")).unwrap())
            .collect()
    }

    fn noisy(seed: u64) -> FaultConfig {
        FaultConfig {
            seed,
            upload_failure_rate: 0.2,
            ambiguous_upload_rate: 0.2,
            mid_stream_failure_rate: 0.0,
            fetch_failure_rate: 0.3,
            delete_failure_rate: 0.3,
            list_failure_rate: 0.3,
            latency: Some(Latency::s3_like()),
        }
    }

    async fn workload(s: &FaultyStorage<ObjectStoreStorage>) -> Vec<bool> {
        let mut outcomes = vec![];
        for k in keys(40) {
            outcomes.push(s.upload(&k, &[Bytes::from_static(b"data")]).await.is_ok());
            outcomes.push(s.fetch(&k, 0..4).await.is_ok());
        }
        outcomes.push(s.delete(&keys(5)).await.is_ok());
        outcomes.push(s.list("wal").try_collect::<Vec<_>>().await.is_ok());
        outcomes
    }

    #[tokio::test(start_paused = true)]
    async fn same_seed_same_faults_and_latencies() {
        let (a, b, c) = (storage(noisy(9)), storage(noisy(9)), storage(noisy(10)));
        let (oa, ob) = (workload(&a).await, workload(&b).await);
        workload(&c).await;
        assert_eq!(oa, ob);
        assert_eq!(a.log(), b.log());
        assert_ne!(a.log(), c.log());
        assert!(oa.iter().any(|ok| !ok) && oa.iter().any(|ok| *ok));
        assert!(a.fault_count(FaultKind::AfterUpload) > 0);
        assert!(a.fault_count(FaultKind::Fail) > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn faults_do_not_depend_on_interleaving() {
        let run = |s: FaultyStorage<ObjectStoreStorage>| async move {
            let s = &s;
            let results = futures::future::join_all(keys(30).into_iter().map(|k| async move {
                let up = s.upload(&k, &[Bytes::from_static(b"x")]).await.is_ok();
                (k, up)
            }))
            .await;
            let mut log = s.log();
            log.sort_by(|x, y| x.target.cmp(&y.target));
            (results, log)
        };
        let (ra, la) = run(storage(noisy(3))).await;
        let mut rb = vec![];
        // The same calls made sequentially, in reverse order.
        let s = storage(noisy(3));
        for k in keys(30).into_iter().rev() {
            let up = s.upload(&k, &[Bytes::from_static(b"x")]).await.is_ok();
            rb.push((k, up));
        }
        rb.reverse();
        let mut lb = s.log();
        lb.sort_by(|x, y| x.target.cmp(&y.target));
        assert_eq!(ra, rb);
        assert_eq!(la, lb);
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_upload_lands_and_plain_failure_does_not() {
        let k = ObjectKey::parse("wal/x").unwrap();
        let s = storage(FaultConfig {
            ambiguous_upload_rate: 1.0,
            ..FaultConfig::default()
        });
        let err = s
            .upload(&k, &[Bytes::from_static(b"abc")])
            .await
            .unwrap_err();
        assert!(err.is_transient());
        let source = std::error::Error::source(&err).unwrap();
        assert_eq!(
            source.downcast_ref::<InjectedFault>(),
            Some(&InjectedFault {
                op: Op::Upload,
                kind: FaultKind::AfterUpload
            })
        );
        assert_eq!(s.inner().fetch(&k, 0..3).await.unwrap(), "abc");

        let s = storage(FaultConfig {
            upload_failure_rate: 1.0,
            ..FaultConfig::default()
        });
        assert!(s.upload(&k, &[Bytes::from_static(b"abc")]).await.is_err());
        assert!(s.inner().fetch(&k, 0..3).await.unwrap_err().is_not_found());
    }

    #[tokio::test(start_paused = true)]
    async fn latency_uses_tokio_time() {
        let s = storage(FaultConfig {
            latency: Some(Latency::s3_like()),
            ..FaultConfig::default()
        });
        let start = Instant::now();
        for k in keys(10) {
            s.upload(&k, &[Bytes::from_static(b"x")]).await.unwrap();
        }
        let total: Duration = s.log().iter().map(|e| e.latency).sum();
        assert_eq!(s.log().len(), 10);
        assert!(total > Duration::ZERO);
        // Tokio's timer has a millisecond resolution: each sleep may round up by 1 ms.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= total && elapsed <= total + Duration::from_millis(10),
            "{elapsed:?} vs {total:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unreadable_keys_recover() {
        let s = storage(FaultConfig::default());
        let k = ObjectKey::parse("wal/u").unwrap();
        s.upload(&k, &[Bytes::from_static(b"abc")]).await.unwrap();
        s.make_unreadable(&k, 2);
        assert!(s.fetch(&k, 0..1).await.unwrap_err().is_transient());
        assert!(s.fetch(&k, 0..1).await.unwrap_err().is_transient());
        assert!(s.fetch(&k, 0..1).await.is_ok());
        s.make_unreadable_for(&k, Duration::from_secs(5));
        assert!(s.fetch(&k, 0..1).await.is_err());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(s.fetch(&k, 0..1).await.is_ok());
        s.make_unreadable(&k, 100);
        s.make_readable(&k);
        assert!(s.fetch(&k, 0..1).await.is_ok());
        assert_eq!(s.fault_count(FaultKind::Unreadable), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_uploads_wait_for_release() {
        let s = Arc::new(storage(FaultConfig::default()));
        s.stall_uploads();
        let k = ObjectKey::parse("wal/s").unwrap();
        let task = tokio::spawn({
            let (s, k) = (s.clone(), k.clone());
            async move { s.upload(&k, &[Bytes::from_static(b"abc")]).await }
        });
        while s.stalled_uploads() == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!task.is_finished());
        assert!(s.inner().fetch(&k, 0..3).await.is_err());
        s.release_uploads();
        task.await.unwrap().unwrap();
        assert_eq!(s.stalled_uploads(), 0);
        assert_eq!(s.fetch(&k, 0..3).await.unwrap(), "abc");
    }

    #[tokio::test(start_paused = true)]
    async fn delete_and_list_failures() {
        let s = storage(FaultConfig {
            delete_failure_rate: 1.0,
            list_failure_rate: 1.0,
            ..FaultConfig::default()
        });
        assert!(s.delete(&keys(2)).await.unwrap_err().is_transient());
        let listed: Result<Vec<_>, _> = s.list("wal").try_collect().await;
        assert!(listed.unwrap_err().is_transient());
    }

    #[tokio::test(start_paused = true)]
    async fn without_faults_it_passes_conformance() {
        crate::storage::conformance::run_all(async || {
            Arc::new(FaultyStorage::new(
                ObjectStoreStorage::in_memory(),
                FaultConfig {
                    latency: Some(Latency::s3_like()),
                    ..FaultConfig::default()
                },
            ))
        })
        .await;
    }

    fn part() -> usize {
        diskless_storage::MIN_PART_SIZE
    }

    fn object(len: usize) -> Bytes {
        Bytes::from(crate::storage::conformance::pattern(len, 3))
    }

    async fn stream_upload(
        s: &FaultyStorage<ObjectStoreStorage>,
        k: &ObjectKey,
        data: &Bytes,
    ) -> Result<u64, StorageError> {
        let chunks = crate::storage::conformance::chunk_stream(data, 256 * 1024);
        s.upload_stream(k, chunks, part()).await
    }

    fn source_fault(err: &StorageError) -> Option<InjectedFault> {
        std::error::Error::source(err)
            .and_then(|e| e.downcast_ref::<InjectedFault>())
            .cloned()
    }

    #[tokio::test(start_paused = true)]
    async fn stream_faults_fail_before_after_or_midway() {
        let k = ObjectKey::parse("tiered/s").unwrap();
        let data = object(2 * part() + 100);
        let len = data.len() as u64;

        // Before: nothing reaches the inner storage.
        let s = storage(FaultConfig::default().with_upload_failure_rate(1.0));
        let err = stream_upload(&s, &k, &data).await.unwrap_err();
        assert_eq!(
            source_fault(&err),
            Some(InjectedFault {
                op: Op::UploadStream,
                kind: FaultKind::Fail
            })
        );
        assert!(s.inner().fetch(&k, 0..1).await.unwrap_err().is_not_found());

        // Ambiguous: the object is complete, the call fails.
        let s = storage(FaultConfig::default().with_ambiguous_upload_rate(1.0));
        let err = stream_upload(&s, &k, &data).await.unwrap_err();
        assert!(err.is_transient());
        assert_eq!(source_fault(&err).unwrap().kind, FaultKind::AfterUpload);
        assert_eq!(s.inner().fetch(&k, 0..len).await.unwrap(), data);

        // Midway (random): a multipart upload was under way; the inner storage aborted it.
        let s = storage(FaultConfig::default().with_mid_stream_failure_rate(1.0));
        let err = stream_upload(&s, &k, &data).await.unwrap_err();
        assert_eq!(source_fault(&err).unwrap().kind, FaultKind::MidStream);
        assert!(s.inner().fetch(&k, 0..1).await.unwrap_err().is_not_found());
        let stats = s.inner().counters().snapshot();
        assert_eq!(stats.put_parts, 1, "one part sent before the stream failed");
        assert_eq!(stats.delete_requests, 1, "the upload was aborted");
        assert_eq!(s.fault_count(FaultKind::MidStream), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_stream_fails_after_the_parts_asked_then_streams_pass() {
        let s = storage(FaultConfig::default());
        let data = object(3 * part() + 7);
        for parts in [0u64, 2] {
            let k = ObjectKey::parse(&format!("tiered/after-{parts}")).unwrap();
            s.fail_next_stream_after(parts);
            let before = s.inner().counters().snapshot();
            let err = stream_upload(&s, &k, &data).await.unwrap_err();
            assert_eq!(source_fault(&err).unwrap().kind, FaultKind::MidStream);
            assert!(s.inner().fetch(&k, 0..1).await.unwrap_err().is_not_found());
            let sent = s.inner().counters().snapshot() - before;
            assert_eq!(sent.put_parts, parts, "parts sent before the failure");
        }
        // One-shot: the next stream passes.
        let k = ObjectKey::parse("tiered/whole").unwrap();
        let size = stream_upload(&s, &k, &data).await.unwrap();
        assert_eq!(size, data.len() as u64);
        assert_eq!(s.fetch(&k, 0..size).await.unwrap(), data);
        assert_eq!(s.fault_count(FaultKind::MidStream), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_stream_uploads_wait_for_release() {
        let s = Arc::new(storage(FaultConfig::default()));
        s.stall_uploads();
        let k = ObjectKey::parse("tiered/stalled").unwrap();
        let data = object(part() + 1);
        let task = tokio::spawn({
            let (s, k, data) = (s.clone(), k.clone(), data.clone());
            async move { stream_upload(&s, &k, &data).await }
        });
        while s.stalled_uploads() == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!task.is_finished());
        assert_eq!(s.inner().counters().snapshot().put_requests, 0);
        s.release_uploads();
        assert_eq!(task.await.unwrap().unwrap(), data.len() as u64);
        assert_eq!(s.fetch(&k, 0..1).await.unwrap(), data[..1]);
    }

    #[test]
    fn latency_percentiles_match_the_fit() {
        let latency = Latency::s3_like();
        let mut rng = fastrand::Rng::with_seed(1);
        let mut draws: Vec<Duration> = (0..20_000).map(|_| latency.sample(&mut rng)).collect();
        draws.sort();
        let p50 = draws[draws.len() / 2].as_secs_f64();
        let p99 = draws[draws.len() * 99 / 100].as_secs_f64();
        assert!((0.09..0.11).contains(&p50), "p50 {p50}");
        assert!((0.36..0.44).contains(&p99), "p99 {p99}");
        assert!(draws.iter().all(|d| *d <= latency.max));
    }
}
