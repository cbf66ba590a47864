//! A model of offload, restore and copy-on-write under injected faults:
//! random sequences of grow, shrink, write, offload, restore and privatise
//! on a region that maps a shared prefix, each transaction with at most
//! one slot of the plugin failing (its k-th next call) or the fences it
//! records held back. After every step the region is where the model says
//! (addresses unchanged), every byte is what was last written, the other
//! region still reads the shared prefix, and both pools' use is exact.
//! A device lost mid-offload is its own test.
//!
//! The plugin is the reference CPU plugin behind the `faulty` shim
//! (`common/faulty.rs`).

mod common;

use common::faulty::{faults, faulty_cpu_entry, one_test_at_a_time, Slot, SLOTS};
use common::*;
use memplug_host::governor::{AllocationClass, Pool};
use memplug_host::{
    BindingSpec, LoadOptions, MemoryBinding, Plugin, ProcessMemoryManager, Region, Requirements, Residence,
    SharedFence, Status,
};
use proptest::prelude::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

const PREFIX: u64 = 4;
const RESERVE: u64 = 16;

#[derive(Clone, Debug)]
enum Op {
    Grow(u64),
    Shrink(u64),
    Write(u64),
    Offload,
    Restore,
    Privatise(u64),
}

#[derive(Clone, Debug)]
struct Step {
    op: Op,
    fault: Option<(Slot, i64)>,
    hold_fences: bool,
}

fn step() -> impl Strategy<Value = Step> {
    let op = prop_oneof![
        2 => (1u64..6).prop_map(Op::Grow),
        1 => (0u64..4).prop_map(Op::Shrink),
        2 => (0u64..10).prop_map(Op::Write),
        3 => Just(Op::Offload),
        3 => Just(Op::Restore),
        2 => (0u64..PREFIX).prop_map(Op::Privatise),
    ];
    let fault = prop_oneof![
        2 => Just(None),
        3 => (proptest::sample::select(SLOTS.to_vec()), 0i64..3).prop_map(Some),
    ];
    (op, fault, proptest::bool::weighted(0.15)).prop_map(|(op, fault, hold_fences)| Step {
        op,
        fault,
        hold_fences,
    })
}

struct World {
    manager: ProcessMemoryManager,
    context: Arc<memplug_host::Context>,
    device: MemoryBinding,
    host: MemoryBinding,
    /// For probe copies (a pool of its own, outside the figures checked).
    probe: MemoryBinding,
    granule: u64,
}

/// A manager of its own over the shim (the plugin's state is shared, the
/// pools and the host's view of the context are not).
fn world() -> World {
    // SAFETY: the shim's entry republishes the CPU plugin's descriptor.
    let plugin = unsafe { Plugin::from_entry(faulty_cpu_entry, "faulty", &LoadOptions::default()) }.unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let ctx = manager.select(CPU0, all).unwrap();
    let granule = ctx.mechanism().properties().granularity;
    let bind = |name: &str| {
        let pool = manager.create_pool(name, 1 << 30).unwrap();
        manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap()
    };
    let (device, host, probe) = (bind("device"), bind("host"), bind("probe"));
    World { manager, context: ctx, device, host, probe, granule }
}

/// What the region should be.
#[derive(Debug)]
struct Model {
    /// The seed of each granule's bytes, from the base.
    seeds: Vec<u8>,
    /// Granules after the prefix.
    committed: u64,
    privatised: Vec<u64>,
    offloaded: bool,
    /// Granules an offload could not decommit (still charged).
    kept: u64,
    next_seed: u8,
}

impl Model {
    fn private(&self) -> u64 {
        self.committed + self.privatised.len() as u64
    }
    fn fresh(&mut self) -> u8 {
        self.next_seed = self.next_seed.wrapping_add(37);
        self.next_seed
    }
}

fn write_granule(addr: u64, g: u64, seed: u8) {
    // SAFETY: a committed, writable granule of the test's region.
    let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, g as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ seed;
    }
}

fn granule_holds(addr: u64, g: u64, seed: u8) -> bool {
    // SAFETY: readable memory of the test's region or host copy.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, g as usize) };
    bytes.iter().enumerate().all(|(i, b)| *b == (i as u8).wrapping_mul(13) ^ seed)
}

