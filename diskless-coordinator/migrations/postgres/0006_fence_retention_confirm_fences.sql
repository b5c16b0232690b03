-- Migration 6 (issue #12 review fixes R1 and R3): fences outlive every committer's deadline, and a
-- deleted object's key can never be committed again.
--
-- R1. Brokers may run with different max_commit_age values (and the previous version's
--     commit_file signature used a fixed 10 minutes). A fence must not expire while ANY committer's
--     deadline still accepts its key, so fence expiry no longer trusts the caller's value: the
--     schema keeps the LARGEST max_commit_age any coordinator ever connected with
--     (coordinator_settings, raised by every coordinator when it connects, before its first
--     commit), and fences are kept for 2 x that value. Lowering a coordinator's max_commit_age
--     therefore never shortens fence retention. The previous version's commit_file signature uses
--     the stored value as its deadline. The SQL key-time parser now agrees with Rust's
--     diskless_coordinator::object_key_time_ms on every input (every UUID text form the uuid crate
--     parses; version 7 AND the RFC 4122 variant).
-- R3. Deleting an object row (confirm_deleted: the object is gone from storage) records a fence
--     for its key in the same transaction, so a retried commit of that key is refused (DL002)
--     instead of appending batches to a deleted object. It is a trigger, so that a broker of the
--     previous version, whose confirm_deleted is a plain DELETE, fences too.
--
-- Only a new table, new functions, replaced function bodies with unchanged signatures and a
-- trigger (CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on objects for a catalog update).

-- One row: the largest max_commit_age (ms) any coordinator of this schema ever connected with. Only
-- ever raised by the coordinators (UPDATE ... SET max_commit_age_ms = greatest(...)); an operator
-- may lower it by hand once no coordinator runs with a larger value.
CREATE TABLE coordinator_settings (
    id                smallint NOT NULL PRIMARY KEY CHECK (id = 1),
    max_commit_age_ms bigint   NOT NULL CHECK (max_commit_age_ms >= 0)
);
-- The previous versions' default (and the previous commit_file signature's fixed deadline).
INSERT INTO coordinator_settings (id, max_commit_age_ms) VALUES (1, 600000);

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

-- The key time below which a fence may be dropped, by the server's clock: fences are kept for
-- 2 x the largest max_commit_age any coordinator connected with, and at least p_min_retention_ms
-- (what the caller itself needs). NULL (nothing expires) if the settings row is missing.
CREATE FUNCTION fence_expiry_before(p_min_retention_ms bigint) RETURNS bigint
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
CREATE FUNCTION expire_fences(p_min_retention_ms bigint, p_limit integer) RETURNS bigint
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

-- fence_orphans of migration 5 with fence expiry at 2 x the stored max_commit_age (a caller of the
-- previous version passes 2 x its own, which may be smaller: the larger one wins). Nothing else
-- changed.
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

-- R3: every deleted object row leaves a fence for its key (when the key has a UUID v7 time), in
-- the deleting transaction. A fence that expiry would drop at once is not written: every
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
CREATE FUNCTION fence_deleted_objects() RETURNS trigger
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

CREATE TRIGGER objects_deleted_fence AFTER DELETE ON objects
    REFERENCING OLD TABLE AS gone_objects
    FOR EACH STATEMENT EXECUTE FUNCTION fence_deleted_objects();

-- confirm_deleted: drops up to p_expiry_batch expired fences (so fences written by deletions stay
-- bounded even when no orphan collector runs), then forgets the given objects that are marked for
-- deletion (the trigger fences their keys). One transaction.
CREATE FUNCTION confirm_deleted(p_keys text[], p_min_retention_ms bigint, p_expiry_batch integer)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM expire_fences(p_min_retention_ms, p_expiry_batch);
    DELETE FROM objects o
    WHERE o.marked_for_deletion_at IS NOT NULL AND o.object_key = ANY (p_keys);
END;
$fn$;

-- The previous version's commit_file signature (a broker not yet upgraded): the commit deadline is
-- the stored max_commit_age (at least the previous fixed 10 minutes) instead of a fixed value.
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
