//! How many objects of each kind a mechanism has alive, counted so that
//! counting costs a load and a store: each thread counts in its own seat's
//! cell (`crate::lifecycle::seats`, as the gate and the ledgers do). An
//! object born on one thread and freed on another leaves one cell up and
//! another down by one, so cells are summed with wrapping arithmetic; the
//! sum is exact whenever nothing is in flight, and never off by more than
//! the calls in flight otherwise.

use crate::error::ObjectKind;
use crate::lifecycle::PerSeat;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const KINDS: usize = ObjectKind::ALL.len();

/// Live objects per kind.
#[derive(Default)]
pub(crate) struct LiveCounts {
    cells: PerSeat<[crate::sync::AtomicU64; KINDS]>,
    /// What [`forget`](Self::forget) took away, per kind: the cells belong
    /// to their threads, so forgetting subtracts instead of clearing them.
    forgotten: [AtomicU64; KINDS],
}

impl LiveCounts {
    #[inline(always)]
    fn count(&self, k: ObjectKind, v: u64) {
        self.cells.cell(crate::reentry::thread_stripe()).field(|c| &c[k as usize]).add(v, Relaxed);
    }

    #[inline(always)]
    pub(crate) fn born(&self, k: ObjectKind) {
        self.count(k, 1);
    }

    #[inline(always)]
    pub(crate) fn died(&self, k: ObjectKind) {
        self.count(k, 1u64.wrapping_neg());
    }

    fn counted(&self, k: ObjectKind) -> u64 {
        crate::lifecycle::sum_of_seats(&self.cells, |c| &c[k as usize])
    }

    /// Objects of kind `k` alive now.
    pub(crate) fn of(&self, k: ObjectKind) -> u64 {
        self.counted(k).wrapping_sub(self.forgotten[k as usize].load(Relaxed))
    }

    /// Forgets every count (the context terminated: its objects went with
    /// it); returns how many there were.
    pub(crate) fn forget(&self) -> u64 {
        ObjectKind::ALL.iter().fold(0u64, |n, &k| {
            let all = self.counted(k);
            n.wrapping_add(all.wrapping_sub(self.forgotten[k as usize].swap(all, Relaxed)))
        })
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
