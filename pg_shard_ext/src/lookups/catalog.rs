//! The lookups of the catalog (`pg_shard.lookup`), as the executor reads
//! them on every write: cached per map version (`create_lookup` and
//! `drop_lookup` make a new one) and emptied on relcache invalidations.

use crate::error::{Result, ShardError};
use pgrx::prelude::*;
use std::cell::RefCell;

/// One lookup table.
#[derive(Clone, Debug)]
pub(crate) struct Lookup {
    pub(crate) lookup_id: i32,
    /// The table it looks up rows of, and the column.
    pub(crate) table_rel: pg_sys::Oid,
    pub(crate) column: String,
    pub(crate) attnum: i16,
    /// The lookup table (distributed by its `value` column).
    pub(crate) lookup_rel: pg_sys::Oid,
    pub(crate) unique: bool,
    /// The value column's type, as format_type prints it (for casts).
    pub(crate) value_type: String,
    /// The lookup table's name, qualified, for messages.
    pub(crate) display: String,
}

#[derive(Default)]
struct Cache {
    version: Option<i64>,
    /// Every lookup (None: not read yet at this version).
    lookups: Option<Vec<Lookup>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// Forget what was read (relcache invalidations).
pub(crate) fn forget_cache() {
    CACHE.with(|cache| *cache.borrow_mut() = Cache::default());
}

/// `work` over every lookup of the catalog, read once per map version
/// (borrowed from the cache: the executor asks on every write).
fn with_all<T>(work: impl FnOnce(&[Lookup]) -> T) -> Result<T> {
    let version = crate::metadata::shard_lookup::map_version_now()?;
    let fresh =
        CACHE.with_borrow(|cache| cache.version == Some(version) && cache.lookups.is_some());
    if !fresh {
        let lookups = read_all()?;
        CACHE.with_borrow_mut(|cache| {
            *cache = Cache {
                version: Some(version),
                lookups: Some(lookups),
            }
        });
    }
    Ok(CACHE.with_borrow(|cache| work(cache.lookups.as_deref().unwrap_or_default())))
}

fn read_all() -> Result<Vec<Lookup>> {
    crate::spi::connect(|client| {
        let mut lookups = Vec::new();
        for row in client.select(
            "SELECT l.lookup_id, l.table_rel::oid, a.attname::text, l.lookup_rel::oid, l.is_unique, \
                    pg_catalog.format_type(v.atttypid, v.atttypmod), l.lookup_rel::text, \
                    l.column_attnum \
             FROM pg_shard.lookup l \
             JOIN pg_catalog.pg_attribute a \
               ON a.attrelid = l.table_rel AND a.attnum = l.column_attnum \
             JOIN pg_catalog.pg_attribute v \
               ON v.attrelid = l.lookup_rel AND v.attname = 'value' \
             ORDER BY l.lookup_id",
            None,
            &[],
        )? {
            lookups.push(Lookup {
                lookup_id: row.get::<i32>(1)?.unwrap_or_default(),
                table_rel: row.get::<pg_sys::Oid>(2)?.unwrap_or_default(),
                column: row.get::<String>(3)?.unwrap_or_default(),
                lookup_rel: row.get::<pg_sys::Oid>(4)?.unwrap_or_default(),
                unique: row.get::<bool>(5)?.unwrap_or(false),
                value_type: row.get::<String>(6)?.unwrap_or_default(),
                display: row.get::<String>(7)?.unwrap_or_default(),
                attnum: row.get::<i16>(8)?.unwrap_or_default(),
            });
        }
        Ok::<_, ShardError>(lookups)
    })
}

/// Whether one of `tables` has a lookup: its writes' changes must be taken.
pub(crate) fn any_has_lookups(tables: &[pg_sys::Oid]) -> Result<bool> {
    if tables.is_empty() {
        return Ok(false);
    }
    with_all(|all| all.iter().any(|l| tables.contains(&l.table_rel)))
}

/// The lookups of table `relid`.
pub(crate) fn lookups_of(relid: pg_sys::Oid) -> Result<Vec<Lookup>> {
    with_all(|all| {
        all.iter()
            .filter(|l| l.table_rel == relid)
            .cloned()
            .collect()
    })
}

/// The lookup with id `lookup_id`.
pub(crate) fn by_id(lookup_id: i32) -> Result<Lookup> {
    with_all(|all| all.iter().find(|l| l.lookup_id == lookup_id).cloned())?.ok_or_else(|| {
        ShardError::Internal(format!(
            "a shard recorded changes of lookup {lookup_id}, which the catalog does not hold"
        ))
    })
}

/// Whether `relid` is a lookup table (written only by pg_shard).
pub(crate) fn is_lookup_table(relid: pg_sys::Oid) -> Result<bool> {
    Ok(table_of_lookup(relid)?.is_some())
}

/// The table whose lookup table is `relid`, if it is one.
pub(crate) fn table_of_lookup(relid: pg_sys::Oid) -> Result<Option<pg_sys::Oid>> {
    with_all(|all| {
        all.iter()
            .find(|l| l.lookup_rel == relid)
            .map(|l| l.table_rel)
    })
}
