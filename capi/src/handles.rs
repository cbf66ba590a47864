//! Generational handles and the lock-free slot tables behind them.
//!
//! Every object the C API hands out is named by a 64-bit value:
//!
//! ```text
//!  63    60 59        50 49                28 27                 0
//! +--------+------------+--------------------+--------------------+
//! |  kind  |  manager   |     generation     |       index        |
//! +--------+------------+--------------------+--------------------+
//! ```
//!
//! * `kind` (4 bits, never 0) says what the handle names, so a pool handle
//!   passed where a binding is expected is refused;
//! * `manager` (10 bits) is the slot of the owning manager: a handle given
//!   to another manager's call is refused as `WRONG_MANAGER`;
//! * `index` (28 bits) is a slot of the manager's table of that kind;
//! * `generation` (22 bits, never 0) must equal the slot's: a freed handle
//!   is `STALE_HANDLE`, a made-up one `INVALID_HANDLE`.
//!
//! Generations only grow. A slot whose generation would wrap is retired
//! for good (never reissued), so a stale handle can never name a newer
//! object. The zero handle is never issued.
//!
//! # Tables
//!
//! A [`SlotTable`] is a segmented array of slots whose addresses never move
//! (chunks of 64, 128, 256... slots, allocated on first use), so a lookup is
//! two loads and never takes a lock. Each slot has one state word:
//!
//! ```text
//!  63           32 31   30     29                 0
//! +---------------+----+------+--------------------+
//! |  generation   |OCC |DYING |      readers       |
//! +---------------+----+------+--------------------+
//! ```
//!
//! * insert: the inserting thread owns a free index, writes the value, then
//!   publishes `OCC` with a release store (no read-modify-write);
//! * pin (shared use): a compare-exchange adds a reader while `OCC`, not
//!   `DYING` and the generation matches; unpin subtracts it;
//! * take / remove: a compare-exchange from `OCC` (no readers) to free with
//!   the next generation; exactly one of two racing frees wins, the other
//!   sees a stale handle. With readers, remove marks `DYING` and the last
//!   reader drops the value.
//!
//! Free indices are cached per thread (refilled from and spilled to a
//! mutex-guarded list in batches), so an insert + take pair costs one
//! compare-exchange and no lock.
//!
//! Tables are never freed: they belong to a manager *slot*, and a manager
//! created later in the same slot reuses them, generations included. So a
//! handle of a destroyed manager stays stale forever.

use crate::error::Error;
use crate::status::MemplugHostStatus as S;
use std::cell::{RefCell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};
use std::sync::{Mutex, OnceLock};

const INDEX_BITS: u32 = 28;
const GEN_BITS: u32 = 22;
const MANAGER_BITS: u32 = 10;
const GEN_SHIFT: u32 = INDEX_BITS;
const MANAGER_SHIFT: u32 = GEN_SHIFT + GEN_BITS;
const KIND_SHIFT: u32 = MANAGER_SHIFT + MANAGER_BITS;

/// Managers alive at once.
pub(crate) const MAX_MANAGERS: u32 = 1 << MANAGER_BITS;
/// Largest slot index of a table.
pub(crate) const MAX_INDEX: u32 = (1 << INDEX_BITS) - 1;
/// Largest generation; a slot that reaches it is retired after its last use.
const MAX_GEN: u32 = (1 << GEN_BITS) - 1;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Manager = 1,
    Mechanism = 2,
    Pool = 3,
    Holder = 4,
    Binding = 5,
    Allocation = 6,
    Region = 7,
    Prefix = 8,
    Stream = 9,
    Fence = 10,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Manager => "manager",
            Kind::Mechanism => "mechanism",
            Kind::Pool => "pool",
            Kind::Holder => "holder",
            Kind::Binding => "binding",
            Kind::Allocation => "allocation",
            Kind::Region => "region",
            Kind::Prefix => "shared prefix",
            Kind::Stream => "stream",
            Kind::Fence => "fence",
        }
    }
}

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Raw {
    pub kind: u8,
    pub manager: u32,
    pub gen: u32,
    pub index: u32,
}

