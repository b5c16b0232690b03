//! Fetching from tiered segments (issue #15, `docs/tiered-consolidation.md` §2.7): Kafka's
//! `RemoteLogManager.read` + `RemoteIndexCache.lookupOffset`, over one segment object per segment.
//!
//! Per partition, with the fetch's KIP-74 state:
//!
//! 1. the segment holding the fetch offset: its `.index` section is read through the cache (block
//!    keys over the segment object's byte space, as for WAL objects: a warm index costs no GET) and
//!    [`OffsetIndex::lookup`] gives the position of the batch to start the scan at (position 0, no
//!    index read, when the fetch offset is at or below the segment's base);
//! 2. one ranged read of the `.log` from there, sized by the byte budget (the next index entry
//!    bounds how far the wanted batch can be), extended when the first batch to serve is not whole
//!    in it (KIP-74: the first batch of a fetch is served whatever its size);
//! 3. the batches are walked (framing, contiguity — or, in a compacted segment, increasing
//!    offsets —, inside the segment's range), those below the
//!    fetch offset skipped, the others served while the limits allow, each as the stored batch with
//!    `partitionLeaderEpoch` overwritten by the host's epoch — outside the CRC, so no CRC work: a
//!    batch is byte-identical to what the WAL tier serves for the same offsets;
//! 4. at the end of a segment the next one is read from position 0 (no index), and after the last
//!    segment the WAL batches follow (read as for a partition without tiered segments) while the
//!    limits allow. Offsets between two segments, or between the last one and the WAL tier, are
//!    ones compaction removed (issue #29): a fetch there continues at the next batch, as Kafka's
//!    does on a compacted topic.
//!
//! A segment that does not frame, whose index points at the wrong batch or whose batches leave its
//! range fails the partition with `KAFKA_STORAGE_ERROR` after the batches already taken, as a WAL
//! batch that fails its checks does: never wrong bytes.
//!
//! For `read_committed`, the aborted transactions of the served tiered range come from the
//! segments' `.txnindex` sections ([`collect_aborted_txns`], Kafka's `collectAbortedTxns`).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use diskless_coordinator::{AbortedTxn, BatchCoordinate, FindBatchesResponse, TieredSegment};
use futures::StreamExt;

use super::{FetchPartition, Fetcher, ReadStats};
use crate::batch::{
    ATTRIBUTES_OFFSET, Attributes, BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, HEADER_LEN,
    LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD, MAGIC_OFFSET, MAGIC_V2, MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET, RECORDS_COUNT_OFFSET,
};
use crate::tiered::format::{
    AbortedTxnEntry, OffsetIndex, ProducerSnapshotEntry, Section, SegmentLayout, TimeIndex,
    collect_aborted_txns, parse_producer_snapshot, parse_txn_index,
};

/// Segments listed per coordinator call when the aborted-transaction search goes past the
/// segments a fetch was given.
const LIST_PAGE: u32 = 64;
/// The most bytes a first read covers to reach the batch holding the fetch offset past the indexed
/// one, on top of the byte budget (index entries are `index.interval.bytes` apart, 4 KiB by
/// default; a longer gap is read in windows as the walk gets there).
const MAX_SKIP_READ: u64 = 1 << 20;

/// The header of one batch of a segment's `.log`, as the walk reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentBatch {
    /// Its position in the `.log`.
    pub(crate) position: u64,
    /// `baseOffset`.
    pub(crate) base_offset: i64,
    /// `baseOffset + lastOffsetDelta`.
    pub(crate) last_offset: i64,
    /// `batchLength + 12`.
    pub(crate) size: u32,
    /// `maxTimestamp`.
    pub(crate) max_timestamp: i64,
    /// `attributes`.
    pub(crate) attributes: Attributes,
    /// `recordsCount`: below `last_offset − base_offset + 1` in a compacted segment.
    pub(crate) records_count: i32,
}

