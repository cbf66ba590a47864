//! The process-wide pointer → allocation table: what torch's free hands
//! back is a bare pointer, and this is how it finds the allocation that
//! owns it. Sharded by address so the alloc/free pair of two threads
//! rarely takes the same lock; the per-shard counts live under the shard's
//! lock, which the pair takes anyway, so counting costs no shared atomic.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

const SHARDS: usize = 64;

#[repr(align(64))]
struct Shard<T> {
    map: Mutex<Inner<T>>,
}

struct Inner<T> {
    live: HashMap<u64, T>,
    inserted: u64,
    removed: u64,
}

/// Addresses to their owners.
pub(crate) struct PtrTable<T> {
    shards: Box<[Shard<T>]>,
}

/// Counts summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableCounts {
    pub live: u64,
    pub inserted: u64,
    pub removed: u64,
}

impl<T> PtrTable<T> {
    pub(crate) fn new() -> Self {
        let shards = (0..SHARDS)
            .map(|_| Shard { map: Mutex::new(Inner { live: HashMap::new(), inserted: 0, removed: 0 }) })
            .collect();
        PtrTable { shards }
    }

    fn shard(&self, addr: u64) -> MutexGuard<'_, Inner<T>> {
        // Allocations are at least 256-aligned: mix the bits above that so
        // neighbouring blocks land in different shards.
        let h = (addr >> 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
        self.shards[h as usize % SHARDS].map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `owner` under `addr`; hands it back if `addr` is taken (the
    /// mechanism returned an address still live: a plugin bug).
    pub(crate) fn insert(&self, addr: u64, owner: T) -> Result<(), T> {
        let mut s = self.shard(addr);
        if s.live.contains_key(&addr) {
            return Err(owner);
        }
        s.live.insert(addr, owner);
        s.inserted += 1;
        Ok(())
    }

    /// Takes the owner of `addr` out, if there is one.
    pub(crate) fn remove(&self, addr: u64) -> Option<T> {
        let mut s = self.shard(addr);
        let owner = s.live.remove(&addr);
        if owner.is_some() {
            s.removed += 1;
        }
        owner
    }

    pub(crate) fn counts(&self) -> TableCounts {
        let mut c = TableCounts::default();
        for s in self.shards.iter() {
            let s = s.map.lock().unwrap_or_else(PoisonError::into_inner);
            c.live += s.live.len() as u64;
            c.inserted += s.inserted;
            c.removed += s.removed;
        }
        c
    }

    /// Sums `f` over every live owner.
    pub(crate) fn sum(&self, f: impl Fn(&T) -> u64) -> u64 {
        self.shards
            .iter()
            .map(|s| s.map.lock().unwrap_or_else(PoisonError::into_inner).live.values().map(&f).sum::<u64>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_counts() {
        let t = PtrTable::new();
        for i in 0..1000u64 {
            t.insert(i << 8, i).unwrap();
        }
        assert_eq!(t.insert(5 << 8, 0), Err(0), "a live address is refused");
        assert_eq!(t.remove(7 << 8), Some(7));
        assert_eq!(t.remove(7 << 8), None, "a second removal finds nothing");
        assert_eq!(t.counts(), TableCounts { live: 999, inserted: 1000, removed: 1 });
        assert_eq!(t.sum(|v| *v), (0..1000).sum::<u64>() - 7);
        // Spread over the shards, not piled in one.
        let used = t.shards.iter().filter(|s| !s.map.lock().unwrap().live.is_empty()).count();
        assert!(used > SHARDS / 2, "{used} shards used");
    }
}
