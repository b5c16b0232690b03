//! [`TieringWorker`]: consolidates each partition's oldest WAL batches into tiered segments
//! (issue #15, KIP-1163 "Moving to Tiered Storage"; docs/tiered-consolidation.md §2.8).
//!
//! Per due partition: [`BatchCoordinator::segment_plan`] → a fresh UUID v7 key → the segment is
//! built while its WAL batches are read, window by window, and streamed to
//! [`RemoteStorage::copy_segment`] → [`BatchCoordinator::register_segment`], which in one
//! coordinator transaction registers the segment and deletes the batches it covers.

use super::{LifecycleError, Worker, millis, record_pass};
use crate::ConfigError;
use crate::control::{MarkerBatch, end_txn_marker};
use crate::fetcher::Fetcher;
use crate::tiered::format::parse_producer_snapshot;
use crate::tiered::{
    AbortedTxnEntry, BuiltSegment, FinishInputs, ProducerSnapshotEntry, PushOutcome,
    TIERED_LEADER_EPOCH, TieredBuildError, TieredSegmentBuilder, TieredSegmentConfig,
};
use bytes::Bytes;
use diskless_cache::BlockKey;
use diskless_coordinator::{
    BatchCoordinate, BatchCoordinator, Clock, CoordinatorError, RegisterSegmentOutcome,
    RegisterSegmentRequest, SegmentPlan, SegmentPlanRequest, TieredSegment, TieringCandidate,
    TopicIdPartition,
};
use diskless_storage::{
    KeySource, MAX_PART_SIZE, ObjectKey, RemoteStorage, Section, SegmentData, SegmentLayout,
    SegmentTail, StorageError, validate_prefix,
};
use futures::channel::{mpsc, oneshot};
use futures::{FutureExt, SinkExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;

/// Settings of a [`TieringWorker`]: [`Default`], then the `with_*` methods. Checked by
/// [`TieringWorker::new`] ([`TieringConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TieringConfig {
    /// The key prefix of segment objects (a valid key prefix, [`validate_prefix`]; not the WAL
    /// writers' prefix). Run an [`OrphanCollector`](super::OrphanCollector) with the same prefix
    /// (in a [`Lifecycle`](super::Lifecycle), a second [`orphans`](super::Lifecycle::orphans)
    /// beside the writers'): it collects the segments whose upload no registration followed.
    /// Default `tiered`.
    pub prefix: String,
    /// Batches committed less than this long ago stay in the WAL tier (tail readers keep reading
    /// the writer-warmed WAL blocks). Default 2 minutes.
    pub min_age: Duration,
    /// Segments registered per pass at most (the pass stops before the next candidate). At
    /// least 1. Default 16.
    pub max_segments_per_pass: u32,
    /// `.log` bytes tiered per pass, after which the pass stops before the next candidate (a
    /// segment is never cut: one pass may pass it by one segment). At least 1. Default 1 GiB.
    pub max_bytes_per_pass: u64,
    /// Segments registered per partition per pass at most: a partition still due after a
    /// segment gets another in the same pass (Kafka's `RemoteLogManager` copies every eligible
    /// segment of a partition per run) until this cap, so that one partition's backlog does not
    /// take a whole pass while others wait for the next cycle of the cursor. 1 makes one segment
    /// per partition per pass. At least 1. Default 4.
    pub max_segments_per_partition: u32,
    /// Candidates asked of the coordinator at once ([`BatchCoordinator::tiering_candidates`]'s
    /// `limit`). At least 1. Default 64.
    pub candidate_page: u32,
    /// The most batches of one segment (the plan's coordinates are held for the build: this
    /// bounds their memory; Kafka rolls by bytes and index capacity only, which the builder
    /// applies too). At least 1. Default 100 000.
    pub max_batches_per_segment: u32,
    /// The parts the segment's `.log` is uploaded in ([`SegmentData::part_size`]): with
    /// `read_window`, what a build holds in memory. At least 1 (stores raise it to their
    /// minimum part, 5 MiB on S3). Default 8 MiB.
    pub part_size: usize,
    /// Segments up to about this size go up in ONE create-only PUT instead of a multipart upload
    /// (create, parts, complete: 3 PUTs at least — `docs/tiered-consolidation.md` §2.8): a
    /// segment whose plan (the sum of its WAL batches' sizes) is at most half of it is uploaded
    /// with a part size of `inline_upload_max`, so that its `.log` and its index/snapshot tail
    /// (smaller than the `.log` in practice; a larger one only makes the upload multipart, in
    /// parts of `inline_upload_max`) fit one part. The cost is memory: such a build holds its
    /// whole object until the PUT, so a build holds at most `read_window` +
    /// max(`part_size`, `inline_upload_max`) (plus a few chunks in flight). 0 turns it off (every
    /// segment larger than `part_size` is multipart); at most
    /// [`MAX_PART_SIZE`](diskless_storage::MAX_PART_SIZE). Default 32 MiB.
    pub inline_upload_max: usize,
    /// WAL batch bytes read at once while a segment is built (one
    /// `Fetcher`-path read of their objects, through the cache): the other half of a build's
    /// memory. At least 1 (a batch larger than it is read alone). Default 8 MiB.
    pub read_window: u64,
    /// Partitions consolidated at once within a pass: up to this many builds (each reading its
    /// WAL batches and uploading its segment) overlap, so a pass over many due partitions waits
    /// for storage latency once per this many segments, not once per segment. Each build holds
    /// its own memory (see `read_window` and `inline_upload_max`), so a pass holds up to this many
    /// times a build's. The caps still apply before each partition and segment, counting the
    /// builds in flight only once they finish: a pass may register up to
    /// `max_concurrent_builds - 1` segments beyond `max_segments_per_pass`. The cursor moves past
    /// partitions in order, so a pass that fails or is dropped resumes at the first partition
    /// not handled. At least 1. Default 1 (one build at a time).
    pub max_concurrent_builds: u32,
}

