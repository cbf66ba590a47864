//! The slot functions ABI 1.2 adds to existing tables and its new peer
//! access table: queue-ordered binding (`commit_on`, `decommit_on`,
//! `map_on`, `unmap_on`), cross-stream waits and typed adoption, and peer
//! access. Same rules as `thunks.rs`: arguments checked before the vendor's
//! trait sees them, out-params written only on success. An out-pointer is
//! checked before anything is enqueued (a fence nobody receives would
//! leak).

use super::args::{object_of, write_u64};
use super::context::mech;
use super::guard::guard;
use crate::abi::*;
use crate::author::*;
use core::ffi::c_void;

fn out_fence_present(out: *mut u64) -> PluginResult<()> {
    if out.is_null() {
        return Err(PluginError::invalid_argument("out_fence is NULL"));
    }
    Ok(())
}

/// The body every queued range slot shares: the out-fence present, then
/// the reservation and range checked as for the synchronous slot
/// (`MechCtx::on_range`), then `act` makes the fence, which is written out.
///
/// # Safety
/// `res` as for `object_of`; `out` NULL or writable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn queued_range<M>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    out: *mut u64,
    slot: &'static str,
    reservation: &'static str,
    act: impl FnOnce(&M, &ObjectRef) -> PluginResult<u64>,
) -> PluginResult<()> {
    out_fence_present(out)?;
    let m = mech::<M>(ctx)?;
    let f = m.on_range(res, offset, len, slot, reservation, |r| act(&m.imp, r))?;
    write_u64(out, f, "out_fence")
}

pub(super) unsafe extern "C" fn v_commit_on<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "commit_on", || {
        queued_range::<M>(ctx, res, offset, len, out, "commit_on", "commit_on: reservation", |m, r| {
            m.commit_on(r, offset, len, stream)
        })
    })
}

pub(super) unsafe extern "C" fn v_decommit_on<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "decommit_on", || {
        queued_range::<M>(ctx, res, offset, len, out, "decommit_on", "decommit_on: reservation", |m, r| {
            m.decommit_on(r, offset, len, stream)
        })
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn s_map_on<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    object_offset: u64,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    access: u32,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "map_on", || {
        out_fence_present(out)?;
        let acc = Access::from_bits(access).ok_or_else(|| {
            PluginError::invalid_argument(format!(
                "access {access:#x} is neither MEMPLUG_ACCESS_READ nor READ|WRITE"
            ))
        })?;
        let m = mech::<M>(ctx)?;
        let (o, r) = m.mapping(
            object,
            object_offset,
            res,
            offset,
            len,
            "map_on: physical object",
            "map_on: reservation",
        )?;
        let f = m.imp.map_on(&o, object_offset, &r, offset, len, acc, stream)?;
        write_u64(out, f, "out_fence")
    })
}

pub(super) unsafe extern "C" fn s_unmap_on<M: SharedMapping>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "unmap_on", || {
        queued_range::<M>(ctx, res, offset, len, out, "unmap_on", "unmap_on: reservation", |m, r| {
            m.unmap_on(r, offset, len, stream)
        })
    })
}

pub(super) unsafe extern "C" fn y_stream_wait_fence<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_wait_fence", || mech::<M>(ctx)?.imp.stream_wait_fence(stream, fence))
}

pub(super) unsafe extern "C" fn y_stream_adopt_typed<M: StreamSync>(
    ctx: *mut c_void,
    native_kind: u32,
    native: *mut c_void,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_adopt_typed", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_stream is NULL"));
        }
        let s = mech::<M>(ctx)?.imp.stream_adopt_typed(native_kind, native)?;
        write_u64(out, s, "out_stream")
    })
}

pub(super) unsafe extern "C" fn p_can_access_peer<M: PeerAccess>(
    ctx: *mut c_void,
    peer: *const MemplugDevice,
    out: *mut u32,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "can_access_peer", || {
        let peer = peer.as_ref().copied().ok_or_else(|| PluginError::invalid_argument("peer is NULL"))?;
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_access is NULL"));
        }
        let a = mech::<M>(ctx)?.imp.can_access_peer(peer)?;
        out.write(a & (MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn p_set_peer_access<M: PeerAccess>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    peer: *const MemplugDevice,
    access: u32,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "set_peer_access", || {
        if access & !(MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE) != 0 {
            return Err(PluginError::invalid_argument(format!("access {access:#x} has unknown bits")));
        }
        let peer = peer.as_ref().copied().ok_or_else(|| PluginError::invalid_argument("peer is NULL"))?;
        let m = mech::<M>(ctx)?;
        let r = object_of(res, "reservation")?;
        m.facts.object(&r, "set_peer_access: reservation")?;
        m.facts.range(offset, len, "set_peer_access")?;
        m.imp.set_peer_access(&r, offset, len, peer, access)
    })
}
