//! The consume path of diskless topics: [`Fetcher`].
//!
//! A host broker hands a Fetch request's partitions to [`Fetcher::fetch`]. The fetcher
//!
//! 1. asks the coordinator for the coordinates of the batches from each fetch offset on;
//! 2. applies Kafka's byte limits (KIP-74): the first batch of the first partition with data is
//!    returned whatever its size, after that a batch is added only while the partition's and the
//!    request's byte limits hold;
//! 3. reads the bytes with as few requests as possible: through the cache in aligned blocks (a block
//!    already cached costs no request; the missing blocks of one object are read by one ranged GET),
//!    or, without a cache, one ranged GET per group of nearby ranges of each object;
//! 4. injects the offsets (and LogAppendTime) the coordinator assigned into each batch header without
//!    copying the records: each served batch is a fresh 61-byte header plus a slice of the stored bytes.
//!
//! Offsets consolidated into tiered segments (issue #15) come first, from the segment objects
//! (`tiered.rs`: offset index lookup, one ranged read of the `.log` per segment, the stored batches
//! with the host's leader epoch), then the WAL batches, under the same limits: an answer is
//! byte-identical whichever tier holds its offsets. The segment walks run partition after
//! partition (a partition's budget depends on what those before it took); with a cache, what each
//! walk reads first is loaded concurrently beforehand (at most `max_concurrent_objects`
//! partitions at once), so the reads of a multi-partition fetch overlap as WAL reads do; without
//! a cache they stay sequential.
//!
//! The answer per partition carries the high watermark and log start offset, so a consumer sees
//! exactly what a classic topic returns.
//!
//! [`Fetcher::fetch_wait`] is Kafka's long-polling Fetch (`DelayedFetch`): it reads again while
//! fewer than `min_bytes` are there, woken by the writers' [`CommitSignal`] or every
//! [`FetcherConfig::long_poll_interval`], until `max_wait` (`wait.rs`).
//!
//! The fetcher also answers ListOffsets at record granularity ([`Fetcher::list_offsets`], in
//! [`crate::offsets`]), reading through the same cache and storage path the one batch it needs.

mod config;
mod read;
mod tiered;
mod wait;

pub use config::{
    DEFAULT_CACHE_BLOCK_SIZE, DEFAULT_LONG_POLL_INTERVAL, DEFAULT_MAX_WAIT_LIMIT, FetcherBuilder,
    FetcherConfig,
};
pub(crate) use read::ReadStats;
pub(crate) use tiered::{SegmentBatch, SegmentReader};

use tiered::{Limits, PartitionRead};

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use diskless_cache::LocalCache;
use diskless_common::metrics as m;
use diskless_coordinator::{
    AbortedTxn, BatchCoordinate, BatchCoordinator, CoordinatorError, EndTxnMarker, ErrorCode,
    FindBatchesRequest, FindBatchesResponse, IsolationLevel, TopicIdPartition,
};
use diskless_storage::ObjectStorage;
use tracing::warn;

use crate::CommitSignal;
use crate::batch::{HEADER_LEN, RecordBatch};
use crate::control;
use crate::rewrite::{BatchRewrite, RewrittenBatch, rewrite_batch_verified};

/// One partition of a Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchPartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The offset to read from.
    pub fetch_offset: i64,
    /// The partition's byte limit (`partition_max_bytes`).
    pub partition_max_bytes: u32,
    /// Written into each served batch's `partitionLeaderEpoch`. A diskless partition has no leader
    /// epoch of its own: pass the epoch the host announces in Metadata for the partition (or 0).
    pub leader_epoch: i32,
    /// The request's `isolation_level`: `ReadCommitted` reads stop at the last stable offset and
    /// report the aborted transactions of what they return.
    pub isolation: IsolationLevel,
}

/// The answer for one partition of a Fetch request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FetchedPartition {
    /// The partition.
    pub partition: TopicIdPartition,
    /// [`ErrorCode::None`], or why nothing could be read (`OFFSET_OUT_OF_RANGE`,
    /// `UNKNOWN_TOPIC_OR_PARTITION`, `KAFKA_STORAGE_ERROR` — the last retriable).
    pub error: ErrorCode,
    /// A human-readable reason on error.
    pub error_message: Option<String>,
    /// The partition's high watermark (`-1` on error).
    pub high_watermark: i64,
    /// The partition's log start offset (`-1` on error).
    pub log_start_offset: i64,
    /// The partition's last stable offset (`-1` on error): the response's `last_stable_offset`.
    pub last_stable_offset: i64,
    /// For a `ReadCommitted` fetch, the aborted transactions that overlap the records returned
    /// (Kafka's `abortedTransactions`: a consumer drops those producers' records from each first
    /// offset up to the ABORT marker); `None` for `ReadUncommitted` and on error.
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
    /// The records, as chunks: their concatenation is the response's `records` field.
    pub records: Vec<Bytes>,
}

