//! Tiered segments (issue #15, docs/tiered-consolidation.md §2.4): `tiering_candidates`,
//! `segment_plan`, `register_segment` and `list_tiered_segments` (migration 7).
//!
//! A partition's log is its segments (`tiered_segments`, by end offset) followed by its WAL
//! batches; `partitions.tiered_next_offset` is the first offset no segment ever covered and
//! `partitions.tiered_bytes` the `.log` bytes of its live segments (`byte_size` counts both
//! tiers, so `byte_size − tiered_bytes` are its WAL bytes). A segment's object is a row of
//! `objects` of kind 1 whose live bytes are its `.log` size: the cleaner, the fences and the
//! orphan collector treat it as any object. Registration is a write transaction like
//! `commit_file`: the commit point (deadline and fence, the clock read there), then the range
//! checks, then the covered batches go (their objects' live bytes with them) and the segment row
//! comes.

use super::SqliteCoordinator;
use super::lifecycle::release_objects_sql;
use super::reads::{
    Bounds, last_stable_offset, partition_bounds, segments_from, topic_with_tiering_from_row,
};
use super::sql::{at_commit, encode_owners, not_applied};
use crate::rows::{
    SqlRow, TOPIC_COLUMNS, TOPIC_TIERING_COLUMN_COUNT, TOPIC_TIERING_COLUMNS, batch_columns,
    batch_from_row, object_kind_code, segment_columns, segment_from_row, topic_key,
};
use crate::{
    AbortedTxn, BatchCoordinate, CoordinatorError, ErrorCode, NO_TIMESTAMP, ObjectKind,
    RegisterSegmentOutcome, RegisterSegmentRequest, ReplaceSegmentsRequest, SegmentPlan,
    SegmentPlanRequest, TieredSegment, TieringCandidate, TopicIdPartition, check_commit_deadline,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;

/// The partitions due for consolidation at time `?4` with bound `?3` (`now − min_age`), after
/// (`?1`, `?2`) in (topic id, partition) order, at most `?5`: those with WAL bytes whose first
/// WAL batch is below the last stable offset and committed before the bound, and whose WAL bytes
/// reach `segment.bytes` or whose first WAL batch was committed `segment.ms` or more ago. A range
/// of the unique index on (topic_id, partition), and per partition with WAL bytes a few
/// primary-key probes (its first batch, its object, the partial index of open transactions): no
/// row leaves SQLite for a partition that is not due.
pub(super) fn tiering_candidates_sql() -> String {
    format!(
        "SELECT t.topic_id, {TOPIC_COLUMNS}, {TOPIC_TIERING_COLUMNS}, c.partition, c.wal_bytes, \
         c.first_commit, c.tiered_next_offset \
         FROM (SELECT p.topic_id AS topic_id, p.partition AS partition, \
               p.byte_size - p.tiered_bytes AS wal_bytes, \
               p.tiered_next_offset AS tiered_next_offset, \
               MIN(p.high_watermark, COALESCE(MAX((SELECT MIN(s.txn_first_offset) \
                   FROM producer_state s WHERE s.partition_id = p.partition_id \
                   AND s.txn_first_offset IS NOT NULL), p.log_start_offset), \
                   p.high_watermark)) AS lso, \
               (SELECT b.last_offset FROM batches b WHERE b.partition_id = p.partition_id \
                   ORDER BY b.last_offset LIMIT 1) AS first_last, \
               (SELECT CASE WHEN b.object_id IS NULL THEN b.base_timestamp \
                   ELSE (SELECT o.committed_at FROM objects o WHERE o.object_id = b.object_id) \
                   END FROM batches b WHERE b.partition_id = p.partition_id \
                   ORDER BY b.last_offset LIMIT 1) AS first_commit \
               FROM partitions p \
               WHERE (p.topic_id, p.partition) > (?1, ?2) AND p.byte_size > p.tiered_bytes) c \
         JOIN topics t ON t.topic_id = c.topic_id \
         WHERE c.first_last < c.lso AND c.first_commit < ?3 \
         AND (c.wal_bytes >= t.segment_bytes OR ?4 - c.first_commit >= \
              CASE WHEN t.cleanup_policy = 'delete' THEN t.segment_ms \
              ELSE MIN(t.segment_ms, t.max_compaction_lag_ms) END) \
         ORDER BY c.topic_id, c.partition LIMIT ?5"
    )
}

/// A plan's page: up to `?3` of partition `?1`'s batches from last offset `?2` on, each with its
/// commit time (its object's, or a marker's own timestamp): a range of the primary key and one
/// primary-key probe of `objects` per batch.
pub(super) fn plan_batches_sql() -> String {
    format!(
        "SELECT {}, CASE WHEN b.object_id IS NULL THEN b.base_timestamp ELSE o.committed_at END \
         FROM batches b LEFT JOIN objects o ON o.object_id = b.object_id \
         WHERE b.partition_id = ?1 AND b.last_offset >= ?2 ORDER BY b.last_offset LIMIT ?3",
        batch_columns("o")
    )
}

/// The last registered segment of partition `?1`: one probe of the primary key, from its end.
pub(super) fn last_segment_sql() -> String {
    format!(
        "SELECT {} FROM tiered_segments s JOIN objects o ON o.object_id = s.object_id \
         WHERE s.partition_id = ?1 ORDER BY s.end_offset DESC LIMIT 1",
        segment_columns("s", "o")
    )
}

/// The aborted transactions of partition `?1` whose marker is in `?2..=?3`, by marker offset: a
/// range of the primary key.
pub(super) const ABORTED_IN_RANGE: &str = "SELECT producer_id, first_offset, last_offset \
     FROM aborted_txns WHERE partition_id = ?1 AND last_offset >= ?2 AND last_offset <= ?3 \
     ORDER BY last_offset";

/// Registration's range check: over partition `?1`'s first batches up to last offset `?2`, at
/// most `?3` of them (the request's count + 1, so that the check reads a bounded range): their
/// count, bytes, first base offset, last offset, the largest time retention ages them by
/// (effective max timestamp, else commit time) and the running max timestamp at the last one. A
/// range of the primary key from the partition's first batch.
pub(super) const SEGMENT_RANGE: &str = "SELECT COUNT(*), COALESCE(SUM(byte_size), 0), \
     MIN(base_offset), MAX(last_offset), MAX(rts), MAX(max_timestamp_so_far) \
     FROM (SELECT b.base_offset, b.last_offset, b.byte_size, b.max_timestamp_so_far, \
           CASE WHEN b.effective_max_timestamp >= 0 THEN b.effective_max_timestamp \
           WHEN b.object_id IS NULL THEN b.base_timestamp \
           ELSE (SELECT o.committed_at FROM objects o WHERE o.object_id = b.object_id) END AS rts \
           FROM batches b WHERE b.partition_id = ?1 AND b.last_offset <= ?2 \
           ORDER BY b.last_offset LIMIT ?3)";

/// The running max timestamp of partition `?1`'s last segment: one probe of the primary key.
pub(super) const LAST_SEGMENT_SO_FAR: &str = "SELECT max_timestamp_so_far FROM tiered_segments \
     WHERE partition_id = ?1 ORDER BY end_offset DESC LIMIT 1";

/// Batches read per round trip while planning a segment.
const PLAN_PAGE: i64 = 128;

/// What a segment object row remembers of its registration (`objects.segment`): a retried
/// registration of the key must repeat it to be `AlreadyRegistered`.
fn segment_identity(p: TopicIdPartition, base_offset: i64, end_offset: i64) -> String {
    format!(
        "{}/{}/{base_offset}/{end_offset}",
        topic_key(p.topic_id),
        p.partition
    )
}

/// A size the request gives as `u64` that a column stores as `i64`.
fn as_i64(v: u64, what: &str) -> Result<i64, CoordinatorError> {
    i64::try_from(v).map_err(|_| CoordinatorError::InvalidRequest(format!("{what} too large")))
}

impl SqliteCoordinator {
    pub(super) async fn read_tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map_or((String::new(), i64::MIN), |p| {
            (topic_key(p.topic_id), i64::from(p.partition))
        });
        let sql = tiering_candidates_sql();
        let query = sqlx::query(AssertSqlSafe(sql))
            .bind(after.0)
            .bind(after.1)
            .bind(now_ms.saturating_sub(min_age_ms))
            .bind(now_ms)
            .bind(i64::from(limit));
        let rows = self.read_rows(query).await?;
        // After the topic id, the ten of TOPIC_COLUMNS and the later settings.
        let at = 10 + TOPIC_TIERING_COLUMN_COUNT;
        rows.iter()
            .map(|r| {
                let topic = topic_with_tiering_from_row(r)?;
                Ok(TieringCandidate {
                    partition: TopicIdPartition::new(topic.topic_id, r.i32_at(at)?),
                    config: topic.config,
                    wal_bytes: r.i64_at(at + 1)?,
                    oldest_wal_commit_ms: r.i64_at(at + 2)?,
                    tiered_next_offset: r.i64_at(at + 3)?,
                })
            })
            .collect()
    }

    pub(super) async fn read_segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.begin().await?;
        let Some(bounds) = partition_bounds(&mut tx, request.partition).await? else {
            return Ok(SegmentPlan::error(ErrorCode::UnknownTopicOrPartition));
        };
        let lso = last_stable_offset(&mut tx, bounds.id, bounds.log_start, bounds.hwm).await?;
        let batches = plan_batches(&mut tx, bounds.id, lso, request).await?;
        let aborted = match (batches.first(), batches.last()) {
            (Some(first), Some(last)) => {
                let rows = sqlx::query(ABORTED_IN_RANGE)
                    .bind(bounds.id)
                    .bind(first.base_offset)
                    .bind(last.last_offset)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(not_applied)?;
                rows.iter()
                    .map(|r| {
                        Ok(AbortedTxn {
                            producer_id: r.i64_at(0)?,
                            first_offset: r.i64_at(1)?,
                            last_offset: r.i64_at(2)?,
                        })
                    })
                    .collect::<Result<_, CoordinatorError>>()?
            }
            _ => Vec::new(),
        };
        let previous = sqlx::query(AssertSqlSafe(last_segment_sql()))
            .bind(bounds.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?
            .map(|r| segment_from_row(&r, 0))
            .transpose()?;
        tx.commit().await.map_err(not_applied)?;
        Ok(SegmentPlan {
            error: ErrorCode::None,
            batches,
            previous,
            log_start_offset: bounds.log_start,
            high_watermark: bounds.hwm,
            aborted,
        })
    }

    pub(super) async fn write_register_segment(
        &self,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        as_i64(request.object_size, "object size")?;
        let log_size = as_i64(request.layout.log, "segment log size")?;
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        // The commit point, as in `commit_file`: the writer mutex and SQLite's write lock are held
        // from here to COMMIT, so the clock read here is after any wait for them; nothing is
        // applied past the deadline or for a fenced key (returning drops the transaction).
        let now = self.clock.now_ms();
        if let Some(done) = self.segment_commit_point(&mut tx, &request, now).await? {
            return Ok(done);
        }
        let Some(Bounds {
            id: partition_id,
            log_start,
            hwm,
            ..
        }) = partition_bounds(&mut tx, request.partition).await?
        else {
            return Ok(RegisterSegmentOutcome::UnknownPartition);
        };
        // The range must be exactly the partition's first WAL batches as the request counts them
        // (base, an end at a batch boundary, count, bytes), and below the last stable offset.
        let lso = last_stable_offset(&mut tx, partition_id, log_start, hwm).await?;
        let range = sqlx::query(SEGMENT_RANGE)
            .bind(partition_id)
            .bind(request.end_offset)
            .bind(i64::from(request.batch_count) + 1)
            .fetch_one(&mut *tx)
            .await
            .map_err(not_applied)?;
        let count = range.i64_at(0)?;
        if count == 0
            || count != i64::from(request.batch_count)
            || range.i64_at(1)? != log_size
            || range.i64_at(2)? != request.base_offset
            || range.i64_at(3)? != request.end_offset
            || request.end_offset >= lso
        {
            return Ok(RegisterSegmentOutcome::Stale);
        }
        let retention_ts = range.i64_at(4)?;
        let previous_so_far: Option<i64> = sqlx::query_scalar(LAST_SEGMENT_SO_FAR)
            .bind(partition_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
        // Never below an earlier segment's, nor below the segment's own max timestamp: the
        // timestamp index stays monotonic whatever the request says.
        let so_far = range
            .i64_at(5)?
            .max(request.max_timestamp)
            .max(previous_so_far.unwrap_or(i64::MIN));
        // The covered batches' objects lose their bytes (markers have none); an object left with
        // none is marked, and counted.
        let release = release_objects_sql(
            "SELECT object_id, SUM(byte_size) AS bytes FROM batches \
             WHERE partition_id = ?1 AND last_offset <= ?2 AND object_id IS NOT NULL \
             GROUP BY object_id",
            "?3",
        );
        let marked: Vec<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "{release} RETURNING marked_for_deletion_at"
        )))
        .bind(partition_id)
        .bind(request.end_offset)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(not_applied)?;
        // A covered batch's object held its live bytes, so it was not marked before: every
        // object marked now was marked by this registration.
        let released_objects = marked.iter().filter(|m| m.is_some()).count();
        for sql in [
            "DELETE FROM batches WHERE partition_id = ?1 AND last_offset <= ?2",
            "DELETE FROM aborted_txns WHERE partition_id = ?1 AND last_offset <= ?2",
        ] {
            sqlx::query(sql)
                .bind(partition_id)
                .bind(request.end_offset)
                .execute(&mut *tx)
                .await
                .map_err(not_applied)?;
        }
        insert_segment(
            &mut tx,
            partition_id,
            &request,
            SegmentRowExtras {
                now,
                so_far,
                retention_ts,
                compacted: false,
            },
        )
        .await?;
        // The partition's bytes stay (the same bytes, now in a segment).
        sqlx::query(
            "UPDATE partitions SET tiered_next_offset = ?2, tiered_bytes = tiered_bytes + ?3 \
             WHERE partition_id = ?1",
        )
        .bind(partition_id)
        .bind(request.end_offset + 1)
        .bind(log_size)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)?;
        Ok(RegisterSegmentOutcome::Registered {
            released_objects: u32::try_from(released_objects).unwrap_or(u32::MAX),
        })
    }

    /// The commit point of a segment key, with the writer's transaction held: the deadline at
    /// `now`, the fence, then idempotence on the key (a retry of this very segment is answered
    /// `AlreadyRegistered`, any other use of a known key refused). `None`: go on.
    async fn segment_commit_point(
        &self,
        conn: &mut SqliteConnection,
        request: &RegisterSegmentRequest,
        now: i64,
    ) -> Result<Option<RegisterSegmentOutcome>, CoordinatorError> {
        check_commit_deadline(&request.object_key, now, self.max_commit_age)?;
        let fenced = sqlx::query("SELECT 1 FROM fences WHERE object_key = ?1")
            .bind(&request.object_key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(not_applied)?;
        if fenced.is_some() {
            return Err(CoordinatorError::ObjectFenced(request.object_key.clone()));
        }
        let identity = segment_identity(request.partition, request.base_offset, request.end_offset);
        let known: Option<Option<String>> =
            sqlx::query_scalar("SELECT segment FROM objects WHERE object_key = ?1")
                .bind(&request.object_key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(not_applied)?;
        match known {
            None => Ok(None),
            Some(Some(s)) if s == identity => Ok(Some(RegisterSegmentOutcome::AlreadyRegistered)),
            Some(_) => Err(CoordinatorError::ObjectAlreadyCommitted(
                request.object_key.clone(),
            )),
        }
    }

    pub(super) async fn write_replace_segments(
        &self,
        request: ReplaceSegmentsRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        // The commit point, as in `write_register_segment`.
        let now = self.clock.now_ms();
        if let Some(new) = &request.segment
            && let Some(done) = self.segment_commit_point(&mut tx, new, now).await?
        {
            return Ok(done);
        }
        let Some(Bounds {
            id: partition_id, ..
        }) = partition_bounds(&mut tx, request.partition).await?
        else {
            return Ok(RegisterSegmentOutcome::UnknownPartition);
        };
        // The replaced segments must be exactly the partition's segments from the first one on.
        let (Some(first), Some(last)) = (request.replaced.first(), request.replaced.last()) else {
            return Err(CoordinatorError::InvalidRequest(
                "a replacement names at least one segment".into(),
            ));
        };
        let rows = sqlx::query(AssertSqlSafe(segments_from()))
            .bind(partition_id)
            .bind(first.base_offset)
            .bind(request.replaced.len() as i64)
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        let current: Vec<TieredSegment> = rows
            .iter()
            .map(|r| segment_from_row(r, 0))
            .collect::<Result<_, _>>()?;
        let matches = current.len() == request.replaced.len()
            && current.iter().zip(&request.replaced).all(|(c, r)| {
                c.object_key == r.object_key
                    && c.base_offset == r.base_offset
                    && c.end_offset == r.end_offset
            });
        if !matches {
            return Ok(RegisterSegmentOutcome::Stale);
        }
        let old_bytes: i64 = current
            .iter()
            .map(|c| as_i64(c.layout.log, "segment log size"))
            .sum::<Result<_, _>>()?;
        let retention_ts = current
            .iter()
            .map(|c| c.retention_ts)
            .max()
            .unwrap_or(NO_TIMESTAMP);
        // The replaced objects lose their bytes; each is marked (a segment object is one
        // segment's alone).
        let release = release_objects_sql(
            "SELECT object_id, log_size AS bytes FROM tiered_segments \
             WHERE partition_id = ?1 AND end_offset >= ?2 AND end_offset <= ?3",
            "?4",
        );
        let marked: Vec<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "{release} RETURNING marked_for_deletion_at"
        )))
        .bind(partition_id)
        .bind(first.end_offset)
        .bind(last.end_offset)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(not_applied)?;
        let released_objects = marked.iter().filter(|m| **m == Some(now)).count();
        sqlx::query(
            "DELETE FROM tiered_segments WHERE partition_id = ?1 AND end_offset >= ?2 \
             AND end_offset <= ?3",
        )
        .bind(partition_id)
        .bind(first.end_offset)
        .bind(last.end_offset)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        let mut new_bytes = 0;
        if let Some(new) = &request.segment {
            new_bytes = as_i64(new.layout.log, "segment log size")?;
            let previous_so_far: Option<i64> = sqlx::query_scalar(
                "SELECT max_timestamp_so_far FROM tiered_segments \
                 WHERE partition_id = ?1 AND end_offset < ?2 ORDER BY end_offset DESC LIMIT 1",
            )
            .bind(partition_id)
            .bind(first.base_offset)
            .fetch_optional(&mut *tx)
            .await
            .map_err(not_applied)?;
            let so_far = new.max_timestamp.max(previous_so_far.unwrap_or(i64::MIN));
            insert_segment(
                &mut tx,
                partition_id,
                new,
                SegmentRowExtras {
                    now,
                    so_far,
                    retention_ts,
                    compacted: true,
                },
            )
            .await?;
        }
        sqlx::query(
            "UPDATE partitions SET tiered_bytes = tiered_bytes + ?2, byte_size = byte_size + ?2 \
             WHERE partition_id = ?1",
        )
        .bind(partition_id)
        .bind(new_bytes - old_bytes)
        .execute(&mut *tx)
        .await
        .map_err(not_applied)?;
        tx.commit().await.map_err(at_commit)?;
        Ok(RegisterSegmentOutcome::Registered {
            released_objects: u32::try_from(released_objects).unwrap_or(u32::MAX),
        })
    }

    pub(super) async fn read_list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.begin().await?;
        let Some(bounds) = partition_bounds(&mut tx, partition).await? else {
            return Err(CoordinatorError::UnknownTopic(partition.to_string()));
        };
        let rows = sqlx::query(AssertSqlSafe(segments_from()))
            .bind(bounds.id)
            .bind(from_offset)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        tx.commit().await.map_err(not_applied)?;
        rows.iter().map(|r| segment_from_row(r, 0)).collect()
    }
}

