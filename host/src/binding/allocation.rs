//! Plain allocations: [`MemoryBinding::allocate`], the owning
//! [`OwnedAllocation`], the fences of its last use, and its retire job.

use super::settle::{self, Charge};
use super::{Anchor, BindingError, BindingInner, MemoryBinding};
use crate::deferred::{Retire, RetireOutcome};
use crate::fence::{Completion, SharedFence};
use crate::governor::Lease;
use crate::tokens::Allocation;
use std::fmt;
use std::sync::Arc;

impl MemoryBinding {
    /// Allocates `size` bytes aligned to `alignment`: reserve → allocate →
    /// commit the charge with the bytes obtained. A failure at any step
    /// returns the grant and frees what was made.
    pub fn allocate(&self, size: u64, alignment: u64) -> Result<OwnedAllocation, BindingError> {
        let b = &*self.inner;
        let m = b.mechanism();
        if size == 0 {
            return Err(zero_size(m));
        }
        let (alloc, lease) = settle::commit_or_undo(
            b,
            size,
            |t| m.allocator_under(t).allocate_placed(size, alignment, b.class, &b.placement),
            |a| m.allocator().deallocate(a),
        )?;
        Ok(OwnedAllocation {
            binding: Some(self.anchor()),
            alloc: Some(alloc),
            lease: Some(lease),
            fences: FenceSet::default(),
        })
    }
}

/// An owning allocation. Dropping it frees through the deferred-free queue
/// after the fences of its last use; it never waits on the device.
pub struct OwnedAllocation {
    /// The binding, through the allocating thread's anchor. Taken (not
    /// cloned) by `drop`, which hands it to the retire job.
    binding: Option<Arc<Anchor>>,
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
    /// The binding it was made through (the mechanism, the queue).
    pub(crate) fn binding_inner(&self) -> &BindingInner {
        &self.binding.as_ref().expect("present until drop").inner
    }
    fn alloc(&self) -> &Allocation {
        self.alloc.as_ref().expect("present until drop")
    }
    /// The block's first byte, as the mechanism returned it: an address in
    /// the mechanism's address space (device memory for a device
    /// mechanism, host memory for the CPU plugin), at least as aligned as
    /// asked. Stable for the allocation's life.
    pub fn addr(&self) -> u64 {
        self.alloc().addr()
    }
    /// Usable bytes, as the mechanism returned them (at least the size
    /// asked; a mechanism may return more).
    pub fn size(&self) -> u64 {
        self.alloc().size()
    }
    /// Bytes charged to the pool.
    pub fn charged(&self) -> u64 {
        self.lease.as_ref().map_or(0, Lease::bytes)
    }
    /// Whether the allocation went with a lost device: its memory is gone,
    /// and dropping it calls no plugin (its charge is settled when the
    /// context terminates).
    pub fn is_lost(&self) -> bool {
        self.binding.as_ref().is_some_and(|b| b.inner.is_lost())
    }
    /// Records device work that uses this allocation: the free waits for it.
    pub fn used_by(&mut self, fence: SharedFence) {
        self.fences.push(fence);
    }
    /// Whether every fence recorded with [`used_by`](Self::used_by) has
    /// completed (true with none): freeing it now would wait for nothing.
    pub fn fences_complete(&self) -> bool {
        self.fences.all_complete()
    }
    /// Whether any fence was recorded (complete or not).
    pub(crate) fn has_fences(&self) -> bool {
        self.fences.first.is_some()
    }
    /// Forgets the recorded fences: for the cache, once the work they
    /// guarded is known to come before any new use (completed, or queued
    /// earlier on the stream the new use runs on).
    pub(crate) fn clear_fences(&mut self) {
        self.fences = FenceSet::default();
    }
    /// Offload to `target`, as [`Region::offload_to`](super::Region::offload_to)
    /// does for a region: always refused, with `Unsupported`. Bringing the
    /// bytes back at the same address needs memory placed at a chosen
    /// address, and a plain allocation's address is the allocator's
    /// choice: no slot of plugin ABI 1.3 re-places it. Memory that must
    /// survive an offload at a stable address is made with
    /// [`MemoryBinding::reserve_virtual`].
    pub fn offload_to(
        &self,
        _target: &MemoryBinding,
        _stream: &crate::tokens::Stream,
    ) -> Result<(), BindingError> {
        Err(BindingError::Unsupported {
            mechanism: self.binding_inner().mechanism().label().to_string(),
            capability:
                "offload of a plain allocation (it cannot be re-placed at the same address: offload a \
                         region made with reserve_virtual instead)",
        })
    }

