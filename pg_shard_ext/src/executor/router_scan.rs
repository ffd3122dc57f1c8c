//! `Custom Scan (pg_shard Router)`: runs a routed statement's worker query
//! on its node, in the local transaction's remote transaction there
//! ([`crate::transaction::remote`]), and returns its rows (or, for writes,
//! its count) as the statement's own.
//!
//! Rows arrive one at a time (libpq's single-row mode) and go into a
//! tuplestore, which spills to disk beyond `work_mem`: the connection is
//! free again as soon as the statement ends, and nothing a result holds
//! is kept in memory.

use super::computed_values;
use super::moved_shards::{self, is_wrong_shard, locate, ShardTarget};
use super::row_store::RowStore;
use super::stored_scan::{self, ExecMethods, ScanMethods, StoredScan};
use crate::error::{Result, ShardError};
use crate::metadata::shard_lookup::{latest_owner, reader_of};
use crate::metadata::Node;
use crate::transaction::connection::{NodeConnection, Planning};
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
    /// A SELECT that neither writes nor locks rows: while a reads-first
    /// job has switched its range's reads, it may run on the new copy.
    pub(crate) plain_read: bool,
    /// Relations whose changes (a new map replaces partitions) invalidate
    /// the plan.
    pub(crate) relation_oids: Vec<pg_sys::Oid>,
    /// Each shard table the query names, to find it again (a generic
    /// plan's stand-ins when it runs; any plan's after its shard moved).
    pub(crate) targets: Vec<ShardTarget>,
    /// For a generic plan: the parameter whose value picks the shards, and
    /// its type.
    pub(crate) by_parameter: Option<(i32, pg_sys::Oid)>,
    /// How many of the statement's own parameters the worker's statement
    /// takes (a generic plan's; 0 when their values are in its text).
    pub(crate) own_parameters: i32,
    /// Values the metadata node computes when the statement runs
    /// ([`crate::planner::computed_values`]): parameters
    /// `own_parameters + 1`, … of the worker's statement.
    pub(crate) computed: Vec<*mut pg_sys::Expr>,
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
/// For a plan whose shards a parameter picks, the parameter's number and
/// type (empty otherwise).
const PARAMETER: usize = 7;
const PARAMETER_TYPE: usize = 8;
const PLAIN_READ: usize = 9;
/// How many of the statement's parameters go with the worker's statement
/// (the computed values, the plan's `custom_exprs`, follow them).
const OWN_PARAMETERS: usize = 10;
/// Then the shard targets, three strings each ([`ShardTarget::encode`]).
const TARGETS: usize = 11;

