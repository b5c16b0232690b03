//! [`OrphanCollector`]: KIP-1164's two-phase reconciliation of storage against the coordinator.

use super::{LifecycleError, millis, system_ms};
use diskless_coordinator::{BatchCoordinator, Clock};
use diskless_storage::{ObjectKey, ObjectStorage};
use futures::TryStreamExt;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Settings of an [`OrphanCollector`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanConfig {
    /// The key prefix the writers upload under (`WalWriterConfig::object_prefix`).
    pub prefix: String,
    /// Objects younger than this (by the later of their key's UUID v7 time and their listing time)
    /// are never considered. Must be at least the commit fence's `max_commit_age`
    /// ([`super::CommitDeadline`] / `ShardedConfig::max_commit_age`) plus the largest clock skew
    /// between the hosts. Default 15 minutes.
    pub max_commit_age: Duration,
    /// How long an object must stay unknown to every shard, between the first and the second check,
    /// before it is deleted. Must exceed the longest time a coordinator call can take to land once
    /// started (statement / busy timeouts). Default 5 minutes.
    pub recheck_delay: Duration,
    /// Keys per `known_objects` call. Default 1000.
    pub known_batch: usize,
    /// Deletions per pass at most. Default 10 000.
    pub max_deletes_per_pass: usize,
}

impl OrphanConfig {
    /// The defaults, for objects under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        OrphanConfig {
            prefix: prefix.into(),
            max_commit_age: Duration::from_secs(15 * 60),
            recheck_delay: Duration::from_secs(5 * 60),
            known_batch: 1000,
            max_deletes_per_pass: 10_000,
        }
    }
}

/// What one orphan pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrphanPassReport {
    /// Objects listed under the prefix.
    pub listed: u64,
    /// Listed objects too young to be considered.
    pub too_young: u64,
    /// Listed objects whose key has no UUID v7 time (never collected).
    pub undatable: u64,
    /// Old enough objects the coordinator knows (committed): left alone.
    pub known: u64,
    /// Objects unknown to every shard for the first time in this pass (phase 1).
    pub new_suspects: u64,
    /// Suspects still waiting for their second check after this pass.
    pub waiting: u64,
    /// Suspects deleted after the second check (phase 2).
    pub deleted: u64,
    /// Suspects whose deletion storage did not confirm (retried next pass).
    pub not_deleted: u64,
}

/// Deletes objects that were uploaded but never committed.
///
/// # The two phases
///
/// A pass lists every object under the prefix. An object is a *candidate* when the later of its
/// key's UUID v7 time and its listing `last_modified` is older than `now - max_commit_age`
/// (objects without a v7 time are never candidates). Phase 1: candidates that no shard knows
/// ([`BatchCoordinator::known_objects`]; pass a `ShardedCoordinator` to ask every shard) become
/// *suspects*, remembered with the time `t1` of that check. Phase 2, in a later pass at `t2 ≥ t1 +
/// recheck_delay`: suspects still listed are checked again, and those that still no shard knows
/// are deleted. Suspects that a shard knows are dropped (they are committed: the
/// [`super::ObjectCleaner`] owns them). Phase 2 runs before phase 1 in a pass, so no object is ever
/// deleted in the pass that first suspected it.
///
/// # Why an object whose commit is in flight is never deleted
///
/// Assumptions: (A1) every commit goes through a commit fence (a [`super::CommitDeadline`] or a
/// `ShardedCoordinator`) that refuses to start a commit of a key whose v7 time `k` is older than
/// `now_fence - M_f`; (A2) this collector's `max_commit_age` `M ≥ M_f + S`, where `S` bounds the clock
/// skew between the fence's host and this one; (A3) a coordinator call that started is applied or
/// abandoned within `D < recheck_delay`.
///
/// Suppose the collector deletes key `K` at `t2`. Then no shard knew `K` at `t1` nor at `t2`, and
/// `k < t1 - M`. If a commit of `K` is ever applied, it is applied after `t2` (before `t2` it would
/// have been known at `t2`, unless it was already confirmed deleted by the cleaner — then `K` was
/// dead anyway and deleting it again is harmless). That commit passed the fence at `t_f` with
/// `k ≥ t_f - M_f - S` (in this host's time), so `t_f ≤ k + M_f + S < t1 - M + M_f + S ≤ t1`. The call
/// was therefore in flight from before `t1` until after `t2`, longer than `recheck_delay > D`,
/// which (A3) rules out. So no commit of `K` can land after the collector deleted it. A commit that
/// reaches the fence later is refused (and its writer deletes the object); an upload that lands
/// after the deletion (a retried ambiguous upload) is just a new orphan. The writer's clock does not
/// matter: fence and collector compare the same key time.
///
/// Listing is only a source of candidates: an object missing from an (eventually consistent) listing
/// is simply not deleted this pass.
#[derive(Debug)]
pub struct OrphanCollector {
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
    clock: Arc<dyn Clock>,
    config: OrphanConfig,
    /// Suspects and when each was first found unknown (phase 1). Held for the whole pass, so passes
    /// never overlap.
    suspects: tokio::sync::Mutex<BTreeMap<ObjectKey, i64>>,
}

