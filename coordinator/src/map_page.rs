//! `/map` on the admin HTTP port (the one of /metrics): a self-contained
//! page that draws each database's keyspace as bars of shard ranges,
//! coloured by node, sized by bytes and shaded by statements per second,
//! with running moves and splits marked; it refreshes itself from
//! `/map.json`, which holds what the metadata node last said
//! (`pg_shard.shard_stats`, read with the load reports while the page or
//! /metrics is being looked at).

use crate::metrics::ClusterStats;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The page: HTML, CSS and script in one file, nothing fetched from
/// elsewhere (no scripts, fonts or images from other hosts).
pub const PAGE: &str = include_str!("map_page.html");

/// `/map.json`: per database, its shards (table, id, node, range, bytes,
/// rows, rate, p99, job) and imbalance ratios.
pub fn json(clusters: &BTreeMap<String, ClusterStats>) -> String {
    let databases: Vec<Value> = clusters
        .iter()
        .filter(|(_, stats)| stats.fresh())
        .map(|(database, stats)| {
            let shards: Vec<Value> = stats
                .shards
                .iter()
                .map(|shard| {
                    json!({
                        "table": shard.table,
                        "shard_id": shard.shard_id,
                        "node": shard.node,
                        // as text: a JavaScript number cannot hold every int64
                        "range_start": shard.range_start.to_string(),
                        "range_end": shard.range_end.to_string(),
                        "size_bytes": shard.size_bytes,
                        "estimated_rows": shard.estimated_rows,
                        "statements_per_second": shard.statements_per_second,
                        "p99_ms": shard.p99_ms,
                        "job": shard.job.as_ref().map(|(kind, phase)| json!({"kind": kind, "phase": phase})),
                        "replication_lag_bytes": shard.replication_lag_bytes,
                    })
                })
                .collect();
            let imbalance: Vec<Value> = stats
                .imbalance
                .iter()
                .map(|(measure, busiest, ratio)| {
                    json!({"measure": measure, "busiest_node": busiest, "ratio": ratio})
                })
                .collect();
            let nodes: Vec<Value> = stats
                .nodes
                .iter()
                .map(|node| json!({"node": node.node, "reachable": node.reachable}))
                .collect();
            json!({"database": database, "shards": shards, "imbalance": imbalance, "nodes": nodes})
        })
        .collect();
    json!({ "databases": databases }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ShardRow;

    #[test]
    fn ranges_travel_as_text_and_jobs_as_objects() {
        let mut clusters = BTreeMap::new();
        clusters.insert(
            "app".to_string(),
            ClusterStats {
                shards: vec![ShardRow {
                    table: "orders".into(),
                    shard_id: 102008,
                    node: "127.0.0.1:54321".into(),
                    size_bytes: Some(8192),
                    estimated_rows: Some(10),
                    statements_per_second: 2.5,
                    p50_ms: Some(0.4),
                    p99_ms: Some(1.5),
                    replication_lag_bytes: None,
                    range_start: i64::MIN,
                    range_end: -1,
                    job: Some(("move".into(), "copy".into())),
                }],
                imbalance: vec![("size_bytes".into(), 1, Some(1.5))],
                nodes: Vec::new(),
                fetched_at: Some(std::time::Instant::now()),
            },
        );
        let parsed: Value = serde_json::from_str(&json(&clusters)).unwrap_or(Value::Null);
        let shard = &parsed["databases"][0]["shards"][0];
        assert_eq!(shard["range_start"], "-9223372036854775808");
        assert_eq!(shard["job"]["kind"], "move");
        assert_eq!(parsed["databases"][0]["imbalance"][0]["ratio"], 1.5);
        // self-contained: nothing loaded from elsewhere
        assert!(PAGE.contains("/map.json"));
        for outside in ["src=", "<link", "@import", "url("] {
            assert!(!PAGE.contains(outside), "the page loads {outside}");
        }
    }
}
