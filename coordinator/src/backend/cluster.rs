//! The coordinator's copy of one database's shard map: nodes, distributed
//! and reference tables, and which node owns each range. Loaded from the
//! metadata node's catalog at first use, reloaded on NOTIFY pg_shard_map and
//! whenever a worker answers WrongShard.

use crate::backend::connection::ServerAddress;
use crate::metrics::Metrics;
use pg_shard_core::quote;
use pg_shard_core::{KeyEncoding, KeyRange, KeyspaceId, ShardMap};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Mutex as AsyncMutex;

#[derive(Debug, Error)]
pub enum MapError {
    #[error("cannot read the shard map: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("the shard map of table {0} is invalid: {1}")]
    Invalid(String, pg_shard_core::ShardMapError),
    #[error("table {0} has unknown key encoding {1:?}")]
    Encoding(String, String),
}

impl MapError {
    /// The metadata node could not be reached or went away (down, starting
    /// up after a crash, shutting down): nothing is known about the map,
    /// and the one in hand stays the best guess (the shards' guards refuse
    /// what it gets wrong).
    pub fn metadata_unreachable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            MapError::Query(e) => match e.code() {
                None => true,
                Some(code) => [
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::TOO_MANY_CONNECTIONS,
                ]
                .contains(code),
            },
            _ => false,
        }
    }
}

pub type NodeId = i32;

#[derive(Debug, Clone)]
pub struct Node {
    pub address: ServerAddress,
}

/// Where one range of a table lives.
#[derive(Debug, Clone)]
pub struct ShardPlacement {
    pub shard_id: i64,
    /// Quoted `"schema"."table"` of the shard table on its worker.
    pub qualified_name: String,
    pub node: NodeId,
}

#[derive(Debug, Clone)]
pub enum TableKind {
    Distributed {
        column: String,
        encoding: KeyEncoding,
        shards: ShardMap<ShardPlacement>,
        /// While a reads-first move or split has switched reads of a range
        /// to its new copy: the map for reads that run on their own (the
        /// new copy's ranges in place of the owner's); None otherwise.
        reads: Option<ShardMap<ShardPlacement>>,
    },
    /// A copy on every node: shard table name per node.
    Reference { copies: HashMap<NodeId, String> },
}

#[derive(Debug, Clone)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub kind: TableKind,
    pub columns: Vec<String>,
    /// Columns whose value the metadata node fills in when an INSERT omits
    /// them (defaults, identity, generated): such INSERTs are not routed.
    pub filled_columns: HashSet<String>,
    /// Generated columns (not in a COPY's data; each node computes them).
    pub generated_columns: HashSet<String>,
}

#[derive(Debug, Default)]
pub struct ClusterMap {
    pub version: i64,
    pub nodes: HashMap<NodeId, Node>,
    /// By (schema, name).
    pub tables: HashMap<(String, String), Arc<Table>>,
    /// Functions of pg_catalog: calls to them can run on any node (read
    /// on a first load and kept by the reloads that follow a version).
    pub catalog_functions: Arc<HashSet<String>>,
    /// Other relations named like a distributed or reference table, by
    /// (schema, name): one in the user's own schema shadows `public`.
    pub same_names: HashSet<(String, String)>,
    /// Whether some table has a reads map (a reads-first job waits).
    pub read_routes: bool,
}

impl ClusterMap {
    /// A table by its name as written: qualified, or looked up along the
    /// session's `search_path` (its schemas, [`crate::router::search_path`]) as the
    /// server would: pg_catalog first unless listed, and the first schema
    /// with a relation of that name decides (None when that relation is not
    /// a distributed or reference table).
    pub fn table(
        &self,
        schema: Option<&str>,
        name: &str,
        search_path: &[String],
    ) -> Option<&Arc<Table>> {
        // Looked up without copying the names: this runs for every routed
        // statement.
        if let Some(schema) = schema {
            return self.tables.get(&(schema, name) as &dyn NamePair);
        }
        let implicit = (!search_path.iter().any(|s| s == "pg_catalog")).then_some("pg_catalog");
        for schema in implicit
            .into_iter()
            .chain(search_path.iter().map(String::as_str))
        {
            let key = &(schema, name) as &dyn NamePair;
            if let Some(table) = self.tables.get(key) {
                return Some(table);
            }
            if self.same_names.contains(key) {
                return None;
            }
        }
        None
    }
}

/// A (schema, name) pair, owned or borrowed: the maps keyed by owned
/// pairs are searched with borrowed ones.
trait NamePair {
    fn pair(&self) -> (&str, &str);
}

