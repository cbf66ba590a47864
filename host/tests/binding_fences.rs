//! Invariant 4 with real in-flight work: memory handed back while a CPU
//! stream of the reference plugin still writes into it is freed (and
//! refunded) only after the fence recorded behind that work completes, and
//! dropping a handle never waits for the device.
//!
//! Each stream function first blocks on a gate the test opens, so "the work
//! is still running when the handle is dropped" holds by construction, not
//! by timing; it then sleeps ~100 ms (leaving the reaper and explicit polls
//! every chance to free too early), checks that its memory is still live
//! and charged, and writes into it. An early free is caught three ways: the
//! stream function's own check, memcheck (a write into freed heap memory),
//! and, for regions, a SIGSEGV (decommitted pages are `PROT_NONE`).
//!
//! Under valgrind:
//!
//! ```text
//! cargo test -p memplug-host --test binding_fences --no-run
//! valgrind --error-exitcode=1 target/debug/deps/binding_fences-* --test-threads=1
//! ```
//!
//! (the glob must name one executable: after rebuilds, or with the `.d`
//! file next to it, use `$(ls -t target/debug/deps/binding_fences-* | grep -v '\.d$' | head -1)`).
//! The CPU plugin reads the page size through rustix, whose own auxv
//! parsing reads the vDSO header that valgrind does not map (rustix issue
//! #1559): the run dies with SIGSEGV in `rustix::param::page_size` unless
//! the workspace's rustix dependency enables `use-libc-auxv`. With it, the
//! run is clean, and an early free (e.g. a drop that ignores its fences) is
//! reported as an invalid write from the stream function.

mod common;

use common::*;
use memplug_host::{BindingError, GrowError, ObjectKind, PollReport, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WORK: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(10);

/// What the stream function saw when it wrote: (live objects of the kind,
/// bytes the pool charged), and whether the bytes read back.
type Seen = Arc<Mutex<Option<(u64, u64, bool)>>>;

/// Enqueues: wait for the gate, sleep, check liveness and charge, write
/// `len` bytes of `byte` at `addr`, read them back.
fn enqueue_write(
    stream: &CpuStream,
    rig: &Rig,
    kind: ObjectKind,
    addr: u64,
    len: u64,
    byte: u8,
) -> (mpsc::Sender<()>, Seen) {
    let (open, gate) = mpsc::channel::<()>();
    let seen: Seen = Arc::default();
    let (m, pool, out) = (rig.mechanism().clone(), rig.pool.clone(), seen.clone());
    stream.run(move || {
        let _ = gate.recv_timeout(LONG);
        std::thread::sleep(WORK);
        let live = m.live(kind);
        let used = pool.used();
        // SAFETY: the test keeps this range alive (that is what it checks)
        // until the fence behind this function completes.
        let ok = unsafe {
            std::ptr::write_bytes(addr as *mut u8, byte, len as usize);
            std::slice::from_raw_parts(addr as *const u8, len as usize).iter().all(|b| *b == byte)
        };
        *out.lock().unwrap() = Some((live, used, ok));
    });
    (open, seen)
}

#[test]
fn invariant_4_allocation_dropped_while_a_stream_writes_is_freed_only_after_its_fence() {
    within(30, || {
        let rig = Rig::cpu("fences-alloc", MIB);
        let m = rig.mechanism().clone();
        let stream = CpuStream::new(&m);
        let a = rig.binding.allocate(64 * KIB, 64).unwrap();
        let (addr, size) = (a.addr(), a.size());
        let (open, seen) = enqueue_write(&stream, &rig, ObjectKind::Allocation, addr, size, 0xA5);
        let fence = stream.fence();

        // The stream is blocked on a gate only this thread opens: if
        // dropping the handle waited for the device, this would never return.
        a.release_after(vec![fence.clone()]);
        assert!(!fence.query().unwrap(), "the work is still running");
        assert_eq!(m.live(ObjectKind::Allocation), 1, "freed before its fence");
        assert_eq!(rig.pool.used(), size, "refunded before the free");
        assert_eq!(rig.manager.queue().pending(), 1);
        for _ in 0..3 {
            assert_eq!(rig.manager.poll(), PollReport { retired: 0, quarantined: 0, still_pending: 1 });
        }
        assert_eq!(m.live(ObjectKind::Allocation), 1);

        open.send(()).unwrap();
        assert!(fence.wait(LONG).unwrap());
        assert_eq!(
            *seen.lock().unwrap(),
            Some((1, size, true)),
            "at the moment of the write the allocation must still be live and charged"
        );
        assert_eq!(rig.manager.poll(), PollReport { retired: 1, quarantined: 0, still_pending: 0 });
        assert_eq!(m.live(ObjectKind::Allocation), 0);
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
        let stats = rig.manager.queue().stats();
        assert_eq!((stats.enqueued, stats.retired, stats.pending), (1, 1, 0));

        drop((fence, stream, m));
        rig.unload();
    });
}

#[test]
fn invariant_4_region_dropped_while_a_stream_writes_is_released_only_after_its_fence() {
    within(30, || {
        let rig = Rig::cpu("fences-region", 4 * MIB);
        // A reaper polls every millisecond throughout: it must not free
        // early either.
        rig.manager.start_reaper(Duration::from_millis(1));
        let m = rig.mechanism().clone();
        let stream = CpuStream::new(&m);
        let mut region = rig.binding.reserve_virtual(2 * MIB).unwrap();
        region.grow_to(256 * KIB, |_| Ok::<(), ()>(())).unwrap();
        let (addr, len) = (region.addr(), region.len());
        let (open, seen) = enqueue_write(&stream, &rig, ObjectKind::Reservation, addr, len, 0x5A);
        let fence = stream.fence();
        region.used_by(fence.clone());
        drop(region);

        assert_eq!(m.live(ObjectKind::Reservation), 1, "released before its fence");
        assert_eq!(rig.pool.used(), 256 * KIB, "refunded before the release");
        assert_eq!(rig.manager.queue().pending(), 1);
        open.send(()).unwrap();
        std::thread::sleep(WORK / 2);
        // Mid-work, with the reaper running.
        assert_eq!(m.live(ObjectKind::Reservation), 1);
        assert!(fence.wait(LONG).unwrap());
        assert!(eventually(LONG, || rig.manager.queue().pending() == 0), "the reaper retires it");
        assert_eq!(*seen.lock().unwrap(), Some((1, 256 * KIB, true)));
        assert_eq!(m.live(ObjectKind::Reservation), 0);
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));

        drop((fence, stream, m));
        let manager = rig.unload();
        assert!(manager.drain(Duration::from_secs(1)).is_complete());
    });
}

