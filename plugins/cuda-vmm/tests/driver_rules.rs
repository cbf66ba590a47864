//! What a real CUDA driver does that the fake now does by default, and the
//! plugin's latency design, each proven by counting the fake's calls (no
//! timing): host functions serialised on one callback thread, context
//! overhead in `cuMemGetInfo`, the legacy default stream's implicit
//! synchronisation, `cuMemCreate` failing at step k (rolled back), the
//! zero-fill on a greatest-priority stream, pooled events, fence waits that
//! sleep instead of polling, no lock held across a driver call, batched
//! unmaps. Fake only: every test returns at once with
//! `MEMPLUG_CUDA_TEST_REAL=1`.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, BindingError, BindingSpec, GrowError, Plugin, ProcessMemoryManager, Requirements, Status,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A bound against hanging when a property under test is broken (the
/// thread it waits for would never finish); never a timing claim.
const HANG_GUARD: Duration = Duration::from_secs(20);

fn granularity(p: &Plugin) -> u64 {
    cuda0(p).properties().granularity
}

fn calls(name: &str) -> i64 {
    fake_entry_calls(name).unwrap()
}

/// A closed gate a host function waits at, opened by the test. The test's
/// own gate ([`Gate::shut`]) opens when dropped too: every host function
/// runs on the fake's one callback thread, so a test that failed with its
/// gate shut would hold up the host functions of every later test.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

/// The test's handle of a [`Gate`]: opens it when dropped.
struct OwnGate(Gate);

impl std::ops::Deref for OwnGate {
    type Target = Gate;
    fn deref(&self) -> &Gate {
        &self.0
    }
}

impl Drop for OwnGate {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl Gate {
    fn shut() -> OwnGate {
        OwnGate(Gate::default())
    }

