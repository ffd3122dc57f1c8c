//! The metadata node's distributed executor: custom scans that run
//! statements on the workers over pg_shard's own connections, in the local
//! transaction's remote transactions.
//!
//! * [`router_scan`]: a statement planned whole for one node (the router
//!   class);
//! * [`pushdown_scan`]: the worker queries of a pushed-down statement, one
//!   per node, all at once, under the final query's plan;
//! * [`intermediate_scan`]: the rows of a statement planned apart, run
//!   first (an `EXISTS` test on a distributed table not tied to its key);
//! * [`modify_scan`]: a multi-shard UPDATE, DELETE or INSERT … SELECT, one
//!   statement per shard group, every node at once;
//! * [`fdw_writes`]: a plan writing a distributed table over postgres_fdw
//!   marks the transaction as it starts;
//! * [`aggregate_states`]: the metadata node's side of partial variance
//!   and standard deviation: workers' serialized states combined;
//! * [`moved_shards`]: a router statement refused by a shard that moved
//!   finds its shards again and runs there;
//! * [`stored_scan`]: what they share: rows stored on the first fetch,
//!   then handed out one at a time;
//! * [`row_store`]: the rows nodes send, as the scans' tuples.

mod aggregate_states;
mod computed_values;
pub(crate) mod fdw_writes;
pub(crate) mod intermediate_scan;
pub(crate) mod modify_scan;
pub(crate) mod moved_shards;
pub(crate) mod pushdown_scan;
pub(crate) mod router_scan;
mod row_store;
mod stored_scan;
