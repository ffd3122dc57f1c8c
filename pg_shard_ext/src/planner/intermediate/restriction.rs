//! Restrictions that keep an intermediate statement to the values the
//! statement around it can use: a superset of the values an outer
//! expression takes in its level's rows keeps every answer of that level
//! (rows with other values match none of them), and lets the workers skip
//! the rest.
//!
//! The values read reference tables alone. They are computed once, on the
//! metadata node, when the intermediate result is (not by every shard's
//! part of the statement), and passed to it as an array parameter (see
//! [`Restriction::condition`]); more than [`MAX_VALUES`] of them lift the
//! restriction.

use super::super::single_table::{entry, own_conditions, single_table_query};
use super::{conjunction, deparse, reads_reference_tables_alone, Correlation};
use crate::error::Result;
use crate::parse_tree::contents;
use pgrx::prelude::*;
use pgrx::PgList;

/// The most values passed to an intermediate statement for one
/// restriction: the workers' statements hold them as a literal, once per
/// shard group.
pub(crate) const MAX_VALUES: i64 = 50_000;

/// The most values passed as `= ANY (array)`, which the workers' planner
/// estimates one by one in every shard's branch.
pub(crate) const FEW_VALUES: i64 = 5_000;

/// `tested IN (values)` by `operator`: the values read reference tables
/// alone.
pub(super) struct Restriction {
    /// An expression of the intermediate statement's table (its entry 1).
    tested: *mut pg_sys::Node,
    /// An equality between `tested` and a value.
    operator: *mut pg_sys::OpExpr,
    /// A query of one column.
    values: *mut pg_sys::Query,
}

/// A parameter of an intermediate statement: the query computing its
/// values (an array, and whether there are too many) and the array's type.
pub(crate) struct Values {
    pub(crate) query: String,
    pub(crate) array_type: pg_sys::Oid,
}

/// Parameters each restriction takes (see [`Restriction::condition`]).
pub(crate) const PARAMETERS_PER_RESTRICTION: usize = 4;

