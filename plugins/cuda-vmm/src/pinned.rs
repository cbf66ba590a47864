//! Page-locked host memory: the second mechanism of each CUDA device,
//! `cuda<N>-host` (device `MEMPLUG_DEVICE_CUDA_HOST` N), the memory DMA
//! copies between host and device want (offload targets, staging).
//!
//! * **Memory**: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`
//!   (pinned for every context) and `CU_MEMHOSTALLOC_DEVICEMAP` (mapped
//!   for the device; under unified addressing at the host address), made
//!   in the device's primary context, the one the device mechanism keeps
//!   retained; freed with `cuMemFreeHost`. The host reads and writes it
//!   directly. Not zero-filled (the driver promises nothing of its bytes).
//! * **Alignment**: the driver's documentation of `cuMemHostAlloc` states
//!   none; the CUDA programming guide says every address the driver's and
//!   runtime's allocation routines return is aligned to at least 256 bytes,
//!   so [`MIN_ALIGNMENT`] is promised, and each block is checked against it
//!   (a block that is not is given back and the allocation fails with
//!   `INTERNAL`, never a misaligned block). Larger alignments up to
//!   [`MAX_ALIGNMENT`] are honoured by over-allocating, as on the device
//!   mechanism; the SDK refuses larger ones with `INVALID_ARGUMENT`.
//! * **`memory_info`**: the machine's memory, from `/proc/meminfo`: total
//!   `MemTotal`, free `MemAvailable` (what can be had without swapping;
//!   `MemFree` on kernels before 3.14, which lack it). No driver call.
//! * **Sync**: the device mechanism's streams, fences and copy (`streams.rs`,
//!   `copy.rs`) on streams of the same primary context, with the same copy
//!   kinds (`MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST`): here "device" is
//!   this mechanism's own blocks and the device mechanism's memory, so a
//!   host can copy device ↔ pinned on either mechanism's streams.
//! * **Properties**: location host, attributes `PINNED | HOST_VISIBLE |
//!   HOST_COHERENT`, granularity 0 (no virtual backing, no shared mapping).
//!
//! **Absent, not failing**: a driver without `cuMemHostAlloc` or
//! `cuMemFreeHost` loads as before, with device mechanisms only.
//!
//! **Loss**: one primary context, one loss: a dead context is
//! `DEVICE_LOST` for both mechanisms of the device, and both are reported
//! (see `context.rs`). Live blocks count in the plugin's `live_objects` as
//! the device mechanism's allocations do.

use crate::driver::{CUdeviceptr, Driver, HostAlloc, MEMHOSTALLOC_DEVICEMAP, MEMHOSTALLOC_PORTABLE};
use crate::mechanism::{MAX_ALIGNMENT, MIN_ALIGNMENT};
use memplug_sdk::abi::{MEMPLUG_ATTR_HOST_COHERENT, MEMPLUG_ATTR_HOST_VISIBLE, MEMPLUG_ATTR_PINNED};
use memplug_sdk::{Descriptor, Location, MemoryInfo, PluginError, PluginResult, Properties};
use std::ffi::c_void;

/// The flags of every `cuMemHostAlloc` the plugin makes.
pub const HOST_ALLOC_FLAGS: std::ffi::c_uint = MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP;

/// A pinned mechanism's properties (see the module docs).
pub(crate) const PROPERTIES: Properties =
    Properties { min_alignment: MIN_ALIGNMENT, max_alignment: MAX_ALIGNMENT, granularity: 0 };

/// A pinned mechanism's memory descriptor (see the module docs).
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    recommended_granularity: 0,
    page_sizes: 0,
    attributes: MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT,
    export_types: 0,
    location: Location::HOST,
    maps_at_offsets: false,
};

/// `cuMemHostAlloc` of `bytes` (non-zero). The device's context must be
/// current.
pub(crate) fn alloc(d: &Driver, api: HostAlloc, bytes: usize) -> PluginResult<CUdeviceptr> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: resolved entry point, out-pointer to a local, the context
    // current.
    d.check(unsafe { (api.alloc)(&mut p, bytes, HOST_ALLOC_FLAGS) }, "cuMemHostAlloc")?;
    Ok(p as CUdeviceptr)
}

/// `cuMemFreeHost` of a block [`alloc`] returned.
pub(crate) fn free(d: &Driver, api: HostAlloc, base: CUdeviceptr) -> PluginResult<()> {
    // SAFETY: a block `alloc` returned, freed once (the caller's guarantee).
    d.check(unsafe { (api.free)(base as *mut c_void) }, "cuMemFreeHost")
}

/// Free and total host memory, from `/proc/meminfo`.
pub(crate) fn host_memory_info() -> PluginResult<MemoryInfo> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
        PluginError::internal(format!(
            "memory_info: /proc/meminfo cannot be read ({e}): host memory is unknown"
        ))
    })?;
    parse_meminfo(&text).ok_or_else(|| {
        PluginError::internal("memory_info: /proc/meminfo has no MemTotal or no MemAvailable/MemFree")
    })
}

/// `MemTotal` and `MemAvailable` (else `MemFree`) of `/proc/meminfo`'s
/// text, in bytes; `None` without them, or with a total of zero.
fn parse_meminfo(text: &str) -> Option<MemoryInfo> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    let total = field("MemTotal").filter(|&t| t > 0)?;
    let free = field("MemAvailable").or_else(|| field("MemFree"))?;
    Some(MemoryInfo { free_bytes: free.min(total), total_bytes: total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_total_and_available_in_bytes() {
        let text =
            "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    8192 kB\nBuffers: 1 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(MemoryInfo { free_bytes: 8192 << 10, total_bytes: 16384 << 10 })
        );
        // A kernel before MemAvailable: MemFree.
        let old = "MemTotal: 16384 kB\nMemFree: 1024 kB\n";
        assert_eq!(parse_meminfo(old), Some(MemoryInfo { free_bytes: 1024 << 10, total_bytes: 16384 << 10 }));
        // MemTotalX is not MemTotal; nothing usable is None.
        assert_eq!(parse_meminfo("MemTotalX: 5 kB\nMemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: 0 kB\nMemFree: 0 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn this_machines_meminfo_parses() {
        let info = host_memory_info().unwrap();
        assert!(info.total_bytes > 0 && info.free_bytes <= info.total_bytes, "{info:?}");
    }
}
