//! The lock-free generational table behind every kind of handle.
//!
//! A [`SlotTable`] is a segmented array of slots whose addresses never move
//! (chunks of 64, 128, 256... slots, allocated on first use), so a lookup is
//! two loads and never takes a lock. A value is named by its [`Key`]: the
//! slot's index and the generation the slot had when the value went in.
//! Each slot has one state word:
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
//!   sees a stale key. With readers, remove marks `DYING` and the last
//!   reader drops the value;
//! * exclusive use (`with_exclusive`, for the rare call that must change a
//!   value in place): a compare-exchange from no readers to every reader
//!   bit set, which pins wait out (a pin never counts that high); a remove
//!   meanwhile marks `DYING` and the holder drops the value when done.
//!
//! Generations only grow. A slot whose generation would pass `MAX_GEN` is
//! retired for good (never reissued), so a stale key can never name a
//! newer value.
//!
//! Free indices are cached per thread (`slot_table/free.rs`: refilled from
//! and spilled to a mutex-guarded list in batches; the last one released
//! kept apart in a `Cell`, with its slot's address), so an insert + take
//! pair costs one compare-exchange, no lock, and one segment lookup.
//!
//! The table knows nothing of handles, managers or errors: lookups fail
//! with a [`Miss`], which [`crate::error`] turns into a status. Its atomics,
//! lock, thread-local and value cells come from `crate::sync`, so
//! `tests/slot_table_loom.rs` model-checks this code as it is.
//!
//! The module is public (and hidden) only for that test.

use crate::sync::{self, exclusive_ptr, exclusive_u64, fence, AtomicPtr, AtomicU64, Mutex, ValueCell};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::OnceLock;

/// Bits of a slot index (the handle codec packs exactly these).
pub(crate) const INDEX_BITS: u32 = 28;
/// Bits of a generation (the handle codec packs exactly these).
pub(crate) const GEN_BITS: u32 = 22;
/// Largest slot index of a table.
pub(crate) const MAX_INDEX: u32 = (1 << INDEX_BITS) - 1;
/// Largest generation; a slot that reaches it is retired after its last use.
pub(crate) const MAX_GEN: u32 = (1 << GEN_BITS) - 1;

/// What a value is looked up by: its slot and the slot's generation when
/// the value was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub index: u32,
    pub gen: u32,
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
    value: ValueCell<T>,
}

impl<T> Slot<T> {
    fn fresh() -> Self {
        Slot {
            state: AtomicU64::new(free_state(1)),
            meta: [AtomicU64::new(0), AtomicU64::new(0)],
            value: ValueCell::uninit(),
        }
    }
}

const BASE: u64 = 64;
/// Chunks `0..CHUNKS` hold `BASE * (2^CHUNKS - 1)` slots: every index up to
/// MAX_INDEX.
const CHUNKS: usize = (INDEX_BITS - BASE.trailing_zeros()) as usize + 1;

/// The chunk holding `index`.
#[inline]
fn chunk_of(index: u32) -> usize {
    let i = index as u64 / BASE + 1;
    63 - i.leading_zeros() as usize
}

/// The index of chunk `k`'s first slot.
#[inline]
fn chunk_start(k: usize) -> u64 {
    BASE * ((1u64 << k) - 1)
}

#[inline]
fn locate(index: u32) -> (usize, usize) {
    let k = chunk_of(index);
    (k, (index as u64 - chunk_start(k)) as usize)
}

#[inline]
fn chunk_len(k: usize) -> usize {
    (BASE as usize) << k
}

mod free;
use free::{put_stash, take_stash, with_local, FreeList, BATCH, LOCAL_MAX};

/// Why a lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The key named a value that is gone.
    Stale,
    /// The key never named a value of this table.
    Invalid,
}

/// Outcome of [`SlotTable::remove`].
pub enum Removed<T> {
    /// Nobody else was using it: here it is.
    Now(T),
    /// Other threads use it; the last of them drops it.
    Deferred,
}

