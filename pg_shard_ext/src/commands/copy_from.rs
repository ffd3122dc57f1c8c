//! `COPY … FROM` into a distributed table on the metadata node.
//!
//! PostgreSQL's own COPY reader parses the input (every format, option and
//! encoding; defaults, sequences included, evaluated here; a bad row's
//! error names its line), each row goes by its key's keyspace id to its
//! shard, and [`shard_copy`] streams the rows with COPY into each shard,
//! every node at once, in the local transaction's remote transactions (two
//! phases when more than one node took rows). Rows are parsed a batch at a
//! time under the session's settings and printed under
//! [`PORTABLE_TEXT`] ones, so dates, intervals and floats mean the same on
//! the workers.
//!
//! Statements this does not take go on to PostgreSQL, which inserts
//! through the foreign partitions: `COPY … WHERE`, `FREEZE`, a table whose
//! shard groups are being moved, a transaction that already wrote over
//! postgres_fdw.

use crate::copy_rows::{binary_possible, CopyFormat, LineEncoder};
use crate::error::{Result, ShardError};
use crate::keyspace::key_to_keyspace_id;
use crate::metadata::shard_lookup;
use crate::metadata::LogicalTable;
use crate::quote;
use crate::settings::{with_settings, PORTABLE_TEXT};
use crate::transaction::shard_copy::{with_shard_copy, CopyTarget, ShardCopy};
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::{c_char, CStr};

// Declared here rather than taken from pgrx::pg_sys, whose wrappers are
// Rust functions under pgrx's guard: PostgreSQL calls the callback itself
// while it reports an error, and an error of NextCopyFrom is caught by
// catch_error, keeping its CONTEXT.
unsafe extern "C-unwind" {
    #[link_name = "CopyFromErrorCallback"]
    fn copy_from_error_callback(arg: *mut std::ffi::c_void);
    // Called inside catch_error, whose longjmp target must be the nearest.
    #[link_name = "NextCopyFrom"]
    fn next_copy_from(
        cstate: pg_sys::CopyFromState,
        econtext: *mut pg_sys::ExprContext,
        values: *mut pg_sys::Datum,
        nulls: *mut bool,
    ) -> bool;
}

/// Rows parsed before they are printed and sent (the settings change once
/// a batch).
const BATCH_ROWS: usize = 1_000;

/// Run `COPY … FROM` itself if it goes into a distributed table, setting
/// `qc`; false when PostgreSQL should run it.
///
/// # Safety
/// The arguments of ProcessUtility.
pub(crate) unsafe fn run_if_distributed(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    qc: *mut pg_sys::QueryCompletion,
) -> Result<bool> {
    // SAFETY: a COPY statement's parse node, as the tag says.
    let stmt = unsafe {
        let node = (*pstmt).utilityStmt;
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_CopyStmt {
            return Ok(false);
        }
        node.cast::<pg_sys::CopyStmt>()
    };
    // SAFETY: a valid CopyStmt.
    let (relation, takes_it) = unsafe {
        (
            (*stmt).relation,
            (*stmt).is_from
                && !(*stmt).relation.is_null()
                && (*stmt).query.is_null()
                && (*stmt).whereClause.is_null()
                && !has_option((*stmt).options, c"freeze"),
        )
    };
    // SAFETY: a valid CopyStmt.
    if relation.is_null() || !unsafe { (*stmt).is_from } {
        return Ok(false);
    }
    // SAFETY: a RangeVar from the parse tree, looked up in the caller's
    // search_path without a lock (DoCopy's own open locks it below).
    let relid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    // (Whatever path the COPY would take.)
    if relid != pg_sys::InvalidOid && crate::lookups::catalog::is_lookup_table(relid)? {
        return Err(ShardError::InvalidArgument(format!(
            "{} is a lookup table: pg_shard writes it with the rows of its table",
            crate::spi::caller_relation_name(relid)
        )));
    }
    if !takes_it || crate::transaction::paths::did_fdw_write() {
        return Ok(false);
    }
    let Some(table) = LogicalTable::of(relid)? else {
        return Ok(false);
    };
    let Some(key_column) = table.dist_column.as_deref().map(str::to_string) else {
        return Ok(false);
    };
    let version = shard_lookup::map_version_now()?;
    let Some(shards) = shard_lookup::shard_ranges(relid)? else {
        return Ok(false);
    };
    // SAFETY: the statement is the one we were given; run_copy opens and
    // closes what it uses.
    let rows = unsafe { run_copy(stmt, query_string, &table, &key_column, version, &shards)? };
    // SAFETY: qc is ProcessUtility's completion, or NULL.
    unsafe {
        if !qc.is_null() {
            (*qc).commandTag = pg_sys::CommandTag::CMDTAG_COPY;
            (*qc).nprocessed = rows;
        }
    }
    Ok(true)
}

