//! Ownership and epoch enforced at the worker: "routers may be wrong, shards
//! may not".
//!
//! Every shard table carries two triggers:
//! * `pg_shard_guard_statement` (BEFORE INSERT/UPDATE/DELETE/TRUNCATE, per
//!   statement) rejects the statement when the shard is frozen or retired, or
//!   when the session declared (`SET pg_shard.map_version`) a map version
//!   older than the epoch at which this worker took the shard;
//! * `pg_shard_guard_row` (BEFORE UPDATE, per row) rejects a row whose
//!   distribution key hashes outside the shard's range. Its arguments are the
//!   distribution column and the range, which never change for a shard table.
//! * `pg_shard_guard_inserted` (AFTER INSERT, per statement, over the
//!   statement's new rows as a transition table) does the same for inserted
//!   rows: a BEFORE row trigger would keep COPY from inserting in batches,
//!   which costs more than the check itself. A rejection raised after the
//!   rows were written rolls them back with the statement.
//!
//! Rejections carry one SQLSTATE, [`WRONG_SHARD_SQLSTATE`] (`PS001`), so a
//! router can tell "refresh the map and retry" from every other error. The
//! triggers do not fire for logical replication apply, so shard moves can
//! fill a destination before it owns the range.

use crate::keyspace::{base_type, keyspace_id_of_base_type};
use crate::quote;
use pg_shard_core::KeyspaceId;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};

/// The SQLSTATE of a WrongShard rejection.
pub(crate) const WRONG_SHARD_SQLSTATE: &str = "PS001";

/// The map version the session's router planned with; 0 = not declared.
pub(crate) static DECLARED_MAP_VERSION: GucSetting<i32> = GucSetting::<i32>::new(0);

pub(crate) fn register_gucs() {
    GucRegistry::define_int_guc(
        c"pg_shard.map_version",
        c"Shard map version the routing of this session's statements was planned with.",
        c"Set by routers (the metadata node, the coordinator). A shard rejects writes from \
          a session that declares a version older than the epoch at which the worker took \
          the shard. 0 means not declared.",
        &DECLARED_MAP_VERSION,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// A refusal, ready to raise: message and detail as palloc'd C strings, so
/// that raising it (a longjmp) skips no Rust value that owns memory.
pub(crate) struct Rejection {
    message: *mut c_char,
    detail: *mut c_char,
}

impl Rejection {
    /// Built inside the guarded part of a trigger call: reading the worker's
    /// map version may itself raise an error, which must reach pgrx's guard.
    pub(crate) fn new(shard: String, reason: String) -> Rejection {
        let message = format!(
            "wrong shard: {shard} refused the statement (worker map version {})",
            worker_map_version()
        );
        Rejection::with_message(&message, &reason)
    }

    /// Where no catalog can be read (a transaction's commit).
    pub(crate) fn with_message(message: &str, reason: &str) -> Rejection {
        Rejection {
            message: palloc_cstring(message),
            detail: palloc_cstring(reason),
        }
    }
}

/// A copy of `text` in the current memory context.
fn palloc_cstring(text: &str) -> *mut c_char {
    let owned = CString::new(text.replace('\0', "")).unwrap_or_default();
    // SAFETY: pstrdup copies a NUL-terminated string into palloc'd memory.
    unsafe { pg_sys::pstrdup(owned.as_ptr()) }
}

/// SQL that installs the guard triggers on a shard table. `range` is None for
/// a reference table copy, which owns the whole keyspace.
pub(crate) fn guard_trigger_ddl(
    qualified_shard: &str,
    dist_column: Option<&str>,
    range_start: i64,
    range_end: i64,
) -> Vec<String> {
    let mut ddl = vec![statement_guard_ddl(qualified_shard)];
    if let Some(column) = dist_column {
        ddl.extend(column_guard_ddl(
            qualified_shard,
            column,
            range_start,
            range_end,
        ));
    }
    ddl
}

/// SQL that installs the guard that checks the shard's state and map
/// version once per statement.
pub(crate) fn statement_guard_ddl(qualified_shard: &str) -> String {
    format!(
        "CREATE TRIGGER pg_shard_guard_statement \
         BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {qualified_shard} \
         FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.shard_guard_statement()"
    )
}

/// SQL that installs the guards that check the rows a statement writes
/// against the shard's range (named in [`COLUMN_GUARD_TRIGGERS`]).
pub(crate) fn column_guard_ddl(
    qualified_shard: &str,
    dist_column: &str,
    range_start: i64,
    range_end: i64,
) -> Vec<String> {
    let arguments = format!(
        "{}, {}, {}",
        quote::literal(dist_column),
        quote::literal(&range_start.to_string()),
        quote::literal(&range_end.to_string()),
    );
    vec![
        format!(
            "CREATE TRIGGER pg_shard_guard_row BEFORE UPDATE ON {qualified_shard} \
             FOR EACH ROW EXECUTE FUNCTION pg_shard.shard_guard_row({arguments})"
        ),
        format!(
            "CREATE TRIGGER pg_shard_guard_inserted AFTER INSERT ON {qualified_shard} \
             REFERENCING NEW TABLE AS pg_shard_inserted_rows \
             FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.shard_guard_inserted({arguments})"
        ),
    ]
}

/// The triggers that name the distribution column ([`column_guard_ddl`]'s),
/// to drop before they are made again for a renamed column.
pub(crate) const COLUMN_GUARD_TRIGGERS: [&str; 2] =
    ["pg_shard_guard_row", "pg_shard_guard_inserted"];

/// Function-manager info (version 1) for the hand-declared C trigger
/// functions below (they are declared in sql/pg_shard_api.sql).
macro_rules! finfo_v1 {
    ($($name:ident),*) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    )*};
}
finfo_v1!(
    pg_finfo_shard_guard_row,
    pg_finfo_shard_guard_inserted,
    pg_finfo_shard_guard_statement
);

