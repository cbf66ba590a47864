//! Bindings: mechanism + context + pool + holder + class, the only way to
//! allocate (DESIGN.md §1). Every path is a transaction — reserve a grant,
//! make the memory, commit the charge with the bytes actually obtained — and
//! any failure rolls back what was done. Owning objects free through the
//! deferred-free queue after their fences (invariant 4), through the
//! mechanism that made them (invariant 1).

use crate::deferred::{DeferredFreeQueue, Retire, RetireOutcome};
use crate::error::CallError;
use crate::fence::SharedFence;
use crate::governor::{AllocationClass, GovernorError, HolderId, Lease, Pool, Reservation as Grant};
use crate::mechanism::{Access, Mechanism};
use crate::objects::{Allocation, PhysicalObject, Reservation};
use crate::registry::Context;
use memplug_sdk::Status;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a binding operation failed. The state before the call is intact.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The governor refused the charge (`OutOfBudget` carries the pool's
    /// snapshot).
    #[error(transparent)]
    Budget(#[from] GovernorError),
    /// The plugin refused or failed.
    #[error(transparent)]
    Plugin(#[from] CallError),
    /// The mechanism lacks a capability the operation needs.
    #[error("mechanism {mechanism} has no {capability}")]
    Unsupported { mechanism: String, capability: &'static str },
    /// The request is malformed (overflowing size, beyond the region...).
    #[error("{0}")]
    Invalid(String),
}

/// A grow whose commit or update failed; the region is as it was.
#[derive(Debug, thiserror::Error)]
pub enum GrowError<E> {
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// The caller's update refused; the new range was decommitted and the
    /// grant returned.
    #[error("the update refused the grown view")]
    Update(E),
}

pub(crate) struct BindingInner {
    pub(crate) context: Arc<Context>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) holder: Option<HolderId>,
    pub(crate) class: AllocationClass,
    pub(crate) queue: Arc<DeferredFreeQueue>,
    /// How long an allocation may wait for pressure to make room.
    pub(crate) wait: Option<Duration>,
    /// Objects whose release the plugin refused: never reissued, still
    /// charged (as quarantined), described for reports.
    pub(crate) quarantine: Mutex<Vec<String>>,
}

impl BindingInner {
    fn mechanism(&self) -> &Mechanism {
        self.context.mechanism()
    }

    /// A grant, asking holders and waiting when the fast path has no room.
    /// One call into the governor, so a refusal is counted once; the clock
    /// is read only by bindings that may wait.
    #[inline]
    fn grant(&self, bytes: u64) -> Result<Grant<'_>, BindingError> {
        let deadline = self.wait.map(|w| Instant::now() + w);
        Ok(self.pool.reserve(bytes, self.class, self.holder, deadline)?)
    }

    fn quarantine(&self, what: String, lease: Option<Lease>) {
        if let Some(l) = lease {
            let _ = self.pool.quarantine(l);
        }
        self.quarantine.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    fn unsupported(&self, capability: &'static str) -> BindingError {
        BindingError::Unsupported { mechanism: self.mechanism().label().to_string(), capability }
    }
}

/// Allocates through one mechanism, charged to one pool, holder and class.
/// Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct MemoryBinding {
    pub(crate) inner: Arc<BindingInner>,
}

impl fmt::Debug for MemoryBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBinding")
            .field("mechanism", &self.inner.mechanism().label())
            .field("pool", &self.inner.pool.name())
            .field("holder", &self.inner.holder)
            .field("class", &self.inner.class)
            .finish()
    }
}

impl MemoryBinding {
    pub(crate) fn new(
        context: Arc<Context>,
        pool: Arc<Pool>,
        holder: Option<HolderId>,
        class: AllocationClass,
        queue: Arc<DeferredFreeQueue>,
        wait: Option<Duration>,
    ) -> Self {
        MemoryBinding {
            inner: Arc::new(BindingInner {
                context,
                pool,
                holder,
                class,
                queue,
                wait,
                quarantine: Mutex::default(),
            }),
        }
    }

