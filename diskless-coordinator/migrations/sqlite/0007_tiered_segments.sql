-- Tiered segments (issue #15, docs/tiered-consolidation.md §2.4/§2.5): a partition's consolidated
-- batches as Kafka log segments, one object each, registered by register_segment.

-- The topic settings that size and roll segments (Kafka's names and defaults).
ALTER TABLE topics ADD COLUMN segment_bytes        INTEGER NOT NULL DEFAULT 1073741824;
ALTER TABLE topics ADD COLUMN segment_ms           INTEGER NOT NULL DEFAULT 604800000;
ALTER TABLE topics ADD COLUMN index_interval_bytes INTEGER NOT NULL DEFAULT 4096;
ALTER TABLE topics ADD COLUMN segment_index_bytes  INTEGER NOT NULL DEFAULT 10485760;

-- tiered_next_offset: the first offset no segment ever covered (segments cover [.., this)).
-- tiered_bytes: the .log bytes of the partition's live segments (byte_size counts them too, so
-- byte_size - tiered_bytes are its WAL batches' bytes).
ALTER TABLE partitions ADD COLUMN tiered_next_offset INTEGER NOT NULL DEFAULT 0;
ALTER TABLE partitions ADD COLUMN tiered_bytes       INTEGER NOT NULL DEFAULT 0;

-- kind: 0 a WAL object (commit_file), 1 a tiered segment (register_segment).
-- segment: for a segment object, what it was registered as ("<topic id>/<partition>/<base>/<end>"),
-- kept as long as the object row so that a retried registration of the key is recognised even
-- after retention deleted the segment's row.
ALTER TABLE objects ADD COLUMN kind    INTEGER NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN segment TEXT;

-- Registered segments, clustered like batches by (partition, last offset): a fetch reads the one
-- holding its offset and the following ones as one primary-key range. Sizes are the sections of the
-- object (SegmentLayoutSizes). max_timestamp_so_far: the running max of the partition's effective
-- max timestamps up to the segment's end (deleted batches and segments included: it never
-- decreases), as for batches (migration 3). retention_ts: what retention ages the segment by.
CREATE TABLE tiered_segments (
    partition_id         INTEGER NOT NULL REFERENCES partitions (partition_id),
    end_offset           INTEGER NOT NULL,
    base_offset          INTEGER NOT NULL,
    object_id            INTEGER NOT NULL REFERENCES objects (object_id),
    log_size             INTEGER NOT NULL,
    offset_index_size    INTEGER NOT NULL,
    time_index_size      INTEGER NOT NULL,
    txn_index_size       INTEGER NOT NULL,
    snapshot_size        INTEGER NOT NULL,
    epochs_size          INTEGER NOT NULL,
    batch_count          INTEGER NOT NULL,
    max_timestamp        INTEGER NOT NULL,
    max_timestamp_offset INTEGER NOT NULL,
    max_timestamp_so_far INTEGER NOT NULL,
    retention_ts         INTEGER NOT NULL,
    registered_at        INTEGER NOT NULL,
    PRIMARY KEY (partition_id, end_offset)
) WITHOUT ROWID;

-- Timestamp lookups: the first segment (in offset order) whose running max reaches the target.
CREATE INDEX tiered_timestamp_so_far ON tiered_segments (partition_id, max_timestamp_so_far, end_offset);
-- MAX_TIMESTAMP: the earliest segment holding the largest max timestamp.
CREATE INDEX tiered_max_timestamp ON tiered_segments (partition_id, max_timestamp DESC, end_offset);
-- Deleting an object row checks the segments that reference it (foreign key).
CREATE INDEX tiered_segments_object ON tiered_segments (object_id);
