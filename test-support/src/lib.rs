//! Helpers for tests anywhere in the workspace that need the repository's
//! sources, a plugin library cargo built, a scratch directory, a C
//! compiler, or a misbehaving plugin.
//!
//! * [`repo_root`], [`include_dir`]: where the sources are.
//! * [`find_cdylib`]: a cdylib built by cargo as a dependency of the test.
//! * [`test_tmp_dir`]: a fresh scratch directory under `target/`.
//! * [`run_tool`]: a compiler or other tool that must succeed.
//! * [`c_compiler`] / [`cxx_compiler`]: the compiler command the `cc` crate
//!   finds (`CC`, `CFLAGS`, …); every compilation in the tests starts there.
//! * [`compile_c_plugin`] / [`compile_c_plugin_with`]: a C plugin built with
//!   the strict flags every C plugin here must pass.
//! * [`bad_plugin`]: one variant of `abi-tests/c/bad_plugin.c`, compiled once
//!   per process.
//! * [`exported_symbols`]: what a shared library exports (`nm -D`).
//! * [`fd_passing`]: a descriptor sent to a child process over a Unix
//!   socket (`SCM_RIGHTS`), and the wait for the child to connect.
//! * [`readme`]: a README snippet held to the compiled source it copies.
//! * `header_drift` (feature `header-drift`): a committed header compared
//!   with what the pinned cbindgen generates now.
//!
//! All helpers panic with a message that says what failed (they are for
//! tests). Compilers are found as the `cc` crate finds them (`CC`, `CXX`,
//! `CFLAGS`, `CXXFLAGS`, else `cc` and `c++` from `PATH`); `nm` from `PATH`. The ABI layout tables
//! are not here: they belong to the ABI tests (`memplug_abi_tests::layout`).

mod bad_plugin;
pub mod fd_passing;
#[cfg(feature = "header-drift")]
pub mod header_drift;
mod paths;
pub mod readme;
mod tools;

pub use bad_plugin::{bad_plugin, BAD_PLUGIN_VARIANTS};
pub use paths::{cdylib_file_name, find_cdylib, include_dir, repo_root, target_dir, test_tmp_dir};
pub use tools::{
    c_compiler, compile_c_plugin, compile_c_plugin_with, cxx_compiler, exported_symbols, run_tool,
    C_PLUGIN_FLAGS, STRICT_WARNINGS,
};
