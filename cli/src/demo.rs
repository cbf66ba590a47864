//! `memplug demo`: a scripted LLM-serving scenario on the reference CPU
//! plugin, under a hard budget, that shows every part of memplug at work
//! and checks it against what the kernel says.
//!
//! The story (a few seconds, debug build included):
//!
//! 1. A 64 MiB pool for cpu:0 and two holders: `weights` (priority 1; on a
//!    pressure ticket it evicts its least recently used expert shards) and
//!    `kv` (priority 10; live sequences are never dropped, so it answers 0).
//! 2. Weights load: 2 pinned shards and 8 expert shards of 4 MiB, every page
//!    written.
//! 3. One shared system-prompt prefix (`create_shared`), mapped read-only
//!    into every request's region (`reserve_virtual` + `map_prefix`); each
//!    request decodes token by token, writing each token's KV, and its
//!    region grows by a 2 MiB block (`grow_to`) at a stable address when
//!    the next token does not fit.
//! 4. The budget runs out: growth sends tickets to `weights`, which evicts
//!    cold experts so decoding goes on.
//! 5. A finished request's region is dropped while a host function on a
//!    CPU stream still reads it: the free waits behind a `PluginFence`
//!    (queue pending 1, charge kept), then retires (pending 0, refunded).
//! 6. A request admitted by the scheduler (no holder: it may ask every
//!    holder) asks for more than anyone can give: `weights` gives what it
//!    can, `kv` answers 0, and the grow fails with `OutOfBudget`, leaving
//!    the old view; a smaller retry succeeds.
//! 7. Teardown, drain, a ledger that ends at zero, and the plugin unloads.
//!
//! Next to the governor's figures, the demo measures resident memory
//! through the kernel: `/proc/self/pagemap` page by page over the live
//! objects' address ranges (exact), and `/proc/self/smaps` over the whole
//! process (a delta since the start, with a tolerance). Any failed check
//! makes the command exit non-zero.