impl OrphanCollector {
    /// A collector of the objects under `config.prefix`.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        storage: Arc<dyn ObjectStorage>,
        clock: Arc<dyn Clock>,
        config: OrphanConfig,
    ) -> Self {
        OrphanCollector {
            coordinator,
            storage,
            clock,
            config,
            suspects: tokio::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The current suspects (keys found unknown once, waiting for their second check).
    pub async fn suspects(&self) -> Vec<ObjectKey> {
        self.suspects.lock().await.keys().cloned().collect()
    }

    /// Which of `keys` some shard knows, asked in chunks.
    async fn known(&self, keys: &[ObjectKey]) -> Result<HashSet<String>, LifecycleError> {
        let mut known = HashSet::new();
        for chunk in keys.chunks(self.config.known_batch.max(1)) {
            let names: Vec<String> = chunk.iter().map(|k| k.as_str().to_string()).collect();
            known.extend(self.coordinator.known_objects(&names).await?);
        }
        Ok(known)
    }

    /// One pass: list, phase 2 for due suspects, phase 1 for new candidates.
    pub async fn run_pass(&self) -> Result<OrphanPassReport, LifecycleError> {
        let mut suspects = self.suspects.lock().await;
        let mut report = OrphanPassReport::default();
        let now = self.clock.now_ms();
        let cutoff = now.saturating_sub(millis(self.config.max_commit_age));
        let mut candidates = Vec::new();
        let mut listing = self.storage.list(&self.config.prefix);
        while let Some(meta) = listing.try_next().await? {
            report.listed += 1;
            let Some(created) = meta.key.created_at() else {
                report.undatable += 1;
                continue;
            };
            let age_from = system_ms(created).max(system_ms(meta.last_modified));
            if age_from >= cutoff {
                report.too_young += 1;
                continue;
            }
            candidates.push(meta.key);
        }
        drop(listing);
        let listed: HashSet<&ObjectKey> = candidates.iter().collect();
        suspects.retain(|k, _| listed.contains(k));

        // Phase 2: suspects unknown since at least `recheck_delay` are checked again.
        let due_before = now.saturating_sub(millis(self.config.recheck_delay));
        let due: Vec<ObjectKey> = suspects
            .iter()
            .filter(|(_, t1)| **t1 <= due_before)
            .map(|(k, _)| k.clone())
            .collect();
        // Keys settled by phase 2 are not looked at again by phase 1 in this pass.
        let settled: HashSet<ObjectKey> = due.iter().cloned().collect();
        if !due.is_empty() {
            let known = self.known(&due).await?;
            let mut doomed = Vec::new();
            for key in due {
                if known.contains(key.as_str()) {
                    suspects.remove(&key);
                    report.known += 1;
                } else if doomed.len() < self.config.max_deletes_per_pass {
                    doomed.push(key);
                }
            }
            if !doomed.is_empty() {
                match self.storage.delete(&doomed).await {
                    Ok(deleted) => {
                        let asked: HashSet<&ObjectKey> = doomed.iter().collect();
                        for key in deleted.iter().filter(|k| asked.contains(k)) {
                            if suspects.remove(key).is_some() {
                                report.deleted += 1;
                                tracing::info!(object = %key, "deleted orphan object");
                            }
                        }
                        report.not_deleted = doomed.len() as u64 - report.deleted;
                    }
                    Err(e) => {
                        report.not_deleted = doomed.len() as u64;
                        tracing::warn!(error = %e, objects = doomed.len(), "orphan delete failed; retrying next pass");
                    }
                }
            }
        }

        // Phase 1: new candidates no shard knows become suspects.
        let fresh: Vec<ObjectKey> = candidates
            .into_iter()
            .filter(|k| !suspects.contains_key(k) && !settled.contains(k))
            .collect();
        if !fresh.is_empty() {
            let known = self.known(&fresh).await?;
            for key in fresh {
                if known.contains(key.as_str()) {
                    report.known += 1;
                } else {
                    suspects.insert(key, now);
                    report.new_suspects += 1;
                }
            }
        }
        report.waiting = suspects.len() as u64;
        if report.new_suspects > 0 || report.deleted > 0 || report.not_deleted > 0 {
            tracing::info!(
                listed = report.listed,
                new_suspects = report.new_suspects,
                deleted = report.deleted,
                not_deleted = report.not_deleted,
                waiting = report.waiting,
                "orphan pass"
            );
        }
        Ok(report)
    }
}