impl SegmentBatch {
    /// Where the batch ends in the `.log`.
    pub(crate) fn end(&self) -> u64 {
        self.position + u64::from(self.size)
    }
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(x)
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    i32::from_be_bytes(x)
}

/// One segment object being read: its sections through the fetcher's cache, and a window of its
/// `.log` (the last range read), so that a walk reads each byte once.
pub(crate) struct SegmentReader<'a> {
    fetcher: &'a Fetcher,
    segment: &'a TieredSegment,
    layout: SegmentLayout,
    /// The `.log` bytes `window_start..window_start + window.len()`.
    window: Bytes,
    window_start: u64,
    /// Where the bytes read came from.
    pub(crate) stats: ReadStats,
}

impl<'a> SegmentReader<'a> {
    /// A reader of `segment`, or why its coordinator row cannot describe a segment object.
    pub(crate) fn new(fetcher: &'a Fetcher, segment: &'a TieredSegment) -> Result<Self, String> {
        let layout = segment.layout;
        if layout.log == 0
            || layout.log > SegmentLayout::MAX_LOG_LEN
            || layout.object_size() > segment.object_size
            || segment.base_offset > segment.end_offset
        {
            return Err(format!(
                "tiered segment {} ({}..={}) has an impossible layout {layout:?} for {} bytes",
                segment.object_key, segment.base_offset, segment.end_offset, segment.object_size
            ));
        }
        Ok(SegmentReader {
            fetcher,
            segment,
            layout,
            window: Bytes::new(),
            window_start: 0,
            stats: ReadStats::default(),
        })
    }

    /// The `.log` size.
    pub(crate) fn log_len(&self) -> u64 {
        self.layout.log
    }

    fn describe(&self) -> String {
        format!(
            "tiered segment {} ({}..={})",
            self.segment.object_key, self.segment.base_offset, self.segment.end_offset
        )
    }

    /// Bytes `range` of the object (non-empty), through the cache.
    async fn read(&mut self, range: Range<u64>) -> Result<Bytes, String> {
        let (mut parts, stats) = self
            .fetcher
            .read_object(
                &self.segment.object_key,
                self.segment.object_size,
                std::slice::from_ref(&range),
            )
            .await
            .map_err(|e| format!("reading {}: {e}", self.describe()))?;
        self.stats.add(stats);
        match parts.pop() {
            Some(bytes) if parts.is_empty() && bytes.len() as u64 == range.end - range.start => {
                Ok(bytes)
            }
            _ => Err(format!("reading {}: short read", self.describe())),
        }
    }

    /// A whole section (empty without a read when the section is).
    pub(crate) async fn section(&mut self, section: Section) -> Result<Bytes, String> {
        let range = self.layout.range(section);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.read(range).await
    }

    /// The `.index`.
    pub(crate) async fn offset_index(&mut self) -> Result<OffsetIndex, String> {
        let bytes = self.section(Section::OffsetIndex).await?;
        OffsetIndex::parse(self.segment.base_offset, bytes)
            .map_err(|e| format!("{}: {e}", self.describe()))
    }

    /// The `.timeindex`.
    pub(crate) async fn time_index(&mut self) -> Result<TimeIndex, String> {
        let bytes = self.section(Section::TimeIndex).await?;
        TimeIndex::parse(self.segment.base_offset, bytes)
            .map_err(|e| format!("{}: {e}", self.describe()))
    }

    /// The `.txnindex` entries.
    pub(crate) async fn txn_index(&mut self) -> Result<Vec<AbortedTxnEntry>, String> {
        let bytes = self.section(Section::TxnIndex).await?;
        parse_txn_index(&bytes).map_err(|e| format!("{}: {e}", self.describe()))
    }

    /// The producer-state snapshot at the segment's end.
    pub(crate) async fn producer_snapshot(&mut self) -> Result<Vec<ProducerSnapshotEntry>, String> {
        let bytes = self.section(Section::ProducerSnapshot).await?;
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        parse_producer_snapshot(&bytes).map_err(|e| format!("{}: {e}", self.describe()))
    }

