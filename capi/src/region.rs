//! Virtual regions (reserve, grow, shrink, free) and shared prefixes.

use crate::callbacks::{lock_region, CallbackScope, UserData};
use crate::common::{
    MemplugHostBinding, MemplugHostFence, MemplugHostPrefix, MemplugHostRegion, MemplugHostStream,
};
use crate::error::{boundary, require_non_null, write_out, Error};
use crate::fence::collect_fences;
use crate::handle::Kind;
use crate::manager_tables::{self, pin, same_manager, FenceEntry, RegionEntry, StreamEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::write_sized;
use memplug_host_dep::{GrowError, MemoryBinding, SharedPrefix};
use std::ffi::c_void;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Reserves `max_bytes` of address space through the binding's mechanism
/// (it needs the virtual backing capability: `MEMPLUG_HOST_STATUS_UNSUPPORTED`
/// otherwise). The base address never moves; nothing is committed or
/// charged until the region grows.
///
/// Ownership: the caller owns the region (`memplug_host_region_free` or
/// `_free_after`). Thread-safety: any thread; calls on one region are
/// serialised.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_reserve(
    binding: MemplugHostBinding,
    max_bytes: u64,
    out: *mut MemplugHostRegion,
) -> MemplugHostStatus {
    boundary("memplug_host_region_reserve", || {
        require_non_null(out, "out")?;
        let (b, seat) = pin::<MemoryBinding>(binding.id)?;
        let region = b.reserve_virtual(max_bytes)?;
        drop(b);
        let entry = RegionEntry { region: Mutex::new(region), owner: AtomicU64::new(0) };
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, entry, [0, 0], out, |id| MemplugHostRegion { id }) }
    })
}

/// Reads a region's figures. Set `out->struct_size` first.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_info(
    region: MemplugHostRegion,
    out: *mut MemplugHostRegionInfo,
) -> MemplugHostStatus {
    boundary("memplug_host_region_info", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let l = lock_region(&e)?;
        let r = &*l.guard;
        let info = MemplugHostRegionInfo {
            struct_size: MEMPLUG_HOST_REGION_INFO_SIZE_1_0,
            reserved0: 0,
            addr: r.addr(),
            capacity: r.capacity(),
            len: r.len(),
            committed: r.committed(),
            prefix_len: r.len() - r.committed(),
        };
        drop(l);
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, info, "MemplugHostRegionInfo") }
    })
}

/// Grows the region's usable length to at least `len` bytes (rounded up to
/// the granularity) as a transaction: grant budget → commit the new range →
/// `update(userdata, addr, new_len)` (may be NULL) → charge. If the budget,
/// the commit or the update fails, the range is decommitted, the grant
/// returned and the region is as before (`MEMPLUG_HOST_STATUS_CALLBACK_REFUSED`
/// when `update` returned false). A `len` at or below the current length
/// is a no-op; beyond the reservation is `_INVALID_ARGUMENT`.
///
/// Pressure callbacks and `update` run on this thread while the region is
/// locked: from them, calls on this same region are refused with
/// `MEMPLUG_HOST_STATUS_REENTRANT` (other regions are fine).
/// Thread-safety: any thread.
///
/// # Safety
/// `update` (when not NULL) must be callable as `MemplugHostGrowFn`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_grow(
    region: MemplugHostRegion,
    len: u64,
    update: MemplugHostGrowFn,
    userdata: *mut c_void,
) -> MemplugHostStatus {
    boundary("memplug_host_region_grow", || {
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let mut l = lock_region(&e)?;
        let ud = UserData(userdata);
        let r = l.guard.grow_to(len, |view| match update {
            None => Ok(()),
            Some(f) => {
                let _scope = CallbackScope::enter();
                // SAFETY: the caller's function and userdata, called once.
                if unsafe { f(ud.0, view.addr, view.len) } {
                    Ok(())
                } else {
                    Err(())
                }
            }
        });
        match r {
            Ok(()) => Ok(()),
            Err(GrowError::Binding(b)) => Err(b.into()),
            Err(GrowError::Update(())) => Err(Error::new(
                S::CallbackRefused,
                "the update callback refused the grown view; the region is unchanged",
            )),
        }
    })
}

