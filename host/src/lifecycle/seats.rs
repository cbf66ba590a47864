//! Seats: counters that only one thread writes, so that counting costs a
//! load and a store, not a locked read-modify-write.
//!
//! Every thread that calls into the host takes a *seat* the first time it
//! needs one: an index that no other live thread holds (given back when the
//! thread exits, and handed to a later thread). A [`PerSeat`] keeps one
//! cell per seat, on a cache line of its own, so two threads never write
//! one cell or one line. The operation gate, the ledgers and the
//! live-object counts are kept this way: a thread adds to its own cell with
//! a plain load and store, and a reader sums every cell with wrapping
//! arithmetic (a charge made on one thread and refunded on another leaves
//! one cell up and another down by the same amount).
//!
//! A seat's cells carry over to the next thread that takes it: the seat
//! table's lock orders the last writes of the thread that gave it back
//! before the first reads of the one that takes it.
//!
//! Seats are numbered from 0 and reused before new ones are made, so a
//! process with `n` live threads uses the first `n`. Past [`SEATS`] live
//! threads, and on a thread that is exiting (its seat already given back),
//! a thread sits on the [`SHARED_SEAT`], whose cells every such thread
//! writes with read-modify-writes: slower, never wrong.

use crate::sync::{AtomicPtr, AtomicU64};
use std::sync::atomic::Ordering::{self, AcqRel, Acquire, Relaxed};
use std::sync::Mutex as StdMutex;

/// Seats per chunk of cells (a chunk is made the first time a thread of
/// its range counts something in that `PerSeat`).
#[cfg(not(loom))]
const CHUNK: usize = 64;
/// Chunks per `PerSeat`: room for 4,096 threads alive at once.
#[cfg(not(loom))]
const CHUNKS: usize = 64;
// Under loom every cell a closer reads is a branch of the model: two
// seats of their own (two chunks of one) are enough for its threads.
#[cfg(loom)]
const CHUNK: usize = 1;
#[cfg(loom)]
const CHUNKS: usize = 2;
/// Seats with cells of their own.
pub(crate) const SEATS: usize = CHUNK * CHUNKS;
/// The seat of every thread without one of its own.
pub const SHARED_SEAT: usize = SEATS;

/// Seats given back, and the next never handed out. A `std` lock in both
/// builds: it is taken once per thread, outside every protocol the loom
/// models check.
static TABLE: StdMutex<Table> = StdMutex::new(Table { next: 0, free: Vec::new() });

struct Table {
    next: usize,
    free: Vec<usize>,
}

/// A seat for the running thread: the lowest given back, else a new one,
/// else the shared seat.
pub(crate) fn take_seat() -> usize {
    let mut t = crate::sync::lock_std(&TABLE);
    if let Some(i) = t.free.iter().enumerate().min_by_key(|(_, s)| **s).map(|(i, _)| i) {
        return t.free.swap_remove(i);
    }
    if t.next < SEATS {
        t.next += 1;
        return t.next - 1;
    }
    SHARED_SEAT
}

/// Gives a seat back (its thread is exiting and holds no token).
pub(crate) fn give_back_seat(seat: usize) {
    if seat < SEATS {
        crate::sync::lock_std(&TABLE).free.push(seat);
    }
}

/// A cell on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);

/// One cell of `T` per seat: the first chunk's inline (most processes
/// have fewer live threads than a chunk holds, and their cells are then
/// found without a pointer to follow), the others made a chunk at a time;
/// plus the shared seat's.
pub(crate) struct PerSeat<T: Default> {
    first: [Padded<T>; CHUNK],
    more: [AtomicPtr<[Padded<T>; CHUNK]>; CHUNKS - 1],
    shared: Padded<T>,
}

impl<T: Default> Default for PerSeat<T> {
    fn default() -> Self {
        PerSeat {
            first: std::array::from_fn(|_| Padded::default()),
            more: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            shared: Padded::default(),
        }
    }
}

/// A seat's cell, and whether the running thread is its only writer.
pub(crate) struct SeatCell<'a, T> {
    cell: &'a T,
    owned: bool,
}

// A reference and a flag: copied whatever `T` is (a derive would ask
// `T: Copy`).
impl<T> Clone for SeatCell<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SeatCell<'_, T> {}

impl<'a, T> SeatCell<'a, T> {
    /// One field of the cell, written as the cell is.
    #[inline(always)]
    pub(crate) fn field<U>(self, f: impl FnOnce(&'a T) -> &'a U) -> SeatCell<'a, U> {
        SeatCell { cell: f(self.cell), owned: self.owned }
    }

