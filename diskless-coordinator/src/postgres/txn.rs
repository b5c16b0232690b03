//! Transaction markers (`write_txn_markers`): one round trip, a call of the server-side function
//! `write_txn_markers` (PL/pgSQL, migration 11) with the markers as arrays. The function locks the
//! touched partitions in the global order (as commits do, so markers and commits cannot deadlock)
//! and decides and appends every marker in request order, each seeing the earlier ones.

use super::PostgresCoordinator;
use super::attempt::Attempt;
use super::commit::indexed_results;
use crate::rows::{SqlRow, col};
use crate::{CoordinatorError, TxnMarker, TxnMarkerResult};

const CALL_WRITE_TXN_MARKERS: &str = "SELECT r_index, r_error_code, r_offset, r_duplicate \
     FROM write_txn_markers($1, $2::text[]::uuid[], $3, $4, $5, $6, $7, $8)";

/// The arguments of the marker function, one array per marker field (in request order).
#[derive(Default)]
struct MarkerArrays {
    topic_ids: Vec<String>,
    partitions: Vec<i32>,
    producer_ids: Vec<i64>,
    epochs: Vec<i16>,
    coordinator_epochs: Vec<i32>,
    commits: Vec<bool>,
    txn_seqs: Vec<Option<i64>>,
}

impl MarkerArrays {
    fn of(markers: &[TxnMarker]) -> Self {
        let mut a = MarkerArrays::default();
        for m in markers {
            a.topic_ids
                .push(crate::rows::topic_key(m.partition.topic_id));
            a.partitions.push(m.partition.partition);
            a.producer_ids.push(m.producer_id);
            a.epochs.push(m.producer_epoch);
            a.coordinator_epochs.push(m.coordinator_epoch);
            a.commits.push(m.commit);
            a.txn_seqs.push(m.txn_seq);
        }
        a
    }
}

impl PostgresCoordinator {
    /// [`crate::BatchCoordinator::write_txn_markers`]: one call of the marker function, retried
    /// after a conflict (nothing applied then).
    pub(crate) async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        self.check_open()?;
        if markers.is_empty() {
            return Ok(Vec::new());
        }
        self.retrying(|now| self.try_write_txn_markers(markers, now))
            .await
    }

    /// One attempt of `write_txn_markers` at coordinator time `now` (the markers' timestamps).
    async fn try_write_txn_markers(
        &self,
        markers: &[TxnMarker],
        now: i64,
    ) -> Result<Vec<TxnMarkerResult>, Attempt> {
        let n = markers.len();
        let a = MarkerArrays::of(markers);
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        let rows = sqlx::query(CALL_WRITE_TXN_MARKERS)
            .bind(now)
            .bind(&a.topic_ids)
            .bind(&a.partitions)
            .bind(&a.producer_ids)
            .bind(&a.epochs)
            .bind(&a.coordinator_epochs)
            .bind(&a.commits)
            .bind(&a.txn_seqs)
            .fetch_all(&mut *conn)
            .await
            .map_err(Attempt::sent)?;
        Ok(indexed_results(
            &rows,
            n,
            "write_txn_markers",
            |row, error| {
                Ok(TxnMarkerResult {
                    error,
                    offset: row.i64_at(2)?,
                    duplicate: col(row, 3)?,
                })
            },
        )?)
    }
}
