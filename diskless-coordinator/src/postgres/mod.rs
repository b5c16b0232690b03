//! The PostgreSQL batch coordinator: many brokers, one source of truth.
//!
//! See [`PostgresCoordinator`] and [`PostgresOptions`]. Where each part lives:
//!
//! - `options.rs`: [`PostgresOptions`] and the connection and pool options made from them;
//! - `attempt.rs`: what a database error means for a call, the attempts of a write and their
//!   retry after a conflict, and the other guards of every call (closed, the primary's pool);
//! - `sql.rs`: SQL fragments and row readers several modules share (the read transaction's
//!   `BEGIN`, the last stable offset, the effective timestamp, partition arrays, object kinds);
//! - `conn.rs`: connecting (migrations, pools, the replica heartbeat), closing, and the event
//!   counters;
//! - `migrate.rs`: the embedded migrations and how they are applied; `migrate/functions.rs` +
//!   `functions.sql`: the server-side functions, defined once, re-applied after the migrations;
//! - `topics.rs`: `create_topic`, `delete_topic`, `create_partitions`, `alter_topic_config`,
//!   `allocate_producer_ids` (one `UPDATE ... RETURNING` of a counter row, migration 8);
//! - `commit.rs`: `commit_file` (one call of the server-side function);
//! - `txn.rs`: `write_txn_markers` (one call of the server-side function, migration 11);
//! - `reads.rs`: `find_batches`, `list_offsets` (both with the last stable offset and
//!   `read_committed`), `list_topics` (on a replica when configured) and the queries that read
//!   the primary (`list_producers` among them);
//! - `lifecycle.rs`: DeleteRecords, retention, producer expiry, object deletion and orphan fences
//!   (over both tiers: segments go as a prefix before WAL batches);
//! - `tiering.rs`: tiered segments (issue #15, migration 13): `tiering_candidates`,
//!   `segment_plan`, `register_segment` (one call of the server-side function at the commit
//!   point), `list_tiered_segments`.
//!
//! Each [`BatchCoordinator`] method `x` is `write_x` or `read_x` in one of those files; a write
//! runs its attempts (`try_x`, one transaction each) through `PostgresCoordinator::retrying`, which
//! retries them after a conflict.
//!
//! The modules use each other without a cycle, each only those below it (`tests/module_graph.rs`
//! checks it): `options`, `attempt` and `sql` use none; `migrate` uses `options` and `attempt`;
//! `commit`, `txn`, `lifecycle`, `topics`, `tiering` and `reads` use `attempt`, `sql` and each
//! other in that order (`txn` → `commit`, `topics` → `lifecycle`, `tiering` → `commit` and
//! `topics`, `reads` → `tiering` and `topics`); `conn` uses `attempt`, `migrate`, `options` and
//! `reads` (the replica heartbeat); this file uses them all. The methods of
//! [`PostgresCoordinator`] are spread over the modules (`impl` blocks), which therefore name the
//! type defined here, and nothing else of this file.

mod attempt;
mod commit;
mod conn;
mod lifecycle;
mod migrate;
mod options;
mod reads;
mod sql;
mod tiering;
mod topics;
mod txn;
mod txn_record;

pub use conn::migrate;
pub use options::{DEFAULT_SCHEMA, PostgresOptions};