use crate::locate;
use memplug_host::governor::{AllocationClass, GovernorError, HolderId, Pool, PressureTicket, Priority};
use memplug_host::{
    BindingError, BindingSpec, GrowError, MemoryBinding, OwnedAllocation, PluginFence, ProcessMemoryManager,
    Region, Requirements, SharedPrefix,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use serde::Serialize;
use std::convert::Infallible;
use std::error::Error;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The pool's hard capacity.
const CAPACITY: u64 = 64 * MIB;
/// One weight shard.
const SHARD: u64 = 4 * MIB;
/// Shards never evicted (the dense part of the model).
const PINNED: [&str; 2] = ["embed+attn", "lm_head"];
/// Evictable expert shards.
const EXPERTS: usize = 8;
/// The shared system-prompt prefix.
const PREFIX: u64 = 2 * MIB;
/// KV bytes per token, and tokens per decode step: one step grows a region
/// by `STEP` bytes (a multiple of any page size up to 2 MiB).
const KV_PER_TOKEN: u64 = 128 * KIB;
const TOKENS_PER_STEP: u64 = 16;
const STEP: u64 = KV_PER_TOKEN * TOKENS_PER_STEP;
/// Address space each request reserves (nothing is committed up front).
const REGION_MAX: u64 = 64 * MIB;
/// Requests decoded round-robin, and their decode steps.
const REQUESTS: usize = 4;
const DECODE_STEPS: usize = 4;
/// The late request's prefill chunks: the first fits after evictions, the
/// second cannot fit (pinned weights and live KV leave too little), the
/// retry does.
const PREFILL: u64 = 16 * MIB;
const PREFILL_TOO_BIG: u64 = 16 * MIB;
const PREFILL_RETRY: u64 = 8 * MIB;
/// How long the host function "still reads" a finished request's KV.
const KERNEL_MS: u64 = 150;
const WEIGHTS_PRIORITY: Priority = Priority(1);
const KV_PRIORITY: Priority = Priority(10);
/// Tolerance between the governor's figure and the process's resident
/// delta from smaps. The delta also holds what memplug does not govern:
/// malloc's header page in front of each weight shard (4 KiB each), the
/// CPU stream's thread stack and malloc arena, the host's own tables and
/// this timeline — measured at 40–90 KiB. 1 MiB leaves room for that on
/// other machines and is still half of the smallest governed object (a
/// 2 MiB decode step or the prefix), so a missed or doubled object fails.
const PROCESS_TOLERANCE: u64 = MIB;

/// One 64-byte line of the system prompt, repeated over the prefix (64
/// divides every page size, so each page holds whole lines).
const SYSTEM_PROMPT: &[u8; 64] = b"<|system|> You are memplug-bot, a helpful assistant. Be brief. \n";

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn signed_mib(b: i64) -> String {
    format!("{}{}", if b < 0 { "-" } else { "" }, mib(b.unsigned_abs()))
}

fn mib(b: u64) -> String {
    if b % MIB == 0 {
        format!("{} MiB", b / MIB)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}

// ----- the report --------------------------------------------------------------

#[derive(Serialize)]
struct Report {
    scenario: Scenario,
    timeline: Vec<Event>,
    measurements: Vec<Measurement>,
    ledger: Ledger,
    checks: Vec<Check>,
    ok: bool,
}

#[derive(Serialize)]
struct Scenario {
    plugin: String,
    mechanism: String,
    device: String,
    page_size: u64,
    pool_capacity: u64,
    weight_shard_bytes: u64,
    pinned_shards: usize,
    expert_shards: usize,
    prefix_bytes: u64,
    kv_step_bytes: u64,
    requests: usize,
    resident_method: &'static str,
    process_method: &'static str,
    process_tolerance: u64,
}

/// One line of the timeline.
#[derive(Serialize, Clone)]
struct Event {
    t_ms: f64,
    /// `setup`, `load`, `prefix`, `admit`, `grow`, `ticket`, `evict`,
    /// `out_of_budget`, `rollback`, `release`, `poll`, `fence`, `retired`,
    /// `finish`, `teardown`, `drain`, `unload`, `measure`.
    kind: &'static str,
    /// Who: a request (`r1`..), a holder, the queue, the plugin.
    subject: String,
    detail: String,
    /// The pool's `used` right after the event.
    pool_used: u64,
}

/// The governor's figures next to the kernel's, at one moment.
#[derive(Serialize)]
struct Measurement {
    label: String,
    governor_used: u64,
    governor_weights: u64,
    governor_kv: u64,
    /// Pages present (pagemap) over the live weight shards.
    resident_weights: Option<u64>,
    /// Pages present over the live KV: the prefix once, and every region's
    /// private part (including one whose free waits for a fence).
    resident_kv: Option<u64>,
    /// Pages swapped out in those ranges (counted as backed, reported).
    swapped: Option<u64>,
    /// Σ smaps (Anonymous + memfd Pss) now, minus the same at the start.
    process_delta: Option<i64>,
    /// `process_delta - governor_used`: what the process holds beyond the
    /// governed bytes.
    process_excess: Option<i64>,
    exact_ok: bool,
    process_ok: bool,
}

#[derive(Serialize)]
struct ClassLine {
    class: &'static str,
    reserved: u64,
    leased: u64,
    quarantined: u64,
    grants: u64,
    failures: u64,
}

#[derive(Serialize)]
struct PoolLine {
    name: String,
    capacity: u64,
    used: u64,
    peak: u64,
    free: u64,
    tickets: u64,
    bytes_wanted: u64,
    bytes_answered: u64,
}

#[derive(Serialize)]
struct HolderLine {
    name: String,
    priority: u32,
    tickets: u64,
    bytes_wanted: u64,
    bytes_answered: u64,
    zero_answers: u64,
    leased: u64,
}

#[derive(Serialize)]
struct QueueLine {
    enqueued: u64,
    immediate: u64,
    retired: u64,
    quarantined: u64,
    pending: usize,
}

#[derive(Serialize)]
struct PluginLine {
    /// Objects the plugin itself reports alive (before the unload).
    live_objects: u64,
    /// Objects the host counts alive, per kind (before the unload).
    host_objects: u64,
    context_pins: u64,
    unloaded: bool,
    unload_error: Option<String>,
}

#[derive(Serialize)]
struct Ledger {
    classes: Vec<ClassLine>,
    pool: PoolLine,
    holders: Vec<HolderLine>,
    queue: QueueLine,
    drain_left: Vec<String>,
    plugin: PluginLine,
    /// The last measurement (after everything was released).
    resident_after: Option<u64>,
    process_delta_after: Option<i64>,
}

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

// ----- the timeline ------------------------------------------------------------

struct Recorder {
    start: Instant,
    pool: Arc<Pool>,
    events: Mutex<Vec<Event>>,
    holders: Mutex<Vec<(HolderId, &'static str)>>,
}

impl Recorder {
    fn log(&self, kind: &'static str, subject: impl Into<String>, detail: impl Into<String>) {
        let e = Event {
            t_ms: (self.start.elapsed().as_secs_f64() * 1e4).round() / 10.0,
            kind,
            subject: subject.into(),
            detail: detail.into(),
            pool_used: self.pool.used(),
        };
        lock(&self.events).push(e);
    }

    fn holder_name(&self, h: Option<HolderId>) -> String {
        match h {
            None => "the scheduler".into(),
            Some(h) => lock(&self.holders)
                .iter()
                .find(|(id, _)| *id == h)
                .map_or_else(|| h.to_string(), |(_, n)| (*n).to_string()),
        }
    }

    fn ticket_text(&self, t: &PressureTicket) -> String {
        let priority =
            if t.priority == Priority::HIGHEST { "highest".to_string() } else { t.priority.to_string() };
        let no_holder = if t.requester.is_none() { "no holder, " } else { "" };
        format!(
            "{} wanted by {} ({no_holder}class {}, priority {priority})",
            mib(t.bytes_wanted),
            self.holder_name(t.requester),
            t.class
        )
    }
}

#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, name: &'static str, ok: bool, detail: impl Into<String>) {
        self.0.push(Check { name, ok, detail: detail.into() });
    }
}

// ----- the weights holder --------------------------------------------------------

struct Shard {
    name: String,
    pinned: bool,
    alloc: OwnedAllocation,
    /// Decode tick (tokens decoded so far) of the last use: LRU order.
    last_used: u64,
}

/// The weights holder: owns the shards; under pressure evicts the least
/// recently used unpinned ones until it released what the ticket wants.
struct Weights {
    shards: Mutex<Vec<Shard>>,
    rec: Arc<Recorder>,
}

impl Weights {
    fn on_ticket(&self, t: &PressureTicket) -> u64 {
        let mut victims = Vec::new();
        let mut released = 0;
        {
            let mut shards = lock(&self.shards);
            while released < t.bytes_wanted {
                let coldest = shards
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.pinned)
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(i, _)| i);
                let Some(i) = coldest else { break };
                let s = shards.remove(i);
                released += s.alloc.charged();
                victims.push(s);
            }
        }
        let answer = if victims.is_empty() {
            "answers 0: only pinned shards left".to_string()
        } else {
            format!("answers {} (evicts {} LRU expert(s))", mib(released), victims.len())
        };
        self.rec.log("ticket", "weights", format!("{} → {answer}", self.rec.ticket_text(t)));
        // Release outside our lock: the drop frees through the plugin and
        // refunds the pool (re-entering the governor is allowed here).
        for v in victims {
            let (name, last, bytes) = (v.name, v.last_used, v.alloc.charged());
            drop(v.alloc);
            self.rec.log(
                "evict",
                "weights",
                format!("{name} freed ({}, last used at token {last})", mib(bytes)),
            );
        }
        released
    }

    /// Marks the shards one token uses (the pinned ones and the router's
    /// choice among the resident experts) and reads a byte of each.
    fn route(&self, tick: u64, request: usize) {
        let mut shards = lock(&self.shards);
        let experts: Vec<usize> = (0..shards.len()).filter(|&i| !shards[i].pinned).collect();
        let mut used: Vec<usize> = (0..shards.len()).filter(|&i| shards[i].pinned).collect();
        if !experts.is_empty() {
            used.push(experts[(tick as usize * 3 + request) % experts.len()]);
        }
        for i in used {
            let s = &mut shards[i];
            s.last_used = tick;
            // SAFETY: a live CPU allocation of at least one byte.
            let _ = unsafe { std::ptr::read_volatile(s.alloc.addr() as *const u8) };
        }
    }

    fn ranges(&self) -> Vec<(u64, u64)> {
        lock(&self.shards).iter().map(|s| (s.alloc.addr(), s.alloc.size())).collect()
    }
}

