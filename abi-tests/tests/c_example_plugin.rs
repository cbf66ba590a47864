//! The C example plugins build with gcc and clang under the strict plugin
//! flags, and keep their contract:
//! * `c-examples/plugin/example_plugin.c` (1.0): `test_example_plugin.c`, a
//!   C host, loads each build with dlopen and checks negotiation, prefix
//!   reads and writes, identity and range checks, messages, exact
//!   `live_objects` and thread safety;
//! * `c-examples/plugin/full_plugin.c` (1.0..=1.3): `test_full_plugin.c`
//!   checks each minor's descriptor, one state per load, every table,
//!   stream order, copy, queued binding, typed export and the loss.
//!
//! (ctest runs the same hosts against the CMake build, and the full plugin
//! under ASan+UBSan too.)

use memplug_test_support::{
    c_compiler, compile_c_plugin_with, include_dir, repo_root, run_tool, test_tmp_dir, STRICT_WARNINGS,
};
use std::process::Command;

fn contract_holds_with(compiler: &str) {
    holds_with(compiler, "example_plugin");
}

/// Builds `c-examples/plugin/<name>.c` and its host `test_<name>.c` with
/// `compiler` and runs the host on the plugin.
fn holds_with(compiler: &str, name: &str) {
    let dir = repo_root().join("c-examples/plugin");
    let plugin =
        compile_c_plugin_with(compiler, &dir.join(format!("{name}.c")), &[], &format!("memplug_{name}"));

    let exe = test_tmp_dir(&format!("test_{name}-{compiler}")).join(format!("test_{name}"));
    let mut cmd = c_compiler(Some(compiler));
    cmd.arg("-std=c99")
        .args(STRICT_WARNINGS)
        .arg("-I")
        .arg(include_dir())
        .arg(dir.join(format!("test_{name}.c")))
        .arg("-o")
        .arg(&exe)
        .args(["-lpthread", "-ldl"]);
    run_tool(cmd);

    let out = Command::new(&exe).arg(&plugin).output().expect("run the C host");
    assert!(
        out.status.success(),
        "c-examples/plugin/{name}.c built with {compiler} broke its contract ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn contract_holds_gcc() {
    contract_holds_with("gcc");
}

#[test]
fn contract_holds_clang() {
    contract_holds_with("clang");
}

#[test]
fn full_plugin_contract_holds_gcc() {
    holds_with("gcc", "full_plugin");
}

#[test]
fn full_plugin_contract_holds_clang() {
    holds_with("clang", "full_plugin");
}
