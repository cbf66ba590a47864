//! The conformance kit against the rules `include/memplug.h` states and the
//! kit used to pass violations of. `abi-tests/c/contract_violations.c` is a
//! plugin with every capability of ABI 1.1, correct when built plainly and
//! with one planted violation per `-DVIOLATE_<NAME>`; each variant must
//! fail exactly the kit check named for it (plus, where the bug cannot help
//! spoiling something else, the checks listed with it), and the plain
//! build must pass every check. The reference plugins (the Rust CPU plugin
//! and the C example) must pass every one of those checks, or skip it only
//! for a capability they do not have.
//!
//! The kit runs through its library API (`memplug_conformance::run`), one
//! run at a time: its fence waits and thread storms are timing-sensitive,
//! and several runs at once on a small machine would measure each other.

use memplug_conformance::{Options, Outcome, Report};
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The checks these tests are about.
const CONTRACT_CHECKS: [&str; 13] = [
    "sync.streams",
    "shared_mapping.export_is_fresh_fd",
    "virtual_backing.release_drops_mappings",
    "sync.fence_after_stream_destroy",
    "sync.wait_forever",
    "sync.fence_monotonic",
    "shared_mapping.physical_identity",
    "descriptor.minor_0_is_1_0",
    "allocator.block_size_sane",
    "identity.no_overlap",
    "concurrency.shared_mapping",
    "sync.enqueue_refusal",
    "shared_mapping.mapped_not_committed",
];

/// Serialises kit runs (see the module documentation).
static ONE_RUN: Mutex<()> = Mutex::new(());

fn fixture(variant: Option<&str>) -> PathBuf {
    let src = repo_root().join("abi-tests/c/contract_violations.c");
    let name = match variant {
        Some(v) => format!("memplug_cv_{}", v.to_ascii_lowercase()),
        None => "memplug_cv".into(),
    };
    compile_c_plugin(&src, &variant.into_iter().collect::<Vec<_>>(), &name)
}

/// Runs the kit on `path`; `storms`: with the kit's full thread storms
/// (the `concurrency.*` checks a test is about), otherwise with storms of a
/// few stalls (their power is measured in conformance/tests/concurrency.rs;
/// here they only have to pass).
fn run_kit(path: &Path, storms: bool) -> Report {
    let opts = Options { storm_stalls: if storms { None } else { Some(10) }, ..Options::default() };
    let report = {
        let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
        memplug_conformance::run(path, &opts)
    };
    report.unwrap_or_else(|e| panic!("the kit could not run on {}: {e}", path.display()))
}

fn failed(r: &Report) -> BTreeSet<String> {
    r.failures().map(|c| c.name.to_string()).collect()
}

/// Every result of the report, one per line, for assertion messages.
fn table(r: &Report) -> String {
    r.checks
        .iter()
        .map(|c| format!("{:<40} {:<5} {}", c.name, c.outcome, c.detail))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one outcome of `check` (the fixture has one mechanism).
fn outcome(r: &Report, check: &str) -> (Outcome, String) {
    let v: Vec<_> = r.results(check).collect();
    assert_eq!(v.len(), 1, "{check} reported {} times:\n{}", v.len(), table(r));
    (v[0].outcome, v[0].detail.clone())
}

#[test]
fn the_plain_fixture_passes_every_check() {
    let r = run_kit(&fixture(None), false);
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    for check in CONTRACT_CHECKS {
        let (o, detail) = outcome(&r, check);
        assert_eq!(o, Outcome::Pass, "{check} did not pass on the plain fixture: {detail}");
    }
    assert_eq!(r.abi.as_deref(), Some("1.1"), "the fixture speaks 1.1");
}

/// Asserts that `variant` fails `check` and nothing else but `collateral`,
/// and (when given) that `check` says `says`: the message points at the
/// mistake.
fn violation_is_caught(variant: &str, check: &str, collateral: &[&str], says: Option<&str>) {
    let r = run_kit(&fixture(Some(variant)), check.starts_with("concurrency."));
    let (o, detail) = outcome(&r, check);
    assert_eq!(o, Outcome::Fail, "{variant}: {check} did not fail ({detail})\n{}", table(&r));
    assert!(!detail.is_empty(), "{variant}: {check} failed without saying why");
    if let Some(says) = says {
        assert!(detail.contains(says), "{variant}: {check} does not say {says:?}: {detail}");
    }
    let want: BTreeSet<String> =
        std::iter::once(check).chain(collateral.iter().copied()).map(str::to_string).collect();
    assert_eq!(
        failed(&r),
        want,
        "{variant}: other checks failed too (or not the listed ones)\n{}",
        table(&r)
    );
    println!("{variant}: {check} failed: {detail}");
}

macro_rules! violations {
    ($($test:ident: $variant:literal => $check:literal $(, also $also:literal)* $(, says $says:literal)?;)*) => {
        $(
            #[test]
            fn $test() {
                violation_is_caught($variant, $check, &[$($also),*], None$(.or(Some($says)))?);
            }
        )*

        /// Every contract check has a variant that fails it.
        #[test]
        fn every_contract_check_has_a_violation() {
            let proved: BTreeSet<&str> = [$($check),*].into_iter().collect();
            let variants: BTreeSet<&str> = [$($variant),*].into_iter().collect();
            let src = std::fs::read_to_string(repo_root().join("abi-tests/c/contract_violations.c")).unwrap();
            let planted: BTreeSet<&str> = src
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("VIOLATE_") && w.len() > "VIOLATE_".len())
                .collect();
            assert_eq!(variants, planted, "every VIOLATE_* variant of the fixture has a test here");
            let all: BTreeSet<&str> = CONTRACT_CHECKS.into_iter().collect();
            assert_eq!(proved, all);
        }
    };
}

