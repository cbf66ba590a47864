//! Holders: whoever knows what its bytes mean, and answers pressure tickets.

use super::pool::Pool;
use super::shard::AccountCore;
use super::stats::{ClassStats, HolderStats, PressureStats};
use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId, Priority};
use crate::sync::{self, lock, thread_local, AtomicU64, Condvar, Mutex, ThreadId};
use std::cell::RefCell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// A request for room, delivered to a holder's callback.
///
/// The governor never frees anything itself (invariant 5): it asks, the
/// holder chooses its victims and releases them through the normal paths
/// (release or deferred free), and answers with the bytes it released —
/// zero is a legal answer. The answer is recorded, never trusted as a
/// refund: only actual releases refund.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PressureTicket {
    /// The pool that needs room: the holder's own pool or one of its
    /// ancestors (a short parent asks the holders of every pool under it).
    pub pool: PoolId,
    /// Bytes still missing in that pool when the ticket was issued.
    pub bytes_wanted: u64,
    /// Class of the request.
    pub class: AllocationClass,
    /// Priority of the requester ([`Priority::HIGHEST`] for a request made
    /// on behalf of no holder).
    pub priority: Priority,
    /// The requesting holder, if any (never the recipient).
    pub requester: Option<HolderId>,
    /// When the requester gives up. A request made without a deadline
    /// issues tickets with `deadline` = the moment of issue: release what
    /// can be released at once, do not block.
    pub deadline: Instant,
}

/// A holder's answer to a ticket: the bytes it released (or enqueued for
/// release once their fences complete). Zero is legal.
///
/// Called on the requesting thread, with no governor lock held, possibly
/// from several threads at once (hence `Sync`). It may re-enter the
/// governor: release, quarantine, reserve (a `reserve` made from inside a
/// callback issues no tickets of its own on the ticket's pool, nor on any
/// pool above or below it, so pressure never recurses), change a
/// capacity, take snapshots, even drop its own registration. A panic is
/// caught and counts as a zero answer.
pub type PressureCallback = dyn Fn(&PressureTicket) -> u64 + Send + Sync;

/// Ticket counters, per class of the request (atomics: tickets are the
/// slow path).
pub(crate) struct PressureCounters([ClassPressure; AllocationClass::COUNT]);

struct ClassPressure {
    tickets: AtomicU64,
    bytes_wanted: AtomicU64,
    bytes_answered: AtomicU64,
    zero_answers: AtomicU64,
    callback_panics: AtomicU64,
}

impl PressureCounters {
    pub fn new() -> Self {
        PressureCounters(std::array::from_fn(|_| ClassPressure {
            tickets: AtomicU64::new(0),
            bytes_wanted: AtomicU64::new(0),
            bytes_answered: AtomicU64::new(0),
            zero_answers: AtomicU64::new(0),
            callback_panics: AtomicU64::new(0),
        }))
    }

    /// Records one delivered ticket of `class` and its answer (`None`: it
    /// panicked).
    pub fn record(&self, class: AllocationClass, wanted: u64, answer: Option<u64>) {
        let c = &self.0[class.index()];
        c.tickets.fetch_add(1, Relaxed);
        saturating_add(&c.bytes_wanted, wanted);
        match answer {
            Some(0) => {
                c.zero_answers.fetch_add(1, Relaxed);
            }
            Some(n) => saturating_add(&c.bytes_answered, n),
            None => {
                c.zero_answers.fetch_add(1, Relaxed);
                c.callback_panics.fetch_add(1, Relaxed);
            }
        }
    }

    /// The figures of one class.
    pub fn class(&self, class: AllocationClass) -> PressureStats {
        let c = &self.0[class.index()];
        PressureStats {
            tickets: c.tickets.load(Relaxed),
            bytes_wanted: c.bytes_wanted.load(Relaxed),
            bytes_answered: c.bytes_answered.load(Relaxed),
            zero_answers: c.zero_answers.load(Relaxed),
            callback_panics: c.callback_panics.load(Relaxed),
        }
    }

    /// The figures of every class together.
    pub fn get(&self) -> PressureStats {
        AllocationClass::ALL.iter().map(|&c| self.class(c)).fold(PressureStats::default(), |a, b| {
            PressureStats {
                tickets: a.tickets.saturating_add(b.tickets),
                bytes_wanted: a.bytes_wanted.saturating_add(b.bytes_wanted),
                bytes_answered: a.bytes_answered.saturating_add(b.bytes_answered),
                zero_answers: a.zero_answers.saturating_add(b.zero_answers),
                callback_panics: a.callback_panics.saturating_add(b.callback_panics),
            }
        })
    }

    /// Puts each class's ticket figures into `classes`.
    pub fn fill(&self, classes: &mut [ClassStats; AllocationClass::COUNT]) {
        for (c, &class) in classes.iter_mut().zip(AllocationClass::ALL.iter()) {
            c.set_pressure(&self.class(class));
        }
    }
}

fn saturating_add(a: &AtomicU64, v: u64) {
    // Sums of callback answers are untrusted input: saturate, never wrap.
    let _ = a.fetch_update(Relaxed, Relaxed, |x| Some(x.saturating_add(v)));
}

struct CallState {
    registered: bool,
    /// Threads running the callback now (one entry per call).
    in_flight: Vec<ThreadId>,
}

/// A registered holder, as the pool keeps it.
pub(crate) struct HolderEntry {
    pub core: Arc<AccountCore>,
    /// Registration order (the holder's id, which grows process-wide), the
    /// tie-break among equal priorities.
    pub seq: u64,
    callback: Box<PressureCallback>,
    calls: Mutex<CallState>,
    idle: Condvar,
}

