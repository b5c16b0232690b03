//! The conformance suite of [`BatchCoordinator`] implementations.
//!
//! Every case is a `pub async fn` taking a fresh [`Harness`] (an empty coordinator and the
//! [`ManualClock`] it reads) and panicking on a violation. Run them with
//! [`coordinator_conformance!`](crate::coordinator_conformance), which makes one test per case (so
//! that the test runner lists, runs and reports each case on its own), or all in one test with
//! [`run_all`]:
//!
//! ```
//! use diskless_testkit::coordinator::{InMemoryCoordinator, conformance};
//! use std::sync::Arc;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! conformance::run_all(async |clock| Arc::new(InMemoryCoordinator::new(clock))).await;
//! # });
//! ```
//!
//! The cases are listed once, in `__coordinator_conformance_cases!`; [`CASES`],
//! [`CLOCK_SENSITIVE_CASES`], [`MANUAL_CLOCK_CASES`], [`run_all`] and the macro's tests follow
//! from that list, and a unit test checks that it names every `pub async fn` case of this file.

// The cases are tests: an unexpected error fails the case, with the failed call named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fixture::Fixture;
use crate::keys::v7_key;
use diskless_coordinator::{
    BatchCoordinate, BatchCoordinator, CleanupPolicy, Clock, CommitBatch, CommitBatchResult,
    CommitFileRequest, CoordinatorError, CreateTopicRequest, DeleteRecordsRequest,
    EARLIEST_TIMESTAMP, ErrorCode, FindBatchesRequest, LATEST_TIMESTAMP, ListOffsetsRequest,
    ListOffsetsResponse, MAX_PRODUCER_ID_BLOCK, MAX_TIMESTAMP, ManualClock, NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, ObjectInfo, ProducerIdBlock, ProducerState,
    RetentionReport, SystemClock, TimestampType, TopicCompression, TopicConfig, TopicIdPartition,
};
use diskless_coordinator::{Capabilities, Capability};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use uuid::Uuid;

mod tiered;
mod txn;
pub use tiered::*;
pub use txn::*;

/// The clock's start time in every harness of the suite (any positive value works), except the
/// [`CLOCK_SENSITIVE_CASES`] of an implementation with a server clock.
pub const START_MS: i64 = 1_700_000_000_000;

/// The capabilities a case needs besides [`Capability::Log`] (every case not listed needs the
/// log alone). A coordinator runs a case only when it serves all of them
/// ([`BatchCoordinator::capabilities`]); a unit test checks each entry against the calls the
/// case makes, so the table cannot drift from the cases.
#[rustfmt::skip]
const CASE_CAPABILITIES: &[(&str, &[Capability])] = &[
    ("delete_topic", &[Capability::Lifecycle]),
    ("large_files_and_many_keys", &[Capability::Admin, Capability::Lifecycle]),
    ("duplicate_within_one_file", &[Capability::Lifecycle]),
    ("commit_validation", &[Capability::Lifecycle]),
    ("object_live_bytes_and_marking", &[Capability::Admin, Capability::Lifecycle]),
    ("object_with_only_rejected_batches_is_marked", &[Capability::Lifecycle]),
    ("objects_to_delete_and_confirm", &[Capability::Admin, Capability::Lifecycle]),
    ("find_batches_offsets_and_errors", &[Capability::Admin]),
    ("list_offsets_earliest_latest", &[Capability::Admin]),
    ("list_offsets_by_timestamp", &[Capability::Admin]),
    ("list_offsets_max_timestamp", &[Capability::Admin]),
    ("delete_records_moves_log_start", &[Capability::Admin]),
    ("cannot_move_log_start_past_high_watermark", &[Capability::Admin]),
    ("retention_by_time", &[Capability::Lifecycle]),
    ("retention_by_size", &[Capability::Lifecycle]),
    ("retention_cap_reports_more", &[Capability::Lifecycle]),
    ("retention_disabled_and_log_append_time", &[Capability::Lifecycle]),
    ("producer_state_survives_delete_records", &[Capability::Admin]),
    ("producer_fields_judged_per_batch", &[Capability::Lifecycle]),
    ("commit_deadline_checked_at_commit", &[Capability::Lifecycle]),
    ("fence_orphans_fences_unknown_keys_only", &[Capability::Lifecycle]),
    ("fenced_and_expired_keys_never_commit", &[Capability::Lifecycle]),
    ("retention_ages_batches_without_timestamps_by_commit_time", &[Capability::Lifecycle]),
    ("producer_state_expires", &[Capability::Lifecycle]),
    ("producer_expiry_cap_and_order", &[Capability::Lifecycle]),
    ("alter_topic_config_changes_producer_expiry", &[Capability::Admin, Capability::Lifecycle]),
    ("late_resend_after_expiration_is_still_a_duplicate", &[Capability::Lifecycle]),
    ("producer_state_outlives_every_commit_it_guards", &[Capability::Lifecycle]),
    ("the_deadline_and_fences_follow_the_coordinator_clock", &[Capability::Lifecycle]),
    ("a_confirmed_deleted_key_is_never_committed_again", &[Capability::Lifecycle]),
    ("producer_id_blocks_never_overlap", &[Capability::Admin]),
    ("create_partitions_grows_a_topic", &[Capability::Admin]),
    ("create_partitions_only_grows", &[Capability::Admin]),
    ("alter_topic_config_applies_to_later_calls", &[Capability::Admin, Capability::Lifecycle]),
    ("compression_topic_config_is_kept", &[Capability::Admin]),
    ("compaction_topic_config_is_kept", &[Capability::Admin]),
    ("retention_deletes_nothing_from_a_compact_only_topic", &[Capability::Admin, Capability::Lifecycle]),
    ("list_producers_of_a_partition", &[Capability::Admin]),
    ("txn_plain_batch_during_txn_rejected", &[Capability::Transactions]),
    ("txn_next_epoch_before_marker_rejected", &[Capability::Transactions]),
    ("txn_batch_of_another_transaction_rejected_while_one_is_open", &[Capability::Transactions]),
    ("txn_marker_ends_only_the_transaction_it_names", &[Capability::Transactions]),
    ("txn_record_follows_a_transaction_through_its_states", &[Capability::Transactions]),
    ("txn_record_init_fences_the_open_transaction", &[Capability::Transactions]),
    ("txn_record_timeout_aborts_and_fences", &[Capability::Transactions]),
    ("txn_records_change_one_at_a_time", &[Capability::Transactions]),
    ("txn_commit_marker_ends_txn_and_moves_lso", &[Capability::Transactions]),
    ("txn_abort_marker_records_aborted_txn", &[Capability::Transactions]),
    ("txn_marker_without_data_takes_an_offset", &[Capability::Transactions]),
    ("txn_marker_is_idempotent_per_txn_seq", &[Capability::Transactions]),
    ("txn_stale_verified_batch_after_marker_rejected", &[Capability::Transactions]),
    ("txn_duplicate_after_end_answers_original_offsets", &[Capability::Transactions]),
    ("txn_marker_epoch_checks", &[Capability::Transactions]),
    ("txn_fence_marker_bumps_epoch_and_rejects_zombie", &[Capability::Transactions]),
    ("txn_markers_many_partitions", &[Capability::Transactions]),
    ("read_committed_stops_at_lso", &[Capability::Transactions]),
    ("read_uncommitted_reports_lso_without_aborted", &[Capability::Transactions]),
    ("two_producers_interleaved_lso_is_min", &[Capability::Transactions]),
    ("read_committed_aborted_range_semantics", &[Capability::Transactions]),
    ("list_offsets_read_committed", &[Capability::Transactions]),
    ("delete_records_through_open_txn_clamps_lso", &[Capability::Admin, Capability::Lifecycle, Capability::Transactions]),
    ("retention_and_expiry_with_transactions", &[Capability::Lifecycle, Capability::Transactions]),
    ("late_txn_batch_after_expiration_is_still_refused", &[Capability::Lifecycle, Capability::Transactions]),
    ("delete_topic_with_open_txn", &[Capability::Admin, Capability::Transactions]),
    ("tiered_topic_config_is_kept", &[Capability::Admin]),
    ("tiering_candidates_by_bytes_and_age", &[Capability::Tiering]),
    ("segment_plan_prefix_below_bounds", &[Capability::Tiering]),
    ("register_segment_moves_range_to_tier", &[Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_is_idempotent_on_key", &[Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_stale_after_retention", &[Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_stale_after_delete_records", &[Capability::Admin, Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_stale_after_other_segment", &[Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_refused_when_fenced", &[Capability::Lifecycle, Capability::Tiering]),
    ("replace_segments_swaps_a_run_of_segments", &[Capability::Admin, Capability::Lifecycle, Capability::Tiering]),
    ("replace_segments_is_idempotent_and_may_keep_nothing", &[Capability::Lifecycle, Capability::Tiering]),
    ("replace_segments_checks", &[Capability::Lifecycle, Capability::Tiering]),
    ("tiering_candidates_of_compacted_topics_by_max_lag", &[Capability::Tiering]),
    ("register_segment_refused_past_deadline", &[Capability::Lifecycle, Capability::Tiering]),
    ("register_segment_range_checks", &[Capability::Lifecycle, Capability::Tiering]),
    ("find_batches_across_tiers", &[Capability::Admin, Capability::Tiering]),
    ("list_offsets_across_tiers", &[Capability::Admin, Capability::Tiering]),
    ("retention_by_time_deletes_whole_segments", &[Capability::Lifecycle, Capability::Tiering]),
    ("retention_by_size_counts_segments", &[Capability::Lifecycle, Capability::Tiering]),
    ("delete_records_inside_segment_keeps_it", &[Capability::Admin, Capability::Lifecycle, Capability::Tiering]),
    ("delete_records_past_segment_deletes_it", &[Capability::Admin, Capability::Lifecycle, Capability::Tiering]),
    ("delete_topic_releases_segments", &[Capability::Lifecycle, Capability::Tiering]),
    ("segment_objects_in_object_lifecycle", &[Capability::Admin, Capability::Lifecycle, Capability::Tiering]),
    ("fence_orphans_leaves_registered_segment_alone", &[Capability::Lifecycle, Capability::Tiering]),
    ("retention_budget_counts_segments", &[Capability::Lifecycle, Capability::Tiering]),
    ("shared_wal_object_released_by_two_partitions", &[Capability::Lifecycle, Capability::Tiering]),
    ("tiered_segments_with_transactions", &[Capability::Lifecycle, Capability::Transactions, Capability::Tiering]),
];

/// The capabilities case `name` needs (the log, and the groups of the operations it calls).
pub fn case_capabilities(name: &str) -> Capabilities {
    CASE_CAPABILITIES
        .iter()
        .find(|(case, _)| *case == name)
        .map_or(Capabilities::LOG, |(_, needs)| {
            needs.iter().fold(Capabilities::LOG, |all, c| all.with(*c))
        })
}

/// The cases a coordinator serving `capabilities` runs.
pub fn cases_for(capabilities: Capabilities) -> Vec<&'static str> {
    CASES
        .iter()
        .copied()
        .filter(|c| {
            case_capabilities(c)
                .iter()
                .all(|n| capabilities.contains(n))
        })
        .collect()
}

/// A fresh coordinator under test and the clock it reads.
#[derive(Debug, Clone)]
pub struct Harness {
    /// The coordinator, empty.
    pub coordinator: Arc<dyn BatchCoordinator>,
    /// The clock the coordinator reads its time from.
    pub clock: Arc<ManualClock>,
}

/// Where the implementation under test reads the time that decides the commit deadline and fence
/// expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// The harness's [`ManualClock`] (the in-memory model, SQLite, the sharded router): every
    /// case runs with the clock at [`START_MS`].
    Harness,
    /// A clock of its own, such as a database server's (PostgreSQL): the
    /// [`CLOCK_SENSITIVE_CASES`] run with a harness clock at the real time
    /// ([`harness_clock_at_system_time`]), the [`MANUAL_CLOCK_CASES`] cannot run (test the same
    /// rules against that clock), the others run at [`START_MS`].
    Server,
}

/// Calls back `$callback! { { $($args)* } case, case [tag], ... }` with every case of the suite,
/// in the order [`run_all`] runs them: the one list of cases. Tags: `clock_sensitive`
/// ([`CLOCK_SENSITIVE_CASES`]), `manual_clock` ([`MANUAL_CLOCK_CASES`]), `txn` ([`TXN_CASES`]),
/// `tiered` ([`TIERED_CASES`]), `txn_clock_sensitive` (both `txn` and `clock_sensitive`).
#[doc(hidden)]
#[macro_export]
macro_rules! __coordinator_conformance_cases {
    ($($callback:ident)::+ { $($args:tt)* }) => {
        $($callback)::+! {
            { $($args)* }
            create_and_list_topics,
            create_topic_validation,
            delete_topic,
            commit_assigns_consecutive_offsets,
            commit_to_unknown_partition,
            log_append_time,
            batches_of_one_file_keep_order,
            multiple_producers_in_one_file,
            large_files_and_many_keys,
            producer_same_sequence_resent_is_duplicate,
            producer_sequence_gap_rejected,
            producer_higher_epoch_accepted,
            producer_old_epoch_rejected,
            producer_new_epoch_must_start_at_zero,
            sequence_wrap_max_to_zero_accepted,
            sequence_wrap_max_to_one_rejected,
            duplicate_appends_window_of_five,
            duplicate_partial_overlap_rejected,
            duplicate_keeps_original_log_append_time,
            duplicate_within_one_file,
            no_producer_state_accepts_any_sequence,
            non_idempotent_batches_skip_checks,
            commit_validation,
            duplicate_object_key_rejected,
            object_live_bytes_and_marking,
            object_with_only_rejected_batches_is_marked,
            objects_to_delete_and_confirm,
            find_batches_byte_limits,
            find_batches_offsets_and_errors,
            list_offsets_earliest_latest,
            list_offsets_by_timestamp,
            list_offsets_max_timestamp,
            delete_records_moves_log_start,
            cannot_move_log_start_past_high_watermark,
            retention_by_time,
            retention_by_size,
            retention_cap_reports_more,
            retention_disabled_and_log_append_time,
            producer_state_survives_delete_records,
            producer_fields_judged_per_batch,
            commit_deadline_checked_at_commit [clock_sensitive],
            fence_orphans_fences_unknown_keys_only [clock_sensitive],
            fenced_and_expired_keys_never_commit [clock_sensitive],
            retention_ages_batches_without_timestamps_by_commit_time,
            producer_state_expires [clock_sensitive],
            producer_expiry_cap_and_order [clock_sensitive],
            alter_topic_config_changes_producer_expiry [clock_sensitive],
            late_resend_after_expiration_is_still_a_duplicate [clock_sensitive],
            producer_state_outlives_every_commit_it_guards [manual_clock],
            the_deadline_and_fences_follow_the_coordinator_clock [manual_clock],
            a_confirmed_deleted_key_is_never_committed_again [clock_sensitive],
            producer_id_blocks_never_overlap,
            create_partitions_grows_a_topic,
            create_partitions_only_grows,
            alter_topic_config_applies_to_later_calls,
            compression_topic_config_is_kept,
            compaction_topic_config_is_kept,
            retention_deletes_nothing_from_a_compact_only_topic,
            list_producers_of_a_partition,
            txn_first_batch_needs_verification [txn],
            txn_continues_without_verification_same_epoch [txn],
            txn_plain_batch_during_txn_rejected [txn],
            txn_next_epoch_before_marker_rejected [txn],
            txn_batch_of_another_transaction_rejected_while_one_is_open [txn],
            txn_marker_ends_only_the_transaction_it_names [txn],
            txn_record_follows_a_transaction_through_its_states [txn],
            txn_record_init_fences_the_open_transaction [txn],
            txn_record_timeout_aborts_and_fences [txn],
            txn_records_change_one_at_a_time [txn],
            txn_commit_marker_ends_txn_and_moves_lso [txn],
            txn_abort_marker_records_aborted_txn [txn],
            txn_marker_without_data_takes_an_offset [txn],
            txn_marker_is_idempotent_per_txn_seq [txn],
            txn_stale_verified_batch_after_marker_rejected [txn],
            txn_duplicate_after_end_answers_original_offsets [txn],
            txn_marker_epoch_checks [txn],
            txn_fence_marker_bumps_epoch_and_rejects_zombie [txn],
            txn_markers_many_partitions [txn],
            read_committed_stops_at_lso [txn],
            read_uncommitted_reports_lso_without_aborted [txn],
            two_producers_interleaved_lso_is_min [txn],
            read_committed_aborted_range_semantics [txn],
            list_offsets_read_committed [txn],
            delete_records_through_open_txn_clamps_lso [txn],
            retention_and_expiry_with_transactions [txn_clock_sensitive],
            late_txn_batch_after_expiration_is_still_refused [txn_clock_sensitive],
            delete_topic_with_open_txn [txn],
            tiered_topic_config_is_kept [tiered],
            tiering_candidates_by_bytes_and_age [tiered],
            segment_plan_prefix_below_bounds [tiered],
            register_segment_moves_range_to_tier [tiered],
            register_segment_is_idempotent_on_key [tiered],
            register_segment_stale_after_retention [tiered],
            register_segment_stale_after_delete_records [tiered],
            register_segment_stale_after_other_segment [tiered],
            register_segment_refused_when_fenced [tiered],
            replace_segments_swaps_a_run_of_segments [tiered],
            replace_segments_is_idempotent_and_may_keep_nothing [tiered],
            replace_segments_checks [tiered],
            tiering_candidates_of_compacted_topics_by_max_lag [tiered],
            register_segment_refused_past_deadline [tiered],
            register_segment_range_checks [tiered],
            find_batches_across_tiers [tiered],
            list_offsets_across_tiers [tiered],
            retention_by_time_deletes_whole_segments [tiered],
            retention_by_size_counts_segments [tiered],
            delete_records_inside_segment_keeps_it [tiered],
            delete_records_past_segment_deletes_it [tiered],
            delete_topic_releases_segments [tiered],
            segment_objects_in_object_lifecycle [tiered],
            fence_orphans_leaves_registered_segment_alone [tiered],
            retention_budget_counts_segments [tiered],
            shared_wal_object_released_by_two_partitions [tiered],
            tiered_segments_with_transactions [tiered],
        }
    };
}

/// Defines the lists and [`run_all`] from the case list.
macro_rules! define_from_cases {
    ({} $($case:ident $([$tag:ident])?),* $(,)?) => {
        /// The names of all cases, in the order [`run_all`] runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// The case named `name`, as a function of the harness (for drivers that pick cases at
        /// run time).
        pub fn case_named(name: &str) -> Option<fn(Harness) -> BoxFuture<'static, ()>> {
            match name {
                $(stringify!($case) => Some(|h| Box::pin($case(h))),)*
                _ => None,
            }
        }

        /// Cases that read the coordinator's clock to decide the commit deadline and fence expiry,
        /// or that expect producer expiry's floor of twice the default `max_commit_age`.
        /// An implementation that reads a server clock instead ([`ClockSource::Server`]) runs them
        /// with a harness whose clock starts at the real time ([`harness_clock_at_system_time`])
        /// instead of [`START_MS`].
        pub const CLOCK_SENSITIVE_CASES: &[&str] =
            names_tagged!(clock_sensitive [] $($case $([$tag])?),*);

        /// Cases that advance the harness's [`ManualClock`] and expect the commit deadline and fence
        /// expiry to follow it. An implementation that reads a server clock for those
        /// ([`ClockSource::Server`]) cannot run them; it must test the same rules against its own
        /// clock.
        pub const MANUAL_CLOCK_CASES: &[&str] =
            names_tagged!(manual_clock [] $($case $([$tag])?),*);

        /// The transaction cases (`write_txn_markers`, transactional batches, `read_committed`).
        pub const TXN_CASES: &[&str] = names_tagged!(txn [] $($case $([$tag])?),*);

        /// The tiered-segment cases (`tiering_candidates`, `segment_plan`, `register_segment`,
        /// `list_tiered_segments`, and fetch, ListOffsets, retention and object lifecycle across
        /// tiers; issue #15). An implementation that does not implement tiered storage yet skips
        /// them (say so next to its skip list).
        pub const TIERED_CASES: &[&str] = names_tagged!(tiered [] $($case $([$tag])?),*);

        /// Runs every case not named in `skip`, each on a new coordinator from `factory` (see
        /// [`run_all`]): for an implementation that defines something differently on purpose (say
        /// which, and why).
        pub async fn run_all_except<F, S>(clock_source: ClockSource, factory: F, skip: &[&str])
        where
            F: AsyncFn(Arc<ManualClock>) -> S,
            S: Fixture<dyn BatchCoordinator>,
        {
            $(
                if !skip.contains(&stringify!($case)) {
                    run_case(stringify!($case), clock_source, $case, &factory).await;
                }
            )*
        }
    };
}

/// `&["case", ...]`: the names of the cases tagged `$wanted` in a case list.
macro_rules! names_tagged {
    ($wanted:ident [$($names:tt)*]) => {
        &[$($names)*]
    };
    (clock_sensitive [$($names:tt)*] $case:ident [clock_sensitive] $(, $($rest:tt)*)?) => {
        names_tagged!(clock_sensitive [$($names)* stringify!($case),] $($($rest)*)?)
    };
    (clock_sensitive [$($names:tt)*] $case:ident [txn_clock_sensitive] $(, $($rest:tt)*)?) => {
        names_tagged!(clock_sensitive [$($names)* stringify!($case),] $($($rest)*)?)
    };
    (txn [$($names:tt)*] $case:ident [txn_clock_sensitive] $(, $($rest:tt)*)?) => {
        names_tagged!(txn [$($names)* stringify!($case),] $($($rest)*)?)
    };
    (manual_clock [$($names:tt)*] $case:ident [manual_clock] $(, $($rest:tt)*)?) => {
        names_tagged!(manual_clock [$($names)* stringify!($case),] $($($rest)*)?)
    };
    (txn [$($names:tt)*] $case:ident [txn] $(, $($rest:tt)*)?) => {
        names_tagged!(txn [$($names)* stringify!($case),] $($($rest)*)?)
    };
    (tiered [$($names:tt)*] $case:ident [tiered] $(, $($rest:tt)*)?) => {
        names_tagged!(tiered [$($names)* stringify!($case),] $($($rest)*)?)
    };
    ($wanted:ident [$($names:tt)*] $case:ident $([$tag:ident])? $(, $($rest:tt)*)?) => {
        names_tagged!($wanted [$($names)*] $($($rest)*)?)
    };
}

__coordinator_conformance_cases!(define_from_cases {});

/// Runs every case, each on a new coordinator from `factory` reading the clock it is given (at
/// [`START_MS`]); panics on the first violation.
pub async fn run_all<F, S>(factory: F)
where
    F: AsyncFn(Arc<ManualClock>) -> S,
    S: Fixture<dyn BatchCoordinator>,
{
    run_all_except(ClockSource::Harness, factory, &[]).await;
}

/// Runs one case on a new coordinator from `factory`, given the clock the case needs under
/// `clock_source`. A factory returning `None` skips the case.
pub async fn run_case<C, F, S>(name: &str, clock_source: ClockSource, case: C, factory: F)
where
    C: AsyncFnOnce(Harness),
    F: AsyncFnOnce(Arc<ManualClock>) -> S,
    S: Fixture<dyn BatchCoordinator>,
{
    let clock = match clock_source {
        ClockSource::Server if CLOCK_SENSITIVE_CASES.contains(&name) => {
            harness_clock_at_system_time()
        }
        _ => ManualClock::new(START_MS),
    };
    let Some((coordinator, guard)) = factory(clock.clone()).await.into_parts() else {
        return;
    };
    let (needs, serves) = (case_capabilities(name), coordinator.capabilities());
    if let Some(missing) = needs.iter().find(|c| !serves.contains(*c)) {
        tracing::info!(
            case = name,
            %missing,
            "coordinator conformance: skipped, the coordinator does not serve the capability"
        );
        return;
    }
    tracing::info!(case = name, "coordinator conformance");
    case(Harness { coordinator, clock }).await;
    drop(guard);
}

/// Makes one test per case of the coordinator conformance suite, in a module `$module`:
/// `$module::commit_assigns_consecutive_offsets` and so on, each on a new coordinator from the
/// factory, on a multi-threaded tokio runtime with two workers.
///
/// The factory is an async closure that takes the case's clock (`Arc<ManualClock>`, to be read
/// by the coordinator) and returns a [`Fixture`]: `Arc<YourCoordinator>`, a pair
/// `(Arc<YourCoordinator>, guard)` whose guard lives until the case ends (a temporary
/// directory, a database schema), or `None` to skip the case (when a database is not reachable,
/// say; print why). It may use the items of the enclosing module.
///
/// Options, after the factory and in this order:
/// - `clock = server`: the coordinator decides the commit deadline and fence expiry by a clock of
///   its own ([`ClockSource::Server`]): the [`MANUAL_CLOCK_CASES`] are left out, the
///   [`CLOCK_SENSITIVE_CASES`] get a clock at the real time. (`clock = harness`, the default:
///   every case runs with the clock at [`START_MS`].)
/// - A case needing a capability the coordinator does not serve
///   ([`BatchCoordinator::capabilities`], [`case_capabilities`]) passes without running, with
///   a log line saying why: declare what you serve and exactly those cases run.
/// - `skip = [case, ...]`: cases left out, for an implementation that defines something
///   differently on purpose (say which, and why, next to the list). Each must name a case.
///
/// ```test_harness
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::sync::Arc;
///
/// diskless_testkit::coordinator_conformance!(model, async |clock| {
///     Arc::new(InMemoryCoordinator::new(clock))
/// });
///
/// // The same, leaving out one case, for an implementation with a clock of its own.
/// diskless_testkit::coordinator_conformance!(
///     model_with_server_clock,
///     async |clock| Arc::new(InMemoryCoordinator::new(clock)),
///     clock = server,
///     skip = [producer_expiry_cap_and_order],
/// );
/// ```
#[macro_export]
macro_rules! coordinator_conformance {
    (
        $module:ident,
        $factory:expr
        $(, clock = $clock:ident)?
        $(, skip = [$($skip:ident),* $(,)?])?
        $(,)?
    ) => {
        $crate::__coordinator_conformance_cases!($crate::__conformance_module {
            [$] $module [$($($skip)*)?] [$crate::coordinator::conformance]
            __coordinator_conformance_test { [$($clock)?] ($factory) }
        });
    };
}

/// One test of [`coordinator_conformance!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __coordinator_conformance_test {
    ({ [server] ($factory:expr) } $case:ident [manual_clock]) => {};
    ({ [$($clock:ident)?] ($factory:expr) } $case:ident $([$tag:ident])?) => {
        #[test]
        fn $case() {
            $crate::fixture::__private::block_on(
                2,
                $crate::coordinator::conformance::run_case(
                    ::core::stringify!($case),
                    $crate::__coordinator_clock_source!($($clock)?),
                    $crate::coordinator::conformance::$case,
                    $factory,
                ),
            );
        }
    };
}