/// Grows the region's usable length to at least `len` bytes (rounded up to
/// the granularity) as a queue operation on `stream` (C API 1.1; the
/// plugin's `commit_on`, plugin ABI 1.2 `MEMPLUG_CAP_QUEUED_BINDING`): the
/// commit runs after the work already submitted to `stream`, and
/// `out_fence` receives a fence that completes once the new range is
/// usable — wait for it (`memplug_host_fence_wait`), or order other work
/// behind it (`memplug_host_stream_wait_fence`). Until then the range must
/// not be touched. The region's free and later shrinks wait for the fence
/// on their own.
///
/// The new bytes are charged to the binding's pool before the commit is
/// enqueued and refunded if the plugin refuses it; the region's info
/// (`len`, `committed`) counts them at once. There is no update callback
/// (the view is not usable when this returns). A `len` at or below the
/// current length commits nothing: the fence is then one recorded on
/// `stream` (as `memplug_host_fence_record`).
///
/// Refusals, each leaving the region and the pool's figures as they were:
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` when the mechanism has no
/// `MEMPLUG_CAP_QUEUED_BINDING` (with a message saying so);
/// `_INVALID_ARGUMENT` beyond the reservation; `_BUSY` for a range whose
/// deferred decommit (an earlier shrink) has not run; `_OUT_OF_BUDGET`;
/// `_WRONG_MANAGER` for a stream of another manager; a stream of another
/// mechanism is refused with the host's code (`_WRONG_MECHANISM`).
///
/// Ownership: the caller owns the fence handle
/// (`memplug_host_fence_release`); written only on success. The stream
/// stays the caller's. Thread-safety: any thread; calls on one region are
/// serialised.
///
/// # Safety
/// `out_fence` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_grow_on(
    region: MemplugHostRegion,
    len: u64,
    stream: MemplugHostStream,
    out_fence: *mut MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_region_grow_on", || {
        require_non_null(out_fence, "out_fence")?;
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        crate::handle::expect(stream.id, Kind::Stream)?;
        same_manager(seat, stream.id, Kind::Stream)?;
        let (st, _) = pin::<StreamEntry>(stream.id)?;
        // The fence's table slot first: once the commit is enqueued,
        // nothing may fail.
        let vacant = manager_tables::vacant::<FenceEntry>(seat)?;
        let mut l = lock_region(&e)?;
        let guard = st.stream.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
        let f = l.guard.grow_on(len, s)?;
        drop(guard);
        drop(l);
        let entry = FenceEntry { fence: f.clone(), recorded: Some(f) };
        let id = manager_tables::fill(seat, vacant, entry, [0, 0]);
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_fence, MemplugHostFence { id }) };
        Ok(())
    })
}

/// Shrinks the private part to `len` usable bytes (rounded up to the
/// granularity). The tail is decommitted and refunded once every fence in
/// `fences[0..count]` has completed (now, when `count` is 0); until then
/// that range cannot be grown into again (`MEMPLUG_HOST_STATUS_BUSY`). A
/// `len` at or above the current length is a no-op. The fence handles stay
/// the caller's. Thread-safety: any thread.
///
/// # Safety
/// `fences` must be NULL or readable for `count` handles.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_shrink(
    region: MemplugHostRegion,
    len: u64,
    fences: *const MemplugHostFence,
    count: usize,
) -> MemplugHostStatus {
    boundary("memplug_host_region_shrink", || {
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        // SAFETY: the caller's contract.
        let fences = unsafe { collect_fences(seat, fences, count) }?.into_vec();
        let mut l = lock_region(&e)?;
        l.guard.shrink_to(len, fences)?;
        Ok(())
    })
}

/// Maps a shared prefix read-only at the start of an empty region (no
/// committed bytes, no prefix yet: `MEMPLUG_HOST_STATUS_INVALID_STATE`
/// otherwise); the private part then begins after it. Charges nothing: the
/// prefix was charged once, at creation. A prefix larger than the region is
/// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`; one of another mechanism
/// `MEMPLUG_HOST_STATUS_WRONG_MECHANISM`, of another manager
/// `MEMPLUG_HOST_STATUS_WRONG_MANAGER`. The region keeps the prefix alive.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_region_map_prefix(
    region: MemplugHostRegion,
    prefix: MemplugHostPrefix,
) -> MemplugHostStatus {
    boundary("memplug_host_region_map_prefix", || {
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        crate::handle::expect(prefix.id, Kind::Prefix)?;
        same_manager(seat, prefix.id, Kind::Prefix)?;
        let (p, _) = pin::<Arc<SharedPrefix>>(prefix.id)?;
        let mut l = lock_region(&e)?;
        l.guard.map_prefix(&p)?;
        Ok(())
    })
}

fn free_region(
    region: MemplugHostRegion,
    fences: Vec<memplug_host_dep::SharedFence>,
) -> crate::error::Result<()> {
    if region.id == 0 {
        return Ok(());
    }
    let (e, _) = pin::<RegionEntry>(region.id)?;
    {
        let mut l = lock_region(&e)?;
        for f in fences {
            l.guard.used_by(f);
        }
    }
    // Removed while pinned: the last reader (this call, unless another
    // thread is inside a call on the region) drops it.
    manager_tables::remove::<RegionEntry>(region.id)?;
    drop(e);
    Ok(())
}

/// Frees a region (unmaps its prefix, decommits, releases the address
/// space, refunds) — after the fences of earlier shrinks. The handle is
/// stale afterwards. The zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_region_free(region: MemplugHostRegion) -> MemplugHostStatus {
    boundary("memplug_host_region_free", || free_region(region, Vec::new()))
}

