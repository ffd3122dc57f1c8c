//! REINDEX TABLE / INDEX of distributed and reference tables: every shard
//! table (or its copy of the index) is rebuilt, one shard at a time, each in
//! its own transaction on its worker — a rebuilt index means what the old
//! one meant, so there is nothing to keep atomic, and a shard's lock is held
//! only while that shard is rebuilt. A distributed table's indexes exist
//! only on its shards; a reference table rebuilds its own first.
//!
//! REINDEX SCHEMA / DATABASE / SYSTEM stay on the server they run on.

use super::parse::logical_table_named;
use super::plan::{Local, Planned};
use crate::error::Result;
use crate::metadata::LogicalTable;
use crate::quote;
use crate::transaction::fan_out::on_shards_one_by_one;
use pgrx::prelude::*;

/// The statement's options that the shards repeat.
struct Options {
    concurrently: bool,
    verbose: bool,
}

/// # Safety
/// `reindex` is the statement's ReindexStmt.
pub(super) unsafe fn plan(
    reindex: *mut pg_sys::ReindexStmt,
    top_level: bool,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let reindex = unsafe { &*reindex };
    use pg_sys::ReindexObjectType as K;
    let target = match reindex.kind {
        K::REINDEX_OBJECT_TABLE => {
            // SAFETY: the statement's RangeVar.
            match unsafe { logical_table_named(reindex.relation)? } {
                Some(table) => (table, None),
                None => return Ok(None),
            }
        }
        K::REINDEX_OBJECT_INDEX if !reindex.relation.is_null() => {
            // SAFETY: the statement's RangeVar.
            let parts = unsafe { super::parse::range_var_parts(reindex.relation) };
            match super::objects::index_of_logical_table(&parts)? {
                Some((table, index)) => (table, Some(index)),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let (table, index) = target;
    // SAFETY: the statement's list of DefElem options.
    let options = unsafe { options(&table, reindex.params)? };
    if options.concurrently {
        // SAFETY: raises an ERROR inside a transaction block, as PostgreSQL
        // does for REINDEX CONCURRENTLY.
        unsafe { pg_sys::PreventInTransactionBlock(top_level, c"REINDEX CONCURRENTLY".as_ptr()) };
    }
    table.refuse_during_job()?;
    table.require_owner()?;
    let local = if table.is_distributed() {
        Local::Skip
    } else {
        Local::Run
    };
    let relid = table.relid;
    Ok(Some(Planned::new(local, move || {
        let prefix = format!(
            "REINDEX {}",
            if options.verbose { "(VERBOSE) " } else { "" }
        );
        let concurrently = if options.concurrently {
            "CONCURRENTLY "
        } else {
            ""
        };
        on_shards_one_by_one(
            relid,
            |shard| match &index {
                None => format!("{prefix}TABLE {concurrently}{}", shard.qualified),
                Some(index) => format!(
                    "{prefix}INDEX {concurrently}{}",
                    quote::qualified(
                        &shard.schema,
                        &super::shard_names::shard_object_name('i', index, shard.shard_id)
                    )
                ),
            },
            // Shards rebuilt before a failure keep their new indexes.
            |_| String::new(),
        )
    })))
}

/// # Safety
/// `params` is a ReindexStmt's list of DefElem nodes, or NIL.
unsafe fn options(table: &LogicalTable, params: *mut pg_sys::List) -> Result<Options> {
    let mut options = Options {
        concurrently: false,
        verbose: false,
    };
    // SAFETY: as the caller promises.
    let params = unsafe { pgrx::PgList::<pg_sys::DefElem>::from_pg(params) };
    for param in params.iter_ptr() {
        // SAFETY: a DefElem of the list; its name is a C string.
        let name = unsafe { super::parse::text_of((*param).defname) };
        // SAFETY: as above; defGetBoolean raises an ERROR for a non-boolean.
        let value = || unsafe { pg_sys::defGetBoolean(param) };
        match name.as_str() {
            "concurrently" => options.concurrently = value(),
            "verbose" => options.verbose = value(),
            _ => {
                return Err(table.refuse(format!(
                "REINDEX option {name} is not carried to the shards (tablespaces are per server)"
            )))
            }
        }
    }
    Ok(options)
}