    pub fn mechanism(&self) -> &Mechanism {
        self.inner.mechanism()
    }
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
    pub fn class(&self) -> AllocationClass {
        self.inner.class
    }
    pub fn holder(&self) -> Option<HolderId> {
        self.inner.holder
    }
    /// Objects whose release the plugin refused (quarantined).
    pub fn quarantined(&self) -> Vec<String> {
        self.inner.quarantine.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Allocates `size` bytes aligned to `alignment`: reserve → allocate →
    /// commit the charge with the bytes obtained. A failure at any step
    /// returns the grant and frees what was made.
    pub fn allocate(&self, size: u64, alignment: u64) -> Result<OwnedAllocation, BindingError> {
        let b = &*self.inner;
        let grant = b.grant(size)?;
        let alloc = b.mechanism().allocator().allocate_as(size, alignment, b.class)?;
        let lease = match grant.commit(alloc.size()) {
            Ok(l) => l,
            Err(rejected) => {
                // More bytes than granted and no room for them: undo.
                let error = rejected.error.clone();
                drop(rejected);
                if let Err(e) = b.mechanism().allocator().deallocate(alloc) {
                    b.quarantine(format!("allocation {} (rollback)", e.object.object_id()), None);
                }
                return Err(error.into());
            }
        };
        Ok(OwnedAllocation {
            binding: Some(self.inner.clone()),
            alloc: Some(alloc),
            lease: Some(lease),
            fences: FenceSet::default(),
        })
    }

    /// Reserves `max` bytes of address space whose base never moves;
    /// nothing is committed or charged until it grows.
    pub fn reserve_virtual(&self, max: u64) -> Result<Region, BindingError> {
        let b = &*self.inner;
        let vb = b.mechanism().virtual_backing().ok_or_else(|| b.unsupported("virtual_backing"))?;
        let r = vb.reserve_as(max, b.class)?;
        Ok(Region {
            binding: self.inner.clone(),
            reservation: Some(r),
            granularity: b.mechanism().properties().granularity,
            base: 0,
            committed: 0,
            lease: Arc::new(Mutex::new(None)),
            prefix: None,
            pending: Arc::new(Mutex::new(Vec::new())),
            fences: Vec::new(),
        })
    }

    /// Creates a shared prefix of `size` bytes (rounded up to the
    /// granularity), filled by `init` through a temporary writable view.
    /// Its physical bytes are charged once, however many regions map it.
    pub fn create_shared(
        &self,
        size: u64,
        init: impl FnOnce(&mut RegionView),
    ) -> Result<Arc<SharedPrefix>, BindingError> {
        let b = &*self.inner;
        let m = b.mechanism();
        let sm = m.shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        let vb = m.virtual_backing().ok_or_else(|| b.unsupported("virtual_backing"))?;
        let len = round_up(size, m.properties().granularity)
            .ok_or_else(|| BindingError::Invalid(format!("shared prefix of {size} bytes overflows")))?;
        let grant = b.grant(len)?;
        let object = sm.create_as(len, b.class)?;
        let lease = match grant.commit(object.size()) {
            Ok(l) => l,
            Err(rejected) => {
                let error = rejected.error.clone();
                drop(rejected);
                if let Err(e) = sm.release(object) {
                    b.quarantine(format!("physical object {} (rollback)", e.object.object_id()), None);
                }
                return Err(error.into());
            }
        };
        // Fill through a temporary writable mapping.
        let filled = (|| -> Result<(), BindingError> {
            let tmp = vb.reserve(len)?;
            let mut result = sm.map(&object, 0, &tmp, 0, len, Access::ReadWrite).map_err(BindingError::from);
            if result.is_ok() {
                init(&mut RegionView { addr: tmp.addr(), len });
                result = sm.unmap(&tmp, 0, len).map_err(Into::into);
            }
            // Always give the temporary reservation back: releasing it also
            // drops a mapping whose unmap failed. One the plugin will not
            // release is quarantined, never dropped silently (invariant 7).
            if let Err(e) = vb.release(tmp) {
                b.quarantine(
                    format!("temporary reservation {} of a shared prefix: {}", e.object.object_id(), e.error),
                    None,
                );
                // The token is plain data: letting it go leaves the object
                // alive in the plugin, so its address is never reissued.
                drop(e.object);
                result = result.and(Err(e.error.into()));
            }
            result
        })();
        if let Err(e) = filled {
            if sm.release(object).is_ok() {
                let _ = b.pool.release(lease);
            } else {
                b.quarantine("physical object (fill failed)".into(), Some(lease));
            }
            return Err(e);
        }
        Ok(Arc::new(SharedPrefix {
            binding: self.inner.clone(),
            object: Some(object),
            lease: Some(lease),
            len,
        }))
    }
}

fn round_up(v: u64, granularity: u64) -> Option<u64> {
    let g = granularity.max(1);
    v.checked_add(g - 1).map(|x| x / g * g)
}

/// An owning allocation. Dropping it frees through the deferred-free queue
/// after the fences of its last use; it never waits on the device.
pub struct OwnedAllocation {
    /// Taken (not cloned) by `drop`, which hands it to the retire job.
    binding: Option<Arc<BindingInner>>,
    alloc: Option<Allocation>,
    lease: Option<Lease>,
    fences: FenceSet,
}

impl fmt::Debug for OwnedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnedAllocation({:#x}, {} B)", self.addr(), self.size())
    }
}

impl OwnedAllocation {
    fn alloc(&self) -> &Allocation {
        self.alloc.as_ref().expect("present until drop")
    }
    pub fn addr(&self) -> u64 {
        self.alloc().addr()
    }
    pub fn size(&self) -> u64 {
        self.alloc().size()
    }
    /// Bytes charged to the pool.
    pub fn charged(&self) -> u64 {
        self.lease.as_ref().map_or(0, Lease::bytes)
    }
    /// Records device work that uses this allocation: the free waits for it.
    pub fn used_by(&mut self, fence: SharedFence) {
        self.fences.push(fence);
    }
    /// Releases after `fences` (and any recorded with `used_by`).
    pub fn release_after(mut self, fences: impl IntoIterator<Item = SharedFence>) {
        for f in fences {
            self.fences.push(f);
        }
    }
}

impl Drop for OwnedAllocation {
    fn drop(&mut self) {
        let (Some(binding), Some(alloc), Some(lease)) =
            (self.binding.take(), self.alloc.take(), self.lease.take())
        else {
            return;
        };
        // No device work recorded, or all of it already done: free now,
        // without boxing a job or touching the queue.
        if self.fences.all_complete() {
            let _ = retire_allocation(&binding, alloc, lease);
        } else {
            let queue = binding.queue.clone();
            let job = AllocationRetire { binding, alloc: Some(alloc), lease: Some(lease) };
            queue.enqueue(std::mem::take(&mut self.fences).into_vec(), Box::new(job));
        }
    }
}

/// Frees through the creating mechanism, then refunds the charge (or
/// quarantines it).
#[inline]
fn retire_allocation(b: &BindingInner, alloc: Allocation, lease: Lease) -> RetireOutcome {
    let bytes = lease.bytes();
    match b.mechanism().allocator().deallocate(alloc) {
        Ok(()) => {
            let _ = b.pool.release(lease);
            RetireOutcome::Freed { bytes }
        }
        Err(e) => {
            // Invariant 7: the charge stays, the address is never reissued
            // (the plugin still holds it), and the reason is kept.
            let reason = e.error.to_string();
            b.quarantine(format!("allocation {}: {reason}", e.object.object_id()), Some(lease));
            // The token is plain data: letting it go leaves the object
            // alive in the plugin, so its address is never reissued.
            drop(e.object);
            RetireOutcome::Quarantined { bytes, reason }
        }
    }
}

/// The fences of one allocation's last use. The common cases — none, or
/// one (the stream the work ran on) — need no heap allocation.
#[derive(Default)]
struct FenceSet {
    first: Option<SharedFence>,
    more: Vec<SharedFence>,
}

impl FenceSet {
    fn push(&mut self, f: SharedFence) {
        if self.first.is_none() {
            self.first = Some(f);
        } else {
            self.more.push(f);
        }
    }