impl FetchedPartition {
    /// The total size of the records.
    pub fn records_len(&self) -> usize {
        self.records.iter().map(Bytes::len).sum()
    }

    /// The records as one buffer (copies when there is more than one chunk).
    pub fn records_bytes(&self) -> Bytes {
        match self.records.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut out = BytesMut::with_capacity(self.records_len());
                for chunk in many {
                    out.extend_from_slice(chunk);
                }
                out.freeze()
            }
        }
    }
}

/// Why a fetch failed as a whole (per-partition failures are error codes in the answer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The coordinator could not be asked.
    #[error("coordinator error: {0}")]
    Coordinator(#[from] CoordinatorError),
    /// The coordinator's answer does not fit the request.
    #[error("inconsistent coordinator answer: {0}")]
    Inconsistent(String),
}

impl FetchError {
    /// The Kafka error code for every partition of the request.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            FetchError::Coordinator(e) => e.error_code(),
            FetchError::Inconsistent(_) => ErrorCode::KafkaStorageError,
        }
    }
}

/// The consume path. See the [module documentation](self); build one with [`Fetcher::builder`].
///
/// A `Fetcher` is cheap to clone (its parts are shared) and is used from many tasks at once.
#[derive(Clone, Debug)]
pub struct Fetcher {
    storage: Arc<dyn ObjectStorage>,
    pub(crate) coordinator: Arc<dyn BatchCoordinator>,
    cache: Option<Arc<dyn LocalCache>>,
    pub(crate) config: FetcherConfig,
    /// What wakes the long-polling fetches (`wait.rs`).
    commit_signal: CommitSignal,
}

/// Where a batch to serve is: (partition index in the request, batch index in its selection).
type Slot = (usize, usize);

impl Fetcher {
    /// A builder of a fetcher reading `storage` at the coordinates `coordinator` gives; see
    /// [`FetcherBuilder`].
    ///
    /// ```
    /// use diskless_core::{FetchPartition, Fetcher};
    /// use diskless_coordinator::{BatchCoordinator, ErrorCode, ManualClock, TopicIdPartition};
    /// use diskless_storage::{ObjectStorage, ObjectStoreStorage};
    /// use diskless_testkit::coordinator::InMemoryCoordinator;
    /// use std::sync::Arc;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let storage: Arc<dyn ObjectStorage> = Arc::new(ObjectStoreStorage::in_memory());
    /// let coordinator: Arc<dyn BatchCoordinator> =
    ///     Arc::new(InMemoryCoordinator::new(ManualClock::new(1_700_000_000_000)));
    /// let fetcher = Fetcher::builder(storage, coordinator).build().unwrap();
    /// let unknown = TopicIdPartition::new(uuid::Uuid::from_u128(7), 0);
    /// let answers = fetcher
    ///     .fetch(
    ///         &[FetchPartition {
    ///             partition: unknown,
    ///             fetch_offset: 0,
    ///             partition_max_bytes: 1 << 20,
    ///             leader_epoch: 0,
    ///             isolation: Default::default(),
    ///         }],
    ///         50 << 20,
    ///     )
    ///     .await
    ///     .unwrap();
    /// assert_eq!(answers[0].error, ErrorCode::UnknownTopicOrPartition);
    /// # });
    /// ```
    pub fn builder(
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
    ) -> FetcherBuilder {
        FetcherBuilder::new(storage, coordinator)
    }

