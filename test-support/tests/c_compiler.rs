//! The compiler commands of `c_compiler` / `cxx_compiler` carry what the
//! environment asks for (`CC`, `CFLAGS`, `CXXFLAGS`), as cc-based build
//! scripts do: a flag such as `-fsanitize=address` given in `CFLAGS` then
//! reaches every C unit the tests compile.
//!
//! One test function: it changes this process's environment, which tests
//! running in parallel threads would see.

use memplug_test_support::{c_compiler, compile_c_plugin, cxx_compiler, run_tool, test_tmp_dir};
use std::process::Command;

/// Compiles `src` (C or C++) to an object file; whether it compiled.
fn compiles(mut cmd: Command, src: &str, ext: &str) -> bool {
    let dir = test_tmp_dir("c_compiler_env");
    let file = dir.join(format!("unit.{ext}"));
    std::fs::write(&file, src).unwrap();
    cmd.arg("-c").arg(&file).arg("-o").arg(dir.join("unit.o"));
    cmd.output().expect("run the compiler").status.success()
}

/// What a compiler's `--version` prints first.
fn version(mut cmd: Command) -> String {
    let out = cmd.arg("--version").output().expect("run the compiler");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_owned()
}

const NEEDS_DEFINE: &str = "#ifndef FROM_ENV\n#error FROM_ENV not defined\n#endif\nint unit;\n";

#[test]
fn the_environment_reaches_every_compile() {
    // Environment edits are safe here: this is the binary's only test and
    // it runs no other thread.
    for var in ["CC", "CXX", "CFLAGS", "CXXFLAGS", "TARGET_CFLAGS", "TARGET_CXXFLAGS"] {
        std::env::remove_var(var);
    }
    assert!(!compiles(c_compiler(None), NEEDS_DEFINE, "c"), "FROM_ENV defined without CFLAGS");

    std::env::set_var("CFLAGS", "-DFROM_ENV=1");
    assert!(compiles(c_compiler(None), NEEDS_DEFINE, "c"), "CFLAGS did not reach c_compiler(None)");
    assert!(compiles(c_compiler(Some("clang")), NEEDS_DEFINE, "c"), "CFLAGS did not reach clang");
    assert!(!compiles(cxx_compiler(None), NEEDS_DEFINE, "cpp"), "CFLAGS reached the C++ compiler");
    std::env::set_var("CXXFLAGS", "-DFROM_ENV=1");
    assert!(compiles(cxx_compiler(None), NEEDS_DEFINE, "cpp"), "CXXFLAGS did not reach cxx_compiler(None)");

    // The plugin helper too.
    let src = test_tmp_dir("c_compiler_plugin").join("p.c");
    std::fs::write(&src, NEEDS_DEFINE).unwrap();
    compile_c_plugin(&src, &[], "env_plugin");
    std::env::remove_var("CFLAGS");
    let failed = std::panic::catch_unwind(|| compile_c_plugin(&src, &[], "env_plugin")).is_err();
    assert!(failed, "compile_c_plugin compiled without the CFLAGS define");

    // A named compiler wins over CC; CC is honoured otherwise.
    std::env::set_var("CC", "clang");
    assert!(version(c_compiler(None)).contains("clang"), "CC=clang not honoured");
    assert!(!version(c_compiler(Some("gcc"))).contains("clang"), "a named compiler lost to CC");
    std::env::remove_var("CC");
    let mut cmd = c_compiler(None);
    cmd.arg("--version");
    run_tool(cmd);
}
