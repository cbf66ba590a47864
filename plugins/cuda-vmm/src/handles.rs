//! Handle tables: a `slab::Slab` behind a mutex. A handle is the slab key
//! plus one, so zero never names anything and a lookup is an index, never a
//! hash of an address. Keys are reused, so every lookup also takes a
//! `verify` predicate that checks what the host says against what was
//! issued (object id, address and size; or a serial number).

use slab::Slab;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A slab of `T` behind a mutex.
pub struct Table<T> {
    slab: Mutex<Slab<T>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { slab: Mutex::new(Slab::new()) }
    }
}

fn key_of(handle: u64) -> Option<usize> {
    usize::try_from(handle.checked_sub(1)?).ok()
}

impl<T> Table<T> {
    /// Locks the slab. Nothing run under the lock panics on input a caller
    /// controls, so a poisoned lock still guards consistent data.
    fn lock(&self) -> MutexGuard<'_, Slab<T>> {
        self.slab.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `value`; returns its handle.
    pub fn insert(&self, value: T) -> u64 {
        self.lock().insert(value) as u64 + 1
    }

    /// Runs `f` on the entry `handle` names, if `verify` accepts it.
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

    /// Removes and returns the entry `handle` names, if `verify` accepts it.
    pub fn remove(&self, handle: u64, verify: impl FnOnce(&T) -> bool) -> Option<T> {
        let key = key_of(handle)?;
        let mut slab = self.lock();
        if !slab.get(key).is_some_and(verify) {
            return None;
        }
        Some(slab.remove(key))
    }

    /// Runs `f` on the entry `handle` names, if `verify` accepts it, and
    /// removes the entry when `f` says so (`(remove, result)`): deciding and
    /// removing under one lock keeps reference counts exact.
    pub fn update<R>(
        &self,
        handle: u64,
        verify: impl FnOnce(&T) -> bool,
        f: impl FnOnce(&mut T) -> (bool, R),
    ) -> Option<(Option<T>, R)> {
        let key = key_of(handle)?;
        let mut slab = self.lock();
        let entry = slab.get_mut(key).filter(|e| verify(e))?;
        let (remove, r) = f(entry);
        Some((remove.then(|| slab.remove(key)), r))
    }

    /// The first live entry `f` maps to `Some` (the lock held while it
    /// scans): for the rare lookups by something other than the handle.
    pub fn find_map<R>(&self, f: impl FnMut(&T) -> Option<R>) -> Option<R> {
        self.lock().iter().map(|(_, v)| v).find_map(f)
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
    fn verify_guards_every_access_and_zero_names_nothing() {
        let t = Table::default();
        let h = t.insert(7u32);
        assert_ne!(h, 0);
        assert_eq!(t.with(0, |_| true, |v| *v), None);
        assert_eq!(t.with(h, |v| *v == 8, |v| *v), None);
        assert_eq!(t.remove(h, |v| *v == 8), None);
        assert_eq!(t.update(h, |_| true, |v| (false, *v)), Some((None, 7)));
        assert_eq!(t.update(h, |_| true, |_| (true, ())), Some((Some(7), ())));
        assert_eq!(t.remove(h, |_| true), None);
        assert_eq!(t.len(), 0);
    }
}
