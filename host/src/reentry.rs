//! Whether the running thread is inside plugin code the host called: set by
//! every call into a plugin (the mechanism door, the entry point, the
//! plugin-level slots), read by host entry points that plugin code could
//! reach on the same thread (the C API refuses them as re-entrant).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// What the host keeps per thread: one thread-local, so the door into a
/// plugin pays for one thread-local access.
struct ThreadState {
    /// How many plugin calls the running thread is inside (nested when a
    /// plugin's code reaches the host, which calls a plugin again).
    depth: Cell<u32>,
    /// The thread's stripe of striped counters (the operation gate, the
    /// ledgers): chosen round-robin the first time the thread needs one.
    stripe: Cell<u32>,
}

const NO_STRIPE: u32 = u32::MAX;
static NEXT_STRIPE: AtomicU32 = AtomicU32::new(0);

std::thread_local! {
    static THREAD: ThreadState = const { ThreadState { depth: Cell::new(0), stripe: Cell::new(NO_STRIPE) } };
}

impl ThreadState {
    #[inline(always)]
    fn stripe(&self) -> usize {
        let s = self.stripe.get();
        if s != NO_STRIPE {
            return s as usize;
        }
        self.first_stripe()
    }

    #[cold]
    fn first_stripe(&self) -> usize {
        let s = NEXT_STRIPE.fetch_add(1, Relaxed) % 1024;
        self.stripe.set(s);
        s as usize
    }
}

/// The running thread's stripe (see [`crate::lifecycle`]).
#[inline(always)]
pub(crate) fn thread_stripe() -> usize {
    THREAD.with(ThreadState::stripe)
}

/// Whether the running thread is inside a call into plugin code made by
/// this host: a slot of any mechanism or a plugin's entry point. True, for
/// example, in a host function a plugin runs inline inside
/// `enqueue_host_fn`, or in a C API function a plugin calls from a slot; false
/// on a plugin's own worker threads, which are not inside a call from the
/// host. One thread-local load.
#[inline]
pub fn inside_plugin_call() -> bool {
    THREAD.with(|t| t.depth.get() != 0)
}

/// Marks the running thread as inside plugin code while it lives.
pub(crate) struct InPluginCall(());

impl InPluginCall {
    #[inline(always)]
    pub(crate) fn enter() -> InPluginCall {
        // Cannot overflow: each level is a plugin call on this thread's
        // stack, which runs out long before u32 does.
        THREAD.with(|t| t.depth.set(t.depth.get().wrapping_add(1)));
        InPluginCall(())
    }

    /// [`enter`](Self::enter), also returning the thread's stripe: the
    /// door needs both, for one thread-local access.
    #[inline(always)]
    pub(crate) fn enter_striped() -> (InPluginCall, usize) {
        let stripe = THREAD.with(|t| {
            t.depth.set(t.depth.get().wrapping_add(1));
            t.stripe()
        });
        (InPluginCall(()), stripe)
    }
}

impl Drop for InPluginCall {
    #[inline(always)]
    fn drop(&mut self) {
        THREAD.with(|t| t.depth.set(t.depth.get().wrapping_sub(1)));
    }
}