    fn wait(&self) {
        let (m, cv) = &*self.0;
        let mut open = m.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
    }
    fn open(&self) {
        let (m, cv) = &*self.0;
        *m.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// The fake runs the host functions of every stream on one callback
/// thread, one at a time, as a real driver may (the plugin must not rely on
/// host functions of different streams running side by side).
#[test]
fn host_functions_of_every_stream_run_one_at_a_time_on_one_thread() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let streams: Vec<_> = (0..3).map(|_| sync.stream_create().unwrap()).collect();
    let threads = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for _ in 0..5 {
        for s in &streams {
            let (threads, running, most) = (Arc::clone(&threads), Arc::clone(&running), Arc::clone(&most));
            sync.enqueue(s, move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                threads.lock().unwrap().insert(format!("{:?}", std::thread::current().id()));
                std::thread::sleep(Duration::from_millis(1));
                running.fetch_sub(1, Ordering::SeqCst);
            })
            .unwrap();
        }
    }
    for s in streams {
        sync.stream_destroy(s).unwrap();
    }
    assert_eq!(threads.lock().unwrap().len(), 1, "host functions ran on {:?}", threads.lock().unwrap());
    assert_eq!(most.load(Ordering::SeqCst), 1, "two host functions ran at once");
    drop(m);
    unload_released(p);
}

/// A host function that would wait for another stream's work is refused
/// with BUSY at once: with one callback thread, that work (a host function
/// of its own, queued behind this one) could never run, so a real wait
/// would deadlock. No driver call is made from the host function either.
#[test]
fn a_host_function_waiting_for_another_streams_work_is_refused_not_deadlocked() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let s1 = sync.stream_create().unwrap();
    let s2 = sync.stream_create().unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (f2_tx, f2_rx) = mpsc::channel::<Arc<memplug_host::Fence>>();
    let (result_tx, result_rx) = mpsc::channel();
    let refused_before = fake_callback_refused();
    {
        let m = m.clone();
        sync.enqueue(&s1, move || {
            started_tx.send(()).unwrap();
            // The fence of s2, recorded after a host function of s2 that is
            // queued behind this one on the callback thread.
            let f2 = f2_rx.recv().unwrap();
            let r = m.sync().unwrap().fence_wait(&f2, Duration::MAX).map_err(|e| e.status);
            result_tx.send(r).unwrap();
        })
        .unwrap();
    }
    started_rx.recv_timeout(HANG_GUARD).expect("the host function of s1 started");
    let ran_b = Arc::new(AtomicUsize::new(0));
    {
        let ran_b = Arc::clone(&ran_b);
        sync.enqueue(&s2, move || {
            ran_b.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let f2 = Arc::new(sync.fence_record(&s2).unwrap());
    assert!(!sync.fence_query(&f2).unwrap(), "s2's host function waits for the callback thread");
    f2_tx.send(Arc::clone(&f2)).unwrap();
    let r =
        result_rx.recv_timeout(HANG_GUARD).expect("the host function's fence_wait returned (no deadlock)");
    assert_eq!(r, Err(Status::Busy));
    assert_eq!(fake_callback_refused(), refused_before, "no driver call was made from the host function");
    assert!(sync.fence_wait(&f2, Duration::from_secs(20)).unwrap());
    assert_eq!(ran_b.load(Ordering::SeqCst), 1);
    sync.fence_destroy(Arc::into_inner(f2).unwrap()).unwrap();
    sync.stream_destroy(s1).unwrap();
    sync.stream_destroy(s2).unwrap();
    drop(m);
    unload_released(p);
}

/// `cuMemGetInfo`'s free figure counts the context's own memory while the
/// context exists, as on a GPU: free = total − physical memory in use −
/// the context overhead, exactly; `memory_info` reports what the driver
/// says.
#[test]
fn memory_info_counts_the_context_overhead() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let overhead = fake_ctx_overhead();
    assert!(overhead > 0);
    let info = m.memory_info().unwrap().unwrap();
    assert_eq!(info.total_bytes - info.free_bytes, fake_used(0).unwrap() + overhead, "{info:?}");
    let a = unsafe { m.ungoverned() }.allocator();
    let b = a.allocate(8 << 20, 256).unwrap();
    let during = m.memory_info().unwrap().unwrap();
    assert_eq!(
        info.free_bytes - during.free_bytes,
        8 << 20,
        "only the allocation, the overhead is there already"
    );
    a.deallocate(b).unwrap();
    // The plugin's freer gives the block back a moment later; the figure
    // counts it free meanwhile, rounded as the plugin asked, not as the
    // driver keeps it.
    eventually("memory_info back to where it was", || m.memory_info().unwrap().unwrap() == info);
    drop(m);
    unload_released(p);
}

/// The legacy default stream (NULL, adopted by the plugin) synchronises
/// with blocking streams, as on a GPU: while work on it waits, a fence on a
/// runtime's blocking stream stays pending. The plugin's own streams and
/// its zero-fill stream are non-blocking: a fence on one completes, and a
/// commit (which zero-fills and waits for the fill) finishes, while the
/// legacy stream is held up.
#[test]
fn the_legacy_stream_holds_up_blocking_streams_but_not_the_plugins() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let sync = m.sync().unwrap();
    // SAFETY: NULL is the legacy default stream.
    let legacy = unsafe { sync.stream_adopt(std::ptr::null_mut()) }.unwrap();
    let gate = Gate::shut();
    {
        let gate = Gate::clone(&gate);
        sync.enqueue(&legacy, move || gate.wait()).unwrap();
    }
    let on_legacy = sync.fence_record(&legacy).unwrap();
    assert!(!sync.fence_query(&on_legacy).unwrap(), "the legacy stream runs its work asynchronously");
    // A runtime's blocking stream (flags 0), adopted.
    let mut native = std::ptr::null_mut();
    let (d, ctx) = (drv(), {
        let mut c = std::ptr::null_mut();
        in_context(0, |d| unsafe { (d.api.ctx_get_current)(&mut c) });
        c
    });
    unsafe {
        assert_eq!((d.api.ctx_push)(ctx), 0);
        assert_eq!((d.api.stream_create)(&mut native, 0), 0);
    }
    // SAFETY: a live stream of device 0's primary context.
    let blocking = unsafe { sync.stream_adopt(native.cast()) }.unwrap();
    let on_blocking = sync.fence_record(&blocking).unwrap();
    // The plugin's stream: non-blocking.
    let own = sync.stream_create().unwrap();
    let on_own = sync.fence_record(&own).unwrap();
    assert!(
        sync.fence_wait(&on_own, HANG_GUARD).unwrap(),
        "a plugin stream does not wait for the legacy stream"
    );
    assert!(!sync.fence_query(&on_blocking).unwrap(), "a blocking stream waits for the legacy stream");
    // A commit zero-fills on the plugin's stream and waits for the fill.
    let r = Arc::new(unsafe { m.ungoverned() }.virtual_backing().unwrap().reserve(g).unwrap());
    let (tx, rx) = mpsc::channel();
    let committer = {
        let (m, r) = (m.clone(), Arc::clone(&r));
        std::thread::spawn(move || {
            let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
            tx.send(vb.commit(&r, 0, g).map_err(|e| e.status)).unwrap();
        })
    };
    let committed = rx.recv_timeout(HANG_GUARD);
    gate.open();
    committer.join().unwrap();
    assert_eq!(committed, Ok(Ok(())), "the commit finished while the legacy stream was held up");
    assert!(sync.fence_wait(&on_legacy, HANG_GUARD).unwrap());
    assert!(sync.fence_wait(&on_blocking, HANG_GUARD).unwrap());
    assert_eq!(read(r.addr(), 64), vec![0; 64], "zero-filled");
    for f in [on_legacy, on_blocking, on_own] {
        sync.fence_destroy(f).unwrap();
    }
    for s in [legacy, blocking, own] {
        sync.stream_destroy(s).unwrap();
    }
    unsafe {
        assert_eq!((d.api.stream_destroy)(native), 0);
        let mut popped = std::ptr::null_mut();
        assert_eq!((d.api.ctx_pop)(&mut popped), 0);
    }
    unsafe { m.ungoverned() }.virtual_backing().unwrap().release(Arc::into_inner(r).unwrap()).unwrap();
    drop(m);
    unload_released(p);
}

/// The steps at which the rollback tests fail `cuMemCreate`: the one
/// `MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT` names, or each of 1..=4.
fn fail_steps() -> Vec<u64> {
    fail_create_mode().map_or_else(|| (1..=4).collect(), |k| vec![k])
}

/// `cuMemCreate` failing at step k of a commit, of a shared object's
/// creation and of a region's growth through a binding: a clear
/// OUT_OF_MEMORY naming the call, nothing left behind in the plugin, the
/// driver or the pool, and the range usable afterwards.
#[test]
fn a_cu_mem_create_failing_at_step_k_is_rolled_back_cleanly() {
    if real() {
        return;
    }
    let _s = serial();
    // Disarmed whatever happens, so a failure here cannot fail a later
    // test's cuMemCreate.
    struct Disarm;
    impl Drop for Disarm {
        fn drop(&mut self) {
            fake_fail_create_at(0);
        }
    }
    let _disarm = Disarm;
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    // The zero-fill stream is made by the first commit that gets that far:
    // made now, so the counts below compare like with like.
    let warm = vb.reserve(g).unwrap();
    vb.commit(&warm, 0, g).unwrap();
    vb.release(warm).unwrap();
    for k in fail_steps() {
        let r = vb.reserve(8 * g).unwrap();
        let (used, objects, failures) = (fake_used(0), fake_live_objects(), fake_create_failures());
        fake_fail_create_at(k as i64);
        let committed = vb.commit(&r, 0, 4 * g);
        fake_fail_create_at(0);
        match committed {
            Ok(()) => {
                assert!(k > 4, "step {k} did not fail");
                vb.decommit(&r, 0, 4 * g).unwrap();
            }
            Err(e) => {
                assert!(k <= 4);
                assert_eq!(e.status, Status::OutOfMemory, "step {k}: {e}");
                assert!(e.message.contains("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"), "step {k}: {e}");
                if k > 1 {
                    assert!(e.message.contains(&format!("granule {k} of 4")), "step {k}: {e}");
                }
                assert_eq!(fake_create_failures(), failures + 1);
            }
        }
        assert_eq!(vb.committed_bytes(&r).unwrap(), 0, "step {k}: nothing committed");
        assert_eq!(
            (fake_used(0), fake_live_objects()),
            (used, objects),
            "step {k}: nothing left in the driver"
        );
        vb.commit(&r, 0, 4 * g).unwrap();
        assert_eq!(read(r.addr() + 3 * g, 64), vec![0; 64]);
        vb.release(r).unwrap();

        let (used, objects) = (fake_used(0), fake_live_objects());
        fake_fail_create_at(k as i64);
        let created = sm.create(4 * g);
        fake_fail_create_at(0);
        match created {
            Ok(obj) => {
                assert!(k > 4);
                sm.release(obj).unwrap();
            }
            Err(e) => assert_eq!(e.status, Status::OutOfMemory, "create, step {k}: {e}"),
        }
        assert_eq!((fake_used(0), fake_live_objects()), (used, objects), "create, step {k}: nothing left");
    }
    assert_quiescent(&p);
    drop(m);
    // Through the host: the grow fails, the region keeps its old view, the
    // pool is charged nothing for it.
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let dev = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let context = manager.select(dev, all).unwrap();
    let pool = manager.create_pool("pool", 64 * g).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let mut region = binding.reserve_virtual(16 * g).unwrap();
    region.grow_to::<()>(2 * g, |_| Ok(())).unwrap();
    for k in fail_steps().into_iter().filter(|&k| k <= 4) {
        let used = fake_used(0);
        fake_fail_create_at(k as i64);
        let grown = region.grow_to::<()>(6 * g, |_| Ok(()));
        fake_fail_create_at(0);
        match grown {
            Err(GrowError::Binding(BindingError::Plugin(e))) => {
                assert_eq!(e.status, Status::OutOfMemory, "grow, step {k}: {e}")
            }
            other => panic!("grow, step {k}: {other:?}"),
        }
        assert_eq!(region.committed(), 2 * g, "grow, step {k}: the old view stays");
        assert_eq!(pool.snapshot().used, 2 * g, "grow, step {k}: nothing charged");
        assert_eq!(fake_used(0), used, "grow, step {k}: nothing left in the driver");
    }
    region.grow_to::<()>(6 * g, |_| Ok(())).unwrap();
    assert_eq!(pool.snapshot().used, 6 * g);
    drop(region);
    assert_eq!(pool.snapshot().used, 0);
    drop(binding);
    drop(context);
    manager.unload_plugin("memplug-cuda-vmm").unwrap();
}

/// The environment switch itself: `MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT=k`,
/// read at the fake's first `cuInit`, fails the k-th `cuMemCreate` of the
/// process (here: of its first commit, in a child process).
#[test]
fn the_fail_create_switch_fails_the_kth_create_of_the_process() {
    if real() || is_child() {
        return;
    }
    let _s = serial();
    let k = fail_create_mode().unwrap_or(3);
    let ks = k.to_string();
    let out = run_child("child_fail_create", &[(FAIL_CREATE_ENV, Some(std::ffi::OsStr::new(&ks)))]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL CREATE OK"));
}

#[test]
#[ignore = "run by the_fail_create_switch_fails_the_kth_create_of_the_process in a child process"]
fn child_fail_create() {
    if !is_child() {
        return;
    }
    let k: u64 = std::env::var(FAIL_CREATE_ENV).unwrap().parse().unwrap();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let n = k.max(4);
    let r = vb.reserve(n * g).unwrap();
    let objects = fake_live_objects();
    let e = vb.commit(&r, 0, n * g).unwrap_err();
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
    assert_eq!(fake_create_failures(), 1);
    assert_eq!(fake_live_objects(), objects, "rolled back");
    assert_eq!(fake_entry_calls("cuMemCreate"), Some(k as i64), "failed at create {k}, the last one tried");
    vb.commit(&r, 0, n * g).unwrap();
    vb.release(r).unwrap();
    println!("FAIL CREATE OK");
}

/// The zero-fill runs on one plugin stream of the context's greatest
/// priority, made once (not per commit), never on a default-priority one.
#[test]
fn zero_fill_runs_on_one_stream_of_the_greatest_priority() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let (mut least, mut greatest) = (0, 0);
    in_context(0, |d| unsafe {
        assert_eq!((d.api.ctx_get_stream_priority_range)(&mut least, &mut greatest), 0);
    });
    assert!(greatest < least, "the fake has priorities [{greatest}, {least}]");
    let (top, default) = (fake_memsets_at_priority(greatest), fake_memsets_at_priority(least));
    let (with_priority, plain) = (calls("cuStreamCreateWithPriority"), calls("cuStreamCreate"));
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(4 * g).unwrap();
    for _ in 0..10 {
        vb.commit(&r, 0, 2 * g).unwrap();
        vb.decommit(&r, 0, 2 * g).unwrap();
    }
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let obj = sm.create(g).unwrap();
    assert_eq!(fake_memsets_at_priority(greatest) - top, 11, "every fill at the greatest priority");
    assert_eq!(fake_memsets_at_priority(least) - default, 0, "no fill at the default priority");
    assert_eq!(calls("cuStreamCreateWithPriority") - with_priority, 1, "one fill stream for the context");
    assert_eq!(calls("cuStreamCreate") - plain, 0);
    sm.release(obj).unwrap();
    vb.release(r).unwrap();
    drop(m);
    unload_released(p);
}

/// Fences reuse their events: record/wait/destroy cycles create one event;
/// a burst of live fences creates what it needs, and destroying them keeps
/// at most the pool's bound for reuse and gives the rest back. Unloading
/// gives back the pool.
#[test]
fn fence_events_are_pooled_and_the_pool_is_bounded() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    let (created, destroyed, events) = (calls("cuEventCreate"), calls("cuEventDestroy"), fake_live_events());
    for _ in 0..200 {
        let f = sync.fence_record(&s).unwrap();
        assert!(sync.fence_wait(&f, HANG_GUARD).unwrap());
        sync.fence_destroy(f).unwrap();
    }
    assert_eq!(calls("cuEventCreate") - created, 1, "200 fences, one event");
    assert_eq!(calls("cuEventDestroy") - destroyed, 0);
    let max = memplug_plugin_cuda_vmm::EVENT_POOL_MAX as i64;
    let burst = max + 36;
    let fences: Vec<_> = (0..burst).map(|_| sync.fence_record(&s).unwrap()).collect();
    assert_eq!(calls("cuEventCreate") - created, burst, "the pooled one reused, the rest made");
    for f in &fences {
        assert!(sync.fence_wait(f, HANG_GUARD).unwrap());
    }
    for f in fences {
        sync.fence_destroy(f).unwrap();
    }
    assert_eq!(calls("cuEventDestroy") - destroyed, burst - max, "the pool keeps {max}");
    assert_eq!(fake_live_events().unwrap() - events.unwrap(), max);
    // A fence destroyed before it completes: its event is not reused.
    let gate = Gate::shut();
    {
        let gate = Gate::clone(&gate);
        sync.enqueue(&s, move || gate.wait()).unwrap();
    }
    let pending = sync.fence_record(&s).unwrap();
    let before = calls("cuEventDestroy");
    sync.fence_destroy(pending).unwrap();
    assert_eq!(calls("cuEventDestroy") - before, 1, "a pending event goes back to the driver");
    gate.open();
    sync.stream_destroy(s).unwrap();
    drop(m);
    unload_released(p);
    assert_eq!(fake_live_events(), events, "the pool is given back at unload");
}

