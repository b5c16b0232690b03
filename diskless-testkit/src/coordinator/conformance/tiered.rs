//! The tiered-segment cases of the conformance suite (issue #15, docs/tiered-consolidation.md
//! §2.4 and §3.2): which partitions are due, what the next segment holds, the atomic
//! registration that moves a range of WAL batches into a tiered segment, and fetch, ListOffsets,
//! retention, DeleteRecords, topic deletion and the object lifecycle across both tiers.
//!
//! The cases register made-up segments: the sizes of a request are computed from the planned
//! coordinates (the `.log` is the batches' bytes; index sizes are arbitrary), which is all the
//! coordinator checks. Keys are `tiered/<uuid v7>` at the harness clock's now.

use super::*;
use diskless_coordinator::{
    AbortedTxn, FindBatchesResponse, IsolationLevel, ObjectKind, RegisterSegmentOutcome,
    RegisterSegmentRequest, ReplaceSegmentsRequest, ReplacedSegment, SegmentLayoutSizes,
    SegmentPlan, SegmentPlanRequest, TXN_MARKER_SIZE, TieredSegment, TxnMarker,
};

/// ListOffsets `-4` (EARLIEST_LOCAL).
const EARLIEST_LOCAL: i64 = -4;
/// ListOffsets `-5` (LATEST_TIERED).
const LATEST_TIERED: i64 = -5;

/// A fresh segment key whose UUID v7 time is the harness clock's now.
fn seg_key(h: &Harness) -> String {
    v7_key(h.clock.now_ms()).replacen("wal/", "tiered/", 1)
}

/// The plan of `p`'s next segment with the given limits, of batches committed before `before`.
async fn plan_with(
    h: &Harness,
    p: TopicIdPartition,
    max_bytes: u64,
    max_batches: u32,
    before: i64,
) -> SegmentPlan {
    h.coordinator
        .segment_plan(&SegmentPlanRequest {
            partition: p,
            max_bytes,
            max_batches,
            committed_before_ms: before,
        })
        .await
        .expect("segment_plan")
}

/// The plan of up to `max_batches` batches, whatever their size and age.
async fn plan(h: &Harness, p: TopicIdPartition, max_batches: u32) -> SegmentPlan {
    let plan = plan_with(h, p, u64::MAX, max_batches, h.clock.now_ms() + 1).await;
    assert_eq!(plan.error, ErrorCode::None, "{plan:?}");
    plan
}

/// A registration of a segment made of `batches` under `key`, with sizes computed from them.
fn seg_request(
    p: TopicIdPartition,
    key: &str,
    batches: &[BatchCoordinate],
) -> RegisterSegmentRequest {
    let n = batches.len() as u32;
    let bytes: u64 = batches.iter().map(|b| u64::from(b.byte_size)).sum();
    let layout = SegmentLayoutSizes {
        log: bytes,
        offset_index: 8 * n,
        time_index: 12 * n,
        txn_index: 0,
        producer_snapshot: 0,
        leader_epochs: 0,
    };
    let mut max_timestamp = NO_TIMESTAMP;
    let mut max_timestamp_offset = batches.first().map_or(0, |b| b.base_offset);
    for b in batches {
        // Strictly greater: the earliest batch holding the max.
        if b.effective_max_timestamp() > max_timestamp {
            max_timestamp = b.effective_max_timestamp();
            max_timestamp_offset = b.last_offset;
        }
    }
    RegisterSegmentRequest {
        partition: p,
        object_key: key.to_string(),
        object_size: layout.object_size(),
        uploader_broker_id: 7,
        layout,
        base_offset: batches.first().map_or(0, |b| b.base_offset),
        end_offset: batches.last().map_or(0, |b| b.last_offset),
        batch_count: n,
        batch_bytes: bytes,
        max_timestamp,
        max_timestamp_offset,
        owner: 0,
    }
}

async fn register(h: &Harness, request: RegisterSegmentRequest) -> RegisterSegmentOutcome {
    h.coordinator
        .register_segment(request)
        .await
        .expect("register_segment")
}

/// Plans up to `max_batches` batches of `p` and registers them under a fresh key; the key and
/// the request.
async fn consolidate(
    h: &Harness,
    p: TopicIdPartition,
    max_batches: u32,
) -> (String, RegisterSegmentRequest) {
    let planned = plan(h, p, max_batches).await;
    assert!(!planned.batches.is_empty(), "nothing to consolidate");
    let key = seg_key(h);
    let request = seg_request(p, &key, &planned.batches);
    assert!(
        matches!(
            register(h, request.clone()).await,
            RegisterSegmentOutcome::Registered { .. }
        ),
        "registering {request:?}"
    );
    (key, request)
}

async fn segments_of(h: &Harness, p: TopicIdPartition) -> Vec<TieredSegment> {
    h.coordinator
        .list_tiered_segments(p, 0, u32::MAX)
        .await
        .expect("list_tiered_segments")
}

async fn fetch_with(
    h: &Harness,
    p: TopicIdPartition,
    offset: i64,
    max_bytes: u32,
    fetch_max_bytes: u32,
    isolation: IsolationLevel,
) -> FindBatchesResponse {
    h.coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: p,
                offset,
                max_bytes,
                isolation,
            }],
            fetch_max_bytes,
        )
        .await
        .expect("find_batches")
        .remove(0)
}

/// A fetch from `offset` without limits: (segment base offsets, batch base offsets).
async fn fetch_offsets(h: &Harness, p: TopicIdPartition, offset: i64) -> (Vec<i64>, Vec<i64>) {
    let r = fetch_with(
        h,
        p,
        offset,
        u32::MAX,
        u32::MAX,
        IsolationLevel::ReadUncommitted,
    )
    .await;
    assert_eq!(r.error, ErrorCode::None, "{r:?}");
    bases(&r)
}

fn bases(r: &FindBatchesResponse) -> (Vec<i64>, Vec<i64>) {
    (
        r.segments.iter().map(|s| s.base_offset).collect(),
        r.batches.iter().map(|b| b.base_offset).collect(),
    )
}

/// A one-record batch of `size` bytes at timestamp `ts`.
fn one(p: TopicIdPartition, size: u32, ts: i64) -> CommitBatch {
    plain(p, 1, size, ts)
}

/// A topic of `partitions` partitions with `config`.
async fn topic_config(h: &Harness, partitions: i32, config: TopicConfig) -> Uuid {
    topic_with(h, &format!("t-{}", fresh_id()), partitions, config).await
}

// ---------------------------------------------------------------------------------------------
// Configuration, candidates and plans

/// The four tiered-storage topic settings are kept, altered and checked against Kafka's bounds.
pub async fn tiered_topic_config_is_kept(h: Harness) {
    let c = &h.coordinator;
    let config = TopicConfig::default()
        .with_segment_bytes(1_000)
        .with_segment_ms(500)
        .with_index_interval_bytes(0)
        .with_segment_index_bytes(24);
    let t = topic_config(&h, 1, config.clone()).await;
    let listed = c.list_topics().await.unwrap();
    assert_eq!(listed[0].config, config);
    let altered = config
        .with_segment_bytes(14)
        .with_segment_ms(1)
        .with_index_interval_bytes(4096)
        .with_segment_index_bytes(4);
    c.alter_topic_config(t, altered.clone()).await.unwrap();
    assert_eq!(c.list_topics().await.unwrap()[0].config, altered);
    for bad in [
        TopicConfig::default().with_segment_bytes(13),
        TopicConfig::default().with_segment_ms(0),
        TopicConfig::default().with_index_interval_bytes(-1),
        TopicConfig::default().with_segment_index_bytes(3),
    ] {
        refused_on_alter_and_create(&h, t, bad).await;
    }
    assert_eq!(c.list_topics().await.unwrap()[0].config, altered);
}

