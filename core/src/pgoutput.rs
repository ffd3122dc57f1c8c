//! A reader for the messages of PostgreSQL's `pgoutput` logical decoding
//! plugin (protocol version 1), as `pg_logical_slot_peek_binary_changes`
//! returns them: one message per row.
//!
//! A shard split applies the changes of the shard being split to its two
//! halves on the same node. PostgreSQL's subscriptions cannot do that (they
//! apply a change to the table of the same name, which on the same node is
//! the source itself), so the split's job runner reads the slot itself.
//! Only what a split needs is decoded: transaction boundaries, relations and
//! row changes in text form; other messages are skipped.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("pgoutput message ends early (reading {0})")]
    Truncated(&'static str),
    #[error("pgoutput message has an unexpected byte {found:?} where {expected} was expected")]
    Unexpected { expected: &'static str, found: u8 },
    #[error("pgoutput message holds a string that is not UTF-8")]
    NotUtf8,
}

/// A WAL position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// PostgreSQL's `pg_lsn` text form, e.g. `0/16B3748`.
    pub fn parse(text: &str) -> Option<Lsn> {
        let (high, low) = text.trim().split_once('/')?;
        let high = u64::from_str_radix(high, 16).ok()?;
        let low = u64::from_str_radix(low, 16).ok()?;
        if high > u32::MAX as u64 || low > u32::MAX as u64 {
            return None;
        }
        Some(Lsn((high << 32) | low))
    }
}

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// A column value of a row image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the UPDATE did not change (not sent).
    Unchanged,
    /// The value's text output.
    Text(String),
}

/// The columns pgoutput sends for a relation (not dropped, not generated),
/// in attribute order; row images list values in the same order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub relid: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// `final_lsn`: where the transaction's commit record is.
    Begin {
        final_lsn: Lsn,
        xid: u32,
    },
    /// `end_lsn`: just past the commit record (a slot advanced to it has
    /// consumed the transaction).
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
    },
    Relation(Relation),
    Insert {
        relid: u32,
        new: Vec<Value>,
    },
    /// `old`: the old key (or whole old row under REPLICA IDENTITY FULL),
    /// sent only when the key changed or the identity is FULL.
    Update {
        relid: u32,
        old: Option<Vec<Value>>,
        new: Vec<Value>,
    },
    Delete {
        relid: u32,
        old: Vec<Value>,
    },
    Truncate {
        relids: Vec<u32>,
    },
    /// A message of `pg_logical_emit_message` (sent when the slot is read
    /// with `messages 'true'`): a split's reader emits one to know it has
    /// read everything written before it.
    Logical {
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: Vec<u8>,
    },
    /// Origin and type messages: nothing a split applies.
    Other(u8),
}

