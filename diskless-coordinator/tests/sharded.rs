//! Tests of the sharded coordinator router: conformance, placement persistence, owner lists,
//! partial failures, hand-over, and equivalence with one coordinator under random workloads.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{find_from, list_offset, plain, request};
use diskless_coordinator::sharded::{
    FileShardMap, MemoryShardMap, PartialCommitError, ShardMapStore, ShardedConfig,
    ShardedCoordinator,
};
use diskless_coordinator::sqlite::SqliteCoordinator;
use diskless_coordinator::*;
use diskless_testkit::coordinator::conformance::START_MS;
use diskless_testkit::coordinator::{CommitFaults, FaultyCoordinator, InMemoryCoordinator};
use diskless_testkit::coordinator_conformance;
use diskless_testkit::keys::v7_key;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

fn model_shards(clock: &Arc<ManualClock>, n: usize) -> Vec<Arc<dyn BatchCoordinator>> {
    (0..n)
        .map(|_| Arc::new(InMemoryCoordinator::new(clock.clone())) as Arc<dyn BatchCoordinator>)
        .collect()
}

async fn sqlite_shards(clock: &Arc<ManualClock>, n: usize) -> Vec<Arc<dyn BatchCoordinator>> {
    let mut shards: Vec<Arc<dyn BatchCoordinator>> = Vec::new();
    for _ in 0..n {
        shards.push(Arc::new(
            SqliteCoordinator::in_memory(clock.clone()).await.unwrap(),
        ));
    }
    shards
}

fn config(seed: u64) -> ShardedConfig {
    ShardedConfig::default()
        .with_seed(seed)
        .with_max_commit_age(Duration::from_secs(600))
}

async fn router(
    shards: Vec<Arc<dyn BatchCoordinator>>,
    clock: &Arc<ManualClock>,
) -> ShardedCoordinator {
    ShardedCoordinator::open(
        shards,
        Arc::new(MemoryShardMap::new()),
        clock.clone(),
        config(42),
    )
    .await
    .unwrap()
}

/// Two routers over the same three model shards and the same map store (seeds 1 and 2).
async fn two_routers(clock: &Arc<ManualClock>) -> (ShardedCoordinator, ShardedCoordinator) {
    let shards = model_shards(clock, 3);
    let store: Arc<dyn ShardMapStore> = Arc::new(MemoryShardMap::new());
    let a = ShardedCoordinator::open(shards.clone(), store.clone(), clock.clone(), config(1))
        .await
        .unwrap();
    let b = ShardedCoordinator::open(shards, store, clock.clone(), config(2))
        .await
        .unwrap();
    (a, b)
}

/// A one-record batch of `size` bytes for `p` at timestamp `ts`.
fn batch(p: TopicIdPartition, size: u32, ts: i64) -> CommitBatch {
    plain(p, 1, size, ts)
}

/// A commit of `key`: one 10-byte batch at START_MS to each of `partitions`, in that order.
fn ten_bytes_each(
    key: &str,
    partitions: impl IntoIterator<Item = TopicIdPartition>,
) -> CommitFileRequest {
    let batches = partitions
        .into_iter()
        .map(|p| batch(p, 10, START_MS))
        .collect();
    request(key, batches)
}

async fn create(c: &dyn BatchCoordinator, id: u128, partitions: i32, config: TopicConfig) -> Uuid {
    let topic_id = Uuid::from_u128(id);
    common::create_topic(c, topic_id, &format!("t{id}"), partitions, config).await;
    topic_id
}

