//! Nested budgets: pools with parents (a process limit over device pools,
//! tenant pools under a device pool). Charges at every level, refusals
//! that name the short level and roll back, pressure under the short pool,
//! capacity changes at run time, per-level statistics.

use memplug_host::governor::{
    AllocationClass, Governor, GovernorError, HolderId, Lease, Pool, PoolId, PressureTicket, Priority,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

const KV: AllocationClass = AllocationClass::Kv;

/// process (1000) > gpu0 (800) > {tenant_a (500), tenant_b (600)}.
struct Tree {
    g: Arc<Governor>,
    process: Arc<Pool>,
    gpu: Arc<Pool>,
    a: Arc<Pool>,
    b: Arc<Pool>,
}

fn tree() -> Tree {
    let g = Governor::new();
    let process = g.pool(g.create_pool("process", 1000).unwrap()).unwrap();
    let gpu = g.pool(g.create_child_pool("gpu0", &process, 800).unwrap()).unwrap();
    let a = g.pool(g.create_child_pool("tenant-a", gpu.id(), 500).unwrap()).unwrap();
    let b = g.pool(g.create_child_pool("tenant-b", &*gpu, 600).unwrap()).unwrap();
    Tree { g, process, gpu, a, b }
}

fn lease(pool: &Pool, bytes: u64, holder: Option<HolderId>) -> Lease {
    pool.try_reserve(bytes, KV, holder).unwrap().commit(bytes).unwrap()
}

fn used(pools: &[&Arc<Pool>]) -> Vec<u64> {
    pools.iter().map(|p| p.used()).collect()
}

/// Runs `f` on another thread and fails if it does not finish in time.
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {secs} s: deadlock?"),
    }
}

#[test]
fn a_charge_is_charged_at_every_level_and_refunded_at_every_level() {
    let t = tree();
    let all = [&t.a, &t.b, &t.gpu, &t.process];
    let la = lease(&t.a, 300, None);
    let lb = lease(&t.b, 200, None);
    assert_eq!(used(&all), [300, 200, 500, 500]);
    assert_eq!(t.gpu.free(), 300);
    assert_eq!(t.process.free(), 500);
    let direct = lease(&t.gpu, 100, None); // a parent charges for itself too
    assert_eq!(used(&all), [300, 200, 600, 600]);
    t.a.release(la).unwrap();
    t.b.release(lb).unwrap();
    t.gpu.release(direct).unwrap();
    assert_eq!(used(&all), [0, 0, 0, 0]);
    assert_eq!((t.a.peak(), t.gpu.peak(), t.process.peak()), (300, 600, 600));
    assert_eq!(t.a.lineage(), [t.a.id(), t.gpu.id(), t.process.id()]);
    assert_eq!((t.a.depth(), t.gpu.depth(), t.process.depth()), (2, 1, 0));
    assert_eq!(t.a.parent().unwrap().id(), t.gpu.id());
    let kids: Vec<_> = t.gpu.children().iter().map(|p| p.id()).collect();
    assert_eq!(kids, [t.a.id(), t.b.id()]);
    drop(t.g);
}

