//! Several threads make and free memory of every kind — allocations freed
//! behind their stream's fences, regions that grow, shrink, privatise part
//! of a shared prefix, offload and restore, a caching binding, DLPack views
//! of regions released before or after the loss — while
//! another thread declares the device lost at a random moment, with the
//! reaper running. At the end, with everything dropped: every pool at
//! exactly zero, nothing queued, the context terminated, and nothing of the
//! host pins the plugin.
//!
//! Bounded: `MEMPLUG_LOSS_STRESS_MS` (default 1500) is the time the workers
//! run; `MEMPLUG_LOSS_STRESS_SEED` replays a run (the seed is printed). The
//! long run (README, Testing):
//! `MEMPLUG_LOSS_STRESS_MS=180000 cargo nextest run -p memplug-host --test loss_stress`.
//!
//! The same run again in a child process with `MEMPLUG_NO_MEMBARRIER=1`:
//! the operation gate's fallback, a full fence on both sides, where the
//! kernel has no `membarrier` (`lifecycle/barrier.rs`).
//!
//! The host copies of offloads are in a pool of the same context here: the
//! reference CPU plugin's stream workers do not stop at a loss the runtime
//! declares, so memory of a healthy pool they may still be copying into
//! cannot be freed under them in this test (`waits.rs` and the offload
//! model test that case with a shim whose loss stops the stream).

mod common;

