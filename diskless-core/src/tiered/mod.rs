//! Tiered segments (issue #15, KIP-1163 "Moving to Tiered Storage"): the WAL batches of a partition
//! consolidated into one immutable object holding Kafka's segment files, byte for byte.
//!
//! - [`format`](mod@format) — the sections of a segment object (`.log`, `.index`, `.timeindex`, `.txnindex`,
//!   producer `.snapshot`, leader-epoch checkpoint) and its trailer, their parsers and Kafka's
//!   lookups; [`SegmentIndexer`] is `LogSegment.recover`'s index state machine.
//! - [`builder`] — [`TieredSegmentBuilder`]: stored WAL batches and their coordinates in, a
//!   [`BuiltSegment`] out, rolling where Kafka rolls (`segment.bytes`, a full index, an offset
//!   too far from the base).
//!
//! The design, with the Kafka sources each rule comes from, is `docs/tiered-consolidation.md`.

pub mod builder;
pub mod format;

pub use builder::{
    BuiltBatch, BuiltSegment, FinishInputs, PushOutcome, RollReason, TIERED_LEADER_EPOCH,
    TieredBuildError, TieredSegmentBuilder, TieredSegmentConfig,
};
pub use format::{
    AbortedTxnEntry, EpochEntry, FormatError, OffsetIndex, OffsetPosition, ProducerSnapshotEntry,
    Section, SegmentIndexer, SegmentLayout, SegmentObject, SegmentTrailer, TimeIndex,
    TimestampOffset,
};
