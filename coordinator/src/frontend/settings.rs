//! The client's session settings: startup parameters and options, SET and
//! RESET as they are replayed on each server connection, and what a
//! statement leaves behind on its connection.

use super::*;

/// The settings in a startup `options` string: words separated by spaces
/// (a backslash escapes the next character), each `-c name=value` (or
/// `-cname=value`) or `--name=value`. None for anything else.
pub(super) fn command_line_settings(options: &str) -> Option<Vec<(String, String)>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.push(chars.next()?),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut settings = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let assignment = if word == "-c" {
            words.next()?
        } else if let Some(rest) = word.strip_prefix("--") {
            rest.to_owned()
        } else if let Some(rest) = word.strip_prefix("-c") {
            rest.to_owned()
        } else {
            return None;
        };
        let (name, value) = assignment.split_once('=')?;
        if name.is_empty() {
            return None;
        }
        // Command-line style allows '-' for '_' in names.
        settings.push((name.replace('-', "_").to_lowercase(), value.to_owned()));
    }
    Some(settings)
}

/// `SET "name" = 'value'`, for a startup parameter or option.
pub(super) fn set_statement(name: &str, value: &str) -> String {
    use pg_shard_core::quote;
    if LIST_SETTINGS.contains(&name.to_ascii_lowercase().as_str()) {
        // `SET search_path = 'a,b'` would name one schema "a,b"; the value
        // of a startup packet (or SHOW) is the list itself.
        return format!(
            "SELECT pg_catalog.set_config({}, {}, false)",
            quote::literal(name),
            quote::literal(value)
        );
    }
    format!("SET {} = {}", quote::ident(name), quote::literal(value))
}

/// Settings whose value is a list of names (GUC_LIST_QUOTE).
const LIST_SETTINGS: [&str; 5] = [
    "search_path",
    "temp_tablespaces",
    "local_preload_libraries",
    "session_preload_libraries",
    "shared_preload_libraries",
];

/// What running a statement may leave behind on its server connection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionEffect {
    None,
    /// Settings may have changed (SET, functions…): reset before reuse.
    Unknown,
    /// Session state a reset does not undo (temporary tables, LISTEN,
    /// PREPARE, WITH HOLD cursors, set_config, advisory locks): the
    /// connection becomes the client's own until it leaves or DISCARD ALL.
    Keeps,
}

pub(super) fn session_effect(analysis: &Analysis) -> SessionEffect {
    match analysis {
        Analysis::Routable(shape) if shape.may_change_session() => SessionEffect::Keeps,
        Analysis::Routable(_) | Analysis::Transaction(_) | Analysis::Admin(_) => {
            SessionEffect::None
        }
        Analysis::SearchPath { temporary: true }
        | Analysis::Deallocate { .. }
        | Analysis::Other {
            keeps_state: true, ..
        } => SessionEffect::Keeps,
        _ => SessionEffect::Unknown,
    }
}

/// `DISCARD ALL`: the session's state is gone.
pub(super) fn discards_all(sql: &str) -> bool {
    // Asked after every simple query: compared word by word, nothing copied.
    let mut words = sql
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty());
    matches!(
        (words.next(), words.next(), words.next()),
        (Some(first), Some(second), None)
            if first.eq_ignore_ascii_case("discard") && second.eq_ignore_ascii_case("all")
    )
}

/// Statements whose success changes the client's settings.
pub(super) fn sets_parameter(analysis: &Analysis) -> bool {
    matches!(
        analysis,
        Analysis::SearchPath { temporary: false }
            | Analysis::Other {
                tableless: true,
                ..
            }
    )
}

/// The first statement parsed, if it is a SET or RESET.
fn first_set_statement(
    parsed: &pg_query::ParseResult,
) -> Option<&pg_query::protobuf::VariableSetStmt> {
    match parsed
        .protobuf
        .stmts
        .first()?
        .stmt
        .as_ref()?
        .node
        .as_ref()?
    {
        pg_query::NodeEnum::VariableSetStmt(set) => Some(set),
        _ => None,
    }
}

