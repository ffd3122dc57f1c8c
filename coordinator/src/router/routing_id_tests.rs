//! Routing by self-routing ids: `id = value` on a table whose id column is
//! declared goes to the shard of the prefix the id carries.
use super::tests::{cluster, default_path, route_text};
use super::*;
use crate::backend::cluster::Table;
use std::sync::Arc;

#[test]
fn ids_that_carry_their_prefix_route_without_the_key() {
    use pg_shard_core::routing_id::{compose, prefix_range};
    let mut map = cluster();
    let key = ("public".to_string(), "accounts".to_string());
    let accounts = Table {
        routing_column: Some("bid".into()),
        lookups: Vec::new(),
        is_lookup: false,
        ..Table::clone(&map.tables[&key])
    };
    map.tables.insert(key, Arc::new(accounts));
    let path = default_path("app");
    let session = Session {
        search_path: Some(&path),
        outside_transaction: true,
    };
    let route_with = |sql: &str, parameters: Option<&Parameters<'_>>| {
        let normalized = crate::router::lexer::normalize(sql);
        match analyze(&normalized.key) {
            Analysis::Routable(shape) => {
                route(&shape, sql, &normalized, &map, &session, parameters)
            }
            _ => Route::Metadata,
        }
    };
    // 4 equal shards: prefixes 0-255, 256-511, 512-767, 768-1023.
    for (prefix, shard_id) in [(3_u16, 100_i64), (300, 101), (700, 102), (1023, 103)] {
        let id = compose(12_345, prefix, 77);
        for sql in [
            format!("SELECT * FROM accounts WHERE bid = {id}"),
            format!("UPDATE accounts SET abalance = 0 WHERE bid = {id}"),
            format!("SELECT * FROM accounts a WHERE a.bid IN ({id}, {})", id + 1),
        ] {
            match route_with(&sql, None) {
                Route::Worker {
                    shard, sql: text, ..
                } => {
                    assert_eq!(shard, Some(shard_id), "{sql}");
                    assert!(text.contains(&format!("accounts_{shard_id}")), "{text}");
                }
                other => panic!("{sql}: {other:?}"),
            }
        }
        // A parameter, in text and in binary.
        let text_value = [Some(bytes::Bytes::from(id.to_string()))];
        let binary_value = [Some(bytes::Bytes::copy_from_slice(&id.to_be_bytes()))];
        for (values, format) in [(&text_value, 0_i16), (&binary_value, 1)] {
            let formats = move |_: usize| format;
            let parameters = Parameters {
                values,
                formats: &formats,
                declared_types: &[],
            };
            let routed = route_with("SELECT * FROM accounts WHERE bid = $1", Some(&parameters));
            assert!(
                matches!(routed, Route::Worker { shard: Some(s), .. } if s == shard_id),
                "{routed:?}"
            );
        }
        assert_eq!(prefix_range(prefix).0 .0 >> 54, prefix as u64);
    }
    // Ids of two shards, a negative id, or a text value: not routed.
    let (low, high) = (compose(1, 3, 0), compose(1, 700, 0));
    for sql in [
        format!("SELECT * FROM accounts WHERE bid IN ({low}, {high})"),
        "SELECT * FROM accounts WHERE bid = -5".to_string(),
        "SELECT * FROM accounts WHERE bid = 'x'".to_string(),
    ] {
        assert_eq!(route_with(&sql, None), Route::Metadata, "{sql}");
    }
    // Without the declaration, the same read is a scatter.
    assert_eq!(
        route_text(&format!("SELECT * FROM accounts WHERE bid = {low}")),
        Route::Metadata
    );
}
