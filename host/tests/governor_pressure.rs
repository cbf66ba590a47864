//! Pressure tickets, holders, waiting, and the invariants they serve
//! (ARCHITECTURE.md §2: 2, 5, 7).

use memplug_host::governor::{
    AllocationClass, Governor, GovernorError, HolderId, Lease, Pool, PressureTicket, Priority,
};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

const KV: AllocationClass = AllocationClass::Kv;
const ACT: AllocationClass = AllocationClass::Activations;

fn pool(capacity: u64) -> Arc<Pool> {
    let g = Governor::new();
    let id = g.create_pool("test", capacity).unwrap();
    g.pool(id).unwrap()
}

fn lease(pool: &Pool, bytes: u64, class: AllocationClass, holder: Option<HolderId>) -> Lease {
    pool.try_reserve(bytes, class, holder).unwrap().commit(bytes).unwrap()
}

/// Runs `f` on another thread and fails the test if it does not finish in
/// time (a deadlock shows up as this failure instead of a hung run).
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => h.join().unwrap(), // propagates the panic
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {secs} s: deadlock?"),
    }
}

/// Leases a holder keeps, and a callback that releases them, oldest first,
/// until the wanted bytes are covered.
#[derive(Clone, Default)]
struct Stash(Arc<Mutex<Vec<Lease>>>);

impl Stash {
    fn callback(&self, pool: &Arc<Pool>) -> impl Fn(&PressureTicket) -> u64 + Send + Sync + 'static {
        let stash = self.clone();
        let pool: Weak<Pool> = Arc::downgrade(pool);
        move |t: &PressureTicket| {
            let Some(pool) = pool.upgrade() else { return 0 };
            let mut freed = 0;
            let mut v = stash.0.lock().unwrap();
            while freed < t.bytes_wanted && !v.is_empty() {
                let l = v.remove(0);
                freed += l.bytes();
                pool.release(l).unwrap();
            }
            freed
        }
    }

    fn push(&self, l: Lease) {
        self.0.lock().unwrap().push(l);
    }

    fn release_all(&self, pool: &Pool) {
        for l in self.0.lock().unwrap().drain(..) {
            pool.release(l).unwrap();
        }
    }
}

#[test]
fn tickets_reach_holders_lowest_priority_first_then_registration_order() {
    let p = pool(1000);
    let order = Arc::new(Mutex::new(Vec::new()));
    let rec = |tag: &'static str| {
        let order = order.clone();
        move |t: &PressureTicket| {
            order.lock().unwrap().push((tag, t.bytes_wanted, t.priority));
            0
        }
    };
    let h5 = p.register_holder("p5", Priority(5), rec("p5"));
    let h1a = p.register_holder("p1a", Priority(1), rec("p1a"));
    let h3 = p.register_holder("p3", Priority(3), rec("p3"));
    let h1b = p.register_holder("p1b", Priority(1), rec("p1b"));
    let full = lease(&p, 1000, KV, None);

    // Anonymous requester: counts as the highest priority, may ask everyone.
    let err = p.reserve(100, ACT, None, None).unwrap_err();
    assert!(err.out_of_budget().is_some());
    let got: Vec<&str> = order.lock().unwrap().iter().map(|(t, _, _)| *t).collect();
    assert_eq!(got, ["p1a", "p1b", "p3", "p5"]);
    assert!(order.lock().unwrap().iter().all(|&(_, w, pr)| w == 100 && pr == Priority::HIGHEST));

    drop((h5, h1a, h3, h1b));
    p.release(full).unwrap();
}

#[test]
fn holders_above_the_requester_priority_and_the_requester_itself_are_never_asked() {
    let p = pool(1000);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let rec = |tag: &'static str| {
        let asked = asked.clone();
        move |t: &PressureTicket| {
            asked.lock().unwrap().push((tag, t.requester));
            0
        }
    };
    let low = p.register_holder("low", Priority(1), rec("low"));
    let equal = p.register_holder("equal", Priority(4), rec("equal"));
    let requester = p.register_holder("requester", Priority(4), rec("requester"));
    let high = p.register_holder("high", Priority(9), rec("high"));
    let full = lease(&p, 1000, KV, Some(low.id()));

    let err = p.reserve(10, KV, Some(requester.id()), None).unwrap_err();
    assert!(err.out_of_budget().is_some());
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked, [("low", Some(requester.id())), ("equal", Some(requester.id()))]);
    p.release(full).unwrap();
    drop((low, equal, requester, high));
}