/// Due by `segment.bytes` or by `segment.ms` since the first WAL batch's commit, only once that
/// batch is older than `min_age`; listed in (topic id, partition) order after the cursor.
pub async fn tiering_candidates_by_bytes_and_age(h: Harness) {
    let c = &h.coordinator;
    let day = 24 * 60 * 60 * 1000;
    let by_bytes = TopicConfig::default()
        .with_segment_bytes(100)
        .with_segment_ms(day);
    let by_age = TopicConfig::default().with_segment_ms(10_000);
    let a = topic_config(&h, 2, by_bytes.clone()).await;
    let b = topic_config(&h, 1, by_age).await;
    commit(
        &h,
        vec![
            one(tp(a, 0), 40, START_MS),
            one(tp(a, 0), 40, START_MS),
            one(tp(a, 0), 40, START_MS),
            one(tp(a, 1), 40, START_MS),
            one(tp(b, 0), 40, START_MS),
        ],
    )
    .await;
    let listed = async |now: i64, min_age: i64, after: Option<TopicIdPartition>, limit: u32| {
        c.tiering_candidates(now, min_age, after, limit)
            .await
            .expect("tiering_candidates")
    };
    // Committed at START_MS: not before `now − min_age` at now itself.
    assert!(listed(START_MS, 0, None, 10).await.is_empty());
    let due = listed(START_MS + 1, 0, None, 10).await;
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0].partition, tp(a, 0));
    assert_eq!(due[0].config, by_bytes);
    assert_eq!(
        (
            due[0].wal_bytes,
            due[0].oldest_wal_commit_ms,
            due[0].tiered_next_offset
        ),
        (120, START_MS, 0)
    );
    assert!(
        listed(START_MS + 1, 5, None, 10).await.is_empty(),
        "too young"
    );
    assert!(listed(START_MS + 1, 0, None, 0).await.is_empty(), "limit 0");

    // B is due by age at exactly segment.ms.
    let now = START_MS + 10_000;
    let mut expected = vec![tp(a, 0), tp(b, 0)];
    expected.sort();
    let all: Vec<TopicIdPartition> = listed(now, 0, None, 10)
        .await
        .iter()
        .map(|c| c.partition)
        .collect();
    assert_eq!(all, expected);
    assert!(
        !listed(now - 1, 0, None, 10)
            .await
            .iter()
            .any(|c| c.partition == tp(b, 0))
    );
    // Paging.
    let first = listed(now, 0, None, 1).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].partition, expected[0]);
    let second = listed(now, 0, Some(expected[0]), 1).await;
    assert_eq!(second[0].partition, expected[1]);
    assert!(listed(now, 0, Some(expected[1]), 10).await.is_empty());

    // After two of A-0's three batches moved to a segment: 40 bytes left, due by age only.
    h.clock.advance(1);
    consolidate(&h, tp(a, 0), 2).await;
    assert!(
        !listed(START_MS + 2, 0, None, 10)
            .await
            .iter()
            .any(|c| c.partition.topic_id == a)
    );
    let later = listed(START_MS + day, 0, None, 10).await;
    let a0 = later.iter().find(|c| c.partition == tp(a, 0)).unwrap();
    assert_eq!((a0.wal_bytes, a0.tiered_next_offset), (40, 2));
    assert!(later.iter().any(|c| c.partition == tp(a, 1)));
}

/// A plan is a prefix of the WAL batches from the first one, cut by age and limits, never
/// empty when the first batch qualifies.
pub async fn segment_plan_prefix_below_bounds(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            one(p, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    h.clock.advance(100);
    commit(&h, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let (all, _, _) = all_batches(&h, p).await;
    let offsets = |plan: &SegmentPlan| {
        plan.batches
            .iter()
            .map(|b| b.base_offset)
            .collect::<Vec<_>>()
    };

    let first_three = plan_with(&h, p, u64::MAX, u32::MAX, START_MS + 1).await;
    assert_eq!(first_three.error, ErrorCode::None);
    assert_eq!(first_three.batches, all[..3].to_vec());
    assert_eq!(
        (first_three.log_start_offset, first_three.high_watermark),
        (0, 5)
    );
    assert_eq!(first_three.previous, None);
    assert!(first_three.aborted.is_empty());
    assert_eq!(
        offsets(&plan_with(&h, p, u64::MAX, u32::MAX, START_MS + 101).await),
        vec![0, 1, 2, 3, 4]
    );
    assert!(
        plan_with(&h, p, u64::MAX, u32::MAX, START_MS)
            .await
            .batches
            .is_empty()
    );
    assert_eq!(
        offsets(&plan_with(&h, p, 25, u32::MAX, START_MS + 101).await),
        vec![0, 1]
    );
    assert_eq!(
        offsets(&plan_with(&h, p, 30, u32::MAX, START_MS + 101).await),
        vec![0, 1, 2]
    );
    assert_eq!(
        offsets(&plan_with(&h, p, 5, u32::MAX, START_MS + 101).await),
        vec![0],
        "first whatever its size"
    );
    assert_eq!(
        offsets(&plan_with(&h, p, u64::MAX, 0, START_MS + 101).await),
        vec![0],
        "first whatever the count"
    );
    assert_eq!(
        offsets(&plan_with(&h, p, u64::MAX, 2, START_MS + 101).await),
        vec![0, 1]
    );

    let unknown = plan_with(&h, tp(p.topic_id, 1), u64::MAX, 1, START_MS + 101).await;
    assert_eq!(
        unknown,
        SegmentPlan::error(ErrorCode::UnknownTopicOrPartition)
    );

    let (key, _) = consolidate(&h, p, 2).await;
    let next = plan(&h, p, u32::MAX).await;
    assert_eq!(offsets(&next), vec![2, 3, 4]);
    let previous = next.previous.expect("previous segment");
    assert_eq!((previous.object_key, previous.end_offset), (key, 1));
}

// ---------------------------------------------------------------------------------------------
// Registration

/// Registration moves the range: batch rows gone, the segment listed and served, WAL live bytes
/// released (fully covered objects marked now), bounds unchanged.
pub async fn register_segment_moves_range_to_tier(h: Harness) {
    let t = topic(&h, 2).await;
    let (p, q) = (tp(t, 0), tp(t, 1));
    let key1 = new_key();
    commit_key(
        &h,
        &key1,
        vec![plain(p, 2, 10, START_MS + 5), plain(p, 3, 20, START_MS + 9)],
    )
    .await;
    let key2 = new_key();
    commit_key(
        &h,
        &key2,
        vec![plain(p, 1, 30, START_MS + 7), one(q, 15, START_MS)],
    )
    .await;
    h.clock.advance(1);
    let now = h.clock.now_ms();
    let planned = plan(&h, p, 3).await;
    assert_eq!(planned.batches.len(), 3);
    let key = seg_key(&h);
    let request = seg_request(p, &key, &planned.batches);
    // The count is per coordinator (a shard counts its own part of the shared `key2`): only
    // the object states below are the contract.
    assert!(matches!(
        register(&h, request.clone()).await,
        RegisterSegmentOutcome::Registered { .. }
    ));

    let segments = segments_of(&h, p).await;
    assert_eq!(
        segments,
        vec![TieredSegment {
            object_key: key.clone(),
            object_size: request.object_size,
            layout: request.layout,
            base_offset: 0,
            end_offset: 5,
            max_timestamp: START_MS + 9,
            max_timestamp_offset: 4,
            retention_ts: START_MS + 9,
            batch_count: 3,
            registered_at: now,
            compacted: false,
        }]
    );
    let first = info_of(&h, &key1).await;
    assert_eq!(
        (first.live_bytes, first.marked_for_deletion_at, first.kind),
        (0, Some(now), ObjectKind::Wal)
    );
    let second = info_of(&h, &key2).await;
    assert_eq!(
        (second.live_bytes, second.marked_for_deletion_at),
        (15, None)
    );
    let seg = info_of(&h, &key).await;
    assert_eq!(seg.kind, ObjectKind::TieredSegment);
    assert_eq!((seg.object_size, seg.live_bytes), (request.object_size, 60));
    assert_eq!((seg.committed_at, seg.marked_for_deletion_at), (now, None));
    assert_eq!((seg.uploader_broker_id, seg.owners.len()), (7, 1));
    assert!(is_known(&h, &key).await);

    // Bounds unchanged; the segment serves the range.
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 0);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 6);
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![0], vec![]));
    ok_at(&commit_one(&h, one(p, 10, START_MS)).await, 6);
    assert_eq!(fetch_offsets(&h, p, 3).await, (vec![0], vec![6]));
    assert_eq!(fetch_offsets(&h, p, 6).await, (vec![], vec![6]));
    // The other partition is untouched.
    assert_eq!(fetch_offsets(&h, q, 0).await, (vec![], vec![0]));
    assert!(segments_of(&h, q).await.is_empty());
    assert_eq!(
        h.coordinator.list_tiered_segments(p, 6, 10).await.unwrap(),
        vec![],
        "from_offset past the segment"
    );
    assert_eq!(
        h.coordinator.list_tiered_segments(p, 5, 0).await.unwrap(),
        vec![]
    );
    let r = h.coordinator.list_tiered_segments(tp(t, 2), 0, 10).await;
    assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");
}

