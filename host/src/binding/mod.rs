//! Bindings: mechanism + context + pool + holder + class, the only way to
//! allocate (ARCHITECTURE.md §1). Every path is a transaction — reserve a grant,
//! make the memory, commit the charge with the bytes actually obtained — and
//! any failure rolls back what was done. Owning objects free through the
//! deferred-free queue after their fences (invariant 4), through the
//! mechanism that made them (invariant 1).
//!
//! * this file — [`MemoryBinding`], what it shares with the objects it
//!   makes (`BindingInner`), and the errors;
//! * `allocation.rs` — [`MemoryBinding::allocate`] and [`OwnedAllocation`];
//! * `region.rs` — [`MemoryBinding::reserve_virtual`] and [`Region`] (grow,
//!   shrink, prefix mapping);
//! * `view.rs` — [`RegionView`], what updates and initialisers see;
//! * `prefix.rs` — [`MemoryBinding::create_shared`] and [`SharedPrefix`];
//! * `settle.rs` — the two steps every path above is made of: make and
//!   commit the charge (or undo the make), and release or quarantine.
//!
//! Each owning type's retire job (the work the deferred-free queue runs) is
//! in the type's file.

mod allocation;
mod prefix;
mod region;
mod settle;
mod view;

pub use allocation::OwnedAllocation;
pub use prefix::SharedPrefix;
pub use region::{OffloadReport, Region, Residence};
pub use view::RegionView;

use crate::context::{Context, LedgerEntry};
use crate::deferred::DeferredFreeQueue;
use crate::error::CallError;
use crate::governor::{AllocationClass, GovernorError, Grant, HolderId, Lease, Pool};
use crate::lifecycle::{Ledger, LifeState, Token, STRIPES};
use crate::mechanism::{Mechanism, Placement};
use crate::reentry::thread_stripe;
use crate::sync::{lock, Mutex};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a binding operation failed. The state before the call is intact.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The governor refused the charge (`OutOfBudget` carries the pool's
    /// snapshot).
    #[error(transparent)]
    Budget(#[from] GovernorError),
    /// The plugin refused or failed.
    #[error(transparent)]
    Plugin(#[from] CallError),
    /// The mechanism lacks a capability the operation needs.
    #[error("mechanism {mechanism} has no {capability}")]
    Unsupported {
        /// The mechanism, as `plugin/mechanism`.
        mechanism: String,
        /// The capability missing, e.g. `virtual_backing`.
        capability: &'static str,
    },
    /// The request is malformed (overflowing size, beyond the region...).
    #[error("{0}")]
    Invalid(String),
    /// The object is in the wrong state for the request (a prefix mapped
    /// into a region that already has committed bytes or a prefix).
    #[error("{0}")]
    State(String),
}

/// A grow whose commit or update failed; the region is as it was.
#[derive(Debug, thiserror::Error)]
pub enum GrowError<E> {
    /// The grant, the commit or the charge failed (see [`BindingError`]);
    /// the update was not called.
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// The caller's update refused; the new range was decommitted and the
    /// grant returned.
    #[error("the update refused the grown view")]
    Update(E),
}

pub(crate) struct BindingInner {
    pub(crate) context: Arc<Context>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) holder: Option<HolderId>,
    pub(crate) class: AllocationClass,
    pub(crate) queue: Arc<DeferredFreeQueue>,
    /// How long an allocation may wait for pressure to make room.
    pub(crate) wait: Option<Duration>,
    /// How its memory is asked for (ABI 1.2 request fields).
    pub(crate) placement: Placement,
    /// Objects whose release the plugin refused: never reissued, still
    /// charged (as quarantined), described for reports.
    pub(crate) quarantine: Mutex<Vec<String>>,
    /// What this binding holds charged, for the settlement of a lost
    /// context (`crate::lifecycle`).
    pub(crate) ledger: Arc<Ledger>,
}

impl BindingInner {
    fn mechanism(&self) -> &Mechanism {
        self.context.mechanism()
    }

    /// A grant, asking holders and waiting when the fast path has no room.
    /// One call into the governor, so a refusal is counted once; the clock
    /// is read only by bindings that may wait.
    #[inline(always)]
    fn grant(&self, bytes: u64) -> Result<Grant<'_>, BindingError> {
        let deadline = self.wait.map(|w| Instant::now() + w);
        Ok(self.pool.reserve(bytes, self.class, self.holder, deadline)?)
    }

    /// Records an object the plugin would not release, quarantining its
    /// lease when it has one (its bytes stay charged until the context
    /// terminates after a loss; for good otherwise). Under a gate token.
    fn quarantine(&self, what: String, lease: Option<Lease>, stripe: usize) {
        if let Some(l) = lease {
            let bytes = l.bytes();
            if self.pool.quarantine(l).is_ok() {
                self.ledger.quarantined(stripe, bytes, 1);
            }
        }
        lock(&self.quarantine).push(what);
    }

    /// A token of the context's operation gate for one binding operation
    /// (the calls into the plugin it makes take their own too), and the
    /// thread's stripe for the ledger; the state when the context is lost
    /// or terminated.
    #[inline(always)]
    fn admit(&self) -> Result<(Token<'_>, usize), LifeState> {
        let stripe = thread_stripe();
        self.mechanism().inner.life.gate.enter(stripe).map(|t| (t, stripe))
    }

    /// [`admit`](Self::admit) for an operation that makes a new object:
    /// only an `Active` context makes new objects.
    #[inline(always)]
    fn admit_new(&self) -> Result<(Token<'_>, usize), BindingError> {
        match self.admit() {
            Ok((t, s)) if self.mechanism().inner.life.is_active() => Ok((t, s)),
            Ok(_) => Err(self.ended(self.mechanism().inner.life.state())),
            Err(state) => Err(self.ended(state)),
        }
    }

    /// The refusal of new work on a context that is not active.
    #[cold]
    #[inline(never)]
    fn ended(&self, state: LifeState) -> BindingError {
        let m = self.mechanism();
        let why = m.inner.life.reason().unwrap_or_else(|| "no reason was given".into());
        // DEVICE_LOST only where a device was lost: a context that retired
        // and terminated in order refuses new work as a state, not a loss.
        let status = m.inner.life.refusal_status(state);
        BindingError::Plugin(m.refusal(
            "binding",
            status,
            format!("the context of {} is {state} ({why}): it makes no new objects", m.label()),
        ))
    }

    /// Whom this binding's objects are charged to (for the `Retired` event;
    /// the queue knows nothing of bindings).
    pub(crate) fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        Some(crate::deferred::ChargedTo { pool: self.pool.clone(), holder: self.holder, class: self.class })
    }

    /// Whether the objects of this binding went with a lost device.
    pub(crate) fn is_lost(&self) -> bool {
        !self.mechanism().inner.life.state().admits_calls()
    }

    fn unsupported(&self, capability: &'static str) -> BindingError {
        BindingError::Unsupported { mechanism: self.mechanism().label().to_string(), capability }
    }
}

