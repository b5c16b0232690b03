//! Topic creation and deletion.

use super::SqliteCoordinator;
use super::conn::{at_commit, not_applied};
use super::lifecycle::release_objects_sql;
use crate::rows::{TOPIC_COLUMNS, bind_topic, topic_key};
use crate::{CoordinatorError, CreateTopicRequest};
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
        let insert = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO topics (topic_id, {TOPIC_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        )));
        bind_topic(insert, &request)
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
        // The topic's batches come off their objects' live bytes first.
        let release = release_objects_sql(
            "SELECT object_id, SUM(byte_size) AS bytes FROM batches WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1) GROUP BY object_id",
            "?2",
        );
        sqlx::query(AssertSqlSafe(release))
            .bind(&id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(not_applied)?;
        for sql in [
            "DELETE FROM batches WHERE partition_id IN \
             (SELECT partition_id FROM partitions WHERE topic_id = ?1)",
            "DELETE FROM producer_state WHERE partition_id IN \
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
}
