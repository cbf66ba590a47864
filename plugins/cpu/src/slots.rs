//! The handle table of plain allocations, the one table on the path
//! benchmarked against malloc/free (ARCHITECTURE.md §6: per-allocation
//! bookkeeping is a slab slot, not a global map).
//!
//! [`Table`](crate::handles::Table) (a `slab::Slab` behind a
//! `std::sync::Mutex`) serves every other kind of object; this one is built
//! for the allocate/free pair:
//!
//! * **Sharded.** [`SHARDS`] independent slot arrays, each behind its own
//!   lock on its own cache lines. An insert goes to the shard picked by the
//!   calling thread's stack address (one shift and mask, no thread-local
//!   lookup, which in a `dlopen`ed library is a call to `__tls_get_addr`),
//!   so threads mostly stay out of each other's way; the shard is stored
//!   in the handle's high 32 bits, so a remove from any thread finds it.
//! * **A short lock.** Each shard's lock is a [`SpinLock`]: acquire is one
//!   compare-exchange and release one store, where an uncontended
//!   `std::sync::Mutex` pays for poison bookkeeping on both sides. That is
//!   only sound because every critical section is a handful of loads and
//!   stores (the memory call is made outside it) and a waiter yields its
//!   CPU after a short spin, so a preempted holder is not starved.
//! * **An intrusive free list.** A free slot holds the link of the next
//!   free one, so an insert or remove is O(1) with no search. A link is
//!   the slot's index plus one, the low half of its handle: zero ends the
//!   list (a test for it is one instruction), and a reused slot's link is
//!   its handle's low half as it stands.
//!
//! A handle is `shard << 32 | (index + 1)`: zero never names anything, and
//! a lookup is two indexes. A key alone is not an identity (slots are
//! reused), so a remove also takes a `verify` predicate, as
//! [`Table`](crate::handles::Table)'s do.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Number of shards: a power of two, comfortably above the number of threads
/// that allocate at once on most machines.
pub const SHARDS: usize = 16;

/// Ends the free list: links are indexes plus one.
const END: u32 = 0;
/// Marks a slot that holds a live value (in place of a free-list link).
const LIVE: u32 = u32::MAX;
/// Slots per shard: every link (index plus one) must fit the handle's low
/// 32 bits and stay clear of [`LIVE`].
const MAX_SLOTS: usize = LIVE as usize - 1;
const _: () = assert!(MAX_SLOTS < u32::MAX as usize, "a handle's low half of zero must name no slot");

/// One slot: a value, and whether it is live. A free slot keeps its stale
/// value; only `next` says which it is.
struct Slot<T> {
    value: T,
    /// [`LIVE`], or the link of the next free slot ([`END`] for the last).
    next: u32,
}

/// One shard: slots, the head of their free list, and how many are live.
struct Shard<T> {
    slots: Vec<Slot<T>>,
    /// The link of the first free slot, [`END`] when none is.
    free: u32,
    live: usize,
}

/// A shard on cache lines of its own (two lines: adjacent-line prefetch
/// would otherwise couple neighbours).
#[repr(align(128))]
struct Padded<T>(SpinLock<Shard<T>>);

/// What [`Slots::try_remove`] did.
pub enum Removal<T> {
    /// The value, now removed.
    Removed(T),
    /// No live value there, or `verify` refused it.
    Refused,
    /// The shard's lock was held: nothing was looked at.
    Busy,
}

/// What [`Slots::try_insert`] did.
pub enum Insertion<'a, T> {
    /// Stored, under this handle.
    Inserted(u64),
    /// Not stored yet: for [`Slots::insert_later`].
    Later(Pending<'a, T>),
}

/// An insert [`Slots::try_insert`] could not finish on its fast path.
pub struct Pending<'a, T> {
    value: T,
    shard: usize,
    /// The shard's lock, when it was taken (the free list was empty).
    held: Option<SpinGuard<'a, Shard<T>>>,
}

impl<T> Pending<'_, T> {
    /// The value to be stored.
    pub fn value(&self) -> &T {
        &self.value
    }
}

