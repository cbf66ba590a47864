//! Context lifecycle (issue 11): loss reported by the plugin, by a slot and
//! by the runtime; settlement exactly once; inert handles; retiring and
//! replacement; a thread held inside a slot while its context ends; and
//! plugins that misuse the host services.

mod common;

use common::lossy::{controls, MECHANISM_ID};
use memplug_host::governor::{AllocationClass, Pool};
use memplug_host::{
    BindingSpec, Context, LifeState, LifecycleEvent, LoadOptions, MemoryBinding, Plugin,
    ProcessMemoryManager, Status, TerminateError,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CPU1: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };

lossy_instance!(a, "lossy-a");
lossy_instance!(b, "lossy-b");
lossy_instance!(c, "lossy-c");
lossy_instance!(d, "lossy-d");
lossy_instance!(e, "lossy-e");
lossy_instance!(f, "lossy-f");
lossy_instance!(g, "lossy-g");
lossy_instance!(h1, "lossy-h1");
lossy_instance!(h2, "lossy-h2");
lossy_instance!(old11, "lossy-old11");

type Entry = memplug_sdk::abi::MemplugEntryV1;

struct Rig {
    manager: ProcessMemoryManager,
    context: Arc<Context>,
    pool: Arc<Pool>,
    binding: MemoryBinding,
    events: Arc<Mutex<Vec<LifecycleEvent>>>,
}

fn load(entry: Entry, name: &str) -> Plugin {
    unsafe { Plugin::from_entry(entry, name, &LoadOptions::default()) }.unwrap()
}

fn rig(entry: Entry, name: &str) -> Rig {
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(load(entry, name)).unwrap();
    let context = manager.context(&format!("{name}/lossy")).unwrap();
    let pool = manager.create_pool("pool", 1 << 30).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    context.subscribe(move |e| ev.lock().unwrap().push(e.clone()));
    Rig { manager, context, pool, binding, events }
}

fn transitions(r: &Rig) -> Vec<(LifeState, LifeState)> {
    r.events.lock().unwrap().iter().map(|e| (e.from, e.to)).collect()
}

#[test]
fn a_reported_loss_settles_every_charge_exactly_once_and_leaves_handles_inert() {
    let r = rig(a::entry, a::NAME);
    let c = controls(a::NAME);
    let kept: Vec<_> = (0..10).map(|i| r.binding.allocate(1000 + i, 64).unwrap()).collect();
    let freed = r.binding.allocate(5000, 64).unwrap();
    drop(freed);
    let charged: u64 = kept.iter().map(|k| k.charged()).sum();
    assert_eq!(r.pool.used(), charged);

    let report = c.report_loss("sticky fault in the test");
    assert!(report.known && report.accepted == 1, "{report:?}");
    assert_eq!(r.context.state(), LifeState::Lost);
    // A second report changes nothing and is counted as a repeat.
    c.report_loss("again");
    let plugin_stats = {
        let reg = r.manager.registry();
        reg.live_reports();
        r.context.mechanism().life_reason().unwrap()
    };
    assert!(plugin_stats.contains("sticky fault in the test"), "{plugin_stats}");

    // No new objects; the plugin is not called.
    let calls = c.calls.load(SeqCst);
    let e = r.binding.allocate(64, 64).unwrap_err();
    assert!(e.to_string().contains("lost"), "{e}");
    assert!(kept.iter().all(|k| k.is_lost()));

    // Terminate: the holders were told first, then the books settle once.
    r.manager.poll();
    assert_eq!(r.context.state(), LifeState::Terminated);
    assert_eq!(
        transitions(&r),
        [(LifeState::Active, LifeState::Lost), (LifeState::Lost, LifeState::Terminated)]
    );
    let events = r.events.lock().unwrap().clone();
    let notice = &events[0].notices;
    assert_eq!(notice.len(), 1);
    assert_eq!((notice[0].objects, notice[0].bytes), (10, charged));
    let s = events[1].settlement.clone().unwrap();
    assert!(s.after_loss);
    assert_eq!((s.bytes, s.bindings.len(), s.objects_forgotten), (charged, 1, 10));
    assert_eq!(r.pool.used(), 0, "every charge discharged");
    assert_eq!(r.pool.discharged(), charged);

    // Owners that outlive termination: no plugin call, no second refund.
    drop(kept);
    assert_eq!(r.pool.used(), 0);
    assert_eq!(r.pool.snapshot().leased, 0);
    assert_eq!(c.calls.load(SeqCst), calls, "the host never called the lost mechanism again");
    let again = r.context.terminate(Duration::ZERO).unwrap_err();
    assert!(matches!(again, TerminateError::AlreadyTerminated { .. }), "{again}");
    r.manager.poll();
    assert_eq!(transitions(&r).len(), 2, "each transition delivered once");
}

