//! One client connection: startup and authentication, then statements —
//! simple and extended protocol — each routed to one worker or to the
//! metadata node over pooled server connections.
//!
//! Transactions: BEGIN is answered by the coordinator and sent on with the
//! transaction's first statement, which picks the node; the transaction
//! then stays on that node (one server connection) until it ends. A later
//! statement that would need another node fails before anything commits
//! and the transaction is rolled back.

pub mod admin;

pub mod auth;

pub mod client_limits;

pub mod cancel;
pub mod client_list;
mod commit;
mod connections;
mod copy;
mod copy_out;
mod copy_rows;
mod copy_split;
pub mod database_commands;
mod deadlock;
mod extended;
mod login;
mod lookup_hop;
mod multiplexed;
mod participants;
mod relay;
mod server_statements;
mod settings;
mod simple;
mod startup;
mod transaction;

use crate::backend::connection::{ServerAddress, ServerConnection, UNKNOWN_SESSION};
use crate::net::sqlstate;
use crate::net::tags;
use cancel::CancelSlot;
use connections::Exchange;
use extended::{BatchItem, BatchPlan};
use login::{
    apply_settings, passthrough_login, refuse, relay_replication, scram_login, Login,
    SERVER_DEFAULTS,
};
use multiplexed::multiplexable;
use relay::{synthetic, Expect, RelayError};
use settings::{
    command_line_settings, discards_all, idle_session_timeout, routing_possible, session_effect,
    set_statement, sets_parameter, SessionEffect,
};
pub use startup::serve;
use transaction::{Transaction, TxState};

use crate::backend::cluster::{ClusterMap, DatabaseMap, ListenerHold, NodeId};

use crate::config::AuthMode;

use database_commands::DatabaseCommand;

use crate::router::lexer::Normalized;

use crate::backend::multiplex::{Built, Pipe, PipeKey};

use crate::backend::pool::{Lease, PoolKey};

use crate::net::protocol::{self, FrontendMessage, ServerError, StartupRequest};

use crate::router::{self, Analysis, Route, TransactionCommand};

use crate::net::scram::{self, ServerExchange};

use crate::net::socket::Socket;

use crate::shared::Shared;

use bytes::{BufMut, Bytes, BytesMut};

use sha2::{Digest, Sha256};

use std::collections::{HashMap, HashSet, VecDeque};

use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use thiserror::Error;

use tokio::net::TcpStream;

/// How long a statement refused with WrongShard waits for a newer shard
/// map before it is tried again anyway.
const WRONG_SHARD_WAIT: Duration = Duration::from_secs(2);

/// How long such a statement waits for the announcement of a new map
/// before it asks the metadata node for the version itself (asked at once,
/// the question would take the map's lock just when the announcement
/// comes, and a full read would replace the patch).
const ANNOUNCED_MAP_WAIT: Duration = Duration::from_millis(20);

/// How long a batch that has no side effects (a prepare) waits for the
/// metadata node to accept connections again after a crash or restart
/// before the client gets the connection error.
const METADATA_RESTART_WAIT: Duration = Duration::from_secs(10);

