//! Runs the `kv_transfer` example (cargo builds examples for `cargo test`):
//! two processes, a prompt crossing once into a shared prefix mapped into
//! two regions, blocks pulled by block table, every pool exact.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let p = profile.join("examples").join("kv_transfer");
    assert!(p.is_file(), "{} not built (cargo test builds the crate's examples)", p.display());
    p
}

#[test]
fn the_kv_transfer_example_runs_between_two_processes() {
    let Some(()) = common::ucx_or_skip("the_kv_transfer_example_runs_between_two_processes") else { return };
    let plugin = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let out =
        Command::new(example()).env("MEMPLUG_CPU_PLUGIN", plugin).env_remove("UCX_TLS").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("pulled once and mapped read-only into 2 regions"), "{stdout}");
    assert!(stdout.contains("pools exact"), "{stdout}");
}
