//! Requests and reads shared by the integration tests of this crate (`mod common;` in each test
//! file; every test binary uses only some of them).

#![allow(dead_code)]

use diskless_coordinator::{
    BatchCoordinator, CommitBatch, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    FindBatchesRequest, FindBatchesResponse, ListOffsetsRequest, ListOffsetsResponse,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, TimestampType, TopicConfig, TopicIdPartition,
};
use uuid::Uuid;

/// A non-idempotent CreateTime batch for `p`: `records` records, `size` bytes, timestamp `ts`
/// (placed in its file by [`request`]).
pub(crate) fn plain(p: TopicIdPartition, records: i32, size: u32, ts: i64) -> CommitBatch {
    CommitBatch {
        partition: p,
        byte_offset: 0,
        byte_size: size,
        record_count: records,
        base_timestamp: ts,
        max_timestamp: ts,
        timestamp_type: TimestampType::CreateTime,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        base_sequence: NO_SEQUENCE,
        last_sequence: NO_SEQUENCE,
        transactional: false,
        txn_seq: None,
    }
}

/// A commit of `key` by broker 1 (owners `[0]`), laying `batches` out back to back after the
/// 1-byte header.
pub(crate) fn request(key: &str, mut batches: Vec<CommitBatch>) -> CommitFileRequest {
    let mut at = 1u64;
    for b in &mut batches {
        b.byte_offset = at;
        at += u64::from(b.byte_size);
    }
    CommitFileRequest {
        object_key: key.to_string(),
        uploader_broker_id: 1,
        object_size: at,
        owners: vec![0],
        batches,
    }
}

/// Creates topic `topic_id`; panics if the coordinator refuses.
pub(crate) async fn create_topic(
    c: &dyn BatchCoordinator,
    topic_id: Uuid,
    name: &str,
    partitions: i32,
    config: TopicConfig,
) {
    c.create_topic(CreateTopicRequest {
        topic_id,
        name: name.to_string(),
        partitions,
        config,
    })
    .await
    .unwrap();
}

/// What `find_batches` answers for `p` from `offset` on, without a byte limit.
pub(crate) async fn try_find_from(
    c: &dyn BatchCoordinator,
    p: TopicIdPartition,
    offset: i64,
) -> Result<FindBatchesResponse, CoordinatorError> {
    c.find_batches(
        &[FindBatchesRequest {
            partition: p,
            offset,
            max_bytes: u32::MAX,
            isolation: Default::default(),
        }],
        u32::MAX,
    )
    .await
    .map(|mut r| r.remove(0))
}

/// [`try_find_from`]; panics if the call fails.
pub(crate) async fn find_from(
    c: &dyn BatchCoordinator,
    p: TopicIdPartition,
    offset: i64,
) -> FindBatchesResponse {
    try_find_from(c, p, offset).await.unwrap()
}

/// What `list_offsets` answers for `p` at `timestamp` (or `LATEST_TIMESTAMP`, ...); panics if the
/// call fails.
pub(crate) async fn list_offset(
    c: &dyn BatchCoordinator,
    p: TopicIdPartition,
    timestamp: i64,
) -> ListOffsetsResponse {
    c.list_offsets(&[ListOffsetsRequest {
        partition: p,
        timestamp,
        isolation: Default::default(),
    }])
    .await
    .unwrap()
    .remove(0)
}
