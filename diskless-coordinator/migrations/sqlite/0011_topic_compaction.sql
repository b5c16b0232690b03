-- Topic compaction settings (issue #29), with Kafka's names and defaults. cleanup_policy holds
-- Kafka's list text ('delete', 'compact', 'compact,delete'); retention deletes nothing from a
-- topic whose policy is 'compact'.
ALTER TABLE topics ADD COLUMN cleanup_policy            TEXT    NOT NULL DEFAULT 'delete';
ALTER TABLE topics ADD COLUMN delete_retention_ms       INTEGER NOT NULL DEFAULT 86400000;
ALTER TABLE topics ADD COLUMN min_compaction_lag_ms     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE topics ADD COLUMN max_compaction_lag_ms     INTEGER NOT NULL DEFAULT 9223372036854775807;
ALTER TABLE topics ADD COLUMN min_cleanable_dirty_ratio REAL    NOT NULL DEFAULT 0.5;
-- A segment written by compaction (replace_segments): the partition's compacted segments are the
-- clean part of its log.
ALTER TABLE tiered_segments ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0;
