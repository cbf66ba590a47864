//! The virtual backing capability on CUDA VMM.
//!
//! * reserve = `cuMemAddressReserve` (address space only, aligned to the
//!   granularity);
//! * commit = one `cuMemCreate` physical chunk per granule, `cuMemMap`ped in
//!   place, then one `cuMemSetAccess` (read-write) over the range and a
//!   zero-fill (the ABI promises zeros after a commit);
//! * decommit = `cuMemUnmap` + `cuMemRelease` of each granule;
//! * release = everything above, every shared mapping unmapped, then
//!   `cuMemAddressFree`.
//!
//! One chunk per granule is what lets any granule-aligned sub-range be
//! decommitted later: the driver can neither unmap part of a mapping nor map
//! a physical allocation from a non-zero offset.
//!
//! Every call checks the whole range against the reservation's state before
//! it calls the driver, so a refused call changes nothing; a commit that
//! fails in the driver undoes what it did.

use crate::context::Pin;
use crate::driver::{access_desc, allocation_prop, CUmemGenericAllocationHandle, Vmm};
use crate::mechanism::{wrong_state, CudaMechanism};
use memplug_sdk::{Access, Block, ObjectRef, PluginError, PluginResult, Request, VirtualBacking};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One shared mapping inside a reservation.
pub struct Mapping {
    /// Bytes mapped; an unmap must name exactly this.
    pub len: u64,
    /// Handle of the physical object; the mapping holds one of its
    /// references.
    pub object: u64,
}

/// Mutable state of a reservation.
#[derive(Default)]
pub struct State {
    released: bool,
    /// Committed granules: offset → physical handle.
    pub committed: BTreeMap<u64, CUmemGenericAllocationHandle>,
    /// Shared mappings by starting offset (disjoint from each other and
    /// from committed granules).
    pub mappings: BTreeMap<u64, Mapping>,
}

impl State {
    /// Whether any committed granule lies in `[start, end)`.
    pub fn committed_in(&self, start: u64, end: u64) -> bool {
        self.committed.range(start..end).next().is_some()
    }

    /// Whether any shared mapping overlaps `[start, end)`.
    pub fn mapped(&self, start: u64, end: u64) -> bool {
        self.mappings.range(..end).next_back().is_some_and(|(&s, m)| s + m.len > start)
    }
}

/// A reservation: identity, locked state, and the pin of its context.
pub struct Reservation {
    pub object_id: u64,
    pub addr: u64,
    pub size: u64,
    state: Mutex<State>,
    /// Declared last: the context is released after the rest is gone.
    pub pin: Pin,
}

impl Reservation {
    fn is(&self, obj: &ObjectRef) -> bool {
        self.object_id == obj.object_id && self.addr == obj.addr && self.size == obj.size
    }

    /// Locks the state, refusing a reservation released after it was found.
    pub fn lock(&self, m: &CudaMechanism, obj: &ObjectRef) -> PluginResult<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.released {
            return Err(m.unknown(obj, "reservation"));
        }
        Ok(s)
    }
}

impl CudaMechanism {
    /// The reservation `obj` names: mechanism, device, then handle.
    pub(crate) fn find_reservation(&self, obj: &ObjectRef) -> PluginResult<Arc<Reservation>> {
        self.check_owner(obj, "reservation")?;
        self.reservations
            .with(obj.handle, |r| r.is(obj), |r| Arc::clone(r))
            .ok_or_else(|| self.unknown(obj, "reservation"))
    }

