//! Virtual regions: [`MemoryBinding::reserve_virtual`], the owning
//! [`Region`] (prefix mapping, grow, shrink) and the
//! retire jobs of a shrink and of the region itself. What plugin ABI 1.2
//! adds (peer access to a range, a grow queued on a stream) is in
//! `region/queued.rs`; what the 1.3 stream-ordered copy makes possible
//! (offload to host memory and restore at the same address, a private copy
//! of part of the shared prefix) is in `region/offload.rs` and
//! `region/privatise.rs`.

mod offload;
mod privatise;
mod queued;

pub use offload::{OffloadReport, Residence};

use super::prefix::SharedPrefix;
use super::settle::{self, Charge};
use super::view::RegionView;
use super::{round_up, BindingError, BindingInner, GrowError, MemoryBinding};
use crate::deferred::{Retire, RetireOutcome};
use crate::error::CallError;
use crate::fence::{FenceSource, SharedFence};
use crate::governor::{Grant, Lease};
use crate::mechanism::{Access, SharedMappingApi};
use crate::sync::{lock, Mutex};
use crate::tokens::{PhysicalObject, RawObject, Reservation};
use memplug_sdk::Status;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

impl MemoryBinding {
    /// Reserves `max` bytes of address space whose base never moves;
    /// nothing is committed or charged until it grows.
    pub fn reserve_virtual(&self, max: u64) -> Result<Region, BindingError> {
        let b = &*self.inner;
        let vb = b.mechanism().virtual_backing().ok_or_else(|| b.unsupported("virtual_backing"))?;
        let (token, _) = b.admit_new()?;
        let r = vb.reserve_placed(max, b.class, &b.placement)?;
        drop(token);
        Ok(Region {
            binding: self.inner.clone(),
            reservation: Some(r),
            granularity: b.mechanism().properties().granularity,
            base: 0,
            committed: 0,
            shared: Arc::default(),
            prefix: None,
            prefix_access: Access::ReadOnly,
            fences: Vec::new(),
            queued_commits: Vec::new(),
            pieces: Vec::new(),
            privatised: Vec::new(),
            offloaded: None,
            peer_grants: Vec::new(),
        })
    }
}

/// A virtual region: a reservation whose base address never changes,
/// optionally starting with a shared prefix (read-only, or read-write where
/// the mechanism refuses read-only views: see
/// [`prefix_access`](Region::prefix_access)), followed by a private part
/// that grows and shrinks in granules.
pub struct Region {
    binding: Arc<BindingInner>,
    reservation: Option<Reservation>,
    granularity: u64,
    /// Bytes at the start taken by the mapped prefix.
    base: u64,
    /// Private bytes committed after `base`.
    committed: u64,
    /// The lease and the pending decommits, shared with queued shrinks
    /// and the queued release.
    shared: Arc<Shared>,
    prefix: Option<Arc<SharedPrefix>>,
    /// How the prefix is mapped (meaningful only while `prefix` is set).
    prefix_access: Access,
    fences: Vec<SharedFence>,
    /// Ranges committed by [`grow_on`](Self::grow_on) with the fence that
    /// says they are usable; dropped once it has completed. Until then no
    /// synchronous call (peer access) touches the range.
    queued_commits: Vec<(u64, u64, SharedFence)>,
    /// The parts of the prefix still mapped shared, as `(offset, len)` at
    /// the same offset of the prefix's object: one piece `(0, base)` until
    /// [`privatise`](Self::privatise) replaces part of it.
    pieces: Vec<(u64, u64)>,
    /// Ranges inside the prefix replaced by private committed memory
    /// (charged to the region's lease), sorted by offset.
    privatised: Vec<(u64, u64)>,
    /// Where the private bytes are while the region is offloaded (boxed:
    /// a resident region, the common case, carries one pointer for it).
    offloaded: Option<Box<offload::Offloaded>>,
    /// Peer access granted with `set_peer_access`, remembered per range:
    /// the driver forgets it when a range is decommitted or unmapped, so
    /// every recommit and remap gives it back (`queued.rs`).
    peer_grants: Vec<queued::PeerGrant>,
}

