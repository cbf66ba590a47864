//! Bindings and allocations: the hot path.

use crate::common::{
    MemplugHostAllocation, MemplugHostBinding, MemplugHostFence, MemplugHostHolder, MemplugHostManager,
    MemplugHostMechanism, MEMPLUG_HOST_CLASS_OTHER,
};
use crate::error::{boundary, require_non_null, write_out, Error, Result};
use crate::fence::{collect_fences, pin_fence, Fences};
use crate::handle::Kind;
use crate::manager::{location_of, page_size_of};
use crate::manager_tables::{self, pin, pin_manager, same_manager, HolderEntry, PoolEntry};
use crate::mechanism_info::MemplugHostMechanismInfo;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{read_sized, write_sized};
use memplug_host_dep::governor::AllocationClass;
use memplug_host_dep::registry::Context;
use memplug_host_dep::{BindingSpec, MemoryBinding, OwnedAllocation, Placement};
use memplug_sdk::abi::{
    MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD, MEMPLUG_HANDLE_OPAQUE_FD, MEMPLUG_HANDLE_VENDOR_BLOB,
    MEMPLUG_HANDLE_WIN32, MEMPLUG_HINT_UNINITIALIZED_OK,
};
use std::sync::Arc;
use std::time::Duration;

/// The class with this number, refusing unknown numbers.
pub(crate) fn class_of(class: u32) -> Result<AllocationClass> {
    AllocationClass::ALL
        .into_iter()
        .find(|c| memplug_host_dep::mechanism::class_tag(*c) == class)
        .ok_or_else(|| Error::new(S::InvalidArgument, format!("unknown allocation class {class}")))
}

/// Creates a binding: allocations through `mechanism`, charged to `pool`,
/// for the options' holder and class, placed as the options say (API 1.1:
/// hints, page size, location, export kinds — sent with every request of
/// the binding's allocations, regions and prefixes to a plugin that agreed
/// on ABI 1.2, to no older one). `options` may be NULL (class OTHER, no
/// holder, no waiting, no placement); otherwise set `options->struct_size`
/// to `sizeof(MemplugHostBindingOptions)` (a 1.0-sized struct is accepted:
/// no placement).
///
/// Refused with `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`: an unknown class,
/// unknown hint or export bits, an unknown location kind, a location id
/// with a kind that names no node or tier, a page size that is not a power
/// of two. Whether the mechanism can place memory so is the plugin's to
/// say, when the binding first asks for memory.
///
/// Every handle must belong to `manager` (`MEMPLUG_HOST_STATUS_WRONG_MANAGER`
/// otherwise); the holder must be registered with `pool`
/// (`_INVALID_ARGUMENT`).
///
/// A mechanism whose context is no longer active (retired, replaced, lost)
/// makes no binding itself: the binding is made on its newest active
/// successor (`memplug_host_manager_replace`;
/// `memplug_host_binding_mechanism_info` says which mechanism it is);
/// without one the call fails with `MEMPLUG_HOST_STATUS_DEVICE_LOST` (lost)
/// or `_INVALID_STATE` (ended in order).
///
/// Ownership: the caller owns the handle (`memplug_host_binding_destroy`).
/// Thread-safety: any thread; a binding may be used from many threads at
/// once.
///
/// # Safety
/// `options` must be NULL or readable for its `struct_size` bytes; `out`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_binding_create(
    manager: MemplugHostManager,
    mechanism: MemplugHostMechanism,
    pool: crate::common::MemplugHostPool,
    options: *const MemplugHostBindingOptions,
    out: *mut MemplugHostBinding,
) -> MemplugHostStatus {
    boundary("memplug_host_binding_create", || {
        require_non_null(out, "out")?;
        let opts = if options.is_null() {
            MemplugHostBindingOptions {
                struct_size: MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0,
                alloc_class: MEMPLUG_HOST_CLASS_OTHER,
                ..Default::default()
            }
        } else {
            // SAFETY: non-NULL; the caller's contract covers the size.
            unsafe { read_sized(options, "MemplugHostBindingOptions") }?
        };
        let class = class_of(opts.alloc_class)?;
        let placement = placement(&opts)?;
        let (m, seat) = pin_manager(manager.id)?;
        same_manager(seat, mechanism.id, Kind::Mechanism)?;
        same_manager(seat, pool.id, Kind::Pool)?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let (p, _) = pin::<PoolEntry>(pool.id)?;
        let mut spec = BindingSpec::new(class);
        if opts.holder.id != 0 {
            same_manager(seat, opts.holder.id, Kind::Holder)?;
            let (h, _) = pin::<HolderEntry>(opts.holder.id)?;
            if !Arc::ptr_eq(h.reg.pool(), &p.pool) {
                return Err(Error::new(
                    S::InvalidArgument,
                    "the holder is registered with another pool than the binding's",
                ));
            }
            spec = spec.holder(h.reg.id());
        }
        if opts.wait_ns != 0 {
            spec = spec.wait(Duration::from_nanos(opts.wait_ns));
        }
        spec.placement = placement;
        let b = m.pm.bind(&ctx, &p.pool, spec)?;
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, b, [0, 0], out, |id| MemplugHostBinding { id }) }
    })
}