#[test]
fn invariant_5_holder_may_release_zero_then_request_fails_with_correct_snapshot() {
    let p = pool(4096);
    let h = p.register_holder("stingy", Priority(0), |_t: &PressureTicket| 0);
    let held = lease(&p, 3000, KV, Some(h.id()));
    let _r = p.try_reserve(500, ACT, None).unwrap();

    let err = p.reserve(1000, ACT, None, None).unwrap_err();
    let oob = err.out_of_budget().expect("out of budget");
    assert_eq!(oob.requested, 1000);
    assert_eq!(oob.class, ACT);
    assert_eq!(oob.holder, None);
    let s = &oob.snapshot;
    assert_eq!((s.capacity, s.used, s.free), (4096, 3500, 596));
    assert_eq!((s.reserved, s.leased, s.quarantined), (500, 3000, 0));
    assert_eq!(s.class(ACT).reserved, 500);
    assert_eq!(s.class(ACT).failures, 1);
    assert_eq!(s.class(KV).leased, 3000);
    assert_eq!(s.pressure.tickets, 1);
    assert_eq!(s.pressure.bytes_wanted, 1000 - 596);
    assert_eq!(s.pressure.zero_answers, 1);
    // The snapshot in the error is the pool's state after the refusal.
    assert_eq!(**s, p.snapshot());
    assert!(err.to_string().contains("out of budget"), "{err}");

    let hs = h.stats();
    assert_eq!(hs.pressure.tickets, 1);
    assert_eq!(hs.pressure.zero_answers, 1);
    assert_eq!(hs.class(KV).leased, 3000);
    p.release(held).unwrap();
}

#[test]
fn invariant_5_governor_never_frees_a_holder_answer_is_not_a_refund() {
    // The holder claims it released bytes but releases nothing: the governor
    // records the answer and refunds nothing on its word.
    let p = pool(1000);
    let liar = p.register_holder("liar", Priority(0), |t: &PressureTicket| t.bytes_wanted);
    let held = lease(&p, 900, KV, Some(liar.id()));
    let before = p.snapshot();

    let err = p.reserve(500, ACT, None, None).unwrap_err();
    let after = &err.out_of_budget().unwrap().snapshot;
    assert_eq!(after.used, before.used);
    assert_eq!(after.class(KV).leased, 900);
    assert_eq!(after.pressure.bytes_answered, 400);
    assert_eq!(held.bytes(), 900);
    p.release(held).unwrap();
    assert_eq!(p.used(), 0);
}

#[test]
fn holder_that_releases_enough_lets_the_request_succeed_and_later_holders_are_not_asked() {
    let p = pool(1000);
    let stash = Stash::default();
    let first = p.register_holder("cache", Priority(1), stash.callback(&p));
    let later_asked = Arc::new(Mutex::new(0u32));
    let la = later_asked.clone();
    let later = p.register_holder("later", Priority(2), move |_t: &PressureTicket| {
        *la.lock().unwrap() += 1;
        0
    });
    for _ in 0..4 {
        stash.push(lease(&p, 250, KV, Some(first.id())));
    }
    let r = p.reserve(400, ACT, None, None).unwrap();
    assert_eq!(r.bytes(), 400);
    assert_eq!(*later_asked.lock().unwrap(), 0);
    let s = p.snapshot();
    assert_eq!(s.used, 500 + 400);
    assert_eq!(s.pressure.tickets, 1);
    assert_eq!(s.pressure.bytes_answered, 500);
    let hs = first.stats();
    assert_eq!(hs.class(KV).leased, 500);
    assert_eq!(hs.pressure.bytes_answered, 500);
    drop(r);
    stash.release_all(&p);
    drop((first, later));
    assert_eq!(p.used(), 0);
}

