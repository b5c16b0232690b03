-- Migration 5 (issue #12): safety at the commit point and producer-id expiration.
--
-- 1. The commit deadline, checked inside commit_file after every lock is held, against the
--    server's clock: a key whose UUID v7 time (computed by the caller, the same function for every
--    coordinator) is older than now - max_commit_age is refused, nothing applied (SQLSTATE DL001).
-- 2. Orphan fences: fence_orphans records fences; commit_file refuses a fenced key (DL002).
-- 3. Producer-controlled fields judged per batch (the caller passes producer_field_error's codes);
--    a producer id below -1 is not idempotent.
-- 4. Producer-id expiration: the topic's producer.id.expiration.ms, and per producer state the
--    commit time of its last appended batch.
--
-- Only new tables, new functions, columns added with a constant or stable default (a catalog
-- update: PostgreSQL stores the default once, no table rewrite), and the old commit_file signature
-- kept as a wrapper, so that a broker of the previous version passes the same checks.

-- Keys fenced by the orphan collector, with their UUID v7 times (for expiry).
CREATE TABLE object_fences (
    object_key  text   NOT NULL PRIMARY KEY,
    key_time_ms bigint NOT NULL
);
CREATE INDEX object_fences_key_time ON object_fences (key_time_ms);

-- Topics created before this migration get Kafka's default (one day).
ALTER TABLE topics ADD COLUMN producer_id_expiration_ms bigint NOT NULL DEFAULT 86400000;

-- Producer states written before this migration count from the migration's time (now() is
-- stable: evaluated once, stored as the default of the existing rows).
ALTER TABLE producer_state ADD COLUMN last_append_ms bigint NOT NULL
    DEFAULT (floor(extract(epoch FROM now()) * 1000))::bigint;
ALTER TABLE producer_state ALTER COLUMN last_append_ms DROP DEFAULT;

