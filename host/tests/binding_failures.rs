//! Failure injection through a real plugin: every binding transaction
//! rolls back exactly when the plugin fails one of its steps (invariant 2),
//! and a release the plugin cannot complete is quarantined (invariant 7).
//!
//! The plugin is an in-process `memplug_sdk` plugin over real memory from
//! the system allocator: plain allocations, reservations whose bytes are a
//! real zeroed block (commit/decommit track granules and zero on decommit),
//! and physical objects whose mappings copy bytes in on `map` and back out
//! on the unmap of a writable mapping. Any of its slots can be told to fail
//! its k-th next call; a failing call changes nothing, as the ABI requires.
//!
//! Each test gets its own instance of the plugin (one entry function each,
//! see `arena_plugin!`), so tests running in parallel never see each
//! other's objects or armed faults.

mod common;

use common::*;
use memplug_host::governor::GovernorError;
use memplug_host::{
    BindingError, GrowError, LoadOptions, ObjectKind, Plugin, PollReport, Region, Requirements, Status,
};
use memplug_sdk::{
    Access, Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef, PluginBuilder, PluginError,
    PluginResult, Properties, Request, SharedMapping, VirtualBacking,
};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

// ---------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------

const GRANULE: u64 = 4096;
/// Allocations are rounded up to this, so the bytes obtained can exceed
/// the bytes asked for (as granular device allocators do).
const ALLOC_ROUND: u64 = 64;

/// The slots whose failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Allocate,
    Deallocate,
    Reserve,
    Commit,
    Decommit,
    Release,
    Create,
    Map,
    Unmap,
    ReleaseObject,
}

const OPS: usize = 10;

/// Per slot: a countdown to the injected failure (-1: none armed), calls
/// seen, failures fired.
#[derive(Default)]
struct Faults {
    countdown: [AtomicI64; OPS],
    calls: [AtomicU64; OPS],
    fired: [AtomicU64; OPS],
}

impl Faults {
    fn disarm_all(&self) {
        for c in &self.countdown {
            c.store(-1, Ordering::SeqCst);
        }
    }

    /// The `k`-th next call of `op` (0: the very next one) fails, once.
    fn arm(&self, op: Op, k: i64) {
        self.countdown[op as usize].store(k, Ordering::SeqCst);
    }

    fn fired(&self, op: Op) -> u64 {
        self.fired[op as usize].load(Ordering::SeqCst)
    }

    fn hit(&self, op: Op) -> PluginResult<()> {
        let i = op as usize;
        let call = self.calls[i].fetch_add(1, Ordering::SeqCst);
        let fire = self.countdown[i]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| match c {
                c if c < 0 => None,
                0 => Some(-1),
                c => Some(c - 1),
            })
            .is_ok_and(|prev| prev == 0);
        if fire {
            self.fired[i].fetch_add(1, Ordering::SeqCst);
            let status =
                if op == Op::Allocate || op == Op::Create { Status::OutOfMemory } else { Status::Internal };
            return Err(PluginError::new(status, format!("injected failure of {op:?} (call #{call})")));
        }
        Ok(())
    }
}

struct Alloc {
    object_id: u64,
    addr: u64,
    size: u64,
    layout: Layout,
}

struct Res {
    object_id: u64,
    addr: u64,
    size: u64,
    /// Committed granules, by index.
    committed: BTreeSet<u64>,
    /// Mappings by offset: (len, object handle, object offset, access).
    mappings: BTreeMap<u64, (u64, u64, u64, Access)>,
}

struct Obj {
    object_id: u64,
    data: Vec<u8>,
    host_refs: u64,
    mappings: u64,
}

type Probe = Arc<dyn Fn(Op, u64) + Send + Sync>;

/// The mechanism: real memory, exact bookkeeping, injectable failures.
#[derive(Default)]
struct Arena {
    faults: Faults,
    next: AtomicU64,
    allocs: Mutex<HashMap<u64, Alloc>>,
    /// Every address handed back to the system allocator.
    freed: Mutex<Vec<u64>>,
    reservations: Mutex<HashMap<u64, Res>>,
    objects: Mutex<HashMap<u64, Obj>>,
    /// Called at the start of allocate (bytes asked) and commit (bytes).
    probe: Mutex<Option<Probe>>,
}

