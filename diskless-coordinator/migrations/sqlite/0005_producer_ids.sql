-- Producer-id blocks (BatchCoordinator::allocate_producer_ids, issue 18): one counter row holding
-- the next producer id no block has taken. It only moves forward, inside a write transaction
-- (BEGIN IMMEDIATE), so processes sharing the database file never get overlapping blocks and a
-- restart never hands a block out again.
CREATE TABLE producer_ids (
    id               INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    next_producer_id INTEGER NOT NULL CHECK (next_producer_id >= 0)
);

-- The counter starts above every producer id that has idempotence state now: ids handed out
-- before (by a broker's own allocator) must not be handed out again, or a new producer would be
-- taken for the old one (its first batch answered as a duplicate). Ids from 2^62 on were never
-- handed out by an allocator (a client made them up) and are left out, so that they cannot use up
-- the id space.
INSERT INTO producer_ids (id, next_producer_id)
SELECT 1, COALESCE(MAX(producer_id) + 1, 0) FROM producer_state
WHERE producer_id >= 0 AND producer_id < 4611686018427387904;
