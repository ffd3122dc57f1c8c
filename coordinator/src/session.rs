//! One client connection: startup and authentication, then statements —
//! simple and extended protocol — each routed to one worker or to the
//! metadata node over pooled server connections.
//!
//! Transactions: BEGIN is answered by the coordinator and sent on with the
//! transaction's first statement, which picks the node; the transaction
//! then stays on that node (one server connection) until it ends. A later
//! statement that would need another node fails before anything commits
//! and the transaction is rolled back.

use crate::admin;
use crate::backend::{ServerAddress, ServerConnection, UNKNOWN_SESSION};
use crate::cluster::{ClusterMap, DatabaseMap, ListenerHold, NodeId};
use crate::config::AuthMode;
use crate::database_commands::{self, DatabaseCommand};
use crate::lexer::Normalized;
use crate::multiplex::{Built, Pipe, PipeKey};
use crate::pool::{Lease, PoolKey};
use crate::protocol::{self, FrontendMessage, ServerError, StartupRequest};
use crate::router::{self, Analysis, Route, TransactionCommand};
use crate::scram::{self, ServerExchange};
use crate::socket::Socket;
use crate::Shared;
use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::net::TcpStream;

/// The foundation's WrongShard SQLSTATE.
const WRONG_SHARD: &str = "PS001";
/// A shard table the map names is not on its worker (retired after a
/// move, or the database was dropped and created again): the map is
/// stale, so it is read again and the statement retried, as for PS001.
const UNDEFINED_TABLE: &str = "42P01";
/// How long a statement refused with WrongShard waits for a newer shard
/// map before it is tried again anyway.
const WRONG_SHARD_WAIT: Duration = Duration::from_secs(2);
/// query_canceled.
const QUERY_CANCELED: &str = "57014";
/// Output is sent to the client at ReadyForQuery or when this much is queued.
const OUTPUT_FLUSH_BYTES: usize = 64 * 1024;
/// An extended-protocol batch longer than this (messages, or bytes of
/// them) without a Sync or Flush is sent on as if the client had sent a
/// Flush: pipelines of any length stream through bounded buffers.
const BATCH_MESSAGES: usize = 4096;
const BATCH_BYTES: usize = 4 << 20;
/// Serial numbers of client sessions (0 means none).
static SESSION_SERIALS: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("client went away")]
    ClientGone,
    #[error("the client did not log in within --authentication-timeout")]
    AuthenticationTimeout,
    #[error("the server ended the session: {0}")]
    ServerEnded(String),
    #[error("client protocol violation: {0}")]
    Protocol(#[from] protocol::ProtocolError),
    #[error("client I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Where a statement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Metadata,
    Worker(NodeId),
}

/// A client's prepared statement (shared: each message of a batch keeps
/// the definition its name had where the message came, as the server
/// would see it).
struct Prepared {
    sql: String,
    parameter_types: Vec<u32>,
    analysis: Arc<Analysis>,
    normalized: Normalized,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TxState {
    Idle,
    Open,
    Failed,
}

struct Transaction {
    state: TxState,
    /// The BEGIN text, sent with the first statement.
    begin: Option<String>,
    /// The node and connection the transaction runs on, once it has begun.
    pinned: Option<(Target, Lease)>,
}

/// The server and cancel key of the statement a client is running, if any,
/// and whether the client asked to cancel it.
#[derive(Default)]
struct CancelTarget {
    server: Option<(Arc<ServerAddress>, i32, i32)>,
    requested: bool,
}

type CancelSlot = Arc<Mutex<CancelTarget>>;

/// Cancel keys of running statements, by the key the client was given.
#[derive(Default)]
pub struct CancelRegistry {
    slots: Mutex<HashMap<(i32, i32), CancelSlot>>,
}

impl CancelRegistry {
    fn register(&self, key: (i32, i32)) -> CancelSlot {
        let slot = Arc::new(Mutex::new(CancelTarget::default()));
        if let Ok(mut slots) = self.slots.lock() {
            slots.insert(key, slot.clone());
        }
        slot
    }

    fn unregister(&self, key: (i32, i32)) {
        if let Ok(mut slots) = self.slots.lock() {
            slots.remove(&key);
        }
    }

