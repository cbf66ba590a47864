//! Runs one hot path N times, for instruction counting with callgrind:
//! `scripts/callgrind.sh` runs it at two N and divides the difference, so
//! set-up cost cancels out. Paths: libc and an atomic pair (baselines),
//! direct (the plugin's vtable), host (the `Mechanism` wrapper), governor
//! (reserve+commit+release), binding (allocate + drop), binding-fenced
//! (allocate + release after an already-complete fence); poll-1, poll-1k,
//! poll-100k (one enqueue behind an already-complete stream fence and one
//! deferred-free `poll`, with 1 / 1000 / 100 000 other frees pending on
//! distinct fences of a stream that never finishes: the per-op figure is
//! one poll with that many pending); shrink-0, shrink-100, shrink-10k (a
//! region grow + shrink naming a completed fence, after 0 / 100 / 10 000
//! earlier fenced shrinks whose fences completed); cached (a caching
//! binding's allocate + drop of a 64 B block, a hit every time) and
//! cached-stream (allocate on a stream + free on it behind a fence);
//! cached-miss (a cache that keeps nothing idle, `max_idle_bytes` 0: every
//! allocate is a miss and every free gives the block back, against
//! `binding`); commit-2m (commit + decommit of 2 MiB through the host's
//! virtual backing) and commit-2m-raw (the same syscalls on a raw `mmap`).
//!
//! `hotpath PATH N [PLUGIN.so]`

// The direct-call baseline, the same file the benchmarks use.
#[path = "../benches/common/direct.rs"]
mod direct;

use direct::DirectAllocator;
use memplug_sdk::abi::MemplugEntryV1;
use std::hint::black_box;

const TWO_MIB: u64 = 2 << 20;

/// The measured paths, parsed from the command line once: matching the name
/// inside the loop would add a string compare to every iteration, which
/// callgrind counts as part of the path.
#[derive(Clone, Copy)]
enum Path {
    Libc,
    Atomic,
    Direct,
    Host,
    Governor,
    Binding,
    BindingFenced,
    Cached,
    CachedStream,
    CachedMiss,
    /// Reserve 2 MiB of a region and release it (no commit).
    Reserve,
    /// Commit + decommit 2 MiB of a reservation through the host's
    /// virtual backing (the syscalls dominate: count them with `strace -c`
    /// or `perf stat -e`, not only callgrind).
    Commit2m,
    /// The same three syscalls called raw on a 2 MiB `mmap` of our own,
    /// the baseline of `commit-2m`.
    Commit2mRaw,
    /// A region grown to 2 MiB and shrunk to nothing with no fence: the
    /// governed form of `commit-2m` (grant, commit, lease, ledger, refund).
    Region2m,
    /// Reserve a region of 8 granules, map a one-granule shared prefix at
    /// its start, release it: `reserve` plus the prefix's map and unmap.
    MapPrefix,
    /// n frees pending on fences that never complete.
    Poll(usize),
    /// n earlier fenced shrinks of the region.
    Shrink(usize),
}

const PATHS: &[(&str, Path)] = &[
    ("libc", Path::Libc),
    ("atomic", Path::Atomic),
    ("direct", Path::Direct),
    ("host", Path::Host),
    ("governor", Path::Governor),
    ("binding", Path::Binding),
    ("binding-fenced", Path::BindingFenced),
    ("cached", Path::Cached),
    ("cached-stream", Path::CachedStream),
    ("cached-miss", Path::CachedMiss),
    ("reserve", Path::Reserve),
    ("commit-2m", Path::Commit2m),
    ("commit-2m-raw", Path::Commit2mRaw),
    ("region-2m", Path::Region2m),
    ("map-prefix", Path::MapPrefix),
    ("poll-1", Path::Poll(1)),
    ("poll-1k", Path::Poll(1000)),
    ("poll-100k", Path::Poll(100_000)),
    ("shrink-0", Path::Shrink(0)),
    ("shrink-100", Path::Shrink(100)),
    ("shrink-10k", Path::Shrink(10_000)),
];

/// What the paths run against.
struct Rig {
    mech: memplug_host::Mechanism,
    direct: DirectAllocator,
    pool: std::sync::Arc<memplug_host::governor::Pool>,
    binding: memplug_host::MemoryBinding,
    cache: memplug_host::CachingBinding,
    keeps_nothing: memplug_host::CachingBinding,
    done: memplug_host::SharedFence,
    poll: Option<PollRig>,
    shrink: Option<std::cell::RefCell<memplug_host::Region>>,
    prefix: Option<std::sync::Arc<memplug_host::SharedPrefix>>,
}

/// A free that does nothing: the poll paths measure the queue, not a free.
struct Nop;

impl memplug_host::Retire for Nop {
    fn retire(self: Box<Self>) -> memplug_host::RetireOutcome {
        memplug_host::RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        "nop".into()
    }
}

/// A queue with n frees pending on distinct fences of a stream blocked for
/// good, and a fence of another stream that has completed.
struct PollRig {
    queue: std::sync::Arc<memplug_host::DeferredFreeQueue>,
    ready: memplug_host::SharedFence,
}

