//! The conformance suite of diskless-testkit against every implementation in this crate, one test
//! per case and implementation (`sqlite_file::commit_validation`, ...). PostgreSQL runs it in
//! `postgres.rs`, the sharded router in `sharded.rs`.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::coordinator_conformance;
use std::sync::Arc;

coordinator_conformance!(model, async |clock| {
    Arc::new(InMemoryCoordinator::new(clock))
});

// Every case on its own database file (WAL, read pool, default durability).
coordinator_conformance!(sqlite_file, async |clock| {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = SqliteCoordinator::open(
        dir.path().join("case.db"),
        SqliteOptions::default().with_synchronous(Synchronous::Normal),
        clock,
    )
    .await
    .unwrap();
    (Arc::new(coordinator), dir)
});

coordinator_conformance!(sqlite_in_memory, async |clock| Arc::new(
    SqliteCoordinator::in_memory(clock).await.unwrap()
));
