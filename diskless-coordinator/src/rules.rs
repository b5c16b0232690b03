//! The decisions both SQL coordinators take the same way outside SQL, written once: which batches a
//! fetch takes (KIP-74; SQLite's — PostgreSQL's, which also takes tiered segments, is
//! `postgres/reads.rs`'s), how a ListOffsets or DeleteRecords partition is answered from its bounds,
//! and how far retention trims a partition (Kafka 3.x order). The backends only read rows. Also
//! what the sharded router shares with them ([`in_request_order`]).

// Without a SQL backend only the router's part is used.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

#[cfg(feature = "sqlite")]
use crate::{AbortedTxn, FindBatchesResponse};
use crate::{
    BatchCoordinate, CoordinatorError, EARLIEST_TIMESTAMP, ErrorCode, LATEST_TIMESTAMP,
    ListOffsetsResponse, MAX_TIMESTAMP, NO_TIMESTAMP, TieredSegment,
};
use std::collections::HashSet;

/// The keys of `keys` that are in `known`, in request order, each once.
pub(crate) fn in_request_order(keys: &[String], mut known: HashSet<String>) -> Vec<String> {
    keys.iter().filter(|k| known.remove(*k)).cloned().collect()
}

/// A stored value that cannot be right: [`CoordinatorError::Storage`].
fn corrupt(what: &str) -> CoordinatorError {
    CoordinatorError::Storage(what.into())
}

/// KIP-74's byte limits of one `find_batches` call, filled partition by partition in request order.
#[derive(Debug)]
pub(crate) struct FetchLimits {
    fetch_max_bytes: u64,
    total: u64,
}

impl FetchLimits {
    #[cfg(feature = "sqlite")] // only the SQLite backend uses it
    /// The limits of a call with `fetch_max_bytes`.
    pub(crate) fn new(fetch_max_bytes: u32) -> Self {
        FetchLimits {
            fetch_max_bytes: u64::from(fetch_max_bytes),
            total: 0,
        }
    }

    #[cfg(feature = "sqlite")] // only the SQLite backend uses it
    /// Starts the answer of the next partition, whose own limit is `max_bytes`.
    pub(crate) fn partition(&mut self, max_bytes: u32) -> PartitionFetch<'_> {
        PartitionFetch {
            limits: self,
            max_bytes: u64::from(max_bytes),
            bytes: 0,
            segments: Vec::new(),
            batches: Vec::new(),
        }
    }
}

/// The tiered segments and batches one partition of a `find_batches` call answers with, so far:
/// one sequence of items, segments (each counted by its whole `.log`) then WAL batches.
#[derive(Debug)]
pub(crate) struct PartitionFetch<'a> {
    limits: &'a mut FetchLimits,
    max_bytes: u64,
    bytes: u64,
    segments: Vec<TieredSegment>,
    batches: Vec<BatchCoordinate>,
}

impl PartitionFetch<'_> {
    /// Counts an item of `size` bytes if the limits allow: the partition's first item always; a
    /// later one while the partition stays within its `max_bytes` and the call within
    /// `fetch_max_bytes`.
    fn fits(&mut self, size: u64) -> bool {
        let fits = self.bytes + size <= self.max_bytes
            && self.limits.total + size <= self.limits.fetch_max_bytes;
        let first = self.batches.is_empty() && self.segments.is_empty();
        if !first && !fits {
            return false;
        }
        self.bytes += size;
        self.limits.total += size;
        true
    }

    #[cfg(feature = "sqlite")] // only the SQLite backend uses it
    /// Takes the partition's next batch if the limits allow (see [`PartitionFetch::fits`]).
    /// `false` (the batch is dropped) when it does not fit: the partition's answer is complete.
    pub(crate) fn take(&mut self, batch: BatchCoordinate) -> bool {
        if !self.fits(u64::from(batch.byte_size)) {
            return false;
        }
        self.batches.push(batch);
        true
    }

    /// Takes the partition's next tiered segment, counted by its whole `.log` (an upper bound of
    /// what is read from it), if the limits allow; `false` when it does not fit: the partition's
    /// answer is complete (no WAL batch follows a segment that was left out).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn take_segment(&mut self, segment: TieredSegment) -> bool {
        if !self.fits(segment.layout.log) {
            return false;
        }
        self.segments.push(segment);
        true
    }

    #[cfg(feature = "sqlite")] // only the SQLite backend uses it
    /// The offset after the last item taken, where the next page starts.
    pub(crate) fn next_offset(&self) -> Result<Option<i64>, CoordinatorError> {
        self.batches
            .last()
            .map(|b| b.last_offset)
            .or_else(|| self.segments.last().map(|s| s.end_offset))
            .map(|last| {
                last.checked_add(1)
                    .ok_or_else(|| corrupt("a batch's last offset is i64::MAX"))
            })
            .transpose()
    }

    #[cfg(feature = "sqlite")] // only the SQLite backend uses it
    /// The partition's answer, with its bounds and, for `read_committed`, the aborted
    /// transactions of its range.
    pub(crate) fn into_response(
        self,
        log_start_offset: i64,
        high_watermark: i64,
        last_stable_offset: i64,
        aborted: Option<Vec<AbortedTxn>>,
    ) -> FindBatchesResponse {
        FindBatchesResponse {
            error: ErrorCode::None,
            segments: self.segments,
            batches: self.batches,
            log_start_offset,
            high_watermark,
            last_stable_offset,
            aborted,
        }
    }
}

