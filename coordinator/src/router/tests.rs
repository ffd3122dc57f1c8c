//! Routing decisions for statements against a two-node map.
use super::footprint::Footprint;
use super::*;
use crate::backend::cluster::{ShardPlacement, Table};
use crate::backend::cluster_map::Node;
use crate::backend::connection::ServerAddress;
use pg_shard_core::range::equal_ranges;
use pg_shard_core::ShardMap;
use std::collections::HashSet;
use std::sync::Arc;

/// Two workers; `accounts` and `history` co-located (4 shards,
/// alternating nodes), `branches` a reference table.
pub(super) fn cluster() -> ClusterMap {
    let mut map = ClusterMap {
        version: 7,
        ..Default::default()
    };
    for id in [1, 2] {
        map.nodes.insert(
            id,
            Node {
                address: ServerAddress {
                    host: "127.0.0.1".into(),
                    port: 54320 + id as u16,
                },
            },
        );
    }
    let distributed = |name: &str, base: i64, filled: &[&str]| {
        let entries = equal_ranges(4)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, range)| {
                (
                    range,
                    ShardPlacement {
                        shard_id: base + i as i64,
                        qualified_name: format!("\"public\".\"{name}_{}\"", base + i as i64),
                        node: 1 + (i as i32 % 2),
                    },
                )
            })
            .collect();
        Arc::new(Table {
            schema: "public".into(),
            name: name.into(),
            kind: TableKind::Distributed {
                column: "aid".into(),
                encoding: KeyEncoding::Integer,
                shards: ShardMap::new(7, entries).unwrap(),
                reads: None,
            },
            columns: vec!["aid".into(), "bid".into(), "abalance".into()],
            filled_columns: filled.iter().map(|s| s.to_string()).collect(),
            generated_columns: HashSet::new(),
            routing_column: None,
            lookups: Vec::new(),
            is_lookup: false,
        })
    };
    map.tables.insert(
        ("public".into(), "accounts".into()),
        distributed("accounts", 100, &[]),
    );
    map.tables.insert(
        ("public".into(), "history".into()),
        distributed("history", 200, &["mtime"]),
    );
    map.tables.insert(
        ("public".into(), "branches".into()),
        Arc::new(Table {
            schema: "public".into(),
            name: "branches".into(),
            kind: TableKind::Reference {
                copies: [
                    (1, "\"public\".\"branches_300\"".to_string()),
                    (2, "\"public\".\"branches_300\"".to_string()),
                ]
                .into_iter()
                .collect(),
            },
            columns: vec!["bid".into()],
            filled_columns: HashSet::new(),
            generated_columns: HashSet::new(),
            routing_column: None,
            lookups: Vec::new(),
            is_lookup: false,
        }),
    );
    map.catalog_functions = Arc::new(
        ["now", "lower", "nextval", "count", "set_config"]
            .into_iter()
            .map(String::from)
            .collect(),
    );
    map
}

pub(super) fn route_text(sql: &str) -> Route {
    let map = cluster();
    let path = default_path("app");
    let session = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let normalized = crate::router::lexer::normalize(sql);
    match analyze(&normalized.key) {
        Analysis::Routable(shape) => route(&shape, sql, &normalized, &map, &session, None),
        _ => Route::Metadata,
    }
}

fn shard_of(aid: i64) -> (i32, i64) {
    let map = cluster();
    let TableKind::Distributed { shards, .. } =
        &map.tables[&("public".into(), "accounts".into())].kind
    else {
        unreachable!()
    };
    let (_, p) = shards.lookup(keyspace_id_of_int(aid));
    (p.node, p.shard_id)
}

