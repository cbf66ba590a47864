//! A caching binding: size-classed reuse of freed blocks over a plain
//! [`MemoryBinding`], so a runtime that allocates and frees activations and
//! workspaces per step pays for the mechanism (on a GPU, a `cuMemCreate` and
//! a map: tens of microseconds) only when the cache has no block of the
//! size. Opt-in: [`ProcessMemoryManager::bind_caching`](crate::ProcessMemoryManager::bind_caching).
//!
//! What it keeps and promises:
//!
//! * **Charged, and reported as cached.** A block stays charged to the pool,
//!   under the holder the cache registers for itself, while it is idle;
//!   [`CacheStats`] says which bytes are idle and which are handed out. The
//!   pool never counts an idle block as free.
//! * **Stream-ordered reuse.** A block freed on a stream behind a fence
//!   ([`CachedAllocation::free_on`]) is reused at once by a request on the
//!   same stream (the stream runs the new work after the old) and by any
//!   other request only after the fence completes. A block whose last use
//!   is recorded with [`CachedAllocation::used_by`] is reused by nobody
//!   before its fences complete. Fences still gate every free (invariant 4):
//!   a block given back to the mechanism waits for them in the deferred-free
//!   queue.
//! * **Pinned blocks stay out.** A block pinned by work outside any stream
//!   ([`CachedAllocation::pinned_by`]: a UCX registration, a transfer by a
//!   NIC) and freed before the pin completes is kept out of the idle lists:
//!   no request takes it (not even one on the stream it was freed on), and
//!   neither trim, the idle policy nor a pressure ticket gives it back. It
//!   stays counted in use ([`CacheStats::pinned_blocks`]) and becomes idle
//!   once every fence on it completed, at the next miss, `trim` or
//!   `collect`.
//! * **Cached bytes go first under pressure.** The cache answers pressure
//!   tickets with its idle blocks (ready ones first, then pending ones, which
//!   free after their fences) and answers with the bytes it gave back; it
//!   never frees a block that is handed out. A miss that finds the pool too
//!   full gives back the cache's own idle blocks before asking other holders.
//! * **Device loss and retirement.** When the context leaves `Active` the
//!   idle blocks are dropped (a lost device's without calling its plugin:
//!   the context's settlement covers them) and nothing is kept any more.
//!
//! Blocks are never split or merged: a block serves requests of its size
//! class, which is at most 25 % larger than the request (`classes.rs`).
//! Requests above [`CacheConfig::max_block`] bypass the cache.

mod classes;
mod lock;
mod policy;
mod shard;
mod stats;

pub use policy::IdlePolicy;
pub use stats::CacheStats;

use crate::binding::{BindingError, MemoryBinding, OwnedAllocation};
use crate::context::SubscriptionId;
use crate::fence::SharedFence;
use crate::governor::{GovernorError, HolderRegistration, PressureCallback, PressureTicket, Priority};
use crate::lifecycle::STRIPES;
use crate::reentry::thread_stripe;
use crate::tokens::Stream;
use crate::LifeState;
use lock::ShardLock;
use shard::{Block, Shard, Taken};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};

/// How a caching binding is set up.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// The name of the holder the cache registers (in pool statistics and
    /// pressure reports).
    pub holder_name: String,
    /// The holder's priority. Lower priorities are asked first under
    /// pressure, and a request may only ask holders of its own priority or
    /// lower: so the default, [`Priority::LOWEST`], gives cached bytes back
    /// before any other holder's, and a miss can make room only from idle
    /// caches of the same priority. Raise it to let misses press on others.
    pub priority: Priority,
    /// Requests larger than this are served and freed by the binding
    /// directly, never kept.
    pub max_block: u64,
    /// New blocks are aligned to at least this (a power of two) and to the
    /// mechanism's own minimum alignment, so a block can serve requests of
    /// any alignment up to the larger. The default, 16, is what `malloc`
    /// gives without its slower aligned path; a device mechanism's minimum
    /// (256 B and more) applies on its own.
    pub min_alignment: u64,
    /// When idle blocks are given back without being asked (a cap on idle
    /// bytes, an age, a usage threshold): see [`IdlePolicy`].
    pub idle: IdlePolicy,
}