    /// `n` physical chunks of one granule each; none when any fails.
    pub(crate) fn create_granules(
        &self,
        vmm: Vmm,
        n: u64,
    ) -> PluginResult<Vec<CUmemGenericAllocationHandle>> {
        let d = self.driver;
        let prop = allocation_prop(self.ctx_device());
        let mut made = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: resolved entry point; `prop` and `h` live for the call.
            let r = unsafe { (vmm.create)(&mut h, self.granularity as usize, &prop, 0) };
            if let Err(e) = d.check(r, "cuMemCreate") {
                release_all(vmm, &made);
                return Err(e);
            }
            made.push(h);
        }
        Ok(made)
    }

    fn ctx_device(&self) -> crate::driver::CUdevice {
        self.driver.devices[self.device.ordinal as usize].device
    }

    /// Maps `handles[i]` at `addr + i * granularity` and gives the device
    /// `access` to the whole range; on failure nothing stays mapped.
    pub(crate) fn map_granules(
        &self,
        vmm: Vmm,
        addr: u64,
        handles: &[CUmemGenericAllocationHandle],
        access: Access,
    ) -> PluginResult<()> {
        let d = self.driver;
        let g = self.granularity;
        for (i, &h) in handles.iter().enumerate() {
            // SAFETY: the range lies in a reservation of this mechanism and
            // is neither committed nor mapped (the callers' checks).
            let r = unsafe { (vmm.map)(addr + i as u64 * g, g as usize, 0, h, 0) };
            if let Err(e) = d.check(r, "cuMemMap") {
                let _ = self.unmap_granules(vmm, addr, i as u64);
                return Err(e);
            }
        }
        let len = handles.len() as u64 * g;
        let desc = access_desc(self.ctx_device(), access == Access::ReadWrite);
        // SAFETY: the range was just mapped; `desc` lives for the call.
        let r = unsafe { (vmm.set_access)(addr, len as usize, &desc, 1) };
        if r != crate::driver::CUDA_SUCCESS {
            let _ = self.unmap_granules(vmm, addr, handles.len() as u64);
            if access == Access::ReadOnly
                && (r == crate::driver::CUDA_ERROR_NOT_SUPPORTED
                    || r == crate::driver::CUDA_ERROR_INVALID_VALUE)
            {
                return Err(PluginError::unsupported(format!(
                    "this driver refuses read-only access (CU_MEM_ACCESS_FLAGS_PROT_READ) on device {}: \
                     cuMemSetAccess failed: {} ({r})",
                    self.device.ordinal,
                    d.error_name(r)
                )));
            }
            return Err(d.error(r, "cuMemSetAccess"));
        }
        Ok(())
    }

    /// Unmaps `n` granule mappings starting at `addr`; tries them all and
    /// reports the first failure.
    pub(crate) fn unmap_granules(&self, vmm: Vmm, addr: u64, n: u64) -> PluginResult<()> {
        let d = self.driver;
        let g = self.granularity;
        let mut first = Ok(());
        for i in 0..n {
            // SAFETY: each granule is one mapping made by this mechanism.
            let r = unsafe { (vmm.unmap)(addr + i * g, g as usize) };
            if first.is_ok() {
                first = d.check(r, "cuMemUnmap");
            }
        }
        first
    }
}

/// Releases physical chunks on a path that is already failing.
pub(crate) fn release_all(vmm: Vmm, handles: &[CUmemGenericAllocationHandle]) {
    for &h in handles {
        // SAFETY: chunks this mechanism created and nothing else holds.
        unsafe { (vmm.release)(h) };
    }
}

