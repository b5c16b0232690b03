//! Storage and coordinator wrappers the simulation puts between the brokers and the shared
//! components: listing times from the simulated clock, a switch from the faulty to the calm
//! storage, and a crash gate per broker incarnation.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use diskless_coordinator::{
    BatchCoordinator, Clock, CommitBatchResult, CommitFileRequest, CoordinatorError,
    CoordinatorLayer, CoordinatorOp, Layered, RegisterSegmentOutcome, RegisterSegmentRequest,
    TxnMarker, TxnMarkerResult,
};
use diskless_storage::{ObjectKey, ObjectMeta, ObjectStorage, StorageError};
use diskless_testkit::coordinator::{CommitFaults, FaultyCoordinator, InjectedCommitFault};
use diskless_testkit::storage::FaultyStorage;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use parking_lot::Mutex;

use crate::clock::SimClock;
use crate::sync::Stall;
use crate::trace::Trace;

/// Traces objects landing in and leaving the store, and (unless the store dates objects by the
/// simulated clock itself) dates listed objects by the time their upload returned. Stores date
/// objects by the wall clock (`object_store`'s in-memory store does), which has nothing to do
/// with a simulated run; the orphan collector reads these dates.
#[derive(Debug)]
pub(crate) struct LandedAt {
    inner: Arc<dyn ObjectStorage>,
    clock: Arc<SimClock>,
    landed: Mutex<BTreeMap<ObjectKey, i64>>,
    trace: Arc<Mutex<Trace>>,
    /// The store dates objects by the simulated clock already: its dates are kept.
    trust_dates: bool,
}

impl LandedAt {
    pub(crate) fn new(
        inner: Arc<dyn ObjectStorage>,
        clock: Arc<SimClock>,
        trace: Arc<Mutex<Trace>>,
        trust_dates: bool,
    ) -> Self {
        LandedAt {
            inner,
            clock,
            landed: Mutex::new(BTreeMap::new()),
            trace,
            trust_dates,
        }
    }

    fn redate(&self, mut meta: ObjectMeta) -> ObjectMeta {
        if self.trust_dates {
            return meta;
        }
        let at = self.landed.lock().get(&meta.key).copied();
        let ms = at
            .or_else(|| {
                meta.key
                    .created_at()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .and_then(|d| i64::try_from(d.as_millis()).ok())
            })
            .unwrap_or(0);
        meta.last_modified = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        meta
    }

    /// Records (and traces) that `key` landed now, unless it had landed before.
    fn landed(&self, key: &ObjectKey) {
        let now = self.clock.now_ms();
        let fresh = {
            let mut landed = self.landed.lock();
            let fresh = !landed.contains_key(key);
            landed.entry(key.clone()).or_insert(now);
            fresh
        };
        if fresh {
            let at = self.clock.elapsed_ms();
            self.trace
                .lock()
                .event(at, format_args!("store: {key} landed"));
        }
    }
}

#[async_trait]
impl ObjectStorage for LandedAt {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.inner.upload(key, payload).await?;
        self.landed(key);
        Ok(())
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        let size = self.inner.upload_stream(key, chunks, part_size).await?;
        self.landed(key);
        Ok(size)
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        let deleted = self.inner.delete(keys).await?;
        let mut landed = self.landed.lock();
        let at = self.clock.elapsed_ms();
        let mut trace = self.trace.lock();
        for k in &deleted {
            if landed.remove(k).is_some() {
                trace.event(at, format_args!("store: {k} deleted"));
            }
        }
        Ok(deleted)
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner
            .list(prefix)
            .map(move |m| m.map(|m| self.redate(m)))
            .boxed()
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner
            .list_with_offset(prefix, offset)
            .map(move |m| m.map(|m| self.redate(m)))
            .boxed()
    }
}

/// The storage every actor uses: the faulty storage until the faults stop, then the calm one
/// (same objects, latency only).
///
/// Uploads started while `stall` is on wait before reaching either, in a task of their own: a
/// caller that gives up (drops the call) does not stop the request, which lands once released,
/// as a PUT stuck on the network would.
#[derive(Debug)]
pub(crate) struct PhaseStorage {
    pub(crate) faulty: Arc<FaultyStorage>,
    pub(crate) calm: Arc<FaultyStorage>,
    pub(crate) calm_on: Arc<AtomicBool>,
    pub(crate) stall: Arc<Stall>,
}

