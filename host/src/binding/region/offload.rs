//! Offload and restore: a region's private bytes moved to host memory (or
//! any memory another binding hands out) and brought back later at the
//! same device address, so every pointer into the region, a tensor
//! binding or a captured graph, stays valid.
//!
//! Both are made of steps the ABI already has, ordered by the 1.3
//! stream-ordered copy: offload copies each private range out on a stream
//! of the region's mechanism, waits for the copy's fence, then decommits
//! the ranges and refunds their charge; restore recommits them, copies the
//! bytes back and returns the fence after which they are there. Either
//! fails with the old state kept: a refused step undoes the ones before it,
//! nothing is charged twice, and host memory a copy may still write is
//! freed only behind that copy's fence.
//!
//! What is private: the committed part after the prefix, and the parts of
//! the prefix made private with [`Region::privatise`]. The shared prefix
//! stays mapped (other regions read it; it is charged once, to its own
//! lease).

use super::super::settle::{self, Charge};
use super::super::{BindingError, MemoryBinding, OwnedAllocation};
use super::Region;
use crate::fence::{FnFence, MechanismFence, PluginFence, SharedFence};
use crate::mechanism::{Mechanism, SyncApi};
use crate::sync::lock;
use crate::tokens::Stream;
use memplug_sdk::abi::{
    MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA_HOST, MEMPLUG_DEVICE_ROCM_HOST, MEMPLUG_LOCATION_HOST,
    MEMPLUG_LOCATION_NUMA_NODE,
};
use memplug_sdk::Status;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a region's private bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// Committed on the region's device (the normal state).
    Device,
    /// Held in host memory by [`Region::offload_to`]: `bytes` at `addr`,
    /// an allocation of the target binding (charged to its pool). Nothing
    /// may touch the device range until [`Region::restore`].
    Host {
        /// The first byte of the host copy.
        addr: u64,
        /// Private bytes held there.
        bytes: u64,
    },
}

/// What [`Region::offload_to`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadReport {
    /// Device bytes decommitted and refunded to the region's pool: the
    /// answer a holder gives a pressure ticket.
    pub released: u64,
    /// Device bytes the mechanism refused to decommit: still committed
    /// and charged (their bytes stay where they are; restore keeps them).
    pub kept: u64,
    /// The plugin's refusals, one per range kept.
    pub refusals: Vec<String>,
}

/// The state of an offloaded region.
pub(super) struct Offloaded {
    /// The host copy (none when there was nothing private to copy).
    host: Option<OwnedAllocation>,
    /// Ranges decommitted, as `(offset in the region, len, offset in the
    /// host copy)`.
    moved: Vec<(u64, u64, u64)>,
    bytes: u64,
}

impl Region {
    /// Where the private bytes are now.
    pub fn residence(&self) -> Residence {
        match &self.offloaded {
            None => Residence::Device,
            Some(o) => {
                Residence::Host { addr: o.host.as_ref().map_or(0, OwnedAllocation::addr), bytes: o.bytes }
            }
        }
    }

    /// Bytes from the base that are on the device now: all usable bytes,
    /// or, while offloaded, the shared prefix up to its first private
    /// range (what a DLPack export may view).
    pub(crate) fn device_len(&self) -> u64 {
        match &self.offloaded {
            None => self.len(),
            Some(_) => self.privatised.first().map_or(self.base, |r| r.0),
        }
    }

    /// Refuses `what` while the private bytes are offloaded.
    pub(super) fn resident(&self, what: &str) -> Result<(), BindingError> {
        match &self.offloaded {
            None => Ok(()),
            Some(o) => Err(BindingError::State(format!(
                "cannot {what}: the region's {} private bytes are offloaded to host memory; restore it \
                 first",
                o.bytes
            ))),
        }
    }

