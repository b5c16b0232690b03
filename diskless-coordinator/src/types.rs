//! The data model of diskless topics: partitions, topic configuration, batch coordinates, and the
//! requests and responses of [`crate::BatchCoordinator`].

use crate::ErrorCode;
use uuid::Uuid;

/// Offset query for the earliest offset (ListOffsets `-2`).
pub const EARLIEST_TIMESTAMP: i64 = -2;
/// Offset query for the latest offset, the high watermark (ListOffsets `-1`).
pub const LATEST_TIMESTAMP: i64 = -1;
/// Offset query for the batch with the largest timestamp (ListOffsets `-3`, KIP-734).
pub const MAX_TIMESTAMP: i64 = -3;
/// "No timestamp" / "no producer" marker, as in Kafka.
pub const NO_TIMESTAMP: i64 = -1;
/// Producer id of a non-idempotent producer.
pub const NO_PRODUCER_ID: i64 = -1;
/// Producer epoch of a non-idempotent producer.
pub const NO_PRODUCER_EPOCH: i16 = -1;
/// Sequence number of a non-idempotent producer.
pub const NO_SEQUENCE: i32 = -1;
/// The size of a transaction marker's control batch (a 61-byte header and one 17-byte record),
/// which a marker coordinate counts as its `byte_size`.
pub const TXN_MARKER_SIZE: u32 = 78;
/// How many batches per (partition, producer id) Kafka keeps for duplicate detection.
pub const PRODUCER_BATCH_WINDOW: usize = 5;

/// The identity of a coordinator shard (KIP-1164: the coordinator is sharded, each partition belongs to
/// one shard). A single-shard deployment uses shard 0.
pub type ShardId = u32;

/// A partition of a diskless topic, named by the topic's id (Kafka's `TopicIdPartition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicIdPartition {
    /// The topic id (a UUID, as in Kafka's metadata).
    pub topic_id: Uuid,
    /// The partition index, `0..partition_count`.
    pub partition: i32,
}

impl TopicIdPartition {
    /// A partition of a topic.
    pub fn new(topic_id: Uuid, partition: i32) -> Self {
        TopicIdPartition {
            topic_id,
            partition,
        }
    }
}

impl std::fmt::Display for TopicIdPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic_id, self.partition)
    }
}

/// Which timestamp a topic keeps (`message.timestamp.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TimestampType {
    /// The producer's timestamps are kept (`CreateTime`, the default).
    #[default]
    CreateTime,
    /// The coordinator's commit time replaces them (`LogAppendTime`).
    LogAppendTime,
}

impl TimestampType {
    /// The attribute bit 3 value Kafka uses for this type in a record batch.
    pub fn is_log_append_time(self) -> bool {
        self == TimestampType::LogAppendTime
    }
}

/// Which records a read may see (Kafka's `IsolationLevel`, KIP-98).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IsolationLevel {
    /// Everything up to the high watermark, records of open and aborted transactions included
    /// (`read_uncommitted`, Kafka's default; wire value 0).
    #[default]
    ReadUncommitted,
    /// Only up to the last stable offset: nothing of a transaction that is still open; aborted
    /// transactions are reported so the client can skip them (`read_committed`; wire value 1).
    ReadCommitted,
}

impl IsolationLevel {
    /// The level for a Kafka wire value (`0` or `1`), if it is one.
    pub fn from_kafka(value: i8) -> Option<IsolationLevel> {
        match value {
            0 => Some(IsolationLevel::ReadUncommitted),
            1 => Some(IsolationLevel::ReadCommitted),
            _ => None,
        }
    }

    /// The Kafka wire value.
    pub fn to_kafka(self) -> i8 {
        match self {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        }
    }
}

/// What a transaction marker (a COMMIT or ABORT control batch, KIP-98) says. A marker has no bytes
/// in object storage: the fetch path builds its 78-byte control batch from the coordinate
/// (`diskless_core::control::end_txn_marker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndTxnMarker {
    /// `true` for COMMIT, `false` for ABORT.
    pub commit: bool,
    /// The epoch of the transaction coordinator that wrote it (Kafka's `coordinatorEpoch`).
    pub coordinator_epoch: i32,
}

/// An aborted transaction of one partition, as a `read_committed` fetch reports it (Kafka's
/// `AbortedTxn`): the producer's records in `first_offset..=last_offset` are to be skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AbortedTxn {
    /// The producer id of the aborted transaction.
    pub producer_id: i64,
    /// The offset of the transaction's first batch in the partition.
    pub first_offset: i64,
    /// The offset of its ABORT marker.
    pub last_offset: i64,
}

/// One transaction marker to write (Kafka's WriteTxnMarkers, one partition of one marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxnMarker {
    /// The partition the marker is written to.
    pub partition: TopicIdPartition,
    /// The producer whose transaction it ends.
    pub producer_id: i64,
    /// The producer epoch the marker carries (for a fencing abort, the bumped epoch).
    pub producer_epoch: i16,
    /// The transaction coordinator's epoch; a marker with an older one than the partition saw is
    /// refused with [`ErrorCode::TransactionCoordinatorFenced`].
    pub coordinator_epoch: i32,
    /// `true` for COMMIT, `false` for ABORT.
    pub commit: bool,
    /// The transaction being ended, numbered as [`CommitBatch::txn_seq`]: markers with a number are
    /// idempotent (a second marker of the same or an older transaction answers the first one's
    /// offset). `None` for an operator's abort (Kafka's `Admin.abortTransaction`): never
    /// deduplicated.
    pub txn_seq: Option<i64>,
}

/// The outcome of one [`TxnMarker`], in the same position as the marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxnMarkerResult {
    /// [`ErrorCode::None`] when the marker was written (or was a duplicate), else why not.
    pub error: ErrorCode,
    /// The marker's offset (the first marker's for a duplicate); `-1` on error.
    pub offset: i64,
    /// Whether the marker repeated one already written for the same transaction.
    pub duplicate: bool,
}