/// Row-level guard. Written by hand rather than with `#[pg_trigger]` because
/// a rejection must carry a custom SQLSTATE, which pgrx's error reporting
/// cannot express: the check runs under pgrx's guard (so panics and errors
/// inside it are reported normally) and the rejection is raised afterwards,
/// when no Rust frame holding resources is left.
///
/// # Safety
/// Called by the PostgreSQL function manager with a valid `fcinfo`.
#[no_mangle]
pub unsafe extern "C-unwind" fn shard_guard_row(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: fcinfo comes from the function manager; check_row verifies it is a trigger call.
    let verdict = unsafe { pg_sys::panic::pgrx_extern_c_guard(|| check_row(fcinfo)) };
    match verdict {
        Ok(tuple) => tuple,
        // SAFETY: at the top of an extern "C-unwind" function, nothing left to drop.
        Err(rejection) => unsafe { raise_wrong_shard(rejection) },
    }
}

/// The inserted rows' guard (a statement trigger over the transition
/// table); see [`shard_guard_row`] for why it is hand-written.
///
/// # Safety
/// Called by the PostgreSQL function manager with a valid `fcinfo`.
#[no_mangle]
pub unsafe extern "C-unwind" fn shard_guard_inserted(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as for shard_guard_row.
    let verdict = unsafe { pg_sys::panic::pgrx_extern_c_guard(|| check_inserted(fcinfo)) };
    match verdict {
        Ok(()) => pg_sys::Datum::from(0usize),
        // SAFETY: at the top of an extern "C-unwind" function, nothing left to drop.
        Err(rejection) => unsafe { raise_wrong_shard(rejection) },
    }
}

/// Statement-level guard; see [`shard_guard_row`] for why it is hand-written.
///
/// # Safety
/// Called by the PostgreSQL function manager with a valid `fcinfo`.
#[no_mangle]
pub unsafe extern "C-unwind" fn shard_guard_statement(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: as for shard_guard_row.
    let verdict = unsafe { pg_sys::panic::pgrx_extern_c_guard(|| check_statement(fcinfo)) };
    match verdict {
        Ok(()) => pg_sys::Datum::from(0usize),
        // SAFETY: at the top of an extern "C-unwind" function, nothing left to drop.
        Err(rejection) => unsafe { raise_wrong_shard(rejection) },
    }
}

