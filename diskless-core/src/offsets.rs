//! ListOffsets at record granularity: [`Fetcher::list_offsets`].
//!
//! The coordinator knows batches, not records:
//! [`BatchCoordinator::list_offsets`](diskless_coordinator::BatchCoordinator::list_offsets) answers a
//! timestamp with the first batch (in offset order, from the log start) whose max timestamp reaches
//! it. Kafka answers with a *record*. The façade closes the gap the way Kafka's own broker does
//! (`UnifiedLog.fetchOffsetByTimestamp` → `LogSegment.findOffsetByTimestamp` →
//! `FileRecords.searchForTimestamp`, Kafka 3.8+/4.0): it reads that one batch (a cache hit or one
//! ranged GET, through the same path and checks as [`Fetcher::fetch`]), decompresses it and answers
//! the first record whose timestamp reaches the target, at or after the log start offset. A host
//! broker passes the request's partitions and puts the answers into its response.
//!
//! Answers, per target timestamp (the `timestamp` field of a ListOffsets partition):
//!
//! | target | answer |
//! | --- | --- |
//! | `t >= 0` | the first record, in offset order, with `offset >= logStartOffset` and `timestamp >= t`, with its timestamp; none → offset -1, timestamp -1 |
//! | `-3` MAX_TIMESTAMP | the first record, in offset order, whose timestamp is the partition's largest (KAFKA-16310, Kafka 3.8+) |
//! | `-2` EARLIEST | the log start offset, timestamp -1 |
//! | `-1` LATEST | the high watermark, timestamp -1 |
//! | `-4` EARLIEST_LOCAL | the first offset in the WAL tier: `max(logStartOffset, first offset not tiered)` (KIP-405's local log start), timestamp -1 |
//! | `-5` LATEST_TIERED | the last offset in a tiered segment (KIP-1005's `highestOffsetInRemoteStorage`); offset -1, timestamp -1, leader epoch -1 when nothing is tiered |
//! | other negative | the coordinator's answer (`INVALID_REQUEST`); a host answers `UNSUPPORTED_VERSION` first, see [`list_offsets_min_version`] |
//!
//! The record's timestamp is what a consumer sees: the producer's for a CreateTime batch, the
//! batch's commit time for every record of a LogAppendTime batch (then no read is needed: the first
//! record at or after the log start offset is the answer).
//!
//! When the coordinator's answer lies in a tiered segment (issue #15), the record is found inside
//! it as Kafka's `RemoteLogManager.lookupTimestamp` does: the segment's time index, then its offset
//! index, then its batches forward from there (each section and `.log` range read through the same
//! cache as fetches), so an answer does not change when data changes tier.

use bytes::Bytes;
use diskless_coordinator::{
    BatchCoordinate, EARLIEST_TIMESTAMP, ErrorCode, FindBatchesRequest, FindBatchesResponse,
    IsolationLevel, ListOffsetsRequest, MAX_TIMESTAMP, NO_TIMESTAMP, TieredSegment, TimestampType,
    TopicIdPartition,
};
use tracing::warn;

use crate::batch::RecordBatch;
use crate::batch::{Compression, HEADER_LEN};
use crate::compression::decompress;
use crate::fetcher::{FetchError, Fetcher, SegmentBatch, SegmentReader, frame_stored_batch};
use crate::records::RecordIter;

/// ListOffsets `-4`, EARLIEST_LOCAL_TIMESTAMP (KIP-405, request version 8+): the first offset held
/// locally — for a diskless log, the first offset in the WAL tier (never below the log start).
pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// ListOffsets `-5`, LATEST_TIERED_TIMESTAMP (KIP-1005, request version 9+): the last offset in
/// tiered storage (a tiered segment); `-1` when nothing is tiered.
pub const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// The lowest ListOffsets request version at which Kafka accepts `timestamp`, or `None` when no
/// version does (a negative value Kafka does not know). Kafka answers a partition whose timestamp
/// is not accepted at the request's version with `UNSUPPORTED_VERSION` (35), before looking at the
/// log (`ReplicaManager.isListOffsetsTimestampUnsupported`, Kafka 4.0); a host broker checks this
/// before calling [`Fetcher::list_offsets`].
///
/// ```
/// use diskless_core::list_offsets_min_version;
/// assert_eq!(list_offsets_min_version(1_700_000_000_000), Some(0));
/// assert_eq!(list_offsets_min_version(-3), Some(7)); // MAX_TIMESTAMP
/// assert_eq!(list_offsets_min_version(-9), None);
/// ```
pub fn list_offsets_min_version(timestamp: i64) -> Option<i16> {
    match timestamp {
        t if t >= 0 => Some(0),
        EARLIEST_TIMESTAMP | diskless_coordinator::LATEST_TIMESTAMP => Some(1),
        MAX_TIMESTAMP => Some(7),
        EARLIEST_LOCAL_TIMESTAMP => Some(8),
        LATEST_TIERED_TIMESTAMP => Some(9),
        _ => None,
    }
}