/// Live values of type `T`, in [`SHARDS`] shards.
pub struct Slots<T> {
    shards: [Padded<T>; SHARDS],
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            shards: std::array::from_fn(|_| {
                Padded(SpinLock::new(Shard { slots: Vec::new(), free: END, live: 0 }))
            }),
        }
    }
}

/// The shard for an insert from this thread. Threads run on different
/// stacks, usually at least 2 MiB apart (Rust's default thread stack is
/// 2 MiB, the main thread's 8 MiB), so bits 21 and up of a local's address
/// tell them apart. It is only a hint against contention: threads with
/// smaller stacks may share a shard, and correctness never depends on which
/// shard is chosen.
#[inline(always)]
fn local_shard() -> usize {
    let marker = 0u8;
    (core::ptr::addr_of!(marker) as usize >> 21) % SHARDS
}

/// The handle of slot `index` of shard `shard`.
#[inline(always)]
fn handle_of(shard: usize, index: usize) -> u64 {
    (shard as u64) << 32 | (index as u64 + 1)
}

impl<T: Copy> Slots<T> {
    /// Stores `value` and returns its handle; `None` only when the shard
    /// already holds `MAX_SLOTS` values. What the allocate path does with
    /// [`Slots::try_insert`] and [`Slots::insert_later`], in one call for
    /// the tests.
    #[cfg(test)]
    pub fn insert(&self, value: T) -> Option<u64> {
        match self.try_insert(value) {
            Insertion::Inserted(handle) => Some(handle),
            Insertion::Later(pending) => self.insert_later(pending),
        }
    }

