//! The entry symbol: negotiation of the minor with the host, the cell that
//! owns the built plugin from the first negotiation to the last `unload`,
//! and the macros that define `memplug_plugin_v1` (or an in-process twin)
//! around a plugin's init function.

use super::args::{read_in, write_out};
use super::builder::ExportedPlugin;
use super::guard::{guard, panic_text};
use crate::abi::{self, *};
use crate::author::*;
use crate::status::Status;
use core::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The storage of an entry symbol's plugin (a `static` next to the entry):
/// built on the first negotiation, freed when the last host that
/// negotiated it calls the descriptor's `unload` slot, and built again by
/// the next negotiation after that.
///
/// Every successful negotiation is one hold (a "load", in the header's
/// words) and every `unload` gives one back: two hosts sharing one loaded
/// library (`dlopen` hands both the same copy) each get the same
/// descriptor, and it outlives the first `unload`. A host that never calls
/// `unload` — it keeps a plugin whose objects are alive, or it never
/// published a load — keeps its hold, and the plugin stays built. A
/// negotiation that fails while nobody holds the plugin frees it at once.
pub struct PluginCell {
    state: Mutex<CellState>,
}

struct CellState {
    plugin: Option<ExportedPlugin>,
    /// Successful negotiations not yet given back by `unload`.
    holds: u64,
}

impl PluginCell {
    /// An empty cell, for a `static`.
    pub const fn new() -> Self {
        PluginCell { state: Mutex::new(CellState { plugin: None, holds: 0 }) }
    }

    /// Nothing the cell guards can be left half-changed by a panic (the
    /// vendor's code runs inside `catch_unwind`), so a poisoned lock is used
    /// as it is.
    fn lock(&self) -> MutexGuard<'_, CellState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a plugin is built now (for tests of the lifecycle).
    pub fn is_built(&self) -> bool {
        self.lock().plugin.is_some()
    }

    /// Gives back one hold; the last frees the plugin (outside the lock, so
    /// that the vendor's `Drop` runs without it).
    fn unload(&self) {
        let freed = {
            let mut st = self.lock();
            st.holds = st.holds.saturating_sub(1);
            if st.holds == 0 {
                st.plugin.take()
            } else {
                None
            }
        };
        drop(freed);
    }
}

impl Default for PluginCell {
    fn default() -> Self {
        PluginCell::new()
    }
}

/// What the descriptor's `unload` slot calls (through the plugin's
/// context): gives one hold on the plugin back to its cell.
///
/// # Safety
/// `cell` is the `PluginCell` the plugin was bound to.
unsafe fn release_hold(cell: *const c_void) {
    if let Some(cell) = (cell as *const PluginCell).as_ref() {
        cell.unload();
    }
}

/// The body of an entry symbol: builds the plugin if the cell holds none,
/// negotiates the minor with the host (two-sided), writes the answer, and
/// counts a hold on the plugin when it succeeded.
///
/// # Safety
/// Pointers as the entry-symbol contract (`MemplugEntryV1`) describes.
/// `cell` is a `static` (it must outlive every descriptor it hands out, and
/// never move), used with one `init` only.
pub unsafe fn negotiate(
    cell: &PluginCell,
    init: fn() -> ExportedPlugin,
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let mut unheld = None;
    let status = guard(sink, "memplug_plugin_v1", || {
        let host = read_in(host, "host info")?;
        if host.abi_major != abi::MEMPLUG_ABI_MAJOR {
            return Err(PluginError::new(
                Status::VersionMismatch,
                format!("host speaks ABI major {}, this entry serves major 1", host.abi_major),
            ));
        }
        let mut st = cell.lock();
        if st.plugin.is_none() {
            let mut built = catch_unwind(init)
                .map_err(|p| PluginError::internal(format!("plugin init panicked: {}", panic_text(&*p))))?;
            // SAFETY: `cell` is a static (this function's contract).
            built.bind(cell as *const PluginCell as *const c_void, release_hold);
            st.plugin = Some(built);
        }
        let plugin = st.plugin.as_ref().expect("built above");
        let answered = answer(plugin, &host, out);
        match answered {
            Ok(agreed) => {
                // A 1.2 host's services (zero in a shorter host struct):
                // used only at 1.2 or newer, as the ABI says.
                if agreed >= 2 {
                    plugin.attach_host(host.services);
                }
                st.holds += 1
            }
            // Nobody holds what was just built (or kept from a failed
            // negotiation): free it, after the lock is released.
            Err(_) if st.holds == 0 => unheld = st.plugin.take(),
            Err(_) => {}
        }
        answered.map(|_| ())
    });
    drop(unheld);
    status
}

/// Picks the minor and writes the answer.
unsafe fn answer(
    plugin: &ExportedPlugin,
    host: &MemplugHostInfo,
    out: *mut MemplugNegotiation,
) -> PluginResult<u32> {
    let d = plugin.descriptor();
    let lo = host.min_minor.max(d.min_minor);
    let hi = host.max_minor.min(d.max_minor);
    if lo > hi {
        return Err(PluginError::new(
            Status::VersionMismatch,
            format!(
                "no common minor: host speaks 1.{}..=1.{}, plugin speaks 1.{}..=1.{}",
                host.min_minor, host.max_minor, d.min_minor, d.max_minor
            ),
        ));
    }
    let answer = MemplugNegotiation { struct_size: 0, agreed_minor: hi, plugin: plugin.descriptor_for(hi) };
    write_out(out, &answer, "out negotiation").map(|()| hi)
}

/// Exports a plugin from a cdylib: defines the `memplug_plugin_v1` entry
/// symbol around `init: fn() -> ExportedPlugin`, with a [`PluginCell`] of
/// its own. `init` runs on the first negotiation, and again on the first
/// after the host's `unload` freed the plugin (see [`PluginCell`]): build
/// the implementation inside it, not in a `static` of your own, so that
/// what you allocate is freed with it.
///
/// ```ignore
/// memplug_sdk::export_plugin!(my_plugin);
/// fn my_plugin() -> memplug_sdk::ExportedPlugin { /* PluginBuilder … */ }
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($init:path) => {
        $crate::declare_entry!(
            /// memplug entry symbol, ABI major 1.
            #[no_mangle]
            pub memplug_plugin_v1,
            $init
        );
    };
}

/// Defines an entry function with the `memplug_plugin_v1` signature under
/// another, unexported name: for plugins linked into the host's own binary
/// and handed to the loader as an in-process entry. Each has its own
/// [`PluginCell`], so its plugin is a separate instance, built and freed as
/// for [`export_plugin!`].
#[macro_export]
macro_rules! declare_entry {
    ($(#[$attr:meta])* $vis:vis $name:ident, $init:path) => {
        $(#[$attr])*
        /// In-process memplug entry function, ABI major 1 (or, through
        /// [`export_plugin!`], the exported entry symbol).
        ///
        /// # Safety
        /// Called by a memplug host according to `memplug.h`.
        $vis unsafe extern "C" fn $name(
            host: *const $crate::abi::MemplugHostInfo,
            out: *mut $crate::abi::MemplugNegotiation,
            sink: *const $crate::abi::MemplugMessageSink,
        ) -> $crate::abi::MemplugStatus {
            static CELL: $crate::export::PluginCell = $crate::export::PluginCell::new();
            $crate::export::negotiate(&CELL, $init, host, out, sink)
        }
    };
}