/// A retried registration is `AlreadyRegistered` and releases nothing twice; the key cannot be
/// reused for anything else.
pub async fn register_segment_is_idempotent_on_key(h: Harness) {
    let p = partition(&h).await;
    let wal = new_key();
    commit_key(
        &h,
        &wal,
        vec![
            one(p, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    let planned = plan(&h, p, 2).await;
    let key = seg_key(&h);
    let request = seg_request(p, &key, &planned.batches);
    assert_eq!(
        register(&h, request.clone()).await,
        RegisterSegmentOutcome::Registered {
            released_objects: 0
        }
    );
    assert_eq!(
        register(&h, request.clone()).await,
        RegisterSegmentOutcome::AlreadyRegistered
    );
    assert_eq!(info_of(&h, &wal).await.live_bytes, 10, "released once");
    assert_eq!(info_of(&h, &key).await.live_bytes, 20);
    assert_eq!(segments_of(&h, p).await.len(), 1);

    // The same key for another range, or a WAL key as a segment key.
    let rest = plan(&h, p, 1).await;
    let r = h
        .coordinator
        .register_segment(seg_request(p, &key, &rest.batches))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectAlreadyCommitted(_))),
        "{r:?}"
    );
    let r = h
        .coordinator
        .register_segment(seg_request(p, &wal, &rest.batches))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectAlreadyCommitted(_))),
        "{r:?}"
    );
    // The same range under a fresh key: those batches are gone.
    let again = RegisterSegmentRequest {
        object_key: seg_key(&h),
        ..request
    };
    assert_eq!(
        register(&h, again.clone()).await,
        RegisterSegmentOutcome::Stale
    );
    assert!(!is_known(&h, &again.object_key).await);
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![0], vec![2]));
}

/// Checks a stale registration applied nothing: the key is unknown, no segment, batches kept.
async fn nothing_registered(h: &Harness, p: TopicIdPartition, key: &str, batches: &[i64]) {
    assert!(!is_known(h, key).await, "{key} registered");
    assert!(object(h, key).await.is_none());
    assert!(segments_of(h, p).await.is_empty());
    let (found, _, _) = all_batches(h, p).await;
    assert_eq!(
        found.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        batches
    );
}

