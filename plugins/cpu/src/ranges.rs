//! A set of disjoint half-open ranges `[start, end)` of `u64`, kept
//! coalesced, with its total length. Reservations use it for their
//! committed pages: `committed_bytes` must be exact, and commit/decommit
//! must refuse a range that is partly in the wrong state before touching
//! anything, which needs "does it intersect" and "is it covered" answers.

use std::collections::BTreeMap;

/// Disjoint, coalesced ranges. Adjacent ranges are merged, so a range that
/// is covered at all is covered by exactly one entry.
#[derive(Debug, Default)]
pub struct RangeSet {
    /// start → end, for ranges that neither overlap nor touch.
    ranges: BTreeMap<u64, u64>,
    total: u64,
}

impl RangeSet {
    /// Sum of the lengths of the ranges.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether any point of `[start, end)` is in the set.
    pub fn intersects(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        // Ranges are disjoint and sorted, so only the last one starting
        // before `end` can reach back past `start`.
        self.ranges.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// Whether every point of the non-empty `[start, end)` is in the set.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        start < end && self.ranges.range(..=start).next_back().is_some_and(|(_, &e)| e >= end)
    }

    /// The end of the range that holds `point`, if one does.
    pub fn end_of_run(&self, point: u64) -> Option<u64> {
        self.ranges.range(..=point).next_back().and_then(|(_, &e)| (e > point).then_some(e))
    }

    /// Adds `[start, end)`, which must be non-empty and disjoint from the
    /// set; returns false and changes nothing otherwise.
    pub fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end || self.intersects(start, end) {
            return false;
        }
        let mut merged_start = start;
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e == start {
                merged_start = s;
            }
        }
        let merged_end = self.ranges.remove(&end).unwrap_or(end);
        self.ranges.insert(merged_start, merged_end);
        self.total += end - start;
        true
    }

    /// Removes `[start, end)`, which must be non-empty and covered by the
    /// set; returns false and changes nothing otherwise.
    pub fn remove(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        let Some((&s, &e)) = self.ranges.range(..=start).next_back() else {
            return false;
        };
        if e < end {
            return false;
        }
        if s < start {
            self.ranges.insert(s, start);
        } else {
            self.ranges.remove(&s);
        }
        if end < e {
            self.ranges.insert(end, e);
        }
        self.total -= end - start;
        true
    }

    /// The ranges, in order.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_coalesces_and_remove_splits() {
        let mut s = RangeSet::default();
        assert!(s.insert(10, 20));
        assert!(s.insert(30, 40));
        assert!(s.insert(20, 30));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        assert_eq!(s.total(), 30);
        assert!(s.remove(15, 25));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 15), (25, 40)]);
        assert_eq!(s.total(), 20);
        assert!(!s.remove(12, 30), "partly uncovered");
        assert!(!s.insert(14, 16), "partly covered");
        assert!(!s.insert(5, 5), "empty");
        assert_eq!(s.total(), 20);
        assert!(s.remove(10, 15));
        assert!(s.remove(25, 40));
        assert_eq!(s.total(), 0);
        assert_eq!(s.iter().count(), 0);
    }

    /// Random operations against a bitmap model: every answer and the total
    /// must agree, and refused operations must change nothing.
    #[test]
    fn agrees_with_a_bitmap_model() {
        const N: u64 = 64;
        let mut model = [false; N as usize];
        let mut set = RangeSet::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = x % N;
            let b = (x >> 8) % (N + 1);
            let (start, end) = (a.min(b), a.max(b));
            let span = &mut model[start as usize..end as usize];
            let any = span.iter().any(|&p| p);
            let all = span.iter().all(|&p| p);
            assert_eq!(set.intersects(start, end), any);
            assert_eq!(set.covers(start, end), all && start < end);
            if x & (1 << 40) == 0 {
                let ok = set.insert(start, end);
                assert_eq!(ok, start < end && !any);
                if ok {
                    span.iter_mut().for_each(|p| *p = true);
                }
            } else {
                let ok = set.remove(start, end);
                assert_eq!(ok, start < end && all);
                if ok {
                    span.iter_mut().for_each(|p| *p = false);
                }
            }
            assert_eq!(set.total(), model.iter().filter(|&&p| p).count() as u64);
            let mut prev_end = None;
            for (s, e) in set.iter() {
                assert!(s < e);
                if let Some(p) = prev_end {
                    assert!(p < s, "ranges must not touch");
                }
                prev_end = Some(e);
            }
        }
    }
}
