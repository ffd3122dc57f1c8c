//! `Custom Scan (pg_shard Intermediate Result)`: the rows of a statement
//! planned apart from the one it serves ([`crate::planner`]'s intermediate
//! results: an `EXISTS` test on a distributed table not tied to its
//! distribution column). The statement runs once, through an SPI cursor
//! (so the planner hook routes it: a pushdown over the workers), on the
//! first row asked for; the rows are stored (work_mem, then a temporary
//! file) and read again on every rescan.

use super::stored_scan::{self, ExecMethods, ScanMethods, StoredScan};
use crate::error::{Result, ShardError};
use crate::planner::intermediate::{
    Intermediates, Running, ENTRY_PREFIX, FEW_VALUES, MAX_VALUES, PARAMETERS_PER_RESTRICTION,
};
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::{CStr, CString};
use std::time::Instant;

const NAME: &CStr = c"pg_shard Intermediate Result";

/// Rows fetched from the intermediate statement at a time.
const FETCH_ROWS: std::ffi::c_long = 1000;

static SCAN_METHODS: ScanMethods = ScanMethods::new(NAME, create_state);
static EXEC_METHODS: ExecMethods = ExecMethods::new(NAME, exec, stored_scan::end, explain);

/// Make the scan known by name (plans are copied and read back by name).
pub(crate) fn register() {
    // SAFETY: a static that lives as long as the backend.
    unsafe { pg_sys::RegisterCustomScanMethods(&SCAN_METHODS.0) };
}

/// Replace the function scans standing for `intermediates` in `planned`
/// (its tree and its subplans) by intermediate result scans, and make the
/// plan depend on the tables they read.
///
/// # Safety
/// `planned` is the plan PostgreSQL just made of the rewritten statement.
pub(crate) unsafe fn attach(
    planned: *mut pg_sys::PlannedStmt,
    intermediates: &Intermediates,
) -> Result<*mut pg_sys::PlannedStmt> {
    // SAFETY: a plan just made; nodes are replaced in the planner's context.
    unsafe {
        for relid in &intermediates.relids {
            (*planned).relationOids = pg_sys::lappend_oid((*planned).relationOids, *relid);
        }
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*planned).rtable);
        let mut replaced = 0;
        let mut replace = |scan: *mut pg_sys::FunctionScan| -> Option<*mut pg_sys::Plan> {
            let entry = rtable.get_ptr((*scan).scan.scanrelid as usize - 1)?;
            let name = CStr::from_ptr((*(*entry).eref).aliasname).to_str().ok()?;
            let number: usize = name.strip_prefix(ENTRY_PREFIX)?.parse().ok()?;
            let query = intermediates.queries.get(number)?;
            let columns = intermediates.columns.get(number)?;
            let mut private = PgList::<pg_sys::Node>::new();
            private.push(stored_scan::plan_string(query));
            for values in intermediates.parameters.get(number)? {
                private.push(stored_scan::plan_string(&values.query));
                private.push(stored_scan::plan_string(
                    &values.array_type.to_u32().to_string(),
                ));
            }
            replaced += 1;
            Some(stored_scan::custom_scan_for(
                scan,
                columns,
                &SCAN_METHODS.0,
                private.into_pg(),
            ))
        };
        (*planned).planTree = replace_function_scans((*planned).planTree, &mut replace);
        let subplans = PgList::<pg_sys::Plan>::from_pg((*planned).subplans);
        let mut new_subplans = PgList::<pg_sys::Plan>::new();
        for subplan in subplans.iter_ptr() {
            new_subplans.push(replace_function_scans(subplan, &mut replace));
        }
        (*planned).subplans = new_subplans.into_pg();
        if replaced < intermediates.queries.len() {
            return Err(ShardError::Internal(
                "an intermediate result's scan is not where pg_shard looks for it".into(),
            ));
        }
        Ok(planned)
    }
}