/// Retention took the planned batches before the registration: `Stale`, nothing applied.
pub async fn register_segment_stale_after_retention(h: Harness) {
    let t = topic_config(&h, 1, TopicConfig::default().with_retention_ms(1_000)).await;
    let p = tp(t, 0);
    commit(&h, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let planned = plan(&h, p, 10).await;
    h.clock.advance(2_000);
    assert_eq!(retention_pass(&h).await.batches_deleted, 2);
    let key = seg_key(&h);
    assert_eq!(
        register(&h, seg_request(p, &key, &planned.batches)).await,
        RegisterSegmentOutcome::Stale
    );
    nothing_registered(&h, p, &key, &[]).await;
}

/// DeleteRecords took the first planned batch: `Stale`, nothing applied.
pub async fn register_segment_stale_after_delete_records(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            one(p, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    let planned = plan(&h, p, 10).await;
    assert_eq!(delete_records(&h, p, 1).await, (ErrorCode::None, 1));
    let key = seg_key(&h);
    assert_eq!(
        register(&h, seg_request(p, &key, &planned.batches)).await,
        RegisterSegmentOutcome::Stale
    );
    nothing_registered(&h, p, &key, &[1, 2]).await;
}

/// Another builder registered the range (or part of it) first: `Stale`, nothing applied.
pub async fn register_segment_stale_after_other_segment(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            one(p, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    let planned = plan(&h, p, 2).await;
    let (winner, loser, part) = (seg_key(&h), seg_key(&h), seg_key(&h));
    assert!(matches!(
        register(&h, seg_request(p, &winner, &planned.batches)).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
    assert_eq!(
        register(&h, seg_request(p, &loser, &planned.batches)).await,
        RegisterSegmentOutcome::Stale
    );
    assert_eq!(
        register(&h, seg_request(p, &part, &planned.batches[..1])).await,
        RegisterSegmentOutcome::Stale
    );
    for key in [&loser, &part] {
        assert!(!is_known(&h, key).await);
    }
    let segments = segments_of(&h, p).await;
    assert_eq!(segments.len(), 1);
    assert_eq!(segments[0].object_key, winner);
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![0], vec![2]));
}

/// A fenced key is refused (`ObjectFenced`), nothing applied.
pub async fn register_segment_refused_when_fenced(h: Harness) {
    let p = partition(&h).await;
    commit(&h, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let planned = plan(&h, p, 10).await;
    let key = seg_key(&h);
    assert_eq!(
        h.coordinator
            .fence_orphans(std::slice::from_ref(&key))
            .await
            .unwrap(),
        vec![key.clone()]
    );
    let r = h
        .coordinator
        .register_segment(seg_request(p, &key, &planned.batches))
        .await;
    assert!(matches!(r, Err(CoordinatorError::ObjectFenced(_))), "{r:?}");
    nothing_registered(&h, p, &key, &[0, 1]).await;
}

/// A key older than the commit deadline is refused (`DeadlineExceeded`), nothing applied.
pub async fn register_segment_refused_past_deadline(h: Harness) {
    let p = partition(&h).await;
    commit(&h, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let planned = plan(&h, p, 10).await;
    let key = v7_key(h.clock.now_ms() - max_age_ms() - 1).replacen("wal/", "tiered/", 1);
    let r = h
        .coordinator
        .register_segment(seg_request(p, &key, &planned.batches))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "{r:?}"
    );
    nothing_registered(&h, p, &key, &[0, 1]).await;
}

/// A request that does not describe the first WAL batches exactly is `Stale`; one that
/// contradicts itself is invalid; an unknown partition is `UnknownPartition`; none applies.
pub async fn register_segment_range_checks(h: Harness) {
    let t = topic(&h, 1).await;
    let p = tp(t, 0);
    commit(
        &h,
        vec![
            plain(p, 2, 10, START_MS),
            plain(p, 2, 10, START_MS),
            plain(p, 2, 10, START_MS),
        ],
    )
    .await;
    let planned = plan(&h, p, 10).await;
    let good = |key: &str| seg_request(p, key, &planned.batches);
    let stale = [
        RegisterSegmentRequest {
            batch_count: 2,
            ..good("")
        },
        {
            let mut r = good("");
            r.batch_bytes = 29;
            r.layout.log = 29;
            r.object_size -= 1;
            r
        },
        RegisterSegmentRequest {
            end_offset: 4,
            ..good("")
        },
        RegisterSegmentRequest {
            end_offset: 6,
            ..good("")
        },
        seg_request(p, "", &planned.batches[1..]),
        RegisterSegmentRequest {
            base_offset: 1,
            ..good("")
        },
    ];
    for request in stale {
        let key = seg_key(&h);
        let request = RegisterSegmentRequest {
            object_key: key.clone(),
            ..request
        };
        assert_eq!(
            register(&h, request.clone()).await,
            RegisterSegmentOutcome::Stale,
            "{request:?}"
        );
        assert!(!is_known(&h, &key).await);
    }
    for partition in [tp(t, 1), tp(t, -1), tp(fresh_id(), 0)] {
        let request = RegisterSegmentRequest {
            partition,
            ..good(&seg_key(&h))
        };
        assert_eq!(
            register(&h, request).await,
            RegisterSegmentOutcome::UnknownPartition
        );
    }
    let invalid_requests = [
        good(""),
        RegisterSegmentRequest {
            base_offset: 6,
            ..good(&seg_key(&h))
        },
        RegisterSegmentRequest {
            base_offset: -1,
            ..good(&seg_key(&h))
        },
        RegisterSegmentRequest {
            batch_count: 0,
            ..good(&seg_key(&h))
        },
        RegisterSegmentRequest {
            batch_bytes: 31,
            ..good(&seg_key(&h))
        },
        RegisterSegmentRequest {
            object_size: 30,
            ..good(&seg_key(&h))
        },
    ];
    for request in invalid_requests {
        invalid(h.coordinator.register_segment(request).await);
    }
    nothing_registered(&h, p, "", &[0, 2, 4]).await;
    assert!(matches!(
        register(&h, good(&seg_key(&h))).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Reads across tiers

/// Fetches start in the segment holding the offset, go on through segments and into WAL batches
/// under the KIP-74 limits (a segment counting its whole `.log`).
pub async fn find_batches_across_tiers(h: Harness) {
    let p = partition(&h).await;
    commit(&h, (0..6).map(|_| one(p, 10, START_MS)).collect()).await;
    consolidate(&h, p, 2).await;
    consolidate(&h, p, 2).await;
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![0, 2], vec![4, 5]));
    assert_eq!(fetch_offsets(&h, p, 1).await, (vec![0, 2], vec![4, 5]));
    assert_eq!(fetch_offsets(&h, p, 3).await, (vec![2], vec![4, 5]));
    assert_eq!(
        fetch_offsets(&h, p, 4).await,
        (vec![], vec![4, 5]),
        "at tiered_next_offset"
    );
    assert_eq!(fetch_offsets(&h, p, 6).await, (vec![], vec![]));
    let limited = async |max_bytes, fetch_max_bytes| {
        bases(
            &fetch_with(
                &h,
                p,
                0,
                max_bytes,
                fetch_max_bytes,
                IsolationLevel::ReadUncommitted,
            )
            .await,
        )
    };
    assert_eq!(
        limited(5, u32::MAX).await,
        (vec![0], vec![]),
        "the first segment whole"
    );
    assert_eq!(limited(20, u32::MAX).await, (vec![0], vec![]));
    assert_eq!(limited(45, u32::MAX).await, (vec![0, 2], vec![]));
    assert_eq!(limited(50, u32::MAX).await, (vec![0, 2], vec![4]));
    assert_eq!(limited(u32::MAX, 39).await, (vec![0], vec![]));
    assert_eq!(limited(u32::MAX, 40).await, (vec![0, 2], vec![]));
    let committed = fetch_with(&h, p, 1, u32::MAX, u32::MAX, IsolationLevel::ReadCommitted).await;
    assert_eq!(bases(&committed), (vec![0, 2], vec![4, 5]));
    assert_eq!(committed.aborted, Some(vec![]));
    assert_eq!(
        (
            committed.log_start_offset,
            committed.high_watermark,
            committed.last_stable_offset
        ),
        (0, 6, 6)
    );

    // The log start inside the first segment: below it is out of range, the segment still serves.
    assert_eq!(delete_records(&h, p, 1).await, (ErrorCode::None, 1));
    let below = fetch_with(
        &h,
        p,
        0,
        u32::MAX,
        u32::MAX,
        IsolationLevel::ReadUncommitted,
    )
    .await;
    assert_eq!(below.error, ErrorCode::OffsetOutOfRange);
    assert!(below.segments.is_empty() && below.batches.is_empty());
    let r = fetch_with(
        &h,
        p,
        1,
        u32::MAX,
        u32::MAX,
        IsolationLevel::ReadUncommitted,
    )
    .await;
    assert_eq!(
        (bases(&r), r.log_start_offset),
        ((vec![0, 2], vec![4, 5]), 1)
    );
}

/// ListOffsets looks at segments before batches: by timestamp, MAX_TIMESTAMP (ties to the
/// earlier), answers never below the log start, `-4` and `-5` from the first offset not tiered.
pub async fn list_offsets_across_tiers(h: Harness) {
    let t = topic(&h, 2).await;
    let (p, other) = (tp(t, 0), tp(t, 1));
    assert_eq!(list(&h, p, EARLIEST_LOCAL).await.offset, 0);
    assert_eq!(list(&h, p, LATEST_TIERED).await.offset, -1);
    commit(
        &h,
        vec![
            one(p, 10, START_MS + 100),
            one(p, 10, START_MS + 300),
            one(p, 10, START_MS + 200),
            one(p, 10, START_MS + 400),
            one(p, 10, START_MS + 50),
        ],
    )
    .await;
    consolidate(&h, p, 2).await;
    consolidate(&h, p, 1).await;
    let at = async |timestamp| {
        let r = list(&h, p, timestamp).await;
        assert_eq!(r.error, ErrorCode::None, "{r:?}");
        (r.offset, r.timestamp)
    };
    assert_eq!(
        at(START_MS).await,
        (0, START_MS + 300),
        "in the first segment"
    );
    assert_eq!(at(START_MS + 250).await, (0, START_MS + 300));
    assert_eq!(
        at(START_MS + 301).await,
        (3, START_MS + 400),
        "in WAL after the segments"
    );
    assert_eq!(at(START_MS + 401).await, (-1, NO_TIMESTAMP));
    assert_eq!(at(MAX_TIMESTAMP).await, (3, START_MS + 400));
    assert_eq!(at(EARLIEST_LOCAL).await, (3, NO_TIMESTAMP));
    assert_eq!(at(LATEST_TIERED).await, (2, NO_TIMESTAMP));
    assert_eq!(at(EARLIEST_TIMESTAMP).await, (0, NO_TIMESTAMP));
    assert_eq!(at(LATEST_TIMESTAMP).await, (5, NO_TIMESTAMP));

    // MAX_TIMESTAMP in a segment, tied with a WAL batch: the earlier, the segment.
    commit(
        &h,
        vec![
            one(other, 10, START_MS + 500),
            one(other, 10, START_MS + 500),
        ],
    )
    .await;
    consolidate(&h, other, 1).await;
    let r = list(&h, other, MAX_TIMESTAMP).await;
    assert_eq!((r.offset, r.timestamp), (0, START_MS + 500));

    // Raised to the log start inside a segment.
    delete_records(&h, p, 1).await;
    assert_eq!(at(START_MS + 250).await, (1, START_MS + 300));
    assert_eq!(at(EARLIEST_LOCAL).await, (3, NO_TIMESTAMP));
    // Past every segment: the first offset not tiered stays, the log start passes it.
    delete_records(&h, p, 4).await;
    assert!(segments_of(&h, p).await.is_empty());
    assert_eq!(at(EARLIEST_LOCAL).await, (4, NO_TIMESTAMP));
    assert_eq!(at(LATEST_TIERED).await, (2, NO_TIMESTAMP));
    assert_eq!(at(START_MS).await, (4, START_MS + 50));
}

// ---------------------------------------------------------------------------------------------
// Retention, DeleteRecords, topic deletion

/// Time retention deletes whole segments by `retention_ts` (a batch without timestamps counts by
/// its commit time), then WAL batches: one prefix.
pub async fn retention_by_time_deletes_whole_segments(h: Harness) {
    let t = topic_config(&h, 1, TopicConfig::default().with_retention_ms(1_000)).await;
    let p = tp(t, 0);
    commit_one(&h, one(p, 10, START_MS)).await;
    h.clock.advance(500);
    commit_one(&h, one(p, 10, NO_TIMESTAMP)).await;
    commit_one(&h, one(p, 10, START_MS + 5_000)).await;
    commit_one(&h, one(p, 10, START_MS)).await;
    consolidate(&h, p, 2).await;
    consolidate(&h, p, 1).await;
    let segments = segments_of(&h, p).await;
    assert_eq!(
        segments.iter().map(|s| s.retention_ts).collect::<Vec<_>>(),
        vec![START_MS + 500, START_MS + 5_000]
    );
    h.clock.set(START_MS + 1_500);
    assert_eq!(retention_pass(&h).await, RetentionReport::default());
    h.clock.set(START_MS + 1_501);
    let report = retention_pass(&h).await;
    assert_eq!(
        (
            report.segments_deleted,
            report.batches_deleted,
            report.bytes_deleted,
            report.more
        ),
        (1, 0, 20, false),
        "the old WAL batch waits behind the young segment"
    );
    let first = info_of(&h, &segments[0].object_key).await;
    assert_eq!(
        (first.live_bytes, first.marked_for_deletion_at),
        (0, Some(START_MS + 1_501))
    );
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 2);
    assert_eq!(segments_of(&h, p).await, segments[1..].to_vec());
    h.clock.set(START_MS + 6_001);
    let report = retention_pass(&h).await;
    assert_eq!(
        (
            report.segments_deleted,
            report.batches_deleted,
            report.bytes_deleted
        ),
        (1, 1, 20)
    );
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 4);
    assert_eq!(fetch_offsets(&h, p, 4).await, (vec![], vec![]));
}

/// Size retention counts segments' `.log` bytes: segments go first, whole, then batches.
pub async fn retention_by_size_counts_segments(h: Harness) {
    let t = topic_config(&h, 1, TopicConfig::default().with_retention_bytes(30)).await;
    let p = tp(t, 0);
    commit(&h, (0..4).map(|_| one(p, 10, START_MS)).collect()).await;
    consolidate(&h, p, 2).await;
    assert_eq!(
        retention_pass(&h).await,
        RetentionReport::default(),
        "40 − 20 < 30"
    );
    commit(&h, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let report = retention_pass(&h).await;
    assert_eq!(
        (
            report.segments_deleted,
            report.batches_deleted,
            report.bytes_deleted
        ),
        (1, 1, 30)
    );
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 3);
    assert!(segments_of(&h, p).await.is_empty());

    // Two segments and a batch: the second segment stays, so no batch is looked at.
    let t = topic_config(&h, 1, TopicConfig::default().with_retention_bytes(25)).await;
    let q = tp(t, 0);
    commit(&h, (0..5).map(|_| one(q, 10, START_MS)).collect()).await;
    consolidate(&h, q, 2).await;
    consolidate(&h, q, 2).await;
    let report = retention_pass(&h).await;
    assert_eq!((report.segments_deleted, report.batches_deleted), (1, 0));
    assert_eq!(fetch_offsets(&h, q, 2).await, (vec![2], vec![4]));
}

/// DeleteRecords inside a segment keeps it whole.
pub async fn delete_records_inside_segment_keeps_it(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            plain(p, 2, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    let (key, _) = consolidate(&h, p, 2).await;
    assert_eq!(delete_records(&h, p, 1).await, (ErrorCode::None, 1));
    assert_eq!(delete_records(&h, p, 2).await, (ErrorCode::None, 2));
    assert_eq!(segments_of(&h, p).await.len(), 1);
    let seg = info_of(&h, &key).await;
    assert_eq!((seg.live_bytes, seg.marked_for_deletion_at), (20, None));
    assert_eq!(fetch_offsets(&h, p, 2).await, (vec![0], vec![3]));
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 2);
}

/// DeleteRecords past a segment's end deletes it and releases its object.
pub async fn delete_records_past_segment_deletes_it(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            plain(p, 2, 10, START_MS),
            one(p, 10, START_MS),
            one(p, 10, START_MS),
        ],
    )
    .await;
    let (key, _) = consolidate(&h, p, 2).await;
    h.clock.advance(7);
    assert_eq!(delete_records(&h, p, 3).await, (ErrorCode::None, 3));
    assert!(segments_of(&h, p).await.is_empty());
    let seg = info_of(&h, &key).await;
    assert_eq!(
        (seg.live_bytes, seg.marked_for_deletion_at),
        (0, Some(START_MS + 7))
    );
    assert_eq!(fetch_offsets(&h, p, 3).await, (vec![], vec![3]));
    assert_eq!(delete_records(&h, p, -1).await, (ErrorCode::None, 4));
    assert_eq!(fetch_offsets(&h, p, 4).await, (vec![], vec![]));
}

/// Deleting a topic releases its segments' objects with its WAL batches.
pub async fn delete_topic_releases_segments(h: Harness) {
    let t = topic(&h, 2).await;
    let (p, q) = (tp(t, 0), tp(t, 1));
    let wal = new_key();
    commit_key(
        &h,
        &wal,
        vec![
            one(p, 10, START_MS),
            one(p, 10, START_MS),
            one(q, 10, START_MS),
        ],
    )
    .await;
    let (key, _) = consolidate(&h, p, 1).await;
    h.clock.advance(3);
    h.coordinator.delete_topic(t).await.unwrap();
    for k in [&key, &wal] {
        let info = info_of(&h, k).await;
        assert_eq!(
            (info.live_bytes, info.marked_for_deletion_at),
            (0, Some(START_MS + 3)),
            "{k}"
        );
    }
    let r = h.coordinator.list_tiered_segments(p, 0, 10).await;
    assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");
    let marked = h
        .coordinator
        .objects_to_delete(START_MS + 4, 10)
        .await
        .unwrap();
    let seg = marked
        .iter()
        .find(|o| o.object_key == key)
        .expect("segment marked");
    assert_eq!(seg.kind, ObjectKind::TieredSegment);
    assert_eq!(
        marked.iter().find(|o| o.object_key == wal).map(|o| o.kind),
        Some(ObjectKind::Wal)
    );
}

// ---------------------------------------------------------------------------------------------
// Objects

/// A segment object lives like a WAL object: listed for deletion once released (with its kind),
/// forgotten and fenced by `confirm_deleted`.
pub async fn segment_objects_in_object_lifecycle(h: Harness) {
    let p = partition(&h).await;
    let wal = new_key();
    commit_key(&h, &wal, vec![one(p, 10, START_MS), one(p, 10, START_MS)]).await;
    let (key, request) = consolidate(&h, p, 2).await;
    let listed = h
        .coordinator
        .objects_to_delete(START_MS + 1, 10)
        .await
        .unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|o| (o.object_key.as_str(), o.kind))
            .collect::<Vec<_>>(),
        vec![(wal.as_str(), ObjectKind::Wal)]
    );
    assert!(is_known(&h, &key).await);
    h.clock.advance(5);
    delete_records(&h, p, -1).await;
    let listed = h
        .coordinator
        .objects_to_delete(START_MS + 6, 10)
        .await
        .unwrap();
    let seg = listed
        .iter()
        .find(|o| o.object_key == key)
        .expect("segment listed");
    assert_eq!(
        (seg.kind, seg.object_size, seg.marked_for_deletion_at),
        (ObjectKind::TieredSegment, request.object_size, START_MS + 5)
    );
    assert!(
        h.coordinator
            .objects_to_delete(START_MS + 5, 10)
            .await
            .unwrap()
            .iter()
            .all(|o| o.object_key != key)
    );
    h.coordinator
        .confirm_deleted(&[key.clone(), wal.clone()])
        .await
        .unwrap();
    assert!(object(&h, &key).await.is_none());
    assert!(!is_known(&h, &key).await);
    let r = h.coordinator.register_segment(request).await;
    assert!(matches!(r, Err(CoordinatorError::ObjectFenced(_))), "{r:?}");
}

