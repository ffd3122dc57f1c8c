//! Rows as COPY text lines: each column through its type's output
//! function, escaped for COPY's text format. Values print as the session's
//! settings say: callers print under `settings::PORTABLE_TEXT`.

use pgrx::prelude::*;
use std::ffi::CStr;

/// The output functions of some columns of a tuple descriptor.
pub(crate) struct LineEncoder {
    /// Per printed column: its position in the tuple, its output function.
    columns: Vec<(usize, pg_sys::FmgrInfo)>,
}

impl LineEncoder {
    /// An encoder of the columns at `positions` (zero-based, in that
    /// order) of `descriptor`.
    ///
    /// # Safety
    /// `descriptor` must be a valid tuple descriptor holding `positions`.
    pub(crate) unsafe fn new(descriptor: pg_sys::TupleDesc, positions: &[usize]) -> LineEncoder {
        // SAFETY: the caller vouches for the descriptor and positions;
        // fmgr_info fills the FmgrInfo it is given (in the current memory
        // context, which outlives the encoder's use).
        unsafe {
            let attributes = (*descriptor).attrs.as_slice((*descriptor).natts as usize);
            let columns = positions
                .iter()
                .map(|&position| {
                    let (mut function_oid, mut varlena) = (pg_sys::Oid::INVALID, false);
                    pg_sys::getTypeOutputInfo(
                        attributes[position].atttypid,
                        &mut function_oid,
                        &mut varlena,
                    );
                    let mut function: pg_sys::FmgrInfo = std::mem::zeroed();
                    pg_sys::fmgr_info(function_oid, &mut function);
                    (position, function)
                })
                .collect();
            LineEncoder { columns }
        }
    }

    /// Append the line of one row (tab-separated, `\N` for NULL, ending in
    /// a newline) to `line`. The output functions allocate in the current
    /// memory context: callers reset it between rows or batches.
    ///
    /// # Safety
    /// `values` and `nulls` must be a row of the descriptor the encoder was
    /// made for.
    pub(crate) unsafe fn encode(
        &mut self,
        values: &[pg_sys::Datum],
        nulls: &[bool],
        line: &mut Vec<u8>,
    ) {
        for (printed, (position, function)) in self.columns.iter_mut().enumerate() {
            if printed > 0 {
                line.push(b'\t');
            }
            if nulls[*position] {
                line.extend_from_slice(b"\\N");
            } else {
                // SAFETY: a non-NULL value of the column's type, and its
                // type's output function; it returns a palloc'd C string.
                let text = unsafe {
                    CStr::from_ptr(pg_sys::OutputFunctionCall(function, values[*position]))
                };
                escape_copy_text(text.to_bytes(), line);
            }
        }
        line.push(b'\n');
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
