//! The virtual backing capability: reserve address ranges, commit physical
//! memory into them, decommit, release.

use super::call::Held;
use super::{class_tag, MechanismInner, Placement};
use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::governor::AllocationClass;
use crate::tokens::Reservation;
use memplug_sdk::abi::*;
use memplug_sdk::Status;

/// Reserve/commit/decommit. Every method may be called from any thread.
#[derive(Clone, Copy)]
pub struct VirtualBackingApi<'m> {
    pub(super) m: &'m MechanismInner,
    pub(super) vt: &'m MemplugVirtualBacking,
}

impl<'m> VirtualBackingApi<'m> {
    /// Reserves at least `size` bytes of address space, nothing committed.
    pub fn reserve(&self, size: u64) -> Result<Reservation, CallError> {
        self.reserve_tagged(size, MEMPLUG_CLASS_OTHER, &Placement::default())
    }

    /// [`reserve`](Self::reserve), telling a 1.1 plugin what the range is
    /// for.
    pub fn reserve_as(&self, size: u64, class: AllocationClass) -> Result<Reservation, CallError> {
        self.reserve_tagged(size, class_tag(class), &Placement::default())
    }

    /// [`reserve_as`](Self::reserve_as), placed as `placement` says (to a
    /// plugin that agreed on 1.2).
    pub fn reserve_placed(
        &self,
        size: u64,
        class: AllocationClass,
        placement: &Placement,
    ) -> Result<Reservation, CallError> {
        self.reserve_tagged(size, class_tag(class), placement)
    }

    fn reserve_tagged(&self, size: u64, tag: u32, p: &Placement) -> Result<Reservation, CallError> {
        let m = self.m;
        let req = m.request(size, m.props.granularity, tag, p);
        let mut out = MechanismInner::empty_block();
        m.call("virtual_backing.reserve", slot!(self.vt.reserve), (&req, &mut out))?;
        if out.addr == 0 || out.size < size {
            return Err(m.refuse(
                "virtual_backing.reserve",
                Status::Internal,
                format!(
                    "plugin reported success but returned addr {:#x} size {} for {size} bytes",
                    out.addr, out.size
                ),
            ));
        }
        m.check_block_size("virtual_backing.reserve", "a reservation", size, out.size, p.page_size, 0)?;
        m.admit_block("virtual_backing.reserve", ObjectKind::Reservation, &req, &out)?;
        m.born(ObjectKind::Reservation);
        Ok(Reservation(m.object(&req, &out)))
    }

    /// Commits `[offset, offset + len)`.
    #[inline]
    pub fn commit(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        self.on_range("virtual_backing.commit", slot!(self.vt.commit), r, offset, len)
    }

    /// Decommits `[offset, offset + len)`: the pages go back to the device.
    #[inline]
    pub fn decommit(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        self.on_range("virtual_backing.decommit", slot!(self.vt.decommit), r, offset, len)
    }

    /// Commit and decommit: the reservation must be this mechanism's and
    /// the range inside it, on the granularity, before the plugin sees it.
    #[inline(always)]
    fn on_range(
        &self,
        name: &'static str,
        slot: unsafe extern "C" fn(
            *mut std::ffi::c_void,
            *const MemplugObjectRef,
            u64,
            u64,
            *const MemplugMessageSink,
        ) -> MemplugStatus,
        r: &Reservation,
        offset: u64,
        len: u64,
    ) -> Result<(), CallError> {
        let o = self.m.ref_if_made_here(name, &r.0)?;
        self.m.check_range(name, "reservation", r.0.size, offset, len)?;
        self.m.call(name, slot, (&o, offset, len))
    }

    /// Exact committed bytes of the reservation.
    pub fn committed_bytes(&self, r: &Reservation) -> Result<u64, CallError> {
        const SLOT: &str = "virtual_backing.committed_bytes";
        let o = self.m.ref_if_made_here(SLOT, &r.0)?;
        let mut out = 0u64;
        self.m.call(SLOT, slot!(self.vt.committed_bytes), (&o, &mut out)).map(|()| out)
    }

    /// Releases the reservation and everything committed or mapped in it.
    pub fn release(&self, r: Reservation) -> Result<(), ReleaseError<Reservation>> {
        const SLOT: &str = "virtual_backing.release";
        let m = self.m;
        m.release_block(
            Held::No,
            SLOT,
            r,
            |r| &r.0,
            ObjectKind::Reservation,
            slot!(self.vt.release),
            |r| Ok((m.ref_if_made_here(SLOT, &r.0)?,)),
        )
    }
}
