//! `include/memplug_host.h` is generated from `capi/src` by the pinned
//! cbindgen (`capi/cbindgen.toml`) and committed; this test fails when
//! regeneration would change it. `MEMPLUG_BLESS=1` rewrites the committed
//! header instead.

use std::path::PathBuf;

#[test]
fn committed_header_matches_generated() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir.join("..");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read capi/cbindgen.toml");
    // cbindgen follows the `mod` declarations of lib.rs to every module.
    let builder = cbindgen::Builder::new().with_config(config).with_src(crate_dir.join("src/lib.rs"));
    let mut out = Vec::new();
    builder.generate().expect("cbindgen failed on capi/src").write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = root.join("include/memplug_host.h");
    if std::env::var_os("MEMPLUG_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/memplug_host.h is stale: regenerate it with \
         `MEMPLUG_BLESS=1 cargo test -p memplug-host-capi --test header_drift` and commit it"
    );
}
