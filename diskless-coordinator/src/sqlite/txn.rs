//! Transaction markers (`write_txn_markers`). Not implemented on this backend yet (issue #14):
//! every call is refused, so a host cannot end a transaction here; no transactional batch is
//! accepted either, so no transaction can be open.

use super::SqliteCoordinator;
use crate::{CoordinatorError, TxnMarker, TxnMarkerResult};

impl SqliteCoordinator {
    /// [`crate::BatchCoordinator::write_txn_markers`]: refused until this backend implements
    /// transactions.
    pub(crate) async fn write_txn_markers(
        &self,
        markers: &[TxnMarker],
    ) -> Result<Vec<TxnMarkerResult>, CoordinatorError> {
        let _ = markers;
        Err(CoordinatorError::InvalidRequest(
            "transaction markers are not supported by this coordinator yet".into(),
        ))
    }
}
