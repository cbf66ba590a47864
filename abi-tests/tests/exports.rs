//! A plugin exports only its versioned entry symbols (DESIGN.md section 3,
//! Symbols): `nm -D --defined-only` of each plugin library lists exactly
//! `memplug_plugin_v1`.
//!
//! * the reference CPU plugin cdylib (`libmemplug_plugin_cpu.so`, built by
//!   cargo because `memplug-plugin-cpu` is a dev-dependency; override the
//!   path with `MEMPLUG_CPU_PLUGIN`);
//! * the C example plugin, compiled here with gcc and clang;
//! * the bad plugin fixture: the default and every variant export exactly
//!   their entry symbol (`BAD_NO_ENTRY` exports the wrong name instead).

use memplug_test_support::{
    bad_plugin, compile_c_plugin, compile_c_plugin_with, exported_symbols, find_cdylib, repo_root,
    BAD_PLUGIN_VARIANTS,
};
use std::collections::BTreeSet;
use std::path::Path;

fn exactly(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn assert_exports(lib: &Path, expected: &[&str]) {
    let got = exported_symbols(lib);
    assert_eq!(got, exactly(expected), "{} must export exactly {expected:?}", lib.display());
}

#[test]
fn cpu_plugin_exports_only_the_entry_symbol() {
    let lib = find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    assert_exports(&lib, &[memplug_sdk::abi::MEMPLUG_ENTRY_SYMBOL_V1]);
}

#[test]
fn c_example_plugin_exports_only_the_entry_symbol() {
    let src = repo_root().join("c-examples/plugin/example_plugin.c");
    let lib = compile_c_plugin(&src, &[], "memplug_example_plugin");
    assert_exports(&lib, &["memplug_plugin_v1"]);
    let lib = compile_c_plugin_with("clang", &src, &[], "memplug_example_plugin");
    assert_exports(&lib, &["memplug_plugin_v1"]);
}

#[test]
fn bad_plugins_export_only_their_entry_symbol() {
    assert_exports(&bad_plugin(None), &["memplug_plugin_v1"]);
    // Compile the variants two at a time (bad_plugin caches each one).
    for pair in BAD_PLUGIN_VARIANTS.chunks(2) {
        std::thread::scope(|s| {
            for v in pair {
                s.spawn(move || {
                    let expected = if *v == "BAD_NO_ENTRY" { "memplug_plugin" } else { "memplug_plugin_v1" };
                    assert_exports(&bad_plugin(Some(v)), &[expected]);
                });
            }
        });
    }
}
