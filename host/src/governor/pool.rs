//! Pools: granting (with pressure and waiting), ending leases, holders
//! and statistics. The capacity word is in `level.rs`, the tree of pools
//! (ancestors charged with every charge, pressure under the short pool,
//! capacity changes) in `tree.rs`, the tokens in `grant.rs`.

use super::class::AllocationClass;
use super::error::{GovernorError, Rejected};
use super::grant::{leaks, Grant, Lease};
use super::holder::{HolderEntry, HolderRegistration, PressureCounters, PressureTicket};
use super::ids::{next_uid, HolderId, PoolId, Priority};
use super::level::{Level, MAX_CAPACITY};
use super::shard::{self, Account, AccountCore, HolderMeta, RawClass, Shard};
use super::stats::{ClassPeaks, ClassStats, HolderStats, PoolSnapshot};
use super::tree::{ask_holders, Request};
use crate::observe::{events_wanted, Hub};
use crate::sync::{lock, AtomicU64, Mutex};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

#[cfg(test)]
use super::level::{BYTES, WAITERS};

/// How long a waiting request first waits before asking the holders again.
const REASK_FIRST: Duration = Duration::from_millis(1);
/// The longest pause between two rounds of tickets while a request waits:
/// a holder that answers 0 is asked at most about 20 times a second.
pub const REASK_MAX: Duration = Duration::from_millis(50);

/// One physical memory domain's budget, or a part of one: a pool may have
/// a parent (a process-wide limit over per-device pools, per-tenant pools
/// under a device pool), and then every byte it charges is charged at
/// every ancestor too.
///
/// A pool charges grants and leases against its capacity (and its
/// ancestors'); it never allocates or frees memory. Obtain one from
/// [`Governor::create_pool`](super::Governor::create_pool),
/// [`Governor::create_child_pool`](super::Governor::create_child_pool) and
/// [`Governor::pool`](super::Governor::pool). A child keeps its parent
/// alive (it holds an `Arc` of it); a parent only knows its children
/// weakly.
///
/// Thread-safety: `Send + Sync`. Every method may be called from any
/// thread, concurrently. [`try_reserve`](Self::try_reserve),
/// [`Grant::commit`], [`Grant::commit_into`] and
/// [`release`](Self::release) take no lock once the calling thread has
/// touched the account (holder or anonymous) before: the first touch takes
/// the account's lock once to obtain the thread's statistics shard. A
/// charge on a pool with `k` ancestors is `k + 1` compare-exchanges in the
/// common case. No method holds a lock while it calls a holder.
pub struct Pool {
    /// The capacity word and the pool above, whose capacity (and whose
    /// ancestors') every charge must fit in too.
    pub(super) level: Level,
    pub(super) id: PoolId,
    /// This pool's id, then its parent's, ... the root's last.
    pub(super) lineage: Arc<[PoolId]>,
    /// Pools created under this one (weak: children keep parents alive,
    /// not the reverse).
    pub(super) children: Mutex<Vec<Weak<Pool>>>,
    pub(super) name: Arc<str>,
    /// The account of requests made on behalf of no holder; uid = pool id.
    anon: Arc<Account>,
    /// Holder accounts by holder id, registered or not (kept for the pool's
    /// life so that late releases and statistics find them).
    accounts: Mutex<BTreeMap<u64, Arc<Account>>>,
    /// Registered holders, in registration order.
    pub(super) holders: Mutex<Vec<Arc<HolderEntry>>>,
    pub(super) pressure: PressureCounters,
    pub(super) waits: AtomicU64,
    pub(super) wait_timeouts: AtomicU64,
    /// Bytes settled by [`Pool::discharge`].
    discharged: AtomicU64,
    /// Where its events go (its governor's hub; a child's is its parent's).
    pub(super) hub: Arc<Hub>,
    /// Sampled per-class peaks of the pool's own accounts (`stats`).
    class_peaks: ClassPeaks,
    /// Where more budget comes from when the capacity is short (a node
    /// authority's leases: `source.rs`); unset for a fixed capacity.
    pub(super) source: std::sync::OnceLock<Arc<dyn super::source::BudgetSource>>,
}

/// What [`Pool::discharge`] settles: one binding's ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Discharge {
    pub(crate) leased: u64,
    pub(crate) leases: u64,
    pub(crate) quarantined: u64,
}

/// Outcome of one attempt to charge.
pub(super) enum Attempt<'p> {
    Granted,
    /// This pool (the one asked, or an ancestor) had no room.
    NoRoom(&'p Pool),
    Unknown,
}

impl Pool {
    /// A pool without a parent, whose events go to `hub`.
    pub(crate) fn new(name: &str, capacity: u64, hub: Arc<Hub>) -> Result<Arc<Pool>, GovernorError> {
        Self::build(name, capacity, None, hub)
    }

