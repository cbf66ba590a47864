//! Runs one hot path N times, for instruction counting with callgrind:
//! `scripts/callgrind.sh` runs it at two N and divides the difference, so
//! set-up cost cancels out. Paths: libc, direct, host (more with later
//! layers).
//!
//! `hotpath PATH N [PLUGIN.so]`

use memplug_host::direct::DirectAllocator;
use memplug_sdk::abi::MemplugEntryV1;
use std::hint::black_box;

/// The measured paths, parsed from the command line once: matching the name
/// inside the loop would add a string compare to every iteration, which
/// callgrind counts as part of the path.
#[derive(Clone, Copy)]
enum Path {
    Libc,
    Direct,
    Host,
}

const PATHS: &[(&str, Path)] = &[("libc", Path::Libc), ("direct", Path::Direct), ("host", Path::Host)];

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
    let plugin = memplug_host::Plugin::load(&so).expect("load plugin");
    let mech = plugin.mechanisms()[0].clone();
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let direct = unsafe {
        let e: libloading::Symbol<MemplugEntryV1> = lib.get(b"memplug_plugin_v1").unwrap();
        DirectAllocator::first_mechanism(*e).unwrap()
    };
    // Warm every path once so first-use costs (TLS, lazy init) fall
    // outside the difference.
    run(path, 16, &mech, &direct);
    run(path, n, &mech, &direct);
}

/// One loop per path, so each loop body is only the path being measured.
fn run(path: Path, n: u64, mech: &memplug_host::Mechanism, direct: &DirectAllocator) {
    match path {
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
                let a = mech.allocator().allocate(black_box(64), 16).unwrap();
                mech.allocator().deallocate(black_box(a)).unwrap();
            }
        }
    }
}