/// The idle_session_timeout among the client's settings (0: none).
pub(super) fn idle_session_timeout(settings: &[(String, String)]) -> Option<Duration> {
    let (_, sql) = settings
        .iter()
        .find(|(name, _)| name == "idle_session_timeout")?;
    let parsed = pg_query::parse(sql).ok()?;
    let set = first_set_statement(&parsed)?;
    let value = match set.args.first()?.node.as_ref()? {
        pg_query::NodeEnum::AConst(constant) => match constant.val.as_ref()? {
            pg_query::protobuf::a_const::Val::Ival(i) => i.ival.to_string(),
            pg_query::protobuf::a_const::Val::Sval(s) => s.sval.clone(),
            pg_query::protobuf::a_const::Val::Fval(f) => f.fval.clone(),
            _ => return None,
        },
        _ => return None,
    };
    milliseconds(&value)
        .filter(|ms| *ms > 0.0)
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
}

/// A time setting's value in milliseconds (PostgreSQL's units; a bare
/// number is milliseconds).
fn milliseconds(value: &str) -> Option<f64> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    Some(number * scale)
}

/// Routing reads literals as PostgreSQL does only with
/// standard_conforming_strings on (the default).
pub(super) fn routing_possible(settings: &[(String, String)]) -> bool {
    !settings.iter().any(|(name, sql)| {
        name == "standard_conforming_strings" && {
            let lower = sql.to_lowercase();
            ["off", "false", "'0'", " 0", "'no'", " no"]
                .iter()
                .any(|word| lower.contains(word))
        }
    })
}

impl Session {
    /// Session state after statements ran: successful SETs are kept
    /// (inside a transaction once it commits), DISCARD ALL forgets it all.
    pub(super) fn after_statements(&mut self, sets: Vec<String>, committing: bool, discards: bool) {
        if !self.last_failed {
            if self.tx.state == TxState::Idle {
                for sql in sets {
                    self.remember_setting(&sql);
                }
            } else {
                self.pending_settings.extend(sets);
            }
            if committing && self.tx.state == TxState::Idle {
                for sql in std::mem::take(&mut self.pending_settings) {
                    self.remember_setting(&sql);
                }
            }
            if discards {
                // A new session as far as pooled connections go: the
                // statements and sequence state it left on them are gone
                // for the client, so the next use clears them.
                self.serial = SESSION_SERIALS.fetch_add(1, Ordering::Relaxed);
                // Prepared statements and portals went with it.
                self.statements.clear();
                self.portals.clear();
                self.forget_session_state();
                self.settings = self.startup_settings.clone();
                self.search_path_changed = false;
                self.temporary_relations = false;
                self.routing = routing_possible(&self.settings);
                self.idle_timeout = idle_session_timeout(&self.settings);
                self.pipes.clear();
            }
        }
        if self.tx.state == TxState::Idle {
            self.pending_settings.clear();
        }
    }

    /// Records a successful session-level SET or RESET (a statement of its
    /// own, outside a transaction), to be replayed on every server
    /// connection this client uses from now on. The replayed text is
    /// regenerated from the parse tree: nothing else the client sent with
    /// it (comments, other statements) is replayed.
    fn remember_setting(&mut self, sql: &str) {
        let Ok(parsed) = pg_query::parse(sql) else {
            return;
        };
        // Outside transactions only: one inside may still roll back.
        if parsed.protobuf.stmts.len() != 1 || self.tx.state != TxState::Idle {
            return;
        }
        let Some(set) = first_set_statement(&parsed) else {
            return;
        };
        if set.is_local {
            return;
        }
        use pg_query::protobuf::VariableSetKind as K;
        match K::try_from(set.kind) {
            Ok(K::VarResetAll) => {
                // Back to the startup values; RESET ALL leaves the role and
                // the session authorization as they are.
                let kept = |name: &str| matches!(name, "role" | "session_authorization");
                self.settings.retain(|(name, _)| kept(name));
                let startup = self.startup_settings.iter().filter(|(name, _)| !kept(name));
                self.settings.extend(startup.cloned());
                self.search_path_changed = self.differs_from_login();
            }
            Ok(K::VarReset | K::VarSetDefault) => {
                self.settings.retain(|(name, _)| *name != set.name);
                let startup = self
                    .startup_settings
                    .iter()
                    .find(|(name, _)| *name == set.name);
                self.settings.extend(startup.cloned());
                if matches!(
                    set.name.as_str(),
                    "search_path" | "role" | "session_authorization"
                ) {
                    self.search_path_changed = self.differs_from_login();
                }
            }
            Ok(K::VarSetValue | K::VarSetCurrent) => {
                let Ok(text) = pg_query::deparse(&parsed.protobuf) else {
                    return;
                };
                self.settings.retain(|(name, _)| *name != set.name);
                self.settings.push((set.name.clone(), text));
            }
            _ => {}
        }
        self.routing = routing_possible(&self.settings);
        self.idle_timeout = idle_session_timeout(&self.settings);
        // Pipes are shared by clients with the same settings.
        self.pipes.clear();
    }