    async fn cancel(&self, key: (i32, i32)) {
        let target = self
            .slots
            .lock()
            .ok()
            .and_then(|slots| slots.get(&key).cloned())
            .and_then(|slot| {
                slot.lock().ok().and_then(|mut s| {
                    s.requested = true;
                    s.server.clone()
                })
            });
        if let Some((address, process_id, secret_key)) = target {
            ServerConnection::cancel(address, process_id, secret_key).await;
        }
    }
}

pub struct Session {
    shared: Arc<Shared>,
    stream: Socket,
    input: BytesMut,
    output: BytesMut,
    user: String,
    database: String,
    map: Arc<DatabaseMap>,
    /// SET statements that make up the client's session state, by name,
    /// replayed on each server connection it uses.
    settings: Vec<(String, String)>,
    /// The settings of the startup packet and `options`: what RESET and
    /// DISCARD ALL go back to, as on the server.
    startup_settings: Vec<(String, String)>,
    /// The schemas of the search_path the server gave the session at login
    /// (its role's, database's and the server's defaults, or the client's
    /// startup setting), for resolving unqualified names; None when it is
    /// not a list the coordinator can read.
    search_path: Option<Vec<String>>,
    /// The search_path (or the role, which `$user` names) changed since:
    /// unqualified names are not resolved by the coordinator.
    search_path_changed: bool,
    /// The client made temporary relations, which come first in the path.
    temporary_relations: bool,
    /// Counted against its role's and database's CONNECTION LIMIT while
    /// the session lasts.
    _admitted: crate::client_limits::Admitted,
    tx: Transaction,
    statements: HashMap<String, Arc<Prepared>>,
    /// Named portals' nodes (portals live until their transaction ends).
    portals: HashMap<String, Target>,
    /// Extended-protocol messages since the last Sync or Flush.
    batch: Vec<BatchItem>,
    /// Bytes of the messages in `batch`.
    batch_bytes: usize,
    /// An error ended the current extended-protocol batch before its Sync:
    /// as the server does, messages are discarded until the Sync.
    skip_to_sync: bool,
    /// The last relay left its server skipping to a Sync after an error.
    server_skipping: bool,
    /// The last relay forwarded the Sync a client sent after COPY data,
    /// ending a batch that had none.
    synced_by_copy: bool,
    /// The client's role is a superuser (as the server last reported
    /// is_superuser): admin commands show it everything.
    superuser: bool,
    /// The client's encoding is UTF8 (as the server last reported it).
    utf8_client: bool,
    /// Connection held between Flush and Sync outside a transaction.
    held: Option<(Target, Lease)>,
    cancel_key: (i32, i32),
    /// This session's serial number (see `ServerConnection::last_session`).
    serial: u64,
    cancel_slot: CancelSlot,
    /// Output bytes were sent to the client since the current statement began.
    flushed_in_statement: bool,
    /// The pools this client used, by node.
    pools: HashMap<Target, Arc<crate::pool::Pool>>,
    /// The pipes (shared, pipelined connections) this client uses, by node
    /// (one per lane, all open when cached).
    pipes: HashMap<Target, Vec<Arc<Pipe>>>,
    /// Hold back a "canceling statement" error the client did not ask for:
    /// on a pipe it can come from another client's late cancel request.
    hold_cancels: bool,
    /// The last exchange passed an error to the client.
    last_failed: bool,
    /// Statements may go to workers (not with standard_conforming_strings
    /// off: literals would be read differently).
    routing: bool,
    /// Nodes where the client has session state (see SessionEffect::Keeps)
    /// and, between its statements, the connections that hold it.
    session_targets: HashSet<Target>,
    session_connections: HashMap<Target, Lease>,
    /// A transaction command the coordinator answered the Bind of, whose
    /// Execute is still to come: its kind, text and portal.
    pending_transaction: Option<(TransactionCommand, String, String)>,
    /// Session-level SETs of the open transaction: kept if it commits.
    pending_settings: Vec<String>,
    /// The client's idle_session_timeout: the coordinator ends the session
    /// as the server would (its pooled connections are not the session).
    idle_timeout: Option<Duration>,
}

/// Serves one client connection to its end.
pub async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    shared
        .metrics
        .client_connections
        .fetch_add(1, Ordering::Relaxed);
    shared
        .metrics
        .clients_active
        .fetch_add(1, Ordering::Relaxed);
    let peer = stream.peer_addr().ok();
    let crowded =
        shared.metrics.clients_active.load(Ordering::Relaxed) > shared.config.max_clients as u64;
    match start(stream, shared.clone(), crowded).await {
        Ok(Some(mut session)) => {
            let result = session.run().await;
            session.forget_session_state();
            shared.cancels.unregister(session.cancel_key);
            if let Err(e) = result {
                if matches!(e, SessionError::Protocol(_)) {
                    shared
                        .metrics
                        .protocol_errors
                        .fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(peer = ?peer, user = %session.user, error = %e, "client connection closed");
            }
        }
        Ok(None) => {}
        Err(e) => {
            if matches!(e, SessionError::Protocol(_)) {
                shared
                    .metrics
                    .protocol_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(peer = ?peer, error = %e, "client startup failed");
        }
    }
    shared
        .metrics
        .clients_active
        .fetch_sub(1, Ordering::Relaxed);
}

/// Startup and authentication; None when the connection was a cancel
/// request or was refused (the client has been told why). A `crowded`
/// coordinator (more than --max-clients) refuses the login as PostgreSQL
/// does at max_connections, after the startup packet (cancel requests are
/// still served). The client's part — its startup packet and its
/// authentication — must be done within --authentication-timeout; the
/// server work after it is not timed (cutting it off could leave a pooled
/// connection with answers still to come).
async fn start(
    stream: TcpStream,
    shared: Arc<Shared>,
    crowded: bool,
) -> Result<Option<Session>, SessionError> {
    let deadline =
        tokio::time::Instant::now() + Duration::from_secs(shared.config.authentication_timeout);
    let timed_out = |_| SessionError::AuthenticationTimeout;
    let mut stream = Socket::from_tokio_tcp(stream)?;
    let mut input = BytesMut::with_capacity(8192);
    let parameters = loop {
        let request = loop {
            if let Some(request) =
                protocol::decode_startup(&mut input, shared.config.max_message_bytes)?
            {
                break request;
            }
            let read = tokio::time::timeout_at(deadline, stream.read_buf(&mut input))
                .await
                .map_err(timed_out)?;
            if read? == 0 {
                return Err(SessionError::ClientGone);
            }
        };
        match request {
            StartupRequest::Ssl | StartupRequest::GssEncryption => {
                stream.write_all(b"N").await?;
            }
            StartupRequest::Cancel {
                process_id,
                secret_key,
            } => {
                shared.cancels.cancel((process_id, secret_key)).await;
                return Ok(None);
            }
            StartupRequest::Startup { parameters } => break parameters,
        }
    };
    if crowded {
        refuse(
            &mut stream,
            ServerError::fatal("53300", "sorry, too many clients already"),
        )
        .await;
        return Ok(None);
    }
    let parameter = |name: &str| {
        parameters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let Some(user) = parameter("user").filter(|u| !u.is_empty()) else {
        refuse(
            &mut stream,
            ServerError::fatal(
                "28000",
                "no PostgreSQL user name specified in startup packet",
            ),
        )
        .await;
        return Ok(None);
    };
    let database = parameter("database")
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    // A replication connection (physical or logical) is the metadata
    // node's walsender: relayed as it is.
    let replication = parameter("replication").filter(|mode| {
        !matches!(
            mode.to_lowercase().as_str(),
            "false" | "off" | "no" | "0" | ""
        )
    });
    let mut out = BytesMut::new();
    let metadata_key = PoolKey {
        address: shared.metadata.clone(),
        database: database.clone(),
        user: user.clone(),
    };
    match shared.config.auth {
        AuthMode::Trust => {}
        AuthMode::Scram => {
            let login = scram_login(&mut stream, &mut input, &shared, &user);
            if !tokio::time::timeout_at(deadline, login)
                .await
                .map_err(timed_out)??
            {
                return Ok(None);
            }
        }
        AuthMode::Passthrough => {
            let login = passthrough_login(
                &mut stream,
                &mut input,
                &shared,
                &user,
                &database,
                replication.as_deref(),
            );
            // Cut off, the login's server connection is dropped, not pooled.
            match tokio::time::timeout_at(deadline, login)
                .await
                .map_err(timed_out)??
            {
                Some(connection) if replication.is_some() => {
                    relay_replication(stream, input, connection, &shared).await;
                    return Ok(None);
                }
                Some(mut connection) => {
                    // Fresh: the defaults it has are the ones a new session
                    // gets now.
                    if connection.note_role_settings().await.is_ok() {
                        shared.pools.adopt(&metadata_key, connection);
                    }
                }
                None => return Ok(None),
            }
        }
    }
    if let Some(mode) = &replication {
        // Other logins: the coordinator's own server credentials.
        let credentials = crate::backend::Credentials {
            user: &user,
            password: shared.config.server_password.as_deref(),
        };
        let extra = [("replication", mode.as_str())];
        match ServerConnection::connect(&shared.metadata, &database, &credentials, &extra).await {
            Ok(connection) => relay_replication(stream, input, connection, &shared).await,
            Err(e) => refuse(&mut stream, ServerError::fatal("08006", e.to_string())).await,
        }
        return Ok(None);
    }
    protocol::authentication(&mut out, 0, &[]);
    // Startup options the client asked for become session settings.
    let mut settings = Vec::new();
    for (name, value) in &parameters {
        match name.as_str() {
            "user" | "database" | "replication" | "options" => {}
            _ => settings.push((name.clone(), set_statement(name, value))),
        }
    }
    // `options` (PGOPTIONS): settings as `-c name=value` or `--name=value`.
    if let Some(options) = parameter("options") {
        let Some(pairs) = command_line_settings(&options) else {
            refuse(
                &mut stream,
                ServerError::fatal(
                    "0A000",
                    "pg_shard coordinator accepts only -c name=value and --name=value in options",
                )
                .with_hint(
                    "Set the parameters with SET after connecting, or as startup parameters.",
                ),
            )
            .await;
            return Ok(None);
        };
        for (name, value) in pairs {
            settings.retain(|(n, _)| *n != name);
            let statement = set_statement(&name, &value);
            settings.push((name, statement));
        }
    }
    // The metadata node must accept this user and database. The server
    // says what the settings are (it spells them its own way:
    // client_encoding 'utf-8' is reported as UTF8); one it refuses
    // refuses the login, as it would directly.
    let mut tries = 0;
    let (login, mut reported): (Login, Vec<(String, String)>) = loop {
        tries += 1;
        let mut lease = match shared.pools.checkout(&metadata_key).await {
            Ok(lease) => lease,
            Err(e) => {
                let error = match e {
                    crate::pool::PoolError::Backend(crate::backend::BackendError::Refused(
                        mut error,
                    )) => {
                        error.severity = "FATAL".into();
                        error
                    }
                    other => ServerError::fatal("08006", other.to_string()),
                };
                refuse(&mut stream, error).await;
                return Ok(None);
            }
        };
        let pool = lease.pool().clone();
        let connection = lease.connection();
        match apply_settings(connection, &settings).await {
            Ok(login) if connection.role_settings.as_deref() != Some(&login.role_settings) => {
                // Made before an ALTER ROLE/DATABASE … SET: its defaults are
                // not a new session's. So are the others made then.
                pool.note_role_settings(&login.role_settings);
                connection.broken = true;
                shared.pools.discard_idle(&lease);
                if tries >= 3 {
                    refuse(
                        &mut stream,
                        ServerError::fatal(
                            "08006",
                            "pg_shard coordinator: the role's settings keep changing",
                        ),
                    )
                    .await;
                    return Ok(None);
                }
            }
            Ok(login) => {
                pool.note_role_settings(&login.role_settings);
                let reported = connection
                    .parameters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                break (login, reported);
            }
            // A pooled connection its server had closed (an
            // idle_session_timeout, a restart): another one.
            Err(_) if connection.broken && lease.reused && tries < 3 => {
                shared.pools.discard_idle(&lease);
            }
            Err(error) => {
                refuse(&mut stream, error).await;
                return Ok(None);
            }
        }
    };
    reported.sort();
    let utf8_client = reported
        .iter()
        .any(|(name, value)| name == "client_encoding" && value == "UTF8");
    let superuser = reported
        .iter()
        .any(|(name, value)| name == "is_superuser" && value == "on");
    let limits = crate::client_limits::Limits {
        role: login.role_limit,
        database: login.database_limit,
        superuser,
    };
    let admitted = match shared.clients.admit(&user, &database, &limits) {
        Ok(admitted) => admitted,
        Err(error) => {
            refuse(&mut stream, error).await;
            return Ok(None);
        }
    };
    let search_path = login.search_path;
    for (name, value) in &reported {
        protocol::parameter_status(&mut out, name, value);
    }
    let cancel_key = (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>());
    protocol::backend_key_data(&mut out, cancel_key.0, cancel_key.1);
    protocol::ready_for_query(&mut out, b'I');
    stream.write_all(&out).await?;
    let map = shared.maps.get(&database).await;
    let cancel_slot = shared.cancels.register(cancel_key);
    let routing = routing_possible(&settings);
    let idle_timeout = idle_session_timeout(&settings);
    let schemas = search_path
        .as_deref()
        .and_then(|path| crate::search_path::schemas(path, &user));
    if let (Some(path), false) = (
        &search_path,
        settings.iter().any(|(name, _)| name == "search_path"),
    ) {
        // The session keeps the search_path it started with, on every
        // server connection, even if the role's default changes meanwhile
        // (as a server session does).
        settings.push(("search_path".to_owned(), set_statement("search_path", path)));
    }
    tracing::debug!(user = %user, database = %database, "client connected");
    Ok(Some(Session {
        shared,
        stream,
        input,
        output: BytesMut::with_capacity(OUTPUT_FLUSH_BYTES),
        user,
        database,
        map,
        startup_settings: settings.clone(),
        settings,
        search_path_changed: false,
        search_path: schemas,
        temporary_relations: false,
        _admitted: admitted,
        tx: Transaction {
            state: TxState::Idle,
            begin: None,
            pinned: None,
        },
        statements: HashMap::new(),
        portals: HashMap::new(),
        batch: Vec::new(),
        batch_bytes: 0,
        skip_to_sync: false,
        server_skipping: false,
        synced_by_copy: false,
        utf8_client,
        superuser,
        held: None,
        cancel_key,
        serial: SESSION_SERIALS.fetch_add(1, Ordering::Relaxed),
        cancel_slot,
        flushed_in_statement: false,
        pools: HashMap::new(),
        pipes: HashMap::new(),
        hold_cancels: false,
        last_failed: false,
        idle_timeout,
        routing,
        session_targets: HashSet::new(),
        session_connections: HashMap::new(),
        pending_settings: Vec::new(),
        pending_transaction: None,
    }))
}

/// Brings a server session back to its defaults (RESET ALL leaves the
/// role and the session authorization).
const SERVER_DEFAULTS: [&str; 3] = ["RESET SESSION AUTHORIZATION", "RESET ROLE", "RESET ALL"];

/// Runs [`SERVER_DEFAULTS`] and `settings` on a fresh login's connection
/// (a pooled one another client used), so that
/// its ParameterStatus values are the client's; a setting the server
/// refuses comes back as the FATAL error it would end a login with.
/// The CONNECTION LIMITs of the session's role and database, one row each
/// (every name qualified: it runs under the session's search_path).
const CONNECTION_LIMITS_QUERY: &str = "SELECT r.rolconnlimit FROM pg_catalog.pg_roles r \
     WHERE r.rolname OPERATOR(pg_catalog.=) session_user;\n\
     SELECT d.datconnlimit FROM pg_catalog.pg_database d \
     WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()";

/// What a login learns on its first server connection.
struct Login {
    /// `SHOW search_path` after the client's settings.
    search_path: Option<String>,
    /// [`crate::backend::ROLE_SETTINGS_QUERY`] now.
    role_settings: String,
    /// The role's and the database's CONNECTION LIMIT (-1: none).
    role_limit: i64,
    database_limit: i64,
}

async fn apply_settings(
    connection: &mut ServerConnection,
    settings: &[(String, String)],
) -> Result<Login, ServerError> {
    // The role's settings now (a connection made before they changed has
    // other defaults), and last the search_path the session starts with
    // (the role's and the database's defaults apply on the server).
    let statements: Vec<&str> = SERVER_DEFAULTS
        .into_iter()
        .chain([crate::backend::ROLE_SETTINGS_QUERY, CONNECTION_LIMITS_QUERY])
        .chain(settings.iter().map(|(_, sql)| sql.as_str()))
        .chain(["SHOW search_path"])
        .collect();
    let mut out = BytesMut::new();
    protocol::query(&mut out, &statements.join(";\n"));
    let lost = |e: crate::backend::BackendError| ServerError::fatal("08006", e.to_string());
    connection.write(&out).await.map_err(lost)?;
    let mut refused = None;
    let mut rows = Vec::new();
    loop {
        let (tag, body) = connection.read().await.map_err(lost)?;
        match tag {
            b'S' => connection.note_parameter(&body),
            b'D' => {
                if let Some(value) = protocol::data_row_values(&body).first() {
                    rows.push(String::from_utf8_lossy(value.unwrap_or_default()).into_owned());
                }
            }
            b'E' => {
                let mut error = ServerError::parse(&body);
                error.severity = "FATAL".into();
                refused.get_or_insert(error);
            }
            b'Z' => break,
            _ => {}
        }
    }
    match refused {
        Some(error) => {
            connection.session_settings = None;
            Err(error)
        }
        None => {
            connection.session_settings = Some(settings.to_vec());
            connection.declared_map_version = 0;
            // In the order the queries ran.
            let mut rows = rows.into_iter();
            let role_settings = rows.next().unwrap_or_default();
            let mut limit = || {
                rows.next()
                    .and_then(|value| value.parse::<i64>().ok())
                    .unwrap_or(-1)
            };
            let (role_limit, database_limit) = (limit(), limit());
            Ok(Login {
                role_settings,
                role_limit,
                database_limit,
                search_path: rows.next(),
            })
        }
    }
}

async fn refuse(stream: &mut Socket, error: ServerError) {
    let mut out = BytesMut::new();
    protocol::error_response(&mut out, &error);
    let _ = stream.write_all(&out).await;
}

/// Reads one client message during authentication.
async fn read_auth_message(
    stream: &mut Socket,
    input: &mut BytesMut,
    limit: usize,
) -> Result<Bytes, SessionError> {
    loop {
        if let Some((tag, body)) = protocol::split_message(input, limit)? {
            if tag != b'p' {
                return Err(protocol::ProtocolError::UnexpectedType(tag as char).into());
            }
            return Ok(body);
        }
        if stream.read_buf(input).await? == 0 {
            return Err(SessionError::ClientGone);
        }
    }
}

async fn scram_login(
    stream: &mut Socket,
    input: &mut BytesMut,
    shared: &Shared,
    user: &str,
) -> Result<bool, SessionError> {
    let failed = || {
        ServerError::fatal(
            "28P01",
            format!("password authentication failed for user \"{user}\""),
        )
    };
    let mut out = BytesMut::new();
    let mut mechanisms = BytesMut::new();
    protocol::put_cstr(&mut mechanisms, scram::MECHANISM);
    mechanisms.put_u8(0);
    protocol::authentication(&mut out, 10, &mechanisms);
    stream.write_all(&out).await?;
    let mut first = read_auth_message(stream, input, 8192).await?;
    let mechanism = protocol::get_cstr(&mut first, "SASLInitialResponse")?;
    if mechanism != scram::MECHANISM || first.len() < 4 {
        refuse(stream, failed()).await;
        return Ok(false);
    }
    let client_first = first.slice(4..);
    // Unknown users get a made-up verifier so the exchange looks the same.
    let verifier = shared
        .users
        .as_ref()
        .and_then(|users| users.verifier(user).cloned());
    let known = verifier.is_some();
    let verifier = verifier
        .unwrap_or_else(|| scram::Verifier::from_password(&rand::random::<u64>().to_string()));
    let (exchange, server_first) = match ServerExchange::start(verifier, &client_first) {
        Ok(started) => started,
        Err(e) => {
            refuse(stream, ServerError::fatal("28000", e.to_string())).await;
            return Ok(false);
        }
    };
    out.clear();
    protocol::authentication(&mut out, 11, server_first.as_bytes());
    stream.write_all(&out).await?;
    let client_final = read_auth_message(stream, input, 8192).await?;
    match exchange.finish(&client_final) {
        Ok(server_final) if known => {
            out.clear();
            protocol::authentication(&mut out, 12, server_final.as_bytes());
            stream.write_all(&out).await?;
            Ok(true)
        }
        _ => {
            refuse(stream, failed()).await;
            Ok(false)
        }
    }
}

/// Lets the metadata node authenticate the client by relaying the
/// exchange, over TCP whatever `--server-socket-dir` says (the node's
/// rules for TCP clients decide); returns the logged-in server connection.
async fn passthrough_login(
    stream: &mut Socket,
    input: &mut BytesMut,
    shared: &Shared,
    user: &str,
    database: &str,
    replication: Option<&str>,
) -> Result<Option<ServerConnection>, SessionError> {
    let mut retried = false;
    loop {
        match passthrough_attempt(stream, input, shared, user, database, replication).await? {
            // The role's or database's CONNECTION LIMIT is taken up by
            // idle pooled connections (of clients gone): close them, and
            // try again when the client was asked for nothing yet.
            Attempt::Refused(error, asked_client)
                if error.code == "53300" && !asked_client && !retried =>
            {
                retried = true;
                let key = PoolKey {
                    address: shared.metadata.clone(),
                    database: database.to_owned(),
                    user: user.to_owned(),
                };
                if shared.pools.close_idle_of(&key) == 0 {
                    refuse(stream, error).await;
                    return Ok(None);
                }
            }
            Attempt::Refused(error, _) => {
                refuse(stream, error).await;
                return Ok(None);
            }
            Attempt::LoggedIn(server) => return Ok(Some(server)),
            Attempt::Failed => return Ok(None),
        }
    }
}

/// How a passthrough login went.
enum Attempt {
    LoggedIn(ServerConnection),
    /// The server's error, not yet passed on; whether the client was asked
    /// for a password meanwhile.
    Refused(ServerError, bool),
    /// The client has been told.
    Failed,
}

async fn passthrough_attempt(
    stream: &mut Socket,
    input: &mut BytesMut,
    shared: &Shared,
    user: &str,
    database: &str,
    replication: Option<&str>,
) -> Result<Attempt, SessionError> {
    let mut asked_client = false;
    let mut server = match ServerConnection::open_tcp(&shared.metadata).await {
        Ok(server) => server,
        Err(e) => {
            refuse(stream, ServerError::fatal("08006", e.to_string())).await;
            return Ok(Attempt::Failed);
        }
    };
    let mut out = BytesMut::new();
    let mut parameters = vec![("user", user), ("database", database)];
    parameters.extend(replication.map(|mode| ("replication", mode)));
    protocol::startup(&mut out, &parameters);
    let relay = async {
        server.write(&out).await?;
        loop {
            let (tag, body) = server.read().await?;
            match tag {
                b'R' => {
                    let code = body
                        .get(..4)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(-1);
                    if code == 0 {
                        break;
                    }
                    let mut message = BytesMut::new();
                    let at = protocol::begin_message(&mut message, b'R');
                    message.put_slice(&body);
                    protocol::end_message(&mut message, at);
                    stream.write_all(&message).await?;
                    if matches!(code, 3 | 5 | 10 | 11) {
                        asked_client = true;
                        let answer = read_auth_message(stream, input, 8192)
                            .await
                            .map_err(|e| std::io::Error::other(e.to_string()))?;
                        let mut message = BytesMut::new();
                        protocol::password(&mut message, &answer);
                        server.write(&message).await?;
                    }
                }
                b'E' => {
                    let mut error = ServerError::parse(&body);
                    error.severity = "FATAL".into();
                    return Ok::<_, crate::backend::BackendError>(Some(error));
                }
                _ => return Err(protocol::ProtocolError::UnexpectedType(tag as char).into()),
            }
        }
        loop {
            let (tag, body) = server.read().await?;
            if tag == b'E' {
                return Ok(Some(ServerError::parse(&body)));
            }
            if server.finish_startup(tag, &body)? {
                return Ok(None);
            }
        }
    };
    let result = relay.await;
    Ok(match result {
        Ok(None) => Attempt::LoggedIn(server),
        Ok(Some(error)) => Attempt::Refused(error, asked_client),
        Err(e) => {
            refuse(stream, ServerError::fatal("08006", e.to_string())).await;
            Attempt::Failed
        }
    })
}

/// Serves a replication connection: the client is told what the server
/// said at login (its cancel key is the coordinator's, forwarded to the
/// walsender), then bytes go both ways unchanged until either side ends.
async fn relay_replication(
    mut stream: Socket,
    mut input: BytesMut,
    mut server: ServerConnection,
    shared: &Shared,
) {
    let mut out = BytesMut::new();
    protocol::authentication(&mut out, 0, &[]);
    for (name, value) in &server.parameters {
        protocol::parameter_status(&mut out, name, value);
    }
    let cancel_key = (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>());
    let slot = shared.cancels.register(cancel_key);
    if let Ok(mut target) = slot.lock() {
        target.server = Some((server.address.clone(), server.process_id, server.secret_key));
    }
    protocol::backend_key_data(&mut out, cancel_key.0, cancel_key.1);
    protocol::ready_for_query(&mut out, b'I');
    if stream.write_all(&out).await.is_ok() {
        if let Err(e) = server.relay_raw(&mut stream, &mut input).await {
            tracing::debug!(error = %e, "replication connection ended");
        }
    }
    shared.cancels.unregister(cancel_key);
}

/// The settings in a startup `options` string: words separated by spaces
/// (a backslash escapes the next character), each `-c name=value` (or
/// `-cname=value`) or `--name=value`. None for anything else.
fn command_line_settings(options: &str) -> Option<Vec<(String, String)>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.push(chars.next()?),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut settings = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let assignment = if word == "-c" {
            words.next()?
        } else if let Some(rest) = word.strip_prefix("--") {
            rest.to_owned()
        } else if let Some(rest) = word.strip_prefix("-c") {
            rest.to_owned()
        } else {
            return None;
        };
        let (name, value) = assignment.split_once('=')?;
        if name.is_empty() {
            return None;
        }
        // Command-line style allows '-' for '_' in names.
        settings.push((name.replace('-', "_").to_lowercase(), value.to_owned()));
    }
    Some(settings)
}

/// `SET "name" = 'value'`, for a startup parameter or option.
fn set_statement(name: &str, value: &str) -> String {
    use pg_shard_core::quote;
    if LIST_SETTINGS.contains(&name.to_ascii_lowercase().as_str()) {
        // `SET search_path = 'a,b'` would name one schema "a,b"; the value
        // of a startup packet (or SHOW) is the list itself.
        return format!(
            "SELECT pg_catalog.set_config({}, {}, false)",
            quote::literal(name),
            quote::literal(value)
        );
    }
    format!("SET {} = {}", quote::ident(name), quote::literal(value))
}

/// Settings whose value is a list of names (GUC_LIST_QUOTE).
const LIST_SETTINGS: [&str; 5] = [
    "search_path",
    "temp_tablespaces",
    "local_preload_libraries",
    "session_preload_libraries",
    "shared_preload_libraries",
];

/// What the coordinator expects back for each message it sent, in order.
enum Expect {
    /// A prelude sent as a simple Query: swallowed up to its ReadyForQuery
    /// (errors are passed on).
    Hidden,
    ParseComplete {
        visible: bool,
        name: Option<String>,
    },
    BindComplete,
    CloseComplete,
    DescribeStatement,
    DescribePortal,
    Execute,
    /// A simple Query: everything up to ReadyForQuery.
    Query,
    Sync,
    /// CloseComplete of a server statement: it is gone from the connection.
    CloseStatement(String),
    /// A Sync the coordinator added (a side connection must not be left
    /// in an implicit transaction): its ReadyForQuery is not passed on.
    QuietSync,
    /// Not sent: the coordinator answers this message itself.
    Synthetic(Bytes),
}

/// How one round trip ended.
enum Outcome {
    Done,
    /// A connection from the pool turned out dead before it answered;
    /// nothing ran, so the statement goes again on a new connection.
    Stale,
    /// The worker refused with WrongShard and nothing was passed on yet.
    WrongShard(ServerError),
}

impl Session {
    async fn run(&mut self) -> Result<(), SessionError> {
        loop {
            let (message, size) = self.next_message().await?;
            if self.batch.is_empty() {
                self.forget_cancel();
            }
            match message {
                FrontendMessage::Query(sql) => {
                    let command = self.database_command(&sql);
                    let holds = self.let_go_of_databases(command.as_ref());
                    self.simple_query(sql).await?;
                    drop(holds);
                    self.after_database_command(command);
                }
                FrontendMessage::Terminate => return Ok(()),
                FrontendMessage::Sync if self.skip_to_sync => {
                    self.skip_to_sync = false;
                    self.batch.clear();
                    self.batch_bytes = 0;
                    self.push_batch(FrontendMessage::Sync, size);
                    self.extended_batch().await?;
                }
                FrontendMessage::Parse { .. }
                | FrontendMessage::Bind(_)
                | FrontendMessage::Describe { .. }
                | FrontendMessage::Execute { .. }
                | FrontendMessage::Close { .. }
                | FrontendMessage::Flush
                    if self.skip_to_sync => {}
                FrontendMessage::Sync | FrontendMessage::Flush => {
                    self.push_batch(message, size);
                    self.extended_batch().await?;
                }
                FrontendMessage::Parse { .. }
                | FrontendMessage::Bind(_)
                | FrontendMessage::Describe { .. }
                | FrontendMessage::Execute { .. }
                | FrontendMessage::Close { .. } => {
                    self.push_batch(message, size);
                    if self.batch.len() >= BATCH_MESSAGES || self.batch_bytes >= BATCH_BYTES {
                        // A long pipeline: what has come so far goes on now.
                        self.push_batch(FrontendMessage::Flush, 0);
                        self.extended_batch().await?;
                    }
                }
                // Copy data outside COPY is ignored, as PostgreSQL does.
                FrontendMessage::CopyData(_)
                | FrontendMessage::CopyDone
                | FrontendMessage::CopyFail(_) => {}
                FrontendMessage::Password(_) => {
                    return Err(protocol::ProtocolError::UnexpectedType('p').into())
                }
                FrontendMessage::FunctionCall(body) => self.function_call(body).await?,
            }
        }
    }

