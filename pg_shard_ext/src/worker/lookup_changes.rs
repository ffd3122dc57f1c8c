//! Lookup tables, the worker's part: triggers on the shards of a table
//! with lookups (`pg_shard.create_lookup`) record every change of a
//! looked-up column — the value, its keyspace id, the keyspace id of the
//! row's key, and +1 or -1 — in backend memory. The router that wrote the
//! shard (the metadata node) takes them with
//! `pg_shard.take_lookup_changes()` in the same remote transaction, and
//! writes the lookup tables' shards in the same distributed transaction.
//!
//! "Shards may not be wrong": a transaction that would commit or prepare
//! with changes nobody took is refused (PS001, so a router refreshes its
//! map and retries): whoever wrote did not know of the lookup, and the
//! lookup would lose the change.
//!
//! Like the guards, the triggers do not fire in a move's or split's apply
//! (`session_replication_role = replica`): rows that change shards keep
//! their key, so their lookup entries stay right.

use crate::keyspace::{base_type, keyspace_id_of_base_type};
use crate::worker::fencing::{raise_wrong_shard, relation_name, Rejection};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};

/// The most changes a backend holds before they are taken: a statement
/// changing more looked-up values is refused (write in smaller statements).
pub(crate) const MAX_PENDING: usize = 1_000_000;

/// One recorded change.
struct Change {
    lookup_id: i32,
    delta: i64,
    value: String,
    value_id: i64,
    key_id: i64,
    /// The subtransaction nesting level it was made at.
    level: i32,
}

/// Where a lookup trigger finds its columns: parsed from its arguments
/// (lookup id, value column, key column) once per trigger and backend.
#[derive(Clone, Copy)]
struct Columns {
    lookup_id: i32,
    value: Column,
    key: Column,
}

#[derive(Clone, Copy)]
struct Column {
    /// 0-based position in the tuple descriptor.
    position: usize,
    type_oid: pg_sys::Oid,
    base_type: pg_sys::Oid,
    output: pg_sys::Oid,
}

thread_local! {
    static PENDING: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
    static TRIGGERS: RefCell<HashMap<pg_sys::Oid, Columns>> = RefCell::new(HashMap::new());
}

/// Forget the parsed trigger arguments (relcache invalidations: a column
/// renamed or a trigger oid reused).
pub(crate) fn forget_cache() {
    TRIGGERS.with(|triggers| triggers.borrow_mut().clear());
}

/// The trigger function's info record (version 1 calling convention).
#[no_mangle]
pub extern "C" fn pg_finfo_lookup_rows_changed() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `pg_shard.lookup_rows_changed()`: AFTER INSERT (statement, NEW TABLE),
/// AFTER DELETE (statement, OLD TABLE) or AFTER UPDATE OF the value and
/// key columns (row, when either changed), with the arguments (lookup id,
/// value column, key column).
///
/// # Safety
/// Called by the PostgreSQL function manager with a valid `fcinfo`.
#[no_mangle]
pub unsafe extern "C-unwind" fn lookup_rows_changed(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo comes from the function manager; record checks that it
    // is a trigger call.
    unsafe { pg_sys::panic::pgrx_extern_c_guard(|| record(fcinfo)) };
    pg_sys::Datum::from(0usize)
}

