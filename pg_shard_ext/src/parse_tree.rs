//! Walking and rewriting whole parse trees with PostgreSQL's own walkers
//! (`query_tree_walker`, `expression_tree_walker` and their mutators), which
//! reach every query level: subqueries in FROM, CTEs, sublinks, set
//! operations.
//!
//! The callbacks run inside PostgreSQL's C walkers, so they only look at
//! node tags and collect pointers or swap nodes; anything that could raise
//! an error happens after the walk, in Rust.

pub(crate) mod row_free;

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
    fn IncrementVarSublevelsUp(node: *mut pg_sys::Node, delta: c_int, min_sublevels_up: c_int);
    fn ChangeVarNodes(
        node: *mut pg_sys::Node,
        old_varno: c_int,
        new_varno: c_int,
        sublevels_up: c_int,
    );
    fn checkExprHasSubLink(node: *mut pg_sys::Node) -> bool;
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
    /// Whether a system column (`tableoid`, `ctid`, …) is referenced: its
    /// value differs between the metadata node and a worker.
    pub(crate) system_columns: bool,
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

/// Collect [`TreeContents`] of one expression (and any query levels in
/// it).
///
/// # Safety
/// `node` is NULL or a valid expression tree.
pub(crate) unsafe fn expression_contents(node: *mut pg_sys::Node) -> TreeContents {
    let mut found = TreeContents::default();
    // SAFETY: as in `contents`.
    unsafe {
        collect(node, &mut found as *mut TreeContents as *mut c_void);
    }
    found
}

