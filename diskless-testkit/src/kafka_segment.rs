//! An independent reader of tiered segment objects (`docs/tiered-consolidation.md` §1, §2.1),
//! written from Apache Kafka's sources only — it shares no code with `diskless_core::tiered`,
//! parses every byte by hand and computes its own CRC-32C — so that a test comparing the two
//! cannot pass on a misunderstanding they share in code.
//!
//! What it knows, with the Kafka source of each rule:
//! - `.log`: v2 record batches back to back (`FileRecords`), each checked as `ensureValid` does
//!   (CRC-32C of bytes 21..end), offsets contiguous;
//! - `.index` / `.timeindex` are re-derived from the `.log` with `LogSegment.recover`'s loop
//!   ([`KafkaSegment::recover_indexes`]) and answer `OffsetIndex.lookup`, `TimeIndex.lookup`,
//!   `LogSegment.translateOffset` and the batch step of `findOffsetByTimestamp` by linear scans;
//! - `.txnindex`: 34-byte `AbortedTxn` entries;
//! - `.snapshot`: `ProducerStateManager.readSnapshot` (version 1, CRC-32C of bytes 6..end, 46-byte
//!   entries), and [`fold_producer_state`], `ProducerAppendInfo`'s update rules, to say what it
//!   must hold;
//! - the leader-epoch checkpoint: `CheckpointFile` text (`version\ncount\n<epoch> <offset>\n`);
//! - the 80-byte trailer of §2.1.

use std::collections::BTreeMap;

use uuid::Uuid;

/// What the reader found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KafkaSegmentError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, KafkaSegmentError> {
    Err(KafkaSegmentError(msg.into()))
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// One batch of the `.log`, its header fields as Kafka's `DefaultRecordBatch` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaBatch {
    /// Byte position in the `.log`.
    pub position: u32,
    /// `baseOffset`.
    pub base_offset: i64,
    /// `baseOffset + lastOffsetDelta`.
    pub last_offset: i64,
    /// `sizeInBytes` (`batchLength + 12`).
    pub size: u32,
    /// `partitionLeaderEpoch`.
    pub partition_leader_epoch: i32,
    /// `attributes`.
    pub attributes: i16,
    /// `baseTimestamp`.
    pub base_timestamp: i64,
    /// `maxTimestamp`.
    pub max_timestamp: i64,
    /// `producerId`.
    pub producer_id: i64,
    /// `producerEpoch`.
    pub producer_epoch: i16,
    /// `baseSequence`.
    pub base_sequence: i32,
    /// `recordsCount`.
    pub records_count: i32,
    /// For a control batch with an uncompressed first record that is an end-transaction marker:
    /// `(commit, coordinator epoch, record timestamp)`.
    pub end_txn_marker: Option<(bool, i32, i64)>,
}

impl KafkaBatch {
    /// Attribute bit 3.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & 0x08 != 0
    }
    /// Attribute bit 4.
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }
    /// Attribute bit 5.
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
    /// `DefaultRecordBatch.lastSequence`: base + lastOffsetDelta, wrapping at `i32::MAX`.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return -1;
        }
        let delta = (self.last_offset - self.base_offset) as i32;
        let next = i64::from(self.base_sequence) + i64::from(delta);
        if next > i64::from(i32::MAX) {
            (next - i64::from(i32::MAX) - 1) as i32
        } else {
            next as i32
        }
    }
}

