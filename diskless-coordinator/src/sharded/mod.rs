//! Sharded coordinators (KIP-1164): a [`ShardedCoordinator`] routes every call to the coordinator
//! shard owning each partition, commits a WAL segment to every shard with batches in it under one
//! shuffled owner list, and hands an object's deletion down that list.
//!
//! # Placement
//!
//! A partition belongs to exactly one shard, chosen when the partition is created (with its topic,
//! or by [`BatchCoordinator::create_partitions`]) and stored in a [`ShardMapStore`]
//! ([`FileShardMap`] on disk, [`MemoryShardMap`] in memory, or the host's own cluster metadata). The
//! router reads the stored map when it opens, so a restart routes identically, and adding shards
//! later never moves an existing partition. New partitions go to the shard holding the fewest
//! partitions (ties: lowest id), so shards fill evenly.
//!
//! Every topic is created on **every** shard (same id, name, partition count and config): a shard
//! holds all partitions of the topic but only ever receives batches for its own. This keeps topic
//! name uniqueness, `list_topics` and topic deletion simple; an unused partition costs a row.
//! Creation runs shard 0 first (the serialisation point for name and id uniqueness), then stores the
//! placement, then creates the topic on the other shards. A creation that failed half-way is completed
//! by retrying it (shards that already have the same topic count as done).
//!
//! CreatePartitions follows the same order: shard 0 grows the topic (deciding
//! `INVALID_PARTITIONS`), then the grown placement is stored ([`ShardMapStore::extend`]), then the
//! other shards grow it. A growth that failed half-way is completed by retrying it. Topic
//! configuration changes go to every shard. Producer-id blocks come from shard 0 alone, so every
//! router over the same shards shares one counter.
//!
//! # Commits and owner lists
//!
//! `commit_file` splits the batches by shard and commits to each shard concurrently, each with the
//! same owner list: the shards that received batches, shuffled by a seeded generator so that no
//! shard is first (responsible) for every object. The owner list a caller passes is replaced. The
//! results are merged back in request order. Batches of partitions no shard owns are answered
//! `UNKNOWN_TOPIC_OR_PARTITION`; an object none of whose batches is routable is still registered on
//! one shard (with no batches), so that it is marked at once and cleaned after the grace period.
//!
//! **Cross-shard atomicity.** Each shard's commit is atomic on its own, but the commit across shards
//! is not (KIP-1164 accepts this). If some shards applied the commit and others failed, the call
//! fails with [`CoordinatorError::OutcomeUnknown`] (source: [`PartialCommitError`]) — never with an
//! error that claims nothing was applied, because the writer deletes the object after such errors.
//! The producer's retry is then recognised as a duplicate by the shards that applied it (idempotent
//! producers) and appended by the others. Non-idempotent producers may see duplicates, as with any
//! `REQUEST_TIMED_OUT` in Kafka. Calls that fail on every shard return the first shard's error, or
//! `OutcomeUnknown` if any shard's outcome is unknown.
//!
//! **Commit deadline.** Every shard refuses, inside its own commit transaction, a commit of a key
//! whose UUID v7 time is older than its `max_commit_age` (`crate::check_commit_deadline`); the router
//! refuses it early too ([`ShardedConfig::max_commit_age`], router clock), saving the round trips.
//! So no shard learns of an object later than `max_commit_age` after its key time (give every
//! shard a `max_commit_age` no larger than the router's): the hand-over below relies on it. The
//! orphan collector relies on [`BatchCoordinator::fence_orphans`] instead, which the router sends to
//! every shard.
//!
//! # Hand-over and deletion
//!
//! Each shard tracks its own live bytes of an object and marks the object when they reach zero. The
//! object is responsible on the first owner in its list that still has live bytes
//! ([`ShardedCoordinator::responsible_owner`]); as owners' live bytes reach zero, responsibility passes
//! down the list, and the object becomes deletable when the last owner marks it. The router's
//! `objects_to_delete` answers exactly those objects: every owner marked it before `marked_before_ms`
//! (its marking time is the latest owner's). An owner that does not know the object at all (its part
//! of a partial commit failed, or it already confirmed the deletion) counts as released only once the
//! key's UUID v7 time is older than `2 × max_commit_age`, when no commit of it can still land.
//! `confirm_deleted` goes to every shard; `known_objects` is the union of the shards' answers.
//!
//! Each shard is asked for a page of its oldest marked objects. Objects a shard marked long ago may
//! still be held by other owners (a topic with long retention shares segments with one with short
//! retention), so when a page yields too few deletable objects and some shard's page was full, the
//! router asks again with pages four times larger, up to [`ShardedConfig::max_delete_scan`]. More
//! held objects than that on one shard delay (never advance) the deletion of its later objects;
//! produce gateways keep most objects single-owner, which avoids this. A true per-shard hand-over
//! (each shard listing only objects it is responsible for) needs coordinator support (a cursor in
//! `objects_to_delete`, or a hand-over call between shards).

mod map;

pub use map::{FileShardMap, MemoryShardMap, Placements, ShardMapStore};

use crate::config::{at_least_one, positive, with_setters};
use crate::rules::in_request_order;
use crate::{
    BatchCoordinator, Capabilities, Clock, CommitBatchResult, CommitFileRequest, CoordinatorError,
    CreateTopicRequest, DeleteRecordsRequest, DeleteRecordsResponse, ErrorCode, FindBatchesRequest,
    FindBatchesResponse, ListOffsetsRequest, ListOffsetsResponse, ObjectInfo, ObjectKind,
    ObjectToDelete, ProducerExpiryReport, ProducerIdBlock, ProducerState, RegisterSegmentOutcome,
    RegisterSegmentRequest, ReplaceSegmentsRequest, RetentionReport, SegmentPlan,
    SegmentPlanRequest, ShardId, TieredSegment, TieringCandidate, TopicConfig, TopicIdPartition,
    TopicInfo, TxnAnswer, TxnMarker, TxnMarkerResult, TxnRecord, TxnTransition,
};
use async_trait::async_trait;
use futures::future::join_all;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use uuid::Uuid;

