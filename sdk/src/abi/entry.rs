//! The entry point: its type and its symbol name, per major.

use super::*;

/// Signature of the entry symbol `memplug_plugin_v1`.
///
/// The host calls it once per load, first, from one thread. The plugin checks
/// `host` (major, minor range), picks the agreed minor, and writes `out`
/// (never past `out->struct_size`). On failure it returns a status (for a
/// version mismatch `MEMPLUG_STATUS_VERSION_MISMATCH`) and may explain it
/// through `sink`.
pub type MemplugEntryV1 = unsafe extern "C" fn(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus;

/// Name of the major-1 entry symbol.
pub const MEMPLUG_ENTRY_SYMBOL_V1: &str = "memplug_plugin_v1";
