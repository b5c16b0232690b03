//! [`ProducerExpirer`]: `producer.id.expiration.ms` in capped passes.

use super::{LifecycleError, Worker, record_pass};
use crate::ConfigError;
use diskless_coordinator::BatchCoordinator;
use std::sync::Arc;

/// Settings of a [`ProducerExpirer`]: [`Default`], then the `with_*` methods. Checked by
/// [`ProducerExpirer::new`] ([`ProducerExpiryConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerExpiryConfig {
    /// Producer states expired by one coordinator call (one transaction), at least 1. Default
    /// 1000.
    pub max_producers_per_call: u32,
    /// Calls per pass at most, at least 1; the rest waits for the next pass. Default 16.
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

diskless_common::with_setters!(ProducerExpiryConfig {
    with_max_producers_per_call => max_producers_per_call: [u32],
    with_max_calls_per_pass => max_calls_per_pass: [u32],
});

impl ProducerExpiryConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_producers_per_call == 0 {
            return Err(ConfigError::invalid(
                "max_producers_per_call",
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
/// let config = ProducerExpiryConfig::default().with_max_producers_per_call(500);
/// let expirer = ProducerExpirer::new(coordinator, config).unwrap();
/// assert_eq!(expirer.run_pass().await.unwrap().expired, 0);
/// # });
/// ```
#[derive(Debug)]
pub struct ProducerExpirer {
    coordinator: Arc<dyn BatchCoordinator>,
    config: ProducerExpiryConfig,
}

impl ProducerExpirer {
    /// An expirer over `coordinator`, or the first setting of `config` out of range.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        config: ProducerExpiryConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(ProducerExpirer {
            coordinator,
            config,
        })
    }

    /// One pass: calls until the coordinator reports nothing more, or the call cap. Records
    /// [`LIFECYCLE_PASSES`](diskless_common::metrics::LIFECYCLE_PASSES) and
    /// [`LIFECYCLE_ITEMS`](diskless_common::metrics::LIFECYCLE_ITEMS) (the states expired, also
    /// by a pass that failed after some calls) once, with `worker="producers"`, in a
    /// `lifecycle_pass` span.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Each [`BatchCoordinator::expire_producers`] call is one coordinator
    /// transaction: dropping the pass between calls loses nothing, and dropping it during a call
    /// leaves that call applied or not, as the coordinator's transaction decides. Either way the
    /// next pass expires what is still due. A cancelled pass records no metric.
    #[tracing::instrument(level = "info", name = "lifecycle_pass", skip_all, fields(worker = Worker::Producers.name()))]
    pub async fn run_pass(&self) -> Result<ProducerExpiryPassReport, LifecycleError> {
        let mut report = ProducerExpiryPassReport::default();
        let result = self.pass(&mut report).await;
        record_pass(Worker::Producers, &result, report.expired);
        result.map(|()| report)
    }

    async fn pass(&self, report: &mut ProducerExpiryPassReport) -> Result<(), LifecycleError> {
        for _ in 0..self.config.max_calls_per_pass {
            let r = self
                .coordinator
                .expire_producers(self.config.max_producers_per_call)
                .await?;
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
        Ok(())
    }
}
