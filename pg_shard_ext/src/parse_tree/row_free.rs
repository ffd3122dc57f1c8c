//! Lifting out the expressions of a tree that read no row (`now()`,
//! `nextval('s')`, `CURRENT_USER`, a function of constants), so that the
//! planner can decide, for each, whether the worker may compute it or the
//! metadata node computes it once for the statement
//! ([`crate::planner::computed_values`]).
//!
//! Two passes, so that the decision (which reads the catalogs and may
//! raise errors) happens in Rust between them, not inside PostgreSQL's
//! walkers: [`lift`] replaces each largest row-free expression with a
//! placeholder, and [`put_back`] replaces every placeholder with what was
//! decided.

use super::{expression_tree_mutator, expression_tree_walker, query_tree_mutator};
use pgrx::pg_sys;
use pgrx::PgList;
use std::ffi::c_void;

/// An expression [`lift`] took out of the tree.
pub(crate) struct Lifted {
    pub(crate) expr: *mut pg_sys::Node,
    /// It is evaluated once per statement where it stands (a cell of an
    /// INSERT's VALUES), so a volatile one may be computed once too.
    pub(crate) once: bool,
}

/// A copy of `query` in which every largest expression that reads no row
/// (no column, aggregate, sublink or executor parameter) and calls
/// something is a placeholder, and those expressions in placeholder order.
///
/// # Safety
/// `query` is a valid parse tree (after rewriting); it is not modified.
pub(crate) unsafe fn lift(query: *mut pg_sys::Query) -> (*mut pg_sys::Query, Vec<Lifted>) {
    let mut lifted: Vec<Lifted> = Vec::new();
    // SAFETY: the mutator copies the tree and reads our context back; the
    // marking walker reads the copy's tags.
    unsafe {
        let copy = query_tree_mutator(
            query,
            lift_node,
            &mut lifted as *mut Vec<Lifted> as *mut c_void,
            0,
        );
        // The cells of an INSERT's VALUES run once each: a single row's
        // are its target list (over no table), several rows' a VALUES
        // entry's lists.
        if (*copy).commandType == pg_sys::CmdType::CMD_INSERT {
            let context = &mut lifted as *mut Vec<Lifted> as *mut c_void;
            let from_nothing = (*copy).jointree.is_null()
                || PgList::<pg_sys::Node>::from_pg((*(*copy).jointree).fromlist).is_empty();
            if from_nothing {
                mark_once((*copy).targetList as *mut pg_sys::Node, context);
            }
            for rte in PgList::<pg_sys::RangeTblEntry>::from_pg((*copy).rtable).iter_ptr() {
                if (*rte).rtekind == pg_sys::RTEKind::RTE_VALUES {
                    mark_once((*rte).values_lists as *mut pg_sys::Node, context);
                }
            }
        }
        (copy, lifted)
    }
}

/// Marks the placeholders in `node` (not in its subqueries) as standing
/// for expressions evaluated once.
unsafe extern "C-unwind" fn mark_once(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the vector of `lift`; nodes are valid.
    unsafe {
        match (*node).type_ {
            // A branch PostgreSQL may not take, or a subquery's level,
            // may not run once.
            pg_sys::NodeTag::T_Query
            | pg_sys::NodeTag::T_CaseExpr
            | pg_sys::NodeTag::T_CoalesceExpr
            | pg_sys::NodeTag::T_BoolExpr => false,
            pg_sys::NodeTag::T_Param => {
                if let Some(index) = placeholder_index(node as *mut pg_sys::Param) {
                    let lifted = &mut *(context as *mut Vec<Lifted>);
                    if let Some(entry) = lifted.get_mut(index) {
                        entry.once = true;
                    }
                }
                false
            }
            _ => expression_tree_walker(node, mark_once, context),
        }
    }
}

/// Placeholders are executor parameters with negative numbers, which no
/// parse tree holds: -1 for the first lifted expression.
fn placeholder_number(index: usize) -> i32 {
    -(index as i32) - 1
}

/// The index of the expression a placeholder stands for.
unsafe fn placeholder_index(param: *mut pg_sys::Param) -> Option<usize> {
    // SAFETY: a valid Param.
    unsafe {
        ((*param).paramkind == pg_sys::ParamKind::PARAM_EXEC && (*param).paramid < 0)
            .then(|| (-(*param).paramid - 1) as usize)
    }
}

unsafe extern "C-unwind" fn lift_node(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> *mut pg_sys::Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: context is the vector of `lift`; nodes are valid. exprType
    // and friends only read the node's fields.
    unsafe {
        let lifted = &mut *(context as *mut Vec<Lifted>);
        if (*node).type_ == pg_sys::NodeTag::T_Query {
            return query_tree_mutator(node as *mut pg_sys::Query, lift_node, context, 0)
                as *mut pg_sys::Node;
        }
        // (A set-returning call is rows, not a value.)
        if is_value_expression(node)
            && !reads_row(node)
            && calls_something(node)
            && !pg_sys::expression_returns_set(node)
        {
            let ty = pg_sys::exprType(node);
            // (An anonymous record has no text form a node could read.)
            if ty != pg_sys::RECORDOID && ty != pg_sys::RECORDARRAYOID {
                let param = new_param(
                    pg_sys::ParamKind::PARAM_EXEC,
                    placeholder_number(lifted.len()),
                    ty,
                    pg_sys::exprTypmod(node),
                    pg_sys::exprCollation(node),
                );
                // (Marked once, where it is, by `lift`.)
                lifted.push(Lifted {
                    expr: node,
                    once: false,
                });
                return param as *mut pg_sys::Node;
            }
        }
        expression_tree_mutator(node, lift_node, context)
    }
}

