//! Quoting for generated SQL: shared with the coordinator, in the core crate.

pub(crate) use pg_shard_core::quote::*;
