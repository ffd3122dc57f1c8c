//! Rows for COPY to a node: as text lines, each column through its type's
//! output function, escaped for COPY's text format (values print as the
//! session's settings say: callers print under `settings::PORTABLE_TEXT`);
//! or in COPY's binary format, when every column's type has a binary form
//! that means the same on every node ([`binary_possible`]): fixed-width
//! values and strings written straight from the datum, the rest through
//! the type's send function. A node reads binary rows with
//! far less work than it parses text (TPC-H's lineitem: 1.3 s against
//! 2.0–2.3 s for 600,000 rows).

use pgrx::prelude::*;
use std::ffi::CStr;

/// How rows travel: COPY's text or binary format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyFormat {
    Text,
    Binary,
}

impl CopyFormat {
    /// The options a `COPY … FROM STDIN` of this format needs.
    pub(crate) fn options(self) -> &'static str {
        match self {
            CopyFormat::Text => "",
            CopyFormat::Binary => " WITH (FORMAT binary)",
        }
    }

    /// What a COPY's data starts with: binary's signature, flags (none)
    /// and header extension length (0).
    pub(crate) fn header(self) -> &'static [u8] {
        match self {
            CopyFormat::Text => b"",
            CopyFormat::Binary => b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0",
        }
    }

    /// What a COPY's data ends with: binary's field count -1.
    pub(crate) fn trailer(self) -> &'static [u8] {
        match self {
            CopyFormat::Text => b"",
            CopyFormat::Binary => b"\xff\xff",
        }
    }
}

/// How one column's value is written in COPY's binary format.
#[derive(Clone, Copy)]
enum BinaryField {
    /// A pass-by-value integer (or float's bits) of this many bytes, big-endian.
    Integer(usize),
    Bool,
    /// A varlena's bytes as they are: text, varchar, bpchar (in the
    /// database's encoding, which the caller checked is the node's) and
    /// bytea. Their send functions would convert text to the session's
    /// client encoding, which is not what the node reads.
    Bytes,
    /// A `name`'s characters.
    Name,
    /// A 16-byte value passed by reference (uuid).
    Fixed16,
    /// Through the type's send function (numeric, interval, timetz).
    Send,
}

/// The built-in types whose binary form names no object of the sending
/// server's (unlike `regclass`, or an array's or a record's element type,
/// which are OIDs) and depends on none of its settings, so their values
/// mean the same on every node; and how each is written.
fn binary_field(type_oid: pg_sys::Oid) -> Option<BinaryField> {
    Some(match type_oid {
        pg_sys::BOOLOID => BinaryField::Bool,
        pg_sys::INT2OID => BinaryField::Integer(2),
        pg_sys::INT4OID | pg_sys::OIDOID | pg_sys::DATEOID | pg_sys::FLOAT4OID => {
            BinaryField::Integer(4)
        }
        pg_sys::INT8OID
        | pg_sys::FLOAT8OID
        | pg_sys::TIMEOID
        | pg_sys::TIMESTAMPOID
        | pg_sys::TIMESTAMPTZOID => BinaryField::Integer(8),
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID | pg_sys::BYTEAOID => {
            BinaryField::Bytes
        }
        pg_sys::NAMEOID => BinaryField::Name,
        pg_sys::UUIDOID => BinaryField::Fixed16,
        pg_sys::NUMERICOID | pg_sys::INTERVALOID | pg_sys::TIMETZOID => BinaryField::Send,
        _ => return None,
    })
}

/// Whether the columns at `positions` of `descriptor` can all travel in
/// COPY's binary format.
///
/// # Safety
/// `descriptor` must be a valid tuple descriptor holding `positions`.
pub(crate) unsafe fn binary_possible(descriptor: pg_sys::TupleDesc, positions: &[usize]) -> bool {
    // SAFETY: the caller vouches for the descriptor and positions.
    let attributes = unsafe { (*descriptor).attrs.as_slice((*descriptor).natts as usize) };
    positions
        .iter()
        .all(|&position| binary_field(attributes[position].atttypid).is_some())
}

/// The output (or send) functions of some columns of a tuple descriptor.
pub(crate) struct LineEncoder {
    format: CopyFormat,
    /// Per printed column: its position in the tuple, its output function
    /// (send function for binary).
    columns: Vec<(usize, pg_sys::FmgrInfo)>,
    /// In binary, how each printed column is written.
    fields: Vec<BinaryField>,
}

