-- Transactions (KIP-98, issue #14): transaction markers in the log, the producers' open
-- transactions and the aborted transactions a read_committed fetch reports.

-- A transaction marker is a batch row with no object (its 78 bytes are built by the fetch path), so
-- batches.object_id becomes nullable. SQLite cannot drop a NOT NULL constraint: the table is rebuilt
-- (nothing references batches, so dropping the old one checks no foreign key) with the same columns,
-- primary key and indexes, plus:
-- control_type: -1 a data batch, 0 an ABORT marker, 1 a COMMIT marker;
-- coordinator_epoch: a marker's transaction coordinator epoch (-1 for data batches).
CREATE TABLE batches_new (
    partition_id            INTEGER NOT NULL REFERENCES partitions (partition_id),
    last_offset             INTEGER NOT NULL,
    base_offset             INTEGER NOT NULL,
    object_id               INTEGER REFERENCES objects (object_id), -- NULL for a marker
    byte_offset             INTEGER NOT NULL,
    byte_size               INTEGER NOT NULL,
    base_timestamp          INTEGER NOT NULL,
    max_timestamp           INTEGER NOT NULL,
    timestamp_type          INTEGER NOT NULL,
    log_append_time         INTEGER NOT NULL,
    producer_id             INTEGER NOT NULL,
    producer_epoch          INTEGER NOT NULL,
    base_sequence           INTEGER NOT NULL,
    last_sequence           INTEGER NOT NULL,
    effective_max_timestamp INTEGER NOT NULL DEFAULT -1,
    max_timestamp_so_far    INTEGER NOT NULL DEFAULT -1,
    control_type            INTEGER NOT NULL DEFAULT -1,
    coordinator_epoch       INTEGER NOT NULL DEFAULT -1,
    PRIMARY KEY (partition_id, last_offset)
) WITHOUT ROWID;

INSERT INTO batches_new (partition_id, last_offset, base_offset, object_id, byte_offset, byte_size,
    base_timestamp, max_timestamp, timestamp_type, log_append_time, producer_id, producer_epoch,
    base_sequence, last_sequence, effective_max_timestamp, max_timestamp_so_far)
SELECT partition_id, last_offset, base_offset, object_id, byte_offset, byte_size, base_timestamp,
    max_timestamp, timestamp_type, log_append_time, producer_id, producer_epoch, base_sequence,
    last_sequence, effective_max_timestamp, max_timestamp_so_far
FROM batches;

DROP TABLE batches;
ALTER TABLE batches_new RENAME TO batches;

-- The indexes of migrations 2 and 3, as they were (dropped with the old table).
-- Deleting an object row checks the batches that reference it (foreign key): without an index on
-- batches(object_id) every such check scans the whole table, inside the write transaction.
CREATE INDEX batches_object ON batches (object_id);
-- Timestamp lookups: the first batch (in offset order) whose running max reaches the target.
CREATE INDEX batches_timestamp_so_far ON batches (partition_id, max_timestamp_so_far, last_offset);
-- MAX_TIMESTAMP: the earliest live batch holding the largest effective max timestamp.
CREATE INDEX batches_max_timestamp ON batches (partition_id, effective_max_timestamp DESC, last_offset);

-- A producer's transaction in the partition and its last marker:
-- txn_first_offset: the first offset of its open transaction, NULL when none is open;
-- txn_start_ms: when that transaction started (coordinator clock, ms), else -1;
-- coordinator_epoch: the transaction coordinator epoch of its last marker, else -1;
-- last_ended_txn: the largest transaction number (txn_seq) a marker ended, else -1;
-- last_marker_offset: the offset of its last marker, else -1 (the answer to a repeated marker).
ALTER TABLE producer_state ADD COLUMN txn_first_offset INTEGER;
ALTER TABLE producer_state ADD COLUMN txn_start_ms INTEGER NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN coordinator_epoch INTEGER NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN last_ended_txn INTEGER NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN last_marker_offset INTEGER NOT NULL DEFAULT -1;

-- The last stable offset is the smallest first offset of a partition's open transactions: one
-- probe of this index (only producers with an open transaction are in it, few at any time), so
-- no partition column has to be kept in step with the producer states.
CREATE INDEX producer_state_open_txn ON producer_state (partition_id, txn_first_offset)
    WHERE txn_first_offset IS NOT NULL;

-- Aborted transactions by ABORT marker offset (Kafka's transaction index): the producer's records in
-- first_offset..=last_offset are skipped by read_committed consumers. lso_at_abort: the last stable
-- offset right after the abort, where Kafka's collectAbortedTxns stops. Rows go when the log start
-- passes their marker.
CREATE TABLE aborted_txns (
    partition_id INTEGER NOT NULL REFERENCES partitions (partition_id),
    last_offset  INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    producer_id  INTEGER NOT NULL,
    lso_at_abort INTEGER NOT NULL,
    PRIMARY KEY (partition_id, last_offset)
) WITHOUT ROWID;
