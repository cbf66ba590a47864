//! Accounts and their per-thread statistics shards.
//!
//! An *account* is where charges are attributed: each pool has one
//! anonymous account (requests made on behalf of no holder) and one per
//! holder ever registered. An account's per-class figures are kept in
//! *shards*: each thread that touches the account owns one shard and is its
//! only writer, so updating a figure is a plain load and store — no locked
//! read-modify-write instruction, which is what keeps the governor's fast
//! path within its budget (ARCHITECTURE.md §6). A figure's value is the wrapping sum
//! of its shards: one shard may go "negative" (a lease committed on thread A
//! and released on thread B), the sum never does.
//!
//! Ownership: the first time a thread touches an account it takes a shard
//! (adopting one a finished thread left behind, or creating one) under the
//! account's lock, and caches it in a thread-local table; from then on the
//! lookup is a thread-local read and two compares. When the thread ends,
//! its thread-local destructor marks its shards unowned (`Release`); an
//! adopter takes one with an `Acquire` compare-exchange, so it continues
//! from the last values written. A thread whose thread-locals are already
//! destroyed uses the account's spare shard, one writer at a time under the
//! account's spare lock.

use super::holder::PressureCounters;
use super::stats::{ClassPeaks, ClassStats};
use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId, Priority};
use crate::sync::{lock, thread_local, AtomicBool, AtomicU64, Mutex};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

/// What the pool knows about a holder account.
pub(crate) struct HolderMeta {
    pub id: HolderId,
    pub name: Arc<str>,
    pub priority: Priority,
}

/// The identity part of an account, shared with its shards.
pub(crate) struct AccountCore {
    /// The holder's id, or the pool's id for the anonymous account.
    pub uid: u64,
    pub pool: PoolId,
    pub holder: Option<HolderMeta>,
    /// A holder account stops granting when its registration is dropped.
    pub registered: AtomicBool,
    /// False once the pool (and so this account) is gone: lets threads
    /// drop their cached shards of dead pools.
    pub alive: AtomicBool,
    /// Tickets received (holder accounts only).
    pub pressure: PressureCounters,
    /// Sampled per-class peaks (holder accounts; see `stats`).
    pub peaks: ClassPeaks,
}

/// One class's counters in one shard. One cache line: eight counters, so
/// a ninth belongs elsewhere (or is derived, as released bytes are).
#[repr(align(64))]
pub(crate) struct ClassCells {
    pub reserved: AtomicU64,
    /// Bytes ever charged (grants, and extra bytes a commit covered),
    /// cumulative. What was given back is this minus what is charged now.
    pub granted: AtomicU64,
    pub leased: AtomicU64,
    pub leases: AtomicU64,
    pub grants: AtomicU64,
    pub failures: AtomicU64,
    pub quarantined: AtomicU64,
    pub quarantines: AtomicU64,
}

impl ClassCells {
    fn new() -> Self {
        ClassCells {
            reserved: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            leased: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            quarantined: AtomicU64::new(0),
            quarantines: AtomicU64::new(0),
        }
    }
}

/// Wrapping sums of one class's counters over shards.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawClass {
    pub reserved: u64,
    pub granted: u64,
    pub leased: u64,
    pub leases: u64,
    pub grants: u64,
    pub failures: u64,
    pub quarantined: u64,
    pub quarantines: u64,
}

impl RawClass {
    fn add_cells(&mut self, c: &ClassCells) {
        self.reserved = self.reserved.wrapping_add(c.reserved.load(Relaxed));
        self.granted = self.granted.wrapping_add(c.granted.load(Relaxed));
        self.leased = self.leased.wrapping_add(c.leased.load(Relaxed));
        self.leases = self.leases.wrapping_add(c.leases.load(Relaxed));
        self.grants = self.grants.wrapping_add(c.grants.load(Relaxed));
        self.failures = self.failures.wrapping_add(c.failures.load(Relaxed));
        self.quarantined = self.quarantined.wrapping_add(c.quarantined.load(Relaxed));
        self.quarantines = self.quarantines.wrapping_add(c.quarantines.load(Relaxed));
    }

    pub fn add(&mut self, o: &RawClass) {
        self.reserved = self.reserved.wrapping_add(o.reserved);
        self.granted = self.granted.wrapping_add(o.granted);
        self.leased = self.leased.wrapping_add(o.leased);
        self.leases = self.leases.wrapping_add(o.leases);
        self.grants = self.grants.wrapping_add(o.grants);
        self.failures = self.failures.wrapping_add(o.failures);
        self.quarantined = self.quarantined.wrapping_add(o.quarantined);
        self.quarantines = self.quarantines.wrapping_add(o.quarantines);
    }