/// The partition of `topic` (of 3) that `r` places on `shard`.
fn partition_on(r: &ShardedCoordinator, topic: Uuid, shard: ShardId) -> TopicIdPartition {
    (0..3)
        .map(|i| TopicIdPartition::new(topic, i))
        .find(|tp| r.shard_of(*tp) == Some(shard))
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Conformance

coordinator_conformance!(single_model_shard, async |clock| {
    Arc::new(router(model_shards(&clock, 1), &clock).await)
});

// Cases that check something the router defines differently on purpose: the owner list (the
// router replaces it with the shuffled list of the shards it committed to), and the order of a
// capped producer expiry across topics (the router expires shard by shard; within a shard the
// order is the contract's — see `capped_producer_expiry_goes_shard_by_shard`).
coordinator_conformance!(
    three_model_shards,
    async |clock| Arc::new(router(model_shards(&clock, 3), &clock).await),
    skip = [object_live_bytes_and_marking, producer_expiry_cap_and_order],
);

coordinator_conformance!(
    three_sqlite_shards,
    async |clock| Arc::new(router(sqlite_shards(&clock, 3).await, &clock).await),
    // As `three_model_shards`.
    skip = [object_live_bytes_and_marking, producer_expiry_cap_and_order],
);

// ---------------------------------------------------------------------------------------------
// Placement

#[tokio::test]
async fn placement_is_stored_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let map_path = dir.path().join("shards.map");
    let clock = ManualClock::new(START_MS);
    let mut shards = Vec::new();
    for i in 0..3 {
        shards.push(Arc::new(
            SqliteCoordinator::open(
                dir.path().join(format!("shard-{i}.db")),
                sqlite::SqliteOptions::default(),
                clock.clone(),
            )
            .await
            .unwrap(),
        ) as Arc<dyn BatchCoordinator>);
    }
    let store = Arc::new(FileShardMap::open(&map_path).await.unwrap());
    let r = ShardedCoordinator::open(shards.clone(), store, clock.clone(), config(1))
        .await
        .unwrap();
    let a = create(&r, 1, 4, TopicConfig::default()).await;
    let b = create(&r, 2, 5, TopicConfig::default()).await;
    let before = r.placements();
    // Partitions spread evenly: 9 partitions over 3 shards, 3 each.
    let mut per_shard = BTreeMap::new();
    for p in before.values().flat_map(|p| p.iter()) {
        *per_shard.entry(*p).or_insert(0) += 1;
    }
    assert_eq!(
        per_shard.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
    // Every shard holds both topics.
    for s in &shards {
        assert_eq!(s.list_topics().await.unwrap().len(), 2);
    }
    drop(r);

    // A new router on the same file routes identically.
    let store = Arc::new(FileShardMap::open(&map_path).await.unwrap());
    let r = ShardedCoordinator::open(shards.clone(), store, clock.clone(), config(2))
        .await
        .unwrap();
    assert_eq!(r.placements(), before);
    for (topic, n) in [(a, 4), (b, 5)] {
        for p in 0..n {
            let tp = TopicIdPartition::new(topic, p);
            let shard = r.shard_of(tp).unwrap();
            let res = r
                .commit_file(ten_bytes_each(&v7_key(START_MS), [tp]))
                .await
                .unwrap();
            assert_eq!(res[0].error, ErrorCode::None);
            // The batch is in the shard the stored map names, and nowhere else.
            for (i, s) in shards.iter().enumerate() {
                let hw = list_offset(s.as_ref(), tp, LATEST_TIMESTAMP).await.offset;
                assert_eq!(hw, i64::from(i as u32 == shard), "partition {tp} shard {i}");
            }
        }
    }
    assert_eq!(r.list_topics().await.unwrap().len(), 2);
    r.delete_topic(a).await.unwrap();
    assert!(r.shard_of(TopicIdPartition::new(a, 0)).is_none());
    let store = FileShardMap::open(&map_path).await.unwrap();
    assert!(!store.load().await.unwrap().contains_key(&a));
    // A router with fewer shards than the stored map names refuses to open.
    let store = Arc::new(FileShardMap::open(&map_path).await.unwrap());
    assert!(
        ShardedCoordinator::open(shards[..1].to_vec(), store, clock.clone(), config(3))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_half_created_topic_is_completed_by_a_retry() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let r = router(shards.clone(), &clock).await;
    let req = CreateTopicRequest {
        topic_id: Uuid::from_u128(5),
        name: "t".into(),
        partitions: 3,
        config: TopicConfig::default(),
    };
    // As if an earlier attempt had reached shards 0 and 2 only.
    shards[0].create_topic(req.clone()).await.unwrap();
    shards[2].create_topic(req.clone()).await.unwrap();
    r.create_topic(req.clone()).await.unwrap();
    for s in &shards {
        assert_eq!(s.list_topics().await.unwrap().len(), 1);
    }
    // Now complete: a second creation is a duplicate.
    assert!(matches!(
        r.create_topic(req.clone()).await,
        Err(CoordinatorError::TopicAlreadyExists(_))
    ));
    // Another topic with the same name is refused without touching the map.
    let other = CreateTopicRequest {
        topic_id: Uuid::from_u128(6),
        ..req
    };
    assert!(matches!(
        r.create_topic(other).await,
        Err(CoordinatorError::TopicAlreadyExists(_))
    ));
    assert!(!r.placements().contains_key(&Uuid::from_u128(6)));
}

// ---------------------------------------------------------------------------------------------
// Commits, owners, hand-over

#[tokio::test]
async fn commit_splits_by_shard_and_merges_in_request_order() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let r = router(shards.clone(), &clock).await;
    let t = create(&r, 1, 3, TopicConfig::default()).await;
    let p = |i| TopicIdPartition::new(t, i);
    let mut first_owners = BTreeMap::new();
    for round in 0..30i64 {
        let key = v7_key(START_MS);
        let res = r
            .commit_file(request(
                &key,
                vec![
                    batch(p(2), 10, START_MS),
                    batch(p(0), 20, START_MS),
                    batch(TopicIdPartition::new(Uuid::from_u128(99), 0), 5, START_MS),
                    batch(p(2), 30, START_MS),
                    batch(p(1), 40, START_MS),
                ],
            ))
            .await
            .unwrap();
        let offsets: Vec<(ErrorCode, i64)> = res.iter().map(|r| (r.error, r.base_offset)).collect();
        assert_eq!(
            offsets,
            vec![
                (ErrorCode::None, 2 * round),
                (ErrorCode::None, round),
                (ErrorCode::UnknownTopicOrPartition, -1),
                (ErrorCode::None, 2 * round + 1),
                (ErrorCode::None, round),
            ]
        );
        // Every shard got the same owner list, a permutation of the three shards.
        let mut lists = Vec::new();
        for s in &shards {
            lists.push(s.object_info(&key).await.unwrap().unwrap().owners);
        }
        assert!(lists.iter().all(|l| *l == lists[0]));
        let mut sorted = lists[0].clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2]);
        *first_owners.entry(lists[0][0]).or_insert(0) += 1;
        let merged = r.object_info(&key).await.unwrap().unwrap();
        assert_eq!(merged.live_bytes, 100);
    }
    // The shuffle spreads responsibility: every shard is first owner of some objects.
    assert_eq!(first_owners.len(), 3, "{first_owners:?}");
}

