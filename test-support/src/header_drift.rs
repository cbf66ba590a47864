//! The header drift check the generated headers share: regenerate a
//! header with the pinned cbindgen and compare it with the committed one
//! (`include/memplug.h` from `sdk/src/abi/`; the host C API's topic
//! headers under `include/memplug/host/` from `capi/src`).

use std::path::Path;

/// Generates a header from `source` (the file cbindgen starts from; it
/// follows that file's `mod` declarations) with the cbindgen configuration
/// `config`, and panics unless it equals the committed header
/// `committed` byte for byte.
///
/// When the environment variable `bless_var` is set, writes the generated
/// header over `committed` instead (and passes). The failure message tells
/// how: `<bless_var>=1 cargo test -p <test_package> --test header_drift`.
///
/// # Panics
/// When the configuration cannot be read, cbindgen fails, or the header is
/// stale.
pub fn assert_committed_header_matches(
    source: &Path,
    config: &Path,
    committed: &Path,
    bless_var: &str,
    test_package: &str,
) {
    let generated = generate(&[source], read_config(config));
    assert_committed_text_matches(&generated, committed, bless_var, test_package);
}

/// Reads a cbindgen configuration file.
///
/// # Panics
/// When it cannot be read or parsed.
pub fn read_config(config: &Path) -> cbindgen::Config {
    cbindgen::Config::from_file(config).unwrap_or_else(|e| panic!("read {}: {e}", shown(config)))
}

/// The header cbindgen writes from `sources` (each parsed as a root of its
/// own, in order; cbindgen follows their `mod` declarations) with `config`.
///
/// # Panics
/// When cbindgen fails.
pub fn generate(sources: &[&Path], config: cbindgen::Config) -> String {
    let mut builder = cbindgen::Builder::new().with_config(config);
    for source in sources {
        builder = builder.with_src(source);
    }
    let names = sources.iter().map(|s| shown(s)).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    builder.generate().unwrap_or_else(|e| panic!("cbindgen failed on {names}: {e}")).write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// Panics unless `committed` holds `generated` byte for byte; when the
/// environment variable `bless_var` is set, writes `generated` over it
/// instead (and passes). The failure message tells how:
/// `<bless_var>=1 cargo test -p <test_package> --test header_drift`.
///
/// # Panics
/// When the file is stale, or cannot be written when blessing.
pub fn assert_committed_text_matches(generated: &str, committed: &Path, bless_var: &str, test_package: &str) {
    if std::env::var_os(bless_var).is_some() {
        if let Some(dir) = committed.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", shown(dir)));
        }
        std::fs::write(committed, generated).unwrap_or_else(|e| panic!("write {}: {e}", shown(committed)));
        return;
    }
    let current = std::fs::read_to_string(committed).unwrap_or_default();
    assert!(
        current == generated,
        "{} is stale: regenerate it with \
         `{bless_var}=1 cargo test -p {test_package} --test header_drift` and commit it",
        shown(committed)
    );
}

/// `p` as the repository names it (relative to its root) where it can.
fn shown(p: &Path) -> String {
    let root = crate::repo_root();
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p).display().to_string()
}
