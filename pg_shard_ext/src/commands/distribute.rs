//! Turning a table into a distributed or a reference table:
//! `pg_shard.create_distributed_table` and `pg_shard.create_reference_table`.

use crate::error::{OrReport, Result, ShardError};
use crate::keyspace::{key_encoding_of, type_name};
use crate::metadata::catalog::{self, ColocationGroup, ShardGroup};
use crate::metadata::routing_table::{self, Partition};
use crate::metadata::{LogicalTable, Node, DISTRIBUTED};
use crate::operations::data_copy::{self, ShardTarget};
use crate::quote;
use crate::shard_ddl::{shard_table_name, TableShape};
use crate::transaction::remote::{run_in_transaction, run_in_transactions, scripts_by_node};
use crate::worker::fencing::guard_trigger_ddl;
use pg_shard_core::range::{equal_ranges, KeyRange};
use pg_shard_core::{KeyEncoding, KeyspaceId, ShardMap};
use pgrx::prelude::*;

const DEFAULT_SHARD_COUNT: i32 = 32;

/// Called by the SQL function pg_shard.create_distributed_table (sql/pg_shard_api.sql).
#[pg_extern(schema = "pg_shard")]
fn create_distributed_table_internal(
    table_oid: pg_sys::Oid,
    distribution_column: &str,
    shard_count: Option<i32>,
    colocate_with: Option<&str>,
) {
    crate::access::require_granted(
        "pg_shard.create_distributed_table(regclass, text, integer, text)",
    )
    .or_report();
    distribute_table(
        table_oid,
        distribution_column,
        shard_count,
        colocate_with.unwrap_or("default"),
    )
    .or_report()
}

/// Called by the SQL function pg_shard.create_reference_table.
#[pg_extern(schema = "pg_shard")]
fn create_reference_table_internal(table_oid: pg_sys::Oid) {
    crate::access::require_granted("pg_shard.create_reference_table(regclass)").or_report();
    make_reference_table(table_oid).or_report()
}

/// Distributes `relid` by `column` in a co-location group of its own (a
/// lookup table, `commands::lookup`).
pub(crate) fn distribute_own_group(
    relid: pg_sys::Oid,
    column: &str,
    shard_count: Option<i32>,
) -> Result<()> {
    distribute_table(relid, column, shard_count, "none")
}

/// Lock the table against writes and reads while its rows move, then check
/// that it can be distributed at all. Locking first means the shape read
/// here is the shape the shards get.
fn load_and_check(relid: pg_sys::Oid) -> Result<TableShape> {
    // Before the lock, as PostgreSQL checks a table's owner: a role may not
    // hold up tables it could not change.
    crate::access::require_table_owner(relid, &crate::spi::caller_relation_name(relid))?;
    // SAFETY: LockRelationOid takes a heavyweight lock held to transaction
    // end; it errors (through pgrx's FFI guard) if the lock cannot be had.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE) };
    require_read_committed()?;
    let shape = TableShape::load(relid)?;
    let table = shape.display_name.clone();
    let unsupported = |reason: &str| ShardError::UnsupportedTable {
        table: table.clone(),
        reason: reason.to_string(),
    };
    if LogicalTable::of(relid)?.is_some() {
        return Err(ShardError::AlreadyDistributed(table));
    }
    match shape.relkind {
        'r' => {}
        'p' => return Err(unsupported("partitioned tables cannot be distributed yet")),
        _ => return Err(unsupported("only ordinary tables can be distributed")),
    }
    if shape.persistence == 't' {
        return Err(unsupported("temporary tables cannot be distributed"));
    }
    if matches!(
        shape.schema.as_str(),
        "pg_shard" | "pg_catalog" | "information_schema"
    ) {
        return Err(unsupported(
            "system and pg_shard tables cannot be distributed",
        ));
    }
    if shape.row_security {
        return Err(unsupported(
            "tables with row-level security cannot be distributed yet (policies are not \
             carried over to shards)",
        ));
    }
    if shape.in_inheritance_tree {
        return Err(unsupported(
            "tables with inheritance parents or children cannot be distributed",
        ));
    }
    if !shape.foreign_keys.is_empty() {
        return Err(unsupported(&format!(
            "foreign keys to or from distributed and reference tables are not supported yet; \
             drop {} first",
            shape.foreign_keys.join(", ")
        )));
    }
    if !shape.has_replica_identity() {
        return Err(ShardError::NoReplicaIdentity(table));
    }
    Ok(shape)
}

