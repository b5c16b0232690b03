//! The row conversions both SQL coordinators use: columns to the data model and back, with one
//! error for a row that cannot be read. What differs between SQLite and PostgreSQL (how a row
//! decodes a column) is behind [`SqlRow`]; the column lists and their decoding are written once.

use crate::{
    BatchCoordinate, CleanupPolicy, CoordinatorError, EndTxnMarker, ObjectInfo, ObjectKind,
    ObjectToDelete, SegmentLayoutSizes, ShardId, TieredSegment, TimestampType, TopicCompression,
    TopicConfig,
};
#[cfg(feature = "sqlite")]
use crate::{CreateTopicRequest, TopicInfo};
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Row, Type};
use uuid::Uuid;

/// A row the coordinator's store holds but cannot read: [`CoordinatorError::Storage`].
pub(crate) fn corrupt(what: impl Into<String>) -> CoordinatorError {
    CoordinatorError::Storage(what.into().into())
}

/// Column `i` of `row`, decoded; a value of the wrong type is [`CoordinatorError::Storage`].
pub(crate) fn col<'r, R, T>(row: &'r R, i: usize) -> Result<T, CoordinatorError>
where
    R: Row,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(i)
        .map_err(|e| CoordinatorError::Storage(Box::new(e)))
}

/// The columns the shared decoders read, on either backend.
pub(crate) trait SqlRow {
    /// Column `i` as an `i64`.
    fn i64_at(&self, i: usize) -> Result<i64, CoordinatorError>;
    /// Column `i` as an `i32`.
    fn i32_at(&self, i: usize) -> Result<i32, CoordinatorError>;
    /// Column `i` as an `i16`.
    fn i16_at(&self, i: usize) -> Result<i16, CoordinatorError>;
    /// Column `i` as a nullable `i64`.
    fn opt_i64_at(&self, i: usize) -> Result<Option<i64>, CoordinatorError>;
    /// Column `i` as text.
    fn string_at(&self, i: usize) -> Result<String, CoordinatorError>;
    /// Column `i` as an `f64`.
    fn f64_at(&self, i: usize) -> Result<f64, CoordinatorError>;
}

impl<R> SqlRow for R
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i16: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
{
    fn i64_at(&self, i: usize) -> Result<i64, CoordinatorError> {
        col(self, i)
    }
    fn i32_at(&self, i: usize) -> Result<i32, CoordinatorError> {
        col(self, i)
    }
    fn i16_at(&self, i: usize) -> Result<i16, CoordinatorError> {
        col(self, i)
    }
    fn opt_i64_at(&self, i: usize) -> Result<Option<i64>, CoordinatorError> {
        col(self, i)
    }
    fn string_at(&self, i: usize) -> Result<String, CoordinatorError> {
        col(self, i)
    }
    fn f64_at(&self, i: usize) -> Result<f64, CoordinatorError> {
        col(self, i)
    }
}

/// A column that holds a non-negative 64-bit count or size.
pub(crate) fn to_u64(v: i64, what: &str) -> Result<u64, CoordinatorError> {
    u64::try_from(v).map_err(|_| corrupt(format!("negative {what}: {v}")))
}

/// A column that holds a 32-bit size.
pub(crate) fn to_u32(v: i64, what: &str) -> Result<u32, CoordinatorError> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} out of range: {v}")))
}

/// The stored code of a timestamp type: 0 CreateTime, 1 LogAppendTime.
pub(crate) fn ts_type_code(t: TimestampType) -> i16 {
    match t {
        TimestampType::CreateTime => 0,
        TimestampType::LogAppendTime => 1,
    }
}

/// The timestamp type of a stored code.
pub(crate) fn ts_type(code: i16) -> Result<TimestampType, CoordinatorError> {
    match code {
        0 => Ok(TimestampType::CreateTime),
        1 => Ok(TimestampType::LogAppendTime),
        other => Err(corrupt(format!("unknown timestamp type {other}"))),
    }
}

