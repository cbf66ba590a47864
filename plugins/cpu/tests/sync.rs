//! The sync capability: host functions run on the stream in order, fences
//! complete exactly when the work before them has run, waits time out, and
//! handles are checked.

mod common;
use common::*;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

/// Sleeps, then raises a flag.
struct SleepThenSet {
    sleep: Duration,
    flag: AtomicBool,
}

unsafe extern "C" fn sleep_then_set(p: *mut c_void) {
    let s = &*(p as *const SleepThenSet);
    std::thread::sleep(s.sleep);
    s.flag.store(true, Ordering::Release);
}

fn ptr<T>(v: &T) -> *const c_void {
    v as *const T as *const c_void
}

#[test]
fn a_fence_completes_only_after_the_host_function_before_it() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let work = SleepThenSet { sleep: Duration::from_millis(150), flag: AtomicBool::new(false) };
    h.enqueue(s, sleep_then_set, ptr(&work)).unwrap();
    let f = h.fence_record(s).unwrap();

    pending(h.fence_query(f), Status::NotReady);
    // Poll: whenever the fence says OK, the flag must already be set.
    let start = Instant::now();
    loop {
        match h.fence_query(f) {
            Ok(()) => {
                assert!(work.flag.load(Ordering::Acquire), "fence completed before the work");
                break;
            }
            Err(e) => {
                assert_eq!(e.status, Status::NotReady, "{e:?}");
                assert!(start.elapsed() < Duration::from_secs(10), "the fence never completed");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    assert!(start.elapsed() >= Duration::from_millis(100), "the host function's sleep was skipped");
    h.fence_wait(f, 0).unwrap();
    h.fence_destroy(f).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn a_wait_times_out_while_work_is_blocked_and_succeeds_after() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let gate = Gate::default();
    h.enqueue(s, wait_at_gate, ptr(&gate)).unwrap();
    let f = h.fence_record(s).unwrap();

    let start = Instant::now();
    pending(h.fence_wait(f, 30 * MS), Status::Timeout);
    assert!(start.elapsed() >= Duration::from_millis(30), "the wait returned early");
    pending(h.fence_wait(f, 0), Status::Timeout);
    pending(h.fence_query(f), Status::NotReady);
    assert!(!gate.flag.load(Ordering::Acquire));

    gate.open();
    h.fence_wait(f, 10_000 * MS).unwrap();
    assert!(gate.flag.load(Ordering::Acquire));
    h.fence_query(f).unwrap();
    // A wait with the longest timeout on a completed fence returns at once.
    h.fence_wait(f, u64::MAX).unwrap();
    h.fence_destroy(f).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

/// One of many host functions: records its index in a shared log.
struct Step {
    index: u32,
    log: *const Mutex<Vec<u32>>,
}

unsafe extern "C" fn record_step(p: *mut c_void) {
    let s = &*(p as *const Step);
    (*s.log).lock().unwrap().push(s.index);
}

#[test]
fn host_functions_run_in_submission_order_and_fences_interleave() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let log = Mutex::new(Vec::new());
    let steps: Vec<Step> = (0..2000).map(|index| Step { index, log: &log }).collect();
    let mut fences = Vec::new();
    for step in &steps {
        h.enqueue(s, record_step, ptr(step)).unwrap();
        if step.index % 500 == 499 {
            fences.push((step.index, h.fence_record(s).unwrap()));
        }
    }
    for (index, f) in fences {
        h.fence_wait(f, 10_000 * MS).unwrap();
        // Everything up to and including `index` has run.
        assert!(log.lock().unwrap().len() > index as usize);
        h.fence_destroy(f).unwrap();
    }
    assert_eq!(*log.lock().unwrap(), (0..2000).collect::<Vec<_>>());
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn streams_run_independently() {
    let h = harness();
    let blocked = h.stream_create().unwrap();
    let free = h.stream_create().unwrap();
    let gate = Gate::default();
    h.enqueue(blocked, wait_at_gate, ptr(&gate)).unwrap();
    let work = SleepThenSet { sleep: Duration::ZERO, flag: AtomicBool::new(false) };
    h.enqueue(free, sleep_then_set, ptr(&work)).unwrap();
    let f = h.fence_record(free).unwrap();
    h.fence_wait(f, 10_000 * MS).unwrap();
    assert!(work.flag.load(Ordering::Acquire));
    gate.open();
    h.fence_destroy(f).unwrap();
    h.stream_destroy(blocked).unwrap();
    h.stream_destroy(free).unwrap();
    h.assert_balanced();
}

#[test]
fn stream_destroy_waits_for_submitted_work_and_keeps_its_fences_valid() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let work = SleepThenSet { sleep: Duration::from_millis(50), flag: AtomicBool::new(false) };
    h.enqueue(s, sleep_then_set, ptr(&work)).unwrap();
    let f = h.fence_record(s).unwrap();
    h.stream_destroy(s).unwrap();
    assert!(work.flag.load(Ordering::Acquire), "destroy returned before the work ran");
    h.fence_query(f).unwrap();
    h.fence_wait(f, 0).unwrap();
    refused(h.enqueue(s, sleep_then_set, ptr(&work)), Status::UnknownAllocation);
    refused(h.fence_record(s), Status::UnknownAllocation);
    refused(h.stream_destroy(s), Status::UnknownAllocation);
    h.fence_destroy(f).unwrap();
    h.assert_balanced();
}

/// Tries to destroy its own stream from inside one of its host functions.
struct SelfDestroy {
    api: Api,
    stream: u64,
    status: AtomicU32,
}

unsafe extern "C" fn destroy_own_stream(p: *mut c_void) {
    let s = &*(p as *const SelfDestroy);
    let status = s.api.sync.stream_destroy.unwrap()(s.api.ctx as *mut c_void, s.stream, std::ptr::null());
    s.status.store(status, Ordering::Release);
}

#[test]
fn a_stream_cannot_be_destroyed_from_its_own_host_function() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let probe = SelfDestroy { api: h.api, stream: s, status: AtomicU32::new(u32::MAX) };
    h.enqueue(s, destroy_own_stream, ptr(&probe)).unwrap();
    let f = h.fence_record(s).unwrap();
    h.fence_wait(f, 10_000 * MS).unwrap();
    assert_eq!(probe.status.load(Ordering::Acquire), MEMPLUG_STATUS_BUSY);
    h.fence_destroy(f).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn unknown_stale_and_forged_handles_are_unknown_allocations() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let f = h.fence_record(s).unwrap();
    h.fence_wait(f, 10_000 * MS).unwrap();
    let live = h.live();
    let noop = SleepThenSet { sleep: Duration::ZERO, flag: AtomicBool::new(false) };

    // A fence handle is not a stream handle and vice versa, whatever slot
    // they happen to share.
    for bad in [0, 1, u64::MAX, s ^ (1 << 32), s + 1, f] {
        if bad == s {
            continue;
        }
        refused(h.enqueue(bad, sleep_then_set, ptr(&noop)), Status::UnknownAllocation);
        refused(h.fence_record(bad), Status::UnknownAllocation);
        refused(h.stream_destroy(bad), Status::UnknownAllocation);
    }
    for bad in [0, 1, u64::MAX, f ^ (1 << 32), f + 1, s] {
        if bad == f {
            continue;
        }
        refused(h.fence_query(bad), Status::UnknownAllocation);
        refused(h.fence_wait(bad, 0), Status::UnknownAllocation);
        refused(h.fence_destroy(bad), Status::UnknownAllocation);
    }
    assert_eq!(h.live(), live, "refusals changed nothing");
    assert!(!noop.flag.load(Ordering::Acquire));

    h.fence_destroy(f).unwrap();
    h.stream_destroy(s).unwrap();
    // Stale handles, even after their slots are reused.
    let s2 = h.stream_create().unwrap();
    let f2 = h.fence_record(s2).unwrap();
    refused(h.fence_query(f), Status::UnknownAllocation);
    refused(h.fence_destroy(f), Status::UnknownAllocation);
    refused(h.fence_record(s), Status::UnknownAllocation);
    refused(h.stream_destroy(s), Status::UnknownAllocation);
    h.fence_destroy(f2).unwrap();
    h.stream_destroy(s2).unwrap();
    h.assert_balanced();
}

#[test]
fn a_null_host_function_is_an_invalid_argument() {
    let h = harness();
    let s = h.stream_create().unwrap();
    let r = call(|sink| unsafe {
        h.sync.enqueue_host_fn.unwrap()(h.ctx as *mut c_void, s, None, std::ptr::null_mut(), sink)
    });
    refused(r, Status::InvalidArgument);
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}
