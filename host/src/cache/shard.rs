//! One stripe of a cache: the idle blocks of each size class, and the
//! figures of the operations that ran on it. A thread uses its own stripe
//! (`thread_stripe`), so two threads allocating through one cache lock
//! different shards; a miss looks at the other shards before it makes a
//! block.
//!
//! An idle block is either *ready* (no device work may still use it: any
//! thread or stream may take it) or *pending*: freed on a stream behind work
//! that may still run. A pending block is taken at once by a request on the
//! same stream — the stream runs the new work after the old — and by any
//! other request only once its fences report completion.

use super::StreamKey;
use crate::binding::OwnedAllocation;
use std::collections::VecDeque;

/// A block: boxed once when it is made, so handing it out and taking it
/// back moves a pointer, not the allocation's 64 bytes. Measured with
/// callgrind: kept inline, a miss saves the box (~100 instructions) but a
/// hit pays the copies (a cached pair 250 → 379).
pub(crate) type Block = Box<OwnedAllocation>;

/// Blocks taken out of shards to be freed once their locks are released.
/// Giving back under the idle cap usually takes one block: it needs no
/// heap allocation then.
#[derive(Default)]
pub(crate) struct Taken {
    first: Option<Block>,
    more: Vec<Block>,
}

impl Taken {
    fn push(&mut self, b: Block) {
        match self.first {
            None => self.first = Some(b),
            Some(_) => self.more.push(b),
        }
    }
}

/// How many idle blocks of a class one request looks at before it gives
/// up (blocks of another stream or a smaller alignment), so a request's
/// cost does not grow with the number of idle blocks.
const LOOK: usize = 8;

/// An idle block and when it became idle (`policy::Applied::stamp`: 0
/// when the cache sets no age).
struct Idle {
    block: Block,
    since: u64,
}

/// The idle blocks of one size class in one shard.
#[derive(Default)]
struct ClassList {
    /// Usable by anyone; the most recently freed last (reused first: its
    /// lines are the likeliest to be in a cache), so the oldest are first.
    ready: Vec<Idle>,
    /// Freed behind work on a stream, oldest first. Fences recorded on one
    /// stream complete in order, so the front is the first to become ready.
    pending: VecDeque<(StreamKey, Idle)>,
}

/// A shard's figures (written under the shard's lock). Block counts are
/// derived from event counts (`CacheStats::add`), so a pair updates three
/// figures each way. A block may leave through one shard and come back
/// through another, so one shard's `in_use_bytes` (and the derived counts)
/// may wrap below zero; the sums over shards never do.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub bypasses: u64,
    /// Blocks given back and kept.
    pub returns: u64,
    /// Blocks given back and not kept (their context not active).
    pub forgotten: u64,
    /// Idle blocks taken out to be freed (trim, pressure, loss).
    pub dropped: u64,
    pub idle_bytes: u64,
    pub pending_blocks: u64,
    pub in_use_bytes: u64,
    pub trimmed_bytes: u64,
    pub pressure_bytes: u64,
    /// Blocks freed while pinned, kept out of the idle lists (and still
    /// counted in use) until their fences complete.
    pub pinned_blocks: u64,
}

#[derive(Default)]
pub(crate) struct Shard {
    classes: Vec<ClassList>,
    /// Blocks freed while pinned (`CachedAllocation::pinned_by`) and their
    /// classes: in no idle list, so no request takes them (not even one on
    /// the stream they were freed on) and neither trim nor pressure gives
    /// them back, until every fence on them completes (`unpark`).
    parked: Vec<(usize, Block)>,
    /// No class above this one has idle blocks (it may have none itself):
    /// taking idle blocks out looks at no class above it.
    top: usize,
    pub counters: Counters,
}

/// Whether `a` may serve a request aligned to `align` (a power of two).
#[inline(always)]
fn fits(a: &OwnedAllocation, align: u64) -> bool {
    a.addr() & (align - 1) == 0
}

impl Shard {
    pub fn new(classes: usize) -> Self {
        Shard {
            classes: (0..classes).map(|_| ClassList::default()).collect(),
            parked: Vec::new(),
            top: 0,
            counters: Counters::default(),
        }
    }

