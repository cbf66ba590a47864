//! The entry symbol: negotiation of the minor with the host, and the macros
//! that define `memplug_plugin_v1` (or an in-process twin) around a
//! plugin's init function.

use super::args::{read_in, write_out};
use super::builder::ExportedPlugin;
use super::guard::{guard, panic_text};
use crate::abi::{self, *};
use crate::author::*;
use crate::status::Status;
use std::panic::catch_unwind;
use std::sync::OnceLock;

/// Storage for a plugin built on first negotiation.
pub type PluginCell = OnceLock<Result<ExportedPlugin, String>>;

/// The body of an entry symbol: builds the plugin once, negotiates the minor
/// with the host (two-sided), writes the answer.
///
/// # Safety
/// Pointers as the entry-symbol contract (`MemplugEntryV1`) describes.
pub unsafe fn negotiate(
    cell: &PluginCell,
    init: fn() -> ExportedPlugin,
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "memplug_plugin_v1", || {
        let host = read_in(host, "host info")?;
        if host.abi_major != abi::MEMPLUG_ABI_MAJOR {
            return Err(PluginError::new(
                Status::VersionMismatch,
                format!("host speaks ABI major {}, this entry serves major 1", host.abi_major),
            ));
        }
        let plugin = cell
            .get_or_init(|| {
                catch_unwind(init).map_err(|p| format!("plugin init panicked: {}", panic_text(&*p)))
            })
            .as_ref()
            .map_err(|e| PluginError::internal(e.clone()))?;
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
        let answer =
            MemplugNegotiation { struct_size: 0, agreed_minor: hi, plugin: plugin.descriptor_for(hi) };
        write_out(out, &answer, "out negotiation")
    })
}

/// Exports a plugin from a cdylib: defines the `memplug_plugin_v1` entry
/// symbol around `init: fn() -> ExportedPlugin`.
///
/// ```ignore
/// memplug_sdk::export_plugin!(my_plugin);
/// fn my_plugin() -> memplug_sdk::ExportedPlugin { /* PluginBuilder … */ }
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($init:path) => {
        /// memplug entry symbol, ABI major 1.
        ///
        /// # Safety
        /// Called by a memplug host according to `memplug.h`.
        #[no_mangle]
        pub unsafe extern "C" fn memplug_plugin_v1(
            host: *const $crate::abi::MemplugHostInfo,
            out: *mut $crate::abi::MemplugNegotiation,
            sink: *const $crate::abi::MemplugMessageSink,
        ) -> $crate::abi::MemplugStatus {
            static CELL: $crate::export::PluginCell = $crate::export::PluginCell::new();
            $crate::export::negotiate(&CELL, $init, host, out, sink)
        }
    };
}

/// Defines an entry function with the `memplug_plugin_v1` signature under
/// another, unexported name: for plugins linked into the host's own binary
/// and handed to the loader as an in-process entry.
#[macro_export]
macro_rules! declare_entry {
    ($vis:vis $name:ident, $init:path) => {
        /// In-process memplug entry function, ABI major 1.
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