/// The trigger data of a trigger call, or an error for any other call.
///
/// # Safety
/// `fcinfo` must be valid.
unsafe fn trigger_data<'a>(fcinfo: pg_sys::FunctionCallInfo) -> &'a pg_sys::TriggerData {
    // SAFETY: fcinfo is valid; a trigger call's context is a TriggerData node.
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
            error!("pg_shard guard functions can only be called as triggers");
        }
        &*(context as *const pg_sys::TriggerData)
    }
}

/// What the row guard needs of a trigger: where the key is and the range.
/// Parsed from the trigger's arguments once per trigger and backend, since
/// the row guard runs for every row of every write (COPY included).
#[derive(Clone, Copy)]
struct RowGuard {
    /// 0-based position of the distribution column in the tuple descriptor.
    position: usize,
    type_oid: pg_sys::Oid,
    base_type: pg_sys::Oid,
    start: KeyspaceId,
    end: KeyspaceId,
}

thread_local! {
    static ROW_GUARDS: RefCell<HashMap<pg_sys::Oid, RowGuard>> = RefCell::new(HashMap::new());
}

/// The guard for `trigger` on a relation with `attributes`, from the cache
/// when the column is still where it was.
///
/// # Safety
/// `trigger` must be a valid trigger whose tgargs holds tgnargs C strings.
unsafe fn row_guard(
    trigger: &pg_sys::Trigger,
    attributes: &[pg_sys::FormData_pg_attribute],
) -> RowGuard {
    let cached = ROW_GUARDS.with(|guards| guards.borrow().get(&trigger.tgoid).copied());
    if let Some(guard) = cached {
        let still_valid = attributes
            .get(guard.position)
            .is_some_and(|a| !a.attisdropped && a.atttypid == guard.type_oid);
        if still_valid {
            return guard;
        }
    }
    if trigger.tgnargs != 3 {
        error!("pg_shard's row guards need the arguments (column, range_start, range_end)");
    }
    // SAFETY: the caller guarantees tgargs holds tgnargs (= 3) C strings.
    let args = unsafe { std::slice::from_raw_parts(trigger.tgargs, 3) };
    // SAFETY: each argument is a NUL-terminated string owned by the trigger.
    let arg = |i: usize| {
        unsafe { CStr::from_ptr(args[i]) }
            .to_str()
            .unwrap_or_default()
    };
    let (column, start, end) = (arg(0), arg(1), arg(2));
    let (Ok(start), Ok(end)) = (start.parse::<i64>(), end.parse::<i64>()) else {
        error!("pg_shard's row guard: invalid range arguments");
    };
    let Some(position) = attributes.iter().position(|a| {
        // SAFETY: attname is a NUL-terminated NameData.
        !a.attisdropped && unsafe { CStr::from_ptr(a.attname.data.as_ptr()) }.to_str() == Ok(column)
    }) else {
        error!("pg_shard's row guard: shard has no column \"{column}\"");
    };
    let type_oid = attributes[position].atttypid;
    let guard = RowGuard {
        position,
        type_oid,
        base_type: base_type(type_oid),
        start: KeyspaceId::from_sql(start),
        end: KeyspaceId::from_sql(end),
    };
    ROW_GUARDS.with(|guards| guards.borrow_mut().insert(trigger.tgoid, guard));
    guard
}

