//! The transaction coordinator (KIP-98, transaction version 1: the classic flow librdkafka and
//! `kafka-clients` without KIP-890 part 2 speak): InitProducerId with a transactional id,
//! AddPartitionsToTxn (v0-3), AddOffsetsToTxn, TxnOffsetCommit, EndTxn (v0-4), the verification of
//! transactional Produce batches, transaction timeouts, DescribeTransactions and ListTransactions.
//!
//! The rules are Kafka's `TransactionCoordinator` / `TransactionMetadata` (docs/transactions.md
//! §1.4): one [`TxnMeta`] per transactional id, moved through the states of [`TxnState`] by the
//! pure `*_step` functions below (unit-tested as tables), each new state written to `broker.db`
//! ([`crate::store`]) before it is acted on or answered — the equivalent of Kafka's append to
//! `__transaction_state`.
//!
//! The partition leader's part is the batch coordinator's: markers go straight to
//! [`diskless_coordinator::BatchCoordinator::write_txn_markers`] (no WriteTxnMarkers round trip).
//! Every entry into `Ongoing` takes the next *transaction number* (`txn_seq`) of the transactional
//! id; a Produce batch verified to be in the ongoing transaction carries it
//! ([`diskless_core::ProducePartition::with_txn_seq`]) and so do the transaction's markers, which
//! makes markers idempotent and stops a late batch of an ended transaction from opening a new one.
//!
//! EndTxn: `Ongoing` → `Prepare{Commit,Abort}` (durable) → markers on every partition (retried
//! with backoff until written, the partition dropped if its topic is gone) → the group offsets of
//! the transaction installed (commit) or dropped (abort) together with `Complete{Commit,Abort}` in
//! one SQLite transaction. The answer is sent once the markers are written, or after
//! [`END_WAIT`] with the outcome already decided (the `Prepare*` row), as Kafka answers once its
//! prepare record is durable. A restarted broker completes every `Prepare*` transaction it finds
//! and the timeout sweeper aborts every `Ongoing` one whose timeout (counted from its persisted
//! start) has passed, so no transaction is left hanging. The coordinator epoch is bumped on every
//! start; markers carry it.
//!
//! Transactions belong to this process (as consumer groups do): several broker processes on one
//! PostgreSQL coordinator would each coordinate the transactional ids their clients bring.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use diskless_coordinator::{ErrorCode, TopicIdPartition, TxnMarker};
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse,
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TopicName,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse, describe_transactions_response,
    list_transactions_response,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use crate::broker::Broker;
use crate::codes;
use crate::offsets::{OffsetToCommit, check_offsets, stored_code};
use crate::server::Ctx;

/// Kafka's `transaction.max.timeout.ms` default: a longer `transaction.timeout.ms` is refused.
pub(crate) const MAX_TRANSACTION_TIMEOUT_MS: i32 = 900_000;
/// How often Ongoing transactions are checked against their timeout (Kafka's
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` is 10 s; an in-memory scan is
/// cheap, and a short interval keeps a timed-out transaction's partitions unstable for less time).
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How long EndTxn waits for the markers before answering (the outcome is durable already).
const END_WAIT: Duration = Duration::from_secs(5);
/// Longest pause between two attempts at writing markers.
const MAX_MARKER_BACKOFF: Duration = Duration::from_secs(5);

const NO_EPOCH: i16 = -1;
const NO_PRODUCER_ID: i64 = -1;

const NOT_ENOUGH_REPLICAS: i16 = 19;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const CONCURRENT_TRANSACTIONS: i16 = 51;
/// Kafka's `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`: a Produce with transactional batches but no
/// transactional id.
pub(crate) const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
/// Kafka's `UNSTABLE_OFFSET_COMMIT` (OffsetFetch `require_stable`).
pub(crate) const UNSTABLE_OFFSET_COMMIT: i16 = 88;
const PRODUCER_FENCED: i16 = 90;
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
const TRANSACTION_ABORTABLE: i16 = 120;

/// The states of a transactional id (Kafka's `TransactionState`, with its names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    /// Kafka's pending state while it fences an ongoing transaction; here the fence and the
    /// abort are one step (`PrepareAbort` with the bumped epoch), so it is never stored.
    PrepareEpochFence,
    /// Kafka's state of an expired transactional id; expired ids are deleted here instead.
    Dead,
}

const ALL_STATES: [TxnState; 8] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
    TxnState::PrepareEpochFence,
    TxnState::Dead,
];

impl TxnState {
    /// Kafka's name of the state (DescribeTransactions, ListTransactions, the store).
    pub(crate) fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
            TxnState::Dead => "Dead",
        }
    }

    /// The state named `name` (as [`TxnState::name`]).
    pub(crate) fn parse(name: &str) -> Option<TxnState> {
        ALL_STATES.into_iter().find(|s| s.name() == name)
    }

    fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// A partition of a transaction: (topic id, partition) → topic name.
pub(crate) type TxnPartitions = BTreeMap<(Uuid, i32), String>;

/// One transactional id's state (Kafka's `TransactionMetadata`; a row of `transactions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TxnMeta {
    pub transactional_id: String,
    /// `-1` until the first InitProducerId is stored.
    pub producer_id: i64,
    /// The producer id before the last rotation (epoch exhaustion), else `-1`.
    pub prev_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump when the client named its expected epoch (KIP-360 retries).
    pub last_producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// The number of the current (or last) transaction: incremented on every entry into Ongoing.
    pub txn_seq: i64,
    /// When the current transaction started (entry into Ongoing), ms since the epoch.
    pub start_ms: i64,
    pub last_update_ms: i64,
    /// The coordinator epoch of the process that last wrote the row.
    pub coordinator_epoch: i32,
    /// Transaction version 2: the producer id the transaction being ended hands over to (its epoch
    /// ran out), taken at `Prepare*` and switched to at `Complete*` (Kafka's `nextProducerId`);
    /// else `-1`.
    pub next_producer_id: i64,
    pub partitions: TxnPartitions,
    pub groups: BTreeSet<String>,
}

impl TxnMeta {
    /// A transactional id seen for the first time, with its new producer id (epoch -1: the first
    /// InitProducerId bumps it to 0).
    fn fresh(tid: &str, producer_id: i64, timeout_ms: i32, now: i64, epoch: i32) -> TxnMeta {
        TxnMeta {
            transactional_id: tid.to_string(),
            producer_id,
            prev_producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_EPOCH,
            last_producer_epoch: NO_EPOCH,
            timeout_ms,
            state: TxnState::Empty,
            txn_seq: 0,
            start_ms: -1,
            last_update_ms: now,
            coordinator_epoch: epoch,
            next_producer_id: NO_PRODUCER_ID,
            partitions: TxnPartitions::new(),
            groups: BTreeSet::new(),
        }
    }

    /// A not yet initialized entry (no InitProducerId stored).
    fn placeholder(tid: &str) -> TxnMeta {
        TxnMeta::fresh(tid, NO_PRODUCER_ID, 0, 0, 0)
    }

    fn is_initialized(&self) -> bool {
        self.producer_id >= 0
    }
}

/// Kafka's `TransactionMetadata.isEpochExhausted`.
fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// What InitProducerId does to a transactional id.
#[derive(Debug, PartialEq, Eq)]
enum InitStep {
    /// Store this and answer its producer id and epoch.
    Ready(TxnMeta),
    /// Store this (`PrepareAbort` with the bumped epoch), abort, answer CONCURRENT_TRANSACTIONS.
    Fence(TxnMeta),
}

/// Kafka's `prepareInitProducerIdTransit` on an initialized transactional id. `fresh_pid` is a
/// new producer id, needed when the epoch is exhausted (see [`needs_new_producer_id`] and
/// [`fence_needs_new_producer_id`]); `transaction_version` is the broker's finalized level, the
/// one Kafka fences an ongoing transaction with (see [`fence_step`]).
fn init_step(
    meta: &TxnMeta,
    expected: Option<(i64, i16)>,
    timeout_ms: i32,
    now: i64,
    fresh_pid: Option<i64>,
    coordinator_epoch: i32,
    transaction_version: i16,
) -> Result<InitStep, i16> {
    if let Some((pid, epoch)) = expected {
        // `isValidProducerId`.
        let valid = meta.producer_epoch == NO_EPOCH
            || pid == meta.producer_id
            || (pid == meta.prev_producer_id && epoch_exhausted(epoch));
        if !valid {
            return Err(PRODUCER_FENCED);
        }
    }
    match meta.state {
        TxnState::PrepareCommit
        | TxnState::PrepareAbort
        | TxnState::PrepareEpochFence
        | TxnState::Dead => Err(CONCURRENT_TRANSACTIONS),
        TxnState::Ongoing => Ok(InitStep::Fence(fence_step(
            meta,
            now,
            coordinator_epoch,
            transaction_version,
            fresh_pid,
        )?)),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
            let mut next = meta.clone();
            if epoch_exhausted(meta.producer_epoch) {
                // `prepareProducerIdRotation`.
                let Some(pid) = fresh_pid else {
                    return Err(codes::COORDINATOR_NOT_AVAILABLE);
                };
                next.prev_producer_id = meta.producer_id;
                next.producer_id = pid;
                next.producer_epoch = 0;
                next.last_producer_epoch = if expected.is_some() {
                    meta.producer_epoch
                } else {
                    NO_EPOCH
                };
            } else {
                // `prepareIncrementProducerEpoch`.
                let bumped = meta.producer_epoch + 1;
                match expected.map(|(_, e)| e) {
                    None => {
                        next.producer_epoch = bumped;
                        next.last_producer_epoch = NO_EPOCH;
                    }
                    // No current epoch: a new id; else the producer continues after an error.
                    Some(e) if meta.producer_epoch == NO_EPOCH || e == meta.producer_epoch => {
                        next.producer_epoch = bumped;
                        next.last_producer_epoch = meta.producer_epoch;
                    }
                    // A retry of a bump whose answer was lost: the same epoch again.
                    Some(e) if e == meta.last_producer_epoch => {}
                    Some(_) => return Err(PRODUCER_FENCED),
                }
            }
            next.timeout_ms = timeout_ms;
            next.state = TxnState::Empty;
            next.partitions.clear();
            next.groups.clear();
            next.last_update_ms = now;
            next.coordinator_epoch = coordinator_epoch;
            Ok(InitStep::Ready(next))
        }
    }
}

