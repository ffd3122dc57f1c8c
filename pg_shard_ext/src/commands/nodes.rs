//! `pg_shard.add_node`: bring a worker into the cluster.

use crate::commands::distribute::replicate_reference_tables;
use crate::error::{OrReport, Result, ShardError};
use crate::metadata::{catalog, Node};
use crate::transaction::remote::in_transaction;
use pgrx::prelude::*;

/// `pg_shard.add_node(host text, port integer) → integer`: register a worker
/// and return its node id. Creates the extension on the worker if missing and
/// gives it a copy of every reference table.
#[pg_extern(schema = "pg_shard")]
fn add_node(host: &str, port: i32) -> i32 {
    register_node(host, port).or_report()
}

fn register_node(host: &str, port: i32) -> Result<i32> {
    if !crate::access::is_superuser() {
        return Err(ShardError::PermissionDenied(
            "must be superuser to add a node: add_node creates the extension on the worker \
             and a foreign server for it"
                .into(),
        ));
    }
    if host.trim().is_empty() {
        return Err(ShardError::InvalidArgument("host must not be empty".into()));
    }
    if !(1..=65535).contains(&port) {
        return Err(ShardError::InvalidArgument(format!(
            "port must be between 1 and 65535, got {port}"
        )));
    }
    // Serialize membership changes so two sessions cannot add the same node.
    crate::spi::run("LOCK TABLE pg_shard.node IN SHARE ROW EXCLUSIVE MODE")?;
    if let Some(node_id) = catalog::node_by_address(host, port)? {
        return Err(ShardError::NodeExists {
            host: host.into(),
            port,
            node_id,
        });
    }
    let local_system_id =
        crate::spi::get_one::<i64>("SELECT system_identifier FROM pg_catalog.pg_control_system()")?;
    let mut node = Node {
        node_id: 0,
        host: host.into(),
        port,
    };
    in_transaction(&node, |client| {
        let rows = client
            .query(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions \
                                WHERE name = 'pg_shard'), \
                        (SELECT system_identifier FROM pg_catalog.pg_control_system()), \
                        'pg_shard' = ANY (string_to_array(replace( \
                            current_setting('shared_preload_libraries'), ' ', ''), ',')), \
                        pg_postmaster_start_time()::text",
                &[],
            )
            .map_err(ShardError::into_node_failure)?;
        let row = rows.into_iter().next().unwrap_or_default();
        let column = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let available = column(0) == "t";
        let remote_system_id: i64 = column(1)
            .parse()
            .map_err(|_| ShardError::Internal(format!("{}: no system identifier", node.label())))?;
        let preloaded = column(2) == "t";
        let started = column(3);
        refuse_known_server(&node, remote_system_id, &started)?;
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
            .execute("CREATE EXTENSION IF NOT EXISTS pg_shard")
            .map(|_| ())
            .map_err(ShardError::into_node_failure)
    })?;
    node.node_id = catalog::insert_node(host, port)?;
    // Its generator number for pg_shard.next_id.
    in_transaction(&node, |client| {
        client
            .execute(&format!(
                "SELECT pg_shard.record_local_node({})",
                node.node_id
            ))
            .map(|_| ())
            .map_err(ShardError::into_node_failure)
    })?;
    replicate_reference_tables(&node)?;
    crate::metadata::fdw::create_server(&node, catalog::current_map_version()?)?;
    Ok(node.node_id)
}

/// Refuses `node` when it is the server of a node already in the cluster
/// under another address (`localhost` for `127.0.0.1`, a socket folder):
/// its shards would be written twice over one server's connections, which
/// deadlock. The same server: the same system identifier and start time,
/// asked of the nodes with the same port (an unreachable one is skipped).
fn refuse_known_server(node: &Node, system_id: i64, started: &str) -> Result<()> {
    for known in catalog::all_nodes()?
        .into_iter()
        .filter(|known| known.port == node.port)
    {
        let Ok(mut client) = crate::transaction::client::connect(&known.host, known.port) else {
            continue;
        };
        let identity = client.query_one(
            "SELECT (SELECT system_identifier FROM pg_catalog.pg_control_system()), \
                    pg_postmaster_start_time()::text",
            &[],
        );
        let Ok(row) = identity else {
            continue;
        };
        if let (Ok(known_id), Ok(known_started)) =
            (row.try_get::<_, i64>(0), row.try_get::<_, String>(1))
        {
            if known_id == system_id && known_started == started {
                return Err(ShardError::SameServer {
                    node_id: known.node_id,
                    existing: format!("{}:{}", known.host, known.port),
                });
            }
        }
    }
    Ok(())
}
