//! Rows of a COPY FROM STDIN stream (text, CSV or binary) as the client
//! sends them in CopyData pieces: where each row ends, its line number as
//! PostgreSQL counts them, and the value of the one column the coordinator
//! needs (the distribution key). Rows are passed on byte for byte.

use crate::router::copy::{CopyFormat, CopyIn};
use bytes::{Buf, Bytes, BytesMut};

/// A row (or binary field) longer than this fails the COPY: the
/// coordinator holds a row whole before it knows its shard.
pub(super) const MAX_ROW_BYTES: usize = 64 << 20;

/// The binary format's signature, flags and header extension length.
pub(super) const BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The binary format's trailer (a field count of -1).
pub(super) const BINARY_TRAILER: &[u8] = &[0xff, 0xff];

/// The key column's value in a row.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum KeyValue {
    /// Its text (text and CSV formats, escapes undone).
    Text(String),
    /// Its binary representation (binary format).
    Binary(Bytes),
    Null,
    /// The row has fewer columns.
    Missing,
}

pub(super) struct Row {
    /// The row as sent, with its line end (text, CSV) or field count
    /// (binary).
    pub(super) bytes: Bytes,
    /// Its line (the last, for a CSV row with quoted newlines; the tuple's
    /// number in binary), counted from 1 as PostgreSQL does, header included.
    pub(super) line: u64,
    /// Lines it spans (more than one: a CSV row with quoted newlines).
    pub(super) spans: u64,
    pub(super) key: KeyValue,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum RowError {
    #[error("COPY file signature not recognized")]
    BadSignature,
    #[error("invalid COPY file header")]
    BadHeader,
    #[error("row field count is {0}, expected at least {1}")]
    FieldCount(i16, usize),
    #[error("unterminated CSV quoted field")]
    UnterminatedQuote,
    #[error("unexpected EOF in COPY data")]
    Truncated,
    #[error("a row of more than 64 MB (or a line end other than \\n) in COPY data")]
    TooLong,
}

pub(super) struct RowReader {
    format: CopyFormat,
    delimiter: u8,
    quote: u8,
    escape: u8,
    null: Vec<u8>,
    key_index: usize,
    skip_header: bool,
    binary_header_read: bool,
    buffer: BytesMut,
    /// Lines (tuples) consumed.
    line: u64,
    /// The end-of-data marker (`\.` or the binary trailer) was read.
    ended: bool,
    /// How far the buffered, unfinished row was scanned: where to go on,
    /// inside quotes or not, quoted newlines so far.
    scanned: usize,
    scan_in_quote: bool,
    scan_newlines: u64,
}

impl RowReader {
    pub(super) fn new(copy: &CopyIn, key_index: usize) -> RowReader {
        RowReader {
            format: copy.format.clone(),
            delimiter: copy.delimiter,
            quote: copy.quote,
            escape: copy.escape,
            null: copy.null.as_bytes().to_vec(),
            key_index,
            skip_header: copy.header,
            binary_header_read: false,
            buffer: BytesMut::new(),
            line: 0,
            ended: false,
            scanned: 0,
            scan_in_quote: false,
            scan_newlines: 0,
        }
    }

    pub(super) fn push(&mut self, data: &[u8]) {
        if !self.ended {
            self.buffer.extend_from_slice(data);
        }
    }

    /// The line (tuple) last read.
    pub(super) fn line(&self) -> u64 {
        self.line
    }