    /// True when every fence reports completion; a fence whose query fails
    /// counts as not complete (never free on a guess).
    #[inline]
    fn all_complete(&self) -> bool {
        match &self.first {
            None => true,
            Some(f) => f.query().unwrap_or(false) && self.more.iter().all(|f| f.query().unwrap_or(false)),
        }
    }

    fn into_vec(self) -> Vec<SharedFence> {
        let mut v = self.more;
        if let Some(f) = self.first {
            v.insert(0, f);
        }
        v
    }
}

struct AllocationRetire {
    binding: Arc<BindingInner>,
    alloc: Option<Allocation>,
    lease: Option<Lease>,
}

impl AllocationRetire {
    fn run(&mut self) -> RetireOutcome {
        match (self.alloc.take(), self.lease.take()) {
            (Some(alloc), Some(lease)) => retire_allocation(&self.binding, alloc, lease),
            _ => RetireOutcome::Freed { bytes: 0 },
        }
    }
}

impl Retire for AllocationRetire {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        self.run()
    }
    fn describe(&self) -> String {
        match &self.alloc {
            Some(a) => format!("allocation {} ({} B at {:#x})", a.object_id(), a.size(), a.addr()),
            None => "allocation (already retired)".into(),
        }
    }
}

/// A view of a region's usable bytes, given to grow updates and prefix
/// initialisers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionView {
    pub addr: u64,
    pub len: u64,
}

