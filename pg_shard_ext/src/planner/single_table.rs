//! A query level's reading of one of its tables: the table's entry when
//! the level's FROM list names it directly, the level's conditions on it
//! alone, and a query of that table alone under them (intermediate results
//! and the pushdown's shared reference table reads are built of these).

use crate::parse_tree::contents;
use pgrx::prelude::*;
use pgrx::PgList;

/// `level`'s range table entry number `varno`, if the level's FROM list
/// names it directly (not inside a join: a condition of the WHERE on it
/// alone then holds for each of its rows the level uses).
pub(super) unsafe fn entry(
    level: *mut pg_sys::Query,
    varno: i32,
) -> Option<*mut pg_sys::RangeTblEntry> {
    // SAFETY: a valid level.
    unsafe {
        if (*level).jointree.is_null() || varno < 1 {
            return None;
        }
        let from = PgList::<pg_sys::Node>::from_pg((*(*level).jointree).fromlist);
        let listed = from.iter_ptr().any(|item| {
            (*item).type_ == pg_sys::NodeTag::T_RangeTblRef
                && (*(item as *mut pg_sys::RangeTblRef)).rtindex == varno
        });
        if !listed {
            return None;
        }
        PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable).get_ptr(varno as usize - 1)
    }
}

/// The conditions of `level`'s WHERE on its entry `varno` alone: columns
/// of that entry and constants, nothing volatile, no parameters; when
/// `sublinks`, also conditions holding sublinks whose queries read
/// reference tables alone and nothing of this statement (`column IN
/// (SELECT …)`, `column > (SELECT avg(…) …)`), their tests such columns
/// too. None when the level's WHERE cannot be read so.
pub(super) unsafe fn own_conditions(
    level: *mut pg_sys::Query,
    varno: i32,
    sublinks: bool,
) -> Option<Vec<*mut pg_sys::Node>> {
    // SAFETY: a valid level; the conditions are not changed.
    unsafe {
        let conjuncts = PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
            (*(*level).jointree).quals as *mut pg_sys::Expr,
        ));
        let mut own = Vec::new();
        for conjunct in conjuncts.iter_ptr() {
            if crate::parse_tree::has_sublinks(conjunct) {
                let nested = crate::parse_tree::level_sublinks(conjunct);
                let portable = |s: &*mut pg_sys::SubLink| {
                    reads_reference_tables_alone((**s).subselect as *mut pg_sys::Query)
                        && !crate::parse_tree::has_sublinks((**s).testexpr)
                };
                if !sublinks || nested.is_empty() || !nested.iter().all(portable) {
                    continue;
                }
            }
            // Outside the sublinks' queries (their tests included).
            let vars = crate::parse_tree::every_var(conjunct);
            if vars.is_empty()
                || vars
                    .iter()
                    .any(|&v| (*v).varlevelsup != 0 || (*v).varno != varno || (*v).varattno <= 0)
                || pg_sys::contain_volatile_functions(conjunct)
                || crate::parse_tree::has_params(conjunct)
            {
                continue;
            }
            own.push(conjunct);
        }
        Some(own)
    }
}