use common::*;
use memplug_host::dlpack::{ExportOptions, SharedRegion, TensorLayout};
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, LifeState, OwnedAllocation, Region, StreamKey};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: usize = 4;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64*: enough randomness for choosing steps, and replayable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn random_losses_under_concurrent_work_end_with_every_pool_at_zero() {
    if std::env::var_os("MEMPLUG_NO_MEMBARRIER").is_some_and(|v| v == "1") {
        assert!(!memplug_host::lifecycle::uses_membarrier(), "MEMPLUG_NO_MEMBARRIER=1 is obeyed");
    }
    let run_for = Duration::from_millis(env_u64("MEMPLUG_LOSS_STRESS_MS", 1500));
    let seed = env_u64(
        "MEMPLUG_LOSS_STRESS_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 20
            | 1,
    );
    println!("MEMPLUG_LOSS_STRESS_SEED={seed}");
    let rig = Rig::cpu("loss-stress", 1 << 30);
    let g = rig.mechanism().properties().granularity;
    rig.manager.start_reaper(Duration::from_millis(1));
    let host_pool = rig.manager.create_pool("host", 1 << 30).unwrap();
    let host = rig.manager.bind(&rig.context, &host_pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let cache_pool = rig.manager.create_pool("cache", 1 << 30).unwrap();
    let cache = rig
        .manager
        .bind_caching(
            &rig.context,
            &cache_pool,
            BindingSpec::new(AllocationClass::Activations),
            CacheConfig::default(),
        )
        .unwrap();
    let prefix = rig.binding.create_shared(4 * g, |_| {}).unwrap();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut rng = Rng(seed);
    let lose_after = Duration::from_micros(rng.below(run_for.as_micros() as u64));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (b, host, cache, prefix) = (rig.binding.clone(), host.clone(), cache.clone(), prefix.clone());
            let (start, stop) = (start.clone(), stop.clone());
            let mut rng = Rng(seed.wrapping_add(t as u64 * 0x9e37_79b9) | 1);
            let m = rig.mechanism().clone();
            std::thread::spawn(move || {
                let stream = CpuStream::new(&m);
                let s = stream.stream();
                // After the loss no fence can be recorded: free without one
                // (a lost context's objects need none).
                let fences = || memplug_host::PluginFence::record(&m, s).map(|f| vec![f]).unwrap_or_default();
                let mut allocs: Vec<OwnedAllocation> = Vec::new();
                let mut regions: Vec<Region> = Vec::new();
                let mut views = Vec::new();
                let wait = Duration::from_secs(5);
                start.wait();
                while !stop.load(SeqCst) {
                    let pick = |rng: &mut Rng, n: usize| rng.below(n as u64) as usize;
                    match rng.below(11) {
                        0 => {
                            if let Ok(a) = b.allocate(1 + rng.below(64 * 1024), 64) {
                                allocs.push(a);
                            }
                        }
                        1 if !allocs.is_empty() => {
                            let a = allocs.swap_remove(pick(&mut rng, allocs.len()));
                            if rng.below(2) == 0 {
                                a.release_after(fences());
                            }
                        }
                        2 => {
                            if let Ok(mut r) = b.reserve_virtual(16 * g) {
                                if rng.below(2) == 0 {
                                    let _ = r.map_prefix(&prefix);
                                }
                                regions.push(r);
                            }
                        }
                        3 if !regions.is_empty() => {
                            let i = pick(&mut rng, regions.len());
                            let len = regions[i].len() + (1 + rng.below(3)) * g;
                            let _ = regions[i].grow_to(len.min(16 * g), |_| Ok::<(), ()>(()));
                        }
                        4 if !regions.is_empty() => {
                            let i = pick(&mut rng, regions.len());
                            let len = rng.below(regions[i].len() + 1);
                            let _ = regions[i].shrink_to(len, fences());
                        }
                        5 if !regions.is_empty() => {
                            let i = pick(&mut rng, regions.len());
                            let _ = regions[i].offload_to(&host, s, wait);
                        }
                        6 if !regions.is_empty() => {
                            let i = pick(&mut rng, regions.len());
                            let _ = regions[i].restore(s);
                        }
                        7 if !regions.is_empty() => {
                            let i = pick(&mut rng, regions.len());
                            let _ = regions[i].privatise(rng.below(4) * g, g, s, wait);
                        }
                        8 if !regions.is_empty() => {
                            let r = regions.swap_remove(pick(&mut rng, regions.len()));
                            r.release_after(fences());
                        }
                        9 => {
                            if let Ok(c) = cache.allocate(1 + rng.below(256 * 1024), 64) {
                                if let (0, Some(f)) = (rng.below(2), fences().pop()) {
                                    c.free_on(StreamKey::of(s), f);
                                }
                            }
                        }
                        _ => {
                            // A DLPack view of a region of its own, its
                            // deleter run now or a few operations later
                            // (after the loss, perhaps).
                            if views.len() > 4 || rng.below(2) == 0 {
                                views.clear();
                            } else if let Ok(mut r) = b.reserve_virtual(4 * g) {
                                if r.grow_to(g, |_| Ok::<(), ()>(())).is_ok() {
                                    let shared = SharedRegion::new(r);
                                    if let Ok(t) =
                                        shared.to_dlpack(&TensorLayout::bytes(g), ExportOptions::default())
                                    {
                                        views.push(t);
                                    }
                                }
                            }
                        }
                    }
                }
                drop((allocs, regions, views));
                drop(stream);
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(lose_after);
    rig.context.declare_lost("the stress test lost it");
    std::thread::sleep(run_for.saturating_sub(began.elapsed()));
    stop.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    drop((host, cache, prefix));
    assert!(
        eventually(Duration::from_secs(30), || {
            rig.manager.poll();
            rig.context.state() == LifeState::Terminated && rig.manager.queue().pending() == 0
        }),
        "terminated with nothing queued (seed {seed}): {:?} {:?}",
        rig.context.state(),
        rig.manager.queue().stats()
    );
    for p in [&rig.pool, &host_pool, &cache_pool] {
        assert_eq!(p.used(), 0, "pool {} (seed {seed})", p.name());
    }
    let (_, unloaded) = rig.try_unload();
    if let Err(e) = unloaded {
        assert!(!e.contains("pinned"), "nothing of the host pins the plugin (seed {seed}): {e}");
    }
}

#[test]
fn the_same_with_full_fences_where_the_kernel_has_no_membarrier() {
    if std::env::var_os("MEMPLUG_NO_MEMBARRIER").is_some() {
        return; // the child itself, when a filter matched this test too
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "random_losses_under_concurrent_work_end_with_every_pool_at_zero", "--nocapture"])
        .env("MEMPLUG_NO_MEMBARRIER", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}