#[inline]
pub(crate) fn encode(kind: Kind, manager: u32, gen: u32, index: u32) -> u64 {
    debug_assert!(manager < MAX_MANAGERS && gen <= MAX_GEN && index <= MAX_INDEX);
    ((kind as u64) << KIND_SHIFT)
        | ((manager as u64) << MANAGER_SHIFT)
        | ((gen as u64) << GEN_SHIFT)
        | index as u64
}

#[inline]
pub(crate) fn decode(bits: u64) -> Raw {
    Raw {
        kind: (bits >> KIND_SHIFT) as u8,
        manager: ((bits >> MANAGER_SHIFT) & (MAX_MANAGERS as u64 - 1)) as u32,
        gen: ((bits >> GEN_SHIFT) & MAX_GEN as u64) as u32,
        index: (bits & MAX_INDEX as u64) as u32,
    }
}

/// Decodes `bits` as a handle of `kind`; the zero handle and a handle of
/// another kind are refused (the caller treats zero first where it is a
/// no-op).
#[inline]
pub(crate) fn expect(bits: u64, kind: Kind) -> Result<Raw, Error> {
    let raw = decode(bits);
    if raw.kind != kind as u8 || raw.gen == 0 {
        return Err(invalid(bits, kind));
    }
    Ok(raw)
}

#[cold]
pub(crate) fn invalid(bits: u64, kind: Kind) -> Error {
    if bits == 0 {
        return Error::new(S::InvalidHandle, format!("the {} handle is the zero handle", kind.name()));
    }
    let found = decode(bits).kind;
    let what = match found {
        1 => "a manager",
        2 => "a mechanism",
        3 => "a pool",
        4 => "a holder",
        5 => "a binding",
        6 => "an allocation",
        7 => "a region",
        8 => "a shared prefix",
        9 => "a stream",
        10 => "a fence",
        _ => "no kind of",
    };
    Error::new(
        S::InvalidHandle,
        format!("{bits:#018x} is not a valid {} handle (it is {what} handle)", kind.name()),
    )
}

const OCC: u64 = 1 << 31;
const DYING: u64 = 1 << 30;
const READERS: u64 = DYING - 1;

#[inline]
fn gen_of(state: u64) -> u32 {
    (state >> 32) as u32
}

#[inline]
fn free_state(gen: u32) -> u64 {
    (gen as u64) << 32
}

/// The state a slot takes after its occupant of generation `gen` leaves:
/// free with the next generation, or retired when generations ran out.
#[inline]
fn next_free(gen: u32) -> (u64, bool) {
    if gen >= MAX_GEN {
        (free_state(MAX_GEN + 1), false)
    } else {
        (free_state(gen + 1), true)
    }
}

