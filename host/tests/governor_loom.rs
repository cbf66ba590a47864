//! Exhaustive interleavings of the governor's lock-free fast path (loom).
//!
//! Built only with `--cfg loom`; then the host's atomics, locks,
//! condition variables and thread-locals are loom's (see
//! `host/src/sync.rs`). Run:
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p memplug-host --release --test governor_loom
//! ```
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use memplug_host::governor::{AllocationClass, Governor, Pool};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLASS: AllocationClass = AllocationClass::Kv;

/// `preemptions`: `None` explores every interleaving; a bound keeps the
/// largest model quick while still covering every two-thread race of the
/// fast path (each thread's grant, commit and release preempted anywhere).
fn model(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = preemptions;
    b.check(f);
}

fn pool(capacity: u64) -> Arc<Pool> {
    let g = Governor::new();
    let id = g.create_pool("loom", capacity).unwrap();
    g.pool(id).unwrap()
}

/// Reserve → commit → release on one thread, recording the bytes this
/// thread holds in `held` so the other thread can check the sum.
fn cycle(pool: &Pool, bytes: u64, held: &AtomicU64) -> bool {
    match pool.try_reserve(bytes, CLASS, None) {
        Ok(r) => {
            let now = held.fetch_add(bytes, Ordering::SeqCst) + bytes;
            assert!(now <= pool.capacity(), "capacity exceeded: {now}");
            assert!(pool.used() <= pool.capacity());
            let lease = r.commit(bytes).unwrap();
            held.fetch_sub(bytes, Ordering::SeqCst);
            pool.release(lease).unwrap();
            true
        }
        Err(e) => {
            assert!(e.out_of_budget().is_some(), "{e}");
            false
        }
    }
}

fn assert_balanced(pool: &Pool, granted: u64, refused: u64) {
    let s = pool.snapshot();
    assert_eq!(s.used, 0);
    let t = s.totals();
    assert_eq!((t.reserved, t.leased, t.leases, t.quarantined), (0, 0, 0, 0));
    assert_eq!((t.grants, t.failures), (granted, refused));
}

/// Two threads race for room that fits only one at a time: capacity is
/// never exceeded, and the ledger balances to zero.
#[test]
fn loom_fast_path_never_exceeds_capacity_and_balances() {
    model(Some(4), || {
        let p = pool(100);
        let held = Arc::new(AtomicU64::new(0));
        let (p2, h2) = (p.clone(), held.clone());
        let t = thread::spawn(move || cycle(&p2, 60, &h2));
        let a = cycle(&p, 60, &held);
        let b = t.join().unwrap();
        let granted = u64::from(a) + u64::from(b);
        assert!(granted >= 1, "room for one was refused to both");
        assert_balanced(&p, granted, 2 - granted);
    });
}

/// Two grants that fit together always both succeed (no spurious refusal
/// from a lost compare-exchange).
#[test]
fn loom_grants_that_fit_together_both_succeed() {
    model(None, || {
        let p = pool(100);
        let held = Arc::new(AtomicU64::new(0));
        let (p2, h2) = (p.clone(), held.clone());
        let t = thread::spawn(move || cycle(&p2, 50, &h2));
        assert!(cycle(&p, 50, &held));
        assert!(t.join().unwrap());
        assert_balanced(&p, 2, 0);
    });
}

/// A refund racing with a thread that starts waiting for room always wakes
/// it (loom's timed wait never times out, so a lost wake-up is a deadlock
/// loom reports).
#[test]
fn loom_refund_always_wakes_a_waiter() {
    model(None, || {
        let p = pool(100);
        let lease = p.try_reserve(80, CLASS, None).unwrap().commit(80).unwrap();
        let p2 = p.clone();
        let t = thread::spawn(move || p2.release(lease).unwrap());
        let r = p.reserve(50, CLASS, None, Some(Instant::now() + Duration::from_secs(3600))).unwrap();
        assert_eq!(p.used(), 50);
        drop(r);
        t.join().unwrap();
        assert_balanced(&p, 2, 0);
    });
}

