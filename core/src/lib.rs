//! The shared core of pg_shard: how a distribution key becomes a keyspace id,
//! how the keyspace is cut into ranges, and how a versioned shard map finds the
//! range that owns a keyspace id.
//!
//! The extension (catalog, worker triggers) and the coordinator (routing) both
//! link this crate, so the two can never disagree on where a key lives.

pub mod keyspace;
pub mod passfile;
pub mod pgoutput;
pub mod quote;
pub mod range;
pub mod replication_stream;
pub mod routing_id;
pub mod shard_map;
pub mod union_find;

pub use keyspace::{keyspace_id, KeyEncoding, KeyspaceId};
pub use range::{KeyRange, RangeError};
pub use shard_map::{ShardMap, ShardMapError};
pub use union_find::UnionFind;
