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

#[test]
fn the_plugin_copies_on_the_stream_in_order() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let kinds = m.properties().copy_kinds;
    assert_eq!(kinds.0, MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST);
    let sync = m.sync().unwrap();
    // SAFETY: test memory, given back below.
    let alloc = unsafe { m.ungoverned() }.allocator();
    let (a, b) = (alloc.allocate(1 << 16, 256).unwrap(), alloc.allocate(1 << 16, 256).unwrap());
    write(b.addr(), &vec![0xee; 1 << 16]).unwrap();
    let src: Vec<u8> = (0..1u32 << 16).map(|i| (i % 253) as u8).collect();
    let mut out = vec![0u8; 1 << 16];
    let s = sync.stream_create().unwrap();
    // Held behind a host function: nothing may be copied before it runs.
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&s, move || {
        let _ = gate.recv_timeout(LONG);
    })
    .unwrap();
    // SAFETY (each copy): this mechanism's allocations and this test's
    // buffers, alive until after the fence below.
    unsafe {
        sync.copy(&s, a.addr(), src.as_ptr() as u64, 1 << 16).unwrap();
        sync.copy(&s, b.addr() + 8, a.addr() + 16, 4096).unwrap();
        sync.copy(&s, out.as_mut_ptr() as u64, b.addr(), 1 << 16).unwrap();
    }
    let f = sync.fence_record(&s).unwrap();
    assert!(!sync.fence_wait(&f, Duration::from_millis(50)).unwrap(), "done before the gate opened");
    assert_eq!(read(b.addr() + 8, 1), [0xee], "copied before its turn");
    open.send(()).unwrap();
    assert!(sync.fence_wait(&f, LONG).unwrap());
    let mut want = vec![0xeeu8; 1 << 16];
    want[8..8 + 4096].copy_from_slice(&src[16..16 + 4096]);
    assert_eq!(out, want, "host -> device -> device -> host, exactly and in order");
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
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
