//! `commit_file`: one write transaction of a fixed handful of statements whatever the batch count.
//! The commit point (deadline and fences) first; then every touched partition and producer state
//! is read at once, every batch is decided in memory in request order (producer fields, then the
//! idempotent-producer rules, then the transaction rules: `producer.rs`), and the object, the
//! batches, the producer states (with their open transactions: the last stable offset is read
//! from them) and the partitions are written back in multi-row statements.

use super::SqliteCoordinator;
use super::producer::{self, Decision, STATE_COLUMNS};
use super::sql::{at_commit, encode_owners, execute_rows, fetch_pairs, not_applied};
use crate::rows::{SqlRow, parse_topic_id, topic_key, ts_type, ts_type_code};
use crate::{
    CommitBatch, CommitBatchResult, CommitFileRequest, CoordinatorError, ErrorCode, NO_TIMESTAMP,
    ProducerBatch, ProducerState, TimestampType, TopicIdPartition, check_commit_deadline,
    producer_field_error,
};
use sqlx::sqlite::SqliteConnection;
use std::collections::{HashMap, HashSet};

/// A partition as a commit (or a marker) sees it.
pub(super) struct CommitPartition {
    pub(super) partition_id: i64,
    pub(super) log_start_offset: i64,
    pub(super) high_watermark: i64,
    pub(super) byte_size: i64,
    /// The running max of the effective max timestamps of all batches appended so far.
    pub(super) max_timestamp_so_far: i64,
    pub(super) timestamp_type: TimestampType,
    /// Whether it grew (to be written back).
    pub(super) touched: bool,
}

/// A batch a commit appends.
struct AppendedBatch<'a> {
    partition_id: i64,
    base_offset: i64,
    last_offset: i64,
    log_append_time: i64,
    timestamp_type: TimestampType,
    effective_max_timestamp: i64,
    max_timestamp_so_far: i64,
    batch: &'a CommitBatch,
}

/// A producer's state as a commit (or a marker) sees it.
#[derive(Default)]
pub(super) struct CommitProducer {
    /// The state, `None` when the producer has none in the partition.
    pub(super) state: Option<ProducerState>,
    /// Whether it changed (to be written back).
    pub(super) touched: bool,
}

/// What a commit decided in memory: one result per batch, the batches to append and the bytes
/// they add to the object.
struct Decided<'a> {
    results: Vec<CommitBatchResult>,
    appended: Vec<AppendedBatch<'a>>,
    live_bytes: i64,
}

/// The partitions a call touches, by partition.
pub(super) type Partitions = HashMap<TopicIdPartition, CommitPartition>;
/// The producer states a call touches, by (partition id, producer id).
pub(super) type Producers = HashMap<(i64, i64), CommitProducer>;

impl SqliteCoordinator {
    pub(super) async fn write_commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        let asked = std::time::Instant::now();
        let mut writer = self.write().await?;
        let locked = std::time::Instant::now();
        let mut tx = writer.begin().await?;
        let begun = std::time::Instant::now();
        // The commit point. The writer mutex and SQLite's write lock are held from here to COMMIT,
        // so the clock is read here, after any wait for them: a commit that waited past its
        // deadline is refused, and a fence recorded before this point is seen. Returning an error
        // drops the transaction, which rolls it back: nothing is applied.
        let now = self.clock.now_ms();
        check_commit_deadline(&request.object_key, now, self.max_commit_age)?;
        let fenced = sqlx::query("SELECT 1 FROM fences WHERE object_key = ?1")
            .bind(&request.object_key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        if fenced.is_some() {
            return Err(CoordinatorError::ObjectFenced(request.object_key));
        }
        let mut partitions =
            load_partitions(&mut tx, request.batches.iter().map(|b| b.partition)).await?;
        let mut seen = HashSet::new();
        let wanted: Vec<(i64, i64)> = request
            .batches
            .iter()
            .filter(|b| b.is_idempotent())
            .filter_map(|b| Some((partitions.get(&b.partition)?.partition_id, b.producer_id)))
            .filter(|key| seen.insert(*key))
            .collect();
        let mut producers = load_producers(&mut tx, &wanted).await?;
        let decided = decide(&request, &mut partitions, &mut producers, now);
        // A key is committed once: the object row is the guard.
        let Some(object_id) = insert_object(&mut tx, &request, decided.live_bytes, now).await?
        else {
            return Err(CoordinatorError::ObjectAlreadyCommitted(request.object_key));
        };
        insert_batches(&mut tx, object_id, &decided.appended).await?;
        write_back(&mut tx, &producers, &partitions).await?;
        let statements = std::time::Instant::now();
        tx.commit().await.map_err(at_commit)?;
        // The commit's time split: queued behind other writes of this process (the writer
        // mutex), BEGIN IMMEDIATE (other processes), the statements, COMMIT (the fsync, and now
        // and then a WAL checkpoint). `RUST_LOG=diskless_coordinator::sqlite::commit=debug`.
        let us = |from: std::time::Instant, to: std::time::Instant| {
            to.saturating_duration_since(from).as_micros() as u64
        };
        tracing::debug!(
            batches = request.batches.len(),
            lock_wait_us = us(asked, locked),
            begin_us = us(locked, begun),
            statements_us = us(begun, statements),
            commit_us = us(statements, std::time::Instant::now()),
            "commit_file timing"
        );
        Ok(decided.results)
    }
}

