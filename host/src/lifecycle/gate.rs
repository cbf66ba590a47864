//! The operation gate: every call into a plugin through a context holds a
//! [`Token`], and termination waits until none is held.
//!
//! Entering is one increment of the caller's stripe and one load of the
//! state; leaving is one decrement. Stripes are per thread (chosen once per
//! thread), so two threads calling one mechanism do not share a counter's
//! cache line. A thread increments and decrements its own stripe, so every
//! stripe's count is the calls in flight on the threads mapped to it.
//!
//! Why it is sound (both sides use sequentially consistent operations): an
//! entering thread increments, then loads the state; a terminating thread
//! stores `Lost`, then sums the stripes. In the single total order of these
//! operations, either the load comes after the store (the call is refused,
//! and undoes its increment) or the increment comes before the sum (the
//! terminator sees the call and waits for it). `tests/gate_loom.rs` checks
//! it exhaustively.

use super::LifeState;
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release, SeqCst};

/// Stripes of the in-flight count. Eight cache lines per mechanism.
pub(crate) const STRIPES: usize = 8;

#[repr(align(64))]
#[derive(Default)]
struct Stripe(AtomicU64);

#[derive(Default)]
pub(crate) struct Gate {
    state: AtomicU64,
    stripes: [Stripe; STRIPES],
}

/// A call in flight: the gate counts it until this is dropped.
#[must_use]
pub(crate) struct Token<'g> {
    stripe: &'g AtomicU64,
}

impl Drop for Token<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.stripe.fetch_sub(1, Release);
    }
}

impl Gate {
    /// Admits a call when the state lets calls through (`Active`,
    /// `Retiring`); `Err` with the state otherwise. `stripe` is the
    /// calling thread's (any value; reduced modulo the stripe count).
    #[inline(always)]
    pub(crate) fn enter(&self, stripe: usize) -> Result<Token<'_>, LifeState> {
        let s = &self.stripes[stripe % STRIPES].0;
        s.fetch_add(1, SeqCst);
        let state = self.state.load(SeqCst);
        if state < LifeState::Lost as u64 {
            return Ok(Token { stripe: s });
        }
        s.fetch_sub(1, Release);
        Err(LifeState::from_word(state))
    }

    #[inline(always)]
    pub(crate) fn state(&self) -> LifeState {
        LifeState::from_word(self.state.load(Relaxed))
    }

    /// Moves to `to` when the state is one of `from`; the state found
    /// otherwise. Lock-free, never blocks.
    pub(crate) fn transition(&self, from: &[LifeState], to: LifeState) -> Result<LifeState, LifeState> {
        let mut now = self.state.load(SeqCst);
        loop {
            let cur = LifeState::from_word(now);
            if !from.contains(&cur) {
                return Err(cur);
            }
            match self.state.compare_exchange(now, to as u64, SeqCst, SeqCst) {
                Ok(_) => return Ok(cur),
                Err(seen) => now = seen,
            }
        }
    }

    /// Calls in flight now (exact once the state refuses calls: then the
    /// count only falls).
    pub(crate) fn in_flight(&self) -> u64 {
        self.stripes.iter().fold(0u64, |n, s| n.wrapping_add(s.0.load(SeqCst)))
    }
}