impl TxnMarkerResult {
    /// A refused marker.
    pub fn error(error: ErrorCode) -> Self {
        TxnMarkerResult {
            error,
            offset: -1,
            duplicate: false,
        }
    }
}

/// Per-topic configuration that the diskless write and read paths need. Defaults are Kafka 4's:
/// `TopicConfig::default()` then a `with_*` setter per field to change; checked by
/// [`TopicConfig::validate`] when a topic is created.
///
/// Unlike the coordinators' settings this struct is exhaustive on purpose: it is part of
/// [`CreateTopicRequest`] and [`TopicInfo`], which third-party coordinators construct.
#[derive(Clone, Debug, PartialEq)]
pub struct TopicConfig {
    /// `message.timestamp.type`.
    pub timestamp_type: TimestampType,
    /// `retention.ms`; `-1` keeps batches forever. Default 7 days.
    pub retention_ms: i64,
    /// `retention.bytes` per partition; `-1` means no size limit (the default).
    pub retention_bytes: i64,
    /// `max.message.bytes`: the largest batch accepted. Default 1048588.
    pub max_message_bytes: i32,
    /// `message.timestamp.before.max.ms`: how far in the past a CreateTime timestamp may be. Default
    /// unlimited.
    pub message_timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`: how far in the future a CreateTime timestamp may be. Default
    /// one hour (Kafka 4.0).
    pub message_timestamp_after_max_ms: i64,
    /// `producer.id.expiration.ms`: how long after its last appended batch a producer's idempotence
    /// state in a partition is kept (see [`crate::BatchCoordinator::expire_producers`]). Kafka has it
    /// as a broker setting; a host passes its broker value here when it creates a topic. At least 1.
    /// Default one day. A value below twice the coordinator's `max_commit_age` is accepted (and
    /// answered back as set) but acts as that floor ([`crate::producer_expired`]): a state is never
    /// forgotten while a late commit it guards could still land.
    pub producer_id_expiration_ms: i64,
    /// `segment.bytes`: the largest `.log` of a tiered segment; a partition whose WAL batches
    /// reach it is due for consolidation. At least 14 (Kafka's bound), at most `i32::MAX`.
    /// Default 1 GiB.
    pub segment_bytes: i32,
    /// `segment.ms`: a partition whose oldest WAL batch was committed this long ago (coordinator
    /// clock; Kafka rolls by the first batch's producer timestamp) is due for consolidation. At
    /// least 1. Default 7 days.
    pub segment_ms: i64,
    /// `index.interval.bytes`: the `.log` bytes between two offset-index entries of a tiered
    /// segment. At least 0. Default 4096.
    pub index_interval_bytes: i32,
    /// `segment.index.bytes`: the largest offset index of a tiered segment (which bounds its
    /// batch count). At least 4 (Kafka's bound); below 24 a segment holds one batch. Default
    /// 10 MiB.
    pub segment_index_bytes: i32,
    /// `compression.type`: the codec a batch is stored with. [`TopicCompression::Producer`] (the
    /// default) keeps the producer's; any other value re-encodes a batch whose codec differs, as
    /// Kafka's `LogValidator` does.
    pub compression_type: TopicCompression,
    /// `compression.gzip.level` (KIP-390): 1..=9, or -1 for the codec's default (6). Default -1.
    pub compression_gzip_level: i32,
    /// `compression.lz4.level` (KIP-390): 1..=17. Default 9.
    pub compression_lz4_level: i32,
    /// `compression.zstd.level` (KIP-390): -131072..=22. Default 3.
    pub compression_zstd_level: i32,
    /// `cleanup.policy`: whether retention deletes old data, compaction keeps the latest record
    /// of each key, or both. Default [`CleanupPolicy::Delete`].
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone (a record with a null value) and a
    /// transaction marker of a compacted topic stay readable after the first compaction that
    /// saw them (KIP-534's delete horizon). At least 0. Default one day.
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms`: a record of a compacted topic is not compacted away before it is
    /// this old. At least 0. Default 0.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a record of a compacted topic becomes eligible for compaction at
    /// most this long after it was written, whatever the dirty ratio (it also caps `segment.ms`
    /// for such a topic, as Kafka's `LogConfig.maxSegmentMs`). At least 1. Default
    /// `i64::MAX`.
    pub max_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`: the share of a compacted partition's bytes not yet compacted
    /// at which it is compacted. 0.0..=1.0 (never NaN: [`TopicConfig::validate`] refuses it,
    /// which is what makes `Eq` hold). Default 0.5.
    pub min_cleanable_dirty_ratio: f64,
}

impl TopicConfig {
    /// How old a partition's oldest WAL batch may get before the partition is due for tiering:
    /// `segment.ms`, or for a compacted topic `min(segment.ms, max.compaction.lag.ms)` (Kafka's
    /// `LogConfig.maxSegmentMs`: compaction works on tiered segments, so a record must be tiered
    /// to be compacted within its maximum lag).
    ///
    /// ```
    /// use diskless_coordinator::{CleanupPolicy, TopicConfig};
    /// let c = TopicConfig::default().with_segment_ms(600_000).with_max_compaction_lag_ms(60_000);
    /// assert_eq!(c.max_segment_ms(), 600_000);
    /// assert_eq!(c.with_cleanup_policy(CleanupPolicy::Compact).max_segment_ms(), 60_000);
    /// ```
    pub fn max_segment_ms(&self) -> i64 {
        if self.cleanup_policy.compacts() {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        }
    }
}

// `min_cleanable_dirty_ratio` is a finite number in 0..=1 wherever a `TopicConfig` is checked or
// stored, so equality is reflexive.
impl Eq for TopicConfig {}