#[test]
fn only_plain_reads_may_share_a_connection() {
    let multiplexable = |sql: &str| match analyze(sql) {
        Analysis::Routable(shape) => shape.multiplexable(),
        _ => false,
    };
    assert!(multiplexable(
        "SELECT abalance FROM accounts WHERE aid = $1"
    ));
    assert!(multiplexable(
        "SELECT count(*), max(abalance) FROM accounts WHERE aid = 1"
    ));
    assert!(multiplexable(
        "SELECT (aid + 1)::float8 / 3 FROM accounts WHERE aid = 1"
    ));
    // Row locks wait; writes wait for row locks; functions may write,
    // wait or change settings.
    assert!(!multiplexable(
        "SELECT abalance FROM accounts WHERE aid = 1 FOR UPDATE"
    ));
    assert!(!multiplexable(
        "SELECT abalance FROM accounts WHERE aid = 1 FOR KEY SHARE"
    ));
    assert!(!multiplexable(
        "UPDATE accounts SET abalance = 0 WHERE aid = 1"
    ));
    assert!(!multiplexable("INSERT INTO accounts (aid) VALUES (1)"));
    assert!(!multiplexable("DELETE FROM accounts WHERE aid = 1"));
    assert!(!multiplexable(
        "SELECT my_function(aid) FROM accounts WHERE aid = 1"
    ));
    assert!(!multiplexable(
        "SELECT public.count(aid) FROM accounts WHERE aid = 1"
    ));
    assert!(!multiplexable(
        "SELECT pg_sleep(1) FROM accounts WHERE aid = 1"
    ));
}

