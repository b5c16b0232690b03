//! The commit deadline and orphan fences: the two rules that make orphan collection safe.
//!
//! An object uploaded but never committed is an orphan; the orphan collector deletes it. A commit that
//! is still in flight when the collector decides must never land on a deleted object. Two rules,
//! enforced by every coordinator **inside its commit transaction** (not before a wait), close this:
//!
//! 1. **Deadline.** A commit of a key whose UUID v7 time `t` is older than `now - max_commit_age`
//!    (the coordinator's own clock, read after the commit holds its locks) is refused:
//!    [`CoordinatorError::DeadlineExceeded`], nothing applied ([`check_commit_deadline`]).
//! 2. **Fence.** The collector deletes only keys that [`crate::BatchCoordinator::fence_orphans`]
//!    returned. That call atomically leaves known objects alone and records a fence for the others; a
//!    commit of a fenced key is refused: [`CoordinatorError::ObjectFenced`], nothing applied. The
//!    coordinator serializes the fence and the commit (one writer in SQLite, a per-key lock in
//!    PostgreSQL, one mutex in the model): either the commit landed first (the object is known and
//!    not fenced) or it is refused. No clock and no bound on call duration is assumed.
//!
//! The deadline only bounds how long a fence must be kept: once `t < now - max_commit_age`, every
//! commit of the key is refused by rule 1, so fences older than [`FENCE_RETENTION_FACTOR`] ×
//! `max_commit_age` are dropped.
//!
//! The same deadline bounds how long **producer state** must be kept (issue #25). The duplicate
//! check, the epoch and the transaction guard (`txn_seq` above the last ended transaction) live
//! in a producer's state in a partition; a commit that finds no state treats the producer as new
//! and accepts it. A commit can land up to `max_commit_age` after its key's time, so a state must
//! outlive every commit it could still guard: [`producer_expired`] never expires a state updated
//! less than [`PRODUCER_STATE_FLOOR_FACTOR`] × `max_commit_age` ago, whatever the topic's
//! `producer.id.expiration.ms` (one `max_commit_age` for the late commit, one as the allowance for
//! the skew between the clock that made the key and the coordinator's, and for the time a batch
//! waits in a writer before its segment's key is made). Every coordinator applies it inside its
//! expiry transaction (the model's `expire_producers`, SQLite's `EXPIRED_PRODUCERS`, PostgreSQL's
//! `expire_partition` and its candidate walk, with the schema's largest `max_commit_age`).

use crate::CoordinatorError;
use std::time::Duration;
use uuid::Uuid;

/// The default `max_commit_age` of every coordinator: 10 minutes. A writer's commit timeout
/// (`WalWriterConfig::commit_timeout`) must be well below it, and the orphan collector's candidate age
/// at least it plus the clock skew between hosts (otherwise it fences objects whose commit could still
/// succeed, which costs the producer a retry, never data).
pub const DEFAULT_MAX_COMMIT_AGE: Duration = Duration::from_secs(10 * 60);

/// Fences are kept until their key's time is older than this many `max_commit_age`s.
pub const FENCE_RETENTION_FACTOR: i64 = 2;

/// Producer state is kept at least this many `max_commit_age`s after its last update, whatever
/// the topic's `producer.id.expiration.ms` ([`producer_expired`]).
pub const PRODUCER_STATE_FLOOR_FACTOR: i64 = 2;

/// The most expired fences one `fence_orphans` call drops (bounded work per call).
pub const FENCE_EXPIRY_BATCH: u32 = 1000;

/// The UUID v7 time (ms) in an object key's last path segment, if it has one: an RFC 4122 (RFC 9562)
/// variant UUID of version 7. Anything else has no time: it is never refused by the deadline, never
/// fenced and never collected as an orphan.
///
/// ```
/// use diskless_coordinator::object_key_time_ms;
/// assert_eq!(object_key_time_ms("wal/not-a-uuid"), None);
/// assert_eq!(object_key_time_ms("wal/0188e1a6-8b5b-7000-8000-000000000000"), Some(1_687_412_968_283));
/// ```
pub fn object_key_time_ms(key: &str) -> Option<i64> {
    let last = key.rsplit('/').next()?;
    let uuid = Uuid::try_parse(last).ok()?;
    if uuid.get_version_num() != 7 || uuid.get_variant() != uuid::Variant::RFC4122 {
        return None;
    }
    let (secs, nanos) = uuid.get_timestamp()?.to_unix();
    i64::try_from(secs)
        .ok()?
        .checked_mul(1000)?
        .checked_add(i64::from(nanos / 1_000_000))
}