// ----- requests ------------------------------------------------------------------

struct Request {
    name: String,
    region: Region,
    addr: u64,
    kv_byte: u8,
    /// Tokens whose KV is written.
    tokens: u64,
}

impl Request {
    /// The private (KV) part: after the prefix, up to the usable length.
    fn private_range(&self) -> (u64, u64) {
        let base = self.region.len() - self.region.committed();
        (self.addr + base, self.region.committed())
    }
    fn prefix_range(&self) -> (u64, u64) {
        (self.addr, self.region.len() - self.region.committed())
    }
}

#[derive(Default)]
struct Tally {
    /// Tokens decoded, all requests together (the LRU clock).
    tokens: u64,
    grows: u64,
    stable: u64,
    unstable: Vec<String>,
    prefix_reads: u64,
    prefix_ok: u64,
}

/// Grows `r` by `delta` bytes as one transaction. With `fill`, the update
/// writes `r`'s KV byte into every new page (a prefill chunk); without, the
/// block is left for the tokens that follow.
fn grow(r: &mut Request, delta: u64, fill: bool, tally: &mut Tally) -> Result<(), GrowError<Infallible>> {
    let old = r.region.len();
    let byte = r.kv_byte;
    let mut seen = 0u64;
    r.region.grow_to(old + delta, |view| {
        seen = view.addr;
        if fill {
            // SAFETY: CPU memory; [old, view.len) was just committed
            // writable and belongs to this region alone.
            unsafe {
                std::slice::from_raw_parts_mut((view.addr + old) as *mut u8, (view.len - old) as usize)
            }
            .fill(byte);
        }
        Ok(())
    })?;
    tally.grows += 1;
    if seen == r.addr && r.region.addr() == r.addr {
        tally.stable += 1;
    } else {
        tally.unstable.push(format!("{} moved from {:#x} to {:#x}", r.name, r.addr, r.region.addr()));
    }
    Ok(())
}

/// Decodes `n` tokens one at a time: each token's KV goes right after the
/// previous one's; when the region has no room for it, the region grows by
/// one block of `STEP` bytes first. Returns the blocks grown.
fn decode(
    r: &mut Request,
    n: u64,
    weights: &Weights,
    lane: usize,
    tally: &mut Tally,
) -> Result<u64, GrowError<Infallible>> {
    let mut blocks = 0;
    for _ in 0..n {
        let tick = tally.tokens + 1;
        weights.route(tick, lane);
        let (start, committed) = r.private_range();
        let used = r.tokens * KV_PER_TOKEN;
        if used + KV_PER_TOKEN > committed {
            grow(r, STEP, false, tally)?;
            blocks += 1;
        }
        // SAFETY: CPU memory inside the committed private part of `r`.
        unsafe { std::slice::from_raw_parts_mut((start + used) as *mut u8, KV_PER_TOKEN as usize) }
            .fill(r.kv_byte);
        r.tokens += 1;
        tally.tokens = tick;
    }
    Ok(blocks)
}

/// Scratch comparisons use this stack buffer, never the heap: the heap is
/// part of what the smaps measurement sees.
const CHUNK: usize = 4096;

/// Whether `len` bytes at `addr` repeat `line` (a divisor of `CHUNK`),
/// compared a chunk at a time.
///
/// # Safety
/// The range must be mapped readable.
unsafe fn repeats(addr: u64, len: u64, line: &[u8]) -> bool {
    let mut pattern = [0u8; CHUNK];
    for c in pattern.chunks_mut(line.len()) {
        c.copy_from_slice(line);
    }
    let s = std::slice::from_raw_parts(addr as *const u8, len as usize);
    s.chunks(CHUNK).all(|c| c == &pattern[..c.len()])
}

/// Whether `len` bytes at `addr` all hold `byte`.
///
/// # Safety
/// The range must be mapped readable.
unsafe fn filled_with(addr: u64, len: u64, byte: u8) -> bool {
    repeats(addr, len, &[byte])
}

/// Reads the prefix through `r`'s read-only mapping.
fn prefix_intact(r: &Request) -> bool {
    let (addr, len) = r.prefix_range();
    // SAFETY: mapped read-only for the region's life.
    len == PREFIX && unsafe { repeats(addr, len, SYSTEM_PROMPT) }
}

fn kv_intact(r: &Request) -> bool {
    let (addr, len) = r.private_range();
    // SAFETY: the committed private part of a live region.
    unsafe { filled_with(addr, len, r.kv_byte) }
}

// ----- the kernel's view -----------------------------------------------------------

/// Resident memory as the kernel reports it.
struct Kernel {
    pagemap: Result<File, String>,
    page: u64,
    baseline: Option<u64>,
}

#[derive(Clone, Copy, Default)]
struct Pages {
    present: u64,
    swapped: u64,
}

impl Kernel {
    fn open(fallback_page: u64) -> Kernel {
        let page = smaps_page_size().unwrap_or(fallback_page);
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("/proc/self/pagemap: {e}"));
        let mut k = Kernel { pagemap, page, baseline: None };
        k.baseline = smaps_governable().ok();
        k
    }

    /// Pages present / swapped in `ranges` (bit 63 / bit 62 of each
    /// pagemap entry), in bytes.
    fn pages(&self, ranges: &[(u64, u64)]) -> Result<Pages, String> {
        let f = self.pagemap.as_ref().map_err(Clone::clone)?;
        let mut p = Pages::default();
        for &(addr, len) in ranges {
            if len == 0 {
                continue;
            }
            let first = addr / self.page;
            let end = (addr + len).div_ceil(self.page);
            let mut buf = vec![0u8; ((end - first) * 8) as usize];
            f.read_exact_at(&mut buf, first * 8).map_err(|e| format!("/proc/self/pagemap: {e}"))?;
            for e in buf.chunks_exact(8) {
                let e = u64::from_le_bytes(e.try_into().expect("8 bytes"));
                if e >> 63 & 1 == 1 {
                    p.present += self.page;
                } else if e >> 62 & 1 == 1 {
                    p.swapped += self.page;
                }
            }
        }
        Ok(p)
    }

    /// The process's governable resident bytes now minus at the start.
    fn process_delta(&self) -> Option<i64> {
        let now = smaps_governable().ok()?;
        Some(now as i64 - self.baseline? as i64)
    }
}

