//! A client connection from its first byte to its end: the startup packet
//! (SSL, cancel, replication), the limits, authentication, the session.

use super::*;
use crate::config::TlsMode;
use crate::net::sqlstate;
use crate::net::tags;

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
    match start(stream, shared.clone(), crowded, peer).await {
        Ok(Some(mut session)) => {
            let result = session.run().await;
            session.forget_session_state();
            shared.cancels.unregister(session.cancel_key);
            shared.client_list.remove(session.cancel_key);
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
    peer: Option<std::net::SocketAddr>,
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
            StartupRequest::Ssl => match &shared.tls {
                Some(acceptor) if !stream.is_tls() => {
                    // Bytes after the request would be plaintext the client
                    // sent before the session: refused, as PostgreSQL does
                    // (CVE-2021-23214).
                    if !input.is_empty() {
                        return Err(SessionError::Protocol(
                            protocol::ProtocolError::UnencryptedAfterSslRequest,
                        ));
                    }
                    stream.write_all(b"S").await?;
                    tokio::time::timeout_at(deadline, stream.start_tls(|tcp| acceptor.accept(tcp)))
                        .await
                        .map_err(timed_out)??;
                }
                // Asked again inside the session: a protocol violation,
                // as PostgreSQL takes it.
                Some(_) => {
                    return Err(SessionError::Protocol(
                        protocol::ProtocolError::SslRequestInsideTls,
                    ))
                }
                None => stream.write_all(b"N").await?,
            },
            StartupRequest::GssEncryption => {
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
    let tls = stream.tls_description();
    if tls.is_none() && shared.config.tls == TlsMode::Require {
        refuse(
            &mut stream,
            ServerError::fatal(
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                "this coordinator accepts only TLS connections (tls = require)",
            )
            .with_hint("Connect with sslmode=require, verify-ca or verify-full."),
        )
        .await;
        return Ok(None);
    }
    if crowded {
        refuse(
            &mut stream,
            ServerError::fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                "sorry, too many clients already",
            ),
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
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
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
    // A passthrough login's server connection: the session's first.
    let mut login_connection = None;
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
                        login_connection = Some(connection);
                    }
                }
                None => return Ok(None),
            }
        }
    }
    if let Some(mode) = &replication {
        // Other logins: the coordinator's own server credentials.
        let credentials = crate::backend::connection::Credentials {
            user: &user,
            password: shared.config.server_password.as_deref(),
        };
        let extra = [("replication", mode.as_str())];
        match ServerConnection::connect(&shared.metadata, &database, &credentials, &extra).await {
            Ok(connection) => relay_replication(stream, input, connection, &shared).await,
            Err(e) => {
                refuse(
                    &mut stream,
                    ServerError::fatal(sqlstate::CONNECTION_FAILURE, e.to_string()),
                )
                .await
            }
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
                    sqlstate::FEATURE_NOT_SUPPORTED,
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
    let (login, mut reported, login_lease): (
        Login,
        Vec<(String, String)>,
        Option<crate::backend::pool::Lease>,
    ) = loop {
        tries += 1;
        let lent = login_connection.is_some();
        let checkout = match login_connection.take() {
            Some(connection) => shared.pools.lend(&metadata_key, connection).await,
            None => shared.pools.checkout(&metadata_key).await,
        };
        let mut lease = match checkout {
            Ok(lease) => lease,
            Err(e) => {
                let error = match e {
                    crate::backend::pool::PoolError::Backend(
                        crate::backend::connection::BackendError::Refused(mut error),
                    ) => {
                        error.severity = "FATAL".into();
                        error
                    }
                    other => ServerError::fatal(sqlstate::CONNECTION_FAILURE, other.to_string()),
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
                            sqlstate::CONNECTION_FAILURE,
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
                break (login, reported, lent.then_some(lease));
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
    let limits = crate::frontend::client_limits::Limits {
        role: login.role_limit,
        database: login.database_limit,
        superuser,
    };
    if let Some(lease) = login_lease {
        if limits.none_apply() {
            shared.pools.end_login_lease(lease).await;
        }
    }
    let admitted = match shared
        .clients
        .admit_waiting(&user, &database, &limits)
        .await
    {
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
    protocol::ready_for_query(&mut out, tags::status::IDLE);
    stream.write_all(&out).await?;
    let map = shared.maps.get(&database).await;
    let cancel_slot = shared.cancels.register(cancel_key);
    shared.client_list.add(
        cancel_key,
        crate::frontend::client_list::ClientEntry {
            user: user.clone(),
            database: database.clone(),
            peer,
            tls,
            application_name: parameter("application_name").unwrap_or_default(),
            connected_at: std::time::SystemTime::now(),
        },
    );
    let routing = routing_possible(&settings);
    let idle_timeout = idle_session_timeout(&settings);
    let schemas = search_path
        .as_deref()
        .and_then(|path| crate::router::search_path::schemas(path, &user));
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
        tx: Transaction::idle(),
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
        metadata_restart_deadline: None,
        idle_timeout,
        routing,
        session_targets: HashSet::new(),
        session_connections: HashMap::new(),
        pending_settings: Vec::new(),
        pending_transaction: None,
        deadlock_fired: None,
    }))
}
