//! Transaction records: the part of Kafka's transaction coordinator state (what a Kafka cluster
//! keeps in `__transaction_state`) that a host keeps in the batch coordinator, so that every
//! broker sharing the coordinator shares it (issue #31).
//!
//! A host whose own transaction coordinator lives in one process needs none of this: it writes
//! the markers of a transaction's diskless partitions with
//! [`crate::BatchCoordinator::write_txn_markers`] once it decided. A host of several brokers
//! whose transaction state is not shared (Nisshi's engines keep it per node, and a client's
//! transaction coordinator moves between nodes when one fails) keeps it here instead:
//!
//! 1. InitProducerId: [`TxnTransition::Init`] fences an ongoing transaction (it becomes
//!    `PrepareAbort`) and records the producer id, epoch and `transaction.timeout.ms`;
//! 2. AddPartitionsToTxn / AddOffsetsToTxn: [`TxnTransition::AddPartitions`] opens the next
//!    transaction (its number, [`TxnRecord::txn_seq`], taken from the record) or adds to the open
//!    one; a broker verifies a transactional batch against the record
//!    ([`TxnRecord::txn_seq_for`], from [`crate::BatchCoordinator::describe_txn`]), as Kafka's
//!    partition leaders ask the transaction coordinator (KIP-890);
//! 3. EndTxn: [`TxnTransition::End`] records the outcome (`PrepareCommit`/`PrepareAbort`) before
//!    any marker is written; then any broker writes [`TxnRecord::markers`] and records
//!    [`TxnTransition::Complete`];
//! 4. [`crate::BatchCoordinator::txn_endings`] aborts the transactions open longer than their
//!    timeout (fencing the producer's epoch, as Kafka's epoch bump does) and lists every decided
//!    transaction whose markers are not all written yet, for any broker to finish.
//!
//! Every transition is decided by [`apply_txn_transition`], one pure function that every
//! implementation calls on the record it read and locked in the same database transaction (the
//! SQL coordinators) or under its state mutex (the reference model): no two transitions of one
//! transactional id interleave, whichever broker asks.

use crate::{CoordinatorError, ErrorCode, TopicIdPartition, TxnMarker};

/// Where a transactional id's transaction stands: Kafka's `TransactionState` without its
/// transitional `PrepareEpochFence` (a fence here is one step to `PrepareAbort`) and `Dead`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TxnStatus {
    /// No transaction open (after InitProducerId).
    Empty,
    /// A transaction is open: partitions were added and no EndTxn decided it yet.
    Ongoing,
    /// The transaction is decided committed; its markers may not all be written yet.
    PrepareCommit,
    /// The transaction is decided aborted (by the client, a fencing InitProducerId or its
    /// timeout); its markers may not all be written yet.
    PrepareAbort,
    /// Committed, every marker written.
    CompleteCommit,
    /// Aborted, every marker written.
    CompleteAbort,
}

impl TxnStatus {
    /// The status's stored code (0 to 5, in declaration order).
    pub const fn code(self) -> i16 {
        match self {
            TxnStatus::Empty => 0,
            TxnStatus::Ongoing => 1,
            TxnStatus::PrepareCommit => 2,
            TxnStatus::PrepareAbort => 3,
            TxnStatus::CompleteCommit => 4,
            TxnStatus::CompleteAbort => 5,
        }
    }

    /// The status of a stored code.
    pub fn from_code(code: i16) -> Option<TxnStatus> {
        Some(match code {
            0 => TxnStatus::Empty,
            1 => TxnStatus::Ongoing,
            2 => TxnStatus::PrepareCommit,
            3 => TxnStatus::PrepareAbort,
            4 => TxnStatus::CompleteCommit,
            5 => TxnStatus::CompleteAbort,
            _ => return None,
        })
    }

    /// The decided outcome (`true`: commit) of a prepared or completed transaction.
    pub fn outcome(self) -> Option<bool> {
        match self {
            TxnStatus::PrepareCommit | TxnStatus::CompleteCommit => Some(true),
            TxnStatus::PrepareAbort | TxnStatus::CompleteAbort => Some(false),
            TxnStatus::Empty | TxnStatus::Ongoing => None,
        }
    }

