//! Reads by a looked-up column (`pg_shard.create_lookup`): `column = value`
//! on a table with a lookup of that column, where nothing else routes the
//! statement, is two single-shard hops. The lookup's shard for the value
//! gives the keyspace ids of the rows' keys ([`LookupHop`], which the
//! frontend runs); then the statement goes to the shard that holds them
//! ([`route_looked_up`]).
//!
//! Only reads outside transactions take the hops: the lookup is read in
//! one snapshot and the table in another, as two statements at READ
//! COMMITTED would be. Writes of such tables go to the metadata node, which
//! keeps the lookups; reads in a transaction go there too, and see its
//! writes.

use super::decision::{on_shard, serving};
use super::*;
use crate::backend::cluster::Table;

/// The first hop: read the keyspace ids the lookup holds for the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupHop {
    /// The node of the lookup's shard, and the shard (for the counters).
    pub node: NodeId,
    pub shard: i64,
    /// `SELECT keyspace_id FROM <lookup shard> WHERE value = $1`.
    pub sql: String,
    /// The value, as text (its type's input reads it).
    pub value: String,
}

/// The lookup hop for a read of `table` (the statement's only relation)
/// whose only usable condition is `column = value` on a looked-up column.
pub(super) fn lookup_hop(
    shape: &Shape,
    normalized: &Normalized,
    table: &Table,
    map: &ClusterMap,
    parameters: Option<&Parameters<'_>>,
) -> Option<LookupHop> {
    let relation = shape.relations.first()?;
    for lookup in &table.lookups {
        let means = |c: &ColumnRef| {
            c.column == lookup.column
                && c.qualifier
                    .as_deref()
                    .is_none_or(|q| q == relation.reference_name())
        };
        let Some(value) = shape.facts.iter().find_map(|f| match f {
            Fact::OneOf(c, values) if means(c) && values.len() == 1 => values.first(),
            _ => None,
        }) else {
            continue;
        };
        let lookup_table = map.tables.get(&lookup.table)?;
        let TableKind::Distributed {
            encoding, shards, ..
        } = &lookup_table.kind
        else {
            continue;
        };
        let id = key_id(value, *encoding, normalized, parameters)?;
        let text = key_value(value, *encoding, normalized, parameters)?.to_string();
        let (_, placement) = shards.lookup(id);
        // (The operator named: a schema on the role's search_path cannot
        // stand in for it.)
        return Some(LookupHop {
            node: placement.node,
            shard: placement.shard_id,
            sql: format!(
                "SELECT keyspace_id FROM {} WHERE value OPERATOR(pg_catalog.=) $1",
                placement.qualified_name
            ),
            value: text,
        });
    }
    None
}

/// The second hop, once the lookup answered with `ids`: the shard that
/// holds them, or any one shard when there are none (no row has the value:
/// every shard answers alike); several shards, or a map that changed
/// meanwhile, send the statement to the metadata node.
pub fn route_looked_up(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    map: &ClusterMap,
    session: &Session<'_>,
    ids: &[i64],
) -> Route {
    (|| {
        let [relation] = shape.relations.as_slice() else {
            return None;
        };
        let search_path = match (&relation.schema, session.search_path) {
            (Some(_), _) => &[][..],
            (None, Some(path)) => path,
            (None, None) => return None,
        };
        let table = map.table(relation.schema.as_deref(), &relation.name, search_path)?;
        let TableKind::Distributed { shards, reads, .. } = &table.kind else {
            return None;
        };
        let read_routed = !shape.locks_rows && session.outside_transaction;
        let shards = serving(shards, reads, read_routed);
        let mut placements = ids
            .iter()
            .map(|id| shards.lookup(KeyspaceId::from_sql(*id)).1);
        let placement = match placements.next() {
            None => &shards.entries().first()?.1,
            Some(first) => {
                if placements.any(|p| p.shard_id != first.shard_id) {
                    return None;
                }
                first
            }
        };
        on_shard(placement, shape, sql, normalized, false, None)
    })()
    .unwrap_or(Route::Metadata)
}
