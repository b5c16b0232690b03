//! The SQLite batch coordinator: the embedded default, through sqlx.
//!
//! See [`SqliteCoordinator`]. Where each part lives:
//!
//! - `options.rs`: [`SqliteOptions`] and [`Synchronous`];
//! - `sql.rs`: multi-row statements, the stored owner list, and what a database error means for
//!   a call;
//! - `conn.rs`: opening (migrations, the write connection, the read pool), closing, the event
//!   counters;
//! - `topics.rs`: `create_topic`, `delete_topic`, `create_partitions`, `alter_topic_config`,
//!   `allocate_producer_ids` (a counter row, migration 5);
//! - `commit.rs`: `commit_file`, with `producer.rs` (the idempotent-producer and transaction
//!   rules, the producer-state rows);
//! - `txn.rs`: `write_txn_markers` (transaction markers: marker rows without an object, producer
//!   states, aborted transactions; migration 6);
//! - `reads.rs`: `find_batches` (with `read_committed`: the last stable offset and the aborted
//!   transactions), `list_offsets`, `list_topics`, `list_producers` and the other queries;
//! - `lifecycle.rs`: DeleteRecords, retention, producer expiry, object deletion and orphan fences
//!   (tiered segments included: retention and DeleteRecords delete whole segments first);
//! - `tiering.rs`: tiered segments (migration 7): `tiering_candidates`, `segment_plan`,
//!   `register_segment`, `list_tiered_segments`; `find_batches` and `list_offsets` read segments
//!   before WAL batches.
//!
//! Each [`BatchCoordinator`] method `x` is `write_x` (one `BEGIN IMMEDIATE` transaction on the
//! single writer) or `read_x` (on the read pool) in one of those files.
//!
//! The modules use each other without a cycle, each only those below it (`tests/module_graph.rs`
//! checks it): `options` and `sql` use none; `conn` uses them; `producer`, `commit`, `txn`,
//! `reads`, `lifecycle`, `topics` and `tiering` use `sql`, `conn` (the connections, as methods) and
//! each other in that order (`commit` → `producer`, `txn` → `commit`, `lifecycle` → `reads`,
//! `topics` → `lifecycle`, `tiering` → `lifecycle` and `reads`); this file uses them all. The
//! methods of [`SqliteCoordinator`] are spread over the modules (`impl` blocks), which therefore
//! name the type defined here, and nothing else of this file.

mod commit;
mod conn;
mod lifecycle;
mod options;
mod producer;
mod reads;
mod sql;
#[cfg(test)]
mod tests;
mod tiering;
mod topics;
mod txn;
mod txn_record;

pub use conn::migrator;
pub use options::{SqliteOptions, Synchronous};

use crate::Clock;
#[cfg(doc)]
use crate::{BatchCoordinator, CoordinatorError};
use conn::Counters;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