/// A fence wait sleeps until the fence completes: one `cuEventQuery`, then
/// one `cuEventSynchronize` on a blocking-sync event (the thread sleeps in
/// the driver), and no polling, whether the wait has a limit (a waiter
/// thread makes the call) or none (the caller makes it). A wait that times
/// out asks once more at the deadline, no more.
#[test]
fn a_fence_wait_sleeps_until_completion_instead_of_polling() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    // (A failed earlier test may have left its plugin copy, and threads.)
    let waiters_before = waiter_threads();
    for timeout in [Duration::from_secs(60), Duration::MAX] {
        let gate = Gate::shut();
        {
            let gate = Gate::clone(&gate);
            sync.enqueue(&s, move || gate.wait()).unwrap();
        }
        let f = Arc::new(sync.fence_record(&s).unwrap());
        let (queries, blocking, spinning) =
            (calls("cuEventQuery"), fake_event_syncs(true), fake_event_syncs(false));
        let in_sync = fake_threads_in_event_sync();
        let waiter = {
            let (m, f) = (m.clone(), Arc::clone(&f));
            std::thread::spawn(move || m.sync().unwrap().fence_wait(&f, timeout).unwrap())
        };
        eventually(&format!("{timeout:?}: somebody sleeping in the driver"), || {
            fake_threads_in_event_sync() == in_sync + 1
        });
        assert_eq!(calls("cuEventQuery") - queries, 1, "{timeout:?}: one query before sleeping");
        gate.open();
        assert!(waiter.join().unwrap(), "{timeout:?}: the wait saw the fence complete");
        assert_eq!(calls("cuEventQuery") - queries, 1, "{timeout:?}: no polling");
        assert_eq!(fake_event_syncs(true) - blocking, 1, "{timeout:?}: one blocking-sync wait");
        assert_eq!(fake_event_syncs(false) - spinning, 0, "{timeout:?}: no spinning wait");
        sync.fence_destroy(Arc::into_inner(f).unwrap()).unwrap();
    }
    // A limit that passes: one query first, one at the deadline.
    let gate = Gate::shut();
    {
        let gate = Gate::clone(&gate);
        sync.enqueue(&s, move || gate.wait()).unwrap();
    }
    let f = sync.fence_record(&s).unwrap();
    let queries = calls("cuEventQuery");
    assert!(!sync.fence_wait(&f, Duration::from_millis(30)).unwrap(), "times out");
    assert_eq!(calls("cuEventQuery") - queries, 2, "no polling while it waited");
    gate.open();
    assert!(sync.fence_wait(&f, HANG_GUARD).unwrap());
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    assert!(waiter_threads() > waiters_before, "a timed wait went through a waiter thread");
    drop(m);
    unload_released(p);
    assert_eq!(waiter_threads(), waiters_before, "the waiter threads are joined at unload");
}

