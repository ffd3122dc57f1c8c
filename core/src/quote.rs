//! Quoting for the SQL pg_shard generates, in the extension and in the
//! coordinator. Every identifier and literal that reaches a generated
//! statement goes through these.

/// `"name"` with embedded quotes doubled, as quote_ident would (always quoted,
/// which is never wrong).
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `schema.name`, both quoted.
pub fn qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", ident(schema), ident(name))
}

/// A string literal, `E'…'` when it holds a backslash, as quote_literal would.
pub fn literal(value: &str) -> String {
    let escaped = value.replace('\'', "''");
    if value.contains('\\') {
        format!("E'{}'", escaped.replace('\\', "\\\\"))
    } else {
        format!("'{escaped}'")
    }
}

/// Longest prefix of `base` that leaves room for `suffix` within
/// PostgreSQL's 63-byte identifier limit, cut on a character boundary.
pub fn name_with_suffix(base: &str, suffix: &str) -> String {
    const MAX_IDENTIFIER_BYTES: usize = 63;
    let room = MAX_IDENTIFIER_BYTES.saturating_sub(suffix.len());
    let mut end = base.len().min(room);
    while !base.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{}", &base[..end], suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers_and_literals() {
        assert_eq!(ident("Order Items"), "\"Order Items\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(
            qualified("Sales Data", "select"),
            "\"Sales Data\".\"select\""
        );
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal("a\\b'"), "E'a\\\\b'''");
    }

    #[test]
    fn names_fit_identifier_limit() {
        let long = "é".repeat(40);
        let name = name_with_suffix(&long, "_102008");
        assert!(name.len() <= 63);
        assert!(name.ends_with("_102008"));
        assert_eq!(name_with_suffix("orders", "_1"), "orders_1");
    }
}
