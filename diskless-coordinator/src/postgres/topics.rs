//! Topic creation and deletion.

use super::PostgresCoordinator;
use super::conn::{Attempt, sql_error};
use super::lifecycle::{delete_batches_below, release_objects};
use crate::rows::{TOPIC_COLUMNS, bind_topic, topic_key};
use crate::{CoordinatorError, CreateTopicRequest};
use sqlx::AssertSqlSafe;
use std::collections::BTreeMap;
use uuid::Uuid;

impl PostgresCoordinator {
    /// The topic row and its partitions, in one statement (one transaction).
    pub(super) async fn write_create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<(), CoordinatorError> {
        request.validate()?;
        self.check_open()?;
        let id = topic_key(request.topic_id);
        let insert = sqlx::query(AssertSqlSafe(format!(
            "WITH t AS (INSERT INTO topics (topic_id, {TOPIC_COLUMNS}) \
             VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING topic_id) \
             INSERT INTO partitions (topic_id, partition, log_start_offset, high_watermark, \
             byte_size) SELECT t.topic_id, g, 0, 0, 0 FROM t, generate_series(0, $3 - 1) AS g"
        )));
        let result = bind_topic(insert, &request).execute(&self.write).await;
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
    /// (in partition order) are locked, their batches deleted and their objects released.
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
        release_objects(&mut tx, &released, now).await?;
        for sql in [
            "DELETE FROM producer_state WHERE partition_id IN \
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
}