fn settle(w: &World, fences: &mut Vec<SharedFence>) {
    faults().release_fences();
    faults().disarm();
    for f in fences.drain(..) {
        assert!(f.wait(Duration::from_secs(10)).unwrap(), "{} did not complete", f.describe());
    }
    // Memory a failed copy may have been writing is freed behind that
    // copy's fence, which completes soon after: wait for it.
    w.manager.drain(Duration::from_secs(10));
}

/// Whether the plugin holds `[addr, addr + len)` as usable memory: its
/// copy refuses a range that is not (`OUT_OF_RANGE`).
fn backed(w: &World, probe: u64, stream: &memplug_host::Stream, addr: u64, len: u64) -> bool {
    let sync = w.device.mechanism().sync().unwrap();
    // SAFETY: the destination is the probe allocation, idle between
    // probes; the source, when accepted, is the region's committed memory.
    match unsafe { sync.copy(stream, probe, addr, len) } {
        Ok(()) => {
            let f = memplug_host::PluginFence::record(w.device.mechanism(), stream).unwrap();
            assert!(f.wait(Duration::from_secs(10)).unwrap());
            true
        }
        Err(e) => {
            assert_eq!(e.status, Status::OutOfRange, "{e}");
            false
        }
    }
}

fn check(w: &World, m: &Model, a: &Region, b: &Region, base: u64, prefix: u64) -> Result<(), TestCaseError> {
    let g = w.granule;
    prop_assert_eq!(a.addr(), base);
    prop_assert_eq!(a.committed(), m.committed * g);
    let device_private = if m.offloaded { m.kept } else { m.private() };
    prop_assert_eq!(w.device.pool().used(), prefix + device_private * g, "device pool: {:?}", m);
    let host_bytes = if m.offloaded { m.private() * g } else { 0 };
    prop_assert_eq!(
        w.host.pool().used(),
        host_bytes,
        "host pool: {:?}; queue {:?}",
        m,
        w.manager.queue().stats()
    );
    for i in 0..PREFIX {
        prop_assert!(granule_holds(b.addr() + i * g, g, 9 + i as u8), "the shared prefix changed");
    }
    match a.residence() {
        Residence::Device => {
            prop_assert!(!m.offloaded);
            for (i, &seed) in m.seeds.iter().enumerate() {
                prop_assert!(granule_holds(base + i as u64 * g, g, seed), "granule {} of {:?}", i, m);
            }
        }
        Residence::Host { addr, bytes } => {
            prop_assert!(m.offloaded);
            // The device range is really given back (save what the plugin
            // refused to decommit).
            if m.kept == 0 {
                let probe = w.probe.allocate(g, 64).unwrap();
                let s = CpuStream::new(w.device.mechanism());
                for i in m.privatised.iter().copied().chain(PREFIX..PREFIX + m.committed) {
                    prop_assert!(
                        !backed(w, probe.addr(), s.stream(), base + i * g, g),
                        "granule {} still committed",
                        i
                    );
                }
            }
            prop_assert_eq!(bytes, m.private() * g);
            // The host copy: the privatised granules in order, then the tail.
            let mut order: Vec<u64> = m.privatised.clone();
            order.sort_unstable();
            order.extend(PREFIX..PREFIX + m.committed);
            for (k, i) in order.into_iter().enumerate() {
                prop_assert!(
                    granule_holds(addr + k as u64 * g, g, m.seeds[i as usize]),
                    "host copy of {}",
                    i
                );
            }
        }
    }
    Ok(())
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let _serial = one_test_at_a_time();
    let w = &world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let s = stream.stream();
    // Short only where a held fence makes the wait time out for sure: a
    // loaded machine must not turn a plain step into a timeout.
    let wait_for = |held: bool| if held { Duration::from_millis(200) } else { Duration::from_secs(20) };
    let prefix = w
        .device
        .create_shared(PREFIX * g, |v| {
            for i in 0..PREFIX {
                write_granule(v.addr + i * g, g, 9 + i as u8);
            }
        })
        .unwrap();
    let (mut a, mut b) =
        (w.device.reserve_virtual(RESERVE * g).unwrap(), w.device.reserve_virtual(RESERVE * g).unwrap());
    a.map_prefix(&prefix).unwrap();
    b.map_prefix(&prefix).unwrap();
    let base = a.addr();
    let mut m = Model {
        seeds: (0..PREFIX).map(|i| 9 + i as u8).collect(),
        committed: 0,
        privatised: Vec::new(),
        offloaded: false,
        kept: 0,
        next_seed: 0,
    };
    let mut fences = Vec::new();
    for st in steps {
        if let Some((slot, k)) = st.fault {
            faults().arm(slot, k);
        }
        faults().hold_fences.store(st.hold_fences, SeqCst);
        match st.op {
            Op::Grow(n) => {
                faults().disarm(); // grows and shrinks are tested elsewhere
                let want = PREFIX + m.committed + n;
                if !m.offloaded && want <= RESERVE && a.grow_to(want * g, |_| Ok::<(), ()>(())).is_ok() {
                    for i in PREFIX + m.committed..want {
                        let seed = m.fresh();
                        write_granule(base + i * g, g, seed);
                        m.seeds.push(seed);
                    }
                    m.committed = want - PREFIX;
                }
            }
            Op::Shrink(n) => {
                faults().disarm();
                if !m.offloaded && n < m.committed && a.shrink_to((PREFIX + n) * g, Vec::new()).is_ok() {
                    m.committed = n;
                    m.seeds.truncate((PREFIX + n) as usize);
                }
            }
            Op::Write(i) => {
                let i = i % (PREFIX + m.committed).max(1);
                let private = i >= PREFIX || m.privatised.contains(&i);
                if !m.offloaded && private && (i as usize) < m.seeds.len() {
                    settle(w, &mut fences);
                    let seed = m.fresh();
                    write_granule(base + i * g, g, seed);
                    m.seeds[i as usize] = seed;
                }
            }
            Op::Offload => match a.offload_to(&w.host, s, wait_for(st.hold_fences)) {
                Ok(report) => {
                    prop_assert!(!m.offloaded);
                    prop_assert_eq!(report.released + report.kept, m.private() * g);
                    m.offloaded = true;
                    m.kept = report.kept / g;
                }
                Err(e) => prop_assert!(m.offloaded || st.fault.is_some() || st.hold_fences, "{e}"),
            },
            Op::Restore => match a.restore(s) {
                Ok(f) => {
                    prop_assert!(m.offloaded);
                    fences.push(f);
                    m.offloaded = false;
                    m.kept = 0;
                }
                Err(e) => prop_assert!(!m.offloaded || st.fault.is_some(), "{e}"),
            },
            Op::Privatise(i) => match a.privatise(i * g, g, s, wait_for(st.hold_fences)) {
                Ok(f) => {
                    prop_assert!(!m.offloaded && !m.privatised.contains(&i));
                    fences.push(f);
                    m.privatised.push(i);
                }
                Err(e) => prop_assert!(
                    m.offloaded || m.privatised.contains(&i) || st.fault.is_some() || st.hold_fences,
                    "{e}"
                ),
            },
        }
        settle(w, &mut fences);
        check(w, &m, &a, &b, base, PREFIX * g)?;
    }
    drop((a, b, prefix));
    w.manager.poll();
    prop_assert_eq!((w.device.pool().used(), w.host.pool().used()), (0, 0));
    prop_assert!(w.device.quarantined().is_empty(), "{:?}", w.device.quarantined());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn offload_restore_and_privatise_are_transactions_under_any_single_fault(
        steps in proptest::collection::vec(step(), 1..14)
    ) {
        run(steps)?;
    }
}

