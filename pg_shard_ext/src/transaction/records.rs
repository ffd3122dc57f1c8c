//! Global transaction ids of two-phase commits decided on this node, and
//! their records in `pg_shard.remote_transaction`: written in the deciding
//! (local) transaction — for its own remote transactions (remote.rs) or a
//! coordinator's participants (coordinated.rs) —, made durable before
//! anything is prepared, deleted once finished, and read by the recovery
//! that ends what a crash left prepared.

use super::client::{connect, remote_error};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use std::cell::{Cell, RefCell};

thread_local! {
    // Numbers the global ids this backend hands out.
    static OPENED: Cell<u64> = const { Cell::new(0) };
    // Global ids whose COMMIT PREPARED succeeded: their records go in the
    // next transaction that records one.
    static FINISHED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    // The INSERT of a coordinator's commit records, planned once per
    // backend (a coordinator asks on every commit on several nodes);
    // PostgreSQL replans it by itself when the tables change.
    static RECORD_COORDINATED_PLAN: RefCell<Option<OwnedPreparedStatement>> = const { RefCell::new(None) };
}

/// `gid`'s COMMIT PREPARED succeeded: its record goes with the next one
/// this backend writes.
pub(super) fn finished(gid: String) {
    FINISHED.with(|f| f.borrow_mut().push(gid));
}

/// The global id of a remote transaction of this local transaction on
/// `node`, recorded in the local transaction: the record exists if and only
/// if the local transaction committed.
pub(crate) fn record_remote_transaction(node: &Node) -> Result<String> {
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
    let gid = next_gid();
    crate::spi::run_with_args(
        "INSERT INTO pg_shard.remote_transaction (gid, node_id) VALUES ($1, $2)",
        &[gid.as_str().into(), node.node_id.into()],
    )?;
    Ok(gid)
}

/// Global ids for a coordinator's participants on `node_ids`, recorded in
/// the local transaction with one statement (a coordinator asks for them
/// on every commit on several nodes). Errors when a node is not in the
/// cluster.
pub(crate) fn record_coordinated_transactions(node_ids: &[i32]) -> Result<Vec<String>> {
    const RECORD: &str = "WITH recorded AS (\
           INSERT INTO pg_shard.remote_transaction (gid, node_id) \
           SELECT g.gid, g.node_id \
             FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
                             pg_catalog.unnest($2::pg_catalog.int4[])) AS g(gid, node_id) \
            WHERE EXISTS (SELECT FROM pg_shard.node n WHERE n.node_id OPERATOR(pg_catalog.=) g.node_id) \
           RETURNING 1) \
         SELECT pg_catalog.count(*) FROM recorded";
    let gids: Vec<String> = node_ids.iter().map(|_| next_gid()).collect();
    let recorded = crate::metadata::catalog::as_extension_owner(|| {
        crate::spi::connect_mut(|client| -> Result<Option<i64>> {
            RECORD_COORDINATED_PLAN.with(|kept| {
                let mut kept = kept.borrow_mut();
                let plan = match kept.take() {
                    Some(plan) => plan,
                    None => client
                        .prepare_mut(
                            RECORD,
                            &[
                                PgOid::BuiltIn(PgBuiltInOids::TEXTARRAYOID),
                                PgOid::BuiltIn(PgBuiltInOids::INT4ARRAYOID),
                            ],
                        )?
                        .keep(),
                };
                let counted = client
                    .update(
                        &plan,
                        Some(1),
                        &[gids.clone().into(), node_ids.to_vec().into()],
                    )
                    .and_then(|mut rows| match rows.next() {
                        Some(row) => row.get::<i64>(1),
                        None => Ok(None),
                    });
                *kept = Some(plan);
                Ok(counted?)
            })
        })
    })?;
    if recorded != Some(gids.len() as i64) {
        return Err(ShardError::InvalidArgument(format!(
            "a node of {node_ids:?} is not in the cluster"
        )));
    }
    Ok(gids)
}

/// The next global id of this local transaction: the prefix, the local
/// transaction's id (assigned now), this backend's pid and a number.
fn next_gid() -> String {
    let number = OPENED.get() + 1;
    OPENED.set(number);
    // SAFETY: assigns (or reads) the top-level transaction id of this
    // backend's transaction; callers run inside one. MyProcPid is set at
    // backend start.
    let (xid, pid) = unsafe { (pg_sys::GetTopFullTransactionId().value, pg_sys::MyProcPid) };
    format!("{}{xid}_{pid}_{number}", gid_prefix())
}

/// What every global id of this server starts with: its system identifier
/// keeps them apart from another metadata node's on a shared worker.
#[pg_extern(schema = "pg_shard", stable, parallel_safe)]
pub(crate) fn gid_prefix() -> String {
    // SAFETY: reads the system identifier from the control file data in
    // shared memory (set at startup).
    let system = unsafe { pg_sys::GetSystemIdentifier() };
    // (As pg_control_system() shows it: a bigint.)
    format!("pg_shard_{}_", system as i64)
}

/// The recovery decides by the fate of the local transaction's id. Its WAL
/// must be durable before anything is prepared: after a crash that lost
/// it, the id would be handed out again, and a later transaction with the
/// same id committing would commit the prepared ones. And the local commit
/// must be durable before any remote one commits (under
/// synchronous_commit = off it would not be).
pub(crate) fn make_decision_durable() {
    // SAFETY: XactLastRecEnd is the end of this transaction's last WAL
    // record (it wrote one: its remote_transaction rows); flushing to it
    // errors only on an I/O failure, which aborts the transaction here,
    // before anything is prepared. ForceSyncCommit sets a flag.
    unsafe {
        if pg_sys::XactLastRecEnd != 0 {
            pg_sys::XLogFlush(pg_sys::XactLastRecEnd);
        }
        pg_sys::ForceSyncCommit();
    }
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
    let prefix = gid_prefix();
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
