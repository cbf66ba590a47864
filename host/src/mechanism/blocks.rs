//! The live address ranges of one mechanism (allocations and
//! reservations; physical objects have no address), so a plugin that hands
//! out a range overlapping one the host still holds is refused instead of
//! aliased.
//!
//! Kept only when `LoadOptions::check_overlaps` is on (the default in debug
//! builds): every admission and release takes the index's lock and touches
//! a `BTreeMap`, which costs more than the rest of the host's wrapper on the
//! allocate/free path.
//!
//! A block leaves the index *before* the plugin is asked to free it and
//! comes back if the plugin refuses, so a correct plugin that reuses an
//! address at once (the common case for a slab) is never mistaken for an
//! aliasing one. The check is exact while no release fails; in the window
//! of a release that then fails, an overlapping block may be admitted (a
//! missed fault, never a false refusal).

use crate::error::ObjectKind;
use crate::sync::lock_std;
use crate::tokens::RawObject;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A live block: where it ends, what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveBlock {
    end: u64,
    kind: ObjectKind,
}

/// Why a block was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conflict {
    /// `addr + size` is past the end of the address space.
    Wraps,
    /// The block overlaps this live one.
    Overlaps { object_id: u64, addr: u64, size: u64, kind: ObjectKind },
}

/// Live blocks keyed by `(start, object id)`. Non-empty blocks only: an
/// empty range overlaps nothing, and keeping one could hide the block
/// around it from the predecessor lookup. Every two entries are disjoint
/// (but see the module note on failed releases), so the one entry starting
/// at or before an address is the only one that can reach past it.
#[derive(Default)]
pub(crate) struct BlockIndex {
    live: Mutex<Live>,
}

type Key = (u64, u64);

/// Blocks kept in a sorted vector up to this many; past it, in a B-tree.
/// Why: a mechanism checked for reservations only (the release default)
/// holds a few at a time, and a B-tree that empties frees its node and
/// makes it again on the next insert: ~620 instructions per reserve +
/// release (callgrind `reserve` with and without the check), where the
/// vector keeps its room and searches one or two cache lines. The tree
/// keeps many blocks O(log n). Small in tests, so they cross over.
const FEW: usize = if cfg!(test) { 3 } else { 16 };

enum Live {
    /// Sorted by key; at most `FEW` entries.
    Few(Vec<(Key, LiveBlock)>),
    /// More than `FEW` were live once (it stays a tree).
    Many(BTreeMap<Key, LiveBlock>),
}

impl Default for Live {
    fn default() -> Self {
        Live::Few(Vec::new())
    }
}

impl Live {
    /// Records `[start, end)` as object `id` unless a live block overlaps
    /// it; then that block is named and nothing is recorded. Only two can
    /// tell: the last block starting before `start` (blocks are disjoint,
    /// so no earlier one reaches further) and the first starting at or
    /// after it (it overlaps if it starts before `end`).
    fn admit(&mut self, start: u64, end: u64, id: u64, kind: ObjectKind) -> Result<(), Conflict> {
        let overlap = |(&(addr, object_id), b): (&Key, &LiveBlock)| {
            (addr < end && start < b.end).then_some(Conflict::Overlaps {
                object_id,
                addr,
                size: b.end - addr,
                kind: b.kind,
            })
        };
        let b = LiveBlock { end, kind };
        match self {
            Live::Few(v) => {
                // One search: with no block at `start` (it would overlap),
                // the new key sorts exactly where the first block at or
                // after `start` is.
                let i = v.partition_point(|((addr, _), _)| *addr < start);
                let before = i.checked_sub(1).map(|i| &v[i]);
                if let Some(c) = before.into_iter().chain(v.get(i)).find_map(|(k, b)| overlap((k, b))) {
                    return Err(c);
                }
                if v.len() < FEW {
                    v.insert(i, ((start, id), b));
                    return Ok(());
                }
            }
            Live::Many(m) => {
                let before = m.range(..(start, 0)).next_back();
                if let Some(c) =
                    before.into_iter().chain(m.range((start, 0)..(end, 0)).next()).find_map(overlap)
                {
                    return Err(c);
                }
            }
        }
        self.insert((start, id), b);
        Ok(())
    }

