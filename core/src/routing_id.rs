//! Self-routing ids: 64-bit ids that carry the top bits of their owner's
//! keyspace id, so that a row can be found by its id without a lookup.
//!
//! ```text
//!  63 | 62 ........ 22 | 21 ...... 12 | 11 ....... 5 | 4 ....... 0
//!   0 | ms since epoch | prefix       | counter      | generator
//!     | (41 bits)      | (10 bits)    | sequence (12 bits)        |
//! ```
//!
//! * the time: milliseconds since 2026-01-01 00:00 UTC ([`EPOCH_MS`]);
//! * the prefix: the top 10 bits of the keyspace id of the key the id
//!   belongs to (a customer's, for an order id), so the id names the
//!   1/1024th of the keyspace its row lives in;
//! * the 12-bit sequence: a counter per millisecond and prefix in its high
//!   7 bits, and in its low 5 bits the generator: the node that made the id
//!   (0 the metadata node, 1–31 the workers of those node ids). Two nodes
//!   never make the same id, whatever their clocks do, without talking to
//!   each other.
//!
//! A generator's clock never goes back: each prefix keeps the last
//! (millisecond, counter) it gave out, and the next id is the later of "now,
//! counter 0" and "the last one plus one". When the 128 ids of a millisecond
//! are used up, the generator waits for the next millisecond rather than
//! run ahead of the clock (so a restart, which forgets the positions, starts
//! past every id made before it); only a wall clock that went back by more
//! than a moment is carried on from the last position, ahead of the clock.

use crate::keyspace::KeyspaceId;

/// 2026-01-01 00:00:00 UTC in milliseconds since the Unix epoch.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

pub const TIME_BITS: u32 = 41;
pub const PREFIX_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 12;
/// The sequence's low bits: the generator (node) that made the id.
pub const GENERATOR_BITS: u32 = 5;
/// The sequence's high bits: the counter per millisecond and prefix.
pub const COUNTER_BITS: u32 = SEQUENCE_BITS - GENERATOR_BITS;

pub const PREFIXES: usize = 1 << PREFIX_BITS;
pub const GENERATORS: i32 = 1 << GENERATOR_BITS;
pub const MAX_TIME_MS: i64 = (1 << TIME_BITS) - 1;

/// Keyspace ids per prefix: shard boundaries that are multiples of it keep
/// every prefix inside one shard, which makes routing by id exact.
pub const PREFIX_WIDTH: u64 = 1 << (64 - PREFIX_BITS);

/// The prefix of a keyspace id: its top 10 bits.
pub const fn prefix_of_keyspace_id(id: KeyspaceId) -> u16 {
    (id.0 >> (64 - PREFIX_BITS)) as u16
}

/// The keyspace ids whose prefix is `prefix` (0–1023): `[first, last]`.
pub const fn prefix_range(prefix: u16) -> (KeyspaceId, KeyspaceId) {
    let first = (prefix as u64 & (PREFIXES as u64 - 1)) << (64 - PREFIX_BITS);
    (KeyspaceId(first), KeyspaceId(first + (PREFIX_WIDTH - 1)))
}

/// Whether a range boundary (the first keyspace id of a range) keeps
/// prefixes whole.
pub const fn is_aligned(start: KeyspaceId) -> bool {
    start.0.is_multiple_of(PREFIX_WIDTH)
}

/// The id of (milliseconds since [`EPOCH_MS`], prefix, 12-bit sequence).
pub const fn compose(time_ms: i64, prefix: u16, sequence: u16) -> i64 {
    ((time_ms & MAX_TIME_MS) << (PREFIX_BITS + SEQUENCE_BITS))
        | (((prefix as i64) & (PREFIXES as i64 - 1)) << SEQUENCE_BITS)
        | ((sequence as i64) & ((1 << SEQUENCE_BITS) - 1))
}

/// The prefix an id carries (meaningful for non-negative ids only).
pub const fn prefix_of_id(id: i64) -> u16 {
    ((id >> SEQUENCE_BITS) & (PREFIXES as i64 - 1)) as u16
}

/// Milliseconds since [`EPOCH_MS`] an id carries.
pub const fn time_of_id(id: i64) -> i64 {
    id >> (PREFIX_BITS + SEQUENCE_BITS)
}

/// The 12-bit sequence an id carries.
pub const fn sequence_of_id(id: i64) -> u16 {
    (id & ((1 << SEQUENCE_BITS) - 1)) as u16
}