/// The [`ClockSource`] named by `clock = ...` of [`coordinator_conformance!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __coordinator_clock_source {
    () => {
        $crate::coordinator::conformance::ClockSource::Harness
    };
    (harness) => {
        $crate::coordinator::conformance::ClockSource::Harness
    };
    (server) => {
        $crate::coordinator::conformance::ClockSource::Server
    };
}

/// A [`ManualClock`] at the real current time, for implementations that check the commit deadline
/// against a server clock (see [`CLOCK_SENSITIVE_CASES`]).
pub fn harness_clock_at_system_time() -> Arc<ManualClock> {
    ManualClock::new(SystemClock.now_ms())
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A fresh key without a UUID v7 time (never refused by the commit deadline, never fenced).
fn new_key() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("wal/{:020}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A fresh id (for topics), unique in the process and reproducible: the high half is a counter
/// mixed by SplitMix64's finalizer, so that ids do not sort in the order they were made, the low
/// half the counter itself.
fn fresh_id() -> Uuid {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut z = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(z ^ (z >> 31)).to_be_bytes());
    bytes[8..].copy_from_slice(&n.to_be_bytes());
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// The default commit deadline in ms (every harness's coordinator uses the defaults).
fn max_age_ms() -> i64 {
    diskless_coordinator::max_age_ms(diskless_coordinator::DEFAULT_MAX_COMMIT_AGE)
}

/// A batch of `records` records and `size` bytes for `p`, non-idempotent, CreateTime `ts`.
fn plain(p: TopicIdPartition, records: i32, size: u32, ts: i64) -> CommitBatch {
    CommitBatch {
        partition: p,
        byte_offset: 0,
        byte_size: size,
        record_count: records,
        base_timestamp: ts,
        max_timestamp: ts,
        timestamp_type: TimestampType::CreateTime,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        base_sequence: NO_SEQUENCE,
        last_sequence: NO_SEQUENCE,
        transactional: false,
        txn_seq: None,
    }
}

/// An idempotent batch of `records` records starting at sequence `seq`.
fn idem(p: TopicIdPartition, pid: i64, epoch: i16, seq: i32, records: i32) -> CommitBatch {
    let last = ((i64::from(seq) + i64::from(records) - 1) % (i64::from(i32::MAX) + 1)) as i32;
    CommitBatch {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: seq,
        last_sequence: last,
        ..plain(p, records, 100, START_MS)
    }
}

/// A commit request laying `batches` out back to back after the 1-byte header.
fn request(key: &str, mut batches: Vec<CommitBatch>) -> CommitFileRequest {
    let mut at = 1u64;
    for b in &mut batches {
        b.byte_offset = at;
        at += u64::from(b.byte_size);
    }
    CommitFileRequest {
        object_key: key.to_string(),
        uploader_broker_id: 7,
        object_size: at,
        owners: vec![0],
        batches,
    }
}

/// Commits one batch under a new key; its result.
async fn commit_one(h: &Harness, batch: CommitBatch) -> CommitBatchResult {
    commit(h, vec![batch]).await.remove(0)
}

async fn commit(h: &Harness, batches: Vec<CommitBatch>) -> Vec<CommitBatchResult> {
    commit_key(h, &new_key(), batches).await
}

async fn commit_key(h: &Harness, key: &str, batches: Vec<CommitBatch>) -> Vec<CommitBatchResult> {
    let n = batches.len();
    let results = h
        .coordinator
        .commit_file(request(key, batches))
        .await
        .expect("commit_file");
    assert_eq!(results.len(), n, "one result per batch");
    results
}

async fn topic_with(h: &Harness, name: &str, partitions: i32, config: TopicConfig) -> Uuid {
    let id = fresh_id();
    h.coordinator
        .create_topic(CreateTopicRequest {
            topic_id: id,
            name: name.to_string(),
            partitions,
            config,
        })
        .await
        .expect("create_topic");
    id
}

async fn topic(h: &Harness, partitions: i32) -> Uuid {
    let name = format!("t-{}", fresh_id());
    topic_with(h, &name, partitions, TopicConfig::default()).await
}

/// Partition 0 of a new topic of one partition.
async fn partition(h: &Harness) -> TopicIdPartition {
    tp(topic(h, 1).await, 0)
}

fn tp(id: Uuid, p: i32) -> TopicIdPartition {
    TopicIdPartition::new(id, p)
}

/// All live batches of a partition, with its log start offset and high watermark.
async fn all_batches(h: &Harness, p: TopicIdPartition) -> (Vec<BatchCoordinate>, i64, i64) {
    let lso = list(h, p, EARLIEST_TIMESTAMP).await.offset;
    let r = h
        .coordinator
        .find_batches(
            &[FindBatchesRequest {
                partition: p,
                offset: lso,
                max_bytes: u32::MAX,
                isolation: Default::default(),
            }],
            u32::MAX,
        )
        .await
        .expect("find_batches")
        .remove(0);
    assert_eq!(r.error, ErrorCode::None);
    (r.batches, r.log_start_offset, r.high_watermark)
}

async fn list(h: &Harness, p: TopicIdPartition, timestamp: i64) -> ListOffsetsResponse {
    h.coordinator
        .list_offsets(&[ListOffsetsRequest {
            partition: p,
            timestamp,
            isolation: Default::default(),
        }])
        .await
        .expect("list_offsets")
        .remove(0)
}

async fn delete_records(h: &Harness, p: TopicIdPartition, offset: i64) -> (ErrorCode, i64) {
    let r = h
        .coordinator
        .delete_records(&[DeleteRecordsRequest {
            partition: p,
            offset,
        }])
        .await
        .expect("delete_records")
        .remove(0);
    (r.error, r.low_watermark)
}

/// A retention pass with room for 100 batches.
async fn retention_pass(h: &Harness) -> RetentionReport {
    h.coordinator
        .enforce_retention(100)
        .await
        .expect("enforce_retention")
}

/// What the coordinator knows of an object (`None`: nothing).
async fn object(h: &Harness, key: &str) -> Option<ObjectInfo> {
    h.coordinator.object_info(key).await.expect("object_info")
}

/// What the coordinator knows of an object it must know.
async fn info_of(h: &Harness, key: &str) -> ObjectInfo {
    object(h, key)
        .await
        .unwrap_or_else(|| panic!("object {key} is unknown"))
}

/// Whether `known_objects` answers the key.
async fn is_known(h: &Harness, key: &str) -> bool {
    let known = h
        .coordinator
        .known_objects(&[key.to_string()])
        .await
        .expect("known_objects");
    !known.is_empty()
}

/// The state of a producer on a partition (`None`: none).
async fn producer(h: &Harness, p: TopicIdPartition, producer_id: i64) -> Option<ProducerState> {
    h.coordinator
        .producer_state(p, producer_id)
        .await
        .expect("producer_state")
}

fn ok_at(r: &CommitBatchResult, base_offset: i64) {
    assert_eq!(r.error, ErrorCode::None, "{r:?}");
    assert_eq!(r.base_offset, base_offset, "{r:?}");
    assert!(!r.duplicate, "{r:?}");
}

fn dup_of(r: &CommitBatchResult, base_offset: i64) {
    assert_eq!(r.error, ErrorCode::None, "{r:?}");
    assert_eq!(r.base_offset, base_offset, "{r:?}");
    assert!(r.duplicate, "{r:?}");
}

fn rejected(r: &CommitBatchResult, code: ErrorCode) {
    assert_eq!(r, &CommitBatchResult::error(code));
}

fn invalid<T: std::fmt::Debug>(r: Result<T, CoordinatorError>) {
    assert!(
        matches!(r, Err(CoordinatorError::InvalidRequest(_))),
        "expected InvalidRequest, got {r:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Topics

/// Topics are listed by name with their partition count and configuration.
pub async fn create_and_list_topics(h: Harness) {
    assert!(h.coordinator.list_topics().await.unwrap().is_empty());
    let config = TopicConfig {
        timestamp_type: TimestampType::LogAppendTime,
        retention_ms: 1000,
        retention_bytes: 5000,
        max_message_bytes: 2000,
        message_timestamp_before_max_ms: 10,
        message_timestamp_after_max_ms: 20,
        producer_id_expiration_ms: 30,
        // The tiered-storage fields are listed by `tiered_topic_config_is_kept`.
        ..TopicConfig::default()
    };
    let b = topic_with(&h, "bbb", 3, config.clone()).await;
    let a = topic_with(&h, "aaa", 1, TopicConfig::default()).await;
    let topics = h.coordinator.list_topics().await.unwrap();
    assert_eq!(topics.len(), 2);
    assert_eq!((topics[0].topic_id, topics[0].name.as_str()), (a, "aaa"));
    assert_eq!(topics[0].partitions, 1);
    assert_eq!(topics[0].config, TopicConfig::default());
    assert_eq!((topics[1].topic_id, topics[1].name.as_str()), (b, "bbb"));
    assert_eq!(topics[1].partitions, 3);
    assert_eq!(topics[1].config, config);
    for p in 0..3 {
        let (batches, lso, hwm) = all_batches(&h, tp(b, p)).await;
        assert!(batches.is_empty());
        assert_eq!((lso, hwm), (0, 0));
    }
}

/// Bad partition counts, names and configuration values are invalid; ids and names are unique.
pub async fn create_topic_validation(h: Harness) {
    let req = |name: &str, partitions: i32, config: TopicConfig| CreateTopicRequest {
        topic_id: fresh_id(),
        name: name.to_string(),
        partitions,
        config,
    };
    let c = &h.coordinator;
    invalid(c.create_topic(req("x", 0, TopicConfig::default())).await);
    invalid(c.create_topic(req("x", -1, TopicConfig::default())).await);
    // Names Kafka refuses (Topic.validate): INVALID_TOPIC_EXCEPTION, not INVALID_REQUEST.
    for name in [
        String::new(),
        "n".repeat(250),
        ".".into(),
        "..".into(),
        "a/b".into(),
        "with space".into(),
        "caf\u{e9}".into(),
    ] {
        let r = c.create_topic(req(&name, 1, TopicConfig::default())).await;
        assert!(
            matches!(&r, Err(e @ CoordinatorError::InvalidTopic(_))
                if e.error_code() == ErrorCode::InvalidTopicException),
            "{name:?}: expected InvalidTopic, got {r:?}"
        );
    }
    for config in [
        TopicConfig {
            retention_ms: -2,
            ..TopicConfig::default()
        },
        TopicConfig {
            retention_bytes: -5,
            ..TopicConfig::default()
        },
        TopicConfig {
            max_message_bytes: -1,
            ..TopicConfig::default()
        },
        TopicConfig {
            message_timestamp_after_max_ms: -1,
            ..TopicConfig::default()
        },
    ] {
        invalid(c.create_topic(req("x", 1, config)).await);
    }
    invalid(
        c.create_topic(CreateTopicRequest {
            topic_id: Uuid::nil(),
            ..req("x", 1, TopicConfig::default())
        })
        .await,
    );
    assert!(c.list_topics().await.unwrap().is_empty());

    let first = req("x", 2, TopicConfig::default());
    c.create_topic(first.clone()).await.unwrap();
    let r = c.create_topic(req("x", 1, TopicConfig::default())).await;
    assert!(
        matches!(r, Err(CoordinatorError::TopicAlreadyExists(_))),
        "{r:?}"
    );
    let r = c
        .create_topic(CreateTopicRequest {
            name: "y".into(),
            ..first.clone()
        })
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::TopicAlreadyExists(_))),
        "{r:?}"
    );
    let topics = c.list_topics().await.unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].partitions, 2);

    // The longest name and every allowed character are accepted.
    c.create_topic(req(&"n".repeat(249), 1, TopicConfig::default()))
        .await
        .expect("a 249-character name");
    c.create_topic(req("Az09._-", 1, TopicConfig::default()))
        .await
        .expect("[a-zA-Z0-9._-]");
}

