//! The raw-insert baselines of figures 2, 3 and 10: the rows a commit writes (one object row, one
//! row per batch), inserted by plain multi-row INSERT transactions on the same engine, with the
//! same settings, as the coordinator they are measured next to.

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::fig2_sqlite::{BATCH_BYTES, BATCH_RECORDS};
use crate::util::{now_ms, random_uuid};

/// One raw file: its object key and its batch rows, (partition id, base offset, byte offset).
#[derive(Debug)]
pub(crate) struct RawFile {
    key: String,
    rows: Vec<(i64, i64, i64)>,
}

impl RawFile {
    /// The object's size: a version byte and the batches.
    fn object_size(&self) -> i64 {
        1 + self.rows.len() as i64 * i64::from(BATCH_BYTES)
    }
}

/// The rows of successive raw files: batches round-robin over the partitions, each partition's
/// offsets continuing from its last batch.
#[derive(Debug)]
struct RawRows {
    /// The partitions' row ids.
    partition_ids: Vec<i64>,
    /// Each partition's next offset.
    hw: Vec<i64>,
    /// The partition of the next batch (modulo the count).
    next: usize,
    /// Files planned.
    files: u64,
}

impl RawRows {
    fn new(partition_ids: Vec<i64>) -> RawRows {
        let n = partition_ids.len();
        RawRows {
            partition_ids,
            hw: vec![0; n],
            next: 0,
            files: 0,
        }
    }

    /// The next file, of `n` batches.
    fn file(&mut self, n: usize) -> RawFile {
        let rows = (0..n)
            .map(|i| {
                let p = self.next % self.partition_ids.len();
                self.next += 1;
                let base = self.hw[p];
                self.hw[p] += i64::from(BATCH_RECORDS);
                (
                    self.partition_ids[p],
                    base,
                    1 + i as i64 * i64::from(BATCH_BYTES),
                )
            })
            .collect();
        self.files += 1;
        RawFile {
            key: format!("raw/{:09}", self.files),
            rows,
        }
    }
}

// -------------------------------------------------------------------------------------------------
// SQLite

/// Raw SQLite inserts: a file with the coordinator's schema (WAL, synchronous=FULL, foreign keys,
/// as the coordinator opens its own), one topic; per file `BEGIN IMMEDIATE`, the object row,
/// multi-row INSERTs of up to 500 batch rows, COMMIT.
#[derive(Debug)]
pub(crate) struct SqliteRaw {
    conn: sqlx::SqliteConnection,
    rows: RawRows,
    /// The batches' timestamps.
    ts: i64,
}

impl SqliteRaw {
    /// Creates the database at `path` with a topic of `partitions` partitions.
    pub(crate) async fn open(path: &std::path::Path, partitions: usize) -> SqliteRaw {
        let mut conn = match SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .connect()
            .await
        {
            Ok(c) => c,
            Err(e) => panic!("opening SQLite: {e}"),
        };
        if let Err(e) = diskless_coordinator::sqlite::migrator()
            .run(&mut conn)
            .await
        {
            panic!("schema: {e}");
        }
        let topic = random_uuid().hyphenated().to_string();
        for sql in [
            format!(
                "INSERT INTO topics (topic_id, name, partition_count, timestamp_type, \
                 retention_ms, retention_bytes, max_message_bytes, \
                 message_timestamp_before_max_ms, message_timestamp_after_max_ms) VALUES \
                 ('{topic}', 'raw', {partitions}, 0, -1, -1, 1048588, 9223372036854775807, \
                 3600000)"
            ),
            format!(
                "WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 \
                 < {partitions}) INSERT INTO partitions (partition_id, topic_id, partition, \
                 log_start_offset, high_watermark, byte_size) SELECT n + 1, '{topic}', n, 0, 0, \
                 0 FROM seq"
            ),
        ] {
            if let Err(e) = sqlx::query(AssertSqlSafe(sql)).execute(&mut conn).await {
                panic!("raw setup: {e}");
            }
        }
        SqliteRaw {
            conn,
            // Partition i is row i + 1 (see the insert above).
            rows: RawRows::new((1..=partitions as i64).collect()),
            ts: now_ms(),
        }
    }

    /// The next file of `n` batches, to [`write`](Self::write) later (so that a timed loop does
    /// not plan).
    pub(crate) fn plan(&mut self, n: usize) -> RawFile {
        self.rows.file(n)
    }

