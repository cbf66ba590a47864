//! The ABI 1.2 device-loss checks (`loss.*`) and the 1.2 negotiation
//! checks of the kit, run through its library API:
//!
//! * on the reference CPU plugin, whose test switch
//!   `memplug_cpu_test_report_loss` is one of `LOSS_TRIGGERS` (the kit sets
//!   `MEMPLUG_CPU_TEST_SWITCHES=1` in the check's process for the fresh
//!   instance): every check passes;
//! * on `tests/fixtures/loss_plugin.c`, a small C plugin exporting the
//!   kit's convention `memplug_test_trigger_device_lost`: built plainly it
//!   passes every check of the kit; each `-DLOSS_<NAME>` plants one
//!   mistake, which must fail the check named for it, saying what is wrong
//!   (plus, where the mistake cannot help showing elsewhere, the checks
//!   listed with it) and nothing else;
//! * on the same C plugin without a trigger (`-DLOSS_NO_TRIGGER`): the
//!   checks that need a loss are skipped, saying why.

mod common;
use common::*;
use memplug_conformance::{Options, Outcome, Report, LOSS_TRIGGERS};
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One kit run at a time: its fence waits and thread storms are
/// timing-sensitive.
static ONE_RUN: Mutex<()> = Mutex::new(());

const LOSS_CHECKS: [&str; 5] = [
    "loss.reported_through_services",
    "loss.every_slot_device_lost",
    "loss.none_below_1_2",
    "loss.negotiation_reports",
    "loss.unknown_mechanism",
];

