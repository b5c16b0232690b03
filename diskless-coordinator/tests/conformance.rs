//! The conformance suite of diskless-testkit against every implementation in this crate.

use diskless_coordinator::ManualClock;
use diskless_coordinator::sqlite::{SqliteCoordinator, SqliteOptions, Synchronous};
use diskless_testkit::coordinator::InMemoryCoordinator;
use diskless_testkit::coordinator::conformance::{self, Harness, START_MS};
use std::sync::Arc;

#[tokio::test]
async fn model_conformance() {
    conformance::run_all(|| async {
        let clock = ManualClock::new(START_MS);
        Harness {
            coordinator: Arc::new(InMemoryCoordinator::new(clock.clone())),
            clock,
        }
    })
    .await;
}

/// Every case on its own database file (WAL, read pool, default durability).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    conformance::run_all(|| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.path().join(format!("case-{n}.db"));
        async move {
            let clock = ManualClock::new(START_MS);
            let coordinator = SqliteCoordinator::open(
                &path,
                SqliteOptions::default().synchronous(Synchronous::Normal),
                clock.clone(),
            )
            .await
            .unwrap();
            Harness {
                coordinator: Arc::new(coordinator),
                clock,
            }
        }
    })
    .await;
    assert_eq!(
        counter.load(std::sync::atomic::Ordering::Relaxed),
        conformance::CASES.len(),
        "every case ran on its own database"
    );
}

#[tokio::test]
async fn sqlite_in_memory_conformance() {
    conformance::run_all(|| async {
        let clock = ManualClock::new(START_MS);
        Harness {
            coordinator: Arc::new(SqliteCoordinator::in_memory(clock.clone()).await.unwrap()),
            clock,
        }
    })
    .await;
}
