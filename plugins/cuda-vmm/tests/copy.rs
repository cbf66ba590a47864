//! ABI 1.3's stream-ordered copy on the CUDA plugin, against the fake
//! driver (or a real GPU with MEMPLUG_CUDA_TEST_REAL=1): `cuMemcpyAsync`
//! on the stream, device to device and between host and device, in the
//! stream's order; ranges the plugin's tables say are not copyable refused
//! before the driver sees them; and the fake refusing, as the driver does
//! (`CUDA_ERROR_INVALID_VALUE`), a copy into memory nothing maps.

mod common;

use common::*;
use memplug_host::Status;
use memplug_sdk::abi::{MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST};
use std::sync::mpsc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(20);

/// The copy slot returns without waiting (the header's contract), also
/// with pageable host memory, which the driver copies only by waiting
/// (CUDA's "API synchronization behavior"; the fake waits the same way):
/// the copies are made while a host function holds the stream, and must
/// return while it still does; then the bytes arrive, in order. 5 chunks
/// and a bit: the staging ring is reused within one copy.
#[test]
fn copies_with_pageable_memory_return_while_the_stream_is_held() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let kinds = m.properties().copy_kinds;
    assert_eq!(kinds.0, MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST);
    let sync = m.sync().unwrap();
    let n = 5 * memplug_plugin_cuda_vmm::STAGING_CHUNK + 4099;
    // SAFETY: test memory, given back below.
    let alloc = unsafe { m.ungoverned() }.allocator();
    let (a, b) = (alloc.allocate(n, 256).unwrap(), alloc.allocate(n, 256).unwrap());
    write(b.addr(), &vec![0xee; n as usize]).unwrap();
    let src: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let mut out = vec![0u8; n as usize];
    let (src_at, out_at) = (src.as_ptr() as u64, out.as_mut_ptr() as u64);
    let s = sync.stream_create().unwrap();
    // Held behind a host function: nothing may be copied before it runs.
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&s, move || {
        let _ = gate.recv_timeout(LONG);
    })
    .unwrap();
    let waited = fake_pageable_copies();
    let (done_tx, done) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // SAFETY (each copy): this mechanism's allocations and this
            // test's buffers, alive until after the fence below.
            unsafe {
                sync.copy(&s, a.addr(), src_at, n).unwrap();
                sync.copy(&s, b.addr() + 8, a.addr() + 16, 4096).unwrap();
                sync.copy(&s, out_at, b.addr(), n).unwrap();
            }
            let _ = done_tx.send(());
        });
        let returned = done.recv_timeout(LONG).is_ok();
        // Let the stream go either way, so the copying thread ends.
        open.send(()).unwrap();
        assert!(returned, "a copy with pageable memory waited for the stream (the slot must not)");
    });
    if let (Some(before), Some(now)) = (waited, fake_pageable_copies()) {
        assert_eq!(now, before, "pageable memory was handed to the driver's cuMemcpyAsync");
    }
    let f = sync.fence_record(&s).unwrap();
    assert!(sync.fence_wait(&f, LONG).unwrap());
    let mut want = vec![0xeeu8; n as usize];
    want[8..8 + 4096].copy_from_slice(&src[16..16 + 4096]);
    assert!(out == want, "host -> device -> device -> host, exactly and in order");
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
    drop(src);
    assert_quiescent(&p);
}

/// Another device's memory is not host memory: a copy naming it on
/// cuda0's mechanism is `UNSUPPORTED` (no `MEMPLUG_COPY_PEER`), and the
/// driver is not asked to copy.
#[test]
fn a_range_in_another_devices_memory_is_unsupported() {
    let _s = serial();
    let p = load();
    if drv().devices.len() < 2 {
        eprintln!("skipped: one CUDA device, no other device's memory");
        return;
    }
    let (m0, m1) = (cuda0(&p), cuda1(&p));
    let sync = m0.sync().unwrap();
    // SAFETY: test memory, given back below.
    let (a0, a1) = (unsafe { m0.ungoverned() }.allocator(), unsafe { m1.ungoverned() }.allocator());
    let (x, y) = (a0.allocate(4096, 256).unwrap(), a1.allocate(4096, 256).unwrap());
    let s = sync.stream_create().unwrap();
    let copies = fake_entry_calls("cuMemcpyAsync");
    for (dst, src) in [(x.addr(), y.addr()), (y.addr(), x.addr())] {
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { sync.copy(&s, dst, src, 4096) }.unwrap_err();
        assert_eq!(e.status, Status::Unsupported, "{e}");
        assert!(e.message.contains("CUDA device 1"), "{e}");
    }
    assert_eq!(fake_entry_calls("cuMemcpyAsync"), copies, "the driver was not asked to copy");
    sync.stream_destroy(s).unwrap();
    a0.deallocate(x).unwrap();
    a1.deallocate(y).unwrap();
    assert_quiescent(&p);
}

