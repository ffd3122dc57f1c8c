//! One connection from the coordinator to a PostgreSQL server (the metadata
//! node or a worker), spoken in raw protocol so that client messages can be
//! forwarded without re-encoding.

use crate::config::ServerTlsMode;
use crate::net::protocol::{self, ServerError};
use crate::net::scram::{self, ClientBinding, ClientExchange};
use crate::net::socket::{Inner, Socket};
use crate::net::tags;
use crate::net::tls_client::TlsConnector;
use bytes::{Buf, Bytes, BytesMut};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::net::{TcpStream, UnixStream};

/// Servers may send large rows; the limit only guards against garbage.
const SERVER_MESSAGE_LIMIT: usize = 1 << 30;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("server connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("server connection closed")]
    Closed,
    #[error("server sent a bad message: {0}")]
    Protocol(#[from] protocol::ProtocolError),
    #[error("server refused the connection: {}", .0.message)]
    Refused(ServerError),
    #[error("server {0} asks for a password; set server_password")]
    PasswordNeeded(String),
    #[error("server {0} asks for unsupported authentication (code {1})")]
    UnsupportedAuth(String, i32),
    #[error("SCRAM with server failed: {0}")]
    Scram(#[from] scram::ScramError),
    #[error("server {0} does not accept TLS (server_tls_sslmode = {1})")]
    TlsRefused(String, &'static str),
    #[error("TLS with server {0} failed: {1}")]
    Tls(String, std::io::Error),
    #[error("server {0} sent unencrypted data after its answer to SSLRequest")]
    TlsInjection(String),
    #[error("server {0} answered the request for TLS with an error")]
    TlsError(String),
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerAddress {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Where Unix-domain sockets of local servers are, if configured.
static SOCKET_FOLDER: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Makes connections to servers on 127.0.0.1/localhost use the Unix-domain
/// socket `<folder>/.s.PGSQL.<port>`.
pub fn use_socket_folder(folder: Option<std::path::PathBuf>) {
    let _ = SOCKET_FOLDER.set(folder);
}

/// How connections to servers over TCP speak TLS (None: plain).
static SERVER_TLS: std::sync::OnceLock<Option<TlsConnector>> = std::sync::OnceLock::new();

/// Sets `server_tls_sslmode` for every server connection made after.
pub fn use_server_tls(connector: Option<TlsConnector>) {
    let _ = SERVER_TLS.set(connector);
}

/// The TLS settings of server connections (the catalog's use them too).
pub fn server_tls() -> Option<&'static TlsConnector> {
    SERVER_TLS.get().and_then(Option::as_ref)
}

/// `server_tls_sslmode`.
pub fn server_tls_mode() -> ServerTlsMode {
    server_tls().map_or(ServerTlsMode::Disable, TlsConnector::mode)
}

/// The Unix-domain socket of a server on this machine, when a socket
/// folder is configured.
fn socket_path(address: &ServerAddress) -> Option<std::path::PathBuf> {
    let local = matches!(address.host.as_str(), "127.0.0.1" | "localhost" | "::1");
    SOCKET_FOLDER
        .get()
        .and_then(|folder| folder.as_ref())
        .filter(|_| local)
        .map(|folder| folder.join(format!(".s.PGSQL.{}", address.port)))
}

/// How a connection to a server is made.
#[derive(Clone, Copy)]
enum Route {
    /// Over the server's Unix-domain socket when one is configured, else
    /// TCP (with TLS as `server_tls_sslmode` says).
    Any,
    /// A client's login relayed (passthrough): TCP, TLS without the
    /// coordinator's certificate, or `plain`.
    Relayed { plain: bool },
}

async fn connect_tcp(address: &ServerAddress) -> Result<TcpStream, BackendError> {
    let target = address.to_string();
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((address.host.as_str(), address.port)),
    )
    .await
    .map_err(|_| BackendError::ConnectTimeout(target.clone()))?
    .map_err(|e| BackendError::Connect(target, e))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Asks the server for TLS (SSLRequest) and, when it agrees, shakes hands
/// (`relayed`: showing no certificate of the coordinator's); a server that
/// declines gets a plain connection under `prefer` only.
async fn negotiate_tls(
    mut stream: TcpStream,
    connector: &TlsConnector,
    address: &ServerAddress,
    relayed: bool,
) -> Result<Socket, BackendError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = address.to_string();
    let mut request = BytesMut::new();
    protocol::ssl_request(&mut request);
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, async {
        stream.write_all(&request).await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        Ok::<u8, std::io::Error>(answer[0])
    })
    .await
    .map_err(|_| BackendError::ConnectTimeout(target.clone()))??;
    match answer {
        b'S' => {}
        b'N' if connector.mode() == ServerTlsMode::Prefer => {
            return Ok(Socket::from_tokio_tcp(stream)?)
        }
        b'N' => return Err(BackendError::TlsRefused(target, connector.mode().name())),
        // (an error before the server is authenticated is not shown, as
        // libpq does not show it: CVE-2024-10977)
        b'E' => return Err(BackendError::TlsError(target)),
        other => return Err(protocol::ProtocolError::UnexpectedType(other as char).into()),
    }
    // Nothing may come before the handshake: bytes here were not sent by
    // the server's TLS (CVE-2021-23222).
    let mut extra = [0u8; 1];
    match stream.try_read(&mut extra) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        _ => return Err(BackendError::TlsInjection(target)),
    }
    let mut socket = Socket::from_tokio_tcp(stream)?;
    let handshake = socket.start_tls(|tcp| connector.connect(tcp, &address.host, !relayed));
    tokio::time::timeout(CONNECT_TIMEOUT, handshake)
        .await
        .map_err(|_| BackendError::ConnectTimeout(target.clone()))?
        .map_err(|e| BackendError::Tls(target, e))?;
    Ok(socket)
}

/// [`ServerConnection::last_session`] of a connection whose session state
/// may be anyone's.
pub const UNKNOWN_SESSION: u64 = u64::MAX;

/// What a query of the coordinator's own got back.
#[derive(Debug, Default)]
pub struct Answer {
    /// The first column of each row (None for NULL).
    pub first_values: Vec<Option<String>>,
    /// The first error, and its message as sent (every field, to pass on).
    pub error: Option<ServerError>,
    pub error_body: Option<Bytes>,
    /// NoticeResponse bodies, to pass on to the client.
    pub notices: Vec<Bytes>,
}

pub struct ServerConnection {
    /// Shared, so that keeping it (cancel keys, errors) costs no copy.
    pub address: Arc<ServerAddress>,
    /// TCP, or the server's Unix-domain socket when it is on this machine
    /// and its socket folder is configured (cheaper per message).
    stream: Socket,
    input: BytesMut,
    pub process_id: i32,
    pub secret_key: i32,
    /// ParameterStatus values the server reported.
    pub parameters: HashMap<String, String>,
    /// Names of the statements prepared on this connection.
    pub prepared: HashSet<String>,
    /// The map version declared with `SET pg_shard.map_version` (0: none).
    pub declared_map_version: i64,
    /// The client settings (SET statements) in effect; None when a client
    /// may have changed them (the next prelude resets).
    pub session_settings: Option<Vec<(String, String)>>,
    /// Messages were sent after the last Sync (a Flush-terminated batch):
    /// the server's transaction is open until a Sync.
    pub awaiting_sync: bool,
    /// Transaction status of the last ReadyForQuery.
    pub status: u8,
    /// The process id of the client (its BackendKeyData) that last used
    /// the connection (0: none yet).
    pub last_client: i32,
    /// The coordinator session (its serial number) that last ran
    /// statements here, 0 for none and [`UNKNOWN_SESSION`] when unsure:
    /// another session's sequence state (currval, lastval) is discarded
    /// before a session runs anything.
    pub last_session: u64,
    /// The server-side statements other sessions left here must go
    /// (`DEALLOCATE ALL`) before this session's messages: they would show
    /// in its `pg_prepared_statements`.
    pub deallocate_first: bool,
    /// [`ROLE_SETTINGS_QUERY`] when the connection was made: the role's
    /// and database's defaults it started with (RESET ALL goes back to
    /// them). None when not read.
    pub role_settings: Option<String>,
    /// The pool's settings generation at which `role_settings` was last
    /// found current (0: never).
    pub settings_generation: u64,
    /// When the connection last went back to its pool.
    pub idle_since: std::time::Instant,
    /// Set when the connection cannot be reused (I/O error, protocol
    /// confusion, client vanished mid-statement).
    pub broken: bool,
    /// Cancel requests for this connection's statements that are on their
    /// way to its server: one that arrives late (the statement ended
    /// meanwhile) would cancel whatever the connection runs next, for
    /// another client, so the connection is not pooled while any is.
    pub cancels_in_flight: Arc<AtomicUsize>,
}

/// A fingerprint of the role's and the database's settings that apply to
/// the session (`ALTER ROLE … SET`, `ALTER DATABASE … SET`), as they are
/// now: a connection made before they changed has other defaults than a
/// new session would. Every name qualified: it runs under the session's
/// own search_path.
pub const ROLE_SETTINGS_QUERY: &str = "SELECT coalesce(pg_catalog.md5(\
     pg_catalog.array_to_string(pg_catalog.array_agg(\
       pg_catalog.concat_ws(':', s.setdatabase, s.setrole, s.setconfig) \
       ORDER BY s.setdatabase, s.setrole), ';')), '') \
     FROM pg_catalog.pg_db_role_setting s \
     WHERE s.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0::pg_catalog.oid, \
             (SELECT d.oid FROM pg_catalog.pg_database d \
              WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())]) \
       AND s.setrole OPERATOR(pg_catalog.=) ANY (ARRAY[0::pg_catalog.oid, \
             (SELECT r.oid FROM pg_catalog.pg_roles r \
              WHERE r.rolname OPERATOR(pg_catalog.=) session_user)])";

/// How the coordinator proves itself to a server.
pub struct Credentials<'a> {
    pub user: &'a str,
    pub password: Option<&'a str>,
}

