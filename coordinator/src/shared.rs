//! The state every client session shares: configuration, pools, pipes,
//! shard maps, metrics, cancel keys, the clients, TLS, the statement cache,
//! client counts;
//! and the housekeeping of the pools.

use crate::backend::connection::ServerAddress;
use crate::backend::{cluster, multiplex, notifiers, pool};
use crate::config::Config;
use crate::frontend::auth::Users;
use crate::frontend::cancel::CancelRegistry;
use crate::frontend::client_limits::ClientCounts;
use crate::frontend::client_list::ClientList;
use crate::metrics;
use crate::router::statement_cache::StatementCache;
use std::sync::Arc;
use std::time::Duration;

/// What every client session shares.
pub struct Shared {
    pub config: Config,
    pub metadata: ServerAddress,
    pub pools: pool::Pools,
    pub pipes: multiplex::Pipes,
    pub maps: Arc<cluster::Maps>,
    pub metrics: Arc<metrics::Metrics>,
    pub users: Option<Users>,
    pub cancels: CancelRegistry,
    /// Logged-in clients (SHOW CLIENTS).
    pub client_list: ClientList,
    /// TLS with clients (None: tls = disable).
    pub tls: Option<crate::net::tls::TlsAcceptor>,
    pub notifiers: notifiers::Notifiers,
    pub statements: StatementCache,
    /// Clients per role and database, for their CONNECTION LIMITs.
    pub clients: Arc<ClientCounts>,
}

/// Closes pooled server connections idle for longer than
/// `--server-idle-timeout`: an idle pool keeps no database busy for long
/// (DROP DATABASE, CREATE DATABASE from it as a template) and holds no
/// server backend it does not need.
pub async fn close_idle_server_connections(shared: Arc<Shared>) {
    let limit = Duration::from_secs(shared.config.server_idle_timeout);
    let mut ticker =
        tokio::time::interval((limit / 4).clamp(Duration::from_secs(1), Duration::from_secs(30)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let closed = shared.pools.close_idle_since(limit);
        if closed > 0 {
            tracing::debug!(closed, "idle server connections closed");
        }
    }
}
