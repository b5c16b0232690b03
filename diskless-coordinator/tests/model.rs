//! Model-based test: random operation sequences applied to SQLite and to the reference model give
//! equal results and equal state.

// Test code: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use diskless_coordinator::ManualClock;
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_testkit::coordinator::conformance::{Harness, START_MS};
use diskless_testkit::coordinator::ops::{check_against_model, ops_strategy};
use proptest::prelude::*;
use std::sync::Arc;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// On a database file: writes on the write connection, reads on the read pool.
    #[test]
    fn sqlite_file_matches_model(ops in ops_strategy(40)) {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let clock = ManualClock::new(START_MS);
            let coordinator = SqliteCoordinator::open(
                dir.path().join("model.db"),
                SqliteOptions::default().with_synchronous(Synchronous::Off),
                clock.clone(),
            )
            .await
            .unwrap();
            let coordinator = Arc::new(coordinator);
            check_against_model(Harness { coordinator: coordinator.clone(), clock }, &ops).await;
            coordinator.close().await;
        });
    }

    /// In memory: reads share the write connection.
    #[test]
    fn sqlite_in_memory_matches_model(ops in ops_strategy(40)) {
        runtime().block_on(async {
            let clock = ManualClock::new(START_MS);
            let coordinator = SqliteCoordinator::in_memory(clock.clone()).await.unwrap();
            check_against_model(Harness { coordinator: Arc::new(coordinator), clock }, &ops).await;
        });
    }
}
