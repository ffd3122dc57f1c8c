//! SQL values to keyspace ids, with the canonical encodings of the core crate.

use crate::error::{OrReport, Result, ShardError};
use pg_shard_core::keyspace::{keyspace_id as hash_key, keyspace_id_of_int, KeyspaceId};
use pgrx::prelude::*;
use pgrx::AnyElement;

/// `pg_shard.keyspace_id(anyelement) → bigint`: the key's keyspace id in the
/// order-preserving signed form (unsigned id with its top bit flipped), so
/// that SQL comparisons agree with the unsigned order of keyspace ids.
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn keyspace_id(key: AnyElement) -> i64 {
    key_to_keyspace_id(key.datum(), key.oid())
        .or_report()
        .to_sql()
}

/// `pg_shard.keyspace_id(text) → bigint`: the same for text, so that an
/// untyped literal (`keyspace_id('acme')`) resolves without a cast.
#[pg_extern(
    schema = "pg_shard",
    name = "keyspace_id",
    immutable,
    strict,
    parallel_safe
)]
fn keyspace_id_text(key: &str) -> i64 {
    pg_shard_core::keyspace::keyspace_id_of_text(key).to_sql()
}

/// `pg_shard.keyspace_ids(anyarray) → bigint[]`: the keyspace id of every
/// element (NULL for NULL). The planner hook uses it for `key = ANY(array)`
/// with a constant array.
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn keyspace_ids(keys: pgrx::AnyArray) -> Vec<Option<i64>> {
    // SAFETY: `keys` is a non-null array datum of type keys.oid().
    unsafe { array_keyspace_ids(keys.datum(), keys.oid()) }
}

/// `pg_shard.nth_keyspace_id(anyarray, integer) → bigint`: the n-th
/// smallest (from 1) distinct keyspace id of the array's non-null elements,
/// NULL when there are fewer. The planner hook turns `key = ANY($1)` into
/// `keyspace_id(key) = ANY (ARRAY[nth(1) … nth(S)]) OR keyspace_id(key) >=
/// nth(S + 1)` for a table of S shards: a list of single values PostgreSQL
/// can prune partitions with when a generic plan starts, where it cannot
/// prune with an array parameter.
#[pg_extern(schema = "pg_shard", immutable, strict, parallel_safe)]
fn nth_keyspace_id(keys: pgrx::AnyArray, n: i32) -> Option<i64> {
    if n < 1 {
        return None;
    }
    // SAFETY: `keys` is a non-null array datum of type keys.oid().
    let bytes = unsafe { array_bytes(keys.datum()) };
    SORTED_IDS.with_borrow_mut(|cache| {
        // One statement calls this once per shard with the same array: the
        // ids are computed once and reused while the array is the same.
        let fresh = !matches!(cache, Some((oid, cached, _)) if *oid == keys.oid() && cached.as_slice() == bytes);
        if fresh {
            // SAFETY: as above.
            let mut ids: Vec<i64> = unsafe { array_keyspace_ids(keys.datum(), keys.oid()) }
                .into_iter()
                .flatten()
                .collect();
            ids.sort_unstable();
            ids.dedup();
            *cache = Some((keys.oid(), bytes.to_vec(), ids));
        }
        let (_, _, ids) = cache.as_ref()?;
        ids.get(n as usize - 1).copied()
    })
}

/// An array's type, its bytes and its sorted distinct keyspace ids.
type SortedIds = (pg_sys::Oid, Vec<u8>, Vec<i64>);

thread_local! {
    /// The last array seen by nth_keyspace_id.
    static SORTED_IDS: std::cell::RefCell<Option<SortedIds>> =
        const { std::cell::RefCell::new(None) };
}

/// The bytes of an array datum (detoasted).
///
/// # Safety
/// `datum` must be a non-null array datum.
unsafe fn array_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: a detoasted varlena is readable for its full size.
    unsafe {
        let array = pg_sys::pg_detoast_datum(datum.cast_mut_ptr());
        pgrx::varlena::varlena_to_byte_slice(array)
    }
}