/// Threads of this process named as the plugin names its waiter threads
/// (`memplug-cuda-wait`, as the kernel keeps the first 15 bytes).
fn waiter_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "memplug-cuda-wa")
        .count()
}

/// No lock is held across a driver call: while one thread is held inside
/// the fake's `cuLaunchHostFunc` (the fake's hook) on stream 1, another
/// records, queries, waits for and destroys fences and enqueues work on
/// stream 2 (and records on stream 1 too); while one is held inside
/// `cuMemCreate` committing part of a reservation, another commits,
/// counts and decommits another part of the same reservation, and a
/// commit over the busy range is refused (nothing changed) rather than
/// queued behind it.
#[test]
fn a_thread_held_in_the_driver_holds_up_no_other_call() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let sync = m.sync().unwrap();
    let s1 = Arc::new(sync.stream_create().unwrap());
    let s2 = Arc::new(sync.stream_create().unwrap());

    fake_block_next_call("cuLaunchHostFunc");
    let held = {
        let (m, s1) = (m.clone(), Arc::clone(&s1));
        std::thread::spawn(move || m.sync().unwrap().enqueue(&s1, || {}).map_err(|e| e.status))
    };
    assert_eq!(fake_wait_blocked(1, 20_000), 1, "the enqueue is held inside cuLaunchHostFunc");
    let (tx, rx) = mpsc::channel();
    let other = {
        let (m, s1, s2) = (m.clone(), Arc::clone(&s1), Arc::clone(&s2));
        std::thread::spawn(move || {
            let sync = m.sync().unwrap();
            let r = (|| {
                let f = sync.fence_record(&s2)?;
                sync.fence_query(&f)?;
                sync.enqueue(&s2, || {})?;
                let f2 = sync.fence_record(&s2)?;
                assert!(sync.fence_wait(&f2, HANG_GUARD)?);
                let f1 = sync.fence_record(&s1)?;
                sync.fence_query(&f1)?;
                for f in [f, f2, f1] {
                    sync.fence_destroy(f).map_err(|e| e.error)?;
                }
                Ok::<(), memplug_host::CallError>(())
            })();
            tx.send(r.map_err(|e| e.status)).unwrap();
        })
    };
    let done = rx.recv_timeout(HANG_GUARD);
    let still_held = fake_wait_blocked(1, 0);
    fake_release_blocked();
    other.join().unwrap();
    assert_eq!(done, Ok(Ok(())), "the other thread's calls finished");
    assert_eq!(still_held, 1, "…while the first was still inside the driver");
    assert_eq!(held.join().unwrap(), Ok(()));

    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = Arc::new(vb.reserve(8 * g).unwrap());
    fake_block_next_call("cuMemCreate");
    let held = {
        let (m, r) = (m.clone(), Arc::clone(&r));
        std::thread::spawn(move || {
            unsafe { m.ungoverned() }.virtual_backing().unwrap().commit(&r, 0, 2 * g).map_err(|e| e.status)
        })
    };
    assert_eq!(fake_wait_blocked(1, 20_000), 1, "the commit is held inside cuMemCreate");
    let (tx, rx) = mpsc::channel();
    let other = {
        let (m, r) = (m.clone(), Arc::clone(&r));
        std::thread::spawn(move || {
            let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
            let over_busy = vb.commit(&r, g, 2 * g).map_err(|e| e.status);
            let info = m.memory_info().map(|i| i.map(|_| ()));
            let r = (|| {
                vb.commit(&r, 4 * g, 2 * g)?;
                let n = vb.committed_bytes(&r)?;
                vb.decommit(&r, 4 * g, g)?;
                Ok::<u64, memplug_host::CallError>(n)
            })();
            tx.send((over_busy, info.is_some_and(|i| i.is_ok()), r.map_err(|e| e.status))).unwrap();
        })
    };
    let done = rx.recv_timeout(HANG_GUARD);
    let still_held = fake_wait_blocked(1, 0);
    fake_release_blocked();
    other.join().unwrap();
    let (over_busy, info_ok, r2) = done.expect("the other thread's calls finished");
    assert_eq!(still_held, 1, "…while the first was still inside the driver");
    assert_eq!(over_busy, Err(Status::InvalidState), "a commit over the busy range is refused");
    assert!(info_ok);
    assert_eq!(r2, Ok(2 * g), "the other part committed (the held commit not counted yet)");
    assert_eq!(held.join().unwrap(), Ok(()));
    assert_eq!(vb.committed_bytes(&r).unwrap(), 3 * g);
    vb.release(Arc::into_inner(r).unwrap()).unwrap();
    sync.stream_destroy(Arc::into_inner(s1).unwrap()).unwrap();
    sync.stream_destroy(Arc::into_inner(s2).unwrap()).unwrap();
    drop(m);
    unload_released(p);
}

