//! Keyspace ids: the 64-bit position of a distribution key in the keyspace.
//!
//! keyspace_id(key) = big-endian u64 of BLAKE2b with an 8-byte digest (the
//! digest size is a BLAKE2b parameter, so this is *not* a truncated 64-byte
//! digest) over the key's canonical encoding:
//!
//! * integers of any width: 8-byte big-endian two's complement, so `42::int2`,
//!   `42::int4` and `42::int8` land on the same keyspace id;
//! * text and varchar: their UTF-8 bytes;
//! * uuid: its 16 bytes;
//! * bytea: as is.

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};
use std::fmt;

type Blake2b64 = Blake2b<U8>;

/// A position in the 64-bit keyspace, compared as an unsigned integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyspaceId(pub u64);

impl KeyspaceId {
    pub const MIN: KeyspaceId = KeyspaceId(0);
    pub const MAX: KeyspaceId = KeyspaceId(u64::MAX);

    /// The order-preserving mapping onto a signed 64-bit integer used in SQL
    /// (`bigint`): flip the top bit. Unsigned 0 becomes `i64::MIN`, unsigned
    /// `u64::MAX` becomes `i64::MAX`, and SQL comparisons of the mapped values
    /// agree with the unsigned order of the keyspace ids.
    #[inline]
    pub const fn to_sql(self) -> i64 {
        (self.0 ^ (1 << 63)) as i64
    }

    /// The inverse of [`KeyspaceId::to_sql`].
    #[inline]
    pub const fn from_sql(value: i64) -> KeyspaceId {
        KeyspaceId((value as u64) ^ (1 << 63))
    }
}

impl fmt::Display for KeyspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The keyspace id of an already canonically encoded key.
#[inline]
pub fn keyspace_id(encoded_key: &[u8]) -> KeyspaceId {
    let digest = Blake2b64::digest(encoded_key);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest);
    KeyspaceId(u64::from_be_bytes(bytes))
}

/// The canonical encodings of the supported distribution key types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyEncoding {
    /// smallint, integer, bigint: 8-byte big-endian two's complement.
    Integer,
    /// text, varchar: UTF-8 bytes.
    Text,
    /// uuid: its 16 bytes.
    Uuid,
    /// bytea: as is.
    Bytes,
}

impl KeyEncoding {
    /// Names of the supported key types, for error messages.
    pub const SUPPORTED_TYPES: &'static str =
        "smallint, integer, bigint, text, character varying, uuid, bytea";

    /// The encoding for a PostgreSQL type name (as `format_type` spells it),
    /// or `None` when the type has no canonical encoding.
    pub fn for_type_name(name: &str) -> Option<KeyEncoding> {
        match name {
            "smallint" | "integer" | "bigint" | "int2" | "int4" | "int8" => {
                Some(KeyEncoding::Integer)
            }
            "text" | "character varying" | "varchar" => Some(KeyEncoding::Text),
            "uuid" => Some(KeyEncoding::Uuid),
            "bytea" => Some(KeyEncoding::Bytes),
            _ => None,
        }
    }

    /// The encoding's name as the catalog stores it.
    pub fn name(self) -> &'static str {
        match self {
            KeyEncoding::Integer => "integer",
            KeyEncoding::Text => "text",
            KeyEncoding::Uuid => "uuid",
            KeyEncoding::Bytes => "bytes",
        }
    }

    /// The inverse of [`KeyEncoding::name`].
    pub fn from_name(name: &str) -> Option<KeyEncoding> {
        [
            KeyEncoding::Integer,
            KeyEncoding::Text,
            KeyEncoding::Uuid,
            KeyEncoding::Bytes,
        ]
        .into_iter()
        .find(|encoding| encoding.name() == name)
    }
}

impl KeyEncoding {
    /// Keyspace id of a key given in PostgreSQL's text output form (a text
    /// parameter, a literal, a value decoded from WAL); None when the text is
    /// not a valid key of this encoding.
    pub fn keyspace_id_of_text_form(self, text: &str) -> Option<KeyspaceId> {
        match self {
            KeyEncoding::Integer => text.trim().parse::<i64>().ok().map(keyspace_id_of_int),
            KeyEncoding::Text => Some(keyspace_id_of_text(text)),
            KeyEncoding::Uuid => parse_uuid(text).map(|u| keyspace_id(&u)),
            KeyEncoding::Bytes => {
                let hex = text.strip_prefix("\\x")?;
                decode_hex(hex).map(|b| keyspace_id(&b))
            }
        }
    }
}

