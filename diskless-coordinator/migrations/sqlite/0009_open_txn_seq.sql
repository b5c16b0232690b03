-- The number (txn_seq) of the verified batch that opened a producer's open transaction in the
-- partition, NULL when none is open (or it opened before this column existed). With it, a
-- verified batch of another transaction is refused while one is open (CONCURRENT_TRANSACTIONS),
-- and a marker ends only the transaction it names (issue #31: two transactions of one producer
-- ran together in a partition when a host lost the first one's marker).
ALTER TABLE producer_state ADD COLUMN txn_seq INTEGER;