#[test]
fn invariant_4_shrink_decommits_and_refunds_the_tail_only_after_its_fence() {
    within(30, || {
        let rig = Rig::cpu("fences-shrink", 4 * MIB);
        let m = rig.mechanism().clone();
        let stream = CpuStream::new(&m);
        let mut region = rig.binding.reserve_virtual(2 * MIB).unwrap();
        region
            .grow_to(512 * KIB, |v| {
                // SAFETY: CPU memory, just committed read-write, ours alone.
                unsafe { std::ptr::write_bytes(v.addr as *mut u8, 0x11, 256 * KIB as usize) };
                Ok::<(), ()>(())
            })
            .unwrap();
        let addr = region.addr();
        let tail = addr + 256 * KIB;
        let (open, seen) = enqueue_write(&stream, &rig, ObjectKind::Reservation, tail, 256 * KIB, 0x22);
        let fence = stream.fence();

        region.shrink_to(256 * KIB, vec![fence.clone()]).unwrap();
        assert_eq!((region.len(), region.committed()), (256 * KIB, 256 * KIB));
        assert_eq!(rig.pool.used(), 512 * KIB, "the tail is still mapped, so still charged");
        assert_eq!(rig.manager.poll().still_pending, 1);

        // The tail cannot be committed again while its decommit waits.
        let before = Ledger::of(&rig.pool);
        match region.grow_to(512 * KIB, |_| Ok::<(), ()>(())) {
            Err(GrowError::Binding(BindingError::Plugin(e))) => {
                assert_eq!(e.status, Status::Busy, "{e}");
                assert!(e.message.contains("fences"), "{e}");
            }
            other => panic!("grow over a pending decommit: {other:?}"),
        }
        assert_eq!(Ledger::of(&rig.pool), before);
        assert_eq!(region.len(), 256 * KIB);

        open.send(()).unwrap();
        assert!(fence.wait(LONG).unwrap());
        assert_eq!(*seen.lock().unwrap(), Some((1, 512 * KIB, true)));
        assert_eq!(rig.manager.poll().retired, 1);
        assert_eq!(rig.pool.used(), 256 * KIB, "refunded once decommitted");

        // Grown again at the same address: the head kept its bytes, the
        // tail's pages really went back (they read as zeros).
        region.grow_to(512 * KIB, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(region.addr(), addr);
        assert_eq!(rig.pool.used(), 512 * KIB);
        // SAFETY: committed CPU memory of a live region.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, 512 * KIB as usize) };
        assert!(bytes[..256 * KIB as usize].iter().all(|b| *b == 0x11));
        assert!(bytes[256 * KIB as usize..].iter().all(|b| *b == 0));

        drop(region);
        rig.manager.poll();
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
        drop((fence, stream));
        assert_eq!(live(&m), [0; 5]);
        drop(m);
        rig.unload();
    });
}

/// Work recorded on a region with `used_by` may touch any of its bytes, the
/// tail included: a shrink must wait for it as well as for the fences it is
/// given.
#[test]
fn invariant_4_shrink_waits_for_the_work_recorded_on_the_region() {
    within(30, || {
        let rig = Rig::cpu("fences-shrink-used-by", 4 * MIB);
        let mut region = rig.binding.reserve_virtual(2 * MIB).unwrap();
        region.grow_to(512 * KIB, |_| Ok::<(), ()>(())).unwrap();
        let work = Gate::new("work on the whole region");
        region.used_by(work.fence.clone());

        region.shrink_to(256 * KIB, Vec::new()).unwrap();
        assert_eq!(
            rig.pool.used(),
            512 * KIB,
            "the tail was decommitted and refunded while recorded work still used it"
        );
        assert_eq!(rig.manager.queue().pending(), 1);

        work.open();
        assert_eq!(rig.manager.poll().retired, 1);
        assert_eq!(rig.pool.used(), 256 * KIB);
        drop(region);
        rig.manager.poll();
        assert!(Ledger::of(&rig.pool).is_zero());
    });
}

/// A shrink whose fences have all completed runs at once, without the
/// queue's wait, and is counted once as the queue counts a free it ran at
/// once; one with a fence still running waits in the queue and is counted
/// there.
#[test]
fn a_shrink_behind_completed_fences_runs_now_and_is_counted_once() {
    within(30, || {
        let rig = Rig::cpu("fences-shrink-now", 4 * MIB);
        let mut region = rig.binding.reserve_virtual(2 * MIB).unwrap();
        region.grow_to(512 * KIB, |_| Ok::<(), ()>(())).unwrap();
        let before = rig.manager.queue().stats();
        let done = Gate::new("work already done");
        done.open();
        region.shrink_to(256 * KIB, vec![done.fence.clone()]).unwrap();
        assert_eq!(rig.pool.used(), 256 * KIB, "the tail stayed charged after its fences completed");
        let after = rig.manager.queue().stats();
        assert_eq!(
            (
                after.immediate - before.immediate,
                after.retired - before.retired,
                after.enqueued - before.enqueued
            ),
            (1, 1, 0)
        );
        assert_eq!(rig.manager.queue().pending(), 0);
        // The range is committable again at once (nothing left pending).
        region.grow_to(512 * KIB, |_| Ok::<(), ()>(())).unwrap();

        let running = Gate::new("work still running");
        region.shrink_to(256 * KIB, vec![running.fence.clone()]).unwrap();
        assert_eq!(rig.pool.used(), 512 * KIB);
        let queued = rig.manager.queue().stats();
        assert_eq!((queued.immediate, queued.enqueued - after.enqueued), (after.immediate, 1));
        running.open();
        assert_eq!(rig.manager.poll().retired, 1);
        assert_eq!(rig.pool.used(), 256 * KIB);
        drop(region);
        rig.manager.poll();
        assert!(Ledger::of(&rig.pool).is_zero());
    });
}

#[test]
fn invariant_8_a_panicking_stream_function_stops_at_the_boundary_and_the_free_still_waits_for_its_fence() {
    within(30, || {
        let rig = Rig::cpu("fences-panic", MIB);
        let m = rig.mechanism().clone();
        let stream = CpuStream::new(&m);
        let a = rig.binding.allocate(4096, 64).unwrap();
        let (open, gate) = mpsc::channel::<()>();
        stream.run(move || {
            let _ = gate.recv_timeout(LONG);
            panic!("a host function exploded (expected by this test)");
        });
        let after = Arc::new(AtomicBool::new(false));
        let flag = after.clone();
        stream.run(move || flag.store(true, Ordering::SeqCst));
        let fence = stream.fence();
        a.release_after(vec![fence.clone()]);
        assert_eq!(m.live(ObjectKind::Allocation), 1);

        open.send(()).unwrap();
        // The panic stopped in the host's trampoline: the stream's worker
        // lives on, runs the next function, and raises the fence.
        assert!(fence.wait(LONG).unwrap());
        assert!(after.load(Ordering::SeqCst));
        assert_eq!(rig.manager.poll().retired, 1);
        assert!(Ledger::of(&rig.pool).is_zero());
        drop((fence, stream));
        assert_eq!(live(&m), [0; 5]);
        drop(m);
        rig.unload();
    });
}
