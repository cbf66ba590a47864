//! Termination: the one place a context's books are closed.
//!
//! A lost context terminates once no call into its plugin is in flight; a
//! retiring one once its last object is gone too. Termination moves the
//! state to `Terminated` (one compare-and-swap: exactly one caller wins),
//! waits out any call admitted just before, and then — with the gate
//! refusing every call, so no ledger can move — discharges each binding's
//! ledger from its pool by the bytes it counted. Owners that come later are
//! refused at the gate: their drop calls no plugin and refunds nothing
//! (`binding/settle.rs`). Nothing is refunded from an allocation's length
//! or any other guess: only what the ledgers counted when the charges were
//! made.

use super::Context;
use crate::governor::{AllocationClass, HolderId};
use crate::lifecycle::LifeState;
use crate::sync::lock;
use std::time::{Duration, Instant};

/// What one binding's ledger settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledBinding {
    /// The name of the pool the binding charged.
    pub pool: String,
    /// The holder it charged (`None`: the pool's anonymous account).
    pub holder: Option<HolderId>,
    /// The binding's allocation class.
    pub class: AllocationClass,
    /// Live charge discharged, in bytes.
    pub bytes: u64,
    /// The leases (charged objects) that held those bytes.
    pub leases: u64,
    /// Quarantined charge discharged.
    pub quarantined_bytes: u64,
}

/// What a context's termination settled, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The terminated context, as `plugin/mechanism`.
    pub context: String,
    /// Whether the context was lost (its objects went with the device)
    /// rather than retired in order.
    pub after_loss: bool,
    /// One entry per binding that held anything.
    pub bindings: Vec<SettledBinding>,
    /// Sum of live and quarantined bytes discharged.
    pub bytes: u64,
    /// Objects the host still counted alive and forgot (they went with the
    /// device; a retiring context has none).
    pub objects_forgotten: u64,
}

/// Why [`Context::terminate`] did not terminate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
///
/// Every variant names the context as `plugin/mechanism`. None of them
/// changed anything: the context is in the state it was, and terminating
/// it again later is allowed (except after `AlreadyTerminated`).
pub enum TerminateError {
    /// The context is active; only a lost or retiring one terminates.
    #[error("context {context} is active: retire it or report its loss first")]
    Active {
        /// The context.
        context: String,
    },
    /// Someone terminated it first (its settlement is
    /// [`Context::settlement`]).
    #[error("context {context} is already terminated")]
    AlreadyTerminated {
        /// The context.
        context: String,
    },
    /// A thread was still inside one of its plugin's slots when the timeout
    /// ran out.
    #[error("context {context} still has {calls} call(s) in flight after the timeout")]
    InFlight {
        /// The context.
        context: String,
        /// Calls in flight at the timeout.
        calls: u64,
    },
    /// Retiring, and objects it made were still alive when the timeout ran
    /// out: a retiring context terminates only after its last object is
    /// freed.
    #[error("context {context} is retiring and still has {objects} live object(s) after the timeout")]
    StillLive {
        /// The context.
        context: String,
        /// Objects still alive at the timeout.
        objects: u64,
    },
}

impl Context {
    /// Whether termination could go ahead now: lost with no call in
    /// flight, or retiring with no call in flight and no object left.
    pub(crate) fn ready_to_terminate(&self) -> bool {
        match self.state() {
            LifeState::Lost => self.calls_in_flight() == 0,
            LifeState::Retiring => self.pins() == 0 && self.calls_in_flight() == 0,
            LifeState::Active | LifeState::Terminated => false,
        }
    }

    /// The settlement, once the context has terminated.
    pub fn settlement(&self) -> Option<Settlement> {
        lock(&self.settlement).clone()
    }

    /// Terminates a lost or retiring context, waiting up to `timeout` for
    /// calls in flight to finish (and, retiring, for its last object to be
    /// gone), and settles its books exactly once. Holds no manager,
    /// registry or governor lock while it waits.
    pub fn terminate(&self, timeout: Duration) -> Result<Settlement, TerminateError> {
        self.terminate_polling(timeout, || {})
    }

    /// [`terminate`](Self::terminate), calling `between` while it waits
    /// (the manager retires queued frees there).
    pub(crate) fn terminate_polling(
        &self,
        timeout: Duration,
        mut between: impl FnMut(),
    ) -> Result<Settlement, TerminateError> {
        let deadline = Instant::now() + timeout;
        let context = || self.label().to_string();
        let mut pause = Duration::from_micros(10);
        loop {
            let state = self.state();
            let ready = match state {
                LifeState::Active => return Err(TerminateError::Active { context: context() }),
                LifeState::Terminated => {
                    return Err(TerminateError::AlreadyTerminated { context: context() })
                }
                LifeState::Lost | LifeState::Retiring => self.ready_to_terminate(),
            };
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                return Err(match state {
                    LifeState::Retiring if self.pins() != 0 => {
                        TerminateError::StillLive { context: context(), objects: self.pins() }
                    }
                    _ => TerminateError::InFlight { context: context(), calls: self.calls_in_flight() },
                });
            }
            between();
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        let life = &self.mechanism.inner.life;
        if life.gate.transition(&[LifeState::Lost, LifeState::Retiring], LifeState::Terminated).is_err() {
            return Err(TerminateError::AlreadyTerminated { context: context() });
        }
        // The transition closed the gate (again, if a reporter is still
        // closing it): calls admitted before (a retiring context admits
        // calls) finish before anything is settled, and none can start.
        life.gate.close();
        // Only calls admitted in the instant before the close can be in
        // flight; a plugin that holds one for long costs this thread a
        // pause that doubles to a millisecond, not a spinning core.
        let mut pause = Duration::from_micros(1);
        while self.calls_in_flight() != 0 {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        let settlement = self.settle();
        *lock(&self.settlement) = Some(settlement.clone());
        self.dispatch();
        Ok(settlement)
    }

    /// Discharges every ledger; the gate is closed and quiet.
    fn settle(&self) -> Settlement {
        let after_loss = self.mechanism.inner.life.was_lost();
        let mut bindings = Vec::new();
        let mut bytes = 0;
        for e in lock(&self.ledgers).drain(..) {
            let t = e.ledger.totals();
            if t.is_zero() {
                continue;
            }
            e.pool.discharge(
                e.holder,
                e.class,
                crate::governor::Discharge {
                    leased: t.bytes,
                    leases: t.leases,
                    quarantined: t.quarantined_bytes,
                },
            );
            bytes += t.bytes + t.quarantined_bytes;
            bindings.push(SettledBinding {
                pool: e.pool.name().into(),
                holder: e.holder,
                class: e.class,
                bytes: t.bytes,
                leases: t.leases,
                quarantined_bytes: t.quarantined_bytes,
            });
        }
        let objects_forgotten = self.mechanism.inner.forget_objects();
        Settlement { context: self.label().into(), after_loss, bindings, bytes, objects_forgotten }
    }
}