#[test]
fn reentrant_callback_reserves_releases_and_snapshots_without_deadlock() {
    within(10, || {
        let p = pool(1000);
        let stash = Stash::default();
        let release_some = stash.callback(&p);
        let weak = Arc::downgrade(&p);
        let h = p.register_holder("reentrant", Priority(0), move |t: &PressureTicket| {
            let pool = weak.upgrade().unwrap();
            // Everything a holder may do from inside its callback:
            let s = pool.snapshot();
            assert!(s.used <= s.capacity);
            let _ = pool.holders();
            if let Ok(r) = pool.try_reserve(1, AllocationClass::Workspace, None) {
                drop(r);
            }
            // A nested reserve on the same pool issues no tickets (no recursion).
            let _ = pool.reserve(10_000, AllocationClass::Workspace, None, None);
            release_some(t)
        });
        for _ in 0..4 {
            stash.push(lease(&p, 250, KV, Some(h.id())));
        }
        let r = p.reserve(300, ACT, None, None).unwrap();
        assert_eq!(p.snapshot().pressure.tickets, 1, "nested reserve must not issue tickets");
        drop(r);
        stash.release_all(&p);
        drop(h);
        assert_eq!(p.used(), 0);
    });
}

#[test]
fn callback_dropping_its_own_registration_does_not_deadlock() {
    within(10, || {
        let p = pool(100);
        let slot: Arc<Mutex<Option<memplug_host::governor::HolderRegistration>>> = Arc::default();
        let s2 = slot.clone();
        let reg = p.register_holder("quitter", Priority(0), move |_t: &PressureTicket| {
            drop(s2.lock().unwrap().take());
            0
        });
        *slot.lock().unwrap() = Some(reg);
        let full = lease(&p, 100, KV, None);
        assert!(p.reserve(1, ACT, None, None).is_err());
        assert!(slot.lock().unwrap().is_none());
        assert_eq!(p.snapshot().holders, 0);
        p.release(full).unwrap();
    });
}

#[test]
fn unregister_waits_for_a_callback_running_on_another_thread() {
    within(10, || {
        let p = pool(100);
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let finished = Arc::new(Mutex::new(false));
        let f2 = finished.clone();
        let reg = p.register_holder("slow", Priority(0), move |_t: &PressureTicket| {
            entered_tx.send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
            *f2.lock().unwrap() = true;
            0
        });
        let full = lease(&p, 100, KV, None);
        let p2 = p.clone();
        let requester = thread::spawn(move || p2.reserve(1, ACT, None, None).is_err());
        entered_rx.recv().unwrap();
        let unregister = thread::spawn(move || drop(reg));
        thread::sleep(Duration::from_millis(50));
        assert!(!unregister.is_finished(), "unregister returned while its callback ran");
        go_tx.send(()).unwrap();
        unregister.join().unwrap();
        assert!(*finished.lock().unwrap());
        assert!(requester.join().unwrap());
        p.release(full).unwrap();
    });
}

#[test]
fn wait_with_deadline_succeeds_when_another_thread_releases_in_time() {
    within(10, || {
        let p = pool(1000);
        let held = lease(&p, 800, KV, None);
        let p2 = p.clone();
        let releaser = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            p2.release(held).unwrap();
        });
        let start = Instant::now();
        let r = p.reserve(500, ACT, None, Some(start + Duration::from_secs(5))).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        releaser.join().unwrap();
        let s = p.snapshot();
        assert_eq!((s.waits, s.wait_timeouts), (1, 0));
        assert_eq!(s.class(ACT).reserved, 500);
        drop(r);
        assert_eq!(p.used(), 0);
    });
}

#[test]
fn wait_with_deadline_fails_after_the_deadline_otherwise() {
    within(10, || {
        let p = pool(1000);
        let held = lease(&p, 800, KV, None);
        let start = Instant::now();
        let deadline = start + Duration::from_millis(100);
        let err = p.reserve(500, ACT, None, Some(deadline)).unwrap_err();
        assert!(Instant::now() >= deadline);
        let s = &err.out_of_budget().unwrap().snapshot;
        assert_eq!((s.waits, s.wait_timeouts), (1, 1));
        assert_eq!(s.class(ACT).failures, 1);
        assert_eq!(s.used, 800);
        p.release(held).unwrap();
        // The waiters bit was cleared: the word is back to plain bytes.
        assert_eq!(p.used(), 0);
        assert_eq!(p.free(), 1000);
    });
}

