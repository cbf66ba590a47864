//! The authority without pidfds (`MEMPLUG_NODE_NO_PIDFD=1`: the path a
//! kernel before 5.3 or valgrind 3.19, whose `pidfd_open` is ENOSYS, takes):
//! a member killed with SIGKILL and not yet reaped by its parent (a zombie,
//! which `kill(pid, 0)` still finds) has its leases reclaimed within a
//! bounded time. Its own test binary, so the variable is set before any
//! authority thread runs.

use memplug_node::wire::{self, Declared, Frame, Msg};
use memplug_node::{Authority, AuthorityConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const SOCKET_VAR: &str = "MEMPLUG_NODE_NO_PIDFD_TEST_SOCKET";

/// Scenario: joins declaring 4 MiB held, says ready, waits for stdin to
/// close (it is killed first).
#[test]
#[ignore = "a scenario: run as a child by the test below"]
fn scenario_member() {
    let Some(path) = std::env::var_os(SOCKET_VAR) else { return };
    let mut s = UnixStream::connect(path).unwrap();
    let devices = vec![Declared { device: "cpu0".into(), priority: 0, classes: 0, holding: 4 * MIB }];
    wire::write_msg(&mut s, &Msg::Hello { version: wire::VERSION, devices }).unwrap();
    match wire::read_frame(&mut s).unwrap() {
        Frame::Msg(Msg::Welcome { .. }) => {}
        other => panic!("no Welcome: {other:?}"),
    }
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

#[test]
fn without_pidfds_a_killed_unreaped_member_is_reclaimed_in_bounded_time() {
    std::env::set_var("MEMPLUG_NODE_NO_PIDFD", "1");
    let dir = std::env::temp_dir().join(format!("memplug-node-nopidfd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("node.sock");
    let mut c = AuthorityConfig::new(&path, vec![("cpu0".into(), 16 * MIB)]);
    c.chunk = MIB;
    let a = Authority::start(c).unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["scenario_member", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SOCKET_VAR, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before it was ready");
    }
    let pid = child.id() as i32;
    let member = a.books().members.values().find(|m| m.pid == pid).cloned().expect("the child joined");
    assert_eq!(member.leased.get("cpu0"), Some(&(4 * MIB)));
    assert!(!member.pidfd, "MEMPLUG_NODE_NO_PIDFD=1 watches through /proc");
    assert!(a.status_json().contains("\"pidfd\":false"), "{}", a.status_json());

    // Killed, and not reaped until its leases are back: the authority
    // sees a zombie, which it must count as exited.
    child.kill().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while a.books().members.values().any(|m| m.pid == pid) {
        assert!(Instant::now() < end, "a killed, unreaped member was not reclaimed within 5 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(a.books().devices["cpu0"].leased, 0);
    a.books().check().unwrap();
    child.wait().unwrap();
}
