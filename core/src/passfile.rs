//! libpq's password file (`~/.pgpass`, or `PGPASSFILE`): lines of
//! `hostname:port:database:username:password`, `*` matching anything, `\`
//! escaping `:` and `\`, the first matching line winning. The extension's
//! connections made with the `postgres` crate read it as its libpq ones do,
//! so a cluster whose nodes ask for passwords works the same on both paths.

/// The password the file's `contents` give for a connection, as libpq
/// chooses it. A host that is a socket folder (starts with `/`) or empty
/// matches `localhost`, as in libpq.
pub fn find_password(
    contents: &str,
    host: &str,
    port: u16,
    database: &str,
    user: &str,
) -> Option<String> {
    let host = if host.is_empty() || host.starts_with('/') {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    let wanted = [host, port.as_str(), database, user];
    contents.lines().find_map(|line| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with('#') {
            return None;
        }
        let fields = split_fields(line)?;
        let matches = fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, value)| field == "*" || field == value);
        matches.then(|| fields[4].clone())
    })
}

/// A line's five fields, unescaped; None for a line with fewer. Like libpq,
/// the password is the rest of the line, colons included.
fn split_fields(line: &str) -> Option<[String; 5]> {
    let mut fields: Vec<String> = Vec::with_capacity(5);
    let mut current = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    if fields.len() < 4 {
        return None;
    }
    fields.push(current);
    fields.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::find_password;

    const FILE: &str = "# a comment\n\
        db1.example:5432:app:alice:first\n\
        *:5433:*:bob:b\\:ob\\\\pw\n\
        localhost:*:*:carol:sock\n\
        *:*:*:*:fallback:with:colons\n";

    #[test]
    fn first_matching_line_wins() {
        assert_eq!(
            find_password(FILE, "db1.example", 5432, "app", "alice").as_deref(),
            Some("first")
        );
        assert_eq!(
            find_password(FILE, "db1.example", 5432, "other", "alice").as_deref(),
            Some("fallback:with:colons")
        );
    }

    #[test]
    fn escapes_and_wildcards() {
        assert_eq!(
            find_password(FILE, "10.0.0.1", 5433, "x", "bob").as_deref(),
            Some("b:ob\\pw")
        );
    }

    #[test]
    fn socket_folders_match_localhost() {
        assert_eq!(
            find_password(FILE, "/var/run/postgresql", 1, "d", "carol").as_deref(),
            Some("sock")
        );
        assert_eq!(
            find_password(FILE, "", 1, "d", "carol").as_deref(),
            Some("sock")
        );
    }

    #[test]
    fn no_match_and_short_lines() {
        assert_eq!(find_password("h:1:d:u\nbroken\n", "h", 1, "d", "u"), None);
        assert_eq!(find_password("", "h", 1, "d", "u"), None);
        assert_eq!(
            find_password("h:1:d:u:pw\r\n", "h", 1, "d", "u").as_deref(),
            Some("pw")
        );
    }
}
