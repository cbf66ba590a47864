//! Pinned host memory, the second mechanism of each CUDA device
//! (`cuda<N>-host`), against the fake driver (or a real GPU with
//! MEMPLUG_CUDA_TEST_REAL=1; the fake's own rules are then skipped): it is
//! listed with its device, properties and copy kinds; its blocks are host
//! memory the CPU writes directly, copied to device memory and back on
//! either mechanism's streams; frees are exact and a second free is
//! refused (by the plugin, and by the fake as the driver does); alignments
//! are honoured up to the maximum and refused beyond; copy ranges leaving a
//! pinned block are refused; a dead context loses it with its device.

mod common;

use common::*;
use memplug_host::{Allocation, Capabilities, LifeState, Location, Mechanism, Plugin, Status};
use memplug_plugin_cuda_vmm::driver::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use memplug_plugin_cuda_vmm::{
    mechanism_id, pinned_mechanism_id, HOST_ALLOC_FLAGS, MAX_ALIGNMENT, MIN_ALIGNMENT,
};
use memplug_sdk::abi::*;
use std::ffi::c_void;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(20);
const KIB: u64 = 1 << 10;

/// The machine's memory as `sysinfo(2)` says (the plugin reads
/// `/proc/meminfo`: two views of the kernel's one figure).
fn sysinfo_total() -> u64 {
    // SAFETY: an out-struct for the call.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::sysinfo(&mut si) }, 0);
    si.totalram as u64 * u64::from(si.mem_unit)
}

/// The bytes of a block, seen directly by the CPU (the memory is the
/// driver's, not the token's: its lifetime is the caller's to keep).
///
/// # Safety
/// `b` is a live pinned block (host memory), not freed while the slice
/// lives, and nothing else writes it meanwhile.
unsafe fn bytes<'a>(b: &Allocation) -> &'a mut [u8] {
    std::slice::from_raw_parts_mut(b.addr() as *mut u8, b.size() as usize)
}

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

#[test]
fn each_device_has_a_pinned_mechanism_with_its_properties() {
    let _s = serial();
    let p = load();
    let devices = drv().devices.len() as u32;
    for i in 0..devices {
        let m = cuda_host(&p, i);
        assert_eq!(m.id(), pinned_mechanism_id(i));
        assert!((0..devices).all(|d| m.id() != mechanism_id(d)), "id {} collides", m.id());
        assert_eq!(m.device().0, MemplugDevice { kind: MEMPLUG_DEVICE_CUDA_HOST, ordinal: i });
        assert_eq!(m.device().to_string(), format!("cuda_host:{i}"));
        assert_eq!(m.capabilities(), Capabilities(MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_SYNC), "{m:?}");
        let props = m.properties();
        assert_eq!((props.min_alignment, props.max_alignment, props.granularity), (256, MAX_ALIGNMENT, 0));
        let d = props.descriptor;
        assert_eq!(d.location, Location::HOST);
        assert_eq!(
            d.attributes,
            MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT
        );
        assert_eq!((d.page_sizes, d.export_types, d.recommended_granularity), (0, 0, 0), "{d:?}");
        assert_eq!(props.copy_kinds.0, MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST);
        assert!(m.identity().is_none(), "the pinned memory is the host's: no GPU identity");
        assert!(m.sync().unwrap().can_copy());
        // The machine's memory, not the device's.
        let info = m.memory_info().expect("published").unwrap();
        assert_eq!(info.total_bytes, sysinfo_total());
        assert!(info.free_bytes <= info.total_bytes);
        // Device -> pinned copies on the device's own streams need HOST
        // there.
        let dev = p.mechanism(&format!("cuda{i}-vmm")).unwrap();
        assert_ne!(dev.properties().copy_kinds.0 & MEMPLUG_COPY_HOST, 0);
    }
    unload_released(p);
}