    /// Adds a message to the batch with the statement its name means at
    /// this point: a Parse defines (or redefines) its name now, so that
    /// later messages of the batch see the new definition and earlier
    /// ones keep theirs.
    fn push_batch(&mut self, message: FrontendMessage, size: usize) {
        let statement = match &message {
            FrontendMessage::Parse {
                name,
                query,
                parameter_types,
            } => {
                let (analysis, normalized) = self.analysis(query);
                let statement = Arc::new(Prepared {
                    sql: query.clone(),
                    parameter_types: parameter_types.clone(),
                    analysis,
                    normalized,
                });
                self.statements.insert(name.clone(), statement.clone());
                Some(statement)
            }
            FrontendMessage::Bind(bind) => self.statements.get(&bind.statement).cloned(),
            FrontendMessage::Describe { kind: b'S', name } => self.statements.get(name).cloned(),
            // The definition closed (its server statement may go too).
            FrontendMessage::Close { kind: b'S', name } => self.statements.remove(name),
            _ => None,
        };
        self.batch_bytes += size;
        self.batch.push(BatchItem { message, statement });
    }

    /// The next message of a client between statements. Meanwhile what
    /// the server holding its session state on the metadata node sends
    /// (notifications of its LISTENs, notices, the error that ends the
    /// session) reaches it; idle outside a transaction for longer than its
    /// idle_session_timeout, the session ends as the server would end it.
    async fn next_message(&mut self) -> Result<(FrontendMessage, usize), SessionError> {
        let idle = self.tx.state == TxState::Idle && self.held.is_none() && self.batch.is_empty();
        let deadline = self
            .idle_timeout
            .filter(|_| idle)
            .map(|limit| tokio::time::Instant::now() + limit);
        loop {
            if let Some(message) = self.buffered_message()? {
                return Ok(message);
            }
            let woke = {
                let watched = self
                    .session_connections
                    .get_mut(&Target::Metadata)
                    .map(|lease| lease.connection());
                let server = async {
                    match watched {
                        Some(connection) => connection.read().await,
                        None => std::future::pending().await,
                    }
                };
                let timeout = async {
                    match deadline {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    read = self.stream.read_buf(&mut self.input) => Woke::Client(read),
                    message = server => Woke::Server(message),
                    () = timeout => Woke::IdleTimeout,
                }
            };
            match woke {
                Woke::Client(read) => {
                    if read? == 0 {
                        return Err(SessionError::ClientGone);
                    }
                }
                Woke::Server(Ok((tag, body))) => self.unprompted(tag, &body).await?,
                Woke::Server(Err(e)) => {
                    self.session_connections.remove(&Target::Metadata);
                    let message = format!(
                        "pg_shard coordinator: the server session holding this session's state ended: {e}"
                    );
                    self.reply_error(ServerError::fatal("08006", message.clone()));
                    self.flush().await?;
                    return Err(SessionError::ServerEnded(message));
                }
                Woke::IdleTimeout => {
                    let message = "terminating connection due to idle-session timeout";
                    self.reply_error(ServerError::fatal("57P05", message));
                    self.flush().await?;
                    return Err(SessionError::ServerEnded(message.into()));
                }
            }
        }
    }

    /// A message the metadata node's session connection sent between
    /// statements.
    async fn unprompted(&mut self, tag: u8, body: &[u8]) -> Result<(), SessionError> {
        match tag {
            b'A' | b'N' => self.pass_notice(tag, body),
            b'S' => {
                if let Some(lease) = self.session_connections.get_mut(&Target::Metadata) {
                    lease.connection().note_parameter(body);
                }
                self.pass(tag, body);
            }
            b'E' => {
                let error = ServerError::parse(body);
                self.pass(tag, body);
                if matches!(error.severity.as_str(), "FATAL" | "PANIC") {
                    if let Some(mut lease) = self.session_connections.remove(&Target::Metadata) {
                        lease.connection().broken = true;
                    }
                    self.flush().await?;
                    return Err(SessionError::ServerEnded(error.message));
                }
            }
            _ => {
                // Out of step: the session's state cannot be trusted.
                if let Some(mut lease) = self.session_connections.remove(&Target::Metadata) {
                    lease.connection().broken = true;
                }
            }
        }
        self.flush().await
    }

    /// A whole client message already read, and its size on the wire.
    fn buffered_message(&mut self) -> Result<Option<(FrontendMessage, usize)>, SessionError> {
        let before = self.input.len();
        let message = protocol::decode_frontend(
            &mut self.input,
            self.shared.config.max_message_bytes,
            self.utf8_client,
        )?;
        Ok(message.map(|message| (message, before - self.input.len())))
    }

    /// The next client message and its size on the wire.
    async fn read_message(&mut self) -> Result<(FrontendMessage, usize), SessionError> {
        loop {
            if let Some(message) = self.buffered_message()? {
                return Ok(message);
            }
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(SessionError::ClientGone);
            }
        }
    }

    async fn flush(&mut self) -> Result<(), SessionError> {
        if !self.output.is_empty() {
            let result = self.stream.write_all(&self.output).await;
            self.output.clear();
            self.flushed_in_statement = true;
            result.map_err(|_| SessionError::ClientGone)?;
        }
        Ok(())
    }

    fn status_byte(&self) -> u8 {
        match self.tx.state {
            TxState::Idle => b'I',
            TxState::Open => b'T',
            TxState::Failed => b'E',
        }
    }

    fn analysis(&self, sql: &str) -> (Arc<Analysis>, Normalized) {
        let (analysis, normalized) = self.shared.statements.get(sql);
        if matches!(*analysis, Analysis::Routable(_)) && protocol::has_client_bytes(sql) {
            // Literals in another encoding than UTF-8 would hash wrong:
            // the metadata node runs it.
            let other = Analysis::Other {
                tableless: false,
                keeps_state: false,
            };
            return (Arc::new(other), normalized);
        }
        (analysis, normalized)
    }

    // ---- statements about whole databases --------------------------------

    /// What `sql` does to whole databases, if it runs on the metadata node.
    fn database_command(&self, sql: &str) -> Option<DatabaseCommand> {
        let (analysis, _) = self.shared.statements.get(sql);
        match *analysis {
            Analysis::Other { .. } => database_commands::database_command(sql),
            _ => None,
        }
    }

    /// Before a statement that needs databases free of other sessions: the
    /// coordinator's idle connections to them close, and their map
    /// listeners stay away while the holds live.
    fn let_go_of_databases(&mut self, command: Option<&DatabaseCommand>) -> Vec<ListenerHold> {
        let Some(command) = command else {
            return Vec::new();
        };
        // Until a server answers it, the statement counts as failed (the
        // coordinator may answer it with an error itself).
        self.last_failed = true;
        let mut holds = Vec::new();
        for database in &command.needs_free {
            holds.extend(
                self.shared
                    .maps
                    .existing(database)
                    .map(|map| map.hold_listener()),
            );
            self.shared.pools.close_idle_to(database);
        }
        holds
    }

    /// After it succeeded, the names it dropped, renamed or created have
    /// their maps read anew (and their old pooled connections are gone).
    fn after_database_command(&self, command: Option<DatabaseCommand>) {
        let Some(command) = command else {
            return;
        };
        // Failed, or inside a transaction that may still roll back (ALTER
        // DATABASE … RENAME can run in one): nothing to renew yet.
        if self.last_failed || self.tx.state != TxState::Idle {
            return;
        }
        for database in &command.renews {
            self.shared.maps.renew(database);
            self.shared.pools.close_idle_to(database);
        }
    }

    // ---- simple query ---------------------------------------------------