/// A topic's `cleanup.policy` (Kafka's list of `delete` and `compact`).
///
/// ```
/// use diskless_coordinator::CleanupPolicy;
/// assert_eq!(CleanupPolicy::from_name("compact"), Some(CleanupPolicy::Compact));
/// assert_eq!(CleanupPolicy::from_name("delete, compact"), Some(CleanupPolicy::CompactDelete));
/// assert_eq!(CleanupPolicy::CompactDelete.name(), "compact,delete");
/// assert!(CleanupPolicy::CompactDelete.compacts() && CleanupPolicy::CompactDelete.deletes());
/// assert_eq!(CleanupPolicy::from_name("shred"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CleanupPolicy {
    /// `delete`: retention (`retention.ms`, `retention.bytes`) deletes the oldest data.
    #[default]
    Delete,
    /// `compact`: compaction keeps each key's latest record; retention deletes nothing.
    Compact,
    /// `compact,delete`: both.
    CompactDelete,
}

impl CleanupPolicy {
    /// Every value.
    pub const ALL: [CleanupPolicy; 3] = [
        CleanupPolicy::Delete,
        CleanupPolicy::Compact,
        CleanupPolicy::CompactDelete,
    ];

    /// The value as Kafka's list text (`compact,delete` for both).
    pub fn name(self) -> &'static str {
        match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::CompactDelete => "compact,delete",
        }
    }

    /// The policy a `cleanup.policy` list denotes: comma-separated `compact` and `delete`
    /// (whitespace around an item ignored, an item may repeat, as Kafka's `ValidList`), or
    /// `None` for an empty list or any other item.
    pub fn from_name(list: &str) -> Option<CleanupPolicy> {
        let (mut compact, mut delete) = (false, false);
        for item in list.split(',').map(str::trim) {
            match item {
                "compact" => compact = true,
                "delete" => delete = true,
                _ => return None,
            }
        }
        match (compact, delete) {
            (true, true) => Some(CleanupPolicy::CompactDelete),
            (true, false) => Some(CleanupPolicy::Compact),
            (false, true) => Some(CleanupPolicy::Delete),
            (false, false) => None,
        }
    }

    /// Whether compaction runs.
    pub fn compacts(self) -> bool {
        self != CleanupPolicy::Delete
    }

    /// Whether retention deletes.
    pub fn deletes(self) -> bool {
        self != CleanupPolicy::Compact
    }
}

impl std::fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A topic's `compression.type` (Kafka's `BrokerCompressionType`), by its Kafka name.
///
/// ```
/// use diskless_coordinator::TopicCompression;
/// assert_eq!(TopicCompression::from_name("zstd"), Some(TopicCompression::Zstd));
/// assert_eq!(TopicCompression::default().name(), "producer");
/// assert_eq!(TopicCompression::from_name("brotli"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TopicCompression {
    /// `producer`: a batch keeps the codec its producer chose.
    #[default]
    Producer,
    /// `uncompressed`: batches are stored without compression.
    Uncompressed,
    /// `gzip`.
    Gzip,
    /// `snappy`.
    Snappy,
    /// `lz4`.
    Lz4,
    /// `zstd`.
    Zstd,
}

impl TopicCompression {
    /// Every value, in Kafka's order of `BrokerCompressionType.names()`.
    pub const ALL: [TopicCompression; 6] = [
        TopicCompression::Uncompressed,
        TopicCompression::Zstd,
        TopicCompression::Lz4,
        TopicCompression::Snappy,
        TopicCompression::Gzip,
        TopicCompression::Producer,
    ];

    /// Kafka's name of the value (`compression.type`'s text).
    pub fn name(self) -> &'static str {
        match self {
            TopicCompression::Producer => "producer",
            TopicCompression::Uncompressed => "uncompressed",
            TopicCompression::Gzip => "gzip",
            TopicCompression::Snappy => "snappy",
            TopicCompression::Lz4 => "lz4",
            TopicCompression::Zstd => "zstd",
        }
    }

    /// The value Kafka's name denotes (exact, lower case, as Kafka's `ConfigDef.ValidString`).
    pub fn from_name(name: &str) -> Option<TopicCompression> {
        TopicCompression::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl std::fmt::Display for TopicCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `compression.gzip.level`'s default: -1, the codec's own default (Java's
/// `Deflater.DEFAULT_COMPRESSION`, level 6).
pub const DEFAULT_GZIP_LEVEL: i32 = -1;
/// `compression.lz4.level`'s default: 9.
pub const DEFAULT_LZ4_LEVEL: i32 = 9;
/// `compression.zstd.level`'s default: 3.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            timestamp_type: TimestampType::CreateTime,
            retention_ms: 7 * 24 * 60 * 60 * 1000,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            message_timestamp_before_max_ms: i64::MAX,
            message_timestamp_after_max_ms: 60 * 60 * 1000,
            producer_id_expiration_ms: 24 * 60 * 60 * 1000,
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            index_interval_bytes: 4096,
            segment_index_bytes: 10 * 1024 * 1024,
            compression_type: TopicCompression::Producer,
            compression_gzip_level: DEFAULT_GZIP_LEVEL,
            compression_lz4_level: DEFAULT_LZ4_LEVEL,
            compression_zstd_level: DEFAULT_ZSTD_LEVEL,
            cleanup_policy: CleanupPolicy::Delete,
            delete_retention_ms: 24 * 60 * 60 * 1000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ratio: 0.5,
        }
    }
}

crate::config::with_setters!(TopicConfig {
    with_timestamp_type => timestamp_type: [TimestampType],
    with_retention_ms => retention_ms: [i64],
    with_retention_bytes => retention_bytes: [i64],
    with_max_message_bytes => max_message_bytes: [i32],
    with_message_timestamp_before_max_ms => message_timestamp_before_max_ms: [i64],
    with_message_timestamp_after_max_ms => message_timestamp_after_max_ms: [i64],
    with_producer_id_expiration_ms => producer_id_expiration_ms: [i64],
    with_segment_bytes => segment_bytes: [i32],
    with_segment_ms => segment_ms: [i64],
    with_index_interval_bytes => index_interval_bytes: [i32],
    with_segment_index_bytes => segment_index_bytes: [i32],
    with_compression_type => compression_type: [TopicCompression],
    with_compression_gzip_level => compression_gzip_level: [i32],
    with_compression_lz4_level => compression_lz4_level: [i32],
    with_compression_zstd_level => compression_zstd_level: [i32],
    with_cleanup_policy => cleanup_policy: [CleanupPolicy],
    with_delete_retention_ms => delete_retention_ms: [i64],
    with_min_compaction_lag_ms => min_compaction_lag_ms: [i64],
    with_max_compaction_lag_ms => max_compaction_lag_ms: [i64],
    with_min_cleanable_dirty_ratio => min_cleanable_dirty_ratio: [f64],
});

