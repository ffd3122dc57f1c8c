//! Authentication and the first server connection of a session: SCRAM
//! against the users file, or passthrough to the metadata node over TCP;
//! the server defaults and client settings applied to it.

use super::*;
use crate::backend::connection::server_tls_mode;
use crate::config::ServerTlsMode;
use crate::net::sqlstate;
use crate::net::tags;

/// Brings a server session back to its defaults (RESET ALL leaves the
/// role and the session authorization).
pub(super) const SERVER_DEFAULTS: [&str; 3] =
    ["RESET SESSION AUTHORIZATION", "RESET ROLE", "RESET ALL"];

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
pub(super) struct Login {
    /// `SHOW search_path` after the client's settings.
    pub(super) search_path: Option<String>,
    /// [`crate::backend::connection::ROLE_SETTINGS_QUERY`] now.
    pub(super) role_settings: String,
    /// The role's and the database's CONNECTION LIMIT (-1: none).
    pub(super) role_limit: i64,
    pub(super) database_limit: i64,
}

pub(super) async fn apply_settings(
    connection: &mut ServerConnection,
    settings: &[(String, String)],
) -> Result<Login, ServerError> {
    // The role's settings now (a connection made before they changed has
    // other defaults), and last the search_path the session starts with
    // (the role's and the database's defaults apply on the server).
    let statements: Vec<&str> = SERVER_DEFAULTS
        .into_iter()
        .chain([
            crate::backend::connection::ROLE_SETTINGS_QUERY,
            CONNECTION_LIMITS_QUERY,
        ])
        .chain(settings.iter().map(|(_, sql)| sql.as_str()))
        .chain(["SHOW search_path"])
        .collect();
    let mut out = BytesMut::new();
    protocol::query(&mut out, &statements.join(";\n"));
    let lost = |e: crate::backend::connection::BackendError| {
        ServerError::fatal(sqlstate::CONNECTION_FAILURE, e.to_string())
    };
    connection.write(&out).await.map_err(lost)?;
    let mut refused = None;
    let mut rows = Vec::new();
    loop {
        let (tag, body) = connection.read().await.map_err(lost)?;
        match tag {
            tags::backend::PARAMETER_STATUS => connection.note_parameter(&body),
            tags::backend::DATA_ROW => {
                if let Some(value) = protocol::data_row_values(&body).first() {
                    rows.push(String::from_utf8_lossy(value.unwrap_or_default()).into_owned());
                }
            }
            tags::backend::ERROR_RESPONSE => {
                let mut error = ServerError::parse(&body);
                error.severity = "FATAL".into();
                refused.get_or_insert(error);
            }
            tags::backend::READY_FOR_QUERY => break,
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

pub(super) async fn refuse(stream: &mut Socket, error: ServerError) {
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
            if tag != tags::frontend::PASSWORD {
                return Err(protocol::ProtocolError::UnexpectedType(tag as char).into());
            }
            return Ok(body);
        }
        if stream.read_buf(input).await? == 0 {
            return Err(SessionError::ClientGone);
        }
    }
}

pub(super) async fn scram_login(
    stream: &mut Socket,
    input: &mut BytesMut,
    shared: &Shared,
    user: &str,
) -> Result<bool, SessionError> {
    let failed = || {
        ServerError::fatal(
            sqlstate::INVALID_PASSWORD,
            format!("password authentication failed for user \"{user}\""),
        )
    };
    let mut out = BytesMut::new();
    let mut mechanisms = BytesMut::new();
    // Over TLS, -PLUS first, as PostgreSQL offers them: the client binds
    // the exchange to its session with this certificate.
    let binding = shared
        .tls
        .as_ref()
        .and_then(|tls| tls.end_point())
        .filter(|_| stream.is_tls());
    if binding.is_some() {
        protocol::put_cstr(&mut mechanisms, scram::MECHANISM_PLUS);
    }
    protocol::put_cstr(&mut mechanisms, scram::MECHANISM);
    mechanisms.put_u8(0);
    protocol::authentication(&mut out, 10, &mechanisms);
    stream.write_all(&out).await?;
    let mut first = read_auth_message(stream, input, 8192).await?;
    let mechanism = protocol::get_cstr(&mut first, "SASLInitialResponse")?;
    let offered =
        mechanism == scram::MECHANISM || (mechanism == scram::MECHANISM_PLUS && binding.is_some());
    if !offered || first.len() < 4 {
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
    let started = ServerExchange::start(verifier, &mechanism, &client_first, binding);
    let (exchange, server_first) = match started {
        Ok(started) => started,
        Err(e) => {
            refuse(
                stream,
                ServerError::fatal(sqlstate::INVALID_AUTHORIZATION_SPECIFICATION, e.to_string()),
            )
            .await;
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
        Err(e @ scram::ScramError::BindingMismatch) => {
            // (as PostgreSQL says it: the client's session is not the one
            // the coordinator's certificate is in)
            refuse(
                stream,
                ServerError::fatal(sqlstate::PROTOCOL_VIOLATION, e.to_string()),
            )
            .await;
            Ok(false)
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
pub(super) async fn passthrough_login(
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
                if error.code == sqlstate::TOO_MANY_CONNECTIONS && !asked_client && !retried =>
            {
                retried = true;
                let key = PoolKey {
                    address: shared.metadata.clone(),
                    database: database.to_owned(),
                    user: user.to_owned(),
                };
                if shared
                    .pools
                    .close_idle_of_waiting(&key, super::client_limits::LEAVING_GRACE)
                    .await
                    == 0
                {
                    refuse(stream, error).await;
                    return Ok(None);
                }
            }
            Attempt::Refused(error, _) => {
                refuse(stream, error).await;
                return Ok(None);
            }
            Attempt::LoggedIn(server) => return Ok(Some(*server)),
            Attempt::Failed => return Ok(None),
        }
    }
}

const CANNOT_BIND_HINT: &str = "A login relayed to the metadata node (auth = passthrough) \
cannot bind SCRAM to the client's TLS session, which is with the coordinator: connect with \
channel_binding=disable, or have the coordinator authenticate (auth = scram).";

/// The relayed login of a client that said "y" goes on over a plain
/// connection to the node: the same startup, and the client's first SCRAM
/// message once the node asks for SCRAM again. The node's refusal (its
/// pg_hba may want TLS for the role, `hostssl`) comes back as an error.
async fn relay_plain(
    metadata: &ServerAddress,
    startup: &[u8],
    initial_response: &[u8],
) -> Result<Result<ServerConnection, ServerError>, crate::backend::connection::BackendError> {
    let mut server = ServerConnection::open_relayed(metadata, false).await?;
    server.write(startup).await?;
    let (tag, body) = server.read().await?;
    let offers_scram = body
        .get(4..)
        .is_some_and(|list| scram::offers(list, scram::MECHANISM));
    match tag {
        tags::backend::AUTHENTICATION if body.get(..4) == Some(&10i32.to_be_bytes()) && offers_scram => {
            server.write(initial_response).await?;
            static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::info!(server = %metadata,
                    "a TLS client's relayed SCRAM login goes to the metadata node over a plain connection, \
                     which its session then uses (server_tls_sslmode = prefer; see docs/coordinator.md)");
            }
            Ok(Ok(server))
        }
        tags::backend::ERROR_RESPONSE => {
            let mut error = ServerError::parse(&body).with_hint(CANNOT_BIND_HINT);
            error.severity = "FATAL".into();
            Ok(Err(error))
        }
        // (trust, md5, password: another pg_hba line than over TLS, which
        // the client, asked for SCRAM, cannot answer)
        _ => Ok(Err(ServerError::fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            format!("the metadata node {metadata} asks for other authentication than SCRAM-SHA-256 without TLS"),
        )
        .with_hint(CANNOT_BIND_HINT))),
    }
}

/// Whether a SASLInitialResponse's SCRAM message starts with the gs2
/// header "y" (the client could bind, but saw no SCRAM-SHA-256-PLUS
/// offered): a node on TLS refuses it as a downgrade, whatever language
/// its error is in (auth-scram.c).
fn says_could_bind(answer: &[u8]) -> bool {
    let Some(end) = answer.iter().position(|b| *b == 0) else {
        return false;
    };
    // mechanism, NUL, the message's length (4 bytes), the message
    answer
        .get(end + 5..)
        .is_some_and(|message| message.starts_with(b"y,"))
}

/// A server's AuthenticationSASL body without SCRAM-SHA-256-PLUS: channel
/// binding ties the exchange to one TLS session, and the client's is with
/// the coordinator, not with the server.
fn without_channel_binding(body: &[u8]) -> Vec<u8> {
    let mut kept = body[..4].to_vec();
    for mechanism in body[4..].split(|b| *b == 0).filter(|m| !m.is_empty()) {
        if mechanism != scram::MECHANISM_PLUS.as_bytes() {
            kept.extend_from_slice(mechanism);
            kept.push(0);
        }
    }
    kept.push(0);
    kept
}

/// How a passthrough login went.
enum Attempt {
    LoggedIn(Box<ServerConnection>),
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
    let mut server = match ServerConnection::open_relayed(&shared.metadata, true).await {
        Ok(server) => server,
        Err(e) => {
            refuse(
                stream,
                ServerError::fatal(sqlstate::CONNECTION_FAILURE, e.to_string()),
            )
            .await;
            return Ok(Attempt::Failed);
        }
    };
    let mut out = BytesMut::new();
    let mut parameters = vec![("user", user), ("database", database)];
    parameters.extend(replication.map(|mode| ("replication", mode)));
    protocol::startup(&mut out, &parameters);
    let relay = async {
        server.write(&out).await?;
        // The client said "y" to a node on TLS (below): its refusal gets a
        // hint.
        let mut could_bind_over_tls = false;
        loop {
            let (tag, body) = server.read().await?;
            match tag {
                tags::backend::AUTHENTICATION => {
                    let code = body
                        .get(..4)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(-1);
                    if code == 0 {
                        break;
                    }
                    let mut message = BytesMut::new();
                    let at = protocol::begin_message(&mut message, tags::backend::AUTHENTICATION);
                    if code == 10 {
                        message.put_slice(&without_channel_binding(&body));
                    } else {
                        message.put_slice(&body);
                    }
                    protocol::end_message(&mut message, at);
                    stream.write_all(&message).await?;
                    if matches!(code, 3 | 5 | 10 | 11) {
                        asked_client = true;
                        let answer = read_auth_message(stream, input, 8192)
                            .await
                            .map_err(|e| std::io::Error::other(e.to_string()))?;
                        let mut message = BytesMut::new();
                        protocol::password(&mut message, &answer);
                        could_bind_over_tls =
                            code == 10 && server.on_tls() && says_could_bind(&answer);
                        if could_bind_over_tls && server_tls_mode() == ServerTlsMode::Prefer {
                            // A client on TLS saw no SCRAM-SHA-256-PLUS
                            // offered (its session is with the coordinator,
                            // it cannot bind to the node's) and says "y",
                            // which a node on TLS refuses as a downgrade.
                            // Under `prefer` the exchange goes on over a
                            // plain connection, where "y" is none: its
                            // first message binds to nothing of the
                            // connection's, and the client sees one
                            // exchange. (Under require and stronger the
                            // node's refusal reaches the client.)
                            match relay_plain(&shared.metadata, &out, &message).await? {
                                Ok(plain) => {
                                    server = plain;
                                    could_bind_over_tls = false;
                                }
                                Err(error) => return Ok(Some(error)),
                            }
                        } else {
                            server.write(&message).await?;
                        }
                    }
                }
                tags::backend::ERROR_RESPONSE => {
                    let mut error = ServerError::parse(&body);
                    if could_bind_over_tls {
                        error = error.with_hint(CANNOT_BIND_HINT);
                    }
                    error.severity = "FATAL".into();
                    return Ok::<_, crate::backend::connection::BackendError>(Some(error));
                }
                _ => return Err(protocol::ProtocolError::UnexpectedType(tag as char).into()),
            }
        }
        loop {
            let (tag, body) = server.read().await?;
            if tag == tags::backend::ERROR_RESPONSE {
                return Ok(Some(ServerError::parse(&body)));
            }
            if server.finish_startup(tag, &body)? {
                return Ok(None);
            }
        }
    };
    let result = relay.await;
    Ok(match result {
        Ok(None) => Attempt::LoggedIn(Box::new(server)),
        Ok(Some(error)) => Attempt::Refused(error, asked_client),
        Err(e) => {
            refuse(
                stream,
                ServerError::fatal(sqlstate::CONNECTION_FAILURE, e.to_string()),
            )
            .await;
            Attempt::Failed
        }
    })
}

/// Serves a replication connection: the client is told what the server
/// said at login (its cancel key is the coordinator's, forwarded to the
/// walsender), then bytes go both ways unchanged until either side ends.
pub(super) async fn relay_replication(
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
    slot.watch(&server);
    protocol::backend_key_data(&mut out, cancel_key.0, cancel_key.1);
    protocol::ready_for_query(&mut out, tags::status::IDLE);
    if stream.write_all(&out).await.is_ok() {
        if let Err(e) = server.relay_raw(&mut stream, &mut input).await {
            tracing::debug!(error = %e, "replication connection ended");
        }
    }
    shared.cancels.unregister(cancel_key);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initial_response(message: &str) -> Vec<u8> {
        let mut answer = b"SCRAM-SHA-256\0".to_vec();
        answer.extend_from_slice(&(message.len() as i32).to_be_bytes());
        answer.extend_from_slice(message.as_bytes());
        answer
    }

    #[test]
    fn a_client_that_could_bind_is_told_apart() {
        assert!(says_could_bind(&initial_response("y,,n=,r=abc")));
        assert!(!says_could_bind(&initial_response("n,,n=,r=abc")));
        assert!(!says_could_bind(&initial_response(
            "p=tls-server-end-point,,n=,r=abc"
        )));
        assert!(!says_could_bind(b"SCRAM-SHA-256"));
        assert!(!says_could_bind(b"SCRAM-SHA-256\0\0\0"));
    }

    #[test]
    fn plus_is_left_out_of_relayed_offers() {
        let offer = b"\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
        assert_eq!(
            without_channel_binding(offer),
            b"\0\0\0\x0aSCRAM-SHA-256\0\0".to_vec()
        );
    }
}