    /// The schemas unqualified names resolve in, when the coordinator
    /// knows them.
    pub(super) fn known_search_path(&self) -> Option<&[String]> {
        if self.search_path_changed || self.temporary_relations {
            return None;
        }
        self.search_path.as_deref()
    }

    /// What routing needs of the session: the schemas names resolve in,
    /// and whether a statement now runs outside any transaction of
    /// several statements (no transaction block, no node's transaction
    /// begun, no batch held since a Flush).
    pub(super) fn routing_session(&self) -> router::Session<'_> {
        router::Session {
            search_path: self.known_search_path(),
            outside_transaction: self.tx.state == TxState::Idle
                && self.tx.members.is_empty()
                && self.held.is_none(),
        }
    }

    /// After a RESET: the search_path or the role (which `$user` follows)
    /// is not the login's.
    fn differs_from_login(&self) -> bool {
        let setting = |settings: &[(String, String)], wanted: &str| {
            settings
                .iter()
                .find(|(name, _)| name == wanted)
                .map(|(_, sql)| sql.clone())
        };
        ["search_path", "role", "session_authorization"]
            .iter()
            .any(|name| setting(&self.settings, name) != setting(&self.startup_settings, name))
    }

    /// DISCARD ALL succeeded: the client's session connections are closed
    /// (nothing of its state is left to keep) and it is pooled again.
    pub(super) fn forget_session_state(&mut self) {
        self.session_targets.clear();
        for (_, mut lease) in self.session_connections.drain() {
            lease.connection().broken = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_replay_as_the_server_reads_them() {
        assert_eq!(
            set_statement("DateStyle", "ISO, MDY"),
            "SET \"DateStyle\" = 'ISO, MDY'"
        );
        assert_eq!(
            set_statement("search_path", "\"$user\", public"),
            "SELECT pg_catalog.set_config('search_path', '\"$user\", public', false)",
            "a list setting keeps its elements"
        );
        assert_eq!(
            set_statement("application_name", "it's"),
            "SET \"application_name\" = 'it''s'"
        );
    }

    #[test]
    fn startup_options() {
        assert_eq!(
            command_line_settings(
                "-c intervalstyle=postgres_verbose --datestyle=ISO,\\ MDY -cstatement_timeout=5s"
            ),
            Some(vec![
                ("intervalstyle".into(), "postgres_verbose".into()),
                ("datestyle".into(), "ISO, MDY".into()),
                ("statement_timeout".into(), "5s".into()),
            ])
        );
        assert_eq!(command_line_settings(""), Some(vec![]));
        assert_eq!(command_line_settings("-d 5"), None);
        assert_eq!(command_line_settings("-c"), None);
        assert_eq!(command_line_settings("-c =x"), None);
    }

    #[test]
    fn discard_all_in_any_case_and_spacing() {
        assert!(discards_all("DISCARD ALL"));
        assert!(discards_all("  discard\n\tAll ;"));
        assert!(!discards_all("DISCARD PLANS"));
        assert!(!discards_all("DISCARD ALL; SELECT 1"));
        assert!(!discards_all("DISCARD"));
        assert!(!discards_all("SELECT 'discard all'"));
    }

    #[test]
    fn idle_session_timeouts() {
        let setting = |sql: &str| vec![("idle_session_timeout".to_owned(), sql.to_owned())];
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout = '1s'")),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout TO 1500")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET \"idle_session_timeout\" = '2min'")),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            idle_session_timeout(&setting("SET idle_session_timeout = 0")),
            None
        );
        assert_eq!(idle_session_timeout(&[]), None);
    }
}