/// Every partition of `touched` that exists, in one statement per
/// [`CHUNK`](super::sql::CHUNK) partitions.
pub(super) async fn load_partitions(
    conn: &mut SqliteConnection,
    touched: impl IntoIterator<Item = TopicIdPartition>,
) -> Result<Partitions, CoordinatorError> {
    let mut seen = HashSet::new();
    let wanted: Vec<(String, i32)> = touched
        .into_iter()
        .filter(|p| p.partition >= 0 && seen.insert(*p))
        .map(|p| (topic_key(p.topic_id), p.partition))
        .collect();
    let sql = "SELECT p.topic_id, p.partition, p.partition_id, p.log_start_offset, \
         p.high_watermark, p.byte_size, t.timestamp_type, p.max_timestamp_so_far \
         FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
         WHERE (p.topic_id, p.partition) IN (VALUES {values})";
    let mut partitions = Partitions::new();
    for row in fetch_pairs(conn, sql, &wanted).await? {
        let p = TopicIdPartition::new(parse_topic_id(&row.string_at(0)?)?, row.i32_at(1)?);
        let partition = CommitPartition {
            partition_id: row.i64_at(2)?,
            log_start_offset: row.i64_at(3)?,
            high_watermark: row.i64_at(4)?,
            byte_size: row.i64_at(5)?,
            timestamp_type: ts_type(row.i16_at(6)?)?,
            max_timestamp_so_far: row.i64_at(7)?,
            touched: false,
        };
        partitions.insert(p, partition);
    }
    Ok(partitions)
}

/// The producer states of `(partition id, producer id)`s (distinct), in one statement per
/// [`CHUNK`](super::sql::CHUNK) keys: an entry for each key, with no state when the producer has
/// none there.
pub(super) async fn load_producers(
    conn: &mut SqliteConnection,
    wanted: &[(i64, i64)],
) -> Result<Producers, CoordinatorError> {
    let mut producers: Producers = wanted
        .iter()
        .map(|k| (*k, CommitProducer::default()))
        .collect();
    let sql = format!(
        "SELECT partition_id, producer_id, {STATE_COLUMNS} \
         FROM producer_state WHERE (partition_id, producer_id) IN (VALUES {{values}})"
    );
    for row in fetch_pairs(conn, &sql, wanted).await? {
        let key = (row.i64_at(0)?, row.i64_at(1)?);
        if let Some(entry) = producers.get_mut(&key) {
            entry.state = Some(producer::state_from_row(&row, 2, key.1)?);
        }
    }
    Ok(producers)
}

/// Decides every batch in memory, in request order, updating the partitions and producer states
/// it appends to.
fn decide<'a>(
    request: &'a CommitFileRequest,
    partitions: &mut Partitions,
    producers: &mut Producers,
    now: i64,
) -> Decided<'a> {
    let mut decided = Decided {
        results: Vec::with_capacity(request.batches.len()),
        appended: Vec::new(),
        live_bytes: 0,
    };
    for batch in &request.batches {
        let Some(part) = partitions.get_mut(&batch.partition) else {
            decided
                .results
                .push(CommitBatchResult::error(ErrorCode::UnknownTopicOrPartition));
            continue;
        };
        // What the producer controls is judged per batch: a bad batch is rejected alone.
        if let Some(code) = producer_field_error(batch) {
            decided.results.push(CommitBatchResult::error(code));
            continue;
        }
        // A transactional batch needs a producer id (the model checks this first; the
        // idempotent rules below do not apply to a batch without one anyway).
        if batch.transactional && !batch.is_idempotent() {
            decided
                .results
                .push(CommitBatchResult::error(ErrorCode::InvalidRecord));
            continue;
        }
        let producer = if batch.is_idempotent() {
            producers.get_mut(&(part.partition_id, batch.producer_id))
        } else {
            None
        };
        if let Some(producer) = &producer {
            match producer::decide(producer.state.as_ref(), batch) {
                Decision::Append => {}
                Decision::Duplicate(kept) => {
                    decided.results.push(CommitBatchResult {
                        error: ErrorCode::None,
                        base_offset: kept.base_offset,
                        log_append_time: kept.log_append_time,
                        log_start_offset: part.log_start_offset,
                        duplicate: true,
                    });
                    continue;
                }
                Decision::Reject(code) => {
                    decided.results.push(CommitBatchResult::error(code));
                    continue;
                }
            }
        }
        // The transaction rules, after duplicate, epoch and sequence (as Kafka orders them).
        let opens_txn =
            match producer::check_txn(producer.as_ref().and_then(|p| p.state.as_ref()), batch) {
                Ok(opens) => opens,
                Err(code) => {
                    decided.results.push(CommitBatchResult::error(code));
                    continue;
                }
            };
        let base_offset = part.high_watermark;
        let last_offset = base_offset + i64::from(batch.record_count) - 1;
        let (log_append_time, effective_max_timestamp) = match part.timestamp_type {
            TimestampType::LogAppendTime => (now, now),
            TimestampType::CreateTime => (NO_TIMESTAMP, batch.max_timestamp),
        };
        part.high_watermark = last_offset + 1;
        part.byte_size += i64::from(batch.byte_size);
        part.max_timestamp_so_far = part.max_timestamp_so_far.max(effective_max_timestamp);
        part.touched = true;
        decided.live_bytes += i64::from(batch.byte_size);
        if let Some(producer) = producer {
            producer::record(
                &mut producer.state,
                batch,
                ProducerBatch {
                    base_sequence: batch.base_sequence,
                    last_sequence: batch.last_sequence,
                    base_offset,
                    last_offset,
                    log_append_time,
                },
                now,
                opens_txn,
            );
            producer.touched = true;
        }
        decided.appended.push(AppendedBatch {
            partition_id: part.partition_id,
            base_offset,
            last_offset,
            log_append_time,
            timestamp_type: part.timestamp_type,
            effective_max_timestamp,
            max_timestamp_so_far: part.max_timestamp_so_far,
            batch,
        });
        decided.results.push(CommitBatchResult {
            error: ErrorCode::None,
            base_offset,
            log_append_time,
            log_start_offset: part.log_start_offset,
            duplicate: false,
        });
    }
    decided
}