impl CacheConfig {
    /// Why this configuration cannot make a cache, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        if !self.min_alignment.is_power_of_two() {
            return Err(format!("min_alignment {} is not a power of two", self.min_alignment));
        }
        if classes::class_of(self.max_block).is_none() {
            return Err(format!("max_block {} has no size class", self.max_block));
        }
        self.idle.validate()
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            holder_name: "cache".into(),
            priority: Priority::LOWEST,
            max_block: 1 << 30,
            min_alignment: 16,
            idle: IdlePolicy::default(),
        }
    }
}

/// The stream a block is freed on or requested for: reuse on the same key
/// is ordered by the stream itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey(Key);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A runtime's own stream (its handle: a `cudaStream_t`, a queue id).
    Runtime(u64),
    /// A stream of a mechanism's sync capability.
    Mechanism { mechanism: u64, handle: u64 },
    /// Fences of no known stream: matches no request.
    Unordered,
}

impl StreamKey {
    /// A stream of the runtime's, named by its handle. Two requests with
    /// the same handle must be on the same stream.
    pub const fn runtime(handle: u64) -> Self {
        StreamKey(Key::Runtime(handle))
    }
    /// A stream of a mechanism's sync capability (created or adopted).
    pub fn of(stream: &Stream) -> Self {
        StreamKey(Key::Mechanism { mechanism: stream.mechanism_key, handle: stream.handle })
    }
    pub(crate) const NONE: StreamKey = StreamKey(Key::Unordered);
}

/// A shard on a cache line of its own, so two threads' shards do not share
/// one.
#[repr(align(64))]
struct PaddedShard {
    shard: ShardLock<Shard>,
    /// The shard's idle bytes as of its last change, written under its
    /// lock (a plain store, no read-modify-write): a miss skips shards with
    /// none without locking them, and a free sums them to check the cap.
    idle: AtomicU64,
}

impl PaddedShard {
    /// Runs `f` on the shard under its lock, then publishes its idle bytes.
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Shard) -> R) -> R {
        let mut s = self.shard.lock();
        let r = f(&mut s);
        self.idle.store(s.counters.idle_bytes, Relaxed);
        r
    }
}

struct CacheInner {
    /// First field: dropped first, so idle blocks free while the binding
    /// and the holder are still there.
    /// An array (not a slice): indexed by a stripe `% STRIPES`, it needs no
    /// bounds check.
    shards: Box<[PaddedShard; STRIPES]>,
    binding: MemoryBinding,
    /// The number of size classes (up to `max_block`'s).
    classes: usize,
    holder: HolderRegistration,
    subscription: OnceLock<SubscriptionId>,
    /// The idle policy, applied to this cache's pool.
    policy: policy::Applied,
    /// What new blocks are aligned to: the configured minimum or the
    /// mechanism's, the larger.
    block_alignment: u64,
    /// When a miss next gives back blocks past their age (a
    /// `policy::Applied` stamp).
    next_age_check: AtomicU64,
    /// Bit `i` set while shard `i` has parked (pinned, freed) blocks;
    /// changed under that shard's lock. A miss reads this one word, not
    /// every shard.
    parked_shards: AtomicU64,
}

impl Drop for CacheInner {
    fn drop(&mut self) {
        if let Some(id) = self.subscription.get() {
            self.binding.inner.context.unsubscribe(*id);
        }
    }
}

/// A stripe's reference to a cache (as a binding's anchors: each on a line
/// of its own, so handing out blocks on two threads does not share one
/// reference count).
#[repr(align(64))]
struct CacheAnchor {
    cache: Arc<CacheInner>,
}

