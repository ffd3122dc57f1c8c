//! Schema changes of distributed and reference tables (metadata node).
//!
//! A ProcessUtility hook looks at each utility statement that names a table
//! in `pg_shard.logical_table` and plans, before the metadata node runs it:
//! whether the metadata node's own table runs the statement (a distributed
//! table's is partitioned into foreign tables and carries no indexes or
//! constraints; those live on the shards and in
//! `pg_shard.table_constraint`), and what every shard table runs once it
//! has. Shard statements run in the remote transactions of the local one —
//! two-phase commit, so every shard changes or none does — except for the
//! CONCURRENTLY forms, which cannot run in a transaction anywhere: they run
//! shard by shard and are undone on every shard if one fails. What cannot be
//! carried to the shards is refused before anything changes: a table whose
//! shards differ from it is silently broken.
//!
//! - [`columns`]: ALTER TABLE column changes and RENAME;
//! - [`objects`]: indexes and constraints (CREATE/DROP INDEX, ADD/DROP
//!   CONSTRAINT);
//! - [`names`]: renames of indexes and constraints, SET SCHEMA;
//! - [`foreign_keys`]: foreign keys of distributed tables;
//! - [`privileges`]: GRANT/REVOKE and COMMENT;
//! - [`truncate`]: TRUNCATE of distributed tables;
//! - [`reindex`]: REINDEX TABLE / INDEX, shard by shard.
//!
//! DROP TABLE is handled by an event trigger (`crate::commands::drop`).

mod columns;
mod foreign_keys;
mod hook;
mod internal;
mod names;
mod objects;
mod parse;
mod plan;
mod privileges;
mod reindex;
mod shard_names;
mod truncate;

pub(crate) use foreign_keys::{copy_names, references_copies};
pub(crate) use hook::install;
pub(crate) use internal::run_internal;
pub(crate) use objects::recorded_objects_sql;
pub(crate) use privileges::lookups_follow;