/// Allocates through one mechanism, charged to one pool, holder and class.
/// Cheap to clone; thread-safe.
///
/// It makes three kinds of owning objects: [`allocate`](Self::allocate)
/// ([`OwnedAllocation`]), [`reserve_virtual`](Self::reserve_virtual)
/// ([`Region`]) and [`create_shared`](Self::create_shared)
/// ([`SharedPrefix`]).
#[derive(Clone)]
pub struct MemoryBinding {
    pub(crate) inner: Arc<BindingInner>,
    /// One hold on `inner` per stripe: an allocation clones its thread's,
    /// so two threads allocating through one binding do not share a
    /// reference count (`Anchor`).
    anchors: Arc<[Arc<Anchor>; STRIPES]>,
}

/// A stripe's reference to a binding. An allocation keeps its binding
/// alive through one of these, picked by the allocating thread's stripe:
/// each anchor's count sits on a cache line of its own (the alignment pads
/// its `Arc` allocation to a line), so a pair's reference-count traffic
/// stays on the thread's line instead of the binding's one shared count.
/// The binding itself goes once every anchor has.
#[repr(align(64))]
pub(crate) struct Anchor {
    pub(crate) inner: Arc<BindingInner>,
}

impl MemoryBinding {
    /// The anchor of the running thread's stripe.
    #[inline(always)]
    pub(crate) fn anchor(&self) -> Arc<Anchor> {
        Arc::clone(&self.anchors[thread_stripe() % STRIPES])
    }
}

impl fmt::Debug for MemoryBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBinding")
            .field("mechanism", &self.inner.mechanism().label())
            .field("pool", &self.inner.pool.name())
            .field("holder", &self.inner.holder)
            .field("class", &self.inner.class)
            .finish()
    }
}

impl MemoryBinding {
    pub(crate) fn new(
        context: Arc<Context>,
        pool: Arc<Pool>,
        holder: Option<HolderId>,
        class: AllocationClass,
        queue: Arc<DeferredFreeQueue>,
        wait: Option<Duration>,
        placement: Placement,
    ) -> Self {
        let ledger = Arc::new(Ledger::default());
        context.add_ledger(LedgerEntry { ledger: ledger.clone(), pool: pool.clone(), holder, class });
        let inner = Arc::new(BindingInner {
            context,
            pool,
            holder,
            class,
            queue,
            wait,
            placement,
            quarantine: Mutex::default(),
            ledger,
        });
        let anchors = Arc::new(std::array::from_fn(|_| Arc::new(Anchor { inner: inner.clone() })));
        MemoryBinding { inner, anchors }
    }

    /// The mechanism that makes (and frees) this binding's memory: the
    /// mechanism of its context.
    pub fn mechanism(&self) -> &Mechanism {
        self.inner.mechanism()
    }
    /// The pool every allocation of this binding is charged to.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
    /// The class its charges are counted under (pool statistics per class,
    /// and the class tag the plugin sees in each request).
    pub fn class(&self) -> AllocationClass {
        self.inner.class
    }
    /// The pressure holder its charges are attributed to, if it was bound
    /// with one: they count as that holder's in
    /// [`Pool::holder_stats`](crate::governor::Pool::holder_stats), and
    /// when a grant does not fit, the other holders of no higher priority
    /// are asked for room at this holder's priority (a binding without a
    /// holder asks at the highest). The holder is never asked on its own
    /// behalf.
    pub fn holder(&self) -> Option<HolderId> {
        self.inner.holder
    }
    /// How its memory is asked for (ABI 1.2 request fields).
    pub fn placement(&self) -> Placement {
        self.inner.placement
    }
    /// Whether the binding's context is `Active`, the only state in which
    /// it makes new objects. One atomic load.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.inner.mechanism().inner.life.is_active()
    }
    /// Objects whose release the plugin refused (quarantined).
    pub fn quarantined(&self) -> Vec<String> {
        lock(&self.inner.quarantine).clone()
    }
}

/// `v` rounded up to a multiple of `granularity` (zero counts as one);
/// `None` on overflow.
fn round_up(v: u64, granularity: u64) -> Option<u64> {
    let g = granularity.max(1);
    v.checked_add(g - 1).map(|x| x / g * g)
}
