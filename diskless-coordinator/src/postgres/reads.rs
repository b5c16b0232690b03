//! Reads (`find_batches`, `list_offsets`, `list_topics`), on a read replica when one is configured.
//!
//! A streaming replica lags its primary. Two rules keep that harmless (issue #12 item 7):
//!
//! - **Bounded lag.** Every read transaction on the replica first reads, in its own snapshot, the
//!   replica's clock minus the primary's heartbeat it holds (`replica_heartbeat`, written on the
//!   primary by [`heartbeat_loop`]): an upper bound of how stale that snapshot is. Above
//!   [`PostgresOptions::max_replica_lag`] (or without a heartbeat, or when the replica fails) the
//!   read runs on the primary instead, and fails with [`CoordinatorError::Unavailable`] (retriable)
//!   when the primary cannot be reached. Since the bound is below the object cleaner's deletion
//!   grace period, a batch the replica still shows was live on the primary less than the grace
//!   period ago: its object has not been deleted physically.
//! - **No false "out of range".** A partition the replica answers with `OFFSET_OUT_OF_RANGE` or
//!   `UNKNOWN_TOPIC_OR_PARTITION` (find_batches), or unknown or without a batch at the timestamp
//!   (list_offsets), is asked again on the primary, whose answer is final. A consumer whose position
//!   came from a fresher view than the replica's therefore never resets it; Kafka's fetch from a
//!   follower (KIP-392) answers such a fetch with an empty response instead.

use super::PostgresCoordinator;
use super::attempt::sql_error;
use super::sql::{BEGIN_READ, EFFECTIVE_TS, LAST_STABLE_OFFSET, object_kind, partition_arrays};
use super::tiering::segments_from;
use super::topics::{topic_columns, topic_from_row};
use crate::rows::{
    OBJECT_INFO, SqlRow, batch_columns, batch_from_row, col, corrupt, object_info_from_row,
    topic_key,
};
use crate::rules::{in_request_order, list_offsets_answer, looks_up_batch};
use crate::{
    AbortedTxn, BatchCoordinate, CoordinatorError, ErrorCode, FindBatchesRequest,
    FindBatchesResponse, IsolationLevel, ListOffsetsRequest, ListOffsetsResponse, MAX_TIMESTAMP,
    NO_TIMESTAMP, ObjectInfo, ProducerBatch, ProducerState, ShardId, TieredSegment,
    TopicIdPartition, TopicInfo,
};
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Transaction};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Batches per partition fetched by the first find_batches query (more pages follow when needed).
const FIRST_PAGE: i64 = 64;
/// Batches per follow-up page.
const PAGE: i64 = 512;

/// The replica's lag bound, in the reading transaction's snapshot: its clock minus the newest
/// primary heartbeat it holds (ms).
const REPLICA_LAG: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - at_ms \
     FROM replica_heartbeat WHERE id = 1";

/// The primary's heartbeat: its clock, unless another coordinator wrote a value less than `$1` ms
/// old (then nothing is written and no row lock is taken).
const WRITE_HEARTBEAT: &str = "UPDATE replica_heartbeat SET at_ms = t.now \
     FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now) t \
     WHERE id = 1 AND at_ms <= t.now - $1";

/// After a replica failure, how long reads go to the primary without trying the replica.
const REPLICA_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The interval of the primary heartbeat for a lag bound: a quarter of it, at most a second, at
/// least 50 ms.
pub(super) fn heartbeat_interval(max_replica_lag: Duration) -> Duration {
    (max_replica_lag / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Writes the primary heartbeat (for a lag bound of `max_replica_lag`), unless another
/// coordinator wrote one within half the heartbeat interval. Errors are logged: a missing
/// heartbeat only sends reads to the primary.
pub(super) async fn write_heartbeat(write: &PgPool, max_replica_lag: Duration) {
    let skip_ms =
        i64::try_from(heartbeat_interval(max_replica_lag).as_millis() / 2).unwrap_or(i64::MAX);
    if let Err(e) = sqlx::query(WRITE_HEARTBEAT)
        .bind(skip_ms)
        .execute(write)
        .await
    {
        tracing::debug!(error = %e, "writing the replica heartbeat failed");
    }
}

/// Writes the primary heartbeat every [`heartbeat_interval`] until the pool closes.
pub(super) async fn heartbeat_loop(write: PgPool, max_replica_lag: Duration) {
    let interval = heartbeat_interval(max_replica_lag);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if write.is_closed() {
            return;
        }
        write_heartbeat(&write, max_replica_lag).await;
    }
}

/// Where a read runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Replica,
    Primary,
}