/// Whether a ListOffsets `timestamp` is answered from a batch (a timestamp, or MAX_TIMESTAMP)
/// rather than from the partition's bounds alone.
pub(crate) fn looks_up_batch(timestamp: i64) -> bool {
    timestamp >= 0 || timestamp == MAX_TIMESTAMP
}

/// The ListOffsets answer of a partition with bounds `log_start_offset` and `high_watermark` for
/// `timestamp`; `hit` is the (base offset, timestamp) of the batch found when
/// [`looks_up_batch`]. A batch DeleteRecords cut into answers at the log start.
pub(crate) fn list_offsets_answer(
    timestamp: i64,
    log_start_offset: i64,
    high_watermark: i64,
    hit: Option<(i64, i64)>,
) -> ListOffsetsResponse {
    let answer = |error, offset, timestamp| ListOffsetsResponse {
        error,
        offset,
        timestamp,
    };
    match timestamp {
        EARLIEST_TIMESTAMP => answer(ErrorCode::None, log_start_offset, NO_TIMESTAMP),
        LATEST_TIMESTAMP => answer(ErrorCode::None, high_watermark, NO_TIMESTAMP),
        t if !looks_up_batch(t) => answer(ErrorCode::InvalidRequest, -1, NO_TIMESTAMP),
        _ => match hit {
            Some((offset, ts)) => answer(ErrorCode::None, offset.max(log_start_offset), ts),
            None => answer(ErrorCode::None, -1, NO_TIMESTAMP),
        },
    }
}

/// ListOffsets `-4` (KIP-405's `EARLIEST_LOCAL_TIMESTAMP`).
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// ListOffsets `-5` (KIP-1005's `LATEST_TIERED_TIMESTAMP`).
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// [`list_offsets_answer`] for a coordinator with tiered segments: `-4` answers
/// `max(log_start_offset, tiered_next_offset)` (the first offset in the WAL tier), `-5`
/// `tiered_next_offset − 1` (`-1` when nothing was tiered); a `hit` may be a segment's
/// (base offset, max timestamp).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn list_offsets_answer_tiered(
    timestamp: i64,
    log_start_offset: i64,
    high_watermark: i64,
    tiered_next_offset: i64,
    hit: Option<(i64, i64)>,
) -> ListOffsetsResponse {
    let answer = |offset| ListOffsetsResponse {
        error: ErrorCode::None,
        offset,
        timestamp: NO_TIMESTAMP,
    };
    match timestamp {
        EARLIEST_LOCAL_TIMESTAMP => answer(log_start_offset.max(tiered_next_offset)),
        LATEST_TIERED_TIMESTAMP => answer(tiered_next_offset - 1),
        t => list_offsets_answer(t, log_start_offset, high_watermark, hit),
    }
}

/// The log start offset a DeleteRecords partition asks for (`-1`: the high watermark), or
/// `OFFSET_OUT_OF_RANGE` when it is negative or beyond the high watermark.
pub(crate) fn delete_records_target(offset: i64, high_watermark: i64) -> Result<i64, ErrorCode> {
    let target = if offset == -1 { high_watermark } else { offset };
    if target < 0 || target > high_watermark {
        Err(ErrorCode::OffsetOutOfRange)
    } else {
        Ok(target)
    }
}

