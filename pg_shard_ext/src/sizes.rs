//! Shard sizes, fetched from the workers for the `pg_shard.shards` view.

use crate::catalog::Node;
use crate::error::Result;
use crate::remote::{connect, describe};
use pgrx::prelude::*;
use std::collections::BTreeMap;

/// `pg_shard.shard_sizes()`: (shard_id, node_id, size_bytes) of every
/// placement, one connection per node. A node that cannot be reached gives
/// NULL sizes and a WARNING rather than failing the whole view.
#[pg_extern(schema = "pg_shard")]
fn shard_sizes() -> TableIterator<
    'static,
    (
        name!(shard_id, i64),
        name!(node_id, i32),
        name!(size_bytes, Option<i64>),
    ),
> {
    let rows = match collect_sizes() {
        Ok(rows) => rows,
        Err(error) => error.report(),
    };
    TableIterator::new(rows)
}

type PlacementsByNode = BTreeMap<i32, (Node, Vec<(i64, String)>)>;

fn collect_sizes() -> Result<Vec<(i64, i32, Option<i64>)>> {
    let placements: PlacementsByNode = Spi::connect(|client| {
        let mut by_node = PlacementsByNode::new();
        let rows = client.select(
            "SELECT n.node_id, n.host, n.port, s.shard_id, \
                    format('%I.%I', s.shard_schema, s.shard_name) \
             FROM pg_shard.shard s \
             JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.node n USING (node_id) \
             ORDER BY n.node_id, s.shard_id",
            None,
            &[],
        )?;
        for row in rows {
            let node = Node {
                node_id: row.get::<i32>(1)?.unwrap_or_default(),
                host: row.get::<String>(2)?.unwrap_or_default(),
                port: row.get::<i32>(3)?.unwrap_or_default(),
            };
            let shard = (
                row.get::<i64>(4)?.unwrap_or_default(),
                row.get::<String>(5)?.unwrap_or_default(),
            );
            by_node
                .entry(node.node_id)
                .or_insert_with(|| (node, Vec::new()))
                .1
                .push(shard);
        }
        Ok::<_, crate::error::ShardError>(by_node)
    })?;

    let mut sizes = Vec::new();
    for (node_id, (node, shards)) in placements {
        let ids: Vec<i64> = shards.iter().map(|(id, _)| *id).collect();
        let names: Vec<String> = shards.iter().map(|(_, name)| name.clone()).collect();
        let fetched = connect(&node.host, node.port).and_then(|mut client| {
            client
                .query(
                    "SELECT s.id, pg_catalog.pg_total_relation_size(to_regclass(s.name)) \
                     FROM unnest($1::bigint[], $2::text[]) AS s(id, name)",
                    &[&ids, &names],
                )
                .map_err(|e| crate::error::ShardError::Remote {
                    host: node.host.clone(),
                    port: node.port,
                    cause: describe(&e),
                })
        });
        match fetched {
            Ok(rows) => {
                for row in rows {
                    if let (Ok(id), Ok(size)) =
                        (row.try_get::<_, i64>(0), row.try_get::<_, Option<i64>>(1))
                    {
                        sizes.push((id, node_id, size));
                    }
                }
            }
            Err(error) => {
                warning!(
                    "pg_shard: sizes of shards on {} unavailable: {error}",
                    node.label()
                );
                sizes.extend(ids.into_iter().map(|id| (id, node_id, None)));
            }
        }
    }
    Ok(sizes)
}
