//! Figures of one budget across processes, in one run (not a test):
//!
//!   cargo bench -p memplug-node --bench node
//!
//! 1. a grant inside a held chunk against an in-process grant (the same
//!    governor operations: reserve 4 KiB, commit, release), interleaved
//!    rounds, the median of each and their ratio;
//! 2. chunk refill: a grant past what the pool holds, which leases a chunk
//!    from the authority (p50 / p99);
//! 3. a cross-process ticket's round trip: a grant that finds the node
//!    full, so the authority tickets another process whose holder gives a
//!    chunk back, and the grant is served from it (p50 / p99);
//! 4. 8 processes contending on a node smaller than they want together:
//!    grants per second, against 1 process alone.
//!
//! The other processes are this binary again (`MEMPLUG_NODE_BENCH_ROLE`).
//! No criterion: the figures are printed, ratios included.

use memplug_host::governor::{AllocationClass, Lease, Pool, PressureTicket, Priority};
use memplug_host::ProcessMemoryManager;
use memplug_node::{Authority, AuthorityConfig, LinkDevice, LinkOptions, NodeLink};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const ROLE: &str = "MEMPLUG_NODE_BENCH_ROLE";
const SOCKET: &str = "MEMPLUG_NODE_BENCH_SOCKET";

fn authority(path: &Path, capacity: u64) -> Authority {
    let mut c = AuthorityConfig::new(path, vec![("cpu0".into(), capacity)]);
    c.chunk = MIB;
    c.ticket_timeout = Duration::from_secs(1);
    c.rejoin_grace = Duration::from_millis(1);
    Authority::start(c).unwrap()
}

fn join(path: &Path, pool: &Arc<Pool>, priority: u32, keep: u64, tick: Duration) -> NodeLink {
    let opts = LinkOptions { keep_idle_chunks: keep, tick, ..LinkOptions::default() };
    let dev = LinkDevice { device: "cpu0".into(), pool: pool.clone(), priority, classes: 0 };
    NodeLink::join(path, vec![dev], opts).unwrap()
}

fn grant_release(pool: &Pool, n: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        let g = pool.try_reserve(4 * KIB, AllocationClass::Other, None).unwrap();
        let l = g.commit(4 * KIB).unwrap_or_else(|_| panic!("commit"));
        let _ = pool.release(l);
    }
    t.elapsed()
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// 1: grants inside a held chunk cost what in-process grants cost.
fn inside_a_chunk(path: &Path) {
    let _a = authority(path, 64 * MIB);
    let mgr = ProcessMemoryManager::new();
    let plain = mgr.create_pool("plain", 64 * MIB).unwrap();
    let joined = mgr.create_pool("joined", 0).unwrap();
    let _link = join(path, &joined, 0, 64, Duration::from_millis(20));
    // A chunk held: the first grant leases it, the rest stay inside it.
    drop(
        joined
            .reserve(MIB, AllocationClass::Other, None, Some(Instant::now() + Duration::from_secs(1)))
            .unwrap(),
    );
    assert!(joined.capacity() >= MIB);
    let (n, rounds) = (200_000, 15);
    let (mut a, mut b) = (vec![], vec![]);
    grant_release(&plain, n);
    grant_release(&joined, n);
    for _ in 0..rounds {
        a.push(grant_release(&plain, n) / n);
        b.push(grant_release(&joined, n) / n);
    }
    let (pa, pb) = (pct(&mut a, 0.5), pct(&mut b, 0.5));
    println!(
        "grant+commit+release of 4 KiB, median of {rounds} rounds of {n}: in-process {:.1} ns, inside a held chunk {:.1} ns, ratio {:.2}",
        pa.as_nanos() as f64,
        pb.as_nanos() as f64,
        pb.as_secs_f64() / pa.as_secs_f64()
    );
}

/// 2: a grant past the pool's capacity leases a chunk.
fn refill(path: &Path) {
    let _a = authority(path, 64 * MIB);
    let mgr = ProcessMemoryManager::new();
    let pool = mgr.create_pool("refill", 0).unwrap();
    // Keeps no idle chunk, ticks every millisecond: each round starts empty.
    let _link = join(path, &pool, 0, 0, Duration::from_millis(1));
    let mut v = vec![];
    for _ in 0..300 {
        let end = Instant::now() + Duration::from_secs(1);
        while pool.capacity() > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
        let t = Instant::now();
        let g = pool.reserve(
            4 * KIB,
            AllocationClass::Other,
            None,
            Some(Instant::now() + Duration::from_secs(1)),
        );
        v.push(t.elapsed());
        drop(g.unwrap());
    }
    println!(
        "chunk refill (a grant past the held budget leases 1 MiB), 300 rounds: p50 {:.1} us, p99 {:.1} us",
        us(pct(&mut v, 0.5)),
        us(pct(&mut v, 0.99))
    );
}