/// Whether the node computes a value (rather than being a list, a target
/// entry or a join tree item, which hold expressions).
unsafe fn is_value_expression(node: *mut pg_sys::Node) -> bool {
    use pg_sys::NodeTag::*;
    // SAFETY: a valid node.
    matches!(
        unsafe { (*node).type_ },
        T_FuncExpr
            | T_OpExpr
            | T_DistinctExpr
            | T_NullIfExpr
            | T_ScalarArrayOpExpr
            | T_BoolExpr
            | T_RelabelType
            | T_CoerceViaIO
            | T_ArrayCoerceExpr
            | T_ConvertRowtypeExpr
            | T_CollateExpr
            | T_CaseExpr
            | T_ArrayExpr
            | T_CoalesceExpr
            | T_MinMaxExpr
            | T_SQLValueFunction
            | T_XmlExpr
            | T_NullTest
            | T_BooleanTest
            | T_CoerceToDomain
            | T_NextValueExpr
            | T_FieldSelect
            | T_SubscriptingRef
    )
}

/// Whether `node` reads a row or a value only the executor around it has:
/// a column, an aggregate or window function, a sublink, the value a CASE
/// or coercion tests, an executor parameter, a cursor position.
pub(crate) unsafe fn reads_row(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the walker reads node tags only.
    unsafe { find_row_reference(node, std::ptr::null_mut()) }
}

unsafe extern "C-unwind" fn find_row_reference(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    use pg_sys::NodeTag::*;
    // SAFETY: a valid node.
    unsafe {
        match (*node).type_ {
            T_Var
            | T_Aggref
            | T_WindowFunc
            | T_GroupingFunc
            | T_SubLink
            | T_SubPlan
            | T_AlternativeSubPlan
            | T_CaseTestExpr
            | T_CoerceToDomainValue
            | T_SetToDefault
            | T_CurrentOfExpr
            | T_PlaceHolderVar
            | T_Query => true,
            T_Param => (*(node as *mut pg_sys::Param)).paramkind != pg_sys::ParamKind::PARAM_EXTERN,
            _ => expression_tree_walker(node, find_row_reference, context),
        }
    }
}

/// Whether `node` calls a function or operator or reads the session
/// (constants and their casts alone need no decision).
unsafe fn calls_something(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the walker reads node tags only.
    unsafe { find_call(node, std::ptr::null_mut()) }
}

unsafe extern "C-unwind" fn find_call(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    use pg_sys::NodeTag::*;
    // SAFETY: a valid node.
    unsafe {
        match (*node).type_ {
            T_FuncExpr | T_OpExpr | T_DistinctExpr | T_NullIfExpr | T_ScalarArrayOpExpr
            | T_SQLValueFunction | T_NextValueExpr | T_XmlExpr | T_CoerceToDomain
            | T_CoerceViaIO | T_ArrayCoerceExpr | T_MinMaxExpr => true,
            _ => expression_tree_walker(node, find_call, context),
        }
    }
}

/// `query` (from [`lift`]) with placeholder `i` replaced by
/// `replacements[i]`.
///
/// # Safety
/// `query` is the tree [`lift`] returned, and `replacements` valid
/// expression nodes, one per lifted expression.
pub(crate) unsafe fn put_back(
    query: *mut pg_sys::Query,
    replacements: &[*mut pg_sys::Node],
) -> *mut pg_sys::Query {
    let mut context = replacements;
    // SAFETY: the mutator copies the tree and reads our slice back.
    unsafe {
        query_tree_mutator(
            query,
            replace_placeholder,
            &mut context as *mut &[*mut pg_sys::Node] as *mut c_void,
            0,
        )
    }
}

unsafe extern "C-unwind" fn replace_placeholder(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> *mut pg_sys::Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: context is the slice of `put_back`; nodes are valid.
    unsafe {
        let replacements = *(context as *mut &[*mut pg_sys::Node]);
        match (*node).type_ {
            pg_sys::NodeTag::T_Query => {
                return query_tree_mutator(
                    node as *mut pg_sys::Query,
                    replace_placeholder,
                    context,
                    0,
                ) as *mut pg_sys::Node;
            }
            pg_sys::NodeTag::T_Param => {
                if let Some(index) = placeholder_index(node as *mut pg_sys::Param) {
                    if let Some(&replacement) = replacements.get(index) {
                        return replacement;
                    }
                }
            }
            _ => {}
        }
        expression_tree_mutator(node, replace_placeholder, context)
    }
}

/// A new parameter node (in the current memory context).
///
/// # Safety
/// Called in a memory context that outlives the tree it goes into.
pub(crate) unsafe fn new_param(
    kind: pg_sys::ParamKind::Type,
    number: i32,
    ty: pg_sys::Oid,
    typmod: i32,
    collation: pg_sys::Oid,
) -> *mut pg_sys::Param {
    // SAFETY: a zeroed node of the right size, filled whole.
    unsafe {
        let param = pg_sys::palloc0(std::mem::size_of::<pg_sys::Param>()) as *mut pg_sys::Param;
        (*param).xpr.type_ = pg_sys::NodeTag::T_Param;
        (*param).paramkind = kind;
        (*param).paramid = number;
        (*param).paramtype = ty;
        (*param).paramtypmod = typmod;
        (*param).paramcollid = collation;
        (*param).location = -1;
        param
    }
}
