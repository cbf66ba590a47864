//! What ABI 1.2 adds to ordering work on a device: binding as a queue
//! operation (`commit_on`, `decommit_on`, `map_on`, `unmap_on`: the change
//! is enqueued on a stream and a fence says when it took effect, for
//! devices whose mapping the device itself orders), cross-stream waits
//! (`stream_wait_fence`), adopting a runtime's stream with its API named,
//! and peer access. Every object and range is checked against this
//! mechanism before the plugin sees it, as for the synchronous slots; each
//! fence returned is counted live like one from `fence_record`.

use super::{MechanismInner, SharedMappingApi, SyncApi, VirtualBackingApi};
use crate::error::{CallError, ObjectKind};
use crate::mechanism::call::Opaque;
use crate::mechanism::Access;
use crate::tokens::{Fence, PhysicalObject, Reservation, Stream};
use memplug_sdk::abi::*;
use memplug_sdk::Status;

impl MechanismInner {
    #[cold]
    fn no_queue(&self, slot: &'static str) -> CallError {
        self.refuse(
            slot,
            Status::Unsupported,
            "the mechanism does not have MEMPLUG_CAP_QUEUED_BINDING (ABI 1.2)".into(),
        )
    }

    /// A fence the plugin returned from a queued operation `slot`, checked:
    /// a handle it cannot have recorded (0: fences are non-zero handles) is
    /// refused here, where the slot returns, naming the slot — nothing may
    /// wait on it (it would never answer, or answer for something else).
    ///
    /// The plugin said OK, so the operation was accepted and may still run
    /// on its stream: the refusal keeps the plugin's raw status (OK), which
    /// [`accepted_unfenced`] reads, so a caller that charged for the
    /// operation treats the range as possibly changed (orders its undo
    /// behind a fence it records on the stream) instead of as untouched.
    fn queued_fence(&self, slot: &'static str, handle: u64) -> Result<Fence, CallError> {
        if handle == 0 {
            let e = CallError {
                status: Status::Internal,
                raw: MEMPLUG_STATUS_OK,
                slot,
                mechanism: self.label.clone(),
                message: "plugin misbehaviour: the slot returned OK with fence handle 0, which it cannot \
                          have recorded (fences are non-zero handles); the fence is refused, and the \
                          operation, which may still run on the stream, is ordered behind a fence the \
                          host records there"
                    .into(),
            };
            self.log(crate::events::Level::Warn, &e.to_string());
            return Err(e);
        }
        self.born(ObjectKind::Fence);
        Ok(Fence { mechanism_key: self.key, handle })
    }
}

impl VirtualBackingApi<'_> {
    /// [`commit`](Self::commit) enqueued on `stream`: the fence completes
    /// once the range is usable. `Unsupported` without queued binding.
    pub fn commit_on(
        &self,
        r: &Reservation,
        offset: u64,
        len: u64,
        stream: &Stream,
    ) -> Result<Fence, CallError> {
        self.queued("virtual_backing.commit_on", self.vt.commit_on, r, offset, len, stream)
    }

    /// [`decommit`](Self::decommit) enqueued on `stream`.
    pub fn decommit_on(
        &self,
        r: &Reservation,
        offset: u64,
        len: u64,
        stream: &Stream,
    ) -> Result<Fence, CallError> {
        self.queued("virtual_backing.decommit_on", self.vt.decommit_on, r, offset, len, stream)
    }

    #[allow(clippy::type_complexity)]
    fn queued(
        &self,
        slot: &'static str,
        f: Option<
            unsafe extern "C" fn(
                *mut core::ffi::c_void,
                *const MemplugObjectRef,
                u64,
                u64,
                u64,
                *mut u64,
                *const MemplugMessageSink,
            ) -> MemplugStatus,
        >,
        r: &Reservation,
        offset: u64,
        len: u64,
        stream: &Stream,
    ) -> Result<Fence, CallError> {
        let m = self.m;
        let f = f.ok_or_else(|| m.no_queue(slot))?;
        let o = m.ref_if_made_here(slot, &r.0)?;
        m.check_range(slot, "reservation", r.size(), offset, len)?;
        m.check_handle_made_here(slot, stream.mechanism_key, "stream")?;
        let mut out = 0u64;
        m.call(slot, f, (o, offset, len, stream.handle, &mut out))?;
        m.queued_fence(slot, out)
    }
}

