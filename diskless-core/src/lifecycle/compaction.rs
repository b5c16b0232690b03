//! [`CompactionWorker`]: `cleanup.policy=compact` on diskless topics (issue #29), Kafka's log
//! cleaner over a partition's tiered segments.
//!
//! The WAL tier plays the part of Kafka's active segment: it is never compacted; its batches are
//! compacted once the tiering worker has moved them into segments (for a compacted topic a
//! partition is due for tiering at `min(segment.ms, max.compaction.lag.ms)`, as Kafka's
//! `LogConfig.maxSegmentMs` rolls). Per partition, a round ([`CompactionWorker::compact_partition`]):
//!
//! 1. **Which segments.** [`BatchCoordinator::list_tiered_segments`]: the compacted ones (a
//!    prefix of the log, [`TieredSegment::compacted`]) are clean, the others dirty. The dirty
//!    part ends before the first segment whose newest record is younger than
//!    `min.compaction.lag.ms` (Kafka's `firstUncleanableDirtyOffset`). The partition is compacted
//!    when dirty bytes / all bytes exceed `min.cleanable.dirty.ratio`, or when its first dirty
//!    segment is older than `max.compaction.lag.ms` (Kafka's `LogCleanerManager`).
//! 2. **The offset map** ([`OffsetMap`]) over the dirty segments, read from storage in windows.
//!    A transaction's keys enter the map only once its marker is read: an aborted one's never
//!    (its data is removed), and the round ends before a segment that leaves a transaction
//!    undecided (its marker is not tiered yet): Kafka's cleaner never passes the last stable
//!    offset either. A map that would pass `max_map_bytes` ends the round at the last whole
//!    segment mapped.
//! 3. **The rewrite.** From the partition's first segment to the end of the mapped ones, in
//!    groups of consecutive segments up to `min(segment.bytes, max_group_bytes)`: every batch goes
//!    through [`compact_batch`] (same round time for all: tombstones get their delete horizon, or
//!    go after it), the kept ones into a [`TieredSegmentBuilder`] in its compacted mode (holes
//!    allowed, the last replaced segment's producer snapshot, the replaced `.txnindex` entries
//!    whose marker it keeps); the group's segment is uploaded under a fresh key;
//! 4. **The swap.** [`BatchCoordinator::replace_segments`] replaces the group's segments by the
//!    new one (or by none when nothing was kept) in one coordinator transaction.
//!
//! # Safety
//!
//! - *A key's latest value is always readable.* A record is removed only when the map holds a
//!   later offset of its key, and that later record is in a segment of this round (mapped) or
//!   after it: groups are swapped in offset order, each swap atomic
//!   (`replace_segments`, one transaction on every coordinator), so the later record is readable
//!   before, during and after every swap — in its old segment or in its group's new one, which
//!   keeps it (it is its key's latest in the map). A tombstone goes only at its horizon.
//! - *Nothing readable is lost to a failed round.* The new segment is uploaded before the swap;
//!   a swap refused as `Stale` (retention, DeleteRecords, another compaction or a registration
//!   changed the run) or failed applies nothing, and the worker fences the new key and deletes
//!   it only if the fence returned it (as the tiering worker does); a crash leaves an
//!   unregistered object for the orphan collector on `prefix`.
//! - *Readers of replaced segments* finish: the replaced objects are marked by the swap and
//!   deleted by the [`ObjectCleaner`](super::ObjectCleaner) after its grace period.
//!
//! Tested in `diskless-core/tests/compaction_worker.rs` on every coordinator of the testkit.

