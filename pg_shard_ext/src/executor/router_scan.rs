//! `Custom Scan (pg_shard Router)`: runs a routed statement's worker query
//! on its node, in the local transaction's remote transaction there
//! ([`crate::transaction::remote`]), and returns its rows (or, for writes,
//! its count) as the statement's own.
//!
//! Rows arrive one at a time (libpq's single-row mode) and go into a
//! tuplestore, which spills to disk beyond `work_mem`: the connection is
//! free again as soon as the statement ends, and nothing a result holds
//! is kept in memory.

use super::row_store::RowStore;
use super::stored_scan::{self, ExecMethods, ScanMethods, StoredScan};
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::transaction::connection::NodeConnection;
use crate::transaction::remote::{
    autocommit, has_transaction_on, with_declared_transaction, Access,
};
use pgrx::prelude::*;
use std::ffi::{CStr, CString};
use std::time::Instant;

/// What the planner decided: the worker's query, where it runs, and what
/// the plan depends on.
pub(crate) struct RouterTask {
    pub(crate) query: String,
    pub(crate) node: Node,
    /// Shard tables it reads or writes, for EXPLAIN.
    pub(crate) shards: Vec<String>,
    pub(crate) map_version: i64,
    pub(crate) writes: bool,
    /// Relations whose changes (a new map replaces partitions) invalidate
    /// the plan.
    pub(crate) relation_oids: Vec<pg_sys::Oid>,
    /// For a generic plan: the parameter whose value picks the shards.
    pub(crate) by_parameter: Option<ByParameter>,
}

/// A generic plan's shards, picked when it runs by the value of one
/// parameter: its query names a stand-in shard of each table, replaced by
/// the shard holding the value's keyspace id.
pub(crate) struct ByParameter {
    pub(crate) parameter: i32,
    pub(crate) parameter_type: pg_sys::Oid,
    /// The stand-in shard's name in the query, and its table.
    pub(crate) tables: Vec<(String, pg_sys::Oid)>,
}

const NAME: &CStr = c"pg_shard Router";

static SCAN_METHODS: ScanMethods = ScanMethods::new(NAME, create_state);
static EXEC_METHODS: ExecMethods = ExecMethods::new(NAME, exec, stored_scan::end, explain);

/// Make the scan known by name (plans are copied and read back by name).
pub(crate) fn register() {
    // SAFETY: a static that lives as long as the backend.
    unsafe { pg_sys::RegisterCustomScanMethods(&SCAN_METHODS.0) };
}

/// The order of `custom_private`'s strings.
const QUERY: usize = 0;
const NODE_ID: usize = 1;
const HOST: usize = 2;
const PORT: usize = 3;
const SHARDS: usize = 4;
const MAP_VERSION: usize = 5;
const WRITES: usize = 6;
/// Then, for a plan whose shards a parameter picks: the parameter's number
/// and type, and pairs of a stand-in shard's name and its table's oid.
const PARAMETER: usize = 7;

/// The plan of a routed statement: one router scan returning the
/// statement's columns (its target list, or RETURNING list).
///
/// # Safety
/// `parse` is the valid parse tree the task was planned from.
pub(crate) unsafe fn planned_statement(
    parse: *mut pg_sys::Query,
    task: RouterTask,
) -> *mut pg_sys::PlannedStmt {
    let mut private: Vec<String> = vec![
        task.query,
        task.node.node_id.to_string(),
        task.node.host,
        task.node.port.to_string(),
        task.shards.join(", "),
        task.map_version.to_string(),
        if task.writes { "t" } else { "f" }.to_string(),
    ];
    if let Some(by) = &task.by_parameter {
        private.push(by.parameter.to_string());
        private.push(by.parameter_type.to_u32().to_string());
        for (name, relid) in &by.tables {
            private.push(name.clone());
            private.push(relid.to_u32().to_string());
        }
    }
    // SAFETY: as this function's.
    unsafe { stored_scan::statement_plan(parse, &SCAN_METHODS, &private, &task.relation_oids) }
}

/// The scan's state: PostgreSQL's part first, as it expects.
#[repr(C)]
struct RouterState {
    scan: StoredScan,
    rows: u64,
    elapsed_ms: f64,
}

unsafe extern "C-unwind" fn create_state(_plan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: RouterState is repr(C) and starts with a StoredScan.
    unsafe { stored_scan::create_state::<RouterState>(&EXEC_METHODS.0) }
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
    unsafe { run(node as *mut RouterState) }
}

unsafe fn private_strings(state: *mut RouterState) -> Vec<String> {
    // SAFETY: a running scan of ours.
    unsafe { stored_scan::private_strings(&mut (*state).scan.css) }
}

