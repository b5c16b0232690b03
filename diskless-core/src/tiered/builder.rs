//! [`TieredSegmentBuilder`]: WAL batches in, a tiered segment object out (design §2.2).
//!
//! Per batch, in offset order:
//! 1. the stored bytes are framed and checked against the coordinate, and their stored CRC is
//!    verified (a corrupted WAL batch never gets a fresh CRC in an immutable segment);
//! 2. the roll rules of Kafka's `LogSegment.shouldRoll` are applied *before* the batch (a batch is
//!    never split): `segment.bytes` (a single batch larger than it makes a one-batch segment), a
//!    full offset index (`segment.index.bytes / 8` entries), a full time index
//!    (`segment.index.bytes / 12 − 1` entries, the last slot is the roll entry's), an offset too far
//!    from the base for an `i32` relative offset;
//! 3. the batch is rewritten as Kafka's leader stores it ([`crate::rewrite`]): the assigned base
//!    offset, `partitionLeaderEpoch` = [`TIERED_LEADER_EPOCH`], LogAppendTime stamped, CreateTime
//!    `maxTimestamp` = the validated record maximum (CRC recomputed only when it changes);
//! 4. the index state machine ([`SegmentIndexer`]) takes its header.
//!
//! [`TieredSegmentBuilder::finish`] adds the final time index entry, the `.txnindex` from the
//! aborted transactions whose marker is in the segment, the producer-state `.snapshot` (Kafka's
//! `ProducerAppendInfo` fold of the segment's batches over the previous segment's snapshot), the
//! leader-epoch checkpoint and the trailer.
//!
//! # Memory
//!
//! The builder streams: the `.log` chunks it has built so far are taken by
//! [`TieredSegmentBuilder::drain_log`] (to be uploaded while the next batches are read), and what
//! it keeps per batch is bounded by the indexes (`segment.index.bytes`): the index entries, the
//! first and last batch, the producer state (one entry per producer, folded as batches come) and
//! the ABORT markers. A whole segment is only in memory when the caller never drains.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use diskless_coordinator::{BatchCoordinate, TimestampType, TopicIdPartition};

use crate::batch::{BatchError, MAX_TIMESTAMP_OFFSET, RecordBatch};
use crate::control::parse_end_txn_marker;
use crate::rewrite::{BatchRewrite, StoredCrcMismatch, rewrite_batch_verified};
use crate::tiered::format::{
    AbortedTxnEntry, EpochEntry, FormatError, NO_TIMESTAMP, ProducerSnapshotEntry, SegmentIndexer,
    SegmentLayout, SegmentTrailer, encode_leader_epoch_checkpoint, encode_producer_snapshot,
    encode_txn_index,
};
use diskless_storage::{SegmentData, SegmentTail};

/// The `partitionLeaderEpoch` stored in every batch of a tiered segment. A diskless partition has
/// no leader epoch of its own and the host's changes over time, so immutable bytes hold 0; the
/// fetch path overwrites the field (outside the CRC) with the host's epoch for both tiers.
pub const TIERED_LEADER_EPOCH: i32 = 0;

/// The topic settings that shape a segment (Kafka's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TieredSegmentConfig {
    /// `segment.bytes`: the `.log` stops before a batch that would take it past this (default
    /// 1 GiB, at least 14).
    pub segment_bytes: i32,
    /// `index.interval.bytes`: bytes between offset index entries (default 4096, at least 0).
    pub index_interval_bytes: i32,
    /// `segment.index.bytes`: the capacity of each index in bytes (default 10 MiB, at least 4).
    pub segment_index_bytes: i32,
}

impl Default for TieredSegmentConfig {
    fn default() -> Self {
        TieredSegmentConfig {
            segment_bytes: 1 << 30,
            index_interval_bytes: 4096,
            segment_index_bytes: 10 << 20,
        }
    }
}

/// Why a segment stopped before a batch (Kafka's roll reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RollReason {
    /// The batch would take the `.log` past `segment.bytes`.
    SegmentBytes,
    /// The offset index has `segment.index.bytes / 8` entries.
    OffsetIndexFull,
    /// The time index has `segment.index.bytes / 12 − 1` entries.
    TimeIndexFull,
    /// The batch's last offset is more than `i32::MAX` past the segment's base.
    RelativeOffsetOverflow,
}

/// What [`TieredSegmentBuilder::push`] did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// The batch is in the segment.
    Appended(BuiltBatch),
    /// The segment is complete; the batch was not taken and starts the next segment.
    Rolled(RollReason),
}

/// Where a batch landed in the segment's `.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BuiltBatch {
    /// Its base offset.
    pub base_offset: i64,
    /// Its last offset.
    pub last_offset: i64,
    /// Its position in the `.log`.
    pub position: u32,
    /// Its size in bytes (unchanged by the rewrite).
    pub size: u32,
    /// Its `maxTimestamp` as stored in the segment.
    pub max_timestamp: i64,
}

/// A batch the builder refused; nothing was appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TieredBuildError {
    /// A setting outside Kafka's bounds.
    #[error("{name} = {value} is out of range")]
    InvalidConfig {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: i64,
    },
    /// The batch does not start where the previous one ended.
    #[error("batch at offset {base_offset} is not contiguous (expected {expected})")]
    NotContiguous {
        /// The offset expected.
        expected: i64,
        /// The batch's base offset.
        base_offset: i64,
    },
    /// The stored bytes are not one v2 batch.
    #[error("stored batch at offset {base_offset} does not frame: {source}")]
    Framing {
        /// The coordinate's base offset.
        base_offset: i64,
        /// The framing error.
        #[source]
        source: BatchError,
    },
    /// The stored bytes do not match the coordinate (size or record count).
    #[error("stored batch at offset {base_offset} does not match its coordinate: {reason}")]
    CoordinateMismatch {
        /// The coordinate's base offset.
        base_offset: i64,
        /// What differs.
        reason: &'static str,
    },
    /// The stored CRC is wrong.
    #[error("stored batch at offset {base_offset}: {source}")]
    Crc {
        /// The coordinate's base offset.
        base_offset: i64,
        /// The mismatch.
        #[source]
        source: StoredCrcMismatch,
    },
    /// A control batch that is not a transaction marker this crate can read.
    #[error("control batch at offset {base_offset} is not a transaction marker")]
    UnsupportedControlBatch {
        /// Its base offset.
        base_offset: i64,
    },
    /// An aborted transaction whose marker is not an ABORT of its producer in the segment, or
    /// rows out of order.
    #[error("aborted transaction of producer {producer_id} ending at {last_offset}: {reason}")]
    BadAbortedTxn {
        /// The producer.
        producer_id: i64,
        /// The marker offset given.
        last_offset: i64,
        /// What is wrong.
        reason: &'static str,
    },
    /// [`TieredSegmentBuilder::finish`] on a builder without batches.
    #[error("a segment needs at least one batch")]
    Empty,
    /// A format limit (e.g. the leader epoch start after the segment's end).
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// What [`TieredSegmentBuilder::finish`] needs besides the batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinishInputs {
    /// The partition's aborted transactions (`producer id, first, last = marker offset, LSO at the
    /// abort`); those whose marker is in the segment become its `.txnindex`, in marker order. A
    /// negative `last_stable_offset` (the coordinator does not keep it) is computed as Kafka's
    /// `ProducerStateManager.lastStableOffset` at the marker: the first offset of the earliest
    /// transaction of another producer still open then (in the producer state the builder
    /// folded, the previous snapshot's included), else the marker's offset + 1.
    pub aborted: Vec<AbortedTxnEntry>,
    /// `producer.id.expiration.ms`: a carried producer without an open transaction whose
    /// timestamp is at least this much older than the segment's max timestamp is dropped
    /// (Kafka's `isProducerExpired`). `None` keeps them all.
    pub producer_id_expiration_ms: Option<i64>,
    /// The partition's log start offset.
    pub log_start_offset: i64,
    /// The base offset of the partition's first tiered segment (`None`: this one).
    pub first_tiered_base: Option<i64>,
}