struct Slot<T> {
    state: AtomicU64,
    /// Two words of copyable data published with the value and readable
    /// without pinning (seqlock-validated): an allocation's address and size.
    meta: [AtomicU64; 2],
    value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    fn fresh() -> Self {
        Slot {
            state: AtomicU64::new(free_state(1)),
            meta: [AtomicU64::new(0), AtomicU64::new(0)],
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}

const BASE: u64 = 64;
const CHUNKS: usize = 23; // BASE << 22 covers MAX_INDEX

#[inline]
fn locate(index: u32) -> (usize, usize) {
    let i = index as u64 / BASE + 1;
    let k = 63 - i.leading_zeros() as usize;
    let start = BASE * ((1u64 << k) - 1);
    (k, (index as u64 - start) as usize)
}

#[inline]
fn chunk_len(k: usize) -> usize {
    (BASE as usize) << k
}

/// Indices a table may hand out, shared by all threads.
struct FreeList {
    inner: Mutex<FreeInner>,
    /// One past the highest index ever handed out (sweeps stop there).
    high: AtomicU32,
    /// Process-unique number of this list: its place in the per-thread
    /// caches.
    id: usize,
}

struct FreeInner {
    free: Vec<u32>,
    fresh: u32,
    limit: u32,
}

const BATCH: usize = 32;
const LOCAL_MAX: usize = 2 * BATCH;

static NEXT_LIST_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl FreeList {
    fn new(limit: u32) -> Self {
        FreeList {
            inner: Mutex::new(FreeInner { free: Vec::new(), fresh: 0, limit }),
            high: AtomicU32::new(0),
            id: NEXT_LIST_ID.fetch_add(1, Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FreeInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves up to `n` free indices into `out`.
    fn refill(&self, out: &mut Vec<u32>, n: usize) {
        let mut g = self.lock();
        let take = g.free.len().min(n);
        let at = g.free.len() - take;
        out.extend(g.free.drain(at..));
        while out.len() < n && g.fresh <= g.limit {
            out.push(g.fresh);
            g.fresh += 1;
        }
        self.high.store(g.fresh, Release);
    }

    fn give_back(&self, idx: impl IntoIterator<Item = u32>) {
        self.lock().free.extend(idx);
    }
}

/// Per-thread caches of free indices, indexed by [`FreeList::id`].
struct LocalCaches(Vec<Option<(&'static FreeList, Vec<u32>)>>);

impl Drop for LocalCaches {
    fn drop(&mut self) {
        for (list, idx) in self.0.drain(..).flatten() {
            list.give_back(idx);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<LocalCaches> = const { RefCell::new(LocalCaches(Vec::new())) };
}

#[inline]
fn with_local<R>(list: &'static FreeList, f: impl FnOnce(&mut Vec<u32>) -> R) -> Option<R> {
    LOCAL
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            if c.0.len() <= list.id {
                c.0.resize_with(list.id + 1, || None);
            }
            let (_, v) = c.0[list.id].get_or_insert_with(|| (list, Vec::with_capacity(LOCAL_MAX + 1)));
            Some(f(v))
        })
        .ok()
        .flatten()
}

/// Why a lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// The handle named an object that is gone.
    Stale,
    /// The handle never named an object of this table.
    Invalid,
}

/// Outcome of [`SlotTable::remove`].
pub(crate) enum Removed<T> {
    /// Nobody else was using it: here it is.
    Now(T),
    /// Other threads use it; the last of them drops it.
    Deferred,
}

/// A lock-free generational table (see the module docs).
pub(crate) struct SlotTable<T> {
    chunks: [AtomicPtr<Slot<T>>; CHUNKS],
    grow: Mutex<()>,
    free: FreeList,
}

// SAFETY: values are reached through `&T` by any number of pinned readers
// on any thread (T: Sync) and moved out / dropped by whichever thread wins
// the state transition (T: Send); the state word orders every access.
unsafe impl<T: Send + Sync> Sync for SlotTable<T> {}
unsafe impl<T: Send> Send for SlotTable<T> {}

impl<T> SlotTable<T> {
    pub(crate) fn new(limit: u32) -> Self {
        SlotTable {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            grow: Mutex::new(()),
            free: FreeList::new(limit.min(MAX_INDEX)),
        }
    }

    #[inline]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let (k, off) = locate(index);
        let p = self.chunks[k].load(Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: chunk k holds chunk_len(k) slots and is never freed while
        // the table lives; off < chunk_len(k) by construction of `locate`.
        Some(unsafe { &*p.add(off) })
    }

    #[cold]
    fn make_chunk(&self, k: usize) -> &Slot<T> {
        let _g = self.grow.lock().unwrap_or_else(|p| p.into_inner());
        let mut p = self.chunks[k].load(Acquire);
        if p.is_null() {
            let chunk: Box<[Slot<T>]> = (0..chunk_len(k)).map(|_| Slot::fresh()).collect();
            p = Box::into_raw(chunk).cast::<Slot<T>>();
            self.chunks[k].store(p, Release);
        }
        // SAFETY: as in `slot`.
        unsafe { &*p }
    }

    #[inline]
    fn slot_or_make(&self, index: u32) -> &Slot<T> {
        match self.slot(index) {
            Some(s) => s,
            None => {
                let (k, off) = locate(index);
                let first = self.make_chunk(k) as *const Slot<T>;
                // SAFETY: as in `slot`.
                unsafe { &*first.add(off) }
            }
        }
    }

    /// One past the highest index ever used.
    pub(crate) fn high_water(&self) -> u32 {
        self.free.high.load(Acquire)
    }
}

impl<T: Send + Sync + 'static> SlotTable<T> {
    #[inline]
    fn alloc_index(&'static self) -> Option<u32> {
        let local = with_local(&self.free, |v| {
            if v.is_empty() {
                self.free.refill(v, BATCH);
            }
            v.pop()
        });
        match local {
            Some(r) => r,
            None => {
                let mut v = Vec::with_capacity(1);
                self.free.refill(&mut v, 1);
                v.pop()
            }
        }
    }

    #[inline]
    fn release_index(&'static self, index: u32) {
        let done = with_local(&self.free, |v| {
            v.push(index);
            if v.len() > LOCAL_MAX {
                let at = v.len() - BATCH;
                self.free.give_back(v.drain(at..));
            }
        });
        if done.is_none() {
            self.free.give_back([index]);
        }
    }

    /// Takes a free slot for a value made afterwards (so the value is
    /// moved only once, into the slot); `None` when the table is full.
    /// Dropping the [`Vacant`] unfilled gives the slot back.
    #[inline]
    pub(crate) fn vacant(&'static self) -> Option<Vacant<T>> {
        let index = self.alloc_index()?;
        Some(Vacant { table: self, slot: self.slot_or_make(index), index })
    }

    /// Stores `value`; returns (index, generation). `Err(value)` when the
    /// table is full.
    #[inline]
    pub(crate) fn insert(&'static self, value: T, meta: [u64; 2]) -> Result<(u32, u32), T> {
        match self.vacant() {
            Some(v) => Ok(v.fill(value, meta)),
            None => Err(value),
        }
    }

    #[cold]
    fn classify(&self, raw: Raw) -> Miss {
        match self.slot(raw.index) {
            None => Miss::Invalid,
            Some(s) => {
                let st = s.state.load(Acquire);
                let g = gen_of(st);
                if g > raw.gen || (g == raw.gen && st & OCC == 0) || (g == raw.gen && st & DYING != 0) {
                    Miss::Stale
                } else {
                    Miss::Invalid
                }
            }
        }
    }

    /// Shared use of the value while the guard lives.
    #[inline]
    pub(crate) fn pin(&'static self, raw: Raw) -> Result<Pinned<T>, Miss> {
        let Some(slot) = self.slot(raw.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != raw.gen || st & READERS == READERS {
                return Err(self.classify(raw));
            }
            match slot.state.compare_exchange_weak(st, st + 1, Acquire, Acquire) {
                Ok(_) => return Ok(Pinned { table: self, slot, index: raw.index }),
                Err(now) => st = now,
            }
        }
    }

    /// The two words stored with the value, without pinning.
    #[inline]
    pub(crate) fn meta(&'static self, raw: Raw) -> Result<[u64; 2], Miss> {
        let Some(slot) = self.slot(raw.index) else {
            return Err(Miss::Invalid);
        };
        let st = slot.state.load(Acquire);
        if st & (OCC | DYING) != OCC || gen_of(st) != raw.gen {
            return Err(self.classify(raw));
        }
        let m = [slot.meta[0].load(Relaxed), slot.meta[1].load(Relaxed)];
        fence(Acquire);
        let again = slot.state.load(Relaxed);
        if gen_of(again) != raw.gen || again & (OCC | DYING) != OCC {
            return Err(Miss::Stale);
        }
        Ok(m)
    }

    /// Takes the value out if nobody uses it; with readers, marks it dying
    /// (the last reader drops it). Either way the handle is stale from now.
    #[inline]
    pub(crate) fn remove(&'static self, raw: Raw) -> Result<Removed<T>, Miss> {
        let Some(slot) = self.slot(raw.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != raw.gen {
                return Err(self.classify(raw));
            }
            if st & READERS == 0 {
                let (next, reusable) = next_free(raw.gen);
                match slot.state.compare_exchange_weak(st, next, AcqRel, Acquire) {
                    Ok(_) => {
                        // SAFETY: the transition made this thread the only
                        // owner of the initialised value.
                        let v = unsafe { (*slot.value.get()).assume_init_read() };
                        if reusable {
                            self.release_index(raw.index);
                        }
                        return Ok(Removed::Now(v));
                    }
                    Err(now) => st = now,
                }
            } else {
                match slot.state.compare_exchange_weak(st, st | DYING, AcqRel, Acquire) {
                    Ok(_) => return Ok(Removed::Deferred),
                    Err(now) => st = now,
                }
            }
        }
    }

    /// Like [`remove`](Self::remove), dropping the value in place (no
    /// move) when nobody else uses it.
    #[inline]
    pub(crate) fn remove_drop(&'static self, raw: Raw) -> Result<(), Miss> {
        let Some(slot) = self.slot(raw.index) else {
            return Err(Miss::Invalid);
        };
        let st = slot.state.load(Acquire);
        if st == (free_state(raw.gen) | OCC) {
            let (next, reusable) = next_free(raw.gen);
            if slot.state.compare_exchange(st, next, AcqRel, Acquire).is_ok() {
                // SAFETY: the transition made this thread the only owner of
                // the initialised value; the index is not reissued before
                // release_index below.
                unsafe { (*slot.value.get()).assume_init_drop() };
                if reusable {
                    self.release_index(raw.index);
                }
                return Ok(());
            }
        }
        self.remove(raw).map(drop)
    }

    /// Removes every live value (manager teardown), calling `f` on those
    /// nobody else uses; the others are dropped by their last reader.
    pub(crate) fn sweep(&'static self, mut f: impl FnMut(T)) {
        for index in 0..self.high_water() {
            let Some(slot) = self.slot(index) else { continue };
            let st = slot.state.load(Acquire);
            if st & (OCC | DYING) == OCC {
                let raw = Raw { kind: 0, manager: 0, gen: gen_of(st), index };
                if let Ok(Removed::Now(v)) = self.remove(raw) {
                    f(v);
                }
            }
        }
    }

    fn unpin(&'static self, slot: &Slot<T>, index: u32) {
        let old = slot.state.fetch_sub(1, Release);
        if old & DYING != 0 && old & READERS == 1 {
            fence(Acquire);
            // SAFETY: the remover marked it dying and this was the last
            // reader: nobody else can reach the value any more.
            let v = unsafe { (*slot.value.get()).assume_init_read() };
            let (next, reusable) = next_free(gen_of(old));
            slot.state.store(next, Release);
            if reusable {
                self.release_index(index);
            }
            drop(v);
        }
    }
}

impl<T> Drop for SlotTable<T> {
    fn drop(&mut self) {
        for (k, c) in self.chunks.iter_mut().enumerate() {
            let p = *c.get_mut();
            if p.is_null() {
                continue;
            }
            // SAFETY: allocated in make_chunk as a boxed slice of this length.
            let mut chunk = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, chunk_len(k))) };
            for s in chunk.iter_mut() {
                if *s.state.get_mut() & (OCC | DYING) != 0 {
                    // SAFETY: occupied slots hold an initialised value and
                    // `&mut self` excludes every reader.
                    unsafe { s.value.get_mut().assume_init_drop() };
                }
            }
        }
    }
}

/// A pinned value: usable while this guard lives, from this thread.
pub(crate) struct Pinned<T: Send + Sync + 'static> {
    table: &'static SlotTable<T>,
    slot: &'static Slot<T>,
    index: u32,
}

impl<T: Send + Sync + 'static> std::ops::Deref for Pinned<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a pinned slot holds an initialised value that is not
        // moved out before the last reader unpins.
        unsafe { (*self.slot.value.get()).assume_init_ref() }
    }
}

