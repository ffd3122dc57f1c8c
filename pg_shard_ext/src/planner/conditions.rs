//! The keyspace conditions: beside each condition on a distribution column
//! the matching condition on the partition key, in WHERE and JOIN … ON, in
//! subqueries and CTEs too (the rules are in [`super`]'s overview); and the
//! refusal of updates of the distribution column.

use super::partition_key::{
    array_keyspace_call, column_keyspace_call, is_distribution_column, keyspace_call,
    lookup_function, partition_key, range_table_entry, strip_relabel, NTH_KEYSPACE_FUNCTION,
};
use crate::keyspace::key_encoding_of;
use pgrx::prelude::*;
use pgrx::PgList;

/// `int8 = int8`.
pub(super) const INT8_EQUAL_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(410);

/// `int8 < int8`.
pub(super) const INT8_LESS_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(412);

/// `int8 <= int8`.
pub(super) const INT8_LESS_EQUAL_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(414);

/// `int8 >= int8`.
pub(super) const INT8_GREATER_EQUAL_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(415);

// Not among pgrx's bindings (pg_inherits.h).
unsafe extern "C-unwind" {
    fn find_inheritance_children(parent: pg_sys::Oid, lock_mode: i32) -> *mut pg_sys::List;
}

/// A row whose key changes would have to move to another shard, which is
/// not supported yet: say so, rather than let the old shard refuse the new
/// key with WrongShard (which tells routers to retry).
unsafe fn refuse_key_update(query: *mut pg_sys::Query) {
    // SAFETY: a valid Query; resultRelation indexes its range table and the
    // target list holds TargetEntry nodes.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_UPDATE || (*query).resultRelation < 1 {
            return;
        }
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        let Some(rte) = rtable.get_ptr((*query).resultRelation as usize - 1) else {
            return;
        };
        if (*rte).relkind != pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char {
            return;
        }
        let Some((_, key)) = partition_key((*rte).relid) else {
            return;
        };
        let targets = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
        if targets
            .iter_ptr()
            .any(|t| !(*t).resjunk && (*t).resno == key)
        {
            crate::error::ShardError::KeyUpdate.report();
        }
    }
}

pub(super) unsafe fn rewrite_query(query: *mut pg_sys::Query) {
    // SAFETY: see has_partitioned_relation; quals are replaced by new nodes.
    unsafe {
        // Also in CTEs: `WITH u AS (UPDATE … SET key = …)` must be refused too.
        refuse_key_update(query);
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        for rte in rtable.iter_ptr() {
            if (*rte).rtekind == pg_sys::RTEKind::RTE_SUBQUERY && !(*rte).subquery.is_null() {
                rewrite_query((*rte).subquery);
            }
        }
        for cte in PgList::<pg_sys::CommonTableExpr>::from_pg((*query).cteList).iter_ptr() {
            let inner = (*cte).ctequery as *mut pg_sys::Query;
            if !inner.is_null() && (*inner).type_ == pg_sys::NodeTag::T_Query {
                rewrite_query(inner);
            }
        }
        let jointree = (*query).jointree;
        if jointree.is_null() {
            return;
        }
        (*jointree).quals = with_keyspace_conditions(query, (*jointree).quals);
        for item in PgList::<pg_sys::Node>::from_pg((*jointree).fromlist).iter_ptr() {
            rewrite_join(query, item);
        }
    }
}

unsafe fn rewrite_join(query: *mut pg_sys::Query, node: *mut pg_sys::Node) {
    // SAFETY: nodes of a from-list are RangeTblRef, JoinExpr or FromExpr.
    unsafe {
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_JoinExpr {
            return;
        }
        let join = node as *mut pg_sys::JoinExpr;
        (*join).quals = with_keyspace_conditions(query, (*join).quals);
        rewrite_join(query, (*join).larg);
        rewrite_join(query, (*join).rarg);
    }
}

