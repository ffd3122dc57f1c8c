//! Reading a lookup: the keyspace ids of the rows holding a value, from
//! the lookup's shard for it, in the local transaction's remote
//! transaction there when it has one (it sees the transaction's writes),
//! else on a connection of its own. `pg_shard.lookup_keyspace_id` gives
//! them to the planner's pruning ([`crate::planner`]).

use crate::error::{OrReport, Result, ShardError};
use crate::transaction::remote::{autocommit, has_transaction_on, with_transaction, Access};
use pgrx::prelude::*;
use pgrx::AnyElement;
use std::cell::RefCell;
use std::ffi::CStr;

/// The last value read: (lookup, value, statement, command) and its ids.
/// A statement asks once per shard for the same value.
type Cached = ((pg_sys::Oid, String, i64, u32), Vec<i64>);

thread_local! {
    static LAST: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

/// `pg_shard.lookup_keyspace_id(lookup oid, value anyelement, n integer)`:
/// the n-th smallest (from 1) distinct keyspace id the lookup holds for
/// `value`, NULL when there are fewer.
#[pg_extern(schema = "pg_shard", stable, strict, parallel_restricted)]
fn lookup_keyspace_id(lookup: pg_sys::Oid, value: AnyElement, n: i32) -> Option<i64> {
    if n < 1 {
        return None;
    }
    // SAFETY: the output function of the value's type, on a datum of it;
    // reads of the transaction state.
    let (text, statement, command) = unsafe {
        let mut output = pg_sys::InvalidOid;
        let mut varlena = false;
        pg_sys::getTypeOutputInfo(value.oid(), &mut output, &mut varlena);
        let text = pg_sys::OidOutputFunctionCall(output, value.datum());
        (
            CStr::from_ptr(text).to_string_lossy().into_owned(),
            pg_sys::GetCurrentStatementStartTimestamp(),
            pg_sys::GetCurrentCommandId(false),
        )
    };
    let key = (lookup, text, statement, command);
    let cached = LAST.with_borrow(|last| match last {
        Some((k, ids)) if *k == key => Some(ids.clone()),
        _ => None,
    });
    let ids = match cached {
        Some(ids) => ids,
        None => {
            let ids = keyspace_ids(lookup, &value, &key.1).or_report();
            LAST.with_borrow_mut(|last| *last = Some((key, ids.clone())));
            ids
        }
    };
    ids.get(n as usize - 1).copied()
}

/// The distinct keyspace ids the lookup holds for `value` (`text` its
/// text), sorted.
fn keyspace_ids(lookup_rel: pg_sys::Oid, value: &AnyElement, text: &str) -> Result<Vec<i64>> {
    let value_id = crate::keyspace::key_to_keyspace_id(value.datum(), value.oid())?.to_sql();
    let (node, qualified) = match crate::metadata::shard_lookup::shard_of(lookup_rel, value_id)? {
        Some(shard) => (shard.node, shard.qualified),
        None => {
            crate::metadata::shard_lookup::latest_owner(lookup_rel, value_id)?.ok_or_else(|| {
                ShardError::Timeout(
                    "the lookup's shard holding this value is being moved or split; run the \
                     statement again"
                        .into(),
                )
            })?
        }
    };
    let sql = format!("SELECT keyspace_id FROM {qualified} WHERE value OPERATOR(pg_catalog.=) $1");
    let mut ids = Vec::new();
    let read = |connection: &mut crate::transaction::connection::NodeConnection| {
        connection.for_each_row(&sql, &[], &[Some(text)], |row| {
            if let Some(id) = row.text(0).and_then(|t| t.parse::<i64>().ok()) {
                ids.push(id);
            }
            Ok(())
        })
    };
    if has_transaction_on(&node) {
        with_transaction(&node, Access::Read, read)?;
    } else {
        autocommit(&node, read)?;
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
