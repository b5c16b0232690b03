//! [`ConfigError`]: the one error type every setting of the façade is checked against (the
//! writer's, the fetcher's, the validator's and the lifecycle workers').

/// A configuration value that is out of range, found when a [`WalWriter`](crate::WalWriter), a
/// [`Fetcher`](crate::Fetcher) or a lifecycle worker is built. Invalid values are rejected, never
/// clamped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting is out of range, or two settings contradict each other.
    #[error("invalid configuration: {field}: {reason}")]
    Invalid {
        /// The setting (the config struct's field name, e.g. `buffer_max_bytes`).
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// The writer or fetcher was built outside a tokio runtime (it spawns its tasks there).
    #[error("must be built within a tokio runtime")]
    NoRuntime,
}

impl ConfigError {
    /// A [`ConfigError::Invalid`] for `field`.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}
