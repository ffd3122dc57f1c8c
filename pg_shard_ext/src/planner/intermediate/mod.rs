//! Intermediate results for sublinks that read a distributed table by
//! columns other than its distribution column. No shard group holds all the
//! rows such a sublink needs, so neither the router nor the pushdown class
//! takes the statement, and postgres_fdw would fetch the whole table (or
//! query every shard once per outer row). Instead the sublink's table
//! becomes an *intermediate result*, computed first by a statement of its
//! own (itself pushed down to the workers), then read by the rest of the
//! statement, which PostgreSQL plans and runs on the metadata node:
//!
//! * [`exists`]: `EXISTS` / `NOT EXISTS` tests (TPC-H q22, customers
//!   without orders): the distinct values of the compared columns, read as
//!   an anti- or semi-join;
//! * [`scalar`]: a comparison with an aggregate of the rows matching the
//!   outer row (TPC-H q20, `ps_availqty > (SELECT 0.5 * sum(l_quantity) …
//!   WHERE l_partkey = ps_partkey …)`): the aggregate grouped by the
//!   compared columns, joined on them.
//!
//! * [`table`]: a distributed table in a level's FROM of such a statement
//!   (TPC-H q17): its rows the level's conditions select.
//!
//! Taken when at least one sublink qualifies and every distributed table of
//! the statement is in one or in a level's FROM list, so the statement
//! itself reads reference tables, local ones and intermediate results.

mod exists;
mod restriction;

pub(crate) use restriction::{Values, FEW_VALUES, MAX_VALUES, PARAMETERS_PER_RESTRICTION};
mod scalar;
mod table;

use super::single_table::{conjunction, null_of, reads_reference_tables_alone};
use crate::error::{Result, ShardError};
use crate::executor::pushdown_scan::results_entry;
use crate::guc::GucScope;
use crate::parse_tree::contents;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{CStr, CString};

/// The prefix of an intermediate result's entry name in the statement; its
/// number follows (an index into [`Intermediates::queries`]).
pub(crate) const ENTRY_PREFIX: &str = "pg_shard_intermediate_";

/// The statements computing a rewritten statement's intermediate results,
/// and the distributed tables they read (their changes invalidate the
/// plan).
pub(crate) struct Intermediates {
    pub(crate) queries: Vec<String>,
    /// Each result's columns (type, typmod, collation).
    pub(crate) columns: Vec<Vec<Column>>,
    /// Each statement's restrictions' values (each takes
    /// [`PARAMETERS_PER_RESTRICTION`] parameters).
    pub(crate) parameters: Vec<Vec<Values>>,
    pub(crate) relids: Vec<pg_sys::Oid>,
}

thread_local! {
    /// The intermediate statements running now (innermost last).
    static RUNNING: std::cell::RefCell<Vec<CString>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// While alive, `statement` (an intermediate result's, run through SPI) is
/// planned as a client's statement would be: by the router and pushdown
/// classes, in the transaction's remote transactions.
pub(crate) struct Running;

impl Running {
    pub(crate) fn start(statement: &CStr) -> Running {
        RUNNING.with(|running| running.borrow_mut().push(statement.to_owned()));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|running| running.borrow_mut().pop());
    }
}

/// Whether `statement` is an intermediate statement running now.
pub(super) fn is_running(statement: &CStr) -> bool {
    RUNNING.with(|running| {
        running
            .borrow()
            .last()
            .is_some_and(|s| s.as_c_str() == statement)
    })
}

/// A column's type, typmod and collation.
pub(crate) type Column = (pg_sys::Oid, i32, pg_sys::Oid);

/// A sublink that can read an intermediate result instead: the statement
/// computing the result, and how to change the sublink.
pub(super) struct Candidate {
    query: String,
    relid: pg_sys::Oid,
    /// The sublink's query it takes the place of (None for a table in a
    /// level's FROM).
    sublink_query: Option<*mut pg_sys::Query>,
    /// The values its restrictions take, computed first.
    parameters: Vec<restriction::Values>,
    columns: Vec<Column>,
    change: Change,
}

enum Change {
    Exists(exists::Test),
    Scalar(scalar::Comparison),
    Table(table::Table),
}

