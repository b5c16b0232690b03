//! Conformance suite, fault injection and an in-process S3 server for `ObjectStorage`.
//!
//! - [`conformance`]: the cases every [`diskless_storage::ObjectStorage`] must pass, one test each
//!   with [`storage_conformance!`](crate::storage_conformance) (or all at once with
//!   [`conformance::run_all`]).
//! - [`FaultyStorage`]: a wrapper injecting failures, ambiguous uploads, latency, unreadable keys
//!   and upload stalls, deterministically from a seed.
//! - `S3TestServer` (feature `s3-server`): an S3 server (s3s + s3s-fs) on 127.0.0.1 and the
//!   client settings to reach it.

pub mod conformance;
mod faulty;
#[cfg(feature = "s3-server")]
mod s3_server;

pub use faulty::{FaultConfig, FaultEvent, FaultKind, FaultyStorage, InjectedFault, Latency, Op};
#[cfg(feature = "s3-server")]
pub use s3_server::{InjectedLatency, RequestCounts, S3TestServer};
