//! Whether a query level is *separable*: running it on each shard group
//! alone (or, as the workers do, on all of a node's shard groups at once)
//! and appending the results gives its rows. Every distributed item of its
//! FROM (a distributed table, or a separable subquery exposing its
//! distribution column) must be tied to the others by equalities of their
//! distribution columns, an outer join may keep unmatched rows only of a
//! side that holds a distributed item, and the level must not aggregate
//! across shard groups (no aggregates, or GROUP BY a distribution column).
//! Reference tables may appear anywhere: every node has all their rows.
//! The pushdown and multi-shard DML classes are built on this analysis.

use super::conditions::{deterministic, is_key_equality, same_key_types};
use super::partition_key::{partition_key, range_table_entry, strip_relabel};
use crate::parse_tree::contents;
use pg_shard_core::UnionFind as Classes;
use pgrx::prelude::*;
use pgrx::PgList;
use std::collections::HashMap;
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
        // (OUTER is in the members' class only if joined to it: members are
        // range table indexes, from 1.)
        if outer.is_some() && classes.root(OUTER) != root {
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
pub(super) unsafe fn runs_whole(query: *mut pg_sys::Query, level: &Level) -> bool {
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
