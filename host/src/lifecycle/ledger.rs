//! What one binding holds charged: bytes and leases, live and
//! quarantined. Termination of a lost context discharges each binding's
//! ledger from its pool in one step, so an object whose owner never comes
//! back is refunded by what it was charged, never by a guess.
//!
//! Changed only under a gate token of the binding's context (every change
//! sits next to the pool operation it mirrors, in `binding/`), so once the
//! gate is quiet and refuses calls the ledger no longer moves, and an
//! owner that comes later is refused at the gate and changes nothing: each
//! charge is settled either by its owner or by termination, never both.
//!
//! Kept per seat like the gate's count (`seats.rs`): each thread writes
//! its own cell with loads and stores; a charge made on one thread and
//! refunded on another leaves one cell up and another down by the same
//! amount, and the sums wrap. A reader after the gate went quiet sees
//! every write: each was made under a token whose leave released it.

use super::seats::{self, PerSeat};
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Default)]
struct Cell {
    bytes: AtomicU64,
    leases: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Ledger {
    cells: PerSeat<Cell>,
    /// Quarantined charges (cold: a release the plugin refused).
    quarantined_bytes: AtomicU64,
    quarantines: AtomicU64,
}

/// A ledger's sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LedgerTotals {
    pub(crate) bytes: u64,
    pub(crate) leases: u64,
    pub(crate) quarantined_bytes: u64,
    pub(crate) quarantines: u64,
}

impl LedgerTotals {
    pub(crate) fn is_zero(&self) -> bool {
        self.bytes == 0 && self.leases == 0 && self.quarantined_bytes == 0
    }
}

impl Ledger {
    /// A lease of `bytes` began (`leases` is 1), or an existing one grew
    /// (`leases` is 0). `seat` is the running thread's.
    #[inline(always)]
    pub(crate) fn charged(&self, seat: usize, bytes: u64, leases: u64) {
        let c = self.cells.cell(seat);
        c.field(|c| &c.bytes).add(bytes, Relaxed);
        if leases != 0 {
            c.field(|c| &c.leases).add(leases, Relaxed);
        }
    }

    /// `bytes` of live charge were refunded, ending `leases` leases.
    /// `seat` is the running thread's.
    #[inline(always)]
    pub(crate) fn refunded(&self, seat: usize, bytes: u64, leases: u64) {
        self.charged(seat, bytes.wrapping_neg(), leases.wrapping_neg())
    }

    /// `bytes` of live charge became quarantined (`leases` leases ended
    /// that way).
    #[cold]
    pub(crate) fn quarantined(&self, seat: usize, bytes: u64, leases: u64) {
        self.refunded(seat, bytes, leases);
        self.quarantined_bytes.fetch_add(bytes, Relaxed);
        self.quarantines.fetch_add(1, Relaxed);
    }

    pub(crate) fn totals(&self) -> LedgerTotals {
        LedgerTotals {
            bytes: seats::sum(&self.cells, |c| &c.bytes),
            leases: seats::sum(&self.cells, |c| &c.leases),
            quarantined_bytes: self.quarantined_bytes.load(Relaxed),
            quarantines: self.quarantines.load(Relaxed),
        }
    }
}