use crate::Clock;
#[cfg(doc)]
use crate::{BatchCoordinator, CoordinatorError};
use conn::Counters;
use sqlx::postgres::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A [`BatchCoordinator`] on PostgreSQL: one source of truth for many brokers.
///
/// - **One round trip per commit**: [`BatchCoordinator::commit_file`] is a single call of the
///   server-side function `commit_file` (PL/pgSQL, created by the migrations) taking the batches as
///   arrays. It registers the object and appends every batch in one implicit transaction, applying
///   offsets, LogAppendTime (the coordinator clock's time, passed in: the injected [`Clock`] stays
///   the source of time), the idempotent-producer rules and the transaction rules, and returns one
///   row per batch.
/// - **Transactions** (KIP-98, the partition leader's part): a transactional batch opens or
///   continues its producer's transaction in the partition, decided in the commit function;
///   [`BatchCoordinator::write_txn_markers`] is one call of the server-side function
///   `write_txn_markers`, which locks partitions in the same order as commits (they cannot
///   deadlock) and appends marker rows without object, ending transactions and recording aborted
///   ones. The last stable offset is not stored: it is computed when read, from the open
///   transactions' first offsets (one probe of a partial index).
/// - **Correct under concurrency without SERIALIZABLE**: a commit locks the rows of the partitions it
///   touches `FOR UPDATE`, in (topic id, partition) order, under READ COMMITTED; every other writer
///   (DeleteRecords, retention, topic deletion) locks partitions in the same order and the objects it
///   releases in object id order, so writers cannot deadlock. Should PostgreSQL still report a
///   serialization failure (40001) or a deadlock (40P01) — both mean nothing was applied — the call
///   is retried up to [`PostgresOptions::max_conflict_retries`] times. Nothing else is retried.
/// - **Honest failures**: an error before anything was sent (no connection, pool exhausted) is
///   [`CoordinatorError::Unavailable`]; a lost connection once a commit (or any statement that
///   commits) was sent is [`CoordinatorError::OutcomeUnknown`] — the caller must not assume either
///   outcome; an idempotent producer's retry is safe (it is recognised as a duplicate).
/// - **The commit point**: inside the commit function, once every lock of the commit is held (the
///   key's advisory lock, its object row, its partitions' rows), the server checks the commit
///   deadline against its own clock ([`PostgresOptions::max_commit_age`]) and the orphan fences
///   ([`BatchCoordinator::fence_orphans`]), and refuses the whole commit
///   ([`CoordinatorError::DeadlineExceeded`], [`CoordinatorError::ObjectFenced`]: nothing
///   applied). `fence_orphans` takes the same per-key advisory locks, so a fence and a commit of a
///   key serialize under READ COMMITTED: never both succeed. Deleting an object row
///   (`confirm_deleted`) fences its key in the same transaction (a trigger, migration 6), so a
///   deleted object is never committed again. Fence expiry reads the server's clock too, and keeps
///   fences for twice the largest `max_commit_age` any coordinator of the schema connected with
///   (see [`PostgresOptions::max_commit_age`]). Everything else (commit times, LogAppendTime, retention, producer expiry) reads
///   the injected [`Clock`].
/// - **Reads never block commits**: `find_batches`, `list_offsets` and `list_topics` run on a
///   separate pool, optionally on a read replica ([`PostgresOptions::read_url`]), each call on one
///   snapshot. A replica is read only while its measured lag is within
///   [`PostgresOptions::max_replica_lag`] (else the primary answers), and what it would answer as
///   out of range, unknown or without the timestamp is asked again on the primary. Queries whose
///   staleness could lose data (`known_objects`, `objects_to_delete`, `object_info`,
///   `producer_state`) always read the primary (through the read pool when it points at the
///   primary).
/// - **Bounded maintenance**: `enforce_retention` and `expire_producers` visit candidate
///   partitions page by page in the global lock order and stop as soon as their budget is spent,
///   so they hold row locks for work bounded by the budget. ListOffsets by timestamp costs a
///   bounded number of index probes (see migrations 3 and 4).
/// - **Schema**: everything lives in one schema ([`PostgresOptions::schema`]), set as the
///   connections' `search_path`; embedded migrations are recorded in `schema_migrations` there and
///   applied by [`migrate`] (explicitly, or on start). Migrations only add objects and run with a
///   short `lock_timeout` (index builds run `CONCURRENTLY`), so they never hold long exclusive
///   locks on a live table.
///
/// The semantics are those of the conformance suite in `diskless-testkit` (Kafka's, at batch
/// granularity), which this implementation passes, as it passes the model-based test against the
/// reference model.
///
/// # Example
/// ```no_run
/// use diskless_coordinator::postgres::{PostgresCoordinator, PostgresOptions};
/// use diskless_coordinator::*;
/// use std::sync::Arc;
///
/// # async fn example() -> Result<(), CoordinatorError> {
/// let options = PostgresOptions::new("postgres://diskless@db.internal:5432/kafka")
///     .with_schema("diskless")
///     .with_read_url("postgres://diskless@db-replica.internal:5432/kafka")
///     .with_max_connections(20);
/// let coordinator = PostgresCoordinator::connect(options, Arc::new(SystemClock)).await?;
///
/// let topic_id = uuid::Uuid::from_u128(42);
/// coordinator
///     .create_topic(CreateTopicRequest {
///         topic_id,
///         name: "orders".into(),
///         partitions: 3,
///         config: TopicConfig::default(),
///     })
///     .await?;
/// let results = coordinator
///     .commit_file(CommitFileRequest {
///         object_key: "wal/0001".into(),
///         uploader_broker_id: 1,
///         object_size: 101,
///         owners: vec![0],
///         batches: vec![CommitBatch {
///             partition: TopicIdPartition::new(topic_id, 0),
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
/// assert_eq!(results[0].base_offset, 0);
/// coordinator.close().await;
/// # Ok(())
/// # }
/// ```
pub struct PostgresCoordinator {
    clock: Arc<dyn Clock>,
    options: PostgresOptions,
    write: PgPool,
    read: PgPool,
    closed: AtomicBool,
    counters: Counters,
    /// After a replica failure: reads skip the replica until then.
    replica_retry_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The task writing the primary heartbeat (with a read replica only).
    heartbeat: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What a [`PostgresCoordinator`] did since it connected (for monitoring).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Transactions retried after a serialization failure or deadlock (with the fixed lock order
    /// this stays 0 for commits).
    pub conflict_retries: u64,
    /// Reads run on the read replica ([`PostgresOptions::read_url`]).
    pub replica_reads: u64,
    /// Reads run on the primary although a replica is configured: it lagged more than
    /// [`PostgresOptions::max_replica_lag`], held no heartbeat, or failed.
    pub replica_bypassed: u64,
    /// Replica reads that asked the primary again about partitions the replica answered as out
    /// of range, unknown or without the timestamp.
    pub primary_rechecks: u64,
    /// Partitions examined by retention passes (a pass stops as soon as its budget is spent).
    pub retention_partitions_examined: u64,
}

impl Drop for PostgresCoordinator {
    fn drop(&mut self) {
        self.stop_heartbeat();
    }
}

impl std::fmt::Debug for PostgresCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCoordinator")
            .field("options", &self.options)
            .field("clock", &self.clock)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl PostgresCoordinator {
    /// The options this coordinator was connected with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// How many transactions were retried after a serialization failure or deadlock since connect
    /// (for monitoring: with the fixed lock order this stays 0 for commits).
    pub fn conflict_retries(&self) -> u64 {
        self.counters.conflict_retries.load(Ordering::Relaxed)
    }

    /// What this coordinator did since it connected.
    pub fn stats(&self) -> PostgresStats {
        let c = &self.counters;
        PostgresStats {
            conflict_retries: c.conflict_retries.load(Ordering::Relaxed),
            replica_reads: c.replica_reads.load(Ordering::Relaxed),
            replica_bypassed: c.replica_bypassed.load(Ordering::Relaxed),
            primary_rechecks: c.primary_rechecks.load(Ordering::Relaxed),
            retention_partitions_examined: c.retention_partitions.load(Ordering::Relaxed),
        }
    }
}

crate::backend::sql_batch_coordinator! {
    /// Writes are attempts retried after a conflict ([`PostgresOptions::max_conflict_retries`]);
    /// reads run on one snapshot.
    ///
    /// # Cancel safety
    ///
    /// A call's future may be dropped at any point. Dropped before its statement reached the
    /// server, it applies nothing. After that the server runs the statement to its end whether or
    /// not anyone waits for the answer: a dropped `commit_file` (one autocommit call of the
    /// server-side commit function) applies if the function passes its commit point, exactly as
    /// [`BatchCoordinator::commit_file`]'s "Cancel safety" says; treat it as
    /// [`CoordinatorError::OutcomeUnknown`]. A multi-statement write (DeleteRecords, retention,
    /// topic deletion, producer expiry) dropped before its `COMMIT` was sent is rolled back (sqlx
    /// queues the `ROLLBACK` before the connection serves another call); dropped once `COMMIT` was
    /// sent, it may apply. Queries change nothing.
    PostgresCoordinator
}
