//! Random operation sequences for model-based tests of [`BatchCoordinator`] implementations.
//!
//! [`ops_strategy`] generates sequences of [`Op`]s: topic creation and deletion, commits of files with
//! random batches over a few partitions and producers (in-sequence batches, duplicates, gaps, epoch
//! bumps and fenced epochs, sequences near `i32::MAX`, unknown partitions), DeleteRecords, clock
//! advances with retention passes, garbage collection of objects, CreatePartitions, topic config
//! changes, producer-id blocks, transactions (transactional batches verified for the producer's
//! current transaction, unverified or stale; COMMIT/ABORT markers with current, bumped or older
//! epochs, fenced coordinator epochs and repeated markers), tiered-segment consolidation (plan, a
//! fake build and registration; stale ranges after DeleteRecords or an earlier segment; retried
//! registrations; segment listings and tiering candidates), and queries under both isolation
//! levels.
//! [`check_against_model`] applies each op to an implementation and to the [`InMemoryCoordinator`]
//! and asserts equal results and, after every op, equal observable state.
//!
//! Ops are abstract ("the next sequence of producer 2", "half-way between log start and high
//! watermark"); the driver resolves them against the model's state just before applying them, so that
//! random sequences exercise the interesting paths instead of being rejected wholesale.

use super::InMemoryCoordinator;
use super::conformance::Harness;
use diskless_coordinator::{
    BatchCoordinator, Clock, CommitBatch, CommitFileRequest, CoordinatorError, CreateTopicRequest,
    DeleteRecordsRequest, EARLIEST_TIMESTAMP, ErrorCode, FindBatchesRequest, IsolationLevel,
    LATEST_TIMESTAMP, ListOffsetsRequest, MAX_TIMESTAMP, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
    NO_SEQUENCE, NO_TIMESTAMP, ProducerIdBlock, RegisterSegmentOutcome, RegisterSegmentRequest,
    SegmentLayoutSizes, SegmentPlan, SegmentPlanRequest, TimestampType, TopicConfig,
    TopicIdPartition, TxnMarker, TxnTransition,
};
use proptest::prelude::*;
use std::collections::HashMap;
use uuid::Uuid;

/// How many topic slots ops address.
pub const TOPIC_SLOTS: usize = 3;
/// Partitions per topic ops address (some may not exist: unknown partitions are exercised too).
pub const PARTITIONS: i32 = 3;
/// Producer ids ops use (0..PRODUCERS).
pub const PRODUCERS: i64 = 2;

/// The producer ids of the transaction records' ops (`Op::TxnRecord`): `TXN_RECORD_PRODUCER +
/// tid`, apart from the idempotent producers' `0..PRODUCERS`.
pub const TXN_RECORD_PRODUCER: i64 = 100;

/// What the driver does for one `Op::TxnRecord`, step by step.
enum TxnPlan {
    Apply(TxnTransition),
    Finish,
    Endings,
}

/// One step of a transaction record (`Op::TxnRecord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnRecordStep {
    /// InitProducerId: the fence alone (`bump: None`), or recording the record's epoch plus
    /// `bump` (negative: an older epoch); `short`: a 1 s timeout, else 60 s.
    Init {
        /// The epoch to record, relative to the record's (`None`: the fence alone).
        bump: Option<i16>,
        /// A 1 s transaction timeout.
        short: bool,
    },
    /// AddPartitionsToTxn of the partitions in `mask` (bit `3 × slot + partition`) under the
    /// record's epoch plus `epoch_delta`.
    Add {
        /// Which partitions.
        mask: u16,
        /// Epoch relative to the record's.
        epoch_delta: i16,
    },
    /// EndTxn under the record's epoch plus `epoch_delta`.
    End {
        /// Commit or abort.
        commit: bool,
        /// Epoch relative to the record's.
        epoch_delta: i16,
    },
    /// Writes the record's markers (every partition it names) on both, then `Complete`.
    Finish,
    /// `Add` of `mask`, then `End`, then `Finish`, under the record's epoch.
    Cycle {
        /// Which partitions.
        mask: u16,
        /// Commit or abort.
        commit: bool,
    },
    /// `txn_endings` (timeouts at the clock's now).
    Endings,
}

/// How an idempotent batch picks its epoch, relative to the producer's current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochChoice {
    /// The current epoch (0 when none).
    Same,
    /// The current epoch plus one.
    Bump,
    /// The current epoch minus one (fenced), or 0.
    Older,
    /// An epoch below -1: invalid, rejected per batch (INVALID_PRODUCER_EPOCH).
    Invalid,
}

/// How an idempotent batch picks its base sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqChoice {
    /// The next one (0 after an epoch bump).
    Next,
    /// Re-send the n-th most recent kept batch (n modulo the window; a duplicate).
    Resend(usize),
    /// Re-send the n-th most recent batch this producer ever sent to the partition, possibly
    /// older than the duplicate window (then out of order) or under an older epoch.
    ResendOld(usize),
    /// Skip `n` sequence numbers.
    Gap(i32),
    /// Exactly this sequence number.
    Exact(i32),
    /// A negative base sequence: invalid, rejected per batch (INVALID_RECORD).
    Negative,
}

/// Which object key a commit uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyChoice {
    /// A fresh UUID v7 key at the clock's now.
    New,
    /// A fresh key whose UUID v7 time is 30 minutes old: past the default commit deadline.
    Expired,
    /// The last committed key again (a duplicate object).
    ReuseLast,
    /// The last key fenced by a `FenceOrphans` op (refused as fenced), or a new key.
    ReuseFenced,
}

/// Whether a generated idempotent batch is transactional, and how it is verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnChoice {
    /// Not transactional.
    Plain,
    /// Transactional, verified for the producer's current transaction.
    Verified,
    /// Transactional, not verified (accepted only inside an open transaction of the same epoch).
    Unverified,
    /// Transactional, verified for the producer's previous transaction (already ended, or never
    /// begun here): the race the verification number closes.
    Stale,
}

/// Which transaction a generated marker says it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerSeqChoice {
    /// The producer's current transaction (the driver then moves on to the next one).
    Current,
    /// The previous one again (a repeated marker).
    Previous,
    /// None: an operator's abort, never deduplicated.
    Operator,
}

/// The producer side of a generated batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerSpec {
    /// The producer id, 0..PRODUCERS.
    pub producer_id: i64,
    /// The epoch choice.
    pub epoch: EpochChoice,
    /// The sequence choice.
    pub seq: SeqChoice,
    /// Transactional or not.
    pub txn: TxnChoice,
}

/// A generated batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSpec {
    /// The topic slot.
    pub slot: usize,
    /// The partition (may not exist).
    pub partition: i32,
    /// Record count.
    pub records: i32,
    /// Byte size.
    pub size: u32,
    /// Max timestamp relative to the clock's now.
    pub ts_delta: i64,
    /// No timestamp at all (base and max timestamps -1): retention ages it by its commit time.
    pub no_timestamp: bool,
    /// Idempotent producer, if any.
    pub producer: Option<ProducerSpec>,
}

/// Where an offset of a DeleteRecords or Fetch op lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetChoice {
    /// `-1` (the high watermark for DeleteRecords).
    MinusOne,
    /// The log start offset plus this delta (may be below it or beyond the high watermark).
    FromStart(i64),
    /// The given fraction (0..=100 percent) of the way from log start to the high watermark.
    Fraction(u8),
}