/// Unmapping is batched over adjacent granules: decommitting N adjacent
/// granules is one `cuMemUnmap` (not N); releasing a reservation is one
/// per run of adjacent mapped granules, committed and shared alike; a
/// shared unmap is one.
#[test]
fn adjacent_granules_are_unmapped_in_one_call() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let r = vb.reserve(16 * g).unwrap();
    vb.commit(&r, 0, 8 * g).unwrap();
    let (unmaps, releases) = (calls("cuMemUnmap"), calls("cuMemRelease"));
    vb.decommit(&r, 0, 8 * g).unwrap();
    assert_eq!(calls("cuMemUnmap") - unmaps, 1, "8 adjacent granules, one cuMemUnmap");
    assert_eq!(calls("cuMemRelease") - releases, 8, "one chunk per granule");
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0);

    // Committed [0, 2g), shared [2g, 4g), committed [4g, 6g): one run;
    // committed [10g, 11g): another.
    let obj = sm.create(2 * g).unwrap();
    vb.commit(&r, 0, 2 * g).unwrap();
    sm.map(&obj, 0, &r, 2 * g, 2 * g, Access::ReadWrite).unwrap();
    vb.commit(&r, 4 * g, 2 * g).unwrap();
    vb.commit(&r, 10 * g, g).unwrap();
    let other = vb.reserve(4 * g).unwrap();
    sm.map(&obj, 0, &other, g, 2 * g, Access::ReadWrite).unwrap();
    let unmaps = calls("cuMemUnmap");
    sm.unmap(&other, g, 2 * g).unwrap();
    assert_eq!(calls("cuMemUnmap") - unmaps, 1, "a two-granule shared mapping, one cuMemUnmap");
    let used = fake_used(0).unwrap();
    sm.release(obj).unwrap();
    let unmaps = calls("cuMemUnmap");
    vb.release(r).unwrap();
    assert_eq!(calls("cuMemUnmap") - unmaps, 2, "two runs of adjacent granules, two cuMemUnmap");
    assert_eq!(used - fake_used(0).unwrap(), 7 * g, "five committed granules and the object's two");
    vb.release(other).unwrap();
    drop(m);
    unload_released(p);
}