#[test]
fn a_refusal_names_the_short_level_and_rolls_back_the_levels_charged() {
    let t = tree();
    let all = [&t.a, &t.b, &t.gpu, &t.process];

    // The tenant itself is short.
    let err = t.a.try_reserve(501, KV, None).unwrap_err();
    let o = err.out_of_budget().unwrap();
    assert_eq!((o.short_pool(), o.short_level(), o.requested_pool()), (t.a.id(), 0, t.a.id()));
    let names: Vec<&str> = o.path.pools.iter().map(|(_, n)| &**n).collect();
    assert_eq!(names, ["tenant-a", "gpu0", "process"]);
    assert_eq!(o.snapshot.name.as_ref(), "tenant-a");
    assert!(err.to_string().contains("short in 'tenant-a'"), "{err}");
    assert_eq!(used(&all), [0, 0, 0, 0]);

    // The device pool is short: the tenant's charge is rolled back.
    let lb = lease(&t.b, 600, None);
    let err = t.a.try_reserve(201, KV, None).unwrap_err();
    let o = err.out_of_budget().unwrap();
    assert_eq!((o.short_pool(), o.short_level()), (t.gpu.id(), 1));
    assert_eq!((o.snapshot.used, o.snapshot.capacity), (600, 800));
    assert!(err.to_string().contains("short in 'gpu0'"), "{err}");
    assert_eq!(used(&all), [0, 600, 600, 600]);
    assert_eq!(t.a.snapshot().totals().failures, 1 + 1);

    // The root is short (over-subscribed children: 800 + another 500).
    let other = t.g.pool(t.g.create_child_pool("gpu1", &t.process, 500).unwrap()).unwrap();
    let lo = lease(&other, 400, None);
    let err = t.a.try_reserve(1, KV, None).unwrap_err();
    assert_eq!(err.out_of_budget().unwrap().short_level(), 2);
    assert_eq!(used(&all), [0, 600, 600, 1000]);
    t.b.release(lb).unwrap();
    other.release(lo).unwrap();
    assert_eq!(used(&all), [0, 0, 0, 0]);
}

#[test]
fn commits_of_more_or_less_partial_refunds_and_quarantine_are_exact_at_every_level() {
    let t = tree();
    let all = [&t.a, &t.gpu, &t.process];
    // Less than granted: the rest is refunded at every level.
    let mut l = t.a.try_reserve(100, KV, None).unwrap().commit(60).unwrap();
    assert_eq!(used(&all), [60, 60, 60]);
    // More than granted: charged at every level.
    let l2 = t.a.try_reserve(100, KV, None).unwrap().commit(150).unwrap();
    assert_eq!(used(&all), [210, 210, 210]);
    // More than the parent allows: refused, nothing charged, grant intact.
    let lb = lease(&t.b, 500, None);
    let rej = t.a.try_reserve(50, KV, None).unwrap().commit(120).unwrap_err();
    let o = rej.error.out_of_budget().unwrap();
    assert_eq!((o.short_pool(), o.requested), (t.gpu.id(), 70));
    assert_eq!(used(&all), [260, 760, 760]);
    drop(rej.into_inner());
    assert_eq!(used(&all), [210, 710, 710]);
    // Growing a lease charges every level; shrinking refunds every level.
    t.a.try_reserve(40, KV, None).unwrap().commit_into(&mut l, 40).unwrap();
    assert_eq!(used(&all), [250, 750, 750]);
    t.a.release_part(&mut l, 30).unwrap();
    assert_eq!(used(&all), [220, 720, 720]);
    // Quarantine keeps the bytes charged at every level, for good.
    t.a.quarantine_part(&mut l, 20).unwrap();
    t.a.quarantine(l2).unwrap();
    t.a.release(l).unwrap();
    t.b.release(lb).unwrap();
    assert_eq!(used(&all), [170, 170, 170]);
    let s = t.a.snapshot();
    assert_eq!((s.quarantined, s.leased, s.reserved), (170, 0, 0));
    let g = t.gpu.snapshot();
    assert_eq!((g.children_used, g.own_used(), g.quarantined), (170, 0, 0));
}

