//! Server connection pools, one per (server, database, user): transaction
//! pooling, so a connection serves one client transaction at a time and
//! returns to its pool when the transaction ends.

use crate::backend::connection::{BackendError, Credentials, ServerAddress, ServerConnection};
use crate::metrics::{Metrics, NodeStats};
use crate::net::sqlstate;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection closed to make room for a login is given to end
/// on its server.
const LOGIN_EXIT_WAIT: Duration = Duration::from_secs(1);
/// How long a client waits for a free server connection.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection with more prepared statements than this is closed rather
/// than returned to its pool (server memory).
const MOST_PREPARED_PER_CONNECTION: usize = 2000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub address: ServerAddress,
    pub database: String,
    pub user: String,
}

pub struct Pool {
    pub key: PoolKey,
    /// The server's statement counters.
    pub stats: Arc<NodeStats>,
    idle: Mutex<Vec<ServerConnection>>,
    permits: Arc<Semaphore>,
    size: usize,
    pub checkouts: AtomicU64,
    pub connects: AtomicU64,
    /// The role's and database's settings as the last login found them
    /// (`ROLE_SETTINGS_QUERY`): connections made before they changed are
    /// closed rather than reused (their defaults are the old ones).
    role_settings: Mutex<Option<String>>,
    /// Moves on whenever `role_settings` does: a connection checked at this
    /// generation needs no string comparison (checkouts stay lock-free).
    settings_generation: AtomicU64,
    /// The server refused a login over its Unix-domain socket: passthrough
    /// logins' TCP connections are pooled rather than swapped for socket
    /// ones ([`Pools::end_login_lease`]).
    socket_refused: AtomicBool,
}