/// A partition as one snapshot sees it: its id, bounds, last stable offset and the first page of
/// batches from the fetch offset (empty when the offset is out of range).
struct Found {
    partition_id: i64,
    log_start_offset: i64,
    high_watermark: i64,
    last_stable_offset: i64,
    /// The first offset no tiered segment ever covered.
    tiered_next_offset: i64,
    first_page: Vec<BatchCoordinate>,
}

impl Found {
    fn in_range(&self, offset: i64) -> bool {
        self.log_start_offset <= offset && offset <= self.high_watermark
    }
}

/// One ListOffsets partition as one snapshot sees it: bounds, last stable offset and the batch
/// found (base offset, timestamp) for a timestamp or MAX_TIMESTAMP lookup.
#[derive(Clone, Copy)]
struct Listed {
    log_start_offset: i64,
    high_watermark: i64,
    last_stable_offset: i64,
    tiered_next_offset: i64,
    hit: Option<(i64, i64)>,
}

impl Listed {
    /// The answer to `request`: under `read_committed` nothing at or above the last stable
    /// offset is found and LATEST is the last stable offset (Kafka's `lastFetchableOffset`).
    fn answer(&self, request: &ListOffsetsRequest) -> ListOffsetsResponse {
        let fetchable = match request.isolation {
            IsolationLevel::ReadCommitted => self.last_stable_offset,
            IsolationLevel::ReadUncommitted => self.high_watermark,
        };
        let bound = |offset| ListOffsetsResponse {
            error: ErrorCode::None,
            offset,
            timestamp: NO_TIMESTAMP,
        };
        match request.timestamp {
            // KIP-405's EARLIEST_LOCAL: the first offset not tiered (never below the log start).
            EARLIEST_LOCAL_TIMESTAMP => {
                return bound(self.log_start_offset.max(self.tiered_next_offset));
            }
            // KIP-1005's LATEST_TIERED: the last tiered offset (-1 when nothing was tiered).
            LATEST_TIERED_TIMESTAMP => return bound(self.tiered_next_offset - 1),
            _ => {}
        }
        let hit = self
            .hit
            .filter(|(offset, _)| (*offset).max(self.log_start_offset) < fetchable);
        list_offsets_answer(request.timestamp, self.log_start_offset, fetchable, hit)
    }
}

/// ListOffsets `-4` (KIP-405's `EARLIEST_LOCAL_TIMESTAMP`).
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// ListOffsets `-5` (KIP-1005's `LATEST_TIERED_TIMESTAMP`).
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// Tiered segments per partition read by one find_batches query (more pages follow when needed).
const SEGMENT_PAGE: i64 = 16;

/// KIP-74's byte limits of one `find_batches` call over both tiers, filled partition by
/// partition in request order: a partition's first item (segment or batch) is always taken, a
/// later one while the partition stays within its `max_bytes` and the call within
/// `fetch_max_bytes`; a segment counts its whole `.log`.
struct CallLimits {
    fetch_max_bytes: u64,
    total: u64,
}

/// What one partition of a `find_batches` call answers with, so far.
struct PartitionTake<'a> {
    call: &'a mut CallLimits,
    max_bytes: u64,
    bytes: u64,
    segments: Vec<TieredSegment>,
    batches: Vec<BatchCoordinate>,
}

impl PartitionTake<'_> {
    /// Counts an item of `size` bytes if the limits allow.
    fn fits(&mut self, size: u64) -> bool {
        let fits = self.bytes + size <= self.max_bytes
            && self.call.total + size <= self.call.fetch_max_bytes;
        if (!self.segments.is_empty() || !self.batches.is_empty()) && !fits {
            return false;
        }
        self.bytes += size;
        self.call.total += size;
        true
    }

    fn take_segment(&mut self, segment: TieredSegment) -> bool {
        let ok = self.fits(segment.layout.log);
        if ok {
            self.segments.push(segment);
        }
        ok
    }

    fn take_batch(&mut self, batch: BatchCoordinate) -> bool {
        let ok = self.fits(u64::from(batch.byte_size));
        if ok {
            self.batches.push(batch);
        }
        ok
    }

    /// The offset after the last item taken.
    fn next_offset(&self) -> Result<Option<i64>, CoordinatorError> {
        self.batches
            .last()
            .map(|b| b.last_offset)
            .or_else(|| self.segments.last().map(|s| s.end_offset))
            .map(|last| {
                last.checked_add(1)
                    .ok_or_else(|| corrupt("a last offset is i64::MAX"))
            })
            .transpose()
    }
}

