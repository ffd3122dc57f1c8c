//! The shard tables of the group a job moves or splits: reading them from
//! the catalog, and (re)creating or dropping them on a node.

use super::node_access::{connect, run_on};
use crate::error::Result;
use crate::metadata::Node;
use crate::quote;

/// One shard table of the group being moved.
#[derive(Clone, Debug)]
pub(crate) struct GroupShard {
    pub(crate) shard_id: i64,
    pub(crate) schema: String,
    pub(crate) name: String,
    pub(crate) table_name: String,
    pub(crate) dist_column: Option<String>,
}

impl GroupShard {
    pub(crate) fn qualified(&self) -> String {
        quote::qualified(&self.schema, &self.name)
    }
}

pub(crate) fn group_shards(shard_group_id: i64) -> Result<Vec<GroupShard>> {
    crate::spi::connect(|client| {
        let mut shards = Vec::new();
        for row in client.select(
            "SELECT s.shard_id, s.shard_schema, s.shard_name, \
                    (SELECT c.relname::text FROM pg_class c WHERE c.oid = s.table_rel), t.dist_column \
             FROM pg_shard.shard s JOIN pg_shard.logical_table t USING (table_rel) \
             WHERE s.shard_group_id = $1 ORDER BY s.shard_id",
            None,
            &[shard_group_id.into()],
        )? {
            shards.push(GroupShard {
                shard_id: row.get::<i64>(1)?.unwrap_or_default(),
                schema: row.get::<String>(2)?.unwrap_or_default(),
                name: row.get::<String>(3)?.unwrap_or_default(),
                table_name: row.get::<String>(4)?.unwrap_or_default(),
                dist_column: row.get::<String>(5)?,
            });
        }
        Ok(shards)
    })
}

/// The group's shard ids, as a SQL list.
pub(crate) fn shard_id_list(shards: &[GroupShard]) -> String {
    shards
        .iter()
        .map(|s| s.shard_id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The statements that (re)create a shard table of a job from its DDL, with
/// its statement guard and ownership record: frozen at epoch 0 until the job
/// publishes it, so nothing writes it but the job (whose sessions fire no
/// trigger), and readable for the verification. A leftover of an
/// interrupted attempt goes first.
pub(crate) fn frozen_shard_script(
    shard: &GroupShard,
    ddl: Vec<String>,
    range: (i64, i64),
) -> Vec<String> {
    let qualified = shard.qualified();
    let (range_start, range_end) = range;
    let mut script = vec![
        format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id = {}",
            shard.shard_id
        ),
        // CASCADE: a leftover's foreign keys may reference it.
        format!("DROP TABLE IF EXISTS {qualified} CASCADE"),
    ];
    script.extend(ddl);
    // The guards of the rows come with the indexes ([`row_guard_script`]).
    script.push(crate::worker::fencing::statement_guard_ddl(&qualified));
    script.push(format!(
        "INSERT INTO pg_shard.local_shard \
         (shard_rel, shard_id, dist_column, range_start, range_end, state, epoch) \
         VALUES ({}::regclass, {}, {}, {range_start}, {range_end}, 'frozen', 0)",
        quote::literal(&qualified),
        shard.shard_id,
        shard
            .dist_column
            .as_deref()
            .map_or_else(|| "NULL".to_string(), quote::literal),
    ));
    script
}

/// The guard triggers that check the rows written to a shard table of a job
/// against its range, made once the copy has filled it. Until then the
/// table is frozen, which the statement guard enforces, and the job's own
/// sessions fire no trigger; the transition table of the inserted rows'
/// guard would still collect every copied row (a fifth of the target's
/// COPY time).
pub(crate) fn row_guard_script(shard: &GroupShard, range: (i64, i64)) -> Vec<String> {
    let (range_start, range_end) = range;
    match shard.dist_column.as_deref() {
        Some(column) => crate::worker::fencing::column_guard_ddl(
            &shard.qualified(),
            column,
            range_start,
            range_end,
        ),
        None => Vec::new(),
    }
}

/// The triggers that keep the lookups of a job's new shard table
/// ([`crate::worker::lookup_changes`]), made with its row guards:
/// `source_shard_id` is the shard of the same table it copies.
pub(crate) fn lookup_trigger_script(
    source_shard_id: i64,
    shard: &GroupShard,
) -> Result<Vec<String>> {
    let Some(key) = shard.dist_column.as_deref() else {
        return Ok(Vec::new());
    };
    let Some(relid) = crate::spi::query_one::<pgrx::pg_sys::Oid>(
        "SELECT table_rel::oid FROM pg_shard.shard WHERE shard_id = $1",
        &[source_shard_id.into()],
    )?
    else {
        return Ok(Vec::new());
    };
    let mut script = Vec::new();
    for lookup in crate::lookups::catalog::lookups_of(relid)? {
        script.extend(crate::worker::lookup_changes::trigger_ddl(
            &shard.qualified(),
            lookup.lookup_id,
            &lookup.column,
            key,
        ));
    }
    Ok(script)
}

/// Drops the group's shard tables on `node` and their ownership records
/// (those matching `condition`, e.g. only the unpublished copies), in one
/// transaction.
pub(crate) fn drop_shard_tables(node: &Node, shards: &[GroupShard], condition: &str) -> Result<()> {
    let mut script = Vec::new();
    for shard in shards {
        script.push(format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id = {}{condition}",
            shard.shard_id
        ));
    }
    // One statement: the tables' foreign keys among them do not stand in
    // the way.
    let tables: Vec<String> = shards.iter().map(GroupShard::qualified).collect();
    if tables.is_empty() {
        return Ok(());
    }
    script.push(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));
    let mut client = connect(node)?;
    run_on(
        node,
        &mut client,
        &format!("BEGIN;\n{};\nCOMMIT", script.join(";\n")),
    )
}