/// A topic id as stored and bound: the lowercase hyphenated UUID.
pub(crate) fn topic_key(id: Uuid) -> String {
    id.hyphenated().to_string()
}

/// A stored topic id.
pub(crate) fn parse_topic_id(s: &str) -> Result<Uuid, CoordinatorError> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("bad topic id {s:?}")))
}

#[cfg(feature = "sqlite")] // only the SQLite backend uses it
/// The columns of a topic's configuration, in the order [`topic_from_row`] reads them after the
/// topic id, and in which a topic row is inserted after it.
pub(crate) const TOPIC_COLUMNS: &str = "name, partition_count, timestamp_type, retention_ms, \
     retention_bytes, max_message_bytes, message_timestamp_before_max_ms, \
     message_timestamp_after_max_ms, producer_id_expiration_ms";

#[cfg(feature = "sqlite")] // only the SQLite backend uses it
/// Binds the next ten parameters to `request`'s topic row: its id (text, as [`topic_key`]) then
/// [`TOPIC_COLUMNS`].
pub(crate) fn bind_topic<'q, DB>(
    q: Query<'q, DB, <DB as Database>::Arguments>,
    request: &CreateTopicRequest,
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'e> String: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> i16: Encode<'e, DB> + Type<DB>,
{
    let c = &request.config;
    q.bind(topic_key(request.topic_id))
        .bind(request.name.clone())
        .bind(request.partitions)
        .bind(ts_type_code(c.timestamp_type))
        .bind(c.retention_ms)
        .bind(c.retention_bytes)
        .bind(c.max_message_bytes)
        .bind(c.message_timestamp_before_max_ms)
        .bind(c.message_timestamp_after_max_ms)
        .bind(c.producer_id_expiration_ms)
}

#[cfg(feature = "sqlite")] // only the SQLite backend uses it
/// The `SET` list of an `UPDATE topics` replacing a topic's configuration: parameters 2 to 8 (1
/// is left for the topic id), written `{mark}2` ... (`?` for SQLite, `$` for PostgreSQL), bound by
/// [`bind_topic_config`].
pub(crate) fn topic_config_set(mark: char) -> String {
    [
        "timestamp_type",
        "retention_ms",
        "retention_bytes",
        "max_message_bytes",
        "message_timestamp_before_max_ms",
        "message_timestamp_after_max_ms",
        "producer_id_expiration_ms",
    ]
    .iter()
    .zip(2..)
    .map(|(column, n)| format!("{column} = {mark}{n}"))
    .collect::<Vec<_>>()
    .join(", ")
}

#[cfg(feature = "sqlite")] // only the SQLite backend uses it
/// Binds the next seven parameters to `config`, in the order of [`topic_config_set`].
pub(crate) fn bind_topic_config<'q, DB>(
    q: Query<'q, DB, <DB as Database>::Arguments>,
    config: &TopicConfig,
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> i16: Encode<'e, DB> + Type<DB>,
{
    q.bind(ts_type_code(config.timestamp_type))
        .bind(config.retention_ms)
        .bind(config.retention_bytes)
        .bind(config.max_message_bytes)
        .bind(config.message_timestamp_before_max_ms)
        .bind(config.message_timestamp_after_max_ms)
        .bind(config.producer_id_expiration_ms)
}

#[cfg(feature = "sqlite")] // only the SQLite backend uses it
/// A topic: the topic id (text) then [`TOPIC_COLUMNS`].
pub(crate) fn topic_from_row(row: &impl SqlRow) -> Result<TopicInfo, CoordinatorError> {
    Ok(TopicInfo {
        topic_id: parse_topic_id(&row.string_at(0)?)?,
        name: row.string_at(1)?,
        partitions: row.i32_at(2)?,
        config: TopicConfig {
            timestamp_type: ts_type(row.i16_at(3)?)?,
            retention_ms: row.i64_at(4)?,
            retention_bytes: row.i64_at(5)?,
            max_message_bytes: row.i32_at(6)?,
            message_timestamp_before_max_ms: row.i64_at(7)?,
            message_timestamp_after_max_ms: row.i64_at(8)?,
            producer_id_expiration_ms: row.i64_at(9)?,
            // The tiered-storage fields are read by each backend's own topic query.
            ..TopicConfig::default()
        },
    })
}

