//! Key values to keyspace ids: constants and parameters (text or binary)
//! read as the key column's type would read them, or not at all.

use super::*;

/// The key values of the rows an INSERT writes, if every row's key is
/// fixed and no column the metadata node would fill in is left out.
pub(super) fn insert_keys<'a>(
    insert: &'a InsertShape,
    table: &crate::backend::cluster::Table,
    key_column: &str,
) -> Option<Vec<&'a Value>> {
    let columns: Vec<&str> = match &insert.columns {
        Some(columns) => columns.iter().map(String::as_str).collect(),
        None => table.columns.iter().map(String::as_str).collect(),
    };
    if table
        .filled_columns
        .iter()
        .any(|c| !columns.contains(&c.as_str()))
    {
        return None;
    }
    let position = columns.iter().position(|c| *c == key_column)?;
    insert
        .rows
        .iter()
        .map(|row| {
            // A short row leaves its last columns to their defaults.
            if row.len() > columns.len()
                || columns[row.len()..]
                    .iter()
                    .any(|c| table.filled_columns.contains(*c))
            {
                return None;
            }
            row.get(position)?.as_ref()
        })
        .collect()
}

/// The keyspace id of a value as a key of `encoding`; None when it cannot
/// be known exactly (the statement then goes to the metadata node).
pub(super) fn key_id(
    value: &Value,
    encoding: KeyEncoding,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<KeyspaceId> {
    match value {
        Value::Integer(i) => (encoding == KeyEncoding::Integer).then(|| keyspace_id_of_int(*i)),
        Value::Text(text) => text_key(text, encoding),
        Value::Param { index, cast } => {
            if cast.is_some_and(|c| c != encoding) {
                return None;
            }
            if *index >= normalized.first_literal {
                // A literal of the original text, by its text. A number is
                // a key only of an integer key, uncast or cast to an
                // integer type (a numeric literal cast to text is the
                // number's canonical text, not what was written).
                let literal = normalized.literals.get(index - normalized.first_literal)?;
                if literal.numeric && encoding != KeyEncoding::Integer {
                    return None;
                }
                return text_key(&literal.text, encoding);
            }
            let parameters = parameters?;
            let bytes = parameters.values.get(*index)?.as_ref()?;
            if (parameters.formats)(*index) == 0 {
                text_key(std::str::from_utf8(bytes).ok()?, encoding)
            } else {
                let declared = parameters.declared_types.get(*index).copied().unwrap_or(0);
                if declared == 0 && cast.is_none() {
                    // Inferred from the key column, so it has the key's type.
                } else if declared != 0 && !declared_type_matches(declared, encoding) {
                    return None;
                }
                binary_key(bytes, encoding)
            }
        }
    }
}

/// A key value as the statement gave it, for the hot keys (None when it is
/// not known exactly: the statement is then not counted).
pub(super) fn key_value(
    value: &Value,
    encoding: KeyEncoding,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<KeyValue> {
    match value {
        Value::Integer(i) => Some(KeyValue::Integer(*i)),
        Value::Text(text) => Some(KeyValue::Text(text.clone())),
        Value::Param { index, .. } => {
            let text_value = |text: &str| match encoding {
                // (The integer the key is, however it was written.)
                KeyEncoding::Integer => text.trim().parse().ok().map(KeyValue::Integer),
                _ => Some(KeyValue::Text(text.to_owned())),
            };
            if *index >= normalized.first_literal {
                let literal = normalized.literals.get(index - normalized.first_literal)?;
                return text_value(&literal.text);
            }
            let parameters = parameters?;
            let bytes = parameters.values.get(*index)?.as_ref()?;
            if (parameters.formats)(*index) == 0 {
                return text_value(std::str::from_utf8(bytes).ok()?);
            }
            match encoding {
                KeyEncoding::Integer => binary_integer(bytes).map(KeyValue::Integer),
                KeyEncoding::Text => std::str::from_utf8(bytes)
                    .ok()
                    .map(|t| KeyValue::Text(t.to_owned())),
                KeyEncoding::Uuid => <[u8; 16]>::try_from(&bytes[..]).ok().map(KeyValue::Uuid),
                KeyEncoding::Bytes => Some(KeyValue::Bytes(bytes.to_vec())),
            }
        }
    }
}

/// The keyspace id a value of a self-routing id column routes by: the
/// first of the prefix the id carries; None when the value is not a
/// non-negative integer known exactly.
pub(super) fn routing_id_key(
    value: &Value,
    normalized: &Normalized,
    parameters: Option<&Parameters<'_>>,
) -> Option<KeyspaceId> {
    let id = match value {
        Value::Integer(i) => *i,
        Value::Text(_) => return None,
        Value::Param { index, cast } => {
            if cast.is_some_and(|c| c != KeyEncoding::Integer) {
                return None;
            }
            if *index >= normalized.first_literal {
                let literal = normalized.literals.get(index - normalized.first_literal)?;
                literal.text.trim().parse().ok()?
            } else {
                let parameters = parameters?;
                let bytes = parameters.values.get(*index)?.as_ref()?;
                if (parameters.formats)(*index) == 0 {
                    std::str::from_utf8(bytes).ok()?.trim().parse().ok()?
                } else {
                    let declared = parameters.declared_types.get(*index).copied().unwrap_or(0);
                    if declared != 0 && !declared_type_matches(declared, KeyEncoding::Integer) {
                        return None;
                    }
                    binary_integer(bytes)?
                }
            }
        }
    };
    pg_shard_core::routing_id::routing_keyspace_id(id)
}

fn binary_integer(bytes: &[u8]) -> Option<i64> {
    Some(match bytes.len() {
        2 => i16::from_be_bytes(bytes.try_into().ok()?) as i64,
        4 => i32::from_be_bytes(bytes.try_into().ok()?) as i64,
        8 => i64::from_be_bytes(bytes.try_into().ok()?),
        _ => return None,
    })
}

/// Type oids whose binary form the key encoding reads.
fn declared_type_matches(oid: u32, encoding: KeyEncoding) -> bool {
    match encoding {
        KeyEncoding::Integer => matches!(oid, 20 | 21 | 23),
        KeyEncoding::Text => matches!(oid, 25 | 1043),
        KeyEncoding::Uuid => oid == 2950,
        KeyEncoding::Bytes => oid == 17,
    }
}

fn text_key(text: &str, encoding: KeyEncoding) -> Option<KeyspaceId> {
    encoding.keyspace_id_of_text_form(text)
}

pub(super) fn binary_key(bytes: &[u8], encoding: KeyEncoding) -> Option<KeyspaceId> {
    match encoding {
        KeyEncoding::Integer => Some(keyspace_id_of_int(binary_integer(bytes)?)),
        KeyEncoding::Text => std::str::from_utf8(bytes).ok().map(keyspace_id_of_text),
        KeyEncoding::Uuid => (bytes.len() == 16).then(|| keyspace_id(bytes)),
        KeyEncoding::Bytes => Some(keyspace_id(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::lexer::normalize;
    use bytes::Bytes;

    fn parameter(index: usize, cast: Option<KeyEncoding>) -> Value {
        Value::Param { index, cast }
    }

    #[test]
    fn literals_are_keys_only_of_their_own_kind() {
        let normalized = normalize("SELECT * FROM t WHERE k = 42 AND name = 'bob'");
        let number = parameter(normalized.first_literal, None);
        let text = parameter(normalized.first_literal + 1, None);
        assert_eq!(
            key_id(&number, KeyEncoding::Integer, &normalized, None),
            Some(keyspace_id_of_int(42))
        );
        assert_eq!(
            key_id(&number, KeyEncoding::Text, &normalized, None),
            None,
            "a number is not a text key: its text may not be what was written"
        );
        assert_eq!(
            key_id(&text, KeyEncoding::Text, &normalized, None),
            Some(keyspace_id_of_text("bob"))
        );
        assert_eq!(
            key_id(&Value::Integer(7), KeyEncoding::Text, &normalized, None),
            None
        );
    }

    #[test]
    fn bound_parameters_in_text_and_binary() {
        let normalized = normalize("SELECT * FROM t WHERE k = $1");
        let values = [
            Some(Bytes::from_static(b"42")),
            Some(Bytes::copy_from_slice(&42i32.to_be_bytes())),
            Some(Bytes::copy_from_slice(&42i64.to_be_bytes())),
            None,
        ];
        let formats = |index: usize| if index == 0 { 0 } else { 1 };
        let declared = [0, 23, 20, 0];
        let parameters = Parameters {
            values: &values,
            formats: &formats,
            declared_types: &declared,
        };
        let expected = Some(keyspace_id_of_int(42));
        for index in 0..3 {
            assert_eq!(
                key_id(
                    &parameter(index, None),
                    KeyEncoding::Integer,
                    &normalized,
                    Some(&parameters)
                ),
                expected,
                "parameter {index}"
            );
        }
        assert_eq!(
            key_id(
                &parameter(3, None),
                KeyEncoding::Integer,
                &normalized,
                Some(&parameters)
            ),
            None,
            "a NULL has no shard"
        );
        assert_eq!(
            key_id(
                &parameter(1, None),
                KeyEncoding::Text,
                &normalized,
                Some(&parameters)
            ),
            None,
            "an int4 sent for a text key is not read as text"
        );
        assert_eq!(
            key_id(
                &parameter(0, Some(KeyEncoding::Text)),
                KeyEncoding::Integer,
                &normalized,
                Some(&parameters)
            ),
            None,
            "a cast to another type changes the value"
        );
    }

    #[test]
    fn binary_forms_by_length_and_type() {
        assert_eq!(
            binary_key(&7i16.to_be_bytes(), KeyEncoding::Integer),
            Some(keyspace_id_of_int(7))
        );
        assert_eq!(binary_key(&[1, 2, 3], KeyEncoding::Integer), None);
        assert_eq!(binary_key(&[0; 15], KeyEncoding::Uuid), None);
        assert!(binary_key(&[0; 16], KeyEncoding::Uuid).is_some());
        assert_eq!(binary_key(&[0xff, 0xfe], KeyEncoding::Text), None);
        assert!(declared_type_matches(1043, KeyEncoding::Text));
        assert!(!declared_type_matches(25, KeyEncoding::Integer));
    }
}