    /// A fetcher with a configuration already checked.
    fn from_parts(
        config: FetcherConfig,
        storage: Arc<dyn ObjectStorage>,
        coordinator: Arc<dyn BatchCoordinator>,
        cache: Option<Arc<dyn LocalCache>>,
        commit_signal: CommitSignal,
    ) -> Fetcher {
        Fetcher {
            storage,
            coordinator,
            cache,
            config,
            commit_signal,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FetcherConfig {
        &self.config
    }

    /// The signal that wakes its long-polling fetches ([`Fetcher::fetch_wait`]): notify it after
    /// appending to a log other than through a writer that shares it.
    pub fn commit_signal(&self) -> &CommitSignal {
        &self.commit_signal
    }

    /// The cache it reads through, if any (the tiering worker puts a new segment's index
    /// sections into it).
    pub(crate) fn cache(&self) -> Option<&Arc<dyn LocalCache>> {
        self.cache.as_ref()
    }

    /// Serves a Fetch request: one answer per partition, in request order.
    ///
    /// `Err` only when the coordinator cannot be asked or answers inconsistently (then every
    /// partition gets [`FetchError::error_code`]); a batch that cannot be read or verified fails
    /// its partition with a retriable `KAFKA_STORAGE_ERROR` (after the batches before it, which
    /// are served), never with wrong bytes.
    ///
    /// Each call records, once: [`FETCH_SECONDS`](diskless_common::metrics::FETCH_SECONDS)
    /// (`outcome` `ok` or `error`), [`FETCH_BYTES`](diskless_common::metrics::FETCH_BYTES) (the
    /// records returned), and [`CACHE_HIT_BYTES`](diskless_common::metrics::CACHE_HIT_BYTES) /
    /// [`CACHE_MISS_BYTES`](diskless_common::metrics::CACHE_MISS_BYTES): each byte of the batches
    /// read, as a hit when the cache held its block when the fetch looked, else as a miss (read
    /// from storage by this fetch, or by a concurrent one it waited for; every byte is a miss
    /// without a cache). Hits and misses add up to the batch bytes read, which are the bytes
    /// returned unless a batch failed its checks; a tiered segment read counts every byte it read
    /// (its index sections and the `.log` range, which may reach past the last batch served).
    /// [`FETCH_TIERED_BYTES`](diskless_common::metrics::FETCH_TIERED_BYTES): the part of the
    /// records returned that came from tiered segments. Runs in a `fetch` span (level `DEBUG`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, and safe to retry: a fetch only reads. Dropping its future at any await point
    /// drops its coordinator call and GETs in flight and changes nothing but the cache, which only
    /// ever receives complete blocks of the stored bytes. A block load that concurrent fetches of
    /// the same block wait for is shared: with [`MokaCache`](diskless_cache::MokaCache), when the
    /// fetch running it is cancelled one of the waiters runs its own load. A cancelled fetch
    /// records no metric.
    #[tracing::instrument(
        level = "debug",
        name = "fetch",
        skip_all,
        fields(partitions = requests.len(), fetch_max_bytes)
    )]
    pub async fn fetch(
        &self,
        requests: &[FetchPartition],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FetchedPartition>, FetchError> {
        let start = Instant::now();
        let mut stats = ReadStats::default();
        let mut tiered_bytes = 0u64;
        let result = self
            .serve(requests, fetch_max_bytes, &mut stats, &mut tiered_bytes)
            .await;
        let (outcome, returned) = match &result {
            Ok(answers) => (
                m::OK,
                answers.iter().map(|a| a.records_len() as u64).sum::<u64>(),
            ),
            Err(e) => {
                tracing::debug!(error = %e, "fetch failed");
                (m::ERROR, 0)
            }
        };
        metrics::histogram!(m::FETCH_SECONDS, m::OUTCOME => outcome)
            .record(start.elapsed().as_secs_f64());
        metrics::counter!(m::FETCH_BYTES).increment(returned);
        metrics::counter!(m::CACHE_HIT_BYTES).increment(stats.hit_bytes);
        metrics::counter!(m::CACHE_MISS_BYTES).increment(stats.miss_bytes);
        metrics::counter!(m::FETCH_TIERED_BYTES).increment(tiered_bytes);
        result
    }

    /// [`Self::fetch`] without its metrics; `stats` receives where the bytes read came from,
    /// `tiered_bytes` the batch bytes taken from tiered segments.
    async fn serve(
        &self,
        requests: &[FetchPartition],
        fetch_max_bytes: u32,
        stats: &mut ReadStats,
        tiered_bytes: &mut u64,
    ) -> Result<Vec<FetchedPartition>, FetchError> {
        let find: Vec<FindBatchesRequest> = requests
            .iter()
            .map(|r| FindBatchesRequest {
                partition: r.partition,
                offset: r.fetch_offset,
                max_bytes: r.partition_max_bytes,
                isolation: r.isolation,
            })
            .collect();
        let found = self
            .coordinator
            .find_batches(&find, fetch_max_bytes)
            .await?;
        if found.len() != requests.len() {
            return Err(FetchError::Inconsistent(format!(
                "{} partitions asked, {} answered",
                requests.len(),
                found.len()
            )));
        }

        // KIP-74 limits, partition by partition in request order: tiered segments first (read
        // now: their batch sizes are known only from their bytes), then WAL batches.
        let mut limits = Limits {
            total: 0,
            fetch_max: u64::from(fetch_max_bytes),
            min_one: true,
            segments_seen: false,
        };
        // With a cache, the tiered reads of the partitions overlap: what each walk reads first is
        // loaded concurrently, then the walks run in order and find it in the cache.
        let prefetched = self
            .prefetch_tiered(requests, &found, u64::from(fetch_max_bytes))
            .await;
        let mut parts: Vec<PartitionRead> = Vec::with_capacity(requests.len());
        for (request, response) in requests.iter().zip(&found) {
            let mut part = PartitionRead::new(request.fetch_offset);
            if response.error.is_ok() {
                self.select(request, response, &mut limits, &mut part).await;
            }
            stats.add(part.stats);
            *tiered_bytes += part.tiered_bytes;
            parts.push(part);
        }
        // The walks found the prefetched bytes in the cache, but this fetch read them from
        // storage: they are misses.
        let moved = prefetched.miss_bytes.min(stats.hit_bytes);
        stats.hit_bytes -= moved;
        stats.miss_bytes += moved;

        // Read every selected batch, grouped by object; transaction markers have no stored bytes.
        let wanted: Vec<(Slot, &BatchCoordinate)> = parts
            .iter()
            .enumerate()
            .flat_map(|(pi, part)| {
                part.wal
                    .iter()
                    .enumerate()
                    .map(move |(bi, b)| ((pi, bi), b))
            })
            .filter(|(_, b)| !b.is_control())
            .collect();
        let (mut bytes_of, read) = self.read_batches(wanted).await;
        stats.add(read);

        // Inject offsets and build the answers.
        let mut out = Vec::with_capacity(requests.len());
        for (pi, ((request, response), mut part)) in
            requests.iter().zip(found).zip(parts).enumerate()
        {
            let mut answer = FetchedPartition {
                partition: request.partition,
                error: response.error,
                error_message: None,
                high_watermark: response.high_watermark,
                log_start_offset: response.log_start_offset,
                last_stable_offset: response.last_stable_offset,
                aborted_transactions: None,
                records: std::mem::take(&mut part.records),
            };
            if !response.error.is_ok() {
                answer.high_watermark = -1;
                answer.log_start_offset = -1;
                answer.last_stable_offset = -1;
                out.push(answer);
                continue;
            }
            // The end of what is served: the aborted transactions are cut to it.
            let tiered_end = part.tiered_end();
            let mut served_end = tiered_end;
            if let Some(e) = part.error.take() {
                warn!(partition = %request.partition, error = %e, "reading a tiered segment failed");
                if answer.records.is_empty() {
                    answer.error = ErrorCode::KafkaStorageError;
                    answer.error_message = Some(e);
                }
            }
            for (bi, coordinate) in part.wal.iter().enumerate() {
                let served = if let Some(marker) = coordinate.control {
                    Ok(serve_marker(coordinate, marker, request.leader_epoch))
                } else {
                    match bytes_of.remove(&(pi, bi)) {
                        Some(Ok(bytes)) => serve_batch(bytes, coordinate, request.leader_epoch),
                        Some(Err(e)) => Err(e),
                        None => Err("batch bytes missing".to_string()),
                    }
                };
                match served {
                    Ok(chunks) => {
                        answer.records.extend(chunks);
                        served_end = coordinate.last_offset.checked_add(1);
                    }
                    Err(e) => {
                        // Serve what precedes the failure; fail the partition if nothing does.
                        if answer.records.is_empty() {
                            answer.error = ErrorCode::KafkaStorageError;
                            answer.error_message = Some(e);
                        }
                        break;
                    }
                }
            }
            if request.isolation == IsolationLevel::ReadCommitted && answer.error.is_ok() {
                let mut from_segments = Vec::new();
                if let (Some(tiered_end), Some(end)) = (tiered_end, served_end) {
                    let into_wal = end > tiered_end;
                    match self.tiered_aborted(request, &part, end, into_wal).await {
                        Ok(found) => from_segments = found,
                        Err(e) => {
                            // Records without their aborted transactions would show aborted
                            // records as committed: the partition fails instead.
                            warn!(
                                partition = %request.partition,
                                error = %e,
                                "reading a tiered segment's transaction index failed"
                            );
                            answer.error = ErrorCode::KafkaStorageError;
                            answer.error_message = Some(e);
                            answer.records.clear();
                            out.push(answer);
                            continue;
                        }
                    }
                }
                let mut wal_rows = response.aborted.unwrap_or_default();
                wal_rows.append(&mut part.wal_aborted);
                let aborted = merge_aborted(from_segments, served_aborted(wal_rows, served_end));
                answer.aborted_transactions = Some(aborted);
            }
            out.push(answer);
        }
        Ok(out)
    }
}

impl Fetcher {
    /// Takes what KIP-74's limits allow of one partition, from `response` on: its tiered
    /// segments (read now), then its WAL batches (read later with every partition's). When the
    /// coordinator's answer ran out before the limits did — it counts the segment holding the
    /// fetch offset whole, the fetch reads it from that offset, so after a segment was seen the
    /// coordinator's limits are tighter than the fetch's — the coordinator is asked again
    /// from where the answer ended (at most [`MAX_FOLLOW_UPS`] times), so that an answer is the
    /// same whichever tier holds the offsets.
    async fn select(
        &self,
        request: &FetchPartition,
        response: &FindBatchesResponse,
        limits: &mut Limits,
        part: &mut PartitionRead,
    ) {
        let max = u64::from(request.partition_max_bytes);
        let committed = request.isolation == IsolationLevel::ReadCommitted;
        let readable_end = if committed {
            response.last_stable_offset
        } else {
            response.high_watermark
        };
        let mut follow_up: Option<FindBatchesResponse> = None;
        for round in 0..=MAX_FOLLOW_UPS {
            let answer = follow_up.as_ref().unwrap_or(response);
            if !answer.segments.is_empty() {
                limits.segments_seen = true;
                if !part.wal.is_empty() {
                    // Offsets tiered after the WAL batches already taken: never out of order.
                    return;
                }
                if !self
                    .read_tiered(request, &answer.segments, readable_end, limits, part)
                    .await
                {
                    return;
                }
            }
            for batch in &answer.batches {
                if batch.last_offset < part.next_offset {
                    continue;
                }
                // A follow-up answer may hold batches committed since `response`'s bounds.
                if batch.last_offset >= readable_end {
                    return;
                }
                // WAL batches are never compacted: they follow each other. Between the tiers,
                // compaction may have removed the last segment's tail (issue #29).
                let gap_allowed = part.wal.is_empty() && batch.base_offset > part.next_offset;
                if (part.tiered_bytes > 0 || !part.wal.is_empty())
                    && batch.base_offset != part.next_offset
                    && !gap_allowed
                {
                    part.error = Some(format!(
                        "the WAL tier continues at {} after offset {}",
                        batch.base_offset,
                        part.next_offset - 1
                    ));
                    return;
                }
                let size = u64::from(batch.byte_size);
                if !limits.admits(part.bytes, max, size) {
                    return;
                }
                part.bytes += size;
                limits.take(size);
                part.next_offset = batch.last_offset + 1;
                part.wal.push(batch.clone());
            }
            // Everything of the answer was taken: ask for more if the limits leave room for a
            // batch and the partition has more.
            let answered_end = answer
                .batches
                .last()
                .map(|b| b.last_offset)
                .or_else(|| answer.segments.last().map(|s| s.end_offset));
            let budget =
                (max.saturating_sub(part.bytes)).min(limits.fetch_max.saturating_sub(limits.total));
            // Only a segment makes the coordinator count more than the fetch takes (in this
            // partition's answer, or in the request total for the partitions after it).
            let more = limits.segments_seen
                && answered_end.is_some_and(|end| end + 1 == part.next_offset)
                && part.next_offset < readable_end
                && budget >= HEADER_LEN as u64;
            if !more || round == MAX_FOLLOW_UPS {
                return;
            }
            let budget = u32::try_from(budget).unwrap_or(u32::MAX);
            let again = self
                .coordinator
                .find_batches(
                    &[FindBatchesRequest {
                        partition: request.partition,
                        offset: part.next_offset,
                        max_bytes: budget,
                        isolation: request.isolation,
                    }],
                    budget,
                )
                .await;
            match again.map(|mut a| a.pop()) {
                Ok(Some(a)) if a.error.is_ok() => {
                    part.wal_aborted.extend(a.aborted.iter().flatten().copied());
                    follow_up = Some(a);
                }
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(partition = %request.partition, error = %e, "follow-up find_batches failed");
                    return;
                }
            }
        }
    }
}