/// Decodes one message.
pub fn decode(data: &[u8]) -> Result<Message, DecodeError> {
    let mut reader = Reader { data, at: 0 };
    let kind = reader.u8("message type")?;
    let message = match kind {
        b'B' => {
            let final_lsn = Lsn(reader.u64("final lsn")?);
            let _commit_time = reader.u64("commit time")?;
            let xid = reader.u32("xid")?;
            Message::Begin { final_lsn, xid }
        }
        b'C' => {
            let _flags = reader.u8("commit flags")?;
            let commit_lsn = Lsn(reader.u64("commit lsn")?);
            let end_lsn = Lsn(reader.u64("end lsn")?);
            Message::Commit {
                commit_lsn,
                end_lsn,
            }
        }
        b'R' => {
            let relid = reader.u32("relation id")?;
            let namespace = reader.string("namespace")?;
            let name = reader.string("relation name")?;
            let _replica_identity = reader.u8("replica identity")?;
            let count = reader.u16("column count")?;
            let mut columns = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let _flags = reader.u8("column flags")?;
                columns.push(reader.string("column name")?);
                let _type_oid = reader.u32("column type")?;
                let _type_modifier = reader.u32("column type modifier")?;
            }
            Message::Relation(Relation {
                relid,
                namespace,
                name,
                columns,
            })
        }
        b'I' => {
            let relid = reader.u32("relation id")?;
            reader.expect(b'N', "'N' (new tuple)")?;
            Message::Insert {
                relid,
                new: reader.tuple()?,
            }
        }
        b'U' => {
            let relid = reader.u32("relation id")?;
            let mut old = None;
            let mut marker = reader.u8("tuple marker")?;
            if marker == b'K' || marker == b'O' {
                old = Some(reader.tuple()?);
                marker = reader.u8("tuple marker")?;
            }
            if marker != b'N' {
                return Err(DecodeError::Unexpected {
                    expected: "'N' (new tuple)",
                    found: marker,
                });
            }
            Message::Update {
                relid,
                old,
                new: reader.tuple()?,
            }
        }
        b'D' => {
            let relid = reader.u32("relation id")?;
            let marker = reader.u8("tuple marker")?;
            if marker != b'K' && marker != b'O' {
                return Err(DecodeError::Unexpected {
                    expected: "'K' or 'O' (old tuple)",
                    found: marker,
                });
            }
            Message::Delete {
                relid,
                old: reader.tuple()?,
            }
        }
        b'T' => {
            let count = reader.u32("relation count")?;
            let _options = reader.u8("truncate options")?;
            let mut relids = Vec::new();
            for _ in 0..count {
                relids.push(reader.u32("relation id")?);
            }
            Message::Truncate { relids }
        }
        b'M' => {
            // (A transaction id comes first only when transactions are
            // streamed in progress, which the split's reads never ask.)
            let flags = reader.u8("message flags")?;
            let lsn = Lsn(reader.u64("message lsn")?);
            let prefix = reader.string("message prefix")?;
            let length = reader.u32("message length")? as usize;
            Message::Logical {
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: reader.bytes(length, "message content")?.to_vec(),
            }
        }
        other => Message::Other(other),
    };
    Ok(message)
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, count: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.data.len())
            .ok_or(DecodeError::Truncated(what))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.bytes(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let bytes = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let mut buffer = [0u8; 4];
        buffer.copy_from_slice(self.bytes(4, what)?);
        Ok(u32::from_be_bytes(buffer))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut buffer = [0u8; 8];
        buffer.copy_from_slice(self.bytes(8, what)?);
        Ok(u64::from_be_bytes(buffer))
    }

    fn expect(&mut self, byte: u8, expected: &'static str) -> Result<(), DecodeError> {
        let found = self.u8(expected)?;
        if found != byte {
            return Err(DecodeError::Unexpected { expected, found });
        }
        Ok(())
    }

    /// A NUL-terminated string.
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let rest = &self.data[self.at.min(self.data.len())..];
        let length = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or(DecodeError::Truncated(what))?;
        let text = std::str::from_utf8(&rest[..length]).map_err(|_| DecodeError::NotUtf8)?;
        self.at += length + 1;
        Ok(text.to_owned())
    }

    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let count = self.u16("tuple column count")?;
        let mut values = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let value = match self.u8("column kind")? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let length = self.u32("value length")? as usize;
                    let bytes = self.bytes(length, "value")?;
                    Value::Text(
                        std::str::from_utf8(bytes)
                            .map_err(|_| DecodeError::NotUtf8)?
                            .to_owned(),
                    )
                }
                found => {
                    return Err(DecodeError::Unexpected {
                        expected: "'n', 'u' or 't' (column kind)",
                        found,
                    })
                }
            };
            values.push(value);
        }
        Ok(values)
    }
}

/// Transactions a snapshot sees (PostgreSQL's `pg_snapshot` text form
/// `xmin:xmax:xip,…`), compared as 32-bit transaction ids, as the slot
/// reports them.
pub struct SnapshotVisibility {
    xmin: u32,
    xmax: u32,
    in_progress: Vec<u32>,
}

