//! The node authority with real processes: members are this test binary
//! re-run as a child (a scenario test, `#[ignore]`d in a plain run) and the
//! test process itself, each with the reference CPU plugin in process.
//! What is checked: a grant inside a held chunk stays in the process and
//! idle chunks go back; pressure crosses the process boundary (a child's
//! holder evicts for the parent); a killed member's leases come back at
//! once; a member that never answers is skipped and named; an authority
//! that restarts learns what members hold; bad messages are refused and
//! the authority stays up. The books are exact after each.

use memplug_host::governor::{AllocationClass, PressureTicket, Priority};
use memplug_host::ProcessMemoryManager;
use memplug_node::wire::{self, Frame, Msg};
use memplug_node::Authority;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{Member, Spec, MIB};

const SOCKET_VAR: &str = "MEMPLUG_NODE_TEST_SOCKET";

fn socket(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memplug-node-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("node.sock")
}

fn authority(path: &Path, capacity: u64) -> Authority {
    common::authority(path, capacity, Duration::from_millis(300))
}

fn member(path: &Path, priority: u32, slow_holder: bool) -> Member {
    member_with(path, priority, slow_holder, Priority(0), Duration::from_secs(3), AllocationClass::Kv, 0)
}

/// A member declared at `priority` and `classes` (0: any) whose holder
/// (and so whose requests) is at `holder_priority`, its binding of `class`
/// waiting up to `wait`.
fn member_with(
    path: &Path,
    priority: u32,
    slow_holder: bool,
    holder_priority: Priority,
    wait: Duration,
    class: AllocationClass,
    classes: u8,
) -> Member {
    let holder_delay = slow_holder.then_some(Duration::from_secs(30));
    common::member(path, Spec { priority, holder_priority, holder_delay, wait, class, classes })
}

fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn leased_by(a: &Authority, pid: u32) -> Option<u64> {
    a.books()
        .members
        .values()
        .find(|m| m.pid == pid as i32)
        .map(|m| m.leased.get("cpu0").copied().unwrap_or(0))
}

/// This binary again, running one scenario, with the socket in its
/// environment; returns once it printed "ready".
fn child(scenario: &str, path: &PathBuf) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([scenario, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SOCKET_VAR, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before it was ready");
    }
    // The rest of its output is read, so its last lines find a reader.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    c
}

/// Scenario: fills 12 MiB of cached blocks (declared as `classes`, 0: any
/// class), says ready, waits for stdin to close.
fn holder_child(slow: bool, classes: u8) {
    let Some(path) = std::env::var_os(SOCKET_VAR) else { return };
    let wait = Duration::from_secs(3);
    let m = member_with(&PathBuf::from(path), 0, slow, Priority(0), wait, AllocationClass::Kv, classes);
    for _ in 0..12 {
        let a = m.binding.allocate(MIB, 64).unwrap();
        m.cached.lock().unwrap().push(a);
    }
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    assert!(m.pool.used() <= m.pool.capacity());
}

#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_holder() {
    holder_child(false, 0);
}

#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_kv_holder() {
    holder_child(false, 1 << AllocationClass::Kv as u8);
}

#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_weights_holder() {
    holder_child(false, 1 << AllocationClass::Weights as u8);
}

#[test]
#[ignore = "a scenario: run as a child by the tests below"]
fn scenario_slow_holder() {
    holder_child(true, 0);
}

#[test]
fn grants_inside_a_held_chunk_stay_in_the_process_and_idle_chunks_go_back() {
    let path = socket("chunks");
    let a = authority(&path, 16 * MIB);
    let m = member(&path, 0, false);
    let first = m.binding.allocate(100, 16).unwrap();
    assert_eq!(m.pool.capacity(), MIB, "one chunk leased");
    let more: Vec<_> = (0..100).map(|_| m.binding.allocate(100, 16).unwrap()).collect();
    let me = std::process::id();
    assert_eq!(leased_by(&a, me), Some(MIB));
    assert_eq!(
        a.books().members.values().next().unwrap().leases_granted,
        1,
        "no lease for grants inside the chunk"
    );
    let big = m.binding.allocate(5 * MIB, 64).unwrap();
    assert_eq!(leased_by(&a, me), Some(m.pool.capacity()));
    assert!(m.pool.capacity() >= 5 * MIB + 100 * 101);
    drop((big, more, first));
    // Idle above one chunk goes back on the link's timer.
    until("idle chunks given back", 5, || leased_by(&a, me) == Some(MIB));
    assert_eq!(m.pool.capacity(), MIB);
    a.books().check().unwrap();
    drop(m);
}