/// One partition of a ListOffsets request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListOffsetsPartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// A timestamp in ms, or one of the special values (see the [module documentation](self)).
    pub timestamp: i64,
    /// The leader epoch reported with a found offset. A diskless partition has no leader epoch of its
    /// own: pass the epoch the host announces in Metadata for the partition (as for
    /// [`crate::FetchPartition::leader_epoch`]).
    pub leader_epoch: i32,
    /// The request's `isolation_level` (ListOffsets v2+): `ReadCommitted` answers LATEST with the
    /// last stable offset and finds no record at or above it (Kafka's `lastFetchableOffset`).
    pub isolation: IsolationLevel,
}

/// The answer for one partition of a ListOffsets request, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedOffset {
    /// The partition.
    pub partition: TopicIdPartition,
    /// [`ErrorCode::None`], or why there is no answer: `UNKNOWN_TOPIC_OR_PARTITION`,
    /// `INVALID_REQUEST` (an unknown negative timestamp), or `KAFKA_STORAGE_ERROR` (retriable: the
    /// batch to look into could not be read, or the partition kept changing during the lookup).
    pub error: ErrorCode,
    /// A human-readable reason on error.
    pub error_message: Option<String>,
    /// The offset found, or `-1` (none, or on error).
    pub offset: i64,
    /// The timestamp of the record found, or `-1` (EARLIEST, LATEST, none, or on error).
    pub timestamp: i64,
    /// The request's leader epoch when an offset was found, else `-1` (Kafka's "no epoch").
    pub leader_epoch: i32,
}

impl ListedOffset {
    fn new(request: &ListOffsetsPartition, offset: i64, timestamp: i64) -> Self {
        ListedOffset {
            partition: request.partition,
            error: ErrorCode::None,
            error_message: None,
            offset,
            timestamp,
            leader_epoch: if offset >= 0 {
                request.leader_epoch
            } else {
                -1
            },
        }
    }

    fn error(request: &ListOffsetsPartition, error: ErrorCode, message: Option<String>) -> Self {
        ListedOffset {
            partition: request.partition,
            error,
            error_message: message,
            offset: -1,
            timestamp: NO_TIMESTAMP,
            leader_epoch: -1,
        }
    }
}

/// How many times a lookup starts over when the partition changed under it (retention or
/// DeleteRecords moved the log start offset between two reads).
const MAX_ATTEMPTS: usize = 3;
/// Batch bytes per `find_batches` page when a lookup goes on past a batch whose matching records all
/// lie below the log start offset.
const SCAN_PAGE_BYTES: u32 = 8 << 20;

/// What a lookup searches for in a batch's records.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Search {
    /// The first record with `timestamp >= t` and `offset >= logStartOffset`
    /// (`FileRecords.searchForTimestamp`).
    AtLeast(i64),
    /// The first record with `timestamp == max` (`RecordBatch.offsetOfMaxTimestamp`), its offset
    /// raised to the log start offset.
    Max(i64),
}

/// A lookup that needs the batch holding the coordinator's offset.
struct Lookup {
    /// Index in the request.
    index: usize,
    search: Search,
    /// The coordinator's answer: the batch-level offset and timestamp.
    offset: i64,
    timestamp: i64,
}

/// The outcome of one step of a lookup.
enum Step {
    Done(ListedOffset),
    /// The partition changed during the lookup: start over.
    Restart,
    /// No record of the batch ending at `last_offset` matches (they lie below the log start offset):
    /// search the following batches.
    Continue {
        last_offset: i64,
    },
}

