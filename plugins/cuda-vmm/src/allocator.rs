//! The allocator capability: plain `cuMemAlloc`/`cuMemFree` in the device's
//! primary context (on a pinned mechanism `cuMemHostAlloc`/`cuMemFreeHost`,
//! see `pinned.rs`). Alignments above the 256 bytes the driver's allocation
//! routines guarantee (up to 2 MiB) are met by over-allocating and keeping
//! the base.

use crate::context::Pin;
use crate::driver::CUdeviceptr;
use crate::mechanism::{CudaMechanism, MechanismKind, MAX_ALIGNMENT, MIN_ALIGNMENT};
use memplug_sdk::{Allocator, Block, MemoryInfo, ObjectRef, PluginError, PluginResult, Properties, Request};

/// One live allocation.
pub struct Allocation {
    object_id: u64,
    addr: u64,
    size: u64,
    /// What `cuMemAlloc` (or `cuMemHostAlloc`) returned (below `addr` when
    /// over-aligned), and how many bytes.
    base: CUdeviceptr,
    bytes: u64,
    /// Declared last: the context is released after the rest is gone.
    pin: Pin,
}

impl Allocation {
    fn is(&self, obj: &ObjectRef) -> bool {
        self.object_id == obj.object_id && self.addr == obj.addr && self.size == obj.size
    }

    /// `(addr, size)` when the allocation shares a byte with `[start, end)`.
    pub(crate) fn meeting(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        (self.addr < end && start < self.addr + self.size).then_some((self.addr, self.size))
    }
}

impl Allocator for CudaMechanism {
    const HAS_MEMORY_INFO: bool = true;

    fn properties(&self) -> Properties {
        if self.kind == MechanismKind::PinnedHost {
            return crate::pinned::PROPERTIES;
        }
        Properties {
            min_alignment: MIN_ALIGNMENT,
            max_alignment: MAX_ALIGNMENT.max(self.granularity),
            granularity: self.granularity,
        }
    }