/// A finished segment: its sections, layout and what the coordinator row needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltSegment {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The first batch's base offset.
    pub base_offset: i64,
    /// The last batch's last offset (inclusive).
    pub end_offset: i64,
    /// The number of batches.
    pub batch_count: u32,
    /// Section sizes.
    pub layout: SegmentLayout,
    /// The `.log` chunks not taken by [`TieredSegmentBuilder::drain_log`] (all of them when
    /// nothing was drained): a rewritten header and the shared stored body per batch.
    pub log: Vec<Bytes>,
    /// The sections after the `.log` and the trailer, as [`RemoteStorage::copy_segment`] takes
    /// them.
    ///
    /// [`RemoteStorage::copy_segment`]: diskless_storage::RemoteStorage::copy_segment
    pub tail: SegmentTail,
    /// The largest batch `maxTimestamp` ([`NO_TIMESTAMP`] when no batch has one; Kafka's
    /// `RemoteLogSegmentMetadata.maxTimestampMs`).
    pub max_timestamp: i64,
    /// The last offset of the first batch holding `max_timestamp` (the base offset when none).
    pub max_timestamp_offset: i64,
    /// The producer state the `.snapshot` holds, sorted by producer id.
    pub producer_state: Vec<ProducerSnapshotEntry>,
    /// The aborted transactions the `.txnindex` holds.
    pub aborted: Vec<AbortedTxnEntry>,
    /// The leader epochs the checkpoint holds.
    pub epochs: Vec<EpochEntry>,
}

impl BuiltSegment {
    /// The number of batches.
    pub fn batch_count(&self) -> u32 {
        self.batch_count
    }

    /// The object's chunks in order: the undrained `.log` chunks, then every other section and
    /// the trailer (empty sections left out).
    pub fn chunks(&self) -> impl Iterator<Item = Bytes> + '_ {
        self.log
            .iter()
            .cloned()
            .chain(self.tail.clone().into_chunks())
    }

    /// The whole object as one buffer, for a segment whose `.log` was never drained (copies; for
    /// tests and small segments).
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.layout.object_size() as usize);
        for c in self.chunks() {
            b.extend_from_slice(&c);
        }
        b.freeze()
    }

    /// What [`RemoteStorage::copy_segment`] takes, for a segment whose `.log` was never drained.
    ///
    /// [`RemoteStorage::copy_segment`]: diskless_storage::RemoteStorage::copy_segment
    pub fn segment_data(&self) -> SegmentData {
        SegmentData::in_memory(self.log.clone(), self.tail.clone())
    }
}

/// What one batch did to producer state (folded at `finish`, over the previous snapshot).
#[derive(Debug, Clone, Copy)]
enum ProducerEvent {
    Data {
        producer_id: i64,
        epoch: i16,
        last_sequence: i32,
        base_offset: i64,
        last_offset: i64,
        max_timestamp: i64,
        transactional: bool,
    },
    Marker {
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
        timestamp: i64,
    },
}

/// Builds one tiered segment from WAL batches; see the module docs.
///
/// ```
/// use diskless_coordinator::TopicIdPartition;
/// use diskless_core::RecordBatchBuilder;
/// use diskless_core::tiered::{FinishInputs, PushOutcome, TieredSegmentBuilder, TieredSegmentConfig};
///
/// let batch = RecordBatchBuilder::new().record(1_000, None, Some(b"v")).build().unwrap();
/// // Where the coordinator placed it: offset 7, max timestamp 1000, CreateTime.
/// let coordinate = diskless_core::fuzzing::tiered_coordinate(&batch, 7, 1_000, None);
/// let partition = TopicIdPartition::new(uuid::Uuid::from_u128(1), 0);
/// let mut builder = TieredSegmentBuilder::new(partition, TieredSegmentConfig::default()).unwrap();
/// let outcome = builder.push(&coordinate, batch.into_bytes()).unwrap();
/// assert!(matches!(outcome, PushOutcome::Appended(_)));
/// let segment = builder.finish(FinishInputs::default()).unwrap();
/// assert_eq!((segment.base_offset, segment.end_offset, segment.max_timestamp), (7, 7, 1_000));
/// assert_eq!(&segment.tail.leader_epochs[..], b"0\n1\n0 7\n");
/// assert_eq!(segment.to_bytes().len() as u64, segment.layout.object_size());
/// ```
#[derive(Debug)]
pub struct TieredSegmentBuilder {
    partition: TopicIdPartition,
    config: TieredSegmentConfig,
    expected_next: Option<i64>,
    indexer: Option<SegmentIndexer>,
    /// `.log` chunks not drained yet.
    log: Vec<Bytes>,
    /// Bytes of `log`.
    log_bytes: u64,
    first: Option<BuiltBatch>,
    last: Option<BuiltBatch>,
    batch_count: u32,
    /// The producer state: the previous snapshot's, with this segment's batches folded in.
    producers: BTreeMap<i64, ProducerState>,
    /// ABORT markers in the segment by offset: their producer and Kafka's last stable offset at
    /// the marker.
    abort_markers: BTreeMap<i64, (i64, i64)>,
    /// Batches may leave holes between them (a compacted segment, issue #29).
    gaps: bool,
    /// The `.snapshot` to write whatever the batches fold to (a compacted segment keeps the
    /// state its last replaced segment ended with).
    final_snapshot: Option<Vec<ProducerSnapshotEntry>>,
}

