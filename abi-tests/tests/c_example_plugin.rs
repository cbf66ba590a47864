//! The C example plugin (`c-examples/plugin/example_plugin.c`) builds with
//! gcc and clang under the strict plugin flags, and keeps its contract:
//! `c-examples/plugin/test_example_plugin.c`, a C host, loads each build
//! with dlopen and checks negotiation, prefix reads and writes, identity and
//! range checks, messages, exact `live_objects` and thread safety. (ctest
//! runs the same host against the CMake build.)

use memplug_test_support::{
    c_compiler, compile_c_plugin_with, include_dir, repo_root, run_tool, test_tmp_dir, STRICT_WARNINGS,
};
use std::process::Command;

fn contract_holds_with(compiler: &str) {
    let dir = repo_root().join("c-examples/plugin");
    let plugin =
        compile_c_plugin_with(compiler, &dir.join("example_plugin.c"), &[], "memplug_example_plugin");

    let exe = test_tmp_dir(&format!("test_example_plugin-{compiler}")).join("test_example_plugin");
    let mut cmd = c_compiler(Some(compiler));
    cmd.arg("-std=c99")
        .args(STRICT_WARNINGS)
        .arg("-I")
        .arg(include_dir())
        .arg(dir.join("test_example_plugin.c"))
        .arg("-o")
        .arg(&exe)
        .args(["-lpthread", "-ldl"]);
    run_tool(cmd);

    let out = Command::new(&exe).arg(&plugin).output().expect("run test_example_plugin");
    assert!(
        out.status.success(),
        "the C example plugin built with {compiler} broke its contract ({}):\n{}{}",
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
