//! The governor's tokens: a [`Grant`] (provisional, borrows its pool) and a
//! [`Lease`] (committed, plain data), and the table of leases dropped
//! without an end.

use super::error::{GovernorError, Rejected};
use super::pool::Pool;
use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId};
use crate::sync;
use std::collections::BTreeMap;
use std::fmt;
use std::mem::ManuallyDrop;

/// Leases dropped without release or quarantine, per pool, per (account,
/// class): (count, bytes). Process-wide because a dropped [`Lease`] carries
/// no reference to its pool (that is what keeps leases free of reference
/// counting); leaks are bugs, so a lock here costs nothing that matters.
/// Plain `std` even under loom: not part of any protocol loom checks.
pub(super) type LeakTable = BTreeMap<u64, BTreeMap<(u64, usize), (u64, u64)>>;
static LEAKS: std::sync::Mutex<LeakTable> = std::sync::Mutex::new(BTreeMap::new());

pub(super) fn leaks() -> std::sync::MutexGuard<'static, LeakTable> {
    sync::lock_std(&LEAKS)
}

/// A provisional grant: bytes charged to the pool before the physical
/// memory exists (invariant 2). Dropping it returns the bytes at once;
/// [`commit`](Self::commit) turns it into a [`Lease`] for the bytes
/// actually obtained.
///
/// It borrows its pool: no reference count is touched per grant.
///
/// Thread-safety: `Send + Sync`; may be committed or dropped on any thread.
#[must_use = "dropping a grant returns its bytes at once"]
pub struct Grant<'p> {
    pub(super) pool: &'p Pool,
    pub(super) bytes: u64,
    /// The account charged: the holder's id, or the pool's for no holder
    /// (one id space), so that commit and drop need not derive it again.
    pub(super) account: u64,
    pub(super) class: AllocationClass,
}

/// The account of `holder` in pool `pool`: the holder's id, or the pool's
/// own for the anonymous account (one id space). The one place of the
/// mapping, with [`holder_of`] its inverse.
#[inline(always)]
pub(super) fn account_of(pool: PoolId, holder: Option<HolderId>) -> u64 {
    holder.map_or(pool.get(), |h| h.get())
}

/// The holder of account `account` of pool `pool` (`None`: anonymous).
#[inline]
pub(super) fn holder_of(pool: PoolId, account: u64) -> Option<HolderId> {
    if account == pool.get() {
        None
    } else {
        std::num::NonZeroU64::new(account).map(HolderId)
    }
}

impl<'p> Grant<'p> {
    /// Bytes granted.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Class charged.
    pub fn class(&self) -> AllocationClass {
        self.class
    }

    /// Holder charged (`None`: the pool's anonymous account).
    pub fn holder(&self) -> Option<HolderId> {
        holder_of(self.pool.id(), self.account)
    }

    /// The pool that granted it.
    pub fn pool(&self) -> &'p Pool {
        self.pool
    }

    /// Takes the fields without running `Drop`.
    #[inline(always)]
    fn disarm(self) -> (&'p Pool, u64, AllocationClass, u64) {
        let me = ManuallyDrop::new(self);
        (me.pool, me.bytes, me.class, me.account)
    }

    /// Moves the grant's statistics to the lease side and refunds what was
    /// not used; the pool already holds `max(bytes, actual)` for it.
    #[inline(always)]
    fn settle(self, actual: u64, new_lease: bool) -> Lease {
        let (pool, bytes, class, account) = self.disarm();
        pool.on_shard(account, move |s| {
            let c = s.cells(class);
            s.sub(&c.reserved, bytes);
            s.add(&c.leased, actual);
            if new_lease {
                s.add(&c.leases, 1);
            }
        });
        if actual < bytes {
            pool.refund(bytes - actual);
        }
        Lease { pool: pool.id(), account, class: class.index(), bytes: actual }
    }

    /// Charges `actual - bytes` more (the mechanism obtained more than was
    /// granted, e.g. granularity rounding) at the pool and every ancestor;
    /// on refusal the levels already charged are refunded and the grant
    /// comes back unchanged with the reason.
    #[cold]
    #[inline(never)]
    fn cover(self, actual: u64) -> Result<Self, Rejected<Self>> {
        let extra = actual - self.bytes;
        let uid = self.account;
        if let Err(short) = self.pool.charge_chain(extra) {
            self.pool.on_shard(uid, |s| s.add(&s.cells(self.class).failures, 1));
            let error = self.pool.out_of_budget(short, extra, self.class, self.holder());
            return Err(Rejected { value: self, error });
        }
        self.pool.on_shard(uid, |s| s.add(&s.cells(self.class).granted, extra));
        if crate::events::events_wanted() {
            self.pool.observe_grant(uid, extra, self.class);
        }
        Ok(self)
    }

    /// Turns the grant into a lease of `actual` bytes — the bytes the
    /// mechanism actually mapped (invariant 2).
    ///
    /// `actual < bytes`: the remainder is refunded at once.
    /// `actual > bytes`: the difference is charged if it fits now, at the
    /// pool and every ancestor (no tickets, no waiting); otherwise the
    /// grant comes back in the error, unchanged, so the caller can free
    /// what it mapped and then drop it. No lock on the fast path.
    #[inline(always)]
    pub fn commit(self, actual: u64) -> Result<Lease, Rejected<Self>> {
        let me = if actual > self.bytes { self.cover(actual)? } else { self };
        Ok(me.settle(actual, true))
    }

    /// Commits `actual` bytes into an existing lease: a virtual region that
    /// grew (ARCHITECTURE.md §4, grow transaction). Same rules as
    /// [`commit`](Self::commit); additionally the lease must come from the
    /// same pool and have the same class and holder, else the grant
    /// comes back with [`GovernorError::WrongPool`],
    /// [`GovernorError::ClassMismatch`] or [`GovernorError::HolderMismatch`]
    /// and the lease is unchanged.
    pub fn commit_into(self, lease: &mut Lease, actual: u64) -> Result<(), Rejected<Self>> {
        let error = if lease.pool != self.pool.id() {
            Some(GovernorError::WrongPool { pool: self.pool.id(), lease_pool: lease.pool })
        } else if lease.class != self.class.index() {
            Some(GovernorError::ClassMismatch { lease: lease.class(), grant: self.class })
        } else if lease.account != self.account {
            Some(GovernorError::HolderMismatch { lease: lease.holder(), grant: self.holder() })
        } else {
            None
        };
        if let Some(error) = error {
            return Err(Rejected { value: self, error });
        }
        let me = if actual > self.bytes { self.cover(actual)? } else { self };
        // Settled as a lease of its own, whose bytes join `lease`.
        let _ = me.settle(actual, false).disarm();
        // Every lease's bytes are charged, so the sum stays <= capacity < 2^63.
        lease.bytes += actual;
        Ok(())
    }
}

