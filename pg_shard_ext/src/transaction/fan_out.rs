//! Statements run on every shard table of a logical table: in the remote
//! transactions of the local one, or one shard at a time outside any
//! transaction (the CONCURRENTLY forms), undone everywhere if one fails.

use super::connection::NodeConnection;
use super::remote;
use crate::error::Result;
use crate::metadata::Node;
use crate::quote;
use pgrx::prelude::*;

/// One shard table: its node, id, schema and qualified name.
pub(crate) struct ShardTable {
    pub(crate) node: Node,
    pub(crate) shard_id: i64,
    pub(crate) schema: String,
    pub(crate) qualified: String,
    /// Whether the placement is the shard's active one (not an old copy a
    /// revert could bring back, or a new one not yet published).
    pub(crate) active: bool,
}

/// Every placement of `relid`'s shards, in node order.
pub(crate) fn shard_tables(relid: pg_sys::Oid) -> Result<Vec<ShardTable>> {
    crate::spi::connect(|client| {
        let mut tables = Vec::new();
        for row in client.select(
            "SELECT n.node_id, n.host, n.port, s.shard_id, s.shard_schema, s.shard_name, \
                    p.state = 'active' \
             FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.node n USING (node_id) \
             WHERE s.table_rel = $1 ORDER BY n.node_id, s.shard_id",
            None,
            &[relid.into()],
        )? {
            let schema = row.get::<String>(5)?.unwrap_or_default();
            let name = row.get::<String>(6)?.unwrap_or_default();
            tables.push(ShardTable {
                node: Node::from_row(&row, 1)?,
                shard_id: row.get::<i64>(4)?.unwrap_or_default(),
                qualified: quote::qualified(&schema, &name),
                schema,
                active: row.get::<bool>(7)?.unwrap_or(false),
            });
        }
        Ok(tables)
    })
}

/// Run the statements `sql` gives for each shard table of `relid`, in the
/// remote transactions that commit with the local one (all of a node's in
/// one round trip).
pub(crate) fn on_shards_in_transaction(
    relid: pg_sys::Oid,
    sql: impl Fn(&ShardTable) -> Vec<String>,
) -> Result<()> {
    let shards = shard_tables(relid)?;
    let pieces = shards
        .iter()
        .map(|shard| (shard.node.clone(), sql(shard).join(";\n")));
    for (node, script) in remote::scripts_by_node(pieces) {
        remote::run_in_transaction(&node, &script)?;
    }
    Ok(())
}

/// Run `sql` on each shard table of `relid` one statement at a time outside
/// any transaction (CREATE/DROP INDEX CONCURRENTLY). If one fails, `undo`
/// runs on every shard table (it must tolerate shards `sql` never reached),
/// and the error is returned.
pub(crate) fn on_shards_one_by_one(
    relid: pg_sys::Oid,
    sql: impl Fn(&ShardTable) -> String,
    undo: impl Fn(&ShardTable) -> String,
) -> Result<()> {
    let shards = shard_tables(relid)?;
    // Every node is reached before anything changes.
    let mut connections: Vec<NodeConnection> = Vec::new();
    for shard in &shards {
        if !connections
            .iter()
            .any(|c| c.node().node_id == shard.node.node_id)
        {
            connections.push(NodeConnection::open(&shard.node)?);
        }
    }
    fn connection_of<'a>(
        connections: &'a mut [NodeConnection],
        node: &Node,
    ) -> Option<&'a mut NodeConnection> {
        connections
            .iter_mut()
            .find(|c| c.node().node_id == node.node_id)
    }
    let mut failure = None;
    for shard in &shards {
        pgrx::check_for_interrupts!();
        let Some(connection) = connection_of(&mut connections, &shard.node) else {
            continue;
        };
        if let Err(e) = connection.execute(&sql(shard)) {
            failure = Some(e.into_node_failure());
            break;
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    for shard in &shards {
        if let Some(connection) = connection_of(&mut connections, &shard.node) {
            if let Err(e) = connection.execute(&undo(shard)) {
                pgrx::warning!(
                    "could not undo a change of shard table {} on node {}: {}",
                    shard.qualified,
                    shard.node.label(),
                    e.into_node_failure()
                );
            }
        }
    }
    Err(failure)
}