#[tokio::test]
async fn an_object_is_deletable_only_when_every_owner_released_it() {
    let clock = ManualClock::new(START_MS);
    let r = router(model_shards(&clock, 3), &clock).await;
    let t = create(&r, 1, 3, TopicConfig::default()).await;
    let p = |i| TopicIdPartition::new(t, i);
    let key = v7_key(START_MS);
    r.commit_file(ten_bytes_each(&key, (0..3).map(p)))
        .await
        .unwrap();
    let owners = r.object_info(&key).await.unwrap().unwrap().owners;
    // Release the partitions in owner order: responsibility moves down the list.
    for (i, owner) in owners.iter().enumerate() {
        assert_eq!(r.responsible_owner(&key).await.unwrap(), Some(*owner));
        assert!(r.objects_to_delete(i64::MAX, 100).await.unwrap().is_empty());
        assert_eq!(
            r.object_info(&key)
                .await
                .unwrap()
                .unwrap()
                .marked_for_deletion_at,
            None
        );
        clock.advance(1000);
        let res = r
            .delete_records(&[DeleteRecordsRequest {
                partition: partition_on(&r, t, *owner),
                offset: -1,
            }])
            .await
            .unwrap();
        assert_eq!(res[0].error, ErrorCode::None);
        let _ = i;
    }
    assert_eq!(r.responsible_owner(&key).await.unwrap(), None);
    // Marked when the last owner released it.
    let last_mark = START_MS + 3000;
    assert!(
        r.objects_to_delete(last_mark, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let to_delete = r.objects_to_delete(last_mark + 1, 100).await.unwrap();
    assert_eq!(to_delete.len(), 1);
    assert_eq!(to_delete[0].marked_for_deletion_at, last_mark);
    assert_eq!(
        r.object_info(&key)
            .await
            .unwrap()
            .unwrap()
            .marked_for_deletion_at,
        Some(last_mark)
    );
    r.confirm_deleted(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(
        r.known_objects(std::slice::from_ref(&key)).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(r.object_info(&key).await.unwrap(), None);
}

#[tokio::test]
async fn partial_commits_are_outcome_unknown_and_settle_after_the_horizon() {
    let clock = ManualClock::new(START_MS);
    let flaky: Vec<Arc<FaultyCoordinator>> = model_shards(&clock, 3)
        .into_iter()
        .map(CommitFaults::wrap)
        .collect();
    let shards: Vec<Arc<dyn BatchCoordinator>> = flaky
        .iter()
        .map(|f| f.clone() as Arc<dyn BatchCoordinator>)
        .collect();
    let r = router(shards, &clock).await;
    let t = create(&r, 1, 3, TopicConfig::default()).await;
    let on = |shard: ShardId| partition_on(&r, t, shard);

    // Shard 1 is down: shards 0 and 2 apply, the whole commit is OutcomeUnknown.
    flaky[1].set_failing(true);
    let key = v7_key(START_MS);
    let all = [on(0), on(1), on(2)];
    let err = r.commit_file(ten_bytes_each(&key, all)).await.unwrap_err();
    let CoordinatorError::OutcomeUnknown(source) = &err else {
        panic!("{err:?}")
    };
    let partial = source.downcast_ref::<PartialCommitError>().unwrap();
    assert_eq!(partial.applied, vec![0, 2]);
    assert_eq!(partial.failed.len(), 1);
    assert_eq!(
        r.known_objects(std::slice::from_ref(&key)).await.unwrap(),
        vec![key.clone()]
    );

    // Every shard down: the error says nothing was applied.
    for f in &flaky {
        f.set_failing(true);
    }
    let err = r
        .commit_file(ten_bytes_each(&v7_key(START_MS), all))
        .await
        .unwrap_err();
    assert!(err.is_retriable(), "{err:?}");
    // Applied everywhere but one answer lost: OutcomeUnknown.
    for f in &flaky {
        f.set_failing(false);
    }
    flaky[2].set_losing(true);
    let err = r
        .commit_file(ten_bytes_each(&v7_key(START_MS), all))
        .await
        .unwrap_err();
    assert!(matches!(err, CoordinatorError::OutcomeUnknown(_)));
    flaky[2].set_losing(false);

    // The partially committed object: shards 0 and 2 release it; shard 1 never knew it.
    for s in [0, 2] {
        r.delete_records(&[DeleteRecordsRequest {
            partition: on(s),
            offset: -1,
        }])
        .await
        .unwrap();
    }
    async fn deletable(r: &ShardedCoordinator, key: &str) -> bool {
        r.objects_to_delete(i64::MAX, 100)
            .await
            .unwrap()
            .iter()
            .any(|o| o.object_key == key)
    }
    // Not yet: shard 1's commit could in principle still land until 2 × max_commit_age.
    clock.advance(1_199_000);
    assert!(!deletable(&r, &key).await);
    clock.advance(2_000);
    assert!(deletable(&r, &key).await);
}

#[tokio::test]
async fn commits_past_the_deadline_are_refused() {
    let clock = ManualClock::new(START_MS);
    let r = router(model_shards(&clock, 2), &clock).await;
    let t = create(&r, 1, 2, TopicConfig::default()).await;
    let old = v7_key(START_MS - 600_001);
    let err = r
        .commit_file(ten_bytes_each(&old, [TopicIdPartition::new(t, 0)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CoordinatorError::DeadlineExceeded(_)) && err.certainly_not_applied(),
        "{err:?}"
    );
    assert!(r.known_objects(&[old]).await.unwrap().is_empty());
    let fresh = v7_key(START_MS - 599_000);
    r.commit_file(ten_bytes_each(&fresh, [TopicIdPartition::new(t, 0)]))
        .await
        .unwrap();
    // Unroutable-only commits are registered (and marked) on one shard.
    let lost = v7_key(START_MS);
    let res = r
        .commit_file(ten_bytes_each(
            &lost,
            [TopicIdPartition::new(Uuid::from_u128(9), 0)],
        ))
        .await
        .unwrap();
    assert_eq!(res[0].error, ErrorCode::UnknownTopicOrPartition);
    let info = r.object_info(&lost).await.unwrap().unwrap();
    assert_eq!(info.owners.len(), 1);
    assert_eq!(info.marked_for_deletion_at, Some(START_MS));
}

// ---------------------------------------------------------------------------------------------
// Random workloads: a router over 3 shards answers like one coordinator.

#[derive(Clone, Debug)]
enum Step {
    Create {
        slot: u8,
        partitions: i32,
        retention_ms: i64,
        retention_bytes: i64,
    },
    Delete {
        slot: u8,
    },
    Commit {
        batches: Vec<(u8, i32, u32)>,
    },
    DeleteRecords {
        slot: u8,
        partition: i32,
        back: i64,
    },
    Advance(i64),
    Retention,
    Gc {
        age: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0u8..3, 1i32..5, prop_oneof![Just(-1i64), 100i64..5000], prop_oneof![Just(-1i64), 50i64..400])
            .prop_map(|(slot, partitions, retention_ms, retention_bytes)| Step::Create { slot, partitions, retention_ms, retention_bytes }),
        1 => (0u8..3).prop_map(|slot| Step::Delete { slot }),
        6 => prop::collection::vec((0u8..3, 0i32..5, 1u32..120), 0..6).prop_map(|batches| Step::Commit { batches }),
        2 => (0u8..3, 0i32..5, 0i64..4).prop_map(|(slot, partition, back)| Step::DeleteRecords { slot, partition, back }),
        3 => (1i64..2000).prop_map(Step::Advance),
        2 => Just(Step::Retention),
        2 => (0i64..3000).prop_map(|age| Step::Gc { age }),
    ]
}

fn same_object(a: Option<ObjectInfo>, b: Option<ObjectInfo>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(mut a), Some(mut b)) => {
            a.owners.clear();
            b.owners.clear();
            a == b
        }
        _ => false,
    }
}

async fn run_equivalence(steps: Vec<Step>, sqlite: bool) {
    let clock = ManualClock::new(START_MS);
    let shards = if sqlite {
        sqlite_shards(&clock, 3).await
    } else {
        model_shards(&clock, 3)
    };
    let real = router(shards, &clock).await;
    let model = InMemoryCoordinator::new(clock.clone());
    let mut keys = Vec::new();
    let slot_id = |slot: u8| Uuid::from_u128(100 + u128::from(slot));
    for (i, s) in steps.iter().enumerate() {
        match s.clone() {
            Step::Create {
                slot,
                partitions,
                retention_ms,
                retention_bytes,
            } => {
                let req = CreateTopicRequest {
                    topic_id: slot_id(slot),
                    name: format!("topic-{slot}"),
                    partitions,
                    config: TopicConfig {
                        retention_ms,
                        retention_bytes,
                        ..TopicConfig::default()
                    },
                };
                let a = real
                    .create_topic(req.clone())
                    .await
                    .map_err(|e| e.error_code());
                let b = model.create_topic(req).await.map_err(|e| e.error_code());
                assert_eq!(a, b, "step {i}: {s:?}");
            }
            Step::Delete { slot } => {
                let a = real
                    .delete_topic(slot_id(slot))
                    .await
                    .map_err(|e| e.error_code());
                let b = model
                    .delete_topic(slot_id(slot))
                    .await
                    .map_err(|e| e.error_code());
                assert_eq!(a, b, "step {i}: {s:?}");
            }
            Step::Commit { batches } => {
                let key = format!("wal/{i:06}");
                keys.push(key.clone());
                let now = clock.now_ms();
                let req = request(
                    &key,
                    batches
                        .iter()
                        .map(|(slot, p, size)| {
                            batch(TopicIdPartition::new(slot_id(*slot), *p), *size, now)
                        })
                        .collect(),
                );
                let a = real.commit_file(req.clone()).await.unwrap();
                let b = model.commit_file(req).await.unwrap();
                assert_eq!(a, b, "step {i}: {s:?}");
            }
            Step::DeleteRecords {
                slot,
                partition,
                back,
            } => {
                let tp = TopicIdPartition::new(slot_id(slot), partition);
                let hw = list_offset(&model, tp, LATEST_TIMESTAMP).await.offset;
                let req = [DeleteRecordsRequest {
                    partition: tp,
                    offset: (hw - back).max(0),
                }];
                let a = real.delete_records(&req).await.unwrap();
                let b = model.delete_records(&req).await.unwrap();
                assert_eq!(a, b, "step {i}: {s:?}");
            }
            Step::Advance(ms) => clock.advance(ms),
            Step::Retention => {
                let a = real.enforce_retention(u32::MAX).await.unwrap();
                let b = model.enforce_retention(u32::MAX).await.unwrap();
                assert_eq!(
                    (a.batches_deleted, a.bytes_deleted),
                    (b.batches_deleted, b.bytes_deleted),
                    "step {i}"
                );
            }
            Step::Gc { age } => {
                let before = clock.now_ms() - age;
                let a = real.objects_to_delete(before, 1000).await.unwrap();
                let b = model.objects_to_delete(before, 1000).await.unwrap();
                assert_eq!(a, b, "step {i}: {s:?}");
                let keys: Vec<String> = a.into_iter().map(|o| o.object_key).collect();
                real.confirm_deleted(&keys).await.unwrap();
                model.confirm_deleted(&keys).await.unwrap();
            }
        }
        // State: every partition's batches, every object.
        let mut finds = Vec::new();
        for slot in 0..3 {
            for p in 0..5 {
                finds.push(FindBatchesRequest {
                    partition: TopicIdPartition::new(slot_id(slot), p),
                    offset: 0,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                });
            }
        }
        let starts = model
            .list_offsets(
                &finds
                    .iter()
                    .map(|f| ListOffsetsRequest {
                        partition: f.partition,
                        timestamp: EARLIEST_TIMESTAMP,
                        isolation: Default::default(),
                    })
                    .collect::<Vec<_>>(),
            )
            .await
            .unwrap();
        for (f, s) in finds.iter_mut().zip(starts) {
            f.offset = s.offset.max(0);
        }
        assert_eq!(
            real.find_batches(&finds, u32::MAX).await.unwrap(),
            model.find_batches(&finds, u32::MAX).await.unwrap(),
            "state after step {i}"
        );
        // A small fetch budget over partitions of several shards answers the same too.
        assert_eq!(
            real.find_batches(&finds, 150).await.unwrap(),
            model.find_batches(&finds, 150).await.unwrap(),
            "budgeted find after step {i}"
        );
        for key in &keys {
            assert!(
                same_object(
                    real.object_info(key).await.unwrap(),
                    model.object_info(key).await.unwrap()
                ),
                "object {key} after step {i}"
            );
        }
        assert_eq!(
            real.known_objects(&keys).await.unwrap(),
            model.known_objects(&keys).await.unwrap()
        );
        assert_eq!(
            real.objects_to_delete(i64::MAX, u32::MAX).await.unwrap(),
            model.objects_to_delete(i64::MAX, u32::MAX).await.unwrap(),
            "objects to delete after step {i}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn three_model_shards_answer_like_one_coordinator(steps in prop::collection::vec(step(), 1..40)) {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run_equivalence(steps, false));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn three_sqlite_shards_answer_like_one_coordinator(steps in prop::collection::vec(step(), 1..30)) {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run_equivalence(steps, true));
    }
}

/// A router learns a topic created through another router on the same store (reloaded on the
/// first unknown partition) and routes it the same way.
#[tokio::test]
async fn a_router_learns_topics_created_through_another_router() {
    let clock = ManualClock::new(START_MS);
    let (a, b) = two_routers(&clock).await;
    let t = create(&a, 77, 3, TopicConfig::default()).await;
    assert_eq!(
        b.shard_of(TopicIdPartition::new(t, 0)),
        None,
        "not loaded yet"
    );
    let results = b
        .commit_file(ten_bytes_each(
            &v7_key(START_MS),
            (0..3).map(|p| TopicIdPartition::new(t, p)),
        ))
        .await
        .unwrap();
    assert!(
        results.iter().all(|r| r.error == ErrorCode::None),
        "{results:?}"
    );
    for p in 0..3 {
        let partition = TopicIdPartition::new(t, p);
        assert_eq!(b.shard_of(partition), a.shard_of(partition));
    }
    // What b committed, a reads.
    let found = find_from(&a, TopicIdPartition::new(t, 2), 0).await;
    assert_eq!(found.high_watermark, 1);
}

/// `list_topics` of a router lists a topic created through another router on the same map store
/// (issue #12 item 6: it used to stay invisible until something named its id).
#[tokio::test]
async fn list_topics_reloads_the_shard_map() {
    let clock = ManualClock::new(START_MS);
    let (a, b) = two_routers(&clock).await;
    // b has already loaded the map once (and, at the same clock time, is inside its reload limit).
    assert!(b.list_topics().await.unwrap().is_empty());
    let t = create(&a, 77, 3, TopicConfig::default()).await;
    let listed: Vec<Uuid> = b
        .list_topics()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.topic_id)
        .collect();
    assert_eq!(listed, vec![t]);
    assert_eq!(
        b.shard_of(TopicIdPartition::new(t, 1)),
        a.shard_of(TopicIdPartition::new(t, 1))
    );
}

/// Orphan fences go to every shard: a key is fenced only if no shard knows it, and a fenced key's
/// commit is refused on every shard.
#[tokio::test]
async fn fences_span_every_shard() {
    let clock = ManualClock::new(START_MS);
    let r = router(model_shards(&clock, 3), &clock).await;
    let t = create(&r, 5, 3, TopicConfig::default()).await;
    let committed = v7_key(START_MS);
    r.commit_file(ten_bytes_each(&committed, [TopicIdPartition::new(t, 2)]))
        .await
        .unwrap();
    let orphan = v7_key(START_MS);
    assert_eq!(
        r.fence_orphans(&[committed.clone(), orphan.clone()])
            .await
            .unwrap(),
        vec![orphan.clone()]
    );
    let refused = r
        .commit_file(ten_bytes_each(
            &orphan,
            (0..3).map(|p| TopicIdPartition::new(t, p)),
        ))
        .await;
    assert!(
        matches!(refused, Err(CoordinatorError::ObjectFenced(_))),
        "{refused:?}"
    );
    for p in 0..3 {
        let found = list_offset(&r, TopicIdPartition::new(t, p), LATEST_TIMESTAMP).await;
        assert_eq!(found.offset, i64::from(p == 2), "partition {p}");
    }
}

/// A capped producer expiry through the router expires every expired state eventually, at most the
/// cap per call, shard by shard.
#[tokio::test]
async fn capped_producer_expiry_goes_shard_by_shard() {
    let clock = ManualClock::new(START_MS);
    let r = router(model_shards(&clock, 3), &clock).await;
    let t = create(
        &r,
        9,
        6,
        TopicConfig {
            producer_id_expiration_ms: 1_000,
            ..TopicConfig::default()
        },
    )
    .await;
    let batches: Vec<CommitBatch> = (0..6)
        .map(|p| CommitBatch {
            producer_id: 10 + i64::from(p),
            producer_epoch: 0,
            base_sequence: 0,
            last_sequence: 0,
            ..batch(TopicIdPartition::new(t, p), 10, START_MS)
        })
        .collect();
    r.commit_file(request(&v7_key(START_MS), batches))
        .await
        .unwrap();
    // Expiry's floor (twice the shards' max_commit_age) is above the topic's 1 s.
    clock.advance(diskless_coordinator::producer_state_floor_ms(
        diskless_coordinator::DEFAULT_MAX_COMMIT_AGE,
    ));
    let mut expired = 0;
    let mut calls = 0;
    loop {
        let report = r.expire_producers(4).await.unwrap();
        assert!(report.expired <= 4);
        expired += report.expired;
        calls += 1;
        if !report.more {
            break;
        }
    }
    assert_eq!((expired, calls), (6, 2));
    for p in 0..6 {
        let state = r
            .producer_state(TopicIdPartition::new(t, p), 10 + i64::from(p))
            .await
            .unwrap();
        assert_eq!(state, None, "partition {p}");
    }
}

/// A commit that one shard refuses because the key is fenced there while another shard applies it is
/// a partial commit: `OutcomeUnknown` (never an error that would make the writer delete the object),
/// and the router does not hand the key to the orphan collector since one shard knows it.
#[tokio::test]
async fn a_fence_on_one_shard_makes_a_commit_partial_and_keeps_the_object() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 2);
    let r = router(shards.clone(), &clock).await;
    let t = create(&r, 11, 2, TopicConfig::default()).await;
    let (p0, p1) = (TopicIdPartition::new(t, 0), TopicIdPartition::new(t, 1));
    let (s0, s1) = (r.shard_of(p0).unwrap(), r.shard_of(p1).unwrap());
    assert_ne!(s0, s1, "the two partitions live on different shards");
    let key = v7_key(START_MS);
    // The orphan collector's fence reached only the second shard (say, the call failed half-way).
    assert_eq!(
        shards[s1 as usize]
            .fence_orphans(std::slice::from_ref(&key))
            .await
            .unwrap(),
        vec![key.clone()]
    );
    let result = r.commit_file(ten_bytes_each(&key, [p0, p1])).await;
    match result {
        Err(e @ CoordinatorError::OutcomeUnknown(_)) => assert!(!e.certainly_not_applied()),
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(
        shards[s0 as usize]
            .object_info(&key)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        shards[s1 as usize]
            .object_info(&key)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        r.fence_orphans(std::slice::from_ref(&key))
            .await
            .unwrap()
            .is_empty(),
        "a shard knows the object: it must not be collected"
    );
    assert_eq!(
        r.known_objects(std::slice::from_ref(&key)).await.unwrap(),
        vec![key.clone()]
    );
}

// ---------------------------------------------------------------------------------------------
// Admin operations (issue #18)

/// Producer-id blocks come from shard 0 alone, so two routers over the same shards never hand
/// out the same id.
#[tokio::test]
async fn routers_over_the_same_shards_share_one_producer_id_counter() {
    let clock = ManualClock::new(START_MS);
    let (a, b) = two_routers(&clock).await;
    let mut blocks = Vec::new();
    for i in 0..20u32 {
        let router = if i % 2 == 0 { &a } else { &b };
        let count = 1 + i * 13;
        blocks.push((count, router.allocate_producer_ids(count).await.unwrap()));
    }
    diskless_testkit::coordinator::conformance::assert_disjoint_blocks(&blocks);
    let highest = blocks.iter().map(|(_, b)| b.last()).max().unwrap();
    let from_shard_0 = a.shard(0).unwrap().allocate_producer_ids(1).await.unwrap();
    assert!(from_shard_0.first > highest, "{from_shard_0:?}");
    // The other shards' counters were never used.
    let from_shard_1 = a.shard(1).unwrap().allocate_producer_ids(1).await.unwrap();
    assert_eq!(from_shard_1.first, 0);
}

/// CreatePartitions through one router places the new partitions on the emptiest shards and
/// grows the topic on every shard; another router on the same map store routes them the same way
/// (after reloading the map, as for a new topic).
#[tokio::test]
async fn added_partitions_are_placed_and_routed_by_every_router() {
    let clock = ManualClock::new(START_MS);
    let (a, b) = two_routers(&clock).await;
    let t = create(&a, 90, 3, TopicConfig::default()).await;
    // b learns the topic as it is.
    let r = b
        .commit_file(ten_bytes_each(
            &v7_key(START_MS),
            (0..3).map(|p| TopicIdPartition::new(t, p)),
        ))
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
    a.create_partitions(t, 7).await.unwrap();
    let placement = a.placements()[&t].clone();
    assert_eq!(placement.len(), 7);
    assert_eq!(&placement[..3], &*b.placements()[&t], "old partitions stay");
    let mut per_shard = BTreeMap::new();
    for s in placement.iter() {
        *per_shard.entry(*s).or_insert(0) += 1;
    }
    assert_eq!(
        per_shard.values().copied().collect::<Vec<_>>(),
        vec![3, 2, 2]
    );
    for s in 0..3 {
        let topics = a.shard(s).unwrap().list_topics().await.unwrap();
        assert_eq!(topics[0].partitions, 7, "shard {s}");
    }
    assert_eq!(b.list_topics().await.unwrap()[0].partitions, 7);
    // b reloads the map on the first partition beyond what it knows (at most once a second).
    clock.advance(1_000);
    let r = b
        .commit_file(ten_bytes_each(
            &v7_key(START_MS + 1_000),
            (3..7).map(|p| TopicIdPartition::new(t, p)),
        ))
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.error == ErrorCode::None), "{r:?}");
    for p in 0..7 {
        let tp = TopicIdPartition::new(t, p);
        let shard = a.shard_of(tp).unwrap();
        assert_eq!(b.shard_of(tp), Some(shard));
        // The batch is on the shard the map names, and nowhere else.
        for s in 0..3u32 {
            let hw = list_offset(a.shard(s).unwrap().as_ref(), tp, LATEST_TIMESTAMP)
                .await
                .offset;
            assert_eq!(hw, i64::from(s == shard), "partition {tp} shard {s}");
        }
    }
    // Growing again through b extends what a stored.
    b.create_partitions(t, 8).await.unwrap();
    assert_eq!(&b.placements()[&t][..7], &*placement);
    assert!(matches!(
        a.create_partitions(t, 8).await,
        Err(CoordinatorError::InvalidPartitions(_))
    ));
}

