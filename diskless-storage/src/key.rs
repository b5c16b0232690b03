//! Object keys: `<prefix>/<uuid v7>`, validated before they reach any backend.

use crate::StorageError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A validated object key.
///
/// A key is one or more `/`-separated segments; no segment is empty, `.` or `..`, and no character
/// is a control character or a backslash, so a key can never escape a filesystem backend's root. Keys
/// made by [`ObjectKey::generate`] end in a time-ordered UUID (v7), from which
/// [`ObjectKey::created_at`] reads the object's age.
///
/// ```
/// use diskless_storage::ObjectKey;
/// let key = ObjectKey::generate("wal/cluster-1").unwrap();
/// assert!(key.as_str().starts_with("wal/cluster-1/"));
/// assert!(key.created_at().is_some());
/// assert!(ObjectKey::parse("wal/../etc/passwd").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

/// The longest key accepted (S3's limit).
pub const MAX_KEY_LEN: usize = 1024;

impl ObjectKey {
    /// A fresh key `<prefix>/<uuid v7>` under a validated prefix. An empty prefix gives `<uuid v7>`.
    pub fn generate(prefix: &str) -> Result<ObjectKey, StorageError> {
        Self::generate_with_uuid(prefix, Uuid::now_v7())
    }

    /// A key `<prefix>/<uuid>` with the given UUID (for deterministic tests).
    pub fn generate_with_uuid(prefix: &str, uuid: Uuid) -> Result<ObjectKey, StorageError> {
        if prefix.is_empty() {
            return Ok(ObjectKey(uuid.to_string()));
        }
        validate_prefix(prefix)?;
        Ok(ObjectKey(format!("{prefix}/{uuid}")))
    }

    /// Validates a key received from outside (a coordinator, a listing, a user).
    pub fn parse(key: &str) -> Result<ObjectKey, StorageError> {
        validate_prefix(key)?;
        Ok(ObjectKey(key.to_string()))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The UUID in the key's last segment, if it is one.
    pub fn uuid(&self) -> Option<Uuid> {
        let last = self.0.rsplit('/').next()?;
        Uuid::try_parse(last).ok()
    }

    /// When the key was generated, read from a v7 UUID in its last segment.
    pub fn created_at(&self) -> Option<SystemTime> {
        let uuid = self.uuid()?;
        if uuid.get_version_num() != 7 {
            return None;
        }
        let (secs, nanos) = uuid.get_timestamp()?.to_unix();
        Some(UNIX_EPOCH + Duration::new(secs, nanos))
    }
}

/// Where a writer's object keys come from: a UUID v7 for the time the writer's clock gives, with
/// random bits that make keys unique across writers. Injected (like the clock) so that a simulation
/// or a test decides every key; [`RandomKeys`] is the production source, [`SeededKeys`] the
/// deterministic one.
pub trait KeySource: Send + Sync + std::fmt::Debug {
    /// A fresh UUID v7 whose time is `now_ms` (milliseconds since the Unix epoch; negative values
    /// are taken as 0).
    fn next_uuid(&self, now_ms: i64) -> Uuid;
}

/// Keys with random bits from the operating system's generator (the default).
///
/// ```
/// use diskless_storage::{KeySource, ObjectKey, RandomKeys};
/// let uuid = RandomKeys.next_uuid(1_700_000_000_000);
/// let key = ObjectKey::generate_with_uuid("wal", uuid).unwrap();
/// assert_eq!(key.created_at().unwrap(), std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_000));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomKeys;

impl KeySource for RandomKeys {
    fn next_uuid(&self, now_ms: i64) -> Uuid {
        let ms = u64::try_from(now_ms).unwrap_or(0);
        let mut random = [0u8; 10];
        random.copy_from_slice(&Uuid::new_v4().as_bytes()[..10]);
        uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
    }
}

/// Keys whose random bits come from a seeded generator: the same seed and clock give the same keys.
/// Give each writer of one simulation its own seed.
///
/// ```
/// use diskless_storage::{KeySource, SeededKeys};
/// let (a, b) = (SeededKeys::new(7), SeededKeys::new(7));
/// assert_eq!(a.next_uuid(1_000), b.next_uuid(1_000));
/// assert_ne!(a.next_uuid(1_000), a.next_uuid(1_000));
/// ```
#[derive(Debug)]
pub struct SeededKeys {
    rng: parking_lot::Mutex<fastrand::Rng>,
}

impl SeededKeys {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SeededKeys {
            rng: parking_lot::Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }
}

impl KeySource for SeededKeys {
    fn next_uuid(&self, now_ms: i64) -> Uuid {
        let ms = u64::try_from(now_ms).unwrap_or(0);
        let mut random = [0u8; 10];
        self.rng.lock().fill(&mut random);
        uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Checks a key or a key prefix: non-empty, at most [`MAX_KEY_LEN`] bytes, no leading or trailing
/// `/`, no empty, `.` or `..` segment, no control characters or backslashes.
pub fn validate_prefix(prefix: &str) -> Result<(), StorageError> {
    let invalid = |reason| {
        Err(StorageError::InvalidKey {
            key: prefix.chars().take(200).collect(),
            reason,
        })
    };
    if prefix.is_empty() {
        return invalid("empty");
    }
    if prefix.len() > MAX_KEY_LEN {
        return invalid("longer than 1024 bytes");
    }
    if prefix.starts_with('/') || prefix.ends_with('/') {
        return invalid("leading or trailing '/'");
    }
    for segment in prefix.split('/') {
        if segment.is_empty() {
            return invalid("empty segment");
        }
        if segment == "." || segment == ".." {
            return invalid("'.' or '..' segment");
        }
    }
    if prefix.chars().any(|c| c.is_control() || c == '\\') {
        return invalid("control character or backslash");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_keys() {
        for bad in [
            "", "/a", "a/", "a//b", "..", "a/../b", "./a", "a\\b", "a\nb", "a\0b",
        ] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ObjectKey::parse(&"a".repeat(MAX_KEY_LEN + 1)).is_err());
        for good in ["a", "a/b", "wal/0193-abc", "a.b/c..d"] {
            assert!(ObjectKey::parse(good).is_ok(), "{good:?} rejected");
        }
    }

    #[test]
    fn generated_keys_are_time_ordered_and_dated() {
        let before = SystemTime::now() - Duration::from_secs(1);
        let a = ObjectKey::generate("p").unwrap();
        let b = ObjectKey::generate("p").unwrap();
        assert!(a < b);
        let t = a.created_at().unwrap();
        assert!(t >= before && t <= SystemTime::now() + Duration::from_secs(1));
        assert!(ObjectKey::generate("bad/").is_err());
        assert_eq!(ObjectKey::parse("p/not-a-uuid").unwrap().created_at(), None);
        let v4 = ObjectKey::generate_with_uuid("p", Uuid::new_v4()).unwrap();
        assert_eq!(v4.created_at(), None);
    }
}
