//! The kit's ABI 1.3 copy checks (`copy.*`), run through its library API:
//!
//! * on the reference CPU plugin, whose mechanisms publish the copy with
//!   `MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST`: every copy check passes on
//!   every mechanism;
//! * on `tests/fixtures/copy_plugin.c`, a C shim republishing the CPU
//!   plugin's `"cpu"` mechanism: built plainly it passes every copy check;
//!   each `-DCOPY_<NAME>` plants one mistake, which must fail the checks
//!   named for it, saying what is wrong, and no other check;
//! * below ABI 1.3 (the shim's 1.2 view, through the kit's `max_minor`
//!   cap being the plugin's) the checks skip with the reason.

mod common;
use common::*;
use memplug_conformance::{Options, Outcome, Report, CHECKS};
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One kit run at a time: the ordering checks watch held streams.
static ONE_RUN: Mutex<()> = Mutex::new(());

const COPY_CHECKS: [&str; 7] = [
    "copy.kinds",
    "copy.bytes_exact",
    "copy.ordering_host_fns",
    "copy.ordering_fences",
    "copy.bounds",
    "copy.overlap",
    "copy.len_zero",
];

fn run(path: &Path) -> Report {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    // Storms of a few stalls: these tests are not about thread safety.
    let opts = Options { threads: 2, iterations: 100, storm_stalls: Some(10), ..Default::default() };
    memplug_conformance::run(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cpu_plugin() -> PathBuf {
    find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN")
}

fn shim(variant: Option<&str>) -> PathBuf {
    let src = repo_root().join("conformance/tests/fixtures/copy_plugin.c");
    let inner = format!("COPY_INNER=\"{}\"", cpu_plugin().display());
    let name = match variant {
        Some(v) => format!("memplug_copy_{}", v.to_ascii_lowercase()),
        None => "memplug_copy".into(),
    };
    let mut defines = vec![inner.as_str()];
    defines.extend(variant);
    compile_c_plugin(&src, &defines, &name)
}

#[test]
fn the_catalog_lists_the_copy_checks_after_ordering() {
    let names: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
    let at = |n: &str| names.iter().position(|x| *x == n).unwrap_or_else(|| panic!("{n} not listed"));
    let last = at("ordering.peer_access");
    for (i, check) in COPY_CHECKS.iter().enumerate() {
        assert_eq!(at(check), last + 1 + i, "{check} out of place");
        assert!(CHECKS[at(check)].per_mechanism, "{check} runs per mechanism");
    }
}

#[test]
fn the_cpu_plugin_passes_every_copy_check_on_every_mechanism() {
    let r = run(&cpu_plugin());
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    for m in &r.mechanisms {
        for check in COPY_CHECKS {
            let (o, d) =
                of(&r, check, &m.name).unwrap_or_else(|| panic!("{check} did not run on {}", m.name));
            assert_eq!(o, Outcome::Pass, "{check} on {}: {d}", m.name);
        }
    }
    let (_, d) = one(&r, "copy.kinds");
    assert!(d.contains("DEVICE|HOST"), "{d}");
    let (_, d) = one(&r, "copy.ordering_host_fns");
    assert!(d.contains("saw it (directly)"), "{d}");
    let (_, d) = one(&r, "copy.bounds");
    assert!(d.contains("committed part copied"), "{d}");
}

#[test]
fn the_plain_shim_passes_and_each_planted_mistake_fails_its_checks_only() {
    let plain = run(&shim(None));
    assert!(plain.passed(), "failed: {:?}\n{}", failed(&plain), table(&plain));
    for check in COPY_CHECKS {
        assert_eq!(one(&plain, check).0, Outcome::Pass, "{check}: {}", one(&plain, check).1);
    }
    let cases: [(&str, &[&str], &str); 7] = [
        (
            "COPY_SHORT",
            &["copy.bytes_exact", "copy.ordering_host_fns", "copy.ordering_fences"],
            "inside the copied range",
        ),
        (
            "COPY_EAGER",
            &["copy.ordering_host_fns", "copy.ordering_fences"],
            "did not wait for the work before it",
        ),
        (
            "COPY_FENCE_FIRST",
            &["copy.ordering_fences", "copy.bytes_exact"],
            "once the fence after the copy completed",
        ),
        ("COPY_LAX_BOUNDS", &["copy.bounds"], "was accepted; expected OUT_OF_RANGE"),
        ("COPY_LAX_OVERLAP", &["copy.overlap"], "was accepted; expected INVALID_ARGUMENT"),
        ("COPY_NO_KINDS", &["copy.kinds"], "copy_kinds is 0"),
        ("COPY_DEVICE_ONLY", &["copy.kinds"], "copy from host memory (copy_kinds has no HOST)"),
    ];
    for (variant, want, says) in cases {
        let r = run(&shim(Some(variant)));
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(failed(&r), want, "{variant}:\n{}", table(&r));
        let details: Vec<String> = want.iter().map(|c| one(&r, c).1).collect();
        assert!(details.iter().any(|d| d.contains(says)), "{variant}: no failure says {says:?}: {details:?}");
        if variant == "COPY_SHORT" {
            // The ordering checks name a short copy, and do not blame the
            // order (issue 29).
            for check in ["copy.ordering_host_fns", "copy.ordering_fences"] {
                let d = one(&r, check).1;
                assert!(
                    d.contains("the copy stopped short") && d.contains("not an ordering fault"),
                    "{check}: {d}"
                );
                assert!(!d.contains("did not wait") && !d.contains("ran before"), "{check}: {d}");
            }
        }
    }
}
