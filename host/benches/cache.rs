//! The caching binding against what it replaces and what it competes with,
//! in one run: a cached allocate+free pair (a hit every time) vs libc
//! malloc+free (issue 15's target: within 2x, in instructions through
//! `scripts/callgrind.sh cached libc`) and vs the plain binding it sits on;
//! and for a 1 MiB block, where the plain binding maps and unmaps memory
//! per pair, the same comparison (what makes a GPU mechanism usable for
//! activations: there a miss is a `cuMemCreate` + map).
//! Run: `cargo bench -p memplug-host --bench cache` (prints figures).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, ProcessMemoryManager, Requirements, StreamKey};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::hint::black_box;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn main() {
    let (plugin, _lib) = common::cpu_plugin();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let context = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("bench", 1 << 40).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Activations)).unwrap();
    let cache = manager
        .bind_caching(&context, &pool, BindingSpec::new(AllocationClass::Workspace), CacheConfig::default())
        .unwrap();
    let done = memplug_host::FnFence::new("completed", || true, |_| true);
    let stream = StreamKey::runtime(1);

    for size in [64u64, 1 << 20] {
        let iters = if size == 64 { 200_000 } else { 20_000 };
        let libc = common::ns_per_op(
            || unsafe {
                let p = libc::malloc(black_box(size as usize));
                libc::free(p);
                p as u64
            },
            iters,
        );
        let plain = common::ns_per_op(|| binding.allocate(black_box(size), 16).unwrap().addr(), iters);
        let cached = common::ns_per_op(|| cache.allocate(black_box(size), 16).unwrap().addr(), iters);
        let on_stream = common::ns_per_op(
            || {
                let a = cache.allocate_on(black_box(size), 16, stream).unwrap();
                let addr = a.addr();
                a.free_on(stream, done.clone());
                addr
            },
            iters,
        );
        let label = if size == 64 { "64 B" } else { "1 MiB" };
        common::ratio(&format!("cached/libc {label}"), "cached", cached, "libc", libc, None);
        common::ratio(&format!("cached/binding {label}"), "cached", cached, "binding", plain, None);
        common::ratio(&format!("stream-ordered/cached {label}"), "stream", on_stream, "cached", cached, None);
    }
    let s = cache.stats();
    println!(
        "cache: {} hits, {} misses, {} B idle, hit rate {:.4}",
        s.hits,
        s.misses,
        s.idle_bytes,
        s.hit_rate()
    );
    cache.trim(u64::MAX);
    assert_eq!(pool.used(), 0, "every pair gave its bytes back");
}
