//! A distributed table's partition key (`pg_shard.keyspace_id` of its
//! distribution column), read from the catalog, and the calls of the
//! keyspace functions that conditions are built from (their oids cached
//! until the next relcache invalidation).

use pgrx::prelude::*;
use pgrx::PgList;
use std::cell::Cell;
use std::ffi::CStr;

thread_local! {
    static KEYSPACE_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static KEYSPACES_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    pub(super) static NTH_KEYSPACE_FUNCTION: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    // Set while the hook reads the catalog, whose own queries are planned too.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Marks the hook busy while it reads the catalog; unmarks even when the
/// read fails (the error unwinds through here as a Rust panic).
pub(super) struct Busy;

impl Busy {
    pub(super) fn start() -> Busy {
        BUSY.set(true);
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.set(false);
    }
}

/// Whether the hook is reading the catalog now (its queries are planned
/// too, and are left alone).
pub(super) fn reading_catalog() -> bool {
    BUSY.get()
}

/// Forget cached catalog facts (called on every relcache invalidation).
pub(super) fn forget_cache() {
    // The extension may have been dropped and created again.
    KEYSPACE_FUNCTION.set(pg_sys::InvalidOid);
    KEYSPACES_FUNCTION.set(pg_sys::InvalidOid);
    NTH_KEYSPACE_FUNCTION.set(pg_sys::InvalidOid);
}

/// Whether `node` is a plain column reference (this query level) to the
/// distribution column of a distributed table.
pub(super) unsafe fn is_distribution_column(
    query: *mut pg_sys::Query,
    node: *mut pg_sys::Node,
) -> bool {
    // SAFETY: as partitioned_column's.
    unsafe { partitioned_column(query, node) }
        .is_some_and(|(relid, attno)| partition_key(relid).map(|(_, key)| key) == Some(attno))
}

/// A plain column reference (this query level, possibly relabelled) to a
/// partitioned table: (the table, the column's attribute number).
pub(super) unsafe fn partitioned_column(
    query: *mut pg_sys::Query,
    node: *mut pg_sys::Node,
) -> Option<(pg_sys::Oid, i16)> {
    // SAFETY: node is a valid expression; a Var's varno indexes the range table.
    unsafe {
        let node = strip_relabel(node);
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = node as *mut pg_sys::Var;
        if (*var).varlevelsup != 0 {
            return None;
        }
        let rte = range_table_entry(query, (*var).varno)?;
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
            || (*rte).relkind != pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
        {
            return None;
        }
        Some(((*rte).relid, (*var).varattno))
    }
}

/// Attribute number of pg_partitioned_table.partexprs.
const ANUM_PARTEXPRS: i16 = 8;

/// The partition key of `relid` if it is a distributed table: a single
/// `pg_shard.keyspace_id(column)` expression (freshly read, the caller may
/// modify it) and the column's attribute number. Read from the syscache, so
/// it needs no privileges, no SPI, and is never stale.
pub(super) fn partition_key(relid: pg_sys::Oid) -> Option<(*mut pg_sys::Node, i16)> {
    // SAFETY: syscache lookup and release; the stored expression text is
    // parsed into a new node tree in the current memory context.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PARTRELID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return None;
        }
        let mut is_null = false;
        let text = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::PARTRELID as i32,
            tuple,
            ANUM_PARTEXPRS,
            &mut is_null,
        );
        let expressions = if is_null {
            std::ptr::null_mut()
        } else {
            let string = pg_sys::text_to_cstring(text.cast_mut_ptr());
            pg_sys::stringToNode(string) as *mut pg_sys::List
        };
        pg_sys::ReleaseSysCache(tuple);
        let expressions = PgList::<pg_sys::Node>::from_pg(expressions);
        if expressions.len() != 1 {
            return None;
        }
        let key = expressions.get_ptr(0)?;
        if (*key).type_ != pg_sys::NodeTag::T_FuncExpr || !is_keyspace_function(key) {
            return None;
        }
        let var = key_column_var(key)?;
        Some((key, (*var).varattno))
    }
}

/// Whether a FuncExpr calls one of pg_shard's keyspace_id functions.
unsafe fn is_keyspace_function(node: *mut pg_sys::Node) -> bool {
    // SAFETY: node is a FuncExpr; the lookups read the syscache.
    unsafe {
        let funcid = (*(node as *mut pg_sys::FuncExpr)).funcid;
        let name = pg_sys::get_func_name(funcid);
        let namespace = pg_sys::get_func_namespace(funcid);
        let schema = pg_sys::get_namespace_name(namespace);
        !name.is_null()
            && !schema.is_null()
            && CStr::from_ptr(name).to_bytes() == b"keyspace_id"
            && CStr::from_ptr(schema).to_bytes() == b"pg_shard"
    }
}