#[test]
fn snapshots_show_the_parent_and_the_children_share() {
    let t = tree();
    let la = lease(&t.a, 100, None);
    let lb = lease(&t.b, 50, None);
    let own = lease(&t.gpu, 25, None);
    let g = t.gpu.snapshot();
    assert_eq!(g.parent, Some(t.process.id()));
    assert_eq!(g.parent_name.as_deref(), Some("process"));
    assert_eq!((g.depth, g.children), (1, 2));
    assert_eq!((g.used, g.children_used, g.own_used(), g.leased), (175, 150, 25, 25));
    assert_eq!(g.free, 800 - 175);
    assert!(g.to_string().contains("150 B of it through 2 child pool(s)"), "{g}");
    let p = t.process.snapshot();
    assert_eq!((p.parent, p.depth, p.children, p.used, p.children_used), (None, 0, 1, 175, 175));
    let a = t.a.snapshot();
    assert_eq!((a.parent_name.as_deref(), a.depth, a.children, a.children_used), (Some("gpu0"), 2, 0, 0));
    t.a.release(la).unwrap();
    t.b.release(lb).unwrap();
    t.gpu.release(own).unwrap();
}

#[test]
fn child_pools_are_checked_at_creation() {
    let t = tree();
    let other = Governor::new();
    let foreign = other.pool(other.create_pool("elsewhere", 10).unwrap()).unwrap();
    assert!(matches!(
        t.g.create_child_pool("x", &foreign, 10),
        Err(GovernorError::UnknownPool { pool }) if pool == foreign.id()
    ));
    assert!(matches!(
        t.g.create_child_pool("gpu0", &t.process, 10),
        Err(GovernorError::DuplicatePool { .. })
    ));
    assert!(matches!(
        t.g.create_child_pool("big", &t.process, u64::MAX),
        Err(GovernorError::CapacityTooLarge { .. })
    ));
    // A child may be larger than its parent: the parent binds.
    let wide = t.g.pool(t.g.create_child_pool("wide", &t.a, 10_000).unwrap()).unwrap();
    let err = wide.try_reserve(501, KV, None).unwrap_err();
    assert_eq!(err.out_of_budget().unwrap().short_pool(), t.a.id());
    assert_eq!(wide.depth(), 3);
}

/// Tickets as a recorder saw them: (holder tag, ticket pool, bytes wanted).
type TicketLog = Arc<Mutex<Vec<(&'static str, PoolId, u64)>>>;

/// A holder whose callback records its tickets and releases its leases.
struct Recorder {
    log: TicketLog,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder { log: Arc::default() }
    }

    /// A callback for `pool`'s holder `tag` that releases `stash` (all of it).
    fn holder(
        &self,
        pool: &Arc<Pool>,
        tag: &'static str,
        stash: Arc<Mutex<Vec<Lease>>>,
    ) -> impl Fn(&PressureTicket) -> u64 + Send + Sync + 'static {
        let log = self.log.clone();
        let weak: Weak<Pool> = Arc::downgrade(pool);
        move |t: &PressureTicket| {
            log.lock().unwrap().push((tag, t.pool, t.bytes_wanted));
            let Some(pool) = weak.upgrade() else { return 0 };
            let mut freed = 0;
            for l in stash.lock().unwrap().drain(..) {
                freed += l.bytes();
                pool.release(l).unwrap();
            }
            freed
        }
    }
}

#[test]
fn a_short_tenant_asks_only_holders_under_it() {
    let t = tree();
    let rec = Recorder::new();
    let (sa, sb) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let ha = t.a.register_holder("a", Priority(1), rec.holder(&t.a, "a", sa.clone()));
    let hb = t.b.register_holder("b", Priority(0), rec.holder(&t.b, "b", sb.clone()));
    let sub = t.g.pool(t.g.create_child_pool("a-model", &t.a, 500).unwrap()).unwrap();
    let ss = Arc::new(Mutex::new(Vec::new()));
    let hs = sub.register_holder("a-model", Priority(2), rec.holder(&sub, "a-model", ss.clone()));
    sa.lock().unwrap().push(lease(&t.a, 200, Some(ha.id())));
    ss.lock().unwrap().push(lease(&sub, 250, Some(hs.id())));
    sb.lock().unwrap().push(lease(&t.b, 100, Some(hb.id())));

    // tenant-a holds 450 of 500 (250 of it through its child); asking 250
    // there is short in tenant-a by 200. Only holders under tenant-a are
    // asked (b never is), lowest priority first.
    let r = t.a.reserve(250, KV, None, None).unwrap();
    assert_eq!(*rec.log.lock().unwrap(), [("a", t.a.id(), 200)]);
    drop(r);
    let _ = rec.log.lock().unwrap().drain(..);
    // a has nothing left (answers 0); then the holder of its child pool.
    let r = t.a.reserve(500, KV, None, None).unwrap();
    assert_eq!(*rec.log.lock().unwrap(), [("a", t.a.id(), 250), ("a-model", t.a.id(), 250)]);
    assert_eq!(used(&[&t.a, &sub, &t.b, &t.gpu]), [500, 0, 100, 600]);
    drop(r);
    assert_eq!(t.a.snapshot().pressure.tickets, 3);
    assert_eq!(t.gpu.snapshot().pressure.tickets, 0);
    for l in sb.lock().unwrap().drain(..) {
        t.b.release(l).unwrap();
    }
    drop((ha, hb, hs));
}

