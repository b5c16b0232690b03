//! Test support for diskless-rs and for users' own implementations of its traits.
//!
//! - [`storage`]: a conformance suite every `ObjectStorage` runs, a deterministic fault-injecting
//!   wrapper, and (feature `s3-server`) an in-process S3 server on 127.0.0.1.
//! - [`coordinator`]: an in-memory reference `BatchCoordinator` written for obviousness, its
//!   conformance suite, and operation generators for model-based property tests.
//! - [`cache`]: a conformance suite every `LocalCache` runs.

pub mod cache;
pub mod coordinator;
pub mod storage;
