//! The operation gate: every call into a plugin through a context holds a
//! [`Token`], and termination waits until none is held.
//!
//! The count of calls in flight is striped, one cache line per stripe;
//! threads pick a stripe once, so two threads calling one mechanism do not
//! share a counter. Each stripe word holds its count and a CLOSED bit.
//! Entering is one `fetch_add` on the caller's stripe: the value it returns
//! says whether the stripe was closed (then the call is refused and undoes
//! its increment). Leaving is one `fetch_sub`.
//!
//! Closing (when the context is lost or terminated) sets CLOSED on every
//! stripe with `fetch_or`. Why that is enough, with no ordering between
//! different words: on one stripe, every increment and the `fetch_or` are
//! read-modify-writes of one location, so they are totally ordered. An
//! increment ordered before the `fetch_or` is a call the closer sees in the
//! count it read (and in every later read of that stripe, until the call
//! leaves); one ordered after it sees CLOSED and is refused. So once a
//! closer has closed every stripe and read every count back to zero, no
//! call is in flight and none can start. `tests/gate_loom.rs` checks this
//! exhaustively (loom models orderings weaker than sequential consistency,
//! which this argument does not need).
//!
//! The life state itself is a separate word, for reporting; the gate's
//! admission is the stripes'.

use super::LifeState;
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};

/// Stripes of the in-flight count. Eight cache lines per mechanism.
pub(crate) const STRIPES: usize = 8;

const CLOSED: u64 = 1 << 63;

#[repr(align(64))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// One context's gate: its life state and the striped count of calls in
/// flight (see the module documentation for why admission is sound).
/// Starts `Active` and open.
#[derive(Default)]
pub struct Gate {
    state: AtomicU64,
    stripes: [Stripe; STRIPES],
}

/// A call in flight: the gate counts it until this is dropped.
#[must_use]
pub struct Token<'g> {
    stripe: &'g AtomicU64,
}

impl Drop for Token<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.stripe.fetch_sub(1, Release);
    }
}

impl Gate {
    /// Admits a call unless the gate is closed (the context is lost or
    /// terminated); `Err` with the state then. `stripe` is the calling
    /// thread's (any value; reduced modulo the stripe count).
    #[inline(always)]
    pub fn enter(&self, stripe: usize) -> Result<Token<'_>, LifeState> {
        let s = &self.stripes[stripe % STRIPES].0;
        if s.fetch_add(1, Acquire) & CLOSED == 0 {
            return Ok(Token { stripe: s });
        }
        self.refuse(s)
    }

    #[cold]
    #[inline(never)]
    fn refuse(&self, s: &AtomicU64) -> Result<Token<'_>, LifeState> {
        s.fetch_sub(1, Release);
        // Closing sets the state first: a closed stripe means Lost or
        // later, even if this read is older.
        Err(self.state().max(LifeState::Lost))
    }

    /// The life state now (for reporting; admission reads the stripes).
    #[inline(always)]
    pub fn state(&self) -> LifeState {
        LifeState::from_word(self.state.load(Acquire))
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

    /// Refuses every later call (idempotent; any thread may close).
    pub fn close(&self) {
        for s in &self.stripes {
            s.0.fetch_or(CLOSED, AcqRel);
        }
    }

    /// Whether `token` was issued by this gate.
    pub fn owns(&self, token: &Token<'_>) -> bool {
        self.stripes.iter().any(|s| std::ptr::eq(&s.0, token.stripe))
    }

    /// Calls in flight now. Once the gate is closed the count only falls,
    /// and zero means no call is in flight and none can start.
    pub fn in_flight(&self) -> u64 {
        self.stripes.iter().fold(0u64, |n, s| n.wrapping_add(s.0.load(Acquire) & !CLOSED))
    }
}