/// A stored owner shard id.
fn shard_id(v: i64) -> Result<ShardId, CoordinatorError> {
    ShardId::try_from(v).map_err(|_| corrupt(format!("bad owner shard id {v}")))
}

/// The answer slot of the request whose 1-based position a row names (`WITH ORDINALITY`).
fn slot<'a, T>(
    answers: &'a mut [Option<T>],
    position: i32,
    what: &str,
) -> Result<&'a mut Option<T>, CoordinatorError> {
    usize::try_from(position)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| answers.get_mut(i))
        .ok_or_else(|| corrupt(format!("{what} row for request {position}")))
}

/// Bounds and first page of every request (by position; `None`: unknown partition). A
/// `read_committed` page holds only batches below the last stable offset (none from an offset at
/// or above it). Whenever the fetch offset is below the last stable offset, the last stable offset
/// is a batch boundary (the first offset of an open transaction's first batch, or the high
/// watermark; the log start offset only when it is at or above the fetch offset), so a batch
/// starts below it exactly when it ends below it: the bound is on `last_offset`, where the
/// primary key's range scan stops.
async fn find_first_pages(
    conn: &mut PgConnection,
    requests: &[&FindBatchesRequest],
) -> Result<Vec<Option<Found>>, CoordinatorError> {
    let (topic_ids, partitions) = partition_arrays(requests.iter().map(|r| r.partition));
    let offsets: Vec<i64> = requests.iter().map(|r| r.offset).collect();
    let committed: Vec<bool> = requests
        .iter()
        .map(|r| r.isolation == IsolationLevel::ReadCommitted)
        .collect();
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT u.i::integer, pa.partition_id, pa.log_start_offset, pa.high_watermark, l.lso, \
         pa.tiered_next_offset, b.present, {cols} \
         FROM unnest($1::text[]::uuid[], $2::integer[], $3::bigint[], $4::boolean[]) \
         WITH ORDINALITY AS u(t, p, off, rc, i) \
         JOIN partitions pa ON pa.topic_id = u.t AND pa.partition = u.p \
         CROSS JOIN LATERAL (SELECT {LAST_STABLE_OFFSET} AS lso) l \
         LEFT JOIN LATERAL (SELECT true AS present, b.*, o.object_key, o.object_size \
             FROM batches b LEFT JOIN objects o ON o.object_id = b.object_id \
             WHERE b.partition_id = pa.partition_id AND b.last_offset >= u.off \
             AND u.off >= pa.log_start_offset AND u.off <= pa.high_watermark \
             AND (NOT u.rc OR b.last_offset < l.lso) \
             ORDER BY b.last_offset LIMIT {FIRST_PAGE}) b ON true \
         ORDER BY u.i, b.last_offset",
        cols = batch_columns("b")
    )))
    .bind(&topic_ids)
    .bind(&partitions)
    .bind(&offsets)
    .bind(&committed)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    let mut found: Vec<Option<Found>> = requests.iter().map(|_| None).collect();
    for row in &rows {
        let slot = slot(&mut found, row.i32_at(0)?, "find_batches")?;
        if slot.is_none() {
            *slot = Some(Found {
                partition_id: row.i64_at(1)?,
                log_start_offset: row.i64_at(2)?,
                high_watermark: row.i64_at(3)?,
                last_stable_offset: row.i64_at(4)?,
                tiered_next_offset: row.i64_at(5)?,
                first_page: Vec::new(),
            });
        }
        if col::<_, Option<bool>>(row, 6)?.unwrap_or(false)
            && let Some(f) = slot.as_mut()
        {
            f.first_page.push(batch_from_row(row, 7)?);
        }
    }
    Ok(found)
}

/// The next page of a partition's batches, from `from` on, ending below `below`.
async fn next_page(
    conn: &mut PgConnection,
    partition_id: i64,
    from: i64,
    below: i64,
) -> Result<Vec<BatchCoordinate>, CoordinatorError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {cols} FROM batches b LEFT JOIN objects o ON o.object_id = b.object_id \
         WHERE b.partition_id = $1 AND b.last_offset >= $2 AND b.last_offset < $4 \
         ORDER BY b.last_offset LIMIT $3",
        cols = batch_columns("o")
    )))
    .bind(partition_id)
    .bind(from)
    .bind(PAGE)
    .bind(below)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    rows.iter().map(|r| batch_from_row(r, 0)).collect()
}

