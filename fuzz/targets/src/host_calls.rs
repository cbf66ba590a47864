//! Fuzz target `host_calls`: arbitrary sequences of host API calls on a
//! [`ProcessMemoryManager`] with the reference CPU plugin linked in
//! ([`memplug_plugin_cpu::cpu_plugin_entry`]) and a pool of small capacity.
//!
//! Operations: bindings (anonymous or on behalf of a holder, registered or
//! not, any class, failing at once or after a zero wait); allocations of
//! any size and alignment (zero, huge, not a power of two) that are
//! written to, dropped, marked used by fences or released after them;
//! virtual regions reserved (any size), grown (with an update that
//! succeeds — writing the new bytes — or fails), shrunk after fences, and
//! dropped; shared prefixes created, filled, mapped into regions (read
//! back) and dropped; holders registered with callbacks that release what
//! they were given, release everything, release nothing or lie; fences
//! that are runtime gates ([`FnFence`]) or plugin fences behind
//! gate-blocked work on CPU streams, completed in any order; `poll` and
//! zero-timeout `drain`.
//!
//! After every operation: pool `used <= capacity`, `used = reserved +
//! leased + quarantined` with nothing reserved and nothing quarantined or
//! leaked (the plugin is honest), and — whenever the deferred-free queue is
//! empty — `used` equals exactly the charges of the live objects, and the
//! mechanism's live counts and the context's pins match them; a failed
//! operation that issued no pressure ticket and retired nothing changes
//! nothing. At the end (everything dropped, every gate
//! opened, the queue drained): `used == 0`, nothing quarantined, the queue
//! empty, no pins, every live count 0, the plugin reporting 0 live objects,
//! and the plugin unloads.