fn smaps_page_size() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let line = text.lines().find(|l| l.starts_with("KernelPageSize:"))?;
    kib_field(line)
}

fn kib_field(line: &str) -> Option<u64> {
    let mut it = line.split_whitespace().skip(1);
    let v: u64 = it.next()?.parse().ok()?;
    (it.next() == Some("kB")).then_some(v * KIB)
}

/// Σ over `/proc/self/smaps` of `Anonymous` (private anonymous pages: the
/// weight shards, the KV regions, and the process's own heap and stacks)
/// plus `Pss` of memfd mappings (the shared prefix: mapped into every
/// region, so its `Rss` would count it once per region, while `Pss`
/// divides each page among its mappings and counts it once).
fn smaps_governable() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let mut total = 0;
    let mut memfd = false;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            memfd = line.contains("/memfd:");
        } else if line.starts_with("Anonymous:") || (memfd && line.starts_with("Pss:")) {
            total += kib_field(line).unwrap_or(0);
        }
    }
    Ok(total)
}

// ----- the scenario ------------------------------------------------------------------

struct State<'a> {
    rec: Arc<Recorder>,
    kernel: &'a Kernel,
    pool: Arc<Pool>,
    checks: Checks,
    measurements: Vec<Measurement>,
    tally: Tally,
}

impl State<'_> {
    /// Governor vs kernel now. `kv_ranges` lists the KV address ranges
    /// alive (the prefix once).
    fn measure(&mut self, label: &str, weights: &[(u64, u64)], kv: &[(u64, u64)]) {
        let snap = self.pool.snapshot();
        let gw = snap.class(AllocationClass::Weights).charged();
        let gk = snap.class(AllocationClass::Kv).charged();
        let (rw, rk) = (self.kernel.pages(weights), self.kernel.pages(kv));
        let exact = match (&rw, &rk) {
            (Ok(w), Ok(k)) => Some((*w, *k)),
            _ => None,
        };
        let delta = self.kernel.process_delta();
        let exact_ok = exact.is_none_or(|(w, k)| {
            w.present + w.swapped == gw && k.present + k.swapped == gk && gw + gk == snap.used
        });
        let process_ok = delta.is_none_or(|d| d.abs_diff(snap.used as i64) <= PROCESS_TOLERANCE);
        let m = Measurement {
            label: label.into(),
            governor_used: snap.used,
            governor_weights: gw,
            governor_kv: gk,
            resident_weights: exact.map(|(w, _)| w.present),
            resident_kv: exact.map(|(_, k)| k.present),
            swapped: exact.map(|(w, k)| w.swapped + k.swapped),
            process_delta: delta,
            process_excess: delta.map(|d| d - snap.used as i64),
            exact_ok,
            process_ok,
        };
        let resident = match exact {
            Some((w, k)) => format!(
                "pagemap {} (weights {}, kv {})",
                mib(w.present + k.present),
                mib(w.present),
                mib(k.present)
            ),
            None => format!("pagemap unavailable ({})", rw.err().or(rk.err()).unwrap_or_default()),
        };
        let process = match delta {
            Some(d) => format!("smaps Δ {} ({:+} KiB)", signed_mib(d), (d - snap.used as i64) / KIB as i64),
            None => "smaps unavailable".into(),
        };
        self.rec.log(
            "measure",
            "kernel",
            format!(
                "{label}: governor {} (weights {}, kv {}) | {resident} | {process} → {}",
                mib(snap.used),
                mib(gw),
                mib(gk),
                if exact_ok && process_ok { "agree" } else { "DISAGREE" }
            ),
        );
        self.measurements.push(m);
    }
}