    /// The `.log` bytes `range` (inside the `.log`). When the window does not hold them, reads
    /// `range.start..max(range.end, read_to)` (cut at the `.log`'s end) as the new window.
    pub(crate) async fn log_bytes(
        &mut self,
        range: Range<u64>,
        read_to: u64,
    ) -> Result<Bytes, String> {
        if range.start >= range.end || range.end > self.layout.log {
            return Err(format!(
                "{}: .log range {range:?} outside its {} bytes",
                self.describe(),
                self.layout.log
            ));
        }
        let window_end = self.window_start + self.window.len() as u64;
        if range.start < self.window_start || range.end > window_end {
            let end = range.end.max(read_to).min(self.layout.log);
            self.window = self.read(range.start..end).await?;
            self.window_start = range.start;
        }
        let from = (range.start - self.window_start) as usize;
        let to = (range.end - self.window_start) as usize;
        Ok(self.window.slice(from..to))
    }

    /// The header of the batch at `position` of the `.log`, checked for framing (a whole batch
    /// inside the `.log`, magic 2, a non-negative `lastOffsetDelta`) and for lying inside the
    /// segment's offsets. A window read from here reaches at least `read_to`.
    pub(crate) async fn header_at(
        &mut self,
        position: u64,
        read_to: u64,
    ) -> Result<SegmentBatch, String> {
        let what = self.describe();
        let fail =
            |reason: &str| format!("{what}: batch at position {position} is invalid: {reason}");
        if position
            .checked_add(HEADER_LEN as u64)
            .is_none_or(|end| end > self.layout.log)
        {
            return Err(fail("truncated header"));
        }
        let h = self
            .log_bytes(position..position + HEADER_LEN as u64, read_to)
            .await?;
        let size = i64::from(be_i32(&h, BATCH_LENGTH_OFFSET)) + LOG_OVERHEAD as i64;
        if size < HEADER_LEN as i64 {
            return Err(fail("batchLength smaller than a header"));
        }
        if position as i64 + size > self.layout.log as i64 {
            return Err(fail("batch runs past the end of the .log"));
        }
        if h[MAGIC_OFFSET] as i8 != MAGIC_V2 {
            return Err(fail("magic is not 2"));
        }
        let base_offset = be_i64(&h, BASE_OFFSET_OFFSET);
        let delta = be_i32(&h, LAST_OFFSET_DELTA_OFFSET);
        let last_offset = base_offset
            .checked_add(i64::from(delta))
            .filter(|_| delta >= 0)
            .ok_or_else(|| fail("bad lastOffsetDelta"))?;
        if base_offset < self.segment.base_offset || last_offset > self.segment.end_offset {
            return Err(fail("offsets outside the segment"));
        }
        Ok(SegmentBatch {
            position,
            base_offset,
            last_offset,
            size: size as u32,
            max_timestamp: be_i64(&h, MAX_TIMESTAMP_OFFSET),
            attributes: Attributes(i16::from_be_bytes([
                h[ATTRIBUTES_OFFSET],
                h[ATTRIBUTES_OFFSET + 1],
            ])),
            records_count: be_i32(&h, RECORDS_COUNT_OFFSET),
        })
    }

    /// Where to start scanning for the batch holding `offset` (`OffsetIndex.lookup`), and the
    /// offset the batch there must end at (`None` at position 0, where the segment's first batch
    /// starts), and how far the batch holding `offset` can start at most (the position of the next
    /// index entry; the `.log`'s end when there is none). No index read when `offset` is at or
    /// below the segment's base.
    pub(crate) async fn position_of(
        &mut self,
        offset: i64,
    ) -> Result<(u64, Option<i64>, u64), String> {
        if offset <= self.segment.base_offset {
            return Ok((0, None, 0));
        }
        let index = self.offset_index().await?;
        let found = index.lookup(offset);
        let next = (0..index.len())
            .filter_map(|i| index.entry(i))
            .find(|e| e.offset > offset)
            .map_or(self.layout.log, |e| u64::from(e.position));
        if found.position == 0 {
            Ok((0, None, next))
        } else {
            Ok((u64::from(found.position), Some(found.offset), next))
        }
    }

