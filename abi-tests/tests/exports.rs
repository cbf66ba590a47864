//! A plugin exports only its versioned entry symbols (ARCHITECTURE.md section 3,
//! Symbols): the dynamic symbol table of each plugin library, read as the
//! conformance kit reads it (`memplug_conformance::elf::exported_symbols`:
//! defined, global or weak, default or protected visibility, version
//! definitions left out), lists exactly `memplug_plugin_v1`.
//!
//! * the reference CPU plugin cdylib (`libmemplug_plugin_cpu.so`, built by
//!   cargo because `memplug-plugin-cpu` is a dev-dependency; override the
//!   path with `MEMPLUG_CPU_PLUGIN`): its entry, and at most the device-loss
//!   test trigger the kit allows (`memplug_conformance::LOSS_TRIGGERS`);
//! * the C example plugin, compiled here with gcc and clang;
//! * the bad plugin fixture: the default and every variant export exactly
//!   their entry symbol (`BAD_NO_ENTRY` exports the wrong name instead);
//! * the C example plugin linked with a standard version script
//!   (`abi-tests/c/versioned_plugin.map`): the linker's `MEMPLUG_1.0`
//!   version symbol is not an export.

mod contained;

use contained::{contained_plugin, CONTAINMENT_VARIANTS};
use memplug_test_support::{
    bad_plugin, c_compiler, compile_c_plugin, compile_c_plugin_with, find_cdylib, include_dir, repo_root,
    run_tool, test_tmp_dir, BAD_PLUGIN_VARIANTS, C_PLUGIN_FLAGS,
};
use std::collections::BTreeSet;
use std::path::Path;

fn exactly(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// What `lib` exports, read by the conformance kit's ELF reader.
fn exported_symbols(lib: &Path) -> BTreeSet<String> {
    memplug_conformance::elf::exported_symbols(lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .into_iter()
        .collect()
}

fn assert_exports(lib: &Path, expected: &[&str]) {
    let got = exported_symbols(lib);
    assert_eq!(got, exactly(expected), "{} must export exactly {expected:?}", lib.display());
}

/// The CPU plugin exports its entry and, besides it, at most a device-loss
/// test trigger the conformance kit knows by name
/// (`memplug_conformance::LOSS_TRIGGERS`: its test switch
/// `memplug_cpu_test_report_loss`, off unless `MEMPLUG_CPU_TEST_SWITCHES=1`
/// when the plugin is built); nothing else.
#[test]
fn cpu_plugin_exports_only_the_entry_symbol() {
    let lib = find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let mut got = exported_symbols(&lib);
    assert!(got.remove(memplug_sdk::abi::MEMPLUG_ENTRY_SYMBOL_V1), "{} has no entry symbol", lib.display());
    let others: Vec<&String> = got.iter().filter(|s| !memplug_conformance::is_loss_trigger(s)).collect();
    assert!(others.is_empty(), "{} exports {others:?} besides its entry and loss triggers", lib.display());
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

#[test]
fn containment_variants_export_only_their_entry_symbol() {
    for pair in CONTAINMENT_VARIANTS.chunks(2) {
        std::thread::scope(|s| {
            for v in pair {
                s.spawn(move || assert_exports(&contained_plugin(v), &["memplug_plugin_v1"]));
            }
        });
    }
}

#[test]
fn a_version_script_exports_only_the_entry_symbol() {
    let dir = test_tmp_dir("versioned_plugin");
    let lib = dir.join("libversioned_plugin.so");
    let map = repo_root().join("abi-tests/c/versioned_plugin.map");
    let mut cmd = c_compiler(None);
    cmd.args(C_PLUGIN_FLAGS)
        .arg("-I")
        .arg(include_dir())
        .arg(repo_root().join("c-examples/plugin/example_plugin.c"))
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg("-o")
        .arg(&lib)
        .arg("-lpthread");
    run_tool(cmd);
    // The version node is in the dynamic symbol table (what `nm -D` shows
    // as `A MEMPLUG_1.0`), and is not an export.
    let raw = std::fs::read(&lib).unwrap();
    assert!(raw.windows(12).any(|w| w == b"MEMPLUG_1.0\0"), "the version script was not applied");
    assert_exports(&lib, &["memplug_plugin_v1"]);
}
