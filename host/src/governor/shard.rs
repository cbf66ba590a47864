//! Accounts and their per-thread statistics shards.
//!
//! An *account* is where charges are attributed: each pool has one
//! anonymous account (requests made on behalf of no holder) and one per
//! holder ever registered. An account's per-class figures are kept in
//! *shards*: each thread that touches the account owns one shard and is its
//! only writer, so updating a figure is a plain load and store — no locked
//! read-modify-write instruction, which is what keeps the governor's fast
//! path within its budget (DESIGN §6). A figure's value is the wrapping sum
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
//! destroyed uses the account's shared shard, updated with atomic
//! read-modify-writes instead.

use super::class::AllocationClass;
use super::holder::PressureCounters;
use super::ids::{HolderId, PoolId, Priority};
use super::stats::ClassStats;
use super::sync::{lock, thread_local, AtomicBool, AtomicU64, Mutex};
use std::cell::RefCell;
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
}

/// One class's counters in one shard. One cache line.
#[repr(align(64))]
pub(crate) struct ClassCells {
    pub reserved: AtomicU64,
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
        self.leased = self.leased.wrapping_add(c.leased.load(Relaxed));
        self.leases = self.leases.wrapping_add(c.leases.load(Relaxed));
        self.grants = self.grants.wrapping_add(c.grants.load(Relaxed));
        self.failures = self.failures.wrapping_add(c.failures.load(Relaxed));
        self.quarantined = self.quarantined.wrapping_add(c.quarantined.load(Relaxed));
        self.quarantines = self.quarantines.wrapping_add(c.quarantines.load(Relaxed));
    }

    pub fn add(&mut self, o: &RawClass) {
        self.reserved = self.reserved.wrapping_add(o.reserved);
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
        ClassStats {
            reserved: clamp(self.reserved),
            leased: clamp(self.leased),
            quarantined: clamp(self.quarantined),
            leases: clamp(self.leases),
            grants: clamp(self.grants),
            failures: clamp(self.failures),
            quarantines: clamp(self.quarantines),
            leaked_leases: 0,
            leaked_bytes: 0,
        }
    }
}

/// One thread's counters for one account.
#[repr(align(64))]
pub(crate) struct Shard {
    cells: [ClassCells; AllocationClass::COUNT],
    pub core: Arc<AccountCore>,
    /// Held by a live thread (exclusive shards only).
    owned: AtomicBool,
    /// One writer at a time (plain load/store) or any number (atomic RMW).
    exclusive: bool,
}

impl Shard {
    fn new(core: Arc<AccountCore>, exclusive: bool) -> Self {
        Shard {
            cells: std::array::from_fn(|_| ClassCells::new()),
            core,
            owned: AtomicBool::new(exclusive),
            exclusive,
        }
    }

    #[inline(always)]
    pub fn cells(&self, class: AllocationClass) -> &ClassCells {
        &self.cells[class.index()]
    }

    /// Adds `delta` (two's complement for a decrease) to `cell`. For an
    /// exclusive shard the caller is its only writer, so a load and a store
    /// suffice; readers see either value, both valid.
    #[inline(always)]
    pub fn add(&self, cell: &AtomicU64, delta: u64) {
        if self.exclusive {
            cell.store(cell.load(Relaxed).wrapping_add(delta), Relaxed);
        } else {
            cell.fetch_add(delta, Relaxed);
        }
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
    /// For threads that can no longer use thread-locals (being torn down).
    shared: Arc<Shard>,
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
        });
        Account {
            shared: Arc::new(Shard::new(core.clone(), false)),
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
        for s in shards.iter().chain(std::iter::once(&self.shared)) {
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

struct ThreadShards {
    cache: RefCell<[Option<Arc<Shard>>; SLOTS]>,
    owned: RefCell<Vec<Arc<Shard>>>,
}

impl Drop for ThreadShards {
    fn drop(&mut self) {
        for s in self.owned.get_mut().drain(..) {
            s.owned.store(false, Release);
        }
    }
}

thread_local! {
    static THREAD_SHARDS: ThreadShards = ThreadShards {
        cache: RefCell::new(std::array::from_fn(|_| None)),
        owned: RefCell::new(Vec::new()),
    };
}

#[inline(always)]
fn slot(uid: u64) -> usize {
    (uid as usize) % SLOTS
}

/// Runs `f` on this thread's cached shard of account `uid` in `pool`, or
/// hands `f` back when there is none cached (then see [`acquire`]).
#[inline(always)]
pub(crate) fn with_cached<R, F: FnOnce(&Shard) -> R>(uid: u64, pool: PoolId, f: F) -> Result<R, F> {
    let mut f = Some(f);
    let hit = THREAD_SHARDS.try_with(|t| {
        let cache = t.cache.try_borrow().ok()?;
        match &cache[slot(uid)] {
            Some(s) if s.core.uid == uid && s.core.pool == pool => f.take().map(|f| f(s)),
            _ => None,
        }
    });
    match (hit, f) {
        (Ok(Some(r)), _) => Ok(r),
        (_, Some(f)) => Err(f),
        // `f` was taken only on the hit path.
        (_, None) => unreachable!("shard closure consumed without a result"),
    }
}

/// This thread's shard of `account`: takes one if the thread has none,
/// caches it; falls back to the shared shard when thread-locals are gone.
#[cold]
pub(crate) fn acquire(account: &Account) -> Arc<Shard> {
    let uid = account.core.uid;
    THREAD_SHARDS
        .try_with(|t| {
            let mut owned = t.owned.try_borrow_mut().ok()?;
            let mut cache = t.cache.try_borrow_mut().ok()?;
            let found = owned
                .iter()
                .find(|s| Arc::ptr_eq(&s.core, &account.core))
                .cloned();
            let shard = match found {
                Some(s) => s,
                None => {
                    if owned.len() >= PRUNE_AT {
                        owned.retain(|s| {
                            let alive = s.core.alive.load(Relaxed);
                            if !alive {
                                s.owned.store(false, Release);
                            }
                            alive
                        });
                        for c in cache.iter_mut() {
                            if c.as_ref().is_some_and(|s| !s.core.alive.load(Relaxed)) {
                                *c = None;
                            }
                        }
                    }
                    let s = account.take_shard();
                    owned.push(s.clone());
                    s
                }
            };
            cache[slot(uid)] = Some(shard.clone());
            Some(shard)
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| account.shared.clone())
}
