//! A fast scan that turns literal values into parameters, so that
//! statements differing only in their constants (`… WHERE aid = 17`,
//! `… WHERE aid = 42`) share one cached parse. The statement sent to the
//! server is always the original text; the normalized text is only parsed
//! by the router, and literals are handed to it as text-format values of
//! the parameters that replaced them.

/// A literal taken out of a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Literal {
    /// As written (numbers), or the string's value (quotes removed).
    pub text: String,
    /// A numeric literal rather than a quoted string.
    pub numeric: bool,
}

/// A statement with its literals taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The text with each literal replaced by `$n`.
    pub key: String,
    /// The literals, in order; literal `i` became parameter
    /// `first_literal + i` (0-based).
    pub literals: Vec<Literal>,
    pub first_literal: usize,
    /// (position in key, position in original) at the start of each
    /// stretch copied verbatim.
    breaks: Vec<(usize, usize)>,
}

impl Normalized {
    /// The original position of a position in the key that lies in text
    /// copied verbatim.
    pub fn original_position(&self, key_position: usize) -> usize {
        let index = self
            .breaks
            .partition_point(|(key, _)| *key <= key_position)
            .saturating_sub(1);
        match self.breaks.get(index) {
            Some((key, original)) => original + (key_position - key),
            None => key_position,
        }
    }

    /// The statement unchanged (nothing to take out, or it cannot be done safely).
    fn verbatim(sql: &str) -> Normalized {
        Normalized {
            key: sql.to_owned(),
            literals: Vec::new(),
            // No parameter is a literal.
            first_literal: usize::MAX,
            breaks: Vec::new(),
        }
    }
}

/// Words after which a literal is an ordinary value (so `$n` may stand in
/// its place). After any other word a string literal may be a typed
/// literal (`DATE '2024-01-01'`, `INTERVAL '1 day'`) and is kept.
const VALUE_KEYWORDS: [&str; 27] = [
    "select",
    "where",
    "and",
    "or",
    "not",
    "in",
    "like",
    "ilike",
    "then",
    "else",
    "when",
    "is",
    "between",
    "values",
    "set",
    "by",
    "returning",
    "on",
    "having",
    "limit",
    "offset",
    "case",
    "distinct",
    "all",
    "any",
    "some",
    "escape",
];

/// The statement as it is, with no literal taken out.
pub fn normalize_nothing(sql: &str) -> Normalized {
    Normalized::verbatim(sql)
}

pub fn normalize(sql: &str) -> Normalized {
    normalize_inner(sql).unwrap_or_else(|| Normalized::verbatim(sql))
}