impl RegionView {
    /// The bytes, for mechanisms whose addresses are host addresses (CPU).
    ///
    /// # Safety
    /// The mechanism's memory must be host-accessible and mapped writable,
    /// and nothing else may access it for the lifetime of the slice.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize)
    }
}

/// A shared prefix: one physical object, charged once, mapped read-only
/// into any number of regions. Freed (after fences) when the last `Arc`
/// drops; each region's mapping keeps its own plugin-side reference.
pub struct SharedPrefix {
    binding: Arc<BindingInner>,
    object: Option<PhysicalObject>,
    lease: Option<Lease>,
    len: u64,
}

impl SharedPrefix {
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn charged(&self) -> u64 {
        self.lease.as_ref().map_or(0, Lease::bytes)
    }
    fn object(&self) -> &PhysicalObject {
        self.object.as_ref().expect("present until drop")
    }
}

impl fmt::Debug for SharedPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedPrefix({} B)", self.len)
    }
}

impl Drop for SharedPrefix {
    fn drop(&mut self) {
        let job = PrefixRetire {
            binding: self.binding.clone(),
            object: self.object.take(),
            lease: self.lease.take(),
        };
        // Regions holding mappings keep an Arc, so reaching here means no
        // region maps it any more; their own frees were fence-ordered.
        let _ = Retire::retire(Box::new(job));
    }
}

struct PrefixRetire {
    binding: Arc<BindingInner>,
    object: Option<PhysicalObject>,
    lease: Option<Lease>,
}

impl Retire for PrefixRetire {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        let b = &*self.binding;
        let (Some(object), Some(lease)) = (self.object.take(), self.lease.take()) else {
            return RetireOutcome::Freed { bytes: 0 };
        };
        let bytes = lease.bytes();
        let sm = b.mechanism().shared_mapping().expect("checked at create");
        match sm.release(object) {
            Ok(()) => {
                let _ = b.pool.release(lease);
                RetireOutcome::Freed { bytes }
            }
            Err(e) => {
                let reason = e.error.to_string();
                b.quarantine(format!("physical object {}: {reason}", e.object.object_id()), Some(lease));
                // The token is plain data: letting it go leaves the object
                // alive in the plugin, so its address is never reissued.
                drop(e.object);
                RetireOutcome::Quarantined { bytes, reason }
            }
        }
    }
    fn describe(&self) -> String {
        format!("shared prefix ({} B)", self.object.as_ref().map_or(0, PhysicalObject::size))
    }
}

/// A virtual region: a reservation whose base address never changes,
/// optionally starting with a read-only shared prefix, followed by a
/// private part that grows and shrinks in granules.
pub struct Region {
    binding: Arc<BindingInner>,
    reservation: Option<Reservation>,
    granularity: u64,
    /// Bytes at the start taken by the mapped prefix.
    base: u64,
    /// Private bytes committed after `base`.
    committed: u64,
    /// The charge of the committed private bytes; shared with queued
    /// shrinks, which refund their part once their decommit has run.
    lease: Arc<Mutex<Option<Lease>>>,
    prefix: Option<Arc<SharedPrefix>>,
    /// Ranges whose decommit waits for fences; not re-committable before.
    pending: Arc<Mutex<Vec<(u64, u64)>>>,
    fences: Vec<SharedFence>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region({:#x}, prefix {} B, committed {} B)", self.addr(), self.base, self.committed)
    }
}

impl Region {
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
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Private bytes committed (and charged).
    pub fn committed(&self) -> u64 {
        self.committed
    }
    pub fn view(&self) -> RegionView {
        RegionView { addr: self.addr(), len: self.len() }
    }
    /// Records device work that uses the region: its release waits.
    pub fn used_by(&mut self, fence: SharedFence) {
        self.fences.push(fence);
    }