    /// [`Slots::insert`] on its common path only: the shard's lock free
    /// now and a slot on its free list. Otherwise `value` comes back as a
    /// [`Pending`] (holding the lock when it was taken), for
    /// [`Slots::insert_later`] to finish out of line. So the allocate path
    /// makes no call after its memory call (neither a wait for the lock nor
    /// a growth of the slot array), and what it holds across that call is
    /// all the thunk has to keep in saved registers.
    #[inline(always)]
    pub fn try_insert(&self, value: T) -> Insertion<'_, T> {
        let shard = local_shard();
        let Some(mut guard) = self.shards[shard].0.try_lock() else {
            return Insertion::Later(Pending { value, shard, held: None });
        };
        let s = &mut *guard;
        if s.free == END {
            return Insertion::Later(Pending { value, shard, held: Some(guard) });
        }
        Insertion::Inserted(Self::reuse(s, shard, value))
    }

    /// Finishes an insert [`Slots::try_insert`] left pending: takes the
    /// shard's lock if it is not held yet, then as [`Slots::insert`].
    #[cold]
    #[inline(never)]
    pub fn insert_later(&self, pending: Pending<'_, T>) -> Option<u64> {
        let Pending { value, shard, held } = pending;
        let mut guard = match held {
            Some(guard) => guard,
            None => self.shards[shard].0.lock(),
        };
        Self::insert_locked(&mut guard, shard, value)
    }

    /// The body of an insert, under the shard's lock.
    #[inline(always)]
    fn insert_locked(s: &mut Shard<T>, shard: usize, value: T) -> Option<u64> {
        if s.free != END {
            return Some(Self::reuse(s, shard, value));
        }
        if s.slots.len() >= MAX_SLOTS {
            return None;
        }
        s.slots.push(Slot { value, next: LIVE });
        s.live += 1;
        Some(handle_of(shard, s.slots.len() - 1))
    }

    /// Stores `value` in the first slot of the free list (not empty).
    #[inline(always)]
    fn reuse(s: &mut Shard<T>, shard: usize, value: T) -> u64 {
        let link = s.free;
        debug_assert!(link != END);
        // SAFETY: only `remove` puts a link on the free list, that of a
        // slot it found, and slots are never taken out of `slots`.
        let slot = unsafe { s.slots.get_unchecked_mut(link as usize - 1) };
        s.free = slot.next;
        *slot = Slot { value, next: LIVE };
        s.live += 1;
        // The link is the handle's low half (`handle_of`).
        (shard as u64) << 32 | u64::from(link)
    }

    /// Removes and returns the value `handle` names if it is live and
    /// `verify` accepts it; `None` otherwise, with nothing changed.
    #[inline(always)]
    pub fn remove(&self, handle: u64, verify: impl FnOnce(&T) -> bool) -> Option<T> {
        let shard = self.shard_of(handle)?;
        Self::remove_locked(&mut shard.0.lock(), handle as u32, verify)
    }

    /// [`Slots::remove`] that never waits: [`Removal::Busy`], with nothing
    /// changed, when another thread holds the shard's lock. The free path
    /// uses it so that its wait (a call) is made by a cold caller that
    /// starts over, and nothing the hot path holds in registers has to
    /// survive a call: the thunk then needs fewer saved registers.
    #[inline(always)]
    pub fn try_remove(&self, handle: u64, verify: impl FnOnce(&T) -> bool) -> Removal<T> {
        let Some(shard) = self.shard_of(handle) else {
            return Removal::Refused;
        };
        let Some(mut guard) = shard.0.try_lock() else {
            return Removal::Busy;
        };
        match Self::remove_locked(&mut guard, handle as u32, verify) {
            Some(v) => Removal::Removed(v),
            None => Removal::Refused,
        }
    }

    /// The shard `handle` names, if there is one.
    #[inline(always)]
    fn shard_of(&self, handle: u64) -> Option<&Padded<T>> {
        self.shards.get((handle >> 32) as usize)
    }

    /// The body of a remove, under the shard's lock: `link` is the
    /// handle's low half, the slot's index plus one.
    #[inline(always)]
    fn remove_locked(s: &mut Shard<T>, link: u32, verify: impl FnOnce(&T) -> bool) -> Option<T> {
        // A link of zero (which names nothing) wraps to `u32::MAX`, an
        // index no slot has (a shard holds at most `MAX_SLOTS`, below it),
        // so the slot's bounds check refuses it: no test of its own.
        let slot = s.slots.get_mut(link.wrapping_sub(1) as usize)?;
        if slot.next != LIVE || !verify(&slot.value) {
            return None;
        }
        slot.next = s.free;
        s.free = link;
        s.live -= 1;
        Some(slot.value)
    }

    /// Number of live values. Each shard is counted under its lock, so the
    /// answer is exact whenever no insert or remove runs concurrently.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().live).sum()
    }

    /// The first live value `f` maps to `Some`, shard by shard (each
    /// shard's lock held while it is scanned): for the rare lookups by
    /// something other than the handle.
    pub fn find_map<R>(&self, mut f: impl FnMut(&T) -> Option<R>) -> Option<R> {
        self.shards.iter().find_map(|s| {
            let guard = s.0.lock();
            guard.slots.iter().filter(|slot| slot.next == LIVE).find_map(|slot| f(&slot.value))
        })
    }
}