/// Whether InitProducerId on `meta` rotates to a new producer id (so one must be allocated).
fn needs_new_producer_id(meta: &TxnMeta) -> bool {
    meta.is_initialized()
        && epoch_exhausted(meta.producer_epoch)
        && matches!(
            meta.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        )
}

/// Whether fencing `meta`'s ongoing transaction (see [`fence_step`]) hands it over to a new
/// producer id, so one must be allocated: transaction version 2 with the epoch exhausted.
fn fence_needs_new_producer_id(meta: &TxnMeta, transaction_version: i16) -> bool {
    meta.is_initialized()
        && meta.state == TxnState::Ongoing
        && supports_epoch_bump(transaction_version)
        && epoch_exhausted(meta.producer_epoch)
}

/// Kafka's `TransactionVersion.supportsEpochBump`: transaction version 2 (KIP-890 part 2).
fn supports_epoch_bump(transaction_version: i16) -> bool {
    transaction_version >= 2
}

/// The coordinator's own abort of an ongoing transaction, when it times out (Kafka's
/// `TransactionCoordinator.abortTimedOutTransactions`) or another producer's InitProducerId
/// fences it (`prepareInitProducerIdTransit`): `TransactionMetadata.prepareFenceProducerEpoch`,
/// then `endTransaction(ABORT, isFromClient = false)` with the broker's finalized transaction
/// version (Kafka's `txnManager.transactionVersionLevel()`, not the client's), as one step: the
/// `PrepareAbort` to store; its markers carry its epoch.
///
/// - Transaction version 1 (`endTransactionWithTV1`, `isEpochFence`): the epoch is bumped
///   (never answered to a client) and `lastProducerEpoch` cleared.
/// - Transaction version 2 (`endTransaction`, `isEpochFence`): one bump, as every TV2 end
///   (`prepareAbortOrCommit`; KAFKA-19367 removed the second bump): `lastProducerEpoch` is the
///   epoch before, and the producer's own late EndTxn is then a retry ([`end_step_v2`]). An
///   exhausted epoch (`isProducerEpochExhausted`, `i16::MAX - 1`) hands the transaction over to
///   `fresh_pid` (Kafka's `nextProducerId`, allocated on this path since KAFKA-20090), switched
///   to at `Complete*`: no client is ever answered `i16::MAX`, and the fenced producer's id is
///   gone (INVALID_PRODUCER_ID_MAPPING), so it cannot open another transaction.
///
/// An epoch already at `i16::MAX` (no client is ever answered it, so only a bug gets there) is
/// not bumped: since KAFKA-20090 `prepareFenceProducerEpoch` logs an error and keeps it (it threw
/// `IllegalStateException` before, so the transaction could never be aborted) and the partition
/// leaders accept markers at that epoch; the caller logs the error.
fn fence_step(
    meta: &TxnMeta,
    now: i64,
    coordinator_epoch: i32,
    transaction_version: i16,
    fresh_pid: Option<i64>,
) -> Result<TxnMeta, i16> {
    let mut next = meta.clone();
    let bumped = meta.producer_epoch.saturating_add(1);
    if supports_epoch_bump(transaction_version) {
        if epoch_exhausted(meta.producer_epoch) {
            let Some(pid) = fresh_pid else {
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            };
            next.next_producer_id = pid;
        }
        next.last_producer_epoch = meta.producer_epoch;
    } else {
        next.last_producer_epoch = NO_EPOCH;
    }
    next.producer_epoch = bumped;
    next.state = TxnState::PrepareAbort;
    next.last_update_ms = now;
    next.coordinator_epoch = coordinator_epoch;
    Ok(next)
}

/// Whether `meta` is an ongoing transaction past its timeout at `now` (Kafka's
/// `TransactionStateManager.timedOutTransactions`).
fn timed_out(meta: &TxnMeta, now: i64) -> bool {
    meta.state == TxnState::Ongoing
        && meta.start_ms.saturating_add(i64::from(meta.timeout_ms)) < now
}

/// The checks every client call about an ongoing transaction starts with: producer id, then
/// epoch (`PRODUCER_FENCED`).
fn check_producer(meta: &TxnMeta, producer_id: i64, epoch: i16) -> Result<(), i16> {
    if !meta.is_initialized() || meta.producer_id != producer_id {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    }
    if meta.producer_epoch != epoch {
        return Err(PRODUCER_FENCED);
    }
    Ok(())
}

/// Kafka's `handleAddPartitionsToTransaction` (AddPartitionsToTxn v0-3 and AddOffsetsToTxn, whose
/// group stands for its `__consumer_offsets` partition): `None` when everything is in already.
fn add_step(
    meta: &TxnMeta,
    producer_id: i64,
    epoch: i16,
    partitions: &TxnPartitions,
    groups: &[String],
    now: i64,
    coordinator_epoch: i32,
) -> Result<Option<TxnMeta>, i16> {
    check_producer(meta, producer_id, epoch)?;
    match meta.state {
        TxnState::PrepareCommit
        | TxnState::PrepareAbort
        | TxnState::PrepareEpochFence
        | TxnState::Dead => return Err(CONCURRENT_TRANSACTIONS),
        TxnState::Ongoing
            if partitions.keys().all(|k| meta.partitions.contains_key(k))
                && groups.iter().all(|g| meta.groups.contains(g)) =>
        {
            return Ok(None);
        }
        _ => {}
    }
    let mut next = meta.clone();
    if meta.state != TxnState::Ongoing {
        next.state = TxnState::Ongoing;
        next.start_ms = now;
        next.txn_seq = meta.txn_seq + 1;
        next.partitions.clear();
        next.groups.clear();
    }
    next.partitions
        .extend(partitions.iter().map(|(k, v)| (*k, v.clone())));
    next.groups.extend(groups.iter().cloned());
    next.last_update_ms = now;
    next.coordinator_epoch = coordinator_epoch;
    Ok(Some(next))
}

/// Kafka's TV1 `endTransaction` from a client: `None` when it repeats a completed EndTxn.
fn end_step(
    meta: &TxnMeta,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    now: i64,
    coordinator_epoch: i32,
) -> Result<Option<TxnMeta>, i16> {
    check_producer(meta, producer_id, epoch)?;
    match (meta.state, commit) {
        (TxnState::Ongoing, _) => {
            let mut next = meta.clone();
            next.state = if commit {
                TxnState::PrepareCommit
            } else {
                TxnState::PrepareAbort
            };
            next.last_update_ms = now;
            next.coordinator_epoch = coordinator_epoch;
            Ok(Some(next))
        }
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(None),
        (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
            Err(CONCURRENT_TRANSACTIONS)
        }
        (TxnState::PrepareEpochFence | TxnState::Dead, _) => Err(CONCURRENT_TRANSACTIONS),
        _ => Err(INVALID_TXN_STATE),
    }
}

/// What EndTxn v5 (transaction version 2) does.
#[derive(Debug, PartialEq, Eq)]
enum EndV2 {
    /// Store this `Prepare*` (the epoch bumped) and end the transaction.
    Prepare(TxnMeta),
    /// A retry of an EndTxn already done (or being done): answer the current producer id and epoch.
    Repeat,
}

/// Kafka's `endTransaction` for transaction version 2 (`TransactionCoordinator`, the TV2 table):
/// every transaction's end bumps the producer epoch (the markers carry the new one, so a late
/// batch or marker of the old epoch is fenced everywhere), and the answer gives the client the
/// epoch of its next transaction. An ABORT with no transaction open (Empty, Complete*) still
/// bumps the epoch (Kafka: the client aborts after an error it cannot tell apart).
///
/// The checks, in Kafka's order:
/// 1. A transaction being ended (`Prepare*`: Kafka's pending `Complete*` while the markers are
///    written) answers CONCURRENT_TRANSACTIONS before anything else (KAFKA-18464, KAFKA-18660:
///    a client already on the producer id a rotation handed over must not be fenced).
/// 2. Another producer id is INVALID_PRODUCER_ID_MAPPING, unless `retryOnOverflow`: the
///    request names the producer id before a rotation with the last epoch (`i16::MAX - 1`) and
///    the rotated one is still at epoch 0.
/// 3. The epoch (`isValidEpoch`): Ongoing and Empty need the current epoch; Complete* take the
///    current one or a retry: `retryOnEpochBump` (the request's epoch is the current one - 1,
///    whoever bumped it: the client's own EndTxn or the coordinator's abort of a timed-out or
///    fenced transaction, see [`fence_step`]) or `retryOnOverflow`. Anything else is
///    PRODUCER_FENCED.
/// 4. The state table (`isRetry` = either retry): CompleteCommit answers a COMMIT retry and
///    bumps for an ABORT at the current epoch; CompleteAbort answers an ABORT retry (so a
///    producer whose transaction timed out and was aborted for it gets the new epoch and goes
///    on) and bumps for an ABORT at the current epoch; a COMMIT retry on CompleteAbort is
///    PRODUCER_FENCED (KAFKA-20785: only the coordinator's abort gets there, and
///    INVALID_TXN_STATE would be fatal to the client where transaction version 1 answers
///    PRODUCER_FENCED); every other combination is INVALID_TXN_STATE.
///
/// When the epoch runs out (at `i16::MAX - 1` the end bumps to the last epoch), the transaction
/// hands over to a new producer id (Kafka's `nextProducerId`), answered with epoch 0.
fn end_step_v2(
    meta: &TxnMeta,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    now: i64,
    coordinator_epoch: i32,
    fresh_pid: Option<i64>,
) -> Result<EndV2, i16> {
    if meta.state.is_prepare() {
        return Err(CONCURRENT_TRANSACTIONS);
    }
    // Kafka's `retryOnOverflow`: the retry of the end that rotated the producer id.
    let retry_on_overflow = meta.is_initialized()
        && meta.prev_producer_id != NO_PRODUCER_ID
        && producer_id == meta.prev_producer_id
        && epoch == i16::MAX - 1
        && meta.producer_epoch == 0;
    if !meta.is_initialized() || (meta.producer_id != producer_id && !retry_on_overflow) {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    }
    // Kafka's `retryOnEpochBump`: `txnMetadata.producerEpoch == producerEpoch + 1`.
    let retry_on_epoch_bump = i32::from(meta.producer_epoch) == i32::from(epoch) + 1;
    let is_retry = retry_on_epoch_bump || retry_on_overflow;
    // Kafka's TV2 `isValidEpoch`: the same epoch means the next EndTxn, so a retry is accepted
    // only where one can happen (the transaction having been ended).
    let valid = match meta.state {
        TxnState::Ongoing | TxnState::Empty | TxnState::Dead | TxnState::PrepareEpochFence => {
            epoch == meta.producer_epoch
        }
        TxnState::PrepareCommit | TxnState::PrepareAbort => retry_on_epoch_bump,
        TxnState::CompleteCommit | TxnState::CompleteAbort => {
            is_retry || epoch == meta.producer_epoch
        }
    };
    if !valid {
        return Err(PRODUCER_FENCED);
    }
    let bump = |state: TxnState, clear: bool| -> Result<EndV2, i16> {
        let mut next = meta.clone();
        if epoch_exhausted(meta.producer_epoch) {
            // The markers take the last epoch; the client's next transaction a new producer id
            // (switched to at `Complete*`).
            if meta.producer_epoch == i16::MAX {
                return Err(PRODUCER_FENCED);
            }
            let Some(pid) = fresh_pid else {
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            };
            next.next_producer_id = pid;
        }
        next.last_producer_epoch = meta.producer_epoch;
        next.producer_epoch = meta.producer_epoch + 1;
        next.state = state;
        next.last_update_ms = now;
        next.coordinator_epoch = coordinator_epoch;
        if clear {
            // An abort without a transaction: a new, empty one is aborted (no markers).
            next.partitions.clear();
            next.groups.clear();
        }
        Ok(EndV2::Prepare(next))
    };
    match (meta.state, commit) {
        (TxnState::Ongoing, true) => bump(TxnState::PrepareCommit, false),
        (TxnState::Ongoing, false) => bump(TxnState::PrepareAbort, false),
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) if is_retry => {
            Ok(EndV2::Repeat)
        }
        (TxnState::CompleteAbort, true) if is_retry => Err(PRODUCER_FENCED),
        (TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Empty, false)
            if !is_retry =>
        {
            bump(TxnState::PrepareAbort, true)
        }
        (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
            Err(CONCURRENT_TRANSACTIONS)
        }
        (TxnState::PrepareEpochFence | TxnState::Dead, _) => Err(CONCURRENT_TRANSACTIONS),
        _ => Err(INVALID_TXN_STATE),
    }
}

