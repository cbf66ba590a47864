//! The variants of `abi-tests/c/bad_plugin.c` that test how the host
//! contains a plugin breaking the contract at run time (host functions run
//! twice or after a refusal, overlapping blocks, exported and lent
//! descriptors, control characters in names, second frees), compiled on
//! demand like `memplug_test_support::bad_plugin`.
//!
//! They are listed here rather than in `memplug_test_support::
//! BAD_PLUGIN_VARIANTS` only while that list is being moved between crates;
//! every check the shared list gets (the `#error` guard and header comment
//! of the C source, exported symbols, a row in MISBEHAVIOURS.md) is made for
//! these too, by the tests that include this module.

#![allow(dead_code)]

use memplug_host::{LoadOptions, Plugin};
use memplug_test_support::{compile_c_plugin, repo_root};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The containment variants, each one fault (see the header comment of
/// `bad_plugin.c` and `abi-tests/MISBEHAVIOURS.md`).
pub const CONTAINMENT_VARIANTS: &[&str] = &[
    "BAD_HOST_FN_TWICE",
    "BAD_HOST_FN_REFUSED_RUNS",
    "BAD_HOST_FN_LATE",
    "BAD_OVERLAPPING_BLOCKS",
    "BAD_EXPORT_FD_STDIN",
    "BAD_EXPORT_FD_CLOSED",
    "BAD_EXPORT_FD_PIPE",
    "BAD_IMPORT_CLOSES_FD",
    "BAD_ESCAPES_IN_NAMES",
    "BAD_DOUBLE_FREE_WITNESS",
    "BAD_SINK_LATE",
    "BAD_MESSAGE_LEN_LIES",
    "BAD_OVERSIZED_BLOCK",
    "BAD_EXPORT_NOT_MEMFD",
];

/// The shared library of one containment variant, compiled once per
/// process (safe from parallel tests).
pub fn contained_plugin(variant: &str) -> PathBuf {
    contained_plugin_copy(variant, "")
}

/// Another file of the same variant, compiled once per `(variant, copy)`:
/// a test that needs a fresh set of the plugin's counters (a second load,
/// other options) loads a copy, never the same file again. A library
/// opened twice is one library, with one set of counters, and a file the
/// loader already has mapped is found again under a second name.
pub fn contained_plugin_copy(variant: &str, copy: &str) -> PathBuf {
    type Cache = Mutex<HashMap<(String, String), Arc<OnceLock<PathBuf>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    assert!(
        CONTAINMENT_VARIANTS.contains(&variant),
        "unknown containment variant {variant:?}; known: {CONTAINMENT_VARIANTS:?}"
    );
    let cell = {
        let mut map = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        map.entry((variant.to_owned(), copy.to_owned())).or_default().clone()
    };
    cell.get_or_init(|| {
        let src = repo_root().join("abi-tests").join("c").join("bad_plugin.c");
        let mut name = format!("bad_plugin_{}", variant.to_ascii_lowercase());
        if !copy.is_empty() {
            name = format!("{name}_{copy}");
        }
        compile_c_plugin(&src, &[variant], &name)
    })
    .clone()
}

/// The options the containment tests load with: the overlap check on
/// explicitly (its default depends on the build profile).
pub fn checked() -> LoadOptions {
    LoadOptions { check_overlaps: memplug_host::OverlapCheck::All, ..LoadOptions::default() }
}

/// Loads a containment variant with [`checked`] options.
pub fn load_contained(variant: &str) -> Plugin {
    Plugin::load_with(contained_plugin(variant), &checked())
        .unwrap_or_else(|e| panic!("{variant} was refused: {e}"))
}
