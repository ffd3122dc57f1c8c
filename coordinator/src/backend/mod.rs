//! The servers' side: connections to PostgreSQL servers, their pools,
//! multiplexed read pipes, the cluster's shard maps (loaded from the
//! metadata node and kept fresh, patched from what a version changed), and who sent a notification.

mod catalog_tls;
pub mod cluster;
pub mod cluster_map;
pub mod connection;
mod map_load;
mod map_patch;
pub mod multiplex;
pub mod notifiers;
pub mod pool;