#[test]
fn a_waiting_request_asks_the_holders_again_when_its_room_was_taken() {
    // The room the first ticket frees is taken by another request before
    // the requester's retry (here from inside the callback, so the race is
    // certain). The holder still caches memory it would give up: the
    // waiting request must ask again instead of sleeping to its deadline.
    within(20, || {
        let p = pool(1000);
        let stash = Stash::default();
        let h = p.register_holder("lru", Priority(0), stash.callback(&p));
        for _ in 0..10 {
            stash.push(lease(&p, 100, KV, Some(h.id())));
        }
        let thief: Arc<Mutex<Vec<Lease>>> = Arc::default();
        let (t, weak) = (thief.clone(), Arc::downgrade(&p));
        let evict = stash.callback(&p);
        let h2 = p.register_holder("lru-racing", Priority(0), move |ticket: &PressureTicket| {
            let freed = evict(ticket);
            let mut stolen = t.lock().unwrap();
            if let (Some(pool), true) = (weak.upgrade(), stolen.is_empty()) {
                stolen.push(lease(&pool, freed, ACT, None));
            }
            freed
        });
        drop(h); // only the racing holder is asked
        let deadline = Instant::now() + Duration::from_secs(10);
        let r = p.reserve(100, ACT, None, Some(deadline)).expect("the holder still caches 800 B");
        let s = p.snapshot();
        assert_eq!((s.waits, s.wait_timeouts), (1, 0));
        let tickets = p.holder_stats(h2.id()).unwrap().pressure.tickets;
        assert!(tickets >= 2, "asked {tickets} times");
        assert_eq!(p.used(), 1000);
        drop(r);
        for l in thief.lock().unwrap().drain(..) {
            p.release(l).unwrap();
        }
        stash.release_all(&p);
        assert_eq!(p.used(), 0);
    });
}

#[test]
fn deferred_refund_after_the_answer_wakes_the_waiter() {
    // A GPU-like holder: it answers with bytes it enqueued for a deferred
    // free; the refund arrives later, from another thread.
    within(10, || {
        let p = pool(1000);
        let pending: Arc<Mutex<Vec<Lease>>> = Arc::default();
        let (tx, rx) = mpsc::channel::<Lease>();
        let tx = Mutex::new(tx);
        let p2 = pending.clone();
        let h = p.register_holder("deferred", Priority(0), move |_t: &PressureTicket| {
            let mut v = p2.lock().unwrap();
            let mut n = 0;
            for l in v.drain(..) {
                n += l.bytes();
                tx.lock().unwrap().send(l).unwrap();
            }
            n
        });
        pending.lock().unwrap().push(lease(&p, 900, KV, Some(h.id())));
        let p3 = p.clone();
        let reaper = thread::spawn(move || {
            for l in rx {
                // The "fence" completes only once the requester is waiting.
                while p3.snapshot().waits == 0 {
                    thread::sleep(Duration::from_millis(1));
                }
                p3.release(l).unwrap();
            }
        });
        let r = p.reserve(600, ACT, None, Some(Instant::now() + Duration::from_secs(5))).unwrap();
        assert_eq!(p.snapshot().waits, 1);
        drop(r);
        drop(h); // drops the callback and so the sender: the reaper ends
        reaper.join().unwrap();
        assert_eq!(p.used(), 0);
    });
}

#[test]
fn callback_panic_is_contained_and_counts_as_zero() {
    let p = pool(100);
    let h = p.register_holder("panics", Priority(0), |_t: &PressureTicket| -> u64 { panic!("holder bug") });
    let full = lease(&p, 100, KV, None);
    let err = p.reserve(10, ACT, None, None).unwrap_err();
    let s = &err.out_of_budget().unwrap().snapshot;
    assert_eq!((s.pressure.tickets, s.pressure.zero_answers, s.pressure.callback_panics), (1, 1, 1));
    assert_eq!(h.stats().pressure.callback_panics, 1);
    p.release(full).unwrap();
}

#[test]
fn request_larger_than_capacity_issues_no_tickets_and_does_not_wait() {
    let p = pool(100);
    let _h = p.register_holder("h", Priority(0), |_t: &PressureTicket| 0);
    let start = Instant::now();
    let err = p.reserve(101, ACT, None, Some(start + Duration::from_secs(30))).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    let s = &err.out_of_budget().unwrap().snapshot;
    assert_eq!((s.pressure.tickets, s.waits), (0, 0));
}

