//! `memplug node demo`: two processes on one budget, a person can watch.
//!
//! This process is an inference server (and serves the node authority:
//! 48 MiB of `cpu0` in 2 MiB chunks). It loads 6 expert shards of 4 MiB as
//! regions (offloadable: they can come back at the same address) and
//! 8 MiB of KV, its pool joined to the node at priority 1. Then a trainer
//! starts — this program again, `memplug node demo-trainer`, a process of
//! its own, joined at priority 5 — and allocates 24 MiB of activations in
//! four steps. The node has too little free: it sends pressure tickets to
//! the server, whose experts holder (priority 1) offloads cold shards to
//! host memory; the KV holder (priority 10, above the trainer's) is never
//! asked. The bytes released become the trainer's leases. When the
//! trainer lets go and exits, the server restores every shard at the same
//! address, bytes intact, on budget leased back from the node. The ledger
//! of each process and of the authority balances at the end.
//!
//! Text, `--json` (one document) and `--plot FILE.svg` (node_demo_plot.rs).
//! Exits 1 if a check fails.

use crate::exit;
use memplug_host::governor::{AllocationClass, PressureTicket, Priority};
use memplug_host::{
    BindingSpec, LoadOptions, MemoryBinding, OwnedAllocation, Plugin, ProcessMemoryManager, Region,
    Requirements, Residence, Stream,
};
use memplug_node::{Authority, AuthorityConfig, LinkDevice, LinkOptions, NodeLink};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(crate) const MIB: u64 = 1 << 20;
const NODE_CAPACITY: u64 = 48 * MIB;
const CHUNK: u64 = 2 * MIB;
const EXPERTS: usize = 6;
const SHARD: u64 = 4 * MIB;
const KV_BLOCKS: usize = 4;
const KV_BLOCK: u64 = 2 * MIB;
const TRAINER_STEPS: usize = 4;
const TRAINER_STEP: u64 = 6 * MIB;
const WAIT: Duration = Duration::from_secs(5);
const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn mib(b: u64) -> String {
    if b % MIB == 0 {
        format!("{} MiB", b / MIB)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}

/// One line of the timeline: when, who, what.
#[derive(Clone)]
pub(crate) struct Event {
    pub ms: f64,
    pub who: &'static str,
    pub what: String,
}

/// One sample of the figures the chart draws (bytes).
#[derive(Clone, Copy, Default)]
pub(crate) struct Sample {
    pub ms: f64,
    /// What the server's pool holds (its lease) and uses.
    pub server_leased: u64,
    pub server_used: u64,
    /// Expert bytes on the device, and the host copies of offloaded ones.
    pub experts_device: u64,
    pub host_copies: u64,
    /// What the authority counts as the trainer's.
    pub trainer_leased: u64,
    /// The node's leased bytes in all.
    pub node_leased: u64,
}

struct Recorder {
    start: Instant,
    events: Mutex<Vec<Event>>,
    quiet: bool,
}

impl Recorder {
    fn log(&self, who: &'static str, what: String) {
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        if !self.quiet {
            println!("{ms:8.1} ms  {who:<8} {what}");
        }
        lock(&self.events).push(Event { ms, who, what });
    }
}

/// The server's experts: regions it offloads, in order, when the node
/// asks it for room.
struct Experts {
    shards: Mutex<Vec<Region>>,
    host: MemoryBinding,
    stream: Stream,
    rec: Arc<Recorder>,
}

impl Experts {
    fn on_ticket(&self, t: &PressureTicket) -> u64 {
        let mut released = 0;
        let mut shards = lock(&self.shards);
        for (i, shard) in shards.iter_mut().enumerate() {
            if released >= t.bytes_wanted {
                break;
            }
            if shard.residence() != Residence::Device {
                continue;
            }
            match shard.offload_to(&self.host, &self.stream, WAIT) {
                Ok(r) => {
                    released += r.released;
                    self.rec.log(
                        "server",
                        format!(
                            "ticket from the node ({} wanted for class {} at priority {}) → expert {i} offloaded to \
                             host memory: {} released, its address {:#x} kept",
                            mib(t.bytes_wanted),
                            t.class.name(),
                            t.priority.0,
                            mib(r.released),
                            shard.addr()
                        ),
                    );
                }
                Err(e) => self.rec.log("server", format!("expert {i}: offload refused: {e}")),
            }
        }
        released
    }

    /// Expert bytes on the device now (None while the holder is busy).
    fn on_device(&self) -> Option<u64> {
        let shards = self.shards.try_lock().ok()?;
        Some(shards.iter().filter(|s| s.residence() == Residence::Device).count() as u64 * SHARD)
    }
}

fn manager() -> Result<(ProcessMemoryManager, Arc<memplug_host::Context>), String> {
    let mgr = ProcessMemoryManager::new();
    // SAFETY: the reference CPU plugin linked into this program, built
    // against this ABI.
    let cpu =
        unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }
            .map_err(|e| e.to_string())?;
    mgr.register_plugin(cpu).map_err(|e| e.to_string())?;
    let ctx = mgr.select(CPU0, Requirements::ALLOCATOR_ONLY).map_err(|e| e.to_string())?;
    Ok((mgr, ctx))
}