impl<T: Send + Sync + 'static> Drop for Pinned<T> {
    #[inline]
    fn drop(&mut self) {
        self.table.unpin(self.slot, self.index);
    }
}

/// A free slot taken by this thread, to be filled once.
pub(crate) struct Vacant<T: Send + Sync + 'static> {
    table: &'static SlotTable<T>,
    slot: &'static Slot<T>,
    index: u32,
}

impl<T: Send + Sync + 'static> Vacant<T> {
    /// Publishes `value`; returns (index, generation).
    #[inline]
    pub(crate) fn fill(self, value: T, meta: [u64; 2]) -> (u32, u32) {
        let (slot, index) = (self.slot, self.index);
        std::mem::forget(self);
        let st = slot.state.load(Acquire);
        debug_assert!(st & (OCC | DYING | READERS) == 0, "free slot in use");
        let gen = gen_of(st);
        // SAFETY: the index came off the free list, so this thread owns the
        // slot: no reader can pin it (not OCC) and no taker can take it.
        unsafe { (*slot.value.get()).write(value) };
        slot.meta[0].store(meta[0], Relaxed);
        slot.meta[1].store(meta[1], Relaxed);
        slot.state.store(free_state(gen) | OCC, Release);
        (index, gen)
    }
}

impl<T: Send + Sync + 'static> Drop for Vacant<T> {
    fn drop(&mut self) {
        self.table.release_index(self.index);
    }
}

