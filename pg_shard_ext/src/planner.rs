//! The metadata node's planner hook: shard pruning for keys.
//!
//! A distributed table is partitioned by `pg_shard.keyspace_id(key)`, so
//! PostgreSQL prunes partitions only for conditions on that expression. The
//! hook finds conditions on the distribution column itself and adds the
//! matching condition on the partition key beside them:
//!
//! * `key = <expr>`  →  `keyspace_id(key) = keyspace_id(<expr>)`
//! * `key IN (a, b)` →  `keyspace_id(key) = ANY (ARRAY[keyspace_id(a), keyspace_id(b)])`
//! * `key = ANY(const)` →  `keyspace_id(key) = ANY (keyspace_ids(const))`
//! * `key = ANY($1)` →  one keyspace id per shard picked from the array when
//!   the plan starts (see [`any_of_array_value`])
//!
//! where `<expr>` refers to no column of the same query level and is not
//! volatile. Constants fold at plan time (plan-time pruning); parameters of a
//! generic plan are evaluated when it starts (run-time pruning). The added
//! condition is implied by the one it stands beside, so results never change.
//! Conditions in WHERE and in every JOIN … ON are handled, in subqueries in
//! FROM and in CTEs too.

use crate::keyspace::key_encoding_of;
use pgrx::prelude::*;
use pgrx::PgList;
use std::cell::Cell;
use std::ffi::CStr;

/// `int8 = int8`.
const INT8_EQUAL_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(410);
/// `int8 < int8`.
const INT8_LESS_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(412);
/// `int8 >= int8`.
const INT8_GREATER_EQUAL_OPERATOR: pg_sys::Oid = pg_sys::Oid::from_u32(415);

static mut PREVIOUS_PLANNER: pg_sys::planner_hook_type = None;

// Declared here rather than taken from pgrx::pg_sys, whose bindings turn a
// PostgreSQL error into a Rust panic: an error while planning must travel
// to PostgreSQL's handler as an error, with its own SQLSTATE.
unsafe extern "C-unwind" {
    #[link_name = "standard_planner"]
    fn postgres_standard_planner(
        parse: *mut pg_sys::Query,
        query_string: *const std::ffi::c_char,
        cursor_options: i32,
        bound_params: pg_sys::ParamListInfo,
    ) -> *mut pg_sys::PlannedStmt;
    // Not among pgrx's bindings (pg_inherits.h).
    fn find_inheritance_children(parent: pg_sys::Oid, lock_mode: i32) -> *mut pg_sys::List;
}

thread_local! {
    static KEYSPACE_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static KEYSPACES_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static NTH_KEYSPACE_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    // Set while the hook reads the catalog, whose own queries are planned too.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Marks the hook busy while it reads the catalog; unmarks even when the
/// read fails (the error unwinds through here as a Rust panic).
struct Busy;

impl Busy {
    fn start() -> Busy {
        BUSY.set(true);
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.set(false);
    }
}

pub fn install() {
    // SAFETY: called once from _PG_init, before any planning with the library loaded.
    unsafe {
        PREVIOUS_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(plan);
    }
}

/// Forget cached catalog facts (called on every relcache invalidation).
pub fn forget_cache() {
    // The extension may have been dropped and created again.
    KEYSPACE_FUNCTION.set(pg_sys::InvalidOid);
    KEYSPACES_FUNCTION.set(pg_sys::InvalidOid);
    NTH_KEYSPACE_FUNCTION.set(pg_sys::InvalidOid);
}

/// # Safety
/// Called by PostgreSQL's planner entry point with a valid parse tree.
unsafe extern "C-unwind" fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    let rewrite = if BUSY.get() {
        Rewrite::default()
    } else {
        // SAFETY: parse is the tree about to be planned; the rewrite only adds
        // nodes allocated in the current memory context.
        unsafe { pg_sys::panic::pgrx_extern_c_guard(|| add_keyspace_conditions(parse)) }
    };
    // Shard-by-shard joins (pushed down to the workers when postgres_fdw can)
    // for statements on distributed tables, and shard-by-shard aggregates
    // when they group by a distribution column (whole aggregates pushed
    // down; PostgreSQL 15 cannot push partial ones, and a partitionwise plan
    // would then lose the concurrent scans). Set as a function's SET clause
    // would: only while planning.
    let settings_level = if rewrite.distributed {
        // SAFETY: a new GUC nest level, undone below or by transaction abort.
        unsafe {
            pg_sys::panic::pgrx_extern_c_guard(|| enable_partitionwise(rewrite.grouped_by_key))
        }
    } else {
        None
    };
    // SAFETY: chaining with the arguments we were given; errors raised in
    // planning longjmp through this frame, which owns nothing.
    let planned = unsafe {
        match PREVIOUS_PLANNER {
            Some(previous) => previous(parse, query_string, cursor_options, bound_params),
            None => postgres_standard_planner(parse, query_string, cursor_options, bound_params),
        }
    };
    if let Some(level) = settings_level {
        // SAFETY: pops the nest level pushed by enable_partitionwise.
        unsafe { pg_sys::panic::pgrx_extern_c_guard(|| pg_sys::AtEOXact_GUC(true, level)) };
    }
    planned
}