    async fn simple_query(&mut self, sql: String) -> Result<(), SessionError> {
        let (analysis, normalized) = self.analysis(&sql);
        // A failed transaction still on its server: the server answers
        // (COMMIT, ROLLBACK, ROLLBACK TO SAVEPOINT work, the rest is 25P02).
        // One the coordinator rolled back itself: answered here.
        if self.tx.state == TxState::Failed
            && self.tx.pinned.is_none()
            && !matches!(
                *analysis,
                Analysis::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback)
            )
        {
            self.reply_error(aborted_error());
            return self.finish_reply().await;
        }
        match &*analysis {
            Analysis::Admin(command) => {
                let viewer = admin::Viewer {
                    user: &self.user,
                    superuser: self.superuser,
                };
                admin::reply(
                    command,
                    &self.shared,
                    &self.map.current(),
                    &viewer,
                    &mut self.output,
                );
                return self.finish_reply().await;
            }
            Analysis::Transaction(TransactionCommand::Begin) if self.tx.state == TxState::Idle => {
                self.tx.state = TxState::Open;
                self.tx.begin = Some(sql);
                protocol::command_complete(&mut self.output, "BEGIN");
                return self.finish_reply().await;
            }
            Analysis::Transaction(
                command @ (TransactionCommand::Commit | TransactionCommand::Rollback),
            ) if self.tx.state != TxState::Idle && self.tx.pinned.is_none() => {
                // Nothing was sent anywhere: the transaction ends here.
                let tag =
                    if *command == TransactionCommand::Commit && self.tx.state == TxState::Open {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    };
                self.end_transaction();
                protocol::command_complete(&mut self.output, tag);
                return self.finish_reply().await;
            }
            Analysis::SearchPath { temporary: true } => self.temporary_relations = true,
            Analysis::SearchPath { temporary: false } => self.search_path_changed = true,
            _ => {}
        }
        let effect = session_effect(&analysis);
        let committing = matches!(*analysis, Analysis::Transaction(TransactionCommand::Commit))
            && self.tx.state == TxState::Open;
        let mut tries = 0;
        loop {
            tries += 1;
            let map = self.map.current();
            let (target, text, shard) = match self.choose_simple(&analysis, &sql, &normalized, &map)
            {
                Ok(choice) => choice,
                Err(error) => {
                    self.abort_pinned(error).await;
                    return self.finish_reply().await;
                }
            };
            let retryable = self.may_retry(target) && tries < self.shared.config.wrong_shard_tries;
            if multiplexable(&analysis) {
                if let Some(pipe) = self.pipe(target, &map) {
                    let ran = self
                        .multiplexed(pipe, &map, shard, retryable, |_, _| {
                            let mut bytes = BytesMut::new();
                            protocol::query(&mut bytes, &text);
                            let built = Built {
                                bytes,
                                answers: 1,
                                prepares: Vec::new(),
                            };
                            Some((built, vec![Expect::Query]))
                        })
                        .await?;
                    match ran {
                        Some(Outcome::WrongShard(error)) => {
                            self.note_wrong_shard(&map, &error).await;
                            continue;
                        }
                        Some(_) => break,
                        None => {}
                    }
                }
            }
            let Some(lease) = self.acquire(target, &map, false, true).await? else {
                return Ok(());
            };
            let mut request = BytesMut::new();
            protocol::query(&mut request, &text);
            match self
                .exchange(
                    lease,
                    target,
                    &map,
                    shard,
                    retryable,
                    false,
                    true,
                    effect,
                    request,
                    vec![Expect::Query],
                )
                .await?
            {
                Outcome::Done => break,
                // Pooled connections are discarded, so this ends.
                Outcome::Stale => tries -= 1,
                Outcome::WrongShard(error) => {
                    self.note_wrong_shard(&map, &error).await;
                }
            }
        }
        let sets = if sets_parameter(&analysis) {
            vec![sql.clone()]
        } else {
            Vec::new()
        };
        self.after_statements(sets, committing, discards_all(&sql));
        Ok(())
    }

    /// Session state after statements ran: successful SETs are kept
    /// (inside a transaction once it commits), DISCARD ALL forgets it all.
    fn after_statements(&mut self, sets: Vec<String>, committing: bool, discards: bool) {
        if !self.last_failed {
            if self.tx.state == TxState::Idle {
                for sql in sets {
                    self.remember_setting(&sql);
                }
            } else {
                self.pending_settings.extend(sets);
            }
            if committing && self.tx.state == TxState::Idle {
                for sql in std::mem::take(&mut self.pending_settings) {
                    self.remember_setting(&sql);
                }
            }
            if discards {
                // A new session as far as pooled connections go: the
                // statements and sequence state it left on them are gone
                // for the client, so the next use clears them.
                self.serial = SESSION_SERIALS.fetch_add(1, Ordering::Relaxed);
                // Prepared statements and portals went with it.
                self.statements.clear();
                self.portals.clear();
                self.forget_session_state();
                self.settings = self.startup_settings.clone();
                self.search_path_changed = false;
                self.temporary_relations = false;
                self.routing = routing_possible(&self.settings);
                self.idle_timeout = idle_session_timeout(&self.settings);
                self.pipes.clear();
            }
        }
        if self.tx.state == TxState::Idle {
            self.pending_settings.clear();
        }
    }

    /// A fast-path function call: on the transaction's node, else on the
    /// metadata node (large objects live there).
    async fn function_call(&mut self, body: Bytes) -> Result<(), SessionError> {
        if self.tx.state == TxState::Failed && self.tx.pinned.is_none() {
            self.reply_error(aborted_error());
            return self.finish_reply().await;
        }
        let target = self
            .tx
            .pinned
            .as_ref()
            .map_or(Target::Metadata, |(target, _)| *target);
        let map = self.map.current();
        for _ in 0..3 {
            let Some(lease) = self.acquire(target, &map, false, true).await? else {
                return Ok(());
            };
            let mut request = BytesMut::new();
            let at = protocol::begin_message(&mut request, b'F');
            request.put_slice(&body);
            protocol::end_message(&mut request, at);
            let outcome = self
                .exchange(
                    lease,
                    target,
                    &map,
                    None,
                    false,
                    false,
                    true,
                    SessionEffect::Unknown,
                    request,
                    vec![Expect::Query],
                )
                .await?;
            // A pooled connection found dead before it answered: again.
            if !matches!(outcome, Outcome::Stale) {
                break;
            }
        }
        Ok(())
    }

    /// The node and text for a simple-query statement.
    fn choose_simple(
        &self,
        analysis: &Analysis,
        sql: &str,
        normalized: &Normalized,
        map: &ClusterMap,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        if let (TxState::Failed, Some((target, _))) = (self.tx.state, &self.tx.pinned) {
            return Ok((*target, sql.to_owned(), None));
        }
        let route = match analysis {
            Analysis::Routable(shape) if self.routing => router::route(
                shape,
                sql,
                normalized,
                map,
                &router::Session {
                    search_path: self.known_search_path(),
                },
                None,
            ),
            _ => Route::Metadata,
        };
        self.place(route, analysis, sql)
    }

    /// Fits a route to the transaction's node.
    fn place(
        &self,
        route: Route,
        analysis: &Analysis,
        sql: &str,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        let pinned = self.tx.pinned.as_ref().map(|(target, _)| *target);
        if self.tx.state != TxState::Idle
            && pinned.is_none()
            && self.session_targets.contains(&Target::Metadata)
        {
            // A client with session state on the metadata node (temporary
            // tables, …) runs its transactions there, with that state.
            return Ok((Target::Metadata, sql.to_owned(), None));
        }
        match (route, pinned) {
            (
                Route::Worker {
                    node, sql, shard, ..
                },
                None,
            ) => Ok((Target::Worker(node), sql, shard)),
            (
                Route::Worker {
                    node, sql, shard, ..
                },
                Some(Target::Worker(p)),
            ) if p == node => Ok((Target::Worker(node), sql, shard)),
            // The metadata node can run anything, including statements on
            // distributed tables, in the same transaction.
            (_, Some(Target::Metadata)) => Ok((Target::Metadata, sql.to_owned(), None)),
            (Route::ReferenceOnly { rewrites }, Some(Target::Worker(p))) => {
                match rewrites.get(&p) {
                    Some(text) => Ok((Target::Worker(p), text.clone(), None)),
                    None => Err(spans_nodes(p)),
                }
            }
            (Route::ReferenceOnly { .. }, None) | (Route::Metadata, None) => {
                Ok((Target::Metadata, sql.to_owned(), None))
            }
            (Route::Worker { .. }, Some(Target::Worker(p))) => Err(spans_nodes(p)),
            (Route::Metadata, Some(Target::Worker(p))) => match analysis {
                // Statements that name no table (SET LOCAL, SELECT now(),
                // SHOW, SET search_path), transaction control and what
                // cannot be parsed (the worker reports the syntax error)
                // run where the transaction is.
                Analysis::Transaction(_)
                | Analysis::Other {
                    tableless: true, ..
                }
                | Analysis::SearchPath { temporary: false }
                | Analysis::Unparsed => Ok((Target::Worker(p), sql.to_owned(), None)),
                _ => Err(spans_nodes(p)),
            },
        }
    }

    /// A WrongShard answer may be retried when nothing of the transaction
    /// has run yet: autocommit, or the transaction's first statement.
    fn may_retry(&self, target: Target) -> bool {
        matches!(target, Target::Worker(_))
            && self.tx.pinned.is_none()
            // Messages sent before a Flush ran on the held connection: a
            // retry of the rest would lose them.
            && self.held.is_none()
            && self.tx.state != TxState::Failed
    }

