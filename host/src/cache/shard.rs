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
/// back moves a pointer, not the allocation's ~160 bytes (measured: the
/// copies were half of a cached pair's instructions).
pub(crate) type Block = Box<OwnedAllocation>;

/// How many idle blocks of a class one request looks at before it gives
/// up (blocks of another stream or a smaller alignment), so a request's
/// cost does not grow with the number of idle blocks.
const LOOK: usize = 8;

/// The idle blocks of one size class in one shard.
#[derive(Default)]
struct ClassList {
    /// Usable by anyone; the most recently freed last (reused first: its
    /// lines are the likeliest to be in a cache).
    ready: Vec<Block>,
    /// Freed behind work on a stream, oldest first. Fences recorded on one
    /// stream complete in order, so the front is the first to become ready.
    pending: VecDeque<(StreamKey, Block)>,
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
}

#[derive(Default)]
pub(crate) struct Shard {
    classes: Vec<ClassList>,
    pub counters: Counters,
}

/// Whether `a` may serve a request aligned to `align` (a power of two).
#[inline(always)]
fn fits(a: &OwnedAllocation, align: u64) -> bool {
    a.addr() & (align - 1) == 0
}

impl Shard {
    pub fn new(classes: usize) -> Self {
        Shard { classes: (0..classes).map(|_| ClassList::default()).collect(), counters: Counters::default() }
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
                .find(|&i| list.pending[i].0 == s && fits(&list.pending[i].1, align));
            if let Some(i) = i {
                block = list.pending.remove(i).map(|(_, b)| b);
                self.counters.pending_blocks -= 1;
            }
        }
        if block.is_none() {
            // The newest ready block almost always fits: try it before the
            // search.
            block = match list.ready.last() {
                Some(b) if fits(b, align) => list.ready.pop(),
                _ => Self::search_ready(list, align),
            };
        }
        if block.is_none() {
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
        let i = (n.saturating_sub(LOOK)..n).rev().find(|&i| fits(&list.ready[i], align))?;
        Some(list.ready.swap_remove(i))
    }

    /// The oldest pending blocks whose fences completed become ready; the
    /// first that fits `align` is returned instead. Looks at no more than
    /// [`LOOK`] blocks, stopping at the first still pending.
    #[cold]
    fn promote(list: &mut ClassList, align: u64, c: &mut Counters) -> Option<Block> {
        for _ in 0..LOOK {
            let complete = list.pending.front().is_some_and(|(_, b)| b.fences_complete());
            if !complete {
                return None;
            }
            let (_, mut b) = list.pending.pop_front().expect("just looked");
            c.pending_blocks -= 1;
            b.clear_fences();
            if fits(&b, align) {
                return Some(b);
            }
            list.ready.push(b);
        }
        None
    }

    /// Keeps `block` idle in class `class`: ready, or pending behind its
    /// fences on `stream` (`None`: behind fences of no known stream, taken
    /// by nobody before they complete).
    #[inline]
    pub fn put(&mut self, class: usize, block: Block, stream: Option<StreamKey>) {
        let bytes = block.charged();
        let list = &mut self.classes[class];
        let c = &mut self.counters;
        if block.has_fences() {
            list.pending.push_back((stream.unwrap_or(StreamKey::NONE), block));
            c.pending_blocks += 1;
        } else {
            list.ready.push(block);
        }
        c.returns += 1;
        c.idle_bytes += bytes;
        c.in_use_bytes = c.in_use_bytes.wrapping_sub(bytes);
    }

    /// A block handed out by this shard came back without being kept
    /// (the cache bypassed it or its device is gone).
    pub fn forget_in_use(&mut self, bytes: u64) {
        let c = &mut self.counters;
        c.forgotten += 1;
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
    pub fn take_idle(&mut self, wanted: u64, pending_too: bool, out: &mut Vec<Block>) -> u64 {
        let mut taken = 0u64;
        let c = &mut self.counters;
        for list in self.classes.iter_mut().rev() {
            while taken < wanted {
                let Some(b) = list.ready.pop() else { break };
                taken = taken.saturating_add(b.charged());
                c.idle_bytes -= b.charged();
                c.dropped += 1;
                out.push(b);
            }
            while pending_too && taken < wanted {
                let Some((_, b)) = list.pending.pop_front() else { break };
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
}
