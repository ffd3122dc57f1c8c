//! DROP TABLE of a distributed or reference table: its shards go with it.
//!
//! A `sql_drop` event trigger (sql/pg_shard_api.sql) calls
//! `pg_shard.drop_shards_internal` with the dropped tables the catalog
//! knows, inside the DROP's transaction: the shard tables are dropped on the
//! workers in remote transactions that commit with it (one DROP per node, so
//! shard tables with foreign keys among them go together), the catalog rows
//! go, and the map version moves. A worker that cannot be reached makes the
//! DROP fail, with nothing changed.

use crate::error::{OrReport, Result, ShardError};
use crate::metadata::{catalog, LogicalTable};
use crate::transaction::remote::run_in_transaction;
use pgrx::prelude::*;

/// `table_names`: the dropped tables' names, in the order of `table_oids`
/// (their pg_class rows are gone).
#[pg_extern(schema = "pg_shard")]
fn drop_shards_internal(table_oids: Vec<pg_sys::Oid>, table_names: Vec<String>) {
    let tables: Vec<(pg_sys::Oid, String)> = table_oids.into_iter().zip(table_names).collect();
    drop_shards(&tables).or_report()
}

/// Drop the shards and catalog rows of the logical tables among `dropped`
/// (OID, name).
pub(crate) fn drop_shards(dropped: &[(pg_sys::Oid, String)]) -> Result<()> {
    let mut tables = Vec::new();
    for (relid, _) in dropped {
        if let Some(table) = LogicalTable::of(*relid)? {
            tables.push((*relid, table));
        }
    }
    if tables.is_empty() {
        return Ok(());
    }
    // PostgreSQL cannot see these keys (they live on the shards): refuse as
    // it would. (Then CASCADE on the workers only drops keys PostgreSQL
    // dropped here too: those of reference tables' copies, after a DROP …
    // CASCADE.)
    let oids: Vec<pg_sys::Oid> = dropped.iter().map(|(relid, _)| *relid).collect();
    let names: Vec<String> = dropped.iter().map(|(_, name)| name.clone()).collect();
    let referencing = crate::spi::query_one::<String>(
        "SELECT string_agg(format('table %s: foreign key %I of table %s references it', \
                                  d.name, c.name, c.table_rel), '; ') \
         FROM pg_shard.table_constraint c \
         JOIN unnest($1::oid[], $2::text[]) AS d(relid, name) ON d.relid = c.referenced_rel \
         WHERE c.kind = 'f' AND NOT c.table_rel::oid = ANY ($1)",
        &[oids.into(), names.into()],
    )?;
    if let Some(referencing) = referencing {
        return Err(ShardError::DependentObjects(referencing));
    }
    catalog::bump_map_version()?;
    let relids: Vec<pg_sys::Oid> = tables.iter().map(|(relid, _)| *relid).collect();
    for (node, shards) in catalog::shards_by_node(Some(&relids))?.values() {
        let names: Vec<&str> = shards.iter().map(|(_, name)| name.as_str()).collect();
        // (The worker's event trigger forgets the dropped shards' records.)
        let script = format!("DROP TABLE IF EXISTS {} CASCADE", names.join(", "));
        run_in_transaction(node, &script)?;
    }

    for (relid, table) in &tables {
        catalog::write(
            "DELETE FROM pg_shard.shard WHERE table_rel = $1",
            &[(*relid).into()],
        )?;
        catalog::write(
            "DELETE FROM pg_shard.logical_table WHERE table_rel = $1",
            &[(*relid).into()],
        )?;
        // An empty co-location group goes too: otherwise a later table could
        // join it by default, and an empty reference group would miss nodes
        // added in the meantime.
        const UNUSED_GROUP: &str =
            "NOT EXISTS (SELECT 1 FROM pg_shard.logical_table t WHERE t.colocation_id = $1)";
        for statement in [
            "DELETE FROM pg_shard.placement p USING pg_shard.shard_group sg \
             WHERE p.shard_group_id = sg.shard_group_id AND sg.colocation_id = $1 AND ",
            "DELETE FROM pg_shard.shard_group WHERE colocation_id = $1 AND ",
            "DELETE FROM pg_shard.colocation_group WHERE colocation_id = $1 AND ",
        ] {
            catalog::write(
                &format!("{statement}{UNUSED_GROUP}"),
                &[table.colocation_id.into()],
            )?;
        }
    }
    Ok(())
}