/// The 16 columns [`batch_from_row`] decodes; batch columns from `b`, object columns from `o`. A
/// transaction marker has no object (`object_id` NULL, read with a `LEFT JOIN`): its object key
/// reads as `''` and its object size as 0.
pub(crate) fn batch_columns(o: &str) -> String {
    format!(
        "b.base_offset, b.last_offset, b.byte_offset, b.byte_size, b.base_timestamp, \
         b.max_timestamp, b.timestamp_type, b.log_append_time, b.producer_id, b.producer_epoch, \
         b.base_sequence, b.last_sequence, COALESCE({o}.object_key, ''), \
         COALESCE({o}.object_size, 0), b.control_type, b.coordinator_epoch"
    )
}

/// The stored `control_type` of a data batch.
pub(crate) const CONTROL_NONE: i16 = -1;
/// The stored `control_type` of an ABORT marker.
pub(crate) const CONTROL_ABORT: i16 = 0;
/// The stored `control_type` of a COMMIT marker.
pub(crate) const CONTROL_COMMIT: i16 = 1;

/// The [`BatchCoordinate::control`] of a stored `control_type` and `coordinator_epoch`.
pub(crate) fn control_of(
    control_type: i16,
    coordinator_epoch: i32,
) -> Result<Option<EndTxnMarker>, CoordinatorError> {
    let commit = match control_type {
        CONTROL_NONE => return Ok(None),
        CONTROL_ABORT => false,
        CONTROL_COMMIT => true,
        other => return Err(corrupt(format!("unknown control type {other}"))),
    };
    Ok(Some(EndTxnMarker {
        commit,
        coordinator_epoch,
    }))
}

/// Decodes the 16 columns of [`batch_columns`] starting at `at`.
pub(crate) fn batch_from_row(
    row: &impl SqlRow,
    at: usize,
) -> Result<BatchCoordinate, CoordinatorError> {
    Ok(BatchCoordinate {
        base_offset: row.i64_at(at)?,
        last_offset: row.i64_at(at + 1)?,
        byte_offset: to_u64(row.i64_at(at + 2)?, "byte offset")?,
        byte_size: to_u32(row.i64_at(at + 3)?, "byte size")?,
        base_timestamp: row.i64_at(at + 4)?,
        max_timestamp: row.i64_at(at + 5)?,
        timestamp_type: ts_type(row.i16_at(at + 6)?)?,
        log_append_time: row.i64_at(at + 7)?,
        producer_id: row.i64_at(at + 8)?,
        producer_epoch: row.i16_at(at + 9)?,
        base_sequence: row.i32_at(at + 10)?,
        last_sequence: row.i32_at(at + 11)?,
        object_key: row.string_at(at + 12)?,
        object_size: to_u64(row.i64_at(at + 13)?, "object size")?,
        control: control_of(row.i16_at(at + 14)?, row.i32_at(at + 15)?)?,
    })
}

/// A page of retention's rows: (last offset, byte size, the time retention ages the batch by) of
/// each batch, as [`crate::rules::RetentionScan::feed`] takes them.
pub(crate) fn retention_rows(
    rows: &[impl SqlRow],
) -> Result<Vec<(i64, i64, i64)>, CoordinatorError> {
    rows.iter()
        .map(|r| Ok((r.i64_at(0)?, r.i64_at(1)?, r.i64_at(2)?)))
        .collect()
}