/// What a region shares with its queued shrinks and its queued release:
/// one allocation per region for both.
#[derive(Default)]
struct Shared {
    /// The charge of the committed private bytes: queued shrinks refund
    /// their part once their decommit has run.
    lease: Mutex<Option<Lease>>,
    /// Ranges whose decommit waits for fences; not re-committable before.
    pending: Mutex<Vec<(u64, u64)>>,
    /// Whether a decommit was ever queued (`pending` ever pushed to): a
    /// region that never had one is released without locking `pending`.
    /// A plain load and store (only the region's owner queues).
    ever_pending: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let access = match self.prefix_access() {
            Some(Access::ReadWrite) => " read-write",
            _ => "",
        };
        let offloaded = if self.offloaded.is_some() { ", offloaded" } else { "" };
        write!(
            f,
            "Region({:#x}, prefix {} B{access}, committed {} B{offloaded})",
            self.addr(),
            self.base,
            self.committed
        )
    }
}

impl Region {
    /// The binding it was made through (the mechanism, the queue).
    pub(crate) fn binding_inner(&self) -> &BindingInner {
        &self.binding
    }
    fn res(&self) -> &Reservation {
        self.reservation.as_ref().expect("present until drop")
    }
    /// The base address; stable for the region's life.
    pub fn addr(&self) -> u64 {
        self.res().addr()
    }
    /// Address space reserved.
    pub fn capacity(&self) -> u64 {
        self.res().size()
    }
    /// Usable bytes: the prefix plus the committed private part.
    pub fn len(&self) -> u64 {
        self.base + self.committed
    }
    /// Whether no byte is usable yet (no prefix, nothing committed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Private bytes after the prefix: committed and charged while the
    /// region is resident; while it is offloaded
    /// ([`residence`](Self::residence)) they are held in host memory and
    /// neither committed nor charged on the device.
    pub fn committed(&self) -> u64 {
        self.committed
    }
    /// How the prefix is mapped: `None` without a prefix,
    /// `Some(Access::ReadOnly)` normally, `Some(Access::ReadWrite)` when the
    /// mechanism refused a read-only view with `UNSUPPORTED` and
    /// [`map_prefix`](Self::map_prefix) fell back (writes through this
    /// region then reach the prefix every other region shares).
    pub fn prefix_access(&self) -> Option<Access> {
        self.prefix.as_ref().map(|_| self.prefix_access)
    }
    /// Whether a prefix is mapped and the device cannot write it through
    /// this region; `false` without a prefix or after the read-write
    /// fallback of [`map_prefix`](Self::map_prefix).
    pub fn prefix_is_read_only(&self) -> bool {
        self.prefix_access() == Some(Access::ReadOnly)
    }
    /// The region's base address and usable length now, as a grow update
    /// sees them. The base never changes over the region's life.
    pub fn view(&self) -> RegionView {
        RegionView {
            addr: self.addr(),
            len: self.len(),
            lost: self.is_lost(),
            offloaded: self.offloaded.is_some(),
        }
    }
    /// Whether the region went with a lost device: its memory is gone, and
    /// dropping it calls no plugin (its charge is settled when the context
    /// terminates).
    pub fn is_lost(&self) -> bool {
        self.binding.is_lost()
    }
    /// Records device work that uses the region: its release waits.
    pub fn used_by(&mut self, fence: SharedFence) {
        self.add_fences([fence]);
    }

    /// Keeps only the fences not yet known complete: drops the completed
    /// ones already held (a query that fails keeps its fence: never drop on
    /// a guess), then adds `fences` not already held. The list stays the
    /// size of the work still in flight, not of every shrink ever made.
    fn add_fences(&mut self, fences: impl IntoIterator<Item = SharedFence>) {
        self.fences.retain(|f| !matches!(f.query(), Ok(true)));
        for f in fences {
            if !self.fences.iter().any(|g| Arc::ptr_eq(g, &f)) {
                self.fences.push(f);
            }
        }
    }

    /// Releases the region after `fences` (and any recorded with
    /// `used_by`), as `OwnedAllocation::release_after` does.
    pub fn release_after(mut self, fences: impl IntoIterator<Item = SharedFence>) {
        self.fences.extend(fences);
    }