fn unknown(what: &str, r: &ObjectRef) -> PluginError {
    PluginError::unknown_allocation(format!("no live {what} with handle {}", r.handle))
}

fn check_range(offset: u64, len: u64, size: u64) -> PluginResult<()> {
    if offset % GRANULE != 0
        || len % GRANULE != 0
        || len == 0
        || offset.checked_add(len).is_none_or(|e| e > size)
    {
        return Err(PluginError::out_of_range(format!(
            "range +{offset} ({len} B) is not whole granules inside {size} B"
        )));
    }
    Ok(())
}

impl Arena {
    fn handle(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn probe(&self, op: Op, bytes: u64) {
        let p = self.probe.lock().unwrap().clone();
        if let Some(p) = p {
            p(op, bytes);
        }
    }

    fn live_objects(&self) -> u64 {
        (self.allocs.lock().unwrap().len()
            + self.reservations.lock().unwrap().len()
            + self.objects.lock().unwrap().len()) as u64
    }

    /// Committed bytes over every reservation.
    fn committed(&self) -> u64 {
        self.reservations.lock().unwrap().values().map(|r| r.committed.len() as u64 * GRANULE).sum()
    }

    fn is_live_alloc(&self, addr: u64) -> bool {
        self.allocs.lock().unwrap().values().any(|a| a.addr == addr)
    }

    fn drop_mapping(objects: &mut HashMap<u64, Obj>, handle: u64) {
        if let Some(o) = objects.get_mut(&handle) {
            o.mappings -= 1;
            if o.host_refs == 0 && o.mappings == 0 {
                objects.remove(&handle);
            }
        }
    }
}

impl Allocator for Arena {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: GRANULE }
    }

    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        self.probe(Op::Allocate, r.size);
        self.faults.hit(Op::Allocate)?;
        let size = r.size.max(1).div_ceil(ALLOC_ROUND) * ALLOC_ROUND;
        let layout = Layout::from_size_align(size as usize, r.alignment.max(16) as usize)
            .map_err(|e| PluginError::invalid_argument(e.to_string()))?;
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(PluginError::out_of_memory("system allocator refused"));
        }
        let addr = p as u64;
        let handle = self.handle();
        self.allocs.lock().unwrap().insert(handle, Alloc { object_id: r.object_id, addr, size, layout });
        Ok(Block { addr, size, handle })
    }

    fn deallocate(&self, r: &ObjectRef) -> PluginResult<()> {
        let mut allocs = self.allocs.lock().unwrap();
        match allocs.get(&r.handle) {
            Some(a) if a.object_id == r.object_id && a.addr == r.addr && a.size == r.size => {}
            _ => return Err(unknown("allocation", r)),
        }
        // A failed call changes nothing: the block stays allocated.
        self.faults.hit(Op::Deallocate)?;
        let a = allocs.remove(&r.handle).expect("checked above");
        drop(allocs);
        // SAFETY: allocated above with this layout, freed once.
        unsafe { dealloc(a.addr as *mut u8, a.layout) };
        self.freed.lock().unwrap().push(a.addr);
        Ok(())
    }
}

