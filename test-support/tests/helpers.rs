//! The helpers themselves: paths point into this repository, scratch
//! directories are fresh and distinct, lookups fail with a useful message.

use memplug_test_support::{
    bad_plugin, cdylib_file_name, find_cdylib, include_dir, repo_root, target_dir, test_tmp_dir,
    BAD_PLUGIN_VARIANTS,
};
use std::collections::BTreeSet;

#[test]
fn repo_root_holds_the_sources() {
    let root = repo_root();
    assert!(root.join("Cargo.toml").is_file(), "{}", root.display());
    assert!(root.join("abi-tests/c/bad_plugin.c").is_file(), "{}", root.display());
    assert!(include_dir().join("memplug.h").is_file(), "{}", include_dir().display());
}

#[test]
fn test_tmp_dirs_are_fresh_and_distinct() {
    let a = test_tmp_dir("same name");
    let b = test_tmp_dir("same name");
    assert_ne!(a, b);
    for d in [&a, &b] {
        assert!(d.is_dir());
        assert!(d.starts_with(target_dir()), "{} outside {}", d.display(), target_dir().display());
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0);
        assert!(!d.file_name().unwrap().to_str().unwrap().contains(' '));
    }
}

#[test]
fn cdylib_names_follow_the_platform() {
    let f = cdylib_file_name("memplug_plugin_cpu");
    assert!(f.contains("memplug_plugin_cpu"));
    assert!(f.ends_with(std::env::consts::DLL_SUFFIX));
}

#[test]
fn find_cdylib_names_what_it_tried() {
    let err = std::panic::catch_unwind(|| find_cdylib("memplug_no_such_library", "MEMPLUG_NO_SUCH_LIBRARY"))
        .expect_err("no such library");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("not found (tried") && msg.contains("MEMPLUG_NO_SUCH_LIBRARY"), "{msg}");
}

#[test]
fn bad_plugin_variants_are_unique_and_checked() {
    let unique: BTreeSet<_> = BAD_PLUGIN_VARIANTS.iter().collect();
    assert_eq!(unique.len(), BAD_PLUGIN_VARIANTS.len());
    let err = std::panic::catch_unwind(|| bad_plugin(Some("BAD_NO_SUCH_VARIANT"))).expect_err("typo");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("unknown bad_plugin variant"), "{msg}");
}