/// Leaks a table so it can live for the whole process (tables of manager
/// slots are reused, never freed).
pub(crate) fn leak<T>(t: SlotTable<T>) -> &'static SlotTable<T> {
    Box::leak(Box::new(t))
}

/// A table created on first use and kept for the process.
pub(crate) struct LazyTable<T: 'static>(OnceLock<&'static SlotTable<T>>, u32);

impl<T: Send + Sync + 'static> LazyTable<T> {
    pub(crate) const fn new(limit: u32) -> Self {
        LazyTable(OnceLock::new(), limit)
    }
    #[inline]
    pub(crate) fn get(&self) -> &'static SlotTable<T> {
        self.0.get_or_init(|| leak(SlotTable::new(self.1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn encode_decode_round_trip() {
        let bits = encode(Kind::Region, MAX_MANAGERS - 1, MAX_GEN, MAX_INDEX);
        assert_eq!(
            decode(bits),
            Raw { kind: Kind::Region as u8, manager: MAX_MANAGERS - 1, gen: MAX_GEN, index: MAX_INDEX }
        );
        assert!(expect(bits, Kind::Binding).is_err());
        assert!(expect(0, Kind::Binding).is_err());
    }

    #[test]
    fn locate_covers_every_index_once() {
        let mut expected = (0usize, 0usize);
        for i in 0..10_000u32 {
            let (k, off) = locate(i);
            assert_eq!((k, off), expected, "index {i}");
            expected.1 += 1;
            if expected.1 == chunk_len(expected.0) {
                expected = (expected.0 + 1, 0);
            }
        }
        let (k, off) = locate(MAX_INDEX);
        assert!(k < CHUNKS && off < chunk_len(k));
    }

    fn raw(index: u32, gen: u32) -> Raw {
        Raw { kind: 0, manager: 0, gen, index }
    }

    #[test]
    fn stale_and_forged_handles_are_told_apart() {
        let t = leak(SlotTable::<String>::new(MAX_INDEX));
        let (i, g) = t.insert("a".into(), [1, 2]).unwrap();
        assert_eq!(&*t.pin(raw(i, g)).unwrap(), "a");
        assert_eq!(t.meta(raw(i, g)).unwrap(), [1, 2]);
        assert!(matches!(t.remove(raw(i, g)), Ok(Removed::Now(s)) if s == "a"));
        assert_eq!(t.pin(raw(i, g)).err(), Some(Miss::Stale));
        assert_eq!(t.remove(raw(i, g)).err(), Some(Miss::Stale));
        assert_eq!(t.pin(raw(i, g + 5)).err(), Some(Miss::Invalid));
        assert_eq!(t.pin(raw(1 << 27, 1)).err(), Some(Miss::Invalid));
        // The index is reused with a newer generation.
        let (i2, g2) = t.insert("b".into(), [0, 0]).unwrap();
        assert_eq!((i2, g2), (i, g + 1));
        assert_eq!(t.pin(raw(i, g)).err(), Some(Miss::Stale));
    }

    #[test]
    fn remove_while_pinned_defers_the_drop_to_the_last_reader() {
        struct D(Arc<AtomicU32>);
        impl Drop for D {
            fn drop(&mut self) {
                self.0.fetch_add(1, Relaxed);
            }
        }
        let drops = Arc::new(AtomicU32::new(0));
        let t = leak(SlotTable::<D>::new(MAX_INDEX));
        let (i, g) = t.insert(D(drops.clone()), [0, 0]).ok().unwrap();
        let p1 = t.pin(raw(i, g)).ok().unwrap();
        let p2 = t.pin(raw(i, g)).ok().unwrap();
        assert!(matches!(t.remove(raw(i, g)), Ok(Removed::Deferred)));
        assert_eq!(t.pin(raw(i, g)).err(), Some(Miss::Stale));
        assert!(t.remove(raw(i, g)).is_err());
        drop(p1);
        assert_eq!(drops.load(Relaxed), 0);
        drop(p2);
        assert_eq!(drops.load(Relaxed), 1);
        let (i2, g2) = t.insert(D(drops.clone()), [0, 0]).ok().unwrap();
        assert_eq!((i2, g2), (i, g + 1));
    }

    #[test]
    fn generations_retire_instead_of_wrapping() {
        let t = leak(SlotTable::<u32>::new(MAX_INDEX));
        let (i, g) = t.insert(1, [0, 0]).unwrap();
        let slot = t.slot(i).unwrap();
        // Pretend the slot already went through every generation.
        slot.state.store(free_state(MAX_GEN) | OCC, Release);
        assert!(matches!(t.remove(raw(i, MAX_GEN)), Ok(Removed::Now(1))));
        assert_eq!(t.pin(raw(i, MAX_GEN)).err(), Some(Miss::Stale));
        assert_eq!(t.pin(raw(i, g)).err(), Some(Miss::Stale));
        for _ in 0..1000 {
            let (j, _) = t.insert(2, [0, 0]).unwrap();
            assert_ne!(j, i, "a retired slot is never reissued");
            let _ = t.remove(raw(j, gen_of(t.slot(j).unwrap().state.load(Acquire))));
        }
    }

    #[test]
    fn racing_removes_free_exactly_once() {
        let t = leak(SlotTable::<Arc<()>>::new(MAX_INDEX));
        let token = Arc::new(());
        for _ in 0..200 {
            let (i, g) = t.insert(token.clone(), [0, 0]).unwrap();
            let wins: u32 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|_| s.spawn(move || matches!(t.remove(raw(i, g)), Ok(Removed::Now(_))) as u32))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(wins, 1);
        }
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn many_threads_insert_and_remove() {
        let t = leak(SlotTable::<u64>::new(MAX_INDEX));
        std::thread::scope(|s| {
            for th in 0..4u64 {
                s.spawn(move || {
                    let mut live = Vec::new();
                    for n in 0..5000u64 {
                        let (i, g) = t.insert(th * 1_000_000 + n, [n, th]).unwrap();
                        live.push((i, g, th * 1_000_000 + n));
                        if n % 3 == 0 {
                            let (i, g, v) = live.swap_remove(0);
                            assert!(matches!(t.remove(raw(i, g)), Ok(Removed::Now(x)) if x == v));
                        }
                    }
                    for (i, g, v) in live {
                        assert_eq!(*t.pin(raw(i, g)).unwrap(), v);
                        assert!(matches!(t.remove(raw(i, g)), Ok(Removed::Now(x)) if x == v));
                    }
                });
            }
        });
    }

    #[test]
    fn a_bounded_table_reports_full() {
        let t = leak(SlotTable::<u8>::new(3));
        let got: Vec<_> = (0..4).map(|_| t.insert(0, [0, 0]).unwrap()).collect();
        assert_eq!(got.len(), 4);
        assert!(t.insert(9, [0, 0]).is_err());
    }
}