impl PhaseStorage {
    fn current(&self) -> &Arc<FaultyStorage> {
        pick(&self.calm_on, &self.faulty, &self.calm)
    }
}

fn pick<'a>(
    calm_on: &AtomicBool,
    faulty: &'a Arc<FaultyStorage>,
    calm: &'a Arc<FaultyStorage>,
) -> &'a Arc<FaultyStorage> {
    if calm_on.load(Ordering::SeqCst) {
        calm
    } else {
        faulty
    }
}

#[async_trait]
impl ObjectStorage for PhaseStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        if !self.stall.is_on() {
            return self.current().upload(key, payload).await;
        }
        let (faulty, calm, calm_on, stall) = (
            self.faulty.clone(),
            self.calm.clone(),
            self.calm_on.clone(),
            self.stall.clone(),
        );
        let (key, payload) = (key.clone(), payload.to_vec());
        let request = tokio::spawn(async move {
            stall.pass().await;
            pick(&calm_on, &faulty, &calm).upload(&key, &payload).await
        });
        request.await.map_err(|e| StorageError::Transient {
            source: Box::new(e),
        })?
    }

    /// A streamed upload (a tiered segment's multipart upload) cannot outlive its caller: its
    /// chunks come from the caller. While stalled it waits before it starts.
    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        self.stall.pass().await;
        self.current().upload_stream(key, chunks, part_size).await
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.current().fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.current().delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.current().list(prefix)
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.current().list_with_offset(prefix, offset)
    }
}

/// Why a crashed broker's call failed.
#[derive(Debug)]
pub(crate) struct Crashed;

impl std::fmt::Display for Crashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the broker crashed")
    }
}

impl std::error::Error for Crashed {}

/// One broker incarnation's view of the shared storage and coordinator. When the broker crashes
/// the gate closes: calls not yet started fail at once (as a dead process sends nothing), calls
/// already on their way go on (a request on the wire still lands).
#[derive(Debug)]
pub(crate) struct Gate {
    alive: AtomicBool,
}

impl Gate {
    pub(crate) fn new() -> Arc<Gate> {
        Arc::new(Gate {
            alive: AtomicBool::new(true),
        })
    }

    pub(crate) fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    fn storage(&self) -> Result<(), StorageError> {
        if self.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(StorageError::Transient {
                source: Box::new(Crashed),
            })
        }
    }

    fn coordinator(&self) -> Result<(), CoordinatorError> {
        if self.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(CoordinatorError::Unavailable(Box::new(Crashed)))
        }
    }
}

/// Storage behind a [`Gate`].
#[derive(Debug)]
pub(crate) struct GatedStorage {
    pub(crate) gate: Arc<Gate>,
    pub(crate) inner: Arc<dyn ObjectStorage>,
}

#[async_trait]
impl ObjectStorage for GatedStorage {
    async fn upload(&self, key: &ObjectKey, payload: &[Bytes]) -> Result<(), StorageError> {
        self.gate.storage()?;
        self.inner.upload(key, payload).await
    }

    async fn upload_stream(
        &self,
        key: &ObjectKey,
        chunks: BoxStream<'_, Result<Bytes, StorageError>>,
        part_size: usize,
    ) -> Result<u64, StorageError> {
        self.gate.storage()?;
        self.inner.upload_stream(key, chunks, part_size).await
    }

    async fn fetch(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.gate.storage()?;
        self.inner.fetch(key, range).await
    }

    async fn delete(&self, keys: &[ObjectKey]) -> Result<Vec<ObjectKey>, StorageError> {
        self.gate.storage()?;
        self.inner.delete(keys).await
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        match self.gate.storage() {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }

    fn list_with_offset<'a>(
        &'a self,
        prefix: &'a str,
        offset: &'a str,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        match self.gate.storage() {
            Ok(()) => self.inner.list_with_offset(prefix, offset),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }
}

/// A coordinator behind a [`Gate`]: every call checks the gate first.
#[derive(Debug)]
pub(crate) struct GatedCoordinator {
    pub(crate) gate: Arc<Gate>,
    /// This host's link to the coordinator, whose commits may stall on their way ([`LinkStall`]);
    /// `None`: never.
    pub(crate) link: Option<LinkStall>,
}

