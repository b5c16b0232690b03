//! What the simulation knows to be true: every batch sent, every acknowledgement, every batch
//! observed at an offset, and the invariants checked against them.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use diskless_coordinator::TopicIdPartition;
use diskless_core::compression::decompress;
use diskless_core::control::parse_end_txn_marker;
use diskless_core::{RecordBatch, RecordIter};

/// Invariant 1: every acknowledged batch is readable at its offset, byte for byte; an idempotent
/// producer's batch appears at most once (exactly once when acknowledged).
pub const ACKED_READABLE: &str = "acked-readable";
/// Invariant 2: offsets are gap-free and never reused; the high watermark (and log start) never go
/// back.
pub const OFFSETS: &str = "offsets";
/// Invariant 3: no object referenced by a live batch is missing; after the quiet period every
/// stored object is referenced by a live batch.
pub const OBJECTS: &str = "objects";
/// Invariant 4: memory bounds, produce answers within their bound, `close()` returns.
pub const BOUNDS: &str = "bounds";
/// Invariant 5: a consumer never sees a batch twice or out of order.
pub const CONSUMER: &str = "consumer";
/// Invariant 6: a `read_committed` consumer never returns a record of an aborted transaction or
/// of one not yet decided.
pub const NO_DIRTY_READ: &str = "no-dirty-read";
/// Invariant 7: every acknowledged batch of a committed transaction is returned to the
/// `read_committed` consumer of its partition exactly once (unless retention or DeleteRecords
/// removed it first), never skipped as aborted.
pub const NO_LOST_COMMIT: &str = "no-lost-commit";
/// Invariant 8: the last stable offset never goes back, stays within the log start and the high
/// watermark, bounds what `read_committed` fetches return, and reaches the high watermark once
/// every transaction ended (none hangs).
pub const LSO: &str = "lso";
/// Invariant 9: a transaction has one outcome in every partition: its markers are of the type the
/// transaction coordinator decided, and no reader returns it in one partition and skips it as
/// aborted in another.
pub const ATOMIC: &str = "atomic";
/// Invariant 10: the tiered segments of a partition ascend without gap or overlap, end below the
/// high watermark, share no offset with its WAL batches (the two tiers are one contiguous log),
/// and every registered segment's object is in the store.
pub const TIERED: &str = "tiered";
/// Not an invariant: the run could not be set up (a component failed to build).
pub const SETUP: &str = "setup";

/// A failed check: the invariant and what was seen.
pub(crate) type Fail = (&'static str, String);

/// A logical batch: (producer index, batch number of that producer).
pub(crate) type BatchId = (u32, u32);

/// A transaction: (producer id, transaction number issued by the transaction coordinator).
pub(crate) type TxnKey = (i64, i64);

/// The id [`Seen`] records for a marker (no producer has this index).
const MARKER_ID: BatchId = (u32::MAX, 0);

/// What the simulation knows of one transaction.
#[derive(Debug, Default)]
pub(crate) struct TxnInfo {
    /// The transaction coordinator's decision (`Some(true)`: commit), taken before any marker.
    pub(crate) outcome: Option<bool>,
    /// Every marker written.
    pub(crate) done: bool,
    /// Partitions where a `read_committed` consumer returned its batches / skipped them as
    /// aborted.
    delivered_in: BTreeSet<TopicIdPartition>,
    skipped_in: BTreeSet<TopicIdPartition>,
}

/// A marker the transaction coordinator wrote (its answer named the offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerInfo {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) commit: bool,
}

/// The `read_committed` consumer of a partition: what it returned, and the ranges it jumped over
/// (`OFFSET_OUT_OF_RANGE`: retention or DeleteRecords took them).
#[derive(Debug, Default)]
struct RcView {
    delivered: BTreeMap<BatchId, i64>,
    jumps: Vec<(i64, i64)>,
    caught_up: bool,
}

/// The record values of batch `id`: `p<producer>.b<batch>.r<index>;` and padding.
pub(crate) fn record_value(id: BatchId, index: usize, pad: usize) -> Vec<u8> {
    let mut v = format!("p{}.b{}.r{index};", id.0, id.1).into_bytes();
    v.extend((0..pad).map(|i| b'a' + ((i * 7 + index) % 26) as u8));
    v
}

