//! pg_shard coordinator: apps connect here with plain SQL over the
//! PostgreSQL protocol; single-shard statements go straight to their
//! worker, everything else to the metadata node.
//!
//! Layout (one concept per module):
//! * [`frontend`] – one client: startup and login, the session loop, the
//!   simple and extended protocol, the transaction, settings, the relay
//! * [`router`]   – where a statement runs: analysis, keys, the decision,
//!   rewriting, the lexer, the statement cache
//! * [`backend`]  – server connections, pools, multiplexed pipes, the
//!   cluster's shard maps, notification senders
//! * [`net`]      – the wire: protocol messages, SQLSTATEs, sockets, SCRAM
//! * [`shared`]   – the state every session shares
//!
//! This file parses the configuration and starts the listeners.

mod backend;
mod config;
mod frontend;
mod hot_keys;
mod map_page;
mod metrics;
mod net;
mod open_files;
mod router;
mod shared;

use backend::connection::ServerAddress;
use backend::{cluster, multiplex, notifiers, pool};
use config::{AuthMode, Config, TlsMode};
use router::statement_cache::StatementCache;
use shared::Shared;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Starts the event loops besides the main one (threads - 1 of them);
/// returns where to send them clients.
fn event_loops(
    shared: &Arc<Shared>,
) -> Result<Vec<tokio::sync::mpsc::UnboundedSender<std::net::TcpStream>>, String> {
    let threads = match shared.config.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let busy_poll = shared.config.busy_poll_window();
    let mut senders = Vec::new();
    for index in 1..threads {
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<std::net::TcpStream>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start event loop {index}: {e}"))?;
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("event-loop-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::spawn(net::busy_poll::run(busy_poll));
                    while let Some(stream) = receiver.recv().await {
                        match tokio::net::TcpStream::from_std(stream) {
                            Ok(stream) => {
                                tokio::spawn(frontend::serve(stream, shared.clone()));
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot adopt a client connection")
                            }
                        }
                    }
                })
            })
            .map_err(|e| format!("cannot start event loop {index}: {e}"))?;
        senders.push(sender);
    }
    Ok(senders)
}

fn parse_address(text: &str) -> Option<ServerAddress> {
    let (host, port) = text.rsplit_once(':')?;
    Some(ServerAddress {
        host: host.to_owned(),
        port: port.parse().ok()?,
    })
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match Config::load(&args, &|name| std::env::var(name).ok()) {
        Ok(Some(config)) => config,
        Ok(None) => {
            print!("{}", config::USAGE);
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("pg_shard_coordinator: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PGSHARD_COORDINATOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if config.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    // The first event loop (of --threads); see event_loops.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pg_shard_coordinator: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            eprintln!("pg_shard_coordinator: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mut config: Config) -> Result<(), String> {
    let metadata = parse_address(&config.metadata).ok_or_else(|| {
        format!(
            "invalid metadata address {:?} (expected host:port)",
            config.metadata
        )
    })?;
    let users = match (&config.users_file, config.auth) {
        (Some(path), _) => Some(frontend::auth::Users::load(path).map_err(|e| e.to_string())?),
        (None, _) => None,
    };
    if config.auth == AuthMode::Trust {
        tracing::warn!("auth = trust: every client may connect as any user");
    }
    if let Some(open_files) = open_files::soft_limit() {
        let fit = open_files::clients_within(open_files);
        if config.max_clients > fit {
            tracing::warn!(
                max_clients = config.max_clients,
                open_files,
                "--max-clients lowered to {fit}: the open files limit allows no more \
                 (raise it with ulimit -n)"
            );
            config.max_clients = fit;
        }
    }
    let tls = match (&config.tls_cert_file, &config.tls_key_file, config.tls) {
        (_, _, TlsMode::Disable) => None,
        (Some(certificate), Some(key), _) => {
            Some(net::tls::TlsAcceptor::load(certificate, key).map_err(|e| e.to_string())?)
        }
        _ => {
            return Err(format!(
                "tls = {} needs tls_cert_file and tls_key_file",
                config.tls.name()
            ))
        }
    };
    backend::connection::use_socket_folder(config.server_socket_dir.clone());
    let server_tls = net::tls_client::TlsConnector::new(
        config.server_tls_sslmode,
        config.server_tls_ca_file.as_deref(),
        config
            .server_tls_cert_file
            .as_deref()
            .zip(config.server_tls_key_file.as_deref()),
    )
    .map_err(|e| e.to_string())?;
    backend::connection::use_server_tls(server_tls);
    let metrics = Arc::new(metrics::Metrics::default());
    let maps = cluster::Maps::new(
        metadata.clone(),
        config.catalog_user.clone(),
        config.server_password.clone(),
        metrics.clone(),
    );
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    if !config.metrics_listen.is_empty() {
        let metrics_listener = TcpListener::bind(&config.metrics_listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.metrics_listen))?;
        tokio::spawn(metrics::serve(metrics_listener, metrics.clone()));
    }
    // The maps of the databases that use pg_shard are loaded now; others on
    // first use.
    tokio::spawn(maps.clone().preload());
    tracing::info!(listen = %config.listen, metadata = %metadata, metrics = %config.metrics_listen, "pg_shard coordinator ready");
    let shared = Arc::new(Shared {
        pools: pool::Pools::new(
            config.pool_size,
            config.server_password.clone(),
            metrics.clone(),
        ),
        pipes: multiplex::Pipes::new(config.server_password.clone(), metrics.clone()),
        statements: StatementCache::new(config.statement_cache_size),
        config,
        metadata,
        maps,
        metrics,
        users,
        cancels: frontend::cancel::CancelRegistry::default(),
        client_list: frontend::client_list::ClientList::default(),
        tls,
        notifiers: notifiers::Notifiers::default(),
        clients: Arc::default(),
    });
    if shared.config.server_idle_timeout > 0 {
        tokio::spawn(shared::close_idle_server_connections(shared.clone()));
    }
    tokio::spawn(net::busy_poll::run(shared.config.busy_poll_window()));
    let event_loops = event_loops(&shared)?;
    let mut next = 0;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Clients are spread over the event loops (--threads);
                    // each client stays on its loop, so serving it never
                    // wakes another thread.
                    next = (next + 1) % (event_loops.len() + 1);
                    if next == 0 {
                        tokio::spawn(frontend::serve(stream, shared.clone()));
                    } else if let Ok(stream) = stream.into_std() {
                        let _ = event_loops[next - 1].send(stream);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: shutting down");
                return Ok(());
            }
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("interrupted: shutting down");
                return Ok(());
            }
        }
    }
}
