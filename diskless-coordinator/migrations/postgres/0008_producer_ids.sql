-- Producer-id blocks (BatchCoordinator::allocate_producer_ids, issue 18), migration 8.
--
-- One counter row holding the next producer id no block has taken. A block is taken by one
-- autocommit UPDATE ... RETURNING of that row: concurrent callers (any coordinator process on this
-- schema) queue on its row lock, and under READ COMMITTED each re-reads the value the previous
-- one committed, so blocks never overlap; once committed the counter survives any restart. Only a
-- new table: nothing that exists is locked.
CREATE TABLE producer_ids (
    id               smallint NOT NULL PRIMARY KEY CHECK (id = 1),
    next_producer_id bigint   NOT NULL CHECK (next_producer_id >= 0)
);

INSERT INTO producer_ids (id, next_producer_id) VALUES (1, 0);
