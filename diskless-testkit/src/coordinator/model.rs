//! [`InMemoryCoordinator`]: the reference model of a [`BatchCoordinator`].
//!
//! Written for obviousness, not speed: one mutex over plain maps and vectors, every rule spelled out
//! where it applies. The conformance suite and the model-based property tests compare real
//! implementations against it, so when the two disagree the model is the one to read first.
//!
//! # Decisions where Kafka leaves the batch-granularity answer open
//!
//! - **Rejected batches** are not stored and never count towards an object's live bytes. An object
//!   none of whose batches were appended (all rejected or duplicates, or no batches at all) is
//!   registered with zero live bytes and marked for deletion at its commit time: nothing will ever
//!   read it, and a cleaner can delete it after the grace period.
//! - **MAX_TIMESTAMP** (`-3`) answers the base offset of the earliest batch holding the largest
//!   effective max timestamp (log append time for LogAppendTime batches), together with that
//!   timestamp. Kafka before 3.8 answered the batch's last offset ("shallow" offset of max timestamp);
//!   Kafka 3.8+ (KAFKA-16310) answers the exact record, which for LogAppendTime is the batch's first
//!   record. At batch granularity the base offset is the answer that never skips the record with the
//!   largest timestamp when a consumer seeks to it. An empty partition answers offset `-1`.
//! - **Offsets answered by ListOffsets** are never below the log start offset (a batch that straddles
//!   the log start offset answers the log start offset), as Kafka's segment lookup starts at the log
//!   start offset.
//! - **Retention** follows Kafka 3.x `deleteOldSegments`: time first (a prefix of batches whose
//!   `now - effective max timestamp > retention.ms`), then size on what is left (delete the oldest batch
//!   only while the bytes left after deleting it stay `>= retention.bytes`). Partitions are visited in
//!   (topic id, partition) order; a pass stops after `max_batches` deletions and reports `more` when
//!   anything deletable remains.
//! - **Producer state** survives DeleteRecords and retention (Kafka keeps it since KIP-360); it goes
//!   with its topic. `expire_producers` deletes the state of a (partition, producer) whose last
//!   appended batch was committed `producer.id.expiration.ms` or more ago (Kafka's `>=`), but never
//!   less than twice `max_commit_age` ago (`diskless_coordinator::producer_expired`: a late commit
//!   the state guards may still land until then, issue #25). Kafka counts
//!   from the batch's max timestamp, which a producer sets (and `-1` would expire at once); the
//!   coordinator counts from its own commit time.
//! - **Retention of batches without timestamps** (effective max timestamp `< 0`): aged by their
//!   commit time, as Kafka ages a segment without timestamps by its modification time.
//! - **Commit deadline and fences**: see `diskless_coordinator::check_commit_deadline` and
//!   `BatchCoordinator::fence_orphans`; both are checked under the one state mutex, with the clock read
//!   there, before anything is applied.
//! - **Request validation** (whole call fails with `InvalidRequest`, nothing applied): a topic needs a
//!   non-nil id, a name Kafka accepts (`is_valid_topic_name`; `InvalidTopic` otherwise), at least one partition, `retention.ms`/`retention.bytes`
//!   `>= -1` and the other config values `>= 0`; a commit needs a non-empty key and owner list, an
//!   object size `<= i64::MAX`, and batches with at least one record and one byte lying inside the
//!   object; idempotent batches (producer id `>= 0`) with a base sequence `>= 0` need a last sequence
//!   equal to `(base + records - 1) mod 2^31`. A commit with no batches is valid. Producer-controlled
//!   fields are judged per batch (`diskless_coordinator::producer_field_error`).
//! - **Unsupported ListOffsets timestamps** (any negative value other than -1, -2, -3) answer
//!   `INVALID_REQUEST`.
//! - **Producer-id blocks** are consecutive from id 0 (`allocate_producer_ids`); the model keeps
//!   one counter, so its blocks never overlap.
//! - **CreatePartitions** appends empty partitions (log start 0, high watermark 0) under the
//!   topic's config; asking for no more partitions than the topic has is `INVALID_PARTITIONS`.
//! - **Topic config changes** apply to later calls: a later commit uses the new timestamp type
//!   (batches already committed keep theirs), later retention passes and producer expiry the new
//!   limits.
//!
//! # Transactions (KIP-98, the partition leader's part; docs/transactions.md)
//!
//! - **Order of the checks of a data batch**: producer fields, then duplicate, epoch and sequence
//!   as for any idempotent batch, then the transaction rules: a transactional batch without a
//!   producer id is `INVALID_RECORD`; while the producer has a transaction open in the partition a
//!   transactional batch of the same epoch continues it unless it was verified for another
//!   transaction (`CONCURRENT_TRANSACTIONS` for a newer one, whose predecessor's marker has not
//!   been written here yet; `INVALID_TXN_STATE` for an older one); one of a higher epoch (the next
//!   transaction of TV2 before this one's marker arrived) and a plain batch are
//!   `INVALID_TXN_STATE`; with none open a transactional batch opens one only if it is verified
//!   (`txn_seq`) for a transaction newer than every one already ended in the partition, else
//!   `INVALID_TXN_STATE` (Kafka's verification guard, made durable).
//! - **Markers** (`write_txn_markers`) take one offset each at the high watermark, 78 bytes, no
//!   object, the coordinator's now as timestamps; a marker with a `txn_seq` not above the
//!   producer's last ended one is a duplicate answered with the earlier marker's offset, and so is
//!   one older than the transaction open in the partition (nothing of it is there); then an older
//!   producer epoch is `INVALID_PRODUCER_EPOCH`, an older coordinator epoch
//!   `TRANSACTION_COORDINATOR_FENCED`, and a marker of a transaction newer than the open one
//!   `CONCURRENT_TRANSACTIONS` (a marker ends only the transaction it names). A written marker
//!   sets the producer's epoch (a new epoch clears its batch window, as a new epoch of data does),
//!   coordinator epoch, last append time,
//!   and ends its open transaction if any; an ABORT records `(producer, first offset, marker
//!   offset)` with the last stable offset right after the abort (the first offset of another
//!   producer's open transaction, else the marker's offset + 1).
//! - **Last stable offset** = the smallest first offset of the open transactions, raised to the log
//!   start offset, or the high watermark when none is open.
//! - **`read_committed` fetches** return only batches below the last stable offset (none, with an
//!   empty aborted list, from an offset at or above it) and the aborted transactions that overlap
//!   `[fetch offset, end of the last returned batch]`, by marker offset, up to and including the
//!   first whose last stable offset reaches that end (Kafka's `collectAbortedTxns`).
//! - **`read_committed` ListOffsets**: LATEST answers the last stable offset; a timestamp or
//!   MAX_TIMESTAMP lookup that finds an offset at or above it answers `-1` (Kafka's
//!   `lastFetchableOffset`).
//! - **Retention and DeleteRecords** are bounded by the high watermark as before; they may cut
//!   into an open transaction (its first offset stays, the last stable offset is then the log
//!   start); aborted transactions whose marker is below the new log start are dropped. A producer
//!   with an open transaction never expires.
//!
//! # Tiered segments (issue #15, docs/tiered-consolidation.md §0 and §2.4)
//!
//! - **A partition's log** is its registered segments (`Log::tiered`, offset order) followed by
//!   its WAL batches; `tiered_next_offset` is the first offset no segment ever covered. Segments
//!   are only ever added at the front of the WAL batches and removed as a prefix, so the two
//!   never overlap.
//! - **Commit time** of a WAL batch is its object's commit time; of a transaction marker (no
//!   object) the time it was written (its timestamp).
//! - **Candidates** (`tiering_candidates`): partitions whose first WAL batch is below the last
//!   stable offset and committed before `now − min_age`, and whose WAL bytes (markers count 78)
//!   reach `segment.bytes` or whose first WAL batch was committed `segment.ms` or more before
//!   `now` (the coordinator's commit time, not Kafka's producer-timestamp roll clock); in
//!   (topic id, partition) order after the cursor, at most `limit`.
//! - **Plan** (`segment_plan`): from the first WAL batch, batches below the last stable offset
//!   and committed before the bound, stopping at the first that is not; the limits
//!   (`max_bytes`, `max_batches`, `end − base ≤ i32::MAX`) bind from the second batch on, so a
//!   plan has at least one batch whenever the first qualifies. Its `aborted` are the aborted
//!   transactions whose marker it holds; `previous` is the last registered segment.
//! - **Registration** (`register_segment`), all under the one state mutex: request validation
//!   (`RegisterSegmentRequest::validate`), then the commit deadline and fence of the key, then
//!   idempotency (the same key, partition and range: `AlreadyRegistered`; any other known key:
//!   `ObjectAlreadyCommitted`), then the partition, then the range must be exactly the first
//!   WAL batches as counted (base, an end at a batch boundary, count, bytes) and below the last
//!   stable offset, else `Stale` with nothing applied. Applying: the covered batches go (their
//!   objects' live bytes drop; objects reaching 0 are marked, counted in `released_objects`),
//!   the aborted transactions whose marker is covered go, `tiered_next_offset` moves to `end + 1`,
//!   and the segment's object is registered (kind tiered segment, live bytes = `.log` size,
//!   owners `[owner]`). The segment's `retention_ts` is the largest retention time of its
//!   batches (effective max timestamp, or commit time without one). Bounds, sizes and
//!   producer states do not change.
//! - **Retention** runs over one prefix: segments (aged by `retention_ts`, sized by `.log`)
//!   then WAL batches; time first, then size on what is left; batches are reached only when
//!   every segment before them goes. A deleted segment releases its object's live bytes (it is
//!   then marked) and moves the log start past its end. Each segment counts one unit of the
//!   pass's budget (`segments_deleted`); `bytes_deleted` counts segments' `.log` bytes too.
//! - **DeleteRecords** deletes the segments that end below the target; a segment straddling it
//!   stays whole (reads skip below the log start). **delete_topic** releases every segment.
//! - **Fetch** (`find_batches`): segments and WAL batches form one sequence of items; the item
//!   containing the offset is always taken (a segment counts its whole `.log`), the next ones
//!   while the KIP-74 limits allow; a segment that does not fit ends the answer. A
//!   `read_committed` answer's aborted list holds the WAL tier's aborted transactions only: those
//!   whose marker is in a segment are in its `.txnindex`.
//! - **ListOffsets**: a timestamp or MAX_TIMESTAMP lookup looks at segments (their max
//!   timestamp) before batches and answers a segment's base offset (raised to the log start)
//!   with its max timestamp: the host finds the record in the segment. `-4` answers
//!   `max(log start, tiered_next_offset)`, `-5` answers `tiered_next_offset − 1` (`-1` when
//!   nothing was tiered).

