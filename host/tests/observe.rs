//! Observability (`memplug_host::observe`): events arrive for each kind,
//! made to happen through a real binding (an OutOfBudget, a pressure
//! ticket answered with an eviction, a quarantine, a retired deferred free,
//! a context loss); plugin messages reach the log hook; cumulative
//! per-class figures and sampled per-class peaks; the Prometheus text
//! parses line by line with the figures of the snapshot.
//!
//! The plugin is an in-process SDK plugin over the system allocator whose
//! allocate refuses one size (with a message) and whose deallocate
//! refuses another (so that release is quarantined).

mod common;

use common::CPU0;
use memplug_host::governor::{AllocationClass, HolderRegistration, Priority};
use memplug_host::observe::{to_prometheus, EventKind, Level, StatsReport};
use memplug_host::{
    BindingSpec, FnFence, LoadOptions, OwnedAllocation, Plugin, ProcessMemoryManager, Requirements,
};
use memplug_sdk::{
    Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef, PluginBuilder, PluginError,
};
use memplug_sdk::{PluginResult, Properties, Request};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Allocate refuses this size, saying why.
const REFUSED: u64 = 3 * 1024;
/// Deallocate of an allocation of this size fails (it stays allocated).
const STUCK: u64 = 5 * 1024;

#[derive(Default)]
struct Heap {
    next: AtomicU64,
    live: Mutex<HashMap<u64, (u64, Layout)>>,
}

impl Allocator for Heap {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 4096 }
    }

    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        if r.size == REFUSED {
            return Err(PluginError::out_of_memory(format!("heap: {REFUSED} bytes are refused on purpose")));
        }
        let layout = Layout::from_size_align(r.size as usize, r.alignment as usize).unwrap();
        // SAFETY: non-zero size (the SDK refuses zero).
        let p = unsafe { alloc_zeroed(layout) };
        let handle = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.live.lock().unwrap().insert(handle, (p as u64, layout));
        Ok(Block { addr: p as u64, size: r.size, handle })
    }

    fn deallocate(&self, r: &ObjectRef) -> PluginResult<()> {
        if r.size == STUCK {
            return Err(PluginError::internal("heap: this block cannot be freed"));
        }
        let (addr, layout) = self.live.lock().unwrap().remove(&r.handle).expect("a live block");
        // SAFETY: allocated above with this layout, freed once.
        unsafe { dealloc(addr as *mut u8, layout) };
        Ok(())
    }
}

fn init() -> ExportedPlugin {
    let m = MechanismBuilder::new("heap", 1, CPU0, Heap::default());
    let state: &'static Heap = m.implementation();
    PluginBuilder::new("observed", "1")
        .mechanism(m.build())
        .live_objects(move || state.live.lock().unwrap().len() as u64)
        .build()
}
memplug_sdk::declare_entry!(entry, init);

/// A manager with the plugin registered and a pool of `capacity` bytes.
fn rig(
    capacity: u64,
) -> (ProcessMemoryManager, Arc<memplug_host::Context>, Arc<memplug_host::governor::Pool>) {
    // SAFETY: an SDK-generated entry.
    let plugin = unsafe { Plugin::from_entry(entry, "observed", &LoadOptions::default()) }.unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin).unwrap();
    let ctx = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("gpu0", capacity).unwrap();
    (manager, ctx, pool)
}

/// One event as the listener saw it, with owned strings.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    kind: EventKind,
    pool: Option<String>,
    holder: Option<u64>,
    class: Option<AllocationClass>,
    bytes: u64,
    count: u64,
    detail: Option<String>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn listen(manager: &ProcessMemoryManager) -> Log {
    let log: Log = Arc::default();
    let l = log.clone();
    manager.set_event_listener(move |e| {
        l.lock().unwrap().push(Seen {
            kind: e.kind,
            pool: e.pool_name.map(str::to_owned),
            holder: e.holder.map(|h| h.get()),
            class: e.class,
            bytes: e.bytes,
            count: e.count,
            detail: e.detail.map(str::to_owned),
        })
    });
    log
}

fn of(log: &Log, kind: EventKind) -> Vec<Seen> {
    log.lock().unwrap().iter().filter(|e| e.kind == kind).cloned().collect()
}

type Kept = Arc<Mutex<Vec<OwnedAllocation>>>;

