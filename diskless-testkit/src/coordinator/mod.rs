//! The in-memory reference coordinator, its conformance suite and generators.
//!
//! - [`InMemoryCoordinator`]: the reference model of [`diskless_coordinator::BatchCoordinator`].
//! - [`FaultyCoordinator`]: wraps any coordinator; commits fail unapplied, or apply and lose their
//!   answer, or wait.
//! - [`conformance`]: the cases every implementation must pass, one test each with
//!   [`coordinator_conformance!`](crate::coordinator_conformance) (or all at once with
//!   [`conformance::run_all`]).
//! - [`OnlyCapabilities`] and [`CapabilityRecorder`]: layers serving only some capabilities of a
//!   coordinator, and recording which ones calls used.
//! - [`ops`]: proptest strategies for random operation sequences and
//!   [`ops::check_against_model`], the driver of model-based tests.

mod capabilities;
pub mod conformance;
mod faulty;
pub mod model;
pub mod ops;

pub use capabilities::{CapabilityRecorder, OnlyCapabilities, Recorded};
pub use faulty::{CommitFaults, FaultyCoordinator, InjectedCommitFault};
pub use model::InMemoryCoordinator;

#[cfg(test)]
mod tests {
    use super::conformance::{self, Harness, START_MS};
    use super::*;
    use diskless_coordinator::ManualClock;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn harness() -> Harness {
        let clock = ManualClock::new(START_MS);
        Harness {
            coordinator: Arc::new(InMemoryCoordinator::new(clock.clone())),
            clock,
        }
    }

    crate::coordinator_conformance!(model_conformance, async |clock| {
        Arc::new(InMemoryCoordinator::new(clock))
    });

    // The model as a coordinator of the log capability alone: the cases needing more are skipped
    // (`conformance::case_capabilities`), the others pass without any other capability.
    crate::coordinator_conformance!(log_only_model_conformance, async |clock| {
        Arc::new(diskless_coordinator::Layered::new(
            Arc::new(InMemoryCoordinator::new(clock)),
            OnlyCapabilities(diskless_coordinator::Capabilities::LOG),
        ))
    });

    /// A log-only coordinator runs the log cases and no other; the full model runs them all.
    #[test]
    fn a_log_only_coordinator_runs_the_log_cases() {
        use diskless_coordinator::Capabilities;
        let log = conformance::cases_for(Capabilities::LOG);
        assert_eq!(
            conformance::cases_for(Capabilities::ALL).len(),
            conformance::CASES.len()
        );
        assert!(log.contains(&"commit_assigns_consecutive_offsets"));
        assert!(log.contains(&"producer_sequence_gap_rejected"));
        assert!(!log.contains(&"retention_by_time"));
        // 23 of 101 today: most cases also read what other groups serve (object_info, retention).
        assert!(
            log.len() >= 20 && log.len() < conformance::CASES.len() / 2,
            "{}",
            log.len()
        );
    }

    /// `run_all` runs every case (the macro's tests run them one by one).
    #[tokio::test]
    async fn model_passes_run_all() {
        conformance::run_all(async |clock| Arc::new(InMemoryCoordinator::new(clock))).await;
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The driver itself is sound: the model agrees with a second model.
        #[test]
        fn model_agrees_with_itself(ops in ops::ops_strategy(40)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(ops::check_against_model(harness(), &ops));
        }
    }

    /// The generators reach every interesting path of the rules, not just the happy one.
    #[test]
    fn generated_ops_exercise_the_rules() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut runner = TestRunner::deterministic();
        let strategy = ops::ops_strategy(40);
        let mut total = ops::OpStats::default();
        for _ in 0..384 {
            let ops = strategy.new_tree(&mut runner).unwrap().current();
            let s = rt.block_on(ops::check_against_model(harness(), &ops));
            total.appended += s.appended;
            total.duplicates += s.duplicates;
            total.out_of_order += s.out_of_order;
            total.fenced += s.fenced;
            total.unknown_partition += s.unknown_partition;
            total.failed_calls += s.failed_calls;
            total.retention_deleted += s.retention_deleted;
            total.log_start_moves += s.log_start_moves;
            total.objects_collected += s.objects_collected;
            total.partitions_added += s.partitions_added;
            total.configs_altered += s.configs_altered;
            total.txn_appended += s.txn_appended;
            total.invalid_txn_state += s.invalid_txn_state;
            total.markers_written += s.markers_written;
            total.markers_repeated += s.markers_repeated;
            total.markers_refused += s.markers_refused;
            total.aborted_reported += s.aborted_reported;
            total.segments_registered += s.segments_registered;
            total.segments_stale += s.segments_stale;
            total.segments_already_registered += s.segments_already_registered;
            total.segments_deleted += s.segments_deleted;
            total.tiering_candidates += s.tiering_candidates;
            total.txn_records_changed += s.txn_records_changed;
            total.txn_records_finished += s.txn_records_finished;
        }
        let s = &total;
        for (name, n) in [
            ("appended", s.appended),
            ("duplicates", s.duplicates),
            ("out_of_order", s.out_of_order),
            ("fenced", s.fenced),
            ("unknown_partition", s.unknown_partition),
            ("failed_calls", s.failed_calls),
            ("retention_deleted", s.retention_deleted),
            ("log_start_moves", s.log_start_moves),
            ("objects_collected", s.objects_collected),
            ("partitions_added", s.partitions_added),
            ("configs_altered", s.configs_altered),
            ("txn_appended", s.txn_appended),
            ("invalid_txn_state", s.invalid_txn_state),
            ("markers_written", s.markers_written),
            ("markers_repeated", s.markers_repeated),
            ("markers_refused", s.markers_refused),
            ("aborted_reported", s.aborted_reported),
            ("segments_registered", s.segments_registered),
            ("segments_stale", s.segments_stale),
            ("segments_already_registered", s.segments_already_registered),
            ("segments_deleted", s.segments_deleted),
            ("tiering_candidates", s.tiering_candidates),
            ("txn_records_changed", s.txn_records_changed),
            ("txn_records_finished", s.txn_records_finished),
        ] {
            assert!(n >= 5, "generators rarely reach {name}: {total:?}");
        }
    }
}
