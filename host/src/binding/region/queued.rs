//! What plugin ABI 1.2 adds to a [`Region`]: giving a peer device access
//! to a range of it (`MEMPLUG_CAP_PEER_ACCESS`: `set_peer_access`), and
//! growing it as a queue operation on a stream
//! (`MEMPLUG_CAP_QUEUED_BINDING`: `commit_on`), with a fence that says
//! when the new range is usable. Both refuse, with nothing changed, on a
//! mechanism without the capability.

use super::super::BindingError;
use super::offload::never_known;
use super::Region;
use crate::fence::{PluginFence, SharedFence};
use crate::mechanism::{accepted_unfenced, Access};
use crate::sync::lock;
use crate::tokens::Stream;
use memplug_sdk::abi::MemplugDevice;
use memplug_sdk::Status;
use std::sync::Arc;

/// Access `set_peer_access` gave `peer` to a range of a region
/// (`access` is never `None` in the list: a revoke removes).
#[derive(Clone, Copy, Debug)]
pub(super) struct PeerGrant {
    offset: u64,
    len: u64,
    peer: MemplugDevice,
    access: Option<Access>,
}

impl Region {
    /// Sets what device `peer` may do with `[offset, offset + len)` of the
    /// region (offsets from its base, the prefix included): `Some(access)`
    /// grants, `None` revokes. The range must lie within the usable bytes
    /// ([`len`](Self::len): the mapped prefix and the committed private
    /// part), be non-empty, not overflow, and be aligned to the
    /// mechanism's granularity (`OutOfRange` otherwise). Write access to a
    /// prefix mapped read-only is refused (`Invalid`: the prefix's bytes
    /// are every region's). A range whose queued commit
    /// ([`grow_on`](Self::grow_on)) has not completed is `Busy`.
    ///
    /// A mechanism without peer access (`MEMPLUG_CAP_PEER_ACCESS`, plugin
    /// ABI 1.2) refuses with [`BindingError::Unsupported`]. Nothing is
    /// charged; nothing changes on refusal. Like a decommit, a revoke must
    /// not race the peer's work still using the range: that is the
    /// caller's to order.
    ///
    /// The grant (or revoke) is remembered per range: a driver forgets a
    /// range's access when it is decommitted or unmapped, so every later
    /// recommit or remap of it by the region (a grow after a shrink, a
    /// restore, a privatise) gives the access back. A range committed by
    /// [`grow_on`](Self::grow_on) is the exception until its fence
    /// completes: grant it then.
    pub fn set_peer_access(
        &mut self,
        offset: u64,
        len: u64,
        peer: MemplugDevice,
        access: Option<Access>,
    ) -> Result<(), BindingError> {
        self.resident("set peer access")?;
        let b = &*self.binding;
        let m = b.mechanism();
        let pa = m
            .peer_access()
            .ok_or_else(|| b.unsupported("peer access (MEMPLUG_CAP_PEER_ACCESS, plugin ABI 1.2)"))?;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(BindingError::Plugin(m.refusal(
                "binding",
                Status::OutOfRange,
                format!(
                    "peer access range +{offset:#x} len {len:#x} is empty, overflowing, or past the \
                     region's {:#x} usable bytes (prefix {:#x} + committed {:#x})",
                    self.len(),
                    self.base,
                    self.committed
                ),
            )));
        }
        if access == Some(Access::ReadWrite) && offset < self.base && self.prefix_is_read_only() {
            return Err(BindingError::Invalid(format!(
                "range +{offset:#x} len {len:#x} overlaps the shared prefix (+0x0 len {:#x}), mapped \
                 read-only: a peer cannot be given write access to it",
                self.base
            )));
        }
        self.not_queued(offset, len)?;
        pa.set_peer_access(self.res(), offset, len, peer, access)?;
        self.remember_grant(PeerGrant { offset, len, peer, access });
        Ok(())
    }

    /// Records what `set_peer_access` set on a range: what `peer` had
    /// there before is replaced (a revoke leaves nothing).
    fn remember_grant(&mut self, g: PeerGrant) {
        let end = g.offset + g.len;
        let mut kept = Vec::with_capacity(self.peer_grants.len() + 2);
        for old in self.peer_grants.drain(..) {
            let old_end = old.offset + old.len;
            if old.peer != g.peer || old_end <= g.offset || end <= old.offset {
                kept.push(old);
                continue;
            }
            if old.offset < g.offset {
                kept.push(PeerGrant { len: g.offset - old.offset, ..old });
            }
            if end < old_end {
                kept.push(PeerGrant { offset: end, len: old_end - end, ..old });
            }
        }
        if g.access.is_some() {
            kept.push(g);
        }
        self.peer_grants = kept;
    }

    /// Gives the remembered peer access back to `[offset, offset + len)`,
    /// just committed or mapped again: a driver's access setting belongs
    /// to a mapping and goes with its unmap or decommit (CUDA's
    /// `cuMemSetAccess`), so shrink-and-grow, offload-and-restore and
    /// privatise would otherwise drop a peer's access silently.
    pub(super) fn reapply_peers(&self, offset: u64, len: u64) -> Result<(), BindingError> {
        if self.peer_grants.is_empty() {
            return Ok(());
        }
        let Some(pa) = self.binding.mechanism().peer_access() else { return Ok(()) };
        let end = offset + len;
        for g in &self.peer_grants {
            let (from, to) = (g.offset.max(offset), (g.offset + g.len).min(end));
            if from < to {
                pa.set_peer_access(self.res(), from, to - from, g.peer, g.access)?;
            }
        }
        Ok(())
    }

    /// A range whose queued commit has not completed is not touched by a
    /// synchronous call yet: `Busy`. Completed commits are forgotten here
    /// (a query that fails keeps its entry: never decide on a guess).
    fn not_queued(&self, offset: u64, len: u64) -> Result<(), BindingError> {
        let end = offset + len;
        let busy = self
            .queued_commits
            .iter()
            .find(|(o, l, f)| *o < end && offset < o + l && !matches!(f.query(), Ok(true)));
        match busy {
            None => Ok(()),
            Some((o, l, f)) => Err(BindingError::Plugin(self.binding.mechanism().refusal(
                "binding",
                Status::Busy,
                format!(
                    "range +{o:#x} ({l:#x} B) was committed on a stream and its fence ({}) has not \
                     completed: wait for it first",
                    f.describe()
                ),
            ))),
        }
    }

    /// Grows the usable length to at least `len` bytes (rounded up to the
    /// granularity) as a queue operation on `stream` (`commit_on`): the
    /// commit runs after the work already on `stream`, and the returned
    /// fence completes once the new range is usable — wait on it, or order
    /// other work behind it (`SyncApi::stream_wait_fence`). The region's
    /// own release and later shrinks wait for it too.
    ///
    /// The new bytes are charged before the commit is enqueued (the grant
    /// is committed into the region's lease) and refunded at once if the
    /// plugin refuses it: after the call the charge is exactly the
    /// region's committed bytes. [`len`](Self::len) and [`committed`](Self::committed) count
    /// the range at once; until the fence completes it is not usable, and
    /// [`set_peer_access`](Self::set_peer_access) on it is `Busy`.
    ///
    /// A `len` at or below the current length commits nothing: the fence
    /// is then one recorded on `stream` (complete once the work already on
    /// it has run). Beyond the reservation is [`BindingError::Invalid`]; a
    /// range whose deferred decommit has not run is `Busy`, as for
    /// [`grow_to`](Self::grow_to). A mechanism without queued binding
    /// (`MEMPLUG_CAP_QUEUED_BINDING`, plugin ABI 1.2) refuses with
    /// [`BindingError::Unsupported`]; nothing is charged or changed on
    /// any refusal. There is no update callback: the view is not usable
    /// when this returns.
    pub fn grow_on(&mut self, len: u64, stream: &Stream) -> Result<Arc<PluginFence>, BindingError> {
        self.resident("grow")?;
        let b = self.binding.clone();
        let m = b.mechanism();
        if !m.capabilities().queued_binding() || m.sync().is_none() {
            return Err(b.unsupported("queued binding (MEMPLUG_CAP_QUEUED_BINDING, plugin ABI 1.2)"));
        }
        if len <= self.len() {
            return Ok(PluginFence::record_typed(m, stream)?);
        }
        let (want, offset, delta) = self.growth(len)?;
        let vb = m.virtual_backing().expect("checked at reserve");
        let grant = b.grant(delta)?;
        // The charge, its ledger entry and (on refusal) its refund are made
        // under one gate token, as in `grow_to`.
        let (_token, stripe) = b.admit().map_err(|state| b.ended(state))?;
        let new_lease = {
            let mut slot = lock(&self.shared.lease);
            let new_lease = slot.is_none();
            let charged = match slot.as_mut() {
                Some(l) => grant.commit_into(l, delta).map(|()| None),
                None => grant.commit(delta).map(Some),
            };
            match charged {
                Ok(Some(l)) => *slot = Some(l),
                Ok(None) => {}
                Err(r) => return Err(r.error.clone().into()),
            }
            new_lease
        };
        b.ledger.charged(stripe, delta, u64::from(new_lease));
        let token = match vb.commit_on(self.res(), offset, delta, stream) {
            Ok(f) => f,
            Err(e) if accepted_unfenced(&e) => {
                drop(_token);
                self.undo_unfenced_commit(offset, delta, stream, &e);
                return Err(e.into());
            }
            Err(e) => {
                // Nothing was enqueued: the charge goes back.
                let mut slot = lock(&self.shared.lease);
                if new_lease {
                    if let Some(l) = slot.take() {
                        if b.pool.release(l).is_ok() {
                            b.ledger.refunded(stripe, delta, 1);
                        }
                    }
                } else if let Some(l) = slot.as_mut() {
                    if b.pool.release_part(l, delta).is_ok() {
                        b.ledger.refunded(stripe, delta, 0);
                    }
                }
                return Err(e.into());
            }
        };
        let fence = PluginFence::from_queued(m, token, stream);
        let shared: SharedFence = fence.clone();
        self.committed = want;
        self.queued_commits.retain(|(_, _, f)| !matches!(f.query(), Ok(true)));
        self.queued_commits.push((offset, delta, shared.clone()));
        // The range may be in use until the commit has run: a shrink of it
        // and the region's release wait for the fence (invariant 4).
        self.add_fences([shared]);
        Ok(fence)
    }

    /// The plugin accepted a queued commit of `[offset, offset + len)` (it
    /// may still run on `stream`) but returned a fence it cannot have
    /// recorded, which was refused (`e`). The grow is refused; the range,
    /// already charged, is given back as a shrink is: decommitted and
    /// refunded by a deferred job behind a fence the host records on
    /// `stream` after the commit (a queued operation is work on its
    /// stream, so that fence completes after it), and not committable
    /// again until then (`BUSY`). Nothing is freed on a guess: if no fence
    /// can be recorded either, the job waits behind one that never
    /// completes while the context lives (the range stays charged, the
    /// quarantine list says why) and answers DEVICE_LOST once it is lost,
    /// when the termination settles the charge.
    fn undo_unfenced_commit(&mut self, offset: u64, len: u64, stream: &Stream, e: &crate::error::CallError) {
        let m = self.binding.mechanism();
        let fence = match PluginFence::record(m, stream) {
            Ok(f) => f,
            Err(r) if r.status == Status::DeviceLost => never_known(m),
            Err(r) => {
                lock(&self.binding.quarantine).push(format!(
                    "region range +{offset:#x} ({len} B) kept charged: {e}; and no fence could be recorded \
                     behind it ({r})"
                ));
                never_known(m)
            }
        };
        self.add_fences([fence.clone()]);
        self.queue_decommit(offset, len, vec![fence]);
    }
}