-- The UUID v7 time (ms) of a key's last path segment written as a hyphenated UUID, else NULL. Only
-- for the previous version's commit_file signature: callers of the new one pass the time computed
-- by diskless_coordinator::object_key_time_ms.
CREATE FUNCTION object_key_time_ms(p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT CASE WHEN s ~* '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
                THEN ('x' || lpad(replace(substr(s, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint
           END
    FROM (SELECT regexp_replace(p_key, '^.*/', '') AS s) k
$fn$;

-- The commit point of commit_file, called with every lock of the commit held (the key's advisory
-- lock, its object row, its partitions' rows). Raises, so that the whole commit rolls back:
-- DL001 when the key's time is older than the server's clock minus max_commit_age (a key exactly
-- at the limit passes; keys without a time always pass), DL002 when the key is fenced.
--
-- Why the per-key advisory lock (taken first by commit_file and by fence_orphans, on
-- hashtextextended(key, 0)): under READ COMMITTED a commit in progress (its object row inserted,
-- not committed) is invisible to fence_orphans, and a fence being recorded is invisible to the
-- commit, so each could check, miss the other, and both succeed. With the lock the second waits
-- for the first to end, and its next statement (a new snapshot) sees the first's rows: either the
-- commit landed first (the object is known: not fenced) or the fence did (the commit is refused).
-- A unique index both insert into would also serialize them, but would make a fence a row of
-- objects (fences must not make a key known) or a commit a row of fences on every commit.
CREATE FUNCTION check_commit_point(p_key text, p_key_time_ms bigint, p_max_commit_age_ms bigint)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF p_key_time_ms IS NOT NULL AND p_key_time_ms < v_now - p_max_commit_age_ms THEN
        RAISE EXCEPTION USING
            ERRCODE = 'DL001',
            MESSAGE = format('object %s is %s ms older than the commit deadline', p_key,
                             (v_now - p_max_commit_age_ms) - p_key_time_ms);
    END IF;
    IF EXISTS (SELECT 1 FROM object_fences f WHERE f.object_key = p_key) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'DL002',
            MESSAGE = format('object %s is fenced as an orphan', p_key);
    END IF;
END;
$fn$;

-- fence_orphans: drops up to p_expiry_batch fences whose key time is older than the server's clock
-- minus p_fence_retention_ms, takes the per-key locks of the requested keys with a time (in key
-- order: concurrent calls cannot deadlock), then fences every such key the coordinator does not
-- know (an existing fence is kept) and returns them once each, in request order.
CREATE FUNCTION fence_orphans(
    p_keys               text[],
    p_key_times          bigint[],
    p_fence_retention_ms bigint,
    p_expiry_batch       integer
)
RETURNS TABLE (r_object_key text)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_now bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_key text;
BEGIN
    DELETE FROM object_fences f
    WHERE f.object_key IN (SELECT e.object_key FROM object_fences e
                           WHERE e.key_time_ms < v_now - p_fence_retention_ms
                           ORDER BY e.key_time_ms LIMIT p_expiry_batch);
    FOR v_key IN
        SELECT DISTINCT u.k FROM unnest(p_keys, p_key_times) AS u(k, t)
        WHERE u.t IS NOT NULL ORDER BY u.k
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_key, 0));
    END LOOP;
    -- A new statement: its snapshot sees every commit of these keys that ended before the locks.
    RETURN QUERY
    WITH req AS (
        SELECT u.k, min(u.t) AS t, min(u.i) AS i
        FROM unnest(p_keys, p_key_times) WITH ORDINALITY AS u(k, t, i)
        WHERE u.t IS NOT NULL
        GROUP BY u.k
    ), todo AS MATERIALIZED (
        SELECT req.k, req.t, req.i FROM req
        WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE o.object_key = req.k)
    ), ins AS (
        INSERT INTO object_fences (object_key, key_time_ms)
        SELECT todo.k, todo.t FROM todo
        ON CONFLICT (object_key) DO NOTHING
    )
    SELECT todo.k FROM todo ORDER BY todo.i;
END;
$fn$;

-- commit_file of migration 3 with the commit point (the key's lock first, check_commit_point once
-- every lock is held), the per-batch producer field errors, idempotence for producer ids >= 0
-- only, and last_append_ms in the producer state.
CREATE FUNCTION commit_file(
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
    p_last_sequences     integer[],
    p_key_time_ms        bigint,
    p_max_commit_age_ms  bigint,
    p_field_errors       smallint[]
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
    -- The key's lock, shared with fence_orphans (see check_commit_point).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_object_key, 0));
    INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners,
                         committed_at, marked_for_deletion_at)
    VALUES (p_object_key, p_uploader_broker_id, p_object_size, 0, p_owners, p_now, p_now)
    ON CONFLICT (object_key) DO NOTHING
    RETURNING object_id INTO v_object_id;
    IF v_object_id IS NULL THEN
        PERFORM check_commit_point(p_object_key, p_key_time_ms, p_max_commit_age_ms);
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
        PERFORM check_commit_point(p_object_key, p_key_time_ms, p_max_commit_age_ms);
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

    -- Every lock is held: the commit point.
    PERFORM check_commit_point(p_object_key, p_key_time_ms, p_max_commit_age_ms);

    IF NOT (0 <= ANY (p_producer_ids)) THEN
        -- No idempotent batch (producer id >= 0; an id below -1 is treated as -1): every batch of a known partition is appended, in request order.
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

        -- Producer-controlled fields, judged by the caller (producer_field_error): this batch only.
        IF coalesce(p_field_errors[i], 0) <> 0 THEN
            r_error_code := p_field_errors[i];
            r_base_offset := -1;
            r_log_append_time := -1;
            r_log_start_offset := -1;
            RETURN NEXT;
            CONTINUE;
        END IF;

        v_verdict := 0;
        v_found := false;
        IF p_producer_ids[i] >= 0 THEN
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

        IF p_producer_ids[i] >= 0 THEN
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
                base_sequences, last_sequences, base_offsets, last_offsets, log_append_times,
                last_append_ms)
            VALUES (s_pid[v_slot], p_producer_ids[i], p_producer_epochs[i], v_bs, v_ls, v_bo,
                    v_lo, v_la, p_now)
            ON CONFLICT (partition_id, producer_id) DO UPDATE SET
                last_append_ms = excluded.last_append_ms,
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


-- The previous version's signature: the same commit, with the default max_commit_age (10 min),
-- the key's time parsed here and no producer field errors (that version refused them per
-- request), so that its brokers pass the commit point during a rolling upgrade.
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
LANGUAGE sql
AS $fn$
    SELECT * FROM commit_file(p_object_key, p_uploader_broker_id, p_object_size, p_owners, p_now,
        p_topic_ids, p_partitions, p_byte_offsets, p_byte_sizes, p_record_counts,
        p_base_timestamps, p_max_timestamps, p_producer_ids, p_producer_epochs, p_base_sequences,
        p_last_sequences, object_key_time_ms(p_object_key), 600000::bigint, NULL::smallint[])
$fn$;
