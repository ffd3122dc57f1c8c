//! A worker node as the catalog knows it, and the one place a node is read
//! from a row of `pg_shard.node`.

use crate::error::{Result, ShardError};
use pgrx::spi::SpiHeapTupleData;

/// A worker node as the catalog knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) node_id: i32,
    pub(crate) host: String,
    pub(crate) port: i32,
}

impl Node {
    /// The node in columns `first`, `first + 1` and `first + 2` (node_id,
    /// host, port; 1-based, as SPI numbers them) of `row`. The columns are
    /// NOT NULL in the catalog: a NULL means the query is wrong, and is an
    /// error rather than a node 0 at an empty host.
    pub(crate) fn from_row(row: &SpiHeapTupleData<'_>, first: usize) -> Result<Node> {
        let missing =
            |column: &str| ShardError::Internal(format!("a node row without its {column}"));
        Ok(Node {
            node_id: row.get::<i32>(first)?.ok_or_else(|| missing("node_id"))?,
            host: row
                .get::<String>(first + 1)?
                .ok_or_else(|| missing("host"))?,
            port: row.get::<i32>(first + 2)?.ok_or_else(|| missing("port"))?,
        })
    }

    /// Whether two records name the same server (a node being added has no id yet).
    pub(crate) fn same_server(&self, other: &Node) -> bool {
        self.host == other.host && self.port == other.port
    }

    pub(crate) fn label(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}
