//! The C API's cost on the hot path: a 64-byte allocate + free pair through
//! `memplug_host_allocate` / `memplug_host_allocation_free` against the
//! same pair through the Rust `MemoryBinding` it wraps, on the reference
//! CPU plugin, in one run (target: at most 1.1x). Also the pair with a
//! completed runtime fence (`memplug_host_allocation_free_after`), and a
//! caching binding's pair (`memplug_host_cache_allocate` +
//! `memplug_host_cached_free`, a hit every time) against the Rust cache's.
//!
//! `cargo bench -p memplug-host-capi --bench capi`
//!
//! Instruction counts (exact, immune to machine noise): run one loop under
//! callgrind at two iteration counts and divide the difference, e.g.
//! `valgrind --tool=callgrind BENCH --loop c 11000` minus `--loop c 1000`,
//! over 10000 (loops: `rust`, `c`, `rust-fenced`, `c-fenced`, `rust-cached`,
//! `c-cached`).

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, LoadOptions, ProcessMemoryManager};
use memplug_host_capi::*;
use std::ffi::{c_void, CString};
use std::hint::black_box;
use std::ptr::{null, null_mut};
use std::time::Instant;

const ITERS: u64 = 200_000;
const ROUNDS: usize = 9;

/// Nanoseconds per call of `f`: the best of several timed batches (the
/// least disturbed by other work on a shared machine).
fn ns_per_op(mut f: impl FnMut() -> u64) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..ITERS {
            black_box(f());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / ITERS as f64);
    }
    best
}

