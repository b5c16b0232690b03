//! Topics (creation, deletion, CreatePartitions, config changes) and producer-id blocks.

use super::PostgresCoordinator;
use super::attempt::{Attempt, sql_error};
use super::lifecycle::delete_segments_below;
use super::lifecycle::{delete_batches_below, release_objects};
use crate::rows::{
    SqlRow, cleanup_policy, compression_type, parse_topic_id, topic_key, ts_type, ts_type_code,
};
use crate::{
    CoordinatorError, CreateTopicRequest, ProducerIdBlock, TopicConfig, TopicInfo,
    check_new_partition_count, next_producer_id_block, validate_producer_id_count,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;
use std::collections::BTreeMap;
use uuid::Uuid;

/// The configuration columns of a PostgreSQL topic row, in the order [`config_from_row`] reads
/// them (migration 13 added the four tiered-storage settings, migration 14 the four compression
/// settings, migration 17 the five compaction settings).
pub(super) const CONFIG_COLUMNS: &str = "timestamp_type, retention_ms, retention_bytes, \
     max_message_bytes, message_timestamp_before_max_ms, message_timestamp_after_max_ms, \
     producer_id_expiration_ms, segment_bytes, segment_ms, index_interval_bytes, \
     segment_index_bytes, compression_type, compression_gzip_level, compression_lz4_level, \
     compression_zstd_level, cleanup_policy, delete_retention_ms, min_compaction_lag_ms, \
     max_compaction_lag_ms, min_cleanable_dirty_ratio";

/// How many columns [`CONFIG_COLUMNS`] lists.
const CONFIG_COLUMN_COUNT: usize = 20;

/// The columns of a topic row after its id: name, partition count, then [`CONFIG_COLUMNS`].
pub(super) fn topic_columns() -> String {
    format!("name, partition_count, {CONFIG_COLUMNS}")
}

/// Binds `config` as the next [`CONFIG_COLUMN_COUNT`] parameters, in [`CONFIG_COLUMNS`] order.
fn bind_config<'q>(
    q: Query<'q, Postgres, PgArguments>,
    c: &TopicConfig,
) -> Query<'q, Postgres, PgArguments> {
    q.bind(ts_type_code(c.timestamp_type))
        .bind(c.retention_ms)
        .bind(c.retention_bytes)
        .bind(c.max_message_bytes)
        .bind(c.message_timestamp_before_max_ms)
        .bind(c.message_timestamp_after_max_ms)
        .bind(c.producer_id_expiration_ms)
        .bind(c.segment_bytes)
        .bind(c.segment_ms)
        .bind(c.index_interval_bytes)
        .bind(c.segment_index_bytes)
        .bind(c.compression_type.name())
        .bind(c.compression_gzip_level)
        .bind(c.compression_lz4_level)
        .bind(c.compression_zstd_level)
        .bind(c.cleanup_policy.name())
        .bind(c.delete_retention_ms)
        .bind(c.min_compaction_lag_ms)
        .bind(c.max_compaction_lag_ms)
        .bind(c.min_cleanable_dirty_ratio)
}

/// A topic configuration from the [`CONFIG_COLUMNS`] of `row` starting at column `at`.
pub(super) fn config_from_row(
    row: &impl SqlRow,
    at: usize,
) -> Result<TopicConfig, CoordinatorError> {
    Ok(TopicConfig {
        timestamp_type: ts_type(row.i16_at(at)?)?,
        retention_ms: row.i64_at(at + 1)?,
        retention_bytes: row.i64_at(at + 2)?,
        max_message_bytes: row.i32_at(at + 3)?,
        message_timestamp_before_max_ms: row.i64_at(at + 4)?,
        message_timestamp_after_max_ms: row.i64_at(at + 5)?,
        producer_id_expiration_ms: row.i64_at(at + 6)?,
        segment_bytes: row.i32_at(at + 7)?,
        segment_ms: row.i64_at(at + 8)?,
        index_interval_bytes: row.i32_at(at + 9)?,
        segment_index_bytes: row.i32_at(at + 10)?,
        compression_type: compression_type(&row.string_at(at + 11)?)?,
        compression_gzip_level: row.i32_at(at + 12)?,
        compression_lz4_level: row.i32_at(at + 13)?,
        compression_zstd_level: row.i32_at(at + 14)?,
        cleanup_policy: cleanup_policy(&row.string_at(at + 15)?)?,
        delete_retention_ms: row.i64_at(at + 16)?,
        min_compaction_lag_ms: row.i64_at(at + 17)?,
        max_compaction_lag_ms: row.i64_at(at + 18)?,
        min_cleanable_dirty_ratio: row.f64_at(at + 19)?,
    })
}