use crate::input::{interesting_u64, rare};
use arbitrary::{Result, Unstructured};
use memplug_host::governor::{AllocationClass, HolderId, HolderRegistration, Pool, PressureTicket, Priority};
use memplug_host::{
    BindingSpec, Context, FnFence, LoadOptions, MemoryBinding, ObjectKind, OwnedAllocation, Plugin,
    PluginFence, ProcessMemoryManager, Region, Requirements, SharedFence, SharedPrefix, Stream,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

/// Operations per input at most.
const MAX_OPS: usize = 64;
/// Alignments above this are "huge" (see [`MAX_HUGE_ALIGNED`]).
const HUGE_ALIGNMENT: u64 = 1 << 16;
/// Allocations with a huge alignment per input at most: none under
/// cargo-fuzz, a few in the bounded run. Under AddressSanitizer a block
/// aligned to `a` costs `a / 8` bytes of resident shadow memory (128 MiB
/// for 1 GiB) for as long as it sits in ASan's quarantine, which is bounded
/// by the blocks' requested bytes, not by that cost: a few thousand freed
/// 17-byte, 1 GiB-aligned blocks exhaust any RSS limit.
const MAX_HUGE_ALIGNED: usize = if cfg!(fuzzing) { 0 } else { 2 };

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// The in-process CPU plugin is one instance per process, and the end of
/// every run checks that it holds nothing: runs are serialised.
static SERIAL: Mutex<()> = Mutex::new(());

/// Per operation name: (ran, succeeded), in this process so far.
static OUTCOMES: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// How often each operation ran and succeeded in this process so far, and
/// how many pressure tickets holders answered (to see what an input set
/// reaches).
pub fn outcomes() -> Vec<(String, u64, u64)> {
    lock(&OUTCOMES).iter().map(|(k, (n, ok))| (k.to_string(), *n, *ok)).collect()
}

fn record(name: &'static str, ok: bool) {
    let mut o = lock(&OUTCOMES);
    let e = o.entry(name).or_default();
    e.0 += 1;
    e.1 += u64::from(ok);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ----- the input -------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Drops what it was given until the wanted bytes are released.
    ReleaseWanted,
    /// Drops everything it was given.
    ReleaseAll,
    /// Answers zero (legal).
    Nothing,
    /// Claims the wanted bytes and releases nothing.
    Lie,
}

/// Indexes are taken modulo the collection's length when the operation
/// runs (skipped when it is empty).
#[derive(Debug, Clone)]
enum Op {
    Bind {
        holder: Option<usize>,
        class: AllocationClass,
        wait: bool,
    },
    Allocate {
        binding: usize,
        size: u64,
        align: u64,
    },
    DropAlloc {
        alloc: usize,
    },
    AllocUsedBy {
        alloc: usize,
        fence: usize,
    },
    ReleaseAfter {
        alloc: usize,
        fences: Vec<usize>,
    },
    NewFnFence,
    NewStream,
    /// Work on a stream that waits for a gate, then a plugin fence after it.
    StreamWork {
        stream: usize,
        gated: bool,
    },
    DestroyStream {
        stream: usize,
    },
    Complete {
        fence: usize,
    },
    ReserveVirtual {
        binding: usize,
        max: u64,
    },
    GrowTo {
        region: usize,
        len: u64,
        fail: bool,
    },
    ShrinkTo {
        region: usize,
        len: u64,
        fences: Vec<usize>,
    },
    RegionUsedBy {
        region: usize,
        fence: usize,
    },
    DropRegion {
        region: usize,
    },
    CreateShared {
        binding: usize,
        size: u64,
        fill: u8,
    },
    MapPrefix {
        region: usize,
        prefix: usize,
    },
    DropPrefix {
        prefix: usize,
    },
    RegisterHolder {
        priority: u32,
        behaviour: Behaviour,
    },
    UnregisterHolder {
        holder: usize,
    },
    GiveAlloc {
        alloc: usize,
        holder: usize,
    },
    GiveRegion {
        region: usize,
        holder: usize,
    },
    Poll,
    Drain,
}

fn size(u: &mut Unstructured<'_>, capacity: u64) -> Result<u64> {
    if rare(u, 4)? {
        return u.int_in_range(0..=capacity.saturating_mul(2).max(1));
    }
    interesting_u64(
        u,
        &[
            4096,
            64,
            0,
            1,
            15,
            16,
            17,
            4095,
            4097,
            8192,
            65536,
            capacity / 2,
            capacity,
            capacity.saturating_add(1),
            1 << 30,
            1 << 40,
            u64::MAX - 4095,
            u64::MAX,
        ],
    )
}

fn alignment(u: &mut Unstructured<'_>) -> Result<u64> {
    interesting_u64(u, &[16, 8, 1, 0, 2, 3, 24, 64, 4096, 1 << 20, 1 << 30, 1 << 31, 1 << 63, u64::MAX])
}

fn fence_list(u: &mut Unstructured<'_>) -> Result<Vec<usize>> {
    let n = u.int_in_range(0..=3)?;
    (0..n).map(|_| Ok(usize::from(u.arbitrary::<u8>()?))).collect()
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Bind { .. } => "bind",
            Op::Allocate { .. } => "allocate",
            Op::DropAlloc { .. } => "drop_alloc",
            Op::AllocUsedBy { .. } => "alloc_used_by",
            Op::ReleaseAfter { .. } => "release_after",
            Op::NewFnFence => "new_fn_fence",
            Op::NewStream => "new_stream",
            Op::StreamWork { .. } => "stream_work",
            Op::DestroyStream { .. } => "destroy_stream",
            Op::Complete { .. } => "complete",
            Op::ReserveVirtual { .. } => "reserve_virtual",
            Op::GrowTo { .. } => "grow_to",
            Op::ShrinkTo { .. } => "shrink_to",
            Op::RegionUsedBy { .. } => "region_used_by",
            Op::DropRegion { .. } => "drop_region",
            Op::CreateShared { .. } => "create_shared",
            Op::MapPrefix { .. } => "map_prefix",
            Op::DropPrefix { .. } => "drop_prefix",
            Op::RegisterHolder { .. } => "register_holder",
            Op::UnregisterHolder { .. } => "unregister_holder",
            Op::GiveAlloc { .. } => "give_alloc",
            Op::GiveRegion { .. } => "give_region",
            Op::Poll => "poll",
            Op::Drain => "drain",
        }
    }

    fn decode(u: &mut Unstructured<'_>, capacity: u64) -> Result<Op> {
        let i = |u: &mut Unstructured<'_>| -> Result<usize> { Ok(usize::from(u.arbitrary::<u8>()?)) };
        Ok(match u.choose_index(24)? {
            0 => Op::Allocate { binding: i(u)?, size: size(u, capacity)?, align: alignment(u)? },
            1 => Op::Bind {
                holder: if u.arbitrary()? { Some(i(u)?) } else { None },
                class: *u.choose(&AllocationClass::ALL)?,
                wait: u.arbitrary()?,
            },
            2 => Op::DropAlloc { alloc: i(u)? },
            3 => Op::AllocUsedBy { alloc: i(u)?, fence: i(u)? },
            4 => Op::ReleaseAfter { alloc: i(u)?, fences: fence_list(u)? },
            5 => Op::NewFnFence,
            6 => Op::NewStream,
            7 => Op::StreamWork { stream: i(u)?, gated: !rare(u, 4)? },
            8 => Op::DestroyStream { stream: i(u)? },
            9 => Op::Complete { fence: i(u)? },
            10 => Op::ReserveVirtual {
                binding: i(u)?,
                max: interesting_u64(
                    u,
                    &[
                        1 << 20,
                        0,
                        1,
                        4096,
                        4097,
                        65536,
                        capacity,
                        capacity.saturating_mul(2),
                        1 << 30,
                        1 << 36,
                        1 << 63,
                        u64::MAX - 4095,
                        u64::MAX,
                    ],
                )?,
            },
            11 => Op::GrowTo { region: i(u)?, len: size(u, capacity)?, fail: rare(u, 4)? },
            12 => Op::ShrinkTo { region: i(u)?, len: size(u, capacity)?, fences: fence_list(u)? },
            13 => Op::RegionUsedBy { region: i(u)?, fence: i(u)? },
            14 => Op::DropRegion { region: i(u)? },
            15 => {
                Op::CreateShared { binding: i(u)?, size: size(u, capacity)?, fill: u.arbitrary::<u8>()? | 1 }
            }
            16 => Op::MapPrefix { region: i(u)?, prefix: i(u)? },
            17 => Op::DropPrefix { prefix: i(u)? },
            18 => Op::RegisterHolder {
                priority: *u.choose(&[0, 1, 2, u32::MAX])?,
                behaviour: *u.choose(&[
                    Behaviour::ReleaseWanted,
                    Behaviour::ReleaseAll,
                    Behaviour::Nothing,
                    Behaviour::Lie,
                ])?,
            },
            19 => Op::UnregisterHolder { holder: i(u)? },
            20 => Op::GiveAlloc { alloc: i(u)?, holder: i(u)? },
            21 => Op::GiveRegion { region: i(u)?, holder: i(u)? },
            22 => Op::Poll,
            _ => Op::Drain,
        })
    }
}