/// Settings of a [`ShardedCoordinator`]: `ShardedConfig::default()` then a `with_*` setter per
/// field to change. Checked by [`ShardedCoordinator::open`] ([`ShardedConfig::validate`]): an
/// invalid value is refused, never adjusted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardedConfig {
    /// Seed of the owner-list shuffle (fixed in tests and simulations for determinism). Default:
    /// a fresh [`diskless_common::entropy_seed`].
    pub seed: u64,
    /// The oldest an object may be (by its key's UUID v7 time) when its commit starts; older commits
    /// are refused. Must be at least the writer's upload + commit time, and at most the orphan
    /// collector's `max_commit_age`. Positive. Default 10 minutes.
    pub max_commit_age: Duration,
    /// The most marked objects asked of one shard in one `objects_to_delete` call, when its oldest
    /// marked objects are still held by other owners. At least 1. Default 100 000.
    pub max_delete_scan: u32,
}

impl Default for ShardedConfig {
    fn default() -> Self {
        ShardedConfig {
            seed: diskless_common::entropy_seed(),
            max_commit_age: crate::DEFAULT_MAX_COMMIT_AGE,
            max_delete_scan: 100_000,
        }
    }
}

with_setters!(ShardedConfig {
    with_seed => seed: [u64],
    with_max_commit_age => max_commit_age: [Duration],
    with_max_delete_scan => max_delete_scan: [u32],
});

impl ShardedConfig {
    /// Checks every field against its documented rule: [`CoordinatorError::InvalidRequest`] naming
    /// the first field that breaks it.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        positive("max_commit_age", self.max_commit_age)?;
        at_least_one("max_delete_scan", self.max_delete_scan)
    }
}

/// The source of [`CoordinatorError::OutcomeUnknown`] when a commit was applied by some shards and
/// failed on others.
#[derive(Debug, thiserror::Error)]
#[error("commit of {object_key} applied by shards {applied:?} but failed on {failed:?}")]
pub struct PartialCommitError {
    /// The object key.
    pub object_key: String,
    /// Shards that applied the commit.
    pub applied: Vec<ShardId>,
    /// Shards where it failed, with the error's text.
    pub failed: Vec<(ShardId, String)>,
}

/// A [`BatchCoordinator`] over N shard coordinators (shard ids `0..N`). See the
/// [module docs](self) for placement, commits, hand-over and the atomicity limits.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use diskless_coordinator::sharded::{MemoryShardMap, ShardedConfig, ShardedCoordinator};
/// use diskless_coordinator::sqlite::SqliteCoordinator;
/// use diskless_coordinator::{BatchCoordinator, CreateTopicRequest, ManualClock, TopicConfig};
/// use std::sync::Arc;
///
/// let clock = ManualClock::new(1_000);
/// let mut shards: Vec<Arc<dyn BatchCoordinator>> = Vec::new();
/// for _ in 0..3 {
///     shards.push(Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap()));
/// }
/// let router = ShardedCoordinator::open(
///     shards,
///     Arc::new(MemoryShardMap::new()),
///     clock,
///     ShardedConfig::default().with_seed(1),
/// )
/// .await
/// .unwrap();
/// let topic_id = uuid::Uuid::from_u128(1);
/// router
///     .create_topic(CreateTopicRequest {
///         topic_id,
///         name: "orders".into(),
///         partitions: 6,
///         config: TopicConfig::default(),
///     })
///     .await
///     .unwrap();
/// // Six partitions spread evenly over three shards.
/// let shards: Vec<u32> =
///     (0..6).map(|p| router.shard_of(diskless_coordinator::TopicIdPartition::new(topic_id, p)).unwrap()).collect();
/// assert_eq!(shards, vec![0, 1, 2, 0, 1, 2]);
/// # });
/// ```
#[derive(Debug)]
pub struct ShardedCoordinator {
    shards: Vec<Arc<dyn BatchCoordinator>>,
    store: Arc<dyn ShardMapStore>,
    placements: RwLock<Placements>,
    clock: Arc<dyn Clock>,
    config: ShardedConfig,
    rng: Mutex<u64>,
    retention_cursor: AtomicUsize,
    owners_cache: Mutex<HashMap<String, Arc<[ShardId]>>>,
    /// When the placements were last reloaded because a topic was unknown (coordinator clock, ms).
    last_refresh_ms: AtomicI64,
}

/// The least time between two reloads of the stored placements caused by unknown topics.
const PLACEMENT_REFRESH_MS: i64 = 1_000;

pub use crate::object_key_time_ms;

fn poisoned() -> CoordinatorError {
    CoordinatorError::Storage("sharded coordinator lock poisoned".into())
}

/// Assigns `partitions` new partitions, each to the shard with the fewest partitions so far.
fn place(counts: &mut [u64], partitions: usize) -> Vec<ShardId> {
    (0..partitions)
        .map(|_| {
            let (shard, _) = counts
                .iter()
                .enumerate()
                .min_by_key(|(i, c)| (**c, *i))
                .unwrap_or((0, &0));
            counts[shard] += 1;
            shard as ShardId
        })
        .collect()
}

