//! What one batch asks of its server connection: the client's prepared
//! statements mapped onto server-side statements named by their text.

use super::*;
use crate::net::tags;

/// The server-side statements a request can use: those prepared on the
/// connection before it, those it prepares itself, and the text of the
/// unnamed statement it last parsed.
struct ServerStatements<'a> {
    pub(super) already: &'a HashSet<String>,
    pub(super) here: HashSet<String>,
    /// Closed by the request.
    pub(super) closed: HashSet<String>,
    pub(super) unnamed: Option<String>,
}

impl ServerStatements<'_> {
    fn has(&self, server_name: &str) -> bool {
        (self.already.contains(server_name) && !self.closed.contains(server_name))
            || self.here.contains(server_name)
    }

    /// The server-side name of client statement `name` (defined as
    /// `statement`) in `text`, queueing a hidden Parse when the connection
    /// does not have it.
    fn ensure(
        &mut self,
        name: &str,
        statement: &Prepared,
        text: &str,
        request: &mut BytesMut,
        expects: &mut Vec<Expect>,
    ) -> String {
        let parameter_types = &statement.parameter_types;
        let server_name = server_statement_name(name, text, parameter_types);
        let present = if name.is_empty() {
            self.unnamed.as_deref() == Some(text)
        } else {
            self.has(&server_name)
        };
        if !present {
            protocol::parse(request, &server_name, text, parameter_types);
            expects.push(Expect::ParseComplete {
                visible: false,
                name: (!name.is_empty()).then(|| server_name.clone()),
            });
            if name.is_empty() {
                self.unnamed = Some(text.to_owned());
            } else {
                self.here.insert(server_name.clone());
            }
        }
        server_name
    }
}

