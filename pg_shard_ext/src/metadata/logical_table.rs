//! A distributed or reference table as recorded in `pg_shard.logical_table`:
//! the one type every subsystem reads it as.

use crate::error::{Result, ShardError};
use pgrx::prelude::*;

/// The catalog's `kind` of a distributed table (the other is `reference`).
pub(crate) const DISTRIBUTED: &str = "distributed";

/// A distributed (Some(dist_column)) or reference (None) table's identity.
#[derive(Clone, Debug)]
pub(crate) struct LogicalTable {
    pub(crate) relid: pg_sys::Oid,
    /// As PostgreSQL prints it for the caller, for messages.
    pub(crate) display: String,
    /// `distributed` or `reference`.
    pub(crate) kind: String,
    pub(crate) colocation_id: i32,
    pub(crate) dist_column: Option<String>,
    /// The column of self-routing ids (pg_shard.set_routing_id), if any.
    pub(crate) routing_column: Option<String>,
}

impl LogicalTable {
    /// The table `relid`, if it is distributed or a reference table.
    pub(crate) fn of(relid: pg_sys::Oid) -> Result<Option<LogicalTable>> {
        if relid == pg_sys::InvalidOid {
            return Ok(None);
        }
        let found = crate::spi::connect(|client| {
            let rows = client.select(
                "SELECT t.kind, t.colocation_id, t.dist_column, a.attname::text \
                 FROM pg_shard.logical_table t \
                 LEFT JOIN pg_catalog.pg_attribute a \
                   ON a.attrelid = t.table_rel AND a.attnum = t.routing_attnum \
                 WHERE t.table_rel = $1",
                Some(1),
                &[relid.into()],
            )?;
            let Some(row) = rows.into_iter().next() else {
                return Ok::<_, ShardError>(None);
            };
            Ok(Some((
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<i32>(2)?.unwrap_or_default(),
                row.get::<String>(3)?,
                row.get::<String>(4)?,
            )))
        })?;
        Ok(found.map(
            |(kind, colocation_id, dist_column, routing_column)| LogicalTable {
                relid,
                display: crate::spi::caller_relation_name(relid),
                kind,
                colocation_id,
                dist_column,
                routing_column,
            },
        ))
    }

    /// Whether it has a distribution column (a reference table has none).
    pub(crate) fn is_distributed(&self) -> bool {
        self.dist_column.is_some()
    }

    /// The refusal of a change of this table.
    pub(crate) fn refuse(&self, reason: impl Into<String>) -> ShardError {
        ShardError::UnsupportedSchemaChange {
            table: self.display.clone(),
            reason: reason.into(),
        }
    }

    /// Changes wait for no job: a move or split of the table would copy the
    /// old shape to its new shards.
    pub(crate) fn refuse_during_job(&self) -> Result<()> {
        let running = crate::spi::query_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_shard.job j \
                            JOIN pg_shard.shard s USING (shard_group_id) \
             WHERE s.table_rel = $1 AND j.state IN ('queued', 'running'))",
            &[self.relid.into()],
        )?
        .unwrap_or(false);
        if running {
            return Err(ShardError::SchemaChangeDuringJob(self.display.clone()));
        }
        Ok(())
    }

    /// The current role must own the table: for changes the metadata node
    /// does not run itself (a distributed table's indexes and constraints
    /// exist only on its shards), so PostgreSQL does not check that.
    pub(crate) fn require_owner(&self) -> Result<()> {
        crate::access::require_table_owner(self.relid, &self.display)
    }

    /// Take `mode` on the metadata node's table until the transaction ends.
    pub(crate) fn lock(&self, mode: u32) {
        // SAFETY: a heavyweight lock on an existing relation, held to
        // transaction end; an error is raised through pgrx's guard.
        unsafe { pg_sys::LockRelationOid(self.relid, mode as pg_sys::LOCKMODE) };
    }
}