    /// An idle block of class `class` for a request aligned to `align`
    /// (a power of two), made on `stream` (`None`: by the host, not ordered
    /// on any stream). Counted as handed out.
    #[inline]
    pub fn take(&mut self, class: usize, align: u64, stream: Option<StreamKey>) -> Option<Block> {
        let list = &mut self.classes[class];
        let mut block = None;
        // The newest block freed on the requesting stream: ordered after the
        // work it was freed behind, so its fences need not be asked.
        if let Some(s) = stream {
            let n = list.pending.len();
            let i = (n.saturating_sub(LOOK)..n)
                .rev()
                .find(|&i| list.pending[i].0 == s && fits(&list.pending[i].1.block, align));
            if let Some(i) = i {
                block = list.pending.remove(i).map(|(_, idle)| idle.block);
                self.counters.pending_blocks -= 1;
            }
        }
        if block.is_none() {
            // The newest ready block almost always fits: try it before the
            // search. An empty list (every miss) calls neither search.
            block = match list.ready.last() {
                Some(i) if fits(&i.block, align) => list.ready.pop().map(|i| i.block),
                Some(_) => Self::search_ready(list, align),
                None => None,
            };
        }
        if block.is_none() && !list.pending.is_empty() {
            block = Self::promote(list, align, &mut self.counters);
        }
        let mut b = block?;
        if b.has_fences() {
            b.clear_fences();
        }
        let bytes = b.charged();
        let c = &mut self.counters;
        c.hits += 1;
        c.idle_bytes -= bytes;
        c.in_use_bytes = c.in_use_bytes.wrapping_add(bytes);
        Some(b)
    }

    /// A ready block among the newest [`LOOK`] that fits `align`.
    #[cold]
    fn search_ready(list: &mut ClassList, align: u64) -> Option<Block> {
        let n = list.ready.len();
        let i = (n.saturating_sub(LOOK)..n).rev().find(|&i| fits(&list.ready[i].block, align))?;
        Some(list.ready.remove(i).block)
    }

    /// The oldest pending blocks whose fences completed become ready; the
    /// first that fits `align` is returned instead. Looks at no more than
    /// [`LOOK`] blocks, stopping at the first still pending.
    #[cold]
    fn promote(list: &mut ClassList, align: u64, c: &mut Counters) -> Option<Block> {
        for _ in 0..LOOK {
            let complete = list.pending.front().is_some_and(|(_, i)| i.block.fences_complete());
            if !complete {
                return None;
            }
            let (_, mut idle) = list.pending.pop_front().expect("just looked");
            c.pending_blocks -= 1;
            idle.block.clear_fences();
            if fits(&idle.block, align) {
                return Some(idle.block);
            }
            list.ready.push(idle);
        }
        None
    }

    /// Keeps `block` idle in class `class` since `since`: ready, or pending
    /// behind its fences on `stream` (`None`: behind fences of no known
    /// stream, taken by nobody before they complete). Returns the shard's
    /// idle bytes after.
    #[inline(always)]
    pub fn put(&mut self, class: usize, block: Block, stream: Option<StreamKey>, since: u64) -> u64 {
        let bytes = block.charged();
        let list = &mut self.classes[class];
        let c = &mut self.counters;
        if block.has_fences() {
            list.pending.push_back((stream.unwrap_or(StreamKey::NONE), Idle { block, since }));
            c.pending_blocks += 1;
        } else {
            list.ready.push(Idle { block, since });
        }
        c.returns += 1;
        c.idle_bytes += bytes;
        c.in_use_bytes = c.in_use_bytes.wrapping_sub(bytes);
        self.top = self.top.max(class);
        c.idle_bytes
    }

    /// Keeps `block`, freed while pinned, out of the idle lists (still
    /// counted in use). Returns the shard's parked blocks after.
    pub fn park(&mut self, class: usize, block: Block) -> u64 {
        self.parked.push((class, block));
        self.counters.pinned_blocks += 1;
        self.counters.pinned_blocks
    }

    /// Parked blocks whose fences all completed become ready (`keep`), or,
    /// when the cache keeps nothing any more, every parked block is taken
    /// out to be freed behind its fences. Returns the shard's parked
    /// blocks after.
    #[cold]
    pub fn unpark(&mut self, since: u64, keep: bool, out: &mut Taken) -> u64 {
        let mut i = 0;
        while i < self.parked.len() {
            if keep && !self.parked[i].1.fences_complete() {
                i += 1;
                continue;
            }
            let (class, mut block) = self.parked.swap_remove(i);
            self.counters.pinned_blocks -= 1;
            if keep {
                block.clear_fences();
                self.put(class, block, None, since);
            } else {
                self.forget_in_use(block.charged());
                out.push(block);
            }
        }
        self.counters.pinned_blocks
    }

