//! Faults across processes, at random points: members (this test binary
//! re-run as children, each with the reference CPU plugin) churn
//! allocations on one node while the test kills them with SIGKILL at
//! random moments and starts replacements, the authority is stopped and a
//! new one started on the same socket mid-run, and one member never
//! answers its tickets. What is checked: the books are exact at every
//! look and never lease past the capacity; the member that does not answer
//! is skipped and reported; after the restart each live member is counted
//! once, for exactly what its pool holds; at the end every dead member's
//! leases are reclaimed and only what the live test process holds stays
//! leased.
//!
//! `faults_under_churn_kills_and_a_restart` runs about 3 s in the default
//! run; `soak_faults` (ignored) runs the same for `MEMPLUG_NODE_SOAK_SECS`
//! (default 60) seconds: `cargo test -p memplug-node --test faults --
//! --ignored soak_faults`. `MEMPLUG_NODE_FAULTS_SEED` replays a run.

use memplug_host::governor::{AllocationClass, Priority};
use memplug_node::Authority;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{Member, Spec, MIB};

const CAPACITY: u64 = 24 * MIB;
const SOCKET_VAR: &str = "MEMPLUG_NODE_FAULTS_SOCKET";
const SEED_VAR: &str = "MEMPLUG_NODE_FAULTS_SEED";

struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn authority(path: &Path) -> Authority {
    common::authority(path, CAPACITY, Duration::from_millis(150))
}

/// A member whose holder, at its declared priority, evicts the oldest of
/// `cached` (or, `mute`, never answers in time).
fn member(path: &Path, priority: u32, mute: bool, wait: Duration) -> Member {
    let holder_delay = mute.then_some(Duration::from_secs(60));
    let (holder_priority, class, classes) = (Priority(priority), AllocationClass::Kv, 0);
    common::member(path, Spec { priority, holder_priority, holder_delay, wait, class, classes })
}

/// A child member: its process, its stdin (closed: it exits) and its
/// stdout lines.
struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

fn spawn(scenario: &str, path: &Path, seed: u64) -> Kid {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([scenario, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SOCKET_VAR, path)
        .env(SEED_VAR, seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let kid = Kid { stdin: child.stdin.take(), child, lines };
    line(&kid, "ready", Duration::from_secs(10));
    kid
}

/// The child's next line holding `prefix`, from it on, within `within`.
fn line(kid: &Kid, prefix: &str, within: Duration) -> String {
    let end = Instant::now() + within;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match kid.lines.recv_timeout(left) {
            // The harness's "test NAME ... " may precede it on the line.
            Ok(l) if l.contains(prefix) => return l[l.find(prefix).unwrap()..].to_string(),
            Ok(_) => {}
            Err(_) => panic!("child {}: no {prefix:?} line within {within:?}", kid.child.id()),
        }
    }
}

fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn leased_by(a: &Authority, pid: u32) -> Option<u64> {
    let books = a.books();
    let v: Vec<u64> = books
        .members
        .values()
        .filter(|m| m.pid == pid as i32)
        .map(|m| m.leased.get("cpu0").copied().unwrap_or(0))
        .collect();
    assert!(v.len() <= 1, "pid {pid} counted {} times", v.len());
    v.first().copied()
}

/// The books are exact and lease no more than the device has.
fn look(a: &Authority) {
    let b = a.books();
    b.check().unwrap();
    if b.devices["cpu0"].leased > CAPACITY {
        let m: Vec<_> =
            b.members.values().map(|m| (m.pid, m.connected, m.leased.get("cpu0").copied())).collect();
        panic!("leased past the capacity: {:?}; members {m:?}", b.devices);
    }
}

/// Scenario: churns allocations of 256 KiB to 2 MiB (holding at most
/// 4 MiB) until a "quiet" line (then stops, lets idle budget go back and
/// prints "held CAPACITY") or the end of stdin (then exits).
#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_churn() {
    let Some(path) = std::env::var_os(SOCKET_VAR) else { return };
    let mut rng = Rng(std::env::var(SEED_VAR).unwrap().parse::<u64>().unwrap() | 1);
    let m = member(Path::new(&path), 1, false, Duration::from_millis(300));
    let (quiet, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (q, s) = (quiet.clone(), stop.clone());
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines().map_while(Result::ok) {
            if l == "quiet" {
                q.store(true, SeqCst);
            }
        }
        s.store(true, SeqCst);
    });
    println!("ready");
    std::io::stdout().flush().unwrap();
    while !stop.load(SeqCst) {
        if quiet.load(SeqCst) {
            // Idle budget above one chunk goes back on the link's tick,
            // in whole chunks: less than two stay.
            let chunk = m.link.chunk();
            let settled = || m.pool.capacity() - m.pool.used() < 2 * chunk;
            let end = Instant::now() + Duration::from_secs(3);
            while !settled() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("held {}", m.pool.capacity());
            std::io::stdout().flush().unwrap();
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            break;
        }
        if rng.next(10) < 6 && m.pool.used() < 4 * MIB {
            let size = (256 << 10) + rng.next(7 * (256 << 10));
            if let Ok(a) = m.binding.allocate(size, 64) {
                m.cached.lock().unwrap().push(a);
            }
        } else {
            let mut v = m.cached.lock().unwrap();
            if !v.is_empty() {
                let i = rng.next(v.len() as u64) as usize;
                drop(v.remove(i));
            }
        }
        std::thread::sleep(Duration::from_millis(1 + rng.next(4)));
    }
}