    /// Checks the first batch the walk reads at a position [`Self::position_of`] gave: the
    /// segment's first batch at position 0, else the batch the index entry names.
    pub(crate) fn check_start(
        &self,
        batch: &SegmentBatch,
        indexed: Option<i64>,
    ) -> Result<(), String> {
        let ok = match indexed {
            None => batch.base_offset == self.segment.base_offset,
            Some(offset) => batch.last_offset == offset,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{}: batch {}..={} at position {} is not where the index says",
                self.describe(),
                batch.base_offset,
                batch.last_offset,
                batch.position
            ))
        }
    }

    /// Checks that the batch after `previous` starts right after it or, in a segment compaction
    /// wrote ([`TieredSegment::compacted`], issue #29: whole batches removed leave holes), after
    /// it.
    pub(crate) fn check_contiguous(
        &self,
        previous: &SegmentBatch,
        batch: &SegmentBatch,
    ) -> Result<(), String> {
        let next = previous.last_offset.checked_add(1);
        let in_order = if self.segment.compacted {
            next.is_some_and(|n| batch.base_offset >= n)
        } else {
            next == Some(batch.base_offset)
        };
        if in_order {
            Ok(())
        } else {
            Err(format!(
                "{}: batch at position {} starts at {}, expected {}{}",
                self.describe(),
                batch.position,
                batch.base_offset,
                if self.segment.compacted {
                    "at least "
                } else {
                    ""
                },
                previous.last_offset.saturating_add(1)
            ))
        }
    }

    /// Checks that the `.log` ended with the segment's last offset.
    pub(crate) fn check_end(&self, last: Option<&SegmentBatch>) -> Result<(), String> {
        match last {
            Some(b) if b.last_offset == self.segment.end_offset => Ok(()),
            _ => Err(format!(
                "{}: the .log ends before the segment's last offset",
                self.describe()
            )),
        }
    }
}

/// The KIP-74 state of one fetch, shared by its partitions in request order.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Bytes taken by the fetch so far.
    pub(super) total: u64,
    /// The request's `fetch_max_bytes`.
    pub(super) fetch_max: u64,
    /// Whether nothing was taken yet: the next batch is taken whatever its size.
    pub(super) min_one: bool,
    /// Whether a coordinator answer of this fetch held a tiered segment (counted whole by the
    /// coordinator: its limits were tighter than the fetch's from then on).
    pub(super) segments_seen: bool,
}

impl Limits {
    /// Whether a batch of `size` may join a partition that took `bytes` of its `max`.
    pub(super) fn admits(&self, bytes: u64, max: u64, size: u64) -> bool {
        self.min_one || (bytes + size <= max && self.total + size <= self.fetch_max)
    }

    /// The bytes a partition that took `bytes` of its `max` may still take.
    fn budget(&self, bytes: u64, max: u64) -> u64 {
        max.saturating_sub(bytes)
            .min(self.fetch_max.saturating_sub(self.total))
    }

    /// Records a taken batch.
    pub(super) fn take(&mut self, size: u64) {
        self.total += size;
        self.min_one = false;
    }
}

