//! What pg_shard's custom scans share: the rows a scan's nodes sent are
//! stored (a tuplestore, [`super::row_store`]) the first time a row is
//! asked for, then handed out one at a time; the plan's facts are strings
//! in `custom_private`.

use crate::error::Result;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{c_int, CStr};

// Declared here rather than taken from pgrx::pg_sys, whose bindings turn a
// PostgreSQL error into a Rust panic: a node's error must reach
// PostgreSQL's handler as itself, with its SQLSTATE.
unsafe extern "C-unwind" {
    #[link_name = "ExecScan"]
    fn postgres_exec_scan(
        node: *mut pg_sys::ScanState,
        access: pg_sys::ExecScanAccessMtd,
        recheck: pg_sys::ExecScanRecheckMtd,
    ) -> *mut pg_sys::TupleTableSlot;
}

/// A scan's methods by name (plans are copied and read back by name).
#[repr(transparent)]
pub(crate) struct ScanMethods(pub(crate) pg_sys::CustomScanMethods);
// SAFETY: immutable after initialisation, and backends are single-threaded.
unsafe impl Sync for ScanMethods {}

impl ScanMethods {
    pub(crate) const fn new(
        name: &'static CStr,
        create_state: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScan) -> *mut pg_sys::Node,
    ) -> ScanMethods {
        ScanMethods(pg_sys::CustomScanMethods {
            CustomName: name.as_ptr(),
            CreateCustomScanState: Some(create_state),
        })
    }
}

/// A running scan's methods: the shared [`begin`] and [`rescan`], the
/// scan's own row source, end and EXPLAIN.
#[repr(transparent)]
pub(crate) struct ExecMethods(pub(crate) pg_sys::CustomExecMethods);
// SAFETY: as above.
unsafe impl Sync for ExecMethods {}

type Explain = unsafe extern "C-unwind" fn(
    *mut pg_sys::CustomScanState,
    *mut pg_sys::List,
    *mut pg_sys::ExplainState,
);

impl ExecMethods {
    pub(crate) const fn new(
        name: &'static CStr,
        exec: unsafe extern "C-unwind" fn(
            *mut pg_sys::CustomScanState,
        ) -> *mut pg_sys::TupleTableSlot,
        end: unsafe extern "C-unwind" fn(*mut pg_sys::CustomScanState),
        explain: Explain,
    ) -> ExecMethods {
        ExecMethods(pg_sys::CustomExecMethods {
            CustomName: name.as_ptr(),
            BeginCustomScan: Some(begin),
            ExecCustomScan: Some(exec),
            EndCustomScan: Some(end),
            ReScanCustomScan: Some(rescan),
            MarkPosCustomScan: None,
            RestrPosCustomScan: None,
            EstimateDSMCustomScan: None,
            InitializeDSMCustomScan: None,
            ReInitializeDSMCustomScan: None,
            InitializeWorkerCustomScan: None,
            ShutdownCustomScan: None,
            ExplainCustomScan: Some(explain),
        })
    }
}

/// Each node's part of a run, for EXPLAIN ANALYZE: milliseconds from the
/// start until its last row, and its rows.
pub(crate) type Timings = Vec<(f64, u64)>;

/// The first part of every pg_shard scan's state (PostgreSQL's part
/// first, as it expects).
#[repr(C)]
pub(crate) struct StoredScan {
    pub(crate) css: pg_sys::CustomScanState,
    pub(crate) store: *mut pg_sys::Tuplestorestate,
    /// Rows come out of the tuplestore as minimal tuples (then copied into
    /// the scan slot).
    pub(crate) fetch_slot: *mut pg_sys::TupleTableSlot,
    pub(crate) ran: bool,
    /// Per node, for EXPLAIN ANALYZE: milliseconds until it finished, and
    /// its rows (a Box owned by the state, freed at the end).
    timings: *mut Timings,
}

impl StoredScan {
    /// Keep each node's time and rows for EXPLAIN ANALYZE.
    pub(crate) fn set_timings(&mut self, timings: Timings) {
        self.free_timings();
        self.timings = Box::into_raw(Box::new(timings));
    }

    /// Each node's time and rows, once the scan ran.
    pub(crate) fn timings(&self) -> Option<&Timings> {
        // SAFETY: NULL or a Box this state owns until its end.
        unsafe { self.timings.as_ref() }
    }

    fn free_timings(&mut self) {
        if !self.timings.is_null() {
            // SAFETY: a Box made by set_timings, freed once.
            drop(unsafe { Box::from_raw(self.timings) });
            self.timings = std::ptr::null_mut();
        }
    }
}

