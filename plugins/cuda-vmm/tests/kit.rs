//! The vendor conformance kit against the CUDA plugin, on the fake driver
//! with two devices (or a real GPU with MEMPLUG_CUDA_TEST_REAL=1): every
//! check passes or says why it was skipped, and the 1.2 checks the plugin
//! now answers (peer access between the two devices, `stream_wait_fence`,
//! typed adoption, the descriptor and identity) pass, and so do the 1.3
//! copy checks (`cuMemcpyAsync`; the kit sees device bytes through host
//! memory), on the device mechanism and on the pinned host one.

mod common;

use common::*;
use memplug_conformance::{Options, Outcome};

/// The kit's checks of the ABI 1.3 copy.
const COPY_CHECKS: [&str; 7] = [
    "copy.kinds",
    "copy.bytes_exact",
    "copy.ordering_host_fns",
    "copy.ordering_fences",
    "copy.bounds",
    "copy.overlap",
    "copy.len_zero",
];

#[test]
fn the_cuda_plugin_passes_the_kit() {
    let _s = serial();
    let opts = Options { threads: 2, iterations: 50, ..Default::default() };
    let r = memplug_conformance::run(&plugin_path(), &opts).unwrap_or_else(|e| panic!("kit: {e}"));
    let table: String = r
        .checks
        .iter()
        .map(|c| {
            format!(
                "{:<40} {:<10} {:<7} {}\n",
                c.name,
                c.mechanism.as_deref().unwrap_or("-"),
                c.outcome,
                c.detail
            )
        })
        .collect();
    assert!(r.passed(), "failed: {:?}\n{table}", r.failures().map(|c| c.name).collect::<Vec<_>>());
    let on_cuda0 = |name: &str| {
        r.results(name)
            .find(|c| c.mechanism.as_deref() == Some("cuda0-vmm"))
            .unwrap_or_else(|| panic!("{name} not run on cuda0-vmm:\n{table}"))
    };
    for check in [
        "ordering.stream_wait_fence",
        "ordering.stream_adopt_typed",
        "descriptor.identity",
        "sync.stream_adopt",
    ]
    .into_iter()
    // ABI 1.3: cuMemcpyAsync, the bytes seen through host memory.
    .chain(COPY_CHECKS)
    {
        let c = on_cuda0(check);
        assert_eq!(c.outcome, Outcome::Pass, "{check}: {}", c.detail);
    }
    assert!(on_cuda0("copy.bytes_exact").detail.contains("through host memory"));
    if drv().devices.len() > 1 {
        let c = on_cuda0("ordering.peer_access");
        assert_eq!(c.outcome, Outcome::Pass, "{}", c.detail);
    }
    // The pinned host memory mechanism (tests/pinned.rs): its allocator,
    // streams and copy pass what they publish.
    for check in [
        "descriptor.memory_descriptor",
        "allocator.usable",
        "allocator.alignment",
        "allocator.bad_alignment",
        "allocator.memory_info",
        "identity.double_free",
        "identity.wrong_device",
        "sync.streams",
        "sync.in_order",
        "ordering.stream_wait_fence",
        "concurrency.allocator",
        "lifecycle.live_objects",
    ]
    .into_iter()
    .chain(COPY_CHECKS)
    {
        let c = r
            .results(check)
            .find(|c| c.mechanism.as_deref() == Some("cuda0-host"))
            .unwrap_or_else(|| panic!("{check} not run on cuda0-host:\n{table}"));
        assert_eq!(c.outcome, Outcome::Pass, "{check} on cuda0-host: {}", c.detail);
    }
    for c in r.checks.iter().filter(|c| c.outcome == Outcome::Skip) {
        assert!(!c.detail.is_empty(), "{} skipped without a reason", c.name);
    }
}
