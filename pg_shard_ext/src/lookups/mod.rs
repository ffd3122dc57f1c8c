//! Lookup tables (`pg_shard.create_lookup`): for a column other than the
//! distribution key, a distributed table of column value → keyspace id of
//! the row's key, distributed by the value, so that `column = value` costs
//! one single-shard read of the lookup and one of the table, and a unique
//! lookup makes the column unique across every shard.
//!
//! Kept synchronously, in the same transaction as the write: the shards of
//! the table record what each write changed (`worker::lookup_changes`), the
//! metadata node takes it and writes the lookup's shards ([`apply`]) in the
//! same distributed transaction. The catalog ([`catalog`]) says which
//! tables have lookups; [`read`] reads a value's keyspace ids for the
//! planner's pruning; the DBA functions are in `commands::lookup`.

pub(crate) mod apply;
pub(crate) mod catalog;
pub(crate) mod read;