/// Run the worker query and store its rows.
unsafe fn run(state: *mut RouterState) -> Result<()> {
    // SAFETY: a running scan of our plan: its slot, descriptor and EState
    // are valid; the tuplestore lives in the query's context.
    unsafe {
        let strings = private_strings(state);
        let field = |i: usize| strings.get(i).cloned().unwrap_or_default();
        let number = |i: usize| -> Result<i64> {
            field(i)
                .parse()
                .map_err(|_| ShardError::Internal("a router plan with a damaged field".into()))
        };
        let mut node = Node {
            node_id: number(NODE_ID)? as i32,
            host: field(HOST),
            port: number(PORT)? as i32,
        };
        let writes = field(WRITES) == "t";
        // The newest map the router knows of (the plan's, unless it was
        // cached across a change): the node's shards check it.
        let map_version =
            crate::metadata::shard_lookup::map_version_now()?.max(number(MAP_VERSION)?);
        let mut query = field(QUERY);
        let estate = (*state).scan.css.ss.ps.state;
        let params = (*estate).es_param_list_info;
        let (types, texts) = parameter_texts(params);
        let prepared = strings.len() > PARAMETER;
        if prepared {
            let (picked, text) = pick_shards(&strings[PARAMETER..], params, &query, writes)?;
            node = picked;
            query = text;
        }

        // A cached plan run in a transaction that has since written over
        // postgres_fdw (see planner::router): replanned, for that path.
        if crate::transaction::paths::did_fdw_write() {
            pg_sys::ResetPlanCache();
            return Err(ShardError::PlanAfterFdwWrite);
        }
        let slot = (*state).scan.css.ss.ss_ScanTupleSlot;
        let mut rows = RowStore::new((*slot).tts_tupleDescriptor);
        let timezone = current_timezone();
        let started = Instant::now();
        let access = if writes { Access::Write } else { Access::Read };
        let texts: Vec<Option<&str>> = texts.iter().map(|t| t.as_deref()).collect();
        let mut statement = |connection: &mut NodeConnection| {
            let each = |row: &crate::transaction::connection::TextRow<'_>| rows.put(row, &node);
            if prepared {
                connection.for_each_row_prepared(&query, &types, &texts, each)
            } else {
                connection.for_each_row(&query, &[], &[], each)
            }
        };
        // An autocommit read outside any remote transaction there runs on
        // its own (no BEGIN and COMMIT round trips). A write joins the
        // local transaction: another statement of it (an extended-protocol
        // pipeline's) may still fail and roll it back; so does every
        // statement of a transaction block (it sees what the ones before it
        // wrote, and keeps its locks and snapshot).
        if writes {
            crate::transaction::paths::router_wrote();
        }
        let outcome = if writes || pg_sys::IsTransactionBlock() || has_transaction_on(&node) {
            with_declared_transaction(&node, access, Some(map_version), |connection| {
                connection.declare_session(map_version, &timezone)?;
                statement(connection)
            })?
        } else {
            autocommit(&node, |connection| {
                connection.declare_for_autocommit(map_version, &timezone)?;
                statement(connection)
            })?
        };
        (*state).scan.store = rows.into_tuplestore();
        (*state).elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        (*state).rows = outcome.rows;
        if (*estate).es_plannedstmt.is_null()
            || (*(*estate).es_plannedstmt).commandType != pg_sys::CmdType::CMD_SELECT
        {
            (*estate).es_processed += outcome.rows;
        }
        Ok(())
    }
}

/// The statement's parameters as text, with their types where the node
/// knows them by the same oid (built-in types; 0 lets the node infer).
unsafe fn parameter_texts(
    params: pg_sys::ParamListInfo,
) -> (Vec<pg_sys::Oid>, Vec<Option<String>>) {
    let mut types = Vec::new();
    let mut texts = Vec::new();
    // SAFETY: a valid parameter list (or NULL); output functions of their types.
    unsafe {
        if params.is_null() {
            return (types, texts);
        }
        for i in 0..(*params).numParams as usize {
            let value = (*params).params.as_mut_ptr().add(i);
            let ty = (*value).ptype;
            types.push(if ty.to_u32() < pg_sys::FirstNormalObjectId {
                ty
            } else {
                pg_sys::InvalidOid
            });
            if (*value).isnull || ty == pg_sys::InvalidOid {
                texts.push(None);
                continue;
            }
            let mut output = pg_sys::InvalidOid;
            let mut varlena = false;
            pg_sys::getTypeOutputInfo(ty, &mut output, &mut varlena);
            let text = pg_sys::OidOutputFunctionCall(output, (*value).value);
            texts.push(Some(CStr::from_ptr(text).to_string_lossy().into_owned()));
        }
    }
    (types, texts)
}