    /// The private ranges, as `(offset, len)`: the privatised parts of the
    /// prefix, then the committed part after it.
    pub(super) fn private_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges = self.privatised.clone();
        if self.committed > 0 {
            ranges.push((self.base, self.committed));
        }
        ranges
    }

    /// Moves the private bytes to memory of `target` (a host-memory
    /// binding, possibly of another mechanism: on CUDA the device's pinned
    /// host mechanism), at the same device address later
    /// ([`restore`](Self::restore)).
    ///
    /// Steps: wait (up to `timeout`) for the work recorded on the region
    /// ([`used_by`](Self::used_by), queued grows) → allocate the host copy
    /// from `target` (charged to its pool) → copy each private range out on
    /// `stream` (a stream of the region's mechanism) → wait for the copy's
    /// fence (the rest of `timeout`) → decommit the ranges and refund them
    /// to the region's pool. Returns what was released: the device bytes
    /// actually decommitted.
    ///
    /// Any failure before the decommit leaves the region as it was: the
    /// host copy is freed (behind the copy's fence when a copy may still be
    /// writing it), nothing stays charged twice. A range whose decommit the
    /// plugin refuses stays committed and charged, with its bytes in
    /// place, and is reported in [`OffloadReport::kept`]; when no range
    /// could be decommitted, the offload is undone and the refusal
    /// returned.
    ///
    /// Refused, with nothing changed: an offloaded region (`State`); a
    /// mechanism without the copy, or whose copy does not reach `target`'s
    /// memory (`Unsupported`); work on the region not complete within
    /// `timeout`, and the copy not complete within it (`Busy`).
    pub fn offload_to(
        &mut self,
        target: &MemoryBinding,
        stream: &Stream,
        timeout: Duration,
    ) -> Result<OffloadReport, BindingError> {
        if self.offloaded.is_some() {
            return Err(BindingError::State("the region is already offloaded".into()));
        }
        let deadline = Instant::now() + timeout;
        let b = self.binding.clone();
        let m = b.mechanism();
        let sync = copier(&b, m, target.mechanism(), "offload")?;
        self.settle_work(deadline, timeout)?;
        let ranges = self.private_ranges();
        let bytes: u64 = ranges.iter().map(|r| r.1).sum();
        if bytes == 0 {
            self.offloaded = Some(Box::new(Offloaded { host: None, moved: Vec::new(), bytes: 0 }));
            return Ok(OffloadReport { released: 0, kept: 0, refusals: Vec::new() });
        }
        // Aligned to the target's granule where it has one (a page of host
        // memory: what DMA engines and page accounting work in).
        let props = target.mechanism().properties();
        let align = props.granularity.max(props.min_alignment).min(props.max_alignment).max(1);
        let host = target.allocate(bytes, align)?;
        let mut layout = Vec::with_capacity(ranges.len());
        let mut at = 0;
        for &(offset, len) in &ranges {
            // SAFETY: the source is committed memory of the region (its
            // private ranges), idle since `settle_work`; the destination is
            // the host copy, which nothing else reaches and which is freed
            // only behind a fence recorded after this copy.
            if let Err(e) = unsafe { sync.copy(stream, host.addr() + at, self.addr() + offset, len) } {
                let behind = if layout.is_empty() { None } else { Some(after_copies(m, &sync, stream)) };
                self.give_up_copy(host, behind);
                return Err(e.into());
            }
            layout.push((offset, len, at));
            at += len;
        }
        let fence = match after_copies(m, &sync, stream) {
            Ok(f) => f,
            Err(e) => {
                // A loss met here is the answer (DEVICE_LOST), not the
                // fence that could not be recorded because of it.
                let answer = if is_loss(m, &e) {
                    BindingError::Plugin(e.clone())
                } else {
                    BindingError::Plugin(m.refusal("binding", Status::Internal, e.to_string()))
                };
                self.give_up_copy(host, Some(Err(e)));
                return Err(answer);
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match fence.wait(left) {
            Ok(true) => {}
            Ok(false) => {
                self.give_up_copy(host, Some(Ok(fence.clone())));
                return Err(busy(
                    m,
                    format!(
                        "the copy of {bytes} B to host memory ({}) did not complete within {timeout:?}: the \
                         region stays on the device",
                        fence.describe()
                    ),
                ));
            }
            Err(e) => {
                self.give_up_copy(host, Some(Ok(fence)));
                return Err(e.into());
            }
        }
        let (token, stripe) = b.admit().map_err(|state| b.ended(state))?;
        let vb = m.virtual_backing().expect("checked at reserve");
        // A range whose decommit is refused stays committed and charged,
        // with its bytes in place: restore leaves it as it is.
        let (mut moved, mut kept_bytes, mut refusals) = (Vec::new(), 0, Vec::new());
        for (offset, len, at) in layout {
            match vb.decommit(self.res(), offset, len) {
                Ok(()) => moved.push((offset, len, at)),
                Err(e) => {
                    refusals.push(format!("range +{offset:#x} ({len} B) kept on the device: {e}"));
                    kept_bytes += len;
                }
            }
        }
        let released: u64 = moved.iter().map(|r| r.1).sum();
        if released == 0 {
            drop(token);
            drop(host); // the copy has completed: nothing writes it now
            return Err(BindingError::State(format!(
                "offload undone, the region stays on the device: {}",
                refusals.join("; ")
            )));
        }
        self.refund_part(released, stripe);
        drop(token);
        self.offloaded = Some(Box::new(Offloaded { host: Some(host), moved, bytes }));
        Ok(OffloadReport { released, kept: kept_bytes, refusals })
    }

    /// Brings offloaded bytes back at the same addresses: grant → recommit
    /// the decommitted ranges → copy each back on `stream` → charge.
    /// Returns the fence after which the bytes are in place: order device
    /// work behind it (work later on `stream` already is). The host copy is
    /// freed behind that fence; the region's release, later shrinks and
    /// peer-access changes wait for it too.
    ///
    /// Any failure leaves the region offloaded, its host copy intact, and
    /// the charge as it was (ranges already recommitted are decommitted
    /// again, behind the fence of any copy already enqueued into them).
    /// Refused: a region that is not offloaded (`State`); the pool's
    /// budget (`Budget`), as for a grow.
    pub fn restore(&mut self, stream: &Stream) -> Result<SharedFence, BindingError> {
        let Some(off) = self.offloaded.take() else {
            return Err(BindingError::State("the region is not offloaded".into()));
        };
        match self.restore_from(&off, stream) {
            Ok(fence) => {
                // Behind this restore's copies, and behind those of an
                // earlier, undone restore (in the region's fences).
                if let Some(host) = off.host {
                    host.release_after(self.fences.iter().cloned().chain([fence.clone()]));
                }
                Ok(fence)
            }
            Err(e) => {
                self.offloaded = Some(off);
                Err(e)
            }
        }
    }

    fn restore_from(&mut self, off: &Offloaded, stream: &Stream) -> Result<SharedFence, BindingError> {
        let b = self.binding.clone();
        let m = b.mechanism();
        let Some(host) = &off.host else {
            // Nothing was private: nothing to bring back.
            return Ok(FnFence::new("nothing to restore", || true, |_| true));
        };
        let sync = copier(&b, m, host.binding_inner().mechanism(), "restore")?;
        for &(offset, len, _) in &off.moved {
            self.wait_out_pending(offset, len)?;
        }
        let bytes: u64 = off.moved.iter().map(|r| r.1).sum();
        let vb = m.virtual_backing().expect("checked at reserve");
        let grant = b.grant(bytes)?;
        let (token, stripe) = b.admit().map_err(|state| b.ended(state))?;
        for (k, &(offset, len, _)) in off.moved.iter().enumerate() {
            let given = vb.commit(self.res(), offset, len).map_err(BindingError::from).and_then(|()| {
                // Peer access went with the decommit: give it back.
                self.reapply_peers(offset, len).inspect_err(|_| {
                    let _ = vb.decommit(self.res(), offset, len);
                })
            });
            if let Err(e) = given {
                for &(o, l, _) in &off.moved[..k] {
                    let _ = vb.decommit(self.res(), o, l);
                }
                return Err(e);
            }
        }
        self.charge_grant(grant, bytes, stripe)?;
        drop(token);
        for (k, &(offset, len, at)) in off.moved.iter().enumerate() {
            // SAFETY: the destination was committed above and nothing uses
            // it yet; the source is the host copy, kept until a fence
            // recorded after this copy.
            if let Err(e) = unsafe { sync.copy(stream, self.addr() + offset, host.addr() + at, len) } {
                self.undo_restore(&off.moved, k, &sync, stream);
                return Err(e.into());
            }
        }
        let fence = match after_copies(m, &sync, stream) {
            Ok(f) => f,
            Err(e) => {
                self.undo_restore(&off.moved, off.moved.len(), &sync, stream);
                return Err(e.into());
            }
        };
        for &(offset, len, _) in &off.moved {
            self.queued_commits.push((offset, len, fence.clone()));
        }
        self.add_fences([fence.clone()]);
        Ok(fence)
    }

    /// Undoes a restore whose `copied` first copies were enqueued: the
    /// recommitted ranges are decommitted again and refunded, behind the
    /// fence of those copies (they may still be writing them) — now when
    /// none was enqueued. The region's own fences take that fence too, so
    /// the host copy those copies read outlives them (see `Drop`).
    fn undo_restore(
        &mut self,
        moved: &[(u64, u64, u64)],
        copied: usize,
        sync: &SyncApi<'_>,
        stream: &Stream,
    ) {
        let m = self.binding.mechanism();
        let fences = if copied == 0 {
            Vec::new()
        } else {
            match after_copies(m, sync, stream) {
                Ok(f) => vec![f],
                // No way to know when the copies are done: wait for the
                // stream's work as the region's release does, behind the
                // region's own fences (never free on a guess).
                Err(_) => vec![never_known(m)],
            }
        };
        self.add_fences(fences.iter().cloned());
        for &(offset, len, _) in moved {
            self.queue_decommit(offset, len, fences.clone());
        }
    }

    /// Waits, up to `deadline`, for the work recorded on the region (fences
    /// of `used_by`, queued grows) to complete: a copy on one stream is not
    /// ordered after work on another.
    pub(super) fn settle_work(&mut self, deadline: Instant, timeout: Duration) -> Result<(), BindingError> {
        let m = self.binding.mechanism();
        for f in self.fences.iter().chain(self.queued_commits.iter().map(|q| &q.2)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if !f.wait(left)? {
                return Err(busy(
                    m,
                    format!("work on the region ({}) did not complete within {timeout:?}", f.describe()),
                ));
            }
        }
        self.fences.clear();
        self.queued_commits.clear();
        Ok(())
    }

    /// Refunds `bytes` of the region's lease (a decommit that ran).
    pub(super) fn refund_part(&self, bytes: u64, stripe: usize) {
        settle::refund(&self.binding, Charge::Part { slot: &self.shared.lease, bytes }, stripe);
    }
}

/// The sync capability of the region's mechanism `m`, checked to copy
/// between its own memory and `other`'s.
pub(super) fn copier<'m>(
    b: &super::super::BindingInner,
    m: &'m Mechanism,
    other: &Mechanism,
    what: &str,
) -> Result<SyncApi<'m>, BindingError> {
    let sync = m.sync().ok_or_else(|| b.unsupported("sync (a stream-ordered copy)"))?;
    if !sync.can_copy() {
        return Err(b.unsupported("copy (the stream-ordered copy of plugin ABI 1.3)"));
    }
    let kinds = sync.copy_kinds();
    let (reaches, space) = if m.key() == other.key() {
        (kinds.device(), "its own memory (MEMPLUG_COPY_DEVICE)")
    } else if is_host_memory(other) {
        (kinds.host(), "host memory (MEMPLUG_COPY_HOST)")
    } else {
        (kinds.peer(), "another device's memory (MEMPLUG_COPY_PEER)")
    };
    if !reaches {
        return Err(BindingError::Plugin(m.refusal(
            "binding",
            Status::Unsupported,
            format!(
                "cannot {what}: {} copies between {}, not {space} of {}",
                m.label(),
                kinds.names().join(" | "),
                other.label()
            ),
        )));
    }
    Ok(sync)
}