/// PostgreSQL's uuid input: hex digits, optional braces, optional hyphen
/// after any group of four digits.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = text.trim();
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(text);
    let digits: String = inner.chars().filter(|c| *c != '-').collect();
    if digits.len() != 32 || inner.starts_with('-') || inner.ends_with('-') || inner.contains("--")
    {
        return None;
    }
    decode_hex(&digits)?.try_into().ok()
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Keyspace id of an integer key of any width.
#[inline]
pub fn keyspace_id_of_int(value: i64) -> KeyspaceId {
    keyspace_id(&value.to_be_bytes())
}

/// Keyspace id of a text key.
#[inline]
pub fn keyspace_id_of_text(value: &str) -> KeyspaceId {
    keyspace_id(value.as_bytes())
}

/// Keyspace id of a uuid key given as its 16 bytes.
#[inline]
pub fn keyspace_id_of_uuid(value: &[u8; 16]) -> KeyspaceId {
    keyspace_id(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_of_keys() {
        let uuid = KeyEncoding::Uuid;
        let a = uuid.keyspace_id_of_text_form("123e4567-e89b-12d3-a456-426614174000");
        assert!(a.is_some());
        assert_eq!(
            uuid.keyspace_id_of_text_form("{123e4567e89b12d3a456426614174000}"),
            a
        );
        assert_eq!(
            uuid.keyspace_id_of_text_form("123e4567-e89b-12d3-a456-42661417400"),
            None
        );
        let bytes = KeyEncoding::Bytes;
        assert_eq!(
            bytes.keyspace_id_of_text_form("\\x0aff"),
            Some(keyspace_id(&[10, 255]))
        );
        assert_eq!(bytes.keyspace_id_of_text_form("\\x0g"), None);
        assert_eq!(bytes.keyspace_id_of_text_form("0aff"), None);
        assert_eq!(
            KeyEncoding::Integer.keyspace_id_of_text_form(" -42"),
            Some(keyspace_id_of_int(-42))
        );
        assert_eq!(KeyEncoding::Integer.keyspace_id_of_text_form("4.2"), None);
        assert_eq!(
            KeyEncoding::Text.keyspace_id_of_text_form("héllo"),
            Some(keyspace_id_of_text("héllo"))
        );
    }

    // The vectors from the design; any change here moves every row.
    #[test]
    fn integer_vectors() {
        assert_eq!(keyspace_id_of_int(0).0, 14558143475431885848);
        assert_eq!(keyspace_id_of_int(1).0, 5879945593395075768);
        assert_eq!(keyspace_id_of_int(42).0, 1444456722576112953);
        assert_eq!(keyspace_id_of_int(-1).0, 15957657753097145901);
    }

    #[test]
    fn integer_widths_agree() {
        assert_eq!(
            keyspace_id_of_int(42i16 as i64),
            keyspace_id_of_int(42i32 as i64)
        );
        assert_eq!(keyspace_id_of_int(-7i32 as i64), keyspace_id_of_int(-7));
    }

    #[test]
    fn text_vectors() {
        assert_eq!(keyspace_id_of_text("acme").0, 3469556990258029185);
        assert_eq!(keyspace_id_of_text("").0, 16476032584258269876);
    }

    #[test]
    fn uuid_vector() {
        let uuid = [
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0x00,
        ];
        assert_eq!(keyspace_id_of_uuid(&uuid).0, 14702618867036252765);
    }

    #[test]
    fn sql_mapping_preserves_order_and_round_trips() {
        let samples = [
            0u64,
            1,
            42,
            (1 << 63) - 1,
            1 << 63,
            (1 << 63) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for pair in samples.windows(2) {
            let (a, b) = (KeyspaceId(pair[0]), KeyspaceId(pair[1]));
            assert!(a.to_sql() < b.to_sql(), "{a} vs {b}");
            assert_eq!(KeyspaceId::from_sql(a.to_sql()), a);
        }
        assert_eq!(KeyspaceId::MIN.to_sql(), i64::MIN);
        assert_eq!(KeyspaceId::MAX.to_sql(), i64::MAX);
    }

    #[test]
    fn type_names() {
        assert_eq!(
            KeyEncoding::for_type_name("integer"),
            Some(KeyEncoding::Integer)
        );
        assert_eq!(
            KeyEncoding::for_type_name("character varying"),
            Some(KeyEncoding::Text)
        );
        assert_eq!(KeyEncoding::for_type_name("numeric"), None);
    }
}
