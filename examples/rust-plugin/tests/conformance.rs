//! The README's plugin, built from this crate, passes the conformance kit:
//! every check passes, or is skipped with its reason (the plugin publishes
//! only an allocator, so the other capabilities' checks skip). Nothing
//! fails, crashes or times out.
//!
//! One test in this binary: the kit forks, so it must not run beside
//! another test loading libraries.

use memplug_conformance::{Options, Outcome};

#[test]
fn the_readme_plugin_passes_the_conformance_kit() {
    let path = memplug_test_support::find_cdylib("memplug_example_rust_plugin", "MEMPLUG_EXAMPLE_PLUGIN");
    let report = memplug_conformance::run(&path, &Options::default()).expect("the kit runs");
    let table: Vec<String> = report
        .checks
        .iter()
        .map(|c| format!("{:<36} {:<5} {}", c.name, c.outcome.to_string(), c.detail))
        .collect();
    let table = table.join("\n");
    println!("{table}");
    assert_eq!(report.plugin_name.as_deref(), Some("my-plugin"), "{table}");
    let bad: Vec<String> = report
        .checks
        .iter()
        .filter(|c| match c.outcome {
            Outcome::Pass => false,
            Outcome::Skip => c.detail.trim().is_empty(),
            _ => true,
        })
        .map(|c| format!("{} ({}): {}", c.name, c.outcome, c.detail))
        .collect();
    assert!(
        bad.is_empty(),
        "checks that neither passed nor skipped with a reason:\n{}\n\n{table}",
        bad.join("\n")
    );
    // What a plugin written as the README says used to get wrong, and the
    // SDK now does for it.
    for name in [
        "allocator.bad_alignment",
        "allocator.zero_size",
        "allocator.unknown_flags",
        "allocator.huge_size",
        "identity.wrong_device",
        "identity.wrong_mechanism",
        "identity.unknown_allocation",
        "identity.double_free",
        "lifecycle.live_objects",
        "lifecycle.unload_ready",
    ] {
        let outcomes: Vec<Outcome> = report.results(name).map(|c| c.outcome).collect();
        assert!(!outcomes.is_empty() && outcomes.iter().all(|o| *o == Outcome::Pass), "{name}: {outcomes:?}");
    }
}
