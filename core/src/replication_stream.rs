//! The frames of a walsender's logical replication stream (the COPY data
//! after `START_REPLICATION … LOGICAL`), and the standby status update a
//! reader answers with. The payload of each WAL data frame is one message
//! of the output plugin ([`crate::pgoutput`]).
//!
//! A split's job reads its slot over such a stream during the cutover: the
//! walsender decodes as the WAL is written, with its caches warm, where a
//! `pg_logical_slot_peek_binary_changes` call starts a decoding of its own
//! each time.

use crate::pgoutput::{DecodeError, Lsn};

/// One frame of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An output plugin message, decoded from the WAL at `start`.
    WalData { start: Lsn, data: &'a [u8] },
    /// The walsender's end of WAL; `reply` asks for a status update at once.
    Keepalive { wal_end: Lsn, reply: bool },
}

/// Decodes one frame (the contents of one CopyData message).
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let field = |at: usize, what: &'static str| -> Result<u64, DecodeError> {
        let mut buffer = [0u8; 8];
        buffer.copy_from_slice(bytes.get(at..at + 8).ok_or(DecodeError::Truncated(what))?);
        Ok(u64::from_be_bytes(buffer))
    };
    match bytes.first() {
        Some(b'w') => {
            let start = Lsn(field(1, "WAL data start")?);
            let _wal_end = field(9, "WAL end")?;
            let _sent_at = field(17, "send time")?;
            Ok(Frame::WalData {
                start,
                data: &bytes[25..],
            })
        }
        Some(b'k') => {
            let wal_end = Lsn(field(1, "WAL end")?);
            let _sent_at = field(9, "send time")?;
            let reply = *bytes.get(17).ok_or(DecodeError::Truncated("reply flag"))?;
            Ok(Frame::Keepalive {
                wal_end,
                reply: reply != 0,
            })
        }
        Some(other) => Err(DecodeError::Unexpected {
            expected: "'w' or 'k' (stream frame)",
            found: *other,
        }),
        None => Err(DecodeError::Truncated("stream frame")),
    }
}

/// A standby status update: everything up to `position` written, flushed
/// and applied (the slot may advance to it); `now` in microseconds since
/// 2000-01-01, PostgreSQL's epoch.
pub fn status_update(position: Lsn, now: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(34);
    out.push(b'r');
    for _ in 0..3 {
        out.extend(position.0.to_be_bytes());
    }
    out.extend(now.to_be_bytes());
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_data_and_keepalive() {
        let mut data = vec![b'w'];
        data.extend(0x10u64.to_be_bytes());
        data.extend(0x20u64.to_be_bytes());
        data.extend(7u64.to_be_bytes());
        data.extend(b"B...");
        assert_eq!(
            decode_frame(&data),
            Ok(Frame::WalData {
                start: Lsn(0x10),
                data: b"B..."
            })
        );
        let mut keepalive = vec![b'k'];
        keepalive.extend(0x20u64.to_be_bytes());
        keepalive.extend(7u64.to_be_bytes());
        keepalive.push(1);
        assert_eq!(
            decode_frame(&keepalive),
            Ok(Frame::Keepalive {
                wal_end: Lsn(0x20),
                reply: true
            })
        );
    }

    #[test]
    fn malformed_frames_are_errors() {
        assert_eq!(
            decode_frame(&[]),
            Err(DecodeError::Truncated("stream frame"))
        );
        assert_eq!(
            decode_frame(b"w\0\0"),
            Err(DecodeError::Truncated("WAL data start"))
        );
        let mut keepalive = vec![b'k'];
        keepalive.extend([0u8; 16]);
        assert_eq!(
            decode_frame(&keepalive),
            Err(DecodeError::Truncated("reply flag"))
        );
        assert!(matches!(
            decode_frame(b"x"),
            Err(DecodeError::Unexpected { found: b'x', .. })
        ));
    }

    #[test]
    fn status_update_layout() {
        let update = status_update(Lsn(0x0102), 5);
        assert_eq!(update.len(), 34);
        assert_eq!(update[0], b'r');
        assert_eq!(&update[1..9], &0x0102u64.to_be_bytes());
        assert_eq!(&update[17..25], &0x0102u64.to_be_bytes());
        assert_eq!(&update[25..33], &5i64.to_be_bytes());
        assert_eq!(update[33], 0);
    }
}