/// Deleting a topic deletes its batches logically, frees its name and id, and releases the bytes of
/// its objects.
pub async fn delete_topic(h: Harness) {
    let c = &h.coordinator;
    let gone = topic_with(&h, "gone", 2, TopicConfig::default()).await;
    let kept = topic_with(&h, "kept", 1, TopicConfig::default()).await;
    let shared = new_key();
    let only_gone = new_key();
    commit_key(
        &h,
        &shared,
        vec![
            plain(tp(gone, 0), 1, 100, START_MS),
            plain(tp(kept, 0), 1, 50, START_MS),
        ],
    )
    .await;
    commit_key(&h, &only_gone, vec![plain(tp(gone, 1), 3, 70, START_MS)]).await;
    let r = c.delete_topic(fresh_id()).await;
    assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");

    h.clock.advance(10);
    c.delete_topic(gone).await.unwrap();
    let topics = c.list_topics().await.unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].topic_id, kept);
    let r = c.delete_topic(gone).await;
    assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");

    let shared_info = info_of(&h, &shared).await;
    assert_eq!(shared_info.live_bytes, 50);
    assert_eq!(shared_info.marked_for_deletion_at, None);
    let gone_info = info_of(&h, &only_gone).await;
    assert_eq!(gone_info.live_bytes, 0);
    assert_eq!(gone_info.marked_for_deletion_at, Some(START_MS + 10));

    // The partitions are unknown now.
    let f = c
        .find_batches(
            &[FindBatchesRequest {
                partition: tp(gone, 0),
                offset: 0,
                max_bytes: 1000,
                isolation: Default::default(),
            }],
            1000,
        )
        .await
        .unwrap();
    assert_eq!(f[0].error, ErrorCode::UnknownTopicOrPartition);
    assert_eq!(
        list(&h, tp(gone, 1), LATEST_TIMESTAMP).await.error,
        ErrorCode::UnknownTopicOrPartition
    );
    let r = commit(&h, vec![plain(tp(gone, 0), 1, 10, START_MS)]).await;
    rejected(&r[0], ErrorCode::UnknownTopicOrPartition);

    // The name can be used again; the new topic starts empty.
    let again = topic_with(&h, "gone", 1, TopicConfig::default()).await;
    let (batches, lso, hwm) = all_batches(&h, tp(again, 0)).await;
    assert!(batches.is_empty());
    assert_eq!((lso, hwm), (0, 0));
    // The kept topic is untouched.
    let (batches, _, hwm) = all_batches(&h, tp(kept, 0)).await;
    assert_eq!(batches.len(), 1);
    assert_eq!(hwm, 1);
}

// ---------------------------------------------------------------------------------------------
// Commits

