//! TRUNCATE of distributed tables: every shard table is emptied in the
//! remote transactions of the local one, so all of them are or none is
//! (postgres_fdw would truncate the foreign partitions in transactions of
//! its own, which commit one by one). The metadata node's partitioned
//! table holds no rows; it only gets the lock and, with RESTART IDENTITY,
//! its sequences restarted. Reference tables truncate themselves: their
//! TRUNCATE trigger empties every copy the same way.

use super::{shard_tables, Local, LogicalTable, Planned};
use crate::catalog::query_one;
use crate::catalog::Node;
use crate::error::{Result, ShardError};
use crate::remote::{in_transaction, remote_error};
use pgrx::prelude::*;

/// # Safety
/// `pstmt` is the planned statement and `truncate` its TruncateStmt.
pub(super) unsafe fn plan(
    pstmt: *mut pg_sys::PlannedStmt,
    truncate: *mut pg_sys::TruncateStmt,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's nodes; the list holds RangeVars.
    let (relations, restart, cascade) = unsafe {
        (
            pgrx::PgList::<pg_sys::RangeVar>::from_pg((*truncate).relations),
            (*truncate).restart_seqs,
            (*truncate).behavior == pg_sys::DropBehavior::DROP_CASCADE,
        )
    };
    let mut distributed = Vec::new();
    let mut kept = Vec::new();
    for (position, relation) in relations.iter_ptr().enumerate() {
        // SAFETY: a RangeVar of the statement.
        match unsafe { LogicalTable::named(relation)? } {
            Some(table) if table.is_distributed() => distributed.push(table),
            _ => kept.push(position),
        }
    }
    if distributed.is_empty() {
        return Ok(None);
    }
    let mut sequences = Vec::new();
    for table in &distributed {
        let allowed = query_one::<bool>(
            "SELECT has_table_privilege($1, 'TRUNCATE')",
            &[table.relid.into()],
        )?
        .unwrap_or(false);
        if !allowed {
            return Err(ShardError::PermissionDenied(format!(
                "permission denied for table {}",
                table.display
            )));
        }
        table.refuse_during_job()?;
        table.lock(pg_sys::AccessExclusiveLock);
        if restart {
            sequences.extend(owned_sequences(table.relid)?);
        }
    }
    let local = if kept.is_empty() {
        Local::Skip
    } else {
        // SAFETY: a deep copy of the planned statement, in the current
        // memory context; its TruncateStmt's list is rebuilt from its own
        // RangeVars.
        unsafe {
            let (copy, statement) = super::copy_statement::<pg_sys::TruncateStmt>(pstmt);
            let all = pgrx::PgList::<pg_sys::RangeVar>::from_pg((*statement).relations);
            let mut remaining = pgrx::PgList::<pg_sys::RangeVar>::new();
            for position in &kept {
                if let Some(relation) = all.get_ptr(*position) {
                    remaining.push(relation);
                }
            }
            (*statement).relations = remaining.into_pg();
            Local::Replace(copy)
        }
    };
    Ok(Some(Planned::new(local, move || {
        for sequence in sequences {
            Spi::run(&format!("ALTER SEQUENCE {sequence} RESTART"))?;
        }
        // One TRUNCATE per node: shard tables with foreign keys among
        // them can only be emptied together.
        let mut by_node: Vec<(Node, Vec<String>)> = Vec::new();
        for table in &distributed {
            for shard in shard_tables(table.relid)? {
                match by_node
                    .iter_mut()
                    .find(|(n, _)| n.node_id == shard.node.node_id)
                {
                    Some((_, tables)) => tables.push(shard.qualified),
                    None => by_node.push((shard.node, vec![shard.qualified])),
                }
            }
        }
        for (node, tables) in by_node {
            let statement = format!(
                "TRUNCATE {}{}",
                tables.join(", "),
                if cascade { " CASCADE" } else { "" }
            );
            in_transaction(&node, |client| {
                client
                    .batch_execute(&statement)
                    .map_err(|e| remote_error(&node, &e))
            })?;
        }
        Ok(())
    })))
}

/// The sequences owned by columns of `relid` (serial columns).
fn owned_sequences(relid: pg_sys::Oid) -> Result<Vec<String>> {
    Spi::connect(|client| {
        let mut sequences = Vec::new();
        for row in client.select(
            "SELECT d.objid::regclass::text FROM pg_depend d \
             JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' \
             WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass \
               AND d.refobjid = $1 AND d.deptype = 'a'",
            None,
            &[relid.into()],
        )? {
            sequences.push(row.get::<String>(1)?.unwrap_or_default());
        }
        Ok(sequences)
    })
}