/// The aborted transactions a `read_committed` fetch from `offset` whose batches end before
/// `upper` reports (Kafka's `TransactionIndex.collectAbortedTxns`): those whose marker is at or
/// after `offset` and whose first offset is below `upper`, in marker order, up to and including
/// the first whose last stable offset after the abort reaches `upper`.
async fn aborted_between(
    conn: &mut PgConnection,
    partition_id: i64,
    offset: i64,
    upper: i64,
) -> Result<Vec<AbortedTxn>, CoordinatorError> {
    let rows = sqlx::query(
        "SELECT a.producer_id, a.first_offset, a.last_offset FROM aborted_txns a \
         WHERE a.partition_id = $1 AND a.last_offset >= $2 AND a.first_offset < $3 \
         AND a.last_offset <= coalesce((SELECT min(s.last_offset) FROM aborted_txns s \
             WHERE s.partition_id = $1 AND s.last_offset >= $2 AND s.lso_at_abort >= $3), \
             9223372036854775807) \
         ORDER BY a.last_offset",
    )
    .bind(partition_id)
    .bind(offset)
    .bind(upper)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    rows.iter()
        .map(|r| {
            Ok(AbortedTxn {
                producer_id: r.i64_at(0)?,
                first_offset: r.i64_at(1)?,
                last_offset: r.i64_at(2)?,
            })
        })
        .collect()
}

/// The ListOffsets lookup of every request (by position; `None`: unknown partition), in one
/// statement (one snapshot).
///
/// Cost per partition, whatever its number of batches:
/// - a timestamp `t >= 0`: one probe of `batches_running_max` (the first batch, in offset order,
///   whose running max of effective timestamps is `>= t`: the running max is monotonic in offset
///   order, so that is the first index entry at or above `t`). When that batch's own timestamp is
///   `>= t` it is the answer: every earlier live batch has a running max, hence a timestamp, below
///   `t`. Otherwise a deleted batch had raised the running max; then the batches after it are read
///   in offset order up to the first one reaching `t` (a scan as long as the run of batches whose
///   timestamps stay below a deleted batch's: none when timestamps grow with offsets). Plus one
///   probe of the partial index of batches committed before migration 3 (empty unless the schema
///   is that old; those are read in offset order until retention removes them).
/// - MAX_TIMESTAMP: one probe of `batches_effective_ts` (largest timestamp first, earliest offset
///   among equals); only live batches are indexed, so a deleted batch cannot win.
async fn list_offsets_lookup(
    conn: &mut PgConnection,
    requests: &[&ListOffsetsRequest],
) -> Result<Vec<Option<Listed>>, CoordinatorError> {
    let (topic_ids, partitions) = partition_arrays(requests.iter().map(|r| r.partition));
    let targets: Vec<i64> = requests.iter().map(|r| r.timestamp).collect();
    let rows = sqlx::query(AssertSqlSafe(list_offsets_sql()))
        .bind(&topic_ids)
        .bind(&partitions)
        .bind(&targets)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| sql_error(e, false))?;
    let mut listed: Vec<Option<Listed>> = vec![None; requests.len()];
    for row in &rows {
        let slot = slot(&mut listed, row.i32_at(0)?, "list_offsets")?;
        let hit = match (row.opt_i64_at(3)?, row.opt_i64_at(4)?) {
            (Some(offset), Some(ts)) => Some((offset, ts)),
            _ => None,
        };
        *slot = Some(Listed {
            log_start_offset: row.i64_at(1)?,
            high_watermark: row.i64_at(2)?,
            last_stable_offset: row.i64_at(5)?,
            tiered_next_offset: row.i64_at(6)?,
            hit,
        });
    }
    Ok(listed)
}