/// Offsets are assigned consecutively per partition, across files; coordinates round-trip.
pub async fn commit_assigns_consecutive_offsets(h: Harness) {
    let t = topic(&h, 2).await;
    let (p0, p1) = (tp(t, 0), tp(t, 1));
    let key = new_key();
    let r = commit_key(
        &h,
        &key,
        vec![
            plain(p0, 3, 100, START_MS - 5),
            plain(p1, 2, 200, START_MS - 4),
            plain(p0, 1, 50, START_MS - 3),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    ok_at(&r[1], 0);
    ok_at(&r[2], 3);
    for x in &r {
        assert_eq!(x.log_append_time, NO_TIMESTAMP);
        assert_eq!(x.log_start_offset, 0);
    }
    let r = commit(&h, vec![plain(p0, 10, 10, START_MS)]).await;
    ok_at(&r[0], 4);

    let (batches, lso, hwm) = all_batches(&h, p0).await;
    assert_eq!((lso, hwm), (0, 14));
    assert_eq!(batches.len(), 3);
    let b = &batches[0];
    assert_eq!(b.object_key, key);
    assert_eq!(b.object_size, 351);
    assert_eq!((b.byte_offset, b.byte_size), (1, 100));
    assert_eq!((b.base_offset, b.last_offset), (0, 2));
    assert_eq!(b.record_count(), 3);
    assert_eq!(
        (b.base_timestamp, b.max_timestamp),
        (START_MS - 5, START_MS - 5)
    );
    assert_eq!(b.timestamp_type, TimestampType::CreateTime);
    assert_eq!(b.log_append_time, NO_TIMESTAMP);
    assert_eq!(b.producer_id, NO_PRODUCER_ID);
    assert_eq!((batches[1].byte_offset, batches[1].byte_size), (301, 50));
    assert_eq!((batches[1].base_offset, batches[1].last_offset), (3, 3));
    assert_eq!((batches[2].base_offset, batches[2].last_offset), (4, 13));
    let (batches, _, hwm) = all_batches(&h, p1).await;
    assert_eq!(hwm, 2);
    assert_eq!((batches[0].byte_offset, batches[0].base_offset), (101, 0));
}

/// A batch for an unknown topic or partition is rejected alone; the others are appended.
pub async fn commit_to_unknown_partition(h: Harness) {
    let t = topic(&h, 1).await;
    let r = commit(
        &h,
        vec![
            plain(tp(t, 0), 1, 10, START_MS),
            plain(tp(t, 1), 1, 10, START_MS),
            plain(tp(fresh_id(), 0), 1, 10, START_MS),
            plain(tp(t, -1), 1, 10, START_MS),
            plain(tp(t, 0), 1, 10, START_MS),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    rejected(&r[1], ErrorCode::UnknownTopicOrPartition);
    rejected(&r[2], ErrorCode::UnknownTopicOrPartition);
    rejected(&r[3], ErrorCode::UnknownTopicOrPartition);
    ok_at(&r[4], 1);
}

/// LogAppendTime partitions get the commit time; CreateTime partitions keep the producer's.
pub async fn log_append_time(h: Harness) {
    let lat = topic_with(
        &h,
        "lat",
        1,
        TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..TopicConfig::default()
        },
    )
    .await;
    let ct = topic(&h, 1).await;
    h.clock.advance(1234);
    let now = START_MS + 1234;
    let r = commit(
        &h,
        vec![plain(tp(lat, 0), 2, 10, 5), plain(tp(ct, 0), 2, 10, 6)],
    )
    .await;
    ok_at(&r[0], 0);
    assert_eq!(r[0].log_append_time, now);
    ok_at(&r[1], 0);
    assert_eq!(r[1].log_append_time, NO_TIMESTAMP);

    let (b, _, _) = all_batches(&h, tp(lat, 0)).await;
    assert_eq!(b[0].timestamp_type, TimestampType::LogAppendTime);
    assert_eq!(b[0].log_append_time, now);
    assert_eq!(b[0].max_timestamp, 5);
    assert_eq!(b[0].effective_max_timestamp(), now);
    let (b, _, _) = all_batches(&h, tp(ct, 0)).await;
    assert_eq!(b[0].timestamp_type, TimestampType::CreateTime);
    assert_eq!(b[0].effective_max_timestamp(), 6);
}

/// Batches of one file to one partition keep the file's order, interleaved with other partitions.
pub async fn batches_of_one_file_keep_order(h: Harness) {
    let t = topic(&h, 3).await;
    let mut batches = Vec::new();
    for i in 0..30 {
        batches.push(plain(
            tp(t, i % 3),
            1 + i,
            10 + i as u32,
            START_MS + i64::from(i),
        ));
    }
    let r = commit(&h, batches).await;
    for p in 0..3 {
        let (found, _, _) = all_batches(&h, tp(t, p)).await;
        assert_eq!(found.len(), 10);
        let mut next = 0;
        for (k, b) in found.iter().enumerate() {
            let i = p + 3 * k as i32;
            assert_eq!(b.base_offset, next);
            assert_eq!(b.record_count(), i64::from(1 + i));
            assert_eq!(b.max_timestamp, START_MS + i64::from(i));
            assert_eq!(r[i as usize].base_offset, next);
            next = b.last_offset + 1;
        }
    }
}

/// Several producers in one file each get their own sequence checks.
pub async fn multiple_producers_in_one_file(h: Harness) {
    let p = partition(&h).await;
    let r = commit(
        &h,
        vec![
            idem(p, 1, 0, 0, 2),
            idem(p, 2, 0, 0, 3),
            idem(p, 1, 0, 2, 2),
            idem(p, 2, 0, 3, 1),
            idem(p, 2, 0, 10, 1),
            idem(p, 1, 0, 0, 2),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    ok_at(&r[1], 2);
    ok_at(&r[2], 5);
    ok_at(&r[3], 7);
    rejected(&r[4], ErrorCode::OutOfOrderSequenceNumber);
    dup_of(&r[5], 0);
    let s1 = producer(&h, p, 1).await.unwrap();
    assert_eq!(s1.producer_epoch, 0);
    assert_eq!(s1.batches.len(), 2);
    assert_eq!(
        (s1.batches[1].base_sequence, s1.batches[1].last_sequence),
        (2, 3)
    );
    assert_eq!(
        (s1.batches[1].base_offset, s1.batches[1].last_offset),
        (5, 6)
    );
    let s2 = producer(&h, p, 2).await.unwrap();
    assert_eq!(s2.batches.len(), 2);
    assert_eq!(s2.batches[0].base_offset, 2);
    assert!(producer(&h, p, 3).await.is_none());
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 8);
}

/// Files with many batches over many partitions and producers, and key lists longer than an
/// implementation's statement batching, behave like small ones.
pub async fn large_files_and_many_keys(h: Harness) {
    const PARTITIONS: i32 = 70;
    let t = topic(&h, PARTITIONS).await;
    let mut keys = Vec::new();
    let mut hwm = vec![0i64; PARTITIONS as usize];
    for f in 0..3 {
        let mut batches = Vec::new();
        let mut expected = Vec::new();
        for i in 0..150 {
            let p = i % PARTITIONS;
            let producer = i64::from(i % 3);
            // Batch i of file f is the k-th batch of (p, producer) overall.
            let k = (0..=i)
                .filter(|j| j % PARTITIONS == p && j % 3 == i % 3)
                .count() as i32
                - 1;
            let per_file = (0..150)
                .filter(|j| j % PARTITIONS == p && j % 3 == i % 3)
                .count() as i32;
            let seq = 2 * (f * per_file + k);
            batches.push(idem(tp(t, p), producer, 0, seq, 2));
            expected.push(hwm[p as usize]);
            hwm[p as usize] += 2;
        }
        let key = new_key();
        let r = commit_key(&h, &key, batches.clone()).await;
        for (r, e) in r.iter().zip(&expected) {
            ok_at(r, *e);
        }
        // Re-sent as a whole under another key: every batch is a duplicate of the first commit
        // (fewer than 5 batches per producer and partition per file, so all are still kept).
        let again = commit(&h, batches).await;
        for (r, e) in again.iter().zip(&expected) {
            dup_of(r, *e);
        }
        keys.push(key);
    }
    for p in 0..PARTITIONS {
        let (batches, _, high) = all_batches(&h, tp(t, p)).await;
        assert_eq!(high, hwm[p as usize]);
        let mut next = 0;
        for b in &batches {
            assert_eq!(b.base_offset, next);
            next = b.last_offset + 1;
        }
    }
    // Key lists longer than any statement batching.
    let mut many: Vec<String> = (0..150).map(|i| format!("wal/none/{i}")).collect();
    many.insert(75, keys[1].clone());
    many.push(keys[0].clone());
    assert_eq!(
        h.coordinator.known_objects(&many).await.unwrap(),
        vec![keys[1].clone(), keys[0].clone()]
    );
    delete_records_all(&h, t, PARTITIONS).await;
    let marked = h
        .coordinator
        .objects_to_delete(i64::MAX, 1000)
        .await
        .unwrap();
    assert_eq!(marked.len(), 6, "3 files and 3 all-duplicate files");
    let mut confirm: Vec<String> = (0..100).map(|i| format!("wal/none/{i}")).collect();
    confirm.extend(marked.iter().map(|m| m.object_key.clone()));
    h.coordinator.confirm_deleted(&confirm).await.unwrap();
    assert!(h.coordinator.known_objects(&keys).await.unwrap().is_empty());
}

async fn delete_records_all(h: &Harness, t: Uuid, partitions: i32) {
    let reqs: Vec<DeleteRecordsRequest> = (0..partitions)
        .map(|p| DeleteRecordsRequest {
            partition: tp(t, p),
            offset: -1,
        })
        .collect();
    let r = h.coordinator.delete_records(&reqs).await.unwrap();
    assert!(r.iter().all(|r| r.error == ErrorCode::None));
}

// ---------------------------------------------------------------------------------------------
// Idempotent producers (Kafka's ProducerStateManagerTest and UnifiedLogTest)

/// The same sequence range re-sent under the same epoch is a duplicate of the original.
pub async fn producer_same_sequence_resent_is_duplicate(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 5, 1, 0, 3)).await, 0);
    let r = commit(&h, vec![idem(p, 5, 1, 0, 3)]).await;
    dup_of(&r[0], 0);
    assert_eq!(r[0].log_start_offset, 0);
    let (batches, _, hwm) = all_batches(&h, p).await;
    assert_eq!((batches.len(), hwm), (1, 3));
    ok_at(&commit_one(&h, idem(p, 5, 1, 3, 1)).await, 3);
}

/// A gap in the sequence is OUT_OF_ORDER_SEQUENCE_NUMBER and changes nothing.
pub async fn producer_sequence_gap_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 5, 0, 0, 1)).await, 0);
    let before = producer(&h, p, 5).await;
    rejected(
        &commit_one(&h, idem(p, 5, 0, 2, 1)).await,
        ErrorCode::OutOfOrderSequenceNumber,
    );
    assert_eq!(producer(&h, p, 5).await, before);
    ok_at(&commit_one(&h, idem(p, 5, 0, 1, 1)).await, 1);
}

/// A higher epoch starting at sequence 0 is accepted and starts a new window.
pub async fn producer_higher_epoch_accepted(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 9, 0, 0, 5)).await, 0);
    ok_at(&commit_one(&h, idem(p, 9, 3, 0, 2)).await, 5);
    let s = producer(&h, p, 9).await.unwrap();
    assert_eq!(s.producer_epoch, 3);
    assert_eq!(s.batches.len(), 1);
    assert_eq!(s.batches[0].base_offset, 5);
    // The old epoch's batch is no duplicate any more: the old epoch is fenced.
    rejected(
        &commit_one(&h, idem(p, 9, 0, 0, 5)).await,
        ErrorCode::InvalidProducerEpoch,
    );
}

/// An older epoch is INVALID_PRODUCER_EPOCH.
pub async fn producer_old_epoch_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 9, 5, 0, 1)).await, 0);
    rejected(
        &commit_one(&h, idem(p, 9, 4, 1, 1)).await,
        ErrorCode::InvalidProducerEpoch,
    );
    rejected(
        &commit_one(&h, idem(p, 9, 4, 0, 1)).await,
        ErrorCode::InvalidProducerEpoch,
    );
    ok_at(&commit_one(&h, idem(p, 9, 5, 1, 1)).await, 1);
}

/// A new epoch must start at sequence 0.
pub async fn producer_new_epoch_must_start_at_zero(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 9, 0, 0, 1)).await, 0);
    rejected(
        &commit_one(&h, idem(p, 9, 1, 1, 1)).await,
        ErrorCode::OutOfOrderSequenceNumber,
    );
    let s = producer(&h, p, 9).await.unwrap();
    assert_eq!(s.producer_epoch, 0);
}

/// After sequence i32::MAX the next batch starts at 0.
pub async fn sequence_wrap_max_to_zero_accepted(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 1, 0, i32::MAX - 1, 2)).await, 0);
    ok_at(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 2);
    // A batch spanning the wrap: base MAX, last 1.
    let t2 = topic(&h, 1).await;
    let q = tp(t2, 0);
    let b = idem(q, 1, 0, i32::MAX, 2);
    assert_eq!(b.last_sequence, 0);
    ok_at(&commit_one(&h, b).await, 0);
    ok_at(&commit_one(&h, idem(q, 1, 0, 1, 1)).await, 2);
}

/// After sequence i32::MAX a batch starting at 1 is out of order.
pub async fn sequence_wrap_max_to_one_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 1, 0, i32::MAX, 1)).await, 0);
    rejected(
        &commit_one(&h, idem(p, 1, 0, 1, 1)).await,
        ErrorCode::OutOfOrderSequenceNumber,
    );
    ok_at(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 1);
}

/// UnifiedLogTest.testDuplicateAppends: the last five batches are recognised as duplicates and
/// answered with their original offsets; an older one is out of order.
pub async fn duplicate_appends_window_of_five(h: Harness) {
    let p = partition(&h).await;
    let mut offsets = Vec::new();
    for i in 0..7 {
        // Interleave non-idempotent batches so the offsets are not a plain multiple.
        commit(&h, vec![plain(p, 1, 10, START_MS)]).await;
        let r = commit(&h, vec![idem(p, 3, 0, 2 * i, 2)]).await;
        assert_eq!(r[0].error, ErrorCode::None);
        offsets.push(r[0].base_offset);
    }
    let (_, _, hwm) = all_batches(&h, p).await;
    for i in 2..7 {
        dup_of(
            &commit_one(&h, idem(p, 3, 0, 2 * i, 2)).await,
            offsets[i as usize],
        );
    }
    for i in 0..2 {
        rejected(
            &commit_one(&h, idem(p, 3, 0, 2 * i, 2)).await,
            ErrorCode::OutOfOrderSequenceNumber,
        );
    }
    let (_, _, after) = all_batches(&h, p).await;
    assert_eq!(after, hwm, "duplicates do not append");
    let s = producer(&h, p, 3).await.unwrap();
    let seqs: Vec<i32> = s.batches.iter().map(|b| b.base_sequence).collect();
    assert_eq!(seqs, vec![4, 6, 8, 10, 12]);
    let bases: Vec<i64> = s.batches.iter().map(|b| b.base_offset).collect();
    assert_eq!(bases, offsets[2..].to_vec());
    // The sequence continues.
    ok_at(&commit_one(&h, idem(p, 3, 0, 14, 1)).await, hwm);
}

/// A batch overlapping a kept one without matching it exactly is out of order.
pub async fn duplicate_partial_overlap_rejected(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 3, 0, 0, 5)).await, 0);
    ok_at(&commit_one(&h, idem(p, 3, 0, 5, 5)).await, 5);
    for (seq, n) in [(0, 4), (1, 4), (3, 4), (5, 6), (6, 4)] {
        rejected(
            &commit_one(&h, idem(p, 3, 0, seq, n)).await,
            ErrorCode::OutOfOrderSequenceNumber,
        );
    }
    dup_of(&commit_one(&h, idem(p, 3, 0, 0, 5)).await, 0);
}

/// A duplicate answers the original log append time, not the time of the retry.
pub async fn duplicate_keeps_original_log_append_time(h: Harness) {
    let t = topic_with(
        &h,
        "lat",
        1,
        TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..TopicConfig::default()
        },
    )
    .await;
    let p = tp(t, 0);
    let first = commit(&h, vec![idem(p, 3, 0, 0, 1)]).await;
    assert_eq!(first[0].log_append_time, START_MS);
    h.clock.advance(5000);
    let again = commit(&h, vec![idem(p, 3, 0, 0, 1)]).await;
    dup_of(&again[0], 0);
    assert_eq!(again[0].log_append_time, START_MS);
    let s = producer(&h, p, 3).await.unwrap();
    assert_eq!(s.batches[0].log_append_time, START_MS);
}

/// A duplicate of a batch earlier in the same file is recognised.
pub async fn duplicate_within_one_file(h: Harness) {
    let p = partition(&h).await;
    let key = new_key();
    let r = commit_key(
        &h,
        &key,
        vec![
            idem(p, 3, 0, 0, 2),
            idem(p, 3, 0, 0, 2),
            idem(p, 3, 0, 2, 2),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    dup_of(&r[1], 0);
    ok_at(&r[2], 2);
    // The duplicate's bytes are not live.
    let info = info_of(&h, &key).await;
    assert_eq!(info.live_bytes, 200);
}

/// Without producer state any epoch and sequence is accepted.
pub async fn no_producer_state_accepts_any_sequence(h: Harness) {
    let t = topic(&h, 2).await;
    ok_at(&commit_one(&h, idem(tp(t, 0), 8, 4, 1000, 3)).await, 0);
    ok_at(&commit_one(&h, idem(tp(t, 0), 8, 4, 1003, 1)).await, 3);
    // State is per partition.
    ok_at(&commit_one(&h, idem(tp(t, 1), 8, 2, 77, 1)).await, 0);
}

/// Non-idempotent batches (producer id -1) are never checked.
pub async fn non_idempotent_batches_skip_checks(h: Harness) {
    let p = partition(&h).await;
    let r = commit(
        &h,
        vec![plain(p, 1, 10, START_MS), plain(p, 1, 10, START_MS)],
    )
    .await;
    ok_at(&r[0], 0);
    ok_at(&r[1], 1);
    let r = commit(&h, vec![plain(p, 1, 10, START_MS)]).await;
    ok_at(&r[0], 2);
    assert!(producer(&h, p, NO_PRODUCER_ID).await.is_none());
}

/// Malformed commits fail as a whole and register nothing.
pub async fn commit_validation(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let good = || request(&new_key(), vec![plain(p, 1, 10, START_MS)]);
    let mut bad = Vec::new();
    bad.push(CommitFileRequest {
        object_key: String::new(),
        ..good()
    });
    bad.push(CommitFileRequest {
        owners: vec![],
        ..good()
    });
    let mut r = good();
    r.object_size = 5; // the batch ends at 11
    bad.push(r);
    let mut r = good();
    r.batches[0].record_count = 0;
    bad.push(r);
    let mut r = good();
    r.batches[0].byte_size = 0;
    bad.push(r);
    let mut r = request(&new_key(), vec![idem(p, 1, 0, 0, 3)]);
    r.batches[0].last_sequence = 5; // does not match 3 records
    bad.push(r);
    // (Producer-controlled fields are judged per batch: see producer_fields_judged_per_batch.)
    for r in bad {
        let key = r.object_key.clone();
        invalid(c.commit_file(r).await);
        if !key.is_empty() {
            assert_eq!(object(&h, &key).await, None);
        }
    }
    let (batches, _, hwm) = all_batches(&h, p).await;
    assert!(batches.is_empty());
    assert_eq!(hwm, 0);
    // An object with no batches is accepted (and immediately unreferenced).
    let key = new_key();
    assert!(commit_key(&h, &key, vec![]).await.is_empty());
    let info = info_of(&h, &key).await;
    assert_eq!(info.marked_for_deletion_at, Some(START_MS));
}

/// An object key is committed once.
pub async fn duplicate_object_key_rejected(h: Harness) {
    let p = partition(&h).await;
    let key = new_key();
    commit_key(&h, &key, vec![plain(p, 1, 10, START_MS)]).await;
    let r = h
        .coordinator
        .commit_file(request(&key, vec![plain(p, 1, 10, START_MS)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectAlreadyCommitted(_))),
        "{r:?}"
    );
    let (_, _, hwm) = all_batches(&h, p).await;
    assert_eq!(hwm, 1, "the second commit appended nothing");
}

// ---------------------------------------------------------------------------------------------
// Objects

/// Live bytes count only appended batches and drop as batches are deleted; the object is marked
/// when none are left.
pub async fn object_live_bytes_and_marking(h: Harness) {
    let t = topic(&h, 2).await;
    let (p0, p1) = (tp(t, 0), tp(t, 1));
    let key = new_key();
    h.clock.advance(3);
    commit_key(
        &h,
        &key,
        vec![
            plain(p0, 1, 100, START_MS),
            plain(tp(t, 9), 1, 1000, START_MS),
            plain(p1, 1, 30, START_MS),
            plain(p0, 1, 20, START_MS),
        ],
    )
    .await;
    let info = info_of(&h, &key).await;
    assert_eq!(info.object_key, key);
    assert_eq!(info.uploader_broker_id, 7);
    assert_eq!(info.object_size, 1151);
    assert_eq!(info.live_bytes, 150);
    assert_eq!(info.owners, vec![0]);
    assert_eq!(info.committed_at, START_MS + 3);
    assert_eq!(info.marked_for_deletion_at, None);
    assert_eq!(object(&h, "nope").await, None);

    h.clock.advance(10);
    assert_eq!(delete_records(&h, p0, 1).await, (ErrorCode::None, 1));
    let info = info_of(&h, &key).await;
    assert_eq!(info.live_bytes, 50);
    assert_eq!(info.marked_for_deletion_at, None);
    assert_eq!(delete_records(&h, p1, -1).await, (ErrorCode::None, 1));
    assert_eq!(info_of(&h, &key).await.live_bytes, 20);
    h.clock.advance(10);
    assert_eq!(delete_records(&h, p0, 2).await, (ErrorCode::None, 2));
    let info = info_of(&h, &key).await;
    assert_eq!(info.live_bytes, 0);
    assert_eq!(info.marked_for_deletion_at, Some(START_MS + 23));
    assert!(
        h.coordinator
            .objects_to_delete(i64::MAX, 10)
            .await
            .unwrap()
            .iter()
            .any(|o| o.object_key == key)
    );
}

/// An object none of whose batches was appended is marked for deletion at its commit.
pub async fn object_with_only_rejected_batches_is_marked(h: Harness) {
    let t = topic(&h, 1).await;
    let p = tp(t, 0);
    commit(&h, vec![idem(p, 1, 2, 0, 1)]).await;
    let key = new_key();
    h.clock.advance(7);
    let r = commit_key(
        &h,
        &key,
        vec![
            idem(p, 1, 1, 1, 1),              // old epoch
            idem(p, 1, 2, 5, 1),              // gap
            idem(p, 1, 2, 0, 1),              // duplicate
            plain(tp(t, 3), 1, 10, START_MS), // unknown partition
        ],
    )
    .await;
    rejected(&r[0], ErrorCode::InvalidProducerEpoch);
    rejected(&r[1], ErrorCode::OutOfOrderSequenceNumber);
    dup_of(&r[2], 0);
    rejected(&r[3], ErrorCode::UnknownTopicOrPartition);
    let info = info_of(&h, &key).await;
    assert_eq!(info.live_bytes, 0);
    assert_eq!(info.marked_for_deletion_at, Some(START_MS + 7));
    let marked = h
        .coordinator
        .objects_to_delete(START_MS + 8, 10)
        .await
        .unwrap();
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0].object_key, key);
    assert_eq!(marked[0].marked_for_deletion_at, START_MS + 7);
    assert_eq!(marked[0].object_size, info.object_size);
}

