//! The metadata node reaches shards through postgres_fdw: one foreign server
//! per worker node (`pg_shard_node_<node_id>`), created by `add_node`.
//!
//! Each server's connection options declare the current map version to the
//! worker (`-c pg_shard.map_version=N`): every bump rewrites them, which makes
//! postgres_fdw reconnect, so statements routed through the metadata node are
//! always checked against the map they were planned with.

use super::node::Node;
use crate::error::Result;
use crate::quote;

pub(crate) fn server_name(node_id: i32) -> String {
    format!("pg_shard_node_{node_id}")
}

fn connection_options(version: i64) -> String {
    format!("-c pg_shard.map_version={version}")
}

/// Create the foreign server and a user mapping for `node`, declaring map
/// `version` (the current one: the caller reads it, as the catalog sits
/// above this module).
pub(crate) fn create_server(node: &Node, version: i64) -> Result<()> {
    let database =
        crate::spi::query_value::<String>("SELECT current_database()::text")?.unwrap_or_default();
    let server = quote::ident(&server_name(node.node_id));
    if crate::spi::query_value::<bool>(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'postgres_fdw')",
    )?
    .unwrap_or(true)
    {
        crate::spi::run("CREATE EXTENSION postgres_fdw")?;
    }
    crate::spi::run(&format!(
        "CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (\
         host {}, port {}, dbname {}, async_capable 'true', extensions 'pg_shard', \
         fetch_size '10000', application_name 'pg_shard', options {})",
        quote::literal(&node.host),
        quote::literal(&node.port.to_string()),
        quote::literal(&database),
        quote::literal(&connection_options(version)),
    ))?;
    // Without a `user` option postgres_fdw connects as libpq's default user,
    // the metadata node's operating-system user (postgres). Per-role mappings
    // with their own user and password can be added by the DBA.
    crate::spi::run(&format!("CREATE USER MAPPING FOR PUBLIC SERVER {server}"))?;
    Ok(())
}

/// Declare `version` on every node's server (called with each map bump).
pub(crate) fn declare_map_version(version: i64) -> Result<()> {
    let servers: Vec<String> = crate::spi::connect(|client| {
        let mut names = Vec::new();
        let rows = client.select(
            "SELECT s.srvname::text FROM pg_shard.node n \
             JOIN pg_catalog.pg_foreign_server s ON s.srvname = 'pg_shard_node_' || n.node_id",
            None,
            &[],
        )?;
        for row in rows {
            names.extend(row.get::<String>(1)?);
        }
        Ok::<_, crate::error::ShardError>(names)
    })?;
    for server in servers {
        crate::spi::run(&format!(
            "ALTER SERVER {} OPTIONS (SET options {})",
            quote::ident(&server),
            quote::literal(&connection_options(version))
        ))?;
    }
    Ok(())
}