/// A CreatePartitions that failed half-way (shard 0 grew, the map or other shards did not) is
/// completed by retrying it; a retry of a complete one is INVALID_PARTITIONS.
#[tokio::test]
async fn a_half_done_growth_is_completed_by_a_retry() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let r = router(shards.clone(), &clock).await;
    let t = create(&r, 91, 3, TopicConfig::default()).await;
    // As if an earlier attempt had grown shard 0 only.
    shards[0].create_partitions(t, 5).await.unwrap();
    r.create_partitions(t, 5).await.unwrap();
    assert_eq!(r.placements()[&t].len(), 5);
    for s in &shards {
        assert_eq!(s.list_topics().await.unwrap()[0].partitions, 5);
    }
    assert!(matches!(
        r.create_partitions(t, 5).await,
        Err(CoordinatorError::InvalidPartitions(_))
    ));
    // As if an earlier attempt had grown shards 0 and 1, but neither stored the map nor grew
    // shard 2.
    shards[0].create_partitions(t, 6).await.unwrap();
    shards[1].create_partitions(t, 6).await.unwrap();
    r.create_partitions(t, 6).await.unwrap();
    for s in &shards {
        assert_eq!(s.list_topics().await.unwrap()[0].partitions, 6);
    }
    let tp = TopicIdPartition::new(t, 5);
    let res = r
        .commit_file(ten_bytes_each(&v7_key(START_MS), [tp]))
        .await
        .unwrap();
    assert_eq!(res[0].error, ErrorCode::None);
}

