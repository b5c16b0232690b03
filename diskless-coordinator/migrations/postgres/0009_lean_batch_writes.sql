-- Migration 9 (issue #17, "the coordinator at scale"): leaner writes of a commit. A 100-batch
-- commit spent a fifth of its time in the foreign keys of batches (two RI trigger queries per
-- inserted batch, each a probe and a KEY SHARE row lock) and maintained an index (batches_object)
-- that only served the foreign key to objects; the object row was updated non-HOT.
--
-- 1. batches loses its foreign keys (to partitions and to objects). Integrity is kept by the
--    writers, which hold the row locks (ARCHITECTURE.md, "PostgreSQL coordinator"):
--    - a batch row is only inserted by commit_file, with the partition_id of a partition row it
--      holds FOR UPDATE and the object_id of the object row it inserted in the same transaction;
--    - partition rows are only deleted by delete_topic, which locks them FOR UPDATE first and
--      deletes their batches (and producer states) in the same transaction, so a commit waiting
--      for the lock re-reads nothing and answers UNKNOWN_TOPIC_OR_PARTITION;
--    - object rows are only deleted by confirm_deleted, and only when marked for deletion, which
--      happens exactly when their live_bytes (the sum of their batches' sizes, every batch has
--      byte_size > 0) reaches 0, under the object row lock (release_objects, commit_file).
--    tests/postgres.rs (postgres_no_dangling_rows) checks that no batch outlives its partition or
--    object after concurrent commits, deletions, retention, confirmations and topic deletions.
--    Dropping a foreign key is a catalog update (ACCESS EXCLUSIVE on batches, partitions and
--    objects for its duration, under the migration's lock_timeout).
-- 2. The index batches_object goes (migration 10, DROP INDEX CONCURRENTLY): no query reads batches
--    by object (reads join objects by its primary key, from batches).
-- 3. commit_file inserts the object row unmarked and sets live_bytes at the end: when batches were
--    appended no indexed column changes (objects_marked covers marked_for_deletion_at), so the
--    update is HOT; when nothing was appended the row is marked, as before. Nobody sees the row
--    between the two (same transaction). Otherwise the body is migration 7's: same signature,
--    same results, same locks in the same order, the commit point at the same place.
-- 4. The new producer windows are built by one projection per producer (window entry k -> array
--    element k) instead of a sub-select unnesting and aggregating each window.

ALTER TABLE batches DROP CONSTRAINT IF EXISTS batches_partition_id_fkey;
ALTER TABLE batches DROP CONSTRAINT IF EXISTS batches_object_id_fkey;

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
    s_tid        tid[];
    s_lso        bigint[];
    s_hwm        bigint[];
    s_bytes      bigint[];
    s_tt         smallint[];
    s_maxts      bigint[];
    -- Per batch: its slot (0 = unknown partition).
    b_slot       integer[];
BEGIN
    -- The key's lock, shared with fence_orphans (see check_commit_point).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_object_key, 0));
    INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners,
                         committed_at, marked_for_deletion_at)
    VALUES (p_object_key, p_uploader_broker_id, p_object_size, 0, p_owners, p_now, NULL)
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
        -- Nothing appended: the object is marked for deletion.
        UPDATE objects SET marked_for_deletion_at = p_now WHERE object_id = v_object_id;
        RETURN;
    END IF;

    -- Lock every touched partition, in (topic_id, partition) order (as in migration 2), and keep
    -- each locked row's ctid: the row stays where it is until this transaction ends (nobody else
    -- can update or delete it while it is locked), so the final UPDATE finds it without an index.
    WITH locked AS MATERIALIZED (
        SELECT l.*
        FROM (SELECT DISTINCT u.t, u.p FROM unnest(p_topic_ids, p_partitions) AS u(t, p)
              ORDER BY u.t, u.p) w
        CROSS JOIN LATERAL (
            SELECT pa.ctid AS tid, pa.partition_id, pa.topic_id, pa.partition,
                   pa.log_start_offset, pa.high_watermark, pa.byte_size, tp.timestamp_type,
                   pa.max_timestamp
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
           array_agg(nb.tid ORDER BY nb.slot),
           array_agg(nb.log_start_offset ORDER BY nb.slot),
           array_agg(nb.high_watermark ORDER BY nb.slot),
           array_agg(nb.byte_size ORDER BY nb.slot),
           array_agg(nb.timestamp_type ORDER BY nb.slot),
           -- NULL (no batch yet) as the smallest bigint: greatest() gives the same results,
           -- and the array has no NULL (see arr below).
           array_agg(coalesce(nb.max_timestamp, -9223372036854775808) ORDER BY nb.slot),
           (SELECT array_agg(coalesce(n2.slot, 0) ORDER BY u.i)
            FROM unnest(p_topic_ids, p_partitions) WITH ORDINALITY AS u(t, p, i)
            LEFT JOIN numbered n2 ON n2.topic_id = u.t AND n2.partition = u.p)
    INTO s_pid, s_tid, s_lso, s_hwm, s_bytes, s_tt, s_maxts, b_slot
    FROM numbered nb;

    -- Every lock is held: the commit point.
    PERFORM check_commit_point(p_object_key, p_key_time_ms, p_max_commit_age_ms);

    IF s_pid IS NULL THEN
        -- No known partition: nothing is appended (the object is marked for deletion).
        UPDATE objects SET marked_for_deletion_at = p_now WHERE object_id = v_object_id;
        RETURN QUERY
        SELECT u.i::integer, 3::smallint, -1::bigint, -1::bigint, -1::bigint, false
        FROM generate_series(1, v_n) AS u(i);
        RETURN;
    END IF;

    RETURN QUERY
    WITH RECURSIVE
    -- What is decided without producer state, per batch in request order: 3 for an unknown
    -- partition, the caller's producer field error, 0 (append) for a batch without producer id;
    -- NULL when the producer rules decide.
    pre AS MATERIALIZED (
        SELECT u.i::integer AS i, u.slot, u.prod,
               CASE WHEN u.slot = 0 THEN 3 -- UNKNOWN_TOPIC_OR_PARTITION
                    WHEN coalesce(u.fe, 0) <> 0 THEN u.fe
                    WHEN u.prod < 0 THEN 0
               END::smallint AS code
        FROM unnest(b_slot, p_producer_ids, p_field_errors) WITH ORDINALITY AS u(slot, prod, fe, i)
        WHERE u.i <= v_n
    ),
    -- The batches the producer rules judge, grouped by (partition, producer), each group's in
    -- request order. Groups are independent of each other.
    grp AS MATERIALIZED (
        SELECT pre.slot, pre.prod, array_agg(pre.i ORDER BY pre.i) AS idx
        FROM pre
        WHERE pre.code IS NULL
        GROUP BY pre.slot, pre.prod
    ),
    -- Kafka's producer rules, one step per batch of each group, every group advancing in the same
    -- step (a commit whose producers send one batch per partition takes one step). Row r of a
    -- group is its state after its first r batches and the verdict of batch r: 0 append, -2
    -- duplicate, 45 OUT_OF_ORDER_SEQUENCE_NUMBER, 47 INVALID_PRODUCER_EPOCH. Row 0 is the stored
    -- state, read with one probe of the primary key per group (OFFSET 0 keeps the sub-select a
    -- parameterized nested loop whatever the statistics); producer_state is only written under
    -- the partition's row lock, which is held, so the rows and their ctids are stable. The window
    -- holds the last 5 appended batches: sequences, and a reference to each (-k: the k-th batch of
    -- the stored window, whose offsets and time st_bo/st_lo/st_la hold; i: batch i of this
    -- request, resolved once offsets are assigned).
    f (slot, prod, tid, st_bo, st_lo, st_la, r, n, idx, i, has, ep, w_bs, w_ls, w_ref,
       verdict, dup_ref, dup_bo, dup_la, appended) AS (
        SELECT grp.slot, grp.prod, s.tid, s.base_offsets, s.last_offsets, s.log_append_times,
               0, cardinality(grp.idx), grp.idx, NULL::integer,
               s.producer_epoch IS NOT NULL, s.producer_epoch, s.base_sequences,
               s.last_sequences,
               ('{-1,-2,-3,-4,-5}'::integer[])[1:coalesce(cardinality(s.base_sequences), 0)],
               NULL::smallint, NULL::integer, NULL::bigint, NULL::bigint, false
        FROM grp
        LEFT JOIN LATERAL (
            SELECT ps.ctid AS tid, ps.producer_epoch, ps.base_sequences, ps.last_sequences,
                   ps.base_offsets, ps.last_offsets, ps.log_append_times
            FROM producer_state ps
            WHERE ps.partition_id = s_pid[grp.slot] AND ps.producer_id = grp.prod
            OFFSET 0
        ) s ON true
        UNION ALL
        SELECT f.slot, f.prod, f.tid, f.st_bo, f.st_lo, f.st_la, f.r + 1, f.n, f.idx, x.i,
               f.has OR x.verdict = 0,
               CASE WHEN x.verdict = 0 THEN x.e ELSE f.ep END,
               CASE WHEN x.verdict <> 0 THEN f.w_bs
                    WHEN x.same THEN (f.w_bs || x.s)[greatest(cardinality(f.w_bs) - 3, 1):]
                    ELSE ARRAY[x.s] END,
               CASE WHEN x.verdict <> 0 THEN f.w_ls
                    WHEN x.same THEN (f.w_ls || x.l)[greatest(cardinality(f.w_ls) - 3, 1):]
                    ELSE ARRAY[x.l] END,
               CASE WHEN x.verdict <> 0 THEN f.w_ref
                    WHEN x.same THEN (f.w_ref || x.i)[greatest(cardinality(f.w_ref) - 3, 1):]
                    ELSE ARRAY[x.i] END,
               x.verdict, x.dup_ref,
               CASE WHEN x.dup_ref < 0 THEN f.st_bo[-x.dup_ref] END,
               CASE WHEN x.dup_ref < 0 THEN f.st_la[-x.dup_ref] END,
               f.appended OR x.verdict = 0
        FROM f
        CROSS JOIN LATERAL (
            SELECT d.i, d.e, d.s, d.l, d.same,
                   CASE WHEN NOT f.has THEN 0
                        WHEN d.dup > 0 THEN -2
                        WHEN d.e < f.ep THEN 47
                        WHEN d.e > f.ep THEN CASE WHEN d.s = 0 THEN 0 ELSE 45 END
                        WHEN cardinality(f.w_ls) > 0
                             AND NOT (d.s::bigint = f.w_ls[cardinality(f.w_ls)]::bigint + 1
                                      OR (d.s = 0 AND f.w_ls[cardinality(f.w_ls)] = 2147483647))
                             THEN 45
                        ELSE 0
                   END::smallint AS verdict,
                   f.w_ref[d.dup] AS dup_ref
            FROM (
                -- dup: the first window entry with the same sequences (the window holds at
                -- most 5; a subscript past its end is NULL and matches nothing).
                SELECT c.i, c.e, c.s, c.l, f.has AND c.e = f.ep AS same,
                       CASE WHEN NOT (f.has AND c.e = f.ep) THEN NULL
                            WHEN f.w_bs[1] = c.s AND f.w_ls[1] = c.l THEN 1
                            WHEN f.w_bs[2] = c.s AND f.w_ls[2] = c.l THEN 2
                            WHEN f.w_bs[3] = c.s AND f.w_ls[3] = c.l THEN 3
                            WHEN f.w_bs[4] = c.s AND f.w_ls[4] = c.l THEN 4
                            WHEN f.w_bs[5] = c.s AND f.w_ls[5] = c.l THEN 5
                       END AS dup
                FROM (SELECT f.idx[f.r + 1] AS i, p_producer_epochs[f.idx[f.r + 1]] AS e,
                             p_base_sequences[f.idx[f.r + 1]] AS s,
                             p_last_sequences[f.idx[f.r + 1]] AS l) c
                OFFSET 0
            ) d
            OFFSET 0
        ) x
        WHERE f.r < f.n
    ),
    -- Every batch's verdict, exactly once (the batches judged by the rules are those not decided
    -- in pre); a duplicate's original: stored (dup_bo, dup_la) or batch dup_ref of this request.
    vv AS (
        SELECT pre.i, pre.code, NULL::integer AS dup_ref, NULL::bigint AS dup_bo,
               NULL::bigint AS dup_la
        FROM pre
        WHERE pre.code IS NOT NULL
        UNION ALL
        SELECT f.i, f.verdict, f.dup_ref, f.dup_bo, f.dup_la
        FROM f
        WHERE f.r > 0
    ),
    -- Appended batches get offsets: the partition's high watermark plus the records of the
    -- earlier appended batches of the same partition in this request; and the partition's
    -- running max of the effective max timestamps, this batch included.
    o AS MATERIALIZED (
        SELECT vv.i, vv.code, vv.dup_ref, vv.dup_bo, vv.dup_la, b_slot[vv.i] AS slot,
               p_record_counts[vv.i] AS rc,
               CASE WHEN vv.code = 0 THEN
                   s_hwm[b_slot[vv.i]]
                   + sum(CASE WHEN vv.code = 0 THEN p_record_counts[vv.i] ELSE 0 END) OVER w
                   - p_record_counts[vv.i]
               END AS base,
               CASE WHEN vv.code = 0 THEN
                   greatest(s_maxts[b_slot[vv.i]],
                            max(CASE WHEN vv.code <> 0 THEN NULL
                                     WHEN s_tt[b_slot[vv.i]] = 1 THEN p_now
                                     ELSE p_max_timestamps[vv.i] END) OVER w)
               END AS so_far,
               CASE WHEN vv.code = 0 AND s_tt[b_slot[vv.i]] = 1 THEN p_now ELSE -1 END AS lat
        FROM vv
        WINDOW w AS (PARTITION BY b_slot[vv.i] ORDER BY vv.i ROWS UNBOUNDED PRECEDING)
    ),
    -- Base offsets and log append times by batch index (-1 unless appended), to resolve
    -- references to batches of this request. No NULL in them: an element of an array with NULLs
    -- is found by counting the elements before it (O(n)), of one without by its position.
    arr AS MATERIALIZED (
        SELECT array_agg(coalesce(o.base, -1) ORDER BY o.i) AS base,
               array_agg(o.lat ORDER BY o.i) AS lat
        FROM o
    ),
    ins AS (
        INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset,
                             byte_size, base_timestamp, max_timestamp, timestamp_type,
                             log_append_time, producer_id, producer_epoch, base_sequence,
                             last_sequence, max_timestamp_so_far)
        SELECT s_pid[o.slot], o.base + o.rc - 1, o.base, v_object_id, p_byte_offsets[o.i],
               p_byte_sizes[o.i], p_base_timestamps[o.i], p_max_timestamps[o.i], s_tt[o.slot],
               o.lat, p_producer_ids[o.i], p_producer_epochs[o.i], p_base_sequences[o.i],
               p_last_sequences[o.i], o.so_far
        FROM o
        WHERE o.code = 0
    ),
    pg AS MATERIALIZED (
        SELECT o.slot,
               s_hwm[o.slot] + sum(o.rc) AS hwm,
               s_bytes[o.slot] + sum(p_byte_sizes[o.i])::bigint AS bytes,
               sum(p_byte_sizes[o.i])::bigint AS appended,
               max(o.so_far) AS maxts
        FROM o
        WHERE o.code = 0
        GROUP BY o.slot
    ),
    upd AS (
        UPDATE partitions pa
        SET high_watermark = pg.hwm, byte_size = pg.bytes, max_timestamp = pg.maxts
        FROM pg
        WHERE pa.ctid = s_tid[pg.slot] AND pa.partition_id = s_pid[pg.slot]
    ),
    -- The object's live bytes; marked for deletion when nothing was appended. In the common case
    -- only live_bytes changes (no indexed column): a HOT update on the row's own page.
    obj AS (
        UPDATE objects
        SET live_bytes = coalesce((SELECT sum(pg.appended)::bigint FROM pg), 0),
            marked_for_deletion_at = CASE WHEN EXISTS (SELECT 1 FROM pg) THEN NULL ELSE p_now END
        WHERE object_id = v_object_id
    ),
    -- The new window of every producer that appended a batch (the others keep theirs, and their
    -- last_append_ms), with the offsets and times of its batches resolved.
    fin AS MATERIALIZED (
        -- Element k of each array resolves window entry k (at most 5); past the window's end the
        -- reference is NULL, so is the element, and array_remove drops it (no value is NULL: arr
        -- and the stored arrays hold none), leaving an array without a NULL bitmap. One
        -- projection per producer, no sub-select.
        SELECT f.slot, f.prod, f.tid, f.ep, f.w_bs, f.w_ls,
               array_remove(ARRAY[
                   CASE WHEN f.w_ref[1] < 0 THEN f.st_bo[-f.w_ref[1]] ELSE arr.base[f.w_ref[1]] END,
                   CASE WHEN f.w_ref[2] < 0 THEN f.st_bo[-f.w_ref[2]] ELSE arr.base[f.w_ref[2]] END,
                   CASE WHEN f.w_ref[3] < 0 THEN f.st_bo[-f.w_ref[3]] ELSE arr.base[f.w_ref[3]] END,
                   CASE WHEN f.w_ref[4] < 0 THEN f.st_bo[-f.w_ref[4]] ELSE arr.base[f.w_ref[4]] END,
                   CASE WHEN f.w_ref[5] < 0 THEN f.st_bo[-f.w_ref[5]] ELSE arr.base[f.w_ref[5]] END], NULL) AS bo,
               array_remove(ARRAY[
                   CASE WHEN f.w_ref[1] < 0 THEN f.st_lo[-f.w_ref[1]]
                        ELSE arr.base[f.w_ref[1]] + p_record_counts[f.w_ref[1]] - 1 END,
                   CASE WHEN f.w_ref[2] < 0 THEN f.st_lo[-f.w_ref[2]]
                        ELSE arr.base[f.w_ref[2]] + p_record_counts[f.w_ref[2]] - 1 END,
                   CASE WHEN f.w_ref[3] < 0 THEN f.st_lo[-f.w_ref[3]]
                        ELSE arr.base[f.w_ref[3]] + p_record_counts[f.w_ref[3]] - 1 END,
                   CASE WHEN f.w_ref[4] < 0 THEN f.st_lo[-f.w_ref[4]]
                        ELSE arr.base[f.w_ref[4]] + p_record_counts[f.w_ref[4]] - 1 END,
                   CASE WHEN f.w_ref[5] < 0 THEN f.st_lo[-f.w_ref[5]]
                        ELSE arr.base[f.w_ref[5]] + p_record_counts[f.w_ref[5]] - 1 END], NULL) AS lo,
               array_remove(ARRAY[
                   CASE WHEN f.w_ref[1] < 0 THEN f.st_la[-f.w_ref[1]] ELSE arr.lat[f.w_ref[1]] END,
                   CASE WHEN f.w_ref[2] < 0 THEN f.st_la[-f.w_ref[2]] ELSE arr.lat[f.w_ref[2]] END,
                   CASE WHEN f.w_ref[3] < 0 THEN f.st_la[-f.w_ref[3]] ELSE arr.lat[f.w_ref[3]] END,
                   CASE WHEN f.w_ref[4] < 0 THEN f.st_la[-f.w_ref[4]] ELSE arr.lat[f.w_ref[4]] END,
                   CASE WHEN f.w_ref[5] < 0 THEN f.st_la[-f.w_ref[5]] ELSE arr.lat[f.w_ref[5]] END], NULL) AS la
        FROM f
        CROSS JOIN arr
        WHERE f.r = f.n AND f.appended
    ),
    -- Known producers: their row, found by its ctid. New ones: a plain insert (no other commit
    -- can insert a state of a partition whose row lock this one holds).
    ps_upd AS (
        UPDATE producer_state ps
        SET producer_epoch = fin.ep, base_sequences = fin.w_bs, last_sequences = fin.w_ls,
            base_offsets = fin.bo, last_offsets = fin.lo, log_append_times = fin.la,
            last_append_ms = p_now
        FROM fin
        WHERE fin.tid IS NOT NULL AND ps.ctid = fin.tid
          AND ps.partition_id = s_pid[fin.slot] AND ps.producer_id = fin.prod
    ),
    ps_ins AS (
        INSERT INTO producer_state (partition_id, producer_id, producer_epoch, base_sequences,
                                    last_sequences, base_offsets, last_offsets,
                                    log_append_times, last_append_ms)
        SELECT s_pid[fin.slot], fin.prod, fin.ep, fin.w_bs, fin.w_ls, fin.bo, fin.lo, fin.la,
               p_now
        FROM fin
        WHERE fin.tid IS NULL
    )
    SELECT o.i,
           CASE WHEN o.code = -2 THEN 0 ELSE o.code END::smallint,
           CASE WHEN o.code = 0 THEN o.base
                WHEN o.code = -2 THEN coalesce(o.dup_bo, arr.base[o.dup_ref])
                ELSE -1 END,
           CASE WHEN o.code = 0 THEN o.lat
                WHEN o.code = -2 THEN coalesce(o.dup_la, arr.lat[o.dup_ref])
                ELSE -1 END,
           CASE WHEN o.code IN (0, -2) THEN s_lso[o.slot] ELSE -1 END,
           o.code = -2
    FROM o
    CROSS JOIN arr
    ORDER BY o.i;
END;
$fn$;
