//! Size classes: the block sizes a cache keeps, so a freed block can serve
//! any later request that rounds to the same class.
//!
//! Up to [`SMALL_LIMIT`] bytes the classes are multiples of [`QUANTUM`];
//! above it every power of two is cut into [`STEPS`] equal steps, so a block
//! is at most 1/`STEPS` (25 %) larger than the request it serves — the
//! spacing jemalloc's size classes made familiar, and the bound the cache
//! documents as its internal waste. Blocks are never split, so this bound
//! is the whole of the waste.

/// The smallest class, and the spacing of the small classes.
pub(crate) const QUANTUM: u64 = 64;
/// Requests up to this size use the evenly spaced small classes.
pub(crate) const SMALL_LIMIT: u64 = 512;
/// Steps per power of two above [`SMALL_LIMIT`].
const STEPS: u64 = 4;
const SMALL_CLASSES: usize = (SMALL_LIMIT / QUANTUM) as usize;

/// One size class: its index (dense from 0) and the block size it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeClass {
    pub index: usize,
    pub bytes: u64,
}

/// The class a request of `size` bytes rounds to; `None` when rounding
/// would overflow (the caller bypasses the cache for such sizes anyway).
#[inline]
pub(crate) fn class_of(size: u64) -> Option<SizeClass> {
    if size <= SMALL_LIMIT {
        let steps = size.max(1).div_ceil(QUANTUM);
        return Some(SizeClass { index: steps as usize - 1, bytes: steps * QUANTUM });
    }
    // 2^k < size <= 2^(k+1), k >= 9: steps of 2^(k-2).
    let k = 63 - (size - 1).leading_zeros() as u64;
    let shift = k - STEPS.trailing_zeros() as u64;
    let steps = (size - 1) >> shift; // in STEPS..2*STEPS
    let bytes = (steps + 1).checked_mul(1 << shift)?;
    let group = (k - SMALL_LIMIT.trailing_zeros() as u64) as usize;
    let index = SMALL_CLASSES + group * STEPS as usize + (steps - STEPS) as usize;
    Some(SizeClass { index, bytes })
}

/// How many classes there are up to and including `max_block`'s.
pub(crate) fn classes_up_to(max_block: u64) -> usize {
    class_of(max_block).map_or(0, |c| c.index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_rounds_up_to_a_class_at_most_a_quarter_larger_and_indices_are_dense() {
        let (mut last, mut prev) = (SizeClass { index: 0, bytes: QUANTUM }, 1);
        assert_eq!(class_of(0), Some(last));
        assert_eq!(class_of(1), Some(last));
        let mut sizes: Vec<u64> = (1..=5000).collect();
        sizes.extend((13..40).flat_map(|k| [(1u64 << k) - 1, 1 << k, (1 << k) + 1, 3 << (k - 1)]));
        sizes.sort_unstable();
        for s in sizes {
            let c = class_of(s).unwrap();
            assert!(c.bytes >= s, "{s} -> {c:?}");
            if s > SMALL_LIMIT {
                assert!(c.bytes - s < s.div_ceil(STEPS) + 1, "{s} -> {c:?} wastes more than 25 %");
            } else {
                assert!(c.bytes - s < QUANTUM);
            }
            // Monotonic, and a new index only with a new size; dense over
            // consecutive sizes.
            assert!(c.index >= last.index && c.bytes >= last.bytes, "{s}: {last:?} then {c:?}");
            assert_eq!(c.index == last.index, c.bytes == last.bytes, "{s}");
            if s == prev + 1 {
                assert!(c.index <= last.index + 1, "{s}: {last:?} then {c:?}");
            }
            // A class's own size maps to itself.
            assert_eq!(class_of(c.bytes), Some(c));
            (last, prev) = (c, s);
        }
    }

    #[test]
    fn the_steps_above_the_small_classes_are_quarters_of_a_power_of_two() {
        let above: Vec<u64> = (SMALL_CLASSES..SMALL_CLASSES + 5)
            .map(|i| (1..1 << 20).map(class_of).find(|c| c.unwrap().index == i).unwrap().unwrap().bytes)
            .collect();
        assert_eq!(above, [640, 768, 896, 1024, 1280]);
        assert_eq!(class_of(u64::MAX), None);
        assert_eq!(classes_up_to(SMALL_LIMIT), SMALL_CLASSES);
        assert_eq!(classes_up_to(1 << 30), class_of(1 << 30).unwrap().index + 1);
    }
}