/// A zeroed state of type `S` (starting with a [`StoredScan`]) for a scan
/// running with `methods`.
///
/// # Safety
/// `S` is `#[repr(C)]` and starts with a StoredScan.
pub(crate) unsafe fn create_state<S>(
    methods: *const pg_sys::CustomExecMethods,
) -> *mut pg_sys::Node {
    // SAFETY: a zeroed node of S's size in the executor's context.
    unsafe {
        let state = pg_sys::palloc0(std::mem::size_of::<S>()) as *mut StoredScan;
        (*state).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        (*state).css.methods = methods;
        state as *mut pg_sys::Node
    }
}

pub(crate) unsafe extern "C-unwind" fn begin(
    node: *mut pg_sys::CustomScanState,
    _estate: *mut pg_sys::EState,
    _eflags: c_int,
) {
    // SAFETY: our state, with its scan slot made by ExecInitCustomScan.
    unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| {
            let state = node as *mut StoredScan;
            let descriptor = (*(*node).ss.ss_ScanTupleSlot).tts_tupleDescriptor;
            (*state).fetch_slot =
                pg_sys::MakeSingleTupleTableSlot(descriptor, &pg_sys::TTSOpsMinimalTuple);
        })
    }
}

/// ExecScan with the scan's row source.
///
/// # Safety
/// `node` is a pg_shard scan's state.
pub(crate) unsafe fn exec(
    node: *mut pg_sys::CustomScanState,
    next_row: unsafe extern "C-unwind" fn(*mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: ExecScan calls back with the node. This frame owns nothing,
    // so an error may longjmp through it as it is.
    unsafe { postgres_exec_scan(&mut (*node).ss, Some(next_row), Some(recheck)) }
}

unsafe extern "C-unwind" fn recheck(
    _node: *mut pg_sys::ScanState,
    _slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    true
}

/// The scan's next row: the first call runs `run`, which stores the rows.
///
/// # Safety
/// `node` is a pg_shard scan's state, and `run` its own.
pub(crate) unsafe fn next_row(
    node: *mut pg_sys::ScanState,
    run: unsafe fn(*mut pg_sys::ScanState) -> Result<()>,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: node starts with our StoredScan.
    unsafe {
        let state = node as *mut StoredScan;
        if !(*state).ran {
            (*state).ran = true;
            // The rows live as long as the query: a node above (an
            // aggregate) may call in a context reset for every row.
            let estate = (*state).css.ss.ps.state;
            let previous = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
            // The error is raised outside the guard, where nothing owns
            // memory, with the node's SQLSTATE.
            if let Some(error) = pg_sys::panic::pgrx_extern_c_guard(|| run(node).err()) {
                error.raise();
            }
            pg_sys::MemoryContextSwitchTo(previous);
        }
        pg_sys::panic::pgrx_extern_c_guard(|| {
            next_stored_row(
                (*state).store,
                (*state).fetch_slot,
                (*state).css.ss.ss_ScanTupleSlot,
            )
        })
    }
}

/// The next stored row, in the scan's own slot; an empty slot after the
/// last one. PostgreSQL 15 gives custom scans a virtual scan slot, whose
/// readers take its values as they are: the row fetched as a minimal tuple
/// is copied in (by reference; it stays valid until the next row).
unsafe fn next_stored_row(
    store: *mut pg_sys::Tuplestorestate,
    fetch_slot: *mut pg_sys::TupleTableSlot,
    scan_slot: *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: a valid tuplestore (or NULL) of the slots' descriptor;
    // copyslot is the destination's own method.
    unsafe {
        if store.is_null() || !pg_sys::tuplestore_gettupleslot(store, true, false, fetch_slot) {
            pg_sys::ExecClearTuple(fetch_slot);
            return pg_sys::ExecClearTuple(scan_slot);
        }
        if let Some(copy) = (*(*scan_slot).tts_ops).copyslot {
            copy(scan_slot, fetch_slot);
        }
        scan_slot
    }
}

/// Free the stored rows, the fetch slot and the timings (every pg_shard
/// scan's EndCustomScan).
pub(crate) unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    // SAFETY: a pg_shard scan's state; each resource is freed once.
    unsafe {
        let state = node as *mut StoredScan;
        (*state).free_timings();
        if !(*state).store.is_null() {
            pg_sys::tuplestore_end((*state).store);
            (*state).store = std::ptr::null_mut();
        }
        if !(*state).fetch_slot.is_null() {
            pg_sys::ExecDropSingleTupleTableSlot((*state).fetch_slot);
            (*state).fetch_slot = std::ptr::null_mut();
        }
    }
}