impl VirtualBacking for Arena {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        self.faults.hit(Op::Reserve)?;
        let size = r.size.max(1).div_ceil(GRANULE) * GRANULE;
        let layout = Layout::from_size_align(size as usize, GRANULE as usize)
            .map_err(|e| PluginError::invalid_argument(e.to_string()))?;
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(PluginError::out_of_memory("system allocator refused"));
        }
        let handle = self.handle();
        self.reservations.lock().unwrap().insert(
            handle,
            Res {
                object_id: r.object_id,
                addr: p as u64,
                size,
                committed: BTreeSet::new(),
                mappings: BTreeMap::new(),
            },
        );
        Ok(Block { addr: p as u64, size, handle })
    }

    fn commit(&self, r: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        self.probe(Op::Commit, len);
        let mut rs = self.reservations.lock().unwrap();
        let res = rs
            .get_mut(&r.handle)
            .filter(|x| x.object_id == r.object_id)
            .ok_or_else(|| unknown("reservation", r))?;
        check_range(offset, len, res.size)?;
        let granules = offset / GRANULE..(offset + len) / GRANULE;
        if granules.clone().any(|g| res.committed.contains(&g)) {
            return Err(PluginError::invalid_state("commit: already committed"));
        }
        if res.mappings.range(..offset + len).any(|(o, (l, ..))| o + l > offset) {
            return Err(PluginError::invalid_state("commit: range is mapped"));
        }
        self.faults.hit(Op::Commit)?;
        res.committed.extend(granules);
        Ok(())
    }

    fn decommit(&self, r: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let mut rs = self.reservations.lock().unwrap();
        let res = rs
            .get_mut(&r.handle)
            .filter(|x| x.object_id == r.object_id)
            .ok_or_else(|| unknown("reservation", r))?;
        check_range(offset, len, res.size)?;
        let granules = offset / GRANULE..(offset + len) / GRANULE;
        if !granules.clone().all(|g| res.committed.contains(&g)) {
            return Err(PluginError::invalid_state("decommit: not committed"));
        }
        self.faults.hit(Op::Decommit)?;
        for g in granules {
            res.committed.remove(&g);
        }
        // SAFETY: inside the reservation's block.
        unsafe { std::ptr::write_bytes((res.addr + offset) as *mut u8, 0, len as usize) };
        Ok(())
    }

    fn committed_bytes(&self, r: &ObjectRef) -> PluginResult<u64> {
        let rs = self.reservations.lock().unwrap();
        let res = rs
            .get(&r.handle)
            .filter(|x| x.object_id == r.object_id)
            .ok_or_else(|| unknown("reservation", r))?;
        Ok(res.committed.len() as u64 * GRANULE)
    }

    fn release(&self, r: &ObjectRef) -> PluginResult<()> {
        let mut rs = self.reservations.lock().unwrap();
        if rs.get(&r.handle).is_none_or(|x| x.object_id != r.object_id) {
            return Err(unknown("reservation", r));
        }
        self.faults.hit(Op::Release)?;
        let res = rs.remove(&r.handle).expect("checked above");
        drop(rs);
        let mut objects = self.objects.lock().unwrap();
        for (_, (_, handle, _, _)) in res.mappings {
            Arena::drop_mapping(&mut objects, handle);
        }
        drop(objects);
        let layout = Layout::from_size_align(res.size as usize, GRANULE as usize).unwrap();
        // SAFETY: allocated in reserve with this layout, freed once.
        unsafe { dealloc(res.addr as *mut u8, layout) };
        Ok(())
    }
}

