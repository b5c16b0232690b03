-- Migration 3 (issue #12): the primary's heartbeat, read on a replica to measure its lag (item 7),
-- and the running max of the batches' timestamps, for ListOffsets by timestamp with a bounded
-- number of index probes (item 10; the indexes are built concurrently by migration 4).
--
-- Only a new table, nullable columns (a catalog update, no table rewrite) and a replaced function
-- body with the same signature: a broker of the previous version keeps working on this schema,
-- and its commits maintain the new columns too. A commit already running keeps the old body until
-- it ends; the next call uses this one.

-- One row: the primary's clock (server time, ms since the epoch) as last written by a coordinator
-- that reads from a replica (every `max_replica_lag / 4`, at most every second). A replica holding
-- the value t has replayed every transaction the primary committed before t, so the replica's
-- `clock_timestamp() - at_ms` bounds its lag from above (with the clocks of both servers in sync).
CREATE TABLE replica_heartbeat (
    id    smallint NOT NULL PRIMARY KEY CHECK (id = 1),
    at_ms bigint   NOT NULL
);
INSERT INTO replica_heartbeat (id, at_ms) VALUES (1, 0);

-- The running max of the effective max timestamp (LogAppendTime for a LogAppendTime topic, else
-- the batch's max timestamp) over the partition's batches appended since this migration: the
-- partition keeps the current value; each batch stores the value including itself. It is
-- monotonic in offset order, so "the first batch whose timestamp is >= t" is found from the first
-- index entry with max_timestamp_so_far >= t. Batches committed before this migration have NULL
-- (a partial index of migration 4 holds them until retention removes them).
ALTER TABLE partitions ADD COLUMN max_timestamp bigint;
ALTER TABLE batches ADD COLUMN max_timestamp_so_far bigint;

-- commit_file of migration 2, with the running max: the partition's value comes with its locked
-- row, each appended batch stores the value including itself, and the partition keeps the new
-- value. Nothing else changed.
CREATE OR REPLACE FUNCTION commit_file(
    p_object_key         text,
    p_uploader_broker_id integer,
    p_object_size        bigint,
    p_owners             bigint[],
    p_now                bigint,
    p_topic_ids          uuid[],
    p_partitions         integer[],
    p_byte_offsets       bigint[],
    p_byte_sizes         bigint[],
    p_record_counts      integer[],
    p_base_timestamps    bigint[],
    p_max_timestamps     bigint[],
    p_producer_ids       bigint[],
    p_producer_epochs    smallint[],
    p_base_sequences     integer[],
    p_last_sequences     integer[]
)
RETURNS TABLE (
    r_batch_index      integer,
    r_error_code       smallint,
    r_base_offset      bigint,
    r_log_append_time  bigint,
    r_log_start_offset bigint,
    r_duplicate        boolean
)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_n          integer := coalesce(array_length(p_topic_ids, 1), 0);
    v_object_id  bigint;
    -- Per locked partition ("slot"), in lock order.
    s_pid        bigint[];
    s_lso        bigint[];
    s_hwm        bigint[];
    s_bytes      bigint[];
    s_tt         smallint[];
    s_maxts      bigint[];   -- running max of the effective max timestamps
    s_touched    boolean[];
    -- Per batch: its slot (0 = unknown partition).
    b_slot       integer[];
    -- The appended batches, for one multi-row insert (loop path).
    a_pid        bigint[]   := '{}';
    a_last       bigint[]   := '{}';
    a_base       bigint[]   := '{}';
    a_byte_off   bigint[]   := '{}';
    a_byte_size  bigint[]   := '{}';
    a_base_ts    bigint[]   := '{}';
    a_max_ts     bigint[]   := '{}';
    a_tt         smallint[] := '{}';
    a_lat        bigint[]   := '{}';
    a_prod       bigint[]   := '{}';
    a_epoch      smallint[] := '{}';
    a_base_seq   integer[]  := '{}';
    a_last_seq   integer[]  := '{}';
    a_so_far     bigint[]   := '{}';
    v_live       bigint := 0;
    i            integer;
    j            integer;
    k            integer;
    v_slot       integer;
    v_base       bigint;
    v_last       bigint;
    v_lat        bigint;
    v_ets        bigint;
    v_found      boolean;
    v_epoch      smallint;
    v_bs         integer[];
    v_ls         integer[];
    v_bo         bigint[];
    v_lo         bigint[];
    v_la         bigint[];
    v_dup        integer;
    v_verdict    smallint; -- 0 append, 45/47 reject, -2 duplicate
    v_last_seq   integer;
BEGIN
    INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners,
                         committed_at, marked_for_deletion_at)
    VALUES (p_object_key, p_uploader_broker_id, p_object_size, 0, p_owners, p_now, p_now)
    ON CONFLICT (object_key) DO NOTHING
    RETURNING object_id INTO v_object_id;
    IF v_object_id IS NULL THEN
        r_batch_index := -1;
        r_error_code := 0;
        r_base_offset := -1;
        r_log_append_time := -1;
        r_log_start_offset := -1;
        r_duplicate := false;
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_n = 0 THEN
        RETURN;
    END IF;

    -- Lock every touched partition, in (topic_id, partition) order: the wanted pairs, sorted,
    -- drive a nested loop whose inner side looks up and locks one partition row (one probe of
    -- the (topic_id, partition) unique index on both columns, whatever the table statistics);
    -- a nested loop runs its inner side in the order of its outer rows.
    WITH locked AS MATERIALIZED (
        SELECT l.*
        FROM (SELECT DISTINCT u.t, u.p FROM unnest(p_topic_ids, p_partitions) AS u(t, p)
              ORDER BY u.t, u.p) w
        CROSS JOIN LATERAL (
            SELECT pa.partition_id, pa.topic_id, pa.partition, pa.log_start_offset,
                   pa.high_watermark, pa.byte_size, tp.timestamp_type, pa.max_timestamp
            FROM partitions pa
            JOIN topics tp ON tp.topic_id = pa.topic_id
            WHERE pa.topic_id = w.t AND pa.partition = w.p
            FOR UPDATE OF pa
        ) l
    ), numbered AS (
        SELECT row_number() OVER (ORDER BY l.topic_id, l.partition)::integer AS slot, l.*
        FROM locked l
    )
    SELECT array_agg(nb.partition_id ORDER BY nb.slot),
           array_agg(nb.log_start_offset ORDER BY nb.slot),
           array_agg(nb.high_watermark ORDER BY nb.slot),
           array_agg(nb.byte_size ORDER BY nb.slot),
           array_agg(nb.timestamp_type ORDER BY nb.slot),
           array_agg(nb.max_timestamp ORDER BY nb.slot),
           array_agg(false ORDER BY nb.slot),
           (SELECT array_agg(coalesce(n2.slot, 0) ORDER BY u.i)
            FROM unnest(p_topic_ids, p_partitions) WITH ORDINALITY AS u(t, p, i)
            LEFT JOIN numbered n2 ON n2.topic_id = u.t AND n2.partition = u.p)
    INTO s_pid, s_lso, s_hwm, s_bytes, s_tt, s_maxts, s_touched, b_slot
    FROM numbered nb;

    IF -1 = ALL (p_producer_ids) THEN
        -- No idempotent batch: every batch of a known partition is appended, in request order.
        -- Its base offset is the partition's high watermark plus the records of the earlier
        -- batches of the same partition in this request. One statement appends the batches,
        -- moves the touched partitions' bounds (every locked partition is touched here), sets
        -- the object's live bytes and returns the result rows.
        IF s_pid IS NULL THEN
            -- No known partition: nothing is appended (the object stays marked, as in the loop).
            RETURN QUERY
            SELECT u.i::integer, 3::smallint, -1::bigint, -1::bigint, -1::bigint, false
            FROM generate_series(1, v_n) AS u(i);
            RETURN;
        END IF;
        RETURN QUERY
        WITH b AS MATERIALIZED (
            SELECT u.i, u.slot, u.rc, u.byte_off, u.byte_size, u.base_ts, u.max_ts, u.prod,
                   u.epoch, u.base_seq, u.last_seq,
                   CASE WHEN u.slot > 0 THEN
                       s_hwm[u.slot]
                       + sum(u.rc) OVER (PARTITION BY u.slot ORDER BY u.i
                                         ROWS UNBOUNDED PRECEDING)
                       - u.rc
                   END AS base,
                   -- The partition's running max of the effective max timestamps, this batch
                   -- included.
                   CASE WHEN u.slot > 0 THEN
                       greatest(s_maxts[u.slot],
                                max(CASE WHEN s_tt[u.slot] = 1 THEN p_now ELSE u.max_ts END)
                                    OVER (PARTITION BY u.slot ORDER BY u.i
                                          ROWS UNBOUNDED PRECEDING))
                   END AS so_far
            FROM unnest(b_slot, p_record_counts, p_byte_offsets, p_byte_sizes,
                        p_base_timestamps, p_max_timestamps, p_producer_ids, p_producer_epochs,
                        p_base_sequences, p_last_sequences)
                 WITH ORDINALITY AS u(slot, rc, byte_off, byte_size, base_ts, max_ts, prod,
                                      epoch, base_seq, last_seq, i)
        ), ins AS (
            INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset,
                                 byte_size, base_timestamp, max_timestamp, timestamp_type,
                                 log_append_time, producer_id, producer_epoch, base_sequence,
                                 last_sequence, max_timestamp_so_far)
            SELECT s_pid[b.slot], b.base + b.rc - 1, b.base, v_object_id, b.byte_off,
                   b.byte_size, b.base_ts, b.max_ts, s_tt[b.slot],
                   CASE WHEN s_tt[b.slot] = 1 THEN p_now ELSE -1 END, b.prod, b.epoch,
                   b.base_seq, b.last_seq, b.so_far
            FROM b
            WHERE b.slot > 0
        ), g AS MATERIALIZED (
            SELECT s_pid[b.slot] AS pid,
                   s_hwm[b.slot] + sum(b.rc) AS hwm,
                   s_bytes[b.slot] + sum(b.byte_size)::bigint AS bytes,
                   sum(b.byte_size)::bigint AS appended,
                   max(b.so_far) AS maxts
            FROM b
            WHERE b.slot > 0
            GROUP BY b.slot
        ), upd AS (
            UPDATE partitions pa
            SET high_watermark = g.hwm, byte_size = g.bytes, max_timestamp = g.maxts
            FROM g
            WHERE pa.partition_id = g.pid
        ), obj AS (
            UPDATE objects
            SET live_bytes = (SELECT sum(g.appended)::bigint FROM g),
                marked_for_deletion_at = NULL
            WHERE object_id = v_object_id
        )
        SELECT b.i::integer,
               (CASE WHEN b.slot > 0 THEN 0 ELSE 3 END)::smallint, -- 3: UNKNOWN_TOPIC_OR_PARTITION
               coalesce(b.base, -1),
               CASE WHEN b.slot > 0 AND s_tt[b.slot] = 1 THEN p_now ELSE -1 END,
               CASE WHEN b.slot > 0 THEN s_lso[b.slot] ELSE -1 END,
               false
        FROM b
        ORDER BY b.i;
        RETURN;
    END IF;

    -- At least one idempotent batch: the producer rules of migration 1, batch by batch.
    FOR i IN 1 .. v_n LOOP
        v_slot := b_slot[i];
        r_batch_index := i;
        r_error_code := 0;
        r_duplicate := false;
        IF v_slot IS NULL OR v_slot = 0 THEN
            r_error_code := 3; -- UNKNOWN_TOPIC_OR_PARTITION
            r_base_offset := -1;
            r_log_append_time := -1;
            r_log_start_offset := -1;
            RETURN NEXT;
            CONTINUE;
        END IF;

        v_verdict := 0;
        v_found := false;
        IF p_producer_ids[i] <> -1 THEN
            SELECT ps.producer_epoch, ps.base_sequences, ps.last_sequences, ps.base_offsets,
                   ps.last_offsets, ps.log_append_times
            INTO v_epoch, v_bs, v_ls, v_bo, v_lo, v_la
            FROM producer_state ps
            WHERE ps.partition_id = s_pid[v_slot] AND ps.producer_id = p_producer_ids[i];
            v_found := FOUND;
            IF v_found THEN
                v_dup := 0;
                IF p_producer_epochs[i] = v_epoch THEN
                    FOR j IN 1 .. coalesce(array_length(v_bs, 1), 0) LOOP
                        IF v_bs[j] = p_base_sequences[i] AND v_ls[j] = p_last_sequences[i] THEN
                            v_dup := j;
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
                IF v_dup > 0 THEN
                    v_verdict := -2;
                ELSIF p_producer_epochs[i] < v_epoch THEN
                    v_verdict := 47; -- INVALID_PRODUCER_EPOCH
                ELSIF p_producer_epochs[i] > v_epoch THEN
                    IF p_base_sequences[i] <> 0 THEN
                        v_verdict := 45; -- OUT_OF_ORDER_SEQUENCE_NUMBER
                    END IF;
                ELSIF coalesce(array_length(v_ls, 1), 0) > 0 THEN
                    v_last_seq := v_ls[array_length(v_ls, 1)];
                    IF NOT (p_base_sequences[i]::bigint = v_last_seq::bigint + 1
                            OR (p_base_sequences[i] = 0 AND v_last_seq = 2147483647)) THEN
                        v_verdict := 45;
                    END IF;
                END IF;
            END IF;
        END IF;

        IF v_verdict = -2 THEN
            r_base_offset := v_bo[v_dup];
            r_log_append_time := v_la[v_dup];
            r_log_start_offset := s_lso[v_slot];
            r_duplicate := true;
            RETURN NEXT;
            CONTINUE;
        ELSIF v_verdict <> 0 THEN
            r_error_code := v_verdict;
            r_base_offset := -1;
            r_log_append_time := -1;
            r_log_start_offset := -1;
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- Append.
        v_base := s_hwm[v_slot];
        v_last := v_base + p_record_counts[i] - 1;
        v_lat := CASE WHEN s_tt[v_slot] = 1 THEN p_now ELSE -1 END;
        s_hwm[v_slot] := v_last + 1;
        s_bytes[v_slot] := s_bytes[v_slot] + p_byte_sizes[i];
        v_ets := CASE WHEN s_tt[v_slot] = 1 THEN p_now ELSE p_max_timestamps[i] END;
        s_maxts[v_slot] := greatest(s_maxts[v_slot], v_ets);
        s_touched[v_slot] := true;
        v_live := v_live + p_byte_sizes[i];
        k := coalesce(array_length(a_pid, 1), 0) + 1;
        a_pid[k] := s_pid[v_slot];
        a_last[k] := v_last;
        a_base[k] := v_base;
        a_byte_off[k] := p_byte_offsets[i];
        a_byte_size[k] := p_byte_sizes[i];
        a_base_ts[k] := p_base_timestamps[i];
        a_max_ts[k] := p_max_timestamps[i];
        a_tt[k] := s_tt[v_slot];
        a_lat[k] := v_lat;
        a_prod[k] := p_producer_ids[i];
        a_epoch[k] := p_producer_epochs[i];
        a_base_seq[k] := p_base_sequences[i];
        a_last_seq[k] := p_last_sequences[i];
        a_so_far[k] := s_maxts[v_slot];

        IF p_producer_ids[i] <> -1 THEN
            IF v_found AND v_epoch = p_producer_epochs[i] THEN
                v_bs := v_bs || p_base_sequences[i];
                v_ls := v_ls || p_last_sequences[i];
                v_bo := v_bo || v_base;
                v_lo := v_lo || v_last;
                v_la := v_la || v_lat;
                IF array_length(v_bs, 1) > 5 THEN
                    j := array_length(v_bs, 1);
                    v_bs := v_bs[j - 4 : j];
                    v_ls := v_ls[j - 4 : j];
                    v_bo := v_bo[j - 4 : j];
                    v_lo := v_lo[j - 4 : j];
                    v_la := v_la[j - 4 : j];
                END IF;
            ELSE
                -- First batch of this producer, or of a new epoch: a new window.
                v_bs := ARRAY[p_base_sequences[i]];
                v_ls := ARRAY[p_last_sequences[i]];
                v_bo := ARRAY[v_base];
                v_lo := ARRAY[v_last];
                v_la := ARRAY[v_lat];
            END IF;
            INSERT INTO producer_state AS ps (partition_id, producer_id, producer_epoch,
                base_sequences, last_sequences, base_offsets, last_offsets, log_append_times)
            VALUES (s_pid[v_slot], p_producer_ids[i], p_producer_epochs[i], v_bs, v_ls, v_bo,
                    v_lo, v_la)
            ON CONFLICT (partition_id, producer_id) DO UPDATE SET
                producer_epoch = excluded.producer_epoch,
                base_sequences = excluded.base_sequences,
                last_sequences = excluded.last_sequences,
                base_offsets = excluded.base_offsets,
                last_offsets = excluded.last_offsets,
                log_append_times = excluded.log_append_times;
        END IF;

        r_base_offset := v_base;
        r_log_append_time := v_lat;
        r_log_start_offset := s_lso[v_slot];
        RETURN NEXT;
    END LOOP;

    IF coalesce(array_length(a_pid, 1), 0) > 0 THEN
        INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset,
                             byte_size, base_timestamp, max_timestamp, timestamp_type,
                             log_append_time, producer_id, producer_epoch, base_sequence,
                             last_sequence, max_timestamp_so_far)
        SELECT u.pid, u.last_off, u.base_off, v_object_id, u.byte_off, u.byte_size, u.base_ts,
               u.max_ts, u.tt, u.lat, u.prod, u.epoch, u.base_seq, u.last_seq, u.so_far
        FROM unnest(a_pid, a_last, a_base, a_byte_off, a_byte_size, a_base_ts, a_max_ts, a_tt,
                    a_lat, a_prod, a_epoch, a_base_seq, a_last_seq, a_so_far)
             AS u(pid, last_off, base_off, byte_off, byte_size, base_ts, max_ts, tt, lat,
                  prod, epoch, base_seq, last_seq, so_far);

        WITH g AS MATERIALIZED (
            SELECT u.pid, u.hwm, u.bytes, u.maxts
            FROM unnest(s_pid, s_hwm, s_bytes, s_maxts, s_touched)
                 AS u(pid, hwm, bytes, maxts, touched)
            WHERE u.touched
        )
        UPDATE partitions pa
        SET high_watermark = g.hwm, byte_size = g.bytes, max_timestamp = g.maxts
        FROM g
        WHERE pa.partition_id = g.pid;

        UPDATE objects
        SET live_bytes = v_live, marked_for_deletion_at = NULL
        WHERE object_id = v_object_id;
    END IF;
    RETURN;
END;
$fn$;
