//! Pruning by self-routing ids: beside `id_column = value` on a table whose
//! id column is declared with `pg_shard.set_routing_id`, the keyspace
//! condition `keyspace_id(key) BETWEEN first AND last` of the prefix the id
//! carries. The shards' CHECK (an id's prefix is its key's) makes it
//! implied, and aligned shard boundaries make it name one partition.

use super::conditions::{int8_comparison, INT8_GREATER_EQUAL_OPERATOR, INT8_LESS_EQUAL_OPERATOR};
use super::partition_key::{
    call_on_copy, column_keyspace_call, lookup_function, partitioned_column, Busy,
};
use pgrx::prelude::*;
use pgrx::PgList;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

thread_local! {
    /// The routing column (attribute number) of each distributed table
    /// looked at, until the next relcache invalidation.
    static ROUTING_COLUMNS: RefCell<HashMap<pg_sys::Oid, Option<i16>>> =
        RefCell::new(HashMap::new());
    static RANGE_START_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static RANGE_END_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
}

pub(super) fn forget_cache() {
    ROUTING_COLUMNS.with_borrow_mut(HashMap::clear);
    RANGE_START_FUNCTION.set(pg_sys::InvalidOid);
    RANGE_END_FUNCTION.set(pg_sys::InvalidOid);
}

/// The keyspace condition implied by `a = b` when one side is a routing
/// column of this query level and the other an integer fixed per
/// execution (the caller checked that the operator is an integer `=`).
pub(super) unsafe fn condition(
    query: *mut pg_sys::Query,
    a: *mut pg_sys::Node,
    b: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: a and b are valid expression nodes of `query`.
    unsafe {
        let (column, value) = if is_routing_column(query, a) {
            (a, b)
        } else if is_routing_column(query, b) {
            (b, a)
        } else {
            return None;
        };
        if !super::conditions::usable_value(column, value) {
            return None;
        }
        let start = lookup_function(&RANGE_START_FUNCTION, "pg_shard.id_keyspace_start(bigint)")?;
        let end = lookup_function(&RANGE_END_FUNCTION, "pg_shard.id_keyspace_end(bigint)")?;
        let as_bigint = as_bigint(value)?;
        let bound = |operator: pg_sys::Oid, function: pg_sys::Oid| -> Option<*mut pg_sys::Node> {
            Some(int8_comparison(
                operator,
                column_keyspace_call(query, column)?,
                call_on_copy(function, pg_sys::INT8OID, as_bigint),
            ))
        };
        let mut both = PgList::<pg_sys::Node>::new();
        both.push(bound(INT8_GREATER_EQUAL_OPERATOR, start)?);
        both.push(bound(INT8_LESS_EQUAL_OPERATOR, end)?);
        Some(pg_sys::make_andclause(both.into_pg()) as *mut pg_sys::Node)
    }
}

/// `value` as a bigint expression (smallint and integer values are cast).
unsafe fn as_bigint(value: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    // SAFETY: value is a valid expression node.
    unsafe {
        let from = pg_sys::exprType(value);
        if from == pg_sys::INT8OID {
            return Some(value);
        }
        let cast = pg_sys::coerce_to_target_type(
            std::ptr::null_mut(),
            value,
            from,
            pg_sys::INT8OID,
            -1,
            pg_sys::CoercionContext::COERCION_IMPLICIT,
            pg_sys::CoercionForm::COERCE_IMPLICIT_CAST,
            -1,
        );
        (!cast.is_null()).then_some(cast)
    }
}

/// Whether `node` is a plain column reference (this query level) to the
/// routing column of a distributed table.
unsafe fn is_routing_column(query: *mut pg_sys::Query, node: *mut pg_sys::Node) -> bool {
    // SAFETY: as partitioned_column's.
    unsafe { partitioned_column(query, node) }
        .is_some_and(|(relid, attno)| routing_attnum(relid) == Some(attno))
}

fn routing_attnum(relid: pg_sys::Oid) -> Option<i16> {
    if let Some(known) = ROUTING_COLUMNS.with_borrow(|cache| cache.get(&relid).copied()) {
        return known;
    }
    let busy = Busy::start();
    let found = crate::spi::query_one::<i16>(
        "SELECT routing_attnum FROM pg_shard.logical_table WHERE table_rel = $1",
        &[relid.into()],
    );
    drop(busy);
    // (An error, say the extension being dropped, is not cached.)
    let attnum = found.ok()?;
    ROUTING_COLUMNS.with_borrow_mut(|cache| cache.insert(relid, attnum));
    attnum
}
