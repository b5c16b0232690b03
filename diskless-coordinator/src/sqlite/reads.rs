//! The queries: `find_batches`, `list_offsets`, `list_topics`, `known_objects`, `object_info`,
//! `producer_state` and `list_producers`, each on a read connection (in one read transaction when
//! it reads twice).

use super::SqliteCoordinator;
use super::producer::{STATE_COLUMNS, state_from_row};
use super::sql::{CHUNK, decode_owners, not_applied};
use crate::rows::{
    SqlRow, TOPIC_COLUMNS, TOPIC_TIERING_COLUMNS, batch_columns, batch_from_row,
    object_info_from_row, object_kind, segment_columns, segment_from_row, tiering_from_row,
    topic_from_row, topic_key,
};
use crate::rules::{
    FetchLimits, PartitionFetch, in_request_order, list_offsets_answer_tiered, looks_up_batch,
};
use crate::{
    AbortedTxn, CoordinatorError, ErrorCode, FindBatchesRequest, FindBatchesResponse,
    IsolationLevel, ListOffsetsRequest, ListOffsetsResponse, MAX_TIMESTAMP, ObjectInfo,
    ProducerState, TopicIdPartition, TopicInfo,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;
use std::collections::HashSet;

/// ListOffsets by timestamp, step 1: one probe of the index `batches_timestamp_so_far`. The
/// running max timestamp is monotonic in offset order, so the first batch in (running max, offset)
/// order whose running max reaches the target (`?2`) is the first such batch in offset order. Every
/// live batch before it has a running max, hence an effective max timestamp, below the target: when
/// its own effective max timestamp reaches the target it is the answer.
pub(super) const TIMESTAMP_CANDIDATE: &str = "SELECT base_offset, last_offset, \
     effective_max_timestamp FROM batches WHERE partition_id = ?1 AND max_timestamp_so_far >= ?2 \
     ORDER BY max_timestamp_so_far, last_offset LIMIT 1";

/// ListOffsets by timestamp, step 2, only when the candidate's own timestamp is below the target.
/// That happens only to the first live batch, when a batch deleted before it (retention,
/// DeleteRecords) raised the running max (the running max includes deleted batches; every later
/// batch has a running max at least as large), so the target is at or below the largest timestamp
/// of a deleted batch. The answer is then the first live batch after the candidate (`?2`, its last
/// offset) reaching the target (`?3`): a forward scan from the log start in offset order, which
/// ends at the answer (with near-monotonic timestamps, a few batches; in the worst case, a deleted
/// far-future timestamp, the whole partition).
pub(super) const TIMESTAMP_SCAN: &str = "SELECT base_offset, effective_max_timestamp FROM batches \
     WHERE partition_id = ?1 AND last_offset > ?2 AND effective_max_timestamp >= ?3 \
     ORDER BY last_offset LIMIT 1";

/// MAX_TIMESTAMP: the earliest live batch holding the largest effective max timestamp, one probe of
/// the index `batches_max_timestamp` (timestamp descending, offset ascending). The running max is not
/// used: it may come from a deleted batch.
pub(super) const MAX_TIMESTAMP_LOOKUP: &str = "SELECT base_offset, effective_max_timestamp \
     FROM batches WHERE partition_id = ?1 ORDER BY effective_max_timestamp DESC, last_offset LIMIT 1";

/// The smallest first offset of partition `?1`'s open transactions (NULL when none is open): one
/// probe of the partial index `producer_state_open_txn`, which holds only open transactions.
pub(super) const OPEN_TXN_FIRST: &str = "SELECT MIN(txn_first_offset) FROM producer_state \
     WHERE partition_id = ?1 AND txn_first_offset IS NOT NULL";

/// The aborted transactions a `read_committed` fetch of partition `?1` from offset `?2` whose
/// batches end before `?3` reports, by marker offset (Kafka's `TransactionIndex.collectAbortedTxns`):
/// those whose marker is at or after the fetch offset and whose first offset is before the end, up
/// to and including the first whose last stable offset after the abort reaches the end. Two ranges
/// of the primary key: the stop row's, then the answer's.
pub(super) const ABORTED_BETWEEN: &str = "SELECT producer_id, first_offset, last_offset \
     FROM aborted_txns WHERE partition_id = ?1 AND last_offset >= ?2 AND first_offset < ?3 \
     AND last_offset <= COALESCE((SELECT last_offset FROM aborted_txns \
         WHERE partition_id = ?1 AND last_offset >= ?2 AND lso_at_abort >= ?3 \
         ORDER BY last_offset LIMIT 1), 9223372036854775807) \
     ORDER BY last_offset";

/// ListOffsets by timestamp in the tiered segments, step 1: as [`TIMESTAMP_CANDIDATE`], one probe
/// of the index `tiered_timestamp_so_far` (the segments' running max is monotonic in offset order
/// too).
pub(super) const SEGMENT_TIMESTAMP_CANDIDATE: &str = "SELECT base_offset, end_offset, \
     max_timestamp FROM tiered_segments WHERE partition_id = ?1 AND max_timestamp_so_far >= ?2 \
     ORDER BY max_timestamp_so_far, end_offset LIMIT 1";

/// ListOffsets by timestamp in the tiered segments, step 2, as [`TIMESTAMP_SCAN`]: the first
/// segment after the candidate (`?2`, its end offset) whose max timestamp reaches `?3`.
pub(super) const SEGMENT_TIMESTAMP_SCAN: &str = "SELECT base_offset, max_timestamp \
     FROM tiered_segments WHERE partition_id = ?1 AND end_offset > ?2 AND max_timestamp >= ?3 \
     ORDER BY end_offset LIMIT 1";

/// MAX_TIMESTAMP in the tiered segments: the earliest segment holding the largest max timestamp,
/// one probe of the index `tiered_max_timestamp`.
pub(super) const SEGMENT_MAX_TIMESTAMP: &str = "SELECT base_offset, max_timestamp \
     FROM tiered_segments WHERE partition_id = ?1 ORDER BY max_timestamp DESC, end_offset LIMIT 1";

/// The segments of partition `?1` from the one holding offset `?2` on, at most `?3`, with their
/// objects: a range of the primary key and one primary-key probe of `objects` per segment.
pub(super) fn segments_from() -> String {
    format!(
        "SELECT {} FROM tiered_segments s JOIN objects o ON o.object_id = s.object_id \
         WHERE s.partition_id = ?1 AND s.end_offset >= ?2 ORDER BY s.end_offset LIMIT ?3",
        segment_columns("s", "o")
    )
}

/// What is known of the object with key `?1`: [`crate::rows::OBJECT_INFO`]'s columns, then its
/// kind.
const OBJECT_INFO_KIND: &str = "SELECT uploader_broker_id, object_size, live_bytes, owners, \
     committed_at, marked_for_deletion_at, kind FROM objects WHERE object_key = ?1";

const SELECT_PARTITION: &str = "SELECT p.partition_id, p.log_start_offset, p.high_watermark, \
     p.tiered_next_offset FROM partitions p WHERE p.topic_id = ?1 AND p.partition = ?2";

/// Batches read per round trip while filling a partition's `find_batches` answer.
const PAGE: i64 = 128;

/// What most calls read of a partition first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    /// The internal partition id.
    pub(super) id: i64,
    /// The log start offset.
    pub(super) log_start: i64,
    /// The high watermark.
    pub(super) hwm: i64,
    /// The first offset no tiered segment ever covered.
    pub(super) tiered_next: i64,
}