use super::LifecycleError;
use crate::ConfigError;
use crate::batch::{LOG_OVERHEAD, RecordBatch};
use crate::compaction::{
    BatchVerdict, CompactionRound, MapOutcome, OffsetMap, batch_keys, compact_batch,
};
use crate::control::parse_end_txn_marker;
use crate::tiered::format::{parse_producer_snapshot, parse_txn_index};
use crate::tiered::{
    AbortedTxnEntry, FinishInputs, PushOutcome, TieredSegmentBuilder, TieredSegmentConfig,
};
use bytes::Bytes;
use diskless_coordinator::{
    BatchCoordinate, BatchCoordinator, Clock, NO_TIMESTAMP, RegisterSegmentOutcome,
    RegisterSegmentRequest, ReplaceSegmentsRequest, ReplacedSegment, TieredSegment, TimestampType,
    TopicConfig, TopicIdPartition,
};
use diskless_storage::{KeySource, ObjectKey, RemoteStorage, Section, StorageError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Settings of a [`CompactionWorker`]: [`Default`], then the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionConfig {
    /// The key prefix of the segments it writes (the tiering worker's: one orphan collector
    /// covers both). Default `tiered`.
    pub prefix: String,
    /// The offset map's bound in bytes (keys plus [`crate::compaction::MAP_ENTRY_OVERHEAD`]
    /// each; Kafka's `log.cleaner.dedupe.buffer.size`). At least 1. Default 128 MiB.
    pub max_map_bytes: usize,
    /// `.log` bytes read at once from a segment. At least 1. Default 8 MiB.
    pub read_window: u64,
    /// The most source `.log` bytes one new segment replaces: a group's kept batches are held
    /// in memory until its upload, so this bounds a round's memory besides the map. At least 1.
    /// Default 64 MiB.
    pub max_group_bytes: u64,
    /// The bound on a batch's decompressed records. At least 1. Default 64 MiB.
    pub max_decompressed_bytes: usize,
    /// The most segments of a partition a round looks at. At least 1. Default 10 000.
    pub max_segments: u32,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            prefix: "tiered".to_string(),
            max_map_bytes: 128 << 20,
            read_window: 8 << 20,
            max_group_bytes: 64 << 20,
            max_decompressed_bytes: 64 << 20,
            max_segments: 10_000,
        }
    }
}

diskless_common::with_setters!(CompactionConfig {
    with_prefix => prefix: into [String],
    with_max_map_bytes => max_map_bytes: [usize],
    with_read_window => read_window: [u64],
    with_max_group_bytes => max_group_bytes: [u64],
    with_max_decompressed_bytes => max_decompressed_bytes: [usize],
    with_max_segments => max_segments: [u32],
});

impl CompactionConfig {
    /// Checks every setting: the first one out of range, as a [`ConfigError::Invalid`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        diskless_storage::validate_prefix(&self.prefix)
            .map_err(|e| ConfigError::invalid("prefix", e.to_string()))?;
        for (name, value) in [
            ("max_map_bytes", self.max_map_bytes as u64),
            ("read_window", self.read_window),
            ("max_group_bytes", self.max_group_bytes),
            ("max_decompressed_bytes", self.max_decompressed_bytes as u64),
            ("max_segments", u64::from(self.max_segments)),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(name, "must be at least 1"));
            }
        }
        Ok(())
    }
}

/// What one [`CompactionWorker::compact_partition`] round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Whether the partition was due (a round ran).
    pub due: bool,
    /// Segments replaced.
    pub segments_replaced: u64,
    /// Segments written.
    pub segments_written: u64,
    /// `.log` bytes of the replaced segments.
    pub bytes_before: u64,
    /// `.log` bytes of the segments written.
    pub bytes_after: u64,
    /// Batches removed whole.
    pub batches_removed: u64,
    /// Swaps the coordinator refused as stale (their new key discarded).
    pub stale: u64,
}

/// What one [`CompactionWorker::run_pass`] did, summed over the partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionPassReport {
    /// Partitions of compacted topics looked at.
    pub partitions: u64,
    /// Partitions compacted (due).
    pub compacted: u64,
    /// Partitions whose round failed on their bytes (logged; retried next pass).
    pub failed: u64,
    /// Segments replaced.
    pub segments_replaced: u64,
    /// Segments written.
    pub segments_written: u64,
    /// `.log` bytes replaced.
    pub bytes_before: u64,
    /// `.log` bytes written.
    pub bytes_after: u64,
}

