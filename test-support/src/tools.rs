//! Running tools: compilers with the repository's strict flags, and `nm`.
//!
//! Every C and C++ compilation of the tests starts from [`c_compiler`] or
//! [`cxx_compiler`], so a compiler or flags chosen in the environment (`CC`,
//! `CFLAGS=-fsanitize=address`, …) reach all of them, as they reach the
//! build scripts of crates that use `cc`.

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

/// The C compiler the `cc` crate finds, as a command to add arguments to:
/// `compiler` when given (for the tests that must use `gcc` or `clang`),
/// else `CC` (`CC_<target>`, `TARGET_CC`) or the platform's `cc`. Its first
/// arguments are `CFLAGS` (and its per-target forms), or `-Wall -Wextra`
/// without them; none of `cc`'s own defaults (optimisation, `-fPIC`, debug
/// info): callers say what they need.
///
/// # Panics
/// When `cc` cannot find or run the compiler.
pub fn c_compiler(compiler: Option<&str>) -> Command {
    compiler_command(compiler, false)
}

/// [`c_compiler`] for C++: `CXX` and `CXXFLAGS`, or the platform's `c++`.
pub fn cxx_compiler(compiler: Option<&str>) -> Command {
    compiler_command(compiler, true)
}

fn compiler_command(compiler: Option<&str>, cpp: bool) -> Command {
    let mut build = cc::Build::new();
    build
        .cpp(cpp)
        .target(env!("MEMPLUG_TEST_SUPPORT_TARGET"))
        .host(env!("MEMPLUG_TEST_SUPPORT_HOST"))
        // Set because cc reads them from cargo's build-script environment
        // otherwise; with no_default_flags they add no flag.
        .opt_level(0)
        .debug(false)
        .no_default_flags(true)
        .cargo_metadata(false)
        .cargo_warnings(false);
    if let Some(c) = compiler {
        build.compiler(c);
    }
    let tool = build
        .try_get_compiler()
        .unwrap_or_else(|e| panic!("no {} compiler ({compiler:?}): {e}", if cpp { "C++" } else { "C" }));
    tool.to_command()
}

/// Runs a compiler (or any tool); panics with the command line and its
/// output unless it succeeds.
pub fn run_tool(mut cmd: Command) {
    let out =
        cmd.output().unwrap_or_else(|e| panic!("cannot run {:?}: {e} (is it installed?)", cmd.get_program()));
    // The program and arguments only: `Command`'s Debug form would list the
    // whole environment, which `cc`'s commands carry.
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        out.status.success(),
        "{line} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles one C source into a plugin shared library with the C compiler
/// of [`c_compiler`] (`CC`, else `cc`) and the strict plugin flags ([`C_PLUGIN_FLAGS`]: `-std=c99 -shared -fPIC
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
    compile_plugin(None, src, defines, out_name)
}

/// [`compile_c_plugin`] with a named compiler (`"gcc"`, `"clang"`, …),
/// still with `CFLAGS`.
pub fn compile_c_plugin_with(compiler: &str, src: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    compile_plugin(Some(compiler), src, defines, out_name)
}

fn compile_plugin(compiler: Option<&str>, src: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    let dir = test_tmp_dir(&format!("{out_name}-{}", compiler.unwrap_or("cc")));
    let out = dir.join(cdylib_file_name(out_name));
    let mut cmd = c_compiler(compiler);
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