impl Restriction {
    /// The condition for the intermediate statement, its parameters
    /// numbered from `first`, and the values' query:
    /// `($2 OR tested = ANY ($1)) AND ($4 OR tested IN (SELECT unnest($3)))`.
    /// Up to [`FEW_VALUES`] values go in `$1` (the workers' planner sees
    /// each, and may probe an index for them), more in `$3` (a hashed
    /// subplan: estimating each value in each shard's branch would cost
    /// more than it saves); the flag of the form not used is true, both
    /// are when there are too many values.
    pub(super) unsafe fn condition(&self, first: i32) -> Option<(*mut pg_sys::Node, Values)> {
        // SAFETY: valid nodes; new nodes in the current memory context.
        unsafe {
            let targets = PgList::<pg_sys::TargetEntry>::from_pg((*self.values).targetList);
            let visible: Vec<_> = targets.iter_ptr().filter(|t| !(**t).resjunk).collect();
            let [target] = visible.as_slice() else {
                return None;
            };
            let element = pg_sys::exprType((**target).expr as *mut pg_sys::Node);
            let collation = pg_sys::exprCollation((**target).expr as *mut pg_sys::Node);
            let array_type = pg_sys::get_array_type(element);
            if array_type == pg_sys::InvalidOid {
                return None;
            }
            // The worker parses `tested = ANY (values)` again, with the
            // tested column's type and collation, and the values were made
            // DISTINCT by their type's own equality: taken only when that
            // is the comparison the statement made.
            let input = (*self.operator).inputcollid;
            let cache = pg_sys::lookup_type_cache(element, pg_sys::TYPECACHE_EQ_OPR as i32);
            if pg_sys::exprType(self.tested) != element
                || cache.is_null()
                || (*cache).eq_opr != (*self.operator).opno
                || pg_sys::exprCollation(self.tested) != input
                || collation != input
                || (input != pg_sys::InvalidOid && !pg_sys::get_collation_isdeterministic(input))
            {
                return None;
            }
            let parameter = |number: i32, ty: pg_sys::Oid| {
                let mut param = PgBox::<pg_sys::Param>::alloc_node(pg_sys::NodeTag::T_Param);
                param.paramkind = pg_sys::ParamKind::PARAM_EXTERN;
                param.paramid = number;
                param.paramtype = ty;
                param.paramtypmod = -1;
                param.paramcollid = pg_sys::InvalidOid;
                param.location = -1;
                param.into_pg() as *mut pg_sys::Node
            };
            let tested = || pg_sys::copyObjectImpl(self.tested as *const _) as *mut pg_sys::Node;
            let unless = |flag: i32, condition: *mut pg_sys::Node| {
                let mut either = PgList::<pg_sys::Node>::new();
                either.push(parameter(flag, pg_sys::BOOLOID));
                either.push(condition);
                pg_sys::makeBoolExpr(pg_sys::BoolExprType::OR_EXPR, either.into_pg(), -1)
                    as *mut pg_sys::Node
            };
            // tested = ANY ($first)
            pg_sys::set_opfuncid(self.operator);
            let mut any = PgBox::<pg_sys::ScalarArrayOpExpr>::alloc_node(
                pg_sys::NodeTag::T_ScalarArrayOpExpr,
            );
            any.opno = (*self.operator).opno;
            any.opfuncid = (*self.operator).opfuncid;
            any.useOr = true;
            any.inputcollid = (*self.operator).inputcollid;
            let mut args = PgList::<pg_sys::Node>::new();
            args.push(tested());
            args.push(parameter(first, array_type));
            any.args = args.into_pg();
            // tested IN (SELECT unnest($first + 2))
            let mut unnest = PgList::<pg_sys::Node>::new();
            unnest.push(parameter(first + 2, array_type));
            let call = pg_sys::makeFuncExpr(
                pg_sys::Oid::from(pg_sys::F_UNNEST_ANYARRAY),
                element,
                unnest.into_pg(),
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
            );
            (*call).funcretset = true;
            let mut entries = PgList::<pg_sys::TargetEntry>::new();
            let entry = pg_sys::makeTargetEntry(
                call as *mut pg_sys::Expr,
                1,
                pg_sys::pstrdup(c"v".as_ptr()),
                false,
            );
            entries.push(entry);
            let mut values = PgBox::<pg_sys::Query>::alloc_node(pg_sys::NodeTag::T_Query);
            // SELECT DISTINCT unnest($3): the values are distinct already,
            // but only so does the worker's planner count them (19,000 at
            // TPC-H q22) rather than guess 200 and probe each shard's index
            // once per value where one hash join over the shards costs less.
            if let Some(distinct) = distinct_by(element, entry) {
                values.distinctClause = distinct;
            }
            values.commandType = pg_sys::CmdType::CMD_SELECT;
            values.querySource = pg_sys::QuerySource::QSRC_ORIGINAL;
            values.canSetTag = true;
            values.hasTargetSRFs = true;
            values.targetList = entries.into_pg();
            values.jointree = pg_sys::makeFromExpr(std::ptr::null_mut(), std::ptr::null_mut());
            let mut value = PgBox::<pg_sys::Param>::alloc_node(pg_sys::NodeTag::T_Param);
            value.paramkind = pg_sys::ParamKind::PARAM_SUBLINK;
            value.paramid = 1;
            value.paramtype = element;
            value.paramtypmod = -1;
            value.paramcollid = collation;
            value.location = -1;
            let test = pg_sys::copyObjectImpl(self.operator as *const _) as *mut pg_sys::OpExpr;
            let mut args = PgList::<pg_sys::Node>::new();
            args.push(tested());
            args.push(value.into_pg() as *mut pg_sys::Node);
            (*test).args = args.into_pg();
            let mut sublink = PgBox::<pg_sys::SubLink>::alloc_node(pg_sys::NodeTag::T_SubLink);
            sublink.subLinkType = pg_sys::SubLinkType::ANY_SUBLINK;
            sublink.testexpr = test as *mut pg_sys::Node;
            sublink.subselect = values.into_pg() as *mut pg_sys::Node;
            sublink.location = -1;
            let mut both = PgList::<pg_sys::Node>::new();
            both.push(unless(first + 1, any.into_pg() as *mut pg_sys::Node));
            both.push(unless(first + 3, sublink.into_pg() as *mut pg_sys::Node));
            let condition = pg_sys::makeBoolExpr(pg_sys::BoolExprType::AND_EXPR, both.into_pg(), -1)
                as *mut pg_sys::Node;
            let query = format!(
                "SELECT pg_catalog.count(*), pg_catalog.array_agg(v) \
                 FROM (SELECT DISTINCT v FROM ({}) s(v) LIMIT {}) d",
                deparse(self.values),
                MAX_VALUES + 1
            );
            Some((condition, Values { query, array_type }))
        }
    }
}