/// A holder whose kept allocations go back, newest first, when it is asked
/// (it answers the bytes it freed).
fn evicting_holder(pool: &Arc<memplug_host::governor::Pool>, name: &str) -> (HolderRegistration, Kept) {
    let kept: Kept = Arc::default();
    let k = kept.clone();
    let reg = pool.register_holder(name, Priority(1), move |t| {
        let mut v = k.lock().unwrap();
        let mut freed = 0;
        while freed < t.bytes_wanted {
            let Some(a) = v.pop() else { break };
            freed += a.size();
        }
        freed
    });
    (reg, kept)
}

#[test]
fn every_event_kind_arrives_with_its_fields() {
    let (manager, ctx, pool) = rig(64 * 1024);
    let events = listen(&manager);

    let (reg, kept) = evicting_holder(&pool, "kv-cache");
    let holder = reg.id();
    let kv = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(holder)).unwrap();
    let anon = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Workspace)).unwrap();

    // Grants: one event per grant, with the holder and class charged.
    for _ in 0..6 {
        kept.lock().unwrap().push(kv.allocate(8 * 1024, 16).unwrap());
    }
    let grants = of(&events, EventKind::Grant);
    assert_eq!(grants.len(), 6);
    assert!(grants.iter().all(|g| g.bytes == 8 * 1024
        && g.holder == Some(holder.get())
        && g.class == Some(AllocationClass::Kv)
        && g.pool.as_deref() == Some("gpu0")));

    // 48 KiB of 64 used: 32 KiB more needs a ticket, which evicts.
    let big = anon.allocate(32 * 1024, 16).unwrap();
    let tickets = of(&events, EventKind::PressureTicket);
    assert_eq!(tickets.len(), 1, "{tickets:?}");
    assert_eq!((tickets[0].holder, tickets[0].bytes), (Some(holder.get()), 16 * 1024));
    assert_eq!(tickets[0].class, Some(AllocationClass::Workspace));
    let evictions = of(&events, EventKind::Eviction);
    assert_eq!(evictions.len(), 1);
    assert_eq!((evictions[0].holder, evictions[0].bytes), (Some(holder.get()), 16 * 1024));

    // OutOfBudget: more than the capacity; names the short pool.
    assert!(anon.allocate(128 * 1024, 16).is_err());
    let refused = of(&events, EventKind::OutOfBudget);
    assert_eq!(refused.len(), 1);
    assert_eq!((refused[0].bytes, refused[0].detail.as_deref()), (128 * 1024, Some("gpu0")));
    drop(big);

    // Quarantine: the plugin refuses to free this one.
    drop(anon.allocate(STUCK, 16).unwrap());
    let q = of(&events, EventKind::Quarantine);
    assert_eq!(q.len(), 1);
    assert_eq!((q[0].bytes, q[0].class), (STUCK, Some(AllocationClass::Workspace)));

    // Retired: a free behind a fence that completes later, retired by poll.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let fence = FnFence::new("later", move || d.load(Ordering::SeqCst), |_| false);
    anon.allocate(4096, 16).unwrap().release_after([fence]);
    manager.poll();
    assert!(of(&events, EventKind::Retired).is_empty(), "retired before its fence completed");
    done.store(true, Ordering::SeqCst);
    manager.poll();
    let r = of(&events, EventKind::Retired);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].bytes, r[0].pool.as_deref(), r[0].class),
        (4096, Some("gpu0"), Some(AllocationClass::Workspace))
    );

    // Context loss: one event per binding that holds something.
    let held_kv = kept.lock().unwrap().iter().map(|a| a.size()).sum::<u64>();
    assert!(ctx.declare_lost("the test pulled the device"));
    let lost = of(&events, EventKind::ContextLost);
    let kv_loss = lost.iter().find(|e| e.holder == Some(holder.get())).expect("the kv binding's loss");
    assert_eq!((kv_loss.bytes, kv_loss.count), (held_kv, kept.lock().unwrap().len() as u64));
    assert_eq!(kv_loss.detail.as_deref(), Some(ctx.label()));
    let ws_loss =
        lost.iter().find(|e| e.class == Some(AllocationClass::Workspace)).expect("the stuck block's");
    assert_eq!(ws_loss.bytes, 0, "the workspace binding holds only quarantined bytes: {ws_loss:?}");
    kept.lock().unwrap().clear();
}

