//! The metadata node's planner hook. A statement whose distributed tables
//! come down to one shard group on one node is planned as a router
//! statement ([`router`]): the whole statement runs on that node. A SELECT
//! on co-located tables joined on their distribution columns is pushed
//! down ([`pushdown`], split by [`combine`], which merges partial results
//! as [`aggregates`] says): one query per shard group on the workers, and a
//! final one over their rows. An UPDATE or DELETE across
//! shard groups, or an INSERT … SELECT between co-located tables, runs as
//! one statement per shard group ([`modify`]). Others run over
//! postgres_fdw, with shard pruning for keys:
//!
//! A distributed table is partitioned by `pg_shard.keyspace_id(key)`, so
//! PostgreSQL prunes partitions only for conditions on that expression. The
//! hook finds conditions on the distribution column itself and adds the
//! matching condition on the partition key beside them:
//!
//! * `key = <expr>`  →  `keyspace_id(key) = keyspace_id(<expr>)`
//! * `key IN (a, b)` →  `keyspace_id(key) = ANY (ARRAY[keyspace_id(a), keyspace_id(b)])`
//! * `key = ANY(const)` →  `keyspace_id(key) = ANY (keyspace_ids(const))`
//! * `key = ANY($1)` →  one keyspace id per shard picked from the array when
//!   the plan starts (see [`any_of_array_value`])
//! * `id = <expr>` on a column of self-routing ids ([`routing_ids`]) →
//!   `keyspace_id(key)` between the first and last keyspace id of the
//!   prefix the id carries
//! * `column = <expr>` on a looked-up column, in a SELECT
//!   ([`lookup_pruning`]) → the keyspace ids the lookup holds for the value,
//!   read when the plan starts (such a SELECT is not pushed down)
//!
//! where `<expr>` refers to no column of the same query level and is not
//! volatile. Constants fold at plan time (plan-time pruning); parameters of a
//! generic plan are evaluated when it starts (run-time pruning). The added
//! condition is implied by the one it stands beside, so results never change.
//! Conditions in WHERE and in every JOIN … ON are handled, in subqueries in
//! FROM and in CTEs too.

mod aggregates;
mod combine;
mod computed_values;
mod conditions;
mod explain;
mod hook;
mod insert_values;
pub(crate) mod intermediate;
mod lookup_pruning;
mod lookup_writes;
mod modify;
mod partition_key;
mod pruning;
mod pushdown;
mod router;
mod routing_ids;
mod separable;
mod shared_reads;
mod single_table;
mod worker_query;

/// The planner hook, and the EXPLAIN hook that names the fallback's class.
pub(crate) fn install() {
    hook::install();
    explain::install();
}

/// A pushdown or multi-shard DML plan's node tasks again, under a newer map
/// (their executors run a statement again after a move or split).
pub(crate) use pushdown::tasks_again as shard_group_tasks_again;

/// Whether `relid` is a distributed table (its partition key is pg_shard's
/// keyspace id): a syscache read.
pub(crate) fn is_distributed_table(relid: pgrx::pg_sys::Oid) -> bool {
    partition_key::partition_key(relid).is_some()
}

pub(crate) use lookup_writes::refuse_fdw_writes_of;

pub(crate) fn register_gucs() {
    router::register_gucs();
    pushdown::register_gucs();
}

/// Forget cached catalog facts (called on every relcache invalidation).
pub(crate) fn forget_cache() {
    partition_key::forget_cache();
    routing_ids::forget_cache();
    lookup_pruning::forget_cache();
    crate::metadata::shard_lookup::forget();
}
