//! The CUDA VMM plugin through the host, against the fake driver (or a real
//! GPU with MEMPLUG_CUDA_TEST_REAL=1): allocation, reserve/commit/decommit,
//! shared mappings, streams and fences, identity checks, unloading.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, Allocation, BindingSpec, Capabilities, Plugin, ProcessMemoryManager, RawObject, Requirements,
    Reservation, Status,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn granularity(p: &Plugin) -> u64 {
    let g = cuda0(p).properties().granularity;
    assert!(g.is_power_of_two(), "granularity {g}");
    g
}

#[test]
fn one_mechanism_per_device_with_every_capability() {
    let _s = serial();
    let p = load();
    assert_eq!(p.name(), "memplug-cuda-vmm");
    let devices = drv().devices.len();
    // Each device also has its pinned host memory mechanism (tests/pinned.rs).
    assert_eq!(p.mechanisms().len(), 2 * devices);
    assert_eq!(device_mechanisms(&p).len(), devices);
    if !real() {
        assert_eq!(devices, 2, "the tests run the fake with two devices");
    }
    for (i, m) in device_mechanisms(&p).iter().enumerate() {
        assert_eq!(m.name(), format!("cuda{i}-vmm"));
        assert_eq!(m.id(), i as u64 + 1);
        assert_eq!(m.device().0.kind, MEMPLUG_DEVICE_CUDA);
        assert_eq!(m.device().0.ordinal, i as u32);
        assert_eq!(m.device().to_string(), format!("cuda:{i}"));
        // The four of ABI 1.0, typed export (1.2) where the device has
        // POSIX-fd handles (never the untyped export of 1.1: see
        // tests/sharing.rs), and peer access (1.2) with another device.
        let sharing = if m.properties().descriptor.export_types != 0 {
            memplug_sdk::abi::MEMPLUG_CAP_TYPED_EXPORT
        } else {
            0
        };
        let peer = if devices > 1 { memplug_sdk::abi::MEMPLUG_CAP_PEER_ACCESS } else { 0 };
        assert_eq!(m.capabilities(), Capabilities(0b1111 | sharing | peer), "{m:?}");
        assert!(m.sync().unwrap().can_adopt());
        let props = m.properties();
        assert_eq!(props.min_alignment, 256);
        assert!(props.max_alignment >= 2 * MIB);
        if !real() {
            assert_eq!(props.granularity, FAKE_GRANULARITY);
        }
    }
    // Each mechanism allocates on its own device.
    for (i, m) in device_mechanisms(&p).iter().enumerate() {
        let before = fake_used(i as i32);
        let b = unsafe { m.ungoverned() }.allocator().allocate(MIB, 256).unwrap();
        if let (Some(u0), Some(u1)) = (before, fake_used(i as i32)) {
            assert_eq!(u1 - u0, MIB, "device {i}");
            assert!(fake_ctx_refs(i as i32).unwrap() >= 1);
        }
        unsafe { m.ungoverned() }.allocator().deallocate(b).unwrap();
    }
    // Nothing left: no object, no retained context.
    unload_released(p);
}

#[test]
fn allocate_write_read_free_and_memory_info_follows() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let a = unsafe { m.ungoverned() }.allocator();
    let before = a.memory_info().expect("memory_info is published").unwrap();
    assert!(before.total_bytes > 0 && before.free_bytes <= before.total_bytes);
    let mut blocks = Vec::new();
    for (size, align) in [(1u64, 1u64), (4096, 256), (3 * MIB + 5, 4096), (MIB, 2 * MIB)] {
        let b = a.allocate(size, align).unwrap();
        assert_eq!(b.addr() % align.max(256), 0, "alignment {align}");
        assert!(b.size() >= size);
        blocks.push(b);
    }
    let big = &blocks[2];
    stamp(big.addr(), 1);
    stamp(big.addr() + 3 * MIB - 64, 2);
    assert!(has_stamp(big.addr(), 1) && has_stamp(big.addr() + 3 * MIB - 64, 2));
    if !real() {
        let during = a.memory_info().unwrap().unwrap();
        assert!(
            before.free_bytes - during.free_bytes >= 4 * MIB + 8192,
            "free memory did not drop: {before:?} → {during:?}"
        );
        assert!(fake_ctx_refs(0).unwrap() >= 1, "allocations must hold the primary context");
    }
    let e = a.allocate(64, 3).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    let e = a.allocate(64, 4 * MIB).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    let e = a.allocate(0, 256).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    for b in blocks {
        a.deallocate(b).unwrap();
    }
    if !real() {
        eventually("memory_info back to where it was", || a.memory_info().unwrap().unwrap() == before);
    }
    drop(m);
    unload_released(p);
}

