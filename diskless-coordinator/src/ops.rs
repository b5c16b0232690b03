//! The operations of [`crate::BatchCoordinator`], declared once.
//!
//! [`coordinator_ops!`] holds the one table of the coordinator's operations: for each, its
//! capability ([`crate::Capability`]), its [`crate::CoordinatorOp`] name, whether it reads or
//! writes, the SQL backends' inherent method that serves it, its documentation and its signature.
//! Everything that lists the operations is generated from it, by a callback macro given the
//! table: the trait itself (`lib.rs`: the `log` capability's methods required, the others
//! defaulting to [`crate::CoordinatorError::Unsupported`]), `CoordinatorOp` with `ALL`, `name`,
//! `is_write` and `capability`, the [`crate::CoordinatorLayer`] defaults and [`crate::Layered`]
//! (`layer.rs`), the forwarding through `Arc` and `Box` (`layer.rs`), and the SQL backends'
//! dispatch (`backend.rs`). Adding an operation is one entry here, the implementations'
//! methods, and its conformance cases.
//!
//! The table's shape, which every callback matches:
//!
//! ```text
//! { <extra tokens of the caller> }
//! required log { (entry)* }  optional <capability> { (entry)* } ...
//! entry: /// docs
//!        [<CoordinatorOp variant> <read|write> <SQL backend method>]
//!        fn <name>(<arg>: <type>, ...) -> <return type>;
//! ```