/// Batches read by a retention pass's first page of a partition; each further page of the same
/// partition doubles, up to [`RETENTION_MAX_PAGE`] (and never more than the budget left). A
/// partition that loses `d` batches costs at most about `2 d + 8` batch rows.
pub(crate) const RETENTION_FIRST_PAGE: u64 = 8;

/// The largest page of batches a retention pass reads at once.
pub(crate) const RETENTION_MAX_PAGE: u64 = 1024;

/// What retention keeps of a partition (its topic's settings), at the pass's `now`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetentionRule {
    /// The partition's live bytes.
    pub(crate) size: i64,
    /// The topic's `retention.ms` (`< 0`: none).
    pub(crate) retention_ms: i64,
    /// The topic's `retention.bytes` (`< 0`: none).
    pub(crate) retention_bytes: i64,
    /// The pass's time (coordinator clock, ms).
    pub(crate) now: i64,
}

/// Retention of one partition, read page by page from its oldest batch: the prefix older than
/// `retention.ms`, then by `retention.bytes` on what is left (Kafka 3.x order), at most `budget`
/// batches. Pages start at [`RETENTION_FIRST_PAGE`] and double up to [`RETENTION_MAX_PAGE`]; the
/// scan stops at the first batch that stays.
#[derive(Debug)]
pub(crate) struct RetentionScan {
    rule: RetentionRule,
    budget: u64,
    deletable: u64,
    remaining: i64,
    by_time: bool,
    after: i64,
    page: u64,
    delete_below: Option<i64>,
    done: bool,
}

impl RetentionScan {
    /// A scan of a partition under `rule`, deleting at most `budget` batches.
    pub(crate) fn new(rule: RetentionRule, budget: u64) -> Self {
        RetentionScan {
            rule,
            budget,
            deletable: 0,
            remaining: rule.size,
            by_time: rule.retention_ms >= 0,
            after: i64::MIN,
            page: RETENTION_FIRST_PAGE,
            delete_below: None,
            done: false,
        }
    }

    /// The next page to read: the partition's batches after last offset `.0`, in offset order, at
    /// most `.1` of them; `None` when the scan is over.
    pub(crate) fn next_page(&self) -> Option<(i64, u64)> {
        if self.done || self.deletable >= self.budget {
            return None;
        }
        Some((self.after, (self.budget - self.deletable).min(self.page)))
    }

    /// Feeds the page read for [`RetentionScan::next_page`]'s `want`: (last offset, byte size, the
    /// time retention ages the batch by) of each batch.
    pub(crate) fn feed(
        &mut self,
        rows: &[(i64, i64, i64)],
        want: u64,
    ) -> Result<(), CoordinatorError> {
        let rule = self.rule;
        for &(last_offset, bytes, ts) in rows {
            if !(self.by_time && rule.now.saturating_sub(ts) > rule.retention_ms) {
                self.by_time = false;
                if !(rule.retention_bytes >= 0 && self.remaining - bytes >= rule.retention_bytes) {
                    self.done = true;
                    return Ok(());
                }
            }
            self.remaining -= bytes;
            self.deletable += 1;
            self.after = last_offset;
            self.delete_below = Some(
                last_offset
                    .checked_add(1)
                    .ok_or_else(|| corrupt("a batch's last offset is i64::MAX"))?,
            );
        }
        if (rows.len() as u64) < want {
            self.done = true;
        } else {
            self.page = self.page.saturating_mul(2).min(RETENTION_MAX_PAGE);
        }
        Ok(())
    }

