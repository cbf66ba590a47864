//! Trees of pools: a charge fits only if it fits at the pool and at every
//! ancestor, and is charged at each (leaf first, root last, one
//! compare-exchange per level); a refusal at one level refunds the levels
//! already charged, so no level is ever over its capacity and nothing
//! leaks. Pressure goes to the holders under the pool that is short.
//! Capacities change at run time.

use super::error::{ChargePath, GovernorError, OutOfBudget};
use super::holder::{in_pressure_near, HolderEntry, PressureTicket};
use super::level::MAX_CAPACITY;
use super::pool::{Attempt, Pool};
use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId, Priority};
use crate::sync::lock;
use std::sync::Arc;
use std::time::Instant;

impl Pool {
    /// Charges `bytes` at this pool, then at each ancestor, each from a
    /// fresh read; on a refusal refunds the levels already charged and
    /// returns the pool that was short. Each level's peak is noted only
    /// once every level above took the charge (a refused charge leaves no
    /// trace in any figure).
    pub(super) fn charge_chain(&self, bytes: u64) -> Result<(), &Pool> {
        let Some(word) = self.level.charge(self.level.load(), true, bytes) else {
            return Err(self);
        };
        if let Some(parent) = self.level.parent() {
            if let Err(short) = parent.charge_chain(bytes) {
                self.level.refund(bytes);
                return Err(short);
            }
        }
        self.level.note_peak(word);
        Ok(())
    }

    /// Returns `bytes` at this pool and every ancestor (a token held them
    /// at each), waking waiters at each level that has some.
    #[inline(always)]
    pub(super) fn refund(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.level.refund(bytes);
        if let Some(parent) = self.level.parent() {
            parent.refund_chain(bytes);
        }
    }

    /// [`refund`](Self::refund) from this pool up, out of line (marked
    /// cold so that a pool without a parent keeps its fast path's
    /// registers).
    #[cold]
    #[inline(never)]
    pub(super) fn refund_chain(&self, bytes: u64) {
        let mut level = Some(self);
        while let Some(p) = level {
            p.level.refund(bytes);
            level = p.level.parent().map(|p| &**p);
        }
    }

    /// Whether `bytes` could ever fit with today's capacities.
    pub(super) fn fits_capacities(&self, bytes: u64) -> bool {
        let mut level = Some(self);
        while let Some(p) = level {
            if bytes > p.capacity() {
                return false;
            }
            level = p.level.parent().map(|p| &**p);
        }
        true
    }

    /// Waits until `bytes` can be charged at every level (and charges
    /// them) or `deadline` passes: each time a level is short, sleeps on
    /// that level's wait protocol (see `Level::wait_on`), then retries the
    /// whole chain.
    pub(super) fn wait_for_room(&self, bytes: u64, deadline: Instant) -> bool {
        loop {
            match self.charge_chain(bytes) {
                Ok(()) => return true,
                Err(short) => {
                    if !short.level.wait_on(bytes, deadline) {
                        return false;
                    }
                }
            }
        }
    }

    /// The refusal of `requested` bytes asked of this pool, `short` (this
    /// pool or an ancestor) having had no room.
    #[cold]
    #[inline(never)]
    pub(super) fn out_of_budget(
        &self,
        short: &Pool,
        requested: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
    ) -> GovernorError {
        let (mut pools, mut at) = (Vec::with_capacity(self.lineage.len()), 0);
        let mut level = Some(self);
        while let Some(p) = level {
            if std::ptr::eq(p, short) {
                at = pools.len();
            }
            pools.push((p.id, p.name.clone()));
            level = p.level.parent().map(|p| &**p);
        }
        self.observe_refusal(short, requested, class, holder);
        GovernorError::OutOfBudget(OutOfBudget {
            requested,
            class,
            holder,
            snapshot: Box::new(short.snapshot()),
            path: Box::new(ChargePath { pools, short: at }),
        })
    }

    /// The holders registered with this pool or any pool below it that may
    /// receive a ticket for `request`, not yet `asked`, in the order they
    /// receive it: lowest priority first, then registration order.
    fn candidates_under(&self, request: &Request, asked: &[HolderId]) -> Vec<Arc<HolderEntry>> {
        let mut v = Vec::new();
        self.holders_under(&mut v);
        v.retain(|e| {
            let id = e.id();
            Some(id) != request.requester && e.priority() <= request.priority && !asked.contains(&id)
        });
        v.sort_by_key(|e| (e.priority(), e.seq));
        v
    }

    /// Every holder registered with this pool or a pool below it. Takes
    /// each pool's holder lock in turn, never two at once.
    fn holders_under(&self, out: &mut Vec<Arc<HolderEntry>>) {
        out.extend(lock(&self.holders).iter().cloned());
        for child in self.children() {
            child.holders_under(out);
        }
    }

    // ----- capacity changes ----------------------------------------------------

