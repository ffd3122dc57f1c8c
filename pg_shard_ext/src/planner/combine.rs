//! Splitting a pushed-down SELECT into the query each shard group runs and
//! the final query the metadata node runs over their rows.
//!
//! When the statement runs whole per shard group (no aggregates across
//! groups), workers run it as it is, with every target column returned
//! (ORDER BY's too) and LIMIT n OFFSET m as LIMIT n + m; the final query
//! only applies DISTINCT, ORDER BY, LIMIT and OFFSET again over all rows.
//!
//! Otherwise workers group by the statement's GROUP BY and compute partial
//! aggregates, which the final query merges group by group:
//! * count → sum of the counts; sum → sum of the sums; min, max, bool_and,
//!   bool_or, every → the same aggregate of the partial results;
//! * avg, variance, stddev and their _samp / _pop → each group's transition
//!   state (PostgreSQL's, serialized when internal) from the workers,
//!   combined and finished by PostgreSQL's own functions (helper aggregates
//!   in sql/pg_shard_api.sql), as a parallel aggregate would (avg of a type
//!   without them: sum of the sums over sum of the counts);
//! * string_agg (a fixed delimiter) → string_agg of the workers' strings;
//!   array_agg of values → the workers' arrays concatenated (without ORDER
//!   BY inside, their order is unspecified, as on one server);
//! * an aggregate with DISTINCT (`count(DISTINCT x)`) → workers group by its
//!   arguments too, and the final query runs it over the distinct values,
//!   so its answer is exact.
//!
//! Any other aggregate (an ORDER BY inside one, user aggregates, …)
//! makes workers return the rows' grouping and argument values instead,
//! and the final query aggregates them all: slower, always right.
//! HAVING, DISTINCT, ORDER BY and LIMIT then run on the final query only.

use super::aggregates::{
    aggregate_call, aggregate_of, array_cat_aggregate, avg_accumulates_in, builtin_name, coerce,
    divide, oid_list, single_argument, splittable, state_aggregates, sum_of, COUNT_ANY, FLOAT8,
    INT8, SAME_AGGREGATE, STATE_AGGREGATES,
};
use crate::error::Result;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{c_void, CString};

/// The two halves of a pushed-down statement.
pub(crate) struct Split {
    /// What each shard group runs (its distributed tables are pointed at
    /// the group's shards later).
    pub(crate) worker: *mut pg_sys::Query,
    /// The final query, over one function entry standing for the workers'
    /// rows (range table index 1).
    pub(crate) master: *mut pg_sys::Query,
    /// The worker query's output columns: type, typmod, collation.
    pub(crate) columns: Vec<(pg_sys::Oid, i32, pg_sys::Oid)>,
}

/// Split `query` (a separable SELECT's copy, which this changes); `whole`
/// when it runs whole per shard group. None for what the final query
/// cannot compute.
///
/// # Safety
/// `query` is a valid parse tree the caller owns.
pub(super) unsafe fn split(query: *mut pg_sys::Query, whole: bool) -> Result<Option<Split>> {
    // SAFETY: as above.
    unsafe {
        if whole {
            Ok(Some(split_whole(query)))
        } else {
            split_aggregated(query)
        }
    }
}

unsafe fn split_whole(query: *mut pg_sys::Query) -> Split {
    // SAFETY: a valid Query; nodes are allocated in the current context.
    unsafe {
        let worker = pg_sys::copyObjectImpl(query as *const c_void) as *mut pg_sys::Query;
        let mut columns = Vec::new();
        let mut master_targets = PgList::<pg_sys::TargetEntry>::new();
        for (i, entry) in PgList::<pg_sys::TargetEntry>::from_pg((*worker).targetList)
            .iter_ptr()
            .enumerate()
        {
            let expr = (*entry).expr as *mut pg_sys::Node;
            let var = output_var(expr, i);
            columns.push(column_type(expr));
            let target = pg_sys::flatCopyTargetEntry(entry);
            (*target).expr = var as *mut pg_sys::Expr;
            master_targets.push(target);
            // Sort keys travel too.
            (*entry).resjunk = false;
        }
        // Each group's first n + m rows hold every row the LIMIT keeps.
        let limit = worker_limit((*query).limitCount, (*query).limitOffset);
        (*worker).limitCount = limit;
        (*worker).limitOffset = std::ptr::null_mut();
        if limit.is_null() {
            (*worker).limitOption = pg_sys::LimitOption::LIMIT_OPTION_DEFAULT;
        }
        let master = master_query(query, master_targets.into_pg(), &columns);
        (*master).hasAggs = false;
        Split {
            worker,
            master,
            columns,
        }
    }
}

