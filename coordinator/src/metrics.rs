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

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Default)]
struct NodeStats {
    queries: u64,
    errors: u64,
    latency: Histogram,
}

#[derive(Default)]
pub struct Metrics {
    pub client_connections: AtomicU64,
    pub clients_active: AtomicU64,
    pub server_connects: AtomicU64,
    pub wrong_shard_retries: AtomicU64,
    pub map_reloads: AtomicU64,
    pub protocol_errors: AtomicU64,
    nodes: Mutex<BTreeMap<String, NodeStats>>,
    shards: Mutex<BTreeMap<i64, u64>>,
}

impl Metrics {
    /// Records one statement (or extended-protocol batch) sent to `node`.
    pub fn observe(&self, node: &str, shard: Option<i64>, elapsed: Duration, failed: bool) {
        if let Ok(mut nodes) = self.nodes.lock() {
            let stats = match nodes.get_mut(node) {
                Some(stats) => stats,
                None => nodes.entry(node.to_owned()).or_default(),
            };
            stats.queries += 1;
            if failed {
                stats.errors += 1;
            }
            stats.latency.observe(elapsed.as_secs_f64());
        }
        if let Some(shard) = shard {
            if let Ok(mut shards) = self.shards.lock() {
                *shards.entry(shard).or_default() += 1;
            }
        }
    }

    /// (node, queries, errors) for SHOW STATS.
    pub fn node_counts(&self) -> Vec<(String, u64, u64, f64)> {
        self.nodes
            .lock()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|(node, stats)| {
                        let average = if stats.latency.count == 0 {
                            0.0
                        } else {
                            stats.latency.sum / stats.latency.count as f64
                        };
                        (node.clone(), stats.queries, stats.errors, average)
                    })
                    .collect()
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
                    stats.queries
                );
            }
            let _ = writeln!(out, "# HELP pg_shard_node_errors_total Statements that failed on each node.\n# TYPE pg_shard_node_errors_total counter");
            for (node, stats) in nodes.iter() {
                let _ = writeln!(
                    out,
                    "pg_shard_node_errors_total{{node=\"{node}\"}} {}",
                    stats.errors
                );
            }
            let _ = writeln!(out, "# HELP pg_shard_node_latency_seconds Statement latency per node.\n# TYPE pg_shard_node_latency_seconds histogram");
            for (node, stats) in nodes.iter() {
                for (bound, count) in BUCKETS.iter().zip(stats.latency.counts.iter()) {
                    let _ = writeln!(
                        out,
                        "pg_shard_node_latency_seconds_bucket{{node=\"{node}\",le=\"{bound}\"}} {count}"
                    );
                }
                let _ = writeln!(
                    out,
                    "pg_shard_node_latency_seconds_bucket{{node=\"{node}\",le=\"+Inf\"}} {}",
                    stats.latency.count
                );
                let _ = writeln!(
                    out,
                    "pg_shard_node_latency_seconds_sum{{node=\"{node}\"}} {}\npg_shard_node_latency_seconds_count{{node=\"{node}\"}} {}",
                    stats.latency.sum, stats.latency.count
                );
            }
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
        metrics.observe("w1", Some(100), Duration::from_micros(300), false);
        metrics.observe("w1", Some(100), Duration::from_millis(20), true);
        let text = metrics.render();
        assert!(text.contains("pg_shard_node_queries_total{node=\"w1\"} 2"));
        assert!(text.contains("pg_shard_node_errors_total{node=\"w1\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.0005\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.025\"} 2"));
        assert!(text.contains("pg_shard_shard_queries_total{shard=\"100\"} 2"));
    }
}
