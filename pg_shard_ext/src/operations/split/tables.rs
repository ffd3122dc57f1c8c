//! The tables of a split: each source shard table and its two halves, as
//! the plan recorded them, and the ranges the halves take.

use crate::error::{Result, ShardError};
use crate::operations::group_shards::GroupShard;
use crate::operations::job::Job;
use crate::quote;
use pg_shard_core::KeyEncoding;

/// One table of the group: the shard being split and its two halves.
#[derive(Clone, Debug)]
pub(crate) struct SplitTable {
    pub(crate) source: GroupShard,
    /// Columns identifying a row (the primary key or replica identity
    /// index); empty under REPLICA IDENTITY FULL without a primary key:
    /// a row is then found by all its values, as PostgreSQL's own apply
    /// does.
    pub(crate) key_columns: Vec<String>,
    pub(crate) lower: Half,
    pub(crate) upper: Half,
}

#[derive(Clone, Debug)]
pub(crate) struct Half {
    pub(crate) shard_id: i64,
    pub(crate) name: String,
}

impl SplitTable {
    pub(crate) fn qualified(&self, half: &Half) -> String {
        quote::qualified(&self.source.schema, &half.name)
    }

    pub(crate) fn halves(&self) -> [&Half; 2] {
        [&self.lower, &self.upper]
    }

    /// The source table in a half's terms (the reverse apply's one
    /// destination).
    pub(crate) fn source_half(&self) -> Half {
        Half {
            shard_id: self.source.shard_id,
            name: self.source.name.clone(),
        }
    }

    /// A half as a shard table of the group.
    pub(crate) fn half_shard(&self, half: &Half) -> GroupShard {
        GroupShard {
            shard_id: half.shard_id,
            schema: self.source.schema.clone(),
            name: half.name.clone(),
            table_name: self.source.table_name.clone(),
            dist_column: self.source.dist_column.clone(),
        }
    }
}

/// The split's ranges and how keys are read.
pub(crate) struct Ranges {
    pub(crate) range_start: i64,
    pub(crate) range_end: i64,
    /// First keyspace id (signed form) of the upper half.
    pub(crate) split_at: i64,
    pub(crate) encoding: KeyEncoding,
}

impl Ranges {
    pub(crate) fn load(job: &Job) -> Result<Ranges> {
        let split_at = job.split_at.ok_or_else(|| {
            ShardError::InvalidArgument(format!("split job {} has no split point", job.job_id))
        })?;
        // Once published, the group holds the lower half and a new group
        // starting at the split point the upper one.
        let row = crate::spi::connect(|client| -> Result<Option<(i64, i64, String)>> {
            let rows = client.select(
                "SELECT g.range_start, \
                        coalesce((SELECT u.range_end FROM pg_shard.shard_group u \
                                   WHERE u.colocation_id = g.colocation_id AND u.range_start = $2 \
                                     AND g.range_end = $2 - 1), g.range_end), \
                        c.key_encoding \
                 FROM pg_shard.shard_group g JOIN pg_shard.colocation_group c USING (colocation_id) \
                 WHERE g.shard_group_id = $1",
                Some(1),
                &[job.shard_group_id.into(), split_at.into()],
            )?;
            let Some(row) = rows.into_iter().next() else {
                return Ok(None);
            };
            Ok(Some((
                row.get::<i64>(1)?.unwrap_or_default(),
                row.get::<i64>(2)?.unwrap_or_default(),
                row.get::<String>(3)?.unwrap_or_default(),
            )))
        })?;
        let (range_start, range_end, encoding) = row.ok_or_else(|| {
            ShardError::InvalidArgument(format!("shard group {} is gone", job.shard_group_id))
        })?;
        let encoding = KeyEncoding::from_name(&encoding).ok_or_else(|| {
            ShardError::InvalidArgument(format!("unknown key encoding {encoding}"))
        })?;
        Ok(Ranges {
            range_start,
            range_end,
            split_at,
            encoding,
        })
    }

