//! Several threads allocating, freeing (now, after completed fences, and
//! after real CPU-stream work), growing and shrinking regions through the
//! same bindings of one pool under pressure, with a holder evicting and a
//! reaper retiring frees concurrently. Afterwards the books balance: the
//! pool is back to zero, the queue is empty, neither side counts a live
//! object, and the plugin unloads.

mod common;

use common::*;
use memplug_host::governor::{AllocationClass, GovernorError, Priority};
use memplug_host::{
    BindingError, BindingSpec, GrowError, MemoryBinding, OwnedAllocation, Region, SharedFence, Status,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const THREADS: u64 = 3;
const RUN: Duration = Duration::from_millis(1500);
const CAPACITY: u64 = 4 * MIB;

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

#[derive(Debug, Default)]
struct Counts {
    allocated: AtomicU64,
    refused: AtomicU64,
    grown: AtomicU64,
    shrunk: AtomicU64,
    stream_frees: AtomicU64,
}

fn is_budget(e: &BindingError) -> bool {
    matches!(e, BindingError::Budget(GovernorError::OutOfBudget(_)))
}

/// How an allocation is handed back: at once, after an already completed
/// fence, or after work on the stream that writes into it.
fn give_back(a: OwnedAllocation, how: u64, stream: &CpuStream, counts: &Counts) {
    match how {
        0 => drop(a),
        1 => a.release_after(vec![Gate::completed("done")]),
        _ => {
            let addr = a.addr();
            // SAFETY: the allocation is released only after the fence
            // recorded behind this function.
            stream.run(move || unsafe { std::ptr::write_volatile(addr as *mut u8, 0xEE) });
            let f: SharedFence = stream.fence();
            a.release_after(vec![f]);
            counts.stream_frees.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn worker(
    seed: u64,
    act: &MemoryBinding,
    cache: &MemoryBinding,
    stash: &Mutex<Vec<OwnedAllocation>>,
    stream: &CpuStream,
    counts: &Counts,
    capacity: u64,
    pool_used: impl Fn() -> u64,
) {
    let mut rng = Rng(seed);
    let mut mine: Vec<OwnedAllocation> = Vec::new();
    let mut region: Option<Region> = None;
    let end = Instant::now() + RUN;
    while Instant::now() < end {
        match rng.below(10) {
            0..=3 => match act.allocate(16 * KIB * (1 + rng.below(16)), 64) {
                Ok(a) => {
                    counts.allocated.fetch_add(1, Ordering::Relaxed);
                    mine.push(a);
                    if mine.len() > 4 {
                        let victim = mine.remove(rng.below(mine.len() as u64) as usize);
                        give_back(victim, rng.below(3), stream, counts);
                    }
                }
                Err(e) if is_budget(&e) => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                    if let Some(a) = mine.pop() {
                        give_back(a, rng.below(3), stream, counts);
                    }
                }
                Err(e) => panic!("allocate: {e}"),
            },
            4..=5 => match cache.allocate(32 * KIB, 64) {
                Ok(a) => stash.lock().unwrap().push(a),
                Err(e) if is_budget(&e) => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => panic!("cache allocate: {e}"),
            },
            6..=7 => {
                let r = match region.as_mut() {
                    Some(r) => r,
                    None => region.insert(act.reserve_virtual(2 * MIB).unwrap()),
                };
                let addr = r.addr();
                let to = (r.len() + 16 * KIB * (1 + rng.below(4))).min(r.capacity());
                match r.grow_to(to, |_| Ok::<(), ()>(())) {
                    Ok(()) => {
                        assert_eq!(r.addr(), addr);
                        counts.grown.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(GrowError::Binding(e)) if is_budget(&e) => {
                        counts.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    // The range still waits for a deferred decommit.
                    Err(GrowError::Binding(BindingError::Plugin(e))) if e.status == Status::Busy => {}
                    Err(e) => panic!("grow: {e}"),
                }
            }
            8 => {
                if let Some(r) = region.as_mut() {
                    let fences = match rng.below(3) {
                        0 => Vec::new(),
                        1 => vec![Gate::completed("done")],
                        _ => vec![stream.fence()],
                    };
                    r.shrink_to(r.len() / 2, fences).unwrap();
                    counts.shrunk.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                // Drop the region now and then, in flight or not.
                if let Some(mut r) = region.take() {
                    if rng.below(2) == 0 {
                        r.used_by(stream.fence());
                    }
                    drop(r);
                }
            }
        }
        let used = pool_used();
        assert!(used <= capacity, "the pool charged {used} B of {capacity}");
    }
    for a in mine {
        give_back(a, 2, stream, counts);
    }
}

#[test]
fn threads_under_pressure_leave_the_ledger_balanced_and_the_plugin_unloadable() {
    within(60, || {
        let rig = Rig::cpu("concurrency", CAPACITY);
        rig.manager.start_reaper(Duration::from_millis(1));
        let m = rig.mechanism().clone();
        let stash: Arc<Mutex<Vec<OwnedAllocation>>> = Arc::default();
        let evicted = Arc::new(AtomicU64::new(0));
        let (s, ev) = (stash.clone(), evicted.clone());
        let holder = rig.pool.register_holder("cache", Priority(0), move |t| {
            let mut victims = Vec::new();
            let mut bytes = 0;
            {
                let mut v = s.lock().unwrap();
                while bytes < t.bytes_wanted && !v.is_empty() {
                    let a = v.swap_remove(0);
                    bytes += a.charged();
                    victims.push(a);
                }
            }
            ev.fetch_add(victims.len() as u64, Ordering::Relaxed);
            drop(victims);
            bytes
        });
        let act = rig
            .manager
            .bind(
                &rig.context,
                &rig.pool,
                BindingSpec::new(AllocationClass::Activations).wait(Duration::from_millis(20)),
            )
            .unwrap();
        let cache = rig
            .manager
            .bind(&rig.context, &rig.pool, BindingSpec::new(AllocationClass::Kv).holder(holder.id()))
            .unwrap();
        let stream = CpuStream::new(&m);
        let counts = Counts::default();

        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (act, cache, stash, stream, counts) = (&act, &cache, &*stash, &stream, &counts);
                let pool = rig.pool.clone();
                sc.spawn(move || {
                    worker(
                        0x9E37_79B9_7F4A_7C15 ^ ((t + 1) * 0x1000_0001),
                        act,
                        cache,
                        stash,
                        stream,
                        counts,
                        CAPACITY,
                        move || pool.used(),
                    )
                });
            }
        });

        let snap = rig.pool.snapshot();
        eprintln!(
            "{counts:?}; evicted {}; pool peak {} B, {} tickets, {} waits ({} timed out)",
            evicted.load(Ordering::Relaxed),
            snap.peak,
            snap.pressure.tickets,
            snap.waits,
            snap.wait_timeouts
        );
        assert!(counts.allocated.load(Ordering::Relaxed) > 0);
        assert!(counts.grown.load(Ordering::Relaxed) > 0);
        assert!(counts.stream_frees.load(Ordering::Relaxed) > 0);
        assert!(snap.pressure.tickets > 0, "the run never reached the capacity");
        assert!(evicted.load(Ordering::Relaxed) > 0, "the holder never evicted");

        // Teardown: everything the test still holds goes, then the queue
        // drains (its last entries wait on stream work).
        stash.lock().unwrap().clear();
        drop((act, cache, holder));
        let report = rig.manager.drain(Duration::from_secs(10));
        assert!(report.is_complete(), "left in the queue: {:?}", report.left);
        let q = rig.manager.queue().stats();
        assert_eq!((q.pending, q.quarantined, q.fence_errors), (0, 0, 0), "{q:?}");
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
        assert!(rig.pool.snapshot().totals().leaked_leases == 0);
        drop(stream);
        assert_eq!(live(&m), [0; 5]);
        drop(m);
        rig.unload();
    });
}