/// Runs the scenario; returns the report (checks included).
fn scenario() -> Result<Report, Box<dyn Error>> {
    let start = Instant::now();
    let plugin = locate::load(None)?;
    let plugin_name = plugin.name().to_string();
    let plugin_label = format!("{} {} ({})", plugin.name(), plugin.version(), plugin.origin());
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin)?;
    let ctx =
        manager.select(CPU0, Requirements { virtual_backing: true, shared_mapping: true, sync: true })?;
    let mechanism = ctx.mechanism().name().to_string();
    let device = ctx.mechanism().device().to_string();
    let granularity = ctx.mechanism().properties().granularity;
    let kernel = Kernel::open(granularity);
    let pool = manager.create_pool("cpu0", CAPACITY)?;
    let rec =
        Arc::new(Recorder { start, pool: pool.clone(), events: Mutex::default(), holders: Mutex::default() });
    let mut st = State {
        rec: rec.clone(),
        kernel: &kernel,
        pool: pool.clone(),
        checks: Checks::default(),
        measurements: Vec::new(),
        tally: Tally::default(),
    };

    serve(&manager, &ctx, &mut st)?;
    drop(ctx);

    // ----- 7. drain, ledger, unload ---------------------------------------------
    let drain = manager.drain(Duration::from_secs(2));
    rec.log(
        "drain",
        "queue",
        format!(
            "drained: {} retired, {} quarantined, {} left",
            drain.retired,
            drain.quarantined,
            drain.left.len()
        ),
    );
    st.checks.add(
        "drain complete",
        drain.is_complete(),
        if drain.is_complete() {
            "nothing left in the deferred-free queue".into()
        } else {
            drain.left.join("; ")
        },
    );
    st.measure("after teardown", &[], &[]);

    let snap = pool.snapshot();
    let reports = manager.registry().live_reports();
    let (plugin_live, host_objects) =
        reports.iter().filter(|(n, _)| *n == plugin_name).fold((0, 0), |(p, h), (_, r)| {
            (p + r.plugin_reported, h + r.objects.iter().map(|o| o.2).sum::<u64>())
        });
    let pins = manager.context(&format!("{plugin_name}/{mechanism}")).map_or(0, |c| c.pins());
    let q = manager.queue().stats();
    let unload = manager.unload_plugin(&plugin_name);
    let unloaded = unload.is_ok();
    rec.log(
        "unload",
        "plugin",
        match &unload {
            Ok(()) => format!("{plugin_name} unloaded: nothing it made is alive or queued"),
            Err(e) => format!("unload refused: {e}"),
        },
    );

    let zero_classes = snap.classes.iter().all(|c| c.charged() == 0);
    st.checks.add(
        "ledger ends at zero",
        snap.used == 0 && zero_classes && q.pending == 0 && plugin_live == 0 && host_objects == 0 && pins == 0,
        format!(
            "pool used {} B, classes {}, queue pending {}, plugin live objects {}, host-counted objects {}, context pins {}",
            snap.used,
            if zero_classes { "all zero" } else { "NOT zero" },
            q.pending,
            plugin_live,
            host_objects,
            pins
        ),
    );
    st.checks.add(
        "plugin unloads cleanly",
        unloaded,
        match &unload {
            Ok(()) => "unloaded".into(),
            Err(e) => e.to_string(),
        },
    );
    let ms = &st.measurements;
    let exact_all = ms.iter().all(|m| m.exact_ok);
    let process_all = ms.iter().all(|m| m.process_ok);
    st.checks.add(
        "governor = kernel pages (pagemap)",
        exact_all,
        if ms.iter().all(|m| m.resident_kv.is_none()) {
            "skipped: /proc/self/pagemap is not readable here".to_string()
        } else {
            format!(
                "{}/{} measurements: pages present over the live objects == bytes charged, exactly",
                ms.iter().filter(|m| m.exact_ok).count(),
                ms.len()
            )
        },
    );
    st.checks.add(
        "governor ≈ process resident delta (smaps)",
        process_all,
        format!(
            "{}/{} measurements within {} (worst difference {})",
            ms.iter().filter(|m| m.process_ok).count(),
            ms.len(),
            mib(PROCESS_TOLERANCE),
            ms.iter()
                .filter_map(|m| m.process_delta.map(|d| d.abs_diff(m.governor_used as i64)))
                .max()
                .map_or("n/a".into(), |d| format!("{} KiB", d / KIB))
        ),
    );

    let last = st.measurements.last();
    let ledger = Ledger {
        classes: AllocationClass::ALL
            .iter()
            .map(|&c| {
                let s = snap.class(c);
                ClassLine {
                    class: c.name(),
                    reserved: s.reserved,
                    leased: s.leased,
                    quarantined: s.quarantined,
                    grants: s.grants,
                    failures: s.failures,
                }
            })
            .collect(),
        pool: PoolLine {
            name: snap.name.to_string(),
            capacity: snap.capacity,
            used: snap.used,
            peak: snap.peak,
            free: snap.free,
            tickets: snap.pressure.tickets,
            bytes_wanted: snap.pressure.bytes_wanted,
            bytes_answered: snap.pressure.bytes_answered,
        },
        holders: pool
            .holders()
            .iter()
            .map(|h| HolderLine {
                name: h.name.to_string(),
                priority: h.priority.0,
                tickets: h.pressure.tickets,
                bytes_wanted: h.pressure.bytes_wanted,
                bytes_answered: h.pressure.bytes_answered,
                zero_answers: h.pressure.zero_answers,
                leased: h.totals().leased,
            })
            .collect(),
        queue: QueueLine {
            enqueued: q.enqueued,
            immediate: q.immediate,
            retired: q.retired,
            quarantined: q.quarantined,
            pending: q.pending,
        },
        drain_left: drain.left,
        plugin: PluginLine {
            live_objects: plugin_live,
            host_objects,
            context_pins: pins,
            unloaded,
            unload_error: unload.err().map(|e| e.to_string()),
        },
        resident_after: last.and_then(|m| m.resident_kv.zip(m.resident_weights).map(|(k, w)| k + w)),
        process_delta_after: last.and_then(|m| m.process_delta),
    };
    drop(manager);

    let State { checks, measurements, .. } = st;
    let timeline = lock(&rec.events).clone();
    let ok = checks.0.iter().all(|c| c.ok);
    Ok(Report {
        scenario: Scenario {
            plugin: plugin_label,
            mechanism,
            device,
            page_size: kernel.page,
            pool_capacity: CAPACITY,
            weight_shard_bytes: SHARD,
            pinned_shards: PINNED.len(),
            expert_shards: EXPERTS,
            prefix_bytes: PREFIX,
            kv_step_bytes: STEP,
            requests: REQUESTS + 1,
            resident_method: "pages present in /proc/self/pagemap over each live object's address range \
                              (weight shards, each region's private KV, the shared prefix once)",
            process_method:
                "sum over /proc/self/smaps of Anonymous + Pss of memfd mappings, now minus at start \
                             (whole process: includes the host's own heap and stacks)",
            process_tolerance: PROCESS_TOLERANCE,
        },
        timeline,
        measurements,
        ledger,
        checks: checks.0,
        ok,
    })
}