impl NamePair for (String, String) {
    fn pair(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl NamePair for (&str, &str) {
    fn pair(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn NamePair + 'a> for (String, String) {
    fn borrow(&self) -> &(dyn NamePair + 'a) {
        self
    }
}

// Hashes as (String, String) does (a String hashes as its str), as Borrow
// requires.
impl std::hash::Hash for dyn NamePair + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pair().hash(state)
    }
}

impl PartialEq for dyn NamePair + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.pair() == other.pair()
    }
}

impl Eq for dyn NamePair + '_ {}

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
            .query_one(
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
        let (client, renewals) = self.catalog_client().await?;
        let known = self.current().catalog_functions.clone();
        let functions = (!functions_again && !known.is_empty()).then_some(known);
        let loaded = load(&client, functions).await;
        if loaded.is_ok() {
            self.keep_catalog_client(client, renewals);
        }
        let map = Arc::new(loaded?);
        self.metrics.map_reloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %self.database, version = map.version, tables = map.tables.len(), "shard map loaded");
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
                        // A payload that is no version ("names": a relation named
                        // like a table was made elsewhere) reloads too.
                        let _ = sender.send(note.payload().parse::<i64>().unwrap_or(i64::MAX));
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
                        version = receiver.recv() => match version {
                            Some(version) if version > map.current().version => {
                                if let Err(e) = map.reload(map.current().version).await {
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
    let (shards, counts) = map.metrics.shard_counts();
    if !shards.is_empty() && !map.current().tables.is_empty() {
        let reported = client
            .execute(
                "SELECT pg_shard.report_shard_load($1, $2, $3)",
                &[&coordinator_id(), &shards, &counts],
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
    reporting.store(false, std::sync::atomic::Ordering::Release);
}

/// Reads the map; `functions`: the catalog's functions as known already
/// (None: read them too).
async fn load(
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
    let installed = client.query_opt(EXTENSION_INSTALLED, &[]).await?;
    if installed.is_none() {
        return Ok(map);
    }
    // One snapshot for the whole map, its queries sent together (each
    // would otherwise cost two round trips: a map is read while writers
    // wait for it at a shard move's cutover).
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let (version, nodes, tables, placements, read_route_table, same_names) = tokio::try_join!(
        client.query_one("SELECT version FROM pg_shard.map_state", &[]),
        client.query(
            "SELECT node_id, host, port FROM pg_shard.node WHERE state = 'active'",
            &[],
        ),
        client.query(
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
                            AND a.attgenerated <> '') \
             FROM pg_shard.logical_table t \
             JOIN pg_catalog.pg_class c ON c.oid = t.table_rel \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_shard.colocation_group g ON g.colocation_id = t.colocation_id",
            &[],
        ),
        client.query(
            "SELECT s.table_rel::oid, s.shard_id, s.shard_schema, s.shard_name, \
                    sg.range_start, sg.range_end, p.node_id, p.state, sg.shard_group_id \
             FROM pg_shard.shard s \
             JOIN pg_shard.shard_group sg ON sg.shard_group_id = s.shard_group_id \
             JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id \
             WHERE p.state <> 'retired' \
             ORDER BY p.state = 'active' DESC",
            &[],
        ),
        // (A metadata node of an older pg_shard has no read routes.)
        client.query_one(
            "SELECT pg_catalog.to_regclass('pg_shard.read_route') IS NOT NULL",
            &[],
        ),
        client.query(
            "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname IN (SELECT t.relname FROM pg_catalog.pg_class t \
                                 WHERE t.oid IN (SELECT table_rel FROM pg_shard.logical_table)) \
               AND c.oid NOT IN (SELECT table_rel FROM pg_shard.logical_table) \
               AND c.relkind IN ('r', 'v', 'm', 'f', 'p', 'S')",
            &[],
        ),
    )?;
    let read_routes = if read_route_table.get(0) {
        client
            .query(
                "SELECT r.table_rel::oid, r.shard_id, r.shard_schema, r.shard_name, \
                        r.range_start, r.range_end, r.node_id \
                 FROM pg_shard.read_route r",
                &[],
            )
            .await?
    } else {
        Vec::new()
    };
    client.batch_execute("COMMIT").await?;
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
const EXTENSION_INSTALLED: &str =
    "SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_shard'";

type CatalogConnection =
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>;

/// A connection to the metadata node's catalog in `database`.
async fn connect_catalog(
    metadata: &ServerAddress,
    user: &str,
    password: Option<&str>,
    database: &str,
    application: &str,
) -> Result<(tokio_postgres::Client, CatalogConnection), tokio_postgres::Error> {
    tokio_postgres::Config::new()
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
        .connect(tokio_postgres::NoTls)
        .await
}