fn check_row(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Rejection> {
    // SAFETY: PostgreSQL hands a row trigger a valid TriggerData whose
    // relation, descriptor, trigger arguments and tuples live for the call.
    unsafe {
        let data = trigger_data(fcinfo);
        let event = data.tg_event;
        let tuple = if event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_UPDATE {
            data.tg_newtuple
        } else {
            data.tg_trigtuple
        };
        if tuple.is_null() {
            error!("pg_shard_guard_row must be a BEFORE INSERT OR UPDATE row trigger");
        }
        let relation = data.tg_relation;
        let tupdesc = (*relation).rd_att;
        let attributes = (*tupdesc).attrs.as_slice((*tupdesc).natts as usize);
        let guard = row_guard(&*data.tg_trigger, attributes);
        let attno = std::num::NonZeroUsize::MIN.saturating_add(guard.position);
        let key = pgrx::heap_getattr_raw(tuple, attno, tupdesc);
        check_key(key, &guard, relation, attributes)?;
        Ok(pg_sys::Datum::from(tuple))
    }
}

/// Every row of the statement's transition table of inserted rows.
fn check_inserted(fcinfo: pg_sys::FunctionCallInfo) -> Result<(), Rejection> {
    // SAFETY: PostgreSQL hands an AFTER statement trigger with a transition
    // table a valid TriggerData whose tuplestore lives for the call; the
    // slot is made and dropped here, and the store is read from its start
    // and left rewound for any other trigger that reads it.
    unsafe {
        let data = trigger_data(fcinfo);
        let store = data.tg_newtable;
        if store.is_null() {
            error!("pg_shard_guard_inserted must be an AFTER INSERT statement trigger with a NEW TABLE");
        }
        let relation = data.tg_relation;
        let tupdesc = (*relation).rd_att;
        let attributes = (*tupdesc).attrs.as_slice((*tupdesc).natts as usize);
        let guard = row_guard(&*data.tg_trigger, attributes);
        let attno = guard.position as i32 + 1;
        let slot = pg_sys::MakeSingleTupleTableSlot(tupdesc, &pg_sys::TTSOpsMinimalTuple);
        pg_sys::tuplestore_rescan(store);
        let mut verdict = Ok(());
        while verdict.is_ok() && pg_sys::tuplestore_gettupleslot(store, true, false, slot) {
            if ((*slot).tts_nvalid as i32) < attno {
                pg_sys::slot_getsomeattrs_int(slot, attno);
            }
            let index = guard.position;
            let key = if *(*slot).tts_isnull.add(index) {
                None
            } else {
                Some(*(*slot).tts_values.add(index))
            };
            verdict = check_key(key, &guard, relation, attributes);
        }
        pg_sys::tuplestore_rescan(store);
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        verdict
    }
}

/// One row's key (None: NULL) against the shard's range.
///
/// # Safety
/// `key` is a datum of the guarded column's type; `relation` is open.
unsafe fn check_key(
    key: Option<pg_sys::Datum>,
    guard: &RowGuard,
    relation: pg_sys::Relation,
    attributes: &[pg_sys::FormData_pg_attribute],
) -> Result<(), Rejection> {
    let Some(datum) = key else {
        // SAFETY: attname is a NUL-terminated NameData.
        let column = unsafe { CStr::from_ptr(attributes[guard.position].attname.data.as_ptr()) };
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_NOT_NULL_VIOLATION,
            format!(
                "null value in distribution column \"{}\" of a shard table",
                column.to_string_lossy()
            )
        );
    };
    let id = match keyspace_id_of_base_type(datum, guard.base_type, guard.type_oid) {
        Ok(id) => id,
        Err(error) => error.report(),
    };
    if id < guard.start || id > guard.end {
        return Err(Rejection::new(
            relation_name(relation),
            format!(
                "keyspace id {} (bigint {}) of the row is outside the shard's range {}..{}",
                id.0,
                id.to_sql(),
                guard.start.to_sql(),
                guard.end.to_sql()
            ),
        ));
    }
    Ok(())
}