/// Compacts the tiered segments of compacted topics; see the module docs.
#[derive(Debug)]
pub struct CompactionWorker {
    coordinator: Arc<dyn BatchCoordinator>,
    remote: Arc<dyn RemoteStorage>,
    clock: Arc<dyn Clock>,
    keys: Arc<dyn KeySource>,
    broker_id: i32,
    config: CompactionConfig,
}

/// Why a round stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactionError {
    /// A coordinator or storage call failed.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// A segment's bytes do not read as batches, or a batch does not compact.
    #[error("segment {key}: {reason}")]
    Segment {
        /// The segment's key.
        key: String,
        /// What failed.
        reason: String,
    },
    /// The first dirty segment's keys do not fit the map (raise `max_map_bytes`).
    #[error("the keys of segment {0} do not fit the offset map")]
    MapTooSmall(String),
}

impl From<StorageError> for CompactionError {
    fn from(e: StorageError) -> Self {
        CompactionError::Lifecycle(LifecycleError::Storage(e))
    }
}

impl From<diskless_coordinator::CoordinatorError> for CompactionError {
    fn from(e: diskless_coordinator::CoordinatorError) -> Self {
        CompactionError::Lifecycle(LifecycleError::Coordinator(e))
    }
}

/// A transaction seen in the dirty part: its producer's keys, until its marker.
#[derive(Default)]
struct OpenTxn {
    first_offset: i64,
    keys: Vec<(Bytes, i64)>,
}

impl CompactionWorker {
    /// A worker; fails on settings out of range.
    pub fn new(
        coordinator: Arc<dyn BatchCoordinator>,
        remote: Arc<dyn RemoteStorage>,
        clock: Arc<dyn Clock>,
        keys: Arc<dyn KeySource>,
        broker_id: i32,
        config: CompactionConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(CompactionWorker {
            coordinator,
            remote,
            clock,
            keys,
            broker_id,
            config,
        })
    }

    /// One round over every partition of every topic whose `cleanup.policy` compacts (Kafka's
    /// cleaner threads pick the filthiest log first; a pass here visits them all, in topic
    /// order). A partition whose bytes fail (a corrupt segment, a map too small) is logged and
    /// counted, and the pass goes on; a coordinator or storage failure ends the pass.
    pub async fn run_pass(&self) -> Result<CompactionPassReport, LifecycleError> {
        let mut pass = CompactionPassReport::default();
        let result = self.pass(&mut pass).await;
        super::record_pass(super::Worker::Compaction, &result, pass.segments_replaced);
        result.map(|()| pass)
    }

