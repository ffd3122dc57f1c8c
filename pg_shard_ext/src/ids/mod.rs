//! Self-routing ids: `pg_shard.next_id(table, key)` makes a bigint that
//! carries the top 10 bits of the key's keyspace id (layout and guarantees
//! in [`pg_shard_core::routing_id`]); `id_prefix` and `id_time` read it
//! back; `key_prefix` gives the prefix a key's ids carry (the CHECK that
//! `pg_shard.set_routing_id` adds compares the two).

pub(crate) mod generator;

use crate::error::{OrReport, Result, ShardError};
use crate::keyspace::{key_encoding_of, key_to_keyspace_id};
use pg_shard_core::routing_id;
use pg_shard_core::KeyEncoding;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::AnyElement;
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    /// Key encodings of the tables next_id was called for, until the next
    /// relcache invalidation.
    static TABLE_ENCODINGS: RefCell<HashMap<pg_sys::Oid, KeyEncoding>> =
        RefCell::new(HashMap::new());
}

/// Forget cached catalog facts (every relcache invalidation).
pub(crate) fn forget_cache() {
    TABLE_ENCODINGS.with_borrow_mut(HashMap::clear);
    generator::forget();
}

/// Called by `pg_shard.next_id(table regclass, key anyelement) → bigint`
/// (sql/pg_shard_api.sql): a new id for a row of `table` whose distribution
/// key is `key` (on a worker, `table` may be one of its shard tables).
#[pg_extern(schema = "pg_shard", volatile, parallel_restricted)]
fn next_id_internal(table: pg_sys::Oid, key: Option<AnyElement>) -> i64 {
    make_id(table, key).or_report()
}

fn make_id(table: pg_sys::Oid, key: Option<AnyElement>) -> Result<i64> {
    let encoding = table_encoding(table)?;
    let Some(key) = key else {
        return Err(ShardError::InvalidArgument(
            "pg_shard.next_id needs a key: an id carries its key's keyspace prefix".into(),
        ));
    };
    if key_encoding_of(key.oid()) != Some(encoding) {
        return Err(ShardError::InvalidArgument(format!(
            "a key of type {} does not match the {} distribution key of {}",
            crate::keyspace::type_name(key.oid()),
            encoding.name(),
            relation_name(table)
        )));
    }
    let prefix = routing_id::prefix_of_keyspace_id(key_to_keyspace_id(key.datum(), key.oid())?);
    let generator = generator::generator()?;
    let position = generator::next_position(prefix)?;
    routing_id::id_at(position, prefix, generator).ok_or_else(|| {
        ShardError::InvalidArgument(
            "pg_shard.next_id: the clock is past 2095, ids are used up".into(),
        )
    })
}

/// `pg_shard.id_prefix(id bigint) → integer`: the keyspace prefix (0–1023)
/// an id carries.
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn id_prefix(id: i64) -> i32 {
    checked(id).or_report();
    routing_id::prefix_of_id(id) as i32
}

/// `pg_shard.id_time(id bigint) → timestamptz`: when the id was made (to
/// the millisecond).
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn id_time(id: i64) -> TimestampWithTimeZone {
    checked(id).or_report();
    // PostgreSQL's timestamps count microseconds from 2000-01-01.
    const POSTGRES_EPOCH_MS: i64 = 946_684_800_000;
    let micros = (routing_id::EPOCH_MS + routing_id::time_of_id(id) - POSTGRES_EPOCH_MS) * 1000;
    TimestampWithTimeZone::try_from(micros)
        .map_err(|_| ShardError::InvalidArgument(format!("{id} has no valid time")))
        .or_report()
}

/// `pg_shard.key_prefix(key anyelement) → integer`: the prefix the ids of
/// rows with this key carry (the top 10 bits of its keyspace id).
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn key_prefix(key: AnyElement) -> i32 {
    let id = key_to_keyspace_id(key.datum(), key.oid()).or_report();
    routing_id::prefix_of_keyspace_id(id) as i32
}

fn checked(id: i64) -> Result<()> {
    if id < 0 {
        return Err(ShardError::InvalidArgument(format!(
            "{id} is not an id made by pg_shard.next_id (those are not negative)"
        )));
    }
    Ok(())
}

/// The key encoding of a distributed table (on the metadata node) or of a
/// shard table (on a worker).
fn table_encoding(table: pg_sys::Oid) -> Result<KeyEncoding> {
    if let Some(known) = TABLE_ENCODINGS.with_borrow(|cache| cache.get(&table).copied()) {
        return Ok(known);
    }
    let type_oid = crate::spi::query_one::<pg_sys::Oid>(
        "SELECT a.atttypid FROM pg_catalog.pg_attribute a \
         JOIN (SELECT table_rel AS rel, dist_column AS col FROM pg_shard.logical_table \
               WHERE table_rel = $1 AND kind = 'distributed' \
               UNION ALL \
               SELECT shard_rel, dist_column FROM pg_shard.local_shard \
               WHERE shard_rel = $1 AND dist_column IS NOT NULL) t \
           ON a.attrelid = t.rel AND a.attname = t.col",
        &[table.into()],
    )?;
    let encoding = type_oid
        .and_then(key_encoding_of)
        .ok_or_else(|| ShardError::NotDistributed(relation_name(table)))?;
    TABLE_ENCODINGS.with_borrow_mut(|cache| cache.insert(table, encoding));
    Ok(encoding)
}

fn relation_name(relid: pg_sys::Oid) -> String {
    crate::spi::query_one::<String>("SELECT $1::regclass::text", &[relid.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| relid.to_u32().to_string())
}

/// `pg_shard.id_keyspace_start(id bigint) → bigint`: the first keyspace id
/// (signed form) of the prefix the id carries; NULL for a negative id,
/// which no row holds (the planner hook prunes `id_column = value` with it).
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn id_keyspace_start(id: i64) -> Option<i64> {
    routing_id::routing_keyspace_id(id).map(|first| first.to_sql())
}

/// `pg_shard.id_keyspace_end(id bigint) → bigint`: the last keyspace id
/// (signed form) of the prefix the id carries; NULL for a negative id.
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn id_keyspace_end(id: i64) -> Option<i64> {
    (id >= 0).then(|| {
        routing_id::prefix_range(routing_id::prefix_of_id(id))
            .1
            .to_sql()
    })
}