/// The bounds of a partition, if it exists.
pub(super) async fn partition_bounds(
    conn: &mut SqliteConnection,
    p: TopicIdPartition,
) -> Result<Option<Bounds>, CoordinatorError> {
    let row = sqlx::query(SELECT_PARTITION)
        .bind(topic_key(p.topic_id))
        .bind(p.partition)
        .fetch_optional(&mut *conn)
        .await
        .map_err(not_applied)?;
    row.map(|r| {
        Ok(Bounds {
            id: r.i64_at(0)?,
            log_start: r.i64_at(1)?,
            hwm: r.i64_at(2)?,
            tiered_next: r.i64_at(3)?,
        })
    })
    .transpose()
}

/// The last stable offset of partition `partition_id` with bounds `log_start` and `hwm`: the first
/// offset of its earliest open transaction, raised to the log start (DeleteRecords and retention
/// may cut into an open transaction), else the high watermark.
pub(super) async fn last_stable_offset(
    conn: &mut SqliteConnection,
    partition_id: i64,
    log_start: i64,
    hwm: i64,
) -> Result<i64, CoordinatorError> {
    let first: Option<i64> = sqlx::query_scalar(OPEN_TXN_FIRST)
        .bind(partition_id)
        .fetch_one(&mut *conn)
        .await
        .map_err(not_applied)?;
    Ok(first.map_or(hwm, |f| f.max(log_start).min(hwm)))
}

