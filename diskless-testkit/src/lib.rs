//! Test support for diskless-rs and for users' own implementations of its traits.
//!
//! - [`storage`]: a conformance suite every `ObjectStorage` runs, a deterministic fault-injecting
//!   wrapper, and (feature `s3-server`) an in-process S3 server on 127.0.0.1.
//! - [`coordinator`]: an in-memory reference `BatchCoordinator` written for obviousness, its
//!   conformance suite, and operation generators for model-based property tests.
//! - [`cache`]: a conformance suite every `LocalCache` runs.
//! - [`keys`]: object keys with a chosen UUID v7 time.
//! - `postgres` (feature `postgres`): a PostgreSQL server for tests (skip or require, a fresh
//!   schema per test).
//!
//! Each suite comes with a macro that makes one test per case for an implementation
//! ([`coordinator_conformance!`], [`storage_conformance!`], [`cache_conformance!`]), so that the
//! test runner lists, runs and reports each case on its own.

pub mod cache;
pub mod coordinator;
pub mod fixture;
pub mod kafka_segment;
pub mod keys;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod storage;