    /// Releases after `fences` (and any recorded with `used_by`): the
    /// memory stays allocated and charged until every fence completed and
    /// the deferred-free queue was polled (`ProcessMemoryManager::poll`, the
    /// reaper, or a drain). Never blocks.
    ///
    /// ```
    /// # use memplug_host::{governor::AllocationClass, *};
    /// # use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    /// # let mgr = ProcessMemoryManager::new();
    /// # // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// # let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
    /// # mgr.register_plugin(cpu)?;
    /// # let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    /// # let ctx = mgr.select(cpu0, Requirements::ALLOCATOR_ONLY)?;
    /// # let pool = mgr.create_pool("cpu0", 64 << 20)?;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let b = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Activations))?;
    /// let buf = b.allocate(1 << 20, 64)?;
    /// // The runtime's own "is the device done?" (a CUDA event, a queue's
    /// // timeline value...), as a query and a wait.
    /// let done = Arc::new(AtomicBool::new(false));
    /// let (q, w) = (done.clone(), done.clone());
    /// let fence = FnFence::new("step 42", move || q.load(Ordering::Acquire), move |_| w.load(Ordering::Acquire));
    ///
    /// buf.release_after([fence]);
    /// mgr.poll();
    /// assert_eq!(pool.used(), 1 << 20); // the device may still read it
    /// done.store(true, Ordering::Release);
    /// mgr.poll();
    /// assert_eq!(pool.used(), 0); // freed by its mechanism, then refunded
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
        // No device work recorded, or all of it already done (or gone with
        // a lost device): free now, without boxing a job or touching the
        // queue. A lost context's free calls no plugin (settle.rs).
        if self.fences.all_complete() {
            let _ = retire_allocation(&binding.inner, alloc, lease);
        } else {
            let queue = binding.inner.queue.clone();
            let job = AllocationRetire { binding, alloc: Some(alloc), lease: Some(lease) };
            queue.enqueue(std::mem::take(&mut self.fences).into_vec(), Box::new(job));
        }
    }
}

/// Frees through the creating mechanism, then refunds the charge (or
/// quarantines it).
#[inline]
fn retire_allocation(b: &BindingInner, alloc: Allocation, lease: Lease) -> RetireOutcome {
    settle::release_or_quarantine(
        b,
        Charge::Whole(Some(lease)),
        |t| b.mechanism().allocator_under(t).deallocate(alloc),
        |e, reason| format!("allocation {}: {reason}", e.object.object_id()),
    )
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
    /// counts as not complete (never free on a guess), except one of a lost
    /// device, which never completes and whose work is gone.
    #[inline]
    fn all_complete(&self) -> bool {
        match &self.first {
            None => true,
            Some(f) => complete(f) && self.more.iter().all(complete),
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

fn complete(f: &SharedFence) -> bool {
    Completion::of(f).frees()
}

struct AllocationRetire {
    binding: Arc<Anchor>,
    alloc: Option<Allocation>,
    lease: Option<Lease>,
}

impl AllocationRetire {
    fn run(&mut self) -> RetireOutcome {
        match (self.alloc.take(), self.lease.take()) {
            (Some(alloc), Some(lease)) => retire_allocation(&self.binding.inner, alloc, lease),
            _ => RetireOutcome::Freed { bytes: 0 },
        }
    }
}

impl Retire for AllocationRetire {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        self.run()
    }
    fn settled_elsewhere(&self) -> bool {
        self.binding.inner.is_lost()
    }
    fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        self.binding.inner.charged_to()
    }
    fn describe(&self) -> String {
        match &self.alloc {
            Some(a) => format!("allocation {} ({} B at {:#x})", a.object_id(), a.size(), a.addr()),
            None => "allocation (already retired)".into(),
        }
    }
}

/// Size 0 is refused by the binding itself, the same way on every governed
/// path (a binding, a caching binding, the C API, Python): a plugin must
/// refuse it too (the kit's `allocator.zero_size`), but a lenient plugin
/// must not make the answer depend on which plugin is loaded. (The raw
/// `Mechanism::ungoverned` door still sends it, for plugin test harnesses.)
#[cold]
#[inline(never)]
fn zero_size(m: &crate::mechanism::Mechanism) -> BindingError {
    BindingError::Plugin(m.refusal(
        "allocator.allocate",
        memplug_sdk::Status::InvalidArgument,
        "size 0 asked for: an allocation has at least one byte (nothing was allocated or charged)".into(),
    ))
}
