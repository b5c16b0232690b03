//! Object keys: `<prefix>/<uuid v7>`, validated before they reach any backend, and the
//! [`KeySource`]s their UUIDs come from.

use crate::StorageError;
use diskless_common::Clock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A validated object key.
///
/// A key is one or more `/`-separated segments; no segment is empty, `.` or `..`, and no character
/// is a control character or a backslash, so a key can never escape a filesystem backend's root.
/// Keys made by [`ObjectKey::generate`] end in a time-ordered UUID (v7) whose time comes from an
/// injected [`Clock`] and whose random bits from a [`KeySource`]; [`ObjectKey::created_at`]
/// reads the object's age back from it.
///
/// ```
/// use diskless_storage::{ManualClock, ObjectKey, SeededKeys};
/// let (keys, clock) = (SeededKeys::new(7), ManualClock::new(1_700_000_000_000));
/// let key = ObjectKey::generate("wal/cluster-1", &keys, clock.as_ref()).unwrap();
/// assert!(key.as_str().starts_with("wal/cluster-1/"));
/// assert_eq!(
///     key.created_at(),
///     Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_000))
/// );
/// assert!(ObjectKey::parse("wal/../etc/passwd").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

/// The longest key accepted (S3's limit).
pub const MAX_KEY_LEN: usize = 1024;

impl ObjectKey {
    /// A fresh key `<prefix>/<uuid v7>` under a validated prefix (an empty prefix gives
    /// `<uuid v7>`): the UUID's time is `clock`'s now, its random bits come from `keys`. The
    /// prefix is checked before anything is drawn from `keys`, so an invalid prefix leaves a
    /// seeded source's sequence untouched.
    pub fn generate(
        prefix: &str,
        keys: &dyn KeySource,
        clock: &dyn Clock,
    ) -> Result<ObjectKey, StorageError> {
        if !prefix.is_empty() {
            validate_prefix(prefix)?;
        }
        Self::generate_with_uuid(prefix, keys.next_uuid(clock.now_ms()))
    }

    /// A key `<prefix>/<uuid>` with the given UUID (a UUID drawn from a [`KeySource`] by the
    /// caller, or a fixed one in a test).
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

/// Where object keys come from: a UUID v7 for the time the caller's clock gives, with random
/// bits that make keys unique across writers. Injected (like the [`Clock`]) so that a simulation
/// or a test decides every key; [`RandomKeys`] is the production source, [`SeededKeys`] the
/// deterministic one. Library code draws keys only from a `KeySource` (`.config/clippy.toml`
/// forbids `Uuid::now_v7` and `Uuid::new_v4`).
pub trait KeySource: Send + Sync + std::fmt::Debug {
    /// A fresh UUID v7 whose time is `now_ms` (milliseconds since the Unix epoch; negative values
    /// are taken as 0).
    fn next_uuid(&self, now_ms: i64) -> Uuid;
}

/// The production [`KeySource`]: [`SeededKeys`] seeded from the operating system's entropy
/// ([`diskless_common::entropy_seed`]), so that two writers (or two processes) draw different
/// keys. Pair it with [`diskless_common::SystemClock`].
///
/// ```
/// use diskless_storage::{KeySource, ObjectKey, RandomKeys, SystemClock};
/// let keys = RandomKeys::new();
/// let uuid = keys.next_uuid(1_700_000_000_000);
/// let key = ObjectKey::generate_with_uuid("wal", uuid).unwrap();
/// assert_eq!(key.created_at().unwrap(), std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_000));
/// let (a, b) = (
///     ObjectKey::generate("wal", &keys, &SystemClock).unwrap(),
///     ObjectKey::generate("wal", &keys, &SystemClock).unwrap(),
/// );
/// assert_ne!(a, b);
/// ```
#[derive(Debug)]
pub struct RandomKeys(SeededKeys);

impl RandomKeys {
    /// A source seeded from [`diskless_common::entropy_seed`].
    pub fn new() -> Self {
        RandomKeys(SeededKeys::new(diskless_common::entropy_seed()))
    }
}

impl Default for RandomKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl KeySource for RandomKeys {
    fn next_uuid(&self, now_ms: i64) -> Uuid {
        self.0.next_uuid(now_ms)
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

/// Shared key sources are key sources (a host may hand one `Arc` to several writers).
impl<T: KeySource + ?Sized> KeySource for std::sync::Arc<T> {
    fn next_uuid(&self, now_ms: i64) -> Uuid {
        (**self).next_uuid(now_ms)
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
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
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
        let clock = diskless_common::ManualClock::new(1_700_000_000_000);
        let keys = SeededKeys::new(1);
        let a = ObjectKey::generate("p", &keys, clock.as_ref()).unwrap();
        clock.advance(1);
        let b = ObjectKey::generate("p", &keys, clock.as_ref()).unwrap();
        assert!(a < b, "a later millisecond sorts after");
        assert_eq!(
            a.created_at(),
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        );
        assert_eq!(a.uuid().map(|u| u.get_version_num()), Some(7));
        assert!(ObjectKey::generate("bad/", &keys, clock.as_ref()).is_err());
        assert_eq!(ObjectKey::parse("p/not-a-uuid").unwrap().created_at(), None);
        let v4 = uuid::Builder::from_random_bytes([7; 16]).into_uuid();
        let v4 = ObjectKey::generate_with_uuid("p", v4).unwrap();
        assert_eq!(v4.created_at(), None);
    }

    #[test]
    fn an_invalid_prefix_draws_nothing() {
        let clock = diskless_common::ManualClock::new(5);
        let (a, b) = (SeededKeys::new(3), SeededKeys::new(3));
        assert!(ObjectKey::generate("a//b", &a, clock.as_ref()).is_err());
        assert_eq!(
            ObjectKey::generate("p", &a, clock.as_ref()).unwrap(),
            ObjectKey::generate("p", &b, clock.as_ref()).unwrap()
        );
    }

    #[test]
    fn random_keys_differ_between_sources() {
        let (a, b) = (RandomKeys::new(), RandomKeys::new());
        assert_ne!(a.next_uuid(0), b.next_uuid(0));
    }
}
