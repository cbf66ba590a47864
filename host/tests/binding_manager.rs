//! The process memory manager and its registry: selection by device and
//! capability (an absent capability is an error that names it, never a
//! fallback — invariant 3), the unload gate (refused, saying what is live,
//! while anything a plugin made is alive or queued), two loaded copies of
//! the same plugin never freeing each other's memory (invariant 1), and
//! contexts pinned by their allocations (invariant 6).

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::registry::RegistryError;
use memplug_host::{
    Allocation, BindingError, BindingSpec, LoadOptions, ManagerError, ObjectKind, Plugin, PluginFence,
    ProcessMemoryManager, Requirements, Status,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA};
use memplug_sdk::{
    Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef, PluginBuilder, PluginError, PluginResult,
    Properties, Request,
};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CUDA0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };

const ALL: Requirements = Requirements { virtual_backing: true, shared_mapping: true, sync: true };

const VIRTUAL: Requirements = Requirements { virtual_backing: true, shared_mapping: false, sync: false };

/// A mechanism with nothing but an allocator, on CPU 0.
#[derive(Default)]
struct Plain {
    next: AtomicU64,
    blocks: Mutex<HashMap<u64, (u64, Layout)>>,
}

impl Allocator for Plain {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let layout = Layout::from_size_align(r.size.max(1) as usize, r.alignment.max(16) as usize)
            .map_err(|e| PluginError::invalid_argument(e.to_string()))?;
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            return Err(PluginError::out_of_memory("system allocator refused"));
        }
        let handle = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.blocks.lock().unwrap().insert(handle, (p as u64, layout));
        Ok(Block { addr: p as u64, size: r.size, handle })
    }
    fn deallocate(&self, r: &ObjectRef) -> PluginResult<()> {
        let (addr, layout) = self
            .blocks
            .lock()
            .unwrap()
            .remove(&r.handle)
            .filter(|(a, _)| *a == r.addr)
            .ok_or_else(|| PluginError::unknown_allocation("no such block"))?;
        // SAFETY: allocated above with this layout, removed from the table.
        unsafe { dealloc(addr as *mut u8, layout) };
        Ok(())
    }
}

fn plain_plugin() -> ExportedPlugin {
    let m = MechanismBuilder::new("plain", 1, CPU0, Plain::default());
    let state: &'static Plain = m.implementation();
    PluginBuilder::new("plain", "1")
        .mechanism(m.build())
        .live_objects(move || state.blocks.lock().unwrap().len() as u64)
        .build()
}
// One entry per test: each has its own instance of the plugin.
memplug_sdk::declare_entry!(plain_for_selection, plain_plugin);
memplug_sdk::declare_entry!(plain_for_order, plain_plugin);
memplug_sdk::declare_entry!(plain_for_sweeps, plain_plugin);

fn load_plain(entry: memplug_sdk::abi::MemplugEntryV1) -> Plugin {
    // SAFETY: an SDK-generated entry.
    unsafe { Plugin::from_entry(entry, "plain", &LoadOptions::default()) }.unwrap()
}

