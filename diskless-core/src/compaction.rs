//! Log compaction's record rules (issue #29, `cleanup.policy=compact`), as Kafka's log cleaner
//! applies them to one partition's closed segments: which records survive, and the bytes of the
//! batches that hold them.
//!
//! A compaction round has two steps, both here, free of I/O:
//!
//! 1. [`OffsetMap`]: Kafka's `Cleaner.buildOffsetMap` over the *dirty* part of the log (from the
//!    first offset not compacted yet to the first offset that may not be compacted): for every
//!    key, the offset of its latest record. Control batches and the data batches of aborted
//!    transactions are left out; so are records without a key. The map is bounded in bytes
//!    ([`OffsetMap::new`]); a caller that finds it full stops the round at the last batch it
//!    mapped, as Kafka ends a round at `map.latestOffset + 1`.
//! 2. [`compact_batch`]: Kafka's `MemoryRecords.filterTo` with the cleaner's
//!    `shouldRetainRecord`, for every batch from the log start to the end of the mapped range:
//!    - a record after [`OffsetMap::latest_offset`] is kept, whatever it is;
//!    - a record without a key is removed;
//!    - a keyed record is kept only if no later record of its key was mapped
//!      (`record.offset >= map[key]`), and a tombstone (null value) only while its batch has no
//!      delete horizon or the horizon lies ahead (KIP-534: the first round that keeps a
//!      tombstone stamps `now + delete.retention.ms` into the batch, a later round past it
//!      removes the tombstone);
//!    - the data batches of aborted transactions are removed whole;
//!    - a batch that keeps every record and needs no new horizon is kept byte for byte; one that
//!      keeps none is removed; any other is rebuilt with Kafka's `buildRetainedRecordsInto`
//!      rules ([`BatchVerdict::Rewritten`]).
//!
//! Offsets are never reassigned: a rebuilt batch keeps its base offset, its last offset (so the
//! producer's last sequence survives) and each kept record's offset delta, so that fetch and
//! ListOffsets see holes where records went, exactly as on a compacted Kafka topic.
//!
//! Not done yet (Kafka does them; they change no record a consumer reads): transaction markers
//! are always kept (Kafka removes a marker whose transaction has no data left after the delete
//! horizon), and an emptied batch is removed even when it is its producer's last (Kafka keeps an
//! empty header for producer state, which the batch coordinator keeps here).

use std::collections::{HashMap, HashSet};

use crate::batch::{Compression, HEADER_LEN, RecordBatch};
use crate::builder::{NewRecord, RecordBatchBuilder};
use crate::compression::{CompressionError, decompress};
use crate::records::{RecordError, RecordIter};
use bytes::Bytes;
use diskless_coordinator::TimestampType;

/// What an [`OffsetMap`] entry costs besides its key's bytes (the hash table slot, the key's
/// allocation and the offset), for [`OffsetMap::new`]'s bound.
pub const MAP_ENTRY_OVERHEAD: usize = 48;

/// Why a batch could not be read or rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompactionError {
    /// The batch's codec id is unknown.
    #[error("batch at offset {base_offset}: unknown compression id {id}")]
    UnknownCompression {
        /// The batch's base offset.
        base_offset: i64,
        /// The codec id.
        id: u8,
    },
    /// The records do not decompress (or exceed the bound).
    #[error("batch at offset {base_offset}: {source}")]
    Decompression {
        /// The batch's base offset.
        base_offset: i64,
        /// What failed.
        source: CompressionError,
    },
    /// A record does not parse.
    #[error("batch at offset {base_offset}: {source}")]
    Record {
        /// The batch's base offset.
        base_offset: i64,
        /// What failed.
        source: RecordError,
    },
    /// The rebuilt batch could not be encoded.
    #[error("batch at offset {base_offset}: rebuilding failed: {source}")]
    Rebuild {
        /// The batch's base offset.
        base_offset: i64,
        /// What failed.
        source: CompressionError,
    },
}

/// Kafka's cleaner offset map: each key's latest offset in the mapped range, and the last offset
/// mapped. Keys are held whole (Kafka keeps a 16-byte hash, so a collision could drop a record;
/// here none can).
#[derive(Debug, Clone)]
pub struct OffsetMap {
    offsets: HashMap<Bytes, i64>,
    latest_offset: i64,
    bytes: usize,
    max_bytes: usize,
}

