-- ListOffsets by timestamp in a bounded number of index probes (issue 12, item 10).
--
-- effective_max_timestamp: the timestamp a reader sees as the batch's max timestamp (the log append
-- time for LogAppendTime batches, else the producer's max timestamp).
-- max_timestamp_so_far: the running max of effective_max_timestamp over the partition's batches in
-- offset order, this batch included (deleted batches included too: it never decreases). Monotonic in
-- offset order, so "the first batch whose running max reaches T" is one probe of an index on
-- (partition, running max). The partition row keeps the running value for the next commit.

ALTER TABLE batches ADD COLUMN effective_max_timestamp INTEGER NOT NULL DEFAULT -1;
ALTER TABLE batches ADD COLUMN max_timestamp_so_far INTEGER NOT NULL DEFAULT -1;
ALTER TABLE partitions ADD COLUMN max_timestamp_so_far INTEGER NOT NULL DEFAULT -1;

-- Backfill the rows of an existing database. Batches deleted before this migration are gone, so the
-- running max covers the live batches only (exact, and still monotonic).
UPDATE batches SET effective_max_timestamp =
    CASE WHEN timestamp_type = 1 THEN log_append_time ELSE max_timestamp END;

UPDATE batches SET max_timestamp_so_far = v.so_far
FROM (SELECT partition_id, last_offset,
             MAX(effective_max_timestamp) OVER (PARTITION BY partition_id ORDER BY last_offset
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                 AS so_far
      FROM batches) AS v
WHERE batches.partition_id = v.partition_id AND batches.last_offset = v.last_offset;

UPDATE partitions SET max_timestamp_so_far = v.so_far
FROM (SELECT partition_id, MAX(max_timestamp_so_far) AS so_far FROM batches GROUP BY partition_id) AS v
WHERE partitions.partition_id = v.partition_id;

-- Timestamp lookups: the first batch (in offset order) whose running max reaches the target.
CREATE INDEX batches_timestamp_so_far ON batches (partition_id, max_timestamp_so_far, last_offset);

-- MAX_TIMESTAMP: the earliest live batch holding the largest effective max timestamp.
CREATE INDEX batches_max_timestamp ON batches (partition_id, effective_max_timestamp DESC, last_offset);
