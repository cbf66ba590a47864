//! Granting: `try_reserve` (the fast path, no lock) and `reserve`, whose
//! slow path asks the holders under the short pool and waits for room.

use super::*;

impl Pool {
    /// Grants `bytes` of `class` on behalf of `holder` (or of no holder) if
    /// they fit now, here and in every ancestor; never asks holders, never
    /// waits.
    ///
    /// Fast path: one compare-exchange on the capacity word (plus one per
    /// ancestor) and plain stores to this thread's statistics shard; no
    /// lock, no allocation. Fails with [`GovernorError::OutOfBudget`] (a
    /// refusal is counted in `failures`; its snapshot is the short pool's)
    /// or [`GovernorError::UnknownHolder`].
    #[inline]
    pub fn try_reserve(
        &self,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
    ) -> Result<Grant<'_>, GovernorError> {
        let uid = self.account_uid(holder);
        match self.try_grant(uid, bytes, class, true) {
            Attempt::Granted => Ok(Grant { pool: self, bytes, account: uid, class }),
            Attempt::NoRoom(short) => Err(self.out_of_budget(short, bytes, class, holder)),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
        }
    }

    /// Grants `bytes`, asking holders for room and optionally waiting.
    ///
    /// 1. If the bytes fit (here and in every ancestor), as
    ///    [`try_reserve`](Self::try_reserve).
    /// 2. Otherwise, tickets go to the holders registered under the pool
    ///    that is short — that pool and every pool below it: a tenant's
    ///    holders free room in the tenant, a device pool that is short asks
    ///    the holders of every pool under it. Unless `bytes` exceeds the
    ///    short pool's capacity, or this thread is inside a pressure
    ///    callback of a pool above, below or equal to it, tickets go one
    ///    at a time to those whose priority is lower than or equal to the
    ///    requester's ([`Priority::HIGHEST`] for no holder), the requester
    ///    excluded: lowest priority first, equal priorities in registration
    ///    order. Each ticket asks for the bytes still missing in the short
    ///    pool; after each answer the grant is retried, and no further
    ///    holder is asked once it succeeds. When the retry is short in
    ///    another pool, the holders under that one are asked next; no
    ///    holder receives two tickets for one request. Callbacks run on
    ///    this thread with no governor lock held.
    /// 3. If still short and `deadline` is given, waits until refunds (or a
    ///    capacity raise) make room in the pool that is short (every
    ///    refund wakes waiters, however late it arrives — e.g. a deferred
    ///    free completing) or the deadline passes. While it waits, the
    ///    holders are asked again as in step 2 after 1 ms, then after
    ///    pauses doubling to at most [`REASK_MAX`]: the room a ticket
    ///    freed may have been taken by another request before the retry,
    ///    and a holder keeps memory it could give up, so a request that
    ///    only waited would starve while evictable memory stays cached.
    ///
    /// Fails with [`GovernorError::OutOfBudget`], whose snapshot is the
    /// short pool's, taken after the last attempt, or
    /// [`GovernorError::UnknownHolder`].
    #[inline(always)]
    pub fn reserve(
        &self,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
        deadline: Option<Instant>,
    ) -> Result<Grant<'_>, GovernorError> {
        let uid = self.account_uid(holder);
        match self.try_grant(uid, bytes, class, false) {
            Attempt::Granted => Ok(Grant { pool: self, bytes, account: uid, class }),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
            Attempt::NoRoom(short) => self.reserve_slow(uid, bytes, class, holder, deadline, short),
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn reserve_slow<'p>(
        &'p self,
        uid: u64,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
        deadline: Option<Instant>,
        short: &'p Pool,
    ) -> Result<Grant<'p>, GovernorError> {
        let grant = || Grant { pool: self, bytes, account: uid, class };
        // The pool was short: its use is at its highest.
        self.sample_peaks();
        let priority = match holder {
            None => Priority::HIGHEST,
            Some(h) => match lock(&self.holders).iter().find(|e| e.id() == h) {
                Some(e) => e.priority(),
                None => return Err(self.unknown_holder(holder)),
            },
        };
        // Budget from outside (a node authority) before any holder here.
        if self.ask_sources(bytes, class, priority, deadline) {
            match self.try_grant(uid, bytes, class, false) {
                Attempt::Granted => return Ok(grant()),
                Attempt::Unknown => return Err(self.unknown_holder(holder)),
                Attempt::NoRoom(_) => {}
            }
        }
        let request = Request { class, requester: holder, priority, deadline };
        let ask = || {
            ask_holders(
                short,
                &request,
                |p| bytes <= p.capacity(),
                |p| bytes.saturating_sub(p.free()),
                || self.try_grant(uid, bytes, class, false),
            )
        };
        match ask() {
            Attempt::Granted => return Ok(grant()),
            Attempt::Unknown => return Err(self.unknown_holder(holder)),
            Attempt::NoRoom(_) => {}
        }
        let delegated = self.has_source();
        if let Some(deadline) = deadline.filter(|_| delegated || self.fits_capacities(bytes)) {
            self.waits.fetch_add(1, Relaxed);
            let mut pause = REASK_FIRST;
            let room = loop {
                let until = deadline.min(Instant::now() + pause);
                if self.wait_for_room(bytes, until) {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                if delegated && self.ask_sources(bytes, class, priority, Some(deadline)) {
                    match self.try_grant(uid, bytes, class, false) {
                        Attempt::Granted => return Ok(grant()),
                        Attempt::Unknown => return Err(self.unknown_holder(holder)),
                        Attempt::NoRoom(_) => {}
                    }
                }
                match ask() {
                    Attempt::Granted => return Ok(grant()),
                    Attempt::Unknown => return Err(self.unknown_holder(holder)),
                    Attempt::NoRoom(_) => {}
                }
                pause = (pause * 2).min(REASK_MAX);
            };
            if room {
                let registered = self
                    .with_shard(uid, |s| {
                        let c = s.cells(class);
                        s.add(&c.reserved, bytes);
                        s.add(&c.granted, bytes);
                        s.add(&c.grants, 1);
                        s.core.registered.load(Relaxed)
                    })
                    .unwrap_or(false);
                if events_wanted() {
                    self.observe_grant(uid, bytes, class);
                }
                let r = grant();
                if !registered {
                    drop(r); // the holder left while we waited: give it back
                    return Err(self.unknown_holder(holder));
                }
                return Ok(r);
            }
            self.wait_timeouts.fetch_add(1, Relaxed);
        }
        // One last attempt: a refund may have landed since the last one.
        match self.try_grant(uid, bytes, class, true) {
            Attempt::Granted => Ok(grant()),
            Attempt::NoRoom(short) => Err(self.out_of_budget(short, bytes, class, holder)),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
        }
    }
}