/// A zigzag varint; `None` when the bytes end first.
fn varint(b: &[u8], at: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

/// The first record of an uncompressed control batch as an `EndTransactionMarker`.
fn read_end_txn_marker(batch: &[u8], max_timestamp: i64, lat: bool) -> Option<(bool, i32, i64)> {
    if i16_at(batch, 21) & 0x07 != 0 {
        return None;
    }
    let mut at = 61;
    let _len = varint(batch, &mut at)?;
    at += 1; // attributes
    let ts_delta = varint(batch, &mut at)?;
    let _offset_delta = varint(batch, &mut at)?;
    let key_len = usize::try_from(varint(batch, &mut at)?).ok()?;
    let key = batch.get(at..at + key_len)?;
    at += key_len;
    let value_len = usize::try_from(varint(batch, &mut at)?).ok()?;
    let value = batch.get(at..at + value_len)?;
    if key.len() < 4 || value.len() < 6 {
        return None;
    }
    let commit = match i16_at(key, 2) {
        0 => false,
        1 => true,
        _ => return None,
    };
    // DefaultRecord.timestamp: the batch's max timestamp under LogAppendTime.
    let ts = if lat {
        max_timestamp
    } else {
        i64_at(batch, 27) + ts_delta
    };
    Some((commit, i32_at(value, 2), ts))
}

/// One `.snapshot` entry (`ProducerSnapshot.json` v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// producer_id
    pub producer_id: i64,
    /// epoch
    pub epoch: i16,
    /// last_sequence
    pub last_sequence: i32,
    /// last_offset
    pub last_offset: i64,
    /// offset_delta
    pub offset_delta: i32,
    /// timestamp
    pub timestamp: i64,
    /// coordinator_epoch
    pub coordinator_epoch: i32,
    /// current_txn_first_offset
    pub current_txn_first_offset: i64,
}

/// One `.txnindex` entry (`AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxnRow {
    /// producerId
    pub producer_id: i64,
    /// firstOffset
    pub first_offset: i64,
    /// lastOffset
    pub last_offset: i64,
    /// lastStableOffset
    pub last_stable_offset: i64,
}

/// A segment object taken apart.
#[derive(Debug, Clone)]
pub struct KafkaSegment {
    /// Trailer: topic id.
    pub topic_id: Uuid,
    /// Trailer: partition.
    pub partition: i32,
    /// Trailer: base offset.
    pub base_offset: i64,
    /// Trailer: end offset (inclusive).
    pub end_offset: i64,
    /// Trailer: section sizes `L I T X S E`.
    pub sizes: [u32; 6],
    /// The `.log`.
    pub log: Vec<u8>,
    /// The `.index`.
    pub offset_index: Vec<u8>,
    /// The `.timeindex`.
    pub time_index: Vec<u8>,
    /// The `.txnindex`.
    pub txn_index: Vec<u8>,
    /// The `.snapshot`.
    pub snapshot: Vec<u8>,
    /// The leader-epoch checkpoint.
    pub leader_epochs: Vec<u8>,
    /// The `.log`'s batches.
    pub batches: Vec<KafkaBatch>,
}