    /// A pool under `parent`.
    pub(crate) fn new_under(
        name: &str,
        capacity: u64,
        parent: Arc<Pool>,
    ) -> Result<Arc<Pool>, GovernorError> {
        let hub = parent.hub.clone();
        Self::build(name, capacity, Some(parent), hub)
    }

    fn build(
        name: &str,
        capacity: u64,
        parent: Option<Arc<Pool>>,
        hub: Arc<Hub>,
    ) -> Result<Arc<Pool>, GovernorError> {
        if capacity > MAX_CAPACITY {
            return Err(GovernorError::CapacityTooLarge { capacity, max: MAX_CAPACITY });
        }
        let id = PoolId(next_uid());
        let lineage: Arc<[PoolId]> = match &parent {
            None => Arc::new([id]),
            Some(p) => std::iter::once(id).chain(p.lineage.iter().copied()).collect(),
        };
        leaks().insert(id.get(), BTreeMap::new());
        let pool = Arc::new(Pool {
            level: Level::new(capacity, parent),
            id,
            lineage,
            children: Mutex::new(Vec::new()),
            name: name.into(),
            anon: Arc::new(Account::new(id.get(), id, None)),
            accounts: Mutex::new(BTreeMap::new()),
            holders: Mutex::new(Vec::new()),
            pressure: PressureCounters::new(),
            waits: AtomicU64::new(0),
            wait_timeouts: AtomicU64::new(0),
            discharged: AtomicU64::new(0),
            hub,
            class_peaks: ClassPeaks::new(),
            source: std::sync::OnceLock::new(),
        });
        if let Some(p) = pool.level.parent() {
            let mut children = lock(&p.children);
            children.retain(|c| c.strong_count() > 0);
            children.push(Arc::downgrade(&pool));
        }
        Ok(pool)
    }

    /// This pool's id.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes it may charge in all (see [`set_capacity`](Self::set_capacity)).
    /// An ancestor's smaller capacity may bind first: a child's capacity
    /// may exceed its parent's.
    pub fn capacity(&self) -> u64 {
        self.level.capacity()
    }

    /// Bytes charged now (grants, leases, quarantine), its descendants'
    /// charges included. Exact.
    #[inline]
    pub fn used(&self) -> u64 {
        self.level.read().0
    }

    /// `(used, capacity)` read together: the pair at one moment, even
    /// while the capacity changes. Exact; lock-free but for waiting out a
    /// capacity change caught between its two stores.
    pub fn used_and_capacity(&self) -> (u64, u64) {
        self.level.read()
    }

    /// `capacity - used` at this level (an ancestor may have less). Exact.
    #[inline]
    pub fn free(&self) -> u64 {
        self.level.free()
    }

    /// Highest `used` ever reached (see [`PoolSnapshot::peak`]).
    pub fn peak(&self) -> u64 {
        self.level.peak()
    }

    /// The pool above this one, if any.
    pub fn parent(&self) -> Option<&Arc<Pool>> {
        self.level.parent()
    }

    /// This pool's id, then each ancestor's, the root's last.
    pub fn lineage(&self) -> &[PoolId] {
        &self.lineage
    }

    /// Ancestors above this pool: 0 for a pool without a parent.
    pub fn depth(&self) -> usize {
        self.lineage.len() - 1
    }

    /// The pools created directly under this one that are still alive, in
    /// creation order. Takes a short lock.
    pub fn children(&self) -> Vec<Arc<Pool>> {
        lock(&self.children).iter().filter_map(Weak::upgrade).collect()
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

    /// One attempt to grant `bytes` at this pool and every ancestor: the
    /// pool's word from this thread's hint, then each ancestor's; a
    /// refusal at an ancestor refunds the levels already charged.
    #[inline(always)]
    pub(super) fn try_grant(
        &self,
        uid: u64,
        bytes: u64,
        class: AllocationClass,
        count_failure: bool,
    ) -> Attempt<'_> {
        let attempt = self
            .with_shard(uid, |s| {
                if !s.core.registered.load(Relaxed) {
                    return Attempt::Unknown;
                }
                let c = s.cells(class);
                match self.level.charge(s.hint.load(Relaxed), false, bytes) {
                    Some(word) => {
                        s.hint.store(word, Relaxed);
                        if let Some(parent) = self.level.parent() {
                            if let Some(short) = self.charge_above(parent, bytes, s) {
                                if count_failure {
                                    s.add(&c.failures, 1);
                                }
                                return Attempt::NoRoom(short);
                            }
                        }
                        // Only a charge that stands counts for the peak.
                        self.level.note_peak(word);
                        s.add(&c.reserved, bytes);
                        s.add(&c.granted, bytes);
                        s.add(&c.grants, 1);
                        Attempt::Granted
                    }
                    None => {
                        if count_failure {
                            s.add(&c.failures, 1);
                        }
                        Attempt::NoRoom(self)
                    }
                }
            })
            .unwrap_or(Attempt::Unknown);
        // After the shard's closure: a listener runs with no shard borrowed.
        if matches!(attempt, Attempt::Granted) && events_wanted() {
            self.observe_grant(uid, bytes, class);
        }
        attempt
    }

