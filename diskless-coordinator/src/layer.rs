//! Wrapping a [`BatchCoordinator`] without forwarding every method by hand.
//!
//! A wrapper (fault injection, metrics, a gate in a test, a commit-deadline precheck, a mutant
//! with a known bug) implements [`CoordinatorLayer`] — only the methods it changes — and
//! [`Layered`] makes it a [`BatchCoordinator`]:
//!
//! - [`CoordinatorLayer::around`] runs around *every* call, with the call's [`CoordinatorOp`]:
//!   time it, refuse it, delay it, or run it and then report its outcome as unknown;
//! - one method per trait method, each given the inner coordinator, changes one operation's
//!   arguments or answer; the defaults pass the call through.
//!
//! The trait stays one trait (rather than splitting rarely-wrapped admin and lifecycle methods into
//! a sub-trait): a host wires one `Arc<dyn BatchCoordinator>` everywhere, and a new trait method
//! is added in three places — the trait, the layer's default, and [`Layered`] — not in every
//! wrapper. `Arc<T>` and `Box<T>` of a coordinator are coordinators too (blanket impls below).
//!
//! ```
//! use diskless_coordinator::{BatchCoordinator, CoordinatorError, CoordinatorLayer, CoordinatorOp, Layered};
//! use futures::future::BoxFuture;
//! use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
//!
//! /// Counts commits and refuses every `delete_topic`.
//! #[derive(Debug, Default)]
//! struct Guard { commits: AtomicU64 }
//!
//! impl CoordinatorLayer for Guard {
//!     fn around<'a, T: Send + 'a>(
//!         &'a self,
//!         op: CoordinatorOp,
//!         call: BoxFuture<'a, Result<T, CoordinatorError>>,
//!     ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
//!         match op {
//!             CoordinatorOp::DeleteTopic => Box::pin(async {
//!                 Err(CoordinatorError::Unavailable("topic deletion is disabled".into()))
//!             }),
//!             CoordinatorOp::CommitFile => {
//!                 self.commits.fetch_add(1, Ordering::Relaxed);
//!                 call
//!             }
//!             _ => call,
//!         }
//!     }
//! }
//!
//! # async fn demo(inner: Arc<dyn BatchCoordinator>) {
//! let guarded: Arc<dyn BatchCoordinator> = Arc::new(Layered::new(inner, Guard::default()));
//! # }
//! ```

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::{
    BatchCoordinator, CommitBatchResult, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    DeleteRecordsRequest, DeleteRecordsResponse, FindBatchesRequest, FindBatchesResponse,
    ListOffsetsRequest, ListOffsetsResponse, ObjectInfo, ObjectToDelete, ProducerExpiryReport,
    ProducerIdBlock, ProducerState, RegisterSegmentOutcome, RegisterSegmentRequest,
    RetentionReport, SegmentPlan, SegmentPlanRequest, TieredSegment, TieringCandidate, TopicConfig,
    TopicIdPartition, TopicInfo, TxnMarker, TxnMarkerResult,
};

/// One operation of [`BatchCoordinator`], as a [`CoordinatorLayer`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CoordinatorOp {
    /// [`BatchCoordinator::create_topic`].
    CreateTopic,
    /// [`BatchCoordinator::delete_topic`].
    DeleteTopic,
    /// [`BatchCoordinator::list_topics`].
    ListTopics,
    /// [`BatchCoordinator::commit_file`].
    CommitFile,
    /// [`BatchCoordinator::find_batches`].
    FindBatches,
    /// [`BatchCoordinator::list_offsets`].
    ListOffsets,
    /// [`BatchCoordinator::delete_records`].
    DeleteRecords,
    /// [`BatchCoordinator::enforce_retention`].
    EnforceRetention,
    /// [`BatchCoordinator::objects_to_delete`].
    ObjectsToDelete,
    /// [`BatchCoordinator::confirm_deleted`].
    ConfirmDeleted,
    /// [`BatchCoordinator::fence_orphans`].
    FenceOrphans,
    /// [`BatchCoordinator::expire_producers`].
    ExpireProducers,
    /// [`BatchCoordinator::known_objects`].
    KnownObjects,
    /// [`BatchCoordinator::object_info`].
    ObjectInfo,
    /// [`BatchCoordinator::producer_state`].
    ProducerState,
    /// [`BatchCoordinator::allocate_producer_ids`].
    AllocateProducerIds,
    /// [`BatchCoordinator::create_partitions`].
    CreatePartitions,
    /// [`BatchCoordinator::alter_topic_config`].
    AlterTopicConfig,
    /// [`BatchCoordinator::list_producers`].
    ListProducers,
    /// [`BatchCoordinator::write_txn_markers`].
    WriteTxnMarkers,
    /// [`BatchCoordinator::tiering_candidates`].
    TieringCandidates,
    /// [`BatchCoordinator::segment_plan`].
    SegmentPlan,
    /// [`BatchCoordinator::register_segment`].
    RegisterSegment,
    /// [`BatchCoordinator::list_tiered_segments`].
    ListTieredSegments,
}

