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

/// How long a latency window of a shard lasts: percentiles are taken over
/// the current window and the one before (the last 10 to 20 s).
const SHARD_WINDOW: Duration = Duration::from_secs(10);

/// Statements routed straight to one shard: a running count, and the
/// latencies of recent ones (non-cumulative buckets, the last one past
/// BUCKETS' end).
#[derive(Default)]
struct ShardStats {
    count: u64,
    window_started: Option<std::time::Instant>,
    current: [u64; BUCKETS.len() + 1],
    previous: [u64; BUCKETS.len() + 1],
}

impl ShardStats {
    fn observe(&mut self, elapsed: Duration) {
        let now = std::time::Instant::now();
        self.rotate(now);
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.current[bucket] += 1;
    }

    /// Starts a new window when the current one is over (both emptied
    /// after two windows without a statement).
    fn rotate(&mut self, now: std::time::Instant) {
        match self.window_started {
            Some(started) if now.duration_since(started) < SHARD_WINDOW => {}
            Some(started) if now.duration_since(started) < SHARD_WINDOW * 2 => {
                self.previous = std::mem::take(&mut self.current);
                // windows on a fixed grid: the previous one is never older
                // than 20 s
                self.window_started = Some(started + SHARD_WINDOW);
            }
            _ => {
                self.previous = Default::default();
                self.current = Default::default();
                self.window_started = Some(now);
            }
        }
    }

    /// The `quantile` of recent latencies in milliseconds (None without
    /// recent statements), linear within its bucket.
    fn percentile_ms(&mut self, quantile: f64) -> Option<f64> {
        self.rotate(std::time::Instant::now());
        let counts: Vec<u64> = self
            .current
            .iter()
            .zip(self.previous.iter())
            .map(|(a, b)| a + b)
            .collect();
        percentile_ms(&counts, quantile)
    }
}

/// The `quantile` of a histogram over BUCKETS (plus one past the end), in
/// milliseconds, interpolated linearly within the bucket it falls in.
fn percentile_ms(counts: &[u64], quantile: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = quantile * total as f64;
    let mut below = 0u64;
    for (i, count) in counts.iter().enumerate() {
        if *count > 0 && (below + count) as f64 >= rank {
            let lower = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
            let upper = BUCKETS
                .get(i)
                .copied()
                .unwrap_or(BUCKETS[BUCKETS.len() - 1]);
            let within = ((rank - below as f64) / *count as f64).clamp(0.0, 1.0);
            return Some((lower + (upper - lower) * within) * 1000.0);
        }
        below += count;
    }
    Some(BUCKETS[BUCKETS.len() - 1] * 1000.0)
}

/// What a coordinator reports of its shards (pg_shard.report_shard_load).
#[derive(Default)]
pub struct ShardReport {
    pub shards: Vec<i64>,
    pub counts: Vec<i64>,
    pub p50_ms: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
}

/// How long the metadata node's statistics are served after they were read
/// (they are read every 10 s while /metrics or /map.json is read).
pub const CLUSTER_STATS_FRESH: Duration = Duration::from_secs(60);

impl ClusterStats {
    pub fn fresh(&self) -> bool {
        self.fetched_at
            .is_some_and(|at| at.elapsed() < CLUSTER_STATS_FRESH)
    }
}

/// One database's shards and nodes as its metadata node reports them.
#[derive(Default, Clone)]
pub struct ClusterStats {
    /// When they were read: older than [`CLUSTER_STATS_FRESH`], they are
    /// not served (a node's state of an hour ago is no state).
    pub fetched_at: Option<std::time::Instant>,
    pub shards: Vec<ShardRow>,
    /// (measure, busiest node, ratio of busiest over median).
    pub imbalance: Vec<(String, i32, Option<f64>)>,
    pub nodes: Vec<NodeHealth>,
}