#[test]
fn a_short_device_pool_asks_the_holders_of_every_pool_under_it_lowest_priority_first() {
    let t = tree();
    let rec = Recorder::new();
    let stash = || Arc::new(Mutex::new(Vec::new()));
    let (sa, sb, sg) = (stash(), stash(), stash());
    let ha = t.a.register_holder("a", Priority(3), rec.holder(&t.a, "a", sa.clone()));
    let hb = t.b.register_holder("b", Priority(1), rec.holder(&t.b, "b", sb.clone()));
    let hg = t.gpu.register_holder("gpu", Priority(2), rec.holder(&t.gpu, "gpu", sg.clone()));
    let high = t.a.register_holder("high", Priority(9), rec.holder(&t.a, "high", stash()));
    let requester = t.a.register_holder("requester", Priority(5), rec.holder(&t.a, "requester", stash()));
    sa.lock().unwrap().push(lease(&t.a, 100, Some(ha.id())));
    sb.lock().unwrap().push(lease(&t.b, 200, Some(hb.id())));
    sg.lock().unwrap().push(lease(&t.gpu, 450, Some(hg.id())));
    // gpu0: 750 of 800. tenant-a has room (100 of 500); gpu0 does not.
    let err = t.a.try_reserve(150, KV, Some(requester.id())).unwrap_err();
    assert_eq!(err.out_of_budget().unwrap().short_pool(), t.gpu.id());

    // Asking 350 is short in gpu0 by 300. First b (priority 1, tenant-b)
    // frees 200; still short by 100, then gpu (2, the device pool's own
    // holder) frees 450. a (3) is not needed; the holder above the
    // requester's priority and the requester itself are never asked.
    let r = t.a.reserve(350, KV, Some(requester.id()), None).unwrap();
    let log = rec.log.lock().unwrap().clone();
    assert_eq!(log, [("b", t.gpu.id(), 300), ("gpu", t.gpu.id(), 100)]);
    assert_eq!(used(&[&t.a, &t.b, &t.gpu, &t.process]), [450, 0, 450, 450]);
    assert_eq!(t.gpu.snapshot().pressure.tickets, 2);
    assert_eq!(hb.stats().pressure.tickets, 1);
    drop(r);
    for l in sa.lock().unwrap().drain(..) {
        t.a.release(l).unwrap();
    }
    drop((ha, hb, hg, high, requester));
    assert_eq!(t.process.used(), 0);
}

