//! Tiered segments (issue #15, docs/tiered-consolidation.md §2.4, §2.5; migration 13): the
//! consolidation worker's calls. The rules are the reference model's (diskless-testkit,
//! `coordinator/model.rs`, "Tiered segments").
//!
//! - `tiering_candidates`: partitions in the global lock order after the cursor, each with one
//!   primary-key probe of its first WAL batch (and one of the open-transaction index for its last
//!   stable offset), at most `limit`.
//! - `segment_plan`: one snapshot (`REPEATABLE READ`) on the primary: the partition's bounds, its
//!   first WAL batches page by page (index range scans) up to the plan's limits, its last
//!   segment and the aborted transactions whose marker the plan holds.
//! - `register_segment`: one call of the server-side function `register_segment` (migration 13),
//!   which takes the key's advisory lock, locks the partition row, checks the commit point
//!   (deadline on the server's clock, fence) and applies the whole registration or nothing.
//! - `list_tiered_segments`: one snapshot on the primary.
//!
//! Every tiering read runs on the primary: a replica's stale view would plan batches already
//! consolidated (harmless, `register_segment` answers `Stale`, but wasted work).

use super::PostgresCoordinator;
use super::attempt::{Attempt, sql_error};
use super::commit::commit_point_error;
use super::sql::{BEGIN_READ, LAST_STABLE_OFFSET};
use super::topics::{CONFIG_COLUMNS, config_from_row};
use crate::rows::topic_key;
use crate::rows::{SqlRow, batch_columns, batch_from_row, corrupt, parse_topic_id, to_u32, to_u64};
use crate::{
    AbortedTxn, BatchCoordinate, CoordinatorError, ErrorCode, RegisterSegmentOutcome,
    RegisterSegmentRequest, ReplaceSegmentsRequest, SegmentLayoutSizes, SegmentPlan,
    SegmentPlanRequest, TieredSegment, TieringCandidate, TopicIdPartition,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

/// WAL batches read per page by `segment_plan`.
const PLAN_PAGE: i64 = 512;

/// The commit time of a batch row `b` (coordinator clock): its object's, or for a transaction
/// marker (no object) the time it was written, which is its base timestamp.
const COMMIT_MS: &str = "(CASE WHEN b.object_id IS NULL THEN b.base_timestamp \
     ELSE (SELECT o2.committed_at FROM objects o2 WHERE o2.object_id = b.object_id) END)";

/// The columns [`segment_from_row`] decodes, of a segment row `s` joined with its object `o`.
const SEGMENT_COLUMNS: &str = "o.object_key, o.object_size, s.log_size, s.offset_index_size, \
     s.time_index_size, s.txn_index_size, s.snapshot_size, s.epochs_size, s.base_offset, \
     s.end_offset, s.max_timestamp, s.max_timestamp_offset, s.retention_ts, s.batch_count, \
     s.registered_at, s.compacted::integer";

/// A section size stored as `integer`.
fn section(row: &impl SqlRow, i: usize) -> Result<u32, CoordinatorError> {
    to_u32(i64::from(row.i32_at(i)?), "segment section size")
}

/// Decodes the columns of [`SEGMENT_COLUMNS`] starting at `at`.
fn segment_from_row(row: &impl SqlRow, at: usize) -> Result<TieredSegment, CoordinatorError> {
    Ok(TieredSegment {
        object_key: row.string_at(at)?,
        object_size: to_u64(row.i64_at(at + 1)?, "object size")?,
        layout: SegmentLayoutSizes {
            log: to_u64(row.i64_at(at + 2)?, "segment log size")?,
            offset_index: section(row, at + 3)?,
            time_index: section(row, at + 4)?,
            txn_index: section(row, at + 5)?,
            producer_snapshot: section(row, at + 6)?,
            leader_epochs: section(row, at + 7)?,
        },
        base_offset: row.i64_at(at + 8)?,
        end_offset: row.i64_at(at + 9)?,
        max_timestamp: row.i64_at(at + 10)?,
        max_timestamp_offset: row.i64_at(at + 11)?,
        retention_ts: row.i64_at(at + 12)?,
        batch_count: to_u32(i64::from(row.i32_at(at + 13)?), "segment batch count")?,
        registered_at: row.i64_at(at + 14)?,
        compacted: row.i32_at(at + 15)? != 0,
    })
}

/// The segments of partition `partition_id` ending at or after `from`, in offset order, at most
/// `limit` (one range scan of the segments' primary key).
pub(super) async fn segments_from(
    conn: &mut PgConnection,
    partition_id: i64,
    from: i64,
    limit: i64,
) -> Result<Vec<TieredSegment>, CoordinatorError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {SEGMENT_COLUMNS} FROM tiered_segments s \
         JOIN objects o ON o.object_id = s.object_id \
         WHERE s.partition_id = $1 AND s.end_offset >= $2 ORDER BY s.end_offset LIMIT $3"
    )))
    .bind(partition_id)
    .bind(from)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    rows.iter().map(|r| segment_from_row(r, 0)).collect()
}

