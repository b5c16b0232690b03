-- The schema of the PostgreSQL batch coordinator (diskless-rs), migration 1.
--
-- Runs inside one transaction with search_path set to the coordinator's schema, so every name
-- below is created in (and resolved against) that schema. Only new objects are created: no
-- statement here locks a table that already holds data.
--
-- Time columns are ms since the Unix epoch on the coordinator's clock (passed in by the caller,
-- never read from the server's clock). timestamp_type: 0 = CreateTime, 1 = LogAppendTime.

-- Live topics and their configuration.
CREATE TABLE topics (
    topic_id                        uuid     NOT NULL PRIMARY KEY,
    name                            text     NOT NULL CONSTRAINT topics_name_key UNIQUE,
    partition_count                 integer  NOT NULL CHECK (partition_count > 0),
    timestamp_type                  smallint NOT NULL,
    retention_ms                    bigint   NOT NULL,
    retention_bytes                 bigint   NOT NULL,
    max_message_bytes               integer  NOT NULL,
    message_timestamp_before_max_ms bigint   NOT NULL,
    message_timestamp_after_max_ms  bigint   NOT NULL
);

-- One row per partition: the log's bounds and the bytes of its live batches (for retention.bytes).
-- A commit locks the rows of the partitions it appends to (FOR UPDATE, in (topic_id, partition)
-- order); that row lock is what serializes offset assignment per partition.
CREATE TABLE partitions (
    partition_id     bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id         uuid    NOT NULL REFERENCES topics (topic_id),
    partition        integer NOT NULL,
    log_start_offset bigint  NOT NULL,
    high_watermark   bigint  NOT NULL,
    byte_size        bigint  NOT NULL,
    CONSTRAINT partitions_topic_partition_key UNIQUE (topic_id, partition)
);

-- Committed WAL objects. live_bytes: bytes of their batches still live; marked_for_deletion_at is
-- set when live_bytes reaches 0. owners: the coordinator shards holding batches of the object.
CREATE TABLE objects (
    object_id              bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    object_key             text     NOT NULL CONSTRAINT objects_object_key_key UNIQUE,
    uploader_broker_id     integer  NOT NULL,
    object_size            bigint   NOT NULL,
    live_bytes             bigint   NOT NULL,
    owners                 bigint[] NOT NULL,
    committed_at           bigint   NOT NULL,
    marked_for_deletion_at bigint
);

-- The cleaner's queue: marked objects, oldest first.
CREATE INDEX objects_marked ON objects (marked_for_deletion_at, object_key)
    WHERE marked_for_deletion_at IS NOT NULL;

-- Live batches, keyed by (partition, last offset): a fetch is one index range scan from the batch
-- containing the fetch offset. Deleted batches are removed (logical deletion from their object).
CREATE TABLE batches (
    partition_id    bigint   NOT NULL REFERENCES partitions (partition_id),
    last_offset     bigint   NOT NULL,
    base_offset     bigint   NOT NULL,
    object_id       bigint   NOT NULL REFERENCES objects (object_id),
    byte_offset     bigint   NOT NULL,
    byte_size       bigint   NOT NULL,
    base_timestamp  bigint   NOT NULL,
    max_timestamp   bigint   NOT NULL,
    timestamp_type  smallint NOT NULL,
    log_append_time bigint   NOT NULL,
    producer_id     bigint   NOT NULL,
    producer_epoch  smallint NOT NULL,
    base_sequence   integer  NOT NULL,
    last_sequence   integer  NOT NULL,
    PRIMARY KEY (partition_id, last_offset)
);

-- For the foreign key from batches: confirming an object deleted must not scan all batches.
CREATE INDEX batches_object ON batches (object_id);

-- Idempotent-producer state: one row per (partition, producer id) holding the last 5 batches under
-- producer_epoch, oldest first, as parallel arrays. Only written under the partition's row lock.
CREATE TABLE producer_state (
    partition_id     bigint   NOT NULL REFERENCES partitions (partition_id),
    producer_id      bigint   NOT NULL,
    producer_epoch   smallint NOT NULL,
    base_sequences   integer[] NOT NULL,
    last_sequences   integer[] NOT NULL,
    base_offsets     bigint[] NOT NULL,
    last_offsets     bigint[] NOT NULL,
    log_append_times bigint[] NOT NULL,
    PRIMARY KEY (partition_id, producer_id)
);

