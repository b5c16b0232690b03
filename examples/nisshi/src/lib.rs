//! Diskless topics inside Nisshi (formerly tansu), pinned to tansu 0.6.0: classic and diskless
//! topics side by side in one broker nobody on this project wrote.
//!
//! - [`DisklessStorage`] implements Nisshi's `Storage` trait: a diskless topic's data goes
//!   through the library's `WalWriter` / `Fetcher` / `BatchCoordinator` (one `DisklessNode`),
//!   every other call to Nisshi's own engine (SQLite, PostgreSQL).
//! - [`services`] replaces Nisshi's Produce handler (diskless partitions of a request committed
//!   together, not one after another) and adds the EndTxn route tansu 0.6.0 lacks;
//!   [`txn_admin`] adds DescribeProducers and WriteTxnMarkers (ending a hanging transaction).
//! - [`server`] is the accept loop with those routes; [`run`] starts a node; the
//!   `nisshi-diskless` binary is [`config::Config`] on the command line.
//!
//! See README.md for what a host had to write and what moving to Nisshi 0.8 takes.

pub mod admin;
pub mod config;
mod convert;
pub mod fetch;
pub mod metadata;
pub mod run;
pub mod server;
pub mod services;
pub mod storage;
mod topics;
pub mod txn_admin;

pub use storage::{BuildError, DISKLESS_ENABLE, DisklessSettings, DisklessStorage};
pub use topics::REFRESH_INTERVAL;
