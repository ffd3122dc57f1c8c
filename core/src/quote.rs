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

/// `ARRAY['…', …]::text[]`, each value a [`literal`].
pub fn text_array(values: &[String]) -> String {
    let items: Vec<String> = values.iter().map(|v| literal(v)).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

/// `base` followed by `suffix` within PostgreSQL's 63-byte identifier
/// limit. When `base` must be cut (on a character boundary), a hash of the
/// whole of it goes before the suffix: names that share their first bytes
/// (a 63-byte table and its `…_pkey` index, two long index names) stay
/// apart once cut.
pub fn name_with_suffix(base: &str, suffix: &str) -> String {
    const MAX_IDENTIFIER_BYTES: usize = 63;
    if base.len() + suffix.len() <= MAX_IDENTIFIER_BYTES {
        return format!("{base}{suffix}");
    }
    let tag = format!("_{:08x}", fnv1a(base.as_bytes()));
    let room = MAX_IDENTIFIER_BYTES.saturating_sub(suffix.len() + tag.len());
    let mut end = base.len().min(room);
    while !base.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{tag}{suffix}", &base[..end])
}

/// 32-bit FNV-1a: a stable hash (the same on every node and in every
/// version) for [`name_with_suffix`].
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// Length of the (possibly schema-qualified, possibly quoted) name at the
/// start of `text`.
pub fn qualified_name_length(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut at = 0;
    loop {
        // one identifier
        if bytes.get(at) == Some(&b'"') {
            at += 1;
            while at < bytes.len() {
                if bytes[at] == b'"' {
                    if bytes.get(at + 1) == Some(&b'"') {
                        at += 2;
                        continue;
                    }
                    at += 1;
                    break;
                }
                at += 1;
            }
        } else {
            let start = at;
            while at < bytes.len()
                && (bytes[at].is_ascii_alphanumeric()
                    || bytes[at] == b'_'
                    || bytes[at] == b'$'
                    || bytes[at] >= 0x80)
            {
                at += 1;
            }
            if at == start {
                return at;
            }
        }
        // a dot (with optional spaces around it) and the next identifier
        let mut next = at;
        while bytes.get(next).is_some_and(|b| b.is_ascii_whitespace()) {
            next += 1;
        }
        if bytes.get(next) != Some(&b'.') {
            return at;
        }
        next += 1;
        while bytes.get(next).is_some_and(|b| b.is_ascii_whitespace()) {
            next += 1;
        }
        at = next;
    }
}

/// `text` with every occurrence of each `from` outside string literals and
/// quoted identifiers replaced by its `to`.
pub fn replace_names(text: &str, replacements: &[(String, String)]) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 64);
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => i = after_literal(bytes, i),
            b'"' => {
                // A replaced name may itself start with a quoted part.
                if let Some((from, to)) = replacements
                    .iter()
                    .find(|(f, _)| text[i..].starts_with(f.as_str()))
                {
                    out.push_str(&text[copied..i]);
                    out.push_str(to);
                    i += from.len();
                    copied = i;
                    continue;
                }
                i = after_quoted_name(bytes, i);
            }
            _ => {
                let at_word_start = i == 0 || !is_identifier_byte(bytes[i - 1]);
                let found = at_word_start
                    .then(|| {
                        replacements.iter().find(|(from, _)| {
                            text[i..].starts_with(from.as_str())
                                && !bytes
                                    .get(i + from.len())
                                    .is_some_and(|b| is_identifier_byte(*b))
                        })
                    })
                    .flatten();
                match found {
                    Some((from, to)) => {
                        out.push_str(&text[copied..i]);
                        out.push_str(to);
                        i += from.len();
                        copied = i;
                    }
                    None => i += 1,
                }
            }
        }
    }
    out.push_str(&text[copied.min(text.len())..]);
    out
}

/// `text` with each parameter reference `$n` outside string literals and
/// quoted names replaced by `values[n - 1]` (a reference beyond them is
/// left as it is).
pub fn bind_parameters(text: &str, values: &[String]) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + values.iter().map(String::len).sum::<usize>());
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => i = after_literal(bytes, i),
            b'"' => i = after_quoted_name(bytes, i),
            b'$' if i == 0 || !is_identifier_byte(bytes[i - 1]) => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let end = i + 1 + digits;
                let number = text[i + 1..end].parse::<usize>().ok();
                let value = number
                    .filter(|_| !bytes.get(end).is_some_and(|b| is_identifier_byte(*b)))
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|n| values.get(n));
                if let Some(value) = value {
                    out.push_str(&text[copied..i]);
                    out.push_str(value);
                    copied = end;
                }
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[copied.min(text.len())..]);
    out
}

/// The index after the string literal that starts at `i` (`'…'`, or
/// `E'…'` with backslash escapes when an `E` comes before it).
fn after_literal(bytes: &[u8], mut i: usize) -> usize {
    let escaped = i > 0 && matches!(bytes[i - 1], b'E' | b'e');
    i += 1;
    while i < bytes.len() {
        if escaped && bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] == b'\'' {
            if bytes.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            break;
        }
        i += 1;
    }
    i + 1
}