impl ShardedCoordinator {
    /// A router over `shards` (shard `i` is `shards[i]`), reading the stored placements from `store`.
    /// Invalid `config` is refused ([`ShardedConfig::validate`]).
    pub async fn open(
        shards: Vec<Arc<dyn BatchCoordinator>>,
        store: Arc<dyn ShardMapStore>,
        clock: Arc<dyn Clock>,
        config: ShardedConfig,
    ) -> Result<Self, CoordinatorError> {
        config.validate()?;
        if shards.is_empty() {
            return Err(CoordinatorError::InvalidRequest(
                "a sharded coordinator needs at least one shard".into(),
            ));
        }
        let placements = store.load().await?;
        for (topic, p) in &placements {
            if let Some(s) = p.iter().find(|s| **s as usize >= shards.len()) {
                return Err(CoordinatorError::Storage(
                    format!(
                        "the stored placement of topic {topic} names shard {s} but only {} shards exist",
                        shards.len()
                    )
                    .into(),
                ));
            }
        }
        let seed = config.seed;
        Ok(ShardedCoordinator {
            shards,
            store,
            placements: RwLock::new(placements),
            clock,
            config,
            rng: Mutex::new(seed),
            retention_cursor: AtomicUsize::new(0),
            owners_cache: Mutex::new(HashMap::new()),
            last_refresh_ms: AtomicI64::new(i64::MIN),
        })
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Shard `id`'s coordinator.
    pub fn shard(&self, id: ShardId) -> Option<&Arc<dyn BatchCoordinator>> {
        self.shards.get(id as usize)
    }

    /// The shard a partition belongs to, if its topic was created through a router on this store.
    pub fn shard_of(&self, partition: TopicIdPartition) -> Option<ShardId> {
        let placements = self.placements.read().ok()?;
        let p = placements.get(&partition.topic_id)?;
        usize::try_from(partition.partition)
            .ok()
            .and_then(|i| p.get(i).copied())
    }

    /// A copy of every topic's placement.
    pub fn placements(&self) -> Placements {
        self.placements
            .read()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// The shard currently responsible for an object: the first owner in its list that still has
    /// live bytes in it. `None` when the object is unknown or every owner released it (it is then
    /// deletable once the grace period has passed).
    pub async fn responsible_owner(
        &self,
        object_key: &str,
    ) -> Result<Option<ShardId>, CoordinatorError> {
        let Some(info) = self.object_info(object_key).await? else {
            return Ok(None);
        };
        for owner in info.owners {
            let Some(shard) = self.shard(owner) else {
                continue;
            };
            if shard
                .object_info(object_key)
                .await?
                .is_some_and(|i| i.live_bytes > 0)
            {
                return Ok(Some(owner));
            }
        }
        Ok(None)
    }

    fn next_random(&self) -> u64 {
        // splitmix64.
        let mut state = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn shuffle(&self, items: &mut [ShardId]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_random() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }

    /// Reloads the stored placements when a topic of `partitions` is unknown here: it may have been
    /// created through another router on the same store after this one opened. At most once per
    /// second (coordinator clock), so requests for topics that really do not exist cost nothing.
    async fn refresh_for(&self, mut partitions: impl Iterator<Item = TopicIdPartition>) {
        // A topic unknown here, or a partition beyond its placement (grown through another router).
        let missing = match self.placements.read() {
            Ok(placements) => partitions.any(|p| {
                placements.get(&p.topic_id).is_none_or(|placement| {
                    usize::try_from(p.partition).is_ok_and(|i| i >= placement.len())
                })
            }),
            Err(_) => false,
        };
        if !missing {
            return;
        }
        let now = self.clock.now_ms();
        let last = self.last_refresh_ms.load(Ordering::Acquire);
        if now.saturating_sub(last) < PLACEMENT_REFRESH_MS
            || self
                .last_refresh_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        self.reload().await;
    }

    /// Reloads the stored placements now, adding the topics created (and the partitions added)
    /// through other routers.
    async fn reload(&self) {
        let loaded = match self.store.load().await {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reload the shard map");
                return;
            }
        };
        let Ok(mut placements) = self.placements.write() else {
            return;
        };
        for (topic, placement) in loaded {
            if placement.iter().any(|s| *s as usize >= self.shards.len()) {
                tracing::warn!(%topic, "the stored placement names a shard that does not exist; ignored");
                continue;
            }
            match placements.entry(topic) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(placement);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    // Placements only grow, and a partition's shard never changes.
                    if placement.len() > o.get().len() && placement.starts_with(o.get()) {
                        o.insert(placement);
                    }
                }
            }
        }
    }

    /// Groups item indexes by the shard of their partition; indexes of unroutable partitions last.
    fn group(
        &self,
        partitions: impl Iterator<Item = TopicIdPartition>,
    ) -> (BTreeMap<ShardId, Vec<usize>>, Vec<usize>) {
        let mut groups: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        let mut unknown = Vec::new();
        for (i, p) in partitions.enumerate() {
            match self.shard_of(p) {
                Some(s) => groups.entry(s).or_default().push(i),
                None => unknown.push(i),
            }
        }
        (groups, unknown)
    }

    async fn has_same_topic(
        &self,
        shard: usize,
        request: &CreateTopicRequest,
    ) -> Result<bool, CoordinatorError> {
        Ok(self.shards[shard].list_topics().await?.iter().any(|t| {
            t.topic_id == request.topic_id
                && t.name == request.name
                && t.partitions == request.partitions
        }))
    }