    /// Clamps each wrapping sum at zero (a transiently "negative" sum can
    /// only be seen while another thread is mid-operation).
    pub fn to_stats(self) -> ClassStats {
        fn clamp(v: u64) -> u64 {
            if (v as i64) < 0 {
                0
            } else {
                v
            }
        }
        // Every byte charged is still charged or was given back: the
        // one place released bytes come from.
        let charged = self.reserved.wrapping_add(self.leased).wrapping_add(self.quarantined);
        ClassStats {
            reserved: clamp(self.reserved),
            leased: clamp(self.leased),
            quarantined: clamp(self.quarantined),
            leases: clamp(self.leases),
            grants: clamp(self.grants),
            failures: clamp(self.failures),
            quarantines: clamp(self.quarantines),
            granted_bytes: clamp(self.granted),
            released_bytes: clamp(self.granted.wrapping_sub(charged)),
            ..ClassStats::default()
        }
    }
}

/// One thread's counters for one account. Exactly one writer at a time:
/// the owning thread, or whoever holds the account's spare lock.
#[repr(align(64))]
pub(crate) struct Shard {
    cells: [ClassCells; AllocationClass::COUNT],
    /// Copy of `core.pool`, checked on every cached lookup.
    pool: PoolId,
    /// The pool's capacity word as this thread last saw it: the expected
    /// value of its next compare-exchange, so that an uncontended grant
    /// needs no separate load (and a contended one no extra cache-line
    /// transfer). Only a guess: refusals are always decided on fresh reads.
    pub hint: AtomicU64,
    pub core: Arc<AccountCore>,
    /// Held by a live thread.
    owned: AtomicBool,
}

impl Shard {
    fn new(core: Arc<AccountCore>, owned: bool) -> Self {
        Shard {
            cells: std::array::from_fn(|_| ClassCells::new()),
            pool: core.pool,
            hint: AtomicU64::new(0),
            core,
            owned: AtomicBool::new(owned),
        }
    }

    #[inline(always)]
    pub fn cells(&self, class: AllocationClass) -> &ClassCells {
        &self.cells[class.index()]
    }

    /// [`cells`](Self::cells) by class index, which a lease keeps: only
    /// ever written from [`AllocationClass::index`], so in bounds (no
    /// check on the release path).
    #[inline(always)]
    pub fn cells_at(&self, class: usize) -> &ClassCells {
        debug_assert!(class < AllocationClass::COUNT);
        // SAFETY: `class` is some `AllocationClass::index()` (see above).
        unsafe { self.cells.get_unchecked(class) }
    }

    /// Adds `delta` (two's complement for a decrease) to `cell`. The caller
    /// is the shard's only writer, so a load and a store suffice — no
    /// locked instruction; readers see the old or the new value, both valid.
    #[inline(always)]
    pub fn add(&self, cell: &AtomicU64, delta: u64) {
        cell.store(cell.load(Relaxed).wrapping_add(delta), Relaxed);
    }

    #[inline(always)]
    pub fn sub(&self, cell: &AtomicU64, delta: u64) {
        self.add(cell, delta.wrapping_neg());
    }
}

/// An account: identity plus every shard ever handed out for it.
pub(crate) struct Account {
    pub core: Arc<AccountCore>,
    shards: Mutex<Vec<Arc<Shard>>>,
    /// For threads that can no longer use thread-locals (being torn down):
    /// written only under `spare_lock`.
    spare: Shard,
    spare_lock: Mutex<()>,
}

impl Account {
    pub fn new(uid: u64, pool: PoolId, holder: Option<HolderMeta>) -> Self {
        let core = Arc::new(AccountCore {
            uid,
            pool,
            holder,
            registered: AtomicBool::new(true),
            alive: AtomicBool::new(true),
            pressure: PressureCounters::new(),
            peaks: ClassPeaks::new(),
        });
        Account {
            spare: Shard::new(core.clone(), false),
            spare_lock: Mutex::new(()),
            shards: Mutex::new(Vec::new()),
            core,
        }
    }

    /// Adopts a shard a finished thread left, or makes a new one.
    fn take_shard(&self) -> Arc<Shard> {
        let mut shards = lock(&self.shards);
        for s in shards.iter() {
            if !s.owned.load(Relaxed) && s.owned.compare_exchange(false, true, Acquire, Relaxed).is_ok() {
                return s.clone();
            }
        }
        let s = Arc::new(Shard::new(self.core.clone(), true));
        shards.push(s.clone());
        s
    }

    /// Wrapping sums over every shard, per class.
    pub fn raw(&self) -> [RawClass; AllocationClass::COUNT] {
        let mut out = [RawClass::default(); AllocationClass::COUNT];
        let shards = lock(&self.shards);
        for s in shards.iter().map(|s| &**s).chain(std::iter::once(&self.spare)) {
            for (o, c) in out.iter_mut().zip(s.cells.iter()) {
                o.add_cells(c);
            }
        }
        out
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        self.core.alive.store(false, Relaxed);
    }
}

