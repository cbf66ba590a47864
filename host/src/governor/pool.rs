//! Pools: the capacity word, granting (with pressure and waiting), ending
//! leases, holders and statistics. The tokens are in `grant.rs`.

use super::class::AllocationClass;
use super::error::{GovernorError, OutOfBudget, Rejected};
use super::grant::{leaks, Grant, Lease};
use super::holder::{in_pressure, HolderEntry, HolderRegistration, PressureCounters, PressureTicket};
use super::ids::{next_uid, HolderId, PoolId, Priority};
use super::shard::{self, Account, AccountCore, HolderMeta, RawClass, Shard};
use super::stats::{ClassStats, HolderStats, PoolSnapshot};
use crate::sync::{self, lock, AtomicU64, Condvar, Mutex};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Top bit of the capacity word: set while some thread waits for room.
const WAITERS: u64 = 1 << 63;
/// The byte count in the capacity word.
const BYTES: u64 = WAITERS - 1;

/// Largest capacity a pool can have (2^63 - 1 bytes).
pub const MAX_CAPACITY: u64 = BYTES;

/// The word every grant and refund touches, alone on its cache line with
/// the (rarely written) peak.
#[repr(align(64))]
struct Hot {
    /// Charged bytes (grants + leases + quarantine), plus [`WAITERS`].
    used: AtomicU64,
    peak: AtomicU64,
}

struct Holders {
    /// Registered holders, in registration order.
    list: Vec<Arc<HolderEntry>>,
    next_seq: u64,
}

/// One physical memory domain's budget.
///
/// A pool charges grants and leases against a fixed capacity; it
/// never allocates or frees memory. Obtain one from
/// [`Governor::create_pool`](super::Governor::create_pool) and
/// [`Governor::pool`](super::Governor::pool).
///
/// Thread-safety: `Send + Sync`. Every method may be called from any
/// thread, concurrently. [`try_reserve`](Self::try_reserve),
/// [`Grant::commit`], [`Grant::commit_into`] and
/// [`release`](Self::release) take no lock once the calling thread has
/// touched the account (holder or anonymous) before: the first touch takes
/// the account's lock once to obtain the thread's statistics shard. No
/// method holds a lock while it calls a holder.
pub struct Pool {
    hot: Hot,
    id: PoolId,
    capacity: u64,
    name: Arc<str>,
    /// The account of requests made on behalf of no holder; uid = pool id.
    anon: Arc<Account>,
    /// Holder accounts by holder id, registered or not (kept for the pool's
    /// life so that late releases and statistics find them).
    accounts: Mutex<BTreeMap<u64, Arc<Account>>>,
    holders: Mutex<Holders>,
    wait: Mutex<usize>,
    room: Condvar,
    pressure: PressureCounters,
    waits: AtomicU64,
    wait_timeouts: AtomicU64,
}

/// Outcome of one attempt to charge.
enum Attempt {
    Granted,
    NoRoom,
    Unknown,
}

impl Pool {
    pub(crate) fn new(name: &str, capacity: u64) -> Result<Arc<Pool>, GovernorError> {
        if capacity > MAX_CAPACITY {
            return Err(GovernorError::CapacityTooLarge { capacity, max: MAX_CAPACITY });
        }
        let id = PoolId(next_uid());
        leaks().insert(id.get(), BTreeMap::new());
        Ok(Arc::new(Pool {
            hot: Hot { used: AtomicU64::new(0), peak: AtomicU64::new(0) },
            id,
            capacity,
            name: name.into(),
            anon: Arc::new(Account::new(id.get(), id, None)),
            accounts: Mutex::new(BTreeMap::new()),
            holders: Mutex::new(Holders { list: Vec::new(), next_seq: 0 }),
            wait: Mutex::new(0),
            room: Condvar::new(),
            pressure: PressureCounters::new(),
            waits: AtomicU64::new(0),
            wait_timeouts: AtomicU64::new(0),
        }))
    }

    /// This pool's id.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes it may charge in all.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes charged now (grants, leases, quarantine). Exact.
    #[inline]
    pub fn used(&self) -> u64 {
        self.hot.used.load(Acquire) & BYTES
    }

