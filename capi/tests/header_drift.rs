//! `include/memplug_host.h` is generated from `capi/src` by the pinned
//! cbindgen (`capi/cbindgen.toml`) and committed; this test fails when
//! regeneration would change it. `MEMPLUG_BLESS=1` rewrites the committed
//! header instead.

use std::path::PathBuf;

#[test]
fn committed_header_matches_generated() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // cbindgen follows the `mod` declarations of lib.rs to every module.
    memplug_test_support::header_drift::assert_committed_header_matches(
        &crate_dir.join("src/lib.rs"),
        &crate_dir.join("cbindgen.toml"),
        &crate_dir.join("../include/memplug_host.h"),
        "MEMPLUG_BLESS",
        "memplug-host-capi",
    );
}