    fn insert(&mut self, key: Key, b: LiveBlock) {
        match self {
            Live::Few(v) => match v.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => v[i].1 = b,
                Err(i) if v.len() < FEW => v.insert(i, (key, b)),
                Err(_) => {
                    let mut m: BTreeMap<Key, LiveBlock> = v.drain(..).collect();
                    m.insert(key, b);
                    *self = Live::Many(m);
                }
            },
            Live::Many(m) => {
                m.insert(key, b);
            }
        }
    }

    fn remove(&mut self, key: Key) -> Option<LiveBlock> {
        match self {
            Live::Few(v) => v.binary_search_by(|(k, _)| k.cmp(&key)).ok().map(|i| v.remove(i).1),
            Live::Many(m) => m.remove(&key),
        }
    }

    fn clear(&mut self) {
        match self {
            Live::Few(v) => v.clear(),
            Live::Many(m) => m.clear(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Live::Few(v) => v.len(),
            Live::Many(m) => m.len(),
        }
    }
}

impl BlockIndex {
    /// Admits `[start, start + size)`, object `id` (a `kind`), or says
    /// which live block it overlaps; nothing is recorded then.
    pub(crate) fn admit(&self, kind: ObjectKind, id: u64, start: u64, size: u64) -> Result<(), Conflict> {
        let end = start.checked_add(size).ok_or(Conflict::Wraps)?;
        if size == 0 {
            return Ok(());
        }
        lock_std(&self.live).admit(start, end, id, kind)
    }

    /// Takes the block of `o` out (its release is about to be sent); what
    /// was there, to [`restore`](Self::restore) if the release fails.
    pub(crate) fn forget(&self, o: &RawObject) -> Option<LiveBlock> {
        lock_std(&self.live).remove((o.addr, o.object_id))
    }

    /// Puts back a block whose release the plugin refused: it is still
    /// live.
    pub(crate) fn restore(&self, o: &RawObject, b: LiveBlock) {
        lock_std(&self.live).insert((o.addr, o.object_id), b);
    }

    /// Forgets every block (their context terminated: they went with it).
    pub(crate) fn clear(&self) {
        lock_std(&self.live).clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock_std(&self.live).len()
    }
}