#[test]
fn pressure_crosses_the_process_boundary_and_the_books_balance() {
    let path = socket("press");
    let a = authority(&path, 16 * MIB);
    let mut holder = child("scenario_holder", &path);
    let hp = holder.id();
    assert!(leased_by(&a, hp).unwrap() >= 12 * MIB);
    // 8 MiB here: 4 are free, the child's holder must evict the rest.
    let m = member(&path, 5, false);
    let big = m.binding.allocate(8 * MIB, 64).expect("the other process gave way");
    let books = a.books();
    books.check().unwrap();
    let child_m = books.members.values().find(|x| x.pid == hp as i32).unwrap();
    assert!(child_m.tickets_answered >= 1 && child_m.bytes_released >= 4 * MIB, "{child_m:?}");
    assert!(books.devices["cpu0"].leased <= 16 * MIB);
    let status: serde_json::Value =
        serde_json::from_str(&m.link.status(false, Duration::from_secs(2)).unwrap()).unwrap();
    assert_eq!(status["books_exact"], true);
    assert!(status["tickets_sent"].as_u64().unwrap() >= 1);
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    until("the exited child's leases reclaimed", 5, || leased_by(&a, hp).is_none());
    drop(big);
    a.books().check().unwrap();
}

#[test]
fn a_killed_member_is_reclaimed_at_once_and_its_budget_leased_again() {
    let path = socket("kill");
    let a = authority(&path, 16 * MIB);
    let mut holder = child("scenario_holder", &path);
    let hp = holder.id();
    holder.kill().unwrap();
    until("the killed child's leases reclaimed", 5, || leased_by(&a, hp).is_none());
    let _ = holder.wait();
    assert_eq!(a.books().devices["cpu0"].leased, 0);
    let m = member(&path, 0, false);
    let all = m.binding.allocate(16 * MIB, 64).expect("the whole device is free again");
    assert_eq!(leased_by(&a, std::process::id()), Some(16 * MIB));
    drop(all);
}

#[test]
fn a_member_that_does_not_answer_is_skipped_and_named() {
    let path = socket("mute");
    let a = authority(&path, 16 * MIB);
    let mut mute = child("scenario_slow_holder", &path);
    let m = member(&path, 5, false);
    let err = m.binding.allocate(8 * MIB, 64).unwrap_err();
    assert!(err.to_string().contains("out of budget"), "{err}");
    let why = m.link.last_error().unwrap_or_default();
    assert!(why.contains(&format!("pid {} did not answer", mute.id())) && why.contains("skipped"), "{why}");
    let status: serde_json::Value =
        serde_json::from_str(&m.link.status(false, Duration::from_secs(2)).unwrap()).unwrap();
    assert!(status["tickets_timed_out"].as_u64().unwrap() >= 1, "{status}");
    mute.kill().unwrap();
    let _ = mute.wait();
    a.books().check().unwrap();
}

#[test]
fn an_authority_that_restarts_learns_what_members_hold_and_counts_it_once() {
    let path = socket("restart");
    let first = authority(&path, 16 * MIB);
    let m = member(&path, 0, false);
    let kept = m.binding.allocate(3 * MIB, 64).unwrap();
    // A chunk more, idle once freed: the link keeps one idle chunk.
    drop(m.binding.allocate(100, 16).unwrap());
    let held = m.pool.capacity();
    assert_eq!(held, 4 * MIB);
    drop(first);
    until("the link sees the authority gone", 5, || !m.link.connected());
    // Grants inside what it holds go on.
    drop(m.binding.allocate(100, 16).unwrap());
    let second = authority(&path, 16 * MIB);
    until("the link joins the new authority", 5, || m.link.connected());
    until("the new books hold what the member holds", 5, || leased_by(&second, std::process::id()).is_some());
    assert_eq!(leased_by(&second, std::process::id()), Some(m.pool.capacity()));
    assert!(m.pool.capacity() <= held);
    second.books().check().unwrap();
    drop(kept);
}