/// [`ABORTED_BETWEEN`]: the aborted transactions of partition `partition_id` a `read_committed`
/// fetch from `offset` whose batches end before `upper` reports.
async fn aborted_between(
    conn: &mut SqliteConnection,
    partition_id: i64,
    offset: i64,
    upper: i64,
) -> Result<Vec<AbortedTxn>, CoordinatorError> {
    let rows = sqlx::query(ABORTED_BETWEEN)
        .bind(partition_id)
        .bind(offset)
        .bind(upper)
        .fetch_all(&mut *conn)
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
        .collect()
}

/// Which of `keys` name a committed object, in [`CHUNK`]s of keys per statement.
pub(super) async fn known_keys<'k>(
    conn: &mut SqliteConnection,
    keys: impl IntoIterator<Item = &'k str>,
) -> Result<HashSet<String>, CoordinatorError> {
    let keys: Vec<&str> = keys.into_iter().collect();
    let mut known = HashSet::new();
    for chunk in keys.chunks(CHUNK) {
        let sql = format!(
            "SELECT object_key FROM objects WHERE object_key IN ({})",
            vec!["?"; chunk.len()].join(",")
        );
        let q = chunk.iter().fold(
            sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)),
            |q, key| q.bind(*key),
        );
        known.extend(q.fetch_all(&mut *conn).await.map_err(not_applied)?);
    }
    Ok(known)
}

/// One lookup of a batch for ListOffsets: (base offset, effective max timestamp).
async fn probe(
    conn: &mut SqliteConnection,
    sql: &'static str,
    partition_id: i64,
    args: &[i64],
) -> Result<Option<(i64, i64)>, CoordinatorError> {
    let q = args
        .iter()
        .fold(sqlx::query(sql).bind(partition_id), |q, a| q.bind(*a));
    let row = q.fetch_optional(&mut *conn).await.map_err(not_applied)?;
    row.map(|r| Ok((r.i64_at(0)?, r.i64_at(1)?))).transpose()
}

/// The first live batch of a partition whose effective max timestamp reaches `t`: one probe,
/// and a forward scan only when a deleted batch raised the running max (see
/// [`TIMESTAMP_SCAN`]).
async fn timestamp_lookup(
    conn: &mut SqliteConnection,
    partition_id: i64,
    t: i64,
) -> Result<Option<(i64, i64)>, CoordinatorError> {
    timestamp_lookup_in(conn, (TIMESTAMP_CANDIDATE, TIMESTAMP_SCAN), partition_id, t).await
}

/// The first live item of a partition whose max timestamp reaches `t`, in the tiered segments
/// then in the batches (segments come first in offset order).
async fn tiered_timestamp_lookup(
    conn: &mut SqliteConnection,
    partition_id: i64,
    t: i64,
) -> Result<Option<(i64, i64)>, CoordinatorError> {
    let queries = (SEGMENT_TIMESTAMP_CANDIDATE, SEGMENT_TIMESTAMP_SCAN);
    match timestamp_lookup_in(conn, queries, partition_id, t).await? {
        Some(hit) => Ok(Some(hit)),
        None => timestamp_lookup(conn, partition_id, t).await,
    }
}

/// [`timestamp_lookup`] with the (candidate, scan) queries of batches or segments.
async fn timestamp_lookup_in(
    conn: &mut SqliteConnection,
    (candidate_sql, scan_sql): (&'static str, &'static str),
    partition_id: i64,
    t: i64,
) -> Result<Option<(i64, i64)>, CoordinatorError> {
    let candidate = sqlx::query(candidate_sql)
        .bind(partition_id)
        .bind(t)
        .fetch_optional(&mut *conn)
        .await
        .map_err(not_applied)?;
    let Some(row) = candidate else {
        return Ok(None);
    };
    let (base, last, ts) = (row.i64_at(0)?, row.i64_at(1)?, row.i64_at(2)?);
    if ts >= t {
        return Ok(Some((base, ts)));
    }
    probe(conn, scan_sql, partition_id, &[last, t]).await
}

/// MAX_TIMESTAMP over the tiered segments then the batches: the earliest item holding the
/// largest max timestamp (a segment wins a tie: it comes first).
async fn max_timestamp_lookup(
    conn: &mut SqliteConnection,
    partition_id: i64,
) -> Result<Option<(i64, i64)>, CoordinatorError> {
    let segment = probe(conn, SEGMENT_MAX_TIMESTAMP, partition_id, &[]).await?;
    let batch = probe(conn, MAX_TIMESTAMP_LOOKUP, partition_id, &[]).await?;
    Ok(match (segment, batch) {
        (Some(s), Some(b)) if b.1 > s.1 => Some(b),
        (Some(s), _) => Some(s),
        (None, b) => b,
    })
}