/// The batch id written in a served batch's records (every record must carry the same).
fn batch_id_of(batch: &RecordBatch) -> Result<BatchId, String> {
    let count = usize::try_from(batch.records_count()).unwrap_or(0);
    let codec = batch
        .attributes()
        .compression()
        .ok_or_else(|| "unknown compression codec".to_string())?;
    let mut body = Vec::new();
    decompress(codec, &batch.records_bytes(), 1 << 24, &mut body)
        .map_err(|e| format!("records do not decompress: {e}"))?;
    let mut id = None;
    for (index, record) in RecordIter::new(&body, count).enumerate() {
        let record = record.map_err(|e| format!("record {index} does not parse: {e:?}"))?;
        let value = record
            .value
            .ok_or_else(|| format!("record {index} has no value"))?;
        let text = std::str::from_utf8(value).map_err(|_| format!("record {index}: not UTF-8"))?;
        let head = text.split(';').next().unwrap_or("");
        let mut parts = head.split('.');
        let mut num = |prefix: char| {
            parts
                .next()
                .and_then(|p| p.strip_prefix(prefix))
                .and_then(|n| n.parse::<u32>().ok())
        };
        let (Some(p), Some(b), Some(r)) = (num('p'), num('b'), num('r')) else {
            return Err(format!(
                "record {index} value {head:?} is not one the simulation wrote"
            ));
        };
        if r as usize != index || id.is_some_and(|i| i != (p, b)) {
            return Err(format!(
                "record {index} value {head:?} does not belong here"
            ));
        }
        id = Some((p, b));
    }
    id.ok_or_else(|| "a batch without records".to_string())
}

/// One batch a producer sent (the same bytes on every attempt).
#[derive(Debug)]
pub(crate) struct Sent {
    pub(crate) partition: TopicIdPartition,
    pub(crate) bytes: Bytes,
    pub(crate) idempotent: bool,
    pub(crate) log_append_time: bool,
    /// Acknowledged at (base offset, log append time).
    pub(crate) acked: Option<(i64, i64)>,
    /// Base offsets it was seen at.
    pub(crate) seen_at: BTreeSet<i64>,
    /// The transaction it belongs to (a transactional batch).
    pub(crate) txn: Option<TxnKey>,
}

/// A batch seen at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    id: BatchId,
    last: i64,
    /// The served max timestamp (LogAppendTime topics: the commit time).
    max_timestamp: i64,
}

#[derive(Debug, Default)]
struct Part {
    /// The largest high watermark and log start offset observed.
    hw: i64,
    lso: i64,
    /// The high watermark every acknowledgement so far implies.
    acked_end: i64,
    seen: BTreeMap<i64, Seen>,
    acks: BTreeMap<i64, BatchId>,
    /// The largest last stable offset observed.
    stable: i64,
    /// Markers by offset: written (from the coordinator's answers) and served.
    markers: BTreeMap<i64, MarkerInfo>,
    served_markers: BTreeMap<i64, MarkerInfo>,
}

/// Checks one reader's view of a partition: contiguous offsets, and each idempotent producer's
/// batches in the order it sent them.
#[derive(Debug, Default)]
pub(crate) struct ReadOrder {
    last_batch: BTreeMap<u32, u32>,
}

impl ReadOrder {
    pub(crate) fn check(
        &mut self,
        oracle: &Oracle,
        id: BatchId,
        invariant: &'static str,
    ) -> Result<(), Fail> {
        if !oracle.sent.get(&id).is_some_and(|s| s.idempotent) {
            return Ok(());
        }
        if let Some(prev) = self.last_batch.insert(id.0, id.1)
            && prev >= id.1
        {
            return Err((
                invariant,
                format!(
                    "idempotent producer {} : batch {} read after batch {prev}",
                    id.0, id.1
                ),
            ));
        }
        Ok(())
    }
}

/// The simulation's knowledge.
#[derive(Debug, Default)]
pub(crate) struct Oracle {
    pub(crate) sent: BTreeMap<BatchId, Sent>,
    parts: BTreeMap<TopicIdPartition, Part>,
    pub(crate) txns: BTreeMap<TxnKey, TxnInfo>,
    rc: BTreeMap<TopicIdPartition, RcView>,
}

