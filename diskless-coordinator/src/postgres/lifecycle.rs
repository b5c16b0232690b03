//! The life of batches and objects after their commit: DeleteRecords, retention, producer expiry,
//! the object cleaner's calls (`objects_to_delete`, `confirm_deleted`) and the orphan collector's
//! fences. Writers lock partitions in (topic id, partition) order and the objects they release in
//! object id order, as commits do, so they cannot deadlock; passes stop as soon as their budget is
//! spent, so they hold row locks for bounded work.

use super::PostgresCoordinator;
use super::attempt::{Attempt, sql_error};
use super::sql::{EFFECTIVE_TS, object_kind, partition_arrays};
use crate::rows::{
    OBJECTS_TO_DELETE, SqlRow, object_to_delete_from_row, parse_topic_id, retention_rows, to_u64,
};
use crate::rules::{RetentionRule, RetentionScan, delete_records_target};
use crate::{
    CoordinatorError, DeleteRecordsRequest, DeleteRecordsResponse, ErrorCode, ObjectToDelete,
    ProducerExpiryReport, RetentionReport, TopicIdPartition,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

/// Candidate partitions fetched per round trip by retention and producer expiry.
const CANDIDATES_PAGE: i64 = 32;

/// The time retention ages a batch row `b` by: its effective max timestamp, or, for a batch without
/// any timestamp (`< 0`), its commit time (its object's), as Kafka ages a segment without
/// timestamps by its modification time.
fn retention_ts() -> String {
    format!(
        "(CASE WHEN {EFFECTIVE_TS} >= 0 THEN {EFFECTIVE_TS} ELSE (SELECT o.committed_at \
         FROM objects o WHERE o.object_id = b.object_id) END)"
    )
}

/// Where a walk of partitions in the global lock order resumes after `after` (the last one
/// visited): a condition on `pa` binding `$2` (topic id) and `$3` (partition), and its arguments.
fn resume_after(after: &Option<(String, i32)>) -> (&'static str, Option<&str>, Option<i32>) {
    match after {
        Some((t, p)) => (
            "AND (pa.topic_id, pa.partition) > ($2::uuid, $3)",
            Some(t.as_str()),
            Some(*p),
        ),
        None => ("AND $2::text IS NULL AND $3::integer IS NULL", None, None),
    }
}

/// Deletes the batches of the partitions `partition_ids` below `below`, adding the released bytes
/// per object to `released`; returns the number of batches and bytes deleted. Transaction markers
/// (no object) count among the batches and bytes deleted (their bytes are in the partition's
/// size) but release no object's bytes.
pub(super) async fn delete_batches_below(
    conn: &mut PgConnection,
    partition_ids: &[i64],
    below: i64,
    released: &mut BTreeMap<i64, i64>,
) -> Result<(u64, i64), Attempt> {
    let rows = sqlx::query(
        "WITH d AS (DELETE FROM batches WHERE partition_id = ANY($1) AND last_offset < $2 \
         RETURNING object_id, byte_size) \
         SELECT object_id, count(*)::bigint, sum(byte_size)::bigint FROM d GROUP BY object_id",
    )
    .bind(partition_ids)
    .bind(below)
    .fetch_all(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    let (mut count, mut bytes) = (0u64, 0i64);
    for row in &rows {
        let (object_id, n, b) = (row.opt_i64_at(0)?, row.i64_at(1)?, row.i64_at(2)?);
        count += to_u64(n, "batch count")?;
        bytes += b;
        if let Some(object_id) = object_id {
            *released.entry(object_id).or_default() += b;
        }
    }
    Ok((count, bytes))
}

/// Deletes the tiered segments of the partitions `partition_ids` that end below `below`, adding
/// their `.log` bytes (their objects' live bytes) per object to `released`; returns the number of
/// segments and `.log` bytes deleted. The partitions' sizes are the caller's to update.
pub(super) async fn delete_segments_below(
    conn: &mut PgConnection,
    partition_ids: &[i64],
    below: i64,
    released: &mut BTreeMap<i64, i64>,
) -> Result<(u64, i64), Attempt> {
    let rows = sqlx::query(
        "WITH d AS (DELETE FROM tiered_segments WHERE partition_id = ANY($1) \
         AND end_offset < $2 RETURNING object_id, log_size) \
         SELECT object_id, count(*)::bigint, sum(log_size)::bigint FROM d GROUP BY object_id",
    )
    .bind(partition_ids)
    .bind(below)
    .fetch_all(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    let (mut count, mut bytes) = (0u64, 0i64);
    for row in &rows {
        let (object_id, n, b) = (row.i64_at(0)?, row.i64_at(1)?, row.i64_at(2)?);
        count += to_u64(n, "segment count")?;
        bytes += b;
        *released.entry(object_id).or_default() += b;
    }
    Ok((count, bytes))
}

/// What trimming a partition deleted.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Trimmed {
    /// WAL batches (transaction markers included).
    pub(super) batches: u64,
    /// Tiered segments.
    pub(super) segments: u64,
    /// Bytes: the batches' and the segments' `.log` sections.
    pub(super) bytes: i64,
}

/// [`delete_segments_below`] and [`delete_batches_below`] for one partition, then moves its log
/// start offset to `below` (never back) and its sizes down, and forgets the aborted transactions
/// whose marker is below the new log start. A segment straddling `below` stays whole (reads skip
/// below the log start).
async fn trim_below(
    conn: &mut PgConnection,
    partition_id: i64,
    below: i64,
    released: &mut BTreeMap<i64, i64>,
) -> Result<Trimmed, Attempt> {
    let (segments, segment_bytes) =
        delete_segments_below(conn, &[partition_id], below, released).await?;
    let (batches, batch_bytes) =
        delete_batches_below(conn, &[partition_id], below, released).await?;
    let bytes = segment_bytes + batch_bytes;
    sqlx::query(
        "WITH pa AS (UPDATE partitions SET log_start_offset = greatest(log_start_offset, $2), \
         byte_size = byte_size - $3, tiered_bytes = tiered_bytes - $4 \
         WHERE partition_id = $1 RETURNING log_start_offset) \
         DELETE FROM aborted_txns a USING pa \
         WHERE a.partition_id = $1 AND a.last_offset < pa.log_start_offset",
    )
    .bind(partition_id)
    .bind(below)
    .bind(bytes)
    .bind(segment_bytes)
    .execute(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    Ok(Trimmed {
        batches,
        segments,
        bytes,
    })
}

/// Takes released bytes off objects (locking them in object id order), marking those left with no
/// live bytes at `now`.
pub(super) async fn release_objects(
    conn: &mut PgConnection,
    released: &BTreeMap<i64, i64>,
    now: i64,
) -> Result<(), Attempt> {
    if released.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = released.keys().copied().collect();
    let bytes: Vec<i64> = released.values().copied().collect();
    sqlx::query(
        "SELECT object_id FROM objects WHERE object_id = ANY($1) ORDER BY object_id FOR UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    sqlx::query(
        "UPDATE objects o SET live_bytes = greatest(o.live_bytes - u.bytes, 0), \
         marked_for_deletion_at = CASE WHEN o.marked_for_deletion_at IS NULL \
         AND o.live_bytes - u.bytes <= 0 THEN $3 ELSE o.marked_for_deletion_at END \
         FROM unnest($1::bigint[], $2::bigint[]) AS u(id, bytes) WHERE o.object_id = u.id",
    )
    .bind(&ids)
    .bind(&bytes)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    Ok(())
}

/// A partition a pass locked, with its size and its topic's settings.
struct LockedPartition {
    size: i64,
    retention_ms: i64,
    retention_bytes: i64,
    producer_id_expiration_ms: i64,
}

/// Locks a partition's row for a pass (in the global lock order, as the pass walks them); `None`
/// when it was deleted meanwhile. A commit writes a partition's batches and producer states only
/// under this lock, so what the pass reads next (a new snapshot under READ COMMITTED) includes
/// what any commit did before.
async fn lock_partition(
    conn: &mut PgConnection,
    partition_id: i64,
) -> Result<Option<LockedPartition>, Attempt> {
    let row = sqlx::query(
        "SELECT pa.byte_size, \
         CASE WHEN t.cleanup_policy = 'compact' THEN -1 ELSE t.retention_ms END, \
         CASE WHEN t.cleanup_policy = 'compact' THEN -1 ELSE t.retention_bytes END, \
         t.producer_id_expiration_ms \
         FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
         WHERE pa.partition_id = $1 FOR UPDATE OF pa",
    )
    .bind(partition_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(LockedPartition {
        size: row.i64_at(0)?,
        retention_ms: row.i64_at(1)?,
        retention_bytes: row.i64_at(2)?,
        producer_id_expiration_ms: row.i64_at(3)?,
    }))
}

/// Retention of one locked partition: deletes the prefix that retention.ms (then retention.bytes
/// on what is left) allows under `rule`, at most `budget` items ([`RetentionScan`]), adding the
/// released bytes per object to `released`. The items are the partition's tiered segments (each
/// aged by its `retention_ts`, sized by its `.log`) then its WAL batches, one sequence in offset
/// order: each page reads the segments after the cursor, then batches to fill it (two index range
/// scans).
async fn trim_partition(
    conn: &mut PgConnection,
    partition_id: i64,
    rule: RetentionRule,
    budget: u64,
    released: &mut BTreeMap<i64, i64>,
) -> Result<Trimmed, Attempt> {
    let sql = format!(
        "SELECT x.last_offset, x.size, x.ts FROM ( \
         (SELECT s.end_offset AS last_offset, s.log_size AS size, s.retention_ts AS ts \
          FROM tiered_segments s WHERE s.partition_id = $1 AND s.end_offset > $2 \
          ORDER BY s.end_offset LIMIT $3) \
         UNION ALL \
         (SELECT b.last_offset, b.byte_size, {ts} FROM batches b \
          WHERE b.partition_id = $1 AND b.last_offset > $2 \
          ORDER BY b.last_offset LIMIT $3)) x \
         ORDER BY x.last_offset LIMIT $3",
        ts = retention_ts()
    );
    let mut scan = RetentionScan::new(rule, budget);
    while let Some((after, want)) = scan.next_page() {
        let rows = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(partition_id)
            .bind(after)
            .bind(i64::try_from(want).unwrap_or(i64::MAX))
            .fetch_all(&mut *conn)
            .await
            .map_err(Attempt::before)?;
        scan.feed(&retention_rows(&rows)?, want)?;
    }
    match scan.delete_below() {
        Some(below) => trim_below(conn, partition_id, below, released).await,
        None => Ok(Trimmed::default()),
    }
}

/// Producer expiry of one locked partition: deletes its states expired at `now` (their last
/// append at least `expiration` ms before — the topic's setting raised to the floor of
/// [`crate::producer_expired`] by the caller — and no transaction open: Kafka's `isProducerExpired`),
/// in producer id order, at most `budget`. Returns how many.
async fn expire_partition(
    conn: &mut PgConnection,
    partition_id: i64,
    expiration: i64,
    budget: u64,
    now: i64,
) -> Result<u64, Attempt> {
    let expired: i64 = sqlx::query_scalar(
        "WITH gone AS (DELETE FROM producer_state s WHERE s.partition_id = $1 \
         AND s.producer_id IN (SELECT v.producer_id FROM producer_state v \
         WHERE v.partition_id = $1 AND $2 - v.last_append_ms >= $3 \
         AND v.txn_first_offset IS NULL \
         ORDER BY v.producer_id LIMIT $4) RETURNING 1) \
         SELECT count(*) FROM gone",
    )
    .bind(partition_id)
    .bind(now)
    .bind(expiration)
    .bind(i64::try_from(budget).unwrap_or(i64::MAX))
    .fetch_one(&mut *conn)
    .await
    .map_err(Attempt::before)?;
    Ok(to_u64(expired, "expired producers")?)
}

/// A lifecycle pass over partitions, with a budget: retention (batches) or producer expiry
/// (producer states).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Retention,
    ProducerExpiry,
}

impl Pass {
    /// The condition on a partition `pa` (joined with its topic `t`) that the pass may change at
    /// time `$1`. Retention: over its size limit, or with a first batch older than retention.ms.
    /// Producer expiry: with a producer state expired (none with an open transaction expires, none
    /// updated less than `floor` ms ago: [`crate::producer_expired`], issue #25).
    fn candidates(self, floor: i64) -> String {
        match self {
            // The first item is the first tiered segment when the partition has any (one probe
            // of the segments' primary key), else its first batch.
            Pass::Retention => format!(
                "pa.byte_size > 0 AND (t.retention_bytes >= 0 OR t.retention_ms >= 0) \
                 AND t.cleanup_policy <> 'compact' \
                 AND EXISTS (SELECT 1 FROM ( \
                 (SELECT 0 AS k, s.log_size AS size, s.retention_ts AS ts \
                  FROM tiered_segments s WHERE pa.tiered_bytes > 0 \
                  AND s.partition_id = pa.partition_id ORDER BY s.end_offset LIMIT 1) \
                 UNION ALL \
                 (SELECT 1, b.byte_size, {ts} FROM batches b \
                  WHERE b.partition_id = pa.partition_id ORDER BY b.last_offset LIMIT 1) \
                 ORDER BY k LIMIT 1) f \
                 WHERE (t.retention_bytes >= 0 AND pa.byte_size - f.size >= t.retention_bytes) \
                 OR (t.retention_ms >= 0 AND $1::numeric - f.ts > t.retention_ms))",
                ts = retention_ts()
            ),
            Pass::ProducerExpiry => format!(
                "EXISTS (SELECT 1 FROM producer_state s \
                 WHERE s.partition_id = pa.partition_id \
                 AND $1 - s.last_append_ms >= GREATEST(t.producer_id_expiration_ms, {floor}::bigint) \
                 AND s.txn_first_offset IS NULL)"
            ),
        }
    }
}

/// The candidate partitions of a pass, page by page in the global lock order, each page after
/// the last partition of the one before.
struct CandidateWalk {
    candidates: String,
    /// The last partition returned: (topic id, partition).
    after: Option<(String, i32)>,
    done: bool,
}

impl CandidateWalk {
    fn new(pass: Pass, floor: i64) -> Self {
        CandidateWalk {
            candidates: pass.candidates(floor),
            after: None,
            done: false,
        }
    }

    /// The ids of the next page of candidate partitions at `now`; `None` once there are no more.
    async fn next_page(
        &mut self,
        conn: &mut PgConnection,
        now: i64,
    ) -> Result<Option<Vec<i64>>, Attempt> {
        if self.done {
            return Ok(None);
        }
        let (cursor, topic, partition) = resume_after(&self.after);
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT pa.partition_id, pa.topic_id::text, pa.partition \
             FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
             WHERE {candidates} {cursor} \
             ORDER BY pa.topic_id, pa.partition LIMIT {CANDIDATES_PAGE}",
            candidates = self.candidates
        )))
        .bind(now)
        .bind(topic)
        .bind(partition)
        .fetch_all(&mut *conn)
        .await
        .map_err(Attempt::before)?;
        self.done = (rows.len() as i64) < CANDIDATES_PAGE;
        if let Some(last) = rows.last() {
            self.after = Some((last.string_at(1)?, last.i32_at(2)?));
        }
        let ids = rows.iter().map(|r| r.i64_at(0)).collect::<Result<_, _>>()?;
        Ok(Some(ids))
    }
}

