//! Object lifecycle workers: they act on what the coordinator decided is dead.
//!
//! - [`RetentionEnforcer`] applies `retention.ms` / `retention.bytes` in capped passes
//!   ([`BatchCoordinator::enforce_retention`]), so a huge backlog never holds the coordinator long.
//! - [`ObjectCleaner`] deletes objects marked for deletion longer ago than a grace period (default
//!   60 s, so in-flight fetches finish) from storage in bulk and confirms to the coordinator only the
//!   keys the store confirmed.
//! - [`OrphanCollector`] finds objects that were uploaded but never committed (KIP-1164's two-phase
//!   reconciliation) and deletes only keys the coordinator fenced
//!   (`BatchCoordinator::fence_orphans`): a fenced key can never be committed, so no commit in
//!   flight can land on a deleted object, whatever its duration. Every coordinator enforces this
//!   itself; nothing needs wiring. ([`CommitDeadline`] is an optional early refusal on the broker.)
//! - [`ProducerExpirer`] expires idle idempotent-producer state (`producer.id.expiration.ms`).
//! - [`TieringWorker`] consolidates each partition's oldest WAL batches into tiered segments
//!   (KIP-1163; issue #15), so that the coordinator's batch rows and the WAL objects stay bounded
//!   by `segment.ms` / `segment.bytes` rather than by retention. Its unregistered uploads are
//!   collected by a second [`OrphanCollector`] on its prefix (`tiered`); the WAL objects it
//!   releases and the segments retention deletes are deleted by the [`ObjectCleaner`].
//! - [`Lifecycle`] runs them as tokio tasks on intervals, with a shutdown handle (an orphan
//!   collector per key prefix: `wal`, and `tiered` beside the tiering worker). Tests call each
//!   worker's `run_pass` by hand with a `ManualClock`.
//!
//! Every pass returns a report (counts), logs with `tracing` in a `lifecycle_pass` span (field
//! `worker`), and records [`LIFECYCLE_PASSES`] (labels `worker`, `outcome`) and
//! [`LIFECYCLE_ITEMS`] (label `worker`: what the pass removed) once. A storage failure never loses
//! anything: what was not confirmed deleted stays known to the coordinator and is retried next pass.
//! Every worker's `run_pass` is cancel safe (see each one's "Cancel safety"): a pass dropped
//! midway leaves what it did not finish to the next pass.
//!
//! Settings are checked when a worker is made: `new` returns [`ConfigError`](crate::ConfigError)
//! for a value out of range, never adjusts it.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use diskless_core::lifecycle::{CleanerConfig, ObjectCleaner, RetentionConfig, RetentionEnforcer};
//! use diskless_coordinator::{BatchCoordinator, ManualClock};
//! use diskless_storage::{ObjectStorage, ObjectStoreStorage};
//! use diskless_testkit::coordinator::InMemoryCoordinator;
//! use std::sync::Arc;
//!
//! let clock = ManualClock::new(1_700_000_000_000);
//! let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
//! let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
//! let retention = RetentionEnforcer::new(coordinator.clone(), RetentionConfig::default()).unwrap();
//! let config = CleanerConfig::default().with_grace(std::time::Duration::from_secs(30));
//! let cleaner = ObjectCleaner::new(coordinator, storage, None, clock, config).unwrap();
//! assert_eq!(retention.run_pass().await.unwrap().batches_deleted, 0);
//! assert_eq!(cleaner.run_pass().await.unwrap().deleted, 0);
//! # });
//! ```
//!
//! [`BatchCoordinator::enforce_retention`]: diskless_coordinator::BatchCoordinator::enforce_retention
//! [`LIFECYCLE_PASSES`]: diskless_common::metrics::LIFECYCLE_PASSES
//! [`LIFECYCLE_ITEMS`]: diskless_common::metrics::LIFECYCLE_ITEMS

mod cleaner;
mod compaction;
mod fence;
mod orphans;
mod producers;
mod retention;
mod runner;
mod tiering;

pub use cleaner::{CleanPassReport, CleanerConfig, ObjectCleaner};
pub use compaction::{CompactionConfig, CompactionError, CompactionReport, CompactionWorker};
pub use fence::CommitDeadline;
pub use orphans::{OrphanCollector, OrphanConfig, OrphanPassReport};
pub use producers::{ProducerExpirer, ProducerExpiryConfig, ProducerExpiryPassReport};
pub use retention::{RetentionConfig, RetentionEnforcer, RetentionPassReport};
pub use runner::{Lifecycle, LifecycleHandle, LifecycleStats, WorkerStats};
pub use tiering::{TieringConfig, TieringPassReport, TieringWorker};

use diskless_coordinator::CoordinatorError;
use diskless_storage::StorageError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a lifecycle pass stopped early. Whatever it did not finish is retried by the next pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// A coordinator call failed.
    #[error("coordinator: {0}")]
    Coordinator(#[from] CoordinatorError),
    /// A storage call (listing) failed.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
}

/// A lifecycle worker, as its metrics and logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Worker {
    Retention,
    Cleaner,
    Orphans,
    Producers,
    Tiering,
    Compaction,
}

impl Worker {
    /// The value of the `worker` label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Worker::Retention => "retention",
            Worker::Cleaner => "cleaner",
            Worker::Orphans => "orphans",
            Worker::Producers => "producers",
            Worker::Tiering => "tiering",
            Worker::Compaction => "compaction",
        }
    }
}

/// Records the metrics of one finished pass, once each: its outcome, and the `items` it removed
/// (counted also when the pass failed after removing some).
pub(crate) fn record_pass(worker: Worker, result: &Result<(), LifecycleError>, items: u64) {
    use diskless_common::metrics as m;
    let outcome = if result.is_ok() { m::OK } else { m::ERROR };
    metrics::counter!(m::LIFECYCLE_PASSES, m::WORKER => worker.name(), m::OUTCOME => outcome)
        .increment(1);
    metrics::counter!(m::LIFECYCLE_ITEMS, m::WORKER => worker.name()).increment(items);
}

/// A duration in ms, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A system time in ms since the epoch (0 before the epoch, saturating).
pub(crate) fn system_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}
