//! Node-to-node connections from the extension (the `postgres` crate).
//!
//! As in Citus, a node is reached in the database of the same name as the
//! current database, as the current user, so several clusters can live side
//! by side in separate databases.
//!
//! Writes on other nodes happen in remote transactions tied to the local one
//! by two-phase commit: [`in_transaction`] opens (or reuses) a connection
//! running `BEGIN` and records the remote transaction's global id in
//! `pg_shard.remote_transaction` (part of the local transaction). In the
//! local pre-commit phase every remote transaction is prepared (`PREPARE
//! TRANSACTION`; a failure aborts the local transaction, and the prepared
//! ones are rolled back); once the local commit is durable they are
//! committed (`COMMIT PREPARED`). So the local commit decides: a remote
//! transaction left prepared by a crash is committed if its record exists,
//! rolled back otherwise ([`recover_prepared_transactions`], run when job
//! runners start and callable by hand).
//!
//! A rolled-back subtransaction (ROLLBACK TO SAVEPOINT, a PL/pgSQL exception
//! block, psql's ON_ERROR_ROLLBACK) that did remote work cannot be undone on
//! the workers alone: the remote transactions are rolled back and the local
//! transaction can only end in a rollback (its COMMIT fails).
//!
//! Workers need `max_prepared_transactions` above zero.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::spi::query_value;
use pgrx::prelude::*;
use pgrx::{
    register_subxact_callback, register_xact_callback, GucContext, GucFlags, GucRegistry,
    GucSetting, PgSubXactCallbackEvent, PgXactCallbackEvent,
};
use postgres::{Client, Config, NoTls};
use std::cell::{Cell, RefCell};
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
    let mut config = Config::new();
    config
        .host(host)
        .port(port_u16)
        .dbname(database.as_deref().unwrap_or("postgres"))
        .user(&user)
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
    /// Its global id for PREPARE TRANSACTION.
    gid: String,
    prepared: bool,
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
    // Numbers the remote transactions this backend opens (their global ids).
    static OPENED: Cell<u64> = const { Cell::new(0) };
    // Global ids whose COMMIT PREPARED succeeded: their records go in the
    // next transaction that opens a remote one.
    static FINISHED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Run `work` on `node` inside a remote transaction that commits or aborts
/// with the local one.
pub(crate) fn in_transaction<T>(
    node: &Node,
    work: impl FnOnce(&mut Client) -> Result<T>,
) -> Result<T> {
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
            let gid = record_remote_transaction(node)?;
            let first = OPEN.with(|open| {
                let mut open = open.borrow_mut();
                open.push(OpenTransaction {
                    node: node.clone(),
                    client,
                    gid,
                    prepared: false,
                });
                open.len() == 1
            });
            if first {
                register_xact_callback(PgXactCallbackEvent::PreCommit, prepare_all);
                register_xact_callback(PgXactCallbackEvent::Commit, commit_all);
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

/// The global id of a remote transaction of this local transaction on
/// `node`, recorded in the local transaction: the record exists if and only
/// if the local transaction committed.
fn record_remote_transaction(node: &Node) -> Result<String> {
    // (Any role's write to a reference table opens remote transactions.)
    crate::metadata::catalog::as_extension_owner(|| record_as_owner(node))
}

fn record_as_owner(node: &Node) -> Result<String> {
    let finished = FINISHED.with(|f| std::mem::take(&mut *f.borrow_mut()));
    if !finished.is_empty() {
        crate::spi::run_with_args(
            "DELETE FROM pg_shard.remote_transaction WHERE gid = ANY ($1)",
            &[finished.into()],
        )?;
    }
    let number = OPENED.get() + 1;
    OPENED.set(number);
    let gid = crate::metadata::catalog::write_returning::<String>(
        "INSERT INTO pg_shard.remote_transaction (gid, node_id) \
         SELECT format('%s%s_%s_%s', pg_shard.gid_prefix(), pg_catalog.txid_current(), \
                       pg_catalog.pg_backend_pid(), $2), $1 \
         RETURNING gid",
        &[node.node_id.into(), (number as i64).into()],
    )?;
    gid.ok_or_else(|| ShardError::InvalidArgument("no global transaction id".into()))
}

/// Pauses between the phases, for tests that crash a backend there
/// (superuser only; 0, the default, pauses nothing).
static PAUSE_AFTER_PREPARE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
static PAUSE_BEFORE_COMMIT_PREPARED_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

pub(crate) fn register_gucs() {
    for (name, description, setting) in [
        (
            c"pg_shard.test_pause_after_prepare",
            c"Milliseconds to pause once remote transactions are prepared, before the local commit (tests).",
            &PAUSE_AFTER_PREPARE_MS,
        ),
        (
            c"pg_shard.test_pause_before_commit_prepared",
            c"Milliseconds to pause after the local commit, before COMMIT PREPARED (tests).",
            &PAUSE_BEFORE_COMMIT_PREPARED_MS,
        ),
    ] {
        GucRegistry::define_int_guc(
            name,
            description,
            c"For tests that crash a backend between the two phases of a commit.",
            setting,
            0,
            600_000,
            GucContext::Suset,
            GucFlags::default(),
        );
    }
}

fn pause(setting: &GucSetting<i32>) {
    let ms = setting.get();
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms as u64));
    }
}

