//! `Custom Scan (pg_shard Modify)`: runs a multi-shard UPDATE, DELETE or
//! INSERT … SELECT ([`crate::planner`]'s multi-shard DML class) as one
//! statement per shard group: a node's statements go in one round trip,
//! every node at once, each in the local transaction's remote transaction
//! there. The remote transactions commit with the local one, by two-phase
//! commit when more than one node wrote ([`crate::transaction::remote`]).
//!
//! The statement's count is the sum of the shards' counts; RETURNING rows
//! are the shards' rows, stored as the router's are — those of a multi-row
//! INSERT … VALUES in the order of its rows, as PostgreSQL returns them.

use super::computed_values;
use super::moved_shards::{self, ShardGroupTargets, SHARD_GROUP_TARGET_FIELDS};
use super::pushdown_scan::{explain_task_list, planned_tasks, task_strings, NodeTask, PlannedTask};
use super::row_store::RowStore;
use super::stored_scan::{self, ExecMethods, ScanMethods, StoredScan, Timings};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::transaction::connection::Planning;
use crate::transaction::remote::{with_declared_transactions, Access};
use pgrx::prelude::*;
use std::ffi::{CStr, CString};
use std::time::Instant;

/// What the planner decided.
pub(crate) struct ModifyPlan {
    /// Per node: its shard groups' statements.
    pub(crate) tasks: Vec<NodeTask>,
    pub(crate) map_version: i64,
    /// Relations whose changes invalidate the plan.
    pub(crate) relation_oids: Vec<pg_sys::Oid>,
    /// To find its shard groups again after a move or split.
    pub(crate) again: ShardGroupTargets,
    /// Values the metadata node computes when the statement runs
    /// ([`crate::planner::computed_values`]): `$1`, … in the statements.
    pub(crate) computed: Vec<*mut pg_sys::Expr>,
}

const NAME: &CStr = c"pg_shard Modify";

static SCAN_METHODS: ScanMethods = ScanMethods::new(NAME, create_state);
static EXEC_METHODS: ExecMethods = ExecMethods::new(NAME, exec, stored_scan::end, explain);

/// Make the scan known by name (plans are copied and read back by name).
pub(crate) fn register() {
    // SAFETY: a static that lives as long as the backend.
    unsafe { pg_sys::RegisterCustomScanMethods(&SCAN_METHODS.0) };
}

/// The order of `custom_private`'s strings: the map version, the row
/// order, those of [`ShardGroupTargets`], then five per node.
const MAP_VERSION: usize = 0;
const ROW_ORDER: usize = 1;
const TARGETS: std::ops::Range<usize> = 2..2 + SHARD_GROUP_TARGET_FIELDS;
const FIRST_TASK: usize = TARGETS.end;

