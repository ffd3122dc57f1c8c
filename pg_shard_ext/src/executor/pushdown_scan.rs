//! `Custom Scan (pg_shard Pushdown)`: runs a pushed-down statement's worker
//! queries, one per node (its shard groups' queries joined by UNION ALL),
//! on every node at once, and returns their rows to the final query above
//! it ([`crate::planner`]'s pushdown class plans both).
//!
//! The final query is planned by PostgreSQL as a query over a function
//! (`pg_shard.worker_results()`, which only stands in for the rows); the
//! function's scan in that plan is then replaced by this scan, so
//! aggregation, sorting and limits above it are PostgreSQL's own.

use super::moved_shards::{self, ShardGroupTargets, SHARD_GROUP_TARGET_FIELDS};
use super::row_store::RowStore;
use super::stored_scan::{self, ExecMethods, ScanMethods, StoredScan, Timings};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::transaction::connection::{NodeConnection, Planning};
use crate::transaction::remote::{
    autocommit_each, has_transaction_on, with_declared_transactions, Access,
};
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{c_int, CStr, CString};
use std::time::Instant;

/// What the planner decided.
pub(crate) struct PushdownPlan {
    /// The final query (over [`results_entry`]).
    pub(crate) master: *mut pg_sys::Query,
    /// The workers' output columns.
    pub(crate) columns: Vec<(pg_sys::Oid, i32, pg_sys::Oid)>,
    pub(crate) tasks: Vec<NodeTask>,
    pub(crate) map_version: i64,
    /// Whether the statement runs whole per shard group (for EXPLAIN).
    pub(crate) whole: bool,
    /// Relations whose changes invalidate the plan.
    pub(crate) relation_oids: Vec<pg_sys::Oid>,
    /// To find its shard groups again after a move or split.
    pub(crate) again: ShardGroupTargets,
}

/// One node's part: the queries of its shard groups.
pub(crate) struct NodeTask {
    pub(crate) node: Node,
    /// A WITH clause the queries share (reference tables read once).
    pub(crate) prefix: String,
    pub(crate) queries: Vec<String>,
    pub(crate) partitions: Vec<pg_sys::Oid>,
    pub(crate) shards: Vec<String>,
    /// A multi-row INSERT … VALUES: the positions in the statement of the
    /// rows its queries insert, in their order (empty otherwise).
    pub(crate) rows: Vec<usize>,
}