    /// Whether the transaction is decided and its markers may not all be written yet.
    pub fn is_prepared(self) -> bool {
        matches!(self, TxnStatus::PrepareCommit | TxnStatus::PrepareAbort)
    }
}

/// The transaction record of one transactional id ([module documentation](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxnRecord {
    /// The transactional id.
    pub transactional_id: String,
    /// The producer id its last InitProducerId gave.
    pub producer_id: i64,
    /// The producer epoch its last InitProducerId gave.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` of its last InitProducerId.
    pub timeout_ms: i64,
    /// Where its transaction stands.
    pub status: TxnStatus,
    /// The number of its open (or last) transaction: what its verified batches carry
    /// ([`crate::CommitBatch`]'s `txn_seq`) and its markers name ([`TxnMarker::txn_seq`]).
    /// Strictly increasing from one transaction to the next, whichever broker opens it.
    pub txn_seq: i64,
    /// The diskless partitions of its open (or last) transaction, ascending, each once.
    pub partitions: Vec<TopicIdPartition>,
    /// When its open (or last) transaction began (coordinator clock, ms); `-1` before the first.
    pub started_ms: i64,
    /// When the record last changed (coordinator clock, ms).
    pub updated_ms: i64,
    /// Whether the recorded producer id and epoch are fenced (`PRODUCER_FENCED`) until the next
    /// InitProducerId records a producer, as after Kafka's epoch bump: set when a transaction is
    /// aborted for its timeout, and by an InitProducerId's fence (`Init` without a producer),
    /// so that the old producer opens nothing while the host obtains the new epoch.
    pub fenced: bool,
}

impl TxnRecord {
    /// The markers that end a decided transaction in each of its partitions (none unless its
    /// status is prepared or complete). Writing them again is harmless: they carry its number, so
    /// a marker already written is answered as a duplicate.
    pub fn markers(&self) -> Vec<TxnMarker> {
        let Some(commit) = self.status.outcome() else {
            return Vec::new();
        };
        self.partitions
            .iter()
            .map(|p| TxnMarker {
                partition: *p,
                producer_id: self.producer_id,
                producer_epoch: self.producer_epoch,
                coordinator_epoch: 0,
                commit,
                txn_seq: Some(self.txn_seq),
            })
            .collect()
    }

    /// The transaction number a transactional batch of `producer_id`/`producer_epoch` to
    /// `partition` carries: the open transaction's, when the record shows it open under that
    /// producer with the partition added (the partition leader's verification, KIP-890). `None`
    /// otherwise: the coordinator then refuses the batch (`INVALID_TXN_STATE`), as Kafka does.
    pub fn txn_seq_for(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        partition: TopicIdPartition,
    ) -> Option<i64> {
        (self.status == TxnStatus::Ongoing
            && !self.fenced
            && self.producer_id == producer_id
            && self.producer_epoch == producer_epoch
            && self.partitions.binary_search(&partition).is_ok())
        .then_some(self.txn_seq)
    }
}

/// One change of a transaction record, asked by a broker (see [`apply_txn_transition`] for the
/// rules).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnTransition {
    /// InitProducerId. With `producer: None`, only the fence: an ongoing transaction is decided
    /// aborted and the answer is `CONCURRENT_TRANSACTIONS` while a decided one is not complete.
    /// With the producer id and epoch the host's InitProducerId gave, they are recorded with
    /// `timeout_ms` (status `Empty`) once no transaction is open or decided and incomplete.
    Init {
        /// The transactional id.
        transactional_id: String,
        /// The producer id and epoch to record, if the host has them.
        producer: Option<(i64, i16)>,
        /// `transaction.timeout.ms` (1 to `i32::MAX`).
        timeout_ms: i64,
    },
    /// AddPartitionsToTxn (and AddOffsetsToTxn, with no partitions): opens the producer's next
    /// transaction or adds to its open one.
    AddPartitions {
        /// The transactional id.
        transactional_id: String,
        /// The producer id of the request.
        producer_id: i64,
        /// The producer epoch of the request.
        producer_epoch: i16,
        /// The diskless partitions added (any order; repeats are ignored).
        partitions: Vec<TopicIdPartition>,
    },
    /// EndTxn: decides the open transaction.
    End {
        /// The transactional id.
        transactional_id: String,
        /// The producer id of the request.
        producer_id: i64,
        /// The producer epoch of the request.
        producer_epoch: i16,
        /// Commit (`true`) or abort.
        commit: bool,
    },
    /// Every marker of the decided transaction numbered `txn_seq` is written.
    Complete {
        /// The transactional id.
        transactional_id: String,
        /// The record's producer id.
        producer_id: i64,
        /// The record's transaction number.
        txn_seq: i64,
    },
}

