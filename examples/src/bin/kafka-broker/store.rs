//! The broker's own durable state, in a SQLite file of the data directory (`broker.db`):
//!
//! - committed consumer-group offsets (OffsetCommit/OffsetFetch);
//! - the producer-id allocator of InitProducerId: ids are handed out from blocks, and a block is
//!   recorded as used before any id of it is given out, so a restarted broker never reuses an id.
//!
//! (A production broker keeps these in its own replicated stores; the coordinator of diskless topics
//! does not own them.)

use std::path::Path;

use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// Producer ids reserved per write of the allocator row.
const PRODUCER_ID_BLOCK: i64 = 1000;

/// One committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// The store.
#[derive(Debug)]
pub(crate) struct Store {
    pool: SqlitePool,
    /// The next producer id and the end (exclusive) of the reserved block.
    producer_ids: tokio::sync::Mutex<(i64, i64)>,
}

/// A failure of the store's database.
#[derive(Debug)]
pub(crate) struct StoreError(String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "broker store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

fn sql(e: sqlx::Error) -> StoreError {
    StoreError(e.to_string())
}

impl Store {
    /// Opens (creating) the store at `path`.
    pub(crate) async fn open(path: &Path) -> Result<Store, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(5));
        // One connection: writes are serialized, and reads see every committed write.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(sql)?;
        for statement in [
            "CREATE TABLE IF NOT EXISTS committed_offsets (
                group_id TEXT NOT NULL,
                topic TEXT NOT NULL,
                partition INTEGER NOT NULL,
                committed_offset INTEGER NOT NULL,
                leader_epoch INTEGER NOT NULL,
                metadata TEXT,
                commit_time_ms INTEGER NOT NULL,
                PRIMARY KEY (group_id, topic, partition)
            )",
            "CREATE TABLE IF NOT EXISTS producer_id_allocator (
                id INTEGER PRIMARY KEY CHECK (id = 0),
                next_block_start INTEGER NOT NULL
            )",
            "INSERT OR IGNORE INTO producer_id_allocator (id, next_block_start) VALUES (0, 1000)",
        ] {
            sqlx::query(statement).execute(&pool).await.map_err(sql)?;
        }
        Ok(Store {
            pool,
            producer_ids: tokio::sync::Mutex::new((0, 0)),
        })
    }

    /// A fresh producer id, never handed out before by this store.
    pub(crate) async fn next_producer_id(&self) -> Result<i64, StoreError> {
        let mut ids = self.producer_ids.lock().await;
        if ids.0 >= ids.1 {
            let mut tx = self.pool.begin().await.map_err(sql)?;
            let row =
                sqlx::query("SELECT next_block_start FROM producer_id_allocator WHERE id = 0")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(sql)?;
            let start: i64 = row.try_get(0).map_err(sql)?;
            let end = start
                .checked_add(PRODUCER_ID_BLOCK)
                .ok_or_else(|| StoreError("producer ids exhausted".into()))?;
            sqlx::query("UPDATE producer_id_allocator SET next_block_start = ? WHERE id = 0")
                .bind(end)
                .execute(&mut *tx)
                .await
                .map_err(sql)?;
            tx.commit().await.map_err(sql)?;
            *ids = (start, end);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// Stores offsets of a group atomically.
    pub(crate) async fn commit(
        &self,
        group: &str,
        offsets: &[CommittedOffset],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for o in offsets {
            sqlx::query(
                "INSERT INTO committed_offsets
                   (group_id, topic, partition, committed_offset, leader_epoch, metadata, commit_time_ms)
                 VALUES (?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                   committed_offset = excluded.committed_offset,
                   leader_epoch = excluded.leader_epoch,
                   metadata = excluded.metadata,
                   commit_time_ms = excluded.commit_time_ms",
            )
            .bind(group)
            .bind(&o.topic)
            .bind(o.partition)
            .bind(o.offset)
            .bind(o.leader_epoch)
            .bind(o.metadata.as_deref())
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
    }

    /// Every committed offset of a group.
    pub(crate) async fn fetch(&self, group: &str) -> Result<Vec<CommittedOffset>, StoreError> {
        let rows = sqlx::query(
            "SELECT topic, partition, committed_offset, leader_epoch, metadata
             FROM committed_offsets WHERE group_id = ? ORDER BY topic, partition",
        )
        .bind(group)
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        rows.iter()
            .map(|r| {
                Ok(CommittedOffset {
                    topic: r.try_get(0).map_err(sql)?,
                    partition: r.try_get(1).map_err(sql)?,
                    offset: r.try_get(2).map_err(sql)?,
                    leader_epoch: r.try_get(3).map_err(sql)?,
                    metadata: r.try_get(4).map_err(sql)?,
                })
            })
            .collect()
    }

    /// Forgets the committed offsets of a deleted topic.
    pub(crate) async fn delete_topic(&self, topic: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM committed_offsets WHERE topic = ?")
            .bind(topic)
            .execute(&self.pool)
            .await
            .map_err(sql)?;
        Ok(())
    }

    /// Closes the database.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn offsets_and_producer_ids_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let store = Store::open(&path).await.unwrap();
        let a = store.next_producer_id().await.unwrap();
        let b = store.next_producer_id().await.unwrap();
        assert_eq!(b, a + 1);
        let offsets = vec![CommittedOffset {
            topic: "t".into(),
            partition: 2,
            offset: 42,
            leader_epoch: 0,
            metadata: Some("m".into()),
        }];
        store.commit("g", &offsets, 1).await.unwrap();
        store.close().await;
        drop(store);

        let store = Store::open(&path).await.unwrap();
        let c = store.next_producer_id().await.unwrap();
        assert!(
            c > b,
            "a reopened store must not reuse producer ids ({c} <= {b})"
        );
        assert_eq!(store.fetch("g").await.unwrap(), offsets);
        assert!(store.fetch("other").await.unwrap().is_empty());
        store.delete_topic("t").await.unwrap();
        assert!(store.fetch("g").await.unwrap().is_empty());
    }
}