    /// How many classes (from the smallest) may have idle blocks, after
    /// lowering `top` past the empty ones.
    fn occupied(&mut self) -> usize {
        let empty = |l: &ClassList| l.ready.is_empty() && l.pending.is_empty();
        while self.top > 0 && empty(&self.classes[self.top]) {
            self.top -= 1;
        }
        (self.top + 1).min(self.classes.len())
    }

    /// A block handed out by this shard came back without being kept
    /// (the cache bypassed it or its device is gone).
    pub fn forget_in_use(&mut self, bytes: u64) {
        let c = &mut self.counters;
        c.forgotten += 1;
        c.in_use_bytes = c.in_use_bytes.wrapping_sub(bytes);
    }

    /// A block freed past the idle cap with nothing else idle: counted as
    /// if it were kept and the cap then gave it back ([`put`](Self::put),
    /// then [`take_idle`](Self::take_idle) counted as trimmed), which is
    /// what would happen to it.
    pub fn passed_through(&mut self, bytes: u64) {
        let c = &mut self.counters;
        c.returns += 1;
        c.dropped += 1;
        c.trimmed_bytes += bytes;
        c.in_use_bytes = c.in_use_bytes.wrapping_sub(bytes);
    }

    /// A block made for a request: counted as handed out by this shard.
    pub fn made(&mut self, bytes: u64) {
        let c = &mut self.counters;
        c.misses += 1;
        c.in_use_bytes = c.in_use_bytes.wrapping_add(bytes);
    }

    /// Takes idle blocks out, the largest classes first, until their
    /// charges reach `wanted` (`u64::MAX`: all of them). Ready blocks only,
    /// unless `pending_too`: a pending block dropped by the caller frees
    /// through the deferred-free queue after its fences. The caller drops
    /// them outside the shard's lock (dropping calls the plugin).
    pub fn take_idle(&mut self, wanted: u64, pending_too: bool, out: &mut Taken) -> u64 {
        let mut taken = 0u64;
        let end = self.occupied();
        let c = &mut self.counters;
        for list in self.classes[..end].iter_mut().rev() {
            while taken < wanted {
                let Some(Idle { block: b, .. }) = list.ready.pop() else { break };
                taken = taken.saturating_add(b.charged());
                c.idle_bytes -= b.charged();
                c.dropped += 1;
                out.push(b);
            }
            while pending_too && taken < wanted {
                let Some((_, Idle { block: b, .. })) = list.pending.pop_front() else { break };
                taken = taken.saturating_add(b.charged());
                c.idle_bytes -= b.charged();
                c.dropped += 1;
                c.pending_blocks -= 1;
                out.push(b);
            }
            if taken >= wanted {
                break;
            }
        }
        taken
    }

    /// Takes out every idle block that became idle before `cutoff` (ready
    /// and pending: a pending one frees behind its fences), as
    /// [`take_idle`](Self::take_idle). Returns the bytes taken.
    pub fn take_older(&mut self, cutoff: u64, out: &mut Taken) -> u64 {
        let mut taken = 0u64;
        let end = self.occupied();
        let c = &mut self.counters;
        let mut drop_one = |b: Block, c: &mut Counters| {
            taken = taken.saturating_add(b.charged());
            c.idle_bytes -= b.charged();
            c.dropped += 1;
            out.push(b);
        };
        for list in self.classes[..end].iter_mut() {
            // Blocks promoted from pending join the ready list at its end:
            // look at every entry, keep the young in their order.
            if list.ready.iter().any(|i| i.since < cutoff) {
                for idle in std::mem::take(&mut list.ready) {
                    if idle.since < cutoff {
                        drop_one(idle.block, c);
                    } else {
                        list.ready.push(idle);
                    }
                }
            }
            while list.pending.front().is_some_and(|(_, i)| i.since < cutoff) {
                let (_, idle) = list.pending.pop_front().expect("just looked");
                c.pending_blocks -= 1;
                drop_one(idle.block, c);
            }
        }
        taken
    }
}
