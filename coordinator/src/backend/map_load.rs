//! Reading one database's shard map from the metadata node's catalog, in
//! one snapshot, over a connection that searches only pg_catalog.

use crate::backend::cluster_map::{
    ClusterMap, Lookup, MapError, Node, NodeId, ShardPlacement, Table, TableKind,
};
use crate::backend::connection::ServerAddress;
use pg_shard_core::quote;
use pg_shard_core::{KeyEncoding, KeyRange, KeyspaceId, ShardMap};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Reads the map; `functions`: the catalog's functions as known already
/// (None: read them too).
pub(super) async fn load(
    client: &tokio_postgres::Client,
    functions: Option<Arc<HashSet<String>>>,
) -> Result<ClusterMap, MapError> {
    let mut map = ClusterMap::default();
    map.catalog_functions = match functions {
        Some(functions) => functions,
        None => Arc::new(
            client
                .query(
                    "SELECT p.proname::text FROM pg_catalog.pg_proc p \
                     WHERE p.pronamespace = 'pg_catalog'::regnamespace",
                    &[],
                )
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect(),
        ),
    };
    // One snapshot for the whole map, its queries sent together and
    // unprepared (a map is read while writers wait for it at a shard
    // move's cutover): two round trips, the first asking whether the
    // extension (and its read routes, which an older metadata node lacks)
    // is there.
    let (_, installed, catalog_tables) = tokio::try_join!(
        client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        client.query_typed_opt(EXTENSION_INSTALLED, &[]),
        client.query_typed_one(
            "SELECT pg_catalog.to_regclass('pg_shard.read_route') IS NOT NULL, \
                    pg_catalog.to_regclass('pg_shard.lookup') IS NOT NULL",
            &[],
        ),
    )?;
    if installed.is_none() {
        client.batch_execute("COMMIT").await?;
        return Ok(map);
    }
    let has_read_routes: bool = catalog_tables.get(0);
    let has_lookups: bool = catalog_tables.get(1);
    let (version, nodes, tables, placements, same_names, read_routes, lookups, _) = tokio::try_join!(
        // No row until the map first changes: version 0 (pg_shard_catalog.sql).
        client.query_typed_one(
            "SELECT coalesce((SELECT version FROM pg_shard.map_state), 0)",
            &[]
        ),
        client.query_typed(
            "SELECT node_id, host, port FROM pg_shard.node WHERE state = 'active'",
            &[],
        ),
        client.query_typed(
            "SELECT t.table_rel::oid, n.nspname::text, c.relname::text, t.kind, t.dist_column, \
                    t.colocation_id, g.key_encoding, \
                    ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                          WHERE a.attrelid = t.table_rel AND a.attnum > 0 AND NOT a.attisdropped \
                          ORDER BY a.attnum), \
                    ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                          WHERE a.attrelid = t.table_rel AND a.attnum > 0 AND NOT a.attisdropped \
                            AND (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '')), \
                    ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                          WHERE a.attrelid = t.table_rel AND a.attnum > 0 AND NOT a.attisdropped \
                            AND a.attgenerated <> ''), \
                    (SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                     WHERE a.attrelid = t.table_rel AND a.attnum = t.routing_attnum) \
             FROM pg_shard.logical_table t \
             JOIN pg_catalog.pg_class c ON c.oid = t.table_rel \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_shard.colocation_group g ON g.colocation_id = t.colocation_id",
            &[],
        ),
        client.query_typed(
            "SELECT s.table_rel::oid, s.shard_id, s.shard_schema, s.shard_name, \
                    sg.range_start, sg.range_end, p.node_id, p.state, sg.shard_group_id \
             FROM pg_shard.shard s \
             JOIN pg_shard.shard_group sg ON sg.shard_group_id = s.shard_group_id \
             JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id \
             WHERE p.state <> 'retired' \
             ORDER BY p.state = 'active' DESC",
            &[],
        ),
        client.query_typed(
            "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname IN (SELECT t.relname FROM pg_catalog.pg_class t \
                                 WHERE t.oid IN (SELECT table_rel FROM pg_shard.logical_table)) \
               AND c.oid NOT IN (SELECT table_rel FROM pg_shard.logical_table) \
               AND c.relkind IN ('r', 'v', 'm', 'f', 'p', 'S')",
            &[],
        ),
        async {
            if !has_read_routes {
                return Ok(Vec::new());
            }
            client
                .query_typed(
                    "SELECT r.table_rel::oid, r.shard_id, r.shard_schema, r.shard_name, \
                            r.range_start, r.range_end, r.node_id \
                     FROM pg_shard.read_route r",
                    &[],
                )
                .await
        },
        async {
            if !has_lookups {
                return Ok(Vec::new());
            }
            client
                .query_typed(
                    "SELECT l.table_rel::oid, a.attname::text, n.nspname::text, c.relname::text, \
                            l.lookup_rel::oid \
                     FROM pg_shard.lookup l \
                     JOIN pg_catalog.pg_attribute a \
                       ON a.attrelid = l.table_rel AND a.attnum = l.column_attnum \
                     JOIN pg_catalog.pg_class c ON c.oid = l.lookup_rel \
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace",
                    &[],
                )
                .await
        },
        // (Sent after the queries: it ends their snapshot.)
        client.batch_execute("COMMIT"),
    )?;
    map.version = version.get(0);
    for row in nodes {
        let id: i32 = row.get(0);
        let port: i32 = row.get(2);
        map.nodes.insert(
            id,
            Node {
                address: ServerAddress {
                    host: row.get(1),
                    port: port as u16,
                },
            },
        );
    }
    for row in same_names {
        map.same_names.insert((row.get(0), row.get(1)));
    }
    map.read_routes = !read_routes.is_empty();

    type Ranges = Vec<(KeyRange, ShardPlacement)>;
    let mut ranges: HashMap<u32, Ranges> = HashMap::new();
    let mut copies: HashMap<u32, HashMap<NodeId, String>> = HashMap::new();
    for row in &placements {
        let table: u32 = row.get(0);
        let name = quote::qualified(row.get(2), row.get(3));
        let node: i32 = row.get(6);
        let start = KeyspaceId::from_sql(row.get(4));
        let end = KeyspaceId::from_sql(row.get(5));
        let placement = ShardPlacement {
            shard_id: row.get(1),
            qualified_name: name.clone(),
            node,
        };
        copies.entry(table).or_default().insert(node, name);
        let entries = ranges.entry(table).or_default();
        // Active placements sort first: keep one placement per range.
        if !entries.iter().any(|(range, _)| range.start == start) {
            if let Ok(range) = KeyRange::new(start, end) {
                entries.push((range, placement));
            }
        }
    }
    let mut read_ranges: HashMap<u32, Ranges> = HashMap::new();
    for row in &read_routes {
        let (start, end) = (
            KeyspaceId::from_sql(row.get(4)),
            KeyspaceId::from_sql(row.get(5)),
        );
        if let Ok(range) = KeyRange::new(start, end) {
            read_ranges.entry(row.get(0)).or_default().push((
                range,
                ShardPlacement {
                    shard_id: row.get(1),
                    qualified_name: quote::qualified(row.get(2), row.get(3)),
                    node: row.get(6),
                },
            ));
        }
    }
    let mut lookups_of: HashMap<u32, Vec<Lookup>> = HashMap::new();
    let mut lookup_tables: HashSet<u32> = HashSet::new();
    for row in &lookups {
        lookups_of.entry(row.get(0)).or_default().push(Lookup {
            column: row.get(1),
            table: (row.get(2), row.get(3)),
        });
        lookup_tables.insert(row.get(4));
    }
    for row in tables {
        let oid: u32 = row.get(0);
        let schema: String = row.get(1);
        let name: String = row.get(2);
        let kind: String = row.get(3);
        let columns: Vec<String> = row.get(7);
        let filled: Vec<String> = row.get(8);
        let generated: Vec<String> = row.get(9);
        let kind = if kind == "distributed" {
            let encoding_name: Option<String> = row.get(6);
            let encoding_name = encoding_name.unwrap_or_default();
            let encoding = KeyEncoding::from_name(&encoding_name)
                .ok_or_else(|| MapError::Encoding(name.clone(), encoding_name.clone()))?;
            let shards = ShardMap::new(map.version, ranges.remove(&oid).unwrap_or_default())
                .map_err(|e| MapError::Invalid(name.clone(), e))?;
            let reads = read_ranges
                .remove(&oid)
                .and_then(|routes| read_map(&shards, routes));
            TableKind::Distributed {
                column: row.get::<_, Option<String>>(4).unwrap_or_default(),
                encoding,
                shards,
                reads,
            }
        } else {
            TableKind::Reference {
                copies: copies.remove(&oid).unwrap_or_default(),
            }
        };
        map.tables.insert(
            (schema.clone(), name.clone()),
            Arc::new(Table {
                schema,
                name,
                kind,
                columns,
                filled_columns: filled.into_iter().collect(),
                generated_columns: generated.into_iter().collect(),
                routing_column: row.get(10),
                lookups: lookups_of.remove(&oid).unwrap_or_default(),
                is_lookup: lookup_tables.contains(&oid),
            }),
        );
    }
    Ok(map)
}

