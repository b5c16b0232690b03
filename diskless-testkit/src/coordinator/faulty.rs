//! [`FaultyCoordinator`]: a wrapper that makes any coordinator's commits fail in the two ways that
//! matter to a writer — not applied, or applied with the answer lost — and can slow them down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, CommitBatchResult, CommitFileRequest, CoordinatorError, CoordinatorLayer,
    Layered,
};
use parking_lot::Mutex;

/// Why an injected failure happened (the source of the injected [`CoordinatorError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InjectedCommitFault {
    /// The commit was refused before reaching the inner coordinator.
    #[error("injected: commit refused before it was applied")]
    NotApplied,
    /// The commit was applied by the inner coordinator, then its answer was dropped.
    #[error("injected: commit applied, answer lost")]
    AnswerLost,
}

/// A [`BatchCoordinator`] that injects commit failures into an inner one; every other call passes
/// through. It is the [`CommitFaults`] layer around the inner coordinator: build one with
/// [`CommitFaults::wrap`]; the controls below are [`CommitFaults`]'s, reached through the wrapper.
pub type FaultyCoordinator = Layered<CommitFaults>;

/// The [`CoordinatorLayer`] of a [`FaultyCoordinator`]: what to inject into commits.
///
/// - [`fail_next_commits`](Self::fail_next_commits) / [`set_failing`](Self::set_failing): commits
///   fail with [`CoordinatorError::Unavailable`] and are *not* applied;
/// - [`lose_next_commits`](Self::lose_next_commits) / [`set_losing`](Self::set_losing): commits are
///   applied, then fail with [`CoordinatorError::OutcomeUnknown`] (a connection lost after COMMIT);
/// - [`set_commit_latency`](Self::set_commit_latency): each commit waits first (`tokio::time`, so
///   paused-clock tests stay instant);
/// - [`stall_commits`](Self::stall_commits): commits wait, before reaching the inner coordinator,
///   until [`release_commits`](Self::release_commits) — a commit that "passed every check on the
///   broker" and then stalls on its way (a lock wait, a retry loop, a slow network).
///   [`stalled_commits`](Self::stalled_commits) tells how many are waiting.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use diskless_coordinator::{BatchCoordinator, CommitFileRequest, CoordinatorError, ManualClock};
/// use diskless_testkit::coordinator::{CommitFaults, InMemoryCoordinator};
///
/// let inner = Arc::new(InMemoryCoordinator::new(ManualClock::new(0)));
/// let faulty = CommitFaults::wrap(inner.clone());
/// faulty.lose_next_commits(1);
/// let request = CommitFileRequest {
///     object_key: "wal/a".into(), uploader_broker_id: 1, object_size: 1, owners: vec![0], batches: vec![],
/// };
/// let err = faulty.commit_file(request).await.unwrap_err();
/// assert!(matches!(err, CoordinatorError::OutcomeUnknown(_)));
/// // ...but it was applied:
/// assert!(inner.object_info("wal/a").await.unwrap().is_some());
/// # });
/// ```
#[derive(Debug)]
pub struct CommitFaults {
    fail_next: AtomicU32,
    lose_next: AtomicU32,
    failing: AtomicBool,
    losing: AtomicBool,
    latency: Mutex<Option<Duration>>,
    commits: AtomicU64,
    injected: AtomicU64,
    stall: tokio::sync::watch::Sender<bool>,
    stalled: Arc<AtomicU64>,
    detached: AtomicBool,
    /// The inner coordinator, for detached commits (set by `wrap`).
    inner: std::sync::OnceLock<Arc<dyn BatchCoordinator>>,
    fences_failing: AtomicBool,
}

impl CommitFaults {
    /// `inner` behind a layer injecting nothing until told to.
    pub fn wrap(inner: Arc<dyn BatchCoordinator>) -> Arc<FaultyCoordinator> {
        let faults = CommitFaults::default();
        let _ = faults.inner.set(inner.clone());
        Arc::new(Layered::new(inner, faults))
    }
}

impl Default for CommitFaults {
    fn default() -> Self {
        CommitFaults {
            fail_next: AtomicU32::new(0),
            lose_next: AtomicU32::new(0),
            failing: AtomicBool::new(false),
            losing: AtomicBool::new(false),
            latency: Mutex::new(None),
            commits: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            stall: tokio::sync::watch::Sender::new(false),
            stalled: Arc::new(AtomicU64::new(0)),
            detached: AtomicBool::new(false),
            inner: std::sync::OnceLock::new(),
            fences_failing: AtomicBool::new(false),
        }
    }
}