/// Steps 1–6 and the start of 7, with every memory object scoped here so that all of it is
/// released when this returns.
fn serve(
    manager: &ProcessMemoryManager,
    ctx: &Arc<memplug_host::Context>,
    st: &mut State<'_>,
) -> Result<(), Box<dyn Error>> {
    let rec = st.rec.clone();
    let pool = st.pool.clone();

    // ----- 1. pool, holders, bindings ---------------------------------------------
    let weights = Arc::new(Weights { shards: Mutex::default(), rec: rec.clone() });
    let w = weights.clone();
    let weights_reg = pool.register_holder("weights", WEIGHTS_PRIORITY, move |t| w.on_ticket(t));
    let r = rec.clone();
    let kv_reg = pool.register_holder("kv", KV_PRIORITY, move |t| {
        r.log("ticket", "kv", format!("{} → answers 0: live sequences are never dropped", r.ticket_text(t)));
        0
    });
    lock(&rec.holders).extend([(weights_reg.id(), "weights"), (kv_reg.id(), "kv")]);
    rec.log(
        "setup",
        "pool",
        format!(
            "pool '{}' on {}: hard capacity {}; holders weights (priority {}, evicts LRU experts) and kv \
             (priority {}, refuses)",
            pool.name(),
            ctx.mechanism().device(),
            mib(CAPACITY),
            WEIGHTS_PRIORITY,
            KV_PRIORITY
        ),
    );
    let weights_b =
        manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(weights_reg.id()))?;
    let kv_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(kv_reg.id()))?;
    let sched_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;

    // ----- 2. weights ----------------------------------------------------------------
    let names = PINNED
        .iter()
        .map(|n| (n.to_string(), true))
        .chain((0..EXPERTS).map(|i| (format!("expert.{i}"), false)));
    for (i, (name, pinned)) in names.enumerate() {
        let alloc = weights_b.allocate(SHARD, st.kernel.page)?;
        // SAFETY: a fresh CPU allocation of SHARD bytes, ours alone.
        unsafe { std::slice::from_raw_parts_mut(alloc.addr() as *mut u8, SHARD as usize) }
            .fill(0x10 + i as u8);
        lock(&weights.shards).push(Shard { name, pinned, alloc, last_used: 0 });
    }
    rec.log(
        "load",
        "weights",
        format!(
            "{} pinned + {EXPERTS} expert shards of {} allocated and written ({} resident)",
            PINNED.len(),
            mib(SHARD),
            mib(SHARD * (PINNED.len() + EXPERTS) as u64)
        ),
    );
    st.measure("weights loaded", &weights.ranges(), &[]);

    // ----- 3. prefix and requests -------------------------------------------------------
    let prefix: Arc<SharedPrefix> = kv_b.create_shared(PREFIX, |v| {
        // SAFETY: the temporary writable view of the new object.
        for line in unsafe { v.as_mut_slice() }.chunks_mut(SYSTEM_PROMPT.len()) {
            line.copy_from_slice(&SYSTEM_PROMPT[..line.len()]);
        }
    })?;
    rec.log(
        "prefix",
        "kv",
        format!(
            "system prompt KV: one shared object of {} ({:?}...), charged once",
            mib(prefix.len()),
            String::from_utf8_lossy(&SYSTEM_PROMPT[..24])
        ),
    );

    let admit = |name: String,
                 b: &MemoryBinding,
                 kv_byte: u8,
                 tally: &mut Tally|
     -> Result<Request, Box<dyn Error>> {
        let mut region = b.reserve_virtual(REGION_MAX)?;
        region.map_prefix(&prefix)?;
        let r = Request { addr: region.addr(), name, region, kv_byte, tokens: 0 };
        tally.prefix_reads += 1;
        if prefix_intact(&r) {
            tally.prefix_ok += 1;
        }
        Ok(r)
    };

    let mut reqs = Vec::new();
    for i in 1..=REQUESTS {
        let r = admit(format!("r{i}"), &kv_b, 0xA0 + i as u8, &mut st.tally)?;
        rec.log(
            "admit",
            &r.name,
            format!(
                "region at {:#x} ({} of address space), prefix mapped read-only and read back",
                r.addr,
                mib(REGION_MAX)
            ),
        );
        reqs.push(r);
    }

    // Decode round-robin, 16 tokens per turn, token by token; growth runs
    // into the budget and sends tickets.
    for step in 1..=DECODE_STEPS as u64 {
        for (i, r) in reqs.iter_mut().enumerate() {
            let blocks = decode(r, TOKENS_PER_STEP, &weights, i, &mut st.tally)
                .map_err(|e| format!("{} step {step}: {e}", r.name))?;
            rec.log(
                "grow",
                &r.name,
                format!(
                    "step {step}: {} tokens decoded, grew {} block(s) of {} → KV {} at {:#x} (same address)",
                    r.tokens,
                    blocks,
                    mib(STEP),
                    mib(r.region.committed()),
                    r.region.addr()
                ),
            );
        }
    }
    let kv_ranges = |reqs: &[Request], extra: &[(u64, u64)]| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = reqs.first().map(|r| r.prefix_range()).into_iter().collect();
        v.extend(reqs.iter().map(Request::private_range));
        v.extend_from_slice(extra);
        v
    };
    st.measure("peak: 4 requests decoding", &weights.ranges(), &kv_ranges(&reqs, &[]));

    // ----- 5. a free that waits for its fence ---------------------------------------------
    let mech = ctx.mechanism().clone();
    let sync = mech.sync().ok_or("the cpu mechanism has no sync capability")?;
    let stream = sync.stream_create()?;
    let mut r1 = reqs.remove(0);
    let (kv_addr, kv_len, kv_byte) = {
        let (a, l) = r1.private_range();
        (a, l, r1.kv_byte)
    };
    let seen = Arc::new(AtomicU8::new(0));
    let s2 = seen.clone();
    sync.enqueue(&stream, move || {
        std::thread::sleep(Duration::from_millis(KERNEL_MS));
        // SAFETY: the region's free waits for the fence recorded after us.
        let intact = unsafe { filled_with(kv_addr, kv_len, kv_byte) };
        s2.store(if intact { 1 } else { 2 }, Ordering::Release);
    })?;
    let fence = PluginFence::record(&mech, &stream)?;
    r1.region.used_by(fence.clone());
    let used_before = pool.used();
    let queued_at = Instant::now();
    let r1_name = r1.name.clone();
    drop(r1);
    let pending_after_drop = manager.queue().pending();
    let early = manager.poll();
    let used_while_pending = pool.used();
    rec.log(
        "release",
        &r1_name,
        format!(
            "finished; region dropped while a host function on the stream still reads its KV → queued \
             behind a fence: queue pending {pending_after_drop}, {} still charged",
            mib(kv_len)
        ),
    );
    rec.log(
        "poll",
        "queue",
        format!(
            "poll before the fence: retired {}, still pending {} (fence complete: {})",
            early.retired,
            early.still_pending,
            fence.query().unwrap_or(false)
        ),
    );
    st.measure("r1 queued behind its fence", &weights.ranges(), &kv_ranges(&reqs, &[(kv_addr, kv_len)]));
    let completed = fence.wait(Duration::from_secs(5)).unwrap_or(false);
    let waited = queued_at.elapsed();
    let host_saw = seen.load(Ordering::Acquire);
    rec.log(
        "fence",
        "stream",
        format!(
            "fence completed after {} ms; the host function read r1's KV intact: {}",
            waited.as_millis(),
            if host_saw == 1 { "yes" } else { "NO" }
        ),
    );
    let late = manager.poll();
    let pending_end = manager.queue().pending();
    let used_after = pool.used();
    rec.log(
        "retired",
        "queue",
        format!(
            "poll after the fence: retired {} → {} decommitted and refunded; queue pending {pending_end}",
            late.retired,
            mib(used_while_pending - used_after)
        ),
    );
    st.checks.add(
        "free waits for the fence",
        pending_after_drop == 1
            && early.retired == 0
            && used_while_pending == used_before
            && completed
            && host_saw == 1
            && late.retired == 1
            && pending_end == 0
            && used_before - used_after == kv_len,
        format!(
            "pending {pending_after_drop} → {pending_end}; charge kept while pending ({}), refunded {} after; \
             host function saw intact KV: {}",
            used_while_pending == used_before,
            mib(used_before.saturating_sub(used_after)),
            host_saw == 1
        ),
    );
    drop(fence);
    sync.stream_destroy(stream).map_err(|e| e.error)?;
    drop(mech);

    // ----- 6. the scheduler's long request: pressure, then OutOfBudget ---------------------
    let mut r5 = admit("r5".into(), &sched_b, 0xA5, &mut st.tally)?;
    rec.log(
        "admit",
        "r5",
        format!(
            "long document, admitted by the scheduler (no holder: may ask every holder); region at {:#x}",
            r5.addr
        ),
    );
    grow(&mut r5, PREFILL, true, &mut st.tally).map_err(|e| format!("r5 prefill: {e}"))?;
    rec.log(
        "grow",
        "r5",
        format!(
            "prefill chunk 1: KV {} at {:#x} (same address)",
            mib(r5.region.committed()),
            r5.region.addr()
        ),
    );
    let before = r5.region.view();
    let committed_before = r5.region.committed();
    let tickets_before = pool.snapshot().pressure.tickets;
    let refused = grow(&mut r5, PREFILL_TOO_BIG, true, &mut st.tally);
    let snap = pool.snapshot();
    let oob = match &refused {
        Err(GrowError::Binding(BindingError::Budget(GovernorError::OutOfBudget(o)))) => Some(o.clone()),
        _ => None,
    };
    match &oob {
        Some(o) => rec.log(
            "out_of_budget",
            "r5",
            format!(
                "prefill chunk 2 (+{}) refused after {} ticket(s): OutOfBudget, {} requested, pool used {} of {}",
                mib(PREFILL_TOO_BIG),
                snap.pressure.tickets - tickets_before,
                mib(o.requested),
                mib(o.snapshot.used),
                mib(o.snapshot.capacity)
            ),
        ),
        None => rec.log("out_of_budget", "r5", format!("expected OutOfBudget, got {refused:?}")),
    }
    let rolled_back = r5.region.view() == before
        && r5.region.committed() == committed_before
        && snap.reserved == 0
        && kv_intact(&r5)
        && prefix_intact(&r5);
    rec.log(
        "rollback",
        "r5",
        format!(
            "old view kept: {:#x} + {} (prefix {} + KV {}), nothing left reserved, bytes intact: {rolled_back}",
            r5.region.addr(),
            mib(r5.region.len()),
            mib(PREFIX),
            mib(r5.region.committed())
        ),
    );
    let kv_zero = pool
        .holders()
        .iter()
        .any(|h| &*h.name == "kv" && h.pressure.tickets > 0 && h.pressure.zero_answers == h.pressure.tickets);
    st.checks.add(
        "OutOfBudget fails cleanly",
        oob.is_some() && rolled_back && kv_zero,
        format!(
            "grow refused with OutOfBudget: {}; kv answered 0: {kv_zero}; region and charge as before: {rolled_back}",
            oob.is_some()
        ),
    );
    grow(&mut r5, PREFILL_RETRY, true, &mut st.tally).map_err(|e| format!("r5 retry: {e}"))?;
    rec.log(
        "grow",
        "r5",
        format!(
            "scheduler retries a smaller chunk (+{}): KV {} at {:#x} (same address)",
            mib(PREFILL_RETRY),
            mib(r5.region.committed()),
            r5.region.addr()
        ),
    );
    reqs.push(r5);
    st.measure("after OutOfBudget and retry", &weights.ranges(), &kv_ranges(&reqs, &[]));

    // Pressure as seen by the holders.
    let ws = weights_reg.stats().pressure;
    st.checks.add(
        "pressure evicted cold weights",
        ws.tickets > 0
            && ws.bytes_answered >= ws.bytes_wanted.min(SHARD)
            && lock(&weights.shards).iter().filter(|s| s.pinned).count() == PINNED.len(),
        format!(
            "weights: {} ticket(s), {} wanted, {} released by LRU eviction",
            ws.tickets,
            mib(ws.bytes_wanted),
            mib(ws.bytes_answered)
        ),
    );

    // ----- 7. finish ------------------------------------------------------------------------
    let intact = reqs.iter().filter(|r| kv_intact(r) && prefix_intact(r)).count();
    st.checks.add(
        "KV and prefix bytes intact",
        intact == reqs.len(),
        format!("{intact}/{} live regions read back their KV and the system prompt", reqs.len()),
    );
    for r in reqs.drain(..) {
        let (name, kv) = (r.name.clone(), r.region.committed());
        drop(r);
        rec.log("finish", name, format!("done; region and {} of KV freed at once (no device work)", mib(kv)));
    }
    drop(prefix);
    rec.log("teardown", "kv", "last mapping gone: the shared prefix is freed");
    drop(weights_reg);
    drop(kv_reg);
    let left = lock(&weights.shards).len();
    drop(weights);
    rec.log("teardown", "weights", format!("holders unregistered; {left} remaining weight shards freed"));
    drop((weights_b, kv_b, sched_b));

    let t = &st.tally;
    st.checks.add(
        "stable addresses",
        t.grows > 0 && t.stable == t.grows,
        if t.unstable.is_empty() {
            format!("{}/{} grows kept the region's base address", t.stable, t.grows)
        } else {
            t.unstable.join("; ")
        },
    );
    st.checks.add(
        "prefix read in every region",
        t.prefix_reads == (REQUESTS + 1) as u64 && t.prefix_ok == t.prefix_reads,
        format!(
            "{}/{} regions read the system prompt through their read-only mapping",
            t.prefix_ok, t.prefix_reads
        ),
    );
    Ok(())
}