impl PollRig {
    fn new(mech: &memplug_host::Mechanism, n: usize) -> PollRig {
        let sync = mech.sync().expect("the cpu plugin has streams");
        let queue = memplug_host::DeferredFreeQueue::new();
        let blocked = sync.stream_create().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // Blocks the stream's worker for the rest of the process (a futex
        // wait, so no instructions counted while it waits); `tx` leaks.
        sync.enqueue(&blocked, move || {
            let _ = rx.recv();
        })
        .unwrap();
        std::mem::forget(tx);
        for _ in 0..n {
            let f = memplug_host::PluginFence::record(mech, &blocked).unwrap();
            queue.enqueue(vec![f], Box::new(Nop));
        }
        let done = sync.stream_create().unwrap();
        let ready = memplug_host::PluginFence::record(mech, &done).unwrap();
        assert!(ready.wait(std::time::Duration::from_secs(10)).unwrap());
        // Both streams stay for the process's life: tokens without a
        // destructor, never handed back to the plugin.
        let _ = (blocked, done);
        PollRig { queue, ready }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--list") {
        let names: Vec<&str> = PATHS.iter().map(|(name, _)| *name).collect();
        println!("{}", names.join(" "));
        return;
    }
    let name = args.get(1).map(String::as_str).unwrap_or("host");
    let path = match PATHS.iter().find(|(n, _)| *n == name) {
        Some(&(_, p)) => p,
        None => panic!("unknown path {name}"),
    };
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let so = args.get(3).cloned().or_else(|| std::env::var("MEMPLUG_CPU_PLUGIN").ok()).expect("plugin path");
    let manager = memplug_host::ProcessMemoryManager::new();
    // HOTPATH_CHECK_OVERLAPS=1 (every block) or 0 (none) overrides the
    // default overlap check (LoadOptions::check_overlaps), to price it.
    let mut opts = memplug_host::LoadOptions::default();
    if let Ok(v) = std::env::var("HOTPATH_CHECK_OVERLAPS") {
        use memplug_host::OverlapCheck;
        opts.check_overlaps = if v == "1" { OverlapCheck::All } else { OverlapCheck::Off };
    }
    manager.load_plugin(&so, &opts).expect("load plugin");
    let ctx = manager.context("cpu").expect("cpu mechanism");
    let pool = manager.create_pool("cpu0", 1 << 30).unwrap();
    let binding = manager
        .bind(&ctx, &pool, memplug_host::BindingSpec::new(memplug_host::governor::AllocationClass::Other))
        .unwrap();
    let cache = manager
        .bind_caching(
            &ctx,
            &pool,
            memplug_host::BindingSpec::new(memplug_host::governor::AllocationClass::Activations),
            memplug_host::CacheConfig::default(),
        )
        .unwrap();
    let keeps_nothing = manager
        .bind_caching(
            &ctx,
            &pool,
            memplug_host::BindingSpec::new(memplug_host::governor::AllocationClass::Workspace),
            memplug_host::CacheConfig {
                holder_name: "keeps-nothing".into(),
                idle: memplug_host::IdlePolicy { max_idle_bytes: Some(0), ..Default::default() },
                ..Default::default()
            },
        )
        .unwrap();
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let direct = unsafe {
        let e: libloading::Symbol<MemplugEntryV1> = lib.get(b"memplug_plugin_v1").unwrap();
        DirectAllocator::first_mechanism(*e).unwrap()
    };
    let done = memplug_host::FnFence::new("done", || true, |_| true);
    let mech = ctx.mechanism().clone();
    let poll = match path {
        Path::Poll(k) => Some(PollRig::new(&mech, k)),
        _ => None,
    };
    let shrink = match path {
        Path::Region2m => Some(std::cell::RefCell::new(binding.reserve_virtual(TWO_MIB).unwrap())),
        Path::Shrink(k) => {
            let mut r = binding.reserve_virtual(1 << 20).unwrap();
            for _ in 0..k {
                let f = memplug_host::FnFence::new("done", || true, |_| true);
                r.grow_to(1, |_| Ok::<(), ()>(())).unwrap();
                r.shrink_to(0, vec![f]).unwrap();
            }
            Some(std::cell::RefCell::new(r))
        }
        _ => None,
    };
    let prefix = match path {
        Path::MapPrefix => {
            let g = mech.properties().granularity;
            Some(binding.create_shared(g, |_| {}).unwrap())
        }
        _ => None,
    };
    let rig = Rig { mech, direct, pool, binding, cache, keeps_nothing, done, poll, shrink, prefix };
    // Warm every path once so first-use costs (TLS, lazy init) fall
    // outside the difference.
    run(path, 16, &rig);
    run(path, n, &rig);
    if let Path::Poll(_) = path {
        // The blocked stream never finishes: skip the teardown's drain.
        std::process::exit(0);
    }
}

