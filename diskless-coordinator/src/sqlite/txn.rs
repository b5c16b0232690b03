//! Transaction markers (`write_txn_markers`, docs/transactions.md §2.3): one write transaction on
//! the single writer, shaped like a commit. Every touched partition, the markers' producer states
//! and the partitions' open transactions are read at once; the markers are decided in memory in
//! request order (a later marker of the same partition or producer sees the earlier ones); then
//! the marker rows, the aborted transactions, the producer states and the partitions are written
//! in multi-row statements.

use super::SqliteCoordinator;
use super::commit::{Partitions, Producers, load_partitions, load_producers, write_back};
use super::producer::{STATE_COLUMNS, state_from_row};
use super::sql::{CHUNK, at_commit, execute_rows, not_applied};
use crate::rows::{CONTROL_ABORT, CONTROL_COMMIT, SqlRow, ts_type_code};
use crate::{
    BatchCoordinate, CoordinatorError, ErrorCode, ProducerState, TXN_MARKER_SIZE, TxnMarker,
    TxnMarkerResult,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;
use std::collections::HashSet;

/// A marker row to insert: its partition, its coordinate and the partition's running max
/// timestamp after it.
struct MarkerRow {
    partition_id: i64,
    coordinate: BatchCoordinate,
    max_timestamp_so_far: i64,
}

/// An `aborted_txns` row to insert: (partition id, marker offset, first offset, producer id, last
/// stable offset right after the abort).
type AbortedRow = (i64, i64, i64, i64, i64);

/// What the markers of a call decided: one result per marker, the rows to insert.
struct Decided {
    results: Vec<TxnMarkerResult>,
    markers: Vec<MarkerRow>,
    aborted: Vec<AbortedRow>,
}

impl SqliteCoordinator {
    /// [`crate::BatchCoordinator::write_txn_markers`] (the trait maps it here by name).
    pub(crate) async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        // Read under the writer mutex and SQLite's write lock, as a commit reads it: markers and
        // commits are ordered by the single writer, and so are their timestamps.
        let now = self.clock.now_ms();
        let mut partitions = load_partitions(&mut tx, markers.iter().map(|m| m.partition)).await?;
        let mut seen = HashSet::new();
        let wanted: Vec<(i64, i64)> = markers
            .iter()
            .filter_map(|m| Some((partitions.get(&m.partition)?.partition_id, m.producer_id)))
            .filter(|key| seen.insert(*key))
            .collect();
        let mut producers = load_producers(&mut tx, &wanted).await?;
        let partition_ids: Vec<i64> = partitions.values().map(|p| p.partition_id).collect();
        load_open_txns(&mut tx, &partition_ids, &mut producers).await?;
        let decided = decide(markers, &mut partitions, &mut producers, now);
        insert_markers(&mut tx, &decided.markers).await?;
        let sql = "INSERT INTO aborted_txns (partition_id, last_offset, first_offset, \
             producer_id, lso_at_abort) VALUES {values}";
        execute_rows(&mut tx, sql, 5, &decided.aborted, |q, r| {
            q.bind(r.0).bind(r.1).bind(r.2).bind(r.3).bind(r.4)
        })
        .await?;
        write_back(&mut tx, &producers, &partitions).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(decided.results)
    }
}

/// Adds the states of the producers with an open transaction in `partition_ids` to `producers`
/// (those not there yet): an abort's last stable offset is the first offset of another
/// producer's open transaction. One range of the partial index of open transactions per
/// partition.
async fn load_open_txns(
    conn: &mut SqliteConnection,
    partition_ids: &[i64],
    producers: &mut Producers,
) -> Result<(), CoordinatorError> {
    for chunk in partition_ids.chunks(CHUNK) {
        let sql = format!(
            "SELECT partition_id, producer_id, {STATE_COLUMNS} FROM producer_state \
             WHERE partition_id IN ({}) AND txn_first_offset IS NOT NULL",
            vec!["?"; chunk.len()].join(",")
        );
        let q = chunk
            .iter()
            .fold(sqlx::query(AssertSqlSafe(sql)), |q, id| q.bind(*id));
        for row in q.fetch_all(&mut *conn).await.map_err(not_applied)? {
            let key = (row.i64_at(0)?, row.i64_at(1)?);
            let entry = producers.entry(key).or_default();
            if entry.state.is_none() {
                entry.state = Some(state_from_row(&row, 2, key.1)?);
            }
        }
    }
    Ok(())
}

