//! A set of disjoint half-open ranges `[start, end)` of `u64`, kept
//! coalesced, with its total length. Reservations use it for their
//! committed pages: `committed_bytes` must be exact, and commit/decommit
//! must refuse a range that is partly in the wrong state before touching
//! anything, which needs "does it intersect" and "is it covered" answers.

use std::collections::BTreeMap;

/// Runs kept in a sorted vector up to this many; past it, in a B-tree.
/// Why: a reservation nearly always holds a few runs (a region grows and
/// shrinks at its end), and on a vector each call is a binary search over
/// one cache line and no allocation once the vector has room, where the
/// B-tree cost ~500 instructions per commit + decommit pair (callgrind
/// `commit-2m`); the tree keeps many runs O(log n). Small in tests, so the
/// model test crosses over.
const FEW: usize = if cfg!(test) { 4 } else { 16 };

/// Disjoint, coalesced ranges. Adjacent ranges are merged, so a range that
/// is covered at all is covered by exactly one entry.
#[derive(Debug, Default)]
pub struct RangeSet {
    runs: Runs,
    total: u64,
}

/// start → end, for ranges that neither overlap nor touch.
#[derive(Debug)]
enum Runs {
    /// Sorted by start; at most `FEW` entries.
    Few(Vec<(u64, u64)>),
    /// More than `FEW` were needed once (it stays a tree).
    Many(BTreeMap<u64, u64>),
}

impl Default for Runs {
    fn default() -> Self {
        Runs::Few(Vec::new())
    }
}

impl Runs {
    /// The last run starting before `bound` (at or before it when
    /// `inclusive`): the only one that can hold, or reach past, a point
    /// below it.
    #[inline]
    fn last_before(&self, bound: u64, inclusive: bool) -> Option<(u64, u64)> {
        match self {
            Runs::Few(v) => {
                let i = v.partition_point(|&(s, _)| if inclusive { s <= bound } else { s < bound });
                i.checked_sub(1).map(|i| v[i])
            }
            Runs::Many(m) => {
                let found =
                    if inclusive { m.range(..=bound).next_back() } else { m.range(..bound).next_back() };
                found.map(|(&s, &e)| (s, e))
            }
        }
    }

    /// The tree, made from the vector when it is still one.
    fn many(&mut self) -> &mut BTreeMap<u64, u64> {
        if let Runs::Few(v) = self {
            *self = Runs::Many(v.iter().copied().collect());
        }
        match self {
            Runs::Many(m) => m,
            Runs::Few(_) => unreachable!("just made a tree"),
        }
    }
}

impl RangeSet {
    /// Sum of the lengths of the ranges.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Empties the set, keeping a vector's room for its next use.
    pub fn clear(&mut self) {
        match &mut self.runs {
            Runs::Few(v) => v.clear(),
            Runs::Many(_) => self.runs = Runs::default(),
        }
        self.total = 0;
    }

    /// Whether any point of `[start, end)` is in the set.
    #[inline]
    pub fn intersects(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        // Ranges are disjoint and sorted, so only the last one starting
        // before `end` can reach back past `start`.
        self.runs.last_before(end, false).is_some_and(|(_, e)| e > start)
    }

    /// Whether every point of the non-empty `[start, end)` is in the set.
    #[inline]
    pub fn covers(&self, start: u64, end: u64) -> bool {
        start < end && self.runs.last_before(start, true).is_some_and(|(_, e)| e >= end)
    }

    /// The end of the range that holds `point`, if one does.
    pub fn end_of_run(&self, point: u64) -> Option<u64> {
        self.runs.last_before(point, true).and_then(|(_, e)| (e > point).then_some(e))
    }

    /// Adds `[start, end)`, which must be non-empty and disjoint from the
    /// set; returns false and changes nothing otherwise.
    pub fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        // One lookup answers both "does it overlap" and "does it touch the
        // range before": only the last range starting before `end` can do
        // either. On the vector, the same search gives the index.
        if let Runs::Few(v) = &mut self.runs {
            let i = v.partition_point(|&(s, _)| s < end);
            let before_end = i.checked_sub(1).map(|j| v[j].1);
            if before_end.is_some_and(|e| e > start) {
                return false;
            }
            let joins_before = before_end == Some(start);
            let joins_next = v.get(i).is_some_and(|&(s, _)| s == end);
            match (joins_before, joins_next) {
                (true, true) => {
                    v[i - 1].1 = v[i].1;
                    v.remove(i);
                }
                (true, false) => v[i - 1].1 = end,
                (false, true) => v[i].0 = start,
                (false, false) if v.len() < FEW => v.insert(i, (start, end)),
                (false, false) => {
                    self.runs.many().insert(start, end);
                }
            }
        } else {
            let before = self.runs.last_before(end, false);
            if before.is_some_and(|(_, e)| e > start) {
                return false;
            }
            let merged_start = before.filter(|&(_, e)| e == start).map_or(start, |(s, _)| s);
            let m = self.runs.many();
            let merged_end = m.remove(&end).unwrap_or(end);
            m.insert(merged_start, merged_end);
        }
        self.total += end - start;
        true
    }

    /// Removes `[start, end)`, which must be non-empty and covered by the
    /// set; returns false and changes nothing otherwise.
    pub fn remove(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        if let Runs::Few(v) = &mut self.runs {
            // One search finds the run and its index.
            let Some(i) = v.partition_point(|&(rs, _)| rs <= start).checked_sub(1) else {
                return false;
            };
            let (s, e) = v[i];
            if e < end {
                return false;
            }
            match (s < start, end < e) {
                (true, true) if v.len() < FEW => {
                    v[i].1 = start;
                    v.insert(i + 1, (end, e));
                }
                (true, true) => {
                    let m = self.runs.many();
                    m.insert(s, start);
                    m.insert(end, e);
                }
                (true, false) => v[i].1 = start,
                (false, true) => v[i].0 = end,
                // The last run (the usual case: a region shrinks at its
                // end) is popped: `remove` moves the empty tail anyway, a
                // call to memmove (~45 instructions).
                (false, false) if i + 1 == v.len() => {
                    v.pop();
                }
                (false, false) => {
                    v.remove(i);
                }
            }
        } else {
            let Some((s, e)) = self.runs.last_before(start, true) else {
                return false;
            };
            if e < end {
                return false;
            }
            let m = self.runs.many();
            if s < start {
                m.insert(s, start);
            } else {
                m.remove(&s);
            }
            if end < e {
                m.insert(end, e);
            }
        }
        self.total -= end - start;
        true
    }

    /// The ranges, in order.
    #[cfg(test)]
    pub fn iter(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        match &self.runs {
            Runs::Few(v) => Box::new(v.iter().copied()),
            Runs::Many(m) => Box::new(m.iter().map(|(&s, &e)| (s, e))),
        }
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