#[test]
fn pinned_bytes_round_trip_through_device_memory_on_either_mechanisms_stream() {
    let _s = serial();
    let p = load();
    let (host, dev) = (cuda_host(&p, 0), cuda0(&p));
    // SAFETY: test memory, given back below.
    let (ha, da) = (unsafe { host.ungoverned() }.allocator(), unsafe { dev.ungoverned() }.allocator());
    let live = p.plugin_live_objects();
    let (blocks, calls) = (fake_live_host_allocs(), fake_entry_calls("cuMemHostAlloc"));
    let len = 256 * KIB + 24;
    let (a, b, c) =
        (ha.allocate(len, 256).unwrap(), ha.allocate(len, 256).unwrap(), ha.allocate(len, 256).unwrap());
    let d = da.allocate(len, 256).unwrap();
    assert_eq!(p.plugin_live_objects(), live + 4, "pinned blocks count as live objects");
    if let (Some(before), Some(now)) = (blocks, fake_live_host_allocs()) {
        assert_eq!(now - before, 3);
        assert_eq!(fake_entry_calls("cuMemHostAlloc").unwrap() - calls.unwrap(), 3);
        assert_eq!(fake_host_alloc_flags(a.addr()), Some(i64::from(HOST_ALLOC_FLAGS)));
        assert_eq!(HOST_ALLOC_FLAGS, 1 | 2, "CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP");
    }
    let want = pattern(7, len);
    // SAFETY: live pinned blocks, no copy running yet.
    unsafe {
        bytes(&a).copy_from_slice(&want);
        bytes(&b).fill(0);
        bytes(&c).fill(0);
    }
    // Pinned -> device -> pinned on the device mechanism's stream, then
    // device -> pinned on the pinned mechanism's stream.
    for (m, dst, stage) in [(&dev, &b, true), (&host, &c, false)] {
        let sync = m.sync().unwrap();
        let s = sync.stream_create().unwrap();
        // SAFETY (each copy): live blocks of both mechanisms of device 0,
        // kept until the fence below completed.
        unsafe {
            if stage {
                sync.copy(&s, d.addr(), a.addr(), len).unwrap();
            }
            sync.copy(&s, dst.addr(), d.addr(), len).unwrap();
        }
        let f = sync.fence_record(&s).unwrap();
        assert!(sync.fence_wait(&f, LONG).unwrap());
        sync.fence_destroy(f).unwrap();
        sync.stream_destroy(s).unwrap();
        // SAFETY: the copy into it is complete.
        assert!(unsafe { bytes(dst) } == want.as_slice(), "{}: bytes differ after the round trip", m.name());
    }
    assert_eq!(read(d.addr(), 64), want[..64], "the device copy holds the bytes");
    for blk in [a, b, c] {
        ha.deallocate(blk).unwrap();
    }
    da.deallocate(d).unwrap();
    assert_eq!(p.plugin_live_objects(), live);
    if let Some(before) = blocks {
        eventually("every pinned block freed", || fake_live_host_allocs() == Some(before));
    }
    drop((host, dev));
    unload_released(p);
}

#[test]
fn a_pinned_block_is_freed_once_and_a_second_free_is_refused() {
    let _s = serial();
    let p = load();
    let m = cuda_host(&p, 0);
    let a = unsafe { m.ungoverned() }.allocator();
    let block = a.allocate(64 * KIB, 256).unwrap();
    // SAFETY: a live block.
    unsafe { bytes(&block).fill(1) };
    let raw = block.into_raw();
    let blocks = fake_live_host_allocs();
    a.deallocate(unsafe { Allocation::from_raw(raw) }).unwrap();
    if let Some(before) = blocks {
        eventually("cuMemFreeHost freed it", || fake_live_host_allocs() == Some(before - 1));
    }
    let frees = fake_entry_calls("cuMemFreeHost");
    // SAFETY: deliberately the freed block: it must be refused.
    let e = a.deallocate(unsafe { Allocation::from_raw(raw) }).unwrap_err();
    assert_eq!(e.error.status, Status::UnknownAllocation, "{}", e.error);
    let _ = e.object.into_raw();
    assert_eq!(fake_entry_calls("cuMemFreeHost"), frees, "refused before the driver");
    assert_quiescent(&p);
    drop(p);
}

/// The fake, as the driver: `cuMemFreeHost` of anything but a live
/// block's start is `CUDA_ERROR_INVALID_VALUE`; `cuMemHostAlloc` of size 0
/// or with an unknown flag is refused.
#[test]
fn the_fake_refuses_bad_host_frees_like_the_driver() {
    if real() {
        eprintln!("skipped: the fake's own rules");
        return;
    }
    let _s = serial();
    let api = drv().host_alloc.expect("the fake has cuMemHostAlloc");
    let name = |r: u32| drv().error_name(r);
    in_context(0, |_| unsafe {
        let mut p: *mut c_void = std::ptr::null_mut();
        assert_eq!(name((api.alloc)(&mut p, 0, HOST_ALLOC_FLAGS)), "CUDA_ERROR_INVALID_VALUE", "size 0");
        assert_eq!(name((api.alloc)(&mut p, 4096, 1 << 7)), "CUDA_ERROR_INVALID_VALUE", "unknown flag");
        assert_eq!((api.alloc)(&mut p, 8192, HOST_ALLOC_FLAGS), CUDA_SUCCESS);
        assert_eq!(p.cast::<u8>().read(), 0xa5, "fresh pinned memory holds the fake's pattern");
        assert_eq!((api.free)(p.cast::<u8>().add(4096).cast()), CUDA_ERROR_INVALID_VALUE, "inside a block");
        let mut heap = vec![0u8; 64];
        assert_eq!((api.free)(heap.as_mut_ptr().cast()), CUDA_ERROR_INVALID_VALUE, "never allocated");
        assert_eq!((api.free)(p), CUDA_SUCCESS);
        assert_eq!((api.free)(p), CUDA_ERROR_INVALID_VALUE, "already freed");
    });
    assert_eq!(fake_sticky_code(), 0, "refusals are not faults");
}