/// One generated operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create the topic of a slot.
    CreateTopic {
        /// Slot.
        slot: usize,
        /// Partition count (0 is invalid and exercises validation).
        partitions: i32,
        /// LogAppendTime or CreateTime.
        log_append_time: bool,
        /// retention.ms.
        retention_ms: i64,
        /// retention.bytes.
        retention_bytes: i64,
        /// producer.id.expiration.ms.
        producer_id_expiration_ms: i64,
        /// segment.ms (segment.bytes is [`SEGMENT_BYTES`]).
        segment_ms: i64,
    },
    /// Delete the topic of a slot.
    DeleteTopic {
        /// Slot.
        slot: usize,
    },
    /// Commit a file.
    Commit {
        /// Batches in order.
        batches: Vec<BatchSpec>,
        /// The object key.
        key: KeyChoice,
    },
    /// The orphan collector's fence on the last committed key (known: not fenced) and, if `fresh`,
    /// on a new never-committed key (fenced).
    FenceOrphans {
        /// Also fence a new key.
        fresh: bool,
    },
    /// Expire idempotent-producer state (no cap).
    ExpireProducers,
    /// DeleteRecords on one partition.
    DeleteRecords {
        /// Slot.
        slot: usize,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: OffsetChoice,
    },
    /// Move the clock forward.
    AdvanceClock(i64),
    /// Run a retention pass.
    EnforceRetention {
        /// The cap.
        max_batches: u32,
    },
    /// Collect marked objects older than `age` ms and confirm up to `limit` deleted.
    CollectGarbage {
        /// Minimum age of the mark.
        age: i64,
        /// Limit.
        limit: u32,
    },
    /// A fetch on up to a few partitions.
    Find {
        /// (slot, partition, offset, max bytes).
        partitions: Vec<(usize, i32, OffsetChoice, u32)>,
        /// The total limit.
        fetch_max_bytes: u32,
        /// `read_committed` (else `read_uncommitted`).
        read_committed: bool,
    },
    /// Transaction markers of one producer on up to a few partitions, in one call.
    WriteMarkers {
        /// The producer id, 0..PRODUCERS.
        producer_id: i64,
        /// (slot, partition) per marker (may repeat, may not exist).
        partitions: Vec<(usize, i32)>,
        /// COMMIT or ABORT.
        commit: bool,
        /// The marker's producer epoch relative to the producer's (`Invalid` is read as `Same`).
        epoch: EpochChoice,
        /// Added to the driver's coordinator epoch for this call: `-1` is a fenced coordinator,
        /// `1` a new one (kept for later calls).
        coordinator_epoch_delta: i32,
        /// Which transaction it ends.
        seq: MarkerSeqChoice,
    },
    /// CreatePartitions: grow the topic of a slot to `new_total` partitions (refused unless it
    /// has fewer).
    CreatePartitions {
        /// Slot.
        slot: usize,
        /// The new partition count.
        new_total: i32,
    },
    /// Replace the config of the topic of a slot (the values as in [`Op::CreateTopic`]).
    AlterTopicConfig {
        /// Slot.
        slot: usize,
        /// LogAppendTime or CreateTime.
        log_append_time: bool,
        /// retention.ms (`-2` is invalid and exercises validation).
        retention_ms: i64,
        /// retention.bytes.
        retention_bytes: i64,
        /// producer.id.expiration.ms.
        producer_id_expiration_ms: i64,
    },
    /// A step of the transaction record of transactional id `tid` (0 or 1; producer id
    /// `TXN_RECORD_PRODUCER + tid`), resolved against the model's record.
    TxnRecord {
        /// Which transactional id.
        tid: u8,
        /// What is asked.
        step: TxnRecordStep,
    },
    /// Take a block of `count` producer ids (0 is invalid).
    AllocateProducerIds {
        /// Block size.
        count: u32,
    },
    /// ListOffsets on one partition with a timestamp relative to now (or -1/-2/-3).
    ListOffsets {
        /// Slot.
        slot: usize,
        /// Partition.
        partition: i32,
        /// `Some(delta)`: now + delta; `None`: the special value `special`.
        relative: Option<i64>,
        /// -1, -2 or -3.
        special: i64,
        /// `read_committed` (else `read_uncommitted`).
        read_committed: bool,
    },
    /// Plan the next tiered segment of a partition, build a fake segment object from the plan
    /// (sizes from the planned batches) and register it under a fresh key.
    Consolidate {
        /// Slot.
        slot: usize,
        /// Partition (may not exist).
        partition: i32,
        /// The plan's batch limit (0: the first batch only).
        max_batches: u32,
        /// Only batches committed at least this long ago are planned.
        min_age_ms: i64,
    },
    /// Plan a segment of a partition, then make its range stale (DeleteRecords past its first
    /// batch's first record if `delete_records`, else register the range under another key
    /// first) and register it: Stale.
    RegisterStale {
        /// Slot.
        slot: usize,
        /// Partition.
        partition: i32,
        /// Move the log start (else consolidate the range first).
        delete_records: bool,
    },
    /// Register the last registered segment again, same key (a retry: AlreadyRegistered while it
    /// is still there).
    RegisterTwice,
    /// List the tiered segments of a partition (all of them, and one from half-way).
    ListTiered {
        /// Slot.
        slot: usize,
        /// Partition (may not exist).
        partition: i32,
    },
    /// List the partitions due for consolidation, a page of `limit` then the next one.
    TieringCandidates {
        /// The page size.
        limit: u32,
    },
}

/// `segment.bytes` of generated topics: small, so that partitions become due by size.
pub const SEGMENT_BYTES: i32 = 300;

fn isolation(read_committed: bool) -> IsolationLevel {
    if read_committed {
        IsolationLevel::ReadCommitted
    } else {
        IsolationLevel::ReadUncommitted
    }
}

fn producer_strategy() -> impl Strategy<Value = Option<ProducerSpec>> {
    let epoch = prop_oneof![
        8 => Just(EpochChoice::Same),
        1 => Just(EpochChoice::Bump),
        1 => Just(EpochChoice::Older),
        1 => Just(EpochChoice::Invalid),
    ];
    let seq = prop_oneof![
        10 => Just(SeqChoice::Next),
        5 => (0usize..6).prop_map(SeqChoice::Resend),
        2 => (0usize..10).prop_map(SeqChoice::ResendOld),
        1 => (1i32..3).prop_map(SeqChoice::Gap),
        1 => prop_oneof![Just(0), Just(i32::MAX - 1), Just(i32::MAX), 0..100i32]
            .prop_map(SeqChoice::Exact),
        1 => Just(SeqChoice::Negative),
    ];
    let txn = prop_oneof![
        6 => Just(TxnChoice::Plain),
        4 => Just(TxnChoice::Verified),
        2 => Just(TxnChoice::Unverified),
        1 => Just(TxnChoice::Stale),
    ];
    prop_oneof![
        1 => Just(None),
        2 => (0..PRODUCERS, epoch, seq, txn).prop_map(|(producer_id, epoch, seq, txn)| {
            Some(ProducerSpec {
                producer_id,
                epoch,
                seq,
                txn,
            })
        }),
    ]
}

fn txn_record_strategy() -> impl Strategy<Value = Op> {
    let delta = prop_oneof![8 => Just(0i16), 1 => Just(-1), 1 => Just(1)];
    let step = prop_oneof![
        1 => (prop_oneof![3 => Just(Some(1i16)), 1 => Just(None), 1 => Just(Some(-1)), 1 => Just(Some(0))], any::<bool>())
            .prop_map(|(bump, short)| TxnRecordStep::Init { bump, short }),
        3 => (1u16..512, delta.clone())
            .prop_map(|(mask, epoch_delta)| TxnRecordStep::Add { mask, epoch_delta }),
        3 => (any::<bool>(), delta)
            .prop_map(|(commit, epoch_delta)| TxnRecordStep::End { commit, epoch_delta }),
        2 => Just(TxnRecordStep::Finish),
        2 => (1u16..512, any::<bool>()).prop_map(|(mask, commit)| TxnRecordStep::Cycle { mask, commit }),
        1 => Just(TxnRecordStep::Endings),
    ];
    (0u8..2, step).prop_map(|(tid, step)| Op::TxnRecord { tid, step })
}