    /// The next whole row buffered, if any. `at_end`: no more data comes
    /// (a last line without its newline is a row).
    pub(super) fn next_row(&mut self, at_end: bool) -> Result<Option<Row>, RowError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            let row = match self.format {
                CopyFormat::Binary => return self.next_binary(at_end),
                CopyFormat::Text | CopyFormat::Csv => self.next_line(at_end)?,
            };
            let Some(row) = row else {
                return Ok(None);
            };
            if self.skip_header {
                self.skip_header = false;
                continue;
            }
            // The end-of-data marker alone on its line.
            let content = trim_line_end(&row.bytes);
            if content == b"\\." {
                self.ended = true;
                return Ok(None);
            }
            return Ok(Some(row));
        }
    }

    /// A text or CSV row: up to a newline outside quotes.
    fn next_line(&mut self, at_end: bool) -> Result<Option<Row>, RowError> {
        let csv = self.format == CopyFormat::Csv;
        let mut in_quote = self.scan_in_quote;
        let mut newlines = self.scan_newlines;
        let mut end = None;
        let mut i = self.scanned;
        let data = &self.buffer[..];
        // The last byte may start a pair (an escape, a doubled quote) whose
        // second byte comes in the next piece: it is read then.
        let limit = if at_end {
            data.len()
        } else {
            data.len().saturating_sub(1)
        };
        while i < limit {
            let byte = data[i];
            if csv {
                if in_quote {
                    let next = data.get(i + 1);
                    if byte == self.escape
                        && self.escape != self.quote
                        && (next == Some(&self.quote) || next == Some(&self.escape))
                    {
                        i += 2;
                        continue;
                    }
                    if byte == self.quote {
                        if self.escape == self.quote && next == Some(&self.quote) {
                            i += 2;
                            continue;
                        }
                        in_quote = false;
                    } else if byte == b'\n' {
                        newlines += 1;
                    }
                } else if byte == self.quote {
                    in_quote = true;
                } else if byte == b'\n' {
                    end = Some(i + 1);
                    break;
                }
            } else if byte == b'\\' {
                // An escaped byte (a backslash-newline is a data newline,
                // on the same line as PostgreSQL counts them).
                i += 2;
                continue;
            } else if byte == b'\n' {
                end = Some(i + 1);
                break;
            }
            i += 1;
        }
        let end = match end {
            Some(end) => end,
            None if at_end && !self.buffer.is_empty() => {
                if in_quote {
                    return Err(RowError::UnterminatedQuote);
                }
                self.buffer.len()
            }
            None => {
                if self.buffer.len() > MAX_ROW_BYTES {
                    return Err(RowError::TooLong);
                }
                // Go on from here when more data comes.
                self.scanned = i;
                self.scan_in_quote = in_quote;
                self.scan_newlines = newlines;
                return Ok(None);
            }
        };
        self.scanned = 0;
        self.scan_in_quote = false;
        self.scan_newlines = 0;
        let bytes = self.buffer.split_to(end).freeze();
        let spans = 1 + newlines;
        self.line += spans;
        let key = if csv {
            self.csv_key(&bytes)
        } else {
            self.text_key(&bytes)
        };
        Ok(Some(Row {
            bytes,
            line: self.line,
            spans,
            key,
        }))
    }

    fn text_key(&self, row: &[u8]) -> KeyValue {
        let row = trim_line_end(row);
        let mut field = 0;
        let mut start = 0;
        let mut i = 0;
        while i <= row.len() {
            if i < row.len() && row[i] == b'\\' {
                i += 2;
                continue;
            }
            if i == row.len() || row[i] == self.delimiter {
                if field == self.key_index {
                    let raw = &row[start..i.min(row.len())];
                    if raw == self.null.as_slice() {
                        return KeyValue::Null;
                    }
                    return KeyValue::Text(unescape_text(raw));
                }
                field += 1;
                start = i + 1;
            }
            i += 1;
        }
        KeyValue::Missing
    }

    fn csv_key(&self, row: &[u8]) -> KeyValue {
        let row = trim_line_end(row);
        let mut field = 0;
        let mut i = 0;
        loop {
            // One field from i.
            let mut value = Vec::new();
            let mut quoted = false;
            let mut in_quote = false;
            while i < row.len() {
                let byte = row[i];
                if in_quote {
                    let next = row.get(i + 1).copied();
                    if byte == self.escape
                        && (next == Some(self.quote)
                            || (self.escape != self.quote && next == Some(self.escape)))
                    {
                        value.push(next.unwrap_or(self.quote));
                        i += 2;
                        continue;
                    }
                    if byte == self.quote {
                        in_quote = false;
                    } else {
                        value.push(byte);
                    }
                } else if byte == self.quote {
                    in_quote = true;
                    quoted = true;
                } else if byte == self.delimiter {
                    break;
                } else {
                    value.push(byte);
                }
                i += 1;
            }
            if field == self.key_index {
                if !quoted && value == self.null {
                    return KeyValue::Null;
                }
                return KeyValue::Text(String::from_utf8_lossy(&value).into_owned());
            }
            if i >= row.len() {
                return KeyValue::Missing;
            }
            field += 1;
            i += 1;
        }
    }

    /// A binary tuple (the header first).
    fn next_binary(&mut self, at_end: bool) -> Result<Option<Row>, RowError> {
        if !self.binary_header_read {
            if self.buffer.len() < 19 {
                return if at_end {
                    Err(RowError::Truncated)
                } else {
                    Ok(None)
                };
            }
            if &self.buffer[..11] != b"PGCOPY\n\xff\r\n\0" {
                return Err(RowError::BadSignature);
            }
            let extension = u32::from_be_bytes([
                self.buffer[15],
                self.buffer[16],
                self.buffer[17],
                self.buffer[18],
            ]) as usize;
            if extension > MAX_ROW_BYTES {
                return Err(RowError::BadHeader);
            }
            if self.buffer.len() < 19 + extension {
                return if at_end {
                    Err(RowError::BadHeader)
                } else {
                    Ok(None)
                };
            }
            self.buffer.advance(19 + extension);
            self.binary_header_read = true;
        }
        if self.buffer.len() < 2 {
            return if at_end && !self.buffer.is_empty() {
                Err(RowError::Truncated)
            } else {
                Ok(None)
            };
        }
        let count = i16::from_be_bytes([self.buffer[0], self.buffer[1]]);
        if count == -1 {
            self.ended = true;
            return Ok(None);
        }
        if count < 0 {
            return Err(RowError::FieldCount(count, self.key_index + 1));
        }
        let mut at = 2;
        let mut key = KeyValue::Missing;
        for field in 0..count as usize {
            let Some(length) = self.buffer.get(at..at + 4) else {
                return if at_end {
                    Err(RowError::Truncated)
                } else {
                    Ok(None)
                };
            };
            let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
            at += 4;
            let size = length.max(0) as usize;
            if size > MAX_ROW_BYTES {
                return Err(RowError::TooLong);
            }
            if self.buffer.len() < at + size {
                return if at_end {
                    Err(RowError::Truncated)
                } else {
                    Ok(None)
                };
            }
            if field == self.key_index {
                key = if length < 0 {
                    KeyValue::Null
                } else {
                    KeyValue::Binary(Bytes::copy_from_slice(&self.buffer[at..at + size]))
                };
            }
            at += size;
        }
        let bytes = self.buffer.split_to(at).freeze();
        self.line += 1;
        Ok(Some(Row {
            bytes,
            line: self.line,
            spans: 1,
            key,
        }))
    }
}

