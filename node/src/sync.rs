//! The one place that chooses between `std` and `loom` for the link's gate
//! (`gate.rs`): under `RUSTFLAGS="--cfg loom"` its lock and generation are
//! loom's, so `tests/link_loom.rs` explores the real rule.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
pub(crate) use std::sync::atomic::Ordering::SeqCst;
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
pub(crate) use std::sync::TryLockError;

/// Locks, ignoring poison: the data under a gate's lock is `()`.
pub(crate) fn lock<T>(m: &Mutex<T>) -> crate::sync::Guard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(loom)]
pub(crate) type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;
#[cfg(not(loom))]
pub(crate) type Guard<'a, T> = std::sync::MutexGuard<'a, T>;