/// A DISTINCT clause on `entry` (number 1 of its query), of type
/// `element`, by that type's default equality; None when it has none.
unsafe fn distinct_by(
    element: pg_sys::Oid,
    entry: *mut pg_sys::TargetEntry,
) -> Option<*mut pg_sys::List> {
    // SAFETY: a valid target entry; new nodes in the current context.
    unsafe {
        let mut sort = pg_sys::InvalidOid;
        let mut equality = pg_sys::InvalidOid;
        let mut hashable = false;
        pg_sys::get_sort_group_operators(
            element,
            false,
            true,
            false,
            &mut sort,
            &mut equality,
            std::ptr::null_mut(),
            &mut hashable,
        );
        if equality == pg_sys::InvalidOid {
            return None;
        }
        (*entry).ressortgroupref = 1;
        let mut clause =
            PgBox::<pg_sys::SortGroupClause>::alloc_node(pg_sys::NodeTag::T_SortGroupClause);
        clause.tleSortGroupRef = 1;
        clause.eqop = equality;
        clause.sortop = sort;
        clause.nulls_first = false;
        clause.hashable = hashable;
        let mut list = PgList::<pg_sys::SortGroupClause>::new();
        list.push(clause.into_pg());
        Some(list.into_pg())
    }
}

/// `column IN (SELECT outer expression FROM … WHERE …)`: the values the
/// comparison's outer side takes in `level`'s rows before its conjunct
/// number `excluded` (the one holding the sublink) applies, when `level`
/// reads reference tables alone (so a worker can compute them). Any
/// superset of those values keeps the sublink's answer for every row of
/// `level`: rows of the sublink's table with other values match none.
pub(super) unsafe fn outer_values(
    level: *mut pg_sys::Query,
    excluded: usize,
    correlation: &Correlation,
) -> Result<Option<Restriction>> {
    // SAFETY: a valid level; it is copied, not changed.
    unsafe {
        let l = &*level;
        if l.commandType != pg_sys::CmdType::CMD_SELECT
            || !l.setOperations.is_null()
            || !l.cteList.is_null()
            || !l.rowMarks.is_null()
            || l.hasRecursive
            || l.jointree.is_null()
        {
            return Ok(None);
        }
        let values = pg_sys::copyObjectImpl(level as *const std::ffi::c_void) as *mut pg_sys::Query;
        let outer = pg_sys::copyObjectImpl(correlation.outer as *const _) as *mut pg_sys::Node;
        crate::parse_tree::lower_outer_references(outer);
        let mut targets = PgList::<pg_sys::TargetEntry>::new();
        targets.push(pg_sys::makeTargetEntry(
            outer as *mut pg_sys::Expr,
            1,
            pg_sys::pstrdup(c"v".as_ptr()),
            false,
        ));
        let v = &mut *values;
        v.targetList = targets.into_pg();
        v.groupClause = std::ptr::null_mut();
        v.havingQual = std::ptr::null_mut();
        v.sortClause = std::ptr::null_mut();
        v.distinctClause = std::ptr::null_mut();
        v.windowClause = std::ptr::null_mut();
        v.limitCount = std::ptr::null_mut();
        v.limitOffset = std::ptr::null_mut();
        v.hasAggs = false;
        v.hasWindowFuncs = false;
        v.hasTargetSRFs = false;
        v.hasDistinctOn = false;
        let kept: Vec<*mut pg_sys::Node> = PgList::<pg_sys::Node>::from_pg(
            pg_sys::make_ands_implicit((*v.jointree).quals as *mut pg_sys::Expr),
        )
        .iter_ptr()
        .enumerate()
        .filter(|(index, _)| *index != excluded)
        .map(|(_, conjunct)| conjunct)
        .collect();
        (*v.jointree).quals = conjunction(kept);
        if !reads_reference_tables_alone(values)
            || pg_sys::contain_agg_clause(outer)
            || pg_sys::contain_window_function(outer)
        {
            return Ok(None);
        }
        match super::super::router::relation_kinds(&contents(values))? {
            Some(kinds)
                if kinds
                    .values()
                    .all(|k| *k == super::super::router::Kind::Reference) => {}
            _ => return Ok(None),
        }
        let (ty, typmod, collation) = correlation.column;
        Ok(Some(Restriction {
            tested: pg_sys::makeVar(1, correlation.attno, ty, typmod, collation, 0)
                as *mut pg_sys::Node,
            operator: correlation.operator,
            values,
        }))
    }
}