impl Fetcher {
    /// Serves a ListOffsets request, exactly as a Kafka broker answers it for a classic topic (see
    /// the [module documentation](crate::offsets)): one answer per partition, in request order.
    ///
    /// Follows Kafka 4.0's `UnifiedLog.fetchOffsetByTimestamp`:
    ///
    /// - **timestamp `t >= 0`**: `searchOffsetInLocalLog` / `LogSegment.findOffsetByTimestamp` /
    ///   `FileRecords.searchForTimestamp`: the first batch whose max timestamp reaches `t` (the
    ///   coordinator's batch-level answer), then in it the first record with `timestamp >= t` and
    ///   `offset >= logStartOffset`. When DeleteRecords cut into that batch and all its matching
    ///   records lie below the log start offset, the search goes on with the following batches, as
    ///   `searchForTimestamp` goes on within a segment (a diskless log has no segments).
    /// - **MAX_TIMESTAMP**: the earliest batch holding the partition's largest timestamp (the
    ///   coordinator's answer; Kafka: the segment with the largest `maxTimestampSoFar`, then the first
    ///   batch whose `maxTimestamp` equals it), then in it `RecordBatch.offsetOfMaxTimestamp`: the
    ///   first record with that timestamp (for LogAppendTime, the batch's first record). Like Kafka,
    ///   the largest timestamp counts the records of the batch DeleteRecords cut into; unlike Kafka,
    ///   the offset is never below the log start offset (raised to it when the record was deleted).
    /// - **A batch-level answer in a tiered segment**: `RemoteLogManager.lookupTimestamp` —
    ///   for `t`, the time index entry for `t`, the offset index position of
    ///   `max(entry offset, logStartOffset)`, then the first batch forward with `maxTimestamp >= t`
    ///   and last offset `>= logStartOffset`, then its record as above (on to the following
    ///   segments and batches when none matches); for MAX_TIMESTAMP, the offset index position of
    ///   the segment's max timestamp offset, the first batch whose `maxTimestamp` is the max, its
    ///   first record with it.
    /// - **EARLIEST, LATEST, EARLIEST_LOCAL, LATEST_TIERED** and errors: the coordinator's answer.
    ///
    /// Cost: one coordinator `list_offsets` call for the whole request; for the partitions that need
    /// a record, one `find_batches` call and one read of each batch (a cache hit, or one ranged GET
    /// per object), none for LogAppendTime batches; in a tiered segment, its time and offset index
    /// sections and one `.log` range (one GET when cold and in one cache block, none when warm). Only after DeleteRecords cut into the batch
    /// found does a lookup page through the following batches' coordinates.
    ///
    /// `Err` only when the coordinator cannot be asked; a batch that cannot be read or verified
    /// (CRC, framing, coordinates) answers its partition with a retriable `KAFKA_STORAGE_ERROR`,
    /// never with a wrong offset.
    ///
    /// Runs in a `list_offsets` span (level `DEBUG`). Its reads are not counted in the fetch
    /// metrics (`diskless_fetch_*`, `diskless_cache_*_bytes_total`); the storage and coordinator
    /// wrappers (`MeteredStorage`, `MeteredCoordinator`) count its calls.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, and safe to retry: a lookup only reads (coordinator calls, and batch reads
    /// through the same path as [`Fetcher::fetch`], whose cancel safety applies). Dropping its
    /// future changes nothing but the cache, which only receives complete blocks of stored bytes.
    #[tracing::instrument(
        level = "debug",
        name = "list_offsets",
        skip_all,
        fields(partitions = requests.len())
    )]
    pub async fn list_offsets(
        &self,
        requests: &[ListOffsetsPartition],
    ) -> Result<Vec<ListedOffset>, FetchError> {
        let mut out: Vec<ListedOffset> = requests
            .iter()
            .map(|r| {
                ListedOffset::error(
                    r,
                    ErrorCode::KafkaStorageError,
                    Some(format!(
                        "partition {} kept changing during {MAX_ATTEMPTS} ListOffsets lookups",
                        r.partition
                    )),
                )
            })
            .collect();
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        for _ in 0..MAX_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            pending = self
                .list_offsets_round(requests, &pending, &mut out)
                .await?;
        }
        Ok(out)
    }

    /// One attempt at the `pending` partitions; returns those to start over.
    async fn list_offsets_round(
        &self,
        requests: &[ListOffsetsPartition],
        pending: &[usize],
        out: &mut [ListedOffset],
    ) -> Result<Vec<usize>, FetchError> {
        let queries: Vec<ListOffsetsRequest> = pending
            .iter()
            .map(|&i| ListOffsetsRequest {
                partition: requests[i].partition,
                timestamp: requests[i].timestamp,
                isolation: requests[i].isolation,
            })
            .collect();
        let answers = self.coordinator.list_offsets(&queries).await?;
        if answers.len() != queries.len() {
            return Err(FetchError::Inconsistent(format!(
                "{} partitions asked, {} answered",
                queries.len(),
                answers.len()
            )));
        }

        let mut lookups = Vec::new();
        for (&i, a) in pending.iter().zip(answers) {
            let request = &requests[i];
            if !a.error.is_ok() {
                out[i] = ListedOffset::error(request, a.error, None);
                continue;
            }
            let search = match request.timestamp {
                MAX_TIMESTAMP if a.offset >= 0 => Search::Max(a.timestamp),
                t if t >= 0 && a.offset >= 0 => Search::AtLeast(t),
                _ => {
                    out[i] = ListedOffset::new(request, a.offset, a.timestamp);
                    continue;
                }
            };
            lookups.push(Lookup {
                index: i,
                search,
                offset: a.offset,
                timestamp: a.timestamp,
            });
        }
        if lookups.is_empty() {
            return Ok(Vec::new());
        }

        // The batch holding each coordinator offset: the first batch of a find_batches answer is
        // always returned, whatever the byte limits.
        let find: Vec<FindBatchesRequest> = lookups
            .iter()
            .map(|l| FindBatchesRequest {
                partition: requests[l.index].partition,
                offset: l.offset,
                max_bytes: 0,
                isolation: requests[l.index].isolation,
            })
            .collect();
        let found = self.coordinator.find_batches(&find, 0).await?;
        if found.len() != find.len() {
            return Err(FetchError::Inconsistent(format!(
                "{} partitions asked, {} answered",
                find.len(),
                found.len()
            )));
        }
        let mut restart = Vec::new();
        // (lookup, its batch, the partition's log start offset), for the batches to read.
        let mut to_read: Vec<(usize, BatchCoordinate, i64)> = Vec::new();
        for (li, (lookup, response)) in lookups.iter().zip(found).enumerate() {
            let request = &requests[lookup.index];
            if response.error == ErrorCode::OffsetOutOfRange {
                restart.push(lookup.index);
                continue;
            }
            if !response.error.is_ok() {
                out[lookup.index] = ListedOffset::error(request, response.error, None);
                continue;
            }
            if let Some(segment) = response.segments.first() {
                // The record is inside a tiered segment: Kafka's remote lookup.
                let step = if segment.base_offset <= lookup.offset
                    && lookup.offset <= segment.end_offset
                {
                    self.segment_step(request, lookup, segment, response.log_start_offset)
                        .await
                } else {
                    storage_error(
                        request,
                        format!(
                            "the coordinator found segment {}..={} for offset {}",
                            segment.base_offset, segment.end_offset, lookup.offset
                        ),
                    )
                };
                self.finish(requests, lookup, step, &mut out[..], &mut restart)
                    .await?;
                continue;
            }
            let Some(batch) = response.batches.into_iter().next() else {
                restart.push(lookup.index);
                continue;
            };
            if !(batch.base_offset <= lookup.offset && lookup.offset <= batch.last_offset) {
                out[lookup.index] = ListedOffset::error(
                    request,
                    ErrorCode::KafkaStorageError,
                    Some(format!(
                        "the coordinator found batch {}..={} for offset {}",
                        batch.base_offset, batch.last_offset, lookup.offset
                    )),
                );
                continue;
            }
            let lso = response.log_start_offset;
            if needs_no_read(&batch) {
                let step = self.log_append_time_step(request, lookup, &batch, lso);
                self.finish(requests, lookup, step, &mut out[..], &mut restart)
                    .await?;
            } else {
                to_read.push((li, batch, lso));
            }
        }
        let (mut bytes_of, _) = self
            .read_batches(to_read.iter().map(|(li, batch, _)| (*li, batch)).collect())
            .await;
        for (li, batch, lso) in &to_read {
            let lookup = &lookups[*li];
            let request = &requests[lookup.index];
            let step = match bytes_of.remove(li) {
                Some(Ok(bytes)) => {
                    match find_record(
                        bytes,
                        batch,
                        *lso,
                        lookup.search,
                        self.config.max_decompressed_bytes,
                    ) {
                        Ok(Some((offset, timestamp))) => {
                            Step::Done(ListedOffset::new(request, offset, timestamp))
                        }
                        Ok(None) => self.no_record_step(request, lookup, batch),
                        Err(e) => storage_error(request, e),
                    }
                }
                Some(Err(e)) => storage_error(request, e),
                None => storage_error(request, "batch bytes missing".to_string()),
            };
            self.finish(requests, lookup, step, out, &mut restart)
                .await?;
        }
        Ok(restart)
    }

    /// Records the outcome of a lookup's first batch; a [`Step::Continue`] searches the following
    /// batches first.
    async fn finish(
        &self,
        requests: &[ListOffsetsPartition],
        lookup: &Lookup,
        step: Step,
        out: &mut [ListedOffset],
        restart: &mut Vec<usize>,
    ) -> Result<(), FetchError> {
        let step = match (step, lookup.search) {
            (Step::Continue { last_offset }, Search::AtLeast(target)) => {
                self.search_after(&requests[lookup.index], last_offset, target)
                    .await?
            }
            (step, _) => step,
        };
        match step {
            Step::Done(answer) => out[lookup.index] = answer,
            Step::Restart => restart.push(lookup.index),
            // Only a timestamp search continues.
            Step::Continue { .. } => {
                out[lookup.index] = ListedOffset::new(&requests[lookup.index], -1, NO_TIMESTAMP)
            }
        }
        Ok(())
    }

    /// A LogAppendTime batch or a transaction marker needs no read: every record has the batch's
    /// time, so the first record at or after the log start offset is the answer if it matches.
    fn log_append_time_step(
        &self,
        request: &ListOffsetsPartition,
        lookup: &Lookup,
        batch: &BatchCoordinate,
        log_start_offset: i64,
    ) -> Step {
        match log_append_time_record(batch, log_start_offset, lookup.search) {
            Some((offset, timestamp)) => Step::Done(ListedOffset::new(request, offset, timestamp)),
            None => self.no_record_step(request, lookup, batch),
        }
    }

    /// The coordinator's batch holds no matching record: for a timestamp, its matching records lie
    /// below the log start offset, so the search goes on; for MAX_TIMESTAMP the stored records
    /// contradict the coordinator's max timestamp, and its batch-level answer stands.
    fn no_record_step(
        &self,
        request: &ListOffsetsPartition,
        lookup: &Lookup,
        batch: &BatchCoordinate,
    ) -> Step {
        match lookup.search {
            Search::AtLeast(_) => Step::Continue {
                last_offset: batch.last_offset,
            },
            Search::Max(max) => {
                warn!(
                    partition = %request.partition,
                    max_timestamp = max,
                    base_offset = batch.base_offset,
                    "no record of the batch holding the max timestamp has it"
                );
                Step::Done(ListedOffset::new(request, lookup.offset, lookup.timestamp))
            }
        }
    }

    /// Searches the batches after `last_offset` for the first record with `timestamp >= target`
    /// (the rest of `FileRecords.searchForTimestamp`'s loop), paging through their coordinates.
    async fn search_after(
        &self,
        request: &ListOffsetsPartition,
        last_offset: i64,
        target: i64,
    ) -> Result<Step, FetchError> {
        let Some(mut next) = last_offset.checked_add(1) else {
            return Ok(Step::Done(ListedOffset::new(request, -1, NO_TIMESTAMP)));
        };
        loop {
            let found = self
                .coordinator
                .find_batches(
                    &[FindBatchesRequest {
                        partition: request.partition,
                        offset: next,
                        max_bytes: SCAN_PAGE_BYTES,
                        isolation: request.isolation,
                    }],
                    SCAN_PAGE_BYTES,
                )
                .await?;
            let Some(response) = found.into_iter().next() else {
                return Err(FetchError::Inconsistent(
                    "1 partition asked, 0 answered".to_string(),
                ));
            };
            if response.error == ErrorCode::OffsetOutOfRange {
                return Ok(Step::Restart);
            }
            if !response.error.is_ok() {
                return Ok(Step::Done(ListedOffset::error(
                    request,
                    response.error,
                    None,
                )));
            }
            let lso = response.log_start_offset;
            let mut last = None;
            for segment in response.segments.iter().filter(|s| s.end_offset >= next) {
                last = Some(segment.end_offset);
                // KIP-405's remote lookup: only a segment whose max timestamp reaches the target.
                if segment.max_timestamp < target {
                    continue;
                }
                match self
                    .search_segment(segment, next.max(lso), lso, Search::AtLeast(target))
                    .await
                {
                    Ok(Some((offset, timestamp))) => {
                        return Ok(Step::Done(ListedOffset::new(request, offset, timestamp)));
                    }
                    Ok(None) => {}
                    Err(e) => return Ok(storage_error(request, e)),
                }
            }
            for batch in response.batches.iter().filter(|b| b.last_offset >= next) {
                last = Some(batch.last_offset);
                if batch.effective_max_timestamp() < target {
                    continue;
                }
                let record = if needs_no_read(batch) {
                    Ok(log_append_time_record(batch, lso, Search::AtLeast(target)))
                } else {
                    match self.read_batches(vec![(0usize, batch)]).await.0.remove(&0) {
                        Some(Ok(bytes)) => find_record(
                            bytes,
                            batch,
                            lso,
                            Search::AtLeast(target),
                            self.config.max_decompressed_bytes,
                        ),
                        Some(Err(e)) => Err(e),
                        None => Err("batch bytes missing".to_string()),
                    }
                };
                match record {
                    Ok(Some((offset, timestamp))) => {
                        return Ok(Step::Done(ListedOffset::new(request, offset, timestamp)));
                    }
                    Ok(None) => {}
                    Err(e) => return Ok(storage_error(request, e)),
                }
            }
            match last.and_then(|l| l.checked_add(1)) {
                Some(after) if after < readable_end(request.isolation, &response) => next = after,
                _ => return Ok(Step::Done(ListedOffset::new(request, -1, NO_TIMESTAMP))),
            }
        }
    }
}