#[test]
fn commit_and_decommit_are_exact_and_range_checked() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().expect("virtual backing is published");
    let r = vb.reserve(8 * g - 1).unwrap();
    assert_eq!(r.size(), 8 * g, "rounded up to the granularity");
    assert_eq!(r.addr() % g, 0);
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0);
    let used0 = fake_used(0);

    vb.commit(&r, 0, 3 * g).unwrap();
    vb.commit(&r, 5 * g, g).unwrap();
    assert_eq!(vb.committed_bytes(&r).unwrap(), 4 * g);
    if let (Some(u0), Some(u1)) = (used0, fake_used(0)) {
        assert_eq!(u1 - u0, 4 * g, "physical memory follows the committed bytes");
    }
    // Committed memory reads as zeros and keeps what is written.
    assert_eq!(read(r.addr() + g, 64), vec![0; 64]);
    stamp(r.addr(), 11);
    stamp(r.addr() + 2 * g, 12);
    stamp(r.addr() + 5 * g, 13);

    let refused = |res: Result<(), memplug_host::CallError>, status: Status| {
        let e = res.unwrap_err();
        assert_eq!(e.status, status, "{e}");
        assert!(!e.message.is_empty());
    };
    refused(vb.commit(&r, 2 * g, 2 * g), Status::InvalidState);
    refused(vb.commit(&r, 5 * g, g), Status::InvalidState);
    refused(vb.decommit(&r, 3 * g, 2 * g), Status::InvalidState);
    refused(vb.decommit(&r, 4 * g, 2 * g), Status::InvalidState);
    refused(vb.commit(&r, 1, g), Status::OutOfRange);
    refused(vb.commit(&r, 3 * g, g / 2), Status::OutOfRange);
    refused(vb.commit(&r, 3 * g, 0), Status::OutOfRange);
    refused(vb.commit(&r, 7 * g, 2 * g), Status::OutOfRange);
    refused(vb.commit(&r, u64::MAX - g + 1, 2 * g), Status::OutOfRange);
    refused(vb.decommit(&r, 8 * g, g), Status::OutOfRange);
    assert_eq!(vb.committed_bytes(&r).unwrap(), 4 * g, "refusals change nothing");

    // Decommit the middle of the first commit: its neighbours keep their
    // data; the middle reads zeros once committed again.
    stamp(r.addr() + g, 14);
    vb.decommit(&r, g, g).unwrap();
    assert_eq!(vb.committed_bytes(&r).unwrap(), 3 * g);
    assert!(has_stamp(r.addr(), 11) && has_stamp(r.addr() + 2 * g, 12) && has_stamp(r.addr() + 5 * g, 13));
    if !real() {
        assert_bad_access(|| write(r.addr() + g, &[1]), "a decommitted granule is not accessible");
    }
    vb.commit(&r, g, g).unwrap();
    assert_eq!(read(r.addr() + g, 64), vec![0; 64]);
    if let (Some(u0), Some(u1)) = (used0, fake_used(0)) {
        assert_eq!(u1 - u0, 4 * g);
    }
    // Release with memory still committed gives everything back.
    vb.release(r).unwrap();
    if let (Some(u0), Some(u1)) = (used0, fake_used(0)) {
        assert_eq!(u1, u0);
    }
    drop(m);
    unload_released(p);
}