/// The highest number of the external parameters in `found` (0 for none).
pub(crate) fn highest_parameter(found: &TreeContents) -> i32 {
    found
        .calls
        .iter()
        // SAFETY: valid nodes of the walked tree.
        .filter_map(|&node| unsafe {
            ((*node).type_ == pg_sys::NodeTag::T_Param
                && (*(node as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN)
                .then(|| (*(node as *mut pg_sys::Param)).paramid)
        })
        .max()
        .unwrap_or(0)
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
            T_Var if (*(node as *mut pg_sys::Var)).varattno < 0 => {
                found.system_columns = true;
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
            // (A sublink's own parameters, `x IN (SELECT …)`, stay.)
            pg_sys::NodeTag::T_Param
                if (*(node as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN =>
            {
                let param = node as *mut pg_sys::Param;
                match parameter_constant(substitution.params, param) {
                    Some(constant) => return constant,
                    None => {
                        substitution.missing = true;
                        return node;
                    }
                }
            }
            pg_sys::NodeTag::T_BoolExpr => {
                let mutated = expression_tree_mutator(node, substitute, context);
                return fold_constant_operands(mutated as *mut pg_sys::BoolExpr);
            }
            _ => {}
        }
        expression_tree_mutator(node, substitute, context)
    }
}

/// `expr` with the constant operands of its AND or OR folded away, as
/// PostgreSQL's planner would: `false OR x` is `x`, `true OR x` is `true`.
/// Done here because a parameter's value decides which of a condition's
/// forms applies (`$2 OR x = ANY ($1)`), and the worker's planner turns a
/// sublink into a join only where it is a condition of its own, before it
/// folds constants.
unsafe fn fold_constant_operands(expr: *mut pg_sys::BoolExpr) -> *mut pg_sys::Node {
    // SAFETY: a valid BoolExpr whose operands are valid nodes.
    unsafe {
        let (absorbing, neutral) = match (*expr).boolop {
            pg_sys::BoolExprType::OR_EXPR => (true, false),
            pg_sys::BoolExprType::AND_EXPR => (false, true),
            _ => return expr as *mut pg_sys::Node,
        };
        let constant = |node: *mut pg_sys::Node| -> Option<bool> {
            if (*node).type_ != pg_sys::NodeTag::T_Const {
                return None;
            }
            let c = node as *mut pg_sys::Const;
            ((*c).consttype == pg_sys::BOOLOID && !(*c).constisnull)
                .then(|| (*c).constvalue.value() != 0)
        };
        let operands = pgrx::PgList::<pg_sys::Node>::from_pg((*expr).args);
        let mut kept = pgrx::PgList::<pg_sys::Node>::new();
        for operand in operands.iter_ptr() {
            match constant(operand) {
                Some(value) if value == absorbing => return operand,
                Some(_) => {}
                None => kept.push(operand),
            }
        }
        match kept.len() {
            0 => pg_sys::makeBoolConst(neutral, false),
            1 => kept.get_ptr(0).unwrap_or(std::ptr::null_mut()),
            _ => {
                (*expr).args = kept.into_pg();
                expr as *mut pg_sys::Node
            }
        }
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

/// The aggregate calls of this query level in `node` (not those of
/// sublinks' levels), each once.
///
/// # Safety
/// `node` is NULL or a valid expression tree.
pub(crate) unsafe fn level_aggregates(node: *mut pg_sys::Node) -> Vec<*mut pg_sys::Aggref> {
    let mut found: Vec<*mut pg_sys::Aggref> = Vec::new();
    // SAFETY: the walker gets our vector back and only pushes pointers.
    unsafe {
        collect_aggregates(
            node,
            &mut found as *mut Vec<*mut pg_sys::Aggref> as *mut c_void,
        );
    }
    found
}

unsafe extern "C-unwind" fn collect_aggregates(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the vector passed to `level_aggregates`; `equal`
    // compares valid nodes.
    unsafe {
        let found = &mut *(context as *mut Vec<*mut pg_sys::Aggref>);
        if (*node).type_ == pg_sys::NodeTag::T_Aggref {
            let aggregate = node as *mut pg_sys::Aggref;
            if (*aggregate).agglevelsup == 0 {
                let known = found
                    .iter()
                    .any(|&a| pg_sys::equal(a as *const c_void, node as *const c_void));
                if !known {
                    found.push(aggregate);
                }
                // (No aggregate of this level nests in another.)
                return false;
            }
        }
        // Sublinks' queries are other levels; their outer references are
        // this level's columns, which the caller checks separately.
        if (*node).type_ == pg_sys::NodeTag::T_Query {
            return false;
        }
        expression_tree_walker(node, collect_aggregates, context)
    }
}

/// A copy of `node` with every subexpression equal to one of `pairs`'
/// first members replaced by a copy of the second (the first match, from
/// the top down). The flag says whether a column of this level, or a
/// sublink, remains outside the replaced parts.
///
/// # Safety
/// `node` is NULL or a valid expression tree; the pairs are valid nodes.
pub(crate) unsafe fn replace_subexpressions(
    node: *mut pg_sys::Node,
    pairs: &[(*mut pg_sys::Node, *mut pg_sys::Node)],
) -> (*mut pg_sys::Node, bool) {
    let mut context = Replacement {
        pairs,
        left_over: false,
    };
    // SAFETY: the mutator copies what it does not replace and reads our
    // context back.
    let copy = unsafe { replace_matching(node, &mut context as *mut Replacement as *mut c_void) };
    (copy, context.left_over)
}

struct Replacement<'a> {
    pairs: &'a [(*mut pg_sys::Node, *mut pg_sys::Node)],
    left_over: bool,
}

unsafe extern "C-unwind" fn replace_matching(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> *mut pg_sys::Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: context is the Replacement above; nodes are valid.
    unsafe {
        let replacement = &mut *(context as *mut Replacement);
        for &(from, to) in replacement.pairs {
            if pg_sys::equal(from as *const c_void, node as *const c_void) {
                return pg_sys::copyObjectImpl(to as *const c_void) as *mut pg_sys::Node;
            }
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_Var if (*(node as *mut pg_sys::Var)).varlevelsup == 0 => {
                replacement.left_over = true;
                return node;
            }
            pg_sys::NodeTag::T_SubLink | pg_sys::NodeTag::T_Query | pg_sys::NodeTag::T_Aggref => {
                replacement.left_over = true;
                return node;
            }
            _ => {}
        }
        expression_tree_mutator(node, replace_matching, context)
    }
}

/// Point every Var of this level in `node` at range table index `from`
/// to index `to` instead (in place).
///
/// # Safety
/// `node` is NULL or a valid expression tree of plan or parse nodes.
pub(crate) unsafe fn renumber_vars(node: *mut pg_sys::Node, from: i32, to: i32) {
    let mut context = (from, to);
    // SAFETY: the walker gets our pair back and only changes Var numbers.
    unsafe {
        renumber(node, &mut context as *mut (i32, i32) as *mut c_void);
    }
}

unsafe extern "C-unwind" fn renumber(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the pair passed to `renumber_vars`.
    unsafe {
        let (from, to) = *(context as *mut (i32, i32));
        if (*node).type_ == pg_sys::NodeTag::T_Var {
            let var = node as *mut pg_sys::Var;
            if (*var).varlevelsup == 0 && (*var).varno == from {
                (*var).varno = to;
            }
            return false;
        }
        expression_tree_walker(node, renumber, context)
    }
}

/// Every Var in `node`, of any level, outside its sublinks' queries (a
/// sublink's test expression is looked at).
///
/// # Safety
/// `node` is NULL or a valid expression tree.
pub(crate) unsafe fn every_var(node: *mut pg_sys::Node) -> Vec<*mut pg_sys::Var> {
    let mut found: Vec<*mut pg_sys::Var> = Vec::new();
    // SAFETY: the walker gets our vector back and only pushes pointers.
    unsafe {
        collect_vars(
            node,
            &mut found as *mut Vec<*mut pg_sys::Var> as *mut c_void,
        );
    }
    found
}

unsafe extern "C-unwind" fn collect_vars(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the vector passed to `every_var`.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Var => {
                (*(context as *mut Vec<*mut pg_sys::Var>)).push(node as *mut pg_sys::Var);
                false
            }
            // A sublink's query is not looked at (its own levels).
            pg_sys::NodeTag::T_SubLink => {
                collect_vars((*(node as *mut pg_sys::SubLink)).testexpr, context)
            }
            _ => expression_tree_walker(node, collect_vars, context),
        }
    }
}

/// Move `node`'s references to outer levels one level in (an expression
/// taken out of a sublink into the level around it), in place.
///
/// # Safety
/// `node` is a valid expression tree.
pub(crate) unsafe fn lower_outer_references(node: *mut pg_sys::Node) {
    // SAFETY: PostgreSQL's own walker over a valid tree.
    unsafe { IncrementVarSublevelsUp(node, -1, 1) }
}

/// Point `node`'s references to range table index `from` of its own level
/// (inside its sublinks too) at index `to` instead, in place.
///
/// # Safety
/// `node` is NULL or a valid expression tree of a parse tree.
pub(crate) unsafe fn move_level_references(node: *mut pg_sys::Node, from: i32, to: i32) {
    // SAFETY: PostgreSQL's own walker over a valid tree.
    unsafe { ChangeVarNodes(node, from, to, 0) }
}

/// Whether `node` holds a sublink.
///
/// # Safety
/// `node` is NULL or a valid expression tree of a parse tree.
pub(crate) unsafe fn has_sublinks(node: *mut pg_sys::Node) -> bool {
    // SAFETY: PostgreSQL's own walker over a valid tree.
    unsafe { checkExprHasSubLink(node) }
}

/// Whether `node` holds a parameter outside its sublinks' queries (those
/// are not looked at; a sublink's `PARAM_SUBLINK`s in its test expression
/// stand for the sublink's output and are not counted).
///
/// # Safety
/// `node` is NULL or a valid expression tree.
pub(crate) unsafe fn has_params(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the walker reads node tags only.
    unsafe { find_param(node, std::ptr::null_mut()) }
}

unsafe extern "C-unwind" fn find_param(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: a valid node.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Param => {
                (*(node as *mut pg_sys::Param)).paramkind != pg_sys::ParamKind::PARAM_SUBLINK
            }
            pg_sys::NodeTag::T_SubLink => {
                find_param((*(node as *mut pg_sys::SubLink)).testexpr, context)
            }
            _ => expression_tree_walker(node, find_param, context),
        }
    }
}

/// The sublinks of this query level in `node` (not those inside them).
///
/// # Safety
/// `node` is NULL or a valid expression tree.
pub(crate) unsafe fn level_sublinks(node: *mut pg_sys::Node) -> Vec<*mut pg_sys::SubLink> {
    let mut found: Vec<*mut pg_sys::SubLink> = Vec::new();
    // SAFETY: the walker gets our vector back and only pushes pointers.
    unsafe {
        collect_sublinks(
            node,
            &mut found as *mut Vec<*mut pg_sys::SubLink> as *mut c_void,
        );
    }
    found
}

unsafe extern "C-unwind" fn collect_sublinks(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: context is the vector passed to `level_sublinks`.
    unsafe {
        let found = &mut *(context as *mut Vec<*mut pg_sys::SubLink>);
        match (*node).type_ {
            pg_sys::NodeTag::T_SubLink => {
                let sublink = node as *mut pg_sys::SubLink;
                found.push(sublink);
                // Its test expression is of this level; its query is not.
                return collect_sublinks((*sublink).testexpr, context);
            }
            pg_sys::NodeTag::T_Query => return false,
            _ => {}
        }
        expression_tree_walker(node, collect_sublinks, context)
    }
}
