-- Deleting an object row checks the batches that reference it (foreign key): without an index on
-- batches(object_id) every such check scans the whole table, inside the write transaction.
CREATE INDEX batches_object ON batches (object_id);
