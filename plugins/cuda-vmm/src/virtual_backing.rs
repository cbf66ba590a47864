//! The virtual backing capability on CUDA VMM.
//!
//! * reserve = `cuMemAddressReserve` (address space only, aligned to the
//!   granularity);
//! * commit = one `cuMemCreate` physical chunk per granule, `cuMemMap`ped in
//!   place, then one `cuMemSetAccess` (read-write) over the range and a
//!   zero-fill (the ABI promises zeros after a commit; a reservation made
//!   with `MEMPLUG_HINT_UNINITIALIZED_OK` skips it);
//! * decommit = one `cuMemUnmap` over the whole range (its granules are
//!   adjacent mappings), then `cuMemRelease` of each granule;
//! * release = one `cuMemUnmap` per whole mapping of a shareable object
//!   (`export.rs`), then one per run of adjacent mapped granules (committed
//!   granules and other shared mappings alike), the chunks released, then
//!   `cuMemAddressFree`.
//!
//! One chunk per granule is what lets any granule-aligned sub-range be
//! decommitted later: the driver can neither unmap part of a mapping nor map
//! a physical allocation from a non-zero offset. Unmapping is batched: one
//! call covers adjacent mappings (decommitting 16 GiB is one `cuMemUnmap`,
//! not 8192), as CUDA's own samples unmap ranges mapped piece by piece; a
//! driver that refuses a range of several mappings (where one mapping per
//! call works) is noticed once per mechanism and then unmapped granule by
//! granule.
//!
//! Every call checks the whole range against the reservation's state before
//! it calls the driver, so a refused call changes nothing; a commit that
//! fails in the driver undoes what it did. **No lock across a driver
//! call**: a call marks its range *busy* under the reservation's lock, lets
//! the lock go for the driver calls, and takes it again to record the
//! outcome; another call on a disjoint range of the same reservation
//! proceeds meanwhile, one on an overlapping range is refused
//! (`INVALID_STATE`, nothing changed), and `release` while a call is in the
//! driver is `BUSY`.

use crate::context::Pin;
use crate::driver::{access_desc, CUmemGenericAllocationHandle, Vmm, CUDA_ERROR_INVALID_VALUE};
use crate::mechanism::{wrong_state, CudaMechanism};
use memplug_sdk::{Access, Block, ObjectRef, PluginError, PluginResult, Request, Status, VirtualBacking};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One shared mapping inside a reservation.
pub struct Mapping {
    /// Bytes mapped; an unmap must name exactly this.
    pub len: u64,
    /// Handle of the physical object; the mapping holds one of its
    /// references.
    pub object: u64,
    /// One driver mapping of a shareable object's single handle (see
    /// `export.rs`): unmapped with one `cuMemUnmap`, never granule by
    /// granule.
    pub whole: bool,
}

/// Mutable state of a reservation.
#[derive(Default)]
pub struct State {
    released: bool,
    /// Set while `release` is in the driver: the reservation is going.
    releasing: bool,
    /// Committed granules: offset → physical handle.
    pub committed: BTreeMap<u64, CUmemGenericAllocationHandle>,
    /// Shared mappings by starting offset (disjoint from each other and
    /// from committed granules).
    pub mappings: BTreeMap<u64, Mapping>,
    /// Ranges a call is changing in the driver now, by start → length
    /// (disjoint from each other, from committed granules and from
    /// mappings).
    pub busy: BTreeMap<u64, u64>,
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

    /// Whether every byte of `[start, end)` (offsets, not necessarily
    /// aligned) lies in a committed granule no call is changing, or in a
    /// shared mapping: the ranges a copy may touch (`g` the granularity).
    pub fn usable(&self, start: u64, end: u64, g: u64) -> bool {
        let mut at = start - start % g;
        while at < end {
            let mapping_end = self.mappings.range(..=at).next_back().map(|(&s, m)| s + m.len);
            match mapping_end.filter(|&e| e > at) {
                Some(e) => at = e,
                None if self.committed.contains_key(&at) && !self.busy_in(at, at + g) => at += g,
                None => return false,
            }
        }
        true
    }

    /// Whether a call in the driver is changing part of `[start, end)`.
    pub fn busy_in(&self, start: u64, end: u64) -> bool {
        self.busy.range(..end).next_back().is_some_and(|(&s, &len)| s + len > start)
    }

