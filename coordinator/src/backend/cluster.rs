//! The coordinator's copy of one database's shard map: nodes, distributed
//! and reference tables, and which node owns each range. Loaded from the
//! metadata node's catalog at first use, reloaded on NOTIFY pg_shard_map and
//! whenever a worker answers WrongShard.

use crate::backend::connection::ServerAddress;
use crate::backend::map_load::{connect_catalog, load, EXTENSION_INSTALLED};
use crate::backend::map_patch;
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;

pub use crate::backend::cluster_map::{
    ClusterMap, MapError, NodeId, ShardPlacement, Table, TableKind,
};

/// What a database's map listener is asked to do.
#[derive(Debug, Default, Clone, Copy)]
struct ListenerState {
    /// Statements that need the database free of other sessions (DROP
    /// DATABASE, a template of CREATE DATABASE) while they run: the
    /// listener stays disconnected until none is left.
    holds: usize,
    /// Counts the times the name may have come to mean another database
    /// (dropped, renamed, created): the listener then connects anew and
    /// loads the map whatever its version.
    renewals: u64,
}

/// One database's map, swapped whole on reload.
pub struct DatabaseMap {
    pub database: String,
    current: RwLock<Arc<ClusterMap>>,
    reload_lock: AsyncMutex<()>,
    listener: tokio::sync::watch::Sender<ListenerState>,
    metadata: ServerAddress,
    user: String,
    password: Option<String>,
    metrics: Arc<Metrics>,
    /// The catalog connection loads reuse (a new one costs a server
    /// process's start, in the write pause of a shard move); None: the
    /// next load connects. Let go whenever the listener is (the database
    /// must be free, or its name may mean another one now).
    catalog: std::sync::Mutex<Option<tokio_postgres::Client>>,
    /// Woken each time a map is loaded (statements waiting for a newer
    /// one, [`DatabaseMap::loaded`]).
    loads: tokio::sync::Notify,
    /// Whether the listener is connected and listening: every new version
    /// is then announced to it, and loaded or patched at once.
    listening: std::sync::atomic::AtomicBool,
}

