//! Sharing physical objects across processes: CUDA's POSIX-fd shareable
//! handles, published as `MEMPLUG_HANDLE_OPAQUE_FD` (ABI 1.2 typed export).
//! Not as ABI 1.1's untyped descriptors: 1.1's export promises that any
//! physical object exports, and CUDA makes an allocation shareable only
//! when asked at `cuMemCreate`, which only a 1.2 request can say.
//!
//! CUDA decides at creation whether an allocation can be exported
//! (`requestedHandleTypes` in its `CUmemAllocationProp`), exports a handle
//! as one descriptor, and maps a handle only from its offset 0. So:
//!
//! * a `create` whose `export_types` asks for `MEMPLUG_HANDLE_OPAQUE_FD` makes
//!   the object ONE `cuMemCreate` handle of the whole (granule-rounded) size
//!   with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` requested — a
//!   *shareable* object; other objects stay one chunk per granule;
//! * a shareable object maps only whole, from object offset 0 (any other
//!   `map` is `INVALID_ARGUMENT`, nothing changed), and unmaps with one
//!   `cuMemUnmap`; so the mechanism cannot claim
//!   `MEMPLUG_PROP_MAPS_AT_OFFSETS`;
//! * export = `cuMemExportToShareableHandle` (a new descriptor the caller
//!   owns); an object not created shareable is `UNSUPPORTED`;
//! * import = `cuMemImportFromShareableHandle` of the caller's descriptor
//!   (which stays the caller's), checked to live on this device
//!   (`cuMemGetAllocationPropertiesFromHandle`) and to hold the size asked
//!   (a trial `cuMemMap` of that size, which the driver refuses past the
//!   allocation's end); the new object is shareable (maps whole, exports
//!   again) and is not zero-filled: it shows the exporter's bytes.
//!
//! Export is offered only where the device says
//! `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` and the
//! driver has the three entry points ([`CudaMechanism::export_kinds`]).
//!
//! **Fabric handles are not implemented.** Where a device reports
//! `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`, CUDA can export a
//! `CU_MEM_HANDLE_TYPE_FABRIC` handle (a 64-byte `CUmemFabricHandle`, valid
//! across nodes of an NVLink fabric through IMEX channels); the ABI's
//! `MEMPLUG_HANDLE_VENDOR_BLOB` could carry it, but this plugin neither
//! requests nor offers it.

use crate::driver::{
    allocation_prop, CUmemAllocationProp, CUmemGenericAllocationHandle, Share, Vmm, ATTR_POSIX_FD_SUPPORTED,
    CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, HANDLE_TYPE_POSIX_FD,
};
use crate::mechanism::CudaMechanism;
use crate::shared::Physical;
use cudarc::driver::sys as cu;
use memplug_sdk::abi::MEMPLUG_HANDLE_OPAQUE_FD;
use memplug_sdk::{Access, Block, ObjectRef, PluginError, PluginResult, Request};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