// ----- output ------------------------------------------------------------------------------

fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    macro_rules! p {
        ($($t:tt)*) => {
            let _ = writeln!(o, $($t)*);
        };
    }

    let s = &r.scenario;
    p!("memplug demo: LLM serving under a hard budget");
    p!("  plugin     {} — mechanism {} on {}, page {} B", s.plugin, s.mechanism, s.device, s.page_size);
    p!(
        "  budget     pool of {}; weights {} pinned + {} expert shards of {}; system prompt {} shared; \
         KV grows {} per step",
        mib(s.pool_capacity),
        s.pinned_shards,
        s.expert_shards,
        mib(s.weight_shard_bytes),
        mib(s.prefix_bytes),
        mib(s.kv_step_bytes)
    );
    p!();
    p!("timeline  (ms since start, event, who, what — pool used after)");
    for e in &r.timeline {
        p!("  {:>7.1}  {:<13} {:<8} {}  [used {}]", e.t_ms, e.kind, e.subject, e.detail, mib(e.pool_used));
    }
    p!();
    p!("governor vs kernel");
    p!("  resident = {}", s.resident_method);
    p!("  process Δ = {}; tolerance {}", s.process_method, mib(s.process_tolerance));
    p!(
        "  {:<30} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "moment",
        "governor",
        "resident",
        "process Δ",
        "Δ-governor",
        "verdict"
    );
    for m in &r.measurements {
        let resident = m.resident_weights.zip(m.resident_kv).map_or("n/a".into(), |(w, k)| mib(w + k));
        p!(
            "  {:<30} {:>10} {:>10} {:>10} {:>12} {:>9}",
            m.label,
            mib(m.governor_used),
            resident,
            m.process_delta.map_or("n/a".into(), signed_mib),
            m.process_excess.map_or("n/a".into(), |e| format!("{:+} KiB", e / KIB as i64)),
            if m.exact_ok && m.process_ok { "agree" } else { "DISAGREE" }
        );
    }
    {
        let l = &r.ledger;
        p!();
        p!("ledger (after teardown)");
        p!(
            "  {:<12} {:>10} {:>10} {:>12} {:>8} {:>9}",
            "class",
            "reserved",
            "leased",
            "quarantined",
            "grants",
            "failures"
        );
        for c in &l.classes {
            p!(
                "  {:<12} {:>10} {:>10} {:>12} {:>8} {:>9}",
                c.class,
                c.reserved,
                c.leased,
                c.quarantined,
                c.grants,
                c.failures
            );
        }
        p!("  (failures: the governor's refusal counter as bindings drive it: a fast-path miss that");
        p!("   pressure then cured counts 1, the one real refusal counts 2)");
        let p = &l.pool;
        p!(
            "  pool '{}'   used {} B, peak {}, capacity {}; {} ticket(s) issued, {} wanted, {} answered",
            p.name,
            p.used,
            mib(p.peak),
            mib(p.capacity),
            p.tickets,
            mib(p.bytes_wanted),
            mib(p.bytes_answered)
        );
        for h in &l.holders {
            p!(
                "  holder {:<8} priority {:>2}: {} ticket(s), {} wanted, {} answered, {} zero answer(s); {} B leased",
                h.name,
                h.priority,
                h.tickets,
                mib(h.bytes_wanted),
                mib(h.bytes_answered),
                h.zero_answers,
                h.leased
            );
        }
        let q = &l.queue;
        p!(
            "  queue        {} enqueued, {} freed at once, {} retired, {} quarantined, {} pending",
            q.enqueued,
            q.immediate,
            q.retired,
            q.quarantined,
            q.pending
        );
        let pl = &l.plugin;
        p!(
            "  plugin       {} live object(s) reported by the plugin, {} counted by the host, {} context pin(s); {}",
            pl.live_objects,
            pl.host_objects,
            pl.context_pins,
            if pl.unloaded { "unloaded".to_string() } else { format!("NOT unloaded: {}", pl.unload_error.as_deref().unwrap_or("")) }
        );
        p!(
            "  resident     {} over live objects, process Δ {} (governor says 0)",
            l.resident_after.map_or("n/a".into(), |b| format!("{b} B")),
            l.process_delta_after.map_or("n/a".into(), |d| format!("{} KiB", d / KIB as i64))
        );
    }
    p!();
    p!("checks");
    for c in &r.checks {
        p!("  [{}] {:<42} {}", if c.ok { "ok" } else { "FAIL" }, c.name, c.detail);
    }
    let failed = r.checks.iter().filter(|c| !c.ok).count();
    p!();
    if failed == 0 {
        p!("all {} checks passed", r.checks.len());
    } else {
        p!("{failed} of {} checks FAILED", r.checks.len());
    }
    o
}

/// `memplug demo [--json]`.
pub fn run(json: bool) -> Result<(), Box<dyn Error>> {
    let report = scenario()?;
    let text = if json { serde_json::to_string_pretty(&report)? + "\n" } else { render_text(&report) };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped early (`| head`) is not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("demo: {} check(s) failed: {}", failed.len(), failed.join(", ")).into())
    }
}