    /// Maps `prefix` read-only at the start of an empty region; the private
    /// part then begins after it. Charges nothing (the prefix is charged
    /// once, at creation).
    ///
    /// A mechanism may refuse read-only views with `UNSUPPORTED` (CUDA:
    /// `cuMemSetAccess` with `CU_MEM_ACCESS_FLAGS_PROT_READ` on some drivers
    /// and devices). The prefix is then mapped read-write instead, and the
    /// region says so: [`prefix_access`](Self::prefix_access) is
    /// `Some(Access::ReadWrite)` and
    /// [`prefix_is_read_only`](Self::prefix_is_read_only) is false. Nothing
    /// then stops device work through this region from writing the shared
    /// bytes; callers that need the protection check and refuse. Any other
    /// refusal of the read-only map is returned as it is.
    pub fn map_prefix(&mut self, prefix: &Arc<SharedPrefix>) -> Result<(), BindingError> {
        self.resident("map a prefix")?;
        if self.committed != 0 || self.prefix.is_some() {
            return Err(BindingError::State(format!(
                "a prefix maps only into an empty region; this one has {} committed bytes{}",
                self.committed,
                if self.prefix.is_some() { " and a prefix" } else { "" }
            )));
        }
        if prefix.len > self.capacity() {
            return Err(BindingError::Invalid(format!(
                "prefix of {} B does not fit a region of {} B",
                prefix.len,
                self.capacity()
            )));
        }
        if !Arc::ptr_eq(&prefix.binding.context, &self.binding.context) {
            return Err(BindingError::Plugin(self.binding.mechanism().refusal(
                "binding",
                Status::WrongMechanism,
                "the prefix was made by another mechanism context".into(),
            )));
        }
        let b = &*self.binding;
        let sm = b.mechanism().shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        let access = map_read_only_or_writable(&sm, prefix.object(), 0, self.res(), 0, prefix.len)?;
        self.base = prefix.len;
        self.prefix = Some(prefix.clone());
        self.prefix_access = access;
        self.pieces = vec![(0, prefix.len)];
        Ok(())
    }