fn normalize_inner(sql: &str) -> Option<Normalized> {
    let bytes = sql.as_bytes();
    // Parameters already there keep their numbers; literals follow them.
    let first_literal = highest_parameter(bytes)?;
    let mut key = String::with_capacity(sql.len() + 8);
    let mut literals = Vec::new();
    let mut breaks = vec![(0, 0)];
    // The kind of the last significant token: decides whether a literal
    // may become a parameter and whether '-' is a sign.
    #[derive(PartialEq, Clone, Copy)]
    enum Last {
        Start,
        Operator,
        ValueWord,
        OtherWord,
        Value,
    }
    let mut last = Last::Start;
    let mut copied_from = 0; // start of the pending verbatim stretch
    let mut i = 0;
    let replace = |key: &mut String,
                   breaks: &mut Vec<(usize, usize)>,
                   literals: &mut Vec<Literal>,
                   copied_from: &mut usize,
                   start: usize,
                   end: usize,
                   value: String,
                   numeric: bool| {
        key.push_str(&sql[*copied_from..start]);
        key.push('$');
        key.push_str(&(first_literal + literals.len() + 1).to_string());
        literals.push(Literal {
            text: value,
            numeric,
        });
        breaks.push((key.len(), end));
        *copied_from = end;
    };
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => i += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = comment_end(bytes, i)?,
            b'\'' => {
                let start = i;
                let mut value = String::new();
                i += 1;
                loop {
                    let quote = bytes[i..].iter().position(|b| *b == b'\'')? + i;
                    value.push_str(&sql[i..quote]);
                    if bytes.get(quote + 1) == Some(&b'\'') {
                        value.push('\'');
                        i = quote + 2;
                    } else {
                        i = quote + 1;
                        break;
                    }
                }
                // Backslashes mean something only without
                // standard_conforming_strings; keep such literals as they are.
                if matches!(last, Last::Start | Last::Operator | Last::ValueWord)
                    && !value.contains('\\')
                {
                    replace(
                        &mut key,
                        &mut breaks,
                        &mut literals,
                        &mut copied_from,
                        start,
                        i,
                        value,
                        false,
                    );
                }
                last = Last::Value;
            }
            b'"' => {
                i += 1;
                loop {
                    let quote = bytes[i..].iter().position(|b| *b == b'"')? + i;
                    if bytes.get(quote + 1) == Some(&b'"') {
                        i = quote + 2;
                    } else {
                        i = quote + 1;
                        break;
                    }
                }
                last = Last::Value;
            }
            b'$' => {
                if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                    last = Last::Value;
                } else {
                    // Dollar quoting: rare in statements apps send; not worth it.
                    return None;
                }
            }
            // A number, or a negative one where a value may start (the sign
            // then belongs to the literal).
            b'0'..=b'9' | b'.' | b'-'
                if match c {
                    b'-' => {
                        matches!(last, Last::Start | Last::Operator | Last::ValueWord)
                            && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
                    }
                    b'.' => bytes.get(i + 1).is_some_and(u8::is_ascii_digit),
                    _ => true,
                } =>
            {
                let start = i;
                i = number_end(bytes, if c == b'-' { i + 1 } else { i })?;
                if matches!(last, Last::Start | Last::Operator | Last::ValueWord) {
                    replace(
                        &mut key,
                        &mut breaks,
                        &mut literals,
                        &mut copied_from,
                        start,
                        i,
                        sql[start..i].to_owned(),
                        true,
                    );
                }
                last = Last::Value;
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric()
                        || bytes[i] == b'_'
                        || bytes[i] == b'$'
                        || bytes[i] >= 0x80)
                {
                    i += 1;
                }
                // E'…', B'…', X'…', U&'…', N'…': special strings, keep them.
                if bytes.get(i) == Some(&b'\'') || (bytes.get(i) == Some(&b'&')) {
                    return None;
                }
                let word = sql[start..i].to_ascii_lowercase();
                last = if VALUE_KEYWORDS.contains(&word.as_str()) {
                    Last::ValueWord
                } else {
                    Last::OtherWord
                };
            }
            b')' | b']' => {
                i += 1;
                last = Last::Value;
            }
            _ => {
                // Operators and punctuation; a '.' or '::' keeps what follows
                // from being a value position in the sense that matters.
                if c == b':' && bytes.get(i + 1) == Some(&b':') {
                    i += 2;
                    last = Last::OtherWord;
                } else if c == b'.' {
                    i += 1;
                    last = Last::OtherWord;
                } else {
                    i += 1;
                    last = Last::Operator;
                }
            }
        }
    }
    if literals.is_empty() {
        return Some(Normalized::verbatim(sql));
    }
    key.push_str(&sql[copied_from..]);
    Some(Normalized {
        key,
        literals,
        first_literal,
        breaks,
    })
}