    async fn note_wrong_shard(&mut self, map: &ClusterMap, error: &ServerError) {
        self.shared
            .metrics
            .wrong_shard_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %self.database, version = map.version, message = %error.message, "WrongShard: reloading the shard map and retrying");
        if error.code == UNDEFINED_TABLE {
            // Whatever its version: the database may be another one now.
            self.map.reload_anew(Some(map)).await;
            return;
        }
        // During a shard move's cutover the old owner refuses before the
        // new map is published: wait (a little longer each time) for a
        // newer map, so that the retry finds the new owner. NOTIFY usually
        // brings it first.
        let deadline = Instant::now() + WRONG_SHARD_WAIT;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.map.reload(map.version).await {
                Ok(newer) if newer.version > map.version => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "shard map reload failed");
                    return;
                }
            }
            if Instant::now() + pause > deadline {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Records a successful session-level SET or RESET (a statement of its
    /// own, outside a transaction), to be replayed on every server
    /// connection this client uses from now on. The replayed text is
    /// regenerated from the parse tree: nothing else the client sent with
    /// it (comments, other statements) is replayed.
    fn remember_setting(&mut self, sql: &str) {
        let Ok(parsed) = pg_query::parse(sql) else {
            return;
        };
        // Outside transactions only: one inside may still roll back.
        if parsed.protobuf.stmts.len() != 1 || self.tx.state != TxState::Idle {
            return;
        }
        let Some(set) = first_set_statement(&parsed) else {
            return;
        };
        if set.is_local {
            return;
        }
        use pg_query::protobuf::VariableSetKind as K;
        match K::try_from(set.kind) {
            Ok(K::VarResetAll) => {
                // Back to the startup values; RESET ALL leaves the role and
                // the session authorization as they are.
                let kept = |name: &str| matches!(name, "role" | "session_authorization");
                self.settings.retain(|(name, _)| kept(name));
                let startup = self.startup_settings.iter().filter(|(name, _)| !kept(name));
                self.settings.extend(startup.cloned());
                self.search_path_changed = self.differs_from_login();
            }
            Ok(K::VarReset | K::VarSetDefault) => {
                self.settings.retain(|(name, _)| *name != set.name);
                let startup = self
                    .startup_settings
                    .iter()
                    .find(|(name, _)| *name == set.name);
                self.settings.extend(startup.cloned());
                if matches!(
                    set.name.as_str(),
                    "search_path" | "role" | "session_authorization"
                ) {
                    self.search_path_changed = self.differs_from_login();
                }
            }
            Ok(K::VarSetValue | K::VarSetCurrent) => {
                let Ok(text) = pg_query::deparse(&parsed.protobuf) else {
                    return;
                };
                self.settings.retain(|(name, _)| *name != set.name);
                self.settings.push((set.name.clone(), text));
            }
            _ => {}
        }
        self.routing = routing_possible(&self.settings);
        self.idle_timeout = idle_session_timeout(&self.settings);
        // Pipes are shared by clients with the same settings.
        self.pipes.clear();
    }

    fn reply_error(&mut self, error: ServerError) {
        protocol::error_response(&mut self.output, &error);
    }

    /// The schemas unqualified names resolve in, when the coordinator
    /// knows them.
    fn known_search_path(&self) -> Option<&[String]> {
        if self.search_path_changed || self.temporary_relations {
            return None;
        }
        self.search_path.as_deref()
    }

    /// After a RESET: the search_path or the role (which `$user` follows)
    /// is not the login's.
    fn differs_from_login(&self) -> bool {
        let setting = |settings: &[(String, String)], wanted: &str| {
            settings
                .iter()
                .find(|(name, _)| name == wanted)
                .map(|(_, sql)| sql.clone())
        };
        ["search_path", "role", "session_authorization"]
            .iter()
            .any(|name| setting(&self.settings, name) != setting(&self.startup_settings, name))
    }

    /// Ends a reply the coordinator made itself.
    async fn finish_reply(&mut self) -> Result<(), SessionError> {
        let status = self.status_byte();
        protocol::ready_for_query(&mut self.output, status);
        self.flush().await
    }

    fn end_transaction(&mut self) {
        self.tx.state = TxState::Idle;
        self.tx.begin = None;
        if let Some((target, lease)) = self.tx.pinned.take() {
            self.release(target, lease);
        }
        self.portals.clear();
    }

    /// A connection the client is done with for now: kept when it holds
    /// the client's session state on that node, else back to its pool.
    fn release(&mut self, target: Target, lease: Lease) {
        let mut lease = lease;
        if self.session_targets.contains(&target) && !lease.connection().broken {
            self.session_connections.insert(target, lease);
        }
    }

    /// DISCARD ALL succeeded: the client's session connections are closed
    /// (nothing of its state is left to keep) and it is pooled again.
    fn forget_session_state(&mut self) {
        self.session_targets.clear();
        for (_, mut lease) in self.session_connections.drain() {
            lease.connection().broken = true;
        }
    }

    /// A statement needs another node than the transaction's: report it,
    /// roll the transaction back on its node, and fail it for the client.
    async fn abort_pinned(&mut self, error: ServerError) {
        self.reply_error(error);
        if let Some((target, mut lease)) = self.tx.pinned.take() {
            self.roll_back(&mut lease).await;
            self.release(target, lease);
        }
        self.abort_held();
        self.tx.state = if self.tx.state == TxState::Idle {
            TxState::Idle
        } else {
            TxState::Failed
        };
        self.tx.begin = None;
    }

    /// Rolls back the transaction open on `lease`.
    async fn roll_back(&mut self, lease: &mut Lease) {
        {
            let connection = lease.connection();
            let mut out = BytesMut::new();
            // A connection between Flush and Sync answers nothing before a Sync.
            let mut answers = 1;
            if connection.awaiting_sync {
                protocol::sync(&mut out);
                answers = 2;
            }
            protocol::query(&mut out, "ROLLBACK");
            let rolled_back = async {
                connection.write(&out).await?;
                loop {
                    let (tag, body) = connection.read().await?;
                    if tag == b'Z' {
                        answers -= 1;
                        if answers == 0 {
                            connection.status = body.first().copied().unwrap_or(b'E');
                            connection.awaiting_sync = false;
                            return Ok::<_, crate::backend::BackendError>(());
                        }
                    }
                }
            }
            .await;
            if rolled_back.is_err() {
                connection.broken = true;
            }
        }
    }

    // ---- extended query -------------------------------------------------

    /// Runs the batch; around a whole-database statement in it (drivers
    /// send DROP DATABASE with the extended protocol too), as for a
    /// simple query.
    async fn extended_batch(&mut self) -> Result<(), SessionError> {
        let command = self
            .batch
            .iter()
            .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
            .filter_map(|item| item.statement.as_ref())
            .find_map(|statement| match *statement.analysis {
                Analysis::Other { .. } => database_commands::database_command(&statement.sql),
                _ => None,
            });
        let holds = self.let_go_of_databases(command.as_ref());
        let result = self.run_extended_batch().await;
        drop(holds);
        if result.is_ok() {
            self.after_database_command(command);
        }
        result
    }

    async fn run_extended_batch(&mut self) -> Result<(), SessionError> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let synced = matches!(
            batch.last().map(|item| &item.message),
            Some(FrontendMessage::Sync)
        );
        // Names must exist before anything is sent.
        let missing = batch.iter().find_map(|item| match &item.message {
            FrontendMessage::Bind(bind) if item.statement.is_none() => Some(&bind.statement),
            FrontendMessage::Describe { kind: b'S', name } if item.statement.is_none() => {
                Some(name)
            }
            _ => None,
        });
        if let Some(name) = missing {
            let error = ServerError::new(
                "26000",
                format!("prepared statement \"{name}\" does not exist"),
            );
            return self.fail_batch(error, synced).await;
        }
        if self.answer_transaction_batch(&batch) {
            return self.end_batch(synced).await;
        }
        let only_sync = batch
            .iter()
            .all(|item| matches!(item.message, FrontendMessage::Sync | FrontendMessage::Flush));
        if only_sync && self.held.is_none() && self.tx.pinned.is_none() {
            // Nothing is open on a server: the coordinator answers.
            return self.end_batch(synced).await;
        }
        // Rolled back by the coordinator itself: nothing but COMMIT or
        // ROLLBACK (answered above) ends it.
        if self.tx.state == TxState::Failed && self.tx.pinned.is_none() && !only_sync {
            return self.fail_batch(aborted_error(), synced).await;
        }
        let committing = self.tx.state == TxState::Open
            && batch.iter().any(|item| {
                matches!(item.message, FrontendMessage::Bind(_))
                    && item.statement.as_ref().is_some_and(|statement| {
                        matches!(
                            *statement.analysis,
                            Analysis::Transaction(TransactionCommand::Commit)
                        )
                    })
            });
        let mut tries = 0;
        loop {
            tries += 1;
            let map = self.map.current();
            let plan = match self.plan_batch(&batch, &map) {
                Ok(plan) => plan,
                Err(error) => {
                    self.abort_pinned(error).await;
                    return self.finish_batch(synced).await;
                }
            };
            let retryable = synced
                && self.may_retry(plan.target)
                && tries < self.shared.config.wrong_shard_tries;
            match self.send_batch(&batch, &plan, &map, retryable).await? {
                Outcome::Done => {
                    let bound = || {
                        batch
                            .iter()
                            .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
                            .filter_map(|item| item.statement.as_ref())
                    };
                    let sets = bound()
                        .filter(|statement| sets_parameter(&statement.analysis))
                        .map(|statement| statement.sql.clone())
                        .collect();
                    let discards = bound().any(|statement| discards_all(&statement.sql));
                    self.after_statements(sets, committing, discards);
                    if !synced && self.server_skipping {
                        // The server skips to the Sync after an error; so
                        // does the coordinator with what the client sends.
                        self.skip_to_sync = true;
                    }
                    return Ok(());
                }
                Outcome::Stale => tries -= 1,
                Outcome::WrongShard(error) => self.note_wrong_shard(&map, &error).await,
            }
        }
    }

    /// Reports an error the coordinator found in a batch before sending
    /// it; an open extended-protocol transaction is rolled back, and
    /// before a Sync what the client sends up to it is skipped.
    async fn fail_batch(&mut self, error: ServerError, synced: bool) -> Result<(), SessionError> {
        self.reply_error(error);
        self.abort_held();
        self.finish_batch(synced).await
    }

    /// A connection held since a Flush outside a transaction runs the
    /// implicit transaction of the extended-protocol messages so far; a
    /// Sync would commit it, so after an error it is closed instead (the
    /// server rolls back).
    fn abort_held(&mut self) {
        if let Some((_, mut lease)) = self.held.take() {
            lease.connection().broken = true;
        }
    }

    /// BEGIN, or COMMIT/ROLLBACK of a transaction that has not reached a
    /// server yet, sent with the extended protocol (as drivers and pgbench
    /// -M extended/prepared do): answered here, as in [`Self::simple_query`].
    /// False when the batch holds anything else.
    fn answer_transaction_batch(&mut self, batch: &[BatchItem]) -> bool {
        // A transaction command bound in an earlier batch (ended by Flush,
        // as pg8000 sends them) and executed in this one.
        let pending = self.pending_transaction.take();
        let mut command = None;
        let mut executed = None;
        for item in batch {
            match &item.message {
                FrontendMessage::Bind(bind) => {
                    if command.is_some() {
                        return false;
                    }
                    let Some(statement) = &item.statement else {
                        return false;
                    };
                    let Analysis::Transaction(kind) = &*statement.analysis else {
                        return false;
                    };
                    command = Some((kind.clone(), statement.sql.clone(), bind.portal.clone()));
                }
                FrontendMessage::Parse { .. } => {
                    let is_transaction = item
                        .statement
                        .as_ref()
                        .is_some_and(|s| matches!(*s.analysis, Analysis::Transaction(_)));
                    if !is_transaction {
                        return false;
                    }
                }
                FrontendMessage::Execute { portal, .. } => {
                    if executed.is_some() {
                        return false;
                    }
                    executed = Some(portal.clone());
                }
                FrontendMessage::Describe { .. }
                | FrontendMessage::Sync
                | FrontendMessage::Flush => {}
                _ => return false,
            }
        }
        if command.is_none() {
            command = pending;
        }
        let Some((kind, sql, portal)) = command else {
            return false;
        };
        if executed
            .as_ref()
            .is_some_and(|executed| *executed != portal)
        {
            return false;
        }
        if self.held.is_some() {
            return false;
        }
        let tag = match kind {
            TransactionCommand::Begin if self.tx.state == TxState::Idle => "BEGIN",
            TransactionCommand::Commit | TransactionCommand::Rollback
                if self.tx.state != TxState::Idle && self.tx.pinned.is_none() =>
            {
                if kind == TransactionCommand::Commit && self.tx.state == TxState::Open {
                    "COMMIT"
                } else {
                    "ROLLBACK"
                }
            }
            _ => return false,
        };
        for item in batch {
            match &item.message {
                FrontendMessage::Parse { .. } => protocol::empty(&mut self.output, b'1'),
                FrontendMessage::Bind(_) => protocol::empty(&mut self.output, b'2'),
                FrontendMessage::Describe { kind: b'S', .. } => {
                    // No parameters, no rows.
                    self.output.put_slice(&[b't', 0, 0, 0, 6, 0, 0]);
                    protocol::empty(&mut self.output, b'n');
                }
                FrontendMessage::Describe { .. } => protocol::empty(&mut self.output, b'n'),
                FrontendMessage::Execute { .. } => {
                    protocol::command_complete(&mut self.output, tag)
                }
                _ => {}
            }
        }
        if executed.is_none() {
            // Bound, not executed yet: it takes effect with its Execute.
            self.pending_transaction = Some((kind, sql, portal));
        } else if tag == "BEGIN" {
            self.tx.state = TxState::Open;
            self.tx.begin = Some(sql);
        } else {
            self.end_transaction();
        }
        true
    }

    /// Picks the batch's node and each bound statement's text there.
    fn plan_batch(&self, batch: &[BatchItem], map: &ClusterMap) -> Result<BatchPlan, ServerError> {
        let pinned = self
            .tx
            .pinned
            .as_ref()
            .or(self.held.as_ref())
            .map(|(target, _)| *target);
        // A failed transaction on its server: the server answers everything.
        if let (TxState::Failed, Some(target)) = (self.tx.state, pinned) {
            return Ok(BatchPlan {
                target,
                texts: HashMap::new(),
                shard: None,
                side_connection: false,
            });
        }
        let session = router::Session {
            search_path: self.known_search_path(),
        };
        let mut routes: Vec<(usize, Route)> = Vec::new();
        let mut runs = false;
        for (index, item) in batch.iter().enumerate() {
            match &item.message {
                FrontendMessage::Bind(bind) => {
                    runs = true;
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let route = match &*statement.analysis {
                        Analysis::Routable(shape) if self.routing => router::route(
                            shape,
                            &statement.sql,
                            &statement.normalized,
                            map,
                            &session,
                            Some(&router::Parameters {
                                values: &bind.parameters,
                                formats: &|i| bind.parameter_format(i),
                                declared_types: &statement.parameter_types,
                            }),
                        ),
                        _ => Route::Metadata,
                    };
                    routes.push((index, route));
                }
                FrontendMessage::Execute { .. } | FrontendMessage::Close { kind: b'P', .. } => {
                    runs = true
                }
                FrontendMessage::Describe { kind: b'P', .. } => runs = true,
                _ => {}
            }
        }
        if !runs {
            // Nothing executes. Between Flush and Sync, or in a transaction
            // on the metadata node, the batch goes on its connection (a Sync
            // must end what is open there). Parse / Describe statement in a
            // transaction on a worker: the metadata node answers on another
            // connection (it knows every table by its name; no side effects).
            // Otherwise the metadata node.
            let describes = batch.iter().any(|item| {
                matches!(
                    item.message,
                    FrontendMessage::Parse { .. } | FrontendMessage::Describe { kind: b'S', .. }
                )
            });
            let (target, side_connection) = match (self.held.as_ref(), pinned) {
                (Some((held, _)), _) => (*held, false),
                (None, Some(Target::Worker(_))) if describes => (Target::Metadata, true),
                (None, Some(target)) => (target, false),
                // A transaction that has not picked its node yet (BEGIN,
                // then a prepare, as pgbench -M prepared does): answered
                // outside it, so that its first statement still picks.
                (None, None) if self.tx.state == TxState::Open && describes => {
                    (Target::Metadata, true)
                }
                (None, None) => (Target::Metadata, false),
            };
            return Ok(BatchPlan {
                target,
                texts: HashMap::new(),
                shard: None,
                side_connection,
            });
        }
        // Every bound statement must fit one node.
        let mut target: Option<Target> = pinned;
        let mut texts = HashMap::new();
        let mut shard = None;
        let mut all_routed = true;
        for (index, route) in routes {
            let Some(statement) = &batch[index].statement else {
                continue;
            };
            let (placed, text, s) = match self.place(route, &statement.analysis, &statement.sql) {
                Ok(placed) => placed,
                Err(error) if self.tx.pinned.is_some() => return Err(error),
                Err(_) => {
                    all_routed = false;
                    continue;
                }
            };
            if target.is_some_and(|t| t != placed) {
                if self.tx.pinned.is_some() || self.held.is_some() {
                    if let Some(Target::Worker(p)) = target {
                        return Err(spans_nodes(p));
                    }
                }
                all_routed = false;
            }
            target.get_or_insert(placed);
            shard = shard.or(s);
            texts.insert(index, text);
        }
        let target = match target {
            Some(target) if all_routed => target,
            // Binds that disagree: the metadata node runs the whole batch.
            _ => {
                texts.clear();
                shard = None;
                Target::Metadata
            }
        };
        if target == Target::Metadata {
            texts.clear();
        }
        Ok(BatchPlan {
            target,
            texts,
            shard,
            side_connection: false,
        })
    }

    async fn send_batch(
        &mut self,
        batch: &[BatchItem],
        plan: &BatchPlan,
        map: &ClusterMap,
        retryable: bool,
    ) -> Result<Outcome, SessionError> {
        let synced = matches!(
            batch.last().map(|item| &item.message),
            Some(FrontendMessage::Sync)
        );
        if self.batch_multiplexable(batch, plan) {
            if let Some(pipe) = self.pipe(plan.target, map) {
                let answers = batch
                    .iter()
                    .filter(|item| matches!(item.message, FrontendMessage::Sync))
                    .count();
                let ran = self
                    .multiplexed(pipe, map, plan.shard, retryable, |session, prepared| {
                        let (bytes, expects, prepares) =
                            session.batch_request(batch, plan, prepared);
                        let built = Built {
                            bytes,
                            answers,
                            prepares,
                        };
                        Some((built, expects))
                    })
                    .await?;
                if let Some(outcome) = ran {
                    return Ok(outcome);
                }
            }
        }
        let Some(mut lease) = self
            .acquire(plan.target, map, plan.side_connection, synced)
            .await?
        else {
            return Ok(Outcome::Done);
        };
        // What running the bound statements may leave on the connection.
        let effect = batch
            .iter()
            .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
            .filter_map(|item| item.statement.as_ref())
            .map(|statement| session_effect(&statement.analysis))
            .max()
            .unwrap_or(SessionEffect::None);
        let (mut request, mut expects, _) =
            self.batch_request(batch, plan, &lease.connection().prepared);
        if plan.side_connection && !synced {
            // Not the client's transaction: its implicit one ends here.
            protocol::sync(&mut request);
            expects.push(Expect::QuietSync);
        }
        self.exchange(
            lease,
            plan.target,
            map,
            plan.shard,
            retryable,
            plan.side_connection,
            synced,
            effect,
            request,
            expects,
        )
        .await
    }

    /// The messages of `batch` as sent to the server (`already` prepared
    /// there), what to expect back for each, and the named statements the
    /// request prepares. One pass over the batch.
    fn batch_request(
        &mut self,
        batch: &[BatchItem],
        plan: &BatchPlan,
        already: &HashSet<String>,
    ) -> (BytesMut, Vec<Expect>, Vec<String>) {
        let on_worker = matches!(plan.target, Target::Worker(_));
        // On a worker, a statement's text is the one rewritten where the
        // batch first binds that definition of it.
        let mut bound_texts: HashMap<*const Prepared, &String> = HashMap::new();
        if on_worker {
            for (index, item) in batch.iter().enumerate() {
                if let (Some(statement), Some(text)) = (&item.statement, plan.texts.get(&index)) {
                    bound_texts.entry(Arc::as_ptr(statement)).or_insert(text);
                }
            }
        }
        let mut request = BytesMut::new();
        let mut expects = Vec::with_capacity(batch.len());
        let mut prepared = ServerStatements {
            already,
            here: HashSet::new(),
            closed: HashSet::new(),
            unnamed: None,
        };
        for (index, item) in batch.iter().enumerate() {
            match &item.message {
                FrontendMessage::Parse {
                    name,
                    query,
                    parameter_types,
                } => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    // On a worker, a statement is prepared where it is
                    // bound (rewritten for its shard; pg_query found no
                    // error), but for what pg_query cannot parse: the
                    // worker reports the syntax error.
                    if on_worker && !matches!(*statement.analysis, Analysis::Unparsed) {
                        expects.push(synthetic(b'1'));
                        continue;
                    }
                    let server_name = server_statement_name(name, query, parameter_types);
                    if !name.is_empty() && prepared.has(&server_name) {
                        expects.push(synthetic(b'1'));
                        continue;
                    }
                    protocol::parse(&mut request, &server_name, query, parameter_types);
                    if name.is_empty() {
                        prepared.unnamed = Some(query.clone());
                    } else {
                        prepared.here.insert(server_name.clone());
                    }
                    expects.push(Expect::ParseComplete {
                        visible: true,
                        name: (!name.is_empty()).then_some(server_name),
                    });
                }
                FrontendMessage::Bind(bind) => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let text = plan.texts.get(&index).unwrap_or(&statement.sql);
                    let server_name = prepared.ensure(
                        &bind.statement,
                        statement,
                        text,
                        &mut request,
                        &mut expects,
                    );
                    bind.encode(&server_name, &mut request);
                    expects.push(Expect::BindComplete);
                    if !bind.portal.is_empty() {
                        self.portals.insert(bind.portal.clone(), plan.target);
                    }
                }
                FrontendMessage::Describe { kind: b'S', name } => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let text = bound_texts
                        .get(&Arc::as_ptr(statement))
                        .copied()
                        .unwrap_or(&statement.sql);
                    let server_name =
                        prepared.ensure(name, statement, text, &mut request, &mut expects);
                    protocol::describe(&mut request, b'S', &server_name);
                    expects.push(Expect::DescribeStatement);
                }
                FrontendMessage::Describe { name, .. } => {
                    protocol::describe(&mut request, b'P', name);
                    expects.push(Expect::DescribePortal);
                }
                FrontendMessage::Execute { portal, max_rows } => {
                    protocol::execute(&mut request, portal, *max_rows);
                    expects.push(Expect::Execute);
                }
                FrontendMessage::Close { kind: b'S', name } => {
                    // The client's name went when it came. On the metadata
                    // node the server statement goes too, so that
                    // pg_prepared_statements reads as it would directly
                    // (another client using it there prepares it again);
                    // on workers, statements stay cached by their text.
                    let server_name = item
                        .statement
                        .as_ref()
                        .filter(|_| !on_worker && !name.is_empty())
                        .map(|s| server_statement_name(name, &s.sql, &s.parameter_types))
                        .filter(|server_name| prepared.has(server_name));
                    match server_name {
                        Some(server_name) => {
                            protocol::close(&mut request, b'S', &server_name);
                            prepared.here.remove(&server_name);
                            prepared.closed.insert(server_name.clone());
                            expects.push(Expect::CloseStatement(server_name));
                        }
                        None => expects.push(synthetic(b'3')),
                    }
                }
                FrontendMessage::Close { name, .. } => {
                    if self.portals.remove(name).is_some() || name.is_empty() {
                        protocol::close(&mut request, b'P', name);
                        expects.push(Expect::CloseComplete);
                    } else {
                        expects.push(synthetic(b'3'));
                    }
                }
                FrontendMessage::Sync => {
                    protocol::sync(&mut request);
                    expects.push(Expect::Sync);
                }
                FrontendMessage::Flush => {
                    protocol::flush(&mut request);
                    expects.push(Expect::Synthetic(Bytes::new()));
                }
                _ => {}
            }
        }
        (request, expects, prepared.here.into_iter().collect())
    }

    // ---- multiplexed reads ----------------------------------------------

    /// The pipe to `target` when this client may use one now: outside
    /// transactions, to a worker.
    fn pipe(&mut self, target: Target, map: &ClusterMap) -> Option<Arc<Pipe>> {
        if !self.shared.config.multiplex
            || self.tx.state != TxState::Idle
            || self.tx.pinned.is_some()
            || self.held.is_some()
        {
            return None;
        }
        let Target::Worker(node) = target else {
            return None;
        };
        if self.session_targets.contains(&target) {
            return None;
        }
        let address = &map.nodes.get(&node)?.address;
        // The least busy lane.
        let least = |pipes: &[Arc<Pipe>]| pipes.iter().min_by_key(|p| p.load()).cloned();
        if let Some(pipes) = self.pipes.get(&target) {
            if pipes
                .iter()
                .all(|p| p.key.pool.address == *address && p.is_open())
            {
                return least(pipes);
            }
        }
        self.pipes.remove(&target);
        let lanes = self.shared.config.multiplex_connections;
        let open: Vec<Arc<Pipe>> = (0..lanes)
            .filter_map(|lane| {
                self.shared.pipes.get(&PipeKey {
                    pool: PoolKey {
                        address: address.clone(),
                        database: self.database.clone(),
                        user: self.user.clone(),
                    },
                    settings: self.settings.clone(),
                    lane,
                })
            })
            .collect();
        let pipe = least(&open);
        // Kept once every lane is open (until then, asked for again).
        if open.len() == lanes {
            self.pipes.insert(target, open);
        }
        pipe
    }

    /// Whether an extended-protocol batch may go on a pipe: it binds only
    /// reads that may (see [`multiplexable`]), ends with Sync and has no
    /// Flush (a held connection is one client's).
    fn batch_multiplexable(&self, batch: &[BatchItem], plan: &BatchPlan) -> bool {
        let mut binds = 0;
        for item in batch {
            match &item.message {
                FrontendMessage::Bind(_) => {
                    binds += 1;
                    match &item.statement {
                        Some(statement) if multiplexable(&statement.analysis) => {}
                        _ => return false,
                    }
                }
                FrontendMessage::Flush => return false,
                _ => {}
            }
        }
        binds > 0
            && !plan.side_connection
            && matches!(
                batch.last().map(|item| &item.message),
                Some(FrontendMessage::Sync)
            )
    }

    /// Runs a request made by `build` on `pipe` and relays its answer. None
    /// when it did not run there (the pipe is busy with a slow statement,
    /// closed, or failed before any answer reached the client): the caller
    /// runs it on a pooled connection.
    async fn multiplexed(
        &mut self,
        pipe: Arc<Pipe>,
        map: &ClusterMap,
        shard: Option<i64>,
        retryable: bool,
        build: impl FnOnce(&mut Self, &HashSet<String>) -> Option<(Built, Vec<Expect>)>,
    ) -> Result<Option<Outcome>, SessionError> {
        let started = Instant::now();
        let mut expects = None;
        let ticket = pipe.enqueue(map.version, |prepared| {
            let (built, e) = build(self, prepared)?;
            expects = Some(e);
            Some(built)
        });
        let (Some(ticket), Some(mut expects)) = (ticket, expects) else {
            return Ok(None);
        };
        if ticket.declared_version {
            expects.insert(0, Expect::Hidden);
        }
        let mut turn = match ticket.turn().await {
            Some(turn) => turn,
            None => {
                self.shared
                    .metrics
                    .multiplex_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        };
        self.watch_cancel(turn.connection());
        self.flushed_in_statement = false;
        self.hold_cancels = true;
        let output_start = self.output.len();
        let result = self
            .relay(turn.connection(), &[], expects, retryable, false)
            .await;
        self.hold_cancels = false;
        self.unwatch_cancel();
        turn.finish(result.is_ok());
        let failed = !matches!(result, Ok((Outcome::Done, false)));
        pipe.stats.observe(started.elapsed(), failed);
        self.shared
            .metrics
            .multiplexed_statements
            .fetch_add(1, Ordering::Relaxed);
        if let Some(shard) = shard {
            self.shared.metrics.shard(shard);
        }
        let address = &pipe.key.pool.address;
        match result {
            Ok((Outcome::WrongShard(error), _)) if error.code == QUERY_CANCELED => {
                // Another client's cancel request hit this read: run it again.
                self.output.truncate(output_start.min(self.output.len()));
                Ok(None)
            }
            Ok((outcome @ Outcome::WrongShard(_), _)) => {
                self.output.truncate(output_start.min(self.output.len()));
                Ok(Some(outcome))
            }
            Ok((outcome, saw_error)) => {
                self.last_failed = saw_error;
                self.flush().await?;
                Ok(Some(outcome))
            }
            Err(RelayError::Client(e)) => Err(e),
            Err(RelayError::Fatal(message)) => Err(SessionError::ServerEnded(message)),
            Err(RelayError::Server(_) | RelayError::ServerBeforeAnswer(_))
                if !self.flushed_in_statement =>
            {
                // Nothing reached the client and reads can run again.
                self.output.truncate(output_start.min(self.output.len()));
                Ok(None)
            }
            Err(RelayError::Server(e) | RelayError::ServerBeforeAnswer(e)) => {
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(ServerError::new(
                    "08006",
                    format!("pg_shard coordinator: connection to {address} failed: {e}"),
                ));
                self.finish_reply().await.map(|_| Some(Outcome::Done))
            }
        }
    }

    /// Cancel requests of this client go to `connection` until
    /// [`Self::unwatch_cancel`].
    fn watch_cancel(&self, connection: &ServerConnection) {
        if let Ok(mut slot) = self.cancel_slot.lock() {
            slot.server = Some((
                connection.address.clone(),
                connection.process_id,
                connection.secret_key,
            ));
        }
    }

    /// A new request of the client begins: a cancel request that came
    /// before it does not apply to it (a server drops one that comes while
    /// it is idle too).
    fn forget_cancel(&self) {
        if let Ok(mut slot) = self.cancel_slot.lock() {
            slot.requested = false;
        }
    }

    fn unwatch_cancel(&self) {
        if let Ok(mut slot) = self.cancel_slot.lock() {
            slot.server = None;
        }
    }

    fn cancel_requested(&self) -> bool {
        self.cancel_slot.lock().is_ok_and(|slot| slot.requested)
    }

    // ---- sending and relaying -------------------------------------------

    /// The connection for `target`: the transaction's, the one held since
    /// a Flush, or one from the pool. None when there is none to be had
    /// (the client has been told).
    async fn acquire(
        &mut self,
        target: Target,
        map: &ClusterMap,
        side_connection: bool,
        synced: bool,
    ) -> Result<Option<Lease>, SessionError> {
        if let Some(lease) = self.take_lease(target, side_connection) {
            return Ok(Some(lease));
        }
        if let Some(lease) = self.session_connections.remove(&target) {
            return Ok(Some(lease));
        }
        if self.session_targets.contains(&target) {
            // The connection that held the client's session state (its
            // temporary tables, LISTENs, …) was lost: so is the session.
            let message =
                "pg_shard coordinator: the server connection holding this session's state was lost";
            self.reply_error(ServerError::fatal("08006", message));
            self.flush().await?;
            return Err(SessionError::ServerEnded(message.into()));
        }
        // Pools by node, kept per session: no string hashing or copying per
        // statement (checked against the map's address, which may change).
        let current = match target {
            Target::Metadata => Some(&self.shared.metadata),
            Target::Worker(node) => map.nodes.get(&node).map(|n| &n.address),
        };
        let Some(address) = current else {
            self.reply_error(ServerError::new(
                "08006",
                "pg_shard coordinator: the node is no longer in the shard map",
            ));
            self.finish_batch(synced).await?;
            return Ok(None);
        };
        let pool = match self.pools.get(&target) {
            Some(pool) if pool.key.address == *address => pool.clone(),
            _ => {
                let pool = self.shared.pools.pool(&PoolKey {
                    address: address.clone(),
                    database: self.database.clone(),
                    user: self.user.clone(),
                });
                self.pools.insert(target, pool.clone());
                pool
            }
        };
        let checkout = self.shared.pools.checkout_from(pool.clone(), self.serial);
        let cancelled = async {
            // A client waiting for a free server connection may cancel.
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !self.cancel_requested() {
                tick.tick().await;
            }
        };
        let checked_out = tokio::select! {
            checked_out = checkout => Some(checked_out),
            _ = cancelled => None,
        }
        // (A cancel that came as the connection did counts too.)
        .filter(|_| !self.cancel_requested());
        let Some(checked_out) = checked_out else {
            // As the server cancels a statement: it did not run.
            self.reply_error(ServerError::new(
                QUERY_CANCELED,
                "canceling statement due to user request",
            ));
            if self.tx.state == TxState::Open {
                self.tx.state = TxState::Failed;
            }
            self.finish_batch(synced).await?;
            return Ok(None);
        };
        match checked_out {
            Ok(mut lease) => {
                let connection = lease.connection();
                if target == Target::Metadata
                    && connection.last_session != self.serial
                    && !connection.prepared.is_empty()
                {
                    // Statements cached for other sessions: on the node the
                    // client sees (its pg_prepared_statements), only its own.
                    connection.prepared.clear();
                    connection.deallocate_first = true;
                }
                Ok(Some(lease))
            }
            Err(e) => {
                pool.stats.observe(std::time::Duration::ZERO, true);
                self.reply_error(ServerError::new(
                    "08006",
                    format!("pg_shard coordinator: {e}"),
                ));
                if self.tx.state == TxState::Open && self.tx.pinned.is_some() {
                    self.tx.state = TxState::Failed;
                }
                self.finish_batch(synced).await?;
                Ok(None)
            }
        }
    }

    /// Sends the session prelude and `request` on the lease and relays the
    /// answers until every expectation is met; then keeps, pins or returns
    /// the connection.
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &mut self,
        mut lease: Lease,
        target: Target,
        map: &ClusterMap,
        shard: Option<i64>,
        retryable: bool,
        side_connection: bool,
        synced: bool,
        effect: SessionEffect,
        request: BytesMut,
        mut expects: Vec<Expect>,
    ) -> Result<Outcome, SessionError> {
        let started = Instant::now();
        let address = lease.connection().address.clone();
        if target == Target::Metadata && lease.connection().last_client != self.cancel_key.0 {
            let connection = lease.connection();
            connection.last_client = self.cancel_key.0;
            self.shared
                .notifiers
                .note(connection.process_id, self.cancel_key.0);
        }
        let mut out = BytesMut::with_capacity(request.len() + 64);
        let prelude = self.prelude(lease.connection(), target, map, side_connection);
        lease.connection().last_session = self.serial;
        let begins = prelude.begin.is_some();
        // Settings and BEGIN go as separate queries: settings must outlive
        // the client's transaction (a ROLLBACK must not undo them).
        let mut hidden = 0;
        for statement in [&prelude.settings, &prelude.begin].into_iter().flatten() {
            protocol::query(&mut out, statement);
            hidden += 1;
        }
        expects.splice(0..0, (0..hidden).map(|_| Expect::Hidden));
        out.put_slice(&request);
        self.watch_cancel(lease.connection());
        self.flushed_in_statement = false;
        let output_start = self.output.len();
        let result = self
            .relay(
                lease.connection(),
                &out,
                expects,
                retryable,
                side_connection,
            )
            .await;
        self.unwatch_cancel();
        let synced = synced || std::mem::take(&mut self.synced_by_copy);
        let failed = !matches!(result, Ok((Outcome::Done, false)));
        lease.pool().stats.observe(started.elapsed(), failed);
        if let Some(shard) = shard {
            self.shared.metrics.shard(shard);
        }
        let (outcome, saw_error) = match result {
            Ok(result) => result,
            Err(RelayError::Client(e)) => {
                lease.connection().broken = true;
                return Err(e);
            }
            Err(RelayError::Fatal(message)) => return Err(SessionError::ServerEnded(message)),
            Err(RelayError::ServerBeforeAnswer(_))
                if lease.reused && (self.tx.state == TxState::Idle || begins) =>
            {
                // Nothing ran: try again on a new connection.
                lease.connection().broken = true;
                self.shared.pools.discard_idle(&lease);
                self.output.truncate(output_start.min(self.output.len()));
                return Ok(Outcome::Stale);
            }
            Err(RelayError::ServerBeforeAnswer(crate::backend::BackendError::Refused(error))) => {
                // The server ended the session before answering (terminated,
                // timed out, shut down): its own error, and the end.
                lease.connection().broken = true;
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(error.clone());
                self.flush().await?;
                return Err(SessionError::ServerEnded(error.message));
            }
            Err(RelayError::Server(e)) | Err(RelayError::ServerBeforeAnswer(e)) => {
                lease.connection().broken = true;
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(ServerError::new(
                    "08006",
                    format!("pg_shard coordinator: connection to {address} failed: {e}"),
                ));
                if self.tx.state != TxState::Idle {
                    self.tx.state = TxState::Failed;
                }
                self.tx.pinned = None;
                self.held = None;
                return self.finish_batch(synced).await.map(|_| Outcome::Done);
            }
        };
        self.last_failed = saw_error;
        let connection = lease.connection();
        // A side connection's batch got a Sync of its own (send_batch).
        connection.awaiting_sync = !synced && !side_connection;
        if prelude.settings.is_some() {
            connection.session_settings = Some(self.settings.clone());
        }
        if prelude.declares_version {
            connection.declared_map_version = map.version;
        }
        if saw_error {
            // Whatever failed (possibly part of the prelude), start over
            // next time.
            connection.session_settings = None;
            connection.declared_map_version = 0;
            if prelude.settings.is_some() {
                connection.last_session = UNKNOWN_SESSION;
            }
        }
        match effect {
            SessionEffect::None => {}
            // The client may have changed session state: reset before reuse.
            SessionEffect::Unknown => connection.session_settings = None,
            // State RESET ALL does not undo: the client keeps the
            // connection (session mode for this client, on this node).
            SessionEffect::Keeps => {
                self.session_targets.insert(target);
            }
        }
        if self.session_targets.contains(&target) {
            // The server session is the client's own: never reset.
            lease.connection().session_settings = Some(self.settings.clone());
        }
        if let Outcome::WrongShard(_) = outcome {
            // The statement and its transaction (if it began one) are gone
            // on the server; roll back what the prelude began.
            self.output.truncate(output_start.min(self.output.len()));
            if lease.connection().status != b'I' {
                let mut rollback = BytesMut::new();
                protocol::query(&mut rollback, "ROLLBACK");
                if self
                    .relay(
                        lease.connection(),
                        &rollback,
                        vec![Expect::Hidden],
                        false,
                        true,
                    )
                    .await
                    .is_err()
                {
                    lease.connection().broken = true;
                }
            }
            self.release(target, lease);
            return Ok(outcome);
        }
        if begins {
            // Sent: a batch ended by Flush leaves the transaction open on
            // its connection, and the next one must not begin it again.
            self.tx.begin = None;
        }
        let status = lease.connection().status;
        if side_connection {
            // Not the transaction's connection.
            self.release(target, lease);
        } else if !synced {
            if self.tx.pinned.is_none() && status == b'I' {
                self.held = Some((target, lease));
            } else {
                self.tx.pinned = Some((target, lease));
            }
        } else {
            match status {
                b'I' => {
                    self.end_transaction();
                    self.release(target, lease);
                }
                b'T' => {
                    self.tx.state = TxState::Open;
                    self.tx.begin = None;
                    self.tx.pinned = Some((target, lease));
                }
                _ => {
                    self.tx.state = TxState::Failed;
                    self.tx.begin = None;
                    self.tx.pinned = Some((target, lease));
                }
            }
        }
        self.flush().await?;
        Ok(outcome)
    }

    fn take_lease(&mut self, target: Target, side_connection: bool) -> Option<Lease> {
        if side_connection {
            return None;
        }
        if let Some((t, _)) = &self.held {
            if *t == target {
                return self.held.take().map(|(_, lease)| lease);
            }
        }
        // A held connection for another node: a batch moved elsewhere.
        self.held = None;
        match &self.tx.pinned {
            Some((t, _)) if *t == target => self.tx.pinned.take().map(|(_, lease)| lease),
            _ => None,
        }
    }

    /// Ends a batch the coordinator answered itself.
    async fn end_batch(&mut self, synced: bool) -> Result<(), SessionError> {
        if synced {
            self.finish_reply().await
        } else {
            self.flush().await
        }
    }

    /// Ends a batch after an error: before its Sync, the rest of what the
    /// client sends up to the Sync is skipped, as the server does.
    async fn finish_batch(&mut self, synced: bool) -> Result<(), SessionError> {
        if !synced {
            self.skip_to_sync = true;
        }
        self.end_batch(synced).await
    }

    /// SET statements, the map version and BEGIN the connection needs
    /// before the client's messages; None when it needs nothing.
    fn prelude(
        &self,
        connection: &mut ServerConnection,
        target: Target,
        map: &ClusterMap,
        side_connection: bool,
    ) -> Prelude {
        let mut statements: Vec<String> = Vec::new();
        if std::mem::take(&mut connection.deallocate_first) {
            // First: a failing statement after it must not skip it.
            statements.push("DEALLOCATE ALL".into());
        }
        // Only outside a transaction: inside one the settings were made at
        // its start, and a SET there is the client's own.
        // Not between Flush and Sync either: the server may be skipping to
        // the Sync after an error, and would skip these too.
        let idle = connection.status == b'I' && !connection.awaiting_sync;
        if idle && connection.last_session != 0 && connection.last_session != self.serial {
            // Another client's currval and lastval must not be this one's.
            statements.push("DISCARD SEQUENCES".into());
        }
        if idle && connection.session_settings.as_ref() != Some(&self.settings) {
            // Start from the server's defaults, then the client's settings.
            statements.extend(SERVER_DEFAULTS.map(String::from));
            statements.extend(self.settings.iter().map(|(_, sql)| sql.clone()));
            connection.declared_map_version = 0;
        }
        let mut declares_version = false;
        if let Target::Worker(_) = target {
            if idle && connection.declared_map_version != map.version && map.version > 0 {
                statements.push(format!("SET pg_shard.map_version = {}", map.version));
                declares_version = true;
            }
        }
        let begin = if idle
            && !side_connection
            && self.tx.state == TxState::Open
            && self.tx.pinned.is_none()
        {
            self.tx.begin.clone()
        } else {
            None
        };
        Prelude {
            // One statement per line: each was generated or checked to be a
            // single statement.
            settings: (!statements.is_empty()).then(|| statements.join(";\n")),
            declares_version,
            begin,
        }
    }

    /// Writes `request` and relays the answers for `expects`. Returns the
    /// outcome and whether an error was relayed.
    async fn relay(
        &mut self,
        connection: &mut ServerConnection,
        request: &[u8],
        expects: Vec<Expect>,
        retryable: bool,
        side_connection: bool,
    ) -> Result<(Outcome, bool), RelayError> {
        // Written while answers are read (a long pipeline's answers may
        // fill the socket before the request is all written).
        let mut pending = request;
        self.server_skipping = false;
        let mut queue: VecDeque<Expect> = expects.into();
        let mut held_error: Option<ServerError> = None;
        let mut saw_error = false;
        let mut received_any = false;
        self.emit_synthetic(&mut queue);
        while !queue.is_empty() {
            let (tag, body) = match connection.read_writing(&mut pending).await {
                Ok(message) => message,
                Err(e) if !received_any => return Err(RelayError::ServerBeforeAnswer(e)),
                Err(e) => return Err(RelayError::Server(e)),
            };
            if !received_any && tag == b'E' {
                let error = ServerError::parse(&body);
                if error.severity == "FATAL" {
                    connection.broken = true;
                    return Err(RelayError::ServerBeforeAnswer(
                        crate::backend::BackendError::Refused(error),
                    ));
                }
            }
            received_any = true;
            let hidden = matches!(queue.front(), Some(Expect::Hidden));
            match tag {
                b'N' | b'A' => {
                    if !hidden {
                        self.pass_notice(tag, &body);
                    }
                    continue;
                }
                b'S' => {
                    connection.note_parameter(&body);
                    if !hidden {
                        if let Some(value) = body.strip_prefix(b"client_encoding\0".as_slice()) {
                            self.utf8_client = value == b"UTF8\0";
                        }
                        if let Some(value) = body.strip_prefix(b"is_superuser\0".as_slice()) {
                            self.superuser = value == b"on\0";
                        }
                        self.pass(tag, &body);
                    }
                    continue;
                }
                b'E' => {
                    saw_error = true;
                    let error = ServerError::parse(&body);
                    if matches!(error.severity.as_str(), "FATAL" | "PANIC") && !self.hold_cancels {
                        // The server ends the session: so does the client's
                        // (a shared connection's reads run again instead).
                        connection.broken = true;
                        self.pass(tag, &body);
                        self.flush_relay().await?;
                        return Err(RelayError::Fatal(error.message));
                    }
                    let held = !self.flushed_in_statement
                        && ((retryable
                            && (error.code == WRONG_SHARD || error.code == UNDEFINED_TABLE))
                            || (self.hold_cancels
                                && error.code == QUERY_CANCELED
                                && !self.cancel_requested()));
                    if held {
                        held_error = Some(error);
                    } else {
                        self.pass(tag, &body);
                    }
                    match queue.front() {
                        Some(Expect::Hidden | Expect::Query) => {}
                        _ => {
                            self.server_skipping = true;
                            // The server skips to Sync; so do the expectations.
                            while let Some(front) = queue.front() {
                                if matches!(front, Expect::Sync | Expect::QuietSync) {
                                    break;
                                }
                                queue.pop_front();
                            }
                        }
                    }
                    continue;
                }
                b'Z' => {
                    self.server_skipping = false;
                    connection.status = body.first().copied().unwrap_or(b'E');
                    // Messages the server skipped (after an error, until
                    // Sync) answer nothing: their expectations go too.
                    while queue.front().is_some_and(|e| {
                        !matches!(
                            e,
                            Expect::Hidden | Expect::Query | Expect::Sync | Expect::QuietSync
                        )
                    }) {
                        queue.pop_front();
                    }
                    let front = queue.pop_front();
                    if matches!(
                        front,
                        Some(Expect::Query | Expect::Sync | Expect::QuietSync)
                    ) {
                        connection.awaiting_sync = false;
                    }
                    if matches!(front, Some(Expect::Query | Expect::Sync)) && held_error.is_none() {
                        let status = if side_connection {
                            self.status_byte()
                        } else {
                            connection.status
                        };
                        self.pass(tag, &[status]);
                    }
                    self.emit_synthetic(&mut queue);
                    continue;
                }
                b'G' => {
                    // COPY FROM STDIN: the client's data goes to the server.
                    // In the extended protocol the server ignored the Sync
                    // sent before the data; libpq sends another after it.
                    let extended = matches!(queue.front(), Some(Expect::Execute));
                    connection
                        .write(std::mem::take(&mut pending))
                        .await
                        .map_err(RelayError::Server)?;
                    self.pass(tag, &body);
                    self.flush_relay().await?;
                    self.pump_copy_data(connection, extended).await?;
                    if extended && !queue.iter().any(|e| matches!(e, Expect::Sync)) {
                        // A batch ended by Flush (as pg8000 sends COPY):
                        // the Sync after the data, forwarded with it, ends
                        // the batch; its ReadyForQuery goes to the client.
                        queue.push_back(Expect::Sync);
                        self.synced_by_copy = true;
                    }
                    continue;
                }
                _ => {}
            }
            let Some(front) = queue.front_mut() else {
                break;
            };
            let done = match front {
                Expect::Hidden => false,
                Expect::Query => {
                    self.pass(tag, &body);
                    false
                }
                Expect::ParseComplete { visible, name } => {
                    if let Some(name) = name.take() {
                        connection.prepared.insert(name);
                    }
                    if *visible {
                        self.pass(tag, &body);
                    }
                    true
                }
                Expect::DescribeStatement => {
                    self.pass(tag, &body);
                    tag != b't'
                }
                Expect::Execute => {
                    self.pass(tag, &body);
                    matches!(tag, b'C' | b'I' | b's')
                }
                Expect::CloseStatement(name) => {
                    connection.prepared.remove(name.as_str());
                    self.pass(tag, &body);
                    true
                }
                Expect::BindComplete
                | Expect::CloseComplete
                | Expect::DescribePortal
                | Expect::Sync => {
                    self.pass(tag, &body);
                    true
                }
                Expect::Synthetic(_) | Expect::QuietSync => true,
            };
            if done {
                queue.pop_front();
                self.emit_synthetic(&mut queue);
            }
            if self.output.len() >= OUTPUT_FLUSH_BYTES && held_error.is_none() {
                self.flush_relay().await?;
            }
        }
        // What the server skips (after an error) or answers with nothing
        // (a Flush at the end) may still be unwritten.
        connection
            .write(pending)
            .await
            .map_err(RelayError::Server)?;
        match held_error {
            Some(error) => Ok((Outcome::WrongShard(error), true)),
            None => Ok((Outcome::Done, saw_error)),
        }
    }

    async fn flush_relay(&mut self) -> Result<(), RelayError> {
        self.flush().await.map_err(RelayError::Client)
    }

    fn emit_synthetic(&mut self, queue: &mut VecDeque<Expect>) {
        while let Some(Expect::Synthetic(bytes)) = queue.front() {
            self.output.put_slice(bytes);
            queue.pop_front();
        }
    }

    /// A notice, or a notification (its sender named as the client that
    /// sent it, see notifiers.rs).
    fn pass_notice(&mut self, tag: u8, body: &[u8]) {
        match (tag, self.shared.notifiers.as_client(body)) {
            (b'A', Some(rewritten)) => self.pass(tag, &rewritten),
            _ => self.pass(tag, body),
        }
    }

    fn pass(&mut self, tag: u8, body: &[u8]) {
        let at = protocol::begin_message(&mut self.output, tag);
        self.output.put_slice(body);
        protocol::end_message(&mut self.output, at);
    }

    /// Forwards CopyData/CopyDone/CopyFail from the client until the copy ends.
    async fn pump_copy_data(
        &mut self,
        connection: &mut ServerConnection,
        extended: bool,
    ) -> Result<(), RelayError> {
        loop {
            let (message, _) = self.read_message().await.map_err(RelayError::Client)?;
            let mut out = BytesMut::new();
            let last = match message {
                FrontendMessage::CopyData(data) => {
                    let at = protocol::begin_message(&mut out, b'd');
                    out.put_slice(&data);
                    protocol::end_message(&mut out, at);
                    false
                }
                FrontendMessage::CopyDone => {
                    protocol::empty(&mut out, b'c');
                    true
                }
                FrontendMessage::CopyFail(reason) => {
                    let at = protocol::begin_message(&mut out, b'f');
                    protocol::put_cstr(&mut out, &reason);
                    protocol::end_message(&mut out, at);
                    true
                }
                // Flush and Sync during COPY are ignored, as the server does.
                FrontendMessage::Flush | FrontendMessage::Sync => continue,
                FrontendMessage::Terminate => {
                    return Err(RelayError::Client(SessionError::ClientGone))
                }
                other => {
                    return Err(RelayError::Client(
                        protocol::ProtocolError::UnexpectedType(frontend_tag(&other) as char)
                            .into(),
                    ))
                }
            };
            if last && extended {
                // The Sync the client sends after the copy ends the batch.
                loop {
                    match self.read_message().await.map_err(RelayError::Client)?.0 {
                        FrontendMessage::Sync => break,
                        FrontendMessage::Flush => {}
                        other => {
                            return Err(RelayError::Client(
                                protocol::ProtocolError::UnexpectedType(
                                    frontend_tag(&other) as char
                                )
                                .into(),
                            ))
                        }
                    }
                }
                protocol::sync(&mut out);
            }
            connection.write(&out).await.map_err(RelayError::Server)?;
            if last {
                return Ok(());
            }
        }
    }
}