/// `Prepare*` → `Complete*` once every marker is written: the transaction's partitions and
/// groups are forgotten.
fn complete_step(meta: &TxnMeta, now: i64) -> TxnMeta {
    let mut next = meta.clone();
    if meta.next_producer_id != NO_PRODUCER_ID {
        // Transaction version 2's rotation (Kafka's `TransactionMetadata.prepareComplete`).
        // `lastProducerEpoch` stays the last epoch the client saw (`i16::MAX - 1`), so that an
        // InitProducerId naming it is the retry it is (`prepareIncrementProducerEpoch`).
        next.prev_producer_id = meta.producer_id;
        next.producer_id = meta.next_producer_id;
        next.producer_epoch = 0;
        next.next_producer_id = NO_PRODUCER_ID;
    }
    next.state = if meta.state == TxnState::PrepareCommit {
        TxnState::CompleteCommit
    } else {
        TxnState::CompleteAbort
    };
    next.partitions.clear();
    next.groups.clear();
    next.last_update_ms = now;
    next
}

/// The produce-side verification of a transactional batch (Kafka's `verifyTransaction` through
/// `AddPartitionsToTxnManager` and `ReplicaManager`'s mapping): the transaction number to write
/// with, or the Produce error code for `version`.
fn verify_step(
    meta: &TxnMeta,
    producer_id: i64,
    epoch: i16,
    partition: (Uuid, i32),
    version: i16,
) -> Result<i64, i16> {
    match check_producer(meta, producer_id, epoch) {
        Err(PRODUCER_FENCED) => return Err(INVALID_PRODUCER_EPOCH),
        Err(code) => return Err(code),
        Ok(()) => {}
    }
    match meta.state {
        // CONCURRENT_TRANSACTIONS, which old clients retry as NOT_ENOUGH_REPLICAS.
        TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
            Err(NOT_ENOUGH_REPLICAS)
        }
        TxnState::Ongoing if meta.partitions.contains_key(&partition) => Ok(meta.txn_seq),
        // TRANSACTION_ABORTABLE, INVALID_TXN_STATE for clients before Produce v11.
        _ if version >= 11 => Err(TRANSACTION_ABORTABLE),
        _ => Err(INVALID_TXN_STATE),
    }
}

/// TxnOffsetCommit's transaction checks (v0-3: the group must have been added with
/// AddOffsetsToTxn).
fn offsets_step(
    meta: &TxnMeta,
    producer_id: i64,
    epoch: i16,
    group: &str,
    version: i16,
) -> Result<(), i16> {
    match check_producer(meta, producer_id, epoch) {
        Err(PRODUCER_FENCED) => return Err(INVALID_PRODUCER_EPOCH),
        Err(code) => return Err(code),
        Ok(()) => {}
    }
    match meta.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
            Err(CONCURRENT_TRANSACTIONS)
        }
        TxnState::Ongoing if meta.groups.contains(group) => Ok(()),
        _ if version >= 4 => Err(TRANSACTION_ABORTABLE),
        _ => Err(INVALID_TXN_STATE),
    }
}

/// PRODUCER_FENCED for clients that know it; INVALID_PRODUCER_EPOCH below `min_version`
/// (Kafka's `KafkaApis` mapping).
fn fenced_for(code: i16, version: i16, min_version: i16) -> i16 {
    if code == PRODUCER_FENCED && version < min_version {
        INVALID_PRODUCER_EPOCH
    } else {
        code
    }
}

type Entry = Arc<AsyncMutex<TxnMeta>>;

/// Every transactional id of this process.
#[derive(Debug, Default)]
pub(crate) struct TxnCoordinator {
    txns: parking_lot::Mutex<HashMap<String, Entry>>,
    /// This process's coordinator epoch (bumped in `broker.db` at start).
    coordinator_epoch: AtomicI32,
}

impl TxnCoordinator {
    pub(crate) fn new() -> Arc<TxnCoordinator> {
        Arc::new(TxnCoordinator::default())
    }

    fn get(&self, tid: &str) -> Option<Entry> {
        self.txns.lock().get(tid).cloned()
    }

    fn get_or_create(&self, tid: &str) -> Entry {
        self.txns
            .lock()
            .entry(tid.to_string())
            .or_insert_with(|| Arc::new(AsyncMutex::new(TxnMeta::placeholder(tid))))
            .clone()
    }

    fn entries(&self) -> Vec<Entry> {
        self.txns.lock().values().cloned().collect()
    }

    fn epoch(&self) -> i32 {
        self.coordinator_epoch.load(Ordering::Relaxed)
    }

    /// Produce v12 (transaction version 2): the partition joins the producer's transaction (one
    /// is started if none is open, as AddPartitionsToTxn does), then the batch is verified.
    pub(crate) async fn add_and_verify(
        broker: &Broker,
        tid: &str,
        producer_id: i64,
        epoch: i16,
        partition: TopicIdPartition,
        topic_name: &str,
        version: i16,
    ) -> Result<i64, i16> {
        let mut partitions = TxnPartitions::new();
        partitions.insert(
            (partition.topic_id, partition.partition),
            topic_name.to_string(),
        );
        match add_to_txn(broker, tid, producer_id, epoch, &partitions, &[]).await {
            Ok(()) => {}
            // As Kafka's `AddPartitionsToTxnManager` maps them for Produce.
            Err(PRODUCER_FENCED) => return Err(INVALID_PRODUCER_EPOCH),
            Err(CONCURRENT_TRANSACTIONS) | Err(codes::COORDINATOR_NOT_AVAILABLE) => {
                return Err(NOT_ENOUGH_REPLICAS);
            }
            Err(code) => return Err(code),
        }
        broker
            .txns
            .verify(tid, producer_id, epoch, partition, version)
            .await
    }

    /// Verifies a transactional Produce batch of `producer_id`/`epoch` to `partition`: the
    /// transaction number to write it with, or the Produce error code.
    pub(crate) async fn verify(
        &self,
        tid: &str,
        producer_id: i64,
        epoch: i16,
        partition: TopicIdPartition,
        version: i16,
    ) -> Result<i64, i16> {
        let Some(entry) = self.get(tid) else {
            return Err(INVALID_PRODUCER_ID_MAPPING);
        };
        let meta = entry.lock().await;
        verify_step(
            &meta,
            producer_id,
            epoch,
            (partition.topic_id, partition.partition),
            version,
        )
    }
}

/// Loads the transactions of `broker.db` (bumping the coordinator epoch) and finishes every
/// transaction that was being ended when the last process stopped. Ongoing ones are left to the
/// timeout sweeper.
pub(crate) async fn load(broker: &Arc<Broker>) -> Result<(), String> {
    let epoch = broker
        .store
        .bump_coordinator_epoch()
        .await
        .map_err(|e| e.to_string())?;
    broker
        .txns
        .coordinator_epoch
        .store(epoch, Ordering::Relaxed);
    let loaded = broker.store.load_txns().await.map_err(|e| e.to_string())?;
    let mut resume = Vec::new();
    {
        let mut txns = broker.txns.txns.lock();
        for meta in loaded {
            let prepare = meta.state.is_prepare();
            let entry = Arc::new(AsyncMutex::new(meta.clone()));
            txns.insert(meta.transactional_id.clone(), entry.clone());
            if prepare {
                resume.push((meta, entry));
            }
        }
    }
    info!(
        coordinator_epoch = epoch,
        transactional_ids = broker.txns.txns.lock().len(),
        resumed = resume.len(),
        "transaction coordinator loaded"
    );
    for (meta, entry) in resume {
        info!(transactional_id = %meta.transactional_id, state = meta.state.name(), "completing a transaction of the previous process");
        tokio::spawn(complete(broker.clone(), entry));
    }
    Ok(())
}

