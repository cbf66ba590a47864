//! The kit's ABI 1.2 checks of the memory descriptor, the identity, typed
//! export and what a descriptor claims (`descriptor.memory_descriptor`,
//! `descriptor.identity`, `descriptor.page_size_requests`,
//! `descriptor.minor_1_is_1_1`, `shared_mapping.typed_export*`,
//! `shared_mapping.export_kinds_requested`, `claims.*`), run through the
//! kit's library API:
//!
//! * on the reference CPU plugin: every check passes, or skips what it
//!   does not claim (it is not zero-filled, and backs memory with base
//!   pages only);
//! * on `tests/fixtures/claims_plugin.c`, a C shim over the CPU plugin
//!   that republishes it with more claims: built plainly its claims hold
//!   and it passes every check; each `-DCLAIMS_<NAME>` plants one lie,
//!   which must fail the check named for it, saying what is wrong (plus,
//!   where the lie cannot help showing elsewhere, the checks listed with
//!   it), and nothing else.

mod common;
use common::*;
use memplug_conformance::{Options, Outcome, Report};
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One kit run at a time: its fence waits and thread storms are
/// timing-sensitive.
static ONE_RUN: Mutex<()> = Mutex::new(());

/// The checks of this file.
const NEW_CHECKS: [&str; 12] = [
    "descriptor.minor_1_is_1_1",
    "descriptor.memory_descriptor",
    "descriptor.identity",
    "descriptor.page_size_requests",
    "shared_mapping.typed_export",
    "shared_mapping.typed_export_refusals",
    "shared_mapping.export_kinds_requested",
    "claims.read_only_enforced",
    "claims.zero_filled",
    "claims.page_size_used",
    "claims.placement_used",
    "claims.pinned_locked",
];

fn run(path: &Path) -> Report {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    // Storms of a few stalls: these tests are not about thread safety.
    let opts = Options { threads: 2, iterations: 200, storm_stalls: Some(10), ..Default::default() };
    memplug_conformance::run(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_cpu_plugins_node_and_huge_page_mechanisms_deliver_what_they_claim() {
    let r = run(&cpu_plugin());
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    let offers = memplug_plugin_cpu::offers();
    let published = |name: &str| {
        let o = offers
            .iter()
            .find(|o| o.name == name || (name.starts_with("cpu-node") && o.name == "cpu-node<N>"));
        match o.and_then(|o| o.not_offered.clone()) {
            Some(why) => {
                eprintln!("skipped: {name} is not published here: {why}");
                false
            }
            None => true,
        }
    };
    if published("cpu-node0") {
        let (o, d) = of(&r, "claims.zero_filled", "cpu-node0").expect("zero_filled ran on cpu-node0");
        assert_eq!(o, Outcome::Pass, "{d}");
        let (_, d) = of(&r, "descriptor.memory_descriptor", "cpu-node0").unwrap();
        assert!(d.contains("location NUMA node 0"), "{d}");
        let (o, d) = of(&r, "claims.read_only_enforced", "cpu-node0").unwrap();
        assert_eq!(o, Outcome::Pass, "{d}");
        let (o, d) = of(&r, "claims.placement_used", "cpu-node0").unwrap();
        assert_eq!(o, Outcome::Pass, "{d}");
        assert!(d.contains("an allocation and of a commit written is on NUMA node 0"), "{d}");
    }
    if published("cpu-huge-2m") {
        let (o, d) =
            of(&r, "claims.page_size_used", "cpu-huge-2m").expect("page_size_used ran on cpu-huge-2m");
        assert_eq!(o, Outcome::Pass, "{d}");
        assert!(d.contains("2 MiB") && d.contains("transparent huge pages"), "{d}");
        let (o, d) = of(&r, "claims.zero_filled", "cpu-huge-2m").unwrap();
        assert_eq!(o, Outcome::Pass, "{d}");
    }
}

fn cpu_plugin() -> PathBuf {
    find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN")
}

fn shim(variant: Option<&str>) -> PathBuf {
    let src = repo_root().join("conformance/tests/fixtures/claims_plugin.c");
    let inner = format!("CLAIMS_INNER=\"{}\"", cpu_plugin().display());
    let name = match variant {
        Some(v) => format!("memplug_claims_{}", v.to_ascii_lowercase()),
        None => "memplug_claims".into(),
    };
    let mut defines = vec![inner.as_str()];
    defines.extend(variant);
    compile_c_plugin(&src, &defines, &name)
}

/// Whether the kernel offers transparent huge pages (the plain shim claims
/// them only then).
fn thp_enabled() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.is_empty() && !s.contains("[never]"))
}