#[test]
fn a_retry_short_elsewhere_moves_on_to_the_holders_under_that_pool() {
    let t = tree();
    let rec = Recorder::new();
    let stash = || Arc::new(Mutex::new(Vec::new()));
    let (sa, sb) = (stash(), stash());
    let ha = t.a.register_holder("a", Priority(1), rec.holder(&t.a, "a", sa.clone()));
    let hb = t.b.register_holder("b", Priority(0), rec.holder(&t.b, "b", sb.clone()));
    sa.lock().unwrap().push(lease(&t.a, 60, Some(ha.id())));
    let keep = lease(&t.a, 400, None);
    sb.lock().unwrap().push(lease(&t.b, 340, Some(hb.id())));
    // tenant-a: 460/500, gpu0: 800/800. Asking 100 in tenant-a is short in
    // tenant-a by 60: a frees its 60; the retry fits there but is short in
    // gpu0 by 40: the holders under gpu0 not asked yet (b) come next.
    let r = t.a.reserve(100, KV, None, None).unwrap();
    assert_eq!(*rec.log.lock().unwrap(), [("a", t.a.id(), 60), ("b", t.gpu.id(), 40)]);
    assert_eq!(used(&[&t.a, &t.b, &t.gpu]), [500, 0, 500]);
    drop(r);
    t.a.release(keep).unwrap();
    drop((ha, hb));
}

#[test]
fn a_callback_reserving_in_a_related_pool_sends_no_tickets_but_an_unrelated_one_may() {
    let t = tree();
    let nested = Arc::new(AtomicU64::new(0));
    let asked_b = Arc::new(AtomicU64::new(0));
    let (ga, gb, gg) = (Arc::downgrade(&t.a), Arc::downgrade(&t.b), Arc::downgrade(&t.gpu));
    let n2 = nested.clone();
    let ha = t.a.register_holder("a", Priority(0), move |t: &PressureTicket| {
        // Inside a ticket for gpu0: gpu0, the pools above it and those
        // below it are related — requests short there send no tickets.
        let (a, b, g) = (ga.upgrade().unwrap(), gb.upgrade().unwrap(), gg.upgrade().unwrap());
        assert_eq!(t.pool, g.id());
        assert!(a.reserve(1, KV, None, None).is_err()); // short in gpu0
        assert!(g.reserve(1, KV, None, None).is_err()); // short in gpu0
        assert!(b.reserve(101, KV, None, None).is_err()); // short in tenant-b, below gpu0
        n2.fetch_add(1, Ordering::SeqCst);
        0
    });
    let ab = asked_b.clone();
    let hb = t.b.register_holder("b", Priority(0), move |_t: &PressureTicket| {
        ab.fetch_add(1, Ordering::SeqCst);
        0
    });
    let lb = lease(&t.b, 500, None);
    let own = lease(&t.gpu, 300, None);
    // Short in gpu0: a is asked (its nested requests send no tickets), then b.
    assert!(t.a.reserve(1, KV, None, None).is_err());
    assert_eq!(nested.load(Ordering::SeqCst), 1);
    assert_eq!(asked_b.load(Ordering::SeqCst), 1);
    assert_eq!(t.gpu.snapshot().pressure.tickets, 2);
    assert_eq!(t.b.snapshot().pressure.tickets, 0);
    t.gpu.release(own).unwrap();
    t.b.release(lb).unwrap();
    drop(ha);

    // Unrelated pools: inside a ticket for tenant-b, a request short in
    // another tree asks that tree's holders.
    let other = t.g.pool(t.g.create_pool("host", 100).unwrap()).unwrap();
    let asked_h = Arc::new(AtomicU64::new(0));
    let ah = asked_h.clone();
    let hh = other.register_holder("h", Priority(0), move |_t: &PressureTicket| {
        ah.fetch_add(1, Ordering::SeqCst);
        0
    });
    let go = Arc::downgrade(&other);
    let hx = t.b.register_holder("x", Priority(0), move |_t: &PressureTicket| {
        assert!(go.upgrade().unwrap().reserve(100, KV, None, None).is_err());
        0
    });
    let fill = lease(&other, 50, None);
    let lb = lease(&t.b, 600, None);
    assert!(t.b.reserve(1, KV, None, None).is_err());
    assert_eq!(asked_h.load(Ordering::SeqCst), 1, "an unrelated pool's holders may be asked");
    t.b.release(lb).unwrap();
    other.release(fill).unwrap();
    drop((hb, hh, hx));
}