/// A [`BatchCoordinator`] on SQLite: the embedded default, the source of truth of a single-node
/// deployment.
///
/// - **Durable**: WAL journal, `synchronous=FULL` by default; an acknowledged commit survives a
///   process kill. Schema migrations are embedded and applied on open.
/// - **One writer path**: every write (commit, delete, retention, topic changes) runs as one
///   `BEGIN IMMEDIATE` transaction on a single dedicated connection behind an async mutex, so two
///   commits can never interleave their offset assignment.
/// - **Reads do not wait for writes**: find_batches, list_offsets and the other queries run on a
///   separate pool of read-only connections, each call in one read transaction (a consistent
///   snapshot); WAL lets them proceed while a write is in progress.
/// - **Fast commits**: a commit of a file is a fixed handful of statements whatever its batch count:
///   one lookup of all touched partitions, one of all touched producer states, the object insert,
///   multi-row inserts of the batches, one multi-row upsert of producer states and one multi-row
///   update of the partitions. All statements are prepared once and cached.
/// - **The commit point**: the commit deadline ([`SqliteOptions::max_commit_age`]) and the orphan
///   fences ([`BatchCoordinator::fence_orphans`]) are checked inside the commit's write transaction,
///   with the clock read after the writer mutex and SQLite's write lock are held, however long the
///   wait for them was. `fence_orphans` is a write transaction too, so it and a commit of the same key
///   are serialized by the single writer: never do both succeed. `confirm_deleted` fences every key
///   it forgets (with a v7 time) in its own transaction, so a deleted object's key is never
///   committed again.
/// - **Transactions** (KIP-98, the partition leader's part): a marker is a batch row with no
///   object; a producer's open transaction is its state's first offset, and the last stable offset
///   is one probe of a partial index holding only open transactions; aborted transactions are rows
///   by marker offset, which a `read_committed` fetch reads as one primary-key range (Kafka's
///   `collectAbortedTxns`). Markers are written in one write transaction like a commit.
/// - **ListOffsets by timestamp** costs one index probe whatever the partition's size: each batch
///   row keeps the running max of the partition's effective max timestamps, indexed with the
///   partition and offset; MAX_TIMESTAMP is one probe of a (partition, timestamp) index. Only a
///   target at or below the timestamp of an already deleted batch, larger than those of the first
///   live batches, needs a forward scan from the log start to the answer.
/// - **Lifecycle passes hold the writer for bounded work**: `enforce_retention` finds the partitions
///   whose first batch is due in SQL (one or two primary-key probes per partition with live bytes,
///   no batch row read for a partition with nothing to delete), reads a due partition's oldest
///   batches in small growing pages up to the first batch that stays, and stops as soon as its
///   budget is spent: batch rows read are a small multiple of the budget
///   ([`SqliteCoordinator::stats`] counts them); `expire_producers` reads producer
///   states in order until it has its cap; `fence_orphans` drops at most
///   [`crate::FENCE_EXPIRY_BATCH`] expired fences per call.
///
/// The semantics are those of the conformance suite in `diskless-testkit` (Kafka's, at batch
/// granularity); see `diskless_testkit::coordinator` for the decisions where Kafka leaves a choice.
///
/// # Errors
/// A failure before a write transaction could start, or while it ran, is
/// [`CoordinatorError::Unavailable`] (nothing was applied; SQLITE_BUSY after the busy timeout
/// included); a failure of the `COMMIT` itself is [`CoordinatorError::OutcomeUnknown`] (unless SQLite
/// reports the commit did not happen); undecodable rows or constraint violations are
/// [`CoordinatorError::Storage`].
///
/// # Example
/// ```
/// use diskless_coordinator::sqlite::SqliteCoordinator;
/// use diskless_coordinator::*;
/// use std::sync::Arc;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let clock = ManualClock::new(1_000);
/// let coordinator = SqliteCoordinator::in_memory(clock.clone()).await?;
/// let topic_id = uuid::Uuid::from_u128(42);
/// coordinator
///     .create_topic(CreateTopicRequest {
///         topic_id,
///         name: "orders".into(),
///         partitions: 1,
///         config: TopicConfig::default(),
///     })
///     .await?;
///
/// // A broker uploaded a WAL segment holding one batch of 3 records at bytes 1..101.
/// let partition = TopicIdPartition::new(topic_id, 0);
/// let results = coordinator
///     .commit_file(CommitFileRequest {
///         object_key: "wal/0001".into(),
///         uploader_broker_id: 1,
///         object_size: 101,
///         owners: vec![0],
///         batches: vec![CommitBatch {
///             partition,
///             byte_offset: 1,
///             byte_size: 100,
///             record_count: 3,
///             base_timestamp: 900,
///             max_timestamp: 950,
///             timestamp_type: TimestampType::CreateTime,
///             producer_id: NO_PRODUCER_ID,
///             producer_epoch: NO_PRODUCER_EPOCH,
///             base_sequence: NO_SEQUENCE,
///             last_sequence: NO_SEQUENCE,
///             transactional: false,
///             txn_seq: None,
///         }],
///     })
///     .await?;
/// assert_eq!(results[0].error, ErrorCode::None);
/// assert_eq!(results[0].base_offset, 0);
///
/// // A consumer fetches from offset 1: the batch holding it comes back.
/// let found = coordinator
///     .find_batches(
///         &[FindBatchesRequest {
///             partition,
///             offset: 1,
///             max_bytes: 1 << 20,
///             isolation: Default::default(),
///         }],
///         1 << 20,
///     )
///     .await?;
/// assert_eq!(found[0].high_watermark, 3);
/// assert_eq!(found[0].batches[0].object_key, "wal/0001");
/// assert_eq!((found[0].batches[0].base_offset, found[0].batches[0].last_offset), (0, 2));
/// # Ok::<(), CoordinatorError>(())
/// # }).unwrap();
/// ```
pub struct SqliteCoordinator {
    clock: Arc<dyn Clock>,
    max_commit_age: Duration,
    /// The single write connection; `None` once closed.
    writer: Mutex<Option<SqliteConnection>>,
    /// How the write connection was opened, to open it again when it is stuck (`None` for an
    /// in-memory database).
    writer_options: Option<SqliteConnectOptions>,
    /// Read-only connections; `None` for an in-memory database (reads share the writer).
    readers: Option<SqlitePool>,
    closed: AtomicBool,
    counters: Counters,
}

/// What a [`SqliteCoordinator`] did since it was opened (for monitoring: the work its lifecycle
/// passes did while holding the write lock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteStats {
    /// Partitions whose batches retention passes read: only partitions with at least one batch to
    /// delete are read, and a pass stops as soon as its budget is spent, so a pass examines at most
    /// its budget of partitions.
    pub retention_partitions_examined: u64,
    /// Batch rows retention passes read (in pages that start small and stop at the first batch
    /// that stays): a small multiple of the batches deleted, never partitions × budget.
    pub retention_batches_read: u64,
}

/// A failed SQLite read is not asked again: its connection is a file, which does not break the
/// way a network connection does.
impl crate::backend::RetryRead for SqliteCoordinator {
    fn retry_read(&self, _: &crate::CoordinatorError) -> bool {
        false
    }
    fn read_retries(&self) -> u32 {
        0
    }
}

impl std::fmt::Debug for SqliteCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCoordinator")
            .field("clock", &self.clock)
            .field("max_commit_age", &self.max_commit_age)
            .field("read_pool", &self.readers.is_some())
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl SqliteCoordinator {
    /// What this coordinator did since it was opened.
    pub fn stats(&self) -> SqliteStats {
        let c = &self.counters;
        SqliteStats {
            retention_partitions_examined: c.retention_partitions.load(Ordering::Relaxed),
            retention_batches_read: c.retention_batches_read.load(Ordering::Relaxed),
        }
    }
}

crate::backend::sql_batch_coordinator! {
    /// Each call is one transaction: a write on the single writer (`BEGIN IMMEDIATE`, under the
    /// writer mutex), a query on a read connection.
    ///
    /// # Cancel safety
    ///
    /// A call's future may be dropped at any point; the writer mutex is released with it, so
    /// later calls are not blocked. A write dropped before its `COMMIT` was handed to SQLite rolls
    /// back (sqlx queues the `ROLLBACK` on the connection, ahead of any later call's statements):
    /// nothing applied. Once `COMMIT` was handed over, SQLite runs it whether or not anyone waits:
    /// a dropped `commit_file` may thus still apply, exactly as
    /// [`BatchCoordinator::commit_file`]'s "Cancel safety" says; treat it as
    /// [`CoordinatorError::OutcomeUnknown`]. Queries change nothing.
    SqliteCoordinator
}