/// The statement of [`list_offsets_lookup`]: binds the topic ids (text), partitions and targets.
fn list_offsets_sql() -> String {
    let ts = EFFECTIVE_TS;
    format!(
        "SELECT u.i::integer, pa.log_start_offset, pa.high_watermark, x.base_offset, x.ts, \
         {LAST_STABLE_OFFSET}, pa.tiered_next_offset \
         FROM unnest($1::text[]::uuid[], $2::integer[], $3::bigint[]) \
         WITH ORDINALITY AS u(t, p, target, i) \
         JOIN partitions pa ON pa.topic_id = u.t AND pa.partition = u.p \
         LEFT JOIN LATERAL ( \
             SELECT y.base_offset, y.ts FROM ( \
                 (SELECT f.base_offset, f.last_offset, f.ts FROM \
                     (SELECT s.base_offset, s.end_offset AS last_offset, s.max_timestamp AS ts \
                      FROM tiered_segments s \
                      WHERE u.target >= 0 AND pa.tiered_bytes > 0 \
                      AND s.partition_id = pa.partition_id \
                      AND s.max_timestamp_so_far >= u.target \
                      ORDER BY s.max_timestamp_so_far, s.end_offset LIMIT 1) c \
                  CROSS JOIN LATERAL ( \
                      SELECT c.base_offset, c.last_offset, c.ts WHERE c.ts >= u.target \
                      UNION ALL \
                      (SELECT s.base_offset, s.end_offset, s.max_timestamp FROM tiered_segments s \
                       WHERE c.ts < u.target AND s.partition_id = pa.partition_id \
                       AND s.end_offset > c.last_offset AND s.max_timestamp >= u.target \
                       ORDER BY s.end_offset LIMIT 1) \
                  ) f) \
                 UNION ALL \
                 (SELECT s.base_offset, s.end_offset, s.max_timestamp FROM tiered_segments s \
                  WHERE u.target = {MAX_TIMESTAMP} AND pa.tiered_bytes > 0 \
                  AND s.partition_id = pa.partition_id \
                  ORDER BY s.max_timestamp DESC, s.end_offset LIMIT 1) \
                 UNION ALL \
                 (SELECT f.base_offset, f.last_offset, f.ts FROM \
                     (SELECT b.base_offset, b.last_offset, {ts} AS ts FROM batches b \
                      WHERE u.target >= 0 AND b.partition_id = pa.partition_id \
                      AND b.max_timestamp_so_far >= u.target \
                      ORDER BY b.max_timestamp_so_far, b.last_offset LIMIT 1) c \
                  CROSS JOIN LATERAL ( \
                      SELECT c.base_offset, c.last_offset, c.ts WHERE c.ts >= u.target \
                      UNION ALL \
                      (SELECT b.base_offset, b.last_offset, {ts} FROM batches b \
                       WHERE c.ts < u.target AND b.partition_id = pa.partition_id \
                       AND b.last_offset > c.last_offset AND {ts} >= u.target \
                       ORDER BY b.last_offset LIMIT 1) \
                  ) f) \
                 UNION ALL \
                 (SELECT b.base_offset, b.last_offset, {ts} FROM batches b \
                  WHERE u.target >= 0 AND b.partition_id = pa.partition_id \
                  AND b.max_timestamp_so_far IS NULL AND {ts} >= u.target \
                  ORDER BY b.last_offset LIMIT 1) \
                 UNION ALL \
                 (SELECT b.base_offset, b.last_offset, {ts} FROM batches b \
                  WHERE u.target = {MAX_TIMESTAMP} AND b.partition_id = pa.partition_id \
                  ORDER BY {ts} DESC, b.last_offset LIMIT 1) \
             ) y ORDER BY (CASE WHEN u.target = {MAX_TIMESTAMP} THEN y.ts END) DESC NULLS LAST, \
             y.last_offset LIMIT 1 \
         ) x ON true"
    )
}

/// Whether a replica's ListOffsets answer must be confirmed by the primary: an unknown
/// partition, or a timestamp lookup that found nothing (the primary may hold newer batches).
fn list_needs_primary(request: &ListOffsetsRequest, listed: &Option<Listed>) -> bool {
    match listed {
        None => true,
        Some(l) => l.hit.is_none() && looks_up_batch(request.timestamp),
    }
}

