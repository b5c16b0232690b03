//! Retry settings and the backoff schedule used by [`crate::ObjectStoreStorage`].
//!
//! Only [transient](crate::StorageError::is_transient) failures are retried: timeouts, connection
//! errors, HTTP 5xx, 408 and 429 (S3's `SlowDown` is a 503). Every other 4xx, a missing object, an
//! object that already exists with other content, an invalid range or key are returned at once.

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
/// ```
/// use diskless_storage::RetryConfig;
/// use std::time::Duration;
/// let config = RetryConfig {
///     max_attempts: 3,
///     attempt_timeout: Duration::from_secs(5),
///     ..RetryConfig::default()
/// };
/// assert_eq!(config.deadline, Duration::from_secs(120));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryConfig {
    /// Attempts per call, the first one included (`1` disables retries).
    pub max_attempts: u32,
    /// Backoff before the first retry (before jitter).
    pub initial_backoff: Duration,
    /// Upper bound of the backoff (before jitter).
    pub max_backoff: Duration,
    /// Growth factor of the backoff per retry.
    pub multiplier: f64,
    /// Time limit of one attempt. An upload attempt that times out may still have landed: the retry
    /// then finds the object and compares its content (see [`crate::ObjectStorage::upload`]).
    pub attempt_timeout: Duration,
    /// Time limit of the whole call, retries and backoff included. No attempt starts after it,
    /// and a running attempt is cut at it.
    pub deadline: Duration,
    /// Seed of the jitter's random number generator, for reproducible schedules in tests. `None`
    /// seeds from the OS.
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

impl RetryConfig {
    /// No retries: one attempt, with the default timeouts.
    pub fn no_retries() -> Self {
        RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        }
    }

    /// Checks the settings.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry max_attempts must be at least 1".into());
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err("retry multiplier must be a finite number >= 1".into());
        }
        if self.attempt_timeout.is_zero() || self.deadline.is_zero() {
            return Err("retry attempt_timeout and deadline must be positive".into());
        }
        if self.initial_backoff > self.max_backoff {
            return Err("retry initial_backoff must not exceed max_backoff".into());
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
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters_within_bounds() {
        let config = RetryConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..RetryConfig::default()
        };
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
        let bad = [
            RetryConfig {
                max_attempts: 0,
                ..RetryConfig::default()
            },
            RetryConfig {
                multiplier: 0.5,
                ..RetryConfig::default()
            },
            RetryConfig {
                deadline: Duration::ZERO,
                ..RetryConfig::default()
            },
            RetryConfig {
                initial_backoff: Duration::from_secs(10),
                ..RetryConfig::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
