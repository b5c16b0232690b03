-- Producer-id blocks (BatchCoordinator::allocate_producer_ids, issue 18): one counter row holding
-- the next producer id no block has taken. It only moves forward, inside a write transaction
-- (BEGIN IMMEDIATE), so processes sharing the database file never get overlapping blocks and a
-- restart never hands a block out again.
CREATE TABLE producer_ids (
    id               INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    next_producer_id INTEGER NOT NULL CHECK (next_producer_id >= 0)
);

INSERT INTO producer_ids (id, next_producer_id) VALUES (1, 0);