/// Registers the object; `None` when its key was committed before.
async fn insert_object(
    conn: &mut SqliteConnection,
    request: &CommitFileRequest,
    live_bytes: i64,
    now: i64,
) -> Result<Option<i64>, CoordinatorError> {
    sqlx::query_scalar(
        "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
         committed_at, marked_for_deletion_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (object_key) DO NOTHING RETURNING object_id",
    )
    .bind(&request.object_key)
    .bind(request.uploader_broker_id)
    // Validated: object_size <= i64::MAX.
    .bind(request.object_size as i64)
    .bind(live_bytes)
    .bind(encode_owners(&request.owners))
    .bind(now)
    .bind((live_bytes == 0).then_some(now))
    .fetch_optional(&mut *conn)
    .await
    .map_err(not_applied)
}

/// The appended batches, [`CHUNK`](super::sql::CHUNK) rows per statement.
async fn insert_batches(
    conn: &mut SqliteConnection,
    object_id: i64,
    appended: &[AppendedBatch<'_>],
) -> Result<(), CoordinatorError> {
    let sql = "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, \
         byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, log_append_time, \
         producer_id, producer_epoch, base_sequence, last_sequence, effective_max_timestamp, \
         max_timestamp_so_far) VALUES {values}";
    execute_rows(conn, sql, 16, appended, |q, a| {
        let b = a.batch;
        q.bind(a.partition_id)
            .bind(a.last_offset)
            .bind(a.base_offset)
            .bind(object_id)
            // Validated: byte_offset + byte_size <= object_size <= i64::MAX.
            .bind(b.byte_offset as i64)
            .bind(i64::from(b.byte_size))
            .bind(b.base_timestamp)
            .bind(b.max_timestamp)
            .bind(ts_type_code(a.timestamp_type))
            .bind(a.log_append_time)
            .bind(b.producer_id)
            .bind(b.producer_epoch)
            .bind(b.base_sequence)
            .bind(b.last_sequence)
            .bind(a.effective_max_timestamp)
            .bind(a.max_timestamp_so_far)
    })
    .await
}

/// The producer states that changed, and the partitions that grew.
pub(super) async fn write_back(
    conn: &mut SqliteConnection,
    producers: &Producers,
    partitions: &Partitions,
) -> Result<(), CoordinatorError> {
    let changed: Vec<((i64, i64), &ProducerState)> = producers
        .iter()
        .filter(|(_, p)| p.touched)
        .filter_map(|(k, p)| p.state.as_ref().map(|s| (*k, s)))
        .collect();
    producer::upsert_states(conn, &changed).await?;
    let grown: Vec<&CommitPartition> = partitions.values().filter(|p| p.touched).collect();
    let sql = "UPDATE partitions SET high_watermark = v.column2, byte_size = v.column3, \
         max_timestamp_so_far = v.column4 \
         FROM (VALUES {values}) AS v WHERE partitions.partition_id = v.column1";
    execute_rows(conn, sql, 4, &grown, |q, p| {
        q.bind(p.partition_id)
            .bind(p.high_watermark)
            .bind(p.byte_size)
            .bind(p.max_timestamp_so_far)
    })
    .await
}