/// Pre-commit: every remote transaction is prepared; an error aborts the
/// local transaction (and [`transaction_aborted`] rolls the prepared ones
/// back).
fn prepare_all() {
    if POISONED.replace(false) {
        ShardError::SubtransactionRolledBack.report();
    }
    if OPEN.with(|open| !open.borrow().is_empty()) {
        // The recovery decides by the fate of this transaction's id. Its WAL
        // must be durable before anything is prepared: after a crash that
        // lost it, the id would be handed out again, and a later transaction
        // with the same id committing would commit these prepared ones.
        // And the local commit must be durable before any remote one
        // commits (under synchronous_commit = off it would not be).
        // SAFETY: XactLastRecEnd is the end of this transaction's last WAL
        // record (it wrote one: its remote_transaction rows); flushing to
        // it errors only on an I/O failure, which aborts the transaction
        // here, before anything is prepared. ForceSyncCommit sets a flag.
        unsafe {
            if pg_sys::XactLastRecEnd != 0 {
                pg_sys::XLogFlush(pg_sys::XactLastRecEnd);
            }
            pg_sys::ForceSyncCommit();
        }
    }
    let failure = OPEN.with(|open| {
        for transaction in open.borrow_mut().iter_mut() {
            let statement = format!(
                "PREPARE TRANSACTION {}",
                crate::quote::literal(&transaction.gid)
            );
            if let Err(e) = transaction.client.batch_execute(&statement) {
                return Some(remote_error(&transaction.node, &e));
            }
            transaction.prepared = true;
        }
        None
    });
    if let Some(error) = failure {
        error.report();
    }
    pause(&PAUSE_AFTER_PREPARE_MS);
}

/// After the local commit: the prepared transactions commit. A failure
/// (a node gone in between) leaves one prepared, for the recovery to commit;
/// the local transaction has committed, so it is only a warning.
fn commit_all() {
    let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    if !open.is_empty() {
        pause(&PAUSE_BEFORE_COMMIT_PREPARED_MS);
    }
    for mut transaction in open {
        let statement = format!(
            "COMMIT PREPARED {}",
            crate::quote::literal(&transaction.gid)
        );
        match transaction.client.batch_execute(&statement) {
            Ok(()) => FINISHED.with(|f| f.borrow_mut().push(transaction.gid)),
            // The recovery got to it first (and committed it: the local
            // commit is visible to it).
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_OBJECT) => {}
            Err(e) => pgrx::warning!(
                "pg_shard: {}; pg_shard.recover_prepared_transactions() commits it later",
                remote_error(&transaction.node, &e)
            ),
        }
    }
    NEWEST_WORK_SUBXACT.set(0);
}

/// A PREPARE TRANSACTION of the local transaction would leave the remote
/// ones without anyone to commit them (their commit follows the local
/// commit in this backend), so it is refused, as postgres_fdw does.
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
    // Dropping the connections makes the servers roll the open transactions
    // back; prepared ones are rolled back explicitly (or, failing that, by
    // the recovery: their record goes with the local transaction).
    let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    for mut transaction in open.into_iter().filter(|t| t.prepared) {
        let statement = format!(
            "ROLLBACK PREPARED {}",
            crate::quote::literal(&transaction.gid)
        );
        let _ = transaction.client.batch_execute(&statement);
    }
    NEWEST_WORK_SUBXACT.set(0);
}

/// Ends the remote transactions a crash left prepared (on every node): those
/// whose local transaction committed are committed, those whose local
/// transaction aborted (or is too old to tell) are rolled back; records of
/// finished ones are deleted. Returns how many it ended.
#[pg_extern(schema = "pg_shard", volatile)]
fn recover_prepared_transactions() -> i64 {
    use crate::error::OrReport;
    recover().or_report()
}

pub(crate) fn recover() -> Result<i64> {
    let prefix = query_value::<String>("SELECT pg_shard.gid_prefix()")?.unwrap_or_default();
    let mut ended = 0;
    let mut still_prepared: Vec<String> = Vec::new();
    // The records of a node that cannot be asked are kept: the decision for
    // its prepared transactions rests on them (txid_status forgets).
    let mut unreached: Vec<i32> = Vec::new();
    for node in crate::metadata::catalog::all_nodes()? {
        let mut client = match connect(&node.host, node.port) {
            Ok(client) => client,
            Err(e) => {
                pgrx::warning!("pg_shard: recovery skips a node: {e}");
                unreached.push(node.node_id);
                continue;
            }
        };
        let prepared = client
            .query(
                "SELECT gid FROM pg_catalog.pg_prepared_xacts \
                 WHERE database = current_database() AND starts_with(gid, $1)",
                &[&prefix],
            )
            .map_err(|e| remote_error(&node, &e))?;
        for row in prepared {
            let gid: String = row.get(0);
            let Some(xid) = gid
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split('_').next())
                .and_then(|xid| xid.parse::<i64>().ok())
            else {
                continue;
            };
            let recorded = crate::spi::query_one::<bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_shard.remote_transaction WHERE gid = $1)",
                &[gid.as_str().into()],
            )?
            .unwrap_or(false);
            let status = crate::spi::query_one::<String>(
                "SELECT pg_catalog.txid_status($1)",
                &[xid.into()],
            )?;
            let decision = match (recorded, status.as_deref()) {
                (true, _) | (false, Some("committed")) => "COMMIT PREPARED",
                (false, Some("in progress")) => {
                    still_prepared.push(gid);
                    continue;
                }
                _ => "ROLLBACK PREPARED",
            };
            match client.batch_execute(&format!("{decision} {}", crate::quote::literal(&gid))) {
                Ok(()) => ended += 1,
                Err(e) => {
                    // (Another session may be ending it right now.)
                    pgrx::warning!("pg_shard: recovery: {}", remote_error(&node, &e));
                    still_prepared.push(gid);
                }
            }
        }
    }
    crate::spi::run_with_args(
        "DELETE FROM pg_shard.remote_transaction WHERE gid <> ALL ($1) AND node_id <> ALL ($2)",
        &[still_prepared.into(), unreached.into()],
    )?;
    Ok(ended)
}
