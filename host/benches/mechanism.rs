//! Issue-2 budgets (ARCHITECTURE.md §6): allocate+free through the host
//! `Mechanism` wrapper vs the plugin's vtable called directly vs libc
//! malloc/free; commit+decommit of 2 MiB through the host vs raw
//! mprotect/madvise, and the same through a governed region. Run:
//! `cargo bench -p memplug-host --bench mechanism`
//! (`MECHANISM_RATIOS_ONLY=1` skips criterion and prints only the ratios).

mod common;

use common::direct::DirectAllocator;
use criterion::{criterion_group, Criterion};
use memplug_sdk::abi::MemplugEntryV1;
use std::hint::black_box;
use std::time::Duration;

const SIZES: [(u64, &str); 3] = [(64, "64B"), (4096, "4KiB"), (1 << 20, "1MiB")];
const TWO_MIB: usize = 2 << 20;

fn libc_pair(size: u64) -> u64 {
    unsafe {
        let p = libc::malloc(size as usize);
        libc::free(black_box(p));
        p as u64
    }
}

fn direct_of(lib: &libloading::Library) -> DirectAllocator {
    unsafe {
        let entry: libloading::Symbol<MemplugEntryV1> = lib.get(b"memplug_plugin_v1").unwrap();
        DirectAllocator::first_mechanism(*entry).expect("negotiate directly")
    }
}

struct RawRegion(*mut libc::c_void);

impl RawRegion {
    fn new() -> Self {
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TWO_MIB,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        RawRegion(p)
    }
    fn commit_decommit(&self) -> u64 {
        unsafe {
            assert_eq!(libc::mprotect(self.0, TWO_MIB, libc::PROT_READ | libc::PROT_WRITE), 0);
            assert_eq!(libc::madvise(self.0, TWO_MIB, libc::MADV_DONTNEED), 0);
            assert_eq!(libc::mprotect(self.0, TWO_MIB, libc::PROT_NONE), 0);
        }
        self.0 as u64
    }
}

impl Drop for RawRegion {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.0, TWO_MIB) };
    }
}

fn bench(c: &mut Criterion) {
    let (plugin, lib) = common::cpu_plugin();
    let mech = plugin.mechanism("cpu").expect("cpu mechanism").clone();
    let direct = direct_of(&lib);
    let host_pair = |size: u64| {
        let a = unsafe { mech.ungoverned() }.allocator().allocate(size, 16).unwrap();
        let addr = a.addr();
        unsafe { mech.ungoverned() }.allocator().deallocate(a).unwrap();
        addr
    };

    // `MECHANISM_RATIOS_ONLY=1`: only the same-run ratios below.
    let criterion = std::env::var_os("MECHANISM_RATIOS_ONLY").is_none();
    let mut id = 0u64;
    for (size, label) in SIZES.into_iter().filter(|_| criterion) {
        let mut g = c.benchmark_group(format!("alloc_free/{label}"));
        g.bench_function("libc", |b| b.iter(|| libc_pair(black_box(size))));
        g.bench_function("direct", |b| {
            b.iter(|| {
                id += 1;
                direct.pair(black_box(size), 16, id)
            })
        });
        g.bench_function("host", |b| b.iter(|| host_pair(black_box(size))));
        g.finish();
    }

    let vb = unsafe { mech.ungoverned() }.virtual_backing().expect("virtual backing");
    let res = vb.reserve(TWO_MIB as u64).unwrap();
    let raw = RawRegion::new();
    let host_cd = || {
        vb.commit(&res, 0, TWO_MIB as u64).unwrap();
        vb.decommit(&res, 0, TWO_MIB as u64).unwrap();
        res.addr()
    };
    if criterion {
        let mut g = c.benchmark_group("commit_decommit/2MiB");
        g.bench_function("raw", |b| b.iter(|| raw.commit_decommit()));
        g.bench_function("host", |b| b.iter(host_cd));
        g.finish();
    }

    println!();
    for (size, label) in SIZES {
        let iters = if size >= 1 << 20 { 20_000 } else { 200_000 };
        let l = common::ns_per_op(|| libc_pair(size), iters);
        let d = common::ns_per_op(
            || {
                id += 1;
                direct.pair(size, 16, id)
            },
            iters,
        );
        let h = common::ns_per_op(|| host_pair(size), iters);
        common::ratio(&format!("alloc+free {label} host/direct"), "host", h, "direct", d, Some(1.2));
        common::ratio(&format!("alloc+free {label} direct/libc"), "direct", d, "libc", l, Some(2.0));
    }
    let r = common::ns_per_op(|| raw.commit_decommit(), 20_000);
    let h = common::ns_per_op(host_cd, 20_000);
    common::ratio("commit+decommit 2MiB host/raw", "host", h, "raw", r, Some(1.1));
    vb.release(res).unwrap();

    // The governed form of the same pair: a region of a binding grown to
    // 2 MiB and shrunk to nothing (grant, commit, lease, ledger, refund
    // around the same three syscalls).
    let manager = memplug_host::ProcessMemoryManager::new();
    manager.register_plugin(common::cpu_plugin().0).unwrap();
    let ctx = manager.context("cpu").unwrap();
    let pool = manager.create_pool("bench", 1 << 30).unwrap();
    let binding = manager
        .bind(&ctx, &pool, memplug_host::BindingSpec::new(memplug_host::governor::AllocationClass::Other))
        .unwrap();
    let mut region = binding.reserve_virtual(TWO_MIB as u64).unwrap();
    let mut region_cd = || {
        region.grow_to(TWO_MIB as u64, |_| Ok::<(), ()>(())).unwrap();
        region.shrink_to(0, Vec::new()).unwrap();
        region.addr()
    };
    let g = common::ns_per_op(&mut region_cd, 20_000);
    let r = common::ns_per_op(|| raw.commit_decommit(), 20_000);
    common::ratio("commit+decommit 2MiB region/raw", "region", g, "raw", r, Some(1.1));
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().final_summary();
}
