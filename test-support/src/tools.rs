//! Running tools: compilers with the repository's strict flags, and `nm`.

use crate::paths::{cdylib_file_name, include_dir, test_tmp_dir};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Warning flags every C translation unit in this repository compiles with.
pub const STRICT_WARNINGS: &[&str] = &["-Wall", "-Wextra", "-Wpedantic", "-Werror"];

/// The flags [`compile_c_plugin`] uses: C99, position-independent shared
/// library, only `MEMPLUG_EXPORT` symbols visible, strict warnings.
pub const C_PLUGIN_FLAGS: &[&str] =
    &["-std=c99", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wpedantic", "-Werror"];

/// Runs a compiler (or any tool); panics with the command line and its
/// output unless it succeeds.
pub fn run_tool(mut cmd: Command) {
    let out =
        cmd.output().unwrap_or_else(|e| panic!("cannot run {:?}: {e} (is it installed?)", cmd.get_program()));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles one C source into a plugin shared library with `gcc` and the
/// strict plugin flags ([`C_PLUGIN_FLAGS`]: `-std=c99 -shared -fPIC
/// -fvisibility=hidden -Wall -Wextra -Wpedantic -Werror`), with `include/`
/// on the include path, linked with `-lpthread`.
///
/// `defines` are passed as `-D<define>` (`"NAME"` or `"NAME=VALUE"`).
/// The library is `lib<out_name>.so` in a fresh directory from
/// [`test_tmp_dir`]; its path is returned.
///
/// # Panics
/// When the compiler fails (the message has its output).
pub fn compile_c_plugin(src: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    compile_c_plugin_with("gcc", src, defines, out_name)
}

/// [`compile_c_plugin`] with another compiler (`"clang"`, `"cc"`, …).
pub fn compile_c_plugin_with(compiler: &str, src: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    let dir = test_tmp_dir(&format!("{out_name}-{compiler}"));
    let out = dir.join(cdylib_file_name(out_name));
    let mut cmd = Command::new(compiler);
    cmd.args(C_PLUGIN_FLAGS)
        .arg("-I")
        .arg(include_dir())
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(src)
        .arg("-o")
        .arg(&out)
        .arg("-lpthread");
    run_tool(cmd);
    out
}

/// The dynamic symbols a shared library defines (`nm -D --defined-only`).
///
/// # Panics
/// When `nm` fails.
pub fn exported_symbols(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm: {e} (binutils installed?)"));
    assert!(
        out.status.success(),
        "nm -D --defined-only {} failed: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // Lines are "<address> <type> <name>".
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let _addr = parts.next()?;
            let _kind = parts.next()?;
            parts.next().map(str::to_owned)
        })
        .collect()
}