/// A charge in a child pool (two compare-exchanges: the child's word, then
/// the parent's) races a refund of an earlier lease of the child and a
/// lowering of the parent's capacity: no level is ever seen over its
/// capacity, `used` and `capacity` are always read as a consistent pair,
/// the lowering is refused only when what was live did not fit, and both
/// levels balance to zero.
#[test]
fn loom_two_level_charge_races_a_refund_and_a_capacity_change() {
    model(Some(3), || {
        let g = Governor::new();
        let parent = g.pool(g.create_pool("device", 100).unwrap()).unwrap();
        let child = g.pool(g.create_child_pool("tenant", &parent, 100).unwrap()).unwrap();
        let lease = child.try_reserve(40, CLASS, None).unwrap().commit(40).unwrap();
        let c1 = child.clone();
        let refund = thread::spawn(move || c1.release(lease).unwrap());
        let p2 = parent.clone();
        let lower = thread::spawn(move || p2.set_capacity(50).map_err(|e| e.to_string()));

        let granted = match child.try_reserve(50, CLASS, None) {
            Ok(grant) => {
                // The grant is charged at both levels; the lease may or may
                // not still be; the capacity is the old or the new one.
                let (used, cap) = parent.used_and_capacity();
                assert!(used <= cap, "parent over capacity: {used} > {cap}");
                assert!(used == 50 || used == 90, "parent used {used}");
                assert!(cap == 50 || cap == 100, "parent capacity {cap}");
                let (used, cap) = child.used_and_capacity();
                assert!((used == 50 || used == 90) && cap == 100, "child {used}/{cap}");
                drop(grant);
                true
            }
            Err(e) => {
                let o = e.out_of_budget().expect("refused for room");
                // Only the parent can be short (the child has room for both).
                assert_eq!(o.short_pool(), parent.id());
                assert_eq!(o.short_level(), 1);
                false
            }
        };
        refund.join().unwrap();
        let lowered = lower.join().unwrap();
        match &lowered {
            Ok(()) => assert_eq!(parent.capacity(), 50),
            Err(msg) => {
                // Refused only while lease and grant were both live there.
                assert!(granted, "lowering refused with 40 B live at most: {msg}");
                assert!(msg.contains("90 B are live"), "{msg}");
                assert_eq!(parent.capacity(), 100);
            }
        }
        // With the lowering done and the lease refunded, 50 B fit again
        // and 51 B do not (or 100 B if the lowering was refused).
        assert_eq!((child.used(), parent.used()), (0, 0));
        let room = if lowered.is_ok() { 50 } else { 100 };
        assert!(child.try_reserve(room, CLASS, None).is_ok());
        assert!(child.try_reserve(room + 1, CLASS, None).is_err());
        assert_eq!((child.used(), parent.used()), (0, 0));
    });
}

/// A request in one child pool waits for room its parent lacks; a refund in
/// a sibling child (room at the parent, none in the waiter's own pool)
/// always wakes it — the waiter sleeps on the level that was short.
#[test]
fn loom_refund_in_a_sibling_wakes_a_waiter_short_at_the_parent() {
    model(Some(3), || {
        let g = Governor::new();
        let parent = g.pool(g.create_pool("device", 100).unwrap()).unwrap();
        let a = g.pool(g.create_child_pool("a", &parent, 100).unwrap()).unwrap();
        let b = g.pool(g.create_child_pool("b", &parent, 100).unwrap()).unwrap();
        let lease = b.try_reserve(80, CLASS, None).unwrap().commit(80).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || b2.release(lease).unwrap());
        let r = a.reserve(50, CLASS, None, Some(Instant::now() + Duration::from_secs(3600))).unwrap();
        // b's lease left b, then the parent, before the waiter got room.
        assert_eq!((a.used(), b.used(), parent.used()), (50, 0, 50));
        drop(r);
        t.join().unwrap();
        assert_eq!((a.used(), b.used(), parent.used()), (0, 0, 0));
    });
}