impl HolderEntry {
    pub fn new(core: Arc<AccountCore>, seq: u64, callback: Box<PressureCallback>) -> Self {
        HolderEntry {
            core,
            seq,
            callback,
            calls: Mutex::new(CallState { registered: true, in_flight: Vec::new() }),
            idle: Condvar::new(),
        }
    }

    pub fn id(&self) -> HolderId {
        self.core.holder.as_ref().map(|m| m.id).expect("holder account without holder metadata")
    }

    pub fn priority(&self) -> Priority {
        self.core.holder.as_ref().map_or(Priority::LOWEST, |m| m.priority)
    }

    /// Delivers a ticket for the pool whose lineage (its id, then its
    /// ancestors') is `lineage`. `None`: the holder unregistered meanwhile
    /// (no ticket delivered). `Some(None)`: the callback panicked.
    pub fn deliver(&self, ticket: &PressureTicket, lineage: &Arc<[PoolId]>) -> Option<Option<u64>> {
        let me = sync::current_thread_id();
        {
            let mut st = lock(&self.calls);
            if !st.registered {
                return None;
            }
            st.in_flight.push(me);
        }
        let answer = {
            let _guard = InPressure::enter(lineage.clone());
            catch_unwind(AssertUnwindSafe(|| (self.callback)(ticket))).ok()
        };
        {
            let mut st = lock(&self.calls);
            if let Some(i) = st.in_flight.iter().position(|t| *t == me) {
                st.in_flight.swap_remove(i);
            }
            self.idle.notify_all();
        }
        Some(answer)
    }

    /// Stops deliveries and waits until running callbacks return — except
    /// those running on this very thread (a callback dropping its own
    /// registration), which would otherwise wait for themselves.
    pub fn close(&self) {
        let me = sync::current_thread_id();
        let mut st = lock(&self.calls);
        st.registered = false;
        while st.in_flight.iter().any(|t| *t != me) {
            st = sync::wait(&self.idle, st);
        }
    }
}

// Pools for which this thread is inside a pressure callback, each as its
// lineage (its id, then its ancestors'). (loom's `thread_local!` takes no
// `const { }` initialiser.)
#[cfg(not(loom))]
thread_local! {
    static IN_PRESSURE: RefCell<Vec<Arc<[PoolId]>>> = const { RefCell::new(Vec::new()) };
}
#[cfg(loom)]
thread_local! {
    static IN_PRESSURE: RefCell<Vec<Arc<[PoolId]>>> = RefCell::new(Vec::new());
}

struct InPressure(Arc<[PoolId]>);

impl InPressure {
    fn enter(lineage: Arc<[PoolId]>) -> InPressure {
        let _ = IN_PRESSURE.try_with(|v| v.borrow_mut().push(lineage.clone()));
        InPressure(lineage)
    }
}

impl Drop for InPressure {
    fn drop(&mut self) {
        let _ = IN_PRESSURE.try_with(|v| {
            let mut v = v.borrow_mut();
            if let Some(i) = v.iter().rposition(|p| Arc::ptr_eq(p, &self.0)) {
                v.remove(i);
            }
        });
    }
}

/// True while this thread runs a pressure callback for the pool whose
/// lineage is `lineage`, for one of its ancestors or for one of its
/// descendants: a pool whose holders may be those of the callback running.
pub(crate) fn in_pressure_near(lineage: &[PoolId]) -> bool {
    let me = lineage[0];
    IN_PRESSURE
        .try_with(|v| v.borrow().iter().any(|running| running.contains(&me) || lineage.contains(&running[0])))
        .unwrap_or(false)
}

/// A holder's registration with one pool; dropping it unregisters.
///
/// Unregistering (drop or [`unregister`](Self::unregister)) stops new
/// tickets at once and returns only when no callback of this holder runs on
/// another thread, so whatever the callback uses may be freed right after.
/// Leases and grants made on behalf of the holder stay valid and are
/// released as usual; the holder's statistics stay readable through
/// [`Pool::holder_stats`]. New grants naming the holder are refused.
///
/// Holding the registration inside its own callback makes a cycle that
/// never unregisters; don't.
///
/// Thread-safety: `Send + Sync`; all methods may be called from any thread.
pub struct HolderRegistration {
    pub(crate) pool: Arc<Pool>,
    pub(crate) entry: Arc<HolderEntry>,
}

impl HolderRegistration {
    /// The holder's id: pass it to [`Pool::try_reserve`] / [`Pool::reserve`].
    pub fn id(&self) -> HolderId {
        self.entry.id()
    }

    /// The pool it is registered with.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The priority it registered with.
    pub fn priority(&self) -> Priority {
        self.entry.priority()
    }

    /// Its statistics now.
    pub fn stats(&self) -> HolderStats {
        // Accounts live as long as their pool, and this registration keeps it alive.
        self.pool.account_stats(&self.entry.core).expect("holder account outlives its registration")
    }

    /// Unregisters now (same as dropping).
    pub fn unregister(self) {}
}

impl Drop for HolderRegistration {
    fn drop(&mut self) {
        self.pool.unregister_holder(&self.entry);
    }
}

impl fmt::Debug for HolderRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HolderRegistration")
            .field("holder", &self.id())
            .field("pool", &self.pool.id())
            .field("priority", &self.priority())
            .finish()
    }
}