impl Fetcher {
    /// The step of a lookup whose coordinator answer lies in a tiered segment.
    async fn segment_step(
        &self,
        request: &ListOffsetsPartition,
        lookup: &Lookup,
        segment: &TieredSegment,
        log_start_offset: i64,
    ) -> Step {
        match self
            .search_segment(segment, log_start_offset, log_start_offset, lookup.search)
            .await
        {
            Ok(Some((offset, timestamp))) => {
                Step::Done(ListedOffset::new(request, offset, timestamp))
            }
            Ok(None) => match lookup.search {
                Search::AtLeast(_) => Step::Continue {
                    last_offset: segment.end_offset,
                },
                Search::Max(max) => {
                    warn!(
                        partition = %request.partition,
                        max_timestamp = max,
                        segment = %segment.object_key,
                        "no record of the tiered segment holding the max timestamp has it"
                    );
                    Step::Done(ListedOffset::new(request, lookup.offset, lookup.timestamp))
                }
            },
            Err(e) => storage_error(request, e),
        }
    }

    /// Kafka's `RemoteLogManager.lookupTimestamp` in one tiered segment, for records at or after
    /// `starting_offset`:
    ///
    /// - `AtLeast(t)`: the time index entry for `t` ([`crate::tiered::TimeIndex::lookup`]), the offset index
    ///   position of `max(entry offset, starting_offset)`, then batch by batch forward the first
    ///   batch with `maxTimestamp ≥ t` and last offset `≥ starting_offset`, and in it the first
    ///   record with `timestamp ≥ t` and `offset ≥ starting_offset` (`FileRecords.searchForTimestamp`);
    /// - `Max(max)`: the offset index position of the segment's max timestamp offset (the time
    ///   index's last entry), the first batch whose `maxTimestamp` is `max`, and in it the first
    ///   record with that timestamp (KAFKA-16310), its offset raised to `log_start_offset`.
    ///
    /// `None` when no record of the segment matches. Each batch read is checked as a fetch does
    /// (framing, offsets inside the segment, contiguity) and its CRC verified before its records
    /// are read.
    pub(crate) async fn search_segment(
        &self,
        segment: &TieredSegment,
        starting_offset: i64,
        log_start_offset: i64,
        search: Search,
    ) -> Result<Option<(i64, i64)>, String> {
        let mut reader = SegmentReader::new(self, segment)?;
        let starting = starting_offset.max(segment.base_offset);
        let target = match search {
            Search::AtLeast(t) => reader.time_index().await?.lookup(t).offset.max(starting),
            Search::Max(_) => segment.max_timestamp_offset.max(segment.base_offset),
        };
        let (mut position, indexed, _) = reader.position_of(target).await?;
        let log_len = reader.log_len();
        let mut previous: Option<SegmentBatch> = None;
        while position < log_len {
            let read_to = position.saturating_add(SEGMENT_SCAN_WINDOW);
            let batch = reader.header_at(position, read_to).await?;
            match &previous {
                None => reader.check_start(&batch, indexed)?,
                Some(p) => reader.check_contiguous(p, &batch)?,
            }
            position = batch.end();
            previous = Some(batch);
            let wanted = match search {
                Search::AtLeast(t) => batch.max_timestamp >= t && batch.last_offset >= starting,
                Search::Max(max) => batch.max_timestamp == max,
            };
            if !wanted {
                continue;
            }
            let floor = match search {
                Search::AtLeast(_) => starting,
                Search::Max(_) => log_start_offset,
            };
            let span = batch.last_offset - batch.base_offset + 1;
            let log_append_time = batch.attributes.timestamp_type() == TimestampType::LogAppendTime;
            let found = if log_append_time && i64::from(batch.records_count) == span {
                // Every record has the batch's time, and every offset of the batch holds one.
                Some((batch.base_offset.max(floor), batch.max_timestamp))
            } else {
                let bytes = reader
                    .log_bytes(batch.position..batch.end(), read_to)
                    .await?;
                let at = || {
                    format!(
                        "batch {}..={} of tiered segment {}",
                        batch.base_offset, batch.last_offset, segment.object_key
                    )
                };
                let stored = RecordBatch::parse(bytes).map_err(|e| format!("{}: {e}", at()))?;
                if !stored.crc_is_valid() {
                    return Err(format!(
                        "{}: CRC mismatch (stored {}, computed {})",
                        at(),
                        stored.crc(),
                        stored.compute_crc()
                    ));
                }
                // A compacted segment's batches keep their offsets with fewer records (issue #29).
                let count = usize::try_from(stored.records_count())
                    .ok()
                    .filter(|&c| {
                        let c = i64::try_from(c).unwrap_or(i64::MAX);
                        if segment.compacted {
                            (1..=span).contains(&c)
                        } else {
                            c == span
                        }
                    })
                    .ok_or_else(|| format!("{}: records count does not match its offsets", at()))?;
                search_records(
                    &stored,
                    batch.base_offset,
                    count,
                    log_append_time.then_some(batch.max_timestamp),
                    floor,
                    search,
                    self.config.max_decompressed_bytes,
                    &at,
                )?
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }
}

/// How far ahead a segment scan reads from the batch it is at.
const SEGMENT_SCAN_WINDOW: u64 = 256 << 10;

/// Where a lookup's reads end: the high watermark, or the last stable offset for `read_committed`.
fn readable_end(isolation: IsolationLevel, response: &FindBatchesResponse) -> i64 {
    match isolation {
        IsolationLevel::ReadCommitted => response.last_stable_offset,
        IsolationLevel::ReadUncommitted => response.high_watermark,
    }
}

fn storage_error(request: &ListOffsetsPartition, message: String) -> Step {
    Step::Done(ListedOffset::error(
        request,
        ErrorCode::KafkaStorageError,
        Some(message),
    ))
}

/// Whether a batch's record timestamps are known without reading it: a LogAppendTime batch (every
/// record has the commit time) or a transaction marker (no stored bytes; its one record has the
/// batch's time, as Kafka's `FileRecords.searchForTimestamp` sees control batches).
fn needs_no_read(batch: &BatchCoordinate) -> bool {
    batch.timestamp_type == TimestampType::LogAppendTime || batch.is_control()
}

/// The answer from a batch of [`needs_no_read`] without reading it: its first record at or after the
/// log start offset, with the batch's time, if that time matches the search.
fn log_append_time_record(
    batch: &BatchCoordinate,
    log_start_offset: i64,
    search: Search,
) -> Option<(i64, i64)> {
    let timestamp = batch.effective_max_timestamp();
    let first = batch.base_offset.max(log_start_offset);
    if first > batch.last_offset {
        return None;
    }
    let matches = match search {
        Search::AtLeast(target) => timestamp >= target,
        Search::Max(max) => timestamp == max,
    };
    matches.then_some((first, timestamp))
}

/// Reads the records of one stored batch (after checking it as a fetch does: framing, the
/// coordinates, the CRC) and returns the `(offset, timestamp)` the search answers, if a record
/// matches. Record offsets are `baseOffset + offsetDelta`; timestamps are what a consumer sees.
fn find_record(
    bytes: Bytes,
    batch: &BatchCoordinate,
    log_start_offset: i64,
    search: Search,
    max_decompressed_bytes: usize,
) -> Result<Option<(i64, i64)>, String> {
    let at = || {
        format!(
            "stored batch at {}+{} of {}",
            batch.byte_offset, batch.byte_size, batch.object_key
        )
    };
    let stored = frame_stored_batch(bytes, batch)?;
    if !stored.crc_is_valid() {
        return Err(format!(
            "{}: CRC mismatch (stored {}, computed {})",
            at(),
            stored.crc(),
            stored.compute_crc()
        ));
    }
    let count = usize::try_from(stored.records_count())
        .ok()
        .filter(|&c| i64::try_from(c).ok() == Some(batch.record_count()))
        .ok_or_else(|| format!("{}: records count does not match its coordinates", at()))?;
    let log_append_time =
        (batch.timestamp_type == TimestampType::LogAppendTime).then_some(batch.log_append_time);
    search_records(
        &stored,
        batch.base_offset,
        count,
        log_append_time,
        log_start_offset,
        search,
        max_decompressed_bytes,
        &at,
    )
}

/// The `(offset, timestamp)` of the first record of `stored` (whose first record has offset
/// `base_offset`, `count` records) that `search` answers, at or after `floor` for a timestamp
/// search (raised to it for MAX_TIMESTAMP). `log_append_time`: every record's timestamp (a
/// LogAppendTime batch served from the WAL tier).
#[allow(clippy::too_many_arguments)]
fn search_records(
    stored: &RecordBatch,
    base_offset: i64,
    count: usize,
    log_append_time: Option<i64>,
    floor: i64,
    search: Search,
    max_decompressed_bytes: usize,
    at: &dyn Fn() -> String,
) -> Result<Option<(i64, i64)>, String> {
    let Some(codec) = stored.attributes().compression() else {
        return Err(format!("{}: unknown compression codec", at()));
    };
    let raw = &stored.as_bytes()[HEADER_LEN..];
    let mut scratch = Vec::new();
    let records: &[u8] = if codec == Compression::None {
        raw
    } else {
        decompress(codec, raw, max_decompressed_bytes, &mut scratch)
            .map_err(|e| format!("{}: {e}", at()))?;
        &scratch
    };
    let base_timestamp = stored.base_timestamp();
    let mut previous_delta = -1;
    for record in RecordIter::new(records, count) {
        let record = record.map_err(|e| format!("{}: {e}", at()))?;
        // Offset deltas increase within the batch's range (a compacted batch skips some).
        if record.offset_delta <= previous_delta || record.offset_delta > stored.last_offset_delta()
        {
            return Err(format!(
                "{}: record offset delta {} out of order",
                at(),
                record.offset_delta
            ));
        }
        previous_delta = record.offset_delta;
        let offset = base_offset
            .checked_add(i64::from(record.offset_delta))
            .ok_or_else(|| format!("{}: record offset overflows", at()))?;
        let timestamp = match log_append_time {
            Some(t) => t,
            None => record.timestamp(base_timestamp),
        };
        match search {
            Search::AtLeast(target) if timestamp >= target && offset >= floor => {
                return Ok(Some((offset, timestamp)));
            }
            Search::Max(max) if timestamp == max => {
                return Ok(Some((offset.max(floor), timestamp)));
            }
            _ => {}
        }
    }
    Ok(None)
}
