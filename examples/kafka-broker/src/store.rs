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
//! - group configs (Kafka's `GroupConfig`, set with IncrementalAlterConfigs on a GROUP resource);
//! - the transaction coordinator's state (what Kafka writes to `__transaction_state`): one row per
//!   transactional id with its partitions and groups, the coordinator epoch of this process, and
//!   the transactional offsets pending until their transaction ends (see [`crate::txn`]).
//!
//! (A production broker keeps these in its own replicated stores; the coordinator of diskless topics
//! does not own them.)

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use uuid::Uuid;

use crate::txn_coordinator::{TxnMeta, TxnState};

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
    /// The order of offset writes (Kafka's offsets-log position): a committed row and a pending
    /// transactional row each get the next number, so that a transaction's commit installs its
    /// offset only over an older non-transactional one (Kafka's `CommitRecordMetadataAndOffset.olderThan`).
    write_seq: Arc<AtomicI64>,
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
        // One connection: writes are serialized, and reads see every committed write. A connection
        // that still counts a transaction when released (SQLite ended it by itself after a disk-full
        // or I/O error, and sqlx's ROLLBACK then failed) is closed, not kept: every later BEGIN on
        // it would fail (found by chaos/'s disk-full fault).
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(|conn, _| {
                Box::pin(async move {
                    sqlx::Connection::ping(&mut *conn).await?;
                    Ok(!sqlx::Connection::is_in_transaction(&*conn))
                })
            })
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
            "CREATE TABLE IF NOT EXISTS transactions (
                transactional_id TEXT PRIMARY KEY,
                producer_id INTEGER NOT NULL,
                prev_producer_id INTEGER NOT NULL,
                producer_epoch INTEGER NOT NULL,
                last_producer_epoch INTEGER NOT NULL,
                timeout_ms INTEGER NOT NULL,
                state TEXT NOT NULL,
                txn_seq INTEGER NOT NULL,
                start_ms INTEGER NOT NULL,
                last_update_ms INTEGER NOT NULL,
                coordinator_epoch INTEGER NOT NULL,
                next_producer_id INTEGER NOT NULL DEFAULT -1
            )",
            "CREATE TABLE IF NOT EXISTS transaction_partitions (
                transactional_id TEXT NOT NULL,
                topic_id TEXT NOT NULL,
                topic TEXT NOT NULL,
                partition INTEGER NOT NULL,
                PRIMARY KEY (transactional_id, topic_id, partition)
            )",
            "CREATE TABLE IF NOT EXISTS transaction_groups (
                transactional_id TEXT NOT NULL,
                group_id TEXT NOT NULL,
                PRIMARY KEY (transactional_id, group_id)
            )",
            "CREATE TABLE IF NOT EXISTS pending_txn_offsets (
                group_id TEXT NOT NULL,
                topic TEXT NOT NULL,
                partition INTEGER NOT NULL,
                producer_id INTEGER NOT NULL,
                committed_offset INTEGER NOT NULL,
                leader_epoch INTEGER NOT NULL,
                metadata TEXT,
                commit_time_ms INTEGER NOT NULL,
                write_seq INTEGER NOT NULL,
                PRIMARY KEY (group_id, topic, partition, producer_id)
            )",
            "CREATE TABLE IF NOT EXISTS txn_coordinator (
                id INTEGER PRIMARY KEY CHECK (id = 0),
                coordinator_epoch INTEGER NOT NULL
            )",
        ] {
            sqlx::query(statement).execute(&pool).await.map_err(sql)?;
        }
        // Databases from before transactions: committed offsets gain their write order; and from
        // before transaction version 2's producer-id rotation.
        add_column_if_missing(
            &pool,
            "committed_offsets",
            "write_seq",
            "INTEGER NOT NULL DEFAULT 0",
        )
        .await?;
        add_column_if_missing(
            &pool,
            "transactions",
            "next_producer_id",
            "INTEGER NOT NULL DEFAULT -1",
        )
        .await?;
        let last_seq: i64 = sqlx::query_scalar(
            "SELECT MAX(COALESCE((SELECT MAX(write_seq) FROM committed_offsets), 0),
                        COALESCE((SELECT MAX(write_seq) FROM pending_txn_offsets), 0))",
        )
        .fetch_one(&pool)
        .await
        .map_err(sql)?;
        Ok(Store {
            pool,
            write_seq: Arc::new(AtomicI64::new(last_seq)),
        })
    }

    fn next_write_seq(&self) -> i64 {
        self.write_seq.fetch_add(1, Ordering::Relaxed) + 1
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
                   (group_id, topic, partition, committed_offset, leader_epoch, metadata,
                    commit_time_ms, write_seq)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                   committed_offset = excluded.committed_offset,
                   leader_epoch = excluded.leader_epoch,
                   metadata = excluded.metadata,
                   commit_time_ms = excluded.commit_time_ms,
                   write_seq = excluded.write_seq",
            )
            .bind(group)
            .bind(&o.topic)
            .bind(o.partition)
            .bind(o.offset)
            .bind(o.leader_epoch)
            .bind(o.metadata.as_deref())
            .bind(now_ms)
            .bind(self.next_write_seq())
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
                "DELETE FROM pending_txn_offsets WHERE group_id = ?",
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
        self.delete_by_key(
            &[
                "DELETE FROM committed_offsets WHERE topic = ?",
                "DELETE FROM pending_txn_offsets WHERE topic = ?",
            ],
            topic,
        )
        .await
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

    /// The transaction coordinator's epoch for this process: one more than the last process's
    /// (stored before it is used, so markers of an earlier process are older).
    pub(crate) async fn bump_coordinator_epoch(&self) -> Result<i32, StoreError> {
        sqlx::query(
            "INSERT INTO txn_coordinator (id, coordinator_epoch) VALUES (0, 0)
             ON CONFLICT (id) DO UPDATE SET coordinator_epoch = coordinator_epoch + 1",
        )
        .execute(&self.pool)
        .await
        .map_err(sql)?;
        sqlx::query_scalar("SELECT coordinator_epoch FROM txn_coordinator WHERE id = 0")
            .fetch_one(&self.pool)
            .await
            .map_err(sql)
    }

    /// Every stored transactional id with its partitions and groups.
    pub(crate) async fn load_txns(&self) -> Result<Vec<TxnMeta>, StoreError> {
        let rows = sqlx::query(
            "SELECT transactional_id, producer_id, prev_producer_id, producer_epoch,
                    last_producer_epoch, timeout_ms, state, txn_seq, start_ms, last_update_ms,
                    coordinator_epoch, next_producer_id
             FROM transactions ORDER BY transactional_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.try_get(6).map_err(sql)?;
            let state = TxnState::parse(&state)
                .ok_or_else(|| StoreError(format!("transactions: unknown state {state:?}")))?;
            out.push(TxnMeta {
                transactional_id: r.try_get(0).map_err(sql)?,
                producer_id: r.try_get(1).map_err(sql)?,
                prev_producer_id: r.try_get(2).map_err(sql)?,
                producer_epoch: r.try_get(3).map_err(sql)?,
                last_producer_epoch: r.try_get(4).map_err(sql)?,
                timeout_ms: r.try_get(5).map_err(sql)?,
                state,
                txn_seq: r.try_get(7).map_err(sql)?,
                start_ms: r.try_get(8).map_err(sql)?,
                last_update_ms: r.try_get(9).map_err(sql)?,
                coordinator_epoch: r.try_get(10).map_err(sql)?,
                next_producer_id: r.try_get(11).map_err(sql)?,
                partitions: BTreeMap::new(),
                groups: Default::default(),
            });
        }
        let rows = sqlx::query(
            "SELECT transactional_id, topic_id, topic, partition FROM transaction_partitions",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        for r in &rows {
            let tid: String = r.try_get(0).map_err(sql)?;
            let topic_id: String = r.try_get(1).map_err(sql)?;
            let topic_id = Uuid::parse_str(&topic_id).map_err(|_| {
                StoreError(format!("transaction_partitions: bad topic id {topic_id}"))
            })?;
            if let Some(t) = out.iter_mut().find(|t| t.transactional_id == tid) {
                t.partitions.insert(
                    (topic_id, r.try_get(3).map_err(sql)?),
                    r.try_get(2).map_err(sql)?,
                );
            }
        }
        let rows = sqlx::query("SELECT transactional_id, group_id FROM transaction_groups")
            .fetch_all(&self.pool)
            .await
            .map_err(sql)?;
        for r in &rows {
            let tid: String = r.try_get(0).map_err(sql)?;
            if let Some(t) = out.iter_mut().find(|t| t.transactional_id == tid) {
                t.groups.insert(r.try_get(1).map_err(sql)?);
            }
        }
        Ok(out)
    }

    /// Replaces the stored state of a transactional id (Kafka's transaction log record).
    pub(crate) async fn save_txn(&self, meta: &TxnMeta) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        save_txn_in(&mut tx, meta).await?;
        tx.commit().await.map_err(sql)
    }

    /// Transactional offsets of producer `producer_id`, pending until its transaction ends.
    pub(crate) async fn add_pending_offsets(
        &self,
        group: &str,
        producer_id: i64,
        offsets: &[CommittedOffset],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for o in offsets {
            sqlx::query(
                "INSERT OR REPLACE INTO pending_txn_offsets
                   (group_id, topic, partition, producer_id, committed_offset, leader_epoch,
                    metadata, commit_time_ms, write_seq)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(group)
            .bind(&o.topic)
            .bind(o.partition)
            .bind(producer_id)
            .bind(o.offset)
            .bind(o.leader_epoch)
            .bind(o.metadata.as_deref())
            .bind(now_ms)
            .bind(self.next_write_seq())
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        }
        tx.commit().await.map_err(sql)
    }

    /// The partitions of a group with transactional offsets pending (OffsetFetch `require_stable`).
    pub(crate) async fn pending_partitions(
        &self,
        group: &str,
    ) -> Result<HashSet<(String, i32)>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT topic, partition FROM pending_txn_offsets WHERE group_id = ?",
        )
        .bind(group)
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).map_err(sql)?, r.try_get(1).map_err(sql)?)))
            .collect()
    }

    /// Ends the transactional offsets of `producer_id` in `groups` and stores `meta` (its
    /// Complete* state), in one transaction: on commit each pending offset replaces the committed
    /// one unless that was written later (Kafka's `completePendingTxnOffsetCommit`); on abort they
    /// are dropped. Repeating it changes nothing.
    pub(crate) async fn complete_txn(
        &self,
        meta: &TxnMeta,
        producer_id: i64,
        groups: &[String],
        commit: bool,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(sql)?;
        for group in groups {
            if commit {
                sqlx::query(
                    "INSERT INTO committed_offsets
                       (group_id, topic, partition, committed_offset, leader_epoch, metadata,
                        commit_time_ms, write_seq)
                     SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata,
                            commit_time_ms, write_seq
                     FROM pending_txn_offsets WHERE group_id = ? AND producer_id = ?
                     ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                       committed_offset = excluded.committed_offset,
                       leader_epoch = excluded.leader_epoch,
                       metadata = excluded.metadata,
                       commit_time_ms = excluded.commit_time_ms,
                       write_seq = excluded.write_seq
                     WHERE excluded.write_seq > committed_offsets.write_seq",
                )
                .bind(group)
                .bind(producer_id)
                .execute(&mut *tx)
                .await
                .map_err(sql)?;
            }
            sqlx::query("DELETE FROM pending_txn_offsets WHERE group_id = ? AND producer_id = ?")
                .bind(group)
                .bind(producer_id)
                .execute(&mut *tx)
                .await
                .map_err(sql)?;
        }
        save_txn_in(&mut tx, meta).await?;
        tx.commit().await.map_err(sql)
    }

    /// Closes the database.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

