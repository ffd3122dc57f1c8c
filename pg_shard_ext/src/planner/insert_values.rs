//! A multi-row `INSERT … VALUES` whose rows go to several shard groups, in
//! the multi-shard DML class ([`super::modify`]): each shard group's
//! statement is the INSERT with that group's rows only, picked by the
//! keyspace id of each row's key, a constant (a custom plan's parameters
//! are constants by then). The rows are picked again from the statement
//! whenever its shard groups are found again after a move or split.

use super::conditions::same_key_types;
use super::partition_key::{only_from_entry, partition_key, range_table_entry, strip_relabel};
use super::router::constant_keyspace_id;
use pgrx::prelude::*;
use pgrx::PgList;

/// The VALUES entry an INSERT reads its rows from, and the (1-based)
/// column of those rows that goes into the target's key column.
///
/// # Safety
/// `query` is a valid Query.
unsafe fn values_entry(query: *mut pg_sys::Query) -> Option<(*mut pg_sys::RangeTblEntry, usize)> {
    // SAFETY: a valid INSERT Query: its FROM names the VALUES entry, its
    // target list the target's columns by resno.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_INSERT {
            return None;
        }
        let target = range_table_entry(query, (*query).resultRelation)?;
        let (_, key_attno) = partition_key((*target).relid)?;
        let (index, values) = only_from_entry(query)?;
        if (*values).rtekind != pg_sys::RTEKind::RTE_VALUES {
            return None;
        }
        let column = inserted_key_column(query, target, key_attno, index)?;
        if column < 1 {
            return None;
        }
        Some((values, column as usize))
    }
}

/// The keyspace id of each row of a multi-row `INSERT … VALUES`, in order;
/// None when the statement is not one, or a row's key is not a constant.
///
/// # Safety
/// `query` is a valid Query.
pub(super) unsafe fn row_keyspace_ids(query: *mut pg_sys::Query) -> Option<Vec<i64>> {
    // SAFETY: as this function's; the VALUES lists are lists of expression lists.
    unsafe {
        let (values, column) = values_entry(query)?;
        let rows = PgList::<pg_sys::List>::from_pg((*values).values_lists);
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows.iter_ptr() {
            let row = PgList::<pg_sys::Node>::from_pg(row);
            ids.push(constant_keyspace_id(row.get_ptr(column - 1)?)?);
        }
        Some(ids)
    }
}

/// Keeps in a multi-row `INSERT … VALUES` only the rows whose keyspace id
/// lies in one of `ranges` (inclusive), and gives their positions (from 0)
/// in the statement; nothing changes in other statements (None).
///
/// # Safety
/// `query` is a valid Query the caller owns (a copy made for this).
pub(super) unsafe fn keep_rows_in(
    query: *mut pg_sys::Query,
    ranges: &[(i64, i64)],
) -> Option<Vec<usize>> {
    // SAFETY: as this function's; the kept lists are the query's own.
    unsafe {
        let (values, column) = values_entry(query)?;
        let rows = PgList::<pg_sys::List>::from_pg((*values).values_lists);
        let mut kept = PgList::<pg_sys::List>::new();
        let mut positions = Vec::new();
        for (position, row) in rows.iter_ptr().enumerate() {
            let id = PgList::<pg_sys::Node>::from_pg(row)
                .get_ptr(column - 1)
                .and_then(|key| constant_keyspace_id(key));
            if id.is_some_and(|id| {
                ranges
                    .iter()
                    .any(|(start, end)| (*start..=*end).contains(&id))
            }) {
                kept.push(row);
                positions.push(position);
            }
        }
        (*values).values_lists = kept.into_pg();
        Some(positions)
    }
}

/// The column of range table entry `index` (an INSERT's FROM) that the
/// INSERT puts into its target's key column `key_attno`, when it is one
/// as it is (of a type whose keyspace ids are alike).
///
/// # Safety
/// `query` is a valid INSERT Query; `target` its target's entry.
pub(super) unsafe fn inserted_key_column(
    query: *mut pg_sys::Query,
    target: *mut pg_sys::RangeTblEntry,
    key_attno: i16,
    index: i32,
) -> Option<i16> {
    // SAFETY: an INSERT's target list names the target's columns by resno.
    unsafe {
        let key_entry = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
            .iter_ptr()
            .find(|t| !(**t).resjunk && (**t).resno == key_attno)?;
        let value = strip_relabel((*key_entry).expr as *mut pg_sys::Node);
        if value.is_null() || (*value).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = value as *mut pg_sys::Var;
        if (*var).varno != index || (*var).varlevelsup != 0 {
            return None;
        }
        let key_type = pg_sys::get_atttype((*target).relid, key_attno);
        same_key_types(pg_sys::exprType(value), key_type).then_some((*var).varattno)
    }
}