#[test]
fn the_cpu_plugin_passes_the_1_2_checks_and_skips_what_it_does_not_claim() {
    let r = run(&cpu_plugin());
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    let cpu = |r: &Report, c: &str| of(r, c, "cpu").unwrap_or_else(|| panic!("{c} not run on \"cpu\""));
    let skipped: BTreeSet<&str> =
        NEW_CHECKS.iter().copied().filter(|c| cpu(&r, c).0 == Outcome::Skip).collect();
    assert_eq!(
        skipped,
        BTreeSet::from([
            "claims.zero_filled",
            "claims.page_size_used",
            "claims.placement_used",
            "claims.pinned_locked"
        ]),
        "{}",
        table(&r)
    );
    let (_, d) = cpu(&r, "claims.zero_filled");
    assert!(d.contains("does not claim MEMPLUG_ATTR_ZERO_FILLED"), "{d}");
    let (_, d) = cpu(&r, "claims.page_size_used");
    assert!(d.contains("claims only the base page (4 KiB)"), "{d}");
    let (_, d) = cpu(&r, "descriptor.memory_descriptor");
    for want in [
        "page sizes 4 KiB",
        "attributes HOST_VISIBLE|HOST_COHERENT|READ_ONLY_ENFORCED",
        "export kinds MEMFD",
        "location host memory",
        "maps at offsets",
    ] {
        assert!(d.contains(want), "{want:?} not in: {d}");
    }
    let (_, d) = cpu(&r, "descriptor.identity");
    assert!(d.contains("48-byte identity: NUMA node 0"), "{d}");
    let (_, d) = cpu(&r, "shared_mapping.typed_export");
    assert!(d.contains("MEMFD: descriptor") && d.contains("/memfd:") && d.contains("the same memory"), "{d}");
    let (_, d) = cpu(&r, "shared_mapping.typed_export_refusals");
    assert!(d.contains("UNSUPPORTED") && d.contains("fd -1"), "{d}");
    let (_, d) = cpu(&r, "shared_mapping.export_kinds_requested");
    assert!(d.contains("OPAQUE_FD|DMABUF_FD|WIN32|VENDOR_BLOB") && d.contains("(MEMFD) served"), "{d}");
    let (_, d) = cpu(&r, "claims.read_only_enforced");
    assert!(d.contains("killed the child with SIGSEGV"), "{d}");
    let (_, d) = cpu(&r, "descriptor.page_size_requests");
    assert!(d.contains("allocate, reserve, create") && d.contains("page_size 4 KiB (listed) served"), "{d}");
    let (_, d) = cpu(&r, "descriptor.minor_1_is_1_1");
    assert!(d.contains("agreed on 1.1") && d.contains("shared_export") && !d.contains("typed_export"), "{d}");
    let (_, d) = cpu(&r, "descriptor.capabilities");
    assert!(d.contains("typed_export"), "{d}");
    // The JSON report names the new checks, and the new capability.
    let json = serde_json::to_string(&r).expect("the report serialises");
    for check in NEW_CHECKS {
        assert!(json.contains(&format!("\"name\":\"{check}\"")), "{check} missing from the JSON");
    }
    assert!(json.contains("\"typed_export\""), "the mechanism's capabilities lack typed_export");
}

#[test]
fn the_honest_shim_passes_every_check() {
    let r = run(&shim(None));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    assert_eq!(r.plugin_name.as_deref(), Some("claims-shim"));
    let (o, d) = one(&r, "claims.zero_filled");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("allocations") && d.contains("committed") && d.contains("physical objects"), "{d}");
    let (o, d) = one(&r, "claims.read_only_enforced");
    assert_eq!(o, Outcome::Pass, "{d}");
    let (o, d) = one(&r, "claims.page_size_used");
    if thp_enabled() {
        assert_eq!(o, Outcome::Pass, "{d}");
        assert!(d.contains("2 MiB:") && d.contains("transparent huge pages"), "{d}");
        let (_, d) = one(&r, "descriptor.memory_descriptor");
        assert!(d.contains("page sizes 4 KiB, 2 MiB") && d.contains("ZERO_FILLED"), "{d}");
    } else {
        assert_eq!(o, Outcome::Skip, "{d}");
    }
}