    /// The offset below which the partition's batches go; `None` when none goes.
    pub(crate) fn delete_below(&self) -> Option<i64> {
        self.delete_below
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages start at 8 and double up to the budget left; the scan stops at the first batch that
    /// stays, and deletes below it.
    #[test]
    fn retention_scan_pages_and_stops() {
        // 100 batches of 10 bytes, timestamps 0..100; retention.ms keeps those at >= 60 at now 100.
        let rule = RetentionRule {
            size: 1000,
            retention_ms: 40,
            retention_bytes: -1,
            now: 100,
        };
        let mut scan = RetentionScan::new(rule, 1000);
        let mut pages = Vec::new();
        while let Some((after, want)) = scan.next_page() {
            pages.push(want);
            let from = if after == i64::MIN { 0 } else { after + 1 };
            let rows: Vec<(i64, i64, i64)> = (from..100)
                .take(usize::try_from(want).unwrap())
                .map(|o| (o, 10, o))
                .collect();
            scan.feed(&rows, want).unwrap();
        }
        assert_eq!(pages, vec![8, 16, 32, 64]);
        assert_eq!(scan.delete_below(), Some(60));
        // The budget caps the batches and the last page.
        let mut scan = RetentionScan::new(rule, 10);
        assert_eq!(scan.next_page(), Some((i64::MIN, 8)));
        let rows: Vec<(i64, i64, i64)> = (0..8).map(|o| (o, 10, o)).collect();
        scan.feed(&rows, 8).unwrap();
        assert_eq!(scan.next_page(), Some((7, 2)));
        scan.feed(&[(8, 10, 8), (9, 10, 9)], 2).unwrap();
        assert_eq!(scan.next_page(), None);
        assert_eq!(scan.delete_below(), Some(10));
    }

    /// retention.bytes applies to what is left after the time-breached prefix.
    #[test]
    fn retention_scan_by_bytes_after_time() {
        let rule = RetentionRule {
            size: 50,
            retention_ms: -1,
            retention_bytes: 30,
            now: 0,
        };
        let mut scan = RetentionScan::new(rule, 100);
        let rows: Vec<(i64, i64, i64)> = (0..5).map(|o| (o, 10, 0)).collect();
        scan.feed(&rows, 8).unwrap();
        assert_eq!(scan.delete_below(), Some(2), "50 - 2 * 10 = 30 stays");
        assert_eq!(scan.next_page(), None);
    }

    /// KIP-74: the first batch of a partition always; then the partition and call limits.
    #[cfg(feature = "sqlite")]
    #[test]
    fn fetch_limits() {
        let batch = |last_offset, byte_size| BatchCoordinate {
            object_key: "k".into(),
            object_size: 1000,
            byte_offset: 1,
            byte_size,
            base_offset: last_offset,
            last_offset,
            base_timestamp: 0,
            max_timestamp: 0,
            timestamp_type: crate::TimestampType::CreateTime,
            log_append_time: NO_TIMESTAMP,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            last_sequence: -1,
            control: None,
        };
        let mut limits = FetchLimits::new(25);
        let mut p = limits.partition(15);
        assert!(p.take(batch(0, 20)), "the first batch always");
        assert!(!p.take(batch(1, 1)), "over the partition's limit");
        assert_eq!(p.next_offset().unwrap(), Some(1));
        let mut q = limits.partition(100);
        assert!(
            q.take(batch(0, 30)),
            "the first batch of each partition always"
        );
        assert!(!q.take(batch(1, 1)), "over the call's limit");
        assert_eq!(q.into_response(0, 2, 2, None).batches.len(), 1);
    }

    #[test]
    fn answers_from_bounds() {
        assert_eq!(delete_records_target(-1, 7), Ok(7));
        assert_eq!(
            delete_records_target(8, 7),
            Err(ErrorCode::OffsetOutOfRange)
        );
        assert_eq!(
            delete_records_target(-2, 7),
            Err(ErrorCode::OffsetOutOfRange)
        );
        let a = list_offsets_answer(EARLIEST_TIMESTAMP, 3, 9, None);
        assert_eq!((a.offset, a.timestamp), (3, NO_TIMESTAMP));
        let a = list_offsets_answer(LATEST_TIMESTAMP, 3, 9, None);
        assert_eq!(a.offset, 9);
        assert_eq!(
            list_offsets_answer(-4, 3, 9, None).error,
            ErrorCode::InvalidRequest
        );
        let a = list_offsets_answer(5, 3, 9, Some((1, 6)));
        assert_eq!(
            (a.offset, a.timestamp),
            (3, 6),
            "a batch cut into answers at the log start"
        );
        assert_eq!(list_offsets_answer(MAX_TIMESTAMP, 3, 9, None).offset, -1);
        let keys: Vec<String> = ["a", "b", "a", "c"].map(String::from).into();
        let known = ["a", "c"].map(String::from).into_iter().collect();
        assert_eq!(in_request_order(&keys, known), vec!["a", "c"]);
    }
}
