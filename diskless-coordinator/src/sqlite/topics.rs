//! Topics (creation, deletion, CreatePartitions, config changes) and producer-id blocks.

use super::SqliteCoordinator;
use super::lifecycle::release_objects_sql;
use super::sql::{at_commit, not_applied};
use crate::rows::{
    TOPIC_COLUMNS, TOPIC_TIERING_COLUMN_COUNT, TOPIC_TIERING_COLUMNS, bind_topic,
    bind_topic_config, bind_topic_tiering, corrupt, topic_config_set, topic_key, topic_tiering_set,
};
use crate::{
    CoordinatorError, CreateTopicRequest, ProducerIdBlock, TopicConfig, check_new_partition_count,
    next_producer_id_block, validate_producer_id_count,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;
use uuid::Uuid;

/// Whether a topic row matches `column = value`.
async fn topic_exists(
    conn: &mut SqliteConnection,
    column: &str,
    value: &str,
) -> Result<bool, CoordinatorError> {
    let sql = format!("SELECT 1 FROM topics WHERE {column} = ?1");
    Ok(sqlx::query(AssertSqlSafe(sql))
        .bind(value)
        .fetch_optional(&mut *conn)
        .await
        .map_err(not_applied)?
        .is_some())
}

impl SqliteCoordinator {
    pub(super) async fn write_create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<(), CoordinatorError> {
        request.validate()?;
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let id = topic_key(request.topic_id);
        if topic_exists(&mut tx, "topic_id", &id).await? {
            return Err(CoordinatorError::TopicAlreadyExists(id));
        }
        if topic_exists(&mut tx, "name", &request.name).await? {
            return Err(CoordinatorError::TopicAlreadyExists(request.name));
        }
        // The id, the ten of TOPIC_COLUMNS, then the later settings.
        let values = (1..=10 + TOPIC_TIERING_COLUMN_COUNT)
            .map(|n| format!("?{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let insert = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO topics (topic_id, {TOPIC_COLUMNS}, {TOPIC_TIERING_COLUMNS}) \
             VALUES ({values})"
        )));
        bind_topic_tiering(bind_topic(insert, &request), &request.config)
            .execute(&mut *tx)
            .await
            .map_err(not_applied)?;
        sqlx::query(
            "WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < ?2) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT ?1, n, 0, 0, 0 FROM seq",
        )
        .bind(&id)
        .bind(request.partitions)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)
    }

    pub(super) async fn write_delete_topic(&self, topic_id: Uuid) -> Result<(), CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        let id = topic_key(topic_id);
        if !topic_exists(&mut tx, "topic_id", &id).await? {
            return Err(CoordinatorError::UnknownTopic(id));
        }
        // The topic's batches come off their objects' live bytes first (markers have none).
        let release = release_objects_sql(
            "SELECT object_id, SUM(byte_size) AS bytes FROM batches WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1) \
             AND object_id IS NOT NULL GROUP BY object_id",
            "?2",
        );
        // And its tiered segments off theirs (a segment's object holds its `.log` as live bytes).
        let release_segments = release_objects_sql(
            "SELECT object_id, SUM(log_size) AS bytes FROM tiered_segments WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1) GROUP BY object_id",
            "?2",
        );
        for release in [release, release_segments] {
            sqlx::query(AssertSqlSafe(release))
                .bind(&id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(not_applied)?;
        }
        for sql in [
            "DELETE FROM tiered_segments WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM batches WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM producer_state WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM aborted_txns WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM partitions WHERE topic_id = ?1",
            "DELETE FROM topics WHERE topic_id = ?1",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(not_applied)?;
        }
        tx.commit().await.map_err(at_commit)
    }

    /// Grows a topic (CreatePartitions): the topic row's count and the new, empty partition rows,
    /// in one write transaction.
    pub(super) async fn write_create_partitions(
        &self,
        topic_id: Uuid,
        new_total: i32,
    ) -> Result<(), CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let id = topic_key(topic_id);
        let current: Option<i32> =
            sqlx::query_scalar("SELECT partition_count FROM topics WHERE topic_id = ?1")
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(not_applied)?;
        let Some(current) = current else {
            return Err(CoordinatorError::UnknownTopic(id));
        };
        check_new_partition_count(current, new_total)?;
        sqlx::query("UPDATE topics SET partition_count = ?2 WHERE topic_id = ?1")
            .bind(&id)
            .bind(new_total)
            .execute(&mut *tx)
            .await
            .map_err(not_applied)?;
        sqlx::query(
            "WITH RECURSIVE seq(n) AS (SELECT ?2 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < ?3) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT ?1, n, 0, 0, 0 FROM seq",
        )
        .bind(&id)
        .bind(current)
        .bind(new_total)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)
    }

    /// Replaces a topic's configuration: one `UPDATE` of its row.
    pub(super) async fn write_alter_topic_config(
        &self,
        topic_id: Uuid,
        config: TopicConfig,
    ) -> Result<(), CoordinatorError> {
        config.validate()?;
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let id = topic_key(topic_id);
        let update = sqlx::query(AssertSqlSafe(format!(
            "UPDATE topics SET {}, {} WHERE topic_id = ?1",
            topic_config_set('?'),
            topic_tiering_set('?', 9)
        )));
        let updated = bind_topic_config(update.bind(&id), &config);
        let updated = bind_topic_tiering(updated, &config)
            .execute(&mut *tx)
            .await
            .map_err(not_applied)?;
        if updated.rows_affected() == 0 {
            return Err(CoordinatorError::UnknownTopic(id));
        }
        tx.commit().await.map_err(at_commit)
    }

    /// Takes the next block of producer ids off the counter row, in one write transaction (the
    /// database's write lock serializes it with every other process on the file).
    pub(super) async fn write_allocate_producer_ids(
        &self,
        count: u32,
    ) -> Result<ProducerIdBlock, CoordinatorError> {
        validate_producer_id_count(count)?;
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let next: Option<i64> =
            sqlx::query_scalar("SELECT next_producer_id FROM producer_ids WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await
                .map_err(not_applied)?;
        let next = next.ok_or_else(|| corrupt("the producer_ids table has no row"))?;
        let (block, after) = next_producer_id_block(next, count)?;
        sqlx::query("UPDATE producer_ids SET next_producer_id = ?1 WHERE id = 1")
            .bind(after)
            .execute(&mut *tx)
            .await
            .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)?;
        Ok(block)
    }
}