/// A lock for critical sections of a few instructions; see the module
/// documentation for why it spins.
struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    const fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    #[inline(always)]
    fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        SpinGuard { lock: self }
    }

    /// The lock if it is free now, without waiting.
    #[inline(always)]
    fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // Strong: a spurious failure would send a free down its slow path
        // for nothing. A guard is made only once the lock is ours: dropping
        // one releases the lock, whoever holds it.
        match self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Some(SpinGuard { lock: self }),
            Err(_) => None,
        }
    }

    /// Spins a little (the holder is a few instructions from done), then
    /// yields the CPU between tries, in case the holder was preempted.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            // Wait for a release without writing the line, then try.
            while self.locked.load(Ordering::Relaxed) {
                if spins < 64 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn handles_name_shard_and_slot_and_zero_names_nothing() {
        let t = Slots::default();
        let h = t.insert(7u32).unwrap();
        assert_ne!(h, 0);
        assert!((h >> 32) < SHARDS as u64);
        assert_eq!(t.remove(0, |_| true), None);
        assert_eq!(t.remove(h | 1 << 40, |_| true), None, "no such shard");
        assert_eq!(t.remove(h + 1, |_| true), None, "no such slot");
        assert_eq!(t.remove(h, |v| *v == 7), Some(7));
    }

    #[test]
    fn try_remove_waits_for_nothing_and_leaves_another_holder_s_lock_held() {
        let t = Slots::default();
        let h = t.insert(7u32).unwrap();
        let lock = &t.shards[(h >> 32) as usize].0;
        let held = lock.lock();
        assert!(matches!(t.try_remove(h, |_| true), Removal::Busy));
        assert!(lock.try_lock().is_none(), "a failed try must not release the holder's lock");
        drop(held);
        let try_remove = |h, v| match t.try_remove(h, |x| *x == v) {
            Removal::Busy => panic!("nobody holds the lock now"),
            Removal::Removed(x) => Some(x),
            Removal::Refused => None,
        };
        assert_eq!(try_remove(h, 8), None, "verify refuses");
        assert_eq!(try_remove(h & !0xffff_ffff, 7), None, "a low half of zero names no slot");
        assert_eq!(try_remove(h, 7), Some(7));
        assert_eq!(try_remove(h, 7), None, "already removed");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn try_insert_leaves_a_held_lock_or_an_empty_free_list_to_insert_later() {
        let t = Slots::default();
        // No free slot yet: pending, holding the lock insert_later uses.
        let Insertion::Later(p) = t.try_insert(1u32) else { panic!("a new table has no free slot") };
        assert!(p.held.is_some());
        let h1 = t.insert_later(p).unwrap();
        // A freed slot is reused on the fast path (the same thread picks
        // the same shard, as `free_slots_are_reused_last_freed_first`).
        assert_eq!(t.remove(h1, |v| *v == 1), Some(1));
        let Insertion::Inserted(h2) = t.try_insert(2u32) else { panic!("a free slot and a free lock") };
        assert_eq!(h2, h1);
        assert_eq!(t.remove(h2, |v| *v == 2), Some(2));
        // Every lock held elsewhere: pending, not holding one.
        let held: Vec<_> = t.shards.iter().map(|s| s.0.lock()).collect();
        let Insertion::Later(p) = t.try_insert(3u32) else { panic!("every lock is held") };
        assert!(p.held.is_none());
        assert_eq!(*p.value(), 3);
        drop(held);
        let h3 = t.insert_later(p).unwrap();
        assert_eq!(t.remove(h3, |v| *v == 3), Some(3));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn verify_guards_every_removal_and_a_freed_slot_is_dead() {
        let t = Slots::default();
        let h = t.insert(7u32).unwrap();
        assert_eq!(t.remove(h, |v| *v == 8), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(h, |v| *v == 7), Some(7));
        assert_eq!(t.len(), 0);
        // The stale value is still in the slot; liveness is what refuses it.
        assert_eq!(t.remove(h, |_| true), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn free_slots_are_reused_last_freed_first() {
        let t = Slots::default();
        let a = t.insert(1u32).unwrap();
        let b = t.insert(2u32).unwrap();
        assert_eq!(t.remove(a, |_| true), Some(1));
        assert_eq!(t.remove(b, |_| true), Some(2));
        assert_eq!(t.insert(3u32), Some(b));
        assert_eq!(t.insert(4u32), Some(a));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn threads_inserting_and_removing_across_shards_balance() {
        let t = Arc::new(Slots::default());
        let value = |k: usize, i: usize| (k as u64) << 32 | i as u64;
        let makers: Vec<_> = (0..4)
            .map(|k| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    (0..5_000).map(|i| t.insert(value(k, i)).unwrap()).collect::<Vec<_>>()
                })
            })
            .collect();
        let made: Vec<Vec<u64>> = makers.into_iter().map(|j| j.join().unwrap()).collect();
        assert_eq!(t.len(), 20_000);
        // Each thread frees what another made.
        let freers: Vec<_> = made
            .into_iter()
            .enumerate()
            .map(|(k, hs)| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for (i, h) in hs.into_iter().enumerate() {
                        assert_eq!(t.remove(h, |v| *v == value(k, i)), Some(value(k, i)));
                    }
                })
            })
            .collect();
        for j in freers {
            j.join().unwrap();
        }
        assert_eq!(t.len(), 0);
    }
}
