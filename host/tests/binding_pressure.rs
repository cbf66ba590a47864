//! Budgets and pressure through bindings on the CPU plugin: an allocation
//! beyond a pool's hard capacity succeeds when a holder gives up bytes for
//! it, and fails with an `OutOfBudget` carrying the pool's snapshot when no
//! holder can; the governor never frees a holder's bytes itself — a holder
//! that answers zero keeps every allocation (invariant 5).

mod common;

use common::*;
use memplug_host::governor::{AllocationClass, GovernorError, PressureTicket, Priority};
use memplug_host::{BindingError, BindingSpec, ObjectKind, OwnedAllocation, Requirements};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Allocations a holder keeps; evicted (dropped, so freed through the
/// normal path) oldest first when a ticket arrives.
#[derive(Clone, Default)]
struct Stash(Arc<Mutex<Vec<OwnedAllocation>>>);

impl Stash {
    fn push(&self, a: OwnedAllocation) {
        self.0.lock().unwrap().push(a);
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn evict(&self, t: &PressureTicket) -> u64 {
        let mut victims = Vec::new();
        let mut freed = 0;
        {
            let mut v = self.0.lock().unwrap();
            while freed < t.bytes_wanted && !v.is_empty() {
                let a = v.remove(0);
                freed += a.charged();
                victims.push(a);
            }
        }
        // Dropped outside the stash's lock: each frees through its binding.
        drop(victims);
        freed
    }
}

fn fill(a: &OwnedAllocation, byte: u8) {
    // SAFETY: CPU plugin memory, live and ours alone.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, byte, a.size() as usize) }
}

fn holds(a: &OwnedAllocation, byte: u8) -> bool {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(a.addr() as *const u8, a.size() as usize) }.iter().all(|b| *b == byte)
}

#[test]
fn invariant_5_pressure_makes_room_through_the_holder_that_evicts_never_the_one_that_answers_zero() {
    within(30, || {
        let rig = Rig::new(isolated_cpu_plugin("pressure"), Requirements::ALLOCATOR_ONLY, MIB);
        let m = rig.mechanism().clone();
        let weights = Stash::default();
        let w = weights.clone();
        let w_reg = rig.pool.register_holder("weights", Priority(1), move |t| w.evict(t));
        let kv_tickets: Arc<Mutex<Vec<PressureTicket>>> = Arc::default();
        let k = kv_tickets.clone();
        let kv_reg = rig.pool.register_holder("kv", Priority(0), move |t| {
            k.lock().unwrap().push(t.clone());
            0
        });
        let bind = |class, holder| {
            let mut spec = BindingSpec::new(class);
            if let Some(h) = holder {
                spec = spec.holder(h);
            }
            rig.manager.bind(&rig.context, &rig.pool, spec).unwrap()
        };
        let wb = bind(AllocationClass::Weights, Some(w_reg.id()));
        let kvb = bind(AllocationClass::Kv, Some(kv_reg.id()));
        let act = bind(AllocationClass::Activations, None);

        for _ in 0..4 {
            let a = wb.allocate(128 * KIB, 64).unwrap();
            weights.push(a);
        }
        let kv: Vec<OwnedAllocation> = (0..4).map(|_| kvb.allocate(64 * KIB, 64).unwrap()).collect();
        for (i, a) in kv.iter().enumerate() {
            fill(a, i as u8 + 1);
        }
        assert_eq!(rig.pool.used(), 768 * KIB);

        // 512 KiB with 256 KiB free: kv (lowest priority) is asked first and
        // answers zero; weights evicts two of its allocations.
        let a1 = act.allocate(512 * KIB, 64).unwrap();
        assert_eq!(weights.len(), 2);
        assert_eq!(rig.pool.used(), MIB);
        {
            let t = kv_tickets.lock().unwrap();
            assert_eq!(t.len(), 1);
            assert_eq!(t[0].bytes_wanted, 256 * KIB);
            assert_eq!(t[0].class, AllocationClass::Activations);
            assert_eq!((t[0].requester, t[0].priority), (None, Priority::HIGHEST));
        }
        let ws = w_reg.stats();
        assert_eq!((ws.pressure.tickets, ws.pressure.bytes_answered), (1, 256 * KIB));
        assert_eq!(ws.class(AllocationClass::Weights).leased, 256 * KIB);

        // Another 256 KiB: weights gives up the rest.
        let a2 = act.allocate(256 * KIB, 64).unwrap();
        assert_eq!(weights.len(), 0);

        // Nobody can release now: a refusal that carries the pool's figures.
        let before = Ledger::of(&rig.pool);
        match act.allocate(64 * KIB, 64) {
            Err(BindingError::Budget(GovernorError::OutOfBudget(o))) => {
                assert_eq!((o.requested, o.class, o.holder), (64 * KIB, AllocationClass::Activations, None));
                let s = &o.snapshot;
                assert_eq!((s.capacity, s.used, s.free), (MIB, MIB, 0));
                assert_eq!(s.class(AllocationClass::Kv).leased, 256 * KIB);
                assert_eq!(s.class(AllocationClass::Activations).leased, 768 * KIB);
                assert_eq!(s.class(AllocationClass::Weights).leased, 0);
                assert!(o.to_string().contains("out of budget"), "{o}");
            }
            other => panic!("expected OutOfBudget, got {other:?}"),
        }
        assert_eq!(Ledger::of(&rig.pool), before, "a refusal charges nothing");

        // Invariant 5: kv answered zero to every ticket and kept everything.
        let kvs = kv_reg.stats();
        assert_eq!((kvs.pressure.tickets, kvs.pressure.zero_answers), (3, 3));
        assert_eq!(kvs.class(AllocationClass::Kv).leased, 256 * KIB);
        assert_eq!(kvs.class(AllocationClass::Kv).leases, 4);
        for (i, a) in kv.iter().enumerate() {
            assert_eq!(a.charged(), 64 * KIB);
            assert!(holds(a, i as u8 + 1), "kv allocation {i} was touched");
        }
        // Only the evicted allocations were freed: 4 kv + 2 activations live.
        assert_eq!(m.live(ObjectKind::Allocation), 6);

        drop((a1, a2, kv));
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
        assert_eq!(m.live(ObjectKind::Allocation), 0);
        drop((wb, kvb, act, w_reg, kv_reg, m));
        rig.unload();
    });
}

#[test]
fn invariant_5_a_requester_only_asks_holders_of_its_priority_or_lower() {
    within(30, || {
        let rig = Rig::new(isolated_cpu_plugin("pressure-prio"), Requirements::ALLOCATOR_ONLY, MIB);
        let weights = Stash::default();
        let w = weights.clone();
        let w_reg = rig.pool.register_holder("weights", Priority(5), move |t| w.evict(t));
        let kv_reg = rig.pool.register_holder("kv", Priority(1), |_| 0);
        let wb = rig
            .manager
            .bind(&rig.context, &rig.pool, BindingSpec::new(AllocationClass::Weights).holder(w_reg.id()))
            .unwrap();
        let kvb = rig
            .manager
            .bind(&rig.context, &rig.pool, BindingSpec::new(AllocationClass::Kv).holder(kv_reg.id()))
            .unwrap();
        weights.push(wb.allocate(768 * KIB, 64).unwrap());

        // kv (priority 1) may not take the bytes of weights (priority 5).
        match kvb.allocate(512 * KIB, 64) {
            Err(BindingError::Budget(GovernorError::OutOfBudget(o))) => {
                assert_eq!(o.holder, Some(kv_reg.id()));
                assert_eq!(o.snapshot.used, 768 * KIB);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(w_reg.stats().pressure.tickets, 0);
        assert_eq!(weights.len(), 1);
        // kv is never asked to make room for itself.
        assert_eq!(kv_reg.stats().pressure.tickets, 0);

        // Nor is a requester ever sent its own ticket: weights' next request
        // asks kv (ranked below it), which answers zero, and fails; the
        // governor does not pick weights' older bytes as a victim for it.
        assert!(wb.allocate(512 * KIB, 64).is_err());
        assert_eq!(kv_reg.stats().pressure.tickets, 1);
        assert_eq!(w_reg.stats().pressure.tickets, 0);

        weights.0.lock().unwrap().clear();
        assert!(Ledger::of(&rig.pool).is_zero());
        drop((wb, kvb, w_reg, kv_reg));
        rig.unload();
    });
}

#[test]
fn invariant_4_and_5_a_request_with_a_deadline_waits_for_evicted_bytes_freed_after_their_fences() {
    within(30, || {
        let rig = Rig::new(isolated_cpu_plugin("pressure-wait"), Requirements::ALLOCATOR_ONLY, MIB);
        rig.manager.start_reaper(Duration::from_millis(1));
        let m = rig.mechanism().clone();
        // The kernel that last used the weights is still running: evicting
        // them only enqueues their frees.
        let kernel = Gate::new("kernel using the weights");
        let stash: Arc<Mutex<Vec<OwnedAllocation>>> = Arc::default();
        let (s, f) = (stash.clone(), kernel.fence.clone());
        let answered = Arc::new(AtomicU64::new(0));
        let ans = answered.clone();
        let w_reg = rig.pool.register_holder("weights", Priority(0), move |_| {
            let victims: Vec<OwnedAllocation> = std::mem::take(&mut *s.lock().unwrap());
            let bytes: u64 = victims.iter().map(|a| a.charged()).sum();
            for a in victims {
                a.release_after(vec![f.clone()]);
            }
            ans.fetch_add(bytes, Ordering::SeqCst);
            bytes
        });
        let wb = rig
            .manager
            .bind(&rig.context, &rig.pool, BindingSpec::new(AllocationClass::Weights).holder(w_reg.id()))
            .unwrap();
        for _ in 0..2 {
            let a = wb.allocate(512 * KIB, 64).unwrap();
            stash.lock().unwrap().push(a);
        }
        let act = rig
            .manager
            .bind(
                &rig.context,
                &rig.pool,
                BindingSpec::new(AllocationClass::Activations).wait(Duration::from_secs(10)),
            )
            .unwrap();

        // Opens the gate only once the request is waiting for room.
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let (k, pool, flag) = (kernel.clone(), rig.pool.clone(), opened.clone());
            std::thread::spawn(move || {
                assert!(eventually(Duration::from_secs(10), || pool.snapshot().waits == 1));
                std::thread::sleep(Duration::from_millis(20));
                flag.store(true, Ordering::SeqCst);
                k.open();
            })
        };
        let a = act.allocate(256 * KIB, 64).unwrap();
        assert!(opened.load(Ordering::SeqCst), "granted before the evicted bytes were freed");
        opener.join().unwrap();
        assert_eq!(answered.load(Ordering::SeqCst), MIB);
        let s = rig.pool.snapshot();
        assert_eq!((s.waits, s.wait_timeouts), (1, 0));
        assert!(eventually(Duration::from_secs(5), || rig.manager.queue().pending() == 0));
        assert_eq!(m.live(ObjectKind::Allocation), 1);
        assert_eq!(rig.pool.used(), 256 * KIB);
        drop((a, act, wb, w_reg, m));
        assert!(Ledger::of(&rig.pool).is_zero());
        rig.unload();
    });
}
