//! Blocking connections to nodes over the `postgres` crate, for the job
//! runners' own sessions and the few one-off questions asked outside any
//! transaction (recovery, sizes, whether two addresses are one server).
//! Statements of the local transaction go through
//! [`super::connection::NodeConnection`] instead.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::spi::query_value;
use postgres::{Client, Config, NoTls};
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Human-readable text of a remote error, with the server's message and detail.
pub(crate) fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = db.message().to_string();
            if let Some(detail) = db.detail() {
                text.push_str(" (");
                text.push_str(detail);
                text.push(')');
            }
            text
        }
        None => {
            // Connection errors keep the useful part ("Connection refused") in their sources.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

pub(crate) fn remote_error(node: &Node, error: &postgres::Error) -> ShardError {
    ShardError::Remote {
        host: node.host.clone(),
        port: node.port,
        cause: describe(error),
    }
}

/// The application_name of every connection pg_shard opens to a worker:
/// it names the backend the connection works for, which
/// `pg_shard.worker_activity()` reads back on the workers.
pub(crate) fn application_name() -> String {
    // SAFETY: MyProcPid is set once when the backend starts and only read after.
    let pid = unsafe { pgrx::pg_sys::MyProcPid };
    format!("pg_shard pid={pid}")
}

/// Open a connection to a node outside any transaction.
pub(crate) fn connect(host: &str, port: i32) -> Result<Client> {
    let unreachable = |cause: String| ShardError::Unreachable {
        host: host.to_string(),
        port,
        cause,
    };
    let port_u16 = u16::try_from(port).map_err(|_| unreachable("invalid port".into()))?;
    let database = query_value::<String>("SELECT current_database()::text")?;
    let user = crate::metadata::catalog::acting_user()?;
    let database = database.unwrap_or_else(|| "postgres".into());
    let mut config = Config::new();
    config
        .host(host)
        .port(port_u16)
        .dbname(&database)
        .user(&user)
        .application_name(&application_name())
        // Generated SQL is fully qualified; an empty path keeps the worker's
        // own search_path from changing what it means.
        .options("-c search_path=pg_catalog")
        .connect_timeout(CONNECT_TIMEOUT)
        // Notice a worker that vanished instead of waiting forever.
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30))
        .tcp_user_timeout(Duration::from_secs(60));
    // The crate reads neither PGPASSWORD nor .pgpass; libpq's connections do.
    if let Some(password) = super::password::password_for(host, port_u16, &database, &user) {
        config.password(password);
    }
    config.connect(NoTls).map_err(|e| unreachable(describe(&e)))
}