unsafe extern "C" fn done(_: *mut c_void) -> bool {
    true
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing
    // useful either: run the (short) measurement in both cases.
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");

    // The Rust side: its own manager, binding, pool.
    let pm = ProcessMemoryManager::new();
    pm.load_plugin(&path, &LoadOptions::default()).expect("load plugin");
    let ctx = pm.context("cpu").unwrap();
    let pool = pm.create_pool("rust", 1 << 30).unwrap();
    let rb = pm.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();

    // The C side.
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let mut m = MemplugHostManager::default();
    let mut mech = MemplugHostMechanism::default();
    let mut cpool = MemplugHostPool::default();
    let mut cb = MemplugHostBinding::default();
    let mut fence = MemplugHostFence::default();
    let mut cc = MemplugHostCache::default();
    let rc = pm
        .bind_caching(&ctx, &pool, BindingSpec::new(AllocationClass::Workspace), CacheConfig::default())
        .unwrap();
    unsafe {
        assert_eq!(memplug_host_manager_create(&mut m), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_manager_load_plugin(m, cpath.as_ptr()), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_manager_find_mechanism(m, c"cpu".as_ptr(), &mut mech), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_pool_create(m, c"c".as_ptr(), 1 << 30, &mut cpool), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_binding_create(m, mech, cpool, null(), &mut cb), MemplugHostStatus::Ok);
        assert_eq!(
            memplug_host_cache_create(m, mech, cpool, null(), null(), null(), &mut cc),
            MemplugHostStatus::Ok
        );
        assert_eq!(
            memplug_host_fence_from_callbacks(
                m,
                c"done".as_ptr(),
                Some(done),
                None,
                None,
                null_mut(),
                &mut fence
            ),
            MemplugHostStatus::Ok
        );
    }

    let rust_pair = || {
        let a = rb.allocate(black_box(64), 16).unwrap();
        let addr = a.addr();
        drop(black_box(a));
        addr
    };
    let c_pair = || {
        let mut a = MemplugHostAllocation::default();
        let mut addr = 0u64;
        unsafe {
            let s = memplug_host_allocate(black_box(cb), black_box(64), 16, &mut a, &mut addr);
            debug_assert_eq!(s, MemplugHostStatus::Ok);
            let s = memplug_host_allocation_free(black_box(a));
            debug_assert_eq!(s, MemplugHostStatus::Ok);
        }
        addr
    };
    let rust_fenced = || {
        let f = FnFenceShim::fence();
        let a = rb.allocate(black_box(64), 16).unwrap();
        let addr = a.addr();
        a.release_after([f]);
        addr
    };
    let c_fenced = || {
        let mut a = MemplugHostAllocation::default();
        let mut addr = 0u64;
        unsafe {
            memplug_host_allocate(black_box(cb), black_box(64), 16, &mut a, &mut addr);
            memplug_host_allocation_free_after(black_box(a), &fence, 1);
        }
        addr
    };

    let rust_cached = || {
        let a = rc.allocate(black_box(64), 16).unwrap();
        let addr = a.addr();
        drop(black_box(a));
        addr
    };
    let c_cached = || {
        let mut a = MemplugHostCachedAllocation::default();
        let mut addr = 0u64;
        unsafe {
            let s = memplug_host_cache_allocate(black_box(cc), black_box(64), 16, 0, &mut a, &mut addr);
            debug_assert_eq!(s, MemplugHostStatus::Ok);
            let s = memplug_host_cached_free(black_box(a));
            debug_assert_eq!(s, MemplugHostStatus::Ok);
        }
        addr
    };

    // `capi PATH N`: run one loop N times and stop (for instruction counts
    // with callgrind; see the module docs).
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--loop") {
        let n: u64 = args.get(i + 2).and_then(|s| s.parse().ok()).unwrap_or(1000);
        match args.get(i + 1).map(String::as_str) {
            Some("rust") => (0..n).for_each(|_| {
                black_box(rust_pair());
            }),
            Some("c") => (0..n).for_each(|_| {
                black_box(c_pair());
            }),
            Some("rust-fenced") => (0..n).for_each(|_| {
                black_box(rust_fenced());
            }),
            Some("c-fenced") => (0..n).for_each(|_| {
                black_box(c_fenced());
            }),
            Some("rust-cached") => (0..n).for_each(|_| {
                black_box(rust_cached());
            }),
            Some("c-cached") => (0..n).for_each(|_| {
                black_box(c_cached());
            }),
            other => panic!("unknown loop {other:?}"),
        }
        memplug_host_fence_release(fence);
        memplug_host_manager_destroy(m);
        return;
    }

    // Interleave the measurements so drift on a shared machine hits both.
    let (mut r, mut c, mut rf, mut cf) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    let (mut rcached, mut ccached) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        rcached = rcached.min(ns_per_op(rust_cached));
        ccached = ccached.min(ns_per_op(c_cached));
        r = r.min(ns_per_op(rust_pair));
        c = c.min(ns_per_op(c_pair));
        rf = rf.min(ns_per_op(rust_fenced));
        cf = cf.min(ns_per_op(c_fenced));
    }
    ratio("allocate+free 64 B", c, r, Some(1.1));
    ratio("allocate+free_after(done fence)", cf, rf, Some(1.1));
    ratio("cached allocate+free 64 B", ccached, rcached, None);

    assert_eq!(memplug_host_fence_release(fence), MemplugHostStatus::Ok);
    assert_eq!(memplug_host_manager_destroy(m), MemplugHostStatus::Ok);
}

fn ratio(name: &str, c: f64, rust: f64, budget: Option<f64>) {
    let r = c / rust;
    let verdict = match budget {
        Some(max) if r <= max => format!("within {max:.2}x"),
        Some(max) => format!("OVER {max:.2}x"),
        None => String::new(),
    };
    println!("ratio {name:<34} C API {c:>8.1} ns / Rust binding {rust:>8.1} ns = {r:>5.2}x  {verdict}");
}

/// A completed runtime fence for the Rust side, made the way the C API
/// makes one (an `FnFence` over a query that answers true).
struct FnFenceShim;

impl FnFenceShim {
    fn fence() -> memplug_host::SharedFence {
        thread_local! {
            static F: memplug_host::SharedFence =
                memplug_host::FnFence::new("done", || true, |_| true);
        }
        F.with(|f| f.clone())
    }
}