/// Each slot's failure is really reached by some transaction (the model
/// above would pass vacuously if faults never fired).
#[test]
fn every_slot_the_transactions_use_can_be_failed() {
    let _serial = one_test_at_a_time();
    let w = &world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let s = stream.stream();
    let prefix = w.device.create_shared(2 * g, |_| {}).unwrap();
    for slot in SLOTS {
        let before = faults().fired(slot);
        let mut r = w.device.reserve_virtual(8 * g).unwrap();
        r.map_prefix(&prefix).unwrap();
        r.grow_to(4 * g, |_| Ok::<(), ()>(())).unwrap();
        // A host function is the fallback of a fence the plugin refused to
        // record: reaching it takes both failing.
        let arm = || {
            faults().arm(slot, 0);
            if slot == Slot::EnqueueHostFn {
                faults().arm(Slot::FenceRecord, 0);
            }
        };
        arm();
        let _ = r.privatise(0, g, s, Duration::from_secs(5)).map(|f| f.wait(Duration::from_secs(5)));
        arm();
        let _ = r.offload_to(&w.host, s, Duration::from_secs(5));
        arm();
        let _ = r.restore(s).map(|f| f.wait(Duration::from_secs(5)));
        faults().disarm();
        assert!(faults().fired(slot) > before, "no transaction reached {slot:?}");
        drop(r);
        w.manager.poll();
    }
}

