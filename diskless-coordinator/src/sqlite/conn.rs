//! Opening and closing a [`SqliteCoordinator`]: the schema migrations, the single write connection
//! and the read pool, and the event counters.

use super::SqliteCoordinator;
use super::options::{SqliteOptions, Synchronous};
use super::sql::{SqliteQuery, not_applied, unavailable};
use crate::{Clock, CoordinatorError};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, SqlSafeStr, Sqlite, Transaction};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};

/// Event counters behind [`SqliteCoordinator::stats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) retention_partitions: AtomicU64,
    pub(super) retention_batches_read: AtomicU64,
}

/// The embedded migrations: (version, description, SQL).
const MIGRATIONS: [(i64, &str, &str); 11] = [
    (
        1,
        "initial",
        include_str!("../../migrations/sqlite/0001_initial.sql"),
    ),
    (
        2,
        "batches object index",
        include_str!("../../migrations/sqlite/0002_batches_object_index.sql"),
    ),
    (
        3,
        "timestamp index",
        include_str!("../../migrations/sqlite/0003_timestamp_index.sql"),
    ),
    (
        4,
        "fences and producer expiry",
        include_str!("../../migrations/sqlite/0004_fences_producer_expiry.sql"),
    ),
    (
        5,
        "producer ids",
        include_str!("../../migrations/sqlite/0005_producer_ids.sql"),
    ),
    (
        6,
        "transactions",
        include_str!("../../migrations/sqlite/0006_transactions.sql"),
    ),
    (
        7,
        "tiered segments",
        include_str!("../../migrations/sqlite/0007_tiered_segments.sql"),
    ),
    (
        8,
        "topic compression",
        include_str!("../../migrations/sqlite/0008_topic_compression.sql"),
    ),
    (
        9,
        "open transaction number",
        include_str!("../../migrations/sqlite/0009_open_txn_seq.sql"),
    ),
    (
        10,
        "transaction records",
        include_str!("../../migrations/sqlite/0010_txn_records.sql"),
    ),
    (
        11,
        "topic compaction",
        include_str!("../../migrations/sqlite/0011_topic_compaction.sql"),
    ),
];

/// The embedded schema migrations, applied on open (sqlx's migrator, table `_sqlx_migrations`).
pub fn migrator() -> Migrator {
    Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    (*description).into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

impl SqliteCoordinator {
    /// Opens (creating it if allowed) the database file at `path`, applies pending migrations and
    /// sets WAL mode and the configured durability. Invalid `options` are refused
    /// ([`SqliteOptions::validate`]).
    pub async fn open(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        Self::open_with(
            SqliteConnectOptions::new().filename(path.as_ref()),
            options,
            clock,
        )
        .await
    }

    /// Like [`SqliteCoordinator::open`], with the database named by a URL such as
    /// `sqlite:///var/lib/diskless/coordinator.db` or `sqlite://data/coordinator.db`. In-memory URLs
    /// are refused (use [`SqliteCoordinator::in_memory`]): each connection would see its own
    /// database.
    pub async fn open_url(
        url: &str,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        if !url.starts_with("sqlite:") {
            return Err(CoordinatorError::InvalidRequest(format!(
                "{url}: not a sqlite: URL"
            )));
        }
        let parsed: SqliteConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| CoordinatorError::InvalidRequest(format!("{url}: {e}")))?;
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(CoordinatorError::InvalidRequest(format!(
                "{url}: in-memory URLs are not supported, use SqliteCoordinator::in_memory"
            )));
        }
        Self::open_with(parsed, options, clock).await
    }

    async fn open_with(
        base: SqliteConnectOptions,
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        options.validate()?;
        let base = base
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true)
            .statement_cache_capacity(options.statement_cache_capacity);
        let synchronous = match options.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Off => SqliteSynchronous::Off,
        };
        let writer_options = base
            .clone()
            .create_if_missing(options.create_if_missing)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous);
        let writer = writer_options.connect().await.map_err(unavailable)?;
        // A read connection that still counts a transaction when released (SQLite ended it by
        // itself after an I/O error and sqlx's ROLLBACK failed) is closed, not kept (see
        // `Writer::begin`).
        let readers = SqlitePoolOptions::new()
            .after_release(|conn, _| {
                Box::pin(async move {
                    conn.ping().await?;
                    Ok(!conn.is_in_transaction())
                })
            })
            .max_connections(options.read_connections)
            .min_connections(0)
            .acquire_timeout(options.busy_timeout.max(Duration::from_secs(1)))
            .connect_lazy_with(base.read_only(true));
        Self::migrated(writer, Some(writer_options), Some(readers), &options, clock).await
    }

    /// A private in-memory database (for tests): nothing survives the coordinator, and reads share
    /// the write connection.
    pub async fn in_memory(clock: Arc<dyn Clock>) -> Result<Self, CoordinatorError> {
        Self::in_memory_with(SqliteOptions::default(), clock).await
    }

    /// Like [`SqliteCoordinator::in_memory`], with options (of which `statement_cache_capacity` and
    /// `max_commit_age` apply; the others concern database files, but are validated all the same).
    pub async fn in_memory_with(
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        options.validate()?;
        let writer = SqliteConnectOptions::new()
            .in_memory(true)
            .foreign_keys(true)
            .statement_cache_capacity(options.statement_cache_capacity)
            .connect()
            .await
            .map_err(unavailable)?;
        Self::migrated(writer, None, None, &options, clock).await
    }

    /// Applies the pending migrations on `writer` and makes the coordinator.
    async fn migrated(
        mut writer: SqliteConnection,
        writer_options: Option<SqliteConnectOptions>,
        readers: Option<sqlx::sqlite::SqlitePool>,
        options: &SqliteOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CoordinatorError> {
        migrator()
            .run(&mut writer)
            .await
            .map_err(|e| CoordinatorError::Storage(Box::new(e)))?;
        Ok(SqliteCoordinator {
            clock,
            max_commit_age: options.max_commit_age,
            writer: Mutex::new(Some(writer)),
            writer_options,
            readers,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    /// Closes the connections, waiting for a write in progress. Later calls fail with
    /// [`CoordinatorError::Closed`].
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(conn) = self.writer.lock().await.take()
            && let Err(e) = conn.close().await
        {
            tracing::warn!(error = %e, "closing the SQLite write connection failed");
        }
        if let Some(pool) = &self.readers {
            pool.close().await;
        }
    }

    /// The write connection, once the writer mutex is held.
    pub(super) async fn write(&self) -> Result<Writer<'_>, CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(CoordinatorError::Closed);
        }
        Ok(Writer {
            conn: self.writer.lock().await,
            reopen: self.writer_options.as_ref(),
        })
    }

    /// The rows of one query, on a read connection.
    pub(super) async fn read_rows(
        &self,
        query: SqliteQuery,
    ) -> Result<Vec<SqliteRow>, CoordinatorError> {
        let mut reader = self.read().await?;
        query.fetch_all(reader.conn()?).await.map_err(not_applied)
    }

    /// The row of one query, if any, on a read connection.
    pub(super) async fn read_row(
        &self,
        query: SqliteQuery,
    ) -> Result<Option<SqliteRow>, CoordinatorError> {
        let mut reader = self.read().await?;
        query
            .fetch_optional(reader.conn()?)
            .await
            .map_err(not_applied)
    }

    /// A connection to read on.
    pub(super) async fn read(&self) -> Result<Reader<'_>, CoordinatorError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(CoordinatorError::Closed);
        }
        match &self.readers {
            Some(pool) => pool.acquire().await.map(Reader::Pool).map_err(unavailable),
            None => Ok(Reader::Writer(self.writer.lock().await)),
        }
    }
}