/// Moving rows needs to see every row committed before the table was locked:
/// a REPEATABLE READ or SERIALIZABLE snapshot may be older than the lock.
pub(crate) fn require_read_committed() -> Result<()> {
    // SAFETY: reads the current transaction's isolation level (a global).
    let level = unsafe { pg_sys::XactIsoLevel };
    if level >= pg_sys::XACT_REPEATABLE_READ as i32 {
        return Err(ShardError::NeedsReadCommitted);
    }
    Ok(())
}

fn distribute_table(
    relid: pg_sys::Oid,
    column: &str,
    shard_count: Option<i32>,
    colocate_with: &str,
) -> Result<()> {
    let shape = load_and_check(relid)?;
    let key_column = shape
        .column(column)
        .ok_or_else(|| ShardError::UnknownColumn {
            table: shape.display_name.clone(),
            column: column.to_string(),
        })?;
    let encoding =
        key_encoding_of(key_column.type_oid).ok_or_else(|| ShardError::UnsupportedKeyType {
            column: column.to_string(),
            type_name: type_name(key_column.type_oid),
        })?;
    if let Some(count) = shard_count {
        // Validate before anything is written.
        equal_ranges(count as i64)?;
    }
    routing_table::check_replaceable(relid, &shape)?;
    let workers = catalog::active_nodes()?;
    if workers.is_empty() {
        return Err(ShardError::NoWorkers);
    }

    // Bumping locks the map version row, which serializes concurrent calls:
    // two tables of the same shape cannot each start their own group.
    let version = catalog::bump_map_version()?;
    let group = choose_colocation_group(&shape, encoding, shard_count, colocate_with)?;
    let colocation_id = match group {
        Some(group) => {
            refuse_during_job(&shape, group.colocation_id)?;
            group.colocation_id
        }
        None => create_colocation_group(
            "distributed",
            shard_count.unwrap_or(DEFAULT_SHARD_COUNT),
            Some(encoding.name()),
            &workers,
        )?,
    };
    catalog::insert_logical_table(relid, "distributed", Some(column), colocation_id)?;
    for (kind, name, definition, unique_index) in shape.constraint_rows() {
        catalog::insert_table_constraint(relid, kind, &name, &definition, unique_index)?;
    }

    let mut entries = Vec::new();
    let mut partitions = Vec::new();
    let mut shards = Vec::new();
    for group in catalog::shard_groups(colocation_id)? {
        let shard = new_shard(&shape, relid, &group, Some(column), version, false)?;
        let target = shard.target.clone();
        shards.push(shard);
        let range = KeyRange::new(
            KeyspaceId::from_sql(group.range_start),
            KeyspaceId::from_sql(group.range_end),
        )?;
        partitions.push(Partition {
            shard_id: target.shard_id,
            shard_name: target.shard_name.clone(),
            node_id: group.node.node_id,
            range_start: group.range_start,
            range_end: group.range_end,
        });
        entries.push((range, target));
    }
    let map = ShardMap::new(version, entries)?;
    create_shards(&shards)?;
    data_copy::copy_into_shards(relid, &shape, column, &map)?;
    finish_shards(&shards)?;
    crate::commands::ddl::run_internal(&format!("TRUNCATE ONLY {}", shape.qualified()))?;
    // pg_shard's own DDL (foreign partitions in pg_shard_partitions on its
    // servers); the new table gets the owner and grants of the old.
    catalog::as_extension_owner(|| {
        routing_table::replace_with_routing_table(relid, &shape, column, &partitions)
    })
}

/// A job moving or splitting one of the group's shard groups reads the
/// group's tables when it plans and at every step: a table joining in the
/// middle would have no copy on the job's new placement. Waits for a
/// `queue_job` of the group in progress (its lock), then refuses while a
/// job of the group is unfinished.
fn refuse_during_job(shape: &TableShape, colocation_id: i32) -> Result<()> {
    crate::spi::run_with_args(
        "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_shard co-location'), $1)",
        &[colocation_id.into()],
    )?;
    let job = crate::spi::query_one::<i64>(
        "SELECT min(j.job_id) FROM pg_shard.job j JOIN pg_shard.shard_group g \
             ON g.shard_group_id = j.shard_group_id \
             OR g.shard_group_id = (j.resources->>'upper_group')::bigint \
         WHERE g.colocation_id = $1 AND j.state IN ('queued', 'running')",
        &[colocation_id.into()],
    )?;
    match job {
        Some(job) => Err(ShardError::DistributeDuringJob {
            table: shape.display_name.clone(),
            job,
        }),
        None => Ok(()),
    }
}