/// A lock-free generational table (see the module docs).
pub struct SlotTable<T> {
    chunks: [AtomicPtr<Slot<T>>; CHUNKS],
    /// Per chunk, its address less its first index (in slots) plus one
    /// byte, or null while the chunk is not made: a lookup adds the index
    /// to it (no offset in the chunk to work out; callgrind: about 10
    /// instructions a lookup less, and every C call looks up a slot). The
    /// byte makes it never null (a chunk's address and its first index's
    /// slots are both multiples of 8, so the sum is odd) and keeps the
    /// pointer derived from the chunk's (wrapping arithmetic, same
    /// provenance).
    bases: [AtomicPtr<Slot<T>>; CHUNKS],
    grow: Mutex<()>,
    free: FreeList,
}

// SAFETY: values are reached through `&T` by any number of pinned readers
// on any thread (T: Sync) and moved out / dropped by whichever thread wins
// the state transition (T: Send); the state word orders every access.
unsafe impl<T: Send + Sync> Sync for SlotTable<T> {}
unsafe impl<T: Send> Send for SlotTable<T> {}

impl<T> SlotTable<T> {
    /// A table handing out indices `0..=limit` (at most [`MAX_INDEX`]).
    pub fn new(limit: u32) -> Self {
        SlotTable {
            chunks: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            bases: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            grow: Mutex::new(()),
            free: FreeList::new(limit.min(MAX_INDEX)),
        }
    }

