//! Remote transactions: the local transaction's work on other nodes, over
//! one [`NodeConnection`] per node for the life of the local transaction
//! (every statement on a node sees the ones before it).
//!
//! A node's transaction opens on first use (`BEGIN`, at the local
//! transaction's isolation level). How they end depends on what wrote:
//! * nothing wrote on a node: every node's transaction just commits;
//! * one node wrote, and the local transaction wrote nothing: that node's
//!   transaction commits in the local pre-commit phase (one phase; if it
//!   fails, the local transaction aborts);
//! * otherwise, two-phase commit: in the local pre-commit phase each
//!   writing node's global id is recorded in `pg_shard.remote_transaction`
//!   (part of the local transaction) and its transaction prepared
//!   (`PREPARE TRANSACTION`; a failure aborts the local transaction, and
//!   the prepared ones are rolled back); once the local commit is durable
//!   they are committed (`COMMIT PREPARED`). So the local commit decides: a
//!   remote transaction left prepared by a crash is committed if its record
//!   exists, rolled back otherwise (`records::recover`, run
//!   when job runners start and callable by hand).
//!
//! Connections outlive transactions: an idle one goes back to a small
//! per-backend cache (one per node and role, [`IDLE_LIMIT`] in all).
//!
//! Subtransactions (SAVEPOINT, a PL/pgSQL exception block, psql's
//! ON_ERROR_ROLLBACK) have their remote savepoints, as in postgres_fdw:
//! before work on a node inside a subtransaction, the node's transaction
//! gets a savepoint for each level it lacks; when the subtransaction
//! commits they are released, when it rolls back the nodes roll back to
//! them. A node whose connection was lost meanwhile (an interrupted
//! statement) cannot roll back to a savepoint: then every remote
//! transaction is rolled back and, if any of them wrote, the local
//! transaction can only end in a rollback (its COMMIT fails).
//!
//! Workers need `max_prepared_transactions` above zero.

use super::connection::NodeConnection;
use super::records::{self, make_decision_durable, record_remote_transaction};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use pgrx::prelude::*;
use pgrx::{
    register_subxact_callback, register_xact_callback, GucContext, GucFlags, GucRegistry,
    GucSetting, PgSubXactCallbackEvent, PgXactCallbackEvent,
};
use std::cell::{Cell, RefCell};
use std::time::Duration;

/// Idle connections a backend keeps for later transactions.
const IDLE_LIMIT: usize = 16;

struct OpenTransaction {
    connection: NodeConnection,
    /// The role it acts as (connections are per role).
    user: String,
    /// Whether anything on the node changed: only writers take part in the
    /// commit decision.
    wrote: bool,
    /// Its global id, once recorded for PREPARE TRANSACTION.
    gid: Option<String>,
    prepared: bool,
    /// The local subtransaction nesting level it has savepoints up to (1:
    /// none, the top level).
    depth: i32,
}

impl OpenTransaction {
    /// Savepoints for the levels of the local transaction it lacks, before
    /// work at the current level.
    fn add_savepoints(&mut self) -> Result<()> {
        let level = nest_level();
        if self.depth >= level {
            return Ok(());
        }
        let statements: Vec<String> = (self.depth + 1..=level)
            .map(|l| format!("SAVEPOINT {}", savepoint_name(l)))
            .collect();
        self.connection.execute(&statements.join("; "))?;
        self.depth = level;
        Ok(())
    }
}

/// The local transaction's nesting level (1 at the top).
fn nest_level() -> i32 {
    // SAFETY: reads the transaction state; no side effects.
    unsafe { pg_sys::GetCurrentTransactionNestLevel() }
}

fn savepoint_name(level: i32) -> String {
    format!("pg_shard_{level}")
}

/// The local transaction's connections taken out for a piece of work: put
/// back when it ends, or, if it is interrupted (unwinding), dropped (their
/// queries cancelled), and their loss noted.
struct Taken(Vec<OpenTransaction>);

impl Drop for Taken {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        if std::thread::panicking() {
            LOST.set(true);
            if self.0.iter().any(|t| t.wrote) {
                LOST_WRITER.set(true);
            }
            return;
        }
        let taken = std::mem::take(&mut self.0);
        OPEN.with(|open| open.borrow_mut().extend(taken));
    }
}

/// What a piece of remote work does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