impl CoordinatorOp {
    /// Every operation, in the trait's order.
    pub const ALL: [CoordinatorOp; 24] = [
        CoordinatorOp::CreateTopic,
        CoordinatorOp::DeleteTopic,
        CoordinatorOp::ListTopics,
        CoordinatorOp::CommitFile,
        CoordinatorOp::FindBatches,
        CoordinatorOp::ListOffsets,
        CoordinatorOp::DeleteRecords,
        CoordinatorOp::EnforceRetention,
        CoordinatorOp::ObjectsToDelete,
        CoordinatorOp::ConfirmDeleted,
        CoordinatorOp::FenceOrphans,
        CoordinatorOp::ExpireProducers,
        CoordinatorOp::KnownObjects,
        CoordinatorOp::ObjectInfo,
        CoordinatorOp::ProducerState,
        CoordinatorOp::AllocateProducerIds,
        CoordinatorOp::CreatePartitions,
        CoordinatorOp::AlterTopicConfig,
        CoordinatorOp::ListProducers,
        CoordinatorOp::WriteTxnMarkers,
        CoordinatorOp::TieringCandidates,
        CoordinatorOp::SegmentPlan,
        CoordinatorOp::RegisterSegment,
        CoordinatorOp::ListTieredSegments,
    ];

    /// The method's name (`"commit_file"`), as used in metric labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            CoordinatorOp::CreateTopic => "create_topic",
            CoordinatorOp::DeleteTopic => "delete_topic",
            CoordinatorOp::ListTopics => "list_topics",
            CoordinatorOp::CommitFile => "commit_file",
            CoordinatorOp::FindBatches => "find_batches",
            CoordinatorOp::ListOffsets => "list_offsets",
            CoordinatorOp::DeleteRecords => "delete_records",
            CoordinatorOp::EnforceRetention => "enforce_retention",
            CoordinatorOp::ObjectsToDelete => "objects_to_delete",
            CoordinatorOp::ConfirmDeleted => "confirm_deleted",
            CoordinatorOp::FenceOrphans => "fence_orphans",
            CoordinatorOp::ExpireProducers => "expire_producers",
            CoordinatorOp::KnownObjects => "known_objects",
            CoordinatorOp::ObjectInfo => "object_info",
            CoordinatorOp::ProducerState => "producer_state",
            CoordinatorOp::AllocateProducerIds => "allocate_producer_ids",
            CoordinatorOp::CreatePartitions => "create_partitions",
            CoordinatorOp::AlterTopicConfig => "alter_topic_config",
            CoordinatorOp::ListProducers => "list_producers",
            CoordinatorOp::WriteTxnMarkers => "write_txn_markers",
            CoordinatorOp::TieringCandidates => "tiering_candidates",
            CoordinatorOp::SegmentPlan => "segment_plan",
            CoordinatorOp::RegisterSegment => "register_segment",
            CoordinatorOp::ListTieredSegments => "list_tiered_segments",
        }
    }

    /// Whether the operation changes the coordinator's state (a retry of it after an unknown
    /// outcome may find it applied).
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            CoordinatorOp::ListTopics
                | CoordinatorOp::FindBatches
                | CoordinatorOp::ListOffsets
                | CoordinatorOp::ObjectsToDelete
                | CoordinatorOp::KnownObjects
                | CoordinatorOp::ObjectInfo
                | CoordinatorOp::ProducerState
                | CoordinatorOp::ListProducers
                | CoordinatorOp::TieringCandidates
                | CoordinatorOp::SegmentPlan
                | CoordinatorOp::ListTieredSegments
        )
    }
}