impl PostgresCoordinator {
    /// A read transaction on the primary.
    async fn primary_read_tx(&self) -> Result<Transaction<'static, Postgres>, CoordinatorError> {
        self.write
            .begin_with(BEGIN_READ)
            .await
            .map_err(|e| sql_error(e, false))
    }

    /// A read transaction on the replica when its lag, measured in the transaction's own
    /// snapshot, is within [`PostgresOptions::max_replica_lag`]; `None` when it lags more (or
    /// holds no heartbeat).
    async fn replica_tx(&self) -> Result<Option<Transaction<'static, Postgres>>, sqlx::Error> {
        let mut tx = self.read.begin_with(BEGIN_READ).await?;
        let lag: Option<i64> = sqlx::query_scalar(REPLICA_LAG)
            .fetch_optional(&mut *tx)
            .await?;
        let bound = crate::max_age_ms(self.options.max_replica_lag);
        match lag {
            Some(lag) if lag <= bound => Ok(Some(tx)),
            other => {
                tracing::debug!(lag_ms = ?other, bound_ms = bound, "the replica lags: reading the primary");
                Ok(None)
            }
        }
    }

    /// Opens the transaction of a read: on the read pool when it is the primary's; with a
    /// replica, on it when it is fresh enough, else on the primary.
    async fn read_tx(&self) -> Result<(Transaction<'static, Postgres>, Source), CoordinatorError> {
        if self.options.read_url.is_none() {
            let tx = self
                .read
                .begin_with(BEGIN_READ)
                .await
                .map_err(|e| sql_error(e, false))?;
            return Ok((tx, Source::Primary));
        }
        let retry_at = *self
            .replica_retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if retry_at.is_none_or(|at| Instant::now() >= at) {
            match self.replica_tx().await {
                Ok(Some(tx)) => {
                    self.counters.replica_reads.fetch_add(1, Ordering::Relaxed);
                    return Ok((tx, Source::Replica));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the read replica failed: reading the primary");
                    *self
                        .replica_retry_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now() + REPLICA_RETRY_AFTER);
                }
            }
        }
        self.counters
            .replica_bypassed
            .fetch_add(1, Ordering::Relaxed);
        Ok((self.primary_read_tx().await?, Source::Primary))
    }

    pub(super) async fn read_find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let (mut tx, source) = self.read_tx().await?;
        let all: Vec<&FindBatchesRequest> = requests.iter().collect();
        let mut found = find_first_pages(&mut tx, &all).await?;
        // Partitions answered by the primary (only set when reading a replica).
        let mut on_primary = vec![false; requests.len()];
        let mut primary = None;
        if source == Source::Replica {
            let recheck: Vec<usize> = (0..requests.len())
                .filter(|&i| {
                    !found[i]
                        .as_ref()
                        .is_some_and(|f| f.in_range(requests[i].offset))
                })
                .collect();
            if !recheck.is_empty() {
                self.counters
                    .primary_rechecks
                    .fetch_add(1, Ordering::Relaxed);
                let mut ptx = self.primary_read_tx().await?;
                let asked: Vec<&FindBatchesRequest> =
                    recheck.iter().map(|&i| &requests[i]).collect();
                let fresh = find_first_pages(&mut ptx, &asked).await?;
                for (i, f) in recheck.into_iter().zip(fresh) {
                    found[i] = f;
                    on_primary[i] = true;
                }
                primary = Some(ptx);
            }
        }
        let mut limits = CallLimits {
            fetch_max_bytes: u64::from(fetch_max_bytes),
            total: 0,
        };
        let mut responses = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let Some(f) = found[i].take() else {
                responses.push(FindBatchesResponse::error(
                    ErrorCode::UnknownTopicOrPartition,
                ));
                continue;
            };
            if !f.in_range(request.offset) {
                responses.push(FindBatchesResponse::error(ErrorCode::OffsetOutOfRange));
                continue;
            }
            let conn: &mut PgConnection = match (on_primary[i], primary.as_mut()) {
                (true, Some(p)) => p,
                (true, None) => return Err(corrupt("no primary transaction")),
                (false, _) => &mut tx,
            };
            let committed = request.isolation == IsolationLevel::ReadCommitted;
            // What the read may see (see find_first_pages).
            let below = if committed {
                f.last_stable_offset
            } else {
                i64::MAX
            };
            let mut fetch = PartitionTake {
                call: &mut limits,
                max_bytes: u64::from(request.max_bytes),
                bytes: 0,
                segments: Vec::new(),
                batches: Vec::new(),
            };
            // Segments first (one sequence with the batches): the one containing the offset and
            // those following while the limits allow; a segment that does not fit ends the
            // answer, so batches follow only segments that reach them. Segments are always below
            // the last stable offset (a registration ends below it, and it never moves back).
            let mut complete = true;
            if request.offset < f.tiered_next_offset && !(committed && request.offset >= below) {
                let mut from = request.offset;
                'segments: loop {
                    let page = segments_from(conn, f.partition_id, from, SEGMENT_PAGE).await?;
                    let full = page.len() as i64 == SEGMENT_PAGE;
                    for segment in page {
                        if !fetch.take_segment(segment) {
                            complete = false;
                            break 'segments;
                        }
                    }
                    match fetch.next_offset()? {
                        Some(next) if full => from = next,
                        _ => break,
                    }
                }
            }
            let mut full = f.first_page.len() as i64 == FIRST_PAGE;
            let mut page = if complete { f.first_page } else { Vec::new() };
            'pages: loop {
                let mut took = false;
                for batch in page {
                    if !fetch.take_batch(batch) {
                        break 'pages;
                    }
                    took = true;
                }
                let Some(from) = fetch.next_offset()?.filter(|_| full && took) else {
                    break;
                };
                page = next_page(conn, f.partition_id, from, below).await?;
                full = page.len() as i64 == PAGE;
            }
            let aborted = match (committed, fetch.next_offset()?) {
                (false, _) => None,
                (true, None) => Some(Vec::new()),
                (true, Some(upper)) => {
                    Some(aborted_between(conn, f.partition_id, request.offset, upper).await?)
                }
            };
            responses.push(FindBatchesResponse {
                error: ErrorCode::None,
                segments: fetch.segments,
                batches: fetch.batches,
                log_start_offset: f.log_start_offset,
                high_watermark: f.high_watermark,
                last_stable_offset: f.last_stable_offset,
                aborted,
            });
        }
        tx.commit().await.map_err(|e| sql_error(e, false))?;
        if let Some(p) = primary {
            p.commit().await.map_err(|e| sql_error(e, false))?;
        }
        Ok(responses)
    }

    pub(super) async fn read_list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let all: Vec<&ListOffsetsRequest> = requests.iter().collect();
        let listed = if self.options.read_url.is_none() {
            // One statement on the primary's read pool: no transaction needed.
            let mut conn = self.read.acquire().await.map_err(|e| sql_error(e, false))?;
            list_offsets_lookup(&mut conn, &all).await?
        } else {
            let (mut tx, source) = self.read_tx().await?;
            let mut listed = list_offsets_lookup(&mut tx, &all).await?;
            tx.commit().await.map_err(|e| sql_error(e, false))?;
            if source == Source::Replica {
                let recheck: Vec<usize> = (0..requests.len())
                    .filter(|&i| list_needs_primary(&requests[i], &listed[i]))
                    .collect();
                if !recheck.is_empty() {
                    self.counters
                        .primary_rechecks
                        .fetch_add(1, Ordering::Relaxed);
                    let asked: Vec<&ListOffsetsRequest> =
                        recheck.iter().map(|&i| &requests[i]).collect();
                    let mut conn = self
                        .write
                        .acquire()
                        .await
                        .map_err(|e| sql_error(e, false))?;
                    let fresh = list_offsets_lookup(&mut conn, &asked).await?;
                    for (i, l) in recheck.into_iter().zip(fresh) {
                        listed[i] = l;
                    }
                }
            }
            listed
        };
        Ok(requests
            .iter()
            .zip(listed)
            .map(|(request, listed)| match listed {
                None => ListOffsetsResponse::error(ErrorCode::UnknownTopicOrPartition),
                Some(l) => l.answer(request),
            })
            .collect())
    }

    /// `EXPLAIN (ANALYZE, BUFFERS)` of the ListOffsets statement for `requests`, run on the
    /// primary: how the timestamp lookups use the indexes. For tests and diagnosis.
    #[doc(hidden)]
    pub async fn explain_list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<String, CoordinatorError> {
        let (topic_ids, partitions) = partition_arrays(requests.iter().map(|r| r.partition));
        let targets: Vec<i64> = requests.iter().map(|r| r.timestamp).collect();
        let lines: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) {}",
            list_offsets_sql()
        )))
        .bind(&topic_ids)
        .bind(&partitions)
        .bind(&targets)
        .fetch_all(&self.write)
        .await
        .map_err(|e| sql_error(e, false))?;
        Ok(lines.join("\n"))
    }

    pub(super) async fn read_list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        self.check_open()?;
        let sql = format!(
            "SELECT topic_id::text, {} FROM topics ORDER BY name",
            topic_columns()
        );
        let rows = if self.options.read_url.is_none() {
            sqlx::query(AssertSqlSafe(sql))
                .fetch_all(&self.read)
                .await
                .map_err(|e| sql_error(e, false))?
        } else {
            let (mut tx, _) = self.read_tx().await?;
            let rows = sqlx::query(AssertSqlSafe(sql))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| sql_error(e, false))?;
            tx.commit().await.map_err(|e| sql_error(e, false))?;
            rows
        };
        rows.iter().map(topic_from_row).collect()
    }

    /// On the primary: a replica could miss an object just committed.
    pub(super) async fn read_known_objects(
        &self,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        self.check_open()?;
        if object_keys.is_empty() {
            return Ok(Vec::new());
        }
        let known: Vec<String> =
            sqlx::query_scalar("SELECT object_key FROM objects WHERE object_key = ANY($1)")
                .bind(object_keys)
                .fetch_all(self.fresh_pool())
                .await
                .map_err(|e| sql_error(e, false))?;
        Ok(in_request_order(
            object_keys,
            known.into_iter().collect::<HashSet<_>>(),
        ))
    }

    /// On the primary, as [`PostgresCoordinator::read_known_objects`].
    pub(super) async fn read_object_info(
        &self,
        object_key: &str,
    ) -> Result<Option<ObjectInfo>, CoordinatorError> {
        self.check_open()?;
        // OBJECT_INFO's columns, then the kind (migration 13).
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT x.*, (SELECT k.kind FROM objects k WHERE k.object_key = $1) \
             FROM ({OBJECT_INFO}) x"
        )))
        .bind(object_key)
        .fetch_optional(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        row.map(|r| {
            let owners: Vec<i64> = col(&r, 3)?;
            let owners = owners.into_iter().map(shard_id).collect::<Result<_, _>>()?;
            Ok(ObjectInfo {
                kind: object_kind(r.i16_at(6)?)?,
                ..object_info_from_row(&r, object_key, owners)?
            })
        })
        .transpose()
    }

    /// On the primary: a replica could answer with a state older than the producer's last batch.
    pub(super) async fn read_producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        self.check_open()?;
        let row = sqlx::query(
            "SELECT s.producer_epoch, s.base_sequences, s.last_sequences, s.base_offsets, \
             s.last_offsets, s.log_append_times, s.last_append_ms, s.txn_first_offset, \
             s.txn_start_ms, s.coordinator_epoch, s.last_ended_txn, s.last_marker_offset, \
             s.txn_seq \
             FROM producer_state s JOIN partitions pa ON pa.partition_id = s.partition_id \
             WHERE pa.topic_id = $1::uuid AND pa.partition = $2 AND s.producer_id = $3",
        )
        .bind(topic_key(partition.topic_id))
        .bind(partition.partition)
        .bind(producer_id)
        .fetch_optional(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        row.map(|r| producer_from_row(&r, producer_id)).transpose()
    }

    /// On the primary, as [`PostgresCoordinator::read_producer_state`]: one row per producer, or
    /// one row without a producer for a partition with none, or no row for an unknown partition.
    pub(super) async fn read_list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        self.check_open()?;
        let rows = sqlx::query(
            "SELECT s.producer_epoch, s.base_sequences, s.last_sequences, s.base_offsets, \
             s.last_offsets, s.log_append_times, s.last_append_ms, s.txn_first_offset, \
             s.txn_start_ms, s.coordinator_epoch, s.last_ended_txn, s.last_marker_offset, \
             s.txn_seq, s.producer_id \
             FROM partitions pa LEFT JOIN producer_state s ON s.partition_id = pa.partition_id \
             WHERE pa.topic_id = $1::uuid AND pa.partition = $2 ORDER BY s.producer_id",
        )
        .bind(topic_key(partition.topic_id))
        .bind(partition.partition)
        .fetch_all(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        if rows.is_empty() {
            return Err(CoordinatorError::UnknownTopic(partition.to_string()));
        }
        let mut producers = Vec::with_capacity(rows.len());
        for r in &rows {
            if let Some(producer_id) = col::<_, Option<i64>>(r, 13)? {
                producers.push(producer_from_row(r, producer_id)?);
            }
        }
        Ok(producers)
    }
}