impl Drop for Grant<'_> {
    #[inline]
    fn drop(&mut self) {
        let (pool, bytes, class) = (self.pool, self.bytes, self.class);
        pool.on_shard(self.account, move |s| s.sub(&s.cells(class).reserved, bytes));
        pool.refund(bytes);
    }
}

impl fmt::Debug for Grant<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("pool", &self.pool.id())
            .field("bytes", &self.bytes)
            .field("class", &self.class)
            .field("holder", &self.holder())
            .finish()
    }
}

/// A committed charge: bytes that are physically mapped.
///
/// A plain token (pool id, holder, class, bytes; no reference to the pool).
/// It ends only through [`Pool::release`] (after the physical free has
/// completed) or [`Pool::quarantine`] (the free could not be completed).
///
/// Dropping a lease without either is a bug in the caller and is treated
/// conservatively: its bytes stay charged (and counted in `leased`) for the
/// pool's life, and the drop is recorded in `leaked_leases` /
/// `leaked_bytes` of the pool's and the holder's statistics. Nothing is
/// refunded, because nothing proves the memory was freed.
///
/// Thread-safety: `Send + Sync`; may be moved to and ended on any thread.
#[must_use = "a lease ends only with Pool::release or Pool::quarantine; dropping it leaks its charge"]
#[derive(PartialEq, Eq)]
pub struct Lease {
    pub(super) pool: PoolId,
    /// The account charged (see [`Grant`]'s): release needs no holder.
    pub(super) account: u64,
    /// The class's index, a whole word: a token without padding moves as
    /// four words, where a byte and its padding move piece by piece.
    pub(super) class: usize,
    pub(super) bytes: u64,
}

impl Lease {
    /// Bytes charged now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Class charged.
    pub fn class(&self) -> AllocationClass {
        AllocationClass::ALL[self.class]
    }

    /// Holder charged (`None`: the pool's anonymous account).
    pub fn holder(&self) -> Option<HolderId> {
        holder_of(self.pool, self.account)
    }

    /// The pool that granted it.
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// Ends the token without touching its pool: for a lease whose charge
    /// is settled elsewhere, in one step with every other lease of its
    /// binding ([`Pool::discharge`], when a lost context terminates). Not
    /// a leak, so not recorded as one.
    #[inline]
    pub(crate) fn settled_elsewhere(self) {
        let _ = self.disarm();
    }

    /// Keeps only the bytes of a lease whose pool, holder and class its
    /// keeper knows already (a binding's allocation keeps 8 bytes instead
    /// of the token's 32); [`Lease::rejoin`] makes it whole again. Not a
    /// leak: the keeper must rejoin it and end it (release, quarantine or
    /// settled elsewhere).
    #[inline(always)]
    pub(crate) fn split(self) -> u64 {
        self.disarm().2
    }

    /// The lease [`split`](Self::split) took apart, from the same pool,
    /// holder and class and the bytes it returned.
    #[inline(always)]
    pub(crate) fn rejoin(
        pool: PoolId,
        holder: Option<HolderId>,
        class: AllocationClass,
        bytes: u64,
    ) -> Lease {
        Lease { pool, account: account_of(pool, holder), class: class.index(), bytes }
    }

    /// Takes (account, class index, bytes) without running `Drop`.
    #[inline(always)]
    pub(super) fn disarm(self) -> (u64, usize, u64) {
        let me = ManuallyDrop::new(self);
        (me.account, me.class, me.bytes)
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.pool)
            .field("holder", &self.holder())
            .field("class", &self.class())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let account = self.account;
        // A pool already gone has no figures left to report the leak in.
        if let Some(table) = leaks().get_mut(&self.pool.get()) {
            let cell = table.entry((account, self.class)).or_insert((0, 0));
            cell.0 += 1;
            cell.1 += self.bytes;
        }
    }
}
