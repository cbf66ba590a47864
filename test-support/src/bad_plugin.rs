//! Misbehaving plugin fixtures: the variants of `abi-tests/c/bad_plugin.c`,
//! compiled on demand. Used by the ABI tests (`abi-tests/tests`) and by the
//! conformance kit's tests (`cli/tests/conformance.rs`).

use crate::paths::repo_root;
use crate::tools::compile_c_plugin;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The variants of `abi-tests/c/bad_plugin.c` (its header comment says what
/// each does and what a correct host must do with it; `abi-tests/
/// MISBEHAVIOURS.md` adds the conformance check that catches each). `None`
/// is the default: a correct minimal plugin.
pub const BAD_PLUGIN_VARIANTS: &[&str] = &[
    "BAD_NO_ENTRY",
    "BAD_WRONG_MAJOR",
    "BAD_VERSION_REFUSE",
    "BAD_AGREED_MINOR",
    "BAD_SHORT_PLUGIN",
    "BAD_SHORT_MECHANISM",
    "BAD_SHORT_ALLOCATOR",
    "BAD_NULL_ALLOCATE",
    "BAD_NULL_ALLOCATOR",
    "BAD_FLAG_WITHOUT_POINTER",
    "BAD_POINTER_WITHOUT_FLAG",
    "BAD_UNKNOWN_STATUS",
    "BAD_ZERO_MECHANISMS",
    "BAD_NULL_NAME",
    "BAD_DUPLICATE_ID",
    "BAD_ENTRY_FAILS",
    "BAD_NO_LIVE_OBJECTS",
    "BAD_LIVE_FOREVER",
    "BAD_NULL_PLUGIN",
    "BAD_UNKNOWN_CAPS",
    "BAD_UNKNOWN_DEVICE_KIND",
    "BAD_LONG_STRUCTS",
    "BAD_CAPS_ABOVE_MINOR",
    "BAD_UNKNOWN_ACCESS",
    "BAD_MESSAGE_UNTERMINATED",
    "BAD_MESSAGE_OVERLONG",
    "BAD_NULL_BLOCK",
    "BAD_MISALIGNED_BLOCK",
    "BAD_RANGE_UNCHECKED",
    "BAD_COMMITTED_LIES",
    "BAD_FORGED_FENCE",
    "BAD_FENCE_NEVER",
    "BAD_DUPLICATE_NAME",
    "BAD_SINK_TWICE",
    "BAD_SINK_OTHER_THREAD",
    "BAD_REENTRANT_ENTRY",
    "BAD_LIVE_ZERO",
    "BAD_DEALLOC_ANY",
    "BAD_DOUBLE_FREE_OK",
    "BAD_WRITES_OUT_ON_FAILURE",
    "BAD_NEGOTIATE_LAX",
    "BAD_READ_ONLY_WRITABLE",
];

/// The shared library of one variant of `abi-tests/c/bad_plugin.c`
/// (`None`: the correct default), compiled by [`compile_c_plugin`] the first
/// time it is asked for in this process and reused after that. Safe to call
/// from tests running in parallel.
///
/// # Panics
/// On a name not in [`BAD_PLUGIN_VARIANTS`] (a typo would otherwise build
/// the correct plugin silently), or when the compiler fails.
pub fn bad_plugin(variant: Option<&str>) -> PathBuf {
    type Cache = Mutex<HashMap<Option<String>, Arc<OnceLock<PathBuf>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    if let Some(v) = variant {
        assert!(
            BAD_PLUGIN_VARIANTS.contains(&v),
            "unknown bad_plugin variant {v:?}; known: {BAD_PLUGIN_VARIANTS:?}"
        );
    }
    let cell = {
        let mut map = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        map.entry(variant.map(str::to_owned)).or_default().clone()
    };
    // Compiling outside the map's lock lets variants build in parallel.
    cell.get_or_init(|| {
        let src = repo_root().join("abi-tests").join("c").join("bad_plugin.c");
        let out_name = match variant {
            Some(v) => format!("bad_plugin_{}", v.to_ascii_lowercase()),
            None => "bad_plugin_default".to_owned(),
        };
        let defines: Vec<&str> = variant.into_iter().collect();
        compile_c_plugin(&src, &defines, &out_name)
    })
    .clone()
}