impl Default for TieringConfig {
    fn default() -> Self {
        TieringConfig {
            prefix: "tiered".to_string(),
            min_age: Duration::from_secs(120),
            max_segments_per_pass: 16,
            max_bytes_per_pass: 1 << 30,
            max_segments_per_partition: 4,
            candidate_page: 64,
            max_batches_per_segment: 100_000,
            part_size: SegmentData::DEFAULT_PART_SIZE,
            inline_upload_max: DEFAULT_INLINE_UPLOAD_MAX,
            read_window: 8 << 20,
            max_concurrent_builds: 1,
        }
    }
}

diskless_common::with_setters!(TieringConfig {
    with_prefix => prefix: into [String],
    with_min_age => min_age: [Duration],
    with_max_segments_per_pass => max_segments_per_pass: [u32],
    with_max_bytes_per_pass => max_bytes_per_pass: [u64],
    with_max_segments_per_partition => max_segments_per_partition: [u32],
    with_candidate_page => candidate_page: [u32],
    with_max_batches_per_segment => max_batches_per_segment: [u32],
    with_part_size => part_size: [usize],
    with_inline_upload_max => inline_upload_max: [usize],
    with_read_window => read_window: [u64],
    with_max_concurrent_builds => max_concurrent_builds: [u32],
});

