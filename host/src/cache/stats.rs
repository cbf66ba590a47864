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
    /// Idle bytes given back by `trim`.
    pub trimmed_bytes: u64,
    /// Idle bytes given back to answer pressure tickets.
    pub pressure_bytes: u64,
}

impl CacheStats {
    pub(crate) fn add(&mut self, c: &Counters) {
        self.hits += c.hits;
        self.misses += c.misses;
        self.bypasses += c.bypasses;
        self.idle_bytes += c.idle_bytes;
        self.idle_blocks += c.idle_blocks;
        self.pending_blocks += c.pending_blocks;
        self.in_use_bytes = self.in_use_bytes.wrapping_add(c.in_use_bytes);
        self.in_use_blocks = self.in_use_blocks.wrapping_add(c.in_use_blocks);
        self.trimmed_bytes += c.trimmed_bytes;
        self.pressure_bytes += c.pressure_bytes;
    }

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