#[test]
fn a_slot_answering_device_lost_loses_the_context_and_a_1_1_plugin_cannot() {
    let r = rig(b::entry, b::NAME);
    let c = controls(b::NAME);
    c.answer_lost.store(true, SeqCst);
    let e = r.binding.allocate(64, 64).unwrap_err();
    assert!(e.to_string().contains("DEVICE_LOST"), "{e}");
    assert_eq!(r.context.state(), LifeState::Lost);
    assert_eq!(r.pool.used(), 0, "the failed allocation's grant came back");

    // A plugin that agreed on 1.1 cannot mean code 15: it is INTERNAL, and
    // the context stays active.
    let c11 = controls(old11::NAME);
    c11.max_minor.store(1, SeqCst);
    let r11 = rig(old11::entry, old11::NAME);
    c11.answer_lost.store(true, SeqCst);
    let e = r11.binding.allocate(64, 64).unwrap_err();
    assert!(
        matches!(&e, memplug_host::BindingError::Plugin(ce) if ce.status == Status::Internal && ce.raw == 15),
        "{e:?}"
    );
    assert_eq!(r11.context.state(), LifeState::Active);
    // Its services refuse: services are 1.2.
    let report = c11.report_loss("not allowed below 1.2");
    assert!(report.accepted == 0, "{report:?}");
    assert_eq!(r11.context.state(), LifeState::Active);
}

#[test]
fn a_release_quarantined_before_the_loss_settles_at_termination() {
    let r = rig(c::entry, c::NAME);
    let ctl = controls(c::NAME);
    let x = r.binding.allocate(4096, 64).unwrap();
    let y = r.binding.allocate(8192, 64).unwrap();
    let (xb, yb) = (x.charged(), y.charged());
    ctl.refuse_free.store(true, SeqCst);
    drop(x);
    assert_eq!(r.pool.snapshot().quarantined, xb, "refused: quarantined, still charged");
    ctl.refuse_free.store(false, SeqCst);
    r.context.declare_lost("the runtime saw an illegal address");
    let s = r.manager.terminate(&r.context, Duration::from_secs(5)).unwrap();
    assert_eq!(s.bindings[0].quarantined_bytes, xb);
    assert_eq!(s.bindings[0].bytes, yb);
    assert_eq!(s.bytes, xb + yb);
    let snap = r.pool.snapshot();
    assert_eq!((snap.used, snap.leased, snap.quarantined), (0, 0, 0));
    drop(y);
    assert_eq!(r.pool.used(), 0);
}

