//! A shard map brought to the next version from what its announcement
//! says changed (the metadata node's `map_change`: the shards of the
//! groups a move, a split or a revert rewrote), without reading the
//! catalog: the writers a cutover refused wait for exactly this map.
//! Anything the announcement does not cover (another version in hand,
//! read routes, a table not known) is left to a full read.

use crate::backend::cluster_map::{ClusterMap, ShardPlacement, Table, TableKind};
use pg_shard_core::quote;
use pg_shard_core::{KeyRange, KeyspaceId, ShardMap};
use serde_json::Value;
use std::sync::Arc;

/// `current` at `version` with `change` applied (the JSON object after the
/// version in the announcement); None when it does not apply: `current`
/// is not the version just before, has read routes, or the change names
/// something it does not know or leaves a table's ranges broken.
pub fn patched(current: &ClusterMap, version: i64, change: &str) -> Option<ClusterMap> {
    if version != current.version + 1 || current.read_routes || current.tables.is_empty() {
        return None;
    }
    let change: Value = serde_json::from_str(change).ok()?;
    let mut tables = current.tables.clone();
    for table_change in change.get("tables")?.as_array()? {
        let key = (
            table_change.get("schema")?.as_str()?.to_string(),
            table_change.get("name")?.as_str()?.to_string(),
        );
        let table = tables.get(&key)?;
        let TableKind::Distributed {
            column,
            encoding,
            shards,
            reads: None,
        } = &table.kind
        else {
            return None;
        };
        let changed = KeyRange::new(
            keyspace_id(table_change.get("start")?)?,
            keyspace_id(table_change.get("end")?)?,
        )
        .ok()?;
        // The ranges outside the change stay; the change's shards cover
        // the rest (one placement per range, the active one first, as a
        // full read keeps them).
        let mut entries: Vec<(KeyRange, ShardPlacement)> = shards
            .entries()
            .iter()
            .filter(|(range, _)| range.end < changed.start || range.start > changed.end)
            .cloned()
            .collect();
        let kept = entries.len();
        for shard in table_change.get("shards")?.as_array()? {
            let (range, placement) = placement(shard)?;
            if !current.nodes.contains_key(&placement.node) {
                return None;
            }
            if range.start < changed.start || range.end > changed.end {
                return None;
            }
            if !entries[kept..].iter().any(|(r, _)| r.start == range.start) {
                entries.push((range, placement));
            }
        }
        let shards = ShardMap::new(version, entries).ok()?;
        let patched = Table {
            kind: TableKind::Distributed {
                column: column.clone(),
                encoding: *encoding,
                shards,
                reads: None,
            },
            ..Table::clone(table)
        };
        tables.insert(key, Arc::new(patched));
    }
    Some(ClusterMap {
        version,
        nodes: current.nodes.clone(),
        tables,
        catalog_functions: current.catalog_functions.clone(),
        same_names: current.same_names.clone(),
        read_routes: false,
    })
}

/// `[range_start, range_end, shard_id, node_id, shard_schema, shard_name]`.
fn placement(shard: &Value) -> Option<(KeyRange, ShardPlacement)> {
    let fields = shard.as_array()?;
    let [start, end, shard_id, node, schema, name] = fields.as_slice() else {
        return None;
    };
    let range = KeyRange::new(keyspace_id(start)?, keyspace_id(end)?).ok()?;
    Some((
        range,
        ShardPlacement {
            shard_id: shard_id.as_i64()?,
            qualified_name: quote::qualified(schema.as_str()?, name.as_str()?),
            node: i32::try_from(node.as_i64()?).ok()?,
        },
    ))
}

/// A keyspace id as the catalog stores it (a signed bigint).
fn keyspace_id(value: &Value) -> Option<KeyspaceId> {
    value.as_i64().map(KeyspaceId::from_sql)
}

