//! Statements about whole databases (CREATE, DROP, ALTER … RENAME,
//! ALTER DATABASE with options). PostgreSQL refuses most of them while any
//! other session is connected to the database (or, for CREATE, to its
//! template), and the coordinator's own idle pooled connections and map
//! listeners are such sessions: before one of these statements runs, they
//! let go of the databases it names (session.rs), and afterwards the shard
//! maps of those names are loaded anew (a database created again under an
//! old name is another database).

use pg_query::protobuf::{self, node::Node as N};

/// The databases a statement needs free of other sessions, and whether
/// their names may mean other databases afterwards (dropped, renamed,
/// created). Empty for every other statement.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DatabaseCommand {
    /// Databases the statement needs no other session on.
    pub needs_free: Vec<String>,
    /// Names whose shard map must be loaded anew after it succeeds.
    pub renews: Vec<String>,
}

/// PostgreSQL's template when CREATE DATABASE names none.
const DEFAULT_TEMPLATE: &str = "template1";

/// What a statement the coordinator analysed does to whole databases:
/// only one that runs on the metadata node (neither routed nor answered
/// by the coordinator) can.
pub fn of_statement(sql: &str, analysis: &crate::router::Analysis) -> Option<DatabaseCommand> {
    match analysis {
        crate::router::Analysis::Other { .. } => database_command(sql),
        _ => None,
    }
}

/// What `sql` does to whole databases; None for any other statement (a
/// cheap look at the first words first: this runs for every statement the
/// metadata node gets).
pub fn database_command(sql: &str) -> Option<DatabaseCommand> {
    let mut words = sql
        .split(|c: char| c.is_whitespace() || c == '(' || c == ';')
        .filter(|w| !w.is_empty());
    let verb = words.next()?.to_ascii_lowercase();
    if !matches!(verb.as_str(), "create" | "drop" | "alter") {
        return None;
    }
    if !words.next()?.eq_ignore_ascii_case("database") {
        return None;
    }
    let parsed = pg_query::parse(sql).ok()?;
    let [statement] = parsed.protobuf.stmts.as_slice() else {
        return None;
    };
    let node = statement.stmt.as_ref()?.node.as_ref()?;
    let command = match node {
        N::CreatedbStmt(create) => {
            let template =
                option_text(&create.options, "template").unwrap_or(DEFAULT_TEMPLATE.into());
            DatabaseCommand {
                needs_free: vec![template],
                renews: vec![create.dbname.clone()],
            }
        }
        N::DropdbStmt(drop) => DatabaseCommand {
            needs_free: vec![drop.dbname.clone()],
            renews: vec![drop.dbname.clone()],
        },
        N::RenameStmt(rename)
            if rename.rename_type == protobuf::ObjectType::ObjectDatabase as i32 =>
        {
            DatabaseCommand {
                needs_free: vec![rename.subname.clone()],
                renews: vec![rename.subname.clone(), rename.newname.clone()],
            }
        }
        // SET TABLESPACE, ALLOW_CONNECTIONS, IS_TEMPLATE, CONNECTION LIMIT:
        // only the first needs the database free, but letting go of idle
        // connections costs nothing.
        N::AlterDatabaseStmt(alter) => DatabaseCommand {
            needs_free: vec![alter.dbname.clone()],
            renews: Vec::new(),
        },
        _ => return None,
    };
    Some(command)
}

/// The text of a `name value` option (`TEMPLATE t`, `TEMPLATE = t`).
fn option_text(options: &[protobuf::Node], name: &str) -> Option<String> {
    options
        .iter()
        .find_map(|option| match option.node.as_ref()? {
            N::DefElem(element) if element.defname == name => {
                match element.arg.as_deref()?.node.as_ref()? {
                    N::String(text) => Some(text.sval.clone()),
                    N::TypeName(type_name) => {
                        type_name
                            .names
                            .last()
                            .and_then(|last| match last.node.as_ref()? {
                                N::String(text) => Some(text.sval.clone()),
                                _ => None,
                            })
                    }
                    _ => None,
                }
            }
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(needs_free: &[&str], renews: &[&str]) -> Option<DatabaseCommand> {
        Some(DatabaseCommand {
            needs_free: needs_free.iter().map(|s| s.to_string()).collect(),
            renews: renews.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn create_needs_its_template() {
        assert_eq!(
            database_command("CREATE DATABASE shop"),
            command(&["template1"], &["shop"])
        );
        assert_eq!(
            database_command("create database \"Shop\" TEMPLATE = template0"),
            command(&["template0"], &["Shop"])
        );
        assert_eq!(
            database_command("CREATE DATABASE copy WITH TEMPLATE \"Source\" OWNER app"),
            command(&["Source"], &["copy"])
        );
    }

    #[test]
    fn drop_rename_alter() {
        assert_eq!(
            database_command("DROP DATABASE IF EXISTS shop WITH (FORCE)"),
            command(&["shop"], &["shop"])
        );
        assert_eq!(
            database_command("ALTER DATABASE shop RENAME TO store"),
            command(&["shop"], &["shop", "store"])
        );
        assert_eq!(
            database_command("ALTER DATABASE shop SET TABLESPACE fast"),
            command(&["shop"], &[])
        );
    }

    #[test]
    fn other_statements_are_not_database_commands() {
        for sql in [
            "SELECT 1",
            "CREATE TABLE database (id int)",
            "ALTER DATABASE shop SET work_mem = '8MB'",
            "DROP DATABASE",
            "DROP DATABASE a; DROP DATABASE b",
        ] {
            assert_eq!(database_command(sql), None, "{sql}");
        }
    }
}
