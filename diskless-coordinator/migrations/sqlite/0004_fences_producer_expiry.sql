-- Orphan fences and producer-id expiration (issue 12, items 1 and 5).

-- Keys the orphan collector fenced (BatchCoordinator::fence_orphans): a commit of a fenced key is
-- refused. key_time: the key's UUID v7 time (ms); fences older than 2 x max_commit_age are dropped.
CREATE TABLE fences (
    object_key TEXT    NOT NULL PRIMARY KEY,
    key_time   INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX fences_key_time ON fences (key_time);

-- producer.id.expiration.ms of each topic (Kafka's default for existing topics: one day).
ALTER TABLE topics ADD COLUMN producer_id_expiration_ms INTEGER NOT NULL DEFAULT 86400000;

-- The commit time (coordinator clock, ms) of the producer's last appended batch in the partition.
-- Existing states have none recorded: they get the upgrade's wall-clock time, so that they expire one
-- expiration period after the upgrade, never earlier.
ALTER TABLE producer_state ADD COLUMN last_append_ms INTEGER NOT NULL DEFAULT 0;

UPDATE producer_state SET last_append_ms = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER);