/// Rewrite `parse`'s sublinks on distributed tables into reads of
/// intermediate results, if every distributed table of the statement is in
/// one that qualifies; None (and `parse` untouched) otherwise.
///
/// # Safety
/// `parse` is a valid parse tree about to be planned.
pub(super) unsafe fn rewrite(parse: *mut pg_sys::Query) -> Result<Option<Intermediates>> {
    // SAFETY: reads of a valid tree; it is changed only once every sublink
    // qualified.
    unsafe {
        if (*parse).commandType != pg_sys::CmdType::CMD_SELECT
            || (*parse).hasModifyingCTE
            || !(*parse).rowMarks.is_null()
            || (*parse).jointree.is_null()
        {
            return Ok(None);
        }
        let found = contents(parse);
        let distributed = found
            .range_entries
            .iter()
            .filter(|&&rte| super::separable::is_distributed_entry(rte))
            .count();
        if distributed == 0 {
            return Ok(None);
        }
        // The sublinks in any level's WHERE (a subquery's in FROM too).
        let mut candidates = Vec::new();
        for &level in &found.queries {
            if (*level).jointree.is_null() {
                continue;
            }
            let quals = (*(*level).jointree).quals;
            let conjuncts = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
                quals as *mut pg_sys::Expr,
            ));
            for (index, conjunct) in conjuncts.iter_ptr().enumerate() {
                for sublink in crate::parse_tree::level_sublinks(conjunct) {
                    if (*sublink).subLinkType == pg_sys::SubLinkType::EXISTS_SUBLINK {
                        if let Some(candidate) = exists::candidate(sublink, level, index)? {
                            candidates.push(candidate);
                        }
                    }
                }
                if let Some(candidate) = scalar::candidate(level, conjunct)? {
                    candidates.push(candidate);
                }
            }
        }
        if candidates.is_empty() {
            return Ok(None);
        }
        if candidates.len() < distributed {
            // The distributed tables outside those sublinks, read as
            // intermediate results of their own.
            let sublinks: Vec<_> = candidates.iter().filter_map(|c| c.sublink_query).collect();
            for &level in &found.queries {
                if sublinks.contains(&level) {
                    continue;
                }
                let entries = PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable);
                for (index, rte) in entries.iter_ptr().enumerate() {
                    if !super::separable::is_distributed_entry(rte) {
                        continue;
                    }
                    match table::candidate(level, index as i32 + 1)? {
                        Some(candidate) => candidates.push(candidate),
                        None => return Ok(None),
                    }
                }
            }
        }
        if candidates.len() != distributed {
            return Ok(None);
        }
        let mut intermediates = Intermediates {
            queries: Vec::new(),
            columns: Vec::new(),
            parameters: Vec::new(),
            relids: Vec::new(),
        };
        for (number, candidate) in candidates.into_iter().enumerate() {
            let rtable = results_entry(&candidate.columns);
            let entry = PgList::<pg_sys::RangeTblEntry>::from_pg(rtable)
                .get_ptr(0)
                .ok_or_else(|| ShardError::Internal("no results entry".into()))?;
            let name = CString::new(format!("{ENTRY_PREFIX}{number}")).unwrap_or_default();
            (*entry).eref = pg_sys::makeAlias(name.as_ptr(), (*(*entry).eref).colnames);
            match &candidate.change {
                Change::Exists(test) => test.read(rtable),
                Change::Scalar(comparison) => comparison.join(rtable, &candidate.columns),
                Change::Table(table) => table.replace(rtable),
            }
            intermediates.queries.push(candidate.query);
            intermediates.columns.push(candidate.columns);
            intermediates.parameters.push(candidate.parameters);
            intermediates.relids.push(candidate.relid);
        }
        Ok(Some(intermediates))
    }
}

/// The one distributed table `subquery` reads (its only entry, in FROM
/// alone, all its rows), if the query is a plain one: no grouping,
/// ordering, limits, window functions, set operations, CTEs, locks or
/// sublinks of its own. Aggregates are allowed when `aggregates`.
unsafe fn single_table(subquery: *mut pg_sys::Query, aggregates: bool) -> Option<pg_sys::Oid> {
    // SAFETY: a valid sublink query.
    unsafe {
        let q = &*subquery;
        if q.commandType != pg_sys::CmdType::CMD_SELECT
            || (q.hasAggs && !aggregates)
            || q.hasWindowFuncs
            || q.hasTargetSRFs
            || q.hasSubLinks
            || q.hasDistinctOn
            || q.hasRecursive
            || q.hasForUpdate
            || !q.cteList.is_null()
            || !q.groupClause.is_null()
            || !q.groupingSets.is_null()
            || !q.havingQual.is_null()
            || !q.distinctClause.is_null()
            || !q.sortClause.is_null()
            || !q.setOperations.is_null()
            || !q.limitCount.is_null()
            || !q.limitOffset.is_null()
            || !q.rowMarks.is_null()
            || q.jointree.is_null()
        {
            return None;
        }
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg(q.rtable);
        let from = PgList::<pg_sys::Node>::from_pg((*q.jointree).fromlist);
        if rtable.len() != 1 || from.len() != 1 {
            return None;
        }
        let rte = rtable.get_ptr(0)?;
        let item = from.get_ptr(0)?;
        if !super::separable::is_distributed_entry(rte)
            || (*item).type_ != pg_sys::NodeTag::T_RangeTblRef
            || !(*rte).inh
            || !(*rte).tablesample.is_null()
        {
            return None;
        }
        Some((*rte).relid)
    }
}

