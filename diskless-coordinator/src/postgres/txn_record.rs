//! Transaction records (`txn_transition`, `txn_endings`, `describe_txn`; migration 16): each
//! change one transaction that locks the record's row (`FOR UPDATE`), decides with
//! [`crate::apply_txn_transition`] and writes it back, so the changes of one transactional id
//! never interleave, whichever process asks. A record that does not exist yet is inserted with
//! `ON CONFLICT DO NOTHING`: when another process inserted it meanwhile, the attempt reads and
//! locks that one and decides again.

use super::PostgresCoordinator;
use super::attempt::{Attempt, sql_error};
use crate::rows::{TXN_RECORD_COLUMNS, bind_txn_record, txn_record_from_row, upsert_txn_record};
use crate::{
    CoordinatorError, TxnAnswer, TxnRecord, TxnTransition, apply_txn_transition, expire_txn,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

/// The record of `transactional_id`, if any, locked for the rest of the transaction.
async fn load_locked(
    conn: &mut PgConnection,
    transactional_id: &str,
) -> Result<Option<TxnRecord>, Attempt> {
    let sql = format!(
        "SELECT {TXN_RECORD_COLUMNS} FROM txn_records WHERE transactional_id = $1 FOR UPDATE"
    );
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(transactional_id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Attempt::before)?;
    Ok(row.as_ref().map(txn_record_from_row).transpose()?)
}

/// Writes `record`: over the existing row (`existed`), else as a new row unless another
/// transaction inserted one meanwhile (returns `false` then, nothing written).
async fn store(
    conn: &mut PgConnection,
    record: &TxnRecord,
    existed: bool,
) -> Result<bool, Attempt> {
    let sql = if existed {
        upsert_txn_record('$')
    } else {
        let params: Vec<String> = (1..=10).map(|i| format!("${i}")).collect();
        format!(
            "INSERT INTO txn_records ({TXN_RECORD_COLUMNS}) VALUES ({}) \
             ON CONFLICT (transactional_id) DO NOTHING",
            params.join(", ")
        )
    };
    let done = bind_txn_record(sqlx::query(AssertSqlSafe(sql)), record)
        .execute(&mut *conn)
        .await
        .map_err(Attempt::before)?;
    Ok(done.rows_affected() == 1)
}

impl PostgresCoordinator {
    /// [`crate::BatchCoordinator::txn_transition`].
    pub(super) async fn write_txn_transition(
        &self,
        transition: TxnTransition,
    ) -> Result<TxnAnswer, CoordinatorError> {
        // Before the id reaches the server (it refuses a NUL in text).
        crate::txn_record::validate(&transition)?;
        self.retrying(|now| self.try_txn_transition(&transition, now))
            .await
    }

    /// One attempt of `txn_transition` at coordinator time `now`.
    async fn try_txn_transition(
        &self,
        transition: &TxnTransition,
        now: i64,
    ) -> Result<TxnAnswer, Attempt> {
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        // Twice at most: a record inserted by another process between the read and the insert
        // exists (and is locked) on the second read.
        for _ in 0..2 {
            let current = load_locked(&mut tx, transition.transactional_id()).await?;
            let (answer, changed) = apply_txn_transition(current.as_ref(), transition, now)?;
            let Some(record) = changed else {
                return Ok(answer);
            };
            if store(&mut tx, &record, current.is_some()).await? {
                tx.commit().await.map_err(Attempt::sent)?;
                return Ok(answer);
            }
        }
        Err(CoordinatorError::Storage(
            "a transaction record was inserted and is still missing".into(),
        )
        .into())
    }

    /// [`crate::BatchCoordinator::txn_endings`].
    pub(super) async fn write_txn_endings(
        &self,
        limit: u32,
    ) -> Result<Vec<TxnRecord>, CoordinatorError> {
        self.retrying(|now| self.try_txn_endings(limit, now)).await
    }

    /// One attempt of `txn_endings`: the unfinished records are read without locks; only those
    /// to expire are locked (and decided again on what the lock shows).
    async fn try_txn_endings(&self, limit: u32, now: i64) -> Result<Vec<TxnRecord>, Attempt> {
        let mut tx = self.write.begin().await.map_err(Attempt::before)?;
        // Byte order, as the other coordinators (and Rust's `str`) order them.
        let sql = format!(
            "SELECT {TXN_RECORD_COLUMNS} FROM txn_records WHERE status IN (2, 3) \
             OR (status = 1 AND started_ms + timeout_ms < $1) \
             ORDER BY transactional_id COLLATE \"C\""
        );
        // Only what this call acts on: the prepared records and the Ongoing ones past their
        // timeout (`expire_txn`'s rule), not every open transaction.
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(Attempt::before)?;
        let mut expired = 0u32;
        let mut endings = Vec::new();
        for row in &rows {
            let mut record = txn_record_from_row(row)?;
            if expired < limit && expire_txn(&record, now).is_some() {
                let locked = load_locked(&mut tx, &record.transactional_id).await?;
                if let Some(locked) = locked {
                    record = locked;
                    if let Some(aborted) = expire_txn(&record, now) {
                        store(&mut tx, &aborted, true).await?;
                        expired += 1;
                        record = aborted;
                    }
                }
            }
            if record.status.is_prepared() && endings.len() < limit as usize {
                endings.push(record);
            }
        }
        if expired > 0 {
            tx.commit().await.map_err(Attempt::sent)?;
        }
        Ok(endings)
    }

    /// [`crate::BatchCoordinator::describe_txn`]: on the primary.
    pub(super) async fn read_describe_txn(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TxnRecord>, CoordinatorError> {
        self.check_open()?;
        if transactional_id.contains('\0') {
            return Ok(None); // no record can have it (`txn_transition` refuses it)
        }
        let sql =
            format!("SELECT {TXN_RECORD_COLUMNS} FROM txn_records WHERE transactional_id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(transactional_id)
            .fetch_optional(self.fresh_pool())
            .await
            .map_err(|e| sql_error(e, false))?;
        row.as_ref().map(txn_record_from_row).transpose()
    }
}