    /// Refuses `[start, end)` when another call is changing part of it.
    pub fn check_not_busy(&self, call: &str, start: u64, end: u64) -> PluginResult<()> {
        if self.busy_in(start, end) {
            return Err(wrong_state(format!(
                "{call}: range [{start:#x}, {end:#x}) is being changed by another call right now"
            )));
        }
        Ok(())
    }
}

/// A reservation: identity, locked state, and the pin of its context.
pub struct Reservation {
    pub object_id: u64,
    pub addr: u64,
    pub size: u64,
    /// Whether commits are zero-filled: the ABI's promise, waived when the
    /// reserving request carried `MEMPLUG_HINT_UNINITIALIZED_OK`.
    pub zero_fill: bool,
    /// Set (before anything goes to the driver) while `release` takes the
    /// reservation apart, and cleared only if it fails: a copy's scan
    /// (`copy.rs`) skips a leaving reservation, so a new reservation the
    /// driver placed at its freed addresses is never judged by this
    /// one's stale entry (the CPU plugin answered `OUT_OF_RANGE` to valid
    /// copies that way).
    pub leaving: AtomicBool,
    state: Mutex<State>,
    /// Declared last: the context is released after the rest is gone.
    pub pin: Pin,
}

impl Reservation {
    fn is(&self, obj: &ObjectRef) -> bool {
        self.object_id == obj.object_id && self.addr == obj.addr && self.size == obj.size
    }

