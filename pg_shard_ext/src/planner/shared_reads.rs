//! Reference tables that every shard-group branch of a node's pushdown
//! statement reads under the same conditions of their own (TPC-H q8's
//! `part WHERE p_type = …`): read once per node, as a materialized CTE the
//! branches share, instead of once per branch (a scan of the whole table
//! per shard group on the node). Measured on TPC-H SF 1 q8: one worker's
//! statement of 16 branches, 1.7–2.0 s → 0.54–0.66 s.
//!
//! Only a table the statement names once (its one entry, directly in its
//! level's FROM list, read by column: no whole-row or system column) with
//! at least one condition of the level's WHERE on it alone, in a statement
//! without FOR UPDATE/SHARE. The CTE keeps the table's columns, names and
//! order (a column the statement does not read is a NULL, nothing to
//! store), so the branches read it under the table's alias unchanged; they
//! keep their conditions on it (applied again, to the CTE's rows).

use super::router::Kind;
use super::single_table::{conjunction, entry, null_of, own_conditions, single_table_query};
use crate::error::Result;
use crate::parse_tree::contents;
use pgrx::prelude::*;
use pgrx::PgList;
use std::collections::HashMap;

/// A reference table read once per node.
pub(super) struct SharedRead {
    pub(super) relid: pg_sys::Oid,
    /// The CTE's name in the node's statement.
    pub(super) name: String,
    /// Its query, as the metadata node's names print it.
    pub(super) query: String,
}

/// The reference tables of `worker` (the worker query, before its tables
/// are renamed) that qualify, and a copy of `worker` whose levels no
/// longer hold the conditions the CTEs apply (left there, they would be
/// estimated again over the CTE's rows, which already passed them: TPC-H
/// q3's `c_mktsegment = 'BUILDING'` then estimated 151 customers of 30,000
/// and probed an index once per customer instead of hashing them).
///
/// # Safety
/// `worker` is a valid Query; it is not changed.
pub(super) unsafe fn shared_reads(
    worker: *mut pg_sys::Query,
    kinds: &HashMap<pg_sys::Oid, Kind>,
) -> Result<(Vec<SharedRead>, *mut pg_sys::Query)> {
    let mut reads = Vec::new();
    // SAFETY: a copy of a valid tree is read and changed; what the CTEs
    // take from it is copied again.
    unsafe {
        let worker =
            pg_sys::copyObjectImpl(worker as *const std::ffi::c_void) as *mut pg_sys::Query;
        let found = contents(worker);
        if found.queries.iter().any(|&q| !(*q).rowMarks.is_null()) {
            return Ok((reads, worker));
        }
        let mut named: HashMap<pg_sys::Oid, usize> = HashMap::new();
        for &rte in &found.range_entries {
            if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
                *named.entry((*rte).relid).or_default() += 1;
            }
        }
        for &level in &found.queries {
            let entries = PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable);
            for (index, rte) in entries.iter_ptr().enumerate() {
                let varno = index as i32 + 1;
                if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
                    || kinds.get(&(*rte).relid) != Some(&Kind::Reference)
                    || named.get(&(*rte).relid) != Some(&1)
                    || !(*rte).tablesample.is_null()
                    || entry(level, varno).is_none()
                {
                    continue;
                }
                let Some(conditions) = own_conditions(level, varno, false) else {
                    continue;
                };
                if conditions.is_empty() {
                    continue;
                }
                let Some(columns) = read_by_column(level, varno) else {
                    continue;
                };
                let (attnos, targets): (Vec<i16>, Vec<*mut pg_sys::Node>) =
                    columns.into_iter().unzip();
                let statement = single_table_query(level, varno, conditions.clone(), targets);
                remove_conditions(level, &conditions);
                // Every output keeps its column's name (a NULL for an
                // unread column too: the branches name them as the table's).
                let entries = PgList::<pg_sys::TargetEntry>::from_pg((*statement).targetList);
                for (target, attno) in entries.iter_ptr().zip(attnos) {
                    let name = pg_sys::get_attname((*rte).relid, attno, true);
                    if !name.is_null() {
                        (*target).resname = name;
                    }
                }
                reads.push(SharedRead {
                    relid: (*rte).relid,
                    name: format!("pg_shard_reference_{}", reads.len() + 1),
                    query: super::intermediate::deparse(statement),
                });
            }
        }
        Ok((reads, worker))
    }
}

/// `level`'s WHERE without `conditions` (some of its conjuncts).
unsafe fn remove_conditions(level: *mut pg_sys::Query, conditions: &[*mut pg_sys::Node]) {
    // SAFETY: a valid level whose conjuncts include `conditions`.
    unsafe {
        let kept: Vec<*mut pg_sys::Node> = PgList::<pg_sys::Node>::from_pg(
            pg_sys::make_ands_implicit((*(*level).jointree).quals as *mut pg_sys::Expr),
        )
        .iter_ptr()
        .filter(|conjunct| !conditions.contains(conjunct))
        .collect();
        (*(*level).jointree).quals = conjunction(kept);
    }
}

/// Every column of `level`'s entry `varno` (a relation) by attribute
/// number, in order: a Var for each the statement reads, a NULL for the
/// others (nothing to store); None when the statement reads the entry
/// otherwise than by column (a whole row, a system column).
unsafe fn read_by_column(
    level: *mut pg_sys::Query,
    varno: i32,
) -> Option<Vec<(i16, *mut pg_sys::Node)>> {
    // SAFETY: a valid level; the relation's descriptor is read and closed.
    unsafe {
        let mut read = std::collections::HashSet::new();
        for var in PgList::<pg_sys::Var>::from_pg(pg_sys::pull_vars_of_level(
            level as *mut pg_sys::Node,
            0,
        ))
        .iter_ptr()
        {
            if (*var).xpr.type_ != pg_sys::NodeTag::T_Var {
                return None;
            }
            if (*var).varno == varno {
                if (*var).varattno <= 0 {
                    return None;
                }
                read.insert((*var).varattno);
            }
        }
        let rte = PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable)
            .get_ptr(varno as usize - 1)?;
        let relation = pg_sys::RelationIdGetRelation((*rte).relid);
        if relation.is_null() {
            return None;
        }
        let descriptor = (*relation).rd_att;
        let mut columns = Vec::new();
        for (i, attribute) in (*descriptor)
            .attrs
            .as_slice((*descriptor).natts as usize)
            .iter()
            .enumerate()
        {
            if attribute.attisdropped {
                continue;
            }
            let attno = (i + 1) as i16;
            let column = if read.contains(&attno) {
                pg_sys::makeVar(
                    varno,
                    attno,
                    attribute.atttypid,
                    attribute.atttypmod,
                    attribute.attcollation,
                    0,
                ) as *mut pg_sys::Node
            } else {
                null_of(
                    attribute.atttypid,
                    attribute.atttypmod,
                    attribute.attcollation,
                )
            };
            columns.push((attno, column));
        }
        pg_sys::RelationClose(relation);
        Some(columns)
    }
}