    /// Releases the region after `fences` (and any recorded with
    /// `used_by`), as `OwnedAllocation::release_after` does.
    pub fn release_after(mut self, fences: impl IntoIterator<Item = SharedFence>) {
        self.fences.extend(fences);
    }

    /// Maps `prefix` read-only at the start of an empty region; the private
    /// part then begins after it. Charges nothing (the prefix is charged
    /// once, at creation).
    pub fn map_prefix(&mut self, prefix: &Arc<SharedPrefix>) -> Result<(), BindingError> {
        if self.committed != 0 || self.prefix.is_some() {
            return Err(BindingError::Invalid("a prefix maps only into an empty region".into()));
        }
        if prefix.len > self.capacity() {
            return Err(BindingError::Invalid(format!(
                "prefix of {} B does not fit a region of {} B",
                prefix.len,
                self.capacity()
            )));
        }
        if !Arc::ptr_eq(&prefix.binding.context, &self.binding.context) {
            return Err(BindingError::Invalid("the prefix was made by another mechanism context".into()));
        }
        let b = &*self.binding;
        let sm = b.mechanism().shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        sm.map(prefix.object(), 0, self.res(), 0, prefix.len, Access::ReadOnly)?;
        self.base = prefix.len;
        self.prefix = Some(prefix.clone());
        Ok(())
    }

    /// Grows the usable length to at least `len` bytes (rounded up to the
    /// granularity), as a transaction: grant → commit the new range →
    /// `update(view)` → charge. If the commit or the update fails, the
    /// range is decommitted, the grant returned and the old view stays.
    pub fn grow_to<E>(
        &mut self,
        len: u64,
        update: impl FnOnce(&RegionView) -> Result<(), E>,
    ) -> Result<(), GrowError<E>> {
        if len <= self.len() {
            return Ok(());
        }
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
        let b = self.binding.clone();
        let vb = b.mechanism().virtual_backing().expect("checked at reserve");
        let grant = b.grant(delta).map_err(GrowError::Binding)?;
        vb.commit(self.res(), offset, delta).map_err(|e| GrowError::Binding(e.into()))?;
        let view = RegionView { addr: self.addr(), len: self.base + want };
        if let Err(e) = update(&view) {
            if let Err(d) = vb.decommit(self.res(), offset, delta) {
                // The range stays mapped: keep it charged, as quarantined.
                let lease = grant.commit(delta).map_err(|r| GrowError::Binding(r.error.clone().into()))?;
                b.quarantine(format!("region range at +{offset} ({delta} B): {d}"), Some(lease));
            }
            return Err(GrowError::Update(e));
        }
        let mut slot = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let charged = match slot.as_mut() {
            Some(l) => grant.commit_into(l, delta).map(|()| None),
            None => grant.commit(delta).map(Some),
        };
        match charged {
            Ok(Some(l)) => *slot = Some(l),
            Ok(None) => {}
            Err(r) => {
                let error = r.error.clone();
                drop(r);
                drop(slot);
                let _ = vb.decommit(self.res(), offset, delta);
                return Err(GrowError::Binding(error.into()));
            }
        }
        drop(slot);
        self.committed = want;
        Ok(())
    }

    /// A range whose deferred decommit has not run cannot be committed
    /// again yet: poll the queue once, then refuse.
    fn wait_out_pending(&self, offset: u64, len: u64) -> Result<(), BindingError> {
        let overlaps = |p: &Mutex<Vec<(u64, u64)>>| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|&(o, l)| o < offset + len && offset < o + l)
        };
        if !overlaps(&self.pending) {
            return Ok(());
        }
        self.binding.queue.poll();
        if overlaps(&self.pending) {
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
        let keep = round_up(len.saturating_sub(self.base), self.granularity).unwrap_or(u64::MAX);
        if keep >= self.committed {
            return Ok(());
        }
        let (offset, delta) = (self.base + keep, self.committed - keep);
        // The tail stays charged (it is still mapped) until its decommit
        // has run; then the job refunds that part of the region's lease.
        let job = ShrinkRetire {
            binding: self.binding.clone(),
            reservation: *self.res().raw(),
            offset,
            len: delta,
            lease: self.lease.clone(),
            pending: self.pending.clone(),
        };
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).push((offset, delta));
        // The region's own release must wait for these fences too, so it
        // can never run before this decommit (which needs the reservation).
        self.fences.extend(fences);
        self.committed = keep;
        // The tail may be in use by any work recorded on the region with
        // `used_by`, not only by the work named here (invariant 4).
        self.binding.queue.release(self.fences.clone(), Box::new(job));
        Ok(())
    }
}

