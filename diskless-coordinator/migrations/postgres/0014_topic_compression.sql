-- Topic compression (issue #29): Kafka's compression.type and its KIP-390 levels, with Kafka's
-- names and defaults. compression_type holds Kafka's name ('producer', 'uncompressed', 'gzip',
-- 'snappy', 'lz4', 'zstd').
ALTER TABLE topics ADD COLUMN compression_type text NOT NULL DEFAULT 'producer';
ALTER TABLE topics ADD COLUMN compression_gzip_level integer NOT NULL DEFAULT -1;
ALTER TABLE topics ADD COLUMN compression_lz4_level integer NOT NULL DEFAULT 9;
ALTER TABLE topics ADD COLUMN compression_zstd_level integer NOT NULL DEFAULT 3;