#[test]
fn tickets_go_only_to_members_of_equal_or_lower_priority_and_carry_the_request() {
    let path = socket("prio");
    let a = authority(&path, 8 * MIB);
    // Declared at 7, holding 6 MiB its holder (priority 0) may evict.
    let held = member(&path, 7, false);
    for _ in 0..6 {
        let b = held.binding.allocate(MIB, 64).unwrap();
        held.cached.lock().unwrap().push(b);
    }
    // Declared at 3: it may press nobody above 3, so the 4 MiB it wants
    // (2 free) are refused, and the refusal says who was not asked.
    let low = member_with(&path, 3, false, Priority(3), Duration::from_millis(200), AllocationClass::Kv, 0);
    let err = low.binding.allocate(4 * MIB, 64).unwrap_err();
    assert!(err.to_string().contains("out of budget"), "{err}");
    let why = low.link.last_error().unwrap_or_default();
    assert!(why.contains("1 member(s) of priority above 3 not asked"), "{why}");
    assert!(held.tickets.lock().unwrap().is_empty(), "a higher priority was pressed");
    // Declared at 9 with its requests at 9: it presses the member at 7,
    // whose holder sees the request's class and (capped) priority.
    let high = member_with(&path, 9, false, Priority(9), Duration::from_secs(3), AllocationClass::Kv, 0);
    let big = high.binding.allocate(4 * MIB, 64).expect("the member at 7 gave way");
    let seen = held.tickets.lock().unwrap().clone();
    assert!(!seen.is_empty() && seen.iter().all(|t| *t == (AllocationClass::Kv, Priority(9))), "{seen:?}");
    // A process presses no harder than it declared, whatever its request.
    let books = a.books();
    let low_id = *books.members.iter().find(|(_, m)| m.priority.get("cpu0") == Some(&3)).unwrap().0;
    assert_eq!(books.pressing_priority(low_id, "cpu0", u32::MAX), 3);
    a.books().check().unwrap();
    drop(big);
}

