//! The embedding example runs to the end, on the copy of the CPU plugin
//! linked into it and on the plugin's library loaded by path, and every
//! scene reports what it asserted. The program checks its own invariants
//! (it panics, and exits non-zero, when one breaks); this test holds it to
//! finishing and to saying so.

use std::path::Path;
use std::process::Command;

const SCENES: [&str; 5] = [
    "1. KV region at ",
    "2. prefix of 1 MiB mapped read-only into 2 regions",
    "3. 8 experts of 1 MiB fill the pool",
    "4. an expert released behind a fence",
    "ledger at zero",
];

fn run(plugin: Option<&Path>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memplug-example-embedding"));
    cmd.args(plugin);
    let out = cmd.output().expect("run the example");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the example failed ({}):\n{stdout}\n{stderr}", out.status);
    for scene in SCENES {
        assert!(stdout.contains(scene), "no {scene:?} in the example's output:\n{stdout}");
    }
    stdout.into_owned()
}

#[test]
fn runs_on_the_linked_cpu_plugin() {
    let out = run(None);
    assert!(out.starts_with("loaded plugin 'memplug-cpu'"), "{out}");
}

#[test]
fn runs_on_the_cpu_plugin_library_by_path() {
    let lib = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let out = run(Some(&lib));
    assert!(out.contains("unloaded"), "{out}");
}

#[test]
fn a_bare_file_name_is_refused_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_memplug-example-embedding"))
        .arg("libmemplug_plugin_cpu.so")
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.starts_with("error: ") && stderr.contains("libmemplug_plugin_cpu.so"), "{stderr}");
}