impl NodeTask {
    fn query(&self) -> String {
        if self.queries.len() == 1 {
            return format!("{}{}", self.prefix, self.queries[0]);
        }
        let branches = self
            .queries
            .iter()
            .map(|q| format!("({q})"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        format!("{}{branches}", self.prefix)
    }
}

const NAME: &CStr = c"pg_shard Pushdown";

static SCAN_METHODS: ScanMethods = ScanMethods::new(NAME, create_state);
static EXEC_METHODS: ExecMethods = ExecMethods::new(NAME, exec, stored_scan::end, explain);

/// Make the scan known by name (plans are copied and read back by name).
pub(crate) fn register() {
    // SAFETY: a static that lives as long as the backend.
    unsafe { pg_sys::RegisterCustomScanMethods(&SCAN_METHODS.0) };
}

/// `pg_shard.worker_results()`, the function standing for the workers'
/// rows in the final query; None where the extension's objects predate it.
pub(crate) fn results_function() -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup of a qualified name without arguments.
    unsafe {
        let mut names = PgList::<pg_sys::Node>::new();
        names.push(pg_sys::makeString(pg_sys::pstrdup(c"pg_shard".as_ptr())) as *mut pg_sys::Node);
        names.push(
            pg_sys::makeString(pg_sys::pstrdup(c"worker_results".as_ptr())) as *mut pg_sys::Node,
        );
        let oid = pg_sys::LookupFuncName(names.into_pg(), 0, std::ptr::null(), true);
        (oid != pg_sys::InvalidOid).then_some(oid)
    }
}

/// The final query's range table: one function entry with the workers'
/// columns (c1, c2, …).
pub(crate) fn results_entry(columns: &[(pg_sys::Oid, i32, pg_sys::Oid)]) -> *mut pg_sys::List {
    // SAFETY: new nodes in the current memory context.
    unsafe {
        let function = results_function().unwrap_or(pg_sys::InvalidOid);
        let call = pg_sys::makeFuncExpr(
            function,
            pg_sys::RECORDOID,
            std::ptr::null_mut(),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        );
        (*call).funcretset = true;
        let mut names = PgList::<pg_sys::Node>::new();
        let mut types = std::ptr::null_mut();
        let mut typmods = std::ptr::null_mut();
        let mut collations = std::ptr::null_mut();
        for (i, (ty, typmod, collation)) in columns.iter().enumerate() {
            let name = CString::new(format!("c{}", i + 1)).unwrap_or_default();
            names.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())) as *mut pg_sys::Node);
            types = pg_sys::lappend_oid(types, *ty);
            typmods = pg_sys::lappend_int(typmods, *typmod);
            collations = pg_sys::lappend_oid(collations, *collation);
        }
        let names = names.into_pg();
        let mut function_entry =
            PgBox::<pg_sys::RangeTblFunction>::alloc_node(pg_sys::NodeTag::T_RangeTblFunction);
        function_entry.funcexpr = call as *mut pg_sys::Node;
        function_entry.funccolcount = columns.len() as c_int;
        function_entry.funccolnames = names;
        function_entry.funccoltypes = types;
        function_entry.funccoltypmods = typmods;
        function_entry.funccolcollations = collations;
        let mut functions = PgList::<pg_sys::RangeTblFunction>::new();
        functions.push(function_entry.into_pg());
        let mut entry =
            PgBox::<pg_sys::RangeTblEntry>::alloc_node(pg_sys::NodeTag::T_RangeTblEntry);
        entry.rtekind = pg_sys::RTEKind::RTE_FUNCTION;
        entry.functions = functions.into_pg();
        entry.eref = pg_sys::makeAlias(c"worker_results".as_ptr(), names);
        entry.inFromCl = true;
        let mut rtable = PgList::<pg_sys::RangeTblEntry>::new();
        rtable.push(entry.into_pg());
        rtable.into_pg()
    }
}

/// The order of `custom_private`'s strings: the map version, whether the
/// statement runs whole, whether a node's query is made of branches (one
/// per shard group), those of [`ShardGroupTargets`], then five per node.
const MAP_VERSION: usize = 0;
const WHOLE: usize = 1;
const BRANCHES: usize = 2;
const TARGETS: std::ops::Range<usize> = 3..3 + SHARD_GROUP_TARGET_FIELDS;
const FIRST_TASK: usize = TARGETS.end;
const TASK_FIELDS: usize = 5;

/// Turn the final query's plan into the statement's: the function scan
/// standing for the workers' rows becomes the pushdown scan, and the
/// statement's tables join the range table (the executor checks their
/// privileges and takes their locks, as for any statement; the workers
/// check again, as the same role).
///
/// # Safety
/// `planned` is the final query's plan, `parse` the statement's tree.
pub(crate) unsafe fn attach(
    planned: *mut pg_sys::PlannedStmt,
    parse: *mut pg_sys::Query,
    plan: PushdownPlan,
) -> Result<*mut pg_sys::PlannedStmt> {
    // SAFETY: a plan just made; nodes are replaced in the planner's context.
    unsafe {
        let mut rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*planned).rtable);
        for entry in stored_scan::flat_range_table(parse) {
            rtable.push(entry);
        }
        (*planned).rtable = rtable.into_pg();
        for oid in &plan.relation_oids {
            (*planned).relationOids = pg_sys::lappend_oid((*planned).relationOids, *oid);
        }
        (*planned).queryId = (*parse).queryId;
        (*planned).stmt_location = (*parse).stmt_location;
        (*planned).stmt_len = (*parse).stmt_len;
        // A final query PostgreSQL proved empty (HAVING false) reads no
        // rows: its plan stands as it is.
        let Some((parent, scan)) = find_results_scan(std::ptr::null_mut(), (*planned).planTree)
        else {
            return Ok(planned);
        };
        let mut private = PgList::<pg_sys::Node>::new();
        let mut push = |text: &str| {
            private.push(pg_sys::makeString(stored_scan::palloc_string(text)) as *mut pg_sys::Node);
        };
        push(&plan.map_version.to_string());
        push(if plan.whole { "t" } else { "f" });
        push(if plan.tasks.iter().any(|t| t.queries.len() > 1) {
            "t"
        } else {
            "f"
        });
        for field in plan.again.encode() {
            push(&field);
        }
        for task in &plan.tasks {
            for field in task_strings(&task.node, &task.shards, task.query()) {
                push(&field);
            }
        }
        let custom =
            stored_scan::custom_scan_for(scan, &plan.columns, &SCAN_METHODS.0, private.into_pg());
        if parent.is_null() {
            (*planned).planTree = custom;
        } else if (*parent).lefttree == scan as *mut pg_sys::Plan {
            (*parent).lefttree = custom;
        } else {
            (*parent).righttree = custom;
        }

        Ok(planned)
    }
}

