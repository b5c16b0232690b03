//! Kafka RecordBatch v2 and WAL segment formats for diskless topics: parsing, validation with
//! Kafka's error codes, fetch-path rewrites and the KIP-1163 segment object format.
//!
//! - [`RecordBatch`] — a zero-copy view of one v2 batch; [`split_batches`] splits a Produce request's
//!   records into batches.
//! - [`validate_batch`] / [`Validator`] — every check Kafka applies to what a producer sends, returning a
//!   [`ValidatedBatch`] with what the commit needs, or a [`ValidationError`] with the Kafka error code.
//! - [`validate_produce_records`] — Kafka's checks of one partition's records in a Produce request:
//!   exactly one batch, then [`validate_batch`].
//! - [`rewrite_batch`] — inject the assigned offset, partition leader epoch and LogAppendTime without
//!   copying the records.
//! - [`SegmentBuilder`] / [`SegmentReader`] — the WAL segment object.
//! - [`RecordBatchBuilder`] — build batches for tests, demos and benchmarks.
//! - [`tiered`] — tiered segment objects (Kafka's segment, index and snapshot files) and their builder.
//!
//! And the façade a host broker calls: [`WalWriter`] (the produce path, made by
//! [`WalWriter::builder`]) and [`Fetcher`] (the consume path; [`Fetcher::fetch_wait`] long-polls,
//! woken by the writers' [`CommitSignal`]). Their settings are rejected, never clamped, with a
//! [`ConfigError`].
//!
//! ```
//! use diskless_core::{validate_batch, RecordBatchBuilder, SegmentBuilder, SegmentReader};
//! use diskless_coordinator::{TopicConfig, TopicIdPartition};
//!
//! let now = 1_700_000_000_000;
//! let batch = RecordBatchBuilder::new().record(now, Some(b"k"), Some(b"v")).build().unwrap();
//! let validated = validate_batch(&batch, &TopicConfig::default(), now).unwrap();
//!
//! let partition = TopicIdPartition::new(uuid::Uuid::from_u128(1), 0);
//! let mut segment = SegmentBuilder::new();
//! segment.add(partition, batch.clone());
//! let segment = segment.finish();
//! let loc = &segment.batches[0];
//! let commit = validated.commit_batch(partition, loc.byte_offset);
//! assert_eq!(commit.byte_size, loc.byte_size);
//!
//! let reader = SegmentReader::new(segment.to_bytes()).unwrap();
//! assert_eq!(reader.read_batch(loc.byte_offset, loc.byte_size).unwrap(), batch);
//! ```

#![forbid(unsafe_code)]

pub mod batch;
pub mod builder;
mod commit_signal;
pub mod compaction;
pub mod compression;
mod config_error;
#[cfg(feature = "connection")]
#[cfg_attr(docsrs, doc(cfg(feature = "connection")))]
pub mod connection;
pub mod control;
pub mod fetcher;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod lifecycle;
pub mod node;
pub mod offsets;
pub mod produce_request;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod prometheus;
pub mod records;
pub mod rewrite;
pub mod segment;
pub mod tiered;
pub mod validate;
pub mod writer;

pub use batch::{
    Attributes, BatchError, Compression, HEADER_LEN, RecordBatch, increment_sequence, split_batches,
};
pub use builder::{NewRecord, RecordBatchBuilder};
pub use commit_signal::CommitSignal;
pub use compression::CompressionError;
pub use config_error::ConfigError;
pub use fetcher::{
    DEFAULT_CACHE_BLOCK_SIZE, DEFAULT_LONG_POLL_INTERVAL, DEFAULT_MAX_WAIT_LIMIT, FetchError,
    FetchPartition, FetchedPartition, Fetcher, FetcherBuilder, FetcherConfig,
};
pub use node::{DisklessNode, DisklessNodeBuilder, NodeConfig, NodeLifecycleConfig};
pub use offsets::{
    EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP, ListOffsetsPartition, ListedOffset,
    list_offsets_min_version,
};
pub use records::{Record, RecordError, RecordErrorKind, RecordIter};
pub use rewrite::{
    BatchRewrite, RewrittenBatch, StoredCrcMismatch, rewrite_batch, rewrite_batch_verified,
};
pub use segment::{
    SEGMENT_HEADER_LEN, SEGMENT_VERSION, Segment, SegmentBatch, SegmentBuilder, SegmentError,
    SegmentReader,
};
pub use validate::{
    ValidatedBatch, ValidationError, ValidationErrorKind, ValidationOptions, Validator,
    default_decompression_limit, validate_batch, validate_produce_records, verify_stored_batch,
};
pub use writer::{
    Backpressure, DEFAULT_EARLY_SEAL_BYTES, DEFAULT_MIN_SEAL_INTERVAL, DEFAULT_UPLOAD_MULTIPLE_PCT,
    PartitionResponse, PendingProduce, ProducePartition, ProduceRecordError, SealPolicy, WalWriter,
    WalWriterBuilder, WalWriterConfig, WriterStats,
};

/// The README's embedding snippet, compiled with the crate's doc tests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