fn markers_strategy() -> impl Strategy<Value = Op> {
    (
        0..PRODUCERS,
        prop::collection::vec(
            (
                prop_oneof![4 => 0..2usize, 1 => 0..TOPIC_SLOTS],
                prop_oneof![10 => 0..PARTITIONS, 1 => Just(PARTITIONS)],
            ),
            0..4,
        ),
        any::<bool>(),
        prop_oneof![
            6 => Just(EpochChoice::Same),
            2 => Just(EpochChoice::Bump),
            2 => Just(EpochChoice::Older),
        ],
        prop_oneof![6 => Just(0i32), 2 => Just(-1), 1 => Just(1)],
        prop_oneof![
            8 => Just(MarkerSeqChoice::Current),
            2 => Just(MarkerSeqChoice::Previous),
            1 => Just(MarkerSeqChoice::Operator),
        ],
    )
        .prop_map(
            |(producer_id, partitions, commit, epoch, coordinator_epoch_delta, seq)| {
                Op::WriteMarkers {
                    producer_id,
                    partitions,
                    commit,
                    epoch,
                    coordinator_epoch_delta,
                    seq,
                }
            },
        )
}

fn batch_strategy() -> impl Strategy<Value = BatchSpec> {
    (
        prop_oneof![4 => 0..2usize, 1 => 0..TOPIC_SLOTS],
        prop_oneof![10 => 0..PARTITIONS, 1 => Just(PARTITIONS)],
        1i32..5,
        1u32..300,
        -5_000i64..1_000,
        producer_strategy(),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(slot, partition, records, size, ts_delta, producer, no_timestamp)| BatchSpec {
                slot,
                partition,
                records,
                size,
                ts_delta,
                no_timestamp,
                producer,
            },
        )
}

fn offset_strategy() -> impl Strategy<Value = OffsetChoice> {
    prop_oneof![
        1 => Just(OffsetChoice::MinusOne),
        2 => (-2i64..4).prop_map(OffsetChoice::FromStart),
        4 => (0u8..=100).prop_map(OffsetChoice::Fraction),
    ]
}

fn create_strategy() -> impl Strategy<Value = Op> {
    (
        0..TOPIC_SLOTS,
        prop_oneof![10 => 1i32..=PARTITIONS, 1 => Just(0)],
        any::<bool>(),
        prop_oneof![Just(-1i64), Just(2_000), Just(10_000)],
        prop_oneof![Just(-1i64), Just(0), Just(500), Just(1_500)],
        prop_oneof![Just(86_400_000i64), Just(2_000), Just(6_000)],
        prop_oneof![
            Just(1_000i64),
            Just(5_000),
            Just(TopicConfig::default().segment_ms)
        ],
    )
        .prop_map(
            |(
                slot,
                partitions,
                log_append_time,
                retention_ms,
                retention_bytes,
                producer_id_expiration_ms,
                segment_ms,
            )| Op::CreateTopic {
                slot,
                partitions,
                log_append_time,
                retention_ms,
                retention_bytes,
                producer_id_expiration_ms,
                segment_ms,
            },
        )
}

fn alter_strategy() -> impl Strategy<Value = Op> {
    (
        0..TOPIC_SLOTS,
        any::<bool>(),
        prop_oneof![10 => prop_oneof![Just(-1i64), Just(2_000), Just(10_000)], 1 => Just(-2)],
        prop_oneof![Just(-1i64), Just(0), Just(500), Just(1_500)],
        prop_oneof![Just(86_400_000i64), Just(2_000), Just(6_000)],
    )
        .prop_map(
            |(slot, log_append_time, retention_ms, retention_bytes, producer_id_expiration_ms)| {
                Op::AlterTopicConfig {
                    slot,
                    log_append_time,
                    retention_ms,
                    retention_bytes,
                    producer_id_expiration_ms,
                }
            },
        )
}

/// One random op.
pub fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..TOPIC_SLOTS, 1..=PARTITIONS + 1)
            .prop_map(|(slot, new_total)| Op::CreatePartitions { slot, new_total }),
        1 => alter_strategy(),
        1 => prop_oneof![10 => 1u32..2_000, 1 => Just(0)]
            .prop_map(|count| Op::AllocateProducerIds { count }),
        2 => create_strategy(),
        1 => (0..TOPIC_SLOTS).prop_map(|slot| Op::DeleteTopic { slot }),
        12 => (
            prop::collection::vec(batch_strategy(), 0..8),
            prop_oneof![
                90 => Just(KeyChoice::New),
                5 => Just(KeyChoice::ReuseLast),
                3 => Just(KeyChoice::Expired),
                4 => Just(KeyChoice::ReuseFenced),
            ]
        )
            .prop_map(|(batches, key)| Op::Commit { batches, key }),
        1 => any::<bool>().prop_map(|fresh| Op::FenceOrphans { fresh }),
        1 => Just(Op::ExpireProducers),
        3 => (0..TOPIC_SLOTS, 0..PARTITIONS, offset_strategy())
            .prop_map(|(slot, partition, offset)| Op::DeleteRecords { slot, partition, offset }),
        2 => prop_oneof![Just(1i64), Just(500), Just(3_000)].prop_map(Op::AdvanceClock),
        2 => (0u32..6).prop_map(|max_batches| Op::EnforceRetention { max_batches }),
        2 => (prop_oneof![Just(0i64), Just(1_000)], 0u32..4)
            .prop_map(|(age, limit)| Op::CollectGarbage { age, limit }),
        2 => (
            prop::collection::vec(
                (0..TOPIC_SLOTS, 0..=PARTITIONS, offset_strategy(), 1u32..800),
                1..3
            ),
            1u32..1_500,
            any::<bool>()
        )
            .prop_map(|(partitions, fetch_max_bytes, read_committed)| Op::Find {
                partitions,
                fetch_max_bytes,
                read_committed
            }),
        3 => markers_strategy(),
        3 => txn_record_strategy(),
        2 => (
            0..TOPIC_SLOTS,
            0..PARTITIONS,
            prop::option::weighted(0.6, -6_000i64..2_000),
            prop_oneof![Just(LATEST_TIMESTAMP), Just(EARLIEST_TIMESTAMP), Just(MAX_TIMESTAMP)],
            any::<bool>()
        )
            .prop_map(|(slot, partition, relative, special, read_committed)| Op::ListOffsets {
                slot,
                partition,
                relative,
                special,
                read_committed
            }),
        4 => (
            prop_oneof![4 => 0..2usize, 1 => 0..TOPIC_SLOTS],
            prop_oneof![10 => 0..PARTITIONS, 1 => Just(PARTITIONS)],
            0u32..4,
            prop_oneof![3 => Just(0i64), 1 => Just(1_000)]
        )
            .prop_map(|(slot, partition, max_batches, min_age_ms)| Op::Consolidate {
                slot,
                partition,
                max_batches,
                min_age_ms
            }),
        1 => (0..2usize, 0..PARTITIONS, any::<bool>())
            .prop_map(|(slot, partition, delete_records)| Op::RegisterStale {
                slot,
                partition,
                delete_records
            }),
        1 => Just(Op::RegisterTwice),
        1 => (0..TOPIC_SLOTS, 0..=PARTITIONS)
            .prop_map(|(slot, partition)| Op::ListTiered { slot, partition }),
        1 => (1u32..4).prop_map(|limit| Op::TieringCandidates { limit }),
    ]
}

