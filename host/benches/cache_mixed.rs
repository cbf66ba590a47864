//! A mixed activation workload through caching bindings, against libc in
//! the same run: each step allocates tensors whose sizes follow a varying
//! sequence length (a serving loop's batches), keeps the last 8 alive and
//! frees the rest, as a runtime's activations and workspaces do. Prints the
//! time per allocate+free against libc malloc+free, and what each cache
//! keeps idle at the end and at most: with no cap, with the default idle
//! policy (a quarter of the pool), with a tight cap, and with a usage
//! threshold.
//! Run: `cargo bench -p memplug-host --bench cache_mixed` (prints figures).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, IdlePolicy, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::collections::VecDeque;
use std::time::Instant;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
const STEPS: usize = 20_000;
const LIVE: usize = 8;
const POOL: u64 = 256 << 20;

/// The sizes of one run: hidden 1024 × 4 B × a sequence length that
/// drifts like a serving batch's (xorshift, the same sequence every run),
/// scaled by one of four tensor shapes.
fn sizes() -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut seq = 512u64;
    (0..STEPS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            seq = (seq + (x % 65)).saturating_sub(32).clamp(16, 2048);
            let shape = [1, 3, 4, 8][(x >> 20) as usize % 4];
            seq * 1024 * 4 * shape / 4
        })
        .collect()
}

/// Nanoseconds per allocate+free over the workload, the best of 3 runs,
/// and the most bytes `idle` reported (sampled every 64 steps).
fn run<T>(sizes: &[u64], mut alloc: impl FnMut(u64) -> T, mut idle: impl FnMut() -> u64) -> (f64, u64) {
    let mut best = f64::MAX;
    let mut peak = 0;
    for _ in 0..3 {
        let mut live: VecDeque<T> = VecDeque::with_capacity(LIVE + 1);
        let t = Instant::now();
        for (i, &s) in sizes.iter().enumerate() {
            live.push_back(alloc(s));
            if live.len() > LIVE {
                live.pop_front();
            }
            // Sampled: reading a cache's figures locks every shard.
            if i % 64 == 0 {
                peak = peak.max(idle());
            }
        }
        drop(live);
        best = best.min(t.elapsed().as_nanos() as f64 / sizes.len() as f64);
    }
    (best, peak)
}

struct Libc(*mut libc::c_void);
impl Drop for Libc {
    fn drop(&mut self) {
        unsafe { libc::free(self.0) }
    }
}

fn main() {
    let (plugin, _lib) = common::cpu_plugin();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let context = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let sizes = sizes();
    let (libc_ns, _) = run(&sizes, |s| Libc(unsafe { libc::malloc(s as usize) }), || 0);
    let policies = [
        ("no cap", IdlePolicy { max_idle_bytes: Some(u64::MAX), ..IdlePolicy::default() }),
        ("default (a quarter of the pool)", IdlePolicy::default()),
        ("cap 16 MiB", IdlePolicy { max_idle_bytes: Some(16 << 20), ..IdlePolicy::default() }),
        (
            "threshold 0.25",
            IdlePolicy { max_idle_bytes: Some(u64::MAX), gc_threshold: Some(0.25), ..IdlePolicy::default() },
        ),
    ];
    for (name, idle) in policies {
        let pool = manager.create_pool(name, POOL).unwrap();
        let cache = manager
            .bind_caching(
                &context,
                &pool,
                BindingSpec::new(AllocationClass::Activations),
                CacheConfig { idle, ..CacheConfig::default() },
            )
            .unwrap();
        let (ns, peak) = run(&sizes, |s| cache.allocate(s, 256).unwrap(), || cache.stats().idle_bytes);
        let s = cache.stats();
        common::ratio(&format!("mixed/libc, {name}"), "cache", ns, "libc", libc_ns, None);
        println!(
            "idle {name:<32} end {:>6.1} MB  peak {:>6.1} MB  (hit rate {:.3}, {} misses, {:.1} MB given back)",
            s.idle_bytes as f64 / 1e6,
            peak as f64 / 1e6,
            s.hit_rate(),
            s.misses,
            s.trimmed_bytes as f64 / 1e6,
        );
        cache.trim(u64::MAX);
        assert_eq!(pool.used(), 0);
    }
}