    /// Charges `bytes` at `parent` and its ancestors, after this pool
    /// charged them; on a refusal refunds every level charged, this pool's
    /// included, and returns the one that was short.
    #[cold]
    #[inline(never)]
    fn charge_above<'p>(&'p self, parent: &'p Pool, bytes: u64, s: &Shard) -> Option<&'p Pool> {
        let short = parent.charge_chain(bytes).err()?;
        let prev = self.level.refund(bytes);
        s.hint.store(prev.wrapping_sub(bytes), Relaxed);
        Some(short)
    }

    #[cold]
    pub(super) fn unknown_holder(&self, holder: Option<HolderId>) -> GovernorError {
        match holder {
            Some(holder) => GovernorError::UnknownHolder { pool: self.id, holder },
            // The anonymous account always exists.
            None => unreachable!("anonymous account missing"),
        }
    }

    // ----- granting ----------------------------------------------------------

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
        match self.try_grant(self.account_uid(holder), bytes, class, true) {
            Attempt::Granted => Ok(Grant { pool: self, bytes, class, holder }),
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
            Attempt::Granted => Ok(Grant { pool: self, bytes, class, holder }),
            Attempt::Unknown => Err(self.unknown_holder(holder)),
            Attempt::NoRoom(short) => self.reserve_slow(uid, bytes, class, holder, deadline, short),
        }
    }

    #[cold]
    #[inline(never)]
    fn reserve_slow<'p>(
        &'p self,
        uid: u64,
        bytes: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
        deadline: Option<Instant>,
        short: &'p Pool,
    ) -> Result<Grant<'p>, GovernorError> {
        let grant = || Grant { pool: self, bytes, class, holder };
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
            prev = self.level.take(bytes);
            s.hint.store(prev.wrapping_sub(bytes), Relaxed);
        });
        self.level.after_refund(prev, bytes);
        if let Some(parent) = self.level.parent() {
            parent.refund_chain(bytes);
        }
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
        self.observe_quarantine(holder, class, bytes);
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
        self.observe_quarantine(lease.holder, lease.class, bytes);
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

    /// Settles, in one step, every charge a binding of a lost context
    /// still holds in the account of `holder` and `class`: `leased` bytes
    /// in `leases` leases and `quarantined` bytes in `quarantines`
    /// quarantines, as its ledger counted them. The bytes come back to the
    /// pool and every ancestor (waking waiters); the leases' tokens are
    /// ended by their owners with `Lease::settled_elsewhere`, or never.
    /// Called once per binding, by the termination that settles it.
    pub(crate) fn discharge(&self, holder: Option<HolderId>, class: AllocationClass, d: Discharge) {
        self.on_shard(self.account_uid(holder), |s| {
            let c = s.cells(class);
            s.sub(&c.leased, d.leased);
            s.sub(&c.leases, d.leases);
            s.sub(&c.quarantined, d.quarantined);
        });
        self.discharged.fetch_add(d.leased + d.quarantined, Relaxed);
        self.refund(d.leased + d.quarantined);
    }

    /// Bytes settled so far by the terminations of lost or retired
    /// contexts whose bindings charged this pool (live and quarantined
    /// charges together; see [`Settlement`](crate::Settlement)).
    pub fn discharged(&self) -> u64 {
        self.discharged.load(Relaxed)
    }

    // ----- holders -------------------------------------------------------------

    /// Registers a holder: an owner of bytes in this pool that answers
    /// pressure tickets with `callback` (see
    /// [`PressureCallback`](super::PressureCallback)). Dropping the
    /// returned registration unregisters it.
    ///
    /// A holder decides what to give up; the governor never frees anyone's
    /// memory. Here a weights cache evicts its oldest entries when another
    /// binding's allocation does not fit:
    ///
    /// ```
    /// # use memplug_host::{governor::AllocationClass, *};
    /// # use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    /// # let mgr = ProcessMemoryManager::new();
    /// # // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// # let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
    /// # mgr.register_plugin(cpu)?;
    /// # let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    /// # let ctx = mgr.select(cpu0, Requirements::ALLOCATOR_ONLY)?;
    /// use memplug_host::governor::{PressureTicket, Priority};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let pool = mgr.create_pool("cpu0", 8 << 20)?;
    /// let cache: Arc<Mutex<Vec<OwnedAllocation>>> = Arc::default();
    /// let held = cache.clone();
    /// let weights = pool.register_holder("weights", Priority(10), move |t: &PressureTicket| {
    ///     let mut evicted = Vec::new();
    ///     let mut released = 0;
    ///     let mut held = held.lock().unwrap();
    ///     while released < t.bytes_wanted && !held.is_empty() {
    ///         let oldest = held.remove(0);
    ///         released += oldest.charged();
    ///         evicted.push(oldest);
    ///     }
    ///     drop(held);
    ///     drop(evicted); // freed and refunded before the answer, outside the lock
    ///     released // the bytes it gave back (0 is a legal answer)
    /// });
    ///
    /// let w = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(weights.id()))?;
    /// for _ in 0..8 {
    ///     cache.lock().unwrap().push(w.allocate(1 << 20, 4096)?);
    /// }
    /// assert_eq!(pool.free(), 0);
    ///
    /// // A request at a higher priority (no holder: the highest) makes room.
    /// let act = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Activations))?;
    /// let a = act.allocate(2 << 20, 4096)?;
    /// assert_eq!(cache.lock().unwrap().len(), 6); // two experts evicted
    /// assert_eq!(pool.holder_stats(weights.id()).unwrap().pressure.tickets, 1);
    /// # drop(a); cache.lock().unwrap().clear();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
        // Ids grow with every registration in the process, so they order
        // holders of different pools too (the tie-break among equal
        // priorities when a short ancestor asks several pools' holders).
        let entry = Arc::new(HolderEntry::new(core, id.get(), Box::new(callback)));
        lock(&self.holders).push(entry.clone());
        HolderRegistration { pool: self.clone(), entry }
    }

    pub(crate) fn unregister_holder(&self, entry: &Arc<HolderEntry>) {
        entry.core.registered.store(false, Relaxed);
        lock(&self.holders).retain(|e| !Arc::ptr_eq(e, entry));
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
        self.pressure.fill(&mut classes);
        self.class_peaks.sample(&mut classes, self.level.peak());
        let totals = super::stats::total(&classes);
        let (used, capacity) = self.level.read();
        let children = self.children();
        let children_used = children.iter().map(|c| c.used()).fold(0u64, u64::saturating_add);
        PoolSnapshot {
            pool: self.id,
            name: self.name.clone(),
            parent: self.level.parent().map(|p| p.id),
            parent_name: self.level.parent().map(|p| p.name.clone()),
            depth: self.depth(),
            capacity,
            used,
            free: capacity - used,
            peak: self.level.peak(),
            reserved: totals.reserved,
            leased: totals.leased,
            quarantined: totals.quarantined,
            children: children.len(),
            children_used,
            classes,
            pressure: self.pressure.get(),
            waits: self.waits.load(Relaxed),
            wait_timeouts: self.wait_timeouts.load(Relaxed),
            holders: lock(&self.holders).len(),
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

    /// Samples the per-class peaks of the pool and of each account (see
    /// [`stats`](super::stats)), without building a snapshot.
    fn sample_peaks(&self) {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        let cap = self.level.peak();
        let mut pool = self.anon.raw();
        for a in &accounts {
            let raw = a.raw();
            for (r, o) in pool.iter_mut().zip(raw.iter()) {
                r.add(o);
            }
            a.core.peaks.sample(&mut raw.map(RawClass::to_stats), cap);
        }
        self.class_peaks.sample(&mut pool.map(RawClass::to_stats), cap);
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
        core.pressure.fill(&mut classes);
        core.peaks.sample(&mut classes, self.level.peak());
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

impl From<&Pool> for PoolId {
    fn from(p: &Pool) -> PoolId {
        p.id
    }
}

impl From<&Arc<Pool>> for PoolId {
    fn from(p: &Arc<Pool>) -> PoolId {
        p.id
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
            .field("parent", &self.level.parent().map(|p| p.id))
            .field("capacity", &self.capacity())
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
        let hub = Hub::new();
        assert!(matches!(
            Pool::new("x", MAX_CAPACITY + 1, hub.clone()),
            Err(GovernorError::CapacityTooLarge { .. })
        ));
        let p = Pool::new("max", MAX_CAPACITY, hub).unwrap();
        let r = p.try_reserve(MAX_CAPACITY, AllocationClass::Other, None).unwrap();
        assert_eq!(p.used(), MAX_CAPACITY);
        assert!(p.try_reserve(1, AllocationClass::Other, None).is_err());
        drop(r);
        assert_eq!(p.used(), 0);
    }
}
