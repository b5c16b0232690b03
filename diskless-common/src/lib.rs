//! What every diskless-rs crate shares, and nothing else (as `slatedb-common` is for SlateDB):
//!
//! - [`Clock`] — the one source of wall-clock time, injected into coordinators, writers, fetchers
//!   and lifecycle workers so that tests and simulations see one time ([`SystemClock`] in
//!   production, [`ManualClock`] in tests);
//! - [`entropy_seed`] — the one place library code takes randomness from the operating system,
//!   for components whose seed was not injected;
//! - [`BoxError`] — the boxed error source the crates' error enums carry;
//! - [`metrics`] — the names, units and labels of every metric the crates emit through the
//!   [`metrics`](https://docs.rs/metrics) facade.

mod clock;
pub mod metrics;
mod seed;

pub use clock::{Clock, ManualClock, SystemClock};
pub use seed::entropy_seed;

/// A boxed error source, as carried by `StorageError`, `CoordinatorError` and `CacheError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