/// Aborts, every [`SWEEP_INTERVAL`], the Ongoing transactions past their timeout (Kafka's
/// `abortTimedOutTransactions`: the producer is fenced, see [`fence_step`]). A transaction whose
/// new producer id cannot be allocated is left for the next pass, as Kafka's is.
pub(crate) async fn run_sweeper(broker: Arc<Broker>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for entry in broker.txns.entries() {
            let mut meta = entry.lock().await;
            if !timed_out(&meta, broker.clock.now_ms()) {
                continue;
            }
            let fresh = if fence_needs_new_producer_id(&meta, broker.transaction_version) {
                match new_producer_id(&broker).await {
                    Ok(pid) => Some(pid),
                    Err(_) => continue,
                }
            } else {
                None
            };
            let now = broker.clock.now_ms();
            let next = match fence_step(
                &meta,
                now,
                broker.txns.epoch(),
                broker.transaction_version,
                fresh,
            ) {
                Ok(next) => next,
                Err(code) => {
                    warn!(transactional_id = %meta.transactional_id, error_code = code, "cannot abort a timed-out transaction");
                    continue;
                }
            };
            if let Err(e) = broker.store.save_txn(&next).await {
                warn!(transactional_id = %meta.transactional_id, error = %e, "cannot store the abort of a timed-out transaction");
                continue;
            }
            log_fence_at_max_epoch(&meta);
            info!(
                transactional_id = %meta.transactional_id,
                producer_id = meta.producer_id,
                timeout_ms = meta.timeout_ms,
                epoch = next.producer_epoch,
                next_producer_id = next.next_producer_id,
                "transaction timed out: aborting it and fencing its producer"
            );
            *meta = next;
            drop(meta);
            tokio::spawn(complete(broker.clone(), entry.clone()));
        }
    }
}

/// Kafka's `prepareFenceProducerEpoch` error (since KAFKA-20090) when the epoch to fence is
/// already `i16::MAX`: it is kept, and the abort goes on at that epoch (see [`fence_step`]).
fn log_fence_at_max_epoch(meta: &TxnMeta) {
    if meta.producer_epoch == i16::MAX {
        error!(
            transactional_id = %meta.transactional_id,
            producer_id = meta.producer_id,
            "fencing a producer whose epoch is already i16::MAX: the epoch is kept (this must not happen unless there is a bug)"
        );
    }
}

/// Writes the markers of a `Prepare*` transaction, then completes its offsets and stores
/// `Complete*`. Idempotent (markers by transaction number, offsets by deleting pending rows).
async fn complete(broker: Arc<Broker>, entry: Entry) {
    let snapshot = entry.lock().await.clone();
    if !snapshot.state.is_prepare() {
        return;
    }
    let commit = snapshot.state == TxnState::PrepareCommit;
    write_markers(&broker, &snapshot, commit).await;
    // Wake the long-polling read_committed fetches: the last stable offset moved.
    broker.commits.send_modify(|n| *n = n.wrapping_add(1));
    let groups: Vec<String> = snapshot.groups.iter().cloned().collect();
    let mut backoff = Duration::from_millis(50);
    let mut meta = entry.lock().await;
    if meta.state != snapshot.state || meta.txn_seq != snapshot.txn_seq {
        return;
    }
    let next = complete_step(&meta, broker.clock.now_ms());
    loop {
        match broker
            .store
            .complete_txn(&next, snapshot.producer_id, &groups, commit)
            .await
        {
            Ok(()) => break,
            Err(e) => {
                warn!(transactional_id = %snapshot.transactional_id, error = %e, "cannot store the end of a transaction; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_MARKER_BACKOFF);
            }
        }
    }
    debug!(
        transactional_id = %snapshot.transactional_id,
        producer_id = snapshot.producer_id,
        txn_seq = snapshot.txn_seq,
        commit,
        partitions = snapshot.partitions.len(),
        "transaction completed"
    );
    *meta = next;
}

/// Writes one marker per partition of the transaction, retrying what failed for a retriable
/// reason until every partition is done or dropped.
async fn write_markers(broker: &Broker, meta: &TxnMeta, commit: bool) {
    let mut remaining: Vec<TxnMarker> = meta
        .partitions
        .keys()
        .map(|&(topic_id, partition)| TxnMarker {
            partition: TopicIdPartition::new(topic_id, partition),
            producer_id: meta.producer_id,
            producer_epoch: meta.producer_epoch,
            coordinator_epoch: broker.txns.epoch(),
            commit,
            txn_seq: Some(meta.txn_seq),
        })
        .collect();
    let mut backoff = Duration::from_millis(50);
    while !remaining.is_empty() {
        match broker.coordinator.write_txn_markers(&remaining).await {
            Ok(results) if results.len() == remaining.len() => {
                let mut retry = Vec::new();
                for (marker, result) in remaining.iter().zip(results) {
                    match result.error {
                        ErrorCode::None => {}
                        ErrorCode::UnknownTopicOrPartition => {
                            debug!(partition = %marker.partition, "marker dropped: the topic is gone");
                        }
                        ErrorCode::InvalidProducerEpoch
                        | ErrorCode::TransactionCoordinatorFenced => {
                            warn!(transactional_id = %meta.transactional_id, partition = %marker.partition, error = ?result.error, "marker refused: the transaction was superseded");
                        }
                        other => {
                            debug!(partition = %marker.partition, error = ?other, "marker not written; retrying");
                            retry.push(*marker);
                        }
                    }
                }
                remaining = retry;
            }
            Ok(results) => {
                warn!(
                    markers = remaining.len(),
                    results = results.len(),
                    "the coordinator answered a different number of markers; retrying"
                );
            }
            Err(e) => {
                warn!(transactional_id = %meta.transactional_id, error = %e, "cannot write transaction markers; retrying");
            }
        }
        if !remaining.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_MARKER_BACKOFF);
        }
    }
}

/// Starts the completion of a `Prepare*` transaction and waits up to [`END_WAIT`] for it.
async fn complete_and_wait(broker: &Arc<Broker>, entry: Entry) {
    let task = tokio::spawn(complete(broker.clone(), entry));
    let _ = tokio::time::timeout(END_WAIT, task).await;
}

fn expected_producer(producer_id: i64, epoch: i16) -> Option<(i64, i16)> {
    (producer_id != NO_PRODUCER_ID || epoch != NO_EPOCH).then_some((producer_id, epoch))
}

/// InitProducerId with a transactional id (v0-4).
pub(crate) async fn init_producer_id(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: InitProducerIdRequest,
    tid: &str,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    let code = init(broker, ctx, &request, tid).await;
    match code {
        Ok((pid, epoch)) => {
            response.producer_id = ProducerId(pid);
            response.producer_epoch = epoch;
        }
        Err(code) => {
            response.error_code = fenced_for(code, ctx.version, 4);
            response.producer_id = ProducerId(NO_PRODUCER_ID);
            response.producer_epoch = NO_EPOCH;
        }
    }
    response
}

async fn init(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: &InitProducerIdRequest,
    tid: &str,
) -> Result<(i64, i16), i16> {
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let timeout_ms = request.transaction_timeout_ms;
    if timeout_ms <= 0 || timeout_ms > MAX_TRANSACTION_TIMEOUT_MS {
        return Err(INVALID_TRANSACTION_TIMEOUT);
    }
    let expected = if ctx.version >= 3 {
        expected_producer(request.producer_id.0, request.producer_epoch)
    } else {
        None
    };
    let entry = broker.txns.get_or_create(tid);
    let mut meta = entry.lock().await;
    let now = broker.clock.now_ms();
    let epoch = broker.txns.epoch();
    let base = if meta.is_initialized() {
        meta.clone()
    } else {
        TxnMeta::fresh(tid, new_producer_id(broker).await?, timeout_ms, now, epoch)
    };
    let fresh = if needs_new_producer_id(&base)
        || fence_needs_new_producer_id(&base, broker.transaction_version)
    {
        Some(new_producer_id(broker).await?)
    } else {
        None
    };
    let step = init_step(
        &base,
        expected,
        timeout_ms,
        now,
        fresh,
        epoch,
        broker.transaction_version,
    )?;
    let next = match &step {
        InitStep::Ready(next) | InitStep::Fence(next) => next.clone(),
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store a transactional id");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    *meta = next.clone();
    drop(meta);
    match step {
        InitStep::Ready(_) => {
            debug!(transactional_id = %tid, producer_id = next.producer_id, epoch = next.producer_epoch, "transactional producer initialized");
            Ok((next.producer_id, next.producer_epoch))
        }
        InitStep::Fence(_) => {
            log_fence_at_max_epoch(&base);
            info!(transactional_id = %tid, producer_id = next.producer_id, "InitProducerId fences the ongoing transaction of an older producer: aborting it");
            complete_and_wait(broker, entry).await;
            Err(CONCURRENT_TRANSACTIONS)
        }
    }
}

async fn new_producer_id(broker: &Broker) -> Result<i64, i16> {
    broker
        .producer_ids
        .next(broker.coordinator.as_ref())
        .await
        .map_err(|e| {
            warn!(error = %e, "cannot allocate a producer id");
            codes::COORDINATOR_NOT_AVAILABLE
        })
}

/// Applies [`add_step`] under the transactional id's lock and stores the result.
async fn add_to_txn(
    broker: &Broker,
    tid: &str,
    producer_id: i64,
    epoch: i16,
    partitions: &TxnPartitions,
    groups: &[String],
) -> Result<(), i16> {
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    let now = broker.clock.now_ms();
    let Some(next) = add_step(
        &meta,
        producer_id,
        epoch,
        partitions,
        groups,
        now,
        broker.txns.epoch(),
    )?
    else {
        return Ok(());
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store a transaction's partitions");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    *meta = next;
    Ok(())
}

/// AddPartitionsToTxn v0-3. Unknown topics or partitions answer UNKNOWN_TOPIC_OR_PARTITION and
/// the others OPERATION_NOT_ATTEMPTED (Kafka's `handleAddPartitionsToTxnRequest`).
pub(crate) async fn add_partitions_to_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let tid = request.v3_and_below_transactional_id.as_str().to_string();
    let mut layout: Vec<(TopicName, Vec<(i32, bool)>)> = Vec::new();
    let mut partitions = TxnPartitions::new();
    let mut lookup_error = None;
    for topic in request.v3_and_below_topics {
        let found = broker.topics.by_name(topic.name.as_str()).await;
        let mut parts = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let known = match &found {
                Ok(Some(t)) if t.has_partition(p) => {
                    partitions.insert((t.id, p), t.name.clone());
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    lookup_error = Some(e.error_code().code());
                    false
                }
            };
            parts.push((p, known));
        }
        layout.push((topic.name, parts));
    }
    let all_known = layout.iter().all(|(_, ps)| ps.iter().all(|(_, k)| *k));
    let result = match lookup_error {
        Some(code) => Err(code),
        None if all_known => add_to_txn(
            broker,
            &tid,
            request.v3_and_below_producer_id.0,
            request.v3_and_below_producer_epoch,
            &partitions,
            &[],
        )
        .await
        .map_err(|code| fenced_for(code, ctx.version, 2)),
        None => Ok(()),
    };
    let mut response = AddPartitionsToTxnResponse::default();
    for (name, parts) in layout {
        let mut t = AddPartitionsToTxnTopicResult::default();
        t.name = name;
        t.results_by_partition = parts
            .into_iter()
            .map(|(index, known)| {
                let mut r = AddPartitionsToTxnPartitionResult::default();
                r.partition_index = index;
                r.partition_error_code = match (&result, all_known, known) {
                    (Err(code), _, _) => *code,
                    (Ok(()), true, _) => codes::NONE,
                    (Ok(()), false, false) => codes::UNKNOWN_TOPIC_OR_PARTITION,
                    (Ok(()), false, true) => OPERATION_NOT_ATTEMPTED,
                };
                r
            })
            .collect();
        response.results_by_topic_v3_and_below.push(t);
    }
    response
}