/// A topic from the topic id (text) then [`topic_columns`].
pub(super) fn topic_from_row(row: &impl SqlRow) -> Result<TopicInfo, CoordinatorError> {
    Ok(TopicInfo {
        topic_id: parse_topic_id(&row.string_at(0)?)?,
        name: row.string_at(1)?,
        partitions: row.i32_at(2)?,
        config: config_from_row(row, 3)?,
    })
}

impl PostgresCoordinator {
    /// The topic row and its partitions, in one statement (one transaction).
    pub(super) async fn write_create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<(), CoordinatorError> {
        request.validate()?;
        self.check_open()?;
        let id = topic_key(request.topic_id);
        let values = (1..=3 + CONFIG_COLUMN_COUNT)
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let insert = sqlx::query(AssertSqlSafe(format!(
            "WITH t AS (INSERT INTO topics (topic_id, {columns}) \
             VALUES ({values}) RETURNING topic_id) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT t.topic_id, g, 0, 0, 0 FROM t, generate_series(0, $3 - 1) AS g",
            columns = topic_columns(),
            values = values.replacen("$1", "$1::uuid", 1),
        )));
        let insert = insert
            .bind(id.clone())
            .bind(request.name.clone())
            .bind(request.partitions);
        let result = bind_config(insert, &request.config)
            .execute(&self.write)
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("23505") => {
                if d.constraint() == Some("topics_name_key") {
                    Err(CoordinatorError::TopicAlreadyExists(request.name))
                } else {
                    Err(CoordinatorError::TopicAlreadyExists(id))
                }
            }
            // A failure to get a connection happens before anything was sent.
            Err(e @ (sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)) => {
                Err(sql_error(e, false))
            }
            Err(e) => Err(sql_error(e, true)),
        }
    }

    pub(super) async fn write_delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        self.retrying(|now| self.try_delete_topic(topic_id, now))
            .await
    }

    /// One attempt of `delete_topic` at coordinator time `now`: the topic row, then its partitions
    /// (in partition order) are locked, their batches (transaction markers included) and tiered
    /// segments deleted and their objects released, their producer states and aborted transactions deleted.
    async fn try_delete_topic(&self, topic_id: Uuid, now: i64) -> Result<(), Attempt> {
        let id = topic_key(topic_id);
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        let exists = sqlx::query("SELECT 1 FROM topics WHERE topic_id = $1::uuid FOR UPDATE")
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Attempt::before)?;
        if exists.is_none() {
            return Err(CoordinatorError::UnknownTopic(id).into());
        }
        let partition_ids: Vec<i64> = sqlx::query_scalar(
            "SELECT partition_id FROM partitions WHERE topic_id = $1::uuid \
             ORDER BY partition FOR UPDATE",
        )
        .bind(&id)
        .fetch_all(&mut *tx)
        .await
        .map_err(Attempt::before)?;
        let mut released = BTreeMap::new();
        delete_batches_below(&mut tx, &partition_ids, i64::MAX, &mut released).await?;
        delete_segments_below(&mut tx, &partition_ids, i64::MAX, &mut released).await?;
        release_objects(&mut tx, &released, now).await?;
        for sql in [
            "DELETE FROM producer_state WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = $1::uuid)",
            "DELETE FROM aborted_txns WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = $1::uuid)",
            "DELETE FROM partitions WHERE topic_id = $1::uuid",
            "DELETE FROM topics WHERE topic_id = $1::uuid",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(Attempt::before)?;
        }
        tx.commit().await.map_err(Attempt::sent)
    }

    pub(super) async fn write_create_partitions(
        &self,
        topic_id: Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        self.retrying(|_| self.try_create_partitions(topic_id, new_total))
            .await
    }

    /// One attempt of `create_partitions`: the topic row is locked (`FOR NO KEY UPDATE`: the
    /// foreign keys of its partitions need only `KEY SHARE`), its count checked and raised, and
    /// the new partition rows inserted. Commits never lock topic rows, so they go on meanwhile;
    /// `delete_topic` locks the topic row first too, so the two serialize.
    async fn try_create_partitions(&self, topic_id: Uuid, new_total: i32) -> Result<(), Attempt> {
        let id = topic_key(topic_id);
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        let current: Option<i32> = sqlx::query_scalar(
            "SELECT partition_count FROM topics WHERE topic_id = $1::uuid FOR NO KEY UPDATE",
        )
        .bind(&id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Attempt::before)?;
        let Some(current) = current else {
            return Err(CoordinatorError::UnknownTopic(id).into());
        };
        check_new_partition_count(current, new_total)?;
        for sql in [
            "UPDATE topics SET partition_count = $3 WHERE topic_id = $1::uuid",
            "INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT $1::uuid, g, 0, 0, 0 FROM generate_series($2, $3 - 1) AS g",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .bind(current)
                .bind(new_total)
                .execute(&mut *tx)
                .await
                .map_err(Attempt::before)?;
        }
        tx.commit().await.map_err(Attempt::sent)
    }

    /// One autocommit `UPDATE` of the topic row.
    pub(super) async fn write_alter_topic_config(
        &self,
        topic_id: Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        config.validate()?;
        self.check_open()?;
        let id = topic_key(topic_id);
        let set = CONFIG_COLUMNS
            .split(',')
            .zip(2..)
            .map(|(column, n)| format!("{} = ${n}", column.trim()))
            .collect::<Vec<_>>()
            .join(", ");
        let update = sqlx::query(AssertSqlSafe(format!(
            "UPDATE topics SET {set} WHERE topic_id = $1::uuid"
        )));
        let updated = bind_config(update.bind(&id), &config)
            .execute(&self.write)
            .await
            .map_err(autocommit_error)?;
        if updated.rows_affected() == 0 {
            return Err(CoordinatorError::UnknownTopic(id));
        }
        Ok(())
    }

    /// One autocommit `UPDATE ... RETURNING` of the counter row (migration 8): concurrent callers
    /// of every process queue on its row lock, each moving the counter past its own block.
    pub(super) async fn write_allocate_producer_ids(
        &self,
        count: u32,
    ) -> Result<ProducerIdBlock, CoordinatorError> {
        validate_producer_id_count(count)?;
        self.check_open()?;
        let first: Option<i64> = sqlx::query_scalar(
            "UPDATE producer_ids SET next_producer_id = next_producer_id + $1 \
             WHERE id = 1 AND next_producer_id < 9223372036854775807 - $1 \
             RETURNING next_producer_id - $1",
        )
        .bind(i64::from(count))
        .fetch_optional(&self.write)
        .await
        .map_err(autocommit_error)?;
        match first {
            Some(first) => Ok(next_producer_id_block(first, count)?.0),
            None => Err(CoordinatorError::Storage(
                "the producer-id space is exhausted (or the producer_ids row is missing)".into(),
            )),
        }
    }
}

/// The error of an autocommit statement: a failure to get a connection happened before anything
/// was sent; after that the statement may have applied.
fn autocommit_error(e: sqlx::Error) -> CoordinatorError {
    match e {
        e @ (sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => sql_error(e, false),
        e => sql_error(e, true),
    }
}
