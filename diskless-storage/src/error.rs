//! Errors of object storage calls.

pub use diskless_common::BoxError;

/// Why an object storage call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// No object has this key.
    #[error("object not found: {key}")]
    NotFound {
        /// The key.
        key: String,
        /// The store's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// An object with this key already exists with other content.
    #[error("object already exists with other content: {key}")]
    AlreadyExists {
        /// The key.
        key: String,
        /// The store's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The byte range is empty, inverted or past the end of the object.
    #[error("invalid range {start}..{end} of object {key} (size {size:?})")]
    InvalidRange {
        /// The key.
        key: String,
        /// Range start.
        start: u64,
        /// Range end (exclusive).
        end: u64,
        /// The object's size, when known.
        size: Option<u64>,
    },
    /// A key or prefix is not valid (see [`crate::ObjectKey`]).
    #[error("invalid object key or prefix {key:?}: {reason}")]
    InvalidKey {
        /// The offending key or prefix.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A failure that may go away on retry (timeouts, throttling, 5xx, connection errors), left after
    /// the configured retries.
    #[error("transient storage error: {source}")]
    Transient {
        /// The store's error.
        #[source]
        source: BoxError,
    },
    /// A failure that retrying will not fix (permissions, bad configuration, 4xx).
    #[error("permanent storage error: {source}")]
    Permanent {
        /// The store's error.
        #[source]
        source: BoxError,
    },
    /// The storage configuration (URL, options) is invalid.
    #[error("invalid storage configuration: {0}")]
    Config(String),
}

impl StorageError {
    /// Whether a later retry of the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Transient { .. })
    }

    /// Whether this says the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound { .. })
    }
}
