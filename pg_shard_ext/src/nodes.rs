//! `pg_shard.add_node`: bring a worker into the cluster.

use crate::catalog::{self, Node};
use crate::distribute::replicate_reference_tables;
use crate::error::{OrReport, Result, ShardError};
use crate::remote::{in_transaction, remote_error};
use pgrx::prelude::*;

/// `pg_shard.add_node(host text, port integer) → integer`: register a worker
/// and return its node id. Creates the extension on the worker if missing and
/// gives it a copy of every reference table.
#[pg_extern(schema = "pg_shard")]
fn add_node(host: &str, port: i32) -> i32 {
    register_node(host, port).or_report()
}

fn register_node(host: &str, port: i32) -> Result<i32> {
    if host.trim().is_empty() {
        return Err(ShardError::InvalidArgument("host must not be empty".into()));
    }
    if !(1..=65535).contains(&port) {
        return Err(ShardError::InvalidArgument(format!(
            "port must be between 1 and 65535, got {port}"
        )));
    }
    // Serialize membership changes so two sessions cannot add the same node.
    Spi::run("LOCK TABLE pg_shard.node IN SHARE ROW EXCLUSIVE MODE")?;
    if let Some(node_id) = catalog::node_by_address(host, port)? {
        return Err(ShardError::NodeExists {
            host: host.into(),
            port,
            node_id,
        });
    }
    let local_system_id =
        Spi::get_one::<i64>("SELECT system_identifier FROM pg_catalog.pg_control_system()")?;
    let mut node = Node {
        node_id: 0,
        host: host.into(),
        port,
    };
    in_transaction(&node, |client| {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions \
                                WHERE name = 'pg_shard'), \
                        (SELECT system_identifier FROM pg_catalog.pg_control_system()), \
                        'pg_shard' = ANY (string_to_array(replace( \
                            current_setting('shared_preload_libraries'), ' ', ''), ','))",
                &[],
            )
            .map_err(|e| remote_error(&node, &e))?;
        let column_error = |e: postgres::Error| remote_error(&node, &e);
        let available: bool = row.try_get(0).map_err(column_error)?;
        let remote_system_id: i64 = row.try_get(1).map_err(column_error)?;
        let preloaded: bool = row.try_get(2).map_err(column_error)?;
        if !available {
            return Err(ShardError::ExtensionMissing {
                host: host.into(),
                port,
            });
        }
        if Some(remote_system_id) == local_system_id {
            return Err(ShardError::InvalidArgument(format!(
                "{host}:{port} is this metadata node's own server; workers must be other servers"
            )));
        }
        if !preloaded {
            warning!(
                "pg_shard is not in shared_preload_libraries on {host}:{port}: reads of \
                 retired shards are refused only in sessions that loaded pg_shard"
            );
        }
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_shard")
            .map_err(|e| remote_error(&node, &e))
    })?;
    node.node_id = catalog::insert_node(host, port)?;
    replicate_reference_tables(&node)?;
    crate::fdw::create_server(&node)?;
    Ok(node.node_id)
}
