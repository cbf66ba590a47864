//! `include/memplug.h` is generated from `sdk/src/abi/` by the pinned
//! cbindgen and committed; this test fails when regeneration would change
//! it. `MEMPLUG_BLESS=1` rewrites the committed header instead.

use std::path::PathBuf;

#[test]
fn committed_header_matches_generated() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    memplug_test_support::header_drift::assert_committed_header_matches(
        &root.join("sdk/src/abi/mod.rs"),
        &root.join("cbindgen.toml"),
        &root.join("include/memplug.h"),
        "MEMPLUG_BLESS",
        "memplug-abi-tests",
    );
}