/// Where `patched` routes differently from `loaded` (the same version read
/// in full): the first table whose shards differ, or a table one of them
/// lacks. None when they agree.
pub fn difference(patched: &ClusterMap, loaded: &ClusterMap) -> Option<String> {
    if patched.version != loaded.version {
        return None;
    }
    for (key, table) in &loaded.tables {
        let Some(other) = patched.tables.get(key) else {
            return Some(format!("{}.{} is missing", key.0, key.1));
        };
        let same = match (&table.kind, &other.kind) {
            (
                TableKind::Distributed { shards: a, .. },
                TableKind::Distributed { shards: b, .. },
            ) => {
                a.len() == b.len()
                    && a.entries()
                        .iter()
                        .zip(b.entries())
                        .all(|((ra, pa), (rb, pb))| {
                            ra == rb
                                && pa.shard_id == pb.shard_id
                                && pa.node == pb.node
                                && pa.qualified_name == pb.qualified_name
                        })
            }
            (TableKind::Reference { copies: a }, TableKind::Reference { copies: b }) => a == b,
            _ => false,
        };
        if !same {
            return Some(format!("{}.{} has other shards", key.0, key.1));
        }
    }
    (patched.tables.len() != loaded.tables.len()).then(|| "another set of tables".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster_map::Node;
    use crate::backend::connection::ServerAddress;
    use pg_shard_core::KeyEncoding;
    use std::collections::{HashMap, HashSet};

    fn node(port: u16) -> Node {
        Node {
            address: ServerAddress {
                host: "127.0.0.1".into(),
                port,
            },
        }
    }

    fn range(start: i64, end: i64) -> KeyRange {
        KeyRange::new(KeyspaceId::from_sql(start), KeyspaceId::from_sql(end)).unwrap()
    }

    fn shard(id: i64, node: i32) -> ShardPlacement {
        ShardPlacement {
            shard_id: id,
            qualified_name: quote::qualified("public", &format!("t_{id}")),
            node,
        }
    }

    /// Version 7: `public.t` in two shards, 1 on node 1 and 2 on node 2.
    fn map() -> ClusterMap {
        let shards = ShardMap::new(
            7,
            vec![
                (range(i64::MIN, -1), shard(1, 1)),
                (range(0, i64::MAX), shard(2, 2)),
            ],
        )
        .unwrap();
        let table = Table {
            schema: "public".into(),
            name: "t".into(),
            kind: TableKind::Distributed {
                column: "id".into(),
                encoding: KeyEncoding::Integer,
                shards,
                reads: None,
            },
            columns: vec!["id".into()],
            filled_columns: HashSet::new(),
            generated_columns: HashSet::new(),
            routing_column: None,
            lookups: Vec::new(),
            is_lookup: false,
        };
        ClusterMap {
            version: 7,
            nodes: HashMap::from([(1, node(1)), (2, node(2))]),
            tables: HashMap::from([(("public".into(), "t".into()), Arc::new(table))]),
            ..ClusterMap::default()
        }
    }

    fn owners(map: &ClusterMap) -> Vec<(i64, i64, i32)> {
        let TableKind::Distributed { shards, .. } =
            &map.tables[&("public".into(), "t".into())].kind
        else {
            panic!("not distributed")
        };
        shards
            .entries()
            .iter()
            .map(|(r, p)| (r.start.to_sql(), p.shard_id, p.node))
            .collect()
    }

    #[test]
    fn a_move_changes_the_node_of_its_range() {
        let change = r#"{"tables": [{"schema": "public", "name": "t", "start": 0,
            "end": 9223372036854775807, "shards": [[0, 9223372036854775807, 2, 1, "public", "t_2"]]}]}"#;
        let moved = patched(&map(), 8, change).unwrap();
        assert_eq!(moved.version, 8);
        assert_eq!(owners(&moved), vec![(i64::MIN, 1, 1), (0, 2, 1)]);
    }

    #[test]
    fn a_split_replaces_a_range_by_its_halves() {
        let change = r#"{"tables": [{"schema": "public", "name": "t", "start": 0,
            "end": 9223372036854775807, "shards": [[0, 99, 3, 2, "public", "t_3"],
            [100, 9223372036854775807, 4, 2, "public", "t_4"]]}]}"#;
        let split = patched(&map(), 8, change).unwrap();
        assert_eq!(
            owners(&split),
            vec![(i64::MIN, 1, 1), (0, 3, 2), (100, 4, 2)]
        );
        assert_eq!(difference(&split, &split), None);
        assert_eq!(
            difference(&split, &map_at(8)),
            Some("public.t has other shards".into())
        );
    }

    fn map_at(version: i64) -> ClusterMap {
        ClusterMap { version, ..map() }
    }

    #[test]
    fn what_does_not_apply_is_left_to_a_full_read() {
        let change = r#"{"tables": [{"schema": "public", "name": "t", "start": 0,
            "end": 9223372036854775807, "shards": [[0, 9223372036854775807, 2, 1, "public", "t_2"]]}]}"#;
        // Not the next version.
        assert!(patched(&map(), 9, change).is_none());
        // A node the map does not know.
        assert!(patched(
            &map(),
            8,
            &change.replace("2, 1, \"public\"", "2, 5, \"public\"")
        )
        .is_none());
        // A table it does not know.
        assert!(patched(&map(), 8, &change.replace("\"t\"", "\"u\"")).is_none());
        // A gap left in the keyspace.
        assert!(patched(&map(), 8, &change.replace("[[0, ", "[[5, ")).is_none());
        // A shard outside the range it says changed.
        let outside = change.replace("\"start\": 0", "\"start\": 10");
        assert!(patched(&map(), 8, &outside).is_none());
        // Not JSON of that shape.
        assert!(patched(&map(), 8, "{\"tables\": 3}").is_none());
        assert!(patched(&map(), 8, "names").is_none());
        // Read routes in hand.
        let mut routed = map();
        routed.read_routes = true;
        assert!(patched(&routed, 8, change).is_none());
    }
}