/// The position after the (nested, as PostgreSQL allows) comment that
/// starts at `i`; None when it is not closed.
fn comment_end(bytes: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0;
    loop {
        if i + 1 >= bytes.len() {
            return None;
        }
        if bytes[i] == b'/' && bytes[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if bytes[i] == b'*' && bytes[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
}

/// The end of a numeric literal starting at `i` (digits, fraction,
/// exponent); None for forms better left alone (hex, trailing letters).
fn number_end(bytes: &[u8], mut i: usize) -> Option<usize> {
    while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'_') {
        i += 1;
    }
    if bytes.get(i) == Some(&b'.') && bytes.get(i + 1) != Some(&b'.') {
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(bytes.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if bytes.get(j).is_some_and(u8::is_ascii_digit) {
            i = j;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    if bytes
        .get(i)
        .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
    {
        return None;
    }
    Some(i)
}

/// The highest `$n` outside strings, quoted names and comments; None
/// when the text cannot be scanned simply.
fn highest_parameter(bytes: &[u8]) -> Option<usize> {
    let mut highest = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => {
                let quote = bytes[i];
                i += 1;
                loop {
                    let end = bytes[i..].iter().position(|b| *b == quote)? + i;
                    if bytes.get(end + 1) == Some(&quote) {
                        i = end + 2;
                    } else {
                        i = end + 1;
                        break;
                    }
                }
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = comment_end(bytes, i)?,
            b'$' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) =>
            {
                let start = i + 1;
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let number: usize = std::str::from_utf8(&bytes[start..i]).ok()?.parse().ok()?;
                highest = highest.max(number);
            }
            _ => i += 1,
        }
    }
    Some(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(n: &Normalized) -> Vec<&str> {
        n.literals.iter().map(|l| l.text.as_str()).collect()
    }

    #[test]
    fn literals_become_parameters() {
        let n = normalize("SELECT abalance FROM pgbench_accounts WHERE aid = 42;");
        assert_eq!(
            n.key,
            "SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
        );
        assert_eq!(texts(&n), vec!["42"]);
        assert!(n.literals[0].numeric);
        let m = normalize("SELECT abalance FROM pgbench_accounts WHERE aid = 7;");
        assert_eq!(m.key, n.key);
    }

    #[test]
    fn strings_signs_and_existing_parameters() {
        let n = normalize(
            "UPDATE t SET name = 'O''Brien', v = -3.5e2 WHERE k = $1 AND x IN ('a', 'b')",
        );
        assert_eq!(
            n.key,
            "UPDATE t SET name = $2, v = $3 WHERE k = $1 AND x IN ($4, $5)"
        );
        assert_eq!(texts(&n), vec!["O'Brien", "-3.5e2", "a", "b"]);
        assert!(!n.literals[0].numeric && n.literals[1].numeric);
        assert_eq!(n.first_literal, 1);
    }

    #[test]
    fn typed_and_special_literals_are_kept() {
        for sql in [
            "SELECT DATE '2024-01-01'",
            "SELECT E'a\\nb'",
            "SELECT $$x$$",
            "SELECT 'a\\b'",
            "SELECT 0x1f",
        ] {
            let n = normalize(sql);
            assert!(n.literals.is_empty(), "{sql}: {n:?}");
            assert_eq!(n.key, sql);
        }
        let n = normalize("SELECT x - 1, t1.a FROM t1 WHERE a = 'x'::text");
        assert_eq!(n.key, "SELECT x - $1, t1.a FROM t1 WHERE a = $2::text");
    }

    #[test]
    fn positions_map_back() {
        let sql = "SELECT * FROM a WHERE k = 'long literal' AND j = 5 ORDER BY name";
        let n = normalize(sql);
        let in_key = n.key.find("name").unwrap();
        assert_eq!(&sql[n.original_position(in_key)..][..4], "name");
        let table = n.key.find(" a ").unwrap() + 1;
        assert_eq!(n.original_position(table), sql.find(" a ").unwrap() + 1);
    }

    #[test]
    fn comments_and_unterminated_input() {
        let n = normalize("SELECT 1 -- 2\n/* 3 /* 4 */ */ + 5");
        assert_eq!(texts(&n), vec!["1", "5"]);
        // nested comments hide a quote and a parameter alike
        let n = normalize("/* /* */ ' */ SELECT 1 WHERE a = $1 AND b = 7 -- '");
        assert_eq!(
            n.key,
            "/* /* */ ' */ SELECT $2 WHERE a = $1 AND b = $3 -- '"
        );
        assert_eq!(normalize("SELECT 'open").literals.len(), 0);
        assert_eq!(normalize("SELECT /* open").literals.len(), 0);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_maps_positions(sql in "[ -~]{0,80}") {
            let n = normalize(&sql);
            for position in 0..n.key.len() {
                let _ = n.original_position(position);
            }
        }
    }
}
