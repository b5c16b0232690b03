//! The settings of a [`super::SqliteCoordinator`].

use crate::config::{at_least_one, positive, with_setters};
use crate::{CoordinatorError, DEFAULT_MAX_COMMIT_AGE};
use std::time::Duration;

/// When SQLite makes a committed transaction durable (`PRAGMA synchronous`, in WAL mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is synced to disk before it is acknowledged: an acknowledged commit survives a
    /// process kill and a power loss. The default: the coordinator is the source of truth.
    #[default]
    Full,
    /// The WAL is synced at checkpoints only: an acknowledged commit survives a process kill but may
    /// be lost on power loss.
    Normal,
    /// No syncs at all (tests and benchmarks only).
    Off,
}

/// Options of [`super::SqliteCoordinator::open`]: `SqliteOptions::default()` then a `with_*` setter
/// per field to change. Checked by the constructor that takes them ([`SqliteOptions::validate`]):
/// an invalid value is refused, never adjusted.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Durability of commits. Default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long a statement waits for a lock held by another connection before failing with
    /// [`CoordinatorError::Unavailable`]. A read also waits this long (but at least 1 s) for a
    /// connection of the read pool. Default 5 s.
    pub busy_timeout: Duration,
    /// Connections of the read pool (find_batches, list_offsets, ...), at least 1. Default 4.
    pub read_connections: u32,
    /// Create the database file when it does not exist. Default true.
    pub create_if_missing: bool,
    /// Prepared statements cached per connection (0: none). Default 256.
    pub statement_cache_capacity: usize,
    /// The commit deadline: a commit of a key whose UUID v7 time is older than `now -
    /// max_commit_age` (coordinator clock, read inside the commit transaction) is refused with
    /// [`CoordinatorError::DeadlineExceeded`]. Positive. Default [`DEFAULT_MAX_COMMIT_AGE`] (10
    /// minutes).
    pub max_commit_age: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            read_connections: 4,
            create_if_missing: true,
            statement_cache_capacity: 256,
            max_commit_age: DEFAULT_MAX_COMMIT_AGE,
        }
    }
}

with_setters!(SqliteOptions {
    with_synchronous => synchronous: [Synchronous],
    with_busy_timeout => busy_timeout: [Duration],
    with_read_connections => read_connections: [u32],
    with_create_if_missing => create_if_missing: [bool],
    with_statement_cache_capacity => statement_cache_capacity: [usize],
    with_max_commit_age => max_commit_age: [Duration],
});

impl SqliteOptions {
    /// Checks every field against its documented rule: [`CoordinatorError::InvalidRequest`] naming
    /// the first field that breaks it.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        at_least_one("read_connections", self.read_connections)?;
        positive("max_commit_age", self.max_commit_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_values_are_refused_not_adjusted() {
        assert!(SqliteOptions::default().validate().is_ok());
        let zero_readers = SqliteOptions::default().with_read_connections(0);
        assert_eq!(zero_readers.read_connections, 0, "set as given");
        let e = zero_readers.validate().unwrap_err();
        assert!(
            matches!(&e, CoordinatorError::InvalidRequest(m) if m.contains("read_connections")),
            "{e:?}"
        );
        let e = SqliteOptions::default()
            .with_max_commit_age(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("max_commit_age"), "{e}");
    }

    #[tokio::test]
    async fn open_refuses_invalid_options() {
        let options = SqliteOptions::default().with_read_connections(0);
        let clock = crate::ManualClock::new(0);
        let r = super::super::SqliteCoordinator::in_memory_with(options, clock).await;
        assert!(
            matches!(r, Err(CoordinatorError::InvalidRequest(_))),
            "{r:?}"
        );
    }
}
