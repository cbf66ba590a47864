//! Every wait the host makes has an end (issue 28, items 1–4): a loss that
//! races an offload, a restore or a privatise frees the host copy in its
//! healthy pool and answers DEVICE_LOST; a region dropped after a loss with
//! a shrink queued retires and the plugin unloads; a queued operation's
//! fence the plugin cannot have recorded is refused naming the slot, with
//! the range given back exactly; and a drain whose fence keeps failing
//! backs off and says which entry is stuck.
//!
//! The faulty tests drive the reference CPU plugin through the `faulty`
//! shim (`common/faulty.rs`), whose controls are process-wide: they take
//! `SERIAL` so the file also runs under `cargo test`'s threads.

mod common;

use common::faulty::{faults, faulty_cpu_entry, one_test_at_a_time};
use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{
    BindingError, BindingSpec, CallError, FenceSource, LoadOptions, MemoryBinding, Plugin,
    ProcessMemoryManager, Region, Requirements, Residence, Retire, RetireOutcome, SharedFence, Status,
};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// A manager of its own over the shim, with a device binding.
struct World {
    manager: ProcessMemoryManager,
    context: Arc<memplug_host::Context>,
    device: MemoryBinding,
    granule: u64,
}

fn world() -> World {
    // SAFETY: the shim's entry republishes the CPU plugin's descriptor.
    let plugin = unsafe { Plugin::from_entry(faulty_cpu_entry, "faulty", &LoadOptions::default()) }.unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let ctx = manager.select(CPU0, all).unwrap();
    let granule = ctx.mechanism().properties().granularity;
    let pool = manager.create_pool("device", 1 << 30).unwrap();
    let device = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    World { manager, context: ctx, device, granule }
}

impl World {
    fn context(&self) -> Arc<memplug_host::Context> {
        self.context.clone()
    }
    /// The test's "another thread" reports the loss.
    fn lose_after_next_copy(&self) {
        let ctx = self.context();
        faults().after_next_copy(move || {
            ctx.declare_lost("reported from another thread while a copy was in flight");
        });
    }
    /// After the loss: terminate (poll), and check the device side ends at
    /// exactly zero with nothing queued.
    fn ends_settled(&self) {
        self.manager.poll();
        assert_eq!(self.device.pool().used(), 0, "the lost context's charges are settled");
        assert_eq!(
            self.manager.queue().pending(),
            0,
            "nothing stays queued: {:?}",
            self.manager.queue().stats()
        );
    }
}

fn device_lost(e: &BindingError) -> bool {
    matches!(e, BindingError::Plugin(c) if c.status == Status::DeviceLost)
}

fn committed(w: &World, granules: u64) -> Region {
    let mut r = w.device.reserve_virtual(8 * w.granule).unwrap();
    r.grow_to(granules * w.granule, |_| Ok::<(), ()>(())).unwrap();
    r
}

// ---- item 1: a loss that races an offload, a restore or a privatise ----

#[test]
fn a_loss_reported_mid_offload_frees_the_host_copy_in_its_healthy_pool_and_answers_device_lost() {
    let _s = one_test_at_a_time();
    let w = world();
    let host = Rig::cpu("waits-offload-host", 1 << 30);
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = committed(&w, 3);
    w.lose_after_next_copy();
    let e = r.offload_to(&host.binding, stream.stream(), WAIT).unwrap_err();
    assert!(device_lost(&e), "the truth is DEVICE_LOST: {e}");
    assert!(r.is_lost());
    assert_eq!(r.residence(), Residence::Device);
    host.manager.poll();
    assert_eq!(host.pool.used(), 0, "the host copy is not kept charged by a device that is gone");
    assert_eq!(host.manager.queue().pending(), 0);
    assert!(w.device.quarantined().is_empty(), "{:?}", w.device.quarantined());
    drop(r);
    w.ends_settled();
    drop(stream);
    host.unload();
}