/// The batches of a partition's `find_batches` answer, from `request.offset` (in range) up to the
/// high watermark `hwm` (`read_uncommitted`) or the batches below the last stable offset `lso`
/// (`read_committed`: none from an offset at or above it, even when the log start raised it into a
/// batch), read [`PAGE`] at a time while the limits take them; for `read_committed`, with the
/// aborted transactions of the returned range.
async fn fetch_partition(
    conn: &mut SqliteConnection,
    mut fetch: PartitionFetch<'_>,
    request: &FindBatchesRequest,
    bounds: Bounds,
) -> Result<FindBatchesResponse, CoordinatorError> {
    let Bounds {
        id: partition_id,
        log_start,
        hwm,
        tiered_next,
    } = bounds;
    let lso = last_stable_offset(conn, partition_id, log_start, hwm).await?;
    let committed = request.isolation == IsolationLevel::ReadCommitted;
    // Batches whose base offset is below `end` are returned.
    let end = match committed {
        true if request.offset >= lso => i64::MIN,
        true => lso,
        false => hwm,
    };
    // Markers have no object: a left join (their object key reads as '').
    let sql = format!(
        "SELECT {} FROM batches b LEFT JOIN objects o ON o.object_id = b.object_id \
         WHERE b.partition_id = ?1 AND b.last_offset >= ?2 ORDER BY b.last_offset LIMIT ?3",
        batch_columns("o")
    );
    let mut from = request.offset;
    // The tiered segments first (only when the offset is below the WAL tier): the one holding the
    // offset always, the next ones while the limits take them; WAL batches follow only segments
    // that reach them (a segment left out ends the answer).
    let mut complete = true;
    if request.offset < tiered_next && request.offset < end {
        let sql = segments_from();
        'segments: loop {
            let rows = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(partition_id)
                .bind(from)
                .bind(PAGE)
                .fetch_all(&mut *conn)
                .await
                .map_err(not_applied)?;
            for row in &rows {
                let segment = segment_from_row(row, 0)?;
                if segment.base_offset >= end {
                    break 'segments;
                }
                if !fetch.take_segment(segment) {
                    complete = false;
                    break 'segments;
                }
                from = fetch.next_offset()?.unwrap_or(from);
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
    }
    'pages: while complete && from < hwm && request.offset < end {
        let rows = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(partition_id)
            .bind(from)
            .bind(PAGE)
            .fetch_all(&mut *conn)
            .await
            .map_err(not_applied)?;
        for row in &rows {
            let batch = batch_from_row(row, 0)?;
            if batch.base_offset >= end || !fetch.take(batch) {
                break 'pages;
            }
            from = fetch.next_offset()?.unwrap_or(from);
        }
        if (rows.len() as i64) < PAGE {
            break;
        }
    }
    let aborted = match (committed, fetch.next_offset()?) {
        (false, _) => None,
        (true, None) => Some(Vec::new()),
        (true, Some(upper)) => {
            Some(aborted_between(conn, partition_id, request.offset, upper).await?)
        }
    };
    Ok(fetch.into_response(log_start, hwm, lso, aborted))
}

/// A topic row: the topic id, [`TOPIC_COLUMNS`], then [`TOPIC_TIERING_COLUMNS`].
pub(super) fn topic_with_tiering_from_row(
    row: &sqlx::sqlite::SqliteRow,
) -> Result<TopicInfo, CoordinatorError> {
    let mut topic = topic_from_row(row)?;
    tiering_from_row(row, 10, &mut topic.config)?;
    Ok(topic)
}

impl SqliteCoordinator {
    pub(super) async fn read_list_topics(&self) -> Result<Vec<TopicInfo>, CoordinatorError> {
        let sql = format!(
            "SELECT topic_id, {TOPIC_COLUMNS}, {TOPIC_TIERING_COLUMNS} FROM topics ORDER BY name"
        );
        let rows = self.read_rows(sqlx::query(AssertSqlSafe(sql))).await?;
        rows.iter().map(topic_with_tiering_from_row).collect()
    }

