//! The shared mappings of one reservation, by starting offset. They never
//! overlap each other (the callers check before inserting), so the only
//! mapping that can reach a point is the last one starting at or before it.
//!
//! Kept in a sorted vector while few, in a B-tree past that, as `RangeSet`
//! keeps its runs and for the same reason: a reservation nearly always has
//! a mapping or two, and on a vector a map + unmap pair is a binary search
//! over one cache line and no allocation once the vector has room (a spare
//! reservation keeps it, `reservations.rs`), where the B-tree cost ~250
//! instructions per pair (callgrind `map-prefix`); the tree keeps a
//! reservation with many mappings O(log n) per call.

use std::collections::BTreeMap;

/// One shared mapping inside a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Length in bytes; an unmap must name exactly this.
    pub len: u64,
    /// Handle of the physical object mapped here; the mapping holds one of
    /// its references.
    pub object: u64,
}

/// Mappings kept in a sorted vector up to this many; past it, in a B-tree.
/// Small in tests, so the model test crosses over.
const FEW: usize = if cfg!(test) { 4 } else { 16 };

/// Mappings by starting offset.
#[derive(Debug)]
pub enum Mappings {
    /// Sorted by offset; at most `FEW` entries.
    Few(Vec<(u64, Mapping)>),
    /// More than `FEW` were needed once (it stays a tree until its
    /// reservation is released).
    Many(BTreeMap<u64, Mapping>),
}

impl Default for Mappings {
    fn default() -> Self {
        Mappings::Few(Vec::new())
    }
}

impl Mappings {
    /// Whether there are none.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        match self {
            Mappings::Few(v) => v.is_empty(),
            Mappings::Many(m) => m.is_empty(),
        }
    }

    /// The mapping starting at `offset`.
    #[inline]
    pub fn get(&self, offset: u64) -> Option<Mapping> {
        match self {
            Mappings::Few(v) => v.binary_search_by_key(&offset, |&(s, _)| s).ok().map(|i| v[i].1),
            Mappings::Many(m) => m.get(&offset).copied(),
        }
    }

    /// The last mapping starting before `bound` (at or before it when
    /// `inclusive`): the only one that can hold, or reach past, a point
    /// below it.
    #[inline]
    pub fn last_before(&self, bound: u64, inclusive: bool) -> Option<(u64, Mapping)> {
        match self {
            Mappings::Few(v) => {
                let i = v.partition_point(|&(s, _)| if inclusive { s <= bound } else { s < bound });
                i.checked_sub(1).map(|i| v[i])
            }
            Mappings::Many(m) => {
                let found =
                    if inclusive { m.range(..=bound).next_back() } else { m.range(..bound).next_back() };
                found.map(|(&s, &m)| (s, m))
            }
        }
    }

    /// Adds a mapping at `offset`, where the caller has checked that it
    /// overlaps none (so none starts there either).
    pub fn insert(&mut self, offset: u64, mapping: Mapping) {
        match self {
            Mappings::Few(v) if v.len() < FEW => {
                let i = v.partition_point(|&(s, _)| s < offset);
                v.insert(i, (offset, mapping));
            }
            Mappings::Few(v) => {
                let mut m: BTreeMap<u64, Mapping> = v.drain(..).collect();
                m.insert(offset, mapping);
                *self = Mappings::Many(m);
            }
            Mappings::Many(m) => {
                m.insert(offset, mapping);
            }
        }
    }

    /// Removes and returns the mapping starting at `offset`.
    pub fn remove(&mut self, offset: u64) -> Option<Mapping> {
        match self {
            Mappings::Few(v) => {
                let i = v.binary_search_by_key(&offset, |&(s, _)| s).ok()?;
                Some(v.remove(i).1)
            }
            Mappings::Many(m) => m.remove(&offset),
        }
    }

    /// The physical objects of all the mappings, in order, each once per
    /// mapping (a release drops each one's reference).
    pub fn into_objects(self) -> impl Iterator<Item = u64> {
        let (few, many) = match self {
            Mappings::Few(v) => (Some(v.into_iter().map(|(_, m)| m.object)), None),
            Mappings::Many(m) => (None, Some(m.into_values().map(|m| m.object))),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random inserts and removes of disjoint mappings against a plain
    /// B-tree: every answer must agree, across the vector-to-tree change.
    #[test]
    fn agrees_with_a_btree_model() {
        const N: u64 = 48;
        let mut model: BTreeMap<u64, Mapping> = BTreeMap::new();
        let mut maps = Mappings::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut crossed = false;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = x % N;
            let len = 1 + (x >> 8) % 4;
            let overlaps = model.range(..start + len).next_back().is_some_and(|(&s, m)| s + m.len > start);
            if x & (1 << 40) == 0 && !overlaps {
                let m = Mapping { len, object: step };
                model.insert(start, m);
                maps.insert(start, m);
            } else {
                assert_eq!(maps.remove(start), model.remove(&start));
            }
            crossed |= matches!(maps, Mappings::Many(_));
            assert_eq!(maps.is_empty(), model.is_empty());
            for p in 0..=N + 4 {
                assert_eq!(maps.get(p), model.get(&p).copied());
                assert_eq!(maps.last_before(p, true), model.range(..=p).next_back().map(|(&s, &m)| (s, m)));
                assert_eq!(maps.last_before(p, false), model.range(..p).next_back().map(|(&s, &m)| (s, m)));
            }
            if step % 5_000 == 4_999 {
                let objects: Vec<u64> = std::mem::take(&mut maps).into_objects().collect();
                assert_eq!(
                    objects,
                    std::mem::take(&mut model).into_values().map(|m| m.object).collect::<Vec<_>>()
                );
            }
        }
        assert!(crossed, "the test never made a tree");
    }
}