/// `memplug node demo-trainer --socket P`: the trainer's process. Prints
/// one JSON line per step, then its own ledger, and exits.
pub fn trainer(socket: &Path) -> u8 {
    match trainer_run(socket) {
        Ok(()) => exit::OK,
        Err(e) => {
            println!("{}", json!({ "event": "error", "what": e }));
            exit::FAILED
        }
    }
}

fn trainer_run(socket: &Path) -> Result<(), String> {
    let (mgr, ctx) = manager()?;
    let pool = mgr.create_pool("cpu0", 0).map_err(|e| e.to_string())?;
    let dev = LinkDevice { device: "cpu0".into(), pool: pool.clone(), priority: 5, classes: 0 };
    let link = NodeLink::join(socket, vec![dev], LinkOptions::default()).map_err(|e| e.to_string())?;
    let b = mgr
        .bind(&ctx, &pool, BindingSpec::new(AllocationClass::Activations).wait(WAIT))
        .map_err(|e| e.to_string())?;
    let say = |v: serde_json::Value| {
        println!("{v}");
        let _ = std::io::stdout().flush();
    };
    let (mut allocated, mut freed) = (0u64, 0u64);
    let mut held: Vec<OwnedAllocation> = Vec::new();
    for step in 0..TRAINER_STEPS {
        let a = b.allocate(TRAINER_STEP, 4096).map_err(|e| format!("step {step}: {e}"))?;
        // Every page written: the memory is really used.
        // SAFETY: CPU memory this allocation owns, just allocated.
        unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0xAC, TRAINER_STEP as usize) };
        allocated += a.charged();
        held.push(a);
        say(json!({"event": "step", "step": step, "bytes": TRAINER_STEP, "held": pool.capacity()}));
    }
    std::thread::sleep(Duration::from_millis(150));
    for a in held.drain(..) {
        freed += a.charged();
    }
    say(json!({"event": "released", "bytes": freed}));
    // The link gives the idle budget back on its tick; leaving gives the
    // rest.
    std::thread::sleep(Duration::from_millis(60));
    let stats = link.stats();
    drop(link);
    say(json!({
        "event": "ledger", "allocated": allocated, "freed": freed, "used": pool.used(),
        "leased": stats.bytes_leased, "returned": stats.bytes_returned,
    }));
    Ok(())
}

/// The arguments of `memplug node demo`.
pub struct Args {
    pub json: bool,
    pub plot: Option<PathBuf>,
}

struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// `memplug node demo [--json] [--plot FILE.svg]`.
pub fn run(args: Args) -> u8 {
    let dir = std::env::temp_dir().join(format!("memplug-nd-{}", std::process::id()));
    let r = std::fs::create_dir_all(&dir).map_err(|e| e.to_string()).and_then(|()| demo(&dir, &args));
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(true) => exit::OK,
        Ok(false) => exit::FAILED,
        Err(e) => {
            eprintln!("memplug node demo: {e}");
            if args.json {
                let counts = json!({"events": 0, "samples": 0, "checks": 0, "failed": 0});
                let doc = crate::schema::CouldNotRun::new(crate::schema::NODE_DEMO, &e, counts);
                if let Ok(text) = crate::schema::to_json(&doc) {
                    print!("{text}");
                }
            }
            exit::COULD_NOT_RUN
        }
    }
}

