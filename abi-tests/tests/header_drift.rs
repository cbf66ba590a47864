//! `include/memplug.h` is generated from `sdk/src/abi.rs` by the pinned
//! cbindgen and committed; this test fails when regeneration would change
//! it. `MEMPLUG_BLESS=1` rewrites the committed header instead.

use std::path::PathBuf;

#[test]
fn committed_header_matches_generated() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("sdk/src/abi.rs"))
        .generate()
        .expect("cbindgen failed on sdk/src/abi.rs")
        .write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = root.join("include/memplug.h");
    if std::env::var_os("MEMPLUG_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/memplug.h is stale: regenerate it with \
         `MEMPLUG_BLESS=1 cargo test -p memplug-abi-tests --test header_drift` and commit it"
    );
}