/// The co-location group a new distributed table joins, or None for a new one.
fn choose_colocation_group(
    shape: &TableShape,
    encoding: KeyEncoding,
    shard_count: Option<i32>,
    colocate_with: &str,
) -> Result<Option<ColocationGroup>> {
    match colocate_with.to_ascii_lowercase().as_str() {
        "none" => Ok(None),
        "default" => catalog::default_colocation_group(
            shard_count.unwrap_or(DEFAULT_SHARD_COUNT),
            encoding.name(),
        ),
        _ => {
            // A name the user wrote: the caller's search_path.
            let other_oid = crate::spi::caller_relation(colocate_with)
                .ok_or_else(|| ShardError::UnknownTable(colocate_with.to_string()))?;
            let colocation_error = |reason: String| ShardError::Colocation {
                table: shape.display_name.clone(),
                other: colocate_with.to_string(),
                reason,
            };
            let other = LogicalTable::of(other_oid)?
                .filter(|t| t.kind == DISTRIBUTED)
                .ok_or_else(|| ShardError::NotDistributed(colocate_with.to_string()))?;
            let group = catalog::colocation_group(other.colocation_id)?.ok_or_else(|| {
                colocation_error("its co-location group is missing from the catalog".into())
            })?;
            if group.key_encoding.as_deref() != Some(encoding.name()) {
                return Err(colocation_error(format!(
                    "distribution keys of different types ({} and {}) hash differently",
                    encoding.name(),
                    group.key_encoding.as_deref().unwrap_or("none"),
                )));
            }
            if let Some(count) = shard_count {
                if count != group.shard_count {
                    return Err(colocation_error(format!(
                        "shard_count {count} differs from its {} shards",
                        group.shard_count
                    )));
                }
            }
            Ok(Some(group))
        }
    }
}

/// A new co-location group with `shard_count` equal ranges placed round-robin
/// over `workers` (a reference group: one range placed on every worker).
fn create_colocation_group(
    kind: &str,
    shard_count: i32,
    key_encoding: Option<&str>,
    workers: &[Node],
) -> Result<i32> {
    let colocation_id = catalog::insert_colocation_group(kind, shard_count, key_encoding)?;
    for (index, range) in equal_ranges(shard_count as i64)?.into_iter().enumerate() {
        let shard_group_id =
            catalog::insert_shard_group(colocation_id, range.start.to_sql(), range.end.to_sql())?;
        if kind == "reference" {
            for worker in workers {
                catalog::insert_placement(shard_group_id, worker.node_id)?;
            }
        } else {
            let worker = &workers[index % workers.len()];
            catalog::insert_placement(shard_group_id, worker.node_id)?;
        }
    }
    Ok(colocation_id)
}

/// A shard table to make: where it goes, the statements that make it and
/// those that add its indexes and guard triggers on its node.
struct NewShard {
    target: ShardTarget,
    /// The table and the worker's ownership record ([`create_shards`]).
    create: String,
    /// Its indexes and guard triggers, for once its rows are in.
    after_rows: String,
}

/// The shard of `shape` in `group`, recorded in the catalog, with the
/// statements that make it on the group's node: the table and the worker's
/// ownership record ([`create_shards`]). Its indexes and guard
/// triggers come once its rows are in ([`finish_shards`]): until the
/// transaction commits nobody else sees the table; an index built over the
/// rows at once is a sorted build, not one insertion per row; and the rows
/// were routed by the same keyspace ids the row guard computes, which would
/// only slow their COPY (a row trigger also keeps COPY from inserting in
/// batches).
fn new_shard(
    shape: &TableShape,
    relid: pg_sys::Oid,
    group: &ShardGroup,
    dist_column: Option<&str>,
    epoch: i64,
    replace_leftover: bool,
) -> Result<NewShard> {
    let (shard_id, shard_name) = match catalog::shard_in_group(relid, group.shard_group_id)? {
        // A reference shard has one id and name on every node.
        Some((shard_id, _, name)) => (shard_id, name),
        None => {
            let shard_id = catalog::next_shard_id()?;
            let name = shard_table_name(&shape.name, shard_id);
            catalog::insert_shard(shard_id, relid, group.shard_group_id, &shape.schema, &name)?;
            (shard_id, name)
        }
    };
    let qualified_shard = quote::qualified(&shape.schema, &shard_name);
    let mut statements = Vec::new();
    if replace_leftover {
        // A reference copy keeps its shard id on every node, so an earlier
        // attempt whose local commit failed may have left it behind.
        statements.push(format!(
            "DELETE FROM pg_shard.local_shard WHERE shard_id = {shard_id}"
        ));
        statements.push(format!("DROP TABLE IF EXISTS {qualified_shard}"));
    }
    let ddl = shape.shard_table_ddl_parts(&shard_name, shard_id);
    statements.extend(ddl.table);
    statements.extend(ddl.ownership);
    let mut after_rows = ddl.indexes;
    after_rows.extend(guard_trigger_ddl(
        &qualified_shard,
        dist_column,
        group.range_start,
        group.range_end,
    ));
    statements.push(crate::worker::local_shard::record_sql(
        &qualified_shard,
        shard_id,
        dist_column,
        (group.range_start, group.range_end),
        "active",
        epoch,
    ));
    Ok(NewShard {
        create: statements.join(";\n"),
        target: ShardTarget {
            node: group.node.clone(),
            qualified_shard,
            shard_id,
            shard_name,
        },
        after_rows: after_rows.join(";\n"),
    })
}