/// `fence_orphans` never fences a registered segment's key.
pub async fn fence_orphans_leaves_registered_segment_alone(h: Harness) {
    let p = partition(&h).await;
    commit(&h, vec![one(p, 10, START_MS)]).await;
    let (key, request) = consolidate(&h, p, 1).await;
    let orphan = seg_key(&h);
    let fenced = h
        .coordinator
        .fence_orphans(&[key.clone(), orphan.clone()])
        .await
        .unwrap();
    assert_eq!(fenced, vec![orphan]);
    assert_eq!(
        register(&h, request).await,
        RegisterSegmentOutcome::AlreadyRegistered
    );
    assert_eq!(info_of(&h, &key).await.live_bytes, 10);
}

/// Each deleted segment spends one unit of a retention pass's budget.
pub async fn retention_budget_counts_segments(h: Harness) {
    let t = topic_config(&h, 1, TopicConfig::default().with_retention_ms(1_000)).await;
    let p = tp(t, 0);
    commit(&h, (0..5).map(|_| one(p, 10, START_MS)).collect()).await;
    for _ in 0..3 {
        consolidate(&h, p, 1).await;
    }
    h.clock.advance(2_000);
    let pass = async || h.coordinator.enforce_retention(2).await.unwrap();
    let r = pass().await;
    assert_eq!(
        (r.segments_deleted, r.batches_deleted, r.more),
        (2, 0, true)
    );
    let r = pass().await;
    assert_eq!(
        (r.segments_deleted, r.batches_deleted, r.more),
        (1, 1, true)
    );
    let r = pass().await;
    assert_eq!(
        (r.segments_deleted, r.batches_deleted, r.more),
        (0, 1, false)
    );
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 5);
}

