//! A comparison with an aggregate of a distributed table's rows matching
//! the outer row (`x > (SELECT 0.5 * sum(l_quantity) FROM lineitem WHERE
//! l_partkey = ps_partkey AND …)`): the intermediate result holds the
//! aggregate grouped by the compared columns, and the comparison's level
//! joins it on them.
//!
//! The join gives the same rows when the comparison is a top-level
//! condition with a strict operator and the aggregate expression is NULL
//! over no rows (sum, avg, min, max under strict operators and functions):
//! a row without matching rows compared with NULL then, and is dropped; it
//! has no match in the grouped result now, and is dropped. The grouping
//! and the join use the compared columns' own equality, so a row matches
//! at most one group.
//!
//! An `IN (…)` on an outer column the sublink compares with (`ps_partkey
//! IN (SELECT p_partkey FROM part …)`), reading only reference tables, is
//! applied to the intermediate statement too: only the groups the outer
//! rows can match are computed.

use super::restriction::{conditions, in_restriction, reference_values, Restriction};
use super::{
    conjunction, deparse, level_vars, single_table, split_conditions, Candidate, Change, Column,
    Correlation,
};
use crate::error::Result;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{CStr, CString};

/// The comparison to change into a join.
pub(super) struct Comparison {
    /// The level whose WHERE holds the comparison.
    level: *mut pg_sys::Query,
    operator: *mut pg_sys::OpExpr,
    /// Which of the operator's arguments is the sublink.
    argument: usize,
    correlations: Vec<Correlation>,
}

impl Comparison {
    /// Join the comparison's level with `rtable`, the intermediate result's
    /// entry (`columns`: the compared columns, then the aggregate), on the
    /// compared columns, and compare with the aggregate's column.
    pub(super) unsafe fn join(&self, rtable: *mut pg_sys::List, columns: &[Column]) {
        // SAFETY: the level and comparison found by `candidate`, changed in
        // place; new nodes in the planner's context.
        unsafe {
            let level = self.level;
            (*level).rtable = pg_sys::list_concat((*level).rtable, rtable);
            let index = PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable).len() as i32;
            let mut reference =
                PgBox::<pg_sys::RangeTblRef>::alloc_node(pg_sys::NodeTag::T_RangeTblRef);
            reference.rtindex = index;
            let jointree = (*level).jointree;
            (*jointree).fromlist = pg_sys::lappend(
                (*jointree).fromlist,
                reference.into_pg() as *mut std::ffi::c_void,
            );
            let column_var = |number: usize| {
                let (ty, typmod, collation) = columns[number];
                pg_sys::makeVar(index, (number + 1) as i16, ty, typmod, collation, 0)
                    as *mut pg_sys::Node
            };
            let mut conditions = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
                (*jointree).quals as *mut pg_sys::Expr,
            ))
            .iter_ptr()
            .collect::<Vec<_>>();
            for (number, correlation) in self.correlations.iter().enumerate() {
                let equality =
                    pg_sys::copyObjectImpl(correlation.operator as *const _) as *mut pg_sys::OpExpr;
                let outer =
                    pg_sys::copyObjectImpl(correlation.outer as *const _) as *mut pg_sys::Node;
                crate::parse_tree::lower_outer_references(outer);
                let mut args = PgList::<pg_sys::Node>::new();
                args.push(column_var(number));
                args.push(outer);
                (*equality).args = args.into_pg();
                conditions.push(equality as *mut pg_sys::Node);
            }
            let old = PgList::<pg_sys::Node>::from_pg((*self.operator).args);
            let mut args = PgList::<pg_sys::Node>::new();
            for (i, arg) in old.iter_ptr().enumerate() {
                args.push(if i == self.argument {
                    column_var(self.correlations.len())
                } else {
                    arg
                });
            }
            (*self.operator).args = args.into_pg();
            (*jointree).quals = conjunction(conditions);
        }
    }
}