/// Frees a region once every fence in `fences[0..count]` has completed
/// (through the deferred-free queue; never waits for the device). On any
/// refusal the region is untouched. The handle is stale afterwards; the
/// fence handles stay the caller's. Thread-safety: any thread.
///
/// # Safety
/// `fences` must be NULL or readable for `count` handles.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_free_after(
    region: MemplugHostRegion,
    fences: *const MemplugHostFence,
    count: usize,
) -> MemplugHostStatus {
    boundary("memplug_host_region_free_after", || {
        if region.id == 0 {
            return Ok(());
        }
        let raw = crate::handle::expect(region.id, Kind::Region)?;
        // SAFETY: the caller's contract.
        let fences = unsafe { collect_fences(raw.manager, fences, count) }?.into_vec();
        free_region(region, fences)
    })
}

/// Creates a shared prefix of `size` bytes (rounded up to the granularity;
/// needs the shared mapping and virtual backing capabilities), charged
/// once to the binding's pool, filled by `init(userdata, addr, len)` (may be
/// NULL: zero-filled) through a temporary writable view.
///
/// Ownership: the caller owns the handle (`memplug_host_prefix_release`);
/// regions mapping the prefix keep it alive. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable; `init` callable as
/// `MemplugHostPrefixInitFn`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_prefix_create(
    binding: MemplugHostBinding,
    size: u64,
    init: MemplugHostPrefixInitFn,
    userdata: *mut c_void,
    out: *mut MemplugHostPrefix,
) -> MemplugHostStatus {
    boundary("memplug_host_prefix_create", || {
        require_non_null(out, "out")?;
        let (b, seat) = pin::<MemoryBinding>(binding.id)?;
        let ud = UserData(userdata);
        let p = b.create_shared(size, |view| {
            if let Some(f) = init {
                let _scope = CallbackScope::enter();
                // SAFETY: the caller's function and userdata, called once.
                unsafe { f(ud.0, view.addr, view.len) }
            }
        })?;
        drop(b);
        let (len, charged) = (p.len(), p.charged());
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, p, [len, charged], out, |id| MemplugHostPrefix { id }) }
    })
}

/// Reads a prefix's figures. Set `out->struct_size` first.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_prefix_info(
    prefix: MemplugHostPrefix,
    out: *mut MemplugHostPrefixInfo,
) -> MemplugHostStatus {
    boundary("memplug_host_prefix_info", || {
        require_non_null(out, "out")?;
        let [len, charged] = manager_tables::meta::<Arc<SharedPrefix>>(prefix.id)?;
        let info = MemplugHostPrefixInfo {
            struct_size: MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0,
            reserved0: 0,
            len,
            charged,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, info, "MemplugHostPrefixInfo") }
    })
}

/// Releases the caller's prefix handle; the prefix is freed (and its
/// charge refunded) when no region maps it any more. The zero handle is a
/// no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_prefix_release(prefix: MemplugHostPrefix) -> MemplugHostStatus {
    boundary("memplug_host_prefix_release", || {
        manager_tables::remove::<Arc<SharedPrefix>>(prefix.id)?;
        Ok(())
    })
}

/// A region's figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostRegionInfo {
    /// `sizeof(MemplugHostRegionInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Base address; never changes for the region's life.
    pub addr: u64,
    /// Bytes of address space reserved.
    pub capacity: u64,
    /// Usable bytes: the mapped prefix plus the committed private part.
    pub len: u64,
    /// Private bytes committed and charged.
    pub committed: u64,
    /// Bytes of the read-only shared prefix at the start (0: none).
    pub prefix_len: u64,
}

/// A shared prefix's figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPrefixInfo {
    /// `sizeof(MemplugHostPrefixInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Bytes (a multiple of the granularity).
    pub len: u64,
    /// Bytes charged to the pool (once, however many regions map it).
    pub charged: u64,
}

/// The caller's step of a region grow: the region's usable bytes are now
/// `[addr, addr + len)`; return true to accept, false to refuse (the grow
/// is then undone and `memplug_host_region_grow` returns
/// `MEMPLUG_HOST_STATUS_CALLBACK_REFUSED`). Called once, on the calling
/// thread, before the call returns. Must not unwind.
pub type MemplugHostGrowFn = Option<unsafe extern "C" fn(userdata: *mut c_void, addr: u64, len: u64) -> bool>;

/// Fills a new shared prefix through a temporary writable view of `len`
/// bytes at `addr`. Called once, on the calling thread. Must not unwind.
pub type MemplugHostPrefixInitFn = Option<unsafe extern "C" fn(userdata: *mut c_void, addr: u64, len: u64)>;

/// Size of `MemplugHostRegionInfo` in API 1.0.
pub const MEMPLUG_HOST_REGION_INFO_SIZE_1_0: u32 = 48;

/// Size of `MemplugHostPrefixInfo` in API 1.0.
pub const MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0: u32 = 24;