/// A WAL object shared by two partitions stays alive until both moved their batches out of it.
pub async fn shared_wal_object_released_by_two_partitions(h: Harness) {
    let t = topic(&h, 2).await;
    let (p, q) = (tp(t, 0), tp(t, 1));
    let wal = new_key();
    commit_key(&h, &wal, vec![one(p, 10, START_MS), one(q, 10, START_MS)]).await;
    let planned = plan(&h, p, 1).await;
    // `released_objects` is counted per coordinator (a shard counts its own part of a shared
    // object): the object's state is the contract.
    assert!(matches!(
        register(&h, seg_request(p, &seg_key(&h), &planned.batches)).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
    let info = info_of(&h, &wal).await;
    assert_eq!((info.live_bytes, info.marked_for_deletion_at), (10, None));
    let planned = plan(&h, q, 1).await;
    assert!(matches!(
        register(&h, seg_request(q, &seg_key(&h), &planned.batches)).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
    let info = info_of(&h, &wal).await;
    assert_eq!(
        (info.live_bytes, info.marked_for_deletion_at),
        (0, Some(START_MS))
    );
}

// ---------------------------------------------------------------------------------------------
// Transactions

/// Only stable data is consolidated: plans and candidates stop at the last stable offset,
/// markers are covered like batches, and the aborted transactions of a covered range go with it.
pub async fn tiered_segments_with_transactions(h: Harness) {
    let t = topic(&h, 2).await;
    let (p, q) = (tp(t, 0), tp(t, 1));
    let txn_batch = |p, pid, seq: i32, txn_seq| CommitBatch {
        transactional: true,
        txn_seq: Some(txn_seq),
        ..idem(p, pid, 0, seq, 1)
    };
    let marker = |p, pid, commit, txn_seq| TxnMarker {
        partition: p,
        producer_id: pid,
        producer_epoch: 0,
        coordinator_epoch: 0,
        commit,
        txn_seq: Some(txn_seq),
    };
    ok_at(&commit_one(&h, one(p, 10, START_MS)).await, 0);
    ok_at(&commit_one(&h, txn_batch(p, 1, 0, 1)).await, 1);
    let ended = h
        .coordinator
        .write_txn_markers(&[marker(p, 1, false, 1)])
        .await
        .unwrap();
    assert_eq!(ended[0].offset, 2);
    ok_at(&commit_one(&h, txn_batch(p, 2, 0, 1)).await, 3);
    ok_at(&commit_one(&h, one(p, 10, START_MS)).await, 4);
    // q: its first batch is in an open transaction.
    ok_at(&commit_one(&h, txn_batch(q, 3, 0, 1)).await, 0);
    h.clock.advance(1);

    let planned = plan(&h, p, 100).await;
    assert_eq!(
        planned
            .batches
            .iter()
            .map(|b| b.base_offset)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(planned.batches[2].is_control());
    assert_eq!(
        planned.aborted,
        vec![AbortedTxn {
            producer_id: 1,
            first_offset: 1,
            last_offset: 2
        }]
    );
    assert!(plan(&h, q, 100).await.batches.is_empty());
    let due: Vec<TopicIdPartition> = h
        .coordinator
        .tiering_candidates(h.clock.now_ms() + 1_000_000_000, 0, None, 10)
        .await
        .unwrap()
        .iter()
        .map(|c| c.partition)
        .collect();
    assert_eq!(due, vec![p], "q's data is not stable");

    // A range reaching the open transaction is stale.
    let (all, _, _) = all_batches(&h, p).await;
    let reaching = seg_request(p, &seg_key(&h), &all[..4]);
    assert_eq!(register(&h, reaching).await, RegisterSegmentOutcome::Stale);

    let key = seg_key(&h);
    assert!(matches!(
        register(&h, seg_request(p, &key, &planned.batches)).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
    // The plain batch, the transactional one (`idem` makes 100 bytes) and the marker.
    assert_eq!(
        info_of(&h, &key).await.live_bytes,
        10 + 100 + u64::from(TXN_MARKER_SIZE)
    );
    let committed = fetch_with(&h, p, 0, u32::MAX, u32::MAX, IsolationLevel::ReadCommitted).await;
    assert_eq!(bases(&committed), (vec![0], vec![]));
    assert_eq!(committed.last_stable_offset, 3);
    assert_eq!(
        committed.aborted,
        Some(vec![]),
        "the aborted row went with its marker"
    );
    // Once the open transaction commits, the rest is stable.
    h.coordinator
        .write_txn_markers(&[marker(p, 2, true, 1)])
        .await
        .unwrap();
    let rest = plan(&h, p, 100).await;
    assert_eq!(
        rest.batches
            .iter()
            .map(|b| b.base_offset)
            .collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert_eq!(rest.previous.map(|s| s.object_key), Some(key));
}

/// Three registered segments of `p` (batches of 10 bytes: 2, 2 and 1 per segment, offsets 0..=4,
/// committed at `START_MS`), in offset order.
async fn three_segments(h: &Harness, p: TopicIdPartition) -> Vec<TieredSegment> {
    commit(h, (0..5).map(|_| one(p, 10, START_MS)).collect()).await;
    for n in [2, 2, 1] {
        consolidate(h, p, n).await;
    }
    let segments = segments_of(h, p).await;
    assert_eq!(
        segments
            .iter()
            .map(|s| (s.base_offset, s.end_offset))
            .collect::<Vec<_>>(),
        vec![(0, 1), (2, 3), (4, 4)]
    );
    segments
}

/// A compacted segment replacing `replaced` under `key`: offsets `base..=end`, `batches`
/// batches of 10 bytes.
fn compacted_request(
    p: TopicIdPartition,
    replaced: &[TieredSegment],
    key: &str,
    (base, end, batches): (i64, i64, u32),
) -> ReplaceSegmentsRequest {
    let layout = SegmentLayoutSizes {
        log: 10 * u64::from(batches),
        offset_index: 8,
        time_index: 12,
        txn_index: 0,
        producer_snapshot: 0,
        leader_epochs: 0,
    };
    ReplaceSegmentsRequest {
        partition: p,
        replaced: replaced.iter().map(ReplacedSegment::from).collect(),
        segment: Some(RegisterSegmentRequest {
            partition: p,
            object_key: key.to_string(),
            object_size: layout.object_size(),
            uploader_broker_id: 7,
            layout,
            base_offset: base,
            end_offset: end,
            batch_count: batches,
            batch_bytes: layout.log,
            max_timestamp: START_MS,
            max_timestamp_offset: end,
            owner: 0,
        }),
    }
}

async fn replace(h: &Harness, request: ReplaceSegmentsRequest) -> RegisterSegmentOutcome {
    h.coordinator
        .replace_segments(request)
        .await
        .expect("replace_segments")
}

/// Compaction's swap (issue #29): two consecutive segments are replaced by one compacted
/// segment holding part of their range, in one step: the list shows the new segment (marked
/// compacted, aged as the latest replaced) then the untouched third; the replaced objects are
/// marked for deletion with no live bytes; a fetch from an offset compaction removed starts at
/// the new segment; the bounds do not move; the partition's size drops by what compaction
/// removed (retention.bytes sees it).
pub async fn replace_segments_swaps_a_run_of_segments(h: Harness) {
    let p = partition(&h).await;
    let old = three_segments(&h, p).await;
    let key = seg_key(&h);
    // Offsets 0 and 2 went; 1 and 3 stay, in one batch each.
    let request = compacted_request(p, &old[..2], &key, (1, 3, 2));
    assert_eq!(
        replace(&h, request).await,
        RegisterSegmentOutcome::Registered {
            released_objects: 2
        }
    );
    let now = h.clock.now_ms();
    let segments = segments_of(&h, p).await;
    assert_eq!(
        segments
            .iter()
            .map(|s| (
                s.object_key.as_str(),
                s.base_offset,
                s.end_offset,
                s.compacted
            ))
            .collect::<Vec<_>>(),
        vec![
            (key.as_str(), 1, 3, true),
            (old[2].object_key.as_str(), 4, 4, false)
        ]
    );
    assert_eq!(segments[0].retention_ts, old[1].retention_ts);
    assert_eq!(segments[0].registered_at, now);
    for gone in &old[..2] {
        let info = info_of(&h, &gone.object_key).await;
        assert_eq!(
            (info.live_bytes, info.marked_for_deletion_at),
            (0, Some(now))
        );
    }
    let new = info_of(&h, &key).await;
    assert_eq!((new.live_bytes, new.kind), (20, ObjectKind::TieredSegment));
    assert_eq!(new.marked_for_deletion_at, None);
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![1, 4], vec![]));
    assert_eq!(fetch_offsets(&h, p, 2).await, (vec![1, 4], vec![]));
    let (batches, log_start, hwm) = all_batches(&h, p).await;
    assert_eq!((batches.len(), log_start, hwm), (0, 0, 5));
    // 30 bytes are left (20 + 10): retention.bytes 10 deletes the compacted segment only.
    let t = p.topic_id;
    let config = h.coordinator.list_topics().await.unwrap()[0].config.clone();
    h.coordinator
        .alter_topic_config(t, config.with_retention_bytes(10))
        .await
        .unwrap();
    assert_eq!(retention_pass(&h).await.segments_deleted, 1);
    assert_eq!(
        segments_of(&h, p)
            .await
            .iter()
            .map(|s| s.base_offset)
            .collect::<Vec<_>>(),
        vec![4]
    );
}

/// A replacement that keeps nothing removes the segments and registers none; a retry of an
/// applied replacement is `AlreadyRegistered` (idempotent on the new key); the new key cannot
/// be reused for anything else; the same swap under another key is `Stale`.
pub async fn replace_segments_is_idempotent_and_may_keep_nothing(h: Harness) {
    let p = partition(&h).await;
    let old = three_segments(&h, p).await;
    let key = seg_key(&h);
    let request = compacted_request(p, &old[1..2], &key, (3, 3, 1));
    assert!(matches!(
        replace(&h, request.clone()).await,
        RegisterSegmentOutcome::Registered { .. }
    ));
    assert_eq!(
        replace(&h, request.clone()).await,
        RegisterSegmentOutcome::AlreadyRegistered
    );
    assert_eq!(info_of(&h, &key).await.live_bytes, 10, "applied once");
    let other = compacted_request(p, &old[2..], &key, (4, 4, 1));
    let r = h.coordinator.replace_segments(other).await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectAlreadyCommitted(_))),
        "{r:?}"
    );
    let again = compacted_request(p, &old[1..2], &seg_key(&h), (3, 3, 1));
    assert_eq!(replace(&h, again).await, RegisterSegmentOutcome::Stale);

    // Nothing kept of the first segment.
    let nothing = ReplaceSegmentsRequest {
        partition: p,
        replaced: vec![ReplacedSegment::from(&old[0])],
        segment: None,
    };
    assert_eq!(
        replace(&h, nothing.clone()).await,
        RegisterSegmentOutcome::Registered {
            released_objects: 1
        }
    );
    assert_eq!(
        segments_of(&h, p)
            .await
            .iter()
            .map(|s| (s.base_offset, s.end_offset))
            .collect::<Vec<_>>(),
        vec![(3, 3), (4, 4)]
    );
    assert_eq!(fetch_offsets(&h, p, 0).await, (vec![3, 4], vec![]));
    assert_eq!(replace(&h, nothing).await, RegisterSegmentOutcome::Stale);
    let (_, log_start, hwm) = all_batches(&h, p).await;
    assert_eq!((log_start, hwm), (0, 5), "compaction moves no bound");
}

/// A replacement whose segments are not exactly the partition's run from the first one on is
/// `Stale` (a key, an offset, a segment skipped, one more than there is); a fenced or expired new
/// key is refused; a request that contradicts itself is invalid; an unknown partition is
/// `UnknownPartition`. None applies.
pub async fn replace_segments_checks(h: Harness) {
    let p = partition(&h).await;
    let old = three_segments(&h, p).await;
    let skip_one = ReplaceSegmentsRequest {
        replaced: vec![
            ReplacedSegment::from(&old[0]),
            ReplacedSegment::from(&old[2]),
        ],
        ..compacted_request(p, &old[..1], &seg_key(&h), (0, 1, 1))
    };
    let mut wrong_key = compacted_request(p, &old[..1], &seg_key(&h), (0, 1, 1));
    wrong_key.replaced[0].object_key = old[1].object_key.clone();
    let mut wrong_end = compacted_request(p, &old[..1], &seg_key(&h), (0, 0, 1));
    wrong_end.replaced[0].end_offset = 0;
    let mut too_many = compacted_request(p, &old, &seg_key(&h), (0, 4, 1));
    too_many.replaced.push(ReplacedSegment {
        object_key: seg_key(&h),
        base_offset: 5,
        end_offset: 6,
    });
    for stale in [skip_one, wrong_key, wrong_end, too_many] {
        let key = stale.segment.as_ref().map(|s| s.object_key.clone());
        assert_eq!(replace(&h, stale).await, RegisterSegmentOutcome::Stale);
        if let Some(key) = key {
            assert!(!is_known(&h, &key).await);
        }
    }

    let fenced = seg_key(&h);
    h.coordinator
        .fence_orphans(std::slice::from_ref(&fenced))
        .await
        .unwrap();
    let r = h
        .coordinator
        .replace_segments(compacted_request(p, &old[..1], &fenced, (0, 1, 1)))
        .await;
    assert!(matches!(r, Err(CoordinatorError::ObjectFenced(_))), "{r:?}");
    let expired = v7_key(h.clock.now_ms() - max_age_ms() - 1).replacen("wal/", "tiered/", 1);
    let r = h
        .coordinator
        .replace_segments(compacted_request(p, &old[..1], &expired, (0, 1, 1)))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "{r:?}"
    );

    let outside = compacted_request(p, &old[..1], &seg_key(&h), (0, 2, 1));
    let none_named = ReplaceSegmentsRequest {
        replaced: Vec::new(),
        ..compacted_request(p, &old[..1], &seg_key(&h), (0, 1, 1))
    };
    let out_of_order = ReplaceSegmentsRequest {
        replaced: vec![
            ReplacedSegment::from(&old[1]),
            ReplacedSegment::from(&old[0]),
        ],
        ..compacted_request(p, &old[..1], &seg_key(&h), (0, 1, 1))
    };
    let reused = compacted_request(p, &old[..1], &old[0].object_key, (0, 1, 1));
    let other_partition = ReplaceSegmentsRequest {
        partition: tp(p.topic_id, 7),
        ..compacted_request(p, &old[..1], &seg_key(&h), (0, 1, 1))
    };
    for bad in [outside, none_named, out_of_order, reused, other_partition] {
        let r = h.coordinator.replace_segments(bad).await;
        assert!(
            matches!(r, Err(CoordinatorError::InvalidRequest(_))),
            "{r:?}"
        );
    }
    let unknown = tp(fresh_id(), 0);
    let mut request = compacted_request(unknown, &old[..1], &seg_key(&h), (0, 1, 1));
    request.replaced = vec![ReplacedSegment::from(&old[0])];
    assert_eq!(
        replace(&h, request).await,
        RegisterSegmentOutcome::UnknownPartition
    );
    assert_eq!(segments_of(&h, p).await, old, "nothing applied");
    for s in &old {
        assert_eq!(
            info_of(&h, &s.object_key).await.marked_for_deletion_at,
            None
        );
    }
}

/// A compacted topic is due for tiering by age at `min(segment.ms, max.compaction.lag.ms)`
/// (Kafka's `LogConfig.maxSegmentMs`), a topic that only deletes at `segment.ms` whatever its
/// `max.compaction.lag.ms`.
pub async fn tiering_candidates_of_compacted_topics_by_max_lag(h: Harness) {
    let lagged = TopicConfig::default()
        .with_segment_ms(10_000)
        .with_max_compaction_lag_ms(3_000);
    let compacted = topic_config(
        &h,
        1,
        lagged
            .clone()
            .with_cleanup_policy(CleanupPolicy::CompactDelete),
    )
    .await;
    let deleting = topic_config(&h, 1, lagged).await;
    commit(
        &h,
        vec![
            one(tp(compacted, 0), 10, START_MS),
            one(tp(deleting, 0), 10, START_MS),
        ],
    )
    .await;
    let due = async |now: i64| {
        h.coordinator
            .tiering_candidates(now, 0, None, 10)
            .await
            .expect("tiering_candidates")
            .iter()
            .map(|c| c.partition)
            .collect::<Vec<_>>()
    };
    assert!(due(START_MS + 2_999).await.is_empty());
    assert_eq!(due(START_MS + 3_000).await, vec![tp(compacted, 0)]);
    let mut both = vec![tp(compacted, 0), tp(deleting, 0)];
    both.sort();
    assert_eq!(due(START_MS + 10_000).await, both);
}