// ----- the state -------------------------------------------------------------

/// What a holder's callback may drop.
enum Victim {
    Alloc(OwnedAllocation),
    Region(Region),
}

impl Victim {
    fn charged(&self) -> u64 {
        match self {
            Victim::Alloc(a) => a.charged(),
            Victim::Region(r) => r.committed(),
        }
    }
}

type Cache = Arc<Mutex<Vec<Victim>>>;

struct Holder {
    registration: HolderRegistration,
    cache: Cache,
}

struct Gate {
    open: Arc<AtomicBool>,
    fence: SharedFence,
    /// The stream whose work it waits behind, for plugin fences.
    stream: Option<u64>,
}

struct StreamSlot {
    stream: Stream,
    serial: u64,
}

struct Rig {
    manager: ProcessMemoryManager,
    context: Arc<Context>,
    pool: Arc<Pool>,
    granularity: u64,
    bindings: Vec<MemoryBinding>,
    holder_ids: Vec<HolderId>,
    holders: Vec<Holder>,
    allocs: Vec<OwnedAllocation>,
    regions: Vec<Region>,
    prefixes: Vec<(Arc<SharedPrefix>, u8)>,
    /// Every prefix made, with its fill byte: mapped regions keep them alive.
    all_prefixes: Vec<(Weak<SharedPrefix>, u8)>,
    gates: Vec<Gate>,
    streams: Vec<StreamSlot>,
    next_stream: u64,
    /// Allocations made with a huge alignment (see [`MAX_HUGE_ALIGNED`]).
    huge_aligned: usize,
}

