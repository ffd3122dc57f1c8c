//! Shard sizes and row estimates, fetched from the workers for the
//! `pg_shard.shards` and `pg_shard.shard_stats` views.

use crate::error::Result;
use crate::transaction::client::{connect, describe};
use pgrx::prelude::*;

/// `pg_shard.shard_sizes()`: (shard_id, node_id, size_bytes,
/// estimated_rows) of every placement, one connection per node (the row
/// estimate is the worker's planner statistics: `pg_class.reltuples`). A node that cannot be reached gives
/// NULL sizes and a WARNING rather than failing the whole view.
#[pg_extern(schema = "pg_shard")]
fn shard_sizes() -> TableIterator<
    'static,
    (
        name!(shard_id, i64),
        name!(node_id, i32),
        name!(size_bytes, Option<i64>),
        name!(estimated_rows, Option<i64>),
    ),
> {
    let rows = match collect_sizes() {
        Ok(rows) => rows,
        Err(error) => error.report(),
    };
    TableIterator::new(rows)
}

type SizeRow = (i64, i32, Option<i64>, Option<i64>);

fn collect_sizes() -> Result<Vec<SizeRow>> {
    let placements = crate::metadata::catalog::shards_by_node(None)?;
    let mut sizes = Vec::new();
    for (node_id, (node, shards)) in placements {
        let ids: Vec<i64> = shards.iter().map(|(id, _)| *id).collect();
        let names: Vec<String> = shards.iter().map(|(_, name)| name.clone()).collect();
        let fetched = connect(&node.host, node.port).and_then(|mut client| {
            client
                .query(
                    "SELECT s.id, pg_catalog.pg_total_relation_size(c.oid), \
                            GREATEST(c.reltuples, 0)::bigint \
                     FROM unnest($1::bigint[], $2::text[]) AS s(id, name) \
                     LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(s.name)",
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
                    if let (Ok(id), Ok(size), Ok(rows)) = (
                        row.try_get::<_, i64>(0),
                        row.try_get::<_, Option<i64>>(1),
                        row.try_get::<_, Option<i64>>(2),
                    ) {
                        sizes.push((id, node_id, size, rows));
                    }
                }
            }
            Err(error) => {
                warning!(
                    "pg_shard: sizes of shards on {} unavailable: {error}",
                    node.label()
                );
                sizes.extend(ids.into_iter().map(|id| (id, node_id, None, None)));
            }
        }
    }
    Ok(sizes)
}
