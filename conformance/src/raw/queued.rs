//! The ABI 1.2 slots of a `Mech`: queue-ordered binding (a fence written
//! or not), cross-stream waits, typed adopt and peer access.

use super::*;
use crate::sink::{call, Log};
use core::ffi::c_void;
use memplug_sdk::abi::*;

/// What the kit puts in an `out_fence` before a queued call: a failed call
/// that changed it wrote its output on failure.
pub(crate) const FENCE_UNWRITTEN: u64 = 0xa5a5_a5a5_a5a5_a5a5;

/// Where a queued call writes its fence: the kit's word, or NULL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceOut {
    Kit,
    Null,
}

/// The 1.2 slots: queue-ordered binding, cross-stream waits, typed adopt
/// and peer access.
impl Mech {
    /// Runs a queued call with `out_fence` as `out` says; the status and
    /// the fence written (a failed call that wrote one is logged).
    fn fence_out(
        &self,
        log: &Log,
        slot: &'static str,
        out: FenceOut,
        f: impl FnOnce(*mut u64, *const MemplugMessageSink) -> MemplugStatus,
    ) -> (MemplugStatus, u64) {
        let mut fence = FENCE_UNWRITTEN;
        let p: *mut u64 = match out {
            FenceOut::Kit => &mut fence,
            FenceOut::Null => core::ptr::null_mut(),
        };
        let (status, _) = call(log, slot, |sink| f(p, sink));
        if status != MEMPLUG_STATUS_OK && fence != FENCE_UNWRITTEN {
            log.wrote_on_failure(slot, status);
        }
        (status, fence)
    }

    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn range_on(
        &self,
        log: &Log,
        slot: &'static str,
        f: Option<
            unsafe extern "C" fn(
                *mut c_void,
                *const MemplugObjectRef,
                u64,
                u64,
                u64,
                *mut u64,
                *const MemplugMessageSink,
            ) -> MemplugStatus,
        >,
        r: &MemplugObjectRef,
        (offset, len): (u64, u64),
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let Some(f) = f else {
            return (MEMPLUG_STATUS_UNSUPPORTED, FENCE_UNWRITTEN);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.fence_out(log, slot, out, |p, sink| unsafe { f(self.ctx, r, offset, len, stream, p, sink) })
    }

    /// `commit_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn commit_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.vb.and_then(|v| v.commit_on);
        self.range_on(log, "virtual_backing.commit_on", f, r, (offset, len), stream, out)
    }

    /// `decommit_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn decommit_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.vb.and_then(|v| v.decommit_on);
        self.range_on(log, "virtual_backing.decommit_on", f, r, (offset, len), stream, out)
    }

    /// `map_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map_on(
        &self,
        log: &Log,
        object: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        (offset, len): (u64, u64),
        access: u32,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let Some(f) = self.sm.and_then(|v| v.map_on) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, FENCE_UNWRITTEN);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.fence_out(log, "shared_mapping.map_on", out, |p, sink| unsafe {
            f(self.ctx, object, object_offset, r, offset, len, access, stream, p, sink)
        })
    }

    /// `unmap_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn unmap_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.sm.and_then(|v| v.unmap_on);
        self.range_on(log, "shared_mapping.unmap_on", f, r, (offset, len), stream, out)
    }

    /// `stream_wait_fence` (ABI 1.2, optional).
    pub(crate) fn stream_wait_fence(&self, log: &Log, stream: u64, fence: u64) -> MemplugStatus {
        let Some(f) = self.sync.and_then(|v| v.stream_wait_fence) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; the sink lives for the call.
        call(log, "sync.stream_wait_fence", |sink| unsafe { f(self.ctx, stream, fence, sink) }).0
    }

    /// `stream_adopt_typed` (ABI 1.2, optional): the status and the stream.
    pub(crate) fn stream_adopt_typed(
        &self,
        log: &Log,
        kind: u32,
        native: *mut c_void,
    ) -> Option<(MemplugStatus, u64)> {
        let f = self.sync.and_then(|s| s.stream_adopt_typed)?;
        // SAFETY: a published slot; pointers live for the call.
        Some(self.out_handle(log, "sync.stream_adopt_typed", |out, sink| unsafe {
            f(self.ctx, kind, native, out, sink)
        }))
    }

    /// `can_access_peer` (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`): the status
    /// and the access bits (the kit's filler when unwritten).
    pub(crate) fn can_access_peer(&self, log: &Log, peer: &MemplugDevice) -> (MemplugStatus, u32) {
        let Some(f) = self.peer.and_then(|p| p.can_access_peer) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, 0);
        };
        let mut out = ACCESS_UNWRITTEN;
        let slot = "peer_access.can_access_peer";
        // SAFETY: a published slot; pointers live for the call.
        let (status, _) = call(log, slot, |sink| unsafe { f(self.ctx, peer, &mut out, sink) });
        if status != MEMPLUG_STATUS_OK && out != ACCESS_UNWRITTEN {
            log.wrote_on_failure(slot, status);
        }
        (status, out)
    }

    /// `set_peer_access` (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`).
    pub(crate) fn set_peer_access(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        peer: &MemplugDevice,
        access: u32,
    ) -> MemplugStatus {
        let Some(f) = self.peer.and_then(|p| p.set_peer_access) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; pointers live for the call.
        call(log, "peer_access.set_peer_access", |sink| unsafe {
            f(self.ctx, r, offset, len, peer, access, sink)
        })
        .0
    }
}

/// What the kit puts in `can_access_peer`'s output before the call.
pub(crate) const ACCESS_UNWRITTEN: u32 = 0xa5a5_a5a5;