/// `LIMIT n OFFSET m` as the worker's `LIMIT n + m`, when both are known
/// numbers; NULL otherwise (no limit).
unsafe fn worker_limit(count: *mut pg_sys::Node, offset: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: constants of a valid Query.
    unsafe {
        let value = |node: *mut pg_sys::Node| -> Option<Option<i64>> {
            if node.is_null() {
                return Some(None);
            }
            // LIMIT 10 is int8(10) until folded (on a copy).
            if pg_sys::contain_volatile_functions(node) || pg_sys::contain_subplans(node) {
                return None;
            }
            let copy = pg_sys::copyObjectImpl(node as *const c_void) as *mut pg_sys::Node;
            let node = pg_sys::eval_const_expressions(std::ptr::null_mut(), copy);
            if (*node).type_ != pg_sys::NodeTag::T_Const {
                return None;
            }
            let constant = node as *mut pg_sys::Const;
            if (*constant).consttype.to_u32() != INT8 {
                return None;
            }
            if (*constant).constisnull {
                return Some(None);
            }
            Some(Some((*constant).constvalue.value() as i64))
        };
        match (value(count), value(offset)) {
            (Some(Some(n)), Some(m)) => {
                let total = n.saturating_add(m.unwrap_or(0).max(0));
                pg_sys::makeConst(
                    pg_sys::Oid::from(INT8),
                    -1,
                    pg_sys::InvalidOid,
                    8,
                    pg_sys::Datum::from(total),
                    false,
                    true,
                ) as *mut pg_sys::Node
            }
            _ => std::ptr::null_mut(),
        }
    }
}

/// The worker's output columns and how the final query refers to them.
#[derive(Default)]
struct Outputs {
    exprs: Vec<*mut pg_sys::Node>,
    /// Worker GROUP BY: (output index, its clause).
    groups: Vec<(usize, *mut pg_sys::SortGroupClause)>,
}

impl Outputs {
    /// The final query's reference to the worker column computing `expr`
    /// (added if new).
    unsafe fn column(&mut self, expr: *mut pg_sys::Node) -> *mut pg_sys::Node {
        // SAFETY: valid expressions.
        unsafe {
            let index = match self
                .exprs
                .iter()
                .position(|&e| pg_sys::equal(e as *const c_void, expr as *const c_void))
            {
                Some(index) => index,
                None => {
                    self.exprs.push(expr);
                    self.exprs.len() - 1
                }
            };
            output_var(self.exprs[index], index)
        }
    }

    /// [`Outputs::column`], grouped by on the workers with `clause`'s
    /// operators.
    unsafe fn grouped_column(
        &mut self,
        expr: *mut pg_sys::Node,
        clause: *mut pg_sys::SortGroupClause,
    ) -> *mut pg_sys::Node {
        // SAFETY: valid nodes.
        unsafe {
            let var = self.column(expr);
            let index = ((*(var as *mut pg_sys::Var)).varattno - 1) as usize;
            if !self.groups.iter().any(|(i, _)| *i == index) {
                self.groups.push((index, clause));
            }
            var
        }
    }
}

/// Var (1, index + 1) of `expr`'s type.
unsafe fn output_var(expr: *mut pg_sys::Node, index: usize) -> *mut pg_sys::Node {
    let (ty, typmod, collation) = column_type(expr);
    // SAFETY: makeVar allocates a node.
    unsafe { pg_sys::makeVar(1, (index + 1) as i16, ty, typmod, collation, 0) as *mut pg_sys::Node }
}

fn column_type(expr: *mut pg_sys::Node) -> (pg_sys::Oid, i32, pg_sys::Oid) {
    // SAFETY: a valid expression.
    unsafe {
        (
            pg_sys::exprType(expr),
            pg_sys::exprTypmod(expr),
            pg_sys::exprCollation(expr),
        )
    }
}