/// The marked objects older than `$1`, oldest first, at most `$2` (SQLite reads `$n` as `?n`):
/// the columns [`object_to_delete_from_row`] reads.
// SQLite reads the kind too (its own query); PostgreSQL uses this one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const OBJECTS_TO_DELETE: &str = "SELECT object_key, marked_for_deletion_at, \
     object_size FROM objects WHERE marked_for_deletion_at IS NOT NULL \
     AND marked_for_deletion_at < $1 ORDER BY marked_for_deletion_at, object_key LIMIT $2";

/// A row of [`OBJECTS_TO_DELETE`].
pub(crate) fn object_to_delete_from_row(
    row: &impl SqlRow,
) -> Result<ObjectToDelete, CoordinatorError> {
    Ok(ObjectToDelete {
        object_key: row.string_at(0)?,
        marked_for_deletion_at: row.i64_at(1)?,
        object_size: to_u64(row.i64_at(2)?, "object size")?,
        // What PostgreSQL holds until it implements tiered storage; SQLite reads its `kind`
        // column over this.
        kind: ObjectKind::Wal,
    })
}

/// What is known of the object with key `$1`: the columns [`object_info_from_row`] reads (the
/// owners column, 3, is read by each backend: its type differs).
// SQLite reads the kind too (its own query); PostgreSQL uses this one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const OBJECT_INFO: &str = "SELECT uploader_broker_id, object_size, live_bytes, owners, \
     committed_at, marked_for_deletion_at FROM objects WHERE object_key = $1";

/// A row of [`OBJECT_INFO`] for `object_key`, with its decoded owners.
pub(crate) fn object_info_from_row(
    row: &impl SqlRow,
    object_key: &str,
    owners: Vec<ShardId>,
) -> Result<ObjectInfo, CoordinatorError> {
    Ok(ObjectInfo {
        object_key: object_key.to_string(),
        uploader_broker_id: row.i32_at(0)?,
        object_size: to_u64(row.i64_at(1)?, "object size")?,
        live_bytes: to_u64(row.i64_at(2)?, "live bytes")?,
        owners,
        committed_at: row.i64_at(4)?,
        marked_for_deletion_at: row.opt_i64_at(5)?,
        kind: ObjectKind::Wal,
    })
}

/// The columns of a topic's settings added after the first schema (for a backend that stores
/// them): the tiered-storage settings (SQLite migration 7), the compression settings
/// (migration 8) and the compaction settings (migration 11), in the order [`tiering_from_row`]
/// reads them and [`bind_topic_tiering`] binds them.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) const TOPIC_TIERING_COLUMNS: &str = "segment_bytes, segment_ms, index_interval_bytes, \
     segment_index_bytes, compression_type, compression_gzip_level, compression_lz4_level, \
     compression_zstd_level, cleanup_policy, delete_retention_ms, min_compaction_lag_ms, \
     max_compaction_lag_ms, min_cleanable_dirty_ratio";

/// How many columns [`TOPIC_TIERING_COLUMNS`] lists.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) const TOPIC_TIERING_COLUMN_COUNT: usize = 13;