use diskless_coordinator::{
    AbortedTxn, BatchCoordinate, BatchCoordinator, Capabilities, Clock, CommitBatch,
    CommitBatchResult, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    DeleteRecordsRequest, DeleteRecordsResponse, EARLIEST_TIMESTAMP, ErrorCode, FindBatchesRequest,
    FindBatchesResponse, IsolationLevel, LATEST_TIMESTAMP, ListOffsetsRequest, ListOffsetsResponse,
    MAX_TIMESTAMP, NO_TIMESTAMP, ObjectInfo, ObjectKind, ObjectToDelete, PRODUCER_BATCH_WINDOW,
    ProducerBatch, ProducerExpiryReport, ProducerIdBlock, ProducerState, RegisterSegmentOutcome,
    RegisterSegmentRequest, ReplaceSegmentsRequest, RetentionReport, SegmentPlan,
    SegmentPlanRequest, ShardId, TieredSegment, TieringCandidate, TimestampType, TopicConfig,
    TopicIdPartition, TopicInfo, TxnAnswer, TxnMarker, TxnMarkerResult, TxnRecord, TxnTransition,
    apply_txn_transition, check_commit_deadline, check_new_partition_count, expire_txn,
    fence_expiry_before, next_producer_id_block, object_key_time_ms, producer_expired,
    producer_field_error,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// ListOffsets `-4` (KIP-405's `EARLIEST_LOCAL_TIMESTAMP`; the host's constant is
/// `diskless_core::EARLIEST_LOCAL_TIMESTAMP`).
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// ListOffsets `-5` (KIP-1005's `LATEST_TIERED_TIMESTAMP`; `diskless_core::LATEST_TIERED_TIMESTAMP`).
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// The in-memory reference [`BatchCoordinator`]. See the [module docs](self) for the decisions it
/// embodies.
///
/// ```
/// use diskless_coordinator::{BatchCoordinator, CreateTopicRequest, ManualClock, TopicConfig};
/// use diskless_testkit::coordinator::InMemoryCoordinator;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let coordinator = InMemoryCoordinator::new(ManualClock::new(1_000));
/// coordinator
///     .create_topic(CreateTopicRequest {
///         topic_id: uuid::Uuid::from_u128(1),
///         name: "orders".into(),
///         partitions: 3,
///         config: TopicConfig::default(),
///     })
///     .await
///     .unwrap();
/// assert_eq!(coordinator.list_topics().await.unwrap().len(), 1);
/// # });
/// ```
#[derive(Debug)]
pub struct InMemoryCoordinator {
    clock: Arc<dyn Clock>,
    max_commit_age: Duration,
    /// `false` only in the mutant of the simulation's defect tests
    /// ([`InMemoryCoordinator::mutant_without_producer_state_floor`]).
    producer_state_floor: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    topics: BTreeMap<Uuid, Topic>,
    objects: BTreeMap<String, Object>,
    /// Fenced keys (`fence_orphans`) and their key times.
    fences: BTreeMap<String, i64>,
    /// The first producer id no block has taken.
    next_producer_id: i64,
    /// The transaction records, by transactional id (`txn_transition`).
    txn_records: BTreeMap<String, TxnRecord>,
}

#[derive(Debug)]
struct Topic {
    name: String,
    config: TopicConfig,
    partitions: Vec<Log>,
}

#[derive(Debug, Default)]
struct Log {
    log_start_offset: i64,
    high_watermark: i64,
    /// Live batches (transaction markers included) in offset order.
    batches: Vec<BatchCoordinate>,
    producers: BTreeMap<i64, ProducerState>,
    /// Aborted transactions by marker offset, each with the last stable offset right after it.
    aborted: Vec<(AbortedTxn, i64)>,
    /// Registered tiered segments in offset order, all below `tiered_next_offset` and below the
    /// live `batches`.
    tiered: Vec<TieredSegment>,
    /// The first offset no segment ever covered (0 when nothing was tiered).
    tiered_next_offset: i64,
}

impl Log {
    /// The last stable offset: the first offset of the earliest open transaction, never below the
    /// log start offset, else the high watermark.
    fn last_stable_offset(&self) -> i64 {
        self.producers
            .values()
            .filter_map(|p| p.current_txn_first_offset)
            .min()
            .map_or(self.high_watermark, |first| {
                first.max(self.log_start_offset).min(self.high_watermark)
            })
    }

    /// The aborted transactions a `read_committed` fetch from `fetch_offset` whose batches end
    /// before `upper` reports (Kafka's `TransactionIndex.collectAbortedTxns`).
    fn aborted_between(&self, fetch_offset: i64, upper: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        for (txn, lso_after) in self
            .aborted
            .iter()
            .filter(|(t, _)| t.last_offset >= fetch_offset)
        {
            if txn.first_offset < upper {
                out.push(*txn);
            }
            if *lso_after >= upper {
                break;
            }
        }
        out
    }

    /// Drops what the log no longer holds after its log start offset moved.
    fn forget_below_log_start(&mut self) {
        let start = self.log_start_offset;
        self.aborted.retain(|(t, _)| t.last_offset >= start);
    }
}

#[derive(Debug, Clone)]
struct Object {
    uploader_broker_id: i32,
    object_size: u64,
    live_bytes: u64,
    owners: Vec<ShardId>,
    committed_at: i64,
    marked_for_deletion_at: Option<i64>,
    kind: ObjectKind,
    /// For a tiered segment: its partition and offset range (what a retried registration must
    /// repeat to be `AlreadyRegistered`).
    segment: Option<(TopicIdPartition, i64, i64)>,
}

impl InMemoryCoordinator {
    /// An empty coordinator reading time from `clock`, with the default `max_commit_age`
    /// ([`diskless_coordinator::DEFAULT_MAX_COMMIT_AGE`]).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        InMemoryCoordinator {
            clock,
            max_commit_age: diskless_coordinator::DEFAULT_MAX_COMMIT_AGE,
            producer_state_floor: true,
            state: Mutex::new(State::default()),
        }
    }

    /// **A defect, for mutation tests only**: producer expiry without its floor of twice
    /// `max_commit_age` (the rule before issue #25), so a state may be forgotten while a late
    /// commit it guards can still land. The simulation's defect tests run it to show that they
    /// catch the duplicates and stuck transactions this causes.
    #[doc(hidden)]
    pub fn mutant_without_producer_state_floor(mut self) -> Self {
        self.producer_state_floor = false;
        self
    }

    /// Sets the commit deadline: commits of keys whose UUID v7 time is older than `now -
    /// max_commit_age` are refused.
    pub fn with_max_commit_age(mut self, max_commit_age: Duration) -> Self {
        self.max_commit_age = max_commit_age;
        self
    }

    /// How many fences are held (for tests of fence expiry).
    pub fn fence_count(&self) -> usize {
        self.state.lock().fences.len()
    }
}

