//! Bandwidth of `Peer::pull_into_region` between two processes, against
//! `ucx_perftest -t ucp_get` on the same transports in the same run.
//!
//! ```text
//! cargo run --release -p memplug-ucx --example bandwidth
//! ```
//!
//! For each transport set (TCP on loopback with peer-failure handling;
//! shared memory without), this process pulls 1, 16 and 256 MiB from a
//! child (this executable again) into a region of its own pool, one get at
//! a time, then runs `ucx_perftest` (server and client) with the same
//! `UCX_TLS`, message size and iterations (`-e` where peer-failure handling
//! is on), and prints both bandwidths (MiB/s, as ucx_perftest counts) and
//! their ratio. The CPU plugin is found next to the example
//! (`MEMPLUG_CPU_PLUGIN` overrides).

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, LoadOptions, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_ucx::{Access, ErrorHandling, Peer, Ucx};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const SIZES: [(u64, u32); 3] = [(MIB, 200), (16 * MIB, 30), (256 * MIB, 4)];
const TIMEOUT: Duration = Duration::from_secs(60);
/// Runs per figure (the best is kept: the machine is shared).
const REPEATS: u32 = 2;

struct Net {
    name: &'static str,
    tls: &'static str,
    mode: ErrorHandling,
}

const NETS: [Net; 2] = [
    Net { name: "tcp (lo), peer-failure handling", tls: "tcp", mode: ErrorHandling::Peer },
    Net { name: "shared memory (posix,cma)", tls: "posix,cma,self", mode: ErrorHandling::None },
];

fn main() {
    if let Err(e) = Ucx::available() {
        eprintln!("bandwidth: {e}");
        std::process::exit(2);
    }
    if let Ok(i) = std::env::var("MEMPLUG_UCX_BENCH_CHILD") {
        child(&NETS[i.parse::<usize>().unwrap()]);
        return;
    }
    println!(
        "{:<34} {:>8} {:>6} {:>12} {:>14} {:>7}",
        "transport", "size", "iters", "memplug MiB/s", "perftest MiB/s", "ratio"
    );
    // MEMPLUG_UCX_BENCH_NET=<i>: only that transport set.
    let only: Option<usize> = std::env::var("MEMPLUG_UCX_BENCH_NET").ok().and_then(|n| n.parse().ok());
    for (i, net) in NETS.iter().enumerate().filter(|(i, _)| only.is_none_or(|o| o == *i)) {
        // For each size, this side's runs and ucx_perftest's run back to
        // back, so both meet the same load on a shared machine; each figure
        // is the best of `REPEATS` runs.
        pull(i, net, |size, iters, mine| {
            let theirs = (0..REPEATS).filter_map(|_| perftest(net, size, iters)).reduce(f64::max);
            let ratio = theirs.map(|t| format!("{:.2}", mine / t)).unwrap_or_else(|| "-".into());
            let theirs = theirs.map(|t| format!("{t:.0}")).unwrap_or_else(|| "failed".into());
            println!(
                "{:<34} {:>5} MiB {:>6} {:>12.0} {:>14} {:>7}",
                net.name,
                size / MIB,
                iters,
                mine,
                theirs,
                ratio
            );
        });
    }
}

fn tls(net: &Net) -> String {
    std::env::var("MEMPLUG_UCX_BENCH_TLS").unwrap_or_else(|_| net.tls.into())
}

fn ucx(net: &Net) -> Ucx {
    let tls = tls(net);
    let mut s = vec![("TLS", tls.as_str())];
    if tls.contains("tcp") {
        s.push(("NET_DEVICES", "lo"));
    }
    Ucx::with_config(&s).expect("UCX context")
}

fn plugin() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMPLUG_CPU_PLUGIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    for p in [dir.join("deps/libmemplug_plugin_cpu.so"), dir.join("libmemplug_plugin_cpu.so")] {
        if p.is_file() {
            return p;
        }
    }
    panic!("libmemplug_plugin_cpu.so not found near {}: set MEMPLUG_CPU_PLUGIN", exe.display());
}

fn memory(
    capacity: u64,
) -> (ProcessMemoryManager, std::sync::Arc<memplug_host::Context>, memplug_host::MemoryBinding) {
    let manager = ProcessMemoryManager::new();
    manager.load_plugin(plugin(), &LoadOptions::default()).expect("load the CPU plugin");
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let needs = Requirements { virtual_backing: true, shared_mapping: false, sync: false };
    let context = manager.select(cpu0, needs).unwrap();
    let pool = manager.create_pool("bench", capacity).unwrap();
    let kv = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    (manager, context, kv)
}

