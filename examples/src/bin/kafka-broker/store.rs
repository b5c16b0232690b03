//! The broker's own durable state, in a SQLite file of the data directory (`broker.db`):
//!
//! - committed consumer-group offsets (OffsetCommit/OffsetFetch);
//! - consumer-group metadata (what Kafka writes to `__consumer_offsets` as a group's metadata
//!   record: generation, protocol type and name, leader, and each member with its ids, client,
//!   timeouts, subscription and assignment), so that a restarted broker knows every group and its
//!   members' generation;
//! - topic configs that are not part of the coordinator's `TopicConfig` (Kafka's other topic
//!   configs, accepted and kept without effect), per topic id, and manual replica assignments of
//!   partitions (CreateTopics / CreatePartitions), which Metadata reports;
//! - group configs (Kafka's `GroupConfig`, set with IncrementalAlterConfigs on a GROUP resource).
//!
//! (A production broker keeps these in its own replicated stores; the coordinator of diskless topics
//! does not own them.)

use std::collections::BTreeMap;
use std::path::Path;

use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use uuid::Uuid;

/// Configs by name (canonical values).
pub(crate) type Configs = BTreeMap<String, String>;

/// One committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// A group's durable metadata: Kafka's `GroupMetadataValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupRecord {
    pub group_id: String,
    pub protocol_type: Option<String>,
    pub generation: i32,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    /// When the group entered its current state (ms since the epoch).
    pub state_time_ms: i64,
    /// In join order.
    pub members: Vec<MemberRecord>,
}

/// One member of a [`GroupRecord`] (Kafka's `MemberMetadata` record).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemberRecord {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// The member's metadata of the group's protocol.
    pub subscription: Vec<u8>,
    pub assignment: Vec<u8>,
}

