//! The conformance suite of diskless-testkit against every implementation in this crate, one test
//! per case and implementation (`sqlite_file::commit_validation`, ...). PostgreSQL runs it in
//! `postgres.rs`, the sharded router in `sharded.rs`.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::coordinator_conformance;
use std::sync::Arc;

coordinator_conformance!(model, async |clock| {
    Arc::new(InMemoryCoordinator::new(clock))
});

// Every case on its own database file (WAL, read pool, default durability). The tiered-segment
// cases (`TIERED_CASES`) are skipped: tiered storage is not implemented yet (issue #15 step 3/5);
// the SQLite coordinator refuses the tiering calls (`sqlite/tiering.rs`).
coordinator_conformance!(
    sqlite_file,
    async |clock| {
        let dir = tempfile::tempdir().unwrap();
        let coordinator = SqliteCoordinator::open(
            dir.path().join("case.db"),
            SqliteOptions::default().with_synchronous(Synchronous::Normal),
            clock,
        )
        .await
        .unwrap();
        (Arc::new(coordinator), dir)
    },
    // Not implemented yet (issue #15 step 3/5).
    skip = [
        tiered_topic_config_is_kept,
        tiering_candidates_by_bytes_and_age,
        segment_plan_prefix_below_bounds,
        register_segment_moves_range_to_tier,
        register_segment_is_idempotent_on_key,
        register_segment_stale_after_retention,
        register_segment_stale_after_delete_records,
        register_segment_stale_after_other_segment,
        register_segment_refused_when_fenced,
        register_segment_refused_past_deadline,
        register_segment_range_checks,
        find_batches_across_tiers,
        list_offsets_across_tiers,
        retention_by_time_deletes_whole_segments,
        retention_by_size_counts_segments,
        delete_records_inside_segment_keeps_it,
        delete_records_past_segment_deletes_it,
        delete_topic_releases_segments,
        segment_objects_in_object_lifecycle,
        fence_orphans_leaves_registered_segment_alone,
        retention_budget_counts_segments,
        shared_wal_object_released_by_two_partitions,
        tiered_segments_with_transactions,
    ],
);

coordinator_conformance!(
    sqlite_in_memory,
    async |clock| Arc::new(SqliteCoordinator::in_memory(clock).await.unwrap()),
    // Not implemented yet (issue #15 step 3/5).
    skip = [
        tiered_topic_config_is_kept,
        tiering_candidates_by_bytes_and_age,
        segment_plan_prefix_below_bounds,
        register_segment_moves_range_to_tier,
        register_segment_is_idempotent_on_key,
        register_segment_stale_after_retention,
        register_segment_stale_after_delete_records,
        register_segment_stale_after_other_segment,
        register_segment_refused_when_fenced,
        register_segment_refused_past_deadline,
        register_segment_range_checks,
        find_batches_across_tiers,
        list_offsets_across_tiers,
        retention_by_time_deletes_whole_segments,
        retention_by_size_counts_segments,
        delete_records_inside_segment_keeps_it,
        delete_records_past_segment_deletes_it,
        delete_topic_releases_segments,
        segment_objects_in_object_lifecycle,
        fence_orphans_leaves_registered_segment_alone,
        retention_budget_counts_segments,
        shared_wal_object_released_by_two_partitions,
        tiered_segments_with_transactions,
    ],
);

/// Until tiered storage is implemented (issue #15 step 3), the SQLite coordinator refuses every
/// tiering call and every topic configuration it could not store, instead of answering as if
/// nothing were due.
#[tokio::test]
async fn sqlite_refuses_tiered_storage_explicitly() {
    use diskless_coordinator::*;
    let c = SqliteCoordinator::in_memory(ManualClock::new(1_000))
        .await
        .unwrap();
    let refused = |r: Result<String, CoordinatorError>| match r {
        Err(CoordinatorError::InvalidRequest(m)) => assert!(m.contains("not implemented"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let topic_id = uuid::Uuid::from_u128(1);
    let p = TopicIdPartition::new(topic_id, 0);
    let create = |config| CreateTopicRequest {
        topic_id,
        name: "t".into(),
        partitions: 1,
        config,
    };
    let tiering = TopicConfig::default().with_segment_ms(60_000);
    refused(
        c.create_topic(create(tiering.clone()))
            .await
            .map(|()| String::new()),
    );
    c.create_topic(create(TopicConfig::default()))
        .await
        .unwrap();
    refused(
        c.alter_topic_config(topic_id, tiering)
            .await
            .map(|()| String::new()),
    );
    assert_eq!(
        c.list_topics().await.unwrap()[0].config,
        TopicConfig::default()
    );
    refused(
        c.tiering_candidates(0, 0, None, 10)
            .await
            .map(|r| format!("{r:?}")),
    );
    let plan = SegmentPlanRequest {
        partition: p,
        max_bytes: 1,
        max_batches: 1,
        committed_before_ms: 0,
    };
    refused(c.segment_plan(&plan).await.map(|r| format!("{r:?}")));
    let register = RegisterSegmentRequest {
        partition: p,
        object_key: "tiered/x".into(),
        object_size: 100,
        uploader_broker_id: 0,
        layout: SegmentLayoutSizes {
            log: 10,
            ..Default::default()
        },
        base_offset: 0,
        end_offset: 0,
        batch_count: 1,
        batch_bytes: 10,
        max_timestamp: -1,
        max_timestamp_offset: 0,
        owner: 0,
    };
    refused(c.register_segment(register).await.map(|r| format!("{r:?}")));
    refused(
        c.list_tiered_segments(p, 0, 10)
            .await
            .map(|r| format!("{r:?}")),
    );
    let fetched = c
        .find_batches(
            &[FindBatchesRequest {
                partition: p,
                offset: 0,
                max_bytes: 100,
                isolation: IsolationLevel::ReadUncommitted,
            }],
            100,
        )
        .await
        .unwrap();
    assert_eq!(fetched[0].error, ErrorCode::None);
    assert!(fetched[0].segments.is_empty());
}