thread_local! {
    // Backends are single-threaded; this holds the remote transactions of the
    // current local transaction.
    static OPEN: RefCell<Vec<OpenTransaction>> = const { RefCell::new(Vec::new()) };
    // Connections outside any transaction, with the role they act as.
    static IDLE: RefCell<Vec<(String, NodeConnection)>> = const { RefCell::new(Vec::new()) };
    // Set when a remote transaction's connection was lost during work (its
    // savepoints with it), and when that one had written.
    static LOST: Cell<bool> = const { Cell::new(false) };
    static LOST_WRITER: Cell<bool> = const { Cell::new(false) };
    // Set when a rolled-back subtransaction lost remote writes; the local
    // transaction may then only roll back.
    static POISONED: Cell<bool> = const { Cell::new(false) };
    // Whether the transaction callbacks are registered for the local
    // transaction: once only, though its remote transactions may all end
    // and new ones open (pgrx runs a callback once per registration).
    static HOOKED: Cell<bool> = const { Cell::new(false) };
}

/// Run `work` on `node` inside a remote transaction that commits or aborts
/// with the local one; `work` changes the node.
pub(crate) fn in_transaction<T>(
    node: &Node,
    work: impl FnOnce(&mut NodeConnection) -> Result<T>,
) -> Result<T> {
    with_transaction(node, Access::Write, work)
}

/// Run a script of statements on `node` inside a remote transaction that
/// commits or aborts with the local one; a failure there is the node's.
pub(crate) fn run_in_transaction(node: &Node, script: &str) -> Result<()> {
    in_transaction(node, |client| {
        client
            .execute(script)
            .map(|_| ())
            .map_err(ShardError::into_node_failure)
    })
}

/// One script per node of the statements in `pieces`, in their order, the
/// nodes in the order they first appear.
pub(crate) fn scripts_by_node<S: AsRef<str>>(
    pieces: impl IntoIterator<Item = (Node, S)>,
) -> Vec<(Node, String)> {
    let mut by_node: Vec<(Node, String)> = Vec::new();
    for (node, piece) in pieces {
        let piece = piece.as_ref();
        if piece.is_empty() {
            continue;
        }
        match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, script)) => {
                script.push_str(";\n");
                script.push_str(piece);
            }
            None => by_node.push((node, piece.to_owned())),
        }
    }
    by_node
}

