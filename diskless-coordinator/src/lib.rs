//! The batch coordinator of diskless topics (KIP-1164).
//!
//! The coordinator is the source of truth of a diskless topic. Brokers upload WAL segments to object
//! storage on their own, then commit the coordinates of the batches in them here; the coordinator puts
//! the batches of each partition in one global order, assigns their offsets (and LogAppendTime),
//! enforces the idempotent-producer rules, answers offset queries and tracks the life of every object.
//!
//! [`BatchCoordinator`] is the trait; this crate implements it on SQLite ([`sqlite`], the embedded
//! default) and PostgreSQL (feature `postgres`). `diskless-testkit` holds an in-memory reference model
//! and the conformance suite that every implementation runs.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod backend;
mod config;
mod deadline;
mod error;
mod error_code;
mod layer;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
mod rules;
mod types;
mod validate;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub mod sharded;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use deadline::{
    DEFAULT_MAX_COMMIT_AGE, FENCE_EXPIRY_BATCH, FENCE_RETENTION_FACTOR,
    PRODUCER_STATE_FLOOR_FACTOR, check_commit_deadline, fence_expiry_before, max_age_ms,
    object_key_time_ms, producer_expired, producer_state_floor_ms,
};
pub use diskless_common::{BoxError, Clock, ManualClock, SystemClock};
pub use error::CoordinatorError;
pub use error_code::ErrorCode;
pub use layer::{CoordinatorLayer, CoordinatorMetrics, CoordinatorOp, Layered, MeteredCoordinator};
pub use types::{
    AbortedTxn, BatchCoordinate, CommitBatch, CommitBatchResult, CommitFileRequest,
    CreateTopicRequest, DeleteRecordsRequest, DeleteRecordsResponse, EARLIEST_TIMESTAMP,
    EndTxnMarker, FindBatchesRequest, FindBatchesResponse, IsolationLevel, LATEST_TIMESTAMP,
    ListOffsetsRequest, ListOffsetsResponse, MAX_PRODUCER_ID_BLOCK, MAX_TIMESTAMP,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, ObjectInfo, ObjectKind,
    ObjectToDelete, PRODUCER_BATCH_WINDOW, ProducerBatch, ProducerExpiryReport, ProducerIdBlock,
    ProducerState, RegisterSegmentOutcome, RegisterSegmentRequest, RetentionReport,
    SEGMENT_TRAILER_LEN, SegmentLayoutSizes, SegmentPlan, SegmentPlanRequest, ShardId,
    TXN_MARKER_SIZE, TieredSegment, TieringCandidate, TimestampType, TopicConfig, TopicIdPartition,
    TopicInfo, TxnMarker, TxnMarkerResult,
};
pub use validate::{
    check_new_partition_count, last_sequence, next_producer_id_block, producer_field_error,
    validate_producer_id_count,
};

use async_trait::async_trait;

/// The batch coordinator (KIP-1164): orders batches, assigns offsets, tracks objects.
///
/// All methods are atomic: a call either takes effect as a whole or not at all (or, for
/// [`CoordinatorError::OutcomeUnknown`], the caller cannot tell which). Per-partition and per-batch
/// outcomes are [`ErrorCode`]s in the responses, in the order of the request.
#[async_trait]
pub trait BatchCoordinator: Send + Sync + std::fmt::Debug {
    /// Creates a topic with its partitions, each empty (log start offset 0, high watermark 0).
    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError>;