    /// Grows the usable length to at least `len` bytes (rounded up to the
    /// granularity), as a transaction: grant → commit the new range →
    /// `update(view)` → charge. If the commit or the update fails, the
    /// range is decommitted, the grant returned and the old view stays.
    ///
    /// ```
    /// # use memplug_host::{governor::AllocationClass, *};
    /// # use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    /// # let mgr = ProcessMemoryManager::new();
    /// # // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// # let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
    /// # mgr.register_plugin(cpu)?;
    /// # let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    /// # let needs = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
    /// # let ctx = mgr.select(cpu0, needs)?;
    /// # let pool = mgr.create_pool("kv", 64 << 20)?;
    /// let kv = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;
    /// let mut region = kv.reserve_virtual(1 << 30)?; // 1 GiB of address space, nothing charged
    /// let base = region.addr();
    /// assert_eq!(pool.used(), 0);
    ///
    /// region.grow_to(4 << 20, |view| {
    ///     assert_eq!(view.addr, base); // the runtime updates its block table here
    ///     Ok::<(), String>(())
    /// })?;
    /// assert_eq!((region.addr(), region.len(), pool.used()), (base, 4 << 20, 4 << 20));
    ///
    /// // An update that refuses undoes the grow: the old view, the old charge.
    /// let refused = region.grow_to(8 << 20, |_| Err("block table full"));
    /// assert!(matches!(refused, Err(GrowError::Update("block table full"))));
    /// assert_eq!((region.len(), pool.used()), (4 << 20, 4 << 20));
    ///
    /// // Past the reservation is refused; so is past the pool's budget.
    /// assert!(region.grow_to(2 << 30, |_| Ok::<(), String>(())).is_err());
    /// assert!(region.grow_to(128 << 20, |_| Ok::<(), String>(())).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grow_to<E>(
        &mut self,
        len: u64,
        update: impl FnOnce(&RegionView) -> Result<(), E>,
    ) -> Result<(), GrowError<E>> {
        self.resident("grow")?;
        if len <= self.len() {
            return Ok(());
        }
        let (want, offset, delta) = self.growth(len)?;
        let b = &*self.binding;
        let vb = b.mechanism().virtual_backing().expect("checked at reserve");
        let grant = b.grant(delta).map_err(GrowError::Binding)?;
        // An existing region may grow while its context retires (a request
        // in flight finishes on it); the charge and its ledger entry are
        // made under one gate token.
        let (_token, stripe) = b.admit().map_err(|state| GrowError::Binding(b.ended(state)))?;
        vb.commit(self.res(), offset, delta).map_err(|e| GrowError::Binding(e.into()))?;
        if let Err(e) = self.reapply_peers(offset, delta) {
            let _ = vb.decommit(self.res(), offset, delta);
            return Err(GrowError::Binding(e));
        }
        let view = RegionView { addr: self.addr(), len: self.base + want, lost: false, offloaded: false };
        if let Err(e) = update(&view) {
            if let Err(d) = vb.decommit(self.res(), offset, delta) {
                // The range stays mapped: keep it charged, as quarantined.
                let lease = grant.commit(delta).map_err(|r| GrowError::Binding(r.error.clone().into()))?;
                b.ledger.charged(stripe, delta, 1);
                b.quarantine(format!("region range at +{offset} ({delta} B): {d}"), Some(lease), stripe);
            }
            return Err(GrowError::Update(e));
        }
        if let Err(e) = self.charge_grant(grant, delta, stripe) {
            let _ = vb.decommit(self.res(), offset, delta);
            return Err(GrowError::Binding(e));
        }
        self.committed = want;
        Ok(())
    }

    /// Commits `grant` (of `delta` bytes) into the region's lease, making
    /// the lease on the first charge, and records it in the ledger. Under
    /// the caller's gate token.
    fn charge_grant(&self, grant: Grant<'_>, delta: u64, stripe: usize) -> Result<(), BindingError> {
        let b = &*self.binding;
        let mut slot = lock(&self.shared.lease);
        let charged = match slot.as_mut() {
            Some(l) => grant.commit_into(l, delta).map(|()| None),
            None => grant.commit(delta).map(Some),
        };
        match charged {
            Ok(Some(l)) => {
                b.ledger.charged(stripe, delta, 1);
                *slot = Some(l);
                Ok(())
            }
            Ok(None) => {
                b.ledger.charged(stripe, delta, 0);
                Ok(())
            }
            Err(r) => Err(r.error.clone().into()),
        }
    }

    /// What growing to `len` (more than the usable length) commits: the
    /// committed private length it reaches (`want`, rounded up to the
    /// granularity), and the range `(offset, delta)` to commit, checked to
    /// fit the reservation and to have no deferred decommit still pending.
    fn growth(&self, len: u64) -> Result<(u64, u64, u64), BindingError> {
        let want = round_up(len - self.base, self.granularity)
            .filter(|w| self.base.checked_add(*w).is_some_and(|end| end <= self.capacity()))
            .ok_or_else(|| {
                BindingError::Invalid(format!(
                    "cannot grow to {len} B: the region reserves {} B",
                    self.capacity()
                ))
            })?;
        let (offset, delta) = (self.base + self.committed, want - self.committed);
        self.wait_out_pending(offset, delta)?;
        Ok((want, offset, delta))
    }

    /// A range whose deferred decommit has not run cannot be committed
    /// again yet: poll the queue once, then refuse.
    fn wait_out_pending(&self, offset: u64, len: u64) -> Result<(), BindingError> {
        if !self.shared.ever_pending.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(()); // nothing was ever queued: nothing is pending
        }
        let overlaps =
            |p: &Mutex<Vec<(u64, u64)>>| lock(p).iter().any(|&(o, l)| o < offset + len && offset < o + l);
        if !overlaps(&self.shared.pending) {
            return Ok(());
        }
        self.binding.queue.poll();
        if overlaps(&self.shared.pending) {
            return Err(BindingError::Plugin(self.binding.mechanism().refusal(
                "binding",
                Status::Busy,
                format!("range +{offset} ({len} B) still waits for its decommit's fences"),
            )));
        }
        Ok(())
    }

    /// Shrinks the private part to `len` usable bytes (rounded up to the
    /// granularity). The tail is decommitted and refunded after `fences`
    /// and every fence recorded with [`used_by`](Self::used_by) (now, when
    /// there are none).
    pub fn shrink_to(&mut self, len: u64, fences: Vec<SharedFence>) -> Result<(), BindingError> {
        self.resident("shrink")?;
        let keep = round_up(len.saturating_sub(self.base), self.granularity).unwrap_or(u64::MAX);
        if keep >= self.committed {
            return Ok(());
        }
        let (offset, delta) = (self.base + keep, self.committed - keep);
        // The tail stays charged (it is still mapped) until its decommit
        // has run; then the job refunds that part of the region's lease.
        // The region's own release waits for these fences too (and for the
        // queued shrinks themselves, see `Drop`).
        self.add_fences(fences);
        self.committed = keep;
        // The tail may be in use by any work recorded on the region with
        // `used_by`, not only by the work named here (invariant 4): the
        // shrink waits for every fence not yet known complete — none, when
        // all have completed, and then it runs now, here: no job is made,
        // and the range is never marked pending (`&mut self`: nothing else
        // can grow this region meanwhile).
        let queue = &self.binding.queue;
        if queue.settle_fences(&mut self.fences) {
            let outcome = decommit_part(&self.binding, *self.res().raw(), offset, delta, &self.shared.lease);
            queue.count_immediate(outcome, || self.binding.charged_to());
        } else {
            let job = self.shrink_job(offset, delta);
            self.mark_pending(offset, delta);
            queue.enqueue(self.fences.clone(), Box::new(job));
        }
        Ok(())
    }

    /// Queues the decommit of `[offset, offset + len)` behind `fences`:
    /// the range is marked pending (not committable again) until the job
    /// has run, which refunds that part of the region's lease. The one
    /// place a shrink, an undone restore and a refused queued grow give a
    /// range back.
    pub(super) fn queue_decommit(&self, offset: u64, len: u64, fences: Vec<SharedFence>) {
        let job = self.shrink_job(offset, len);
        self.mark_pending(offset, len);
        self.binding.queue.release(fences, Box::new(job));
    }

    fn mark_pending(&self, offset: u64, len: u64) {
        self.shared.ever_pending.store(true, std::sync::atomic::Ordering::Relaxed);
        lock(&self.shared.pending).push((offset, len));
    }

    fn shrink_job(&self, offset: u64, len: u64) -> ShrinkRetire {
        ShrinkRetire {
            binding: self.binding.clone(),
            reservation: *self.res().raw(),
            offset,
            len,
            shared: self.shared.clone(),
        }
    }
}

