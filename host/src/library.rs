//! What a plugin and each of its mechanisms share: the opened library and
//! the plugin-level slots. Owned by neither side, so the loader
//! (`plugin.rs`) and the mechanism wrappers (`mechanism/`) both depend on
//! it and not on each other. Its two plugin calls (`live_objects`,
//! `unload`) mark the thread as inside plugin code, as the mechanism door
//! does, so a plugin cannot re-enter the host's C API from them.

use crate::policy::OpenLibrary;
use crate::reentry::InPluginCall;
use crate::services::ServicesInbox;
use std::ffi::c_void;
use std::mem::ManuallyDrop;

/// A validated plugin's library and descriptor slots. It stays alive as
/// long as the plugin or any of its mechanisms does; dropping the last
/// reference unloads the library (when nothing the plugin made is alive).
pub(crate) struct LoadedLibrary {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) origin: String,
    ctx: *mut c_void,
    live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    unload: Option<unsafe extern "C" fn(*mut c_void)>,
    /// This load's services table (closed before `unload`).
    pub(crate) services: ServicesInbox,
    /// The hub of the manager it is registered with: where its messages go.
    pub(crate) hub: crate::events::HubLink,
    library: ManuallyDrop<Option<OpenLibrary>>,
}

// SAFETY: the plugin's slots are callable from any thread (ABI rule), and
// the library handle is only closed once, on drop.
unsafe impl Send for LoadedLibrary {}
unsafe impl Sync for LoadedLibrary {}

impl LoadedLibrary {
    /// # Safety
    /// `live_objects` and `unload` are the validated slots of the plugin
    /// descriptor whose context is `ctx`, and their code is in `library`
    /// (or linked into the process when `library` is `None`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        name: String,
        version: String,
        origin: String,
        ctx: *mut c_void,
        live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
        unload: Option<unsafe extern "C" fn(*mut c_void)>,
        library: Option<OpenLibrary>,
        services: ServicesInbox,
    ) -> LoadedLibrary {
        LoadedLibrary {
            name,
            version,
            origin,
            ctx,
            live_objects,
            unload,
            services,
            hub: Default::default(),
            library: ManuallyDrop::new(library),
        }
    }

    /// What the plugin reports holding alive.
    pub(crate) fn plugin_live_objects(&self) -> u64 {
        let _inside = InPluginCall::enter();
        // SAFETY: validated non-NULL at load; the library is loaded while
        // `self` exists.
        unsafe { (self.live_objects)(self.ctx) }
    }
}

impl Drop for LoadedLibrary {
    fn drop(&mut self) {
        // Code of the library may still run (a stream worker, memory still
        // mapped) if the plugin holds objects: then closing it could crash
        // the host, so it stays mapped for the life of the process.
        if self.plugin_live_objects() != 0 {
            return;
        }
        // After `unload` the plugin may not call the host: its table
        // answers INVALID_STATE from now on.
        self.services.close();
        if let Some(unload) = self.unload {
            let _inside = InPluginCall::enter();
            // SAFETY: published slot, called once, after the last call.
            unsafe { unload(self.ctx) };
        }
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.library) };
    }
}