unsafe fn split_aggregated(query: *mut pg_sys::Query) -> Result<Option<Split>> {
    // SAFETY: a valid Query; nodes are allocated in the current context.
    unsafe {
        if (*query).hasWindowFuncs || (*query).hasTargetSRFs {
            return Ok(None);
        }
        let targets = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
        let mut aggregates =
            crate::parse_tree::level_aggregates((*query).targetList as *mut pg_sys::Node);
        for aggregate in crate::parse_tree::level_aggregates((*query).havingQual) {
            if !aggregates
                .iter()
                .any(|&a| pg_sys::equal(a as *const c_void, aggregate as *const c_void))
            {
                aggregates.push(aggregate);
            }
        }
        let partial = aggregates.iter().all(|&a| splittable(a));
        let mut outputs = Outputs::default();
        let mut pairs: Vec<(*mut pg_sys::Node, *mut pg_sys::Node)> = Vec::new();
        for clause in PgList::<pg_sys::SortGroupClause>::from_pg((*query).groupClause).iter_ptr() {
            let Some(entry) = targets
                .iter_ptr()
                .find(|t| (**t).ressortgroupref == (*clause).tleSortGroupRef)
            else {
                return Ok(None);
            };
            let expr = (*entry).expr as *mut pg_sys::Node;
            let var = if partial {
                outputs.grouped_column(expr, clause)
            } else {
                outputs.column(expr)
            };
            pairs.push((expr, var));
        }
        for &aggregate in &aggregates {
            let merged = if partial {
                merge_partial(aggregate, &mut outputs)?
            } else {
                merge_rows(aggregate, &mut outputs)
            };
            let Some(merged) = merged else {
                return Ok(None);
            };
            pairs.push((aggregate as *mut pg_sys::Node, merged));
        }
        let mut master_targets = PgList::<pg_sys::TargetEntry>::new();
        for entry in targets.iter_ptr() {
            let (expr, left_over) = crate::parse_tree::replace_subexpressions(
                (*entry).expr as *mut pg_sys::Node,
                &pairs,
            );
            if left_over {
                return Ok(None);
            }
            let target = pg_sys::flatCopyTargetEntry(entry);
            (*target).expr = expr as *mut pg_sys::Expr;
            master_targets.push(target);
        }
        let (having, left_over) =
            crate::parse_tree::replace_subexpressions((*query).havingQual, &pairs);
        if left_over {
            return Ok(None);
        }

        let worker = pg_sys::copyObjectImpl(query as *const c_void) as *mut pg_sys::Query;
        let mut worker_targets = PgList::<pg_sys::TargetEntry>::new();
        let mut columns = Vec::new();
        for (i, &expr) in outputs.exprs.iter().enumerate() {
            let name = CString::new(format!("c{}", i + 1)).unwrap_or_default();
            let entry = pg_sys::makeTargetEntry(
                expr as *mut pg_sys::Expr,
                (i + 1) as i16,
                pg_sys::pstrdup(name.as_ptr()),
                false,
            );
            columns.push(column_type(expr));
            worker_targets.push(entry);
        }
        let mut worker_groups = PgList::<pg_sys::SortGroupClause>::new();
        for &(index, clause) in &outputs.groups {
            let copy =
                pg_sys::copyObjectImpl(clause as *const c_void) as *mut pg_sys::SortGroupClause;
            (*copy).tleSortGroupRef = (index + 1) as u32;
            if let Some(entry) = worker_targets.get_ptr(index) {
                (*entry).ressortgroupref = (index + 1) as u32;
            }
            worker_groups.push(copy);
        }
        (*worker).targetList = worker_targets.into_pg();
        (*worker).groupClause = worker_groups.into_pg();
        (*worker).hasAggs = partial && !aggregates.is_empty();
        (*worker).havingQual = std::ptr::null_mut();
        (*worker).sortClause = std::ptr::null_mut();
        (*worker).distinctClause = std::ptr::null_mut();
        (*worker).hasDistinctOn = false;
        (*worker).limitCount = std::ptr::null_mut();
        (*worker).limitOffset = std::ptr::null_mut();
        (*worker).limitOption = pg_sys::LimitOption::LIMIT_OPTION_DEFAULT;

        let master = master_query(query, master_targets.into_pg(), &columns);
        (*master).groupClause =
            pg_sys::copyObjectImpl((*query).groupClause as *const c_void) as *mut pg_sys::List;
        (*master).havingQual = having;
        (*master).hasAggs = (*query).hasAggs;
        Ok(Some(Split {
            worker,
            master,
            columns,
        }))
    }
}