impl DatabaseMap {
    pub fn current(&self) -> Arc<ClusterMap> {
        self.current
            .read()
            .map(|map| map.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Reloads unless someone else already reloaded past `seen_version`.
    pub async fn reload(&self, seen_version: i64) -> Result<Arc<ClusterMap>, MapError> {
        let _guard = self.reload_lock.lock().await;
        let current = self.current();
        if current.version > seen_version {
            return Ok(current);
        }
        self.load_locked().await
    }

    /// Completes at the next load of the map (made before looking at the
    /// current one, it misses none).
    pub fn loaded(&self) -> tokio::sync::futures::Notified<'_> {
        self.loads.notified()
    }

    /// Whether a new version reaches this map without anyone asking: its
    /// listener is connected (a load or a patch follows each commit).
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// Reloads if the metadata node's map version is past `seen_version`
    /// (a cheap question first: a statement refused during a move's
    /// cutover asks until the new map is there).
    /// While another task reads the map (or asks its version), this one
    /// does not queue to ask again: it returns the map in hand, and its
    /// caller waits for that read ([`DatabaseMap::loaded`]).
    pub async fn reload_if_newer(&self, seen_version: i64) -> Result<Arc<ClusterMap>, MapError> {
        let Ok(_guard) = self.reload_lock.try_lock() else {
            return Ok(self.current());
        };
        let current = self.current();
        if current.version > seen_version {
            return Ok(current);
        }
        let (client, renewals) = self.catalog_client().await?;
        let version = client
            .query_typed_one(
                "SELECT coalesce((SELECT version FROM pg_shard.map_state), 0)",
                &[],
            )
            .await;
        self.keep_catalog_client(client, renewals);
        match version {
            Ok(row) if row.get::<_, i64>(0) <= current.version && !current.tables.is_empty() => {
                Ok(current)
            }
            _ => self.load_locked().await,
        }
    }

    /// The kept catalog connection, or a new one; with the listener's
    /// renewal count when it was taken.
    async fn catalog_client(&self) -> Result<(tokio_postgres::Client, u64), MapError> {
        let renewals = self.listener.borrow().renewals;
        let kept = self
            .catalog
            .lock()
            .ok()
            .and_then(|mut kept| kept.take())
            .filter(|client| !client.is_closed());
        if let Some(client) = kept {
            return Ok((client, renewals));
        }
        let (client, connection) = connect_catalog(
            &self.metadata,
            &self.user,
            self.password.as_deref(),
            &self.database,
            "pg_shard_coordinator map",
        )
        .await?;
        tokio::spawn(connection);
        Ok((client, renewals))
    }

    /// Keeps the catalog connection for the next load, unless the database
    /// must be free or its name was renewed since it was taken.
    fn keep_catalog_client(&self, client: tokio_postgres::Client, renewals: u64) {
        let state = *self.listener.borrow();
        if state.holds == 0 && state.renewals == renewals && !client.is_closed() {
            if let Ok(mut kept) = self.catalog.lock() {
                *kept = Some(client);
            }
        }
    }

    /// Lets the kept catalog connection go (it closes).
    fn drop_catalog_client(&self) {
        if let Ok(mut kept) = self.catalog.lock() {
            kept.take();
        }
    }

    /// Loads the map and makes it current (the caller holds reload_lock).
    /// The catalog's functions are read again only when `functions_again`
    /// or none are known.
    async fn load_locked(&self) -> Result<Arc<ClusterMap>, MapError> {
        self.load_locked_with(false).await
    }

    async fn load_locked_with(&self, functions_again: bool) -> Result<Arc<ClusterMap>, MapError> {
        let started = std::time::Instant::now();
        let (client, renewals) = self.catalog_client().await?;
        let known = self.current().catalog_functions.clone();
        let functions = (!functions_again && !known.is_empty()).then_some(known);
        let loaded = load(&client, functions).await;
        if loaded.is_ok() {
            self.keep_catalog_client(client, renewals);
        }
        let map = Arc::new(loaded?);
        self.metrics.map_reloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %self.database, version = map.version, tables = map.tables.len(), ms = started.elapsed().as_secs_f64() * 1000.0, "shard map loaded");
        if let Ok(mut current) = self.current.write() {
            *current = map.clone();
        }
        self.loads.notify_waiters();
        Ok(map)
    }
}

impl DatabaseMap {
    /// Keeps the map listener off the database until the hold is dropped.
    pub fn hold_listener(self: &Arc<Self>) -> ListenerHold {
        self.listener.send_modify(|state| state.holds += 1);
        self.drop_catalog_client();
        ListenerHold(self.clone())
    }

    /// Loads the map whatever its version (the database may have been
    /// dropped and created again: versions start over). A database whose
    /// map cannot be read gets an empty one: its statements go to the
    /// metadata node, which is always right, instead of to shards that may
    /// be gone. A metadata node that cannot be reached (restarting after a
    /// crash) keeps the map in hand: sending everything to a node that is
    /// down would fail statements the workers can still take.
    ///
    /// With `used`, the map a statement was routed by: nothing is done if
    /// another task replaced it meanwhile (many sessions meeting the same
    /// stale map read it once).
    pub async fn reload_anew(&self, used: Option<&ClusterMap>) {
        let _guard = self.reload_lock.lock().await;
        if let Some(used) = used {
            if !std::ptr::eq(Arc::as_ptr(&self.current()), used) {
                return;
            }
        }
        if let Err(e) = self.load_locked_with(true).await {
            if e.metadata_unreachable() {
                tracing::warn!(database = %self.database, error = %e, "shard map reload failed; the map in hand stays");
                return;
            }
            tracing::warn!(database = %self.database, error = %e, "shard map reload failed; statements go to the metadata node");
            if let Ok(mut current) = self.current.write() {
                *current = Arc::new(ClusterMap::default());
            }
        }
    }
}