violations! {
    export_of_the_objects_own_fd: "VIOLATE_EXPORT_OWN_FD" => "shared_mapping.export_is_fresh_fd";
    export_closed_by_the_plugin_later: "VIOLATE_EXPORT_KEPT_DUP" => "shared_mapping.export_is_fresh_fd";
    // The object the mappings kept alive is never freed: the plugin cannot
    // be unloaded.
    reservation_release_keeping_mapping_references: "VIOLATE_RELEASE_KEEPS_MAPS"
        => "virtual_backing.release_drops_mappings", also "lifecycle.unload_ready";
    stream_destroy_invalidating_fences: "VIOLATE_DESTROY_FENCES" => "sync.fence_after_stream_destroy";
    wait_forever_timing_out: "VIOLATE_WAIT_FOREVER" => "sync.wait_forever";
    fence_going_back_to_not_ready: "VIOLATE_FENCE_REGRESS" => "sync.fence_monotonic";
    physical_object_calls_without_identity_checks: "VIOLATE_PHYS_IDENTITY" => "shared_mapping.physical_identity";
    shared_export_at_minor_0: "VIOLATE_EXPORT_AT_1_0" => "descriptor.minor_0_is_1_0";
    a_2_pow_62_byte_block: "VIOLATE_BLOCK_SIZE" => "allocator.block_size_sane";
    one_address_handed_out_twice: "VIOLATE_SAME_ADDRESS" => "identity.no_overlap";
    running_a_refused_host_function: "VIOLATE_RUN_REFUSED" => "sync.enqueue_refusal";
    map_refusing_concurrent_maps: "VIOLATE_MAP_TRYLOCK" => "concurrency.shared_mapping";
    committed_bytes_counting_mapped_ranges: "VIOLATE_COUNTS_MAPPED" => "shared_mapping.mapped_not_committed";
    // Issue 29: messages that point at the bug. A destroy that throws its
    // queue away is not "returning early"; one that returns early is named
    // so (its work runs later); the kit's own descriptor handed out by an
    // export is named, not a crash that asks whether the plugin exited.
    stream_destroy_dropping_its_work: "VIOLATE_DESTROY_DROPS_WORK" => "sync.streams",
        also "sync.fence_after_stream_destroy", says "stream_destroy dropped the work submitted to the stream";
    stream_destroy_returning_before_its_work_ran: "VIOLATE_DESTROY_EARLY" => "sync.streams",
        also "sync.fence_after_stream_destroy", says "ms after it returned";
    // Every check that exports stops there, naming it.
    export_of_the_kits_own_descriptor: "VIOLATE_EXPORT_KIT_FD" => "shared_mapping.export_is_fresh_fd",
        also "shared_mapping.export_import", also "shared_mapping.import_lent_fd",
        says "which is the kit's own message pipe to its parent";
}

#[test]
fn the_cpu_plugin_passes_every_contract_check() {
    // Full storms: the reference plugin must pass them.
    let r = run_kit(&find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN"), true);
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    // Every mechanism the plugin publishes: "cpu" has every capability;
    // the huge-page one has no shared mapping, and says so.
    let mechanisms: BTreeSet<&str> = r.checks.iter().filter_map(|c| c.mechanism.as_deref()).collect();
    assert!(mechanisms.contains("cpu"), "{mechanisms:?}");
    for mech in mechanisms {
        for check in CONTRACT_CHECKS {
            let v: Vec<_> = r.results(check).filter(|c| c.mechanism.as_deref() == Some(mech)).collect();
            assert_eq!(v.len(), 1, "{check} reported {} times for {mech}:\n{}", v.len(), table(&r));
            let (o, detail) = (v[0].outcome, &v[0].detail);
            let no_sharing = mech == "cpu-huge-2m"
                && (check.contains("shared_mapping") || check == "virtual_backing.release_drops_mappings");
            if no_sharing {
                assert!(
                    o == Outcome::Skip && detail.contains("no shared_mapping"),
                    "{check} on {mech}: {o} {detail}"
                );
            } else {
                assert_eq!(o, Outcome::Pass, "{check} did not pass on {mech}: {detail}");
            }
        }
    }
}

#[test]
fn the_c_example_passes_what_it_can_and_skips_for_missing_capabilities() {
    let so = compile_c_plugin(
        &repo_root().join("c-examples/plugin/example_plugin.c"),
        &[],
        "example_kit_contract",
    );
    let r = run_kit(&so, false);
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    // An allocator and virtual backing, speaking 1.0: no shared mapping, no
    // sync.
    for check in CONTRACT_CHECKS {
        let (o, detail) = outcome(&r, check);
        let needs = if check.starts_with("sync.") {
            Some("no sync")
        } else if check.contains("shared_mapping") || check == "virtual_backing.release_drops_mappings" {
            Some("no shared_mapping")
        } else {
            None
        };
        match needs {
            Some(why) => {
                assert_eq!(o, Outcome::Skip, "{check} on the C example: {detail}");
                assert!(
                    detail.contains(why),
                    "{check} skipped on the C example for another reason: {detail}"
                );
            }
            None => assert_eq!(o, Outcome::Pass, "{check} did not pass on the C example: {detail}"),
        }
    }
}