/// objects_to_delete lists marked objects oldest first, before a time, up to a limit;
/// confirm_deleted forgets only marked objects; known_objects tells which keys are known.
pub async fn objects_to_delete_and_confirm(h: Harness) {
    let p = partition(&h).await;
    let live = new_key();
    let (a, b, c) = (new_key(), new_key(), new_key());
    commit_key(&h, &a, vec![plain(p, 1, 10, START_MS)]).await; // offset 0
    commit_key(&h, &b, vec![plain(p, 1, 10, START_MS)]).await; // offset 1
    commit_key(&h, &c, vec![plain(p, 1, 10, START_MS)]).await; // offset 2
    commit_key(&h, &live, vec![plain(p, 1, 10, START_MS)]).await; // offset 3
    h.clock.advance(100);
    delete_records(&h, p, 1).await; // a at +100
    h.clock.advance(100);
    delete_records(&h, p, 3).await; // b, c at +200
    let co = &h.coordinator;
    let all = co.objects_to_delete(i64::MAX, 100).await.unwrap();
    let keys: Vec<&str> = all.iter().map(|o| o.object_key.as_str()).collect();
    let mut bc = [b.as_str(), c.as_str()];
    bc.sort();
    assert_eq!(keys, vec![a.as_str(), bc[0], bc[1]]);
    assert_eq!(all[0].marked_for_deletion_at, START_MS + 100);
    assert_eq!(all[1].marked_for_deletion_at, START_MS + 200);
    assert_eq!(all[0].object_size, 11);
    let early = co.objects_to_delete(START_MS + 200, 100).await.unwrap();
    assert_eq!(early.len(), 1);
    assert_eq!(early[0].object_key, a);
    assert_eq!(co.objects_to_delete(i64::MAX, 2).await.unwrap().len(), 2);
    assert!(
        co.objects_to_delete(START_MS + 100, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(co.objects_to_delete(i64::MAX, 0).await.unwrap().is_empty());

    let unknown = "wal/unknown".to_string();
    let known = co
        .known_objects(&[unknown.clone(), live.clone(), a.clone(), live.clone()])
        .await
        .unwrap();
    assert_eq!(known, vec![live.clone(), a.clone()]);

    co.confirm_deleted(&[a.clone(), live.clone(), unknown.clone()])
        .await
        .unwrap();
    assert_eq!(object(&h, &a).await, None);
    assert!(object(&h, &live).await.is_some(), "not marked: kept");
    let rest = co.objects_to_delete(i64::MAX, 100).await.unwrap();
    assert_eq!(rest.len(), 2);
    assert_eq!(
        co.known_objects(&[a.clone(), b.clone()]).await.unwrap(),
        vec![b.clone()]
    );
    // A confirmed-deleted key is forgotten, so it can never be confused with a live one.
    assert!(!is_known(&h, &a).await);
}

// ---------------------------------------------------------------------------------------------
// Reads

/// find_batches honours the partition and total byte limits, always returning the first batch.
pub async fn find_batches_byte_limits(h: Harness) {
    let t = topic(&h, 2).await;
    let (p0, p1) = (tp(t, 0), tp(t, 1));
    commit(
        &h,
        (0..5)
            .flat_map(|_| [plain(p0, 2, 100, START_MS), plain(p1, 1, 100, START_MS)])
            .collect(),
    )
    .await;
    let find = |reqs: Vec<(TopicIdPartition, i64, u32)>, total: u32| {
        let c = h.coordinator.clone();
        async move {
            let reqs: Vec<FindBatchesRequest> = reqs
                .into_iter()
                .map(|(partition, offset, max_bytes)| FindBatchesRequest {
                    partition,
                    offset,
                    max_bytes,
                    isolation: Default::default(),
                })
                .collect();
            c.find_batches(&reqs, total)
                .await
                .unwrap()
                .into_iter()
                .map(|r| {
                    assert_eq!(r.error, ErrorCode::None);
                    r.batches.iter().map(|b| b.base_offset).collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(find(vec![(p0, 0, 250)], 10_000).await, vec![vec![0, 2]]);
    assert_eq!(find(vec![(p0, 0, 300)], 10_000).await, vec![vec![0, 2, 4]]);
    // The first batch always comes, even over both limits.
    assert_eq!(find(vec![(p0, 3, 10)], 10).await, vec![vec![2]]);
    // The total limit spans partitions; each partition still gets its first batch.
    assert_eq!(
        find(vec![(p0, 0, 10_000), (p1, 2, 10_000)], 250).await,
        vec![vec![0, 2], vec![2]]
    );
    assert_eq!(
        find(vec![(p0, 0, 200), (p1, 0, 10_000)], 450).await,
        vec![vec![0, 2], vec![0, 1]]
    );
    assert_eq!(
        find(vec![(p0, 8, 10_000), (p1, 4, 10_000)], 10_000).await,
        vec![vec![8], vec![4]]
    );
}

/// find_batches starts at the batch containing the offset; errors per partition.
pub async fn find_batches_offsets_and_errors(h: Harness) {
    let t = topic(&h, 1).await;
    let p = tp(t, 0);
    commit(&h, vec![plain(p, 5, 10, START_MS); 3]).await;
    let req = |partition, offset| FindBatchesRequest {
        partition,
        offset,
        max_bytes: 1000,
        isolation: Default::default(),
    };
    let r = h
        .coordinator
        .find_batches(
            &[
                req(p, 7),
                req(p, 14),
                req(p, 15),
                req(p, 16),
                req(p, -1),
                req(tp(t, 1), 0),
                req(tp(fresh_id(), 0), 0),
            ],
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(r.len(), 7);
    let bases = |i: usize| {
        r[i].batches
            .iter()
            .map(|b| b.base_offset)
            .collect::<Vec<_>>()
    };
    assert_eq!(r[0].error, ErrorCode::None);
    assert_eq!(bases(0), vec![5, 10]);
    assert_eq!((r[0].log_start_offset, r[0].high_watermark), (0, 15));
    assert_eq!(bases(1), vec![10]);
    assert_eq!(
        r[2].error,
        ErrorCode::None,
        "the high watermark itself is in range"
    );
    assert!(r[2].batches.is_empty());
    assert_eq!(r[2].high_watermark, 15);
    for (i, code) in [
        (3, ErrorCode::OffsetOutOfRange),
        (4, ErrorCode::OffsetOutOfRange),
        (5, ErrorCode::UnknownTopicOrPartition),
        (6, ErrorCode::UnknownTopicOrPartition),
    ] {
        assert_eq!(r[i].error, code, "request {i}");
        assert!(r[i].batches.is_empty());
        assert_eq!((r[i].log_start_offset, r[i].high_watermark), (-1, -1));
    }
    // Below the log start offset is out of range; at it, the straddling batch comes first.
    delete_records(&h, p, 7).await;
    let r = h
        .coordinator
        .find_batches(&[req(p, 6), req(p, 7)], 10_000)
        .await
        .unwrap();
    assert_eq!(r[0].error, ErrorCode::OffsetOutOfRange);
    assert_eq!(r[1].error, ErrorCode::None);
    assert_eq!(r[1].batches[0].base_offset, 5);
    assert_eq!(r[1].log_start_offset, 7);
}

/// EARLIEST is the log start offset, LATEST the high watermark.
pub async fn list_offsets_earliest_latest(h: Harness) {
    let t = topic(&h, 1).await;
    let p = tp(t, 0);
    for ts in [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP] {
        let r = list(&h, p, ts).await;
        assert_eq!(
            (r.error, r.offset, r.timestamp),
            (ErrorCode::None, 0, NO_TIMESTAMP)
        );
    }
    let r = list(&h, p, MAX_TIMESTAMP).await;
    assert_eq!(
        (r.error, r.offset, r.timestamp),
        (ErrorCode::None, -1, NO_TIMESTAMP)
    );
    commit(
        &h,
        vec![plain(p, 4, 10, START_MS), plain(p, 4, 10, START_MS)],
    )
    .await;
    delete_records(&h, p, 5).await;
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 5);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 8);
    let r = list(&h, tp(t, 1), EARLIEST_TIMESTAMP).await;
    assert_eq!(
        (r.error, r.offset, r.timestamp),
        (ErrorCode::UnknownTopicOrPartition, -1, NO_TIMESTAMP)
    );
    let r = list(&h, p, -7).await;
    assert_eq!(r.error, ErrorCode::InvalidRequest);
}

/// By timestamp: the first batch whose max timestamp is at or after the target.
pub async fn list_offsets_by_timestamp(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            plain(p, 2, 10, 100), // 0..1
            plain(p, 2, 10, 300), // 2..3
            plain(p, 2, 10, 200), // 4..5
            plain(p, 2, 10, 400), // 6..7
        ],
    )
    .await;
    let at = |ts| list(&h, p, ts);
    let r = at(0).await;
    assert_eq!((r.offset, r.timestamp), (0, 100));
    let r = at(100).await;
    assert_eq!((r.offset, r.timestamp), (0, 100));
    let r = at(101).await;
    assert_eq!((r.offset, r.timestamp), (2, 300));
    let r = at(250).await;
    assert_eq!((r.offset, r.timestamp), (2, 300));
    let r = at(301).await;
    assert_eq!((r.offset, r.timestamp), (6, 400));
    let r = at(401).await;
    assert_eq!(
        (r.error, r.offset, r.timestamp),
        (ErrorCode::None, -1, NO_TIMESTAMP)
    );
    // Deleted batches are not found; a straddling batch answers the log start offset.
    delete_records(&h, p, 3).await;
    let r = at(0).await;
    assert_eq!((r.offset, r.timestamp), (3, 300));
}

/// MAX_TIMESTAMP: the earliest batch with the largest timestamp (KIP-734), at batch granularity.
pub async fn list_offsets_max_timestamp(h: Harness) {
    let p = partition(&h).await;
    commit(
        &h,
        vec![
            plain(p, 2, 10, 100),
            plain(p, 2, 10, 500),
            plain(p, 2, 10, 200),
            plain(p, 2, 10, 500),
        ],
    )
    .await;
    let r = list(&h, p, MAX_TIMESTAMP).await;
    assert_eq!((r.error, r.offset, r.timestamp), (ErrorCode::None, 2, 500));
    delete_records(&h, p, 4).await;
    let r = list(&h, p, MAX_TIMESTAMP).await;
    assert_eq!((r.offset, r.timestamp), (6, 500));

    let lat = topic_with(
        &h,
        "lat",
        1,
        TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            ..TopicConfig::default()
        },
    )
    .await;
    let q = tp(lat, 0);
    commit(&h, vec![plain(q, 3, 10, 9_999_999_999_999)]).await;
    h.clock.advance(10);
    commit(&h, vec![plain(q, 3, 10, 1)]).await;
    let r = list(&h, q, MAX_TIMESTAMP).await;
    assert_eq!((r.offset, r.timestamp), (3, START_MS + 10));
    let r = list(&h, q, START_MS + 1).await;
    assert_eq!((r.offset, r.timestamp), (3, START_MS + 10));
}

// ---------------------------------------------------------------------------------------------
// Deletion

/// DeleteRecords moves the log start offset forward and deletes the batches wholly before it.
pub async fn delete_records_moves_log_start(h: Harness) {
    let t = topic(&h, 1).await;
    let p = tp(t, 0);
    commit(&h, vec![plain(p, 3, 10, START_MS); 3]).await;
    assert_eq!(delete_records(&h, p, 4).await, (ErrorCode::None, 4));
    let (batches, lso, hwm) = all_batches(&h, p).await;
    assert_eq!((lso, hwm), (4, 9));
    assert_eq!(
        batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        vec![3, 6]
    );
    // At or below the log start offset: no-op.
    assert_eq!(delete_records(&h, p, 2).await, (ErrorCode::None, 4));
    assert_eq!(delete_records(&h, p, 4).await, (ErrorCode::None, 4));
    // Exactly at a batch boundary.
    assert_eq!(delete_records(&h, p, 6).await, (ErrorCode::None, 6));
    let (batches, _, _) = all_batches(&h, p).await;
    assert_eq!(batches.len(), 1);
    // -1 means the high watermark.
    assert_eq!(delete_records(&h, p, -1).await, (ErrorCode::None, 9));
    let (batches, lso, hwm) = all_batches(&h, p).await;
    assert!(batches.is_empty());
    assert_eq!((lso, hwm), (9, 9));
    // New commits continue after the high watermark; results carry the log start offset.
    let r = commit(&h, vec![plain(p, 1, 10, START_MS)]).await;
    ok_at(&r[0], 9);
    assert_eq!(r[0].log_start_offset, 9);
    assert_eq!(
        delete_records(&h, tp(t, 5), 0).await,
        (ErrorCode::UnknownTopicOrPartition, -1)
    );
    assert_eq!(
        delete_records(&h, p, -2).await,
        (ErrorCode::OffsetOutOfRange, -1)
    );
}

/// UnifiedLogTest: the log start offset cannot move past the high watermark.
pub async fn cannot_move_log_start_past_high_watermark(h: Harness) {
    let p = partition(&h).await;
    assert_eq!(
        delete_records(&h, p, 1).await,
        (ErrorCode::OffsetOutOfRange, -1)
    );
    commit(&h, vec![plain(p, 3, 10, START_MS)]).await;
    assert_eq!(
        delete_records(&h, p, 4).await,
        (ErrorCode::OffsetOutOfRange, -1)
    );
    let (batches, lso, _) = all_batches(&h, p).await;
    assert_eq!((batches.len(), lso), (1, 0));
    assert_eq!(delete_records(&h, p, 3).await, (ErrorCode::None, 3));
}

async fn retention_topic(h: &Harness, retention_ms: i64, retention_bytes: i64) -> TopicIdPartition {
    let t = topic_with(
        h,
        &format!("r-{}", fresh_id()),
        1,
        TopicConfig {
            retention_ms,
            retention_bytes,
            ..TopicConfig::default()
        },
    )
    .await;
    tp(t, 0)
}

/// Time retention deletes the prefix of batches older than retention.ms, and no more.
pub async fn retention_by_time(h: Harness) {
    let p = retention_topic(&h, 1000, -1).await;
    let now = START_MS;
    commit(
        &h,
        vec![
            plain(p, 1, 10, now - 5000),
            plain(p, 1, 10, now - 2000),
            plain(p, 1, 10, now - 100),
            plain(p, 1, 10, now - 3000), // old, but after a young one: kept
            plain(p, 1, 10, now),
        ],
    )
    .await;
    let report = retention_pass(&h).await;
    assert_eq!(report.batches_deleted, 2);
    assert_eq!(report.bytes_deleted, 20);
    assert!(!report.more);
    let (batches, lso, _) = all_batches(&h, p).await;
    assert_eq!((batches.len(), lso), (3, 2));
    // Exactly retention.ms old is kept (strictly greater deletes).
    h.clock.set(now + 900);
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);
    h.clock.set(now + 901);
    let report = retention_pass(&h).await;
    assert_eq!(
        report.batches_deleted, 2,
        "the young one and the old one after it"
    );
    h.clock.set(now + 1001);
    assert_eq!(retention_pass(&h).await.batches_deleted, 1);
    let (batches, lso, hwm) = all_batches(&h, p).await;
    assert!(batches.is_empty());
    assert_eq!((lso, hwm), (5, 5));
}

/// Size retention deletes the oldest batches while what is left stays >= retention.bytes.
pub async fn retention_by_size(h: Harness) {
    let p = retention_topic(&h, -1, 250).await;
    commit(&h, vec![plain(p, 1, 100, 0); 4]).await;
    // 400 bytes; deleting one leaves 300 >= 250, deleting two would leave 200 < 250.
    let report = retention_pass(&h).await;
    assert_eq!((report.batches_deleted, report.bytes_deleted), (1, 100));
    let (batches, lso, _) = all_batches(&h, p).await;
    assert_eq!((batches.len(), lso), (3, 1));
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);

    // Exactly at the limit: deleting leaves 200 >= 200.
    let q = retention_topic(&h, -1, 200).await;
    commit(&h, vec![plain(q, 1, 100, 0); 3]).await;
    assert_eq!(retention_pass(&h).await.batches_deleted, 1);
    // retention.bytes 0 deletes everything.
    let z = retention_topic(&h, -1, 0).await;
    commit(&h, vec![plain(z, 1, 100, 0), plain(z, 1, 100, 0)]).await;
    assert_eq!(retention_pass(&h).await.batches_deleted, 2);
    let (batches, lso, hwm) = all_batches(&h, z).await;
    assert!(batches.is_empty());
    assert_eq!((lso, hwm), (2, 2));
    // Time and size together: time first, then size on what is left.
    let both = retention_topic(&h, 1000, 150).await;
    commit(
        &h,
        vec![
            plain(both, 1, 100, START_MS - 5000),
            plain(both, 1, 100, START_MS),
            plain(both, 1, 100, START_MS),
            plain(both, 1, 100, START_MS),
        ],
    )
    .await;
    // The old one goes by time (300 bytes left), then one more by size (200 >= 150), not a third
    // (100 < 150).
    let report = retention_pass(&h).await;
    assert_eq!(report.batches_deleted, 2);
    let (batches, lso, _) = all_batches(&h, both).await;
    assert_eq!((batches.len(), lso), (2, 2));
}

