//! Pools: the pool itself, its identity and figures, its accounts and the
//! charge of one grant; granting (with pressure and waiting) is in
//! `reserve.rs`, ending leases in `leases.rs`, holders in `holders.rs`,
//! statistics in `snapshot.rs`. The capacity word is in `level.rs`, the
//! tree of pools (ancestors charged with every charge, pressure under the
//! short pool, capacity changes) in `tree.rs`, the tokens in `grant.rs`.

use super::error::{GovernorError, Rejected};
use super::grant::{leaks, Grant, Lease};
use super::holder::{HolderEntry, HolderRegistration, PressureCounters, PressureTicket};
use super::level::{Level, MAX_CAPACITY};
use super::shard::{self, Account, AccountCore, HolderMeta, RawClass, Shard};
use super::stats::{ClassPeaks, ClassStats, HolderStats, PoolSnapshot};
use super::tree::{ask_holders, Request};
use crate::events::{events_wanted, Hub};
use crate::ids::AllocationClass;
use crate::ids::{next_uid, HolderId, PoolId, Priority};
use crate::sync::{lock, AtomicU64, Mutex};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

#[cfg(test)]
use super::level::{BYTES, WAITERS};

mod holders;
mod leases;
mod reserve;
mod snapshot;

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
        super::grant::account_of(self.id, holder)
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
    pub(super) fn with_shard<R>(&self, uid: u64, f: impl FnOnce(&Shard) -> R) -> Result<R, ()> {
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
        // `move` closures here and on every fast path: a closure that
        // borrows its captures keeps them in memory, stored on every call
        // for the out-of-line fallback of `with_shard`.
        let attempt = self
            .with_shard(uid, move |s| {
                if !s.core.registered.load(Relaxed) {
                    return Attempt::Unknown;
                }
                let c = s.cells(class);
                match self.level.charge(s.hint.load(Relaxed), false, bytes) {
                    Some(word) => {
                        s.hint.store(word, Relaxed);
                        if let Some(parent) = self.level.parent() {
                            if let Some(short) = self.charge_above(parent, bytes, s) {
                                return Self::refused(short, s, class, count_failure);
                            }
                        }
                        // Only a charge that stands counts for the peak.
                        self.level.note_peak(word);
                        s.add(&c.reserved, bytes);
                        s.add(&c.granted, bytes);
                        s.add(&c.grants, 1);
                        Attempt::Granted
                    }
                    None => Self::refused(self, s, class, count_failure),
                }
            })
            .unwrap_or(Attempt::Unknown);
        // After the shard's closure: a listener runs with no shard borrowed.
        if matches!(attempt, Attempt::Granted) && events_wanted() {
            self.observe_grant(uid, bytes, class);
        }
        attempt
    }

    /// A refusal's count, out of line: merged with the grant's counters, it
    /// would cost the granted path a computed offset and a test.
    #[cold]
    #[inline(never)]
    fn refused<'p>(short: &'p Pool, s: &Shard, class: AllocationClass, count: bool) -> Attempt<'p> {
        if count {
            s.add(&s.cells(class).failures, 1);
        }
        Attempt::NoRoom(short)
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