    /// Changes the capacity at run time.
    ///
    /// * Raising always succeeds (and wakes requests waiting for room here).
    /// * Lowering to at least what is live (`used`, descendants included)
    ///   succeeds at once.
    /// * Lowering below what is live first sends pressure tickets for the
    ///   excess to the holders registered with this pool or any pool below
    ///   it — one at a time, lowest priority first, with class
    ///   [`AllocationClass::Other`], no requester, [`Priority::HIGHEST`] and
    ///   a deadline of now, stopping once the rest fits — unless this
    ///   thread is inside a pressure callback of a pool above, below or
    ///   equal to this one. If more than `capacity` is still live then, the
    ///   change is refused with [`GovernorError::CapacityBelowLive`], which
    ///   says how much is live, and the capacity stays as it was.
    ///
    /// The change itself is one atomic update of the pool's capacity word:
    /// every charge is ordered before or after it, so none can exceed the
    /// new capacity, and no charge or refund waits for it. A child's
    /// capacity may exceed its parent's (over-subscription): the parent's
    /// limit binds. `capacity` above [`MAX_CAPACITY`] is
    /// [`GovernorError::CapacityTooLarge`].
    ///
    /// Thread-safety: any thread, concurrently with anything (changes of
    /// one pool are serialised by a lock held for two stores, never while
    /// a callback runs).
    pub fn set_capacity(&self, capacity: u64) -> Result<(), GovernorError> {
        self.set_capacity_for(capacity, AllocationClass::Other, Priority::HIGHEST, None)
    }

    /// [`Pool::set_capacity`] on behalf of a request from outside the
    /// process (a node authority's ticket): the tickets to this pool's
    /// holders carry the request's `class`, `priority` and `deadline`, and
    /// only holders of equal or lower priority are asked, exactly as for a
    /// request made in this process.
    pub fn set_capacity_for(
        &self,
        capacity: u64,
        class: AllocationClass,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> Result<(), GovernorError> {
        if capacity > MAX_CAPACITY {
            return Err(GovernorError::CapacityTooLarge { capacity, max: MAX_CAPACITY });
        }
        self.relieve_for(capacity, class, priority, deadline);
        self.level.set_capacity(capacity).map_err(|b| GovernorError::CapacityBelowLive {
            pool: self.name.clone(),
            requested: capacity,
            live: b.live,
            capacity: b.capacity,
        })
    }
}

impl Pool {
    /// Asks the holders under this pool of equal or lower `priority`, one
    /// at a time, lowest first, with tickets of `class` and `deadline`, to
    /// bring what is live here down to `target`; returns what is live then.
    /// The capacity is not changed: a caller that lowers it afterwards
    /// (a node link answering another process's ticket) asks the holders
    /// first without holding whatever serialises its capacity changes.
    pub fn relieve_for(
        &self,
        target: u64,
        class: AllocationClass,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> u64 {
        if self.used() > target {
            let request = Request { class, requester: None, priority, deadline };
            let fits = || if self.used() <= target { Attempt::Granted } else { Attempt::NoRoom(self) };
            ask_holders(self, &request, |_| true, |p| p.used().saturating_sub(target), fits);
        }
        self.used()
    }
}

/// What tickets of one request carry.
pub(super) struct Request {
    pub class: AllocationClass,
    pub requester: Option<HolderId>,
    pub priority: Priority,
    /// `None`: each ticket's deadline is the moment it is issued.
    pub deadline: Option<Instant>,
}

/// Sends tickets, one at a time, to the holders under `short` (the pool
/// that is short), retrying after each answer; when a retry is short in
/// another pool, continues with the holders under that one (no holder is
/// asked twice). Stops when `retry` is not short, when no holder is left,
/// when `can_fit(short)` is false (the request could never fit there), or
/// when this thread is inside a callback of a pool related to `short` (so
/// pressure never recurses). `missing(short)`: the bytes a ticket asks
/// for; none is sent when it is zero (the retry still runs). No lock is
/// held while a callback runs.
pub(super) fn ask_holders<'p>(
    mut short: &'p Pool,
    request: &Request,
    can_fit: impl Fn(&Pool) -> bool,
    missing: impl Fn(&Pool) -> u64,
    mut retry: impl FnMut() -> Attempt<'p>,
) -> Attempt<'p> {
    let mut asked: Vec<HolderId> = Vec::new();
    let mut queue: Vec<Arc<HolderEntry>> = Vec::new();
    let mut queue_of: Option<PoolId> = None;
    loop {
        if !can_fit(short) || in_pressure_near(&short.lineage) {
            return Attempt::NoRoom(short);
        }
        if queue_of != Some(short.id) {
            queue = short.candidates_under(request, &asked);
            queue.reverse();
            queue_of = Some(short.id);
        }
        let Some(h) = queue.pop() else {
            return Attempt::NoRoom(short);
        };
        asked.push(h.id());
        let wanted = missing(short);
        if wanted > 0 {
            let ticket = PressureTicket {
                pool: short.id,
                bytes_wanted: wanted,
                class: request.class,
                priority: request.priority,
                requester: request.requester,
                deadline: request.deadline.unwrap_or_else(Instant::now),
            };
            short.observe_ticket(&ticket, h.id());
            if let Some(answer) = h.deliver(&ticket, &short.lineage) {
                short.pressure.record(request.class, wanted, answer);
                h.core.pressure.record(request.class, wanted, answer);
                short.observe_answer(&ticket, h.id(), answer);
            }
        }
        match retry() {
            Attempt::NoRoom(s) => short = s,
            done => return done,
        }
    }
}