#[test]
fn a_retiring_context_keeps_its_objects_working_and_ends_with_the_last() {
    let r = rig(d::entry, d::NAME);
    let x = r.binding.allocate(4096, 64).unwrap();
    r.manager.retire(&r.context, "maintenance").unwrap();
    assert_eq!(r.context.state(), LifeState::Retiring);
    let e = r.binding.allocate(64, 64).unwrap_err();
    assert!(e.to_string().contains("retiring"), "{e}");
    let err = r.manager.bind(&r.context, &r.pool, BindingSpec::new(AllocationClass::Kv)).unwrap_err();
    assert!(err.to_string().contains("no active successor"), "{err}");
    let t = r.context.terminate(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(t, TerminateError::StillLive { objects: 1, .. }), "{t}");
    r.manager.poll();
    assert_eq!(r.context.state(), LifeState::Retiring, "one object still alive");
    drop(x);
    assert_eq!(r.pool.used(), 0, "freed by its plugin and refunded as usual");
    r.manager.poll();
    assert_eq!(r.context.state(), LifeState::Terminated);
    let s = r.context.settlement().unwrap();
    assert!(!s.after_loss);
    assert_eq!(s.bytes, 0, "nothing left to discharge after an orderly end");
}

#[test]
fn replacement_routes_new_bindings_and_unloads_the_old_plugin_once_settled() {
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(load(h1::entry, h1::NAME)).unwrap();
    manager.register_plugin(load(h2::entry, h2::NAME)).unwrap();
    let old = manager.context(&format!("{}/lossy", h1::NAME)).unwrap();
    let new = manager.context(&format!("{}/lossy", h2::NAME)).unwrap();
    let pool = manager.create_pool("pool", 1 << 30).unwrap();
    let b_old = manager.bind(&old, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let kept = b_old.allocate(4096, 64).unwrap();
    assert_eq!(old.state(), LifeState::Active);
    manager.replace(&old, &new, "driver upgrade", true).unwrap();
    assert_eq!(old.state(), LifeState::Retiring);
    // Bindings asked of the old context go to the new one.
    let b = manager.bind(&old, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    assert!(b.mechanism().same_as(new.mechanism()));
    let fresh = b.allocate(4096, 64).unwrap();
    assert_eq!(manager.select(CPU1, Default::default()).unwrap().label(), new.label());
    let (c_old, c_new) = (controls(h1::NAME), controls(h2::NAME));
    let (old_calls, new_calls) = (c_old.calls.load(SeqCst), c_new.calls.load(SeqCst));
    drop(fresh);
    drop(kept);
    assert_eq!(c_old.calls.load(SeqCst), old_calls + 1, "the old plugin freed its own object");
    assert_eq!(c_new.calls.load(SeqCst), new_calls + 1, "the new plugin freed its own object");
    assert_eq!(pool.used(), 0);
    drop((b_old, b, old, new));
    manager.poll();
    assert_eq!(manager.registry().plugins(), [h2::NAME.to_string()], "the old plugin was unloaded");
    // A context cannot replace itself, nor one on another device.
    let new = manager.context(&format!("{}/lossy", h2::NAME)).unwrap();
    assert!(new.replace_with(&new, "x").is_err());
}

#[test]
fn a_thread_held_inside_a_slot_keeps_termination_waiting() {
    let r = rig(e::entry, e::NAME);
    let ctl = controls(e::NAME);
    ctl.hold_allocations(true);
    let binding = r.binding.clone();
    let t = std::thread::spawn(move || binding.allocate(4096, 64));
    while ctl.inside.load(SeqCst) == 0 {
        std::thread::yield_now();
    }
    r.context.declare_lost("lost while a call is in flight");
    assert_eq!(r.context.calls_in_flight(), 1, "the binding's token (its door call takes none)");
    let early = r.context.terminate(Duration::from_millis(30)).unwrap_err();
    assert!(matches!(early, TerminateError::InFlight { calls: 1, .. }), "{early}");
    r.manager.poll();
    assert_eq!(r.context.state(), LifeState::Lost, "poll does not wait for calls in flight");
    ctl.hold_allocations(false);
    // The call in flight finishes (its object went with the device, and is
    // charged), then termination settles it.
    let made = t.join().unwrap().unwrap();
    assert!(made.is_lost());
    let s = r.context.terminate(Duration::from_secs(5)).unwrap();
    assert_eq!(s.bytes, made.charged());
    assert_eq!(r.pool.used(), 0);
    drop(made);
    assert_eq!(r.pool.used(), 0);
}

/// An entry that calls the host's services during negotiation (before any
/// mechanism exists) and keeps the table for later misuse.
static STASHED: Mutex<Option<(usize, usize)>> = Mutex::new(None);
static DURING: Mutex<Option<u32>> = Mutex::new(None);

unsafe extern "C" fn reporting_entry(
    host: *const memplug_sdk::abi::MemplugHostInfo,
    out: *mut memplug_sdk::abi::MemplugNegotiation,
    sink: *const memplug_sdk::abi::MemplugMessageSink,
) -> u32 {
    let s = &*(*host).services;
    let f = s.report_device_lost.unwrap();
    *DURING.lock().unwrap() = Some(f(s.ctx, MECHANISM_ID, b"early".as_ptr().cast(), 5));
    *STASHED.lock().unwrap() = Some((s.ctx as usize, f as usize));
    f_entry(host, out, sink)
}

unsafe fn f_entry(
    host: *const memplug_sdk::abi::MemplugHostInfo,
    out: *mut memplug_sdk::abi::MemplugNegotiation,
    sink: *const memplug_sdk::abi::MemplugMessageSink,
) -> u32 {
    f::entry(host, out, sink)
}

fn stashed_report(id: u64, reason: Option<&[u8]>, len: usize) -> u32 {
    let (ctx, f) = STASHED.lock().unwrap().unwrap();
    type Report = unsafe extern "C" fn(*mut core::ffi::c_void, u64, *const core::ffi::c_char, usize) -> u32;
    // SAFETY: the host's own service and context, stashed above.
    let f: Report = unsafe { std::mem::transmute::<usize, Report>(f) };
    unsafe { f(ctx as *mut _, id, reason.map_or(core::ptr::null(), |r| r.as_ptr().cast()), len) }
}

#[test]
fn misuse_of_the_services_is_refused_clearly_and_changes_nothing() {
    use memplug_sdk::abi::*;
    let p = load(reporting_entry, f::NAME);
    assert_eq!(*DURING.lock().unwrap(), Some(MEMPLUG_STATUS_INVALID_STATE), "no mechanism exists yet");
    let m = p.mechanism("lossy").unwrap().clone();
    assert_eq!(m.life_state(), LifeState::Active, "a report during negotiation loses nothing");
    assert_eq!(stashed_report(999, None, 0), MEMPLUG_STATUS_WRONG_MECHANISM, "not this plugin's mechanism");
    assert_eq!(
        stashed_report(MECHANISM_ID, None, 4),
        MEMPLUG_STATUS_INVALID_ARGUMENT,
        "NULL reason with a length"
    );
    let st = p.service_stats();
    assert_eq!((st.losses, st.refused), (0, 3));
    assert!(st.last_refusal.unwrap().contains("NULL"));
    assert_eq!(m.life_state(), LifeState::Active);
    // A valid report, then the same again: one loss, one repeat.
    assert_eq!(stashed_report(MECHANISM_ID, Some(b"gone\x1b[2J"), 9), MEMPLUG_STATUS_OK);
    assert_eq!(stashed_report(MECHANISM_ID, Some(b"gone"), 4), MEMPLUG_STATUS_OK);
    let st = p.service_stats();
    assert_eq!((st.losses, st.repeats), (1, 1));
    let why = m.life_reason().unwrap();
    assert!(why.contains("gone") && !why.contains('\x1b'), "the plugin's text is sanitised: {why:?}");
    // The raw report bypassed the SDK's latch, so this plugin would keep
    // answering OK: the host does not ask it any more.
    let ctl = controls(f::NAME);
    let calls = ctl.calls.load(SeqCst);
    // SAFETY: a test harness; nothing is made (the call is refused).
    let e = unsafe { m.ungoverned() }.allocator().allocate(64, 64).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "{e}");
    assert_eq!(
        ctl.calls.load(SeqCst),
        calls,
        "a plugin that keeps succeeding after its report is not called"
    );
    drop(m);
    p.unload().unwrap();
    // After unload the table still answers, and refuses.
    assert_eq!(stashed_report(MECHANISM_ID, None, 0), MEMPLUG_STATUS_INVALID_STATE);
}

#[test]
fn a_loss_reported_from_another_thread_while_calls_run_is_clean() {
    let r = rig(g::entry, g::NAME);
    let ctl = controls(g::NAME);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let b = r.binding.clone();
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                for _ in 0..2000 {
                    match b.allocate(256, 64) {
                        Ok(a) => kept.push(a),
                        Err(_) => break,
                    }
                    if kept.len() > 16 {
                        kept.remove(0);
                    }
                }
                kept
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2));
    let reporter = std::thread::spawn(move || ctl.report_loss("fell off the bus"));
    assert!(reporter.join().unwrap().known);
    let kept: Vec<_> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let charged: u64 = kept.iter().map(|k| k.charged()).sum();
    let s = r.manager.terminate(&r.context, Duration::from_secs(5)).unwrap();
    assert!(s.bytes >= charged, "what the owners still hold is settled (and anything freed in flight)");
    assert_eq!(r.pool.used(), 0);
    drop(kept);
    assert_eq!(r.pool.used(), 0, "no second refund");
}