/// What a fetch takes from one partition, built in request order under the fetch's [`Limits`].
#[derive(Debug, Default)]
pub(super) struct PartitionRead {
    /// The batches served from tiered segments, as chunks (a fresh header and the stored rest
    /// per batch).
    pub(super) records: Vec<Bytes>,
    /// The bytes taken from the partition (both tiers).
    pub(super) bytes: u64,
    /// The bytes taken from tiered segments.
    pub(super) tiered_bytes: u64,
    /// The offset after the last batch taken (the fetch offset when none was).
    pub(super) next_offset: i64,
    /// The segments the walk entered, in order.
    pub(super) entered: Vec<TieredSegment>,
    /// Segments the coordinator gave after those, not entered.
    pub(super) following: Vec<TieredSegment>,
    /// The WAL batches taken (read afterwards, with every partition's).
    pub(super) wal: Vec<BatchCoordinate>,
    /// The coordinator's aborted transactions of follow-up answers (`read_committed`).
    pub(super) wal_aborted: Vec<AbortedTxn>,
    /// Why the tiered walk stopped early on bad bytes (or tiers that do not join).
    pub(super) error: Option<String>,
    /// Where the bytes of the tiered reads came from.
    pub(super) stats: ReadStats,
}

impl PartitionRead {
    /// Nothing taken yet from `fetch_offset`.
    pub(super) fn new(fetch_offset: i64) -> Self {
        PartitionRead {
            next_offset: fetch_offset,
            ..PartitionRead::default()
        }
    }

    /// The offset after the last tiered batch taken, if one was.
    pub(super) fn tiered_end(&self) -> Option<i64> {
        (self.tiered_bytes > 0)
            .then(|| self.wal.first().map_or(self.next_offset, |b| b.base_offset))
    }
}

/// What the prefetch of one partition reads: its segments from the fetch offset, at most
/// `budget` bytes of `.log` from the indexed position.
/// Owned: a future holding borrowed plans across awaits is not `Send` for every lifetime (a
/// rustc limitation), and hosts spawn their fetch handlers.
struct Prefetch {
    segments: Vec<TieredSegment>,
    fetch_offset: i64,
    budget: u64,
}

/// How a walk through one segment ended.
enum WalkEnd {
    /// The segment's end was reached.
    SegmentEnd,
    /// A limit stopped it: bytes, or the readable end (the last stable offset or the high watermark the fetch reports).
    Stopped,
}

impl Fetcher {
    /// Takes batches from `segments` (a coordinator answer's, in order) from
    /// `read.next_offset` under `limits`; whether every segment was walked to its end (no limit,
    /// no error, no stop at the readable end), so that what follows them may be taken.
    pub(super) async fn read_tiered(
        &self,
        request: &FetchPartition,
        segments: &[TieredSegment],
        readable_end: i64,
        limits: &mut Limits,
        read: &mut PartitionRead,
    ) -> bool {
        let mut walked_all = true;
        for segment in segments {
            if !walked_all {
                read.following.push(segment.clone());
                continue;
            }
            if segment.end_offset < read.next_offset {
                continue;
            }
            // A segment may start after the offset: compaction removes whole ranges (issue #29),
            // and a fetch inside one is answered from the next batch, as Kafka's.
            read.entered.push(segment.clone());
            match self
                .walk_segment(request, segment, readable_end, limits, read)
                .await
            {
                Ok(WalkEnd::SegmentEnd) => {}
                Ok(WalkEnd::Stopped) => walked_all = false,
                Err(e) => {
                    read.error = Some(e);
                    return false;
                }
            }
        }
        walked_all
    }