impl TieringConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`] naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_prefix(&self.prefix).map_err(|e| ConfigError::invalid("prefix", e.to_string()))?;
        let at_least_one = [
            ("max_segments_per_pass", self.max_segments_per_pass == 0),
            ("max_bytes_per_pass", self.max_bytes_per_pass == 0),
            (
                "max_segments_per_partition",
                self.max_segments_per_partition == 0,
            ),
            ("candidate_page", self.candidate_page == 0),
            ("max_batches_per_segment", self.max_batches_per_segment == 0),
            ("part_size", self.part_size == 0),
            ("read_window", self.read_window == 0),
            ("max_concurrent_builds", self.max_concurrent_builds == 0),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, zero)| *zero) {
            return Err(ConfigError::invalid(field, "must be at least 1"));
        }
        if !u64::try_from(self.inline_upload_max).is_ok_and(|m| m <= MAX_PART_SIZE) {
            return Err(ConfigError::invalid(
                "inline_upload_max",
                format!("must be at most {MAX_PART_SIZE} (the largest single PUT)"),
            ));
        }
        Ok(())
    }

    /// The part size to upload a segment of `plan_bytes` (the sum of its plan's batch sizes)
    /// with: `inline_upload_max` when the plan is at most half of it (one create-only PUT),
    /// else `part_size`.
    pub fn upload_part_size(&self, plan_bytes: u64) -> usize {
        let inline = self.inline_upload_max as u64 / 2;
        if self.inline_upload_max > self.part_size && plan_bytes <= inline {
            self.inline_upload_max
        } else {
            self.part_size
        }
    }
}

/// The default [`TieringConfig::inline_upload_max`]: 32 MiB.
const DEFAULT_INLINE_UPLOAD_MAX: usize = 32 << 20;

/// What one tiering pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TieringPassReport {
    /// Due partitions the pass looked at.
    pub candidates: u64,
    /// Segments registered (a retry that found its segment registered counts).
    pub segments: u64,
    /// Their `.log` bytes.
    pub bytes: u64,
    /// The WAL batches they took (transaction markers included).
    pub batches_tiered: u64,
    /// Segments the coordinator refused as stale (retention, DeleteRecords or another segment took
    /// some of the range) or for a partition gone: discarded.
    pub stale: u64,
    /// Segments that failed (a WAL read, a build, the upload, the registration): discarded.
    pub failed: u64,
    /// Keys of discarded segments that the coordinator fenced and storage deleted.
    pub fenced_and_deleted: u64,
    /// Keys of discarded segments left to the orphan collector (the fence or the delete failed).
    pub left_for_collector: u64,
    /// The pass stopped at its caps (`max_segments_per_pass`, `max_bytes_per_pass`, or a
    /// partition at `max_segments_per_partition`): due partitions may be left for the next pass.
    pub more: bool,
}

/// Consolidates WAL batches into tiered segments (KIP-1163), a bounded amount per pass.
///
/// # A pass
///
/// Due partitions come from [`BatchCoordinator::tiering_candidates`] in pages of
/// `candidate_page`, from a cursor kept between passes (the last partition handled), so that
/// every due partition is reached whatever the caps; a page shorter than asked ends the cycle and
/// the next pass starts from the first partition. Per candidate, segments one after the other
/// while the partition is still due (below), each:
///
/// 1. [`BatchCoordinator::segment_plan`]: the partition's first WAL batches committed before
///    `now − min_age`, up to `segment.bytes` and `max_batches_per_segment`;
/// 2. the previous segment's producer `.snapshot` is read through the [`RemoteStorage`] (Kafka
///    carries producer state over from segment to segment);
/// 3. a fresh UUID v7 key under `prefix` per attempt;
/// 4. the WAL batches are read in windows of `read_window` bytes (through the [`Fetcher`]'s
///    cache and storage), pushed into a [`TieredSegmentBuilder`] (which applies Kafka's roll
///    rules: the segment may end before the plan does), and the `.log` built so far is streamed
///    to [`RemoteStorage::copy_segment`] in parts of `part_size` — memory is about a window and a
///    part, never the segment; a segment whose plan is at most `inline_upload_max / 2` goes up in
///    one create-only PUT (one part of `inline_upload_max`), so a build holds at most
///    `read_window + max(part_size, inline_upload_max)`;
/// 5. [`BatchCoordinator::register_segment`] (retried once after an unknown outcome);
/// 6. with a cache in the [`Fetcher`] (and the segments stored as objects of the fetcher's
///    storage, as [`ObjectRemoteStorage`](diskless_storage::ObjectRemoteStorage) over it stores
///    them: the fetcher reads them there), the blocks holding the new segment's sections after its
///    `.log` (`.index`, `.timeindex`, `.txnindex`, the producer snapshot: what a reader looks up
///    first) are put into it, cut as the fetcher cuts them, so that a reader's first index lookup
///    costs no GET (the worker keeps the `.log`'s bytes since its last block boundary for that: at
///    most one cache block more; nothing without a cache).
///
/// After a registered segment, the worker asks the coordinator again whether the partition is
/// still due (one `tiering_candidates` call of limit 1 from the cursor before it: the same rule,
/// `segment.bytes` of WAL bytes or a first WAL batch `segment.ms` old, at the pass's time) and if
/// so builds its next segment, as Kafka's `RemoteLogManager` copies every rolled segment of a
/// partition in one run: a backlog of full segments is tiered in one pass, the partial segment
/// behind them only once it is due itself (as Kafka copies the active segment only once it
/// rolled). `max_segments_per_partition` bounds that, for fairness: the cursor then moves past
/// the partition, whose rest waits for the next cycle while the pass serves the partitions after
/// it. The pass caps (`max_segments_per_pass`, `max_bytes_per_pass`) bound the pass as a whole.
/// A partition whose segment failed or was discarded gets no second attempt in the same pass.
///
/// Partitions are handled one at a time by default; `max_concurrent_builds` lets that many of a
/// page's partitions be consolidated at once (each still one segment after the other), started
/// in page order while the caps allow, the cursor moving past them in that order. The builds
/// share nothing but the coordinator and storage, and each follows the steps above on its own
/// key, so the safety argument below holds per build.
///
/// `Registered` and `AlreadyRegistered` are done. A stale or refused registration
/// (`Stale`, `UnknownPartition`, `DeadlineExceeded`, `ObjectFenced`), a failed build or upload,
/// or an outcome still unknown after the retry, discards the key: the worker calls
/// [`BatchCoordinator::fence_orphans`] with it and deletes it from storage **only if that call
/// returned it**. If the fence or the delete fails, the key is left to the orphan collector.
///
/// # Crash safety
///
/// The worker never deletes a key the fence did not return, so it never deletes a registered
/// segment, and a registration still in flight after the fence is refused (`ObjectFenced`): a
/// segment is registered on bytes that exist, or not at all. The registration moves the batches
/// from the WAL tier to the segment in one coordinator transaction, so a batch is never in both
/// tiers nor in neither. Wherever the process dies, what is left is at worst an unregistered
/// segment object (collected by an [`OrphanCollector`](super::OrphanCollector) on `prefix`) or a
/// fenced one (the same collector deletes it); WAL objects whose last batch was tiered are marked
/// by the coordinator and deleted by the [`ObjectCleaner`](super::ObjectCleaner) after its grace
/// period (readers holding old coordinates finish first).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use diskless_core::Fetcher;
/// use diskless_core::lifecycle::{TieringConfig, TieringWorker};
/// use diskless_coordinator::{BatchCoordinator, ManualClock};
/// use diskless_storage::{ObjectRemoteStorage, ObjectStorage, ObjectStoreStorage, SeededKeys};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// use std::sync::Arc;
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let coordinator: Arc<dyn BatchCoordinator> = Arc::new(InMemoryCoordinator::new(clock.clone()));
/// let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
/// let fetcher = Fetcher::builder(storage.clone(), coordinator.clone()).build().unwrap();
/// let worker = TieringWorker::new(
///     coordinator,
///     Arc::new(ObjectRemoteStorage::new(storage)),
///     fetcher,
///     clock,
///     Arc::new(SeededKeys::new(7)),
///     1,
///     TieringConfig::default(),
/// )
/// .unwrap();
/// assert_eq!(worker.run_pass().await.unwrap().segments, 0);
/// # });
/// ```
#[derive(Debug)]
pub struct TieringWorker {
    coordinator: Arc<dyn BatchCoordinator>,
    remote: Arc<dyn RemoteStorage>,
    fetcher: Fetcher,
    clock: Arc<dyn Clock>,
    keys: Arc<dyn KeySource>,
    broker_id: i32,
    config: TieringConfig,
    /// Held for the whole pass, so passes never overlap.
    state: tokio::sync::Mutex<State>,
}