impl ServerConnection {
    /// Opens a connection and runs startup up to the first ReadyForQuery.
    pub async fn connect(
        address: &ServerAddress,
        database: &str,
        credentials: &Credentials<'_>,
        extra: &[(&str, &str)],
    ) -> Result<ServerConnection, BackendError> {
        let mut connection = ServerConnection::open(address).await?;
        let mut parameters = vec![("user", credentials.user), ("database", database)];
        parameters.extend_from_slice(extra);
        let mut out = BytesMut::new();
        protocol::startup(&mut out, &parameters);
        connection.write(&out).await?;
        loop {
            let (tag, body) = connection.read().await?;
            match tag {
                tags::backend::AUTHENTICATION => connection.authenticate(body, credentials).await?,
                tags::backend::ERROR_RESPONSE => {
                    return Err(BackendError::Refused(ServerError::parse(&body)))
                }
                _ => {
                    if connection.finish_startup(tag, &body)? {
                        return Ok(connection);
                    }
                }
            }
        }
    }

    /// Opens the connection only (startup is up to the caller), over the
    /// server's Unix-domain socket when one is configured for it.
    pub async fn open(address: &ServerAddress) -> Result<ServerConnection, BackendError> {
        Self::open_by(address, Route::Any).await
    }

    /// [`Self::open`] over TCP always, for a login relayed for a client
    /// (passthrough): it must meet the server's rules for TCP clients,
    /// which is what the client is (its `local` rules, peer and trust, are
    /// for processes of the server's machine), and over TLS it shows no
    /// certificate of the coordinator's (the server must authenticate the
    /// client, not the coordinator). `tls` false: plain, where
    /// `server_tls_sslmode` is `prefer` only.
    pub async fn open_relayed(
        address: &ServerAddress,
        tls: bool,
    ) -> Result<ServerConnection, BackendError> {
        let plain = !tls && server_tls_mode() == ServerTlsMode::Prefer;
        Self::open_by(address, Route::Relayed { plain }).await
    }