impl SharedMapping for Arena {
    fn create(&self, r: &Request) -> PluginResult<Block> {
        self.faults.hit(Op::Create)?;
        let size = r.size.max(1).div_ceil(GRANULE) * GRANULE;
        let handle = self.handle();
        self.objects.lock().unwrap().insert(
            handle,
            Obj { object_id: r.object_id, data: vec![0; size as usize], host_refs: 1, mappings: 0 },
        );
        Ok(Block { addr: 0, size, handle })
    }

    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        r: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        let mut rs = self.reservations.lock().unwrap();
        let res = rs
            .get_mut(&r.handle)
            .filter(|x| x.object_id == r.object_id)
            .ok_or_else(|| unknown("reservation", r))?;
        check_range(offset, len, res.size)?;
        let mut objects = self.objects.lock().unwrap();
        let obj = objects
            .get_mut(&object.handle)
            .filter(|o| o.object_id == object.object_id && o.host_refs > 0)
            .ok_or_else(|| unknown("physical object", object))?;
        check_range(object_offset, len, obj.data.len() as u64)?;
        if (offset / GRANULE..(offset + len) / GRANULE).any(|g| res.committed.contains(&g))
            || res.mappings.range(..offset + len).any(|(o, (l, ..))| o + l > offset)
        {
            return Err(PluginError::invalid_state("map: range in use"));
        }
        self.faults.hit(Op::Map)?;
        let src = &obj.data[object_offset as usize..(object_offset + len) as usize];
        // SAFETY: inside the reservation's block, which does not overlap a Vec.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (res.addr + offset) as *mut u8, len as usize) };
        obj.mappings += 1;
        res.mappings.insert(offset, (len, object.handle, object_offset, access));
        Ok(())
    }

    fn unmap(&self, r: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let mut rs = self.reservations.lock().unwrap();
        let res = rs
            .get_mut(&r.handle)
            .filter(|x| x.object_id == r.object_id)
            .ok_or_else(|| unknown("reservation", r))?;
        match res.mappings.get(&offset) {
            Some((l, ..)) if *l == len => {}
            _ => return Err(PluginError::invalid_state("unmap: no such mapping")),
        }
        self.faults.hit(Op::Unmap)?;
        let (_, handle, object_offset, access) = res.mappings.remove(&offset).expect("checked above");
        let mut objects = self.objects.lock().unwrap();
        if access == Access::ReadWrite {
            if let Some(o) = objects.get_mut(&handle) {
                let dst = &mut o.data[object_offset as usize..(object_offset + len) as usize];
                // SAFETY: inside the reservation's block.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (res.addr + offset) as *const u8,
                        dst.as_mut_ptr(),
                        len as usize,
                    )
                };
            }
        }
        // SAFETY: inside the reservation's block.
        unsafe { std::ptr::write_bytes((res.addr + offset) as *mut u8, 0, len as usize) };
        Arena::drop_mapping(&mut objects, handle);
        Ok(())
    }

    fn retain(&self, object: &ObjectRef) -> PluginResult<()> {
        let mut objects = self.objects.lock().unwrap();
        let o = objects
            .get_mut(&object.handle)
            .filter(|o| o.object_id == object.object_id && o.host_refs > 0)
            .ok_or_else(|| unknown("physical object", object))?;
        o.host_refs += 1;
        Ok(())
    }

    fn release(&self, object: &ObjectRef) -> PluginResult<()> {
        let mut objects = self.objects.lock().unwrap();
        let o = objects
            .get_mut(&object.handle)
            .filter(|o| o.object_id == object.object_id && o.host_refs > 0)
            .ok_or_else(|| unknown("physical object", object))?;
        self.faults.hit(Op::ReleaseObject)?;
        o.host_refs -= 1;
        if o.host_refs == 0 && o.mappings == 0 {
            objects.remove(&object.handle);
        }
        Ok(())
    }
}

fn build(cell: &'static OnceLock<&'static Arena>) -> ExportedPlugin {
    let m = MechanismBuilder::new("arena", 1, CPU0, Arena::default()).virtual_backing().shared_mapping();
    let state: &'static Arena = m.implementation();
    state.faults.disarm_all();
    let _ = cell.set(state);
    PluginBuilder::new("arena", "1").mechanism(m.build()).live_objects(move || state.live_objects()).build()
}

/// One private instance of the plugin: a module with its own entry
/// function (and so its own state), and `rig(capacity)`.
macro_rules! arena_plugin {
    ($name:ident) => {
        mod $name {
            use super::*;
            static STATE: OnceLock<&'static Arena> = OnceLock::new();
            fn init() -> ExportedPlugin {
                build(&STATE)
            }
            memplug_sdk::declare_entry!(entry, init);
            pub fn rig(capacity: u64) -> (Rig, &'static Arena) {
                // SAFETY: an SDK-generated entry.
                let plugin = unsafe { Plugin::from_entry(entry, stringify!($name), &LoadOptions::default()) }
                    .expect("load the arena plugin");
                let arena = *STATE.get().expect("built on negotiation");
                let req = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
                (Rig::new(plugin, req, capacity), arena)
            }
        }
    };
}

// ---------------------------------------------------------------------------
// What must come back after a rolled-back transaction
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
struct World {
    ledger: Ledger,
    host_live: [u64; 5],
    plugin_live: u64,
    plugin_committed: u64,
    quarantined: usize,
}

fn world(rig: &Rig, arena: &Arena) -> World {
    World {
        ledger: Ledger::of(&rig.pool),
        host_live: live(rig.mechanism()),
        plugin_live: arena.live_objects(),
        plugin_committed: arena.committed(),
        quarantined: rig.binding.quarantined().len(),
    }
}

fn assert_injected(e: &dyn std::fmt::Display) {
    assert!(e.to_string().contains("injected failure"), "not the injected failure: {e}");
}

// ---------------------------------------------------------------------------
// Rollback
// ---------------------------------------------------------------------------

arena_plugin!(sweep);