impl std::fmt::Display for CoordinatorOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a wrapper of a [`BatchCoordinator`] changes; [`Layered`] applies it. Every method has a
/// default that passes the call through, so a layer implements only what it changes.
///
/// For each call, [`Layered`] runs `around(op, typed)`, where `typed` is the layer's method of the
/// same name (called with the inner coordinator). So `around` sees every call — after the typed
/// method has shaped it — and may run it, skip it, or wrap it.
#[async_trait]
pub trait CoordinatorLayer: Send + Sync + Debug {
    /// Runs around every call: return `call` to pass through, or a future that does something
    /// before or after awaiting it (time it, delay it, fail it without running it, run it and
    /// answer [`CoordinatorError::OutcomeUnknown`]).
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        let _ = op;
        call
    }

    /// [`BatchCoordinator::create_topic`] on `inner`.
    async fn create_topic(
        &self,
        inner: &dyn BatchCoordinator,
        request: CreateTopicRequest,
    ) -> Result<(), CoordinatorError> {
        inner.create_topic(request).await
    }

    /// [`BatchCoordinator::delete_topic`] on `inner`.
    async fn delete_topic(
        &self,
        inner: &dyn BatchCoordinator,
        topic_id: uuid::Uuid,
    ) -> Result<(), CoordinatorError> {
        inner.delete_topic(topic_id).await
    }

    /// [`BatchCoordinator::list_topics`] on `inner`.
    async fn list_topics(
        &self,
        inner: &dyn BatchCoordinator,
    ) -> Result<Vec<TopicInfo>, CoordinatorError> {
        inner.list_topics().await
    }

    /// [`BatchCoordinator::commit_file`] on `inner`.
    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        inner.commit_file(request).await
    }

    /// [`BatchCoordinator::find_batches`] on `inner`.
    async fn find_batches(
        &self,
        inner: &dyn BatchCoordinator,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        inner.find_batches(requests, fetch_max_bytes).await
    }

    /// [`BatchCoordinator::list_offsets`] on `inner`.
    async fn list_offsets(
        &self,
        inner: &dyn BatchCoordinator,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        inner.list_offsets(requests).await
    }

    /// [`BatchCoordinator::delete_records`] on `inner`.
    async fn delete_records(
        &self,
        inner: &dyn BatchCoordinator,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        inner.delete_records(requests).await
    }

    /// [`BatchCoordinator::enforce_retention`] on `inner`.
    async fn enforce_retention(
        &self,
        inner: &dyn BatchCoordinator,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        inner.enforce_retention(max_batches).await
    }

    /// [`BatchCoordinator::objects_to_delete`] on `inner`.
    async fn objects_to_delete(
        &self,
        inner: &dyn BatchCoordinator,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        inner.objects_to_delete(marked_before_ms, limit).await
    }

    /// [`BatchCoordinator::confirm_deleted`] on `inner`.
    async fn confirm_deleted(
        &self,
        inner: &dyn BatchCoordinator,
        object_keys: &[String],
    ) -> Result<(), CoordinatorError> {
        inner.confirm_deleted(object_keys).await
    }

    /// [`BatchCoordinator::fence_orphans`] on `inner`.
    async fn fence_orphans(
        &self,
        inner: &dyn BatchCoordinator,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        inner.fence_orphans(object_keys).await
    }

    /// [`BatchCoordinator::expire_producers`] on `inner`.
    async fn expire_producers(
        &self,
        inner: &dyn BatchCoordinator,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        inner.expire_producers(max_producers).await
    }

    /// [`BatchCoordinator::known_objects`] on `inner`.
    async fn known_objects(
        &self,
        inner: &dyn BatchCoordinator,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        inner.known_objects(object_keys).await
    }

    /// [`BatchCoordinator::object_info`] on `inner`.
    async fn object_info(
        &self,
        inner: &dyn BatchCoordinator,
        object_key: &str,
    ) -> Result<Option<ObjectInfo>, CoordinatorError> {
        inner.object_info(object_key).await
    }

    /// [`BatchCoordinator::producer_state`] on `inner`.
    async fn producer_state(
        &self,
        inner: &dyn BatchCoordinator,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        inner.producer_state(partition, producer_id).await
    }

    /// [`BatchCoordinator::allocate_producer_ids`] on `inner`.
    async fn allocate_producer_ids(
        &self,
        inner: &dyn BatchCoordinator,
        count: u32,
    ) -> Result<ProducerIdBlock, CoordinatorError> {
        inner.allocate_producer_ids(count).await
    }

    /// [`BatchCoordinator::create_partitions`] on `inner`.
    async fn create_partitions(
        &self,
        inner: &dyn BatchCoordinator,
        topic_id: uuid::Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        inner.create_partitions(topic_id, new_total).await
    }

    /// [`BatchCoordinator::alter_topic_config`] on `inner`.
    async fn alter_topic_config(
        &self,
        inner: &dyn BatchCoordinator,
        topic_id: uuid::Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        inner.alter_topic_config(topic_id, config).await
    }

    /// [`BatchCoordinator::list_producers`] on `inner`.
    async fn list_producers(
        &self,
        inner: &dyn BatchCoordinator,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        inner.list_producers(partition).await
    }

    /// [`BatchCoordinator::write_txn_markers`] on `inner`.
    async fn write_txn_markers(
        &self,
        inner: &dyn BatchCoordinator,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        inner.write_txn_markers(markers).await
    }

    /// [`BatchCoordinator::tiering_candidates`] on `inner`.
    async fn tiering_candidates(
        &self,
        inner: &dyn BatchCoordinator,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        inner
            .tiering_candidates(now_ms, min_age_ms, after, limit)
            .await
    }

    /// [`BatchCoordinator::segment_plan`] on `inner`.
    async fn segment_plan(
        &self,
        inner: &dyn BatchCoordinator,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        inner.segment_plan(request).await
    }

    /// [`BatchCoordinator::register_segment`] on `inner`.
    async fn register_segment(
        &self,
        inner: &dyn BatchCoordinator,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        inner.register_segment(request).await
    }

    /// [`BatchCoordinator::list_tiered_segments`] on `inner`.
    async fn list_tiered_segments(
        &self,
        inner: &dyn BatchCoordinator,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        inner
            .list_tiered_segments(partition, from_offset, limit)
            .await
    }
}

