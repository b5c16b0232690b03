//! The batch coordinator of diskless topics (KIP-1164).
//!
//! The coordinator is the source of truth of a diskless topic. Brokers upload WAL segments to object
//! storage on their own, then commit the coordinates of the batches in them here; the coordinator puts
//! the batches of each partition in one global order, assigns their offsets (and LogAppendTime),
//! enforces the idempotent-producer rules, answers offset queries and tracks the life of every object.
//!
//! [`BatchCoordinator`] is the trait; this crate implements it on SQLite ([`sqlite`], the embedded
//! default) and PostgreSQL (feature `postgres`). `diskless-testkit` holds an in-memory reference model
//! and the conformance suite that every implementation runs.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod backend;
mod config;
mod deadline;
mod error;
mod error_code;
mod kafka_config;
mod layer;
mod open;
mod ops;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
mod rules;
pub mod txn_record;
mod types;
mod validate;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub mod sharded;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use deadline::{
    DEFAULT_MAX_COMMIT_AGE, FENCE_EXPIRY_BATCH, FENCE_RETENTION_FACTOR,
    PRODUCER_STATE_FLOOR_FACTOR, check_commit_deadline, fence_expiry_before, max_age_ms,
    object_key_time_ms, producer_expired, producer_state_floor_ms,
};
pub use diskless_common::{BoxError, Clock, ManualClock, SystemClock};
pub use error::CoordinatorError;
pub use error_code::ErrorCode;
pub use kafka_config::TOPIC_CONFIG_NAMES;
pub use layer::{
    Capabilities, Capability, CoordinatorLayer, CoordinatorMetrics, CoordinatorOp, Layered,
    MeteredCoordinator,
};
pub use open::{
    MemoryFactory, OpenError, OpenOptions, OpenedCoordinator, SHARD_MAP_FILE, SQLITE_FILE,
    open_coordinator,
};
pub use txn_record::{
    MAX_TRANSACTIONAL_ID_LEN, TxnAnswer, TxnRecord, TxnStatus, TxnTransition, apply_txn_transition,
    expire_txn,
};
pub use types::{
    AbortedTxn, BatchCoordinate, CleanupPolicy, CommitBatch, CommitBatchResult, CommitFileRequest,
    CreateTopicRequest, DEFAULT_GZIP_LEVEL, DEFAULT_LZ4_LEVEL, DEFAULT_ZSTD_LEVEL,
    DeleteRecordsRequest, DeleteRecordsResponse, DescribedProducer, EARLIEST_TIMESTAMP,
    EndTxnMarker, FindBatchesRequest, FindBatchesResponse, IsolationLevel, LATEST_TIMESTAMP,
    ListOffsetsRequest, ListOffsetsResponse, MAX_PRODUCER_ID_BLOCK, MAX_TIMESTAMP,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, ObjectInfo, ObjectKind,
    ObjectToDelete, PRODUCER_BATCH_WINDOW, ProducerBatch, ProducerExpiryReport, ProducerIdBlock,
    ProducerState, RegisterSegmentOutcome, RegisterSegmentRequest, ReplaceSegmentsRequest,
    ReplacedSegment, RetentionReport, SEGMENT_TRAILER_LEN, SegmentLayoutSizes, SegmentPlan,
    SegmentPlanRequest, ShardId, TXN_MARKER_SIZE, TieredSegment, TieringCandidate, TimestampType,
    TopicCompression, TopicConfig, TopicIdPartition, TopicInfo, TxnMarker, TxnMarkerResult,
};
pub use validate::{
    check_new_partition_count, is_valid_topic_name, last_sequence, next_producer_id_block,
    producer_field_error, validate_producer_id_count,
};

use async_trait::async_trait;

/// Defines [`BatchCoordinator`] from the table of operations ([`ops`]).
macro_rules! define_batch_coordinator {
    (
        {}
        required $rcap:ident {
            $(
                $(#[$rmeta:meta])*
                [$ROp:ident $rkind:ident $rbackend:ident]
                fn $rname:ident($($rarg:ident: $rty:ty),*) -> $rret:ty;
            )*
        }
        $(
            optional $cap:ident {
                $(
                    $(#[$meta:meta])*
                    [$Op:ident $kind:ident $backend:ident]
                    fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;
                )*
            }
        )*
    ) => {
        /// The batch coordinator (KIP-1164): orders batches, assigns offsets, tracks objects.
        ///
        /// All methods are atomic: a call either takes effect as a whole or not at all (or, for
        /// [`CoordinatorError::OutcomeUnknown`], the caller cannot tell which). Per-partition and
        /// per-batch outcomes are [`ErrorCode`]s in the responses, in the order of the request.
        ///
        /// # Capabilities
        ///
        /// The operations come in groups ([`Capability`]): the **log** (topics, `commit_file`,
        /// `find_batches`, `list_offsets`, `producer_state`) is required; **admin**
        /// (DeleteRecords, CreatePartitions, configs, producer-id blocks, DescribeProducers),
        /// **lifecycle** (retention, object deletion and queries, orphan fences, producer
        /// expiry), **transactions** (markers) and **tiering** (consolidated segments) are
        /// optional: their methods default to [`CoordinatorError::Unsupported`], and
        /// [`BatchCoordinator::capabilities`] says which groups an implementation serves (the
        /// conformance suite runs exactly those cases whose needs it serves). The smallest
        /// correct coordinator writes the seven log methods and `capabilities`; hosts still hold
        /// one `Arc<dyn BatchCoordinator>`.
        #[async_trait]
        pub trait BatchCoordinator: Send + Sync + std::fmt::Debug {
            /// The groups of operations this coordinator serves; always includes
            /// [`Capability::Log`]. An operation of a group not listed answers
            /// [`CoordinatorError::Unsupported`].
            fn capabilities(&self) -> Capabilities;

            $(
                $(#[$rmeta])*
                async fn $rname(&self, $($rarg: $rty),*) -> $rret;
            )*

            $($(
                $(#[$meta])*
                ///
                #[doc = concat!(
                    "Optional (capability `", stringify!($cap), "`): by default answers ",
                    "[`CoordinatorError::Unsupported`]."
                )]
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    let _ = ($($arg,)*);
                    Err(CoordinatorError::Unsupported(CoordinatorOp::$Op))
                }
            )*)*
        }
    };
}

ops::coordinator_ops!(define_batch_coordinator {});