/// Whether a COPY option list names `name`.
///
/// # Safety
/// `options` is a List of DefElem, or NULL.
unsafe fn has_option(options: *mut pg_sys::List, name: &CStr) -> bool {
    // SAFETY: a list of DefElem nodes.
    unsafe {
        list_cells(options).iter().any(|cell| {
            let option = cell.ptr_value.cast::<pg_sys::DefElem>();
            !(*option).defname.is_null() && CStr::from_ptr((*option).defname) == name
        })
    }
}

/// The cells of a PostgreSQL List (none for NIL).
///
/// # Safety
/// `list` is a valid List or NULL, unchanged while the cells are used.
unsafe fn list_cells<'a>(list: *mut pg_sys::List) -> &'a [pg_sys::ListCell] {
    if list.is_null() {
        return &[];
    }
    // SAFETY: a List's elements array holds `length` cells.
    unsafe { std::slice::from_raw_parts((*list).elements, (*list).length as usize) }
}

/// The checks PostgreSQL's COPY makes before reading: server files and
/// programs need their roles, the table INSERT on the columns given, no
/// row-level security, a transaction that may write.
///
/// # Safety
/// `stmt` and `relation` are valid; `pstate` a fresh parse state.
unsafe fn check_allowed(
    stmt: *mut pg_sys::CopyStmt,
    pstate: *mut pg_sys::ParseState,
    relation: pg_sys::Relation,
) -> Result<()> {
    // SAFETY: as the function says; the range table entry is made in the
    // current memory context.
    unsafe {
        if !(*stmt).filename.is_null() && !pg_sys::superuser() {
            if (*stmt).is_program {
                if !pg_sys::has_privs_of_role(
                    pg_sys::GetUserId(),
                    pg_sys::Oid::from(pg_sys::ROLE_PG_EXECUTE_SERVER_PROGRAM),
                ) {
                    return Err(ShardError::PermissionDenied(
                        "must be superuser or have privileges of the pg_execute_server_program \
                         role to COPY to or from an external program"
                            .into(),
                    ));
                }
            } else if !pg_sys::has_privs_of_role(
                pg_sys::GetUserId(),
                pg_sys::Oid::from(pg_sys::ROLE_PG_READ_SERVER_FILES),
            ) {
                return Err(ShardError::PermissionDenied(
                    "must be superuser or have privileges of the pg_read_server_files role to \
                     COPY from a file"
                        .into(),
                ));
            }
        }
        if pg_sys::XactReadOnly {
            pg_sys::PreventCommandIfReadOnly(c"COPY FROM".as_ptr());
        }
        let item = pg_sys::addRangeTableEntryForRelation(
            pstate,
            relation,
            pg_sys::RowExclusiveLock as pg_sys::LOCKMODE,
            std::ptr::null_mut(),
            false,
            false,
        );
        let entry = (*item).p_rte;
        (*entry).requiredPerms = pg_sys::ACL_INSERT as pg_sys::AclMode;
        let attnums = pg_sys::CopyGetAttnums((*relation).rd_att, relation, (*stmt).attlist);
        for cell in list_cells(attnums) {
            let attnum = cell.int_value;
            (*entry).insertedCols = pg_sys::bms_add_member(
                (*entry).insertedCols,
                attnum - pg_sys::FirstLowInvalidHeapAttributeNumber,
            );
        }
        pg_sys::ExecCheckRTPerms((*pstate).p_rtable, true);
        if pg_sys::check_enable_rls((*entry).relid, pg_sys::InvalidOid, false)
            == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
        {
            return Err(ShardError::UnsupportedTable {
                table: crate::spi::caller_relation_name((*entry).relid),
                reason: "COPY FROM not supported with row-level security".into(),
            });
        }
    }
    Ok(())
}