/// The most producer ids one [`crate::BatchCoordinator::allocate_producer_ids`] call hands out.
/// Kafka's controller hands out blocks of 1000 (KIP-730); a larger bound leaves room without letting
/// one call waste a noticeable part of the id space.
pub const MAX_PRODUCER_ID_BLOCK: u32 = 1 << 20;

/// A block of producer ids handed out by [`crate::BatchCoordinator::allocate_producer_ids`]:
/// `first ..= last()`, never handed out again (Kafka's `ProducerIdsBlock`, KIP-730).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProducerIdBlock {
    /// The first producer id of the block (`>= 0`).
    pub first: i64,
    /// How many ids the block holds (`>= 1`).
    pub count: u32,
}

impl ProducerIdBlock {
    /// The last producer id of the block.
    pub fn last(&self) -> i64 {
        self.first
            .saturating_add(i64::from(self.count))
            .saturating_sub(1)
    }

    /// Whether `producer_id` belongs to the block.
    pub fn contains(&self, producer_id: i64) -> bool {
        (self.first..=self.last()).contains(&producer_id)
    }

    /// Whether the block shares an id with `other`.
    pub fn overlaps(&self, other: &ProducerIdBlock) -> bool {
        self.first <= other.last() && other.first <= self.last()
    }
}

/// A request to create a diskless topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateTopicRequest {
    /// The topic id; it names the topic in every other call.
    pub topic_id: Uuid,
    /// The topic name (unique among live topics).
    pub name: String,
    /// The number of partitions, at least 1.
    pub partitions: i32,
    /// The topic configuration.
    pub config: TopicConfig,
}

/// What the coordinator knows of a live topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    /// The topic id.
    pub topic_id: Uuid,
    /// The topic name.
    pub name: String,
    /// The number of partitions.
    pub partitions: i32,
    /// The topic configuration.
    pub config: TopicConfig,
}

/// The coordinates of one batch in a WAL segment, as the uploading broker commits them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitBatch {
    /// The partition the batch is for.
    pub partition: TopicIdPartition,
    /// Where the batch starts in the object (after the 1-byte version header, so at least 1).
    pub byte_offset: u64,
    /// The batch's length in bytes (its whole RecordBatch, header included).
    pub byte_size: u32,
    /// The number of records (`lastOffsetDelta + 1`).
    pub record_count: i32,
    /// The batch's `baseTimestamp` as the producer sent it.
    pub base_timestamp: i64,
    /// The batch's largest record timestamp as validation found it (not the header's `maxTimestamp`,
    /// which a producer may set to anything; Kafka's validator overwrites the header with it).
    pub max_timestamp: i64,
    /// The timestamp type in the batch's attributes as the producer sent it.
    pub timestamp_type: TimestampType,
    /// `producerId`, or [`NO_PRODUCER_ID`].
    pub producer_id: i64,
    /// `producerEpoch`, or [`NO_PRODUCER_EPOCH`].
    pub producer_epoch: i16,
    /// `baseSequence`, or [`NO_SEQUENCE`].
    pub base_sequence: i32,
    /// The last sequence of the batch (with wrap-around at `i32::MAX`), or [`NO_SEQUENCE`].
    pub last_sequence: i32,
    /// Whether the batch belongs to a transaction (attribute bit 4). Requires a producer id.
    pub transactional: bool,
    /// For a transactional batch: the transaction that the host's transaction coordinator verified
    /// this partition to be part of (Kafka's `VerificationGuard`, KIP-890), a number that grows
    /// strictly per producer id across its transactions (for transaction version 2 the producer
    /// epoch, which is bumped per transaction, will do). `None` = not verified: the batch is then
    /// accepted only inside a transaction the producer already has open in the partition with the
    /// same epoch. A verified batch starts a transaction only if its number is above that of every
    /// transaction already ended in the partition, so a batch delayed past its transaction's marker
    /// can never open a transaction nobody will end. Ignored for other batches.
    pub txn_seq: Option<i64>,
}

impl CommitBatch {
    /// Whether the batch carries a producer id (`producerId >= 0`, Kafka's `hasProducerId`), so the
    /// idempotent-producer rules apply. A producer id below `-1` is treated as `-1`, as in Kafka.
    pub fn is_idempotent(&self) -> bool {
        self.producer_id >= 0
    }
}

/// A request to commit one uploaded WAL segment (KIP-1164 `CommitFile`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitFileRequest {
    /// The object key the segment was uploaded under.
    pub object_key: String,
    /// The broker that uploaded it.
    pub uploader_broker_id: i32,
    /// The object's size in bytes, version header included.
    pub object_size: u64,
    /// The coordinator shards that hold batches of this object, in responsibility order (the first is
    /// responsible for deleting it). A single-shard deployment passes `vec![0]`.
    pub owners: Vec<ShardId>,
    /// The batches, in the order the broker wants them appended. Batches of one partition keep this
    /// order.
    pub batches: Vec<CommitBatch>,
}

