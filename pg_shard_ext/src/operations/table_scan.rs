//! Reading a table's own rows (not its children's) as COPY text lines, with
//! a sequential scan and each column type's output function: no SQL, no
//! casts and no per-value strings, since a table being distributed may be
//! large.

use crate::copy_rows::{binary_possible, CopyFormat, LineEncoder};
use crate::error::{Result, ShardError};
use crate::keyspace::key_to_keyspace_id;
use pg_shard_core::KeyspaceId;
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::CStr;

/// The format rows of `columns` of `relid` can travel in: binary when
/// every column's type allows ([`binary_possible`]).
pub(crate) fn copy_format(relid: pg_sys::Oid, columns: &[String]) -> Result<CopyFormat> {
    // SAFETY: the relation is opened and closed here; its descriptor is
    // read while open.
    unsafe {
        let relation = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let descriptor = (*relation).rd_att;
        let positions = column_positions(descriptor, columns);
        let format = match positions {
            Ok(ref positions) if binary_possible(descriptor, positions) => CopyFormat::Binary,
            _ => CopyFormat::Text,
        };
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        positions.map(|_| format)
    }
}

/// The positions (zero-based) of `columns` in `descriptor`.
///
/// # Safety
/// `descriptor` must be a valid tuple descriptor.
unsafe fn column_positions(
    descriptor: pg_sys::TupleDesc,
    columns: &[String],
) -> Result<Vec<usize>> {
    columns
        .iter()
        // SAFETY: as the caller vouches.
        .map(|name| unsafe { find_column(descriptor, name) }.map(|(position, _)| position))
        .collect()
}

/// The position (zero-based) and type of column `name` of `descriptor`.
///
/// # Safety
/// `descriptor` must be a valid tuple descriptor.
unsafe fn find_column(descriptor: pg_sys::TupleDesc, name: &str) -> Result<(usize, pg_sys::Oid)> {
    // SAFETY: as the caller vouches; attname is a NUL-terminated NameData.
    let attributes = unsafe { (*descriptor).attrs.as_slice((*descriptor).natts as usize) };
    attributes
        .iter()
        .enumerate()
        .find(|(_, a)| {
            !a.attisdropped
                && unsafe { CStr::from_ptr(a.attname.data.as_ptr()) }.to_bytes() == name.as_bytes()
        })
        .map(|(position, a)| (position, a.atttypid))
        .ok_or_else(|| ShardError::Internal(format!("column \"{name}\" not found in the table")))
}

/// Hand every row of `relid` to `each_row` as one row of COPY data of
/// `columns` (in that order) in `format`, with the keyspace id of `key_column` when
/// one is named (None for a NULL key). Reads with the latest snapshot after
/// this transaction's own earlier commands: the caller holds a lock that
/// keeps writers out, and must see every committed row.
pub(crate) fn for_each_copy_line(
    relid: pg_sys::Oid,
    columns: &[String],
    key_column: Option<&str>,
    format: CopyFormat,
    mut each_row: impl FnMut(Option<KeyspaceId>, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut row_memory = PgMemoryContexts::new("pg_shard table scan row");
    let mut line = Vec::new();
    // SAFETY: the relation is opened and closed here, the snapshot
    // registered and unregistered, the scan and slot made and dropped; the
    // slot's values are read after slot_getallattrs, within its natts, and
    // output functions allocate in the row context, which is reset after
    // each row. An error raised by PostgreSQL in between aborts the
    // transaction, which releases all of them.
    unsafe {
        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let relation = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let descriptor = (*relation).rd_att;
        let positions = column_positions(descriptor, columns)?;
        let mut encoder = LineEncoder::new(descriptor, &positions, format);
        let key = key_column
            .map(|name| find_column(descriptor, name))
            .transpose()?;
        let scan = pg_sys::table_beginscan(relation, snapshot, 0, std::ptr::null_mut());
        let slot = pg_sys::table_slot_create(relation, std::ptr::null_mut());
        let mut result = Ok(());
        let mut rows: u64 = 0;
        while pg_sys::table_scan_getnextslot(
            scan,
            pg_sys::ScanDirection::ForwardScanDirection,
            slot,
        ) {
            rows += 1;
            if rows.is_multiple_of(1024) {
                pgrx::check_for_interrupts!();
            }
            pg_sys::slot_getallattrs(slot);
            let natts = (*slot).tts_nvalid as usize;
            let values = std::slice::from_raw_parts((*slot).tts_values, natts);
            let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts);
            let keyspace_id = match key {
                Some((position, _)) if nulls[position] => None,
                Some((position, type_oid)) => {
                    match key_to_keyspace_id(values[position], type_oid) {
                        Ok(id) => Some(id),
                        Err(error) => {
                            result = Err(error);
                            break;
                        }
                    }
                }
                None => None,
            };
            line.clear();
            row_memory.switch_to(|_| encoder.encode(values, nulls, &mut line));
            row_memory.reset();
            if let Err(error) = each_row(keyspace_id, &line) {
                result = Err(error);
                break;
            }
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::table_endscan(scan);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::UnregisterSnapshot(snapshot);
        result
    }
}