impl TxnTransition {
    /// The transactional id it changes.
    pub fn transactional_id(&self) -> &str {
        match self {
            TxnTransition::Init {
                transactional_id, ..
            }
            | TxnTransition::AddPartitions {
                transactional_id, ..
            }
            | TxnTransition::End {
                transactional_id, ..
            }
            | TxnTransition::Complete {
                transactional_id, ..
            } => transactional_id,
        }
    }
}

/// The answer to a [`TxnTransition`]: Kafka's error code for the request (`NONE` when it was
/// applied, or was a repeat of one already applied) and the record as it now stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxnAnswer {
    /// `NONE`, or why the transition was refused (nothing changed then).
    pub error: ErrorCode,
    /// The record after the transition (or as it stands, when refused); `None` if there is none.
    pub record: Option<TxnRecord>,
}

/// The longest transactional id accepted, in bytes: below what every store indexes (PostgreSQL's
/// btree keys stop near 2.7 KB); Kafka's own limit is its string's, 32,767.
pub const MAX_TRANSACTIONAL_ID_LEN: usize = 2048;

/// Decides `transition` on the record `current` at coordinator time `now_ms`. Returns the answer
/// and, when the record changes, the record to store. A request that contradicts itself (an
/// empty or over-long transactional id, a negative producer id, epoch or partition, a timeout
/// outside `1..=i32::MAX`) is [`CoordinatorError::InvalidRequest`].
///
/// The rules, Kafka's `TransactionCoordinator` where it has one:
/// - **Init**: an `Ongoing` transaction is fenced: decided `PrepareAbort` and the producer
///   fenced, answered `CONCURRENT_TRANSACTIONS` (the host finishes it and asks again); a
///   prepared one is `CONCURRENT_TRANSACTIONS` unchanged. Then without a producer the recorded
///   producer is fenced (so that it opens no transaction while the host obtains the new epoch)
///   and the answer is `NONE`; with one, an epoch below the record's for the same producer id is
///   `PRODUCER_FENCED`, else the producer, epoch and timeout are recorded, status `Empty`, the
///   timeout fence lifted; the transaction number is kept.
/// - **AddPartitions**: no record, or another producer id, is `INVALID_PRODUCER_ID_MAPPING`;
///   another epoch, or a fenced one (a timeout or an Init fenced it), `PRODUCER_FENCED`; a prepared transaction
///   `CONCURRENT_TRANSACTIONS`; an `Ongoing` one takes the partitions; otherwise the next
///   transaction opens (`Ongoing`, started now) with them, numbered `max(txn_seq + 1, now_ms ×
///   1000)` — above every earlier number, and above numbers a host took from its clock before it
///   kept records.
/// - **End**: the producer is checked as for AddPartitions; `Ongoing` is decided
///   (`PrepareCommit`/`PrepareAbort`); the same outcome again (prepared or complete) is `NONE`
///   unchanged (a retried EndTxn); the other outcome, or `Empty`, is `INVALID_TXN_STATE`.
/// - **Complete**: no record or another producer id is `INVALID_PRODUCER_ID_MAPPING`; a prepared
///   transaction with that number becomes complete; anything else is `NONE` unchanged (already
///   completed: the record moves past a prepared transaction only by its completion).
pub fn apply_txn_transition(
    current: Option<&TxnRecord>,
    transition: &TxnTransition,
    now_ms: i64,
) -> Result<(TxnAnswer, Option<TxnRecord>), CoordinatorError> {
    validate(transition)?;
    let refuse = |error: ErrorCode| {
        Ok((
            TxnAnswer {
                error,
                record: current.cloned(),
            },
            None,
        ))
    };
    let apply = |record: TxnRecord, error: ErrorCode| {
        Ok((
            TxnAnswer {
                error,
                record: Some(record.clone()),
            },
            Some(record),
        ))
    };
    match transition {
        TxnTransition::Init {
            transactional_id,
            producer,
            timeout_ms,
        } => {
            if let Some(r) = current {
                if r.status == TxnStatus::Ongoing {
                    let mut fenced = r.clone();
                    fenced.status = TxnStatus::PrepareAbort;
                    fenced.fenced = true;
                    fenced.updated_ms = now_ms;
                    return apply(fenced, ErrorCode::ConcurrentTransactions);
                }
                if r.status.is_prepared() {
                    return refuse(ErrorCode::ConcurrentTransactions);
                }
            }
            let Some((producer_id, producer_epoch)) = *producer else {
                // The fence alone: the old producer opens nothing more.
                return match current {
                    Some(r) if !r.fenced => {
                        let mut fenced = r.clone();
                        fenced.fenced = true;
                        fenced.updated_ms = now_ms;
                        apply(fenced, ErrorCode::None)
                    }
                    _ => refuse(ErrorCode::None),
                };
            };
            if let Some(r) = current
                && r.producer_id == producer_id
                && producer_epoch < r.producer_epoch
            {
                return refuse(ErrorCode::ProducerFenced);
            }
            let record = TxnRecord {
                transactional_id: transactional_id.clone(),
                producer_id,
                producer_epoch,
                timeout_ms: *timeout_ms,
                status: TxnStatus::Empty,
                txn_seq: current.map_or(0, |r| r.txn_seq),
                partitions: current.map_or_else(Vec::new, |r| r.partitions.clone()),
                started_ms: current.map_or(-1, |r| r.started_ms),
                updated_ms: now_ms,
                fenced: false,
            };
            apply(record, ErrorCode::None)
        }
        TxnTransition::AddPartitions {
            producer_id,
            producer_epoch,
            partitions,
            ..
        } => {
            let r = match check_producer(current, *producer_id, *producer_epoch) {
                Ok(r) => r,
                Err(code) => return refuse(code),
            };
            let mut next = r.clone();
            match r.status {
                TxnStatus::PrepareCommit | TxnStatus::PrepareAbort => {
                    return refuse(ErrorCode::ConcurrentTransactions);
                }
                TxnStatus::Ongoing => {
                    let before = next.partitions.len();
                    next.partitions.extend(partitions.iter().copied());
                    next.partitions.sort_unstable();
                    next.partitions.dedup();
                    if next.partitions.len() == before {
                        return refuse(ErrorCode::None);
                    }
                }
                TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort => {
                    next.status = TxnStatus::Ongoing;
                    next.txn_seq = r.txn_seq.saturating_add(1).max(now_ms.saturating_mul(1000));
                    next.partitions = partitions.clone();
                    next.partitions.sort_unstable();
                    next.partitions.dedup();
                    next.started_ms = now_ms;
                }
            }
            next.updated_ms = now_ms;
            apply(next, ErrorCode::None)
        }
        TxnTransition::End {
            producer_id,
            producer_epoch,
            commit,
            ..
        } => {
            let r = match check_producer(current, *producer_id, *producer_epoch) {
                Ok(r) => r,
                Err(code) => return refuse(code),
            };
            match r.status {
                TxnStatus::Ongoing => {
                    let mut next = r.clone();
                    next.status = if *commit {
                        TxnStatus::PrepareCommit
                    } else {
                        TxnStatus::PrepareAbort
                    };
                    next.updated_ms = now_ms;
                    apply(next, ErrorCode::None)
                }
                TxnStatus::Empty => refuse(ErrorCode::InvalidTxnState),
                decided if decided.outcome() == Some(*commit) => refuse(ErrorCode::None),
                _ => refuse(ErrorCode::InvalidTxnState),
            }
        }
        TxnTransition::Complete {
            producer_id,
            txn_seq,
            ..
        } => match current {
            Some(r) if r.producer_id == *producer_id => {
                if r.status.is_prepared() && r.txn_seq == *txn_seq {
                    let mut next = r.clone();
                    next.status = if r.status == TxnStatus::PrepareCommit {
                        TxnStatus::CompleteCommit
                    } else {
                        TxnStatus::CompleteAbort
                    };
                    next.updated_ms = now_ms;
                    apply(next, ErrorCode::None)
                } else {
                    refuse(ErrorCode::None)
                }
            }
            _ => refuse(ErrorCode::InvalidProducerIdMapping),
        },
    }
}

