-- Producer-id blocks (BatchCoordinator::allocate_producer_ids, issue 18), migration 8.
--
-- One counter row holding the next producer id no block has taken. A block is taken by one
-- autocommit UPDATE ... RETURNING of that row: concurrent callers (any coordinator process on this
-- schema) queue on its row lock, and under READ COMMITTED each re-reads the value the previous
-- one committed, so blocks never overlap; once committed the counter survives any restart. A new
-- table, and one read of producer_state (ACCESS SHARE: it blocks no reader or writer).
CREATE TABLE producer_ids (
    id               smallint NOT NULL PRIMARY KEY CHECK (id = 1),
    next_producer_id bigint   NOT NULL CHECK (next_producer_id >= 0)
);

-- The counter starts above every producer id that has idempotence state now: ids handed out
-- before (by a broker's own allocator) must not be handed out again, or a new producer would be
-- taken for the old one (its first batch answered as a duplicate). Ids from 2^62 on were never
-- handed out by an allocator (a client made them up) and are left out, so that they cannot use up
-- the id space.
INSERT INTO producer_ids (id, next_producer_id)
SELECT 1, COALESCE(MAX(producer_id) + 1, 0) FROM producer_state
WHERE producer_id >= 0 AND producer_id < 4611686018427387904;