impl ObjectKind {
    /// One object of this kind, for messages ("allocation", ...).
    pub(crate) fn singular(self) -> &'static str {
        match self {
            ObjectKind::Allocation => "allocation",
            ObjectKind::Reservation => "reservation",
            ObjectKind::PhysicalObject => "physical object",
            ObjectKind::Stream => "stream",
            ObjectKind::Fence => "fence",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplug_sdk::abi::MemplugDevice;

    fn block(object_id: u64, addr: u64, size: u64) -> RawObject {
        RawObject {
            mechanism_key: 1,
            mechanism_id: 7,
            device: MemplugDevice::default(),
            object_id,
            addr,
            size,
            handle: 0,
        }
    }

    const A: ObjectKind = ObjectKind::Allocation;

    impl BlockIndex {
        fn admit_raw(&self, kind: ObjectKind, o: &RawObject) -> Result<(), Conflict> {
            self.admit(kind, o.object_id, o.addr, o.size)
        }
    }

    #[test]
    fn disjoint_and_touching_blocks_are_admitted() {
        let ix = BlockIndex::default();
        ix.admit_raw(A, &block(1, 0x1000, 0x100)).unwrap();
        ix.admit_raw(A, &block(2, 0x1100, 0x100)).unwrap(); // touches the end of 1
        ix.admit_raw(A, &block(3, 0x0f00, 0x100)).unwrap(); // touches the start of 1
        ix.admit_raw(A, &block(4, 0x8000, 0x10)).unwrap();
        assert_eq!(ix.len(), 4);
    }

    #[test]
    fn every_kind_of_overlap_is_refused_naming_the_live_block() {
        let ix = BlockIndex::default();
        ix.admit_raw(ObjectKind::Reservation, &block(1, 0x1000, 0x1000)).unwrap();
        let live =
            Conflict::Overlaps { object_id: 1, addr: 0x1000, size: 0x1000, kind: ObjectKind::Reservation };
        for (addr, size) in [
            (0x1000, 0x1000), // the same range
            (0x1800, 0x10),   // inside
            (0x0800, 0x1000), // over the start
            (0x1fff, 0x100),  // over the end
            (0x0000, 0x9000), // around it
        ] {
            assert_eq!(ix.admit_raw(A, &block(9, addr, size)), Err(live), "{addr:#x}+{size:#x}");
        }
        assert_eq!(ix.len(), 1, "a refused block is not recorded");
    }

    #[test]
    fn a_block_around_several_names_one_of_them() {
        let ix = BlockIndex::default();
        ix.admit_raw(A, &block(1, 0x1000, 0x10)).unwrap();
        ix.admit_raw(A, &block(2, 0x2000, 0x10)).unwrap();
        assert!(matches!(
            ix.admit_raw(A, &block(3, 0x1800, 0x1000)),
            Err(Conflict::Overlaps { object_id: 2, .. })
        ));
    }

    #[test]
    fn a_wrapping_block_is_refused_and_an_empty_one_overlaps_nothing() {
        let ix = BlockIndex::default();
        assert_eq!(ix.admit_raw(A, &block(1, u64::MAX - 0xf, 0x20)), Err(Conflict::Wraps));
        ix.admit_raw(A, &block(5, u64::MAX - 0xf, 0xf)).unwrap(); // ends at the last address
        assert!(ix.forget(&block(5, u64::MAX - 0xf, 0xf)).is_some());
        ix.admit_raw(A, &block(2, 0x1000, 0x100)).unwrap();
        ix.admit_raw(A, &block(3, 0x1010, 0)).unwrap();
        ix.admit_raw(A, &block(4, 0x1100, 0x100)).unwrap();
        assert_eq!(ix.len(), 2);
    }

    /// The index answers as a naive list of live blocks does: many short
    /// runs on fresh indexes (each a vector until it holds more than
    /// `FEW`, 3 in tests; a tree from then on, even with few left).
    #[test]
    fn it_answers_as_a_list_of_live_blocks_does() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let (mut trees, mut id) = (0, 0u64);
        for _ in 0..300 {
            let ix = BlockIndex::default();
            let mut naive: Vec<RawObject> = Vec::new();
            for _ in 0..16 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                id += 1;
                let (addr, size) = ((x % 32) * 0x100, (x >> 8) % 4 * 0x80);
                if x >> 40 & 1 == 0 || naive.is_empty() {
                    let o = block(id, addr, size);
                    let clash =
                        size != 0 && naive.iter().any(|b| b.addr < addr + size && addr < b.addr + b.size);
                    assert_eq!(
                        ix.admit_raw(A, &o).is_err(),
                        clash,
                        "{addr:#x}+{size:#x} among {}",
                        naive.len()
                    );
                    if !clash && size != 0 {
                        naive.push(o);
                    }
                } else {
                    let o = naive.swap_remove((x >> 20) as usize % naive.len());
                    assert!(ix.forget(&o).is_some());
                    assert!(ix.forget(&o).is_none());
                }
                assert_eq!(ix.len(), naive.len());
            }
            trees += matches!(*lock_std(&ix.live), Live::Many(_)) as usize;
        }
        assert!((30..270).contains(&trees), "{trees} of 300 runs ended as a tree: both forms need exercise");
    }

    #[test]
    fn a_released_address_can_be_reused_and_a_refused_release_keeps_it() {
        let ix = BlockIndex::default();
        let one = block(1, 0x1000, 0x100);
        ix.admit_raw(A, &one).unwrap();
        assert_eq!(ix.forget(&one), Some(LiveBlock { end: 0x1100, kind: A }));
        ix.admit_raw(A, &block(2, 0x1000, 0x100)).unwrap();
        assert!(ix.forget(&one).is_none());
        let two = block(2, 0x1000, 0x100);
        let held2 = ix.forget(&two).unwrap();
        ix.restore(&two, held2);
        assert!(ix.admit_raw(A, &block(3, 0x1080, 0x10)).is_err());
    }
}
