//! pg_shard: the PostgreSQL extension installed on every node of a cluster.
//!
//! On the metadata node it holds the shard catalog and the versioned shard map
//! and offers the DBA functions; on workers it holds the shard tables and
//! guards them with triggers that enforce range ownership and the map epoch.
//!
//! Module map (one concept each):
//! * [`keyspace`]   – `pg_shard.keyspace_id(anyelement)`: SQL values to keyspace ids
//! * [`access`]     – who may run the DBA functions, on which tables
//! * [`catalog`]    – reads and writes of the metadata node's catalog tables
//! * [`remote`]     – node-to-node connections and their transactions
//! * [`fdw`]        – postgres_fdw servers through which the metadata node reaches shards
//! * [`routing_table`] – a distributed table on the metadata node: partitioned, foreign partitions
//! * [`shard_ddl`]  – the DDL that recreates a table's shape as a shard table
//! * [`nodes`]      – `add_node`
//! * [`distribute`] – `create_distributed_table`, `create_reference_table`
//! * [`data_copy`]  – moving existing rows into shard tables
//! * [`reference`]  – writes to reference tables reach every copy
//! * [`drop`]       – DROP TABLE of a distributed table drops its shards
//! * [`ddl`]        – ALTER TABLE of distributed and reference tables reaches their shards
//! * [`fencing`]    – worker-side ownership and epoch triggers (WrongShard)
//! * [`local_shard`] – worker-side ownership records, written for a shard table's owner
//! * [`read_fence`] – worker-side refusal of reads from retired shards
//! * [`planner`]    – metadata-node planner hook: keyspace conditions for shard pruning
//! * [`mover`]      – shard moves: job runner background workers, logical replication
//! * [`sizes`]      – shard sizes fetched from workers for `pg_shard.shards`
//! * [`settings`]   – fixed settings for catalog text and value text shipped to workers
//! * [`spi`]        – every query pg_shard runs, under a safe search_path; the caller's names

use pgrx::prelude::*;

mod access;
mod catalog;
mod data_copy;
mod ddl;
mod distribute;
mod drop;
mod error;
mod fdw;
mod fencing;
mod keyspace;
mod local_shard;
mod mover;
mod nodes;
mod planner;
mod quote;
mod read_fence;
mod reference;
mod remote;
mod routing_table;
mod settings;
mod shard_ddl;
mod sizes;
mod spi;
mod undistribute;

::pgrx::pg_module_magic!(name, version);

// The catalog tables come first; the SQL API wrappers and views last, once
// every Rust function they call exists.
pgrx::extension_sql_file!(
    "../../sql/pg_shard_catalog.sql",
    name = "catalog",
    bootstrap
);
pgrx::extension_sql_file!("../../sql/pg_shard_api.sql", name = "api", finalize);

/// Declares the `pg_shard` schema to pgrx's SQL generator; the schema itself
/// is created by sql/pg_shard_catalog.sql (a `pg_` name needs
/// allow_system_table_mods).
#[pg_schema]
mod pg_shard {}

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    fencing::register_gucs();
    mover::register_gucs();
    remote::register_gucs();
    // The launcher needs shared_preload_libraries (as the fencing hooks do).
    // SAFETY: a plain read of a backend-global flag set by the postmaster.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        mover::register_launcher();
    }
    fencing::register_cache_invalidation();
    read_fence::install();
    planner::install();
    ddl::install();
}