/// The map for reads while read routes send some ranges elsewhere: the
/// owners' ranges that no route overlaps, and the routes. None when they
/// do not cover the keyspace exactly once (a map read between a job's
/// changes): reads then go with the writes.
fn read_map(
    shards: &ShardMap<ShardPlacement>,
    routes: Vec<(KeyRange, ShardPlacement)>,
) -> Option<ShardMap<ShardPlacement>> {
    let overlaps = |a: &KeyRange, b: &KeyRange| a.start <= b.end && b.start <= a.end;
    let mut entries: Vec<(KeyRange, ShardPlacement)> = shards
        .entries()
        .iter()
        .filter(|(range, _)| !routes.iter().any(|(route, _)| overlaps(range, route)))
        .cloned()
        .collect();
    entries.extend(routes);
    ShardMap::new(shards.version(), entries).ok()
}

/// A row when the database has the pg_shard extension.
pub(super) const EXTENSION_INSTALLED: &str =
    "SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_shard'";

pub(super) type CatalogConnection =
    tokio_postgres::Connection<tokio_postgres::Socket, super::catalog_tls::CatalogTlsStream>;

/// A connection to the metadata node's catalog in `database`.
pub(super) async fn connect_catalog(
    metadata: &ServerAddress,
    user: &str,
    password: Option<&str>,
    database: &str,
    application: &str,
) -> Result<(tokio_postgres::Client, CatalogConnection), tokio_postgres::Error> {
    use super::catalog_tls::CatalogTls;
    use crate::config::ServerTlsMode;
    use tokio_postgres::config::SslMode;
    let tls = super::connection::server_tls();
    let mut config = tokio_postgres::Config::new();
    config
        .host(&metadata.host)
        .port(metadata.port)
        .user(user)
        .dbname(database)
        .application_name(application)
        // Whatever the role's or database's defaults: no operator or
        // function planted in a schema on their search_path is run here.
        .options("-c search_path=pg_catalog,pg_temp")
        .password(password.unwrap_or_default())
        .connect_timeout(Duration::from_secs(10))
        .ssl_mode(match super::connection::server_tls_mode() {
            ServerTlsMode::Disable => SslMode::Disable,
            ServerTlsMode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        });
    match config.connect(CatalogTls::new(tls)).await {
        // libpq's prefer: a handshake that fails (a certificate or cipher
        // rustls cannot use) is tried again without TLS
        Err(e)
            if config.get_ssl_mode() == SslMode::Prefer
                && e.to_string().starts_with("error performing TLS handshake") =>
        {
            config
                .ssl_mode(SslMode::Disable)
                .connect(CatalogTls::new(tls))
                .await
        }
        connected => connected,
    }
}