    async fn pass(&self, pass: &mut CompactionPassReport) -> Result<(), LifecycleError> {
        for topic in self.coordinator.list_topics().await? {
            if !topic.config.cleanup_policy.compacts() {
                continue;
            }
            for p in 0..topic.partitions {
                let partition = TopicIdPartition::new(topic.topic_id, p);
                pass.partitions += 1;
                match self.compact_partition(partition, &topic.config).await {
                    Ok(report) => {
                        pass.compacted += u64::from(report.due);
                        pass.segments_replaced += report.segments_replaced;
                        pass.segments_written += report.segments_written;
                        pass.bytes_before += report.bytes_before;
                        pass.bytes_after += report.bytes_after;
                    }
                    Err(CompactionError::Lifecycle(e)) => return Err(e),
                    Err(e) => {
                        tracing::error!(%partition, error = %e, "compaction of a partition failed");
                        pass.failed += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// One compaction round of `partition`, whose topic has `topic` (module docs). A topic whose
    /// `cleanup.policy` does not compact, or a partition not due, is left alone (`due: false`).
    pub async fn compact_partition(
        &self,
        partition: TopicIdPartition,
        topic: &TopicConfig,
    ) -> Result<CompactionReport, CompactionError> {
        let mut report = CompactionReport::default();
        if !topic.cleanup_policy.compacts() {
            return Ok(report);
        }
        let now = self.clock.now_ms();
        let segments = self
            .coordinator
            .list_tiered_segments(partition, 0, self.config.max_segments)
            .await?;
        let Some(first_dirty) = segments.iter().position(|s| !s.compacted) else {
            return Ok(report);
        };
        let lag_cut = now.saturating_sub(topic.min_compaction_lag_ms);
        let end = segments[first_dirty..]
            .iter()
            .position(|s| topic.min_compaction_lag_ms > 0 && s.retention_ts > lag_cut)
            .map_or(segments.len(), |i| first_dirty + i);
        let dirty = &segments[first_dirty..end];
        let Some(oldest) = dirty.first() else {
            return Ok(report);
        };
        let clean_bytes: u64 = segments[..first_dirty].iter().map(|s| s.layout.log).sum();
        let dirty_bytes: u64 = dirty.iter().map(|s| s.layout.log).sum();
        let ratio = dirty_bytes as f64 / (clean_bytes + dirty_bytes).max(1) as f64;
        let overdue = topic.max_compaction_lag_ms < i64::MAX
            && oldest.retention_ts < now.saturating_sub(topic.max_compaction_lag_ms);
        if !(ratio > topic.min_cleanable_dirty_ratio || overdue) {
            return Ok(report);
        }
        report.due = true;

        // The offset map, and the aborted transactions of the dirty part.
        let mut map = OffsetMap::new(self.config.max_map_bytes);
        let mut aborted: Vec<AbortedTxnEntry> = Vec::new();
        let mut mapped_end = first_dirty;
        let mut scratch = Vec::new();
        let mut open: BTreeMap<i64, OpenTxn> = BTreeMap::new();
        let mut pending: Vec<(Bytes, i64)> = Vec::new();
        let mut pending_last = -1;
        for (i, segment) in dirty.iter().enumerate() {
            let mut reader = SegmentLogReader::new(segment, self.config.read_window)?;
            while let Some(batch) = reader.next(self.remote.as_ref()).await? {
                let fail = |reason: String| CompactionError::Segment {
                    key: segment.object_key.clone(),
                    reason,
                };
                let producer = batch.producer_id();
                if batch.attributes().is_control() {
                    let marker =
                        parse_end_txn_marker(batch.as_bytes()).map_err(|e| fail(e.to_string()))?;
                    if let Some(txn) = open.remove(&producer) {
                        if marker.commit {
                            pending.extend(txn.keys);
                        } else {
                            aborted.push(AbortedTxnEntry {
                                producer_id: producer,
                                first_offset: txn.first_offset,
                                last_offset: batch.base_offset(),
                                last_stable_offset: -1,
                            });
                        }
                    }
                } else {
                    let keys = batch_keys(&batch, &mut scratch, self.config.max_decompressed_bytes)
                        .map_err(|e| fail(e.to_string()))?;
                    if batch.attributes().is_transactional() {
                        let txn = open.entry(producer).or_insert_with(|| OpenTxn {
                            first_offset: batch.base_offset(),
                            keys: Vec::new(),
                        });
                        txn.keys.extend(keys);
                    } else {
                        pending.extend(keys);
                    }
                }
                pending_last = batch.last_offset();
            }
            // A segment boundary with every transaction decided: what is pending may enter.
            if open.is_empty() {
                match map.add_keys(&pending, pending_last) {
                    MapOutcome::Mapped => {
                        mapped_end = first_dirty + i + 1;
                        pending.clear();
                    }
                    MapOutcome::Full if mapped_end == first_dirty => {
                        return Err(CompactionError::MapTooSmall(segment.object_key.clone()));
                    }
                    MapOutcome::Full => break,
                }
            }
        }
        if mapped_end == first_dirty {
            // The first dirty segments leave a transaction undecided: wait for its marker.
            report.due = false;
            return Ok(report);
        }
        aborted.retain(|a| a.last_offset <= segments[mapped_end - 1].end_offset);

        // The rewrite, group by group.
        let round = CompactionRound {
            now_ms: now,
            delete_retention_ms: topic.delete_retention_ms,
            decompression_limit: self.config.max_decompressed_bytes,
        };
        let group_max = u64::try_from(topic.segment_bytes)
            .unwrap_or(u64::MAX)
            .min(self.config.max_group_bytes);
        let mut start = 0;
        while start < mapped_end {
            let mut stop = start + 1;
            let mut bytes = segments[start].layout.log;
            while stop < mapped_end
                && bytes + segments[stop].layout.log <= group_max
                && segments[stop].end_offset - segments[start].base_offset <= i64::from(i32::MAX)
            {
                bytes += segments[stop].layout.log;
                stop += 1;
            }
            let group = &segments[start..stop];
            self.rewrite_group(partition, topic, group, &map, &aborted, &round, &mut report)
                .await?;
            start = stop;
        }
        Ok(report)
    }

    /// Compacts `group` into one new segment and swaps it in.
    #[allow(clippy::too_many_arguments)]
    async fn rewrite_group(
        &self,
        partition: TopicIdPartition,
        topic: &TopicConfig,
        group: &[TieredSegment],
        map: &OffsetMap,
        aborted: &[AbortedTxnEntry],
        round: &CompactionRound,
        report: &mut CompactionReport,
    ) -> Result<(), CompactionError> {
        let Some(last) = group.last() else {
            return Ok(());
        };
        let snapshot = self.section(last, Section::ProducerSnapshot).await?;
        let snapshot =
            parse_producer_snapshot(&snapshot).map_err(|e| CompactionError::Segment {
                key: last.object_key.clone(),
                reason: format!("producer snapshot: {e}"),
            })?;
        // The replaced `.txnindex` entries (with their last stable offsets), and the ones found.
        let mut entries: Vec<AbortedTxnEntry> = Vec::new();
        for segment in group {
            let bytes = self.section(segment, Section::TxnIndex).await?;
            entries.extend(
                parse_txn_index(&bytes).map_err(|e| CompactionError::Segment {
                    key: segment.object_key.clone(),
                    reason: format!("transaction index: {e}"),
                })?,
            );
        }
        let is_aborted = |batch: &RecordBatch| {
            batch.attributes().is_transactional()
                && !batch.attributes().is_control()
                && aborted.iter().chain(&entries).any(|a| {
                    a.producer_id == batch.producer_id()
                        && a.first_offset <= batch.base_offset()
                        && batch.last_offset() < a.last_offset
                })
        };
        let config = TieredSegmentConfig {
            segment_bytes: i32::MAX,
            index_interval_bytes: topic.index_interval_bytes,
            segment_index_bytes: topic.segment_index_bytes,
        };
        let mut builder = TieredSegmentBuilder::new(partition, config)
            .map_err(|e| CompactionError::Segment {
                key: last.object_key.clone(),
                reason: e.to_string(),
            })?
            .compacted(snapshot);
        let mut scratch = Vec::new();
        for segment in group {
            let fail = |reason: String| CompactionError::Segment {
                key: segment.object_key.clone(),
                reason,
            };
            let mut reader = SegmentLogReader::new(segment, self.config.read_window)?;
            while let Some(batch) = reader.next(self.remote.as_ref()).await? {
                let verdict = compact_batch(&batch, is_aborted(&batch), map, round, &mut scratch)
                    .map_err(|e| fail(e.to_string()))?;
                let kept = match verdict {
                    BatchVerdict::Unchanged => batch,
                    BatchVerdict::Rewritten(rebuilt) => rebuilt,
                    BatchVerdict::Removed => {
                        report.batches_removed += 1;
                        continue;
                    }
                };
                let coordinate = stored_coordinate(&kept);
                match builder
                    .push(&coordinate, kept.into_bytes())
                    .map_err(|e| fail(e.to_string()))?
                {
                    PushOutcome::Appended(_) => {}
                    PushOutcome::Rolled(reason) => {
                        return Err(fail(format!("a compacted segment rolled: {reason:?}")));
                    }
                }
            }
        }
        let replaced: Vec<ReplacedSegment> = group.iter().map(ReplacedSegment::from).collect();
        let before: u64 = group.iter().map(|s| s.layout.log).sum();
        let first_base = group.first().map_or(0, |s| s.base_offset);
        let segment = if builder.is_empty() {
            None
        } else {
            let built = builder
                .finish(FinishInputs {
                    aborted: entries,
                    producer_id_expiration_ms: None,
                    log_start_offset: first_base,
                    first_tiered_base: Some(first_base),
                })
                .map_err(|e| CompactionError::Segment {
                    key: last.object_key.clone(),
                    reason: e.to_string(),
                })?;
            let key =
                ObjectKey::generate(&self.config.prefix, self.keys.as_ref(), self.clock.as_ref())?;
            let layout = match self.remote.copy_segment(&key, built.segment_data()).await {
                Ok(layout) => layout,
                Err(e) => {
                    self.discard(&key).await;
                    return Err(e.into());
                }
            };
            Some((key, built, layout))
        };
        let request = ReplaceSegmentsRequest {
            partition,
            replaced,
            segment: segment
                .as_ref()
                .map(|(key, built, layout)| RegisterSegmentRequest {
                    partition,
                    object_key: key.to_string(),
                    object_size: layout.object_size(),
                    uploader_broker_id: self.broker_id,
                    layout: *layout,
                    base_offset: built.base_offset,
                    end_offset: built.end_offset,
                    batch_count: built.batch_count,
                    batch_bytes: layout.log,
                    max_timestamp: built.max_timestamp,
                    max_timestamp_offset: built.max_timestamp_offset,
                    owner: 0,
                }),
        };
        let after = segment.as_ref().map_or(0, |(_, _, l)| l.log);
        let outcome = self.coordinator.replace_segments(request).await;
        match outcome {
            Ok(RegisterSegmentOutcome::Registered { .. })
            | Ok(RegisterSegmentOutcome::AlreadyRegistered) => {
                report.segments_replaced += group.len() as u64;
                report.segments_written += u64::from(segment.is_some());
                report.bytes_before += before;
                report.bytes_after += after;
                tracing::info!(%partition, replaced = group.len(), before, after, "compacted tiered segments");
                Ok(())
            }
            Ok(RegisterSegmentOutcome::Stale) | Ok(RegisterSegmentOutcome::UnknownPartition) => {
                report.stale += 1;
                if let Some((key, _, _)) = &segment {
                    self.discard(key).await;
                }
                Ok(())
            }
            Err(e) => {
                if let Some((key, _, _)) = &segment {
                    self.discard(key).await;
                }
                Err(e.into())
            }
        }
    }

    /// One section of a segment.
    async fn section(
        &self,
        segment: &TieredSegment,
        section: Section,
    ) -> Result<Bytes, CompactionError> {
        let key = ObjectKey::parse(&segment.object_key)?;
        let layout = segment.layout;
        Ok(self
            .remote
            .fetch(&key, &layout, layout.range(section))
            .await?)
    }

    /// Fences `key` and deletes it only if the fence returned it (as the tiering worker does);
    /// otherwise the orphan collector (or the segment's life, if a lost swap applied) decides.
    async fn discard(&self, key: &ObjectKey) {
        match self.coordinator.fence_orphans(&[key.to_string()]).await {
            Ok(fenced) if fenced.iter().any(|k| k == key.as_str()) => {
                if let Err(e) = self.remote.delete(std::slice::from_ref(key)).await {
                    tracing::warn!(object = %key, error = %e, "deleting a fenced compacted segment failed; leaving it to the orphan collector");
                }
            }
            Ok(_) => {
                tracing::info!(object = %key, "discarded compacted segment is registered; keeping it")
            }
            Err(e) => {
                tracing::warn!(object = %key, error = %e, "fencing a discarded compacted segment failed; leaving it to the orphan collector")
            }
        }
    }
}

/// The coordinate a stored tiered batch stands for: its own offsets and timestamps, so that the
/// builder's rewrite changes nothing but what it always sets (the leader epoch, the CRC).
fn stored_coordinate(batch: &RecordBatch) -> BatchCoordinate {
    let log_append = batch.timestamp_type() == TimestampType::LogAppendTime;
    BatchCoordinate {
        object_key: String::new(),
        object_size: 0,
        byte_offset: 0,
        byte_size: u32::try_from(batch.len()).unwrap_or(u32::MAX),
        base_offset: batch.base_offset(),
        last_offset: batch.last_offset(),
        base_timestamp: batch.base_timestamp(),
        max_timestamp: batch.max_timestamp(),
        timestamp_type: batch.timestamp_type(),
        log_append_time: if log_append {
            batch.max_timestamp()
        } else {
            NO_TIMESTAMP
        },
        producer_id: batch.producer_id(),
        producer_epoch: batch.producer_epoch(),
        base_sequence: batch.base_sequence(),
        last_sequence: batch.last_sequence(),
        control: None,
    }
}

/// Reads a segment's `.log` batch by batch, `window` bytes at a time.
struct SegmentLogReader {
    key: ObjectKey,
    layout: diskless_storage::SegmentLayout,
    window: u64,
    /// The bytes read and not handed out yet, from `position`.
    buffer: Bytes,
    position: u64,
}

impl SegmentLogReader {
    fn new(segment: &TieredSegment, window: u64) -> Result<Self, CompactionError> {
        Ok(SegmentLogReader {
            key: ObjectKey::parse(&segment.object_key)?,
            layout: segment.layout,
            window,
            buffer: Bytes::new(),
            position: 0,
        })
    }

    async fn next(
        &mut self,
        remote: &dyn RemoteStorage,
    ) -> Result<Option<RecordBatch>, CompactionError> {
        let log_len = self.layout.log;
        let start = self.position + self.buffer.len() as u64;
        if self.position >= log_len {
            return Ok(None);
        }
        let fail = |reason: String| CompactionError::Segment {
            key: self.key.to_string(),
            reason,
        };
        if self.buffer.len() < LOG_OVERHEAD {
            let to = (start + self.window).min(log_len).max(start);
            let more = remote.fetch(&self.key, &self.layout, start..to).await?;
            self.buffer = [self.buffer.as_ref(), more.as_ref()].concat().into();
        }
        if self.buffer.len() < LOG_OVERHEAD {
            return Err(fail(format!(
                "truncated batch at position {}",
                self.position
            )));
        }
        let length = i32::from_be_bytes([
            self.buffer[8],
            self.buffer[9],
            self.buffer[10],
            self.buffer[11],
        ]);
        let size = u64::try_from(length)
            .ok()
            .and_then(|l| l.checked_add(LOG_OVERHEAD as u64))
            .filter(|s| self.position + s <= log_len)
            .ok_or_else(|| fail(format!("bad batch length at position {}", self.position)))?;
        if (self.buffer.len() as u64) < size {
            let start = self.position + self.buffer.len() as u64;
            let to = (self.position + size.max(self.window)).min(log_len);
            let more = remote.fetch(&self.key, &self.layout, start..to).await?;
            self.buffer = [self.buffer.as_ref(), more.as_ref()].concat().into();
        }
        let size = size as usize;
        let bytes = self.buffer.split_to(size);
        self.position += size as u64;
        RecordBatch::parse(bytes).map(Some).map_err(|e| {
            fail(format!(
                "batch at position {}: {e}",
                self.position - size as u64
            ))
        })
    }
}