/// The function scan of the workers' rows, with its parent plan (NULL at
/// the top). The final query reads one relation, so the plan is a chain.
unsafe fn find_results_scan(
    parent: *mut pg_sys::Plan,
    plan: *mut pg_sys::Plan,
) -> Option<(*mut pg_sys::Plan, *mut pg_sys::FunctionScan)> {
    // SAFETY: nodes of a valid plan tree.
    unsafe {
        if plan.is_null() {
            return None;
        }
        if (*plan).type_ == pg_sys::NodeTag::T_FunctionScan {
            return Some((parent, plan as *mut pg_sys::FunctionScan));
        }
        find_results_scan(plan, (*plan).lefttree)
            .or_else(|| find_results_scan(plan, (*plan).righttree))
    }
}

unsafe extern "C-unwind" fn create_state(_plan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: StoredScan is repr(C).
    unsafe { stored_scan::create_state::<StoredScan>(&EXEC_METHODS.0) }
}

unsafe extern "C-unwind" fn exec(
    node: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: node is our state.
    unsafe { stored_scan::exec(node, next_row) }
}

unsafe extern "C-unwind" fn next_row(node: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: node is our state, and run its own.
    unsafe { stored_scan::next_row(node, run_scan) }
}

/// [`run`] for the scan's node.
unsafe fn run_scan(node: *mut pg_sys::ScanState) -> Result<()> {
    // SAFETY: node is our state.
    unsafe { run(node as *mut StoredScan) }
}

unsafe fn private_strings(state: *mut StoredScan) -> Vec<String> {
    // SAFETY: a running scan of ours.
    unsafe { stored_scan::private_strings(&mut (*state).css) }
}

/// A node and its query, read back from the plan.
pub(super) struct PlannedTask {
    pub(super) node: Node,
    pub(super) shards: String,
    pub(super) query: String,
}

impl PlannedTask {
    /// A task found again under a newer map, with `query` its text.
    pub(super) fn of(task: &NodeTask, query: String) -> PlannedTask {
        PlannedTask {
            node: task.node.clone(),
            shards: task.shards.join(", "),
            query,
        }
    }
}

/// The tasks of a plan's strings, from `first` on (five per task: the
/// node's id, host and port, its shards, its query).
pub(super) fn planned_tasks(strings: &[String], first: usize) -> Result<Vec<PlannedTask>> {
    let damaged = || ShardError::Internal("a distributed plan with a damaged field".into());
    let rest = strings.get(first..).ok_or_else(damaged)?;
    rest.chunks(TASK_FIELDS)
        .map(|fields| {
            let [id, host, port, shards, query] = fields else {
                return Err(damaged());
            };
            Ok(PlannedTask {
                node: Node {
                    node_id: id.parse().map_err(|_| damaged())?,
                    host: host.clone(),
                    port: port.parse().map_err(|_| damaged())?,
                },
                shards: shards.clone(),
                query: query.clone(),
            })
        })
        .collect()
}

/// A task's strings in a plan, as [`planned_tasks`] reads them.
pub(super) fn task_strings(node: &Node, shards: &[String], query: String) -> [String; TASK_FIELDS] {
    [
        node.node_id.to_string(),
        node.host.clone(),
        node.port.to_string(),
        shards.join(", "),
        query,
    ]
}