    /// Whether the connection is a TLS session.
    pub fn on_tls(&self) -> bool {
        self.stream.is_tls()
    }

    /// Over TCP to a server that [`Self::open`] reaches through its
    /// Unix-domain socket (a passthrough login's connection): every
    /// message costs more here than it would there.
    pub fn tcp_where_socket_serves(&self) -> bool {
        !self.stream.is_unix() && socket_path(&self.address).is_some()
    }

    async fn open_by(
        address: &ServerAddress,
        route: Route,
    ) -> Result<ServerConnection, BackendError> {
        let target = address.to_string();
        let socket = socket_path(address).filter(|_| matches!(route, Route::Any));
        let stream = match socket {
            Some(path) => Socket::new(Inner::Unix(
                tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path))
                    .await
                    .map_err(|_| BackendError::ConnectTimeout(target.clone()))?
                    .map_err(|e| {
                        BackendError::Connect(format!("{target} ({})", path.display()), e)
                    })?
                    .into_std()?,
            ))?,
            None => {
                let connector =
                    server_tls().filter(|_| !matches!(route, Route::Relayed { plain: true }));
                let relayed = matches!(route, Route::Relayed { .. });
                match connector {
                    Some(connector) => {
                        let stream = connect_tcp(address).await?;
                        match negotiate_tls(stream, connector, address, relayed).await {
                            // libpq's prefer: a handshake that fails (a
                            // certificate or cipher rustls cannot use) is
                            // tried again without TLS
                            Err(BackendError::Tls(_, e))
                                if connector.mode() == ServerTlsMode::Prefer =>
                            {
                                tracing::debug!(server = %target, error = %e,
                                    "TLS handshake failed; plain connection (server_tls_sslmode = prefer)");
                                Socket::from_tokio_tcp(connect_tcp(address).await?)?
                            }
                            negotiated => negotiated?,
                        }
                    }
                    None => Socket::from_tokio_tcp(connect_tcp(address).await?)?,
                }
            }
        };
        Ok(ServerConnection {
            address: Arc::new(address.clone()),
            stream,
            input: BytesMut::with_capacity(16 * 1024),
            process_id: 0,
            secret_key: 0,
            parameters: HashMap::new(),
            prepared: HashSet::new(),
            declared_map_version: 0,
            session_settings: Some(Vec::new()),
            awaiting_sync: false,
            status: tags::status::IDLE,
            last_client: 0,
            last_session: 0,
            deallocate_first: false,
            role_settings: None,
            settings_generation: 0,
            idle_since: std::time::Instant::now(),
            broken: false,
            cancels_in_flight: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Handles a message that follows authentication; true at ReadyForQuery.
    pub fn finish_startup(&mut self, tag: u8, body: &[u8]) -> Result<bool, BackendError> {
        match tag {
            tags::backend::PARAMETER_STATUS => self.note_parameter(body),
            tags::backend::BACKEND_KEY_DATA if body.len() == 8 => {
                self.process_id = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                self.secret_key = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
            }
            tags::backend::READY_FOR_QUERY => return Ok(true),
            tags::backend::NOTICE_RESPONSE => {}
            other => return Err(protocol::ProtocolError::UnexpectedType(other as char).into()),
        }
        Ok(false)
    }

    async fn authenticate(
        &mut self,
        mut body: Bytes,
        credentials: &Credentials<'_>,
    ) -> Result<(), BackendError> {
        if body.len() < 4 {
            return Err(protocol::ProtocolError::Malformed("Authentication").into());
        }
        let code = body.get_i32();
        let password = || {
            credentials
                .password
                .ok_or_else(|| BackendError::PasswordNeeded(self.address.to_string()))
        };
        let mut out = BytesMut::new();
        match code {
            0 => return Ok(()),
            3 => {
                let mut data = password()?.as_bytes().to_vec();
                data.push(0);
                protocol::password(&mut out, &data);
            }
            5 if body.len() == 4 => {
                let mut data =
                    scram::md5_response(credentials.user, password()?, &body[..4]).into_bytes();
                data.push(0);
                protocol::password(&mut out, &data);
            }
            10 => {
                let offered_plus = scram::offers(&body, scram::MECHANISM_PLUS);
                let binding = match self.stream.tls_binding() {
                    None => ClientBinding::None,
                    Some(Some(end_point)) if offered_plus => ClientBinding::Bound(end_point),
                    // (a certificate whose hash cannot bind: as libpq's
                    // channel_binding = prefer, without)
                    Some(_) if offered_plus => ClientBinding::None,
                    Some(_) => ClientBinding::Possible,
                };
                let (mut exchange, mechanism, first) = ClientExchange::start(password()?, binding);
                let mut data = BytesMut::new();
                protocol::put_cstr(&mut data, mechanism);
                data.extend_from_slice(&(first.len() as i32).to_be_bytes());
                data.extend_from_slice(first.as_bytes());
                protocol::password(&mut out, &data);
                self.write(&out).await?;
                out.clear();
                let server_first = self.expect_auth(11).await?;
                let client_final = exchange.respond(&server_first)?;
                protocol::password(&mut out, client_final.as_bytes());
                self.write(&out).await?;
                let server_final = self.expect_auth(12).await?;
                exchange.verify(&server_final)?;
                return Ok(());
            }
            other => {
                return Err(BackendError::UnsupportedAuth(
                    self.address.to_string(),
                    other,
                ))
            }
        }
        self.write(&out).await?;
        Ok(())
    }

    async fn expect_auth(&mut self, code: i32) -> Result<Bytes, BackendError> {
        let (tag, mut body) = self.read().await?;
        match tag {
            tags::backend::AUTHENTICATION if body.len() >= 4 && body.get_i32() == code => Ok(body),
            tags::backend::ERROR_RESPONSE => Err(BackendError::Refused(ServerError::parse(&body))),
            _ => Err(protocol::ProtocolError::Malformed("SASL").into()),
        }
    }

    /// Reads [`ROLE_SETTINGS_QUERY`] into `role_settings` (on a connection
    /// just made).
    pub async fn note_role_settings(&mut self) -> Result<(), BackendError> {
        self.send_query(ROLE_SETTINGS_QUERY).await?;
        let answer = self.read_answer().await?;
        if let Some(error) = answer.error {
            return Err(BackendError::Refused(error));
        }
        self.role_settings = answer.first_values.into_iter().next().flatten();
        self.settings_generation = 0;
        Ok(())
    }

    /// Sends a simple query of the coordinator's own; [`Self::read_answer`]
    /// reads what comes back (several connections may be sent to first and
    /// read after, so that their round trips overlap).
    pub async fn send_query(&mut self, sql: &str) -> Result<(), BackendError> {
        let mut out = BytesMut::new();
        protocol::query(&mut out, sql);
        self.write(&out).await
    }

    /// The answer to a query sent with [`Self::send_query`], up to its
    /// ReadyForQuery (whose status is noted).
    pub async fn read_answer(&mut self) -> Result<Answer, BackendError> {
        let mut answer = Answer::default();
        loop {
            let (tag, body) = self.read().await?;
            match tag {
                tags::backend::DATA_ROW => answer.first_values.push(
                    protocol::data_row_values(&body)
                        .first()
                        .copied()
                        .flatten()
                        .map(|v| String::from_utf8_lossy(v).into_owned()),
                ),
                tags::backend::ERROR_RESPONSE => {
                    let error = ServerError::parse(&body);
                    if matches!(error.severity.as_str(), "FATAL" | "PANIC") {
                        self.broken = true;
                    }
                    if answer.error.is_none() {
                        answer.error = Some(error);
                        answer.error_body = Some(body);
                    }
                }
                tags::backend::NOTICE_RESPONSE => answer.notices.push(body),
                tags::backend::PARAMETER_STATUS => self.note_parameter(&body),
                tags::backend::READY_FOR_QUERY => {
                    self.status = body.first().copied().unwrap_or(tags::status::FAILED);
                    self.awaiting_sync = false;
                    return Ok(answer);
                }
                _ => {}
            }
        }
    }

    /// Records a ParameterStatus message.
    pub fn note_parameter(&mut self, body: &[u8]) {
        let mut parts = body.split(|b| *b == 0);
        if let (Some(name), Some(value)) = (parts.next(), parts.next()) {
            self.parameters.insert(
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            );
        }
    }

    /// Ends the session and waits (up to `within`) for its server to close
    /// the connection: by then the backend has left the server's process
    /// table, so it no longer counts against max_connections or a
    /// CONNECTION LIMIT.
    pub async fn terminate(mut self, within: Duration) {
        let mut out = BytesMut::new();
        protocol::empty(&mut out, tags::frontend::TERMINATE);
        if self.write(&out).await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(within, async { while self.read().await.is_ok() {} }).await;
    }

    /// Reads one message: its tag and body.
    pub async fn read(&mut self) -> Result<(u8, Bytes), BackendError> {
        loop {
            if let Some(message) = protocol::split_message(&mut self.input, SERVER_MESSAGE_LIMIT)? {
                return Ok(message);
            }
            let read = match self.stream.read_buf(&mut self.input).await {
                Ok(read) => read,
                Err(e) => {
                    self.broken = true;
                    return Err(e.into());
                }
            };
            if read == 0 {
                self.broken = true;
                return Err(BackendError::Closed);
            }
        }
    }

    /// Reads one message while writing what is left of `pending`.
    pub async fn read_writing(&mut self, pending: &mut &[u8]) -> Result<(u8, Bytes), BackendError> {
        loop {
            if let Some(message) = protocol::split_message(&mut self.input, SERVER_MESSAGE_LIMIT)? {
                return Ok(message);
            }
            let read = match self.stream.read_writing(&mut self.input, pending).await {
                Ok(read) => read,
                Err(e) => {
                    self.broken = true;
                    // A server that ended the session (terminated, timed
                    // out) said why before it closed: that error, rather
                    // than the broken pipe of writing to it.
                    return match self.parting_error().await {
                        Some(message) => Ok(message),
                        None => Err(e.into()),
                    };
                }
            };
            if read == 0 {
                self.broken = true;
                return Err(BackendError::Closed);
            }
        }
    }

    /// An ErrorResponse the server sent before it closed, if it can still
    /// be read.
    async fn parting_error(&mut self) -> Option<(u8, Bytes)> {
        loop {
            if let Ok(Some((tag, body))) =
                protocol::split_message(&mut self.input, SERVER_MESSAGE_LIMIT)
            {
                if tag == tags::backend::ERROR_RESPONSE {
                    return Some((tag, body));
                }
                continue;
            }
            let read = tokio::time::timeout(
                Duration::from_millis(50),
                self.stream.read_buf(&mut self.input),
            )
            .await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                return None;
            }
        }
    }

    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        if let Err(e) = self.stream.write_all(bytes).await {
            self.broken = true;
            return Err(e.into());
        }
        Ok(())
    }

    /// Copies bytes between `client` and the server both ways, unchanged,
    /// until either ends (a replication connection after its login).
    /// `client_input` holds what the client sent already.
    pub async fn relay_raw(
        &mut self,
        client: &mut Socket,
        client_input: &mut BytesMut,
    ) -> std::io::Result<()> {
        let mut from_server = std::mem::take(&mut self.input);
        loop {
            if !from_server.is_empty() {
                client.write_all(&from_server).await?;
                from_server.clear();
            }
            if !client_input.is_empty() {
                self.stream.write_all(client_input).await?;
                client_input.clear();
            }
            tokio::select! {
                read = client.read_buf(client_input) => if read? == 0 { return Ok(()) },
                read = self.stream.read_buf(&mut from_server) => if read? == 0 { return Ok(()) },
            }
        }
    }

    /// Whether the connection can go back to its pool.
    pub fn reusable(&self) -> bool {
        !self.broken
            && !self.awaiting_sync
            && self.status == tags::status::IDLE
            && self.input.is_empty()
    }

    /// Whether the connection is between requests (answers to later
    /// pipelined requests may already be buffered).
    pub fn reusable_between_requests(&self) -> bool {
        !self.broken && !self.awaiting_sync && self.status == tags::status::IDLE
    }

    /// A second descriptor of the connection's socket, for writing while
    /// another task reads.
    pub fn clone_stream(&self) -> std::io::Result<Inner> {
        self.stream.try_clone_inner()
    }

    /// Sends a cancel request for whatever this connection is running.
    pub async fn cancel(address: Arc<ServerAddress>, process_id: i32, secret_key: i32) {
        let Ok(mut connection) = ServerConnection::open(&address).await else {
            return;
        };
        let mut out = BytesMut::new();
        protocol::cancel_request(&mut out, process_id, secret_key);
        let _ = connection.stream.write_all(&out).await;
        // The server closes the connection when done; wait briefly for it.
        let mut sink = BytesMut::new();
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            connection.stream.read_buf(&mut sink),
        )
        .await;
    }
}