impl DatabaseMap {
    /// Makes the map `version` from the current one and `change` (what the
    /// announcement of `version` says it changed), if it applies
    /// ([`map_patch::patched`]); wakes the statements waiting for a map.
    async fn patch(&self, version: i64, change: &str) -> Option<Arc<ClusterMap>> {
        let _guard = self.reload_lock.lock().await;
        let patched = Arc::new(map_patch::patched(&self.current(), version, change)?);
        self.metrics.map_reloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %self.database, version, "shard map patched");
        if let Ok(mut current) = self.current.write() {
            *current = patched.clone();
        }
        self.loads.notify_waiters();
        Some(patched)
    }

    /// Reads the map in full after a patch, and says where the patch
    /// routed otherwise (the read map replaces it either way).
    async fn check(&self, patched: &ClusterMap) -> Result<(), MapError> {
        let _guard = self.reload_lock.lock().await;
        let loaded = self.load_locked().await?;
        if let Some(difference) = map_patch::difference(patched, &loaded) {
            tracing::warn!(database = %self.database, version = patched.version, %difference, "the patched shard map differed from the catalog's");
        }
        Ok(())
    }
}

/// See [`DatabaseMap::hold_listener`].
pub struct ListenerHold(Arc<DatabaseMap>);

impl Drop for ListenerHold {
    fn drop(&mut self) {
        self.0
            .listener
            .send_modify(|state| state.holds = state.holds.saturating_sub(1));
    }
}

/// Maps of every database a client has used.
pub struct Maps {
    databases: std::sync::Mutex<HashMap<String, Arc<DatabaseMap>>>,
    metadata: ServerAddress,
    user: String,
    password: Option<String>,
    metrics: Arc<Metrics>,
}