/// Calls back `$callback! { { <extra> } <the table> }` (see the module docs); `extra` is
/// passed through for the callback (a type to implement the trait for, say).
macro_rules! coordinator_ops {
    ($($callback:ident)::+ { $($extra:tt)* }) => {
        $($callback)::+! {
            { $($extra)* }
            required log {
                /// Creates a topic with its partitions, each empty (log start offset 0, high watermark 0).
                [CreateTopic write write_create_topic]
                fn create_topic(request: $crate::CreateTopicRequest) -> Result<(), $crate::CoordinatorError>;
                /// Deletes a topic: its batches are deleted logically (their objects' live bytes drop) and the
                /// topic id and name are free again.
                [DeleteTopic write write_delete_topic]
                fn delete_topic(topic_id: ::uuid::Uuid) -> Result<(), $crate::CoordinatorError>;
                /// The live topics, ordered by name.
                [ListTopics read read_list_topics]
                fn list_topics() -> Result<Vec<$crate::TopicInfo>, $crate::CoordinatorError>;
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
                [CommitFile write write_commit_file]
                fn commit_file(request: $crate::CommitFileRequest) -> Result<Vec<$crate::CommitBatchResult>, $crate::CoordinatorError>;
                /// Finds the batches to read for a fetch, for many partitions at once. Per partition the
                /// tiered segment or WAL batch containing the offset comes first and is always included (a
                /// segment counting its whole `.log`); more follow — further segments, then WAL batches once
                /// the segments reach the first offset not tiered — while the partition's bytes stay within
                /// its `max_bytes` and the total within `fetch_max_bytes`.
                [FindBatches read read_find_batches]
                fn find_batches(requests: &[$crate::FindBatchesRequest], fetch_max_bytes: u32) -> Result<Vec<$crate::FindBatchesResponse>, $crate::CoordinatorError>;
                /// ListOffsets, at batch granularity.
                [ListOffsets read read_list_offsets]
                fn list_offsets(requests: &[$crate::ListOffsetsRequest]) -> Result<Vec<$crate::ListOffsetsResponse>, $crate::CoordinatorError>;
                /// The idempotent-producer state of `producer_id` in `partition`, if any.
                [ProducerState read read_producer_state]
                fn producer_state(partition: $crate::TopicIdPartition, producer_id: i64) -> Result<Option<$crate::ProducerState>, $crate::CoordinatorError>;
            }
            optional admin {
                /// DeleteRecords: moves log start offsets forward.
                [DeleteRecords write write_delete_records]
                fn delete_records(requests: &[$crate::DeleteRecordsRequest]) -> Result<Vec<$crate::DeleteRecordsResponse>, $crate::CoordinatorError>;
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
                [AllocateProducerIds write write_allocate_producer_ids]
                fn allocate_producer_ids(count: u32) -> Result<$crate::ProducerIdBlock, $crate::CoordinatorError>;
                /// Kafka's CreatePartitions: grows the topic to `new_total` partitions, the new ones empty
                /// (log start offset 0, high watermark 0) and configured like the others. A topic never
                /// shrinks: `new_total` not above the current count is
                /// [`CoordinatorError::InvalidPartitions`] ([`check_new_partition_count`]); an unknown topic is
                /// [`CoordinatorError::UnknownTopic`].
                [CreatePartitions write write_create_partitions]
                fn create_partitions(topic_id: ::uuid::Uuid, new_total: i32) -> Result<(), $crate::CoordinatorError>;
                /// Replaces a live topic's configuration (Kafka's AlterConfigs / IncrementalAlterConfigs of a
                /// topic, which the host merges into a whole [`TopicConfig`]). Checked by
                /// [`TopicConfig::validate`]; an unknown topic is [`CoordinatorError::UnknownTopic`]. Later
                /// calls use the new values: commits (timestamp type; batches already committed keep theirs),
                /// retention passes, producer expiry and [`BatchCoordinator::list_topics`].
                [AlterTopicConfig write write_alter_topic_config]
                fn alter_topic_config(topic_id: ::uuid::Uuid, config: $crate::TopicConfig) -> Result<(), $crate::CoordinatorError>;
                /// Every idempotent producer's state in `partition`, by producer id (Kafka's
                /// DescribeProducers). An unknown partition is [`CoordinatorError::UnknownTopic`].
                [ListProducers read read_list_producers]
                fn list_producers(partition: $crate::TopicIdPartition) -> Result<Vec<$crate::ProducerState>, $crate::CoordinatorError>;
            }
            optional lifecycle {
                /// Applies `retention.ms` and `retention.bytes` of every partition at the coordinator clock's now,
                /// deleting at most `max_batches` batches in this pass; a pass stops walking partitions as soon as
                /// its budget is spent ([`RetentionReport::more`]). A batch without any timestamp (effective max
                /// timestamp `< 0`) is aged by its commit time, as Kafka ages a segment without timestamps by its
                /// modification time. Tiered segments come first, whole: each is one item of the budget,
                /// aged by [`TieredSegment::retention_ts`] and sized by its `.log`.
                [EnforceRetention write write_enforce_retention]
                fn enforce_retention(max_batches: u32) -> Result<$crate::RetentionReport, $crate::CoordinatorError>;
                /// Objects with no live bytes that were marked for deletion before `marked_before_ms`, oldest
                /// first, at most `limit`.
                [ObjectsToDelete read read_objects_to_delete]
                fn objects_to_delete(marked_before_ms: i64, limit: u32) -> Result<Vec<$crate::ObjectToDelete>, $crate::CoordinatorError>;
                /// Forgets objects that were physically deleted. Keys not marked for deletion are left alone. A
                /// forgotten key with a UUID v7 time is fenced in the same step (as by
                /// [`BatchCoordinator::fence_orphans`]), so that a retried commit of it can never append batches
                /// to the deleted object.
                [ConfirmDeleted write write_confirm_deleted]
                fn confirm_deleted(object_keys: &[String]) -> Result<(), $crate::CoordinatorError>;
                /// The orphan collector's final step, atomic with respect to every `commit_file`: for each key,
                /// in request order, if the coordinator knows the object (committed, not yet confirmed deleted)
                /// it is left alone and not returned; if the key has no UUID v7 time it is neither fenced nor
                /// returned; otherwise a fence is recorded (kept if already there) and the key is returned, once.
                /// Every later `commit_file` of a fenced key is refused with [`CoordinatorError::ObjectFenced`],
                /// so a returned key may be deleted from storage whatever commits are in flight. The call also
                /// drops up to [`FENCE_EXPIRY_BATCH`] fences whose key time is older than
                /// [`fence_expiry_before`] (the deadline refuses those keys anyway). Fences do not make a key
                /// known.
                [FenceOrphans write write_fence_orphans]
                fn fence_orphans(object_keys: &[String]) -> Result<Vec<String>, $crate::CoordinatorError>;
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
                [ExpireProducers write write_expire_producers]
                fn expire_producers(max_producers: u32) -> Result<$crate::ProducerExpiryReport, $crate::CoordinatorError>;
                /// Which of `object_keys` this coordinator knows (committed and not yet confirmed deleted).
                [KnownObjects read read_known_objects]
                fn known_objects(object_keys: &[String]) -> Result<Vec<String>, $crate::CoordinatorError>;
                /// What the coordinator knows of one object, if anything.
                [ObjectInfo read read_object_info]
                fn object_info(object_key: &str) -> Result<Option<$crate::ObjectInfo>, $crate::CoordinatorError>;
            }
            optional transactions {
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
                [WriteTxnMarkers write write_txn_markers]
                fn write_txn_markers(markers: &[$crate::TxnMarker]) -> Result<Vec<$crate::TxnMarkerResult>, $crate::CoordinatorError>;
                /// Applies one change to a transactional id's transaction record, the shared transaction
                /// state of a host whose brokers do not share their own ([`crate::txn_record`]): decided by
                /// [`apply_txn_transition`] on the record read and locked in the same transaction of this
                /// coordinator, so no two changes of one transactional id interleave. A refused transition
                /// changes nothing and answers Kafka's error with the record as it stands. A
                /// `ShardedCoordinator` keeps every record on its first shard.
                ///
                /// # Cancel safety
                ///
                /// As [`BatchCoordinator::commit_file`]: a dropped call may still apply. Every transition
                /// is safe to ask again: a repeat of an applied one answers `NONE` unchanged, or (an
                /// `AddPartitions` that opened a transaction) joins the transaction it opened.
                [TxnTransition write write_txn_transition]
                fn txn_transition(transition: $crate::TxnTransition) -> Result<$crate::TxnAnswer, $crate::CoordinatorError>;
                /// Decides the timeouts of the `Ongoing` transactions at the coordinator clock's now
                /// ([`expire_txn`]: `PrepareAbort`, the producer's epoch fenced), then lists the prepared
                /// transactions (decided, their markers perhaps not all written), ordered by transactional
                /// id, at most `limit` (expiring at most `limit` too): what a host's brokers finish, any of
                /// them, by writing [`TxnRecord::markers`] and then [`TxnTransition::Complete`].
                [TxnEndings write write_txn_endings]
                fn txn_endings(limit: u32) -> Result<Vec<$crate::TxnRecord>, $crate::CoordinatorError>;
                /// The transaction record of `transactional_id`, if there is one (reading what every
                /// transition before the call applied).
                [DescribeTxn read read_describe_txn]
                fn describe_txn(transactional_id: &str) -> Result<Option<$crate::TxnRecord>, $crate::CoordinatorError>;
            }
            optional tiering {
                /// The partitions due for consolidation into tiered segments (KIP-1163), in ascending
                /// (topic id, partition) order after `after` (exclusive; `None`: from the first), at most
                /// `limit`. A partition is listed when its first WAL batch is below the last stable offset
                /// and was committed before `now_ms − min_age_ms`, and either its WAL batches hold at least
                /// `segment.bytes` or that first batch was committed at least `segment.ms` before `now_ms`
                /// (for a compacted topic `min(segment.ms, max.compaction.lag.ms)`:
                /// [`TopicConfig::max_segment_ms`])
                /// (coordinator clock). A coordinator that does not serve the `tiering` capability answers
                /// [`CoordinatorError::Unsupported`] (as for every tiering method).
                [TieringCandidates read read_tiering_candidates]
                fn tiering_candidates(now_ms: i64, min_age_ms: i64, after: Option<$crate::TopicIdPartition>, limit: u32) -> Result<Vec<$crate::TieringCandidate>, $crate::CoordinatorError>;
                /// The batches of a partition's next tiered segment (see [`SegmentPlan::batches`]), with what
                /// the segment builder needs besides them. Reads only.
                [SegmentPlan read read_segment_plan]
                fn segment_plan(request: &$crate::SegmentPlanRequest) -> Result<$crate::SegmentPlan, $crate::CoordinatorError>;
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
                [RegisterSegment write write_register_segment]
                fn register_segment(request: $crate::RegisterSegmentRequest) -> Result<$crate::RegisterSegmentOutcome, $crate::CoordinatorError>;
                /// Compaction's swap (issue #29): in one transaction, the run of segments
                /// `request.replaced` names is replaced by `request.segment` (or by nothing): their rows go,
                /// their objects are released (marked for deletion, the cleaner deletes them after the
                /// grace period), and the new segment is registered as compacted
                /// ([`TieredSegment::compacted`]). The partition's bounds and `tiered_next_offset` stay;
                /// its size changes by what compaction removed.
                ///
                /// In order, with the state locked: a request that contradicts itself
                /// ([`ReplaceSegmentsRequest::validate`]) is [`CoordinatorError::InvalidRequest`]; the new
                /// key's commit deadline and fence are checked as for [`BatchCoordinator::register_segment`]
                /// ([`CoordinatorError::DeadlineExceeded`], [`CoordinatorError::ObjectFenced`]); a new key
                /// already registered as this very segment is [`RegisterSegmentOutcome::AlreadyRegistered`],
                /// any other known key [`CoordinatorError::ObjectAlreadyCommitted`]; then
                /// [`RegisterSegmentOutcome::UnknownPartition`]; then the replaced segments must be exactly
                /// the partition's registered segments from the first one's base offset on (same keys and
                /// offsets, none between them), else [`RegisterSegmentOutcome::Stale`]. Nothing is applied
                /// unless the answer is `Registered`, whose count is the replaced objects marked.
                ///
                /// # Cancel safety
                ///
                /// As [`BatchCoordinator::register_segment`]: retry it (idempotent on the new key) or fence
                /// the key.
                [ReplaceSegments write write_replace_segments]
                fn replace_segments(request: $crate::ReplaceSegmentsRequest) -> Result<$crate::RegisterSegmentOutcome, $crate::CoordinatorError>;
                /// The registered tiered segments of `partition` whose end offset is at least `from_offset`,
                /// in offset order, at most `limit`. An unknown partition is
                /// [`CoordinatorError::UnknownTopic`].
                [ListTieredSegments read read_list_tiered_segments]
                fn list_tiered_segments(partition: $crate::TopicIdPartition, from_offset: i64, limit: u32) -> Result<Vec<$crate::TieredSegment>, $crate::CoordinatorError>;
            }
        }
    };
}
pub(crate) use coordinator_ops;