/// A caching binding. Cheap to clone; thread-safe. Dropping the last clone
/// (and the last block it handed out) gives every idle block back.
#[derive(Clone)]
pub struct CachingBinding {
    anchors: Arc<[Arc<CacheAnchor>; STRIPES]>,
}

impl fmt::Debug for CachingBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingBinding")
            .field("binding", &self.inner().binding)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CachingBinding {
    /// Wraps `binding`, whose holder is `holder` (registered for this
    /// cache), and installs the cache's answer to that holder's tickets in
    /// `answer` (what the registration's callback calls).
    pub(crate) fn new(
        binding: MemoryBinding,
        config: CacheConfig,
        holder: HolderRegistration,
        answer: &OnceLock<Box<PressureCallback>>,
    ) -> Self {
        let classes = classes::classes_up_to(config.max_block);
        let shards = Box::new(std::array::from_fn(|_| PaddedShard {
            shard: ShardLock::new(Shard::new(classes)),
            idle: AtomicU64::new(0),
        }));
        let policy = policy::Applied::new(&config.idle, binding.pool().capacity(), STRIPES);
        let mechanism_min = binding.mechanism().properties().min_alignment;
        let block_alignment = config.min_alignment.max(mechanism_min.next_power_of_two());
        let inner = Arc::new(CacheInner {
            shards,
            binding,
            classes,
            holder,
            subscription: OnceLock::new(),
            policy,
            block_alignment,
            next_age_check: AtomicU64::new(0),
            parked_shards: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let _ = answer.set(Box::new(move |t: &PressureTicket| {
            weak.upgrade().map_or(0, |c| c.give_back(t.bytes_wanted, true, |s, b| s.pressure_bytes += b))
        }));
        // Leaving `Active` (retired, lost): nothing idle is kept any more.
        let weak: Weak<CacheInner> = Arc::downgrade(&inner);
        let id = inner.binding.inner.context.subscribe(move |e| {
            if e.to != LifeState::Active {
                if let Some(c) = weak.upgrade() {
                    c.give_back(u64::MAX, true, |s, b| s.trimmed_bytes += b);
                    c.unpark(false);
                }
            }
        });
        let _ = inner.subscription.set(id);
        let anchors = Arc::new(std::array::from_fn(|_| Arc::new(CacheAnchor { cache: inner.clone() })));
        CachingBinding { anchors }
    }

    fn inner(&self) -> &CacheInner {
        &self.anchors[0].cache
    }

    /// The plain binding under the cache (its pool, class, mechanism).
    pub fn binding(&self) -> &MemoryBinding {
        &self.inner().binding
    }

    /// The holder the cache registered; its bytes are the cache's.
    pub fn holder(&self) -> &HolderRegistration {
        &self.inner().holder
    }

    /// `size` bytes aligned to `alignment`, for use by the host (ordered on
    /// no stream): an idle block of the size class no device work may
    /// still use, else a new one.
    #[inline]
    pub fn allocate(&self, size: u64, alignment: u64) -> Result<CachedAllocation, BindingError> {
        self.get(size, alignment, None)
    }

    /// As [`allocate`](Self::allocate), for work on `stream`: may also reuse
    /// a block freed on `stream` whose fences have not completed.
    #[inline]
    pub fn allocate_on(
        &self,
        size: u64,
        alignment: u64,
        stream: StreamKey,
    ) -> Result<CachedAllocation, BindingError> {
        self.get(size, alignment, Some(stream))
    }

    /// [`allocate`](Self::allocate) when `stream` is `None`, else
    /// [`allocate_on`](Self::allocate_on): for a caller that has the stream
    /// as an option (the C API), so that it inlines one body, not two.
    /// Always inlined: out of line in `memplug_host_cache_allocate`, `get`
    /// cost a frame and the allocation copied through a result in memory
    /// (callgrind).
    #[inline(always)]
    pub fn allocate_maybe_on(
        &self,
        size: u64,
        alignment: u64,
        stream: Option<StreamKey>,
    ) -> Result<CachedAllocation, BindingError> {
        self.get(size, alignment, stream)
    }

    #[inline]
    fn get(
        &self,
        size: u64,
        alignment: u64,
        stream: Option<StreamKey>,
    ) -> Result<CachedAllocation, BindingError> {
        let stripe = thread_stripe() % STRIPES;
        let anchor = &self.anchors[stripe];
        let c = &*anchor.cache;
        let class = match classes::class_of(size) {
            // Size 0 goes to the binding, which refuses it as every path does.
            Some(k)
                if k.index < c.classes
                    && size != 0
                    && alignment.is_power_of_two()
                    && c.binding.is_active() =>
            {
                k
            }
            _ => return c.bypass(anchor, size, alignment, stripe),
        };
        let hit = c.shards[stripe].with(|s| s.take(class.index, alignment, stream));
        let block = match hit {
            Some(b) => b,
            None => c.miss(class, alignment, stream, stripe)?,
        };
        Ok(CachedAllocation {
            block: Some(block),
            size,
            class: class.index as u32,
            pinned: false,
            cache: Some(anchor.clone()),
        })
    }

    /// Gives idle blocks back to the mechanism until `bytes` of charge are
    /// refunded or queued for refund (`u64::MAX`: every idle block);
    /// returns the bytes given back. Pending blocks go last, and free after
    /// their fences through the deferred-free queue.
    pub fn trim(&self, bytes: u64) -> u64 {
        self.inner().unpark(true);
        self.inner().give_back(bytes, true, |s, b| s.trimmed_bytes += b)
    }

    /// Applies the idle policy now, as if every rule were due: gives back
    /// blocks idle past the age, idle bytes above the cap, and, when the
    /// pool's use is past the usage threshold, ready blocks until it is
    /// not. Returns the bytes given back (counted as trimmed). For a
    /// runtime to call between steps, or from a timer: a cache nobody
    /// allocates from has no miss to apply the age at.
    pub fn collect(&self) -> u64 {
        let c = self.inner();
        c.unpark(true);
        let mut total = c.give_back_aged();
        total += c.enforce_cap();
        total + c.give_back_over_threshold(0)
    }

    /// The cap on idle bytes this cache applies (`u64::MAX`: none): the
    /// policy's, or a quarter of the pool's capacity when it was made.
    pub fn max_idle_bytes(&self) -> u64 {
        self.inner().policy.max_idle_bytes
    }

    /// The cache's figures now.
    pub fn stats(&self) -> CacheStats {
        let mut s = stats::Sums::default();
        for shard in self.inner().shards.iter() {
            s.add(&shard.shard.lock().counters);
        }
        s.stats()
    }
}

impl CacheInner {
    /// A request the size classes do not serve (too large, an alignment
    /// that is not a power of two, a context that makes nothing new): the
    /// binding serves it or says why not; nothing is kept.
    #[cold]
    fn bypass(
        &self,
        anchor: &Arc<CacheAnchor>,
        size: u64,
        alignment: u64,
        stripe: usize,
    ) -> Result<CachedAllocation, BindingError> {
        if !self.binding.is_active() {
            self.give_back(u64::MAX, true, |s, b| s.trimmed_bytes += b);
        }
        let block = Box::new(self.binding.allocate(size, alignment)?);
        self.shards[stripe].shard.lock().counters.bypasses += 1;
        Ok(CachedAllocation {
            block: Some(block),
            size,
            class: BYPASS,
            pinned: false,
            cache: Some(anchor.clone()),
        })
    }

    /// No idle block in the thread's shard: another shard's, else a new
    /// block (after giving back this cache's own idle blocks when the pool
    /// has no room for it).
    #[cold]
    fn miss(
        &self,
        class: classes::SizeClass,
        alignment: u64,
        stream: Option<StreamKey>,
        stripe: usize,
    ) -> Result<Block, BindingError> {
        // Pinned blocks freed earlier whose pins have completed: idle now,
        // the thread's own shard first.
        if self.unpark(true) {
            if let Some(b) = self.shards[stripe].with(|s| s.take(class.index, alignment, stream)) {
                return Ok(b);
            }
        }
        for other in (1..STRIPES).map(|i| (stripe + i) % STRIPES) {
            let padded = &self.shards[other];
            // Most misses find every other shard empty: no lock for those.
            if padded.idle.load(Relaxed) == 0 {
                continue;
            }
            let Some(mut shard) = padded.shard.try_lock() else { continue };
            let hit = shard.take(class.index, alignment, stream);
            padded.idle.store(shard.counters.idle_bytes, Relaxed);
            if let Some(b) = hit {
                return Ok(b);
            }
        }
        if self.policy.max_idle_age.is_some() {
            let now = self.policy.now();
            let due = self.next_age_check.load(Relaxed);
            let age = self.policy.max_idle_age.map_or(0, |a| a.as_millis() as u64);
            if now >= due
                && self.next_age_check.compare_exchange(due, now + age / 4, Relaxed, Relaxed).is_ok()
            {
                self.give_back_aged();
            }
        }
        self.give_back_over_threshold(class.bytes);
        let align = alignment.max(self.block_alignment);
        let free = self.binding.pool().free();
        if free < class.bytes {
            self.give_back(class.bytes - free, false, |s, b| s.pressure_bytes += b);
        }
        let block = Box::new(match self.binding.allocate(class.bytes, align) {
            Err(BindingError::Budget(GovernorError::OutOfBudget(_))) if self.idle_bytes() > 0 => {
                self.give_back(u64::MAX, true, |s, b| s.pressure_bytes += b);
                self.binding.allocate(class.bytes, align)?
            }
            r => r?,
        });
        self.shards[stripe].shard.lock().made(block.charged());
        Ok(block)
    }

    /// Parked blocks (freed while pinned) whose fences all completed
    /// become ready (`keep`); without `keep` (the context left `Active`)
    /// every parked block is freed behind its fences. Shards with none are
    /// not locked. Returns whether any block left a park.
    fn unpark(&self, keep: bool) -> bool {
        let mask = self.parked_shards.load(Relaxed);
        if mask == 0 {
            return false;
        }
        let mut out = Taken::default();
        let mut moved = false;
        for (i, padded) in self.shards.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0) {
            let since = self.policy.stamp();
            padded.with(|s| {
                let before = s.counters.pinned_blocks;
                let after = s.unpark(since, keep, &mut out);
                if after == 0 {
                    self.parked_shards.fetch_and(!(1 << i), Relaxed);
                }
                moved |= after < before;
            });
        }
        drop(out); // outside the locks: each frees through the binding
        moved
    }

    fn idle_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.shard.lock().counters.idle_bytes).sum()
    }

    /// Whether no shard holds an idle block (each shard's own figure, read
    /// without its lock).
    fn nothing_idle(&self) -> bool {
        self.shards.iter().all(|s| s.idle.load(Relaxed) == 0)
    }

    /// A free took its shard's idle bytes past the shard's part of the
    /// cap: sums every shard's and gives back what is above the cap.
    /// Returns the bytes given back.
    #[cold]
    #[inline(never)]
    fn enforce_cap(&self) -> u64 {
        let cap = self.policy.max_idle_bytes;
        let idle: u64 = self.shards.iter().map(|s| s.idle.load(Relaxed)).sum();
        if idle <= cap {
            return 0;
        }
        self.give_back(idle - cap, true, |s, b| s.trimmed_bytes += b)
    }

    /// With a usage threshold set: gives back ready blocks until the
    /// pool's use plus `bytes` about to be charged is under it. Returns the
    /// bytes given back.
    fn give_back_over_threshold(&self, bytes: u64) -> u64 {
        if self.policy.gc_threshold.is_none() {
            return 0;
        }
        let pool = self.binding.pool();
        match self.policy.over_threshold(pool.used(), bytes, pool.capacity()) {
            0 => 0,
            over => self.give_back(over, false, |s, b| s.trimmed_bytes += b),
        }
    }

    /// Gives back every block idle longer than the policy's age. Returns
    /// the bytes given back.
    #[cold]
    fn give_back_aged(&self) -> u64 {
        let Some(cutoff) = self.policy.cutoff() else { return 0 };
        let mut out = Taken::default();
        let mut total = 0;
        for shard in self.shards.iter() {
            total += shard.with(|s| {
                let got = s.take_older(cutoff, &mut out);
                s.counters.trimmed_bytes += got;
                got
            });
        }
        drop(out); // outside the locks: each frees through the binding
        total
    }

    /// Takes idle blocks out of every shard until `wanted` bytes, drops
    /// them outside the locks (each frees through the binding), and records
    /// the bytes with `count`. Returns the bytes given back.
    fn give_back(&self, wanted: u64, pending_too: bool, count: fn(&mut shard::Counters, u64)) -> u64 {
        let mut out = Taken::default();
        let mut total = 0u64;
        for pass_pending in [false, true] {
            if pass_pending && !pending_too {
                break;
            }
            // The running thread's shard first (a free past the cap left
            // its blocks there); shards with nothing idle are not locked.
            let first = thread_stripe() % STRIPES;
            for shard in (0..STRIPES).map(|i| &self.shards[(first + i) % STRIPES]) {
                if total >= wanted {
                    break;
                }
                if shard.idle.load(Relaxed) == 0 {
                    continue;
                }
                total += shard.with(|s| {
                    let got = s.take_idle(wanted - total, pass_pending, &mut out);
                    count(&mut s.counters, got);
                    got
                });
            }
        }
        drop(out);
        total
    }
}