impl KafkaSegment {
    /// Split and check an object: trailer (magic, CRC, zero padding), section sizes adding up,
    /// every batch valid (framing, magic 2, CRC-32C), offsets contiguous from the trailer's base
    /// to its end.
    pub fn parse(object: &[u8]) -> Result<KafkaSegment, KafkaSegmentError> {
        if object.len() < 80 {
            return err("shorter than a trailer");
        }
        let t = &object[object.len() - 80..];
        if &t[..8] != b"DLTSEG01" {
            return err("bad trailer magic");
        }
        if u32_at(t, 76) != crc32c(&t[..76]) {
            return err("trailer CRC mismatch");
        }
        if t[68..76] != [0u8; 8] {
            return err("trailer padding");
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&t[8..24]);
        let mut sizes = [0u32; 6];
        for (i, s) in sizes.iter_mut().enumerate() {
            *s = u32_at(t, 44 + 4 * i);
        }
        let total: u64 = sizes.iter().map(|s| u64::from(*s)).sum::<u64>() + 80;
        if total != object.len() as u64 {
            return err(format!(
                "sizes add up to {total}, object is {}",
                object.len()
            ));
        }
        let mut sections = Vec::new();
        let mut at = 0usize;
        for s in sizes {
            sections.push(object[at..at + s as usize].to_vec());
            at += s as usize;
        }
        let mut seg = KafkaSegment {
            topic_id: Uuid::from_bytes(id),
            partition: i32_at(t, 24),
            base_offset: i64_at(t, 28),
            end_offset: i64_at(t, 36),
            sizes,
            log: std::mem::take(&mut sections[0]),
            offset_index: std::mem::take(&mut sections[1]),
            time_index: std::mem::take(&mut sections[2]),
            txn_index: std::mem::take(&mut sections[3]),
            snapshot: std::mem::take(&mut sections[4]),
            leader_epochs: std::mem::take(&mut sections[5]),
            batches: Vec::new(),
        };
        if seg.log.len() > i32::MAX as usize {
            return err("log over i32::MAX bytes");
        }
        let mut pos = 0usize;
        let mut next = seg.base_offset;
        while pos < seg.log.len() {
            let rest = &seg.log[pos..];
            if rest.len() < 61 {
                return err(format!("truncated batch header at {pos}"));
            }
            let size = i64::from(i32_at(rest, 8)) + 12;
            if size < 61 || size > rest.len() as i64 {
                return err(format!("bad batchLength at {pos}"));
            }
            let b = &rest[..size as usize];
            if b[16] != 2 {
                return err(format!("magic {} at {pos}", b[16]));
            }
            if u32_at(b, 17) != crc32c(&b[21..]) {
                return err(format!("batch CRC mismatch at {pos}"));
            }
            let base_offset = i64_at(b, 0);
            let delta = i32_at(b, 23);
            if base_offset != next || delta < 0 {
                return err(format!(
                    "batch at {pos} starts at {base_offset}, expected {next}"
                ));
            }
            let attributes = i16_at(b, 21);
            let max_timestamp = i64_at(b, 35);
            let end_txn_marker = if attributes & 0x20 != 0 {
                read_end_txn_marker(b, max_timestamp, attributes & 0x08 != 0)
            } else {
                None
            };
            seg.batches.push(KafkaBatch {
                position: pos as u32,
                base_offset,
                last_offset: base_offset + i64::from(delta),
                size: size as u32,
                partition_leader_epoch: i32_at(b, 12),
                attributes,
                base_timestamp: i64_at(b, 27),
                max_timestamp,
                producer_id: i64_at(b, 43),
                producer_epoch: i16_at(b, 51),
                base_sequence: i32_at(b, 53),
                records_count: i32_at(b, 57),
                end_txn_marker,
            });
            next = base_offset + i64::from(delta) + 1;
            pos += size as usize;
        }
        if seg.batches.is_empty() || next - 1 != seg.end_offset {
            return err(format!(
                "batches end at {}, trailer says {}",
                next - 1,
                seg.end_offset
            ));
        }
        Ok(seg)
    }

    /// `LogSegment.recover`'s index loop over the `.log` (indexes of unbounded capacity) and the
    /// final `timeIndex.maybeAppend(..., skipFullCheck = true)`: the `.index` and `.timeindex` bytes
    /// Kafka would rebuild.
    pub fn recover_indexes(&self, index_interval_bytes: i32) -> (Vec<u8>, Vec<u8>) {
        let mut offset_index = Vec::new();
        let mut time_index = Vec::new();
        let (mut valid_bytes, mut last_index_entry) = (0i64, 0i64);
        let (mut max_ts, mut max_ts_offset) = (-1i64, -1i64);
        // TimeIndex.lastEntry of an empty index: (NO_TIMESTAMP, baseOffset).
        let mut last_time_entry = -1i64;
        let base = self.base_offset;
        let mut maybe_append = |ts: i64, offset: i64, out: &mut Vec<u8>| {
            if ts > last_time_entry {
                out.extend_from_slice(&ts.to_be_bytes());
                out.extend_from_slice(&((offset - base) as i32).to_be_bytes());
                last_time_entry = ts;
            }
        };
        for b in &self.batches {
            if b.max_timestamp > max_ts {
                max_ts = b.max_timestamp;
                max_ts_offset = b.last_offset;
            }
            if valid_bytes - last_index_entry > i64::from(index_interval_bytes) {
                offset_index.extend_from_slice(&((b.last_offset - base) as i32).to_be_bytes());
                offset_index.extend_from_slice(&(valid_bytes as i32).to_be_bytes());
                maybe_append(max_ts, max_ts_offset, &mut time_index);
                last_index_entry = valid_bytes;
            }
            valid_bytes += i64::from(b.size);
        }
        maybe_append(max_ts, max_ts_offset, &mut time_index);
        (offset_index, time_index)
    }