/// The plan of a multi-shard statement: the modify scan, returning the
/// statement's RETURNING columns.
///
/// # Safety
/// `parse` is the valid parse tree the plan was made from.
pub(crate) unsafe fn planned_statement(
    parse: *mut pg_sys::Query,
    plan: ModifyPlan,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: a valid Query.
    let returns = unsafe { !(*parse).returningList.is_null() };
    let mut private = vec![
        plan.map_version.to_string(),
        if returns {
            encode_row_order(&plan.tasks)
        } else {
            String::new()
        },
    ];
    private.extend(plan.again.encode());
    for task in &plan.tasks {
        private.extend(task_strings(&task.node, &task.shards, statements(task)));
    }
    // SAFETY: as this function's; the plan's top node is the scan.
    unsafe {
        let planned =
            stored_scan::statement_plan(parse, &SCAN_METHODS, &private, &plan.relation_oids);
        computed_values::attach(planned, plan.computed);
        planned
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

unsafe fn run_scan(node: *mut pg_sys::ScanState) -> Result<()> {
    // SAFETY: node is our state.
    unsafe { run(node as *mut StoredScan) }
}

/// The positions of the rows each node's statements insert (a multi-row
/// INSERT … VALUES), `0,2,5;1,3,4`; empty for other statements.
fn encode_row_order(tasks: &[NodeTask]) -> String {
    if tasks.iter().all(|t| t.rows.is_empty()) {
        return String::new();
    }
    tasks
        .iter()
        .map(|t| {
            t.rows
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// What [`encode_row_order`] wrote; None when the rows keep no order.
fn decode_row_order(text: &str) -> Result<Option<Vec<Vec<usize>>>> {
    if text.is_empty() {
        return Ok(None);
    }
    let damaged = || ShardError::Internal("a modify plan with a damaged row order".into());
    text.split(';')
        .map(|node| {
            node.split(',')
                .filter(|p| !p.is_empty())
                .map(|p| p.parse().map_err(|_| damaged()))
                .collect()
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// A node's statements, one per shard group, as one string.
fn statements(task: &NodeTask) -> String {
    task.queries.join(";\n")
}

/// Run every node's statements and store their RETURNING rows; if a shard
/// refuses them because it moved or split, roll back and run the statement
/// again over the shard groups as they are now
/// ([`moved_shards::run_over_shard_groups`]).
unsafe fn run(state: *mut StoredScan) -> Result<()> {
    // SAFETY: a running scan of our plan: its slot, descriptor and EState
    // are valid; the tuplestore lives in the query's context.
    unsafe {
        let strings = stored_scan::private_strings(&mut (*state).css);
        let planned = planned_tasks(&strings, FIRST_TASK)?;
        let planned_version: i64 = strings
            .get(MAP_VERSION)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ShardError::Internal("a modify plan with a damaged field".into()))?;
        let map_version = crate::metadata::shard_lookup::map_version_now()?.max(planned_version);
        if crate::transaction::paths::did_fdw_write() {
            pg_sys::ResetPlanCache();
            return Err(ShardError::PlanAfterFdwWrite);
        }
        let slot = (*state).css.ss.ss_ScanTupleSlot;
        let descriptor = (*slot).tts_tupleDescriptor;
        let targets = strings.get(TARGETS).unwrap_or_default();
        let written = ShardGroupTargets::decode(targets)?.distributed;
        let lookups = crate::lookups::catalog::any_has_lookups(&written)?;
        let planned_order = decode_row_order(strings.get(ROW_ORDER).map_or("", String::as_str))?;
        // The statements' `$n` are the computed values, written in as
        // literals (a node's statements go in one simple-protocol message).
        let computed = computed_values::compute(&mut (*state).css.ss.ps);
        let literals = if computed.is_empty() {
            Vec::new()
        } else {
            crate::settings::with_portable_text(|| Ok(computed_values::literals(&computed)))?
        };
        let bind = |tasks: Vec<PlannedTask>| -> Vec<PlannedTask> {
            if literals.is_empty() {
                return tasks;
            }
            tasks
                .into_iter()
                .map(|mut task| {
                    task.query = pg_shard_core::quote::bind_parameters(&task.query, &literals);
                    task
                })
                .collect()
        };
        let planned = bind(planned);
        let (rows, timings, changed) =
            moved_shards::run_over_shard_groups(map_version, targets, |again, map_version| {
                match again {
                    None => run_tasks(
                        &planned,
                        map_version,
                        descriptor,
                        lookups,
                        planned_order.as_deref(),
                    ),
                    Some(tasks) => {
                        let order: Option<Vec<Vec<usize>>> = planned_order
                            .is_some()
                            .then(|| tasks.iter().map(|t| t.rows.clone()).collect());
                        let tasks: Vec<PlannedTask> = bind(
                            tasks
                                .iter()
                                .map(|t| PlannedTask::of(t, statements(t)))
                                .collect(),
                        );
                        run_tasks(&tasks, map_version, descriptor, lookups, order.as_deref())
                    }
                }
            })?;
        (*state).store = rows.into_tuplestore();
        (*state).set_timings(timings);
        let estate = (*state).css.ss.ps.state;
        (*estate).es_processed += changed;
        Ok(())
    }
}

/// One run of the nodes' statements: their RETURNING rows (put in the
/// statement's row order when `order` gives each node's), each node's
/// time and count, and the total count.
///
/// # Safety
/// `descriptor` is the scan's valid tuple descriptor.
unsafe fn run_tasks(
    tasks: &[PlannedTask],
    map_version: i64,
    descriptor: pg_sys::TupleDesc,
    lookups: bool,
    order: Option<&[Vec<usize>]>,
) -> Result<(RowStore, Timings, u64)> {
    // SAFETY: as this function's.
    let mut rows = unsafe { RowStore::new(descriptor) };
    let timezone = super::router_scan::current_timezone();
    let started = Instant::now();
    let mut timings = Vec::with_capacity(tasks.len());
    let nodes: Vec<Node> = tasks.iter().map(|t| t.node.clone()).collect();
    crate::transaction::paths::router_wrote();
    let mut lookup_changes = Vec::new();
    // Each node's rows, kept until every node's are in (ordered runs).
    let mut kept: Vec<Vec<KeptRow>> = vec![Vec::new(); tasks.len()];
    let changed =
        with_declared_transactions(&nodes, Access::Write, Some(map_version), |connections| {
            for connection in connections.iter_mut() {
                connection.declare_session(map_version, &timezone, Planning::Own)?;
            }
            // Every node starts before any is read.
            for (connection, task) in connections.iter_mut().zip(tasks) {
                connection.send_statements(&task.query)?;
            }
            // Every node's results are read (each connection is ready for
            // the transaction's end) before the first error is raised.
            let mut changed = 0;
            let mut first_error = None;
            for (index, (connection, task)) in connections.iter_mut().zip(tasks).enumerate() {
                let received = connection.receive_rows(|row| match order {
                    None => rows.put(row, &task.node),
                    Some(_) => {
                        kept[index].push(
                            (0..row.len())
                                .map(|i| row.c_str(i).map(CStr::to_owned))
                                .collect(),
                        );
                        Ok(())
                    }
                });
                match received {
                    Ok(outcome) => {
                        changed += outcome.rows;
                        timings.push((started.elapsed().as_secs_f64() * 1000.0, outcome.rows));
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
            // The changes the statements made to lookups (a table with
            // lookups), taken from every node.
            if lookups {
                for connection in connections.iter_mut() {
                    crate::lookups::apply::take(connection, &mut lookup_changes)?;
                }
            }
            Ok(changed)
        })?;
    if let Some(order) = order {
        put_in_order(&mut rows, tasks, kept, order)?;
    }
    // Once the nodes' connections are back: lookup shards may be on them.
    crate::lookups::apply::apply(lookup_changes, map_version)?;
    Ok((rows, timings, changed))
}

/// A RETURNING row kept as its columns' texts.
type KeptRow = Vec<Option<CString>>;

/// Puts the nodes' rows (`kept`, per node) into `rows` by the position of
/// the row each came from: node `n`'s `i`-th row from `order[n][i]`. A
/// node that returned another number of rows than it was sent (a trigger
/// on its shard skipped some) has no positions to go by: then each node's
/// rows follow the one before's.
fn put_in_order(
    rows: &mut RowStore,
    tasks: &[PlannedTask],
    kept: Vec<Vec<KeptRow>>,
    order: &[Vec<usize>],
) -> Result<()> {
    let matches = kept.len() == order.len()
        && kept
            .iter()
            .zip(order)
            .all(|(rows, positions)| rows.len() == positions.len());
    let mut placed: Vec<(usize, usize, KeptRow)> = Vec::new();
    for (node, node_rows) in kept.into_iter().enumerate() {
        for (i, row) in node_rows.into_iter().enumerate() {
            let position = if matches { order[node][i] } else { 0 };
            placed.push((position, node, row));
        }
    }
    // (Stable: without positions, node by node as they came.)
    placed.sort_by_key(|(position, _, _)| *position);
    for (_, node, row) in placed {
        rows.put_kept(&row, &tasks[node].node)?;
    }
    Ok(())
}

unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: our state and a valid ExplainState; strings are copied by
    // the EXPLAIN functions.
    unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| {
            let state = node as *mut StoredScan;
            let strings = stored_scan::private_strings(&mut (*state).css);
            let Ok(tasks) = planned_tasks(&strings, FIRST_TASK) else {
                return;
            };
            let class = CString::new("multi-shard modify (one statement per shard group)")
                .unwrap_or_default();
            pg_sys::ExplainPropertyText(c"Class".as_ptr(), class.as_ptr(), es);
            computed_values::explain(&mut (*state).css.ss.ps, 0, es);
            explain_task_list(&tasks, (*state).timings(), es);
        })
    }
}