/// Calls of one broker stalled on their way to the coordinator (a slow or stuck link of that
/// broker alone): a commit started while stalled waits in a task of its own (so a writer that gives
/// up does not stop it) and lands once released; the broker's other calls wait in their caller
/// (one that gives up drops them); other brokers' calls go on.
#[derive(Debug, Clone)]
pub(crate) struct LinkStall {
    pub(crate) stall: Arc<Stall>,
    /// The coordinator behind the link, held by the stalled commit's own task.
    pub(crate) coordinator: Arc<dyn BatchCoordinator>,
}

#[async_trait]
impl CoordinatorLayer for GatedCoordinator {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        Box::pin(async move {
            self.gate.coordinator()?;
            // A stalled link holds every call of the host, not only its commits: the writer's
            // questions about a commit whose answer it lost (`fence_orphans`, `producer_state`)
            // wait too, and may time out, leaving the outcome unknown. A commit waits in a task of
            // its own instead (`commit_file` below), so that it outlives a caller that gives up.
            if op != CoordinatorOp::CommitFile
                && let Some(link) = self.link.as_ref().filter(|l| l.stall.is_on())
            {
                link.stall.pass().await;
            }
            call.await
        })
    }

    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        let Some(link) = self.link.as_ref().filter(|l| l.stall.is_on()) else {
            return inner.commit_file(request).await;
        };
        let LinkStall { stall, coordinator } = link.clone();
        let call = tokio::spawn(async move {
            stall.pass().await;
            coordinator.commit_file(request).await
        });
        call.await
            .map_err(|e| CoordinatorError::OutcomeUnknown(Box::new(e)))?
    }
}

/// Commit faults on a coordinator: refused and applied-with-the-answer-lost commits from the
/// testkit's [`FaultyCoordinator`], and stalls of its own (deterministic, see [`Stall`]); the same
/// three faults for transaction markers (`write_txn_markers`) and for tiered segment
/// registrations (`register_segment`, whose stalled callers are answered `OutcomeUnknown` after
/// an RPC timeout while the call lands once released), with controls of their own.
///
/// A commit started while stalled waits before anything else, in a task of its own, as a commit
/// stuck on its way to the coordinator: a caller that gives up (the writer's commit timeout
/// drops the call) does not stop it; it lands once released. Build one with
/// [`CommitStalls::wrap`]; the controls are [`CommitStalls`]'s, reached through the wrapper.
pub type FaultyCommits = Layered<CommitStalls>;

/// The [`CoordinatorLayer`] of [`FaultyCommits`].
#[derive(Debug)]
pub struct CommitStalls {
    faulty: Arc<FaultyCoordinator>,
    stall: Arc<Stall>,
    fail_markers: AtomicU32,
    lose_markers: AtomicU32,
    marker_stall: Arc<Stall>,
    fail_registers: AtomicU32,
    lose_registers: AtomicU32,
    register_stall: Arc<Stall>,
    /// How long a caller waits for a stalled registration before it is told the outcome is
    /// unknown (ms).
    register_timeout_ms: AtomicU64,
}

