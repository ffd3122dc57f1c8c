//! ns/op of the two operations on every routed statement: hashing a key to
//! its keyspace id and finding the range that owns it.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use pg_shard_core::keyspace::{keyspace_id_of_int, keyspace_id_of_text};
use pg_shard_core::range::equal_ranges;
use pg_shard_core::{KeyspaceId, ShardMap};

fn keyspace_ids(c: &mut Criterion) {
    c.bench_function("keyspace_id/bigint", |b| {
        let mut key = 0i64;
        b.iter(|| {
            key = key.wrapping_add(1);
            keyspace_id_of_int(black_box(key))
        })
    });
    c.bench_function("keyspace_id/text_16_bytes", |b| {
        b.iter(|| keyspace_id_of_text(black_box("customer-0012345")))
    });
}

fn lookups(c: &mut Criterion) {
    for count in [32i64, 4096] {
        let entries = equal_ranges(count)
            .unwrap()
            .into_iter()
            .zip(0u32..)
            .collect();
        let map = ShardMap::new(1, entries).unwrap();
        c.bench_function(&format!("shard_lookup/{count}_shards"), |b| {
            let mut id = 0u64;
            b.iter(|| {
                id = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
                *map.lookup(black_box(KeyspaceId(id))).1
            })
        });
    }
    c.bench_function("route/bigint_key_32_shards", |b| {
        let entries = equal_ranges(32).unwrap().into_iter().zip(0u32..).collect();
        let map = ShardMap::new(1, entries).unwrap();
        let mut key = 0i64;
        b.iter(|| {
            key = key.wrapping_add(1);
            *map.lookup(keyspace_id_of_int(black_box(key))).1
        })
    });
}

criterion_group!(benches, keyspace_ids, lookups);
criterion_main!(benches);