impl TieredSegmentBuilder {
    /// A builder for a segment of `partition`; fails on settings outside Kafka's bounds.
    pub fn new(
        partition: TopicIdPartition,
        config: TieredSegmentConfig,
    ) -> Result<Self, TieredBuildError> {
        let check = |name, value: i32, min: i32| {
            if value < min {
                Err(TieredBuildError::InvalidConfig {
                    name,
                    value: i64::from(value),
                })
            } else {
                Ok(())
            }
        };
        check("segment.bytes", config.segment_bytes, 14)?;
        check("index.interval.bytes", config.index_interval_bytes, 0)?;
        check("segment.index.bytes", config.segment_index_bytes, 4)?;
        Ok(TieredSegmentBuilder {
            partition,
            config,
            expected_next: None,
            indexer: None,
            log: Vec::new(),
            log_bytes: 0,
            first: None,
            last: None,
            batch_count: 0,
            producers: BTreeMap::new(),
            abort_markers: BTreeMap::new(),
            gaps: false,
            final_snapshot: None,
        })
    }

    /// A builder for a compacted segment (issue #29): a batch may start after the previous one's
    /// end + 1 (compaction removed the batches between), never at or before it; the `.snapshot`
    /// is `snapshot` (the producer state the last replaced segment ended with: compaction
    /// changes no producer's state, though it removes batches that set it).
    pub fn compacted(mut self, snapshot: Vec<ProducerSnapshotEntry>) -> Self {
        self.gaps = true;
        self.final_snapshot = Some(snapshot);
        self
    }

    /// Start from the previous tiered segment's producer snapshot (none: the first segment, or
    /// the previous one is gone): its producers carry over unless this segment updates them or
    /// they expire ([`FinishInputs::producer_id_expiration_ms`]). Only before the first batch;
    /// later calls change nothing.
    pub fn with_previous_snapshot(mut self, previous: &[ProducerSnapshotEntry]) -> Self {
        if self.batch_count == 0 {
            self.producers = previous
                .iter()
                .map(|e| (e.producer_id, ProducerState::from_snapshot(e)))
                .collect();
        }
        self
    }

    /// Require the first batch to start at `offset` (the end of the previous segment + 1).
    pub fn expect_base_offset(mut self, offset: i64) -> Self {
        if self.batch_count == 0 {
            self.expected_next = Some(offset);
        }
        self
    }

    /// The batches taken so far.
    pub fn batch_count(&self) -> usize {
        self.batch_count as usize
    }

    /// Whether no batch was taken.
    pub fn is_empty(&self) -> bool {
        self.batch_count == 0
    }

    /// Takes the `.log` chunks built since the last call, in order (a rewritten header and the
    /// stored body per batch): the caller uploads them while the next batches are read, so the
    /// builder never holds the whole `.log`. The positions stay in the indexes.
    pub fn drain_log(&mut self) -> Vec<Bytes> {
        self.log_bytes = 0;
        std::mem::take(&mut self.log)
    }

    /// The bytes of the `.log` chunks not drained yet.
    pub fn undrained_log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// The `.log` size so far.
    pub fn log_size(&self) -> u64 {
        self.indexer.as_ref().map_or(0, |i| i.position())
    }

    /// The offset the next batch must start at, once known.
    pub fn next_offset(&self) -> Option<i64> {
        self.expected_next
    }

