//! `pg_shard.isolate_tenant(table, key, target_node)`: a key's keyspace id
//! gets a shard group of its own (range [id, id]) in the table's
//! co-location group, online: split jobs cut at both sides of it, then a
//! move job takes it to `target_node`. This checks the request and queues
//! the first step; the runner queues each next one when a step ends done
//! (`pg_shard.queue_isolation_step`, sql/pg_shard_api.sql).

use crate::error::{OrReport, Result, ShardError};
use crate::keyspace::{key_encoding_of, key_to_keyspace_id};
use crate::metadata::LogicalTable;
use pgrx::prelude::*;
use pgrx::AnyElement;

/// Called by `pg_shard.isolate_tenant(table regclass, key anyelement,
/// target_node integer DEFAULT NULL) → bigint` (SECURITY DEFINER): the
/// first job, or None when the key has its shard already (on the target
/// node, if one is named).
#[pg_extern(schema = "pg_shard")]
fn isolate_tenant_internal(
    table: pg_sys::Oid,
    key: Option<AnyElement>,
    target_node: Option<i32>,
) -> Option<i64> {
    isolate(table, key, target_node).or_report()
}

fn isolate(
    relid: pg_sys::Oid,
    key: Option<AnyElement>,
    target: Option<i32>,
) -> Result<Option<i64>> {
    let table = LogicalTable::of(relid)?
        .ok_or_else(|| ShardError::NotDistributed(crate::spi::caller_relation_name(relid)))?;
    if !table.is_distributed() {
        return Err(ShardError::InvalidArgument(format!(
            "{} is a reference table: it has a copy on every node and no tenant to isolate",
            table.display
        )));
    }
    let Some(key) = key else {
        return Err(ShardError::InvalidArgument(
            "isolate_tenant needs a key: NULL has no keyspace id".into(),
        ));
    };
    let encoding = crate::spi::query_one::<String>(
        "SELECT key_encoding FROM pg_shard.colocation_group WHERE colocation_id = $1",
        &[table.colocation_id.into()],
    )?
    .unwrap_or_default();
    if key_encoding_of(key.oid()).map(|e| e.name()) != Some(encoding.as_str()) {
        return Err(ShardError::InvalidArgument(format!(
            "a key of type {} does not match the {encoding} distribution key of {}",
            crate::keyspace::type_name(key.oid()),
            table.display
        )));
    }
    let routed = crate::spi::query_one::<String>(
        "SELECT string_agg(table_rel::text, ', ' ORDER BY table_rel::text) \
         FROM pg_shard.logical_table WHERE colocation_id = $1 AND routing_attnum IS NOT NULL",
        &[table.colocation_id.into()],
    )?;
    if let Some(routed) = routed {
        return Err(ShardError::InvalidArgument(format!(
            "cannot isolate a tenant of {}: {routed} route by ids whose prefix names 1/1024th \
             of the keyspace, and a shard of one keyspace id would cut a prefix (see \
             pg_shard.set_routing_id)",
            table.display
        )));
    }
    if let Some(node) = target {
        let active = crate::spi::query_one::<bool>(
            "SELECT state = 'active' FROM pg_shard.node WHERE node_id = $1",
            &[node.into()],
        )?;
        if active != Some(true) {
            return Err(ShardError::InvalidArgument(format!(
                "node {node} is not an active node (pg_shard.nodes lists them)"
            )));
        }
    }
    let id = key_to_keyspace_id(key.datum(), key.oid())?.to_sql();
    let job = crate::spi::update_one::<i64>(
        "SELECT pg_shard.queue_isolation_step($1, $2, $3, NULL)",
        &[relid.into(), id.into(), target.into()],
    )?;
    if job.is_none() {
        notice!(
            "keyspace id {id} of {} has a shard of its own already",
            table.display
        );
    }
    Ok(job)
}