    /// Creates the topic on one shard; `Ok(true)` if created, `Ok(false)` if it was there already.
    async fn create_on(
        &self,
        shard: usize,
        request: &CreateTopicRequest,
    ) -> Result<bool, CoordinatorError> {
        match self.shards[shard].create_topic(request.clone()).await {
            Ok(()) => Ok(true),
            Err(CoordinatorError::TopicAlreadyExists(what)) => {
                if self.has_same_topic(shard, request).await? {
                    Ok(false)
                } else {
                    Err(CoordinatorError::TopicAlreadyExists(what))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The placement to store for a new topic.
    fn new_placement(&self, partitions: usize) -> Result<Arc<[ShardId]>, CoordinatorError> {
        let mut counts = self.partition_counts()?;
        Ok(place(&mut counts, partitions).into())
    }

    /// How many partitions each shard holds, by the known placements.
    fn partition_counts(&self) -> Result<Vec<u64>, CoordinatorError> {
        let placements = self.placements.read().map_err(|_| poisoned())?;
        let mut counts = vec![0u64; self.shards.len()];
        for p in placements.values() {
            for s in p.iter() {
                if let Some(c) = counts.get_mut(*s as usize) {
                    *c += 1;
                }
            }
        }
        Ok(counts)
    }

    /// The partition count of `topic_id` on each shard (`None` where the shard lacks the topic).
    async fn partition_counts_of(
        &self,
        topic_id: Uuid,
    ) -> Result<Vec<Option<i32>>, CoordinatorError> {
        let lists = join_all(self.shards.iter().map(|s| s.list_topics())).await;
        lists
            .into_iter()
            .map(|topics| {
                Ok(topics?
                    .into_iter()
                    .find(|t| t.topic_id == topic_id)
                    .map(|t| t.partitions))
            })
            .collect()
    }

    /// Whether a growth of `topic_id` to `new_total` partitions that shard 0 refused is one that
    /// failed half-way before (shard 0 has exactly `new_total`, but the stored placement or another
    /// shard has fewer): a retry then completes it.
    async fn growth_incomplete(
        &self,
        topic_id: Uuid,
        new_total: i32,
    ) -> Result<bool, CoordinatorError> {
        let counts = self.partition_counts_of(topic_id).await?;
        if counts.first().copied().flatten() != Some(new_total) {
            return Ok(false);
        }
        self.reload().await;
        let placed = self
            .placements
            .read()
            .map_err(|_| poisoned())?
            .get(&topic_id)
            .map_or(0, |p| p.len());
        Ok(usize::try_from(new_total).is_ok_and(|n| placed < n)
            || counts[1..].iter().any(|c| c.is_some_and(|c| c < new_total)))
    }

    /// Stores the placement of `topic_id` grown to `new_total` partitions (the new ones on the
    /// emptiest shards), unless it has that many already.
    async fn grow_placement(
        &self,
        topic_id: Uuid,
        new_total: usize,
    ) -> Result<(), CoordinatorError> {
        let current = self
            .placements
            .read()
            .map_err(|_| poisoned())?
            .get(&topic_id)
            .cloned();
        let current = match current {
            Some(current) => current,
            None => {
                // Created through another router since this one loaded the map.
                self.reload().await;
                self.placements
                    .read()
                    .map_err(|_| poisoned())?
                    .get(&topic_id)
                    .cloned()
                    .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?
            }
        };
        if current.len() >= new_total {
            return Ok(());
        }
        let mut counts = self.partition_counts()?;
        let proposed: Arc<[ShardId]> = current
            .iter()
            .copied()
            .chain(place(&mut counts, new_total - current.len()))
            .collect();
        let in_force = self.store.extend(topic_id, proposed).await?;
        if in_force.len() < new_total {
            return Err(CoordinatorError::Storage(
                format!(
                    "the stored placement of topic {topic_id} has {} partitions after growing it \
                     to {new_total}",
                    in_force.len()
                )
                .into(),
            ));
        }
        let mut placements = self.placements.write().map_err(|_| poisoned())?;
        if placements
            .get(&topic_id)
            .is_none_or(|p| p.len() < in_force.len())
        {
            placements.insert(topic_id, in_force);
        }
        Ok(())
    }

    /// The owner list of `key`, from the cache or from a shard that listed it.
    async fn owners_of(
        &self,
        key: &str,
        listed: &BTreeMap<ShardId, i64>,
    ) -> Result<Option<Arc<[ShardId]>>, CoordinatorError> {
        if let Some(owners) = self.owners_cache.lock().map_err(|_| poisoned())?.get(key) {
            return Ok(Some(owners.clone()));
        }
        let Some((first, _)) = listed.first_key_value() else {
            return Ok(None);
        };
        let Some(info) = self.shards[*first as usize].object_info(key).await? else {
            return Ok(None);
        };
        let owners: Arc<[ShardId]> = info.owners.into();
        let mut cache = self.owners_cache.lock().map_err(|_| poisoned())?;
        if cache.len() >= OWNERS_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key.to_string(), owners.clone());
        Ok(Some(owners))
    }

    /// Whether every owner of `key` marked it before `check.marked_before`; returns the latest
    /// marking time if so.
    async fn released_by_all(
        &self,
        key: &str,
        owners: &[ShardId],
        check: ReleaseCheck<'_>,
    ) -> Result<Option<i64>, CoordinatorError> {
        let mut marked_at = check.listed.values().copied().max().unwrap_or(i64::MIN);
        let settled = object_key_time_ms(key).is_some_and(|t| t < check.unknown_horizon);
        let mut seen = HashSet::new();
        for owner in owners {
            if !seen.insert(*owner) || check.listed.contains_key(owner) {
                continue;
            }
            let Some(shard) = self.shard(*owner) else {
                tracing::warn!(
                    object = key,
                    owner,
                    "owner list names a shard that does not exist"
                );
                return Ok(None);
            };
            if check
                .complete
                .get(*owner as usize)
                .copied()
                .unwrap_or(false)
                && !settled
            {
                // The owner's answer was complete and does not list the key: it has not released
                // it (or does not know it, which counts only once settled).
                return Ok(None);
            }
            match shard.object_info(key).await? {
                Some(info) => match info.marked_for_deletion_at {
                    Some(t) if t < check.marked_before => marked_at = marked_at.max(t),
                    // This owner still has live batches (or marked too recently): it holds the object.
                    _ => return Ok(None),
                },
                None => {
                    // The owner never applied its part of the commit, or already confirmed the
                    // deletion. Only once no commit of the key can land any more does that count.
                    if !settled {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(Some(marked_at))
    }

    /// Sends each shard the requests for the partitions it owns, all shards at once, and answers
    /// in request order; a request for a partition no shard owns is answered
    /// `UNKNOWN_TOPIC_OR_PARTITION`. When a shard fails (or answers the wrong number of
    /// partitions), the first such shard's error, in shard order, fails the call.
    async fn scatter<'a, Q, F, Fut>(
        &'a self,
        requests: &[Q],
        call: F,
    ) -> Result<Vec<Q::Answer>, CoordinatorError>
    where
        Q: Routed,
        F: Fn(&'a dyn BatchCoordinator, Vec<Q>) -> Fut,
        Fut: Future<Output = Result<Vec<Q::Answer>, CoordinatorError>>,
    {
        self.refresh_for(requests.iter().map(Q::partition)).await;
        let (groups, unknown) = self.group(requests.iter().map(Q::partition));
        let mut out: Vec<Option<Q::Answer>> = vec![None; requests.len()];
        for i in unknown {
            out[i] = Some(Q::unknown());
        }
        let calls = groups.iter().map(|(shard, indexes)| {
            let sub: Vec<Q> = indexes.iter().map(|i| requests[*i].clone()).collect();
            let answers = call(self.shards[*shard as usize].as_ref(), sub);
            async move { (indexes, answers.await) }
        });
        let mut error = None;
        for (indexes, outcome) in join_all(calls).await {
            match outcome {
                Ok(answers) if answers.len() == indexes.len() => {
                    for (i, a) in indexes.iter().zip(answers) {
                        out[*i] = Some(a);
                    }
                }
                Ok(_) => {
                    error.get_or_insert(CoordinatorError::Storage(
                        "a shard answered the wrong number of partitions".into(),
                    ));
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| CoordinatorError::Storage("missing answer".into())))
            .collect()
    }

    /// A lifecycle pass with a budget over the shards in turn, from shard `start` (modulo the
    /// shard count) on, each with what is left of `budget`; `more` when the budget is spent. The
    /// order within each shard is the shard's own.
    async fn budgeted<'a, R, F, Fut>(
        &'a self,
        start: usize,
        budget: u32,
        pass: F,
    ) -> Result<R, CoordinatorError>
    where
        R: BudgetedReport,
        F: Fn(&'a dyn BatchCoordinator, u32) -> Fut,
        Fut: Future<Output = Result<R, CoordinatorError>>,
    {
        let n = self.shards.len();
        let mut report = R::default();
        let mut left = budget;
        for k in 0..n {
            if left == 0 {
                break;
            }
            let r = pass(self.shards[(start + k) % n].as_ref(), left).await?;
            left = left.saturating_sub(u32::try_from(r.spent()).unwrap_or(u32::MAX));
            report.add(r);
        }
        report.set_more(budget > 0 && left == 0);
        Ok(report)
    }
}

/// A per-partition request the router sends to the partition's shard.
trait Routed: Clone {
    /// The answer for one partition.
    type Answer: Clone;
    /// The partition asked about.
    fn partition(&self) -> TopicIdPartition;
    /// The answer for a partition no shard owns.
    fn unknown() -> Self::Answer;
}

impl Routed for ListOffsetsRequest {
    type Answer = ListOffsetsResponse;
    fn partition(&self) -> TopicIdPartition {
        self.partition
    }
    fn unknown() -> ListOffsetsResponse {
        ListOffsetsResponse::error(ErrorCode::UnknownTopicOrPartition)
    }
}

impl Routed for DeleteRecordsRequest {
    type Answer = DeleteRecordsResponse;
    fn partition(&self) -> TopicIdPartition {
        self.partition
    }
    fn unknown() -> DeleteRecordsResponse {
        DeleteRecordsResponse::error(ErrorCode::UnknownTopicOrPartition)
    }
}

impl Routed for TxnMarker {
    type Answer = TxnMarkerResult;
    fn partition(&self) -> TopicIdPartition {
        self.partition
    }
    fn unknown() -> TxnMarkerResult {
        TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition)
    }
}

/// The report of a budgeted lifecycle pass, as [`ShardedCoordinator::budgeted`] sums them.
trait BudgetedReport: Default {
    /// What the pass spent of its budget.
    fn spent(&self) -> u64;
    /// Adds another shard's pass.
    fn add(&mut self, other: Self);
    /// Sets whether the budget was spent.
    fn set_more(&mut self, more: bool);
}

impl BudgetedReport for RetentionReport {
    fn spent(&self) -> u64 {
        self.batches_deleted + self.segments_deleted
    }
    fn add(&mut self, other: Self) {
        self.batches_deleted += other.batches_deleted;
        self.bytes_deleted += other.bytes_deleted;
        self.segments_deleted += other.segments_deleted;
    }
    fn set_more(&mut self, more: bool) {
        self.more = more;
    }
}

impl BudgetedReport for ProducerExpiryReport {
    fn spent(&self) -> u64 {
        self.expired
    }
    fn add(&mut self, other: Self) {
        self.expired += other.expired;
    }
    fn set_more(&mut self, more: bool) {
        self.more = more;
    }
}

/// What [`ShardedCoordinator::released_by_all`] checks an object against.
#[derive(Clone, Copy)]
struct ReleaseCheck<'a> {
    /// The shards that listed the object as marked, with their marking times.
    listed: &'a BTreeMap<ShardId, i64>,
    /// Per shard: whether its list was complete (shorter than the page asked for).
    complete: &'a [bool],
    marked_before: i64,
    /// Keys dated before this can no longer be committed anywhere.
    unknown_horizon: i64,
}

/// Owner lists remembered (they never change for a key); cleared when this many are held.
const OWNERS_CACHE_CAPACITY: usize = 65_536;

/// Merges the per-shard outcomes of one commit.
///
/// Every shard applied it: the results in request order. Some applied and some failed, or any
/// outcome is unknown: [`CoordinatorError::OutcomeUnknown`]. None applied: the first error, except
/// that a mix of "already committed" (that shard references the object) and other errors is
/// `OutcomeUnknown` too, since the object must not be deleted.
fn merge_commit(
    request: &CommitFileRequest,
    groups: &BTreeMap<ShardId, Vec<usize>>,
    outcomes: Vec<(ShardId, Result<Vec<CommitBatchResult>, CoordinatorError>)>,
    mut results: Vec<Option<CommitBatchResult>>,
) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
    let mut applied = Vec::new();
    let mut failed = Vec::new();
    let mut first_error = None;
    let mut unknown = false;
    let mut already_committed = 0;
    for (shard, outcome) in outcomes {
        let indexes = groups.get(&shard).map(Vec::as_slice).unwrap_or(&[]);
        match outcome {
            Ok(shard_results) if shard_results.len() == indexes.len() => {
                applied.push(shard);
                for (i, r) in indexes.iter().zip(shard_results) {
                    results[*i] = Some(r);
                }
            }
            Ok(shard_results) => {
                applied.push(shard);
                unknown = true;
                failed.push((
                    shard,
                    format!(
                        "answered {} results for {} batches",
                        shard_results.len(),
                        indexes.len()
                    ),
                ));
            }
            Err(e) => {
                // Only errors that certainly did not apply can be passed on as such: anything else
                // (outcome unknown, a storage error reading the answer of an applied commit, ...)
                // may have applied on that shard.
                unknown |= !e.certainly_not_applied()
                    && !matches!(e, CoordinatorError::ObjectAlreadyCommitted(_));
                if matches!(e, CoordinatorError::ObjectAlreadyCommitted(_)) {
                    already_committed += 1;
                }
                failed.push((shard, e.to_string()));
                first_error.get_or_insert(e);
            }
        }
    }
    if failed.is_empty() {
        return Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| CommitBatchResult::error(ErrorCode::UnknownServerError)))
            .collect());
    }
    let mixed_exists = already_committed > 0 && already_committed < failed.len();
    match first_error {
        Some(e) if applied.is_empty() && !unknown && !mixed_exists => Err(e),
        _ => {
            tracing::warn!(
                object = request.object_key,
                ?applied,
                ?failed,
                "commit partially applied across shards"
            );
            Err(CoordinatorError::OutcomeUnknown(Box::new(
                PartialCommitError {
                    object_key: request.object_key.clone(),
                    applied,
                    failed,
                },
            )))
        }
    }
}

/// Each call goes to the shards that own its partitions (or to every shard), concurrently.
///
/// # Cancel safety
///
/// Dropping a call's future drops its calls to the shards, each with its own shard's cancel
/// safety. A dropped `commit_file` may thus have been applied by none, some or all of the shards
/// it went to (each no later than its own commit deadline), exactly as
/// [`BatchCoordinator::commit_file`]'s "Cancel safety" says: treat it as
/// [`CoordinatorError::OutcomeUnknown`], like a partial commit ([`PartialCommitError`]). An
/// idempotent producer's retry is a duplicate on the shards that applied it and appended by the
/// others; the object's owner list names every shard it was sent to, and an owner that never
/// learnt of the object counts as released only once no commit of its key can land any more (see
/// the [module docs](self)). A dropped `create_topic` is completed by retrying it.
#[async_trait]
impl BatchCoordinator for ShardedCoordinator {
    /// What every shard serves.
    fn capabilities(&self) -> Capabilities {
        self.shards.iter().fold(Capabilities::ALL, |all, s| {
            all.intersection(s.capabilities())
        })
    }

    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        let partitions = usize::try_from(request.partitions)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| {
                CoordinatorError::InvalidRequest("a topic needs at least one partition".into())
            })?;
        let mut created_any = self.create_on(0, &request).await?;
        let placement = self.new_placement(partitions)?;
        let placement = self
            .store
            .put_if_absent(request.topic_id, placement)
            .await?;
        if placement.len() != partitions {
            return Err(CoordinatorError::Storage(
                format!(
                    "the stored placement of topic {} has {} partitions, not {partitions}",
                    request.topic_id,
                    placement.len()
                )
                .into(),
            ));
        }
        self.placements
            .write()
            .map_err(|_| poisoned())?
            .insert(request.topic_id, placement);
        for shard in 1..self.shards.len() {
            created_any |= self.create_on(shard, &request).await?;
        }
        if created_any {
            Ok(())
        } else {
            Err(CoordinatorError::TopicAlreadyExists(
                request.topic_id.to_string(),
            ))
        }
    }

