//! The [`Hub`]: where a manager's events and its plugins' messages go.
//!
//! One listener slot for events and one for plugin messages, each set and
//! cleared at any time from any thread. A listener runs synchronously on
//! the thread the thing happened on, after the host's own books were
//! updated and with no host lock held. Clearing or replacing a listener
//! returns only once no call of the old one runs on another thread (one
//! running on the calling thread — a listener replacing itself — goes on),
//! so whatever it uses may be freed right after.
//!
//! Re-entry: anything a listener causes on its own thread (an allocation
//! that makes a grant, a call whose plugin writes a message) is *not*
//! delivered — it is counted in [`Hub::dropped`] — so a listener can never
//! recurse into itself. Reading statistics from a listener is fine. A
//! panic in a listener is caught and ignored.
//!
//! Cost when nobody listens: a fast-path grant reads one process-wide
//! word (`events_wanted`: how many hubs have an event listener), with a
//! relaxed load, and branches on it; nothing else. Slow-path events read
//! the hub's own flag as well.

use super::event::{Event, Level};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::ThreadId;

/// Hubs (of every manager in the process) that have an event listener.
static EVENT_LISTENERS: AtomicUsize = AtomicUsize::new(0);

/// Whether any event may be wanted anywhere: the fast path's one check
/// (a grant builds its event only when this is true).
#[inline(always)]
pub(crate) fn events_wanted() -> bool {
    EVENT_LISTENERS.load(Relaxed) != 0 || super::trace::events_enabled()
}

/// An event listener: called with every event of its manager.
pub type EventListener = dyn Fn(&Event<'_>) + Send + Sync;
/// A log hook: called with each plugin message, its level and its source
/// (`plugin/mechanism`).
pub type LogHook = dyn Fn(Level, &str, &str) + Send + Sync;

thread_local! {
    /// This thread is running a listener now.
    static DELIVERING: Cell<bool> = const { Cell::new(false) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One listener and the calls of it running now.
struct Installed<F: ?Sized> {
    running: Mutex<Vec<ThreadId>>,
    idle: Condvar,
    f: Box<F>,
}

/// A slot holding at most one listener.
struct Slot<F: ?Sized> {
    current: Mutex<Option<Arc<Installed<F>>>>,
    set: AtomicBool,
}

impl<F: ?Sized> Slot<F> {
    fn new() -> Self {
        Slot { current: Mutex::new(None), set: AtomicBool::new(false) }
    }

    /// Installs `f` (or clears, with `None`); `true` when the slot was set
    /// before. Waits until the old listener runs on no other thread.
    fn replace(&self, f: Option<Box<F>>) -> bool {
        let new = f.map(|f| Arc::new(Installed { running: Mutex::new(Vec::new()), idle: Condvar::new(), f }));
        let old = {
            let mut cur = lock(&self.current);
            self.set.store(new.is_some(), Relaxed);
            std::mem::replace(&mut *cur, new)
        };
        let Some(old) = old else { return false };
        let me = std::thread::current().id();
        let mut running = lock(&old.running);
        while running.iter().any(|t| *t != me) {
            running = old.idle.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        true
    }

    /// Runs `call` with the listener, if one is set; `false` when the
    /// thread was already delivering (nothing is delivered then).
    fn deliver(&self, call: impl FnOnce(&F)) -> bool {
        if !self.set.load(Relaxed) {
            return true;
        }
        let Some(l) = lock(&self.current).clone() else { return true };
        if DELIVERING.try_with(|d| d.replace(true)).unwrap_or(true) {
            return false;
        }
        let me = std::thread::current().id();
        lock(&l.running).push(me);
        // Restores the thread's mark and the running list however the
        // call ends.
        struct Done<'a, F: ?Sized>(&'a Installed<F>, ThreadId);
        impl<F: ?Sized> Drop for Done<'_, F> {
            fn drop(&mut self) {
                let _ = DELIVERING.try_with(|d| d.set(false));
                let mut r = lock(&self.0.running);
                if let Some(i) = r.iter().position(|t| *t == self.1) {
                    r.swap_remove(i);
                }
                drop(r);
                self.0.idle.notify_all();
            }
        }
        let _done = Done(&l, me);
        let _ = catch_unwind(AssertUnwindSafe(|| call(&l.f)));
        true
    }
}

/// Where a manager's events and its plugins' messages go (see the module
/// docs). Each manager has one ([`ProcessMemoryManager::hub`]); a governor
/// made on its own has its own.
///
/// Thread-safety: `Send + Sync`; every method may be called from any
/// thread, including from inside a listener.
///
/// [`ProcessMemoryManager::hub`]: crate::ProcessMemoryManager::hub
pub struct Hub {
    events: Slot<EventListener>,
    log: Slot<LogHook>,
    dropped: AtomicU64,
}

impl Hub {
    /// A hub with no listener and no hook.
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub { events: Slot::new(), log: Slot::new(), dropped: AtomicU64::new(0) })
    }

    /// Calls `f` with every later event (replacing the listener set
    /// before, if any, once its calls on other threads returned).
    pub fn set_event_listener(&self, f: impl Fn(&Event<'_>) + Send + Sync + 'static) {
        if !self.events.replace(Some(Box::new(f))) {
            EVENT_LISTENERS.fetch_add(1, Relaxed);
        }
    }

    /// Removes the event listener; returns once no call of it runs on
    /// another thread.
    pub fn clear_event_listener(&self) {
        if self.events.replace(None) {
            EVENT_LISTENERS.fetch_sub(1, Relaxed);
        }
    }

    /// Calls `f(level, source, message)` with every later message of this
    /// manager's plugins (replacing the hook set before).
    pub fn set_log_hook(&self, f: impl Fn(Level, &str, &str) + Send + Sync + 'static) {
        self.log.replace(Some(Box::new(f)));
    }

    /// Removes the log hook; returns once no call of it runs on another
    /// thread.
    pub fn clear_log_hook(&self) {
        self.log.replace(None);
    }

    /// Events and messages not delivered because they arose inside a
    /// listener on the same thread.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Delivers `e` to the listener and, with the `tracing` feature, to
    /// `tracing`.
    pub(crate) fn emit(&self, e: &Event<'_>) {
        super::trace::event(e);
        if !self.events.deliver(|f| f(e)) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Delivers a plugin's message (see [`plugin_message`]).
    fn log(&self, level: Level, source: &str, message: &str) {
        if !self.log.deliver(|f| f(level, source, message)) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if self.events.set.load(Relaxed) {
            EVENT_LISTENERS.fetch_sub(1, Relaxed);
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("events", &self.events.set.load(Relaxed))
            .field("log", &self.log.set.load(Relaxed))
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// A plugin's message: to `tracing` (with the feature) and to the log hook
/// of the manager the plugin is registered with, if any.
pub(crate) fn plugin_message(hub: Option<&Hub>, level: Level, source: &str, message: &str) {
    super::trace::message(level, source, message);
    if let Some(hub) = hub {
        hub.log(level, source, message);
    }
}

/// The way from a loaded plugin to the hub of the manager it is
/// registered with (set at registration; weak, so a plugin does not keep
/// a manager's hub alive).
#[derive(Default)]
pub(crate) struct HubLink(Mutex<Weak<Hub>>);

impl HubLink {
    pub fn attach(&self, hub: &Arc<Hub>) {
        *lock(&self.0) = Arc::downgrade(hub);
    }

    pub fn get(&self) -> Option<Arc<Hub>> {
        lock(&self.0).upgrade()
    }
}
