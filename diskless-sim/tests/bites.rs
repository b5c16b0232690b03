//! The simulation catches real defects: run against components with a known bug, it reports the
//! broken invariant within a few seeds.
#![allow(clippy::print_stderr)] // A soak reports each seed and each failure.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diskless_coordinator::{
    BatchCoordinator, CommitBatchResult, CommitFileRequest, CoordinatorError, CoordinatorLayer,
    FindBatchesRequest, FindBatchesResponse, IsolationLevel, Layered, TxnMarker, TxnMarkerResult,
    object_key_time_ms,
};
use diskless_sim::{Components, SimConfig, Variant, Violation, run_with};
use diskless_storage::ObjectStoreStorage;
use diskless_testkit::coordinator::InMemoryCoordinator;

/// Which defect a [`Mutant`] has.
#[derive(Debug, Clone, Copy)]
enum Bug {
    /// The orphan collector's fence is not enforced at the commit point: `fence_orphans` answers
    /// the unknown keys but records nothing, so a commit stalled past the collector's two phases
    /// still lands, on an object the collector deleted (the defect #12 fixed).
    NoFence,
    /// `find_batches` leaves out the second batch it found: readers see a gap.
    SkipsABatch,
    /// `read_committed` reads are answered as `read_uncommitted` ones (past the last stable
    /// offset, with an empty aborted list).
    IgnoresIsolation,
    /// `read_committed` reads are answered without their aborted transactions.
    DropsAborted,
    /// ABORT markers of odd partitions are written as COMMIT markers.
    CommitsAborts,
    /// The verification guard is lost: every transactional batch claims the newest transaction
    /// (a stale batch landing after its transaction's marker opens a new one).
    NoTxnSeqGuard,
}

/// The reference model with one defect: a layer that changes only the operations with the bug.
#[derive(Debug)]
struct Mutant {
    bug: Bug,
}

#[async_trait]
impl CoordinatorLayer for Mutant {
    async fn find_batches(
        &self,
        inner: &dyn BatchCoordinator,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        if let Bug::IgnoresIsolation = self.bug {
            let uncommitted: Vec<FindBatchesRequest> = requests
                .iter()
                .map(|r| FindBatchesRequest {
                    isolation: IsolationLevel::ReadUncommitted,
                    ..r.clone()
                })
                .collect();
            let mut found = inner.find_batches(&uncommitted, fetch_max_bytes).await?;
            for (answer, request) in found.iter_mut().zip(requests) {
                if request.isolation == IsolationLevel::ReadCommitted && answer.error.is_ok() {
                    answer.last_stable_offset = answer.high_watermark;
                    answer.aborted = Some(Vec::new());
                }
            }
            return Ok(found);
        }
        let mut found = inner.find_batches(requests, fetch_max_bytes).await?;
        for answer in &mut found {
            match self.bug {
                Bug::SkipsABatch if answer.batches.len() > 2 => {
                    answer.batches.remove(1);
                }
                Bug::DropsAborted => {
                    if let Some(aborted) = &mut answer.aborted {
                        aborted.clear();
                    }
                }
                _ => {}
            }
        }
        Ok(found)
    }

    async fn write_txn_markers(
        &self,
        inner: &dyn BatchCoordinator,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        if let Bug::CommitsAborts = self.bug {
            let flipped: Vec<TxnMarker> = markers
                .iter()
                .map(|m| TxnMarker {
                    commit: m.commit || m.partition.partition % 2 == 1,
                    ..*m
                })
                .collect();
            return inner.write_txn_markers(&flipped).await;
        }
        inner.write_txn_markers(markers).await
    }

    async fn commit_file(
        &self,
        inner: &dyn BatchCoordinator,
        mut request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        if let Bug::NoTxnSeqGuard = self.bug {
            for batch in &mut request.batches {
                if batch.transactional {
                    batch.txn_seq = Some(i64::MAX);
                }
            }
        }
        inner.commit_file(request).await
    }

    async fn fence_orphans(
        &self,
        inner: &dyn BatchCoordinator,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        match self.bug {
            Bug::NoFence => {
                let known = inner.known_objects(object_keys).await?;
                Ok(object_keys
                    .iter()
                    .filter(|k| !known.contains(k) && object_key_time_ms(k).is_some())
                    .cloned()
                    .collect())
            }
            _ => inner.fence_orphans(object_keys).await,
        }
    }
}

/// Runs seeds from 1 against a mutant until one fails; returns that violation.
fn first_violation(bug: Bug, max_seeds: u64) -> Option<Box<Violation>> {
    for seed in 1..=max_seeds {
        let config = SimConfig::new(seed, Variant::Model);
        let result = run_with(&config, &format!("{bug:?}"), |clock| async move {
            let max_commit_age = Duration::from_secs(60);
            let model = InMemoryCoordinator::new(clock).with_max_commit_age(max_commit_age);
            let mutant = Layered::new(Arc::new(model), Mutant { bug });
            Ok(Components::new(
                Arc::new(ObjectStoreStorage::in_memory()),
                Arc::new(mutant),
                max_commit_age,
            ))
        });
        if let Err(v) = result {
            eprintln!("{bug:?} found at seed {seed}:\n{v}");
            return Some(v);
        }
    }
    None
}

#[test]
fn a_commit_point_without_the_orphan_fence_is_caught() {
    let v = first_violation(Bug::NoFence, 10).expect("no violation in 10 seeds");
    assert!(
        [diskless_sim::OBJECTS, diskless_sim::ACKED_READABLE].contains(&v.invariant),
        "{v}"
    );
}

#[test]
fn a_coordinator_that_skips_a_batch_is_caught() {
    let v = first_violation(Bug::SkipsABatch, 5).expect("no violation in 5 seeds");
    assert!(
        [diskless_sim::OFFSETS, diskless_sim::CONSUMER].contains(&v.invariant),
        "{v}"
    );
}

#[test]
fn read_committed_answered_as_read_uncommitted_is_caught() {
    let v = first_violation(Bug::IgnoresIsolation, 5).expect("no violation in 5 seeds");
    assert_eq!(v.invariant, diskless_sim::NO_DIRTY_READ, "{v}");
}

#[test]
fn read_committed_without_the_aborted_list_is_caught() {
    let v = first_violation(Bug::DropsAborted, 5).expect("no violation in 5 seeds");
    assert_eq!(v.invariant, diskless_sim::NO_DIRTY_READ, "{v}");
}

#[test]
fn abort_markers_written_as_commits_are_caught() {
    let v = first_violation(Bug::CommitsAborts, 5).expect("no violation in 5 seeds");
    assert!(
        [diskless_sim::NO_DIRTY_READ, diskless_sim::ATOMIC].contains(&v.invariant),
        "{v}"
    );
}

#[test]
fn a_lost_verification_guard_is_caught() {
    // A stale batch must land after its transaction's markers (a commit stalled longer than the
    // producer's delivery timeout and the transaction's end): rarer than the other defects.
    let v = first_violation(Bug::NoTxnSeqGuard, 30).expect("no violation in 30 seeds");
    assert!(
        [
            diskless_sim::LSO,
            diskless_sim::NO_DIRTY_READ,
            diskless_sim::ATOMIC
        ]
        .contains(&v.invariant),
        "{v}"
    );
}
