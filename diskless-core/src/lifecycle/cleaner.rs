//! [`ObjectCleaner`]: physical deletion of objects the coordinator marked.

use super::{LifecycleError, millis};
use diskless_cache::LocalCache;
use diskless_coordinator::{BatchCoordinator, Clock};
use diskless_storage::{ObjectKey, ObjectStorage};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Settings of an [`ObjectCleaner`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanerConfig {
    /// How long an object stays after it was marked, so that fetches that found its batches before
    /// they were deleted can still read it. Default 60 s.
    pub grace: Duration,
    /// Objects per round (one `objects_to_delete`, one bulk storage delete, one confirm). Default 1000.
    pub batch_size: u32,
    /// Rounds per pass at most. Default 16.
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

/// What one cleaning pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// A cleaner. `cache`, if given, loses the blocks of every deleted object.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        storage: Arc<dyn ObjectStorage>,
        cache: Option<Arc<dyn LocalCache>>,
        clock: Arc<dyn Clock>,
        config: CleanerConfig,
    ) -> Self {
        ObjectCleaner {
            coordinator,
            storage,
            cache,
            clock,
            config,
        }
    }

    /// One pass: rounds until nothing is left to delete, a round makes partial progress (storage
    /// refused some keys: no point hammering it), or the round cap.
    pub async fn run_pass(&self) -> Result<CleanPassReport, LifecycleError> {
        let mut report = CleanPassReport::default();
        let batch = self.config.batch_size.max(1);
        for _ in 0..self.config.max_rounds_per_pass.max(1) {
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
        Ok(report)
    }
}
