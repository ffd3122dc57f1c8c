//! Walking and rewriting whole parse trees with PostgreSQL's own walkers
//! (`query_tree_walker`, `expression_tree_walker` and their mutators), which
//! reach every query level: subqueries in FROM, CTEs, sublinks, set
//! operations.
//!
//! The callbacks run inside PostgreSQL's C walkers, so they only look at
//! node tags and collect pointers or swap nodes; anything that could raise
//! an error happens after the walk, in Rust.

use pgrx::pg_sys;
use std::ffi::{c_int, c_void};

type Walker = unsafe extern "C-unwind" fn(node: *mut pg_sys::Node, context: *mut c_void) -> bool;
type Mutator =
    unsafe extern "C-unwind" fn(node: *mut pg_sys::Node, context: *mut c_void) -> *mut pg_sys::Node;

// PostgreSQL 15 exports these as functions (16 turned them into macros
// over *_impl); pgrx does not bind them.
unsafe extern "C-unwind" {
    fn query_tree_walker(
        query: *mut pg_sys::Query,
        walker: Walker,
        context: *mut c_void,
        flags: c_int,
    ) -> bool;
    fn expression_tree_walker(
        node: *mut pg_sys::Node,
        walker: Walker,
        context: *mut c_void,
    ) -> bool;
    fn query_tree_mutator(
        query: *mut pg_sys::Query,
        mutator: Mutator,
        context: *mut c_void,
        flags: c_int,
    ) -> *mut pg_sys::Query;
    fn datumCopy(value: pg_sys::Datum, by_value: bool, length: c_int) -> pg_sys::Datum;
    fn expression_tree_mutator(
        node: *mut pg_sys::Node,
        mutator: Mutator,
        context: *mut c_void,
    ) -> *mut pg_sys::Node;
}

/// Everything a parse tree holds that decides where it may run.
#[derive(Default)]
pub(crate) struct TreeContents {
    /// Every query level, the top one first.
    pub(crate) queries: Vec<*mut pg_sys::Query>,
    /// Every range table entry of every level.
    pub(crate) range_entries: Vec<*mut pg_sys::RangeTblEntry>,
    /// Every expression node that calls a function or operator, or stands
    /// for a value the node must not compute itself (parameters, SQL value
    /// functions, sequences, cursors).
    pub(crate) calls: Vec<*mut pg_sys::Node>,
}

/// Collect [`TreeContents`] of `query`.
///
/// # Safety
/// `query` is a valid parse tree (after rewriting).
pub(crate) unsafe fn contents(query: *mut pg_sys::Query) -> TreeContents {
    let mut found = TreeContents::default();
    // SAFETY: the walker gets our context back and only pushes pointers.
    unsafe {
        collect(
            query as *mut pg_sys::Node,
            &mut found as *mut TreeContents as *mut c_void,
        );
    }
    found
}

unsafe extern "C-unwind" fn collect(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the TreeContents passed to `contents`; node is a
    // valid node of the tree being walked.
    unsafe {
        let found = &mut *(context as *mut TreeContents);
        use pg_sys::NodeTag::*;
        match (*node).type_ {
            T_Query => {
                let query = node as *mut pg_sys::Query;
                found.queries.push(query);
                return query_tree_walker(
                    query,
                    collect,
                    context,
                    pg_sys::QTW_EXAMINE_RTES_BEFORE as c_int,
                );
            }
            T_RangeTblEntry => {
                found.range_entries.push(node as *mut pg_sys::RangeTblEntry);
                return false;
            }
            T_FuncExpr | T_OpExpr | T_DistinctExpr | T_NullIfExpr | T_ScalarArrayOpExpr
            | T_Aggref | T_WindowFunc | T_RowCompareExpr | T_SQLValueFunction | T_NextValueExpr
            | T_CurrentOfExpr | T_Param | T_XmlExpr | T_CoerceToDomain => {
                found.calls.push(node);
            }
            _ => {}
        }
        expression_tree_walker(node, collect, context)
    }
}

/// A copy of `query` with each external parameter replaced by a constant
/// of its value in `params`; None when one has no fixed value there.
///
/// # Safety
/// `query` is a valid parse tree; `params` is NULL or a valid list.
pub(crate) unsafe fn with_parameter_values(
    query: *mut pg_sys::Query,
    params: pg_sys::ParamListInfo,
) -> Option<*mut pg_sys::Query> {
    let mut context = Substitution {
        params,
        missing: false,
    };
    // SAFETY: the mutator copies the tree (no QTW_DONT_COPY_QUERY) and
    // builds constants from the list's values.
    let copy = unsafe {
        query_tree_mutator(
            query,
            substitute,
            &mut context as *mut Substitution as *mut c_void,
            0,
        )
    };
    (!context.missing).then_some(copy)
}

struct Substitution {
    params: pg_sys::ParamListInfo,
    missing: bool,
}

unsafe extern "C-unwind" fn substitute(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> *mut pg_sys::Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: context is the Substitution above; nodes are valid.
    unsafe {
        let substitution = &mut *(context as *mut Substitution);
        match (*node).type_ {
            pg_sys::NodeTag::T_Query => {
                return query_tree_mutator(node as *mut pg_sys::Query, substitute, context, 0)
                    as *mut pg_sys::Node;
            }
            pg_sys::NodeTag::T_Param => {
                let param = node as *mut pg_sys::Param;
                match parameter_constant(substitution.params, param) {
                    Some(constant) => return constant,
                    None => {
                        substitution.missing = true;
                        return node;
                    }
                }
            }
            _ => {}
        }
        expression_tree_mutator(node, substitute, context)
    }
}

/// The value of external parameter `param` as a constant, when the list
/// holds a fixed value of its type (as for a custom plan).
unsafe fn parameter_constant(
    params: pg_sys::ParamListInfo,
    param: *mut pg_sys::Param,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: params is a valid list when not NULL; ids are 1-based.
    unsafe {
        if params.is_null() || (*param).paramkind != pg_sys::ParamKind::PARAM_EXTERN {
            return None;
        }
        let id = (*param).paramid;
        if id < 1 || id > (*params).numParams || (*params).paramFetch.is_some() {
            return None;
        }
        let value = (*params).params.as_mut_ptr().add(id as usize - 1);
        if (*value).pflags & pg_sys::PARAM_FLAG_CONST as u16 == 0
            || (*value).ptype != (*param).paramtype
        {
            return None;
        }
        let mut length: i16 = 0;
        let mut by_value = false;
        pg_sys::get_typlenbyval((*param).paramtype, &mut length, &mut by_value);
        let datum = if (*value).isnull || by_value {
            (*value).value
        } else {
            datumCopy((*value).value, by_value, length as c_int)
        };
        Some(pg_sys::makeConst(
            (*param).paramtype,
            (*param).paramtypmod,
            (*param).paramcollid,
            length as c_int,
            datum,
            (*value).isnull,
            by_value,
        ) as *mut pg_sys::Node)
    }
}