impl CommitFaults {
    /// From now on, commits wait before reaching the inner coordinator, until
    /// [`release_commits`](Self::release_commits).
    pub fn stall_commits(&self) {
        self.stall.send_replace(true);
    }

    /// Lets every stalled commit (and later ones) go on to the inner coordinator.
    pub fn release_commits(&self) {
        self.stall.send_replace(false);
    }

    /// Commits waiting right now because of [`stall_commits`](Self::stall_commits).
    pub fn stalled_commits(&self) -> u64 {
        self.stalled.load(Ordering::SeqCst)
    }

    /// The next `n` commits fail without being applied.
    pub fn fail_next_commits(&self, n: u32) {
        self.fail_next.store(n, Ordering::SeqCst);
    }

    /// The next `n` commits are applied, then report an unknown outcome.
    pub fn lose_next_commits(&self, n: u32) {
        self.lose_next.store(n, Ordering::SeqCst);
    }

    /// While on, every commit fails without being applied.
    pub fn set_failing(&self, on: bool) {
        self.failing.store(on, Ordering::SeqCst);
    }

    /// While on, every commit is applied, then reports an unknown outcome.
    pub fn set_losing(&self, on: bool) {
        self.losing.store(on, Ordering::SeqCst);
    }

    /// While on, each commit runs in a task of its own: a caller that gives up (drops the call, as
    /// the writer does at its `commit_timeout`) does not stop it, and a stalled commit reaches the
    /// inner coordinator on release — a commit still on the wire after its caller stopped
    /// waiting. Detached commits only stall (no latency, failures or lost answers are injected
    /// into them). Needs a Tokio runtime and a layer made by [`CommitFaults::wrap`].
    pub fn set_detached(&self, on: bool) {
        self.detached.store(on, Ordering::SeqCst);
    }

    /// While on, `fence_orphans` fails with [`CoordinatorError::Unavailable`] (the coordinator
    /// cannot be asked what a lost commit did).
    pub fn set_fences_failing(&self, on: bool) {
        self.fences_failing.store(on, Ordering::SeqCst);
    }

    /// Delays every commit by `latency` (`None`: no delay).
    pub fn set_commit_latency(&self, latency: Option<Duration>) {
        *self.latency.lock() = latency;
    }

    /// Commits received so far.
    pub fn commit_calls(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// Commits that got an injected failure so far.
    pub fn injected_faults(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Takes one from a countdown, if it is above zero.
    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Returns at once unless commits are stalled; then once they are released, counted in `stalled`
/// meanwhile. (The sender lives as long as the layer, so a stalled wait only ends on release.)
async fn pass_stall(mut stall: tokio::sync::watch::Receiver<bool>, stalled: &AtomicU64) {
    if *stall.borrow_and_update() {
        stalled.fetch_add(1, Ordering::SeqCst);
        let _ = stall.wait_for(|stalled| !*stalled).await;
        stalled.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl CoordinatorLayer for CommitFaults {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        if self.detached.load(Ordering::SeqCst)
            && let Some(inner) = self.inner.get().cloned()
        {
            // On the wire: the commit goes on (stalled, then to the inner coordinator) whether
            // or not the caller still waits for it.
            let (stall, stalled) = (self.stall.subscribe(), self.stalled.clone());
            let task = tokio::spawn(async move {
                pass_stall(stall, &stalled).await;
                inner.commit_file(request).await
            });
            return task
                .await
                .map_err(|e| CoordinatorError::OutcomeUnknown(Box::new(e)))?;
        }
        let latency = *self.latency.lock();
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        pass_stall(self.stall.subscribe(), &self.stalled).await;
        if self.failing.load(Ordering::SeqCst) || Self::take(&self.fail_next) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(CoordinatorError::Unavailable(Box::new(
                InjectedCommitFault::NotApplied,
            )));
        }
        let result = inner.commit_file(request).await;
        if self.losing.load(Ordering::SeqCst) || Self::take(&self.lose_next) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(CoordinatorError::OutcomeUnknown(Box::new(
                InjectedCommitFault::AnswerLost,
            )));
        }
        result
    }

    async fn fence_orphans(
        &self,
        inner: &dyn BatchCoordinator,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        if self.fences_failing.load(Ordering::SeqCst) {
            return Err(CoordinatorError::Unavailable(
                "injected: fence_orphans refused".into(),
            ));
        }
        inner.fence_orphans(object_keys).await
    }
}