/// A pass deletes at most max_batches and says whether more is left.
pub async fn retention_cap_reports_more(h: Harness) {
    let p = retention_topic(&h, 10, -1).await;
    let q = retention_topic(&h, 10, -1).await;
    let key = new_key();
    commit_key(
        &h,
        &key,
        (0..3)
            .flat_map(|_| [plain(p, 1, 10, 0), plain(q, 1, 10, 0)])
            .collect(),
    )
    .await;
    let r = h.coordinator.enforce_retention(4).await.unwrap();
    assert_eq!((r.batches_deleted, r.bytes_deleted, r.more), (4, 40, true));
    // A zero budget does nothing and never asks for more.
    let r = h.coordinator.enforce_retention(0).await.unwrap();
    assert_eq!((r.batches_deleted, r.more), (0, false));
    assert!(info_of(&h, &key).await.marked_for_deletion_at.is_none());
    // The pass spent its whole budget: `more`, although nothing is left (it does not look further).
    let r = h.coordinator.enforce_retention(2).await.unwrap();
    assert_eq!((r.batches_deleted, r.more), (2, true));
    let info = info_of(&h, &key).await;
    assert_eq!(info.live_bytes, 0);
    assert_eq!(info.marked_for_deletion_at, Some(START_MS));
    let r = h.coordinator.enforce_retention(2).await.unwrap();
    assert_eq!(r, Default::default());
}

/// -1 disables both limits; LogAppendTime batches age from their commit time.
pub async fn retention_disabled_and_log_append_time(h: Harness) {
    let p = retention_topic(&h, -1, -1).await;
    commit(&h, vec![plain(p, 1, 10, 0), plain(p, 1, 10, 0)]).await;
    h.clock.advance(1_000_000_000);
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);

    let lat = topic_with(
        &h,
        "lat",
        1,
        TopicConfig {
            timestamp_type: TimestampType::LogAppendTime,
            retention_ms: 1000,
            ..TopicConfig::default()
        },
    )
    .await;
    let q = tp(lat, 0);
    commit(&h, vec![plain(q, 1, 10, 0)]).await; // producer timestamp 0: ignored
    h.clock.advance(1000);
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);
    h.clock.advance(1);
    assert_eq!(retention_pass(&h).await.batches_deleted, 1);
}

/// Producer state outlives the batches it was built from (KIP-360): duplicates are still answered.
pub async fn producer_state_survives_delete_records(h: Harness) {
    let p = partition(&h).await;
    ok_at(&commit_one(&h, idem(p, 4, 0, 0, 2)).await, 0);
    delete_records(&h, p, -1).await;
    let s = producer(&h, p, 4).await.unwrap();
    assert_eq!(s.batches.len(), 1);
    let r = commit(&h, vec![idem(p, 4, 0, 0, 2)]).await;
    dup_of(&r[0], 0);
    assert_eq!(r[0].log_start_offset, 2);
    rejected(
        &commit_one(&h, idem(p, 4, 0, 5, 1)).await,
        ErrorCode::OutOfOrderSequenceNumber,
    );
    ok_at(&commit_one(&h, idem(p, 4, 0, 2, 1)).await, 2);
}

// ---------------------------------------------------------------------------------------------
// Safety at the commit point, per-batch producer checks, producer expiry (issue #12)

/// What a producer controls is judged per batch: a bad epoch or sequence rejects that batch only,
/// never the other producers' batches of the same segment. A producer id below -1 is not
/// idempotent (Kafka's `hasProducerId`).
pub async fn producer_fields_judged_per_batch(h: Harness) {
    let p = partition(&h).await;
    let mut bad_epoch = idem(p, 2, 0, 0, 1);
    bad_epoch.producer_epoch = -2;
    let mut bad_seq = idem(p, 3, 0, 0, 1);
    bad_seq.base_sequence = -1;
    bad_seq.last_sequence = -1;
    let odd_id = CommitBatch {
        producer_id: -5,
        producer_epoch: -7,
        base_sequence: 42,
        last_sequence: 42,
        ..plain(p, 1, 100, START_MS)
    };
    let mut epoch_minus_one = idem(p, 4, 0, 9, 1);
    epoch_minus_one.producer_epoch = -1;
    let key = new_key();
    let r = commit_key(
        &h,
        &key,
        vec![
            idem(p, 1, 0, 0, 2),
            bad_epoch,
            bad_seq,
            odd_id,
            epoch_minus_one,
            idem(p, 1, 0, 2, 1),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    rejected(&r[1], ErrorCode::InvalidProducerEpoch);
    rejected(&r[2], ErrorCode::InvalidRecord);
    ok_at(&r[3], 2);
    ok_at(&r[4], 3);
    ok_at(&r[5], 4);
    assert_eq!(producer(&h, p, 2).await, None);
    assert_eq!(producer(&h, p, 3).await, None);
    assert_eq!(producer(&h, p, -5).await, None);
    // Kafka accepts epoch -1 for a new producer id; its state then has epoch -1.
    let s4 = producer(&h, p, 4).await.expect("state of producer 4");
    assert_eq!(s4.producer_epoch, -1);
    // Only the appended batches count towards the object's live bytes.
    assert_eq!(info_of(&h, &key).await.live_bytes, 400);
}

/// The commit deadline is decided by the coordinator at the commit: a key whose UUID v7 time is
/// older than `now - max_commit_age` is refused with nothing applied; one just inside is accepted;
/// keys without a v7 time are never refused. (Uses the default `max_commit_age`.)
pub async fn commit_deadline_checked_at_commit(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let now = h.clock.now_ms();
    let late = v7_key(now - max_age_ms() - 60_000);
    let r = c
        .commit_file(request(&late, vec![plain(p, 1, 10, now)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "expected DeadlineExceeded, got {r:?}"
    );
    assert!(r.unwrap_err().certainly_not_applied());
    assert_eq!(object(&h, &late).await, None);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 0);
    let inside = v7_key(now - max_age_ms() + 60_000);
    ok_at(
        &commit_key(&h, &inside, vec![plain(p, 1, 10, now)]).await[0],
        0,
    );
    ok_at(&commit_one(&h, plain(p, 1, 10, now)).await, 1);
}

/// The deadline is read from the coordinator's clock at the commit: a key accepted now is refused
/// once the clock has moved past its deadline. A fence outlives the deadline: at the very moment the
/// deadline would still accept the key, the fence (even after an expiry sweep) refuses it.
/// (A [`MANUAL_CLOCK_CASES`] case: the coordinator must read the harness clock.)
pub async fn the_deadline_and_fences_follow_the_coordinator_clock(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let start = h.clock.now_ms();
    let aging = v7_key(start);
    let fenced = v7_key(start);
    assert_eq!(
        c.fence_orphans(std::slice::from_ref(&fenced))
            .await
            .unwrap(),
        vec![fenced.clone()]
    );
    // Exactly at the deadline: the key is still acceptable by age, so only the fence refuses it,
    // also after a sweep of expired fences at that time.
    h.clock.advance(max_age_ms());
    assert!(c.fence_orphans(&[]).await.unwrap().is_empty());
    let r = c
        .commit_file(request(&fenced, vec![plain(p, 1, 10, start)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::ObjectFenced(_))),
        "a fence must outlive the deadline, got {r:?}"
    );
    // One millisecond later the deadline refuses the other key, with nothing applied.
    h.clock.advance(1);
    let r = c
        .commit_file(request(&aging, vec![plain(p, 1, 10, start)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "expected DeadlineExceeded, got {r:?}"
    );
    assert_eq!(object(&h, &aging).await, None);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 0);
    // Long after, both stay refused (by the deadline once the fence is dropped).
    h.clock.advance(10 * max_age_ms());
    assert!(c.fence_orphans(&[]).await.unwrap().is_empty());
    for key in [&fenced, &aging] {
        let r = c
            .commit_file(request(key, vec![plain(p, 1, 10, start)]))
            .await;
        assert!(r.is_err_and(|e| e.certainly_not_applied()), "{key}");
    }
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 0);
}

/// `confirm_deleted` fences the key it forgets: a retried commit of a deleted object (say, after
/// every batch of its first commit was rejected and the cleaner deleted it) is refused instead of
/// appending batches to an object that no longer exists.
pub async fn a_confirmed_deleted_key_is_never_committed_again(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let now = h.clock.now_ms();
    let key = v7_key(now);
    let unknown = tp(fresh_id(), 0);
    let r = commit_key(&h, &key, vec![plain(unknown, 1, 10, now)]).await;
    rejected(&r[0], ErrorCode::UnknownTopicOrPartition);
    h.clock.advance(1);
    let marked = c.objects_to_delete(h.clock.now_ms(), 10).await.unwrap();
    assert_eq!(
        marked
            .iter()
            .map(|o| o.object_key.as_str())
            .collect::<Vec<_>>(),
        vec![key.as_str()]
    );
    c.confirm_deleted(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(object(&h, &key).await, None);
    let again = c
        .commit_file(request(&key, vec![plain(p, 1, 10, now)]))
        .await;
    assert!(
        matches!(again, Err(CoordinatorError::ObjectFenced(_))),
        "expected ObjectFenced, got {again:?}"
    );
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 0);
    assert_eq!(object(&h, &key).await, None);
    assert!(!is_known(&h, &key).await);
}

/// `fence_orphans` fences exactly the unknown keys with a v7 time, in request order, once each,
/// idempotently; known keys and keys without a v7 time are left alone. Fences do not make a key
/// known.
pub async fn fence_orphans_fences_unknown_keys_only(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let now = h.clock.now_ms();
    let committed = v7_key(now);
    commit_key(&h, &committed, vec![plain(p, 1, 10, now)]).await;
    let orphan_a = v7_key(now);
    let orphan_b = v7_key(now - 1_000);
    let undatable = new_key();
    let keys = vec![
        orphan_a.clone(),
        committed.clone(),
        undatable.clone(),
        orphan_b.clone(),
        orphan_a.clone(),
    ];
    assert_eq!(
        c.fence_orphans(&keys).await.unwrap(),
        vec![orphan_a.clone(), orphan_b.clone()]
    );
    assert_eq!(
        c.fence_orphans(std::slice::from_ref(&orphan_b))
            .await
            .unwrap(),
        vec![orphan_b.clone()],
        "fencing again is idempotent and answers the key again"
    );
    assert_eq!(
        c.known_objects(&keys).await.unwrap(),
        vec![committed.clone()]
    );
    assert_eq!(object(&h, &orphan_a).await, None);
    assert!(c.fence_orphans(&[]).await.unwrap().is_empty());
}

/// A commit of a fenced key is refused with nothing applied, so the collector may delete the
/// object whatever commits are in flight; the refusal is certain (the writer may delete the object).
pub async fn fenced_and_expired_keys_never_commit(h: Harness) {
    let p = partition(&h).await;
    let c = &h.coordinator;
    let now = h.clock.now_ms();
    let orphan = v7_key(now);
    assert_eq!(
        c.fence_orphans(std::slice::from_ref(&orphan))
            .await
            .unwrap(),
        vec![orphan.clone()]
    );
    let r = c
        .commit_file(request(
            &orphan,
            vec![plain(p, 1, 10, now), idem(p, 1, 0, 0, 1)],
        ))
        .await;
    match r {
        Err(e @ CoordinatorError::ObjectFenced(_)) => assert!(e.certainly_not_applied()),
        other => panic!("expected ObjectFenced, got {other:?}"),
    }
    assert_eq!(object(&h, &orphan).await, None);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 0);
    assert_eq!(producer(&h, p, 1).await, None);
    assert!(!is_known(&h, &orphan).await);
    // Other keys commit normally.
    ok_at(
        &commit_key(&h, &v7_key(now), vec![plain(p, 1, 10, now)]).await[0],
        0,
    );
}

/// A batch without any timestamp is aged by its commit time (Kafka ages a segment without
/// timestamps by its modification time), not deleted by the next retention pass.
pub async fn retention_ages_batches_without_timestamps_by_commit_time(h: Harness) {
    let p = retention_topic(&h, 10_000, -1).await;
    let mut untimed = plain(p, 2, 10, NO_TIMESTAMP);
    untimed.base_timestamp = NO_TIMESTAMP;
    commit(&h, vec![untimed.clone()]).await;
    h.clock.advance(5_000);
    commit(&h, vec![untimed]).await;
    let r = retention_pass(&h).await;
    assert_eq!(
        r.batches_deleted, 0,
        "no timestamp must not mean 'infinitely old'"
    );
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 0);
    h.clock.advance(5_001); // the first batch is now 10 001 ms old, the second 5 001
    let r = retention_pass(&h).await;
    assert_eq!(r.batches_deleted, 1);
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 2);
    h.clock.advance(5_000);
    let r = retention_pass(&h).await;
    assert_eq!(r.batches_deleted, 1);
    assert_eq!(list(&h, p, EARLIEST_TIMESTAMP).await.offset, 4);
}

