//! The multi-shard DML class: an UPDATE or DELETE of a distributed table
//! that does not come down to one shard group, an INSERT … SELECT between
//! co-located tables that keeps the distribution column, or a multi-row
//! INSERT … VALUES, runs as one statement per shard group, all of a node's
//! in one round trip and every node at once
//! ([`crate::executor::modify_scan`]), in the local transaction's remote
//! transactions (so several writing nodes commit by two-phase commit).
//!
//! Each shard group's statement is the statement itself on that group's
//! shards, which holds when every row it changes and every row it reads
//! lie in the same shard group:
//! * UPDATE/DELETE: the other distributed tables it reads (in FROM/USING,
//!   subqueries, sublinks) are co-located and tied to the target by
//!   equalities of distribution columns, as for the pushdown class
//!   ([`super::pushdown`]), and an UPDATE leaves the distribution column
//!   alone (a row would have to move to another shard);
//! * INSERT … SELECT: the SELECT is separable and runs whole per shard
//!   group, and the value it inserts into the distribution column is the
//!   SELECT's own distribution column, of a type that hashes alike;
//! * a multi-row INSERT … VALUES whose keys are constants: each group's
//!   statement inserts the group's rows ([`super::insert_values`]).
//!
//! Reference tables may appear anywhere. What does not qualify takes the
//! postgres_fdw path.

use super::partition_key::{only_from_entry, partition_key, range_table_entry};
use super::pushdown::{
    across_shard_groups, node_tasks, shard_group_targets, AcrossShardGroups, Grouping,
};
use super::router::client_statement;
use super::separable::{is_distributed_entry, separable_from, separable_subquery};
use crate::error::Result;
use crate::executor::modify_scan::ModifyPlan;
use pgrx::prelude::*;
use pgrx::PgList;
use std::collections::HashSet;

