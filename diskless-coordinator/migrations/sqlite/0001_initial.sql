-- The schema of the SQLite batch coordinator (diskless-rs).
--
-- Portable by design: plain INTEGER/TEXT/BLOB columns, no AUTOINCREMENT, upserts with
-- ON CONFLICT ... DO UPDATE, UPDATE ... FROM. A PostgreSQL port maps INTEGER to BIGINT,
-- topic_id TEXT to UUID, BLOB to BYTEA and WITHOUT ROWID tables to plain tables with the same
-- primary key.

-- Live topics and their configuration. timestamp_type: 0 = CreateTime, 1 = LogAppendTime.
CREATE TABLE topics (
    topic_id                        TEXT    NOT NULL PRIMARY KEY, -- lowercase hyphenated UUID
    name                            TEXT    NOT NULL UNIQUE,
    partition_count                 INTEGER NOT NULL,
    timestamp_type                  INTEGER NOT NULL,
    retention_ms                    INTEGER NOT NULL,
    retention_bytes                 INTEGER NOT NULL,
    max_message_bytes               INTEGER NOT NULL,
    message_timestamp_before_max_ms INTEGER NOT NULL,
    message_timestamp_after_max_ms  INTEGER NOT NULL
);

-- One row per partition: the log's bounds and the bytes of its live batches (for retention.bytes).
-- partition_id is an internal surrogate key that keeps batch rows small.
CREATE TABLE partitions (
    partition_id     INTEGER NOT NULL PRIMARY KEY,
    topic_id         TEXT    NOT NULL REFERENCES topics (topic_id),
    partition        INTEGER NOT NULL,
    log_start_offset INTEGER NOT NULL,
    high_watermark   INTEGER NOT NULL,
    byte_size        INTEGER NOT NULL,
    UNIQUE (topic_id, partition)
);

-- Committed WAL objects. live_bytes: bytes of their batches still live; marked_for_deletion_at is
-- set (coordinator clock, ms) when live_bytes reaches 0. owners: comma-separated shard ids.
CREATE TABLE objects (
    object_id              INTEGER NOT NULL PRIMARY KEY,
    object_key             TEXT    NOT NULL UNIQUE,
    uploader_broker_id     INTEGER NOT NULL,
    object_size            INTEGER NOT NULL,
    live_bytes             INTEGER NOT NULL,
    owners                 TEXT    NOT NULL,
    committed_at           INTEGER NOT NULL,
    marked_for_deletion_at INTEGER
);

-- The cleaner's queue: marked objects, oldest first.
CREATE INDEX objects_marked ON objects (marked_for_deletion_at, object_key)
    WHERE marked_for_deletion_at IS NOT NULL;

-- Live batches, clustered by (partition, last offset): a fetch is one range scan from the batch
-- containing the fetch offset. Deleted batches are removed (logical deletion from the object).
CREATE TABLE batches (
    partition_id    INTEGER NOT NULL REFERENCES partitions (partition_id),
    last_offset     INTEGER NOT NULL,
    base_offset     INTEGER NOT NULL,
    object_id       INTEGER NOT NULL REFERENCES objects (object_id),
    byte_offset     INTEGER NOT NULL,
    byte_size       INTEGER NOT NULL,
    base_timestamp  INTEGER NOT NULL,
    max_timestamp   INTEGER NOT NULL,
    timestamp_type  INTEGER NOT NULL,
    log_append_time INTEGER NOT NULL,
    producer_id     INTEGER NOT NULL,
    producer_epoch  INTEGER NOT NULL,
    base_sequence   INTEGER NOT NULL,
    last_sequence   INTEGER NOT NULL,
    PRIMARY KEY (partition_id, last_offset)
) WITHOUT ROWID;

-- Idempotent-producer state: one compact row per (partition, producer id). batch_window holds the
-- last 5 batches under producer_epoch, oldest first, 32 bytes each (little endian): base sequence
-- i32, last sequence i32, base offset i64, last offset i64, log append time i64.
CREATE TABLE producer_state (
    partition_id   INTEGER NOT NULL REFERENCES partitions (partition_id),
    producer_id    INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    batch_window   BLOB    NOT NULL,
    PRIMARY KEY (partition_id, producer_id)
) WITHOUT ROWID;