/// How many times one partition of a fetch asks the coordinator again when its answer ran out
/// before the byte limits did.
const MAX_FOLLOW_UPS: usize = 2;

/// The aborted transactions of both tiers, by ABORT marker offset, each once (a segment
/// registered between the coordinator's answer and a `.txnindex` read holds rows the answer
/// reported too).
fn merge_aborted(tiered: Vec<AbortedTxn>, wal: Vec<AbortedTxn>) -> Vec<AbortedTxn> {
    let mut all: Vec<AbortedTxn> = tiered.into_iter().chain(wal).collect();
    all.sort_by_key(|a| (a.last_offset, a.producer_id));
    all.dedup();
    all
}

/// The aborted transactions of a `read_committed` answer, cut to the records served (`end`: the
/// offset after the last served batch; `None` when nothing was served). The coordinator collected
/// them for the batches it found (Kafka's `collectAbortedTxns` up to their end); the fetch may serve
/// fewer (its own byte limits, a storage error), and Kafka's rule for the shorter range keeps exactly
/// the entries that start before it: an entry after the coordinator's stop entry never does.
fn served_aborted(aborted: Vec<AbortedTxn>, end: Option<i64>) -> Vec<AbortedTxn> {
    match end {
        Some(end) => aborted
            .into_iter()
            .filter(|a| a.first_offset < end)
            .collect(),
        None => Vec::new(),
    }
}

