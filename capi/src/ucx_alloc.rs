//! Allocations on the wire through UCX (cargo feature `ucx`): register an
//! allocation, or a cached block of a caching binding, whole or in part
//! with a UCX context, offer it to a peer (as any registration,
//! `memplug_host_ucx_peer_offer`), and pull into or push from it. The
//! region forms are in `ucx.rs`; this module adds what the Rust crate
//! offers for allocations (`Ucx::register_allocation[_range]`,
//! `Peer::pull_into_allocation`, `Peer::push_from_allocation`), each for
//! both handle kinds (`_cached_allocation`: the two handles are distinct
//! C types, so the calls are too).
//!
//! A cached block, registered or with a transfer in flight, is pinned
//! (`CachedAllocation::pinned_by`): freed meanwhile (`memplug_host_cached_free`,
//! `_free_on`) the handle is stale at once, and the block is handed to no
//! other request — not on the stream it was freed on either — and not
//! given back to the mechanism by trim or pressure until the range is
//! deregistered and the transfer complete; it stays charged, counted in
//! use, throughout.
//!
//! An allocation lives in its manager's lock-free table and is otherwise
//! only read there; registering it and starting a transfer record work on
//! it (the registration's pin, the transfer's fence), which changes it. So
//! these calls take it for exclusive use for their duration
//! (`manager_tables::exclusive`): a call that reads it meanwhile waits, and
//! a free meanwhile makes the handle stale at once and frees it after the
//! work is recorded, so that free too waits for the registration or
//! transfer. The budget is the allocation's own: it was charged when made,
//! so a pull charges nothing more (allocate it from the receiving binding
//! first; that is where `OUT_OF_BUDGET` comes).

use crate::cache::MemplugHostCachedAllocation;
use crate::common::{MemplugHostAllocation, MemplugHostMechanism};
use crate::error::{boundary, require_non_null, write_out, Result};
use crate::manager_tables::{self, pin, same_manager, Object};
use crate::status::MemplugHostStatus;
use crate::ucx::{
    access_of, get, insert, read_range, ucx_error, with_peer, MemplugHostUcx, MemplugHostUcxPeer,
    MemplugHostUcxRegistration, MemplugHostUcxRemoteRange, MemplugHostUcxTransfer, RegistrationEntry, Span,
    TransferEntry, Way,
};
use memplug_host_dep::registry::Context;
use memplug_host_dep::{CachedAllocation, OwnedAllocation};
use memplug_ucx::{LocalAllocation, Ucx};
use std::sync::Arc;

/// Registers `part` (offset, length; `None`: all) of the allocation or
/// cached block `id` and pins it.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn register<T: Object + LocalAllocation>(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    id: u64,
    part: Option<(u64, u64)>,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> Result<()> {
    require_non_null(out, "out")?;
    let access = access_of(access)?;
    let u = get::<Ucx>(ucx.id)?;
    let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
    same_manager(seat, id, T::KIND)?;
    let reg = manager_tables::exclusive::<T, _>(id, |a| match part {
        None => u.register_allocation(&ctx, a, access),
        Some((offset, len)) => u.register_allocation_range(&ctx, a, offset, len, access),
    })?
    .map_err(ucx_error)?;
    let id = insert(RegistrationEntry(reg))?;
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, MemplugHostUcxRegistration { id }) };
    Ok(())
}

/// Registers all of `allocation` with `ucx` and pins it: until the
/// registration is gone, the allocation's free
/// (`memplug_host_allocation_free`, `_free_after`) waits — it returns at
/// once, the handle is stale, and the memory stays allocated and charged
/// until the range is deregistered and the manager's deferred frees run
/// (`memplug_host_manager_poll`, the reaper, a later free). `mechanism` is
/// the allocation's mechanism (its loss deregisters). `access` is
/// `MEMPLUG_HOST_UCX_ACCESS_READ` or `_READ_WRITE`.
///
/// Refused: a bad `access`, an allocation that went with a lost device
/// (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); a freed allocation
/// (`_STALE_HANDLE`); an allocation and mechanism of different managers
/// (`_WRONG_MANAGER`). `*out` is written only on success.
///
/// Ownership: the caller owns the registration
/// (`memplug_host_ucx_deregister` or `_registration_release`).
/// Thread-safety: any thread; a call reading the allocation meanwhile
/// waits for this one.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_register_allocation(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    allocation: MemplugHostAllocation,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_register_allocation", || {
        // SAFETY: the caller's contract.
        unsafe { register::<OwnedAllocation>(ucx, mechanism, allocation.id, None, access, out) }
    })
}

/// Registers `len` bytes at `offset` of `allocation` and pins the
/// allocation, all of it, as `memplug_host_ucx_register_allocation` does.
///
/// Refused, with nothing registered and `*out` untouched: a length of 0,
/// `offset + len` past the allocation's size or overflowing
/// (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`, the message names the range),
/// and what `memplug_host_ucx_register_allocation` refuses.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_register_allocation_range(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    allocation: MemplugHostAllocation,
    offset: u64,
    len: u64,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_register_allocation_range", || {
        let part = Some((offset, len));
        // SAFETY: the caller's contract.
        unsafe { register::<OwnedAllocation>(ucx, mechanism, allocation.id, part, access, out) }
    })
}