/// The keyspace id routing by `id` looks up: the first of its prefix's
/// range (any keyspace id of it names the same shard while boundaries are
/// aligned). None for a negative id, which no generator makes.
pub const fn routing_keyspace_id(id: i64) -> Option<KeyspaceId> {
    if id < 0 {
        return None;
    }
    Some(prefix_range(prefix_of_id(id)).0)
}

/// A generator's position for one prefix: (ms since epoch) << COUNTER_BITS
/// | counter, so that one atomic integer orders both.
pub const fn clock_position(time_ms: i64, counter: u16) -> u64 {
    ((time_ms as u64) << COUNTER_BITS) | (counter as u64 & ((1 << COUNTER_BITS) - 1))
}

/// The position after `last` at wall-clock time `now_ms` (ms since epoch):
/// the later of (now, 0) and last + 1.
pub const fn next_position(last: u64, now_ms: i64) -> u64 {
    let now = if now_ms < 0 {
        0
    } else {
        clock_position(now_ms, 0)
    };
    if now > last {
        now
    } else {
        last + 1
    }
}

/// Milliseconds since [`EPOCH_MS`] of a clock position.
pub const fn position_time(position: u64) -> i64 {
    (position >> COUNTER_BITS) as i64
}

/// The id at `position` for `prefix`, made by `generator`; None when the
/// time no longer fits in 41 bits (in the year 2095).
pub const fn id_at(position: u64, prefix: u16, generator: i32) -> Option<i64> {
    let time_ms = position_time(position);
    if time_ms > MAX_TIME_MS {
        return None;
    }
    let counter = (position & ((1 << COUNTER_BITS) - 1)) as u16;
    let sequence = (counter << GENERATOR_BITS) | (generator as u16 & (GENERATORS as u16 - 1));
    Some(compose(time_ms, prefix, sequence))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_matches_the_design_formula() {
        // ((now_ms - EPOCH_MS) << 22) | (prefix << 12) | (seq & 0xFFF)
        let (ms, prefix, seq) = (123_456_789_i64, 0x2AB_u16, 0xABC_u16);
        let formula = (ms << 22) | ((prefix as i64) << 12) | (seq as i64 & 0xFFF);
        assert_eq!(compose(ms, prefix, seq), formula);
        assert_eq!(prefix_of_id(formula), prefix);
        assert_eq!(time_of_id(formula), ms);
        assert_eq!(sequence_of_id(formula), seq);
    }

    #[test]
    fn prefix_is_the_top_ten_bits() {
        let id = KeyspaceId(0xFFC0_0000_0000_0000);
        assert_eq!(prefix_of_keyspace_id(id), 1023);
        assert_eq!(prefix_range(1023), (id, KeyspaceId::MAX));
        assert_eq!(
            prefix_range(0),
            (KeyspaceId(0), KeyspaceId(PREFIX_WIDTH - 1))
        );
        assert!(is_aligned(KeyspaceId(3 * PREFIX_WIDTH)));
        assert!(!is_aligned(KeyspaceId(3 * PREFIX_WIDTH + 1)));
    }

    #[test]
    fn the_clock_never_goes_back() {
        let last = clock_position(1000, 5);
        // the wall clock went back: carry on from the last position
        assert_eq!(next_position(last, 900), clock_position(1000, 6));
        // a full millisecond borrows the next one
        let full = clock_position(1000, (1 << COUNTER_BITS) - 1);
        assert_eq!(next_position(full, 1000), clock_position(1001, 0));
        // time moved on: counter 0
        assert_eq!(next_position(last, 2000), clock_position(2000, 0));
    }

    #[test]
    fn generators_make_different_ids() {
        let position = clock_position(77, 3);
        assert_ne!(id_at(position, 9, 0), id_at(position, 9, 1));
        assert_eq!(id_at(clock_position(MAX_TIME_MS + 1, 0), 0, 0), None);
    }

    proptest! {
        #[test]
        fn ids_round_trip(ms in 0i64..=MAX_TIME_MS, prefix in 0u16..1024, counter in 0u16..128, generator in 0i32..32) {
            let id = id_at(clock_position(ms, counter), prefix, generator).unwrap();
            prop_assert!(id >= 0);
            prop_assert_eq!(time_of_id(id), ms);
            prop_assert_eq!(prefix_of_id(id), prefix);
            prop_assert_eq!(sequence_of_id(id), (counter << 5) | generator as u16);
            let routed = routing_keyspace_id(id).unwrap();
            prop_assert_eq!(prefix_of_keyspace_id(routed), prefix);
        }

        #[test]
        fn positions_increase(last in 0u64..(1u64 << 48), now in -5i64..(1i64 << 41)) {
            prop_assert!(next_position(last, now) > last);
        }
    }
}
