-- A fresh cluster: metadata node on 25320, workers on 25321 and 25322.
-- (25323 is added later by the reference suite.)
CREATE EXTENSION pg_shard;
SELECT pg_shard.map_version();
SELECT pg_shard.add_node('127.0.0.1', 25321);
SELECT pg_shard.add_node('127.0.0.1', 25322);
SELECT * FROM pg_shard.nodes;
-- add_node created the extension on the workers
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT extname FROM pg_extension WHERE extname = 'pg_shard';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT extname FROM pg_extension WHERE extname = 'pg_shard';
-- no shards yet, so adding nodes did not change the map
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.map_version();
