//! Shared by the host's benchmarks: loading the real CPU plugin `.so`, the
//! direct-call baseline ([`direct`]), and a same-run ratio printer
//! (criterion prints absolute figures; the budgets of ARCHITECTURE.md §6 are
//! ratios measured in one run).

pub mod direct;

use std::hint::black_box;
use std::time::Instant;

/// Loads the reference CPU plugin library with real `dlopen`.
pub fn cpu_plugin() -> (memplug_host::Plugin, libloading::Library) {
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let plugin = memplug_host::Plugin::load(&path).expect("load the CPU plugin");
    // A second handle to the same library for the direct-call baseline.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the CPU plugin");
    (plugin, lib)
}

/// Nanoseconds per call of `f`: the best of several timed batches (the
/// least disturbed by other work on a shared machine).
pub fn ns_per_op(mut f: impl FnMut() -> u64, iters: u64) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..iters {
            black_box(f());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    best
}

/// Prints one ratio line: `name  a ns  b ns  a/b`.
pub fn ratio(name: &str, a_label: &str, a: f64, b_label: &str, b: f64, budget: Option<f64>) {
    let r = a / b;
    let verdict = match budget {
        Some(max) if r <= max => format!("within {max:.2}x"),
        Some(max) => format!("OVER {max:.2}x"),
        None => String::new(),
    };
    println!("ratio {name:<34} {a_label} {a:>9.1} ns / {b_label} {b:>9.1} ns = {r:>5.2}x  {verdict}");
}