    /// The stored `.index` entries as `(absolute offset, position)`.
    pub fn offset_entries(&self) -> Result<Vec<(i64, u32)>, KafkaSegmentError> {
        if !self.offset_index.len().is_multiple_of(8) {
            return err("offset index length");
        }
        Ok(self
            .offset_index
            .chunks(8)
            .map(|e| (self.base_offset + i64::from(i32_at(e, 0)), u32_at(e, 4)))
            .collect())
    }

    /// The stored `.timeindex` entries as `(timestamp, absolute offset)`.
    pub fn time_entries(&self) -> Result<Vec<(i64, i64)>, KafkaSegmentError> {
        if !self.time_index.len().is_multiple_of(12) {
            return err("time index length");
        }
        Ok(self
            .time_index
            .chunks(12)
            .map(|e| (i64_at(e, 0), self.base_offset + i64::from(i32_at(e, 8))))
            .collect())
    }

    /// `OffsetIndex.lookup` by a linear scan: the last entry with offset `≤ target`, else
    /// `(base, 0)`.
    pub fn lookup_offset(&self, target: i64) -> Result<(i64, u32), KafkaSegmentError> {
        Ok(self
            .offset_entries()?
            .into_iter()
            .take_while(|(o, _)| *o <= target)
            .last()
            .unwrap_or((self.base_offset, 0)))
    }

    /// `LogSegment.translateOffset`: index lookup, then the first batch at or after that position
    /// with `lastOffset ≥ target`.
    pub fn translate_offset(&self, target: i64) -> Result<Option<&KafkaBatch>, KafkaSegmentError> {
        let (_, pos) = self.lookup_offset(target)?;
        if !self.batches.iter().any(|b| b.position == pos) {
            return err(format!("index position {pos} is not a batch boundary"));
        }
        Ok(self
            .batches
            .iter()
            .filter(|b| b.position >= pos)
            .find(|b| b.last_offset >= target))
    }

    /// `TimeIndex.lookup` by a linear scan: the last entry with timestamp `≤ target`, else
    /// `(-1, base)`.
    pub fn lookup_timestamp(&self, target: i64) -> Result<(i64, i64), KafkaSegmentError> {
        Ok(self
            .time_entries()?
            .into_iter()
            .take_while(|(t, _)| *t <= target)
            .last()
            .unwrap_or((-1, self.base_offset)))
    }

    /// The batch step of `LogSegment.findOffsetByTimestamp`: time index, offset index, then the
    /// first batch with `maxTimestamp ≥ target` and `lastOffset ≥ starting_offset`.
    pub fn find_batch_by_timestamp(
        &self,
        target: i64,
        starting_offset: i64,
    ) -> Result<Option<&KafkaBatch>, KafkaSegmentError> {
        let (_, offset) = self.lookup_timestamp(target)?;
        let (_, pos) = self.lookup_offset(offset.max(starting_offset))?;
        Ok(self
            .batches
            .iter()
            .filter(|b| b.position >= pos)
            .find(|b| b.max_timestamp >= target && b.last_offset >= starting_offset))
    }