/// The fake, as CUDA's "API synchronization behavior" says: a
/// `cuMemcpyAsync` with a pageable side returns only once the copy is
/// done (the bytes are there when it returns, with no synchronisation),
/// and is counted.
#[test]
fn the_fake_copies_pageable_memory_synchronously_like_the_driver() {
    if real() {
        eprintln!("skipped: the fake's own rules");
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    // SAFETY: test memory, given back below.
    let alloc = unsafe { m.ungoverned() }.allocator();
    let a = alloc.allocate(1 << 20, 256).unwrap();
    let host = vec![9u8; 1 << 20];
    let mut back = vec![0u8; 1 << 20];
    let before = fake_pageable_copies().unwrap();
    in_context(0, |d| {
        let r =
            unsafe { (d.api.memcpy_async)(a.addr(), host.as_ptr() as u64, 1 << 20, std::ptr::null_mut()) };
        assert_eq!(r, 0);
        let r = unsafe {
            (d.api.memcpy_async)(back.as_mut_ptr() as u64, a.addr(), 1 << 20, std::ptr::null_mut())
        };
        assert_eq!(r, 0);
    });
    assert!(back == host, "the copies were done when the calls returned");
    assert_eq!(fake_pageable_copies().unwrap(), before + 2);
    alloc.deallocate(a).unwrap();
}

#[test]
fn ranges_outside_the_plugins_memory_are_refused_before_the_driver() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let sync = m.sync().unwrap();
    let raw = unsafe { m.ungoverned() };
    let (alloc, vb) = (raw.allocator(), raw.virtual_backing().unwrap());
    let a = alloc.allocate(4096, 256).unwrap();
    let r = vb.reserve(2 * g).unwrap();
    vb.commit(&r, 0, g).unwrap();
    let host = vec![1u8; 8192];
    let s = sync.stream_create().unwrap();
    let calls = fake_calls();
    for (dst, src, len, says) in [
        (a.addr() + 4096 - 8, host.as_ptr() as u64, 16, "not wholly inside the allocation"),
        (r.addr() + g - 8, host.as_ptr() as u64, 16, "not all committed or mapped"),
        (r.addr() + 2 * g - 8, host.as_ptr() as u64, 16, "not wholly inside the reservation"),
    ] {
        // SAFETY: refused before anything is enqueued.
        let e = unsafe { sync.copy(&s, dst, src, len) }.unwrap_err();
        assert_eq!(e.status, Status::OutOfRange, "{e}");
        assert!(e.message.contains(says), "{e}");
    }
    assert_eq!(fake_calls(), calls, "the driver was not called for a refused copy");
    // SAFETY: the committed granule and a host buffer.
    unsafe { sync.copy(&s, r.addr() + g - 4096, host.as_ptr() as u64, 4096) }.unwrap();
    let f = sync.fence_record(&s).unwrap();
    assert!(sync.fence_wait(&f, LONG).unwrap());
    assert_eq!(read(r.addr() + g - 4096, 4096), vec![1u8; 4096]);
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    vb.decommit(&r, 0, g).unwrap();
    vb.release(r).unwrap();
    alloc.deallocate(a).unwrap();
}

/// The fake, as the driver: a copy into device memory that nothing maps
/// (an uncommitted part of a reservation, past an allocation) is
/// `CUDA_ERROR_INVALID_VALUE` at submission, and changes nothing.
#[test]
fn the_fake_refuses_unmapped_device_memory_like_the_driver() {
    if real() {
        eprintln!("skipped: the fake's own rules (a real driver's are checked by the plugin's tests above)");
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let raw = unsafe { m.ungoverned() };
    let (alloc, vb) = (raw.allocator(), raw.virtual_backing().unwrap());
    let a = alloc.allocate(4096, 256).unwrap();
    let r = vb.reserve(2 * g).unwrap();
    vb.commit(&r, 0, g).unwrap();
    let host = vec![3u8; 4096];
    let cases = [
        (r.addr() + g, 16, "uncommitted"),
        (r.addr() + g - 8, 16, "straddling"),
        (a.addr() + 4096 - 8, 16, "past an allocation"),
    ];
    in_context(0, |d| {
        for (dst, len, what) in cases {
            let code = unsafe { (d.api.memcpy_async)(dst, host.as_ptr() as u64, len, std::ptr::null_mut()) };
            assert_eq!(d.error_name(code), "CUDA_ERROR_INVALID_VALUE", "{what}");
        }
        let ok = unsafe { (d.api.memcpy_async)(r.addr(), host.as_ptr() as u64, 4096, std::ptr::null_mut()) };
        assert_eq!(d.error_name(ok), "CUDA_SUCCESS");
        assert_eq!(unsafe { (d.api.ctx_synchronize)() }, 0);
    });
    assert_eq!(read(r.addr(), 4096), host);
    assert_eq!(fake_sticky_code(), 0, "a refused copy is not a fault");
    vb.decommit(&r, 0, g).unwrap();
    vb.release(r).unwrap();
    alloc.deallocate(a).unwrap();
}
