//! Threads reserving, committing, growing, shrinking, quarantining and
//! releasing under pressure for a bounded time; capacity always holds and
//! the ledger balances to zero (but quarantine) at the end.

use memplug_host::governor::{
    AllocationClass, Governor, GovernorError, Lease, Pool, PressureTicket, Priority,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

const CAP: u64 = 64 * 1024;

/// Per-thread pseudo-random numbers (xorshift; no shared state).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Tally {
    grants: AtomicU64,
    failures: AtomicU64,
    quarantined: AtomicU64,
}

fn worker(
    pool: &Pool,
    stash: &Mutex<Vec<Lease>>,
    holder: memplug_host::governor::HolderId,
    seed: u64,
    until: Instant,
    tally: &Tally,
) {
    let mut rng = Rng(seed);
    let mut mine: Vec<Lease> = Vec::new();
    let check = |p: &Pool| assert!(p.used() <= CAP, "capacity exceeded: {}", p.used());
    while Instant::now() < until {
        let class = AllocationClass::ALL[rng.below(5) as usize];
        let bytes = 1 + rng.below(8192);
        let for_holder = rng.below(4) == 0;
        let who = for_holder.then_some(holder);
        let res = match rng.below(3) {
            0 => pool.try_reserve(bytes, class, who),
            1 => pool.reserve(bytes, class, who, None),
            _ => pool.reserve(bytes, class, who, Some(Instant::now() + Duration::from_millis(1))),
        };
        let r = match res {
            Ok(r) => r,
            Err(GovernorError::OutOfBudget(o)) => {
                tally.failures.fetch_add(1, Ordering::Relaxed);
                assert!(o.snapshot.used <= CAP);
                // Under pressure: give back some of our own.
                for _ in 0..mine.len() / 2 {
                    pool.release(mine.swap_remove(0)).unwrap();
                }
                continue;
            }
            Err(e) => panic!("unexpected {e}"),
        };
        tally.grants.fetch_add(1, Ordering::Relaxed);
        check(pool);
        // Granularity: sometimes a little less, sometimes a little more.
        let actual = match rng.below(4) {
            0 => bytes - rng.below(bytes),
            1 => bytes + rng.below(256),
            _ => bytes,
        };
        let mut lease = match r.commit(actual) {
            Ok(l) => l,
            Err(rej) => {
                tally.failures.fetch_add(1, Ordering::Relaxed);
                drop(rej.into_inner());
                continue;
            }
        };
        check(pool);
        match rng.below(8) {
            0 => {
                // grow
                if let Ok(g) = pool.try_reserve(512, lease.class(), lease.holder()) {
                    tally.grants.fetch_add(1, Ordering::Relaxed);
                    g.commit_into(&mut lease, 256 + rng.below(257)).unwrap();
                } else {
                    tally.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            1 => {
                let k = rng.below(lease.bytes() + 1);
                pool.release_part(&mut lease, k).unwrap();
            }
            2 if rng.below(16) == 0 => {
                let k = rng.below(lease.bytes() + 1).min(64);
                pool.quarantine_part(&mut lease, k).unwrap();
                tally.quarantined.fetch_add(k, Ordering::Relaxed);
            }
            _ => {}
        }
        check(pool);
        if for_holder {
            stash.lock().unwrap().push(lease);
        } else if rng.below(2) == 0 && mine.len() < 8 {
            mine.push(lease);
        } else {
            pool.release(lease).unwrap();
        }
    }
    for l in mine {
        pool.release(l).unwrap();
    }
}

#[test]
fn threads_under_pressure_keep_capacity_and_balance_the_ledger() {
    let g = Governor::new();
    let pool = g.pool(g.create_pool("contended", CAP).unwrap()).unwrap();
    let stash: Arc<Mutex<Vec<Lease>>> = Arc::default();
    let weak: Weak<Pool> = Arc::downgrade(&pool);
    let s2 = stash.clone();
    let reg = pool.register_holder("cache", Priority(0), move |t: &PressureTicket| {
        let Some(pool) = weak.upgrade() else { return 0 };
        let mut freed = 0;
        // Release oldest first until covered; the lock is ours, not the governor's.
        let victims: Vec<Lease> = {
            let mut v = s2.lock().unwrap();
            let mut n = 0;
            while n < v.len() && freed < t.bytes_wanted {
                freed += v[n].bytes();
                n += 1;
            }
            v.drain(..n).collect()
        };
        for l in victims {
            pool.release(l).unwrap();
        }
        freed
    });
    let holder = reg.id();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));

    // A watcher reads snapshots the whole time.
    let watcher = {
        let (pool, stop) = (pool.clone(), stop.clone());
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let s = pool.snapshot();
                assert!(s.used <= s.capacity && s.peak <= s.capacity);
                for c in &s.classes {
                    assert!(c.reserved <= CAP && c.leased <= CAP && c.quarantined <= CAP, "{c:?}");
                }
                n += 1;
            }
            n
        })
    };

    // Two waves of three workers: the second wave adopts the shards the
    // first left behind.
    let start = Instant::now();
    for wave in 0..2u64 {
        let until = Instant::now() + Duration::from_millis(600);
        let barrier = Arc::new(Barrier::new(3));
        let workers: Vec<_> = (0..3u64)
            .map(|i| {
                let (pool, stash, tally, barrier) =
                    (pool.clone(), stash.clone(), tally.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    worker(&pool, &stash, holder, 0x9E37_79B9_7F4A_7C15 ^ (wave * 8 + i + 1), until, &tally);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let snapshots = watcher.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));

    for l in stash.lock().unwrap().drain(..) {
        pool.release(l).unwrap();
    }
    let s = pool.snapshot();
    let q = tally.quarantined.load(Ordering::Relaxed);
    let t = s.totals();
    assert_eq!(s.used, q, "ledger: {s:?}");
    assert_eq!((t.reserved, t.leased, t.leases, t.quarantined), (0, 0, 0, q));
    assert_eq!((t.leaked_leases, t.leaked_bytes), (0, 0));
    assert_eq!(t.grants, tally.grants.load(Ordering::Relaxed));
    assert_eq!(t.failures, tally.failures.load(Ordering::Relaxed));
    assert!(t.grants > 100, "too little work done: {t:?}");
    assert!(s.pressure.tickets > 0, "never under pressure");
    let hs = reg.stats();
    assert_eq!((hs.totals().leased, hs.totals().reserved), (0, 0));
    eprintln!(
        "grants {} failures {} tickets {} waits {} (timeouts {}) snapshots {} peak {}",
        t.grants, t.failures, s.pressure.tickets, s.waits, s.wait_timeouts, snapshots, s.peak
    );
}

#[test]
fn two_threads_racing_for_the_last_bytes_never_both_win() {
    for _ in 0..200 {
        let g = Governor::new();
        let pool = g.pool(g.create_pool("race", 100).unwrap()).unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    pool.try_reserve(60, AllocationClass::Other, None).map(|r| r.commit(60).unwrap())
                })
            })
            .collect();
        let won: Vec<Lease> = handles.into_iter().filter_map(|h| h.join().unwrap().ok()).collect();
        assert_eq!(won.len(), 1);
        assert_eq!(pool.used(), 60);
        for l in won {
            pool.release(l).unwrap();
        }
        assert_eq!(pool.snapshot().totals().leased, 0);
        assert_eq!(pool.used(), 0);
    }
}

/// Each thread starts its compare-exchange from the last value it saw of
/// the pool's word; a stale guess must never turn into a refusal.
#[test]
fn a_stale_view_of_the_pool_never_refuses_room_that_exists() {
    let g = Governor::new();
    let pool = g.pool(g.create_pool("stale", 100).unwrap()).unwrap();
    // This thread last saw 60 B charged...
    let lease = pool.try_reserve(60, AllocationClass::Other, None).unwrap().commit(60).unwrap();
    // ...another thread releases them...
    let p2 = pool.clone();
    thread::spawn(move || p2.release(lease).unwrap()).join().unwrap();
    // ...so 60 + 50 no longer describes the pool: the grant must succeed.
    let r = pool.try_reserve(50, AllocationClass::Other, None).unwrap();
    assert_eq!(pool.used(), 50);
    drop(r);
    // And the other way round: a stale low guess never over-grants.
    let held = pool.clone();
    let lease = thread::spawn(move || {
        held.try_reserve(80, AllocationClass::Other, None).unwrap().commit(80).unwrap()
    })
    .join()
    .unwrap();
    assert!(pool.try_reserve(30, AllocationClass::Other, None).is_err());
    pool.release(lease).unwrap();
    assert_eq!(pool.used(), 0);
}