/// Kafka's `inSequence`: `next` follows `last`, wrapping from `i32::MAX` to 0.
fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// What the producer rules say about one batch.
enum Verdict {
    Append,
    Duplicate(ProducerBatch),
    Reject(ErrorCode),
}

fn check_producer(state: Option<&ProducerState>, batch: &CommitBatch) -> Verdict {
    let Some(state) = state else {
        // No state: any epoch and sequence is accepted.
        return Verdict::Append;
    };
    if batch.producer_epoch == state.producer_epoch
        && let Some(original) = state.batches.iter().find(|b| {
            b.base_sequence == batch.base_sequence && b.last_sequence == batch.last_sequence
        })
    {
        return Verdict::Duplicate(original.clone());
    }
    if batch.producer_epoch < state.producer_epoch {
        return Verdict::Reject(ErrorCode::InvalidProducerEpoch);
    }
    if batch.producer_epoch > state.producer_epoch {
        return if batch.base_sequence == 0 {
            Verdict::Append
        } else {
            Verdict::Reject(ErrorCode::OutOfOrderSequenceNumber)
        };
    }
    match state.batches.last() {
        Some(last) if !in_sequence(last.last_sequence, batch.base_sequence) => {
            Verdict::Reject(ErrorCode::OutOfOrderSequenceNumber)
        }
        _ => Verdict::Append,
    }
}

/// What the transaction rules say about a batch the idempotent-producer rules would append:
/// `Ok(true)` when it opens a transaction, `Ok(false)` when it is appended without opening one.
fn check_txn(state: Option<&ProducerState>, batch: &CommitBatch) -> Result<bool, ErrorCode> {
    if !batch.transactional {
        return match state.and_then(|s| s.current_txn_first_offset) {
            // Kafka's `appendDataBatch`: a plain batch while the producer's transaction is open.
            Some(_) if batch.is_idempotent() => Err(ErrorCode::InvalidTxnState),
            _ => Ok(false),
        };
    }
    if !batch.is_idempotent() {
        return Err(ErrorCode::InvalidRecord);
    }
    if let Some(s) = state
        && s.current_txn_first_offset.is_some()
    {
        // Same epoch: the open transaction goes on, unless the batch was verified for another
        // one (a newer: its marker has not been written here yet, retriable; an older: stale).
        // A higher epoch: the producer's next transaction (TV2 bumps the epoch per transaction)
        // before this one's marker arrived.
        if batch.producer_epoch != s.producer_epoch {
            return Err(ErrorCode::InvalidTxnState);
        }
        return match (batch.txn_seq, s.current_txn_seq) {
            (Some(seq), Some(open)) if seq > open => Err(ErrorCode::ConcurrentTransactions),
            (Some(seq), Some(open)) if seq < open => Err(ErrorCode::InvalidTxnState),
            _ => Ok(false),
        };
    }
    let last_ended = state.map_or(-1, |s| s.last_ended_txn);
    match batch.txn_seq {
        Some(seq) if seq > last_ended => Ok(true),
        _ => Err(ErrorCode::InvalidTxnState),
    }
}

impl State {
    fn log_mut(&mut self, p: TopicIdPartition) -> Option<(&TopicConfig, &mut Log)> {
        let topic = self.topics.get_mut(&p.topic_id)?;
        let log = usize::try_from(p.partition)
            .ok()
            .and_then(|i| topic.partitions.get_mut(i))?;
        Some((&topic.config, log))
    }

    fn log(&self, p: TopicIdPartition) -> Option<&Log> {
        let topic = self.topics.get(&p.topic_id)?;
        usize::try_from(p.partition)
            .ok()
            .and_then(|i| topic.partitions.get(i))
    }

    /// Takes `bytes` off an object's live bytes, marking it when none are left.
    fn release(objects: &mut BTreeMap<String, Object>, key: &str, bytes: u64, now: i64) {
        if let Some(object) = objects.get_mut(key) {
            object.live_bytes = object.live_bytes.saturating_sub(bytes);
            if object.live_bytes == 0 && object.marked_for_deletion_at.is_none() {
                object.marked_for_deletion_at = Some(now);
            }
        }
    }

    /// Deletes the first `n` tiered segments of a log, moving its log start offset past them and
    /// releasing their objects (a segment's object holds its `.log` as live bytes); the `.log`
    /// bytes deleted.
    fn delete_segments(
        objects: &mut BTreeMap<String, Object>,
        log: &mut Log,
        n: usize,
        now: i64,
    ) -> u64 {
        let mut bytes = 0;
        for segment in log.tiered.drain(..n) {
            log.log_start_offset = log.log_start_offset.max(segment.end_offset + 1);
            bytes += segment.layout.log;
            Self::release(objects, &segment.object_key, segment.layout.log, now);
        }
        log.forget_below_log_start();
        bytes
    }

    /// Deletes the first `n` batches of a log, moving its log start offset past them.
    fn delete_prefix(
        objects: &mut BTreeMap<String, Object>,
        log: &mut Log,
        n: usize,
        now: i64,
    ) -> u64 {
        let mut bytes = 0;
        for batch in log.batches.drain(..n) {
            log.log_start_offset = log.log_start_offset.max(batch.last_offset + 1);
            bytes += u64::from(batch.byte_size);
            if !batch.is_control() {
                Self::release(objects, &batch.object_key, u64::from(batch.byte_size), now);
            }
        }
        log.forget_below_log_start();
        bytes
    }
}