/// The comparison `conjunct` of `level`'s WHERE as a join with an
/// intermediate result, if it qualifies (see the module's comment).
pub(super) unsafe fn candidate(
    level: *mut pg_sys::Query,
    conjunct: *mut pg_sys::Node,
) -> Result<Option<Candidate>> {
    // SAFETY: a valid condition of a valid level.
    unsafe {
        if (*conjunct).type_ != pg_sys::NodeTag::T_OpExpr {
            return Ok(None);
        }
        let operator = conjunct as *mut pg_sys::OpExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*operator).args);
        if args.len() != 2 {
            return Ok(None);
        }
        let Some(argument) = (0..2).find(|&i| {
            args.get_ptr(i).is_some_and(|arg| {
                (*arg).type_ == pg_sys::NodeTag::T_SubLink
                    && (*(arg as *mut pg_sys::SubLink)).subLinkType
                        == pg_sys::SubLinkType::EXPR_SUBLINK
            })
        }) else {
            return Ok(None);
        };
        pg_sys::set_opfuncid(operator);
        if !pg_sys::func_strict((*operator).opfuncid) {
            return Ok(None);
        }
        let Some(sublink) = args.get_ptr(argument) else {
            return Ok(None);
        };
        let subquery = (*(sublink as *mut pg_sys::SubLink)).subselect as *mut pg_sys::Query;
        if !(*subquery).hasAggs {
            return Ok(None);
        }
        let Some(relid) = single_table(subquery, true) else {
            return Ok(None);
        };
        let targets = PgList::<pg_sys::TargetEntry>::from_pg((*subquery).targetList);
        let visible: Vec<_> = targets.iter_ptr().filter(|t| !(**t).resjunk).collect();
        let [target] = visible.as_slice() else {
            return Ok(None);
        };
        let value = (**target).expr as *mut pg_sys::Node;
        if !null_over_no_rows(value) || level_vars(value).outer > 0 {
            return Ok(None);
        }
        let Some((mut local, correlations)) = split_conditions(subquery) else {
            return Ok(None);
        };
        let mut restrictions = Vec::new();
        for correlation in &correlations {
            if let Some(restriction) = restriction(level, correlation)? {
                restrictions.push(restriction);
            }
        }
        let (restricting, parameters) = conditions(restrictions);
        local.extend(restricting);
        // The aggregate grouped by the compared columns, of the rows the
        // sublink's own conditions keep.
        let statement =
            pg_sys::copyObjectImpl(subquery as *const std::ffi::c_void) as *mut pg_sys::Query;
        let mut entries = PgList::<pg_sys::TargetEntry>::new();
        let mut columns: Vec<Column> = Vec::new();
        for (number, correlation) in correlations.iter().enumerate() {
            let (ty, typmod, collation) = correlation.column;
            let var = pg_sys::makeVar(1, correlation.attno, ty, typmod, collation, 0);
            let name = CString::new(format!("k{}", number + 1)).unwrap_or_default();
            entries.push(pg_sys::makeTargetEntry(
                var as *mut pg_sys::Expr,
                (number + 1) as i16,
                pg_sys::pstrdup(name.as_ptr()),
                false,
            ));
            columns.push(correlation.column);
        }
        entries.push(pg_sys::makeTargetEntry(
            pg_sys::copyObjectImpl(value as *const _) as *mut pg_sys::Expr,
            (correlations.len() + 1) as i16,
            pg_sys::pstrdup(c"v".as_ptr()),
            false,
        ));
        columns.push((
            pg_sys::exprType(value),
            pg_sys::exprTypmod(value),
            pg_sys::exprCollation(value),
        ));
        (*statement).targetList = entries.into_pg();
        (*statement).hasSubLinks = !parameters.is_empty();
        (*(*statement).jointree).quals = conjunction(local);
        let groups: Vec<String> = (1..=correlations.len()).map(|n| n.to_string()).collect();
        let query = format!("{} GROUP BY {}", deparse(statement), groups.join(", "));
        Ok(Some(Candidate {
            query,
            relid,
            sublink_query: Some(subquery),
            parameters,
            columns,
            change: Change::Scalar(Comparison {
                level,
                operator,
                argument,
                correlations,
            }),
        }))
    }
}

