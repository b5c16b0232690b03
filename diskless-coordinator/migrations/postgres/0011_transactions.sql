-- Migration 11 (issue #14): transactions (KIP-98, the partition leader's part). The rules are the
-- reference model's (diskless-testkit, coordinator/model.rs, "Transactions"); docs/transactions.md
-- §2.3, §2.4, §2.6, §2.8.
--
-- Only catalog updates and new objects: dropping a NOT NULL and adding columns with constant
-- defaults rewrite nothing (PostgreSQL 11+), the functions are new or replaced bodies. The partial
-- index of open transactions is built CONCURRENTLY by migration 12.
--
-- 1. Transaction markers are rows of batches without an object (object_id NULL): control_type
--    -1 for a data batch, 0 ABORT, 1 COMMIT, with the marker's coordinator epoch. A marker row
--    takes one offset, 78 bytes (counted in partitions.byte_size like Kafka's log, so
--    retention.bytes sees it), the coordinator's now as timestamps. Readers LEFT JOIN objects.
--    Integrity (migration 9's rules): a batch row has an object_id exactly when it is a data
--    batch, whose object row it inserted in the same transaction.
-- 2. producer_state gains the producer's transaction in the partition: txn_first_offset (NULL:
--    none open), txn_start_ms, the coordinator epoch of its last marker, the last ended
--    transaction (largest txn_seq of a marker written) and the offset of its last marker.
-- 3. The last stable offset is not stored: it is the smallest txn_first_offset of the partition's
--    open transactions (migration 12's partial index, one probe), raised to the log start offset,
--    else the high watermark. Nothing derived to keep in step; a commit or marker writes only the
--    producer's row it writes anyway.
-- 4. aborted_txns: one row per ABORT marker that ended an open transaction (Kafka's transaction
--    index), with the last stable offset right after it (for read_committed fetches' stop rule).
--    Written under the partition's row lock like batches; DeleteRecords and retention delete the
--    rows whose marker is below the new log start, topic deletion all of the topic's.
-- 5. commit_file gets a new signature with the per-batch transactional flags and verification
--    numbers (txn_seq, NULL: unverified) and decides the transaction rules in the same statement
--    as the producer rules (the recursive CTE f carries the producer's transaction state). The
--    previous signature calls it with no transactional batch, so brokers not yet upgraded keep
--    committing (their plain batches now obey the rule that a producer with an open transaction
--    cannot write outside it, which is right whatever the broker's version).
-- 6. write_txn_markers: markers of many partitions in one call, partitions locked FOR UPDATE in
--    (topic_id, partition) order like commit_file, so commits and markers cannot deadlock.

ALTER TABLE batches ALTER COLUMN object_id DROP NOT NULL;
ALTER TABLE batches ADD COLUMN control_type smallint NOT NULL DEFAULT -1;
ALTER TABLE batches ADD COLUMN coordinator_epoch integer NOT NULL DEFAULT -1;

ALTER TABLE producer_state ADD COLUMN txn_first_offset bigint;
ALTER TABLE producer_state ADD COLUMN txn_start_ms bigint NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN coordinator_epoch integer NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN last_ended_txn bigint NOT NULL DEFAULT -1;
ALTER TABLE producer_state ADD COLUMN last_marker_offset bigint NOT NULL DEFAULT -1;

CREATE TABLE aborted_txns (
    partition_id bigint NOT NULL REFERENCES partitions (partition_id),
    -- The ABORT marker's offset.
    last_offset  bigint NOT NULL,
    first_offset bigint NOT NULL,
    producer_id  bigint NOT NULL,
    -- The last stable offset right after the marker: the first offset of another producer's open
    -- transaction, else the marker's offset + 1 (monotone in last_offset).
    lso_at_abort bigint NOT NULL,
    PRIMARY KEY (partition_id, last_offset)
);

-- commit_file with transactions: migration 9's body (same locks in the same order, the commit
-- point at the same place) with the transaction rules in the recursive CTE f and the producer's
-- transaction columns written with its window.
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
    p_field_errors       smallint[],
    p_transactional      boolean[],
    p_txn_seqs           bigint[]
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
    -- partition, the caller's producer field error, 87 (INVALID_RECORD) for a transactional batch
    -- without producer id, 0 (append) for another batch without producer id; NULL when the
    -- producer rules decide.
    pre AS MATERIALIZED (
        SELECT u.i::integer AS i, u.slot, u.prod,
               CASE WHEN u.slot = 0 THEN 3 -- UNKNOWN_TOPIC_OR_PARTITION
                    WHEN coalesce(u.fe, 0) <> 0 THEN u.fe
                    WHEN u.prod < 0 THEN CASE WHEN coalesce(u.tx, false) THEN 87 ELSE 0 END
               END::smallint AS code
        FROM unnest(b_slot, p_producer_ids, p_field_errors, p_transactional)
             WITH ORDINALITY AS u(slot, prod, fe, tx, i)
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
    --
    -- Then the transaction rules (migration 11), on a batch the producer rules append, with the
    -- group's transaction state: tx_open (a transaction of the producer is open in the
    -- partition), tx_first (its stored first offset) or tx_i (the batch of this request that
    -- opened it), tx_start (when it opened), le (the last ended transaction, which only markers
    -- change). A plain batch while a transaction is open: 48 (INVALID_TXN_STATE); a
    -- transactional one continues an open transaction of the same epoch, is 48 with another
    -- epoch, and with none open opens one when verified (txn_seq) for a transaction newer than
    -- le, else 48.
    f (slot, prod, tid, st_bo, st_lo, st_la, r, n, idx, i, has, ep, w_bs, w_ls, w_ref,
       verdict, dup_ref, dup_bo, dup_la, appended, tx_open, tx_first, tx_i, tx_start, le) AS (
        SELECT grp.slot, grp.prod, s.tid, s.base_offsets, s.last_offsets, s.log_append_times,
               0, cardinality(grp.idx), grp.idx, NULL::integer,
               s.producer_epoch IS NOT NULL, s.producer_epoch, s.base_sequences,
               s.last_sequences,
               ('{-1,-2,-3,-4,-5}'::integer[])[1:coalesce(cardinality(s.base_sequences), 0)],
               NULL::smallint, NULL::integer, NULL::bigint, NULL::bigint, false,
               s.txn_first_offset IS NOT NULL, s.txn_first_offset, NULL::integer,
               coalesce(s.txn_start_ms, -1), coalesce(s.last_ended_txn, -1)
        FROM grp
        LEFT JOIN LATERAL (
            SELECT ps.ctid AS tid, ps.producer_epoch, ps.base_sequences, ps.last_sequences,
                   ps.base_offsets, ps.last_offsets, ps.log_append_times, ps.txn_first_offset,
                   ps.txn_start_ms, ps.last_ended_txn
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
               f.appended OR x.verdict = 0,
               f.tx_open OR x.opens,
               f.tx_first,
               CASE WHEN x.opens THEN x.i ELSE f.tx_i END,
               CASE WHEN x.opens THEN p_now ELSE f.tx_start END,
               f.le
        FROM f
        CROSS JOIN LATERAL (
            -- The transaction rules on the producer rules' verdict pv (see above).
            SELECT y.i, y.e, y.s, y.l, y.same, y.dup_ref,
                   CASE WHEN y.pv <> 0 THEN y.pv
                        WHEN NOT y.t THEN CASE WHEN f.tx_open THEN 48 ELSE 0 END
                        WHEN f.tx_open THEN CASE WHEN y.e = f.ep THEN 0 ELSE 48 END
                        WHEN y.q > f.le THEN 0
                        ELSE 48
                   END::smallint AS verdict,
                   (y.pv = 0 AND y.t AND NOT f.tx_open AND coalesce(y.q > f.le, false)) AS opens
            FROM (
                SELECT d.i, d.e, d.s, d.l, d.same, d.t, d.q,
                       CASE WHEN NOT f.has THEN 0
                            WHEN d.dup > 0 THEN -2
                            WHEN d.e < f.ep THEN 47
                            WHEN d.e > f.ep THEN CASE WHEN d.s = 0 THEN 0 ELSE 45 END
                            WHEN cardinality(f.w_ls) > 0
                                 AND NOT (d.s::bigint = f.w_ls[cardinality(f.w_ls)]::bigint + 1
                                          OR (d.s = 0 AND f.w_ls[cardinality(f.w_ls)] = 2147483647))
                                 THEN 45
                            ELSE 0
                       END::smallint AS pv,
                       f.w_ref[d.dup] AS dup_ref
                FROM (
                    -- dup: the first window entry with the same sequences (the window holds at
                    -- most 5; a subscript past its end is NULL and matches nothing).
                    SELECT c.i, c.e, c.s, c.l, c.t, c.q, f.has AND c.e = f.ep AS same,
                           CASE WHEN NOT (f.has AND c.e = f.ep) THEN NULL
                                WHEN f.w_bs[1] = c.s AND f.w_ls[1] = c.l THEN 1
                                WHEN f.w_bs[2] = c.s AND f.w_ls[2] = c.l THEN 2
                                WHEN f.w_bs[3] = c.s AND f.w_ls[3] = c.l THEN 3
                                WHEN f.w_bs[4] = c.s AND f.w_ls[4] = c.l THEN 4
                                WHEN f.w_bs[5] = c.s AND f.w_ls[5] = c.l THEN 5
                           END AS dup
                    FROM (SELECT f.idx[f.r + 1] AS i, p_producer_epochs[f.idx[f.r + 1]] AS e,
                                 p_base_sequences[f.idx[f.r + 1]] AS s,
                                 p_last_sequences[f.idx[f.r + 1]] AS l,
                                 coalesce(p_transactional[f.idx[f.r + 1]], false) AS t,
                                 p_txn_seqs[f.idx[f.r + 1]] AS q) c
                    OFFSET 0
                ) d
                OFFSET 0
            ) y
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
               -- The open transaction's first offset (stored, or the batch that opened it).
               coalesce(f.tx_first, arr.base[f.tx_i]) AS txf, f.tx_start AS txs,
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
            last_append_ms = p_now, txn_first_offset = fin.txf, txn_start_ms = fin.txs
        FROM fin
        WHERE fin.tid IS NOT NULL AND ps.ctid = fin.tid
          AND ps.partition_id = s_pid[fin.slot] AND ps.producer_id = fin.prod
    ),
    ps_ins AS (
        INSERT INTO producer_state (partition_id, producer_id, producer_epoch, base_sequences,
                                    last_sequences, base_offsets, last_offsets,
                                    log_append_times, last_append_ms, txn_first_offset,
                                    txn_start_ms)
        SELECT s_pid[fin.slot], fin.prod, fin.ep, fin.w_bs, fin.w_ls, fin.bo, fin.lo, fin.la,
               p_now, fin.txf, fin.txs
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

-- The previous signature (migration 9's), for brokers not yet upgraded: no transactional batch.
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
LANGUAGE sql
AS $fn$
    SELECT * FROM commit_file(p_object_key, p_uploader_broker_id, p_object_size, p_owners, p_now,
        p_topic_ids, p_partitions, p_byte_offsets, p_byte_sizes, p_record_counts,
        p_base_timestamps, p_max_timestamps, p_producer_ids, p_producer_epochs, p_base_sequences,
        p_last_sequences, p_key_time_ms, p_max_commit_age_ms, p_field_errors, NULL::boolean[],
        NULL::bigint[])
$fn$;

-- write_txn_markers: appends transaction markers (KIP-98 control batches), one per element of the
-- arrays, in request order, in one call (one implicit transaction). Returns one row per marker
-- (r_index 1..n): its error code, its offset (the earlier marker's for a duplicate, -1 on error)
-- and whether it was a duplicate. p_now is the coordinator's clock (the markers' timestamps, the
-- producers' last append time).
--
-- Per marker, as the reference model: 3 (UNKNOWN_TOPIC_OR_PARTITION) for an unknown partition; a
-- marker with a txn_seq not above the producer's last ended transaction is a duplicate answered
-- with its last marker's offset; then an older producer epoch is 47 (INVALID_PRODUCER_EPOCH) and
-- an older coordinator epoch 52 (TRANSACTION_COORDINATOR_FENCED); else the marker takes the high
-- watermark, the producer's state is created or updated (a new epoch clears its batch window) and
-- its open transaction ends; an ABORT of an open transaction is recorded in aborted_txns. Markers
-- of one call for the same partition see each other's effects. No deadline or fence (no object).
CREATE FUNCTION write_txn_markers(
    p_now                bigint,
    p_topic_ids          uuid[],
    p_partitions         integer[],
    p_producer_ids       bigint[],
    p_producer_epochs    smallint[],
    p_coordinator_epochs integer[],
    p_commits            boolean[],
    p_txn_seqs           bigint[]
)
RETURNS TABLE (
    r_index      integer,
    r_error_code smallint,
    r_offset     bigint,
    r_duplicate  boolean
)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_n        integer := coalesce(array_length(p_topic_ids, 1), 0);
    -- Per locked partition ("slot"), in lock order: its id and topic's timestamp type.
    s_pid      bigint[];
    s_tt       smallint[];
    -- Per marker: its slot (0 = unknown partition).
    b_slot     integer[];
    v_slot     integer;
    v_pid      bigint;
    v_prod     bigint;
    v_epoch    smallint;
    v_ce       integer;
    v_seq      bigint;
    v_off      bigint;
    v_others   bigint;
    v_found    boolean;
    v_st_epoch smallint;
    v_st_ce    integer;
    v_st_ended bigint;
    v_st_last  bigint;
    v_st_first bigint;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- Lock every touched partition, in (topic_id, partition) order, as commit_file does.
    WITH locked AS MATERIALIZED (
        SELECT l.*
        FROM (SELECT DISTINCT u.t, u.p FROM unnest(p_topic_ids, p_partitions) AS u(t, p)
              ORDER BY u.t, u.p) w
        CROSS JOIN LATERAL (
            SELECT pa.partition_id, pa.topic_id, pa.partition, tp.timestamp_type
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
           array_agg(nb.timestamp_type ORDER BY nb.slot),
           (SELECT array_agg(coalesce(n2.slot, 0) ORDER BY u.i)
            FROM unnest(p_topic_ids, p_partitions) WITH ORDINALITY AS u(t, p, i)
            LEFT JOIN numbered n2 ON n2.topic_id = u.t AND n2.partition = u.p)
    INTO s_pid, s_tt, b_slot
    FROM numbered nb;

    FOR i IN 1 .. v_n LOOP
        r_index := i;
        v_slot := coalesce(b_slot[i], 0);
        IF v_slot = 0 THEN
            r_error_code := 3; -- UNKNOWN_TOPIC_OR_PARTITION
            r_offset := -1;
            r_duplicate := false;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_pid := s_pid[v_slot];
        v_prod := p_producer_ids[i];
        v_epoch := p_producer_epochs[i];
        v_ce := p_coordinator_epochs[i];
        v_seq := p_txn_seqs[i];
        SELECT ps.producer_epoch, ps.coordinator_epoch, ps.last_ended_txn, ps.last_marker_offset,
               ps.txn_first_offset
        INTO v_st_epoch, v_st_ce, v_st_ended, v_st_last, v_st_first
        FROM producer_state ps
        WHERE ps.partition_id = v_pid AND ps.producer_id = v_prod;
        v_found := FOUND;
        IF v_found THEN
            IF v_seq IS NOT NULL AND v_seq <= v_st_ended THEN
                -- The transaction already ended here: the earlier marker's offset.
                r_error_code := 0;
                r_offset := v_st_last;
                r_duplicate := true;
                RETURN NEXT;
                CONTINUE;
            END IF;
            IF v_epoch < v_st_epoch THEN
                r_error_code := 47; -- INVALID_PRODUCER_EPOCH
                r_offset := -1;
                r_duplicate := false;
                RETURN NEXT;
                CONTINUE;
            END IF;
            IF v_ce < v_st_ce THEN
                r_error_code := 52; -- TRANSACTION_COORDINATOR_FENCED
                r_offset := -1;
                r_duplicate := false;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;

        -- The marker row at the high watermark (the partition row is locked: this statement
        -- sees what earlier markers of this call wrote).
        UPDATE partitions pa
        SET high_watermark = pa.high_watermark + 1,
            byte_size = pa.byte_size + 78,
            max_timestamp = greatest(coalesce(pa.max_timestamp, p_now), p_now)
        WHERE pa.partition_id = v_pid
        RETURNING pa.high_watermark - 1 INTO v_off;
        INSERT INTO batches (partition_id, last_offset, base_offset, object_id, byte_offset,
                             byte_size, base_timestamp, max_timestamp, timestamp_type,
                             log_append_time, producer_id, producer_epoch, base_sequence,
                             last_sequence, max_timestamp_so_far, control_type,
                             coordinator_epoch)
        SELECT v_pid, v_off, v_off, NULL, 0, 78, p_now, p_now, s_tt[v_slot],
               CASE WHEN s_tt[v_slot] = 1 THEN p_now ELSE -1 END, v_prod, v_epoch, -1, -1,
               pa.max_timestamp, CASE WHEN p_commits[i] THEN 1 ELSE 0 END, v_ce
        FROM partitions pa
        WHERE pa.partition_id = v_pid;

        IF v_found THEN
            IF v_st_first IS NOT NULL AND NOT p_commits[i] THEN
                -- The last stable offset right after this abort: the first offset of another
                -- producer's open transaction, else the marker's offset + 1.
                SELECT min(ps.txn_first_offset) INTO v_others
                FROM producer_state ps
                WHERE ps.partition_id = v_pid AND ps.txn_first_offset IS NOT NULL
                  AND ps.producer_id <> v_prod;
                INSERT INTO aborted_txns (partition_id, last_offset, first_offset, producer_id,
                                          lso_at_abort)
                VALUES (v_pid, v_off, v_st_first, v_prod, coalesce(v_others, v_off + 1));
            END IF;
            UPDATE producer_state ps
            SET producer_epoch = v_epoch,
                base_sequences = CASE WHEN ps.producer_epoch = v_epoch THEN ps.base_sequences
                                      ELSE '{}' END,
                last_sequences = CASE WHEN ps.producer_epoch = v_epoch THEN ps.last_sequences
                                      ELSE '{}' END,
                base_offsets = CASE WHEN ps.producer_epoch = v_epoch THEN ps.base_offsets
                                    ELSE '{}' END,
                last_offsets = CASE WHEN ps.producer_epoch = v_epoch THEN ps.last_offsets
                                    ELSE '{}' END,
                log_append_times = CASE WHEN ps.producer_epoch = v_epoch THEN ps.log_append_times
                                        ELSE '{}' END,
                last_append_ms = p_now,
                coordinator_epoch = v_ce,
                last_ended_txn = greatest(ps.last_ended_txn, coalesce(v_seq, -1)),
                last_marker_offset = v_off,
                txn_first_offset = NULL,
                txn_start_ms = -1
            WHERE ps.partition_id = v_pid AND ps.producer_id = v_prod;
        ELSE
            INSERT INTO producer_state (partition_id, producer_id, producer_epoch, base_sequences,
                                        last_sequences, base_offsets, last_offsets,
                                        log_append_times, last_append_ms, txn_first_offset,
                                        txn_start_ms, coordinator_epoch, last_ended_txn,
                                        last_marker_offset)
            VALUES (v_pid, v_prod, v_epoch, '{}', '{}', '{}', '{}', '{}', p_now, NULL, -1, v_ce,
                    greatest(coalesce(v_seq, -1), -1), v_off);
        END IF;
        r_error_code := 0;
        r_offset := v_off;
        r_duplicate := false;
        RETURN NEXT;
    END LOOP;
END;
$fn$;
