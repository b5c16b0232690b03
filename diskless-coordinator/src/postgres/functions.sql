-- The server-side functions of the PostgreSQL coordinator, each in its current version: the one
-- place they are defined. Tables, columns, indexes, triggers and data are schema, and live in the
-- migrations (migrations/postgres/); this file holds the functions, as CREATE OR REPLACE FUNCTION
-- statements.
--
-- The migrator (src/postgres/migrate/functions.rs) runs this whole file after the pending
-- migrations, on every connect and every explicit migrate, in one transaction, under the
-- migrators' advisory lock of the schema, with search_path set to the coordinator's schema (every
-- name below is created in and resolved against it). Re-running the same text changes nothing; a
-- new text replaces the functions: a call already running keeps the body it started with, the
-- next one uses the new one. A build never replaces a newer build's functions (see REVISION there).
--
-- Rules for editing this file (it runs against live clusters):
-- - With every change, raise REVISION and set REVISION_CHECKSUM (src/postgres/migrate/
--   functions.rs; its unit test says what to write).
-- - Never drop a function or change a signature that a previous build calls: brokers of the
--   previous version keep calling it during a rolling upgrade (and after a rollback). Give the new
--   behaviour a new signature and keep the old one as a wrapper calling it (commit_file below has
--   two). CREATE OR REPLACE cannot change a function's result type either.
-- - A LANGUAGE sql function's body is checked when it is created: what it calls (functions,
--   tables) must exist by then, so callees come first in this file and tables in a migration.
-- - A new column or table a function needs comes from a migration (the migrations run first).
--   The previous revision of the functions serves calls until this file replaces it (moments
--   later, or after a long concurrent index build): the migration must not break it (new columns
--   nullable or with a default).
-- - Trigger functions live here too; their triggers are schema (objects_deleted_fence: migration
--   6, which also created its function then). A new trigger cannot come from a migration (on a
--   fresh schema its function does not exist yet while the migrations run): create it in this
--   file after its function, guarded by a look-up in pg_trigger, so that re-running the file
--   takes no lock.
-- - Migrations 1 to 13 still create the functions of their time (their text is recorded by
--   checksum in every schema they were applied to, so it never changes); this file replaces them.
--
-- Clocks: time columns and p_now are the coordinator's clock (ms since the Unix epoch); only the
-- commit deadline and fence expiry read the server's clock (clock_timestamp()).

-- -------------------------------------------------------------------------------------------------
-- The commit point: key times, the deadline, orphan fences

