//! How many objects of each kind a mechanism has alive, counted so that
//! two threads working one mechanism do not share a cache line per object:
//! one line per stripe, the thread's stripe picked once (as the gate's and
//! the ledger's are). An object born on one thread and freed on another
//! leaves one stripe up and another down by one, so stripes are summed
//! with wrapping arithmetic; the sum is exact whenever nothing is in
//! flight, and never off by more than the calls in flight otherwise.

use crate::error::ObjectKind;
use crate::lifecycle::STRIPES;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const KINDS: usize = ObjectKind::ALL.len();

#[repr(align(64))]
#[derive(Default)]
struct Stripe([AtomicU64; KINDS]);

/// Live objects per kind.
#[derive(Default)]
pub(crate) struct LiveCounts {
    stripes: [Stripe; STRIPES],
}

impl LiveCounts {
    #[inline(always)]
    fn cell(&self, k: ObjectKind) -> &AtomicU64 {
        &self.stripes[crate::reentry::thread_stripe() % STRIPES].0[k as usize]
    }

    #[inline(always)]
    pub(crate) fn born(&self, k: ObjectKind) {
        self.cell(k).fetch_add(1, Relaxed);
    }

    #[inline(always)]
    pub(crate) fn died(&self, k: ObjectKind) {
        self.cell(k).fetch_sub(1, Relaxed);
    }

    /// Objects of kind `k` alive now.
    pub(crate) fn of(&self, k: ObjectKind) -> u64 {
        self.stripes.iter().fold(0u64, |n, s| n.wrapping_add(s.0[k as usize].load(Relaxed)))
    }

    /// Forgets every count (the context terminated: its objects went with
    /// it); returns how many there were.
    pub(crate) fn forget(&self) -> u64 {
        self.stripes.iter().flat_map(|s| s.0.iter()).fold(0u64, |n, c| n.wrapping_add(c.swap(0, Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_born_on_one_thread_and_freed_on_another_sum_exactly() {
        let live = LiveCounts::default();
        live.born(ObjectKind::Allocation);
        live.born(ObjectKind::Allocation);
        std::thread::scope(|s| {
            s.spawn(|| live.died(ObjectKind::Allocation));
        });
        assert_eq!(live.of(ObjectKind::Allocation), 1);
        assert_eq!(live.of(ObjectKind::Fence), 0);
        live.born(ObjectKind::Fence);
        assert_eq!(live.forget(), 2);
        assert_eq!(live.of(ObjectKind::Allocation), 0);
    }
}