/// Decommits `[offset, +len)` of `reservation` and refunds that part of
/// the region's lease in `lease` (or quarantines it, or leaves it to a lost
/// context's settlement): the one body of a shrink run now and of a queued
/// one.
fn decommit_part(
    b: &BindingInner,
    reservation: RawObject,
    offset: u64,
    len: u64,
    lease: &Mutex<Option<Lease>>,
) -> RetireOutcome {
    let vb = b.mechanism().virtual_backing().expect("checked at reserve");
    settle::release_or_quarantine(
        b,
        Charge::Part { slot: lease, bytes: len },
        |_| {
            // SAFETY: a copy of the live region's reservation token, used
            // for one call; the region (which owns it) outlives queued
            // shrinks because its own release is queued after them.
            let res = unsafe { Reservation::from_raw(reservation) };
            let r = vb.decommit(&res, offset, len);
            let _ = res.into_raw();
            r
        },
        |_, reason| format!("region range +{offset} ({len} B): {reason}"),
    )
}

struct ShrinkRetire {
    binding: Arc<BindingInner>,
    reservation: RawObject,
    offset: u64,
    len: u64,
    shared: Arc<Shared>,
}

impl Retire for ShrinkRetire {
    fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        self.binding.charged_to()
    }
    fn retire(self: Box<Self>) -> RetireOutcome {
        let (offset, len) = (self.offset, self.len);
        let outcome = decommit_part(&self.binding, self.reservation, offset, len, &self.shared.lease);
        // Whatever happened (decommitted, quarantined, or lost without a
        // call), this shrink is over: the region's release, which waits
        // for its shrinks (`ShrinksDone`), must not wait for ever because
        // a lost context skipped the call.
        lock(&self.shared.pending).retain(|&(o, l)| (o, l) != (offset, len));
        outcome
    }
    fn settled_elsewhere(&self) -> bool {
        self.binding.is_lost()
    }
    fn describe(&self) -> String {
        format!("decommit of +{} ({} B) in reservation {}", self.offset, self.len, self.reservation.object_id)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.release_host_copy();
        // Waits for every pending shrink of this region to have run (the
        // queue keeps no order between entries), so those decommit against
        // a live reservation. First in the list: the entry waits on the
        // device fences (the last) before it looks at this one.
        // Fences already complete (a queued grow's, say) are dropped here,
        // as `add_fences` does, so a region whose work is done is released
        // now rather than on the next poll.
        let mut fences = std::mem::take(&mut self.fences);
        fences.retain(|f| !matches!(f.query(), Ok(true)));
        // Read on the owner's thread, which alone sets it.
        let maybe_pending = self.shared.ever_pending.load(std::sync::atomic::Ordering::Relaxed);
        if maybe_pending && !lock(&self.shared.pending).is_empty() {
            fences.insert(0, Arc::new(ShrinksDone(self.shared.clone())));
        }
        let (reservation, prefix) = (self.reservation.take(), self.prefix.take());
        let pieces = std::mem::take(&mut self.pieces);
        if fences.is_empty() {
            // Released now, from the region's own fields: no job is boxed
            // and no reference cloned.
            let _ = release_region(&self.binding, reservation, &self.shared.lease, prefix, &pieces);
        } else {
            let job = RegionRetire {
                binding: self.binding.clone(),
                reservation,
                shared: self.shared.clone(),
                prefix,
                pieces,
            };
            self.binding.queue.enqueue(fences, Box::new(job));
        }
    }
}