/// `plan` with every function scan `replace` takes swapped for what it
/// returns, in the plan nodes a read-only statement's plan is made of.
unsafe fn replace_function_scans(
    plan: *mut pg_sys::Plan,
    replace: &mut dyn FnMut(*mut pg_sys::FunctionScan) -> Option<*mut pg_sys::Plan>,
) -> *mut pg_sys::Plan {
    // SAFETY: nodes of a valid plan tree, changed in place.
    unsafe {
        if plan.is_null() {
            return plan;
        }
        match (*plan).type_ {
            pg_sys::NodeTag::T_FunctionScan => {
                return replace(plan as *mut pg_sys::FunctionScan).unwrap_or(plan);
            }
            pg_sys::NodeTag::T_Append => {
                let append = plan as *mut pg_sys::Append;
                (*append).appendplans = replace_in_list((*append).appendplans, replace);
            }
            pg_sys::NodeTag::T_MergeAppend => {
                let append = plan as *mut pg_sys::MergeAppend;
                (*append).mergeplans = replace_in_list((*append).mergeplans, replace);
            }
            pg_sys::NodeTag::T_SubqueryScan => {
                let scan = plan as *mut pg_sys::SubqueryScan;
                (*scan).subplan = replace_function_scans((*scan).subplan, replace);
            }
            _ => {}
        }
        (*plan).lefttree = replace_function_scans((*plan).lefttree, replace);
        (*plan).righttree = replace_function_scans((*plan).righttree, replace);
        plan
    }
}

unsafe fn replace_in_list(
    plans: *mut pg_sys::List,
    replace: &mut dyn FnMut(*mut pg_sys::FunctionScan) -> Option<*mut pg_sys::Plan>,
) -> *mut pg_sys::List {
    // SAFETY: a list of plans.
    unsafe {
        let old = PgList::<pg_sys::Plan>::from_pg(plans);
        let mut new = PgList::<pg_sys::Plan>::new();
        for plan in old.iter_ptr() {
            new.push(replace_function_scans(plan, replace));
        }
        new.into_pg()
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
    unsafe { stored_scan::next_row(node, run) }
}

/// Run the statement through SPI and store its rows.
unsafe fn run(node: *mut pg_sys::ScanState) -> Result<()> {
    // SAFETY: a running scan of ours, in the query's memory context (the
    // tuplestore lives there; SPI's memory is its own until SPI_finish).
    unsafe {
        let state = node as *mut StoredScan;
        let strings = stored_scan::private_strings(&mut (*state).css);
        let query = strings.first().ok_or_else(|| {
            ShardError::Internal("an intermediate result without its query".into())
        })?;
        let started = Instant::now();
        let descriptor = (*(*state).css.ss.ss_ScanTupleSlot).tts_tupleDescriptor;
        let store = pg_sys::tuplestore_begin_heap(false, false, pg_sys::work_mem);
        let text = CString::new(query.as_str())
            .map_err(|_| ShardError::Internal("an intermediate query with a NUL".into()))?;
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            return Err(ShardError::Internal("SPI_connect failed".into()));
        }
        // Through a cursor, a batch at a time: the rows are held only in
        // the tuplestore (work_mem, then a temporary file).
        let mut rows: u64 = 0;
        let counted;
        {
            let (mut types, mut values, nulls, values_counted) = match parameters(&strings[1..]) {
                Ok(found) => found,
                Err(e) => {
                    pg_sys::SPI_finish();
                    return Err(e);
                }
            };
            counted = values_counted;
            let _running = Running::start(&text);
            let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as i32, types.as_mut_ptr());
            if plan.is_null() {
                pg_sys::SPI_finish();
                return Err(ShardError::Internal(
                    "an intermediate statement could not be prepared".into(),
                ));
            }
            let portal = pg_sys::SPI_cursor_open(
                std::ptr::null(),
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                true,
            );
            loop {
                pg_sys::SPI_cursor_fetch(portal, true, FETCH_ROWS);
                let table = pg_sys::SPI_tuptable;
                let fetched = pg_sys::SPI_processed;
                if table.is_null() || fetched == 0 {
                    break;
                }
                if (*(*table).tupdesc).natts != (*descriptor).natts {
                    pg_sys::SPI_cursor_close(portal);
                    pg_sys::SPI_finish();
                    return Err(ShardError::Internal(
                        "an intermediate statement's columns differ from its scan's".into(),
                    ));
                }
                for i in 0..fetched as usize {
                    pg_sys::tuplestore_puttuple(store, *(*table).vals.add(i));
                }
                rows += fetched;
                pg_sys::SPI_freetuptable(table);
            }
            pg_sys::SPI_cursor_close(portal);
        }
        pg_sys::SPI_finish();
        (*state).store = store;
        let mut timings = vec![(started.elapsed().as_secs_f64() * 1000.0, rows)];
        timings.extend(counted);
        (*state).set_timings(timings);
        Ok(())
    }
}

