//! pg_shard coordinator: apps connect here with plain SQL over the
//! PostgreSQL protocol; single-shard statements go straight to their
//! worker, everything else to the metadata node.

mod admin;
mod auth;
mod backend;
mod cluster;
mod config;
mod metrics;
mod pool;
mod protocol;
mod router;
mod scram;
mod session;

use backend::ServerAddress;
use config::{AuthMode, Config};
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// What every client session shares.
pub struct Shared {
    pub config: Config,
    pub metadata: ServerAddress,
    pub pools: pool::Pools,
    pub maps: Arc<cluster::Maps>,
    pub metrics: Arc<metrics::Metrics>,
    pub users: Option<auth::Users>,
    pub cancels: session::CancelRegistry,
    pub statements: StatementCache,
}

/// Parsed statements by text: a prepared statement is parsed once.
pub struct StatementCache {
    entries: Mutex<LruCache<String, Arc<router::Analysis>>>,
}

impl StatementCache {
    fn new(size: usize) -> StatementCache {
        StatementCache {
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::new(size).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    pub fn get(&self, sql: &str) -> Arc<router::Analysis> {
        if let Ok(mut entries) = self.entries.lock() {
            if let Some(found) = entries.get(sql) {
                return found.clone();
            }
        }
        let analysis = Arc::new(router::analyze(sql));
        if let Ok(mut entries) = self.entries.lock() {
            entries.put(sql.to_owned(), analysis.clone());
        }
        analysis
    }
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
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

async fn run(config: Config) -> Result<(), String> {
    let metadata = parse_address(&config.metadata).ok_or_else(|| {
        format!(
            "invalid metadata address {:?} (expected host:port)",
            config.metadata
        )
    })?;
    let users = match (&config.users_file, config.auth) {
        (Some(path), _) => Some(auth::Users::load(path).map_err(|e| e.to_string())?),
        (None, _) => None,
    };
    if config.auth == AuthMode::Trust {
        tracing::warn!("auth = trust: every client may connect as any user");
    }
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
    tracing::info!(listen = %config.listen, metadata = %metadata, metrics = %config.metrics_listen, "pg_shard coordinator ready");
    let shared = Arc::new(Shared {
        pools: pool::Pools::new(
            config.pool_size,
            config.server_password.clone(),
            metrics.clone(),
        ),
        statements: StatementCache::new(config.statement_cache_size),
        config,
        metadata,
        maps,
        metrics,
        users,
        cancels: session::CancelRegistry::default(),
    });
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(session::serve(stream, shared.clone()));
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
