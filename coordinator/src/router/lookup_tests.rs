//! Reads by a looked-up column: a lookup hop first, then the shard that
//! holds the keyspace ids it gave; writes of such tables go to the
//! metadata node.
use super::tests::{cluster, default_path};
use super::*;
use crate::backend::cluster_map::{Lookup, Table};
use std::sync::Arc;

#[test]
fn reads_by_a_looked_up_column_take_two_single_shard_hops() {
    let mut map = cluster();
    // accounts.bid has a lookup; history (distributed by an integer, shards
    // 200-203) stands in for the lookup table.
    let key = ("public".to_string(), "accounts".to_string());
    let accounts = Table {
        lookups: vec![Lookup {
            column: "bid".into(),
            table: ("public".into(), "history".into()),
        }],
        ..Table::clone(&map.tables[&key])
    };
    map.tables.insert(key, Arc::new(accounts));
    let path = default_path("app");
    let outside = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let inside = Session {
        search_path: Some(&path),
        outside_transaction: false,
    };
    let route_in = |sql: &str, session: &Session<'_>| {
        let normalized = crate::router::lexer::normalize(sql);
        match analyze(&normalized.key) {
            Analysis::Routable(shape) => route(&shape, sql, &normalized, &map, session, None),
            _ => Route::Metadata,
        }
    };
    let looked_up = |sql: &str, ids: &[i64]| {
        let normalized = crate::router::lexer::normalize(sql);
        let Analysis::Routable(shape) = analyze(&normalized.key) else {
            panic!("{sql}");
        };
        route_looked_up(&shape, sql, &normalized, &map, &outside, ids)
    };
    let sql = "SELECT * FROM accounts WHERE bid = 42";
    let Route::Lookup(hop) = route_in(sql, &outside) else {
        panic!("{sql}: no lookup hop");
    };
    // The hop reads the lookup's shard that holds 42, by its value.
    let id = keyspace_id_of_int(42);
    let (_, holder) = match &map.tables[&("public".to_string(), "history".to_string())].kind {
        TableKind::Distributed { shards, .. } => shards.lookup(id),
        _ => unreachable!(),
    };
    assert_eq!((hop.node, hop.shard), (holder.node, holder.shard_id));
    assert!(hop.sql.contains(&holder.qualified_name), "{}", hop.sql);
    assert!(
        hop.sql.ends_with("OPERATOR(pg_catalog.=) $1"),
        "{}",
        hop.sql
    );
    assert_eq!(hop.value, "42");
    // One keyspace id: its shard; none: any one shard; two shards: the
    // metadata node.
    let in_shard = |shard: i64| {
        let (range, _) = match &map.tables[&("public".to_string(), "accounts".to_string())].kind {
            TableKind::Distributed { shards, .. } => {
                shards.entries()[(shard - 100) as usize].clone()
            }
            _ => unreachable!(),
        };
        range.start.to_sql()
    };
    match looked_up(sql, &[in_shard(102), in_shard(102)]) {
        Route::Worker {
            shard, sql, writes, ..
        } => {
            assert_eq!(shard, Some(102));
            assert!(sql.contains("accounts_102"), "{sql}");
            assert!(!writes);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(looked_up(sql, &[]), Route::Worker { .. }));
    assert_eq!(
        looked_up(sql, &[in_shard(100), in_shard(103)]),
        Route::Metadata
    );
    // A key routes by itself; writes and reads in a transaction go to the
    // metadata node; another column scatters.
    assert!(matches!(
        route_in(
            "SELECT * FROM accounts WHERE aid = 1 AND bid = 42",
            &outside
        ),
        Route::Worker { .. }
    ));
    for (sql, session) in [
        ("UPDATE accounts SET abalance = 0 WHERE bid = 42", &outside),
        ("UPDATE accounts SET abalance = 0 WHERE aid = 1", &outside),
        (
            "INSERT INTO accounts (aid, bid, abalance) VALUES (1, 2, 3)",
            &outside,
        ),
        ("SELECT * FROM accounts WHERE bid = 42", &inside),
        ("SELECT * FROM accounts WHERE bid IN (42, 43)", &outside),
        ("SELECT * FROM accounts WHERE abalance = 42", &outside),
    ] {
        assert_eq!(route_in(sql, session), Route::Metadata, "{sql}");
    }
}