const BYPASS: u32 = u32::MAX;
// `parked_shards` has a bit per shard.
const _: () = assert!(STRIPES <= 64);

impl CacheInner {
    /// Keeps a block freed while pinned out of the idle lists.
    #[cold]
    #[inline(never)]
    fn park(&self, stripe: usize, class: usize, block: Block) {
        self.shards[stripe].with(|s| {
            s.park(class, block);
            self.parked_shards.fetch_or(1 << stripe, Relaxed);
        });
    }
}

/// A block handed out by a [`CachingBinding`]. Dropping it gives it back
/// to the cache (reusable by anyone at once, or once the fences recorded
/// with [`used_by`](Self::used_by) complete); [`free_on`](Self::free_on)
/// gives it back behind work on a stream.
pub struct CachedAllocation {
    block: Option<Block>,
    /// Bytes requested.
    size: u64,
    /// The size class, or `BYPASS`.
    class: u32,
    /// A fence recorded with `pinned_by`: freed before its fences complete,
    /// the block is parked rather than kept idle.
    pinned: bool,
    cache: Option<Arc<CacheAnchor>>,
}

impl fmt::Debug for CachedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedAllocation({:#x}, {} B of a {} B block)", self.addr(), self.size, self.block_size())
    }
}

impl CachedAllocation {
    pub(crate) fn block(&self) -> &OwnedAllocation {
        self.block.as_ref().expect("present until drop")
    }
    /// The address (aligned as requested). Inline: across the crate
    /// boundary (the C API) it was a call through the GOT, and the spills
    /// around it cost ~37 instructions a C pair. No panic path: the block
    /// is there from the allocation's making until its drop or `free_on`,
    /// which end it, so the `None` arm is never taken (with `expect`, its
    /// unwind path cost a Rust allocate + free ~30 instructions more).
    #[inline]
    pub fn addr(&self) -> u64 {
        match &self.block {
            Some(b) => b.addr(),
            None => 0,
        }
    }
    /// Bytes requested.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Bytes of the block serving it (its size class; at least `size`).
    pub fn block_size(&self) -> u64 {
        self.block().size()
    }
    /// Bytes charged to the pool for the block.
    pub fn charged(&self) -> u64 {
        self.block().charged()
    }
    /// Whether the cache keeps the block when it is freed (false for a
    /// request above the largest class).
    pub fn is_cached(&self) -> bool {
        self.class != BYPASS
    }
    /// Whether the block went with a lost device.
    pub fn is_lost(&self) -> bool {
        self.block().is_lost()
    }
    /// Records device work that uses the block: nobody reuses it (and it is
    /// not freed) before the fence completes.
    pub fn used_by(&mut self, fence: SharedFence) {
        self.block.as_mut().expect("present until drop").used_by(fence);
    }
    /// Records work outside any stream that keeps the block (a UCX
    /// registration, a transfer by a NIC): until `fence` completes the block
    /// is reused by nobody — not even a request on the stream it is freed
    /// on with [`free_on`](Self::free_on) — and not given back to the
    /// mechanism by trim, the idle policy or a pressure ticket. Freed
    /// meanwhile, it stays out of the idle lists, counted in use
    /// ([`CacheStats::pinned_blocks`]), until every fence on it completed;
    /// a block the cache does not keep (a bypass, a context no longer
    /// active) frees behind the fence. (Pins are not told apart from other
    /// fences on the block: once pinned, a block freed while any of its
    /// fences is pending — a pin's or `free_on`'s — waits for all of them,
    /// on its stream too. Conservative; a new request of the block starts
    /// unpinned.)
    pub fn pinned_by(&mut self, fence: SharedFence) {
        self.pinned = true;
        self.block.as_mut().expect("present until drop").used_by(fence);
    }
    /// Gives the block back behind `fence`, the last work using it on
    /// `stream`: a request on `stream` may reuse it at once, any other only
    /// once `fence` (and any fence recorded with `used_by`) completes. A
    /// block pinned ([`pinned_by`](Self::pinned_by)) is reused by nobody,
    /// on `stream` neither, before every fence on it completes.
    pub fn free_on(mut self, stream: StreamKey, fence: SharedFence) {
        let mut block = self.block.take().expect("present until drop");
        block.used_by(fence);
        self.give_back(block, Some(stream));
    }