/// A sublink query's conditions on its table alone (for the intermediate
/// statement) and its comparisons with the statement around it; None if a
/// condition is neither, or volatile.
unsafe fn split_conditions(
    subquery: *mut pg_sys::Query,
) -> Option<(Vec<*mut pg_sys::Node>, Vec<Correlation>)> {
    // SAFETY: a valid sublink query with a jointree.
    unsafe {
        let conjuncts = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
            (*(*subquery).jointree).quals as *mut pg_sys::Expr,
        ));
        let mut local = Vec::new();
        let mut correlations = Vec::new();
        for conjunct in conjuncts.iter_ptr() {
            if pg_sys::contain_volatile_functions(conjunct) {
                return None;
            }
            let vars = level_vars(conjunct);
            if vars.outer == 0 && !vars.whole_row && !vars.params {
                local.push(conjunct);
                continue;
            }
            correlations.push(correlation(conjunct)?);
        }
        (!correlations.is_empty()).then_some((local, correlations))
    }
}

/// A condition comparing a column of the sublink's table with an
/// expression of the statement around it.
pub(super) struct Correlation {
    /// The comparison, as the sublink has it.
    operator: *mut pg_sys::OpExpr,
    /// The table's column (number, type, typmod, collation).
    attno: i16,
    column: Column,
    /// The other side (references to outer levels only).
    outer: *mut pg_sys::Node,
}

/// The comparison `conjunct` makes, if it compares a column of the
/// sublink's table, by the column type's own equality (the one GROUP BY and
/// DISTINCT use), with an expression of the statement around it.
unsafe fn correlation(conjunct: *mut pg_sys::Node) -> Option<Correlation> {
    // SAFETY: a valid expression.
    unsafe {
        if (*conjunct).type_ != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let op = conjunct as *mut pg_sys::OpExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        if args.len() != 2 {
            return None;
        }
        let (left, right) = (args.get_ptr(0)?, args.get_ptr(1)?);
        for (inner, outer) in [(left, right), (right, left)] {
            let column = super::partition_key::strip_relabel(inner);
            if (*column).type_ != pg_sys::NodeTag::T_Var {
                continue;
            }
            let var = column as *mut pg_sys::Var;
            let other = level_vars(outer);
            if (*var).varlevelsup != 0
                || (*var).varno != 1
                || (*var).varattno <= 0
                || other.level > 0
                || other.params
                || pg_sys::exprType(inner) != (*var).vartype
            {
                continue;
            }
            let cache = pg_sys::lookup_type_cache((*var).vartype, pg_sys::TYPECACHE_EQ_OPR as i32);
            if !cache.is_null() && (*cache).eq_opr == (*op).opno {
                return Some(Correlation {
                    operator: op,
                    attno: (*var).varattno,
                    column: ((*var).vartype, (*var).vartypmod, (*var).varcollid),
                    outer,
                });
            }
        }
        None
    }
}

/// A table's columns (name and type) in order; None if one was dropped
/// (an intermediate result's columns may stand at the table's numbers).
unsafe fn table_columns(relid: pg_sys::Oid) -> Option<Vec<(String, Column)>> {
    // SAFETY: the statement's table, locked by the parser; its descriptor
    // is read and the relation closed.
    unsafe {
        let relation = pg_sys::RelationIdGetRelation(relid);
        if relation.is_null() {
            return None;
        }
        let descriptor = (*relation).rd_att;
        let mut columns = Vec::with_capacity((*descriptor).natts as usize);
        let mut dropped = false;
        for attribute in (*descriptor).attrs.as_slice((*descriptor).natts as usize) {
            if attribute.attisdropped {
                dropped = true;
                break;
            }
            columns.push((
                CStr::from_ptr(attribute.attname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                (
                    attribute.atttypid,
                    attribute.atttypmod,
                    attribute.attcollation,
                ),
            ));
        }
        pg_sys::RelationClose(relation);
        (!dropped).then_some(columns)
    }
}

/// `statement` (a copy of a sublink's query, changed into an intermediate
/// statement) as text, its names schema-qualified.
pub(super) unsafe fn deparse(statement: *mut pg_sys::Query) -> String {
    let _path = GucScope::set_one("search_path", "pg_catalog");
    // SAFETY: deparsing a valid Query into a palloc'd string.
    unsafe {
        CStr::from_ptr(pg_sys::pg_get_querydef(statement, false))
            .to_string_lossy()
            .trim()
            .to_string()
    }
}

/// What an expression of a sublink's query refers to.
#[derive(Default)]
struct LevelVars {
    /// Columns of the sublink's own table.
    level: usize,
    /// Columns of the statement around it.
    outer: usize,
    /// A whole-row or system column of the sublink's table.
    whole_row: bool,
    /// Parameters (their values are the statement's).
    params: bool,
}

unsafe fn level_vars(node: *mut pg_sys::Node) -> LevelVars {
    let mut found = LevelVars::default();
    // SAFETY: the walker only reads nodes.
    unsafe {
        for var in crate::parse_tree::every_var(node) {
            if (*var).varlevelsup == 0 {
                found.level += 1;
                if (*var).varattno <= 0 {
                    found.whole_row = true;
                }
            } else {
                found.outer += 1;
            }
        }
        found.params = crate::parse_tree::has_params(node);
    }
    found
}