/// A grown placement is stored: a router reopened on the same map file routes the new partitions
/// to the same shards.
#[tokio::test]
async fn a_grown_placement_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let map_path = dir.path().join("shards.map");
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let store = Arc::new(FileShardMap::open(&map_path).await.unwrap());
    let r = ShardedCoordinator::open(shards.clone(), store, clock.clone(), config(1))
        .await
        .unwrap();
    let t = create(&r, 92, 2, TopicConfig::default()).await;
    r.create_partitions(t, 6).await.unwrap();
    let before = r.placements();
    drop(r);
    let store = Arc::new(FileShardMap::open(&map_path).await.unwrap());
    let r = ShardedCoordinator::open(shards, store, clock.clone(), config(2))
        .await
        .unwrap();
    assert_eq!(r.placements(), before);
    assert_eq!(before[&t].len(), 6);
}

/// A config change reaches every shard, so each shard's retention pass and commits follow it.
#[tokio::test]
async fn a_config_change_reaches_every_shard() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let r = router(shards.clone(), &clock).await;
    let t = create(&r, 93, 3, TopicConfig::default()).await;
    let config = TopicConfig::default()
        .with_retention_ms(1_000)
        .with_timestamp_type(TimestampType::LogAppendTime);
    r.alter_topic_config(t, config.clone()).await.unwrap();
    for s in &shards {
        assert_eq!(s.list_topics().await.unwrap()[0].config, config);
    }
    let res = r
        .commit_file(ten_bytes_each(
            &v7_key(START_MS),
            (0..3).map(|p| TopicIdPartition::new(t, p)),
        ))
        .await
        .unwrap();
    assert!(res.iter().all(|r| r.log_append_time == START_MS), "{res:?}");
    clock.advance(1_001);
    assert_eq!(r.enforce_retention(100).await.unwrap().batches_deleted, 3);
    assert!(matches!(
        r.alter_topic_config(Uuid::from_u128(12345), config).await,
        Err(CoordinatorError::UnknownTopic(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Tiered segments (issue #15)

/// Candidates come from every shard, each partition from its own shard; a registration goes to
/// the partition's shard, whose id becomes the segment object's one owner whatever the request
/// said.
#[tokio::test]
async fn tiering_is_routed_to_the_partition_shard() {
    let clock = ManualClock::new(START_MS);
    let shards = model_shards(&clock, 3);
    let r = router(shards.clone(), &clock).await;
    let t = create(&r, 1, 3, TopicConfig::default().with_segment_ms(1)).await;
    let wal = v7_key(START_MS);
    r.commit_file(ten_bytes_each(
        &wal,
        (0..3).map(|i| TopicIdPartition::new(t, i)),
    ))
    .await
    .unwrap();
    clock.advance(1);
    let candidates = r
        .tiering_candidates(START_MS + 1, 0, None, 10)
        .await
        .unwrap();
    let listed: Vec<TopicIdPartition> = candidates.iter().map(|c| c.partition).collect();
    assert_eq!(
        listed,
        (0..3)
            .map(|i| TopicIdPartition::new(t, i))
            .collect::<Vec<_>>()
    );
    for shard in 0..3 {
        let own = shards[shard as usize]
            .tiering_candidates(START_MS + 1, 0, None, 10)
            .await
            .unwrap();
        assert_eq!(own.len(), 1, "shard {shard} lists its own partition only");
        assert_eq!(r.shard_of(own[0].partition), Some(shard));
    }
    let p = partition_on(&r, t, 2);
    let plan = r
        .segment_plan(&SegmentPlanRequest {
            partition: p,
            max_bytes: u64::MAX,
            max_batches: 10,
            committed_before_ms: START_MS + 1,
        })
        .await
        .unwrap();
    assert_eq!(plan.batches.len(), 1);
    let key = v7_key(START_MS + 1).replacen("wal/", "tiered/", 1);
    let layout = SegmentLayoutSizes {
        log: 10,
        ..Default::default()
    };
    let outcome = r
        .register_segment(RegisterSegmentRequest {
            partition: p,
            object_key: key.clone(),
            object_size: layout.object_size(),
            uploader_broker_id: 1,
            layout,
            base_offset: 0,
            end_offset: 0,
            batch_count: 1,
            batch_bytes: 10,
            max_timestamp: START_MS,
            max_timestamp_offset: 0,
            owner: 0,
        })
        .await
        .unwrap();
    assert!(matches!(outcome, RegisterSegmentOutcome::Registered { .. }));
    assert_eq!(r.object_info(&key).await.unwrap().unwrap().owners, vec![2]);
    for shard in [0, 1] {
        assert!(shards[shard].object_info(&key).await.unwrap().is_none());
    }
    assert_eq!(
        shards[2]
            .list_tiered_segments(p, 0, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(r.list_tiered_segments(p, 0, 10).await.unwrap().len(), 1);
    // The WAL object is still held by the other two shards.
    assert_eq!(r.object_info(&wal).await.unwrap().unwrap().live_bytes, 20);
    let after = r
        .tiering_candidates(START_MS + 1, 0, None, 10)
        .await
        .unwrap();
    assert!(after.iter().all(|c| c.partition != p));
}
