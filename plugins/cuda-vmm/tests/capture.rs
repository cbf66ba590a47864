//! CUDA graph capture (issue 30 item 9): the plugin refuses, clearly and
//! before anything is enqueued, work on a stream that is capturing (a
//! fence, a host function, a wait, a copy), and its allocations and frees
//! from another thread do not break a global-mode capture (they run in the
//! relaxed capture mode, as PyTorch's caching allocator's do). Runs on the
//! fake and on a real driver; the fake's own capture rules are checked
//! last.

mod common;

use common::*;
use memplug_host::Status;
use std::ffi::{c_int, c_void};
use std::time::Duration;

type BeginCapture = unsafe extern "C" fn(*mut c_void, c_int) -> u32;
type EndCapture = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> u32;
type GraphDestroy = unsafe extern "C" fn(*mut c_void) -> u32;
type EventFn = unsafe extern "C" fn(*mut c_void) -> u32;

const MODE_GLOBAL: c_int = 0;
const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: u32 = 901;
const CUDA_ERROR_CAPTURED_EVENT: u32 = 907;

/// Ends the capture of `stream`; its status (the graph, if any, destroyed).
fn end_capture(stream: *mut c_void) -> u32 {
    let end: EndCapture = driver_entry("cuStreamEndCapture");
    let destroy: GraphDestroy = driver_entry("cuGraphDestroy");
    let mut graph = std::ptr::null_mut();
    let r = unsafe { end(stream, &mut graph) };
    if !graph.is_null() {
        unsafe { destroy(graph) };
    }
    r
}

#[test]
fn work_on_a_capturing_stream_is_refused_and_the_capture_survives() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    // SAFETY: test memory, given back below.
    let a = unsafe { m.ungoverned() }.allocator();
    let (x, y) = (a.allocate(4096, 256).unwrap(), a.allocate(4096, 256).unwrap());
    let other = sync.stream_create().unwrap();
    let elsewhere = sync.fence_record(&other).unwrap();
    let begin: BeginCapture = driver_entry("cuStreamBeginCapture_v2");
    in_context(0, |d| {
        let mut native = std::ptr::null_mut();
        assert_eq!(unsafe { (d.api.stream_create)(&mut native, 1) }, 0);
        // SAFETY: a live stream of this device.
        let s = unsafe { sync.stream_adopt(native.cast()) }.unwrap();
        let captured = fake_captured_ops();
        assert_eq!(unsafe { begin(native.cast(), MODE_GLOBAL) }, 0);
        let refusals = [
            ("fence_record", sync.fence_record(&s).map(|_| ())),
            ("enqueue_host_fn", sync.enqueue(&s, || {})),
            ("stream_wait_fence", sync.stream_wait_fence(&s, &elsewhere)),
            // SAFETY: refused before anything is enqueued.
            ("copy", unsafe { sync.copy(&s, x.addr(), y.addr(), 4096) }),
        ];
        for (slot, r) in refusals {
            let e = r.expect_err(slot);
            assert_eq!(e.status, Status::InvalidState, "{slot}: {e}");
            assert!(e.message.contains("capturing a CUDA graph"), "{slot}: {e}");
        }
        assert_eq!(fake_captured_ops(), captured, "nothing was recorded into the graph");
        assert_eq!(end_capture(native.cast()), 0, "the capture is still valid");
        // Outside capture the stream works again.
        let f = sync.fence_record(&s).unwrap();
        assert!(sync.fence_wait(&f, Duration::from_secs(20)).unwrap());
        sync.fence_destroy(f).unwrap();
        sync.stream_destroy(s).unwrap();
        unsafe { assert_eq!((d.api.stream_destroy)(native), 0) };
    });
    sync.fence_destroy(elsewhere).unwrap();
    sync.stream_destroy(other).unwrap();
    a.deallocate(x).unwrap();
    a.deallocate(y).unwrap();
    assert_quiescent(&p);
}

/// A data-loader thread allocating and freeing through the plugin while a
/// training thread captures in the global mode: the capture stays valid.
#[test]
fn allocations_from_another_thread_keep_a_global_capture_valid() {
    let _s = serial();
    let p = load();
    let (dev, host) = (cuda0(&p), cuda_host(&p, 0));
    let begin: BeginCapture = driver_entry("cuStreamBeginCapture_v2");
    in_context(0, |d| {
        let mut native = std::ptr::null_mut();
        assert_eq!(unsafe { (d.api.stream_create)(&mut native, 1) }, 0);
        assert_eq!(unsafe { begin(native.cast(), MODE_GLOBAL) }, 0);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: test memory, given back at once.
                    let (da, ha) =
                        (unsafe { dev.ungoverned() }.allocator(), unsafe { host.ungoverned() }.allocator());
                    let (b, h) = (da.allocate(1 << 20, 256).unwrap(), ha.allocate(1 << 20, 256).unwrap());
                    da.deallocate(b).unwrap();
                    ha.deallocate(h).unwrap();
                })
                .join()
                .unwrap();
        });
        // The frees reach the driver (on the freer) before the capture ends.
        eventually("the freer's frees", || {
            fake_live_host_allocs().is_none_or(|n| n == baseline().host_allocs)
        });
        assert_eq!(end_capture(native.cast()), 0, "an allocation or free broke the capture");
        unsafe { assert_eq!((d.api.stream_destroy)(native), 0) };
    });
    assert_quiescent(&p);
}

/// The fake's capture rules, as the driver documents them: in the global
/// mode a `cuMemAlloc` from another thread is refused (900) and
/// invalidates the capture (901 at its end); an event recorded during
/// capture may not be queried (907).
#[test]
fn the_fake_enforces_the_capture_rules_like_the_driver() {
    if real() {
        eprintln!("skipped: the fake's own rules");
        return;
    }
    let _s = serial();
    let begin: BeginCapture = driver_entry("cuStreamBeginCapture_v2");
    let query: EventFn = driver_entry("cuEventQuery");
    in_context(0, |d| {
        let mut native = std::ptr::null_mut();
        assert_eq!(unsafe { (d.api.stream_create)(&mut native, 1) }, 0);
        let mut event = std::ptr::null_mut();
        assert_eq!(unsafe { (d.api.event_create)(&mut event, 2) }, 0);
        assert_eq!(unsafe { begin(native.cast(), MODE_GLOBAL) }, 0);
        assert_eq!(unsafe { (d.api.event_record)(event, native) }, 0);
        assert_eq!(unsafe { query(event.cast()) }, CUDA_ERROR_CAPTURED_EVENT);
        let r = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    in_context(0, |d| {
                        let mut ptr = 0;
                        unsafe { (d.api.mem_alloc)(&mut ptr, 4096) }
                    })
                })
                .join()
                .unwrap()
        });
        assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(end_capture(native.cast()), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        unsafe {
            assert_eq!((d.api.event_record)(event, native), 0);
            assert_eq!((d.api.event_synchronize)(event), 0, "recorded again outside capture");
            assert_eq!((d.api.event_destroy)(event), 0);
            assert_eq!((d.api.stream_destroy)(native), 0);
        }
    });
}
