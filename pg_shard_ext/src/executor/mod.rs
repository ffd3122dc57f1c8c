//! The metadata node's distributed executor: custom scans that run
//! statements on the workers over pg_shard's own connections, in the local
//! transaction's remote transactions.
//!
//! * [`router_scan`]: a statement planned whole for one node (the router
//!   class).

pub(crate) mod router_scan;