/// Random op sequences of up to `max_len` ops, starting with the creation of two topics.
pub fn ops_strategy(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    (
        create_strategy(),
        create_strategy(),
        prop::collection::vec(op_strategy(), 0..max_len),
    )
        .prop_map(|(a, b, rest)| {
            let fix = |op: Op, slot: usize| match op {
                Op::CreateTopic {
                    log_append_time,
                    retention_ms,
                    retention_bytes,
                    producer_id_expiration_ms,
                    segment_ms,
                    ..
                } => Op::CreateTopic {
                    slot,
                    partitions: PARTITIONS,
                    log_append_time,
                    retention_ms,
                    retention_bytes,
                    producer_id_expiration_ms,
                    segment_ms,
                },
                other => other,
            };
            let mut ops = vec![fix(a, 0), fix(b, 1)];
            ops.extend(rest);
            ops
        })
}

/// The topic id of a slot (stable, so a re-created topic re-uses its id).
pub fn slot_topic_id(slot: usize) -> Uuid {
    Uuid::from_u128(0x5107_0000_0000_0000_0000_0000_0000_0000 + slot as u128 + 1)
}

fn error_kind(e: &CoordinatorError) -> &'static str {
    match e {
        CoordinatorError::TopicAlreadyExists(_) => "TopicAlreadyExists",
        CoordinatorError::UnknownTopic(_) => "UnknownTopic",
        CoordinatorError::ObjectAlreadyCommitted(_) => "ObjectAlreadyCommitted",
        CoordinatorError::InvalidRequest(_) => "InvalidRequest",
        CoordinatorError::OutcomeUnknown(_) => "OutcomeUnknown",
        CoordinatorError::Unavailable(_) => "Unavailable",
        CoordinatorError::Storage(_) => "Storage",
        CoordinatorError::Closed => "Closed",
        CoordinatorError::DeadlineExceeded(_) => "DeadlineExceeded",
        CoordinatorError::ObjectFenced(_) => "ObjectFenced",
        CoordinatorError::InvalidPartitions(_) => "InvalidPartitions",
        _ => "other",
    }
}

/// Asserts that two results are equal (errors compared by kind).
fn assert_same<T: PartialEq + std::fmt::Debug>(
    step: usize,
    op: &Op,
    what: &str,
    real: Result<T, CoordinatorError>,
    model: Result<T, CoordinatorError>,
) -> Option<T> {
    match (real, model) {
        (Ok(r), Ok(m)) => {
            assert_eq!(
                r, m,
                "step {step} {op:?}: {what} differs (left: implementation)"
            );
            Some(r)
        }
        (Err(r), Err(m)) => {
            assert_eq!(
                error_kind(&r),
                error_kind(&m),
                "step {step} {op:?}: {what} errors differ: {r} vs {m}"
            );
            None
        }
        (r, m) => panic!("step {step} {op:?}: {what}: implementation {r:?}, model {m:?}"),
    }
}

/// What a run of [`check_against_model`] exercised (to check that generators reach the interesting
/// paths).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Batches appended.
    pub appended: u64,
    /// Batches answered as duplicates.
    pub duplicates: u64,
    /// Batches rejected with OUT_OF_ORDER_SEQUENCE_NUMBER.
    pub out_of_order: u64,
    /// Batches rejected with INVALID_PRODUCER_EPOCH.
    pub fenced: u64,
    /// Batches rejected with UNKNOWN_TOPIC_OR_PARTITION.
    pub unknown_partition: u64,
    /// Whole calls that failed (duplicate object, invalid topic, ...).
    pub failed_calls: u64,
    /// Batches deleted by retention.
    pub retention_deleted: u64,
    /// DeleteRecords that moved a log start offset.
    pub log_start_moves: u64,
    /// Objects confirmed deleted.
    pub objects_collected: u64,
    /// Batches rejected per batch for invalid producer fields (INVALID_RECORD).
    pub invalid_producer_fields: u64,
    /// Commits refused by the commit deadline.
    pub deadline_refused: u64,
    /// Commits refused because their key was fenced.
    pub fenced_refused: u64,
    /// Keys fenced by `fence_orphans`.
    pub keys_fenced: u64,
    /// Producer states expired.
    pub producers_expired: u64,
    /// Topics grown by CreatePartitions.
    pub partitions_added: u64,
    /// Topic configs replaced.
    pub configs_altered: u64,
    /// Transactional batches appended.
    pub txn_appended: u64,
    /// Batches rejected with INVALID_TXN_STATE.
    pub invalid_txn_state: u64,
    /// Markers written.
    pub markers_written: u64,
    /// Markers answered as repeats of an earlier one.
    pub markers_repeated: u64,
    /// Markers refused (older producer epoch, fenced coordinator epoch).
    pub markers_refused: u64,
    /// Aborted transactions reported by `read_committed` fetches of the state checks.
    pub aborted_reported: u64,
    /// Tiered segments registered.
    pub segments_registered: u64,
    /// Segment registrations answered Stale.
    pub segments_stale: u64,
    /// Segment registrations answered AlreadyRegistered.
    pub segments_already_registered: u64,
    /// Tiered segments deleted by retention.
    pub segments_deleted: u64,
    /// Partitions listed by `tiering_candidates`.
    pub tiering_candidates: u64,
    /// Transaction record transitions applied (answered `NONE` with a change).
    pub txn_records_changed: u64,
    /// Decided transactions whose markers were written and which were recorded complete.
    pub txn_records_finished: u64,
}

/// Producer sequence bookkeeping while resolving one file.
#[derive(Clone, Copy)]
struct Pending {
    epoch: i16,
    next_seq: i32,
}

/// A producer batch as sent: (epoch, base sequence, records).
type SentBatch = (i16, i32, i32);

struct Driver<'a> {
    real: &'a dyn BatchCoordinator,
    model: InMemoryCoordinator,
    harness: &'a Harness,
    keys: Vec<String>,
    /// Keys fenced by `FenceOrphans` ops (never committed).
    fenced: Vec<String>,
    key_counter: u64,
    stats: OpStats,
    /// Every producer batch sent per (partition, producer id).
    sent: HashMap<(TopicIdPartition, i64), Vec<SentBatch>>,
    /// The producer-id blocks the implementation handed out.
    blocks: Vec<(u32, ProducerIdBlock)>,
    /// Per producer id, the number of its current transaction (the host's `txn_seq`; from 1).
    txn_seq: HashMap<i64, i64>,
    /// The transaction coordinator's epoch markers are written with.
    coordinator_epoch: i32,
    /// How many aborted transactions `read_committed` state checks saw (for [`OpStats`]).
    aborted_seen: std::cell::Cell<u64>,
    /// The last segment registration answered Registered (for [`Op::RegisterTwice`]).
    last_segment: Option<RegisterSegmentRequest>,
}