/// The outcome of one batch of a [`CommitFileRequest`], in the same position as the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitBatchResult {
    /// [`ErrorCode::None`] when the batch was appended (or was a duplicate), else why it was rejected.
    pub error: ErrorCode,
    /// The offset assigned to the batch's first record (the original one for a duplicate); `-1` on error.
    pub base_offset: i64,
    /// The commit time for LogAppendTime partitions, else [`NO_TIMESTAMP`].
    pub log_append_time: i64,
    /// The partition's log start offset after the commit; `-1` on error.
    pub log_start_offset: i64,
    /// Whether the batch was recognised as a duplicate of one already appended (and not appended again).
    pub duplicate: bool,
}

impl CommitBatchResult {
    /// A rejected batch.
    pub fn error(error: ErrorCode) -> Self {
        CommitBatchResult {
            error,
            base_offset: -1,
            log_append_time: NO_TIMESTAMP,
            log_start_offset: -1,
            duplicate: false,
        }
    }
}

/// One partition of a [`crate::BatchCoordinator::find_batches`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindBatchesRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The fetch offset.
    pub offset: i64,
    /// The partition's byte limit (at least one batch is returned whatever its size).
    pub max_bytes: u32,
    /// `ReadCommitted` stops at the last stable offset and reports aborted transactions.
    pub isolation: IsolationLevel,
}

/// Where one committed batch lives and what offsets it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchCoordinate {
    /// The object holding the batch.
    pub object_key: String,
    /// The size of that object.
    pub object_size: u64,
    /// Where the batch starts in the object.
    pub byte_offset: u64,
    /// The batch's length in bytes.
    pub byte_size: u32,
    /// The offset of the batch's first record.
    pub base_offset: i64,
    /// The offset of the batch's last record.
    pub last_offset: i64,
    /// The batch's `baseTimestamp` as produced.
    pub base_timestamp: i64,
    /// The batch's largest record timestamp (what the writer's validation found; Kafka's validator
    /// writes it into the header, and the fetch path serves it there for CreateTime batches).
    pub max_timestamp: i64,
    /// The partition's timestamp type when the batch was committed.
    pub timestamp_type: TimestampType,
    /// The commit time for LogAppendTime batches, else [`NO_TIMESTAMP`].
    pub log_append_time: i64,
    /// `producerId`.
    pub producer_id: i64,
    /// `producerEpoch`.
    pub producer_epoch: i16,
    /// `baseSequence`.
    pub base_sequence: i32,
    /// The last sequence.
    pub last_sequence: i32,
    /// `Some` for a transaction marker: a control batch with no bytes in storage (`object_key`
    /// empty, `object_size` and `byte_offset` 0, `byte_size` 78) that the fetch path builds.
    pub control: Option<EndTxnMarker>,
}

impl BatchCoordinate {
    /// The coordinate of `marker` written at `offset` at time `now` (coordinator clock) in a
    /// partition whose timestamp type is `timestamp_type`: no object, [`TXN_MARKER_SIZE`] bytes,
    /// `now` as its timestamps (Kafka stamps a marker with the leader's clock), no sequence.
    pub fn txn_marker(
        marker: &TxnMarker,
        offset: i64,
        now: i64,
        timestamp_type: TimestampType,
    ) -> BatchCoordinate {
        BatchCoordinate {
            object_key: String::new(),
            object_size: 0,
            byte_offset: 0,
            byte_size: TXN_MARKER_SIZE,
            base_offset: offset,
            last_offset: offset,
            base_timestamp: now,
            max_timestamp: now,
            timestamp_type,
            log_append_time: if timestamp_type.is_log_append_time() {
                now
            } else {
                NO_TIMESTAMP
            },
            producer_id: marker.producer_id,
            producer_epoch: marker.producer_epoch,
            base_sequence: NO_SEQUENCE,
            last_sequence: NO_SEQUENCE,
            control: Some(EndTxnMarker {
                commit: marker.commit,
                coordinator_epoch: marker.coordinator_epoch,
            }),
        }
    }

    /// Whether the coordinate is a transaction marker (see [`BatchCoordinate::control`]).
    pub fn is_control(&self) -> bool {
        self.control.is_some()
    }

    /// The number of records in the batch (saturating: a corrupt coordinate cannot overflow).
    pub fn record_count(&self) -> i64 {
        self.last_offset
            .saturating_sub(self.base_offset)
            .saturating_add(1)
    }

    /// The timestamp a reader sees as the batch's max timestamp: the log append time for LogAppendTime
    /// batches, else the producer's max timestamp.
    pub fn effective_max_timestamp(&self) -> i64 {
        match self.timestamp_type {
            TimestampType::LogAppendTime => self.log_append_time,
            TimestampType::CreateTime => self.max_timestamp,
        }
    }
}

/// The answer for one partition of a [`crate::BatchCoordinator::find_batches`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindBatchesResponse {
    /// [`ErrorCode::None`], [`ErrorCode::UnknownTopicOrPartition`] or [`ErrorCode::OffsetOutOfRange`].
    pub error: ErrorCode,
    /// The tiered segments to read first, in offset order: the one containing the fetch offset
    /// (counted whole against the byte limits) and those following it while the limits allow.
    /// Empty when the fetch offset is not tiered.
    pub segments: Vec<TieredSegment>,
    /// The WAL batches, in offset order: from the one containing the fetch offset, or, after
    /// segments that reach the first offset not tiered, from there on while the limits allow.
    pub batches: Vec<BatchCoordinate>,
    /// The partition's log start offset (`-1` on error).
    pub log_start_offset: i64,
    /// The partition's high watermark, the offset the next batch will get (`-1` on error).
    pub high_watermark: i64,
    /// The partition's last stable offset: the first offset of the earliest transaction still
    /// open (never below the log start), else the high watermark (`-1` on error).
    pub last_stable_offset: i64,
    /// For [`IsolationLevel::ReadCommitted`], the aborted transactions that overlap the returned
    /// batches (Kafka's `TransactionIndex.collectAbortedTxns` for `[offset, end of the last batch]`),
    /// by ABORT marker offset; `None` for [`IsolationLevel::ReadUncommitted`] and on error.
    pub aborted: Option<Vec<AbortedTxn>>,
}