#[test]
fn a_commit_the_device_cannot_back_is_out_of_memory_and_commits_nothing() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let total = m.memory_info().unwrap().unwrap().total_bytes;
    let too_much = (total + 4 * g).next_multiple_of(g);
    let r = vb.reserve(too_much).unwrap();
    let before = fake_used(0);
    let e = vb.commit(&r, 0, too_much).unwrap_err();
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0);
    assert_eq!(fake_used(0), before, "the failed commit was rolled back");
    // The range is still usable.
    vb.commit(&r, 0, g).unwrap();
    vb.release(r).unwrap();
    assert_quiescent(&p);
}

#[test]
fn a_shared_object_is_coherent_across_reservations_and_freed_last() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().expect("shared mapping is published");
    let obj = sm.create(2 * g).unwrap();
    assert_eq!(obj.addr(), 0);
    assert_eq!(obj.size(), 2 * g);
    let a = vb.reserve(4 * g).unwrap();
    let b = vb.reserve(4 * g).unwrap();
    let c = vb.reserve(g).unwrap();
    sm.map(&obj, 0, &a, g, 2 * g, Access::ReadWrite).unwrap();
    // Read-only where the driver allows it; read-write (with a note) where
    // it refuses: coherence is the point here.
    map_read_only_or_fallback(&sm, &obj, 0, &b, 0, 2 * g);
    // Only the second granule of the object, at the start of `c`.
    map_read_only_or_fallback(&sm, &obj, g, &c, 0, g);
    assert_eq!(read(b.addr(), 64), vec![0; 64], "a new object is zero-filled");

    stamp(a.addr() + g, 21);
    stamp(a.addr() + 2 * g, 22);
    assert!(has_stamp(b.addr(), 21), "B sees A's write to granule 0");
    assert!(has_stamp(b.addr() + g, 22), "B sees A's write to granule 1");
    assert!(has_stamp(c.addr(), 22), "C shows granule 1 only");
    assert_eq!(vb.committed_bytes(&a).unwrap(), 0, "mappings are not committed bytes");

    // State rules.
    vb.commit(&a, 0, g).unwrap();
    let e = sm.map(&obj, 0, &a, 0, g, Access::ReadWrite).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");
    let e = sm.map(&obj, 0, &a, 2 * g, g, Access::ReadWrite).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "over a mapping: {e}");
    let e = vb.commit(&b, g, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "commit over a mapping: {e}");
    let e = sm.map(&obj, g, &a, 3 * g, 2 * g, Access::ReadWrite).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "past the object: {e}");
    let e = sm.unmap(&a, g, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "not the whole mapping: {e}");
    let e = sm.unmap(&a, 3 * g, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "no mapping there: {e}");

    // The host's reference goes; the mappings keep the memory.
    let used = fake_used(0);
    sm.release(obj).unwrap();
    assert_eq!(fake_used(0), used);
    assert!(has_stamp(b.addr(), 21));
    assert_eq!(p.plugin_live_objects(), 4, "three reservations and the object the mappings hold");
    sm.unmap(&b, 0, 2 * g).unwrap();
    sm.unmap(&c, 0, g).unwrap();
    // Releasing `a` unmaps the last view: the object's memory goes.
    vb.release(a).unwrap();
    if let (Some(before), Some(after)) = (used, fake_used(0)) {
        assert_eq!(before - after, 3 * g, "the object's two granules and a's committed one");
    }
    vb.release(b).unwrap();
    vb.release(c).unwrap();
    drop(m);
    unload_released(p);
}