/// The record of a request by `producer_id`/`producer_epoch`, or Kafka's error for it.
fn check_producer(
    current: Option<&TxnRecord>,
    producer_id: i64,
    producer_epoch: i16,
) -> Result<&TxnRecord, ErrorCode> {
    let r = current.ok_or(ErrorCode::InvalidProducerIdMapping)?;
    if r.producer_id != producer_id {
        return Err(ErrorCode::InvalidProducerIdMapping);
    }
    if r.producer_epoch != producer_epoch || r.fenced {
        return Err(ErrorCode::ProducerFenced);
    }
    Ok(r)
}

/// The request checks of [`apply_txn_transition`].
pub(crate) fn validate(transition: &TxnTransition) -> Result<(), CoordinatorError> {
    let invalid = |why: &str| Err(CoordinatorError::InvalidRequest(why.into()));
    let tid = transition.transactional_id();
    if tid.is_empty() || tid.len() > MAX_TRANSACTIONAL_ID_LEN || tid.contains('\0') {
        return invalid("a transactional id is 1 to 2048 bytes, without NUL");
    }
    let producer_ok = |id: i64, epoch: i16| id >= 0 && epoch >= 0;
    match transition {
        TxnTransition::Init {
            producer,
            timeout_ms,
            ..
        } => {
            if !(1..=i64::from(i32::MAX)).contains(timeout_ms) {
                return invalid("a transaction timeout is 1 to 2147483647 ms");
            }
            if producer.is_some_and(|(id, epoch)| !producer_ok(id, epoch)) {
                return invalid("a producer id and epoch are not negative");
            }
        }
        TxnTransition::AddPartitions {
            producer_id,
            producer_epoch,
            partitions,
            ..
        } => {
            if !producer_ok(*producer_id, *producer_epoch) {
                return invalid("a producer id and epoch are not negative");
            }
            if partitions.iter().any(|p| p.partition < 0) {
                return invalid("a partition index is not negative");
            }
        }
        TxnTransition::End {
            producer_id,
            producer_epoch,
            ..
        } => {
            if !producer_ok(*producer_id, *producer_epoch) {
                return invalid("a producer id and epoch are not negative");
            }
        }
        TxnTransition::Complete { producer_id, .. } => {
            if *producer_id < 0 {
                return invalid("a producer id is not negative");
            }
        }
    }
    Ok(())
}