impl SnapshotVisibility {
    pub fn parse(text: &str) -> Option<SnapshotVisibility> {
        let mut parts = text.split(':');
        let xid = |s: &str| s.parse::<u64>().ok().map(|x| x as u32);
        let xmin = xid(parts.next()?)?;
        let xmax = xid(parts.next()?)?;
        let in_progress = match parts.next() {
            Some("") | None => Vec::new(),
            Some(list) => list.split(',').map(xid).collect::<Option<Vec<_>>>()?,
        };
        Some(SnapshotVisibility {
            xmin,
            xmax,
            in_progress,
        })
    }

    /// Whether the transaction `xid` committed before the snapshot.
    pub fn sees(&self, xid: u32) -> bool {
        // Modulo-2^32 order, as PostgreSQL's TransactionIdPrecedes.
        let precedes = |a: u32, b: u32| (a.wrapping_sub(b) as i32) < 0;
        precedes(xid, self.xmin) || (precedes(xid, self.xmax) && !self.in_progress.contains(&xid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_visibility() {
        let s = SnapshotVisibility::parse("100:105:100,102").unwrap();
        assert!(s.sees(99));
        assert!(!s.sees(100));
        assert!(s.sees(101));
        assert!(!s.sees(102));
        assert!(s.sees(104));
        assert!(!s.sees(105));
        assert!(!s.sees(200));
        assert!(SnapshotVisibility::parse("5:5:").is_some());
        assert!(SnapshotVisibility::parse("junk").is_none());
        // across the 2^32 wrap of 32-bit ids
        let wrapped = SnapshotVisibility::parse("4294967290:4294967300:").unwrap();
        assert!(wrapped.sees(4294967289));
        assert!(wrapped.sees(4294967295));
        assert!(wrapped.sees(3));
        assert!(!wrapped.sees(4));
    }

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut out = (values.len() as u16).to_be_bytes().to_vec();
        for value in values {
            match value {
                None => out.push(b'n'),
                Some("<unchanged>") => out.push(b'u'),
                Some(text) => {
                    out.push(b't');
                    out.extend((text.len() as u32).to_be_bytes());
                    out.extend(text.as_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn lsn_text_form_round_trips() {
        let lsn = Lsn::parse("1A/16B3748").unwrap();
        assert_eq!(lsn.0, (0x1A << 32) | 0x16B3748);
        assert_eq!(lsn.to_string(), "1A/16B3748");
        assert_eq!(Lsn::parse("0/0"), Some(Lsn(0)));
        assert_eq!(Lsn::parse("junk"), None);
        assert_eq!(Lsn::parse("1/100000000"), None);
    }

    #[test]
    fn begin_and_commit() {
        let mut begin = vec![b'B'];
        begin.extend(0x0000_0001_0000_0010u64.to_be_bytes());
        begin.extend(7u64.to_be_bytes());
        begin.extend(734u32.to_be_bytes());
        assert_eq!(
            decode(&begin),
            Ok(Message::Begin {
                final_lsn: Lsn(0x0000_0001_0000_0010),
                xid: 734
            })
        );
        let mut commit = vec![b'C', 0];
        commit.extend(16u64.to_be_bytes());
        commit.extend(40u64.to_be_bytes());
        commit.extend(7u64.to_be_bytes());
        assert_eq!(
            decode(&commit),
            Ok(Message::Commit {
                commit_lsn: Lsn(16),
                end_lsn: Lsn(40)
            })
        );
    }

    #[test]
    fn relation_lists_column_names() {
        let mut message = vec![b'R'];
        message.extend(16384u32.to_be_bytes());
        message.extend(b"public\0orders_102\0d");
        message.extend(2u16.to_be_bytes());
        for (flags, name, oid) in [(1u8, "id", 20u32), (0, "note", 25)] {
            message.push(flags);
            message.extend(name.as_bytes());
            message.push(0);
            message.extend(oid.to_be_bytes());
            message.extend((-1i32).to_be_bytes());
        }
        assert_eq!(
            decode(&message),
            Ok(Message::Relation(Relation {
                relid: 16384,
                namespace: "public".into(),
                name: "orders_102".into(),
                columns: vec!["id".into(), "note".into()],
            }))
        );
    }

    #[test]
    fn row_changes() {
        let mut insert = vec![b'I'];
        insert.extend(5u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(tuple(&[Some("1"), None]));
        assert_eq!(
            decode(&insert),
            Ok(Message::Insert {
                relid: 5,
                new: vec![Value::Text("1".into()), Value::Null]
            })
        );

        let mut update = vec![b'U'];
        update.extend(5u32.to_be_bytes());
        update.push(b'K');
        update.extend(tuple(&[Some("1"), None]));
        update.push(b'N');
        update.extend(tuple(&[Some("2"), Some("<unchanged>")]));
        assert_eq!(
            decode(&update),
            Ok(Message::Update {
                relid: 5,
                old: Some(vec![Value::Text("1".into()), Value::Null]),
                new: vec![Value::Text("2".into()), Value::Unchanged],
            })
        );

        let mut same_key = vec![b'U'];
        same_key.extend(5u32.to_be_bytes());
        same_key.push(b'N');
        same_key.extend(tuple(&[Some("2"), Some("héllo")]));
        assert!(matches!(
            decode(&same_key),
            Ok(Message::Update { old: None, .. })
        ));

        let mut delete = vec![b'D'];
        delete.extend(5u32.to_be_bytes());
        delete.push(b'K');
        delete.extend(tuple(&[Some("2"), None]));
        assert!(matches!(
            decode(&delete),
            Ok(Message::Delete { relid: 5, .. })
        ));

        let mut truncate = vec![b'T'];
        truncate.extend(2u32.to_be_bytes());
        truncate.push(0);
        truncate.extend(5u32.to_be_bytes());
        truncate.extend(6u32.to_be_bytes());
        assert_eq!(
            decode(&truncate),
            Ok(Message::Truncate { relids: vec![5, 6] })
        );
    }

    #[test]
    fn logical_message() {
        let mut message = vec![b'M', 0];
        message.extend(0x30u64.to_be_bytes());
        message.extend(b"pg_shard\0");
        message.extend(3u32.to_be_bytes());
        message.extend(b"a\0b");
        assert_eq!(
            decode(&message),
            Ok(Message::Logical {
                transactional: false,
                lsn: Lsn(0x30),
                prefix: "pg_shard".into(),
                content: b"a\0b".to_vec(),
            })
        );
        message[1] = 1;
        message.truncate(message.len() - 1);
        assert_eq!(
            decode(&message),
            Err(DecodeError::Truncated("message content"))
        );
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        assert_eq!(decode(&[]), Err(DecodeError::Truncated("message type")));
        assert_eq!(
            decode(&[b'I', 0, 0, 0, 5, b'X']),
            Err(DecodeError::Unexpected {
                expected: "'N' (new tuple)",
                found: b'X'
            })
        );
        let mut short = vec![b'I'];
        short.extend(5u32.to_be_bytes());
        short.push(b'N');
        short.extend(1u16.to_be_bytes());
        short.push(b't');
        short.extend(100u32.to_be_bytes());
        short.extend(b"abc");
        assert_eq!(decode(&short), Err(DecodeError::Truncated("value")));
        assert_eq!(decode(b"Rxx"), Err(DecodeError::Truncated("relation id")));
        assert_eq!(decode(b"O"), Ok(Message::Other(b'O')));
        // every prefix of a valid message is an error, never a panic
        let mut update = vec![b'U'];
        update.extend(5u32.to_be_bytes());
        update.push(b'N');
        update.extend(tuple(&[Some("2"), None, Some("<unchanged>")]));
        for end in 1..update.len() {
            assert!(decode(&update[..end]).is_err(), "prefix of {end} bytes");
        }
    }
}
