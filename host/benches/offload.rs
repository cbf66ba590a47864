//! Offload+restore and copy-on-write against the copies they are made of,
//! in one run, on the CPU plugin (its stream worker does the copies):
//!
//! * an offload+restore round trip of a region (allocate the host copy,
//!   copy out, decommit, recommit, copy back, free the copy) vs the same
//!   bytes copied out and back with `memcpy`, and vs the same two copies
//!   on the mechanism's stream (the copy slot alone, with its fence waits),
//!   and vs `memcpy` into fresh pages both ways (what an offload does
//!   physically: the host copy and the recommitted range are new pages);
//! * privatising one granule of a shared prefix vs a `memcpy` of one
//!   granule and vs one stream copy of it (the privatise is measured as a
//!   region's reserve + map + privatise + release minus its reserve + map
//!   + release).
//!
//! Run: `cargo bench -p memplug-host --bench offload` (prints figures).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, PluginFence, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::time::Duration;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn main() {
    let (plugin, _lib) = common::cpu_plugin();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let ctx = manager.select(CPU0, all).unwrap();
    let m = ctx.mechanism().clone();
    let g = m.properties().granularity;
    let device = manager.create_pool("device", 1 << 40).unwrap();
    let host_pool = manager.create_pool("host", 1 << 40).unwrap();
    let kv = manager.bind(&ctx, &device, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let host = manager.bind(&ctx, &host_pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();

    for size in [MIB, 16 * MIB, 64 * MIB] {
        let iters = (256 * MIB / size).max(4);
        let mut region = kv.reserve_virtual(size).unwrap();
        region
            .grow_to(size, |v| {
                // SAFETY: CPU memory just committed, this region's alone.
                unsafe { std::slice::from_raw_parts_mut(v.addr as *mut u8, v.len as usize) }.fill(0x5A);
                Ok::<(), ()>(())
            })
            .unwrap();
        let round_trip = common::ns_per_op(
            || {
                region.offload_to(&host, &stream, WAIT).unwrap();
                let f = region.restore(&stream).unwrap();
                assert!(f.wait(WAIT).unwrap());
                manager.poll();
                region.addr()
            },
            iters,
        );
        let buffer = host.allocate(size, g).unwrap();
        let (dev, buf) = (region.addr(), buffer.addr());
        let memcpy = common::ns_per_op(
            || {
                // SAFETY: both committed CPU memory of `size` bytes, disjoint.
                unsafe {
                    std::ptr::copy_nonoverlapping(dev as *const u8, buf as *mut u8, size as usize);
                    std::ptr::copy_nonoverlapping(buf as *const u8, dev as *mut u8, size as usize);
                }
                buf
            },
            iters,
        );
        let stream_copies = common::ns_per_op(
            || {
                // SAFETY: as above; each copy waited for before the next use.
                unsafe { sync.copy(&stream, buf, dev, size).unwrap() };
                unsafe { sync.copy(&stream, dev, buf, size).unwrap() };
                let f = PluginFence::record(&m, &stream).unwrap();
                assert!(f.wait(WAIT).unwrap());
                buf
            },
            iters,
        );
        // What an offload must do physically: the copy lands in fresh host
        // pages and the bytes come back into fresh device pages (the range
        // was given back), each first touched by the copy.
        let fresh = common::ns_per_op(
            || {
                // SAFETY: a private anonymous mapping of `size` bytes, used
                // and unmapped here; `dev` is the region's committed range,
                // whose pages MADV_DONTNEED gives back (the region is
                // private memory: it reads as zeros until written again).
                unsafe {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    assert_ne!(p, libc::MAP_FAILED);
                    std::ptr::copy_nonoverlapping(dev as *const u8, p as *mut u8, size as usize);
                    libc::madvise(dev as *mut libc::c_void, size as usize, libc::MADV_DONTNEED);
                    std::ptr::copy_nonoverlapping(p as *const u8, dev as *mut u8, size as usize);
                    libc::munmap(p, size as usize);
                }
                buf
            },
            iters,
        );
        let label = format!("{} MiB", size / MIB);
        let gbps = |ns: f64| 2.0 * size as f64 / ns;
        println!(
            "offload+restore {label:>7}: {:>10.0} ns ({:.2} GB/s moved); memcpy out+in {:>10.0} ns ({:.2} GB/s); \
             stream copies {:>10.0} ns ({:.2} GB/s); memcpy into fresh pages {:>10.0} ns ({:.2} GB/s)",
            round_trip,
            gbps(round_trip),
            memcpy,
            gbps(memcpy),
            stream_copies,
            gbps(stream_copies),
            fresh,
            gbps(fresh)
        );
        common::ratio(
            &format!("offload+restore/fresh-page copies {label}"),
            "offload",
            round_trip,
            "fresh",
            fresh,
            None,
        );
        common::ratio(
            &format!("offload+restore/memcpy {label}"),
            "offload",
            round_trip,
            "memcpy",
            memcpy,
            None,
        );
        common::ratio(
            &format!("offload+restore/stream copies {label}"),
            "offload",
            round_trip,
            "copies",
            stream_copies,
            None,
        );
        drop(buffer);
        drop(region);
        manager.poll();
    }

    // Copy-on-write of one granule of a 4-granule prefix.
    let prefix = kv.create_shared(4 * g, |_| {}).unwrap();
    let iters = 2_000;
    let with_cow = common::ns_per_op(
        || {
            let mut r = kv.reserve_virtual(8 * g).unwrap();
            r.map_prefix(&prefix).unwrap();
            let f = r.privatise(3 * g, g, &stream, WAIT).unwrap();
            assert!(f.wait(WAIT).unwrap());
            let a = r.addr();
            drop(r);
            manager.poll();
            a
        },
        iters,
    );
    let without = common::ns_per_op(
        || {
            let mut r = kv.reserve_virtual(8 * g).unwrap();
            r.map_prefix(&prefix).unwrap();
            let a = r.addr();
            drop(r);
            manager.poll();
            a
        },
        iters,
    );
    let privatise = with_cow - without;
    let (src, dst) = (kv.allocate(g, g).unwrap(), kv.allocate(g, g).unwrap());
    let (s, d) = (src.addr(), dst.addr());
    let memcpy = common::ns_per_op(
        || {
            // SAFETY: two live CPU allocations of one granule.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, g as usize) };
            d
        },
        iters * 50,
    );
    let one_copy = common::ns_per_op(
        || {
            // SAFETY: as above, waited for before the next.
            unsafe { sync.copy(&stream, d, s, g).unwrap() };
            let f = PluginFence::record(&m, &stream).unwrap();
            assert!(f.wait(WAIT).unwrap());
            d
        },
        iters,
    );
    println!(
        "privatise of one {} KiB granule: {privatise:.0} ns (reserve+map+privatise+release {with_cow:.0} ns - \
         reserve+map+release {without:.0} ns)",
        g >> 10
    );
    common::ratio("privatise/memcpy 1 granule", "privatise", privatise, "memcpy", memcpy, None);
    common::ratio("privatise/stream copy 1 granule", "privatise", privatise, "copy", one_copy, None);
    drop((src, dst, prefix));
    manager.poll();
    sync.stream_destroy(stream).unwrap();
}