/// Byte ranges of a v2 batch header (the base offset is 0..8, the CRC 17..21).
const LEADER_EPOCH: std::ops::Range<usize> = 12..16;
const ATTRIBUTES: std::ops::Range<usize> = 21..23;
const MAX_TIMESTAMP: std::ops::Range<usize> = 35..43;

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    i64::from_be_bytes(a)
}

impl Oracle {
    pub(crate) fn add_partition(&mut self, p: TopicIdPartition) {
        self.parts.entry(p).or_default();
    }

    /// Forgets a deleted topic.
    pub(crate) fn remove_topic(&mut self, topic: uuid::Uuid) {
        self.parts.retain(|p, _| p.topic_id != topic);
        self.sent.retain(|_, s| s.partition.topic_id != topic);
        self.rc.retain(|p, _| p.topic_id != topic);
    }

    /// The high watermark and log start offset any answer obtained from now on must reach.
    pub(crate) fn floors(&self, p: TopicIdPartition) -> (i64, i64) {
        self.parts
            .get(&p)
            .map_or((0, 0), |s| (s.hw.max(s.acked_end), s.lso))
    }

    /// A high watermark and log start offset read after `floors` were taken.
    pub(crate) fn observe(
        &mut self,
        p: TopicIdPartition,
        hw: i64,
        lso: i64,
        floors: (i64, i64),
        source: &str,
    ) -> Result<(), Fail> {
        let Some(s) = self.parts.get_mut(&p) else {
            return Ok(());
        };
        if hw < floors.0 {
            return Err((
                OFFSETS,
                format!(
                    "{source}: partition {p} high watermark {hw} after {} was observed or implied by an acknowledgement",
                    floors.0
                ),
            ));
        }
        if lso < floors.1 {
            return Err((
                OFFSETS,
                format!(
                    "{source}: partition {p} log start offset {lso} after {} was observed",
                    floors.1
                ),
            ));
        }
        if lso > hw {
            return Err((
                OFFSETS,
                format!("{source}: partition {p} log start {lso} above high watermark {hw}"),
            ));
        }
        s.hw = s.hw.max(hw);
        s.lso = s.lso.max(lso);
        Ok(())
    }

    /// DeleteRecords moved the log start to `lso`.
    pub(crate) fn log_start_moved(&mut self, p: TopicIdPartition, lso: i64) {
        if let Some(s) = self.parts.get_mut(&p) {
            s.lso = s.lso.max(lso);
        }
    }

    /// A producer got an acknowledgement.
    pub(crate) fn ack(&mut self, id: BatchId, base: i64, log_append_time: i64) -> Result<(), Fail> {
        let Some(sent) = self.sent.get_mut(&id) else {
            return Ok(());
        };
        let p = sent.partition;
        let records = i64::from(
            RecordBatch::parse(sent.bytes.clone()).map_or(1, |b| b.last_offset_delta() + 1),
        );
        if let Some((prev, _)) = sent.acked
            && prev != base
            && sent.idempotent
        {
            return Err((
                ACKED_READABLE,
                format!("idempotent batch {id:?} acknowledged at {prev} and again at {base}"),
            ));
        }
        if sent.idempotent
            && let Some(other) = sent.seen_at.iter().find(|o| **o != base)
        {
            return Err((
                ACKED_READABLE,
                format!("idempotent batch {id:?} acknowledged at {base} but read at {other}"),
            ));
        }
        sent.acked = Some((base, log_append_time));
        let Some(part) = self.parts.get_mut(&p) else {
            return Ok(());
        };
        if let Some(other) = part.acks.insert(base, id)
            && other != id
        {
            return Err((
                OFFSETS,
                format!("partition {p} offset {base} acknowledged to {other:?} and to {id:?}"),
            ));
        }
        if let Some(seen) = part.seen.get(&base)
            && seen.id != id
        {
            return Err((
                OFFSETS,
                format!(
                    "partition {p} offset {base} acknowledged to {id:?} but holds {:?}",
                    seen.id
                ),
            ));
        }
        part.acked_end = part.acked_end.max(base + records);
        Ok(())
    }

