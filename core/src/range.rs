//! Contiguous, inclusive ranges of keyspace ids and how the keyspace is cut
//! into them.
//!
//! Ranges are inclusive at both ends so that the last range can end at
//! `u64::MAX` without a 65-bit upper bound.

use crate::keyspace::KeyspaceId;
use thiserror::Error;

/// Most shards one table may be cut into.
pub const MAX_SHARD_COUNT: u32 = 65_536;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RangeError {
    #[error("shard count must be between 1 and {MAX_SHARD_COUNT}, got {0}")]
    InvalidShardCount(i64),
    #[error("range start {start} is after range end {end}")]
    Inverted { start: KeyspaceId, end: KeyspaceId },
    #[error("the ranges do not cover the keyspace: nothing owns {from}..={to}")]
    Gap { from: KeyspaceId, to: KeyspaceId },
    #[error("ranges overlap at keyspace id {0}")]
    Overlap(KeyspaceId),
    #[error("no ranges given")]
    Empty,
}

/// The keyspace ids `start..=end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyRange {
    pub start: KeyspaceId,
    pub end: KeyspaceId,
}

impl KeyRange {
    pub const FULL: KeyRange = KeyRange {
        start: KeyspaceId::MIN,
        end: KeyspaceId::MAX,
    };

    pub fn new(start: KeyspaceId, end: KeyspaceId) -> Result<KeyRange, RangeError> {
        if start > end {
            return Err(RangeError::Inverted { start, end });
        }
        Ok(KeyRange { start, end })
    }

    #[inline]
    pub fn contains(&self, id: KeyspaceId) -> bool {
        self.start <= id && id <= self.end
    }

    /// How many keyspace ids the range holds (up to 2^64, hence u128).
    pub fn width(&self) -> u128 {
        (self.end.0 - self.start.0) as u128 + 1
    }
}

/// Cut the whole keyspace into `count` ranges of equal width (they differ by
/// at most one id), in keyspace order.
pub fn equal_ranges(count: i64) -> Result<Vec<KeyRange>, RangeError> {
    if count < 1 || count > MAX_SHARD_COUNT as i64 {
        return Err(RangeError::InvalidShardCount(count));
    }
    let count = count as u128;
    const SPACE: u128 = 1 << 64;
    let boundary = |i: u128| (i * SPACE / count) as u64;
    Ok((0..count)
        .map(|i| {
            let start = boundary(i);
            let end = if i + 1 == count {
                u64::MAX
            } else {
                boundary(i + 1) - 1
            };
            KeyRange {
                start: KeyspaceId(start),
                end: KeyspaceId(end),
            }
        })
        .collect())
}

/// Check that `ranges`, sorted by start, cover the whole keyspace exactly once.
pub fn check_cover(ranges: &[KeyRange]) -> Result<(), RangeError> {
    let first = ranges.first().ok_or(RangeError::Empty)?;
    if first.start != KeyspaceId::MIN {
        return Err(RangeError::Gap {
            from: KeyspaceId::MIN,
            to: KeyspaceId(first.start.0 - 1),
        });
    }
    for pair in ranges.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.start <= a.end {
            return Err(RangeError::Overlap(b.start));
        }
        if b.start.0 != a.end.0 + 1 {
            return Err(RangeError::Gap {
                from: KeyspaceId(a.end.0 + 1),
                to: KeyspaceId(b.start.0 - 1),
            });
        }
    }
    let last = ranges[ranges.len() - 1];
    if last.end != KeyspaceId::MAX {
        return Err(RangeError::Gap {
            from: KeyspaceId(last.end.0 + 1),
            to: KeyspaceId::MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_shard_is_the_full_space() {
        assert_eq!(equal_ranges(1).unwrap(), vec![KeyRange::FULL]);
    }

    #[test]
    fn four_shards_split_on_quarter_boundaries() {
        let ranges = equal_ranges(4).unwrap();
        let starts: Vec<u64> = ranges.iter().map(|r| r.start.0).collect();
        assert_eq!(starts, vec![0, 1 << 62, 1 << 63, 3 << 62]);
        assert_eq!(ranges[0].end.0, (1 << 62) - 1);
        assert_eq!(ranges[3].end, KeyspaceId::MAX);
    }

    #[test]
    fn bad_shard_counts_are_rejected() {
        assert_eq!(equal_ranges(0), Err(RangeError::InvalidShardCount(0)));
        assert_eq!(equal_ranges(-3), Err(RangeError::InvalidShardCount(-3)));
        assert!(equal_ranges(MAX_SHARD_COUNT as i64 + 1).is_err());
    }

    #[test]
    fn check_cover_finds_gaps_and_overlaps() {
        let mut ranges = equal_ranges(3).unwrap();
        ranges[1].start.0 += 1;
        assert!(matches!(check_cover(&ranges), Err(RangeError::Gap { .. })));
        let mut ranges = equal_ranges(3).unwrap();
        ranges[1].start.0 -= 1;
        assert!(matches!(check_cover(&ranges), Err(RangeError::Overlap(_))));
        let mut ranges = equal_ranges(3).unwrap();
        ranges[2].end.0 -= 1;
        assert!(matches!(check_cover(&ranges), Err(RangeError::Gap { .. })));
        assert_eq!(check_cover(&[]), Err(RangeError::Empty));
    }

    #[test]
    fn inverted_range_is_rejected() {
        assert!(KeyRange::new(KeyspaceId(5), KeyspaceId(4)).is_err());
    }

    proptest! {
        #[test]
        fn equal_ranges_cover_without_overlap(count in 1i64..=4096) {
            let ranges = equal_ranges(count).unwrap();
            prop_assert_eq!(ranges.len() as i64, count);
            prop_assert_eq!(check_cover(&ranges), Ok(()));
            let widths: Vec<u128> = ranges.iter().map(KeyRange::width).collect();
            let (min, max) = (widths.iter().min().unwrap(), widths.iter().max().unwrap());
            prop_assert!(max - min <= 1, "unequal widths {} and {}", min, max);
            prop_assert_eq!(widths.iter().sum::<u128>(), 1u128 << 64);
        }

        #[test]
        fn every_id_is_in_exactly_one_range(count in 1i64..=4096, id in any::<u64>()) {
            let ranges = equal_ranges(count).unwrap();
            let owners = ranges.iter().filter(|r| r.contains(KeyspaceId(id))).count();
            prop_assert_eq!(owners, 1);
        }
    }
}