/// Everything one scenario keeps alive.
#[derive(Default)]
struct Held {
    allocations: Vec<memplug_host::OwnedAllocation>,
    regions: Vec<Region>,
    prefix: Option<Arc<memplug_host::SharedPrefix>>,
}

/// One transaction of the scenario.
#[derive(Clone, Copy, Debug)]
enum Step {
    Allocate(u64),
    Reserve,
    /// Region index, usable length wanted.
    Grow(usize, u64),
    CreateShared,
    /// Maps the prefix into region 1.
    MapPrefix,
}

const SCENARIO: [Step; 12] = [
    Step::Allocate(1000),
    Step::Allocate(64),
    Step::Allocate(4096),
    Step::Reserve,
    Step::Grow(0, 8 * KIB),
    Step::Grow(0, 16 * KIB),
    Step::Grow(0, 32 * KIB),
    Step::Grow(0, 64 * KIB),
    Step::CreateShared,
    Step::Reserve,
    Step::MapPrefix,
    Step::Grow(1, 24 * KIB),
];

fn run(step: Step, rig: &Rig, h: &mut Held) -> Result<(), String> {
    let b = &rig.binding;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    match step {
        Step::Allocate(size) => h.allocations.push(b.allocate(size, 16).map_err(|x| e(&x))?),
        Step::Reserve => h.regions.push(b.reserve_virtual(MIB).map_err(|x| e(&x))?),
        Step::Grow(i, len) => h.regions[i].grow_to(len, |_| Ok::<(), ()>(())).map_err(|x| e(&x))?,
        Step::CreateShared => {
            let p = b
                .create_shared(16 * KIB, |v| {
                    // SAFETY: host memory of the arena plugin, writable
                    // through the temporary mapping, ours alone.
                    unsafe { v.as_mut_slice().fill(0x7E) }
                })
                .map_err(|x| e(&x))?;
            h.prefix = Some(p);
        }
        Step::MapPrefix => {
            let p = h.prefix.clone().expect("made by an earlier step");
            h.regions[1].map_prefix(&p).map_err(|x| e(&x))?
        }
    }
    Ok(())
}

/// Runs the scenario with the failure `(op, k)` armed. The step that fails
/// must leave the world — ledger, live objects on both sides, committed
/// bytes, every region's view — exactly as it was, and then succeed when
/// called again.
fn scenario(rig: &Rig, arena: &Arena, op: Op, k: i64) {
    let mut held = Held::default();
    arena.faults.arm(op, k);
    let fired_before = arena.faults.fired(op);
    let mut failures = 0;
    for step in SCENARIO {
        let before = world(rig, arena);
        let views = |h: &Held| -> Vec<(u64, u64, u64)> {
            h.regions.iter().map(|r| (r.addr(), r.len(), r.committed())).collect()
        };
        let views_before = views(&held);
        if let Err(e) = run(step, rig, &mut held) {
            failures += 1;
            assert_injected(&e);
            assert_eq!(
                world(rig, arena),
                before,
                "{op:?} failing at call {k} in {step:?} did not roll back exactly"
            );
            assert_eq!(views(&held), views_before, "a region's view changed in {step:?}");
            // Disarmed now: the same transaction succeeds.
            run(step, rig, &mut held).unwrap_or_else(|e| panic!("{step:?} after the rollback: {e}"));
        }
    }
    assert_eq!(failures, 1, "{op:?} at call {k} should fail exactly one step");
    assert_eq!(arena.faults.fired(op), fired_before + 1);

    // The prefix is visible through the region that maps it.
    let r1 = &held.regions[1];
    // SAFETY: the arena's reservation memory is host memory.
    let head = unsafe { std::slice::from_raw_parts(r1.addr() as *const u8, 16 * KIB as usize) };
    assert!(head.iter().all(|b| *b == 0x7E), "prefix bytes lost in {op:?}/{k}");

    drop(held);
    rig.manager.poll();
    assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
    assert_eq!(live(rig.mechanism()), [0; 5]);
    assert_eq!((arena.live_objects(), arena.committed()), (0, 0));
    assert!(rig.binding.quarantined().is_empty());
}