/// Run every node's query and store the rows; if a shard refuses it
/// because it moved or split, wait for the new map and run the statement
/// again over the shard groups as they are now
/// ([`moved_shards::run_over_shard_groups`]).
unsafe fn run(state: *mut StoredScan) -> Result<()> {
    // SAFETY: a running scan of our plan: its slot and descriptor are
    // valid; the tuplestore lives in the query's context.
    unsafe {
        let strings = private_strings(state);
        let planned = planned_tasks(&strings, FIRST_TASK)?;
        let planned_version: i64 = strings
            .get(MAP_VERSION)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ShardError::Internal("a pushdown plan with a damaged field".into()))?;
        // The newest map known (the plan's, unless it was cached across a
        // change): the nodes' shards check it.
        let map_version = crate::metadata::shard_lookup::map_version_now()?.max(planned_version);
        let planned_branches = strings.get(BRANCHES).is_some_and(|b| b == "t");
        if crate::transaction::paths::did_fdw_write() {
            pg_sys::ResetPlanCache();
            return Err(ShardError::PlanAfterFdwWrite);
        }
        let slot = (*state).css.ss.ss_ScanTupleSlot;
        let descriptor = (*slot).tts_tupleDescriptor;
        let targets = strings.get(TARGETS).unwrap_or_default();
        let (rows, timings) =
            moved_shards::run_over_shard_groups(map_version, targets, |again, map_version| {
                match again {
                    None => run_tasks(&planned, planned_branches, map_version, descriptor),
                    Some(tasks) => {
                        let branches = tasks.iter().any(|t| t.queries.len() > 1);
                        let tasks: Vec<PlannedTask> = tasks
                            .iter()
                            .map(|t| PlannedTask::of(t, t.query()))
                            .collect();
                        run_tasks(&tasks, branches, map_version, descriptor)
                    }
                }
            })?;
        (*state).store = rows.into_tuplestore();
        (*state).set_timings(timings);
        Ok(())
    }
}

/// One run of the nodes' queries: their rows, and each node's time and
/// row count.
///
/// # Safety
/// `descriptor` is the scan's valid tuple descriptor.
unsafe fn run_tasks(
    tasks: &[PlannedTask],
    branches: bool,
    map_version: i64,
    descriptor: pg_sys::TupleDesc,
) -> Result<(RowStore, Timings)> {
    let nodes: Vec<Node> = tasks.iter().map(|t| t.node.clone()).collect();
    // Branches per shard group run one after another, each planned
    // without JIT and parallel workers; nodes of one host run their
    // parts at the same time on its cores, without parallel workers
    // (see `transaction::connection::Planning`).
    let planning = if branches {
        Planning::Branches
    } else if share_a_host(&nodes) {
        Planning::SharedCores
    } else {
        Planning::Own
    };
    // SAFETY: as this function's.
    let mut rows = unsafe { RowStore::new(descriptor) };
    let timezone = super::router_scan::current_timezone();
    let started = Instant::now();
    let mut timings = Vec::with_capacity(tasks.len());
    let mut run_all = |connections: &mut [&mut NodeConnection]| -> Result<()> {
        // Every node starts before any is read.
        for (connection, task) in connections.iter_mut().zip(tasks) {
            connection.send_query(&task.query)?;
        }
        for (connection, task) in connections.iter_mut().zip(tasks) {
            let outcome = connection.receive_rows(|row| rows.put(row, &task.node))?;
            timings.push((started.elapsed().as_secs_f64() * 1000.0, outcome.rows));
        }
        Ok(())
    };
    // SAFETY: reads the transaction state.
    if unsafe { pg_sys::IsTransactionBlock() } || nodes.iter().any(has_transaction_on) {
        // In the transaction's remote transactions: they see what its
        // earlier statements wrote (a transaction block's, a pipeline's).
        with_declared_transactions(&nodes, Access::Read, Some(map_version), |connections| {
            for connection in connections.iter_mut() {
                connection.declare_session(map_version, &timezone, planning)?;
            }
            run_all(connections)
        })?;
    } else {
        autocommit_each(&nodes, |connections: &mut [NodeConnection]| {
            for connection in connections.iter_mut() {
                connection.declare_for_autocommit(map_version, &timezone, planning)?;
            }
            let mut connections: Vec<&mut NodeConnection> = connections.iter_mut().collect();
            run_all(&mut connections)
        })?;
    }
    Ok((rows, timings))
}