/// A write through a read-only view faults (fake: in a forked child, on the
/// host mapping the fake made read-only), or is refused by the driver (real
/// GPU: in a child process, whose context the fault may poison).
#[test]
fn a_read_only_view_refuses_writes() {
    if is_child() {
        return;
    }
    let _s = serial();
    if real() {
        let out = run_child("child_write_through_read_only_view", &[]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("REFUSED"), "the write went through:\n{text}");
        return;
    }
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let obj = sm.create(g).unwrap();
    let rw = vb.reserve(g).unwrap();
    let ro = vb.reserve(g).unwrap();
    sm.map(&obj, 0, &rw, 0, g, Access::ReadWrite).unwrap();
    if let Err(e) = sm.map(&obj, 0, &ro, 0, g, Access::ReadOnly) {
        // MEMPLUG_FAKE_CUDA_NO_READ_ONLY: the refusal is UNSUPPORTED, names
        // the driver's code, and leaves the range unmapped.
        assert_eq!(e.status, Status::Unsupported, "{e}");
        assert!(e.message.contains("CUDA_ERROR_NOT_SUPPORTED"), "{e}");
        println!("NOTE: read-only mappings refused ({e}); the write-fault check is skipped");
        sm.map(&obj, 0, &ro, 0, g, Access::ReadWrite).unwrap();
        stamp(rw.addr(), 31);
        assert!(has_stamp(ro.addr(), 31), "the read-write fallback view reads");
        sm.unmap(&ro, 0, g).unwrap();
        sm.unmap(&rw, 0, g).unwrap();
        sm.release(obj).unwrap();
        vb.release(ro).unwrap();
        vb.release(rw).unwrap();
        assert_quiescent(&p);
        return;
    }
    stamp(rw.addr(), 31);
    assert!(has_stamp(ro.addr(), 31), "the read-only view reads");
    assert_bad_access(|| write(ro.addr(), &[1]), "the driver refuses a copy into it");
    // The fake's memory is host memory: poke it directly in a child.
    let target = ro.addr() as *mut u8;
    // Past the stamp: the child's write through the writable view shows in
    // the parent too (the memory is shared), so keep it off the checked bytes.
    let writable = (rw.addr() + 4096) as *mut u8;
    // SAFETY: the child only stores and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        unsafe {
            std::ptr::write_volatile(writable, 7);
            std::ptr::write_volatile(target, 7);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the write through the read-only view did not fault (status {status:#x})"
    );
    assert!(has_stamp(ro.addr(), 31), "nothing changed");
    sm.unmap(&ro, 0, g).unwrap();
    sm.unmap(&rw, 0, g).unwrap();
    sm.release(obj).unwrap();
    vb.release(ro).unwrap();
    vb.release(rw).unwrap();
    assert_quiescent(&p);
}

/// A driver that refuses read-only access (the fake with
/// `MEMPLUG_FAKE_CUDA_NO_READ_ONLY=1`, in a child process): the plugin's map
/// is `UNSUPPORTED` and changes nothing, the range then maps read-write,
/// and the host's `Region::map_prefix` falls back to read-write and says so.
#[test]
fn a_driver_that_refuses_read_only_access_gets_the_read_write_fallback() {
    if real() || is_child() {
        return;
    }
    let _s = serial();
    let on = std::ffi::OsStr::new("1");
    let out = run_child("child_read_only_refused", &[("MEMPLUG_FAKE_CUDA_NO_READ_ONLY", Some(on))]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("FALLBACK OK"));
}

#[test]
#[ignore = "run by a_driver_that_refuses_read_only_access_gets_the_read_write_fallback in a child process"]
fn child_read_only_refused() {
    if !is_child() {
        return;
    }
    assert!(no_read_only_env(), "the parent sets MEMPLUG_FAKE_CUDA_NO_READ_ONLY");
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    {
        let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
        let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
        let obj = sm.create(2 * g).unwrap();
        let r = vb.reserve(2 * g).unwrap();
        let objects = fake_live_objects().unwrap();
        let e = sm.map(&obj, 0, &r, 0, 2 * g, Access::ReadOnly).unwrap_err();
        assert_eq!(e.status, Status::Unsupported, "{e}");
        assert!(e.message.contains("CUDA_ERROR_NOT_SUPPORTED") && e.message.contains("read-only"), "{e}");
        assert_eq!(fake_live_objects().unwrap(), objects, "the refused map left no mapping behind");
        assert_eq!(map_read_only_or_fallback(&sm, &obj, 0, &r, 0, 2 * g), Access::ReadWrite);
        stamp(r.addr() + g, 61);
        assert!(has_stamp(r.addr() + g, 61));
        // Read-write commits are unaffected.
        let c = vb.reserve(g).unwrap();
        vb.commit(&c, 0, g).unwrap();
        vb.release(c).unwrap();
        sm.unmap(&r, 0, 2 * g).unwrap();
        sm.release(obj).unwrap();
        vb.release(r).unwrap();
    }
    // Through the host's binding: the prefix maps read-write, the region
    // says so, and the prefix is charged once.
    drop(m);
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let dev = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let context = manager.select(dev, all).unwrap();
    let pool = manager.create_pool("pool", 64 * g).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let prefix = binding.create_shared(g, |v| stamp(v.addr, 62)).unwrap();
    let mut regions = Vec::new();
    for _ in 0..3 {
        let mut region = binding.reserve_virtual(4 * g).unwrap();
        region.map_prefix(&prefix).unwrap();
        assert_eq!(region.prefix_access(), Some(Access::ReadWrite), "{region:?}");
        assert!(!region.prefix_is_read_only());
        assert!(has_stamp(region.addr(), 62), "the region shows the prefix");
        regions.push(region);
    }
    assert_eq!(pool.snapshot().used, g, "three regions, one prefix charged once");
    drop(regions);
    drop(prefix);
    assert_eq!(pool.snapshot().used, 0);
    drop(binding);
    drop(context);
    manager.unload_plugin("memplug-cuda-vmm").unwrap();
    println!("FALLBACK OK");
}

/// Real-GPU half of the test above, run in its own process.
#[test]
#[ignore = "run by a_read_only_view_refuses_writes in a child process"]
fn child_write_through_read_only_view() {
    if !is_child() {
        return;
    }
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let obj = sm.create(g).unwrap();
    let ro = vb.reserve(g).unwrap();
    match sm.map(&obj, 0, &ro, 0, g, Access::ReadOnly) {
        Err(e) if e.status == Status::Unsupported => {
            println!("REFUSED: read-only mappings are unsupported here: {e}");
            return;
        }
        r => r.unwrap(),
    }
    match write(ro.addr(), &[1; 64]) {
        Err(code) => println!("REFUSED: the driver failed the copy with {code}"),
        Ok(()) => println!("WRITTEN: the copy into the read-only view succeeded"),
    }
    // The context may be poisoned now; the process ends here.
    std::mem::forget((obj, ro, p));
}

#[test]
fn fences_complete_after_the_work_before_them() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().expect("sync is published");
    let s = sync.stream_create().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    {
        let (order, gate) = (Arc::clone(&order), Arc::clone(&gate));
        sync.enqueue(&s, move || {
            drop(gate.lock().unwrap());
            order.lock().unwrap().push(1);
        })
        .unwrap();
    }
    let f1 = sync.fence_record(&s).unwrap();
    for i in 2..=4 {
        let order = Arc::clone(&order);
        sync.enqueue(&s, move || order.lock().unwrap().push(i)).unwrap();
    }
    let f2 = sync.fence_record(&s).unwrap();
    assert!(!sync.fence_query(&f1).unwrap(), "work before the fence is blocked");
    assert!(!sync.fence_wait(&f2, Duration::from_millis(20)).unwrap(), "times out");
    drop(held);
    assert!(sync.fence_wait(&f2, Duration::from_secs(10)).unwrap());
    assert!(sync.fence_query(&f1).unwrap(), "an earlier fence is complete too");
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4]);
    // Fences outlive their stream.
    sync.stream_destroy(s).unwrap();
    assert!(sync.fence_query(&f2).unwrap());
    sync.fence_destroy(f1).unwrap();
    sync.fence_destroy(f2).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn stream_destroy_waits_for_submitted_work() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let ran = Arc::clone(&ran);
        sync.enqueue(&s, move || {
            std::thread::sleep(Duration::from_millis(10));
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    sync.stream_destroy(s).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert_quiescent(&p);
}

#[test]
fn adopted_native_streams_are_used_not_owned() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    // A runtime's stream, made straight with the driver in the primary
    // context, which the "runtime" keeps retained all along (releasing the
    // last reference would destroy the context and its streams).
    in_context(0, |d| {
        let mut native = std::ptr::null_mut();
        assert_eq!(unsafe { (d.api.stream_create)(&mut native, 1) }, 0);
        // SAFETY (every adopt in this test): a live stream, or a value the
        // plugin must refuse without using it as a stream.
        let wrapped = unsafe { sync.stream_adopt(native.cast()) }.unwrap();
        let hit = Arc::new(AtomicUsize::new(0));
        {
            let hit = Arc::clone(&hit);
            sync.enqueue(&wrapped, move || {
                hit.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        let f = sync.fence_record(&wrapped).unwrap();
        assert!(sync.fence_wait(&f, Duration::from_secs(10)).unwrap());
        assert_eq!(hit.load(Ordering::SeqCst), 1);
        sync.fence_destroy(f).unwrap();
        sync.stream_destroy(wrapped).unwrap();
        // Still the runtime's: it can be used and destroyed by it.
        unsafe {
            assert_eq!((d.api.stream_synchronize)(native), 0);
            assert_eq!((d.api.stream_destroy)(native), 0);
        }
    });

    // The legacy default stream of the primary context.
    let legacy = unsafe { sync.stream_adopt(std::ptr::null_mut()) }.unwrap();
    let f = sync.fence_record(&legacy).unwrap();
    assert!(sync.fence_wait(&f, Duration::from_secs(10)).unwrap());
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(legacy).unwrap();

    let e = unsafe { sync.stream_adopt(2 as *mut _) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "CU_STREAM_PER_THREAD: {e}");
    if !real() {
        // The fake knows its streams; a real driver would crash on garbage.
        let mut junk = 0u64;
        let e = unsafe { sync.stream_adopt((&mut junk as *mut u64).cast()) }.unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        // A stream of device 1 is not device 0's.
        in_context(1, |d| {
            let mut other = std::ptr::null_mut();
            assert_eq!(unsafe { (d.api.stream_create)(&mut other, 1) }, 0);
            let e = unsafe { sync.stream_adopt(other.cast()) }.unwrap_err();
            assert_eq!(e.status, Status::WrongDevice, "{e}");
            assert_eq!(unsafe { (d.api.stream_destroy)(other) }, 0);
        });
    }
    assert_quiescent(&p);
}

/// Object references the plugin must refuse, each with its own code, and
/// with nothing changed.
#[test]
fn forged_and_foreign_references_are_refused() {
    let _s = serial();
    let p = load();
    let m0 = cuda0(&p);
    let a = unsafe { m0.ungoverned() }.allocator();
    let block = a.allocate(4096, 256).unwrap();
    let raw = block.into_raw();
    let forged = |f: &dyn Fn(&mut RawObject)| {
        let mut r = raw;
        f(&mut r);
        // SAFETY: deliberately forged; the plugin must refuse it.
        unsafe { Allocation::from_raw(r) }
    };
    let expect = |obj: Allocation, status: Status| {
        let e = a.deallocate(obj).unwrap_err();
        assert_eq!(e.error.status, status, "{}", e.error);
        assert!(!e.error.message.is_empty());
        let _ = e.object.into_raw();
    };
    expect(forged(&|r| r.mechanism_id = 2), Status::WrongMechanism);
    expect(forged(&|r| r.device.ordinal = 1), Status::WrongDevice);
    expect(forged(&|r| r.device.kind = 1), Status::WrongDevice);
    expect(forged(&|r| r.handle += 1000), Status::UnknownAllocation);
    expect(forged(&|r| r.handle = 0), Status::UnknownAllocation);
    expect(forged(&|r| r.object_id += 1), Status::UnknownAllocation);
    expect(forged(&|r| r.size += 1), Status::UnknownAllocation);
    // A reservation's handle is not an allocation's.
    let vb = unsafe { m0.ungoverned() }.virtual_backing().unwrap();
    let res = vb.reserve(1).unwrap();
    let res_raw = res.into_raw();
    expect(forged(&|r| *r = res_raw), Status::UnknownAllocation);
    // SAFETY: the genuine tokens, given back.
    vb.release(unsafe { Reservation::from_raw(res_raw) }).unwrap();
    a.deallocate(unsafe { Allocation::from_raw(raw) }).unwrap();
    // Freed twice.
    expect(unsafe { Allocation::from_raw(raw) }, Status::UnknownAllocation);
    // A stream handle that was never made.
    let sync = m0.sync().unwrap();
    let s = sync.stream_create().unwrap();
    let f = sync.fence_record(&s).unwrap();
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    assert_quiescent(&p);
}

#[test]
fn unload_is_refused_while_anything_lives() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let r = unsafe { m.ungoverned() }.virtual_backing().unwrap().reserve(1).unwrap();
    drop(m);
    let refused = p.unload().unwrap_err();
    assert!(refused.report.plugin_reported >= 1, "{}", refused.report);
    let p = refused.plugin;
    let m = cuda0(&p);
    unsafe { m.ungoverned() }.virtual_backing().unwrap().release(r).unwrap();
    drop(m);
    unload_released(p);
}

/// The primary context is retained once, at first use, and kept until the
/// plugin is unloaded: memory_info with nothing alive, and objects made and
/// freed one after another, cause no context churn (creating a context
/// costs ~0.1–0.5 s and device memory on a GPU).
#[test]
fn the_primary_context_is_retained_once_for_the_life_of_the_plugin() {
    let _s = serial();
    if real() {
        return;
    }
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let (retains0, releases0) = fake_ctx_calls(0).unwrap();
    let first = m.memory_info().unwrap().unwrap();
    for _ in 0..20 {
        // (The last free may still be on the plugin's freer thread.)
        eventually("no context made or destroyed in between", || m.memory_info().unwrap().unwrap() == first);
        let a = unsafe { m.ungoverned() }.allocator();
        let b = a.allocate(4096, 256).unwrap();
        a.deallocate(b).unwrap();
        let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
        let r = vb.reserve(g).unwrap();
        vb.commit(&r, 0, g).unwrap();
        vb.release(r).unwrap();
        let sync = m.sync().unwrap();
        let s = sync.stream_create().unwrap();
        sync.stream_destroy(s).unwrap();
        assert_eq!(
            fake_ctx_refs(0),
            Some(baseline().ctx_refs[0] + 1),
            "retained, once, while the plugin is loaded"
        );
    }
    let (retains, releases) = fake_ctx_calls(0).unwrap();
    assert_eq!(retains - retains0, 1, "one cuDevicePrimaryCtxRetain for everything");
    assert_eq!(releases, releases0, "no cuDevicePrimaryCtxRelease while loaded");
    // The context's own memory shows in memory_info, and stays taken.
    let total = first.total_bytes;
    assert!(first.free_bytes < total, "{first:?}");
    drop(m);
    unload_released(p);
    assert_eq!(fake_ctx_calls(0).unwrap().1 - releases0, 1, "released once, at unload");
}

#[test]
fn concurrent_commits_and_decommits_stay_exact() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let r = unsafe { m.ungoverned() }.virtual_backing().unwrap().reserve(16 * g).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let m = m.clone();
            let r = &r;
            scope.spawn(move || {
                let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
                for i in 0..8 {
                    let off = (t * 4 + i % 4) * g;
                    vb.commit(r, off, g).unwrap();
                    vb.decommit(r, off, g).unwrap();
                }
                vb.commit(r, t * 4 * g, 2 * g).unwrap();
            });
        }
    });
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    assert_eq!(vb.committed_bytes(&r).unwrap(), 8 * g);
    vb.release(r).unwrap();
    assert_quiescent(&p);
}