/// The intermediate statement's parameters from `described` (each
/// restriction's values query and array type): their types, values and
/// nulls for SPI. Each values query reads reference tables, here; up to
/// [`FEW_VALUES`] values are passed as the first array, up to
/// [`MAX_VALUES`] as the second, more lift the restriction. Also each
/// values query's time and count of values, for EXPLAIN ANALYZE.
#[allow(clippy::type_complexity)]
unsafe fn parameters(
    described: &[String],
) -> Result<(
    Vec<pg_sys::Oid>,
    Vec<pg_sys::Datum>,
    Vec<std::ffi::c_char>,
    Vec<(f64, u64)>,
)> {
    let mut counted = Vec::new();
    let mut types = Vec::new();
    let mut values = Vec::new();
    let mut nulls = Vec::new();
    for pair in described.chunks(2) {
        let [query, array_type] = pair else {
            return Err(ShardError::Internal(
                "an intermediate parameter without its type".into(),
            ));
        };
        let array_type: u32 = array_type
            .parse()
            .map_err(|_| ShardError::Internal("an intermediate parameter's type".into()))?;
        let text = CString::new(query.as_str())
            .map_err(|_| ShardError::Internal("a values query with a NUL".into()))?;
        let started = Instant::now();
        // SAFETY: inside the scan's SPI connection; the array stays in
        // SPI's memory until SPI_finish, after the cursor is closed.
        let (count, array) = unsafe {
            // (No row limit: the query returns one row, and a limit would
            // keep PostgreSQL from running it with parallel workers.)
            if pg_sys::SPI_execute(text.as_ptr(), true, 0) != pg_sys::SPI_OK_SELECT as i32
                || pg_sys::SPI_processed != 1
            {
                return Err(ShardError::Internal(
                    "a restriction's values query failed".into(),
                ));
            }
            let table = pg_sys::SPI_tuptable;
            let row = *(*table).vals;
            let mut null = false;
            let count = pg_sys::SPI_getbinval(row, (*table).tupdesc, 1, &mut null);
            let count = if null { 0 } else { count.value() as i64 };
            let array = pg_sys::SPI_getbinval(row, (*table).tupdesc, 2, &mut null);
            (count, (!null).then_some(array))
        };
        counted.push((
            started.elapsed().as_secs_f64() * 1000.0,
            count.max(0) as u64,
        ));
        // (`= ANY ($1)` unless $2, `IN (SELECT unnest($3))` unless $4.)
        let few = count <= FEW_VALUES;
        let many = count > FEW_VALUES && count <= MAX_VALUES;
        for (used, array) in [(few, array.filter(|_| few)), (many, array.filter(|_| many))] {
            types.push(pg_sys::Oid::from(array_type));
            types.push(pg_sys::BOOLOID);
            match array {
                Some(array) => {
                    values.push(array);
                    nulls.push(b' ' as std::ffi::c_char);
                }
                None => {
                    values.push(pg_sys::Datum::from(0));
                    nulls.push(b'n' as std::ffi::c_char);
                }
            }
            values.push(pg_sys::Datum::from(!used));
            nulls.push(b' ' as std::ffi::c_char);
        }
    }
    Ok((types, values, nulls, counted))
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
            let property = |label: &CStr, value: &str| {
                let value = CString::new(value).unwrap_or_default();
                pg_sys::ExplainPropertyText(label.as_ptr(), value.as_ptr(), es);
            };
            property(
                c"Class",
                "intermediate result (its own statement, run first)",
            );
            if let Some(query) = strings.first() {
                property(c"Intermediate Query", query);
            }
            for (number, pair) in strings[1.min(strings.len())..].chunks(2).enumerate() {
                let first = PARAMETERS_PER_RESTRICTION * number + 1;
                let label = CString::new(format!("Values of ${} and ${}", first, first + 2))
                    .unwrap_or_default();
                property(&label, &pair[0]);
            }
            if (*es).analyze {
                if let Some([(ms, rows), restrictions @ ..]) =
                    (*state).timings().map(|t| t.as_slice())
                {
                    property(c"Intermediate Rows", &format!("{rows} in {ms:.3} ms"));
                    for (ms, count) in restrictions {
                        let count = *count as i64;
                        let found = if count > MAX_VALUES {
                            format!("more than {MAX_VALUES} in {ms:.3} ms, not restricted")
                        } else if count > FEW_VALUES {
                            format!("{count} in {ms:.3} ms, passed as a set")
                        } else {
                            format!("{count} in {ms:.3} ms, passed as an array")
                        };
                        property(c"Restriction Values", &found);
                    }
                }
            }
        })
    }
}