fn enable_partitionwise(aggregates: bool) -> Option<i32> {
    let mut names = vec![c"enable_partitionwise_join"];
    if aggregates {
        names.push(c"enable_partitionwise_aggregate");
    }
    // SAFETY: plain GUC API use; values are static C strings.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for name in names {
            pg_sys::set_config_option(
                name.as_ptr(),
                c"on".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        Some(level)
    }
}

/// What the rewrite found.
#[derive(Default)]
struct Rewrite {
    /// The statement involves partitioned tables in a database with pg_shard
    /// (a distributed table, most likely).
    distributed: bool,
    /// Its top level groups by a distribution column.
    grouped_by_key: bool,
}

fn add_keyspace_conditions(query: *mut pg_sys::Query) -> Rewrite {
    // SAFETY: walking a valid parse tree.
    if !unsafe { has_partitioned_relation(query) } {
        return Rewrite::default();
    }
    // SAFETY: get_namespace_oid is a syscache lookup; databases without the
    // extension have no distributed tables.
    let installed =
        unsafe { pg_sys::get_namespace_oid(c"pg_shard".as_ptr(), true) } != pg_sys::InvalidOid;
    if installed {
        // SAFETY: as above.
        unsafe {
            rewrite_query(query);
            return Rewrite {
                distributed: true,
                grouped_by_key: group_by_keyspace(query),
            };
        }
    }
    Rewrite::default()
}

/// GROUP BY a distribution column also groups by its keyspace id, which is
/// the partition key: adding it changes no group, and lets PostgreSQL
/// aggregate shard by shard and postgres_fdw push whole aggregates down to
/// the workers (with enable_partitionwise_aggregate). Top-level SELECTs only,
/// without grouping sets.
unsafe fn group_by_keyspace(query: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid Query; group clauses refer to target entries by
    // ressortgroupref; new nodes are allocated in the current context.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_SELECT
            || (*query).groupClause.is_null()
            || !(*query).groupingSets.is_null()
            || !(*query).setOperations.is_null()
        {
            return false;
        }
        let mut targets = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
        let mut groups = PgList::<pg_sys::SortGroupClause>::from_pg((*query).groupClause);
        let grouped_keys: Vec<*mut pg_sys::Node> = groups
            .iter_ptr()
            .filter_map(|group| {
                targets
                    .iter_ptr()
                    .find(|t| (**t).ressortgroupref == (*group).tleSortGroupRef)
                    .map(|t| (*t).expr as *mut pg_sys::Node)
            })
            .filter(|&expr| {
                !expr.is_null()
                    && is_distribution_column(query, expr)
                    && deterministic(pg_sys::exprCollation(expr))
            })
            .collect();
        let grouped = !grouped_keys.is_empty();
        let mut next_ref = targets
            .iter_ptr()
            .map(|t| (*t).ressortgroupref)
            .max()
            .unwrap_or(0);
        for key in grouped_keys {
            let Some(keyspace) = column_keyspace_call(query, key) else {
                return false;
            };
            next_ref += 1;
            let entry = pg_sys::makeTargetEntry(
                keyspace as *mut pg_sys::Expr,
                (targets.len() + 1) as pg_sys::AttrNumber,
                std::ptr::null_mut(),
                true,
            );
            (*entry).ressortgroupref = next_ref;
            targets.push(entry);
            let mut group =
                PgBox::<pg_sys::SortGroupClause>::alloc_node(pg_sys::NodeTag::T_SortGroupClause);
            group.tleSortGroupRef = next_ref;
            group.eqop = INT8_EQUAL_OPERATOR;
            group.sortop = INT8_LESS_OPERATOR;
            group.nulls_first = false;
            group.hashable = true;
            groups.push(group.into_pg());
        }
        (*query).targetList = targets.into_pg();
        (*query).groupClause = groups.into_pg();
        grouped
    }
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