    #[inline]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let k = chunk_of(index);
        let base = self.bases[k].load(Acquire);
        if base.is_null() {
            return None;
        }
        // Chunk k's address plus (index - its first index): the slot, in
        // the chunk (see `bases`).
        let p = base.wrapping_byte_sub(1).wrapping_add(index as usize);
        // SAFETY: `p` is slot `index - chunk_start(k)` of chunk k, which
        // holds chunk_len(k) slots (more than that offset, by construction
        // of `chunk_of`) and is never freed while the table lives; so it is
        // not null either (told to the compiler, which tested it again).
        unsafe {
            std::hint::assert_unchecked(!p.is_null());
            Some(&*p)
        }
    }

    #[cold]
    fn make_chunk(&self, k: usize) -> &Slot<T> {
        let _g = sync::lock(&self.grow);
        let mut p = self.chunks[k].load(Acquire);
        if p.is_null() {
            let chunk: Box<[Slot<T>]> = (0..chunk_len(k)).map(|_| Slot::fresh()).collect();
            // `bases` relies on slots being 8-byte aligned (never null).
            const { assert!(std::mem::align_of::<Slot<T>>() >= 8) };
            p = Box::into_raw(chunk).cast::<Slot<T>>();
            self.chunks[k].store(p, Release);
            let base = p.wrapping_sub(chunk_start(k) as usize).wrapping_byte_add(1);
            self.bases[k].store(base, Release);
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
    pub fn high_water(&self) -> u32 {
        self.free.high.load(Acquire)
    }
}

impl<T: Send + Sync + 'static> SlotTable<T> {
    #[inline(never)]
    fn alloc_index_cached(&'static self) -> Option<u32> {
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

    /// Gives `index` (of `slot`) back: to this thread's stash inline, the
    /// rest (vectors, the lock) out of line — the stash is the path of a
    /// pair, and inlining all of it costs more in the callers' frames than
    /// a call (callgrind).
    #[inline(always)]
    fn release_index(&'static self, index: u32, slot: &Slot<T>) {
        if !put_stash(&self.free, index, (slot as *const Slot<T>).cast()) {
            self.release_index_cached(index);
        }
    }

    #[inline(never)]
    fn release_index_cached(&'static self, index: u32) {
        let done = with_local(&self.free, |v| {
            v.push(index);
            if v.len() > LOCAL_MAX {
                self.free.spill(v);
            }
        });
        if done.is_none() {
            self.free.give_back_one(index);
        }
    }

    /// Takes a free slot for a value made afterwards (so the value is
    /// moved only once, into the slot); `None` when the table is full.
    /// Dropping the [`Vacant`] unfilled gives the slot back.
    #[inline]
    pub fn vacant(&'static self) -> Option<Vacant<T>> {
        if let Some((index, slot)) = take_stash(&self.free) {
            // SAFETY: `release_index` of this table (the owner of
            // `self.free`) stashed the index with its own slot's address;
            // slots never move nor go while the table lives.
            let slot = unsafe { &*slot.cast::<Slot<T>>() };
            return Some(Vacant { table: self, slot, index });
        }
        let index = self.alloc_index_cached()?;
        Some(Vacant { table: self, slot: self.slot_or_make(index), index })
    }

    /// Stores `value`; returns (index, generation). `Err(value)` when the
    /// table is full.
    #[inline]
    pub fn insert(&'static self, value: T, meta: [u64; 2]) -> Result<(u32, u32), T> {
        match self.vacant() {
            Some(v) => Ok(v.fill(value, meta)),
            None => Err(value),
        }
    }

    #[cold]
    fn classify(&self, key: Key) -> Miss {
        match self.slot(key.index) {
            None => Miss::Invalid,
            Some(s) => {
                let st = s.state.load(Acquire);
                let g = gen_of(st);
                if g > key.gen || (g == key.gen && st & OCC == 0) || (g == key.gen && st & DYING != 0) {
                    Miss::Stale
                } else {
                    Miss::Invalid
                }
            }
        }
    }

    /// Shared use of the value while the guard lives. Always inlined: the
    /// C API pins a handle's object on every call, and a call here cost
    /// its frame and a 32-byte result through memory.
    #[inline(always)]
    pub fn pin(&'static self, key: Key) -> Result<Pinned<T>, Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != key.gen || st & READERS >= READERS - 1 {
                st = self.wait_exclusive(slot, key, st)?;
                continue;
            }
            match slot.state.compare_exchange_weak(st, st + 1, Acquire, Acquire) {
                Ok(_) => return Ok(Pinned { table: self, slot, index: key.index }),
                Err(now) => st = now,
            }
        }
    }

    /// `pin`'s refusal, unless the value is held by [`with_exclusive`]
    /// (every reader bit set): then it waits (yields) for the holder and
    /// answers `Ok(state now)` to try again. Out of line: the fast path of
    /// `pin` is unchanged.
    ///
    /// [`with_exclusive`]: Self::with_exclusive
    #[cold]
    fn wait_exclusive(&self, slot: &Slot<T>, key: Key, st: u64) -> Result<u64, Miss> {
        if st & (OCC | DYING | READERS) == OCC | READERS && gen_of(st) == key.gen {
            sync::yield_now();
            return Ok(slot.state.load(Acquire));
        }
        Err(self.classify(key))
    }

    /// Exclusive use of the value for a moment: `f` gets it as `&mut`.
    /// Waits (yields) for pinned readers to leave, then holds every reader
    /// bit, so that a pin waits for `f` to return and a take finds it in
    /// use. A remove meanwhile marks it dying (the handle is stale at once)
    /// and the value is dropped here, after `f`, as by a last reader. A
    /// panic in `f` puts the value back before it goes on. `f` must not
    /// pin, take or remove this value (it would wait for itself).
    pub fn with_exclusive<R>(&'static self, key: Key, f: impl FnOnce(&mut T) -> R) -> Result<R, Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != key.gen {
                return Err(self.classify(key));
            }
            if st & READERS != 0 {
                // Readers (pins are short) or another exclusive holder.
                sync::yield_now();
                st = slot.state.load(Acquire);
                continue;
            }
            match slot.state.compare_exchange_weak(st, st | READERS, Acquire, Acquire) {
                Ok(_) => break,
                Err(now) => st = now,
            }
        }
        // SAFETY: every reader bit held: no pin, take or drop can reach the
        // value until they are given back below, after it is written back.
        let mut v = unsafe { slot.value.take() };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut v)));
        // SAFETY: as above; the cell is empty since the take.
        unsafe { slot.value.write(v) };
        let old = slot.state.fetch_sub(READERS, AcqRel);
        if old & DYING != 0 {
            // Removed meanwhile: this is its last user.
            fence(Acquire);
            // SAFETY: dying with no reader left: nobody else reaches it.
            let v = unsafe { slot.value.take() };
            let (next, reusable) = next_free(gen_of(old));
            slot.state.store(next, Release);
            if reusable {
                self.release_index(key.index, slot);
            }
            drop(v);
        }
        match r {
            Ok(r) => Ok(r),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// The two words stored with the value, without pinning.
    #[inline]
    pub fn meta(&'static self, key: Key) -> Result<[u64; 2], Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let st = slot.state.load(Acquire);
        if st & (OCC | DYING) != OCC || gen_of(st) != key.gen {
            return Err(self.classify(key));
        }
        let m = [slot.meta[0].load(Relaxed), slot.meta[1].load(Relaxed)];
        fence(Acquire);
        let again = slot.state.load(Relaxed);
        if gen_of(again) != key.gen || again & (OCC | DYING) != OCC {
            return Err(Miss::Stale);
        }
        Ok(m)
    }

    /// Takes the value out if nobody uses it; with readers, marks it dying
    /// (the last reader drops it). Either way the handle is stale from now.
    #[inline]
    pub fn remove(&'static self, key: Key) -> Result<Removed<T>, Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != key.gen {
                return Err(self.classify(key));
            }
            if st & READERS == 0 {
                let (next, reusable) = next_free(key.gen);
                match slot.state.compare_exchange_weak(st, next, AcqRel, Acquire) {
                    Ok(_) => {
                        // SAFETY: the transition made this thread the only
                        // owner of the initialised value.
                        let v = unsafe { slot.value.take() };
                        if reusable {
                            self.release_index(key.index, slot);
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

    /// Takes the value out if nobody uses it (`Ok(Some)`; the handle is
    /// stale from then on); changes nothing and answers `Ok(None)` while
    /// readers hold it, so that a caller that must own the value (to hand
    /// it on, not to drop it) can retry once they leave.
    #[inline(always)]
    pub fn try_take(&'static self, key: Key) -> Result<Option<T>, Miss> {
        let Some((slot, reusable)) = self.claim(key)? else {
            return Ok(None);
        };
        // SAFETY: `claim` made this thread the only owner of the
        // initialised value.
        let v = unsafe { slot.value.take() };
        if reusable {
            self.release_index(key.index, slot);
        }
        Ok(Some(v))
    }

    /// The transition of [`try_take`](Self::try_take) and
    /// [`try_take_drop`](Self::try_take_drop): from live and unread to free,
    /// which makes the caller the value's only owner. `Ok(None)` while
    /// readers hold it; with the slot, whether its index may be reissued
    /// (the caller releases it once done with the value).
    #[inline(always)]
    fn claim(&'static self, key: Key) -> Result<Option<(&'static Slot<T>, bool)>, Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let mut st = slot.state.load(Acquire);
        loop {
            if st & (OCC | DYING) != OCC || gen_of(st) != key.gen {
                return Err(self.classify(key));
            }
            if st & READERS != 0 {
                return Ok(None);
            }
            let (next, reusable) = next_free(key.gen);
            match slot.state.compare_exchange_weak(st, next, AcqRel, Acquire) {
                Ok(_) => return Ok(Some((slot, reusable))),
                Err(now) => st = now,
            }
        }
    }

    /// [`try_take`](Self::try_take) for a caller that would change the
    /// value and drop it (record a fence on an allocation, then free it):
    /// runs `f` on it and drops it in its slot (`Ok(true)`), with no move
    /// (callgrind: moved out, a 72-byte allocation was copied three times
    /// on its way to its drop). `Ok(Err(f))`, nothing changed and `f` back
    /// for a retry (not wrapped in an `Option` to take it from: callgrind),
    /// while readers hold it. Should `f` panic, the value and its slot leak
    /// (memory-safe: the handle is stale already and the index is never
    /// reissued).
    #[inline(always)]
    pub fn try_take_drop<F: FnOnce(&mut T)>(&'static self, key: Key, f: F) -> Result<Result<(), F>, Miss> {
        let Some((slot, reusable)) = self.claim(key)? else {
            return Ok(Err(f));
        };
        // SAFETY: `claim` made this thread the only owner of the
        // initialised value; the index is not reissued before
        // release_index below.
        unsafe { slot.value.update_then_drop(f) };
        if reusable {
            self.release_index(key.index, slot);
        }
        Ok(Ok(()))
    }

    /// Like [`remove`](Self::remove), dropping the value in place (no
    /// move) when nobody else uses it.
    #[inline]
    pub fn remove_drop(&'static self, key: Key) -> Result<(), Miss> {
        let Some(slot) = self.slot(key.index) else {
            return Err(Miss::Invalid);
        };
        let st = slot.state.load(Acquire);
        if st == (free_state(key.gen) | OCC) {
            let (next, reusable) = next_free(key.gen);
            if slot.state.compare_exchange(st, next, AcqRel, Acquire).is_ok() {
                // SAFETY: the transition made this thread the only owner of
                // the initialised value; the index is not reissued before
                // release_index below.
                unsafe { slot.value.drop_in_place() };
                if reusable {
                    self.release_index(key.index, slot);
                }
                return Ok(());
            }
        }
        self.remove(key).map(drop)
    }

    /// Removes every live value (manager teardown), calling `f` on those
    /// nobody else uses; the others are dropped by their last reader.
    pub fn sweep(&'static self, mut f: impl FnMut(T)) {
        for index in 0..self.high_water() {
            let Some(slot) = self.slot(index) else { continue };
            let st = slot.state.load(Acquire);
            if st & (OCC | DYING) == OCC {
                let key = Key { index, gen: gen_of(st) };
                if let Ok(Removed::Now(v)) = self.remove(key) {
                    f(v);
                }
            }
        }
    }

    #[inline(always)]
    fn unpin(&'static self, slot: &Slot<T>, index: u32) {
        let old = slot.state.fetch_sub(1, Release);
        if old & DYING != 0 && old & READERS == 1 {
            self.last_reader_drops(slot, index, old);
        }
    }

    /// The last reader of a value removed while pinned drops it (out of
    /// line: the unpin every call makes is one `fetch_sub` and a test).
    #[cold]
    #[inline(never)]
    fn last_reader_drops(&'static self, slot: &Slot<T>, index: u32, old: u64) {
        fence(Acquire);
        // SAFETY: the remover marked it dying and this was the last
        // reader: nobody else can reach the value any more.
        let v = unsafe { slot.value.take() };
        let (next, reusable) = next_free(gen_of(old));
        slot.state.store(next, Release);
        if reusable {
            self.release_index(index, slot);
        }
        drop(v);
    }
}

impl<T> Drop for SlotTable<T> {
    fn drop(&mut self) {
        for (k, c) in self.chunks.iter_mut().enumerate() {
            let p = exclusive_ptr(c);
            if p.is_null() {
                continue;
            }
            // SAFETY: allocated in make_chunk as a boxed slice of this length.
            let mut chunk = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, chunk_len(k))) };
            for s in chunk.iter_mut() {
                if exclusive_u64(&mut s.state) & (OCC | DYING) != 0 {
                    // SAFETY: occupied slots hold an initialised value and
                    // `&mut self` excludes every reader.
                    unsafe { s.value.drop_in_place() };
                }
            }
        }
    }
}