impl CudaMechanism {
    /// The `MEMPLUG_HANDLE_*` kinds this mechanism's physical objects can
    /// be exported as: `MEMPLUG_HANDLE_OPAQUE_FD` where the device supports
    /// VMM and POSIX-fd shareable handles
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`)
    /// and the driver has the shareable-handle entry points; 0 otherwise.
    pub(crate) fn export_kinds(&self) -> u32 {
        if self.vmm.is_none() || self.driver.share.is_none() {
            return 0;
        }
        let mut supported: c_int = 0;
        // SAFETY: resolved entry point, out-pointer to a local; needs no
        // context.
        let r = unsafe {
            (self.driver.api.device_get_attribute)(&mut supported, ATTR_POSIX_FD_SUPPORTED, self.cu_device())
        };
        if r == CUDA_SUCCESS && supported != 0 {
            MEMPLUG_HANDLE_OPAQUE_FD
        } else {
            0
        }
    }

    fn cu_device(&self) -> crate::driver::CUdevice {
        self.driver.devices[self.device.ordinal as usize].device
    }

    /// The shareable-handle entry points, or `UNSUPPORTED` naming `call`.
    fn share(&self, call: &str) -> PluginResult<Share> {
        self.driver.share.ok_or_else(|| {
            PluginError::unsupported(format!(
                "{call}: the CUDA driver lacks the shareable-handle entry points \
                 (cuMemExportToShareableHandle, cuMemImportFromShareableHandle, \
                 cuMemGetAllocationPropertiesFromHandle)"
            ))
        })
    }

    /// Refuses `call` where the device cannot share POSIX-fd handles.
    fn check_exportable_device(&self, call: &str) -> PluginResult<()> {
        if self.export_kinds() & MEMPLUG_HANDLE_OPAQUE_FD == 0 {
            return Err(PluginError::unsupported(format!(
                "{call}: CUDA device {} does not support POSIX file descriptor shareable handles \
                 (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0, or the driver lacks \
                 the entry points): mechanism \"{}\" offers no export kinds",
                self.device.ordinal, self.name
            )));
        }
        Ok(())
    }

    /// Whether `create` must make a shareable object for `request`;
    /// `UNSUPPORTED` for kinds this mechanism does not offer (the SDK
    /// refuses them first; this guards a caller that bypasses it).
    pub(crate) fn wants_shareable(&self, request: &Request) -> PluginResult<bool> {
        if request.export_types == 0 {
            return Ok(false);
        }
        let offered = self.export_kinds();
        let unoffered = request.export_types & !offered;
        if unoffered != 0 {
            return Err(PluginError::unsupported(format!(
                "create: export kinds {unoffered:#x} are not ones mechanism \"{}\" offers (export_types \
                 {offered:#x})",
                self.name
            )));
        }
        Ok(true)
    }

    /// One `cuMemCreate` handle of `size` bytes that can be exported as a
    /// POSIX file descriptor. The caller has the device's context current.
    pub(crate) fn create_shareable(&self, vmm: Vmm, size: u64) -> PluginResult<CUmemGenericAllocationHandle> {
        let mut prop = self.create_prop();
        prop.requestedHandleTypes = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: resolved entry point; `prop` and `h` live for the call.
        let r = unsafe { (vmm.create)(&mut h, size as usize, &prop, 0) };
        self.driver.check(r, "cuMemCreate (shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)")?;
        Ok(h)
    }

    /// Maps all `len` bytes of the shareable handle `h` at `addr` (from
    /// its offset 0) and gives the device `access`; on failure nothing
    /// stays mapped.
    pub(crate) fn map_whole(
        &self,
        vmm: Vmm,
        addr: u64,
        h: CUmemGenericAllocationHandle,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        // SAFETY: the range lies in a reservation of this mechanism and is
        // neither committed nor mapped (the callers' checks).
        let r = unsafe { (vmm.map)(addr, len as usize, 0, h, 0) };
        self.driver.check(r, "cuMemMap")?;
        if let Err(e) = self.grant_access(vmm, addr, len, access) {
            let _ = self.unmap_whole(vmm, addr, len);
            return Err(e);
        }
        Ok(())
    }

    /// Unmaps one whole mapping of a shareable handle: a single
    /// `cuMemUnmap` (the driver cannot unmap part of a mapping).
    pub(crate) fn unmap_whole(&self, vmm: Vmm, addr: u64, len: u64) -> PluginResult<()> {
        // SAFETY: one mapping made by this mechanism, exactly.
        self.driver.check(unsafe { (vmm.unmap)(addr, len as usize) }, "cuMemUnmap")
    }

    /// `export_handle`: a new POSIX descriptor for a
    /// shareable object's memory, owned by the caller.
    pub(crate) fn export_object(&self, object: &ObjectRef, call: &str) -> PluginResult<OwnedFd> {
        let _slot = self.slot(call)?;
        self.check_owner(object, "physical object")?;
        let share = self.share(call)?;
        // A reference for the call (counted as a mapping's): the handle
        // stays valid in the driver with no lock held, even if the host
        // releases the object meanwhile.
        let h = self
            .physical
            .with(
                object.handle,
                |p| p.is(object),
                |p| {
                    if !p.shareable {
                        return Err(PluginError::unsupported(format!(
                            "{call}: the physical object (handle {}) was not created with export_types \
                             MEMPLUG_HANDLE_OPAQUE_FD ({MEMPLUG_HANDLE_OPAQUE_FD:#x}): CUDA exports only \
                             allocations made shareable when they are created",
                            object.handle
                        )));
                    }
                    p.mappings += 1;
                    Ok(p.handles[0])
                },
            )
            .ok_or_else(|| self.unknown(object, "physical object"))??;
        let exported = self.ctx.pin().and_then(|pin| {
            let _e = pin.enter()?;
            let mut fd: c_int = -1;
            // SAFETY: resolved entry point; for POSIX fds the driver writes
            // an `int` through the pointer. `h` is kept by the reference
            // taken above.
            let r = unsafe {
                (share.export)(std::ptr::addr_of_mut!(fd).cast::<c_void>(), h, HANDLE_TYPE_POSIX_FD, 0)
            };
            self.driver.check(r, "cuMemExportToShareableHandle")?;
            if fd < 0 {
                return Err(PluginError::internal(format!(
                    "{call}: cuMemExportToShareableHandle succeeded but gave fd {fd}"
                )));
            }
            // SAFETY: a new descriptor the driver made for this call.
            let theirs = unsafe { OwnedFd::from_raw_fd(fd) };
            // The driver's descriptor may be 0, 1 or 2 (a process that
            // closed its standard streams) and is not promised to be
            // close-on-exec: the caller gets a copy that is both at least 3
            // and close-on-exec, so no child process inherits the memory
            // and no stream write lands in it; the driver's goes.
            // SAFETY: `fcntl` on a descriptor this call owns.
            let ours = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
            if ours < 0 {
                return Err(PluginError::internal(format!(
                    "{call}: the exported descriptor could not be copied close-on-exec: {}",
                    std::io::Error::last_os_error()
                )));
            }
            // SAFETY: the new descriptor `fcntl` just made.
            Ok(unsafe { OwnedFd::from_raw_fd(ours) })
        });
        self.drop_mapping(object.handle);
        exported
    }

    /// `import_handle`: a new shareable physical object
    /// showing the memory behind `fd` (the caller keeps `fd`).
    pub(crate) fn import_object(
        &self,
        fd: BorrowedFd<'_>,
        request: &Request,
        call: &str,
    ) -> PluginResult<Block> {
        let _slot = self.slot(call)?;
        let vmm = self.vmm(call)?;
        self.check_request(request, call)?;
        self.check_exportable_device(call)?;
        let share = self.share(call)?;
        let size = self.round_up(request.size, call)?;
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let h = {
            let _e = pin.enter()?;
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: resolved entry point; for POSIX fds the OS handle is
            // the descriptor's number in the pointer; the driver does not
            // take the descriptor (the caller closes it).
            let r = unsafe {
                (share.import)(&mut h, fd.as_raw_fd() as isize as *mut c_void, HANDLE_TYPE_POSIX_FD)
            };
            if r == CUDA_ERROR_INVALID_VALUE {
                return Err(PluginError::invalid_argument(format!(
                    "{call}: fd {} is not a CUDA shareable handle (cuMemImportFromShareableHandle failed: {} \
                     ({r})); nothing was imported",
                    fd.as_raw_fd(),
                    d.error_name(r)
                )));
            }
            d.check(r, "cuMemImportFromShareableHandle")?;
            if let Err(e) = self.check_imported(vmm, share, h, size, call) {
                // SAFETY: the handle just imported, held by nothing else.
                unsafe { (vmm.release)(h) };
                return Err(e);
            }
            h
        };
        let handle = self.physical.insert(Physical::new(request.object_id, size, vec![h], true, pin));
        Ok(Block { addr: 0, size, handle })
    }

    /// An imported handle is memory of this device and holds `size` bytes.
    fn check_imported(
        &self,
        vmm: Vmm,
        share: Share,
        h: CUmemGenericAllocationHandle,
        size: u64,
        call: &str,
    ) -> PluginResult<()> {
        let d = self.driver;
        let mut prop: CUmemAllocationProp = allocation_prop(self.cu_device());
        // SAFETY: resolved entry point; `prop` is written for the call.
        d.check(
            unsafe { (share.properties_from_handle)(&mut prop, h) },
            "cuMemGetAllocationPropertiesFromHandle",
        )?;
        if prop.location.type_ != cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
            || prop.location.id != self.cu_device()
        {
            return Err(PluginError::invalid_argument(format!(
                "{call}: the imported allocation is not memory of CUDA device {} (location type {:?}, id {}); \
                 nothing was imported",
                self.device.ordinal, prop.location.type_, prop.location.id
            )));
        }
        // The size: the driver has no query for it, but refuses a map past
        // the end of the allocation. A trial map of `size` bytes, undone.
        let mut va = 0;
        // SAFETY: resolved entry point, out-pointer to a local.
        let r = unsafe { (vmm.address_reserve)(&mut va, size as usize, self.granularity as usize, 0, 0) };
        d.check(r, "cuMemAddressReserve")?;
        // SAFETY: the temporary range, fresh and unmapped; `h` is live.
        let r = unsafe { (vmm.map)(va, size as usize, 0, h, 0) };
        let fits = match r {
            CUDA_SUCCESS => self.unmap_whole(vmm, va, size),
            CUDA_ERROR_INVALID_VALUE => Err(PluginError::out_of_range(format!(
                "{call}: {size:#x} bytes were asked, more than the imported allocation holds (the driver \
                 refuses to map that much of it); nothing was imported"
            ))),
            r => Err(d.error(r, "cuMemMap")),
        };
        // SAFETY: the temporary range, unmapped.
        let freed = d.check(unsafe { (vmm.address_free)(va, size as usize) }, "cuMemAddressFree");
        fits.and(freed)
    }
}