lossy_instance!(mixed, "lossy-mixed");

#[test]
fn one_plugin_instance_held_by_a_1_2_and_a_1_1_host_answers_each_in_its_own_codes() {
    let new = load(mixed::entry, mixed::NAME);
    let opts = LoadOptions { max_minor: 1, ..LoadOptions::default() };
    let old = unsafe { Plugin::from_entry(mixed::entry, mixed::NAME, &opts) }.unwrap();
    assert_eq!((new.abi_version().1, old.abi_version().1), (2, 1));
    let report = controls(mixed::NAME).report_loss("gone under both hosts");
    assert_eq!((report.known, report.accepted), (true, 1), "only the 1.2 host has services");
    let (m_new, m_old) = (new.mechanism("lossy").unwrap(), old.mechanism("lossy").unwrap());
    assert_eq!(m_new.life_state(), LifeState::Lost);
    assert_eq!(m_old.life_state(), LifeState::Active, "a 1.1 host is not told through services");
    // SAFETY: test harness; both calls are refused.
    let e = unsafe { m_old.ungoverned() }.allocator().allocate(64, 64).unwrap_err();
    assert_eq!((e.status, e.raw), (Status::DeviceUnavailable, 7), "a 1.1 host gets a code 1.1 defines: {e}");
    assert_eq!(m_old.life_state(), LifeState::Active);
    let e = unsafe { m_new.ungoverned() }.allocator().allocate(64, 64).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "{e}");
}

#[test]
fn a_free_queued_behind_a_lost_devices_fence_settles_without_waiting_for_it() {
    use common::{CpuStream, Rig as CpuRig};
    let rig = CpuRig::cpu("lost-fence", 64 << 20);
    let stream = CpuStream::new(rig.mechanism());
    let (open, gate) = std::sync::mpsc::channel::<()>();
    // The stream's work never finishes while the gate is shut, so its
    // fence never completes on its own.
    stream.run(move || {
        let _ = gate.recv_timeout(Duration::from_secs(20));
    });
    let a = rig.binding.allocate(4096, 64).unwrap();
    a.release_after([stream.fence()]);
    rig.manager.poll();
    assert_eq!(rig.manager.queue().pending(), 1, "waits for the stream");
    rig.context.declare_lost("the device fell off the bus");
    rig.manager.poll();
    let q = rig.manager.queue().stats();
    assert_eq!((q.pending, q.lost), (0, 1), "the free left the queue as lost, without its fence: {q:?}");
    assert!(q.lost_fences >= 1, "{q:?}");
    assert_eq!(rig.context.state(), LifeState::Terminated);
    assert_eq!(rig.pool.used(), 0);
    let _ = open.send(());
}
