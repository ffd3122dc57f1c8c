//! Values the metadata node computes for a routed statement: the parts of
//! it that read no row but mean something else on a worker, or must happen
//! here — `now()` (the client's transaction's clock), `nextval('s')` (the
//! table's sequence lives here), `CURRENT_USER`, `current_setting(…)`,
//! pg_shard's own `next_id(…)`, a user's function. Each becomes a parameter
//! of the worker's statement, computed once when the statement runs
//! ([`crate::executor::router_scan`]), as PostgreSQL computes it once per
//! statement: a stable expression anywhere, a volatile one only where it
//! runs once (a cell of an INSERT's VALUES; elsewhere it could run once
//! per row, and the statement takes another path, as before).
//!
//! This is what lets the commonest INSERT, with `DEFAULT now()` and a
//! `bigserial` id, run on its worker in one round trip (and on a table with
//! lookups at all).

use crate::parse_tree::row_free::{lift, new_param, put_back};
use pgrx::pg_sys;

/// A statement's tree with its computed values as parameters, and the
/// planned expressions of those values, in parameter order.
pub(super) struct Computed {
    pub(super) query: *mut pg_sys::Query,
    pub(super) values: Vec<*mut pg_sys::Expr>,
}

/// `query` with each value the metadata node must compute replaced by
/// external parameter `first_number`, `first_number + 1`, …
///
/// # Safety
/// `query` is a valid parse tree (after rewriting); it is not modified.
pub(super) unsafe fn computed_here(query: *mut pg_sys::Query, first_number: i32) -> Computed {
    // SAFETY: lifting and putting back copy the tree; the decisions read
    // the lifted expressions, and plan copies of those computed here.
    unsafe {
        let (lifted_query, lifted) = lift(query);
        if lifted.is_empty() {
            return Computed {
                query,
                values: Vec::new(),
            };
        }
        let mut values = Vec::new();
        let mut replacements = Vec::with_capacity(lifted.len());
        // Stable values computed so far, and what stands for each: the
        // same value twice is one parameter (a GROUP BY matches its select
        // list's expression on the node only if they are the same).
        let mut stable: Vec<(*mut pg_sys::Node, *mut pg_sys::Node)> = Vec::new();
        for item in &lifted {
            let found = crate::parse_tree::expression_contents(item.expr);
            let portable = super::router::calls_are_portable(&found);
            let volatile = pg_sys::contain_volatile_functions(item.expr);
            if portable || (volatile && !item.once) {
                replacements.push(item.expr);
                continue;
            }
            if !volatile {
                let same = stable.iter().find(|(expr, _)| {
                    pg_sys::equal(
                        *expr as *const std::ffi::c_void,
                        item.expr as *const std::ffi::c_void,
                    )
                });
                if let Some(&(_, replacement)) = same {
                    replacements.push(
                        pg_sys::copyObjectImpl(replacement as *const std::ffi::c_void).cast(),
                    );
                    continue;
                }
            }
            // Planned as the executor needs it (default arguments filled
            // in, immutable parts folded).
            let copy =
                pg_sys::copyObjectImpl(item.expr as *const std::ffi::c_void) as *mut pg_sys::Expr;
            let mut value = pg_sys::expression_planner(copy);
            let ty = pg_sys::exprType(item.expr);
            let param = new_param(
                pg_sys::ParamKind::PARAM_EXTERN,
                first_number + values.len() as i32,
                ty,
                pg_sys::exprTypmod(item.expr),
                pg_sys::exprCollation(item.expr),
            );
            // A user's type has another oid on the node: its value goes as
            // text, cast back to the type by name in the node's statement.
            if ty.to_u32() >= pg_sys::FirstNormalObjectId {
                value = text_cast(
                    value as *mut pg_sys::Node,
                    pg_sys::TEXTOID,
                    pg_sys::DEFAULT_COLLATION_OID,
                ) as *mut pg_sys::Expr;
                (*param).paramtype = pg_sys::TEXTOID;
                (*param).paramtypmod = -1;
                (*param).paramcollid = pg_sys::DEFAULT_COLLATION_OID;
                replacements.push(text_cast(
                    param as *mut pg_sys::Node,
                    ty,
                    pg_sys::exprCollation(item.expr),
                ));
            } else {
                replacements.push(param as *mut pg_sys::Node);
            }
            if !volatile {
                if let Some(&replacement) = replacements.last() {
                    stable.push((item.expr, replacement));
                }
            }
            values.push(value);
        }
        if values.is_empty() {
            return Computed { query, values };
        }
        Computed {
            query: put_back(lifted_query, &replacements),
            values,
        }
    }
}

/// `expr` cast to `ty` through text (its output, then `ty`'s input), as
/// an explicit cast (printed `(…)::type`).
unsafe fn text_cast(
    expr: *mut pg_sys::Node,
    ty: pg_sys::Oid,
    collation: pg_sys::Oid,
) -> *mut pg_sys::Node {
    // SAFETY: a zeroed node of the right size in the planner's context.
    unsafe {
        let cast =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::CoerceViaIO>()) as *mut pg_sys::CoerceViaIO;
        (*cast).xpr.type_ = pg_sys::NodeTag::T_CoerceViaIO;
        (*cast).arg = expr as *mut pg_sys::Expr;
        (*cast).resulttype = ty;
        (*cast).resultcollid = collation;
        (*cast).coerceformat = pg_sys::CoercionForm::COERCE_EXPLICIT_CAST;
        (*cast).location = -1;
        cast as *mut pg_sys::Node
    }
}