    /// What the mechanism's memory is (ABI 1.2): device-local, at the
    /// device; with VMM, pages of the granularity, the driver's recommended
    /// granularity, and read-only views enforced by the GPU's MMU (where the
    /// driver grants them: otherwise a read-only map is `UNSUPPORTED`).
    /// Physical objects do not map at arbitrary offsets: an exportable one
    /// is one driver handle, which CUDA maps only from its start. Not
    /// zero-filled: `cuMemAlloc` memory is not cleared (commits and
    /// physical objects are, unless the request says
    /// `MEMPLUG_HINT_UNINITIALIZED_OK`, but an attribute is a promise about
    /// every object).
    fn descriptor(&self) -> memplug_sdk::Descriptor {
        if self.kind == MechanismKind::PinnedHost {
            return crate::pinned::DESCRIPTOR;
        }
        let facts = &self.driver.devices[self.device.ordinal as usize].facts;
        let g = self.granularity;
        let vmm = g != 0;
        memplug_sdk::Descriptor {
            recommended_granularity: facts
                .recommended_granularity
                .filter(|&r| vmm && r >= g && r % g == 0)
                .unwrap_or(0),
            page_sizes: if vmm { memplug_sdk::Descriptor::page_size_bit(g) } else { 0 },
            attributes: memplug_sdk::abi::MEMPLUG_ATTR_DEVICE_LOCAL
                | if vmm { memplug_sdk::abi::MEMPLUG_ATTR_READ_ONLY_ENFORCED } else { 0 }
                // Claimed only where both plain and VMM memory are (see
                // DeviceFacts::rdma_with_vmm).
                | if vmm && facts.rdma_with_vmm { memplug_sdk::abi::MEMPLUG_ATTR_RDMA } else { 0 },
            export_types: self.export_kinds(),
            location: memplug_sdk::Location::DEVICE,
            maps_at_offsets: false,
        }
    }

    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let _slot = self.slot("allocate")?;
        self.check_request(r, "allocate")?;
        let max = self.properties().max_alignment;
        if !r.alignment.is_power_of_two() || r.alignment > max {
            return Err(PluginError::invalid_argument(format!(
                "allocate: alignment {} must be a power of two from 1 to {max}",
                r.alignment
            )));
        }
        let pad = r.alignment.saturating_sub(MIN_ALIGNMENT);
        let bytes = r.size.checked_add(pad).and_then(|b| usize::try_from(b).ok()).ok_or_else(|| {
            PluginError::out_of_memory(format!("allocate: {} bytes cannot be allocated", r.size))
        })?;
        let pin = self.ctx.pin()?;
        let base = {
            let _e = pin.enter()?;
            match self.driver_alloc(bytes) {
                // Frees handed to the freer (`freer.rs`) may be what is
                // missing: wait for them (bounded), then try once more.
                Err(e) if e.status == memplug_sdk::Status::OutOfMemory => {
                    if !pin.freer().flush(crate::freer::FLUSH_LIMIT) {
                        return Err(e);
                    }
                    self.driver_alloc(bytes)?
                }
                r => r?,
            }
        };
        let addr = base.next_multiple_of(r.alignment.max(MIN_ALIGNMENT));
        if addr - base > pad {
            // The driver broke its 256-byte promise: the block cannot hold
            // the size at the alignment. It goes back through the freer.
            pin.freer().free(pin.ctx(), base, bytes as u64, self.host_alloc.is_some());
            return Err(misaligned(base));
        }
        let handle = self.allocations.insert(Allocation {
            object_id: r.object_id,
            addr,
            size: r.size,
            base,
            bytes: bytes as u64,
            pin,
        });
        Ok(Block { addr, size: r.size, handle })
    }

    fn deallocate(&self, obj: &ObjectRef) -> PluginResult<()> {
        let _slot = self.slot("deallocate")?;
        self.check_owner(obj, "allocation")?;
        // Out of the table at once (the SDK checked the reference's
        // mechanism and device): no second deallocate, no copy, finds it.
        let gone = self
            .allocations
            .remove(obj.handle, |a| a.is(obj))
            .ok_or_else(|| self.unknown(obj, "allocation"))?;
        // The driver's free synchronises the device: the context's freer
        // makes it, off this thread (`freer.rs`). A block this mechanism
        // allocated and nobody else frees (it left the table above).
        gone.pin.freer().free(gone.pin.ctx(), gone.base, gone.bytes, self.host_alloc.is_some());
        Ok(())
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        let _slot = self.slot("memory_info")?;
        if self.kind == MechanismKind::PinnedHost {
            return crate::pinned::host_memory_info();
        }
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let _e = pin.enter()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: resolved entry point, out-pointers to locals, the device's
        // context current.
        d.check(unsafe { (d.api.mem_get_info)(&mut free, &mut total) }, "cuMemGetInfo")?;
        // Bytes of frees handed to the freer and not started are free: an
        // allocation that needs them waits for them (see `allocate`). Read
        // after the driver's figure, so none is counted twice.
        let free = (free as u64).saturating_add(pin.freer().queued_device_bytes()).min(total as u64);
        Ok(MemoryInfo { free_bytes: free, total_bytes: total as u64 })
    }
}

impl CudaMechanism {
    /// `bytes` of this mechanism's memory from the driver: `cuMemAlloc`, or
    /// `cuMemHostAlloc` on a pinned mechanism. The context must be current.
    fn driver_alloc(&self, bytes: usize) -> PluginResult<CUdeviceptr> {
        // Never breaks another thread's graph capture (`capture.rs`).
        let _relaxed = crate::capture::Relaxed::new(self.driver);
        if let Some(api) = self.host_alloc {
            return crate::pinned::alloc(self.driver, api, bytes);
        }
        let d = self.driver;
        let mut base: CUdeviceptr = 0;
        // SAFETY: resolved entry point, out-pointer to a local, the device's
        // context current.
        d.check(unsafe { (d.api.mem_alloc)(&mut base, bytes) }, "cuMemAlloc")?;
        Ok(base)
    }
}

/// The failure of a block the driver returned less aligned than the 256
/// bytes its allocation routines promise (given back).
#[cold]
fn misaligned(base: CUdeviceptr) -> PluginError {
    PluginError::internal(format!(
        "allocate: the driver returned {base:#x}, not aligned to the {MIN_ALIGNMENT} bytes its allocation \
         routines promise, so the block cannot hold the size at the alignment asked for; it was given back"
    ))
}
