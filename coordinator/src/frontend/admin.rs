//! SHOW POOLS, SHOW CLIENTS, SHOW STATS, SHOW SHARDS and SHOW HOT_KEYS: the
//! coordinator's own state,
//! answered without a server (simple query protocol).

use crate::backend::cluster::{ClusterMap, TableKind};
use crate::net::protocol;
use crate::net::sqlstate;
use crate::net::tags;
use crate::router::AdminCommand;
use crate::shared::Shared;
use bytes::{BufMut, BytesMut};
use std::sync::atomic::Ordering;

/// Who asks: a superuser sees every pool and the servers' statistics;
/// any other role only its own pools, and no statistics (they count every
/// role's statements).
pub struct Viewer<'a> {
    pub user: &'a str,
    /// The session's database (statement counts are per database).
    pub database: &'a str,
    pub superuser: bool,
}

pub fn reply(
    command: &AdminCommand,
    shared: &Shared,
    map: &ClusterMap,
    viewer: &Viewer,
    out: &mut BytesMut,
) {
    let restricted = match command {
        AdminCommand::Stats => Some(("SHOW STATS", "every role's statement counts")),
        AdminCommand::HotKeys => Some(("SHOW HOT_KEYS", "the key values of every table")),
        _ => None,
    };
    if let (Some((name, what)), false) = (restricted, viewer.superuser) {
        protocol::error_response(
            out,
            &crate::net::protocol::ServerError::new(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!("permission denied to run {name}"),
            )
            .with_detail(format!("Only superusers may see {what}.")),
        );
        return;
    }
    let visible = |user: &str| viewer.superuser || user == viewer.user;
    let (columns, rows): (&[&str], Vec<Vec<String>>) = match command {
        AdminCommand::Pools => (
            &[
                "database",
                "user",
                "server",
                "mode",
                "size",
                "active",
                "idle",
                "checkouts",
                "connects",
            ],
            {
                let mut rows: Vec<Vec<String>> = shared
                    .pools
                    .all()
                    .iter()
                    .filter(|pool| visible(&pool.key.user))
                    .map(|pool| {
                        vec![
                            pool.key.database.clone(),
                            pool.key.user.clone(),
                            pool.key.address.to_string(),
                            "transaction".into(),
                            pool.size().to_string(),
                            pool.active_count().to_string(),
                            pool.idle_count().to_string(),
                            pool.checkouts.load(Ordering::Relaxed).to_string(),
                            pool.connects.load(Ordering::Relaxed).to_string(),
                        ]
                    })
                    .collect();
                // Pipes: one shared connection each; "active" counts the
                // requests in flight on it, "checkouts" those it answered.
                rows.extend(
                    shared
                        .pipes
                        .summary()
                        .into_iter()
                        .filter(|(key, _, _)| visible(&key.pool.user))
                        .map(|(key, in_flight, served)| {
                            vec![
                                key.pool.database,
                                key.pool.user,
                                key.pool.address.to_string(),
                                "multiplexed".into(),
                                "1".into(),
                                in_flight.to_string(),
                                "0".into(),
                                served.to_string(),
                                "1".into(),
                            ]
                        }),
                );
                rows
            },
        ),
        AdminCommand::Clients => (
            &[
                "user",
                "database",
                "addr",
                "port",
                "tls",
                "application_name",
                "connect_time",
            ],
            shared.client_list.rows(&visible),
        ),
        AdminCommand::Stats => (
            &["server", "queries", "errors", "avg_latency_ms"],
            shared
                .metrics
                .node_counts()
                .into_iter()
                .map(|(node, queries, errors, average)| {
                    vec![
                        node,
                        queries.to_string(),
                        errors.to_string(),
                        format!("{:.3}", average * 1000.0),
                    ]
                })
                .collect(),
        ),
        AdminCommand::HotKeys => (
            &[
                "database",
                "table_name",
                "key",
                "keyspace_id",
                "statements",
                "share",
                "error",
            ],
            shared
                .metrics
                .hot_keys
                .hottest(None, crate::metrics::HOT_KEYS_PER_TABLE)
                .into_iter()
                .map(|hot| {
                    vec![
                        hot.database.clone(),
                        format!("{}.{}", hot.schema, hot.table),
                        hot.counter.key.clone(),
                        hot.counter.id.to_sql().to_string(),
                        hot.counter.count.to_string(),
                        format!("{:.4}", hot.share()),
                        hot.counter.error.to_string(),
                    ]
                })
                .collect(),
        ),
        AdminCommand::Shards => {
            let mut rows = Vec::new();
            let mut tables: Vec<_> = map.tables.values().collect();
            tables.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
            for table in tables {
                if let TableKind::Distributed { shards, .. } = &table.kind {
                    for (range, placement) in shards.entries() {
                        rows.push(vec![
                            format!("{}.{}", table.schema, table.name),
                            placement.shard_id.to_string(),
                            placement.node.to_string(),
                            range.start.to_sql().to_string(),
                            range.end.to_sql().to_string(),
                            map.version.to_string(),
                            shared
                                .metrics
                                .shard_queries(viewer.database, placement.shard_id)
                                .to_string(),
                        ]);
                    }
                }
            }
            (
                &[
                    "table_name",
                    "shard_id",
                    "node_id",
                    "range_start",
                    "range_end",
                    "map_version",
                    "queries",
                ],
                rows,
            )
        }
    };
    row_description(out, columns);
    for row in &rows {
        let at = protocol::begin_message(out, tags::backend::DATA_ROW);
        out.put_i16(row.len() as i16);
        for value in row {
            out.put_i32(value.len() as i32);
            out.put_slice(value.as_bytes());
        }
        protocol::end_message(out, at);
    }
    protocol::command_complete(out, &format!("SHOW {}", rows.len()));
}

/// Text columns of type text.
fn row_description(out: &mut BytesMut, columns: &[&str]) {
    let at = protocol::begin_message(out, tags::backend::ROW_DESCRIPTION);
    out.put_i16(columns.len() as i16);
    for name in columns {
        protocol::put_cstr(out, name);
        out.put_i32(0); // table oid
        out.put_i16(0); // column number
        out.put_u32(25); // text
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i16(0); // text format
    }
    protocol::end_message(out, at);
}
