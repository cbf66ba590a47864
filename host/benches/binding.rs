//! Issue-3 budgets (ARCHITECTURE.md §6): an allocate+free pair through a binding
//! (governor charge, allocation id, pinning, and a free that needs no
//! fence) against the plugin's allocator called directly, target ≤ 1.5×;
//! and the deferred-free path — a release after an already completed fence,
//! and `enqueue` + `poll` retiring batches of 1000 — against direct frees.
//! Run: `cargo bench -p memplug-host --bench binding`
//! (`BINDING_RATIOS_ONLY=1` skips criterion and prints only the ratios).

#[path = "common/mod.rs"]
mod common;

use common::direct::DirectAllocator;
use criterion::{criterion_group, Criterion};
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, FnFence, MemoryBinding, ProcessMemoryManager, Requirements, SharedFence};
use memplug_sdk::abi::{MemplugDevice, MemplugEntryV1, MEMPLUG_DEVICE_CPU};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SIZE: u64 = 64;
const BATCH: usize = 1000;
const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn direct_of(lib: &libloading::Library) -> DirectAllocator {
    unsafe {
        let entry: libloading::Symbol<MemplugEntryV1> = lib.get(b"memplug_plugin_v1").unwrap();
        DirectAllocator::first_mechanism(*entry).expect("negotiate directly")
    }
}

/// Allocate + free through the binding; nothing recorded, so the drop frees
/// at once.
fn binding_pair(b: &MemoryBinding) -> u64 {
    let a = b.allocate(black_box(SIZE), 16).unwrap();
    let addr = a.addr();
    drop(a);
    addr
}

/// Allocate, then release after a fence that has already completed: the
/// queue checks it and frees at once.
fn completed_fence_pair(b: &MemoryBinding, done: &SharedFence) -> u64 {
    let a = b.allocate(black_box(SIZE), 16).unwrap();
    let addr = a.addr();
    a.release_after(vec![done.clone()]);
    addr
}

/// A gate fence: closed while a batch is handed back, so every release is
/// enqueued; opened before the poll that retires the batch.
struct Gate {
    open: Arc<AtomicBool>,
    fence: SharedFence,
}

impl Gate {
    fn new() -> Gate {
        let open = Arc::new(AtomicBool::new(false));
        let (q, w) = (open.clone(), open.clone());
        let fence =
            FnFence::new("bench gate", move || q.load(Ordering::Acquire), move |_| w.load(Ordering::Acquire));
        Gate { open, fence }
    }
}

/// 1000 allocations handed back behind an incomplete fence (enqueued), then
/// retired by one `poll`. Returns the number retired.
fn deferred_batch(b: &MemoryBinding, manager: &ProcessMemoryManager, gate: &Gate) -> u64 {
    gate.open.store(false, Ordering::Release);
    let v: Vec<_> = (0..BATCH).map(|_| b.allocate(black_box(SIZE), 16).unwrap()).collect();
    for a in v {
        a.release_after(vec![gate.fence.clone()]);
    }
    gate.open.store(true, Ordering::Release);
    let r = manager.poll();
    assert_eq!(r.retired, BATCH, "{r:?}");
    r.retired as u64
}

fn bench(c: &mut Criterion) {
    let (plugin, lib) = common::cpu_plugin();
    let direct = direct_of(&lib);
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let context = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let mech = context.mechanism().clone();
    let pool = manager.create_pool("bench", 1 << 40).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Activations)).unwrap();
    let done: SharedFence = FnFence::new("completed", || true, |_| true);
    let gate = Gate::new();
    // Object ids far from the host's, for the direct calls.
    let mut id = 1u64 << 62;
    let mut next_id = move || {
        id += 1;
        id
    };
    let mechanism_pair = |size: u64| {
        let a = unsafe { mech.ungoverned() }.allocator().allocate(size, 16).unwrap();
        let addr = a.addr();
        unsafe { mech.ungoverned() }.allocator().deallocate(a).unwrap();
        addr
    };

    // `BINDING_RATIOS_ONLY=1`: only the same-run ratios below.
    let criterion = std::env::var_os("BINDING_RATIOS_ONLY").is_none();
    let mut g = c.benchmark_group("binding/alloc_free/64B");
    if criterion {
        g.bench_function("direct", |b| b.iter(|| direct.pair(black_box(SIZE), 16, next_id())));
        g.bench_function("mechanism", |b| b.iter(|| mechanism_pair(black_box(SIZE))));
        g.bench_function("binding", |b| b.iter(|| binding_pair(&binding)));
        g.bench_function("binding+completed_fence", |b| b.iter(|| completed_fence_pair(&binding, &done)));
    }
    g.finish();

    let mut g = c.benchmark_group("binding/deferred_free/64Bx1000");
    if criterion {
        g.bench_function("direct", |b| {
            b.iter(|| (0..BATCH).map(|_| direct.pair(black_box(SIZE), 16, next_id())).sum::<u64>())
        });
        g.bench_function("enqueue+poll", |b| b.iter(|| deferred_batch(&binding, &manager, &gate)));
    }
    g.finish();

    println!();
    let iters = 200_000;
    let d = common::ns_per_op(|| direct.pair(SIZE, 16, next_id()), iters);
    let m = common::ns_per_op(|| mechanism_pair(SIZE), iters);
    let b = common::ns_per_op(|| binding_pair(&binding), iters);
    let f = common::ns_per_op(|| completed_fence_pair(&binding, &done), iters);
    let q = common::ns_per_op(|| deferred_batch(&binding, &manager, &gate), 200) / BATCH as f64;
    let dq = common::ns_per_op(|| (0..BATCH).map(|_| direct.pair(SIZE, 16, next_id())).sum::<u64>(), 200)
        / BATCH as f64;
    common::ratio("alloc+free 64B binding/direct", "binding", b, "direct", d, Some(1.5));
    common::ratio("alloc+free 64B binding/mechanism", "binding", b, "mech", m, None);
    common::ratio("completed-fence free binding/direct", "binding", f, "direct", d, None);
    common::ratio("enqueue+poll x1000 binding/direct", "binding", q, "direct", dq, None);

    drop(binding);
    assert_eq!(pool.used(), 0);
    assert_eq!(manager.queue().pending(), 0);
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
