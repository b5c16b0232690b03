-- Migration 13 (issue #15): tiered segments. The rules are the reference model's (diskless-testkit,
-- coordinator/model.rs, "Tiered segments"); docs/tiered-consolidation.md §2.4, §2.5.
--
-- Only catalog updates and new objects: columns added with constant defaults rewrite nothing
-- (PostgreSQL 11+); tiered_segments is a new, empty table, so its indexes are built here (no live
-- data to wait for, nothing for CONCURRENTLY to spare).
--
-- 1. topics stores segment.bytes, segment.ms, index.interval.bytes and segment.index.bytes.
-- 2. partitions.tiered_next_offset: segments covered [.., this) (0: nothing was ever tiered);
--    partitions.tiered_bytes: the .log bytes of the partition's live segments. byte_size keeps
--    counting them (a segment holds the same bytes as the batches it replaced), so
--    byte_size - tiered_bytes is the WAL tier's bytes.
-- 3. objects.kind: 0 a WAL object, 1 a tiered segment. A segment object also records which
--    partition and range it was registered for (segment_topic_id, segment_partition,
--    segment_base_offset, segment_end_offset), so a retried registration is recognised even after
--    retention deleted the segment row (AlreadyRegistered, as the model answers).
-- 4. tiered_segments: one row per live segment, keyed by (partition, end offset) like batches,
--    without foreign keys (migration 9's discipline: writers keep it consistent under the
--    partition's row lock). max_timestamp_so_far is the running max of the partition's segments'
--    max timestamps (monotone in end_offset), for ListOffsets by timestamp.
-- 5. register_segment: the whole registration in one call at the commit point (see below).

ALTER TABLE topics ADD COLUMN segment_bytes integer NOT NULL DEFAULT 1073741824;
ALTER TABLE topics ADD COLUMN segment_ms bigint NOT NULL DEFAULT 604800000;
ALTER TABLE topics ADD COLUMN index_interval_bytes integer NOT NULL DEFAULT 4096;
ALTER TABLE topics ADD COLUMN segment_index_bytes integer NOT NULL DEFAULT 10485760;

ALTER TABLE partitions ADD COLUMN tiered_next_offset bigint NOT NULL DEFAULT 0;
ALTER TABLE partitions ADD COLUMN tiered_bytes bigint NOT NULL DEFAULT 0;

ALTER TABLE objects ADD COLUMN kind smallint NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN segment_topic_id uuid;
ALTER TABLE objects ADD COLUMN segment_partition integer;
ALTER TABLE objects ADD COLUMN segment_base_offset bigint;
ALTER TABLE objects ADD COLUMN segment_end_offset bigint;

CREATE TABLE tiered_segments (
    partition_id         bigint  NOT NULL,
    end_offset           bigint  NOT NULL,
    base_offset          bigint  NOT NULL,
    object_id            bigint  NOT NULL,
    log_size             bigint  NOT NULL,
    offset_index_size    integer NOT NULL,
    time_index_size      integer NOT NULL,
    txn_index_size       integer NOT NULL,
    snapshot_size        integer NOT NULL,
    epochs_size          integer NOT NULL,
    batch_count          integer NOT NULL,
    max_timestamp        bigint  NOT NULL,
    max_timestamp_offset bigint  NOT NULL,
    max_timestamp_so_far bigint  NOT NULL,
    retention_ts         bigint  NOT NULL,
    registered_at        bigint  NOT NULL,
    PRIMARY KEY (partition_id, end_offset)
);

-- ListOffsets by timestamp (first segment whose running max reaches the target) and
-- MAX_TIMESTAMP (largest max timestamp, earliest segment among equals).
CREATE INDEX tiered_timestamp_so_far ON tiered_segments (partition_id, max_timestamp_so_far, end_offset);
CREATE INDEX tiered_max_timestamp ON tiered_segments (partition_id, max_timestamp DESC, end_offset);

-- register_segment: registers an uploaded tiered segment of one partition and drops the WAL
-- batches it covers, in one call (one implicit transaction). Returns one row: r_outcome 0
-- registered (r_released: WAL objects whose last live bytes it released), 1 already registered
-- (the key is this segment: a retry), 2 stale (nothing applied), 3 unknown partition, 4 the key
-- is another object (ObjectAlreadyCommitted).
--
-- Locks, in the order every writer takes them: the key's advisory lock (shared with commit_file
-- and fence_orphans), the partition's row FOR UPDATE (commit_file, write_txn_markers, retention,
-- DeleteRecords and topic deletion lock partitions first too), then the commit point
-- (check_commit_point: deadline on the server's clock, fence), then the covered batches' objects in
-- object_id order (as retention releases them), then the new object row. No writer holds an
-- object row while waiting for a partition row, so none of them can deadlock with this.
--
-- Checks (the model's order after the commit point): a known key answers 1 or 4; an unknown
-- partition 3; the range must be exactly the partition's first WAL batches as the request counts
-- them (first base offset, a batch ending at end_offset, batch count, bytes) and end below the
-- last stable offset, else 2.
CREATE FUNCTION register_segment(
    p_object_key           text,
    p_uploader_broker_id   integer,
    p_object_size          bigint,
    p_owner                bigint,
    p_now                  bigint,
    p_topic_id             uuid,
    p_partition            integer,
    p_base_offset          bigint,
    p_end_offset           bigint,
    p_batch_count          integer,
    p_batch_bytes          bigint,
    p_offset_index_size    integer,
    p_time_index_size      integer,
    p_txn_index_size       integer,
    p_snapshot_size        integer,
    p_epochs_size          integer,
    p_max_timestamp        bigint,
    p_max_timestamp_offset bigint,
    p_key_time_ms          bigint,
    p_max_commit_age_ms    bigint
)
RETURNS TABLE (r_outcome smallint, r_released integer)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_pid        bigint;
    v_lso        bigint;
    v_hwm        bigint;
    v_log_start  bigint;
    v_kind       smallint;
    v_seg_topic  uuid;
    v_seg_part   integer;
    v_seg_base   bigint;
    v_seg_end    bigint;
    v_first_base bigint;
    v_count      bigint;
    v_bytes      bigint;
    v_last       bigint;
    v_ret_ts     bigint;
    v_so_far     bigint;
    v_prev       bigint;
    v_object_id  bigint;
    v_released   integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_object_key, 0));
    SELECT pa.partition_id, pa.high_watermark, pa.log_start_offset
    INTO v_pid, v_hwm, v_log_start
    FROM partitions pa WHERE pa.topic_id = p_topic_id AND pa.partition = p_partition
    FOR UPDATE;
    -- Every lock but the released objects' is held: the commit point.
    PERFORM check_commit_point(p_object_key, p_key_time_ms, p_max_commit_age_ms);

    SELECT o.kind, o.segment_topic_id, o.segment_partition, o.segment_base_offset,
           o.segment_end_offset
    INTO v_kind, v_seg_topic, v_seg_part, v_seg_base, v_seg_end
    FROM objects o WHERE o.object_key = p_object_key;
    IF FOUND THEN
        IF v_kind = 1 AND v_seg_topic = p_topic_id AND v_seg_part = p_partition
           AND v_seg_base = p_base_offset AND v_seg_end = p_end_offset THEN
            RETURN QUERY SELECT 1::smallint, 0;
        ELSE
            RETURN QUERY SELECT 4::smallint, 0;
        END IF;
        RETURN;
    END IF;
    IF v_pid IS NULL THEN
        RETURN QUERY SELECT 3::smallint, 0;
        RETURN;
    END IF;

    -- The last stable offset (as reads compute it).
    v_lso := least(v_hwm, greatest(v_log_start,
             coalesce((SELECT min(s.txn_first_offset) FROM producer_state s
                       WHERE s.partition_id = v_pid AND s.txn_first_offset IS NOT NULL),
                      v_hwm)));
    SELECT b.base_offset INTO v_first_base FROM batches b
    WHERE b.partition_id = v_pid ORDER BY b.last_offset LIMIT 1;
    IF v_first_base IS NULL OR v_first_base <> p_base_offset OR p_end_offset >= v_lso THEN
        RETURN QUERY SELECT 2::smallint, 0;
        RETURN;
    END IF;
    -- The covered rows: at most p_batch_count + 1 are read (one more means a count mismatch).
    SELECT count(*), coalesce(sum(c.byte_size), 0), max(c.last_offset), max(c.ret_ts)
    INTO v_count, v_bytes, v_last, v_ret_ts
    FROM (SELECT b.last_offset, b.byte_size,
                 CASE WHEN (CASE WHEN b.timestamp_type = 1 THEN b.log_append_time
                                 ELSE b.max_timestamp END) >= 0
                      THEN (CASE WHEN b.timestamp_type = 1 THEN b.log_append_time
                                 ELSE b.max_timestamp END)
                      WHEN b.object_id IS NULL THEN b.base_timestamp
                      ELSE (SELECT o.committed_at FROM objects o WHERE o.object_id = b.object_id)
                 END AS ret_ts
          FROM batches b
          WHERE b.partition_id = v_pid AND b.last_offset <= p_end_offset
          ORDER BY b.last_offset LIMIT p_batch_count::bigint + 1) c;
    IF v_count <> p_batch_count OR v_bytes <> p_batch_bytes OR v_last <> p_end_offset THEN
        RETURN QUERY SELECT 2::smallint, 0;
        RETURN;
    END IF;

    -- Release the covered WAL objects' bytes (markers have no object): lock them in object_id
    -- order, count those whose last live bytes go, then take the bytes off.
    PERFORM o.object_id FROM objects o
    WHERE o.object_id IN (SELECT b.object_id FROM batches b
                          WHERE b.partition_id = v_pid AND b.last_offset <= p_end_offset
                          AND b.object_id IS NOT NULL)
    ORDER BY o.object_id FOR UPDATE;
    WITH r AS (
        SELECT b.object_id, sum(b.byte_size) AS bytes FROM batches b
        WHERE b.partition_id = v_pid AND b.last_offset <= p_end_offset AND b.object_id IS NOT NULL
        GROUP BY b.object_id
    )
    SELECT count(*) INTO v_released FROM r JOIN objects o ON o.object_id = r.object_id
    WHERE o.marked_for_deletion_at IS NULL AND o.live_bytes - r.bytes <= 0;
    UPDATE objects o SET live_bytes = greatest(o.live_bytes - r.bytes, 0),
           marked_for_deletion_at = CASE WHEN o.marked_for_deletion_at IS NULL
               AND o.live_bytes - r.bytes <= 0 THEN p_now ELSE o.marked_for_deletion_at END
    FROM (SELECT b.object_id, sum(b.byte_size) AS bytes FROM batches b
          WHERE b.partition_id = v_pid AND b.last_offset <= p_end_offset
          AND b.object_id IS NOT NULL GROUP BY b.object_id) r
    WHERE o.object_id = r.object_id;

    -- The running max carries on from the previous segment and the last covered batch.
    SELECT s.max_timestamp_so_far INTO v_prev FROM tiered_segments s
    WHERE s.partition_id = v_pid ORDER BY s.end_offset DESC LIMIT 1;
    SELECT b.max_timestamp_so_far INTO v_so_far FROM batches b
    WHERE b.partition_id = v_pid AND b.last_offset = p_end_offset;
    v_so_far := greatest(coalesce(v_prev, p_max_timestamp), coalesce(v_so_far, p_max_timestamp),
                         p_max_timestamp);

    DELETE FROM batches b WHERE b.partition_id = v_pid AND b.last_offset <= p_end_offset;
    DELETE FROM aborted_txns a WHERE a.partition_id = v_pid AND a.last_offset <= p_end_offset;

    INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners,
                         committed_at, marked_for_deletion_at, kind, segment_topic_id,
                         segment_partition, segment_base_offset, segment_end_offset)
    VALUES (p_object_key, p_uploader_broker_id, p_object_size, p_batch_bytes, ARRAY[p_owner],
            p_now, NULL, 1, p_topic_id, p_partition, p_base_offset, p_end_offset)
    RETURNING object_id INTO v_object_id;
    INSERT INTO tiered_segments (partition_id, end_offset, base_offset, object_id, log_size,
                                 offset_index_size, time_index_size, txn_index_size,
                                 snapshot_size, epochs_size, batch_count, max_timestamp,
                                 max_timestamp_offset, max_timestamp_so_far, retention_ts,
                                 registered_at)
    VALUES (v_pid, p_end_offset, p_base_offset, v_object_id, p_batch_bytes, p_offset_index_size,
            p_time_index_size, p_txn_index_size, p_snapshot_size, p_epochs_size, p_batch_count,
            p_max_timestamp, p_max_timestamp_offset, v_so_far, coalesce(v_ret_ts, -1), p_now);
    UPDATE partitions SET tiered_next_offset = p_end_offset + 1,
           tiered_bytes = tiered_bytes + p_batch_bytes
    WHERE partition_id = v_pid;

    RETURN QUERY SELECT 0::smallint, v_released;
END;
$fn$;
