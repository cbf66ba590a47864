//! A [`Context`]: a mechanism pinned for use, and its life (ARCHITECTURE.md §5).
//!
//! Bindings, allocations and queued frees hold a context; a plugin whose
//! contexts are pinned cannot be unloaded. A context is `Active` until it
//! is retired (replaced, or ended by the runtime) or lost (the plugin
//! reported it, a slot answered DEVICE_LOST, or the runtime declared it);
//! then it terminates — once, when nothing is in flight (and, retiring,
//! once its last object is gone) — and its books are settled exactly once.
//!
//! * this file — the context, its state and the calls that move it;
//! * `events.rs` — what holders are told ([`LifecycleEvent`],
//!   [`LossNotice`]) and when;
//! * `settlement.rs` — termination and the [`Settlement`] it produces.

mod events;
mod settlement;

pub use events::{LifecycleEvent, LossNotice, SubscriptionId};
pub use settlement::{SettledBinding, Settlement, TerminateError};

use crate::governor::{AllocationClass, HolderId, Pool};
use crate::lifecycle::{Ledger, LifeState};
use crate::mechanism::Mechanism;
use crate::sync::{lock, Mutex};
use events::Listeners;
use std::fmt;
use std::sync::Arc;

/// What a binding charges through this context, kept by the context so
/// that termination can settle it even after the binding and its objects
/// are gone.
pub(crate) struct LedgerEntry {
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) holder: Option<HolderId>,
    pub(crate) class: AllocationClass,
}

/// Why a lifecycle request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// Only an `Active` context can be retired or replaced.
    #[error("context {context} is {state}, not active")]
    NotActive {
        /// The context asked, as `plugin/mechanism`.
        context: String,
        /// The state it is in instead.
        state: LifeState,
    },
    /// A replacement must serve the same device.
    #[error("context {new} serves device {new_device}, not {old_device} as {old} does")]
    WrongDevice {
        /// The context being replaced, as `plugin/mechanism`.
        old: String,
        /// The device it serves, as the host names devices (e.g. `cpu:0`).
        old_device: String,
        /// The proposed successor, as `plugin/mechanism`.
        new: String,
        /// The device the successor serves.
        new_device: String,
    },
    /// A context cannot replace itself.
    #[error("context {0} cannot replace itself")]
    SameContext(String),
}

/// A mechanism pinned for use, with its life. While any `Arc<Context>` is
/// alive its plugin stays loaded and cannot be unregistered (once every
/// context of the plugin is terminated, it can).
pub struct Context {
    mechanism: Mechanism,
    ledgers: Mutex<Vec<LedgerEntry>>,
    /// The context new bindings go to once this one is not active.
    successor: Mutex<Option<Arc<Context>>>,
    listeners: Listeners,
    settlement: Mutex<Option<Settlement>>,
}

impl Context {
    pub(crate) fn new(mechanism: Mechanism) -> Context {
        Context {
            mechanism,
            ledgers: Mutex::new(Vec::new()),
            successor: Mutex::new(None),
            listeners: Listeners::default(),
            settlement: Mutex::new(None),
        }
    }

    /// The mechanism this context pins. Its identity and properties stay
    /// readable in every state; calls into it are refused once the context
    /// is lost or terminated.
    pub fn mechanism(&self) -> &Mechanism {
        &self.mechanism
    }

    /// `plugin/mechanism`.
    pub fn label(&self) -> &str {
        self.mechanism.label()
    }

    /// Objects (allocations, reservations, physical objects, streams,
    /// fences) of this mechanism still alive, as the host counts them —
    /// derived from the mechanism's own counters, so the allocation path
    /// pays for no second counter.
    pub fn pins(&self) -> u64 {
        crate::error::ObjectKind::ALL.iter().map(|k| self.mechanism.live(*k)).sum()
    }

    /// Where the context is in its life.
    pub fn state(&self) -> LifeState {
        self.mechanism.inner.life.state()
    }