/// Cheap pre-check: distributed tables are partitioned tables.
unsafe fn has_partitioned_relation(query: *mut pg_sys::Query) -> bool {
    // SAFETY: the range table of a valid Query is a list of RangeTblEntry,
    // and subquery and CTE queries are valid Queries.
    unsafe {
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        let in_rtable = rtable.iter_ptr().any(|rte| match (*rte).rtekind {
            pg_sys::RTEKind::RTE_RELATION => {
                (*rte).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
                    && partition_key((*rte).relid).is_some()
            }
            pg_sys::RTEKind::RTE_SUBQUERY => {
                !(*rte).subquery.is_null() && has_partitioned_relation((*rte).subquery)
            }
            _ => false,
        });
        in_rtable
            || PgList::<pg_sys::CommonTableExpr>::from_pg((*query).cteList)
                .iter_ptr()
                .any(|cte| {
                    let inner = (*cte).ctequery as *mut pg_sys::Query;
                    !inner.is_null()
                        && (*inner).type_ == pg_sys::NodeTag::T_Query
                        && has_partitioned_relation(inner)
                })
    }
}

unsafe fn rewrite_query(query: *mut pg_sys::Query) {
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
                let (column, value, value_is_column) = match (
                    is_distribution_column(query, left),
                    is_distribution_column(query, right),
                ) {
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
                Some(pg_sys::make_opclause(
                    INT8_EQUAL_OPERATOR,
                    pg_sys::BOOLOID,
                    false,
                    column_keyspace_call(query, column)? as *mut pg_sys::Expr,
                    value_call as *mut pg_sys::Expr,
                    pg_sys::InvalidOid,
                    pg_sys::InvalidOid,
                ) as *mut pg_sys::Node)
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
    // SAFETY: column is a Var of a distributed table (checked by the
    // caller); array is a valid expression, copied into every call.
    unsafe {
        let var = strip_relabel(column) as *mut pg_sys::Var;
        let relid = (*range_table_entry(query, (*var).varno)?).relid;
        let shards = pg_sys::list_length(find_inheritance_children(relid, pg_sys::NoLock as i32))
            .clamp(1, MOST_LISTED_SHARDS);
        let function = lookup_function(
            &NTH_KEYSPACE_FUNCTION,
            "pg_shard.nth_keyspace_id(anyarray, integer)",
        )?;
        let nth = |n: i32| {
            let mut args = PgList::<pg_sys::Node>::new();
            args.push(pg_sys::copyObjectImpl(array as *const std::ffi::c_void) as *mut pg_sys::Node);
            args.push(pg_sys::makeConst(
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
                args.into_pg(),
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
            ) as *mut pg_sys::Node
        };
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
unsafe fn is_key_equality(opno: pg_sys::Oid, input_collation: pg_sys::Oid) -> bool {
    // PostgreSQL's own equality operators of the key types (pg_operator.dat):
    // a user-defined `=` elsewhere on the search_path could mean something
    // else. Integer widths: 94, 96, 410 and the cross-width 15, 416, 532,
    // 533, 1862, 1868; text (also varchar) 98; bytea 1955; uuid 2972.
    const BUILTIN_KEY_EQUALITIES: [u32; 12] =
        [15, 94, 96, 98, 410, 416, 532, 533, 1862, 1868, 1955, 2972];
    BUILTIN_KEY_EQUALITIES.contains(&opno.to_u32()) && deterministic(input_collation)
}

/// No collation, or one under which equal strings have equal bytes.
fn deterministic(collation: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup of the collation.
    collation == pg_sys::InvalidOid || unsafe { pg_sys::get_collation_isdeterministic(collation) }
}

/// Whether values of two types hash alike.
fn same_key_types(a: pg_sys::Oid, b: pg_sys::Oid) -> bool {
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
unsafe fn usable_value(column: *mut pg_sys::Node, value: *mut pg_sys::Node) -> bool {
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

/// Whether `node` is a plain column reference (this query level) to the
/// distribution column of a distributed table.
unsafe fn is_distribution_column(query: *mut pg_sys::Query, node: *mut pg_sys::Node) -> bool {
    // SAFETY: node is a valid expression; a Var's varno indexes the range table.
    unsafe {
        let node = strip_relabel(node);
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_Var {
            return false;
        }
        let var = node as *mut pg_sys::Var;
        if (*var).varlevelsup != 0 {
            return false;
        }
        let Some(rte) = range_table_entry(query, (*var).varno) else {
            return false;
        };
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
            || (*rte).relkind != pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
        {
            return false;
        }
        partition_key((*rte).relid).map(|(_, attno)| attno) == Some((*var).varattno)
    }
}

/// Attribute number of pg_partitioned_table.partexprs.
const ANUM_PARTEXPRS: i16 = 8;

/// The partition key of `relid` if it is a distributed table: a single
/// `pg_shard.keyspace_id(column)` expression (freshly read, the caller may
/// modify it) and the column's attribute number. Read from the syscache, so
/// it needs no privileges, no SPI, and is never stale.
fn partition_key(relid: pg_sys::Oid) -> Option<(*mut pg_sys::Node, i16)> {
    // SAFETY: syscache lookup and release; the stored expression text is
    // parsed into a new node tree in the current memory context.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PARTRELID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return None;
        }
        let mut is_null = false;
        let text = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::PARTRELID as i32,
            tuple,
            ANUM_PARTEXPRS,
            &mut is_null,
        );
        let expressions = if is_null {
            std::ptr::null_mut()
        } else {
            let string = pg_sys::text_to_cstring(text.cast_mut_ptr());
            pg_sys::stringToNode(string) as *mut pg_sys::List
        };
        pg_sys::ReleaseSysCache(tuple);
        let expressions = PgList::<pg_sys::Node>::from_pg(expressions);
        if expressions.len() != 1 {
            return None;
        }
        let key = expressions.get_ptr(0)?;
        if (*key).type_ != pg_sys::NodeTag::T_FuncExpr || !is_keyspace_function(key) {
            return None;
        }
        let var = key_column_var(key)?;
        Some((key, (*var).varattno))
    }
}

/// Whether a FuncExpr calls one of pg_shard's keyspace_id functions.
unsafe fn is_keyspace_function(node: *mut pg_sys::Node) -> bool {
    // SAFETY: node is a FuncExpr; the lookups read the syscache.
    unsafe {
        let funcid = (*(node as *mut pg_sys::FuncExpr)).funcid;
        let name = pg_sys::get_func_name(funcid);
        let namespace = pg_sys::get_func_namespace(funcid);
        let schema = pg_sys::get_namespace_name(namespace);
        !name.is_null()
            && !schema.is_null()
            && CStr::from_ptr(name).to_bytes() == b"keyspace_id"
            && CStr::from_ptr(schema).to_bytes() == b"pg_shard"
    }
}

/// The column inside a partition key `keyspace_id(column)` (possibly
/// relabelled, as varchar is to text).
unsafe fn key_column_var(key: *mut pg_sys::Node) -> Option<*mut pg_sys::Var> {
    // SAFETY: key is a FuncExpr with one argument.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg((*(key as *mut pg_sys::FuncExpr)).args);
        let arg = strip_relabel(args.get_ptr(0)?);
        ((*arg).type_ == pg_sys::NodeTag::T_Var).then_some(arg as *mut pg_sys::Var)
    }
}

unsafe fn strip_relabel(mut node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: walking RelabelType nodes of a valid expression.
    unsafe {
        while !node.is_null() && (*node).type_ == pg_sys::NodeTag::T_RelabelType {
            node = (*(node as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node;
        }
        node
    }
}

/// The partition key expression of the distributed table behind `column`
/// (a Var of this query level), pointed at that Var's range table entry:
/// exactly the expression partition pruning and partitionwise planning
/// look for.
unsafe fn column_keyspace_call(
    query: *mut pg_sys::Query,
    column: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: column is a Var (possibly relabelled) checked by is_distribution_column.
    unsafe {
        let var = strip_relabel(column) as *mut pg_sys::Var;
        let rte = range_table_entry(query, (*var).varno)?;
        let (key, _) = partition_key((*rte).relid)?;
        let key_var = key_column_var(key)?;
        (*key_var).varno = (*var).varno;
        (*key_var).varnosyn = (*var).varnosyn;
        (*key_var).varlevelsup = 0;
        Some(key)
    }
}

unsafe fn range_table_entry(
    query: *mut pg_sys::Query,
    varno: i32,
) -> Option<*mut pg_sys::RangeTblEntry> {
    if varno < 1 {
        return None;
    }
    // SAFETY: the range table of a valid Query.
    unsafe { PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable).get_ptr(varno as usize - 1) }
}

/// `pg_shard.keyspace_id(<copy of node>)`.
unsafe fn keyspace_call(node: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    let function = lookup_function(&KEYSPACE_FUNCTION, "pg_shard.keyspace_id(anyelement)")?;
    // SAFETY: node is a valid expression.
    Some(unsafe { call_on_copy(function, pg_sys::INT8OID, node) })
}

/// `pg_shard.keyspace_ids(<copy of array>)`.
unsafe fn array_keyspace_call(array: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    let function = lookup_function(&KEYSPACES_FUNCTION, "pg_shard.keyspace_ids(anyarray)")?;
    // SAFETY: array is a valid expression.
    Some(unsafe { call_on_copy(function, pg_sys::INT8ARRAYOID, array) })
}

/// `function(<copy of node>)` returning `result_type`.
unsafe fn call_on_copy(
    function: pg_sys::Oid,
    result_type: pg_sys::Oid,
    node: *mut pg_sys::Node,
) -> *mut pg_sys::Node {
    // SAFETY: copying a valid node and building a FuncExpr around it.
    unsafe {
        let mut args = PgList::<pg_sys::Node>::new();
        args.push(pg_sys::copyObjectImpl(node as *const std::ffi::c_void) as *mut pg_sys::Node);
        pg_sys::makeFuncExpr(
            function,
            result_type,
            args.into_pg(),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        ) as *mut pg_sys::Node
    }
}

/// The oid of a pg_shard function, looked up once per backend.
fn lookup_function(
    cache: &'static std::thread::LocalKey<Cell<pg_sys::Oid>>,
    signature: &str,
) -> Option<pg_sys::Oid> {
    let known = cache.get();
    if known != pg_sys::InvalidOid {
        return Some(known);
    }
    let busy = Busy::start();
    let found = crate::catalog::query_one::<pg_sys::Oid>(
        "SELECT to_regprocedure($1)::oid",
        &[signature.into()],
    );
    drop(busy);
    let function = found.ok().flatten()?;
    cache.set(function);
    Some(function)
}
