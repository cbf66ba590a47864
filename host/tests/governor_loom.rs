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