/// The placement of a caller's options (zero when its struct is 1.0-sized:
/// the fields read as zero).
pub(crate) fn placement(opts: &MemplugHostBindingOptions) -> Result<Placement> {
    const WHAT: &str = "MemplugHostBindingOptions";
    let known_hints = MEMPLUG_HINT_UNINITIALIZED_OK;
    if opts.hints & !known_hints != 0 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("{WHAT}: unknown hint bits {:#x}", opts.hints & !known_hints),
        ));
    }
    let known_kinds = MEMPLUG_HANDLE_OPAQUE_FD
        | MEMPLUG_HANDLE_DMABUF_FD
        | MEMPLUG_HANDLE_MEMFD
        | MEMPLUG_HANDLE_WIN32
        | MEMPLUG_HANDLE_VENDOR_BLOB;
    if opts.export_types & !known_kinds != 0 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("{WHAT}: unknown export kind bits {:#x}", opts.export_types & !known_kinds),
        ));
    }
    Ok(Placement {
        hints: opts.hints,
        page_size: page_size_of(opts.page_size, WHAT)?,
        location: location_of(opts.location_kind, opts.location_id, WHAT)?,
        export_types: opts.export_types,
    })
}

/// Describes the mechanism the binding allocates through, as
/// `memplug_host_mechanism_info` does: after `memplug_host_manager_replace`
/// a binding asked of the old mechanism is made on its successor, and this
/// says which it is. Set `out->struct_size` first. Thread-safety: any
/// thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_binding_mechanism_info(
    binding: MemplugHostBinding,
    out: *mut MemplugHostMechanismInfo,
) -> MemplugHostStatus {
    boundary("memplug_host_binding_mechanism_info", || {
        require_non_null(out, "out")?;
        let (b, _) = pin::<MemoryBinding>(binding.id)?;
        let info = crate::manager::mechanism_info(b.mechanism());
        drop(b);
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, info, "MemplugHostMechanismInfo") }
    })
}

/// Destroys a binding handle. Allocations, regions and prefixes made
/// through it stay valid and are freed as usual; calls already running on
/// other threads finish first. The zero handle is a no-op.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_binding_destroy(binding: MemplugHostBinding) -> MemplugHostStatus {
    boundary("memplug_host_binding_destroy", || {
        manager_tables::remove::<MemoryBinding>(binding.id)?;
        Ok(())
    })
}

/// Allocates `size` bytes aligned to `alignment` (a power of two) as a
/// transaction: reserve budget → allocate through the mechanism → charge
/// the bytes actually obtained; any failure undoes what was done.
///
/// When the pool lacks room its holders are sent pressure tickets (their
/// callbacks run on this thread) and, with the binding's `wait_ns`, the
/// call waits for frees; then `MEMPLUG_HOST_STATUS_OUT_OF_BUDGET`. A
/// plugin's refusal comes back with its own code (`_OUT_OF_MEMORY`,
/// `_INVALID_ARGUMENT` for a bad alignment...). A binding whose mechanism's
/// context was lost fails with `MEMPLUG_HOST_STATUS_DEVICE_LOST` without
/// calling the plugin; one whose context is retiring with `_INVALID_STATE`
/// (make a new binding: it goes to the successor).
///
/// `out` receives the allocation's handle and `out_addr` (may be NULL) its
/// address; both only on success.
///
/// Ownership: the caller owns the allocation (`memplug_host_allocation_free`
/// or `_free_after`); it outlives the binding handle. Thread-safety: any
/// thread.
///
/// # Safety
/// `out` must be NULL or writable; `out_addr` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_allocate(
    binding: MemplugHostBinding,
    size: u64,
    alignment: u64,
    out: *mut MemplugHostAllocation,
    out_addr: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_allocate", || {
        require_non_null(out, "out")?;
        let (b, seat, tables) = manager_tables::pin_with_tables::<MemoryBinding>(binding.id)?;
        // The table slot first, so the allocation moves once, into it.
        let vacant = manager_tables::vacant_in::<OwnedAllocation>(tables)?;
        let made = b.allocate(size, alignment);
        let (id, [addr, _]) = manager_tables::fill_made(seat, vacant, made, |a| [a.addr(), a.size()])?;
        drop(b);
        // SAFETY: checked non-NULL.
        unsafe {
            write_out(out, MemplugHostAllocation { id });
            if !out_addr.is_null() {
                write_out(out_addr, addr);
            }
        }
        Ok(())
    })
}

