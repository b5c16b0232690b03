-- Migration 12 (issue #14): the open transactions of a partition, for its last stable offset (the
-- smallest first offset, one probe) and an abort's stable offset (write_txn_markers). Partial:
-- only producers with an open transaction are indexed, so the many updates of idempotent
-- producers' windows (txn_first_offset stays NULL) stay HOT. Non-transactional (CONCURRENTLY: no
-- lock that blocks commits or reads while it is built); idempotent.
CREATE INDEX CONCURRENTLY IF NOT EXISTS producer_state_open_txn
    ON producer_state (partition_id, txn_first_offset) WHERE txn_first_offset IS NOT NULL;