/// Direct-mapped thread-local cache slots (by account uid).
const SLOTS: usize = 16;
/// Past this many owned shards, a thread drops the ones of dead pools.
const PRUNE_AT: usize = 32;

/// The hot part: a direct-mapped cache by account uid, as two arrays
/// (uids, 0 for an empty slot; and this thread's shard of each) so that a
/// slot's word is one scaled index away, with no multiply by an entry's
/// size. No destructor, so reaching it costs no thread-local state check.
/// Invariant: a non-empty slot points into an `Arc<Shard>` held by this
/// thread's [`Owned`]; a slot is emptied before its `Arc` leaves `Owned`.
struct Cache {
    uids: [Cell<u64>; SLOTS],
    shards: [Cell<*const Shard>; SLOTS],
}

/// The shards this thread owns. Its destructor (thread exit) empties the
/// cache, then hands the shards back for adoption.
struct Owned(RefCell<Vec<Arc<Shard>>>);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            for uid in &c.uids {
                uid.set(0);
            }
        });
        for s in self.0.get_mut().drain(..) {
            s.owned.store(false, Release);
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    static CACHE: Cache = const {
        Cache {
            uids: [const { Cell::new(0) }; SLOTS],
            shards: [const { Cell::new(std::ptr::null()) }; SLOTS],
        }
    };
    static OWNED: Owned = const { Owned(RefCell::new(Vec::new())) };
}

#[cfg(loom)]
thread_local! {
    static CACHE: Cache = Cache {
        uids: std::array::from_fn(|_| Cell::new(0)),
        shards: std::array::from_fn(|_| Cell::new(std::ptr::null())),
    };
    static OWNED: Owned = Owned(RefCell::new(Vec::new()));
}

#[inline(always)]
fn slot(uid: u64) -> usize {
    (uid as usize) % SLOTS
}

/// Runs `f` on this thread's cached shard of account `uid` in `pool`, or
/// hands `f` back when there is none cached (then see [`with_account`]).
#[inline(always)]
pub(crate) fn with_cached<R, F: FnOnce(&Shard) -> R>(uid: u64, pool: PoolId, f: F) -> Result<R, F> {
    let p = CACHE
        .try_with(|c| {
            let i = slot(uid);
            if c.uids[i].get() == uid {
                Some(c.shards[i].get())
            } else {
                None
            }
        })
        .ok()
        .flatten();
    match p {
        Some(p) => {
            // SAFETY: the entry is not empty (uids are never 0), so `p`
            // points into an `Arc<Shard>` this thread's `Owned` holds (see
            // `Cache`). Arcs leave `Owned` only in `acquire` (this thread,
            // never while `f` runs: `f` only updates counters) and in its
            // destructor (thread exit, which empties the cache first), so
            // the shard outlives this call.
            let s = unsafe { &*p };
            if s.pool == pool {
                Ok(f(s))
            } else {
                Err(f)
            }
        }
        None => Err(f),
    }
}

/// Runs `f` on this thread's shard of `account`, taking one first if the
/// thread has none; on a thread whose thread-locals are gone, on the
/// account's spare shard under its lock.
#[cold]
pub(crate) fn with_account<R>(account: &Account, f: impl FnOnce(&Shard) -> R) -> R {
    match acquire(account) {
        Some(shard) => f(&shard),
        None => {
            let _one_writer = lock(&account.spare_lock);
            f(&account.spare)
        }
    }
}

fn acquire(account: &Account) -> Option<Arc<Shard>> {
    let uid = account.core.uid;
    OWNED
        .try_with(|owned| {
            let mut owned = owned.0.try_borrow_mut().ok()?;
            let found = owned.iter().find(|s| Arc::ptr_eq(&s.core, &account.core)).cloned();
            let shard = match found {
                Some(s) => s,
                None => {
                    if owned.len() >= PRUNE_AT {
                        // Drop the shards of dead pools: empty their cache
                        // entries first, then release them.
                        let _ = CACHE.try_with(|c| {
                            for (uid, shard) in c.uids.iter().zip(&c.shards) {
                                if uid.get() == 0 {
                                    continue; // its pointer may be stale
                                }
                                // SAFETY: a non-empty entry, as in
                                // `with_cached`; nothing has left `owned` yet.
                                let shard = unsafe { &*shard.get() };
                                if !shard.core.alive.load(Relaxed) {
                                    uid.set(0);
                                }
                            }
                        });
                        owned.retain(|s| {
                            let alive = s.core.alive.load(Relaxed);
                            if !alive {
                                s.owned.store(false, Release);
                            }
                            alive
                        });
                    }
                    let s = account.take_shard();
                    owned.push(s.clone());
                    s
                }
            };
            CACHE
                .try_with(|c| {
                    let i = slot(uid);
                    c.shards[i].set(Arc::as_ptr(&shard));
                    c.uids[i].set(uid);
                })
                .ok()?;
            Some(shard)
        })
        .ok()
        .flatten()
}