    /// A batch served at its offset in `p` (by a consumer's fetch or the final scan), with the
    /// partition leader epoch the reader asked for. Checks it is a batch some producer sent, byte
    /// for byte except what the broker injects, and that it agrees with everything seen and
    /// acknowledged at that offset. Returns its id.
    pub(crate) fn served(
        &mut self,
        p: TopicIdPartition,
        batch: &RecordBatch,
        leader_epoch: i32,
        source: &str,
    ) -> Result<BatchId, Fail> {
        let base = batch.base_offset();
        let last = batch.last_offset();
        let at = format!("{source}: partition {p} offset {base}");
        if !batch.crc_is_valid() {
            return Err((ACKED_READABLE, format!("{at}: CRC does not match")));
        }
        let id = batch_id_of(batch).map_err(|e| (ACKED_READABLE, format!("{at}: {e}")))?;
        let Some(sent) = self.sent.get_mut(&id) else {
            return Err((ACKED_READABLE, format!("{at}: batch {id:?} was never sent")));
        };
        if sent.partition != p {
            return Err((
                ACKED_READABLE,
                format!(
                    "{at}: batch {id:?} was sent to partition {}",
                    sent.partition
                ),
            ));
        }
        let served = batch.as_bytes();
        let wanted = &sent.bytes;
        if served.len() != wanted.len() {
            return Err((
                ACKED_READABLE,
                format!(
                    "{at}: batch {id:?} served with {} bytes, sent with {}",
                    served.len(),
                    wanted.len()
                ),
            ));
        }
        if served[LEADER_EPOCH] != leader_epoch.to_be_bytes() {
            return Err((
                ACKED_READABLE,
                format!("{at}: partition leader epoch not the one asked for"),
            ));
        }
        let same = |r: std::ops::Range<usize>| served[r.clone()] == wanted[r];
        let rest_same = if sent.log_append_time {
            let attributes_ok = {
                let sent_attr = u16::from_be_bytes([wanted[21], wanted[22]]);
                u16::from_be_bytes([served[21], served[22]]) == sent_attr | 0x08
            };
            same(8..12)
                && same(16..17)
                && attributes_ok
                && same(ATTRIBUTES.end..MAX_TIMESTAMP.start)
                && same(MAX_TIMESTAMP.end..served.len())
        } else {
            same(8..12) && same(16..served.len())
        };
        if !rest_same {
            return Err((
                ACKED_READABLE,
                format!("{at}: batch {id:?} served bytes differ from the bytes sent"),
            ));
        }
        let max_timestamp = be_i64(&served[MAX_TIMESTAMP]);
        if sent.idempotent
            && let Some(other) = sent.seen_at.iter().find(|o| **o != base)
        {
            return Err((
                ACKED_READABLE,
                format!("{at}: idempotent batch {id:?} also appears at offset {other}"),
            ));
        }
        if let Some((acked, lat)) = sent.acked {
            if acked == base && sent.log_append_time && max_timestamp != lat {
                return Err((
                    ACKED_READABLE,
                    format!(
                        "{at}: batch {id:?} served with LogAppendTime {max_timestamp}, acknowledged with {lat}"
                    ),
                ));
            }
            if acked != base && sent.idempotent {
                return Err((
                    ACKED_READABLE,
                    format!("{at}: idempotent batch {id:?} acknowledged at offset {acked}"),
                ));
            }
        }
        sent.seen_at.insert(base);
        let Some(part) = self.parts.get_mut(&p) else {
            return Ok(id);
        };
        let seen = Seen {
            id,
            last,
            max_timestamp,
        };
        match part.seen.get(&base) {
            Some(prev) if *prev != seen => {
                return Err((
                    OFFSETS,
                    format!("{at}: now {seen:?}, earlier {prev:?}: the offset was reused"),
                ));
            }
            Some(_) => {}
            None => {
                if let Some((b, prev)) = part.seen.range(..base).next_back()
                    && prev.last >= base
                {
                    return Err((
                        OFFSETS,
                        format!(
                            "{at}: overlaps the batch {:?} seen at {b}..={}",
                            prev.id, prev.last
                        ),
                    ));
                }
                if let Some((b, next)) = part.seen.range(base + 1..).next()
                    && *b <= last
                {
                    return Err((
                        OFFSETS,
                        format!(
                            "{at}..={last}: overlaps the batch {:?} seen at {b}",
                            next.id
                        ),
                    ));
                }
                if part.markers.contains_key(&base) {
                    return Err((
                        OFFSETS,
                        format!("{at}: holds {id:?} but a marker was written there"),
                    ));
                }
                if let Some(acked) = part.acks.get(&base)
                    && *acked != id
                {
                    return Err((
                        OFFSETS,
                        format!("{at}: holds {id:?} but {acked:?} was acknowledged there"),
                    ));
                }
                part.seen.insert(base, seen);
            }
        }
        Ok(id)
    }