    /// Whether the key (text form) belongs to the upper half.
    pub(crate) fn upper(&self, key: &str) -> Result<bool> {
        let id = self.encoding.keyspace_id_of_text_form(key).ok_or_else(|| {
            ShardError::InvalidArgument(format!("cannot read distribution key {key:?}"))
        })?;
        Ok(id.to_sql() >= self.split_at)
    }
}

/// The group's tables with their halves, as the plan recorded them.
pub(crate) fn split_tables(job: &Job) -> Result<Vec<SplitTable>> {
    crate::spi::connect(|client| {
        let mut tables = Vec::new();
        for row in client.select(
            "SELECT h.source_id, h.schema, h.source_name, h.table_name, h.dist_column, \
                    h.key_columns, h.lower_id, h.lower_name, h.upper_id, h.upper_name \
             FROM pg_shard.job j, jsonb_to_recordset(j.resources->'halves') AS h( \
                  source_id bigint, schema text, source_name text, table_name text, \
                  dist_column text, key_columns text[], lower_id bigint, lower_name text, \
                  upper_id bigint, upper_name text) \
             WHERE j.job_id = $1 ORDER BY h.source_id",
            None,
            &[job.job_id.into()],
        )? {
            tables.push(SplitTable {
                source: GroupShard {
                    shard_id: row.get::<i64>(1)?.unwrap_or_default(),
                    schema: row.get::<String>(2)?.unwrap_or_default(),
                    name: row.get::<String>(3)?.unwrap_or_default(),
                    table_name: row.get::<String>(4)?.unwrap_or_default(),
                    dist_column: row.get::<String>(5)?,
                },
                key_columns: row.get::<Vec<String>>(6)?.unwrap_or_default(),
                lower: Half {
                    shard_id: row.get::<i64>(7)?.unwrap_or_default(),
                    name: row.get::<String>(8)?.unwrap_or_default(),
                },
                upper: Half {
                    shard_id: row.get::<i64>(9)?.unwrap_or_default(),
                    name: row.get::<String>(10)?.unwrap_or_default(),
                },
            });
        }
        Ok(tables)
    })
}

/// Every table's halves, qualified.
pub(crate) fn qualified_halves(tables: &[SplitTable]) -> Vec<String> {
    tables
        .iter()
        .flat_map(|t| t.halves().map(|h| t.qualified(h)))
        .collect()
}

/// Every table's halves as shard tables of the group.
pub(crate) fn half_shards(tables: &[SplitTable]) -> Vec<GroupShard> {
    tables
        .iter()
        .flat_map(|t| t.halves().map(|h| t.half_shard(h)))
        .collect()
}

/// Every table's source shard.
pub(crate) fn source_shards(tables: &[SplitTable]) -> Vec<GroupShard> {
    tables.iter().map(|t| t.source.clone()).collect()
}

/// The node's side of a split's cutover (and of its revert, the other
/// way), committing the lock holder's transaction: `last_writes` (the
/// last changes, [`super::stream::Streamed::finish`]; may be empty),
/// shards `retire` retired and shards `activate` active at the map
/// `version`; then the node's WAL position, returned. Every write of
/// `activate` committed after it is the new owners': the last writes
/// commit before it, and nothing else writes those shards before the map
/// that names them is published.
pub(crate) fn hand_over_script(
    last_writes: &str,
    retire: &[GroupShard],
    activate: &[GroupShard],
    version: i64,
) -> String {
    use crate::operations::group_shards::shard_id_list;
    format!(
        "{last_writes}\
         UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id IN ({});\n\
         UPDATE pg_shard.local_shard SET state = 'active', epoch = {version} WHERE shard_id IN ({});\n\
         COMMIT;\n\
         SELECT pg_current_wal_insert_lsn()::text",
        shard_id_list(retire),
        shard_id_list(activate),
    )
}