/// A read routed to `node` as `sql` on `shard`, by the key aid 42 of
/// accounts (which the hot-key sketch counts).
fn assert_worker(route: Route, node: i32, sql: &str, shard: i64) {
    match route {
        Route::Worker {
            node: n,
            sql: text,
            shard: s,
            writes: false,
            key: Some(key),
        } => {
            assert_eq!((n, text.as_str(), s), (node, sql, Some(shard)));
            assert_eq!(key.table.name, "accounts");
            assert_eq!(key.id, keyspace_id_of_int(42));
            assert_eq!(key.value, KeyValue::Integer(42));
            assert_eq!(key.value.to_string(), "42");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn point_select_goes_to_the_owner_with_the_shard_name() {
    let (node, shard) = shard_of(42);
    assert_worker(
        route_text("SELECT abalance FROM accounts WHERE aid = 42"),
        node,
        &format!(
            "SELECT abalance FROM \"public\".\"accounts_{shard}\" AS \"accounts\" WHERE aid = 42"
        ),
        shard,
    );
}

#[test]
fn aliases_and_qualified_names_are_kept() {
    let (node, shard) = shard_of(7);
    let Route::Worker { node: n, sql, .. } =
        route_text("select a.abalance from public.accounts a where a.aid = '7'")
    else {
        panic!("not routed");
    };
    assert_eq!(n, node);
    assert_eq!(
        sql,
        format!("select a.abalance from \"public\".\"accounts_{shard}\" a where a.aid = '7'")
    );
}

#[test]
fn co_located_join_and_reference_table() {
    let sql = "SELECT * FROM accounts a JOIN history h ON a.aid = h.aid JOIN branches b ON b.bid = a.bid WHERE h.aid = 5";
    let Route::Worker { sql: rewritten, .. } = route_text(sql) else {
        panic!("not routed");
    };
    assert!(rewritten.contains("branches_300"));
    assert!(rewritten.contains("history_2"));
}

#[test]
fn what_goes_to_the_metadata_node() {
    for sql in [
        "SELECT * FROM accounts",                                   // no key
        "SELECT * FROM accounts WHERE aid = 1 OR aid = 2",          // OR
        "SELECT * FROM accounts WHERE aid > 5",                     // range
        "SELECT * FROM accounts a LEFT JOIN history h ON a.aid = h.aid WHERE a.aid = 1", // outer join
        "SELECT * FROM accounts WHERE aid = (SELECT 1)",            // subquery
        "WITH x AS (SELECT 1) SELECT * FROM accounts WHERE aid = 1", // CTE
        "SELECT * FROM local_table WHERE aid = 1",                  // unknown table
        "SELECT nextval('s') FROM accounts WHERE aid = 1",          // sequence
        "SELECT my_function() FROM accounts WHERE aid = 1",         // not pg_catalog
        "SELECT set_config('search_path', 'x', false) FROM accounts WHERE aid = 1",
        "UPDATE accounts SET aid = 2 WHERE aid = 1",                // moves a row
        "INSERT INTO accounts VALUES (1, 1, 0), (2, 1, 0), (3, 1, 0), (4, 1, 0), (5, 1, 0), (6, 1, 0)", // many shards
        "INSERT INTO history (aid, bid) VALUES (1, 1)",             // mtime default left out
        "INSERT INTO accounts SELECT * FROM accounts WHERE aid = 1", // INSERT … SELECT
        "INSERT INTO accounts VALUES (DEFAULT, 1, 0)",
        "UPDATE branches SET bid = 1",                              // reference write
        "SELECT * FROM accounts WHERE aid = 1.5",                   // not an integer
        "SELECT * FROM accounts WHERE aid = 1::numeric",
        "SELECT * FROM accounts WHERE aid = 1; SELECT 1",
        "SELECT * FROM accounts a, accounts b WHERE a.aid = 1",     // b not fixed
        "SELECT * FROM accounts WHERE aid IN (1, 2, 3, 4, 5, 6, 7, 8)",
        "SELECT * INTO copy FROM accounts WHERE aid = 1",
        "SELECT 1 FROM accounts WHERE aid = 1 UNION SELECT 2",
        "EXPLAIN SELECT * FROM accounts",
    ] {
        assert_eq!(route_text(sql), Route::Metadata, "{sql}");
    }
}

#[test]
fn writes_by_key_are_routed() {
    for sql in [
        "UPDATE accounts SET abalance = abalance + 5 WHERE aid = 3",
        "DELETE FROM accounts WHERE aid = 3 RETURNING *",
        "INSERT INTO accounts (aid, bid, abalance) VALUES (3, 1, 0) ON CONFLICT (aid) DO UPDATE SET abalance = 1",
        "INSERT INTO accounts VALUES (3, 1, 0)",
        "INSERT INTO history (aid, bid, mtime) VALUES (3, 1, now())",
    ] {
        assert!(matches!(route_text(sql), Route::Worker { writes: true, .. }), "{sql}");
    }
}

#[test]
fn explain_goes_where_the_statement_goes() {
    let (node, shard) = shard_of(42);
    assert_worker(
        route_text("EXPLAIN (COSTS OFF) SELECT * FROM accounts WHERE aid = 42"),
        node,
        &format!("EXPLAIN (COSTS OFF) SELECT * FROM \"public\".\"accounts_{shard}\" AS \"accounts\" WHERE aid = 42"),
        shard,
    );
}

#[test]
fn reference_only_reads_can_go_anywhere() {
    assert!(matches!(
        route_text("SELECT * FROM branches"),
        Route::ReferenceOnly { .. }
    ));
}

#[test]
fn parameters_route_by_their_values() {
    let sql = "SELECT abalance FROM accounts WHERE aid = $1";
    let Analysis::Routable(shape) = analyze(sql) else {
        panic!()
    };
    let normalized = crate::router::lexer::normalize(sql);
    let map = cluster();
    let path = default_path("app");
    let session = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let (node, shard) = shard_of(99);
    let text_value = [Some(bytes::Bytes::from_static(b"99"))];
    let text = Parameters {
        values: &text_value,
        formats: &|_| 0,
        declared_types: &[],
    };
    let binary_value = [Some(bytes::Bytes::copy_from_slice(&99i32.to_be_bytes()))];
    let binary = Parameters {
        values: &binary_value,
        formats: &|_| 1,
        declared_types: &[23],
    };
    for parameters in [&text, &binary] {
        assert!(matches!(
            route(&shape, sql, &normalized, &map, &session, Some(parameters)),
            Route::Worker { node: n, shard: Some(s), .. } if n == node && s == shard
        ));
    }
    // A binary numeric is not read as an integer.
    let numeric = Parameters {
        values: &binary_value,
        formats: &|_| 1,
        declared_types: &[1700],
    };
    assert_eq!(
        route(&shape, sql, &normalized, &map, &session, Some(&numeric)),
        Route::Metadata
    );
    // No parameters (Describe before Bind), a NULL: the metadata node.
    assert_eq!(
        route(&shape, sql, &normalized, &map, &session, None),
        Route::Metadata
    );
    let null = Parameters {
        values: &[None],
        formats: &|_| 0,
        declared_types: &[],
    };
    assert_eq!(
        route(&shape, sql, &normalized, &map, &session, Some(&null)),
        Route::Metadata
    );
}

#[test]
fn transaction_and_admin_statements() {
    assert!(matches!(
        analyze("begin"),
        Analysis::Transaction(TransactionCommand::Begin)
    ));
    assert!(matches!(
        analyze("START TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
        Analysis::Transaction(TransactionCommand::Begin)
    ));
    assert!(matches!(
        analyze("END"),
        Analysis::Transaction(TransactionCommand::Commit)
    ));
    assert!(matches!(
        analyze("COMMIT AND CHAIN"),
        Analysis::Transaction(TransactionCommand::Other)
    ));
    assert!(matches!(
        analyze("SAVEPOINT \"Mixed Case\""),
        Analysis::Savepoint(Savepoint::Define(name)) if name == "Mixed Case"
    ));
    assert!(matches!(
        analyze("release s1"),
        Analysis::Savepoint(Savepoint::Release(name)) if name == "s1"
    ));
    assert!(matches!(
        analyze("ROLLBACK TO SAVEPOINT S1"),
        Analysis::Savepoint(Savepoint::RollbackTo(name)) if name == "s1"
    ));
    assert!(matches!(
        analyze("ROLLBACK TO s1"),
        Analysis::Savepoint(Savepoint::RollbackTo(_))
    ));
    assert!(matches!(
        analyze("DEALLOCATE ALL"),
        Analysis::Deallocate { name: None }
    ));
    assert!(matches!(
        analyze("DEALLOCATE PREPARE _pg3_0"),
        Analysis::Deallocate { name: Some(name) } if name == "_pg3_0"
    ));
    assert!(matches!(
        analyze("SHOW POOLS"),
        Analysis::Admin(AdminCommand::Pools)
    ));
    assert!(matches!(
        analyze("set search_path = x"),
        Analysis::SearchPath { temporary: false }
    ));
    assert!(matches!(
        analyze("CREATE TEMP TABLE accounts (aid int)"),
        Analysis::SearchPath { temporary: true }
    ));
    assert!(matches!(
        analyze("SET ROLE app"),
        Analysis::SearchPath { .. }
    ));
    assert!(matches!(
        analyze("SELECT now()"),
        Analysis::Other {
            tableless: true,
            ..
        }
    ));
    assert!(matches!(
        analyze("SELECT * FROM local_table UNION SELECT 1"),
        Analysis::Other {
            tableless: false,
            ..
        }
    ));
    assert!(matches!(
        analyze("DISCARD ALL"),
        Analysis::Other {
            keeps_state: true,
            ..
        }
    ));
    for kept in [
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "SELECT pg_advisory_lock(7)",
        "SELECT set_config('work_mem', '9MB', false)",
    ] {
        assert!(
            matches!(
                analyze(kept),
                Analysis::Other {
                    keeps_state: true,
                    ..
                }
            ),
            "{kept}"
        );
    }
    assert!(matches!(
        analyze("DECLARE c CURSOR FOR SELECT 1"),
        Analysis::Other {
            keeps_state: false,
            ..
        }
    ));
    assert!(matches!(analyze("SELEC 1"), Analysis::Unparsed));
}

#[test]
fn values_that_could_change_are_not_routed() {
    for sql in [
        // a short row leaves a filled column (mtime) to its default
        "INSERT INTO history VALUES (1, 1)",
        // column alias lists rename columns
        "SELECT * FROM accounts AS a(bid, aid) WHERE a.aid = 5",
        // constraint names differ on shard tables
        "INSERT INTO accounts VALUES (1, 1, 0) ON CONFLICT ON CONSTRAINT accounts_pkey DO NOTHING",
        // casts that change the value or its type
        "SELECT * FROM accounts WHERE aid = '05'::int::bigint",
        "SELECT * FROM accounts WHERE aid = 1e2",
        "SELECT * FROM accounts WHERE aid = 5::numeric::int",
    ] {
        assert_eq!(route_text(sql), Route::Metadata, "{sql}");
    }
}

#[test]
fn text_keys_take_literals_as_written_only() {
    let mut map = cluster();
    let shards = match &map.tables[&("public".to_string(), "accounts".to_string())].kind {
        TableKind::Distributed { shards, .. } => shards.clone(),
        _ => unreachable!(),
    };
    map.tables.insert(
        ("public".into(), "names".into()),
        Arc::new(Table {
            schema: "public".into(),
            name: "names".into(),
            kind: TableKind::Distributed {
                column: "k".into(),
                encoding: KeyEncoding::Text,
                shards,
                reads: None,
            },
            columns: vec!["k".into()],
            filled_columns: HashSet::new(),
            generated_columns: HashSet::new(),
            routing_column: None,
            lookups: Vec::new(),
            is_lookup: false,
        }),
    );
    let path = default_path("app");
    let session = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let route_of = |sql: &str| {
        let normalized = crate::router::lexer::normalize(sql);
        match analyze(&normalized.key) {
            Analysis::Routable(shape) => route(&shape, sql, &normalized, &map, &session, None),
            _ => Route::Metadata,
        }
    };
    for sql in [
        "SELECT * FROM names WHERE k = 007::text",
        "SELECT * FROM names WHERE k = 1e2::text",
        "SELECT * FROM names WHERE k = 'abcd'::varchar(2)",
        "SELECT * FROM names WHERE k = 42",
    ] {
        assert_eq!(route_of(sql), Route::Metadata, "{sql}");
    }
    for sql in [
        "SELECT * FROM names WHERE k = 'abc'",
        "SELECT * FROM names WHERE k = 'abc'::text",
        "SELECT * FROM names WHERE k = '007'::varchar",
    ] {
        assert!(matches!(route_of(sql), Route::Worker { .. }), "{sql}");
    }
}

#[test]
fn a_relation_in_the_users_schema_shadows_public() {
    let mut map = cluster();
    map.same_names.insert(("app".into(), "accounts".into()));
    let sql = "SELECT * FROM accounts WHERE aid = 1";
    let normalized = crate::router::lexer::normalize(sql);
    let Analysis::Routable(shape) = analyze(&normalized.key) else {
        panic!()
    };
    let (app_path, other_path) = (default_path("app"), default_path("other"));
    let as_app = Session {
        search_path: Some(&app_path),
        outside_transaction: true,
    };
    let as_other = Session {
        search_path: Some(&other_path),
        outside_transaction: true,
    };
    assert_eq!(
        route(&shape, sql, &normalized, &map, &as_app, None),
        Route::Metadata
    );
    assert!(matches!(
        route(&shape, sql, &normalized, &map, &as_other, None),
        Route::Worker { .. }
    ));
}

pub(super) fn default_path(user: &str) -> Vec<String> {
    crate::router::search_path::schemas("\"$user\", public", user).unwrap()
}

#[test]
fn names_resolve_along_the_sessions_search_path() {
    let mut map = cluster();
    // tenant_x.accounts: a table of its own (history's shards stand in).
    let tenant = map.tables[&("public".to_string(), "history".to_string())].clone();
    map.tables
        .insert(("tenant_x".into(), "accounts".into()), tenant);
    map.same_names
        .insert(("tenant_y".into(), "accounts".into()));
    let sql = "SELECT * FROM accounts WHERE aid = 1";
    let normalized = crate::router::lexer::normalize(sql);
    let Analysis::Routable(shape) = analyze(&normalized.key) else {
        panic!()
    };
    let routes = |path: Option<&[String]>| {
        route(
            &shape,
            sql,
            &normalized,
            &map,
            &Session {
                search_path: path,
                outside_transaction: true,
            },
            None,
        )
    };
    let path = |value: &str| crate::router::search_path::schemas(value, "app").unwrap();
    // tenant_y.accounts is an ordinary table: the node reads that one.
    assert_eq!(routes(Some(&path("tenant_y, public"))), Route::Metadata);
    let shard_table = |route: Route| match route {
        Route::Worker { sql, .. } => sql,
        other => panic!("not routed to a worker: {other:?}"),
    };
    // No relation of that name in "empty": public's is found.
    assert!(shard_table(routes(Some(&path("empty, public")))).contains("\"accounts_"));
    assert!(shard_table(routes(Some(&path("tenant_x, public")))).contains("\"history_"));
    assert!(shard_table(routes(Some(&path("public, tenant_x")))).contains("\"accounts_"));
    // Not on the path at all, or the path unknown.
    assert_eq!(routes(Some(&path("empty"))), Route::Metadata);
    assert_eq!(routes(None), Route::Metadata);
}

#[test]
fn footprints_tell_what_the_metadata_node_would_touch() {
    let map = cluster();
    let path = default_path("app");
    let session = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let of = |sql: &str| footprint(&analyze(sql), &map, &session);
    let reference_only = Footprint {
        distributed: false,
        reference: true,
    };
    let unknown = Footprint {
        distributed: true,
        reference: true,
    };
    assert_eq!(
        of("UPDATE branches SET bid = bid WHERE bid = 1"),
        reference_only
    );
    assert!(of("SELECT count(*) FROM accounts").distributed);
    assert!(!of("SELECT count(*) FROM accounts").reference);
    assert_eq!(
        of("SELECT * FROM accounts a JOIN branches b USING (bid) WHERE aid = 1"),
        unknown
    );
    // Names the map does not know may be views over distributed tables.
    assert_eq!(of("SELECT * FROM some_view"), unknown);
    // So may functions of the application's.
    assert_eq!(of("UPDATE branches SET bid = my_function(bid)"), unknown);
    // DDL, pg_shard's functions: the coordinator cannot tell.
    assert_eq!(of("ALTER TABLE branches ADD COLUMN c int"), unknown);
    assert_eq!(
        of("SELECT pg_shard.recover_prepared_transactions()"),
        unknown
    );
    assert_eq!(of("SELECT now()"), Footprint::default());
    assert_eq!(of("SAVEPOINT s"), Footprint::default());
}

/// Reads first: while a job's read routes send accounts' shard of aid 1
/// to node 3, plain reads outside a transaction follow them; writes, row
/// locks and statements of a transaction stay with the owner.
#[test]
fn plain_reads_on_their_own_follow_read_routes() {
    let mut map = cluster();
    let key = ("public".to_string(), "accounts".to_string());
    let (owner_node, owner_shard) = shard_of(1);
    let table = map.tables[&key].as_ref().clone();
    let TableKind::Distributed {
        column,
        encoding,
        shards,
        ..
    } = table.kind
    else {
        unreachable!()
    };
    let entries = shards
        .entries()
        .iter()
        .map(|(range, placement)| {
            let mut placement = placement.clone();
            if placement.shard_id == owner_shard {
                placement.node = 3;
            }
            (*range, placement)
        })
        .collect();
    let reads = ShardMap::new(shards.version(), entries).unwrap();
    map.tables.insert(
        key,
        Arc::new(Table {
            kind: TableKind::Distributed {
                column,
                encoding,
                shards,
                reads: Some(reads),
            },
            ..table
        }),
    );
    map.read_routes = true;
    let path = default_path("app");
    let node_of = |sql: &str, outside_transaction: bool| {
        let session = Session {
            search_path: Some(&path),
            outside_transaction,
        };
        let normalized = crate::router::lexer::normalize(sql);
        let Analysis::Routable(shape) = analyze(&normalized.key) else {
            panic!("{sql} is not routable");
        };
        match route(&shape, sql, &normalized, &map, &session, None) {
            Route::Worker { node, .. } => node,
            other => panic!("{sql} routed to {other:?}"),
        }
    };
    assert_eq!(
        node_of("SELECT abalance FROM accounts WHERE aid = 1", true),
        3
    );
    assert_eq!(
        node_of("SELECT abalance FROM accounts WHERE aid = 1", false),
        owner_node
    );
    assert_eq!(
        node_of(
            "SELECT abalance FROM accounts WHERE aid = 1 FOR UPDATE",
            true
        ),
        owner_node
    );
    assert_eq!(
        node_of("UPDATE accounts SET abalance = 1 WHERE aid = 1", true),
        owner_node
    );
    // A join with a table the routes do not move goes by the owners' map.
    assert_eq!(
        node_of(
            "SELECT h.mtime FROM accounts a JOIN history h ON h.aid = a.aid WHERE a.aid = 1",
            true
        ),
        owner_node
    );
    // Other ranges are read where they are.
    let mut other = 2;
    while shard_of(other).1 == owner_shard {
        other += 1;
    }
    assert_eq!(
        node_of(
            &format!("SELECT abalance FROM accounts WHERE aid = {other}"),
            true
        ),
        shard_of(other).0
    );
}