/// Whether `m` hands out host memory: its descriptor says so, or its
/// device is a host kind.
fn is_host_memory(m: &Mechanism) -> bool {
    let location = m.properties().descriptor.location.kind;
    location == MEMPLUG_LOCATION_HOST
        || location == MEMPLUG_LOCATION_NUMA_NODE
        || matches!(
            m.device().0.kind,
            MEMPLUG_DEVICE_CPU | MEMPLUG_DEVICE_CUDA_HOST | MEMPLUG_DEVICE_ROCM_HOST
        )
}

/// A fence that completes once the copies enqueued on `stream` so far have
/// run: one the mechanism records, or, when it refuses to record one, a
/// host function enqueued behind them that sets a flag.
pub(super) fn after_copies(
    m: &Mechanism,
    sync: &SyncApi<'_>,
    stream: &Stream,
) -> Result<SharedFence, crate::error::CallError> {
    let recorded = PluginFence::record(m, stream);
    let Err(refused) = recorded else { return recorded };
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    if sync.enqueue(stream, move || flag.store(true, Ordering::Release)).is_err() {
        return Err(refused);
    }
    // A host function on a lost device may never run: the fence then
    // answers DEVICE_LOST instead of keeping what waits on it forever.
    Ok(MechanismFence::shared(m, "host function after a copy".into(), move || done.load(Ordering::Acquire)))
}