/// A pinned value: usable while this guard lives, from this thread.
pub struct Pinned<T: Send + Sync + 'static> {
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
        unsafe { self.slot.value.get() }
    }
}

impl<T: Send + Sync + 'static> Drop for Pinned<T> {
    #[inline]
    fn drop(&mut self) {
        self.table.unpin(self.slot, self.index);
    }
}

/// A free slot taken by this thread, to be filled once.
pub struct Vacant<T: Send + Sync + 'static> {
    table: &'static SlotTable<T>,
    slot: &'static Slot<T>,
    index: u32,
}

impl<T: Send + Sync + 'static> Vacant<T> {
    /// Publishes `value`; returns (index, generation).
    #[inline]
    pub fn fill(self, value: T, meta: [u64; 2]) -> (u32, u32) {
        let (slot, index) = (self.slot, self.index);
        std::mem::forget(self);
        let st = slot.state.load(Acquire);
        debug_assert!(st & (OCC | DYING | READERS) == 0, "free slot in use");
        let gen = gen_of(st);
        // SAFETY: the index came off the free list, so this thread owns the
        // slot: no reader can pin it (not OCC) and no taker can take it.
        unsafe { slot.value.write(value) };
        slot.meta[0].store(meta[0], Relaxed);
        slot.meta[1].store(meta[1], Relaxed);
        slot.state.store(free_state(gen) | OCC, Release);
        (index, gen)
    }
}

impl<T: Send + Sync + 'static> Drop for Vacant<T> {
    fn drop(&mut self) {
        self.table.release_index(self.index, self.slot);
    }
}

/// Leaks a table so it can live for the whole process (the tables of a
/// manager seat are reused by the seat's next manager, never freed).
pub fn leak<T>(t: SlotTable<T>) -> &'static SlotTable<T> {
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

// Unit tests in a file of their own, to keep this one short.
#[cfg(all(test, not(loom)))]
mod tests;