thread_local! {
    // (state, epoch) per shard table, or None for "no ownership record".
    // Emptied by every relcache invalidation (see `forget_shard_states`):
    // changes to pg_shard.local_shard invalidate the shard's relcache entry,
    // and a writer processes invalidations when it locks the shard table, so
    // it never acts on a state older than the last change committed before
    // it got its lock.
    static SHARD_STATES: RefCell<HashMap<pg_sys::Oid, Option<(String, i64)>>> =
        RefCell::new(HashMap::new());
    // Bumped by every invalidation, so a record read while one arrived is not cached.
    static INVALIDATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Relcache invalidation callback, registered in `_PG_init`.
#[pg_guard]
unsafe extern "C-unwind" fn forget_shard_states(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    // Cheap and rare enough (DDL, ANALYZE, ownership changes) to drop it all.
    SHARD_STATES.with(|states| states.borrow_mut().clear());
    // Trigger arguments never change, but a trigger oid could be reused and
    // a column renamed: re-reading them after DDL is cheap.
    ROW_GUARDS.with(|guards| guards.borrow_mut().clear());
    crate::planner::forget_cache();
    crate::ids::forget_cache();
    crate::worker::lookup_changes::forget_cache();
    crate::lookups::catalog::forget_cache();
    INVALIDATIONS.set(INVALIDATIONS.get().wrapping_add(1));
}

pub(crate) fn register_cache_invalidation() {
    // SAFETY: registering a callback with a static function, once per backend (_PG_init).
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(forget_shard_states), pg_sys::Datum::from(0));
    }
}

/// `pg_shard.invalidate_shard_state(shard_rel oid)`: called by the triggers
/// on pg_shard.local_shard so that every backend re-reads the shard's state.
/// NULL (TRUNCATE) or a table that no longer exists invalidates everything.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
fn invalidate_shard_state(shard_rel: Option<pg_sys::Oid>) {
    // SAFETY: get_rel_name reads the syscache (NULL if the relation is gone);
    // the invalidation functions queue messages sent at commit.
    unsafe {
        match shard_rel {
            Some(relid) if !pg_sys::get_rel_name(relid).is_null() => {
                pg_sys::CacheInvalidateRelcacheByRelid(relid)
            }
            _ => pg_sys::CacheInvalidateRelcacheAll(),
        }
    }
}

/// [`shard_record`] through the per-backend cache.
pub(crate) fn cached_shard_record(relid: pg_sys::Oid) -> Option<(String, i64)> {
    if let Some(cached) = SHARD_STATES.with(|states| states.borrow().get(&relid).cloned()) {
        return cached;
    }
    let generation = INVALIDATIONS.get();
    let record = shard_record(relid);
    if INVALIDATIONS.get() == generation {
        SHARD_STATES.with(|states| states.borrow_mut().insert(relid, record.clone()));
    }
    record
}

fn check_statement(fcinfo: pg_sys::FunctionCallInfo) -> Result<(), Rejection> {
    // SAFETY: PostgreSQL hands a statement trigger a valid TriggerData.
    let relation = unsafe { trigger_data(fcinfo).tg_relation };
    // SAFETY: the relation is open for the duration of the trigger call.
    let relid = unsafe { (*relation).rd_id };
    let Some((state, epoch)) = cached_shard_record(relid) else {
        return Err(Rejection::new(
            relation_name(relation),
            "this worker has no ownership record for the shard".into(),
        ));
    };
    if state != "active" {
        return Err(Rejection::new(
            relation_name(relation),
            format!("the shard is {state} on this worker"),
        ));
    }
    let declared = DECLARED_MAP_VERSION.get() as i64;
    if declared > 0 && declared < epoch {
        return Err(Rejection::new(
            relation_name(relation),
            format!(
                "the session declared map version {declared}, older than the shard's epoch {epoch}"
            ),
        ));
    }
    Ok(())
}

thread_local! {
    // The statement guard's lookup, planned once per backend (SPI_keepplan);
    // PostgreSQL replans it by itself if pg_shard.local_shard changes.
    static SHARD_RECORD_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
}

/// (state, epoch) of the shard table `relid` from this worker's ownership
/// record, read with the *latest* snapshot rather than the transaction's: a
/// REPEATABLE READ transaction that began before a shard was frozen must
/// still see the freeze. (Whoever freezes a shard locks its table first, so
/// in-flight writers finish before, and later ones wait until the freeze
/// commits.) Raw SPI because pgrx's SPI client cannot pass a snapshot.
fn shard_record(relid: pg_sys::Oid) -> Option<(String, i64)> {
    // Planned (and replanned) under the safe search_path: it runs as
    // whichever role writes to the shard table.
    crate::spi::under_safe_path(|| shard_record_now(relid))
}