/// `SELECT targets FROM table WHERE conditions` for `level`'s entry
/// `varno` (the targets and conditions are the level's expressions on it;
/// they are copied).
pub(super) unsafe fn single_table_query(
    level: *mut pg_sys::Query,
    varno: i32,
    conditions: Vec<*mut pg_sys::Node>,
    targets: Vec<*mut pg_sys::Node>,
) -> *mut pg_sys::Query {
    // SAFETY: valid nodes; copies are changed, new nodes in the current
    // memory context.
    unsafe {
        let copy = |node: *mut pg_sys::Node| {
            let copied = pg_sys::copyObjectImpl(node as *const _) as *mut pg_sys::Node;
            crate::parse_tree::move_level_references(copied, varno, 1);
            copied
        };
        let mut query = PgBox::<pg_sys::Query>::alloc_node(pg_sys::NodeTag::T_Query);
        query.commandType = pg_sys::CmdType::CMD_SELECT;
        query.querySource = pg_sys::QuerySource::QSRC_ORIGINAL;
        query.canSetTag = true;
        let rte = PgList::<pg_sys::RangeTblEntry>::from_pg((*level).rtable)
            .get_ptr(varno as usize - 1)
            .unwrap_or(std::ptr::null_mut());
        let mut rtable = PgList::<pg_sys::RangeTblEntry>::new();
        rtable.push(pg_sys::copyObjectImpl(rte as *const _) as *mut pg_sys::RangeTblEntry);
        query.rtable = rtable.into_pg();
        let mut from = PgList::<pg_sys::Node>::new();
        let mut reference =
            PgBox::<pg_sys::RangeTblRef>::alloc_node(pg_sys::NodeTag::T_RangeTblRef);
        reference.rtindex = 1;
        from.push(reference.into_pg() as *mut pg_sys::Node);
        let has_sublinks = conditions
            .iter()
            .any(|&c| crate::parse_tree::has_sublinks(c));
        let quals = conjunction(conditions.into_iter().map(copy).collect());
        query.jointree = pg_sys::makeFromExpr(from.into_pg(), quals);
        query.hasSubLinks = has_sublinks;
        let mut entries = PgList::<pg_sys::TargetEntry>::new();
        for (i, target) in targets.into_iter().enumerate() {
            // A column keeps its name; anything else is c<n>.
            let name = if (*target).type_ == pg_sys::NodeTag::T_Var && !rte.is_null() {
                pg_sys::get_attname((*rte).relid, (*(target as *mut pg_sys::Var)).varattno, true)
            } else {
                std::ptr::null_mut()
            };
            let name = if name.is_null() {
                let generated = std::ffi::CString::new(format!("c{}", i + 1)).unwrap_or_default();
                pg_sys::pstrdup(generated.as_ptr())
            } else {
                name
            };
            entries.push(pg_sys::makeTargetEntry(
                copy(target) as *mut pg_sys::Expr,
                (i + 1) as i16,
                name,
                false,
            ));
        }
        query.targetList = entries.into_pg();
        query.into_pg()
    }
}

/// The AND of `conditions` (NULL for none).
pub(super) unsafe fn conjunction(conditions: Vec<*mut pg_sys::Node>) -> *mut pg_sys::Node {
    if conditions.is_empty() {
        return std::ptr::null_mut();
    }
    let mut list = PgList::<pg_sys::Node>::new();
    for condition in conditions {
        list.push(condition);
    }
    // SAFETY: a list of valid boolean expressions.
    unsafe { pg_sys::make_ands_explicit(list.into_pg()) as *mut pg_sys::Node }
}

/// Whether `query` reads no distributed table, refers to no level around
/// it and has no parameters (it may run on its own, on any node).
pub(super) unsafe fn reads_reference_tables_alone(query: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid query.
    unsafe {
        let found = contents(query);
        !found
            .range_entries
            .iter()
            .any(|&rte| super::separable::is_distributed_entry(rte))
            && !found
                .calls
                .iter()
                .any(|&node| (*node).type_ == pg_sys::NodeTag::T_Param)
            && (1..=4).all(|up| !pg_sys::contain_vars_of_level(query as *mut pg_sys::Node, up))
            && !pg_sys::contain_volatile_functions(query as *mut pg_sys::Node)
    }
}

/// A NULL standing for a column the statement does not read: of the
/// type's base type (`NULL::domain` would check the domain's constraints,
/// and keep the statement off the pushdown class). The scan declares the
/// column's own type; a NULL is the same in either.
pub(super) unsafe fn null_of(
    ty: pg_sys::Oid,
    typmod: i32,
    collation: pg_sys::Oid,
) -> *mut pg_sys::Node {
    // SAFETY: a type cache lookup and a new node.
    unsafe {
        let mut base_typmod: i32 = -1;
        let base = pg_sys::getBaseTypeAndTypmod(ty, &mut base_typmod);
        let typmod = if base == ty { typmod } else { base_typmod };
        pg_sys::makeNullConst(base, typmod, collation) as *mut pg_sys::Node
    }
}
