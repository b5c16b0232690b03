//! What the settings of every coordinator share ([`crate::sqlite::SqliteOptions`],
//! [`crate::postgres::PostgresOptions`], [`crate::sharded::ShardedConfig`]): `with_<field>` setters
//! generated from one list, and one validation policy. Each settings struct has one `validate`,
//! called by the constructor that takes it; an invalid value is **rejected** with
//! [`CoordinatorError::InvalidRequest`] naming the field, never clamped.

use crate::CoordinatorError;

/// `with_<field>(mut self, value) -> Self` for each listed field of a settings struct, each
/// documented as setting that field; `into` takes `impl Into<T>`.
macro_rules! with_setters {
    ($ty:ident {
        $($setter:ident => $field:ident: $($into:ident)? [$t:ty]),* $(,)?
    }) => {
        impl $ty {
            $($crate::config::with_setters!(@one $ty $setter $field [$($into)?] $t);)*
        }
    };
    (@one $ty:ident $setter:ident $field:ident [] $t:ty) => {
        #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
        pub fn $setter(mut self, value: $t) -> Self {
            self.$field = value;
            self
        }
    };
    (@one $ty:ident $setter:ident $field:ident [into] $t:ty) => {
        #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
        pub fn $setter(mut self, value: impl Into<$t>) -> Self {
            self.$field = value.into();
            self
        }
    };
}
pub(crate) use with_setters;

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
