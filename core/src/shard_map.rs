//! A versioned shard map: which target (shard, node, …) owns each range of a
//! table's keyspace, and the map version it was read at.

use crate::keyspace::KeyspaceId;
use crate::range::{check_cover, KeyRange, RangeError};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShardMapError {
    #[error("invalid shard map: {0}")]
    Ranges(#[from] RangeError),
}

/// Ranges sorted by start, covering the keyspace exactly once, each with the
/// target that owns it. Lookups are a binary search over the range starts.
#[derive(Clone, Debug)]
pub struct ShardMap<T> {
    version: i64,
    starts: Vec<KeyspaceId>,
    entries: Vec<(KeyRange, T)>,
}

impl<T> ShardMap<T> {
    /// Build a map from entries in any order; fails unless the ranges cover
    /// the keyspace without gaps or overlaps.
    pub fn new(version: i64, mut entries: Vec<(KeyRange, T)>) -> Result<Self, ShardMapError> {
        entries.sort_by_key(|(range, _)| range.start);
        let ranges: Vec<KeyRange> = entries.iter().map(|(range, _)| *range).collect();
        check_cover(&ranges)?;
        Ok(ShardMap {
            version,
            starts: ranges.iter().map(|r| r.start).collect(),
            entries,
        })
    }

    pub fn version(&self) -> i64 {
        self.version
    }

    /// The range owning `id` and its target. Total: a valid map covers every id.
    #[inline]
    pub fn lookup(&self, id: KeyspaceId) -> (&KeyRange, &T) {
        // The first range's start is 0, so partition_point is at least 1.
        let index = self.starts.partition_point(|start| *start <= id) - 1;
        let (range, target) = &self.entries[index];
        (range, target)
    }

    /// Index of the range owning `id`, in keyspace order.
    #[inline]
    pub fn index_of(&self, id: KeyspaceId) -> usize {
        self.starts.partition_point(|start| *start <= id) - 1
    }

    pub fn entries(&self) -> &[(KeyRange, T)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::keyspace_id_of_int;
    use crate::range::equal_ranges;
    use proptest::prelude::*;

    fn map_of(count: i64) -> ShardMap<usize> {
        let entries = equal_ranges(count)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r, i))
            .collect();
        ShardMap::new(7, entries).unwrap()
    }

    #[test]
    fn lookup_finds_boundaries() {
        let map = map_of(4);
        assert_eq!(map.version(), 7);
        assert_eq!(*map.lookup(KeyspaceId(0)).1, 0);
        assert_eq!(*map.lookup(KeyspaceId((1 << 62) - 1)).1, 0);
        assert_eq!(*map.lookup(KeyspaceId(1 << 62)).1, 1);
        assert_eq!(*map.lookup(KeyspaceId::MAX).1, 3);
    }

    #[test]
    fn entries_in_any_order_are_sorted() {
        let mut entries: Vec<_> = equal_ranges(8).unwrap().into_iter().zip(0..).collect();
        entries.reverse();
        let map = ShardMap::new(1, entries).unwrap();
        assert_eq!(*map.lookup(KeyspaceId(0)).1, 0);
        assert_eq!(map.len(), 8);
    }

    #[test]
    fn maps_with_holes_are_rejected() {
        let mut entries: Vec<_> = equal_ranges(4).unwrap().into_iter().zip(0..).collect();
        entries.remove(2);
        assert!(matches!(
            ShardMap::new(1, entries),
            Err(ShardMapError::Ranges(RangeError::Gap { .. }))
        ));
    }

    #[test]
    fn key_42_with_eight_shards() {
        // Each of eight ranges is 2^61 wide: 1444456722576112953 / 2^61 = 0.63
        // and 5879945593395075768 / 2^61 = 2.55.
        let map = map_of(8);
        assert_eq!(*map.lookup(keyspace_id_of_int(42)).1, 0);
        assert_eq!(*map.lookup(keyspace_id_of_int(1)).1, 2);
    }

    proptest! {
        #[test]
        fn lookup_agrees_with_linear_scan(count in 1i64..=4096, id in any::<u64>()) {
            let map = map_of(count);
            let id = KeyspaceId(id);
            let (range, target) = map.lookup(id);
            prop_assert!(range.contains(id));
            let expected = map.entries().iter().position(|(r, _)| r.contains(id)).unwrap();
            prop_assert_eq!(*target, expected);
            prop_assert_eq!(map.index_of(id), expected);
        }
    }
}
