//! Governor budget (ARCHITECTURE.md §6): reserve + commit + release must cost at most
//! 3x a bare atomic `fetch_add` + `fetch_sub` pair.
//!
//! One run measures both, single-threaded and with two threads contending
//! on the same pool / the same atomic, with criterion and with a plain
//! timing loop whose ratios are printed:
//!
//! ```text
//! cargo bench -p memplug-host --bench governor
//! ```
//!
//! `GOVERNOR_RATIOS_ONLY=1` skips criterion and prints only the ratios.
//!
//! Nested budgets: the same cycle on a child pool (one ancestor) and on a
//! grandchild (two) — a charge there is one compare-exchange per level —
//! is measured beside it (`reserve_commit_release_child`, `_grandchild`).
//!
//! Instruction counts (exact, immune to machine noise): with
//! `GOVERNOR_PROBE=atomic|governor|holder|child|grandchild` the binary runs only that loop
//! `GOVERNOR_PROBE_N` times (default 1,000,000) and exits, so callgrind can
//! count the loop function alone:
//!
//! ```text
//! cargo bench -p memplug-host --bench governor --no-run   # prints the binary path
//! GOVERNOR_PROBE=governor valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='*probe_loop*' target/release/deps/governor-<hash>
//! ```
//! Instructions per iteration = the `Collected` count / N.

use criterion::Criterion;
use memplug_host::governor::{AllocationClass, Governor, HolderId, Pool, PressureTicket, Priority};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const BYTES: u64 = 64;
const CLASS: AllocationClass = AllocationClass::Kv;

/// The baseline atomic, alone on its cache line like the pool's word.
#[repr(align(64))]
struct Padded(AtomicU64);

#[inline(always)]
fn atomic_pair(a: &AtomicU64) {
    a.fetch_add(black_box(BYTES), Ordering::AcqRel);
    a.fetch_sub(black_box(BYTES), Ordering::AcqRel);
}

#[inline(always)]
fn governor_cycle(pool: &Pool, holder: Option<HolderId>) {
    let r = pool.try_reserve(black_box(BYTES), CLASS, holder).expect("room");
    let lease = r.commit(black_box(BYTES)).expect("commit");
    pool.release(lease).expect("release");
}

