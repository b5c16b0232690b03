//! [`RetentionEnforcer`]: retention in capped passes.

use super::{LifecycleError, Worker, record_pass};
use crate::ConfigError;
use diskless_coordinator::BatchCoordinator;
use std::sync::Arc;

/// Settings of a [`RetentionEnforcer`]: [`Default`], then the `with_*` methods. Checked by
/// [`RetentionEnforcer::new`] ([`RetentionConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// Batches deleted by one coordinator call (one transaction), at least 1. Default 1000.
    pub max_batches_per_call: u32,
    /// Calls per pass at most, at least 1; the rest waits for the next pass. Default 16.
    pub max_calls_per_pass: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            max_batches_per_call: 1000,
            max_calls_per_pass: 16,
        }
    }
}

diskless_common::with_setters!(RetentionConfig {
    with_max_batches_per_call => max_batches_per_call: [u32],
    with_max_calls_per_pass => max_calls_per_pass: [u32],
});

impl RetentionConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_batches_per_call == 0 {
            return Err(ConfigError::invalid(
                "max_batches_per_call",
                "must be at least 1",
            ));
        }
        if self.max_calls_per_pass == 0 {
            return Err(ConfigError::invalid(
                "max_calls_per_pass",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// What one retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionPassReport {
    /// Coordinator calls made.
    pub calls: u32,
    /// Batches logically deleted.
    pub batches_deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Whether the pass stopped at its cap with more to delete.
    pub more: bool,
}

/// Applies `retention.ms` and `retention.bytes` of every diskless partition.
///
/// Each pass calls [`BatchCoordinator::enforce_retention`] with
/// [`RetentionConfig::max_batches_per_call`] until the coordinator reports nothing more or
/// [`RetentionConfig::max_calls_per_pass`] calls were made. Each call is a short transaction and
/// the task yields between calls, so commits are never held up by a large backlog.
#[derive(Debug)]
pub struct RetentionEnforcer {
    coordinator: Arc<dyn BatchCoordinator>,
    config: RetentionConfig,
}

impl RetentionEnforcer {
    /// An enforcer over `coordinator`, or the first setting of `config` out of range.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        config: RetentionConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(RetentionEnforcer {
            coordinator,
            config,
        })
    }

    /// One pass. Records [`LIFECYCLE_PASSES`](diskless_common::metrics::LIFECYCLE_PASSES) and
    /// [`LIFECYCLE_ITEMS`](diskless_common::metrics::LIFECYCLE_ITEMS) (the batches deleted, also
    /// by a pass that failed after some calls) once, with `worker="retention"`, in a
    /// `lifecycle_pass` span.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Each [`BatchCoordinator::enforce_retention`] call is one coordinator
    /// transaction: dropping the pass between calls loses nothing, and dropping it during a call
    /// leaves that call applied or not, as the coordinator's transaction decides. Either way the
    /// next pass deletes what is still due. A cancelled pass records no metric.
    #[tracing::instrument(level = "info", name = "lifecycle_pass", skip_all, fields(worker = Worker::Retention.name()))]
    pub async fn run_pass(&self) -> Result<RetentionPassReport, LifecycleError> {
        let mut report = RetentionPassReport::default();
        let result = self.pass(&mut report).await;
        record_pass(Worker::Retention, &result, report.batches_deleted);
        result.map(|()| report)
    }

    async fn pass(&self, report: &mut RetentionPassReport) -> Result<(), LifecycleError> {
        for _ in 0..self.config.max_calls_per_pass {
            let r = self
                .coordinator
                .enforce_retention(self.config.max_batches_per_call)
                .await?;
            report.calls += 1;
            report.batches_deleted += r.batches_deleted;
            report.bytes_deleted += r.bytes_deleted;
            report.more = r.more;
            if !r.more {
                break;
            }
            tokio::task::yield_now().await;
        }
        if report.batches_deleted > 0 || report.more {
            tracing::info!(
                calls = report.calls,
                batches = report.batches_deleted,
                bytes = report.bytes_deleted,
                more = report.more,
                "retention pass"
            );
        }
        Ok(())
    }
}