/// When a batch was committed (coordinator clock): its object's commit time, or for a transaction
/// marker (no object) the time it was written, which is its timestamp.
fn commit_time(objects: &BTreeMap<String, Object>, batch: &BatchCoordinate) -> i64 {
    if batch.is_control() {
        return batch.base_timestamp;
    }
    // A live batch's object is always registered (objects go only when confirmed deleted, after
    // their live bytes reached 0).
    objects
        .get(&batch.object_key)
        .map_or(NO_TIMESTAMP, |o| o.committed_at)
}

/// The time retention ages a batch by: its effective max timestamp, or its commit time when it has
/// no timestamp.
fn retention_time(objects: &BTreeMap<String, Object>, batch: &BatchCoordinate) -> i64 {
    let t = batch.effective_max_timestamp();
    if t >= 0 {
        return t;
    }
    commit_time(objects, batch)
}

/// How many leading segments and then leading WAL batches retention would delete from `log`
/// right now: one prefix over segments then batches, by time, then by size on what is left.
fn retention_count(
    objects: &BTreeMap<String, Object>,
    config: &TopicConfig,
    log: &Log,
    now: i64,
) -> (usize, usize) {
    let (mut s, mut n) = (0, 0);
    if !config.cleanup_policy.deletes() {
        // cleanup.policy=compact: retention deletes nothing (Kafka's `UnifiedLog.deleteOldSegments`).
        return (s, n);
    }
    let segments = log.tiered.len();
    if config.retention_ms >= 0 {
        while s < segments && now.saturating_sub(log.tiered[s].retention_ts) > config.retention_ms {
            s += 1;
        }
        // Batches only once every segment before them goes: one prefix.
        while s == segments
            && n < log.batches.len()
            && now.saturating_sub(retention_time(objects, &log.batches[n])) > config.retention_ms
        {
            n += 1;
        }
    }
    if config.retention_bytes >= 0 {
        let mut remaining: i64 = log.tiered[s..]
            .iter()
            .map(|t| t.layout.log as i64)
            .chain(log.batches[n..].iter().map(|b| i64::from(b.byte_size)))
            .sum();
        while s < segments && remaining - log.tiered[s].layout.log as i64 >= config.retention_bytes
        {
            remaining -= log.tiered[s].layout.log as i64;
            s += 1;
        }
        while s == segments
            && n < log.batches.len()
            && remaining - i64::from(log.batches[n].byte_size) >= config.retention_bytes
        {
            remaining -= i64::from(log.batches[n].byte_size);
            n += 1;
        }
    }
    (s, n)
}

