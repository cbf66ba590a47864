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
    live: Mutex<BTreeMap<(u64, u64), LiveBlock>>,
}

impl BlockIndex {
    /// Admits `[start, start + size)`, object `id` (a `kind`), or says
    /// which live block it overlaps; nothing is recorded then.
    pub(crate) fn admit(&self, kind: ObjectKind, id: u64, start: u64, size: u64) -> Result<(), Conflict> {
        let end = start.checked_add(size).ok_or(Conflict::Wraps)?;
        if size == 0 {
            return Ok(());
        }
        let mut live = lock_std(&self.live);
        let before = live.range(..=(start, u64::MAX)).next_back();
        let inside = live.range((start, 0)..(end, 0)).next();
        for (&(addr, object_id), b) in before.into_iter().chain(inside) {
            if addr < end && start < b.end {
                return Err(Conflict::Overlaps { object_id, addr, size: b.end - addr, kind: b.kind });
            }
        }
        live.insert((start, id), LiveBlock { end, kind });
        Ok(())
    }

    /// Takes the block of `o` out (its release is about to be sent); what
    /// was there, to [`restore`](Self::restore) if the release fails.
    pub(crate) fn forget(&self, o: &RawObject) -> Option<LiveBlock> {
        lock_std(&self.live).remove(&(o.addr, o.object_id))
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