/// For a comparison with an outer column that `level`'s WHERE restricts by
/// `column IN (SELECT … FROM reference tables)`: the same restriction on
/// the sublink's column, for the intermediate statement.
pub(super) unsafe fn in_restriction(
    level: *mut pg_sys::Query,
    correlation: &Correlation,
) -> Option<Restriction> {
    // SAFETY: valid trees; the sublink found is not changed.
    unsafe {
        let outer = super::super::partition_key::strip_relabel(correlation.outer);
        if (*outer).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let outer = outer as *mut pg_sys::Var;
        if (*outer).varlevelsup != 1 || (*outer).vartype != correlation.column.0 {
            return None;
        }
        let conditions = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
            (*(*level).jointree).quals as *mut pg_sys::Expr,
        ));
        for condition in conditions.iter_ptr() {
            if (*condition).type_ != pg_sys::NodeTag::T_SubLink {
                continue;
            }
            let sublink = condition as *mut pg_sys::SubLink;
            if (*sublink).subLinkType != pg_sys::SubLinkType::ANY_SUBLINK
                || (*(*sublink).testexpr).type_ != pg_sys::NodeTag::T_OpExpr
            {
                continue;
            }
            let test = (*sublink).testexpr as *mut pg_sys::OpExpr;
            let args = PgList::<pg_sys::Node>::from_pg((*test).args);
            let Some(tested) = args.get_ptr(0) else {
                continue;
            };
            let tested = super::super::partition_key::strip_relabel(tested);
            if args.len() != 2
                || (*tested).type_ != pg_sys::NodeTag::T_Var
                || (*(tested as *mut pg_sys::Var)).varlevelsup != 0
                || (*(tested as *mut pg_sys::Var)).varno != (*outer).varno
                || (*(tested as *mut pg_sys::Var)).varattno != (*outer).varattno
                || !reads_reference_tables_alone((*sublink).subselect as *mut pg_sys::Query)
            {
                continue;
            }
            let (ty, typmod, collation) = correlation.column;
            return Some(Restriction {
                tested: pg_sys::makeVar(1, correlation.attno, ty, typmod, collation, 0)
                    as *mut pg_sys::Node,
                operator: test,
                values: (*sublink).subselect as *mut pg_sys::Query,
            });
        }
        None
    }
}

/// `tested IN (SELECT column FROM table WHERE …)` by `operator` (the
/// column type's equality): the values that `column` (of `level`, a column
/// of a reference table its FROM list names) takes in `level`'s rows, as
/// far as the level's plain conditions on that table alone say. None
/// without such a condition (the whole table would restrict little, and
/// cost a scan of it per shard).
pub(super) unsafe fn reference_values(
    level: *mut pg_sys::Query,
    column: *mut pg_sys::Var,
    operator: *mut pg_sys::OpExpr,
    tested: *mut pg_sys::Node,
) -> Result<Option<Restriction>> {
    // SAFETY: a valid level; what is taken from it is copied.
    unsafe {
        let varno = (*column).varno;
        if (*column).varlevelsup != 0 || (*column).varattno <= 0 {
            return Ok(None);
        }
        let Some(rte) = entry(level, varno) else {
            return Ok(None);
        };
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
            || !(*rte).tablesample.is_null()
            || !crate::metadata::shard_lookup::is_reference_table((*rte).relid)?
        {
            return Ok(None);
        }
        let Some(conditions) = own_conditions(level, varno, true) else {
            return Ok(None);
        };
        if conditions.is_empty() {
            return Ok(None);
        }
        let values = single_table_query(level, varno, conditions, vec![column as *mut _]);
        Ok(Some(Restriction {
            tested,
            operator,
            values,
        }))
    }
}

/// `restrictions` as conditions of one intermediate statement (parameters
/// numbered in order), with their values' queries; one that cannot be
/// passed so is left out (it only ever narrows).
pub(super) unsafe fn conditions(
    restrictions: Vec<Restriction>,
) -> (Vec<*mut pg_sys::Node>, Vec<Values>) {
    let mut conditions = Vec::new();
    let mut parameters = Vec::new();
    for restriction in restrictions {
        let first = (PARAMETERS_PER_RESTRICTION * parameters.len()) as i32 + 1;
        // SAFETY: restrictions built from valid trees.
        if let Some((condition, values)) = unsafe { restriction.condition(first) } {
            conditions.push(condition);
            parameters.push(values);
        }
    }
    (conditions, parameters)
}