/// A transaction marker's control batch, built from its coordinate (it has no stored bytes).
fn serve_marker(
    coordinate: &BatchCoordinate,
    marker: EndTxnMarker,
    leader_epoch: i32,
) -> [Bytes; 2] {
    let bytes = control::end_txn_marker(&control::MarkerBatch {
        base_offset: coordinate.base_offset,
        partition_leader_epoch: leader_epoch,
        producer_id: coordinate.producer_id,
        producer_epoch: coordinate.producer_epoch,
        commit: marker.commit,
        coordinator_epoch: marker.coordinator_epoch,
        timestamp: coordinate.effective_max_timestamp(),
        log_append_time: coordinate.timestamp_type.is_log_append_time(),
    });
    [bytes.slice(..HEADER_LEN), bytes.slice(HEADER_LEN..)]
}

/// Checks that stored bytes are the batch the coordinates describe, and injects the assigned offsets.
fn serve_batch(
    bytes: Bytes,
    coordinate: &BatchCoordinate,
    leader_epoch: i32,
) -> Result<[Bytes; 2], String> {
    let batch = frame_stored_batch(bytes, coordinate)?;
    // With LogAppendTime, or a maxTimestamp to correct, the CRC is recomputed, so the stored one is
    // checked first (same pass): corruption must reach the consumer as an error, never behind a
    // fresh valid CRC.
    rewrite_batch_verified(
        &batch,
        &BatchRewrite::for_coordinate(coordinate, leader_epoch),
    )
    .map(RewrittenBatch::into_chunks)
    .map_err(|e| {
        format!(
            "stored batch at {}+{} of {}: {e}",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        )
    })
}

/// Frames stored bytes as one batch and checks that it is the batch the coordinates describe (its
/// size and its number of records). The CRC is left to the caller.
pub(crate) fn frame_stored_batch(
    bytes: Bytes,
    coordinate: &BatchCoordinate,
) -> Result<RecordBatch, String> {
    let batch = RecordBatch::parse(bytes).map_err(|e| {
        format!(
            "stored batch at {}+{} of {} does not frame: {e}",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        )
    })?;
    let records = coordinate
        .last_offset
        .checked_sub(coordinate.base_offset)
        .and_then(|d| d.checked_add(1));
    if batch.len() != coordinate.byte_size as usize
        || Some(i64::from(batch.last_offset_delta()) + 1) != records
    {
        return Err(format!(
            "stored batch at {}+{} of {} does not match its coordinates",
            coordinate.byte_offset, coordinate.byte_size, coordinate.object_key
        ));
    }
    Ok(batch)
}
