//! [`CommitDeadline`]: refuses, on the broker, commits of objects already past their deadline.

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, Clock, CommitBatchResult, CommitFileRequest, CoordinatorError,
    CreateTopicRequest, DeleteRecordsRequest, DeleteRecordsResponse, FindBatchesRequest,
    FindBatchesResponse, ListOffsetsRequest, ListOffsetsResponse, ObjectInfo, ObjectToDelete,
    ProducerState, RetentionReport, TopicIdPartition, TopicInfo, check_commit_deadline,
};
use std::sync::Arc;
use std::time::Duration;

/// A [`BatchCoordinator`] wrapper that refuses, before sending it, a commit of an object whose
/// key's UUID v7 time is older than `max_commit_age` (by the wrapper's clock), with
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
    inner: Arc<dyn BatchCoordinator>,
    clock: Arc<dyn Clock>,
    max_commit_age: Duration,
}

impl CommitDeadline {
    /// Wraps `inner`.
    pub fn new(
        inner: Arc<dyn BatchCoordinator>,
        clock: Arc<dyn Clock>,
        max_commit_age: Duration,
    ) -> Self {
        CommitDeadline {
            inner,
            clock,
            max_commit_age,
        }
    }

    /// The wrapped coordinator.
    pub fn inner(&self) -> &Arc<dyn BatchCoordinator> {
        &self.inner
    }
}

#[async_trait]
impl BatchCoordinator for CommitDeadline {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        self.inner.create_topic(request).await
    }

    async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
        self.inner.delete_topic(topic_id).await
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        self.inner.list_topics().await
    }

    async fn commit_file(
        &self,
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
        self.inner.commit_file(request).await
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        self.inner.find_batches(requests, fetch_max_bytes).await
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        self.inner.list_offsets(requests).await
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        self.inner.delete_records(requests).await
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        self.inner.enforce_retention(max_batches).await
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        self.inner.objects_to_delete(marked_before_ms, limit).await
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        self.inner.confirm_deleted(object_keys).await
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        self.inner.fence_orphans(object_keys).await
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<diskless_coordinator::ProducerExpiryReport, CoordinatorError> {
        self.inner.expire_producers(max_producers).await
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        self.inner.known_objects(object_keys).await
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        self.inner.object_info(object_key).await
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        self.inner.producer_state(partition, producer_id).await
    }
}
