//! The one place that chooses between `std` and `loom` synchronisation, for
//! the whole host: the governor, the deferred-free queue, bindings, the
//! registry and the manager take their atomics and locks from here.
//!
//! Built with `RUSTFLAGS="--cfg loom"`, every atomic, lock, condition
//! variable and thread-local the host's protocols depend on is loom's model
//! of it, so `tests/governor_loom.rs` and `tests/deferred_loom.rs` explore
//! the real code paths. (Under loom, a lock can only be created inside a
//! loom model; the loom tests build pools and queues, nothing that loads a
//! plugin.) `Arc` stays `std`'s in both builds: reference counts are not
//! part of the protocols being checked, and `self: &Arc<Self>` receivers
//! need std's type.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
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

/// Locks, ignoring poison. No caller's code runs under a host lock (no
/// pressure callback, no grow update, no plugin call under the queue's or
/// the registry's lock), so a poisoned lock can only come from a panic in
/// the host's own bookkeeping, whose data stays consistent at every unlock
/// point.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for a lock that stays `std`'s under loom: a `static` (loom's
/// locks cannot be made in a constant) outside every protocol loom checks.
pub(crate) fn lock_std<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