/// The device is lost during the offload's copy: the region goes with it,
/// the host copy (in another context, here another manager's) is freed,
/// and both ledgers end exact.
#[test]
fn a_device_lost_mid_offload_loses_the_region_and_frees_the_host_copy() {
    let _serial = one_test_at_a_time();
    let w = &world();
    let g = w.granule;
    let host_rig = Rig::cpu("lost-mid-offload-host", 1 << 30);
    let host_pool: &Arc<Pool> = &host_rig.pool;
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = w.device.reserve_virtual(8 * g).unwrap();
    r.grow_to(3 * g, |_| Ok::<(), ()>(())).unwrap();
    faults().lose_at_copy.store(true, SeqCst);
    let e = r.offload_to(&host_rig.binding, stream.stream(), Duration::from_secs(5)).unwrap_err();
    let memplug_host::BindingError::Plugin(call) = &e else { panic!("{e}") };
    assert_eq!(call.status, Status::DeviceLost, "{e}");
    assert!(r.is_lost());
    assert_eq!(r.residence(), Residence::Device);
    host_rig.manager.poll();
    assert_eq!(host_pool.used(), 0, "the host copy was freed");
    assert!(r.offload_to(&host_rig.binding, stream.stream(), Duration::from_secs(1)).is_err());
    assert!(r.restore(stream.stream()).is_err());
    drop(r);
    w.manager.poll();
    assert_eq!(host_pool.used(), 0);
}

/// A restore of two ranges whose second commit fails gives the first back:
/// the region stays offloaded with nothing committed or charged, and the
/// next restore brings every byte back.
#[test]
fn a_restore_whose_second_commit_fails_gives_the_first_back() {
    let _serial = one_test_at_a_time();
    let w = &world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let s = stream.stream();
    let prefix = w.device.create_shared(PREFIX * g, |_| {}).unwrap();
    let mut a = w.device.reserve_virtual(RESERVE * g).unwrap();
    a.map_prefix(&prefix).unwrap();
    assert!(a.privatise(g, g, s, Duration::from_secs(5)).unwrap().wait(Duration::from_secs(5)).unwrap());
    a.grow_to((PREFIX + 2) * g, |_| Ok::<(), ()>(())).unwrap();
    write_granule(a.addr() + g, g, 77);
    write_granule(a.addr() + PREFIX * g, g, 78);
    a.offload_to(&w.host, s, Duration::from_secs(5)).unwrap();
    let charged = w.device.pool().used();
    faults().arm(Slot::Commit, 1);
    assert!(a.restore(s).is_err());
    faults().disarm();
    assert_eq!(faults().fired(Slot::Commit), 1);
    assert_eq!(w.device.pool().used(), charged);
    assert!(matches!(a.residence(), Residence::Host { .. }));
    let probe = w.probe.allocate(g, 64).unwrap();
    assert!(!backed(w, probe.addr(), s, a.addr() + g, g), "the first range was left committed");
    assert!(a.restore(s).unwrap().wait(Duration::from_secs(5)).unwrap());
    assert!(granule_holds(a.addr() + g, g, 77) && granule_holds(a.addr() + PREFIX * g, g, 78));
}

