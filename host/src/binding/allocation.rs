//! Plain allocations: [`MemoryBinding::allocate`], the owning
//! [`OwnedAllocation`], the fences of its last use, and its retire job.

use super::settle::{self, Charge};
use super::{Anchor, BindingError, BindingInner, MemoryBinding};
use crate::deferred::{Retire, RetireOutcome};
use crate::fence::{Completion, SharedFence};
use crate::governor::Lease;
use crate::mechanism::Mechanism;
use crate::tokens::{Allocation, RawObject};
use std::fmt;
use std::mem::ManuallyDrop;
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
        // The lease is of the bytes the plugin returned (`commit_or_undo`
        // commits `made.bytes()`): the block's size, so it is not stored
        // twice; the drop rejoins it from the size.
        let charged = lease.split();
        debug_assert_eq!(charged, alloc.size());
        Ok(OwnedAllocation {
            binding: ManuallyDrop::new(self.anchor()),
            block: Block::of(alloc),
            fences: ManuallyDrop::new(FenceSet::default()),
        })
    }
}

/// What an allocation keeps of its token: the parts the plugin returned
/// and the host's object id. The mechanism's key, id and device are the
/// binding's, so they are not stored per allocation (the token is rebuilt
/// from both when the block is freed): 32 bytes to move, not 56.
#[derive(Clone, Copy)]
struct Block {
    object_id: u64,
    addr: u64,
    size: u64,
    handle: u64,
}

impl Block {
    #[inline(always)]
    fn of(a: Allocation) -> Block {
        let r = a.into_raw();
        Block { object_id: r.object_id, addr: r.addr, size: r.size, handle: r.handle }
    }

    /// The token again, for the mechanism that made it (`m`, the binding's).
    #[inline(always)]
    fn token(self, m: &Mechanism) -> Allocation {
        let i = &m.inner;
        Allocation(RawObject {
            mechanism_key: i.key,
            mechanism_id: i.id,
            device: i.device,
            object_id: self.object_id,
            addr: self.addr,
            size: self.size,
            handle: self.handle,
        })
    }
}

/// An owning allocation. Dropping it frees through the deferred-free queue
/// after the fences of its last use; it never waits on the device.
///
/// Kept small (64 bytes, one cache line; checked below), because it is
/// moved on every allocate and free:
/// the block's token and its lease are stored as their parts that are not
/// the binding's (its `Block`, whose size is the bytes charged) and made
/// whole again when
/// it is freed.
pub struct OwnedAllocation {
    /// The binding, through the allocating thread's anchor. Moved out (not
    /// cloned) by `drop`, which hands it to the retire job; taken only
    /// there.
    binding: ManuallyDrop<Arc<Anchor>>,
    /// Its size is also the bytes of its lease (of the binding's pool,
    /// holder and class): a lease is committed with the bytes the plugin
    /// returned.
    block: Block,
    /// Dropped by `drop` only when not empty: an empty set then costs one
    /// compare, not a call to its drop glue.
    fences: ManuallyDrop<FenceSet>,
}

// The size the comment above promises (on 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<OwnedAllocation>() == 64);

impl fmt::Debug for OwnedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnedAllocation({:#x}, {} B)", self.addr(), self.size())
    }
}