fn run(path: &Path) -> Report {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    // Storms of a few stalls: these tests are not about thread safety.
    let opts = Options { threads: 2, iterations: 200, storm_stalls: Some(10), ..Default::default() };
    memplug_conformance::run(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(variant: Option<&str>) -> PathBuf {
    let src = repo_root().join("conformance/tests/fixtures/loss_plugin.c");
    let name = match variant {
        Some(v) => format!("memplug_loss_{}", v.to_ascii_lowercase()),
        None => "memplug_loss".into(),
    };
    compile_c_plugin(&src, &variant.into_iter().collect::<Vec<_>>(), &name)
}

#[test]
fn the_cpu_plugin_passes_the_loss_checks_through_its_test_switch() {
    let r = run(&find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN"));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    assert_eq!(r.abi.as_deref(), Some("1.3"), "{}", table(&r));
    for check in LOSS_CHECKS.iter().chain(&["negotiation.host_size_respected", "negotiation.accepts_host"]) {
        let (o, detail) = one(&r, check);
        assert_eq!(o, Outcome::Pass, "{check}: {detail}\n{}", table(&r));
    }
    let (_, d) = one(&r, "loss.reported_through_services");
    assert!(
        d.contains("memplug_cpu_test_report_loss(1) answered OK")
            && d.contains("'cpu' (id 1)")
            && d.contains("reason \"test switch\""),
        "{d}"
    );
    let (_, d) = one(&r, "loss.every_slot_device_lost");
    // Every capability of the CPU plugin was swept (stream_adopt and
    // stream_adopt_typed are NULL), typed export and the 1.2
    // stream_wait_fence included.
    for slot in [
        "allocator.allocate",
        "allocator.deallocate",
        "virtual_backing.commit",
        "shared_mapping.map",
        "shared_mapping.import_fd",
        "shared_mapping.export_handle",
        "shared_mapping.import_handle",
        "sync.enqueue_host_fn",
        "sync.fence_wait",
        "sync.stream_wait_fence",
        "sync.copy",
        "sync.stream_destroy",
        "virtual_backing.commit_on",
        "shared_mapping.unmap_on",
    ] {
        assert!(d.contains(slot), "{slot} was not called after the loss: {d}");
    }
    // Every slot "cpu" publishes at 1.3 but stream_adopt (not published).
    assert!(d.contains("all 31 slots"), "{d}");
    let (_, d) = one(&r, "exports.only_entry_symbols");
    assert!(d.contains("memplug_cpu_test_report_loss"), "{d}");
    // The JSON report names the new checks.
    let json = serde_json_value(&r);
    for check in LOSS_CHECKS {
        assert!(json.contains(&format!("\"name\":\"{check}\"")), "{check} missing from the JSON");
    }
}

/// The report as JSON text (the `--json` document).
fn serde_json_value(r: &Report) -> String {
    serde_json::to_string(r).expect("the report serialises")
}

#[test]
fn the_plain_c_fixture_passes_every_check() {
    let r = run(&fixture(None));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    for check in LOSS_CHECKS {
        let (o, detail) = one(&r, check);
        assert_eq!(o, Outcome::Pass, "{check}: {detail}");
    }
    let (_, d) = one(&r, "loss.reported_through_services");
    assert!(d.contains("memplug_test_trigger_device_lost(7) answered OK"), "{d}");
    assert!(d.contains("reason \"device fell off the bus\" (23 bytes)"), "{d}");
    let (_, d) = one(&r, "loss.unknown_mechanism");
    assert!(d.contains("memplug_test_trigger_device_lost(8)") && d.contains("WRONG_MECHANISM"), "{d}");
}

#[test]
fn without_a_trigger_the_loss_checks_are_skipped_with_the_reason() {
    let r = run(&fixture(Some("LOSS_NO_TRIGGER")));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    for check in [
        "loss.reported_through_services",
        "loss.every_slot_device_lost",
        "loss.none_below_1_2",
        "loss.unknown_mechanism",
    ] {
        let (o, d) = one(&r, check);
        assert_eq!(o, Outcome::Skip, "{check}: {d}");
        for t in LOSS_TRIGGERS {
            assert!(d.contains(t.symbol), "{check}'s skip does not name {}: {d}", t.symbol);
        }
        assert!(d.contains("cannot be provoked from outside"), "{d}");
    }
    // Judged without a trigger.
    assert_eq!(one(&r, "loss.negotiation_reports").0, Outcome::Pass);
}

/// `variant` fails `check` with a detail containing `says`, and nothing
/// else fails but `collateral`.
fn caught(variant: &str, check: &str, says: &str, collateral: &[&str]) -> Report {
    let r = run(&fixture(Some(variant)));
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
fn a_mechanism_that_keeps_succeeding_after_its_loss() {
    caught(
        "LOSS_KEEPS_SUCCEEDING",
        "loss.every_slot_device_lost",
        "keeps succeeding after reporting loss: allocator.properties, allocator.allocate, allocator.deallocate \
         answered OK",
        &[],
    );
}

#[test]
fn a_status_other_than_device_lost() {
    caught(
        "LOSS_WRONG_STATUS",
        "loss.every_slot_device_lost",
        "allocator.properties (DEVICE_UNAVAILABLE), allocator.allocate (DEVICE_UNAVAILABLE), \
         allocator.deallocate (DEVICE_UNAVAILABLE) answered other than DEVICE_LOST",
        &[],
    );
}

#[test]
fn a_slot_that_crashes_after_the_loss() {
    let r = caught(
        "LOSS_CRASH",
        "loss.every_slot_device_lost",
        "calling allocator.deallocate after the reported loss",
        // Latched for a 1.1 host too, where the same slot crashes.
        &["loss.none_below_1_2"],
    );
    let c = r.results("loss.every_slot_device_lost").next().unwrap();
    assert_eq!((c.outcome, c.signal), (Outcome::Crash, Some("SIGSEGV")), "{}", c.detail);
}

#[test]
fn device_lost_answered_to_a_host_below_1_2() {
    caught(
        "LOSS_DEVICE_LOST_BELOW_1_2",
        "loss.none_below_1_2",
        "allocator.properties, allocator.allocate, allocator.deallocate answered DEVICE_LOST (15): that status is \
         ABI 1.2's",
        &[],
    );
}

#[test]
fn a_report_naming_a_mechanism_the_plugin_does_not_own() {
    // The trigger's positive control in loss.unknown_mechanism reports the
    // wrong id as well.
    caught(
        "LOSS_WRONG_ID",
        "loss.reported_through_services",
        "reports loss of a mechanism it does not own: mechanism id 107 (it publishes 'lossy' (id 7); the kit \
         answered WRONG_MECHANISM)",
        &["loss.unknown_mechanism"],
    );
}

#[test]
fn a_null_reason_with_a_length() {
    caught(
        "LOSS_NULL_REASON",
        "loss.reported_through_services",
        "reported the loss of mechanism id 7 with reason NULL and reason_len 9",
        &["loss.unknown_mechanism"],
    );
}

#[test]
fn a_loss_latched_but_never_reported() {
    caught(
        "LOSS_NO_REPORT",
        "loss.reported_through_services",
        "memplug_test_trigger_device_lost(7) answered OK, but no loss of mechanism 'lossy' (id 7) was reported \
         through the kit's services",
        &[],
    );
}

#[test]
fn a_trigger_reporting_an_id_it_was_asked_about_but_does_not_publish() {
    caught(
        "LOSS_REPORTS_UNKNOWN",
        "loss.unknown_mechanism",
        "reports loss of a mechanism it does not own: mechanism id 8",
        &[],
    );
}

#[test]
fn a_loss_reported_during_negotiation() {
    // The instance the other checks use is lost from its first
    // negotiation on: every check that calls its allocator fails too, so
    // only the loss checks are asserted here.
    let r = run(&fixture(Some("LOSS_IN_ENTRY")));
    let (o, d) = one(&r, "loss.negotiation_reports");
    assert_eq!(o, Outcome::Fail, "{d}\n{}", table(&r));
    assert!(
        d.contains(
            "reported the loss of 'lossy' (id 7) during negotiation, when the kit's services answer \
             INVALID_STATE"
        ) && d.contains("a host was never told"),
        "{d}"
    );
    // And the run says, in the check where it happened, what the plugin
    // reported through the kit's services of that negotiation.
    let (_, d) = one(&r, "negotiation.accepts_host");
    assert!(d.contains("reported the loss of mechanism id 7") && d.contains("answered INVALID_STATE"), "{d}");
}

#[test]
fn a_harmless_report_during_negotiation_is_advice() {
    let r = run(&fixture(Some("LOSS_IN_ENTRY_HARMLESS")));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    let (o, d) = one(&r, "loss.negotiation_reports");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(
        d.contains("answered INVALID_STATE") && d.contains("goes on working") && d.contains("Advice"),
        "{d}"
    );
}

#[test]
fn a_1_0_plugin_skips_the_loss_checks_and_keeps_to_its_host_info() {
    // The C example speaks only 1.0: the fresh instance agrees on 1.0 with
    // the kit's 1.2 host, so nothing of 1.2 is asked of it, and it reads
    // only the 24 bytes a 1.0/1.1 host declares.
    let src = repo_root().join("c-examples/plugin/example_plugin.c");
    let r = run(&compile_c_plugin(&src, &[], "memplug_loss_example"));
    assert!(r.passed(), "failed: {:?}\n{}", failed(&r), table(&r));
    // Below 1.2 what is asked is that nothing says DEVICE_LOST: a loss
    // would need a trigger, which it does not export.
    let (o, d) = one(&r, "loss.none_below_1_2");
    assert!(o == Outcome::Skip && d.contains("exports no device-loss test trigger"), "{d}");
    for check in ["loss.reported_through_services", "loss.every_slot_device_lost", "loss.unknown_mechanism"] {
        let (o, d) = one(&r, check);
        assert_eq!(o, Outcome::Skip, "{check}: {d}");
        assert!(d.contains("agreed on ABI 1.0") && d.contains("ABI 1.2"), "{check}: {d}");
    }
    let (o, d) = one(&r, "loss.negotiation_reports");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("agreed on 1.0") && d.contains("called no service"), "{d}");
    let (o, d) = one(&r, "negotiation.host_size_respected");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("agreed on 1.0 and 1.0"), "{d}");
}