    /// After a full scan of `p` from its log start `lso` to its high watermark: every
    /// acknowledged batch at or above the log start was in the scan.
    pub(crate) fn acked_present(
        &self,
        p: TopicIdPartition,
        lso: i64,
        scanned: &BTreeMap<i64, BatchId>,
    ) -> Result<usize, Fail> {
        let Some(part) = self.parts.get(&p) else {
            return Ok(0);
        };
        let mut checked = 0;
        for (base, id) in part.acks.range(lso..) {
            match scanned.get(base) {
                Some(found) if found == id => checked += 1,
                Some(found) => {
                    return Err((
                        ACKED_READABLE,
                        format!(
                            "partition {p}: batch {id:?} acknowledged at {base}, the log holds {found:?} there"
                        ),
                    ));
                }
                None => {
                    return Err((
                        ACKED_READABLE,
                        format!(
                            "partition {p}: batch {id:?} acknowledged at {base} is not in the log (log start {lso})"
                        ),
                    ));
                }
            }
        }
        Ok(checked)
    }

    /// The largest last stable offset observed in `p` (a floor for answers obtained from now on).
    pub(crate) fn stable_floor(&self, p: TopicIdPartition) -> i64 {
        self.parts.get(&p).map_or(0, |s| s.stable.max(s.lso))
    }

    /// A last stable offset read (with the high watermark and log start of the same answer) after
    /// `floor` was taken.
    pub(crate) fn observe_stable(
        &mut self,
        p: TopicIdPartition,
        stable: i64,
        hw: i64,
        log_start: i64,
        floor: i64,
        source: &str,
    ) -> Result<(), Fail> {
        let Some(s) = self.parts.get_mut(&p) else {
            return Ok(());
        };
        if stable < floor || stable > hw || stable < log_start {
            return Err((
                LSO,
                format!(
                    "{source}: partition {p} last stable offset {stable} (log start {log_start}, high watermark {hw}) after {floor} was observed"
                ),
            ));
        }
        s.stable = s.stable.max(stable);
        Ok(())
    }

    /// The transaction coordinator decided `t`.
    pub(crate) fn decide(&mut self, t: TxnKey, commit: bool) -> Result<(), Fail> {
        let info = self.txns.entry(t).or_default();
        match info.outcome {
            Some(o) if o != commit => Err((
                ATOMIC,
                format!("transaction {t:?} decided twice, differently"),
            )),
            _ => {
                info.outcome = Some(commit);
                Ok(())
            }
        }
    }

