//! Shard-group pruning for the pushdown class: the keyspace ids a
//! statement's top level restricts its distribution column to (`key = c`,
//! `key IN (…)`, `key = ANY (constant array)` in WHERE or an inner join's
//! ON), so only their shard groups run.

use super::conditions::{is_key_equality, same_key_types};
use super::partition_key::strip_relabel;
use super::router::constant_keyspace_id;
use super::separable::Level;
use pgrx::prelude::*;
use pgrx::PgList;

/// The keyspace ids the statement's rows can have, when its WHERE (or an
/// inner join) restricts a distribution column to constants (`key = 5`,
/// `key IN (1, 2)`): only their shard groups need to run.
pub(super) unsafe fn restricted_keyspace_ids(
    query: *mut pg_sys::Query,
    level: &Level,
) -> Option<Vec<i64>> {
    // SAFETY: a valid Query.
    unsafe {
        let mut best: Option<Vec<i64>> = None;
        let mut conditions = Vec::new();
        filtering_conditions((*query).jointree as *mut pg_sys::Node, &mut conditions);
        for condition in conditions {
            if let Some(ids) = condition_keyspace_ids(query, level, condition) {
                if best.as_ref().is_none_or(|b| ids.len() < b.len()) {
                    best = Some(ids);
                }
            }
        }
        best
    }
}

/// The top-level AND terms of WHERE and of inner joins' ON (the conditions
/// every row of the statement meets).
unsafe fn filtering_conditions(node: *mut pg_sys::Node, out: &mut Vec<*mut pg_sys::Node>) {
    // SAFETY: join tree and expression nodes of a valid Query.
    unsafe {
        if node.is_null() {
            return;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_FromExpr => {
                let from = node as *mut pg_sys::FromExpr;
                and_terms((*from).quals, out);
                for item in PgList::<pg_sys::Node>::from_pg((*from).fromlist).iter_ptr() {
                    filtering_conditions(item, out);
                }
            }
            pg_sys::NodeTag::T_JoinExpr => {
                let join = node as *mut pg_sys::JoinExpr;
                if (*join).jointype == pg_sys::JoinType::JOIN_INNER {
                    and_terms((*join).quals, out);
                    filtering_conditions((*join).larg, out);
                    filtering_conditions((*join).rarg, out);
                }
            }
            _ => {}
        }
    }
}

unsafe fn and_terms(node: *mut pg_sys::Node, out: &mut Vec<*mut pg_sys::Node>) {
    // SAFETY: expression nodes of a valid Query.
    unsafe {
        if node.is_null() {
            return;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_List => {
                for item in PgList::<pg_sys::Node>::from_pg(node as *mut pg_sys::List).iter_ptr() {
                    and_terms(item, out);
                }
            }
            pg_sys::NodeTag::T_BoolExpr
                if (*(node as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR =>
            {
                let args = (*(node as *mut pg_sys::BoolExpr)).args;
                for item in PgList::<pg_sys::Node>::from_pg(args).iter_ptr() {
                    and_terms(item, out);
                }
            }
            _ => out.push(node),
        }
    }
}

/// The keyspace ids a condition allows a distribution column: `key = c`
/// or `key = ANY (constant array)`.
unsafe fn condition_keyspace_ids(
    query: *mut pg_sys::Query,
    level: &Level,
    condition: *mut pg_sys::Node,
) -> Option<Vec<i64>> {
    // SAFETY: a valid expression of the Query.
    unsafe {
        match (*condition).type_ {
            pg_sys::NodeTag::T_OpExpr => {
                let op = condition as *mut pg_sys::OpExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                if args.len() != 2 || !is_key_equality((*op).opno, (*op).inputcollid) {
                    return None;
                }
                let (left, right) = (args.get_ptr(0)?, args.get_ptr(1)?);
                if !same_key_types(pg_sys::exprType(left), pg_sys::exprType(right)) {
                    return None;
                }
                let value = if level.member_of(query, left, None).is_some() {
                    right
                } else if level.member_of(query, right, None).is_some() {
                    left
                } else {
                    return None;
                };
                Some(vec![constant_keyspace_id(value)?])
            }
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                let op = condition as *mut pg_sys::ScalarArrayOpExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                if !(*op).useOr
                    || args.len() != 2
                    || !is_key_equality((*op).opno, (*op).inputcollid)
                {
                    return None;
                }
                let (left, right) = (args.get_ptr(0)?, args.get_ptr(1)?);
                level.member_of(query, left, None)?;
                let mut array = strip_relabel(right);
                if array.is_null()
                    || pg_sys::contain_vars_of_level(array, 0)
                    || pg_sys::contain_volatile_functions(array)
                    || pg_sys::contain_subplans(array)
                {
                    return None;
                }
                if (*array).type_ != pg_sys::NodeTag::T_Const {
                    // ARRAY[1, 2, 3] is folded to a constant on a copy.
                    let copy = pg_sys::copyObjectImpl(array as *const std::ffi::c_void)
                        as *mut pg_sys::Node;
                    array =
                        strip_relabel(pg_sys::eval_const_expressions(std::ptr::null_mut(), copy));
                    if (*array).type_ != pg_sys::NodeTag::T_Const {
                        return None;
                    }
                }
                let constant = array as *mut pg_sys::Const;
                let element = pg_sys::get_element_type((*constant).consttype);
                if (*constant).constisnull
                    || element == pg_sys::InvalidOid
                    || !same_key_types(pg_sys::exprType(left), element)
                {
                    return None;
                }
                let mut length: i16 = 0;
                let mut by_value = false;
                let mut align: std::ffi::c_char = 0;
                pg_sys::get_typlenbyvalalign(element, &mut length, &mut by_value, &mut align);
                let mut values: *mut pg_sys::Datum = std::ptr::null_mut();
                let mut nulls: *mut bool = std::ptr::null_mut();
                let mut count: i32 = 0;
                pg_sys::deconstruct_array(
                    pg_sys::pg_detoast_datum((*constant).constvalue.cast_mut_ptr())
                        as *mut pg_sys::ArrayType,
                    element,
                    length as i32,
                    by_value,
                    align,
                    &mut values,
                    &mut nulls,
                    &mut count,
                );
                let mut ids = Vec::with_capacity(count as usize);
                for i in 0..count as usize {
                    // A NULL element matches no row.
                    if *nulls.add(i) {
                        continue;
                    }
                    ids.push(
                        crate::keyspace::key_to_keyspace_id(*values.add(i), element)
                            .ok()?
                            .to_sql(),
                    );
                }
                Some(ids)
            }
            _ => None,
        }
    }
}
