-- Migration 10 (issue #17): the index of batches by object served only the foreign key from
-- batches to objects, which migration 9 dropped; no query reads batches by object. Every commit
-- paid one index insertion per batch for it. Non-transactional (CONCURRENTLY: no lock that blocks
-- commits or reads while it is dropped); idempotent.
DROP INDEX CONCURRENTLY IF EXISTS batches_object;