    /// Offer the next batch: `stored` is the batch as the WAL object holds it, `coordinate` where
    /// the coordinator placed it. Returns [`PushOutcome::Rolled`] (the batch not taken) when the
    /// segment must end before it; an error leaves the builder unchanged.
    pub fn push(
        &mut self,
        coordinate: &BatchCoordinate,
        stored: Bytes,
    ) -> Result<PushOutcome, TieredBuildError> {
        let base_offset = coordinate.base_offset;
        if let Some(expected) = self.expected_next
            && (expected > base_offset || (expected < base_offset && !self.gaps))
        {
            return Err(TieredBuildError::NotContiguous {
                expected,
                base_offset,
            });
        }
        let batch = RecordBatch::parse(stored).map_err(|source| TieredBuildError::Framing {
            base_offset,
            source,
        })?;
        let mismatch = |reason| TieredBuildError::CoordinateMismatch {
            base_offset,
            reason,
        };
        if batch.len() != coordinate.byte_size as usize {
            return Err(mismatch("byte size"));
        }
        if base_offset < 0
            || coordinate.last_offset.checked_sub(base_offset)
                != Some(i64::from(batch.last_offset_delta()))
        {
            return Err(mismatch("last offset"));
        }
        let size = batch.len() as u32;
        if let Some(indexer) = &self.indexer
            && let Some(reason) = self.roll_reason(indexer, coordinate.last_offset, size)
        {
            return Ok(PushOutcome::Rolled(reason));
        }
        let rewrite = BatchRewrite::for_coordinate(coordinate, TIERED_LEADER_EPOCH);
        let recomputes = rewrite.log_append_time.is_some()
            || rewrite
                .max_timestamp
                .is_some_and(|m| m != batch.max_timestamp());
        let crc_error = |source| TieredBuildError::Crc {
            base_offset,
            source,
        };
        if !recomputes && !batch.crc_is_valid() {
            // rewrite_batch_verified checks the CRC only when it computes a new one.
            return Err(crc_error(StoredCrcMismatch {
                stored: batch.crc(),
                computed: batch.compute_crc(),
            }));
        }
        let event = producer_event(&batch, coordinate)?;
        let out = rewrite_batch_verified(&batch, &rewrite).map_err(crc_error)?;
        let header = out.header();
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&header[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8]);
        let max_timestamp = i64::from_be_bytes(ts);
        let event = event.map(|e| match e {
            // A LogAppendTime marker's record timestamp is the batch's (stamped) max timestamp.
            ProducerEvent::Marker {
                producer_id,
                epoch,
                coordinator_epoch,
                ..
            } if coordinate.timestamp_type == TimestampType::LogAppendTime => {
                ProducerEvent::Marker {
                    producer_id,
                    epoch,
                    coordinator_epoch,
                    timestamp: max_timestamp,
                }
            }
            ProducerEvent::Data {
                producer_id,
                epoch,
                last_sequence,
                base_offset,
                last_offset,
                transactional,
                ..
            } => ProducerEvent::Data {
                producer_id,
                epoch,
                last_sequence,
                base_offset,
                last_offset,
                max_timestamp,
                transactional,
            },
            other => other,
        });
        let indexer = self.indexer.get_or_insert_with(|| {
            SegmentIndexer::new(
                base_offset,
                self.config.index_interval_bytes,
                self.config.segment_index_bytes,
            )
        });
        let position = indexer.position() as u32;
        if let Err(e) = indexer.append_batch(coordinate.last_offset, max_timestamp, size) {
            if self.batch_count == 0 {
                self.indexer = None;
            }
            return Err(e.into());
        }
        let built = BuiltBatch {
            base_offset,
            last_offset: coordinate.last_offset,
            position,
            size,
            max_timestamp,
        };
        if let Some(event) = event {
            apply_event(&mut self.producers, event);
            if let ProducerEvent::Marker { producer_id, .. } = event
                && is_abort_marker(&batch)
            {
                let lso = last_stable_offset(&self.producers, producer_id, base_offset);
                self.abort_markers.insert(base_offset, (producer_id, lso));
            }
        }
        let [header, body] = out.into_chunks();
        self.log_bytes += u64::from(size);
        self.log.push(header);
        self.log.push(body);
        self.first.get_or_insert(built);
        self.last = Some(built);
        self.batch_count += 1;
        self.expected_next = Some(coordinate.last_offset + 1);
        Ok(PushOutcome::Appended(built))
    }

    /// `LogSegment.shouldRoll`, checked before a batch joins a non-empty segment.
    fn roll_reason(
        &self,
        indexer: &SegmentIndexer,
        last_offset: i64,
        size: u32,
    ) -> Option<RollReason> {
        if indexer.position() + u64::from(size) > self.config.segment_bytes as u64 {
            return Some(RollReason::SegmentBytes);
        }
        if indexer.offset_index_full() {
            return Some(RollReason::OffsetIndexFull);
        }
        if indexer.time_index_full() {
            return Some(RollReason::TimeIndexFull);
        }
        let rel = last_offset - indexer.base_offset();
        if !(0..=i64::from(i32::MAX)).contains(&rel) {
            return Some(RollReason::RelativeOffsetOverflow);
        }
        None
    }

    /// Close the segment: final time index entry, `.txnindex`, `.snapshot`, leader epochs,
    /// trailer.
    pub fn finish(self, inputs: FinishInputs) -> Result<BuiltSegment, TieredBuildError> {
        let (Some(indexer), Some(first), Some(last)) = (self.indexer, self.first, self.last) else {
            return Err(TieredBuildError::Empty);
        };
        let base_offset = first.base_offset;
        let end_offset = last.last_offset;
        let indexes = indexer.finish();
        let max_timestamp = indexes.max_timestamp.timestamp;
        let max_timestamp_offset = if max_timestamp > NO_TIMESTAMP {
            indexes.max_timestamp.offset
        } else {
            base_offset
        };

        // .txnindex: the aborted transactions whose ABORT marker is in the segment.
        let mut aborted: Vec<AbortedTxnEntry> = inputs
            .aborted
            .iter()
            .filter(|a| (base_offset..=end_offset).contains(&a.last_offset))
            .map(|a| match self.abort_markers.get(&a.last_offset) {
                Some((_, lso)) if a.last_stable_offset < 0 => AbortedTxnEntry {
                    last_stable_offset: *lso,
                    ..*a
                },
                _ => *a,
            })
            .collect();
        aborted.sort_by_key(|a| a.last_offset);
        let mut seen = BTreeSet::new();
        for a in &aborted {
            let fail = |reason| TieredBuildError::BadAbortedTxn {
                producer_id: a.producer_id,
                last_offset: a.last_offset,
                reason,
            };
            if !seen.insert(a.last_offset) {
                return Err(fail("two rows for one marker"));
            }
            if a.first_offset < 0 || a.first_offset > a.last_offset {
                return Err(fail("first offset after the marker"));
            }
            if self.abort_markers.get(&a.last_offset).map(|m| m.0) != Some(a.producer_id) {
                return Err(fail("no ABORT marker of this producer at that offset"));
            }
        }

        // .snapshot: Kafka's fold over the previous segment's state, or a compacted segment's
        // given state.
        let producer_state = match self.final_snapshot {
            Some(mut snapshot) => {
                snapshot.sort_by_key(|e| e.producer_id);
                snapshot
            }
            None => expire_producers(
                self.producers,
                inputs.producer_id_expiration_ms,
                max_timestamp,
            ),
        };

        // Leader epochs: one epoch, 0, from the earliest offset tiered storage holds.
        let epoch_start = inputs
            .log_start_offset
            .max(inputs.first_tiered_base.unwrap_or(base_offset));
        if epoch_start > end_offset {
            return Err(FormatError::OutOfRange {
                what: "leader epoch start offset",
                value: epoch_start,
            }
            .into());
        }
        let epochs = vec![EpochEntry {
            epoch: TIERED_LEADER_EPOCH,
            start_offset: epoch_start.max(0),
        }];

        let txn_index = encode_txn_index(&aborted);
        let producer_snapshot = encode_producer_snapshot(&producer_state);
        let leader_epochs = encode_leader_epoch_checkpoint(&epochs);
        let layout = SegmentLayout {
            log: last.position as u64 + u64::from(last.size),
            offset_index: indexes.offset_index.len() as u32,
            time_index: indexes.time_index.len() as u32,
            txn_index: txn_index.len() as u32,
            producer_snapshot: producer_snapshot.len() as u32,
            leader_epochs: leader_epochs.len() as u32,
        };
        let trailer = SegmentTrailer {
            partition: self.partition,
            base_offset,
            end_offset,
            layout,
        }
        .encode()?;
        Ok(BuiltSegment {
            partition: self.partition,
            base_offset,
            end_offset,
            batch_count: self.batch_count,
            layout,
            log: self.log,
            tail: SegmentTail {
                offset_index: indexes.offset_index,
                time_index: indexes.time_index,
                txn_index,
                producer_snapshot,
                leader_epochs,
                trailer: Bytes::copy_from_slice(&trailer),
            },
            max_timestamp,
            max_timestamp_offset,
            producer_state,
            aborted,
            epochs,
        })
    }
}

fn is_abort_marker(batch: &RecordBatch) -> bool {
    parse_end_txn_marker(batch.as_bytes()).is_ok_and(|m| !m.commit)
}