/// What a segment row holds besides its registration request.
struct SegmentRowExtras {
    now: i64,
    so_far: i64,
    retention_ts: i64,
    compacted: bool,
}

/// Inserts the object and the segment row of `request` (the `.log` bytes live).
async fn insert_segment(
    conn: &mut SqliteConnection,
    partition_id: i64,
    request: &RegisterSegmentRequest,
    extras: SegmentRowExtras,
) -> Result<(), CoordinatorError> {
    let SegmentRowExtras {
        now,
        so_far,
        retention_ts,
        compacted,
    } = extras;
    let object_size = as_i64(request.object_size, "object size")?;
    let log_size = as_i64(request.layout.log, "segment log size")?;
    let identity = segment_identity(request.partition, request.base_offset, request.end_offset);
    let object_id: i64 = sqlx::query_scalar(
        "INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners, \
         committed_at, marked_for_deletion_at, kind, segment) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8) RETURNING object_id",
    )
    .bind(&request.object_key)
    .bind(request.uploader_broker_id)
    .bind(object_size)
    .bind(log_size)
    .bind(encode_owners(&[request.owner]))
    .bind(now)
    .bind(object_kind_code(ObjectKind::TieredSegment))
    .bind(&identity)
    .fetch_one(&mut *conn)
    .await
    .map_err(not_applied)?;
    let layout = request.layout;
    sqlx::query(
        "INSERT INTO tiered_segments (partition_id, end_offset, base_offset, object_id, \
         log_size, offset_index_size, time_index_size, txn_index_size, snapshot_size, \
         epochs_size, batch_count, max_timestamp, max_timestamp_offset, \
         max_timestamp_so_far, retention_ts, registered_at, compacted) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )
    .bind(partition_id)
    .bind(request.end_offset)
    .bind(request.base_offset)
    .bind(object_id)
    .bind(log_size)
    .bind(i64::from(layout.offset_index))
    .bind(i64::from(layout.time_index))
    .bind(i64::from(layout.txn_index))
    .bind(i64::from(layout.producer_snapshot))
    .bind(i64::from(layout.leader_epochs))
    .bind(i64::from(request.batch_count))
    .bind(request.max_timestamp)
    .bind(request.max_timestamp_offset)
    .bind(so_far)
    .bind(retention_ts)
    .bind(now)
    .bind(i64::from(compacted))
    .execute(&mut *conn)
    .await
    .map_err(not_applied)?;
    Ok(())
}

/// The batches of a segment plan (see [`SegmentPlan::batches`]): from the partition's first
/// batch, those below `lso` and committed before the request's bound, stopping at the first that
/// is not; the limits bind from the second batch on.
async fn plan_batches(
    conn: &mut SqliteConnection,
    partition_id: i64,
    lso: i64,
    request: &SegmentPlanRequest,
) -> Result<Vec<BatchCoordinate>, CoordinatorError> {
    let sql = plan_batches_sql();
    let mut batches: Vec<BatchCoordinate> = Vec::new();
    let mut bytes: u64 = 0;
    let mut from = i64::MIN;
    loop {
        let rows = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(partition_id)
            .bind(from)
            .bind(PLAN_PAGE)
            .fetch_all(&mut *conn)
            .await
            .map_err(not_applied)?;
        for row in &rows {
            let batch = batch_from_row(row, 0)?;
            let committed_at = row.i64_at(16)?;
            if batch.last_offset >= lso || committed_at >= request.committed_before_ms {
                return Ok(batches);
            }
            let size = u64::from(batch.byte_size);
            if let Some(first) = batches.first() {
                // Offsets relative to the segment's base must fit Kafka's `int` index entries.
                if bytes + size > request.max_bytes
                    || batches.len() >= request.max_batches as usize
                    || batch.last_offset - first.base_offset > i64::from(i32::MAX)
                {
                    return Ok(batches);
                }
            }
            bytes += size;
            from = batch.last_offset.saturating_add(1);
            batches.push(batch);
        }
        if (rows.len() as i64) < PLAN_PAGE {
            return Ok(batches);
        }
    }
}
