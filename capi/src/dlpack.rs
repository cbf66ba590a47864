//! DLPack export (API 1.3): an allocation, a cached allocation or a region
//! handed to an array library as a `DLManagedTensorVersioned`
//! (`include/dlpack/dlpack.h`, DLPack 1.x), without a copy.
//!
//! Each export consumes its handle: the tensor owns the memory from then
//! on, and its deleter frees it through memplug (after the fences given,
//! through the manager's deferred-free queue), from any thread, at any time
//! — also after `memplug_host_manager_destroy`. A refused export leaves the
//! handle as it was.

use crate::common::{MemplugHostAllocation, MemplugHostFence, MemplugHostRegion};
use crate::error::{boundary, require_non_null, write_out, Error, Result};
use crate::fence::collect_fences;
use crate::handle::Kind;
use crate::manager_tables::{self, pin, RegionEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::MemplugHostCachedAllocation;
use memplug_host_dep::dlpack::{
    self, DLDataType, DLManagedTensorVersioned, ExportError, ExportOptions, SharedRegion, TensorLayout,
};
use memplug_host_dep::{CachedAllocation, OwnedAllocation};
use memplug_sdk::prefix::Prefixed;

/// `MemplugHostTensorSpec::flags`: the consumer must not write the tensor
/// (`DLPACK_FLAG_BITMASK_READ_ONLY`). A region view touching a prefix
/// mapped read-only is read-only without it.
pub const MEMPLUG_HOST_TENSOR_READ_ONLY: u32 = 1;
/// Most dimensions a `MemplugHostTensorSpec` may have.
pub const MEMPLUG_HOST_TENSOR_MAX_DIMS: u32 = 32;
/// Size of `MemplugHostTensorSpec` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_TENSOR_SPEC_SIZE_1_3: u32 = 40;

/// How the exported bytes are seen: shape, element type, strides, offset.
/// The caller's choice; it must stay inside the memory (refused with
/// `MEMPLUG_HOST_STATUS_OUT_OF_RANGE` otherwise).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostTensorSpec {
    /// `sizeof(MemplugHostTensorSpec)`.
    pub struct_size: u32,
    /// Number of dimensions (at most `MEMPLUG_HOST_TENSOR_MAX_DIMS`).
    pub ndim: u32,
    /// `ndim` extents, outermost first, none negative (may be NULL when
    /// `ndim` is 0). Copied: the caller keeps its array.
    pub shape: *const i64,
    /// `ndim` strides in elements, or NULL for row-major. Copied.
    pub strides: *const i64,
    /// Bytes from the memory's first byte to the first element.
    pub byte_offset: u64,
    /// Element type, whole bytes only (`bits * lanes` a multiple of 8).
    pub dtype: DLDataType,
    /// `MEMPLUG_HOST_TENSOR_*` bits.
    pub flags: u32,
}

impl Default for MemplugHostTensorSpec {
    fn default() -> Self {
        MemplugHostTensorSpec {
            struct_size: 0,
            ndim: 0,
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            byte_offset: 0,
            dtype: DLDataType { code: 0, bits: 0, lanes: 0 },
            flags: 0,
        }
    }
}

// SAFETY: `#[repr(C)]`, `Copy`, all-zero valid (NULL pointers, zeros);
// the size below is asserted.
unsafe impl Prefixed for MemplugHostTensorSpec {
    const SIZE_1_0: u32 = MEMPLUG_HOST_TENSOR_SPEC_SIZE_1_3;
}
const _: () =
    assert!(std::mem::size_of::<MemplugHostTensorSpec>() == MEMPLUG_HOST_TENSOR_SPEC_SIZE_1_3 as usize);

impl From<ExportError> for Error {
    #[cold]
    fn from(e: ExportError) -> Self {
        let status = match &e {
            ExportError::NotDlpackDevice { .. } => S::Unsupported,
            ExportError::Lost { .. } => S::DeviceLost,
            ExportError::Layout(_) => S::InvalidArgument,
            ExportError::OutOfBounds { .. } => S::OutOfRange,
            ExportError::NotCopyable { .. } => S::Unsupported,
        };
        Error::new(status, e.to_string())
    }
}

/// The caller's spec and fences, read and checked before any handle is
/// touched.
///
/// # Safety
/// As the exporting functions' contracts.
unsafe fn request(
    spec: *const MemplugHostTensorSpec,
    kind: Kind,
    bits: u64,
    fences: *const MemplugHostFence,
    count: usize,
) -> Result<(TensorLayout, ExportOptions)> {
    require_non_null(spec, "spec")?;
    // SAFETY: non-NULL; the caller's contract covers the size.
    let s = unsafe { crate::struct_size::read_sized(spec, "MemplugHostTensorSpec") }?;
    if s.ndim > MEMPLUG_HOST_TENSOR_MAX_DIMS {
        let max = MEMPLUG_HOST_TENSOR_MAX_DIMS;
        return Err(Error::new(S::InvalidArgument, format!("{} dimensions (at most {max})", s.ndim)));
    }
    if s.flags & !MEMPLUG_HOST_TENSOR_READ_ONLY != 0 {
        return Err(Error::new(S::InvalidArgument, format!("unknown tensor flags {:#x}", s.flags)));
    }
    let n = s.ndim as usize;
    let array = |p: *const i64, what: &str| -> Result<Vec<i64>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        require_non_null(p, what)?;
        // SAFETY: non-NULL; the caller's contract: `ndim` elements.
        Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
    };
    let shape = array(s.shape, "spec->shape")?;
    let strides = if s.strides.is_null() { None } else { Some(array(s.strides, "spec->strides")?) };
    let raw = crate::handle::expect(bits, kind)?;
    // SAFETY: the caller's contract.
    let fences = unsafe { collect_fences(raw.manager, fences, count) }?.into_vec();
    let layout = TensorLayout { shape, dtype: s.dtype, strides, byte_offset: s.byte_offset };
    Ok((layout, ExportOptions { read_only: s.flags & MEMPLUG_HOST_TENSOR_READ_ONLY != 0, fences }))
}

