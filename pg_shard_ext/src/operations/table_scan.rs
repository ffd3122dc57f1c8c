//! Reading a table's own rows (not its children's) in COPY text form, with
//! a sequential scan and each column type's output function: no SQL, no
//! casts and no per-value strings, since a table being distributed may be
//! large.

use crate::error::{Result, ShardError};
use crate::keyspace::key_to_keyspace_id;
use pg_shard_core::KeyspaceId;
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::CStr;

/// One column to print: its position in the tuple and its output function.
struct Output {
    index: usize,
    function: pg_sys::FmgrInfo,
}

/// Hand every row of `relid` to `each_row` as one COPY text line of
/// `columns` (in that order), with the keyspace id of `key_column` when
/// one is named (None for a NULL key). Reads with the latest snapshot after
/// this transaction's own earlier commands: the caller holds a lock that
/// keeps writers out, and must see every committed row.
pub(crate) fn for_each_copy_line(
    relid: pg_sys::Oid,
    columns: &[String],
    key_column: Option<&str>,
    mut each_row: impl FnMut(Option<KeyspaceId>, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut row_memory = PgMemoryContexts::new("pg_shard table scan row");
    let mut line = Vec::new();
    // SAFETY: the relation is opened and closed here, the snapshot
    // registered and unregistered, the scan and slot made and dropped; the
    // slot's values are read after slot_getallattrs, within its natts, and
    // output functions return palloc'd C strings in the row context, which
    // is reset after each row. An error raised by PostgreSQL in between
    // aborts the transaction, which releases all of them.
    unsafe {
        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let relation = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let descriptor = (*relation).rd_att;
        let attributes = (*descriptor).attrs.as_slice((*descriptor).natts as usize);
        let find = |name: &str| -> Result<(usize, pg_sys::Oid)> {
            attributes
                .iter()
                .enumerate()
                .find(|(_, a)| {
                    !a.attisdropped
                        && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
                })
                .map(|(index, a)| (index, a.atttypid))
                .ok_or_else(|| {
                    ShardError::Internal(format!("column \"{name}\" not found in the table"))
                })
        };
        let mut outputs = Vec::with_capacity(columns.len());
        for name in columns {
            let (index, type_oid) = find(name)?;
            let (mut function_oid, mut varlena) = (pg_sys::Oid::INVALID, false);
            pg_sys::getTypeOutputInfo(type_oid, &mut function_oid, &mut varlena);
            let mut function: pg_sys::FmgrInfo = std::mem::zeroed();
            pg_sys::fmgr_info(function_oid, &mut function);
            outputs.push(Output { index, function });
        }
        let key = key_column.map(find).transpose()?;
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
            if rows % 1024 == 0 {
                pgrx::check_for_interrupts!();
            }
            pg_sys::slot_getallattrs(slot);
            let natts = (*slot).tts_nvalid as usize;
            let values = std::slice::from_raw_parts((*slot).tts_values, natts);
            let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts);
            let keyspace_id = match key {
                Some((index, _)) if nulls[index] => None,
                Some((index, type_oid)) => match key_to_keyspace_id(values[index], type_oid) {
                    Ok(id) => Some(id),
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                },
                None => None,
            };
            line.clear();
            row_memory.switch_to(|_| {
                for (position, output) in outputs.iter_mut().enumerate() {
                    if position > 0 {
                        line.push(b'\t');
                    }
                    if nulls[output.index] {
                        line.extend_from_slice(b"\\N");
                    } else {
                        let text =
                            pg_sys::OutputFunctionCall(&mut output.function, values[output.index]);
                        escape_copy_text(CStr::from_ptr(text).to_bytes(), &mut line);
                    }
                }
            });
            row_memory.reset();
            line.push(b'\n');
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

/// COPY text format: backslash, tab, newline and carriage return escaped.
pub(crate) fn escape_copy_text(value: &[u8], out: &mut Vec<u8>) {
    let mut start = 0;
    for (position, byte) in value.iter().enumerate() {
        let escaped: &[u8] = match byte {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            _ => continue,
        };
        out.extend_from_slice(&value[start..position]);
        out.extend_from_slice(escaped);
        start = position + 1;
    }
    out.extend_from_slice(&value[start..]);
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_text_escapes() {
        let mut out = Vec::new();
        super::escape_copy_text(b"a\tb\\c\nd\re", &mut out);
        assert_eq!(out, b"a\\tb\\\\c\\nd\\re");
        out.clear();
        super::escape_copy_text(b"plain", &mut out);
        assert_eq!(out, b"plain");
    }
}