/// A fence no query reports complete while the mechanism's context admits
/// calls (for memory a copy may still write when no fence could be placed
/// behind it): what waits on it stays allocated and charged, and the
/// queue's statistics show it pending. Once the context is lost or
/// terminated it answers DEVICE_LOST, which frees what waited on it: the
/// copy went with the device (a healthy pool's host copy is not kept
/// charged for ever by a device that is gone).
pub(super) fn never_known(m: &Mechanism) -> SharedFence {
    MechanismFence::shared(m, "unfenced copy".into(), || false)
}

/// Whether `e` says the mechanism's context is gone (a loss the caller
/// should hear as `DEVICE_LOST`, not as the step that met it).
pub(super) fn is_loss(m: &Mechanism, e: &crate::error::CallError) -> bool {
    e.status == Status::DeviceLost || !m.life_state().admits_calls()
}

impl Region {
    /// At the region's release: its host copy, if offloaded, is freed
    /// behind the region's fences (copies of an undone restore may still
    /// read it).
    pub(super) fn release_host_copy(&mut self) {
        if let Some(host) = self.offloaded.take().and_then(|o| o.host) {
            host.release_after(self.fences.iter().cloned());
        }
    }

    /// Gives up the host copy of a failed offload. `behind` is the fence
    /// after the copies already enqueued between it and the region (`None`:
    /// none was enqueued, so it is freed now). Both the host copy and the
    /// region wait for that fence: the copies read one and write the other.
    /// Without a fence (the plugin refused to place one), neither is ever
    /// freed: both wait behind a fence that never completes (the queue
    /// shows it pending), and the binding's quarantine list says why.
    fn give_up_copy(
        &mut self,
        host: OwnedAllocation,
        behind: Option<Result<SharedFence, crate::error::CallError>>,
    ) {
        let fence = match behind {
            None => return drop(host),
            Some(Ok(f)) => f,
            // The device is gone: the copies went with it, and the fence
            // says so (DEVICE_LOST) at once; no note, nothing kept.
            Some(Err(e)) if is_loss(self.binding.mechanism(), &e) => never_known(self.binding.mechanism()),
            Some(Err(e)) => {
                lock(&self.binding.quarantine).push(format!(
                    "host copy of {} B at {:#x} and region {:#x} kept: a copy between them may still run and no \
                     fence could be placed behind it ({e})",
                    host.size(),
                    host.addr(),
                    self.addr()
                ));
                never_known(self.binding.mechanism())
            }
        };
        host.release_after([fence.clone()]);
        self.add_fences([fence]);
    }
}

fn busy(m: &Mechanism, message: String) -> BindingError {
    BindingError::Plugin(m.refusal("binding", Status::Busy, message))
}