/// The plan of a routed statement: one router scan returning the
/// statement's columns (its target list, or RETURNING list).
///
/// # Safety
/// `parse` is the valid parse tree the task was planned from.
pub(crate) unsafe fn planned_statement(
    parse: *mut pg_sys::Query,
    task: RouterTask,
) -> *mut pg_sys::PlannedStmt {
    let (parameter, parameter_type) = match task.by_parameter {
        Some((number, ty)) => (number.to_string(), ty.to_u32().to_string()),
        None => (String::new(), String::new()),
    };
    let mut private: Vec<String> = vec![
        task.query,
        task.node.node_id.to_string(),
        task.node.host,
        task.node.port.to_string(),
        task.shards.join(", "),
        task.map_version.to_string(),
        if task.writes { "t" } else { "f" }.to_string(),
        parameter,
        parameter_type,
        if task.plain_read { "t" } else { "f" }.to_string(),
        task.own_parameters.to_string(),
    ];
    private.extend(ShardTarget::encode(&task.targets));
    // SAFETY: as this function's; the plan's top node is the scan, and the
    // computed values' expressions go in its expression list.
    unsafe {
        let planned =
            stored_scan::statement_plan(parse, &SCAN_METHODS, &private, &task.relation_oids);
        computed_values::attach(planned, task.computed);
        planned
    }
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

/// Run the worker query and store its rows; if a shard refuses it because
/// it moved, wait for the new map and run it where the shards are now
/// ([`moved_shards`]).
unsafe fn run(state: *mut RouterState) -> Result<()> {
    // SAFETY: a running scan of our plan: its slot, descriptor and EState
    // are valid; the tuplestore lives in the query's context.
    unsafe {
        let strings = private_strings(state);
        let field = |i: usize| strings.get(i).cloned().unwrap_or_default();
        let damaged = || ShardError::Internal("a router plan with a damaged field".into());
        let number = |i: usize| -> Result<i64> { field(i).parse().map_err(|_| damaged()) };
        let planned_node = Node {
            node_id: number(NODE_ID)? as i32,
            host: field(HOST),
            port: number(PORT)? as i32,
        };
        let writes = field(WRITES) == "t";
        // The newest map the router knows of (the plan's, unless it was
        // cached across a change): the node's shards check it.
        let mut map_version =
            crate::metadata::shard_lookup::map_version_now()?.max(number(MAP_VERSION)?);
        let planned_query = field(QUERY);
        let targets = ShardTarget::decode(strings.get(TARGETS..).unwrap_or_default())?;
        let estate = (*state).scan.css.ss.ps.state;
        let own_parameters = number(OWN_PARAMETERS)? as i32;
        let computed = computed_values::compute(&mut (*state).scan.css.ss.ps);
        let with_parameters = own_parameters > 0 || !computed.is_empty();
        let params = if with_parameters {
            computed_values::worker_parameters(
                (*estate).es_param_list_info,
                own_parameters,
                &computed,
            )
            .ok_or_else(damaged)?
        } else {
            std::ptr::null_mut()
        };
        // (Texts the node reads back the same: its connections' DateStyle
        // and the like, not this session's.)
        let (types, texts) = if params.is_null() {
            (Vec::new(), Vec::new())
        } else {
            crate::settings::with_portable_text(|| Ok(parameter_texts(params)))?
        };
        let prepared = !field(PARAMETER).is_empty();
        let parameter_id = if prepared {
            let parameter = number(PARAMETER)? as i32;
            let ty = pg_sys::Oid::from(number(PARAMETER_TYPE)? as u32);
            parameter_keyspace_id(params, parameter, ty, writes)?
        } else {
            None
        };
        let (mut node, mut query) = if prepared {
            locate(&targets, parameter_id, &planned_query, cached_owner)?.ok_or_else(|| {
                ShardError::Timeout(
                    "the shard holding this key is being moved or split; run the statement again"
                        .into(),
                )
            })?
        } else {
            (planned_node, planned_query.clone())
        };
        // Reads first: a read that runs on its own goes where the map's
        // read routes send it (a transaction's statements stay with its
        // writes, and see them).
        if field(PLAIN_READ) == "t"
            && reads_on_their_own()
            && crate::metadata::shard_lookup::has_read_routes()?
        {
            if let Some(found) = locate(&targets, parameter_id, &planned_query, reader_of)? {
                (node, query) = found;
            }
        }

        // A cached plan run in a transaction that has since written over
        // postgres_fdw (see planner::router): replanned, for that path.
        if crate::transaction::paths::did_fdw_write() {
            pg_sys::ResetPlanCache();
            return Err(ShardError::PlanAfterFdwWrite);
        }
        let slot = (*state).scan.css.ss.ss_ScanTupleSlot;
        let descriptor = (*slot).tts_tupleDescriptor;
        // A write of a table with lookups: its changes are taken from the
        // node and written to the lookups in the same transaction.
        let lookups = writes && {
            let relids: Vec<pg_sys::Oid> = targets.iter().map(|t| t.relid).collect();
            crate::lookups::catalog::any_has_lookups(&relids)?
        };
        let statement = Statement {
            types,
            texts,
            with_parameters,
            // A custom plan's text holds its values: prepared, it would
            // not run again.
            prepare: prepared || own_parameters > 0,
            writes,
            lookups,
            timezone: current_timezone(),
        };
        let may_run_again = moved_shards::may_run_again();
        let started = Instant::now();
        let mut tries = 1;
        let (rows, outcome) = loop {
            match statement.run(&node, &query, map_version, descriptor) {
                Err(error)
                    if may_run_again && tries < moved_shards::TRIES && is_wrong_shard(&error) =>
                {
                    // What it began on the node is rolled back; the new
                    // map says where to run it.
                    crate::transaction::remote::roll_back_statement();
                    let Some(version) = moved_shards::wait_for_newer_map(map_version)? else {
                        return Err(error);
                    };
                    let Some(found) = locate(&targets, parameter_id, &planned_query, latest_owner)?
                    else {
                        return Err(error);
                    };
                    (node, query) = found;
                    map_version = version;
                    tries += 1;
                }
                result => break result?,
            }
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

/// One run of a routed statement on a node, and what it needs.
struct Statement {
    /// The parameters' types and values, when the statement takes some.
    types: Vec<pg_sys::Oid>,
    texts: Vec<Option<String>>,
    with_parameters: bool,
    /// The node keeps the statement prepared (a generic plan's text, run
    /// again with other values).
    prepare: bool,
    writes: bool,
    /// It writes a table with lookups.
    lookups: bool,
    timezone: String,
}

impl Statement {
    /// Runs `query` on `node` and stores the rows it returns.
    ///
    /// # Safety
    /// `descriptor` is the scan's valid tuple descriptor.
    unsafe fn run(
        &self,
        node: &Node,
        query: &str,
        map_version: i64,
        descriptor: pg_sys::TupleDesc,
    ) -> Result<(RowStore, crate::transaction::connection::Outcome)> {
        // SAFETY: as this function's.
        let mut rows = unsafe { RowStore::new(descriptor) };
        let texts: Vec<Option<&str>> = self.texts.iter().map(|t| t.as_deref()).collect();
        let mut statement = |connection: &mut NodeConnection| {
            let each = |row: &crate::transaction::connection::TextRow<'_>| rows.put(row, node);
            if self.prepare {
                connection.for_each_row_prepared(query, &self.types, &texts, each)
            } else if self.with_parameters {
                connection.for_each_row(query, &self.types, &texts, each)
            } else {
                connection.for_each_row(query, &[], &[], each)
            }
        };
        // An autocommit read outside any remote transaction there runs on
        // its own (no BEGIN and COMMIT round trips), and so does a write
        // that is all its transaction does. Another write joins the local
        // transaction: another statement of it (an extended-protocol
        // pipeline's) may still fail and roll it back; so does every
        // statement of a transaction block (it sees what the ones before it
        // wrote, and keeps its locks and snapshot).
        if self.writes {
            crate::transaction::paths::router_wrote();
        }
        // SAFETY: reads the transaction state.
        let in_block = unsafe { pg_sys::IsTransactionBlock() };
        let alone = !in_block
            && !self.lookups
            && !has_transaction_on(node)
            && (!self.writes
                || (crate::transaction::remote::none_open() && transaction_ends_with_statement()));
        let outcome = if !alone {
            let access = if self.writes {
                Access::Write
            } else {
                Access::Read
            };
            let mut changes = Vec::new();
            let outcome =
                with_declared_transaction(node, access, Some(map_version), |connection| {
                    connection.declare_session(map_version, &self.timezone, Planning::Own)?;
                    let outcome = statement(connection)?;
                    if self.lookups {
                        crate::lookups::apply::take(connection, &mut changes)?;
                    }
                    Ok(outcome)
                })?;
            // (Once the node's connection is back: a lookup shard may be
            // on the same node.)
            crate::lookups::apply::apply(changes, map_version)?;
            outcome
        } else {
            autocommit(node, |connection| {
                connection.declare_for_autocommit(map_version, &self.timezone, Planning::Own)?;
                statement(connection)
            })?
        };
        Ok((rows, outcome))
    }
}

/// Whether the local transaction ends once the running statement does
/// (outside transaction blocks, explicit or implicit): a simple-protocol
/// query of one statement, or an extended-protocol Execute whose Sync the
/// client already sent (drivers send Bind, Execute and Sync together). An
/// Execute followed by more messages before its Sync, or by nothing yet,
/// may be one of several statements of one transaction.
fn transaction_ends_with_statement() -> bool {
    const SYNC: std::ffi::c_int = b'S' as std::ffi::c_int;
    // SAFETY: reads the active portal (the running statement's) and the
    // backend's input buffer, without consuming or waiting for anything.
    unsafe {
        let portal = pg_sys::ActivePortal;
        if pg_sys::IsTransactionBlock() || portal.is_null() {
            return false;
        }
        // exec_simple_query runs its statements without a cached plan;
        // Bind always makes one.
        if (*portal).cplan.is_null() {
            return true;
        }
        pq_buffer_has_data() && pq_peekbyte() == SYNC
    }
}

extern "C-unwind" {
    /// Whether the backend's input buffer holds unread bytes (libpq/libpq.h).
    fn pq_buffer_has_data() -> bool;
    /// The next input byte, not consumed; waits when nothing is buffered.
    fn pq_peekbyte() -> std::ffi::c_int;
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

/// The keyspace id of a generic plan's key parameter for this run; None
/// for a NULL key in a read (`key = NULL` matches no row).
unsafe fn parameter_keyspace_id(
    params: pg_sys::ParamListInfo,
    number: i32,
    ty: pg_sys::Oid,
    writes: bool,
) -> Result<Option<i64>> {
    let damaged = || ShardError::Internal("a router plan with a damaged field".into());
    // SAFETY: a valid parameter list holding the parameter the plan names.
    unsafe {
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
            return Ok(None);
        }
        Ok(Some(
            crate::keyspace::key_to_keyspace_id((*value).value, ty)?.to_sql(),
        ))
    }
}

/// Whether a read now runs outside any transaction of several statements:
/// not in a transaction block, and nothing of the transaction ran on the
/// workers yet (an extended-protocol pipeline's earlier writes).
fn reads_on_their_own() -> bool {
    // SAFETY: reads the transaction state.
    !unsafe { pg_sys::IsTransactionBlock() } && crate::transaction::remote::none_open()
}

/// The shard holding a keyspace id, from the router's cache of the map.
fn cached_owner(relid: pg_sys::Oid, keyspace_id: i64) -> Result<Option<(Node, String)>> {
    Ok(crate::metadata::shard_lookup::shard_of(relid, keyspace_id)?
        .map(|shard| (shard.node, shard.qualified)))
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
        let by_parameter = !field(PARAMETER).is_empty();
        property(c"Class", "router (whole statement on one node)".to_string());
        if by_parameter {
            property(c"Node", "the one holding the shards".to_string());
        } else {
            property(
                c"Node",
                format!("{}:{} (node {})", field(HOST), field(PORT), field(NODE_ID)),
            );
        }
        if by_parameter {
            property(
                c"Shards",
                format!("picked by ${} when the statement runs", field(PARAMETER)),
            );
        } else {
            property(c"Shards", field(SHARDS));
        }
        property(c"Worker Query", field(QUERY));
        let own: usize = field(OWN_PARAMETERS).parse().unwrap_or(0);
        computed_values::explain(&mut (*node).ss.ps, own, es);
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
