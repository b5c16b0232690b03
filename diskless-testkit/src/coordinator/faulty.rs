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
    stalled: AtomicU64,
}

impl CommitFaults {
    /// `inner` behind a layer injecting nothing until told to.
    pub fn wrap(inner: Arc<dyn BatchCoordinator>) -> Arc<FaultyCoordinator> {
        Arc::new(Layered::new(inner, CommitFaults::default()))
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
            stalled: AtomicU64::new(0),
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

#[async_trait]
impl CoordinatorLayer for CommitFaults {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        let latency = *self.latency.lock();
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        let mut stall = self.stall.subscribe();
        if *stall.borrow_and_update() {
            self.stalled.fetch_add(1, Ordering::SeqCst);
            // The sender lives as long as `self`, so this only ends on release.
            let _ = stall.wait_for(|stalled| !*stalled).await;
            self.stalled.fetch_sub(1, Ordering::SeqCst);
        }
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
}