/// One loop per path, so each loop body is only the path being measured.
fn run(path: Path, n: u64, rig: &Rig) {
    let (mech, direct) = (&rig.mech, &rig.direct);
    match path {
        Path::Atomic => {
            let a = std::sync::atomic::AtomicU64::new(0);
            for _ in 0..n {
                a.fetch_add(black_box(64), std::sync::atomic::Ordering::AcqRel);
                a.fetch_sub(black_box(64), std::sync::atomic::Ordering::AcqRel);
            }
        }
        Path::Governor => {
            use memplug_host::governor::AllocationClass;
            for _ in 0..n {
                let g = rig.pool.try_reserve(black_box(64), AllocationClass::Other, None).unwrap();
                let lease = g.commit(64).unwrap();
                rig.pool.release(black_box(lease)).unwrap();
            }
        }
        Path::Binding => {
            for _ in 0..n {
                drop(black_box(rig.binding.allocate(black_box(64), 16).unwrap()));
            }
        }
        Path::BindingFenced => {
            for _ in 0..n {
                let a = rig.binding.allocate(black_box(64), 16).unwrap();
                a.release_after([rig.done.clone()]);
            }
        }
        Path::Cached => {
            for _ in 0..n {
                drop(black_box(rig.cache.allocate(black_box(64), 16).unwrap()));
            }
        }
        Path::CachedMiss => {
            for _ in 0..n {
                drop(black_box(rig.keeps_nothing.allocate(black_box(64), 16).unwrap()));
            }
        }
        Path::CachedStream => {
            let s = memplug_host::StreamKey::runtime(7);
            for _ in 0..n {
                let a = rig.cache.allocate_on(black_box(64), 16, s).unwrap();
                a.free_on(s, rig.done.clone());
            }
        }
        Path::Reserve => {
            for _ in 0..n {
                drop(black_box(rig.binding.reserve_virtual(black_box(2 << 20)).unwrap()));
            }
        }
        Path::Commit2m => {
            let vb = unsafe { mech.ungoverned() }.virtual_backing().expect("virtual backing");
            let res = vb.reserve(TWO_MIB).unwrap();
            for _ in 0..n {
                vb.commit(&res, 0, black_box(TWO_MIB)).unwrap();
                vb.decommit(&res, 0, black_box(TWO_MIB)).unwrap();
            }
            vb.release(res).unwrap();
        }
        Path::Commit2mRaw => unsafe {
            let len = TWO_MIB as usize;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0);
            assert_ne!(p, libc::MAP_FAILED);
            for _ in 0..n {
                assert_eq!(libc::mprotect(p, black_box(len), libc::PROT_READ | libc::PROT_WRITE), 0);
                assert_eq!(libc::madvise(p, len, libc::MADV_DONTNEED), 0);
                assert_eq!(libc::mprotect(p, len, libc::PROT_NONE), 0);
            }
            libc::munmap(p, len);
        },
        Path::Region2m => region_2m(n, rig),
        Path::MapPrefix => map_prefix(n, rig),
        Path::Poll(_) => {
            let p = rig.poll.as_ref().expect("set up");
            for _ in 0..n {
                p.queue.enqueue(vec![p.ready.clone()], Box::new(Nop));
                let r = p.queue.poll();
                assert_eq!(black_box(r).retired, 1);
            }
        }
        Path::Shrink(_) => {
            let mut r = rig.shrink.as_ref().expect("set up").borrow_mut();
            for _ in 0..n {
                r.grow_to(black_box(1), |_| Ok::<(), ()>(())).unwrap();
                r.shrink_to(0, vec![rig.done.clone()]).unwrap();
            }
        }
        Path::Libc => {
            for _ in 0..n {
                unsafe {
                    let p = libc::malloc(black_box(64));
                    libc::free(black_box(p));
                }
            }
        }
        Path::Direct => {
            // The object ids counted directly: one induction variable.
            for id in 1_000_000..1_000_000 + n {
                black_box(direct.pair(64, 16, id));
            }
        }
        Path::Host => {
            for _ in 0..n {
                let a = unsafe { mech.ungoverned() }.allocator().allocate(black_box(64), 16).unwrap();
                unsafe { mech.ungoverned() }.allocator().deallocate(black_box(a)).unwrap();
            }
        }
    }
}

// The region paths out of line, so that adding them left the code of the
// loops above as it was (instruction counts of `host` moved by 6 when these
// loops were inlined into `run`).
#[inline(never)]
fn region_2m(n: u64, rig: &Rig) {
    let mut r = rig.shrink.as_ref().expect("set up").borrow_mut();
    for _ in 0..n {
        r.grow_to(black_box(TWO_MIB), |_| Ok::<(), ()>(())).unwrap();
        r.shrink_to(0, Vec::new()).unwrap();
    }
}

#[inline(never)]
fn map_prefix(n: u64, rig: &Rig) {
    let prefix = rig.prefix.as_ref().expect("set up");
    let g = rig.mech.properties().granularity;
    for _ in 0..n {
        let mut r = rig.binding.reserve_virtual(black_box(8 * g)).unwrap();
        r.map_prefix(prefix).unwrap();
        drop(black_box(r));
    }
}
