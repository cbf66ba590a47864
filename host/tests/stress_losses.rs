//! Stress with device losses at random moments (issue 28, "Done when"):
//! several threads allocate through a binding and a caching binding, grow
//! and shrink regions that map a shared prefix, offload and restore them,
//! privatise prefix granules, and hand out DLPack views, while the context
//! is declared lost at a random moment of each round. After the round the
//! context terminates, the queue drains, every pool is at exactly zero,
//! nothing stays queued, and nothing of the host holds the plugin (it
//! unloads unless it still reports objects of its own).
//!
//! Bounded: `MEMPLUG_STRESS_SECS` (default 2) of rounds, each a fresh
//! manager and a private copy of the CPU plugin. The long run is
//! `MEMPLUG_STRESS_SECS=300 cargo test -p memplug-host --release --test
//! stress_losses -- --nocapture`.

mod common;

use common::{isolated_cpu_plugin, CPU0, MIB};
use memplug_host::dlpack::{ExportOptions, SharedRegion, TensorLayout};
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, LifeState, ProcessMemoryManager, Requirements};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: usize = 4;

/// A small xorshift: each thread's choices, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seconds() -> f64 {
    std::env::var("MEMPLUG_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0)
}

/// One round: returns the operations that succeeded before and after the
/// loss (both must be non-zero over the run for it to mean anything).
fn round(index: u64) -> (u64, u64) {
    let plugin = isolated_cpu_plugin(&format!("stress-{index}"));
    let name = plugin.name().to_string();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let ctx = manager.select(CPU0, all).unwrap();
    let granule = ctx.mechanism().properties().granularity;
    let device = manager.create_pool("device", 256 * MIB).unwrap();
    let host = manager.create_pool("host", 256 * MIB).unwrap();
    let binding = manager.bind(&ctx, &device, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let host_binding = manager.bind(&ctx, &host, BindingSpec::new(AllocationClass::Other)).unwrap();
    let cache = manager
        .bind_caching(&ctx, &device, BindingSpec::new(AllocationClass::Activations), CacheConfig::default())
        .unwrap();
    // SAFETY: the fill view is writable and nothing else sees it yet.
    let prefix = binding.create_shared(2 * granule, |v| unsafe { v.as_mut_slice() }.fill(0x5a)).unwrap();

    let lost = Arc::new(AtomicBool::new(false));
    let (before, after) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let deadline = Instant::now() + Duration::from_millis(150);
    std::thread::scope(|s| {
        for t in 0..THREADS as u64 {
            let (binding, host_binding, cache, prefix, ctx) =
                (&binding, &host_binding, &cache, &prefix, &ctx);
            let (lost, before, after, start) = (lost.clone(), before.clone(), after.clone(), start.clone());
            s.spawn(move || {
                let mut rng =
                    Rng(0x9e37_79b9_7f4a_7c15 ^ (index << 8 | t).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
                let sync = ctx.mechanism().sync().unwrap();
                let stream = sync.stream_create().unwrap();
                let mut region = binding.reserve_virtual(16 * granule).ok();
                if let Some(r) = region.as_mut() {
                    let _ = r.map_prefix(prefix);
                }
                let mut allocations = Vec::new();
                let mut cached = Vec::new();
                let mut views = Vec::new();
                start.wait();
                while Instant::now() < deadline {
                    let ok = match rng.below(9) {
                        0 => binding.allocate(64 + rng.below(8192), 64).map(|a| allocations.push(a)).is_ok(),
                        1 => cache.allocate(64 << rng.below(10), 64).map(|a| cached.push(a)).is_ok(),
                        2 => {
                            allocations.clear();
                            cached.clear();
                            false
                        }
                        3 => region.as_mut().is_some_and(|r| {
                            let to = r.len() + granule * (1 + rng.below(3));
                            r.grow_to(to.min(r.capacity()), |_| Ok::<(), ()>(())).is_ok()
                        }),
                        4 => region.as_mut().is_some_and(|r| {
                            let to = (r.len() / 2 / granule * granule).max(2 * granule);
                            r.shrink_to(to, Vec::new()).is_ok()
                        }),
                        5 => region.as_mut().is_some_and(|r| {
                            r.offload_to(host_binding, &stream, Duration::from_secs(2)).is_ok()
                        }),
                        6 => region.as_mut().is_some_and(|r| r.restore(&stream).is_ok()),
                        7 => region.as_mut().is_some_and(|r| {
                            r.privatise(0, granule, &stream, Duration::from_secs(2)).is_ok()
                        }),
                        _ => {
                            // A DLPack view of a region of its own, released
                            // at once or later.
                            match binding.reserve_virtual(4 * granule) {
                                Ok(mut r) => {
                                    let grown = r.grow_to(granule, |_| Ok::<(), ()>(())).is_ok();
                                    let shared = SharedRegion::new(r);
                                    let t = shared
                                        .to_dlpack(&TensorLayout::bytes(granule), ExportOptions::default());
                                    if let Ok(t) = t {
                                        if rng.below(2) == 0 {
                                            views.push(t);
                                        }
                                    }
                                    grown
                                }
                                Err(_) => false,
                            }
                        }
                    };
                    // (Clearing the lists, op 2, is not counted.)
                    if ok {
                        if lost.load(SeqCst) { &after } else { &before }.fetch_add(1, SeqCst);
                    }
                    if views.len() > 4 {
                        views.clear();
                    }
                }
                drop(views);
                drop(region);
                drop((allocations, cached));
                // A stream of a lost context may be refused; its token is
                // plain data either way.
                let _ = sync.stream_destroy(stream);
            });
        }
        start.wait();
        // The loss, at a random moment of the round.
        let mut rng = Rng(index.wrapping_mul(0x9e37_79b9) | 1);
        std::thread::sleep(Duration::from_millis(10 + rng.below(100)));
        lost.store(true, SeqCst);
        ctx.declare_lost("the stress test's random loss");
    });
    drop(prefix);
    drop((binding, host_binding, cache));
    assert_eq!(ctx.state(), LifeState::Lost);
    // Termination settles everything the lost context still held, once.
    let settle_by = Instant::now() + Duration::from_secs(20);
    while ctx.state() != LifeState::Terminated {
        manager.poll();
        assert!(Instant::now() < settle_by, "round {index}: the lost context never terminated");
        std::thread::sleep(Duration::from_millis(2));
    }
    let report = manager.drain(Duration::from_secs(10));
    assert_eq!(
        (device.used(), host.used()),
        (0, 0),
        "round {index}: pools not at zero after termination; {report:?}"
    );
    let q = manager.queue().stats();
    assert_eq!(q.pending, 0, "round {index}: still queued: {q:?}");
    drop(ctx);
    manager.poll();
    // Nothing of the host holds the plugin: no object counted, no handle,
    // nothing queued. (The plugin itself may still hold what the lost
    // context made: a loss the runtime declares is news to the plugin, and
    // its own count is what it says; the host never frees for it.)
    match manager.unload_plugin(&name) {
        Ok(()) => {}
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("the plugin reports")
                    && !text.contains("handle(s)")
                    && !text.contains(" of mechanism"),
                "round {index}: the host still pins the plugin: {text}"
            );
        }
    }
    (before.load(SeqCst), after.load(SeqCst))
}

#[test]
fn random_losses_under_load_settle_every_pool_to_zero_and_unload() {
    let until = Instant::now() + Duration::from_secs_f64(seconds());
    let (mut rounds, mut before, mut after) = (0u64, 0, 0);
    while rounds == 0 || Instant::now() < until {
        let (b, a) = round(rounds);
        before += b;
        after += a;
        rounds += 1;
    }
    println!(
        "{rounds} rounds, {before} operations before the losses, {after} after (refused ones not counted)"
    );
    assert!(before > 0, "nothing ran before the losses: the test exercised nothing");
}
