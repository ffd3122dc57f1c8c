//! Counters and latency histograms, served in Prometheus text format on
//! /metrics.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// Counters of one server, updated without locks on every statement.
pub struct NodeStats {
    queries: AtomicU64,
    errors: AtomicU64,
    /// Cumulative: bucket i counts statements at or under BUCKETS[i].
    buckets: [AtomicU64; BUCKETS.len()],
    latency_nanos: AtomicU64,
}

impl NodeStats {
    fn new() -> NodeStats {
        NodeStats {
            queries: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_nanos: AtomicU64::new(0),
        }
    }

    /// Records one statement (or extended-protocol batch).
    pub fn observe(&self, elapsed: Duration, failed: bool) {
        self.queries.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let seconds = elapsed.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(self.buckets.iter()) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct Metrics {
    pub client_connections: AtomicU64,
    pub clients_active: AtomicU64,
    pub server_connects: AtomicU64,
    pub wrong_shard_retries: AtomicU64,
    pub map_reloads: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Statements that ran on a pipe (multiplexed connection).
    pub multiplexed_statements: AtomicU64,
    /// Statements that were queued on a pipe and ran elsewhere instead.
    pub multiplex_fallbacks: AtomicU64,
    nodes: Mutex<BTreeMap<String, Arc<NodeStats>>>,
    shards: Mutex<BTreeMap<i64, u64>>,
    /// Statements per keyspace id of each table (SHOW HOT_KEYS).
    pub hot_keys: crate::hot_keys::HotKeys,
}

impl Metrics {
    /// The counters of the server at `node` (host:port), created on first use.
    pub fn node(&self, node: &str) -> Arc<NodeStats> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .entry(node.to_owned())
            .or_insert_with(|| Arc::new(NodeStats::new()))
            .clone()
    }

    /// Counts a statement routed straight to `shard`.
    pub fn shard(&self, shard: i64) {
        if let Ok(mut shards) = self.shards.lock() {
            *shards.entry(shard).or_default() += 1;
        }
    }

    /// (node, queries, errors, average seconds) for SHOW STATS.
    pub fn node_counts(&self) -> Vec<(String, u64, u64, f64)> {
        self.nodes
            .lock()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|(node, stats)| {
                        let queries = stats.queries.load(Ordering::Relaxed);
                        let nanos = stats.latency_nanos.load(Ordering::Relaxed);
                        let average = if queries == 0 {
                            0.0
                        } else {
                            nanos as f64 / 1e9 / queries as f64
                        };
                        (
                            node.clone(),
                            queries,
                            stats.errors.load(Ordering::Relaxed),
                            average,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every shard's statement count so far (shard ids, counts), for the
    /// load reports to the metadata node.
    pub fn shard_counts(&self) -> (Vec<i64>, Vec<i64>) {
        self.shards
            .lock()
            .map(|shards| {
                shards
                    .iter()
                    .map(|(shard, count)| (*shard, i64::try_from(*count).unwrap_or(i64::MAX)))
                    .unzip()
            })
            .unwrap_or_default()
    }

    pub fn shard_queries(&self, shard: i64) -> u64 {
        self.shards
            .lock()
            .ok()
            .and_then(|shards| shards.get(&shard).copied())
            .unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        };
        counter(
            &mut out,
            "pg_shard_client_connections_total",
            "Client connections accepted.",
            &self.client_connections,
        );
        counter(
            &mut out,
            "pg_shard_server_connects_total",
            "Server connections opened.",
            &self.server_connects,
        );
        counter(
            &mut out,
            "pg_shard_wrong_shard_retries_total",
            "Statements retried after a WrongShard answer.",
            &self.wrong_shard_retries,
        );
        counter(
            &mut out,
            "pg_shard_map_reloads_total",
            "Shard map reloads.",
            &self.map_reloads,
        );
        counter(
            &mut out,
            "pg_shard_protocol_errors_total",
            "Client connections closed for protocol violations.",
            &self.protocol_errors,
        );
        counter(
            &mut out,
            "pg_shard_multiplexed_statements_total",
            "Reads answered on a shared, pipelined server connection.",
            &self.multiplexed_statements,
        );
        counter(
            &mut out,
            "pg_shard_multiplex_fallbacks_total",
            "Reads queued on a shared connection that ran on a pooled one instead (slow statement ahead, or the connection closed).",
            &self.multiplex_fallbacks,
        );
        let _ = writeln!(
            out,
            "# HELP pg_shard_clients_active Client connections open now.\n# TYPE pg_shard_clients_active gauge\npg_shard_clients_active {}",
            self.clients_active.load(Ordering::Relaxed)
        );
        if let Ok(nodes) = self.nodes.lock() {
            let _ = writeln!(out, "# HELP pg_shard_node_queries_total Statements sent to each node.\n# TYPE pg_shard_node_queries_total counter");
            for (node, stats) in nodes.iter() {
                let _ = writeln!(
                    out,
                    "pg_shard_node_queries_total{{node=\"{node}\"}} {}",
                    stats.queries.load(Ordering::Relaxed)
                );
            }
            let _ = writeln!(out, "# HELP pg_shard_node_errors_total Statements that failed on each node.\n# TYPE pg_shard_node_errors_total counter");
            for (node, stats) in nodes.iter() {
                let _ = writeln!(
                    out,
                    "pg_shard_node_errors_total{{node=\"{node}\"}} {}",
                    stats.errors.load(Ordering::Relaxed)
                );
            }
            let _ = writeln!(out, "# HELP pg_shard_node_latency_seconds Statement latency per node.\n# TYPE pg_shard_node_latency_seconds histogram");
            for (node, stats) in nodes.iter() {
                for (bound, count) in BUCKETS.iter().zip(stats.buckets.iter()) {
                    let _ = writeln!(
                        out,
                        "pg_shard_node_latency_seconds_bucket{{node=\"{node}\",le=\"{bound}\"}} {}",
                        count.load(Ordering::Relaxed)
                    );
                }
                let queries = stats.queries.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "pg_shard_node_latency_seconds_bucket{{node=\"{node}\",le=\"+Inf\"}} {queries}"
                );
                let _ = writeln!(
                    out,
                    "pg_shard_node_latency_seconds_sum{{node=\"{node}\"}} {}\npg_shard_node_latency_seconds_count{{node=\"{node}\"}} {queries}",
                    stats.latency_nanos.load(Ordering::Relaxed) as f64 / 1e9
                );
            }
        }
        let hot = self.hot_keys.hottest(None, HOT_KEYS_PER_TABLE);
        let _ = writeln!(out, "# HELP pg_shard_hot_key_share Share of a table's routed statements that went to a key (recent traffic, halved every minute).\n# TYPE pg_shard_hot_key_share gauge");
        for key in &hot {
            let _ = writeln!(
                out,
                "pg_shard_hot_key_share{{{}}} {:.6}",
                hot_key_labels(key),
                key.share()
            );
        }
        let _ = writeln!(out, "# HELP pg_shard_hot_key_statements Statements routed by a key (recent traffic, halved every minute; over by at most the error).\n# TYPE pg_shard_hot_key_statements gauge");
        for key in &hot {
            let _ = writeln!(
                out,
                "pg_shard_hot_key_statements{{{}}} {}",
                hot_key_labels(key),
                key.counter.count
            );
        }
        if let Ok(shards) = self.shards.lock() {
            let _ = writeln!(out, "# HELP pg_shard_shard_queries_total Statements routed straight to each shard.\n# TYPE pg_shard_shard_queries_total counter");
            for (shard, count) in shards.iter() {
                let _ = writeln!(
                    out,
                    "pg_shard_shard_queries_total{{shard=\"{shard}\"}} {count}"
                );
            }
        }
        out
    }
}

/// Keys per table in /metrics and SHOW HOT_KEYS.
pub const HOT_KEYS_PER_TABLE: usize = 10;

fn hot_key_labels(key: &crate::hot_keys::HotKey) -> String {
    format!(
        "database=\"{}\",table=\"{}.{}\",key=\"{}\",keyspace_id=\"{}\"",
        label(&key.database),
        label(&key.schema),
        label(&key.table),
        label(&key.counter.key),
        key.counter.id.to_sql()
    )
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves GET /metrics until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let read = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut request))
                .await
            {
                Ok(Ok(read)) => read,
                _ => return,
            };
            let line = String::from_utf8_lossy(&request[..read]);
            let (status, body) = if line.starts_with("GET /metrics ") {
                ("200 OK", metrics.render())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = Metrics::default();
        let node = metrics.node("w1");
        node.observe(Duration::from_micros(300), false);
        node.observe(Duration::from_millis(20), true);
        metrics.shard(100);
        metrics.shard(100);
        let text = metrics.render();
        assert!(text.contains("pg_shard_node_queries_total{node=\"w1\"} 2"));
        assert!(text.contains("pg_shard_node_errors_total{node=\"w1\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.0005\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.025\"} 2"));
        assert!(text.contains("pg_shard_shard_queries_total{shard=\"100\"} 2"));
    }
}