/// Run a script on each of several nodes (distinct servers) inside their
/// remote transactions, every node at once; a failure there is the node's.
pub(crate) fn run_in_transactions(scripts: &[(Node, String)]) -> Result<()> {
    let nodes: Vec<Node> = scripts.iter().map(|(node, _)| node.clone()).collect();
    with_declared_transactions(&nodes, Access::Write, None, |connections| {
        for (connection, (_, script)) in connections.iter_mut().zip(scripts) {
            connection
                .send_statements(script)
                .map_err(ShardError::into_node_failure)?;
        }
        // Every node's results are read (each connection is ready for the
        // transaction's end) before the first error is returned.
        let mut first_error = None;
        for connection in connections.iter_mut() {
            if let Err(e) = connection.receive_rows(|_| Ok(())) {
                first_error.get_or_insert(e.into_node_failure());
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

/// Run `work` on `node` inside the local transaction's remote transaction
/// there (opened now if there is none), doing `access`.
pub(crate) fn with_transaction<T>(
    node: &Node,
    access: Access,
    work: impl FnOnce(&mut NodeConnection) -> Result<T>,
) -> Result<T> {
    with_declared_transaction(node, access, None, work)
}

/// [`with_transaction`], declaring map `version` to the node when the
/// remote transaction opens now (in the same round trip as its BEGIN).
pub(crate) fn with_declared_transaction<T>(
    node: &Node,
    access: Access,
    version: Option<i64>,
    work: impl FnOnce(&mut NodeConnection) -> Result<T>,
) -> Result<T> {
    with_declared_transactions(std::slice::from_ref(node), access, version, |connections| {
        work(&mut *connections[0])
    })
}

/// [`with_declared_transaction`] on several nodes at once: the local
/// transaction's connection to each of `nodes` (distinct servers), in
/// their order, so that `work` can keep them all busy together.
pub(crate) fn with_declared_transactions<T>(
    nodes: &[Node],
    access: Access,
    version: Option<i64>,
    work: impl FnOnce(&mut [&mut NodeConnection]) -> Result<T>,
) -> Result<T> {
    for node in nodes {
        if !has_transaction_on(node) {
            open_transaction(node, version)?;
        }
    }
    // Take the connections out while `work` runs so it may itself use SPI
    // or open connections to other nodes. If `work` is interrupted, the
    // connections are dropped (their queries cancelled) and the local
    // transaction aborts.
    let mut taken = Taken(OPEN.with(|open| {
        let mut open = open.borrow_mut();
        nodes
            .iter()
            .filter_map(|node| {
                let position = open
                    .iter()
                    .position(|t| t.connection.node().same_server(node))?;
                Some(open.remove(position))
            })
            .collect()
    }));
    if taken.0.len() != nodes.len() {
        return Err(ShardError::Internal(
            "a remote transaction to run work in was not open".into(),
        ));
    }
    for transaction in &mut taken.0 {
        transaction.add_savepoints()?;
        if access == Access::Write {
            transaction.wrote = true;
        }
    }
    let mut connections: Vec<&mut NodeConnection> =
        taken.0.iter_mut().map(|t| &mut t.connection).collect();
    work(&mut connections)
}

/// Whether the local transaction has no remote transaction: a statement
/// that starts so and fails on a node may roll back what it began there
/// and run again ([`roll_back_statement`]).
pub(crate) fn none_open() -> bool {
    OPEN.with(|open| open.borrow().is_empty())
}

/// Rolls back every remote transaction, all of which the current statement
/// opened (it started with [`none_open`]), keeping their connections: the
/// statement runs again from scratch.
pub(crate) fn roll_back_statement() {
    abandon_all();
}

/// Whether the local transaction has a remote transaction on `node`.
pub(crate) fn has_transaction_on(node: &Node) -> bool {
    OPEN.with(|open| {
        open.borrow()
            .iter()
            .any(|t| t.connection.node().same_server(node))
    })
}

/// Run `work` on `node` outside any remote transaction: each statement
/// commits on its own there (a single autocommit statement of the router,
/// which needs no BEGIN and COMMIT round trips). The connection comes from
/// the cache and goes back to it.
pub(crate) fn autocommit<T>(
    node: &Node,
    work: impl FnOnce(&mut NodeConnection) -> Result<T>,
) -> Result<T> {
    autocommit_each(std::slice::from_ref(node), |connections| {
        work(&mut connections[0])
    })
}

/// [`autocommit`] on several nodes at once: one connection to each of
/// `nodes`, in their order.
pub(crate) fn autocommit_each<T>(
    nodes: &[Node],
    work: impl FnOnce(&mut [NodeConnection]) -> Result<T>,
) -> Result<T> {
    let user = crate::metadata::catalog::acting_user()?;
    let mut connections = Vec::with_capacity(nodes.len());
    for node in nodes {
        connections.push(match take_idle(node, &user) {
            Some(connection) => connection,
            None => NodeConnection::open(node)?,
        });
    }
    let result = work(&mut connections);
    for connection in connections {
        // (A connection left busy by an error is dropped: its query is
        // cancelled.)
        if connection.is_idle() {
            put_idle(user.clone(), connection);
        }
    }
    result
}

fn take_idle(node: &Node, user: &str) -> Option<NodeConnection> {
    let cached = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        idle.iter()
            .position(|(u, c)| u == user && c.node().same_server(node))
            .map(|i| idle.remove(i).1)
    });
    // (A node added again under a new id keeps its server; one restarted
    // since closed the connection.)
    cached
        .filter(|c| c.node() == node)
        .and_then(|mut c| c.still_open().then_some(c))
}

fn put_idle(user: String, connection: NodeConnection) {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        if idle.len() >= IDLE_LIMIT {
            idle.remove(0);
        }
        idle.push((user, connection));
    });
}

/// A remote transaction on `node`: a cached connection or a new one, and
/// `BEGIN` at the local isolation level, added to OPEN.
fn open_transaction(node: &Node, version: Option<i64>) -> Result<()> {
    let user = crate::metadata::catalog::acting_user()?;
    let cached = take_idle(node, &user);
    let begin = |mut connection: NodeConnection| -> Result<NodeConnection> {
        connection.begin(begin_statement(), version)?;
        Ok(connection)
    };
    let connection = match cached.map(begin) {
        Some(Ok(connection)) => connection,
        // The node restarted since, or dropped the session: a new one.
        _ => begin(NodeConnection::open(node)?).map_err(ShardError::into_node_failure)?,
    };
    OPEN.with(|open| {
        open.borrow_mut().push(OpenTransaction {
            connection,
            user,
            wrote: false,
            gid: None,
            prepared: false,
            depth: 1,
        })
    });
    if !HOOKED.replace(true) {
        register_xact_callback(PgXactCallbackEvent::PreCommit, pre_commit);
        register_xact_callback(PgXactCallbackEvent::Commit, commit_all);
        register_xact_callback(PgXactCallbackEvent::PrePrepare, refuse_prepare);
        register_xact_callback(PgXactCallbackEvent::Abort, transaction_aborted);
        register_subxact_callback(PgSubXactCallbackEvent::AbortSub, subtransaction_aborted);
        register_subxact_callback(
            PgSubXactCallbackEvent::PreCommitSub,
            subtransaction_committing,
        );
    }
    Ok(())
}

/// `BEGIN` at the local transaction's isolation level, so a READ COMMITTED
/// statement waits for a concurrent update as it would on one server.
fn begin_statement() -> &'static str {
    // SAFETY: reads the current transaction's isolation level.
    let level = unsafe { pg_sys::XactIsoLevel } as u32;
    match level {
        pg_sys::XACT_SERIALIZABLE => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        pg_sys::XACT_REPEATABLE_READ => "BEGIN ISOLATION LEVEL REPEATABLE READ",
        _ => "BEGIN ISOLATION LEVEL READ COMMITTED",
    }
}