#[derive(Clone)]
pub struct ShardRow {
    pub table: String,
    pub shard_id: i64,
    pub node: String,
    pub size_bytes: Option<i64>,
    pub estimated_rows: Option<i64>,
    pub statements_per_second: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub replication_lag_bytes: Option<i64>,
    /// Inclusive keyspace ids, signed.
    pub range_start: i64,
    pub range_end: i64,
    /// A running move or split of the shard's group: (kind, phase).
    pub job: Option<(String, String)>,
}

#[derive(Clone)]
pub struct NodeHealth {
    pub node: String,
    pub reachable: bool,
    pub prepared_transactions: Option<i64>,
    pub oldest_prepared_seconds: Option<f64>,
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
    /// Per database, then shard id (each database's catalog numbers its
    /// shards from the same start).
    shards: Mutex<BTreeMap<String, BTreeMap<i64, ShardStats>>>,
    /// What the metadata nodes last said of their shards and nodes
    /// (pg_shard.shard_stats, imbalance(), node_health()), per database,
    /// served on /metrics.
    pub cluster_stats: Mutex<BTreeMap<String, ClusterStats>>,
    /// When /metrics was last scraped (seconds since the epoch): while
    /// scrapes come, the load reports (every 10 s) read the metadata
    /// nodes' statistics, which cost them a connection to every worker;
    /// without scrapes for 2 minutes nothing is read.
    last_scrape: AtomicU64,
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

    /// Whether /metrics was scraped in the last 2 minutes.
    pub fn scraped_lately(&self) -> bool {
        unix_seconds().saturating_sub(self.last_scrape.load(Ordering::Relaxed)) < 120
    }

    /// Counts a statement routed straight to `shard` of `database`.
    pub fn shard(&self, database: &str, shard: i64) {
        self.with_shard(database, shard, |stats| stats.count += 1);
    }

    /// Counts a statement routed straight to `shard` of `database` that
    /// took `elapsed`.
    pub fn shard_timed(&self, database: &str, shard: i64, elapsed: Duration) {
        self.with_shard(database, shard, |stats| {
            stats.count += 1;
            stats.observe(elapsed);
        });
    }

