//! Handle tables: a slab behind one mutex. A handle is the slab key plus
//! one, so a zeroed handle never names anything and a lookup is an index,
//! not a hash of an address.
//!
//! A key alone is not an identity (slots are reused), so every lookup also
//! takes a `verify` predicate: objects check the host's `object_id`,
//! address and size; streams and fences check a serial number.

use slab::Slab;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A handle for slab key `key`.
#[inline]
pub fn handle_of(key: usize) -> u64 {
    key as u64 + 1
}

/// The slab key a handle names, if it could name one at all.
#[inline]
pub fn key_of(handle: u64) -> Option<usize> {
    usize::try_from(handle.checked_sub(1)?).ok()
}

/// A slab of `T` behind a mutex.
pub struct Table<T> {
    slab: Mutex<Slab<T>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { slab: Mutex::new(Slab::new()) }
    }
}

impl<T> Table<T> {
    /// Locks the slab. A panic inside a plugin call is caught by the SDK and
    /// could leave the mutex poisoned; nothing run under these locks panics
    /// on anything a caller controls, so the data would still be consistent
    /// and the poison is ignored rather than failing every later call.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Slab<T>> {
        self.slab.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `value` and returns its handle.
    #[inline]
    pub fn insert(&self, value: T) -> u64 {
        handle_of(self.lock().insert(value))
    }

    /// Runs `f` on the entry `handle` names if `verify` accepts it; `None`
    /// when there is no such entry.
    #[inline]
    pub fn with<R>(
        &self,
        handle: u64,
        verify: impl FnOnce(&T) -> bool,
        f: impl FnOnce(&mut T) -> R,
    ) -> Option<R> {
        let key = key_of(handle)?;
        let mut slab = self.lock();
        let entry = slab.get_mut(key).filter(|e| verify(e))?;
        Some(f(entry))
    }

    /// Removes and returns the entry `handle` names if `verify` accepts it.
    #[inline]
    pub fn remove(&self, handle: u64, verify: impl FnOnce(&T) -> bool) -> Option<T> {
        let key = key_of(handle)?;
        let mut slab = self.lock();
        if !slab.get(key).is_some_and(verify) {
            return None;
        }
        Some(slab.remove(key))
    }

    /// Runs `f` on the entry `handle` names if `verify` accepts it, and
    /// removes the entry when `f` says so: `None` when there is no such
    /// entry, `Some(Some(entry))` when it was removed. Deciding and
    /// removing under one lock is what keeps reference counts exact.
    pub fn update(
        &self,
        handle: u64,
        verify: impl FnOnce(&T) -> bool,
        f: impl FnOnce(&mut T) -> bool,
    ) -> Option<Option<T>> {
        let key = key_of(handle)?;
        let mut slab = self.lock();
        let entry = slab.get_mut(key).filter(|e| verify(e))?;
        Some(f(entry).then(|| slab.remove(key)))
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_keys_plus_one_and_zero_names_nothing() {
        assert_eq!(handle_of(0), 1);
        assert_eq!(key_of(1), Some(0));
        assert_eq!(key_of(0), None);
    }

    #[test]
    fn verify_guards_every_access() {
        let t = Table::default();
        let h = t.insert(7u32);
        assert_eq!(t.with(h, |v| *v == 8, |v| *v), None);
        assert_eq!(t.remove(h, |v| *v == 8), None);
        assert_eq!(t.with(h, |v| *v == 7, |v| *v), Some(7));
        assert_eq!(t.remove(h, |v| *v == 7), Some(7));
        assert_eq!(t.remove(h, |_| true), None);
        assert_eq!(t.with(h + 1, |_| true, |v| *v), None);
        assert_eq!(t.len(), 0);
    }
}
