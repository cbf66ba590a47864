//! The one place that chooses between `std` and `loom` synchronisation.
//!
//! Built with `RUSTFLAGS="--cfg loom"`, every atomic, lock, condition
//! variable and thread-local the governor's protocol depends on is loom's
//! model of it, so `tests/governor_loom.rs` explores the real code paths.
//! `Arc` stays `std`'s in both builds: reference counts are not part of the
//! protocol being checked, and `self: &Arc<Self>` receivers need std's type.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread_local;

use std::sync::PoisonError;
use std::time::Duration;

/// Identity of the running thread (loom's threads share one OS thread).
#[cfg(loom)]
pub(crate) type ThreadId = loom::thread::ThreadId;
#[cfg(not(loom))]
pub(crate) type ThreadId = std::thread::ThreadId;

#[cfg(loom)]
pub(crate) fn current_thread_id() -> ThreadId {
    loom::thread::current().id()
}
#[cfg(not(loom))]
pub(crate) fn current_thread_id() -> ThreadId {
    std::thread::current().id()
}

/// Locks, ignoring poison: no user code ever runs under a governor lock, so
/// a poisoned lock can only come from a panic in the governor's own
/// bookkeeping, whose data stays consistent at every unlock point.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `Condvar::wait_timeout`, ignoring poison (see [`lock`]).
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    dur: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, dur) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}

/// `Condvar::wait`, ignoring poison (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}
