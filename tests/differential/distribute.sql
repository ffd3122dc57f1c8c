-- Run on the cluster's metadata node after schema.sql.
SELECT pg_shard.create_distributed_table('customers', 'customer_id', shard_count => 8, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('orders', 'customer_id', colocate_with => 'customers');
SELECT pg_shard.create_distributed_table('order_items', 'customer_id', colocate_with => 'customers');
SELECT pg_shard.create_reference_table('countries');
-- skus stays a local table of the metadata node
