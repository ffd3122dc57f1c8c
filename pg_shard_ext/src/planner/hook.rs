//! The planner hook itself: it adds the keyspace conditions
//! ([`super::conditions`]) to statements on distributed tables, and plans
//! them with partitionwise joins (and aggregates, when they group by the
//! distribution column).

use super::conditions::{deterministic, rewrite_query, INT8_EQUAL_OPERATOR, INT8_LESS_OPERATOR};
use super::partition_key::{
    column_keyspace_call, is_distribution_column, partition_key, reading_catalog,
};
use crate::error::OrReport;
use crate::executor::pushdown_scan::PushdownPlan;
use pgrx::prelude::*;
use pgrx::PgList;

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
}

pub(crate) fn install() {
    // SAFETY: called once from _PG_init, before any planning with the library loaded.
    unsafe {
        PREVIOUS_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(plan);
    }
}

/// # Safety
/// Called by PostgreSQL's planner entry point with a valid parse tree.
unsafe extern "C-unwind" fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    if !reading_catalog() {
        // SAFETY: parse is the tree about to be planned; routing reads it
        // and plans a copy.
        let routed = unsafe {
            pg_sys::panic::pgrx_extern_c_guard(|| {
                route(parse, query_string, cursor_options, bound_params)
            })
        };
        match routed {
            Some(Routed::Router(planned)) => return planned,
            Some(Routed::Pushdown(pushdown)) => {
                // The final query reads no distributed table: PostgreSQL
                // plans it as it is (outside the guard: its errors travel
                // as themselves).
                // SAFETY: a valid Query built for this; the plan is then
                // completed in the planner's context.
                unsafe {
                    let master = pushdown.master;
                    let planned = postgres_standard_planner(
                        master,
                        query_string,
                        cursor_options,
                        bound_params,
                    );
                    return pg_sys::panic::pgrx_extern_c_guard(|| {
                        crate::executor::pushdown_scan::attach(planned, parse, pushdown).or_report()
                    });
                }
            }
            None => {
                // EXISTS tests on distributed tables not tied to their
                // keys, read as intermediate results computed first.
                // SAFETY: parse is the tree about to be planned; it is
                // changed only when every distributed table qualified.
                let intermediates = unsafe {
                    pg_sys::panic::pgrx_extern_c_guard(|| {
                        // (Not has_partitioned_relation: the tables are
                        // in sublinks, which it does not look into.)
                        if extension_installed() {
                            super::intermediate::rewrite(parse).or_report()
                        } else {
                            None
                        }
                    })
                };
                if let Some(intermediates) = intermediates {
                    // SAFETY: chaining as below; the plan is then completed
                    // in the planner's context.
                    unsafe {
                        let planned =
                            next_planner(parse, query_string, cursor_options, bound_params);
                        return pg_sys::panic::pgrx_extern_c_guard(|| {
                            crate::executor::intermediate_scan::attach(planned, &intermediates)
                                .or_report()
                        });
                    }
                }
            }
        }
    }
    let rewrite = if reading_catalog() {
        Rewrite::default()
    } else {
        // SAFETY: parse is the tree about to be planned; the rewrite only adds
        // nodes allocated in the current memory context.
        unsafe { pg_sys::panic::pgrx_extern_c_guard(|| add_keyspace_conditions(parse)) }
    };
    if rewrite.distributed {
        // SAFETY: plain reads of the Query.
        let writes = unsafe {
            (*parse).commandType != pg_sys::CmdType::CMD_SELECT || (*parse).hasModifyingCTE
        };
        if crate::transaction::paths::did_router_write() {
            // postgres_fdw's connections would not see what the router
            // wrote in this transaction (and could wait for its locks).
            // SAFETY: raising an error from the hook, which owns nothing.
            unsafe {
                pg_sys::panic::pgrx_extern_c_guard::<_, ()>(|| {
                    crate::error::ShardError::PathsMixed.report()
                })
            };
        }
        if writes {
            // (Not a generic plan, priced out below: the plan cache plans
            // one to compare after a few custom plans, which take the
            // other paths. Were one run, the shards would refuse to commit
            // its untaken lookup changes.)
            // SAFETY: reads of the parse tree.
            let generic = unsafe { bound_params.is_null() && has_parameters(parse) };
            if !generic {
                // SAFETY: raising an error from the hook, which owns nothing.
                unsafe {
                    pg_sys::panic::pgrx_extern_c_guard(|| {
                        super::lookup_writes::refuse_fdw_write(parse)
                    })
                };
                // (A generic plan marks it when it runs, if ever:
                // `executor::fdw_writes`.)
                crate::transaction::paths::fdw_wrote();
            }
        }
        super::explain::note_fallback();
    }
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
    let planned = unsafe { next_planner(parse, query_string, cursor_options, bound_params) };
    if let Some(level) = settings_level {
        // SAFETY: pops the nest level pushed by enable_partitionwise.
        unsafe { pg_sys::panic::pgrx_extern_c_guard(|| pg_sys::AtEOXact_GUC(true, level)) };
    }
    // A generic plan over postgres_fdw of a statement with parameters: its
    // custom plans may be router plans (the key's value known), and a plan
    // cache that switched to this one would take another path in the
    // middle of a pipeline's transaction. Priced out, it keeps them.
    if rewrite.distributed && bound_params.is_null() && !planned.is_null() {
        // SAFETY: the plan just made; its tree's cost fields are plain numbers.
        unsafe {
            let tree = (*planned).planTree;
            if !tree.is_null() && has_parameters(parse) {
                (*tree).total_cost += GENERIC_PLAN_PENALTY;
            }
        }
    }
    planned
}