/// The single write connection, held (the writer mutex) until dropped.
pub(super) struct Writer<'a> {
    conn: MutexGuard<'a, Option<SqliteConnection>>,
    /// How to open the write connection again (`None`: an in-memory database, which a new
    /// connection would not see).
    reopen: Option<&'a SqliteConnectOptions>,
}

impl Writer<'_> {
    /// Starts the write transaction of a call (`BEGIN IMMEDIATE`: SQLite's write lock is taken
    /// now, so the call's reads see what it will write on). Dropping it rolls back.
    ///
    /// A write connection that still counts a transaction of an earlier call is replaced by a new
    /// one first. That happens when SQLite rolled a transaction back by itself: a COMMIT or a
    /// statement failing with `SQLITE_FULL` (disk full) or `SQLITE_IOERR` may end the
    /// transaction, after which sqlx's ROLLBACK (on dropping the `Transaction`) fails with "no
    /// transaction is active" and sqlx keeps counting one. Every later `BEGIN IMMEDIATE` would
    /// fail ("begin_with at non-zero transaction depth") and the coordinator would take no write
    /// again, however much disk is freed. Found by the fault campaign (chaos/, `disk-full`); the
    /// test is `sqlite::tests::a_transaction_sqlite_ended_does_not_block_later_writes`.
    pub(super) async fn begin(&mut self) -> Result<Transaction<'_, Sqlite>, CoordinatorError> {
        let conn = self.conn.as_mut().ok_or(CoordinatorError::Closed)?;
        // A transaction dropped by the previous call queued its ROLLBACK, which the connection
        // runs in order: a ping (also in order) lets it run, so that only a ROLLBACK that failed
        // leaves the count up.
        if conn.is_in_transaction() {
            conn.ping().await.map_err(not_applied)?;
        }
        let stuck = conn.is_in_transaction();
        if stuck {
            let options = self.reopen.ok_or_else(|| {
                CoordinatorError::Storage(
                    "the in-memory database's write connection is stuck in a transaction SQLite \
                     ended by itself; it cannot be reopened"
                        .into(),
                )
            })?;
            tracing::warn!(
                "the SQLite write connection still counted a transaction SQLite had ended \
                 (a disk-full or I/O error?); opening a new write connection"
            );
            let fresh = options.connect().await.map_err(unavailable)?;
            if let Some(old) = self.conn.replace(fresh)
                && let Err(e) = old.close_hard().await
            {
                tracing::debug!(error = %e, "closing the stuck write connection");
            }
        }
        self.conn
            .as_mut()
            .ok_or(CoordinatorError::Closed)?
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(not_applied)
    }
}

/// A connection to read on: from the pool, or the writer for in-memory databases.
pub(super) enum Reader<'a> {
    Pool(PoolConnection<Sqlite>),
    Writer(MutexGuard<'a, Option<SqliteConnection>>),
}

impl Reader<'_> {
    /// The connection.
    pub(super) fn conn(&mut self) -> Result<&mut SqliteConnection, CoordinatorError> {
        match self {
            Reader::Pool(c) => Ok(&mut **c),
            Reader::Writer(g) => g.as_mut().ok_or(CoordinatorError::Closed),
        }
    }

    /// Starts a read transaction: the call's reads see one snapshot.
    pub(super) async fn begin(&mut self) -> Result<Transaction<'_, Sqlite>, CoordinatorError> {
        self.conn()?.begin().await.map_err(not_applied)
    }
}
