//! Shared by the two-process tests: a manager with the real CPU plugin
//! (dlopen'd from the cdylib cargo built), a pool and a KV binding; the
//! child process (this same test executable, re-run on its `child` test
//! with a role in the environment); and the skip when UCX is absent.

#![allow(dead_code)]

use memplug_host::governor::{AllocationClass, Pool};
use memplug_host::{BindingSpec, Context, LoadOptions, MemoryBinding, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_ucx::{ErrorHandling, Peer, Ucx};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub const ROLE: &str = "MEMPLUG_UCX_TEST_ROLE";
const SOCKET: &str = "MEMPLUG_UCX_TEST_SOCKET";
const TLS: &str = "MEMPLUG_UCX_TEST_TLS";
const MODE: &str = "MEMPLUG_UCX_TEST_MODE";
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A transport set and the error handling it goes with.
#[derive(Clone, Copy)]
pub struct Net {
    pub tls: &'static str,
    pub mode: ErrorHandling,
}

/// TCP on loopback, with peer-failure handling.
pub const TCP: Net = Net { tls: "tcp", mode: ErrorHandling::Peer };
/// Shared memory between the processes (`posix`, `cma`; `self` for a
/// process's own loopback). UCX 1.13 selects these only without
/// peer-failure handling (see `ErrorHandling`).
pub const SHM: Net = Net { tls: "posix,cma,self", mode: ErrorHandling::None };

/// `None` (after saying why) when UCX cannot be loaded here.
pub fn ucx_or_skip(test: &str) -> Option<()> {
    match Ucx::available() {
        Ok(()) => Some(()),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

/// A UCX context on `net` (loopback only for TCP).
pub fn ucx(net: Net) -> Ucx {
    ucx_tls(net.tls)
}

fn ucx_tls(tls: &str) -> Ucx {
    let mut settings = vec![("TLS", tls)];
    if tls.contains("tcp") {
        settings.push(("NET_DEVICES", "lo"));
    }
    Ucx::with_config(&settings).expect("UCX context")
}

/// A manager with the CPU plugin loaded from its cdylib, its context, a
/// pool of `capacity` bytes and a KV binding to it.
pub struct Memory {
    pub manager: ProcessMemoryManager,
    pub context: Arc<Context>,
    pub pool: Arc<Pool>,
    pub kv: MemoryBinding,
}

pub fn memory(capacity: u64) -> Memory {
    let manager = ProcessMemoryManager::new();
    let so = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    manager.load_plugin(&so, &LoadOptions::default()).expect("load the CPU plugin");
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let needs = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
    let context = manager.select(cpu0, needs).expect("CPU context");
    let pool = manager.create_pool("kv", capacity).expect("pool");
    let kv = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).expect("bind");
    Memory { manager, context, pool, kv }
}

/// The byte at `i` of a range filled with `seed`'s pattern.
pub fn pattern(seed: u8, i: u64) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 12) as u8)
}

/// Fills `len` bytes at `addr` with `seed`'s pattern.
///
/// # Safety
/// `[addr, +len)` must be writable host memory.
pub unsafe fn fill(addr: u64, len: u64, seed: u8) {
    let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = pattern(seed, i as u64);
    }
}

/// Whether `len` bytes at `addr` hold `seed`'s pattern starting at `from`.
///
/// # Safety
/// `[addr, +len)` must be readable host memory.
pub unsafe fn holds(addr: u64, len: u64, seed: u8, from: u64) -> bool {
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    s.iter().enumerate().all(|(i, b)| *b == pattern(seed, from + i as u64))
}

/// The child process, playing `role` over `tls`, connected to this one.
pub struct ChildPeer {
    pub child: Child,
    pub peer: Peer,
    pub ucx: Ucx,
}

/// Starts this test executable again on its `child` test with `role`, and
/// connects to it (the parent side of the handshake).
pub fn spawn(role: &str, net: Net) -> ChildPeer {
    let dir = memplug_test_support::test_tmp_dir(&format!("ucx-{role}"));
    let path = dir.join("control.sock");
    let listener = UnixListener::bind(&path).expect("bind the control socket");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, &path)
        .env(TLS, net.tls)
        .env(MODE, if net.mode == ErrorHandling::Peer { "peer" } else { "none" })
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let stream = memplug_test_support::fd_passing::accept_child(&listener, &mut child, TIMEOUT, |o| {
        String::from_utf8_lossy(&o.stderr).into_owned()
    });
    let ucx = ucx(net);
    let peer = Peer::connect_with(&ucx, stream, TIMEOUT, net.mode).expect("handshake with the child");
    ChildPeer { child, peer, ucx }
}

/// In the child: its role, the connection to the parent, and the
/// transports, or `None` when this is the ordinary test run.
pub fn child_side() -> Option<(String, Ucx, Peer)> {
    let role = std::env::var(ROLE).ok()?;
    let path = PathBuf::from(std::env::var_os(SOCKET).expect("socket path"));
    let tls = std::env::var(TLS).expect("transports");
    let stream = UnixStream::connect(path).expect("connect to the parent");
    let mode =
        if std::env::var(MODE).as_deref() == Ok("peer") { ErrorHandling::Peer } else { ErrorHandling::None };
    let ucx = ucx_tls(&tls);
    let peer = Peer::connect_with(&ucx, stream, TIMEOUT, mode).expect("handshake with the parent");
    Some((role, ucx, peer))
}

impl ChildPeer {
    /// Waits for the child to exit and asserts it succeeded.
    pub fn join(mut self) {
        drop(self.peer);
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "the child failed: {st}");
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the child did not exit within {TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