/// A partition's id, log start offset, high watermark and last stable offset; `None` when unknown.
async fn partition_bounds(
    conn: &mut PgConnection,
    partition: TopicIdPartition,
) -> Result<Option<(i64, i64, i64, i64)>, CoordinatorError> {
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT pa.partition_id, pa.log_start_offset, pa.high_watermark, {LAST_STABLE_OFFSET} \
         FROM partitions pa WHERE pa.topic_id = $1::uuid AND pa.partition = $2"
    )))
    .bind(topic_key(partition.topic_id))
    .bind(partition.partition)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| sql_error(e, false))?;
    row.map(|r| Ok((r.i64_at(0)?, r.i64_at(1)?, r.i64_at(2)?, r.i64_at(3)?)))
        .transpose()
}

/// The columns of a `replace_segments` call (`functions.sql`, revision 3).
const CALL_REPLACE_SEGMENTS: &str = "SELECT r_outcome, r_released FROM replace_segments($1::uuid, \
     $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, \
     $22, $23)";

/// The columns of a `register_segment` call (migration 13).
const CALL_REGISTER_SEGMENT: &str = "SELECT r_outcome, r_released FROM register_segment($1, $2, \
     $3, $4, $5, $6::uuid, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)";

impl PostgresCoordinator {
    pub(super) async fn read_tiering_candidates(
        &self,
        now_ms: i64,
        min_age_ms: i64,
        after: Option<TopicIdPartition>,
        limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        self.check_open()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let committed_before = now_ms.saturating_sub(min_age_ms);
        let cursor = match after {
            Some(_) => "AND (pa.topic_id, pa.partition) > ($4::uuid, $5)",
            None => "AND $4::text IS NULL AND $5::integer IS NULL",
        };
        let config = CONFIG_COLUMNS
            .split(',')
            .map(|c| format!("t.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ");
        // Something can be consolidated: the first WAL batch is stable and old enough; and it is
        // due: WAL bytes reach segment.bytes or the first batch is segment.ms old.
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT pa.topic_id::text, pa.partition, pa.byte_size - pa.tiered_bytes, f.commit_ms, \
             pa.tiered_next_offset, {config} \
             FROM partitions pa JOIN topics t ON t.topic_id = pa.topic_id \
             CROSS JOIN LATERAL (SELECT b.last_offset, {COMMIT_MS} AS commit_ms FROM batches b \
                 WHERE b.partition_id = pa.partition_id ORDER BY b.last_offset LIMIT 1) f \
             WHERE pa.byte_size > pa.tiered_bytes {cursor} \
             AND f.commit_ms < $2 AND f.last_offset < {LAST_STABLE_OFFSET} \
             AND (pa.byte_size - pa.tiered_bytes >= t.segment_bytes \
                  OR $1::numeric - f.commit_ms >= CASE WHEN t.cleanup_policy = 'delete' \
                     THEN t.segment_ms ELSE LEAST(t.segment_ms, t.max_compaction_lag_ms) END) \
             ORDER BY pa.topic_id, pa.partition LIMIT $3"
        )))
        .bind(now_ms)
        .bind(committed_before)
        .bind(i64::from(limit))
        .bind(after.map(|a| topic_key(a.topic_id)))
        .bind(after.map(|a| a.partition))
        .fetch_all(self.fresh_pool())
        .await
        .map_err(|e| sql_error(e, false))?;
        rows.iter()
            .map(|r| {
                Ok(TieringCandidate {
                    partition: TopicIdPartition::new(
                        parse_topic_id(&r.string_at(0)?)?,
                        r.i32_at(1)?,
                    ),
                    wal_bytes: r.i64_at(2)?,
                    oldest_wal_commit_ms: r.i64_at(3)?,
                    tiered_next_offset: r.i64_at(4)?,
                    config: config_from_row(r, 5)?,
                })
            })
            .collect()
    }

    pub(super) async fn read_segment_plan(
        &self,
        request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        self.check_open()?;
        let mut tx = self
            .fresh_pool()
            .begin_with(BEGIN_READ)
            .await
            .map_err(|e| sql_error(e, false))?;
        let Some((partition_id, log_start_offset, high_watermark, lso)) =
            partition_bounds(&mut tx, request.partition).await?
        else {
            tx.commit().await.map_err(|e| sql_error(e, false))?;
            return Ok(SegmentPlan::error(ErrorCode::UnknownTopicOrPartition));
        };
        let sql = format!(
            "SELECT {cols}, {COMMIT_MS} FROM batches b LEFT JOIN objects o \
             ON o.object_id = b.object_id \
             WHERE b.partition_id = $1 AND b.last_offset > $2 AND b.last_offset < $3 \
             ORDER BY b.last_offset LIMIT $4",
            cols = batch_columns("o")
        );
        let mut batches: Vec<BatchCoordinate> = Vec::new();
        let mut bytes: u64 = 0;
        let mut after = i64::MIN;
        'pages: loop {
            let rows = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(partition_id)
                .bind(after)
                .bind(lso)
                .bind(PLAN_PAGE)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| sql_error(e, false))?;
            let full = rows.len() as i64 == PLAN_PAGE;
            for row in &rows {
                let batch = batch_from_row(row, 0)?;
                if row.i64_at(16)? >= request.committed_before_ms {
                    break 'pages;
                }
                let size = u64::from(batch.byte_size);
                if let Some(first) = batches.first() {
                    // The limits bind from the second batch on; offsets relative to the
                    // segment's base must fit Kafka's `int` index entries.
                    if bytes + size > request.max_bytes
                        || batches.len() >= request.max_batches as usize
                        || batch.last_offset - first.base_offset > i64::from(i32::MAX)
                    {
                        break 'pages;
                    }
                }
                bytes += size;
                after = batch.last_offset;
                batches.push(batch);
            }
            if !full {
                break;
            }
        }
        let previous = sqlx::query(AssertSqlSafe(format!(
            "SELECT {SEGMENT_COLUMNS} FROM tiered_segments s \
             JOIN objects o ON o.object_id = s.object_id \
             WHERE s.partition_id = $1 ORDER BY s.end_offset DESC LIMIT 1"
        )))
        .bind(partition_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| sql_error(e, false))?
        .map(|r| segment_from_row(&r, 0))
        .transpose()?;
        let aborted = match (batches.first(), batches.last()) {
            (Some(first), Some(last)) => {
                let rows = sqlx::query(
                    "SELECT a.producer_id, a.first_offset, a.last_offset FROM aborted_txns a \
                     WHERE a.partition_id = $1 AND a.last_offset >= $2 AND a.last_offset <= $3 \
                     ORDER BY a.last_offset",
                )
                .bind(partition_id)
                .bind(first.base_offset)
                .bind(last.last_offset)
                .fetch_all(&mut *tx)
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
                    .collect::<Result<Vec<_>, CoordinatorError>>()?
            }
            _ => Vec::new(),
        };
        tx.commit().await.map_err(|e| sql_error(e, false))?;
        Ok(SegmentPlan {
            error: ErrorCode::None,
            batches,
            previous,
            log_start_offset,
            high_watermark,
            aborted,
        })
    }

    pub(super) async fn write_register_segment(
        &self,
        request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        self.retrying(|now| self.try_register_segment(&request, now))
            .await
    }

    /// One attempt of `register_segment` at coordinator time `now`: one call of the server-side
    /// function (one implicit transaction).
    async fn try_register_segment(
        &self,
        request: &RegisterSegmentRequest,
        now: i64,
    ) -> Result<RegisterSegmentOutcome, Attempt> {
        let too_big = |what: &str| {
            Attempt::Done(CoordinatorError::InvalidRequest(format!(
                "a segment's {what} does not fit the coordinator's columns"
            )))
        };
        let object_size = i64::try_from(request.object_size).map_err(|_| too_big("size"))?;
        // Validated: batch_bytes <= i32::MAX.
        let batch_bytes = i64::try_from(request.batch_bytes).map_err(|_| too_big(".log size"))?;
        let batch_count = i32::try_from(request.batch_count).map_err(|_| too_big("batch count"))?;
        let l = &request.layout;
        let sections = [
            l.offset_index,
            l.time_index,
            l.txn_index,
            l.producer_snapshot,
            l.leader_epochs,
        ]
        .iter()
        .map(|s| i32::try_from(*s).map_err(|_| too_big("section size")))
        .collect::<Result<Vec<i32>, Attempt>>()?;
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        let row = sqlx::query(CALL_REGISTER_SEGMENT)
            .bind(&request.object_key)
            .bind(request.uploader_broker_id)
            .bind(object_size)
            .bind(i64::from(request.owner))
            .bind(now)
            .bind(topic_key(request.partition.topic_id))
            .bind(request.partition.partition)
            .bind(request.base_offset)
            .bind(request.end_offset)
            .bind(batch_count)
            .bind(batch_bytes)
            .bind(sections[0])
            .bind(sections[1])
            .bind(sections[2])
            .bind(sections[3])
            .bind(sections[4])
            .bind(request.max_timestamp)
            .bind(request.max_timestamp_offset)
            .bind(crate::object_key_time_ms(&request.object_key))
            .bind(crate::max_age_ms(self.options.max_commit_age))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| commit_point_error(e, &request.object_key))?;
        let released = row.i32_at(1)?;
        match row.i16_at(0)? {
            0 => Ok(RegisterSegmentOutcome::Registered {
                released_objects: u32::try_from(released)
                    .map_err(|_| corrupt(format!("register_segment released {released}")))?,
            }),
            1 => Ok(RegisterSegmentOutcome::AlreadyRegistered),
            2 => Ok(RegisterSegmentOutcome::Stale),
            3 => Ok(RegisterSegmentOutcome::UnknownPartition),
            4 => Err(CoordinatorError::ObjectAlreadyCommitted(request.object_key.clone()).into()),
            other => Err(corrupt(format!("register_segment returned outcome {other}")).into()),
        }
    }

    pub(super) async fn write_replace_segments(
        &self,
        request: ReplaceSegmentsRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        request.validate()?;
        self.retrying(|now| self.try_replace_segments(&request, now))
            .await
    }

    /// One attempt of `replace_segments` at coordinator time `now`: one call of the server-side
    /// function (one implicit transaction).
    async fn try_replace_segments(
        &self,
        request: &ReplaceSegmentsRequest,
        now: i64,
    ) -> Result<RegisterSegmentOutcome, Attempt> {
        let too_big = |what: &str| {
            Attempt::Done(CoordinatorError::InvalidRequest(format!(
                "a segment's {what} does not fit the coordinator's columns"
            )))
        };
        let new = request.segment.as_ref();
        let object_size = new
            .map(|n| i64::try_from(n.object_size).map_err(|_| too_big("size")))
            .transpose()?;
        let log_size = new
            .map(|n| i64::try_from(n.layout.log).map_err(|_| too_big(".log size")))
            .transpose()?;
        let batch_count = new
            .map(|n| i32::try_from(n.batch_count).map_err(|_| too_big("batch count")))
            .transpose()?;
        let section = |f: fn(&SegmentLayoutSizes) -> u32| {
            new.map(|n| i32::try_from(f(&n.layout)).map_err(|_| too_big("section size")))
                .transpose()
        };
        let sections = [
            section(|l| l.offset_index)?,
            section(|l| l.time_index)?,
            section(|l| l.txn_index)?,
            section(|l| l.producer_snapshot)?,
            section(|l| l.leader_epochs)?,
        ];
        let keys: Vec<&str> = request
            .replaced
            .iter()
            .map(|r| r.object_key.as_str())
            .collect();
        let bases: Vec<i64> = request.replaced.iter().map(|r| r.base_offset).collect();
        let ends: Vec<i64> = request.replaced.iter().map(|r| r.end_offset).collect();
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        let row = sqlx::query(CALL_REPLACE_SEGMENTS)
            .bind(topic_key(request.partition.topic_id))
            .bind(request.partition.partition)
            .bind(now)
            .bind(&keys)
            .bind(&bases)
            .bind(&ends)
            .bind(new.map(|n| n.object_key.as_str()))
            .bind(new.map(|n| n.uploader_broker_id))
            .bind(object_size)
            .bind(new.map(|n| i64::from(n.owner)))
            .bind(new.map(|n| n.base_offset))
            .bind(new.map(|n| n.end_offset))
            .bind(batch_count)
            .bind(log_size)
            .bind(sections[0])
            .bind(sections[1])
            .bind(sections[2])
            .bind(sections[3])
            .bind(sections[4])
            .bind(new.map(|n| n.max_timestamp))
            .bind(new.map(|n| n.max_timestamp_offset))
            .bind(new.and_then(|n| crate::object_key_time_ms(&n.object_key)))
            .bind(crate::max_age_ms(self.options.max_commit_age))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| commit_point_error(e, new.map_or("", |n| n.object_key.as_str())))?;
        let released = row.i32_at(1)?;
        let key = || new.map_or(String::new(), |n| n.object_key.clone());
        match row.i16_at(0)? {
            0 => Ok(RegisterSegmentOutcome::Registered {
                released_objects: u32::try_from(released)
                    .map_err(|_| corrupt(format!("replace_segments released {released}")))?,
            }),
            1 => Ok(RegisterSegmentOutcome::AlreadyRegistered),
            2 => Ok(RegisterSegmentOutcome::Stale),
            3 => Ok(RegisterSegmentOutcome::UnknownPartition),
            4 => Err(CoordinatorError::ObjectAlreadyCommitted(key()).into()),
            other => Err(corrupt(format!("replace_segments returned outcome {other}")).into()),
        }
    }

    pub(super) async fn read_list_tiered_segments(
        &self,
        partition: TopicIdPartition,
        from_offset: i64,
        limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        self.check_open()?;
        let mut tx = self
            .fresh_pool()
            .begin_with(BEGIN_READ)
            .await
            .map_err(|e| sql_error(e, false))?;
        let Some((partition_id, ..)) = partition_bounds(&mut tx, partition).await? else {
            return Err(CoordinatorError::UnknownTopic(partition.to_string()));
        };
        let segments = segments_from(&mut tx, partition_id, from_offset, i64::from(limit)).await?;
        tx.commit().await.map_err(|e| sql_error(e, false))?;
        Ok(segments)
    }
}
