//! Frees never wait for the device (issue 30 item 6). CUDA's "API
//! synchronization behavior": `cuMemFree` and `cuMemFreeHost` synchronise
//! the device; the fake does the same (`the_fake_frees_synchronise_…`).
//! The plugin's `deallocate` hands the driver call to a per-context freer
//! thread, so a free made while a stream is held by a host function
//! returns at once; the memory reaches the driver once the stream moves;
//! and an allocation the driver refuses for memory meanwhile waits for the
//! handed-over frees and tries again.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(20);
/// Long enough for a free that does not wait to have returned; a free
/// that is still running then is what the test expects.
const SHORT: Duration = Duration::from_millis(200);

#[test]
fn a_free_while_a_stream_is_blocked_does_not_block() {
    let _s = serial();
    let p = load();
    let (dev, host) = (cuda0(&p), cuda_host(&p, 0));
    let sync = dev.sync().unwrap();
    // SAFETY: test memory, given back below.
    let (da, ha) = (unsafe { dev.ungoverned() }.allocator(), unsafe { host.ungoverned() }.allocator());
    let (d, h) = (da.allocate(1 << 20, 256).unwrap(), ha.allocate(1 << 20, 256).unwrap());
    let s = sync.stream_create().unwrap();
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&s, move || {
        let _ = gate.recv_timeout(LONG);
    })
    .unwrap();
    let (objects, syncs) = (fake_live_objects(), fake_free_syncs());
    let (done_tx, done) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            da.deallocate(d).unwrap();
            ha.deallocate(h).unwrap();
            let _ = done_tx.send(());
        });
        let returned = done.recv_timeout(LONG).is_ok();
        open.send(()).unwrap();
        assert!(returned, "a deallocate waited for the device (a held stream)");
    });
    if let (Some(before), Some(syncs)) = (objects, syncs) {
        eventually("both blocks freed in the driver", || fake_live_objects() == Some(before - 2));
        assert_eq!(fake_free_syncs().unwrap(), syncs + 2, "each free synchronised the device, on the freer");
    }
    sync.stream_destroy(s).unwrap();
    assert_quiescent(&p);
}

/// While a free handed over is stuck in the driver (a held stream), an
/// allocation the driver refuses for memory waits for it and succeeds.
#[test]
fn an_allocation_refused_for_memory_waits_for_the_frees_handed_over() {
    if real() {
        eprintln!("skipped: fills the fake device's memory");
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    // SAFETY: test memory, given back below.
    let a = unsafe { m.ungoverned() }.allocator();
    let big = 600 << 20; // more than half of the fake's 1024 MiB
    let first = a.allocate(big, 256).unwrap();
    let s = sync.stream_create().unwrap();
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&s, move || {
        let _ = gate.recv_timeout(LONG);
    })
    .unwrap();
    a.deallocate(first).unwrap();
    let (done_tx, done) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| done_tx.send(a.allocate(big, 256)).unwrap());
        // Not before the stream moves: the free it needs is held.
        let early = done.recv_timeout(SHORT);
        open.send(()).unwrap();
        let second = match early {
            Ok(r) => r,
            Err(_) => done.recv_timeout(LONG).expect("the allocation returned"),
        };
        let second = second.unwrap_or_else(|e| panic!("the allocation did not wait for the free: {e}"));
        a.deallocate(second).unwrap();
    });
    sync.stream_destroy(s).unwrap();
    assert_quiescent(&p);
}

/// The fake, as the driver documents: `cuMemFree` returns only after the
/// work submitted to the device before it has run.
#[test]
fn the_fake_frees_synchronise_the_device_like_the_driver() {
    if real() {
        eprintln!("skipped: the fake's own rules");
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let (open, gate) = mpsc::channel::<()>();
    {
        let ran = Arc::clone(&ran);
        sync.enqueue(&s, move || {
            let _ = gate.recv_timeout(LONG);
            ran.store(true, Ordering::SeqCst);
        })
        .unwrap();
    }
    in_context(0, |d| {
        let mut ptr = 0;
        assert_eq!(unsafe { (d.api.mem_alloc)(&mut ptr, 4096) }, 0);
        let (done_tx, done) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _e = in_context(0, |d| unsafe { (d.api.mem_free)(ptr) });
                done_tx.send(ran.load(Ordering::SeqCst)).unwrap();
            });
            assert!(done.recv_timeout(SHORT).is_err(), "cuMemFree returned while the device was busy");
            open.send(()).unwrap();
            assert!(done.recv_timeout(LONG).unwrap(), "cuMemFree returned before the earlier work ran");
        });
    });
    sync.stream_destroy(s).unwrap();
}
