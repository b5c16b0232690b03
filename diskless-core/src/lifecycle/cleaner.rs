//! [`ObjectCleaner`]: physical deletion of objects the coordinator marked.

use super::{LifecycleError, Worker, millis, record_pass};
use crate::ConfigError;
use diskless_cache::LocalCache;
use diskless_coordinator::{BatchCoordinator, Clock};
use diskless_storage::{ObjectKey, ObjectStorage};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Settings of an [`ObjectCleaner`]: [`Default`], then the `with_*` methods. Checked by
/// [`ObjectCleaner::new`] ([`CleanerConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanerConfig {
    /// How long an object stays after it was marked, so that fetches that found its batches before
    /// they were deleted can still read it. Default 60 s.
    pub grace: Duration,
    /// Objects per round (one `objects_to_delete`, one bulk storage delete, one confirm), at least
    /// 1. Default 1000.
    pub batch_size: u32,
    /// Rounds per pass at most, at least 1. Default 16.
    pub max_rounds_per_pass: u32,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            grace: Duration::from_secs(60),
            batch_size: 1000,
            max_rounds_per_pass: 16,
        }
    }
}

diskless_common::with_setters!(CleanerConfig {
    with_grace => grace: [Duration],
    with_batch_size => batch_size: [u32],
    with_max_rounds_per_pass => max_rounds_per_pass: [u32],
});

impl CleanerConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            return Err(ConfigError::invalid("batch_size", "must be at least 1"));
        }
        if self.max_rounds_per_pass == 0 {
            return Err(ConfigError::invalid(
                "max_rounds_per_pass",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// What one cleaning pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanPassReport {
    /// Rounds run.
    pub rounds: u32,
    /// Objects the coordinator offered for deletion.
    pub offered: u64,
    /// Objects deleted from storage and confirmed to the coordinator.
    pub deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Objects whose deletion storage did not confirm (retried next pass).
    pub not_deleted: u64,
    /// Keys that are not valid object keys (they cannot exist in storage): confirmed without a
    /// storage call.
    pub invalid_keys: u64,
}

/// Deletes objects marked for deletion from storage, then confirms them to the coordinator.
///
/// Each round asks [`BatchCoordinator::objects_to_delete`] for objects marked before
/// `now - grace`, deletes them from storage in one bulk call, drops their cached blocks, and calls
/// [`BatchCoordinator::confirm_deleted`] with **only the keys storage confirmed**. A key storage did
/// not confirm stays marked and is retried next pass; storage deletes are idempotent, so a
/// confirmation lost after the storage delete only costs one more delete call. Objects the
/// coordinator still references are never offered (the coordinator marks an object only when its
/// live bytes reach zero; a [`diskless_coordinator::sharded::ShardedCoordinator`] only when every
/// owner shard did), so nothing referenced can be deleted here.
#[derive(Debug)]
pub struct ObjectCleaner {
    coordinator: Arc<dyn BatchCoordinator>,
    storage: Arc<dyn ObjectStorage>,
    cache: Option<Arc<dyn LocalCache>>,
    clock: Arc<dyn Clock>,
    config: CleanerConfig,
}

impl ObjectCleaner {
    /// A cleaner, or the first setting of `config` out of range. `cache`, if given, loses the
    /// blocks of every deleted object.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        storage: Arc<dyn ObjectStorage>,
        cache: Option<Arc<dyn LocalCache>>,
        clock: Arc<dyn Clock>,
        config: CleanerConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(ObjectCleaner {
            coordinator,
            storage,
            cache,
            clock,
            config,
        })
    }

    /// One pass: rounds until nothing is left to delete, a round makes partial progress (storage
    /// refused some keys: no point hammering it), or the round cap. Records
    /// [`LIFECYCLE_PASSES`](diskless_common::metrics::LIFECYCLE_PASSES) and
    /// [`LIFECYCLE_ITEMS`](diskless_common::metrics::LIFECYCLE_ITEMS) (the objects deleted and
    /// confirmed, also by a pass that failed after some rounds) once, with `worker="cleaner"`, in
    /// a `lifecycle_pass` span.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is lost and nothing referenced is deleted. A key is confirmed to the
    /// coordinator only after storage confirmed its deletion, so a pass dropped after a storage
    /// delete and before the confirmation leaves those objects marked; the next pass deletes them
    /// again (storage deletes are idempotent) and confirms them. Dropped before it dropped their
    /// cache blocks, those blocks stay until that next round or eviction: they hold the bytes the
    /// object had, which no batch the coordinator still holds refers to. A `confirm_deleted` call
    /// dropped in flight is applied or not, as the coordinator's transaction decides. A cancelled
    /// pass records no metric.
    #[tracing::instrument(level = "info", name = "lifecycle_pass", skip_all, fields(worker = Worker::Cleaner.name()))]
    pub async fn run_pass(&self) -> Result<CleanPassReport, LifecycleError> {
        let mut report = CleanPassReport::default();
        let result = self.pass(&mut report).await;
        record_pass(Worker::Cleaner, &result, report.deleted);
        result.map(|()| report)
    }

    async fn pass(&self, report: &mut CleanPassReport) -> Result<(), LifecycleError> {
        let batch = self.config.batch_size;
        for _ in 0..self.config.max_rounds_per_pass {
            let marked_before = self
                .clock
                .now_ms()
                .saturating_sub(millis(self.config.grace));
            let objects = self
                .coordinator
                .objects_to_delete(marked_before, batch)
                .await?;
            if objects.is_empty() {
                break;
            }
            report.rounds += 1;
            report.offered += objects.len() as u64;
            let mut valid = Vec::with_capacity(objects.len());
            let mut to_confirm = Vec::with_capacity(objects.len());
            for o in &objects {
                match ObjectKey::parse(&o.object_key) {
                    Ok(key) => valid.push(key),
                    Err(e) => {
                        tracing::warn!(key = o.object_key, error = %e, "coordinator holds an invalid object key; forgetting it");
                        report.invalid_keys += 1;
                        to_confirm.push(o.object_key.clone());
                    }
                }
            }
            let mut confirmed: HashSet<ObjectKey> = HashSet::new();
            if !valid.is_empty() {
                match self.storage.delete(&valid).await {
                    Ok(keys) => {
                        let asked: HashSet<&ObjectKey> = valid.iter().collect();
                        confirmed = keys.into_iter().filter(|k| asked.contains(k)).collect();
                    }
                    Err(e) => {
                        tracing::warn!(objects = valid.len(), error = %e, "storage delete failed; retrying next pass");
                    }
                }
            }
            if let Some(cache) = &self.cache {
                for key in &confirmed {
                    cache.invalidate_object(key.as_str()).await;
                }
            }
            let not_deleted = (valid.len() - confirmed.len()) as u64;
            report.not_deleted += not_deleted;
            for o in &objects {
                if let Ok(key) = ObjectKey::parse(&o.object_key)
                    && confirmed.contains(&key)
                {
                    report.bytes_deleted += o.object_size;
                    to_confirm.push(o.object_key.clone());
                }
            }
            if !to_confirm.is_empty() {
                self.coordinator.confirm_deleted(&to_confirm).await?;
            }
            report.deleted += confirmed.len() as u64;
            if not_deleted > 0 || objects.len() < batch as usize {
                break;
            }
            tokio::task::yield_now().await;
        }
        if report.offered > 0 {
            tracing::info!(
                deleted = report.deleted,
                bytes = report.bytes_deleted,
                not_deleted = report.not_deleted,
                "cleaning pass"
            );
        }
        Ok(())
    }
}
