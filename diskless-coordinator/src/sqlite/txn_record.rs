//! Transaction records (`txn_transition`, `txn_endings`, `describe_txn`; migration 10): each
//! change one write transaction on the single writer, which reads the record, decides with
//! [`crate::apply_txn_transition`] and writes it back, so no two changes interleave.

use super::SqliteCoordinator;
use super::sql::{at_commit, not_applied};
use crate::rows::{TXN_RECORD_COLUMNS, bind_txn_record, txn_record_from_row, upsert_txn_record};
use crate::{
    CoordinatorError, TxnAnswer, TxnRecord, TxnStatus, TxnTransition, apply_txn_transition,
    expire_txn,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;

/// The record of `transactional_id`, if any, on `conn`.
async fn load(
    conn: &mut SqliteConnection,
    transactional_id: &str,
) -> Result<Option<TxnRecord>, CoordinatorError> {
    let sql = format!("SELECT {TXN_RECORD_COLUMNS} FROM txn_records WHERE transactional_id = ?1");
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(transactional_id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(not_applied)?;
    row.as_ref().map(txn_record_from_row).transpose()
}

/// Writes `record` over the one of its transactional id.
async fn store(conn: &mut SqliteConnection, record: &TxnRecord) -> Result<(), CoordinatorError> {
    let q = sqlx::query(AssertSqlSafe(upsert_txn_record('?')));
    bind_txn_record(q, record)
        .execute(&mut *conn)
        .await
        .map_err(not_applied)?;
    Ok(())
}

impl SqliteCoordinator {
    /// [`crate::BatchCoordinator::txn_transition`].
    pub(super) async fn write_txn_transition(
        &self,
        transition: TxnTransition,
    ) -> Result<TxnAnswer, CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        let current = load(&mut tx, transition.transactional_id()).await?;
        let (answer, changed) = apply_txn_transition(current.as_ref(), &transition, now)?;
        if let Some(record) = changed {
            store(&mut tx, &record).await?;
            tx.commit().await.map_err(at_commit)?;
        }
        Ok(answer)
    }

    /// [`crate::BatchCoordinator::txn_endings`].
    pub(super) async fn write_txn_endings(
        &self,
        limit: u32,
    ) -> Result<Vec<TxnRecord>, CoordinatorError> {
        let mut writer = self.write().await?;
        let mut tx = writer.begin().await?;
        let now = self.clock.now_ms();
        let sql = format!(
            "SELECT {TXN_RECORD_COLUMNS} FROM txn_records WHERE status IN (2, 3) \
             OR (status = 1 AND started_ms + timeout_ms < ?1) \
             ORDER BY transactional_id"
        );
        // Only what this call acts on: the prepared records and the Ongoing ones past their
        // timeout (`expire_txn`'s rule), not every open transaction.
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(not_applied)?;
        let mut expired = 0u32;
        let mut endings = Vec::new();
        for row in &rows {
            let mut record = txn_record_from_row(row)?;
            if expired < limit
                && let Some(aborted) = expire_txn(&record, now)
            {
                store(&mut tx, &aborted).await?;
                expired += 1;
                record = aborted;
            }
            if record.status.is_prepared() && endings.len() < limit as usize {
                endings.push(record);
            }
        }
        if expired > 0 {
            tx.commit().await.map_err(at_commit)?;
        }
        Ok(endings)
    }

    /// [`crate::BatchCoordinator::describe_txn`].
    pub(super) async fn read_describe_txn(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TxnRecord>, CoordinatorError> {
        let mut reader = self.read().await?;
        load(reader.conn()?, transactional_id).await
    }
}

// The statuses the `txn_endings` query and the partial index name by code.
const _: () = assert!(TxnStatus::Ongoing.code() == 1 && TxnStatus::PrepareAbort.code() == 3);