/// Whether two of `nodes` (distinct servers) are on the same host, as
/// their addresses are written in the catalog.
fn share_a_host(nodes: &[Node]) -> bool {
    nodes
        .iter()
        .enumerate()
        .any(|(i, node)| nodes[i + 1..].iter().any(|other| other.host == node.host))
}

unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: our state and a valid ExplainState; strings are copied by
    // the EXPLAIN functions.
    unsafe { pg_sys::panic::pgrx_extern_c_guard(|| explain_tasks(node, es)) }
}

unsafe fn explain_tasks(node: *mut pg_sys::CustomScanState, es: *mut pg_sys::ExplainState) {
    // SAFETY: as in explain.
    unsafe {
        let state = node as *mut StoredScan;
        let strings = private_strings(state);
        let Ok(tasks) = planned_tasks(&strings, FIRST_TASK) else {
            return;
        };
        let property = |label: &CStr, value: String| {
            let value = CString::new(value).unwrap_or_default();
            pg_sys::ExplainPropertyText(label.as_ptr(), value.as_ptr(), es);
        };
        let whole = strings.get(WHOLE).is_some_and(|w| w == "t");
        property(
            c"Class",
            if whole {
                "pushdown (whole statement per shard group)".to_string()
            } else {
                "pushdown (partial results merged here)".to_string()
            },
        );
        explain_task_list(&tasks, (*state).timings(), es);
    }
}

/// EXPLAIN's task count, and each task's node, shards and query (with
/// ANALYZE, its time until its last row and its rows).
///
/// # Safety
/// `es` is the running EXPLAIN's state.
pub(super) unsafe fn explain_task_list(
    tasks: &[PlannedTask],
    timings: Option<&Timings>,
    es: *mut pg_sys::ExplainState,
) {
    let property = |label: &CStr, value: String| {
        let value = CString::new(value).unwrap_or_default();
        // SAFETY: strings are copied by the EXPLAIN functions.
        unsafe { pg_sys::ExplainPropertyText(label.as_ptr(), value.as_ptr(), es) };
    };
    // SAFETY: a valid ExplainState.
    unsafe {
        pg_sys::ExplainPropertyInteger(
            c"Task Count".as_ptr(),
            std::ptr::null(),
            tasks.len() as i64,
            es,
        );
        for (i, task) in tasks.iter().enumerate() {
            property(
                c"Node",
                format!(
                    "{}:{} (node {})",
                    task.node.host, task.node.port, task.node.node_id
                ),
            );
            property(c"Shards", task.shards.clone());
            property(c"Worker Query", task.query.clone());
            if (*es).analyze {
                if let Some((ms, rows)) = timings.and_then(|t| t.get(i)) {
                    pg_sys::ExplainPropertyFloat(
                        c"Worker Time".as_ptr(),
                        c"ms".as_ptr(),
                        *ms,
                        3,
                        es,
                    );
                    pg_sys::ExplainPropertyInteger(
                        c"Worker Rows".as_ptr(),
                        std::ptr::null(),
                        *rows as i64,
                        es,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::share_a_host;
    use crate::metadata::Node;

    fn node(node_id: i32, host: &str, port: i32) -> Node {
        Node {
            node_id,
            host: host.into(),
            port,
        }
    }

    #[test]
    fn nodes_on_one_host() {
        assert!(!share_a_host(&[node(1, "127.0.0.1", 5432)]));
        assert!(!share_a_host(&[
            node(1, "127.0.0.1", 5432),
            node(2, "127.0.0.2", 5432)
        ]));
        assert!(share_a_host(&[
            node(1, "127.0.0.2", 5432),
            node(2, "127.0.0.1", 5433),
            node(3, "127.0.0.1", 5434)
        ]));
    }
}