#[test]
fn invariant_2_every_injected_failure_rolls_back_exactly() {
    let (rig, arena) = sweep::rig(16 * MIB);
    let cases = [
        (Op::Allocate, 0),
        (Op::Allocate, 2),
        (Op::Reserve, 0),
        (Op::Commit, 0),
        (Op::Commit, 3),
        (Op::Create, 0),
        // create_shared fills through a temporary reservation and mapping.
        (Op::Reserve, 1),
        (Op::Map, 0),
        (Op::Reserve, 2),
        (Op::Map, 1),
        (Op::Commit, 4),
    ];
    for (op, k) in cases {
        scenario(&rig, arena, op, k);
    }
    rig.unload();
}

arena_plugin!(fill_cleanup);

/// A failed unmap or release of the temporary reservation `create_shared`
/// fills through must not strand it: the call fails, and everything it made
/// is given back or recorded as quarantined.
#[test]
fn invariant_2_create_shared_cleans_up_its_fill_mapping_when_unmap_or_release_fail() {
    let (rig, arena) = fill_cleanup::rig(16 * MIB);
    for op in [Op::Unmap, Op::Release] {
        let before = world(&rig, arena);
        arena.faults.arm(op, 0);
        let e = rig.binding.create_shared(16 * KIB, |_| {}).expect_err("the fill failed");
        assert_injected(&e);
        assert_eq!(arena.faults.fired(op), 1);
        let after = world(&rig, arena);
        assert_eq!(after.ledger, before.ledger, "{op:?}: the charge was not returned");
        if after.quarantined == before.quarantined {
            assert_eq!(after, before, "{op:?}: not rolled back, and nothing on record");
        } else {
            // A temporary reservation the plugin would not release: on
            // record, still counted live, never charged.
            let q = rig.binding.quarantined();
            assert!(q.last().unwrap().contains("reservation"), "{q:?}");
            assert_eq!(after.host_live[1], before.host_live[1] + 1, "{op:?}");
            assert_eq!(after.plugin_live, before.plugin_live + 1, "{op:?}");
        }
        arena.faults.disarm_all();
    }
}

arena_plugin!(update);

#[test]
fn invariant_2_a_refused_grow_update_is_rolled_back_after_seeing_the_charge() {
    let (rig, arena) = update::rig(MIB);
    let mut region = rig.binding.reserve_virtual(512 * KIB).unwrap();
    region.grow_to(64 * KIB, |_| Ok::<(), ()>(())).unwrap();
    let before = world(&rig, arena);
    let pool = rig.pool.clone();
    let seen = Mutex::new(None);
    let r = region.grow_to(200 * KIB, |v| {
        // During the update the new range is committed and already charged.
        *seen.lock().unwrap() = Some((v.len, pool.used(), arena.committed()));
        Err("the runtime refused")
    });
    match r {
        Err(GrowError::Update(msg)) => assert_eq!(msg, "the runtime refused"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        *seen.lock().unwrap(),
        Some((200 * KIB, 200 * KIB, 200 * KIB)),
        "rounded up to the granule: 200 KiB = 50 granules"
    );
    assert_eq!(world(&rig, arena), before);
    assert_eq!((region.len(), region.committed()), (64 * KIB, 64 * KIB));
    // Past bytes unchanged, and the region still grows.
    region.grow_to(128 * KIB, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(rig.pool.used(), 128 * KIB);
    drop(region);
    assert!(Ledger::of(&rig.pool).is_zero());
    assert_eq!(arena.live_objects(), 0);
}

arena_plugin!(order);

#[test]
fn invariant_2_the_charge_is_granted_before_the_plugin_allocates_or_commits() {
    let (rig, arena) = order::rig(MIB);
    let pool = rig.pool.clone();
    let seen: Arc<Mutex<Vec<(Op, u64, u64)>>> = Arc::default();
    let s = seen.clone();
    *arena.probe.lock().unwrap() = Some(Arc::new(move |op, bytes| {
        s.lock().unwrap().push((op, bytes, pool.used()));
    }));
    let a = rig.binding.allocate(1000, 16).unwrap();
    let mut region = rig.binding.reserve_virtual(256 * KIB).unwrap();
    region.grow_to(64 * KIB, |_| Ok::<(), ()>(())).unwrap();
    *arena.probe.lock().unwrap() = None;
    // (op, bytes asked, pool.used() when the plugin was called)
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(Op::Allocate, 1000, 1000), (Op::Commit, 64 * KIB, 1024 + 64 * KIB)]
    );
    drop((a, region));
    assert!(Ledger::of(&rig.pool).is_zero());
}