    #[inline]
    fn give_back(&mut self, block: Block, stream: Option<StreamKey>) {
        let Some(anchor) = self.cache.take() else { return };
        if self.class == BYPASS {
            return drop(block);
        }
        let c = &anchor.cache;
        let stripe = thread_stripe() % STRIPES;
        // The block's context is the binding's: not active covers lost.
        if !c.binding.is_active() {
            c.shards[stripe].shard.lock().forget_in_use(block.charged());
            return drop(block);
        }
        if self.pinned && block.has_fences() && !block.fences_complete() {
            return c.park(stripe, self.class as usize, block);
        }
        if block.charged() > c.policy.max_idle_bytes && !block.has_fences() && c.nothing_idle() {
            // Kept, it would be the only idle block and past the cap: the
            // cap would give it straight back. Do that, without keeping it.
            c.shards[stripe].shard.lock().passed_through(block.charged());
            return drop(block);
        }
        let since = c.policy.stamp();
        let idle = c.shards[stripe].with(|s| s.put(self.class as usize, block, stream, since));
        if idle > c.policy.shard_check {
            c.enforce_cap();
        }
    }
}

impl Drop for CachedAllocation {
    #[inline]
    fn drop(&mut self) {
        if let Some(mut block) = self.block.take() {
            // Fences recorded and already complete: ready for anyone.
            if block.has_fences() && block.fences_complete() {
                block.clear_fences();
            }
            self.give_back(block, None);
        }
    }
}
