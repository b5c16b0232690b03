//! Object keys with a chosen UUID v7 time, for tests of the commit deadline, fences and the
//! orphan collector (which read a key's time from its UUID v7).
//!
//! The random bits of these UUIDs hold a number instead of randomness, so that runs are
//! reproducible: [`v7_key`] numbers keys with a process-wide counter (fresh keys, unique in the
//! process), [`v7_key_with`] with a number the caller chooses (the same arguments give the same
//! key).
//!
//! ```
//! use diskless_coordinator::object_key_time_ms;
//! use diskless_testkit::keys;
//!
//! let key = keys::v7_key(1_700_000_000_123);
//! assert!(key.starts_with("wal/"));
//! assert_eq!(object_key_time_ms(&key), Some(1_700_000_000_123));
//! assert_ne!(key, keys::v7_key(1_700_000_000_123));
//! assert_eq!(keys::v7_key_with(5, 1), keys::v7_key_with(5, 1));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use uuid::Uuid;

/// The UUID v7 whose time is `ms` (negative times are taken as 0) and whose random bits hold `n`.
pub fn v7_uuid(ms: i64, n: u64) -> Uuid {
    let mut random = [0u8; 10];
    random[2..].copy_from_slice(&n.to_be_bytes());
    let ms = u64::try_from(ms).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
}

/// The key `wal/<uuid>` of [`v7_uuid`]`(ms, n)`: the same arguments give the same key.
pub fn v7_key_with(ms: i64, n: u64) -> String {
    format!("wal/{}", v7_uuid(ms, n))
}

/// A fresh key `wal/<uuid>` whose UUID v7 time is `ms`, unique in the process (a process-wide
/// counter fills the random bits).
pub fn v7_key(ms: i64) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    v7_key_with(ms, NEXT.fetch_add(1, Ordering::Relaxed))
}