arena_plugin!(actual);

#[test]
fn invariant_2_accounting_follows_the_bytes_the_plugin_actually_mapped() {
    let (rig, arena) = actual::rig(1000);
    // 100 B asked, 128 B obtained (the plugin rounds to 64): 128 charged.
    let small = rig.binding.allocate(100, 16).unwrap();
    assert_eq!((small.size(), small.charged(), rig.pool.used()), (128, 128, 128));
    // 850 B fit the pool (978 of 1000); the 896 B obtained do not: the
    // block is given back, the grant returned, and the refusal names the
    // 46 B that did not fit.
    let before = world(&rig, arena);
    match rig.binding.allocate(850, 16) {
        Err(BindingError::Budget(GovernorError::OutOfBudget(o))) => {
            assert_eq!(o.requested, 896 - 850);
            assert_eq!(o.snapshot.used, 978, "taken while the grant was still held");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(world(&rig, arena), before);
    assert_eq!(arena.freed.lock().unwrap().len(), 1, "the rolled-back block was freed");
    drop(small);
    assert!(Ledger::of(&rig.pool).is_zero());
    assert_eq!(arena.live_objects(), 0);
}

// ---------------------------------------------------------------------------
// Quarantine
// ---------------------------------------------------------------------------

arena_plugin!(dealloc);

#[test]
fn invariant_7_a_failed_deallocate_is_quarantined_never_reissued_and_blocks_unload() {
    let (rig, arena) = dealloc::rig(MIB);
    let a = rig.binding.allocate(4096, 64).unwrap();
    let addr = a.addr();
    arena.faults.arm(Op::Deallocate, 0);
    drop(a);
    assert_eq!(arena.faults.fired(Op::Deallocate), 1);

    // The charge stays, as quarantined; nothing was refunded.
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (4096, 0, 4096));
    let q = rig.binding.quarantined();
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(q[0].contains("allocation") && q[0].contains("injected failure"), "{q:?}");
    // Both sides still count it; the plugin still holds the block.
    assert_eq!(rig.mechanism().live(ObjectKind::Allocation), 1);
    assert!(arena.is_live_alloc(addr));
    assert!(!arena.freed.lock().unwrap().contains(&addr));

    // Its address is never handed out again.
    let more: Vec<_> = (0..64).map(|_| rig.binding.allocate(4096, 64).unwrap()).collect();
    assert!(more.iter().all(|m| m.addr() != addr));
    drop(more);
    assert_eq!(rig.pool.used(), 4096);

    // The plugin cannot unload while it holds the quarantined block.
    let (manager, msg) = rig.unload_refused();
    assert!(msg.contains("cannot unload") && msg.contains("1 allocations of mechanism 'arena'"), "{msg}");
    assert_eq!(manager.registry().plugins(), vec!["arena".to_string()]);
}

arena_plugin!(deferred_dealloc);

#[test]
fn invariant_7_a_failed_deferred_deallocate_is_counted_quarantined_by_the_queue() {
    let (rig, arena) = deferred_dealloc::rig(MIB);
    let a = rig.binding.allocate(8192, 64).unwrap();
    let gate = Gate::new("kernel");
    a.release_after(vec![gate.fence.clone()]);
    arena.faults.arm(Op::Deallocate, 0);
    assert_eq!(rig.manager.poll().still_pending, 1);
    assert_eq!(arena.faults.fired(Op::Deallocate), 0, "not before the fence");
    gate.open();
    assert_eq!(rig.manager.poll(), PollReport { retired: 0, quarantined: 1, still_pending: 0 });
    let stats = rig.manager.queue().stats();
    assert_eq!((stats.quarantined, stats.retired, stats.pending), (1, 0, 0));
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.quarantined), (8192, 8192));
    assert_eq!(rig.binding.quarantined().len(), 1);
    assert_eq!(arena.live_objects(), 1);
}

arena_plugin!(decommit);