/// Members declare the classes of memory they hold, and a request presses
/// those of its own class first, then the others: two child processes of
/// one priority, one holding KV (declared KV) and one weights (declared
/// weights); a weights request is paid by the weights child alone, a KV
/// request by the KV child alone, and a request of a class nobody declared
/// (activations) still gets room, from whoever holds it (classes order
/// tickets, they never exclude). The status shows each member's classes.
#[test]
fn tickets_go_first_to_members_that_declared_the_request_class() {
    let path = socket("class");
    let a = authority(&path, 32 * MIB);
    let mut kv = child("scenario_kv_holder", &path);
    let mut weights = child("scenario_weights_holder", &path);
    let tickets_to = |pid: u32| {
        a.books().members.values().find(|m| m.pid == pid as i32).map(|m| m.tickets_received).unwrap()
    };
    assert!(leased_by(&a, kv.id()).unwrap() >= 12 * MIB);
    assert!(leased_by(&a, weights.id()).unwrap() >= 12 * MIB);
    let kp = kv.id() as i32;
    let json = a.status_json();
    assert!(json.contains(r#""classes":{"cpu0":["kv"]}"#), "{json}");
    let prom = a.status_prometheus();
    assert!(prom.contains(&format!(r#"memplug_node_member_class{{pid="{kp}",device="cpu0",class="kv"}} 1"#)));
    let requester = |class: AllocationClass| {
        member_with(&path, 0, false, Priority(0), Duration::from_secs(5), class, 1 << class as u8)
    };
    // Weights: 12 MiB do not fit in what is free (at most 8).
    let w = requester(AllocationClass::Weights);
    let w_big = w.binding.allocate(12 * MIB, 64).expect("the weights child gave way");
    assert!(tickets_to(weights.id()) >= 1, "the weights child was not asked");
    assert_eq!(
        tickets_to(kv.id()),
        0,
        "a weights request pressed the KV child while the weights child could pay"
    );
    // KV: the KV child pays.
    let before = tickets_to(weights.id());
    let k = requester(AllocationClass::Kv);
    let k_big = k.binding.allocate(4 * MIB, 64).expect("the KV child gave way");
    assert!(tickets_to(kv.id()) >= 1, "the KV child was not asked");
    assert_eq!(
        tickets_to(weights.id()),
        before,
        "a KV request pressed the weights child while the KV child could pay"
    );
    // Activations, which nobody declared: still served, by pressing the
    // others.
    let act = requester(AllocationClass::Activations);
    let act_big = act.binding.allocate(4 * MIB, 64).expect("a class nobody declared is still served");
    a.books().check().unwrap();
    drop((w_big, k_big, act_big));
    for c in [&mut kv, &mut weights] {
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
}

#[test]
fn a_capacity_lowered_for_a_request_asks_only_holders_at_or_below_its_priority() {
    let mgr = ProcessMemoryManager::new();
    let pool = mgr.create_pool("p", 4 * MIB).unwrap();
    let asked: Arc<Mutex<Vec<(u32, AllocationClass, Priority)>>> = Arc::default();
    let (a1, a5) = (asked.clone(), asked.clone());
    let g1 = pool.try_reserve(MIB, AllocationClass::Other, None).unwrap();
    let l1 = g1.commit(MIB).unwrap();
    let _h1 = pool.register_holder("low", Priority(1), move |t: &PressureTicket| {
        a1.lock().unwrap().push((1, t.class, t.priority));
        0
    });
    let _h5 = pool.register_holder("high", Priority(5), move |t: &PressureTicket| {
        a5.lock().unwrap().push((5, t.class, t.priority));
        0
    });
    let r = pool.set_capacity_for(0, AllocationClass::Weights, Priority(3), None);
    assert!(r.is_err(), "nothing was released");
    assert_eq!(*asked.lock().unwrap(), vec![(1, AllocationClass::Weights, Priority(3))]);
    pool.release(l1).unwrap();
}

fn raw(path: &PathBuf) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn reply(s: &mut UnixStream) -> Msg {
    match wire::read_frame(s).unwrap() {
        Frame::Msg(m) => m,
        other => panic!("no reply: {other:?}"),
    }
}

#[test]
fn bad_messages_are_refused_with_a_reason_and_the_authority_stays_up() {
    let path = socket("bad");
    let a = authority(&path, 16 * MIB);
    let mut s = raw(&path);
    // An unknown kind, then a truncated Lease, then a Lease before Hello.
    s.write_all(&[1, 0, 0, 0, 200]).unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("unknown message kind 200")));
    s.write_all(&[3, 0, 0, 0, 2, 1, 0]).unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("truncated")));
    wire::write_msg(
        &mut s,
        &Msg::Lease { req: 1, device: "cpu0".into(), min: 1, want: 1, wait_ms: 0, class: 4, priority: 0 },
    )
    .unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("Hello must come first")));
    // A member of protocol 2 (no classes in its Hello) is told why and
    // closed.
    let mut old = raw(&path);
    wire::write_msg(&mut old, &Msg::Hello { version: 2, devices: Vec::new() }).unwrap();
    let why = format!("protocol 2; this node speaks {}", wire::VERSION);
    assert!(matches!(reply(&mut old), Msg::Error { reason } if reason == why));
    assert!(matches!(wire::read_frame(&mut old), Ok(Frame::Closed) | Err(_)));
    // Joined: an answer to no ticket, a return of more than it holds, a
    // lease on a device the node does not govern.
    let hello = Msg::Hello {
        version: wire::VERSION,
        devices: vec![wire::Declared { device: "cpu0".into(), priority: 0, classes: 0, holding: 0 }],
    };
    wire::write_msg(&mut s, &hello).unwrap();
    assert!(matches!(reply(&mut s), Msg::Welcome { chunk, .. } if chunk == MIB));
    wire::write_msg(&mut s, &Msg::Answer { ticket: 77, released: MIB }).unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("no ticket 77")));
    wire::write_msg(&mut s, &Msg::Return { device: "cpu0".into(), bytes: MIB }).unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("holds 0 B")));
    wire::write_msg(
        &mut s,
        &Msg::Lease { req: 2, device: "gpu9".into(), min: 1, want: 1, wait_ms: 0, class: 4, priority: 0 },
    )
    .unwrap();
    assert!(matches!(reply(&mut s), Msg::Refused { reason, .. } if reason.contains("no device \"gpu9\"")));
    // An oversized frame: refused and the connection closed.
    s.write_all(&(wire::MAX_FRAME + 1).to_le_bytes()).unwrap();
    assert!(matches!(reply(&mut s), Msg::Error { reason } if reason.contains("the most is")));
    assert!(matches!(wire::read_frame(&mut s), Ok(Frame::Closed) | Err(_)));
    // Still serving, and nothing was leased by any of it.
    let m = member(&path, 0, false);
    drop(m.binding.allocate(MIB, 64).unwrap());
    assert_eq!(
        a.books().devices["cpu0"].leased,
        leased_by(&a, std::process::id()).unwrap_or(0)
            + a.books()
                .members
                .values()
                .filter(|x| x.pid != std::process::id() as i32)
                .map(|x| x.leased.values().sum::<u64>())
                .sum::<u64>()
    );
    a.books().check().unwrap();
}