#[test]
fn nothing_is_delivered_after_the_listener_is_cleared_nor_from_inside_it() {
    let (manager, ctx, pool) = rig(1 << 20);
    let b = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let (c, b2) = (count.clone(), manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap());
    // The listener allocates: that grant must not come back to it.
    manager.set_event_listener(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        drop(b2.allocate(64, 16));
    });
    drop(b.allocate(64, 16).unwrap());
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(manager.hub().dropped(), 1, "the listener's own grant is dropped, and counted");
    manager.hub().clear_event_listener();
    drop(b.allocate(64, 16).unwrap());
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn plugin_messages_reach_the_log_hook() {
    let (manager, ctx, pool) = rig(1 << 20);
    let lines: Arc<Mutex<Vec<(Level, String, String)>>> = Arc::default();
    let l = lines.clone();
    manager
        .set_log_hook(move |level, source, msg| l.lock().unwrap().push((level, source.into(), msg.into())));
    let b = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let err = b.allocate(REFUSED, 16).unwrap_err().to_string();
    {
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let (level, source, msg) = &lines[0];
        assert_eq!((*level, source.as_str()), (Level::Warn, "observed/heap"));
        assert!(msg.contains("refused on purpose"), "{msg}");
        assert!(err.contains(msg.as_str()), "the error carries the same message: {err}");
    }
    // The host's own refusals are not the plugin's messages.
    ctx.declare_lost("gone for the test");
    let before = lines.lock().unwrap().len();
    assert!(b.allocate(64, 16).is_err());
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), before, "a closed door is the host speaking: {lines:?}");
    let (level, _, why) = lines.iter().find(|l| l.0 == Level::Error).expect("the loss is logged");
    assert_eq!(*level, Level::Error);
    assert!(why.contains("gone for the test"), "{why}");
}

#[test]
fn cumulative_figures_and_sampled_peaks_per_class() {
    let (manager, ctx, pool) = rig(64 * 1024);
    let (reg, kept) = evicting_holder(&pool, "kv");
    let kv = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(reg.id())).unwrap();
    let w = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let ws = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Workspace)).unwrap();
    let weights = w.allocate(16 * 1024, 16).unwrap();
    for _ in 0..5 {
        kept.lock().unwrap().push(kv.allocate(8 * 1024, 16).unwrap());
    }
    // 56 KiB of 64 charged and no snapshot taken. 32 KiB of workspace go
    // to the slow path, which samples the peaks (40 KiB of kv) before the
    // ticket evicts three kv blocks; the request then succeeds.
    let scratch = ws.allocate(32 * 1024, 16).unwrap();
    let s = pool.snapshot();
    let c = s.class(AllocationClass::Kv);
    assert_eq!(c.charged(), 16 * 1024);
    assert_eq!(c.peak, 40 * 1024, "sampled on the slow path, before the eviction");
    assert_eq!((c.granted_bytes, c.released_bytes), (40 * 1024, 24 * 1024));
    assert_eq!((c.grants, c.failures), (5, 0));
    assert_eq!((c.tickets, c.evictions, c.evicted_bytes), (0, 0, 0), "kv received, it did not ask");
    let wsc = s.class(AllocationClass::Workspace);
    assert_eq!((wsc.tickets, wsc.evictions, wsc.evicted_bytes), (1, 1, 24 * 1024));
    let hc = *pool.holder_stats(reg.id()).unwrap().class(AllocationClass::Kv);
    assert_eq!((hc.peak, hc.tickets, hc.evictions), (40 * 1024, 0, 0), "the ticket's class is the request's");
    let hw = *pool.holder_stats(reg.id()).unwrap().class(AllocationClass::Workspace);
    assert_eq!((hw.tickets, hw.evictions, hw.evicted_bytes), (1, 1, 24 * 1024));
    let wc = s.class(AllocationClass::Weights);
    assert_eq!((wc.peak, wc.granted_bytes, wc.released_bytes), (16 * 1024, 16 * 1024, 0));
    assert_eq!(s.peak, 64 * 1024, "the pool-wide peak is exact");
    // A refusal counts as a failure; releases show as released bytes.
    assert!(w.allocate(128 * 1024, 16).is_err());
    drop((weights, scratch));
    kept.lock().unwrap().clear();
    let s = pool.snapshot();
    let wc = s.class(AllocationClass::Weights);
    assert_eq!((wc.peak, wc.released_bytes, wc.failures), (16 * 1024, 16 * 1024, 1));
    for c in &s.classes {
        assert_eq!(c.released_bytes, c.granted_bytes, "everything came back: {c:?}");
    }
}

/// One parsed sample line: name, labels, value.
type Line = (String, BTreeMap<String, String>, u64);