    /// With a cache, before the sequential walk: loads into the cache, for up to
    /// `max_concurrent_objects` partitions at once, what each partition with tiered segments will
    /// read first — the `.index` of the segment holding its fetch offset and the `.log` window the
    /// walk starts with (from the indexed position, sized by the partition's budget), then the
    /// next segments' first windows while the budget lasts — so that the walk, which must stay
    /// sequential (a partition's KIP-74 budget depends on what the partitions before it took),
    /// finds them in the cache instead of waiting for one GET after the other. The answer is
    /// unchanged: only the cache is filled, with complete blocks of the stored bytes; the walk
    /// reads, checks and serves exactly as without it.
    ///
    /// The budget of a partition is `min(partition_max_bytes, fetch_max_bytes − what the
    /// partitions before it can take at most)` (a partition with data may take up to its
    /// `partition_max_bytes`; one with WAL batches only, before any segment, their bytes), and a
    /// partition left less than a batch header is not prefetched. So the prefetch reads the
    /// ranges the walk reads (in the same blocks, with the same GETs) and, when a partition before
    /// took less than its limit, a shorter window than the walk's, whose rest the walk reads
    /// itself (at worst one more GET for that partition). The prefetch reads beyond what is
    /// served only where the walk would too (its windows reach past the last batch served),
    /// except when the first batch of the fetch is larger than its partition's limit (KIP-74
    /// serves it whole; the partitions after it get less than estimated): then up to a
    /// partition's budget of blocks is read and not served. Blocks evicted between the prefetch
    /// and the walk are read again. Errors are left to the walk, which meets them again and
    /// reports them. Runs only when two partitions or more have segments (one gains nothing).
    ///
    /// Returns where the prefetched bytes came from.
    pub(super) async fn prefetch_tiered(
        &self,
        requests: &[FetchPartition],
        found: &[FindBatchesResponse],
        fetch_max: u64,
    ) -> ReadStats {
        if self.cache.is_none() {
            return ReadStats::default();
        }
        let mut reserved = 0u64;
        let mut segments_seen = false;
        let mut first_with_data = true;
        let mut plans = Vec::new();
        for (request, response) in requests.iter().zip(found) {
            if !response.error.is_ok()
                || (response.segments.is_empty() && response.batches.is_empty())
            {
                continue;
            }
            let max = u64::from(request.partition_max_bytes);
            if !response.segments.is_empty() {
                segments_seen = true;
                let budget = max.min(fetch_max.saturating_sub(reserved));
                if first_with_data || budget >= HEADER_LEN as u64 {
                    plans.push(Prefetch {
                        segments: response.segments.clone(),
                        fetch_offset: request.fetch_offset,
                        budget,
                    });
                }
            }
            // The most this partition can take (follow-up answers come only after a segment).
            let most = if segments_seen {
                max
            } else {
                max.min(
                    response
                        .batches
                        .iter()
                        .map(|b| u64::from(b.byte_size))
                        .sum(),
                )
            };
            reserved = reserved.saturating_add(most);
            first_with_data = false;
        }
        if plans.len() < 2 {
            return ReadStats::default();
        }
        let stats = futures::stream::iter(plans)
            .map(|plan| self.prefetch_partition(plan))
            .buffer_unordered(self.config.max_concurrent_objects)
            .collect::<Vec<ReadStats>>()
            .await;
        let mut total = ReadStats::default();
        for s in stats {
            total.add(s);
        }
        total
    }

    /// Reads into the cache what the walk of one partition reads first; see
    /// [`Self::prefetch_tiered`].
    async fn prefetch_partition(&self, plan: Prefetch) -> ReadStats {
        let mut stats = ReadStats::default();
        let mut offset = plan.fetch_offset;
        let mut budget = plan.budget;
        for segment in &plan.segments {
            if segment.end_offset < offset {
                continue;
            }
            let Ok(mut reader) = SegmentReader::new(self, segment) else {
                break;
            };
            let done = async {
                let (position, _, bound) = reader.position_of(offset).await.ok()?;
                // The walk's first window (see `walk_reader`).
                let bound = bound.min(position.saturating_add(MAX_SKIP_READ));
                let ahead = bound
                    .max(position)
                    .saturating_add(budget)
                    .saturating_add(HEADER_LEN as u64);
                let header_end = position.checked_add(HEADER_LEN as u64)?;
                if header_end > reader.log_len() {
                    return None;
                }
                reader.log_bytes(position..header_end, ahead).await.ok()?;
                // The most the walk can take of this segment.
                let rest = reader.log_len() - position;
                (rest < budget).then_some(rest)
            }
            .await;
            stats.add(reader.stats);
            match done {
                Some(rest) if budget - rest >= HEADER_LEN as u64 => {
                    budget -= rest;
                    offset = segment.end_offset.saturating_add(1);
                }
                _ => break,
            }
        }
        stats
    }