/// `variant` fails `check` with a detail containing `says`, and nothing
/// else fails but `collateral`.
fn caught(variant: &str, check: &str, says: &str, collateral: &[&str]) -> Report {
    let r = run(&shim(Some(variant)));
    let (o, detail) = one(&r, check);
    assert!(o.is_failure(), "{variant}: {check} did not fail ({o}: {detail})\n{}", table(&r));
    assert!(detail.contains(says), "{variant}: {check} failed without saying {says:?}: {detail}");
    let want: BTreeSet<String> =
        std::iter::once(check).chain(collateral.iter().copied()).map(String::from).collect();
    assert_eq!(failed(&r), want, "{variant}: other checks failed too, or not the listed ones\n{}", table(&r));
    println!("{variant}: {check} {o}: {detail}");
    r
}

#[test]
fn zero_filled_claimed_over_dirty_memory() {
    caught(
        "CLAIMS_DIRTY_MEMORY",
        "claims.zero_filled",
        "MEMPLUG_ATTR_ZERO_FILLED is claimed, but a new allocation of 64 bytes (round 1) does not read as zero: \
         byte 0 of its 64 is 0xab",
        &[],
    );
}

#[test]
fn read_only_enforced_claimed_over_read_write_views() {
    // The 1.0 check of read-only views fails too: the same lie.
    caught(
        "CLAIMS_RW_VIEWS",
        "claims.read_only_enforced",
        "MEMPLUG_ATTR_READ_ONLY_ENFORCED is claimed, but the read-only view",
        &["shared_mapping.read_only"],
    );
}

#[test]
fn a_numa_node_claimed_where_no_page_is() {
    // A node this machine lacks (none of these machines has six), so the
    // memory descriptor's own check objects too.
    caught(
        "CLAIMS_ELSEWHERE",
        "claims.placement_used",
        "the location claims NUMA node 5, but page 0x0 of an allocation",
        &["descriptor.memory_descriptor"],
    );
}

#[test]
fn huge_pages_claimed_over_base_pages() {
    caught("CLAIMS_SMALL_PAGES", "claims.page_size_used", "page_sizes claims 2 MiB pages, but", &[]);
}

#[test]
fn a_request_naming_a_page_size_not_listed_is_served() {
    caught(
        "CLAIMS_PAGE_SIZE_IGNORED",
        "descriptor.page_size_requests",
        "allocate with page_size 8 KiB (not published): got OK, expected INVALID_ARGUMENT",
        &[],
    );
}

#[test]
fn a_recommended_granularity_that_is_no_power_of_two() {
    caught(
        "CLAIMS_BAD_DESCRIPTOR",
        "descriptor.memory_descriptor",
        "recommended_granularity 0x3000 is not zero or a power-of-two multiple of the granularity 0x1000",
        &[],
    );
}

#[test]
fn an_identity_naming_another_numa_node() {
    caught("CLAIMS_BAD_IDENTITY", "descriptor.identity", "NUMA node 7", &[]);
}

#[test]
fn a_handle_labelled_with_another_kind_than_asked() {
    caught(
        "CLAIMS_MISLABELLED",
        "shared_mapping.typed_export",
        "export_handle (MEMFD) returned a handle of kind 0x1 (OPAQUE_FD) where 0x4 (MEMFD) was asked",
        &[],
    );
}

#[test]
fn a_memfd_handle_that_is_no_memfd() {
    caught(
        "CLAIMS_NOT_A_MEMFD",
        "shared_mapping.typed_export",
        "returned a MEMFD handle whose descriptor",
        // Its export (a pipe) cannot be imported back either.
        &["shared_mapping.import_lent_fd"],
    );
}

#[test]
fn a_handle_of_a_kind_not_offered() {
    // export_handle serves kinds it does not offer: the refusals fail.
    caught(
        "CLAIMS_UNOFFERED_KINDS",
        "shared_mapping.typed_export_refusals",
        "export_handle as 0x1 (OPAQUE_FD), not offered: got OK, expected UNSUPPORTED",
        &[],
    );
}

#[test]
fn a_create_naming_an_export_kind_not_offered_is_served() {
    caught(
        "CLAIMS_IGNORES_EXPORT_KINDS",
        "shared_mapping.export_kinds_requested",
        "create of an object exportable as OPAQUE_FD (export_types offers MEMFD): got OK, expected UNSUPPORTED",
        &[],
    );
}

#[test]
fn typed_export_claimed_to_a_1_1_host() {
    caught(
        "CLAIMS_TYPED_AT_1_1",
        "descriptor.minor_1_is_1_1",
        "negotiated at 1.1, the mechanism sets capability bits 0x20 (MEMPLUG_CAP_TYPED_EXPORT, ABI 1.2)",
        &[],
    );
}