impl Maps {
    pub fn new(
        metadata: ServerAddress,
        user: String,
        password: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Arc<Maps> {
        Arc::new(Maps {
            databases: std::sync::Mutex::new(HashMap::new()),
            metadata,
            user,
            password,
            metrics,
        })
    }

    /// The map of `database` if one was loaded.
    pub fn existing(&self, database: &str) -> Option<Arc<DatabaseMap>> {
        self.databases
            .lock()
            .ok()
            .and_then(|databases| databases.get(database).cloned())
    }

    /// `database` was dropped, renamed or created: until its map is read
    /// again (its listener reconnects and loads it whatever its version),
    /// statements of that name go to the metadata node.
    pub fn renew(&self, database: &str) {
        if let Some(map) = self.existing(database) {
            if let Ok(mut current) = map.current.write() {
                *current = Arc::new(ClusterMap::default());
            }
            map.listener.send_modify(|state| state.renewals += 1);
            map.drop_catalog_client();
        }
    }

    /// Loads the map of every database of the metadata node that has the
    /// pg_shard extension (best effort: a failure is logged, and the map is
    /// loaded when a client first uses the database).
    pub async fn preload(self: Arc<Maps>) {
        let databases = async {
            let (client, connection) = connect_catalog(
                &self.metadata,
                &self.user,
                self.password.as_deref(),
                "postgres",
                "pg_shard_coordinator preload",
            )
            .await?;
            let task = tokio::spawn(connection);
            let rows = client
                .query(
                    "SELECT datname::text FROM pg_catalog.pg_database \
                     WHERE datallowconn AND NOT datistemplate ORDER BY 1",
                    &[],
                )
                .await;
            drop(client);
            let _ = task.await;
            Ok::<_, tokio_postgres::Error>(
                rows?
                    .into_iter()
                    .map(|row| row.get::<_, String>(0))
                    .collect::<Vec<_>>(),
            )
        };
        match databases.await {
            Ok(databases) => {
                for database in databases {
                    if self.uses_pg_shard(&database).await {
                        self.get(&database).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list databases to preload shard maps"),
        }
    }

    async fn uses_pg_shard(&self, database: &str) -> bool {
        let Ok((client, connection)) = connect_catalog(
            &self.metadata,
            &self.user,
            self.password.as_deref(),
            database,
            "pg_shard_coordinator preload",
        )
        .await
        else {
            return false;
        };
        let task = tokio::spawn(connection);
        let found = client.query_opt(EXTENSION_INSTALLED, &[]).await;
        drop(client);
        let _ = task.await;
        matches!(found, Ok(Some(_)))
    }

    /// The map of `database`, loading it (and starting its listener) on
    /// first use. A database without pg_shard gets an empty map: everything
    /// then goes to the metadata node.
    pub async fn get(self: &Arc<Maps>, database: &str) -> Arc<DatabaseMap> {
        let (map, fresh) = {
            let mut databases = self.databases.lock().unwrap_or_else(|e| e.into_inner());
            match databases.get(database) {
                Some(map) => (map.clone(), false),
                None => {
                    let map = Arc::new(DatabaseMap {
                        database: database.to_owned(),
                        current: RwLock::new(Arc::new(ClusterMap::default())),
                        reload_lock: AsyncMutex::new(()),
                        listener: tokio::sync::watch::Sender::new(ListenerState::default()),
                        metadata: self.metadata.clone(),
                        user: self.user.clone(),
                        password: self.password.clone(),
                        metrics: self.metrics.clone(),
                        catalog: std::sync::Mutex::new(None),
                        loads: tokio::sync::Notify::new(),
                        listening: std::sync::atomic::AtomicBool::new(false),
                    });
                    databases.insert(database.to_owned(), map.clone());
                    (map, true)
                }
            }
        };
        if fresh {
            if let Err(e) = map.reload(0).await {
                tracing::warn!(database, error = %e, "no shard map; statements go to the metadata node");
            }
            tokio::spawn(listen(map.clone()));
        } else {
            // Waits for a first load that is still under way (preload, or
            // another client's first connection); returns at once after.
            let _ = map.reload(-1).await;
        }
        map
    }
}

/// LISTEN pg_shard_map on the metadata node and reload on each change;
/// reconnects (and reloads, changes may have been missed) after failures.
/// Stays disconnected while a statement holds the database (DROP
/// DATABASE), and connects anew when the name was renewed.
async fn listen(map: Arc<DatabaseMap>) {
    use futures_util::StreamExt;
    let mut state = map.listener.subscribe();
    let mut first = true;
    loop {
        let seen = match state.wait_for(|s| s.holds == 0).await {
            Ok(now) => now.renewals,
            Err(_) => return,
        };
        let connected = connect_catalog(
            &map.metadata,
            &map.user,
            map.password.as_deref(),
            &map.database,
            "pg_shard_coordinator listener",
        )
        .await;
        if let Ok((client, mut connection)) = connected {
            // Shared with the load reports, which run beside the loop.
            let client = Arc::new(client);
            let reporting = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
            let pump = tokio::spawn(async move {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = messages.next().await {
                    if let tokio_postgres::AsyncMessage::Notification(note) = message {
                        // The version, and what it changed when the metadata
                        // node says so. A payload that is no version ("names":
                        // a relation named like a table was made elsewhere)
                        // reloads too.
                        let (version, change) = match note.payload().split_once(' ') {
                            Some((version, change)) => (version, Some(change.to_string())),
                            None => (note.payload(), None),
                        };
                        let _ = sender.send((version.parse::<i64>().unwrap_or(i64::MAX), change));
                    }
                }
            });
            // (The connection's statement timeout bounds the load reports;
            // LISTEN last, as pg_stat_activity shows the listener.)
            if client
                .batch_execute("SET statement_timeout = '5s'")
                .await
                .is_ok()
                && client.batch_execute("LISTEN pg_shard_map").await.is_ok()
            {
                // Changes made before LISTEN took effect are read now; after
                // a lost connection the database may be another one of the
                // same name (dropped and created again).
                if first {
                    let _ = map.reload(map.current().version).await;
                } else {
                    map.reload_anew(None).await;
                }
                map.listening.store(true, Ordering::Release);
                let mut report = tokio::time::interval(LOAD_REPORT_INTERVAL);
                report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = report.tick() => {
                            // One report at a time, each in a task of its
                            // own: a slow metadata node delays no reload.
                            if !reporting.swap(true, std::sync::atomic::Ordering::AcqRel) {
                                tokio::spawn(report_load(client.clone(), map.clone(), reporting.clone()));
                            }
                        }
                        notified = receiver.recv() => match notified {
                            Some((version, change)) if version > map.current().version => {
                                tracing::debug!(database = %map.database, version, "shard map change notified");
                                let seen = map.current().version;
                                let patched = match change {
                                    Some(change) => map.patch(version, &change).await,
                                    None => None,
                                };
                                // A patched map is read in full right after (off
                                // the writers' path): what the patch got wrong,
                                // if anything, lasts no longer than that read.
                                let read = match &patched {
                                    Some(patched) => map.check(patched).await,
                                    None => map.reload(seen).await.map(|_| ()),
                                };
                                if let Err(e) = read {
                                    tracing::warn!(database = %map.database, error = %e, "shard map reload failed");
                                }
                            }
                            Some(_) => {}
                            None => break,
                        },
                        _ = async {
                            // The guard it returns is not Send: drop it here.
                            let _ = state.wait_for(|s| s.holds > 0 || s.renewals != seen).await.is_ok();
                        } => break,
                    }
                }
            }
            map.listening.store(false, Ordering::Release);
            first = false;
            pump.abort();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How often the coordinator reports its statement counts per shard to
/// the metadata node (`pg_shard.rebalance(strategy => 'load')` reads them).
const LOAD_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// This coordinator process, as its load reports name it.
fn coordinator_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        format!("pid {} started {started}", std::process::id())
    })
}

/// Sends the statement counts per shard over the listener's connection
/// (`pg_shard.report_shard_load`, bounded by the connection's statement
/// timeout), then
/// clears `reporting`. A database without the extension (or with an older
/// one) is skipped quietly; a catalog user that may not report is warned
/// about once.
async fn report_load(
    client: Arc<tokio_postgres::Client>,
    map: Arc<DatabaseMap>,
    reporting: Arc<std::sync::atomic::AtomicBool>,
) {
    static DENIED_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let report = map.metrics.shard_report(&map.database);
    if !report.shards.is_empty() && !map.current().tables.is_empty() {
        let reported = client
            .execute(
                "SELECT pg_shard.report_shard_load($1, $2, $3, $4, $5)",
                &[
                    &coordinator_id(),
                    &report.shards,
                    &report.counts,
                    &report.p50_ms,
                    &report.p99_ms,
                ],
            )
            .await;
        if let Err(e) = reported {
            let denied = e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
            if denied && !DENIED_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(database = %map.database, error = %e,
                    "the catalog user may not report statement counts (GRANT EXECUTE ON FUNCTION pg_shard.report_shard_load)");
            } else {
                tracing::debug!(database = %map.database, error = %e, "load report failed");
            }
        }
    }
    report_hot_keys(&client, &map).await;
    if !map.current().tables.is_empty() && map.metrics.scraped_lately() {
        fetch_cluster_stats(&client, &map).await;
    }
    reporting.store(false, std::sync::atomic::Ordering::Release);
}

/// Reads the metadata node's view of this database's shards and nodes
/// (pg_shard.shard_stats, imbalance(), node_health()) for /metrics. A
/// metadata node without them (an older extension) leaves the last view.
async fn fetch_cluster_stats(client: &tokio_postgres::Client, map: &DatabaseMap) {
    use crate::metrics::{ClusterStats, NodeHealth, ShardRow};
    let fetched = async {
        let shards = client
            .query(
                "SELECT table_name::text, shard_id, host || ':' || port, size_bytes, estimated_rows, \
                        statements_per_second, p50_ms, p99_ms, replication_lag_bytes, \
                        range_start, range_end, job_kind, job_phase \
                   FROM pg_shard.shard_stats",
                &[],
            )
            .await?;
        let imbalance = client
            .query(
                "SELECT measure, busiest_node, ratio FROM pg_shard.imbalance()",
                &[],
            )
            .await?;
        let nodes = client
            .query(
                "SELECT host || ':' || port, reachable, prepared_transactions, oldest_prepared_seconds \
                   FROM pg_shard.node_health()",
                &[],
            )
            .await?;
        // (try_get: a row of unexpected types is skipped, never a panic)
        Ok::<_, tokio_postgres::Error>(ClusterStats {
            fetched_at: Some(std::time::Instant::now()),
            shards: shards
                .iter()
                .filter_map(|row| {
                    Some(ShardRow {
                        table: row.try_get(0).ok()?,
                        shard_id: row.try_get(1).ok()?,
                        node: row.try_get(2).ok()?,
                        size_bytes: row.try_get(3).ok()?,
                        estimated_rows: row.try_get(4).ok()?,
                        statements_per_second: row.try_get(5).ok()?,
                        p50_ms: row.try_get(6).ok()?,
                        p99_ms: row.try_get(7).ok()?,
                        replication_lag_bytes: row.try_get(8).ok()?,
                        range_start: row.try_get(9).ok()?,
                        range_end: row.try_get(10).ok()?,
                        job: row
                            .try_get::<_, Option<String>>(11)
                            .ok()?
                            .zip(row.try_get::<_, Option<String>>(12).ok()?),
                    })
                })
                .collect(),
            imbalance: imbalance
                .iter()
                .filter_map(|row| {
                    Some((
                        row.try_get(0).ok()?,
                        row.try_get(1).ok()?,
                        row.try_get(2).ok()?,
                    ))
                })
                .collect(),
            nodes: nodes
                .iter()
                .filter_map(|row| {
                    Some(NodeHealth {
                        node: row.try_get(0).ok()?,
                        reachable: row.try_get(1).ok()?,
                        prepared_transactions: row.try_get(2).ok()?,
                        oldest_prepared_seconds: row.try_get(3).ok()?,
                    })
                })
                .collect(),
        })
    };
    match fetched.await {
        Ok(stats) => {
            if let Ok(mut clusters) = map.metrics.cluster_stats.lock() {
                clusters.insert(map.database.clone(), stats);
            }
        }
        Err(e) => tracing::debug!(database = %map.database, error = %e, "cluster stats not read"),
    }
}

/// Sends this database's hottest keys (`pg_shard.report_hot_keys`), which
/// replace what this coordinator reported before.
async fn report_hot_keys(client: &tokio_postgres::Client, map: &DatabaseMap) {
    let hot = map
        .metrics
        .hot_keys
        .hottest(Some(&map.database), crate::metrics::HOT_KEYS_PER_TABLE);
    if hot.is_empty() {
        return;
    }
    let column = |f: &dyn Fn(&crate::hot_keys::HotKey) -> String| -> Vec<String> {
        hot.iter().map(f).collect()
    };
    let number = |f: &dyn Fn(&crate::hot_keys::HotKey) -> u64| -> Vec<i64> {
        hot.iter()
            .map(|h| i64::try_from(f(h)).unwrap_or(i64::MAX))
            .collect()
    };
    let schemas = column(&|h| h.schema.clone());
    let tables = column(&|h| h.table.clone());
    let keys = column(&|h| h.counter.key.clone());
    let ids: Vec<i64> = hot.iter().map(|h| h.counter.id.to_sql()).collect();
    let statements = number(&|h| h.counter.count);
    let totals = number(&|h| h.table_total);
    let errors = number(&|h| h.counter.error);
    let reported = client
        .execute(
            "SELECT pg_shard.report_hot_keys($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &coordinator_id(),
                &schemas,
                &tables,
                &ids,
                &keys,
                &statements,
                &totals,
                &errors,
            ],
        )
        .await;
    if let Err(e) = reported {
        tracing::debug!(database = %map.database, error = %e, "hot key report failed");
    }
}