#[test]
fn invariant_3_selection_names_the_missing_capability_and_never_falls_back() {
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(load_plain(plain_for_selection)).unwrap();

    let plain = manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    assert_eq!(plain.mechanism().name(), "plain");
    let m = plain.mechanism();
    assert!(
        unsafe { m.ungoverned() }.virtual_backing().is_none()
            && unsafe { m.ungoverned() }.shared_mapping().is_none()
            && m.sync().is_none()
    );

    match manager.select(CPU0, ALL) {
        Err(ManagerError::Registry(RegistryError::MissingCapability { device, wanted, candidates })) => {
            assert_eq!(device, "cpu:0");
            assert_eq!(wanted, "virtual_backing+shared_mapping+sync");
            assert_eq!(candidates, "plain/plain lacks virtual_backing+shared_mapping+sync");
        }
        other => panic!("{other:?}"),
    }
    let e = manager.select(CPU0, VIRTUAL).unwrap_err().to_string();
    assert!(e.contains("has virtual_backing") && e.contains("plain/plain lacks virtual_backing"), "{e}");
    let e = manager.select(CUDA0, Requirements::ALLOCATOR_ONLY).unwrap_err();
    assert!(matches!(e, ManagerError::Registry(RegistryError::NoDevice { .. })), "{e}");
    assert!(e.to_string().contains("cuda:0"), "{e}");

    // A binding on it refuses the operations it cannot do, naming what is
    // missing, and makes nothing.
    let pool = manager.create_pool("pool", MIB).unwrap();
    let b = manager.bind(&plain, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    match b.reserve_virtual(MIB) {
        Err(BindingError::Unsupported { mechanism, capability }) => {
            assert_eq!((mechanism.as_str(), capability), ("plain/plain", "virtual_backing"))
        }
        other => panic!("{other:?}"),
    }
    match b.create_shared(4096, |_| panic!("never called")) {
        Err(BindingError::Unsupported { capability, .. }) => assert_eq!(capability, "shared_mapping"),
        other => panic!("{other:?}"),
    }
    assert!(Ledger::of(&pool).is_zero());
    assert_eq!(live(m), [0; 5]);
    // With a mechanism that has the capability registered, it is the one
    // chosen, by capability, not the first on the device.
    manager.register_plugin(isolated_cpu_plugin("selection")).unwrap();
    let cpu = manager.select(CPU0, VIRTUAL).unwrap();
    assert_eq!(cpu.mechanism().plugin_name(), "memplug-cpu");
    assert_eq!(manager.select(CPU0, ALL).unwrap().mechanism().name(), "cpu");
    assert_eq!(
        manager.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap().mechanism().name(),
        "plain",
        "registration order decides among mechanisms that all qualify"
    );
    // No fence from a mechanism without sync: an explicit error, never a
    // dummy fence that reads as complete.
    let stream = CpuStream::new(cpu.mechanism());
    match PluginFence::record(plain.mechanism(), stream.stream()) {
        Err(e) => assert_eq!(e.status, Status::Unsupported, "{e}"),
        Ok(_) => panic!("a fence from a mechanism without sync"),
    }
}

#[test]
fn unload_is_refused_while_an_allocation_is_live_or_queued_and_says_what_is_live() {
    let Rig { manager, plugin, context, pool, binding } = Rig::cpu("manager-unload", MIB);
    let a = binding.allocate(4096, 64).unwrap();
    drop((binding, context));

    let e = manager.unload_plugin(&plugin).unwrap_err().to_string();
    assert!(
        e.contains("'memplug-cpu' cannot unload") && e.contains("mechanism 'cpu' is pinned by 1 object(s)"),
        "{e}"
    );
    // Handed back after a fence: still live until the fence completes.
    let gate = Gate::new("last kernel");
    a.release_after(vec![gate.fence.clone()]);
    let e = manager.unload_plugin(&plugin).unwrap_err().to_string();
    assert!(e.contains("pinned by 1 object(s)"), "{e}");
    assert_eq!(manager.queue().pending(), 1);
    assert_eq!(manager.registry().plugins(), vec!["memplug-cpu".to_string()]);

    // Once the fence completes, the unload retires the free first.
    gate.open();
    manager.unload_plugin(&plugin).unwrap();
    assert!(manager.registry().plugins().is_empty());
    assert!(Ledger::of(&pool).is_zero());
    assert!(matches!(
        manager.select(CPU0, Requirements::ALLOCATOR_ONLY),
        Err(ManagerError::Registry(RegistryError::NoDevice { .. }))
    ));
}

#[test]
fn unload_is_refused_while_a_context_handle_or_a_plugin_object_is_held() {
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(isolated_cpu_plugin("manager-handles")).unwrap();
    let ctx = manager.context("memplug-cpu/cpu").unwrap();
    let e = manager.unload_plugin("memplug-cpu").unwrap_err().to_string();
    assert!(e.contains("pinned by 0 object(s) and 1 handle(s)"), "{e}");

    // A stream made straight through the mechanism: no context is pinned,
    // but the plugin gate sees it and says so.
    let stream = CpuStream::new(ctx.mechanism());
    drop(ctx);
    let e = manager.unload_plugin("memplug-cpu").unwrap_err().to_string();
    assert!(e.contains("1 streams of mechanism 'cpu'"), "{e}");
    assert!(e.contains("1 handle(s) to mechanism 'cpu'"), "{e}");
    assert!(e.contains("the plugin reports 1 live object(s)"), "{e}");
    // The refused plugin is still registered and usable.
    assert!(manager.select(CPU0, ALL).is_ok());
    drop(stream);
    manager.unload_plugin("memplug-cpu").unwrap();
    assert!(manager.registry().plugins().is_empty());
}

#[test]
fn the_hosts_own_sweeps_of_the_contexts_never_count_as_pins() {
    // The reaper's turn and a statistics report hold every context for a
    // moment. An unload that meets them waits for them instead of reporting
    // them as handles; a caller's handle is still a pin.
    let manager = ProcessMemoryManager::new();
    manager.start_reaper(Duration::from_micros(10));
    let stop = AtomicBool::new(false);
    /// Stops the statistics thread however the rounds end (a panic too).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (refused, held) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let _ = manager.stats();
            }
        });
        let _stop = StopOnDrop(&stop);
        let mut refused = Vec::new();
        for round in 0..300 {
            manager.register_plugin(load_plain(plain_for_sweeps)).unwrap();
            if let Err(e) = manager.unload_plugin("plain") {
                refused.push(format!("round {round}: {e}"));
                break; // the plugin is still registered
            }
        }
        if !refused.is_empty() {
            return (refused, None);
        }
        manager.register_plugin(load_plain(plain_for_sweeps)).unwrap();
        let ctx = manager.context("plain/plain").unwrap();
        let held = manager.unload_plugin("plain").err().map(|e| e.to_string());
        drop(ctx);
        (refused, held)
    });
    assert!(refused.is_empty(), "an unload was refused for the host's own sweep: {}", refused[0]);
    let held = held.expect("a caller's handle must still refuse the unload");
    assert!(held.contains("is pinned by 0 object(s)"), "{held}");
    manager.unload_plugin("plain").unwrap();
}

