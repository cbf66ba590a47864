//! The header drift check both generated headers share: regenerate a
//! header with the pinned cbindgen and compare it with the committed one
//! (`include/memplug.h` from `sdk/src/abi.rs`, `include/memplug_host.h`
//! from `capi/src`).

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
    let root = crate::repo_root();
    let shown = |p: &Path| {
        let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p).display().to_string()
    };
    let config_cfg =
        cbindgen::Config::from_file(config).unwrap_or_else(|e| panic!("read {}: {e}", shown(config)));
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config_cfg)
        .with_src(source)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed on {}: {e}", shown(source)))
        .write(&mut out);
    let generated = String::from_utf8(out).expect("cbindgen writes UTF-8");
    if std::env::var_os(bless_var).is_some() {
        std::fs::write(committed, &generated).unwrap_or_else(|e| panic!("write {}: {e}", shown(committed)));
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
