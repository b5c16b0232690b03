-- Transaction records (issue #31): the shared transaction state of a host whose brokers do not
-- share their own (Kafka's `__transaction_state`, one row per transactional id), changed only
-- through `txn_transition` and `txn_endings` (src/txn_record.rs decides every change; the row is
-- locked `FOR UPDATE` meanwhile, so the changes of one transactional id never interleave).
-- status: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort.
-- partitions: the open (or last) transaction's diskless partitions, 20 bytes each (topic id,
-- then the index big-endian), ascending.
CREATE TABLE txn_records (
    transactional_id text     NOT NULL PRIMARY KEY,
    producer_id      bigint   NOT NULL,
    producer_epoch   smallint NOT NULL,
    timeout_ms       bigint   NOT NULL,
    status           smallint NOT NULL,
    txn_seq          bigint   NOT NULL,
    partitions       bytea    NOT NULL,
    started_ms       bigint   NOT NULL,
    updated_ms       bigint   NOT NULL,
    fenced        smallint NOT NULL -- 1 when its last transaction timed out
);

-- The records `txn_endings` visits: open or decided and not complete.
CREATE INDEX txn_records_unfinished ON txn_records (transactional_id) WHERE status IN (1, 2, 3);