/// The producer-state event of a stored batch (timestamps fixed up by the caller after the
/// rewrite), or `None` for a batch without a producer id.
fn producer_event(
    batch: &RecordBatch,
    coordinate: &BatchCoordinate,
) -> Result<Option<ProducerEvent>, TieredBuildError> {
    // `RecordBatch.hasProducerId`: producerId > NO_PRODUCER_ID (-1).
    if batch.producer_id() < 0 {
        return Ok(None);
    }
    if batch.attributes().is_control() {
        // Hook for #14: markers are 78-byte control batches built by `control::end_txn_marker`.
        let marker = parse_end_txn_marker(batch.as_bytes()).map_err(|_| {
            TieredBuildError::UnsupportedControlBatch {
                base_offset: coordinate.base_offset,
            }
        })?;
        return Ok(Some(ProducerEvent::Marker {
            producer_id: marker.producer_id,
            epoch: marker.producer_epoch,
            coordinator_epoch: marker.coordinator_epoch,
            // The record's timestamp: baseTimestamp + 0 (CreateTime).
            timestamp: marker.timestamp,
        }));
    }
    Ok(Some(ProducerEvent::Data {
        producer_id: batch.producer_id(),
        epoch: batch.producer_epoch(),
        last_sequence: batch.last_sequence(),
        base_offset: coordinate.base_offset,
        last_offset: coordinate.last_offset,
        max_timestamp: NO_TIMESTAMP,
        transactional: batch.attributes().is_transactional(),
    }))
}

/// Kafka's `ProducerStateEntry` as the fold needs it.
#[derive(Debug, Clone, Copy)]
struct ProducerState {
    epoch: i16,
    coordinator_epoch: i32,
    last_timestamp: i64,
    current_txn_first_offset: Option<i64>,
    /// `(last sequence, last offset, offset delta)` of the last batch (`batchMetadata.getLast`).
    last_batch: Option<(i32, i64, i32)>,
    touched: bool,
}

impl ProducerState {
    /// `ProducerStateEntry.empty(producerId)`.
    fn empty() -> Self {
        ProducerState {
            epoch: -1,
            coordinator_epoch: -1,
            last_timestamp: NO_TIMESTAMP,
            current_txn_first_offset: None,
            last_batch: None,
            touched: true,
        }
    }

    /// `ProducerStateManager.readSnapshot` of one entry.
    fn from_snapshot(e: &ProducerSnapshotEntry) -> Self {
        ProducerState {
            epoch: e.producer_epoch,
            coordinator_epoch: e.coordinator_epoch,
            last_timestamp: e.timestamp,
            current_txn_first_offset: (e.current_txn_first_offset >= 0)
                .then_some(e.current_txn_first_offset),
            last_batch: (e.last_offset >= 0).then_some((
                e.last_sequence,
                e.last_offset,
                e.offset_delta,
            )),
            touched: false,
        }
    }

    /// `maybeUpdateProducerEpoch`: a new epoch forgets the batches of the old one.
    fn set_epoch(&mut self, epoch: i16) {
        if self.epoch != epoch {
            self.last_batch = None;
            self.epoch = epoch;
        }
    }

    fn to_entry(self, producer_id: i64) -> ProducerSnapshotEntry {
        let (last_sequence, last_offset, offset_delta) = self.last_batch.unwrap_or((-1, -1, 0));
        ProducerSnapshotEntry {
            producer_id,
            producer_epoch: self.epoch,
            last_sequence,
            last_offset,
            offset_delta,
            timestamp: self.last_timestamp,
            coordinator_epoch: self.coordinator_epoch,
            current_txn_first_offset: self.current_txn_first_offset.unwrap_or(-1),
        }
    }
}

/// `ProducerAppendInfo.appendDataBatch` / `appendEndTxnMarker`: one batch's event folded into
/// the producer state.
fn apply_event(state: &mut BTreeMap<i64, ProducerState>, event: ProducerEvent) {
    match event {
        ProducerEvent::Data {
            producer_id,
            epoch,
            last_sequence,
            base_offset,
            last_offset,
            max_timestamp,
            transactional,
        } => {
            let s = state
                .entry(producer_id)
                .or_insert_with(ProducerState::empty);
            s.touched = true;
            s.set_epoch(epoch);
            let delta = i32::try_from(last_offset - base_offset).unwrap_or(i32::MAX);
            s.last_batch = Some((last_sequence, last_offset, delta));
            s.last_timestamp = max_timestamp;
            if transactional && s.current_txn_first_offset.is_none() {
                s.current_txn_first_offset = Some(base_offset);
            }
        }
        ProducerEvent::Marker {
            producer_id,
            epoch,
            coordinator_epoch,
            timestamp,
        } => {
            let s = state
                .entry(producer_id)
                .or_insert_with(ProducerState::empty);
            s.touched = true;
            s.set_epoch(epoch);
            s.coordinator_epoch = coordinator_epoch;
            s.current_txn_first_offset = None;
            s.last_timestamp = timestamp;
        }
    }
}

/// Kafka's `ProducerStateManager.lastStableOffset(completedTxn)` after `producer_id`'s marker at
/// `marker_offset`: the first offset of the earliest transaction of another producer still open,
/// else the marker's offset + 1.
fn last_stable_offset(
    state: &BTreeMap<i64, ProducerState>,
    producer_id: i64,
    marker_offset: i64,
) -> i64 {
    state
        .iter()
        .filter(|(id, _)| **id != producer_id)
        .filter_map(|(_, s)| s.current_txn_first_offset)
        .min()
        .unwrap_or(marker_offset.saturating_add(1))
}

