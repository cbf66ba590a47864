//! Runs one hot path N times, for instruction counting with callgrind:
//! `scripts/callgrind.sh` runs it at two N and divides the difference, so
//! set-up cost cancels out. Paths: libc and an atomic pair (baselines),
//! direct (the plugin's vtable), host (the `Mechanism` wrapper), governor
//! (reserve+commit+release), binding (allocate + drop), binding-fenced
//! (allocate + release after an already-complete fence).
//!
//! `hotpath PATH N [PLUGIN.so]`

// The direct-call baseline, the same file the benchmarks use.
#[path = "../benches/common/direct.rs"]
mod direct;

use direct::DirectAllocator;
use memplug_sdk::abi::MemplugEntryV1;
use std::hint::black_box;

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
}

const PATHS: &[(&str, Path)] = &[
    ("libc", Path::Libc),
    ("atomic", Path::Atomic),
    ("direct", Path::Direct),
    ("host", Path::Host),
    ("governor", Path::Governor),
    ("binding", Path::Binding),
    ("binding-fenced", Path::BindingFenced),
];

/// What the paths run against.
struct Rig {
    mech: memplug_host::Mechanism,
    direct: DirectAllocator,
    pool: std::sync::Arc<memplug_host::governor::Pool>,
    binding: memplug_host::MemoryBinding,
    done: memplug_host::SharedFence,
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
    manager.load_plugin(&so, &Default::default()).expect("load plugin");
    let ctx = manager.context("cpu").expect("cpu mechanism");
    let pool = manager.create_pool("cpu0", 1 << 30).unwrap();
    let binding = manager
        .bind(&ctx, &pool, memplug_host::BindingSpec::new(memplug_host::governor::AllocationClass::Other))
        .unwrap();
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let direct = unsafe {
        let e: libloading::Symbol<MemplugEntryV1> = lib.get(b"memplug_plugin_v1").unwrap();
        DirectAllocator::first_mechanism(*e).unwrap()
    };
    let done = memplug_host::FnFence::new("done", || true, |_| true);
    let rig = Rig { mech: ctx.mechanism().clone(), direct, pool, binding, done };
    // Warm every path once so first-use costs (TLS, lazy init) fall
    // outside the difference.
    run(path, 16, &rig);
    run(path, n, &rig);
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
        Path::Libc => {
            for _ in 0..n {
                unsafe {
                    let p = libc::malloc(black_box(64));
                    libc::free(black_box(p));
                }
            }
        }
        Path::Direct => {
            for i in 0..n {
                black_box(direct.pair(64, 16, i + 1_000_000));
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
