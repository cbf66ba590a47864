//! Copy-on-write of a shared prefix: [`Region::privatise`] replaces a
//! granule-aligned range of the prefix, in this region only, by private
//! committed memory holding a copy of the same bytes; the rest of the
//! prefix stays shared. An LLM server does this for the prefix's last
//! block when a request's prompt diverges inside it.
//!
//! The ABI maps a physical object only as whole earlier mappings (an
//! unmap names exactly one), so the piece of the prefix that holds the
//! range is unmapped and mapped again around it; the bytes are copied, on
//! a stream, from a second, temporary view of the same object. Each step
//! is undone, in reverse, when a later one fails.

use super::super::{BindingError, BindingInner};
use super::offload::{after_copies, copier, is_loss, never_known};
use super::Region;
use crate::deferred::{Retire, RetireOutcome};
use crate::error::LostCheck;
use crate::fence::SharedFence;
use crate::mechanism::{SharedMappingApi, VirtualBackingApi};
use crate::sync::lock;
use crate::tokens::{PhysicalObject, Reservation, Stream};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Region {
    /// Gives this region a private copy of `[offset, offset + len)` of its
    /// shared prefix (offsets from the region's base, aligned to the
    /// mechanism's granularity): private memory is committed there,
    /// charged to the region's pool, and filled on `stream` with the
    /// prefix's bytes; every other region keeps reading the shared ones.
    /// Returns the fence after which the private bytes are in place (device
    /// work later on `stream` is already ordered after it); writes through
    /// this region then change only its own copy.
    ///
    /// Waits (up to `timeout`) for the work recorded on the region first:
    /// the range is briefly unmapped. The whole change is a transaction:
    /// when any step fails, the mappings, the charge and the bytes are as
    /// they were.
    ///
    /// Refused, with nothing changed: no prefix, or an offloaded region
    /// (`State`); a range that is empty, unaligned, past the prefix, or
    /// not wholly shared (already private in part) (`Invalid`); a
    /// mechanism without the copy, or that maps objects only whole
    /// (`MEMPLUG_PROP_MAPS_AT_OFFSETS` unset) when the range is not a
    /// whole piece starting at the prefix's first byte (`Unsupported`);
    /// the pool's budget (`Budget`); work not complete within `timeout`
    /// (`Busy`).
    pub fn privatise(
        &mut self,
        offset: u64,
        len: u64,
        stream: &Stream,
        timeout: Duration,
    ) -> Result<SharedFence, BindingError> {
        self.resident("privatise part of the prefix")?;
        let Some(prefix) = self.prefix.clone() else {
            return Err(BindingError::State("the region maps no shared prefix".into()));
        };
        let piece = self.piece_holding(offset, len)?;
        let b = self.binding.clone();
        let m = b.mechanism();
        let sm = m.shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        let vb = m.virtual_backing().expect("checked at reserve");
        let whole_from_start = offset == 0 && piece == (0, len);
        if !whole_from_start && !m.properties().descriptor.maps_at_offsets {
            return Err(b.unsupported(
                "mappings at offsets (MEMPLUG_PROP_MAPS_AT_OFFSETS), which privatising part of a prefix needs",
            ));
        }
        let sync = copier(&b, m, m, "privatise")?;
        self.settle_work(Instant::now() + timeout, timeout)?;
        let grant = b.grant(len)?;
        let (token, stripe) = b.admit_new()?;
        let staging = Staging::open(&sm, &vb, prefix.object(), offset, len)?;
        let steps = Steps { region: &*self, sm: &sm, object: prefix.object(), piece, offset, len };
        if let Err(e) = steps.remap_around() {
            staging.close(&b, &sm, &vb);
            return Err(e);
        }
        if let Err(e) = vb.commit(self.res(), offset, len) {
            steps.undo_remap();
            staging.close(&b, &sm, &vb);
            return Err(e.into());
        }
        // The unmap took the piece's peer access with it: give it back to
        // what is mapped or committed there now.
        if let Err(e) = self.reapply_peers(piece.0, piece.1) {
            let _ = vb.decommit(self.res(), offset, len);
            steps.undo_remap();
            staging.close(&b, &sm, &vb);
            return Err(e);
        }
        // Charged before the copy is enqueued: from then on the range may
        // be in use, and an undo refunds it behind the copy's fence.
        if let Err(e) = self.charge_grant(grant, len, stripe) {
            let _ = vb.decommit(self.res(), offset, len);
            steps.undo_remap();
            staging.close(&b, &sm, &vb);
            return Err(e);
        }
        // SAFETY: the destination is the range just committed, which
        // nothing else reaches yet; the source is the staging view of the
        // prefix, read-only, kept until a fence recorded after the copy.
        if let Err(e) = unsafe { sync.copy(stream, self.addr() + offset, staging.addr(), len) } {
            let _ = vb.decommit(self.res(), offset, len);
            self.refund_part(len, stripe);
            steps.undo_remap();
            staging.close(&b, &sm, &vb);
            return Err(e.into());
        }
        drop(token);
        let fence = match after_copies(m, &sync, stream) {
            Ok(f) => f,
            // The copy was enqueued and no fence follows it: the range and
            // the staging view might still be in use, so both stay.
            Err(e) => return self.keep_unfenced(piece, offset, len, staging, e),
        };
        b.queue.release(vec![fence.clone()], Box::new(staging.retire(&b)));
        self.split_piece(piece, offset, len);
        self.queued_commits.push((offset, len, fence.clone()));
        self.add_fences([fence.clone()]);
        Ok(fence)
    }

    /// The still-shared piece of the prefix that holds `[offset, offset +
    /// len)`, checked to be a non-empty, granule-aligned range.
    fn piece_holding(&self, offset: u64, len: u64) -> Result<(u64, u64), BindingError> {
        let g = self.granularity.max(1);
        let end = offset.checked_add(len);
        if len == 0 || offset % g != 0 || len % g != 0 || end.is_none_or(|e| e > self.base) {
            return Err(BindingError::Invalid(format!(
                "range +{offset:#x} len {len:#x} is empty, not aligned to the granularity ({g:#x}), or past \
                 the prefix's {:#x} bytes",
                self.base
            )));
        }
        let end = offset + len;
        self.pieces.iter().copied().find(|&(o, l)| o <= offset && end <= o + l).ok_or_else(|| {
            BindingError::Invalid(format!(
                "range +{offset:#x} len {len:#x} is already private in part (private: {:x?})",
                self.privatised
            ))
        })
    }

    /// The parts of the region still mapped from the shared prefix, as
    /// `(offset, len)` (the prefix less its privatised ranges): when the
    /// prefix is mapped read-only, the bytes a write through would fault on.
    pub(crate) fn shared_pieces(&self) -> &[(u64, u64)] {
        &self.pieces
    }

    /// Records the range as private: its piece is replaced by what is left
    /// of it on either side.
    fn split_piece(&mut self, piece: (u64, u64), offset: u64, len: u64) {
        let (po, pl) = piece;
        self.pieces.retain(|&p| p != piece);
        if offset > po {
            self.pieces.push((po, offset - po));
        }
        if offset + len < po + pl {
            self.pieces.push((offset + len, po + pl - offset - len));
        }
        self.pieces.sort_unstable();
        self.privatised.push((offset, len));
        self.privatised.sort_unstable();
    }

    /// The copy was enqueued and no fence could follow it: the range
    /// stays private (and charged), the staging view stays mapped, with a
    /// quarantine note, as the copy may still read it, and the region's
    /// release waits behind a fence that never completes (the copy may
    /// still write it) — until the context is lost, when that fence
    /// answers DEVICE_LOST and the loss is the error returned.
    fn keep_unfenced(
        &mut self,
        piece: (u64, u64),
        offset: u64,
        len: u64,
        staging: Staging,
        e: crate::error::CallError,
    ) -> Result<SharedFence, BindingError> {
        self.split_piece(piece, offset, len);
        // Lost-aware: once the context is lost the fence answers
        // DEVICE_LOST and the region's release goes ahead (the copy went
        // with the device); until then it never completes.
        self.add_fences([never_known(self.binding.mechanism())]);
        if is_loss(self.binding.mechanism(), &e) {
            // The view went with the device too: nothing to note or keep.
            return Err(e.into());
        }
        lock(&self.binding.quarantine).push(format!(
            "staging view {} of a privatised prefix range kept: no fence could follow its copy ({e})",
            staging.reservation.object_id()
        ));
        // `staging` ends here unreleased: its token is plain data, so the
        // view stays mapped in the plugin and its address is never reused.
        Err(e.into())
    }
}