impl FindBatchesResponse {
    /// The answer for a partition that could not be read (no batches, bounds `-1`).
    pub fn error(error: ErrorCode) -> Self {
        FindBatchesResponse {
            error,
            segments: Vec::new(),
            batches: Vec::new(),
            log_start_offset: -1,
            high_watermark: -1,
            last_stable_offset: -1,
            aborted: None,
        }
    }
}

/// One partition of a ListOffsets call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListOffsetsRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// A timestamp in ms, or [`EARLIEST_TIMESTAMP`], [`LATEST_TIMESTAMP`], [`MAX_TIMESTAMP`].
    pub timestamp: i64,
    /// `ReadCommitted` answers [`LATEST_TIMESTAMP`] with the last stable offset and finds nothing
    /// at or above it (Kafka's `lastFetchableOffset`).
    pub isolation: IsolationLevel,
}

/// The answer for one partition of a ListOffsets call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListOffsetsResponse {
    /// [`ErrorCode::None`] or [`ErrorCode::UnknownTopicOrPartition`].
    pub error: ErrorCode,
    /// The offset found, or `-1` when none.
    pub offset: i64,
    /// The timestamp of what was found, or [`NO_TIMESTAMP`].
    pub timestamp: i64,
}

impl ListOffsetsResponse {
    /// The answer for a partition that could not be looked up (offset `-1`, no timestamp).
    pub fn error(error: ErrorCode) -> Self {
        ListOffsetsResponse {
            error,
            offset: -1,
            timestamp: NO_TIMESTAMP,
        }
    }
}

/// One partition of a DeleteRecords call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteRecordsRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The new log start offset; `-1` means the high watermark.
    pub offset: i64,
}

/// The answer for one partition of a DeleteRecords call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteRecordsResponse {
    /// [`ErrorCode::None`], [`ErrorCode::UnknownTopicOrPartition`] or [`ErrorCode::OffsetOutOfRange`].
    pub error: ErrorCode,
    /// The log start offset afterwards (`-1` on error).
    pub low_watermark: i64,
}

impl DeleteRecordsResponse {
    /// The answer for a partition whose records could not be deleted (low watermark `-1`).
    pub fn error(error: ErrorCode) -> Self {
        DeleteRecordsResponse {
            error,
            low_watermark: -1,
        }
    }
}

/// What one retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// WAL batches logically deleted.
    pub batches_deleted: u64,
    /// Bytes of those batches and of the deleted segments' `.log` sections.
    pub bytes_deleted: u64,
    /// Tiered segments deleted (each counts as one item of the pass's budget).
    pub segments_deleted: u64,
    /// Whether the pass stopped because it spent its whole budget (`batches_deleted +
    /// segments_deleted == max_batches`, `max_batches > 0`): run another pass. The next pass may find nothing; a pass never looks
    /// further once its budget is spent, so that it holds its locks for bounded work.
    pub more: bool,
}

/// What one [`crate::BatchCoordinator::expire_producers`] call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerExpiryReport {
    /// (partition, producer id) states deleted.
    pub expired: u64,
    /// Whether the call stopped at its cap (`expired == max_producers`, `max_producers > 0`).
    pub more: bool,
}

/// An object the coordinator has marked for deletion (no live bytes left).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectToDelete {
    /// The object key.
    pub object_key: String,
    /// When it was marked (coordinator clock, ms).
    pub marked_for_deletion_at: i64,
    /// The object's size.
    pub object_size: u64,
    /// What the object holds.
    pub kind: ObjectKind,
}

/// What the coordinator knows of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object key.
    pub object_key: String,
    /// The broker that uploaded it.
    pub uploader_broker_id: i32,
    /// Its size.
    pub object_size: u64,
    /// Bytes of batches in it that are still live (not deleted and not rejected).
    pub live_bytes: u64,
    /// The owner list it was committed with.
    pub owners: Vec<ShardId>,
    /// Commit time (coordinator clock, ms).
    pub committed_at: i64,
    /// When it was marked for deletion, if it was.
    pub marked_for_deletion_at: Option<i64>,
    /// What the object holds.
    pub kind: ObjectKind,
}

/// What an object the coordinator tracks holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A WAL segment: batches of any partitions, committed by
    /// [`crate::BatchCoordinator::commit_file`].
    #[default]
    Wal,
    /// A tiered segment: one partition's consolidated batches as a Kafka log segment,
    /// registered by [`crate::BatchCoordinator::register_segment`].
    TieredSegment,
}

/// One of the batches kept per (partition, producer id) for duplicate detection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerBatch {
    /// The batch's first sequence.
    pub base_sequence: i32,
    /// The batch's last sequence.
    pub last_sequence: i32,
    /// The offset it was given.
    pub base_offset: i64,
    /// The offset of its last record.
    pub last_offset: i64,
    /// Its log append time, or [`NO_TIMESTAMP`] for CreateTime.
    pub log_append_time: i64,
}

/// The idempotent-producer state of one producer id in one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerState {
    /// The producer id.
    pub producer_id: i64,
    /// The latest epoch seen.
    pub producer_epoch: i16,
    /// The last [`PRODUCER_BATCH_WINDOW`] batches under that epoch, oldest first.
    pub batches: Vec<ProducerBatch>,
    /// The commit time (coordinator clock, ms) of the producer's last appended batch in the partition
    /// (duplicates and rejected batches do not refresh it) or of its last transaction marker; the
    /// producer-id expiration counts from it.
    pub last_append_ms: i64,
    /// The first offset of the producer's open transaction in the partition, if one is open
    /// (Kafka's `currentTxnFirstOffset`). A producer with an open transaction never expires.
    pub current_txn_first_offset: Option<i64>,
    /// When that transaction started in the partition (coordinator clock, ms), else `-1`.
    pub current_txn_start_ms: i64,
    /// The number ([`CommitBatch::txn_seq`]) of the verified batch that opened that transaction,
    /// else `None` (also for a transaction opened before the coordinator kept the number). While
    /// it is set, a verified batch of another transaction is refused and a marker of another
    /// transaction does not end this one (docs/transactions.md §2.3).
    pub current_txn_seq: Option<i64>,
    /// The transaction coordinator epoch of the producer's last marker, else `-1`.
    pub coordinator_epoch: i32,
    /// The largest [`TxnMarker::txn_seq`] of a marker written for the producer in the partition,
    /// else `-1`: verified batches of that transaction or older ones can no longer open one.
    pub last_ended_txn: i64,
    /// The offset of the producer's last marker in the partition, else `-1` (the answer to a
    /// repeated marker).
    pub last_marker_offset: i64,
}

