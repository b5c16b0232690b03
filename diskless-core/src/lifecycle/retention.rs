//! [`RetentionEnforcer`]: retention in capped passes.

use super::LifecycleError;
use diskless_coordinator::BatchCoordinator;
use std::sync::Arc;

/// Settings of a [`RetentionEnforcer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Batches deleted by one coordinator call (one transaction). Default 1000.
    pub max_batches_per_call: u32,
    /// Calls per pass at most; the rest waits for the next pass. Default 16.
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

/// What one retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// An enforcer over `coordinator`.
    pub fn new(coordinator: Arc<dyn BatchCoordinator>, config: RetentionConfig) -> Self {
        RetentionEnforcer {
            coordinator,
            config,
        }
    }

    /// One pass.
    pub async fn run_pass(&self) -> Result<RetentionPassReport, LifecycleError> {
        let mut report = RetentionPassReport::default();
        let per_call = self.config.max_batches_per_call.max(1);
        for _ in 0..self.config.max_calls_per_pass.max(1) {
            let r = self.coordinator.enforce_retention(per_call).await?;
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
        Ok(report)
    }
}
