//! The shared mapping capability: a physical object is a set of
//! `cuMemCreate` chunks, one per granule (so any granule-aligned part of it
//! can be mapped: the driver maps a chunk only from its start); a mapping
//! `cuMemMap`s the chunks into a range of a reservation and sets the access
//! (`CU_MEM_ACCESS_FLAGS_PROT_READ` for read-only views).
//!
//! An object created with `export_types` asking for
//! `MEMPLUG_HANDLE_OPAQUE_FD`, or imported, is instead ONE shareable handle
//! of its whole size, mapped only whole from offset 0, and exported /
//! imported as a POSIX descriptor (`export.rs`).
//!
//! References: one from `create`, one per `retain`, one per live mapping,
//! counted apart as in the CPU plugin: only the host's make the handle
//! valid, but the chunks are released (`cuMemRelease`) only when both counts
//! reach zero. If the driver refuses that release, the object goes back in
//! the table, unreachable and counted live: its memory is still held.
//!
//! Lock order: a reservation's lock, then this table's lock. Neither is
//! held across a driver call: the last reference takes the object out of
//! the table before its chunks are released; `map` and `unmap` mark their
//! range busy in the reservation (see `virtual_backing.rs`).

use crate::context::Pin;
use crate::driver::CUmemGenericAllocationHandle;
use crate::mechanism::{wrong_state, CudaMechanism};
use crate::virtual_backing::{release_all, Mapping};
use memplug_sdk::abi::MEMPLUG_HANDLE_OPAQUE_FD;
use memplug_sdk::{Access, Block, Handle, HandleRef, ObjectRef, PluginResult, Request, SharedMapping};
use std::sync::Arc;

/// One physical object.
pub struct Physical {
    object_id: u64,
    size: u64,
    /// One chunk per granule, in order; or, for a shareable object, its
    /// one handle.
    pub(crate) handles: Arc<[CUmemGenericAllocationHandle]>,
    /// One shareable handle (POSIX fd) of the whole size: maps only whole
    /// from offset 0, exports (see `export.rs`).
    pub(crate) shareable: bool,
    host_refs: u64,
    pub(crate) mappings: u64,
    /// Declared last: the context is released after the rest is gone.
    pin: Pin,
}

impl Physical {
    /// A new object holding the host's one reference.
    pub(crate) fn new(
        object_id: u64,
        size: u64,
        handles: Vec<CUmemGenericAllocationHandle>,
        shareable: bool,
        pin: Pin,
    ) -> Physical {
        Physical { object_id, size, handles: handles.into(), shareable, host_refs: 1, mappings: 0, pin }
    }

    pub(crate) fn is(&self, obj: &ObjectRef) -> bool {
        self.host_refs > 0 && self.object_id == obj.object_id && obj.addr == 0 && self.size == obj.size
    }
}

