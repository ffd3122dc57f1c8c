//! What a new map version changed, told to the coordinators with it: the
//! shards of the shard groups a move, a split or a revert rewrote, as they
//! are in the new version. A coordinator whose map is the version before
//! applies them without reading the catalog (the writers a cutover refused
//! wait for exactly that); any other reads the catalog, as it does for
//! every other change.

use crate::error::Result;
use crate::spi::query_one;

/// A NOTIFY payload must be shorter than 8000 bytes: a change that does
/// not fit is announced by its version alone.
const PAYLOAD_LIMIT: usize = 7900;

/// The payload announcing `version` on the `pg_shard_map` channel: the
/// version, then, when `groups` is not empty, a space and a JSON object
/// `{"tables": [...]}` with, for every distributed table of their
/// co-location group, its name, the keyspace range the groups cover, and
/// the shards that cover it now (`[range_start, range_end, shard_id,
/// node_id, shard_schema, shard_name]`, active placements first, as the
/// coordinator's full read orders them).
pub(crate) fn notification(version: i64, groups: &[i64]) -> Result<String> {
    if groups.is_empty() {
        return Ok(version.to_string());
    }
    let change = query_one::<String>(
        "SELECT jsonb_build_object('tables', coalesce(jsonb_agg(jsonb_build_object( \
                    'schema', n.nspname::text, 'name', c.relname::text, \
                    'start', r.range_start, 'end', r.range_end, \
                    'shards', (SELECT coalesce(jsonb_agg(jsonb_build_array( \
                                        sg.range_start, sg.range_end, s.shard_id, p.node_id, \
                                        s.shard_schema::text, s.shard_name::text) \
                                    ORDER BY p.state = 'active' DESC, sg.range_start), '[]'::jsonb) \
                               FROM pg_shard.shard s \
                               JOIN pg_shard.shard_group sg ON sg.shard_group_id = s.shard_group_id \
                               JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id \
                               WHERE s.table_rel = t.table_rel \
                                 AND s.shard_group_id = ANY($1) AND p.state <> 'retired'))), \
                '[]'::jsonb))::text \
         FROM (SELECT min(range_start) AS range_start, max(range_end) AS range_end, \
                      min(colocation_id) AS colocation_id \
               FROM pg_shard.shard_group WHERE shard_group_id = ANY($1)) r \
         JOIN pg_shard.logical_table t ON t.colocation_id = r.colocation_id \
         JOIN pg_catalog.pg_class c ON c.oid = t.table_rel \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE t.kind = 'distributed'",
        &[groups.to_vec().into()],
    )?;
    Ok(match change {
        Some(change) if change.len() + 24 < PAYLOAD_LIMIT => format!("{version} {change}"),
        _ => version.to_string(),
    })
}