/// Adds `column` (declared `decl`) to `table` of an older database that lacks it.
async fn add_column_if_missing(
    pool: &sqlx::SqlitePool,
    table: &str,
    column: &str,
    decl: &str,
) -> Result<(), StoreError> {
    let present: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?")
            .bind(table)
            .bind(column)
            .fetch_one(pool)
            .await
            .map_err(sql)?;
    if present == 0 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} ADD COLUMN {column} {decl}"
        )))
        .execute(pool)
        .await
        .map_err(sql)?;
    }
    Ok(())
}

/// Writes `meta` (row, partitions, groups) inside `tx`.
async fn save_txn_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    meta: &TxnMeta,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT OR REPLACE INTO transactions
           (transactional_id, producer_id, prev_producer_id, producer_epoch, last_producer_epoch,
            timeout_ms, state, txn_seq, start_ms, last_update_ms, coordinator_epoch,
            next_producer_id)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&meta.transactional_id)
    .bind(meta.producer_id)
    .bind(meta.prev_producer_id)
    .bind(meta.producer_epoch)
    .bind(meta.last_producer_epoch)
    .bind(meta.timeout_ms)
    .bind(meta.state.name())
    .bind(meta.txn_seq)
    .bind(meta.start_ms)
    .bind(meta.last_update_ms)
    .bind(meta.coordinator_epoch)
    .bind(meta.next_producer_id)
    .execute(&mut **tx)
    .await
    .map_err(sql)?;
    for table in ["transaction_partitions", "transaction_groups"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE transactional_id = ?"
        )))
        .bind(&meta.transactional_id)
        .execute(&mut **tx)
        .await
        .map_err(sql)?;
    }
    for ((topic_id, partition), topic) in &meta.partitions {
        sqlx::query(
            "INSERT INTO transaction_partitions (transactional_id, topic_id, topic, partition)
             VALUES (?, ?, ?, ?)",
        )
        .bind(&meta.transactional_id)
        .bind(topic_id.to_string())
        .bind(topic)
        .bind(partition)
        .execute(&mut **tx)
        .await
        .map_err(sql)?;
    }
    for group in &meta.groups {
        sqlx::query("INSERT INTO transaction_groups (transactional_id, group_id) VALUES (?, ?)")
            .bind(&meta.transactional_id)
            .bind(group)
            .execute(&mut **tx)
            .await
            .map_err(sql)?;
    }
    Ok(())
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

    #[tokio::test]
    async fn transactions_survive_a_reopen_and_their_offsets_install_only_over_older_commits() {
        use crate::txn_coordinator::{TxnMeta, TxnState};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.bump_coordinator_epoch().await.unwrap(), 0);
        let mut meta = TxnMeta {
            transactional_id: "tx".into(),
            producer_id: 7,
            prev_producer_id: -1,
            producer_epoch: 2,
            last_producer_epoch: -1,
            timeout_ms: 60_000,
            state: TxnState::PrepareCommit,
            txn_seq: 4,
            start_ms: 100,
            last_update_ms: 200,
            coordinator_epoch: 0,
            next_producer_id: 12,
            partitions: [((Uuid::from_u128(9), 1), "t".to_string())]
                .into_iter()
                .collect(),
            groups: ["g".to_string()].into_iter().collect(),
        };
        store.save_txn(&meta).await.unwrap();
        let offset = |partition: i32, offset: i64| CommittedOffset {
            topic: "t".into(),
            partition,
            offset,
            leader_epoch: -1,
            metadata: None,
        };
        // Partition 0: the transaction's offset is older than a plain commit that follows it.
        // Partition 1: a plain commit before the transaction's offset.
        store.commit("g", &[offset(1, 5)], 1).await.unwrap();
        store
            .add_pending_offsets("g", 7, &[offset(0, 10), offset(1, 11)], 2)
            .await
            .unwrap();
        store.commit("g", &[offset(0, 3)], 3).await.unwrap();
        let pending = store.pending_partitions("g").await.unwrap();
        assert_eq!(pending.len(), 2);
        store.close().await;
        drop(store);

        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.bump_coordinator_epoch().await.unwrap(), 1);
        assert_eq!(store.load_txns().await.unwrap(), vec![meta.clone()]);
        meta.state = TxnState::CompleteCommit;
        meta.partitions.clear();
        meta.groups.clear();
        store
            .complete_txn(&meta, 7, &["g".to_string()], true)
            .await
            .unwrap();
        assert_eq!(
            store.fetch("g").await.unwrap(),
            vec![offset(0, 3), offset(1, 11)],
            "a later plain commit wins over the transaction's, an earlier one does not"
        );
        assert!(store.pending_partitions("g").await.unwrap().is_empty());
        assert_eq!(store.load_txns().await.unwrap(), vec![meta.clone()]);
        // An aborted transaction's offsets are dropped.
        store
            .add_pending_offsets("g", 7, &[offset(1, 99)], 4)
            .await
            .unwrap();
        store
            .complete_txn(&meta, 7, &["g".to_string()], false)
            .await
            .unwrap();
        assert_eq!(store.fetch("g").await.unwrap()[1], offset(1, 11));
        assert!(store.pending_partitions("g").await.unwrap().is_empty());
    }
}