/// The index after the quoted name that starts at `i` (`"…"`).
fn after_quoted_name(bytes: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            if bytes.get(i + 1) == Some(&b'"') {
                i += 2;
                continue;
            }
            break;
        }
        i += 1;
    }
    i + 1
}

fn is_identifier_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

#[cfg(test)]
mod tests {
    #[test]
    fn bind_parameters_replaces_references_outside_quotes_only() {
        let values: Vec<String> = (1..=10).map(|n| format!("<{n}>")).collect();
        assert_eq!(
            super::bind_parameters(
                "SELECT $1, $10, '$1', E'\\'$2', \"$3\", a$4, $11, $2x, ($2)",
                &values
            ),
            "SELECT <1>, <10>, '$1', E'\\'$2', \"$3\", a$4, $11, $2x, (<2>)"
        );
        assert_eq!(super::bind_parameters("$", &values), "$");
        assert_eq!(super::bind_parameters("x = $0", &values), "x = $0");
    }

    #[test]
    fn text_array_quotes_each_value() {
        assert_eq!(
            super::text_array(&["a".to_string(), "it's".to_string()]),
            "ARRAY['a', 'it''s']::text[]"
        );
        assert_eq!(super::text_array(&[]), "ARRAY[]::text[]");
    }

    use super::*;

    #[test]
    fn names_at_the_start_of_statement_text() {
        assert_eq!(qualified_name_length("orders ADD COLUMN x int"), 6);
        assert_eq!(qualified_name_length("public.orders ADD"), 13);
        assert_eq!(qualified_name_length("\"My \"\"T\"\" \".\"x\" RENAME"), 15);
        assert_eq!(qualified_name_length("app . invoices RENAME"), 14);
        assert_eq!(qualified_name_length("ünïcode_t DROP"), "ünïcode_t".len());
        assert_eq!(qualified_name_length("\"unterminated"), 13);
        assert_eq!(qualified_name_length(" leading"), 0);
    }

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

    #[test]
    fn cut_names_that_share_a_prefix_stay_apart() {
        let table = "a".repeat(63);
        let pkey = format!("{}_pkey", "a".repeat(58));
        let (shard, index) = (
            name_with_suffix(&table, "_100288"),
            name_with_suffix(&pkey, "_100288"),
        );
        assert_ne!(shard, index);
        assert!(shard.len() <= 63 && index.len() <= 63);
        assert!(shard.ends_with("_100288") && index.ends_with("_100288"));
        // Stable: the same name on every node.
        assert_eq!(shard, name_with_suffix(&table, "_100288"));
        assert_eq!(
            name_with_suffix(&"x".repeat(62), "_1"),
            format!(
                "{}_{:08x}_1",
                "x".repeat(52),
                fnv1a("x".repeat(62).as_bytes())
            )
        );
    }
}

#[cfg(test)]
mod replace_names_tests {
    use super::replace_names;

    #[test]
    fn names_are_replaced_outside_literals() {
        let map = vec![(
            "pg_shard_partitions.orders_1_node_2".to_string(),
            "public.orders_1".to_string(),
        )];
        assert_eq!(
            replace_names(
                "SELECT o.id FROM pg_shard_partitions.orders_1_node_2 o WHERE o.note = 'pg_shard_partitions.orders_1_node_2'",
                &map
            ),
            "SELECT o.id FROM public.orders_1 o WHERE o.note = 'pg_shard_partitions.orders_1_node_2'"
        );
        assert_eq!(
            replace_names("SELECT 'it''s pg_shard_partitions.orders_1_node_2' AS \"pg_shard_partitions.orders_1_node_2\"", &map),
            "SELECT 'it''s pg_shard_partitions.orders_1_node_2' AS \"pg_shard_partitions.orders_1_node_2\""
        );
        // Only whole names: a longer partition name is another partition.
        assert_eq!(
            replace_names("FROM pg_shard_partitions.orders_1_node_22 x", &map),
            "FROM pg_shard_partitions.orders_1_node_22 x"
        );
        let quoted = vec![(
            "pg_shard_partitions.\"Orders_1_node_2\"".to_string(),
            "public.\"Orders_1\"".to_string(),
        )];
        assert_eq!(
            replace_names(
                "UPDATE pg_shard_partitions.\"Orders_1_node_2\" \"Orders\" SET",
                &quoted
            ),
            "UPDATE public.\"Orders_1\" \"Orders\" SET"
        );
        assert_eq!(
            replace_names("SELECT E'\\' pg_shard_partitions.orders_1_node_2' FROM pg_shard_partitions.orders_1_node_2", &map),
            "SELECT E'\\' pg_shard_partitions.orders_1_node_2' FROM public.orders_1"
        );
    }
}