/// What woke a client session waiting for its next message.
enum Woke {
    Client(std::io::Result<usize>),
    Server(Result<(u8, Bytes), crate::backend::BackendError>),
    IdleTimeout,
}

/// What a connection needs before the client's messages.
struct Prelude {
    /// RESET ALL, the client's settings, the map version.
    settings: Option<String>,
    declares_version: bool,
    /// The transaction's BEGIN, with its first statement.
    begin: Option<String>,
}

/// What running a statement may leave behind on its server connection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionEffect {
    None,
    /// Settings may have changed (SET, functions…): reset before reuse.
    Unknown,
    /// Session state a reset does not undo (temporary tables, LISTEN,
    /// PREPARE, WITH HOLD cursors, set_config, advisory locks): the
    /// connection becomes the client's own until it leaves or DISCARD ALL.
    Keeps,
}

fn session_effect(analysis: &Analysis) -> SessionEffect {
    match analysis {
        Analysis::Routable(shape) if shape.may_change_session() => SessionEffect::Keeps,
        Analysis::Routable(_) | Analysis::Transaction(_) | Analysis::Admin(_) => {
            SessionEffect::None
        }
        Analysis::SearchPath { temporary: true }
        | Analysis::Other {
            keeps_state: true, ..
        } => SessionEffect::Keeps,
        _ => SessionEffect::Unknown,
    }
}

