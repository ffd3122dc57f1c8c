//! The routing decision: an analysis, the current map and the bound
//! parameters give one worker (with its shard tables) or the metadata node.

use super::equivalence::EquivalenceClasses;
use super::keys::routing_id_key;
use super::*;

/// Functions that must run where their state lives (the metadata node),
/// or that leave session state on a pooled connection.
const METADATA_FUNCTIONS: [&str; 11] = [
    "nextval",
    "currval",
    "setval",
    "lastval",
    "set_config",
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
];

pub(super) fn route_inner(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    map: &ClusterMap,
    session: &Session<'_>,
    parameters: Option<&Parameters<'_>>,
) -> Option<Route> {
    for (schema, name) in &shape.functions {
        let catalog = matches!(schema.as_deref(), None | Some("pg_catalog"));
        if !catalog
            || !map.catalog_functions.contains(name)
            || METADATA_FUNCTIONS.contains(&name.as_str())
        {
            return None;
        }
    }
    let mut tables = Vec::with_capacity(shape.relations.len());
    for relation in &shape.relations {
        let search_path = match (&relation.schema, session.search_path) {
            (Some(_), _) => &[][..],
            (None, Some(path)) => path,
            (None, None) => return None,
        };
        tables.push(map.table(relation.schema.as_deref(), &relation.name, search_path)?);
    }
    let writes = shape.kind != Kind::Select;
    if writes && !matches!(tables[0].kind, TableKind::Distributed { .. }) {
        return None;
    }
    // Lookups are kept by the metadata node, in the write's transaction.
    if writes && tables.iter().any(|t| t.writes_via_metadata()) {
        return None;
    }
    // Reads first: a read running on its own may go where the map's read
    // routes send it; a transaction's statements stay with its writes.
    let read_routed = !writes && !shape.locks_rows && session.outside_transaction;
    if let [table] = tables.as_slice() {
        if let Some(route) = route_one_table(
            shape,
            sql,
            normalized,
            table,
            parameters,
            (writes, read_routed),
        ) {
            // A read by a looked-up column: two hops, the lookup first.
            if route.is_none() && read_routed && !table.lookups.is_empty() {
                let hop =
                    super::lookup_route::lookup_hop(shape, normalized, table, map, parameters);
                return hop.map(Route::Lookup);
            }
            return route;
        }
    }
    // Which relation each column reference means.
    let resolve = |column: &ColumnRef| -> Option<usize> {
        match &column.qualifier {
            Some(qualifier) => {
                let mut found = shape
                    .relations
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.reference_name() == qualifier);
                let first = found.next()?;
                found.next().is_none().then_some(first.0)
            }
            None => {
                let mut found = tables.iter().enumerate().filter(|(_, t)| {
                    matches!(&t.kind, TableKind::Distributed { column: c, .. } if *c == column.column)
                });
                let first = found.next()?;
                found.next().is_none().then_some(first.0)
            }
        }
    };
    let mut classes = EquivalenceClasses::default();
    let mut bound: Vec<(usize, &Vec<Value>)> = Vec::new();
    for fact in &shape.facts {
        match fact {
            Fact::Equal(a, b) => {
                let (Some(ra), Some(rb)) = (resolve(a), resolve(b)) else {
                    continue;
                };
                let (ca, cb) = (classes.member(ra, &a.column), classes.member(rb, &b.column));
                classes.join(ca, cb);
            }
            Fact::OneOf(column, values) => {
                if let Some(r) = resolve(column) {
                    bound.push((classes.member(r, &column.column), values));
                }
            }
        }
    }
    let mut node: Option<NodeId> = None;
    let mut shard_of: Vec<Option<String>> = vec![None; shape.relations.len()];
    let mut first_shard = None;
    let mut first_key = None;
    let mut any_distributed = false;
    for (index, table) in tables.iter().enumerate() {
        let TableKind::Distributed {
            column,
            encoding,
            shards,
            reads,
        } = &table.kind
        else {
            continue;
        };
        let shards = serving(shards, reads, read_routed);
        any_distributed = true;
        let values: Vec<&Value> = if index == 0 && shape.kind == Kind::Insert {
            insert_keys(shape.insert.as_ref()?, table, column)?
        } else {
            let own = classes.member(index, column);
            let class = classes.class(own);
            let candidates = bound
                .iter()
                .filter(|(c, _)| classes.class(*c) == class)
                .map(|(_, values)| *values)
                .min_by_key(|values| values.len())?;
            candidates.iter().collect()
        };
        let (placement, id) = one_shard(
            &values,
            |value| key_id(value, *encoding, normalized, parameters),
            shards,
        )?;
        if *node.get_or_insert(placement.node) != placement.node {
            return None;
        }
        first_shard.get_or_insert(placement.shard_id);
        if first_key.is_none() {
            first_key = routed_key(table, id, &values, *encoding, normalized, parameters);
        }
        shard_of[index] = Some(placement.qualified_name.clone());
    }
    // A write must not move a row: the key is not assigned.
    if writes {
        if let TableKind::Distributed { column, .. } = &tables[0].kind {
            if shape.assigned.iter().any(|c| c == column) {
                return None;
            }
        }
    }
    if !any_distributed {
        let mut rewrites = HashMap::new();
        for node in map.nodes.keys() {
            let mut names = Vec::new();
            for table in &tables {
                let TableKind::Reference { copies } = &table.kind else {
                    return None;
                };
                names.push(copies.get(node)?.clone());
            }
            rewrites.insert(*node, rewrite(sql, normalized, &shape.relations, &names)?);
        }
        return Some(Route::ReferenceOnly { rewrites });
    }
    let node = node?;
    let mut names = Vec::with_capacity(tables.len());
    for (index, table) in tables.iter().enumerate() {
        match &table.kind {
            TableKind::Distributed { .. } => names.push(shard_of[index].clone()?),
            TableKind::Reference { copies } => names.push(copies.get(&node)?.clone()),
        }
    }
    Some(Route::Worker {
        node,
        sql: rewrite(sql, normalized, &shape.relations, &names)?,
        shard: first_shard,
        writes,
        key: first_key,
    })
}

