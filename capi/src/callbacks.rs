//! Running the C caller's callbacks: the userdata it passes along, the mark
//! of a thread inside a callback, and the guards that refuse re-entrant
//! calls instead of deadlocking.

use crate::error::{Error, Result};
use crate::manager_tables::RegionEntry;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::Region;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// A raw pointer the C caller promised may be used from any thread.
#[derive(Clone, Copy)]
pub(crate) struct UserData(pub *mut c_void);
// SAFETY: the C API documents that userdata is passed to callbacks on any
// thread; making that safe is the caller's contract.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

thread_local! {
    /// Callbacks of the C caller this thread is running now.
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
    /// Of those, lifecycle callbacks.
    static IN_LIFECYCLE: Cell<u32> = const { Cell::new(0) };
    static THREAD_TOKEN: u8 = const { 0 };
}

/// Marks this thread as running a C callback while it lives.
pub(crate) struct CallbackScope(());

impl CallbackScope {
    pub(crate) fn enter() -> CallbackScope {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get() + 1));
        CallbackScope(())
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Refuses a call that must not run inside a callback.
pub(crate) fn not_in_callback(what: &str) -> Result<()> {
    if IN_CALLBACK.try_with(|c| c.get()).unwrap_or(0) > 0 {
        return Err(Error::new(
            S::Reentrant,
            format!("{what} is not allowed inside a callback the host is running"),
        ));
    }
    Ok(())
}

/// Marks this thread as running a C lifecycle callback (and so a callback)
/// while it lives.
pub(crate) struct LifecycleScope(#[allow(dead_code)] CallbackScope);

impl LifecycleScope {
    pub(crate) fn enter() -> LifecycleScope {
        let _ = IN_LIFECYCLE.try_with(|c| c.set(c.get() + 1));
        LifecycleScope(CallbackScope::enter())
    }
}

impl Drop for LifecycleScope {
    fn drop(&mut self) {
        let _ = IN_LIFECYCLE.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Refuses a call that delivers lifecycle events (or waits for them)
/// inside a lifecycle callback: delivered there, an event of the same
/// context would reach the other subscribers before the one being
/// delivered.
pub(crate) fn not_in_lifecycle_callback(what: &str) -> Result<()> {
    if IN_LIFECYCLE.try_with(|c| c.get()).unwrap_or(0) > 0 {
        return Err(Error::new(
            S::Reentrant,
            format!(
                "{what} is not allowed inside a lifecycle callback (it delivers lifecycle events): \
                 do it after the callback returns"
            ),
        ));
    }
    Ok(())
}

/// A number naming this thread among live threads (never 0).
pub(crate) fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| t as *const u8 as u64)
}

/// Locks a region for this thread, refusing re-entry from a callback run
/// while this thread already holds it.
pub(crate) fn lock_region(entry: &RegionEntry) -> Result<RegionLock<'_>> {
    let me = thread_token();
    if entry.owner.load(Ordering::Acquire) == me {
        return Err(Error::new(
            S::Reentrant,
            "this region's grow is running the callback that made this call",
        ));
    }
    let guard = entry.region.lock().unwrap_or_else(|p| p.into_inner());
    entry.owner.store(me, Ordering::Release);
    Ok(RegionLock { entry, guard })
}

pub(crate) struct RegionLock<'a> {
    entry: &'a RegionEntry,
    pub guard: std::sync::MutexGuard<'a, Region>,
}

impl Drop for RegionLock<'_> {
    fn drop(&mut self) {
        self.entry.owner.store(0, Ordering::Release);
    }
}