/// `quals` AND the keyspace conditions derived from its conjuncts.
unsafe fn with_keyspace_conditions(
    query: *mut pg_sys::Query,
    quals: *mut pg_sys::Node,
) -> *mut pg_sys::Node {
    if quals.is_null() {
        return quals;
    }
    // SAFETY: quals is a valid expression tree of `query`.
    unsafe {
        let conjuncts: Vec<*mut pg_sys::Node> = if is_and(quals) {
            PgList::<pg_sys::Node>::from_pg((*(quals as *mut pg_sys::BoolExpr)).args)
                .iter_ptr()
                .collect()
        } else {
            vec![quals]
        };
        let derived: Vec<*mut pg_sys::Node> = conjuncts
            .iter()
            .filter_map(|&conjunct| keyspace_condition(query, conjunct))
            .collect();
        if derived.is_empty() {
            return quals;
        }
        let mut all = PgList::<pg_sys::Node>::new();
        for node in conjuncts.into_iter().chain(derived) {
            all.push(node);
        }
        pg_sys::make_andclause(all.into_pg()) as *mut pg_sys::Node
    }
}

unsafe fn is_and(node: *mut pg_sys::Node) -> bool {
    // SAFETY: reading the tag of a valid node.
    unsafe {
        (*node).type_ == pg_sys::NodeTag::T_BoolExpr
            && (*(node as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR
    }
}

/// The keyspace condition implied by `conjunct`, if it is an equality or IN
/// list on a distribution column.
unsafe fn keyspace_condition(
    query: *mut pg_sys::Query,
    conjunct: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: conjunct is a valid expression node.
    unsafe {
        match (*conjunct).type_ {
            pg_sys::NodeTag::T_OpExpr => {
                let op = conjunct as *mut pg_sys::OpExpr;
                if !is_key_equality((*op).opno, (*op).inputcollid) {
                    return None;
                }
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                let (left, right) = (args.get_ptr(0)?, args.get_ptr(1)?);
                let (left_is_key, right_is_key) = (
                    is_distribution_column(query, left),
                    is_distribution_column(query, right),
                );
                if !left_is_key && !right_is_key {
                    // `id = value` on a column of self-routing ids, or
                    // `column = value` on a looked-up column.
                    return super::routing_ids::condition(query, left, right)
                        .or_else(|| super::lookup_pruning::condition(query, left, right));
                }
                let (column, value, value_is_column) = match (left_is_key, right_is_key) {
                    // Equal keys have equal keyspace ids: a join on the
                    // distribution columns implies one on the partition keys,
                    // which lets a condition on one side prune the other and
                    // co-located tables join shard by shard.
                    (true, true) if same_encoding(left, right) => (left, right, true),
                    (true, _) if usable_value(left, right) => (left, right, false),
                    (_, true) if usable_value(right, left) => (right, left, false),
                    _ => return None,
                };
                let value_call = if value_is_column {
                    column_keyspace_call(query, value)?
                } else {
                    keyspace_call(value)?
                };
                Some(int8_comparison(
                    INT8_EQUAL_OPERATOR,
                    column_keyspace_call(query, column)?,
                    value_call,
                ))
            }
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                let saop = conjunct as *mut pg_sys::ScalarArrayOpExpr;
                if !(*saop).useOr || !is_key_equality((*saop).opno, (*saop).inputcollid) {
                    return None;
                }
                let args = PgList::<pg_sys::Node>::from_pg((*saop).args);
                let (column, array) = (args.get_ptr(0)?, args.get_ptr(1)?);
                if !is_distribution_column(query, column) {
                    return None;
                }
                if (*array).type_ == pg_sys::NodeTag::T_Const {
                    // A constant array: its keyspace ids fold to a constant.
                    if !usable_array(column, array) {
                        return None;
                    }
                    let ids = array_keyspace_call(array)?;
                    return Some(equals_any(column_keyspace_call(query, column)?, ids));
                }
                if (*array).type_ != pg_sys::NodeTag::T_ArrayExpr {
                    // `key = ANY($1)`: known only when the plan starts.
                    if !usable_array(column, array) {
                        return None;
                    }
                    return any_of_array_value(query, column, array);
                }
                if (*(array as *mut pg_sys::ArrayExpr)).multidims {
                    return None;
                }
                let mut ids = PgList::<pg_sys::Node>::new();
                let elements =
                    PgList::<pg_sys::Node>::from_pg((*(array as *mut pg_sys::ArrayExpr)).elements);
                for element in elements.iter_ptr() {
                    if !usable_value(column, element) {
                        return None;
                    }
                    ids.push(keyspace_call(element)?);
                }
                Some(equals_any(
                    column_keyspace_call(query, column)?,
                    int8_array(ids),
                ))
            }
            _ => None,
        }
    }
}

/// `left <operator> right` for a bigint comparison operator.
pub(super) unsafe fn int8_comparison(
    operator: pg_sys::Oid,
    left: *mut pg_sys::Node,
    right: *mut pg_sys::Node,
) -> *mut pg_sys::Node {
    // SAFETY: both are valid bigint expressions; the node is built new.
    unsafe {
        pg_sys::make_opclause(
            operator,
            pg_sys::BOOLOID,
            false,
            left as *mut pg_sys::Expr,
            right as *mut pg_sys::Expr,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
        ) as *mut pg_sys::Node
    }
}

/// Most shards a `key = ANY($1)` condition lists one by one; keys of
/// further shards are covered by a range (correct, less pruning).
const MOST_LISTED_SHARDS: i32 = 256;

/// The keyspace condition for `key = ANY(array)` where the array is known
/// only when the plan starts (a parameter of a generic plan):
///
/// `keyspace_id(key) = ANY (ARRAY[nth(array, 1), …, nth(array, S)])
///  OR keyspace_id(key) >= nth(array, S + 1)`
///
/// with `nth` = pg_shard.nth_keyspace_id and S the table's shard count.
/// PostgreSQL prunes partitions at plan start with a list of single values
/// but not with an array value; since keys of at most S shards can match,
/// listing S ids (NULL past the array's distinct ids) is exact, and the
/// range after them keeps the condition implied when the array has more.
unsafe fn any_of_array_value(
    query: *mut pg_sys::Query,
    column: *mut pg_sys::Node,
    array: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    let function = lookup_function(
        &NTH_KEYSPACE_FUNCTION,
        "pg_shard.nth_keyspace_id(anyarray, integer)",
    )?;
    // SAFETY: column is a Var of a distributed table (checked by the
    // caller); array is a valid expression, copied into every call.
    unsafe { listed_or_above(query, column, |n| nth_call(function, &[array], n)) }
}

/// `function(args…, n)` returning bigint (the args copied).
///
/// # Safety
/// `args` are valid expressions of the function's argument types.
pub(super) unsafe fn nth_call(
    function: pg_sys::Oid,
    args: &[*mut pg_sys::Node],
    n: i32,
) -> *mut pg_sys::Node {
    // SAFETY: as the function's; the nodes are built new.
    unsafe {
        let mut list = PgList::<pg_sys::Node>::new();
        for arg in args {
            list.push(pg_sys::copyObjectImpl(*arg as *const std::ffi::c_void) as *mut pg_sys::Node);
        }
        list.push(pg_sys::makeConst(
            pg_sys::INT4OID,
            -1,
            pg_sys::InvalidOid,
            4,
            pg_sys::Datum::from(n),
            false,
            true,
        ) as *mut pg_sys::Node);
        pg_sys::makeFuncExpr(
            function,
            pg_sys::INT8OID,
            list.into_pg(),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        ) as *mut pg_sys::Node
    }
}

/// `keyspace_id(key) = ANY (ARRAY[nth(1), …, nth(S)])
/// OR keyspace_id(key) >= nth(S + 1)` for the table of `column` (S its
/// shard count): the keyspace ids a value known when the plan starts
/// gives, as a list PostgreSQL prunes partitions with then.
///
/// # Safety
/// `column` is a Var of a distributed table of `query`.
pub(super) unsafe fn listed_or_above(
    query: *mut pg_sys::Query,
    column: *mut pg_sys::Node,
    nth: impl Fn(i32) -> *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: as the function's.
    unsafe {
        let var = strip_relabel(column) as *mut pg_sys::Var;
        let relid = (*range_table_entry(query, (*var).varno)?).relid;
        let shards = pg_sys::list_length(find_inheritance_children(relid, pg_sys::NoLock as i32))
            .clamp(1, MOST_LISTED_SHARDS);
        let mut listed_ids = PgList::<pg_sys::Node>::new();
        for n in 1..=shards {
            listed_ids.push(nth(n));
        }
        let listed = equals_any(column_keyspace_call(query, column)?, int8_array(listed_ids));
        let rest = pg_sys::make_opclause(
            INT8_GREATER_EQUAL_OPERATOR,
            pg_sys::BOOLOID,
            false,
            column_keyspace_call(query, column)? as *mut pg_sys::Expr,
            nth(shards + 1) as *mut pg_sys::Expr,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
        ) as *mut pg_sys::Node;
        let mut arms = PgList::<pg_sys::Node>::new();
        arms.push(listed);
        arms.push(rest);
        Some(
            pg_sys::makeBoolExpr(pg_sys::BoolExprType::OR_EXPR, arms.into_pg(), -1)
                as *mut pg_sys::Node,
        )
    }
}

/// `ARRAY[ids…]` over int8.
unsafe fn int8_array(ids: PgList<pg_sys::Node>) -> *mut pg_sys::Node {
    // SAFETY: builds a new node from valid int8 expression nodes.
    unsafe {
        let mut id_array = PgBox::<pg_sys::ArrayExpr>::alloc_node(pg_sys::NodeTag::T_ArrayExpr);
        id_array.array_typeid = pg_sys::INT8ARRAYOID;
        id_array.element_typeid = pg_sys::INT8OID;
        id_array.elements = ids.into_pg();
        id_array.location = -1;
        id_array.into_pg() as *mut pg_sys::Node
    }
}

/// `key_id = ANY (ids)` over int8.
unsafe fn equals_any(key_id: *mut pg_sys::Node, ids: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: builds a new node from valid expression nodes.
    unsafe {
        let mut condition =
            PgBox::<pg_sys::ScalarArrayOpExpr>::alloc_node(pg_sys::NodeTag::T_ScalarArrayOpExpr);
        condition.opno = INT8_EQUAL_OPERATOR;
        condition.useOr = true;
        let mut args = PgList::<pg_sys::Node>::new();
        args.push(key_id);
        args.push(ids);
        condition.args = args.into_pg();
        condition.location = -1;
        condition.into_pg() as *mut pg_sys::Node
    }
}

/// An `=` operator whose collation (if any) is deterministic: equal values
/// then have equal bytes, hence equal keyspace ids.
pub(super) unsafe fn is_key_equality(opno: pg_sys::Oid, input_collation: pg_sys::Oid) -> bool {
    // PostgreSQL's own equality operators of the key types (pg_operator.dat):
    // a user-defined `=` elsewhere on the search_path could mean something
    // else. Integer widths: 94, 96, 410 and the cross-width 15, 416, 532,
    // 533, 1862, 1868; text (also varchar) 98; bytea 1955; uuid 2972.
    const BUILTIN_KEY_EQUALITIES: [u32; 12] =
        [15, 94, 96, 98, 410, 416, 532, 533, 1862, 1868, 1955, 2972];
    BUILTIN_KEY_EQUALITIES.contains(&opno.to_u32()) && deterministic(input_collation)
}

/// No collation, or one under which equal strings have equal bytes.
pub(super) fn deterministic(collation: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup of the collation.
    collation == pg_sys::InvalidOid || unsafe { pg_sys::get_collation_isdeterministic(collation) }
}

/// Whether values of two types hash alike.
pub(super) fn same_key_types(a: pg_sys::Oid, b: pg_sys::Oid) -> bool {
    matches!((key_encoding_of(a), key_encoding_of(b)), (Some(x), Some(y)) if x == y)
}

/// Whether two expressions' types hash alike.
unsafe fn same_encoding(a: *mut pg_sys::Node, b: *mut pg_sys::Node) -> bool {
    // SAFETY: both are valid expression nodes.
    unsafe { same_key_types(pg_sys::exprType(a), pg_sys::exprType(b)) }
}

/// An expression with one value per execution: no column of this query
/// level, nothing volatile, no set-returning function, no subquery.
unsafe fn fixed_per_execution(expr: *mut pg_sys::Node) -> bool {
    // SAFETY: expr is a valid expression node.
    unsafe {
        !pg_sys::contain_vars_of_level(expr, 0)
            && !pg_sys::contain_volatile_functions(expr)
            && !pg_sys::expression_returns_set(expr)
            && !pg_sys::contain_subplans(expr)
    }
}

/// A value usable beside `column`: it hashes like the column and is fixed
/// per execution.
pub(super) unsafe fn usable_value(column: *mut pg_sys::Node, value: *mut pg_sys::Node) -> bool {
    // SAFETY: both are valid expression nodes.
    unsafe { same_encoding(column, value) && fixed_per_execution(value) }
}

/// An array usable beside `column`: its elements hash like the column and
/// it is fixed per execution.
unsafe fn usable_array(column: *mut pg_sys::Node, array: *mut pg_sys::Node) -> bool {
    // SAFETY: both are valid expression nodes.
    unsafe {
        let element_type = pg_sys::get_element_type(pg_sys::exprType(array));
        same_key_types(pg_sys::exprType(column), element_type) && fixed_per_execution(array)
    }
}
