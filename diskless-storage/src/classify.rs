//! Mapping of `object_store` errors to [`StorageError`].
//!
//! `object_store` reports HTTP failures of cloud stores as `Error::Generic` wrapping a private
//! retry error; its `Display` carries the status code (`"... status code: 503 Service
//! Unavailable"`) and transport failures carry a public `HttpError` with a kind. We classify:
//!
//! - `NotFound` → [`StorageError::NotFound`]; `AlreadyExists` and `Precondition` (S3 answers
//!   `412` to `If-None-Match: *`) → [`StorageError::AlreadyExists`];
//! - a ranged read that fails for another reason than these is checked against the object's
//!   size by the caller (a range past the end → [`StorageError::InvalidRange`]), since backends
//!   report it differently (HTTP 416, a private error type, or a short read);
//! - HTTP 5xx, 408, 429, an S3 `SlowDown`/`InternalError` body, connection, request, timeout
//!   and interrupted transport errors, I/O timeouts and resets → [`StorageError::Transient`];
//! - everything else (other 4xx, permissions, unsupported operations, configuration, invalid
//!   paths, local I/O errors such as a full disk) → [`StorageError::Permanent`].

use crate::{BoxError, StorageError};
use std::error::Error as StdError;

/// Maps an `object_store` error about `key`.
pub(crate) fn map_error(error: object_store::Error, key: &str) -> StorageError {
    use object_store::Error as E;
    match error {
        E::NotFound { .. } => StorageError::NotFound {
            key: key.to_string(),
            source: Some(Box::new(error)),
        },
        E::AlreadyExists { .. } | E::Precondition { .. } => StorageError::AlreadyExists {
            key: key.to_string(),
            source: Some(Box::new(error)),
        },
        E::InvalidPath { .. } => StorageError::InvalidKey {
            key: key.chars().take(200).collect(),
            reason: "rejected by the object store's path rules",
        },
        E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. }
        | E::UnknownConfigurationKey { .. }
        | E::NotModified { .. } => permanent(error),
        _ => {
            if is_transient(&error) {
                transient(error)
            } else {
                permanent(error)
            }
        }
    }
}

fn transient(error: object_store::Error) -> StorageError {
    StorageError::Transient {
        source: Box::new(error),
    }
}

fn permanent(error: object_store::Error) -> StorageError {
    StorageError::Permanent {
        source: Box::new(error),
    }
}

/// Iterates over an error and its sources.
fn chain<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |e| (*e).source())
}

/// The HTTP status in an error's message (`"status code: 503 ..."`), if any.
pub(crate) fn http_status(error: &(dyn StdError + 'static)) -> Option<u16> {
    const MARKER: &str = "status code: ";
    for e in chain(error) {
        let text = e.to_string();
        if let Some(at) = text.find(MARKER) {
            let digits: String = text[at + MARKER.len()..].chars().take(3).collect();
            if let Ok(code) = digits.parse::<u16>() {
                return Some(code);
            }
        }
    }
    None
}

fn is_transient(error: &object_store::Error) -> bool {
    if let Some(status) = http_status(error) {
        return matches!(status, 408 | 429 | 500..=599);
    }
    for e in chain(error) {
        let text = e.to_string();
        if text.contains("SlowDown") || text.contains("InternalError") {
            return true;
        }
        #[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
        if let Some(http) = e.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as K;
            return matches!(
                http.kind(),
                K::Connect | K::Request | K::Timeout | K::Interrupted | K::Decode
            );
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            return matches!(
                io.kind(),
                K::TimedOut
                    | K::Interrupted
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::ConnectionRefused
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::WouldBlock
            );
        }
    }
    false
}

/// A call attempt cut by its timeout.
#[derive(Debug, thiserror::Error)]
#[error("{operation} attempt timed out after {timeout:?}")]
pub(crate) struct AttemptTimeout {
    pub(crate) operation: &'static str,
    pub(crate) timeout: std::time::Duration,
}

/// A transient error for a timed-out attempt.
pub(crate) fn timeout_error(operation: &'static str, timeout: std::time::Duration) -> StorageError {
    StorageError::Transient {
        source: Box::new(AttemptTimeout { operation, timeout }) as BoxError,
    }
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("Server returned non-2xx status code: {0}: body")]
    struct FakeStatus(&'static str);

    fn generic(source: impl StdError + Send + Sync + 'static) -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: Box::new(source),
        }
    }

    #[test]
    fn classifies_http_statuses() {
        for (status, transient) in [
            ("500 Internal Server Error", true),
            ("503 Service Unavailable", true),
            ("429 Too Many Requests", true),
            ("408 Request Timeout", true),
            ("400 Bad Request", false),
            ("403 Forbidden", false),
            ("404 Not Found", false),
        ] {
            let e = map_error(generic(FakeStatus(status)), "k");
            assert_eq!(e.is_transient(), transient, "{status}");
        }
    }

    #[test]
    fn classifies_variants() {
        let boxed = || Box::new(std::io::Error::other("x")) as BoxError;
        let nf = object_store::Error::NotFound {
            path: "p".into(),
            source: boxed(),
        };
        assert!(map_error(nf, "k").is_not_found());
        let pre = object_store::Error::Precondition {
            path: "p".into(),
            source: boxed(),
        };
        assert!(matches!(
            map_error(pre, "k"),
            StorageError::AlreadyExists { .. }
        ));
        let denied = object_store::Error::PermissionDenied {
            path: "p".into(),
            source: boxed(),
        };
        assert!(matches!(
            map_error(denied, "k"),
            StorageError::Permanent { .. }
        ));
        let io = generic(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(map_error(io, "k").is_transient());
        let slow = generic(std::io::Error::other("<Code>SlowDown</Code>"));
        assert!(map_error(slow, "k").is_transient());
        let full = generic(std::io::Error::other("no space left on device"));
        assert!(matches!(
            map_error(full, "k"),
            StorageError::Permanent { .. }
        ));
    }
}