#[test]
fn set_capacity_raises_always_lowers_to_what_is_live_and_refuses_below() {
    let t = tree();
    let la = lease(&t.a, 300, None);
    // At or above live: at once.
    t.a.set_capacity(300).unwrap();
    assert_eq!((t.a.capacity(), t.a.free()), (300, 0));
    assert!(t.a.try_reserve(1, KV, None).is_err());
    // Raising always works, beyond the parent's too.
    t.a.set_capacity(5_000).unwrap();
    assert_eq!(t.a.capacity(), 5_000);
    let lb = lease(&t.a, 500, None);
    let err = t.a.try_reserve(1, KV, None).unwrap_err();
    assert_eq!(err.out_of_budget().unwrap().short_pool(), t.gpu.id());
    // Below live with no holder to ask: refused, says how much is live.
    let err = t.gpu.set_capacity(100).unwrap_err();
    assert_eq!(
        err,
        GovernorError::CapacityBelowLive { pool: "gpu0".into(), requested: 100, live: 800, capacity: 800 }
    );
    assert!(err.to_string().contains("800 B are live"), "{err}");
    assert_eq!(t.gpu.capacity(), 800);
    assert!(matches!(t.a.set_capacity(u64::MAX), Err(GovernorError::CapacityTooLarge { .. })));
    t.a.release(la).unwrap();
    t.a.release(lb).unwrap();
    // A capacity of zero refuses everything, and a raise restores it.
    t.process.set_capacity(0).unwrap();
    assert!(t.b.try_reserve(1, KV, None).is_err());
    assert!(t.b.try_reserve(0, KV, None).is_ok());
    t.process.set_capacity(1000).unwrap();
    drop(lease(&t.b, 1, None)); // leaked on purpose: stays charged
    assert_eq!(used(&[&t.b, &t.gpu, &t.process]), [1, 1, 1]);
}

#[test]
fn lowering_below_live_asks_the_holders_under_the_pool_first() {
    let t = tree();
    let rec = Recorder::new();
    let stash = || Arc::new(Mutex::new(Vec::new()));
    let (sa, sb) = (stash(), stash());
    let ha = t.a.register_holder("a", Priority(5), rec.holder(&t.a, "a", sa.clone()));
    let hb = t.b.register_holder("b", Priority(1), rec.holder(&t.b, "b", sb.clone()));
    sa.lock().unwrap().push(lease(&t.a, 300, Some(ha.id())));
    sb.lock().unwrap().push(lease(&t.b, 200, Some(hb.id())));
    let keep = lease(&t.a, 100, None);
    // gpu0 to 350: 600 live, 250 too many: b (priority 1) frees 200, then a.
    t.gpu.set_capacity(350).unwrap();
    assert_eq!(*rec.log.lock().unwrap(), [("b", t.gpu.id(), 250), ("a", t.gpu.id(), 50)]);
    assert_eq!((t.gpu.capacity(), t.gpu.used()), (350, 100));
    // Still too much after asking everyone: refused, capacity kept.
    let err = t.gpu.set_capacity(50).unwrap_err();
    assert!(matches!(err, GovernorError::CapacityBelowLive { live: 100, capacity: 350, .. }), "{err}");
    assert_eq!(t.gpu.snapshot().pressure.tickets, 4);
    t.a.release(keep).unwrap();
    t.gpu.set_capacity(50).unwrap();
    drop((ha, hb));
}