/// The column inside a partition key `keyspace_id(column)` (possibly
/// relabelled, as varchar is to text).
unsafe fn key_column_var(key: *mut pg_sys::Node) -> Option<*mut pg_sys::Var> {
    // SAFETY: key is a FuncExpr with one argument.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg((*(key as *mut pg_sys::FuncExpr)).args);
        let arg = strip_relabel(args.get_ptr(0)?);
        ((*arg).type_ == pg_sys::NodeTag::T_Var).then_some(arg as *mut pg_sys::Var)
    }
}

pub(super) unsafe fn strip_relabel(mut node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: walking RelabelType nodes of a valid expression.
    unsafe {
        while !node.is_null() && (*node).type_ == pg_sys::NodeTag::T_RelabelType {
            node = (*(node as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node;
        }
        node
    }
}

/// The partition key expression of the distributed table behind `column`
/// (a Var of this query level), pointed at that Var's range table entry:
/// exactly the expression partition pruning and partitionwise planning
/// look for.
pub(super) unsafe fn column_keyspace_call(
    query: *mut pg_sys::Query,
    column: *mut pg_sys::Node,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: column is a Var (possibly relabelled) checked by is_distribution_column.
    unsafe {
        let var = strip_relabel(column) as *mut pg_sys::Var;
        let rte = range_table_entry(query, (*var).varno)?;
        let (key, _) = partition_key((*rte).relid)?;
        let key_var = key_column_var(key)?;
        (*key_var).varno = (*var).varno;
        (*key_var).varnosyn = (*var).varnosyn;
        (*key_var).varlevelsup = 0;
        Some(key)
    }
}

pub(super) unsafe fn range_table_entry(
    query: *mut pg_sys::Query,
    varno: i32,
) -> Option<*mut pg_sys::RangeTblEntry> {
    if varno < 1 {
        return None;
    }
    // SAFETY: the range table of a valid Query.
    unsafe { PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable).get_ptr(varno as usize - 1) }
}

/// The one entry an INSERT's FROM names (its SELECT's subquery or its
/// VALUES), with its index.
///
/// # Safety
/// `query` is a valid Query.
pub(super) unsafe fn only_from_entry(
    query: *mut pg_sys::Query,
) -> Option<(i32, *mut pg_sys::RangeTblEntry)> {
    // SAFETY: the join tree and range table of a valid Query.
    unsafe {
        if (*query).jointree.is_null() {
            return None;
        }
        let from = PgList::<pg_sys::Node>::from_pg((*(*query).jointree).fromlist);
        if from.len() != 1 {
            return None;
        }
        let item = from.get_ptr(0)?;
        if (*item).type_ != pg_sys::NodeTag::T_RangeTblRef {
            return None;
        }
        let index = (*(item as *mut pg_sys::RangeTblRef)).rtindex;
        Some((index, range_table_entry(query, index)?))
    }
}

/// `pg_shard.keyspace_id(<copy of node>)`.
pub(super) unsafe fn keyspace_call(node: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    let function = lookup_function(&KEYSPACE_FUNCTION, "pg_shard.keyspace_id(anyelement)")?;
    // SAFETY: node is a valid expression.
    Some(unsafe { call_on_copy(function, pg_sys::INT8OID, node) })
}

/// `pg_shard.keyspace_ids(<copy of array>)`.
pub(super) unsafe fn array_keyspace_call(array: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    let function = lookup_function(&KEYSPACES_FUNCTION, "pg_shard.keyspace_ids(anyarray)")?;
    // SAFETY: array is a valid expression.
    Some(unsafe { call_on_copy(function, pg_sys::INT8ARRAYOID, array) })
}

/// `function(<copy of node>)` returning `result_type`.
pub(super) unsafe fn call_on_copy(
    function: pg_sys::Oid,
    result_type: pg_sys::Oid,
    node: *mut pg_sys::Node,
) -> *mut pg_sys::Node {
    // SAFETY: copying a valid node and building a FuncExpr around it.
    unsafe {
        let mut args = PgList::<pg_sys::Node>::new();
        args.push(pg_sys::copyObjectImpl(node as *const std::ffi::c_void) as *mut pg_sys::Node);
        pg_sys::makeFuncExpr(
            function,
            result_type,
            args.into_pg(),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        ) as *mut pg_sys::Node
    }
}

/// The oid of a pg_shard function, looked up once per backend.
pub(super) fn lookup_function(
    cache: &'static std::thread::LocalKey<Cell<pg_sys::Oid>>,
    signature: &str,
) -> Option<pg_sys::Oid> {
    let known = cache.get();
    if known != pg_sys::InvalidOid {
        return Some(known);
    }
    let busy = Busy::start();
    let found = crate::spi::query_one::<pg_sys::Oid>(
        "SELECT to_regprocedure($1)::oid",
        &[signature.into()],
    );
    drop(busy);
    let function = found.ok().flatten()?;
    cache.set(function);
    Some(function)
}
