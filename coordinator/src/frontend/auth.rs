//! Client authentication: SCRAM-SHA-256 against a users file, passthrough to
//! the metadata node, or trust.

use crate::net::scram::{ScramError, Verifier};
use std::collections::HashMap;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum UsersError {
    #[error("cannot read users file {0}: {1}")]
    Read(String, std::io::Error),
    #[error("users file line {0}: expected \"user\" \"password or SCRAM verifier\"")]
    Syntax(usize),
    #[error("users file line {0}: {1}")]
    Verifier(usize, ScramError),
}

/// The users file: `"name" "secret"` per line (pgbouncer's userlist.txt
/// format); the secret is a PostgreSQL SCRAM-SHA-256 verifier or a
/// plain-text password. `#` starts a comment.
pub struct Users {
    verifiers: HashMap<String, Verifier>,
}

impl Users {
    pub fn load(path: &Path) -> Result<Users, UsersError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UsersError::Read(path.display().to_string(), e))?;
        Users::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Users, UsersError> {
        let mut verifiers = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = quoted_fields(line).ok_or(UsersError::Syntax(number + 1))?;
            let [user, secret] = fields.as_slice() else {
                return Err(UsersError::Syntax(number + 1));
            };
            let verifier = if secret.starts_with("SCRAM-SHA-256$") {
                Verifier::parse(secret).map_err(|e| UsersError::Verifier(number + 1, e))?
            } else {
                Verifier::from_password(secret)
            };
            verifiers.insert(user.clone(), verifier);
        }
        Ok(Users { verifiers })
    }

    pub fn verifier(&self, user: &str) -> Option<&Verifier> {
        self.verifiers.get(user)
    }
}

/// `"a" "b""c"` → ["a", "b\"c"].
fn quoted_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(fields),
            Some('"') => {}
            Some(_) => return None,
        }
        let mut field = String::new();
        loop {
            match chars.next()? {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => break,
                c => field.push(c),
            }
        }
        fields.push(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_file_lines() {
        let users = Users::parse(
            "# comment\n\"alice\" \"secret\"\n\n\"bo\"\"b\" \"SCRAM-SHA-256$4096:c2FsdA==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:ZJTRrKuy8V5oeKxNXKtQLbi94mn9qv3pqmKkZ1F5rAs=\"\n",
        )
        .unwrap();
        assert!(users.verifier("alice").is_some());
        assert!(users.verifier("bo\"b").is_some());
        assert!(users.verifier("carol").is_none());
        assert!(Users::parse("alice secret").is_err());
        assert!(Users::parse("\"alice\"").is_err());
        assert!(Users::parse("\"a\" \"SCRAM-SHA-256$x\"").is_err());
    }
}
