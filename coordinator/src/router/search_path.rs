//! A session's search_path as the server reports it (`SHOW search_path`),
//! turned into the schemas an unqualified table name is looked up in, so
//! that the coordinator routes a name to the table the node would read.

/// The schemas of `value` (PostgreSQL's list syntax: `"$user", public`,
/// `tenant_x, "My Schema"`) in order, `$user` replaced by `user`. Unquoted
/// names are folded to lower case, as the server does; None when the value
/// is not a list the server would accept.
pub fn schemas(value: &str, user: &str) -> Option<Vec<String>> {
    let mut schemas = Vec::new();
    let mut rest = value.trim_start();
    if rest.is_empty() {
        return Some(schemas);
    }
    loop {
        let (name, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let mut name = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') if quoted[i + 1..].starts_with('"') => {
                        name.push('"');
                        chars.next();
                    }
                    (i, '"') => break i + 1,
                    (_, c) => name.push(c),
                }
            };
            (name, &quoted[end..])
        } else {
            let end = rest.find([',', ' ', '\t', '\n']).unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            (rest[..end].to_ascii_lowercase(), &rest[end..])
        };
        if name == "$user" {
            schemas.push(user.to_owned());
        } else {
            schemas.push(name);
        }
        rest = after.trim_start();
        match rest.strip_prefix(',') {
            Some(next) => rest = next.trim_start(),
            None if rest.is_empty() => return Some(schemas),
            None => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::schemas;

    fn list(value: &str) -> Option<Vec<String>> {
        schemas(value, "alice")
    }

    #[test]
    fn the_default_names_the_user_then_public() {
        assert_eq!(list("\"$user\", public").unwrap(), ["alice", "public"]);
        assert_eq!(list("$user,public").unwrap(), ["alice", "public"]);
    }

    #[test]
    fn unquoted_names_fold_quoted_ones_keep_case() {
        assert_eq!(
            list("Tenant_X, \"My \"\"Schema\"\"\", public").unwrap(),
            ["tenant_x", "My \"Schema\"", "public"]
        );
    }

    #[test]
    fn an_empty_path_has_no_schemas() {
        assert_eq!(list("").unwrap(), Vec::<String>::new());
        assert_eq!(list("  ").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn malformed_lists_are_refused() {
        assert_eq!(list("a,,b"), None);
        assert_eq!(list("\"open"), None);
        assert_eq!(list("a b"), None);
    }
}