/// What [`OffsetMap::add_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapOutcome {
    /// Every key of the batch is in the map; [`OffsetMap::latest_offset`] is its last offset.
    Mapped,
    /// The batch's keys would take the map past its bound: nothing of the batch was mapped.
    Full,
}

impl OffsetMap {
    /// An empty map that holds keys of at most about `max_bytes` in all (each entry counts its
    /// key's length plus [`MAP_ENTRY_OVERHEAD`]).
    pub fn new(max_bytes: usize) -> Self {
        OffsetMap {
            offsets: HashMap::new(),
            latest_offset: -1,
            bytes: 0,
            max_bytes,
        }
    }

    /// The last offset mapped (`-1` before any batch): records after it are not judged.
    pub fn latest_offset(&self) -> i64 {
        self.latest_offset
    }

    /// The latest mapped offset of `key`.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        self.offsets.get(key).copied()
    }

    /// How many keys are mapped.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether no key is mapped.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The bytes the map counts against its bound.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Maps the keyed records of `batch` (Kafka's `buildOffsetMapForSegment`): a control batch
    /// and an `aborted` transaction's data batch add no key, but every mapped batch moves
    /// [`OffsetMap::latest_offset`] to its last offset. A batch whose new keys do not fit is not
    /// mapped at all ([`MapOutcome::Full`]), so a round always ends at a batch boundary.
    /// `scratch` holds decompressed records between calls; `limit` bounds them.
    pub fn add_batch(
        &mut self,
        batch: &RecordBatch,
        aborted: bool,
        scratch: &mut Vec<u8>,
        limit: usize,
    ) -> Result<MapOutcome, CompactionError> {
        let keys = if batch.attributes().is_control() || aborted {
            Vec::new()
        } else {
            batch_keys(batch, scratch, limit)?
        };
        Ok(self.add_keys(&keys, batch.last_offset()))
    }

    /// Maps `keys` (from [`batch_keys`], of batches ending at `last_offset`), all or none
    /// ([`MapOutcome::Full`] when the new ones do not fit); mapped, the map's latest offset moves
    /// to `last_offset`.
    pub fn add_keys(&mut self, keys: &[(Bytes, i64)], last_offset: i64) -> MapOutcome {
        let mut added = 0usize;
        let mut new_keys: HashSet<&[u8]> = HashSet::new();
        for (key, _) in keys {
            if !self.offsets.contains_key(key.as_ref()) && new_keys.insert(key.as_ref()) {
                added += key.len() + MAP_ENTRY_OVERHEAD;
            }
        }
        if self.bytes + added > self.max_bytes {
            return MapOutcome::Full;
        }
        for (key, offset) in keys {
            match self.offsets.get_mut(key.as_ref()) {
                Some(latest) => *latest = (*latest).max(*offset),
                None => {
                    self.offsets.insert(key.clone(), *offset);
                }
            }
        }
        self.bytes += added;
        self.latest_offset = self.latest_offset.max(last_offset);
        MapOutcome::Mapped
    }
}

/// The keys of `batch`'s records with their offsets, in order (records without a key left out).
pub fn batch_keys(
    batch: &RecordBatch,
    scratch: &mut Vec<u8>,
    limit: usize,
) -> Result<Vec<(Bytes, i64)>, CompactionError> {
    let base_offset = batch.base_offset();
    let records = records_of(batch, scratch, limit)?;
    let mut keys = Vec::new();
    for record in RecordIter::new(records, count_of(batch)) {
        let record = record.map_err(|source| CompactionError::Record {
            base_offset,
            source,
        })?;
        if let Some(key) = record.key {
            keys.push((
                Bytes::copy_from_slice(key),
                base_offset + i64::from(record.offset_delta),
            ));
        }
    }
    Ok(keys)
}

/// What compaction does to one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Kept byte for byte.
    Unchanged,
    /// Replaced by this batch: the kept records, same base and last offset.
    Rewritten(RecordBatch),
    /// Removed: no record of it is kept.
    Removed,
}

/// The inputs of one compaction round that [`compact_batch`] needs besides the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionRound {
    /// The round's time (Kafka's `currentTime`, taken once per round), ms.
    pub now_ms: i64,
    /// The topic's `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// The bound on a batch's decompressed records.
    pub decompression_limit: usize,
}