/// A producer's state from the columns (epoch, base sequences, last sequences, base offsets, last
/// offsets, log append times, last append time, then its transaction: first offset, start time,
/// coordinator epoch, last ended transaction, last marker offset, number).
fn producer_from_row(r: &PgRow, producer_id: i64) -> Result<ProducerState, CoordinatorError> {
    let base_sequences: Vec<i32> = col(r, 1)?;
    let last_sequences: Vec<i32> = col(r, 2)?;
    let base_offsets: Vec<i64> = col(r, 3)?;
    let last_offsets: Vec<i64> = col(r, 4)?;
    let log_append_times: Vec<i64> = col(r, 5)?;
    let n = base_sequences.len();
    if [
        last_sequences.len(),
        base_offsets.len(),
        last_offsets.len(),
        log_append_times.len(),
    ]
    .iter()
    .any(|l| *l != n)
    {
        return Err(corrupt("torn producer batch window"));
    }
    let batches = (0..n)
        .map(|i| ProducerBatch {
            base_sequence: base_sequences[i],
            last_sequence: last_sequences[i],
            base_offset: base_offsets[i],
            last_offset: last_offsets[i],
            log_append_time: log_append_times[i],
        })
        .collect();
    Ok(ProducerState {
        batches,
        current_txn_first_offset: r.opt_i64_at(7)?,
        current_txn_start_ms: r.i64_at(8)?,
        coordinator_epoch: r.i32_at(9)?,
        last_ended_txn: r.i64_at(10)?,
        last_marker_offset: r.i64_at(11)?,
        current_txn_seq: r.opt_i64_at(12)?,
        ..ProducerState::new(producer_id, r.i16_at(0)?, r.i64_at(6)?)
    })
}
