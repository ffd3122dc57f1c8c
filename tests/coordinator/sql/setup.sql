-- Cluster: metadata node 28320, workers 28321-28322, coordinator 28420.
-- Everything here goes through the coordinator: DDL and pg_shard's
-- functions are not routable, so they run on the metadata node.
CREATE EXTENSION pg_shard;
SELECT pg_shard.add_node('127.0.0.1', 28321) > 0 AS added;
SELECT pg_shard.add_node('127.0.0.1', 28322) > 0 AS added;
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric NOT NULL DEFAULT 0);
CREATE TABLE transfers (account_id bigint NOT NULL, transfer_no int NOT NULL, amount numeric NOT NULL,
                        PRIMARY KEY (account_id, transfer_no));
CREATE TABLE currencies (code text PRIMARY KEY, name text NOT NULL);
CREATE TABLE notes (id serial PRIMARY KEY, body text);
INSERT INTO accounts SELECT g, 'owner ' || g, 100 FROM generate_series(1, 100) g;
INSERT INTO transfers SELECT g, t, t * 10 FROM generate_series(1, 100) g, generate_series(1, 3) t;
INSERT INTO currencies VALUES ('EUR', 'Euro'), ('USD', 'US dollar');
SELECT pg_shard.create_distributed_table('accounts', 'id', shard_count => 4);
SELECT pg_shard.create_distributed_table('transfers', 'account_id', colocate_with => 'accounts');
SELECT pg_shard.create_reference_table('currencies');
CREATE TABLE events (id uuid PRIMARY KEY, kind text);
SELECT pg_shard.create_distributed_table('events', 'id', shard_count => 4);
INSERT INTO events VALUES ('123e4567-e89b-12d3-a456-426614174000', 'created');
-- the coordinator reloads its map on NOTIFY pg_shard_map
SELECT pg_sleep(1);
SHOW SHARDS;