async fn expiring_topic(h: &Harness, partitions: i32, expiration_ms: i64) -> Uuid {
    let name = format!("t-{}", fresh_id());
    topic_with(
        h,
        &name,
        partitions,
        TopicConfig {
            producer_id_expiration_ms: expiration_ms,
            ..TopicConfig::default()
        },
    )
    .await
}

/// The least time producer state is kept whatever the topic says: twice the default
/// `max_commit_age` of every harness's coordinator ([`diskless_coordinator::producer_expired`]).
fn floor_ms() -> i64 {
    diskless_coordinator::producer_state_floor_ms(diskless_coordinator::DEFAULT_MAX_COMMIT_AGE)
}

/// Producer state expires `producer.id.expiration.ms` after the producer's last appended batch
/// (Kafka's `>=`); a duplicate does not refresh it; an expired producer is new again (any sequence).
/// A setting below the floor (twice `max_commit_age`) acts as the floor.
pub async fn producer_state_expires(h: Harness) {
    let expiration = floor_ms() + 5_000;
    let t = expiring_topic(&h, 1, expiration).await;
    let p = tp(t, 0);
    let c = &h.coordinator;
    ok_at(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 0);
    let s = producer(&h, p, 1).await.unwrap();
    assert_eq!(s.last_append_ms, h.clock.now_ms());
    h.clock.advance(expiration - 2_000);
    ok_at(&commit_one(&h, idem(p, 2, 0, 0, 1)).await, 1);
    h.clock.advance(1_000);
    dup_of(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 0);
    h.clock.advance(999); // producer 1: expiration - 1 ms since its append
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    h.clock.advance(1); // expiration: expired (>=); producer 2: 2 000 ms
    let r = c.expire_producers(100).await.unwrap();
    assert_eq!((r.expired, r.more), (1, false));
    assert_eq!(producer(&h, p, 1).await, None);
    assert!(producer(&h, p, 2).await.is_some());
    // Producer 1 is new again: a gap is accepted, and a resend of its old batch is appended again.
    ok_at(&commit_one(&h, idem(p, 1, 0, 7, 1)).await, 2);
    ok_at(&commit_one(&h, idem(p, 1, 1, 0, 1)).await, 3);
    // A topic setting below the floor (5 s here) keeps the state for the floor, then expires it.
    let short = tp(expiring_topic(&h, 1, 5_000).await, 0);
    ok_at(&commit_one(&h, idem(short, 3, 0, 0, 1)).await, 0);
    h.clock.advance(floor_ms() - 1);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    assert!(producer(&h, short, 3).await.is_some());
    h.clock.advance(1);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 1);
    assert_eq!(producer(&h, short, 3).await, None);
    let topics = c.list_topics().await.unwrap();
    let listed = topics
        .iter()
        .find(|i| i.topic_id == short.topic_id)
        .unwrap();
    assert_eq!(
        listed.config.producer_id_expiration_ms, 5_000,
        "the setting is answered as set"
    );
    // The default is one day.
    assert_eq!(TopicConfig::default().producer_id_expiration_ms, 86_400_000);
    // Invalid settings are refused.
    invalid(
        c.create_topic(CreateTopicRequest {
            topic_id: fresh_id(),
            name: "bad-expiration".into(),
            partitions: 1,
            config: TopicConfig {
                producer_id_expiration_ms: 0,
                ..TopicConfig::default()
            },
        })
        .await,
    );
}

/// A capped expiry call expires in (topic id, partition, producer id) order and reports `more`
/// exactly when it stopped at its cap.
pub async fn producer_expiry_cap_and_order(h: Harness) {
    let c = &h.coordinator;
    let config = TopicConfig {
        producer_id_expiration_ms: 1_000,
        ..TopicConfig::default()
    };
    // Topic ids chosen so that the later-created topic sorts first (UUID byte order).
    let (first, second) = (
        Uuid::from_u128(0x0000_0001_0000_7000_8000_0000_0000_0001),
        Uuid::from_u128(0xffff_0001_0000_7000_8000_0000_0000_0001),
    );
    for (id, name) in [(second, "expiry-b"), (first, "expiry-a")] {
        c.create_topic(CreateTopicRequest {
            topic_id: id,
            name: name.into(),
            partitions: 2,
            config: config.clone(),
        })
        .await
        .unwrap();
    }
    commit(
        &h,
        vec![
            idem(tp(second, 0), 1, 0, 0, 1),
            idem(tp(first, 1), 5, 0, 0, 1),
            idem(tp(first, 0), 9, 0, 0, 1),
            idem(tp(first, 0), 3, 0, 0, 1),
        ],
    )
    .await;
    h.clock.advance(floor_ms()); // the floor: every state may go
    assert_eq!(
        c.expire_producers(0).await.unwrap(),
        diskless_coordinator::ProducerExpiryReport::default()
    );
    let r = c.expire_producers(2).await.unwrap();
    assert_eq!((r.expired, r.more), (2, true));
    assert_eq!(producer(&h, tp(first, 0), 3).await, None);
    assert_eq!(producer(&h, tp(first, 0), 9).await, None);
    assert!(producer(&h, tp(first, 1), 5).await.is_some());
    let r = c.expire_producers(1).await.unwrap();
    assert_eq!((r.expired, r.more), (1, true));
    assert_eq!(producer(&h, tp(first, 1), 5).await, None);
    assert!(producer(&h, tp(second, 0), 1).await.is_some());
    let r = c.expire_producers(2).await.unwrap();
    assert_eq!((r.expired, r.more), (1, false));
    assert_eq!(producer(&h, tp(second, 0), 1).await, None);
}

/// A changed `producer.id.expiration.ms` applies to the next expiry: a state the default (one
/// day) keeps expires once the new, shorter setting (above the floor) has passed.
pub async fn alter_topic_config_changes_producer_expiry(h: Harness) {
    let t = expiring_topic(&h, 1, TopicConfig::default().producer_id_expiration_ms).await;
    let p = tp(t, 0);
    let c = &h.coordinator;
    ok_at(&commit_one(&h, idem(p, 4, 0, 0, 1)).await, 0);
    let shorter = floor_ms() + 2_000;
    h.clock.advance(shorter);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    c.alter_topic_config(
        t,
        TopicConfig::default().with_producer_id_expiration_ms(shorter),
    )
    .await
    .unwrap();
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 1);
    assert_eq!(producer(&h, p, 4).await, None);
}

/// Issue #25, reproduction 2: a resend stalled in upload lands after its producer's state would
/// have expired by the topic's `producer.id.expiration.ms` (60 s), within its commit deadline.
/// The client's retry was acknowledged at offset 0; the stalled first attempt must be answered as
/// its duplicate (offset 0), not appended again: the state outlives `producer.id.expiration.ms`
/// until no commit it guards can still land (twice `max_commit_age`).
pub async fn late_resend_after_expiration_is_still_a_duplicate(h: Harness) {
    let p = tp(expiring_topic(&h, 1, 60_000).await, 0);
    let c = &h.coordinator;
    // The first attempt's segment is made now, then stalls in upload.
    let stalled = v7_key(h.clock.now_ms());
    h.clock.advance(1_000);
    // The client's retry goes to another broker and is acknowledged at offset 0.
    ok_at(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 0);
    let appended_at = h.clock.now_ms();
    h.clock.advance(61_000);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    assert!(producer(&h, p, 1).await.is_some(), "the state is kept");
    // The stalled attempt commits, 62 s after its key was made (within the 10 min deadline).
    dup_of(
        &commit_key(&h, &stalled, vec![idem(p, 1, 0, 0, 1)]).await[0],
        0,
    );
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 1, "read once");
    // The state goes exactly at the floor after the last append (the duplicate did not refresh it).
    h.clock.set(appended_at + floor_ms() - 1);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    h.clock.advance(1);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 1);
    assert_eq!(producer(&h, p, 1).await, None);
}

/// The bound the floor rests on: a state updated at `L` is kept until `L + 2 × max_commit_age`;
/// a key made up to `max_commit_age` after `L` (the clock-skew allowance: a writer's clock ahead,
/// or a batch waiting in a writer before its segment's key was made) can commit until `key time +
/// max_commit_age`, i.e. strictly before the state may go, and from then on the deadline refuses
/// it. (A [`MANUAL_CLOCK_CASES`] case: the deadline must follow the harness clock.)
pub async fn producer_state_outlives_every_commit_it_guards(h: Harness) {
    let p = tp(expiring_topic(&h, 1, 1).await, 0);
    let c = &h.coordinator;
    ok_at(&commit_one(&h, idem(p, 1, 0, 0, 1)).await, 0);
    let l = h.clock.now_ms();
    // Two resends of that batch, their keys made max_commit_age - 1 ms after the append.
    let (late, later) = (v7_key(l + max_age_ms() - 1), v7_key(l + max_age_ms() - 1));
    h.clock.set(l + floor_ms() - 1);
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 0);
    // The last moment its deadline accepts `late`: the state is still there, so it is a duplicate.
    h.clock.set(l + max_age_ms() - 1 + max_age_ms());
    dup_of(
        &commit_key(&h, &late, vec![idem(p, 1, 0, 0, 1)]).await[0],
        0,
    );
    // At the floor the state expires, and the deadline refuses every key made that late.
    h.clock.set(l + floor_ms());
    let r = c
        .commit_file(request(&later, vec![idem(p, 1, 0, 0, 1)]))
        .await;
    assert!(
        matches!(r, Err(CoordinatorError::DeadlineExceeded(_))),
        "expected DeadlineExceeded, got {r:?}"
    );
    assert_eq!(c.expire_producers(100).await.unwrap().expired, 1);
    assert_eq!(list(&h, p, LATEST_TIMESTAMP).await.offset, 1);
}

// ---------------------------------------------------------------------------------------------
// Admin operations: producer-id blocks, CreatePartitions, config changes, DescribeProducers
// (issue #18)

