//! Values the metadata node computes for a statement that runs on the
//! workers ([`crate::planner::computed_values`]): their expressions are the
//! plan's `custom_exprs`, evaluated once each time the plan runs, and sent
//! as parameters (the router) or as literals in the statements' text (the
//! multi-shard modify scan, whose statements go several to a message).

use pgrx::prelude::*;
use std::ffi::{CStr, CString};

/// A computed value: its datum (in the query's memory), whether NULL, and
/// its type.
pub(crate) type Value = (pg_sys::Datum, bool, pg_sys::Oid);

/// The values the plan computes here, each once for this run, in the
/// query's memory context (see [`crate::planner::computed_values`]).
pub(crate) unsafe fn compute(planstate: *mut pg_sys::PlanState) -> Vec<Value> {
    // SAFETY: a running scan of our plan; its expression context is the
    // one ExecInitCustomScan made, and evaluation errors are raised as
    // PostgreSQL's (through pgrx's guarded calls).
    unsafe {
        let plan = (*planstate).plan as *mut pg_sys::CustomScan;
        let econtext = (*planstate).ps_ExprContext;
        pgrx::PgList::<pg_sys::Expr>::from_pg((*plan).custom_exprs)
            .iter_ptr()
            .map(|expr| {
                let compiled = pg_sys::ExecInitExpr(expr, planstate);
                let mut null = false;
                let value = pg_sys::ExecEvalExpr(compiled, econtext, &mut null);
                (value, null, pg_sys::exprType(expr as *mut pg_sys::Node))
            })
            .collect()
    }
}

/// The worker statement's parameters: the first `own` of the statement's,
/// then the computed values. None when the statement has fewer than `own`.
pub(crate) unsafe fn worker_parameters(
    params: pg_sys::ParamListInfo,
    own: i32,
    computed: &[Value],
) -> Option<pg_sys::ParamListInfo> {
    // SAFETY: a valid parameter list (or NULL); the new one is allocated
    // in the current (query) context and filled whole.
    unsafe {
        if own > 0 && (params.is_null() || (*params).numParams < own) {
            return None;
        }
        let list = pg_sys::makeParamList(own + computed.len() as i32);
        let slots = (*list).params.as_mut_ptr();
        for i in 0..own as usize {
            *slots.add(i) = *(*params).params.as_mut_ptr().add(i);
        }
        for (i, &(value, isnull, ptype)) in computed.iter().enumerate() {
            let slot = slots.add(own as usize + i);
            (*slot).value = value;
            (*slot).isnull = isnull;
            (*slot).pflags = pg_sys::PARAM_FLAG_CONST as u16;
            (*slot).ptype = ptype;
        }
        Some(list)
    }
}

/// Each computed value as the literal that stands for its parameter in a
/// statement's text (`$1` for the first): `('text'::type)`, or
/// `(NULL::type)`; the type without a modifier (`bpchar`, not `character`,
/// which is char(1)).
pub(crate) unsafe fn literals(values: &[Value]) -> Vec<String> {
    values
        .iter()
        .map(|&(value, isnull, ty)| {
            // SAFETY: a value of type `ty` (or NULL); the type's output
            // function and name from the catalogs.
            let (text, name) = unsafe {
                let flags = pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY;
                let name = CStr::from_ptr(pg_sys::format_type_extended(ty, -1, flags as u16))
                    .to_string_lossy()
                    .into_owned();
                let text = if isnull {
                    None
                } else {
                    let mut output = pg_sys::InvalidOid;
                    let mut varlena = false;
                    pg_sys::getTypeOutputInfo(ty, &mut output, &mut varlena);
                    let text = pg_sys::OidOutputFunctionCall(output, value);
                    Some(CStr::from_ptr(text).to_string_lossy().into_owned())
                };
                (text, name)
            };
            let literal = match text {
                Some(text) => pg_shard_core::quote::literal(&text),
                None => "NULL".to_string(),
            };
            format!("({literal}::{name})")
        })
        .collect()
}

/// EXPLAIN's `Computed Here`: each computed value's parameter and
/// expression (parameters `first + 1`, …).
pub(crate) unsafe fn explain(
    planstate: *mut pg_sys::PlanState,
    own: usize,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: a running scan's plan; deparse_expression prints a
    // row-free expression without a context; strings are copied by
    // ExplainPropertyText.
    unsafe {
        let plan = (*planstate).plan as *mut pg_sys::CustomScan;
        let computed = pgrx::PgList::<pg_sys::Node>::from_pg((*plan).custom_exprs);
        if computed.is_empty() {
            return;
        }
        let values: Vec<String> = computed
            .iter_ptr()
            .enumerate()
            .map(|(i, expr)| {
                let text = pg_sys::deparse_expression(expr, std::ptr::null_mut(), false, false);
                format!(
                    "${} = {}",
                    own + 1 + i,
                    CStr::from_ptr(text).to_string_lossy()
                )
            })
            .collect();
        let value = CString::new(values.join(", ")).unwrap_or_default();
        pg_sys::ExplainPropertyText(c"Computed Here".as_ptr(), value.as_ptr(), es);
    }
}

/// Sets the plan's computed values (`custom_exprs` of its top scan).
pub(crate) unsafe fn attach(planned: *mut pg_sys::PlannedStmt, computed: Vec<*mut pg_sys::Expr>) {
    // SAFETY: a statement plan whose top node is one of our scans.
    unsafe {
        let mut list = pgrx::PgList::<pg_sys::Expr>::new();
        for expr in computed {
            list.push(expr);
        }
        (*((*planned).planTree as *mut pg_sys::CustomScan)).custom_exprs = list.into_pg();
    }
}
