//! Allocations on the wire through UCX (cargo feature `ucx`): register a
//! whole allocation with a UCX context, offer it to a peer (as any
//! registration, `memplug_host_ucx_peer_offer`), and pull into or push
//! from an allocation. The region forms are in `ucx.rs`; this module adds
//! what the Rust crate offers for allocations (`Ucx::register_allocation`,
//! `Peer::pull_into_allocation`, `Peer::push_from_allocation`).
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

use crate::common::{MemplugHostAllocation, MemplugHostMechanism};
use crate::error::{boundary, require_non_null, write_out, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, same_manager};
use crate::status::MemplugHostStatus;
use crate::ucx::{
    access_of, get, insert, read_range, ucx_error, with_peer, MemplugHostUcx, MemplugHostUcxPeer,
    MemplugHostUcxRegistration, MemplugHostUcxRemoteRange, MemplugHostUcxTransfer, RegistrationEntry, Span,
    TransferEntry, Way,
};
use memplug_host_dep::registry::Context;
use memplug_host_dep::OwnedAllocation;
use memplug_ucx::Ucx;
use std::sync::Arc;

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
/// (`_WRONG_MANAGER`).
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
        require_non_null(out, "out")?;
        let access = access_of(access)?;
        let u = get::<Ucx>(ucx.id)?;
        let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
        same_manager(seat, allocation.id, Kind::Allocation)?;
        let reg = manager_tables::exclusive::<OwnedAllocation, _>(allocation.id, |a| {
            u.register_allocation(&ctx, a, access)
        })?
        .map_err(ucx_error)?;
        let id = insert(RegistrationEntry(reg))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostUcxRegistration { id }) };
        Ok(())
    })
}

/// # Safety
/// `range` NULL or readable, `out` NULL or writable.
unsafe fn transfer_allocation(
    way: Way,
    peer: MemplugHostUcxPeer,
    allocation: MemplugHostAllocation,
    range: *const MemplugHostUcxRemoteRange,
    span: Span,
    out: *mut MemplugHostUcxTransfer,
) -> Result<()> {
    require_non_null(out, "out")?;
    // SAFETY: the caller's contract.
    let r = unsafe { read_range(range) }?;
    // The peer's lock, then the allocation: the only order these take them.
    let t = with_peer(peer, |p| {
        manager_tables::exclusive::<OwnedAllocation, _>(allocation.id, |a| match way {
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
        unsafe { transfer_allocation(Way::Pull, peer, allocation, range, span, out) }
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
        unsafe { transfer_allocation(Way::Push, peer, allocation, range, span, out) }
    })
}
