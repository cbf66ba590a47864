//! Where things are: the repository's sources, cargo's target directory, a
//! cdylib cargo built, and fresh scratch directories.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The workspace root (the directory holding `include/`, `sdk/`, …).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("test-support lives in the workspace root");
    root.canonicalize().unwrap_or_else(|_| root.to_path_buf())
}

/// `include/` of the workspace: where `memplug.h` is.
pub fn include_dir() -> PathBuf {
    repo_root().join("include")
}

/// The directory of the running test executable: `target/<profile>/deps`.
fn exe_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().expect("test executable has a directory").to_path_buf()
}

/// Cargo's target directory, found from the running executable: the nearest
/// ancestor holding `CACHEDIR.TAG` (cargo writes one there), or else two
/// levels above `deps/`.
pub fn target_dir() -> PathBuf {
    let dir = exe_dir();
    for a in dir.ancestors() {
        if a.join("CACHEDIR.TAG").is_file() {
            return a.to_path_buf();
        }
    }
    let profile = if dir.file_name() == Some(OsStr::new("deps")) {
        dir.parent().unwrap_or(&dir).to_path_buf()
    } else {
        dir.clone()
    };
    profile.parent().unwrap_or(&profile).to_path_buf()
}

/// A fresh, empty directory under `target/tmp/memplug-test-support/<pid>/`,
/// named after `name`; unique within the process, so tests running at the
/// same time never share one. Directories left by processes that are no
/// longer running are removed the first time this is called.
pub fn test_tmp_dir(name: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    static SWEPT: OnceLock<()> = OnceLock::new();
    let base = target_dir().join("tmp").join("memplug-test-support");
    SWEPT.get_or_init(|| sweep_dead_process_dirs(&base));
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(std::process::id().to_string()).join(format!("{seq:03}-{}", sanitize(name)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn sweep_dead_process_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// File name of a shared library called `name` on this platform
/// (`libname.so` on Linux).
pub fn cdylib_file_name(name: &str) -> String {
    format!("{}{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// Finds the cdylib of crate library `name` (for example
/// `"memplug_plugin_cpu"`) that cargo built for this test.
///
/// If the environment variable `env_override` is set, its value is the path
/// (it must exist). Otherwise the library is looked for next to the running
/// test executable, in `target/<profile>/deps/` first (where cargo puts a
/// cdylib built as a dependency: list the crate in the test crate's
/// `[dev-dependencies]`) and then in `target/<profile>/` (where `cargo
/// build` puts it).
///
/// # Panics
/// When the library is not found; the message lists the paths tried.
pub fn find_cdylib(name: &str, env_override: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_override) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env_override}={} does not name a file", p.display());
        return p;
    }
    let file = cdylib_file_name(name);
    let deps = exe_dir();
    let mut tried = vec![deps.join(&file)];
    if let Some(profile) = deps.parent() {
        tried.push(profile.join(&file));
    }
    for p in &tried {
        if p.is_file() {
            return p.clone();
        }
    }
    panic!(
        "{file} not found (tried {}). List its crate under [dev-dependencies] of the test's \
         crate so cargo builds it, or set {env_override}=/path/to/{file}",
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    );
}