/// Figures that show whether an operation did anything behind the scenes.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Quiet {
    tickets: u64,
    retired: u64,
}

impl Rig {
    fn new(capacity: u64) -> Rig {
        // SAFETY: the reference plugin's entry follows the ABI.
        let plugin = unsafe {
            Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default())
        }
        .expect("the reference CPU plugin loads");
        assert_eq!(plugin.plugin_live_objects(), 0, "a previous run left objects in the CPU plugin");
        let manager = ProcessMemoryManager::new();
        manager.register_plugin(plugin).expect("register");
        let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
        let context = manager.select(CPU0, all).expect("the CPU mechanism has every capability");
        let granularity = context.mechanism().properties().granularity;
        let pool = manager.create_pool("fuzz", capacity).expect("pool");
        let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).expect("bind");
        Rig {
            manager,
            context,
            pool,
            granularity,
            bindings: vec![binding],
            holder_ids: Vec::new(),
            holders: Vec::new(),
            allocs: Vec::new(),
            regions: Vec::new(),
            prefixes: Vec::new(),
            all_prefixes: Vec::new(),
            gates: Vec::new(),
            streams: Vec::new(),
            next_stream: 0,
            huge_aligned: 0,
        }
    }

    fn quiet(&self) -> Quiet {
        Quiet {
            tickets: self.pool.snapshot().pressure.tickets,
            retired: self.manager.queue().stats().retired,
        }
    }

    fn fences(&self, idx: &[usize]) -> Vec<SharedFence> {
        if self.gates.is_empty() {
            return Vec::new();
        }
        idx.iter().map(|i| self.gates[i % self.gates.len()].fence.clone()).collect()
    }

    fn binding(&self, i: usize) -> MemoryBinding {
        self.bindings[i % self.bindings.len()].clone()
    }

    fn live_prefixes(&self) -> Vec<(Arc<SharedPrefix>, u8)> {
        self.all_prefixes.iter().filter_map(|(w, f)| w.upgrade().map(|p| (p, *f))).collect()
    }

    /// Charges of everything alive that the harness can see.
    fn accounted(&self) -> (u64, u64, u64, u64) {
        let (mut bytes, mut allocs, mut regions) = (0u64, 0u64, 0u64);
        for a in &self.allocs {
            bytes += a.charged();
            allocs += 1;
        }
        for r in &self.regions {
            bytes += r.committed();
            regions += 1;
        }
        for h in &self.holders {
            for v in lock(&h.cache).iter() {
                bytes += v.charged();
                match v {
                    Victim::Alloc(_) => allocs += 1,
                    Victim::Region(_) => regions += 1,
                }
            }
        }
        let prefixes = self.live_prefixes();
        bytes += prefixes.iter().map(|(p, _)| p.charged()).sum::<u64>();
        (bytes, allocs, regions, prefixes.len() as u64)
    }

    fn check(&self, op: &Op) {
        let snap = self.pool.snapshot();
        let totals = snap.totals();
        assert!(snap.used <= snap.capacity, "after {op:?}: used {} > capacity {}", snap.used, snap.capacity);
        assert_eq!(snap.used, self.pool.used(), "after {op:?}: snapshot and pool disagree");
        assert_eq!(snap.reserved, 0, "after {op:?}: a grant outlived its operation");
        assert_eq!(snap.quarantined, 0, "after {op:?}: the honest plugin had something quarantined");
        assert_eq!(totals.leaked_leases, 0, "after {op:?}: a lease was dropped without release");
        assert_eq!(
            snap.used,
            snap.reserved + snap.leased + snap.quarantined,
            "after {op:?}: used disagrees with the ledger {snap:?}"
        );
        for b in &self.bindings {
            assert!(b.quarantined().is_empty(), "after {op:?}: {:?}", b.quarantined());
        }
        let stats = self.manager.queue().stats();
        assert_eq!(stats.quarantined, 0, "after {op:?}");
        assert_eq!(stats.fence_errors, 0, "after {op:?}");
        let m = self.context.mechanism();
        assert_eq!(m.live(ObjectKind::Stream), self.streams.len() as u64, "after {op:?}: streams");
        let (bytes, allocs, regions, prefixes) = self.accounted();
        assert!(snap.used >= bytes, "after {op:?}: used {} < the {bytes} B live objects hold", snap.used);
        if self.manager.queue().pending() == 0 {
            assert_eq!(snap.used, bytes, "after {op:?}: used is not the live objects' charges");
            // Pins count at least these (streams and fences may count too).
            assert!(self.context.pins() >= allocs + regions + prefixes, "after {op:?}: pins");
            assert_eq!(m.live(ObjectKind::Allocation), allocs, "after {op:?}: allocations");
            assert_eq!(m.live(ObjectKind::Reservation), regions, "after {op:?}: reservations");
            assert_eq!(m.live(ObjectKind::PhysicalObject), prefixes, "after {op:?}: physical objects");
        }
    }

    fn apply(&mut self, op: &Op) {
        let before_used = self.pool.used();
        let before = self.quiet();
        // Whether a failure must have left the pool as it was.
        let mut failed = false;
        match *op {
            Op::Bind { holder, class, wait } => {
                let mut spec = BindingSpec::new(class);
                if let Some(i) = index_of(holder, self.holder_ids.len()) {
                    spec = spec.holder(self.holder_ids[i]);
                }
                if wait {
                    spec = spec.wait(Duration::ZERO);
                }
                let b = self
                    .manager
                    .bind(&self.context, &self.pool, spec)
                    .expect("every holder id is of this pool");
                self.bindings.push(b);
            }
            // See MAX_HUGE_ALIGNED.
            Op::Allocate { align, .. } if align > HUGE_ALIGNMENT && self.huge_aligned >= MAX_HUGE_ALIGNED => {
            }
            Op::Allocate { binding, size, align } => match self.binding(binding).allocate(size, align) {
                Ok(a) => {
                    assert!(a.size() >= size && a.charged() == a.size(), "{a:?} for {size} B");
                    if align.is_power_of_two() {
                        assert_eq!(a.addr() % align, 0, "{a:?} not aligned to {align}");
                    }
                    touch(a.addr(), a.size());
                    if align > HUGE_ALIGNMENT {
                        self.huge_aligned += 1;
                    }
                    self.allocs.push(a);
                }
                Err(_) => failed = true,
            },
            Op::DropAlloc { alloc } => {
                if let Some(i) = index_of(Some(alloc), self.allocs.len()) {
                    drop(self.allocs.swap_remove(i));
                }
            }
            Op::AllocUsedBy { alloc, fence } => {
                if let (Some(i), Some(f)) = (index_of(Some(alloc), self.allocs.len()), self.fence(fence)) {
                    self.allocs[i].used_by(f);
                }
            }
            Op::ReleaseAfter { alloc, ref fences } => {
                if let Some(i) = index_of(Some(alloc), self.allocs.len()) {
                    let fences = self.fences(fences);
                    self.allocs.swap_remove(i).release_after(fences);
                }
            }
            Op::NewFnFence => {
                let open = Arc::new(AtomicBool::new(false));
                let (q, w) = (open.clone(), open.clone());
                let fence = FnFence::new(
                    format!("gate {}", self.gates.len()),
                    move || q.load(Ordering::Acquire),
                    move |t| {
                        if !w.load(Ordering::Acquire) {
                            std::thread::sleep(t.min(Duration::from_micros(100)));
                        }
                        w.load(Ordering::Acquire)
                    },
                );
                self.gates.push(Gate { open, fence, stream: None });
            }
            Op::NewStream => {
                let sync = self.context.mechanism().sync().expect("selected with sync");
                let stream = sync.stream_create().expect("the CPU plugin makes streams");
                self.streams.push(StreamSlot { stream, serial: self.next_stream });
                self.next_stream += 1;
            }
            Op::StreamWork { stream, gated } => {
                if let Some(i) = index_of(Some(stream), self.streams.len()) {
                    let m = self.context.mechanism().clone();
                    let s = &self.streams[i];
                    let open = Arc::new(AtomicBool::new(!gated));
                    let o = open.clone();
                    m.sync()
                        .expect("sync")
                        .enqueue(&s.stream, move || {
                            while !o.load(Ordering::Acquire) {
                                std::thread::sleep(Duration::from_micros(50));
                            }
                        })
                        .expect("enqueue on a live stream");
                    let fence = PluginFence::record(&m, &s.stream).expect("record on a live stream");
                    self.gates.push(Gate { open, fence, stream: Some(s.serial) });
                }
            }
            Op::DestroyStream { stream } => {
                if let Some(i) = index_of(Some(stream), self.streams.len()) {
                    let s = self.streams.swap_remove(i);
                    // Its work must be able to finish: destroy waits for it.
                    for g in self.gates.iter().filter(|g| g.stream == Some(s.serial)) {
                        g.open.store(true, Ordering::Release);
                    }
                    let sync = self.context.mechanism().sync().expect("sync");
                    if let Err(e) = sync.stream_destroy(s.stream) {
                        panic!("the CPU plugin refused to destroy a stream: {}", e.error);
                    }
                }
            }
            Op::Complete { fence } => {
                if let Some(i) = index_of(Some(fence), self.gates.len()) {
                    self.gates[i].open.store(true, Ordering::Release);
                }
            }
            Op::ReserveVirtual { binding, max } => match self.binding(binding).reserve_virtual(max) {
                Ok(r) => {
                    assert!(r.capacity() >= max && r.is_empty() && r.committed() == 0, "{r:?} for {max}");
                    self.regions.push(r);
                }
                Err(_) => failed = true,
            },
            Op::GrowTo { region, len, fail } => {
                if let Some(i) = index_of(Some(region), self.regions.len()) {
                    let r = &mut self.regions[i];
                    let (old_len, old_committed) = (r.len(), r.committed());
                    let result = r.grow_to(len, |view| {
                        if fail {
                            return Err("refused by the fuzzer");
                        }
                        assert!(view.len > old_len, "grown view {view:?} not past {old_len}");
                        touch(view.addr + old_len, view.len - old_len);
                        Ok(())
                    });
                    match result {
                        Ok(()) if len <= old_len => assert_eq!(r.len(), old_len),
                        Ok(()) => {
                            assert!(!fail, "grow_to succeeded although the update refused");
                            assert!(
                                r.len() >= len && r.len() <= r.capacity(),
                                "{r:?} after growing to {len}"
                            );
                            assert_eq!(r.committed() % self.granularity, 0, "{r:?}");
                            let grown = r.committed() - old_committed;
                            if self.quiet() == before {
                                assert_eq!(
                                    self.pool.used(),
                                    before_used + grown,
                                    "growing charged the wrong bytes"
                                );
                            }
                        }
                        Err(_) => {
                            assert_eq!(
                                (r.len(), r.committed()),
                                (old_len, old_committed),
                                "a failed grow changed {r:?}"
                            );
                            failed = true;
                        }
                    }
                }
            }
            Op::ShrinkTo { region, len, ref fences } => {
                if let Some(i) = index_of(Some(region), self.regions.len()) {
                    let fences = self.fences(fences);
                    let r = &mut self.regions[i];
                    let (old_len, old_committed) = (r.len(), r.committed());
                    r.shrink_to(len, fences).expect("shrink_to does not fail");
                    let base = old_len - old_committed;
                    let g = self.granularity;
                    let keep = len.saturating_sub(base).div_ceil(g).saturating_mul(g);
                    assert_eq!(r.committed(), old_committed.min(keep), "{r:?} after shrinking to {len}");
                }
            }
            Op::RegionUsedBy { region, fence } => {
                if let (Some(i), Some(f)) = (index_of(Some(region), self.regions.len()), self.fence(fence)) {
                    self.regions[i].used_by(f);
                }
            }
            Op::DropRegion { region } => {
                if let Some(i) = index_of(Some(region), self.regions.len()) {
                    drop(self.regions.swap_remove(i));
                }
            }
            Op::CreateShared { binding, size, fill } => {
                let r = self.binding(binding).create_shared(size, |view| {
                    assert!(view.len >= size && view.len > 0, "{view:?} for {size} B");
                    // SAFETY: a fresh read-write CPU mapping of `view.len` bytes.
                    unsafe {
                        let p = view.addr as *mut u8;
                        p.write_volatile(fill);
                        p.add(view.len as usize - 1).write_volatile(fill);
                    }
                });
                match r {
                    Ok(p) => {
                        assert!(p.len() >= size && p.len() % self.granularity == 0 && p.charged() == p.len());
                        self.all_prefixes.push((Arc::downgrade(&p), fill));
                        self.prefixes.push((p, fill));
                    }
                    Err(_) => failed = true,
                }
            }
            Op::MapPrefix { region, prefix } => {
                let prefixes = self.live_prefixes();
                if let (Some(i), Some(j)) =
                    (index_of(Some(region), self.regions.len()), index_of(Some(prefix), prefixes.len()))
                {
                    let (p, fill) = &prefixes[j];
                    let r = &mut self.regions[i];
                    let (old_len, old_committed) = (r.len(), r.committed());
                    match r.map_prefix(p) {
                        Ok(()) => {
                            assert_eq!((old_len, r.len(), r.committed()), (0, p.len(), 0));
                            // SAFETY: the prefix is mapped readable at the
                            // region's start.
                            let (first, last) = unsafe {
                                let a = r.addr() as *const u8;
                                (a.read_volatile(), a.add(p.len() as usize - 1).read_volatile())
                            };
                            assert_eq!((first, last), (*fill, *fill), "the region does not show the prefix");
                        }
                        Err(_) => {
                            assert_eq!((r.len(), r.committed()), (old_len, old_committed));
                            failed = true;
                        }
                    }
                }
            }
            Op::DropPrefix { prefix } => {
                if let Some(i) = index_of(Some(prefix), self.prefixes.len()) {
                    drop(self.prefixes.swap_remove(i));
                }
            }
            Op::RegisterHolder { priority, behaviour } => {
                let cache: Cache = Arc::default();
                let c = cache.clone();
                let registration = self.pool.register_holder(
                    &format!("holder {}", self.holder_ids.len()),
                    Priority(priority),
                    move |t: &PressureTicket| answer(&c, behaviour, t),
                );
                self.holder_ids.push(registration.id());
                self.holders.push(Holder { registration, cache });
            }
            Op::UnregisterHolder { holder } => {
                if let Some(i) = index_of(Some(holder), self.holders.len()) {
                    let h = self.holders.swap_remove(i);
                    drop(h.registration);
                    self.take_back(&h.cache);
                }
            }
            Op::GiveAlloc { alloc, holder } => {
                if let (Some(i), Some(h)) =
                    (index_of(Some(alloc), self.allocs.len()), index_of(Some(holder), self.holders.len()))
                {
                    let a = self.allocs.swap_remove(i);
                    lock(&self.holders[h].cache).push(Victim::Alloc(a));
                }
            }
            Op::GiveRegion { region, holder } => {
                if let (Some(i), Some(h)) =
                    (index_of(Some(region), self.regions.len()), index_of(Some(holder), self.holders.len()))
                {
                    let r = self.regions.swap_remove(i);
                    lock(&self.holders[h].cache).push(Victim::Region(r));
                }
            }
            Op::Poll => {
                let report = self.manager.poll();
                assert_eq!(report.quarantined, 0);
                assert_eq!(report.still_pending, self.manager.queue().pending());
            }
            Op::Drain => {
                let report = self.manager.drain(Duration::ZERO);
                assert_eq!(report.quarantined, 0);
                assert_eq!(report.left.len(), self.manager.queue().pending());
            }
        }
        record(op.name(), !failed);
        let after = self.quiet();
        if after.tickets != before.tickets {
            record("(pressure tickets)", true);
        }
        if failed && after == before {
            assert_eq!(self.pool.used(), before_used, "a failed {op:?} changed the pool");
        }
        self.check(op);
    }

    fn fence(&self, i: usize) -> Option<SharedFence> {
        index_of(Some(i), self.gates.len()).map(|i| self.gates[i].fence.clone())
    }

    /// Moves what a holder was given back to the harness.
    fn take_back(&mut self, cache: &Cache) {
        for v in std::mem::take(&mut *lock(cache)) {
            match v {
                Victim::Alloc(a) => self.allocs.push(a),
                Victim::Region(r) => self.regions.push(r),
            }
        }
    }

    /// Drops everything, opens every gate, drains, and checks that nothing
    /// is left anywhere; then unloads the plugin.
    fn finish(mut self) {
        for g in &self.gates {
            g.open.store(true, Ordering::Release);
        }
        for h in std::mem::take(&mut self.holders) {
            drop(h.registration);
            self.take_back(&h.cache);
        }
        self.allocs.clear();
        self.regions.clear();
        self.prefixes.clear();
        self.gates.clear();
        let report = self.manager.drain(Duration::from_secs(30));
        assert!(report.is_complete(), "drain left {:?}", report.left);
        assert_eq!(report.quarantined, 0);
        let sync = self.context.mechanism().sync().expect("sync");
        for s in std::mem::take(&mut self.streams) {
            if let Err(e) = sync.stream_destroy(s.stream) {
                panic!("the CPU plugin refused to destroy a stream: {}", e.error);
            }
        }
        assert!(self.live_prefixes().is_empty(), "a prefix outlived every region and handle");
        let end = Op::Drain;
        self.check(&end);
        let snap = self.pool.snapshot();
        assert_eq!((snap.used, snap.quarantined), (0, 0), "{snap:?}");
        assert_eq!(self.manager.queue().pending(), 0);
        assert_eq!(self.context.pins(), 0);
        let m = self.context.mechanism();
        for k in ObjectKind::ALL {
            assert_eq!(m.live(k), 0, "{} still live", k.name());
        }
        let reports = self.manager.registry().live_reports();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].1.plugin_reported, 0, "the CPU plugin still holds objects: {}", reports[0].1);
        let Rig { manager, context, bindings, pool, .. } = self;
        drop(bindings);
        drop(context);
        if let Err(e) = manager.unload_plugin(&reports[0].0) {
            panic!("the plugin does not unload after everything was released: {e}");
        }
        drop(pool);
    }
}