/// The other side of 3: holds up to 4 MiB in 1 MiB leases its holder
/// gives back under a ticket, refilling whenever it has room.
fn victim(path: &Path) {
    let mgr = ProcessMemoryManager::new();
    let pool = mgr.create_pool("victim", 0).unwrap();
    let held: Arc<Mutex<Vec<Lease>>> = Arc::default();
    let (h, p) = (held.clone(), pool.clone());
    let _holder = pool.register_holder("ring", Priority(0), move |t: &PressureTicket| {
        let mut freed = 0;
        let mut v = h.lock().unwrap();
        while freed < t.bytes_wanted {
            let Some(l) = v.pop() else { break };
            freed += MIB;
            let _ = p.release(l);
        }
        freed
    });
    let _link = join(path, &pool, 0, 0, Duration::from_millis(1));
    println!("ready");
    loop {
        if pool.used() < 4 * MIB {
            if let Ok(g) = pool.try_reserve(MIB, AllocationClass::Other, None) {
                held.lock().unwrap().push(g.commit(MIB).unwrap_or_else(|_| panic!("commit")));
                continue;
            }
            let d = Some(Instant::now() + Duration::from_millis(5));
            if let Ok(g) = pool.reserve(MIB, AllocationClass::Other, None, d) {
                held.lock().unwrap().push(g.commit(MIB).unwrap_or_else(|_| panic!("commit")));
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn spawn(role: &str, path: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, role)
        .env(SOCKET, path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    assert!(l.contains("ready"), "{l}");
    (c, out)
}

/// 3: a cross-process ticket's round trip.
fn ticket_round_trip(path: &Path) {
    let a = authority(path, 8 * MIB);
    let mgr = ProcessMemoryManager::new();
    let pool = mgr.create_pool("requester", 0).unwrap();
    let _link = join(path, &pool, 10, 0, Duration::from_millis(1));
    let d = || Some(Instant::now() + Duration::from_secs(2));
    let kept = pool.reserve(4 * MIB, AllocationClass::Other, None, d()).unwrap().commit(4 * MIB);
    let (mut child, _out) = spawn("victim", path);
    let full = || a.books().free("cpu0") == 0 && pool.capacity() == pool.used();
    let mut v = vec![];
    for _ in 0..200 {
        let end = Instant::now() + Duration::from_secs(2);
        while !full() && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
        let t = Instant::now();
        let g = pool.reserve(MIB, AllocationClass::Other, None, d()).expect("the other process gave way");
        v.push(t.elapsed());
        drop(g);
    }
    let sent = a.books().members.values().map(|m| m.tickets_answered).sum::<u64>();
    let _ = child.kill();
    let _ = child.wait();
    drop(kept);
    println!(
        "cross-process ticket round trip (grant -> lease -> ticket -> holder frees 1 MiB -> answer -> grant), 200 rounds, {sent} tickets answered: p50 {:.1} us, p99 {:.1} us",
        us(pct(&mut v, 0.5)),
        us(pct(&mut v, 0.99))
    );
}

/// One contender of 4: for 2 s, grants of 64 KiB to 3 MiB kept in a ring
/// of 8 (its holder gives the oldest back under a ticket); prints
/// "ops N refused M".
fn contender(path: &Path) {
    let mgr = ProcessMemoryManager::new();
    let pool = mgr.create_pool("contender", 0).unwrap();
    let ring: Arc<Mutex<std::collections::VecDeque<Lease>>> = Arc::default();
    let (r, p) = (ring.clone(), pool.clone());
    let _holder = pool.register_holder("ring", Priority(0), move |t: &PressureTicket| {
        let mut freed = 0;
        let mut v = r.lock().unwrap();
        while freed < t.bytes_wanted {
            let Some(l) = v.pop_front() else { break };
            freed += l.bytes();
            let _ = p.release(l);
        }
        freed
    });
    let _link = join(path, &pool, 0, 1, Duration::from_millis(5));
    println!("ready");
    let mut x = u64::from(std::process::id()) | 1;
    let (mut ops, mut refused) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 64 * KIB + x % (3 * MIB);
        let old = {
            let mut v = ring.lock().unwrap();
            if v.len() >= 8 {
                v.pop_front()
            } else {
                None
            }
        };
        if let Some(l) = old {
            let _ = pool.release(l);
        }
        match pool.reserve(
            size,
            AllocationClass::Other,
            None,
            Some(Instant::now() + Duration::from_millis(50)),
        ) {
            Ok(g) => {
                ring.lock().unwrap().push_back(g.commit(size).unwrap_or_else(|_| panic!("commit")));
                ops += 1;
            }
            Err(_) => refused += 1,
        }
    }
    println!("ops {ops} refused {refused}");
}

fn contend(path: &Path, n: usize) -> (f64, u64, u64) {
    // Room for a quarter of what n contenders want at most.
    let a = authority(path, (n as u64 * 24 * MIB / 4).max(8 * MIB));
    let kids: Vec<_> = (0..n).map(|_| spawn("contender", path)).collect();
    let (mut ops, mut refused) = (0, 0);
    for (mut c, mut out) in kids {
        let mut l = String::new();
        while !l.starts_with("ops ") {
            l.clear();
            assert!(out.read_line(&mut l).unwrap() > 0, "a contender ended early");
        }
        let f: Vec<u64> = l.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        ops += f[0];
        refused += f[1];
        let _ = c.wait();
    }
    let status: serde_json::Value = serde_json::from_str(&a.status_json()).unwrap();
    (ops as f64 / 2.0, refused, status["tickets_sent"].as_u64().unwrap_or(0))
}

fn main() {
    let dir: PathBuf = std::env::temp_dir().join(format!("memplug-nb-{}", std::process::id()));
    match std::env::var(ROLE).as_deref() {
        Ok("victim") => return victim(Path::new(&std::env::var_os(SOCKET).unwrap())),
        Ok("contender") => return contender(Path::new(&std::env::var_os(SOCKET).unwrap())),
        _ => {}
    }
    // `cargo bench` passes --bench; anything else that looks like a filter
    // of a harness is ignored.
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("n.sock");
    inside_a_chunk(&path);
    refill(&path);
    ticket_round_trip(&path);
    let (one, r1, t1) = contend(&path, 1);
    let (eight, r8, t8) = contend(&path, 8);
    println!(
        "contention, 2 s, grants of 64 KiB..3 MiB kept 8 deep, node at a quarter of what they can hold: 1 process {one:.0} grants/s ({r1} refused, {t1} tickets); 8 processes {eight:.0} grants/s in all ({r8} refused, {t8} tickets), {:.2}x",
        eight / one
    );
    let _ = std::fs::remove_dir_all(&dir);
}
