//! The pushdown class: a SELECT whose distributed tables are co-located
//! and joined on their distribution columns runs as one worker query per
//! shard group, on every node at once, and a final query on the metadata
//! node over their rows ([`super::combine`] splits the statement in two,
//! [`crate::executor::pushdown_scan`] runs it).
//!
//! The statement's FROM must be separable ([`super::separable`]); what the
//! top level does across shard groups (aggregates, DISTINCT, ORDER BY,
//! LIMIT) is done by the final query.
//!
//! Not (yet) pushed down: distributed tables in sublinks or CTEs, set
//! operations, window functions not partitioned by the distribution
//! column, statements inside a transaction block. Those take the
//! postgres_fdw path.

use super::computed_values::computed_here;
use super::partition_key::Busy;
use super::router::{calls_are_portable, client_statement, relation_kinds, Kind};
use super::separable::{is_distributed_entry, runs_whole, separable_from};
use super::shared_reads::{shared_reads, SharedRead};
use super::worker_query::{qualified_name, worker_query, ShardRelation};
use crate::error::{Result, ShardError};
use crate::executor::moved_shards::ShardGroupTargets;
use crate::executor::pushdown_scan::{NodeTask, PushdownPlan};
use crate::metadata::shard_lookup::{
    at_version, latest_shard_ranges, reference_copy, shard_ranges, Shard,
};
use crate::parse_tree::{contents, with_parameter_values, TreeContents};
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::collections::{HashMap, HashSet};

static ENABLE_PUSHDOWN: GucSetting<bool> = GucSetting::<bool>::new(true);