/// Whether `expression` is NULL when its aggregates see no rows: sum, avg,
/// min and max (plain: no DISTINCT, ORDER BY or FILTER) under strict
/// operators and functions and constants.
unsafe fn null_over_no_rows(expression: *mut pg_sys::Node) -> bool {
    // SAFETY: a valid expression tree.
    unsafe {
        match (*expression).type_ {
            pg_sys::NodeTag::T_Const => true,
            pg_sys::NodeTag::T_RelabelType => {
                null_over_no_rows((*(expression as *mut pg_sys::RelabelType)).arg as *mut _)
            }
            pg_sys::NodeTag::T_Aggref => {
                let aggregate = expression as *mut pg_sys::Aggref;
                if (*aggregate).agglevelsup != 0
                    || !(*aggregate).aggdistinct.is_null()
                    || !(*aggregate).aggorder.is_null()
                    || !(*aggregate).aggfilter.is_null()
                    || (*aggregate).aggstar
                    || pg_sys::get_func_namespace((*aggregate).aggfnoid)
                        != pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)
                {
                    return false;
                }
                let name = pg_sys::get_func_name((*aggregate).aggfnoid);
                !name.is_null()
                    && matches!(
                        CStr::from_ptr(name).to_bytes(),
                        b"sum" | b"avg" | b"min" | b"max"
                    )
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = expression as *mut pg_sys::OpExpr;
                pg_sys::set_opfuncid(op);
                pg_sys::func_strict((*op).opfuncid) && all_null_over_no_rows((*op).args)
            }
            pg_sys::NodeTag::T_FuncExpr => {
                let function = expression as *mut pg_sys::FuncExpr;
                pg_sys::func_strict((*function).funcid) && all_null_over_no_rows((*function).args)
            }
            _ => false,
        }
    }
}

/// Whether every argument is [`null_over_no_rows`]'s and at least one holds
/// an aggregate (a strict call of constants alone is not NULL).
unsafe fn all_null_over_no_rows(args: *mut pg_sys::List) -> bool {
    // SAFETY: a list of valid expressions.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg(args);
        args.iter_ptr().all(|arg| null_over_no_rows(arg))
            && args.iter_ptr().any(|arg| pg_sys::contain_agg_clause(arg))
    }
}

/// What keeps the intermediate statement to the groups `level`'s rows can
/// match on `correlation`'s column: the level's own `IN (…)` on the outer
/// column, or else the values its conditions on the outer column's
/// reference table allow.
unsafe fn restriction(
    level: *mut pg_sys::Query,
    correlation: &Correlation,
) -> Result<Option<Restriction>> {
    // SAFETY: valid trees; what is taken from them is copied.
    unsafe {
        if let Some(found) = in_restriction(level, correlation) {
            return Ok(Some(found));
        }
        let outer = super::super::partition_key::strip_relabel(correlation.outer);
        if (*outer).type_ != pg_sys::NodeTag::T_Var
            || (*(outer as *mut pg_sys::Var)).varlevelsup != 1
            || (*(outer as *mut pg_sys::Var)).vartype != correlation.column.0
        {
            return Ok(None);
        }
        let column = pg_sys::copyObjectImpl(outer as *const _) as *mut pg_sys::Var;
        (*column).varlevelsup = 0;
        let (ty, typmod, collation) = correlation.column;
        let tested = pg_sys::makeVar(1, correlation.attno, ty, typmod, collation, 0);
        reference_values(
            level,
            column,
            correlation.operator,
            tested as *mut pg_sys::Node,
        )
    }
}
