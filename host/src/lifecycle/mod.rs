//! A context's life (ARCHITECTURE.md §5): `Active` → `Retiring` | `Lost` →
//! `Terminated`, the operation gate every plugin call passes, and the
//! ledger of what each binding has charged — the three facts termination
//! needs to settle a context's books exactly once.
//!
//! * `state.rs` — [`LifeState`] and its transitions;
//! * `gate.rs` — the gate: the state word and the count of calls in flight,
//!   kept per thread; termination waits for that count to reach zero;
//! * `seats.rs` — counters each thread writes alone (loads and stores, no
//!   read-modify-writes), which the gate, the ledgers and the live-object
//!   counts are made of; `barrier.rs` — the fence pair that makes the
//!   gate's admission sound with them;
//! * `ledger.rs` — per binding, the bytes and leases it holds, changed only
//!   under a gate token, so a quiet gate means a stable ledger.
//!
//! Why a loss is only *recorded* where it is reported: a report can come
//! from inside a slot, from a driver's callback thread or from the host's
//! own failure path, none of which may run a runtime's callbacks or wait.
//! The state flips (one compare-and-swap) and the reason is kept; events
//! are delivered later, by the context's owner, on its own threads.

mod barrier;
mod gate;
mod ledger;
mod seats;
mod state;

// Public for the loom model of the gate (tests/gate_loom.rs); not part of
// the host's API.
pub use barrier::uses_membarrier;
pub(crate) use gate::STRIPES;
#[doc(hidden)]
pub use gate::{Gate, Token};
pub(crate) use ledger::Ledger;
#[doc(hidden)]
pub use seats::SHARED_SEAT;
pub(crate) use seats::{give_back_seat, sum as sum_of_seats, take_seat, PerSeat};
pub use state::LifeState;

use crate::sync::{AtomicBool, Mutex};

/// What a loss reported through the host services reaches (the mechanism,
/// which owns its lifecycle): kept apart so the services need not know the
/// mechanism's type.
pub(crate) trait LossReceiver: Send + Sync {
    /// Records the loss; `true` when it moved the context to `Lost`.
    fn receive_loss(&self, reason: String) -> bool;
}

/// The lifecycle of one mechanism's context: its gate and why it left
/// `Active`. Lives inside the mechanism, so the one door into the plugin
/// reaches it without a pointer chase.
pub(crate) struct Lifecycle {
    pub(crate) gate: Gate,
    /// Why it is retiring or lost (the first reason wins). Written with
    /// `try_lock` by reporters, which must not block: a reporter that
    /// finds it locked drops its text (another reporter is writing one).
    reason: Mutex<Option<String>>,
    /// Set by the report that moved the context to `Lost`.
    lost: AtomicBool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle { gate: Gate::default(), reason: Mutex::new(None), lost: AtomicBool::new(false) }
    }
}

impl Lifecycle {
    #[inline(always)]
    pub(crate) fn state(&self) -> LifeState {
        self.gate.state()
    }

    /// Whether the context is `Active` (one load and one compare).
    #[inline(always)]
    pub(crate) fn is_active(&self) -> bool {
        self.gate.is_active()
    }

    /// Records a loss: `true` for the report that moved the context to
    /// `Lost`, `false` when it already was lost or terminated. Never
    /// blocks.
    pub(crate) fn report_lost(&self, reason: String) -> bool {
        let moved = self.gate.transition(&[LifeState::Active, LifeState::Retiring], LifeState::Lost).is_ok();
        if moved {
            self.lost.store(true, std::sync::atomic::Ordering::Release);
            self.keep_reason(reason);
        }
        moved
    }

    /// Whether the context was lost (rather than only retired) on its way.
    pub(crate) fn was_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The status that refuses work on a context in `state`: `DEVICE_LOST`
    /// when it is or was lost, `INVALID_STATE` when it only retired (and
    /// perhaps terminated in order): nothing was lost there, and a caller
    /// that reads `DEVICE_LOST` would start recovering from a loss.
    pub(crate) fn refusal_status(&self, state: LifeState) -> memplug_sdk::Status {
        if state == LifeState::Lost || self.was_lost() {
            memplug_sdk::Status::DeviceLost
        } else {
            memplug_sdk::Status::InvalidState
        }
    }

    /// `Active` → `Retiring`; the state found otherwise.
    pub(crate) fn retire(&self, reason: String) -> Result<(), LifeState> {
        self.gate.transition(&[LifeState::Active], LifeState::Retiring)?;
        self.keep_reason(reason);
        Ok(())
    }

    fn keep_reason(&self, reason: String) {
        if let Ok(mut r) = self.reason.try_lock() {
            // A retiring context that is then lost keeps both reasons.
            *r = Some(match r.take() {
                Some(before) => format!("{reason} (after: {before})"),
                None => reason,
            });
        }
    }

    pub(crate) fn reason(&self) -> Option<String> {
        crate::sync::lock(&self.reason).clone()
    }
}