impl Driver<'_> {
    async fn bounds(&self, p: TopicIdPartition) -> (i64, i64) {
        let r = self
            .model
            .list_offsets(&[
                ListOffsetsRequest {
                    partition: p,
                    timestamp: EARLIEST_TIMESTAMP,
                    isolation: Default::default(),
                },
                ListOffsetsRequest {
                    partition: p,
                    timestamp: LATEST_TIMESTAMP,
                    isolation: Default::default(),
                },
            ])
            .await
            .unwrap_or_default();
        match r.as_slice() {
            [a, b] if a.offset >= 0 => (a.offset, b.offset),
            _ => (0, 0),
        }
    }

    async fn resolve_offset(&self, p: TopicIdPartition, choice: OffsetChoice) -> i64 {
        let (lso, hwm) = self.bounds(p).await;
        match choice {
            OffsetChoice::MinusOne => -1,
            OffsetChoice::FromStart(d) => lso + d,
            OffsetChoice::Fraction(f) => lso + (hwm - lso) * i64::from(f) / 100,
        }
    }

    /// A fresh UUID v7 key with time `ms` (the counter in its random bits keeps keys unique and
    /// runs deterministic).
    fn v7_key(&mut self, ms: i64) -> String {
        self.key_counter += 1;
        crate::keys::v7_key_with(ms, self.key_counter)
    }

    /// The plan of `p`'s next segment on both sides (compared).
    async fn plan(
        &self,
        step: usize,
        op: &Op,
        p: TopicIdPartition,
        max_batches: u32,
        min_age_ms: i64,
    ) -> Option<SegmentPlan> {
        let req = SegmentPlanRequest {
            partition: p,
            max_bytes: u64::MAX,
            max_batches,
            committed_before_ms: self.harness.clock.now_ms() + 1 - min_age_ms,
        };
        let r = self.real.segment_plan(&req).await;
        let m = self.model.segment_plan(&req).await;
        assert_same(step, op, "segment_plan", r, m)
    }

    /// A fake build of a segment of `plan`'s batches under a fresh key (kept in the key list):
    /// the `.log` is the batches' bytes, the indexes small made-up sizes.
    fn segment_request(
        &mut self,
        p: TopicIdPartition,
        plan: &SegmentPlan,
    ) -> RegisterSegmentRequest {
        let batches = &plan.batches;
        let n = batches.len() as u32;
        let bytes: u64 = batches.iter().map(|b| u64::from(b.byte_size)).sum();
        let layout = SegmentLayoutSizes {
            log: bytes,
            offset_index: 8 * n,
            time_index: 12 * n,
            txn_index: 12 * plan.aborted.len() as u32,
            producer_snapshot: 10,
            leader_epochs: 0,
        };
        let mut max_timestamp = NO_TIMESTAMP;
        let mut max_timestamp_offset = batches.first().map_or(0, |b| b.base_offset);
        for b in batches {
            // Strictly greater: the earliest batch holding the max.
            if b.effective_max_timestamp() > max_timestamp {
                max_timestamp = b.effective_max_timestamp();
                max_timestamp_offset = b.last_offset;
            }
        }
        let object_key = self
            .v7_key(self.harness.clock.now_ms())
            .replacen("wal/", "tiered/", 1);
        self.keys.push(object_key.clone());
        RegisterSegmentRequest {
            partition: p,
            object_key,
            object_size: layout.object_size(),
            uploader_broker_id: 7,
            layout,
            base_offset: batches.first().map_or(0, |b| b.base_offset),
            end_offset: batches.last().map_or(0, |b| b.last_offset),
            batch_count: n,
            batch_bytes: bytes,
            max_timestamp,
            max_timestamp_offset,
            owner: 0,
        }
    }

    /// Registers `req` on both sides (compared) and counts the outcome.
    async fn register(
        &mut self,
        step: usize,
        op: &Op,
        req: RegisterSegmentRequest,
    ) -> Option<RegisterSegmentOutcome> {
        let r = self.real.register_segment(req.clone()).await;
        let m = self.model.register_segment(req.clone()).await;
        let outcome = assert_same(step, op, "register_segment", r, m);
        let s = &mut self.stats;
        match outcome {
            Some(RegisterSegmentOutcome::Registered { .. }) => {
                s.segments_registered += 1;
                self.last_segment = Some(req);
            }
            Some(RegisterSegmentOutcome::Stale) => s.segments_stale += 1,
            Some(RegisterSegmentOutcome::AlreadyRegistered) => s.segments_already_registered += 1,
            Some(_) => {}
            None => s.failed_calls += 1,
        }
        outcome
    }

    async fn resolve_commit(&mut self, batches: &[BatchSpec], key: KeyChoice) -> CommitFileRequest {
        let now = self.harness.clock.now_ms();
        let mut pending: HashMap<(TopicIdPartition, i64), Pending> = HashMap::new();
        let mut out = Vec::new();
        let mut at = 1u64;
        for spec in batches {
            let partition = TopicIdPartition::new(slot_topic_id(spec.slot), spec.partition);
            let (transactional, txn_seq) = match spec.producer.as_ref().map(|ps| ps.txn) {
                None | Some(TxnChoice::Plain) => (false, None),
                Some(choice) => {
                    let pid = spec.producer.as_ref().map_or(0, |ps| ps.producer_id);
                    let current = self.txn_seq.get(&pid).copied().unwrap_or(1);
                    match choice {
                        TxnChoice::Verified => (true, Some(current)),
                        TxnChoice::Stale => (true, Some(current - 1)),
                        _ => (true, None),
                    }
                }
            };
            let (producer_id, producer_epoch, base_sequence, last_sequence, record_count) =
                match &spec.producer {
                    None => (
                        NO_PRODUCER_ID,
                        NO_PRODUCER_EPOCH,
                        NO_SEQUENCE,
                        NO_SEQUENCE,
                        spec.records,
                    ),
                    Some(ps) => {
                        let state = self
                            .model
                            .producer_state(partition, ps.producer_id)
                            .await
                            .ok()
                            .flatten();
                        let current = match pending.get(&(partition, ps.producer_id)) {
                            Some(p) => Some(*p),
                            None => state.as_ref().map(|s| Pending {
                                epoch: s.producer_epoch,
                                next_seq: s.batches.last().map_or(0, |b| {
                                    if b.last_sequence == i32::MAX {
                                        0
                                    } else {
                                        b.last_sequence + 1
                                    }
                                }),
                            }),
                        };
                        // New producers start at epoch 2 so that an older epoch exists.
                        let cur_epoch = current.map_or(2, |c| c.epoch);
                        let epoch = match ps.epoch {
                            EpochChoice::Same => cur_epoch,
                            EpochChoice::Bump => cur_epoch.saturating_add(1),
                            EpochChoice::Older => cur_epoch.saturating_sub(1).max(0),
                            EpochChoice::Invalid => -2,
                        };
                        let next = if epoch != cur_epoch {
                            0
                        } else {
                            current.map_or(0, |c| c.next_seq)
                        };
                        let old = match ps.seq {
                            SeqChoice::ResendOld(n) => self
                                .sent
                                .get(&(partition, ps.producer_id))
                                .filter(|h| !h.is_empty())
                                .map(|h| h[h.len() - 1 - n % h.len()]),
                            _ => None,
                        };
                        let epoch = old.map_or(epoch, |(e, _, _)| e);
                        let seq = match ps.seq {
                            SeqChoice::ResendOld(_) => old.map_or(next, |(_, s, _)| s),
                            SeqChoice::Next => next,
                            SeqChoice::Gap(g) => next.saturating_add(g),
                            SeqChoice::Exact(s) => s,
                            SeqChoice::Negative => -1,
                            SeqChoice::Resend(n) => match &state {
                                Some(s) if !s.batches.is_empty() => {
                                    let b = &s.batches[s.batches.len() - 1 - n % s.batches.len()];
                                    b.base_sequence
                                }
                                _ => next,
                            },
                        };
                        // A resend keeps the original batch's record count, so it is an exact match.
                        let records = match (ps.seq, &state) {
                            (SeqChoice::Resend(_), Some(s)) => s
                                .batches
                                .iter()
                                .find(|b| b.base_sequence == seq)
                                .map_or(spec.records, |b| {
                                    (b.last_offset - b.base_offset + 1) as i32
                                }),
                            (SeqChoice::ResendOld(_), _) => old.map_or(spec.records, |(_, _, r)| r),
                            _ => spec.records,
                        };
                        self.sent
                            .entry((partition, ps.producer_id))
                            .or_default()
                            .push((epoch, seq, records));
                        let last = ((i64::from(seq) + i64::from(records) - 1)
                            % (i64::from(i32::MAX) + 1)) as i32;
                        let next_seq = if last == i32::MAX { 0 } else { last + 1 };
                        if epoch >= cur_epoch {
                            pending
                                .insert((partition, ps.producer_id), Pending { epoch, next_seq });
                        }
                        (ps.producer_id, epoch, seq, last, records)
                    }
                };
            out.push(CommitBatch {
                partition,
                byte_offset: at,
                byte_size: spec.size,
                record_count,
                base_timestamp: if spec.no_timestamp {
                    -1
                } else {
                    now + spec.ts_delta - 10
                },
                max_timestamp: if spec.no_timestamp {
                    -1
                } else {
                    now + spec.ts_delta
                },
                timestamp_type: TimestampType::CreateTime,
                producer_id,
                producer_epoch,
                base_sequence,
                last_sequence,
                transactional,
                txn_seq,
            });
            at += u64::from(spec.size);
        }
        let object_key = match (key, self.keys.last(), self.fenced.last()) {
            (KeyChoice::ReuseLast, Some(k), _) => k.clone(),
            (KeyChoice::ReuseFenced, _, Some(k)) => k.clone(),
            (KeyChoice::Expired, _, _) => {
                let k = self.v7_key(now - 30 * 60 * 1000);
                self.keys.push(k.clone());
                k
            }
            _ => {
                let k = self.v7_key(now);
                self.keys.push(k.clone());
                k
            }
        };
        CommitFileRequest {
            object_key,
            uploader_broker_id: 1,
            object_size: at + 3,
            owners: vec![0],
            batches: out,
        }
    }

    async fn apply(&mut self, step: usize, op: &Op) {
        let (real, model) = (self.real, &self.model);
        match op {
            Op::CreateTopic {
                slot,
                partitions,
                log_append_time,
                retention_ms,
                retention_bytes,
                producer_id_expiration_ms,
                segment_ms,
            } => {
                let req = CreateTopicRequest {
                    topic_id: slot_topic_id(*slot),
                    name: format!("topic-{slot}"),
                    partitions: *partitions,
                    config: TopicConfig {
                        timestamp_type: if *log_append_time {
                            TimestampType::LogAppendTime
                        } else {
                            TimestampType::CreateTime
                        },
                        retention_ms: *retention_ms,
                        retention_bytes: *retention_bytes,
                        producer_id_expiration_ms: *producer_id_expiration_ms,
                        segment_bytes: SEGMENT_BYTES,
                        segment_ms: *segment_ms,
                        ..TopicConfig::default()
                    },
                };
                let r = real.create_topic(req.clone()).await;
                let m = model.create_topic(req).await;
                if assert_same(step, op, "create_topic", r, m).is_none() {
                    self.stats.failed_calls += 1;
                }
            }
            Op::DeleteTopic { slot } => {
                let r = real.delete_topic(slot_topic_id(*slot)).await;
                let m = model.delete_topic(slot_topic_id(*slot)).await;
                assert_same(step, op, "delete_topic", r, m);
            }
            Op::Commit { batches, key } => {
                let req = self.resolve_commit(batches, *key).await;
                let transactional: Vec<bool> =
                    req.batches.iter().map(|b| b.transactional).collect();
                let r = self.real.commit_file(req.clone()).await;
                let m = self.model.commit_file(req).await;
                match &m {
                    Err(CoordinatorError::DeadlineExceeded(_)) => self.stats.deadline_refused += 1,
                    Err(CoordinatorError::ObjectFenced(_)) => self.stats.fenced_refused += 1,
                    _ => {}
                }
                match assert_same(step, op, "commit_file", r, m) {
                    None => self.stats.failed_calls += 1,
                    Some(results) => {
                        for (r, txn) in results.iter().zip(&transactional) {
                            if *txn && r.error.is_ok() && !r.duplicate {
                                self.stats.txn_appended += 1;
                            }
                        }
                        for r in results {
                            let s = &mut self.stats;
                            match r.error {
                                ErrorCode::None if r.duplicate => s.duplicates += 1,
                                ErrorCode::None => s.appended += 1,
                                ErrorCode::InvalidTxnState => s.invalid_txn_state += 1,
                                ErrorCode::OutOfOrderSequenceNumber => s.out_of_order += 1,
                                ErrorCode::InvalidProducerEpoch => s.fenced += 1,
                                ErrorCode::InvalidRecord => s.invalid_producer_fields += 1,
                                ErrorCode::UnknownTopicOrPartition => s.unknown_partition += 1,
                                _ => {}
                            }
                        }
                    }
                }
            }
            Op::DeleteRecords {
                slot,
                partition,
                offset,
            } => {
                let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                let req = [DeleteRecordsRequest {
                    partition: p,
                    offset: self.resolve_offset(p, *offset).await,
                }];
                let (lso, _) = self.bounds(p).await;
                let r = real.delete_records(&req).await;
                let m = model.delete_records(&req).await;
                if let Some(r) = assert_same(step, op, "delete_records", r, m)
                    && r.iter().any(|r| r.low_watermark > lso)
                {
                    self.stats.log_start_moves += 1;
                }
            }
            Op::AdvanceClock(ms) => self.harness.clock.advance(*ms),
            Op::FenceOrphans { fresh } => {
                let mut keys: Vec<String> = self.keys.last().cloned().into_iter().collect();
                if *fresh {
                    let k = self.v7_key(self.harness.clock.now_ms());
                    self.fenced.push(k.clone());
                    keys.push(k);
                }
                let r = real.fence_orphans(&keys).await;
                let m = self.model.fence_orphans(&keys).await;
                if let Some(fenced) = assert_same(step, op, "fence_orphans", r, m) {
                    self.stats.keys_fenced += fenced.len() as u64;
                }
            }
            Op::ExpireProducers => {
                let r = real.expire_producers(u32::MAX).await;
                let m = model.expire_producers(u32::MAX).await;
                if let Some(r) = assert_same(step, op, "expire_producers", r, m) {
                    self.stats.producers_expired += r.expired;
                }
            }
            Op::EnforceRetention { max_batches } => {
                let r = real.enforce_retention(*max_batches).await;
                let m = model.enforce_retention(*max_batches).await;
                if let Some(r) = assert_same(step, op, "enforce_retention", r, m) {
                    self.stats.retention_deleted += r.batches_deleted;
                    self.stats.segments_deleted += r.segments_deleted;
                }
            }
            Op::CollectGarbage { age, limit } => {
                let before = self.harness.clock.now_ms() - age;
                let r = real.objects_to_delete(before, *limit).await;
                let m = model.objects_to_delete(before, *limit).await;
                if let Some(list) = assert_same(step, op, "objects_to_delete", r, m) {
                    let keys: Vec<String> = list.into_iter().map(|o| o.object_key).collect();
                    self.stats.objects_collected += keys.len() as u64;
                    let r = real.confirm_deleted(&keys).await;
                    let m = model.confirm_deleted(&keys).await;
                    assert_same(step, op, "confirm_deleted", r, m);
                }
            }
            Op::Find {
                partitions,
                fetch_max_bytes,
                read_committed,
            } => {
                let mut reqs = Vec::new();
                for (slot, partition, offset, max_bytes) in partitions {
                    let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                    reqs.push(FindBatchesRequest {
                        partition: p,
                        offset: self.resolve_offset(p, *offset).await,
                        max_bytes: *max_bytes,
                        isolation: isolation(*read_committed),
                    });
                }
                let r = real.find_batches(&reqs, *fetch_max_bytes).await;
                let m = model.find_batches(&reqs, *fetch_max_bytes).await;
                assert_same(step, op, "find_batches", r, m);
            }
            Op::CreatePartitions { slot, new_total } => {
                let r = real
                    .create_partitions(slot_topic_id(*slot), *new_total)
                    .await;
                let m = model
                    .create_partitions(slot_topic_id(*slot), *new_total)
                    .await;
                match assert_same(step, op, "create_partitions", r, m) {
                    Some(()) => self.stats.partitions_added += 1,
                    None => self.stats.failed_calls += 1,
                }
            }
            Op::AlterTopicConfig {
                slot,
                log_append_time,
                retention_ms,
                retention_bytes,
                producer_id_expiration_ms,
            } => {
                let config = TopicConfig {
                    timestamp_type: if *log_append_time {
                        TimestampType::LogAppendTime
                    } else {
                        TimestampType::CreateTime
                    },
                    retention_ms: *retention_ms,
                    retention_bytes: *retention_bytes,
                    producer_id_expiration_ms: *producer_id_expiration_ms,
                    segment_bytes: SEGMENT_BYTES,
                    segment_ms: 3_000,
                    ..TopicConfig::default()
                };
                let id = slot_topic_id(*slot);
                let r = real.alter_topic_config(id, config.clone()).await;
                let m = model.alter_topic_config(id, config).await;
                match assert_same(step, op, "alter_topic_config", r, m) {
                    Some(()) => self.stats.configs_altered += 1,
                    None => self.stats.failed_calls += 1,
                }
            }
            Op::TxnRecord {
                tid,
                step: txn_step,
            } => {
                let id = format!("tx{tid}");
                let pid = TXN_RECORD_PRODUCER + i64::from(*tid);
                let current = model.describe_txn(&id).await.ok().flatten();
                let epoch = current.as_ref().map_or(0, |r| r.producer_epoch);
                let at = |delta: i16| epoch.saturating_add(delta).max(0);
                let init = |producer: Option<(i64, i16)>, short: bool| {
                    TxnPlan::Apply(TxnTransition::Init {
                        transactional_id: id.clone(),
                        producer,
                        timeout_ms: if short { 1_000 } else { 60_000 },
                    })
                };
                let add = |mask: u16, delta: i16| {
                    TxnPlan::Apply(TxnTransition::AddPartitions {
                        transactional_id: id.clone(),
                        producer_id: pid,
                        producer_epoch: at(delta),
                        partitions: (0..TOPIC_SLOTS * PARTITIONS as usize)
                            .filter(|bit| mask & (1 << bit) != 0)
                            .map(|bit| {
                                TopicIdPartition::new(
                                    slot_topic_id(bit / PARTITIONS as usize),
                                    (bit % PARTITIONS as usize) as i32,
                                )
                            })
                            .collect(),
                    })
                };
                let end = |commit: bool, delta: i16| {
                    TxnPlan::Apply(TxnTransition::End {
                        transactional_id: id.clone(),
                        producer_id: pid,
                        producer_epoch: at(delta),
                        commit,
                    })
                };
                let mut plan = Vec::new();
                // `tx0` is initialised before its first other step (so that sequences reach its
                // later states); `tx1` is not (requests without a record are refused).
                if current.is_none() && *tid == 0 && !matches!(txn_step, TxnRecordStep::Init { .. })
                {
                    plan.push(init(Some((pid, 0)), false));
                }
                match *txn_step {
                    TxnRecordStep::Init { bump, short } => plan.push(init(
                        bump.map(|b| (pid, if current.is_some() { at(b) } else { 0 })),
                        short,
                    )),
                    TxnRecordStep::Add { mask, epoch_delta } => plan.push(add(mask, epoch_delta)),
                    TxnRecordStep::End {
                        commit,
                        epoch_delta,
                    } => plan.push(end(commit, epoch_delta)),
                    TxnRecordStep::Cycle { mask, commit } => {
                        plan.extend([add(mask, 0), end(commit, 0), TxnPlan::Finish]);
                    }
                    TxnRecordStep::Finish => plan.push(TxnPlan::Finish),
                    TxnRecordStep::Endings => plan.push(TxnPlan::Endings),
                }
                for p in plan {
                    let before = model.describe_txn(&id).await.ok().flatten();
                    let transition = match p {
                        TxnPlan::Apply(t) => Some(t),
                        TxnPlan::Finish => {
                            let markers = before.as_ref().map(|r| r.markers()).unwrap_or_default();
                            if !markers.is_empty() {
                                let r = real.write_txn_markers(&markers).await;
                                let m = model.write_txn_markers(&markers).await;
                                assert_same(step, op, "write_txn_markers", r, m);
                            }
                            before.as_ref().map(|r| TxnTransition::Complete {
                                transactional_id: id.clone(),
                                producer_id: r.producer_id,
                                txn_seq: r.txn_seq,
                            })
                        }
                        TxnPlan::Endings => {
                            let r = real.txn_endings(10).await;
                            let m = model.txn_endings(10).await;
                            assert_same(step, op, "txn_endings", r, m);
                            None
                        }
                    };
                    let Some(t) = transition else { continue };
                    let finishing = matches!(t, TxnTransition::Complete { .. })
                        && before.as_ref().is_some_and(|r| r.status.is_prepared());
                    let r = real.txn_transition(t.clone()).await;
                    let m = model.txn_transition(t).await;
                    let changed =
                        matches!(&m, Ok(a) if a.error == ErrorCode::None && a.record != before);
                    if assert_same(step, op, "txn_transition", r, m).is_some() && changed {
                        self.stats.txn_records_changed += 1;
                        self.stats.txn_records_finished += u64::from(finishing);
                    }
                }
            }
            Op::AllocateProducerIds { count } => {
                // Blocks are compared by size and disjointness, not by number: the contract leaves
                // where a block starts to the implementation.
                let r = real.allocate_producer_ids(*count).await;
                let m = model.allocate_producer_ids(*count).await;
                match (r, m) {
                    (Ok(block), Ok(_)) => {
                        self.blocks.push((*count, block));
                        super::conformance::assert_disjoint_blocks(&self.blocks);
                    }
                    (r, m) => {
                        assert_same(
                            step,
                            op,
                            "allocate_producer_ids",
                            r.map(|_| ()),
                            m.map(|_| ()),
                        );
                        self.stats.failed_calls += 1;
                    }
                }
            }
            Op::ListOffsets {
                slot,
                partition,
                relative,
                special,
                read_committed,
            } => {
                let timestamp = relative.map_or(*special, |d| self.harness.clock.now_ms() + d);
                let req = [ListOffsetsRequest {
                    partition: TopicIdPartition::new(slot_topic_id(*slot), *partition),
                    timestamp,
                    isolation: isolation(*read_committed),
                }];
                let r = real.list_offsets(&req).await;
                let m = model.list_offsets(&req).await;
                assert_same(step, op, "list_offsets", r, m);
            }
            Op::WriteMarkers {
                producer_id,
                partitions,
                commit,
                epoch,
                coordinator_epoch_delta,
                seq,
            } => {
                let current = self.txn_seq.get(producer_id).copied().unwrap_or(1);
                let txn_seq = match seq {
                    MarkerSeqChoice::Current => Some(current),
                    MarkerSeqChoice::Previous => Some(current - 1),
                    MarkerSeqChoice::Operator => None,
                };
                let coordinator_epoch = self.coordinator_epoch + coordinator_epoch_delta;
                let mut markers = Vec::with_capacity(partitions.len());
                for (slot, partition) in partitions {
                    let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                    let state = model.producer_state(p, *producer_id).await.ok().flatten();
                    let cur_epoch = state.map_or(2, |s| s.producer_epoch);
                    let producer_epoch = match epoch {
                        EpochChoice::Bump => cur_epoch.saturating_add(1),
                        EpochChoice::Older => cur_epoch.saturating_sub(1).max(0),
                        EpochChoice::Same | EpochChoice::Invalid => cur_epoch,
                    };
                    markers.push(TxnMarker {
                        partition: p,
                        producer_id: *producer_id,
                        producer_epoch,
                        coordinator_epoch,
                        commit: *commit,
                        txn_seq,
                    });
                }
                let r = real.write_txn_markers(&markers).await;
                let m = model.write_txn_markers(&markers).await;
                if let Some(results) = assert_same(step, op, "write_txn_markers", r, m) {
                    for r in results {
                        let s = &mut self.stats;
                        match r.error {
                            ErrorCode::None if r.duplicate => s.markers_repeated += 1,
                            ErrorCode::None => s.markers_written += 1,
                            ErrorCode::InvalidProducerEpoch
                            | ErrorCode::TransactionCoordinatorFenced => s.markers_refused += 1,
                            _ => {}
                        }
                    }
                }
                if *coordinator_epoch_delta > 0 {
                    self.coordinator_epoch = coordinator_epoch;
                }
                if *seq == MarkerSeqChoice::Current {
                    self.txn_seq.insert(*producer_id, current + 1);
                }
            }
            Op::Consolidate {
                slot,
                partition,
                max_batches,
                min_age_ms,
            } => {
                let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                if let Some(plan) = self.plan(step, op, p, *max_batches, *min_age_ms).await
                    && !plan.batches.is_empty()
                {
                    let req = self.segment_request(p, &plan);
                    self.register(step, op, req).await;
                }
            }
            Op::RegisterStale {
                slot,
                partition,
                delete_records,
            } => {
                let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                if let Some(plan) = self.plan(step, op, p, 2, 0).await
                    && let Some(first) = plan.batches.first()
                {
                    if *delete_records {
                        let req = [DeleteRecordsRequest {
                            partition: p,
                            offset: first.base_offset + 1,
                        }];
                        let r = self.real.delete_records(&req).await;
                        let m = self.model.delete_records(&req).await;
                        assert_same(step, op, "delete_records", r, m);
                    } else {
                        let earlier = self.segment_request(p, &plan);
                        self.register(step, op, earlier).await;
                    }
                    let req = self.segment_request(p, &plan);
                    self.register(step, op, req).await;
                }
            }
            Op::RegisterTwice => {
                if let Some(req) = self.last_segment.clone() {
                    self.register(step, op, req).await;
                }
            }
            Op::ListTiered { slot, partition } => {
                let p = TopicIdPartition::new(slot_topic_id(*slot), *partition);
                let r = real.list_tiered_segments(p, 0, u32::MAX).await;
                let m = model.list_tiered_segments(p, 0, u32::MAX).await;
                assert_same(step, op, "list_tiered_segments", r, m);
                let from = self.resolve_offset(p, OffsetChoice::Fraction(50)).await;
                let r = real.list_tiered_segments(p, from, 1).await;
                let m = model.list_tiered_segments(p, from, 1).await;
                assert_same(step, op, "list_tiered_segments from half-way", r, m);
            }
            Op::TieringCandidates { limit } => {
                let now = self.harness.clock.now_ms();
                let r = real.tiering_candidates(now, 0, None, *limit).await;
                let m = model.tiering_candidates(now, 0, None, *limit).await;
                if let Some(page) = assert_same(step, op, "tiering_candidates", r, m) {
                    self.stats.tiering_candidates += page.len() as u64;
                    if let Some(last) = page.last() {
                        let after = Some(last.partition);
                        let r = real.tiering_candidates(now, 0, after, *limit).await;
                        let m = model.tiering_candidates(now, 0, after, *limit).await;
                        if let Some(next) = assert_same(step, op, "tiering_candidates after", r, m)
                        {
                            self.stats.tiering_candidates += next.len() as u64;
                        }
                    }
                }
            }
        }
    }

    /// Compares everything observable.
    async fn compare_state(&self, step: usize, op: &Op) {
        let (real, model) = (self.real, &self.model);
        for tid in 0..2 {
            let id = format!("tx{tid}");
            assert_same(
                step,
                op,
                "describe_txn",
                real.describe_txn(&id).await,
                model.describe_txn(&id).await,
            );
        }
        assert_same(
            step,
            op,
            "list_topics",
            real.list_topics().await,
            model.list_topics().await,
        );
        let mut list_reqs = Vec::new();
        for slot in 0..TOPIC_SLOTS {
            for partition in 0..=PARTITIONS {
                let p = TopicIdPartition::new(slot_topic_id(slot), partition);
                let (lso, _) = self.bounds(p).await;
                let find = [FindBatchesRequest {
                    partition: p,
                    offset: lso,
                    max_bytes: u32::MAX,
                    isolation: Default::default(),
                }];
                assert_same(
                    step,
                    op,
                    &format!("state: batches of {p}"),
                    real.find_batches(&find, u32::MAX).await,
                    model.find_batches(&find, u32::MAX).await,
                );
                let committed = [FindBatchesRequest {
                    isolation: IsolationLevel::ReadCommitted,
                    ..find[0].clone()
                }];
                if let Some(answer) = assert_same(
                    step,
                    op,
                    &format!("state: committed batches of {p}"),
                    real.find_batches(&committed, u32::MAX).await,
                    model.find_batches(&committed, u32::MAX).await,
                ) {
                    let seen: usize = answer
                        .iter()
                        .map(|a| a.aborted.as_ref().map_or(0, Vec::len))
                        .sum();
                    self.aborted_seen.set(self.aborted_seen.get() + seen as u64);
                }
                for timestamp in [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP] {
                    for isolation in [
                        IsolationLevel::ReadUncommitted,
                        IsolationLevel::ReadCommitted,
                    ] {
                        list_reqs.push(ListOffsetsRequest {
                            partition: p,
                            timestamp,
                            isolation,
                        });
                    }
                }
                assert_same(
                    step,
                    op,
                    &format!("state: tiered segments of {p}"),
                    real.list_tiered_segments(p, 0, u32::MAX).await,
                    model.list_tiered_segments(p, 0, u32::MAX).await,
                );
                assert_same(
                    step,
                    op,
                    &format!("state: producers of {p}"),
                    real.list_producers(p).await,
                    model.list_producers(p).await,
                );
                for producer_id in 0..PRODUCERS {
                    assert_same(
                        step,
                        op,
                        &format!("state: producer {producer_id} of {p}"),
                        real.producer_state(p, producer_id).await,
                        model.producer_state(p, producer_id).await,
                    );
                }
            }
        }
        assert_same(
            step,
            op,
            "state: list_offsets",
            real.list_offsets(&list_reqs).await,
            model.list_offsets(&list_reqs).await,
        );
        for key in &self.keys {
            assert_same(
                step,
                op,
                &format!("state: object {key}"),
                real.object_info(key).await,
                model.object_info(key).await,
            );
        }
        assert_same(
            step,
            op,
            "state: known_objects",
            real.known_objects(&[self.keys.clone(), self.fenced.clone()].concat())
                .await,
            model
                .known_objects(&[self.keys.clone(), self.fenced.clone()].concat())
                .await,
        );
        assert_same(
            step,
            op,
            "state: objects_to_delete",
            real.objects_to_delete(i64::MAX, u32::MAX).await,
            model.objects_to_delete(i64::MAX, u32::MAX).await,
        );
    }
}

/// Applies `ops` to the harness's coordinator and to a fresh [`InMemoryCoordinator`] sharing its
/// clock, asserting after every op that both gave equal results and show equal state. Panics on the
/// first difference (so proptest can shrink the sequence). Returns what the run exercised.
pub async fn check_against_model(harness: Harness, ops: &[Op]) -> OpStats {
    let model = InMemoryCoordinator::new(harness.clock.clone());
    let mut driver = Driver {
        real: harness.coordinator.as_ref(),
        model,
        harness: &harness,
        keys: Vec::new(),
        fenced: Vec::new(),
        key_counter: 0,
        stats: OpStats::default(),
        sent: HashMap::new(),
        blocks: Vec::new(),
        txn_seq: HashMap::new(),
        coordinator_epoch: 0,
        aborted_seen: std::cell::Cell::new(0),
        last_segment: None,
    };
    for (step, op) in ops.iter().enumerate() {
        driver.apply(step, op).await;
        driver.compare_state(step, op).await;
    }
    driver.stats.aborted_reported = driver.aborted_seen.get();
    driver.stats
}