impl SharedMappingApi<'_> {
    /// [`map`](Self::map) enqueued on `stream`: the fence completes once the
    /// mapping is usable. `Unsupported` without queued binding.
    #[allow(clippy::too_many_arguments)]
    pub fn map_on(
        &self,
        object: &PhysicalObject,
        object_offset: u64,
        r: &Reservation,
        offset: u64,
        len: u64,
        access: Access,
        stream: &Stream,
    ) -> Result<Fence, CallError> {
        const SLOT: &str = "shared_mapping.map_on";
        let m = self.m;
        let f = self.vt.map_on.ok_or_else(|| m.no_queue(SLOT))?;
        let o = m.ref_if_made_here(SLOT, &object.0)?;
        let res = m.ref_if_made_here(SLOT, &r.0)?;
        m.check_range(SLOT, "physical object", object.size(), object_offset, len)?;
        m.check_range(SLOT, "reservation", r.size(), offset, len)?;
        m.check_handle_made_here(SLOT, stream.mechanism_key, "stream")?;
        let mut out = 0u64;
        m.call(SLOT, f, (o, object_offset, res, offset, len, access.bits(), stream.handle, &mut out))?;
        m.queued_fence(SLOT, out)
    }

    /// [`unmap`](Self::unmap) enqueued on `stream`.
    pub fn unmap_on(
        &self,
        r: &Reservation,
        offset: u64,
        len: u64,
        stream: &Stream,
    ) -> Result<Fence, CallError> {
        const SLOT: &str = "shared_mapping.unmap_on";
        let m = self.m;
        let f = self.vt.unmap_on.ok_or_else(|| m.no_queue(SLOT))?;
        let res = m.ref_if_made_here(SLOT, &r.0)?;
        m.check_range(SLOT, "reservation", r.size(), offset, len)?;
        m.check_handle_made_here(SLOT, stream.mechanism_key, "stream")?;
        let mut out = 0u64;
        m.call(SLOT, f, (res, offset, len, stream.handle, &mut out))?;
        m.queued_fence(SLOT, out)
    }
}

/// Whether `e` is the refusal of a queued operation's fence (see
/// `queued_fence`): the plugin accepted the operation, which may still run
/// on its stream, but returned no fence the host can wait on. Every other
/// refusal of a queued slot means nothing was enqueued.
pub fn accepted_unfenced(e: &CallError) -> bool {
    e.raw == MEMPLUG_STATUS_OK
}

impl SyncApi<'_> {
    /// Later work on `stream` waits for `fence` (of this mechanism), without
    /// blocking the caller. `Unsupported` when the plugin does not publish
    /// `stream_wait_fence` (ABI 1.2, optional).
    pub fn stream_wait_fence(&self, stream: &Stream, fence: &Fence) -> Result<(), CallError> {
        const SLOT: &str = "sync.stream_wait_fence";
        let m = self.m;
        let f = self.vt.stream_wait_fence.ok_or_else(|| {
            m.refuse(
                SLOT,
                Status::Unsupported,
                "the plugin does not publish stream_wait_fence (ABI 1.2)".into(),
            )
        })?;
        m.check_handle_made_here(SLOT, stream.mechanism_key, "stream")?;
        m.check_handle_made_here(SLOT, fence.mechanism_key, "fence")?;
        m.call(SLOT, f, (stream.handle, fence.handle))
    }

    /// Wraps a runtime's native stream made by the API of device kind
    /// `native_kind` (`MEMPLUG_DEVICE_*`).
    ///
    /// # Safety
    /// `native` is a live stream of that API, valid while the returned
    /// stream is.
    pub unsafe fn stream_adopt_typed(
        &self,
        native_kind: u32,
        native: *mut core::ffi::c_void,
    ) -> Result<Stream, CallError> {
        const SLOT: &str = "sync.stream_adopt_typed";
        let m = self.m;
        let f = self.vt.stream_adopt_typed.ok_or_else(|| {
            m.refuse(
                SLOT,
                Status::Unsupported,
                "the plugin does not publish stream_adopt_typed (ABI 1.2)".into(),
            )
        })?;
        let mut out = 0u64;
        m.call(SLOT, f, (native_kind, Opaque(native), &mut out))?;
        m.born(ObjectKind::Stream);
        Ok(Stream { mechanism_key: m.key, handle: out })
    }
}

/// Peer access of a mechanism (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`): which
/// devices may reach its memory, and granting or revoking it per range.
#[derive(Clone, Copy)]
pub struct PeerAccessApi<'m> {
    pub(super) m: &'m MechanismInner,
    pub(super) vt: &'m MemplugPeerAccess,
}

impl PeerAccessApi<'_> {
    /// The access `peer` can be given (`None`: none).
    pub fn can_access_peer(&self, peer: MemplugDevice) -> Result<Option<Access>, CallError> {
        const SLOT: &str = "peer_access.can_access_peer";
        let mut out = 0u32;
        self.m.call(SLOT, slot!(self.vt.can_access_peer), (&peer, &mut out))?;
        match out {
            0 => Ok(None),
            bits => Access::from_bits(bits).map(Some).ok_or_else(|| {
                // Write without read, or bits no minor defines: an answer
                // the host cannot act on is the plugin's fault, never read
                // as "no access" (a caller would then skip a peer that has
                // some access, or grant what was never said).
                self.m.refuse(
                    SLOT,
                    Status::Internal,
                    format!(
                        "the plugin answered access bits {bits:#x} for {peer:?}: neither 0 (none), READ nor \
                         READ|WRITE"
                    ),
                )
            }),
        }
    }

    /// Sets what `peer` may do with `[offset, offset + len)` of `r`
    /// (`None` revokes). Like a decommit, it must not race the peer's work
    /// still using the range.
    pub fn set_peer_access(
        &self,
        r: &Reservation,
        offset: u64,
        len: u64,
        peer: MemplugDevice,
        access: Option<Access>,
    ) -> Result<(), CallError> {
        const SLOT: &str = "peer_access.set_peer_access";
        let m = self.m;
        let o = m.ref_if_made_here(SLOT, &r.0)?;
        m.check_range(SLOT, "reservation", r.size(), offset, len)?;
        let bits = access.map_or(0, Access::bits);
        m.call(SLOT, slot!(self.vt.set_peer_access), (o, offset, len, &peer, bits))
    }
}