/// The mapping changes of one privatise, and their undoing.
struct Steps<'a> {
    region: &'a Region,
    sm: &'a SharedMappingApi<'a>,
    object: &'a PhysicalObject,
    piece: (u64, u64),
    offset: u64,
    len: u64,
}

impl Steps<'_> {
    fn left(&self) -> Option<(u64, u64)> {
        (self.offset > self.piece.0).then(|| (self.piece.0, self.offset - self.piece.0))
    }
    fn right(&self) -> Option<(u64, u64)> {
        let (end, piece_end) = (self.offset + self.len, self.piece.0 + self.piece.1);
        (end < piece_end).then(|| (end, piece_end - end))
    }
    fn map(&self, (offset, len): (u64, u64)) -> Result<(), BindingError> {
        let r = self.region;
        Ok(self.sm.map(self.object, offset, r.res(), offset, len, r.prefix_access)?)
    }

    /// Unmaps the piece and maps back what lies on either side of the
    /// range; on a refusal, the piece is mapped whole again.
    fn remap_around(&self) -> Result<(), BindingError> {
        let (po, pl) = self.piece;
        self.sm.unmap(self.region.res(), po, pl)?;
        if let Some(l) = self.left() {
            if let Err(e) = self.map(l) {
                self.restore_piece();
                return Err(e);
            }
        }
        if let Some(r) = self.right() {
            if let Err(e) = self.map(r) {
                if let Some(l) = self.left() {
                    let _ = self.sm.unmap(self.region.res(), l.0, l.1);
                }
                self.restore_piece();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Undoes [`remap_around`](Self::remap_around) (after the range's
    /// commit was undone).
    fn undo_remap(&self) {
        for p in [self.left(), self.right()].into_iter().flatten() {
            let _ = self.sm.unmap(self.region.res(), p.0, p.1);
        }
        self.restore_piece();
    }

    fn restore_piece(&self) {
        // A loss is not a quarantine: the mapping went with the device.
        let back = self.map(self.piece).and_then(|()| self.region.reapply_peers(self.piece.0, self.piece.1));
        if let Err(e) = back.filter_lost() {
            lock(&self.region.binding.quarantine).push(format!(
                "prefix piece +{:#x} ({} B) could not be mapped back after a failed privatise: {e}",
                self.piece.0, self.piece.1
            ));
        }
    }
}

/// A temporary read-only view of the prefix's bytes to copy from, in a
/// reservation of its own.
struct Staging {
    reservation: Reservation,
    len: u64,
}

impl Staging {
    fn open(
        sm: &SharedMappingApi<'_>,
        vb: &VirtualBackingApi<'_>,
        object: &PhysicalObject,
        offset: u64,
        len: u64,
    ) -> Result<Staging, BindingError> {
        let reservation = vb.reserve(len)?;
        if let Err(e) = super::map_read_only_or_writable(sm, object, offset, &reservation, 0, len) {
            let _ = vb.release(reservation);
            return Err(e.into());
        }
        Ok(Staging { reservation, len })
    }

    fn addr(&self) -> u64 {
        self.reservation.addr()
    }

    /// Gives the view back now (no copy from it was enqueued).
    fn close(self, b: &BindingInner, sm: &SharedMappingApi<'_>, vb: &VirtualBackingApi<'_>) {
        let _ = sm.unmap(&self.reservation, 0, self.len);
        if let Err(e) = vb.release(self.reservation).map_err(|e| (e.is_device_lost(), e)) {
            if e.0 {
                return; // the view went with the device
            }
            let e = e.1;
            lock(&b.quarantine).push(format!("staging view of a privatise not released: {e}"));
        }
    }

    fn retire(self, b: &Arc<BindingInner>) -> StagingRetire {
        StagingRetire { binding: b.clone(), staging: Some(self) }
    }
}

/// Gives the staging view back once the copy from it has run.
struct StagingRetire {
    binding: Arc<BindingInner>,
    staging: Option<Staging>,
}

impl Retire for StagingRetire {
    fn settled_elsewhere(&self) -> bool {
        self.binding.is_lost()
    }
    fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        // Address space only: nothing of it is charged.
        None
    }
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        let b = &*self.binding;
        let Some(staging) = self.staging.take() else {
            return RetireOutcome::Freed { bytes: 0 };
        };
        if b.is_lost() {
            // The view went with the device; its token is plain data.
            return RetireOutcome::Lost { bytes: 0 };
        }
        let m = b.mechanism();
        // A staging view exists only on a mechanism with both.
        if let (Some(sm), Some(vb)) = (m.shared_mapping(), m.virtual_backing()) {
            staging.close(b, &sm, &vb);
        }
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        match &self.staging {
            Some(s) => {
                format!("staging view {} of a privatised range ({} B)", s.reservation.object_id(), s.len)
            }
            None => "staging view (already given back)".into(),
        }
    }
}

/// A refusal that is the device's loss is no failure to record.
trait FilterLost {
    fn filter_lost(self) -> Self;
}

impl FilterLost for Result<(), BindingError> {
    fn filter_lost(self) -> Self {
        match self {
            Err(BindingError::Plugin(e)) if e.is_device_lost() => Ok(()),
            r => r,
        }
    }
}