impl ProducerState {
    /// The state of a producer first seen with `producer_epoch` at `last_append_ms`: no batches
    /// kept yet, no transaction open, no marker seen.
    pub fn new(producer_id: i64, producer_epoch: i16, last_append_ms: i64) -> Self {
        ProducerState {
            producer_id,
            producer_epoch,
            batches: Vec::new(),
            last_append_ms,
            current_txn_first_offset: None,
            current_txn_start_ms: -1,
            current_txn_seq: None,
            coordinator_epoch: -1,
            last_ended_txn: -1,
            last_marker_offset: -1,
        }
    }

    /// The fields of Kafka's DescribeProducers answer for this producer
    /// (`KafkaApis.handleDescribeProducersRequest`), as every host answers them.
    ///
    /// ```
    /// use diskless_coordinator::{ProducerState, ProducerBatch, NO_TIMESTAMP};
    ///
    /// let mut state = ProducerState::new(7, 2, 1_000);
    /// assert_eq!(state.described().last_sequence, -1);
    /// state.batches.push(ProducerBatch {
    ///     base_sequence: 0,
    ///     last_sequence: 4,
    ///     base_offset: 10,
    ///     last_offset: 14,
    ///     log_append_time: NO_TIMESTAMP,
    /// });
    /// state.current_txn_first_offset = Some(10);
    /// let d = state.described();
    /// assert_eq!((d.producer_epoch, d.last_sequence, d.last_timestamp), (2, 4, 1_000));
    /// assert_eq!((d.coordinator_epoch, d.current_txn_start_offset), (-1, 10));
    /// ```
    pub fn described(&self) -> DescribedProducer {
        let last = self.batches.last();
        DescribedProducer {
            producer_id: self.producer_id,
            producer_epoch: i32::from(self.producer_epoch),
            last_sequence: last.map_or(-1, |b| b.last_sequence),
            last_timestamp: match last {
                Some(b) if b.log_append_time != crate::NO_TIMESTAMP => b.log_append_time,
                _ => self.last_append_ms,
            },
            coordinator_epoch: self.coordinator_epoch,
            current_txn_start_offset: self.current_txn_first_offset.unwrap_or(-1),
        }
    }
}

/// One producer of a partition as Kafka's DescribeProducers (API 61) answers it
/// ([`ProducerState::described`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescribedProducer {
    /// The producer id.
    pub producer_id: i64,
    /// Its latest epoch.
    pub producer_epoch: i32,
    /// The last sequence of its last batch kept, else `-1`.
    pub last_sequence: i32,
    /// The last batch's log append time on a LogAppendTime topic; otherwise the commit time of
    /// the producer's last append (the coordinator keeps no batch max timestamp, which Kafka
    /// answers here).
    pub last_timestamp: i64,
    /// The transaction coordinator epoch of its last marker, else `-1`.
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction in the partition, else `-1`.
    pub current_txn_start_offset: i64,
}

/// The length of a tiered segment object's trailer, after its sections
/// ([`SegmentLayoutSizes::TRAILER_LEN`]).
pub const SEGMENT_TRAILER_LEN: u64 = SegmentLayoutSizes::TRAILER_LEN;

/// The sizes of a tiered segment object's sections (the `.log` at byte 0, then `.index`,
/// `.timeindex`, `.txnindex`, the producer snapshot and the leader-epoch checkpoint, then the
/// [`SEGMENT_TRAILER_LEN`]-byte trailer), as the coordinator stores them so that reads never need
/// the trailer: `diskless_common::SegmentLayout`, the one description of a segment's layout
/// (storage reads sections by the same type), under the name this crate exports it by.
pub use diskless_common::SegmentLayout as SegmentLayoutSizes;

/// A registered tiered segment of one partition (KIP-405's `COPY_SEGMENT_FINISHED`): a Kafka log
/// segment in one immutable object holding the partition's batches `base_offset..=end_offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredSegment {
    /// The object holding the segment.
    pub object_key: String,
    /// The object's size ([`SegmentLayoutSizes::object_size`] of `layout`, or more).
    pub object_size: u64,
    /// Its sections' sizes.
    pub layout: SegmentLayoutSizes,
    /// The offset of its first batch's first record.
    pub base_offset: i64,
    /// The offset of its last batch's last record.
    pub end_offset: i64,
    /// The largest effective max timestamp of its batches (log append time for LogAppendTime
    /// batches), [`NO_TIMESTAMP`] when none has one (KIP-405's `maxTimestampMs`).
    pub max_timestamp: i64,
    /// The last offset of the earliest batch holding `max_timestamp` (the time index's last
    /// entry).
    pub max_timestamp_offset: i64,
    /// The time retention ages the segment by: the largest over its batches of their effective
    /// max timestamp, or their commit time for a batch without one.
    pub retention_ts: i64,
    /// How many batches it holds (transaction markers included).
    pub batch_count: u32,
    /// When it was registered (coordinator clock, ms).
    pub registered_at: i64,
    /// Whether compaction wrote it ([`crate::BatchCoordinator::replace_segments`]): the
    /// partition's compacted segments are the clean part of its log, the others its dirty part
    /// (Kafka's cleaner checkpoint).
    pub compacted: bool,
}