/// The `SET` list of [`TOPIC_TIERING_COLUMNS`] with parameters `{mark}{first}` onwards, bound by
/// [`bind_topic_tiering`].
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn topic_tiering_set(mark: char, first: usize) -> String {
    TOPIC_TIERING_COLUMNS
        .split(',')
        .map(str::trim)
        .zip(first..)
        .map(|(column, n)| format!("{column} = {mark}{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds the next [`TOPIC_TIERING_COLUMN_COUNT`] parameters to `config`'s settings of
/// [`TOPIC_TIERING_COLUMNS`], in that order.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn bind_topic_tiering<'q, DB>(
    q: Query<'q, DB, <DB as Database>::Arguments>,
    config: &TopicConfig,
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> &'static str: Encode<'e, DB> + Type<DB>,
    for<'e> f64: Encode<'e, DB> + Type<DB>,
{
    q.bind(config.segment_bytes)
        .bind(config.segment_ms)
        .bind(config.index_interval_bytes)
        .bind(config.segment_index_bytes)
        .bind(config.compression_type.name())
        .bind(config.compression_gzip_level)
        .bind(config.compression_lz4_level)
        .bind(config.compression_zstd_level)
        .bind(config.cleanup_policy.name())
        .bind(config.delete_retention_ms)
        .bind(config.min_compaction_lag_ms)
        .bind(config.max_compaction_lag_ms)
        .bind(config.min_cleanable_dirty_ratio)
}

/// Sets `config`'s tiered-storage settings from the columns of [`TOPIC_TIERING_COLUMNS`] starting
/// at `at`.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn tiering_from_row(
    row: &impl SqlRow,
    at: usize,
    config: &mut TopicConfig,
) -> Result<(), CoordinatorError> {
    config.segment_bytes = row.i32_at(at)?;
    config.segment_ms = row.i64_at(at + 1)?;
    config.index_interval_bytes = row.i32_at(at + 2)?;
    config.segment_index_bytes = row.i32_at(at + 3)?;
    config.compression_type = compression_type(&row.string_at(at + 4)?)?;
    config.compression_gzip_level = row.i32_at(at + 5)?;
    config.compression_lz4_level = row.i32_at(at + 6)?;
    config.compression_zstd_level = row.i32_at(at + 7)?;
    config.cleanup_policy = cleanup_policy(&row.string_at(at + 8)?)?;
    config.delete_retention_ms = row.i64_at(at + 9)?;
    config.min_compaction_lag_ms = row.i64_at(at + 10)?;
    config.max_compaction_lag_ms = row.i64_at(at + 11)?;
    config.min_cleanable_dirty_ratio = row.f64_at(at + 12)?;
    Ok(())
}

/// A stored `cleanup_policy` (Kafka's list text), or corruption.
pub(crate) fn cleanup_policy(name: &str) -> Result<CleanupPolicy, CoordinatorError> {
    CleanupPolicy::from_name(name)
        .ok_or_else(|| corrupt(format!("unknown stored cleanup policy {name:?}")))
}

/// A stored `compression_type` (Kafka's name), or corruption.
pub(crate) fn compression_type(name: &str) -> Result<TopicCompression, CoordinatorError> {
    TopicCompression::from_name(name)
        .ok_or_else(|| corrupt(format!("unknown stored compression type {name:?}")))
}

/// The stored `kind` of an object: 0 a WAL object, 1 a tiered segment.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn object_kind_code(kind: ObjectKind) -> i16 {
    match kind {
        ObjectKind::Wal => 0,
        ObjectKind::TieredSegment => 1,
    }
}

/// The [`ObjectKind`] of a stored code.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn object_kind(code: i16) -> Result<ObjectKind, CoordinatorError> {
    match code {
        0 => Ok(ObjectKind::Wal),
        1 => Ok(ObjectKind::TieredSegment),
        other => Err(corrupt(format!("unknown object kind {other}"))),
    }
}

/// The 16 columns [`segment_from_row`] decodes: segment columns from `s`, object columns from `o`.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn segment_columns(s: &str, o: &str) -> String {
    format!(
        "{o}.object_key, {o}.object_size, {s}.log_size, {s}.offset_index_size, \
         {s}.time_index_size, {s}.txn_index_size, {s}.snapshot_size, {s}.epochs_size, \
         {s}.base_offset, {s}.end_offset, {s}.max_timestamp, {s}.max_timestamp_offset, \
         {s}.retention_ts, {s}.batch_count, {s}.registered_at, {s}.compacted"
    )
}