fn demo(dir: &Path, args: &Args) -> Result<bool, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let socket = dir.join("n.sock");
    let rec = Arc::new(Recorder { start: Instant::now(), events: Mutex::default(), quiet: args.json });
    let mut config = AuthorityConfig::new(&socket, vec![("cpu0".into(), NODE_CAPACITY)]);
    config.chunk = CHUNK;
    // A fresh node: no members of a previous one to wait for.
    config.rejoin_grace = Duration::from_millis(1);
    let authority = Authority::start(config).map_err(|x| e(&x))?;
    rec.log("node", format!("authority: cpu0 = {} in chunks of {}", mib(NODE_CAPACITY), mib(CHUNK)));

    // The server: experts (priority 1, offloadable) and KV (priority 10,
    // never given up), its pool's capacity leased from the node.
    let (mgr, ctx) = manager()?;
    let pool = mgr.create_pool("cpu0", 0).map_err(|x| e(&x))?;
    let host_pool = mgr.create_pool("host", 64 * MIB).map_err(|x| e(&x))?;
    let host = mgr.bind(&ctx, &host_pool, BindingSpec::new(AllocationClass::Weights)).map_err(|x| e(&x))?;
    let sync = ctx.mechanism().sync().ok_or("the cpu mechanism has no sync capability")?;
    let link = NodeLink::join(
        &socket,
        vec![LinkDevice { device: "cpu0".into(), pool: pool.clone(), priority: 1, classes: 0 }],
        LinkOptions::default(),
    )
    .map_err(|x| e(&x))?;
    let experts = Arc::new(Experts {
        shards: Mutex::default(),
        host,
        stream: sync.stream_create().map_err(|x| e(&x))?,
        rec: rec.clone(),
    });
    let x = experts.clone();
    let experts_holder = pool.register_holder("experts", Priority(1), move |t| x.on_ticket(t));
    let kv_asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let k = kv_asked.clone();
    let kv_holder = pool.register_holder("kv", Priority(10), move |_| {
        k.fetch_add(1, SeqCst);
        0
    });
    let wb = mgr
        .bind(&ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(experts_holder.id()).wait(WAIT))
        .map_err(|x| e(&x))?;
    let kvb = mgr
        .bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(kv_holder.id()).wait(WAIT))
        .map_err(|x| e(&x))?;
    let mut addrs = vec![];
    for i in 0..EXPERTS {
        let mut r = wb.reserve_virtual(SHARD).map_err(|x| e(&x))?;
        r.grow_to(SHARD, |v| {
            // SAFETY: CPU memory just committed writable, this region's alone.
            unsafe { std::ptr::write_bytes(v.addr as *mut u8, 0xE0 + i as u8, v.len as usize) };
            Ok::<(), String>(())
        })
        .map_err(|x| e(&x))?;
        addrs.push(r.addr());
        lock(&experts.shards).push(r);
    }
    let kv: Vec<OwnedAllocation> =
        (0..KV_BLOCKS).map(|_| kvb.allocate(KV_BLOCK, 4096)).collect::<Result<_, _>>().map_err(|x| e(&x))?;
    rec.log(
        "server",
        format!(
            "loaded {EXPERTS} experts of {} (regions) and {} of KV: holds {} leased from the node",
            mib(SHARD),
            mib(KV_BLOCK * KV_BLOCKS as u64),
            mib(pool.capacity())
        ),
    );

    // The figures over time, for the chart and --json.
    let trainer_pid = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pool, host_pool, experts, samples, stop, pid, rec) = (
            pool.clone(),
            host_pool.clone(),
            experts.clone(),
            samples.clone(),
            stop.clone(),
            trainer_pid.clone(),
            rec.clone(),
        );
        let books = authority_books(&authority);
        std::thread::spawn(move || {
            let mut last = Sample::default();
            while !stop.load(SeqCst) {
                let (node_leased, trainer_leased) = books(pid.load(SeqCst));
                last = Sample {
                    ms: rec.start.elapsed().as_secs_f64() * 1e3,
                    server_leased: pool.capacity(),
                    server_used: pool.used(),
                    experts_device: experts.on_device().unwrap_or(last.experts_device),
                    host_copies: host_pool.used(),
                    trainer_leased,
                    node_leased,
                };
                lock(&samples).push(last);
                std::thread::sleep(Duration::from_millis(4));
            }
        })
    };

    // The trainer, a process of its own.
    let exe = std::env::current_exe().map_err(|x| e(&x))?;
    let mut child = Command::new(exe)
        .args(["node", "demo-trainer", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|x| format!("cannot start the trainer: {x}"))?;
    let tpid = child.id();
    trainer_pid.store(tpid as i32, SeqCst);
    rec.log(
        "trainer",
        format!(
            "started (pid {tpid}), joined at priority 5: 4 steps of {} of activations",
            mib(TRAINER_STEP)
        ),
    );
    let mut ledger = serde_json::Value::Null;
    let mut trainer_error = None;
    for l in BufReader::new(child.stdout.take().ok_or("no trainer stdout")?).lines().map_while(Result::ok) {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or(json!({ "event": "text", "what": l }));
        match v["event"].as_str() {
            Some("step") => rec.log(
                "trainer",
                format!(
                    "step {}: {} allocated; holds {}",
                    v["step"],
                    mib(TRAINER_STEP),
                    mib(v["held"].as_u64().unwrap_or(0))
                ),
            ),
            Some("released") => {
                rec.log("trainer", format!("lets go of {}", mib(v["bytes"].as_u64().unwrap_or(0))))
            }
            Some("ledger") => ledger = v,
            _ => trainer_error = Some(l),
        }
    }
    let status = child.wait().map_err(|x| e(&x))?;
    rec.log("trainer", format!("exited ({status})"));
    let end = Instant::now() + Duration::from_secs(3);
    while authority.books().members.values().any(|m| m.pid == tpid as i32) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let trainer_reclaimed = !authority.books().members.values().any(|m| m.pid == tpid as i32);

    // The server brings its experts back, at the same addresses.
    let mut restored = 0;
    let mut same = true;
    {
        let mut shards = lock(&experts.shards);
        for (i, r) in shards.iter_mut().enumerate() {
            if r.residence() == Residence::Device {
                continue;
            }
            let fence = r.restore(&experts.stream).map_err(|x| format!("restore of expert {i}: {x}"))?;
            let done = fence.wait(WAIT).unwrap_or(false);
            // SAFETY: the restored region's bytes, read after its fence.
            let intact = done
                && unsafe { std::slice::from_raw_parts(r.addr() as *const u8, SHARD as usize) }
                    .iter()
                    .all(|b| *b == 0xE0 + i as u8);
            same &= intact && r.addr() == addrs[i];
            restored += 1;
            rec.log(
                "server",
                format!(
                    "expert {i} restored at {:#x} (same address: {}), bytes intact: {intact}",
                    r.addr(),
                    r.addr() == addrs[i]
                ),
            );
        }
    }
    mgr.poll();
    std::thread::sleep(Duration::from_millis(40));
    stop.store(true, SeqCst);
    let _ = sampler.join();

    // The ledgers.
    let books = authority.books();
    let me = std::process::id() as i32;
    let server_leased = books
        .members
        .values()
        .find(|m| m.pid == me)
        .map_or(0, |m| m.leased.get("cpu0").copied().unwrap_or(0));
    let server_member = books.members.values().find(|m| m.pid == me).cloned().unwrap_or_default();
    let stats = link.stats();
    let mut checks = vec![];
    let mut check = |name, ok, detail: String| checks.push(Check { name, ok, detail });
    let allocated = ledger["allocated"].as_u64().unwrap_or(0);
    check(
        "pressure crossed the process boundary",
        trainer_error.is_none() && allocated == TRAINER_STEPS as u64 * TRAINER_STEP && stats.tickets_answered >= 1 && restored >= 1,
        format!(
            "the trainer got {} of {}; the server answered {} ticket(s), released {}, offloaded {restored} expert(s)",
            mib(allocated),
            mib(TRAINER_STEPS as u64 * TRAINER_STEP),
            stats.tickets_answered,
            mib(stats.bytes_released)
        ),
    );
    check(
        "KV (priority 10, above the trainer's 5) was never asked",
        kv_asked.load(SeqCst) == 0,
        format!("KV holder asked {} time(s)", kv_asked.load(SeqCst)),
    );
    check(
        "experts restored at the same addresses, bytes intact",
        same && host_pool.used() == 0,
        format!("{restored} restored; host copies left: {}", mib(host_pool.used())),
    );
    check(
        "the trainer's ledger balances",
        ledger["allocated"] == ledger["freed"] && ledger["used"] == 0 && trainer_reclaimed,
        format!(
            "allocated {}, freed {}, its leases reclaimed by the node: {trainer_reclaimed}",
            ledger["allocated"], ledger["freed"]
        ),
    );
    let used_now = EXPERTS as u64 * SHARD + KV_BLOCKS as u64 * KV_BLOCK;
    check(
        "the server's ledger balances",
        server_leased == pool.capacity() && pool.used() == used_now,
        format!(
            "node counts {} for the server, its pool holds {}, uses {} (experts {} + KV {})",
            mib(server_leased),
            mib(pool.capacity()),
            mib(pool.used()),
            mib(EXPERTS as u64 * SHARD),
            mib(KV_BLOCKS as u64 * KV_BLOCK)
        ),
    );
    check(
        "the node's books are exact",
        books.check().is_ok()
            && books.devices["cpu0"].leased <= NODE_CAPACITY
            && server_member.tickets_answered >= 1,
        format!(
            "leased {} of {} (the sum of its members'), tickets answered by the server {}",
            mib(books.devices["cpu0"].leased),
            mib(NODE_CAPACITY),
            server_member.tickets_answered
        ),
    );
    // Teardown: everything freed and given back; the node ends at zero.
    drop(kv);
    drop(experts_holder);
    drop(kv_holder);
    lock(&experts.shards).clear();
    mgr.poll();
    drop(link);
    let end = Instant::now() + Duration::from_secs(3);
    while authority.books().devices["cpu0"].leased != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let final_leased = authority.books().devices["cpu0"].leased;
    check(
        "the node ends at zero",
        final_leased == 0 && pool.used() == 0,
        format!("leased {} after the server left", mib(final_leased)),
    );

    let ok = checks.iter().all(|c| c.ok);
    let events = lock(&rec.events).clone();
    let samples = lock(&samples).clone();
    let mut plot_ok = true;
    if let Some(path) = &args.plot {
        match crate::node_demo_plot::svg(&samples, &events, NODE_CAPACITY)
            .and_then(|svg| std::fs::write(path, svg).map_err(|x| x.to_string()))
        {
            Ok(()) => {}
            Err(x) => {
                eprintln!("memplug node demo: cannot write the chart {}: {x}", path.display());
                plot_ok = false;
            }
        }
    }
    if args.json {
        let failed = checks.iter().filter(|c| !c.ok).count();
        let doc = json!({
            "schema_version": crate::schema::NODE_DEMO,
            "counts": {"events": events.len(), "samples": samples.len(), "checks": checks.len(), "failed": failed},
            "scenario": "node: an inference server and a trainer on one 48 MiB budget",
            "events": events.iter().map(|e| json!({"ms": e.ms, "who": e.who, "what": e.what})).collect::<Vec<_>>(),
            "samples": samples.iter().map(|s| json!({
                "ms": s.ms, "server_leased": s.server_leased, "server_used": s.server_used,
                "experts_device": s.experts_device, "host_copies": s.host_copies,
                "trainer_leased": s.trainer_leased, "node_leased": s.node_leased,
            })).collect::<Vec<_>>(),
            "ledger": {
                "node": {"capacity": NODE_CAPACITY, "leased_at_end": final_leased, "books_exact": books.check().is_ok()},
                "server": {"leased": server_leased, "tickets_answered": stats.tickets_answered, "bytes_released": stats.bytes_released, "restored": restored},
                "trainer": ledger,
            },
            "checks": checks.iter().map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail})).collect::<Vec<_>>(),
            "ok": ok && plot_ok,
        });
        print!("{}", crate::schema::to_json(&doc).map_err(|x| x.to_string())?);
    } else {
        println!();
        for c in &checks {
            println!("{} {}: {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
        }
    }
    Ok(ok && plot_ok)
}

/// Reads the node's leased bytes and a member's (by pid) from the books.
fn authority_books(a: &Authority) -> impl Fn(i32) -> (u64, u64) + Send + 'static {
    let a = a.view();
    move |pid| {
        let b = a.books();
        let t = b
            .members
            .values()
            .find(|m| m.pid == pid && pid != 0)
            .map_or(0, |m| m.leased.get("cpu0").copied().unwrap_or(0));
        (b.devices["cpu0"].leased, t)
    }
}
