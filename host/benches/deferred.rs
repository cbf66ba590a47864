//! Issue-15 budgets: costs that do not grow with the work. A deferred-free
//! `poll` retiring one ready free with n others pending on fences of a
//! stream that has not finished (n = 1 vs 100 000, target ≤ 2×), and a
//! region grow + shrink naming a completed fence after n earlier fenced
//! shrinks whose fences completed (n = 0 vs 10 000, target ≤ 1.2×).
//! Ratios are of the same run. Run: `cargo bench -p memplug-host --bench deferred`.

// Only the plugin loader and the timing helpers of the shared module.
#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, Criterion};
use memplug_host::governor::AllocationClass;
use memplug_host::{
    BindingSpec, DeferredFreeQueue, FnFence, Mechanism, PluginFence, ProcessMemoryManager, Region,
    Requirements, Retire, RetireOutcome, SharedFence,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::hint::black_box;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// A free that does nothing: the bench measures the queue.
struct Nop;

impl Retire for Nop {
    fn retire(self: Box<Self>) -> RetireOutcome {
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        "nop".into()
    }
}

/// A queue with `n` frees pending on distinct fences of a stream whose
/// worker is blocked until the returned sender drops, and a completed
/// fence of another stream.
fn pending_queue(m: &Mechanism, n: usize) -> (Arc<DeferredFreeQueue>, SharedFence, mpsc::Sender<()>) {
    let sync = m.sync().expect("the cpu plugin has streams");
    let queue = DeferredFreeQueue::new();
    let blocked = sync.stream_create().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    sync.enqueue(&blocked, move || {
        let _ = rx.recv();
    })
    .unwrap();
    for _ in 0..n {
        queue.enqueue(vec![PluginFence::record(m, &blocked).unwrap()], Box::new(Nop));
    }
    let other = sync.stream_create().unwrap();
    let ready = PluginFence::record(m, &other).unwrap();
    assert!(ready.wait(Duration::from_secs(10)).unwrap());
    let _ = (blocked, other);
    (queue, ready, tx)
}

/// One ready free enqueued, then one poll.
fn poll_one(q: &DeferredFreeQueue, ready: &SharedFence) -> u64 {
    q.enqueue(vec![ready.clone()], Box::new(Nop));
    let r = q.poll();
    assert_eq!(r.retired, 1);
    r.still_pending as u64
}

/// A region after `n` grow + shrink pairs, each naming its own completed
/// fence.
fn shrunk_region(binding: &memplug_host::MemoryBinding, n: usize) -> Region {
    let mut r = binding.reserve_virtual(1 << 20).unwrap();
    for _ in 0..n {
        r.grow_to(1, |_| Ok::<(), ()>(())).unwrap();
        r.shrink_to(0, vec![FnFence::new("done", || true, |_| true)]).unwrap();
    }
    r
}

fn grow_shrink(r: &mut Region, done: &SharedFence) -> u64 {
    r.grow_to(black_box(1), |_| Ok::<(), ()>(())).unwrap();
    r.shrink_to(0, vec![done.clone()]).unwrap();
    r.committed()
}

fn bench(c: &mut Criterion) {
    let (plugin, _lib) = common::cpu_plugin();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let context = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let mech = context.mechanism().clone();
    let pool = manager.create_pool("bench", 1 << 40).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let done: SharedFence = FnFence::new("completed", || true, |_| true);

    let (q1, r1, _tx1) = pending_queue(&mech, 1);
    let (qn, rn, _txn) = pending_queue(&mech, 100_000);
    let mut g = c.benchmark_group("deferred/poll_one_ready");
    g.bench_function("pending=1", |b| b.iter(|| poll_one(&q1, &r1)));
    g.bench_function("pending=100k", |b| b.iter(|| poll_one(&qn, &rn)));
    g.finish();

    let mut s0 = shrunk_region(&binding, 0);
    let mut sn = shrunk_region(&binding, 10_000);
    let mut g = c.benchmark_group("deferred/region_grow_shrink");
    g.bench_function("shrinks=0", |b| b.iter(|| grow_shrink(&mut s0, &done)));
    g.bench_function("shrinks=10k", |b| b.iter(|| grow_shrink(&mut sn, &done)));
    g.finish();

    println!();
    let iters = 100_000;
    let p1 = common::ns_per_op(|| poll_one(&q1, &r1), iters);
    let pn = common::ns_per_op(|| poll_one(&qn, &rn), iters);
    let g0 = common::ns_per_op(|| grow_shrink(&mut s0, &done), iters);
    let gn = common::ns_per_op(|| grow_shrink(&mut sn, &done), iters);
    common::ratio("poll, 1 ready, pending 100k/1", "100k", pn, "1", p1, Some(2.0));
    common::ratio("region grow+shrink, after 10k/0 shrinks", "10k", gn, "0", g0, Some(1.2));

    drop((s0, sn));
    // The blocked streams never finish: their queues are left, not drained.
    std::mem::forget((q1, qn));
    drop(binding);
    assert_eq!(pool.used(), 0);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().final_summary();
}