#[test]
fn alignments_up_to_the_maximum_are_honoured_and_larger_refused() {
    let _s = serial();
    let p = load();
    let m = cuda_host(&p, 0);
    let a = unsafe { m.ungoverned() }.allocator();
    let mut blocks = Vec::new();
    for align in [1, MIN_ALIGNMENT, 4 * KIB, 64 * KIB, MAX_ALIGNMENT] {
        let b = a.allocate(3 * KIB + 1, align).unwrap();
        assert_eq!(b.addr() % align.max(MIN_ALIGNMENT), 0, "alignment {align}: {:#x}", b.addr());
        // SAFETY: a live block: every byte of its size is writable.
        unsafe { bytes(&b).fill(align as u8) };
        blocks.push(b);
    }
    for bad in [2 * MAX_ALIGNMENT, 3] {
        let e = a.allocate(64, bad).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert!(e.message.contains("power of two") && e.message.contains(&MAX_ALIGNMENT.to_string()), "{e}");
    }
    for b in blocks {
        a.deallocate(b).unwrap();
    }
    drop(m);
    unload_released(p);
}

/// A copy range that meets a pinned block must lie inside it, on either
/// mechanism's stream (the plugin refuses before the driver, saying
/// which); on the pinned mechanism, a range meeting the device's memory
/// follows the device's rules.
#[test]
fn copy_ranges_leaving_a_pinned_block_or_device_memory_are_refused() {
    let _s = serial();
    let p = load();
    let (host, dev) = (cuda_host(&p, 0), cuda0(&p));
    let (ha, da) = (unsafe { host.ungoverned() }.allocator(), unsafe { dev.ungoverned() }.allocator());
    // Sizes short of a page: the ranges below leave the blocks the plugin
    // handed out but not the pages under them (neighbours in the address
    // space are not met).
    let size = 8 * KIB - 512;
    let (pb, db) = (ha.allocate(size, 256).unwrap(), da.allocate(size, 256).unwrap());
    let refused = |m: &Mechanism, dst: u64, src: u64, says: &[&str]| {
        let sync = m.sync().unwrap();
        let s = sync.stream_create().unwrap();
        let calls = fake_entry_calls("cuMemcpyAsync");
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { sync.copy(&s, dst, src, 16) }.unwrap_err();
        assert_eq!(e.status, Status::OutOfRange, "{}: {e}", m.name());
        assert!(says.iter().all(|w| e.message.contains(w)), "{}: {e}", m.name());
        assert_eq!(fake_entry_calls("cuMemcpyAsync"), calls, "the driver was called");
        sync.stream_destroy(s).unwrap();
    };
    let pin_end = pb.addr() + pb.size() - 8;
    let dev_end = db.addr() + db.size() - 8;
    // The other side of each copy: the caller's host memory (the blocks
    // may lie next to each other, and overlapping ranges are refused
    // first).
    let heap = [0u8; 16];
    let other = heap.as_ptr() as u64;
    let pinned = "not wholly inside the pinned block";
    refused(&dev, pin_end, other, &["the dst range", pinned]);
    refused(&dev, other, pin_end, &["the src range", pinned]);
    refused(&host, pin_end, other, &["the dst range", pinned]);
    refused(&host, other, dev_end, &["the src range", "not wholly inside the allocation"]);
    // The fake, as the driver, refuses a range leaving a pinned block (the
    // fake's block: whole pages).
    if !real() {
        let scratch = [0u8; 16];
        let page_end = pb.addr() + 8 * KIB - 8;
        in_context(0, |d| {
            let r =
                unsafe { (d.api.memcpy_async)(page_end, scratch.as_ptr() as u64, 16, std::ptr::null_mut()) };
            assert_eq!(d.error_name(r), "CUDA_ERROR_INVALID_VALUE");
            let ok =
                unsafe { (d.api.memcpy_async)(pb.addr(), scratch.as_ptr() as u64, 16, std::ptr::null_mut()) };
            assert_eq!(ok, CUDA_SUCCESS);
            assert_eq!(unsafe { (d.api.ctx_synchronize)() }, CUDA_SUCCESS);
        });
        // SAFETY: the copy completed.
        assert_eq!(unsafe { &bytes(&pb)[..16] }, &[0u8; 16]);
    }
    ha.deallocate(pb).unwrap();
    da.deallocate(db).unwrap();
    drop((host, dev));
    unload_released(p);
}