/// A [`BatchCoordinator`] made of an inner coordinator and a [`CoordinatorLayer`].
#[derive(Debug)]
pub struct Layered<L> {
    inner: Arc<dyn BatchCoordinator>,
    layer: L,
}

impl<L: CoordinatorLayer> Layered<L> {
    /// `inner` with `layer` around it.
    pub fn new(inner: Arc<dyn BatchCoordinator>, layer: L) -> Self {
        Layered { inner, layer }
    }

    /// The wrapped coordinator.
    pub fn inner(&self) -> &Arc<dyn BatchCoordinator> {
        &self.inner
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

/// A `Layered` derefs to its layer, so a layer's own controls (a fault switch, a counter) are
/// called on the wrapper directly: `faulty.fail_next_commits(1)`.
impl<L> std::ops::Deref for Layered<L> {
    type Target = L;

    fn deref(&self) -> &L {
        &self.layer
    }
}

#[async_trait]
impl<L: CoordinatorLayer> BatchCoordinator for Layered<L> {
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        let call = self.layer.create_topic(&*self.inner, request);
        self.layer.around(CoordinatorOp::CreateTopic, call).await
    }

    async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
        let call = self.layer.delete_topic(&*self.inner, topic_id);
        self.layer.around(CoordinatorOp::DeleteTopic, call).await
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        let call = self.layer.list_topics(&*self.inner);
        self.layer.around(CoordinatorOp::ListTopics, call).await
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        let call = self.layer.commit_file(&*self.inner, request);
        self.layer.around(CoordinatorOp::CommitFile, call).await
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        let call = self
            .layer
            .find_batches(&*self.inner, requests, fetch_max_bytes);
        self.layer.around(CoordinatorOp::FindBatches, call).await
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        let call = self.layer.list_offsets(&*self.inner, requests);
        self.layer.around(CoordinatorOp::ListOffsets, call).await
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        let call = self.layer.delete_records(&*self.inner, requests);
        self.layer.around(CoordinatorOp::DeleteRecords, call).await
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let call = self.layer.enforce_retention(&*self.inner, max_batches);
        self.layer
            .around(CoordinatorOp::EnforceRetention, call)
            .await
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        let call = self
            .layer
            .objects_to_delete(&*self.inner, marked_before_ms, limit);
        self.layer
            .around(CoordinatorOp::ObjectsToDelete, call)
            .await
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        let call = self.layer.confirm_deleted(&*self.inner, object_keys);
        self.layer.around(CoordinatorOp::ConfirmDeleted, call).await
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let call = self.layer.fence_orphans(&*self.inner, object_keys);
        self.layer.around(CoordinatorOp::FenceOrphans, call).await
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        let call = self.layer.expire_producers(&*self.inner, max_producers);
        self.layer
            .around(CoordinatorOp::ExpireProducers, call)
            .await
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let call = self.layer.known_objects(&*self.inner, object_keys);
        self.layer.around(CoordinatorOp::KnownObjects, call).await
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        let call = self.layer.object_info(&*self.inner, object_key);
        self.layer.around(CoordinatorOp::ObjectInfo, call).await
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        let call = self
            .layer
            .producer_state(&*self.inner, partition, producer_id);
        self.layer.around(CoordinatorOp::ProducerState, call).await
    }