fn shard_record_now(relid: pg_sys::Oid) -> Option<(String, i64)> {
    const QUERY: &CStr =
        c"SELECT state, epoch FROM pg_shard.local_shard WHERE shard_rel = $1::regclass";
    // SAFETY: plain SPI usage inside a trigger call: connect, prepare (kept
    // across calls), execute with a snapshot, read at most one row, finish.
    // Errors raised by PostgreSQL unwind through pgrx's FFI guard and SPI is
    // cleaned up by transaction abort.
    unsafe {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as c_int {
            error!("pg_shard: SPI_connect failed in the shard guard");
        }
        let mut plan = SHARD_RECORD_PLAN.get();
        if plan.is_null() {
            let mut argument_types = [pg_sys::OIDOID];
            plan = pg_sys::SPI_prepare(QUERY.as_ptr(), 1, argument_types.as_mut_ptr());
            if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                error!("pg_shard: could not plan the shard guard's lookup");
            }
            SHARD_RECORD_PLAN.set(plan);
        }
        let mut values = [pg_sys::Datum::from(relid)];
        let nulls = [b' ' as c_char];
        let status = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            1,
        );
        if status != pg_sys::SPI_OK_SELECT as c_int {
            error!("pg_shard: reading pg_shard.local_shard failed (SPI status {status})");
        }
        let mut record = None;
        let table = pg_sys::SPI_tuptable;
        if pg_sys::SPI_processed == 1 && !table.is_null() {
            let row = *(*table).vals;
            let descriptor = (*table).tupdesc;
            let state = pg_sys::SPI_getvalue(row, descriptor, 1);
            let mut epoch_is_null = false;
            let epoch = pg_sys::SPI_getbinval(row, descriptor, 2, &mut epoch_is_null);
            if !state.is_null() && !epoch_is_null {
                let state = CStr::from_ptr(state).to_string_lossy().into_owned();
                record = Some((state, epoch.value() as i64));
            }
        }
        pg_sys::SPI_finish();
        record
    }
}

pub(crate) fn relation_name(relation: pg_sys::Relation) -> String {
    // SAFETY: the relation is open; its rd_rel and namespace oid are valid,
    // and quote_qualified_identifier returns a palloc'd C string.
    unsafe {
        let namespace = pg_sys::get_namespace_name((*(*relation).rd_rel).relnamespace);
        let name = (*(*relation).rd_rel).relname.data.as_ptr();
        let qualified = pg_sys::quote_qualified_identifier(namespace, name);
        CStr::from_ptr(qualified).to_string_lossy().into_owned()
    }
}

/// This worker's map version: the newest epoch among the shards it holds.
fn worker_map_version() -> i64 {
    crate::spi::query_value::<i64>("SELECT coalesce(max(epoch), 0) FROM pg_shard.local_shard")
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// Raise the WrongShard ERROR with its own SQLSTATE. Never returns: errfinish
/// longjmps to PostgreSQL's error handler.
///
/// # Safety
/// Must be called where a longjmp skips no Rust frame that owns resources.
pub(crate) unsafe fn raise_wrong_shard(rejection: Rejection) -> ! {
    // SAFETY: the rejection's strings are palloc'd; the caller holds no
    // Rust value owning memory.
    unsafe {
        crate::error::raise_with_sqlstate(
            WRONG_SHARD_SQLSTATE,
            rejection.message,
            rejection.detail,
            c"refresh the shard map (pg_shard.map_version()) and retry".as_ptr(),
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlstate_encoding_matches_postgres() {
        // MAKE_SQLSTATE('2','2','0','1','2') is ERRCODE_DIVISION_BY_ZERO = 33816706.
        assert_eq!(crate::error::make_sqlstate("22012"), 33816706);
    }
}