impl Pool {
    /// A login read the role's and database's settings as `current`.
    pub fn note_role_settings(&self, current: &str) {
        if let Ok(mut known) = self.role_settings.lock() {
            if known.as_deref() != Some(current) {
                *known = Some(current.to_owned());
                self.settings_generation.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Whether `connection` started with the settings a new session gets.
    fn current(&self, connection: &mut ServerConnection) -> bool {
        // Read before the settings: a change meanwhile leaves the
        // connection at an older generation, to be compared again.
        let generation = self.settings_generation.load(Ordering::Acquire);
        if connection.settings_generation == generation {
            return true;
        }
        let current = self
            .role_settings
            .lock()
            .map(|known| match known.as_deref() {
                Some(known) => connection.role_settings.as_deref() == Some(known),
                None => true,
            })
            .unwrap_or(true);
        if current {
            connection.settings_generation = generation;
        }
        current
    }

    pub fn idle_count(&self) -> usize {
        self.idle.lock().map(|idle| idle.len()).unwrap_or(0)
    }

    pub fn active_count(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    pub fn size(&self) -> usize {
        self.size
    }
}

pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    size: usize,
    password: Option<String>,
    metrics: Arc<Metrics>,
}

/// A server connection lent to one client; goes back to its pool when
/// dropped if it is idle and healthy.
pub struct Lease {
    connection: Option<ServerConnection>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
    /// The connection had been idle in the pool (it may have been closed
    /// by its server meanwhile).
    pub reused: bool,
}

impl Lease {
    pub fn connection(&mut self) -> &mut ServerConnection {
        self.connection
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(mut connection) = self.connection.take() {
            if connection.reusable()
                && connection.cancels_in_flight.load(Ordering::Acquire) == 0
                && connection.prepared.len() < MOST_PREPARED_PER_CONNECTION
                && self.pool.current(&mut connection)
            {
                connection.idle_since = std::time::Instant::now();
                if let Ok(mut idle) = self.pool.idle.lock() {
                    // Within the size with the others lent (this lease
                    // still counts among them): a lent login's connection
                    // ([`Pools::lend`]) did not come from the pool.
                    if idle.len() + self.pool.active_count() <= self.pool.size {
                        idle.push(connection);
                    }
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no free server connection to {0} within {1:?}")]
    Exhausted(ServerAddress, Duration),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl Pools {
    pub fn new(size: usize, password: Option<String>, metrics: Arc<Metrics>) -> Pools {
        Pools {
            pools: Mutex::new(HashMap::new()),
            size,
            password,
            metrics,
        }
    }

    pub fn all(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .map(|pools| pools.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The pool for `key` (made on first use), for callers that keep it.
    pub fn pool(&self, key: &PoolKey) -> Arc<Pool> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Pool {
                    key: key.clone(),
                    stats: self.metrics.node(&key.address.to_string()),
                    idle: Mutex::new(Vec::new()),
                    permits: Arc::new(Semaphore::new(self.size)),
                    size: self.size,
                    checkouts: AtomicU64::new(0),
                    connects: AtomicU64::new(0),
                    role_settings: Mutex::new(None),
                    // (Connections start at 0: compared once.)
                    settings_generation: AtomicU64::new(1),
                    socket_refused: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// An idle connection from the pool, or a new one.
    pub async fn checkout(&self, key: &PoolKey) -> Result<Lease, PoolError> {
        self.checkout_from(self.pool(key), 0).await
    }

    /// [`Pools::checkout`] from a pool the caller kept; the idle connection
    /// that `session` used last if there is one (it keeps that session's
    /// sequence state and needs no reset), else the one idle longest.
    pub async fn checkout_from(&self, pool: Arc<Pool>, session: u64) -> Result<Lease, PoolError> {
        let permit = acquire(&pool).await?;
        pool.checkouts.fetch_add(1, Ordering::Relaxed);
        let idle = pool.idle.lock().ok().and_then(|mut idle| {
            // Made before the role's or database's settings changed.
            idle.retain_mut(|c| pool.current(c));
            let own = idle
                .iter()
                .rposition(|c| session != 0 && c.last_session == session);
            // Else the one idle longest: the recently used ones are likely
            // to be wanted back by their sessions (their sequence state,
            // their prepared statements).
            let oldest = (!idle.is_empty()).then_some(0);
            own.or(oldest).map(|index| idle.remove(index))
        });
        let reused = idle.is_some();
        let connection = match idle {
            Some(connection) => connection,
            None => open_for(&pool, &self.metrics, self.password.as_deref()).await?,
        };
        Ok(Lease {
            connection: Some(connection),
            pool,
            _permit: permit,
            reused,
        })
    }

    /// Closes the idle connections of the pool behind `lease` (its server
    /// went away, so they are likely dead too).
    pub fn discard_idle(&self, lease: &Lease) {
        if let Ok(mut idle) = lease.pool.idle.lock() {
            idle.clear();
        }
    }

    /// Closes the connections idle for longer than `limit` (they are at
    /// the front: connections go back at the end).
    pub fn close_idle_since(&self, limit: Duration) -> usize {
        let mut closed = 0;
        for pool in self.all() {
            if let Ok(mut idle) = pool.idle.lock() {
                let stale = idle
                    .iter()
                    .take_while(|c| c.idle_since.elapsed() > limit)
                    .count();
                idle.drain(..stale);
                closed += stale;
            }
        }
        closed
    }

    /// Closes every idle connection to `database`, on every server (a
    /// statement needs the database free of other sessions).
    pub fn close_idle_to(&self, database: &str) {
        for pool in self.all() {
            if pool.key.database == database {
                if let Ok(mut idle) = pool.idle.lock() {
                    idle.clear();
                }
            }
        }
    }

    /// The idle connections of `key`'s pool, taken out of it.
    fn take_idle_of(&self, key: &PoolKey) -> Vec<ServerConnection> {
        let pool = self
            .pools
            .lock()
            .ok()
            .and_then(|pools| pools.get(key).cloned());
        pool.and_then(|pool| {
            pool.idle
                .lock()
                .ok()
                .map(|mut idle| std::mem::take(&mut *idle))
        })
        .unwrap_or_default()
    }

    /// Closes the idle connections of `key`'s pool, their backends gone
    /// from the server when it returns; when none is idle but some are
    /// lent, waits up to `grace` for one to come back (its client just
    /// left). How many it closed.
    pub async fn close_idle_of_waiting(&self, key: &PoolKey, grace: Duration) -> usize {
        let deadline = std::time::Instant::now() + grace;
        loop {
            // Their backends must have left the server, else the login
            // that asks for their places is refused again.
            let taken = self.take_idle_of(key);
            let closed = taken.len();
            // Together: the wait is one backend's exit, not one per closed
            // connection.
            futures_util::future::join_all(
                taken
                    .into_iter()
                    .map(|connection| connection.terminate(LOGIN_EXIT_WAIT)),
            )
            .await;
            let lent = self
                .pools
                .lock()
                .ok()
                .and_then(|pools| pools.get(key).map(|pool| pool.active_count()))
                .unwrap_or(0);
            if closed > 0 || lent == 0 || std::time::Instant::now() >= deadline {
                return closed;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lends `connection`, made elsewhere for `key` (a passthrough login's),
    /// as if it had been checked out of its pool.
    pub async fn lend(
        &self,
        key: &PoolKey,
        connection: ServerConnection,
    ) -> Result<Lease, PoolError> {
        let pool = self.pool(key);
        let permit = acquire(&pool).await?;
        pool.checkouts.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            connection: Some(connection),
            pool,
            _permit: permit,
            reused: false,
        })
    }

    /// Ends the lease of a passthrough login's connection ([`Self::lend`])
    /// whose role and database have no CONNECTION LIMIT. A login reaches
    /// the server over TCP (its rules for TCP clients apply to it); where
    /// the coordinator's own connections use the server's Unix-domain
    /// socket, the pool gets one of those in its place (over TCP every
    /// message costs both sides more). If the server refuses the socket
    /// connection (its local rules ask for a password the coordinator does
    /// not have), the logins' TCP connections are pooled.
    ///
    /// Each login still leaves one connection in the pool, as without the
    /// swap: sessions that log in together find one each, and do not take
    /// each other's (and with it their currval). The TCP connection's
    /// backend has ended before the other is opened, so that a burst of
    /// logins holds no more server connections than without the swap (a
    /// server at max_connections refused sessions' connections while the
    /// closed backends were still exiting). Not for limited roles: the
    /// swap could still take the place of the role's next client.
    pub async fn end_login_lease(&self, mut lease: Lease) {
        let pool = lease.pool.clone();
        if !lease.connection().tcp_where_socket_serves()
            || pool.socket_refused.load(Ordering::Acquire)
        {
            return;
        }
        if let Some(over_tcp) = lease.connection.take() {
            over_tcp.terminate(LOGIN_EXIT_WAIT).await;
        }
        if pool.idle_count() + pool.active_count() > pool.size {
            // Full: no place for one in the pool.
            return;
        }
        match open_for(&pool, &self.metrics, self.password.as_deref()).await {
            Ok(connection) => lease.connection = Some(connection),
            Err(e) if refuses_login(&e) => {
                tracing::debug!(server = %pool.key.address, error = %e,
                    "the server refuses connections over its socket; logins' TCP connections are pooled");
                pool.socket_refused.store(true, Ordering::Release);
            }
            // The session opens one when it needs it.
            Err(e) => tracing::debug!(server = %pool.key.address, error = %e,
                "no connection over the server's socket after a login"),
        }
    }
}

/// Whether the server turned the login itself down (its rules, a password
/// the coordinator lacks), rather than failing for the moment.
fn refuses_login(error: &BackendError) -> bool {
    match error {
        BackendError::Refused(error) => [
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            sqlstate::INVALID_PASSWORD,
        ]
        .contains(&error.code.as_str()),
        BackendError::PasswordNeeded(_)
        | BackendError::UnsupportedAuth(..)
        | BackendError::Scram(_) => true,
        _ => false,
    }
}

/// A place in `pool`, waited for up to [`CHECKOUT_TIMEOUT`].
async fn acquire(pool: &Arc<Pool>) -> Result<OwnedSemaphorePermit, PoolError> {
    let exhausted = || PoolError::Exhausted(pool.key.address.clone(), CHECKOUT_TIMEOUT);
    tokio::time::timeout(CHECKOUT_TIMEOUT, pool.permits.clone().acquire_owned())
        .await
        .map_err(|_| exhausted())?
        .map_err(|_| exhausted())
}

/// A new connection of `pool`'s own, counted.
async fn open_for(
    pool: &Pool,
    metrics: &Metrics,
    password: Option<&str>,
) -> Result<ServerConnection, BackendError> {
    pool.connects.fetch_add(1, Ordering::Relaxed);
    metrics.server_connects.fetch_add(1, Ordering::Relaxed);
    connect(&pool.key, password).await
}

/// A new server connection for `key`.
pub async fn connect(
    key: &PoolKey,
    password: Option<&str>,
) -> Result<ServerConnection, BackendError> {
    let mut connection = ServerConnection::connect(
        &key.address,
        &key.database,
        &Credentials {
            user: &key.user,
            password,
        },
        // No application_name: RESET ALL brings back what the startup
        // packet set, and a client's default is ''.
        &[],
    )
    .await?;
    connection.note_role_settings().await?;
    Ok(connection)
}