#[test]
fn invariant_7_a_failed_decommit_quarantines_the_shrunk_tail() {
    let (rig, arena) = decommit::rig(MIB);
    let mut region = rig.binding.reserve_virtual(512 * KIB).unwrap();
    region.grow_to(128 * KIB, |_| Ok::<(), ()>(())).unwrap();
    arena.faults.arm(Op::Decommit, 0);
    region.shrink_to(64 * KIB, Vec::new()).unwrap();
    assert_eq!(arena.faults.fired(Op::Decommit), 1);
    assert_eq!(region.committed(), 64 * KIB);
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (128 * KIB, 64 * KIB, 64 * KIB));
    let q = rig.binding.quarantined();
    assert!(q.len() == 1 && q[0].contains("region range"), "{q:?}");
    // The quarantined range is never committed again.
    assert_eq!(arena.committed(), 128 * KIB);
    assert!(region.grow_to(128 * KIB, |_| Ok::<(), ()>(())).is_err());
    assert_eq!(arena.committed(), 128 * KIB);
    assert_eq!(rig.pool.used(), 128 * KIB);
    drop(region);
    // The rest is refunded with the release; the quarantined part stays.
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (64 * KIB, 0, 64 * KIB));
    assert_eq!(arena.live_objects(), 0);
}

arena_plugin!(release);

#[test]
fn invariant_7_a_failed_release_quarantines_the_region_and_blocks_unload() {
    let (rig, arena) = release::rig(MIB);
    let mut region = rig.binding.reserve_virtual(512 * KIB).unwrap();
    region.grow_to(96 * KIB, |_| Ok::<(), ()>(())).unwrap();
    arena.faults.arm(Op::Release, 0);
    drop(region);
    assert_eq!(arena.faults.fired(Op::Release), 1);
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (96 * KIB, 0, 96 * KIB));
    let q = rig.binding.quarantined();
    assert!(q.len() == 1 && q[0].contains("reservation"), "{q:?}");
    assert_eq!(rig.mechanism().live(ObjectKind::Reservation), 1);
    assert_eq!(arena.live_objects(), 1);
    let (_, msg) = rig.unload_refused();
    assert!(msg.contains("1 reservations of mechanism 'arena'"), "{msg}");
}

arena_plugin!(release_object);

#[test]
fn invariant_7_a_failed_release_of_a_shared_prefix_quarantines_it() {
    let (rig, arena) = release_object::rig(MIB);
    let prefix = rig.binding.create_shared(32 * KIB, |_| {}).unwrap();
    let mut region = rig.binding.reserve_virtual(256 * KIB).unwrap();
    region.map_prefix(&prefix).unwrap();
    region.grow_to(48 * KIB, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(rig.pool.used(), 48 * KIB);
    arena.faults.arm(Op::ReleaseObject, 0);
    drop(prefix); // the region still maps it: nothing happens yet
    assert_eq!(arena.faults.fired(Op::ReleaseObject), 0);
    drop(region);
    assert_eq!(arena.faults.fired(Op::ReleaseObject), 1);
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (32 * KIB, 0, 32 * KIB));
    let q = rig.binding.quarantined();
    assert!(q.len() == 1 && q[0].contains("physical object"), "{q:?}");
    assert_eq!(rig.mechanism().live(ObjectKind::PhysicalObject), 1);
    assert_eq!(arena.live_objects(), 1);
}

arena_plugin!(update_decommit);

#[test]
fn invariant_7_a_refused_update_whose_decommit_fails_keeps_the_range_charged() {
    let (rig, arena) = update_decommit::rig(MIB);
    let mut region = rig.binding.reserve_virtual(512 * KIB).unwrap();
    region.grow_to(64 * KIB, |_| Ok::<(), ()>(())).unwrap();
    arena.faults.arm(Op::Decommit, 0);
    let r = region.grow_to(128 * KIB, |_| Err(()));
    assert!(matches!(r, Err(GrowError::Update(()))), "{r:?}");
    assert_eq!(region.len(), 64 * KIB, "the old view stays");
    // The new range is still mapped: it stays charged, as quarantined.
    let s = rig.pool.snapshot();
    assert_eq!((s.used, s.leased, s.quarantined), (128 * KIB, 64 * KIB, 64 * KIB));
    assert_eq!(arena.committed(), 128 * KIB);
    let q = rig.binding.quarantined();
    assert!(q.len() == 1 && q[0].contains("region range"), "{q:?}");
}