    /// `capacity - used`. Exact.
    #[inline]
    pub fn free(&self) -> u64 {
        self.capacity - self.used()
    }

    /// Highest `used` ever reached.
    pub fn peak(&self) -> u64 {
        self.hot.peak.load(Relaxed)
    }

    // ----- the capacity word -------------------------------------------------

    /// Charges `bytes` if they fit: a compare-exchange loop on the capacity
    /// word, no lock. The bytes in the word never exceed `capacity`.
    #[inline(always)]
    pub(super) fn try_charge(&self, bytes: u64) -> bool {
        self.charge(self.hot.used.load(Relaxed), true, bytes).is_some()
    }

    /// The compare-exchange loop, starting from `expected`: a fresh read
    /// when `fresh`, else a guess (the thread's last seen value). Returns
    /// the new word. A refusal is only ever decided on a fresh read — a
    /// load or a failed compare-exchange — never on a guess.
    #[inline(always)]
    fn charge(&self, expected: u64, fresh: bool, bytes: u64) -> Option<u64> {
        let used = &self.hot.used;
        let (mut cur, mut fresh) = (expected, fresh);
        loop {
            let held = cur & BYTES;
            debug_assert!(held <= self.capacity || !fresh);
            if held > self.capacity || bytes > self.capacity - held {
                if fresh {
                    return None;
                }
                cur = used.load(Relaxed);
                fresh = true;
                continue;
            }
            // held + bytes <= capacity < 2^63: the waiters bit is untouched.
            match used.compare_exchange_weak(cur, cur + bytes, AcqRel, Relaxed) {
                Ok(_) => {
                    let now = held + bytes;
                    if now > self.hot.peak.load(Relaxed) {
                        self.hot.peak.fetch_max(now, Relaxed);
                    }
                    return Some(cur + bytes);
                }
                Err(seen) => {
                    cur = seen;
                    fresh = true;
                }
            }
        }
    }

    /// Returns `bytes` to the pool and wakes waiters if any announced
    /// themselves. Only ever called with bytes a token held, so the word
    /// cannot go below zero.
    #[inline(always)]
    pub(super) fn refund(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let prev = self.hot.used.fetch_sub(bytes, AcqRel);
        self.after_refund(prev, bytes);
    }

