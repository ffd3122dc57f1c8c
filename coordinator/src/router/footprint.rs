//! Which kinds of tables a statement names: what a transaction on several
//! nodes checks before the metadata node runs a statement in it (the
//! metadata node cannot see what the transaction wrote on the workers).

use super::*;

/// The tables a statement names, as far as the coordinator can tell: what
/// a transaction on several nodes needs to know before it lets the
/// metadata node run a statement in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// It may read or write a distributed table (or the coordinator cannot
    /// tell: an unknown function, a name it cannot resolve, a statement it
    /// does not analyse).
    pub distributed: bool,
    /// It names a reference table.
    pub reference: bool,
}

pub fn footprint(analysis: &Analysis, map: &ClusterMap, session: &Session<'_>) -> Footprint {
    let unknown = Footprint {
        distributed: true,
        reference: true,
    };
    let shape = match analysis {
        Analysis::Routable(shape) => shape,
        Analysis::Transaction(_)
        | Analysis::Savepoint(_)
        | Analysis::Admin(_)
        | Analysis::Deallocate { .. }
        | Analysis::SearchPath { temporary: false }
        | Analysis::Other {
            tableless: true, ..
        } => return Footprint::default(),
        _ => return unknown,
    };
    let user_function = shape.functions.iter().any(|(schema, name)| {
        !matches!(schema.as_deref(), None | Some("pg_catalog"))
            || !map.catalog_functions.contains(name)
    });
    if user_function {
        return unknown;
    }
    let mut found = Footprint::default();
    for relation in &shape.relations {
        let search_path = match (&relation.schema, session.search_path) {
            (Some(_), _) => &[][..],
            (None, Some(path)) => path,
            (None, None) => return unknown,
        };
        match map.table(relation.schema.as_deref(), &relation.name, search_path) {
            Some(table) => match table.kind {
                TableKind::Distributed { .. } => found.distributed = true,
                TableKind::Reference { .. } => found.reference = true,
            },
            // A table of the metadata node's own, or a view that may read
            // distributed tables.
            None => return unknown,
        }
    }
    found
}