/// Decodes the 16 columns of [`segment_columns`] starting at `at`.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn segment_from_row(
    row: &impl SqlRow,
    at: usize,
) -> Result<TieredSegment, CoordinatorError> {
    let u32_at = |i: usize, what: &str| to_u32(row.i64_at(i)?, what);
    Ok(TieredSegment {
        object_key: row.string_at(at)?,
        object_size: to_u64(row.i64_at(at + 1)?, "object size")?,
        layout: SegmentLayoutSizes {
            log: to_u64(row.i64_at(at + 2)?, "segment log size")?,
            offset_index: u32_at(at + 3, "offset index size")?,
            time_index: u32_at(at + 4, "time index size")?,
            txn_index: u32_at(at + 5, "transaction index size")?,
            producer_snapshot: u32_at(at + 6, "producer snapshot size")?,
            leader_epochs: u32_at(at + 7, "leader epoch checkpoint size")?,
        },
        base_offset: row.i64_at(at + 8)?,
        end_offset: row.i64_at(at + 9)?,
        max_timestamp: row.i64_at(at + 10)?,
        max_timestamp_offset: row.i64_at(at + 11)?,
        retention_ts: row.i64_at(at + 12)?,
        batch_count: u32_at(at + 13, "segment batch count")?,
        registered_at: row.i64_at(at + 14)?,
        compacted: row.i64_at(at + 15)? != 0,
    })
}

/// The columns of a `txn_records` row (migrations: SQLite 10, PostgreSQL 16), in the order
/// [`txn_record_from_row`] reads and [`bind_txn_record`] binds them.
pub(crate) const TXN_RECORD_COLUMNS: &str = "transactional_id, producer_id, producer_epoch, \
     timeout_ms, status, txn_seq, partitions, started_ms, updated_ms, fenced";

/// A [`crate::TxnRecord`] from a row of [`TXN_RECORD_COLUMNS`].
pub(crate) fn txn_record_from_row<R>(row: &R) -> Result<crate::TxnRecord, CoordinatorError>
where
    R: Row + SqlRow,
    usize: ColumnIndex<R>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let status = row.i16_at(4)?;
    let blob: Vec<u8> = col(row, 6)?;
    Ok(crate::TxnRecord {
        transactional_id: row.string_at(0)?,
        producer_id: row.i64_at(1)?,
        producer_epoch: row.i16_at(2)?,
        timeout_ms: row.i64_at(3)?,
        status: crate::TxnStatus::from_code(status)
            .ok_or_else(|| corrupt(format!("transaction status {status}")))?,
        txn_seq: row.i64_at(5)?,
        partitions: crate::txn_record::decode_partitions(&blob)
            .ok_or_else(|| corrupt("a transaction record's partitions"))?,
        started_ms: row.i64_at(7)?,
        updated_ms: row.i64_at(8)?,
        fenced: row.i16_at(9)? != 0,
    })
}

/// Binds the ten parameters of a `txn_records` row, [`TXN_RECORD_COLUMNS`] in order.
pub(crate) fn bind_txn_record<'q, DB>(
    q: Query<'q, DB, <DB as Database>::Arguments>,
    r: &crate::TxnRecord,
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'e> String: Encode<'e, DB> + Type<DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> i16: Encode<'e, DB> + Type<DB>,
{
    q.bind(r.transactional_id.clone())
        .bind(r.producer_id)
        .bind(r.producer_epoch)
        .bind(r.timeout_ms)
        .bind(r.status.code())
        .bind(r.txn_seq)
        .bind(crate::txn_record::encode_partitions(&r.partitions))
        .bind(r.started_ms)
        .bind(r.updated_ms)
        .bind(i16::from(r.fenced))
}

/// The `INSERT` of a whole `txn_records` row, replacing the one of its transactional id;
/// parameters written `{mark}1` to `{mark}10` (`?` for SQLite, `$` for PostgreSQL).
pub(crate) fn upsert_txn_record(mark: char) -> String {
    let params: Vec<String> = (1..=10).map(|i| format!("{mark}{i}")).collect();
    let set = TXN_RECORD_COLUMNS
        .split(',')
        .skip(1)
        .map(|c| format!("{0} = excluded.{0}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO txn_records ({TXN_RECORD_COLUMNS}) VALUES ({}) \
         ON CONFLICT (transactional_id) DO UPDATE SET {set}",
        params.join(", ")
    )
}