/// A double fault: the copies are enqueued and the plugin refuses both a
/// fence and a host function behind them. Nothing a copy may still touch
/// is freed on a guess: the host copy and the region both stay (charged,
/// pending in the queue), and the quarantine list says why.
#[test]
fn memory_an_unfenced_copy_may_still_touch_is_never_freed() {
    let _serial = one_test_at_a_time();
    let w = &world();
    let g = w.granule;
    let stream = CpuStream::new(w.device.mechanism());
    let mut r = w.device.reserve_virtual(8 * g).unwrap();
    r.grow_to(3 * g, |_| Ok::<(), ()>(())).unwrap();
    faults().arm(Slot::FenceRecord, 0);
    faults().arm(Slot::EnqueueHostFn, 0);
    assert!(r.offload_to(&w.host, stream.stream(), Duration::from_secs(5)).is_err());
    faults().disarm();
    assert_eq!(r.residence(), Residence::Device);
    drop(r);
    w.manager.poll();
    assert_eq!(w.device.pool().used(), 3 * g, "the region a copy reads is not released");
    assert_eq!(w.host.pool().used(), 3 * g, "the host copy a copy writes is not freed");
    assert_eq!(w.manager.queue().stats().pending, 2);
    assert!(w.device.quarantined().iter().any(|q| q.contains("no fence could be placed")));
}

/// Where a loss lands in [`lose_at_any_step`]: declared before the step,
/// reported from another thread right after the step's next copy was
/// accepted (a copy in flight), or answered by that copy's slot.
#[derive(Clone, Copy, Debug)]
enum Loss {
    Before,
    MidCopy,
    CopyAnswers,
}

/// The steps of the loss model: the transactions, a grow queued on the
/// stream (queued binding), and a shrink queued behind a fence the plugin
/// holds back.
#[derive(Clone, Debug)]
enum LossOp {
    Step(Op),
    GrowOn(u64),
    ShrinkBehindHeld(u64),
}

fn loss_op() -> impl Strategy<Value = LossOp> {
    prop_oneof![
        2 => (1u64..6).prop_map(|n| LossOp::Step(Op::Grow(n))),
        1 => (0u64..4).prop_map(|n| LossOp::Step(Op::Shrink(n))),
        3 => Just(LossOp::Step(Op::Offload)),
        3 => Just(LossOp::Step(Op::Restore)),
        2 => (0u64..PREFIX).prop_map(|i| LossOp::Step(Op::Privatise(i))),
        2 => (1u64..6).prop_map(LossOp::GrowOn),
        2 => (0u64..4).prop_map(LossOp::ShrinkBehindHeld),
    ]
}