/// Scenario: holds 4 MiB at the lowest priority and never answers a
/// ticket (its holder sleeps); ends with its stdin or a kill.
#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_mute() {
    let Some(path) = std::env::var_os(SOCKET_VAR) else { return };
    let m = member(Path::new(&path), 0, true, Duration::from_millis(300));
    let a = m.binding.allocate(4 * MIB, 64).unwrap();
    m.cached.lock().unwrap().push(a);
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    // Exits without leaving (its holder may be asleep in a ticket, and
    // unregistering it would wait for that).
    std::process::exit(0);
}

fn run(secs: f64) {
    let seed = std::env::var(SEED_VAR).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("faults: seed {seed} ({SEED_VAR} replays it), {secs} s");
    let mut rng = Rng(seed | 1);
    let dir = std::env::temp_dir().join(format!("memplug-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("n.sock");
    let mut a = authority(&path);
    let mute = spawn("scenario_mute", &path, 1);
    let mut kids: Vec<Kid> = (0..4).map(|_| spawn("scenario_churn", &path, rng.next(u64::MAX))).collect();
    // This process presses the others: the mute member (priority 0) is
    // asked first, times out and is skipped; the churners give way.
    let me = member(&path, 10, false, Duration::from_secs(2));
    let (start, mut restarted, mut kills) = (Instant::now(), false, 0);
    while start.elapsed().as_secs_f64() < secs {
        look(&a);
        match rng.next(4) {
            0 => {
                // SIGKILL at a random point of whatever the child is doing.
                let i = rng.next(kids.len() as u64) as usize;
                let mut k = kids.swap_remove(i);
                std::thread::sleep(Duration::from_millis(rng.next(30)));
                k.child.kill().unwrap();
                let pid = k.child.id();
                let _ = k.child.wait();
                until("a killed member reclaimed", Duration::from_secs(3), || leased_by(&a, pid).is_none());
                kills += 1;
                kids.push(spawn("scenario_churn", &path, rng.next(u64::MAX)));
            }
            1 => {
                // Presses everyone below priority 10 (may be refused: the
                // mute member's 150 ms and the churn race for the room).
                let big = me.binding.allocate(10 * MIB, 64);
                std::thread::sleep(Duration::from_millis(rng.next(50)));
                drop(big);
            }
            2 if !restarted && start.elapsed().as_secs_f64() > secs / 3.0 => {
                // The authority dies; the members run on what they hold
                // and join the next one, which counts each byte once.
                drop(a);
                std::thread::sleep(Duration::from_millis(rng.next(100)));
                a = authority(&path);
                let want = kids.len() + 2;
                until("every member rejoined", Duration::from_secs(5), || a.books().members.len() == want);
                restarted = true;
            }
            _ => std::thread::sleep(Duration::from_millis(rng.next(40))),
        }
    }
    assert!(restarted && kills > 0, "the run was too short to restart and kill");
    look(&a);
    // The mute member is asked first (priority 0), skipped and reported
    // by the authority that is up now.
    drop(me.binding.allocate(10 * MIB, 64));
    let books = a.books();
    let m = books.members.values().find(|m| m.pid == mute.child.id() as i32).unwrap();
    assert!(m.tickets_skipped >= 1, "the mute member was never skipped: {m:?}");
    let status: serde_json::Value = serde_json::from_str(&a.status_json()).unwrap();
    assert!(status["tickets_timed_out"].as_u64().unwrap() >= 1, "{status}");
    // Each live churner counted once, for exactly what its pool holds.
    for k in &mut kids {
        writeln!(k.stdin.as_mut().unwrap(), "quiet").unwrap();
    }
    for k in &kids {
        let held: u64 = line(k, "held ", Duration::from_secs(10))[5..].parse().unwrap();
        let pid = k.child.id();
        until(&format!("pid {pid}'s books at {held} B"), Duration::from_secs(3), || {
            leased_by(&a, pid) == Some(held)
        });
    }
    // Everyone else leaves (exits or is killed): all of it comes back.
    let mut gone = vec![];
    for mut k in kids.into_iter().chain([mute]) {
        drop(k.stdin.take());
        if k.child.try_wait().unwrap().is_none() && rng.next(2) == 0 {
            let _ = k.child.kill();
        }
        gone.push(k);
    }
    for k in &mut gone {
        let pid = k.child.id();
        // The mute child's holder may be asleep: a kill ends it.
        let end = Instant::now() + Duration::from_secs(5);
        while k.child.try_wait().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = k.child.kill();
        let _ = k.child.wait();
        until("an ended member reclaimed", Duration::from_secs(3), || leased_by(&a, pid).is_none());
    }
    look(&a);
    let me_pid = std::process::id();
    until("only this process's budget leased", Duration::from_secs(3), || {
        a.books().devices["cpu0"].leased == me.pool.capacity()
            && leased_by(&a, me_pid) == Some(me.pool.capacity())
    });
    assert_eq!(a.books().members.len(), 1);
    drop(me);
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn faults_under_churn_kills_and_a_restart() {
    run(3.0);
}

#[test]
#[ignore = "a soak: MEMPLUG_NODE_SOAK_SECS seconds (default 60)"]
fn soak_faults() {
    let secs = std::env::var("MEMPLUG_NODE_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60.0);
    run(secs);
}
