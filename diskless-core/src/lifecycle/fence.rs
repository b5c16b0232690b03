//! [`CommitDeadline`]: refuses, on the broker, commits of objects already past their deadline.

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, Clock, CommitBatchResult, CommitFileRequest, CoordinatorError,
    CoordinatorLayer, Layered, check_commit_deadline,
};
use std::sync::Arc;
use std::time::Duration;

/// A [`CoordinatorLayer`] that refuses, before sending it, a commit of an object whose key's
/// UUID v7 time is older than `max_commit_age` (by the layer's clock), with
/// [`CoordinatorError::DeadlineExceeded`] (the writer then deletes the object, as after any commit
/// certainly not applied). Every other call passes through.
///
/// This is an optimisation, not a safety measure: it saves a round trip for a commit that the
/// coordinator would refuse anyway. Safety comes from the coordinators themselves, which check the
/// same deadline and the orphan fences *inside* their commit transaction
/// ([`diskless_coordinator::check_commit_deadline`], `BatchCoordinator::fence_orphans`): a check
/// made here, before the call, cannot bound when the call lands.
///
/// ```
/// use diskless_core::lifecycle::CommitDeadline;
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::{sync::Arc, time::Duration};
/// let clock = ManualClock::new(1_700_000_000_000);
/// let inner: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
/// let fenced: Arc<dyn BatchCoordinator> =
///     Arc::new(CommitDeadline::new(inner, clock, Duration::from_secs(600)));
/// ```
#[derive(Debug)]
pub struct CommitDeadline {
    clock: Arc<dyn Clock>,
    max_commit_age: Duration,
}

impl CommitDeadline {
    /// `inner` behind the deadline check.
    #[allow(clippy::new_ret_no_self)] // The layer is only ever used wrapped around a coordinator.
    pub fn new(
        inner: Arc<dyn BatchCoordinator>,
        clock: Arc<dyn Clock>,
        max_commit_age: Duration,
    ) -> Layered<CommitDeadline> {
        Layered::new(
            inner,
            CommitDeadline {
                clock,
                max_commit_age,
            },
        )
    }
}

#[async_trait]
impl CoordinatorLayer for CommitDeadline {
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        if let Err(e) = check_commit_deadline(
            &request.object_key,
            self.clock.now_ms(),
            self.max_commit_age,
        ) {
            tracing::warn!(object = request.object_key, error = %e, "refusing a commit past its deadline");
            return Err(e);
        }
        inner.commit_file(request).await
    }
}