/// A host function must make no driver call, and the driver may run every
/// stream's host functions on one thread (the fake does): a slot called
/// from inside one is refused with BUSY at once, never deadlocks, and never
/// reaches the driver (the fake would answer CUDA_ERROR_NOT_PERMITTED).
#[test]
fn slots_called_from_a_host_function_are_refused_with_busy() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let sync = m.sync().unwrap();
    let s1 = sync.stream_create().unwrap();
    let s2 = Arc::new(sync.stream_create().unwrap());
    let f2 = Arc::new(sync.fence_record(&s2).unwrap());
    let r = Arc::new(unsafe { m.ungoverned() }.virtual_backing().unwrap().reserve(g).unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let (m, s2, f2, r, seen) =
            (m.clone(), Arc::clone(&s2), Arc::clone(&f2), Arc::clone(&r), Arc::clone(&seen));
        sync.enqueue(&s1, move || {
            let sync = m.sync().unwrap();
            let mut seen = seen.lock().unwrap();
            seen.push((
                "fence_wait",
                sync.fence_wait(&f2, Duration::from_secs(5)).map(|_| ()).unwrap_err().status,
            ));
            seen.push(("enqueue", sync.enqueue(&s2, || {}).unwrap_err().status));
            let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
            seen.push(("commit", vb.commit(&r, 0, g).unwrap_err().status));
            seen.push(("memory_info", m.memory_info().unwrap().unwrap_err().status));
        })
        .unwrap();
    }
    let f1 = sync.fence_record(&s1).unwrap();
    assert!(sync.fence_wait(&f1, Duration::from_secs(10)).unwrap(), "the host function returned");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for (call, status) in &seen {
        assert_eq!(*status, Status::Busy, "{call} from a host function");
    }
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0, "the refused commit did nothing");
    sync.fence_destroy(f1).unwrap();
    sync.fence_destroy(Arc::into_inner(f2).unwrap()).unwrap();
    sync.stream_destroy(s1).unwrap();
    sync.stream_destroy(Arc::into_inner(s2).unwrap()).unwrap();
    vb.release(Arc::into_inner(r).unwrap()).unwrap();
    drop(m);
    unload_released(p);
}

