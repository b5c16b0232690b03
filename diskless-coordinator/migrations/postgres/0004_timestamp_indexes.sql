-- Migration 4 (issue #12 item 10): the indexes of ListOffsets by timestamp. Non-transactional:
-- each statement runs on its own, CONCURRENTLY, so that building them on a large live table blocks
-- no commit. Idempotent (IF NOT EXISTS; an index left invalid by an interrupted build is dropped by
-- the migration runner before a retry).
--
-- The first batch with max_timestamp_so_far >= t, in (partition, running max, offset) order: one
-- probe (see PostgresCoordinator::list_offsets).
CREATE INDEX CONCURRENTLY IF NOT EXISTS batches_running_max
    ON batches (partition_id, max_timestamp_so_far, last_offset);

-- MAX_TIMESTAMP: the earliest live batch holding the largest effective max timestamp, one probe.
-- The expression is the one the queries use (EFFECTIVE_TS in postgres/mod.rs), character for
-- character up to the table alias.
CREATE INDEX CONCURRENTLY IF NOT EXISTS batches_effective_ts
    ON batches (partition_id,
                (CASE WHEN timestamp_type = 1 THEN log_append_time ELSE max_timestamp END) DESC,
                last_offset);

-- Batches committed before migration 3 (no running max), searched in offset order. Empty on a
-- schema created by this version; shrinks to nothing as retention deletes the old batches.
CREATE INDEX CONCURRENTLY IF NOT EXISTS batches_without_running_max
    ON batches (partition_id, last_offset) WHERE max_timestamp_so_far IS NULL;