#[test]
fn a_loss_between_the_copies_of_an_offload_frees_the_host_copy() {
    let _s = one_test_at_a_time();
    let w = world();
    let g = w.granule;
    let host = Rig::cpu("waits-offload-two", 1 << 30);
    let stream = CpuStream::new(w.device.mechanism());
    // Two private ranges: a privatised granule of a prefix, and a tail.
    let prefix = w.device.create_shared(2 * g, |_| {}).unwrap();
    let mut r = w.device.reserve_virtual(8 * g).unwrap();
    r.map_prefix(&prefix).unwrap();
    assert!(r.privatise(0, g, stream.stream(), WAIT).unwrap().wait(WAIT).unwrap());
    r.grow_to(4 * g, |_| Ok::<(), ()>(())).unwrap();
    w.lose_after_next_copy();
    let e = r.offload_to(&host.binding, stream.stream(), WAIT).unwrap_err();
    assert!(device_lost(&e), "{e}");
    host.manager.poll();
    assert_eq!(host.pool.used(), 0, "the host copy is freed");
    drop((r, prefix));
    w.ends_settled();
}

#[test]
fn a_loss_reported_mid_restore_frees_the_host_copy_when_the_region_goes() {
    let _s = one_test_at_a_time();
    let w = world();
    let host = Rig::cpu("waits-restore-host", 1 << 30);
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = committed(&w, 3);
    r.offload_to(&host.binding, stream.stream(), WAIT).unwrap();
    assert_eq!(host.pool.used(), 3 * w.granule);
    w.lose_after_next_copy();
    let Err(e) = r.restore(stream.stream()) else { panic!("restored on a lost device") };
    assert!(device_lost(&e), "{e}");
    drop(r);
    host.manager.poll();
    assert_eq!(host.pool.used(), 0, "the host copy is freed behind the lost restore's copies");
    w.ends_settled();
}

#[test]
fn a_loss_reported_mid_privatise_answers_device_lost_and_keeps_nothing() {
    let _s = one_test_at_a_time();
    let w = world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let prefix = w.device.create_shared(2 * g, |_| {}).unwrap();
    let mut r = w.device.reserve_virtual(8 * g).unwrap();
    r.map_prefix(&prefix).unwrap();
    w.lose_after_next_copy();
    let Err(e) = r.privatise(g, g, stream.stream(), WAIT) else { panic!("privatised on a lost device") };
    assert!(device_lost(&e), "{e}");
    assert!(w.device.quarantined().is_empty(), "a loss is not a quarantine: {:?}", w.device.quarantined());
    drop((r, prefix));
    w.ends_settled();
}

// ---- item 2: a region dropped after a loss with a shrink still queued ----

#[test]
fn a_region_dropped_after_a_loss_with_a_shrink_queued_retires_once_the_shrink_has() {
    let rig = Rig::cpu("waits-shrink-lost", 64 * MIB);
    let g = rig.mechanism().properties().granularity;
    let mut r = rig.binding.reserve_virtual(8 * g).unwrap();
    r.grow_to(4 * g, |_| Ok::<(), ()>(())).unwrap();
    let gate = Gate::new("shrink");
    r.shrink_to(g, vec![gate.fence.clone()]).unwrap();
    rig.context.declare_lost("test");
    drop(r);
    gate.open();
    // The queue alone (no termination yet): the shrink retires without a
    // plugin call, and the region behind it must follow.
    rig.manager.queue().poll();
    assert_eq!(rig.manager.queue().pending(), 0, "{:?}", rig.manager.queue().stats());
    rig.manager.poll();
    assert_eq!(rig.pool.used(), 0);
    unpinned(rig);
}