/// A subtransaction commits: the savepoints of its level are released.
fn subtransaction_committing(_sub: pg_sys::SubTransactionId, _parent: pg_sys::SubTransactionId) {
    let level = nest_level();
    let released = OPEN.with(|open| {
        let mut open = open.borrow_mut();
        open.iter_mut()
            .filter(|t| t.depth >= level)
            .try_for_each(|t| {
                t.connection
                    .execute(&format!("RELEASE SAVEPOINT {}", savepoint_name(level)))?;
                t.depth = level - 1;
                Ok::<_, ShardError>(())
            })
    });
    if let Err(error) = released {
        error.into_node_failure().report();
    }
}

/// A subtransaction rolls back: so do the nodes, to its savepoints. A node
/// that cannot (its connection lost) loses its transaction; then all are
/// rolled back, and if one of them had written, the local transaction can
/// only roll back.
fn subtransaction_aborted(_sub: pg_sys::SubTransactionId, _parent: pg_sys::SubTransactionId) {
    let level = nest_level();
    let mut lost_writer = LOST_WRITER.replace(false);
    let mut lost = LOST.replace(false);
    if !lost {
        let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
        let mut kept = Vec::with_capacity(open.len());
        for mut transaction in open {
            if transaction.depth >= level {
                let name = savepoint_name(level);
                let rolled_back = !transaction.connection.is_busy()
                    && transaction
                        .connection
                        .execute(&format!(
                            "ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}"
                        ))
                        .is_ok();
                if !rolled_back {
                    lost = true;
                    lost_writer |= transaction.wrote;
                    continue;
                }
                transaction.depth = level - 1;
            }
            kept.push(transaction);
        }
        OPEN.with(|o| *o.borrow_mut() = kept);
    }
    if lost {
        let wrote = lost_writer || OPEN.with(|open| open.borrow().iter().any(|t| t.wrote));
        abandon_all();
        // Reads only: later statements read in new remote transactions.
        if wrote {
            POISONED.set(true);
        }
    }
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

/// Pre-commit: the commit decision (see the module comment). An error
/// aborts the local transaction (and [`transaction_aborted`] rolls back
/// what was prepared).
fn pre_commit() {
    if POISONED.replace(false) {
        ShardError::SubtransactionRolledBack.report();
    }
    if let Err(error) = decide() {
        error.report();
    }
}

fn decide() -> Result<()> {
    let writers = OPEN.with(|open| open.borrow().iter().filter(|t| t.wrote).count());
    // SAFETY: reads whether the local transaction has an id (it wrote).
    let local_wrote = unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId;
    if writers == 0 {
        return Ok(());
    }
    if writers == 1 && !local_wrote {
        let mut open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
        let result = open
            .iter_mut()
            .find(|t| t.wrote)
            .map_or(Ok(()), |t| t.connection.commit());
        // The writer has committed (or failed, and aborted); the readers
        // commit after the local commit, or roll back with it.
        for transaction in open.iter_mut().filter(|t| t.wrote) {
            transaction.wrote = false;
        }
        let (done, rest): (Vec<_>, Vec<_>) = open.into_iter().partition(|t| t.connection.is_idle());
        for transaction in done {
            keep_idle(transaction);
        }
        OPEN.with(|o| *o.borrow_mut() = rest);
        return result.map_err(ShardError::into_node_failure);
    }
    let mut open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    let result = prepare_writers(&mut open);
    OPEN.with(|o| *o.borrow_mut() = open);
    result?;
    pause(&PAUSE_AFTER_PREPARE_MS);
    Ok(())
}

fn prepare_writers(open: &mut [OpenTransaction]) -> Result<()> {
    // The pre-commit phase runs without a snapshot; the records' SPI
    // writes need one.
    // SAFETY: pushed here and popped below, on success and on error.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let recorded = open
        .iter_mut()
        .filter(|t| t.wrote)
        .try_for_each(|transaction| {
            transaction.gid = Some(record_remote_transaction(transaction.connection.node())?);
            Ok::<_, ShardError>(())
        });
    // SAFETY: the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    recorded?;
    make_decision_durable();
    for transaction in open.iter_mut().filter(|t| t.wrote) {
        let gid = transaction.gid.clone().unwrap_or_default();
        transaction
            .connection
            .execute(&format!(
                "PREPARE TRANSACTION {}",
                crate::quote::literal(&gid)
            ))
            .map_err(ShardError::into_node_failure)?;
        transaction.prepared = true;
    }
    Ok(())
}

/// After the local commit: the prepared transactions commit, and the
/// readers. A failure (a node gone in between) leaves one prepared, for the
/// recovery to commit; the local transaction has committed, so it is only a
/// warning.
fn commit_all() {
    HOOKED.set(false);
    LOST.set(false);
    LOST_WRITER.set(false);
    let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    if open.iter().any(|t| t.prepared) {
        pause(&PAUSE_BEFORE_COMMIT_PREPARED_MS);
    }
    for mut transaction in open {
        let statement = match &transaction.gid {
            Some(gid) if transaction.prepared => {
                format!("COMMIT PREPARED {}", crate::quote::literal(gid))
            }
            _ => "COMMIT".to_string(),
        };
        let done = if transaction.prepared {
            transaction.connection.execute(&statement).map(|_| ())
        } else {
            transaction.connection.commit()
        };
        match done {
            Ok(_) => {
                if let (Some(gid), true) = (transaction.gid.take(), transaction.prepared) {
                    records::finished(gid);
                }
                keep_idle(transaction);
            }
            // The recovery got to it first (and committed it: the local
            // commit is visible to it).
            Err(e) if super::connection::is_sqlstate(&e, "42704") => keep_idle(transaction),
            Err(e) if transaction.prepared => pgrx::warning!(
                "pg_shard: {}; pg_shard.recover_prepared_transactions() commits it later",
                e.into_node_failure()
            ),
            Err(e) => pgrx::warning!("pg_shard: {}", e.into_node_failure()),
        }
    }
}

/// Back to the cache, if the node's session is outside any transaction.
fn keep_idle(transaction: OpenTransaction) {
    if transaction.connection.is_idle() {
        put_idle(transaction.user, transaction.connection);
    }
}

/// A PREPARE TRANSACTION of the local transaction would leave the remote
/// ones without anyone to commit them (their commit follows the local
/// commit in this backend), so it is refused, as postgres_fdw does.
fn refuse_prepare() {
    if OPEN.with(|open| open.borrow().iter().any(|t| t.wrote)) {
        ShardError::CannotPrepare.report();
    }
}

fn transaction_aborted() {
    HOOKED.set(false);
    abandon_all();
    POISONED.set(false);
    LOST.set(false);
    LOST_WRITER.set(false);
}

fn abandon_all() {
    // Prepared ones are rolled back explicitly (or, failing that, by the
    // recovery: their record goes with the local transaction); open ones
    // roll back, and a connection still busy is dropped (which cancels
    // its query and makes the node roll back).
    let open = OPEN.with(|open| std::mem::take(&mut *open.borrow_mut()));
    for mut transaction in open {
        let statement = match &transaction.gid {
            Some(gid) if transaction.prepared => {
                format!("ROLLBACK PREPARED {}", crate::quote::literal(gid))
            }
            _ if transaction.connection.is_busy() => continue,
            _ => "ROLLBACK".to_string(),
        };
        if transaction.connection.execute(&statement).is_ok() {
            keep_idle(transaction);
        }
    }
}