#[async_trait::async_trait]
impl BatchCoordinator for InMemoryCoordinator {
    /// The reference model serves every capability.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn create_topic(&self, request: CreateTopicRequest) -> Result<(), CoordinatorError> {
        request.validate()?;
        let mut state = self.state.lock();
        if state.topics.contains_key(&request.topic_id) {
            return Err(CoordinatorError::TopicAlreadyExists(
                request.topic_id.to_string(),
            ));
        }
        if state.topics.values().any(|t| t.name == request.name) {
            return Err(CoordinatorError::TopicAlreadyExists(request.name));
        }
        let partitions = (0..request.partitions).map(|_| Log::default()).collect();
        state.topics.insert(
            request.topic_id,
            Topic {
                name: request.name,
                config: request.config,
                partitions,
            },
        );
        Ok(())
    }

    async fn delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        let now = self.clock.now_ms();
        let mut state = self.state.lock();
        let topic = state
            .topics
            .remove(&topic_id)
            .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?;
        for log in topic.partitions {
            for segment in log.tiered {
                State::release(
                    &mut state.objects,
                    &segment.object_key,
                    segment.layout.log,
                    now,
                );
            }
            for batch in log.batches.into_iter().filter(|b| !b.is_control()) {
                State::release(
                    &mut state.objects,
                    &batch.object_key,
                    u64::from(batch.byte_size),
                    now,
                );
            }
        }
        Ok(())
    }

    async fn list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        let state = self.state.lock();
        let mut topics: Vec<TopicInfo> = state
            .topics
            .iter()
            .map(|(id, t)| TopicInfo {
                topic_id: *id,
                name: t.name.clone(),
                partitions: t.partitions.len() as i32,
                config: t.config.clone(),
            })
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    async fn commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        let mut state = self.state.lock();
        // The commit point: the clock is read with the state held, and nothing is applied when the
        // deadline passed or the key was fenced.
        let now = self.clock.now_ms();
        check_commit_deadline(&request.object_key, now, self.max_commit_age)?;
        if state.fences.contains_key(&request.object_key) {
            return Err(CoordinatorError::ObjectFenced(request.object_key));
        }
        if state.objects.contains_key(&request.object_key) {
            return Err(CoordinatorError::ObjectAlreadyCommitted(request.object_key));
        }
        let mut live_bytes = 0u64;
        let mut results = Vec::with_capacity(request.batches.len());
        for batch in &request.batches {
            let Some((config, log)) = state.log_mut(batch.partition) else {
                results.push(CommitBatchResult::error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            let timestamp_type = config.timestamp_type;
            if let Some(code) = producer_field_error(batch) {
                results.push(CommitBatchResult::error(code));
                continue;
            }
            let idempotent = batch.is_idempotent();
            if batch.transactional && !idempotent {
                results.push(CommitBatchResult::error(ErrorCode::InvalidRecord));
                continue;
            }
            if idempotent {
                match check_producer(log.producers.get(&batch.producer_id), batch) {
                    Verdict::Reject(code) => {
                        results.push(CommitBatchResult::error(code));
                        continue;
                    }
                    Verdict::Duplicate(original) => {
                        results.push(CommitBatchResult {
                            error: ErrorCode::None,
                            base_offset: original.base_offset,
                            log_append_time: original.log_append_time,
                            log_start_offset: log.log_start_offset,
                            duplicate: true,
                        });
                        continue;
                    }
                    Verdict::Append => {}
                }
            }
            let opens_txn = match check_txn(log.producers.get(&batch.producer_id), batch) {
                Ok(opens) => opens,
                Err(code) => {
                    results.push(CommitBatchResult::error(code));
                    continue;
                }
            };
            let base_offset = log.high_watermark;
            let last_offset = base_offset + i64::from(batch.record_count) - 1;
            let log_append_time = match timestamp_type {
                TimestampType::LogAppendTime => now,
                TimestampType::CreateTime => NO_TIMESTAMP,
            };
            log.high_watermark = last_offset + 1;
            log.batches.push(BatchCoordinate {
                object_key: request.object_key.clone(),
                object_size: request.object_size,
                byte_offset: batch.byte_offset,
                byte_size: batch.byte_size,
                base_offset,
                last_offset,
                base_timestamp: batch.base_timestamp,
                max_timestamp: batch.max_timestamp,
                timestamp_type,
                log_append_time,
                producer_id: batch.producer_id,
                producer_epoch: batch.producer_epoch,
                base_sequence: batch.base_sequence,
                last_sequence: batch.last_sequence,
                control: None,
            });
            live_bytes += u64::from(batch.byte_size);
            if idempotent {
                let producer = log.producers.entry(batch.producer_id).or_insert_with(|| {
                    ProducerState::new(batch.producer_id, batch.producer_epoch, now)
                });
                producer.last_append_ms = now;
                if opens_txn {
                    producer.current_txn_first_offset = Some(base_offset);
                    producer.current_txn_start_ms = now;
                    producer.current_txn_seq = batch.txn_seq;
                }
                if producer.producer_epoch != batch.producer_epoch {
                    // A new epoch starts a new window.
                    producer.producer_epoch = batch.producer_epoch;
                    producer.batches.clear();
                }
                producer.batches.push(ProducerBatch {
                    base_sequence: batch.base_sequence,
                    last_sequence: batch.last_sequence,
                    base_offset,
                    last_offset,
                    log_append_time,
                });
                if producer.batches.len() > PRODUCER_BATCH_WINDOW {
                    producer.batches.remove(0);
                }
            }
            results.push(CommitBatchResult {
                error: ErrorCode::None,
                base_offset,
                log_append_time,
                log_start_offset: log.log_start_offset,
                duplicate: false,
            });
        }
        state.objects.insert(
            request.object_key,
            Object {
                uploader_broker_id: request.uploader_broker_id,
                object_size: request.object_size,
                live_bytes,
                owners: request.owners,
                committed_at: now,
                marked_for_deletion_at: (live_bytes == 0).then_some(now),
                kind: ObjectKind::Wal,
                segment: None,
            },
        );
        Ok(results)
    }

    async fn find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        let state = self.state.lock();
        let mut total: u64 = 0;
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let error = FindBatchesResponse::error;
            let Some(log) = state.log(request.partition) else {
                responses.push(error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            if request.offset < log.log_start_offset || request.offset > log.high_watermark {
                responses.push(error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            let lso = log.last_stable_offset();
            let committed = request.isolation == IsolationLevel::ReadCommitted;
            // What the read may see: up to the high watermark, or the last stable offset (nothing
            // from an offset at or above it, even when the log start raised it into a batch).
            let end = match committed {
                true if request.offset >= lso => i64::MIN,
                true => lso,
                false => log.high_watermark,
            };
            // One sequence of items, segments (each counted by its whole `.log`) then WAL batches:
            // the first is always taken, the others while the limits allow; a segment that does
            // not fit ends the answer, so WAL batches follow only segments that reach them.
            let mut segments: Vec<TieredSegment> = Vec::new();
            let mut batches: Vec<BatchCoordinate> = Vec::new();
            let mut partition_bytes: u64 = 0;
            let mut taken = 0usize;
            let mut fits = |size: u64, taken: &mut usize| {
                let ok = partition_bytes + size <= u64::from(request.max_bytes)
                    && total + size <= u64::from(fetch_max_bytes);
                if *taken > 0 && !ok {
                    return false;
                }
                partition_bytes += size;
                total += size;
                *taken += 1;
                true
            };
            let mut complete = true;
            for segment in log
                .tiered
                .iter()
                .filter(|s| s.end_offset >= request.offset && s.base_offset < end)
            {
                if !fits(segment.layout.log, &mut taken) {
                    complete = false;
                    break;
                }
                segments.push(segment.clone());
            }
            if complete {
                for batch in log
                    .batches
                    .iter()
                    .filter(|b| b.last_offset >= request.offset && b.base_offset < end)
                {
                    if !fits(u64::from(batch.byte_size), &mut taken) {
                        break;
                    }
                    batches.push(batch.clone());
                }
            }
            let last_end = batches
                .last()
                .map(|b| b.last_offset)
                .or_else(|| segments.last().map(|s| s.end_offset));
            // Aborted transactions whose marker is in a segment are in its `.txnindex` (their rows
            // went with the segment's registration): only the WAL tier's rows are reported.
            let aborted = committed.then(|| match last_end {
                Some(last) => log.aborted_between(request.offset, last + 1),
                None => Vec::new(),
            });
            responses.push(FindBatchesResponse {
                error: ErrorCode::None,
                segments,
                batches,
                log_start_offset: log.log_start_offset,
                high_watermark: log.high_watermark,
                last_stable_offset: lso,
                aborted,
            });
        }
        Ok(responses)
    }

    async fn list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        let state = self.state.lock();
        let answer = |error, offset, timestamp| ListOffsetsResponse {
            error,
            offset,
            timestamp,
        };
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let Some(log) = state.log(request.partition) else {
                responses.push(answer(ErrorCode::UnknownTopicOrPartition, -1, NO_TIMESTAMP));
                continue;
            };
            // Kafka's `lastFetchableOffset`: nothing at or above it is found.
            let fetchable = match request.isolation {
                IsolationLevel::ReadCommitted => log.last_stable_offset(),
                IsolationLevel::ReadUncommitted => log.high_watermark,
            };
            // Segments and batches as one sequence of (base offset, max timestamp) items, in
            // offset order: a segment answers its base offset (raised to the log start) and its
            // max timestamp; the host finds the record inside it (the segment's time index).
            let items = || {
                log.tiered
                    .iter()
                    .map(|s| (s.base_offset, s.max_timestamp))
                    .chain(
                        log.batches
                            .iter()
                            .map(|b| (b.base_offset, b.effective_max_timestamp())),
                    )
            };
            let found = |(base, ts): (i64, i64)| {
                let offset = base.max(log.log_start_offset);
                if offset >= fetchable {
                    answer(ErrorCode::None, -1, NO_TIMESTAMP)
                } else {
                    answer(ErrorCode::None, offset, ts)
                }
            };
            let response = match request.timestamp {
                EARLIEST_TIMESTAMP => answer(ErrorCode::None, log.log_start_offset, NO_TIMESTAMP),
                LATEST_TIMESTAMP => answer(ErrorCode::None, fetchable, NO_TIMESTAMP),
                EARLIEST_LOCAL_TIMESTAMP => answer(
                    ErrorCode::None,
                    log.log_start_offset.max(log.tiered_next_offset),
                    NO_TIMESTAMP,
                ),
                LATEST_TIERED_TIMESTAMP => {
                    answer(ErrorCode::None, log.tiered_next_offset - 1, NO_TIMESTAMP)
                }
                MAX_TIMESTAMP => {
                    let mut best: Option<(i64, i64)> = None;
                    for item in items() {
                        // Strictly greater: the earliest item wins ties.
                        if best.is_none_or(|x| item.1 > x.1) {
                            best = Some(item);
                        }
                    }
                    best.map_or(answer(ErrorCode::None, -1, NO_TIMESTAMP), found)
                }
                t if t < 0 => answer(ErrorCode::InvalidRequest, -1, NO_TIMESTAMP),
                t => items()
                    .find(|(_, ts)| *ts >= t)
                    .map_or(answer(ErrorCode::None, -1, NO_TIMESTAMP), found),
            };
            responses.push(response);
        }
        Ok(responses)
    }

    async fn delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        let now = self.clock.now_ms();
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let error = |code| DeleteRecordsResponse {
                error: code,
                low_watermark: -1,
            };
            let Some(log) = state
                .topics
                .get_mut(&request.partition.topic_id)
                .and_then(|t| {
                    usize::try_from(request.partition.partition)
                        .ok()
                        .and_then(|i| t.partitions.get_mut(i))
                })
            else {
                responses.push(error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            let target = if request.offset == -1 {
                log.high_watermark
            } else {
                request.offset
            };
            if target < 0 || target > log.high_watermark {
                responses.push(error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            if target > log.log_start_offset {
                // Whole segments below the target go; one straddling it stays (reads skip below
                // the log start).
                let s = log
                    .tiered
                    .iter()
                    .take_while(|t| t.end_offset < target)
                    .count();
                State::delete_segments(&mut state.objects, log, s, now);
                let n = log
                    .batches
                    .iter()
                    .take_while(|b| b.last_offset < target)
                    .count();
                State::delete_prefix(&mut state.objects, log, n, now);
                log.log_start_offset = target;
                log.forget_below_log_start();
            }
            responses.push(DeleteRecordsResponse {
                error: ErrorCode::None,
                low_watermark: log.log_start_offset,
            });
        }
        Ok(responses)
    }

    async fn enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let now = self.clock.now_ms();
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let mut report = RetentionReport::default();
        let mut budget = u64::from(max_batches);
        'topics: for topic in state.topics.values_mut() {
            for log in &mut topic.partitions {
                if budget == 0 {
                    // Stop as soon as the budget is spent: no further partition is examined.
                    break 'topics;
                }
                let (s, n) = retention_count(&state.objects, &topic.config, log, now);
                // Segments first: batches are reached only once every due segment went.
                let take = (s as u64).min(budget);
                if take > 0 {
                    let bytes = State::delete_segments(&mut state.objects, log, take as usize, now);
                    report.segments_deleted += take;
                    report.bytes_deleted += bytes;
                    budget -= take;
                }
                let take = if take == s as u64 {
                    (n as u64).min(budget)
                } else {
                    0
                };
                if take > 0 {
                    let bytes = State::delete_prefix(&mut state.objects, log, take as usize, now);
                    report.batches_deleted += take;
                    report.bytes_deleted += bytes;
                    budget -= take;
                }
            }
        }
        report.more = max_batches > 0
            && report.batches_deleted + report.segments_deleted == u64::from(max_batches);
        Ok(report)
    }

    async fn objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        let state = self.state.lock();
        let mut marked: Vec<ObjectToDelete> = state
            .objects
            .iter()
            .filter_map(|(key, o)| {
                let at = o.marked_for_deletion_at?;
                (at < marked_before_ms).then(|| ObjectToDelete {
                    object_key: key.clone(),
                    marked_for_deletion_at: at,
                    object_size: o.object_size,
                    kind: o.kind,
                })
            })
            .collect();
        marked.sort_by(|a, b| {
            (a.marked_for_deletion_at, &a.object_key)
                .cmp(&(b.marked_for_deletion_at, &b.object_key))
        });
        marked.truncate(limit as usize);
        Ok(marked)
    }

    async fn confirm_deleted(&self, object_keys: &[String]) -> Result<(), CoordinatorError> {
        let mut state = self.state.lock();
        for key in object_keys {
            if state
                .objects
                .get(key)
                .is_some_and(|o| o.marked_for_deletion_at.is_some())
            {
                state.objects.remove(key);
                // The key can never be committed again (a retried commit would append batches to a
                // deleted object).
                if let Some(t) = object_key_time_ms(key) {
                    state.fences.entry(key.clone()).or_insert(t);
                }
            }
        }
        Ok(())
    }

    async fn fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let mut state = self.state.lock();
        let now = self.clock.now_ms();
        let expired_before = fence_expiry_before(now, self.max_commit_age);
        let expired: Vec<String> = state
            .fences
            .iter()
            .filter(|(_, t)| **t < expired_before)
            .map(|(k, _)| k.clone())
            .take(diskless_coordinator::FENCE_EXPIRY_BATCH as usize)
            .collect();
        for key in expired {
            state.fences.remove(&key);
        }
        let mut fenced = Vec::new();
        let mut seen = HashSet::new();
        for key in object_keys {
            if !seen.insert(key.as_str()) || state.objects.contains_key(key) {
                continue;
            }
            let Some(t) = object_key_time_ms(key) else {
                continue;
            };
            state.fences.entry(key.clone()).or_insert(t);
            fenced.push(key.clone());
        }
        Ok(fenced)
    }

    async fn expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        let now = self.clock.now_ms();
        let (floor, max_commit_age) = (self.producer_state_floor, self.max_commit_age);
        let mut state = self.state.lock();
        let mut report = ProducerExpiryReport::default();
        let budget = u64::from(max_producers);
        // BTreeMaps iterate topics by id, partitions by index, producers by id: the contract's order.
        'topics: for topic in state.topics.values_mut() {
            let expiration = topic.config.producer_id_expiration_ms;
            for log in &mut topic.partitions {
                let expired: Vec<i64> = log
                    .producers
                    .values()
                    .filter(|p| {
                        // Kafka's `isProducerExpired`: never while a transaction is open; and
                        // never before a late commit the state guards could still land (issue
                        // #25: the floor of `producer_expired`).
                        p.current_txn_first_offset.is_none()
                            && if floor {
                                producer_expired(now, p.last_append_ms, expiration, max_commit_age)
                            } else {
                                now.saturating_sub(p.last_append_ms) >= expiration
                            }
                    })
                    .map(|p| p.producer_id)
                    .collect();
                for id in expired {
                    if report.expired == budget {
                        break 'topics;
                    }
                    log.producers.remove(&id);
                    report.expired += 1;
                }
            }
        }
        report.more = max_producers > 0 && report.expired == budget;
        Ok(report)
    }

    async fn known_objects(&self, object_keys: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let state = self.state.lock();
        let mut seen = HashSet::new();
        Ok(object_keys
            .iter()
            .filter(|k| state.objects.contains_key(*k) && seen.insert(k.as_str()))
            .cloned()
            .collect())
    }

    async fn object_info(&self, object_key: &str) -> Result<Option<ObjectInfo>, CoordinatorError> {
        let state = self.state.lock();
        Ok(state.objects.get(object_key).map(|o| ObjectInfo {
            object_key: object_key.to_string(),
            uploader_broker_id: o.uploader_broker_id,
            object_size: o.object_size,
            live_bytes: o.live_bytes,
            owners: o.owners.clone(),
            committed_at: o.committed_at,
            marked_for_deletion_at: o.marked_for_deletion_at,
            kind: o.kind,
        }))
    }

    async fn producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        let state = self.state.lock();
        Ok(state
            .log(partition)
            .and_then(|log| log.producers.get(&producer_id).cloned()))
    }

    async fn allocate_producer_ids(&self, count: u32) -> Result<ProducerIdBlock, CoordinatorError> {
        let mut state = self.state.lock();
        let (block, next) = next_producer_id_block(state.next_producer_id, count)?;
        state.next_producer_id = next;
        Ok(block)
    }

    async fn create_partitions(
        &self,
        topic_id: Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        let mut state = self.state.lock();
        let topic = state
            .topics
            .get_mut(&topic_id)
            .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?;
        let current = i32::try_from(topic.partitions.len())
            .map_err(|_| CoordinatorError::Storage("too many partitions".into()))?;
        check_new_partition_count(current, new_total)?;
        for _ in current..new_total {
            topic.partitions.push(Log::default());
        }
        Ok(())
    }

    async fn alter_topic_config(
        &self,
        topic_id: Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        config.validate()?;
        let mut state = self.state.lock();
        let topic = state
            .topics
            .get_mut(&topic_id)
            .ok_or_else(|| CoordinatorError::UnknownTopic(topic_id.to_string()))?;
        topic.config = config;
        Ok(())
    }

    async fn list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        let state = self.state.lock();
        let log = state
            .log(partition)
            .ok_or_else(|| CoordinatorError::UnknownTopic(partition.to_string()))?;
        Ok(log.producers.values().cloned().collect())
    }

    /// Decided by `apply_txn_transition` (the rules are written once, in `diskless_coordinator`),
    /// under the one state mutex, with the clock read there.
    async fn txn_transition(
        &self,
        transition: TxnTransition,
    ) -> Result<TxnAnswer, CoordinatorError> {
        let mut state = self.state.lock();
        let now = self.clock.now_ms();
        let id = transition.transactional_id().to_string();
        let (answer, changed) = apply_txn_transition(state.txn_records.get(&id), &transition, now)?;
        if let Some(record) = changed {
            state.txn_records.insert(id, record);
        }
        Ok(answer)
    }

    async fn txn_endings(&self, limit: u32) -> Result<Vec<TxnRecord>, CoordinatorError> {
        let mut state = self.state.lock();
        let now = self.clock.now_ms();
        let mut expired = 0u32;
        let mut endings = Vec::new();
        for record in state.txn_records.values_mut() {
            if expired < limit
                && let Some(aborted) = expire_txn(record, now)
            {
                *record = aborted;
                expired += 1;
            }
            if record.status.is_prepared() && endings.len() < limit as usize {
                endings.push(record.clone());
            }
        }
        Ok(endings)
    }

    async fn describe_txn(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TxnRecord>, CoordinatorError> {
        Ok(self.state.lock().txn_records.get(transactional_id).cloned())
    }

    async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        let mut state = self.state.lock();
        let now = self.clock.now_ms();
        let mut results = Vec::with_capacity(markers.len());
        for marker in markers {
            let Some((config, log)) = state.log_mut(marker.partition) else {
                results.push(TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition));
                continue;
            };
            let timestamp_type = config.timestamp_type;
            if let Some(s) = log.producers.get(&marker.producer_id) {
                if marker.txn_seq.is_some_and(|seq| seq <= s.last_ended_txn) {
                    results.push(TxnMarkerResult {
                        error: ErrorCode::None,
                        offset: s.last_marker_offset,
                        duplicate: true,
                    });
                    continue;
                }
                // How the marker's transaction compares with the one open here, both numbered.
                let versus_open = marker
                    .txn_seq
                    .zip(
                        s.current_txn_seq
                            .filter(|_| s.current_txn_first_offset.is_some()),
                    )
                    .map(|(seq, open)| seq.cmp(&open));
                // A transaction older than the one open here has nothing in the partition.
                if versus_open == Some(std::cmp::Ordering::Less) {
                    results.push(TxnMarkerResult {
                        error: ErrorCode::None,
                        offset: s.last_marker_offset,
                        duplicate: true,
                    });
                    continue;
                }
                if marker.producer_epoch < s.producer_epoch {
                    results.push(TxnMarkerResult::error(ErrorCode::InvalidProducerEpoch));
                    continue;
                }
                if marker.coordinator_epoch < s.coordinator_epoch {
                    results.push(TxnMarkerResult::error(
                        ErrorCode::TransactionCoordinatorFenced,
                    ));
                    continue;
                }
                // A newer transaction's marker does not end the open one, whose own marker may
                // still come with another outcome.
                if versus_open == Some(std::cmp::Ordering::Greater) {
                    results.push(TxnMarkerResult::error(ErrorCode::ConcurrentTransactions));
                    continue;
                }
            }
            let offset = log.high_watermark;
            log.high_watermark = offset + 1;
            log.batches.push(BatchCoordinate::txn_marker(
                marker,
                offset,
                now,
                timestamp_type,
            ));
            // The first offset of another producer's open transaction: the last stable offset right
            // after an abort (Kafka's `ProducerStateManager.lastStableOffset`).
            let others_first = log
                .producers
                .values()
                .filter(|p| p.producer_id != marker.producer_id)
                .filter_map(|p| p.current_txn_first_offset)
                .min();
            let producer = log.producers.entry(marker.producer_id).or_insert_with(|| {
                ProducerState::new(marker.producer_id, marker.producer_epoch, now)
            });
            if producer.producer_epoch != marker.producer_epoch {
                producer.producer_epoch = marker.producer_epoch;
                producer.batches.clear();
            }
            producer.last_append_ms = now;
            producer.coordinator_epoch = marker.coordinator_epoch;
            producer.last_marker_offset = offset;
            if let Some(seq) = marker.txn_seq {
                producer.last_ended_txn = producer.last_ended_txn.max(seq);
            }
            producer.current_txn_start_ms = -1;
            producer.current_txn_seq = None;
            if let Some(first) = producer.current_txn_first_offset.take()
                && !marker.commit
            {
                let txn = AbortedTxn {
                    producer_id: marker.producer_id,
                    first_offset: first,
                    last_offset: offset,
                };
                log.aborted.push((txn, others_first.unwrap_or(offset + 1)));
            }
            results.push(TxnMarkerResult {
                error: ErrorCode::None,
                offset,
                duplicate: false,
            });
        }
        Ok(results)
    }

    async fn tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        let state = self.state.lock();
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let committed_before = now_ms.saturating_sub(min_age_ms);
        // BTreeMaps iterate topics by id and partitions by index: (topic id, partition) order.
        for (topic_id, topic) in &state.topics {
            for (index, log) in topic.partitions.iter().enumerate() {
                let partition = TopicIdPartition::new(*topic_id, index as i32);
                if after.is_some_and(|a| partition <= a) {
                    continue;
                }
                let Some(first) = log.batches.first() else {
                    continue;
                };
                let first_commit = commit_time(&state.objects, first);
                // Something can be consolidated: the first WAL batch is stable and old enough.
                if first.last_offset >= log.last_stable_offset() || first_commit >= committed_before
                {
                    continue;
                }
                let wal_bytes: i64 = log.batches.iter().map(|b| i64::from(b.byte_size)).sum();
                let due = wal_bytes >= i64::from(topic.config.segment_bytes)
                    || now_ms.saturating_sub(first_commit) >= topic.config.max_segment_ms();
                if !due {
                    continue;
                }
                out.push(TieringCandidate {
                    partition,
                    config: topic.config.clone(),
                    wal_bytes,
                    oldest_wal_commit_ms: first_commit,
                    tiered_next_offset: log.tiered_next_offset,
                });
                if out.len() == limit as usize {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    async fn segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        let state = self.state.lock();
        let Some(log) = state.log(request.partition) else {
            return Ok(SegmentPlan::error(ErrorCode::UnknownTopicOrPartition));
        };
        let lso = log.last_stable_offset();
        let mut batches: Vec<BatchCoordinate> = Vec::new();
        let mut bytes: u64 = 0;
        for batch in &log.batches {
            if batch.last_offset >= lso
                || commit_time(&state.objects, batch) >= request.committed_before_ms
            {
                break;
            }
            let size = u64::from(batch.byte_size);
            if let Some(first) = batches.first() {
                // The limits bind from the second batch on; offsets relative to the segment's
                // base must fit Kafka's `int` index entries.
                if bytes + size > request.max_bytes
                    || batches.len() >= request.max_batches as usize
                    || batch.last_offset - first.base_offset > i64::from(i32::MAX)
                {
                    break;
                }
            }
            bytes += size;
            batches.push(batch.clone());
        }
        let aborted = match (batches.first(), batches.last()) {
            (Some(first), Some(last)) => log
                .aborted
                .iter()
                .map(|(t, _)| *t)
                .filter(|t| t.last_offset >= first.base_offset && t.last_offset <= last.last_offset)
                .collect(),
            _ => Vec::new(),
        };
        Ok(SegmentPlan {
            error: ErrorCode::None,
            batches,
            previous: log.tiered.last().cloned(),
            log_start_offset: log.log_start_offset,
            high_watermark: log.high_watermark,
            aborted,
        })
    }

    async fn register_segment(
        &self,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        let mut guard = self.state.lock();
        let state = &mut *guard;
        // The commit point, as for `commit_file`: the clock read with the state held, nothing
        // applied past the deadline or for a fenced key.
        let now = self.clock.now_ms();
        check_commit_deadline(&request.object_key, now, self.max_commit_age)?;
        if state.fences.contains_key(&request.object_key) {
            return Err(CoordinatorError::ObjectFenced(request.object_key));
        }
        if let Some(known) = state.objects.get(&request.object_key) {
            let this = (request.partition, request.base_offset, request.end_offset);
            return match known.segment {
                Some(segment) if segment == this => Ok(RegisterSegmentOutcome::AlreadyRegistered),
                _ => Err(CoordinatorError::ObjectAlreadyCommitted(request.object_key)),
            };
        }
        let Some(log) = state.log(request.partition) else {
            return Ok(RegisterSegmentOutcome::UnknownPartition);
        };
        // The range must be exactly the partition's first WAL batches, as the request counts
        // them, and stable.
        let Some(first) = log.batches.first() else {
            return Ok(RegisterSegmentOutcome::Stale);
        };
        let Some(n) = log
            .batches
            .iter()
            .position(|b| b.last_offset == request.end_offset)
            .map(|i| i + 1)
        else {
            return Ok(RegisterSegmentOutcome::Stale);
        };
        let covered = &log.batches[..n];
        let bytes: u64 = covered.iter().map(|b| u64::from(b.byte_size)).sum();
        if first.base_offset != request.base_offset
            || n != request.batch_count as usize
            || bytes != request.batch_bytes
            || request.end_offset >= log.last_stable_offset()
        {
            return Ok(RegisterSegmentOutcome::Stale);
        }
        let retention_ts = covered
            .iter()
            .map(|b| retention_time(&state.objects, b))
            .max()
            .unwrap_or(NO_TIMESTAMP);
        // Now apply, the log borrowed mutably (its topic exists: checked above).
        let Some((_, log)) = state.log_mut(request.partition) else {
            return Ok(RegisterSegmentOutcome::UnknownPartition);
        };
        let covered: Vec<BatchCoordinate> = log.batches.drain(..n).collect();
        log.aborted
            .retain(|(t, _)| t.last_offset > request.end_offset);
        log.tiered_next_offset = request.end_offset + 1;
        log.tiered.push(TieredSegment {
            object_key: request.object_key.clone(),
            object_size: request.object_size,
            layout: request.layout,
            base_offset: request.base_offset,
            end_offset: request.end_offset,
            max_timestamp: request.max_timestamp,
            max_timestamp_offset: request.max_timestamp_offset,
            retention_ts,
            batch_count: request.batch_count,
            registered_at: now,
            compacted: false,
        });
        let mut released_objects = 0;
        for batch in covered.iter().filter(|b| !b.is_control()) {
            let was_live = state
                .objects
                .get(&batch.object_key)
                .is_some_and(|o| o.marked_for_deletion_at.is_none());
            State::release(
                &mut state.objects,
                &batch.object_key,
                u64::from(batch.byte_size),
                now,
            );
            let marked = state
                .objects
                .get(&batch.object_key)
                .is_some_and(|o| o.marked_for_deletion_at.is_some());
            if was_live && marked {
                released_objects += 1;
            }
        }
        state.objects.insert(
            request.object_key,
            Object {
                uploader_broker_id: request.uploader_broker_id,
                object_size: request.object_size,
                live_bytes: request.layout.log,
                owners: vec![request.owner],
                committed_at: now,
                marked_for_deletion_at: None,
                kind: ObjectKind::TieredSegment,
                segment: Some((request.partition, request.base_offset, request.end_offset)),
            },
        );
        Ok(RegisterSegmentOutcome::Registered { released_objects })
    }

    async fn replace_segments(
        &self,
        request: ReplaceSegmentsRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        let mut guard = self.state.lock();
        let state = &mut *guard;
        // The commit point, as for `register_segment`.
        let now = self.clock.now_ms();
        if let Some(new) = &request.segment {
            check_commit_deadline(&new.object_key, now, self.max_commit_age)?;
            if state.fences.contains_key(&new.object_key) {
                return Err(CoordinatorError::ObjectFenced(new.object_key.clone()));
            }
            if let Some(known) = state.objects.get(&new.object_key) {
                let this = (new.partition, new.base_offset, new.end_offset);
                return match known.segment {
                    Some(segment) if segment == this => {
                        Ok(RegisterSegmentOutcome::AlreadyRegistered)
                    }
                    _ => Err(CoordinatorError::ObjectAlreadyCommitted(
                        new.object_key.clone(),
                    )),
                };
            }
        }
        let Some((_, log)) = state.log_mut(request.partition) else {
            return Ok(RegisterSegmentOutcome::UnknownPartition);
        };
        // Exactly the partition's segments from the first replaced one on.
        let Some(first) = request.replaced.first() else {
            return Ok(RegisterSegmentOutcome::Stale);
        };
        let Some(at) = log
            .tiered
            .iter()
            .position(|s| s.end_offset >= first.base_offset)
        else {
            return Ok(RegisterSegmentOutcome::Stale);
        };
        let n = request.replaced.len();
        let current = &log.tiered[at..(at + n).min(log.tiered.len())];
        if current.len() != n
            || current.iter().zip(&request.replaced).any(|(c, r)| {
                c.object_key != r.object_key
                    || c.base_offset != r.base_offset
                    || c.end_offset != r.end_offset
            })
        {
            return Ok(RegisterSegmentOutcome::Stale);
        }
        let replaced: Vec<TieredSegment> = log.tiered.drain(at..at + n).collect();
        let retention_ts = replaced
            .iter()
            .map(|s| s.retention_ts)
            .max()
            .unwrap_or(NO_TIMESTAMP);
        if let Some(new) = &request.segment {
            log.tiered.insert(
                at,
                TieredSegment {
                    object_key: new.object_key.clone(),
                    object_size: new.object_size,
                    layout: new.layout,
                    base_offset: new.base_offset,
                    end_offset: new.end_offset,
                    max_timestamp: new.max_timestamp,
                    max_timestamp_offset: new.max_timestamp_offset,
                    retention_ts,
                    batch_count: new.batch_count,
                    registered_at: now,
                    compacted: true,
                },
            );
        }
        let mut released_objects = 0;
        for segment in &replaced {
            let was_live = state
                .objects
                .get(&segment.object_key)
                .is_some_and(|o| o.marked_for_deletion_at.is_none());
            State::release(
                &mut state.objects,
                &segment.object_key,
                segment.layout.log,
                now,
            );
            let marked = state
                .objects
                .get(&segment.object_key)
                .is_some_and(|o| o.marked_for_deletion_at.is_some());
            if was_live && marked {
                released_objects += 1;
            }
        }
        if let Some(new) = request.segment {
            state.objects.insert(
                new.object_key,
                Object {
                    uploader_broker_id: new.uploader_broker_id,
                    object_size: new.object_size,
                    live_bytes: new.layout.log,
                    owners: vec![new.owner],
                    committed_at: now,
                    marked_for_deletion_at: None,
                    kind: ObjectKind::TieredSegment,
                    segment: Some((new.partition, new.base_offset, new.end_offset)),
                },
            );
        }
        Ok(RegisterSegmentOutcome::Registered { released_objects })
    }

    async fn list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        let state = self.state.lock();
        let log = state
            .log(partition)
            .ok_or_else(|| CoordinatorError::UnknownTopic(partition.to_string()))?;
        Ok(log
            .tiered
            .iter()
            .filter(|s| s.end_offset >= from_offset)
            .take(limit as usize)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::v7_key;
    use diskless_coordinator::{DEFAULT_MAX_COMMIT_AGE, ManualClock, max_age_ms};

    /// Fences are kept for twice the commit deadline after their key time, then dropped by the next
    /// `fence_orphans` call, so fence state stays bounded.
    #[tokio::test]
    async fn fences_expire_after_twice_the_commit_age() {
        let start = 1_700_000_000_000;
        let clock = ManualClock::new(start);
        let model = InMemoryCoordinator::new(clock.clone());
        let key = v7_key(start);
        model
            .fence_orphans(std::slice::from_ref(&key))
            .await
            .unwrap();
        assert_eq!(model.fence_count(), 1);
        let age = max_age_ms(DEFAULT_MAX_COMMIT_AGE);
        clock.advance(2 * age);
        model.fence_orphans(&[]).await.unwrap();
        assert_eq!(
            model.fence_count(),
            1,
            "kept until 2 × max_commit_age has passed"
        );
        clock.advance(1);
        model.fence_orphans(&[]).await.unwrap();
        assert_eq!(model.fence_count(), 0);
    }
}