fn index_of(i: Option<usize>, len: usize) -> Option<usize> {
    match i {
        Some(i) if len > 0 => Some(i % len),
        _ => None,
    }
}

/// A holder's answer to a ticket.
fn answer(cache: &Cache, behaviour: Behaviour, t: &PressureTicket) -> u64 {
    match behaviour {
        Behaviour::Nothing => 0,
        Behaviour::Lie => t.bytes_wanted,
        Behaviour::ReleaseWanted | Behaviour::ReleaseAll => {
            let mut released = 0u64;
            while behaviour == Behaviour::ReleaseAll || released < t.bytes_wanted {
                // The lock is not held while the victim drops: dropping
                // re-enters the governor (and maybe the plugin).
                let Some(v) = lock(cache).pop() else { break };
                released = released.saturating_add(v.charged());
                drop(v);
            }
            released
        }
    }
}

/// Writes the first and the last byte of CPU memory the host handed out.
fn touch(addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    // SAFETY: `[addr, addr + len)` is memory the host just reported as
    // allocated or committed read-write; a fault here is the finding.
    unsafe {
        let p = addr as *mut u8;
        p.write_volatile(0xa5);
        p.add(len as usize - 1).write_volatile(0x5a);
        assert_eq!(p.read_volatile(), if len == 1 { 0x5a } else { 0xa5 });
    }
}

// ----- the target ------------------------------------------------------------

fn decode(data: &[u8]) -> (u64, Vec<Op>) {
    let mut u = Unstructured::new(data);
    let capacity = interesting_u64(&mut u, &[1 << 20, 0, 4096, 64 << 10, 4 << 20]).unwrap_or(0) % (8 << 20);
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        match Op::decode(&mut u, capacity) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    (capacity, ops)
}

/// Runs one input. Panics (the fuzzer's crash) when the host misbehaves.
pub fn run(data: &[u8]) {
    let _serial = lock(&SERIAL);
    let (capacity, ops) = decode(data);
    let mut rig = Rig::new(capacity);
    for op in &ops {
        rig.apply(op);
    }
    rig.finish();
}

/// The operations an input decodes to (for reading a crash).
pub fn describe(data: &[u8]) -> String {
    let (capacity, ops) = decode(data);
    let mut out = format!("pool capacity {capacity}\n");
    for op in ops {
        out += &format!("{op:?}\n");
    }
    out
}