pub(crate) fn register_gucs() {
    GucRegistry::define_bool_guc(
        c"pg_shard.enable_pushdown_executor",
        c"Runs SELECTs on co-located distributed tables as one query per shard group on the workers.",
        c"Off, they run over postgres_fdw.",
        &ENABLE_PUSHDOWN,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// Whether statements across shard groups run on pg_shard's own
/// connections (the pushdown and multi-shard DML classes).
pub(super) fn enabled() -> bool {
    ENABLE_PUSHDOWN.get()
}

/// The pushdown plan of `parse`, or None when it does not qualify.
///
/// # Safety
/// `parse` is the tree about to be planned; it is not modified.
pub(super) unsafe fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> Result<Option<PushdownPlan>> {
    // SAFETY: reads the transaction state, the statement texts and fields
    // of a valid Query; the checks below read a copy.
    unsafe {
        if !enabled()
            || !client_statement(query_string)
            || crate::transaction::paths::did_fdw_write()
            || (*parse).commandType != pg_sys::CmdType::CMD_SELECT
            || !(*parse).utilityStmt.is_null()
            || (*parse).hasModifyingCTE
            || !(*parse).rowMarks.is_null()
            || !(*parse).setOperations.is_null()
            || !(*parse).groupingSets.is_null()
            || cursor_options & pg_sys::CURSOR_OPT_SCROLL as i32 != 0
            || super::lookup_pruning::prunes_by_lookup(parse)
        {
            return Ok(None);
        }
        let Some(statement) = across_shard_groups(parse, bound_params, false)? else {
            return Ok(None);
        };
        let AcrossShardGroups {
            query,
            computed: _,
            found,
            map_version,
            kinds,
            distributed,
            _busy,
        } = statement;
        if distributed.is_empty() {
            return Ok(None);
        }
        let Some(top) = separable_from(query, None) else {
            return Ok(None);
        };
        // Every distributed table must be one the analysis accounted for
        // (none in a sublink or CTE).
        let accounted: HashSet<*mut pg_sys::RangeTblEntry> =
            top.accounted().iter().copied().collect();
        let all_accounted = found
            .range_entries
            .iter()
            .all(|rte| !is_distributed_entry(*rte) || accounted.contains(rte));
        if !all_accounted {
            return Ok(None);
        }
        let whole = runs_whole(query, &top);
        let Some(split) = super::combine::split(query, whole)? else {
            return Ok(None);
        };
        if split.columns.is_empty() {
            return Ok(None);
        }
        let keyspace_ids = super::pruning::restricted_keyspace_ids(query, &top);
        let again = shard_group_targets(
            split.worker,
            &distributed,
            &kinds,
            keyspace_ids.as_deref(),
            Grouping::Rows,
        );
        let Some(tasks) = node_tasks(
            split.worker,
            &distributed,
            &kinds,
            keyspace_ids.as_deref(),
            Grouping::Rows,
        )?
        else {
            return Ok(None);
        };
        let mut relation_oids: Vec<pg_sys::Oid> = kinds.keys().copied().collect();
        relation_oids.extend(tasks.iter().flat_map(|t| t.partitions.iter().copied()));
        Ok(Some(PushdownPlan {
            master: split.master,
            columns: split.columns,
            tasks,
            map_version,
            whole,
            relation_oids,
            again,
        }))
    }
}

/// What finds a plan's shard groups again ([`tasks_again`]).
///
/// # Safety
/// `worker` is a valid Query.
pub(super) unsafe fn shard_group_targets(
    worker: *mut pg_sys::Query,
    distributed: &[pg_sys::Oid],
    kinds: &HashMap<pg_sys::Oid, Kind>,
    keyspace_ids: Option<&[i64]>,
    grouping: Grouping,
) -> ShardGroupTargets {
    ShardGroupTargets {
        // SAFETY: as this function's.
        worker: unsafe { node_text(worker as *const std::ffi::c_void) },
        distributed: distributed.to_vec(),
        references: kinds
            .iter()
            .filter(|(_, kind)| **kind == Kind::Reference)
            .map(|(relid, _)| *relid)
            .collect(),
        keyspace_ids: keyspace_ids.map(<[i64]>::to_vec),
        statements: grouping == Grouping::Statements,
    }
}

/// The node tasks of a pushdown or multi-shard DML plan's worker query
/// under the map as it is now (a shard group it reads moved or split since
/// it was planned); None while one is frozen or moving.
///
/// # Safety
/// `targets` come from a pushdown plan of this database.
pub(crate) unsafe fn tasks_again(targets: &ShardGroupTargets) -> Result<Option<Vec<NodeTask>>> {
    let text = std::ffi::CString::new(targets.worker.as_str())
        .map_err(|_| ShardError::Internal("a pushdown plan with a damaged worker query".into()))?;
    let mut kinds: HashMap<pg_sys::Oid, Kind> = targets
        .distributed
        .iter()
        .map(|&relid| (relid, Kind::Distributed))
        .collect();
    kinds.extend(
        targets
            .references
            .iter()
            .map(|&relid| (relid, Kind::Reference)),
    );
    // SAFETY: the text nodeToString made of the planned worker query; the
    // tree is read back in the current memory context.
    unsafe {
        let worker = pg_sys::stringToNode(text.as_ptr()) as *mut pg_sys::Query;
        node_tasks_over(
            worker,
            &targets.distributed,
            &kinds,
            targets.keyspace_ids.as_deref(),
            if targets.statements {
                Grouping::Statements
            } else {
                Grouping::Rows
            },
            latest_shard_ranges,
        )
    }
}

/// A node tree as PostgreSQL's text form (`nodeToString`).
///
/// # Safety
/// `node` is a valid node tree.
unsafe fn node_text(node: *const std::ffi::c_void) -> String {
    // SAFETY: as this function's; the text is palloc'd and copied here.
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::nodeToString(node))
            .to_string_lossy()
            .into_owned()
    }
}

/// A statement on co-located distributed tables, read for the classes
/// that run it across shard groups: a copy with a custom plan's parameter
/// values inlined, what it contains, the map version its plan is for, and
/// its tables' kinds. None when it has parameters left (a generic plan;
/// the workers' statements carry the values), system columns, calls that
/// would mean something else on a worker, other tables, or distributed
/// tables that are not co-located.
pub(super) struct AcrossShardGroups {
    pub(super) query: *mut pg_sys::Query,
    /// The values the metadata node computes (when asked for): parameters
    /// `$1`, … of `query` ([`super::computed_values`]).
    pub(super) computed: Vec<*mut pg_sys::Expr>,
    pub(super) found: TreeContents,
    pub(super) map_version: i64,
    pub(super) kinds: HashMap<pg_sys::Oid, Kind>,
    /// Its distributed tables, in one order (so that plans and EXPLAIN are
    /// alike every time).
    pub(super) distributed: Vec<pg_sys::Oid>,
    /// Catalog reads for the plan under way.
    pub(super) _busy: Busy,
}

