//! Whether the running thread is inside plugin code the host called: set by
//! every call into a plugin (the mechanism door, the entry point, the
//! plugin-level slots), read by host entry points that plugin code could
//! reach on the same thread (the C API refuses them as re-entrant).

use std::cell::Cell;

std::thread_local! {
    /// How many plugin calls the running thread is inside (nested when a
    /// plugin's code reaches the host, which calls a plugin again).
    static PLUGIN_CALL_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether the running thread is inside a call into plugin code made by
/// this host: a slot of any mechanism or a plugin's entry point. True, for
/// example, in a host function a plugin runs inline inside
/// `enqueue_host_fn`, or in a C API function a plugin calls from a slot; false
/// on a plugin's own worker threads, which are not inside a call from the
/// host. One thread-local load.
#[inline]
pub fn inside_plugin_call() -> bool {
    PLUGIN_CALL_DEPTH.with(|d| d.get() != 0)
}

/// Marks the running thread as inside plugin code while it lives.
pub(crate) struct InPluginCall(());

impl InPluginCall {
    #[inline(always)]
    pub(crate) fn enter() -> InPluginCall {
        // Cannot overflow: each level is a plugin call on this thread's
        // stack, which runs out long before u32 does.
        PLUGIN_CALL_DEPTH.with(|d| d.set(d.get().wrapping_add(1)));
        InPluginCall(())
    }
}

impl Drop for InPluginCall {
    #[inline(always)]
    fn drop(&mut self) {
        PLUGIN_CALL_DEPTH.with(|d| d.set(d.get().wrapping_sub(1)));
    }
}
