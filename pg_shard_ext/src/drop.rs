//! DROP TABLE of a distributed or reference table: its shards go with it.
//!
//! A `sql_drop` event trigger (sql/pg_shard_api.sql) calls
//! `pg_shard.drop_shards_internal` for every dropped table the catalog
//! knows, inside the DROP's transaction: the shard tables are dropped on the
//! workers in remote transactions that commit with it, the catalog rows go,
//! and the map version moves. A worker that cannot be reached makes the DROP
//! fail, with nothing changed.

use crate::catalog;
use crate::error::{OrReport, Result};
use crate::remote::{in_transaction, remote_error};
use pgrx::prelude::*;

#[pg_extern(schema = "pg_shard")]
fn drop_shards_internal(table_oid: pg_sys::Oid) {
    drop_shards(table_oid).or_report()
}

pub(crate) fn drop_shards(relid: pg_sys::Oid) -> Result<()> {
    let Some(table) = catalog::logical_table(relid)? else {
        return Ok(());
    };
    catalog::bump_map_version()?;
    let by_node = catalog::shards_by_node(Some(relid))?;
    for (node, shards) in by_node.values() {
        let ids: Vec<String> = shards.iter().map(|(id, _)| id.to_string()).collect();
        let names: Vec<&str> = shards.iter().map(|(_, name)| name.as_str()).collect();
        let script = format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id IN ({});\n\
             DROP TABLE IF EXISTS {}",
            ids.join(", "),
            names.join(", ")
        );
        in_transaction(node, |client| {
            client
                .batch_execute(&script)
                .map_err(|e| remote_error(node, &e))
        })?;
    }

    Spi::run_with_args(
        "DELETE FROM pg_shard.shard WHERE table_rel = $1",
        &[relid.into()],
    )?;
    Spi::run_with_args(
        "DELETE FROM pg_shard.logical_table WHERE table_rel = $1",
        &[relid.into()],
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
        Spi::run_with_args(
            &format!("{statement}{UNUSED_GROUP}"),
            &[table.colocation_id.into()],
        )?;
    }
    Ok(())
}