/// Reads an allocation's address and size. Set `out->struct_size` first.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_allocation_info(
    allocation: MemplugHostAllocation,
    out: *mut MemplugHostAllocationInfo,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    boundary("memplug_host_allocation_info", || unsafe { write_info::<OwnedAllocation>(allocation.id, out) })
}

/// Writes the address and size kept beside an object's table entry (an
/// allocation's or a cached block's) into a caller's
/// `MemplugHostAllocationInfo`.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
pub(crate) unsafe fn write_info<T: manager_tables::Object>(
    handle: u64,
    out: *mut MemplugHostAllocationInfo,
) -> Result<()> {
    require_non_null(out, "out")?;
    let [addr, size] = manager_tables::meta::<T>(handle)?;
    let info = MemplugHostAllocationInfo {
        struct_size: MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0,
        reserved0: 0,
        addr,
        size,
    };
    // SAFETY: non-NULL; the caller's contract covers the size.
    unsafe { write_sized(out, info, "MemplugHostAllocationInfo") }
}

/// The allocation, out of its table (its handle stale from now). Only
/// `memplug_host_allocation_is_lost` pins allocations, for a moment: a free
/// racing it waits for it rather than leave the drop (a free that ignores
/// the fences) to that reader. Always inlined: out of line (two callers),
/// the 72-byte allocation was copied through its result twice more
/// (callgrind).
#[inline(always)]
fn take(allocation: MemplugHostAllocation) -> Result<Option<OwnedAllocation>> {
    manager_tables::take_unpinned::<OwnedAllocation>(allocation.id)
}

/// Frees an allocation that no device work uses any more: the mechanism
/// that made it frees it now and the pool is refunded. If the plugin
/// cannot free it, its bytes stay charged as quarantined and its address is
/// never reissued. The handle is stale afterwards (a second free is
/// `MEMPLUG_HOST_STATUS_STALE_HANDLE`, never a double free). An allocation
/// that went with a lost device (`memplug_host_allocation_is_lost`) is
/// forgotten instead: no plugin is called and nothing is refunded (its
/// charge is settled once, when the context terminates, whether before or
/// after this call). The zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_allocation_free(allocation: MemplugHostAllocation) -> MemplugHostStatus {
    boundary("memplug_host_allocation_free", || manager_tables::remove_drop::<OwnedAllocation>(allocation.id))
}

/// Frees an allocation once every fence in `fences[0..count]` has
/// completed: now when they all have, otherwise through the manager's
/// deferred-free queue (retired by later frees, `memplug_host_manager_poll`
/// or the reaper). Never waits for the device. The fences must belong to
/// the allocation's manager; on any refusal the allocation is untouched.
/// `fences` may be NULL when `count` is 0. The handle is stale afterwards;
/// the fence handles stay the caller's (the queue keeps its own references).
/// Thread-safety: any thread.
///
/// # Safety
/// `fences` must be NULL or readable for `count` handles.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_allocation_free_after(
    allocation: MemplugHostAllocation,
    fences: *const MemplugHostFence,
    count: usize,
) -> MemplugHostStatus {
    boundary("memplug_host_allocation_free_after", || {
        if allocation.id == 0 {
            return Ok(());
        }
        let raw = crate::handle::expect(allocation.id, Kind::Allocation)?;
        if count == 1 && !fences.is_null() {
            // The common case, one fence, on its own path: no four-slot
            // array to fill, match and drop (callgrind: 51 instructions a
            // free less). The fence is resolved first, as below, so that a
            // refused fence leaves the allocation untouched.
            // SAFETY: non-NULL and readable for one handle by the caller's
            // contract.
            let (f, tables) = pin_fence(raw.manager, unsafe { *fences })?;
            // The fence's seat is the allocation's (checked): its tables.
            // Recorded and freed in its slot (`release_after`'s two steps,
            // with no move of the allocation), the fence's reference made
            // there, under the pin.
            return manager_tables::take_unpinned_drop_in::<OwnedAllocation>(
                tables,
                raw,
                allocation.id,
                |a| a.used_by(f.fence.clone()),
            );
        }
        // SAFETY: the caller's contract.
        let fences = unsafe { collect_fences(raw.manager, fences, count) }?;
        if let Some(a) = take(allocation)? {
            // One match, then a plain iterator: through the chained one of
            // `Fences::into_iter`, release_after cost ~150 instructions
            // more for one fence (callgrind).
            match fences {
                Fences::Inline(f) => a.release_after(f.into_iter().flatten()),
                Fences::Heap(v) => a.release_after(v),
            }
        }
        Ok(())
    })
}

