//! The virtual backing capability: reservations are `PROT_NONE`,
//! `MAP_NORESERVE` anonymous mappings (address space only, no commit
//! charge, no pages); commit is `mprotect(RW)`; decommit is
//! `MADV_DONTNEED` + `mprotect(PROT_NONE)`, so the pages really go back and
//! read as zeros when committed again.
//!
//! The flavour prepares each commit (binds it to a node, backs it with
//! huge pages), so the policy holds for whatever was mapped there before.
//!
//! Each reservation has a no-access guard on either side (`os::reserve_guarded`)
//! so that a whole-range commit or decommit never splits or merges kernel
//! mappings with a neighbour.
//!
//! Every call checks the whole range against the reservation's state before
//! it touches the mapping, so a refused call changes nothing.
//!
//! `committed_bytes` counts what `commit` made and nothing else: ranges
//! showing a physical object (`shared.rs`) hold that object's memory, which
//! is accounted to the object, not to the reservation.

use crate::checks::{check_range, round_up};
use crate::flavor::Flavor;
use crate::mechanism::CpuMechanism;
use crate::os;
use memplug_sdk::{Block, ObjectRef, PluginError, PluginResult, Request, VirtualBacking};

#[cold]
fn wrong_state(call: &str, offset: u64, end: u64, why: &str) -> PluginError {
    PluginError::invalid_state(format!("{call}: range [{offset:#x}, {end:#x}) {why}; nothing was changed"))
}

impl<F: Flavor> VirtualBacking for CpuMechanism<F> {
    fn reserve(&self, request: &Request) -> PluginResult<Block> {
        self.flavor.check_location(request, &self.name, "reserve")?;
        let size = round_up(request.size, self.granularity, "reserve")?;
        let g = os::reserve_guarded(size, self.granularity, "reserve")?;
        let handle = self.reservations.insert(request.object_id, g, size);
        Ok(Block { addr: g.addr, size, handle })
    }

    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let res = self.reservations.find(reservation)?;
        let mut state = res.lock(reservation)?;
        let end = check_range(offset, len, res.size, self.granularity, "commit")?;
        if state.committed.intersects(offset, end) {
            return Err(wrong_state("commit", offset, end, "has pages already committed"));
        }
        if state.mapped(offset, end) {
            return Err(wrong_state("commit", offset, end, "has pages mapped to a physical object"));
        }
        state.check_not_draining("commit", offset, end)?;
        // SAFETY: the range is inside a live reservation (checked above,
        // kept live by its lock) and is neither committed nor mapped.
        unsafe { self.flavor.commit(res.addr + offset, len, "commit")? };
        state.committed.insert(offset, end);
        Ok(())
    }

    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let res = self.reservations.find(reservation)?;
        let mut state = res.lock(reservation)?;
        let end = check_range(offset, len, res.size, self.granularity, "decommit")?;
        if !state.committed.covers(offset, end) {
            return Err(wrong_state("decommit", offset, end, "has pages that are not committed"));
        }
        // SAFETY: the range is inside a live reservation and entirely
        // committed anonymous memory; the host gives up its contents.
        unsafe { F::decommit(res.addr + offset, len, "decommit")? };
        state.committed.remove(offset, end);
        Ok(())
    }

    fn committed_bytes(&self, reservation: &ObjectRef) -> PluginResult<u64> {
        let res = self.reservations.find(reservation)?;
        let state = res.lock(reservation)?;
        Ok(state.committed.total())
    }

    fn release(&self, reservation: &ObjectRef) -> PluginResult<()> {
        // Out of the table first, unmapped after: the kernel may hand the
        // addresses to a new reservation the moment they are unmapped, and
        // a copy into that one must not meet this entry first (it was
        // answered OUT_OF_RANGE when the unmap came first). Marked released
        // (under the lock when anyone else still holds it), so queued work
        // and copies that found it before touch none of its addresses.
        let retired = self.reservations.retire(reservation)?;
        if let Some(mappings) = retired.mappings {
            for object in mappings.into_objects() {
                self.physical.drop_mapping(object);
            }
        }
        // SAFETY: the reservation was live and is now out of the table,
        // and marked released where anyone else still holds it, so no call
        // will touch its addresses again. munmap
        // also removes every shared mapping inside the range. (munmap of a
        // range this process mapped does not fail; if it did, the range
        // would stay mapped and unreachable: never handed out again.) The
        // guards around the range go with it.
        unsafe { os::unreserve(retired.mapped_start, retired.mapped_len, "release") }
    }

    // ABI 1.2 queue-ordered binding (`queued.rs`).
    const CAN_QUEUE: bool = true;

    fn commit_on(&self, reservation: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        crate::queued::commit_on(self, reservation, offset, len, stream)
    }

    fn decommit_on(&self, reservation: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        crate::queued::decommit_on(self, reservation, offset, len, stream)
    }
}