/// `DISCARD ALL`: the session's state is gone.
fn discards_all(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words == ["discard", "all"]
}

/// A statement that may share a pipe with other clients' (multiplex.rs).
fn multiplexable(analysis: &Analysis) -> bool {
    matches!(analysis, Analysis::Routable(shape) if shape.multiplexable())
}

/// Statements whose success changes the client's settings.
fn sets_parameter(analysis: &Analysis) -> bool {
    matches!(
        analysis,
        Analysis::SearchPath { temporary: false }
            | Analysis::Other {
                tableless: true,
                ..
            }
    )
}

/// The first statement parsed, if it is a SET or RESET.
fn first_set_statement(
    parsed: &pg_query::ParseResult,
) -> Option<&pg_query::protobuf::VariableSetStmt> {
    match parsed
        .protobuf
        .stmts
        .first()?
        .stmt
        .as_ref()?
        .node
        .as_ref()?
    {
        pg_query::NodeEnum::VariableSetStmt(set) => Some(set),
        _ => None,
    }
}

/// The idle_session_timeout among the client's settings (0: none).
fn idle_session_timeout(settings: &[(String, String)]) -> Option<Duration> {
    let (_, sql) = settings
        .iter()
        .find(|(name, _)| name == "idle_session_timeout")?;
    let parsed = pg_query::parse(sql).ok()?;
    let set = first_set_statement(&parsed)?;
    let value = match set.args.first()?.node.as_ref()? {
        pg_query::NodeEnum::AConst(constant) => match constant.val.as_ref()? {
            pg_query::protobuf::a_const::Val::Ival(i) => i.ival.to_string(),
            pg_query::protobuf::a_const::Val::Sval(s) => s.sval.clone(),
            pg_query::protobuf::a_const::Val::Fval(f) => f.fval.clone(),
            _ => return None,
        },
        _ => return None,
    };
    milliseconds(&value)
        .filter(|ms| *ms > 0.0)
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
}