/// A driver whose `cuMemUnmap` takes one mapping per call: the first
/// batched attempt is refused (INVALID_VALUE), the plugin unmaps granule by
/// granule, remembers, and later decommits go granule by granule at once.
#[test]
fn a_driver_that_unmaps_one_mapping_per_call_gets_one_call_per_granule() {
    if real() {
        return;
    }
    let _s = serial();
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            fake_set_unmap_one_mapping(false);
        }
    }
    let _reset = Reset;
    fake_set_unmap_one_mapping(true);
    let p = load();
    let m = cuda0(&p);
    let g = granularity(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(4 * g).unwrap();
    let used = fake_used(0).unwrap();
    vb.commit(&r, 0, 4 * g).unwrap();
    let unmaps = calls("cuMemUnmap");
    vb.decommit(&r, 0, 4 * g).unwrap();
    assert_eq!(calls("cuMemUnmap") - unmaps, 1 + 4, "one refused batch, then one per granule");
    vb.commit(&r, 0, 4 * g).unwrap();
    let unmaps = calls("cuMemUnmap");
    vb.decommit(&r, 0, 4 * g).unwrap();
    assert_eq!(calls("cuMemUnmap") - unmaps, 4, "remembered: no batch tried again");
    assert_eq!(fake_used(0).unwrap(), used);
    vb.release(r).unwrap();
    drop(m);
    unload_released(p);
}