    /// Checks and wake-up after `bytes` left a word that was `prev`.
    #[inline(always)]
    fn after_refund(&self, prev: u64, bytes: u64) {
        debug_assert!(
            prev & BYTES >= bytes,
            "governor refund of {bytes} B exceeds the {} B charged",
            prev & BYTES
        );
        if prev & WAITERS != 0 {
            self.wake_waiters();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_waiters(&self) {
        let _g = lock(&self.wait);
        // Waiters re-announce themselves (under this lock) if still short.
        self.hot.used.fetch_and(!WAITERS, AcqRel);
        self.room.notify_all();
    }

    /// Waits until `bytes` can be charged (and charges them) or `deadline`
    /// passes. The protocol: under the wait lock, try to charge; if short,
    /// set [`WAITERS`] with an atomic OR and look at the value it returns —
    /// every refund ordered after the OR sees the bit and takes the wait
    /// lock to notify, so no wake-up is lost; a refund ordered before it is
    /// visible in the returned value.
    fn wait_for_room(&self, bytes: u64, deadline: Instant) -> bool {
        let mut waiting = lock(&self.wait);
        *waiting += 1;
        let granted = loop {
            if self.try_charge(bytes) {
                break true;
            }
            let seen = self.hot.used.fetch_or(WAITERS, AcqRel);
            if bytes <= self.capacity - (seen & BYTES) {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            waiting = sync::wait_timeout(&self.room, waiting, deadline - now);
        };
        *waiting -= 1;
        if *waiting == 0 {
            self.hot.used.fetch_and(!WAITERS, AcqRel);
        }
        granted
    }

    // ----- accounts and shards ----------------------------------------------

    #[inline(always)]
    pub(super) fn account_uid(&self, holder: Option<HolderId>) -> u64 {
        match holder {
            Some(h) => h.get(),
            None => self.id.get(),
        }
    }

    fn account(&self, uid: u64) -> Option<Arc<Account>> {
        if uid == self.id.get() {
            Some(self.anon.clone())
        } else {
            lock(&self.accounts).get(&uid).cloned()
        }
    }

    /// Runs `f` on this thread's shard of account `uid`; `Err` when the
    /// pool has no such account.
    #[inline(always)]
    fn with_shard<R>(&self, uid: u64, f: impl FnOnce(&Shard) -> R) -> Result<R, ()> {
        match shard::with_cached(uid, self.id, f) {
            Ok(r) => Ok(r),
            Err(f) => self.with_shard_slow(uid, f),
        }
    }

    #[cold]
    #[inline(never)]
    fn with_shard_slow<R>(&self, uid: u64, f: impl FnOnce(&Shard) -> R) -> Result<R, ()> {
        let account = self.account(uid).ok_or(())?;
        Ok(shard::with_account(&account, f))
    }

    /// Statistics update for a token's account, which exists for as long as
    /// the pool does.
    #[inline(always)]
    pub(super) fn on_shard(&self, uid: u64, f: impl FnOnce(&Shard)) {
        let r = self.with_shard(uid, f);
        debug_assert!(r.is_ok(), "a token of {} names an account the pool does not have", self.id);
    }

    #[inline(always)]
    fn try_grant(&self, uid: u64, bytes: u64, class: AllocationClass, count_failure: bool) -> Attempt {
        self.with_shard(uid, |s| {
            if !s.core.registered.load(Relaxed) {
                return Attempt::Unknown;
            }
            let c = s.cells(class);
            if let Some(word) = self.charge(s.hint.load(Relaxed), false, bytes) {
                s.hint.store(word, Relaxed);
                s.add(&c.reserved, bytes);
                s.add(&c.grants, 1);
                Attempt::Granted
            } else {
                if count_failure {
                    s.add(&c.failures, 1);
                }
                Attempt::NoRoom
            }
        })
        .unwrap_or(Attempt::Unknown)
    }

    #[cold]
    fn unknown_holder(&self, holder: Option<HolderId>) -> GovernorError {
        match holder {
            Some(holder) => GovernorError::UnknownHolder { pool: self.id, holder },
            // The anonymous account always exists.
            None => unreachable!("anonymous account missing"),
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn out_of_budget(
        &self,
        requested: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
    ) -> GovernorError {
        GovernorError::OutOfBudget(OutOfBudget {
            requested,
            class,
            holder,
            snapshot: Box::new(self.snapshot()),
        })
    }

    // ----- granting ----------------------------------------------------------

    /// Grants `bytes` of `class` on behalf of `holder` (or of no holder) if
    /// they fit now; never asks holders, never waits.
    ///
    /// Fast path: one compare-exchange on the capacity word plus plain
    /// stores to this thread's statistics shard; no lock, no allocation.
    /// Fails with [`GovernorError::OutOfBudget`] (a refusal is counted in
    /// `failures`) or [`GovernorError::UnknownHolder`].
    #[inline]
    pub fn try_reserve(
        &self,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
    ) -> Result<Grant<'_>, GovernorError> {
        match self.try_grant(self.account_uid(holder), bytes, class, true) {
            Attempt::Granted => Ok(Grant { pool: self, bytes, class, holder }),
            Attempt::NoRoom => Err(self.out_of_budget(bytes, class, holder)),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
        }
    }

    /// Grants `bytes`, asking holders for room and optionally waiting.
    ///
    /// 1. If the bytes fit, as [`try_reserve`](Self::try_reserve).
    /// 2. Otherwise, unless `bytes` exceeds the capacity or this thread is
    ///    inside a pressure callback of this pool, tickets go one at a time
    ///    to the registered holders whose priority is lower than or equal to
    ///    the requester's ([`Priority::HIGHEST`] for no holder), the
    ///    requester excluded: lowest priority first, equal priorities in
    ///    registration order. Each ticket asks for the bytes still missing;
    ///    after each answer the grant is retried, and no further holder is
    ///    asked once it succeeds. Callbacks run on this thread with no
    ///    governor lock held.
    /// 3. If still short and `deadline` is given, waits until refunds make
    ///    room (every refund wakes waiters, however late it arrives — e.g.
    ///    a deferred free completing) or the deadline passes. Holders are
    ///    not asked again while waiting.
    ///
    /// Fails with [`GovernorError::OutOfBudget`], whose snapshot is taken
    /// after the last attempt, or [`GovernorError::UnknownHolder`].
    #[inline]
    pub fn reserve(
        &self,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
        deadline: Option<Instant>,
    ) -> Result<Grant<'_>, GovernorError> {
        let uid = self.account_uid(holder);
        match self.try_grant(uid, bytes, class, false) {
            Attempt::Granted => Ok(Grant { pool: self, bytes, class, holder }),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
            Attempt::NoRoom => self.reserve_slow(uid, bytes, class, holder, deadline),
        }
    }

    #[cold]
    #[inline(never)]
    fn reserve_slow(
        &self,
        uid: u64,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
        deadline: Option<Instant>,
    ) -> Result<Grant<'_>, GovernorError> {
        if bytes <= self.capacity && !in_pressure(self.id) {
            let priority = match holder {
                None => Priority::HIGHEST,
                Some(h) => match lock(&self.holders).list.iter().find(|e| e.id() == h) {
                    Some(e) => e.priority(),
                    None => return Err(self.unknown_holder(holder)),
                },
            };
            for h in self.candidates(holder, priority) {
                let wanted = bytes.saturating_sub(self.free());
                if wanted > 0 {
                    let ticket = PressureTicket {
                        pool: self.id,
                        bytes_wanted: wanted,
                        class,
                        priority,
                        requester: holder,
                        deadline: deadline.unwrap_or_else(Instant::now),
                    };
                    if let Some(answer) = h.deliver(&ticket) {
                        self.pressure.record(wanted, answer);
                        h.core.pressure.record(wanted, answer);
                    }
                }
                match self.try_grant(uid, bytes, class, false) {
                    Attempt::Granted => return Ok(Grant { pool: self, bytes, class, holder }),
                    Attempt::Unknown => return Err(self.unknown_holder(holder)),
                    Attempt::NoRoom => {}
                }
            }
        }
        if let Some(deadline) = deadline.filter(|_| bytes <= self.capacity) {
            self.waits.fetch_add(1, Relaxed);
            if self.wait_for_room(bytes, deadline) {
                let registered = self
                    .with_shard(uid, |s| {
                        let c = s.cells(class);
                        s.add(&c.reserved, bytes);
                        s.add(&c.grants, 1);
                        s.core.registered.load(Relaxed)
                    })
                    .unwrap_or(false);
                let r = Grant { pool: self, bytes, class, holder };
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
            Attempt::Granted => Ok(Grant { pool: self, bytes, class, holder }),
            Attempt::NoRoom => Err(self.out_of_budget(bytes, class, holder)),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
        }
    }

    /// Holders that may receive a ticket, in the order they receive it.
    fn candidates(&self, requester: Option<HolderId>, priority: Priority) -> Vec<Arc<HolderEntry>> {
        let mut v: Vec<Arc<HolderEntry>> = lock(&self.holders)
            .list
            .iter()
            .filter(|e| Some(e.id()) != requester && e.priority() <= priority)
            .cloned()
            .collect();
        v.sort_by_key(|e| (e.priority(), e.seq));
        v
    }

    // ----- ending leases -----------------------------------------------------

    /// Ends a lease after its memory was physically freed: refunds its
    /// bytes (waking waiters). No lock on the fast path.
    ///
    /// A lease of another pool is handed back in the error, untouched.
    #[inline]
    pub fn release(&self, lease: Lease) -> Result<(), Rejected<Lease>> {
        if lease.pool != self.id {
            let error = GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool };
            return Err(Rejected { value: lease, error });
        }
        let (holder, class, bytes) = lease.disarm();
        let mut prev = bytes;
        self.on_shard(self.account_uid(holder), |s| {
            let c = s.cells(class);
            s.sub(&c.leased, bytes);
            s.sub(&c.leases, 1);
            prev = self.hot.used.fetch_sub(bytes, AcqRel);
            s.hint.store(prev.wrapping_sub(bytes), Relaxed);
        });
        self.after_refund(prev, bytes);
        Ok(())
    }

    /// Refunds `bytes` of a lease whose memory shrank (e.g. a decommitted
    /// part of a virtual range); the lease keeps the rest. More than the
    /// lease holds is [`GovernorError::OverRelease`], and nothing changes.
    pub fn release_part(&self, lease: &mut Lease, bytes: u64) -> Result<(), GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(self.account_uid(lease.holder), |s| s.sub(&s.cells(lease.class).leased, bytes));
        lease.bytes -= bytes;
        self.refund(bytes);
        Ok(())
    }

    /// Ends a lease whose release the plugin could not complete
    /// (invariant 7): its bytes stay charged, now reported as quarantined,
    /// and are never refunded.
    pub fn quarantine(&self, lease: Lease) -> Result<(), Rejected<Lease>> {
        if lease.pool != self.id {
            let error = GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool };
            return Err(Rejected { value: lease, error });
        }
        let (holder, class, bytes) = lease.disarm();
        self.on_shard(self.account_uid(holder), |s| {
            let c = s.cells(class);
            s.sub(&c.leased, bytes);
            s.sub(&c.leases, 1);
            s.add(&c.quarantined, bytes);
            s.add(&c.quarantines, 1);
        });
        Ok(())
    }