    /// Walks one segment from `read.next_offset`; see the module docs.
    async fn walk_segment(
        &self,
        request: &FetchPartition,
        segment: &TieredSegment,
        readable_end: i64,
        limits: &mut Limits,
        read: &mut PartitionRead,
    ) -> Result<WalkEnd, String> {
        let max = u64::from(request.partition_max_bytes);
        // No batch (at least a header) fits and none may exceed: nothing to read.
        if !limits.min_one && limits.budget(read.bytes, max) < HEADER_LEN as u64 {
            return Ok(WalkEnd::Stopped);
        }
        let mut reader = SegmentReader::new(self, segment)?;
        let result = self
            .walk_reader(request, &mut reader, readable_end, limits, read)
            .await;
        read.stats.add(reader.stats);
        result
    }

    async fn walk_reader(
        &self,
        request: &FetchPartition,
        reader: &mut SegmentReader<'_>,
        readable_end: i64,
        limits: &mut Limits,
        read: &mut PartitionRead,
    ) -> Result<WalkEnd, String> {
        let max = u64::from(request.partition_max_bytes);
        let log_len = reader.log_len();
        let (mut position, indexed, bound) = reader.position_of(read.next_offset).await?;
        // The first read: from the indexed batch past the furthest the wanted batch can start,
        // plus the budget and a header to see the first batch that does not fit.
        let read_to = |from: u64, limits: &Limits, bytes: u64| {
            from.saturating_add(limits.budget(bytes, max))
                .saturating_add(HEADER_LEN as u64)
        };
        // The next index entry bounds where the wanted batch starts; a sparse tail is read in
        // windows, not whole.
        let bound = bound.min(position.saturating_add(MAX_SKIP_READ));
        let mut ahead = read_to(bound.max(position), limits, read.bytes);
        let mut previous: Option<SegmentBatch> = None;
        while position < log_len {
            ahead = ahead.max(read_to(position, limits, read.bytes));
            let batch = reader.header_at(position, ahead).await?;
            match &previous {
                None => reader.check_start(&batch, indexed)?,
                Some(p) => reader.check_contiguous(p, &batch)?,
            }
            position = batch.end();
            previous = Some(batch);
            if batch.last_offset < read.next_offset {
                continue;
            }
            // Nothing at or past what the fetch reports as readable (the first coordinator
            // answer's LSO under read_committed, its high watermark otherwise): a follow-up answer
            // may list a segment registered since, holding batches committed after that answer.
            if batch.base_offset >= readable_end {
                return Ok(WalkEnd::Stopped);
            }
            let size = u64::from(batch.size);
            if !limits.admits(read.bytes, max, size) {
                return Ok(WalkEnd::Stopped);
            }
            let bytes = reader.log_bytes(batch.position..batch.end(), ahead).await?;
            let mut header = BytesMut::from(&bytes[..HEADER_LEN]);
            header[PARTITION_LEADER_EPOCH_OFFSET..PARTITION_LEADER_EPOCH_OFFSET + 4]
                .copy_from_slice(&request.leader_epoch.to_be_bytes());
            read.records.push(header.freeze());
            read.records.push(bytes.slice(HEADER_LEN..));
            read.bytes += size;
            read.tiered_bytes += size;
            limits.take(size);
            read.next_offset = batch.last_offset + 1;
        }
        reader.check_end(previous.as_ref())?;
        Ok(WalkEnd::SegmentEnd)
    }

