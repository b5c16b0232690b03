//! What the settings of every coordinator share ([`crate::sqlite::SqliteOptions`],
//! [`crate::postgres::PostgresOptions`], [`crate::sharded::ShardedConfig`]): `with_<field>` setters
//! generated from one list, and one validation policy. Each settings struct has one `validate`,
//! called by the constructor that takes it; an invalid value is **rejected** with
//! [`CoordinatorError::InvalidRequest`] naming the field, never clamped.

use crate::CoordinatorError;

/// The workspace's one setter generator ([`diskless_common::with_setters!`]).
pub(crate) use diskless_common::with_setters;

/// The error of a settings value that breaks its rule: `field` is the settings struct's field.
pub(crate) fn invalid(field: &str, reason: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::InvalidRequest(format!("invalid configuration: {field}: {reason}"))
}

/// Rejects zero for a count setting that needs at least one.
pub(crate) fn at_least_one(field: &str, value: u32) -> Result<(), CoordinatorError> {
    if value == 0 {
        Err(invalid(field, "must be at least 1"))
    } else {
        Ok(())
    }
}

/// Rejects a zero duration for a setting that needs a positive one.
pub(crate) fn positive(field: &str, value: std::time::Duration) -> Result<(), CoordinatorError> {
    if value.is_zero() {
        Err(invalid(field, "must be positive"))
    } else {
        Ok(())
    }
}