enum Subject<'a> {
    Atomic(&'a AtomicU64),
    Governor(&'a Pool, Option<HolderId>),
}

/// One measured loop; its own symbol so callgrind can count it alone.
#[inline(never)]
fn probe_loop(s: &Subject<'_>, n: u64) {
    match *s {
        Subject::Atomic(a) => {
            for _ in 0..n {
                atomic_pair(a);
            }
        }
        Subject::Governor(p, h) => {
            for _ in 0..n {
                governor_cycle(p, h);
            }
        }
    }
}

fn fixture() -> (Arc<Pool>, memplug_host::governor::HolderRegistration) {
    let g = Governor::new();
    let pool = g.pool(g.create_pool("bench", 1 << 40).unwrap()).unwrap();
    let reg = pool.register_holder("bench-holder", Priority(1), |_t: &PressureTicket| 0);
    (pool, reg)
}

/// A pool under a parent, and one under that: (child, grandchild). The
/// ancestors stay alive through their children.
fn tree_fixture() -> (Arc<Pool>, Arc<Pool>) {
    let g = Governor::new();
    let root = g.create_pool("bench-process", 1 << 42).unwrap();
    let child = g.pool(g.create_child_pool("bench-device", root, 1 << 41).unwrap()).unwrap();
    let grandchild = g.pool(g.create_child_pool("bench-tenant", &child, 1 << 40).unwrap()).unwrap();
    (child, grandchild)
}

/// Best ns per iteration of each subject over `rounds` interleaved runs of
/// `n` iterations. Interleaving exposes every subject to the same machine
/// conditions, and the minimum is the figure least disturbed by other load
/// on a shared machine.
fn time_single(subjects: &[Subject<'_>], n: u64, rounds: usize) -> Vec<f64> {
    for s in subjects {
        probe_loop(s, n); // warm-up (and the thread's first-touch slow path)
    }
    let mut best = vec![f64::INFINITY; subjects.len()];
    for _ in 0..rounds {
        for (b, s) in best.iter_mut().zip(subjects) {
            let t = Instant::now();
            probe_loop(s, n);
            *b = b.min(t.elapsed().as_nanos() as f64 / n as f64);
        }
    }
    best
}

/// Two threads run `n` iterations of `s` at once. Returns ns per iteration
/// (of the slower thread) if the two runs overlapped for at least 80% of
/// the round — a round where one thread was descheduled measures no
/// contention and is discarded.
fn contended_round(s: &Subject<'_>, n: u64) -> Option<f64> {
    let barrier = Barrier::new(2);
    let spans: Vec<(Instant, Instant)> = thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                sc.spawn(|| {
                    probe_loop(s, n / 10);
                    barrier.wait();
                    let start = Instant::now();
                    probe_loop(s, n);
                    (start, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans.iter().map(|s| s.0).min()?;
    let last = spans.iter().map(|s| s.1).max()?;
    let common_start = spans.iter().map(|s| s.0).max()?;
    let common_end = spans.iter().map(|s| s.1).min()?;
    let overlap = common_end.saturating_duration_since(common_start);
    let whole = last - first;
    (overlap.as_nanos() * 100 >= whole.as_nanos() * 80).then(|| whole.as_nanos() as f64 / n as f64)
}

/// Best ns per iteration per thread of each subject over interleaved
/// contended rounds, and how many rounds qualified.
fn time_contended(subjects: &[Subject<'_>], n: u64, rounds: usize) -> Vec<(f64, usize)> {
    let mut out = vec![(f64::INFINITY, 0); subjects.len()];
    for _ in 0..rounds {
        for (o, s) in out.iter_mut().zip(subjects) {
            if let Some(t) = contended_round(s, n) {
                *o = (o.0.min(t), o.1 + 1);
            }
        }
    }
    out
}

fn ratios() {
    let (pool, reg) = fixture();
    let holder = Some(reg.id());
    let atomic = Padded(AtomicU64::new(0));

    let (child, grandchild) = tree_fixture();
    let subjects = [
        Subject::Atomic(&atomic.0),
        Subject::Governor(&pool, None),
        Subject::Governor(&pool, holder),
        Subject::Governor(&child, None),
        Subject::Governor(&grandchild, None),
    ];
    let t = time_single(&subjects, 200_000, 40);
    let (a, g, gh, gc, gg) = (t[0], t[1], t[2], t[3], t[4]);
    println!(
        "single thread: atomic fetch_add+fetch_sub {a:.2} ns, governor reserve+commit+release {g:.2} ns \
         (for a holder {gh:.2} ns)"
    );
    println!("ratio governor/atomic (1 thread): {:.2}x (holder account: {:.2}x) [budget 3x]", g / a, gh / a);
    println!(
        "nested: child pool (1 ancestor) {gc:.2} ns ({:.2}x the atomic pair), grandchild (2) {gg:.2} ns ({:.2}x)",
        gc / a,
        gg / a
    );

    let t = time_contended(&subjects[..2], 200_000, 30);
    let ((ca, na), (cg, ng)) = (t[0], t[1]);
    println!(
        "2 threads contending: atomic {ca:.2} ns, governor {cg:.2} ns per iteration per thread \
         ({na} and {ng} of 30 rounds overlapped)"
    );
    println!("ratio governor/atomic (2 threads): {:.2}x [budget 3x]", cg / ca);
    assert_eq!(pool.used(), 0);
    drop(reg);
}

fn criterion_benches(c: &mut Criterion) {
    let (pool, reg) = fixture();
    let holder = Some(reg.id());
    let atomic = Padded(AtomicU64::new(0));
    let mut g = c.benchmark_group("governor");
    g.bench_function("atomic_fetch_add_fetch_sub", |b| b.iter(|| atomic_pair(&atomic.0)));
    g.bench_function("reserve_commit_release", |b| b.iter(|| governor_cycle(&pool, None)));
    g.bench_function("reserve_commit_release_holder", |b| b.iter(|| governor_cycle(&pool, holder)));
    let (child, grandchild) = tree_fixture();
    g.bench_function("reserve_commit_release_child", |b| b.iter(|| governor_cycle(&child, None)));
    g.bench_function("reserve_commit_release_grandchild", |b| b.iter(|| governor_cycle(&grandchild, None)));

    let shared = Arc::new(Padded(AtomicU64::new(0)));
    g.bench_function("atomic_pair_2_threads", |b| {
        b.iter_custom(|iters| {
            let s = shared.clone();
            let per = time_contended_once(iters, move |k| probe_loop(&Subject::Atomic(&s.0), k));
            Duration::from_nanos((per * iters as f64) as u64)
        })
    });
    let p = pool.clone();
    g.bench_function("reserve_commit_release_2_threads", |b| {
        b.iter_custom(|iters| {
            let p = p.clone();
            let per = time_contended_once(iters, move |k| probe_loop(&Subject::Governor(&p, None), k));
            Duration::from_nanos((per * iters as f64) as u64)
        })
    });
    g.finish();
    drop(reg);
}

/// Two threads run `iters` iterations each at once; ns per iteration of the slower.
fn time_contended_once(iters: u64, work: impl Fn(u64) + Send + Sync + 'static) -> f64 {
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(2));
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let (w, b) = (work.clone(), barrier.clone());
            thread::spawn(move || {
                b.wait();
                let t = Instant::now();
                w(iters);
                t.elapsed()
            })
        })
        .collect();
    let worst = hs.into_iter().map(|h| h.join().unwrap()).max().unwrap();
    worst.as_nanos() as f64 / iters.max(1) as f64
}

fn main() {
    if let Ok(which) = std::env::var("GOVERNOR_PROBE") {
        let n = std::env::var("GOVERNOR_PROBE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
        let (pool, reg) = fixture();
        let (child, grandchild) = tree_fixture();
        let atomic = Padded(AtomicU64::new(0));
        let s = match which.as_str() {
            "atomic" => Subject::Atomic(&atomic.0),
            "governor" => Subject::Governor(&pool, None),
            "holder" => Subject::Governor(&pool, Some(reg.id())),
            "child" => Subject::Governor(&child, None),
            "grandchild" => Subject::Governor(&grandchild, None),
            other => panic!("GOVERNOR_PROBE={other}: expected atomic, governor, holder, child or grandchild"),
        };
        probe_loop(&s, n);
        println!("probe {which}: {n} iterations");
        return;
    }
    if std::env::var_os("GOVERNOR_RATIOS_ONLY").is_some() {
        ratios();
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    ratios();
}