/// The first of `values` (whose keyspace id is `id`) as the key the
/// hot-key sketch counts.
fn routed_key(
    table: &std::sync::Arc<crate::backend::cluster::Table>,
    id: KeyspaceId,
    values: &[&Value],
    encoding: KeyEncoding,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<RoutedKey> {
    Some(RoutedKey {
        table: table.clone(),
        id,
        value: key_value(values.first()?, encoding, normalized, parameters)?,
    })
}

/// The common case without joins, without building equivalence classes:
/// Some(route) when decided, None to take the general path (a reference
/// table, or facts that need it).
fn route_one_table(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    table: &std::sync::Arc<crate::backend::cluster::Table>,
    parameters: Option<&Parameters<'_>>,
    (writes, read_routed): (bool, bool),
) -> Option<Option<Route>> {
    let TableKind::Distributed {
        column,
        encoding,
        shards,
        reads,
    } = &table.kind
    else {
        return None;
    };
    let shards = serving(shards, reads, read_routed);
    let relation = &shape.relations[0];
    let means_key = |c: &ColumnRef| {
        c.column == *column
            && c.qualifier
                .as_deref()
                .is_none_or(|q| q == relation.reference_name())
    };
    // Equalities between columns could fix the key through another
    // column: the general path handles them.
    if shape
        .facts
        .iter()
        .any(|f| matches!(f, Fact::Equal(a, b) if means_key(a) || means_key(b)))
    {
        return None;
    }
    let decided = (|| {
        if writes && shape.assigned.iter().any(|c| c == column) {
            return None;
        }
        let values_of = |means: &dyn Fn(&ColumnRef) -> bool| -> Option<Vec<&Value>> {
            let values = shape
                .facts
                .iter()
                .filter_map(|f| match f {
                    Fact::OneOf(c, values) if means(c) => Some(values),
                    _ => None,
                })
                .min_by_key(|values| values.len())?;
            Some(values.iter().collect())
        };
        let by_key = |values: Vec<&Value>| {
            let (placement, id) = one_shard(
                &values,
                |value| key_id(value, *encoding, normalized, parameters),
                shards,
            )?;
            Some((
                placement,
                routed_key(table, id, &values, *encoding, normalized, parameters),
            ))
        };
        let (placement, key) = if shape.kind == Kind::Insert {
            by_key(insert_keys(shape.insert.as_ref()?, table, column)?)?
        } else if let Some(values) = values_of(&means_key) {
            by_key(values)?
        } else {
            // No key: `id = value` on a column of self-routing ids, whose
            // prefix names one shard (boundaries stay aligned to it).
            let routing = table.routing_column.as_deref()?;
            let means_id = |c: &ColumnRef| {
                c.column == routing
                    && c.qualifier
                        .as_deref()
                        .is_none_or(|q| q == relation.reference_name())
            };
            let values = values_of(&means_id)?;
            // (Not a key: an id names a prefix, not a tenant.)
            let (placement, _) = one_shard(
                &values,
                |value| routing_id_key(value, normalized, parameters),
                shards,
            )?;
            (placement, None)
        };
        on_shard(placement, shape, sql, normalized, writes, key)
    })();
    Some(decided)
}

/// A one-table statement on one shard: its text with the shard table's
/// name, on the shard's worker.
pub(super) fn on_shard(
    placement: &crate::backend::cluster::ShardPlacement,
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    writes: bool,
    key: Option<RoutedKey>,
) -> Option<Route> {
    Some(Route::Worker {
        node: placement.node,
        sql: rewrite(
            sql,
            normalized,
            &shape.relations,
            std::slice::from_ref(&placement.qualified_name),
        )?,
        shard: Some(placement.shard_id),
        writes,
        key,
    })
}

/// The map a statement is routed by: the reads map while read routes are
/// published and the statement may follow them, else the owners'.
pub(super) fn serving<'m>(
    shards: &'m ShardMap<crate::backend::cluster::ShardPlacement>,
    reads: &'m Option<ShardMap<crate::backend::cluster::ShardPlacement>>,
    read_routed: bool,
) -> &'m ShardMap<crate::backend::cluster::ShardPlacement> {
    match reads {
        Some(reads) if read_routed => reads,
        _ => shards,
    }
}

/// The one shard that owns every value, if there is one and every value's
/// keyspace id (`id_of`) is known; with the first value's keyspace id.
fn one_shard<'m>(
    values: &[&Value],
    id_of: impl Fn(&Value) -> Option<KeyspaceId>,
    shards: &'m ShardMap<crate::backend::cluster::ShardPlacement>,
) -> Option<(&'m crate::backend::cluster::ShardPlacement, KeyspaceId)> {
    let mut placement: Option<&crate::backend::cluster::ShardPlacement> = None;
    let mut first = None;
    for value in values {
        let id = id_of(value)?;
        first.get_or_insert(id);
        let (_, found) = shards.lookup(id);
        match placement {
            None => placement = Some(found),
            Some(p) if p.shard_id == found.shard_id => {}
            Some(_) => return None,
        }
    }
    Some((placement?, first?))
}