/// Parses Prometheus text line by line: every sample's family was
/// announced by `# HELP` and `# TYPE` first, counters end in `_total`.
fn parse(text: &str) -> Vec<Line> {
    let (mut helped, mut typed) = (BTreeMap::new(), BTreeMap::new());
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty() && helped.insert(name.to_string(), ()).is_none(), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(helped.contains_key(name), "TYPE before HELP: {line}");
            assert!(ty == "gauge" || ty == "counter", "{line}");
            assert_eq!(
                ty == "counter",
                name.ends_with("_total"),
                "counters and only counters end in _total: {line}"
            );
            typed.insert(name.to_string(), ty.to_string());
        } else {
            let (series, value) = line.rsplit_once(' ').expect("sample value");
            let (name, labels) = match series.split_once('{') {
                None => (series, BTreeMap::new()),
                Some((n, l)) => (n, labels(l.strip_suffix('}').expect("closing brace"))),
            };
            assert!(typed.contains_key(name), "sample of an undeclared family: {line}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
            out.push((name.to_string(), labels, value.parse().expect("an integer value")));
        }
    }
    out
}

/// `k="v",...` with the format's escapes (backslash, quote, newline) undone.
fn labels(mut l: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !l.is_empty() {
        let (k, rest) = l.split_once("=\"").expect("label=\"value\"");
        let (mut v, mut chars) = (String::new(), rest.char_indices());
        let end = loop {
            match chars.next().expect("unterminated label value") {
                (_, '\\') => match chars.next().expect("escape").1 {
                    'n' => v.push('\n'),
                    c @ ('\\' | '"') => v.push(c),
                    c => panic!("bad escape \\{c}"),
                },
                (i, '"') => break i,
                (_, c) => v.push(c),
            }
        };
        out.insert(k.to_string(), v);
        l = rest[end + 1..].strip_prefix(',').unwrap_or(&rest[end + 1..]);
    }
    out
}

fn value(lines: &[Line], name: &str, labels: &[(&str, &str)]) -> u64 {
    let hits: Vec<_> = lines
        .iter()
        .filter(|(n, l, _)| {
            n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(hits.len(), 1, "{name} {labels:?}: {hits:?}");
    hits[0].2
}

#[test]
fn prometheus_text_parses_with_the_snapshot_figures() {
    let (manager, ctx, pool) = rig(64 * 1024);
    let reg = pool.register_holder("tenant \"a\"", Priority(0), |_| 0);
    let kv = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(reg.id())).unwrap();
    let a = kv.allocate(8 * 1024, 16).unwrap();
    drop(kv.allocate(4 * 1024, 16).unwrap());
    assert!(kv.allocate(REFUSED, 16).is_err());
    let text = to_prometheus(&manager.stats());
    let lines = parse(&text);
    let s = pool.snapshot();
    let kvs = s.class(AllocationClass::Kv);
    let p = [("pool", "gpu0")];
    let pk = [("pool", "gpu0"), ("class", "kv")];
    assert_eq!(value(&lines, "memplug_pool_capacity_bytes", &p), 64 * 1024);
    assert_eq!(value(&lines, "memplug_pool_level_used_bytes", &p), s.used);
    assert_eq!(value(&lines, "memplug_pool_used_bytes", &pk), 8 * 1024);
    assert_eq!(value(&lines, "memplug_pool_granted_bytes_total", &pk), kvs.granted_bytes);
    assert_eq!(value(&lines, "memplug_pool_released_bytes_total", &pk), 4 * 1024 + REFUSED);
    assert_eq!(value(&lines, "memplug_pool_grants_total", &pk), 3);
    assert_eq!(value(&lines, "memplug_pool_leases", &pk), 1);
    assert_eq!(value(&lines, "memplug_pool_used_bytes", &[("pool", "gpu0"), ("class", "weights")]), 0);
    // The quote in the holder's name is escaped, and parses back.
    assert_eq!(
        value(&lines, "memplug_holder_used_bytes", &[("holder", "tenant \"a\""), ("class", "kv")]),
        8 * 1024
    );
    assert_eq!(value(&lines, "memplug_deferred_pending", &[]), 0);
    assert_eq!(
        value(&lines, "memplug_context_state", &[("context", "observed/heap"), ("state", "active")]),
        1
    );
    assert_eq!(
        value(&lines, "memplug_stats_schema_version", &[]),
        memplug_host::observe::SCHEMA_VERSION as u64
    );
    // One pool alone.
    let one = parse(&to_prometheus(&StatsReport::of_pool(&pool)));
    assert_eq!(value(&one, "memplug_pool_used_bytes", &pk), 8 * 1024);
    assert!(one.iter().all(|(n, _, _)| !n.starts_with("memplug_deferred")));
    drop(a);
}