/// Decides the timeout of `record` at `now_ms`: an `Ongoing` transaction open longer than its
/// timeout (`started_ms + timeout_ms < now_ms`) is decided `PrepareAbort` and its producer's
/// epoch fenced ([`TxnRecord::fenced`]), as Kafka's transaction coordinator aborts it and
/// bumps the epoch. Returns the record to store, if it changes.
pub fn expire_txn(record: &TxnRecord, now_ms: i64) -> Option<TxnRecord> {
    (record.status == TxnStatus::Ongoing
        && record.started_ms.saturating_add(record.timeout_ms) < now_ms)
        .then(|| TxnRecord {
            status: TxnStatus::PrepareAbort,
            fenced: true,
            updated_ms: now_ms,
            ..record.clone()
        })
}

/// The stored form of [`TxnRecord::partitions`]: 20 bytes each, the topic id's 16 then the index
/// (big-endian).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn encode_partitions(partitions: &[TopicIdPartition]) -> Vec<u8> {
    let mut out = Vec::with_capacity(partitions.len() * 20);
    for p in partitions {
        out.extend_from_slice(p.topic_id.as_bytes());
        out.extend_from_slice(&p.partition.to_be_bytes());
    }
    out
}

/// [`TxnRecord::partitions`] from their stored form; `None` if it is not one.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn decode_partitions(bytes: &[u8]) -> Option<Vec<TopicIdPartition>> {
    if !bytes.len().is_multiple_of(20) {
        return None;
    }
    bytes
        .chunks_exact(20)
        .map(|c| {
            let id = uuid::Uuid::from_slice(&c[..16]).ok()?;
            let index = i32::from_be_bytes(c[16..20].try_into().ok()?);
            Some(TopicIdPartition::new(id, index))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(i: i32) -> TopicIdPartition {
        TopicIdPartition::new(uuid::Uuid::from_u128(7), i)
    }

    fn init(producer: Option<(i64, i16)>) -> TxnTransition {
        TxnTransition::Init {
            transactional_id: "t".into(),
            producer,
            timeout_ms: 1000,
        }
    }

    fn add(epoch: i16, partitions: &[i32]) -> TxnTransition {
        TxnTransition::AddPartitions {
            transactional_id: "t".into(),
            producer_id: 5,
            producer_epoch: epoch,
            partitions: partitions.iter().map(|&i| tp(i)).collect(),
        }
    }

    fn end(epoch: i16, commit: bool) -> TxnTransition {
        TxnTransition::End {
            transactional_id: "t".into(),
            producer_id: 5,
            producer_epoch: epoch,
            commit,
        }
    }

    /// Applies `t` to `r` (keeping the stored record), returning the answer's code.
    fn step(r: &mut Option<TxnRecord>, t: &TxnTransition, now: i64) -> ErrorCode {
        let (answer, stored) = apply_txn_transition(r.as_ref(), t, now).unwrap();
        if let Some(s) = stored {
            *r = Some(s);
        }
        assert_eq!(
            answer.record, *r,
            "the answer shows the record as it stands"
        );
        answer.error
    }

    #[test]
    fn a_transaction_goes_through_its_states_and_numbers_increase() {
        let mut r = None;
        assert_eq!(
            step(&mut r, &add(0, &[1]), 1),
            ErrorCode::InvalidProducerIdMapping
        );
        assert_eq!(step(&mut r, &init(Some((5, 0))), 1), ErrorCode::None);
        assert_eq!(step(&mut r, &end(0, true), 1), ErrorCode::InvalidTxnState);
        assert_eq!(step(&mut r, &add(0, &[2, 1, 2]), 2), ErrorCode::None);
        let first = r.clone().unwrap();
        assert_eq!(first.status, TxnStatus::Ongoing);
        assert_eq!(first.partitions, vec![tp(1), tp(2)]);
        assert_eq!(first.txn_seq, 2000);
        assert_eq!(first.txn_seq_for(5, 0, tp(2)), Some(2000));
        assert_eq!(first.txn_seq_for(5, 1, tp(2)), None);
        assert_eq!(first.txn_seq_for(5, 0, tp(3)), None);
        assert_eq!(step(&mut r, &add(1, &[3]), 3), ErrorCode::ProducerFenced);
        assert_eq!(step(&mut r, &end(0, true), 4), ErrorCode::None);
        let decided = r.clone().unwrap();
        assert_eq!(decided.status, TxnStatus::PrepareCommit);
        assert_eq!(decided.markers().len(), 2);
        assert!(
            decided
                .markers()
                .iter()
                .all(|m| m.commit && m.txn_seq == Some(2000))
        );
        assert_eq!(decided.txn_seq_for(5, 0, tp(2)), None);
        assert_eq!(step(&mut r, &end(0, true), 5), ErrorCode::None, "a retry");
        assert_eq!(step(&mut r, &end(0, false), 5), ErrorCode::InvalidTxnState);
        assert_eq!(
            step(&mut r, &add(0, &[1]), 5),
            ErrorCode::ConcurrentTransactions
        );
        assert_eq!(
            step(&mut r, &init(Some((5, 1))), 5),
            ErrorCode::ConcurrentTransactions
        );
        let complete = TxnTransition::Complete {
            transactional_id: "t".into(),
            producer_id: 5,
            txn_seq: 2000,
        };
        assert_eq!(step(&mut r, &complete, 6), ErrorCode::None);
        assert_eq!(r.as_ref().unwrap().status, TxnStatus::CompleteCommit);
        assert_eq!(step(&mut r, &complete, 7), ErrorCode::None, "a repeat");
        assert_eq!(
            step(&mut r, &end(0, true), 7),
            ErrorCode::None,
            "a late retry"
        );
        // The clock went back: the next number is still above.
        assert_eq!(step(&mut r, &add(0, &[3]), 1), ErrorCode::None);
        assert_eq!(r.as_ref().unwrap().txn_seq, 2001);
        assert_eq!(r.as_ref().unwrap().partitions, vec![tp(3)]);
    }

    #[test]
    fn init_fences_an_ongoing_transaction_and_a_timeout_fences_the_epoch() {
        let mut r = None;
        step(&mut r, &init(Some((5, 0))), 0);
        step(&mut r, &add(0, &[1]), 10);
        assert_eq!(
            step(&mut r, &init(None), 20),
            ErrorCode::ConcurrentTransactions
        );
        assert_eq!(r.as_ref().unwrap().status, TxnStatus::PrepareAbort);
        assert_eq!(step(&mut r, &end(0, true), 20), ErrorCode::ProducerFenced);
        let rec = r.clone().unwrap();
        let done = TxnTransition::Complete {
            transactional_id: "t".into(),
            producer_id: 5,
            txn_seq: rec.txn_seq,
        };
        step(&mut r, &done, 30);
        assert_eq!(step(&mut r, &init(Some((5, 0))), 30), ErrorCode::None);
        assert_eq!(step(&mut r, &init(Some((5, 2))), 30), ErrorCode::None);
        assert_eq!(
            step(&mut r, &init(Some((5, 1))), 30),
            ErrorCode::ProducerFenced
        );
        // The fence alone (an InitProducerId before its new epoch is known) fences the producer.
        assert_eq!(step(&mut r, &init(None), 40), ErrorCode::None);
        assert!(r.as_ref().unwrap().fenced);
        assert_eq!(step(&mut r, &add(2, &[1]), 40), ErrorCode::ProducerFenced);
        assert_eq!(step(&mut r, &init(Some((5, 2))), 40), ErrorCode::None);
        step(&mut r, &add(2, &[1]), 100);
        let open = r.clone().unwrap();
        assert_eq!(
            expire_txn(&open, 1100),
            None,
            "not longer than its timeout yet"
        );
        let expired = expire_txn(&open, 1101).unwrap();
        assert_eq!(expired.status, TxnStatus::PrepareAbort);
        assert!(expired.fenced);
        r = Some(expired);
        assert_eq!(step(&mut r, &end(2, true), 1200), ErrorCode::ProducerFenced);
        assert_eq!(step(&mut r, &add(2, &[1]), 1200), ErrorCode::ProducerFenced);
        assert_eq!(
            step(&mut r, &init(Some((5, 3))), 1200),
            ErrorCode::ConcurrentTransactions
        );
    }

    #[test]
    fn bad_requests_are_refused_and_partitions_round_trip() {
        let bad = [
            TxnTransition::Init {
                transactional_id: String::new(),
                producer: None,
                timeout_ms: 1,
            },
            TxnTransition::Init {
                transactional_id: "t".into(),
                producer: None,
                timeout_ms: 0,
            },
            init(Some((-1, 0))),
            add(-1, &[]),
            add(0, &[-1]),
        ];
        for t in &bad {
            assert!(matches!(
                apply_txn_transition(None, t, 0),
                Err(CoordinatorError::InvalidRequest(_))
            ));
        }
        let ps = vec![tp(0), tp(i32::MAX)];
        assert_eq!(decode_partitions(&encode_partitions(&ps)), Some(ps));
        assert_eq!(decode_partitions(&[0; 19]), None);
        for s in 0..7 {
            assert_eq!(
                TxnStatus::from_code(s).map(TxnStatus::code),
                (s < 6).then_some(s)
            );
        }
    }
}