/// `max_commit_age` in milliseconds, saturating.
pub fn max_age_ms(max_commit_age: Duration) -> i64 {
    i64::try_from(max_commit_age.as_millis()).unwrap_or(i64::MAX)
}

/// Rule 1: refuses a commit of `key` at coordinator time `now_ms` when the key's UUID v7 time is older
/// than `now_ms - max_commit_age` (a key exactly at the limit is accepted). Keys without a v7 time
/// are never refused. Call it inside the commit transaction, after the locks are held, with the clock
/// read there.
pub fn check_commit_deadline(
    key: &str,
    now_ms: i64,
    max_commit_age: Duration,
) -> Result<(), CoordinatorError> {
    let Some(t) = object_key_time_ms(key) else {
        return Ok(());
    };
    let limit = now_ms.saturating_sub(max_age_ms(max_commit_age));
    if t < limit {
        return Err(CoordinatorError::DeadlineExceeded(format!(
            "object {key} is {} ms older than the commit deadline",
            limit.saturating_sub(t)
        )));
    }
    Ok(())
}

/// The least time (ms) a producer's state is kept after its last update:
/// [`PRODUCER_STATE_FLOOR_FACTOR`] × `max_commit_age`, saturating.
pub fn producer_state_floor_ms(max_commit_age: Duration) -> i64 {
    max_age_ms(max_commit_age).saturating_mul(PRODUCER_STATE_FLOOR_FACTOR)
}

/// Whether a producer state last updated at `last_append_ms` may be expired at coordinator time
/// `now_ms` under a topic's `producer.id.expiration.ms` (`expiration_ms`): Kafka's
/// `isProducerExpired` (`now - last >= expiration`, and no transaction open, which the caller
/// checks), with the expiration raised to [`producer_state_floor_ms`] so that no commit the state
/// could guard can land after it is gone (module docs).
///
/// ```
/// use diskless_coordinator::producer_expired;
/// use std::time::Duration;
/// let age = Duration::from_secs(600); // the default max_commit_age: a floor of 20 minutes
/// assert!(!producer_expired(1_000 + 60_000, 1_000, 60_000, age));
/// assert!(!producer_expired(1_000 + 1_199_999, 1_000, 60_000, age));
/// assert!(producer_expired(1_000 + 1_200_000, 1_000, 60_000, age));
/// // A topic setting above the floor rules.
/// assert!(!producer_expired(1_000 + 1_200_000, 1_000, 86_400_000, age));
/// ```
pub fn producer_expired(
    now_ms: i64,
    last_append_ms: i64,
    expiration_ms: i64,
    max_commit_age: Duration,
) -> bool {
    now_ms.saturating_sub(last_append_ms)
        >= expiration_ms.max(producer_state_floor_ms(max_commit_age))
}

/// The key time below which fences may be dropped at coordinator time `now_ms`.
pub fn fence_expiry_before(now_ms: i64, max_commit_age: Duration) -> i64 {
    now_ms.saturating_sub(max_age_ms(max_commit_age).saturating_mul(FENCE_RETENTION_FACTOR))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_at(ms: u64) -> String {
        let ts =
            uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, (ms % 1000) as u32 * 1_000_000);
        format!("wal/{}", Uuid::new_v7(ts))
    }

    #[test]
    fn key_times() {
        assert_eq!(
            object_key_time_ms(&key_at(1_700_000_000_123)),
            Some(1_700_000_000_123)
        );
        assert_eq!(object_key_time_ms("wal/not-a-uuid"), None);
        let v4 = uuid::Builder::from_random_bytes([0x5a; 16]).into_uuid();
        assert_eq!(object_key_time_ms(&format!("wal/{v4}")), None);
        // Version 7 bits but not the RFC variant: no time (PostgreSQL's parser agrees).
        let mut bytes = *Uuid::parse_str(&key_at(1_700_000_000_123)[4..])
            .unwrap()
            .as_bytes();
        bytes[8] &= 0x3f; // variant bits 00: NCS
        assert_eq!(
            object_key_time_ms(&format!("wal/{}", Uuid::from_bytes(bytes))),
            None
        );
    }

    #[test]
    fn deadline_boundary() {
        let age = Duration::from_secs(60);
        let now = 1_700_000_100_000;
        assert!(check_commit_deadline(&key_at(1_700_000_040_000), now, age).is_ok());
        assert!(matches!(
            check_commit_deadline(&key_at(1_700_000_039_999), now, age),
            Err(CoordinatorError::DeadlineExceeded(_))
        ));
        assert!(check_commit_deadline("wal/plain", now, age).is_ok());
    }
}
