//! [`ProducerExpirer`]: `producer.id.expiration.ms` in capped passes.

use super::LifecycleError;
use diskless_coordinator::BatchCoordinator;
use std::sync::Arc;

/// Settings of a [`ProducerExpirer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerExpiryConfig {
    /// Producer states expired by one coordinator call (one transaction). Default 1000.
    pub max_producers_per_call: u32,
    /// Calls per pass at most; the rest waits for the next pass. Default 16.
    pub max_calls_per_pass: u32,
}

impl Default for ProducerExpiryConfig {
    fn default() -> Self {
        ProducerExpiryConfig {
            max_producers_per_call: 1000,
            max_calls_per_pass: 16,
        }
    }
}

/// What one producer-expiry pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerExpiryPassReport {
    /// Coordinator calls made.
    pub calls: u32,
    /// (partition, producer id) states expired.
    pub expired: u64,
    /// Whether the pass stopped at its cap with possibly more to expire.
    pub more: bool,
}

/// Expires idempotent-producer state that has been idle for its topic's
/// `producer.id.expiration.ms` ([`BatchCoordinator::expire_producers`]), so the coordinator's
/// producer state stays bounded by the producers active in that window, as in Kafka (whose
/// `producer.id.expiration.check.interval.ms` default, 10 minutes, is a good interval).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use diskless_core::lifecycle::{ProducerExpirer, ProducerExpiryConfig};
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::sync::Arc;
/// let coordinator: Arc<dyn BatchCoordinator> =
///     Arc::new(InMemoryCoordinator::new(ManualClock::new(1_000)));
/// let expirer = ProducerExpirer::new(coordinator, ProducerExpiryConfig::default());
/// assert_eq!(expirer.run_pass().await.unwrap().expired, 0);
/// # });
/// ```
#[derive(Debug)]
pub struct ProducerExpirer {
    coordinator: Arc<dyn BatchCoordinator>,
    config: ProducerExpiryConfig,
}

impl ProducerExpirer {
    /// An expirer over `coordinator`.
    pub fn new(coordinator: Arc<dyn BatchCoordinator>, config: ProducerExpiryConfig) -> Self {
        ProducerExpirer {
            coordinator,
            config,
        }
    }

    /// One pass: calls until the coordinator reports nothing more, or the call cap.
    pub async fn run_pass(&self) -> Result<ProducerExpiryPassReport, LifecycleError> {
        let mut report = ProducerExpiryPassReport::default();
        let per_call = self.config.max_producers_per_call.max(1);
        for _ in 0..self.config.max_calls_per_pass.max(1) {
            let r = self.coordinator.expire_producers(per_call).await?;
            report.calls += 1;
            report.expired += r.expired;
            report.more = r.more;
            if !r.more {
                break;
            }
            tokio::task::yield_now().await;
        }
        if report.expired > 0 {
            tracing::info!(
                calls = report.calls,
                expired = report.expired,
                more = report.more,
                "producer expiry pass"
            );
        }
        Ok(report)
    }
}
