//! TRUNCATE of distributed tables: every shard table is emptied in the
//! remote transactions of the local one, so all of them are or none is
//! (postgres_fdw would truncate the foreign partitions in transactions of
//! its own, which commit one by one). The metadata node's partitioned
//! table holds no rows; it only gets the lock and, with RESTART IDENTITY,
//! its sequences restarted. Reference tables truncate themselves: their
//! TRUNCATE trigger empties every copy the same way.

use super::parse::logical_table_named;
use super::plan::{Local, Planned};
use crate::error::{Result, ShardError};
use crate::spi::query_one;
use crate::transaction::remote::run_in_transaction;
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
        match unsafe { logical_table_named(relation)? } {
            Some(table) if table.is_distributed() => distributed.push(table),
            _ => kept.push(position),
        }
    }
    if distributed.is_empty() {
        return Ok(None);
    }
    // A table's lookups are emptied with it (with CASCADE, those of the
    // tables whose foreign keys reference it too); a lookup table only so.
    let mut emptied: Vec<pg_sys::Oid> = distributed.iter().map(|t| t.relid).collect();
    if cascade {
        emptied = referencing_tables(&emptied)?;
    }
    let mut lookup_tables = Vec::new();
    for relid in &emptied {
        lookup_tables.extend(
            crate::lookups::catalog::lookups_of(*relid)?
                .into_iter()
                .map(|l| l.lookup_rel),
        );
    }
    for table in &distributed {
        if crate::lookups::catalog::is_lookup_table(table.relid)?
            && !lookup_tables.contains(&table.relid)
        {
            return Err(table.refuse("it is a lookup table: TRUNCATE the table it looks up"));
        }
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
            for (sequence, _) in crate::metadata::catalog::owned_sequences(table.relid)? {
                // As PostgreSQL asks: the sequences' owner may restart them.
                let owner = query_one::<bool>(
                    "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass",
                    &[sequence.as_str().into()],
                )?
                .unwrap_or(false);
                if !owner {
                    return Err(ShardError::PermissionDenied(format!(
                        "must be owner of sequence {sequence}"
                    )));
                }
                sequences.push(sequence);
            }
        }
    }
    let local = if kept.is_empty() {
        Local::Skip
    } else {
        // SAFETY: a deep copy of the planned statement, in the current
        // memory context; its TruncateStmt's list is rebuilt from its own
        // RangeVars.
        unsafe {
            let (copy, statement) = super::parse::copy_statement::<pg_sys::TruncateStmt>(pstmt);
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
            crate::spi::run(&format!("ALTER SEQUENCE {sequence} RESTART"))?;
        }
        // One TRUNCATE per node: shard tables with foreign keys among
        // them can only be emptied together.
        let mut relids: Vec<pg_sys::Oid> = distributed.iter().map(|t| t.relid).collect();
        relids.extend(
            lookup_tables
                .iter()
                .filter(|l| !relids.contains(l))
                .collect::<Vec<_>>(),
        );
        for (node, shards) in crate::metadata::catalog::shards_by_node(Some(&relids))?.into_values()
        {
            let tables: Vec<String> = shards.into_iter().map(|(_, name)| name).collect();
            let statement = format!(
                "TRUNCATE {}{}",
                tables.join(", "),
                if cascade { " CASCADE" } else { "" }
            );
            run_in_transaction(&node, &statement)?;
        }
        Ok(())
    })))
}

/// `tables` and every distributed table whose foreign keys reference one
/// of them, directly or through others (what TRUNCATE … CASCADE empties).
fn referencing_tables(tables: &[pg_sys::Oid]) -> Result<Vec<pg_sys::Oid>> {
    Ok(query_one::<Vec<pg_sys::Oid>>(
        "WITH RECURSIVE reached(relid) AS ( \
             SELECT unnest($1::oid[]) \
           UNION \
             SELECT c.table_rel::oid FROM pg_shard.table_constraint c \
             JOIN reached r ON c.referenced_rel = r.relid WHERE c.kind = 'f') \
         SELECT array_agg(relid) FROM reached",
        &[tables.to_vec().into()],
    )?
    .unwrap_or_default())
}