/// Server-side statement name: the client's unnamed statement stays
/// unnamed; named ones are named by their text, so every client preparing
/// the same text on a connection shares one server statement.
pub(super) fn server_statement_name(
    client_name: &str,
    text: &str,
    parameter_types: &[u32],
) -> String {
    if client_name.is_empty() {
        return String::new();
    }
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    for oid in parameter_types {
        hasher.update(oid.to_be_bytes());
    }
    let digest = hasher.finalize();
    let mut name = String::from("pgs_");
    for byte in &digest[..16] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

impl Session {
    /// The messages of `batch` as sent to the server (`already` prepared
    /// there), what to expect back for each, and the named statements the
    /// request prepares. One pass over the batch.
    pub(super) fn batch_request(
        &mut self,
        batch: &[BatchItem],
        plan: &BatchPlan,
        already: &HashSet<String>,
    ) -> (BytesMut, Vec<Expect>, Vec<String>) {
        let on_worker = matches!(plan.target, Target::Worker(_));
        // On a worker, a statement's text is the one rewritten where the
        // batch first binds that definition of it.
        let mut bound_texts: HashMap<*const Prepared, &String> = HashMap::new();
        if on_worker {
            for (index, item) in batch.iter().enumerate() {
                if let (Some(statement), Some(text)) = (&item.statement, plan.texts.get(&index)) {
                    bound_texts.entry(Arc::as_ptr(statement)).or_insert(text);
                }
            }
        }
        let mut request = BytesMut::new();
        let mut expects = Vec::with_capacity(batch.len());
        let mut prepared = ServerStatements {
            already,
            here: HashSet::new(),
            closed: HashSet::new(),
            unnamed: None,
        };
        for (index, item) in batch.iter().enumerate() {
            match &item.message {
                FrontendMessage::Parse {
                    name,
                    query,
                    parameter_types,
                } => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    // On a worker, a statement is prepared where it is
                    // bound (rewritten for its shard; pg_query found no
                    // error), but for what pg_query cannot parse: the
                    // worker reports the syntax error.
                    if on_worker && !matches!(*statement.analysis, Analysis::Unparsed) {
                        expects.push(synthetic(tags::backend::PARSE_COMPLETE));
                        continue;
                    }
                    let server_name = server_statement_name(name, query, parameter_types);
                    if !name.is_empty() && prepared.has(&server_name) {
                        expects.push(synthetic(tags::backend::PARSE_COMPLETE));
                        continue;
                    }
                    protocol::parse(&mut request, &server_name, query, parameter_types);
                    if name.is_empty() {
                        prepared.unnamed = Some(query.clone());
                    } else {
                        prepared.here.insert(server_name.clone());
                    }
                    expects.push(Expect::ParseComplete {
                        visible: true,
                        name: (!name.is_empty()).then_some(server_name),
                    });
                }
                FrontendMessage::Bind(bind) => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let text = plan.texts.get(&index).unwrap_or(&statement.sql);
                    let server_name = prepared.ensure(
                        &bind.statement,
                        statement,
                        text,
                        &mut request,
                        &mut expects,
                    );
                    bind.encode(&server_name, &mut request);
                    expects.push(Expect::BindComplete);
                    if !bind.portal.is_empty() {
                        self.portals.insert(bind.portal.clone(), plan.target);
                    }
                }
                FrontendMessage::Describe {
                    kind: tags::STATEMENT,
                    name,
                } => {
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let text = bound_texts
                        .get(&Arc::as_ptr(statement))
                        .copied()
                        .unwrap_or(&statement.sql);
                    let server_name =
                        prepared.ensure(name, statement, text, &mut request, &mut expects);
                    protocol::describe(&mut request, tags::STATEMENT, &server_name);
                    expects.push(Expect::DescribeStatement);
                }
                FrontendMessage::Describe { name, .. } => {
                    protocol::describe(&mut request, tags::PORTAL, name);
                    expects.push(Expect::DescribePortal);
                }
                FrontendMessage::Execute { portal, max_rows } => {
                    protocol::execute(&mut request, portal, *max_rows);
                    expects.push(Expect::Execute);
                }
                FrontendMessage::Close {
                    kind: tags::STATEMENT,
                    name,
                } => {
                    // The client's name went when it came. On the metadata
                    // node the server statement goes too, so that
                    // pg_prepared_statements reads as it would directly
                    // (another client using it there prepares it again);
                    // on workers, statements stay cached by their text.
                    let server_name = item
                        .statement
                        .as_ref()
                        .filter(|_| !on_worker && !name.is_empty())
                        .map(|s| server_statement_name(name, &s.sql, &s.parameter_types))
                        .filter(|server_name| prepared.has(server_name));
                    match server_name {
                        Some(server_name) => {
                            protocol::close(&mut request, tags::STATEMENT, &server_name);
                            prepared.here.remove(&server_name);
                            prepared.closed.insert(server_name.clone());
                            expects.push(Expect::CloseStatement(server_name));
                        }
                        None => expects.push(synthetic(tags::backend::CLOSE_COMPLETE)),
                    }
                }
                FrontendMessage::Close { name, .. } => {
                    if self.portals.remove(name).is_some() || name.is_empty() {
                        protocol::close(&mut request, tags::PORTAL, name);
                        expects.push(Expect::CloseComplete);
                    } else {
                        expects.push(synthetic(tags::backend::CLOSE_COMPLETE));
                    }
                }
                FrontendMessage::Sync => {
                    protocol::sync(&mut request);
                    expects.push(Expect::Sync);
                }
                FrontendMessage::Flush => {
                    protocol::flush(&mut request);
                    expects.push(Expect::Synthetic(Bytes::new()));
                }
                _ => {}
            }
        }
        (request, expects, prepared.here.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_names_depend_on_text_and_types() {
        assert_eq!(server_statement_name("", "SELECT 1", &[]), "");
        let a = server_statement_name("s1", "SELECT $1", &[23]);
        assert_eq!(a, server_statement_name("other", "SELECT $1", &[23]));
        assert_ne!(a, server_statement_name("s1", "SELECT $1", &[20]));
        assert!(a.len() < 64);
    }
}