#[test]
fn a_refused_unload_leaves_the_selection_order_as_it_was() {
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(load_plain(plain_for_order)).unwrap();
    manager.register_plugin(isolated_cpu_plugin("manager-order")).unwrap();
    let first = |m: &ProcessMemoryManager| {
        m.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap().mechanism().plugin_name().to_string()
    };
    assert_eq!(first(&manager), "plain");
    // An allocation made straight through the mechanism pins no context, so
    // the refusal comes from the plugin's own gate, after the registry let
    // the plugin go.
    let m = manager.context("plain/plain").unwrap().mechanism().clone();
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    let e = manager.unload_plugin("plain").unwrap_err().to_string();
    assert!(e.contains("1 allocations of mechanism 'plain'"), "{e}");
    assert_eq!(first(&manager), "plain", "a refused unload changed which mechanism is selected");
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    drop(m);
    manager.unload_plugin("plain").unwrap();
    assert_eq!(first(&manager), "memplug-cpu");
}

#[test]
fn invariant_1_two_loaded_copies_of_a_plugin_never_free_each_others_memory() {
    // The cdylib (a private copy) and the in-process entry of the same CPU
    // plugin: same names, same mechanism id, same device, separate state.
    let so = Rig::cpu("manager-inv1", 4 * MIB);
    // SAFETY: the SDK-generated in-process entry of the CPU plugin.
    let in_process = unsafe {
        Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu in-process", &LoadOptions::default())
    }
    .unwrap();
    let other = Rig::new(in_process, ALL, 4 * MIB);
    let (m1, m2) = (so.mechanism().clone(), other.mechanism().clone());
    assert_eq!((m1.name(), m1.id(), m1.device()), (m2.name(), m2.id(), m2.device()));
    assert!(!m1.same_as(&m2));

    // The host refuses the other mechanism's token before the plugin sees it.
    let a = unsafe { m1.ungoverned() }.allocator().allocate(256, 16).unwrap();
    let e = unsafe { m2.ungoverned() }.allocator().deallocate(a).unwrap_err();
    assert_eq!(e.error.status, Status::WrongMechanism, "{}", e.error);
    assert!(e.error.to_string().contains("another mechanism"), "{}", e.error);
    let a = e.object;
    assert_eq!((m1.live(ObjectKind::Allocation), m2.live(ObjectKind::Allocation)), (1, 0));

    // A forged token that claims to be the other mechanism's reaches that
    // plugin, which does not know the object either: its state is its own.
    let mut raw = *a.raw();
    raw.mechanism_key = m2.key();
    // SAFETY: deliberately forged, to show the plugin refuses it too.
    let forged = unsafe { Allocation::from_raw(raw) };
    let e = unsafe { m2.ungoverned() }.allocator().deallocate(forged).unwrap_err();
    assert_eq!(e.error.status, Status::UnknownAllocation, "{}", e.error);
    let _ = e.object.into_raw();
    // SAFETY: the token `a` is still the one m1 made; nothing freed it.
    let probe = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, 256) };
    probe.fill(0x42);

    // Its creator frees it.
    unsafe { m1.ungoverned() }.allocator().deallocate(a).unwrap();
    assert_eq!((m1.live(ObjectKind::Allocation), m2.live(ObjectKind::Allocation)), (0, 0));

    // Through bindings: each frees its own; a prefix made by one cannot be
    // mapped by the other.
    let x = so.binding.allocate(4096, 64).unwrap();
    let y = other.binding.allocate(4096, 64).unwrap();
    let prefix = so.binding.create_shared(16 * KIB, |_| {}).unwrap();
    let mut region = other.binding.reserve_virtual(MIB).unwrap();
    match region.map_prefix(&prefix) {
        Err(BindingError::Plugin(e)) => {
            assert_eq!(e.status, Status::WrongMechanism, "{e}");
            assert!(e.message.contains("another mechanism"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(region.len(), 0);
    drop(x);
    assert_eq!((m1.live(ObjectKind::Allocation), m2.live(ObjectKind::Allocation)), (0, 1));
    drop((y, prefix, region));
    assert!(Ledger::of(&so.pool).is_zero() && Ledger::of(&other.pool).is_zero());
    assert_eq!((live(&m1), live(&m2)), ([0; 5], [0; 5]));
    drop((m1, m2));
    so.unload();
}

#[test]
fn invariant_6_a_context_pinned_by_an_allocation_keeps_its_plugin_loaded_and_selected() {
    let rig = Rig::cpu("manager-inv6", MIB);
    let a = rig.binding.allocate(4096, 64).unwrap();
    let key = rig.mechanism().key();
    let Rig { manager, plugin, context, pool, binding } = rig;
    drop((binding, context));

    // The allocation alone keeps the plugin loaded…
    assert!(manager.unload_plugin(&plugin).is_err());
    // …and the query returns the very mechanism that made it, pinned.
    let again = manager.select(CPU0, ALL).unwrap();
    assert_eq!(again.mechanism().key(), key);
    assert_eq!(again.pins(), 1);
    // SAFETY: live CPU memory of the allocation.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 7, 4096) };
    drop(again);

    drop(a);
    assert_eq!(pool.used(), 0);
    manager.unload_plugin(&plugin).unwrap();
    // Gone means gone: no stale mechanism comes back from a query.
    assert!(manager.select(CPU0, ALL).is_err());
    assert!(manager.context("memplug-cpu/cpu").is_err());

    // A fresh load is a different mechanism.
    manager.register_plugin(isolated_cpu_plugin("manager-inv6-again")).unwrap();
    let fresh = manager.select(CPU0, ALL).unwrap();
    assert_ne!(fresh.mechanism().key(), key);
    assert_eq!(fresh.pins(), 0);
}

/// Counts its drops.
struct Witness(Arc<AtomicU64>);

impl Drop for Witness {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn invariant_9_what_crosses_the_boundary_is_copied_never_owned_by_the_other_side() {
    let rig = Rig::cpu("manager-inv9", MIB);
    let m = rig.mechanism().clone();

    // A failure message is written by the plugin into the host's sink, on
    // the calling thread: the host owns its copy, which outlives the
    // library itself.
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    let mut raw = *a.raw();
    raw.object_id ^= 1;
    // SAFETY: deliberately altered, so the plugin refuses it.
    let altered = unsafe { Allocation::from_raw(raw) };
    let refused = unsafe { m.ungoverned() }.allocator().deallocate(altered).unwrap_err();
    let _ = refused.object.into_raw();
    let error = refused.error;
    assert_eq!(error.status, Status::UnknownAllocation);

    // A host function is boxed by the host and freed by the host's
    // trampoline after the plugin's thread ran it: exactly once.
    let drops = Arc::new(AtomicU64::new(0));
    let stream = CpuStream::new(&m);
    for _ in 0..3 {
        let w = Witness(drops.clone());
        stream.run(move || drop(w));
    }
    let f = stream.fence();
    assert!(f.wait(std::time::Duration::from_secs(10)).unwrap());
    assert_eq!(drops.load(Ordering::SeqCst), 3);

    // The plugin frees what it made: the block goes back through its own
    // deallocate, and then the plugin holds nothing.
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    drop((f, stream));
    assert_eq!(live(&m), [0; 5]);
    drop(m);
    rig.unload(); // the library is closed here
    assert!(error.message.contains("does not name a live allocation"), "{}", error.message);
    assert!(error.to_string().contains("memplug-cpu/cpu"), "{error}");
}