/// Registers the `size` bytes asked for of a cached block
/// (`memplug_host_cache_allocate`) with `ucx` and pins the block: freed
/// while registered (`memplug_host_cached_free`, `_free_on`), the handle
/// is stale at once, and the block stays charged, counted in use, and out
/// of the cache: no request gets it (not one on the stream it was freed
/// on either), and neither `memplug_host_cache_trim`, `_collect` nor a
/// pressure ticket gives it back, until the range is deregistered; then
/// it serves the cache's next miss, trim or collect. `mechanism` is the
/// cache's mechanism (its loss deregisters).
///
/// Refused as `memplug_host_ucx_register_allocation` (a freed block:
/// `MEMPLUG_HOST_STATUS_STALE_HANDLE`). `*out` is written only on success.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_register_cached_allocation(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    allocation: MemplugHostCachedAllocation,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_register_cached_allocation", || {
        // SAFETY: the caller's contract.
        unsafe { register::<CachedAllocation>(ucx, mechanism, allocation.id, None, access, out) }
    })
}

/// Registers `len` bytes at `offset` of a cached block (inside the size it
/// was asked for) and pins the block as
/// `memplug_host_ucx_register_cached_allocation` does. Refused as
/// `memplug_host_ucx_register_allocation_range`.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_register_cached_allocation_range(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    allocation: MemplugHostCachedAllocation,
    offset: u64,
    len: u64,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_register_cached_allocation_range", || {
        let part = Some((offset, len));
        // SAFETY: the caller's contract.
        unsafe { register::<CachedAllocation>(ucx, mechanism, allocation.id, part, access, out) }
    })
}

/// # Safety
/// `range` NULL or readable, `out` NULL or writable.
unsafe fn transfer_allocation<T: Object + LocalAllocation>(
    way: Way,
    peer: MemplugHostUcxPeer,
    allocation: u64,
    range: *const MemplugHostUcxRemoteRange,
    span: Span,
    out: *mut MemplugHostUcxTransfer,
) -> Result<()> {
    require_non_null(out, "out")?;
    // SAFETY: the caller's contract.
    let r = unsafe { read_range(range) }?;
    // The peer's lock, then the allocation: the only order these take them.
    let t = with_peer(peer, |p| {
        manager_tables::exclusive::<T, _>(allocation, |a| match way {
            Way::Pull => p.pull_into_allocation(a, span.local, &r, span.remote, span.len),
            Way::Push => p.push_from_allocation(a, span.local, &r, span.remote, span.len),
        })?
        .map_err(ucx_error)
    })?;
    let id = insert(TransferEntry(t))?;
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, MemplugHostUcxTransfer { id }) };
    Ok(())
}

/// Reads `len` bytes at `src_offset` of the peer's `range` into
/// `allocation` at `dst_offset`. Nothing is charged: the allocation's bytes
/// were charged when it was made. The transfer is recorded on the
/// allocation: its free waits for it.
///
/// Refused, with nothing moved: a destination not inside the allocation, a
/// range out of bounds, a length of 0, an allocation that went with a lost
/// device (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); a freed allocation
/// (`_STALE_HANDLE`); a range released or revoked (`_INVALID_STATE`); a
/// lost peer (`_DEVICE_UNAVAILABLE`).
///
/// Ownership: the caller owns the transfer handle
/// (`memplug_host_ucx_transfer_release`). Thread-safety: any thread.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_pull_into_allocation(
    peer: MemplugHostUcxPeer,
    allocation: MemplugHostAllocation,
    dst_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    src_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_pull_into_allocation", || {
        let span = Span { local: dst_offset, remote: src_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_allocation::<OwnedAllocation>(Way::Pull, peer, allocation.id, range, span, out) }
    })
}

/// Writes `len` bytes of `allocation` at `src_offset` into the peer's
/// writable `range` at `dst_offset`. The allocation's free waits for the
/// transfer. Errors as for `memplug_host_ucx_peer_pull_into_allocation`;
/// a range offered read-only is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_push_from_allocation(
    peer: MemplugHostUcxPeer,
    allocation: MemplugHostAllocation,
    src_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    dst_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_push_from_allocation", || {
        let span = Span { local: src_offset, remote: dst_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_allocation::<OwnedAllocation>(Way::Push, peer, allocation.id, range, span, out) }
    })
}

/// `memplug_host_ucx_peer_pull_into_allocation` into a cached block (inside
/// the size it was asked for). The transfer pins the block: freed before
/// the transfer completes, it is handed to no other request (not one on
/// the stream it was freed on either) and not given back by trim or
/// pressure until then. Errors as for the allocation form.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_pull_into_cached_allocation(
    peer: MemplugHostUcxPeer,
    allocation: MemplugHostCachedAllocation,
    dst_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    src_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_pull_into_cached_allocation", || {
        let span = Span { local: dst_offset, remote: src_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_allocation::<CachedAllocation>(Way::Pull, peer, allocation.id, range, span, out) }
    })
}

/// `memplug_host_ucx_peer_push_from_allocation` from a cached block,
/// pinned as for `memplug_host_ucx_peer_pull_into_cached_allocation`.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_push_from_cached_allocation(
    peer: MemplugHostUcxPeer,
    allocation: MemplugHostCachedAllocation,
    src_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    dst_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_push_from_cached_allocation", || {
        let span = Span { local: src_offset, remote: dst_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_allocation::<CachedAllocation>(Way::Push, peer, allocation.id, range, span, out) }
    })
}
