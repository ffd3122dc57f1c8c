//! Two-phase commit run by a coordinator (coordinator/, the front door)
//! for a client transaction that wrote on several nodes. The coordinator
//! opens a transaction on the metadata node (or uses the client's own
//! transaction there) and calls [`coordinated_commit_gids`] in it: the
//! participants' global ids are recorded in `pg_shard.remote_transaction`
//! as for this node's own remote transactions, in the same format, so the
//! commit of that transaction is the decision and
//! `pg_shard.recover_prepared_transactions()` ends whatever a crash leaves
//! prepared (a record: commit; none: roll back). The coordinator then
//! prepares each participant under its id, commits the deciding
//! transaction, and commits the prepared ones.

use super::records::{make_decision_durable, record_coordinated_transactions};
use crate::error::{OrReport, Result, ShardError};
use pgrx::prelude::*;

/// Global transaction ids for a coordinator's participants on `node_ids`
/// (one per element, in order), recorded in the calling transaction and
/// made durable before they are returned: the caller may PREPARE
/// TRANSACTION under them at once. Any role may call it (a coordinator
/// connects as the client's role); it records only ids of the caller's own
/// transaction.
#[pg_extern(schema = "pg_shard", volatile)]
fn coordinated_commit_gids(node_ids: Vec<i32>) -> Vec<String> {
    gids_for(&node_ids).or_report()
}

fn gids_for(node_ids: &[i32]) -> Result<Vec<String>> {
    // SAFETY: reads the transaction state of this backend.
    if !unsafe { pg_sys::IsTransactionBlock() } {
        // Recorded in a transaction of its own, the ids would be committed
        // before anything is prepared: a crash between two PREPAREs would
        // then commit one participant alone.
        return Err(ShardError::DecisionOutsideTransaction);
    }
    let gids = record_coordinated_transactions(node_ids)?;
    if !gids.is_empty() {
        make_decision_durable();
    }
    Ok(gids)
}