#[test]
fn invariant_7_quarantined_bytes_stay_charged_and_are_never_refunded() {
    let p = pool(1000);
    let a = lease(&p, 300, KV, None);
    let mut b = lease(&p, 400, ACT, None);
    p.quarantine(a).unwrap();
    p.quarantine_part(&mut b, 100).unwrap();
    let s = p.snapshot();
    assert_eq!((s.used, s.quarantined, s.leased), (700, 400, 300));
    assert_eq!((s.class(KV).quarantined, s.class(KV).leases, s.class(KV).quarantines), (300, 0, 1));
    assert_eq!((s.class(ACT).quarantined, s.class(ACT).leased), (100, 300));
    p.release(b).unwrap();
    let s = p.snapshot();
    assert_eq!((s.used, s.quarantined, s.leased, s.reserved), (400, 400, 0, 0));
    // Quarantined room cannot be reclaimed by pressure either.
    assert!(p.try_reserve(601, ACT, None).is_err());
}

#[test]
fn invariant_2_commit_follows_the_bytes_actually_mapped() {
    let p = pool(1000);
    // Fewer bytes than reserved: the rest returns at once.
    let r = p.try_reserve(500, KV, None).unwrap();
    assert_eq!(p.used(), 500);
    let l = r.commit(300).unwrap();
    assert_eq!(p.used(), 300);
    // More than reserved (granularity rounding): charged if it fits...
    let r = p.try_reserve(100, KV, None).unwrap();
    let l2 = r.commit(200).unwrap();
    assert_eq!((l2.bytes(), p.used()), (200, 500));
    // ...and refused cleanly otherwise, with the reservation handed back.
    let r = p.try_reserve(400, KV, None).unwrap();
    let rejected = r.commit(600).unwrap_err();
    assert!(matches!(rejected.error, GovernorError::OutOfBudget(ref o) if o.requested == 200));
    assert_eq!(p.used(), 900, "the failed commit changed nothing");
    let r = rejected.into_inner();
    assert_eq!(r.bytes(), 400);
    drop(r); // the caller frees what it mapped, then returns the grant
    assert_eq!(p.used(), 500);
    let s = p.snapshot();
    assert_eq!((s.class(KV).leased, s.class(KV).leases, s.class(KV).reserved), (500, 2, 0));
    assert_eq!(s.class(KV).failures, 1);
    p.release(l).unwrap();
    p.release(l2).unwrap();
    assert_eq!(p.used(), 0);
}

#[test]
fn commit_into_grows_a_lease_and_checks_pool_class_and_holder() {
    let p = pool(1000);
    let other = pool(1000);
    let h = p.register_holder("h", Priority(0), |_t: &PressureTicket| 0);
    let mut l = lease(&p, 100, KV, Some(h.id()));
    p.try_reserve(200, KV, Some(h.id())).unwrap().commit_into(&mut l, 150).unwrap();
    assert_eq!((l.bytes(), p.used()), (250, 250));
    let e = p.try_reserve(10, ACT, Some(h.id())).unwrap().commit_into(&mut l, 10).unwrap_err();
    assert!(matches!(e.error, GovernorError::ClassMismatch { .. }));
    drop(e);
    let e = p.try_reserve(10, KV, None).unwrap().commit_into(&mut l, 10).unwrap_err();
    assert!(matches!(e.error, GovernorError::HolderMismatch { .. }));
    drop(e);
    let e = other.try_reserve(10, KV, None).unwrap().commit_into(&mut l, 10).unwrap_err();
    assert!(matches!(e.error, GovernorError::WrongPool { .. }));
    drop(e);
    assert_eq!((l.bytes(), p.used(), other.used()), (250, 250, 0));
    p.release_part(&mut l, 50).unwrap();
    assert_eq!((l.bytes(), p.used()), (200, 200));
    let hs = h.stats();
    assert_eq!((hs.class(KV).leased, hs.class(KV).leases, hs.class(KV).grants), (200, 1, 2));
    p.release(l).unwrap();
    assert_eq!(p.used(), 0);
}

