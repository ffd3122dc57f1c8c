//! A distributed table read by a level of a statement whose sublinks on
//! distributed tables became intermediate results (TPC-H q17: `FROM
//! lineitem, part WHERE p_partkey = l_partkey AND … AND l_quantity <
//! (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE l_partkey =
//! p_partkey)`). Its rows become an intermediate result too, as far as the
//! level's conditions on the table alone and its equalities with
//! restricted reference tables (`l_partkey IN (SELECT p_partkey FROM part
//! WHERE p_brand = … AND p_container = …)`) select them; the columns the
//! statement reads keep their numbers, the others are NULL. The whole
//! statement then reads no distributed table and runs on the metadata
//! node.

use super::super::single_table::{entry, own_conditions, single_table_query};
use super::restriction::{self, reference_values, Restriction};
use super::{deparse, null_of, table_columns, Candidate, Change};
use crate::error::Result;
use crate::planner::partition_key::strip_relabel;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::CString;

/// The table's entry to replace by the intermediate result's.
pub(super) struct Table {
    level: *mut pg_sys::Query,
    varno: i32,
    /// The table's column names (the result's columns are named after
    /// them, for EXPLAIN).
    names: Vec<String>,
}

impl Table {
    /// Put `rtable`'s one entry (the intermediate result's) in the table's
    /// place: the level's references to the table read it instead.
    pub(super) unsafe fn replace(&self, rtable: *mut pg_sys::List) {
        // SAFETY: the level found by `candidate`, changed in place; new
        // nodes in the planner's context.
        unsafe {
            let Some(result) = PgList::<pg_sys::RangeTblEntry>::from_pg(rtable).get_ptr(0) else {
                return;
            };
            let mut names = PgList::<pg_sys::Node>::new();
            for name in &self.names {
                let name = CString::new(name.as_str()).unwrap_or_default();
                names.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())) as *mut pg_sys::Node);
            }
            (*result).eref = pg_sys::makeAlias((*(*result).eref).aliasname, names.into_pg());
            let entries = (*self.level).rtable;
            let cell = (*entries).elements.add(self.varno as usize - 1);
            (*cell).ptr_value = result as *mut std::ffi::c_void;
        }
    }
}

/// The distributed table at range table index `varno` of `level` as an
/// intermediate result, if the level's FROM list names it directly and
/// the statement reads no whole row or system column of it.
pub(super) unsafe fn candidate(level: *mut pg_sys::Query, varno: i32) -> Result<Option<Candidate>> {
    // SAFETY: a valid level; what is taken from it is copied.
    unsafe {
        if (*level).commandType != pg_sys::CmdType::CMD_SELECT || !(*level).rowMarks.is_null() {
            return Ok(None);
        }
        let Some(rte) = entry(level, varno) else {
            return Ok(None);
        };
        if !super::super::separable::is_distributed_entry(rte) || !(*rte).tablesample.is_null() {
            return Ok(None);
        }
        let relid = (*rte).relid;
        let Some(columns) = table_columns(relid) else {
            return Ok(None);
        };
        // Every reference to the table, from this level and the levels in it.
        let mut used = Vec::new();
        for var in PgList::<pg_sys::Var>::from_pg(pg_sys::pull_vars_of_level(
            level as *mut pg_sys::Node,
            0,
        ))
        .iter_ptr()
        {
            if (*var).xpr.type_ != pg_sys::NodeTag::T_Var || (*var).varno != varno {
                continue;
            }
            if (*var).varattno <= 0 {
                return Ok(None);
            }
            used.push((*var).varattno);
        }
        let Some(mut conditions) = own_conditions(level, varno, true) else {
            return Ok(None);
        };
        let (restricting, parameters) =
            restriction::conditions(reference_equalities(level, varno)?);
        conditions.extend(restricting);
        let targets = columns
            .iter()
            .enumerate()
            .map(|(i, (_, (ty, typmod, collation)))| {
                let attno = (i + 1) as i16;
                if used.contains(&attno) {
                    pg_sys::makeVar(varno, attno, *ty, *typmod, *collation, 0) as *mut pg_sys::Node
                } else {
                    null_of(*ty, *typmod, *collation)
                }
            })
            .collect();
        let statement = single_table_query(level, varno, conditions, targets);
        Ok(Some(Candidate {
            query: deparse(statement),
            relid,
            sublink_query: None,
            parameters,
            columns: columns.iter().map(|(_, c)| *c).collect(),
            change: Change::Table(Table {
                level,
                varno,
                names: columns.into_iter().map(|(name, _)| name).collect(),
            }),
        }))
    }
}

/// For each equality of `level`'s WHERE between a column of the table at
/// `varno` and a column of a reference table that the level restricts,
/// the table's column `IN` the values the reference table's conditions
/// allow.
unsafe fn reference_equalities(level: *mut pg_sys::Query, varno: i32) -> Result<Vec<Restriction>> {
    let mut restrictions = Vec::new();
    // SAFETY: a valid level; the conditions are read, what is taken is
    // copied.
    unsafe {
        let conjuncts = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
            (*(*level).jointree).quals as *mut pg_sys::Expr,
        ));
        for conjunct in conjuncts.iter_ptr() {
            if (*conjunct).type_ != pg_sys::NodeTag::T_OpExpr {
                continue;
            }
            let operator = conjunct as *mut pg_sys::OpExpr;
            let args = PgList::<pg_sys::Node>::from_pg((*operator).args);
            let (Some(left), Some(right)) = (args.get_ptr(0), args.get_ptr(1)) else {
                continue;
            };
            let (left, right) = (strip_relabel(left), strip_relabel(right));
            if args.len() != 2
                || (*left).type_ != pg_sys::NodeTag::T_Var
                || (*right).type_ != pg_sys::NodeTag::T_Var
            {
                continue;
            }
            let (left, right) = (left as *mut pg_sys::Var, right as *mut pg_sys::Var);
            let (own, other) = match ((*left).varno == varno, (*right).varno == varno) {
                (true, false) => (left, right),
                (false, true) => (right, left),
                _ => continue,
            };
            if (*own).varlevelsup != 0
                || (*other).varlevelsup != 0
                || (*own).varattno <= 0
                || (*own).vartype != (*other).vartype
            {
                continue;
            }
            let cache = pg_sys::lookup_type_cache((*own).vartype, pg_sys::TYPECACHE_EQ_OPR as i32);
            if cache.is_null() || (*cache).eq_opr != (*operator).opno {
                continue;
            }
            let tested = pg_sys::copyObjectImpl(own as *const _) as *mut pg_sys::Node;
            if let Some(restriction) = reference_values(level, other, operator, tested)? {
                restrictions.push(restriction);
            }
        }
    }
    Ok(restrictions)
}