/// Read `parse` as [`AcrossShardGroups`].
///
/// # Safety
/// `parse` is the tree about to be planned; it is not modified.
pub(super) unsafe fn across_shard_groups(
    parse: *mut pg_sys::Query,
    bound_params: pg_sys::ParamListInfo,
    compute_here: bool,
) -> Result<Option<AcrossShardGroups>> {
    // SAFETY: a valid Query, read through a copy.
    unsafe {
        let query = if bound_params.is_null() {
            pg_sys::copyObjectImpl(parse as *const std::ffi::c_void) as *mut pg_sys::Query
        } else {
            match with_parameter_values(parse, bound_params) {
                Some(query) => query,
                None => return Ok(None),
            }
        };
        let mut found = contents(query);
        // (A sublink's own parameters, `x IN (SELECT …)`, are part of the
        // statement's text.)
        if found.calls.iter().any(|&call| {
            (*call).type_ == pg_sys::NodeTag::T_Param
                && (*(call as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN
        }) || found.system_columns
        {
            return Ok(None);
        }
        let (query, computed) = if compute_here {
            if !super::insert_values::source_in_target_order(query) {
                return Ok(None);
            }
            let computed = computed_here(query, 1);
            found = contents(computed.query);
            (computed.query, computed.values)
        } else {
            (query, Vec::new())
        };
        if !calls_are_portable(&found) {
            return Ok(None);
        }
        let busy = Busy::start();
        let map_version = crate::metadata::catalog::current_map_version()?;
        at_version(map_version);
        let Some(kinds) = relation_kinds(&found)? else {
            return Ok(None);
        };
        let mut distributed: Vec<pg_sys::Oid> = kinds
            .iter()
            .filter(|(_, kind)| **kind == Kind::Distributed)
            .map(|(relid, _)| *relid)
            .collect();
        distributed.sort_by_key(|oid| oid.to_u32());
        if !co_located(&distributed)? {
            return Ok(None);
        }
        Ok(Some(AcrossShardGroups {
            query,
            computed,
            found,
            map_version,
            kinds,
            distributed,
            _busy: busy,
        }))
    }
}

/// Whether all the tables share one colocation group.
pub(super) fn co_located(relids: &[pg_sys::Oid]) -> Result<bool> {
    if relids.len() == 1 {
        return Ok(true);
    }
    Ok(crate::spi::query_one::<bool>(
        "SELECT count(DISTINCT colocation_id) = 1 AND count(*) = pg_catalog.cardinality($1::oid[]) \
         FROM pg_shard.logical_table WHERE table_rel::oid = ANY ($1::oid[])",
        &[relids.to_vec().into()],
    )?
    .unwrap_or(false))
}

/// How a node's task covers its shard groups.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Grouping {
    /// One query for their rows: per shard group when it joins distributed
    /// tables, else over all the node's shards at once.
    Rows,
    /// One statement per shard group (a statement that writes names one
    /// shard table as its target).
    Statements,
}

/// Each node's task: the worker query over the node's shards of the
/// (picked) shard groups. None while a group is frozen or moving, or a
/// partition's columns differ from its table's.
pub(super) unsafe fn node_tasks(
    worker: *mut pg_sys::Query,
    distributed: &[pg_sys::Oid],
    kinds: &HashMap<pg_sys::Oid, Kind>,
    keyspace_ids: Option<&[i64]>,
    grouping: Grouping,
) -> Result<Option<Vec<NodeTask>>> {
    // SAFETY: as this function's.
    unsafe {
        node_tasks_over(
            worker,
            distributed,
            kinds,
            keyspace_ids,
            grouping,
            shard_ranges,
        )
    }
}

/// [`node_tasks`] over the shard groups `ranges` gives.
unsafe fn node_tasks_over(
    worker: *mut pg_sys::Query,
    distributed: &[pg_sys::Oid],
    kinds: &HashMap<pg_sys::Oid, Kind>,
    keyspace_ids: Option<&[i64]>,
    grouping: Grouping,
    ranges: impl Fn(pg_sys::Oid) -> Result<Option<Vec<(i64, Shard)>>>,
) -> Result<Option<Vec<NodeTask>>> {
    let mut per_table = Vec::with_capacity(distributed.len());
    for &relid in distributed {
        let Some(ranges) = ranges(relid)? else {
            return Ok(None);
        };
        per_table.push((relid, ranges));
    }
    let groups = per_table[0].1.len();
    if per_table.iter().any(|(_, ranges)| ranges.len() != groups) {
        return Ok(None);
    }
    // The groups holding the allowed keyspace ids; at least one, so that
    // the final query gets its partial results (a count of 0).
    let starts: Vec<i64> = per_table[0].1.iter().map(|(start, _)| *start).collect();
    let mut picked: Vec<usize> = match keyspace_ids {
        None => (0..groups).collect(),
        Some(ids) => (0..groups)
            .filter(|&g| {
                let end = starts.get(g + 1).map_or(i64::MAX, |next| next - 1);
                ids.iter().any(|id| (starts[g]..=end).contains(id))
            })
            .collect(),
    };
    if picked.is_empty() {
        picked.push(0);
    }
    // The picked groups by node, in keyspace order.
    let mut by_node: Vec<(crate::metadata::Node, Vec<usize>)> = Vec::new();
    for group in picked {
        let node = per_table[0].1[group].1.node.clone();
        let start = per_table[0].1[group].0;
        if per_table
            .iter()
            .any(|(_, ranges)| ranges[group].0 != start || ranges[group].1.node != node)
        {
            return Ok(None);
        }
        match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, groups)) => groups.push(group),
            None => by_node.push((node, vec![group])),
        }
    }
    // A statement joining distributed tables runs per shard group (one
    // UNION ALL branch each: the join stays within a shard's rows and
    // indexes); one reading a single distributed table reads all its
    // shards on the node at once (their UNION ALL), joining any reference
    // tables once per node rather than once per shard group.
    // SAFETY: a valid Query.
    let joins_distributed = unsafe {
        contents(worker)
            .range_entries
            .iter()
            .filter(|rte| is_distributed_entry(**rte))
            .count()
            > 1
    };
    // Reference tables every branch reads under its own conditions, read
    // once per node when a node runs more than one branch.
    let per_group = joins_distributed && grouping == Grouping::Rows;
    // SAFETY: a valid Query, not changed (the branches that share reads
    // are printed from a copy without the conditions the CTEs apply).
    let (shared, sharing_worker) = if per_group {
        unsafe { shared_reads(worker, kinds)? }
    } else {
        (Vec::new(), worker)
    };
    let mut tasks: Vec<NodeTask> = Vec::with_capacity(by_node.len());
    for (node, groups) in by_node {
        let parts: Vec<Vec<usize>> = if joins_distributed || grouping == Grouping::Statements {
            groups.iter().map(|&g| vec![g]).collect()
        } else {
            vec![groups]
        };
        let (sharing, branch_worker) = if parts.len() > 1 && !shared.is_empty() {
            (shared.as_slice(), sharing_worker)
        } else {
            (&[][..], worker)
        };
        let mut task = NodeTask {
            node: node.clone(),
            prefix: String::new(),
            queries: Vec::new(),
            partitions: Vec::new(),
            shards: Vec::new(),
            rows: Vec::new(),
        };
        for part in parts {
            // SAFETY: a copy of the worker query for this part.
            let Some(part_query) = (unsafe {
                node_query(
                    branch_worker,
                    &node,
                    &part,
                    &per_table,
                    distributed,
                    kinds,
                    sharing,
                )?
            }) else {
                return Ok(None);
            };
            task.queries.push(part_query.text);
            task.partitions.extend(part_query.partitions);
            task.shards.extend(part_query.shards);
            task.rows.extend(part_query.rows);
        }
        let mut ctes = Vec::new();
        for read in sharing {
            let Some(copy) = reference_copy(read.relid, node.node_id)? else {
                return Ok(None);
            };
            let query =
                crate::quote::replace_names(&read.query, &[(qualified_name(read.relid), copy)]);
            ctes.push(format!("{} AS MATERIALIZED ({query})", read.name));
        }
        if !ctes.is_empty() {
            task.prefix = format!("WITH {} ", ctes.join(", "));
        }
        tasks.push(task);
    }
    Ok(Some(tasks))
}