/// A line without its `\n` or `\r\n`.
fn trim_line_end(row: &[u8]) -> &[u8] {
    let row = row.strip_suffix(b"\n").unwrap_or(row);
    row.strip_suffix(b"\r").unwrap_or(row)
}

/// A text-format field with its backslash escapes undone.
fn unescape_text(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' || i + 1 >= raw.len() {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let next = raw[i + 1];
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut value = u32::from(next - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(digit @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(digit - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(value as u8);
            }
            b'x' => {
                let hex: Vec<u8> = raw[i..]
                    .iter()
                    .take(2)
                    .take_while(|b| b.is_ascii_hexdigit())
                    .copied()
                    .collect();
                if hex.is_empty() {
                    out.push(b'x');
                } else {
                    i += hex.len();
                    let text = String::from_utf8_lossy(&hex).into_owned();
                    out.push(u8::from_str_radix(&text, 16).unwrap_or(0));
                }
            }
            other => out.push(other),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::copy::copy_in;

    fn rows(sql: &str, key_index: usize, pieces: &[&[u8]]) -> Vec<(u64, KeyValue, Vec<u8>)> {
        let copy = copy_in(sql).unwrap();
        let mut reader = RowReader::new(&copy, key_index);
        let mut out = Vec::new();
        for (n, piece) in pieces.iter().enumerate() {
            reader.push(piece);
            while let Some(row) = reader.next_row(n + 1 == pieces.len()).unwrap() {
                out.push((row.line, row.key, row.bytes.to_vec()));
            }
        }
        out
    }

    #[test]
    fn text_rows_split_anywhere() {
        let got = rows(
            "COPY t FROM STDIN",
            1,
            &[b"a\t4", b"2\tx\nb\t\\N\n", b"c\t7\\t\n\\.\nignored\n"],
        );
        assert_eq!(
            got,
            vec![
                (1, KeyValue::Text("42".into()), b"a\t42\tx\n".to_vec()),
                (2, KeyValue::Null, b"b\t\\N\n".to_vec()),
                (3, KeyValue::Text("7\t".into()), b"c\t7\\t\n".to_vec()),
            ]
        );
        // A last line without its newline; a short row.
        let got = rows("COPY t FROM STDIN", 2, &[b"1\t2\n3\t4\t5"]);
        assert_eq!(got[0].1, KeyValue::Missing);
        assert_eq!(got[1].1, KeyValue::Text("5".into()));
    }

    #[test]
    fn csv_rows_with_quotes_newlines_and_a_header() {
        let got = rows(
            "COPY t FROM STDIN WITH (FORMAT csv, HEADER)",
            0,
            &[b"id,note\n\"1\",\"two\nlines\"\n2,\"a \"\"quote\"\"\"\n,empty\n\"\",quoted\n"],
        );
        let keys: Vec<(u64, KeyValue)> = got.into_iter().map(|(l, k, _)| (l, k)).collect();
        assert_eq!(
            keys,
            vec![
                (3, KeyValue::Text("1".into())),
                (4, KeyValue::Text("2".into())),
                (5, KeyValue::Null),
                (6, KeyValue::Text(String::new())),
            ]
        );
    }

    #[test]
    fn pairs_split_between_pieces_and_escaped_escapes() {
        // An escaped escape and an escaped quote, each cut between two
        // pieces.
        let got = rows(
            "COPY t FROM STDIN WITH (FORMAT csv, ESCAPE '\\')",
            0,
            &[b"\"a\\", b"\\b\",1\n\"q\\", b"\"x\",2\n"],
        );
        let keys: Vec<KeyValue> = got.into_iter().map(|(_, k, _)| k).collect();
        assert_eq!(
            keys,
            vec![KeyValue::Text("a\\b".into()), KeyValue::Text("q\"x".into())]
        );
        // A backslash-newline in text is data on the same line.
        let got = rows("COPY t FROM STDIN", 0, &[b"1\tx\\\ny\n2\tz\n"]);
        assert_eq!((got[0].0, got[1].0), (1, 2));
    }

    #[test]
    fn a_row_without_end_is_bounded() {
        let copy = copy_in("COPY t FROM STDIN").unwrap();
        let mut reader = RowReader::new(&copy, 0);
        let piece = vec![b'x'; 1 << 20];
        let mut failed = false;
        for _ in 0..(MAX_ROW_BYTES >> 20) + 2 {
            reader.push(&piece);
            if matches!(reader.next_row(false), Err(RowError::TooLong)) {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn binary_tuples() {
        let mut data = BINARY_HEADER.to_vec();
        for (key, note) in [(7i64, "x"), (9, "yy")] {
            data.extend_from_slice(&2i16.to_be_bytes());
            data.extend_from_slice(&8i32.to_be_bytes());
            data.extend_from_slice(&key.to_be_bytes());
            data.extend_from_slice(&(note.len() as i32).to_be_bytes());
            data.extend_from_slice(note.as_bytes());
        }
        data.extend_from_slice(BINARY_TRAILER);
        let (first, second) = data.split_at(25);
        let got = rows("COPY t FROM STDIN (FORMAT binary)", 0, &[first, second]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, 2);
        assert_eq!(
            got[1].1,
            KeyValue::Binary(Bytes::copy_from_slice(&9i64.to_be_bytes()))
        );
    }
}
