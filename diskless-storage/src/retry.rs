//! Retry settings and the backoff schedule used by [`crate::ObjectStoreStorage`].
//!
//! Only [transient](crate::StorageError::is_transient) failures are retried: timeouts, connection
//! errors, HTTP 5xx, 408 and 429 (S3's `SlowDown` is a 503). Every other 4xx, a missing object, an
//! object that already exists with other content, an invalid range or key are returned at once.

use crate::StorageError;
use std::time::Duration;

/// How calls to the object store are retried.
///
/// The defaults suit a produce path that must not give up on a blip but must not hang either:
///
/// | field             | default  |
/// |-------------------|----------|
/// | `max_attempts`    | 10       |
/// | `initial_backoff` | 50 ms    |
/// | `max_backoff`     | 5 s      |
/// | `multiplier`      | 2.0      |
/// | `attempt_timeout` | 30 s     |
/// | `deadline`        | 120 s    |
/// | `seed`            | `None`   |
///
/// The delay before retry `n` (1-based) is drawn uniformly from `[b/2, b]` where
/// `b = min(max_backoff, initial_backoff * multiplier^(n-1))` ("equal jitter"): retries of many
/// clients spread out, and a delay never collapses to zero.
///
/// Start from [`RetryConfig::default()`] and change what you need with the `with_*` methods;
/// [`RetryConfig::validate`] (called by [`ObjectStoreStorage::with_options`]) rejects invalid
/// values, it never clamps them.
///
/// ```
/// use diskless_storage::RetryConfig;
/// use std::time::Duration;
/// let config = RetryConfig::default()
///     .with_max_attempts(3)
///     .with_attempt_timeout(Duration::from_secs(5))
///     .with_seed(7);
/// assert_eq!(config.deadline, Duration::from_secs(120));
/// assert!(config.validate().is_ok());
/// assert!(config.with_max_attempts(0).validate().is_err());
/// ```
///
/// [`ObjectStoreStorage::with_options`]: crate::ObjectStoreStorage::with_options
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Attempts per call, the first one included (`1` disables retries; `0` is invalid).
    pub max_attempts: u32,
    /// Backoff before the first retry (before jitter). At most `max_backoff`.
    pub initial_backoff: Duration,
    /// Upper bound of the backoff (before jitter).
    pub max_backoff: Duration,
    /// Growth factor of the backoff per retry: finite and at least 1.
    pub multiplier: f64,
    /// Time limit of one attempt (positive). An upload attempt that times out may still have
    /// landed: the retry then finds the object and compares its content (see
    /// [`crate::ObjectStorage::upload`]).
    pub attempt_timeout: Duration,
    /// Time limit of the whole call, retries and backoff included (positive). No attempt starts
    /// after it, and a running attempt is cut at it.
    pub deadline: Duration,
    /// Seed of the jitter's random number generator, for reproducible schedules in tests and
    /// simulations. `None` seeds from [`diskless_common::entropy_seed`].
    pub seed: Option<u64>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
            attempt_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
            seed: None,
        }
    }
}

diskless_common::with_setters!(RetryConfig {
    with_max_attempts => max_attempts: [u32],
    with_initial_backoff => initial_backoff: [Duration],
    with_max_backoff => max_backoff: [Duration],
    with_multiplier => multiplier: [f64],
    with_attempt_timeout => attempt_timeout: [Duration],
    with_deadline => deadline: [Duration],
});

impl RetryConfig {
    /// No retries: one attempt, with the default timeouts.
    pub fn no_retries() -> Self {
        RetryConfig::default().with_max_attempts(1)
    }

    /// Sets [`seed`](Self::seed) (`7` or `Some(7)`; `None` for an entropy seed).
    pub fn with_seed(mut self, seed: impl Into<Option<u64>>) -> Self {
        self.seed = seed.into();
        self
    }

    /// Checks the settings: the one place they are validated. An invalid value is a
    /// [`StorageError::Config`] naming the field; nothing is clamped.
    pub fn validate(&self) -> Result<(), StorageError> {
        let invalid = |field: &str, reason: &str| {
            Err(StorageError::Config(format!("retry.{field}: {reason}")))
        };
        if self.max_attempts == 0 {
            return invalid("max_attempts", "must be at least 1 (1 disables retries)");
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return invalid("multiplier", "must be a finite number >= 1");
        }
        if self.attempt_timeout.is_zero() {
            return invalid("attempt_timeout", "must be positive");
        }
        if self.deadline.is_zero() {
            return invalid("deadline", "must be positive");
        }
        if self.initial_backoff > self.max_backoff {
            return invalid("initial_backoff", "must not exceed max_backoff");
        }
        Ok(())
    }
}

/// The backoff schedule of one call.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    multiplier: f64,
}

impl Backoff {
    /// A schedule starting at `config.initial_backoff`.
    pub fn new(config: &RetryConfig) -> Self {
        Backoff {
            next: config.initial_backoff,
            max: config.max_backoff,
            multiplier: config.multiplier,
        }
    }

    /// The next delay, with equal jitter drawn from `rng`.
    pub fn next_delay(&mut self, rng: &mut fastrand::Rng) -> Duration {
        let base = self.next.min(self.max);
        let grown = base.as_secs_f64() * self.multiplier;
        self.next = Duration::try_from_secs_f64(grown)
            .unwrap_or(self.max)
            .min(self.max);
        let half = base / 2;
        half + base.saturating_sub(half).mul_f64(rng.f64())
    }
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters_within_bounds() {
        let config = RetryConfig::default()
            .with_initial_backoff(Duration::from_millis(100))
            .with_max_backoff(Duration::from_secs(1));
        let mut backoff = Backoff::new(&config);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut bases = vec![];
        for _ in 0..8 {
            bases.push(backoff.next.min(backoff.max));
            let d = backoff.next_delay(&mut rng);
            let base = *bases.last().unwrap();
            assert!(
                d >= base / 2 && d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
        assert_eq!(bases[0], Duration::from_millis(100));
        assert_eq!(bases[1], Duration::from_millis(200));
        assert_eq!(bases[7], Duration::from_secs(1));
    }

    #[test]
    fn same_seed_same_schedule() {
        let config = RetryConfig::default();
        let run = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut b = Backoff::new(&config);
            (0..6).map(|_| b.next_delay(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn validate_rejects_nonsense() {
        assert!(RetryConfig::default().validate().is_ok());
        let d = RetryConfig::default;
        let bad = [
            (d().with_max_attempts(0), "retry.max_attempts"),
            (d().with_multiplier(0.5), "retry.multiplier"),
            (d().with_multiplier(f64::NAN), "retry.multiplier"),
            (
                d().with_attempt_timeout(Duration::ZERO),
                "retry.attempt_timeout",
            ),
            (d().with_deadline(Duration::ZERO), "retry.deadline"),
            (
                d().with_initial_backoff(Duration::from_secs(10)),
                "retry.initial_backoff",
            ),
        ];
        for (config, field) in bad {
            let err = config.validate().unwrap_err();
            assert!(matches!(err, StorageError::Config(_)), "{err:?}");
            assert!(err.to_string().contains(field), "{config:?}: {err}");
        }
    }
}