/// Options of a binding (`memplug_host_binding_create`); NULL means all
/// defaults (class OTHER, no holder, no waiting, no placement).
///
/// Since API 1.1 the struct ends with the binding's placement: how its
/// memory is asked for (the plugin ABI 1.2 request fields: hints, page
/// size, location, export kinds). They are read only when `struct_size`
/// reaches them: a caller built against API 1.0 (`struct_size` =
/// `MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0`) asks for no placement. A
/// mechanism whose plugin agreed on an older ABI minor is sent none of it.
/// A library older than API 1.1 reads only the 1.0 fields (and so ignores
/// the placement): `MEMPLUG_HOST_CHECK_API()` refuses such a library.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostBindingOptions {
    /// `sizeof(MemplugHostBindingOptions)`.
    pub struct_size: u32,
    /// One of `MEMPLUG_HOST_CLASS_*`.
    pub alloc_class: u32,
    /// The holder allocations are charged to; the zero handle for none. It
    /// must be registered with the binding's pool.
    pub holder: MemplugHostHolder,
    /// How long an allocation may wait for pressure to free room, in
    /// nanoseconds; 0 fails at once after the pressure tickets.
    pub wait_ns: u64,
    /// Since API 1.1. `MEMPLUG_HINT_*` bits (memplug.h):
    /// `MEMPLUG_HINT_UNINITIALIZED_OK` when the binding's memory need not
    /// be zeroed (only for memory the caller overwrites before reading).
    /// Unknown bits are refused (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`).
    pub hints: u32,
    /// Since API 1.1. `MEMPLUG_HANDLE_*` kinds the memory will be exported
    /// as (0: none). A plugin that does not offer one of them refuses the
    /// binding's allocations and prefixes with
    /// `MEMPLUG_HOST_STATUS_UNSUPPORTED`. Unknown bits are refused.
    pub export_types: u32,
    /// Since API 1.1. Pages of this many bytes: a power of two (else
    /// refused here) the mechanism publishes in its descriptor's
    /// `page_sizes` (a plugin refuses another when asked to allocate, with
    /// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); 0: the mechanism's choice.
    pub page_size: u64,
    /// Since API 1.1. Where the memory should live: a `MEMPLUG_LOCATION_*`
    /// kind (`MEMPLUG_LOCATION_ANY`, 0: no preference) and the NUMA node or
    /// tier it names (else 0; an unknown kind, or an id with a kind that
    /// names no node or tier, is refused). A plugin that cannot place it
    /// there refuses.
    pub location_kind: u32,
    /// The NUMA node or tier `location_kind` names; 0 for a kind that names
    /// none.
    pub location_id: u32,
}

/// An allocation's address and size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostAllocationInfo {
    /// `sizeof(MemplugHostAllocationInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Device address (a host pointer for CPU mechanisms).
    pub addr: u64,
    /// Bytes the mechanism provided (at least the size asked), all charged.
    pub size: u64,
}

/// Size of `MemplugHostBindingOptions` in API 1.0.
pub const MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0: u32 = 24;

/// Size of `MemplugHostAllocationInfo` in API 1.0.
pub const MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0: u32 = 24;

/// Size of `MemplugHostBindingOptions` in API 1.1 (the placement
/// appended).
pub const MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_1: u32 = 48;