    async fn delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        let outcomes = join_all(self.shards.iter().map(|s| s.delete_topic(topic_id))).await;
        let mut deleted_any = false;
        let mut error = None;
        for outcome in outcomes {
            match outcome {
                Ok(()) => deleted_any = true,
                Err(CoordinatorError::UnknownTopic(_)) => {}
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        self.store.remove(topic_id).await?;
        self.placements
            .write()
            .map_err(|_| poisoned())?
            .remove(&topic_id);
        if deleted_any {
            Ok(())
        } else {
            Err(CoordinatorError::UnknownTopic(topic_id.to_string()))
        }
    }

    /// Shard 0's topics that have a stored placement. A topic that shard 0 has but this router's
    /// map does not (created through another router on the same map store) makes the router reload
    /// the stored map first, so every router lists the same topics.
    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        let topics = self.shards[0].list_topics().await?;
        let missing = {
            let placements = self.placements.read().map_err(|_| poisoned())?;
            topics.iter().any(|t| !placements.contains_key(&t.topic_id))
        };
        if missing {
            self.reload().await;
        }
        let placements = self.placements.read().map_err(|_| poisoned())?;
        Ok(topics
            .into_iter()
            .filter(|t| placements.contains_key(&t.topic_id))
            .collect())
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        // An early refusal only: each shard checks the deadline and the orphan fences again inside
        // its own commit transaction, which is what makes them hold.
        crate::check_commit_deadline(
            &request.object_key,
            self.clock.now_ms(),
            self.config.max_commit_age,
        )?;
        self.refresh_for(request.batches.iter().map(|b| b.partition))
            .await;
        let (mut groups, unknown) = self.group(request.batches.iter().map(|b| b.partition));
        let mut results: Vec<Option<CommitBatchResult>> = vec![None; request.batches.len()];
        for i in unknown {
            results[i] = Some(CommitBatchResult::error(ErrorCode::UnknownTopicOrPartition));
        }
        if groups.is_empty() {
            // Register the object on one shard anyway: marked at commit, cleaned after the grace.
            let shard = (self.next_random() % self.shards.len() as u64) as ShardId;
            groups.insert(shard, Vec::new());
        }
        let mut owners: Vec<ShardId> = groups.keys().copied().collect();
        self.shuffle(&mut owners);
        let calls = groups.iter().map(|(shard, indexes)| {
            let sub = CommitFileRequest {
                object_key: request.object_key.clone(),
                uploader_broker_id: request.uploader_broker_id,
                object_size: request.object_size,
                owners: owners.clone(),
                batches: indexes
                    .iter()
                    .map(|i| request.batches[*i].clone())
                    .collect(),
            };
            let shard = *shard;
            async move { (shard, self.shards[shard as usize].commit_file(sub).await) }
        });
        let outcomes = join_all(calls).await;
        merge_commit(&request, &groups, outcomes, results)
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        self.refresh_for(requests.iter().map(|r| r.partition)).await;
        // Runs of consecutive partitions on one shard are asked in request order with what is left of
        // `fetch_max_bytes`, which gives exactly the answer one coordinator would give.
        let mut responses = Vec::with_capacity(requests.len());
        let mut total: u64 = 0;
        let mut i = 0;
        while i < requests.len() {
            let shard = self.shard_of(requests[i].partition);
            let mut j = i + 1;
            while j < requests.len() && self.shard_of(requests[j].partition) == shard {
                j += 1;
            }
            match shard {
                None => {
                    for _ in i..j {
                        responses.push(FindBatchesResponse::error(
                            ErrorCode::UnknownTopicOrPartition,
                        ));
                    }
                }
                Some(s) => {
                    let left = u64::from(fetch_max_bytes).saturating_sub(total);
                    let left = u32::try_from(left).unwrap_or(u32::MAX);
                    let run = self.shards[s as usize]
                        .find_batches(&requests[i..j], left)
                        .await?;
                    if run.len() != j - i {
                        return Err(CoordinatorError::Storage(
                            format!("shard {s} answered {} of {} partitions", run.len(), j - i)
                                .into(),
                        ));
                    }
                    for r in run {
                        total += r.segments.iter().map(|s| s.layout.log).sum::<u64>()
                            + r.batches
                                .iter()
                                .map(|b| u64::from(b.byte_size))
                                .sum::<u64>();
                        responses.push(r);
                    }
                }
            }
            i = j;
        }
        Ok(responses)
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        self.scatter(requests, |shard, sub| async move {
            shard.list_offsets(&sub).await
        })
        .await
    }