fn record(fcinfo: pg_sys::FunctionCallInfo) {
    // SAFETY: PostgreSQL hands an AFTER trigger a valid TriggerData whose
    // relation, trigger, tuples and transition tables live for the call.
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
            error!("pg_shard.lookup_rows_changed can only be called as a trigger");
        }
        let data = &*(context as *const pg_sys::TriggerData);
        let relation = data.tg_relation;
        let tupdesc = (*relation).rd_att;
        let attributes = (*tupdesc).attrs.as_slice((*tupdesc).natts as usize);
        let columns = columns(&*data.tg_trigger, attributes);
        let event = data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK;
        let row_level = data.tg_event & pg_sys::TRIGGER_EVENT_ROW != 0;
        match (event, row_level) {
            (pg_sys::TRIGGER_EVENT_INSERT, false) if !data.tg_newtable.is_null() => {
                record_store(data.tg_newtable, tupdesc, &columns, 1);
            }
            (pg_sys::TRIGGER_EVENT_DELETE, false) if !data.tg_oldtable.is_null() => {
                record_store(data.tg_oldtable, tupdesc, &columns, -1);
            }
            (pg_sys::TRIGGER_EVENT_UPDATE, true) => {
                let old = |attno: usize| {
                    pgrx::heap_getattr_raw(
                        data.tg_trigtuple,
                        std::num::NonZeroUsize::MIN.saturating_add(attno),
                        tupdesc,
                    )
                };
                let new = |attno: usize| {
                    pgrx::heap_getattr_raw(
                        data.tg_newtuple,
                        std::num::NonZeroUsize::MIN.saturating_add(attno),
                        tupdesc,
                    )
                };
                record_row(
                    &columns,
                    old(columns.value.position),
                    old(columns.key.position),
                    -1,
                );
                record_row(
                    &columns,
                    new(columns.value.position),
                    new(columns.key.position),
                    1,
                );
            }
            _ => error!(
                "pg_shard.lookup_rows_changed on {} must be an AFTER INSERT or DELETE statement \
                 trigger with its transition table, or an AFTER UPDATE row trigger",
                relation_name(relation)
            ),
        }
    }
}

/// Every row of a transition table.
///
/// # Safety
/// `store` is the trigger's transition table of rows of `tupdesc`.
unsafe fn record_store(
    store: *mut pg_sys::Tuplestorestate,
    tupdesc: pg_sys::TupleDesc,
    columns: &Columns,
    delta: i64,
) {
    // SAFETY: as the function's; the slot is made and dropped here, and the
    // store is read from its start and left rewound for other triggers.
    unsafe {
        let last = columns.value.position.max(columns.key.position) as i32 + 1;
        let slot = pg_sys::MakeSingleTupleTableSlot(tupdesc, &pg_sys::TTSOpsMinimalTuple);
        pg_sys::tuplestore_rescan(store);
        while pg_sys::tuplestore_gettupleslot(store, true, false, slot) {
            if ((*slot).tts_nvalid as i32) < last {
                pg_sys::slot_getsomeattrs_int(slot, last);
            }
            let get = |position: usize| {
                (!*(*slot).tts_isnull.add(position)).then(|| *(*slot).tts_values.add(position))
            };
            record_row(
                columns,
                get(columns.value.position),
                get(columns.key.position),
                delta,
            );
        }
        pg_sys::tuplestore_rescan(store);
        pg_sys::ExecDropSingleTupleTableSlot(slot);
    }
}

/// One row's value and key (None: NULL, which no lookup holds).
///
/// # Safety
/// The datums are of the columns' types.
unsafe fn record_row(
    columns: &Columns,
    value: Option<pg_sys::Datum>,
    key: Option<pg_sys::Datum>,
    delta: i64,
) {
    let (Some(value), Some(key)) = (value, key) else {
        return;
    };
    let id_of = |datum: pg_sys::Datum, column: &Column| match keyspace_id_of_base_type(
        datum,
        column.base_type,
        column.type_oid,
    ) {
        Ok(id) => id.to_sql(),
        Err(error) => error.report(),
    };
    // SAFETY: the output function of the value's type, on a datum of it.
    let text = unsafe {
        let text = pg_sys::OidOutputFunctionCall(columns.value.output, value);
        CStr::from_ptr(text).to_string_lossy().into_owned()
    };
    let change = Change {
        lookup_id: columns.lookup_id,
        delta,
        value_id: id_of(value, &columns.value),
        key_id: id_of(key, &columns.key),
        value: text,
        // SAFETY: reads the transaction state.
        level: unsafe { pg_sys::GetCurrentTransactionNestLevel() },
    };
    let full = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.push(change);
        pending.len() > MAX_PENDING
    });
    if full {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "a statement changed more than {MAX_PENDING} values of looked-up columns \
                 (pg_shard.create_lookup)"
            ),
            "write the rows in smaller statements"
        );
    }
}