    fn with_shard(&self, database: &str, shard: i64, update: impl FnOnce(&mut ShardStats)) {
        if let Ok(mut databases) = self.shards.lock() {
            // (the database's name is copied only the first time)
            let shards = match databases.get_mut(database) {
                Some(shards) => shards,
                None => databases.entry(database.to_owned()).or_default(),
            };
            update(shards.entry(shard).or_default());
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

    /// Every shard's statement count so far in `database`, and the p50
    /// and p99 of its recent statements in milliseconds, for the load
    /// reports to the database's metadata node.
    pub fn shard_report(&self, database: &str) -> ShardReport {
        let mut report = ShardReport::default();
        if let Ok(mut databases) = self.shards.lock() {
            for (shard, stats) in databases.get_mut(database).into_iter().flatten() {
                report.shards.push(*shard);
                report
                    .counts
                    .push(i64::try_from(stats.count).unwrap_or(i64::MAX));
                report.p50_ms.push(stats.percentile_ms(0.5));
                report.p99_ms.push(stats.percentile_ms(0.99));
            }
        }
        report
    }

    pub fn shard_queries(&self, database: &str, shard: i64) -> u64 {
        self.shards
            .lock()
            .ok()
            .and_then(|databases| Some(databases.get(database)?.get(&shard)?.count))
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
        if let Ok(databases) = self.shards.lock() {
            let _ = writeln!(out, "# HELP pg_shard_shard_queries_total Statements routed straight to each shard.\n# TYPE pg_shard_shard_queries_total counter");
            for (database, shards) in databases.iter() {
                for (shard, stats) in shards {
                    let _ = writeln!(
                        out,
                        "pg_shard_shard_queries_total{{database=\"{}\",shard=\"{shard}\"}} {}",
                        label(database),
                        stats.count
                    );
                }
            }
        }
        if let Ok(clusters) = self.cluster_stats.lock() {
            let fresh: BTreeMap<String, ClusterStats> = clusters
                .iter()
                .filter(|(_, stats)| stats.fresh())
                .map(|(database, stats)| (database.clone(), stats.clone()))
                .collect();
            render_cluster_stats(&mut out, &fresh);
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

/// The metadata nodes' view of the cluster (pg_shard.shard_stats,
/// imbalance(), node_health()), as the coordinator last fetched it.
fn render_cluster_stats(out: &mut String, clusters: &BTreeMap<String, ClusterStats>) {
    type ShardValue = fn(&ShardRow) -> Option<f64>;
    let shard_series: [(&str, &str, ShardValue); 6] = [
        ("pg_shard_shard_size_bytes", "Size of a shard on its node, tables and indexes.", |r| {
            r.size_bytes.map(|v| v as f64)
        }),
        ("pg_shard_shard_estimated_rows", "Rows of a shard, as its node's planner estimates them.", |r| {
            r.estimated_rows.map(|v| v as f64)
        }),
        ("pg_shard_shard_statements_per_second", "Statements per second the coordinators routed to a shard (their last minute of reports).", |r| {
            Some(r.statements_per_second)
        }),
        ("pg_shard_shard_latency_p50_seconds", "Median latency of a shard's routed statements (last 10-20 s).", |r| {
            r.p50_ms.map(|v| v / 1000.0)
        }),
        ("pg_shard_shard_latency_p99_seconds", "99th percentile latency of a shard's routed statements (last 10-20 s; the worst coordinator's).", |r| {
            r.p99_ms.map(|v| v / 1000.0)
        }),
        ("pg_shard_shard_replication_lag_bytes", "Replication lag of a running move or split of the shard's group.", |r| {
            r.replication_lag_bytes.map(|v| v as f64)
        }),
    ];
    for (name, help, value) in shard_series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (database, stats) in clusters {
            for row in &stats.shards {
                if let Some(value) = value(row) {
                    let _ = writeln!(
                        out,
                        "{name}{{database=\"{}\",table=\"{}\",shard=\"{}\",node=\"{}\"}} {value}",
                        label(database),
                        label(&row.table),
                        row.shard_id,
                        label(&row.node)
                    );
                }
            }
        }
    }
    let _ = writeln!(out, "# HELP pg_shard_imbalance_ratio The busiest node's total over the median node's (measure: size_bytes or statements_per_second).\n# TYPE pg_shard_imbalance_ratio gauge");
    for (database, stats) in clusters {
        for (measure, busiest, ratio) in &stats.imbalance {
            if let Some(ratio) = ratio {
                let _ = writeln!(
                    out,
                    "pg_shard_imbalance_ratio{{database=\"{}\",measure=\"{}\",busiest_node=\"{busiest}\"}} {ratio}",
                    label(database),
                    label(measure)
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP pg_shard_node_up Whether the metadata node reaches the node (1) or not (0).\n# TYPE pg_shard_node_up gauge");
    for (database, stats) in clusters {
        for node in &stats.nodes {
            let _ = writeln!(
                out,
                "pg_shard_node_up{{database=\"{}\",node=\"{}\"}} {}",
                label(database),
                label(&node.node),
                u8::from(node.reachable)
            );
        }
    }
    let _ = writeln!(out, "# HELP pg_shard_prepared_transactions Two-phase commits of pg_shard's left prepared on a node.\n# TYPE pg_shard_prepared_transactions gauge");
    for (database, stats) in clusters {
        for node in &stats.nodes {
            if let Some(count) = node.prepared_transactions {
                let _ = writeln!(
                    out,
                    "pg_shard_prepared_transactions{{database=\"{}\",node=\"{}\"}} {count}",
                    label(database),
                    label(&node.node)
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP pg_shard_prepared_transaction_oldest_seconds Age of the oldest of them.\n# TYPE pg_shard_prepared_transaction_oldest_seconds gauge");
    for (database, stats) in clusters {
        for node in &stats.nodes {
            if let Some(age) = node.oldest_prepared_seconds {
                let _ = writeln!(
                    out,
                    "pg_shard_prepared_transaction_oldest_seconds{{database=\"{}\",node=\"{}\"}} {age}",
                    label(database),
                    label(&node.node)
                );
            }
        }
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
            const PROMETHEUS: &str = "text/plain; version=0.0.4";
            let (status, content_type, body) = if line.starts_with("GET /metrics ") {
                metrics.last_scrape.store(unix_seconds(), Ordering::Relaxed);
                ("200 OK", PROMETHEUS, metrics.render())
            } else if line.starts_with("GET /map ") {
                (
                    "200 OK",
                    "text/html; charset=utf-8",
                    crate::map_page::PAGE.to_string(),
                )
            } else if line.starts_with("GET /map.json ") {
                // The page is being looked at: keep its statistics fresh.
                metrics.last_scrape.store(unix_seconds(), Ordering::Relaxed);
                let body = metrics
                    .cluster_stats
                    .lock()
                    .map(|clusters| crate::map_page::json(&clusters))
                    .unwrap_or_default();
                ("200 OK", "application/json", body)
            } else {
                ("404 Not Found", "text/plain", "not found\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_of_a_histogram() {
        let mut counts = [0u64; BUCKETS.len() + 1];
        assert_eq!(percentile_ms(&counts, 0.5), None);
        // 100 statements between 0.5 and 1 ms, one between 25 and 50 ms
        counts[3] = 100;
        counts[8] = 1;
        let p50 = percentile_ms(&counts, 0.5).unwrap_or_default();
        assert!((0.5..=1.0).contains(&p50), "p50 {p50}");
        let p99 = percentile_ms(&counts, 0.99).unwrap_or_default();
        assert!((0.5..=1.0).contains(&p99), "p99 {p99}");
        let p999 = percentile_ms(&counts, 0.999).unwrap_or_default();
        assert!((25.0..=50.0).contains(&p999), "p99.9 {p999}");
        // past the last bound: reported as the last bound
        let mut slow = [0u64; BUCKETS.len() + 1];
        slow[BUCKETS.len()] = 3;
        assert_eq!(percentile_ms(&slow, 0.5), Some(30_000.0));
    }

    #[test]
    fn shard_reports_carry_recent_latency() {
        let metrics = Metrics::default();
        metrics.shard_timed("a", 7, Duration::from_micros(700));
        metrics.shard_timed("a", 7, Duration::from_micros(800));
        metrics.shard("a", 8);
        // Another database's shard 7 is another shard.
        metrics.shard("b", 7);
        let report = metrics.shard_report("a");
        assert_eq!(report.shards, vec![7, 8]);
        assert_eq!(report.counts, vec![2, 1]);
        let p50 = report.p50_ms[0].unwrap_or_default();
        assert!((0.5..=1.0).contains(&p50), "p50 {p50}");
        assert_eq!(report.p50_ms[1], None);
        assert_eq!(metrics.shard_report("b").counts, vec![1]);
        assert_eq!(metrics.shard_queries("b", 7), 1);
        assert_eq!(metrics.shard_queries("c", 7), 0);
    }

    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = Metrics::default();
        let node = metrics.node("w1");
        node.observe(Duration::from_micros(300), false);
        node.observe(Duration::from_millis(20), true);
        metrics.shard("app", 100);
        metrics.shard("app", 100);
        let text = metrics.render();
        assert!(text.contains("pg_shard_node_queries_total{node=\"w1\"} 2"));
        assert!(text.contains("pg_shard_node_errors_total{node=\"w1\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.0005\"} 1"));
        assert!(text.contains("pg_shard_node_latency_seconds_bucket{node=\"w1\",le=\"0.025\"} 2"));
        assert!(text.contains("pg_shard_shard_queries_total{database=\"app\",shard=\"100\"} 2"));
    }
}