    pub(super) async fn read_find_batches(
        &self,
        requests: &[FindBatchesRequest],
        fetch_max_bytes: u32,
    ) -> Result<Vec<FindBatchesResponse>, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.begin().await?;
        let mut limits = FetchLimits::new(fetch_max_bytes);
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            responses.push(match partition_bounds(&mut tx, request.partition).await? {
                None => FindBatchesResponse::error(ErrorCode::UnknownTopicOrPartition),
                Some(b) if request.offset < b.log_start || request.offset > b.hwm => {
                    FindBatchesResponse::error(ErrorCode::OffsetOutOfRange)
                }
                Some(bounds) => {
                    let fetch = limits.partition(request.max_bytes);
                    fetch_partition(&mut tx, fetch, request, bounds).await?
                }
            });
        }
        tx.commit().await.map_err(not_applied)?;
        Ok(responses)
    }

    pub(super) async fn read_list_offsets(
        &self,
        requests: &[ListOffsetsRequest],
    ) -> Result<Vec<ListOffsetsResponse>, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.begin().await?;
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            let bounds = partition_bounds(&mut tx, request.partition).await?;
            let hit = match (bounds, request.timestamp) {
                (None, _) => None,
                (_, t) if !looks_up_batch(t) => None,
                (Some(b), MAX_TIMESTAMP) => max_timestamp_lookup(&mut tx, b.id).await?,
                (Some(b), t) => tiered_timestamp_lookup(&mut tx, b.id, t).await?,
            };
            responses.push(match bounds {
                None => ListOffsetsResponse::error(ErrorCode::UnknownTopicOrPartition),
                Some(Bounds {
                    id,
                    log_start,
                    hwm,
                    tiered_next,
                }) => {
                    // Kafka's `lastFetchableOffset`: LATEST answers it, and nothing at or above
                    // it is found.
                    let fetchable = match request.isolation {
                        IsolationLevel::ReadCommitted => {
                            last_stable_offset(&mut tx, id, log_start, hwm).await?
                        }
                        IsolationLevel::ReadUncommitted => hwm,
                    };
                    let hit = hit.filter(|(offset, _)| (*offset).max(log_start) < fetchable);
                    let t = request.timestamp;
                    list_offsets_answer_tiered(t, log_start, fetchable, tiered_next, hit)
                }
            });
        }
        tx.commit().await.map_err(not_applied)?;
        Ok(responses)
    }

    pub(super) async fn read_known_objects(
        &self,
        object_keys: &[String],
    ) -> Result<Vec<String>, CoordinatorError> {
        let mut reader = self.read().await?;
        let known = known_keys(reader.conn()?, object_keys.iter().map(String::as_str)).await?;
        Ok(in_request_order(object_keys, known))
    }

    pub(super) async fn read_object_info(
        &self,
        object_key: &str,
    ) -> Result<Option<ObjectInfo>, CoordinatorError> {
        let query = sqlx::query(OBJECT_INFO_KIND).bind(object_key);
        let Some(r) = self.read_row(query).await? else {
            return Ok(None);
        };
        let owners = decode_owners(&r.string_at(3)?)?;
        let mut info = object_info_from_row(&r, object_key, owners)?;
        info.kind = object_kind(r.i16_at(6)?)?;
        Ok(Some(info))
    }

    pub(super) async fn read_list_producers(
        &self,
        partition: TopicIdPartition,
    ) -> Result<Vec<ProducerState>, CoordinatorError> {
        let mut reader = self.read().await?;
        let mut tx = reader.begin().await?;
        let Some(Bounds {
            id: partition_id, ..
        }) = partition_bounds(&mut tx, partition).await?
        else {
            return Err(CoordinatorError::UnknownTopic(partition.to_string()));
        };
        let sql = format!(
            "SELECT producer_id, {STATE_COLUMNS} FROM producer_state \
             WHERE partition_id = ?1 ORDER BY producer_id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(partition_id)
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        tx.commit().await.map_err(not_applied)?;
        rows.iter()
            .map(|r| state_from_row(r, 1, r.i64_at(0)?))
            .collect()
    }

    pub(super) async fn read_producer_state(
        &self,
        partition: TopicIdPartition,
        producer_id: i64,
    ) -> Result<Option<ProducerState>, CoordinatorError> {
        let sql = format!(
            "SELECT {STATE_COLUMNS} FROM producer_state s \
             JOIN partitions p ON p.partition_id = s.partition_id \
             WHERE p.topic_id = ?1 AND p.partition = ?2 AND s.producer_id = ?3"
        );
        let query = sqlx::query(AssertSqlSafe(sql));
        let query = query
            .bind(topic_key(partition.topic_id))
            .bind(partition.partition)
            .bind(producer_id);
        let Some(r) = self.read_row(query).await? else {
            return Ok(None);
        };
        state_from_row(&r, 0, producer_id).map(Some)
    }
}