    /// Not atomic across shards: if one shard fails the call fails, though other shards may have
    /// moved their log start offsets. DeleteRecords is idempotent, so the client's retry is safe.
    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        self.scatter(requests, |shard, sub| async move {
            shard.delete_records(&sub).await
        })
        .await
    }

    /// Visits the shards in turn (starting one further each call, so every shard gets its share of
    /// a small budget), each with what is left of `max_batches`; `more` when the budget is spent.
    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let start = self.retention_cursor.fetch_add(1, Ordering::Relaxed);
        self.budgeted(start, max_batches, |shard, budget| {
            shard.enforce_retention(budget)
        })
        .await
    }

    /// Objects every owner released before `marked_before_ms` (see the [module docs](self)). Each
    /// shard is asked for `limit` marked objects first; while that yields fewer than `limit`
    /// deletable objects and some shard's answer was cut at the page size (its oldest marked objects
    /// may all be held by other owners), the page grows fourfold, up to
    /// [`ShardedConfig::max_delete_scan`].
    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        if self.shards.len() == 1 {
            return self.shards[0]
                .objects_to_delete(marked_before_ms, limit)
                .await;
        }
        let max_age = i64::try_from(self.config.max_commit_age.as_millis()).unwrap_or(i64::MAX);
        let unknown_horizon = self
            .clock
            .now_ms()
            .saturating_sub(max_age.saturating_mul(2));
        let mut page = limit.max(1);
        loop {
            let lists = join_all(
                self.shards
                    .iter()
                    .map(|s| s.objects_to_delete(marked_before_ms, page)),
            )
            .await;
            let mut complete = Vec::with_capacity(lists.len());
            // key -> (shard -> marked at), the size and the kind.
            let mut marked: BTreeMap<String, (BTreeMap<ShardId, i64>, u64, ObjectKind)> =
                BTreeMap::new();
            for (shard, list) in lists.into_iter().enumerate() {
                let list = list?;
                complete.push(list.len() < page as usize);
                for o in list {
                    let entry = marked
                        .entry(o.object_key)
                        .or_insert_with(|| (BTreeMap::new(), o.object_size, o.kind));
                    entry.0.insert(shard as ShardId, o.marked_for_deletion_at);
                }
            }
            let mut out = Vec::new();
            for (key, (listed, object_size, kind)) in marked {
                let Some(owners) = self.owners_of(&key, &listed).await? else {
                    continue; // confirmed in the meantime
                };
                let check = ReleaseCheck {
                    listed: &listed,
                    complete: &complete,
                    marked_before: marked_before_ms,
                    unknown_horizon,
                };
                if let Some(at) = self.released_by_all(&key, &owners, check).await? {
                    out.push(ObjectToDelete {
                        object_key: key,
                        marked_for_deletion_at: at,
                        object_size,
                        kind,
                    });
                }
            }
            let exhausted = complete.iter().all(|c| *c) || page >= self.config.max_delete_scan;
            if out.len() >= limit as usize || exhausted {
                out.sort_by(|a, b| {
                    (a.marked_for_deletion_at, &a.object_key)
                        .cmp(&(b.marked_for_deletion_at, &b.object_key))
                });
                out.truncate(limit as usize);
                return Ok(out);
            }
            page = page.saturating_mul(4).min(self.config.max_delete_scan);
        }
    }

    /// Confirms on every shard, then fences the keys on every shard: a shard that never knew the
    /// object (it had no batches of it) must refuse a retried commit of it too, since the object is
    /// gone. (The keys are ones this router answered as deletable: every owner released them.)
    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        let outcomes = join_all(self.shards.iter().map(|s| s.confirm_deleted(object_keys))).await;
        outcomes.into_iter().collect::<Result<(), _>>()?;
        let fenced = join_all(self.shards.iter().map(|s| s.fence_orphans(object_keys))).await;
        for outcome in fenced {
            outcome?;
        }
        let mut cache = self.owners_cache.lock().map_err(|_| poisoned())?;
        for key in object_keys {
            cache.remove(key);
        }
        Ok(())
    }

    /// Fences on every shard; a key is returned only when every shard fenced it (a shard that knows
    /// the object keeps it alive). A fence recorded on some shards only is harmless: it refuses
    /// those shards' part of a later commit of the key, which then fails as a partial commit
    /// (`OutcomeUnknown`), never acknowledged.
    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let answers = join_all(self.shards.iter().map(|s| s.fence_orphans(object_keys))).await;
        let mut counts: HashMap<String, usize> = HashMap::new();
        for answer in answers {
            for key in answer? {
                *counts.entry(key).or_default() += 1;
            }
        }
        let n = self.shards.len();
        let everywhere = counts.into_iter().filter(|(_, c)| *c == n).map(|(k, _)| k);
        Ok(in_request_order(object_keys, everywhere.collect()))
    }

    /// Visits the shards in order, each with what is left of `max_producers` (so the order is per
    /// shard, not global).
    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        self.budgeted(0, max_producers, |shard, budget| {
            shard.expire_producers(budget)
        })
        .await
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let answers = join_all(self.shards.iter().map(|s| s.known_objects(object_keys))).await;
        let mut known = HashSet::new();
        for answer in answers {
            known.extend(answer?);
        }
        Ok(in_request_order(object_keys, known))
    }

    /// The object as the shards that know it see it together: live bytes summed, committed at the
    /// earliest, marked (at the latest marking) only if every shard that knows it marked it.
    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        let answers = join_all(self.shards.iter().map(|s| s.object_info(object_key))).await;
        let mut merged: Option<ObjectInfo> = None;
        let mut all_marked = true;
        for answer in answers {
            let Some(info) = answer? else {
                continue;
            };
            all_marked &= info.marked_for_deletion_at.is_some();
            merged = Some(match merged {
                None => info,
                Some(mut m) => {
                    m.live_bytes += info.live_bytes;
                    m.committed_at = m.committed_at.min(info.committed_at);
                    m.marked_for_deletion_at =
                        m.marked_for_deletion_at.max(info.marked_for_deletion_at);
                    m
                }
            });
        }
        Ok(merged.map(|mut m| {
            if !all_marked {
                m.marked_for_deletion_at = None;
            }
            m
        }))
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        self.refresh_for(std::iter::once(partition)).await;
        match self.shard_of(partition) {
            Some(s) => {
                self.shards[s as usize]
                    .producer_state(partition, producer_id)
                    .await
            }
            None => Ok(None),
        }
    }

    /// On shard 0 alone, as producer ids: every router over the same shards shares one record
    /// per transactional id (its markers go to the partitions' shards, `write_txn_markers`).
    async fn txn_transition(
        &self,
        transition: TxnTransition,
    ) -> Result<TxnAnswer, CoordinatorError> {
        self.shards[0].txn_transition(transition).await
    }

    /// On shard 0 alone (`txn_transition`).
    async fn txn_endings(&self, limit: u32) -> Result<Vec<TxnRecord>, CoordinatorError> {
        self.shards[0].txn_endings(limit).await
    }

    /// On shard 0 alone (`txn_transition`).
    async fn describe_txn(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TxnRecord>, CoordinatorError> {
        self.shards[0].describe_txn(transactional_id).await
    }

    /// From shard 0 alone: one counter for every router over the same shards.
    async fn allocate_producer_ids(&self, count: u32) -> Result<ProducerIdBlock, CoordinatorError> {
        self.shards[0].allocate_producer_ids(count).await
    }

    /// Shard 0 first (it holds every topic: its count is the topic's, and it decides
    /// `INVALID_PARTITIONS`), then the grown placement is stored, then the other shards grow the
    /// topic. A call that failed half-way leaves shard 0 grown: retrying it completes the growth
    /// (and succeeds); meanwhile the new partitions without a stored shard are unknown to
    /// produce and fetch.
    async fn create_partitions(
        &self,
        topic_id: Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        match self.shards[0].create_partitions(topic_id, new_total).await {
            Ok(()) => {}
            Err(CoordinatorError::InvalidPartitions(m)) => {
                if !self.growth_incomplete(topic_id, new_total).await? {
                    return Err(CoordinatorError::InvalidPartitions(m));
                }
            }
            Err(e) => return Err(e),
        }
        let total = usize::try_from(new_total).map_err(|_| {
            CoordinatorError::InvalidPartitions(format!("invalid partition count {new_total}"))
        })?;
        self.grow_placement(topic_id, total).await?;
        let grown = join_all(
            self.shards[1..]
                .iter()
                .map(|s| s.create_partitions(topic_id, new_total)),
        )
        .await;
        for outcome in grown {
            match outcome {
                // InvalidPartitions: that shard grew in an earlier, half-done attempt.
                Ok(()) | Err(CoordinatorError::InvalidPartitions(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// On every shard (each holds the topic). Not atomic across shards: a call that failed on
    /// some shard may have changed the others; retrying it makes them agree.
    async fn alter_topic_config(
        &self,
        topic_id: Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        config.validate()?;
        let outcomes = join_all(
            self.shards
                .iter()
                .map(|s| s.alter_topic_config(topic_id, config.clone())),
        )
        .await;
        let mut altered_any = false;
        for outcome in outcomes {
            match outcome {
                Ok(()) => altered_any = true,
                Err(CoordinatorError::UnknownTopic(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if altered_any {
            Ok(())
        } else {
            Err(CoordinatorError::UnknownTopic(topic_id.to_string()))
        }
    }

    async fn list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        self.refresh_for(std::iter::once(partition)).await;
        match self.shard_of(partition) {
            Some(s) => self.shards[s as usize].list_producers(partition).await,
            None => Err(CoordinatorError::UnknownTopic(partition.to_string())),
        }
    }

    /// Each shard writes the markers of its partitions in one transaction of its own, the shards
    /// concurrently. Kafka writes markers partition by partition and its transaction coordinator
    /// completes a transaction only once every partition has acknowledged, so nothing needs them
    /// atomic across shards; an error for the call may leave some shards written, and the retry
    /// is safe because markers with a `txn_seq` are idempotent (as for `delete_records`).
    async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        self.scatter(markers, |shard, sub| async move {
            shard.write_txn_markers(&sub).await
        })
        .await
    }

    /// Every shard's candidates, each shard listing only the partitions placed on it (only the
    /// owning shard has WAL batches of a partition), merged in (topic id, partition) order and
    /// cut at `limit`: the same page one coordinator would answer.
    async fn tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        let answers = join_all(
            self.shards
                .iter()
                .map(|s| s.tiering_candidates(now_ms, min_age_ms, after, limit)),
        )
        .await;
        let mut merged = Vec::new();
        for (shard, answer) in answers.into_iter().enumerate() {
            let shard = shard as ShardId;
            merged.extend(
                answer?
                    .into_iter()
                    .filter(|c| self.shard_of(c.partition) == Some(shard)),
            );
        }
        merged.sort_by_key(|c| c.partition);
        merged.truncate(limit as usize);
        Ok(merged)
    }

    async fn segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        self.refresh_for(std::iter::once(request.partition)).await;
        match self.shard_of(request.partition) {
            Some(s) => self.shards[s as usize].segment_plan(request).await,
            None => Ok(SegmentPlan::error(ErrorCode::UnknownTopicOrPartition)),
        }
    }

    /// On the partition's shard, which becomes the segment object's one owner (the request's
    /// owner is replaced, as `commit_file` replaces owner lists).
    async fn register_segment(
        &self,
        mut request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        // The shard's checks in the shard's order: an invalid or expired request is refused
        // whatever its partition (the shard checks the deadline again, under its lock).
        request.validate()?;
        crate::check_commit_deadline(
            &request.object_key,
            self.clock.now_ms(),
            self.config.max_commit_age,
        )?;
        self.refresh_for(std::iter::once(request.partition)).await;
        match self.shard_of(request.partition) {
            Some(s) => {
                request.owner = s;
                self.shards[s as usize].register_segment(request).await
            }
            None => Ok(RegisterSegmentOutcome::UnknownPartition),
        }
    }

    async fn replace_segments(
        &self,
        mut request: ReplaceSegmentsRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        // As `register_segment`: the checks that need no shard first.
        request.validate()?;
        if let Some(new) = &request.segment {
            crate::check_commit_deadline(
                &new.object_key,
                self.clock.now_ms(),
                self.config.max_commit_age,
            )?;
        }
        self.refresh_for(std::iter::once(request.partition)).await;
        match self.shard_of(request.partition) {
            Some(s) => {
                if let Some(new) = &mut request.segment {
                    new.owner = s;
                }
                self.shards[s as usize].replace_segments(request).await
            }
            None => Ok(RegisterSegmentOutcome::UnknownPartition),
        }
    }

    async fn list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        self.refresh_for(std::iter::once(partition)).await;
        match self.shard_of(partition) {
            Some(s) => {
                self.shards[s as usize]
                    .list_tiered_segments(partition, from_offset, limit)
                    .await
            }
            None => Err(CoordinatorError::UnknownTopic(partition.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_refuses_invalid_values() {
        assert!(ShardedConfig::default().validate().is_ok());
        for (config, field) in [
            (
                ShardedConfig::default().with_max_delete_scan(0),
                "max_delete_scan",
            ),
            (
                ShardedConfig::default().with_max_commit_age(Duration::ZERO),
                "max_commit_age",
            ),
        ] {
            match config.validate() {
                Err(CoordinatorError::InvalidRequest(m)) => assert!(m.contains(field), "{m}"),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Two default configs draw two seeds.
        assert_ne!(ShardedConfig::default().seed, ShardedConfig::default().seed);
    }

    #[test]
    fn placement_fills_the_emptiest_shard() {
        let mut counts = vec![2, 0, 1];
        assert_eq!(place(&mut counts, 4), vec![1, 1, 2, 0]);
        assert_eq!(counts, vec![3, 2, 2]);
    }
}
