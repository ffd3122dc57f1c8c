//! The text a worker runs for a routed statement: the statement itself,
//! printed by PostgreSQL's own deparser (`pg_get_querydef`), with each
//! distributed table replaced by its shard table.
//!
//! Each distributed table's range table entry is pointed at the foreign
//! partition standing for its shard, so the deparser prints that
//! partition's name (always schema-qualified: it prints under
//! `search_path = pg_catalog`), and the name is then replaced by the shard
//! table's, outside string literals and quoted identifiers. The entry keeps
//! the table's own name as its alias, so column references read as before.
//! Partitions whose columns do not line up with the table's (a dropped
//! column) are not used: the statement takes the postgres_fdw path.

use crate::error::Result;
use crate::guc::GucScope;
use crate::metadata::shard_lookup::Shard;
use pgrx::pg_sys;
use std::ffi::CStr;

/// A distributed table's entry in the statement and the shard it reads.
pub(crate) struct ShardRelation {
    pub(crate) rte: *mut pg_sys::RangeTblEntry,
    pub(crate) shard: Shard,
}

/// The worker's statement; None if a partition's columns differ from its
/// table's. `renames` are other names to replace (reference tables, row
/// types). Changes the entries of `query`, a copy made for this. A shard
/// without its foreign partition yet (a cleanup to come) is printed by the
/// distributed table's own name, replaced the same way: its shard tables
/// have the distributed table's columns.
///
/// # Safety
/// `query` is a valid parse tree the caller owns; the entries belong to it.
pub(super) unsafe fn worker_query(
    query: *mut pg_sys::Query,
    shards: &[ShardRelation],
    renames: Vec<(String, String)>,
) -> Result<Option<String>> {
    let mut replacements: Vec<(String, String)> = Vec::new();
    for relation in shards {
        // SAFETY: a valid entry of `query`; syscache lookups.
        unsafe {
            let rte = relation.rte;
            let partition = relation.shard.partition;
            if partition != pg_sys::InvalidOid && !same_columns((*rte).relid, partition) {
                return Ok(None);
            }
            // Named by the distributed table's own name, a shard must be
            // its table's only one in the statement (two entries of one
            // table on different shards would both get the first's name),
            // and a plain table (not several shards read as one, whose
            // text would also replace the table's row type).
            if partition == pg_sys::InvalidOid
                && (relation.shard.qualified.starts_with('(')
                    || shards
                        .iter()
                        .filter(|other| (*other.rte).relid == (*rte).relid)
                        .any(|other| other.shard.qualified != relation.shard.qualified))
            {
                return Ok(None);
            }
            if (*rte).alias.is_null() {
                (*rte).alias = pg_sys::makeAlias((*(*rte).eref).aliasname, std::ptr::null_mut());
            }
            if partition != pg_sys::InvalidOid {
                (*rte).relid = partition;
                (*rte).relkind = pg_sys::RELKIND_FOREIGN_TABLE as std::ffi::c_char;
            }
            let printed = qualified_name((*rte).relid);
            match replacements.iter().find(|(from, _)| *from == printed) {
                None => replacements.push((printed, relation.shard.qualified.clone())),
                Some((_, to)) if *to != relation.shard.qualified => return Ok(None),
                Some(_) => {}
            }
        }
    }
    // Every table keeps its own name as its alias, so that column
    // references still name it once the table's name is replaced (a
    // reference table's by its copy's).
    // SAFETY: entries of the caller's tree.
    unsafe {
        for rte in crate::parse_tree::contents(query).range_entries {
            if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION && (*rte).alias.is_null() {
                (*rte).alias = pg_sys::makeAlias((*(*rte).eref).aliasname, std::ptr::null_mut());
            }
        }
    }
    replacements.extend(renames);
    let _path = GucScope::set_one("search_path", "pg_catalog");
    // SAFETY: deparsing a valid Query into a palloc'd string.
    let text = unsafe { CStr::from_ptr(pg_sys::pg_get_querydef(query, false)) }
        .to_string_lossy()
        .trim()
        .to_string();
    Ok(Some(crate::quote::replace_names(&text, &replacements)))
}

/// Whether two relations have the same column names at the same numbers.
unsafe fn same_columns(a: pg_sys::Oid, b: pg_sys::Oid) -> bool {
    let mut attno: i16 = 1;
    loop {
        // SAFETY: syscache lookups; NULL past the last column.
        let (x, y) = unsafe {
            (
                pg_sys::get_attname(a, attno, true),
                pg_sys::get_attname(b, attno, true),
            )
        };
        match (x.is_null(), y.is_null()) {
            (true, true) => return true,
            (false, false) => {
                // SAFETY: both are palloc'd names.
                if unsafe { CStr::from_ptr(x) != CStr::from_ptr(y) } {
                    return false;
                }
            }
            _ => return false,
        }
        attno += 1;
    }
}

/// `schema.name` of a relation as the deparser prints it.
pub(super) unsafe fn qualified_name(relid: pg_sys::Oid) -> String {
    // SAFETY: syscache lookups of an existing relation.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        CStr::from_ptr(pg_sys::quote_qualified_identifier(schema, name))
            .to_string_lossy()
            .into_owned()
    }
}