    /// Locks the state, refusing a reservation released (or being
    /// released) after it was found.
    pub fn lock(&self, m: &CudaMechanism, obj: &ObjectRef) -> PluginResult<MutexGuard<'_, State>> {
        let s = self.state();
        if s.released || s.releasing {
            return Err(m.unknown(obj, "reservation"));
        }
        Ok(s)
    }

    /// Locks the state as it is (to record what a call that marked a busy
    /// range did).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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
        let prop = self.create_prop();
        let mut made = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: resolved entry point; `prop` and `h` live for the call.
            let r = unsafe { (vmm.create)(&mut h, self.granularity as usize, &prop, 0) };
            if let Err(e) = d.check(r, "cuMemCreate") {
                release_all(vmm, &made);
                let e = if made.is_empty() {
                    e
                } else {
                    PluginError::new(
                        e.status,
                        format!(
                            "{} (granule {} of {n}; the {} made before were released)",
                            e.message,
                            made.len() + 1,
                            made.len()
                        ),
                    )
                };
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
                let _ = self.unmap_run(vmm, addr, i as u64);
                return Err(e);
            }
        }
        let len = handles.len() as u64 * g;
        if let Err(e) = self.grant_access(vmm, addr, len, access) {
            let _ = self.unmap_run(vmm, addr, handles.len() as u64);
            return Err(e);
        }
        Ok(())
    }

    /// Gives the device `access` to the mapped range `[addr, addr + len)`
    /// (one `cuMemSetAccess`); a driver refusing read-only access is
    /// `UNSUPPORTED`. The caller undoes its mapping on failure.
    pub(crate) fn grant_access(&self, vmm: Vmm, addr: u64, len: u64, access: Access) -> PluginResult<()> {
        let d = self.driver;
        let desc = access_desc(self.ctx_device(), access == Access::ReadWrite);
        // SAFETY: the range was just mapped; `desc` lives for the call.
        let r = unsafe { (vmm.set_access)(addr, len as usize, &desc, 1) };
        if r != crate::driver::CUDA_SUCCESS {
            if access == Access::ReadOnly
                && (r == crate::driver::CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE)
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

    /// Unmaps the `n` adjacent granule mappings starting at `addr`: one
    /// `cuMemUnmap` over all of them, or one per granule where the driver
    /// takes a single mapping per call. Returns how many of the leading
    /// granules are unmapped (all of them, unless the driver failed) and
    /// the first failure.
    pub(crate) fn unmap_run(&self, vmm: Vmm, addr: u64, n: u64) -> (u64, PluginResult<()>) {
        let d = self.driver;
        let g = self.granularity;
        if n == 0 {
            return (0, Ok(()));
        }
        if n == 1 || self.batch_unmap.load(Ordering::Relaxed) {
            // SAFETY: `n` granule mappings made by this mechanism, adjacent.
            let r = unsafe { (vmm.unmap)(addr, (n * g) as usize) };
            if r == crate::driver::CUDA_SUCCESS {
                return (n, Ok(()));
            }
            // A dead context is not asked again; any other refusal of a
            // range of several mappings (CUDA_ERROR_INVALID_VALUE, say) is
            // retried granule by granule.
            if n == 1 || crate::driver::is_sticky(r) {
                return (0, Err(d.error(r, "cuMemUnmap")));
            }
        }
        // One by one; if that works, this driver takes one mapping per call
        // (remembered: later runs skip the batched attempt).
        for i in 0..n {
            // SAFETY: each granule is one mapping made by this mechanism.
            let r = unsafe { (vmm.unmap)(addr + i * g, g as usize) };
            if let Err(e) = d.check(r, "cuMemUnmap") {
                return (i, Err(e));
            }
            if i == 0 {
                self.batch_unmap.store(false, Ordering::Relaxed);
            }
        }
        (n, Ok(()))
    }
}

/// Releases physical chunks on a path that is already failing.
pub(crate) fn release_all(vmm: Vmm, handles: &[CUmemGenericAllocationHandle]) {
    for &h in handles {
        // SAFETY: chunks this mechanism created and nothing else holds.
        unsafe { (vmm.release)(h) };
    }
}

/// What one granule of a reservation being released holds.
#[derive(Clone, Copy)]
enum Held {
    /// A committed chunk (released after it is unmapped).
    Committed(CUmemGenericAllocationHandle),
    /// Part of the shared mapping starting at this offset.
    Shared(u64),
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
            zero_fill: request.hints & memplug_sdk::abi::MEMPLUG_HINT_UNINITIALIZED_OK == 0,
            leaving: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            pin,
        }));
        Ok(Block { addr, size, handle })
    }

    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("commit")?;
        let vmm = self.vmm("commit")?;
        let res = self.find_reservation(reservation)?;
        {
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
            st.check_not_busy("commit", offset, end)?;
            st.busy.insert(offset, len);
        }
        // The driver's part, with no lock held.
        let g = self.granularity;
        let made = res.pin.enter().and_then(|_e| {
            let handles = self.create_granules(vmm, len / g)?;
            if let Err(e) = self.map_granules(vmm, res.addr + offset, &handles, Access::ReadWrite) {
                release_all(vmm, &handles);
                return Err(e);
            }
            // Skipped for a reservation whose request said uninitialised
            // memory is acceptable (ABI 1.2 MEMPLUG_HINT_UNINITIALIZED_OK).
            let filled = if res.zero_fill { res.pin.zero_fill(res.addr + offset, len) } else { Ok(()) };
            if let Err(e) = filled {
                let _ = self.unmap_run(vmm, res.addr + offset, len / g);
                release_all(vmm, &handles);
                return Err(e);
            }
            Ok(handles)
        });
        let mut st = res.state();
        st.busy.remove(&offset);
        for (i, h) in made?.into_iter().enumerate() {
            st.committed.insert(offset + i as u64 * g, h);
        }
        Ok(())
    }

    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("decommit")?;
        let vmm = self.vmm("decommit")?;
        let res = self.find_reservation(reservation)?;
        let g = self.granularity;
        let taken: Vec<(u64, CUmemGenericAllocationHandle)> = {
            let mut st = res.lock(self, reservation)?;
            let end = self.check_range(offset, len, res.size, "decommit")?;
            if st.committed.range(offset..end).count() as u64 != len / g {
                return Err(wrong_state(format!(
                    "decommit: range [{offset:#x}, {end:#x}) has pages that are not committed"
                )));
            }
            // (Committed granules are never busy: a busy range is disjoint
            // from them.)
            let taken = st.committed.range(offset..end).map(|(&o, &h)| (o, h)).collect::<Vec<_>>();
            for (o, _) in &taken {
                st.committed.remove(o);
            }
            st.busy.insert(offset, len);
            taken
        };
        // Every granule of the range is committed, so the mappings are
        // adjacent: one cuMemUnmap covers them.
        let d = self.driver;
        let (unmapped, result) = match res.pin.enter() {
            Ok(_e) => {
                let (n, r) = self.unmap_run(vmm, res.addr + offset, taken.len() as u64);
                let mut result = r;
                for &(_, h) in &taken[..n as usize] {
                    // SAFETY: the chunk is no longer mapped and nothing else
                    // holds it.
                    let r = d.check(unsafe { (vmm.release)(h) }, "cuMemRelease");
                    if result.is_ok() {
                        result = r;
                    }
                }
                (n as usize, result)
            }
            Err(e) => (0, Err(e)),
        };
        // If the driver failed part-way, the state still says exactly which
        // granules are committed (mapped).
        let mut st = res.state();
        st.busy.remove(&offset);
        for &(o, h) in &taken[unmapped..] {
            st.committed.insert(o, h);
        }
        result
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
        let g = self.granularity;
        // Everything mapped, granule by granule, taken out of the state.
        let (held, mut mappings) = {
            let mut st = res.lock(self, reservation)?;
            if !st.busy.is_empty() {
                return Err(PluginError::new(
                    Status::Busy,
                    "release: another call is changing this reservation in the driver right now",
                ));
            }
            st.releasing = true;
            res.leaving.store(true, Ordering::Release);
            let mut held: BTreeMap<u64, Held> =
                std::mem::take(&mut st.committed).into_iter().map(|(o, h)| (o, Held::Committed(h))).collect();
            let mappings = std::mem::take(&mut st.mappings);
            for (&start, m) in mappings.iter().filter(|(_, m)| !m.whole) {
                for i in 0..m.len / g {
                    held.insert(start + i * g, Held::Shared(start));
                }
            }
            (held.into_iter().collect::<Vec<_>>(), mappings)
        };
        // Whole mappings of shareable objects: one cuMemUnmap each, first.
        let wholes: Vec<(u64, u64)> =
            mappings.iter().filter(|(_, m)| m.whole).map(|(&start, m)| (start, m.len)).collect();
        let mut wholes_done = 0usize;
        let d = self.driver;
        // Runs of adjacent granules: one cuMemUnmap each.
        let mut unmapped = 0usize;
        let mut result = res.pin.enter().and_then(|_e| {
            for &(start, len) in &wholes {
                self.unmap_whole(vmm, res.addr + start, len)?;
                wholes_done += 1;
            }
            let mut first = Ok(());
            while unmapped < held.len() {
                let start = held[unmapped].0;
                let mut n = 1;
                while unmapped + n < held.len() && held[unmapped + n].0 == start + n as u64 * g {
                    n += 1;
                }
                let (done, r) = self.unmap_run(vmm, res.addr + start, n as u64);
                let run = &held[unmapped..unmapped + done as usize];
                unmapped += done as usize;
                for &(_, h) in run {
                    if let Held::Committed(h) = h {
                        // SAFETY: unmapped, held by nothing else. A chunk
                        // the driver keeps is lost to the state either way
                        // (it is unmapped); the failure is reported.
                        let released = d.check(unsafe { (vmm.release)(h) }, "cuMemRelease");
                        if first.is_ok() {
                            first = released;
                        }
                    }
                }
                r?;
            }
            first
        });
        // Mappings now wholly unmapped give their object reference back;
        // one with a granule still mapped stays.
        let still_mapped: std::collections::BTreeSet<u64> = held[unmapped..]
            .iter()
            .filter_map(|&(_, h)| if let Held::Shared(s) = h { Some(s) } else { None })
            .chain(wholes[wholes_done..].iter().map(|&(start, _)| start))
            .collect();
        let unmapped_objects: Vec<u64> = {
            let gone: Vec<u64> = mappings.keys().copied().filter(|s| !still_mapped.contains(s)).collect();
            gone.iter().filter_map(|s| mappings.remove(s)).map(|m| m.object).collect()
        };
        if result.is_ok() {
            // SAFETY: nothing is mapped in the range any more.
            result = d.check(unsafe { (vmm.address_free)(res.addr, res.size as usize) }, "cuMemAddressFree");
        }
        {
            let mut st = res.state();
            st.releasing = false;
            if result.is_ok() {
                st.released = true;
            } else {
                res.leaving.store(false, Ordering::Release);
                // What is still mapped stays, usable for another try.
                for &(o, h) in &held[unmapped..] {
                    if let Held::Committed(h) = h {
                        st.committed.insert(o, h);
                    }
                }
                st.mappings = mappings;
            }
        }
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