/// The expiry of carried producers this segment did not touch (Kafka's `isProducerExpired`),
/// then the entries sorted by producer id.
fn expire_producers(
    state: BTreeMap<i64, ProducerState>,
    expiration_ms: Option<i64>,
    segment_max_timestamp: i64,
) -> Vec<ProducerSnapshotEntry> {
    state
        .into_iter()
        .filter(|(_, s)| {
            let expired = match expiration_ms {
                Some(ms) if segment_max_timestamp > NO_TIMESTAMP && !s.touched => {
                    s.current_txn_first_offset.is_none()
                        && segment_max_timestamp.saturating_sub(s.last_timestamp) >= ms
                }
                _ => false,
            };
            !expired
        })
        .map(|(id, s)| s.to_entry(id))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::control::{MarkerBatch, end_txn_marker};
    use crate::fuzzing::tiered_coordinate;
    use crate::tiered::format::{OffsetIndex, TimeIndex, parse_producer_snapshot};
    use crate::{Compression, RecordBatchBuilder};

    fn partition() -> TopicIdPartition {
        TopicIdPartition::new(uuid::Uuid::from_u128(5), 2)
    }

    fn builder(config: TieredSegmentConfig) -> TieredSegmentBuilder {
        TieredSegmentBuilder::new(partition(), config).unwrap()
    }

    /// A one-record batch with timestamp `ts` (a 70-byte batch without key and value).
    fn small(ts: i64) -> RecordBatch {
        RecordBatchBuilder::new()
            .record(ts, None, None)
            .build()
            .unwrap()
    }

    fn push(b: &mut TieredSegmentBuilder, batch: &RecordBatch, base: i64, max: i64) -> PushOutcome {
        let c = tiered_coordinate(batch, base, max, None);
        b.push(&c, batch.as_bytes().clone()).unwrap()
    }

    fn appended(o: PushOutcome) -> BuiltBatch {
        match o {
            PushOutcome::Appended(b) => b,
            PushOutcome::Rolled(r) => panic!("rolled: {r:?}"),
        }
    }

    #[test]
    fn batches_are_stored_as_kafkas_leader_stores_them() {
        let mut b = builder(TieredSegmentConfig::default());
        let honest = RecordBatchBuilder::new()
            .partition_leader_epoch(9)
            .record(10, None, Some(b"a"))
            .record(12, None, Some(b"b"))
            .build()
            .unwrap();
        let lying = RecordBatchBuilder::new()
            .compression(Compression::Lz4)
            .record(20, None, Some(b"c"))
            .max_timestamp(99)
            .build()
            .unwrap();
        appended(push(&mut b, &honest, 100, 12));
        appended(push(&mut b, &lying, 102, 20));
        let stamped = small(5);
        let c = tiered_coordinate(&stamped, 103, 5, Some(777));
        appended(b.push(&c, stamped.as_bytes().clone()).unwrap());
        let seg = b.finish(FinishInputs::default()).unwrap();
        let log = seg.to_bytes().slice(0..seg.layout.log as usize);
        let batches = crate::split_batches(log).unwrap();
        assert_eq!(batches.len(), 3);
        for (got, base) in batches.iter().zip([100, 102, 103]) {
            assert_eq!(got.base_offset(), base);
            assert_eq!(got.partition_leader_epoch(), TIERED_LEADER_EPOCH);
            assert!(got.crc_is_valid());
        }
        // Honest: the CRC is the stored one, the records the stored ones.
        assert_eq!(batches[0].crc(), honest.crc());
        assert_eq!(batches[0].records_bytes(), honest.records_bytes());
        // Lying CreateTime header: maxTimestamp is the validated one, CRC recomputed.
        assert_eq!(batches[1].max_timestamp(), 20);
        assert_ne!(batches[1].crc(), lying.crc());
        // LogAppendTime: bit 3 and the commit time.
        assert_eq!(batches[2].timestamp_type(), TimestampType::LogAppendTime);
        assert_eq!(batches[2].max_timestamp(), 777);
        assert_eq!((seg.max_timestamp, seg.max_timestamp_offset), (777, 103));
        assert_eq!(
            (seg.base_offset, seg.end_offset, seg.batch_count()),
            (100, 103, 3)
        );
        // The header chunk is fresh, the body chunk shared with the stored batch.
        assert_eq!(seg.log[1].as_ptr(), honest.as_bytes()[61..].as_ptr());
    }

    #[test]
    fn corrupt_and_mismatched_batches_are_refused() {
        let good = small(10);
        let mut corrupt = good.as_bytes().to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        let corrupt = Bytes::from(corrupt);
        let mut b = builder(TieredSegmentConfig::default());
        // Nothing to recompute: the stored CRC is checked anyway.
        let c = tiered_coordinate(&good, 0, 10, None);
        assert!(matches!(
            b.push(&c, corrupt.clone()),
            Err(TieredBuildError::Crc { .. })
        ));
        // A recomputed CRC (LogAppendTime, or another max timestamp) verifies first.
        let c_lat = tiered_coordinate(&good, 0, 10, Some(50));
        assert!(matches!(
            b.push(&c_lat, corrupt.clone()),
            Err(TieredBuildError::Crc { .. })
        ));
        let c_max = tiered_coordinate(&good, 0, 11, None);
        assert!(matches!(
            b.push(&c_max, corrupt),
            Err(TieredBuildError::Crc { .. })
        ));
        let mut wrong_size = c.clone();
        wrong_size.byte_size += 1;
        assert!(matches!(
            b.push(&wrong_size, good.as_bytes().clone()),
            Err(TieredBuildError::CoordinateMismatch { .. })
        ));
        let mut wrong_last = c.clone();
        wrong_last.last_offset += 1;
        assert!(matches!(
            b.push(&wrong_last, good.as_bytes().clone()),
            Err(TieredBuildError::CoordinateMismatch { .. })
        ));
        assert!(matches!(
            b.push(&c, Bytes::from_static(b"short")),
            Err(TieredBuildError::Framing { .. })
        ));
        assert!(b.is_empty(), "errors leave the builder unchanged");
        assert_eq!(
            b.finish(FinishInputs::default()),
            Err(TieredBuildError::Empty)
        );
    }

    #[test]
    fn offsets_must_be_contiguous() {
        let mut b = builder(TieredSegmentConfig::default()).expect_base_offset(10);
        let batch = small(1);
        let c = tiered_coordinate(&batch, 11, 1, None);
        assert_eq!(
            b.push(&c, batch.as_bytes().clone()),
            Err(TieredBuildError::NotContiguous {
                expected: 10,
                base_offset: 11
            })
        );
        appended(push(&mut b, &batch, 10, 1));
        assert_eq!(b.next_offset(), Some(11));
        let c = tiered_coordinate(&batch, 10, 1, None);
        assert!(matches!(
            b.push(&c, batch.as_bytes().clone()),
            Err(TieredBuildError::NotContiguous { .. })
        ));
        assert_eq!(b.batch_count(), 1);
    }

    #[test]
    fn roll_on_segment_bytes() {
        let batch = small(1);
        let size = batch.len() as i32;
        let mut b = builder(TieredSegmentConfig {
            segment_bytes: 2 * size,
            ..Default::default()
        });
        appended(push(&mut b, &batch, 0, 1));
        appended(push(&mut b, &batch, 1, 1));
        assert_eq!(
            push(&mut b, &batch, 2, 1),
            PushOutcome::Rolled(RollReason::SegmentBytes)
        );
        assert_eq!(b.log_size(), 2 * size as u64);
        // One byte short of two batches: the second rolls.
        let mut b = builder(TieredSegmentConfig {
            segment_bytes: 2 * size - 1,
            ..Default::default()
        });
        appended(push(&mut b, &batch, 0, 1));
        assert_eq!(
            push(&mut b, &batch, 1, 1),
            PushOutcome::Rolled(RollReason::SegmentBytes)
        );
        // A batch larger than segment.bytes makes a one-batch segment.
        let mut b = builder(TieredSegmentConfig {
            segment_bytes: 14,
            ..Default::default()
        });
        appended(push(&mut b, &batch, 0, 1));
        assert_eq!(
            push(&mut b, &batch, 1, 1),
            PushOutcome::Rolled(RollReason::SegmentBytes)
        );
        assert_eq!(b.finish(FinishInputs::default()).unwrap().batch_count(), 1);
    }

    #[test]
    fn roll_on_full_indexes_and_relative_offsets() {
        // 40 bytes: 5 offset entries, 3 time entries (full at 2). Equal timestamps keep the time
        // index at one entry, so the offset index fills first.
        let config = TieredSegmentConfig {
            index_interval_bytes: 0,
            segment_index_bytes: 40,
            ..Default::default()
        };
        let batch = small(7);
        let mut b = builder(config);
        for i in 0..6 {
            appended(push(&mut b, &batch, i, 7));
        }
        assert_eq!(
            push(&mut b, &batch, 6, 7),
            PushOutcome::Rolled(RollReason::OffsetIndexFull)
        );
        let seg = b.finish(FinishInputs::default()).unwrap();
        assert_eq!(seg.tail.offset_index.len(), 40);
        assert_eq!(seg.tail.time_index.len(), 12);
        // Rising timestamps fill the time index at maxEntries − 1.
        let mut b = builder(config);
        for i in 0..3 {
            appended(push(&mut b, &small(i), i, i));
        }
        assert_eq!(
            push(&mut b, &small(3), 3, 3),
            PushOutcome::Rolled(RollReason::TimeIndexFull)
        );
        let seg = b.finish(FinishInputs::default()).unwrap();
        assert_eq!(seg.tail.time_index.len(), 24);
        // A last offset more than i32::MAX past the base.
        let mut b = builder(TieredSegmentConfig::default());
        appended(push(&mut b, &small(1), 0, 1));
        let wide = RecordBatchBuilder::new()
            .records_count(1)
            .last_offset_delta(i32::MAX)
            .record(1, None, None)
            .build()
            .unwrap();
        assert_eq!(
            push(&mut b, &wide, 1, 1),
            PushOutcome::Rolled(RollReason::RelativeOffsetOverflow)
        );
        // ...which is fine as the first batch of the next segment.
        let mut next = builder(TieredSegmentConfig::default());
        appended(push(&mut next, &wide, 1, 1));
    }

    #[test]
    fn indexes_follow_recover_rule() {
        let config = TieredSegmentConfig {
            index_interval_bytes: 0,
            ..Default::default()
        };
        let mut b = builder(config);
        let ts = [30, 10, 40, 20];
        let mut positions = Vec::new();
        for (i, t) in ts.iter().enumerate() {
            positions.push(appended(push(&mut b, &small(*t), 50 + i as i64, *t)).position);
        }
        let seg = b.finish(FinishInputs::default()).unwrap();
        let oi = OffsetIndex::parse(50, seg.tail.offset_index.clone()).unwrap();
        assert_eq!(oi.len(), 3, "every batch but the first");
        assert_eq!(oi.entry(0).unwrap().position, positions[1]);
        let ti = TimeIndex::parse(50, seg.tail.time_index.clone()).unwrap();
        // Batch 1: max so far 30 at offset 50; batch 2: 40 at 52; batch 3: still 40.
        let entries: Vec<_> = (0..ti.len()).map(|i| ti.entry(i).unwrap()).collect();
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.timestamp, e.offset))
                .collect::<Vec<_>>(),
            [(30, 50), (40, 52)]
        );
        assert_eq!((seg.max_timestamp, seg.max_timestamp_offset), (40, 52));
    }

    fn producer_batch(id: i64, epoch: i16, seq: i32, records: usize, ts: i64) -> RecordBatch {
        let mut b = RecordBatchBuilder::new().producer(id, epoch, seq);
        for _ in 0..records {
            b = b.record(ts, None, Some(b"v"));
        }
        b.build().unwrap()
    }

    #[test]
    fn producer_snapshot_is_kafkas_fold() {
        let previous = vec![
            ProducerSnapshotEntry {
                producer_id: 1,
                producer_epoch: 0,
                last_sequence: 4,
                last_offset: 9,
                offset_delta: 0,
                timestamp: 100,
                coordinator_epoch: 3,
                current_txn_first_offset: -1,
            },
            // Old and idle: expires.
            ProducerSnapshotEntry {
                producer_id: 2,
                producer_epoch: 0,
                last_sequence: 0,
                last_offset: 8,
                offset_delta: 0,
                timestamp: 50,
                coordinator_epoch: -1,
                current_txn_first_offset: -1,
            },
            // Old but with an open transaction: kept.
            ProducerSnapshotEntry {
                producer_id: 3,
                producer_epoch: 1,
                last_sequence: 0,
                last_offset: 7,
                offset_delta: 0,
                timestamp: 50,
                coordinator_epoch: -1,
                current_txn_first_offset: 7,
            },
        ];
        let mut b = builder(TieredSegmentConfig::default())
            .expect_base_offset(10)
            .with_previous_snapshot(&previous);
        appended(push(&mut b, &producer_batch(1, 0, 5, 3, 1_000), 10, 1_000));
        appended(push(&mut b, &small(2_000), 13, 2_000));
        // Producer 4 appears, then bumps its epoch.
        appended(push(&mut b, &producer_batch(4, 0, 0, 2, 1_500), 14, 1_500));
        appended(push(&mut b, &producer_batch(4, 1, 0, 1, 1_600), 16, 1_600));
        let seg = b
            .finish(FinishInputs {
                producer_id_expiration_ms: Some(1_000),
                log_start_offset: 0,
                first_tiered_base: Some(0),
                ..Default::default()
            })
            .unwrap();
        let expected = vec![
            ProducerSnapshotEntry {
                producer_id: 1,
                producer_epoch: 0,
                last_sequence: 7,
                last_offset: 12,
                offset_delta: 2,
                timestamp: 1_000,
                coordinator_epoch: 3,
                current_txn_first_offset: -1,
            },
            ProducerSnapshotEntry {
                producer_id: 3,
                producer_epoch: 1,
                last_sequence: 0,
                last_offset: 7,
                offset_delta: 0,
                timestamp: 50,
                coordinator_epoch: -1,
                current_txn_first_offset: 7,
            },
            ProducerSnapshotEntry {
                producer_id: 4,
                producer_epoch: 1,
                last_sequence: 0,
                last_offset: 16,
                offset_delta: 0,
                timestamp: 1_600,
                coordinator_epoch: -1,
                current_txn_first_offset: -1,
            },
        ];
        assert_eq!(seg.producer_state, expected);
        assert_eq!(
            parse_producer_snapshot(&seg.tail.producer_snapshot).unwrap(),
            expected
        );
        assert_eq!(&seg.tail.leader_epochs[..], b"0\n1\n0 0\n");
    }

    fn marker(offset_commit: bool, producer_id: i64, epoch: i16, ts: i64) -> RecordBatch {
        RecordBatch::parse(end_txn_marker(&MarkerBatch {
            base_offset: 0,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: epoch,
            commit: offset_commit,
            coordinator_epoch: 6,
            timestamp: ts,
            log_append_time: false,
        }))
        .unwrap()
    }

    #[test]
    fn transactions_markers_and_txn_index() {
        let txn = |seq| {
            RecordBatchBuilder::new()
                .producer(9, 2, seq)
                .transactional(true)
                .record(500, None, Some(b"t"))
                .build()
                .unwrap()
        };
        let mut b = builder(TieredSegmentConfig::default());
        appended(push(&mut b, &txn(0), 20, 500));
        appended(push(&mut b, &txn(1), 21, 500));
        appended(push(&mut b, &marker(false, 9, 2, 600), 22, 600));
        appended(push(&mut b, &txn(2), 23, 500));
        let aborted = AbortedTxnEntry {
            producer_id: 9,
            first_offset: 20,
            last_offset: 22,
            last_stable_offset: 23,
        };
        let elsewhere = AbortedTxnEntry {
            last_offset: 5,
            first_offset: 1,
            ..aborted
        };
        let inputs = FinishInputs {
            aborted: vec![aborted, elsewhere],
            log_start_offset: 0,
            ..Default::default()
        };
        let seg = b.finish(inputs.clone()).unwrap();
        assert_eq!(seg.aborted, vec![aborted]);
        assert_eq!(&seg.tail.txn_index[..], &aborted.encode()[..]);
        // After the marker a new transaction opened at 23; the marker's coordinator epoch stays.
        assert_eq!(
            seg.producer_state,
            vec![ProducerSnapshotEntry {
                producer_id: 9,
                producer_epoch: 2,
                last_sequence: 2,
                last_offset: 23,
                offset_delta: 0,
                timestamp: 500,
                coordinator_epoch: 6,
                current_txn_first_offset: 23,
            }]
        );
        // A row whose marker is a COMMIT, or another producer's, is refused.
        let mut b = builder(TieredSegmentConfig::default());
        appended(push(&mut b, &txn(0), 20, 500));
        appended(push(&mut b, &marker(true, 9, 2, 600), 21, 600));
        let bad = FinishInputs {
            aborted: vec![AbortedTxnEntry {
                last_offset: 21,
                ..aborted
            }],
            ..Default::default()
        };
        assert!(matches!(
            b.finish(bad),
            Err(TieredBuildError::BadAbortedTxn { .. })
        ));
    }

    #[test]
    fn drained_log_is_the_same_log() {
        let config = TieredSegmentConfig {
            index_interval_bytes: 0,
            ..Default::default()
        };
        let mut whole = builder(config);
        let mut streamed = builder(config);
        let mut drained = Vec::new();
        for i in 0..10 {
            appended(push(&mut whole, &small(i), i, i));
            let at = appended(push(&mut streamed, &small(i), i, i));
            // Positions count the drained bytes too.
            assert_eq!(
                u64::from(at.position) + u64::from(at.size),
                streamed.log_size()
            );
            if i % 4 == 1 {
                drained.extend(streamed.drain_log());
                assert_eq!(streamed.undrained_log_bytes(), 0);
                assert!(streamed.drain_log().is_empty());
            }
        }
        let whole = whole.finish(FinishInputs::default()).unwrap();
        let mut streamed = streamed.finish(FinishInputs::default()).unwrap();
        assert!(streamed.log.len() < whole.log.len());
        drained.append(&mut streamed.log);
        streamed.log = drained;
        assert_eq!(streamed, whole);
        assert_eq!(whole.batch_count(), 10);
    }

    #[test]
    fn last_stable_offset_of_an_abort_is_kafkas() {
        let txn = |producer: i64, seq| {
            RecordBatchBuilder::new()
                .producer(producer, 0, seq)
                .transactional(true)
                .record(500, None, Some(b"t"))
                .build()
                .unwrap()
        };
        // Producer 3 carries an open transaction from the previous segment (first offset 5).
        let previous = [ProducerSnapshotEntry {
            producer_id: 3,
            producer_epoch: 0,
            last_sequence: 0,
            last_offset: 5,
            offset_delta: 0,
            timestamp: 400,
            coordinator_epoch: -1,
            current_txn_first_offset: 5,
        }];
        let mut b = builder(TieredSegmentConfig::default())
            .expect_base_offset(20)
            .with_previous_snapshot(&previous);
        appended(push(&mut b, &txn(9, 0), 20, 500));
        appended(push(&mut b, &txn(8, 0), 21, 500));
        appended(push(&mut b, &marker(false, 9, 0, 600), 22, 600)); // 3 and 8 still open
        appended(push(&mut b, &marker(true, 3, 0, 600), 23, 600));
        appended(push(&mut b, &marker(false, 8, 0, 600), 24, 600)); // none open
        let row = |first, last, lso| AbortedTxnEntry {
            producer_id: if last == 22 { 9 } else { 8 },
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        };
        let seg = b
            .finish(FinishInputs {
                // Unknown LSOs (-1) are computed; a given one is kept.
                aborted: vec![row(20, 22, -1), row(21, 24, -1)],
                ..Default::default()
            })
            .unwrap();
        assert_eq!(seg.aborted, vec![row(20, 22, 5), row(21, 24, 25)]);
    }

    #[test]
    fn leader_epoch_start() {
        let one = |inputs: FinishInputs| {
            let mut b = builder(TieredSegmentConfig::default());
            appended(push(&mut b, &small(1), 40, 1));
            appended(push(&mut b, &small(1), 41, 1));
            b.finish(inputs)
        };
        let text = |i| one(i).map(|s| s.tail.leader_epochs);
        assert_eq!(&text(FinishInputs::default()).unwrap()[..], b"0\n1\n0 40\n");
        assert_eq!(
            &text(FinishInputs {
                log_start_offset: 41,
                ..Default::default()
            })
            .unwrap()[..],
            b"0\n1\n0 41\n"
        );
        assert_eq!(
            &text(FinishInputs {
                log_start_offset: 3,
                first_tiered_base: Some(10),
                ..Default::default()
            })
            .unwrap()[..],
            b"0\n1\n0 10\n"
        );
        assert!(
            one(FinishInputs {
                log_start_offset: 42,
                ..Default::default()
            })
            .is_err()
        );
    }
}