/// Between attempts to reach a metadata node that is restarting.
const METADATA_RESTART_POLL: Duration = Duration::from_millis(100);

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
    _admitted: crate::frontend::client_limits::Admitted,
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
    cancel_slot: Arc<CancelSlot>,
    /// Output bytes were sent to the client since the current statement began.
    flushed_in_statement: bool,
    /// The pools this client used, by node.
    pools: HashMap<Target, Arc<crate::backend::pool::Pool>>,
    /// The pipes (shared, pipelined connections) this client uses, by node
    /// (one per lane, all open when cached).
    pipes: HashMap<Target, Vec<Arc<Pipe>>>,
    /// Hold back a "canceling statement" error the client did not ask for:
    /// on a pipe it can come from another client's late cancel request.
    hold_cancels: bool,
    /// The last exchange passed an error to the client.
    last_failed: bool,
    /// Until when a batch without side effects waits for the metadata node
    /// to accept connections again (see METADATA_RESTART_WAIT).
    metadata_restart_deadline: Option<Instant>,
    /// Statements may go to workers (not with standard_conforming_strings
    /// off: literals would be read differently).
    routing: bool,
    /// Nodes where the client has session state (see SessionEffect::Keeps)
    /// and, between its statements, the connections that hold it.
    session_targets: HashSet<Target>,
    session_connections: HashMap<Target, Lease>,
    /// A transaction command the coordinator answered the Bind of, whose
    /// Execute is still to come: its kind, text and portal.
    pending_transaction: Option<(transaction::LoneCommand, String, String)>,
    /// Session-level SETs of the open transaction: kept if it commits.
    pending_settings: Vec<String>,
    /// The statement running now was canceled as a deadlock across nodes
    /// (see deadlock.rs): its "canceled" error reaches the client as 40P01.
    deadlock_fired: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The client's idle_session_timeout: the coordinator ends the session
    /// as the server would (its pooled connections are not the session).
    idle_timeout: Option<Duration>,
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
                    let (analysis, normalized) = self.analysis(&sql);
                    let command = database_commands::of_statement(&sql, &analysis);
                    let holds = self.let_go_of_databases(command.as_ref());
                    self.simple_query(sql, analysis, normalized).await?;
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
            FrontendMessage::Describe {
                kind: tags::STATEMENT,
                name,
            } => self.statements.get(name).cloned(),
            // The definition closed (its server statement may go too).
            FrontendMessage::Close {
                kind: tags::STATEMENT,
                name,
            } => self.statements.remove(name),
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
                    self.reply_error(ServerError::fatal(
                        sqlstate::CONNECTION_FAILURE,
                        message.clone(),
                    ));
                    self.flush().await?;
                    return Err(SessionError::ServerEnded(message));
                }
                Woke::IdleTimeout => {
                    let message = "terminating connection due to idle-session timeout";
                    self.reply_error(ServerError::fatal(sqlstate::IDLE_SESSION_TIMEOUT, message));
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
            tags::backend::NOTIFICATION_RESPONSE | tags::backend::NOTICE_RESPONSE => {
                self.pass_notice(tag, body)
            }
            tags::backend::PARAMETER_STATUS => {
                if let Some(lease) = self.session_connections.get_mut(&Target::Metadata) {
                    lease.connection().note_parameter(body);
                }
                self.pass(tag, body);
            }
            tags::backend::ERROR_RESPONSE => {
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
            TxState::Idle => tags::status::IDLE,
            TxState::Open => tags::status::IN_TRANSACTION,
            TxState::Failed => tags::status::FAILED,
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

    fn reply_error(&mut self, error: ServerError) {
        protocol::error_response(&mut self.output, &error);
    }

    /// Ends a reply the coordinator made itself.
    async fn finish_reply(&mut self) -> Result<(), SessionError> {
        let status = self.status_byte();
        protocol::ready_for_query(&mut self.output, status);
        self.flush().await
    }
}

/// What woke a client session waiting for its next message.
enum Woke {
    Client(std::io::Result<usize>),
    Server(Result<(u8, Bytes), crate::backend::connection::BackendError>),
    IdleTimeout,
}

fn frontend_tag(message: &FrontendMessage) -> u8 {
    match message {
        FrontendMessage::Query(_) => tags::frontend::QUERY,
        FrontendMessage::Parse { .. } => tags::frontend::PARSE,
        FrontendMessage::Bind(_) => tags::frontend::BIND,
        FrontendMessage::Describe { .. } => tags::frontend::DESCRIBE,
        FrontendMessage::Execute { .. } => tags::frontend::EXECUTE,
        FrontendMessage::Close { .. } => tags::frontend::CLOSE,
        FrontendMessage::Password(_) => tags::frontend::PASSWORD,
        FrontendMessage::FunctionCall(_) => tags::frontend::FUNCTION_CALL,
        _ => b'?',
    }
}

fn aborted_error() -> ServerError {
    ServerError::new(
        sqlstate::IN_FAILED_SQL_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

/// Names the workers of `members`, for an error message.
fn worker_list(members: &[Target]) -> String {
    let nodes: Vec<String> = members
        .iter()
        .filter_map(|t| match t {
            Target::Worker(node) => Some(node.to_string()),
            Target::Metadata => None,
        })
        .collect();
    nodes.join(", ")
}

/// A statement only the metadata node can run, in a transaction that
/// already ran on workers: the metadata node would not see what it did there.
fn needs_metadata_after_workers(members: &[Target]) -> ServerError {
    ServerError::new(
        sqlstate::FEATURE_NOT_SUPPORTED,
        format!(
            "pg_shard coordinator: this statement needs the metadata node, which cannot see what this transaction did on worker node {}",
            worker_list(members)
        ),
    )
    .with_detail("Statements on several shards, DDL, pg_shard functions and tables or views the coordinator does not know run on the metadata node, through connections of its own. Nothing of the statement ran; the transaction has been rolled back.")
    .with_hint("Run such a statement first in its transaction (the whole transaction then runs on the metadata node), or in a transaction of its own.")
}

/// A statement routed to a worker that reads a reference table, in a
/// transaction in which the metadata node may have written that table.
fn reference_after_metadata(node: NodeId) -> ServerError {
    ServerError::new(
        sqlstate::FEATURE_NOT_SUPPORTED,
        format!("pg_shard coordinator: this statement reads a reference table on worker node {node}, which cannot see what this transaction wrote through the metadata node"),
    )
    .with_detail("Nothing of the statement ran; the transaction has been rolled back.")
    .with_hint("Write reference tables after the statements that read them on workers, or in a transaction of their own.")
}

/// An extended-protocol batch (up to its Sync) whose statements route to
/// different nodes inside a transaction that runs on workers.
fn batch_spans_nodes() -> ServerError {
    ServerError::new(
        sqlstate::FEATURE_NOT_SUPPORTED,
        "pg_shard coordinator: the statements of this batch (up to its Sync) need different nodes inside a transaction",
    )
    .with_detail("Nothing of the batch ran; the transaction has been rolled back.")
    .with_hint("Send a Sync between statements for different shards (leave pipeline mode), or run the batch in a transaction of its own.")
}