/// Read the input and send every row to its shard; the rows copied.
///
/// # Safety
/// `stmt` is a COPY FROM into `table`, whose active shards are `shards`
/// at map `version`.
unsafe fn run_copy(
    stmt: *mut pg_sys::CopyStmt,
    query_string: *const c_char,
    table: &LogicalTable,
    key_column: &str,
    version: i64,
    shards: &[(i64, shard_lookup::Shard)],
) -> Result<u64> {
    // SAFETY: PostgreSQL's COPY reader used as DoCopy uses it: the table
    // opened (and kept locked until the end of the transaction), a parse
    // state for the range table, an executor state for defaults; every
    // value read from NextCopyFrom's arrays is within the descriptor's
    // natts. An ERROR raised by PostgreSQL unwinds to the transaction's
    // abort, which releases the relation, the reader and the memory.
    unsafe {
        let relation = pg_sys::table_openrv(
            (*stmt).relation,
            pg_sys::RowExclusiveLock as pg_sys::LOCKMODE,
        );
        let pstate = pg_sys::make_parsestate(std::ptr::null_mut());
        (*pstate).p_sourcetext = query_string;
        check_allowed(stmt, pstate, relation)?;
        let descriptor = (*relation).rd_att;
        let natts = (*descriptor).natts as usize;
        let attributes = (*descriptor).attrs.as_slice(natts);
        // Every column the shards have (the whole row: defaults are
        // evaluated here, where the sequences live).
        let positions: Vec<usize> = (0..natts)
            .filter(|&position| !attributes[position].attisdropped)
            .collect();
        let column_list = positions
            .iter()
            .map(|&position| {
                quote::ident(
                    &CStr::from_ptr(attributes[position].attname.data.as_ptr()).to_string_lossy(),
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let Some(key_position) = positions.iter().copied().find(|&position| {
            CStr::from_ptr(attributes[position].attname.data.as_ptr()).to_bytes()
                == key_column.as_bytes()
        }) else {
            return Err(ShardError::Internal(format!(
                "distribution column \"{key_column}\" not found in {}",
                table.display
            )));
        };
        let key_type = attributes[key_position].atttypid;
        let targets = shards
            .iter()
            .map(|(_, shard)| CopyTarget {
                node: shard.node.clone(),
                table: shard.qualified.clone(),
                columns: column_list.clone(),
            })
            .collect();
        let starts: Vec<i64> = shards.iter().map(|(start, _)| *start).collect();
        let format = if binary_possible(descriptor, &positions) {
            CopyFormat::Binary
        } else {
            CopyFormat::Text
        };

        let estate = pg_sys::CreateExecutorState();
        let econtext = pg_sys::MakePerTupleExprContext(estate);
        let reader = pg_sys::BeginCopyFrom(
            pstate,
            relation,
            std::ptr::null_mut(),
            (*stmt).filename,
            (*stmt).is_program,
            None,
            (*stmt).attlist,
            (*stmt).options,
        );
        let lines = ReaderLines::of(reader, relation);
        let mut batch_memory = PgMemoryContexts::new("pg_shard COPY batch");
        let mut batch = Batch::new(natts);
        crate::transaction::paths::router_wrote();
        let source = format!("COPY {}", table.display);
        let mut lookup_changes = Vec::new();
        let lookups = crate::lookups::catalog::any_has_lookups(&[table.relid])?;
        let taken = lookups.then_some(&mut lookup_changes);
        let ((), rows) = with_shard_copy(targets, Some(version), &source, format, taken, |copy| {
            let mut encoder = LineEncoder::new(descriptor, &positions, copy.format());
            loop {
                pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
                batch_memory.reset();
                batch.clear();
                let more = batch_memory.switch_to(|_| {
                    let more = batch.read(
                        reader,
                        econtext,
                        key_position,
                        key_type,
                        &starts,
                        table,
                        key_column,
                        lines,
                    )?;
                    send_batch(&batch, &mut encoder, copy).map(|_| more)
                })?;
                if !more {
                    return Ok(());
                }
            }
        })?;
        // Once the nodes' connections are back: lookup shards may be on them.
        crate::lookups::apply::apply(lookup_changes, version)?;
        pg_sys::EndCopyFrom(reader);
        pg_sys::FreeExecutorState(estate);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(rows)
    }
}

/// Rows parsed and not yet sent: each one's values, NULL flags, target and
/// (when the reader's are known) line in the input.
struct Batch {
    width: usize,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    targets: Vec<usize>,
    lines: Vec<u64>,
}

impl Batch {
    fn new(width: usize) -> Batch {
        Batch {
            width,
            values: Vec::with_capacity(width * BATCH_ROWS),
            nulls: Vec::with_capacity(width * BATCH_ROWS),
            targets: Vec::with_capacity(BATCH_ROWS),
            lines: Vec::with_capacity(BATCH_ROWS),
        }
    }

    fn clear(&mut self) {
        self.values.clear();
        self.nulls.clear();
        self.targets.clear();
        self.lines.clear();
    }

    /// Parse up to a batch of rows (in the current memory context); false
    /// when the input has ended. Errors are raised here, while COPY's error
    /// context names the line.
    ///
    /// # Safety
    /// `reader` is a COPY reader of a relation of `width` columns, and
    /// `lines` (if any) reads it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn read(
        &mut self,
        reader: pg_sys::CopyFromState,
        econtext: *mut pg_sys::ExprContext,
        key_position: usize,
        key_type: pg_sys::Oid,
        starts: &[i64],
        table: &LogicalTable,
        key_column: &str,
        lines: Option<ReaderLines>,
    ) -> Result<bool> {
        let mut line_context = pg_sys::ErrorContextCallback {
            previous: std::ptr::null_mut(),
            callback: Some(copy_from_error_callback),
            arg: reader.cast(),
        };
        // SAFETY: the callback is on the stack only while this frame lives:
        // `_pushed` takes it off when the frame ends, also when an ERROR
        // unwinds through it; the arrays handed to NextCopyFrom have
        // `width` room each.
        unsafe {
            let _pushed = ContextPushed::push(&mut line_context);
            let mut values = vec![pg_sys::Datum::from(0); self.width];
            let mut nulls = vec![false; self.width];
            while self.targets.len() < BATCH_ROWS {
                pgrx::check_for_interrupts!();
                let (values_out, nulls_out) = (values.as_mut_ptr(), nulls.as_mut_ptr());
                if !catch_error(|| next_copy_from(reader, econtext, values_out, nulls_out))? {
                    return Ok(false);
                }
                if nulls[key_position] {
                    // Raised here, for COPY's context to name the line.
                    let message = palloc_text(
                        &ShardError::NullKey {
                            table: table.display.clone(),
                            column: key_column.to_string(),
                        }
                        .to_string(),
                    );
                    catch_error::<()>(|| {
                        crate::error::raise_with_sqlstate(
                            "23502",
                            message,
                            std::ptr::null(),
                            std::ptr::null(),
                        )
                    })?;
                }
                let keyspace_id = key_to_keyspace_id(values[key_position], key_type)?.to_sql();
                let target = starts
                    .partition_point(|start| *start <= keyspace_id)
                    .saturating_sub(1);
                self.targets.push(target);
                if let Some(lines) = lines {
                    self.lines.push(lines.current());
                }
                self.values.extend_from_slice(&values);
                self.nulls.extend_from_slice(&nulls);
            }
            Ok(true)
        }
    }
}

/// The head of PostgreSQL 15's `CopyFromStateData`
/// (commands/copyfrom_internal.h), up to the line number its error context
/// reports, which pgrx's bindings do not describe.
#[repr(C)]
struct CopyFromStateHead {
    copy_src: std::ffi::c_int,
    copy_file: *mut std::ffi::c_void,
    fe_msgbuf: pg_sys::StringInfo,
    eol_type: std::ffi::c_int,
    file_encoding: std::ffi::c_int,
    need_transcoding: bool,
    conversion_proc: pg_sys::Oid,
    rel: pg_sys::Relation,
    attnumlist: *mut pg_sys::List,
    filename: *mut c_char,
    is_program: bool,
    data_source_cb: *mut std::ffi::c_void,
    opts: pg_sys::CopyFormatOptions,
    convert_select_flags: *mut bool,
    where_clause: *mut pg_sys::Node,
    cur_relname: *const c_char,
    cur_lineno: u64,
}

/// The line numbers PostgreSQL's COPY reader names rows by in its errors
/// (a header and a CSV row's quoted newlines count), read from the head of
/// its state.
#[derive(Clone, Copy)]
struct ReaderLines(*const CopyFromStateHead);

impl ReaderLines {
    /// None if the reader does not look as expected (its relation is not
    /// `relation`): rows are then named by their number.
    ///
    /// # Safety
    /// `reader` is a live COPY reader of `relation`.
    unsafe fn of(reader: pg_sys::CopyFromState, relation: pg_sys::Relation) -> Option<ReaderLines> {
        let head = reader.cast::<CopyFromStateHead>().cast_const();
        // SAFETY: a CopyFromStateData starts with the head's fields, in
        // PostgreSQL 15 (the only version this builds for); its relation
        // is checked before its line numbers are believed.
        (unsafe { (*head).rel } == relation).then_some(ReaderLines(head))
    }

    /// The line of the row the reader read last.
    ///
    /// # Safety
    /// The reader is still live.
    unsafe fn current(self) -> u64 {
        // SAFETY: as this function's; checked by `of`.
        unsafe { (*self.0).cur_lineno }
    }
}

/// `text` copied into the current memory context, NUL-terminated.
fn palloc_text(text: &str) -> *const c_char {
    let owned = std::ffi::CString::new(text.replace('\0', "")).unwrap_or_default();
    // SAFETY: copies a NUL-terminated string.
    unsafe { pg_sys::pstrdup(owned.as_ptr()) }
}

/// Run `work`, which calls PostgreSQL's C functions directly and owns
/// nothing that needs dropping, catching an ERROR it raises with all that
/// the error says (its CONTEXT too, which pgrx's guard drops).
///
/// # Safety
/// As said: `work` must not hold Rust values a longjmp out of it would skip.
unsafe fn catch_error<T>(work: impl FnOnce() -> T) -> Result<T> {
    // SAFETY: the same save, sigsetjmp and restore as PG_TRY/PG_CATCH (and
    // pgrx's guard): PostgreSQL's error handler longjmps back here, where
    // the error is copied out of the error context and flushed.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let exception_stack = pg_sys::PG_exception_stack;
        let context_stack = pg_sys::error_context_stack;
        let mut result = std::mem::MaybeUninit::<T>::uninit();
        let jumped = cee_scape::call_with_sigsetjmp(false, |jump_buffer| {
            pg_sys::PG_exception_stack =
                std::mem::transmute::<*const cee_scape::SigJmpBufFields, *mut pg_sys::sigjmp_buf>(
                    jump_buffer as *const cee_scape::SigJmpBufFields,
                );
            result.write(work());
            0
        });
        pg_sys::PG_exception_stack = exception_stack;
        pg_sys::error_context_stack = context_stack;
        if jumped == 0 {
            return Ok(result.assume_init());
        }
        pg_sys::CurrentMemoryContext = memory;
        let data = pg_sys::CopyErrorData();
        pg_sys::FlushErrorState();
        let text = |field: *mut c_char| {
            (!field.is_null()).then(|| CStr::from_ptr(field).to_string_lossy().into_owned())
        };
        let error = ShardError::CopyRow {
            sqlstate: unpack_sqlstate((*data).sqlerrcode),
            message: text((*data).message).unwrap_or_default(),
            detail: text((*data).detail),
            hint: text((*data).hint),
            context: text((*data).context),
        };
        pg_sys::FreeErrorData(data);
        Err(error)
    }
}

/// PGUNSIXBIT: a SQLSTATE's five characters from its packed code.
fn unpack_sqlstate(code: i32) -> String {
    (0..5)
        .map(|i| char::from((((code >> (6 * i)) & 0x3f) as u8) + b'0'))
        .collect()
}

/// An error context callback on PostgreSQL's stack until dropped.
struct ContextPushed {
    previous: *mut pg_sys::ErrorContextCallback,
}

impl ContextPushed {
    /// # Safety
    /// `callback` must outlive the returned guard.
    unsafe fn push(callback: &mut pg_sys::ErrorContextCallback) -> ContextPushed {
        // SAFETY: a backend-global list head, changed on this thread only.
        unsafe {
            callback.previous = pg_sys::error_context_stack;
            pg_sys::error_context_stack = callback;
        }
        ContextPushed {
            previous: callback.previous,
        }
    }
}

impl Drop for ContextPushed {
    fn drop(&mut self) {
        // SAFETY: as in push: the list as it was before.
        unsafe { pg_sys::error_context_stack = self.previous };
    }
}

/// Encode a batch's rows (text under portable settings) and hand them to `copy`.
fn send_batch(batch: &Batch, encoder: &mut LineEncoder, copy: &mut ShardCopy) -> Result<()> {
    let mut line = Vec::new();
    with_settings(PORTABLE_TEXT, || {
        for (row, &target) in batch.targets.iter().enumerate() {
            let span = row * batch.width..(row + 1) * batch.width;
            line.clear();
            // SAFETY: a row NextCopyFrom filled for the encoder's descriptor.
            unsafe { encoder.encode(&batch.values[span.clone()], &batch.nulls[span], &mut line) };
            match batch.lines.get(row) {
                Some(&number) => copy.push_line(target, &line, number)?,
                None => copy.push(target, &line)?,
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlstates_unpack() {
        let pack = |code: &str| crate::error::make_sqlstate(code);
        for code in ["22P02", "23502", "PS001", "XX000"] {
            assert_eq!(super::unpack_sqlstate(pack(code)), code);
        }
    }
}