/// Takes one from a countdown, if it is above zero.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl CommitStalls {
    /// Wraps `inner`, injecting nothing until told to. The layer's inner coordinator is the
    /// testkit's [`FaultyCoordinator`] around `inner`.
    pub fn wrap(inner: Arc<dyn BatchCoordinator>) -> Arc<FaultyCommits> {
        let faulty = CommitFaults::wrap(inner);
        Arc::new(Layered::new(
            faulty.clone(),
            CommitStalls {
                faulty,
                stall: Arc::new(Stall::default()),
                fail_markers: AtomicU32::new(0),
                lose_markers: AtomicU32::new(0),
                marker_stall: Arc::new(Stall::default()),
                fail_registers: AtomicU32::new(0),
                lose_registers: AtomicU32::new(0),
                register_stall: Arc::new(Stall::default()),
                register_timeout_ms: AtomicU64::new(u64::MAX),
            },
        ))
    }

    /// The next `n` commits fail without being applied.
    pub fn fail_next_commits(&self, n: u32) {
        self.faulty.fail_next_commits(n);
    }

    /// The next `n` commits are applied, then report an unknown outcome.
    pub fn lose_next_commits(&self, n: u32) {
        self.faulty.lose_next_commits(n);
    }

    /// Commits wait until [`CommitStalls::release_commits`].
    pub fn stall_commits(&self) {
        self.stall.stall();
    }

    /// Lets stalled commits go on.
    pub fn release_commits(&self) {
        self.stall.release();
    }

    /// Commits waiting on a stall now.
    pub fn stalled_commits(&self) -> usize {
        self.stall.waiting()
    }

    /// The next `n` `write_txn_markers` calls fail without being applied.
    pub fn fail_next_markers(&self, n: u32) {
        self.fail_markers.store(n, Ordering::SeqCst);
    }

    /// The next `n` `write_txn_markers` calls are applied, then report an unknown outcome.
    pub fn lose_next_markers(&self, n: u32) {
        self.lose_markers.store(n, Ordering::SeqCst);
    }

    /// `write_txn_markers` calls wait until [`CommitStalls::release_markers`] (a call whose caller
    /// gives up still lands once released).
    pub fn stall_markers(&self) {
        self.marker_stall.stall();
    }

    /// Lets stalled marker calls go on.
    pub fn release_markers(&self) {
        self.marker_stall.release();
    }

    /// The next `n` `register_segment` calls fail without being applied.
    pub fn fail_next_registers(&self, n: u32) {
        self.fail_registers.store(n, Ordering::SeqCst);
    }

    /// The next `n` `register_segment` calls are applied, then report an unknown outcome.
    pub fn lose_next_registers(&self, n: u32) {
        self.lose_registers.store(n, Ordering::SeqCst);
    }

    /// `register_segment` calls wait until [`CommitStalls::release_registers`]; their caller is
    /// answered `OutcomeUnknown` after `timeout` (an RPC timeout) while the call, on the wire,
    /// still lands once released.
    pub fn stall_registers(&self, timeout: Duration) {
        self.register_timeout_ms.store(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
        self.register_stall.stall();
    }

    /// Lets stalled registrations go on.
    pub fn release_registers(&self) {
        self.register_stall.release();
    }
}

#[async_trait]
impl CoordinatorLayer for CommitStalls {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        if !self.stall.is_on() {
            return inner.commit_file(request).await;
        }
        // A task of its own (it outlives a caller that gives up), so it holds the inner
        // coordinator by `Arc`: the same `FaultyCoordinator` `inner` is.
        let (faulty, stall) = (self.faulty.clone(), self.stall.clone());
        let call = tokio::spawn(async move {
            stall.pass().await;
            faulty.commit_file(request).await
        });
        call.await
            .map_err(|e| CoordinatorError::OutcomeUnknown(Box::new(e)))?
    }

    async fn write_txn_markers(
        &self,
        inner: &dyn BatchCoordinator,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        if take_one(&self.fail_markers) {
            return Err(CoordinatorError::Unavailable(Box::new(
                InjectedCommitFault::NotApplied,
            )));
        }
        let lose = take_one(&self.lose_markers);
        let result = if self.marker_stall.is_on() {
            let (faulty, stall) = (self.faulty.clone(), self.marker_stall.clone());
            let markers = markers.to_vec();
            let call = tokio::spawn(async move {
                stall.pass().await;
                faulty.write_txn_markers(&markers).await
            });
            call.await
                .map_err(|e| CoordinatorError::OutcomeUnknown(Box::new(e)))?
        } else {
            inner.write_txn_markers(markers).await
        };
        match result {
            Ok(_) if lose => Err(CoordinatorError::OutcomeUnknown(Box::new(
                InjectedCommitFault::AnswerLost,
            ))),
            other => other,
        }
    }

    async fn register_segment(
        &self,
        inner: &dyn BatchCoordinator,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        if take_one(&self.fail_registers) {
            return Err(CoordinatorError::Unavailable(Box::new(
                InjectedCommitFault::NotApplied,
            )));
        }
        let lose = take_one(&self.lose_registers);
        let result = if self.register_stall.is_on() {
            let (faulty, stall) = (self.faulty.clone(), self.register_stall.clone());
            let timeout = Duration::from_millis(self.register_timeout_ms.load(Ordering::SeqCst));
            let call = tokio::spawn(async move {
                stall.pass().await;
                faulty.register_segment(request).await
            });
            match tokio::time::timeout(timeout, call).await {
                Ok(joined) => joined.map_err(|e| CoordinatorError::OutcomeUnknown(Box::new(e)))?,
                // The call goes on in its task and lands once released.
                Err(elapsed) => Err(CoordinatorError::OutcomeUnknown(Box::new(elapsed))),
            }
        } else {
            inner.register_segment(request).await
        };
        match result {
            Ok(_) if lose => Err(CoordinatorError::OutcomeUnknown(Box::new(
                InjectedCommitFault::AnswerLost,
            ))),
            other => other,
        }
    }
}