/// AddOffsetsToTxn: the group joins the transaction (Kafka adds its `__consumer_offsets`
/// partition).
pub(crate) async fn add_offsets_to_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let mut response = AddOffsetsToTxnResponse::default();
    let group = request.group_id.as_str().to_string();
    if group.is_empty() {
        response.error_code = codes::INVALID_GROUP_ID;
        return response;
    }
    response.error_code = match add_to_txn(
        broker,
        request.transactional_id.as_str(),
        request.producer_id.0,
        request.producer_epoch,
        &TxnPartitions::new(),
        &[group],
    )
    .await
    {
        Ok(()) => codes::NONE,
        Err(code) => fenced_for(code, ctx.version, 2),
    };
    response
}

/// EndTxn: v0-4 transaction version 1, v5 transaction version 2 (the epoch is bumped per
/// transaction and answered, see [`end_step_v2`]).
pub(crate) async fn end_txn(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: EndTxnRequest,
) -> EndTxnResponse {
    let mut response = EndTxnResponse::default();
    response.producer_id = ProducerId(NO_PRODUCER_ID);
    response.producer_epoch = NO_EPOCH;
    let outcome = if ctx.version >= 5 {
        end_v2(broker, &request).await
    } else {
        end(broker, &request).await.map(|()| None)
    };
    match outcome {
        Ok(answer) => {
            response.error_code = codes::NONE;
            if let Some((pid, epoch)) = answer {
                response.producer_id = ProducerId(pid);
                response.producer_epoch = epoch;
            }
        }
        Err(code) => response.error_code = fenced_for(code, ctx.version, 2),
    }
    response
}

/// EndTxn v5: the producer id and epoch of the client's next transaction.
async fn end_v2(broker: &Arc<Broker>, request: &EndTxnRequest) -> Result<Option<(i64, i16)>, i16> {
    let tid = request.transactional_id.as_str();
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    // Allocated only when the end may bump (Kafka's `generateTxnTransitMetadataForTxnCompletion`):
    // not for the CONCURRENT_TRANSACTIONS of a transaction being ended.
    let fresh = if meta.is_initialized()
        && !meta.state.is_prepare()
        && epoch_exhausted(meta.producer_epoch)
    {
        Some(new_producer_id(broker).await?)
    } else {
        None
    };
    let next = match end_step_v2(
        &meta,
        request.producer_id.0,
        request.producer_epoch,
        request.committed,
        broker.clock.now_ms(),
        broker.txns.epoch(),
        fresh,
    )? {
        EndV2::Repeat => return Ok(Some((meta.producer_id, meta.producer_epoch))),
        EndV2::Prepare(next) => next,
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store the end of a transaction");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    debug!(transactional_id = %tid, state = next.state.name(), epoch = next.producer_epoch, partitions = next.partitions.len(), "transaction ending (transaction version 2)");
    let answer = if next.next_producer_id != NO_PRODUCER_ID {
        (next.next_producer_id, 0)
    } else {
        (next.producer_id, next.producer_epoch)
    };
    *meta = next;
    drop(meta);
    complete_and_wait(broker, entry).await;
    Ok(Some(answer))
}

async fn end(broker: &Arc<Broker>, request: &EndTxnRequest) -> Result<(), i16> {
    let tid = request.transactional_id.as_str();
    if tid.is_empty() {
        return Err(codes::INVALID_REQUEST);
    }
    let Some(entry) = broker.txns.get(tid) else {
        return Err(INVALID_PRODUCER_ID_MAPPING);
    };
    let mut meta = entry.lock().await;
    let Some(next) = end_step(
        &meta,
        request.producer_id.0,
        request.producer_epoch,
        request.committed,
        broker.clock.now_ms(),
        broker.txns.epoch(),
    )?
    else {
        return Ok(());
    };
    if let Err(e) = broker.store.save_txn(&next).await {
        warn!(transactional_id = %tid, error = %e, "cannot store the end of a transaction");
        return Err(codes::COORDINATOR_NOT_AVAILABLE);
    }
    debug!(transactional_id = %tid, state = next.state.name(), partitions = next.partitions.len(), "transaction ending");
    *meta = next;
    drop(meta);
    complete_and_wait(broker, entry).await;
    Ok(())
}

/// TxnOffsetCommit v0-3: the offsets are pending for the producer until its transaction ends.
pub(crate) async fn txn_offset_commit(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.as_str().to_string();
    let tid = request.transactional_id.as_str();
    // Transaction version 2 (v5): the group joins the transaction here (no AddOffsetsToTxn).
    let implicit = if ctx.version >= 5 && !group.is_empty() {
        add_to_txn(
            broker,
            tid,
            request.producer_id.0,
            request.producer_epoch,
            &TxnPartitions::new(),
            std::slice::from_ref(&group),
        )
        .await
    } else {
        Ok(())
    };
    let entry = broker.txns.get(tid);
    // The transactional id's lock is held until the offsets are stored, so an EndTxn cannot
    // complete the transaction in between.
    let meta = match &entry {
        Some(e) => Some(e.lock().await),
        None => None,
    };
    let mut error = match (&meta, implicit) {
        // As the offsets check maps it (a fenced producer gets INVALID_PRODUCER_EPOCH here).
        (_, Err(PRODUCER_FENCED)) => INVALID_PRODUCER_EPOCH,
        (_, Err(code)) => code,
        (None, Ok(())) => INVALID_PRODUCER_ID_MAPPING,
        (Some(meta), Ok(())) => match offsets_step(
            meta,
            request.producer_id.0,
            request.producer_epoch,
            &group,
            ctx.version,
        ) {
            Ok(()) => codes::NONE,
            Err(code) => code,
        },
    };
    if error == codes::NONE {
        error = match broker.groups.load(&broker.store).await {
            Err(code) => code,
            Ok(()) => {
                let (generation, member, instance) = if ctx.version >= 3 {
                    (
                        request.generation_id,
                        request.member_id.as_str().to_string(),
                        request
                            .group_instance_id
                            .as_ref()
                            .map(|s| s.as_str().to_string()),
                    )
                } else {
                    (-1, String::new(), None)
                };
                broker
                    .groups
                    .validate_txn_commit(&group, generation, &member, instance.as_deref())
            }
        };
    }
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| OffsetToCommit {
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: if ctx.version >= 2 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p.committed_metadata,
                })
                .collect();
            (t.name, partitions)
        })
        .collect();
    let (layout, to_store) = check_offsets(broker, error, topics).await;
    let stored = if to_store.is_empty() {
        Ok(())
    } else {
        broker
            .store
            .add_pending_offsets(
                &group,
                request.producer_id.0,
                &to_store,
                broker.clock.now_ms(),
            )
            .await
    };
    drop(meta);
    if let Err(e) = &stored {
        warn!(group = %group, error = %e, "cannot store transactional offsets");
    }
    let mut response = TxnOffsetCommitResponse::default();
    for (name, parts) in layout {
        let mut topic = TxnOffsetCommitResponseTopic::default();
        topic.name = name;
        topic.partitions = parts
            .into_iter()
            .map(|(index, code)| {
                let mut p = TxnOffsetCommitResponsePartition::default();
                p.partition_index = index;
                p.error_code = stored_code(code, stored.is_ok());
                p
            })
            .collect();
        response.topics.push(topic);
    }
    response
}

/// DescribeTransactions v0.
pub(crate) async fn describe_transactions(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    for tid in request.transactional_ids {
        let mut s = describe_transactions_response::TransactionState::default();
        let meta = match broker.txns.get(tid.as_str()) {
            Some(entry) => Some(entry.lock().await.clone()),
            None => None,
        };
        match meta.filter(TxnMeta::is_initialized) {
            None => {
                s.error_code = TRANSACTIONAL_ID_NOT_FOUND;
                s.transaction_state = StrBytes::from_static_str("");
                s.producer_id = ProducerId(NO_PRODUCER_ID);
                s.producer_epoch = NO_EPOCH;
                s.transaction_start_time_ms = -1;
            }
            Some(m) => {
                s.transaction_state = StrBytes::from_static_str(m.state.name());
                s.transaction_timeout_ms = m.timeout_ms;
                s.transaction_start_time_ms = if m.state == TxnState::Empty {
                    -1
                } else {
                    m.start_ms
                };
                s.producer_id = ProducerId(m.producer_id);
                s.producer_epoch = m.producer_epoch;
                let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                for ((_, partition), topic) in &m.partitions {
                    by_topic.entry(topic).or_default().push(*partition);
                }
                s.topics = by_topic
                    .into_iter()
                    .map(|(topic, partitions)| {
                        let mut t = describe_transactions_response::TopicData::default();
                        t.topic = TopicName(StrBytes::from_string(topic.to_string()));
                        t.partitions = partitions;
                        t
                    })
                    .collect();
            }
        }
        s.transactional_id = tid;
        response.transaction_states.push(s);
    }
    response
}

