//! Finding and loading the plugin a command works on.

use memplug_host::{LoadError, LoadOptions, Plugin};
use std::path::{Path, PathBuf};

/// File name of the reference CPU plugin library.
pub const CPU_PLUGIN_FILE: &str = "libmemplug_plugin_cpu.so";
/// The label of the CPU plugin linked into this binary (its in-process
/// origin is `memplug-cpu (in-process)`).
pub const CPU_PLUGIN_LABEL: &str = "memplug-cpu";
/// Environment variable naming the CPU plugin library explicitly.
pub const CPU_PLUGIN_ENV: &str = "MEMPLUG_CPU_PLUGIN";

/// Where the reference CPU plugin library is: `$MEMPLUG_CPU_PLUGIN`, else
/// beside this executable (a cargo target folder or `bin/`), in its
/// `deps/`, or in `../lib/` (an installed layout).
pub fn cpu_plugin_path() -> Option<PathBuf> {
    // Ignored in setuid/setgid processes (loading policy).
    if let Some(p) = memplug_host::policy::env_override(CPU_PLUGIN_ENV) {
        return Some(p);
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join(CPU_PLUGIN_FILE),
        dir.join("deps").join(CPU_PLUGIN_FILE),
        dir.join("../lib").join(CPU_PLUGIN_FILE),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Loads `path`, or the reference CPU plugin: its library when found, else
/// the copy linked into this binary (through the same validation). `path`
/// (and `$MEMPLUG_CPU_PLUGIN`) is loaded under the host's loading policy
/// (`memplug_host::policy::open_checked`): a path such as `./libx.so`; a
/// bare file name is refused with a message saying so, never searched for.
pub fn load(path: Option<&Path>) -> Result<Plugin, LoadError> {
    match path {
        Some(p) => Plugin::load(p),
        None => match cpu_plugin_path() {
            Some(p) => Plugin::load(p),
            // SAFETY: the entry is the reference plugin's, built from this
            // workspace against the same ABI.
            None => unsafe {
                Plugin::from_entry(
                    memplug_plugin_cpu::cpu_plugin_entry,
                    CPU_PLUGIN_LABEL,
                    &LoadOptions::default(),
                )
            },
        },
    }
}
