//! pg_shard: the PostgreSQL extension installed on every node of a cluster.
//!
//! On the metadata node it holds the shard catalog and the versioned shard map
//! and offers the DBA functions; on workers it holds the shard tables and
//! guards them with triggers that enforce range ownership and the map epoch.
//!
//! Module map (by subsystem, as Citus's src/backend/distributed/):
//! * [`metadata`]   – the metadata node's catalog ([`metadata::catalog`]: reads,
//!   writes as the extension's owner, the map version), nodes, logical tables,
//!   postgres_fdw servers ([`metadata::fdw`]), routing tables
//!   ([`metadata::routing_table`]), shard sizes ([`metadata::sizes`])
//! * [`commands`]   – `create_distributed_table`, `create_reference_table`,
//!   `undistribute_table`, `add_node`, DROP TABLE, reference-table writes, and
//!   schema changes carried to the shards ([`commands::ddl`], the
//!   ProcessUtility hook)
//! * [`transaction`] – node connections, remote transactions with two-phase
//!   commit and recovery ([`transaction::remote`]); statements on every shard
//!   ([`transaction::fan_out`])
//! * [`planner`]    – metadata-node planner hook: keyspace conditions for shard pruning
//! * [`worker`]     – worker-side ownership and epoch triggers (WrongShard), read
//!   fence, ownership records, a job's wait for its marker
//! * [`operations`] – shard moves and splits run by background workers over
//!   logical replication; the copy of existing rows into shard tables
//! * [`keyspace`]   – `pg_shard.keyspace_id(anyelement)`: SQL values to keyspace ids
//! * [`access`]     – who may run the DBA functions, on which tables
//! * [`shard_ddl`]  – the DDL that recreates a table's shape as a shard table
//! * [`settings`]   – fixed settings for catalog text and value text shipped to workers
//! * [`guc`]        – GUC nest levels: settings made for a piece of work, put back after it
//! * [`latch`]      – sleeping on the backend's latch, woken by signals
//! * [`spi`]        – every query pg_shard runs, under a safe search_path; the caller's names
//! * [`error`]      – the errors reported, each with its SQLSTATE
//! * [`quote`]      – quoting for generated SQL (shared with the coordinator)
//!
//! The lowest layers run no catalog code: `guc` below `spi` below
//! `settings` and `access`, all below `metadata::catalog` (which imports
//! them, never the reverse). No two files import each other.

use pgrx::prelude::*;

mod access;
mod commands;
mod copy_rows;
mod error;
mod executor;
mod executor_start;
mod guc;
mod ids;
mod keyspace;
mod latch;
mod lookups;
mod metadata;
mod operations;
mod parse_tree;
mod planner;
mod quote;
mod settings;
mod shard_ddl;
mod spi;
mod transaction;
mod worker;

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
    worker::fencing::register_gucs();
    operations::register_gucs();
    transaction::remote::register_gucs();
    planner::register_gucs();
    executor::router_scan::register();
    executor::pushdown_scan::register();
    executor::intermediate_scan::register();
    executor::modify_scan::register();
    // The launcher needs shared_preload_libraries (as the fencing hooks do).
    // SAFETY: a plain read of a backend-global flag set by the postmaster.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        operations::register_launcher();
        ids::generator::register_shared_memory();
    }
    worker::fencing::register_cache_invalidation();
    worker::lookup_changes::register_callbacks();
    executor_start::install();
    planner::install();
    commands::ddl::install();
}