/// A partition due for consolidation, as [`crate::BatchCoordinator::tiering_candidates`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieringCandidate {
    /// The partition.
    pub partition: TopicIdPartition,
    /// Its topic's configuration (`segment.bytes` and the index settings size the segment).
    pub config: TopicConfig,
    /// The bytes of its WAL batches (transaction markers count [`TXN_MARKER_SIZE`] each).
    pub wal_bytes: i64,
    /// When its oldest WAL batch was committed (coordinator clock, ms).
    pub oldest_wal_commit_ms: i64,
    /// The first offset not in a tiered segment (0 when nothing was ever tiered).
    pub tiered_next_offset: i64,
}

/// A request for the batches of the next segment of one partition
/// ([`crate::BatchCoordinator::segment_plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPlanRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The most `.log` bytes the segment may hold (the first batch is planned whatever its
    /// size).
    pub max_bytes: u64,
    /// The most batches the segment may hold (the first batch is planned whatever this is).
    pub max_batches: u32,
    /// Only batches committed before this time (coordinator clock, ms) are planned.
    pub committed_before_ms: i64,
}

/// The batches of a partition's next tiered segment, and what the builder needs besides them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPlan {
    /// [`ErrorCode::None`] or [`ErrorCode::UnknownTopicOrPartition`].
    pub error: ErrorCode,
    /// From the partition's first WAL batch, the batches (transaction markers included) below the
    /// last stable offset and committed before the request's bound, in offset order, up to the
    /// request's limits and `end − base ≤ i32::MAX`; at least one when the first batch
    /// qualifies, none when it does not.
    pub batches: Vec<BatchCoordinate>,
    /// The partition's last registered segment, if any (the producer snapshot carries on from
    /// it).
    pub previous: Option<TieredSegment>,
    /// The partition's log start offset (`-1` on error).
    pub log_start_offset: i64,
    /// The partition's high watermark (`-1` on error).
    pub high_watermark: i64,
    /// The aborted transactions whose ABORT marker is among `batches` (the segment's
    /// `.txnindex`), by marker offset.
    pub aborted: Vec<AbortedTxn>,
}

impl SegmentPlan {
    /// The plan for a partition that could not be read (no batches, bounds `-1`).
    pub fn error(error: ErrorCode) -> Self {
        SegmentPlan {
            error,
            batches: Vec::new(),
            previous: None,
            log_start_offset: -1,
            high_watermark: -1,
            aborted: Vec::new(),
        }
    }
}

/// A request to register an uploaded tiered segment and drop the batches it covers
/// ([`crate::BatchCoordinator::register_segment`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterSegmentRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The key the segment object was uploaded under (a fresh UUID v7 key: the commit deadline
    /// and the orphan fences apply as for [`crate::BatchCoordinator::commit_file`]).
    pub object_key: String,
    /// The object's size, at least [`SegmentLayoutSizes::object_size`] of `layout`.
    pub object_size: u64,
    /// The broker that uploaded it.
    pub uploader_broker_id: i32,
    /// Its sections' sizes; `layout.log` must equal `batch_bytes`.
    pub layout: SegmentLayoutSizes,
    /// The base offset of its first batch: the partition's first WAL batch.
    pub base_offset: i64,
    /// The last offset of its last batch.
    pub end_offset: i64,
    /// How many batches it holds.
    pub batch_count: u32,
    /// The bytes of those batches.
    pub batch_bytes: u64,
    /// See [`TieredSegment::max_timestamp`].
    pub max_timestamp: i64,
    /// See [`TieredSegment::max_timestamp_offset`].
    pub max_timestamp_offset: i64,
    /// The shard registering it, its owner list (a `ShardedCoordinator` sets it to the
    /// partition's shard).
    pub owner: ShardId,
}

/// A registered segment as a [`ReplaceSegmentsRequest`] names it (from
/// [`crate::BatchCoordinator::list_tiered_segments`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplacedSegment {
    /// Its object key.
    pub object_key: String,
    /// Its base offset.
    pub base_offset: i64,
    /// Its end offset.
    pub end_offset: i64,
}

impl From<&TieredSegment> for ReplacedSegment {
    fn from(s: &TieredSegment) -> Self {
        ReplacedSegment {
            object_key: s.object_key.clone(),
            base_offset: s.base_offset,
            end_offset: s.end_offset,
        }
    }
}

/// A compaction's swap ([`crate::BatchCoordinator::replace_segments`]): a run of a partition's
/// registered segments, replaced by one uploaded segment holding what compaction kept of them,
/// or by none when it kept nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplaceSegmentsRequest {
    /// The partition.
    pub partition: TopicIdPartition,
    /// The segments replaced: consecutive registered segments of the partition, in offset
    /// order, at least one.
    pub replaced: Vec<ReplacedSegment>,
    /// The new segment, or `None` when compaction kept nothing of them. Its `partition` is the
    /// request's; `base_offset` and `end_offset` are its own first and last batch's, within the
    /// replaced range; its retention time is the replaced segments' latest.
    pub segment: Option<RegisterSegmentRequest>,
}

/// What [`crate::BatchCoordinator::register_segment`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterSegmentOutcome {
    /// Registered: the covered batches are gone from the partition's WAL batches.
    Registered {
        /// How many WAL objects this registration released the last live bytes of, as the
        /// coordinator that registered it counts them (they are now marked for deletion there).
        /// A shard of a `ShardedCoordinator` counts its own part of an object shared with other
        /// shards, which may still hold it: a figure for metrics, not a deletion promise
        /// (`objects_to_delete` decides that).
        released_objects: u32,
    },
    /// The key was already registered as this segment (a retry): nothing applied again.
    AlreadyRegistered,
    /// The range is no longer the partition's first WAL batches as the request describes them
    /// (retention, DeleteRecords or another segment took some, or the request's counts do not
    /// match, or it reaches the last stable offset): nothing applied.
    Stale,
    /// No such partition: nothing applied.
    UnknownPartition,
}