impl LineEncoder {
    /// An encoder of the columns at `positions` (zero-based, in that
    /// order) of `descriptor`, in `format` (binary only where
    /// [`binary_possible`] says so).
    ///
    /// # Safety
    /// `descriptor` must be a valid tuple descriptor holding `positions`.
    pub(crate) unsafe fn new(
        descriptor: pg_sys::TupleDesc,
        positions: &[usize],
        format: CopyFormat,
    ) -> LineEncoder {
        // SAFETY: the caller vouches for the descriptor and positions;
        // fmgr_info fills the FmgrInfo it is given (in the current memory
        // context, which outlives the encoder's use).
        unsafe {
            let attributes = (*descriptor).attrs.as_slice((*descriptor).natts as usize);
            let columns = positions
                .iter()
                .map(|&position| {
                    let (mut function_oid, mut varlena) = (pg_sys::Oid::INVALID, false);
                    let type_oid = attributes[position].atttypid;
                    match format {
                        CopyFormat::Text => {
                            pg_sys::getTypeOutputInfo(type_oid, &mut function_oid, &mut varlena)
                        }
                        CopyFormat::Binary => pg_sys::getTypeBinaryOutputInfo(
                            type_oid,
                            &mut function_oid,
                            &mut varlena,
                        ),
                    }
                    let mut function: pg_sys::FmgrInfo = std::mem::zeroed();
                    pg_sys::fmgr_info(function_oid, &mut function);
                    (position, function)
                })
                .collect();
            let fields = match format {
                CopyFormat::Text => Vec::new(),
                CopyFormat::Binary => positions
                    .iter()
                    .map(|&position| {
                        binary_field(attributes[position].atttypid).unwrap_or(BinaryField::Send)
                    })
                    .collect(),
            };
            LineEncoder {
                format,
                columns,
                fields,
            }
        }
    }

    /// Append one row to `line`: in text, tab-separated, `\N` for NULL,
    /// ending in a newline; in binary, the field count and each field's
    /// length (-1 for NULL) and bytes. The output functions allocate in
    /// the current memory context: callers reset it between rows or batches.
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
        if self.format == CopyFormat::Binary {
            // SAFETY: as the caller vouches.
            unsafe { self.encode_binary(values, nulls, line) };
            return;
        }
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

    /// # Safety
    /// As for [`LineEncoder::encode`].
    unsafe fn encode_binary(
        &mut self,
        values: &[pg_sys::Datum],
        nulls: &[bool],
        line: &mut Vec<u8>,
    ) {
        line.extend_from_slice(&(self.columns.len() as i16).to_be_bytes());
        for ((position, function), field) in self.columns.iter_mut().zip(&self.fields) {
            if nulls[*position] {
                line.extend_from_slice(&(-1i32).to_be_bytes());
                continue;
            }
            let value = values[*position];
            // SAFETY: a non-NULL value of the column's type, which `field`
            // was chosen for: by value for Integer and Bool, a varlena for
            // Bytes, a NameData for Name, 16 bytes for Fixed16; a send
            // function returns a palloc'd bytea.
            let bytes: &[u8] = unsafe {
                match *field {
                    BinaryField::Integer(width) => {
                        let all = (value.value() as u64).to_be_bytes();
                        line.extend_from_slice(&(width as i32).to_be_bytes());
                        line.extend_from_slice(&all[8 - width..]);
                        continue;
                    }
                    BinaryField::Bool => {
                        line.extend_from_slice(&1i32.to_be_bytes());
                        line.push(u8::from(value.value() != 0));
                        continue;
                    }
                    BinaryField::Bytes => {
                        let varlena = pg_sys::pg_detoast_datum_packed(value.cast_mut_ptr());
                        std::slice::from_raw_parts(
                            pgrx::varlena::vardata_any(varlena) as *const u8,
                            pgrx::varlena::varsize_any_exhdr(varlena),
                        )
                    }
                    BinaryField::Name => {
                        CStr::from_ptr(value.cast_mut_ptr::<std::ffi::c_char>()).to_bytes()
                    }
                    BinaryField::Fixed16 => {
                        std::slice::from_raw_parts(value.cast_mut_ptr::<u8>(), 16)
                    }
                    BinaryField::Send => {
                        let sent = pg_sys::SendFunctionCall(function, value);
                        std::slice::from_raw_parts(
                            pgrx::varlena::vardata_any(sent) as *const u8,
                            pgrx::varlena::varsize_any_exhdr(sent),
                        )
                    }
                }
            };
            line.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
            line.extend_from_slice(bytes);
        }
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
