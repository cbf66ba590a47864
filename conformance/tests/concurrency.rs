//! The kit's `concurrency.*` checks against a plugin whose handle table has
//! no lock (`tests/fixtures/racy_plugin.c`: the C example with its lock
//! calls taken out), and against the same plugin with its lock
//! (`-DRACY_KEEP_LOCK`, the C example itself).
//!
//! The checks stall the storm's calls at random points (`stalls.rs`), so a
//! run catches the unlocked table nearly always (the measured rate, 100
//! runs, is 100 of 100 on this fixture, measured with
//! `scripts/kit-catch-rate.sh`); this test allows three runs, so it fails
//! only when the checks lose that power, not by bad luck.

use memplug_conformance::{Options, Outcome, Report};
use memplug_test_support::{compile_c_plugin, repo_root};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One kit run at a time: the storms are timing-sensitive.
static ONE_RUN: Mutex<()> = Mutex::new(());

fn fixture(keep_lock: bool) -> PathBuf {
    let src = repo_root().join("conformance/tests/fixtures/racy_plugin.c");
    if keep_lock {
        compile_c_plugin(&src, &["RACY_KEEP_LOCK"], "memplug_racy_locked")
    } else {
        compile_c_plugin(&src, &[], "memplug_racy")
    }
}

fn run(path: &Path) -> Report {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    memplug_conformance::run(path, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The concurrency checks that did not pass, with their details.
fn caught(r: &Report) -> Vec<(String, String)> {
    r.checks
        .iter()
        .filter(|c| c.name.starts_with("concurrency.") && !matches!(c.outcome, Outcome::Pass | Outcome::Skip))
        .map(|c| (c.name.to_string(), c.detail.clone()))
        .collect()
}

#[test]
fn a_handle_table_without_a_lock_is_caught_and_named() {
    let racy = fixture(false);
    let mut misses = Vec::new();
    for _ in 0..3 {
        let r = run(&racy);
        let found = caught(&r);
        if let Some((name, detail)) = found.first() {
            assert!(
                detail.contains("is every table guarded by a lock?") && detail.contains("stalled mid-call"),
                "{name} does not point at the missing lock: {detail}"
            );
            return;
        }
        misses.push(
            r.checks
                .iter()
                .filter(|c| c.name.starts_with("concurrency."))
                .map(|c| c.detail.clone())
                .collect::<Vec<_>>(),
        );
    }
    panic!("three runs in a row passed a plugin whose handle table has no lock: {misses:#?}");
}

#[test]
fn the_same_plugin_with_its_lock_passes() {
    let r = run(&fixture(true));
    assert!(caught(&r).is_empty(), "{:#?}", caught(&r));
    let alloc = r.results("concurrency.allocator").next().expect("concurrency.allocator ran");
    assert_eq!(alloc.outcome, Outcome::Pass, "{}", alloc.detail);
    assert!(alloc.detail.contains("calls stalled mid-call"), "{}", alloc.detail);
}

#[test]
fn running_out_for_a_moment_is_not_a_race() {
    let src = repo_root().join("conformance/tests/fixtures/racy_plugin.c");
    let short = compile_c_plugin(&src, &["RACY_KEEP_LOCK", "RACY_SHORT_FOR_A_MOMENT"], "memplug_racy_short");
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    // Short storms: every 61st allocation fails, so a few hundred of them
    // meet the refusal many times over.
    let opts = Options { storm_stalls: Some(20), ..Options::default() };
    let r = memplug_conformance::run(&short, &opts).unwrap_or_else(|e| panic!("{}: {e}", short.display()));
    let alloc = r.results("concurrency.allocator").next().expect("concurrency.allocator ran");
    assert_eq!(alloc.outcome, Outcome::Pass, "{}", alloc.detail);
}