/// After a sticky error (the fake's switch: every later call returns 700)
/// the context is dead: for a host that agreed on ABI 1.1 (which has no
/// DEVICE_LOST) the slot that met it and every later one fail with
/// DEVICE_UNAVAILABLE, the later ones without calling the driver, and no
/// loss is reported (the host's context stays active). At 1.2 the same
/// fault is DEVICE_LOST and a reported loss: `tests/device_lost.rs`. In a
/// child process: the fault is for the rest of the process.
#[test]
fn a_sticky_error_kills_the_context_for_every_later_slot() {
    if real() || is_child() {
        return;
    }
    let out = run_child("child_sticky_fault", &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("STICKY OK"));
}

#[test]
#[ignore = "run by a_sticky_error_kills_the_context_for_every_later_slot in a child process"]
fn child_sticky_fault() {
    if !is_child() {
        return;
    }
    let p = load_with(&memplug_host::LoadOptions { max_minor: 1, ..Default::default() });
    assert_eq!(p.abi_version(), (1, 1));
    let m = cuda0(&p);
    let a = unsafe { m.ungoverned() }.allocator();
    let block = a.allocate(4096, 256).unwrap();
    fake_sticky_fault(700);
    let e = a.allocate(4096, 256).unwrap_err();
    assert_eq!(e.status, Status::DeviceUnavailable, "{e}");
    assert!(e.message.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    let calls = fake_calls().unwrap();
    let e = a.deallocate(block).unwrap_err();
    assert_eq!(e.error.status, Status::DeviceUnavailable, "{}", e.error);
    assert!(e.error.message.contains("is dead"), "{}", e.error);
    let _ = e.object.into_raw();
    assert_eq!(m.memory_info().unwrap().unwrap_err().status, Status::DeviceUnavailable);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    assert_eq!(vb.reserve(1).unwrap_err().status, Status::DeviceUnavailable);
    assert_eq!(m.sync().unwrap().stream_create().unwrap_err().status, Status::DeviceUnavailable);
    assert_eq!(fake_calls().unwrap(), calls, "no driver call after the context died");
    // Nothing was reported to a 1.1 host: its context is still active (it
    // learns of the dead device from the status alone).
    assert_eq!(m.life_state(), memplug_host::LifeState::Active);
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.refused), (0, 0), "{stats:?}");
    println!("STICKY OK");
    std::mem::forget(p);
}
