//! The pushdown class: a SELECT whose distributed tables are co-located
//! and joined on their distribution columns runs as one worker query per
//! shard group, on every node at once, and a final query on the metadata
//! node over their rows ([`super::combine`] splits the statement in two,
//! [`crate::executor::pushdown_scan`] runs it).
//!
//! A query level is *separable* when running it on each shard group alone
//! (or, as the workers do, on all of a node's shard groups at once) and
//! appending the results gives its rows: every distributed item of
//! its FROM (a distributed table, or a separable subquery exposing its
//! distribution column) is tied to the others by equalities of their
//! distribution columns, an outer join keeps unmatched rows only of a side
//! that holds a distributed item, and it does not aggregate across shard
//! groups (no aggregates, or GROUP BY a distribution column). Reference
//! tables may appear anywhere: every node has all their rows. What the top
//! level does across shard groups (aggregates, DISTINCT, ORDER BY, LIMIT)
//! is done by the final query.
//!
//! Not (yet) pushed down: distributed tables in sublinks or CTEs, set
//! operations, window functions not partitioned by the distribution
//! column, statements inside a transaction block. Those take the
//! postgres_fdw path.

use super::conditions::{deterministic, is_key_equality, same_key_types};
use super::partition_key::{partition_key, range_table_entry, strip_relabel, Busy};
use super::router::{calls_are_portable, client_statement, relation_kinds, Kind};
use super::worker_query::{qualified_name, worker_query, ShardRelation};
use crate::error::Result;
use crate::executor::pushdown_scan::{NodeTask, PushdownPlan};
use crate::metadata::shard_lookup::{at_version, reference_copy, shard_ranges};
use crate::parse_tree::{contents, with_parameter_values, TreeContents};
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PgList};
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
        {
            return Ok(None);
        }
        let Some(statement) = across_shard_groups(parse, bound_params)? else {
            return Ok(None);
        };
        let AcrossShardGroups {
            query,
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
            top.accounted.iter().copied().collect();
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
        }))
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
        let found = contents(query);
        // (A sublink's own parameters, `x IN (SELECT …)`, are part of the
        // statement's text.)
        if found.calls.iter().any(|&call| {
            (*call).type_ == pg_sys::NodeTag::T_Param
                && (*(call as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN
        }) || found.system_columns
            || !calls_are_portable(&found)
        {
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

pub(super) unsafe fn is_distributed_entry(rte: *mut pg_sys::RangeTblEntry) -> bool {
    // SAFETY: a valid range table entry.
    unsafe {
        (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
            && (*rte).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
            && partition_key((*rte).relid).is_some()
    }
}

/// What the analysis of one query level found.
pub(super) struct Level {
    /// Range table indexes of its distributed items, with the column
    /// numbers that carry their distribution column.
    members: HashMap<usize, Vec<i16>>,
    /// The distributed tables' entries at this level and in its separable
    /// subqueries.
    accounted: Vec<*mut pg_sys::RangeTblEntry>,
}

/// The pseudo member standing, in a sublink's level, for the distribution
/// columns of the level around it (range table indexes start at 1).
const OUTER: usize = 0;

/// The level around a sublink's query, when analysing that query.
#[derive(Clone, Copy)]
pub(super) struct Outer<'a> {
    query: *mut pg_sys::Query,
    level: &'a Level,
}

impl Level {
    /// The distributed tables' entries the analysis accounted for.
    pub(super) fn accounted(&self) -> &[*mut pg_sys::RangeTblEntry] {
        &self.accounted
    }

    /// The member a distribution column reference of this level belongs
    /// to ([`OUTER`] for one of the level around, when there is one).
    pub(super) unsafe fn member_of(
        &self,
        query: *mut pg_sys::Query,
        node: *mut pg_sys::Node,
        outer: Option<Outer<'_>>,
    ) -> Option<usize> {
        // SAFETY: a valid expression of the Query.
        unsafe {
            let node = strip_relabel(node);
            if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_Var {
                return None;
            }
            let var = node as *mut pg_sys::Var;
            if !deterministic((*var).varcollid) {
                return None;
            }
            match ((*var).varlevelsup, outer) {
                (0, _) => self.member_at(query, (*var).varno, (*var).varattno),
                (1, Some(outer)) => outer
                    .level
                    .member_at(outer.query, (*var).varno, (*var).varattno)
                    .map(|_| OUTER),
                _ => None,
            }
        }
    }

    /// The member column `attno` of range table entry `varno` belongs to.
    unsafe fn member_at(&self, query: *mut pg_sys::Query, varno: i32, attno: i16) -> Option<usize> {
        // SAFETY: the range table of a valid Query.
        unsafe {
            let rte = range_table_entry(query, varno)?;
            if (*rte).rtekind == pg_sys::RTEKind::RTE_JOIN {
                // A join's merged column (USING): the column it stands for.
                let aliases = PgList::<pg_sys::Node>::from_pg((*rte).joinaliasvars);
                let alias = strip_relabel(aliases.get_ptr((attno as usize).checked_sub(1)?)?);
                if alias.is_null() || (*alias).type_ != pg_sys::NodeTag::T_Var {
                    return None;
                }
                let alias = alias as *mut pg_sys::Var;
                return self.member_at(query, (*alias).varno, (*alias).varattno);
            }
            let index = varno as usize;
            self.members
                .get(&index)
                .filter(|columns| columns.contains(&attno))
                .map(|_| index)
        }
    }
}

/// The analysis of a level's FROM and WHERE: None unless it is separable
/// (ignoring what its target list, grouping and limits do). A sublink's
/// level is analysed with the level around it (`outer`): its distributed
/// items must then also be tied to the outer level's distribution column.
pub(super) unsafe fn separable_from(
    query: *mut pg_sys::Query,
    outer: Option<Outer<'_>>,
) -> Option<Level> {
    // SAFETY: a valid Query; its entries and subqueries are valid.
    unsafe {
        let mut level = Level {
            members: HashMap::new(),
            accounted: Vec::new(),
        };
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable);
        for (i, rte) in rtable.iter_ptr().enumerate() {
            let index = i + 1;
            use pg_sys::RTEKind::*;
            match (*rte).rtekind {
                RTE_RELATION if is_distributed_entry(rte) => {
                    // FROM ONLY reads the metadata node's own rows.
                    if !(*rte).inh {
                        return None;
                    }
                    let (_, attno) = partition_key((*rte).relid)?;
                    level.members.insert(index, vec![attno]);
                    level.accounted.push(rte);
                }
                RTE_RELATION | RTE_JOIN | RTE_VALUES | RTE_FUNCTION | RTE_CTE | RTE_RESULT
                | RTE_TABLEFUNC => {}
                RTE_SUBQUERY => {
                    let sub = (*rte).subquery;
                    if sub.is_null() {
                        return None;
                    }
                    if !reads_distributed(sub) {
                        // Reference tables only: the same rows on every node.
                        continue;
                    }
                    let (columns, accounted) = separable_subquery(sub)?;
                    level.members.insert(index, columns);
                    level.accounted.extend(accounted);
                }
                _ => return None,
            }
        }
        if level.members.is_empty() || (*query).jointree.is_null() {
            return None;
        }
        // All distributed items in one class of equal distribution columns
        // (with the outer level's, for a sublink's).
        let mut classes = Classes::default();
        for &index in level.members.keys() {
            classes.root(index);
        }
        let jointree = (*query).jointree as *mut pg_sys::Node;
        if !read_join_tree(query, &level, outer, &mut classes, jointree) {
            return None;
        }
        let root = classes.root(*level.members.keys().next()?);
        let members: Vec<usize> = level.members.keys().copied().collect();
        if members.iter().any(|&i| classes.root(i) != root) {
            return None;
        }
        if outer.is_some() && !(classes.parent.contains_key(&OUTER) && classes.root(OUTER) == root)
        {
            return None;
        }
        // Sublinks reading distributed tables: each tied to this level's
        // distribution column.
        let expressions = [
            (*(*query).jointree).quals,
            (*query).targetList as *mut pg_sys::Node,
            (*query).havingQual,
        ];
        let mut sublinks = Vec::new();
        for expression in expressions {
            sublinks.extend(crate::parse_tree::level_sublinks(expression));
        }
        sublinks.extend(join_sublinks(jointree));
        for sublink in sublinks {
            let sub = (*sublink).subselect as *mut pg_sys::Query;
            if sub.is_null() || (*sub).type_ != pg_sys::NodeTag::T_Query || !reads_distributed(sub)
            {
                continue;
            }
            let accounted = separable_sublink(query, &level, sublink)?;
            level.accounted.extend(accounted);
        }
        Some(level)
    }
}

unsafe fn reads_distributed(query: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid Query.
    unsafe {
        contents(query)
            .range_entries
            .iter()
            .any(|e| is_distributed_entry(*e))
    }
}

/// The sublinks of the ON conditions of a join tree.
unsafe fn join_sublinks(node: *mut pg_sys::Node) -> Vec<*mut pg_sys::SubLink> {
    // SAFETY: join tree nodes of a valid Query.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_JoinExpr => {
                let join = node as *mut pg_sys::JoinExpr;
                let mut found = crate::parse_tree::level_sublinks((*join).quals);
                found.extend(join_sublinks((*join).larg));
                found.extend(join_sublinks((*join).rarg));
                found
            }
            pg_sys::NodeTag::T_FromExpr => {
                PgList::<pg_sys::Node>::from_pg((*(node as *mut pg_sys::FromExpr)).fromlist)
                    .iter_ptr()
                    .flat_map(|item| join_sublinks(item))
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// A sublink (EXISTS, IN, a scalar subquery) whose query reads distributed
/// tables: separable when its rows for an outer row all lie in that row's
/// shard group, because it equates its distribution column with the outer
/// one inside (`l.key = o.key`), or is `o.key IN (SELECT key …)` of a
/// query that does not aggregate across shard groups. The distributed
/// tables it reads.
unsafe fn separable_sublink(
    query: *mut pg_sys::Query,
    level: &Level,
    sublink: *mut pg_sys::SubLink,
) -> Option<Vec<*mut pg_sys::RangeTblEntry>> {
    // SAFETY: a valid SubLink of the Query.
    unsafe {
        let sub = (*sublink).subselect as *mut pg_sys::Query;
        if (*sub).commandType != pg_sys::CmdType::CMD_SELECT
            || !(*sub).setOperations.is_null()
            || !(*sub).groupingSets.is_null()
            || !(*sub).cteList.is_null()
            || !(*sub).limitOffset.is_null()
            || (!(*sub).limitCount.is_null()
                && (*sublink).subLinkType != pg_sys::SubLinkType::EXISTS_SUBLINK)
        {
            return None;
        }
        let outer = Outer { query, level };
        // Tied inside, by a correlated equality: for each outer row the
        // query reads one key's rows, so even its aggregates stay within
        // the row's shard group.
        if let Some(inner) = separable_from(sub, Some(outer)) {
            return Some(inner.accounted);
        }
        // Tied by the IN: `outer key = ANY (SELECT inner key …)`.
        if (*sublink).subLinkType != pg_sys::SubLinkType::ANY_SUBLINK {
            return None;
        }
        let inner = separable_from(sub, None)?;
        if !runs_whole(sub, &inner) {
            return None;
        }
        let test = (*sublink).testexpr;
        if test.is_null() || (*test).type_ != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let op = test as *mut pg_sys::OpExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        let (Some(left), Some(right)) = (args.get_ptr(0), args.get_ptr(1)) else {
            return None;
        };
        if args.len() != 2
            || !is_key_equality((*op).opno, (*op).inputcollid)
            || !same_key_types(pg_sys::exprType(left), pg_sys::exprType(right))
            || level.member_of(query, left, None).is_none()
        {
            return None;
        }
        let param = strip_relabel(right);
        if param.is_null() || (*param).type_ != pg_sys::NodeTag::T_Param {
            return None;
        }
        let param = param as *mut pg_sys::Param;
        if (*param).paramkind != pg_sys::ParamKind::PARAM_SUBLINK {
            return None;
        }
        let targets = PgList::<pg_sys::TargetEntry>::from_pg((*sub).targetList);
        let entry = targets
            .iter_ptr()
            .find(|t| !(**t).resjunk && (**t).resno as i32 == (*param).paramid)?;
        inner.member_of(sub, (*entry).expr as *mut pg_sys::Node, None)?;
        Some(inner.accounted)
    }
}

/// A subquery in FROM that is separable as a whole: its distribution
/// columns among its outputs, and the distributed tables it reads.
pub(super) unsafe fn separable_subquery(
    sub: *mut pg_sys::Query,
) -> Option<(Vec<i16>, Vec<*mut pg_sys::RangeTblEntry>)> {
    // SAFETY: a valid Query.
    unsafe {
        if (*sub).commandType != pg_sys::CmdType::CMD_SELECT
            || !(*sub).setOperations.is_null()
            || !(*sub).groupingSets.is_null()
            || !(*sub).limitCount.is_null()
            || !(*sub).limitOffset.is_null()
            || !(*sub).distinctClause.is_null()
            || !(*sub).cteList.is_null()
        {
            return None;
        }
        let level = separable_from(sub, None)?;
        if !runs_whole(sub, &level) {
            return None;
        }
        let columns: Vec<i16> = PgList::<pg_sys::TargetEntry>::from_pg((*sub).targetList)
            .iter_ptr()
            .filter(|t| {
                !(**t).resjunk
                    && level
                        .member_of(sub, (**t).expr as *mut pg_sys::Node, None)
                        .is_some()
            })
            .map(|t| (*t).resno)
            .collect();
        // (Without its distribution column among its outputs it can still
        // be the level's only distributed item.)
        Some((columns, level.accounted))
    }
}

/// Whether a separable level's own grouping and windows stay within shard
/// groups: no aggregates, or GROUP BY a distribution column; windows
/// partitioned by one.
unsafe fn runs_whole(query: *mut pg_sys::Query, level: &Level) -> bool {
    // SAFETY: a valid Query; sort-group clauses refer to its targets.
    unsafe {
        let targets = (*query).targetList;
        let grouped = !(*query).groupClause.is_null();
        let aggregates = (*query).hasAggs || grouped || !(*query).havingQual.is_null();
        if aggregates && !clause_has_member(query, level, (*query).groupClause, targets) {
            return false;
        }
        if (*query).hasWindowFuncs {
            let windows = PgList::<pg_sys::WindowClause>::from_pg((*query).windowClause);
            if !windows
                .iter_ptr()
                .all(|w| clause_has_member(query, level, (*w).partitionClause, targets))
            {
                return false;
            }
        }
        true
    }
}

/// Whether a list of sort-group clauses names a distribution column.
unsafe fn clause_has_member(
    query: *mut pg_sys::Query,
    level: &Level,
    clauses: *mut pg_sys::List,
    targets: *mut pg_sys::List,
) -> bool {
    // SAFETY: clauses refer to target entries by ressortgroupref.
    unsafe {
        let targets = PgList::<pg_sys::TargetEntry>::from_pg(targets);
        PgList::<pg_sys::SortGroupClause>::from_pg(clauses)
            .iter_ptr()
            .any(|clause| {
                targets
                    .iter_ptr()
                    .find(|t| (**t).ressortgroupref == (*clause).tleSortGroupRef)
                    .is_some_and(|t| {
                        level
                            .member_of(query, (*t).expr as *mut pg_sys::Node, None)
                            .is_some()
                    })
            })
    }
}

/// Union-find over range table indexes of distributed items.
#[derive(Default)]
struct Classes {
    parent: HashMap<usize, usize>,
}

impl Classes {
    fn root(&mut self, index: usize) -> usize {
        let parent = *self.parent.entry(index).or_insert(index);
        if parent == index {
            return index;
        }
        let root = self.root(parent);
        self.parent.insert(index, root);
        root
    }

    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        if a != b {
            self.parent.insert(a, b);
        }
    }
}

/// Read a join tree item's equalities into `classes`; false when an outer
/// join would keep unmatched rows of a side without distributed items
/// (they would come back once per shard group).
unsafe fn read_join_tree(
    query: *mut pg_sys::Query,
    level: &Level,
    outer: Option<Outer<'_>>,
    classes: &mut Classes,
    node: *mut pg_sys::Node,
) -> bool {
    // SAFETY: join tree nodes of a valid Query.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_JoinExpr => {
                let join = node as *mut pg_sys::JoinExpr;
                let left = holds_member(level, (*join).larg);
                let right = holds_member(level, (*join).rarg);
                let keeps_unmatched_ok = match (*join).jointype {
                    pg_sys::JoinType::JOIN_INNER => true,
                    pg_sys::JoinType::JOIN_LEFT => left,
                    pg_sys::JoinType::JOIN_RIGHT => right,
                    pg_sys::JoinType::JOIN_FULL => left && right,
                    _ => false,
                };
                keeps_unmatched_ok
                    && read_equalities(query, level, outer, classes, (*join).quals)
                    && read_join_tree(query, level, outer, classes, (*join).larg)
                    && read_join_tree(query, level, outer, classes, (*join).rarg)
            }
            pg_sys::NodeTag::T_FromExpr => {
                let from = node as *mut pg_sys::FromExpr;
                read_equalities(query, level, outer, classes, (*from).quals)
                    && PgList::<pg_sys::Node>::from_pg((*from).fromlist)
                        .iter_ptr()
                        .all(|item| read_join_tree(query, level, outer, classes, item))
            }
            _ => true,
        }
    }
}