/// The node and the query for this run of a plan whose shards a parameter
/// picks: each stand-in shard's name replaced by the shard holding the
/// parameter value's keyspace id.
unsafe fn pick_shards(
    fields: &[String],
    params: pg_sys::ParamListInfo,
    query: &str,
    writes: bool,
) -> Result<(Node, String)> {
    let damaged = || ShardError::Internal("a router plan with a damaged field".into());
    let number: i32 = fields
        .first()
        .and_then(|f| f.parse().ok())
        .ok_or_else(damaged)?;
    let ty: u32 = fields
        .get(1)
        .and_then(|f| f.parse().ok())
        .ok_or_else(damaged)?;
    // SAFETY: a valid parameter list holding the parameter the plan names.
    let keyspace_id = unsafe {
        if params.is_null() || number < 1 || number > (*params).numParams {
            return Err(damaged());
        }
        let value = (*params).params.as_mut_ptr().add(number as usize - 1);
        if (*value).isnull {
            if writes {
                return Err(ShardError::InvalidArgument(
                    "the distribution column of a distributed table cannot be NULL".into(),
                ));
            }
            // `key = NULL` matches no row on any shard.
            None
        } else {
            Some(
                crate::keyspace::key_to_keyspace_id((*value).value, pg_sys::Oid::from(ty))?
                    .to_sql(),
            )
        }
    };
    let mut node: Option<Node> = None;
    let mut renames = Vec::new();
    for pair in fields[2..].chunks(2) {
        let [stand_in, relid] = pair else {
            return Err(damaged());
        };
        let relid = pg_sys::Oid::from(relid.parse::<u32>().map_err(|_| damaged())?);
        let shard = match keyspace_id {
            Some(id) => crate::metadata::shard_lookup::shard_of(relid, id)?,
            None => crate::metadata::shard_lookup::shard_of(relid, i64::MIN)?,
        };
        let Some(shard) = shard else {
            return Err(ShardError::Timeout(
                "the shard holding this key is being moved or split; run the statement again"
                    .into(),
            ));
        };
        match &node {
            None => node = Some(shard.node.clone()),
            Some(node) if *node != shard.node => {
                return Err(ShardError::Internal(
                    "co-located shards of one key on two nodes".into(),
                ))
            }
            Some(_) => {}
        }
        renames.push((stand_in.clone(), shard.qualified));
    }
    let node = node.ok_or_else(damaged)?;
    Ok((node, crate::quote::replace_names(query, &renames)))
}

/// The session's TimeZone, which the worker's session gets too (stable
/// functions of timestamps read it).
pub(crate) fn current_timezone() -> String {
    // SAFETY: GetConfigOption returns the current value of a known setting.
    unsafe {
        let value = pg_sys::GetConfigOption(c"TimeZone".as_ptr(), true, false);
        if value.is_null() {
            String::new()
        } else {
            CStr::from_ptr(value).to_string_lossy().into_owned()
        }
    }
}

unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: our state and a valid ExplainState; strings are copied by
    // the EXPLAIN functions.
    unsafe { pg_sys::panic::pgrx_extern_c_guard(|| explain_task(node, es)) }
}

unsafe fn explain_task(node: *mut pg_sys::CustomScanState, es: *mut pg_sys::ExplainState) {
    // SAFETY: as in explain.
    unsafe {
        let state = node as *mut RouterState;
        let strings = private_strings(state);
        let field = |i: usize| strings.get(i).cloned().unwrap_or_default();
        let property = |label: &CStr, value: String| {
            let value = CString::new(value).unwrap_or_default();
            pg_sys::ExplainPropertyText(label.as_ptr(), value.as_ptr(), es);
        };
        if strings.len() > PARAMETER {
            property(c"Node", "the one holding the shards".to_string());
        } else {
            property(
                c"Node",
                format!("{}:{} (node {})", field(HOST), field(PORT), field(NODE_ID)),
            );
        }
        if strings.len() > PARAMETER {
            property(
                c"Shards",
                format!("picked by ${} when the statement runs", field(PARAMETER)),
            );
        } else {
            property(c"Shards", field(SHARDS));
        }
        property(c"Worker Query", field(QUERY));
        if (*es).analyze {
            pg_sys::ExplainPropertyFloat(
                c"Worker Time".as_ptr(),
                c"ms".as_ptr(),
                (*state).elapsed_ms,
                3,
                es,
            );
        }
    }
}