    /// Why it left `Active` (the first reason of each step), if it did.
    pub fn reason(&self) -> Option<String> {
        self.mechanism.inner.life.reason()
    }

    /// Calls into the plugin in flight now.
    pub fn calls_in_flight(&self) -> u64 {
        self.mechanism.inner.life.gate.in_flight()
    }

    /// The context that replaced this one, if any.
    pub fn successor(&self) -> Option<Arc<Context>> {
        lock(&self.successor).clone()
    }

    /// This context if it is active, else its newest active successor
    /// (the one new bindings go to); `None` when the chain ends in a
    /// context that is not active.
    pub fn active_or_successor(self: &Arc<Self>) -> Option<Arc<Context>> {
        let mut at = self.clone();
        // A chain is acyclic (`replace_with` refuses a context that is not
        // active, and the successor is set once), so this ends.
        loop {
            if at.state() == LifeState::Active {
                return Some(at);
            }
            at = at.successor()?;
        }
    }

    /// Starts an orderly end: no new binding or object; existing objects
    /// keep working; the context terminates once the last is gone (the
    /// manager's `poll`, or [`terminate`](Self::terminate)).
    pub fn retire(&self, reason: &str) -> Result<(), LifecycleError> {
        self.mechanism.inner.life.retire(reason.to_string()).map_err(|state| self.not_active(state))?;
        self.dispatch();
        Ok(())
    }

    /// Retires this context in favour of `new` (same device): new bindings
    /// on this context go to `new` from now on. This context's objects keep
    /// working until they are gone; it never frees `new`'s memory, nor
    /// `new` its.
    pub fn replace_with(&self, new: &Arc<Context>, reason: &str) -> Result<(), LifecycleError> {
        if std::ptr::eq(self, Arc::as_ptr(new)) {
            return Err(LifecycleError::SameContext(self.label().into()));
        }
        if self.mechanism.device() != new.mechanism.device() {
            return Err(LifecycleError::WrongDevice {
                old: self.label().into(),
                old_device: self.mechanism.device().to_string(),
                new: new.label().into(),
                new_device: new.mechanism.device().to_string(),
            });
        }
        if new.state() != LifeState::Active {
            return Err(new.not_active(new.state()));
        }
        {
            let mut s = lock(&self.successor);
            if s.is_some() {
                return Err(self.not_active(self.state()));
            }
            // A lost context is replaced too (its holders go on serving
            // from the new one); an active one retires first.
            match self.mechanism.inner.life.retire(format!("replaced by {}: {reason}", new.label())) {
                Ok(()) | Err(LifeState::Lost) => {}
                Err(state) => return Err(self.not_active(state)),
            }
            *s = Some(new.clone());
        }
        self.dispatch();
        Ok(())
    }

    /// Declares the context lost on the runtime's own evidence (a kernel
    /// fault it saw, a device reset it was told of): as if the plugin had
    /// reported it. `true` when this moved it to `Lost`.
    pub fn declare_lost(&self, reason: &str) -> bool {
        let moved = self.mechanism.inner.life.report_lost(format!("declared lost by the runtime: {reason}"));
        self.dispatch();
        moved
    }

    fn not_active(&self, state: LifeState) -> LifecycleError {
        LifecycleError::NotActive { context: self.label().into(), state }
    }

    /// Keeps a binding's ledger for settlement. Ledgers of bindings that
    /// are gone and hold nothing are dropped here, so a long-lived context
    /// keeps one entry per binding that still matters.
    pub(crate) fn add_ledger(&self, entry: LedgerEntry) {
        let mut l = lock(&self.ledgers);
        l.retain(|e| Arc::strong_count(&e.ledger) > 1 || !e.ledger.totals().is_zero());
        l.push(entry);
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({}, {}, pins {})", self.mechanism.label(), self.state(), self.pins())
    }
}