    /// The aborted transactions of a `read_committed` answer's tiered part: the served offsets
    /// `request.fetch_offset..upper_bound` came from the segments `read` entered (and, when
    /// `served_into_wal`, from WAL batches after them).
    ///
    /// Kafka's `collectAbortedTransactions`: each entered segment's `.txnindex`, in order, by
    /// `collectAbortedTxns(fetch_offset, upper_bound)`, until an entry's last stable offset reaches
    /// the bound. When the answer ended inside the tiered range, a transaction that started in it
    /// may end in a later segment: the search goes on through the following segments (those the
    /// coordinator gave, then listed from it) while the producer-state snapshot of the last
    /// segment read still has such a transaction open — so it stops at once in the usual case (no
    /// transaction open across the served range's end). Markers in the WAL tier are the
    /// coordinator's rows, not searched here.
    pub(super) async fn tiered_aborted(
        &self,
        request: &FetchPartition,
        read: &PartitionRead,
        upper_bound: i64,
        served_into_wal: bool,
    ) -> Result<Vec<AbortedTxn>, String> {
        let fetch_offset = request.fetch_offset;
        let mut out: BTreeMap<i64, AbortedTxnEntry> = BTreeMap::new();
        let collect = |entries: &[AbortedTxnEntry], out: &mut BTreeMap<i64, AbortedTxnEntry>| {
            let (found, complete) = collect_aborted_txns(entries, fetch_offset, upper_bound);
            for e in found {
                out.insert(e.last_offset, e);
            }
            complete
        };
        let done = |out: BTreeMap<i64, AbortedTxnEntry>| {
            out.into_values()
                .map(|e| AbortedTxn {
                    producer_id: e.producer_id,
                    first_offset: e.first_offset,
                    last_offset: e.last_offset,
                })
                .collect()
        };
        let mut last: Option<&TieredSegment> = None;
        for segment in &read.entered {
            let mut reader = SegmentReader::new(self, segment)?;
            let entries = reader.txn_index().await?;
            if collect(&entries, &mut out) {
                return Ok(done(out));
            }
            last = Some(segment);
        }
        let Some(last) = last else {
            return Ok(done(out));
        };
        if served_into_wal {
            return Ok(done(out));
        }
        // Transactions open at the last served segment's end that started before the bound.
        let mut pending: HashMap<i64, i64> = SegmentReader::new(self, last)?
            .producer_snapshot()
            .await?
            .into_iter()
            .filter(|e| (0..upper_bound).contains(&e.current_txn_first_offset))
            .map(|e| (e.producer_id, e.current_txn_first_offset))
            .collect();
        let mut after = last.end_offset;
        let mut listed: Vec<TieredSegment> = read
            .following
            .iter()
            .filter(|s| s.base_offset > after)
            .cloned()
            .collect();
        let mut exhausted = false;
        while !pending.is_empty() {
            if listed.is_empty() {
                if exhausted {
                    break;
                }
                let from = after.saturating_add(1);
                listed = self
                    .coordinator
                    .list_tiered_segments(request.partition, from, LIST_PAGE)
                    .await
                    .map_err(|e| format!("listing tiered segments from {from}: {e}"))?;
                exhausted = listed.len() < LIST_PAGE as usize;
                listed.retain(|s| s.base_offset > after);
                if listed.is_empty() {
                    break;
                }
            }
            let segment = listed.remove(0);
            after = segment.end_offset;
            let mut reader = SegmentReader::new(self, &segment)?;
            let entries = reader.txn_index().await?;
            for e in &entries {
                if pending.get(&e.producer_id) == Some(&e.first_offset) {
                    pending.remove(&e.producer_id);
                }
            }
            if collect(&entries, &mut out) {
                break;
            }
            let snapshot = reader.producer_snapshot().await?;
            pending.retain(|pid, first| {
                snapshot
                    .iter()
                    .any(|e| e.producer_id == *pid && e.current_txn_first_offset == *first)
            });
        }
        Ok(done(out))
    }
}
