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

/// Free the stored rows and the fetch slot.
///
/// # Safety
/// `node` is a pg_shard scan's state; each resource is freed once.
pub(crate) unsafe fn end(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above.
    unsafe {
        let state = node as *mut StoredScan;
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