/// Asserts that no two of `blocks` share an id, and that each has the size asked for.
pub fn assert_disjoint_blocks(blocks: &[(u32, ProducerIdBlock)]) {
    for (asked, b) in blocks {
        assert_eq!(b.count, *asked, "{b:?}");
        assert!(b.first >= 0, "{b:?}");
    }
    let mut sorted: Vec<ProducerIdBlock> = blocks.iter().map(|(_, b)| *b).collect();
    sorted.sort_by_key(|b| b.first);
    for pair in sorted.windows(2) {
        assert!(
            pair[0].last() < pair[1].first,
            "blocks overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// Producer-id blocks are never handed out twice, in ascending order, also to concurrent calls;
/// a block size of 0 or above [`MAX_PRODUCER_ID_BLOCK`] is invalid and takes nothing.
pub async fn producer_id_blocks_never_overlap(h: Harness) {
    let c = &h.coordinator;
    let mut blocks = Vec::new();
    let mut last = -1;
    for count in [1, 1000, 7, MAX_PRODUCER_ID_BLOCK, 1] {
        let b = c.allocate_producer_ids(count).await.unwrap();
        assert!(b.first > last, "ascending: {b:?} after {last}");
        last = b.last();
        blocks.push((count, b));
    }
    invalid(c.allocate_producer_ids(0).await);
    invalid(c.allocate_producer_ids(MAX_PRODUCER_ID_BLOCK + 1).await);
    let after_invalid = c.allocate_producer_ids(10).await.unwrap();
    assert!(after_invalid.first > last, "{after_invalid:?}");
    blocks.push((10, after_invalid));
    // Concurrent calls.
    let concurrent = futures::future::join_all(
        (1..=16u32).map(|i| async move { (i, c.allocate_producer_ids(i * 3).await.unwrap()) }),
    )
    .await;
    for (i, b) in concurrent {
        blocks.push((i * 3, b));
    }
    assert_disjoint_blocks(&blocks);
}

/// CreatePartitions adds empty partitions, under the topic's config, that take commits, fetches
/// and offset queries like the others; the existing partitions keep their data.
pub async fn create_partitions_grows_a_topic(h: Harness) {
    let c = &h.coordinator;
    let config = TopicConfig {
        retention_ms: 123_456,
        ..TopicConfig::default()
    };
    let t = topic_with(&h, "grows", 2, config.clone()).await;
    let other = topic(&h, 1).await;
    commit(
        &h,
        vec![
            plain(tp(t, 0), 3, 10, START_MS),
            plain(tp(t, 1), 2, 10, START_MS),
        ],
    )
    .await;
    rejected(
        &commit_one(&h, plain(tp(t, 2), 1, 10, START_MS)).await,
        ErrorCode::UnknownTopicOrPartition,
    );
    c.create_partitions(t, 5).await.unwrap();
    let topics = c.list_topics().await.unwrap();
    let grown = topics.iter().find(|i| i.topic_id == t).unwrap();
    assert_eq!((grown.partitions, &grown.config), (5, &config));
    let untouched = topics.iter().find(|i| i.topic_id == other).unwrap();
    assert_eq!(untouched.partitions, 1);
    for p in 2..5 {
        let (batches, lso, hwm) = all_batches(&h, tp(t, p)).await;
        assert!(batches.is_empty(), "partition {p}");
        assert_eq!((lso, hwm), (0, 0), "partition {p}");
        assert_eq!(list(&h, tp(t, p), LATEST_TIMESTAMP).await.offset, 0);
    }
    let (batches, _, hwm) = all_batches(&h, tp(t, 0)).await;
    assert_eq!(
        (batches.len(), hwm),
        (1, 3),
        "existing partitions keep their data"
    );
    let r = commit(
        &h,
        vec![
            plain(tp(t, 4), 2, 10, START_MS),
            plain(tp(t, 2), 1, 10, START_MS),
            plain(tp(t, 0), 1, 10, START_MS),
            plain(tp(t, 5), 1, 10, START_MS),
        ],
    )
    .await;
    ok_at(&r[0], 0);
    ok_at(&r[1], 0);
    ok_at(&r[2], 3);
    rejected(&r[3], ErrorCode::UnknownTopicOrPartition);
    let (batches, lso, hwm) = all_batches(&h, tp(t, 4)).await;
    assert_eq!((batches.len(), lso, hwm), (1, 0, 2));
    // Idempotent producers start afresh on a new partition.
    ok_at(&commit_one(&h, idem(tp(t, 3), 8, 0, 0, 1)).await, 0);
    assert!(producer(&h, tp(t, 3), 8).await.is_some());
    // Growing again, by one.
    c.create_partitions(t, 6).await.unwrap();
    ok_at(&commit_one(&h, plain(tp(t, 5), 1, 10, START_MS)).await, 0);
    // A deleted topic's partitions go with it, the new ones too.
    c.delete_topic(t).await.unwrap();
    rejected(
        &commit_one(&h, plain(tp(t, 5), 1, 10, START_MS)).await,
        ErrorCode::UnknownTopicOrPartition,
    );
}

/// A topic never shrinks: CreatePartitions to no more partitions than it has is
/// `INVALID_PARTITIONS` (37) and changes nothing; an unknown topic is `UnknownTopic`.
pub async fn create_partitions_only_grows(h: Harness) {
    let c = &h.coordinator;
    let t = topic(&h, 3).await;
    for new_total in [3, 2, 1, 0, -1, i32::MIN] {
        let r = c.create_partitions(t, new_total).await;
        match r {
            Err(e @ CoordinatorError::InvalidPartitions(_)) => {
                assert_eq!(e.error_code(), ErrorCode::InvalidPartitions);
                assert_eq!(e.error_code().code(), 37);
            }
            other => panic!("{new_total}: expected InvalidPartitions, got {other:?}"),
        }
    }
    let topics = c.list_topics().await.unwrap();
    assert_eq!(topics[0].partitions, 3);
    let unknown = c.create_partitions(fresh_id(), 10).await;
    assert!(
        matches!(unknown, Err(CoordinatorError::UnknownTopic(_))),
        "{unknown:?}"
    );
    assert_eq!(c.list_topics().await.unwrap().len(), 1);
}

/// A topic's `compression.type` and its three levels (issue #29) are kept on create, listed, and
/// replaced by `alter_topic_config`, every value of Kafka's set and the ends of each level's range;
/// a level out of Kafka's range is refused, changing nothing.
pub async fn compression_topic_config_is_kept(h: Harness) {
    let c = &h.coordinator;
    let config = TopicConfig::default()
        .with_compression_type(TopicCompression::Zstd)
        .with_compression_gzip_level(9)
        .with_compression_lz4_level(1)
        .with_compression_zstd_level(-131072);
    let t = topic_with(&h, "compressed", 1, config.clone()).await;
    assert_eq!(c.list_topics().await.unwrap()[0].config, config);
    for (value, gzip, lz4, zstd) in [
        (TopicCompression::Producer, -1, 17, 22),
        (TopicCompression::Uncompressed, 1, 9, 3),
        (TopicCompression::Gzip, 5, 2, 0),
        (TopicCompression::Snappy, -1, 9, -1),
        (TopicCompression::Lz4, 9, 17, 3),
        (TopicCompression::Zstd, -1, 9, 22),
    ] {
        let altered = config
            .clone()
            .with_compression_type(value)
            .with_compression_gzip_level(gzip)
            .with_compression_lz4_level(lz4)
            .with_compression_zstd_level(zstd);
        c.alter_topic_config(t, altered.clone()).await.unwrap();
        assert_eq!(c.list_topics().await.unwrap()[0].config, altered, "{value}");
    }
    let last = c.list_topics().await.unwrap()[0].config.clone();
    for bad in [
        TopicConfig::default().with_compression_gzip_level(0),
        TopicConfig::default().with_compression_gzip_level(10),
        TopicConfig::default().with_compression_lz4_level(0),
        TopicConfig::default().with_compression_lz4_level(18),
        TopicConfig::default().with_compression_zstd_level(23),
        TopicConfig::default().with_compression_zstd_level(-131073),
    ] {
        refused_on_alter_and_create(&h, t, bad).await;
    }
    assert_eq!(c.list_topics().await.unwrap()[0].config, last);
}

/// A topic's compaction settings (issue #29: `cleanup.policy`, `delete.retention.ms`,
/// `min`/`max.compaction.lag.ms`, `min.cleanable.dirty.ratio`) are kept on create, listed, and
/// replaced by `alter_topic_config`, with the ends of each range; a value out of Kafka's range, or
/// a minimum lag above the maximum, is refused, changing nothing.
pub async fn compaction_topic_config_is_kept(h: Harness) {
    let c = &h.coordinator;
    let config = TopicConfig::default()
        .with_cleanup_policy(CleanupPolicy::Compact)
        .with_delete_retention_ms(0)
        .with_min_compaction_lag_ms(1000)
        .with_max_compaction_lag_ms(i64::MAX)
        .with_min_cleanable_dirty_ratio(0.01);
    let t = topic_with(&h, "compacted", 1, config.clone()).await;
    assert_eq!(c.list_topics().await.unwrap()[0].config, config);
    for (policy, delete_retention, min_lag, max_lag, ratio) in [
        (CleanupPolicy::CompactDelete, i64::MAX, 0, 1, 0.0),
        (CleanupPolicy::Delete, 86_400_000, 5, 5, 1.0),
        (CleanupPolicy::Compact, 1, 0, 60_000, 0.123_456_789),
    ] {
        let altered = config
            .clone()
            .with_cleanup_policy(policy)
            .with_delete_retention_ms(delete_retention)
            .with_min_compaction_lag_ms(min_lag)
            .with_max_compaction_lag_ms(max_lag)
            .with_min_cleanable_dirty_ratio(ratio);
        c.alter_topic_config(t, altered.clone()).await.unwrap();
        assert_eq!(
            c.list_topics().await.unwrap()[0].config,
            altered,
            "{policy}"
        );
    }
    let last = c.list_topics().await.unwrap()[0].config.clone();
    for bad in [
        TopicConfig::default().with_delete_retention_ms(-1),
        TopicConfig::default().with_min_compaction_lag_ms(-1),
        TopicConfig::default().with_max_compaction_lag_ms(0),
        TopicConfig::default()
            .with_min_compaction_lag_ms(10)
            .with_max_compaction_lag_ms(9),
        TopicConfig::default().with_min_cleanable_dirty_ratio(1.01),
        TopicConfig::default().with_min_cleanable_dirty_ratio(-0.01),
        TopicConfig::default().with_min_cleanable_dirty_ratio(f64::NAN),
    ] {
        refused_on_alter_and_create(&h, t, bad).await;
    }
    assert_eq!(c.list_topics().await.unwrap()[0].config, last);
}

/// Retention deletes nothing from a topic whose `cleanup.policy` is `compact` alone, whatever
/// its retention.ms and retention.bytes (Kafka's `UnifiedLog.deleteOldSegments`), and deletes as
/// usual under `compact,delete`; a topic altered back to `delete` is retained again.
pub async fn retention_deletes_nothing_from_a_compact_only_topic(h: Harness) {
    let c = &h.coordinator;
    let compact = TopicConfig::default()
        .with_retention_ms(1000)
        .with_retention_bytes(0)
        .with_cleanup_policy(CleanupPolicy::Compact);
    let only = topic_with(&h, "compact-only", 1, compact.clone()).await;
    let both = topic_with(
        &h,
        "compact-delete",
        1,
        compact
            .clone()
            .with_cleanup_policy(CleanupPolicy::CompactDelete),
    )
    .await;
    let old = START_MS - 5000;
    commit(
        &h,
        vec![
            plain(tp(only, 0), 1, 10, old),
            plain(tp(only, 0), 1, 10, old),
            plain(tp(both, 0), 1, 10, old),
            plain(tp(both, 0), 1, 10, old),
        ],
    )
    .await;
    let report = retention_pass(&h).await;
    assert_eq!(
        report.batches_deleted, 2,
        "only compact,delete's two batches"
    );
    assert_eq!(all_batches(&h, tp(only, 0)).await.0.len(), 2);
    assert!(all_batches(&h, tp(both, 0)).await.0.is_empty());
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);
    c.alter_topic_config(only, compact.with_cleanup_policy(CleanupPolicy::Delete))
        .await
        .unwrap();
    assert_eq!(retention_pass(&h).await.batches_deleted, 2);
    assert!(all_batches(&h, tp(only, 0)).await.0.is_empty());
}

/// `bad` is refused (`InvalidRequest`) by `alter_topic_config` of topic `t` and by `create_topic`.
async fn refused_on_alter_and_create(h: &Harness, t: Uuid, bad: TopicConfig) {
    let c = &h.coordinator;
    invalid(c.alter_topic_config(t, bad.clone()).await);
    invalid(
        c.create_topic(CreateTopicRequest {
            topic_id: fresh_id(),
            name: "x".into(),
            partitions: 1,
            config: bad,
        })
        .await,
    );
}

/// A config change applies to later calls: `list_topics` shows it, later commits use the new
/// timestamp type (committed batches keep theirs), retention passes and producer expiry the new
/// limits. Invalid values are refused and change nothing; other topics are untouched.
pub async fn alter_topic_config_applies_to_later_calls(h: Harness) {
    let c = &h.coordinator;
    let t = topic_with(&h, "altered", 2, TopicConfig::default()).await;
    let other = topic_with(&h, "other", 1, TopicConfig::default()).await;
    let p = tp(t, 0);
    let old = START_MS - 5_000;
    let r = commit_one(&h, plain(p, 1, 10, old)).await;
    assert_eq!(r.log_append_time, NO_TIMESTAMP);
    ok_at(&commit_one(&h, idem(tp(t, 1), 4, 0, 0, 1)).await, 0);
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);

    let config = TopicConfig {
        timestamp_type: TimestampType::LogAppendTime,
        retention_ms: 1_000,
        retention_bytes: 1_000_000,
        max_message_bytes: 2_000,
        message_timestamp_before_max_ms: 10,
        message_timestamp_after_max_ms: 20,
        producer_id_expiration_ms: 2_000,
        // The tiered-storage fields are altered by `tiered_topic_config_is_kept`.
        ..TopicConfig::default()
    };
    c.alter_topic_config(t, config.clone()).await.unwrap();
    let topics = c.list_topics().await.unwrap();
    let altered = topics.iter().find(|i| i.topic_id == t).unwrap();
    assert_eq!((&altered.config, altered.partitions), (&config, 2));
    let untouched = topics.iter().find(|i| i.topic_id == other).unwrap();
    assert_eq!(untouched.config, TopicConfig::default());

    // The next commit is LogAppendTime; the earlier batch stays CreateTime.
    let r = commit_one(&h, plain(p, 1, 10, old)).await;
    ok_at(&r, 1);
    assert_eq!(r.log_append_time, START_MS);
    let (batches, ..) = all_batches(&h, p).await;
    assert_eq!(
        batches.iter().map(|b| b.timestamp_type).collect::<Vec<_>>(),
        vec![TimestampType::CreateTime, TimestampType::LogAppendTime]
    );
    // Retention by the new retention.ms: the old CreateTime batch goes, the LogAppendTime one
    // (aged by its commit time) stays.
    let report = retention_pass(&h).await;
    assert_eq!((report.batches_deleted, report.bytes_deleted), (1, 10));
    let (batches, lso, _) = all_batches(&h, p).await;
    assert_eq!((batches.len(), lso), (1, 1));
    // Producer expiry by the new producer.id.expiration.ms: `alter_topic_config_changes_producer_expiry`
    // (a clock-sensitive case: expiry's floor is twice the default max_commit_age).

    // Invalid values and unknown topics change nothing.
    invalid(
        c.alter_topic_config(
            t,
            TopicConfig {
                retention_ms: -2,
                ..config.clone()
            },
        )
        .await,
    );
    invalid(
        c.alter_topic_config(
            t,
            TopicConfig {
                producer_id_expiration_ms: 0,
                ..config.clone()
            },
        )
        .await,
    );
    let r = c
        .alter_topic_config(fresh_id(), TopicConfig::default())
        .await;
    assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");
    let topics = c.list_topics().await.unwrap();
    let altered = topics.iter().find(|i| i.topic_id == t).unwrap();
    assert_eq!(altered.config, config);
    // Back to the defaults: retention.ms 7 days keeps the young batch.
    c.alter_topic_config(t, TopicConfig::default())
        .await
        .unwrap();
    h.clock.advance(10_000);
    assert_eq!(retention_pass(&h).await.batches_deleted, 0);
}

/// DescribeProducers: every idempotent producer's state in a partition, by producer id, as
/// `producer_state` answers each; an unknown partition is `UnknownTopic`.
pub async fn list_producers_of_a_partition(h: Harness) {
    let c = &h.coordinator;
    let t = topic(&h, 2).await;
    let p = tp(t, 0);
    assert!(c.list_producers(p).await.unwrap().is_empty());
    commit(
        &h,
        vec![
            idem(p, 9, 0, 0, 1),
            plain(p, 1, 10, START_MS),
            idem(p, 3, 2, 0, 2),
            idem(p, 5, 0, 0, 1),
            idem(p, 9, 0, 1, 1),
            idem(tp(t, 1), 7, 0, 0, 1),
        ],
    )
    .await;
    let listed = c.list_producers(p).await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.producer_id).collect::<Vec<_>>(),
        vec![3, 5, 9]
    );
    for state in &listed {
        assert_eq!(
            Some(state),
            producer(&h, p, state.producer_id).await.as_ref()
        );
    }
    assert_eq!(listed[2].batches.len(), 2);
    assert_eq!(listed[0].producer_epoch, 2);
    let other = c.list_producers(tp(t, 1)).await.unwrap();
    assert_eq!(
        other.iter().map(|s| s.producer_id).collect::<Vec<_>>(),
        vec![7]
    );
    for unknown in [tp(t, 2), tp(t, -1), tp(fresh_id(), 0)] {
        let r = c.list_producers(unknown).await;
        assert!(matches!(r, Err(CoordinatorError::UnknownTopic(_))), "{r:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case declares exactly the capabilities of the operations it calls (run on the model
    /// through a [`crate::coordinator::CapabilityRecorder`]), so a smaller coordinator skips
    /// exactly the cases it cannot serve.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_case_declares_the_capabilities_it_uses() {
        use crate::coordinator::{CapabilityRecorder, InMemoryCoordinator};
        use diskless_coordinator::Layered;
        let mut wrong = Vec::new();
        for name in CASES {
            let clock = ManualClock::new(START_MS);
            let model = Arc::new(InMemoryCoordinator::new(clock.clone()));
            let recorded = Arc::new(Layered::new(model, CapabilityRecorder::default()));
            let case = case_named(name).expect("every listed case has a function");
            case(Harness {
                coordinator: recorded.clone(),
                clock,
            })
            .await;
            let (used, declared) = (recorded.used(), case_capabilities(name));
            if used != declared {
                wrong.push(format!("{name}: uses {used:?}, declares {declared:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The case list names every case of this file once, so that a new case cannot be left out of
    /// [`run_all`] and the macro's tests.
    #[test]
    fn the_case_list_names_every_case() {
        let sources = [
            include_str!("conformance.rs"),
            include_str!("conformance/txn.rs"),
            include_str!("conformance/tiered.rs"),
        ]
        .concat();
        crate::fixture::assert_lists_every_case(CASES, &sources, &["(h: Harness) {"]);
        for tagged in CLOCK_SENSITIVE_CASES
            .iter()
            .chain(MANUAL_CLOCK_CASES)
            .chain(TXN_CASES)
            .chain(TIERED_CASES)
        {
            assert!(CASES.contains(tagged), "{tagged}");
        }
        assert!(!CLOCK_SENSITIVE_CASES.is_empty() && !MANUAL_CLOCK_CASES.is_empty());
        assert!(!TXN_CASES.is_empty() && !TIERED_CASES.is_empty());
    }
}
