//! Pruning by a looked-up column (`pg_shard.create_lookup`): beside
//! `column = value` in a SELECT on a table with a lookup of that column,
//! the keyspace condition that the row's key is one of the keyspace ids
//! the lookup holds for the value, read when the plan starts
//! (`pg_shard.lookup_keyspace_id`, [`crate::lookups::read`]). The lookup is
//! kept in the same transaction as every write of the table, so the
//! condition is implied; the shards it names are the only ones scanned.

use super::conditions::{listed_or_above, nth_call, usable_value};
use super::partition_key::{lookup_function, partitioned_column, Busy};
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    static LOOKUP_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
}

pub(super) fn forget_cache() {
    LOOKUP_FUNCTION.set(pg_sys::InvalidOid);
}

/// The keyspace condition implied by `a = b` when one side is a looked-up
/// column of this query level (in a SELECT) and the other a value fixed
/// per execution (the caller checked that the operator is a key `=`).
pub(super) unsafe fn condition(
    query: *mut pg_sys::Query,
    a: *mut pg_sys::Node,
    b: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a and b are valid expression nodes of `query`.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_SELECT {
            return None;
        }
        let (column, value, lookup_rel) = match (looked_up(query, a), looked_up(query, b)) {
            (Some(lookup), _) => (a, b, lookup),
            (None, Some(lookup)) => (b, a, lookup),
            (None, None) => return None,
        };
        if !usable_value(column, value) {
            return None;
        }
        let function = lookup_function(
            &LOOKUP_FUNCTION,
            "pg_shard.lookup_keyspace_id(oid, anyelement, integer)",
        )?;
        let lookup = pg_sys::makeConst(
            pg_sys::OIDOID,
            -1,
            pg_sys::InvalidOid,
            4,
            pg_sys::Datum::from(lookup_rel),
            false,
            true,
        ) as *mut pg_sys::Node;
        listed_or_above(query, column, |n| nth_call(function, &[lookup, value], n))
    }
}

/// The lookup table of `node`, if it is a plain reference (this query
/// level) to a looked-up column of a distributed table.
unsafe fn looked_up(query: *mut pg_sys::Query, node: *mut pg_sys::Node) -> Option<pg_sys::Oid> {
    // SAFETY: as partitioned_column's.
    let (relid, attno) = unsafe { partitioned_column(query, node) }?;
    let busy = Busy::start();
    let lookups = crate::lookups::catalog::lookups_of(relid);
    drop(busy);
    // (An error, say the extension being dropped, prunes nothing.)
    lookups
        .ok()?
        .into_iter()
        .find(|l| l.attnum == attno)
        .map(|l| l.lookup_rel)
}

/// Whether a SELECT's WHERE has `column = value` on a looked-up column:
/// such a statement is left to the path that prunes by it (a pushdown
/// plan fixes its shard groups when it is made, before the lookup can be
/// read).
///
/// # Safety
/// `query` is a valid Query.
pub(super) unsafe fn prunes_by_lookup(query: *mut pg_sys::Query) -> bool {
    // SAFETY: a valid Query; its WHERE's conjuncts are valid expressions.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_SELECT || (*query).jointree.is_null() {
            return false;
        }
        let quals = (*(*query).jointree).quals;
        if quals.is_null() {
            return false;
        }
        let conjuncts = pgrx::PgList::<pg_sys::Node>::from_pg(pg_sys::make_ands_implicit(
            quals as *mut pg_sys::Expr,
        ));
        let found = conjuncts.iter_ptr().any(|conjunct| {
            if (*conjunct).type_ != pg_sys::NodeTag::T_OpExpr {
                return false;
            }
            let op = conjunct as *mut pg_sys::OpExpr;
            if !super::conditions::is_key_equality((*op).opno, (*op).inputcollid) {
                return false;
            }
            let args = pgrx::PgList::<pg_sys::Node>::from_pg((*op).args);
            let (Some(left), Some(right)) = (args.get_ptr(0), args.get_ptr(1)) else {
                return false;
            };
            (looked_up(query, left).is_some() && usable_value(left, right))
                || (looked_up(query, right).is_some() && usable_value(right, left))
        });
        found
    }
}