    /// Quarantines `bytes` of a lease (a part whose decommit failed); the
    /// lease keeps the rest. More than the lease holds is
    /// [`GovernorError::OverRelease`], and nothing changes.
    pub fn quarantine_part(&self, lease: &mut Lease, bytes: u64) -> Result<(), GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(self.account_uid(lease.holder), |s| {
            let c = s.cells(lease.class);
            s.sub(&c.leased, bytes);
            s.add(&c.quarantined, bytes);
            s.add(&c.quarantines, 1);
        });
        lease.bytes -= bytes;
        Ok(())
    }

    /// Moves `bytes` of a lease into a new lease (same pool, class and
    /// holder); nothing is charged or refunded. For a part that will be
    /// freed later than the rest — e.g. a decommitted tail waiting for its
    /// fences — so each lease covers exactly the bytes it will release.
    /// More than the lease holds is [`GovernorError::OverRelease`], and
    /// nothing changes.
    pub fn split_lease(&self, lease: &mut Lease, bytes: u64) -> Result<Lease, GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(self.account_uid(lease.holder), |s| s.add(&s.cells(lease.class).leases, 1));
        lease.bytes -= bytes;
        Ok(Lease { pool: self.id, holder: lease.holder, class: lease.class, bytes })
    }

    fn check_part(&self, lease: &Lease, bytes: u64) -> Result<(), GovernorError> {
        if lease.pool != self.id {
            return Err(GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool });
        }
        if bytes > lease.bytes {
            return Err(GovernorError::OverRelease { requested: bytes, held: lease.bytes });
        }
        Ok(())
    }

    // ----- holders -------------------------------------------------------------

    /// Registers a holder: an owner of bytes in this pool that answers
    /// pressure tickets with `callback` (see
    /// [`PressureCallback`](super::PressureCallback)). Dropping the
    /// returned registration unregisters it.
    pub fn register_holder<F>(
        self: &Arc<Self>,
        name: &str,
        priority: Priority,
        callback: F,
    ) -> HolderRegistration
    where
        F: Fn(&PressureTicket) -> u64 + Send + Sync + 'static,
    {
        let id = HolderId(next_uid());
        let meta = HolderMeta { id, name: name.into(), priority };
        let account = Arc::new(Account::new(id.get(), self.id, Some(meta)));
        let core = account.core.clone();
        lock(&self.accounts).insert(id.get(), account);
        let entry = {
            let mut holders = lock(&self.holders);
            let seq = holders.next_seq;
            holders.next_seq += 1;
            let entry = Arc::new(HolderEntry::new(core, seq, Box::new(callback)));
            holders.list.push(entry.clone());
            entry
        };
        HolderRegistration { pool: self.clone(), entry }
    }

    pub(crate) fn unregister_holder(&self, entry: &Arc<HolderEntry>) {
        entry.core.registered.store(false, Relaxed);
        lock(&self.holders).list.retain(|e| !Arc::ptr_eq(e, entry));
        entry.close();
    }

    // ----- statistics ----------------------------------------------------------

    /// The pool's figures now (see [`stats`](super::stats) for exactness).
    /// Takes the pool's account locks briefly; never blocks a fast path.
    pub fn snapshot(&self) -> PoolSnapshot {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        let mut raw = self.anon.raw();
        for a in &accounts {
            for (r, o) in raw.iter_mut().zip(a.raw().iter()) {
                r.add(o);
            }
        }
        let mut classes: [ClassStats; AllocationClass::COUNT] = raw.map(RawClass::to_stats);
        if let Some(table) = leaks().get(&self.id.get()) {
            for (&(_, class), &(count, bytes)) in table {
                classes[class].leaked_leases += count;
                classes[class].leaked_bytes += bytes;
            }
        }
        let totals = super::stats::total(&classes);
        let word = self.hot.used.load(Acquire);
        let used = word & BYTES;
        PoolSnapshot {
            pool: self.id,
            name: self.name.clone(),
            capacity: self.capacity,
            used,
            free: self.capacity - used,
            peak: self.hot.peak.load(Relaxed),
            reserved: totals.reserved,
            leased: totals.leased,
            quarantined: totals.quarantined,
            classes,
            pressure: self.pressure.get(),
            waits: self.waits.load(Relaxed),
            wait_timeouts: self.wait_timeouts.load(Relaxed),
            holders: lock(&self.holders).list.len(),
        }
    }

    /// One holder's figures, registered or not; `None` if the holder never
    /// belonged to this pool.
    pub fn holder_stats(&self, holder: HolderId) -> Option<HolderStats> {
        let account = lock(&self.accounts).get(&holder.get()).cloned()?;
        Some(self.stats_of(&account))
    }

    /// Every holder this pool ever had, in registration order.
    pub fn holders(&self) -> Vec<HolderStats> {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        accounts.iter().map(|a| self.stats_of(a)).collect()
    }

    pub(crate) fn account_stats(&self, core: &AccountCore) -> Option<HolderStats> {
        let account = lock(&self.accounts).get(&core.uid).cloned()?;
        Some(self.stats_of(&account))
    }

    fn stats_of(&self, account: &Account) -> HolderStats {
        let core = &account.core;
        let mut classes: [ClassStats; AllocationClass::COUNT] = account.raw().map(RawClass::to_stats);
        if let Some(table) = leaks().get(&self.id.get()) {
            for (&(acct, class), &(count, bytes)) in table {
                if acct == core.uid {
                    classes[class].leaked_leases += count;
                    classes[class].leaked_bytes += bytes;
                }
            }
        }
        let meta = core.holder.as_ref().expect("holder account without metadata");
        HolderStats {
            holder: meta.id,
            pool: self.id,
            name: meta.name.clone(),
            priority: meta.priority,
            registered: core.registered.load(Relaxed),
            classes,
            pressure: core.pressure.get(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        leaks().remove(&self.id.get());
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("used", &self.used())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_word_bits() {
        assert_eq!(MAX_CAPACITY, u64::MAX >> 1);
        assert_eq!(WAITERS & BYTES, 0);
    }

    #[test]
    fn oversized_capacity_is_refused() {
        assert!(matches!(Pool::new("x", MAX_CAPACITY + 1), Err(GovernorError::CapacityTooLarge { .. })));
        let p = Pool::new("max", MAX_CAPACITY).unwrap();
        let r = p.try_reserve(MAX_CAPACITY, AllocationClass::Other, None).unwrap();
        assert_eq!(p.used(), MAX_CAPACITY);
        assert!(p.try_reserve(1, AllocationClass::Other, None).is_err());
        drop(r);
        assert_eq!(p.used(), 0);
    }
}