#[cfg(test)]
mod tests {
    use crate::*;

    /// The smallest coordinator the trait allows: the log capability alone, seven methods and
    /// `capabilities` (their bodies do not matter here: only the defaults are called).
    #[derive(Debug)]
    struct LogOnly;

    #[async_trait::async_trait]
    impl BatchCoordinator for LogOnly {
        fn capabilities(&self) -> Capabilities {
            Capabilities::LOG
        }
        async fn create_topic(&self, _: CreateTopicRequest) -> Result<(), CoordinatorError> {
            Ok(())
        }
        async fn delete_topic(&self, _: uuid::Uuid) -> Result<(), CoordinatorError> {
            Ok(())
        }
        async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
            Ok(Vec::new())
        }
        async fn commit_file(
            &self,
            _: CommitFileRequest,
        ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
            Ok(Vec::new())
        }
        async fn find_batches(
            &self,
            _: &[FindBatchesRequest],
            _: u32,
        ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
            Ok(Vec::new())
        }
        async fn list_offsets(
            &self,
            _: &[ListOffsetsRequest],
        ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
            Ok(Vec::new())
        }
        async fn producer_state(
            &self,
            _: TopicIdPartition,
            _: i64,
        ) -> Result<Option<ProducerState>, CoordinatorError> {
            Ok(None)
        }
    }

    /// Some value of an argument type, for calling every operation.
    trait Dummy {
        fn dummy() -> Self;
    }
    impl Dummy for u32 {
        fn dummy() -> Self {
            1
        }
    }
    impl Dummy for i32 {
        fn dummy() -> Self {
            1
        }
    }
    impl Dummy for i64 {
        fn dummy() -> Self {
            1
        }
    }
    impl Dummy for TxnTransition {
        fn dummy() -> Self {
            TxnTransition::Init {
                transactional_id: "t".into(),
                producer: None,
                timeout_ms: 1,
            }
        }
    }
    impl Dummy for uuid::Uuid {
        fn dummy() -> Self {
            uuid::Uuid::from_u128(1)
        }
    }
    impl Dummy for TopicIdPartition {
        fn dummy() -> Self {
            TopicIdPartition::new(uuid::Uuid::from_u128(1), 0)
        }
    }
    impl Dummy for TopicConfig {
        fn dummy() -> Self {
            TopicConfig::default()
        }
    }
    impl<T> Dummy for Option<T> {
        fn dummy() -> Self {
            None
        }
    }
    impl<T: 'static> Dummy for &'static [T] {
        fn dummy() -> Self {
            &[]
        }
    }
    impl Dummy for &'static str {
        fn dummy() -> Self {
            "wal/key"
        }
    }
    impl Dummy for &'static SegmentPlanRequest {
        fn dummy() -> Self {
            Box::leak(Box::new(SegmentPlanRequest {
                partition: Dummy::dummy(),
                max_bytes: 1,
                max_batches: 1,
                committed_before_ms: 1,
            }))
        }
    }
    impl Dummy for RegisterSegmentRequest {
        fn dummy() -> Self {
            RegisterSegmentRequest {
                partition: Dummy::dummy(),
                object_key: "tiered/key".into(),
                object_size: 1,
                uploader_broker_id: 0,
                layout: Default::default(),
                base_offset: 0,
                end_offset: 0,
                batch_count: 1,
                batch_bytes: 1,
                max_timestamp: 0,
                max_timestamp_offset: 0,
                owner: 0,
            }
        }
    }

    impl Dummy for ReplaceSegmentsRequest {
        fn dummy() -> Self {
            ReplaceSegmentsRequest {
                partition: Dummy::dummy(),
                replaced: Vec::new(),
                segment: None,
            }
        }
    }

    /// Calls every optional operation on `c` and checks that it answers `Unsupported` naming
    /// itself; returns how many were called.
    macro_rules! call_optional_ops {
        (
            { $c:ident }
            required $rcap:ident { $($required:tt)* }
            $(
                optional $cap:ident {
                    $(
                        $(#[$meta:meta])*
                        [$Op:ident $kind:ident $backend:ident]
                        fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;
                    )*
                }
            )*
        ) => {{
            let mut called = 0;
            $($(
                let answer = $c.$name($(<$ty as Dummy>::dummy()),*).await;
                assert!(
                    matches!(answer, Err(CoordinatorError::Unsupported(CoordinatorOp::$Op))),
                    "{}: {answer:?}",
                    stringify!($name)
                );
                called += 1;
            )*)*
            called
        }};
    }

    /// Every operation outside the log defaults to `Unsupported` (Kafka's `UNSUPPORTED_VERSION`),
    /// certainly not applied, through layers and pointers too; the log is the only required
    /// group, and the table's operations are exactly `CoordinatorOp::ALL`.
    #[tokio::test]
    async fn optional_operations_default_to_unsupported() {
        let c: std::sync::Arc<dyn BatchCoordinator> = std::sync::Arc::new(MeteredCoordinator::new(
            std::sync::Arc::new(LogOnly),
            CoordinatorMetrics,
        ));
        assert_eq!(c.capabilities(), Capabilities::LOG);
        let called = coordinator_ops!(call_optional_ops { c });
        let required = CoordinatorOp::ALL
            .iter()
            .filter(|op| op.capability() == Capability::Log)
            .count();
        assert_eq!((required, called), (7, CoordinatorOp::ALL.len() - 7));
        let e = CoordinatorError::Unsupported(CoordinatorOp::WriteTxnMarkers);
        assert_eq!(e.error_code(), ErrorCode::UnsupportedVersion);
        assert!(e.certainly_not_applied() && !e.is_retriable());
        assert_eq!(
            e.to_string(),
            "the coordinator does not serve write_txn_markers (capability transactions)"
        );
    }

    /// The table's kinds and capabilities, spot-checked against what the operations do.
    #[test]
    fn ops_know_their_kind_and_capability() {
        assert!(CoordinatorOp::CommitFile.is_write() && !CoordinatorOp::FindBatches.is_write());
        assert!(CoordinatorOp::WriteTxnMarkers.is_write());
        assert!(
            !CoordinatorOp::SegmentPlan.is_write() && CoordinatorOp::RegisterSegment.is_write()
        );
        assert_eq!(CoordinatorOp::ProducerState.capability(), Capability::Log);
        assert_eq!(
            CoordinatorOp::ExpireProducers.capability(),
            Capability::Lifecycle
        );
        assert_eq!(
            CoordinatorOp::AllocateProducerIds.capability(),
            Capability::Admin
        );
        assert_eq!(
            CoordinatorOp::ListTieredSegments.capability(),
            Capability::Tiering
        );
        assert_eq!(CoordinatorOp::ALL.len(), 28);
        let mut names: Vec<&str> = CoordinatorOp::ALL.iter().map(|op| op.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 28, "one name per operation");
    }
}