/// The child: offers 256 MiB of a region and serves until the parent leaves.
fn child(net: &Net) {
    let path = std::env::var_os("MEMPLUG_UCX_BENCH_SOCKET").unwrap();
    let stream = UnixStream::connect(path).unwrap();
    let ucx = ucx(net);
    let mut peer = Peer::connect_with(&ucx, stream, TIMEOUT, net.mode).unwrap();
    let (_m, context, kv) = memory(512 * MIB);
    let mut region = kv.reserve_virtual(256 * MIB).unwrap();
    region.grow_to(256 * MIB, |_| Ok::<(), String>(())).unwrap();
    // SAFETY: committed CPU memory of the region: touch every page once.
    unsafe { std::ptr::write_bytes(region.addr() as *mut u8, 0x5A, (256 * MIB) as usize) };
    let reg = ucx.register_region(&context, &mut region, 0, 256 * MIB, Access::Read).unwrap();
    peer.offer(&reg, 0).unwrap();
    peer.serve(Duration::from_secs(600)).unwrap();
}

/// This side: MiB/s of one get at a time (best of `REPEATS` runs), for
/// each size, handed to `report` with the size and iterations.
fn pull(i: usize, net: &Net, mut report: impl FnMut(u64, u32, f64)) {
    let dir = std::env::temp_dir().join(format!("memplug-ucx-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("control.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("MEMPLUG_UCX_BENCH_CHILD", i.to_string())
        .env("MEMPLUG_UCX_BENCH_SOCKET", &path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (stream, _) = listener.accept().unwrap();
    let ucx = ucx(net);
    let mut peer = Peer::connect_with(&ucx, stream, TIMEOUT, net.mode).unwrap();
    let range = peer.next_offer(TIMEOUT).unwrap();
    let (m, _context, kv) = memory(512 * MIB);
    let mut region = kv.reserve_virtual(256 * MIB).unwrap();
    region.grow_to(256 * MIB, |_| Ok::<(), String>(())).unwrap();
    // SAFETY: committed CPU memory: fault the pages in before timing.
    unsafe { std::ptr::write_bytes(region.addr() as *mut u8, 0, (256 * MIB) as usize) };
    for &(size, iters) in &SIZES {
        // MEMPLUG_UCX_BENCH_CHUNK=<bytes>: each message as gets of that
        // size, all in flight at once (an experiment; default one get).
        let chunk = std::env::var("MEMPLUG_UCX_BENCH_CHUNK")
            .ok()
            .and_then(|c| c.parse::<u64>().ok())
            .unwrap_or(size)
            .min(size);
        // MEMPLUG_UCX_BENCH_WINDOW=<n>: up to n messages in flight (as
        // ucx_perftest keeps several outstanding); default 1.
        let window: usize =
            std::env::var("MEMPLUG_UCX_BENCH_WINDOW").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
        let run = |peer: &mut Peer, region: &mut memplug_host::Region, n: u32| {
            let mut in_flight = std::collections::VecDeque::new();
            for _ in 0..n {
                for i in 0..size / chunk {
                    in_flight.push_back(
                        peer.pull_into_region(region, i * chunk, &range, i * chunk, chunk).unwrap(),
                    );
                }
                while in_flight.len() >= window.max(1) * (size / chunk) as usize {
                    in_flight.pop_front().unwrap().wait(TIMEOUT).unwrap();
                }
            }
            for t in in_flight {
                t.wait(TIMEOUT).unwrap();
            }
        };
        run(&mut peer, &mut region, 2);
        let mut best = 0f64;
        for _ in 0..REPEATS {
            let t = Instant::now();
            run(&mut peer, &mut region, iters);
            let secs = t.elapsed().as_secs_f64();
            best = best.max((size * iters as u64) as f64 / MIB as f64 / secs);
        }
        report(size, iters, best);
    }
    peer.release(&range, TIMEOUT).unwrap();
    drop(peer);
    child.wait().unwrap();
    drop(region);
    m.poll();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ucx_perftest -t ucp_get` overall bandwidth (MiB/s), or `None` when it
/// could not run (the reason printed).
fn perftest(net: &Net, size: u64, iters: u32) -> Option<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port().to_string();
    let (size, iters) = (size.to_string(), iters.to_string());
    let mut args = vec!["-t", "ucp_get", "-s", &size, "-n", &iters, "-w", "2", "-p", &port, "-f"];
    if net.mode == ErrorHandling::Peer {
        args.push("-e");
    }
    let tls = tls(net);
    let env = [("UCX_TLS", tls.as_str()), ("UCX_NET_DEVICES", "lo")];
    let mut server = match Command::new("ucx_perftest")
        .args(&args)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ucx_perftest: {e} (install ucx-utils: scripts/setup.sh test)");
            return None;
        }
    };
    let mut result = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        let out = Command::new("ucx_perftest").arg("127.0.0.1").args(&args).envs(env).output().ok()?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // The last line: iterations, three latencies, bandwidth
            // (average, overall), message rate (average, overall).
            result = text.lines().rev().find_map(|l| l.split_whitespace().nth(5)?.parse::<f64>().ok());
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    result
}