/// A loss at step `at` (its kind `how`) of random offloads, restores,
/// privatises, queued grows and queued shrinks, the host copies in a pool
/// of another, healthy plugin. Whatever the step, after the termination
/// every pool is at exactly zero (the healthy one included: no host copy
/// is kept charged by a device that is gone), nothing stays queued in
/// either manager, nothing is quarantined, and the healthy plugin unloads.
fn lose_at_any_step(steps: Vec<LossOp>, at: usize, how: Loss) -> Result<(), TestCaseError> {
    let _serial = one_test_at_a_time();
    faults().disarm();
    faults().release_fences();
    let w = &world();
    let g = w.granule;
    let healthy = Rig::cpu("offload-loss-host", 1 << 30);
    let ctx = w.context.clone();
    let stream = CpuStream::new(w.device.mechanism());
    let s = stream.stream();
    let wait = Duration::from_secs(20);
    let prefix = w.device.create_shared(PREFIX * g, |_| {}).unwrap();
    let (mut a, mut b) =
        (w.device.reserve_virtual(RESERVE * g).unwrap(), w.device.reserve_virtual(RESERVE * g).unwrap());
    a.map_prefix(&prefix).unwrap();
    b.map_prefix(&prefix).unwrap();
    let mut fences: Vec<SharedFence> = Vec::new();
    for (k, op) in steps.iter().enumerate() {
        if k == at {
            match how {
                Loss::Before => {
                    ctx.declare_lost("the model lost it before a step");
                }
                Loss::MidCopy => {
                    let c = ctx.clone();
                    faults().after_next_copy(move || {
                        c.declare_lost("the model lost it while a copy was in flight");
                    });
                }
                Loss::CopyAnswers => faults().lose_at_copy.store(true, SeqCst),
            }
        }
        let committed = a.committed() / g;
        let lost_before = ctx.state() != memplug_host::LifeState::Active;
        // Errors are the answers being tested for: after the loss every
        // step that makes memory must refuse (DEVICE_LOST), never hang.
        let made = match op {
            LossOp::Step(Op::Grow(n)) => {
                let want = (PREFIX + committed + n).min(RESERVE);
                a.grow_to(want * g, |_| Ok::<(), ()>(())).is_ok() && want > PREFIX + committed
            }
            LossOp::Step(Op::Shrink(n)) => {
                let _ = a.shrink_to((PREFIX + n) * g, Vec::new());
                false
            }
            LossOp::Step(Op::Offload) => {
                a.offload_to(&healthy.binding, s, wait).is_ok_and(|r| r.released > 0)
            }
            LossOp::Step(Op::Restore) => {
                // Restoring nothing private makes nothing, lost or not.
                let private = matches!(a.residence(), Residence::Host { bytes, .. } if bytes > 0);
                match a.restore(s) {
                    Ok(f) => {
                        fences.push(f);
                        private
                    }
                    Err(_) => false,
                }
            }
            LossOp::Step(Op::Privatise(i)) => match a.privatise(i * g, g, s, wait) {
                Ok(f) => {
                    fences.push(f);
                    true
                }
                Err(_) => false,
            },
            LossOp::Step(_) => false,
            LossOp::GrowOn(n) => {
                let want = (PREFIX + committed + n).min(RESERVE);
                match a.grow_on(want * g, s) {
                    Ok(f) => {
                        fences.push(f);
                        want > PREFIX + committed
                    }
                    Err(_) => false,
                }
            }
            LossOp::ShrinkBehindHeld(n) => {
                faults().hold_fences.store(true, SeqCst);
                let held = memplug_host::PluginFence::record(w.device.mechanism(), s);
                faults().hold_fences.store(false, SeqCst);
                if let Ok(f) = held {
                    let _ = a.shrink_to((PREFIX + n) * g, vec![f]);
                }
                false
            }
        };
        prop_assert!(!(lost_before && made), "step {} made memory on a lost context: {:?}", k, op);
    }
    faults().disarm();
    if ctx.state() == memplug_host::LifeState::Active {
        ctx.declare_lost("the model's end");
    }
    drop((a, b, prefix, fences));
    w.manager.poll();
    healthy.manager.poll();
    faults().release_fences();
    prop_assert_eq!(ctx.state(), memplug_host::LifeState::Terminated);
    prop_assert_eq!((w.device.pool().used(), w.host.pool().used()), (0, 0));
    prop_assert_eq!(healthy.pool.used(), 0, "a host copy stays charged in the healthy pool");
    let (q, hq) = (w.manager.queue().stats(), healthy.manager.queue().stats());
    prop_assert_eq!((q.pending, hq.pending), (0, 0), "queued: {:?} / {:?}", q, hq);
    prop_assert!(w.device.quarantined().is_empty(), "{:?}", w.device.quarantined());
    prop_assert!(healthy.binding.quarantined().is_empty(), "{:?}", healthy.binding.quarantined());
    drop(stream);
    let (_, unloaded) = healthy.try_unload();
    prop_assert!(unloaded.is_ok(), "the healthy plugin unloads: {:?}", unloaded);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn a_loss_at_any_step_of_offload_restore_privatise_and_queued_binding_settles_everything(
        steps in proptest::collection::vec(loss_op(), 1..10),
        at in 0usize..10,
        how in prop_oneof![Just(Loss::Before), Just(Loss::MidCopy), Just(Loss::CopyAnswers)],
    ) {
        let at = at % steps.len();
        lose_at_any_step(steps, at, how)?;
    }
}