pub(crate) unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our state; reading the stored rows again from the start.
    unsafe {
        let state = node as *mut StoredScan;
        if !(*state).store.is_null() {
            pg_sys::tuplestore_rescan((*state).store);
        }
    }
}

/// The plan's strings.
///
/// # Safety
/// `node` is a running pg_shard scan.
pub(crate) unsafe fn private_strings(node: *mut pg_sys::CustomScanState) -> Vec<String> {
    // SAFETY: our plan's private list, a list of String nodes.
    unsafe {
        let plan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
        PgList::<pg_sys::String>::from_pg((*plan).custom_private)
            .iter_ptr()
            .map(|s| CStr::from_ptr((*s).sval).to_string_lossy().into_owned())
            .collect()
    }
}

/// The plan of a statement run whole by one of our scans (`methods`): the
/// scan at the top, returning the statement's columns (its target list, or
/// RETURNING list), with `private` as its strings; the plan depends on
/// `relation_oids`.
///
/// # Safety
/// `parse` is the valid parse tree the scan's work was planned from.
pub(crate) unsafe fn statement_plan(
    parse: *mut pg_sys::Query,
    methods: &'static ScanMethods,
    private: &[String],
    relation_oids: &[pg_sys::Oid],
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: building plan nodes in the planner's memory context from a
    // valid parse tree.
    unsafe {
        let rtable = flat_range_table(parse);
        let remote_index = rtable.len() as i32 + 1;
        let output = if (*parse).commandType == pg_sys::CmdType::CMD_SELECT {
            (*parse).targetList
        } else {
            (*parse).returningList
        };
        let mut plan_targets = PgList::<pg_sys::TargetEntry>::new();
        let mut scan_targets = PgList::<pg_sys::TargetEntry>::new();
        let mut column_names = PgList::<pg_sys::Node>::new();
        let mut attno: i16 = 0;
        for entry in PgList::<pg_sys::TargetEntry>::from_pg(output).iter_ptr() {
            if (*entry).resjunk {
                continue;
            }
            attno += 1;
            let expr = (*entry).expr as *mut pg_sys::Node;
            let (ty, typmod, collation) = (
                pg_sys::exprType(expr),
                pg_sys::exprTypmod(expr),
                pg_sys::exprCollation(expr),
            );
            let name = if (*entry).resname.is_null() {
                pg_sys::pstrdup(c"?column?".as_ptr())
            } else {
                pg_sys::pstrdup((*entry).resname)
            };
            let outer = pg_sys::makeVar(pg_sys::INDEX_VAR, attno, ty, typmod, collation, 0);
            plan_targets.push(pg_sys::makeTargetEntry(
                outer as *mut pg_sys::Expr,
                attno,
                name,
                false,
            ));
            let inner = pg_sys::makeVar(remote_index, attno, ty, typmod, collation, 0);
            scan_targets.push(pg_sys::makeTargetEntry(
                inner as *mut pg_sys::Expr,
                attno,
                name,
                false,
            ));
            column_names.push(pg_sys::makeString(name) as *mut pg_sys::Node);
        }
        let mut scan = PgBox::<pg_sys::CustomScan>::alloc_node(pg_sys::NodeTag::T_CustomScan);
        scan.scan.plan.targetlist = plan_targets.into_pg();
        scan.scan.plan.plan_rows = 0.0;
        scan.scan.plan.startup_cost = 0.0;
        scan.scan.plan.total_cost = 0.0;
        scan.scan.scanrelid = 0;
        scan.custom_scan_tlist = scan_targets.into_pg();
        scan.methods = &methods.0;
        let mut strings = PgList::<pg_sys::Node>::new();
        for text in private {
            strings.push(pg_sys::makeString(palloc_string(text)) as *mut pg_sys::Node);
        }
        scan.custom_private = strings.into_pg();

        let mut remote =
            PgBox::<pg_sys::RangeTblEntry>::alloc_node(pg_sys::NodeTag::T_RangeTblEntry);
        remote.rtekind = pg_sys::RTEKind::RTE_VALUES;
        remote.eref = pg_sys::makeAlias(c"remote_scan".as_ptr(), column_names.into_pg());
        remote.inFromCl = true;
        let mut range_table = PgList::<pg_sys::RangeTblEntry>::new();
        for entry in rtable {
            range_table.push(entry);
        }
        range_table.push(remote.into_pg());

        let mut oids = std::ptr::null_mut();
        for oid in relation_oids {
            oids = pg_sys::lappend_oid(oids, *oid);
        }

        let mut stmt = PgBox::<pg_sys::PlannedStmt>::alloc_node(pg_sys::NodeTag::T_PlannedStmt);
        stmt.commandType = (*parse).commandType;
        stmt.queryId = (*parse).queryId;
        stmt.hasReturning = !(*parse).returningList.is_null();
        stmt.hasModifyingCTE = (*parse).hasModifyingCTE;
        stmt.canSetTag = (*parse).canSetTag;
        stmt.planTree = scan.into_pg() as *mut pg_sys::Plan;
        stmt.rtable = range_table.into_pg();
        stmt.relationOids = oids;
        stmt.stmt_location = (*parse).stmt_location;
        stmt.stmt_len = (*parse).stmt_len;
        stmt.into_pg()
    }
}