/// The trigger's columns, from the cache when still where they were.
///
/// # Safety
/// `trigger` is valid and its tgargs holds tgnargs C strings.
unsafe fn columns(
    trigger: &pg_sys::Trigger,
    attributes: &[pg_sys::FormData_pg_attribute],
) -> Columns {
    let still_valid = |column: &Column| {
        attributes
            .get(column.position)
            .is_some_and(|a| !a.attisdropped && a.atttypid == column.type_oid)
    };
    let cached = TRIGGERS.with(|triggers| triggers.borrow().get(&trigger.tgoid).copied());
    if let Some(columns) = cached {
        if still_valid(&columns.value) && still_valid(&columns.key) {
            return columns;
        }
    }
    if trigger.tgnargs != 3 {
        error!(
            "pg_shard's lookup triggers need the arguments (lookup id, value column, key column)"
        );
    }
    // SAFETY: the caller guarantees tgargs holds tgnargs (= 3) C strings.
    let args = unsafe { std::slice::from_raw_parts(trigger.tgargs, 3) };
    // SAFETY: each argument is a NUL-terminated string owned by the trigger.
    let arg = |i: usize| {
        unsafe { CStr::from_ptr(args[i]) }
            .to_str()
            .unwrap_or_default()
    };
    let Ok(lookup_id) = arg(0).parse::<i32>() else {
        error!(
            "pg_shard's lookup trigger: invalid lookup id \"{}\"",
            arg(0)
        );
    };
    let column = |name: &str| -> Column {
        let Some(position) = attributes.iter().position(|a| {
            // SAFETY: attname is a NUL-terminated NameData.
            !a.attisdropped
                && unsafe { CStr::from_ptr(a.attname.data.as_ptr()) }.to_str() == Ok(name)
        }) else {
            error!("pg_shard's lookup trigger: the shard has no column \"{name}\"");
        };
        let type_oid = attributes[position].atttypid;
        let mut output = pg_sys::InvalidOid;
        let mut varlena = false;
        // SAFETY: reads the type cache for an existing column's type.
        unsafe { pg_sys::getTypeOutputInfo(type_oid, &mut output, &mut varlena) };
        Column {
            position,
            type_oid,
            base_type: base_type(type_oid),
            output,
        }
    };
    let columns = Columns {
        lookup_id,
        value: column(arg(1)),
        key: column(arg(2)),
    };
    TRIGGERS.with(|triggers| triggers.borrow_mut().insert(trigger.tgoid, columns));
    columns
}

/// `pg_shard.take_lookup_changes()`: the changes recorded so far in this
/// transaction, summed per lookup, value and key (changes that cancel out
/// are left out), and forgotten.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
fn take_lookup_changes() -> TableIterator<
    'static,
    (
        name!(lookup_id, i32),
        name!(delta, i64),
        name!(value, String),
        name!(value_keyspace_id, i64),
        name!(keyspace_id, i64),
    ),
> {
    let changes = PENDING.with(|pending| std::mem::take(&mut *pending.borrow_mut()));
    let mut sums: HashMap<(i32, String, i64), (i64, i64)> = HashMap::new();
    let mut order = Vec::new();
    for change in changes {
        let key = (change.lookup_id, change.value, change.key_id);
        match sums.get_mut(&key) {
            Some((delta, _)) => *delta += change.delta,
            None => {
                sums.insert(key.clone(), (change.delta, change.value_id));
                order.push(key);
            }
        }
    }
    let rows: Vec<_> = order
        .into_iter()
        .filter_map(|key| {
            let (delta, value_id) = sums.remove(&key)?;
            let (lookup_id, value, key_id) = key;
            (delta != 0).then_some((lookup_id, delta, value, value_id, key_id))
        })
        .collect();
    TableIterator::new(rows)
}