/// Whether a join tree item holds a distributed item.
unsafe fn holds_member(level: &Level, node: *mut pg_sys::Node) -> bool {
    // SAFETY: join tree nodes of a valid Query.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_RangeTblRef => level
                .members
                .contains_key(&((*(node as *mut pg_sys::RangeTblRef)).rtindex as usize)),
            pg_sys::NodeTag::T_JoinExpr => {
                let join = node as *mut pg_sys::JoinExpr;
                holds_member(level, (*join).larg) || holds_member(level, (*join).rarg)
            }
            pg_sys::NodeTag::T_FromExpr => {
                PgList::<pg_sys::Node>::from_pg((*(node as *mut pg_sys::FromExpr)).fromlist)
                    .iter_ptr()
                    .any(|item| holds_member(level, item))
            }
            _ => false,
        }
    }
}

/// Equalities of distribution columns in a condition's top-level AND.
/// (Always true: an unrelated condition only filters rows.)
unsafe fn read_equalities(
    query: *mut pg_sys::Query,
    level: &Level,
    outer: Option<Outer<'_>>,
    classes: &mut Classes,
    node: *mut pg_sys::Node,
) -> bool {
    if node.is_null() {
        return true;
    }
    // SAFETY: expression nodes of a valid Query.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_List => {
                for item in PgList::<pg_sys::Node>::from_pg(node as *mut pg_sys::List).iter_ptr() {
                    read_equalities(query, level, outer, classes, item);
                }
            }
            pg_sys::NodeTag::T_BoolExpr
                if (*(node as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR =>
            {
                let args = (*(node as *mut pg_sys::BoolExpr)).args;
                for item in PgList::<pg_sys::Node>::from_pg(args).iter_ptr() {
                    read_equalities(query, level, outer, classes, item);
                }
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = node as *mut pg_sys::OpExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                if args.len() == 2 && is_key_equality((*op).opno, (*op).inputcollid) {
                    if let (Some(left), Some(right)) = (args.get_ptr(0), args.get_ptr(1)) {
                        if let (Some(a), Some(b)) = (
                            level.member_of(query, left, outer),
                            level.member_of(query, right, outer),
                        ) {
                            if same_key_types(pg_sys::exprType(left), pg_sys::exprType(right)) {
                                classes.join(a, b);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        true
    }
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
    let mut per_table = Vec::with_capacity(distributed.len());
    for &relid in distributed {
        let Some(ranges) = shard_ranges(relid)? else {
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
    let mut tasks: Vec<NodeTask> = Vec::with_capacity(by_node.len());
    for (node, groups) in by_node {
        let parts: Vec<Vec<usize>> = if joins_distributed || grouping == Grouping::Statements {
            groups.iter().map(|&g| vec![g]).collect()
        } else {
            vec![groups]
        };
        let mut task = NodeTask {
            node: node.clone(),
            queries: Vec::new(),
            partitions: Vec::new(),
            shards: Vec::new(),
        };
        for part in parts {
            // SAFETY: a copy of the worker query for this part.
            let Some((text, partitions, names)) =
                (unsafe { node_query(worker, &node, &part, &per_table, distributed, kinds)? })
            else {
                return Ok(None);
            };
            task.queries.push(text);
            task.partitions.extend(partitions);
            task.shards.extend(names);
        }
        tasks.push(task);
    }
    Ok(Some(tasks))
}

/// A worker query's text, the partitions it stands for and the shard
/// tables it reads.
type NodeQuery = (String, Vec<pg_sys::Oid>, Vec<String>);

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
) -> Result<Option<NodeQuery>> {
    let on_node = |relid: pg_sys::Oid| -> Option<Vec<crate::metadata::shard_lookup::Shard>> {
        let (_, ranges) = per_table.iter().find(|(r, _)| *r == relid)?;
        Some(groups.iter().map(|&g| ranges[g].1.clone()).collect())
    };
    // SAFETY: a copy of the worker query for this node, whose
    // distributed entries point at a partition of theirs there.
    unsafe {
        let copy = pg_sys::copyObjectImpl(worker as *const std::ffi::c_void) as *mut pg_sys::Query;
        let mut shards = Vec::new();
        let mut partitions = Vec::new();
        for rte in contents(copy).range_entries {
            if !is_distributed_entry(rte) {
                continue;
            }
            let Some(tables) = on_node((*rte).relid) else {
                return Ok(None);
            };
            partitions.extend(tables.iter().map(|t| t.partition));
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
        Ok(worker_query(copy, &shards, renames)?.map(|text| (text, partitions, names)))
    }
}
