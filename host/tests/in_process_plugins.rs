//! Plugins linked into the test binary and handed to the loader as
//! in-process entries (the same validation path as a library): a plugin
//! that panics in every slot kind, one that returns unknown codes, one that
//! lies about the blocks it returns, and version negotiation both ways.

use memplug_host::{LoadError, LoadOptions, ObjectKind, Plugin, Status};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// Panics in every slot: the SDK must turn each into `INTERNAL` with the
/// panic message, and the host must stay up (ARCHITECTURE.md §2, invariant 8).
struct Panicky;

impl Allocator for Panicky {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 4096, granularity: 4096 }
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        panic!("allocate exploded")
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        panic!("deallocate exploded")
    }
}

impl VirtualBacking for Panicky {
    fn reserve(&self, _: &Request) -> PluginResult<Block> {
        panic!("reserve exploded")
    }
    fn commit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        panic!("commit exploded")
    }
    fn decommit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        panic!("decommit exploded")
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        panic!("committed_bytes exploded")
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        panic!("release exploded")
    }
}

impl SharedMapping for Panicky {
    fn create(&self, _: &Request) -> PluginResult<Block> {
        panic!("create exploded")
    }
    fn map(&self, _: &ObjectRef, _: u64, _: &ObjectRef, _: u64, _: u64, _: Access) -> PluginResult<()> {
        panic!("map exploded")
    }
    fn unmap(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        panic!("unmap exploded")
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        panic!("retain exploded")
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        panic!("release exploded")
    }
}

impl StreamSync for Panicky {
    fn stream_create(&self) -> PluginResult<u64> {
        panic!("stream_create exploded")
    }
    fn stream_destroy(&self, _: u64) -> PluginResult<()> {
        panic!("stream_destroy exploded")
    }
    fn enqueue_host_fn(&self, _: u64, _: HostFn) -> PluginResult<()> {
        panic!("enqueue exploded")
    }
    fn fence_record(&self, _: u64) -> PluginResult<u64> {
        panic!("fence_record exploded")
    }
    fn fence_query(&self, _: u64) -> PluginResult<FenceState> {
        panic!("fence_query exploded")
    }
    fn fence_wait(&self, _: u64, _: Duration) -> PluginResult<FenceState> {
        panic!("fence_wait exploded")
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        panic!("fence_destroy exploded")
    }
}

fn panicky_plugin() -> ExportedPlugin {
    PluginBuilder::new("panicky", "0.0.1")
        .mechanism(
            MechanismBuilder::new("boom", 1, CPU0, Panicky).virtual_backing().shared_mapping().sync().build(),
        )
        .live_objects(|| 0)
        .build()
}
declare_entry!(panicky_entry, panicky_plugin);

fn assert_panic_reported(e: &memplug_host::CallError, what: &str) {
    assert_eq!(e.status, Status::Internal, "{e}");
    assert!(e.message.contains(&format!("{what} exploded")), "message lost: {e}");
    assert!(e.message.contains("panicked"), "{e}");
}

#[test]
fn invariant_8_panics_in_every_slot_kind_become_internal_errors() {
    let p = unsafe { Plugin::from_entry(panicky_entry, "panicky", &LoadOptions::default()) }.unwrap();
    let m = p.mechanism("boom").unwrap().clone();
    assert_panic_reported(&unsafe { m.ungoverned() }.allocator().allocate(64, 8).unwrap_err(), "allocate");
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    assert_panic_reported(&vb.reserve(4096).unwrap_err(), "reserve");
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    assert_panic_reported(&sm.create(4096).unwrap_err(), "create");
    let sy = m.sync().unwrap();
    assert_panic_reported(&sy.stream_create().unwrap_err(), "stream_create");
    // Nothing was created, so nothing is counted live.
    for k in ObjectKind::ALL {
        assert_eq!(m.live(k), 0);
    }
    drop(m);
    p.unload().unwrap();
}

/// Returns codes the host has never heard of.
struct UnknownCodes;

impl Allocator for UnknownCodes {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 8, granularity: 0 }
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        // PluginError cannot carry an unknown code; this is the nearest a
        // Rust plugin gets. The C bad-plugin tests cover raw unknown codes.
        Err(PluginError::new(Status::Busy, "busy with something"))
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