#[test]
fn a_waiter_in_a_tenant_is_woken_by_a_sibling_release_at_the_device_level() {
    let t = tree();
    let lb = lease(&t.b, 600, None);
    let a = t.a.clone();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        tx.send(()).unwrap();
        let r = a.reserve(300, KV, None, Some(Instant::now() + Duration::from_secs(20)));
        r.map(|g| g.bytes()).map_err(|e| e.to_string())
    });
    rx.recv().unwrap();
    while t.a.snapshot().waits == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(20));
    t.b.release(lb).unwrap(); // room appears at gpu0, not in tenant-a
    assert_eq!(waiter.join().unwrap(), Ok(300));
    assert_eq!(used(&[&t.a, &t.gpu]), [0, 0]);
}

#[test]
fn a_capacity_raise_wakes_a_waiter() {
    let t = tree();
    let full = lease(&t.a, 500, None);
    let a = t.a.clone();
    let waiter = thread::spawn(move || {
        a.reserve(100, KV, None, Some(Instant::now() + Duration::from_secs(20))).map(|g| g.bytes()).is_ok()
    });
    while t.a.snapshot().waits == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(20));
    t.a.set_capacity(600).unwrap();
    assert!(waiter.join().unwrap());
    t.a.release(full).unwrap();
}

/// Threads charge, grow, shrink, quarantine and release in two tenants
/// under a device pool while another thread changes capacities: no level
/// ever exceeds its capacity, and every level ends at its quarantine.
#[test]
fn threads_in_a_tree_with_capacity_changes_keep_every_level_within_capacity() {
    within(60, || {
        let t = tree();
        let stop = Arc::new(AtomicBool::new(false));
        let quarantined = Arc::new(AtomicU64::new(0));
        let pools = [t.a.clone(), t.b.clone(), t.gpu.clone()];
        let mut hs = Vec::new();
        for (i, p) in pools.iter().cloned().enumerate() {
            let (stop, q) = (stop.clone(), quarantined.clone());
            let all = [t.a.clone(), t.b.clone(), t.gpu.clone(), t.process.clone()];
            hs.push(thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut mine: Vec<Lease> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let bytes = 1 + next() % 200;
                    match next() % 6 {
                        0..=2 => {
                            if let Ok(g) = p.try_reserve(bytes, KV, None) {
                                let actual = g.bytes() / 2 + next() % (g.bytes() + 1);
                                if let Ok(l) = g.commit(actual) {
                                    mine.push(l);
                                }
                            }
                        }
                        3 if !mine.is_empty() => {
                            let l = mine.swap_remove((next() as usize) % mine.len());
                            p.release(l).unwrap();
                        }
                        4 if !mine.is_empty() => {
                            let i = (next() as usize) % mine.len();
                            let k = mine[i].bytes() / 3;
                            if next() % 8 == 0 {
                                p.quarantine_part(&mut mine[i], k.min(3)).unwrap();
                                q.fetch_add(k.min(3), Ordering::Relaxed);
                            } else {
                                p.release_part(&mut mine[i], k).unwrap();
                            }
                        }
                        _ => {
                            for l in &all {
                                let s = l.snapshot();
                                assert!(s.used <= s.capacity, "{s}");
                            }
                        }
                    }
                }
                for l in mine {
                    p.release(l).unwrap();
                }
            }));
        }
        let (gpu, a, stop2) = (t.gpu.clone(), t.a.clone(), stop.clone());
        let changer = thread::spawn(move || {
            let mut k = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                k += 1;
                let _ = gpu.set_capacity(300 + (k * 37) % 600);
                let _ = a.set_capacity(100 + (k * 53) % 500);
                thread::yield_now();
            }
        });
        thread::sleep(Duration::from_millis(600));
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        changer.join().unwrap();
        let q = quarantined.load(Ordering::Relaxed);
        let s = t.gpu.snapshot();
        assert_eq!(s.used, q, "{s}");
        assert_eq!(t.process.used(), q);
        assert_eq!(s.children_used, t.a.used() + t.b.used());
        assert_eq!(s.children_used + s.reserved + s.leased + s.quarantined, s.used);
        assert!(s.peak <= 900 && t.a.peak() <= 600);
    });
}
