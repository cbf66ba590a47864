//! The one place that chooses between `std` and `loom` for the slot table
//! ([`crate::slot_table`]).
//!
//! Built with `RUSTFLAGS="--cfg loom"`, every atomic, lock, thread-local and
//! the cell holding a table's values are loom's models of them, so
//! `tests/slot_table_loom.rs` explores the real code paths (and loom checks
//! every access to a stored value against the state word's ordering). The
//! rest of the crate keeps using `std` directly: only the table's protocol
//! is modelled.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

use std::mem::MaybeUninit;
use std::sync::PoisonError;

/// Locks, ignoring poison: no caller code runs under a table lock, and the
/// table's data is consistent at every unlock point.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A number no other free list of this process has (of this execution,
/// under loom: its thread-locals, which the numbers index, are per
/// execution too, so the numbers restart with them).
#[cfg(not(loom))]
pub(crate) fn next_list_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
#[cfg(loom)]
pub(crate) fn next_list_id() -> usize {
    loom::lazy_static! {
        static ref NEXT: loom::sync::atomic::AtomicUsize = loom::sync::atomic::AtomicUsize::new(0);
    }
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The value of an atomic reached through `&mut` (no other thread can see
/// it): `get_mut` for std, `with_mut` for loom.
#[cfg(not(loom))]
pub(crate) fn exclusive_u64(a: &mut AtomicU64) -> u64 {
    *a.get_mut()
}
#[cfg(loom)]
pub(crate) fn exclusive_u64(a: &mut AtomicU64) -> u64 {
    a.with_mut(|v| *v)
}

/// [`exclusive_u64`] for a pointer.
#[cfg(not(loom))]
pub(crate) fn exclusive_ptr<T>(a: &mut AtomicPtr<T>) -> *mut T {
    *a.get_mut()
}
#[cfg(loom)]
pub(crate) fn exclusive_ptr<T>(a: &mut AtomicPtr<T>) -> *mut T {
    a.with_mut(|v| *v)
}

#[cfg(not(loom))]
type Cell<T> = std::cell::UnsafeCell<MaybeUninit<T>>;
#[cfg(loom)]
type Cell<T> = loom::cell::UnsafeCell<MaybeUninit<T>>;

/// A slot's value: written once by the inserting thread, shared by pinned
/// readers, moved out or dropped by the thread that frees the slot. The
/// table's state word says which of these may happen; under loom every
/// access is also checked against that ordering.
pub(crate) struct ValueCell<T> {
    cell: Cell<T>,
}

#[cfg(not(loom))]
impl<T> ValueCell<T> {
    #[inline]
    fn with_mut<R>(&self, f: impl FnOnce(*mut MaybeUninit<T>) -> R) -> R {
        f(self.cell.get())
    }

    /// Shared access to the value.
    ///
    /// # Safety
    /// The cell holds a value that is neither moved out nor dropped while
    /// the returned reference lives.
    #[inline]
    pub(crate) unsafe fn get(&self) -> &T {
        // SAFETY: initialised and not mutated, by the caller's contract.
        unsafe { (*self.cell.get()).assume_init_ref() }
    }
}

#[cfg(loom)]
impl<T> ValueCell<T> {
    fn with_mut<R>(&self, f: impl FnOnce(*mut MaybeUninit<T>) -> R) -> R {
        self.cell.with_mut(f)
    }

    /// Shared access to the value; loom records the read when the
    /// reference is taken (the reference outlives loom's closure by design:
    /// the caller's pin keeps the value in place).
    ///
    /// # Safety
    /// As the std version.
    pub(crate) unsafe fn get(&self) -> &T {
        // SAFETY: initialised and not mutated, by the caller's contract.
        self.cell.with(|p| unsafe { &*(*p).as_ptr() })
    }
}

impl<T> ValueCell<T> {
    pub(crate) fn uninit() -> Self {
        ValueCell { cell: Cell::new(MaybeUninit::uninit()) }
    }

    /// Stores a value.
    ///
    /// # Safety
    /// The caller owns the slot exclusively and the cell holds no value.
    #[inline]
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: exclusive access, by the caller's contract.
        self.with_mut(|p| unsafe {
            (*p).write(v);
        });
    }

    /// Moves the value out.
    ///
    /// # Safety
    /// The caller owns the slot exclusively and the cell holds a value,
    /// which it no longer holds afterwards.
    #[inline]
    pub(crate) unsafe fn take(&self) -> T {
        // SAFETY: exclusive access to an initialised value.
        self.with_mut(|p| unsafe { (*p).assume_init_read() })
    }

    /// Runs `f` on the value, then drops it, in place (no move). Should
    /// `f` panic, the value is left in the cell, never dropped (leaked).
    ///
    /// # Safety
    /// As [`take`](Self::take).
    #[inline]
    pub(crate) unsafe fn update_then_drop(&self, f: impl FnOnce(&mut T)) {
        // SAFETY: exclusive access to an initialised value.
        self.with_mut(|p| unsafe {
            f((*p).assume_init_mut());
            (*p).assume_init_drop();
        });
    }

    /// Drops the value in place.
    ///
    /// # Safety
    /// As [`take`](Self::take).
    #[inline]
    pub(crate) unsafe fn drop_in_place(&self) {
        // SAFETY: exclusive access to an initialised value.
        self.with_mut(|p| unsafe { (*p).assume_init_drop() });
    }
}