/// Make `shards` on their nodes: one script per node, every node at once,
/// in the remote transactions that will fill and finish them.
fn create_shards(shards: &[NewShard]) -> Result<()> {
    run_in_transactions(&scripts_by_node(
        shards
            .iter()
            .map(|shard| (shard.target.node.clone(), &shard.create)),
    ))
}

/// The indexes and guard triggers of shards whose rows are in: one script
/// per node, every node at once, in the remote transactions that made them.
fn finish_shards(shards: &[NewShard]) -> Result<()> {
    run_in_transactions(&scripts_by_node(
        shards
            .iter()
            .map(|shard| (shard.target.node.clone(), &shard.after_rows)),
    ))
}

/// Writes to the reference table on the metadata node reach every copy.
fn replicate_local_writes(shape: &TableShape) -> Result<()> {
    for statement in crate::commands::reference::replication_trigger_ddl(&shape.qualified()) {
        crate::spi::run(&statement)?;
    }
    Ok(())
}

fn make_reference_table(relid: pg_sys::Oid) -> Result<()> {
    let shape = load_and_check(relid)?;
    let workers = catalog::active_nodes()?;
    if workers.is_empty() {
        return Err(ShardError::NoWorkers);
    }
    let version = catalog::bump_map_version()?;
    let colocation_id = match catalog::reference_group()? {
        Some(colocation_id) => colocation_id,
        None => create_colocation_group("reference", 1, None, &workers)?,
    };
    catalog::insert_logical_table(relid, "reference", None, colocation_id)?;
    let mut shards = Vec::new();
    for group in catalog::shard_groups(colocation_id)? {
        shards.push(new_shard(&shape, relid, &group, None, version, false)?);
    }
    create_shards(&shards)?;
    let targets: Vec<ShardTarget> = shards.iter().map(|s| s.target.clone()).collect();
    data_copy::copy_into_all(relid, &shape, &targets)?;
    finish_shards(&shards)?;
    // The rows stay on the metadata node too: reference tables are read locally.
    replicate_local_writes(&shape)
}

/// Give a newly added node a copy of every reference table.
pub(crate) fn replicate_reference_tables(node: &Node) -> Result<usize> {
    let tables = catalog::reference_tables()?;
    if !tables.is_empty() {
        require_read_committed()?;
    }
    if tables.is_empty() {
        return Ok(0);
    }
    let version = catalog::bump_map_version()?;
    let mut placed_groups = Vec::new();
    let mut foreign_keys = Vec::new();
    for (relid, shard_group_id) in &tables {
        if !placed_groups.contains(shard_group_id) {
            catalog::insert_placement(*shard_group_id, node.node_id)?;
            placed_groups.push(*shard_group_id);
        }
        let shape = TableShape::load(*relid)?;
        crate::spi::run(&format!(
            "LOCK TABLE ONLY {} IN SHARE MODE",
            shape.qualified()
        ))?;
        let full = KeyRange::FULL;
        let group = ShardGroup {
            shard_group_id: *shard_group_id,
            range_start: full.start.to_sql(),
            range_end: full.end.to_sql(),
            node: node.clone(),
        };
        let shard = new_shard(&shape, *relid, &group, None, version, true)?;
        create_shards(std::slice::from_ref(&shard))?;
        let copy = shard.target.qualified_shard.clone();
        data_copy::copy_into_all(*relid, &shape, std::slice::from_ref(&shard.target))?;
        finish_shards(std::slice::from_ref(&shard))?;
        // Foreign keys among reference tables once every copy has its rows.
        let copies = crate::commands::ddl::copy_names()?;
        foreign_keys.extend(
            shape.foreign_key_ddl(&copy, &|_| true, &|definition: &str| {
                crate::commands::ddl::references_copies(definition, &copies)
            }),
        );
    }
    if !foreign_keys.is_empty() {
        let script = foreign_keys.join(";\n");
        run_in_transaction(node, &script)?;
    }
    Ok(tables.len())
}