/// The store (cheap to clone: clones share the database).
#[derive(Clone, Debug)]
pub(crate) struct Store {
    pool: SqlitePool,
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
            "CREATE TABLE IF NOT EXISTS group_metadata (
                group_id TEXT PRIMARY KEY,
                protocol_type TEXT,
                generation INTEGER NOT NULL,
                protocol_name TEXT,
                leader TEXT,
                state_time_ms INTEGER NOT NULL
            )",
            "CREATE TABLE IF NOT EXISTS group_members (
                group_id TEXT NOT NULL,
                position INTEGER NOT NULL,
                member_id TEXT NOT NULL,
                instance_id TEXT,
                client_id TEXT NOT NULL,
                client_host TEXT NOT NULL,
                rebalance_timeout_ms INTEGER NOT NULL,
                session_timeout_ms INTEGER NOT NULL,
                subscription BLOB NOT NULL,
                assignment BLOB NOT NULL,
                PRIMARY KEY (group_id, position)
            )",
            "CREATE TABLE IF NOT EXISTS topic_configs (
                topic_id TEXT NOT NULL,
                name TEXT NOT NULL,
                value TEXT NOT NULL,
                PRIMARY KEY (topic_id, name)
            )",
            "CREATE TABLE IF NOT EXISTS partition_assignments (
                topic_id TEXT NOT NULL,
                partition INTEGER NOT NULL,
                replicas TEXT NOT NULL,
                PRIMARY KEY (topic_id, partition)
            )",
            "CREATE TABLE IF NOT EXISTS group_configs (
                group_id TEXT NOT NULL,
                name TEXT NOT NULL,
                value TEXT NOT NULL,
                PRIMARY KEY (group_id, name)
            )",
        ] {
            sqlx::query(statement).execute(&pool).await.map_err(sql)?;
        }
        Ok(Store { pool })
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

    /// Replaces the stored metadata of a group (Kafka's group metadata record).
    pub(crate) async fn save_group(&self, group: &GroupRecord) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        sqlx::query(
            "INSERT INTO group_metadata
               (group_id, protocol_type, generation, protocol_name, leader, state_time_ms)
             VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT (group_id) DO UPDATE SET
               protocol_type = excluded.protocol_type,
               generation = excluded.generation,
               protocol_name = excluded.protocol_name,
               leader = excluded.leader,
               state_time_ms = excluded.state_time_ms",
        )
        .bind(&group.group_id)
        .bind(group.protocol_type.as_deref())
        .bind(group.generation)
        .bind(group.protocol_name.as_deref())
        .bind(group.leader.as_deref())
        .bind(group.state_time_ms)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
        sqlx::query("DELETE FROM group_members WHERE group_id = ?")
            .bind(&group.group_id)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        for (position, m) in group.members.iter().enumerate() {
            let position = i64::try_from(position).map_err(|e| StoreError(e.to_string()))?;
            sqlx::query(
                "INSERT INTO group_members
                   (group_id, position, member_id, instance_id, client_id, client_host,
                    rebalance_timeout_ms, session_timeout_ms, subscription, assignment)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&group.group_id)
            .bind(position)
            .bind(&m.member_id)
            .bind(m.instance_id.as_deref())
            .bind(&m.client_id)
            .bind(&m.client_host)
            .bind(m.rebalance_timeout_ms)
            .bind(m.session_timeout_ms)
            .bind(&m.subscription)
            .bind(&m.assignment)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
    }

    /// Every stored group: those with metadata, and (as empty groups without a protocol type, as
    /// Kafka loads them) those known only by their committed offsets.
    pub(crate) async fn load_groups(&self) -> Result<Vec<GroupRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT group_id, protocol_type, generation, protocol_name, leader, state_time_ms
             FROM group_metadata ORDER BY group_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        let mut groups = Vec::with_capacity(rows.len());
        for r in &rows {
            groups.push(GroupRecord {
                group_id: r.try_get(0).map_err(sql)?,
                protocol_type: r.try_get(1).map_err(sql)?,
                generation: r.try_get(2).map_err(sql)?,
                protocol_name: r.try_get(3).map_err(sql)?,
                leader: r.try_get(4).map_err(sql)?,
                state_time_ms: r.try_get(5).map_err(sql)?,
                members: Vec::new(),
            });
        }
        let rows = sqlx::query(
            "SELECT group_id, member_id, instance_id, client_id, client_host,
                    rebalance_timeout_ms, session_timeout_ms, subscription, assignment
             FROM group_members ORDER BY group_id, position",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        for r in &rows {
            let group_id: String = r.try_get(0).map_err(sql)?;
            let member = MemberRecord {
                member_id: r.try_get(1).map_err(sql)?,
                instance_id: r.try_get(2).map_err(sql)?,
                client_id: r.try_get(3).map_err(sql)?,
                client_host: r.try_get(4).map_err(sql)?,
                rebalance_timeout_ms: r.try_get(5).map_err(sql)?,
                session_timeout_ms: r.try_get(6).map_err(sql)?,
                subscription: r.try_get(7).map_err(sql)?,
                assignment: r.try_get(8).map_err(sql)?,
            };
            if let Some(g) = groups.iter_mut().find(|g| g.group_id == group_id) {
                g.members.push(member);
            }
        }
        let rows = sqlx::query(
            "SELECT DISTINCT group_id FROM committed_offsets
             WHERE group_id NOT IN (SELECT group_id FROM group_metadata) ORDER BY group_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        for r in &rows {
            groups.push(GroupRecord {
                group_id: r.try_get(0).map_err(sql)?,
                ..GroupRecord::default()
            });
        }
        Ok(groups)
    }

    /// Deletes a group: its metadata and every committed offset (DeleteGroups).
    pub(crate) async fn delete_group(&self, group: &str) -> Result<(), StoreError> {
        self.delete_by_key(
            &[
                "DELETE FROM group_metadata WHERE group_id = ?",
                "DELETE FROM group_members WHERE group_id = ?",
                "DELETE FROM committed_offsets WHERE group_id = ?",
            ],
            group,
        )
        .await
    }

    /// Runs `statements`, each with `key` as its one parameter, in one transaction.
    async fn delete_by_key(
        &self,
        statements: &[&'static str],
        key: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for statement in statements {
            sqlx::query(*statement)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
    }

    /// Deletes committed offsets of a group (OffsetDelete).
    pub(crate) async fn delete_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for (topic, partition) in partitions {
            sqlx::query(
                "DELETE FROM committed_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
            )
            .bind(group)
            .bind(topic)
            .bind(partition)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
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

    /// Every topic's kept configs (topic id → name → value).
    pub(crate) async fn topic_configs(&self) -> Result<Vec<(Uuid, Configs)>, StoreError> {
        let rows = sqlx::query("SELECT topic_id, name, value FROM topic_configs ORDER BY topic_id")
            .fetch_all(&self.pool)
            .await
            .map_err(sql)?;
        let mut out: Vec<(Uuid, Configs)> = Vec::new();
        for row in rows {
            let id: String = row.get(0);
            let Ok(id) = Uuid::parse_str(&id) else {
                return Err(StoreError(format!("topic_configs: bad topic id {id}")));
            };
            if out.last().is_none_or(|(last, _)| *last != id) {
                out.push((id, Configs::new()));
            }
            if let Some((_, configs)) = out.last_mut() {
                configs.insert(row.get(1), row.get(2));
            }
        }
        Ok(out)
    }

    /// Replaces the kept configs of a topic.
    pub(crate) async fn set_topic_configs(
        &self,
        topic_id: Uuid,
        configs: &Configs,
    ) -> Result<(), StoreError> {
        self.replace_configs("topic_configs", "topic_id", &topic_id.to_string(), configs)
            .await
    }

    /// Every manual replica assignment (topic id, partition, replicas).
    pub(crate) async fn assignments(&self) -> Result<Vec<(Uuid, i32, Vec<i32>)>, StoreError> {
        let rows = sqlx::query("SELECT topic_id, partition, replicas FROM partition_assignments")
            .fetch_all(&self.pool)
            .await
            .map_err(sql)?;
        rows.into_iter()
            .map(|row| {
                let id: String = row.get(0);
                let replicas: String = row.get(2);
                let id = Uuid::parse_str(&id)
                    .map_err(|_| StoreError(format!("partition_assignments: bad topic id {id}")))?;
                let replicas = replicas
                    .split(',')
                    .map(|r| r.parse::<i32>())
                    .collect::<Result<Vec<i32>, _>>()
                    .map_err(|_| {
                        StoreError(format!("partition_assignments: bad replicas {replicas}"))
                    })?;
                Ok((id, row.get(1), replicas))
            })
            .collect()
    }

    /// Records manual replica assignments of partitions of a topic.
    pub(crate) async fn add_assignments(
        &self,
        topic_id: Uuid,
        assignments: &[(i32, Vec<i32>)],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for (partition, replicas) in assignments {
            let replicas: Vec<String> = replicas.iter().map(i32::to_string).collect();
            sqlx::query(
                "INSERT OR REPLACE INTO partition_assignments (topic_id, partition, replicas) \
                 VALUES (?, ?, ?)",
            )
            .bind(topic_id.to_string())
            .bind(partition)
            .bind(replicas.join(","))
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
    }

    /// Forgets the kept configs and assignments of a deleted topic.
    pub(crate) async fn forget_topic_id(&self, topic_id: Uuid) -> Result<(), StoreError> {
        self.delete_by_key(
            &[
                "DELETE FROM topic_configs WHERE topic_id = ?",
                "DELETE FROM partition_assignments WHERE topic_id = ?",
            ],
            &topic_id.to_string(),
        )
        .await
    }

    /// The configs set on a group.
    pub(crate) async fn group_configs(&self, group: &str) -> Result<Configs, StoreError> {
        let rows = sqlx::query("SELECT name, value FROM group_configs WHERE group_id = ?")
            .bind(group)
            .fetch_all(&self.pool)
            .await
            .map_err(sql)?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Replaces the configs set on a group.
    pub(crate) async fn set_group_configs(
        &self,
        group: &str,
        configs: &Configs,
    ) -> Result<(), StoreError> {
        self.replace_configs("group_configs", "group_id", group, configs)
            .await
    }

    async fn replace_configs(
        &self,
        table: &'static str,
        key: &'static str,
        id: &str,
        configs: &Configs,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE {key} = ?"
        )))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
        for (name, value) in configs {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table} ({key}, name, value) VALUES (?, ?, ?)"
            )))
            .bind(id)
            .bind(name)
            .bind(value)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
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
    async fn offsets_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let store = Store::open(&path).await.unwrap();
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
        assert_eq!(store.fetch("g").await.unwrap(), offsets);
        assert!(store.fetch("other").await.unwrap().is_empty());
        store.delete_topic("t").await.unwrap();
        assert!(store.fetch("g").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn group_metadata_survives_a_reopen_and_delete_removes_offsets_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let store = Store::open(&path).await.unwrap();
        let member = |id: &str, instance: Option<&str>| MemberRecord {
            member_id: id.into(),
            instance_id: instance.map(Into::into),
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            rebalance_timeout_ms: 300_000,
            session_timeout_ms: 45_000,
            subscription: vec![0, 1, 2],
            assignment: id.as_bytes().to_vec(),
        };
        let mut group = GroupRecord {
            group_id: "g".into(),
            protocol_type: Some("consumer".into()),
            generation: 3,
            protocol_name: Some("range".into()),
            leader: Some("b".into()),
            state_time_ms: 7,
            // Join order is kept (not sorted by id).
            members: vec![member("b", None), member("a", Some("i-1"))],
        };
        store.save_group(&group).await.unwrap();
        group.generation = 4;
        group.members.pop();
        store.save_group(&group).await.unwrap();
        let offset = CommittedOffset {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            leader_epoch: -1,
            metadata: None,
        };
        store
            .commit("g", std::slice::from_ref(&offset), 1)
            .await
            .unwrap();
        store
            .commit("offsets-only", std::slice::from_ref(&offset), 1)
            .await
            .unwrap();
        store.close().await;
        drop(store);

        let store = Store::open(&path).await.unwrap();
        let loaded = store.load_groups().await.unwrap();
        assert_eq!(
            loaded,
            vec![
                group.clone(),
                GroupRecord {
                    group_id: "offsets-only".into(),
                    ..GroupRecord::default()
                }
            ]
        );
        store.delete_group("g").await.unwrap();
        assert!(store.fetch("g").await.unwrap().is_empty());
        store
            .delete_offsets("offsets-only", &[("t".into(), 0)])
            .await
            .unwrap();
        assert!(store.load_groups().await.unwrap().is_empty());
    }
}