#[test]
fn termination_settles_what_a_lost_context_left_queued_and_the_plugin_unloads() {
    let rig = Rig::cpu("waits-terminate-queued", 64 * MIB);
    let g = rig.mechanism().properties().granularity;
    let mut r = rig.binding.reserve_virtual(8 * g).unwrap();
    r.grow_to(4 * g, |_| Ok::<(), ()>(())).unwrap();
    // Runtime fences that never complete: only the termination ends these
    // waits.
    let never = Gate::new("never");
    r.shrink_to(g, vec![never.fence.clone()]).unwrap();
    let a = rig.binding.allocate(4096, 64).unwrap();
    a.release_after([never.fence.clone()]);
    rig.context.declare_lost("test");
    drop(r);
    rig.manager.poll();
    let q = rig.manager.queue().stats();
    assert_eq!(q.pending, 0, "{q:?}");
    assert!(q.settled_lost >= 3, "{q:?}");
    assert_eq!(rig.pool.used(), 0);
    // Exactly once: nothing more happens on later polls.
    rig.manager.poll();
    assert_eq!(rig.manager.queue().stats().retired, q.retired);
    unpinned(rig);
}

/// Nothing of the host pins the lost context any more: an unload is not
/// refused for it. (The CPU plugin itself still holds the memory of a
/// mechanism the runtime declared lost — its device is fine — so the
/// unload may still be refused for the plugin's own count, never for a
/// pin.)
fn unpinned(rig: Rig) {
    let (_, r) = rig.try_unload();
    if let Err(e) = r {
        assert!(!e.contains("pinned"), "{e}");
    }
}

// ---- item 3: queued operations' fences ----