    /// Deletes a topic: its batches are deleted logically (their objects' live bytes drop) and the
    /// topic id and name are free again.
    async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), CoordinatorError>;

    /// The live topics, ordered by name.
    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError>;

    /// Commits one uploaded WAL segment: registers the object and, batch by batch in request order,
    /// appends each batch to its partition or rejects it. Returns one result per batch.
    ///
    /// Inside the commit's transaction, after its locks are held, the coordinator refuses the whole
    /// commit (nothing applied) when the key's UUID v7 time is older than its `max_commit_age`
    /// ([`CoordinatorError::DeadlineExceeded`], see [`check_commit_deadline`]) or when the key was
    /// fenced by [`BatchCoordinator::fence_orphans`] ([`CoordinatorError::ObjectFenced`]).
    /// Producer-controlled fields are judged per batch ([`producer_field_error`], then the
    /// idempotent-producer rules): a bad batch is rejected alone, never the request.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future after the request was sent leaves the outcome unknown
    /// (the commit may still apply, until its deadline). Treat it as
    /// [`CoordinatorError::OutcomeUnknown`]. Where "sent" is, per implementation: for
    /// [`sqlite::SqliteCoordinator`], once its `COMMIT` is handed to SQLite (dropped earlier, the
    /// transaction rolls back); for `postgres::PostgresCoordinator`, once the call of the
    /// server-side commit function reached the server; for [`sharded::ShardedCoordinator`], per
    /// shard, so a dropped commit may be applied by some shards only. Each implementation's
    /// `BatchCoordinator` impl documents it.
    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError>;

    /// Finds the batches to read for a fetch, for many partitions at once. Per partition the
    /// tiered segment or WAL batch containing the offset comes first and is always included (a
    /// segment counting its whole `.log`); more follow — further segments, then WAL batches once
    /// the segments reach the first offset not tiered — while the partition's bytes stay within
    /// its `max_bytes` and the total within `fetch_max_bytes`.
    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError>;

    /// ListOffsets, at batch granularity.
    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError>;

    /// DeleteRecords: moves log start offsets forward.
    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError>;

    /// Applies `retention.ms` and `retention.bytes` of every partition at the coordinator clock's now,
    /// deleting at most `max_batches` batches in this pass; a pass stops walking partitions as soon as
    /// its budget is spent ([`RetentionReport::more`]). A batch without any timestamp (effective max
    /// timestamp `< 0`) is aged by its commit time, as Kafka ages a segment without timestamps by its
    /// modification time. Tiered segments come first, whole: each is one item of the budget,
    /// aged by [`TieredSegment::retention_ts`] and sized by its `.log`.
    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError>;

    /// Objects with no live bytes that were marked for deletion before `marked_before_ms`, oldest
    /// first, at most `limit`.
    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError>;

    /// Forgets objects that were physically deleted. Keys not marked for deletion are left alone. A
    /// forgotten key with a UUID v7 time is fenced in the same step (as by
    /// [`BatchCoordinator::fence_orphans`]), so that a retried commit of it can never append batches
    /// to the deleted object.
    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError>;

    /// The orphan collector's final step, atomic with respect to every `commit_file`: for each key,
    /// in request order, if the coordinator knows the object (committed, not yet confirmed deleted)
    /// it is left alone and not returned; if the key has no UUID v7 time it is neither fenced nor
    /// returned; otherwise a fence is recorded (kept if already there) and the key is returned, once.
    /// Every later `commit_file` of a fenced key is refused with [`CoordinatorError::ObjectFenced`],
    /// so a returned key may be deleted from storage whatever commits are in flight. The call also
    /// drops up to [`FENCE_EXPIRY_BATCH`] fences whose key time is older than
    /// [`fence_expiry_before`] (the deadline refuses those keys anyway). Fences do not make a key
    /// known.
    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError>;

    /// Expires idempotent-producer state (Kafka's `producer.id.expiration.ms`, per topic in
    /// [`TopicConfig::producer_id_expiration_ms`]): at the coordinator clock's now, deletes the state of
    /// every (partition, producer id) whose last appended batch (or transaction marker) was
    /// committed at least that long ago and that has no transaction open, in ascending (topic id,
    /// partition, producer id) order, at most `max_producers` (a `ShardedCoordinator` keeps that
    /// order within each shard, shard by shard). A later batch of an expired producer is treated
    /// as one of a new producer.
    ///
    /// **Never earlier than [`producer_state_floor_ms`]** (twice the coordinator's
    /// `max_commit_age`) after the state's last update, whatever the topic says
    /// ([`producer_expired`]): a commit may land up to `max_commit_age` after its key was made,
    /// and a state forgotten before it lands would let a stalled resend be appended again or a
    /// stale transactional batch open a transaction nothing ends (issue #25).
    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError>;

    /// Which of `object_keys` this coordinator knows (committed and not yet confirmed deleted).
    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError>;

    /// What the coordinator knows of one object, if anything.
    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError>;

    /// The idempotent-producer state of `producer_id` in `partition`, if any.
    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError>;

    /// Hands out a block of `count` producer ids (1 to [`MAX_PRODUCER_ID_BLOCK`], else
    /// [`CoordinatorError::InvalidRequest`]) that no other call ever hands out again: not on this
    /// coordinator, not on another one sharing its store (another process on the same database,
    /// another router over the same shards), not after a restart. Blocks come in ascending
    /// order (this crate's coordinators and the reference model hand them out consecutively from
    /// id 0), as Kafka's controller allocates producer-id blocks to brokers (KIP-730): a broker
    /// serves InitProducerId from its block and asks for the next when it is used up. When the id
    /// space is spent the call fails with [`CoordinatorError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Safe to drop at any point, but a call dropped after its request was sent (or one failing
    /// with [`CoordinatorError::OutcomeUnknown`]) may have taken a block that nobody receives:
    /// those ids are skipped, never handed out twice. Ask again.
    async fn allocate_producer_ids(&self, count: u32) -> Result<ProducerIdBlock, CoordinatorError>;

    /// Kafka's CreatePartitions: grows the topic to `new_total` partitions, the new ones empty
    /// (log start offset 0, high watermark 0) and configured like the others. A topic never
    /// shrinks: `new_total` not above the current count is
    /// [`CoordinatorError::InvalidPartitions`] ([`check_new_partition_count`]); an unknown topic is
    /// [`CoordinatorError::UnknownTopic`].
    async fn create_partitions(
        &self,
        topic_id: uuid::Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError>;

    /// Replaces a live topic's configuration (Kafka's AlterConfigs / IncrementalAlterConfigs of a
    /// topic, which the host merges into a whole [`TopicConfig`]). Checked by
    /// [`TopicConfig::validate`]; an unknown topic is [`CoordinatorError::UnknownTopic`]. Later
    /// calls use the new values: commits (timestamp type; batches already committed keep theirs),
    /// retention passes, producer expiry and [`BatchCoordinator::list_topics`].
    async fn alter_topic_config(
        &self,
        topic_id: uuid::Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError>;

    /// Every idempotent producer's state in `partition`, by producer id (Kafka's
    /// DescribeProducers). An unknown partition is [`CoordinatorError::UnknownTopic`].
    async fn list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError>;

    /// Writes transaction markers (COMMIT/ABORT control batches, KIP-98; the partition leader's
    /// part of Kafka's WriteTxnMarkers), many partitions at once, in one transaction of this
    /// coordinator (a `ShardedCoordinator`: one per shard). Returns one result per marker, in
    /// request order. Per marker, as Kafka's `ProducerAppendInfo.appendEndTxnMarker`:
    /// - an unknown partition is [`ErrorCode::UnknownTopicOrPartition`];
    /// - a marker whose [`TxnMarker::txn_seq`] is not above the producer's last ended transaction
    ///   in the partition is a duplicate: nothing is written, the earlier marker's offset answers;
    /// - an epoch older than the producer's is [`ErrorCode::InvalidProducerEpoch`], then a
    ///   coordinator epoch older than the last marker's is
    ///   [`ErrorCode::TransactionCoordinatorFenced`];
    /// - otherwise the marker takes the next offset of the partition (one offset, 78 bytes, the
    ///   coordinator's now as its timestamps, no object), ends the producer's open transaction
    ///   there if it has one (an ABORT records it among the partition's aborted transactions), and
    ///   moves the last stable offset. A partition where the producer wrote nothing still gets
    ///   the marker, as in Kafka.
    ///
    /// # Cancel safety
    ///
    /// As [`BatchCoordinator::commit_file`]: a dropped call may still apply. Retry: markers with a
    /// `txn_seq` are idempotent.
    async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError>;

    /// The partitions due for consolidation into tiered segments (KIP-1163), in ascending
    /// (topic id, partition) order after `after` (exclusive; `None`: from the first), at most
    /// `limit`. A partition is listed when its first WAL batch is below the last stable offset
    /// and was committed before `now_ms − min_age_ms`, and either its WAL batches hold at least
    /// `segment.bytes` or that first batch was committed at least `segment.ms` before `now_ms`
    /// (coordinator clock). A coordinator that does not implement tiered storage refuses with
    /// [`CoordinatorError::InvalidRequest`] (as every tiering method).
    async fn tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError>;

    /// The batches of a partition's next tiered segment (see [`SegmentPlan::batches`]), with what
    /// the segment builder needs besides them. Reads only.
    async fn segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError>;

    /// Registers an uploaded tiered segment and, in the same transaction, deletes the WAL batches
    /// it covers (their objects' live bytes drop, marking those with none left), the aborted
    /// transactions whose marker it covers, and moves the partition's first offset not tiered
    /// past it. The partition's size and bounds do not change: the same bytes moved tier.
    ///
    /// In order, with the state locked: a request that contradicts itself (empty key, `base >
    /// end`, no batch, `layout.log ≠ batch_bytes`, an object smaller than its sections) is
    /// [`CoordinatorError::InvalidRequest`]; the key's commit deadline and fence are checked as
    /// for [`BatchCoordinator::commit_file`] ([`CoordinatorError::DeadlineExceeded`],
    /// [`CoordinatorError::ObjectFenced`]); a key already registered as this very segment is
    /// [`RegisterSegmentOutcome::AlreadyRegistered`], any other known key
    /// [`CoordinatorError::ObjectAlreadyCommitted`]; then
    /// [`RegisterSegmentOutcome::UnknownPartition`]; then the range must be exactly the
    /// partition's first WAL batches — the first batch starts at `base_offset`, a batch ends at
    /// `end_offset`, `batch_count` batches of `batch_bytes` bytes lie in between, and
    /// `end_offset` is below the last stable offset — else [`RegisterSegmentOutcome::Stale`].
    /// Nothing is applied unless the answer is `Registered`.
    ///
    /// # Cancel safety
    ///
    /// As [`BatchCoordinator::commit_file`]: a dropped call may still apply. Retry it (idempotent
    /// on the key) or fence the key.
    async fn register_segment(
        &self,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError>;

    /// The registered tiered segments of `partition` whose end offset is at least `from_offset`,
    /// in offset order, at most `limit`. An unknown partition is
    /// [`CoordinatorError::UnknownTopic`].
    async fn list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError>;
}