/// The multi-shard DML plan of `parse`, or None when it does not qualify.
///
/// # Safety
/// `parse` is the tree about to be planned; it is not modified.
pub(super) unsafe fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> Result<Option<ModifyPlan>> {
    // SAFETY: reads the transaction state, the statement texts and fields
    // of a valid Query; the checks below read a copy.
    unsafe {
        use pg_sys::CmdType::*;
        if !super::pushdown::enabled()
            || !client_statement(query_string)
            || crate::transaction::paths::did_fdw_write()
            || !matches!((*parse).commandType, CMD_UPDATE | CMD_DELETE | CMD_INSERT)
            || !(*parse).utilityStmt.is_null()
            || (*parse).hasModifyingCTE
            || !(*parse).cteList.is_null()
            || cursor_options & pg_sys::CURSOR_OPT_SCROLL as i32 != 0
        {
            return Ok(None);
        }
        let Some(statement) = across_shard_groups(parse, bound_params, true)? else {
            return Ok(None);
        };
        let AcrossShardGroups {
            query,
            computed,
            found,
            map_version,
            kinds,
            distributed,
            _busy,
        } = statement;
        let Some(target) = range_table_entry(query, (*query).resultRelation) else {
            return Ok(None);
        };
        // (UPDATE ONLY or DELETE FROM ONLY would change the metadata
        // node's own, empty table; an INSERT's target is never marked.)
        if !is_distributed_entry(target) || (!(*target).inh && (*query).commandType != CMD_INSERT) {
            return Ok(None);
        }
        let Some((_, key_attno)) = partition_key((*target).relid) else {
            return Ok(None);
        };
        let (accounted, keyspace_ids) = if (*query).commandType == CMD_INSERT {
            match insert_select_accounted(query, target, key_attno) {
                Some(accounted) => (accounted, None),
                None => match super::insert_values::row_keyspace_ids(query) {
                    Some(ids) => (Vec::new(), Some(ids)),
                    None => return Ok(None),
                },
            }
        } else {
            if (*query).commandType == CMD_UPDATE && sets_column(query, key_attno) {
                return Ok(None);
            }
            let Some(level) = separable_from(query, None) else {
                return Ok(None);
            };
            let ids = super::pruning::restricted_keyspace_ids(query, &level);
            (level.accounted().to_vec(), ids)
        };
        // Every distributed table must be one the analysis accounted for
        // (none in a CTE, or a sublink not tied to the target's rows).
        let accounted: HashSet<*mut pg_sys::RangeTblEntry> = accounted.into_iter().collect();
        let excluded = if (*query).onConflict.is_null() {
            None
        } else {
            range_table_entry(query, (*(*query).onConflict).exclRelIndex)
        };
        let all_accounted = found.range_entries.iter().all(|&rte| {
            !is_distributed_entry(rte)
                || rte == target
                || Some(rte) == excluded
                || accounted.contains(&rte)
        });
        if !all_accounted {
            return Ok(None);
        }
        let Some(tasks) = node_tasks(
            query,
            &distributed,
            &kinds,
            keyspace_ids.as_deref(),
            Grouping::Statements,
        )?
        else {
            return Ok(None);
        };
        // Every row of an INSERT … VALUES in exactly one group's statement.
        if (*query).commandType == CMD_INSERT
            && keyspace_ids
                .as_ref()
                .is_some_and(|ids| tasks.iter().map(|t| t.rows.len()).sum::<usize>() != ids.len())
        {
            return Ok(None);
        }
        // The RETURNING rows of an INSERT … VALUES across shard groups are
        // put back in the order of its rows by their positions
        // (`executor::modify_scan`), one per row sent. ON CONFLICT may
        // return none for a row, which leaves nothing to go by: such a
        // statement keeps its order only within one group (the
        // postgres_fdw path keeps it).
        if !(*query).returningList.is_null()
            && !(*query).onConflict.is_null()
            && (*query).commandType == CMD_INSERT
            && keyspace_ids.is_some()
            && tasks.iter().map(|t| t.queries.len()).sum::<usize>() > 1
        {
            return Ok(None);
        }
        let again = shard_group_targets(
            query,
            &distributed,
            &kinds,
            keyspace_ids.as_deref(),
            Grouping::Statements,
        );
        let mut relation_oids: Vec<pg_sys::Oid> = kinds.keys().copied().collect();
        relation_oids.extend(tasks.iter().flat_map(|t| t.partitions.iter().copied()));
        Ok(Some(ModifyPlan {
            tasks,
            map_version,
            relation_oids,
            again,
            computed,
        }))
    }
}

/// Whether an UPDATE sets column `attno` of its target.
unsafe fn sets_column(query: *mut pg_sys::Query, attno: i16) -> bool {
    // SAFETY: an UPDATE's target list names its target's columns by resno.
    unsafe {
        PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
            .iter_ptr()
            .any(|t| !(*t).resjunk && (*t).resno == attno)
    }
}

/// For `INSERT INTO target SELECT …`: the distributed tables of the
/// SELECT, when it runs whole per shard group and inserts its own
/// distribution column into the target's (`key_attno`), so that each
/// group's rows go to the same group of the target. ON CONFLICT's
/// `excluded` stands for the target's own rows.
unsafe fn insert_select_accounted(
    query: *mut pg_sys::Query,
    target: *mut pg_sys::RangeTblEntry,
    key_attno: i16,
) -> Option<Vec<*mut pg_sys::RangeTblEntry>> {
    // SAFETY: a valid INSERT Query: its target list names the target's
    // columns by resno, its FROM is the SELECT's subquery entry.
    unsafe {
        let (index, select) = only_from_entry(query)?;
        if (*select).rtekind != pg_sys::RTEKind::RTE_SUBQUERY || (*select).subquery.is_null() {
            return None;
        }
        let (columns, accounted) = separable_subquery((*select).subquery)?;
        let column = super::insert_values::inserted_key_column(query, target, key_attno, index)?;
        if !columns.contains(&column) {
            return None;
        }
        Some(accounted)
    }
}