/// The final query's expression for a splittable aggregate, adding the
/// partial results to the worker's outputs.
unsafe fn merge_partial(
    aggregate: *mut pg_sys::Aggref,
    outputs: &mut Outputs,
) -> Result<Option<*mut pg_sys::Node>> {
    // SAFETY: a valid Aggref; new nodes in the current context.
    unsafe {
        let Some(name) = builtin_name(aggregate) else {
            return Ok(None);
        };
        if !(*aggregate).aggdistinct.is_null() {
            // Workers group by the distinct arguments.
            let merged = pg_sys::copyObjectImpl(aggregate as *const c_void) as *mut pg_sys::Aggref;
            let distinct = PgList::<pg_sys::SortGroupClause>::from_pg((*merged).aggdistinct);
            for entry in PgList::<pg_sys::TargetEntry>::from_pg((*merged).args).iter_ptr() {
                let Some(clause) = distinct
                    .iter_ptr()
                    .find(|c| (**c).tleSortGroupRef == (*entry).ressortgroupref)
                else {
                    return Ok(None);
                };
                (*entry).expr = outputs.grouped_column((*entry).expr as *mut pg_sys::Node, clause)
                    as *mut pg_sys::Expr;
            }
            return Ok(Some(merged as *mut pg_sys::Node));
        }
        let whole = aggregate as *mut pg_sys::Node;
        match name.as_str() {
            "count" => {
                let partial = outputs.column(whole);
                Ok(sum_of(partial).and_then(|sum| coerce(sum, INT8)))
            }
            "sum" => {
                let partial = outputs.column(whole);
                Ok(sum_of(partial).and_then(|sum| coerce(sum, (*aggregate).aggtype.to_u32())))
            }
            "string_agg" => {
                // The workers' strings joined by the same delimiter.
                let partial = outputs.column(whole);
                let merged =
                    pg_sys::copyObjectImpl(aggregate as *const c_void) as *mut pg_sys::Aggref;
                let args = PgList::<pg_sys::TargetEntry>::from_pg((*merged).args);
                let Some(first) = args.get_ptr(0) else {
                    return Ok(None);
                };
                (*first).expr = partial as *mut pg_sys::Expr;
                (*merged).aggfilter = std::ptr::null_mut();
                Ok(Some(merged as *mut pg_sys::Node))
            }
            "array_agg" => {
                // The workers' arrays concatenated.
                let Some(concatenate) = array_cat_aggregate(aggregate) else {
                    return Ok(None);
                };
                let partial = outputs.column(whole);
                let Some(merged) = aggregate_of(concatenate, partial, std::ptr::null_mut()) else {
                    return Ok(None);
                };
                (*(merged as *mut pg_sys::Aggref)).aggtype = (*aggregate).aggtype;
                Ok(Some(merged))
            }
            n if SAME_AGGREGATE.contains(&n) => {
                let partial = outputs.column(whole);
                let merged =
                    pg_sys::copyObjectImpl(aggregate as *const c_void) as *mut pg_sys::Aggref;
                (*merged).args = single_argument(partial);
                (*merged).aggargtypes = oid_list(pg_sys::exprType(partial));
                (*merged).aggfilter = std::ptr::null_mut();
                (*merged).aggstar = false;
                (*merged).inputcollid = pg_sys::exprCollation(partial);
                Ok(Some(merged as *mut pg_sys::Node))
            }
            "avg" if state_aggregates(aggregate).is_some() => Ok(merge_states(aggregate, outputs)),
            "avg" => {
                let Some(accumulates) = avg_accumulates_in(aggregate) else {
                    return Ok(None);
                };
                let args = PgList::<pg_sys::TargetEntry>::from_pg((*aggregate).args);
                let Some(argument) = args.get_ptr(0) else {
                    return Ok(None);
                };
                let mut value = (*argument).expr as *mut pg_sys::Node;
                if accumulates == FLOAT8 {
                    let Some(widened) = coerce(value, FLOAT8) else {
                        return Ok(None);
                    };
                    value = widened;
                }
                let Some(partial_sum) = aggregate_call("sum", value, (*aggregate).aggfilter) else {
                    return Ok(None);
                };
                let Some(partial_count) =
                    aggregate_of(pg_sys::Oid::from(COUNT_ANY), value, (*aggregate).aggfilter)
                else {
                    return Ok(None);
                };
                let sums = outputs.column(partial_sum);
                let counts = outputs.column(partial_count);
                let (Some(total), Some(count)) = (sum_of(sums), sum_of(counts)) else {
                    return Ok(None);
                };
                let result_type = (*aggregate).aggtype.to_u32();
                let (Some(total), Some(count)) =
                    (coerce(total, result_type), coerce(count, result_type))
                else {
                    return Ok(None);
                };
                let quotient = divide(total, count);
                Ok(coerce(quotient, result_type))
            }
            n if STATE_AGGREGATES.contains(&n) => Ok(merge_states(aggregate, outputs)),
            _ => Ok(None),
        }
    }
}