impl VirtualBacking for CudaMechanism {
    fn reserve(&self, request: &Request) -> PluginResult<Block> {
        let _slot = self.slot("reserve")?;
        let vmm = self.vmm("reserve")?;
        self.check_request(request, "reserve")?;
        let size = self.round_up(request.size, "reserve")?;
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let addr = {
            let _e = pin.enter()?;
            let mut addr = 0;
            // SAFETY: resolved entry point, out-pointer to a local.
            let r =
                unsafe { (vmm.address_reserve)(&mut addr, size as usize, self.granularity as usize, 0, 0) };
            d.check(r, "cuMemAddressReserve")?;
            addr
        };
        let handle = self.reservations.insert(Arc::new(Reservation {
            object_id: request.object_id,
            addr,
            size,
            state: Mutex::new(State::default()),
            pin,
        }));
        Ok(Block { addr, size, handle })
    }

    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("commit")?;
        let vmm = self.vmm("commit")?;
        let res = self.find_reservation(reservation)?;
        let mut st = res.lock(self, reservation)?;
        let end = self.check_range(offset, len, res.size, "commit")?;
        if st.committed_in(offset, end) {
            return Err(wrong_state(format!(
                "commit: range [{offset:#x}, {end:#x}) has pages already committed"
            )));
        }
        if st.mapped(offset, end) {
            return Err(wrong_state(format!(
                "commit: range [{offset:#x}, {end:#x}) has pages mapped to a physical object"
            )));
        }
        let g = self.granularity;
        let _e = res.pin.enter()?;
        let handles = self.create_granules(vmm, len / g)?;
        if let Err(e) = self.map_granules(vmm, res.addr + offset, &handles, Access::ReadWrite) {
            release_all(vmm, &handles);
            return Err(e);
        }
        if let Err(e) = res.pin.zero_fill(res.addr + offset, len) {
            let _ = self.unmap_granules(vmm, res.addr + offset, len / g);
            release_all(vmm, &handles);
            return Err(e);
        }
        for (i, h) in handles.into_iter().enumerate() {
            st.committed.insert(offset + i as u64 * g, h);
        }
        Ok(())
    }

    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("decommit")?;
        let vmm = self.vmm("decommit")?;
        let res = self.find_reservation(reservation)?;
        let mut st = res.lock(self, reservation)?;
        let end = self.check_range(offset, len, res.size, "decommit")?;
        let g = self.granularity;
        if st.committed.range(offset..end).count() as u64 != len / g {
            return Err(wrong_state(format!(
                "decommit: range [{offset:#x}, {end:#x}) has pages that are not committed"
            )));
        }
        let d = self.driver;
        let _e = res.pin.enter()?;
        // Granule by granule; if the driver fails part-way, the state still
        // says exactly which granules are committed.
        let mut o = offset;
        while o < end {
            let h = st.committed[&o];
            // SAFETY: one committed granule of this reservation.
            d.check(unsafe { (vmm.unmap)(res.addr + o, g as usize) }, "cuMemUnmap")?;
            st.committed.remove(&o);
            // SAFETY: the chunk is no longer mapped and nothing else holds it.
            d.check(unsafe { (vmm.release)(h) }, "cuMemRelease")?;
            o += g;
        }
        Ok(())
    }

    fn committed_bytes(&self, reservation: &ObjectRef) -> PluginResult<u64> {
        let _slot = self.slot("committed_bytes")?;
        let res = self.find_reservation(reservation)?;
        let st = res.lock(self, reservation)?;
        Ok(st.committed.len() as u64 * self.granularity)
    }

    fn release(&self, reservation: &ObjectRef) -> PluginResult<()> {
        let _slot = self.slot("release")?;
        let vmm = self.vmm("release")?;
        let res = self.find_reservation(reservation)?;
        let mut st = res.lock(self, reservation)?;
        let d = self.driver;
        let g = self.granularity;
        let mut unmapped_objects = Vec::new();
        let result = res.pin.enter().and_then(|_e| {
            while let Some((&o, &h)) = st.committed.first_key_value() {
                // SAFETY: one committed granule of this reservation.
                d.check(unsafe { (vmm.unmap)(res.addr + o, g as usize) }, "cuMemUnmap")?;
                st.committed.remove(&o);
                // SAFETY: unmapped, held by nothing else.
                d.check(unsafe { (vmm.release)(h) }, "cuMemRelease")?;
            }
            while let Some((&o, m)) = st.mappings.first_key_value() {
                self.unmap_granules(vmm, res.addr + o, m.len / g)?;
                if let Some(m) = st.mappings.remove(&o) {
                    unmapped_objects.push(m.object);
                }
            }
            // SAFETY: nothing is mapped in the range any more.
            d.check(unsafe { (vmm.address_free)(res.addr, res.size as usize) }, "cuMemAddressFree")?;
            st.released = true;
            Ok(())
        });
        drop(st);
        if result.is_ok() {
            let gone = self.reservations.remove(reservation.handle, |r| Arc::ptr_eq(r, &res));
            drop(gone);
        }
        for object in unmapped_objects {
            self.drop_mapping(object);
        }
        result
    }
}