impl OwnedAllocation {
    /// The binding it was made through (the mechanism, the queue).
    pub(crate) fn binding_inner(&self) -> &BindingInner {
        &self.binding.inner
    }
    /// The block's first byte, as the mechanism returned it: an address in
    /// the mechanism's address space (device memory for a device
    /// mechanism, host memory for the CPU plugin), at least as aligned as
    /// asked. Stable for the allocation's life.
    pub fn addr(&self) -> u64 {
        self.block.addr
    }
    /// Usable bytes, as the mechanism returned them (at least the size
    /// asked; a mechanism may return more).
    pub fn size(&self) -> u64 {
        self.block.size
    }
    /// Bytes charged to the pool.
    pub fn charged(&self) -> u64 {
        self.block.size
    }
    /// Whether the allocation went with a lost device: its memory is gone,
    /// and dropping it calls no plugin (its charge is settled when the
    /// context terminates).
    pub fn is_lost(&self) -> bool {
        self.binding.inner.is_lost()
    }
    /// Records device work that uses this allocation: the free waits for it.
    /// Inline: the C API's fenced free records its fence with this (a call
    /// through the GOT out of line).
    #[inline]
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
        !self.fences.is_empty()
    }
    /// Forgets the recorded fences: for the cache, once the work they
    /// guarded is known to come before any new use (completed, or queued
    /// earlier on the stream the new use runs on).
    pub(crate) fn clear_fences(&mut self) {
        *self.fences = FenceSet::default();
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
    #[inline]
    fn drop(&mut self) {
        // SAFETY: taken once, here; nothing reads the field afterwards.
        let binding = unsafe { ManuallyDrop::take(&mut self.binding) };
        let block = self.block;
        // No device work recorded, or all of it already done (or gone with
        // a lost device): free now, without boxing a job or touching the
        // queue. A lost context's free calls no plugin (settle.rs).
        if self.fences.is_empty() {
            let _ = retire_allocation(&binding.inner, block);
            return;
        }
        // SAFETY: taken once, here; nothing reads the field afterwards.
        let fences = unsafe { ManuallyDrop::take(&mut self.fences) };
        drop_fenced(binding, block, fences);
    }
}

/// The free of an allocation with fences recorded: at once when all have
/// completed (the fences are dropped after the free, as a field would be),
/// else a job for the deferred-free queue.
#[inline(never)]
fn drop_fenced(binding: Arc<Anchor>, block: Block, fences: FenceSet) {
    if fences.all_complete() {
        let _ = retire_allocation(&binding.inner, block);
        drop(fences);
    } else {
        let queue = binding.inner.queue.clone();
        let job = AllocationRetire { binding, block: Some(block) };
        queue.enqueue(fences.into_vec(), Box::new(job));
    }
}

/// Frees through the creating mechanism, then refunds the charge (or
/// quarantines it): the token and the lease made whole from the
/// allocation's parts and its binding's.
#[inline(always)]
fn retire_allocation(b: &BindingInner, block: Block) -> RetireOutcome {
    let m = b.mechanism();
    let lease = Lease::rejoin(b.pool.id(), b.holder, b.class, block.size);
    settle::release_or_quarantine(
        b,
        Charge::Whole(Some(lease)),
        |t| m.allocator_under(t).deallocate(block.token(m)),
        |e, reason| format!("allocation {}: {reason}", e.object.object_id()),
    )
}

/// The fences of one allocation's last use. The common cases — none, or
/// one (the stream the work ran on) — need no heap allocation; more go to
/// a boxed list, so that the set is 24 bytes and an empty one is tested
/// with one compare.
#[derive(Default)]
struct FenceSet {
    first: Option<SharedFence>,
    // Boxed on purpose: one pointer (8 bytes, the common case empty) in
    // every allocation instead of a vector's 24.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<SharedFence>>>,
}

impl FenceSet {
    #[inline]
    fn push(&mut self, f: SharedFence) {
        if self.first.is_none() {
            self.first = Some(f);
        } else {
            self.more.get_or_insert_with(Box::default).push(f);
        }
    }

    /// No fence recorded (`first` is filled before `more`).
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// True when every fence reports completion; a fence whose query fails
    /// counts as not complete (never free on a guess), except one of a lost
    /// device, which never completes and whose work is gone.
    #[inline(always)]
    fn all_complete(&self) -> bool {
        match &self.first {
            None => true,
            Some(f) => complete(f) && self.more.as_deref().is_none_or(|m| m.iter().all(complete)),
        }
    }

    fn into_vec(self) -> Vec<SharedFence> {
        let mut v = self.more.map_or_else(Vec::new, |b| *b);
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
    /// The block (its size the bytes charged), until retired.
    block: Option<Block>,
}

impl AllocationRetire {
    fn run(&mut self) -> RetireOutcome {
        match self.block.take() {
            Some(block) => retire_allocation(&self.binding.inner, block),
            None => RetireOutcome::Freed { bytes: 0 },
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
        match &self.block {
            Some(b) => format!("allocation {} ({} B at {:#x})", b.object_id, b.size, b.addr),
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
