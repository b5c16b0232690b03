//! `commit_file`: one round trip, a call of the server-side function `commit_file` (PL/pgSQL, from
//! the migrations) with the batches as arrays; the function registers the object, checks the
//! commit point once its locks are held, and decides and appends every batch (the idempotent
//! producer's rules, then the transaction rules: migration 11).

use super::PostgresCoordinator;
use super::attempt::Attempt;
use crate::rows::{SqlRow, col, corrupt};
use crate::{CommitBatchResult, CommitFileRequest, CoordinatorError, ErrorCode};

const CALL_COMMIT_FILE: &str = "SELECT r_batch_index, r_error_code, r_base_offset, \
     r_log_append_time, r_log_start_offset, r_duplicate FROM commit_file($1, $2, $3, $4, $5, \
     $6::text[]::uuid[], $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
     $21)";

/// SQLSTATE of `check_commit_point` (migration 5): the commit deadline passed.
const DEADLINE_EXCEEDED: &str = "DL001";
/// SQLSTATE of `check_commit_point` (migration 5): the key is fenced.
const OBJECT_FENCED: &str = "DL002";

/// The commit function's refusals at its commit point (nothing applied) as the coordinator's
/// errors; any other error as a failed attempt whose statement was sent.
pub(super) fn commit_point_error(e: sqlx::Error, key: &str) -> Attempt {
    if let sqlx::Error::Database(d) = &e {
        match d.code().as_deref() {
            Some(DEADLINE_EXCEEDED) => {
                return Attempt::Done(CoordinatorError::DeadlineExceeded(d.message().to_string()));
            }
            Some(OBJECT_FENCED) => {
                return Attempt::Done(CoordinatorError::ObjectFenced(key.to_string()));
            }
            _ => {}
        }
    }
    Attempt::sent(e)
}

/// The arguments of the commit function, one array per batch field (in request order).
#[derive(Default)]
struct BatchArrays {
    topic_ids: Vec<String>,
    partitions: Vec<i32>,
    byte_offsets: Vec<i64>,
    byte_sizes: Vec<i64>,
    record_counts: Vec<i32>,
    base_ts: Vec<i64>,
    max_ts: Vec<i64>,
    producer_ids: Vec<i64>,
    epochs: Vec<i16>,
    base_seqs: Vec<i32>,
    last_seqs: Vec<i32>,
    /// What the producer controls, judged per batch here ([`crate::producer_field_error`]; 0: fine).
    field_errors: Vec<i16>,
    transactional: Vec<bool>,
    /// The transaction the host verified the batch for (`None`: unverified).
    txn_seqs: Vec<Option<i64>>,
}

impl BatchArrays {
    fn of(request: &CommitFileRequest) -> Self {
        let mut a = BatchArrays::default();
        for b in &request.batches {
            a.field_errors
                .push(crate::producer_field_error(b).map_or(0, ErrorCode::code));
            a.topic_ids
                .push(b.partition.topic_id.hyphenated().to_string());
            a.partitions.push(b.partition.partition);
            // Validated: byte_offset + byte_size <= object_size <= i64::MAX.
            a.byte_offsets.push(b.byte_offset as i64);
            a.byte_sizes.push(i64::from(b.byte_size));
            a.record_counts.push(b.record_count);
            a.base_ts.push(b.base_timestamp);
            a.max_ts.push(b.max_timestamp);
            a.producer_ids.push(b.producer_id);
            a.epochs.push(b.producer_epoch);
            a.base_seqs.push(b.base_sequence);
            a.last_seqs.push(b.last_sequence);
            a.transactional.push(b.transactional);
            a.txn_seqs.push(b.txn_seq);
        }
        a
    }
}

impl PostgresCoordinator {
    pub(super) async fn write_commit_file(
        &self,
        request: CommitFileRequest,
    ) -> Result<Vec<CommitBatchResult>, CoordinatorError> {
        request.validate()?;
        self.retrying(|now| self.try_commit_file(&request, now))
            .await
    }

    /// One attempt of `commit_file` at coordinator time `now`.
    async fn try_commit_file(
        &self,
        request: &CommitFileRequest,
        now: i64,
    ) -> Result<Vec<CommitBatchResult>, Attempt> {
        let n = request.batches.len();
        let a = BatchArrays::of(request);
        let owners: Vec<i64> = request.owners.iter().map(|o| i64::from(*o)).collect();
        let mut conn = self.write.acquire().await.map_err(Attempt::before)?;
        let rows = sqlx::query(CALL_COMMIT_FILE)
            .bind(&request.object_key)
            .bind(request.uploader_broker_id)
            // Validated: object_size <= i64::MAX.
            .bind(request.object_size as i64)
            .bind(&owners)
            .bind(now)
            .bind(&a.topic_ids)
            .bind(&a.partitions)
            .bind(&a.byte_offsets)
            .bind(&a.byte_sizes)
            .bind(&a.record_counts)
            .bind(&a.base_ts)
            .bind(&a.max_ts)
            .bind(&a.producer_ids)
            .bind(&a.epochs)
            .bind(&a.base_seqs)
            .bind(&a.last_seqs)
            .bind(crate::object_key_time_ms(&request.object_key))
            .bind(crate::max_age_ms(self.options.max_commit_age))
            .bind(&a.field_errors)
            .bind(&a.transactional)
            .bind(&a.txn_seqs)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| commit_point_error(e, &request.object_key))?;
        if let Some(first) = rows.first()
            && first.i32_at(0)? == -1
        {
            return Err(
                CoordinatorError::ObjectAlreadyCommitted(request.object_key.clone()).into(),
            );
        }
        Ok(indexed_results(&rows, n, "commit_file", |row, error| {
            Ok(CommitBatchResult {
                error,
                base_offset: row.i64_at(2)?,
                log_append_time: row.i64_at(3)?,
                log_start_offset: row.i64_at(4)?,
                duplicate: col(row, 5)?,
            })
        })?)
    }
}

/// The answers of a server-side function that returns one row per request item, in order:
/// `(index from 1, error code, ...)`; `decode` reads the rest of a row. Fewer or more rows, an
/// index out of place or an unknown code is a corrupt answer.
pub(super) fn indexed_results<T>(
    rows: &[sqlx::postgres::PgRow],
    n: usize,
    function: &str,
    decode: impl Fn(&sqlx::postgres::PgRow, ErrorCode) -> Result<T, CoordinatorError>,
) -> Result<Vec<T>, CoordinatorError> {
    if rows.len() != n {
        return Err(corrupt(format!(
            "{function} returned {} rows for {n} items",
            rows.len()
        )));
    }
    let mut results = Vec::with_capacity(n);
    for (i, row) in rows.iter().enumerate() {
        let index = row.i32_at(0)?;
        if usize::try_from(index).ok() != Some(i + 1) {
            return Err(corrupt(format!("{function} row {i} has index {index}")));
        }
        let code = row.i16_at(1)?;
        let error = ErrorCode::from_code(code)
            .ok_or_else(|| corrupt(format!("{function} returned error code {code}")))?;
        results.push(decode(row, error)?);
    }
    Ok(results)
}