    async fn allocate_producer_ids(&self, count: u32) -> Result<ProducerIdBlock, CoordinatorError> {
        let call = self.layer.allocate_producer_ids(&*self.inner, count);
        self.layer
            .around(CoordinatorOp::AllocateProducerIds, call)
            .await
    }

    async fn create_partitions(
        &self,
        topic_id: uuid::Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        let call = self
            .layer
            .create_partitions(&*self.inner, topic_id, new_total);
        self.layer
            .around(CoordinatorOp::CreatePartitions, call)
            .await
    }

    async fn alter_topic_config(
        &self,
        topic_id: uuid::Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        let call = self
            .layer
            .alter_topic_config(&*self.inner, topic_id, config);
        self.layer
            .around(CoordinatorOp::AlterTopicConfig, call)
            .await
    }

    async fn list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        let call = self.layer.list_producers(&*self.inner, partition);
        self.layer.around(CoordinatorOp::ListProducers, call).await
    }

    async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        let call = self.layer.write_txn_markers(&*self.inner, markers);
        self.layer
            .around(CoordinatorOp::WriteTxnMarkers, call)
            .await
    }

    async fn tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        let call = self
            .layer
            .tiering_candidates(&*self.inner, now_ms, min_age_ms, after, limit);
        self.layer
            .around(CoordinatorOp::TieringCandidates, call)
            .await
    }

    async fn segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        let call = self.layer.segment_plan(&*self.inner, request);
        self.layer.around(CoordinatorOp::SegmentPlan, call).await
    }

    async fn register_segment(
        &self,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        let call = self.layer.register_segment(&*self.inner, request);
        self.layer
            .around(CoordinatorOp::RegisterSegment, call)
            .await
    }

    async fn list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        let call = self
            .layer
            .list_tiered_segments(&*self.inner, partition, from_offset, limit);
        self.layer
            .around(CoordinatorOp::ListTieredSegments, call)
            .await
    }
}

/// The metrics layer: records [`diskless_common::metrics::COORDINATOR_SECONDS`] for every call,
/// labelled with the operation and its outcome. Wrap the coordinator once, where the host wires
/// it, and share the result; see [`MeteredCoordinator`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CoordinatorMetrics;

impl CoordinatorLayer for CoordinatorMetrics {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: CoordinatorOp,
        call: BoxFuture<'a, Result<T, CoordinatorError>>,
    ) -> BoxFuture<'a, Result<T, CoordinatorError>> {
        use diskless_common::metrics as m;
        Box::pin(async move {
            let start = Instant::now();
            let result = call.await;
            let outcome = if result.is_ok() { m::OK } else { m::ERROR };
            metrics::histogram!(m::COORDINATOR_SECONDS, m::OP => op.name(), m::OUTCOME => outcome)
                .record(start.elapsed().as_secs_f64());
            result
        })
    }
}

/// A coordinator that records [`diskless_common::metrics::COORDINATOR_SECONDS`] per call.
///
/// ```
/// # fn wire(coordinator: std::sync::Arc<dyn diskless_coordinator::BatchCoordinator>) {
/// use diskless_coordinator::MeteredCoordinator;
/// let coordinator = std::sync::Arc::new(MeteredCoordinator::new(coordinator, Default::default()));
/// # }
/// ```
pub type MeteredCoordinator = Layered<CoordinatorMetrics>;

