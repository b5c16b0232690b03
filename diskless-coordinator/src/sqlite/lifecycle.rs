//! The life of batches and objects after their commit: DeleteRecords, retention, producer expiry,
//! the object cleaner's calls (`objects_to_delete`, `confirm_deleted`) and the orphan collector's
//! fences. Every write holds the single writer for work bounded by its budget.

use super::SqliteCoordinator;
use super::reads::{Bounds, known_keys, partition_bounds};
use super::sql::{CHUNK, at_commit, execute_rows, not_applied};
use crate::rows::{SqlRow, object_kind, object_to_delete_from_row, retention_rows, to_u64};
use crate::rules::{RetentionRule, RetentionScan, delete_records_target};
use crate::{
    CoordinatorError, DeleteRecordsRequest, DeleteRecordsResponse, ErrorCode, FENCE_EXPIRY_BATCH,
    ObjectToDelete, ProducerExpiryReport, RetentionReport, fence_expiry_before, object_key_time_ms,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Retention: the next page of up to `?3` of a partition's oldest batches, after last offset `?2`,
/// with the time retention ages each by (its effective max timestamp, or its object's commit time
/// when it has no timestamp; a transaction marker, which has no object, always has one). An index
/// range of the primary key and one primary-key probe of `objects` per row.
pub(super) const RETENTION_BATCHES: &str = "SELECT b.last_offset, b.byte_size, \
     CASE WHEN b.effective_max_timestamp >= 0 THEN b.effective_max_timestamp \
     ELSE COALESCE(o.committed_at, -1) END \
     FROM batches b LEFT JOIN objects o ON o.object_id = b.object_id \
     WHERE b.partition_id = ?1 AND b.last_offset > ?2 ORDER BY b.last_offset LIMIT ?3";

/// Retention: the next page of up to `?3` of a partition's oldest tiered segments, after end
/// offset `?2`, with the time retention ages each by: a range of the primary key. A partition's
/// segments come before its batches, so a page is read here first and completed from
/// [`RETENTION_BATCHES`].
pub(super) const RETENTION_SEGMENTS: &str = "SELECT end_offset, log_size, retention_ts \
     FROM tiered_segments WHERE partition_id = ?1 AND end_offset > ?2 \
     ORDER BY end_offset LIMIT ?3";

/// The marked objects older than `?1`, oldest first, at most `?2`:
/// [`crate::rows::OBJECTS_TO_DELETE`]'s columns, then the object's kind.
pub(super) const OBJECTS_TO_DELETE_KIND: &str = "SELECT object_key, marked_for_deletion_at, \
     object_size, kind FROM objects WHERE marked_for_deletion_at IS NOT NULL \
     AND marked_for_deletion_at < ?1 ORDER BY marked_for_deletion_at, object_key LIMIT ?2";

/// Retention: the next page of up to `?4` partitions, after (`?1`, `?2`) in (topic id, partition)
/// order, of topics whose cleanup.policy deletes, whose FIRST item (its first tiered segment, else its first batch) retention deletes at
/// time `?3`: older than retention.ms (aged as in [`RETENTION_SEGMENTS`] and
/// [`RETENTION_BATCHES`]), or removable by retention.bytes (what is left without it is still at
/// least retention.bytes). That is exactly "retention deletes something here" (Kafka 3.x order:
/// the time-breached prefix, then size on what is left), so every partition returned gives the
/// pass at least one batch and a pass reads at most its budget of partitions' batches. A range of
/// the unique index on (topic_id, partition), and per partition with live bytes one or two
/// primary-key probes of its first segment and, when it has none, of its first batch (no row
/// leaves SQLite for a partition with nothing to delete).
pub(super) const RETENTION_CANDIDATES: &str = "SELECT p.partition_id, p.topic_id, p.partition, \
     p.byte_size, t.retention_ms, t.retention_bytes \
     FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
     WHERE (p.topic_id, p.partition) > (?1, ?2) AND p.byte_size > 0 \
     AND t.cleanup_policy <> 'compact' \
     AND ((t.retention_ms >= 0 AND ?3 - COALESCE((SELECT s.retention_ts FROM tiered_segments s \
           WHERE s.partition_id = p.partition_id ORDER BY s.end_offset LIMIT 1), \
           (SELECT CASE WHEN b.effective_max_timestamp >= 0 \
           THEN b.effective_max_timestamp ELSE COALESCE((SELECT o.committed_at FROM objects o \
           WHERE o.object_id = b.object_id), -1) END \
           FROM batches b WHERE b.partition_id = p.partition_id \
           ORDER BY b.last_offset LIMIT 1)) > t.retention_ms) \
       OR (t.retention_bytes >= 0 AND p.byte_size - COALESCE((SELECT s.log_size \
           FROM tiered_segments s WHERE s.partition_id = p.partition_id \
           ORDER BY s.end_offset LIMIT 1), (SELECT b.byte_size FROM batches b \
           WHERE b.partition_id = p.partition_id ORDER BY b.last_offset LIMIT 1)) \
           >= t.retention_bytes)) \
     ORDER BY p.topic_id, p.partition LIMIT ?4";

/// Candidate partitions read per page by a retention pass.
const RETENTION_CANDIDATE_PAGE: i64 = 64;

/// Producer expiry: up to `?2` expired (partition, producer id) states at time `?1`, in (topic id,
/// partition, producer id) order: partitions in the order of their unique index, each one's states
/// in primary-key order, stopping at the limit. A producer with an open transaction never expires
/// (Kafka's `isProducerExpired`), nor one updated less than `?3` ms ago (the floor of
/// [`crate::producer_expired`], issue #25).
pub(super) const EXPIRED_PRODUCERS: &str = "SELECT s.partition_id, s.producer_id \
     FROM partitions p JOIN topics t ON t.topic_id = p.topic_id \
     JOIN producer_state s ON s.partition_id = p.partition_id \
     WHERE ?1 - s.last_append_ms >= MAX(t.producer_id_expiration_ms, ?3) \
     AND s.txn_first_offset IS NULL \
     ORDER BY p.topic_id, p.partition, s.producer_id LIMIT ?2";

/// The statement taking the bytes of the batches `batches` (a `SELECT object_id, SUM(byte_size)
/// AS bytes FROM batches ... GROUP BY object_id`) off their objects' live bytes, marking objects
/// left with none at the time bound as `now` (a parameter such as `?3`). Transaction markers have
/// no object (`object_id` NULL): their group matches no object and releases nothing (`batches`
/// leaves them out anyway).
pub(super) fn release_objects_sql(batches: &str, now: &str) -> String {
    format!(
        "UPDATE objects SET live_bytes = MAX(live_bytes - v.bytes, 0), \
         marked_for_deletion_at = CASE WHEN marked_for_deletion_at IS NULL \
         AND live_bytes - v.bytes <= 0 THEN {now} ELSE marked_for_deletion_at END \
         FROM ({batches}) AS v WHERE objects.object_id = v.object_id"
    )
}

/// Takes the bytes of the batches of `partition_id` below `below` off their objects' live bytes,
/// marking objects left with none (markers release nothing: they have no object); then deletes
/// those batches (markers included) and the aborted transactions whose marker went, and moves the
/// partition's log start offset to `below` (never back) and its size down (a marker's 78 bytes
/// included). Returns (count, bytes).
async fn delete_batches_below(
    conn: &mut SqliteConnection,
    partition_id: i64,
    below: i64,
    now: i64,
) -> Result<(i64, i64), CoordinatorError> {
    let row = sqlx::query(
        "SELECT COUNT(*), COALESCE(SUM(byte_size), 0) FROM batches \
         WHERE partition_id = ?1 AND last_offset < ?2",
    )
    .bind(partition_id)
    .bind(below)
    .fetch_one(&mut *conn)
    .await
    .map_err(not_applied)?;
    let (count, bytes) = (row.i64_at(0)?, row.i64_at(1)?);
    if count > 0 {
        let release = release_objects_sql(
            "SELECT object_id, SUM(byte_size) AS bytes FROM batches \
             WHERE partition_id = ?1 AND last_offset < ?2 AND object_id IS NOT NULL \
             GROUP BY object_id",
            "?3",
        );
        sqlx::query(AssertSqlSafe(release))
            .bind(partition_id)
            .bind(below)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(not_applied)?;
        for sql in [
            "DELETE FROM batches WHERE partition_id = ?1 AND last_offset < ?2",
            // The log start never goes back and earlier rows went with earlier moves: the rows
            // below `below` are those below the new log start.
            "DELETE FROM aborted_txns WHERE partition_id = ?1 AND last_offset < ?2",
        ] {
            sqlx::query(sql)
                .bind(partition_id)
                .bind(below)
                .execute(&mut *conn)
                .await
                .map_err(not_applied)?;
        }
    }
    sqlx::query(
        "UPDATE partitions SET log_start_offset = MAX(log_start_offset, ?2), \
         byte_size = byte_size - ?3 WHERE partition_id = ?1",
    )
    .bind(partition_id)
    .bind(below)
    .bind(bytes)
    .execute(&mut *conn)
    .await
    .map_err(not_applied)?;
    Ok((count, bytes))
}

/// Deletes the tiered segments of `partition_id` that end below `below`: their objects' live bytes
/// drop by their `.log` sizes (objects left with none are marked: KIP-405's
/// DELETE_SEGMENT_STARTED), and the partition's size and tiered bytes drop with them. The log
/// start offset is moved by [`delete_batches_below`], which always follows. Returns (count,
/// bytes).
async fn delete_segments_below(
    conn: &mut SqliteConnection,
    partition_id: i64,
    below: i64,
    now: i64,
) -> Result<(i64, i64), CoordinatorError> {
    let row = sqlx::query(
        "SELECT COUNT(*), COALESCE(SUM(log_size), 0) FROM tiered_segments \
         WHERE partition_id = ?1 AND end_offset < ?2",
    )
    .bind(partition_id)
    .bind(below)
    .fetch_one(&mut *conn)
    .await
    .map_err(not_applied)?;
    let (count, bytes) = (row.i64_at(0)?, row.i64_at(1)?);
    if count == 0 {
        return Ok((0, 0));
    }
    let release = release_objects_sql(
        "SELECT object_id, SUM(log_size) AS bytes FROM tiered_segments \
         WHERE partition_id = ?1 AND end_offset < ?2 GROUP BY object_id",
        "?3",
    );
    sqlx::query(AssertSqlSafe(release))
        .bind(partition_id)
        .bind(below)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(not_applied)?;
    sqlx::query("DELETE FROM tiered_segments WHERE partition_id = ?1 AND end_offset < ?2")
        .bind(partition_id)
        .bind(below)
        .execute(&mut *conn)
        .await
        .map_err(not_applied)?;
    sqlx::query(
        "UPDATE partitions SET byte_size = byte_size - ?2, tiered_bytes = tiered_bytes - ?2 \
         WHERE partition_id = ?1",
    )
    .bind(partition_id)
    .bind(bytes)
    .execute(&mut *conn)
    .await
    .map_err(not_applied)?;
    Ok((count, bytes))
}

/// Records fences (key, key time), keeping any existing fence of a key (idempotent).
async fn insert_fences(
    conn: &mut SqliteConnection,
    fences: &[(String, i64)],
) -> Result<(), CoordinatorError> {
    let sql = "INSERT INTO fences (object_key, key_time) VALUES {values} \
         ON CONFLICT (object_key) DO NOTHING";
    execute_rows(conn, sql, 2, fences, |q, (key, time)| {
        q.bind(key).bind(time)
    })
    .await
}

/// DeleteRecords of one partition with `(partition_id, log start offset, high watermark)`, to
/// `offset` (`-1`: the high watermark).
async fn delete_records_in(
    conn: &mut SqliteConnection,
    bounds: Bounds,
    offset: i64,
    now: i64,
) -> Result<DeleteRecordsResponse, CoordinatorError> {
    let (partition_id, lso, hwm) = (bounds.id, bounds.log_start, bounds.hwm);
    let target = match delete_records_target(offset, hwm) {
        Ok(target) => target,
        Err(code) => return Ok(DeleteRecordsResponse::error(code)),
    };
    if target > lso {
        // Whole segments below the target go; one straddling it stays (reads skip below the log
        // start), and so do the batches after it.
        if bounds.tiered_next > lso {
            delete_segments_below(conn, partition_id, target, now).await?;
        }
        delete_batches_below(conn, partition_id, target, now).await?;
    }
    Ok(DeleteRecordsResponse {
        error: ErrorCode::None,
        low_watermark: target.max(lso),
    })
}

impl SqliteCoordinator {
    pub(super) async fn write_delete_records(
        &self,
        requests: &[DeleteRecordsRequest],
    ) -> Result<Vec<DeleteRecordsResponse>, CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let bounds = partition_bounds(&mut tx, request.partition).await?;
            responses.push(match bounds {
                None => DeleteRecordsResponse::error(ErrorCode::UnknownTopicOrPartition),
                Some(bounds) => delete_records_in(&mut tx, bounds, request.offset, now).await?,
            });
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(responses)
    }

    pub(super) async fn write_enforce_retention(
        &self,
        max_batches: u32,
    ) -> Result<RetentionReport, CoordinatorError> {
        let mut writer = self.write().await?;
        let mut report = RetentionReport::default();
        if max_batches == 0 {
            return Ok(report);
        }
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        // The pass holds the write lock, so its work is bounded by its budget, not by the number
        // of partitions: candidates are only the partitions whose first batch retention deletes
        // (found in SQL, one index probe each, see RETENTION_CANDIDATES), so each one examined
        // gives at least one batch; each is read in growing pages that stop at the first batch
        // that stays; and the walk ends as soon as the budget is spent (no further partition is
        // examined).
        let mut budget = u64::from(max_batches);
        let mut after: (String, i64) = (String::new(), i64::MIN);
        'walk: loop {
            let page = sqlx::query(RETENTION_CANDIDATES)
                .bind(&after.0)
                .bind(after.1)
                .bind(now)
                .bind(RETENTION_CANDIDATE_PAGE)
                .fetch_all(&mut *tx)
                .await
                .map_err(not_applied)?;
            for candidate in &page {
                let partition_id = candidate.i64_at(0)?;
                after = (candidate.string_at(1)?, candidate.i64_at(2)?);
                let rule = RetentionRule {
                    size: candidate.i64_at(3)?,
                    retention_ms: candidate.i64_at(4)?,
                    retention_bytes: candidate.i64_at(5)?,
                    now,
                };
                let Some(delete_below) = self
                    .retention_end(&mut tx, partition_id, rule, budget)
                    .await?
                else {
                    continue;
                };
                let (segments, segment_bytes) =
                    delete_segments_below(&mut tx, partition_id, delete_below, now).await?;
                let (count, bytes) =
                    delete_batches_below(&mut tx, partition_id, delete_below, now).await?;
                let segments = to_u64(segments, "deleted segment count")?;
                let count = to_u64(count, "deleted batch count")?;
                report.segments_deleted += segments;
                report.batches_deleted += count;
                report.bytes_deleted += to_u64(bytes + segment_bytes, "deleted bytes")?;
                budget = budget.saturating_sub(count + segments);
                if budget == 0 {
                    break 'walk;
                }
            }
            if (page.len() as i64) < RETENTION_CANDIDATE_PAGE {
                break;
            }
        }
        tx.commit().await.map_err(at_commit)?;
        report.more = report.batches_deleted + report.segments_deleted == u64::from(max_batches);
        Ok(report)
    }

    /// Retention of one partition ([`RetentionScan`]) over its tiered segments then its batches:
    /// the offset below which they go, at most `budget` of them; `None` when nothing goes.
    async fn retention_end(
        &self,
        conn: &mut SqliteConnection,
        partition_id: i64,
        rule: RetentionRule,
        budget: u64,
    ) -> Result<Option<i64>, CoordinatorError> {
        self.counters
            .retention_partitions
            .fetch_add(1, Ordering::Relaxed);
        let mut scan = RetentionScan::new(rule, budget);
        while let Some((after, want)) = scan.next_page() {
            let limit = i64::try_from(want).unwrap_or(i64::MAX);
            let page = |sql, after: i64, limit: i64| {
                sqlx::query(sql).bind(partition_id).bind(after).bind(limit)
            };
            let segments = page(RETENTION_SEGMENTS, after, limit)
                .fetch_all(&mut *conn)
                .await
                .map_err(not_applied)?;
            let mut rows = retention_rows(&segments)?;
            if (rows.len() as u64) < want {
                // The page goes on into the batches, which all come after the segments.
                let after = rows.last().map_or(after, |r| r.0);
                let batches = page(RETENTION_BATCHES, after, limit - rows.len() as i64)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(not_applied)?;
                self.counters
                    .retention_batches_read
                    .fetch_add(batches.len() as u64, Ordering::Relaxed);
                rows.extend(retention_rows(&batches)?);
            }
            scan.feed(&rows, want)?;
        }
        Ok(scan.delete_below())
    }

    pub(super) async fn read_objects_to_delete(
        &self,
        marked_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ObjectToDelete>, CoordinatorError> {
        let query = sqlx::query(OBJECTS_TO_DELETE_KIND)
            .bind(marked_before_ms)
            .bind(i64::from(limit));
        let rows = self.read_rows(query).await?;
        rows.iter()
            .map(|r| {
                let mut object = object_to_delete_from_row(r)?;
                object.kind = object_kind(r.i16_at(3)?)?;
                Ok(object)
            })
            .collect()
    }

    pub(super) async fn write_confirm_deleted(
        &self,
        object_keys: &[String],
    ) -> Result<(), CoordinatorError> {
        if object_keys.is_empty() {
            return Ok(());
        }
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        for chunk in object_keys.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM objects WHERE marked_for_deletion_at IS NOT NULL \
                 AND object_key IN ({}) RETURNING object_key",
                vec!["?"; chunk.len()].join(",")
            );
            let q = chunk.iter().fold(
                sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)),
                |q, key| q.bind(key.as_str()),
            );
            let forgotten = q.fetch_all(&mut *tx).await.map_err(not_applied)?;
            // A forgotten key must never be committed again: the "committed once" guard (the
            // object row) is gone, so a retried commit_file of it would append batches that point
            // into a deleted object. It is fenced in the same transaction, as fence_orphans would,
            // and commit_file refuses it with ObjectFenced; the fence expires like any other, once
            // the commit deadline refuses the key anyway. Keys without a v7 time cannot be fenced
            // (as in fence_orphans).
            let fences: Vec<(String, i64)> = forgotten
                .into_iter()
                .filter_map(|k| object_key_time_ms(&k).map(|t| (k, t)))
                .collect();
            insert_fences(&mut tx, &fences).await?;
        }
        tx.commit().await.map_err(at_commit)
    }

    pub(super) async fn write_fence_orphans(
        &self,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        let mut writer = self.write().await?;
        // One write transaction on the single writer: it serializes with every commit_file, which
        // checks the fences inside its own write transaction. Either the commit ran first (the
        // object is known here and is not fenced) or it runs after and sees the fence.
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        sqlx::query(
            "DELETE FROM fences WHERE object_key IN (SELECT object_key FROM fences \
             WHERE key_time < ?1 ORDER BY key_time LIMIT ?2)",
        )
        .bind(fence_expiry_before(now, self.max_commit_age))
        .bind(i64::from(FENCE_EXPIRY_BATCH))
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        // Distinct keys with a v7 time, in request order.
        let mut seen = HashSet::new();
        let candidates: Vec<(&String, i64)> = object_keys
            .iter()
            .filter(|k| seen.insert(k.as_str()))
            .filter_map(|k| object_key_time_ms(k).map(|t| (k, t)))
            .collect();
        let known = known_keys(&mut tx, candidates.iter().map(|(k, _)| k.as_str())).await?;
        let fenced: Vec<(String, i64)> = candidates
            .into_iter()
            .filter(|(k, _)| !known.contains(k.as_str()))
            .map(|(k, t)| (k.clone(), t))
            .collect();
        insert_fences(&mut tx, &fenced).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(fenced.into_iter().map(|(k, _)| k).collect())
    }

    pub(super) async fn write_expire_producers(
        &self,
        max_producers: u32,
    ) -> Result<ProducerExpiryReport, CoordinatorError> {
        let mut writer = self.write().await?;
        if max_producers == 0 {
            return Ok(ProducerExpiryReport::default());
        }
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        // Reads producer states in the contract's order until `max_producers` expired ones are
        // found: bounded by the cap when many have expired; a pass that finds few reads them all.
        // `?3`: the floor of `crate::producer_expired` (issue #25), applied here, inside the
        // expiry transaction on the one writer, so no state a late commit still needs goes.
        let rows = sqlx::query(EXPIRED_PRODUCERS)
            .bind(now)
            .bind(i64::from(max_producers))
            .bind(crate::producer_state_floor_ms(self.max_commit_age))
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        let expired: Vec<(i64, i64)> = rows
            .iter()
            .map(|r| Ok((r.i64_at(0)?, r.i64_at(1)?)))
            .collect::<Result<_, CoordinatorError>>()?;
        let sql =
            "DELETE FROM producer_state WHERE (partition_id, producer_id) IN (VALUES {values})";
        execute_rows(&mut tx, sql, 2, &expired, |q, (partition, producer)| {
            q.bind(partition).bind(producer)
        })
        .await?;
        tx.commit().await.map_err(at_commit)?;
        let expired = expired.len() as u64;
        Ok(ProducerExpiryReport {
            expired,
            more: expired == u64::from(max_producers),
        })
    }
}