/// Exports an allocation as a DLPack tensor of `spec`'s layout over its
/// memory (device: the mechanism's, as DLPack numbers it), consuming the
/// handle: on success it is stale and `*out` owns the memory. The consumer
/// calls `(*out)->deleter(*out)` once, from any thread, whenever it is done
/// (also after the manager is destroyed): the allocation is then freed,
/// after `fences[0..count]` complete (they must belong to the allocation's
/// manager; the handles stay the caller's).
///
/// Refused, with nothing changed: `MEMPLUG_HOST_STATUS_OUT_OF_RANGE` (the
/// layout reaches past the allocation), `_INVALID_ARGUMENT` (a negative
/// extent, a sub-byte dtype, strides reaching before the start, unknown
/// flags), `_UNSUPPORTED` (a device in the vendor range: no DLPack number),
/// `_DEVICE_LOST` (the allocation went with its device). Thread-safety:
/// any thread.
///
/// # Safety
/// `spec` must be NULL or readable for its `struct_size` bytes, with
/// `shape` (and `strides` unless NULL) readable for `ndim` elements;
/// `fences` NULL or readable for `count` handles; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_allocation_to_dlpack(
    allocation: MemplugHostAllocation,
    spec: *const MemplugHostTensorSpec,
    fences: *const MemplugHostFence,
    count: usize,
    out: *mut *mut DLManagedTensorVersioned,
) -> MemplugHostStatus {
    boundary("memplug_host_allocation_to_dlpack", || {
        require_non_null(out, "out")?;
        // SAFETY: the caller's contract.
        let (layout, options) = unsafe { request(spec, Kind::Allocation, allocation.id, fences, count) }?;
        let (a, _) = pin::<OwnedAllocation>(allocation.id)?;
        dlpack::check(&*a, &layout, &options)?;
        drop(a);
        let a = taken(manager_tables::take_unpinned::<OwnedAllocation>(allocation.id)?)?;
        let t = dlpack::export(a, &layout, options).map_err(|r| Error::from(r.error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, t.into_raw()) };
        Ok(())
    })
}

/// Exports a cached allocation as `memplug_host_allocation_to_dlpack`
/// does an allocation: the handle is consumed, and the deleter gives the
/// block back to its cache (reusable once `fences` complete). The tensor
/// covers the bytes requested, not the whole block. Thread-safety: any
/// thread.
///
/// # Safety
/// As `memplug_host_allocation_to_dlpack`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cached_to_dlpack(
    allocation: MemplugHostCachedAllocation,
    spec: *const MemplugHostTensorSpec,
    fences: *const MemplugHostFence,
    count: usize,
    out: *mut *mut DLManagedTensorVersioned,
) -> MemplugHostStatus {
    boundary("memplug_host_cached_to_dlpack", || {
        require_non_null(out, "out")?;
        // SAFETY: the caller's contract.
        let (layout, options) =
            unsafe { request(spec, Kind::CachedAllocation, allocation.id, fences, count) }?;
        let (a, _) = pin::<CachedAllocation>(allocation.id)?;
        dlpack::check(&*a, &layout, &options)?;
        drop(a);
        let a = taken(manager_tables::take_unpinned::<CachedAllocation>(allocation.id)?)?;
        let t = dlpack::export(a, &layout, options).map_err(|r| Error::from(r.error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, t.into_raw()) };
        Ok(())
    })
}

/// Exports a region's usable bytes (its prefix and committed part, as they
/// are now) as `memplug_host_allocation_to_dlpack` does an allocation: the
/// handle is consumed (the region grows no more), and the deleter frees the
/// region. The tensor is read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`) when
/// `spec` asks, and whenever it touches a prefix mapped read-only.
/// Refused with `MEMPLUG_HOST_STATUS_REENTRANT` from the region's own grow
/// callback. Thread-safety: any thread.
///
/// # Safety
/// As `memplug_host_allocation_to_dlpack`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_to_dlpack(
    region: MemplugHostRegion,
    spec: *const MemplugHostTensorSpec,
    fences: *const MemplugHostFence,
    count: usize,
    out: *mut *mut DLManagedTensorVersioned,
) -> MemplugHostStatus {
    boundary("memplug_host_region_to_dlpack", || {
        require_non_null(out, "out")?;
        // SAFETY: the caller's contract.
        let (layout, options) = unsafe { request(spec, Kind::Region, region.id, fences, count) }?;
        let (e, _) = pin::<RegionEntry>(region.id)?;
        {
            let l = crate::callbacks::lock_region(&e)?;
            dlpack::check_region(&l.guard, &layout, &options)?;
        }
        drop(e);
        let entry = taken(manager_tables::take_unpinned::<RegionEntry>(region.id)?)?;
        let shared = SharedRegion::new(entry.region.into_inner().unwrap_or_else(|p| p.into_inner()));
        let t = shared.to_dlpack(&layout, options)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, t.into_raw()) };
        Ok(())
    })
}

/// The value a take found, or the refusal of a handle freed by another
/// thread between the check and the take.
fn taken<T>(v: Option<T>) -> Result<T> {
    v.ok_or_else(|| Error::new(S::StaleHandle, "the handle was freed by another thread during the export"))
}
