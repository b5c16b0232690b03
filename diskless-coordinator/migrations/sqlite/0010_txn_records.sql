-- Transaction records (issue #31): the shared transaction state of a host whose brokers do not
-- share their own (Kafka's `__transaction_state`, one row per transactional id), changed only
-- through `txn_transition` and `txn_endings` (src/txn_record.rs decides every change).
-- status: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort.
-- partitions: the open (or last) transaction's diskless partitions, 20 bytes each (topic id,
-- then the index big-endian), ascending.
CREATE TABLE txn_records (
    transactional_id TEXT    NOT NULL PRIMARY KEY,
    producer_id      INTEGER NOT NULL,
    producer_epoch   INTEGER NOT NULL,
    timeout_ms       INTEGER NOT NULL,
    status           INTEGER NOT NULL,
    txn_seq          INTEGER NOT NULL,
    partitions       BLOB    NOT NULL,
    started_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    fenced        INTEGER NOT NULL
) WITHOUT ROWID;

-- The records `txn_endings` visits: open or decided and not complete.
CREATE INDEX txn_records_unfinished ON txn_records (status, transactional_id)
    WHERE status IN (1, 2, 3);