/// The final query's expression for an aggregate merged from transition
/// states (see [`state_aggregates`]): the workers' state aggregate, with the
/// aggregate's argument and FILTER, combined and finished by the final
/// query's.
unsafe fn merge_states(
    aggregate: *mut pg_sys::Aggref,
    outputs: &mut Outputs,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a valid Aggref; new nodes in the current context.
    unsafe {
        let (worker, combine) = state_aggregates(aggregate)?;
        let args = PgList::<pg_sys::TargetEntry>::from_pg((*aggregate).args);
        let argument = args.get_ptr(0)?;
        let state = aggregate_of(
            worker,
            (*argument).expr as *mut pg_sys::Node,
            (*aggregate).aggfilter,
        )?;
        let states = outputs.column(state);
        aggregate_of(combine, states, std::ptr::null_mut())
    }
}

/// The final query's copy of an aggregate that workers cannot split: its
/// arguments and FILTER become worker outputs, one row per input row.
unsafe fn merge_rows(
    aggregate: *mut pg_sys::Aggref,
    outputs: &mut Outputs,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a valid Aggref; new nodes in the current context.
    unsafe {
        if pg_sys::contain_vars_of_level((*aggregate).aggdirectargs as *mut pg_sys::Node, 0) {
            return None;
        }
        let merged = pg_sys::copyObjectImpl(aggregate as *const c_void) as *mut pg_sys::Aggref;
        for entry in PgList::<pg_sys::TargetEntry>::from_pg((*merged).args).iter_ptr() {
            (*entry).expr = outputs.column((*entry).expr as *mut pg_sys::Node) as *mut pg_sys::Expr;
        }
        if !(*merged).aggfilter.is_null() {
            (*merged).aggfilter =
                outputs.column((*merged).aggfilter as *mut pg_sys::Node) as *mut pg_sys::Expr;
        }
        Some(merged as *mut pg_sys::Node)
    }
}

/// The final query over the workers' rows, with `targets`; DISTINCT,
/// ORDER BY and LIMIT as the statement's.
unsafe fn master_query(
    query: *mut pg_sys::Query,
    targets: *mut pg_sys::List,
    columns: &[(pg_sys::Oid, i32, pg_sys::Oid)],
) -> *mut pg_sys::Query {
    // SAFETY: new nodes; copies of the statement's clauses.
    unsafe {
        let copy = |node: *mut pg_sys::List| {
            pg_sys::copyObjectImpl(node as *const c_void) as *mut pg_sys::List
        };
        let mut master = PgBox::<pg_sys::Query>::alloc_node(pg_sys::NodeTag::T_Query);
        master.commandType = pg_sys::CmdType::CMD_SELECT;
        master.querySource = pg_sys::QuerySource::QSRC_ORIGINAL;
        master.canSetTag = true;
        master.rtable = crate::executor::pushdown_scan::results_entry(columns);
        let mut reference =
            PgBox::<pg_sys::RangeTblRef>::alloc_node(pg_sys::NodeTag::T_RangeTblRef);
        reference.rtindex = 1;
        let mut from = PgList::<pg_sys::Node>::new();
        from.push(reference.into_pg() as *mut pg_sys::Node);
        master.jointree = pg_sys::makeFromExpr(from.into_pg(), std::ptr::null_mut());
        master.targetList = targets;
        master.sortClause = copy((*query).sortClause);
        master.distinctClause = copy((*query).distinctClause);
        master.hasDistinctOn = (*query).hasDistinctOn;
        master.limitCount =
            pg_sys::copyObjectImpl((*query).limitCount as *const c_void) as *mut pg_sys::Node;
        master.limitOffset =
            pg_sys::copyObjectImpl((*query).limitOffset as *const c_void) as *mut pg_sys::Node;
        master.limitOption = (*query).limitOption;
        master.stmt_location = (*query).stmt_location;
        master.stmt_len = (*query).stmt_len;
        master.into_pg()
    }
}
