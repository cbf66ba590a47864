//! Transfers between a peer's ranges and this process's memplug memory:
//! the receiving side's budget is reserved before any byte moves, and the
//! transfer's fence is recorded on the local memory, so its free, shrink,
//! offload or privatise orders behind the transfer.

use crate::error::UcxError;
use crate::local::{LocalAllocation, LocalRegion};
use crate::peer::{Peer, RemoteRange};
use crate::transfer::{Direction, Transfer};

impl Peer {
    /// Reads `len` bytes at `src_offset` of `range` into `region` at
    /// `dst_offset`. When the destination reaches past the region's usable
    /// length, the region first grows to cover it — a charge the governor
    /// may refuse (`OutOfBudget`: [`UcxError::is_out_of_budget`]), and then
    /// nothing is transferred and the region is as it was. The transfer is
    /// recorded on the region (`used_by`): its shrink, offload, privatise
    /// and release wait for it.
    ///
    /// Refused as well: a destination past the reservation, or overlapping
    /// the region's read-only prefix (`Invalid`); an offloaded or lost
    /// region; a range released or revoked (`Revoked`); a lost peer.
    pub fn pull_into_region(
        &mut self,
        region: &mut impl LocalRegion,
        dst_offset: u64,
        range: &RemoteRange,
        src_offset: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        let end = local_end(dst_offset, len)?;
        let view = region.view();
        if view.is_lost() || view.is_offloaded() {
            return Err(UcxError::Invalid(format!(
                "cannot pull into a {} region",
                if view.is_lost() { "lost" } else { "offloaded" }
            )));
        }
        let prefix = view.len - region.committed();
        if dst_offset < prefix && region.prefix_is_read_only() {
            return Err(UcxError::Invalid(format!(
                "destination +{dst_offset} overlaps the region's read-only shared prefix ({prefix} B)"
            )));
        }
        if end > region.capacity() {
            return Err(UcxError::Invalid(format!(
                "destination +{dst_offset} ({len} B) is past the region's reservation ({} B)",
                region.capacity()
            )));
        }
        // Checked before the grow, so a bad remote range charges nothing.
        self.check_remote(range, src_offset, len, Direction::Get)?;
        if end > view.len {
            region.grow_to(end)?;
        }
        // SAFETY: inside the region's committed length; the fence recorded
        // below keeps it committed until the transfer completes.
        let t = unsafe { self.transfer(Direction::Get, range, src_offset, view.addr + dst_offset, len)? };
        region.used_by(t.fence());
        Ok(t)
    }

    /// Writes `len` bytes of `region` at `src_offset` into `range` at
    /// `dst_offset` (a range offered writable). The region's shrink,
    /// offload and release wait for the transfer.
    pub fn push_from_region(
        &mut self,
        region: &mut impl LocalRegion,
        src_offset: u64,
        range: &RemoteRange,
        dst_offset: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        let end = local_end(src_offset, len)?;
        let view = region.view();
        if view.is_lost() || view.is_offloaded() || end > view.len {
            return Err(UcxError::Invalid(format!(
                "source +{src_offset} ({len} B) is not inside the region's resident usable {} B",
                view.len
            )));
        }
        // SAFETY: inside the usable length; the fence keeps it there.
        let t = unsafe { self.transfer(Direction::Put, range, dst_offset, view.addr + src_offset, len)? };
        region.used_by(t.fence());
        Ok(t)
    }

    /// Reads into `allocation` (an `OwnedAllocation`, or another
    /// [`LocalAllocation`]) at `dst_offset` (memory already charged:
    /// allocate it from the receiving binding first, which is where the
    /// budget is refused). Its release waits for the transfer.
    pub fn pull_into_allocation(
        &mut self,
        allocation: &mut impl LocalAllocation,
        dst_offset: u64,
        range: &RemoteRange,
        src_offset: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        self.with_allocation(Direction::Get, allocation, dst_offset, range, src_offset, len)
    }

    /// Writes from `allocation` at `src_offset` into a writable `range`.
    pub fn push_from_allocation(
        &mut self,
        allocation: &mut impl LocalAllocation,
        src_offset: u64,
        range: &RemoteRange,
        dst_offset: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        self.with_allocation(Direction::Put, allocation, src_offset, range, dst_offset, len)
    }

    /// A transfer between `allocation` at `local_offset` and `range` at
    /// `remote_offset`, either way, recorded on the allocation.
    fn with_allocation(
        &mut self,
        direction: Direction,
        allocation: &mut impl LocalAllocation,
        local_offset: u64,
        range: &RemoteRange,
        remote_offset: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        let end = local_end(local_offset, len)?;
        if allocation.is_lost() || end > allocation.size() {
            let side = if direction == Direction::Get { "destination" } else { "source" };
            return Err(UcxError::Invalid(format!(
                "{side} +{local_offset} ({len} B) is not inside the allocation's {} B",
                allocation.size()
            )));
        }
        // SAFETY: inside the allocation; its release waits for the fence.
        let t =
            unsafe { self.transfer(direction, range, remote_offset, allocation.addr() + local_offset, len)? };
        allocation.used_by(t.fence());
        Ok(t)
    }

    /// Reads into raw memory.
    ///
    /// # Safety
    /// `[local, +len)` must stay valid and writable until the transfer
    /// completes (wait for it, or order the free behind its fence).
    pub unsafe fn get_raw(
        &mut self,
        range: &RemoteRange,
        offset: u64,
        local: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        // SAFETY: forwarded.
        unsafe { self.transfer(Direction::Get, range, offset, local, len) }
    }

    /// Writes from raw memory.
    ///
    /// # Safety
    /// `[local, +len)` must stay valid until the transfer completes.
    pub unsafe fn put_raw(
        &mut self,
        range: &RemoteRange,
        offset: u64,
        local: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        // SAFETY: forwarded.
        unsafe { self.transfer(Direction::Put, range, offset, local, len) }
    }
}

fn local_end(offset: u64, len: u64) -> Result<u64, UcxError> {
    if len == 0 {
        return Err(UcxError::Invalid("a transfer of 0 bytes".into()));
    }
    offset.checked_add(len).ok_or_else(|| UcxError::Invalid(format!("+{offset} ({len} B) overflows")))
}
