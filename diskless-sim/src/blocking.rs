//! [`BlockingCoordinator`]: runs each call of a coordinator to completion on the calling thread.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, CommitBatchResult, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    DeleteRecordsRequest, DeleteRecordsResponse, FindBatchesRequest, FindBatchesResponse,
    ListOffsetsRequest, ListOffsetsResponse, ObjectInfo, ObjectToDelete, ProducerExpiryReport,
    ProducerState, RetentionReport, TopicIdPartition, TopicInfo,
};

/// Wakes a parked thread.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread, parking between polls.
///
/// Inside a tokio task this blocks the runtime's thread: nothing else runs and, under a paused
/// clock, no virtual time passes until the future is done. Only for futures that complete by
/// themselves (work on other threads), never for ones that need this runtime to make progress.
///
/// The future runs outside tokio's cooperative budget ([`tokio::task::unconstrained`]): a tokio
/// resource (a `tokio::sync::Mutex`, say) polled by a task that has spent its budget answers
/// `Pending` and hands its wake-up to the scheduler, which never runs while this thread is
/// blocked — a deadlock.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(tokio::task::unconstrained(future));
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// A [`BatchCoordinator`] wrapper whose calls each run to completion inside the async method,
/// blocking the calling thread ([`block_on`]).
///
/// The SQLite coordinator runs its statements on a connection thread. Under a paused tokio clock,
/// the runtime would auto-advance virtual time while it waits for that thread, so how much
/// virtual time a call takes — and so the whole run — would depend on the host's speed. Wrapped,
/// a call takes no virtual time and the run is reproducible. Only for coordinators that make
/// progress without the caller's runtime (the in-memory SQLite coordinator does: one connection,
/// no pool).
#[derive(Debug)]
pub struct BlockingCoordinator {
    inner: Arc<dyn BatchCoordinator>,
}

impl BlockingCoordinator {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn BatchCoordinator>) -> Self {
        BlockingCoordinator { inner }
    }
}

#[async_trait]
impl BatchCoordinator for BlockingCoordinator {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        block_on(self.inner.create_topic(request))
    }

    async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
        block_on(self.inner.delete_topic(topic_id))
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        block_on(self.inner.list_topics())
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        block_on(self.inner.commit_file(request))
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        block_on(self.inner.find_batches(requests, fetch_max_bytes))
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        block_on(self.inner.list_offsets(requests))
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        block_on(self.inner.delete_records(requests))
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        block_on(self.inner.enforce_retention(max_batches))
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        block_on(self.inner.objects_to_delete(marked_before_ms, limit))
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        block_on(self.inner.confirm_deleted(object_keys))
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        block_on(self.inner.fence_orphans(object_keys))
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        block_on(self.inner.expire_producers(max_producers))
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        block_on(self.inner.known_objects(object_keys))
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        block_on(self.inner.object_info(object_key))
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        block_on(self.inner.producer_state(partition, producer_id))
    }
}
