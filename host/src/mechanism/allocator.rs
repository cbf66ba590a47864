//! The allocator capability (required of every mechanism).

use super::call::Held;
use super::{class_tag, MechanismInner, MemoryInfo, Placement};
use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::governor::AllocationClass;
use crate::tokens::Allocation;
use memplug_sdk::abi::*;
use memplug_sdk::Status;

/// The allocator of a mechanism. Every method may be called from any thread.
#[derive(Clone, Copy)]
pub struct AllocatorApi<'m> {
    pub(super) m: &'m MechanismInner,
    /// A token of the mechanism's gate the caller holds (a binding
    /// transaction): the door then takes none of its own.
    pub(super) held: Held<'m>,
}

impl<'m> AllocatorApi<'m> {
    /// Allocates at least `size` bytes aligned to `alignment` (class
    /// `Other`).
    #[inline]
    pub fn allocate(&self, size: u64, alignment: u64) -> Result<Allocation, CallError> {
        self.allocate_tagged(size, alignment, MEMPLUG_CLASS_OTHER, &Placement::default())
    }

    /// [`allocate`](Self::allocate), telling a 1.1 plugin what the memory
    /// is for (a 1.0 plugin is not told).
    #[inline]
    pub fn allocate_as(
        &self,
        size: u64,
        alignment: u64,
        class: AllocationClass,
    ) -> Result<Allocation, CallError> {
        self.allocate_tagged(size, alignment, class_tag(class), &Placement::default())
    }

    /// [`allocate_as`](Self::allocate_as), placed as `placement` says (to a
    /// plugin that agreed on 1.2).
    #[inline]
    pub fn allocate_placed(
        &self,
        size: u64,
        alignment: u64,
        class: AllocationClass,
        placement: &Placement,
    ) -> Result<Allocation, CallError> {
        self.allocate_tagged(size, alignment, class_tag(class), placement)
    }

    #[inline]
    fn allocate_tagged(
        &self,
        size: u64,
        alignment: u64,
        tag: u32,
        p: &Placement,
    ) -> Result<Allocation, CallError> {
        let m = self.m;
        let req = m.request(size, alignment, tag, p);
        let mut out = MechanismInner::empty_block();
        m.call_in(self.held, "allocator.allocate", slot!(m.allocator.allocate), (&req, &mut out))?;
        if out.addr == 0 || out.addr & (alignment.max(1).wrapping_sub(1)) != 0 || out.size < size {
            return Err(self.bad_block(&req, &out));
        }
        m.check_block_size("allocator.allocate", "a block", size, out.size, p.page_size, 0)?;
        m.admit_block("allocator.allocate", ObjectKind::Allocation, &req, &out)?;
        m.born(ObjectKind::Allocation);
        Ok(Allocation(m.object(&req, &out)))
    }

    #[cold]
    fn bad_block(&self, req: &MemplugRequest, out: &MemplugBlock) -> CallError {
        // The plugin broke its contract on success; the block is not
        // trusted, not used and not freed (freeing a bogus address could do
        // more harm). It is reported as the plugin's internal failure.
        self.m.refuse(
            "allocator.allocate",
            Status::Internal,
            format!(
                "plugin reported success but returned addr {:#x} size {} for a request of {} bytes aligned to {}",
                out.addr, out.size, req.size, req.alignment
            ),
        )
    }

    /// Frees an allocation. On failure the allocation comes back in the
    /// error, still counted live.
    ///
    /// The common case (no index of live blocks to update) builds the
    /// object reference once, in this frame, and passes the plugin a
    /// pointer to it: the generic release path would move the 56-byte
    /// reference through each layer of the door. Inlined into its callers
    /// (a binding's retire, the ungoverned door), which hand it the token
    /// in registers rather than through memory.
    #[inline(always)]
    pub fn deallocate(&self, a: Allocation) -> Result<(), ReleaseError<Allocation>> {
        let m = self.m;
        let slot = slot!(m.allocator.deallocate);
        if m.blocks.is_some() && m.indexes(ObjectKind::Allocation) {
            return self.deallocate_indexed(a);
        }
        if a.0.mechanism_key != m.key {
            let error = m.made_elsewhere("allocator.deallocate", &a.0);
            return Err(ReleaseError { object: a, error });
        }
        let r = a.0.abi_ref();
        match m.call_in(self.held, "allocator.deallocate", slot, (&r,)) {
            Ok(()) => {
                m.died(ObjectKind::Allocation);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object: a, error }),
        }
    }

    /// [`deallocate`](Self::deallocate) of a mechanism that keeps an index
    /// of live blocks (`LoadOptions::check_overlaps`).
    #[cold]
    #[inline(never)]
    fn deallocate_indexed(&self, a: Allocation) -> Result<(), ReleaseError<Allocation>> {
        let m = self.m;
        let slot = slot!(m.allocator.deallocate);
        m.release_block(
            self.held,
            "allocator.deallocate",
            a,
            |a| &a.0,
            ObjectKind::Allocation,
            slot,
            |a| Ok((m.ref_if_made_here("allocator.deallocate", &a.0)?,)),
        )
    }

    /// Free and total memory of the device, or `None` when the plugin does
    /// not publish the slot.
    pub fn memory_info(&self) -> Option<Result<MemoryInfo, CallError>> {
        let f = self.m.allocator.memory_info?;
        let mut out = MemplugMemoryInfo { struct_size: MEMPLUG_MEMORY_INFO_SIZE_1_0, ..Default::default() };
        Some(
            self.m
                .call("allocator.memory_info", f, (&mut out,))
                .map(|()| MemoryInfo { free_bytes: out.free_bytes, total_bytes: out.total_bytes }),
        )
    }

    /// The properties as the plugin writes them (the loader judges them).
    pub(crate) fn read_properties(&self) -> Result<MemplugProperties, CallError> {
        // The 1.2 descriptor only from a plugin that agreed on 1.2, the 1.3
        // copy spaces only from one that agreed on 1.3.
        let size = match self.m.minor {
            0 | 1 => MEMPLUG_PROPERTIES_SIZE_1_0,
            2 => MEMPLUG_PROPERTIES_SIZE_1_2,
            _ => MEMPLUG_PROPERTIES_SIZE_1_3,
        };
        let mut out = MemplugProperties { struct_size: size, ..Default::default() };
        self.m.call("allocator.properties", slot!(self.m.allocator.properties), (&mut out,))?;
        Ok(out)
    }
}
