//! Issue-11 figures: what the end of a context costs. The settlement of a
//! lost context holding n live allocations (n = 1k, 10k, 100k, on one
//! binding; and 100k spread over 1000 bindings), timed from the loss to
//! `Terminated` with every charge discharged, against the real CPU plugin.
//! Settlement is one step per binding (its ledger), not per object, so the
//! time should not grow with n on one binding; across bindings it grows
//! with the bindings. Dropping the inert handles afterwards (no plugin
//! call, no refund) is timed too.
//!
//! Run: `cargo bench -p memplug-host --bench lifecycle`. Prints one line per
//! case: the best of 3 runs (a shared machine disturbs some).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, LifeState, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::time::{Duration, Instant};

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// (settle, drop the inert handles) in microseconds.
fn once(objects: usize, bindings: usize) -> (f64, f64) {
    let (plugin, _lib) = common::cpu_plugin();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let ctx = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("pool", 1 << 40).unwrap();
    let bs: Vec<_> = (0..bindings)
        .map(|_| manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap())
        .collect();
    let held: Vec<_> = (0..objects).map(|i| bs[i % bindings].allocate(64, 16).unwrap()).collect();
    let charged = pool.used();
    let t = Instant::now();
    ctx.declare_lost("bench");
    let s = manager.terminate(&ctx, Duration::from_secs(60)).unwrap();
    let settle = t.elapsed();
    assert_eq!((s.bytes, pool.used(), ctx.state()), (charged, 0, LifeState::Terminated));
    let t = Instant::now();
    drop(held);
    let inert = t.elapsed();
    assert_eq!(pool.used(), 0, "no second refund");
    (settle.as_secs_f64() * 1e6, inert.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    println!("{:<34} {:>14} {:>22}", "lost context", "settle (us)", "drop inert handles (us)");
    for (objects, bindings) in [(1_000, 1), (10_000, 1), (100_000, 1), (100_000, 1_000)] {
        let best = (0..3)
            .map(|_| once(objects, bindings))
            .fold((f64::MAX, f64::MAX), |a, b| (a.0.min(b.0), a.1.min(b.1)));
        let case = format!("{objects} live, {bindings} binding(s)");
        println!("{case:<34} {:>14.1} {:>22.1}", best.0, best.1);
    }
}