/// ListTransactions v0-1 (state, producer id and, v1, duration filters).
pub(crate) async fn list_transactions(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    let mut states = Vec::new();
    for name in &request.state_filters {
        match TxnState::parse(name.as_str()) {
            Some(s) => states.push(s),
            None => response.unknown_state_filters.push(name.clone()),
        }
    }
    if !response.unknown_state_filters.is_empty() && states.is_empty() {
        return response;
    }
    let pids: Vec<i64> = request.producer_id_filters.iter().map(|p| p.0).collect();
    let duration = if ctx.version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let now = broker.clock.now_ms();
    let mut listed = Vec::new();
    for entry in broker.txns.entries() {
        let m = entry.lock().await.clone();
        if !m.is_initialized()
            || (!states.is_empty() && !states.contains(&m.state))
            || (!pids.is_empty() && !pids.contains(&m.producer_id))
            || (duration >= 0 && (m.state != TxnState::Ongoing || now - m.start_ms < duration))
        {
            continue;
        }
        let mut s = list_transactions_response::TransactionState::default();
        s.transactional_id = kafka_protocol::messages::TransactionalId(StrBytes::from_string(
            m.transactional_id.clone(),
        ));
        s.producer_id = ProducerId(m.producer_id);
        s.transaction_state = StrBytes::from_static_str(m.state.name());
        listed.push(s);
    }
    listed.sort_by(|a, b| a.transactional_id.as_str().cmp(b.transactional_id.as_str()));
    response.transaction_states = listed;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000;
    const CE: i32 = 3;
    /// The broker's finalized `transaction.version`: 1 (`--transaction-version 1`) or 2.
    const TV1: i16 = 1;
    const TV2: i16 = 2;

    fn meta(state: TxnState, pid: i64, epoch: i16) -> TxnMeta {
        let mut m = TxnMeta::fresh("t", pid, 60_000, 0, 1);
        m.state = state;
        m.producer_epoch = epoch;
        m.txn_seq = 7;
        m
    }

    fn tp(p: i32) -> TxnPartitions {
        [((Uuid::from_u128(1), p), "topic".to_string())]
            .into_iter()
            .collect()
    }

    fn ready(r: Result<InitStep, i16>) -> TxnMeta {
        match r {
            Ok(InitStep::Ready(m)) => m,
            other => panic!("expected Ready, got {other:?}"),
        }
    }

    #[test]
    fn state_names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(TxnState::parse(s.name()), Some(s));
        }
        assert_eq!(TxnState::parse("ongoing"), None);
    }

    #[test]
    fn init_of_a_new_id_gives_epoch_zero_and_each_init_bumps() {
        let fresh = TxnMeta::fresh("t", 10, 60_000, 0, 1);
        let m = ready(init_step(&fresh, None, 30_000, NOW, None, CE, TV2));
        assert_eq!((m.producer_id, m.producer_epoch), (10, 0));
        assert_eq!(
            (m.state, m.timeout_ms, m.coordinator_epoch),
            (TxnState::Empty, 30_000, CE)
        );
        for state in [
            TxnState::Empty,
            TxnState::CompleteCommit,
            TxnState::CompleteAbort,
        ] {
            let mut before = meta(state, 10, 4);
            before.partitions = tp(0);
            before.groups.insert("g".into());
            let m = ready(init_step(&before, None, 30_000, NOW, None, CE, TV2));
            assert_eq!(
                (m.producer_id, m.producer_epoch, m.last_producer_epoch),
                (10, 5, -1)
            );
            assert_eq!(m.state, TxnState::Empty);
            assert!(m.partitions.is_empty() && m.groups.is_empty());
            assert_eq!(m.txn_seq, 7, "InitProducerId starts no transaction");
        }
    }

    #[test]
    fn init_with_an_expected_epoch_follows_kip_360() {
        let m = meta(TxnState::CompleteAbort, 10, 4);
        // The current epoch: bumped, the old one remembered for a retry.
        let bumped = ready(init_step(&m, Some((10, 4)), 1, NOW, None, CE, TV2));
        assert_eq!((bumped.producer_epoch, bumped.last_producer_epoch), (5, 4));
        // The retry of that bump (its answer lost): the same epoch again, no second bump.
        let again = ready(init_step(&bumped, Some((10, 4)), 1, NOW, None, CE, TV2));
        assert_eq!(again.producer_epoch, 5);
        // Another epoch: fenced; another producer id: fenced.
        assert_eq!(
            init_step(&bumped, Some((10, 3)), 1, NOW, None, CE, TV2),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            init_step(&bumped, Some((11, 5)), 1, NOW, None, CE, TV2),
            Err(PRODUCER_FENCED)
        );
        // A just-created id accepts any expectation (a producer moving to a transactional id).
        let fresh = TxnMeta::fresh("t", 10, 1, 0, 1);
        assert_eq!(
            ready(init_step(&fresh, Some((99, 3)), 1, NOW, None, CE, TV2)).producer_epoch,
            0
        );
    }

    #[test]
    fn init_rotates_the_producer_id_when_the_epoch_is_exhausted() {
        let m = meta(TxnState::CompleteCommit, 10, i16::MAX - 1);
        assert!(needs_new_producer_id(&m));
        assert!(!needs_new_producer_id(&meta(
            TxnState::CompleteCommit,
            10,
            5
        )));
        let r = ready(init_step(
            &m,
            Some((10, i16::MAX - 1)),
            1,
            NOW,
            Some(20),
            CE,
            TV2,
        ));
        assert_eq!(
            (r.producer_id, r.prev_producer_id, r.producer_epoch),
            (20, 10, 0)
        );
        assert_eq!(r.last_producer_epoch, i16::MAX - 1);
        // A retry naming the previous id with the exhausted epoch is valid and not bumped again.
        let retry = ready(init_step(
            &r,
            Some((10, i16::MAX - 1)),
            1,
            NOW,
            None,
            CE,
            TV2,
        ));
        assert_eq!((retry.producer_id, retry.producer_epoch), (20, 0));
        // Without a fresh id nothing is answered.
        assert_eq!(
            init_step(&m, None, 1, NOW, None, CE, TV2),
            Err(codes::COORDINATOR_NOT_AVAILABLE)
        );
    }

    #[test]
    fn init_fences_an_ongoing_transaction_and_waits_out_a_prepared_one() {
        let mut m = meta(TxnState::Ongoing, 10, 4);
        m.partitions = tp(1);
        match init_step(&m, None, 1, NOW, None, CE, TV2) {
            Ok(InitStep::Fence(f)) => {
                assert_eq!(
                    (f.state, f.producer_epoch, f.txn_seq),
                    (TxnState::PrepareAbort, 5, 7)
                );
                assert_eq!(
                    f.partitions, m.partitions,
                    "the abort's markers go to every partition"
                );
                assert_eq!(f.coordinator_epoch, CE);
            }
            other => panic!("{other:?}"),
        }
        for s in [
            TxnState::PrepareCommit,
            TxnState::PrepareAbort,
            TxnState::PrepareEpochFence,
        ] {
            assert_eq!(
                init_step(&meta(s, 10, 4), None, 1, NOW, None, CE, TV2),
                Err(CONCURRENT_TRANSACTIONS)
            );
        }
    }

    #[test]
    fn add_partitions_table() {
        let empty = meta(TxnState::Empty, 10, 2);
        let next = add_step(&empty, 10, 2, &tp(0), &[], NOW, CE)
            .unwrap()
            .unwrap();
        assert_eq!(
            (next.state, next.txn_seq, next.start_ms),
            (TxnState::Ongoing, 8, NOW)
        );
        // Everything in already: nothing to store.
        assert_eq!(add_step(&next, 10, 2, &tp(0), &[], NOW + 1, CE), Ok(None));
        // More partitions and a group: same transaction, same number, same start.
        let more = add_step(&next, 10, 2, &tp(1), &["g".to_string()], NOW + 5, CE)
            .unwrap()
            .unwrap();
        assert_eq!(
            (more.txn_seq, more.start_ms, more.partitions.len()),
            (8, NOW, 2)
        );
        assert!(more.groups.contains("g"));
        // A completed transaction's next one gets the next number.
        let done = complete_step(
            &end_step(&more, 10, 2, true, NOW, CE).unwrap().unwrap(),
            NOW,
        );
        assert_eq!(done.state, TxnState::CompleteCommit);
        assert!(done.partitions.is_empty() && done.groups.is_empty());
        let second = add_step(&done, 10, 2, &tp(2), &[], NOW + 9, CE)
            .unwrap()
            .unwrap();
        assert_eq!(
            (second.txn_seq, second.start_ms, second.partitions.len()),
            (9, NOW + 9, 1)
        );
        // Errors.
        assert_eq!(
            add_step(&empty, 11, 2, &tp(0), &[], NOW, CE),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        assert_eq!(
            add_step(&empty, 10, 1, &tp(0), &[], NOW, CE),
            Err(PRODUCER_FENCED)
        );
        let placeholder = TxnMeta::placeholder("t");
        assert_eq!(
            add_step(&placeholder, -1, -1, &tp(0), &[], NOW, CE),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        for s in [TxnState::PrepareCommit, TxnState::PrepareAbort] {
            assert_eq!(
                add_step(&meta(s, 10, 2), 10, 2, &tp(0), &[], NOW, CE),
                Err(CONCURRENT_TRANSACTIONS)
            );
        }
    }

    #[test]
    fn end_txn_table_tv1() {
        use TxnState::*;
        let cases = [
            (Ongoing, true, Ok(Some(PrepareCommit))),
            (Ongoing, false, Ok(Some(PrepareAbort))),
            (CompleteCommit, true, Ok(None)),
            (CompleteAbort, false, Ok(None)),
            (CompleteCommit, false, Err(INVALID_TXN_STATE)),
            (CompleteAbort, true, Err(INVALID_TXN_STATE)),
            (PrepareCommit, true, Err(CONCURRENT_TRANSACTIONS)),
            (PrepareAbort, false, Err(CONCURRENT_TRANSACTIONS)),
            (PrepareCommit, false, Err(INVALID_TXN_STATE)),
            (PrepareAbort, true, Err(INVALID_TXN_STATE)),
            (Empty, true, Err(INVALID_TXN_STATE)),
            (Empty, false, Err(INVALID_TXN_STATE)),
        ];
        for (state, commit, want) in cases {
            let got =
                end_step(&meta(state, 10, 2), 10, 2, commit, NOW, CE).map(|m| m.map(|m| m.state));
            assert_eq!(got, want, "{state:?} commit={commit}");
        }
        let ongoing = meta(Ongoing, 10, 2);
        assert_eq!(
            end_step(&ongoing, 10, 1, true, NOW, CE),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            end_step(&ongoing, 10, 3, true, NOW, CE),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            end_step(&ongoing, 9, 2, true, NOW, CE),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        // Below v2, PRODUCER_FENCED is INVALID_PRODUCER_EPOCH.
        assert_eq!(fenced_for(PRODUCER_FENCED, 1, 2), INVALID_PRODUCER_EPOCH);
        assert_eq!(fenced_for(PRODUCER_FENCED, 2, 2), PRODUCER_FENCED);
        assert_eq!(fenced_for(INVALID_TXN_STATE, 0, 2), INVALID_TXN_STATE);
    }

    /// EndTxn v5 (transaction version 2): every end bumps the epoch; a retry carries the previous
    /// epoch and is answered without a second end; an abort with nothing open still bumps.
    #[test]
    fn end_txn_table_tv2() {
        use TxnState::*;
        let prepared = |r: Result<EndV2, i16>| match r {
            Ok(EndV2::Prepare(m)) => Ok(Some((m.state, m.producer_epoch, m.last_producer_epoch))),
            Ok(EndV2::Repeat) => Ok(None),
            Err(code) => Err(code),
        };
        // A first end: Prepare* with epoch + 1, the old one kept to recognise a retry.
        let ongoing = meta(Ongoing, 10, 2);
        assert_eq!(
            prepared(end_step_v2(&ongoing, 10, 2, true, NOW, CE, None)),
            Ok(Some((PrepareCommit, 3, 2)))
        );
        assert_eq!(
            prepared(end_step_v2(&ongoing, 10, 2, false, NOW, CE, None)),
            Ok(Some((PrepareAbort, 3, 2)))
        );
        // After it completed (epoch 3, last 2): the retry with epoch 2 is answered as done.
        let mut done = meta(CompleteCommit, 10, 3);
        done.last_producer_epoch = 2;
        assert_eq!(
            prepared(end_step_v2(&done, 10, 2, true, NOW, CE, None)),
            Ok(None)
        );
        // The retry of the other outcome is wrong.
        assert_eq!(
            prepared(end_step_v2(&done, 10, 2, false, NOW, CE, None)),
            Err(INVALID_TXN_STATE)
        );
        // A new abort at the current epoch with nothing open: an empty transaction aborted, bumped.
        assert_eq!(
            prepared(end_step_v2(&done, 10, 3, false, NOW, CE, None)),
            Ok(Some((PrepareAbort, 4, 3)))
        );
        assert_eq!(
            prepared(end_step_v2(
                &meta(Empty, 10, 0),
                10,
                0,
                false,
                NOW,
                CE,
                None
            )),
            Ok(Some((PrepareAbort, 1, 0)))
        );
        // A commit with nothing open.
        assert_eq!(
            prepared(end_step_v2(&done, 10, 3, true, NOW, CE, None)),
            Err(INVALID_TXN_STATE)
        );
        // A retry while the markers are being written.
        let mut preparing = meta(PrepareCommit, 10, 3);
        preparing.last_producer_epoch = 2;
        assert_eq!(
            prepared(end_step_v2(&preparing, 10, 2, true, NOW, CE, None)),
            Err(CONCURRENT_TRANSACTIONS)
        );
        // Stale or future epochs, another producer id.
        assert_eq!(
            prepared(end_step_v2(&done, 10, 1, true, NOW, CE, None)),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            prepared(end_step_v2(&done, 10, 5, true, NOW, CE, None)),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            prepared(end_step_v2(&done, 11, 3, true, NOW, CE, None)),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        // The epoch runs out: the markers take the last epoch, the transaction hands over to a
        // new producer id (answered with epoch 0), and the retry of that end is recognised.
        let last = meta(Ongoing, 10, i16::MAX - 1);
        assert_eq!(
            prepared(end_step_v2(&last, 10, i16::MAX - 1, true, NOW, CE, None)),
            Err(codes::COORDINATOR_NOT_AVAILABLE),
            "no producer id to hand over to"
        );
        let Ok(EndV2::Prepare(ending)) =
            end_step_v2(&last, 10, i16::MAX - 1, true, NOW, CE, Some(99))
        else {
            panic!("the end must be prepared");
        };
        assert_eq!(
            (
                ending.state,
                ending.producer_id,
                ending.producer_epoch,
                ending.next_producer_id
            ),
            (PrepareCommit, 10, i16::MAX, 99)
        );
        let rotated = complete_step(&ending, NOW);
        assert_eq!(
            (
                rotated.state,
                rotated.producer_id,
                rotated.producer_epoch,
                rotated.prev_producer_id
            ),
            (CompleteCommit, 99, 0, 10)
        );
        assert_eq!(rotated.next_producer_id, NO_PRODUCER_ID);
        assert_eq!(
            prepared(end_step_v2(&rotated, 10, i16::MAX - 1, true, NOW, CE, None)),
            Ok(None),
            "the retry with the old producer id"
        );
        assert_eq!(
            prepared(end_step_v2(&rotated, 10, 0, true, NOW, CE, None)),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        assert_eq!(
            prepared(end_step_v2(&rotated, 99, 0, false, NOW, CE, None)),
            Ok(Some((PrepareAbort, 1, 0)))
        );
    }

    #[test]
    fn a_timed_out_transaction_is_fenced_then_aborted() {
        for tv in [TV1, TV2] {
            let mut m = meta(TxnState::Ongoing, 10, 2);
            m.partitions = tp(0);
            let fenced = fence_step(&m, NOW, CE, tv, None).unwrap();
            assert_eq!(
                (fenced.state, fenced.producer_epoch),
                (TxnState::PrepareAbort, 3)
            );
            // The old producer's calls are fenced from now on.
            assert_eq!(
                end_step(&fenced, 10, 2, true, NOW, CE),
                Err(PRODUCER_FENCED)
            );
            assert_eq!(
                verify_step(&fenced, 10, 2, (Uuid::from_u128(1), 0), 9),
                Err(INVALID_PRODUCER_EPOCH)
            );
            let done = complete_step(&fenced, NOW);
            assert_eq!(done.state, TxnState::CompleteAbort);
            assert_eq!(
                add_step(&done, 10, 2, &tp(0), &[], NOW, CE),
                Err(PRODUCER_FENCED)
            );
            // The epoch never overflows.
            let max = meta(TxnState::Ongoing, 10, i16::MAX);
            assert_eq!(
                fence_step(&max, NOW, CE, tv, Some(99))
                    .unwrap()
                    .producer_epoch,
                i16::MAX,
                "transaction version {tv}"
            );
        }
    }

    #[test]
    fn the_sweeper_takes_ongoing_transactions_past_their_timeout() {
        let mut m = meta(TxnState::Ongoing, 10, 2);
        m.start_ms = 0;
        assert!(!timed_out(&m, 60_000));
        assert!(timed_out(&m, 60_001));
        m.state = TxnState::CompleteAbort;
        assert!(!timed_out(&m, 60_001));
    }

    /// Transaction version 2 (the broker's level): the coordinator's abort of a transaction at
    /// the last epoch (`isEpochExhausted`) is a TV2 end (`endTransaction` with `isEpochFence`):
    /// the markers take `i16::MAX` and the transaction hands over to a new producer id (Kafka's
    /// `nextProducerId`, KAFKA-20090), so the fenced producer can never open a transaction
    /// again, while its own late EndTxn(ABORT) is the retry that gets the new id.
    #[test]
    fn a_tv2_fence_at_the_last_epoch_hands_over_to_a_new_producer_id() {
        const LAST: i16 = i16::MAX - 1;
        let mut m = meta(TxnState::Ongoing, 10, LAST);
        m.partitions = tp(0);
        assert!(fence_needs_new_producer_id(&m, TV2));
        assert!(!fence_needs_new_producer_id(&m, TV1));
        assert!(!fence_needs_new_producer_id(
            &meta(TxnState::Ongoing, 10, LAST - 1),
            TV2
        ));
        assert_eq!(
            fence_step(&m, NOW, CE, TV2, None),
            Err(codes::COORDINATOR_NOT_AVAILABLE),
            "no producer id to hand over to: left for the next pass"
        );
        let fenced = fence_step(&m, NOW, CE, TV2, Some(99)).unwrap();
        assert_eq!(
            (
                fenced.state,
                fenced.producer_id,
                fenced.producer_epoch,
                fenced.last_producer_epoch,
                fenced.next_producer_id
            ),
            (TxnState::PrepareAbort, 10, i16::MAX, LAST, 99)
        );
        assert_eq!(
            fenced.partitions, m.partitions,
            "markers on every partition"
        );
        // InitProducerId of another producer fences the same way (and answers
        // CONCURRENT_TRANSACTIONS until the abort is done).
        match init_step(&m, None, 1, NOW, Some(99), CE, TV2) {
            Ok(InitStep::Fence(f)) => assert_eq!(f, fenced),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            init_step(&m, None, 1, NOW, None, CE, TV2),
            Err(codes::COORDINATOR_NOT_AVAILABLE)
        );

        // While the markers are written, the producer's EndTxn waits.
        for commit in [false, true] {
            assert_eq!(
                end_step_v2(&fenced, 10, LAST, commit, NOW, CE, None),
                Err(CONCURRENT_TRANSACTIONS)
            );
        }
        let done = complete_step(&fenced, NOW);
        assert_eq!(
            (
                done.state,
                done.producer_id,
                done.producer_epoch,
                done.prev_producer_id,
                done.last_producer_epoch,
                done.next_producer_id
            ),
            (TxnState::CompleteAbort, 99, 0, 10, LAST, NO_PRODUCER_ID)
        );
        // The fenced producer id opens nothing, whatever its epoch.
        for epoch in [LAST, i16::MAX] {
            assert_eq!(
                add_step(&done, 10, epoch, &tp(0), &[], NOW, CE),
                Err(INVALID_PRODUCER_ID_MAPPING)
            );
            assert_eq!(
                verify_step(&done, 10, epoch, (Uuid::from_u128(1), 0), 11),
                Err(INVALID_PRODUCER_ID_MAPPING)
            );
        }
        // Its late EndTxn v5: ABORT is `retryOnOverflow` (answered with the new id at epoch 0),
        // COMMIT is fenced (KAFKA-20785).
        assert_eq!(
            end_step_v2(&done, 10, LAST, false, NOW, CE, None),
            Ok(EndV2::Repeat)
        );
        assert_eq!(
            end_step_v2(&done, 10, LAST, true, NOW, CE, None),
            Err(PRODUCER_FENCED)
        );
        // A classic client's InitProducerId naming its last epoch is the retry it is
        // (`prepareIncrementProducerEpoch` with `lastProducerEpoch` kept by `prepareComplete`).
        let retried = ready(init_step(&done, Some((10, LAST)), 1, NOW, None, CE, TV2));
        assert_eq!((retried.producer_id, retried.producer_epoch), (99, 0));
        let other = ready(init_step(&done, None, 1, NOW, None, CE, TV2));
        assert_eq!((other.producer_id, other.producer_epoch), (99, 1));

        // An epoch already at i16::MAX (only a bug gets there) is kept, and still handed over.
        let mut max = meta(TxnState::Ongoing, 10, i16::MAX);
        max.partitions = tp(0);
        let fenced = fence_step(&max, NOW, CE, TV2, Some(99)).unwrap();
        assert_eq!(
            (fenced.producer_epoch, fenced.next_producer_id),
            (i16::MAX, 99)
        );
        let done = complete_step(&fenced, NOW);
        assert_eq!((done.producer_id, done.producer_epoch), (99, 0));
        assert_eq!(
            add_step(&done, 10, i16::MAX, &tp(0), &[], NOW, CE),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
    }

    /// Transaction version 1 (`--transaction-version 1`, `endTransactionWithTV1`): the fence at
    /// the last epoch takes `i16::MAX` and keeps the producer id; the next InitProducerId
    /// rotates it (`prepareProducerIdRotation`). At `i16::MAX` the epoch is kept.
    #[test]
    fn a_tv1_fence_at_the_last_epoch_keeps_the_producer_id_until_the_next_init() {
        const LAST: i16 = i16::MAX - 1;
        let mut m = meta(TxnState::Ongoing, 10, LAST);
        m.partitions = tp(0);
        let fenced = fence_step(&m, NOW, CE, TV1, None).unwrap();
        assert_eq!(
            (
                fenced.producer_id,
                fenced.producer_epoch,
                fenced.last_producer_epoch,
                fenced.next_producer_id
            ),
            (10, i16::MAX, NO_EPOCH, NO_PRODUCER_ID)
        );
        let done = complete_step(&fenced, NOW);
        assert_eq!(
            (done.state, done.producer_id, done.producer_epoch),
            (TxnState::CompleteAbort, 10, i16::MAX)
        );
        assert_eq!(
            end_step(&done, 10, LAST, false, NOW, CE),
            Err(PRODUCER_FENCED)
        );
        assert_eq!(
            add_step(&done, 10, LAST, &tp(0), &[], NOW, CE),
            Err(PRODUCER_FENCED)
        );
        assert!(needs_new_producer_id(&done));
        let next = ready(init_step(&done, None, 1, NOW, Some(20), CE, TV1));
        assert_eq!((next.producer_id, next.producer_epoch), (20, 0));
    }

    /// Transaction version 2: after the coordinator aborted a producer's transaction (timeout, or
    /// another producer's InitProducerId), the producer's EndTxn v5 with its old epoch follows
    /// Kafka's `endTransaction`: CONCURRENT_TRANSACTIONS while the markers are written (the
    /// pending check comes first), then ABORT is a retry (`retryOnEpochBump`, answered with the
    /// bumped epoch, the producer goes on) and COMMIT is PRODUCER_FENCED (KAFKA-20785).
    #[test]
    fn a_tv2_producers_late_end_txn_after_the_coordinators_abort() {
        let mut m = meta(TxnState::Ongoing, 10, 4);
        m.partitions = tp(0);
        let fenced = fence_step(&m, NOW, CE, TV2, None).unwrap();
        assert_eq!(
            (
                fenced.state,
                fenced.producer_epoch,
                fenced.last_producer_epoch
            ),
            (TxnState::PrepareAbort, 5, 4)
        );
        for (pid, epoch, commit) in [(10, 4, false), (10, 4, true), (10, 5, false), (11, 4, true)] {
            assert_eq!(
                end_step_v2(&fenced, pid, epoch, commit, NOW, CE, None),
                Err(CONCURRENT_TRANSACTIONS),
                "({pid}, {epoch}) commit={commit} while the markers are written"
            );
        }
        let done = complete_step(&fenced, NOW);
        assert_eq!(
            (done.state, done.producer_epoch, done.last_producer_epoch),
            (TxnState::CompleteAbort, 5, 4)
        );
        let prepared = |r: Result<EndV2, i16>| match r {
            Ok(EndV2::Prepare(m)) => Ok(Some((m.state, m.producer_epoch, m.partitions.len()))),
            Ok(EndV2::Repeat) => Ok(None),
            Err(code) => Err(code),
        };
        use TxnState::*;
        let cases = [
            // The old epoch: ABORT is the retry of the coordinator's abort, COMMIT is fenced.
            ((10, 4, false), Ok(None)),
            ((10, 4, true), Err(PRODUCER_FENCED)),
            // The bumped epoch (a client that already has it): an empty abort, no commit.
            ((10, 5, false), Ok(Some((PrepareAbort, 6, 0)))),
            ((10, 5, true), Err(INVALID_TXN_STATE)),
            // Older or unknown epochs, another producer id.
            ((10, 3, false), Err(PRODUCER_FENCED)),
            ((10, 6, false), Err(PRODUCER_FENCED)),
            ((11, 4, false), Err(INVALID_PRODUCER_ID_MAPPING)),
        ];
        for ((pid, epoch, commit), want) in cases {
            assert_eq!(
                prepared(end_step_v2(&done, pid, epoch, commit, NOW, CE, None)),
                want,
                "({pid}, {epoch}) commit={commit}"
            );
        }
        // The retry needs no remembered epoch (`retryOnEpochBump` is `producerEpoch + 1`): the
        // same after a fence of transaction version 1 (a broker restarted with version 2).
        let done_tv1 = complete_step(&fence_step(&m, NOW, CE, TV1, None).unwrap(), NOW);
        assert_eq!(done_tv1.last_producer_epoch, NO_EPOCH);
        assert_eq!(
            end_step_v2(&done_tv1, 10, 4, false, NOW, CE, None),
            Ok(EndV2::Repeat)
        );
        assert_eq!(
            end_step_v2(&done_tv1, 10, 4, true, NOW, CE, None),
            Err(PRODUCER_FENCED)
        );
        // The producer's InitProducerId with its old epoch (KIP-360) is the retry of the bump
        // under version 2 (`lastProducerEpoch`), fenced under version 1.
        let resumed = ready(init_step(&done, Some((10, 4)), 1, NOW, None, CE, TV2));
        assert_eq!((resumed.producer_id, resumed.producer_epoch), (10, 5));
        assert_eq!(
            init_step(&done_tv1, Some((10, 4)), 1, NOW, None, CE, TV1),
            Err(PRODUCER_FENCED)
        );
    }

    /// A client already on the producer id a rotation hands over gets CONCURRENT_TRANSACTIONS
    /// while the ending transaction's markers are written, not INVALID_PRODUCER_ID_MAPPING
    /// (Kafka checks the pending transition first, KAFKA-18660).
    #[test]
    fn end_txn_v2_waits_for_a_rotation_in_progress() {
        let last = meta(TxnState::Ongoing, 10, i16::MAX - 1);
        let Ok(EndV2::Prepare(ending)) =
            end_step_v2(&last, 10, i16::MAX - 1, true, NOW, CE, Some(99))
        else {
            panic!("the end must be prepared");
        };
        for commit in [false, true] {
            assert_eq!(
                end_step_v2(&ending, 99, 0, commit, NOW, CE, None),
                Err(CONCURRENT_TRANSACTIONS)
            );
        }
    }

    #[test]
    fn produce_verification_table() {
        let topic = Uuid::from_u128(1);
        let mut m = meta(TxnState::Ongoing, 10, 2);
        m.partitions = tp(0);
        assert_eq!(verify_step(&m, 10, 2, (topic, 0), 9), Ok(7));
        // Not added: INVALID_TXN_STATE up to v10, TRANSACTION_ABORTABLE from v11.
        assert_eq!(
            verify_step(&m, 10, 2, (topic, 1), 10),
            Err(INVALID_TXN_STATE)
        );
        assert_eq!(
            verify_step(&m, 10, 2, (topic, 1), 11),
            Err(TRANSACTION_ABORTABLE)
        );
        assert_eq!(
            verify_step(&m, 10, 1, (topic, 0), 9),
            Err(INVALID_PRODUCER_EPOCH)
        );
        assert_eq!(
            verify_step(&m, 11, 2, (topic, 0), 9),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        // No transaction ongoing.
        let mut done = m.clone();
        done.state = TxnState::CompleteCommit;
        assert_eq!(
            verify_step(&done, 10, 2, (topic, 0), 9),
            Err(INVALID_TXN_STATE)
        );
        // Being ended: retriable for old clients.
        let mut prepare = m.clone();
        prepare.state = TxnState::PrepareCommit;
        assert_eq!(
            verify_step(&prepare, 10, 2, (topic, 0), 9),
            Err(NOT_ENOUGH_REPLICAS)
        );
    }

    #[test]
    fn txn_offset_commit_needs_the_group_in_the_transaction() {
        let mut m = meta(TxnState::Ongoing, 10, 2);
        assert_eq!(offsets_step(&m, 10, 2, "g", 3), Err(INVALID_TXN_STATE));
        assert_eq!(offsets_step(&m, 10, 2, "g", 4), Err(TRANSACTION_ABORTABLE));
        m.groups.insert("g".into());
        assert_eq!(offsets_step(&m, 10, 2, "g", 3), Ok(()));
        assert_eq!(offsets_step(&m, 10, 3, "g", 3), Err(INVALID_PRODUCER_EPOCH));
        assert_eq!(
            offsets_step(&m, 11, 2, "g", 3),
            Err(INVALID_PRODUCER_ID_MAPPING)
        );
        m.state = TxnState::PrepareCommit;
        assert_eq!(
            offsets_step(&m, 10, 2, "g", 3),
            Err(CONCURRENT_TRANSACTIONS)
        );
    }
}
