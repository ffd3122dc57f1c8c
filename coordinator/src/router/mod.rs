//! Where a statement runs. Each statement text is parsed once with
//! pg_query into an [`Analysis`] that does not depend on the shard map (so
//! it can be cached by text); [`route`] then combines it with the current
//! map and the bound parameters into a [`Route`]: one worker, with the
//! statement rewritten onto that worker's shard tables, or the metadata
//! node with the statement unchanged.
//!
//! Routing is conservative: a statement goes to a worker only when every
//! table it names is a distributed or reference table, every distributed
//! table's key is fixed (by constants, parameters or equality with another
//! fixed key) to values whose shards all live on one node, and nothing in
//! it needs the metadata node (sequences, subqueries, CTEs, defaults…).

mod analysis;
pub mod copy;
mod decision;
mod equivalence;
mod footprint;
mod keys;
pub mod lexer;
mod lookup_route;
mod rewrite;

pub mod search_path;

pub mod statement_cache;

use crate::backend::cluster::{ClusterMap, NodeId, TableKind};
pub use analysis::analyze;
use analysis::SESSION_FUNCTIONS;
use decision::route_inner;
pub use footprint::footprint;

/// The keyspace id of a key in its binary form (None when it is not one).
pub fn binary_key_id(bytes: &[u8], encoding: KeyEncoding) -> Option<KeyspaceId> {
    keys::binary_key(bytes, encoding)
}
use keys::{insert_keys, key_id, key_value};
pub use lookup_route::{route_looked_up, LookupHop};
use rewrite::rewrite;

use crate::router::lexer::Normalized;

use pg_query::protobuf::{self, a_const, node::Node as N};

use pg_shard_core::keyspace::{keyspace_id, keyspace_id_of_int, keyspace_id_of_text};

use pg_shard_core::quote;

use pg_shard_core::{KeyEncoding, KeyspaceId, ShardMap};

use std::collections::HashMap;

/// A transaction control statement the coordinator handles itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionCommand {
    /// BEGIN / START TRANSACTION, with its text (isolation level, …).
    Begin,
    Commit,
    Rollback,
    /// PREPARE TRANSACTION, COMMIT/ROLLBACK AND CHAIN, …: forwarded.
    Other,
}

/// SAVEPOINT, RELEASE [SAVEPOINT] and ROLLBACK TO [SAVEPOINT], with the
/// savepoint's name as the server folds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Savepoint {
    Define(String),
    Release(String),
    RollbackTo(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    Pools,
    Clients,
    Stats,
    Shards,
    HotKeys,
}

#[derive(Debug)]
pub enum Analysis {
    Transaction(TransactionCommand),
    Savepoint(Savepoint),
    /// Changes how names resolve (SET/RESET search_path, role or session
    /// authorization, RESET ALL, a temporary table or view): unqualified
    /// names can no longer be resolved by the coordinator.
    SearchPath {
        temporary: bool,
    },
    Admin(AdminCommand),
    /// DEALLOCATE name, or DEALLOCATE ALL (None). The client's statements
    /// prepared with the protocol are the coordinator's to forget (their
    /// server statements are shared by text); SQL-level ones live on the
    /// metadata node.
    Deallocate {
        name: Option<String>,
    },
    /// A statement that may go to one worker.
    Routable(Shape),
    /// Parsed, but always for the metadata node. `tableless`: a SELECT,
    /// SET or SHOW that names no table, which may run on whatever node a
    /// transaction is on. `keeps_state`: it leaves session state on its
    /// server connection that RESET ALL does not undo (PREPARE, LISTEN,
    /// DISCARD, DEALLOCATE, a WITH HOLD cursor, set_config or a session
    /// advisory lock), so the client keeps that connection.
    Other {
        tableless: bool,
        keeps_state: bool,
    },
    /// pg_query could not parse it: the metadata node will say why.
    Unparsed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Select,
    Insert,
    Update,
    Delete,
}

/// A table named in the statement.
#[derive(Debug)]
pub struct Relation {
    pub schema: Option<String>,
    pub name: String,
    pub alias: Option<String>,
    /// Byte range of the name in the statement text.
    pub span: (usize, usize),
}

impl Relation {
    /// How columns refer to it.
    fn reference_name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnRef {
    pub qualifier: Option<String>,
    pub column: String,
}

/// A value fixed per execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Integer(i64),
    /// A string literal; what it means depends on the key's type.
    Text(String),
    /// `$n` (0-based index here); cast says whether it was cast to a
    /// key type, which makes a binary value's format known.
    Param {
        index: usize,
        cast: Option<KeyEncoding>,
    },
}

#[derive(Debug)]
pub enum Fact {
    Equal(ColumnRef, ColumnRef),
    OneOf(ColumnRef, Vec<Value>),
}

#[derive(Debug)]
pub struct InsertShape {
    /// Named target columns; None: the table's columns in order.
    pub columns: Option<Vec<String>>,
    /// Each row's value expressions: Some for a fixed value.
    pub rows: Vec<Vec<Option<Value>>>,
}