    /// The cell itself (to tell cells apart).
    pub(crate) fn get(self) -> &'a T {
        self.cell
    }
}

impl SeatCell<'_, AtomicU64> {
    /// Adds `v` (wrapping: a subtraction is the negated value): a load and
    /// a store where the running thread is the cell's only writer, a
    /// read-modify-write on the shared seat. `order` is the write's:
    /// `Relaxed` or `Release`.
    #[inline(always)]
    pub(crate) fn add(self, v: u64, order: Ordering) {
        if self.owned {
            self.cell.store(self.cell.load(Relaxed).wrapping_add(v), order);
        } else {
            self.cell.fetch_add(v, order);
        }
    }
}

impl<T: Default> PerSeat<T> {
    /// The cell of `seat` (the running thread's).
    #[inline(always)]
    pub(crate) fn cell(&self, seat: usize) -> SeatCell<'_, T> {
        if seat < CHUNK {
            return SeatCell { cell: &self.first[seat].0, owned: true };
        }
        self.cell_further(seat)
    }

    #[cold]
    #[inline(never)]
    fn cell_further(&self, seat: usize) -> SeatCell<'_, T> {
        if seat >= SEATS {
            return SeatCell { cell: &self.shared.0, owned: false };
        }
        let slot = &self.more[seat / CHUNK - 1];
        let mut chunk = slot.load(Acquire);
        if chunk.is_null() {
            let made = Box::into_raw(Box::new(std::array::from_fn(|_| Padded::default())));
            chunk = match slot.compare_exchange(std::ptr::null_mut(), made, AcqRel, Acquire) {
                Ok(_) => made,
                Err(theirs) => {
                    // SAFETY: `made` was never published.
                    drop(unsafe { Box::from_raw(made) });
                    theirs
                }
            };
        }
        // SAFETY: a published chunk is never freed before `self` (see
        // `Drop`), and was fully made before its release.
        SeatCell { cell: unsafe { &(*chunk)[seat % CHUNK].0 }, owned: true }
    }

    /// Every cell made so far: the shared seat's, the first chunk's, then
    /// the others made.
    pub(crate) fn each(&self) -> impl Iterator<Item = &T> {
        let more = self.more.iter().filter_map(|c| {
            let p = c.load(Acquire);
            // SAFETY: as in `cell_further`.
            (!p.is_null()).then(|| unsafe { &*p })
        });
        let cells = std::iter::once(&self.first).chain(more).flat_map(|c| c.iter().map(|p| &p.0));
        std::iter::once(&self.shared.0).chain(cells)
    }
}

impl<T: Default> Drop for PerSeat<T> {
    fn drop(&mut self) {
        for c in &self.more {
            let p = c.load(Relaxed);
            if !p.is_null() {
                // SAFETY: made by `Box::into_raw` in `cell_further`,
                // published once, freed once here.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

// SAFETY: the chunks are owned (freed in `Drop`) and hold `T`s; sharing
// them is sharing `T`s.
unsafe impl<T: Default + Send> Send for PerSeat<T> {}
// SAFETY: as above.
unsafe impl<T: Default + Sync> Sync for PerSeat<T> {}

/// The sum of one counter over every seat.
pub(crate) fn sum<T: Default>(p: &PerSeat<T>, field: impl Fn(&T) -> &AtomicU64) -> u64 {
    p.each().fold(0u64, |n, c| n.wrapping_add(field(c).load(Acquire)))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_seat_is_never_held_by_two_live_threads_and_is_reused_after_exit() {
        let held: Vec<usize> = (0..4).map(|_| take_seat()).collect();
        let mut sorted = held.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 4, "{held:?}");
        give_back_seat(held[2]);
        let again = take_seat();
        assert!(!held.iter().enumerate().any(|(i, s)| i != 2 && *s == again), "{again} is held");
        for s in [held[0], held[1], again, held[3]] {
            give_back_seat(s);
        }
    }

    #[test]
    fn counts_made_on_one_seat_and_undone_on_another_sum_exactly() {
        let p: PerSeat<AtomicU64> = PerSeat::default();
        p.cell(3).add(5, Relaxed);
        p.cell(200).add(2u64.wrapping_neg(), Relaxed);
        p.cell(SHARED_SEAT).add(1, Relaxed);
        assert_eq!(sum(&p, |c| c), 4);
        // Chunks past the first are made only where a seat counted.
        assert_eq!(p.each().count(), 1 + 2 * CHUNK);
        assert_eq!(p.each().map(|c| c.load(Relaxed)).filter(|v| *v != 0).count(), 3);
    }
}