/// One context, one loss: a sticky fault met by either mechanism of a
/// device loses both (fake only; in a child process: the fault is for the
/// rest of it).
#[test]
fn a_dead_context_loses_the_pinned_mechanism_with_its_device() {
    if real() || is_child() {
        return;
    }
    let out = run_child("child_pinned_loss", &[(memplug_plugin_cuda_vmm::LOSS_POLL_ENV, None)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("PINNED LOSS OK"));
}

#[test]
#[ignore = "run by a_dead_context_loses_the_pinned_mechanism_with_its_device in a child process"]
fn child_pinned_loss() {
    if !is_child() {
        return;
    }
    let p: Plugin = load();
    let (h0, d0, h1, d1) = (cuda_host(&p, 0), cuda0(&p), cuda_host(&p, 1), cuda1(&p));
    let a0 = unsafe { h0.ungoverned() }.allocator();
    let block = a0.allocate(4096, 256).unwrap();
    assert!(d1.memory_info().unwrap().is_ok(), "retains device 1's context");
    assert_eq!(fake_inject_sticky_fault(700), 0);
    // Device 0: its pinned mechanism meets the fault first.
    let e = a0.allocate(4096, 256).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "{e}");
    assert!(e.message.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    assert_eq!((h0.life_state(), d0.life_state()), (LifeState::Lost, LifeState::Lost));
    assert_eq!(p.service_stats().losses, 2, "both mechanisms of device 0 reported");
    assert_eq!(d0.memory_info().unwrap().unwrap_err().status, Status::DeviceLost);
    assert_eq!(h1.life_state(), LifeState::Active, "device 1 met device 0's fault");
    // Device 1's context did not fault: both its mechanisms keep working
    // (one fault kills one context).
    assert!(d1.memory_info().unwrap().is_ok(), "device 1 met device 0's fault");
    let a1 = unsafe { h1.ungoverned() }.allocator();
    let b1 = a1.allocate(4096, 256).expect("device 1's pinned memory after device 0's fault");
    a1.deallocate(b1).unwrap();
    assert_eq!((h1.life_state(), d1.life_state()), (LifeState::Active, LifeState::Active));
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats), (2, 0), "{stats:?}");
    println!("PINNED LOSS OK");
    // Objects are alive in a lost plugin: it stays loaded.
    let _ = block.into_raw();
    std::mem::forget(p);
}

/// A device region offloaded to its device's pinned host memory (the
/// manager's default offload target on CUDA) and restored at the same
/// address, through the host crate, on the fake driver's VMM.
#[test]
fn a_device_region_offloads_to_pinned_memory_and_restores_at_its_address() {
    use memplug_host::governor::AllocationClass;
    use memplug_host::{BindingSpec, ProcessMemoryManager, Requirements, Residence};
    let _s = serial();
    let mgr = ProcessMemoryManager::new();
    mgr.register_plugin(load()).unwrap();
    let cuda0 = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
    let needs = Requirements { virtual_backing: true, shared_mapping: false, sync: true };
    let ctx = mgr.select(cuda0, needs).unwrap();
    let target = mgr.offload_context(&ctx).unwrap();
    assert_eq!(target.mechanism().name(), "cuda0-host", "the default target is the device's pinned memory");
    let (dev_pool, host_pool) =
        (mgr.create_pool("hbm", 1 << 30).unwrap(), mgr.create_pool("pinned", 1 << 30).unwrap());
    let kv = mgr.bind(&ctx, &dev_pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let host = mgr.bind(&target, &host_pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let sync = ctx.mechanism().sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let g = ctx.mechanism().properties().granularity;
    let mut region = kv.reserve_virtual(8 * g).unwrap();
    region.grow_to(2 * g, |_| Ok::<(), ()>(())).unwrap();
    let (base, want) = (region.addr(), pattern(3, 2 * g));
    write(base, &want).unwrap();
    let report = region.offload_to(&host, &stream, LONG).unwrap();
    assert_eq!((report.released, dev_pool.used(), host_pool.used()), (2 * g, 0, 2 * g));
    let Residence::Host { addr, .. } = region.residence() else { panic!("not offloaded") };
    assert_eq!(read(addr, 64), want[..64], "the pinned copy holds the bytes");
    let fence = region.restore(&stream).unwrap();
    assert!(fence.wait(LONG).unwrap());
    drop(fence);
    assert_eq!(region.addr(), base);
    assert_eq!(read(base, 2 * g as usize), want, "the bytes came back at the same address");
    mgr.poll();
    assert_eq!((dev_pool.used(), host_pool.used()), (2 * g, 0));
    drop(region);
    mgr.poll();
    sync.stream_destroy(stream).unwrap();
    assert_eq!(dev_pool.used(), 0);
}
