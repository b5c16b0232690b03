//! What makes a SQL backend a [`crate::BatchCoordinator`]: each trait method `x` is the backend's
//! inherent `write_x` (a write: one transaction, or attempts of one) or `read_x` (a query), in the
//! backend's file for that part (`topics.rs`, `commit.rs`, `reads.rs`, `lifecycle.rs`,
//! `tiering.rs`). The mapping is written once, here, for both.

/// `impl BatchCoordinator for $ty` (with the given docs) by the backend's `write_*`/`read_*`
/// methods.
#[rustfmt::skip]
macro_rules! sql_batch_coordinator {
    ($(#[$attr:meta])* $ty:ty) => {
        $(#[$attr])*
        #[async_trait::async_trait]
        impl $crate::BatchCoordinator for $ty {
            async fn create_topic(&self, request: $crate::CreateTopicRequest) -> Result<(), $crate::CoordinatorError> { self.write_create_topic(request).await }
            async fn delete_topic(&self, topic_id: uuid::Uuid) -> Result<(), $crate::CoordinatorError> { self.write_delete_topic(topic_id).await }
            async fn list_topics(&self) -> Result<Vec<$crate::TopicInfo>, $crate::CoordinatorError> { self.read_list_topics().await }
            async fn commit_file(&self, request: $crate::CommitFileRequest) -> Result<Vec<$crate::CommitBatchResult>, $crate::CoordinatorError> { self.write_commit_file(request).await }
            async fn find_batches(&self, requests: &[$crate::FindBatchesRequest], fetch_max_bytes: u32) -> Result<Vec<$crate::FindBatchesResponse>, $crate::CoordinatorError> { self.read_find_batches(requests, fetch_max_bytes).await }
            async fn list_offsets(&self, requests: &[$crate::ListOffsetsRequest]) -> Result<Vec<$crate::ListOffsetsResponse>, $crate::CoordinatorError> { self.read_list_offsets(requests).await }
            async fn delete_records(&self, requests: &[$crate::DeleteRecordsRequest]) -> Result<Vec<$crate::DeleteRecordsResponse>, $crate::CoordinatorError> { self.write_delete_records(requests).await }
            async fn enforce_retention(&self, max_batches: u32) -> Result<$crate::RetentionReport, $crate::CoordinatorError> { self.write_enforce_retention(max_batches).await }
            async fn objects_to_delete(&self, marked_before_ms: i64, limit: u32) -> Result<Vec<$crate::ObjectToDelete>, $crate::CoordinatorError> { self.read_objects_to_delete(marked_before_ms, limit).await }
            async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), $crate::CoordinatorError> { self.write_confirm_deleted(object_keys).await }
            async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, $crate::CoordinatorError> { self.write_fence_orphans(object_keys).await }
            async fn expire_producers(&self, max_producers: u32) -> Result<$crate::ProducerExpiryReport, $crate::CoordinatorError> { self.write_expire_producers(max_producers).await }
            async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, $crate::CoordinatorError> { self.read_known_objects(object_keys).await }
            async fn object_info(&self, object_key: &str) -> Result<Option<$crate::ObjectInfo>, $crate::CoordinatorError> { self.read_object_info(object_key).await }
            async fn producer_state(&self, partition: $crate::TopicIdPartition, producer_id: i64) -> Result<Option<$crate::ProducerState>, $crate::CoordinatorError> { self.read_producer_state(partition, producer_id).await }
            async fn allocate_producer_ids(&self, count: u32) -> Result<$crate::ProducerIdBlock, $crate::CoordinatorError> { self.write_allocate_producer_ids(count).await }
            async fn create_partitions(&self, topic_id: uuid::Uuid, new_total: i32) -> Result<(), $crate::CoordinatorError> { self.write_create_partitions(topic_id, new_total).await }
            async fn alter_topic_config(&self, topic_id: uuid::Uuid, config: $crate::TopicConfig) -> Result<(), $crate::CoordinatorError> { self.write_alter_topic_config(topic_id, config).await }
            async fn list_producers(&self, partition: $crate::TopicIdPartition) -> Result<Vec<$crate::ProducerState>, $crate::CoordinatorError> { self.read_list_producers(partition).await }
            async fn write_txn_markers(&self, markers: &[$crate::TxnMarker]) -> Result<Vec<$crate::TxnMarkerResult>, $crate::CoordinatorError> { self.write_txn_markers(markers).await }
            async fn tiering_candidates(&self, now_ms: i64, min_age_ms: i64, after: Option<$crate::TopicIdPartition>, limit: u32) -> Result<Vec<$crate::TieringCandidate>, $crate::CoordinatorError> { self.read_tiering_candidates(now_ms, min_age_ms, after, limit).await }
            async fn segment_plan(&self, request: &$crate::SegmentPlanRequest) -> Result<$crate::SegmentPlan, $crate::CoordinatorError> { self.read_segment_plan(request).await }
            async fn register_segment(&self, request: $crate::RegisterSegmentRequest) -> Result<$crate::RegisterSegmentOutcome, $crate::CoordinatorError> { self.write_register_segment(request).await }
            async fn list_tiered_segments(&self, partition: $crate::TopicIdPartition, from_offset: i64, limit: u32) -> Result<Vec<$crate::TieredSegment>, $crate::CoordinatorError> { self.read_list_tiered_segments(partition, from_offset, limit).await }
        }
    };
}
pub(crate) use sql_batch_coordinator;