/// Registers the transaction callbacks (once per backend, `_PG_init`).
pub(crate) fn register_callbacks() {
    // SAFETY: static functions registered once per backend.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_transaction), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subtransaction), std::ptr::null_mut());
    }
}

/// Refuses to commit or prepare with changes nobody took; forgets them
/// when the transaction ends.
unsafe extern "C-unwind" fn on_transaction(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PARALLEL_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => {
            let untaken = PENDING.with(|pending| pending.borrow().first().map(|c| c.lookup_id));
            let Some(lookup_id) = untaken else {
                return;
            };
            PENDING.with(|pending| pending.borrow_mut().clear());
            // SAFETY: builds palloc'd strings under pgrx's guard, then
            // raises at the top of this callback, where no Rust value
            // owning memory is left.
            let rejection = unsafe {
                pg_sys::panic::pgrx_extern_c_guard(|| {
                    Rejection::with_message(
                        "wrong shard: a shard of a table with lookups refused to commit",
                        &format!(
                            "rows were written without their lookup (id {lookup_id}): \
                             the router that wrote them does not know of the lookup"
                        ),
                    )
                })
            };
            // SAFETY: as above.
            unsafe { raise_wrong_shard(rejection) }
        }
        XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_ABORT
        | XACT_EVENT_COMMIT
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_PREPARE => {
            PENDING.with(|pending| pending.borrow_mut().clear());
        }
        _ => {}
    }
}

/// A subtransaction's changes go with it when it rolls back, and to its
/// parent when it commits.
unsafe extern "C-unwind" fn on_subtransaction(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    // SAFETY: reads the transaction state (the ending subtransaction's level).
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    match event {
        SUBXACT_EVENT_ABORT_SUB => PENDING.with(|pending| {
            pending.borrow_mut().retain(|change| change.level < level);
        }),
        SUBXACT_EVENT_COMMIT_SUB => PENDING.with(|pending| {
            for change in pending.borrow_mut().iter_mut() {
                if change.level >= level {
                    change.level = level - 1;
                }
            }
        }),
        _ => {}
    }
}

/// The SQL that installs lookup `lookup_id`'s triggers on a shard table of
/// its base table (named in [`trigger_names`]).
pub(crate) fn trigger_ddl(
    qualified_shard: &str,
    lookup_id: i32,
    value_column: &str,
    key_column: &str,
) -> Vec<String> {
    let [inserted, deleted, updated] = trigger_names(lookup_id);
    let arguments = format!(
        "{}, {}, {}",
        crate::quote::literal(&lookup_id.to_string()),
        crate::quote::literal(value_column),
        crate::quote::literal(key_column),
    );
    let (value, key) = (
        crate::quote::ident(value_column),
        crate::quote::ident(key_column),
    );
    vec![
        format!(
            "CREATE TRIGGER {inserted} AFTER INSERT ON {qualified_shard} \
             REFERENCING NEW TABLE AS pg_shard_lookup_new \
             FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.lookup_rows_changed({arguments})"
        ),
        format!(
            "CREATE TRIGGER {deleted} AFTER DELETE ON {qualified_shard} \
             REFERENCING OLD TABLE AS pg_shard_lookup_old \
             FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.lookup_rows_changed({arguments})"
        ),
        format!(
            "CREATE TRIGGER {updated} AFTER UPDATE OF {value}, {key} ON {qualified_shard} \
             FOR EACH ROW WHEN (OLD.{value} IS DISTINCT FROM NEW.{value} \
                                OR OLD.{key} IS DISTINCT FROM NEW.{key}) \
             EXECUTE FUNCTION pg_shard.lookup_rows_changed({arguments})"
        ),
    ]
}

/// The names of lookup `lookup_id`'s three triggers on a shard table.
pub(crate) fn trigger_names(lookup_id: i32) -> [String; 3] {
    ["inserted", "deleted", "updated"].map(|what| format!("pg_shard_lookup_{lookup_id}_{what}"))
}