#[test]
fn a_queued_commit_answering_fence_0_is_refused_naming_the_slot_and_given_back_exactly() {
    let _s = one_test_at_a_time();
    let w = world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = committed(&w, 1);
    faults().queued_fence_zero.store(true, SeqCst);
    let e = r.grow_on(3 * g, stream.stream()).unwrap_err();
    faults().disarm();
    let msg = e.to_string();
    assert!(msg.contains("virtual_backing.commit_on") && msg.contains("fence handle 0"), "{msg}");
    assert_eq!(r.committed(), g, "the grow is refused");
    // The range is given back behind a fence the host recorded: the
    // charge ends exact and the range can be grown again.
    assert!(eventually(WAIT, || {
        w.manager.poll();
        w.device.pool().used() == g
    }));
    r.grow_to(3 * g, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(w.device.pool().used(), 3 * g);
    drop(r);
    w.manager.drain(WAIT);
    assert_eq!(w.device.pool().used(), 0);
    assert_eq!(w.manager.queue().pending(), 0);
}

#[test]
fn the_raw_queued_slots_refuse_fence_0_naming_the_slot() {
    let _s = one_test_at_a_time();
    let w = world();
    let g = w.granule;
    let m = w.device.mechanism();
    let stream = CpuStream::new(m);
    // SAFETY: a test harness calling the plugin's slots directly; what it
    // makes it gives back.
    let raw = unsafe { m.ungoverned() };
    let vb = raw.virtual_backing().unwrap();
    let res = vb.reserve(4 * g).unwrap();
    faults().queued_fence_zero.store(true, SeqCst);
    let e: CallError = vb.commit_on(&res, 0, g, stream.stream()).unwrap_err();
    assert_eq!(e.slot, "virtual_backing.commit_on");
    assert!(memplug_host::accepted_unfenced(&e));
    let e = vb.decommit_on(&res, 0, g, stream.stream()).unwrap_err();
    faults().disarm();
    assert_eq!(e.slot, "virtual_backing.decommit_on");
    let f = memplug_host::PluginFence::record(m, stream.stream()).unwrap();
    assert!(f.wait(WAIT).unwrap());
    drop(f);
    vb.release(res).unwrap();
    drop(stream);
    assert_eq!(live(m), [0; 5], "no fence 0 was counted live");
}

#[test]
fn a_recorded_fence_0_is_refused_and_an_offload_orders_its_copies_another_way() {
    let _s = one_test_at_a_time();
    let w = world();
    let m = w.device.mechanism();
    let stream = CpuStream::new(m);
    faults().record_fence_zero.store(true, SeqCst);
    let e = memplug_host::PluginFence::record_typed(m, stream.stream()).unwrap_err();
    assert_eq!(e.slot, "sync.fence_record");
    assert!(e.to_string().contains("fence handle 0"), "{e}");
    // The offload's copy is then followed by a host function instead.
    let host = Rig::cpu("waits-record-zero-host", 1 << 30);
    let mut r = committed(&w, 2);
    let report = r.offload_to(&host.binding, stream.stream(), WAIT).unwrap();
    faults().disarm();
    assert_eq!(report.released, 2 * w.granule);
    assert!(r.restore(stream.stream()).unwrap().wait(WAIT).unwrap());
    drop(r);
    w.manager.drain(WAIT);
    host.manager.drain(WAIT);
    assert_eq!((w.device.pool().used(), host.pool.used()), (0, 0));
    drop(stream);
    assert_eq!(live(m), [0; 5], "no fence 0 was counted live");
}

#[test]
fn a_queued_fence_that_never_completes_is_waited_on_with_an_end_and_settled_by_the_loss() {
    let _s = one_test_at_a_time();
    let w = world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = committed(&w, 1);
    faults().hold_queued.store(true, SeqCst);
    let f = r.grow_on(3 * g, stream.stream()).unwrap();
    faults().hold_queued.store(false, SeqCst);
    assert!(!f.wait(Duration::from_millis(20)).unwrap());
    r.shrink_to(g, Vec::new()).unwrap();
    drop(f);
    let t = Instant::now();
    let report = w.manager.drain(Duration::from_millis(200));
    assert!(t.elapsed() < Duration::from_secs(5), "the drain ended");
    assert!(!report.is_complete(), "the decommit waits for the commit's fence");
    assert_eq!(w.device.pool().used(), 3 * g);
    w.context().declare_lost("the plugin never completes its fences");
    drop(r);
    w.ends_settled();
    faults().release_fences();
}

// ---- item 4: a wait that keeps failing backs off and says why ----

/// A fence whose query and wait fail at once, counting the calls.
struct Failing(Arc<AtomicU64>);

impl FenceSource for Failing {
    fn query(&self) -> Result<bool, CallError> {
        self.0.fetch_add(1, SeqCst);
        Err(self.err())
    }
    fn wait(&self, _: Duration) -> Result<bool, CallError> {
        self.0.fetch_add(1, SeqCst);
        Err(self.err())
    }
    fn describe(&self) -> String {
        "failing fence".into()
    }
}

impl Failing {
    fn err(&self) -> CallError {
        CallError {
            status: Status::Internal,
            raw: Status::Internal.raw(),
            slot: "sync.fence_wait",
            mechanism: "test/failing".into(),
            message: "the driver is wedged".into(),
        }
    }
}

struct Job;
impl Retire for Job {
    fn retire(self: Box<Self>) -> RetireOutcome {
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        "the stuck job".into()
    }
}

#[test]
fn a_drain_whose_fence_keeps_failing_backs_off_and_reports_the_stuck_entry() {
    let manager = ProcessMemoryManager::new();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let l = lines.clone();
    manager.hub().set_log_hook(move |_, source, msg| l.lock().unwrap().push(format!("{source}: {msg}")));
    let calls = Arc::new(AtomicU64::new(0));
    let fence: SharedFence = Arc::new(Failing(calls.clone()));
    manager.queue().enqueue(vec![fence], Box::new(Job));
    let report = manager.drain(Duration::from_millis(300));
    let n = calls.load(SeqCst);
    // Without a pause: hundreds of thousands of calls in 300 ms. With the
    // backoff (at most 4 ms between passes, two calls a pass): a few
    // hundred at most.
    assert!(n < 2_000, "{n} fence calls in 300 ms");
    let stuck = report.stuck.expect("the drain names the stuck entry");
    assert!(stuck.contains("the stuck job") && stuck.contains("failing fence"), "{stuck}");
    assert!(stuck.contains("the driver is wedged"), "{stuck}");
    let q = manager.queue().stats();
    assert!(q.wait_errors > 0 && q.backoffs > 0, "{q:?}");
    let lines = lines.lock().unwrap().clone();
    assert!(!lines.is_empty() && lines.len() <= 2, "rate-limited log: {lines:?}");
    assert!(lines[0].contains("the stuck job"), "{lines:?}");
    assert_eq!(report.left.len(), 1);
}