-- commit_file: registers a WAL object and appends its batches, in one statement (one round trip,
-- one implicit transaction). The batches come as parallel arrays, one element per batch, in
-- request order. Returns one row per batch (batch_index 1..n) with its Kafka error code, base
-- offset, log append time, the partition's log start offset and whether it was a duplicate; or a
-- single row with batch_index = -1 when the object key was already committed (nothing changed).
--
-- Concurrency: the object row is inserted first (a concurrent commit of the same key waits on the
-- unique index before taking any other lock), then the rows of all touched partitions are locked
-- FOR UPDATE in (topic_id, partition) order, so concurrent commits cannot deadlock; offsets are
-- assigned under those locks (READ COMMITTED re-reads the newest row version after a wait).
--
-- Producer rules (Kafka's, batch by batch in request order): no state -> append; same epoch and an
-- exact (base, last) sequence match among the kept batches -> duplicate (original offsets and
-- log append time); older epoch -> INVALID_PRODUCER_EPOCH (47); newer epoch -> append iff the base
-- sequence is 0, else OUT_OF_ORDER_SEQUENCE_NUMBER (45); same epoch -> append iff the base
-- sequence follows the last kept one (i32::MAX wraps to 0), else 45. The last 5 batches are kept.
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
    s_touched    boolean[];
    -- Per batch: its slot (0 = unknown partition).
    b_slot       integer[];
    -- The appended batches, for one multi-row insert.
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
    v_live       bigint := 0;
    i            integer;
    j            integer;
    k            integer;
    v_slot       integer;
    v_base       bigint;
    v_last       bigint;
    v_lat        bigint;
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

    IF v_n > 0 THEN
        -- Lock every touched partition, in (topic_id, partition) order.
        WITH wanted AS (
            SELECT DISTINCT u.t, u.p FROM unnest(p_topic_ids, p_partitions) AS u(t, p)
        ), locked AS MATERIALIZED (
            SELECT pa.partition_id, pa.topic_id, pa.partition, pa.log_start_offset,
                   pa.high_watermark, pa.byte_size, tp.timestamp_type
            FROM partitions pa
            JOIN topics tp ON tp.topic_id = pa.topic_id
            WHERE (pa.topic_id, pa.partition) IN (SELECT w.t, w.p FROM wanted w)
            ORDER BY pa.topic_id, pa.partition
            FOR UPDATE OF pa
        ), numbered AS (
            SELECT row_number() OVER (ORDER BY l.topic_id, l.partition)::integer AS slot, l.*
            FROM locked l
        )
        SELECT array_agg(nb.partition_id ORDER BY nb.slot),
               array_agg(nb.log_start_offset ORDER BY nb.slot),
               array_agg(nb.high_watermark ORDER BY nb.slot),
               array_agg(nb.byte_size ORDER BY nb.slot),
               array_agg(nb.timestamp_type ORDER BY nb.slot),
               array_agg(false ORDER BY nb.slot),
               (SELECT array_agg(coalesce(n2.slot, 0) ORDER BY u.i)
                FROM unnest(p_topic_ids, p_partitions) WITH ORDINALITY AS u(t, p, i)
                LEFT JOIN numbered n2 ON n2.topic_id = u.t AND n2.partition = u.p)
        INTO s_pid, s_lso, s_hwm, s_bytes, s_tt, s_touched, b_slot
        FROM numbered nb;

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
                                 last_sequence)
            SELECT u.pid, u.last_off, u.base_off, v_object_id, u.byte_off, u.byte_size, u.base_ts,
                   u.max_ts, u.tt, u.lat, u.prod, u.epoch, u.base_seq, u.last_seq
            FROM unnest(a_pid, a_last, a_base, a_byte_off, a_byte_size, a_base_ts, a_max_ts, a_tt,
                        a_lat, a_prod, a_epoch, a_base_seq, a_last_seq)
                 AS u(pid, last_off, base_off, byte_off, byte_size, base_ts, max_ts, tt, lat,
                      prod, epoch, base_seq, last_seq);

            UPDATE partitions pa
            SET high_watermark = u.hwm, byte_size = u.bytes
            FROM unnest(s_pid, s_hwm, s_bytes, s_touched) AS u(pid, hwm, bytes, touched)
            WHERE pa.partition_id = u.pid AND u.touched;

            UPDATE objects
            SET live_bytes = v_live, marked_for_deletion_at = NULL
            WHERE object_id = v_object_id;
        END IF;
    END IF;
    RETURN;
END;
$fn$;
