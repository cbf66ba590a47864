//! The kit's ABI 1.2 ordering and peer access checks (`ordering.*`), run
//! through its library API on the reference CPU plugin: it publishes
//! `stream_wait_fence` (its stream's worker waits for the fence) and
//! queue-ordered binding, so those checks pass; it has neither peer access
//! nor `stream_adopt_typed`, so those are skipped, saying why. (The CUDA
//! plugin's run of the kit, on the fake driver, passes the peer access and
//! typed adoption checks: `plugins/cuda-vmm/tests/kit.rs`.)

mod common;
use common::*;
use memplug_conformance::{Options, Outcome, CHECKS};
use memplug_test_support::find_cdylib;
use std::collections::BTreeSet;

const ORDERING_CHECKS: [&str; 7] = [
    "ordering.commit_on",
    "ordering.map_on",
    "ordering.release_waits_for_work",
    "ordering.queued_refusals",
    "ordering.stream_wait_fence",
    "ordering.stream_adopt_typed",
    "ordering.peer_access",
];

#[test]
fn the_catalog_lists_the_ordering_checks_after_sync() {
    let names: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
    let at = |n: &str| names.iter().position(|x| *x == n).unwrap_or_else(|| panic!("{n} not listed"));
    let last_sync = at("sync.enqueue_refusal");
    for (i, check) in ORDERING_CHECKS.iter().enumerate() {
        assert_eq!(at(check), last_sync + 1 + i, "{check} out of place");
        assert!(CHECKS[at(check)].per_mechanism, "{check} runs per mechanism");
    }
}

#[test]
fn the_cpu_plugin_waits_across_streams_queues_its_binding_and_skips_what_it_does_not_publish() {
    let path = find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    // Storms of a few stalls: these tests are not about thread safety.
    let opts = Options { threads: 2, iterations: 200, storm_stalls: Some(10), ..Default::default() };
    let r = memplug_conformance::run(&path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let failed: BTreeSet<&str> = r.failures().map(|c| c.name).collect();
    assert!(r.passed(), "failed: {failed:?}\n{}", table(&r));
    let (o, d) = one(&r, "ordering.stream_wait_fence");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("waited while A was held, then ran") && d.contains("forged fence was refused"), "{d}");
    // Queue-ordered binding (the CPU plugin's queued decommit and unmap
    // wait for the stream; its tests/queued.rs shows they do).
    let (o, d) = one(&r, "ordering.commit_on");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("read-write, then inaccessible"), "{d}");
    let (o, d) = one(&r, "ordering.map_on");
    assert_eq!(o, Outcome::Pass, "{d}");
    let (o, d) = one(&r, "ordering.release_waits_for_work");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("decommit_on and unmap_on queued behind a host function"), "{d}");
    let (o, d) = one(&r, "ordering.queued_refusals");
    assert_eq!(o, Outcome::Pass, "{d}");
    assert!(d.contains("map_on and unmap_on") && d.contains("made no fence"), "{d}");
    let (o, d) = one(&r, "ordering.stream_adopt_typed");
    assert_eq!(o, Outcome::Skip, "{d}");
    assert!(d.contains("stream_adopt_typed is not published"), "{d}");
    let (o, d) = one(&r, "ordering.peer_access");
    assert_eq!(o, Outcome::Skip, "{d}");
    assert!(d.contains("no MEMPLUG_CAP_PEER_ACCESS"), "{d}");
    let json = serde_json::to_string(&r).expect("the report serialises");
    for check in ORDERING_CHECKS {
        assert!(json.contains(&format!("\"name\":\"{check}\"")), "{check} missing from the JSON");
    }
}