    /// `ProducerStateManager.readSnapshot`: version 1, CRC-32C of bytes 6..end, the entries.
    pub fn snapshot_entries(&self) -> Result<Vec<SnapshotEntry>, KafkaSegmentError> {
        let s = &self.snapshot;
        if s.len() < 10 {
            return err("snapshot shorter than its header");
        }
        if i16_at(s, 0) != 1 {
            return err("snapshot version");
        }
        if u32_at(s, 2) != crc32c(&s[6..]) {
            return err("snapshot CRC mismatch");
        }
        let count = i32_at(s, 6);
        if count < 0 || s.len() != 10 + 46 * count as usize {
            return err("snapshot count does not match its length");
        }
        Ok(s[10..]
            .chunks(46)
            .map(|e| SnapshotEntry {
                producer_id: i64_at(e, 0),
                epoch: i16_at(e, 8),
                last_sequence: i32_at(e, 10),
                last_offset: i64_at(e, 14),
                offset_delta: i32_at(e, 22),
                timestamp: i64_at(e, 26),
                coordinator_epoch: i32_at(e, 34),
                current_txn_first_offset: i64_at(e, 38),
            })
            .collect())
    }

    /// `TransactionIndex` entries: version 0, 34 bytes each.
    pub fn aborted_txns(&self) -> Result<Vec<AbortedTxnRow>, KafkaSegmentError> {
        if !self.txn_index.len().is_multiple_of(34) {
            return err("txn index length");
        }
        self.txn_index
            .chunks(34)
            .map(|e| {
                if i16_at(e, 0) != 0 {
                    return err("txn index entry version");
                }
                Ok(AbortedTxnRow {
                    producer_id: i64_at(e, 2),
                    first_offset: i64_at(e, 10),
                    last_offset: i64_at(e, 18),
                    last_stable_offset: i64_at(e, 26),
                })
            })
            .collect()
    }

    /// `LeaderEpochCheckpointFile.read`: `CheckpointFile`'s grammar (version 0, the count, then
    /// whitespace-separated `epoch startOffset` per line, the count matching).
    pub fn leader_epoch_entries(&self) -> Result<Vec<(i32, i64)>, KafkaSegmentError> {
        let text = std::str::from_utf8(&self.leader_epochs)
            .map_err(|_| KafkaSegmentError("epoch file is not UTF-8".into()))?;
        let mut lines = text.lines();
        if lines.next() != Some("0") {
            return err("epoch file version");
        }
        let count: usize = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| KafkaSegmentError("epoch file count".into()))?;
        let mut out = Vec::new();
        for line in lines {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                [e, o] => match (e.parse(), o.parse()) {
                    (Ok(e), Ok(o)) => out.push((e, o)),
                    _ => return err(format!("malformed epoch line {line:?}")),
                },
                _ => return err(format!("malformed epoch line {line:?}")),
            }
        }
        if out.len() != count {
            return err("epoch file count does not match");
        }
        Ok(out)
    }

    /// Everything that must hold of any segment built with `index_interval_bytes`: the stored
    /// indexes are what `recover()` rebuilds, the snapshot, txn index and epoch file parse, every
    /// offset of `[base, end]` is found by lookup + scan, every batch's leader epoch is 0 and every
    /// offset index position is a batch boundary.
    pub fn check(&self, index_interval_bytes: i32) -> Result<(), KafkaSegmentError> {
        let (oi, ti) = self.recover_indexes(index_interval_bytes);
        if oi != self.offset_index {
            return err("offset index differs from recover()'s");
        }
        if ti != self.time_index {
            return err("time index differs from recover()'s");
        }
        self.snapshot_entries()?;
        let aborted = self.aborted_txns()?;
        if aborted
            .windows(2)
            .any(|w| w[0].last_offset >= w[1].last_offset)
        {
            return err("txn index not in marker order");
        }
        for a in &aborted {
            if a.last_offset < self.base_offset || a.last_offset > self.end_offset {
                return err("aborted txn marker outside the segment");
            }
            let marker = self.batches.iter().find(|b| b.base_offset == a.last_offset);
            match marker {
                Some(b)
                    if b.producer_id == a.producer_id && b.end_txn_marker.is_some_and(|m| !m.0) => {
                }
                _ => return err(format!("no ABORT marker at {}", a.last_offset)),
            }
        }
        let epochs = self.leader_epoch_entries()?;
        if epochs.is_empty() || epochs.iter().any(|(_, o)| *o > self.end_offset) {
            return err("leader epochs must be non-empty and start within the segment");
        }
        for b in &self.batches {
            if b.partition_leader_epoch != 0 {
                return err("partitionLeaderEpoch is not 0");
            }
        }
        for offset in self.base_offset..=self.end_offset {
            match self.translate_offset(offset)? {
                Some(b) if b.base_offset <= offset && offset <= b.last_offset => {}
                _ => return err(format!("offset {offset} not found")),
            }
        }
        Ok(())
    }
}