#[test]
fn dropped_lease_is_counted_as_leaked_and_never_refunded() {
    let p = pool(1000);
    let h = p.register_holder("h", Priority(0), |_t: &PressureTicket| 0);
    drop(lease(&p, 300, KV, Some(h.id())));
    drop(lease(&p, 100, ACT, None));
    let s = p.snapshot();
    assert_eq!(s.used, 400, "a dropped lease stays charged");
    assert_eq!((s.class(KV).leaked_leases, s.class(KV).leaked_bytes, s.class(KV).leased), (1, 300, 300));
    assert_eq!((s.class(ACT).leaked_leases, s.class(ACT).leaked_bytes), (1, 100));
    let hs = h.stats();
    assert_eq!((hs.class(KV).leaked_leases, hs.class(KV).leaked_bytes), (1, 300));
    assert_eq!(hs.class(ACT).leaked_leases, 0);
}

#[test]
fn over_release_is_an_error_not_an_underflow() {
    let p = pool(1000);
    let mut l = lease(&p, 100, KV, None);
    let e = p.release_part(&mut l, 101).unwrap_err();
    assert_eq!(e, GovernorError::OverRelease { requested: 101, held: 100 });
    let e = p.quarantine_part(&mut l, 101).unwrap_err();
    assert_eq!(e, GovernorError::OverRelease { requested: 101, held: 100 });
    assert_eq!((l.bytes(), p.used(), p.snapshot().leased), (100, 100, 100));
    p.release(l).unwrap();
    assert_eq!(p.used(), 0);
}

#[test]
fn split_lease_moves_a_part_without_charging_or_refunding() {
    let p = pool(1000);
    let mut l = lease(&p, 400, KV, None);
    let tail = p.split_lease(&mut l, 150).unwrap();
    assert_eq!((l.bytes(), tail.bytes(), tail.class(), p.used()), (250, 150, KV, 400));
    assert_eq!(p.snapshot().class(KV).leases, 2);
    assert!(matches!(p.split_lease(&mut l, 251), Err(GovernorError::OverRelease { .. })));
    p.release(tail).unwrap(); // e.g. once the tail's decommit fences completed
    assert_eq!((p.used(), p.snapshot().class(KV).leases), (250, 1));
    p.release(l).unwrap();
    assert_eq!(p.used(), 0);
}

#[test]
fn a_lease_given_to_another_pool_is_handed_back_untouched() {
    let a = pool(1000);
    let b = pool(1000);
    let l = lease(&a, 100, KV, None);
    let rejected = b.release(l).unwrap_err();
    assert!(matches!(rejected.error, GovernorError::WrongPool { .. }));
    let l = rejected.into_inner();
    let rejected = b.quarantine(l).unwrap_err();
    let mut l = rejected.into_inner();
    assert!(matches!(b.release_part(&mut l, 1), Err(GovernorError::WrongPool { .. })));
    assert_eq!((a.used(), b.used()), (100, 0));
    a.release(l).unwrap();
    assert_eq!(a.used(), 0);
    assert_eq!(a.snapshot().class(KV).leaked_leases, 0);
}

#[test]
fn unknown_and_unregistered_holders_are_refused() {
    let a = pool(1000);
    let b = pool(1000);
    let ha = a.register_holder("a", Priority(0), |_t: &PressureTicket| 0);
    let id = ha.id();
    // A holder of another pool.
    assert!(matches!(b.try_reserve(1, KV, Some(id)), Err(GovernorError::UnknownHolder { .. })));
    assert!(matches!(b.reserve(1, KV, Some(id), None), Err(GovernorError::UnknownHolder { .. })));
    // Its own pool, while registered: fine; the lease outlives the registration.
    let l = lease(&a, 10, KV, Some(id));
    drop(ha);
    assert!(matches!(a.try_reserve(1, KV, Some(id)), Err(GovernorError::UnknownHolder { .. })));
    let hs = a.holder_stats(id).unwrap();
    assert!(!hs.registered);
    assert_eq!(hs.class(KV).leased, 10);
    a.release(l).unwrap();
    assert_eq!(a.holder_stats(id).unwrap().class(KV).leased, 0);
    assert!(b.holder_stats(id).is_none());
}
