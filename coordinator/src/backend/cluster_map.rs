//! What the coordinator knows of one database's shard map: the nodes,
//! the distributed and reference tables, which node owns each range (and,
//! while a reads-first job waits, which serves its reads), looked up by
//! the names statements use.

use crate::backend::connection::ServerAddress;
use pg_shard_core::{KeyEncoding, ShardMap};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MapError {
    #[error("cannot read the shard map: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("the shard map of table {0} is invalid: {1}")]
    Invalid(String, pg_shard_core::ShardMapError),
    #[error("table {0} has unknown key encoding {1:?}")]
    Encoding(String, String),
}

impl MapError {
    /// The metadata node could not be reached or went away (down, starting
    /// up after a crash, shutting down): nothing is known about the map,
    /// and the one in hand stays the best guess (the shards' guards refuse
    /// what it gets wrong).
    pub fn metadata_unreachable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            MapError::Query(e) => match e.code() {
                None => true,
                Some(code) => [
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::TOO_MANY_CONNECTIONS,
                ]
                .contains(code),
            },
            _ => false,
        }
    }
}

pub type NodeId = i32;

#[derive(Debug, Clone)]
pub struct Node {
    pub address: ServerAddress,
}

/// Where one range of a table lives.
#[derive(Debug, Clone)]
pub struct ShardPlacement {
    pub shard_id: i64,
    /// Quoted `"schema"."table"` of the shard table on its worker.
    pub qualified_name: String,
    pub node: NodeId,
}

#[derive(Debug, Clone)]
pub enum TableKind {
    Distributed {
        column: String,
        encoding: KeyEncoding,
        shards: ShardMap<ShardPlacement>,
        /// While a reads-first move or split has switched reads of a range
        /// to its new copy: the map for reads that run on their own (the
        /// new copy's ranges in place of the owner's); None otherwise.
        reads: Option<ShardMap<ShardPlacement>>,
    },
    /// A copy on every node: shard table name per node.
    Reference { copies: HashMap<NodeId, String> },
}

#[derive(Debug, Clone)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub kind: TableKind,
    pub columns: Vec<String>,
    /// Columns whose value the metadata node fills in when an INSERT omits
    /// them (defaults, identity, generated): such INSERTs are not routed.
    pub filled_columns: HashSet<String>,
    /// Generated columns (not in a COPY's data; each node computes them).
    pub generated_columns: HashSet<String>,
    /// A column of self-routing ids (pg_shard.set_routing_id): `column =
    /// id` routes to the shard of the prefix the id carries.
    pub routing_column: Option<String>,
    /// Its lookup tables (pg_shard.create_lookup), one per column.
    pub lookups: Vec<Lookup>,
    /// Whether it is a lookup table itself.
    pub is_lookup: bool,
}

impl Table {
    /// Writes of a table with lookups go to the metadata node, which keeps
    /// the lookups in the same transaction; so do writes of a lookup table
    /// (refused there).
    pub fn writes_via_metadata(&self) -> bool {
        self.is_lookup || !self.lookups.is_empty()
    }
}

/// A lookup table of a column: value → keyspace id of the row's key.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub column: String,
    /// The lookup table, by (schema, name).
    pub table: (String, String),
}

#[derive(Debug, Default)]
pub struct ClusterMap {
    pub version: i64,
    pub nodes: HashMap<NodeId, Node>,
    /// By (schema, name).
    pub tables: HashMap<(String, String), Arc<Table>>,
    /// Functions of pg_catalog: calls to them can run on any node (read
    /// on a first load and kept by the reloads that follow a version).
    pub catalog_functions: Arc<HashSet<String>>,
    /// Other relations named like a distributed or reference table, by
    /// (schema, name): one in the user's own schema shadows `public`.
    pub same_names: HashSet<(String, String)>,
    /// Whether some table has a reads map (a reads-first job waits).
    pub read_routes: bool,
}

impl ClusterMap {
    /// A table by its name as written: qualified, or looked up along the
    /// session's `search_path` (its schemas, [`crate::router::search_path`]) as the
    /// server would: pg_catalog first unless listed, and the first schema
    /// with a relation of that name decides (None when that relation is not
    /// a distributed or reference table).
    pub fn table(
        &self,
        schema: Option<&str>,
        name: &str,
        search_path: &[String],
    ) -> Option<&Arc<Table>> {
        // Looked up without copying the names: this runs for every routed
        // statement.
        if let Some(schema) = schema {
            return self.tables.get(&(schema, name) as &dyn NamePair);
        }
        let implicit = (!search_path.iter().any(|s| s == "pg_catalog")).then_some("pg_catalog");
        for schema in implicit
            .into_iter()
            .chain(search_path.iter().map(String::as_str))
        {
            let key = &(schema, name) as &dyn NamePair;
            if let Some(table) = self.tables.get(key) {
                return Some(table);
            }
            if self.same_names.contains(key) {
                return None;
            }
        }
        None
    }
}

/// A (schema, name) pair, owned or borrowed: the maps keyed by owned
/// pairs are searched with borrowed ones.
trait NamePair {
    fn pair(&self) -> (&str, &str);
}

impl NamePair for (String, String) {
    fn pair(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl NamePair for (&str, &str) {
    fn pair(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn NamePair + 'a> for (String, String) {
    fn borrow(&self) -> &(dyn NamePair + 'a) {
        self
    }
}

// Hashes as (String, String) does (a String hashes as its str), as Borrow
// requires.
impl std::hash::Hash for dyn NamePair + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pair().hash(state)
    }
}

impl PartialEq for dyn NamePair + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.pair() == other.pair()
    }
}

impl Eq for dyn NamePair + '_ {}