-- The UUID v7 time (ms) of a key's last path segment (after the last '/'), else NULL: exactly
-- diskless_coordinator::object_key_time_ms. The segment must be a UUID in one of the text forms the
-- uuid crate parses (32 hex digits; 8-4-4-4-12 hyphenated; hyphenated in braces; hyphenated after
-- 'urn:uuid:'; hex digits of either case), of version 7 (the 13th hex digit) and of the RFC 4122
-- variant (the 17th hex digit is 8, 9, a or b). The time is the first 48 bits.
CREATE OR REPLACE FUNCTION object_key_time_ms(p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT CASE WHEN h ~ '^[0-9a-fA-F]{12}7[0-9a-fA-F]{3}[89abAB][0-9a-fA-F]{15}$'
                THEN ('x' || lpad(substr(h, 1, 12), 16, '0'))::bit(64)::bigint
           END
    FROM (
        SELECT CASE
            WHEN s ~ '^[0-9a-fA-F]{32}$' THEN s
            WHEN s ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                THEN replace(s, '-', '')
            WHEN s ~ '^[{][0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}[}]$'
                THEN replace(substr(s, 2, 36), '-', '')
            WHEN s ~ '^urn:uuid:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                THEN replace(substr(s, 10), '-', '')
        END AS h
        FROM (SELECT regexp_replace(p_key, '^.*/', '') AS s) k
    ) u
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
CREATE OR REPLACE FUNCTION check_commit_point(p_key text, p_key_time_ms bigint, p_max_commit_age_ms bigint)
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

-- The key time below which a fence may be dropped, by the server's clock: fences are kept for
-- 2 x the largest max_commit_age any coordinator connected with, and at least p_min_retention_ms
-- (what the caller itself needs). NULL (nothing expires) if the settings row is missing.
CREATE OR REPLACE FUNCTION fence_expiry_before(p_min_retention_ms bigint) RETURNS bigint
LANGUAGE sql VOLATILE
AS $fn$
    SELECT greatest(
               floor(extract(epoch FROM clock_timestamp()) * 1000)
               - greatest(coalesce(p_min_retention_ms, 0)::numeric,
                          2 * s.max_commit_age_ms::numeric),
               -9223372036854775808::numeric
           )::bigint
    FROM coordinator_settings s
    WHERE s.id = 1
$fn$;

-- Drops up to p_limit fences whose key is older than fence_expiry_before(p_min_retention_ms),
-- oldest first: a commit of such a key is refused by every coordinator's deadline anyway. Returns
-- how many were dropped.
CREATE OR REPLACE FUNCTION expire_fences(p_min_retention_ms bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_before  bigint := fence_expiry_before(p_min_retention_ms);
    v_dropped bigint;
BEGIN
    WITH gone AS (
        DELETE FROM object_fences f
        WHERE f.object_key IN (SELECT e.object_key FROM object_fences e
                               WHERE e.key_time_ms < v_before
                               ORDER BY e.key_time_ms LIMIT p_limit)
        RETURNING 1
    )
    SELECT count(*) INTO v_dropped FROM gone;
    RETURN v_dropped;
END;
$fn$;

-- fence_orphans: drops up to p_expiry_batch expired fences (expire_fences: fences are kept for at
-- least p_fence_retention_ms and 2 x the stored max_commit_age, the larger wins), takes the
-- per-key locks of the requested keys with a time (in key order: concurrent calls cannot
-- deadlock), then fences every such key the coordinator does not know (an existing fence is kept)
-- and returns them once each, in request order.
CREATE OR REPLACE FUNCTION fence_orphans(
    p_keys               text[],
    p_key_times          bigint[],
    p_fence_retention_ms bigint,
    p_expiry_batch       integer
)
RETURNS TABLE (r_object_key text)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_key text;
BEGIN
    PERFORM expire_fences(p_fence_retention_ms, p_expiry_batch);
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

-- Every deleted object row leaves a fence for its key (when the key has a UUID v7 time), in the
-- deleting transaction: the function of the trigger objects_deleted_fence (AFTER DELETE ON
-- objects, FOR EACH STATEMENT, created by migration 6), so that a broker whose confirm_deleted is
-- a plain DELETE fences too. A fence that expiry would drop at once is not written: every
-- coordinator's deadline refuses that key already.
--
-- Why this serializes with commit_file without the key's advisory lock: commit_file first inserts
-- the object row (INSERT ... ON CONFLICT DO NOTHING on the object_key unique index). If the
-- deleting transaction is still in progress, that insert waits for it (a conflicting row whose
-- deletion is not yet committed); if the deletion commits, the insert succeeds and the commit's
-- later check_commit_point (a new statement, a new snapshot) sees this fence and refuses the
-- commit; if it rolls back, the row is still there and the commit reports the object as already
-- committed. A commit that inserted its row before the deletion began finds the row present and
-- applies nothing either. In no order does a commit append batches to a deleted object.
CREATE OR REPLACE FUNCTION fence_deleted_objects() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_before bigint := fence_expiry_before(0);
BEGIN
    INSERT INTO object_fences (object_key, key_time_ms)
    SELECT d.object_key, d.t
    FROM (SELECT g.object_key, object_key_time_ms(g.object_key) AS t FROM gone_objects g) d
    WHERE d.t IS NOT NULL AND (v_before IS NULL OR d.t >= v_before)
    ON CONFLICT (object_key) DO NOTHING;
    RETURN NULL;
END;
$fn$;

-- confirm_deleted: drops up to p_expiry_batch expired fences (so fences written by deletions stay
-- bounded even when no orphan collector runs), then forgets the given objects that are marked for
-- deletion (the trigger fences their keys). One transaction.
CREATE OR REPLACE FUNCTION confirm_deleted(p_keys text[], p_min_retention_ms bigint, p_expiry_batch integer)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM expire_fences(p_min_retention_ms, p_expiry_batch);
    DELETE FROM objects o
    WHERE o.marked_for_deletion_at IS NOT NULL AND o.object_key = ANY (p_keys);
END;
$fn$;

-- -------------------------------------------------------------------------------------------------
-- commit_file: the current signature and the previous ones

-- commit_file: registers a WAL object and appends its batches, in one statement (one round trip,
-- one implicit transaction). The batches come as parallel arrays, one element per batch, in
-- request order, with the key's UUID v7 time as diskless_coordinator::object_key_time_ms computes
-- it (NULL: none, never refused by the deadline), the coordinator's max_commit_age, the per-batch
-- producer field errors (producer_field_error's codes, NULL: none), the transactional flags and
-- the verification numbers (txn_seq, NULL: unverified). Returns one row per batch (batch_index
-- 1..n) with its Kafka error code, base offset, log append time, the partition's log start offset
-- and whether it was a duplicate; or a single row with batch_index = -1 when the object key was
-- already committed (nothing changed).
--
-- Locks, in the order every writer takes them: the key's advisory lock (shared with fence_orphans
-- and register_segment, see check_commit_point), the object row (inserted first: a concurrent
-- commit of the same key waits on the unique index), then the rows of all touched partitions FOR
-- UPDATE in (topic_id, partition) order, so concurrent commits, markers and registrations cannot
-- deadlock; only then the commit point (check_commit_point, against the server's clock). Offsets
-- are assigned under those locks (READ COMMITTED re-reads the newest row version after a wait).
-- The lock query is a nested loop over the sorted, distinct wanted pairs whose inner side (a
-- LATERAL sub-select with FOR UPDATE, never flattened) probes the unique index on both columns:
-- the only plan whatever the statistics, locking in outer order. Each locked row's ctid is kept:
-- a row locked FOR UPDATE (partitions), or protected by that lock (producer_state: every writer of
-- a partition's producer states holds the partition's row lock), cannot be updated or deleted by
-- another transaction until this one ends, and is updated here at most once, so the final
-- UPDATEs find their rows by TID (each still checks the row's key), never by a scan.
--
-- Producer rules (Kafka's ProducerStateManager / ProducerAppendInfo, batch by batch in request
-- order, for producer ids >= 0): no state -> append; same epoch and an exact (base, last) sequence
-- match among the last 5 appended batches -> duplicate (original offsets and log append time);
-- older epoch -> INVALID_PRODUCER_EPOCH (47); newer epoch -> append iff the base sequence is 0,
-- else OUT_OF_ORDER_SEQUENCE_NUMBER (45); same epoch -> append iff the base sequence follows the
-- last kept one (i32::MAX wraps to 0), else 45. Then the transaction rules (the reference model's,
-- docs/transactions.md) on what the producer rules append. Both are decided in set-based
-- statements: the judged batches are grouped by (partition, producer) and folded in a recursive
-- CTE in which every group advances one batch per step (one step when producers send one batch
-- per partition, as Kafka clients do). Offsets are assigned afterwards (the partition's high
-- watermark plus the records of the earlier appended batches of the same partition), with the
-- partition's running max of the effective max timestamps (max_timestamp_so_far, for ListOffsets
-- by timestamp). Producer windows are written once per producer. The object row is inserted
-- unmarked and its live_bytes set at the end (a HOT update); when nothing was appended it is
-- marked for deletion.
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
    -- opened it), tx_start (when it opened), tx_seq (its number, migration 15; NULL if it opened
    -- before the number was kept), le (the last ended transaction, which only markers change). A
    -- plain batch while a transaction is open: 48 (INVALID_TXN_STATE); a transactional one
    -- continues an open transaction of the same epoch unless it is verified for another one
    -- (51, CONCURRENT_TRANSACTIONS, for a newer; 48 for an older), is 48 with another epoch, and
    -- with none open opens one when verified (txn_seq) for a transaction newer than le, else 48.
    f (slot, prod, tid, st_bo, st_lo, st_la, r, n, idx, i, has, ep, w_bs, w_ls, w_ref,
       verdict, dup_ref, dup_bo, dup_la, appended, tx_open, tx_first, tx_i, tx_start, le,
       tx_seq) AS (
        SELECT grp.slot, grp.prod, s.tid, s.base_offsets, s.last_offsets, s.log_append_times,
               0, cardinality(grp.idx), grp.idx, NULL::integer,
               s.producer_epoch IS NOT NULL, s.producer_epoch, s.base_sequences,
               s.last_sequences,
               ('{-1,-2,-3,-4,-5}'::integer[])[1:coalesce(cardinality(s.base_sequences), 0)],
               NULL::smallint, NULL::integer, NULL::bigint, NULL::bigint, false,
               s.txn_first_offset IS NOT NULL, s.txn_first_offset, NULL::integer,
               coalesce(s.txn_start_ms, -1), coalesce(s.last_ended_txn, -1), s.txn_seq
        FROM grp
        LEFT JOIN LATERAL (
            SELECT ps.ctid AS tid, ps.producer_epoch, ps.base_sequences, ps.last_sequences,
                   ps.base_offsets, ps.last_offsets, ps.log_append_times, ps.txn_first_offset,
                   ps.txn_start_ms, ps.last_ended_txn, ps.txn_seq
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
               f.le,
               CASE WHEN x.opens THEN x.q ELSE f.tx_seq END
        FROM f
        CROSS JOIN LATERAL (
            -- The transaction rules on the producer rules' verdict pv (see above).
            SELECT y.i, y.e, y.s, y.l, y.same, y.dup_ref, y.q,
                   CASE WHEN y.pv <> 0 THEN y.pv
                        WHEN NOT y.t THEN CASE WHEN f.tx_open THEN 48 ELSE 0 END
                        WHEN f.tx_open THEN CASE WHEN y.e <> f.ep THEN 48
                                                 WHEN y.q > f.tx_seq THEN 51
                                                 WHEN y.q < f.tx_seq THEN 48
                                                 ELSE 0 END
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
               coalesce(f.tx_first, arr.base[f.tx_i]) AS txf, f.tx_start AS txs, f.tx_seq AS txq,
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
            last_append_ms = p_now, txn_first_offset = fin.txf, txn_start_ms = fin.txs,
            txn_seq = fin.txq
        FROM fin
        WHERE fin.tid IS NOT NULL AND ps.ctid = fin.tid
          AND ps.partition_id = s_pid[fin.slot] AND ps.producer_id = fin.prod
    ),
    ps_ins AS (
        INSERT INTO producer_state (partition_id, producer_id, producer_epoch, base_sequences,
                                    last_sequences, base_offsets, last_offsets,
                                    log_append_times, last_append_ms, txn_first_offset,
                                    txn_start_ms, txn_seq)
        SELECT s_pid[fin.slot], fin.prod, fin.ep, fin.w_bs, fin.w_ls, fin.bo, fin.lo, fin.la,
               p_now, fin.txf, fin.txs, fin.txq
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

-- The previous signature (without transactions), for brokers not yet upgraded: no transactional
-- batch (their plain batches obey the rule that a producer with an open transaction cannot write
-- outside it, which is right whatever the broker's version).
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

-- The first signature (without the commit point's arguments), for brokers not yet upgraded: the
-- key's time parsed here, the stored max_commit_age as the deadline (at least the previous fixed
-- 10 minutes), no producer field errors.
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
        p_last_sequences, object_key_time_ms(p_object_key),
        coalesce((SELECT s.max_commit_age_ms FROM coordinator_settings s WHERE s.id = 1),
                 600000::bigint),
        NULL::smallint[])
$fn$;

-- -------------------------------------------------------------------------------------------------
-- Transaction markers and tiered segments

-- write_txn_markers: appends transaction markers (KIP-98 control batches), one per element of the
-- arrays, in request order, in one call (one implicit transaction). Returns one row per marker
-- (r_index 1..n): its error code, its offset (the earlier marker's for a duplicate, -1 on error)
-- and whether it was a duplicate. p_now is the coordinator's clock (the markers' timestamps, the
-- producers' last append time).
--
-- Per marker, as the reference model: 3 (UNKNOWN_TOPIC_OR_PARTITION) for an unknown partition; a
-- marker with a txn_seq not above the producer's last ended transaction is a duplicate answered
-- with its last marker's offset, and so is one of a transaction older than the one open in the
-- partition (that one has nothing here; migration 15's txn_seq); then an older producer epoch is 47
-- (INVALID_PRODUCER_EPOCH), an older coordinator epoch 52 (TRANSACTION_COORDINATOR_FENCED), and a
-- marker of a transaction newer than the open one 51 (CONCURRENT_TRANSACTIONS: it does not end
-- the open one, whose own marker may still come, with another outcome); else the marker takes the high
-- watermark, the producer's state is created or updated (a new epoch clears its batch window) and
-- its open transaction ends; an ABORT of an open transaction is recorded in aborted_txns. Markers
-- of one call for the same partition see each other's effects. No deadline or fence (no object).
CREATE OR REPLACE FUNCTION write_txn_markers(
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
    v_st_seq   bigint;
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
               ps.txn_first_offset, ps.txn_seq
        INTO v_st_epoch, v_st_ce, v_st_ended, v_st_last, v_st_first, v_st_seq
        FROM producer_state ps
        WHERE ps.partition_id = v_pid AND ps.producer_id = v_prod;
        v_found := FOUND;
        IF v_found THEN
            IF v_seq IS NOT NULL AND (v_seq <= v_st_ended
                                      OR (v_st_first IS NOT NULL AND v_seq < v_st_seq)) THEN
                -- The transaction already ended here, or is older than the open one and so has
                -- nothing here: the earlier marker's offset.
                r_error_code := 0;
                r_offset := v_st_last;
                r_duplicate := true;
                RETURN NEXT;
                CONTINUE;
            END IF;
            r_error_code := CASE
                WHEN v_epoch < v_st_epoch THEN 47 -- INVALID_PRODUCER_EPOCH
                WHEN v_ce < v_st_ce THEN 52 -- TRANSACTION_COORDINATOR_FENCED
                WHEN v_st_first IS NOT NULL AND v_seq > v_st_seq THEN 51 -- CONCURRENT_TRANSACTIONS
            END;
            IF r_error_code IS NOT NULL THEN
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
                txn_start_ms = -1,
                txn_seq = NULL
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
CREATE OR REPLACE FUNCTION register_segment(
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

-- -------------------------------------------------------------------------------------------------
-- Compaction's swap (issue #29; BatchCoordinator::replace_segments, migration 17's compacted
-- column): the run of segments p_replaced_* names (consecutive, from the first one's base offset
-- on, same keys and offsets) is replaced by one new segment (p_object_key) or by nothing
-- (p_object_key NULL). The replaced objects lose their bytes and are marked; the partition's
-- bounds and tiered_next_offset stay, its size changes by what compaction removed.
-- r_outcome as register_segment's: 0 replaced (r_released: objects marked), 1 the new key is
-- already this segment, 2 stale, 3 unknown partition, 4 the new key is taken.
CREATE OR REPLACE FUNCTION replace_segments(
    p_topic_id             uuid,
    p_partition            integer,
    p_now                  bigint,
    p_replaced_keys        text[],
    p_replaced_bases       bigint[],
    p_replaced_ends        bigint[],
    p_object_key           text,
    p_uploader_broker_id   integer,
    p_object_size          bigint,
    p_owner                bigint,
    p_base_offset          bigint,
    p_end_offset           bigint,
    p_batch_count          integer,
    p_log_size             bigint,
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
    v_n          integer := coalesce(cardinality(p_replaced_keys), 0);
    v_pid        bigint;
    v_matched    integer;
    v_old_bytes  bigint;
    v_new_bytes  bigint := 0;
    v_ret_ts     bigint;
    v_prev       bigint;
    v_object_id  bigint;
    v_released   integer := 0;
    v_kind       smallint;
    v_seg_topic  uuid;
    v_seg_part   integer;
    v_seg_base   bigint;
    v_seg_end    bigint;
BEGIN
    IF v_n = 0 OR cardinality(p_replaced_bases) <> v_n OR cardinality(p_replaced_ends) <> v_n THEN
        RAISE EXCEPTION 'replace_segments: the replaced segments are malformed'
            USING ERRCODE = '22023';
    END IF;
    IF p_object_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_object_key, 0));
    END IF;
    SELECT pa.partition_id INTO v_pid
    FROM partitions pa WHERE pa.topic_id = p_topic_id AND pa.partition = p_partition
    FOR UPDATE;
    IF p_object_key IS NOT NULL THEN
        -- Every lock but the replaced objects' is held: the commit point.
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
    END IF;
    IF v_pid IS NULL THEN
        RETURN QUERY SELECT 3::smallint, 0;
        RETURN;
    END IF;

    -- The replaced segments must be exactly the partition's segments from the first one on.
    SELECT count(*) INTO v_matched
    FROM (SELECT s.base_offset, s.end_offset, o.object_key,
                 row_number() OVER (ORDER BY s.end_offset) AS i
          FROM tiered_segments s JOIN objects o ON o.object_id = s.object_id
          WHERE s.partition_id = v_pid AND s.end_offset >= p_replaced_bases[1]
          ORDER BY s.end_offset LIMIT v_n) c
    WHERE c.object_key = p_replaced_keys[c.i] AND c.base_offset = p_replaced_bases[c.i]
      AND c.end_offset = p_replaced_ends[c.i];
    IF v_matched <> v_n THEN
        RETURN QUERY SELECT 2::smallint, 0;
        RETURN;
    END IF;
    SELECT coalesce(sum(s.log_size), 0), max(s.retention_ts) INTO v_old_bytes, v_ret_ts
    FROM tiered_segments s
    WHERE s.partition_id = v_pid AND s.end_offset >= p_replaced_ends[1]
      AND s.end_offset <= p_replaced_ends[v_n];

    -- The replaced objects lose their bytes (a segment object is one segment's alone): lock
    -- them in object_id order, count those marked now, then take the bytes off.
    PERFORM o.object_id FROM objects o
    WHERE o.object_id IN (SELECT s.object_id FROM tiered_segments s
                          WHERE s.partition_id = v_pid AND s.end_offset >= p_replaced_ends[1]
                            AND s.end_offset <= p_replaced_ends[v_n])
    ORDER BY o.object_id FOR UPDATE;
    SELECT count(*) INTO v_released
    FROM tiered_segments s JOIN objects o ON o.object_id = s.object_id
    WHERE s.partition_id = v_pid AND s.end_offset >= p_replaced_ends[1]
      AND s.end_offset <= p_replaced_ends[v_n]
      AND o.marked_for_deletion_at IS NULL AND o.live_bytes - s.log_size <= 0;
    UPDATE objects o SET live_bytes = greatest(o.live_bytes - s.log_size, 0),
           marked_for_deletion_at = CASE WHEN o.marked_for_deletion_at IS NULL
               AND o.live_bytes - s.log_size <= 0 THEN p_now ELSE o.marked_for_deletion_at END
    FROM tiered_segments s
    WHERE o.object_id = s.object_id AND s.partition_id = v_pid
      AND s.end_offset >= p_replaced_ends[1] AND s.end_offset <= p_replaced_ends[v_n];
    DELETE FROM tiered_segments s
    WHERE s.partition_id = v_pid AND s.end_offset >= p_replaced_ends[1]
      AND s.end_offset <= p_replaced_ends[v_n];

    IF p_object_key IS NOT NULL THEN
        v_new_bytes := p_log_size;
        -- The running max carries on from the segment before the replaced ones.
        SELECT s.max_timestamp_so_far INTO v_prev FROM tiered_segments s
        WHERE s.partition_id = v_pid AND s.end_offset < p_replaced_bases[1]
        ORDER BY s.end_offset DESC LIMIT 1;
        INSERT INTO objects (object_key, uploader_broker_id, object_size, live_bytes, owners,
                             committed_at, marked_for_deletion_at, kind, segment_topic_id,
                             segment_partition, segment_base_offset, segment_end_offset)
        VALUES (p_object_key, p_uploader_broker_id, p_object_size, p_log_size, ARRAY[p_owner],
                p_now, NULL, 1, p_topic_id, p_partition, p_base_offset, p_end_offset)
        RETURNING object_id INTO v_object_id;
        INSERT INTO tiered_segments (partition_id, end_offset, base_offset, object_id, log_size,
                                     offset_index_size, time_index_size, txn_index_size,
                                     snapshot_size, epochs_size, batch_count, max_timestamp,
                                     max_timestamp_offset, max_timestamp_so_far, retention_ts,
                                     registered_at, compacted)
        VALUES (v_pid, p_end_offset, p_base_offset, v_object_id, p_log_size, p_offset_index_size,
                p_time_index_size, p_txn_index_size, p_snapshot_size, p_epochs_size,
                p_batch_count, p_max_timestamp, p_max_timestamp_offset,
                greatest(coalesce(v_prev, p_max_timestamp), p_max_timestamp),
                coalesce(v_ret_ts, -1), p_now, true);
    END IF;
    UPDATE partitions SET tiered_bytes = tiered_bytes + v_new_bytes - v_old_bytes,
           byte_size = byte_size + v_new_bytes - v_old_bytes
    WHERE partition_id = v_pid;

    RETURN QUERY SELECT 0::smallint, v_released;
END;
$fn$;