/// The planner before ours (another extension's hook, or PostgreSQL's).
///
/// # Safety
/// The arguments the hook was called with.
unsafe fn next_planner(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: chaining with the caller's arguments; errors longjmp through
    // this frame, which owns nothing.
    unsafe {
        match PREVIOUS_PLANNER {
            Some(previous) => previous(parse, query_string, cursor_options, bound_params),
            None => postgres_standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// What a generic postgres_fdw plan of a statement with parameters costs
/// more than its custom plans (see `plan`).
const GENERIC_PLAN_PENALTY: f64 = 1.0e9;

/// Whether the statement has external parameters.
unsafe fn has_parameters(parse: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid parse tree.
    unsafe {
        crate::parse_tree::contents(parse)
            .calls
            .iter()
            .any(|&node| {
                (*node).type_ == pg_sys::NodeTag::T_Param
                    && (*(node as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN
            })
    }
}

/// The router or pushdown plan of `parse`, if it is one of those.
unsafe fn route(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> Option<Routed> {
    // SAFETY: a valid parse tree; the checks read it.
    unsafe {
        if !has_partitioned_relation(parse) || !extension_installed() {
            return None;
        }
        if (*parse).commandType != pg_sys::CmdType::CMD_SELECT || (*parse).hasModifyingCTE {
            super::lookup_writes::refuse_lookup_table_writes(parse);
        }
        if let Some(task) =
            super::router::plan(parse, query_string, cursor_options, bound_params).or_report()
        {
            return Some(Routed::Router(
                crate::executor::router_scan::planned_statement(parse, task),
            ));
        }
        if let Some(modify) =
            super::modify::plan(parse, query_string, cursor_options, bound_params).or_report()
        {
            return Some(Routed::Router(
                crate::executor::modify_scan::planned_statement(parse, modify),
            ));
        }
        crate::executor::pushdown_scan::results_function()?;
        super::pushdown::plan(parse, query_string, cursor_options, bound_params)
            .or_report()
            .map(Routed::Pushdown)
    }
}

/// What routing made of a statement.
enum Routed {
    /// A router or multi-shard DML plan, complete.
    Router(*mut pg_sys::PlannedStmt),
    /// A pushdown plan, whose final query PostgreSQL plans next.
    Pushdown(PushdownPlan),
}

fn extension_installed() -> bool {
    // SAFETY: get_namespace_oid is a syscache lookup; databases without the
    // extension have no distributed tables.
    unsafe { pg_sys::get_namespace_oid(c"pg_shard".as_ptr(), true) != pg_sys::InvalidOid }
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
    if extension_installed() {
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
