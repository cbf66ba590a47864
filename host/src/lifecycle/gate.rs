//! The operation gate: every call into a plugin through a context holds a
//! [`Token`], and termination waits until none is held.
//!
//! The count of calls in flight is kept per seat (`seats.rs`): a thread
//! enters by adding one to its own seat's count with a load and a store,
//! then reads whether the gate is closed; it leaves by storing the count
//! less one. No read-modify-write on either side, and no cache line shared
//! with another thread. (A thread without a seat of its own uses the shared
//! seat's count, with read-modify-writes.)
//!
//! Closing (when the context is lost or terminated) sets `closed`, then
//! runs the heavy side of an asymmetric fence pair (`barrier.rs`); a
//! caller's light side sits between its count's write and its read of
//! `closed`. By Dekker's argument, either the caller sees `closed` (and
//! backs out, never calling the plugin) or the closer's later reads see
//! the caller's count (and wait for it to leave). So once a closer has
//! closed the gate and read every count back to zero, no call is in flight
//! and none can start. A leave's store is a release and the closer's reads
//! acquire, so everything a call did happens before what the closer does
//! next. `tests/gate_loom.rs` checks this exhaustively.
//!
//! The life state itself is a separate word, for reporting; admission is
//! `closed`.

use super::barrier;
use super::seats::{self, PerSeat, SeatCell};
use super::LifeState;
use crate::sync::{AtomicBool, AtomicU64};
use std::marker::PhantomData;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};

/// Stripes of the structures split by thread (the cache's shards, a
/// binding's anchors), indexed by the thread's seat modulo this.
pub(crate) const STRIPES: usize = 8;

/// One context's gate: its life state, whether it is closed, and the count
/// of calls in flight per seat (see the module documentation for why
/// admission is sound). Starts `Active` and open.
pub struct Gate {
    state: AtomicU64,
    closed: AtomicBool,
    counts: PerSeat<AtomicU64>,
}

impl Default for Gate {
    fn default() -> Self {
        barrier::prepare();
        Gate { state: AtomicU64::new(0), closed: AtomicBool::new(false), counts: PerSeat::default() }
    }
}

/// A call in flight: the gate counts it until this is dropped. Not `Send`:
/// it is dropped on the thread that entered, the only writer of its count.
/// `Sync`: a call made on another thread under a borrowed token writes no
/// count.
#[must_use]
pub struct Token<'g> {
    count: SeatCell<'g, AtomicU64>,
    /// `!Send` and `Sync`, as a lock guard is.
    _thread: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl Drop for Token<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.count.add(1u64.wrapping_neg(), Release);
    }
}

impl Gate {
    /// Admits a call unless the gate is closed (the context is lost or
    /// terminated); `Err` with the state then. `seat` is the calling
    /// thread's (`crate::reentry::thread_stripe`): its count is written by
    /// this thread only.
    #[inline(always)]
    pub fn enter(&self, seat: usize) -> Result<Token<'_>, LifeState> {
        // The fence below orders this write before the read of `closed`,
        // on the shared seat's read-modify-write as on an owned store.
        let count = self.counts.cell(seat);
        count.add(1, Relaxed);
        barrier::light();
        if !self.closed.load(Relaxed) {
            return Ok(Token { count, _thread: PhantomData });
        }
        self.refuse(count)
    }

    #[cold]
    #[inline(never)]
    fn refuse(&self, count: SeatCell<'_, AtomicU64>) -> Result<Token<'_>, LifeState> {
        count.add(1u64.wrapping_neg(), Release);
        // Closing sets the state first: a closed gate means Lost or later,
        // even if this read is older.
        Err(self.state().max(LifeState::Lost))
    }

    /// The life state now (for reporting; admission reads the stripes).
    #[inline(always)]
    pub fn state(&self) -> LifeState {
        LifeState::from_word(self.state.load(Acquire))
    }

    /// Whether the state is `Active`: one load and one compare, for the
    /// paths that ask it on every operation (a binding's new objects, a
    /// cache's hits and frees).
    #[inline(always)]
    pub fn is_active(&self) -> bool {
        self.state.load(Acquire) == LifeState::Active as u64
    }

    /// Moves to `to` when the state is one of `from` (and, for `Lost` and
    /// `Terminated`, closes the gate); the state found otherwise.
    /// Lock-free, never blocks.
    pub fn transition(&self, from: &[LifeState], to: LifeState) -> Result<LifeState, LifeState> {
        let mut now = self.state.load(Acquire);
        loop {
            let cur = LifeState::from_word(now);
            if !from.contains(&cur) {
                return Err(cur);
            }
            match self.state.compare_exchange(now, to as u64, AcqRel, Acquire) {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        if !to.admits_calls() {
            self.close();
        }
        Ok(LifeState::from_word(now))
    }

    /// Refuses every later call (idempotent; any thread may close). Once
    /// it returns, [`in_flight`](Self::in_flight) counts every call that
    /// was admitted and has not left.
    pub fn close(&self) {
        self.closed.store(true, SeqCst);
        barrier::heavy();
    }

    /// Whether `token` was issued by this gate.
    pub fn owns(&self, token: &Token<'_>) -> bool {
        self.counts.each().any(|c| std::ptr::eq(c, token.count.get()))
    }

    /// Calls in flight now. Once the gate is closed the count only falls,
    /// and zero means no call is in flight and none can start.
    pub fn in_flight(&self) -> u64 {
        seats::sum(&self.counts, |c| c)
    }
}