/// A worker query's text, the partitions it stands for, the shard tables
/// it reads, and, for a multi-row INSERT … VALUES, the positions of the
/// rows it inserts.
struct NodeQuery {
    text: String,
    partitions: Vec<pg_sys::Oid>,
    shards: Vec<String>,
    rows: Vec<usize>,
}

/// The worker query over `groups`' shards on `node`, with the partitions
/// it stands for and the shard tables' names; None if a partition's
/// columns differ from its table's.
///
/// # Safety
/// `worker` is a valid Query; the tables are the statement's.
unsafe fn node_query(
    worker: *mut pg_sys::Query,
    node: &crate::metadata::Node,
    groups: &[usize],
    per_table: &[(
        pg_sys::Oid,
        Vec<(i64, crate::metadata::shard_lookup::Shard)>,
    )],
    distributed: &[pg_sys::Oid],
    kinds: &HashMap<pg_sys::Oid, Kind>,
    shared: &[SharedRead],
) -> Result<Option<NodeQuery>> {
    let on_node = |relid: pg_sys::Oid| -> Option<Vec<crate::metadata::shard_lookup::Shard>> {
        let (_, ranges) = per_table.iter().find(|(r, _)| *r == relid)?;
        Some(groups.iter().map(|&g| ranges[g].1.clone()).collect())
    };
    // SAFETY: a copy of the worker query for this node, whose
    // distributed entries point at a partition of theirs there.
    unsafe {
        let copy = pg_sys::copyObjectImpl(worker as *const std::ffi::c_void) as *mut pg_sys::Query;
        // (A multi-row INSERT … VALUES: the rows of these groups only.)
        let mut rows = Vec::new();
        if let Some((_, ranges)) = per_table.first() {
            let group_ranges: Vec<(i64, i64)> = groups
                .iter()
                .map(|&g| {
                    let end = ranges.get(g + 1).map_or(i64::MAX, |(next, _)| next - 1);
                    (ranges[g].0, end)
                })
                .collect();
            rows = super::insert_values::keep_rows_in(copy, &group_ranges).unwrap_or_default();
        }
        let mut shards = Vec::new();
        let mut partitions = Vec::new();
        for rte in contents(copy).range_entries {
            if !is_distributed_entry(rte) {
                continue;
            }
            let Some(tables) = on_node((*rte).relid) else {
                return Ok(None);
            };
            partitions.extend(
                tables
                    .iter()
                    .map(|t| t.partition)
                    .filter(|p| *p != pg_sys::InvalidOid),
            );
            let mut read = tables[0].clone();
            if tables.len() > 1 {
                read.qualified = format!(
                    "({})",
                    tables
                        .iter()
                        .map(|t| format!("SELECT * FROM {}", t.qualified))
                        .collect::<Vec<_>>()
                        .join(" UNION ALL ")
                );
            }
            shards.push(ShardRelation { rte, shard: read });
        }
        let mut renames = Vec::new();
        for (&relid, kind) in kinds {
            let name_on_node = match kind {
                Kind::Reference if shared.iter().any(|s| s.relid == relid) => shared
                    .iter()
                    .find(|s| s.relid == relid)
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                Kind::Reference => match reference_copy(relid, node.node_id)? {
                    Some(copy) => copy,
                    None => return Ok(None),
                },
                // (A row type's name: any of the shards' is alike.)
                Kind::Distributed => match on_node(relid) {
                    Some(tables) => tables[0].qualified.clone(),
                    None => continue,
                },
            };
            renames.push((qualified_name(relid), name_on_node));
        }
        let mut names: Vec<String> = Vec::new();
        for &relid in distributed {
            if let Some(tables) = on_node(relid) {
                names.extend(tables.into_iter().map(|t| t.qualified));
            }
        }
        Ok(worker_query(copy, &shards, renames)?.map(|text| NodeQuery {
            text,
            partitions,
            shards: names,
            rows,
        }))
    }
}