/// A time setting's value in milliseconds (PostgreSQL's units; a bare
/// number is milliseconds).
fn milliseconds(value: &str) -> Option<f64> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    Some(number * scale)
}

/// Routing reads literals as PostgreSQL does only with
/// standard_conforming_strings on (the default).
fn routing_possible(settings: &[(String, String)]) -> bool {
    !settings.iter().any(|(name, sql)| {
        name == "standard_conforming_strings" && {
            let lower = sql.to_lowercase();
            ["off", "false", "'0'", " 0", "'no'", " no"]
                .iter()
                .any(|word| lower.contains(word))
        }
    })
}

enum RelayError {
    Client(SessionError),
    Server(crate::backend::BackendError),
    /// The server failed before answering anything (closed, or a FATAL
    /// error such as an administrator shutdown).
    ServerBeforeAnswer(crate::backend::BackendError),
    /// The server ended the session with this error (already passed on).
    Fatal(String),
}

struct BatchPlan {
    target: Target,
    /// Rewritten statement text per Bind (by batch index).
    texts: HashMap<usize, String>,
    shard: Option<i64>,
    /// Parse/Describe only, answered on a connection outside the
    /// transaction.
    side_connection: bool,
}

/// A client message of an extended-protocol batch and the statement its
/// name meant where it came (Parse, Bind, Describe statement).
struct BatchItem {
    message: FrontendMessage,
    statement: Option<Arc<Prepared>>,
}

/// The server-side statements a request can use: those prepared on the
/// connection before it, those it prepares itself, and the text of the
/// unnamed statement it last parsed.
struct ServerStatements<'a> {
    already: &'a HashSet<String>,
    here: HashSet<String>,
    /// Closed by the request.
    closed: HashSet<String>,
    unnamed: Option<String>,
}

impl ServerStatements<'_> {
    fn has(&self, server_name: &str) -> bool {
        (self.already.contains(server_name) && !self.closed.contains(server_name))
            || self.here.contains(server_name)
    }

    /// The server-side name of client statement `name` (defined as
    /// `statement`) in `text`, queueing a hidden Parse when the connection
    /// does not have it.
    fn ensure(
        &mut self,
        name: &str,
        statement: &Prepared,
        text: &str,
        request: &mut BytesMut,
        expects: &mut Vec<Expect>,
    ) -> String {
        let parameter_types = &statement.parameter_types;
        let server_name = server_statement_name(name, text, parameter_types);
        let present = if name.is_empty() {
            self.unnamed.as_deref() == Some(text)
        } else {
            self.has(&server_name)
        };
        if !present {
            protocol::parse(request, &server_name, text, parameter_types);
            expects.push(Expect::ParseComplete {
                visible: false,
                name: (!name.is_empty()).then(|| server_name.clone()),
            });
            if name.is_empty() {
                self.unnamed = Some(text.to_owned());
            } else {
                self.here.insert(server_name.clone());
            }
        }
        server_name
    }
}

fn synthetic(tag: u8) -> Expect {
    let mut out = BytesMut::new();
    protocol::empty(&mut out, tag);
    Expect::Synthetic(out.freeze())
}

/// Server-side statement name: the client's unnamed statement stays
/// unnamed; named ones are named by their text, so every client preparing
/// the same text on a connection shares one server statement.
fn server_statement_name(client_name: &str, text: &str, parameter_types: &[u32]) -> String {
    if client_name.is_empty() {
        return String::new();
    }
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    for oid in parameter_types {
        hasher.update(oid.to_be_bytes());
    }
    let digest = hasher.finalize();
    let mut name = String::from("pgs_");
    for byte in &digest[..16] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

fn frontend_tag(message: &FrontendMessage) -> u8 {
    match message {
        FrontendMessage::Query(_) => b'Q',
        FrontendMessage::Parse { .. } => b'P',
        FrontendMessage::Bind(_) => b'B',
        FrontendMessage::Describe { .. } => b'D',
        FrontendMessage::Execute { .. } => b'E',
        FrontendMessage::Close { .. } => b'C',
        FrontendMessage::Password(_) => b'p',
        FrontendMessage::FunctionCall(_) => b'F',
        _ => b'?',
    }
}

fn aborted_error() -> ServerError {
    ServerError::new(
        "25P02",
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

fn spans_nodes(node: NodeId) -> ServerError {
    ServerError::new(
        "0A000",
        format!("pg_shard coordinator: this transaction runs on worker node {node}, and this statement needs another node"),
    )
    .with_detail("A transaction through the coordinator runs on one node; it has been rolled back.")
    .with_hint("Keep a transaction's statements on the keys of one shard, or start it with a statement on several shards so that it runs on the metadata node.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_options() {
        assert_eq!(
            command_line_settings(
                "-c intervalstyle=postgres_verbose --datestyle=ISO,\\ MDY -cstatement_timeout=5s"
            ),
            Some(vec![
                ("intervalstyle".into(), "postgres_verbose".into()),
                ("datestyle".into(), "ISO, MDY".into()),
                ("statement_timeout".into(), "5s".into()),
            ])
        );
        assert_eq!(command_line_settings(""), Some(vec![]));
        assert_eq!(command_line_settings("-d 5"), None);
        assert_eq!(command_line_settings("-c"), None);
        assert_eq!(command_line_settings("-c =x"), None);
    }

    #[test]
    fn idle_session_timeouts() {
        let setting = |sql: &str| vec![("idle_session_timeout".to_owned(), sql.to_owned())];
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout = '1s'")),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout TO 1500")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET \"idle_session_timeout\" = '2min'")),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout = 0")),
            None
        );
        assert_eq!(idle_session_timeout(&[]), None);
    }

    #[test]
    fn statement_names_depend_on_text_and_types() {
        assert_eq!(server_statement_name("", "SELECT 1", &[]), "");
        let a = server_statement_name("s1", "SELECT $1", &[23]);
        assert_eq!(a, server_statement_name("other", "SELECT $1", &[23]));
        assert_ne!(a, server_statement_name("s1", "SELECT $1", &[20]));
        assert!(a.len() < 64);
    }
}