/// `ProducerAppendInfo` over `previous` (a snapshot's entries) and `batches` in order, as
/// `recover()` runs it, sorted by producer id: data batches set epoch (a new epoch forgets the old
/// batch), last sequence/offset, `offsetDelta`, timestamp = `maxTimestamp`, and open a transaction
/// when transactional; end-transaction markers set epoch, coordinator epoch and timestamp and close
/// the transaction. Producers absent from `batches` are kept as they were.
pub fn fold_producer_state(
    previous: &[SnapshotEntry],
    batches: &[KafkaBatch],
) -> Vec<SnapshotEntry> {
    let mut map: BTreeMap<i64, SnapshotEntry> =
        previous.iter().map(|e| (e.producer_id, *e)).collect();
    for b in batches.iter().filter(|b| b.producer_id > -1) {
        let e = map.entry(b.producer_id).or_insert(SnapshotEntry {
            producer_id: b.producer_id,
            epoch: -1,
            last_sequence: -1,
            last_offset: -1,
            offset_delta: 0,
            timestamp: -1,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        });
        if e.epoch != b.producer_epoch {
            e.epoch = b.producer_epoch;
            e.last_sequence = -1;
            e.last_offset = -1;
            e.offset_delta = 0;
        }
        if b.is_control() {
            if let Some((_, coordinator_epoch, ts)) = b.end_txn_marker {
                e.coordinator_epoch = coordinator_epoch;
                e.current_txn_first_offset = -1;
                e.timestamp = ts;
            }
        } else {
            e.last_sequence = b.last_sequence();
            e.last_offset = b.last_offset;
            e.offset_delta = (b.last_offset - b.base_offset) as i32;
            e.timestamp = b.max_timestamp;
            if b.is_transactional() && e.current_txn_first_offset < 0 {
                e.current_txn_first_offset = b.base_offset;
            }
        }
    }
    map.into_values().collect()
}

/// `ProducerStateManager.writeSnapshot`'s bytes for `entries` in the given order.
pub fn encode_snapshot(entries: &[SnapshotEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&1i16.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for e in entries {
        out.extend_from_slice(&e.producer_id.to_be_bytes());
        out.extend_from_slice(&e.epoch.to_be_bytes());
        out.extend_from_slice(&e.last_sequence.to_be_bytes());
        out.extend_from_slice(&e.last_offset.to_be_bytes());
        out.extend_from_slice(&e.offset_delta.to_be_bytes());
        out.extend_from_slice(&e.timestamp.to_be_bytes());
        out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
        out.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
    }
    let crc = crc32c(&out[6..]);
    out[2..6].copy_from_slice(&crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn varints() {
        let mut at = 0;
        assert_eq!(varint(&[0x01], &mut at), Some(-1));
        let mut at = 0;
        assert_eq!(varint(&[0xac, 0x02], &mut at), Some(150));
        let mut at = 0;
        assert_eq!(varint(&[0x80], &mut at), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(KafkaSegment::parse(&[0; 79]).is_err());
        assert!(KafkaSegment::parse(&[0; 80]).is_err());
    }
}
