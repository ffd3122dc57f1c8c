//! Node-to-node connections from the extension (the `postgres` crate).
//!
//! As in Citus, a node is reached in the database of the same name as the
//! current database, as the current user, so several clusters can live side
//! by side in separate databases.
//!
//! Writes on other nodes happen in remote transactions tied to the local one:
//! [`in_transaction`] opens (or reuses) a connection running `BEGIN`, and the
//! local transaction commits them all in its pre-commit phase, or drops the
//! connections on abort, which rolls the remote work back.
//!
//! A rolled-back subtransaction (ROLLBACK TO SAVEPOINT, a PL/pgSQL exception
//! block, psql's ON_ERROR_ROLLBACK) that did remote work cannot be undone on
//! the workers alone: the remote transactions are rolled back and the local
//! transaction can only end in a rollback (its COMMIT fails).
//!
//! Known limit: a failure between two remote COMMITs leaves the earlier one
//! committed (no two-phase commit yet); the objects involved carry new shard
//! ids, so such leftovers never collide with a retry.

use crate::catalog::{query_value, Node};
use crate::error::{Result, ShardError};
use pgrx::prelude::*;
use pgrx::{
    register_subxact_callback, register_xact_callback, PgSubXactCallbackEvent, PgXactCallbackEvent,
};
use postgres::{Client, Config, NoTls};
use std::cell::{Cell, RefCell};
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Human-readable text of a remote error, with the server's message and detail.
pub fn describe(error: &postgres::Error) -> String {
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

pub fn remote_error(node: &Node, error: &postgres::Error) -> ShardError {
    ShardError::Remote {
        host: node.host.clone(),
        port: node.port,
        cause: describe(error),
    }
}

/// Open a connection to a node outside any transaction.
pub fn connect(host: &str, port: i32) -> Result<Client> {
    let unreachable = |cause: String| ShardError::Unreachable {
        host: host.to_string(),
        port,
        cause,
    };
    let port_u16 = u16::try_from(port).map_err(|_| unreachable("invalid port".into()))?;
    let database = query_value::<String>("SELECT current_database()::text")?;
    let user = query_value::<String>("SELECT current_user::text")?;
    let mut config = Config::new();
    config
        .host(host)
        .port(port_u16)
        .dbname(database.as_deref().unwrap_or("postgres"))
        .user(user.as_deref().unwrap_or("postgres"))
        .application_name("pg_shard")
        // Generated SQL is fully qualified; an empty path keeps the worker's
        // own search_path from changing what it means.
        .options("-c search_path=pg_catalog")
        .connect_timeout(CONNECT_TIMEOUT)
        // Notice a worker that vanished instead of waiting forever.
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30))
        .tcp_user_timeout(Duration::from_secs(60));
    config.connect(NoTls).map_err(|e| unreachable(describe(&e)))
}

struct OpenTransaction {
    node: Node,
    client: Client,
}

thread_local! {
    // Backends are single-threaded; this holds the remote transactions of the
    // current local transaction.
    static OPEN: RefCell<Vec<OpenTransaction>> = const { RefCell::new(Vec::new()) };
    // The newest subtransaction that did remote work: aborting it (or one of
    // its parents) loses work the workers cannot give back selectively.
    static NEWEST_WORK_SUBXACT: Cell<pg_sys::SubTransactionId> = const { Cell::new(0) };
    // Set when that happened; the local transaction may then only roll back.
    static POISONED: Cell<bool> = const { Cell::new(false) };
}

/// Run `work` on `node` inside a remote transaction that commits or aborts
/// with the local one.
pub fn in_transaction<T>(node: &Node, work: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
    // Remote calls block; give a cancel or statement_timeout its chance first.
    pgrx::check_for_interrupts!();
    let position = OPEN.with(|open| open.borrow().iter().position(|t| t.node.same_server(node)));
    let position = match position {
        Some(position) => position,
        None => {
            let mut client = connect(&node.host, node.port)?;
            client
                .batch_execute("BEGIN")
                .map_err(|e| remote_error(node, &e))?;
            let first = OPEN.with(|open| {
                let mut open = open.borrow_mut();
                open.push(OpenTransaction {
                    node: node.clone(),
                    client,
                });
                open.len() == 1
            });
            if first {
                register_xact_callback(PgXactCallbackEvent::PreCommit, commit_all);
                register_xact_callback(PgXactCallbackEvent::PrePrepare, refuse_prepare);
                register_xact_callback(PgXactCallbackEvent::Abort, transaction_aborted);
                register_subxact_callback(PgSubXactCallbackEvent::AbortSub, subtransaction_aborted);
            }
            OPEN.with(|open| open.borrow().len() - 1)
        }
    };
    // SAFETY: reads the current subtransaction id; no side effects.
    NEWEST_WORK_SUBXACT.set(unsafe { pg_sys::GetCurrentSubTransactionId() });
    // Take the connection out while `work` runs so it may itself use SPI or
    // open connections to other nodes.
    let mut taken = OPEN.with(|open| open.borrow_mut().remove(position));
    let result = work(&mut taken.client);
    OPEN.with(|open| open.borrow_mut().insert(position, taken));
    result
}

fn subtransaction_aborted(aborted: pg_sys::SubTransactionId, _parent: pg_sys::SubTransactionId) {
    // Subtransaction ids grow, so work at an id >= the aborted one was done
    // inside it (or inside one of its children).
    if NEWEST_WORK_SUBXACT.get() >= aborted && OPEN.with(|open| !open.borrow().is_empty()) {
        abandon_all();
        POISONED.set(true);
    }
}

fn commit_all() {
    if POISONED.replace(false) {
        ShardError::SubtransactionRolledBack.report();
    }
    let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    for mut transaction in open {
        if let Err(e) = transaction.client.batch_execute("COMMIT") {
            remote_error(&transaction.node, &e).report();
        }
    }
}

/// PREPARE TRANSACTION cannot carry the remote transactions along (no
/// two-phase commit across nodes yet), so it is refused, as postgres_fdw does.
fn refuse_prepare() {
    if OPEN.with(|open| !open.borrow().is_empty()) {
        ShardError::CannotPrepare.report();
    }
}

fn transaction_aborted() {
    abandon_all();
    POISONED.set(false);
}

fn abandon_all() {
    // Dropping the connections makes the servers roll the transactions back.
    OPEN.with(|open| open.borrow_mut().clear());
    NEWEST_WORK_SUBXACT.set(0);
}