macro_rules! forward_through_pointer {
    ($pointer:ident) => {
        #[async_trait]
        impl<T: BatchCoordinator + ?Sized> BatchCoordinator for $pointer<T> {
            async fn create_topic(
                &self,
                request: CreateTopicRequest,
            ) -> Result<(), CoordinatorError> {
                (**self).create_topic(request).await
            }
            async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError> {
                (**self).delete_topic(topic_id).await
            }
            async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
                (**self).list_topics().await
            }
            async fn commit_file(
                &self,
                request: CommitFileRequest,
            ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
                (**self).commit_file(request).await
            }
            async fn find_batches(
                &self,
                requests: &[FindBatchesRequest],
                fetch_max_bytes: u32,
            ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
                (**self).find_batches(requests, fetch_max_bytes).await
            }
            async fn list_offsets(
                &self,
                requests: &[ListOffsetsRequest],
            ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
                (**self).list_offsets(requests).await
            }
            async fn delete_records(
                &self,
                requests: &[DeleteRecordsRequest],
            ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
                (**self).delete_records(requests).await
            }
            async fn enforce_retention(
                &self,
                max_batches: u32,
            ) -> Result<RetentionReport, CoordinatorError> {
                (**self).enforce_retention(max_batches).await
            }
            async fn objects_to_delete(
                &self,
                marked_before_ms: i64,
                limit: u32,
            ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
                (**self).objects_to_delete(marked_before_ms, limit).await
            }
            async fn confirm_deleted(
                &self,
                object_keys: &[String],
            ) -> Result<(), CoordinatorError> {
                (**self).confirm_deleted(object_keys).await
            }
            async fn fence_orphans(
                &self,
                object_keys: &[String],
            ) -> Result<Vec<String>, CoordinatorError> {
                (**self).fence_orphans(object_keys).await
            }
            async fn expire_producers(
                &self,
                max_producers: u32,
            ) -> Result<ProducerExpiryReport, CoordinatorError> {
                (**self).expire_producers(max_producers).await
            }
            async fn known_objects(
                &self,
                object_keys: &[String],
            ) -> Result<Vec<String>, CoordinatorError> {
                (**self).known_objects(object_keys).await
            }
            async fn object_info(
                &self,
                object_key: &str,
            ) -> Result<Option<ObjectInfo>, CoordinatorError> {
                (**self).object_info(object_key).await
            }
            async fn producer_state(
                &self,
                partition: TopicIdPartition,
                producer_id: i64,
            ) -> Result<Option<ProducerState>, CoordinatorError> {
                (**self).producer_state(partition, producer_id).await
            }
            async fn allocate_producer_ids(
                &self,
                count: u32,
            ) -> Result<ProducerIdBlock, CoordinatorError> {
                (**self).allocate_producer_ids(count).await
            }
            async fn create_partitions(
                &self,
                topic_id: uuid::Uuid,
                new_total: i32,
            ) -> Result<(), CoordinatorError> {
                (**self).create_partitions(topic_id, new_total).await
            }
            async fn alter_topic_config(
                &self,
                topic_id: uuid::Uuid,
                config: TopicConfig,
            ) -> Result<(), CoordinatorError> {
                (**self).alter_topic_config(topic_id, config).await
            }
            async fn list_producers(
                &self,
                partition: TopicIdPartition,
            ) -> Result<Vec<ProducerState>, CoordinatorError> {
                (**self).list_producers(partition).await
            }
            async fn write_txn_markers(
                &self,
                markers: &[TxnMarker],
            ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
                (**self).write_txn_markers(markers).await
            }
            async fn tiering_candidates(
                &self,
                now_ms: i64,
                min_age_ms: i64,
                after: Option<TopicIdPartition>,
                limit: u32,
            ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
                (**self)
                    .tiering_candidates(now_ms, min_age_ms, after, limit)
                    .await
            }
            async fn segment_plan(
                &self,
                request: &SegmentPlanRequest,
            ) -> Result<SegmentPlan, CoordinatorError> {
                (**self).segment_plan(request).await
            }
            async fn register_segment(
                &self,
                request: RegisterSegmentRequest,
            ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
                (**self).register_segment(request).await
            }
            async fn list_tiered_segments(
                &self,
                partition: TopicIdPartition,
                from_offset: i64,
                limit: u32,
            ) -> Result<Vec<TieredSegment>, CoordinatorError> {
                (**self)
                    .list_tiered_segments(partition, from_offset, limit)
                    .await
            }
        }
    };
}

forward_through_pointer!(Arc);
forward_through_pointer!(Box);