/// The keyspace id of every element of an array (None for NULL elements).
///
/// # Safety
/// `datum` must be a non-null array datum of type `array_type`.
unsafe fn array_keyspace_ids(datum: pg_sys::Datum, array_type: pg_sys::Oid) -> Vec<Option<i64>> {
    // SAFETY: the array is detoasted and deconstructed with its element
    // type's storage details.
    unsafe {
        let element_type = pg_sys::get_element_type(array_type);
        let array = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        let (mut length, mut by_value, mut align) = (0i16, false, 0 as std::ffi::c_char);
        pg_sys::get_typlenbyvalalign(element_type, &mut length, &mut by_value, &mut align);
        let mut elements: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut count = 0;
        pg_sys::deconstruct_array(
            array,
            element_type,
            length as i32,
            by_value,
            align,
            &mut elements,
            &mut nulls,
            &mut count,
        );
        (0..count as usize)
            .map(|i| {
                if *nulls.add(i) {
                    None
                } else {
                    Some(
                        key_to_keyspace_id(*elements.add(i), element_type)
                            .or_report()
                            .to_sql(),
                    )
                }
            })
            .collect()
    }
}

/// The keyspace id of a non-null datum of type `type_oid` (or a domain over it).
pub(crate) fn key_to_keyspace_id(
    datum: pg_sys::Datum,
    type_oid: pg_sys::Oid,
) -> Result<KeyspaceId> {
    keyspace_id_of_base_type(datum, base_type(type_oid), type_oid)
}

/// The type a domain is over (the type itself for a non-domain). A type
/// cache lookup: callers on hot paths resolve it once.
pub(crate) fn base_type(type_oid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: getBaseType only reads the type cache; it errors for an unknown oid.
    unsafe { pg_sys::getBaseType(type_oid) }
}

/// [`key_to_keyspace_id`] for a datum whose base type is already resolved;
/// `type_oid` only names the type in errors.
pub(crate) fn keyspace_id_of_base_type(
    datum: pg_sys::Datum,
    base_type: pg_sys::Oid,
    type_oid: pg_sys::Oid,
) -> Result<KeyspaceId> {
    // SAFETY: each arm reads the datum as the representation PostgreSQL uses
    // for `base_type`: int2/int4/int8 by value, text/varchar/bytea as a
    // (possibly toasted) varlena, uuid as a pointer to 16 bytes.
    unsafe {
        match base_type {
            pg_sys::INT2OID => Ok(keyspace_id_of_int(datum.value() as i16 as i64)),
            pg_sys::INT4OID => Ok(keyspace_id_of_int(datum.value() as i32 as i64)),
            pg_sys::INT8OID => Ok(keyspace_id_of_int(datum.value() as i64)),
            pg_sys::TEXTOID | pg_sys::VARCHAROID => Ok(text_keyspace_id(datum)),
            pg_sys::BYTEAOID => {
                let detoasted = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
                Ok(hash_key(pgrx::varlena::varlena_to_byte_slice(detoasted)))
            }
            pg_sys::UUIDOID => {
                let bytes = std::slice::from_raw_parts(datum.cast_mut_ptr::<u8>(), 16);
                Ok(hash_key(bytes))
            }
            _ => Err(ShardError::UnsupportedValueType(type_name(type_oid))),
        }
    }
}

/// Text hashes as its bytes, which are UTF-8: the extension refuses to be
/// created in a database of another encoding.
///
/// # Safety
/// `datum` must be a text or varchar datum.
unsafe fn text_keyspace_id(datum: pg_sys::Datum) -> KeyspaceId {
    // SAFETY: the caller passes a text datum; detoasting yields a readable varlena.
    unsafe {
        let detoasted = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
        hash_key(pgrx::varlena::varlena_to_byte_slice(detoasted))
    }
}

/// The SQL name of a type, as format_type spells it.
pub(crate) fn type_name(type_oid: pg_sys::Oid) -> String {
    // SAFETY: format_type_be returns a palloc'd C string for any oid.
    unsafe {
        let name = pg_sys::format_type_be(type_oid);
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether a column type has a canonical key encoding (looking through domains).
pub(crate) fn key_encoding_of(type_oid: pg_sys::Oid) -> Option<pg_shard_core::KeyEncoding> {
    use pg_shard_core::KeyEncoding;
    // SAFETY: getBaseType only reads the type cache.
    match unsafe { pg_sys::getBaseType(type_oid) } {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => Some(KeyEncoding::Integer),
        pg_sys::TEXTOID | pg_sys::VARCHAROID => Some(KeyEncoding::Text),
        pg_sys::UUIDOID => Some(KeyEncoding::Uuid),
        pg_sys::BYTEAOID => Some(KeyEncoding::Bytes),
        _ => None,
    }
}