#[test]
fn an_import_that_takes_an_ordinary_file_as_memory() {
    caught(
        "CLAIMS_IMPORTS_ANY_FILE",
        "shared_mapping.import_lent_fd",
        "import_handle as MEMFD accepted an ordinary file as memory",
        // It "imports" a handle with fd -1 the same way.
        &["shared_mapping.typed_export_refusals"],
    );
}

#[test]
fn an_import_that_closes_the_descriptor_it_was_lent() {
    caught(
        "CLAIMS_IMPORT_CLOSES_FD",
        "shared_mapping.import_lent_fd",
        "import_handle as MEMFD closed the descriptor",
        &[],
    );
}

/// The results of `check` on the shim's one mechanism ("cpu").
fn outcome(r: &Report, check: &str) -> (Outcome, String) {
    one(r, check)
}

#[test]
fn host_functions_accepted_before_a_loss_run_once_or_the_kit_says_so() {
    // The shim with the kit's trigger (the CPU plugin's switch behind it):
    // the CPU plugin runs what it accepted, loss or not.
    let r = run(&shim(Some("CLAIMS_TRIGGER")));
    let (o, d) = outcome(&r, "loss.host_fns_run_once");
    assert_eq!(o, Outcome::Pass, "{d}\n{}", table(&r));
    assert!(d.contains("each ran exactly once"), "{d}");
    // The trigger shim is no perfect plugin: its fresh copy shares one
    // CPU plugin library with the ordinary instance, whose switch reports
    // the loss through every live instance and knows mechanism id 2, which
    // the shim hides (loss.unknown_mechanism, lifecycle.unload_ready fail).
    // What matters is that the planted variant fails exactly one more.
    let correct = failed(&r);
    // Dropping them once the loss is triggered is caught, and nothing else
    // changes.
    let r = run(&shim(Some("CLAIMS_LOSS_DROPS_HOST_FNS")));
    let (o, d) = outcome(&r, "loss.host_fns_run_once");
    assert_eq!(o, Outcome::Fail, "{d}\n{}", table(&r));
    assert!(
        d.contains("4 of 4 host functions whose enqueue_host_fn answered OK before the loss never ran"),
        "{d}"
    );
    let mut want = correct;
    want.insert("loss.host_fns_run_once".into());
    assert_eq!(failed(&r), want, "{}", table(&r));
}

#[test]
fn pinned_claimed_over_memory_that_is_not_locked() {
    // The honest variant locks what it hands out (the kit's storms may
    // meet RLIMIT_MEMLOCK: what fails then fails for both).
    let r = run(&shim(Some("CLAIMS_PINNED")));
    let (o, d) = outcome(&r, "claims.pinned_locked");
    assert_eq!(o, Outcome::Pass, "{d}\n{}", table(&r));
    assert!(d.contains("an allocation and a commit locked"), "{d}");
    let correct = failed(&r);
    let r = run(&shim(Some("CLAIMS_PINNED_UNLOCKED")));
    let (o, d) = outcome(&r, "claims.pinned_locked");
    assert_eq!(o, Outcome::Fail, "{d}\n{}", table(&r));
    assert!(
        d.contains("MEMPLUG_ATTR_PINNED is claimed, but an allocation") && d.contains("not mlocked"),
        "{d}"
    );
    let mut want = correct;
    want.insert("claims.pinned_locked".into());
    assert_eq!(failed(&r), want, "{}", table(&r));
}

#[test]
fn an_identity_that_changes_between_calls() {
    caught(
        "CLAIMS_IDENTITY_CHANGES",
        "descriptor.identity_stable",
        "the device identity changed after properties (byte 4: ",
        &[],
    );
}

#[test]
fn a_queued_release_that_does_not_wait_for_the_stream() {
    caught(
        "CLAIMS_RELEASE_EARLY",
        "ordering.release_waits_for_work",
        "decommit_on took the memory away before the work queued earlier on the same stream had run",
        &[],
    );
}

#[test]
fn a_peer_access_answer_of_write_without_read() {
    let r = run(&shim(Some("CLAIMS_PEER")));
    let (o, d) = outcome(&r, "ordering.peer_access");
    assert_eq!(o, Outcome::Pass, "{d}\n{}", table(&r));
    assert!(failed(&r).is_empty(), "{}", table(&r));
    caught(
        "CLAIMS_PEER_WRITE_ONLY",
        "ordering.peer_access",
        "can_access_peer(cpu:0) answered WRITE without READ (0x2)",
        &[],
    );
}
