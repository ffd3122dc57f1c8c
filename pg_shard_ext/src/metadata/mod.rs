//! What the metadata node knows about the cluster: its catalog tables
//! (schema pg_shard), the nodes, the logical tables, the shard map's
//! version (and what each version changed, for the coordinators), and the
//! postgres_fdw servers and routing tables through which
//! it reaches the shards.

pub(crate) mod catalog;
pub(crate) mod fdw;
mod logical_table;
pub(crate) mod map_change;
mod node;
pub(crate) mod node_health;
pub(crate) mod routing_table;
pub(crate) mod shard_lookup;
pub(crate) mod sizes;
mod worker_activity;

pub(crate) use logical_table::{LogicalTable, DISTRIBUTED};
pub(crate) use node::Node;