/// The report of a pass in progress, shared by the partitions it handles at once (locked only
/// between awaits).
type Progress = parking_lot::Mutex<TieringPassReport>;

/// What the worker remembers between passes.
#[derive(Debug, Default)]
struct State {
    /// The last candidate handled; the next page starts after it.
    cursor: Option<TopicIdPartition>,
}

/// Why a segment could not be built and uploaded (the key is then discarded).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("reading WAL batch at offset {offset}: {reason}")]
    Read { offset: i64, reason: String },
    #[error(transparent)]
    Build(#[from] TieredBuildError),
    #[error("upload: {0}")]
    Upload(#[from] StorageError),
    #[error("the upload ended before the segment's .log")]
    UploadEnded,
}

/// The chunks queued between the builder and the upload (a chunk is a batch header or a batch
/// body). Few: the builder reads its next window only once the upload took all but these of the
/// last one, so a build holds about a window, a part and this remnant (see
/// `tests/tiering_memory.rs`).
const CHUNKS_IN_FLIGHT: usize = 8;

impl TieringWorker {
    /// A worker, or the first setting of `config` out of range.
    ///
    /// - `coordinator`: where candidates, plans and registrations go (a `ShardedCoordinator`
    ///   consolidates every shard's partitions, each registered on its own shard);
    /// - `remote`: where segments are stored (an
    ///   [`ObjectRemoteStorage`](diskless_storage::ObjectRemoteStorage) over the WAL storage, by
    ///   default);
    /// - `fetcher`: reads the WAL batches (its storage and cache, its read settings);
    /// - `clock`, `keys`: the time and UUIDs of segment keys (UUID v7 at the clock's time: the
    ///   coordinators' commit deadline and the orphan collector read it);
    /// - `broker_id`: recorded as the segments' uploader.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        remote: Arc<dyn RemoteStorage>,
        fetcher: Fetcher,
        clock: Arc<dyn Clock>,
        keys: Arc<dyn KeySource>,
        broker_id: i32,
        config: TieringConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(TieringWorker {
            coordinator,
            remote,
            fetcher,
            clock,
            keys,
            broker_id,
            config,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    /// The settings.
    pub fn config(&self) -> &TieringConfig {
        &self.config
    }

    /// One pass (see the type's docs). Records
    /// [`LIFECYCLE_PASSES`](diskless_common::metrics::LIFECYCLE_PASSES) and
    /// [`LIFECYCLE_ITEMS`](diskless_common::metrics::LIFECYCLE_ITEMS) (the segments registered,
    /// also by a pass that failed after some) once, with `worker="tiering"`, in a
    /// `lifecycle_pass` span. `Err` when a coordinator read fails (candidates, a plan): what the
    /// pass did stays done, and the next pass resumes at the partition that failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped at any await point, the pass leaves at worst an uploaded segment
    /// that is not registered (an orphan for the collector on `prefix`), or a registration in
    /// flight, which applies or not as the coordinator's transaction decides (if not, the key is
    /// an orphan; if so, a registered segment). Nothing is lost and nothing is in two tiers. The
    /// cursor moves past a partition only once it was handled. A cancelled pass records no metric.
    #[tracing::instrument(level = "info", name = "lifecycle_pass", skip_all, fields(worker = Worker::Tiering.name()))]
    pub async fn run_pass(&self) -> Result<TieringPassReport, LifecycleError> {
        let progress = Progress::default();
        let result = self.pass(&progress).await;
        let report = progress.into_inner();
        record_pass(Worker::Tiering, &result, report.segments);
        if report.candidates > 0 {
            tracing::info!(
                candidates = report.candidates,
                segments = report.segments,
                bytes = report.bytes,
                stale = report.stale,
                failed = report.failed,
                more = report.more,
                "tiering pass"
            );
        }
        result.map(|()| report)
    }

    fn caps_reached(&self, progress: &Progress) -> bool {
        let report = progress.lock();
        report.segments >= u64::from(self.config.max_segments_per_pass)
            || report.bytes >= self.config.max_bytes_per_pass
    }

    async fn pass(&self, progress: &Progress) -> Result<(), LifecycleError> {
        let mut state = self.state.lock().await;
        let now = self.clock.now_ms();
        let min_age = millis(self.config.min_age);
        let concurrent = usize::try_from(self.config.max_concurrent_builds)
            .unwrap_or(usize::MAX)
            .max(1);
        loop {
            let page = self
                .coordinator
                .tiering_candidates(now, min_age, state.cursor, self.config.candidate_page)
                .await?;
            let last_page = page.len() < self.config.candidate_page as usize;
            let listed = page.len();
            // Each candidate with the partition handled before it (the cursor for the first):
            // where the coordinator is asked whether the partition is still due.
            let mut after = state.cursor;
            let work: Vec<_> = page
                .into_iter()
                .map(|candidate| {
                    let before = after;
                    after = Some(candidate.partition);
                    (candidate, before)
                })
                .collect();
            // In page order, up to `concurrent` partitions at once; the caps are looked at before
            // each partition is started, and the cursor moves past partitions in order.
            let mut handled = futures::stream::iter(work)
                .take_while(|_| std::future::ready(!self.caps_reached(progress)))
                .map(|(candidate, before)| async move {
                    progress.lock().candidates += 1;
                    let partition = candidate.partition;
                    self.tier_partition(candidate, before, now, progress)
                        .await
                        .map(|()| partition)
                })
                .buffered(concurrent);
            let mut done = 0;
            while let Some(partition) = handled.next().await {
                state.cursor = Some(partition?);
                done += 1;
            }
            if done < listed {
                // Stopped at the caps.
                progress.lock().more = true;
                return Ok(());
            }
            if last_page {
                // The end of the due partitions: the next pass starts from the first.
                state.cursor = None;
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
    }

    /// The segments of one due partition: one, then more while the coordinator still lists it as
    /// due after the cursor `after` (the partition handled before it) and the caps allow.
    async fn tier_partition(
        &self,
        mut candidate: TieringCandidate,
        after: Option<TopicIdPartition>,
        now: i64,
        progress: &Progress,
    ) -> Result<(), LifecycleError> {
        let partition = candidate.partition;
        let mut registered = 0u32;
        loop {
            if !self.tier(&candidate, now, progress).await? {
                return Ok(());
            }
            registered += 1;
            if registered >= self.config.max_segments_per_partition || self.caps_reached(progress) {
                // The partition may still be due: the next cycle of the cursor reaches it again.
                progress.lock().more = true;
                return Ok(());
            }
            let next = self
                .coordinator
                .tiering_candidates(now, millis(self.config.min_age), after, 1)
                .await?;
            match next.into_iter().next() {
                Some(next) if next.partition == partition => candidate = next,
                _ => return Ok(()),
            }
        }
    }

    /// One segment of one candidate: plan, build and upload, register, or discard the key.
    /// `Ok(true)` when a segment was registered. `Err` only for a failed plan (a coordinator
    /// read).
    async fn tier(
        &self,
        candidate: &TieringCandidate,
        now: i64,
        progress: &Progress,
    ) -> Result<bool, LifecycleError> {
        let partition = candidate.partition;
        let config = &candidate.config;
        let plan = self
            .coordinator
            .segment_plan(&SegmentPlanRequest {
                partition,
                max_bytes: u64::try_from(config.segment_bytes).unwrap_or(0),
                max_batches: self.config.max_batches_per_segment,
                committed_before_ms: now.saturating_sub(millis(self.config.min_age)),
            })
            .await?;
        if !plan.error.is_ok() || plan.batches.is_empty() {
            return Ok(false);
        }
        let previous = match self.previous_snapshot(plan.previous.as_ref()).await {
            Ok(previous) => previous,
            Err(e) => {
                tracing::warn!(%partition, error = %e, "reading the previous segment's producer snapshot failed; retrying next pass");
                progress.lock().failed += 1;
                return Ok(false);
            }
        };
        let first_tiered_base = match &plan.previous {
            None => None,
            Some(_) => self
                .coordinator
                .list_tiered_segments(partition, 0, 1)
                .await?
                .first()
                .map(|s| s.base_offset),
        };
        let inputs = FinishInputs {
            aborted: plan
                .aborted
                .iter()
                .map(|a| AbortedTxnEntry {
                    producer_id: a.producer_id,
                    first_offset: a.first_offset,
                    last_offset: a.last_offset,
                    // Not kept by the coordinator: the builder computes Kafka's value.
                    last_stable_offset: -1,
                })
                .collect(),
            producer_id_expiration_ms: Some(config.producer_id_expiration_ms),
            log_start_offset: plan.log_start_offset,
            first_tiered_base,
        };
        let segment_config = TieredSegmentConfig {
            segment_bytes: config.segment_bytes,
            index_interval_bytes: config.index_interval_bytes,
            segment_index_bytes: config.segment_index_bytes,
        };
        let key =
            ObjectKey::generate(&self.config.prefix, self.keys.as_ref(), self.clock.as_ref())?;
        let (built, layout, log_tail) = match self
            .build_and_upload(&key, partition, &plan, segment_config, &previous, inputs)
            .await
        {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(%partition, object = %key, error = %e, "building or uploading a tiered segment failed; discarding it");
                progress.lock().failed += 1;
                self.discard(&key, progress).await;
                return Ok(false);
            }
        };
        let request = RegisterSegmentRequest {
            partition,
            object_key: key.to_string(),
            object_size: layout.object_size(),
            uploader_broker_id: self.broker_id,
            layout,
            base_offset: built.base_offset,
            end_offset: built.end_offset,
            batch_count: built.batch_count,
            batch_bytes: layout.log,
            max_timestamp: built.max_timestamp,
            max_timestamp_offset: built.max_timestamp_offset,
            // A `ShardedCoordinator` sets it to the partition's shard.
            owner: 0,
        };
        let mut outcome = self.coordinator.register_segment(request.clone()).await;
        if let Err(CoordinatorError::OutcomeUnknown(e)) = &outcome {
            tracing::info!(%partition, object = %key, error = %e, "registration outcome unknown; retrying once");
            outcome = self.coordinator.register_segment(request).await;
        }
        match outcome {
            Ok(RegisterSegmentOutcome::Registered { .. })
            | Ok(RegisterSegmentOutcome::AlreadyRegistered) => {
                {
                    let mut report = progress.lock();
                    report.segments += 1;
                    report.bytes += layout.log;
                    report.batches_tiered += u64::from(built.batch_count);
                }
                tracing::debug!(%partition, object = %key, base = built.base_offset, end = built.end_offset, bytes = layout.log, "tiered segment registered");
                if let Some(log_tail) = log_tail {
                    self.warm_cache(&key, &layout, log_tail, built.tail).await;
                }
                Ok(true)
            }
            Ok(RegisterSegmentOutcome::Stale) | Ok(RegisterSegmentOutcome::UnknownPartition) => {
                tracing::info!(%partition, object = %key, "tiered segment stale; discarding it");
                progress.lock().stale += 1;
                self.discard(&key, progress).await;
                Ok(false)
            }
            Err(e) => {
                tracing::warn!(%partition, object = %key, error = %e, "registering a tiered segment failed; discarding it");
                progress.lock().failed += 1;
                self.discard(&key, progress).await;
                Ok(false)
            }
        }
    }

    /// Puts the blocks of the registered segment `key` from the one holding the end of its
    /// `.log` to its end into the fetcher's cache, cut as the fetcher cuts them (blocks of its
    /// `cache_block_size` over the object's byte space, the last one ending with the object).
    /// `log_tail` holds the `.log`'s bytes since that block's start; when it does not (it always
    /// should), nothing is cached: a wrong block would be served to readers.
    async fn warm_cache(
        &self,
        key: &ObjectKey,
        layout: &SegmentLayout,
        log_tail: LogTail,
        tail: SegmentTail,
    ) {
        let Some(cache) = self.fetcher.cache() else {
            return;
        };
        let block_size = self.fetcher.config().cache_block_size;
        let first = layout.log / block_size;
        let size = layout.object_size();
        if log_tail.block_size != block_size
            || log_tail.len != layout.log
            || log_tail.held() != layout.log - first * block_size
        {
            tracing::warn!(object = %key, "the kept end of the .log does not match the segment; its index blocks are not cached");
            return;
        }
        let object: Arc<str> = Arc::from(key.as_str());
        let mut chunks = log_tail.chunks.into_iter().chain(tail.into_chunks());
        let mut pending: Option<Bytes> = None;
        let mut index = first;
        while index.saturating_mul(block_size) < size {
            let end = index.saturating_add(1).saturating_mul(block_size).min(size);
            let want = usize::try_from(end - index * block_size).unwrap_or(usize::MAX);
            let mut block = Vec::with_capacity(want);
            while block.len() < want {
                let Some(mut chunk) = pending.take().or_else(|| chunks.next()) else {
                    tracing::warn!(object = %key, "the segment's sections end before its layout; its index blocks are not cached");
                    return;
                };
                let take = chunk.len().min(want - block.len());
                block.extend_from_slice(&chunk.split_to(take));
                if !chunk.is_empty() {
                    pending = Some(chunk);
                }
            }
            cache
                .insert(
                    BlockKey::new(object.clone(), block_size, index),
                    Bytes::from(block),
                )
                .await;
            index += 1;
        }
    }

    /// The previous segment's producer state (empty without one, or when it is gone or
    /// unreadable as a snapshot: the state then restarts from this segment's batches, as after
    /// retention). A failed read is an error: the segment waits rather than lose producers.
    async fn previous_snapshot(
        &self,
        previous: Option<&TieredSegment>,
    ) -> Result<Vec<ProducerSnapshotEntry>, StorageError> {
        let Some(previous) = previous else {
            return Ok(Vec::new());
        };
        let layout = previous.layout;
        if layout.producer_snapshot == 0 {
            return Ok(Vec::new());
        }
        let key = ObjectKey::parse(&previous.object_key)?;
        let bytes = match self
            .remote
            .fetch(&key, &layout, layout.range(Section::ProducerSnapshot))
            .await
        {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => {
                tracing::info!(object = %key, "previous tiered segment gone; its producer state is not carried over");
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        };
        Ok(parse_producer_snapshot(&bytes).unwrap_or_else(|e| {
            tracing::warn!(object = %key, error = %e, "previous tiered segment's producer snapshot is unreadable; not carried over");
            Vec::new()
        }))
    }

    /// Builds the segment of `plan` while streaming it to storage under `key`.
    async fn build_and_upload(
        &self,
        key: &ObjectKey,
        partition: TopicIdPartition,
        plan: &SegmentPlan,
        config: TieredSegmentConfig,
        previous: &[ProducerSnapshotEntry],
        inputs: FinishInputs,
    ) -> Result<(BuiltSegment, SegmentLayout, Option<LogTail>), AttemptError> {
        let (log_tx, log_rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let (tail_tx, tail_rx) = oneshot::channel::<SegmentTail>();
        let data = SegmentData {
            log: log_rx.boxed(),
            tail: tail_rx
                .map(|tail| {
                    tail.map_err(|_| StorageError::Permanent {
                        source: "the segment build ended without its tail".into(),
                    })
                })
                .boxed(),
            part_size: self
                .config
                .upload_part_size(plan.batches.iter().map(|b| u64::from(b.byte_size)).sum()),
        };
        let upload = self.remote.copy_segment(key, data);
        let build = self.build(partition, plan, config, previous, inputs, log_tx, tail_tx);
        let (uploaded, built) = futures::join!(upload, build);
        // The build's error first: the upload failed because of it.
        let (built, log_tail) = built?;
        Ok((built, uploaded?, log_tail))
    }

    /// Reads the plan's batches window by window into a builder, sending the `.log` as it grows
    /// to `log`, then the tail to `tail`. On error the `.log` stream ends with an error, so the
    /// upload stores nothing.
    #[allow(clippy::too_many_arguments)]
    async fn build(
        &self,
        partition: TopicIdPartition,
        plan: &SegmentPlan,
        config: TieredSegmentConfig,
        previous: &[ProducerSnapshotEntry],
        inputs: FinishInputs,
        mut log: mpsc::Sender<Result<Bytes, StorageError>>,
        tail: oneshot::Sender<SegmentTail>,
    ) -> Result<(BuiltSegment, Option<LogTail>), AttemptError> {
        let mut log_tail = self
            .fetcher
            .cache()
            .map(|_| LogTail::new(self.fetcher.config().cache_block_size));
        let result = self
            .build_log(partition, plan, config, previous, &mut log, &mut log_tail)
            .await
            .and_then(|builder| Ok(builder.finish(inputs)?));
        match result {
            Ok(built) => {
                // The end of the `.log`, then its tail.
                log.close_channel();
                let _ = tail.send(built.tail.clone());
                Ok((built, log_tail))
            }
            Err(e) => {
                let _ = log
                    .send(Err(StorageError::Permanent {
                        source: format!("the segment build failed: {e}").into(),
                    }))
                    .await;
                Err(e)
            }
        }
    }

    async fn build_log(
        &self,
        partition: TopicIdPartition,
        plan: &SegmentPlan,
        config: TieredSegmentConfig,
        previous: &[ProducerSnapshotEntry],
        log: &mut mpsc::Sender<Result<Bytes, StorageError>>,
        log_tail: &mut Option<LogTail>,
    ) -> Result<TieredSegmentBuilder, AttemptError> {
        let mut builder =
            TieredSegmentBuilder::new(partition, config)?.with_previous_snapshot(previous);
        if let Some(first) = plan.batches.first() {
            builder = builder.expect_base_offset(first.base_offset);
        }
        let mut rest: &[BatchCoordinate] = &plan.batches;
        let mut rolled = false;
        while !rest.is_empty() && !rolled {
            let window = window(rest, self.config.read_window);
            rest = &rest[window.len()..];
            let wanted: Vec<(usize, &BatchCoordinate)> = window
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.is_control())
                .collect();
            let (mut bytes, _) = self.fetcher.read_batches(wanted).await;
            for (i, coordinate) in window.iter().enumerate() {
                let stored = match coordinate.control {
                    Some(marker) => end_txn_marker(&MarkerBatch {
                        base_offset: coordinate.base_offset,
                        partition_leader_epoch: TIERED_LEADER_EPOCH,
                        producer_id: coordinate.producer_id,
                        producer_epoch: coordinate.producer_epoch,
                        commit: marker.commit,
                        coordinator_epoch: marker.coordinator_epoch,
                        timestamp: coordinate.effective_max_timestamp(),
                        log_append_time: coordinate.timestamp_type.is_log_append_time(),
                    }),
                    None => match bytes.remove(&i) {
                        Some(Ok(stored)) => stored,
                        Some(Err(reason)) => {
                            return Err(AttemptError::Read {
                                offset: coordinate.base_offset,
                                reason,
                            });
                        }
                        None => {
                            return Err(AttemptError::Read {
                                offset: coordinate.base_offset,
                                reason: "batch bytes missing".to_string(),
                            });
                        }
                    },
                };
                if let PushOutcome::Rolled(reason) = builder.push(coordinate, stored)? {
                    tracing::debug!(%partition, offset = coordinate.base_offset, ?reason, "segment rolled before the end of its plan");
                    rolled = true;
                    break;
                }
            }
            for chunk in builder.drain_log() {
                if let Some(log_tail) = log_tail.as_mut() {
                    log_tail.push(&chunk);
                }
                log.send(Ok(chunk))
                    .await
                    .map_err(|_| AttemptError::UploadEnded)?;
            }
        }
        Ok(builder)
    }

    /// Fences `key` and deletes it only if the fence returned it; else leaves it to the orphan
    /// collector (or, when the coordinator knows it, to the segment's life).
    async fn discard(&self, key: &ObjectKey, progress: &Progress) {
        let fenced = match self.coordinator.fence_orphans(&[key.to_string()]).await {
            Ok(fenced) => fenced,
            Err(e) => {
                tracing::warn!(object = %key, error = %e, "fencing a discarded segment failed; leaving it to the orphan collector");
                progress.lock().left_for_collector += 1;
                return;
            }
        };
        if !fenced.iter().any(|k| k == key.as_str()) {
            // The coordinator knows the key: a registration whose answer was lost applied after
            // all. The segment is live; never delete it.
            tracing::info!(object = %key, "discarded segment is registered; keeping it");
            return;
        }
        match self.remote.delete(std::slice::from_ref(key)).await {
            Ok(deleted) if deleted.contains(key) => progress.lock().fenced_and_deleted += 1,
            Ok(_) => progress.lock().left_for_collector += 1,
            Err(e) => {
                tracing::warn!(object = %key, error = %e, "deleting a fenced segment failed; leaving it to the orphan collector");
                progress.lock().left_for_collector += 1;
            }
        }
    }
}

/// The `.log`'s bytes since its last cache block boundary, kept while it streams (slices of its
/// chunks, no copy): with the segment's tail, the blocks [`TieringWorker::warm_cache`] inserts.
#[derive(Debug)]
struct LogTail {
    block_size: u64,
    /// The `.log` bytes streamed so far.
    len: u64,
    /// Its bytes from `len / block_size * block_size` on.
    chunks: Vec<Bytes>,
}

impl LogTail {
    fn new(block_size: u64) -> Self {
        LogTail {
            block_size,
            len: 0,
            chunks: Vec::new(),
        }
    }

    fn push(&mut self, chunk: &Bytes) {
        let start = self.len;
        self.len = start.saturating_add(chunk.len() as u64);
        let boundary = self.len / self.block_size * self.block_size;
        if boundary > start {
            // The chunk reaches a new block: what came before is in blocks of the `.log` alone.
            self.chunks.clear();
            let from = usize::try_from(boundary - start).unwrap_or(usize::MAX);
            if from < chunk.len() {
                self.chunks.push(chunk.slice(from..));
            }
        } else if !chunk.is_empty() {
            self.chunks.push(chunk.clone());
        }
    }

    /// The bytes kept.
    fn held(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64).sum()
    }
}

/// The first coordinates of `batches` whose bytes fit `window` (at least one).
fn window(batches: &[BatchCoordinate], window: u64) -> &[BatchCoordinate] {
    let mut bytes = 0u64;
    let n = batches
        .iter()
        .take_while(|b| {
            bytes = bytes.saturating_add(u64::from(b.byte_size));
            bytes <= window
        })
        .count();
    &batches[..n.max(1).min(batches.len())]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn config_is_checked() {
        assert!(TieringConfig::default().validate().is_ok());
        let bad = [
            TieringConfig::default().with_prefix(""),
            TieringConfig::default().with_prefix("/x"),
            TieringConfig::default().with_max_segments_per_pass(0),
            TieringConfig::default().with_max_bytes_per_pass(0),
            TieringConfig::default().with_max_segments_per_partition(0),
            TieringConfig::default().with_candidate_page(0),
            TieringConfig::default().with_max_batches_per_segment(0),
            TieringConfig::default().with_part_size(0),
            TieringConfig::default().with_read_window(0),
            TieringConfig::default().with_max_concurrent_builds(0),
            TieringConfig::default().with_inline_upload_max(usize::MAX),
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }

    #[test]
    fn the_log_tail_holds_the_bytes_since_the_last_block_boundary() {
        let log: Vec<u8> = (0..100u8).collect();
        for cuts in [
            vec![3, 7, 10, 33, 47],
            vec![10, 20, 30],
            vec![99],
            vec![1; 0],
        ] {
            for block_size in [1, 5, 10, 16, 100, 1000] {
                let mut tail = LogTail::new(block_size);
                let mut at = 0;
                for end in cuts.iter().copied().chain([100]) {
                    tail.push(&Bytes::copy_from_slice(&log[at..end]));
                    at = end;
                }
                let start = 100 / block_size as usize * block_size as usize;
                assert_eq!(tail.len, 100);
                assert_eq!(tail.held(), (100 - start) as u64, "{cuts:?} {block_size}");
                assert_eq!(tail.chunks.concat(), &log[start..], "{cuts:?} {block_size}");
            }
        }
    }

    #[test]
    fn windows_take_at_least_one_batch() {
        let c = |size| BatchCoordinate {
            byte_size: size,
            ..BatchCoordinate::txn_marker(
                &diskless_coordinator::TxnMarker {
                    partition: TopicIdPartition::new(uuid::Uuid::from_u128(1), 0),
                    producer_id: 1,
                    producer_epoch: 0,
                    coordinator_epoch: 0,
                    commit: true,
                    txn_seq: None,
                },
                0,
                0,
                Default::default(),
            )
        };
        let batches = [c(10), c(10), c(30), c(5)];
        assert_eq!(window(&batches, 20).len(), 2);
        assert_eq!(window(&batches, 19).len(), 1);
        assert_eq!(window(&batches[2..], 1).len(), 1);
        assert_eq!(window(&batches, 1000).len(), 4);
    }
}
