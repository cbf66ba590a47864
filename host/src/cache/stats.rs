//! What a cache reports: its hits and misses, and where its bytes are.

use super::shard::Counters;

/// A cache's figures, summed over its shards (each read under its lock, so
/// the sum is exact when no operation runs concurrently, and each shard's
/// part is exact at the moment it was read otherwise).
///
/// Every byte here is charged to the cache's pool under the cache's holder:
/// `idle_bytes` are cached (kept for reuse, given back under pressure or
/// by [`trim`](super::CachingBinding::trim)), `in_use_bytes` are handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests served by an idle block.
    pub hits: u64,
    /// Requests that made a new block through the binding.
    pub misses: u64,
    /// Requests larger than the cache's largest class, served and freed
    /// directly by the binding (never kept).
    pub bypasses: u64,
    /// Bytes kept idle (charged, not handed out).
    pub idle_bytes: u64,
    /// Blocks kept idle.
    pub idle_blocks: u64,
    /// Of the idle blocks, those still waiting for the fences of the
    /// stream they were freed on.
    pub pending_blocks: u64,
    /// Bytes handed out from cached classes (bypasses not included).
    pub in_use_bytes: u64,
    /// Blocks handed out from cached classes.
    pub in_use_blocks: u64,
    /// Of the blocks handed out, those freed while pinned
    /// ([`CachedAllocation::pinned_by`](super::CachedAllocation::pinned_by):
    /// a UCX registration, a transfer): kept out of the idle lists, and
    /// counted in use, until the pins complete.
    pub pinned_blocks: u64,
    /// Idle bytes given back by `trim`.
    pub trimmed_bytes: u64,
    /// Idle bytes given back to answer pressure tickets.
    pub pressure_bytes: u64,
}

/// Event counts summed over shards (wrapping: see `Counters`).
#[derive(Default)]
pub(crate) struct Sums(Counters);

impl Sums {
    pub(crate) fn add(&mut self, c: &Counters) {
        let s = &mut self.0;
        for (t, v) in [
            (&mut s.hits, c.hits),
            (&mut s.misses, c.misses),
            (&mut s.bypasses, c.bypasses),
            (&mut s.returns, c.returns),
            (&mut s.forgotten, c.forgotten),
            (&mut s.dropped, c.dropped),
            (&mut s.idle_bytes, c.idle_bytes),
            (&mut s.pending_blocks, c.pending_blocks),
            (&mut s.in_use_bytes, c.in_use_bytes),
            (&mut s.trimmed_bytes, c.trimmed_bytes),
            (&mut s.pressure_bytes, c.pressure_bytes),
            (&mut s.pinned_blocks, c.pinned_blocks),
        ] {
            *t = t.wrapping_add(v);
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let c = &self.0;
        CacheStats {
            hits: c.hits,
            misses: c.misses,
            bypasses: c.bypasses,
            idle_bytes: c.idle_bytes,
            // Every block kept idle came back (`returns`) and left by a hit
            // or to be freed.
            idle_blocks: c.returns.wrapping_sub(c.hits).wrapping_sub(c.dropped),
            pending_blocks: c.pending_blocks,
            in_use_bytes: c.in_use_bytes,
            // Handed out by a hit or a miss, not yet back.
            in_use_blocks: (c.hits + c.misses).wrapping_sub(c.returns).wrapping_sub(c.forgotten),
            pinned_blocks: c.pinned_blocks,
            trimmed_bytes: c.trimmed_bytes,
            pressure_bytes: c.pressure_bytes,
        }
    }
}

impl CacheStats {
    /// Hits over requests served by size classes (0 before any).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}