#[derive(Debug)]
pub struct Shape {
    pub kind: Kind,
    pub relations: Vec<Relation>,
    pub facts: Vec<Fact>,
    pub insert: Option<InsertShape>,
    /// Columns an UPDATE (or ON CONFLICT DO UPDATE) assigns.
    pub assigned: Vec<String>,
    /// Functions called: (schema, name).
    pub functions: Vec<(Option<String>, String)>,
    /// SELECT … FOR UPDATE/SHARE (waits for row locks).
    pub locks_rows: bool,
}

/// Parameters bound for one execution.
pub struct Parameters<'a> {
    pub values: &'a [Option<bytes::Bytes>],
    pub formats: &'a dyn Fn(usize) -> i16,
    /// Types declared at Parse (0: inferred by the server).
    pub declared_types: &'a [u32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Everything on one worker: the rewritten statement.
    Worker {
        node: NodeId,
        sql: String,
        /// Shards touched (for metrics).
        shard: Option<i64>,
        writes: bool,
        /// The key it was routed by (for the hot keys): the first value of
        /// the first distributed table's key.
        key: Option<RoutedKey>,
    },
    /// Only reference tables are read: any node with copies can answer;
    /// `rewrites` gives the text per node.
    ReferenceOnly {
        rewrites: HashMap<NodeId, String>,
    },
    Metadata,
    /// A read by a looked-up column: the lookup is read first
    /// ([`route_looked_up`] then routes the statement).
    Lookup(LookupHop),
}

/// A statement's routing key, as the hot-key sketch counts it.
#[derive(Debug, Clone)]
pub struct RoutedKey {
    pub table: std::sync::Arc<crate::backend::cluster::Table>,
    pub id: KeyspaceId,
    pub value: KeyValue,
}

impl PartialEq for RoutedKey {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.table, &other.table)
            && self.id == other.id
            && self.value == other.value
    }
}

impl Eq for RoutedKey {}

/// A key value as the statement gave it; printed only when the sketch
/// keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    Integer(i64),
    Text(String),
    Uuid([u8; 16]),
    Bytes(Vec<u8>),
}

impl std::fmt::Display for KeyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyValue::Integer(i) => write!(f, "{i}"),
            KeyValue::Text(text) => f.write_str(text),
            KeyValue::Uuid(b) => write!(
                f,
                "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
            ),
            KeyValue::Bytes(bytes) => {
                f.write_str("\\x")?;
                bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

/// Context of the client session that routing depends on.
pub struct Session<'a> {
    /// The schemas unqualified names are looked up in; None when the
    /// coordinator does not know them (the client changed search_path, or
    /// its role, or made a temporary table): such names are not routed.
    pub search_path: Option<&'a [String]>,
    /// The statement runs outside any transaction of several statements
    /// (no transaction block, nothing of one begun on a node): a read may
    /// then follow a reads-first job's read routes.
    pub outside_transaction: bool,
}

impl Shape {
    /// Whether it calls a function that may leave session state behind
    /// (set_config, session advisory locks).
    /// A read that may share a pipelined server connection with other
    /// clients' (see multiplex.rs): a SELECT that takes no row locks and
    /// calls no function but a few built-in aggregates and operators-like
    /// functions (others could write, wait or change the session).
    pub fn multiplexable(&self) -> bool {
        const READ_ONLY_FUNCTIONS: [&str; 9] = [
            "count", "sum", "avg", "min", "max", "coalesce", "lower", "upper", "length",
        ];
        self.kind == Kind::Select
            && !self.locks_rows
            && self.functions.iter().all(|(schema, name)| {
                matches!(schema.as_deref(), None | Some("pg_catalog"))
                    && READ_ONLY_FUNCTIONS.contains(&name.as_str())
            })
    }

    pub fn may_change_session(&self) -> bool {
        self.functions
            .iter()
            .any(|(_, name)| SESSION_FUNCTIONS.contains(&name.as_str()))
    }
}

/// Whether a statement may write (or lock rows, or call a function that
/// might): only plain reads are known not to. A node of a transaction that
/// ran none takes no part in its two-phase commit.
pub fn may_write(analysis: &Analysis) -> bool {
    match analysis {
        Analysis::Routable(shape) => !(shape.kind == Kind::Select && shape.multiplexable()),
        Analysis::Transaction(_)
        | Analysis::Savepoint(_)
        | Analysis::Admin(_)
        | Analysis::Deallocate { .. }
        | Analysis::SearchPath { temporary: false } => false,
        _ => true,
    }
}

/// `sql` is the statement as the client sent it and `normalized` its
/// literals (the shape was made from `normalized.key`).
pub fn route(
    shape: &Shape,
    sql: &str,
    normalized: &Normalized,
    map: &ClusterMap,
    session: &Session<'_>,
    parameters: Option<&Parameters<'_>>,
) -> Route {
    route_inner(shape, sql, normalized, map, session, parameters)
        .or_else(|| {
            // A read that read routes would split over nodes (a join with
            // a table they do not move, keys in both halves of a split)
            // still goes to one worker by the owners' map.
            if !(map.read_routes && session.outside_transaction) {
                return None;
            }
            let by_owners = Session {
                search_path: session.search_path,
                outside_transaction: false,
            };
            route_inner(shape, sql, normalized, map, &by_owners, parameters)
        })
        .unwrap_or(Route::Metadata)
}

#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod routing_id_tests;
#[cfg(test)]
mod tests;
