//! What every diskless-rs crate shares, and nothing else (as `slatedb-common` is for SlateDB):
//!
//! - [`Clock`] — the one source of wall-clock time, injected into coordinators, writers, fetchers
//!   and lifecycle workers so that tests and simulations see one time ([`SystemClock`] in
//!   production, [`ManualClock`] in tests);
//! - [`entropy_seed`] — the one place library code takes randomness from the operating system,
//!   for components whose seed was not injected;
//! - [`BoxError`] — the boxed error source the crates' error enums carry;
//! - [`metrics`] — the names, units and labels of every metric the crates emit through the
//!   [`metrics`](https://docs.rs/metrics) facade;
//! - [`with_setters!`] — the `with_<field>` setters of every settings struct, from one list;
//! - [`SegmentLayout`] and [`Section`] — the layout of a tiered segment object, which storage reads
//!   sections by and the coordinator stores with each segment.

mod clock;
pub mod metrics;
mod seed;
mod segment_layout;

pub use clock::{Clock, ManualClock, SystemClock};
pub use seed::entropy_seed;
pub use segment_layout::{Section, SegmentLayout};

/// A boxed error source, as carried by `StorageError`, `CoordinatorError` and `CacheError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `with_<field>(mut self, value) -> Self` for each listed field of a settings struct, each
/// documented as setting that field; `into` takes `impl Into<T>`. Every settings struct of the
/// workspace (`WalWriterConfig`, `FetcherConfig`, the lifecycle configs, `RetryConfig`, the
/// coordinators' options, ...) gets its setters from here, so they all read and behave alike.
///
/// ```
/// #[derive(Default)]
/// pub struct Settings {
///     /// How many.
///     pub count: u32,
///     /// Its name.
///     pub name: String,
/// }
/// diskless_common::with_setters!(Settings {
///     with_count => count: [u32],
///     with_name => name: into [String],
/// });
/// let s = Settings::default().with_count(3).with_name("x");
/// assert_eq!((s.count, s.name.as_str()), (3, "x"));
/// ```
#[macro_export]
macro_rules! with_setters {
    ($ty:ident {
        $($setter:ident => $field:ident: $($into:ident)? [$t:ty]),* $(,)?
    }) => {
        impl $ty {
            $($crate::with_setters!(@one $ty $setter $field [$($into)?] $t);)*
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