impl PostgresCoordinator {
    pub(super) async fn write_delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        self.retrying(|now| self.try_delete_records(requests, now))
            .await
    }

    /// One attempt of DeleteRecords: every partition is locked up front, in the global order.
    async fn try_delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
        now: i64,
    ) -> Result<Vec<DeleteRecordsResponse>, Attempt> {
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        let (topic_ids, partitions) = partition_arrays(requests.iter().map(|r| r.partition));
        let rows = sqlx::query(
            "SELECT pa.topic_id::text, pa.partition, pa.partition_id, pa.log_start_offset, \
             pa.high_watermark FROM partitions pa WHERE (pa.topic_id, pa.partition) IN \
             (SELECT u.t, u.p FROM unnest($1::text[]::uuid[], $2::integer[]) AS u(t, p)) \
             ORDER BY pa.topic_id, pa.partition FOR UPDATE",
        )
        .bind(&topic_ids)
        .bind(&partitions)
        .fetch_all(&mut *tx)
        .await
        .map_err(Attempt::before)?;
        // (partition_id, log start offset, high watermark)
        let mut logs: HashMap<TopicIdPartition, (i64, i64, i64)> = HashMap::new();
        for row in &rows {
            let p = TopicIdPartition::new(parse_topic_id(&row.string_at(0)?)?, row.i32_at(1)?);
            logs.insert(p, (row.i64_at(2)?, row.i64_at(3)?, row.i64_at(4)?));
        }
        let mut released = BTreeMap::new();
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let Some((partition_id, lso, hwm)) = logs.get_mut(&request.partition) else {
                responses.push(DeleteRecordsResponse::error(
                    ErrorCode::UnknownTopicOrPartition,
                ));
                continue;
            };
            let target = match delete_records_target(request.offset, *hwm) {
                Ok(target) => target,
                Err(code) => {
                    responses.push(DeleteRecordsResponse::error(code));
                    continue;
                }
            };
            if target > *lso {
                // Segments ending below the target go; one straddling it stays.
                trim_below(&mut tx, *partition_id, target, &mut released).await?;
                *lso = target;
            }
            responses.push(DeleteRecordsResponse {
                error: ErrorCode::None,
                low_watermark: *lso,
            });
        }
        release_objects(&mut tx, &released, now).await?;
        tx.commit().await.map_err(Attempt::sent)?;
        Ok(responses)
    }

    pub(super) async fn write_expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        let expired = self
            .write_pass(Pass::ProducerExpiry, max_producers)
            .await?
            .batches;
        Ok(ProducerExpiryReport {
            expired,
            more: max_producers > 0 && expired == u64::from(max_producers),
        })
    }

    pub(super) async fn write_enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let t = self.write_pass(Pass::Retention, max_batches).await?;
        Ok(RetentionReport {
            batches_deleted: t.batches,
            bytes_deleted: to_u64(t.bytes, "deleted bytes")?,
            segments_deleted: t.segments,
            more: max_batches > 0 && t.batches + t.segments == u64::from(max_batches),
        })
    }

    /// A pass (see [`crate::BatchCoordinator::enforce_retention`] and
    /// [`crate::BatchCoordinator::expire_producers`]), retried after conflicts: what it deleted
    /// (batches, segments and bytes; producer expiry counts its producer states as batches).
    async fn write_pass(&self, pass: Pass, budget: u32) -> Result<Trimmed, CoordinatorError> {
        self.retrying(|now| self.try_pass(pass, budget, now)).await
    }

    /// One attempt of a pass: candidate partitions are found page by page in the global lock
    /// order ([`CandidateWalk`]); each is locked and changed (a commit writes a partition's
    /// batches and producer states only under that lock, so what a commit refreshed meanwhile is
    /// seen and kept), and the walk stops as soon as the budget is spent, so a pass holds its row
    /// locks for work bounded by its budget (plus one page of candidates), whatever the number of
    /// partitions.
    async fn try_pass(&self, pass: Pass, budget: u32, now: i64) -> Result<Trimmed, Attempt> {
        if budget == 0 {
            return Ok(Trimmed::default());
        }
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        let floor = match pass {
            Pass::Retention => 0,
            Pass::ProducerExpiry => self.producer_state_floor(&mut tx).await?,
        };
        let mut left = u64::from(budget);
        let mut total = Trimmed::default();
        let mut released = BTreeMap::new();
        let mut walk = CandidateWalk::new(pass, floor);
        'walk: while let Some(page) = walk.next_page(&mut tx, now).await? {
            for partition_id in page {
                let locked = lock_partition(&mut tx, partition_id).await?;
                if pass == Pass::Retention {
                    self.counters
                        .retention_partitions
                        .fetch_add(1, Ordering::Relaxed);
                }
                let spent = match (pass, locked) {
                    (_, None) => 0,
                    (Pass::Retention, Some(p)) => {
                        let rule = RetentionRule {
                            size: p.size,
                            retention_ms: p.retention_ms,
                            retention_bytes: p.retention_bytes,
                            now,
                        };
                        let t = trim_partition(&mut tx, partition_id, rule, left, &mut released)
                            .await?;
                        total.batches += t.batches;
                        total.segments += t.segments;
                        total.bytes += t.bytes;
                        t.batches + t.segments
                    }
                    (Pass::ProducerExpiry, Some(p)) => {
                        let expiration = p.producer_id_expiration_ms.max(floor);
                        let n =
                            expire_partition(&mut tx, partition_id, expiration, left, now).await?;
                        total.batches += n;
                        n
                    }
                };
                left = left.saturating_sub(spent);
                if left == 0 {
                    // The budget is spent: no further partition is examined or locked.
                    break 'walk;
                }
            }
        }
        release_objects(&mut tx, &released, now).await?;
        tx.commit().await.map_err(Attempt::sent)?;
        Ok(total)
    }

    /// The floor of producer expiry ([`crate::producer_state_floor_ms`]) for this schema: from the
    /// largest `max_commit_age` any coordinator of it connected with (`coordinator_settings`,
    /// migration 6, raised before a coordinator's first commit), since any of them may commit a
    /// key that late; never below this coordinator's own. Read in the pass's transaction, the row
    /// held `FOR SHARE` so that a coordinator raising it waits for the pass (issue #25).
    async fn producer_state_floor(&self, conn: &mut PgConnection) -> Result<i64, Attempt> {
        let stored: Option<i64> = sqlx::query_scalar(
            "SELECT max_commit_age_ms FROM coordinator_settings WHERE id = 1 FOR SHARE",
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(Attempt::before)?;
        let own = crate::max_age_ms(self.options.max_commit_age);
        let age = stored.unwrap_or(own).max(own);
        Ok(age.saturating_mul(crate::PRODUCER_STATE_FLOOR_FACTOR))
    }

    /// The marked objects, on the primary (a replica could list an object already forgotten).
    pub(super) async fn read_objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        self.check_open()?;
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT x.*, o.kind FROM ({OBJECTS_TO_DELETE}) x \
             JOIN objects o ON o.object_key = x.object_key \
             ORDER BY x.marked_for_deletion_at, x.object_key"
        )))
        .bind(marked_before_ms)
        .bind(i64::from(limit))
        .fetch_all(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        rows.iter()
            .map(|r| {
                Ok(ObjectToDelete {
                    kind: object_kind(r.i16_at(3)?)?,
                    ..object_to_delete_from_row(r)?
                })
            })
            .collect()
    }

    /// Fence retention and the expiry batch, as the server-side functions take them.
    fn fence_arguments(&self) -> (i64, i32) {
        let retention = crate::max_age_ms(self.options.max_commit_age)
            .saturating_mul(crate::FENCE_RETENTION_FACTOR);
        let expiry_batch = i32::try_from(crate::FENCE_EXPIRY_BATCH).unwrap_or(i32::MAX);
        (retention, expiry_batch)
    }

    pub(super) async fn write_confirm_deleted(
        &self,
        object_keys: &[String],
    ) -> Result<(), CoordinatorError> {
        self.check_open()?;
        if object_keys.is_empty() {
            return Ok(());
        }
        self.retrying(|_| self.try_confirm_deleted(object_keys))
            .await
    }

    /// One attempt of `confirm_deleted`: one statement, one transaction. It forgets the marked
    /// objects among the keys and fences their keys (the objects' delete trigger, migration 6),
    /// after dropping up to FENCE_EXPIRY_BATCH expired fences.
    async fn try_confirm_deleted(&self, object_keys: &[String]) -> Result<(), Attempt> {
        let (retention, expiry_batch) = self.fence_arguments();
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        sqlx::query("SELECT confirm_deleted($1, $2, $3)")
            .bind(object_keys)
            .bind(retention)
            .bind(expiry_batch)
            .execute(&mut *conn)
            .await
            .map_err(Attempt::sent)?;
        Ok(())
    }

    pub(super) async fn write_fence_orphans(
        &self,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        self.retrying(|_| self.try_fence_orphans(object_keys)).await
    }

    /// One attempt of `fence_orphans`: one statement, one transaction, so the fences are recorded
    /// atomically (under the per-key advisory locks commits take too).
    async fn try_fence_orphans(&self, object_keys: &[String]) -> Result<Vec<String>, Attempt> {
        let times: Vec<Option<i64>> = object_keys
            .iter()
            .map(|k| crate::object_key_time_ms(k))
            .collect();
        let (retention, expiry_batch) = self.fence_arguments();
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        sqlx::query_scalar::<_, String>("SELECT r_object_key FROM fence_orphans($1, $2, $3, $4)")
            .bind(object_keys)
            .bind(&times)
            .bind(retention)
            .bind(expiry_batch)
            .fetch_all(&mut *conn)
            .await
            .map_err(Attempt::sent)
    }
}