    /// Writes `file` in one transaction; returns how long the transaction took.
    pub(crate) async fn write(&mut self, file: &RawFile) -> Duration {
        let ts = self.ts;
        let start = Instant::now();
        let mut tx = match self.conn.begin_with("BEGIN IMMEDIATE").await {
            Ok(t) => t,
            Err(e) => panic!("begin: {e}"),
        };
        let object_id: i64 = match sqlx::query_scalar(
            "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, \
             owners, committed_at, marked_for_deletion_at) VALUES (?1, 1, ?2, ?2, '0', ?3, NULL) \
             RETURNING object_id",
        )
        .bind(&file.key)
        .bind(file.object_size())
        .bind(ts)
        .fetch_one(&mut *tx)
        .await
        {
            Ok(id) => id,
            Err(e) => panic!("object insert: {e}"),
        };
        for part in file.rows.chunks(500) {
            let row = format!("({})", vec!["?"; 14].join(","));
            let sql = format!(
                "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, \
                 byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, \
                 log_append_time, producer_id, producer_epoch, base_sequence, last_sequence) \
                 VALUES {}",
                vec![row; part.len()].join(",")
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (pid, base, off) in part {
                q = q
                    .bind(*pid)
                    .bind(base + i64::from(BATCH_RECORDS) - 1)
                    .bind(*base)
                    .bind(object_id)
                    .bind(*off)
                    .bind(i64::from(BATCH_BYTES))
                    .bind(ts)
                    .bind(ts + 5)
                    .bind(0i64)
                    .bind(-1i64)
                    .bind(-1i64)
                    .bind(-1i64)
                    .bind(-1i64)
                    .bind(-1i64);
            }
            if let Err(e) = q.execute(&mut *tx).await {
                panic!("batch insert: {e}");
            }
        }
        if let Err(e) = tx.commit().await {
            panic!("commit: {e}");
        }
        start.elapsed()
    }

    /// Plans and writes the next file of `n` batches; returns how long its transaction took.
    pub(crate) async fn file(&mut self, n: usize) -> Duration {
        let file = self.plan(n);
        self.write(&file).await
    }

    /// Closes the connection.
    pub(crate) async fn close(self) {
        let _ = self.conn.close().await;
    }
}

// -------------------------------------------------------------------------------------------------
// PostgreSQL

/// Raw PostgreSQL inserts into `schema.objects` and `schema.batches`: per file BEGIN, the object
/// row, multi-row INSERTs of up to 1,000 batch rows, COMMIT.
#[derive(Debug)]
pub(crate) struct PgRaw {
    schema: String,
    /// The coordinator's own tables (objects need owners; batches carry the running max).
    coordinator_layout: bool,
    rows: RawRows,
    /// The batches' timestamps.
    ts: i64,
}

impl PgRaw {
    /// Creates `schema` with plain tables (a primary key and one foreign key on the batches, figure
    /// 3's) for `partitions` partitions.
    pub(crate) async fn plain(
        conn: &mut PgConnection,
        schema: &str,
        partitions: usize,
    ) -> Result<PgRaw, sqlx::Error> {
        for sql in [
            format!("CREATE SCHEMA {schema}"),
            format!(
                "CREATE TABLE {schema}.objects (object_id BIGSERIAL PRIMARY KEY, object_key TEXT \
                 NOT NULL UNIQUE, uploader_broker_id INTEGER NOT NULL, object_size BIGINT NOT \
                 NULL, live_bytes BIGINT NOT NULL, committed_at BIGINT NOT NULL)"
            ),
            format!(
                "CREATE TABLE {schema}.batches (partition_id BIGINT NOT NULL, last_offset BIGINT \
                 NOT NULL, base_offset BIGINT NOT NULL, object_id BIGINT NOT NULL REFERENCES \
                 {schema}.objects, byte_offset BIGINT NOT NULL, byte_size INTEGER NOT NULL, \
                 base_timestamp BIGINT NOT NULL, max_timestamp BIGINT NOT NULL, timestamp_type \
                 SMALLINT NOT NULL, log_append_time BIGINT NOT NULL, producer_id BIGINT NOT NULL, \
                 producer_epoch SMALLINT NOT NULL, base_sequence INTEGER NOT NULL, last_sequence \
                 INTEGER NOT NULL, PRIMARY KEY (partition_id, last_offset))"
            ),
        ] {
            sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn).await?;
        }
        Ok(PgRaw {
            schema: schema.to_string(),
            coordinator_layout: false,
            rows: RawRows::new((0..partitions as i64).collect()),
            ts: now_ms(),
        })
    }