/// Copies of the tables every level of `parse` names, with the privileges
/// they need: the executor checks those and takes their locks, as for any
/// statement (the worker checks again, as the same role).
pub(crate) unsafe fn flat_range_table(
    parse: *mut pg_sys::Query,
) -> Vec<*mut pg_sys::RangeTblEntry> {
    // SAFETY: walking and copying entries of a valid parse tree.
    unsafe {
        crate::parse_tree::contents(parse)
            .range_entries
            .into_iter()
            .filter(|rte| (**rte).rtekind == pg_sys::RTEKind::RTE_RELATION)
            .map(|rte| {
                let copy = pg_sys::copyObjectImpl(rte as *const std::ffi::c_void)
                    as *mut pg_sys::RangeTblEntry;
                (*copy).subquery = std::ptr::null_mut();
                copy
            })
            .collect()
    }
}

/// `text` copied into the current memory context (without NUL bytes).
pub(crate) fn palloc_string(text: &str) -> *mut std::ffi::c_char {
    let owned = std::ffi::CString::new(text.replace('\0', "")).unwrap_or_default();
    // SAFETY: copies a NUL-terminated string into the current context.
    unsafe { pg_sys::pstrdup(owned.as_ptr()) }
}

/// A custom scan with `methods` and `private` in place of `scan`, a
/// function scan standing for rows pg_shard computes (`columns`, the
/// function's): the same plan fields, its columns read from its own tuple
/// (INDEX_VAR), as `custom_scan_tlist` describes it.
///
/// # Safety
/// `scan` is a function scan of a plan being completed.
pub(crate) unsafe fn custom_scan_for(
    scan: *mut pg_sys::FunctionScan,
    columns: &[(pg_sys::Oid, i32, pg_sys::Oid)],
    methods: *const pg_sys::CustomScanMethods,
    private: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: new nodes in the planner's context; the scan's fields are
    // moved over.
    unsafe {
        let relid = (*scan).scan.scanrelid as i32;
        let mut custom = PgBox::<pg_sys::CustomScan>::alloc_node(pg_sys::NodeTag::T_CustomScan);
        custom.scan.plan = (*scan).scan.plan;
        custom.scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        custom.scan.scanrelid = 0;
        crate::parse_tree::renumber_vars(
            custom.scan.plan.targetlist as *mut pg_sys::Node,
            relid,
            pg_sys::INDEX_VAR,
        );
        crate::parse_tree::renumber_vars(
            custom.scan.plan.qual as *mut pg_sys::Node,
            relid,
            pg_sys::INDEX_VAR,
        );
        let mut scan_targets = PgList::<pg_sys::TargetEntry>::new();
        for (i, (ty, typmod, collation)) in columns.iter().enumerate() {
            let var = pg_sys::makeVar(relid, (i + 1) as i16, *ty, *typmod, *collation, 0);
            let name = std::ffi::CString::new(format!("c{}", i + 1)).unwrap_or_default();
            scan_targets.push(pg_sys::makeTargetEntry(
                var as *mut pg_sys::Expr,
                (i + 1) as i16,
                pg_sys::pstrdup(name.as_ptr()),
                false,
            ));
        }
        custom.custom_scan_tlist = scan_targets.into_pg();
        custom.methods = methods;
        custom.custom_private = private;
        custom.into_pg() as *mut pg_sys::Plan
    }
}

/// Store `text` as a plan string.
pub(crate) fn plan_string(text: &str) -> *mut pg_sys::Node {
    // SAFETY: a new String node in the current context.
    unsafe { pg_sys::makeString(palloc_string(text)) as *mut pg_sys::Node }
}
