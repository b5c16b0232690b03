//! The transaction coordinator's state and Kafka's rules for it (docs/transactions.md §1.4): one
//! [`TxnMeta`] per transactional id (Kafka's `TransactionMetadata`) in the process's
//! [`TxnCoordinator`], moved through the states of [`TxnState`] by the pure `*_step` functions
//! below (Kafka's `TransactionCoordinator` / `TransactionMetadata` transitions, unit-tested as
//! tables). What acts on them — storing each new state in `broker.db` before it is acted on,
//! writing markers, the timeout sweeper, the transaction APIs — is [`crate::txn`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use diskless_coordinator::TopicIdPartition;
use tokio::sync::Mutex as AsyncMutex;
use uuid::Uuid;

use crate::codes;

/// Kafka's `transaction.max.timeout.ms` default: a longer `transaction.timeout.ms` is refused.
pub(crate) const MAX_TRANSACTION_TIMEOUT_MS: i32 = 900_000;

pub(crate) const NO_EPOCH: i16 = -1;
pub(crate) const NO_PRODUCER_ID: i64 = -1;

pub(crate) const NOT_ENOUGH_REPLICAS: i16 = 19;
pub(crate) const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
pub(crate) const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
pub(crate) const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
pub(crate) const CONCURRENT_TRANSACTIONS: i16 = 51;
pub(crate) const OPERATION_NOT_ATTEMPTED: i16 = 55;
pub(crate) const PRODUCER_FENCED: i16 = 90;
pub(crate) const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
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

    pub(crate) fn is_prepare(self) -> bool {
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
    pub(crate) fn fresh(
        tid: &str,
        producer_id: i64,
        timeout_ms: i32,
        now: i64,
        epoch: i32,
    ) -> TxnMeta {
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
    pub(crate) fn placeholder(tid: &str) -> TxnMeta {
        TxnMeta::fresh(tid, NO_PRODUCER_ID, 0, 0, 0)
    }

    pub(crate) fn is_initialized(&self) -> bool {
        self.producer_id >= 0
    }
}

/// Kafka's `TransactionMetadata.isEpochExhausted`.
pub(crate) fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// What InitProducerId does to a transactional id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InitStep {
    /// Store this and answer its producer id and epoch.
    Ready(TxnMeta),
    /// Store this (`PrepareAbort` with the bumped epoch), abort, answer CONCURRENT_TRANSACTIONS.
    Fence(TxnMeta),
}

/// Kafka's `prepareInitProducerIdTransit` on an initialized transactional id. `fresh_pid` is a
/// new producer id, needed when the epoch is exhausted (see [`needs_new_producer_id`] and
/// [`fence_needs_new_producer_id`]); `transaction_version` is the broker's finalized level, the
/// one Kafka fences an ongoing transaction with (see [`fence_step`]).
pub(crate) fn init_step(
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
pub(crate) fn needs_new_producer_id(meta: &TxnMeta) -> bool {
    meta.is_initialized()
        && epoch_exhausted(meta.producer_epoch)
        && matches!(
            meta.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        )
}

/// Whether fencing `meta`'s ongoing transaction (see [`fence_step`]) hands it over to a new
/// producer id, so one must be allocated: transaction version 2 with the epoch exhausted.
pub(crate) fn fence_needs_new_producer_id(meta: &TxnMeta, transaction_version: i16) -> bool {
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
pub(crate) fn fence_step(
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
pub(crate) fn timed_out(meta: &TxnMeta, now: i64) -> bool {
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
pub(crate) fn add_step(
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
pub(crate) fn end_step(
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
pub(crate) enum EndV2 {
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
pub(crate) fn end_step_v2(
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
pub(crate) fn complete_step(meta: &TxnMeta, now: i64) -> TxnMeta {
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
pub(crate) fn offsets_step(
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
pub(crate) fn fenced_for(code: i16, version: i16, min_version: i16) -> i16 {
    if code == PRODUCER_FENCED && version < min_version {
        INVALID_PRODUCER_EPOCH
    } else {
        code
    }
}

/// One transactional id's state, locked while a request or the sweeper moves it.
pub(crate) type Entry = Arc<AsyncMutex<TxnMeta>>;

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

    pub(crate) fn get(&self, tid: &str) -> Option<Entry> {
        self.txns.lock().get(tid).cloned()
    }

    pub(crate) fn get_or_create(&self, tid: &str) -> Entry {
        self.txns
            .lock()
            .entry(tid.to_string())
            .or_insert_with(|| Arc::new(AsyncMutex::new(TxnMeta::placeholder(tid))))
            .clone()
    }

    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.txns.lock().values().cloned().collect()
    }

    pub(crate) fn epoch(&self) -> i32 {
        self.coordinator_epoch.load(Ordering::Relaxed)
    }

    /// Sets this process's coordinator epoch (bumped in `broker.db` at start).
    pub(crate) fn set_epoch(&self, epoch: i32) {
        self.coordinator_epoch.store(epoch, Ordering::Relaxed);
    }

    /// Installs the transactions loaded from `broker.db`; those being ended (`Prepare*`), to
    /// complete.
    pub(crate) fn install(&self, loaded: Vec<TxnMeta>) -> Vec<(TxnMeta, Entry)> {
        let mut resume = Vec::new();
        let mut txns = self.txns.lock();
        for meta in loaded {
            let prepare = meta.state.is_prepare();
            let entry = Arc::new(AsyncMutex::new(meta.clone()));
            txns.insert(meta.transactional_id.clone(), entry.clone());
            if prepare {
                resume.push((meta, entry));
            }
        }
        resume
    }

    /// How many transactional ids this process knows.
    pub(crate) fn count(&self) -> usize {
        self.txns.lock().len()
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