fn unknown_plugin() -> ExportedPlugin {
    PluginBuilder::new("codes", "1")
        .mechanism(MechanismBuilder::new("codes", 7, CPU0, UnknownCodes).build())
        .live_objects(|| 0)
        .build()
}
declare_entry!(codes_entry, unknown_plugin);

#[test]
fn a_failure_carries_code_and_message() {
    let p = unsafe { Plugin::from_entry(codes_entry, "codes", &LoadOptions::default()) }.unwrap();
    let m = &p.mechanisms()[0];
    let e = unsafe { m.ungoverned() }.allocator().allocate(8, 8).unwrap_err();
    assert_eq!(e.status, Status::Busy);
    assert_eq!(e.message, "busy with something");
    assert!(e.to_string().contains("codes/codes"), "{e}");
    assert!(e.to_string().contains("MEMPLUG_STATUS_BUSY"), "{e}");
    // Unsupported is an explicit absence, never a success (invariant 3).
    assert!(unsafe { m.ungoverned() }.virtual_backing().is_none());
    assert!(unsafe { m.ungoverned() }.shared_mapping().is_none());
    assert!(m.sync().is_none());
    assert!(m.memory_info().is_none());
}

/// Claims success but returns blocks that break the contract.
struct Liar(AtomicU64);

impl Allocator for Liar {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        match self.0.fetch_add(1, Ordering::Relaxed) {
            0 => Ok(Block { addr: 0, size: r.size, handle: 1 }),
            1 => Ok(Block { addr: 0x1001, size: r.size, handle: 1 }),
            _ => Ok(Block { addr: 0x2000, size: r.size - 1, handle: 1 }),
        }
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

fn liar_plugin() -> ExportedPlugin {
    PluginBuilder::new("liar", "1")
        .mechanism(MechanismBuilder::new("liar", 1, CPU0, Liar(AtomicU64::new(0))).build())
        .live_objects(|| 0)
        .build()
}
declare_entry!(liar_entry, liar_plugin);

#[test]
fn null_misaligned_or_short_blocks_on_success_are_refused() {
    let p = unsafe { Plugin::from_entry(liar_entry, "liar", &LoadOptions::default()) }.unwrap();
    let a = unsafe { p.mechanisms()[0].ungoverned() }.allocator();
    for expect in ["addr 0x0", "addr 0x1001", "size 63"] {
        let e = a.allocate(64, 64).unwrap_err();
        assert_eq!(e.status, Status::Internal);
        assert!(e.message.contains(expect), "{expect}: {e}");
    }
    assert_eq!(p.mechanisms()[0].live(ObjectKind::Allocation), 0);
}

fn narrow_plugin() -> ExportedPlugin {
    PluginBuilder::new("narrow", "1")
        .minors(1, 5)
        .mechanism(MechanismBuilder::new("m", 1, CPU0, UnknownCodes).build())
        .live_objects(|| 0)
        .build()
}
declare_entry!(narrow_entry, narrow_plugin);

#[test]
fn negotiation_is_two_sided() {
    // The plugin (1.1..=1.5) refuses a host that speaks only 1.0…
    let opts = LoadOptions { min_minor: 0, max_minor: 0, ..Default::default() };
    let e = unsafe { Plugin::from_entry(narrow_entry, "narrow", &opts) }.unwrap_err();
    assert!(matches!(e, LoadError::VersionMismatch { .. }), "{e}");
    assert!(e.to_string().contains("1.1"), "{e}");
    // …agrees with this host on the newest minor both know…
    let p = unsafe { Plugin::from_entry(narrow_entry, "narrow", &LoadOptions::default()) }.unwrap();
    assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    assert_eq!(p.plugin_minor_range(), (1, 5));
    // …and a host never agrees on a minor it does not know, however high
    // its options reach.
    let opts = LoadOptions { min_minor: 0, max_minor: 9, ..Default::default() };
    let p = unsafe { Plugin::from_entry(narrow_entry, "narrow", &opts) }.unwrap();
    assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    // A host whose floor is above the plugin's ceiling refuses.
    let opts = LoadOptions { min_minor: 6, max_minor: 9, ..Default::default() };
    let e = unsafe { Plugin::from_entry(narrow_entry, "narrow", &opts) }.unwrap_err();
    assert!(matches!(e, LoadError::VersionMismatch { .. }), "{e}");
}