/// Unmaps what is left of a region's shared prefix, releases its
/// reservation and settles its lease (refunded, quarantined, or left to a
/// lost context's settlement): the one body of a region released now and
/// of a queued release. The prefix is dropped after the unmap and the
/// release: the last region frees it.
fn release_region(
    b: &BindingInner,
    reservation: Option<Reservation>,
    lease: &Mutex<Option<Lease>>,
    prefix: Option<Arc<SharedPrefix>>,
    pieces: &[(u64, u64)],
) -> RetireOutcome {
    let Some(res) = reservation else {
        return RetireOutcome::Freed { bytes: 0 };
    };
    let vb = b.mechanism().virtual_backing().expect("checked at reserve");
    if prefix.is_some() {
        if let Some(sm) = b.mechanism().shared_mapping() {
            for &(offset, len) in pieces {
                let _ = sm.unmap(&res, offset, len);
            }
        }
    }
    let lease = lock(lease).take();
    let outcome = settle::release_or_quarantine(
        b,
        Charge::Whole(lease),
        |_| vb.release(res),
        |e, reason| format!("reservation {}: {reason}", e.object.object_id()),
    );
    drop(prefix);
    outcome
}

/// Maps `[object_offset, +len)` of `object` at `offset` of `res` read-only,
/// or read-write where the mechanism refuses read-only views with
/// `UNSUPPORTED` (see [`Region::map_prefix`]); returns the access it got.
fn map_read_only_or_writable(
    sm: &SharedMappingApi<'_>,
    object: &PhysicalObject,
    object_offset: u64,
    res: &Reservation,
    offset: u64,
    len: u64,
) -> Result<Access, CallError> {
    match sm.map(object, object_offset, res, offset, len, Access::ReadOnly) {
        Ok(()) => Ok(Access::ReadOnly),
        Err(e) if e.status == Status::Unsupported => {
            sm.map(object, object_offset, res, offset, len, Access::ReadWrite).map(|()| Access::ReadWrite)
        }
        Err(e) => Err(e),
    }
}

/// Complete once every queued shrink of a region has run: the fence its
/// release waits on besides the device's.
struct ShrinksDone(Arc<Shared>);

impl FenceSource for ShrinksDone {
    fn query(&self) -> Result<bool, CallError> {
        Ok(lock(&self.0.pending).is_empty())
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        crate::fence::poll_until(timeout, || self.query())
    }
    fn describe(&self) -> String {
        format!("{} queued decommit(s) of the region", lock(&self.0.pending).len())
    }
}

struct RegionRetire {
    binding: Arc<BindingInner>,
    reservation: Option<Reservation>,
    shared: Arc<Shared>,
    prefix: Option<Arc<SharedPrefix>>,
    /// The parts of the prefix still mapped shared (the rest was
    /// privatised: committed memory the release gives back).
    pieces: Vec<(u64, u64)>,
}

impl Retire for RegionRetire {
    fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        self.binding.charged_to()
    }
    fn settled_elsewhere(&self) -> bool {
        self.binding.is_lost()
    }
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        let (reservation, prefix) = (self.reservation.take(), self.prefix.take());
        release_region(&self.binding, reservation, &self.shared.lease, prefix, &self.pieces)
    }
    fn describe(&self) -> String {
        match &self.reservation {
            Some(r) => format!("region {} ({} B reserved at {:#x})", r.object_id(), r.size(), r.addr()),
            None => "region (already retired)".into(),
        }
    }
}
