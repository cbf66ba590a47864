//! A C++ vendor includes `memplug.h` and defines the entry without an
//! `extern "C"` of its own: the header's prototype must give it C linkage,
//! so the library exports `memplug_plugin_v1` unmangled and the host finds
//! it. (Without the prototype in the header, g++ exports a mangled name and
//! the host reports "exports no memplug entry symbol".)

use memplug_host::{LoadError, Plugin};
use memplug_test_support::{
    cdylib_file_name, cxx_compiler, exported_symbols, include_dir, repo_root, run_tool, test_tmp_dir,
};

#[test]
fn a_cpp_plugin_exports_the_unmangled_entry_and_the_host_finds_it() {
    let src = repo_root().join("abi-tests/c/cpp_vendor_plugin.cpp");
    let out = test_tmp_dir("cpp-vendor-plugin").join(cdylib_file_name("cpp_vendor_plugin"));
    let mut cmd = cxx_compiler(None);
    cmd.args([
        "-std=c++11",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Wpedantic",
        "-Werror",
    ])
    .arg("-I")
    .arg(include_dir())
    .arg(&src)
    .arg("-o")
    .arg(&out);
    run_tool(cmd);
    let symbols = exported_symbols(&out);
    assert!(symbols.contains("memplug_plugin_v1"), "exports: {symbols:?}");
    match Plugin::load(&out) {
        Err(LoadError::VersionMismatch { message, .. }) => {
            assert!(message.contains("refusing on purpose"), "{message}")
        }
        other => panic!("expected the plugin's own refusal, got {other:?}"),
    }
}