    /// The coordinator's tables in `schema`, rows into the partitions of `topic` (a topic of its
    /// own: the raw inserts do not move its partitions' bounds).
    pub(crate) async fn coordinator(
        conn: &mut PgConnection,
        schema: &str,
        topic: uuid::Uuid,
    ) -> Result<PgRaw, sqlx::Error> {
        let partition_ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT partition_id FROM {schema}.partitions WHERE topic_id = $1::text::uuid \
             ORDER BY partition"
        )))
        .bind(topic.hyphenated().to_string())
        .fetch_all(&mut *conn)
        .await?;
        Ok(PgRaw {
            schema: schema.to_string(),
            coordinator_layout: true,
            rows: RawRows::new(partition_ids),
            ts: now_ms(),
        })
    }

    /// The next file of `n` batches, to [`write`](Self::write) later (so that a timed loop does
    /// not plan).
    pub(crate) fn plan(&mut self, n: usize) -> RawFile {
        self.rows.file(n)
    }

    /// Writes `file` in one transaction; returns how long the transaction took.
    pub(crate) async fn write(
        &self,
        conn: &mut PgConnection,
        file: &RawFile,
    ) -> Result<Duration, sqlx::Error> {
        let ts = self.ts;
        let schema = &self.schema;
        let object_sql = if self.coordinator_layout {
            format!(
                "INSERT INTO {schema}.objects (object_key, uploader_broker_id, object_size, \
                 live_bytes, owners, committed_at) VALUES ($1, 1, $2, $2, '{{0}}', $3) \
                 RETURNING object_id"
            )
        } else {
            format!(
                "INSERT INTO {schema}.objects (object_key, uploader_broker_id, object_size, \
                 live_bytes, committed_at) VALUES ($1, 1, $2, $2, $3) RETURNING object_id"
            )
        };
        let columns = if self.coordinator_layout { 15 } else { 14 };
        let start = Instant::now();
        let mut tx = conn.begin().await?;
        let object_id: i64 = sqlx::query_scalar(AssertSqlSafe(object_sql))
            .bind(&file.key)
            .bind(file.object_size())
            .bind(ts)
            .fetch_one(&mut *tx)
            .await?;
        for part in file.rows.chunks(1000) {
            let values: Vec<String> = (0..part.len())
                .map(|i| {
                    let params: Vec<String> = (1..=columns)
                        .map(|c| format!("${}", i * columns + c))
                        .collect();
                    format!("({})", params.join(","))
                })
                .collect();
            let sql = format!(
                "INSERT INTO {schema}.batches (partition_id, last_offset, base_offset, object_id, \
                 byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, \
                 log_append_time, producer_id, producer_epoch, base_sequence, last_sequence{}) \
                 VALUES {}",
                if self.coordinator_layout {
                    ", max_timestamp_so_far"
                } else {
                    ""
                },
                values.join(",")
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (pid, base, off) in part {
                q = q
                    .bind(*pid)
                    .bind(base + i64::from(BATCH_RECORDS) - 1)
                    .bind(*base)
                    .bind(object_id)
                    .bind(*off);
                q = if self.coordinator_layout {
                    q.bind(i64::from(BATCH_BYTES))
                } else {
                    q.bind(BATCH_BYTES as i32)
                };
                q = q
                    .bind(ts)
                    .bind(ts + 5)
                    .bind(0i16)
                    .bind(-1i64)
                    .bind(-1i64)
                    .bind(-1i16)
                    .bind(-1i32)
                    .bind(-1i32);
                if self.coordinator_layout {
                    q = q.bind(ts + 5);
                }
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(start.elapsed())
    }

    /// Plans and writes the next file of `n` batches; returns how long its transaction took.
    pub(crate) async fn file(
        &mut self,
        conn: &mut PgConnection,
        n: usize,
    ) -> Result<Duration, sqlx::Error> {
        let file = self.plan(n);
        self.write(conn, &file).await
    }
}