/// Kafka's `filterTo` for one batch of a compaction round (module docs): `aborted` says the batch
/// is data of an aborted transaction. `scratch` holds decompressed records between calls.
pub fn compact_batch(
    batch: &RecordBatch,
    aborted: bool,
    map: &OffsetMap,
    round: &CompactionRound,
    scratch: &mut Vec<u8>,
) -> Result<BatchVerdict, CompactionError> {
    let attributes = batch.attributes();
    if attributes.is_control() {
        return Ok(BatchVerdict::Unchanged);
    }
    if aborted {
        return Ok(BatchVerdict::Removed);
    }
    let base_offset = batch.base_offset();
    let horizon = attributes
        .has_delete_horizon()
        .then(|| batch.base_timestamp());
    let retain_deletes = horizon.is_none_or(|h| round.now_ms < h);
    let base_timestamp = batch.base_timestamp();
    let records = records_of(batch, scratch, round.decompression_limit)?;
    let mut kept: Vec<(i32, NewRecord)> = Vec::new();
    let mut all_kept = true;
    let mut keeps_tombstone = false;
    for record in RecordIter::new(records, count_of(batch)) {
        let record = record.map_err(|source| CompactionError::Record {
            base_offset,
            source,
        })?;
        let offset = base_offset + i64::from(record.offset_delta);
        let retain = if offset > map.latest_offset() {
            true
        } else {
            match record.key {
                None => false,
                Some(key) => {
                    let latest = offset >= map.get(key).unwrap_or(-1);
                    latest && (record.value.is_some() || retain_deletes)
                }
            }
        };
        if !retain {
            all_kept = false;
            continue;
        }
        keeps_tombstone |= record.value.is_none();
        kept.push((
            record.offset_delta,
            NewRecord {
                timestamp: record.timestamp(base_timestamp),
                key: record.key.map(Bytes::copy_from_slice),
                value: record.value.map(Bytes::copy_from_slice),
                headers: record
                    .headers()
                    .map(|(k, v)| (Bytes::copy_from_slice(k), v.map(Bytes::copy_from_slice)))
                    .collect(),
            },
        ));
    }
    let needs_horizon = keeps_tombstone && horizon.is_none();
    if all_kept && !needs_horizon {
        return Ok(BatchVerdict::Unchanged);
    }
    if kept.is_empty() {
        return Ok(BatchVerdict::Removed);
    }
    let horizon = if needs_horizon {
        Some(round.now_ms.saturating_add(round.delete_retention_ms))
    } else {
        horizon
    };
    let first_timestamp = kept.first().map_or(-1, |(_, r)| r.timestamp);
    let max_timestamp = match attributes.timestamp_type() {
        // Kafka's builder keeps the batch's log append time.
        TimestampType::LogAppendTime => batch.max_timestamp(),
        TimestampType::CreateTime => kept.iter().map(|(_, r)| r.timestamp).max().unwrap_or(-1),
    };
    let mut builder = RecordBatchBuilder::new()
        .base_offset(base_offset)
        .partition_leader_epoch(batch.partition_leader_epoch())
        .attributes(attributes.with_delete_horizon(horizon.is_some()))
        .producer(
            batch.producer_id(),
            batch.producer_epoch(),
            batch.base_sequence(),
        )
        .base_timestamp(horizon.unwrap_or(first_timestamp))
        .max_timestamp(max_timestamp)
        .last_offset_delta(batch.last_offset_delta())
        .offset_deltas(kept.iter().map(|(d, _)| *d).collect());
    for (_, record) in kept {
        builder = builder.push(record);
    }
    builder
        .build()
        .map(BatchVerdict::Rewritten)
        .map_err(|source| CompactionError::Rebuild {
            base_offset,
            source,
        })
}

/// The batch's records section, decompressed into `scratch` when compressed.
fn records_of<'a>(
    batch: &'a RecordBatch,
    scratch: &'a mut Vec<u8>,
    limit: usize,
) -> Result<&'a [u8], CompactionError> {
    let base_offset = batch.base_offset();
    let attributes = batch.attributes();
    let codec = attributes
        .compression()
        .ok_or(CompactionError::UnknownCompression {
            base_offset,
            id: attributes.compression_id(),
        })?;
    let raw = &batch.as_bytes()[HEADER_LEN..];
    if codec == Compression::None {
        return Ok(raw);
    }
    decompress(codec, raw, limit, scratch).map_err(|source| CompactionError::Decompression {
        base_offset,
        source,
    })?;
    Ok(scratch)
}

/// The batch's record count as an iteration bound (a negative count reads no record, and the
/// iterator then reports the bytes left over).
fn count_of(batch: &RecordBatch) -> usize {
    usize::try_from(batch.records_count()).unwrap_or(0)
}