struct ShrinkRetire {
    binding: Arc<BindingInner>,
    reservation: crate::objects::RawObject,
    offset: u64,
    len: u64,
    lease: Arc<Mutex<Option<Lease>>>,
    pending: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Retire for ShrinkRetire {
    fn retire(self: Box<Self>) -> RetireOutcome {
        let b = &*self.binding;
        let vb = b.mechanism().virtual_backing().expect("checked at reserve");
        // SAFETY: a copy of the live region's reservation token, used for
        // one call; the region (which owns it) outlives queued shrinks
        // because its own release is queued after them.
        let res = unsafe { Reservation::from_raw(self.reservation) };
        let r = vb.decommit(&res, self.offset, self.len);
        let _ = res.into_raw();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&(o, l)| (o, l) != (self.offset, self.len));
        let mut slot = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let Some(lease) = slot.as_mut() else {
            return RetireOutcome::Freed { bytes: 0 };
        };
        match r {
            Ok(()) => {
                let _ = b.pool.release_part(lease, self.len);
                RetireOutcome::Freed { bytes: self.len }
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = b.pool.quarantine_part(lease, self.len);
                drop(slot);
                b.quarantine(format!("region range +{} ({} B): {reason}", self.offset, self.len), None);
                RetireOutcome::Quarantined { bytes: self.len, reason }
            }
        }
    }
    fn describe(&self) -> String {
        format!("decommit of +{} ({} B) in reservation {}", self.offset, self.len, self.reservation.object_id)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let job = RegionRetire {
            binding: self.binding.clone(),
            reservation: self.reservation.take(),
            lease: self.lease.clone(),
            prefix: self.prefix.take(),
            base: self.base,
        };
        // Enqueued after any pending shrink of this region, so those run
        // first against a live reservation.
        let fences = std::mem::take(&mut self.fences);
        if fences.is_empty() && self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            let _ = Retire::retire(Box::new(job));
        } else {
            self.binding.queue.enqueue(fences, Box::new(job));
        }
    }
}

struct RegionRetire {
    binding: Arc<BindingInner>,
    reservation: Option<Reservation>,
    lease: Arc<Mutex<Option<Lease>>>,
    prefix: Option<Arc<SharedPrefix>>,
    base: u64,
}

impl Retire for RegionRetire {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        let b = &*self.binding;
        let Some(res) = self.reservation.take() else {
            return RetireOutcome::Freed { bytes: 0 };
        };
        let vb = b.mechanism().virtual_backing().expect("checked at reserve");
        if self.prefix.is_some() {
            if let Some(sm) = b.mechanism().shared_mapping() {
                let _ = sm.unmap(&res, 0, self.base);
            }
        }
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        let bytes = lease.as_ref().map_or(0, Lease::bytes);
        match vb.release(res) {
            Ok(()) => {
                if let Some(l) = lease {
                    let _ = b.pool.release(l);
                }
                // Dropping the prefix after the unmap: the last region
                // frees it.
                self.prefix.take();
                RetireOutcome::Freed { bytes }
            }
            Err(e) => {
                let reason = e.error.to_string();
                b.quarantine(format!("reservation {}: {reason}", e.object.object_id()), lease);
                // The token is plain data: letting it go leaves the object
                // alive in the plugin, so its address is never reissued.
                drop(e.object);
                RetireOutcome::Quarantined { bytes, reason }
            }
        }
    }
    fn describe(&self) -> String {
        match &self.reservation {
            Some(r) => format!("region {} ({} B reserved at {:#x})", r.object_id(), r.size(), r.addr()),
            None => "region (already retired)".into(),
        }
    }
}