impl CudaMechanism {
    /// Releases the chunks of an object whose last reference went. Chunks
    /// the driver refuses to release stay with the object.
    fn release_chunks(&self, p: &mut Physical) -> PluginResult<()> {
        let d = self.driver;
        let vmm = self.vmm("release")?;
        let _e = p.pin.enter()?;
        let mut kept = Vec::new();
        let mut first = Ok(());
        for &h in p.handles.iter() {
            // SAFETY: a chunk of this object, mapped nowhere any more.
            let r = d.check(unsafe { (vmm.release)(h) }, "cuMemRelease");
            if r.is_err() {
                kept.push(h);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        p.handles = kept.into();
        first
    }

    /// Drops one reference (`dec` says which kind), releasing the chunks
    /// when it was the last. `None` when `verify` refuses the entry.
    fn drop_ref(
        &self,
        handle: u64,
        verify: impl FnOnce(&Physical) -> bool,
        dec: impl FnOnce(&mut Physical),
    ) -> Option<PluginResult<()>> {
        let (gone, ()) = self.physical.update(handle, verify, |p| {
            dec(p);
            (p.host_refs == 0 && p.mappings == 0, ())
        })?;
        let Some(mut p) = gone else { return Some(Ok(())) };
        // The last reference: out of the table, the chunks are released
        // with no lock held (and the pin goes after).
        match self.release_chunks(&mut p) {
            Ok(()) => Some(Ok(())),
            Err(e) => {
                // Quarantined: unreachable (no host reference), still
                // counted live, its memory still held.
                self.physical.insert(p);
                Some(Err(e))
            }
        }
    }

    /// Drops the reference a mapping of `handle` held.
    pub(crate) fn drop_mapping(&self, handle: u64) {
        // A mapping's reference keeps the entry, so it is there; a driver
        // failure leaves it quarantined (still counted live).
        let _ = self.drop_ref(handle, |p| p.mappings > 0, |p| p.mappings -= 1);
    }

    /// Zero-fills new chunks (or a new shareable handle) through a
    /// temporary mapping.
    fn zero_chunks(
        &self,
        pin: &Pin,
        handles: &[CUmemGenericAllocationHandle],
        size: u64,
        shareable: bool,
    ) -> PluginResult<()> {
        let vmm = self.vmm("create")?;
        let d = self.driver;
        let mut va = 0;
        // SAFETY: resolved entry point, out-pointer to a local.
        let r = unsafe { (vmm.address_reserve)(&mut va, size as usize, self.granularity as usize, 0, 0) };
        d.check(r, "cuMemAddressReserve")?;
        let filled = self.map_physical(vmm, va, handles, shareable, size, Access::ReadWrite).and_then(|()| {
            let z = pin.zero_fill(va, size);
            let u = if shareable {
                self.unmap_whole(vmm, va, size)
            } else {
                self.unmap_run(vmm, va, handles.len() as u64).1
            };
            z.and(u)
        });
        // SAFETY: the temporary range, unmapped.
        let freed = d.check(unsafe { (vmm.address_free)(va, size as usize) }, "cuMemAddressFree");
        filled.and(freed)
    }

    /// Maps an object's handles at `addr`: chunk by chunk, or a shareable
    /// object's one handle whole (`len` is then its size).
    fn map_physical(
        &self,
        vmm: crate::driver::Vmm,
        addr: u64,
        handles: &[CUmemGenericAllocationHandle],
        shareable: bool,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        if shareable {
            self.map_whole(vmm, addr, handles[0], len, access)
        } else {
            self.map_granules(vmm, addr, handles, access)
        }
    }
}

impl SharedMapping for CudaMechanism {
    fn create(&self, request: &Request) -> PluginResult<Block> {
        let _slot = self.slot("create")?;
        let vmm = self.vmm("create")?;
        self.check_request(request, "create")?;
        let shareable = self.wants_shareable(request)?;
        let size = self.round_up(request.size, "create")?;
        let pin = self.ctx.pin()?;
        let handles = {
            let _e = pin.enter()?;
            let handles = if shareable {
                vec![self.create_shareable(vmm, size)?]
            } else {
                self.create_granules(vmm, size / self.granularity)?
            };
            // The fill (a temporary mapping and a memset) is skipped for a
            // request that said uninitialised memory is acceptable (ABI 1.2
            // MEMPLUG_HINT_UNINITIALIZED_OK).
            let fill = request.hints & memplug_sdk::abi::MEMPLUG_HINT_UNINITIALIZED_OK == 0;
            if fill {
                if let Err(e) = self.zero_chunks(&pin, &handles, size, shareable) {
                    release_all(vmm, &handles);
                    return Err(e);
                }
            }
            handles
        };
        let handle = self.physical.insert(Physical::new(request.object_id, size, handles, shareable, pin));
        Ok(Block { addr: 0, size, handle })
    }

    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        let _slot = self.slot("map")?;
        let vmm = self.vmm("map")?;
        self.check_owner(object, "physical object")?;
        let res = self.find_reservation(reservation)?;
        let g = self.granularity;
        let (handles, shareable) = {
            let mut st = res.lock(self, reservation)?;
            let end = self.check_range(offset, len, res.size, "map: reservation")?;
            // Take a mapping reference first: it keeps the chunks while the
            // driver maps them, with no lock held meanwhile.
            let (handles, shareable) = self
                .physical
                .with(
                    object.handle,
                    |p| p.is(object),
                    |p| {
                        self.check_range(object_offset, len, p.size, "map: physical object")?;
                        if p.shareable && (object_offset != 0 || len != p.size) {
                            return Err(memplug_sdk::PluginError::invalid_argument(format!(
                                "map: the physical object is one shareable CUDA allocation (created with \
                                 export_types MEMPLUG_HANDLE_OPAQUE_FD, or imported), which the driver maps \
                                 only whole from offset 0: object_offset {object_offset:#x}, len {len:#x} of \
                                 its {:#x} bytes; nothing was changed",
                                p.size
                            )));
                        }
                        if st.committed_in(offset, end) {
                            return Err(wrong_state(format!(
                                "map: reservation range [{offset:#x}, {end:#x}) has committed pages"
                            )));
                        }
                        if st.mapped(offset, end) {
                            return Err(wrong_state(format!(
                                "map: reservation range [{offset:#x}, {end:#x}) is already mapped"
                            )));
                        }
                        st.check_not_busy("map", offset, end)?;
                        p.mappings += 1;
                        Ok((Arc::clone(&p.handles), p.shareable))
                    },
                )
                .ok_or_else(|| self.unknown(object, "physical object"))??;
            st.busy.insert(offset, len);
            (handles, shareable)
        };
        let chunks = if shareable {
            &handles[..]
        } else {
            let first = (object_offset / g) as usize;
            &handles[first..first + (len / g) as usize]
        };
        let mapped = res
            .pin
            .enter()
            .and_then(|_e| self.map_physical(vmm, res.addr + offset, chunks, shareable, len, access));
        let mut st = res.state();
        st.busy.remove(&offset);
        if let Err(e) = mapped {
            drop(st);
            self.drop_mapping(object.handle);
            return Err(e);
        }
        st.mappings.insert(offset, Mapping { len, object: object.handle, whole: shareable });
        Ok(())
    }

    fn unmap(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("unmap")?;
        let vmm = self.vmm("unmap")?;
        let res = self.find_reservation(reservation)?;
        let m = {
            let mut st = res.lock(self, reservation)?;
            let end = self.check_range(offset, len, res.size, "unmap")?;
            match st.mappings.get(&offset) {
                Some(m) if m.len == len => {}
                Some(m) => {
                    return Err(wrong_state(format!(
                        "unmap: the mapping at offset {offset:#x} spans {:#x} bytes, not {len:#x}",
                        m.len
                    )))
                }
                None => {
                    return Err(wrong_state(format!(
                        "unmap: no mapping starts at offset {offset:#x} (range [{offset:#x}, {end:#x}))"
                    )))
                }
            }
            // (A mapping is never busy: a busy range is disjoint from it.)
            st.busy.insert(offset, len);
            st.mappings.remove(&offset).expect("the mapping just found")
        };
        // One cuMemUnmap over the mapping's granules.
        let n = len / self.granularity;
        let (done, r) = match res.pin.enter() {
            Ok(_e) if m.whole => match self.unmap_whole(vmm, res.addr + offset, len) {
                Ok(()) => (n, Ok(())),
                Err(e) => (0, Err(e)),
            },
            Ok(_e) => self.unmap_run(vmm, res.addr + offset, n),
            Err(e) => (0, Err(e)),
        };
        let mut st = res.state();
        st.busy.remove(&offset);
        if done < n {
            // Still (partly) mapped: it stays, for another try.
            st.mappings.insert(offset, m);
            return r;
        }
        drop(st);
        self.drop_mapping(m.object);
        r
    }

    fn retain(&self, object: &ObjectRef) -> PluginResult<()> {
        let _slot = self.slot("retain")?;
        self.check_owner(object, "physical object")?;
        self.physical
            .with(
                object.handle,
                |p| p.is(object),
                |p| {
                    p.host_refs = p.host_refs.checked_add(1).ok_or_else(|| {
                        memplug_sdk::PluginError::invalid_state("retain: the reference count would overflow")
                    })?;
                    Ok(())
                },
            )
            .ok_or_else(|| self.unknown(object, "physical object"))?
    }

    fn release(&self, object: &ObjectRef) -> PluginResult<()> {
        let _slot = self.slot("release")?;
        self.check_owner(object, "physical object")?;
        self.drop_ref(object.handle, |p| p.is(object), |p| p.host_refs -= 1)
            .ok_or_else(|| self.unknown(object, "physical object"))?
    }

    // Sharing (`export.rs`): POSIX-fd shareable handles, typed only (ABI
    // 1.2, kind MEMPLUG_HANDLE_OPAQUE_FD). Not the untyped export of 1.1:
    // its contract is that *any* physical object exports, and CUDA makes an
    // allocation shareable only when asked at cuMemCreate — which a 1.2
    // request says (`export_types`) and a 1.1 request cannot.
    const CAN_EXPORT_HANDLES: bool = true;

    fn export_handle(&self, object: &ObjectRef, handle_type: u32) -> PluginResult<Handle> {
        if handle_type != MEMPLUG_HANDLE_OPAQUE_FD {
            return Err(memplug_sdk::PluginError::unsupported(format!(
                "export_handle: handle kind {handle_type:#x} is not MEMPLUG_HANDLE_OPAQUE_FD, the only kind \
                 this mechanism exports"
            )));
        }
        Ok(Handle::Fd { kind: handle_type, fd: self.export_object(object, "export_handle")? })
    }

    fn import_handle(&self, handle: HandleRef<'_>, request: &Request) -> PluginResult<Block> {
        match handle {
            HandleRef::Fd { kind: MEMPLUG_HANDLE_OPAQUE_FD, fd } => {
                self.import_object(fd, request, "import_handle")
            }
            other => Err(memplug_sdk::PluginError::unsupported(format!(
                "import_handle: {other:?} is not a MEMPLUG_HANDLE_OPAQUE_FD descriptor, the only kind this \
                 mechanism imports"
            ))),
        }
    }
}
