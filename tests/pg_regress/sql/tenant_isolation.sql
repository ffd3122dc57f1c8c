-- Tenant isolation: a key's keyspace id gets a shard group of its own,
-- [id, id], in every table of its co-location group, by split jobs at both
-- sides of it and then, when asked, a move; pg_shard.wait_job follows the
-- steps. Running it again for an isolated key queues nothing.
CREATE TABLE iso_accounts (id bigint PRIMARY KEY, balance int NOT NULL);
CREATE TABLE iso_entries (account bigint NOT NULL, n int NOT NULL, PRIMARY KEY (account, n));
INSERT INTO iso_accounts SELECT g, g FROM generate_series(1, 2000) g;
INSERT INTO iso_entries SELECT g % 200, g FROM generate_series(1, 2000) g;
SELECT pg_shard.create_distributed_table('iso_accounts', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('iso_entries', 'account', colocate_with => 'iso_accounts');
SELECT s.node_id AS iso_source, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id) AS iso_target
  FROM pg_shard.shards s
 WHERE s.table_name = 'iso_accounts'::regclass
   AND pg_shard.keyspace_id(42::bigint) BETWEEN s.range_start AND s.range_end \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.isolate_tenant('iso_accounts', 42::bigint, target_node => :iso_target) AS iso_job \gset
SELECT pg_shard.wait_job(:iso_job, '3 minutes');
-- two splits and a move, each queued by the runner when the one before ended
SELECT kind, state, phase, split_at - pg_shard.keyspace_id(42::bigint) AS split_at_minus_id,
       target_node = :iso_target AS to_target,
       (resources->'isolating'->>'keyspace_id')::bigint = pg_shard.keyspace_id(42::bigint) AS isolating_42,
       resources ? 'next_job' AS has_next
  FROM pg_shard.job WHERE job_id >= :iso_job ORDER BY job_id;
SELECT table_name, range_start = range_end AS one_id, range_start = pg_shard.keyspace_id(42::bigint) AS its_id,
       node_id = :iso_target AS on_target
  FROM pg_shard.shards
 WHERE table_name IN ('iso_accounts'::regclass, 'iso_entries'::regclass)
   AND pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end ORDER BY 1;
-- its rows, and everyone else's, are where the routers find them
SELECT count(*), sum(balance) FROM iso_accounts;
SELECT count(*) FROM iso_entries WHERE account = 42;
SELECT balance FROM iso_accounts WHERE id = 42;
-- again: nothing to do, with or without the node it is on
SELECT pg_shard.isolate_tenant('iso_accounts', 42::bigint, target_node => :iso_target);
SELECT pg_shard.isolate_tenant('iso_entries', 42);
-- without a target node: the two splits only, on the node it is on
SELECT pg_shard.isolate_tenant('iso_accounts', 43::bigint) AS iso_job \gset
SELECT pg_shard.wait_job(:iso_job, '3 minutes');
SELECT count(*) AS jobs FROM pg_shard.job WHERE job_id >= :iso_job;
SELECT count(*) AS isolated FROM pg_shard.shards
 WHERE table_name = 'iso_accounts'::regclass AND range_start = range_end;
-- refused: a key of another type, NULL, a node that does not exist, a
-- reference table, a table routed by ids
SELECT pg_shard.isolate_tenant('iso_accounts', 'acme'::text);
SELECT pg_shard.isolate_tenant('iso_accounts', NULL::bigint);
SELECT pg_shard.isolate_tenant('iso_accounts', 7::bigint, target_node => 99);
CREATE TABLE iso_plans (code text PRIMARY KEY);
SELECT pg_shard.create_reference_table('iso_plans');
SELECT pg_shard.isolate_tenant('iso_plans', 'gold'::text);
CREATE TABLE iso_orders (customer bigint NOT NULL, order_id bigint NOT NULL, PRIMARY KEY (customer, order_id));
SELECT pg_shard.create_distributed_table('iso_orders', 'customer', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.set_routing_id('iso_orders', 'order_id');
SELECT pg_shard.isolate_tenant('iso_orders', 5::bigint);
SELECT pg_shard.isolate_tenant('no_such_table', 5::bigint);
-- nothing was queued by the refusals
SELECT count(*) AS queued FROM pg_shard.job WHERE state IN ('queued', 'running');
DROP TABLE iso_entries, iso_accounts, iso_plans, iso_orders;