/// Decides every marker in memory, in request order, updating the partitions and producer states
/// it writes to.
fn decide(
    markers: &[TxnMarker],
    partitions: &mut Partitions,
    producers: &mut Producers,
    now: i64,
) -> Decided {
    let mut decided = Decided {
        results: Vec::with_capacity(markers.len()),
        markers: Vec::new(),
        aborted: Vec::new(),
    };
    for marker in markers {
        let Some(part) = partitions.get_mut(&marker.partition) else {
            decided
                .results
                .push(TxnMarkerResult::error(ErrorCode::UnknownTopicOrPartition));
            continue;
        };
        let key = (part.partition_id, marker.producer_id);
        if let Some(s) = producers.get(&key).and_then(|p| p.state.as_ref()) {
            // A marker of a transaction already ended here: answered with the last marker.
            if marker.txn_seq.is_some_and(|seq| seq <= s.last_ended_txn) {
                decided.results.push(TxnMarkerResult {
                    error: ErrorCode::None,
                    offset: s.last_marker_offset,
                    duplicate: true,
                });
                continue;
            }
            // How the marker's transaction compares with the one open here, both numbered.
            let versus_open = marker
                .txn_seq
                .zip(
                    s.current_txn_seq
                        .filter(|_| s.current_txn_first_offset.is_some()),
                )
                .map(|(seq, open)| seq.cmp(&open));
            // A marker of a transaction older than the one open here: that one has nothing in
            // the partition (it could not have opened while it was open), so nothing is written.
            if versus_open == Some(std::cmp::Ordering::Less) {
                decided.results.push(TxnMarkerResult {
                    error: ErrorCode::None,
                    offset: s.last_marker_offset,
                    duplicate: true,
                });
                continue;
            }
            if marker.producer_epoch < s.producer_epoch {
                decided
                    .results
                    .push(TxnMarkerResult::error(ErrorCode::InvalidProducerEpoch));
                continue;
            }
            if marker.coordinator_epoch < s.coordinator_epoch {
                decided.results.push(TxnMarkerResult::error(
                    ErrorCode::TransactionCoordinatorFenced,
                ));
                continue;
            }
            // A marker of a newer transaction while this one is open: it does not end this one
            // (whose own marker may still come, with another outcome); retriable once it has.
            if versus_open == Some(std::cmp::Ordering::Greater) {
                decided
                    .results
                    .push(TxnMarkerResult::error(ErrorCode::ConcurrentTransactions));
                continue;
            }
        }
        let offset = part.high_watermark;
        let coordinate = BatchCoordinate::txn_marker(marker, offset, now, part.timestamp_type);
        part.high_watermark = offset + 1;
        part.byte_size += i64::from(TXN_MARKER_SIZE);
        part.max_timestamp_so_far = part
            .max_timestamp_so_far
            .max(coordinate.effective_max_timestamp());
        part.touched = true;
        // The first offset of another producer's open transaction: the last stable offset right
        // after an abort (Kafka's `ProducerStateManager.lastStableOffset`). Every open transaction
        // of the partition was loaded.
        let others_first = producers
            .iter()
            .filter(|((partition_id, producer_id), _)| {
                *partition_id == part.partition_id && *producer_id != marker.producer_id
            })
            .filter_map(|(_, p)| p.state.as_ref()?.current_txn_first_offset)
            .min();
        let entry = producers.entry(key).or_default();
        entry.touched = true;
        let producer = entry.state.get_or_insert_with(|| {
            ProducerState::new(marker.producer_id, marker.producer_epoch, now)
        });
        if producer.producer_epoch != marker.producer_epoch {
            // A new epoch (a fencing abort's bump) starts a new window, as a new epoch of data does.
            producer.producer_epoch = marker.producer_epoch;
            producer.batches.clear();
        }
        producer.last_append_ms = now;
        producer.coordinator_epoch = marker.coordinator_epoch;
        producer.last_marker_offset = offset;
        if let Some(seq) = marker.txn_seq {
            producer.last_ended_txn = producer.last_ended_txn.max(seq);
        }
        producer.current_txn_start_ms = -1;
        producer.current_txn_seq = None;
        if let Some(first) = producer.current_txn_first_offset.take()
            && !marker.commit
        {
            let lso_at_abort = others_first.unwrap_or(offset + 1);
            decided.aborted.push((
                part.partition_id,
                offset,
                first,
                marker.producer_id,
                lso_at_abort,
            ));
        }
        decided.markers.push(MarkerRow {
            partition_id: part.partition_id,
            coordinate,
            max_timestamp_so_far: part.max_timestamp_so_far,
        });
        decided.results.push(TxnMarkerResult {
            error: ErrorCode::None,
            offset,
            duplicate: false,
        });
    }
    decided
}

/// The marker rows (no object), [`CHUNK`] rows per statement.
async fn insert_markers(
    conn: &mut SqliteConnection,
    markers: &[MarkerRow],
) -> Result<(), CoordinatorError> {
    let sql = "INSERT INTO batches (partition_id, last_offset, base_offset, object_id, \
         byte_offset, byte_size, base_timestamp, max_timestamp, timestamp_type, log_append_time, \
         producer_id, producer_epoch, base_sequence, last_sequence, effective_max_timestamp, \
         max_timestamp_so_far, control_type, coordinator_epoch) VALUES {values}";
    execute_rows(conn, sql, 18, markers, |q, m| {
        let c = &m.coordinate;
        q.bind(m.partition_id)
            .bind(c.last_offset)
            .bind(c.base_offset)
            .bind(None::<i64>)
            // A marker's byte offset is 0.
            .bind(c.byte_offset as i64)
            .bind(i64::from(c.byte_size))
            .bind(c.base_timestamp)
            .bind(c.max_timestamp)
            .bind(ts_type_code(c.timestamp_type))
            .bind(c.log_append_time)
            .bind(c.producer_id)
            .bind(c.producer_epoch)
            .bind(c.base_sequence)
            .bind(c.last_sequence)
            .bind(c.effective_max_timestamp())
            .bind(m.max_timestamp_so_far)
            .bind(if c.control.is_some_and(|m| m.commit) {
                CONTROL_COMMIT
            } else {
                CONTROL_ABORT
            })
            .bind(c.control.map_or(-1, |m| m.coordinator_epoch))
    })
    .await
}