    /// A marker of a transaction released early (see `TxnParams::release_early_one_in`) answered
    /// as a repeat: `offset` is then the producer's last marker in `p`, which may be a later
    /// transaction's (this one has nothing open there), or `-1`. It must be one of the producer's
    /// markers; it is not recorded as this transaction's.
    pub(crate) fn marker_repeated(
        &self,
        p: TopicIdPartition,
        offset: i64,
        producer_id: i64,
    ) -> Result<(), Fail> {
        let Some(part) = self.parts.get(&p) else {
            return Ok(());
        };
        match part.markers.get(&offset) {
            Some(m) if m.producer_id != producer_id => Err((
                OFFSETS,
                format!(
                    "partition {p}: a repeated marker of producer {producer_id} answered {offset}, \
                     producer {}'s marker",
                    m.producer_id
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The coordinator answered that `marker` is at `offset` of `p`.
    pub(crate) fn marker_written(
        &mut self,
        p: TopicIdPartition,
        offset: i64,
        marker: MarkerInfo,
    ) -> Result<(), Fail> {
        let Some(part) = self.parts.get_mut(&p) else {
            return Ok(());
        };
        if let Some(prev) = part.markers.insert(offset, marker)
            && prev != marker
        {
            return Err((
                OFFSETS,
                format!(
                    "partition {p}: offset {offset} answered for marker {prev:?} and {marker:?}"
                ),
            ));
        }
        if let Some(seen) = part.seen.get(&offset)
            && seen.id != MARKER_ID
        {
            return Err((
                OFFSETS,
                format!(
                    "partition {p}: marker {marker:?} answered at {offset}, which holds batch {:?}",
                    seen.id
                ),
            ));
        }
        if let Some(id) = part.acks.get(&offset) {
            return Err((
                OFFSETS,
                format!(
                    "partition {p}: marker {marker:?} answered at {offset}, acknowledged to {id:?}"
                ),
            ));
        }
        if let Some(served) = part.served_markers.get(&offset)
            && *served != marker
        {
            return Err((
                ATOMIC,
                format!(
                    "partition {p}: the marker at {offset} was served as {served:?}, the coordinator wrote {marker:?}"
                ),
            ));
        }
        Ok(())
    }

    /// A control batch served at its offset in `p`: a well-formed marker with the partition leader
    /// epoch asked for, at an offset no data batch holds, the marker the coordinator wrote there.
    pub(crate) fn served_marker(
        &mut self,
        p: TopicIdPartition,
        batch: &RecordBatch,
        leader_epoch: i32,
        source: &str,
    ) -> Result<MarkerInfo, Fail> {
        let base = batch.base_offset();
        let at = format!("{source}: partition {p} offset {base}");
        let parsed = parse_end_txn_marker(batch.as_bytes())
            .map_err(|e| (ACKED_READABLE, format!("{at}: control batch: {e}")))?;
        if parsed.partition_leader_epoch != leader_epoch {
            return Err((
                ACKED_READABLE,
                format!("{at}: marker's partition leader epoch not the one asked for"),
            ));
        }
        let marker = MarkerInfo {
            producer_id: parsed.producer_id,
            producer_epoch: parsed.producer_epoch,
            commit: parsed.commit,
        };
        let Some(part) = self.parts.get_mut(&p) else {
            return Ok(marker);
        };
        if let Some(written) = part.markers.get(&base)
            && *written != marker
        {
            return Err((
                ATOMIC,
                format!("{at}: marker served as {marker:?}, the coordinator wrote {written:?}"),
            ));
        }
        if let Some(id) = part.acks.get(&base) {
            return Err((
                OFFSETS,
                format!("{at}: a marker where batch {id:?} was acknowledged"),
            ));
        }
        let seen = Seen {
            id: MARKER_ID,
            last: base,
            max_timestamp: parsed.timestamp,
        };
        match part.seen.get(&base) {
            Some(prev) if *prev != seen => {
                return Err((
                    OFFSETS,
                    format!("{at}: now marker {marker:?}, earlier {prev:?}: the offset was reused"),
                ));
            }
            Some(_) => {}
            None => {
                if let Some((b, prev)) = part.seen.range(..base).next_back()
                    && prev.last >= base
                {
                    return Err((
                        OFFSETS,
                        format!(
                            "{at}: a marker inside the batch {:?} seen at {b}..={}",
                            prev.id, prev.last
                        ),
                    ));
                }
                part.seen.insert(base, seen);
            }
        }
        if let Some(prev) = part.served_markers.insert(base, marker)
            && prev != marker
        {
            return Err((
                ATOMIC,
                format!("{at}: marker served as {prev:?} and {marker:?}"),
            ));
        }
        Ok(marker)
    }

    /// The `read_committed` consumer of `p` returned batch `id` (served at `base`).
    pub(crate) fn rc_returned(
        &mut self,
        p: TopicIdPartition,
        id: BatchId,
        base: i64,
    ) -> Result<(), Fail> {
        let txn = self.sent.get(&id).and_then(|s| s.txn);
        if let Some(t) = txn {
            let info = self.txns.entry(t).or_default();
            if info.outcome != Some(true) {
                let state = match info.outcome {
                    Some(_) => "aborted",
                    None => "undecided",
                };
                return Err((
                    NO_DIRTY_READ,
                    format!(
                        "read_committed consumer of {p} returned batch {id:?} at {base} of the {state} transaction {t:?}"
                    ),
                ));
            }
            info.delivered_in.insert(p);
            if let Some(other) = info.skipped_in.iter().next() {
                return Err((
                    ATOMIC,
                    format!(
                        "transaction {t:?} returned in {p} (batch {id:?} at {base}) but skipped as aborted in {other}"
                    ),
                ));
            }
            let view = self.rc.entry(p).or_default();
            if let Some(prev) = view.delivered.insert(id, base) {
                return Err((
                    NO_LOST_COMMIT,
                    format!(
                        "read_committed consumer of {p} returned batch {id:?} at {prev} and again at {base}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The `read_committed` consumer of `p` skipped batch `id` (at `base`) as aborted.
    pub(crate) fn rc_skipped(
        &mut self,
        p: TopicIdPartition,
        id: BatchId,
        base: i64,
    ) -> Result<(), Fail> {
        let Some(t) = self.sent.get(&id).and_then(|s| s.txn) else {
            return Err((
                NO_LOST_COMMIT,
                format!(
                    "read_committed consumer of {p} skipped batch {id:?} at {base}, not transactional"
                ),
            ));
        };
        let info = self.txns.entry(t).or_default();
        if info.outcome != Some(false) {
            return Err((
                NO_LOST_COMMIT,
                format!(
                    "read_committed consumer of {p} skipped batch {id:?} at {base} as aborted; transaction {t:?} is {:?} (Some(true): committed)",
                    info.outcome
                ),
            ));
        }
        info.skipped_in.insert(p);
        if let Some(other) = info.delivered_in.iter().next() {
            return Err((
                ATOMIC,
                format!("transaction {t:?} skipped as aborted in {p} but returned in {other}"),
            ));
        }
        Ok(())
    }

    /// The `read_committed` consumer of `p` jumped from `from` to the log start `to`.
    pub(crate) fn rc_jumped(&mut self, p: TopicIdPartition, from: i64, to: i64) {
        self.rc.entry(p).or_default().jumps.push((from, to));
    }

    /// The `read_committed` consumer of `p` caught up with the end of the log.
    pub(crate) fn rc_caught_up(&mut self, p: TopicIdPartition) {
        self.rc.entry(p).or_default().caught_up = true;
    }

    /// After every transaction ended and the `read_committed` consumers caught up: each of them
    /// returned every acknowledged batch of every committed transaction of its partition that was
    /// not removed before it got there. Returns how many batches were checked.
    pub(crate) fn committed_returned(&self) -> Result<usize, Fail> {
        let mut checked = 0;
        for (id, sent) in &self.sent {
            let (Some(t), Some((base, _))) = (sent.txn, sent.acked) else {
                continue;
            };
            if self.txns.get(&t).and_then(|i| i.outcome) != Some(true) {
                continue;
            }
            let p = sent.partition;
            let Some(view) = self.rc.get(&p).filter(|v| v.caught_up) else {
                return Err((
                    NO_LOST_COMMIT,
                    format!(
                        "no read_committed consumer of {p} caught up (batch {id:?} of committed {t:?})"
                    ),
                ));
            };
            if view
                .jumps
                .iter()
                .any(|(from, to)| *from <= base && base < *to)
            {
                continue;
            }
            match view.delivered.get(id) {
                Some(at) if *at == base => checked += 1,
                Some(at) => {
                    return Err((
                        NO_LOST_COMMIT,
                        format!(
                            "batch {id:?} of committed {t:?} acknowledged at {base}, returned at {at} in {p}"
                        ),
                    ));
                }
                None => {
                    return Err((
                        NO_LOST_COMMIT,
                        format!(
                            "batch {id:?} of committed {t:?} acknowledged at {base} in {p} never returned to its read_committed consumer"
                        ),
                    ));
                }
            }
        }
        Ok(checked)
    }

    /// The acknowledged batches of `p`.
    pub(crate) fn acked_count(&self, p: TopicIdPartition) -> usize {
        self.parts.get(&p).map_or(0, |s| s.acks.len())
    }
}
